"""The hidden .pcrfs/ directory: files generated from the daemon's state, and the one
writable file, control/dynamic_fidelity, that moves MNT/dynamic between fidelities."""
from __future__ import annotations

import json
import re
from collections.abc import Callable

DYNAMIC_FIDELITY = b"control/dynamic_fidelity"
_FIDELITY = re.compile(r"\s*[qQ]?(\d{1,4})\s*")


def parse_fidelity(value: str | bytes | int, groups: int) -> int:
    """'q5', '5', 5 -> 5; ValueError for anything outside q1..qG."""
    if isinstance(value, int):
        k = value
    else:
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        m = _FIDELITY.fullmatch(text)
        if not m:
            raise ValueError(f"not a fidelity: {text!r} (expected q1..q{groups} or 1..{groups})")
        k = int(m.group(1))
    if not 1 <= k <= groups:
        raise ValueError(f"fidelity {k} out of range 1..{groups}")
    return k


class ControlFiles:
    """Paths are relative to .pcrfs/.  Directories: '' and 'control'."""

    def __init__(self, manifest: dict, stats_snapshot: Callable[[], dict],
                 get_fidelity: Callable[[], int], set_fidelity: Callable[[int], None]):
        manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        self.groups = int(manifest["groups"])
        self._set_fidelity = set_fidelity
        self._files: dict[bytes, Callable[[], bytes]] = {
            b"manifest.json": lambda: manifest_bytes,
            b"stats.json": lambda: (json.dumps(stats_snapshot(), indent=2, sort_keys=True)
                                    + "\n").encode(),
            DYNAMIC_FIDELITY: lambda: f"q{get_fidelity()}\n".encode(),
        }
        self._dirs = {b"": [(b"control", True), (b"manifest.json", False), (b"stats.json", False)],
                      b"control": [(b"dynamic_fidelity", False)]}
        self.static = {b"manifest.json"}
        self.writable = {DYNAMIC_FIDELITY}
        # node numbers (fs/inodes.py): the top, then every entry in a fixed order
        self._ordinals = {b"": 0}
        for d in sorted(self._dirs):
            for n, _ in self._dirs[d]:
                self._ordinals[d + b"/" + n if d else n] = len(self._ordinals)

    def ordinal(self, path: bytes) -> int:
        return self._ordinals[path]

    def entries(self, dirpath: bytes) -> list[tuple[bytes, bool]]:
        return self._dirs.get(dirpath, [])

    def lookup(self, dirpath: bytes, name: bytes) -> tuple[bytes, bool] | None:
        for n, is_dir in self.entries(dirpath):
            if n == name:
                return (dirpath + b"/" + name if dirpath else name), is_dir
        return None

    def render(self, path: bytes) -> bytes:
        return self._files[path]()

    def write(self, path: bytes, data: bytes) -> None:
        """Apply a complete value written to a writable file; ValueError if invalid."""
        if path != DYNAMIC_FIDELITY:
            raise PermissionError(path)
        self._set_fidelity(parse_fidelity(data, self.groups))
