"""The hidden .pcrfs/ directory: files generated from the daemon's state, and the
writable control files: control/dynamic_fidelity, which moves MNT/dynamic between
fidelities, and on a --shard mount control/balance and control/warm (fs/root.py)."""
from __future__ import annotations

import errno
import json
import logging
import re
import threading
from collections.abc import Callable

from pcrfs.control import CONTROLS, DIR, FIDELITY, MANIFEST, STATS
from pcrfs.views.base import Entry, Listing, Opened, View

log = logging.getLogger("pcrfs.fs")
NAME = DIR

DYNAMIC_FIDELITY = FIDELITY.encode()
_STATS, _MANIFEST, _CONTROLS = STATS.encode(), MANIFEST.encode(), CONTROLS.encode()
_FIDELITY = re.compile(r"\s*[qQ]?(\d{1,4})\s*")


class _Once:
    """A bulk file's bytes, rendered by the first caller (a worker thread, through
    View.pending) and kept."""

    def __init__(self, make: Callable[[], bytes]):
        self._make, self._lock, self.value = make, threading.Lock(), None

    def __call__(self) -> bytes:
        if self.value is None:
            with self._lock:
                if self.value is None:
                    self.value = self._make()
        return self.value


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


class ControlView(View):
    """Paths are relative to .pcrfs/.  Directories: '' and 'control'.  Files are rendered
    when opened (an open reads one consistent snapshot)."""
    name = NAME
    immutable = False

    def __init__(self, manifest: dict, stats_snapshot: Callable[[], dict], dynamic,
                 bulk: dict[bytes, Callable[[], bytes]] | None = None,
                 controls: dict[bytes, tuple[Callable[[], bytes], Callable[[bytes], None]]]
                 | None = None):
        """bulk: more top-level files whose bytes never change while mounted (rendered
        once, on first use: mix.tsv).  controls: more writable files under control/,
        name -> (render, apply); apply raises ValueError for a value it refuses."""
        manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        self.groups = int(manifest["groups"])
        self.dynamic = dynamic
        self._files: dict[bytes, Callable[[], bytes]] = {
            _MANIFEST: lambda: manifest_bytes,
            _STATS: lambda: (json.dumps(stats_snapshot(), indent=2, sort_keys=True)
                                    + "\n").encode(),
            DYNAMIC_FIDELITY: lambda: f"q{dynamic.fidelity}\n".encode(),
        }
        self._bulk = {name: _Once(make) for name, make in (bulk or {}).items()}
        self._files.update(self._bulk)
        self._apply = {}
        for name, (render, apply) in (controls or {}).items():
            self._files[name] = render
            self._apply[name] = apply
        self._dirs = {b"": [(_CONTROLS, True), (_MANIFEST, False), (_STATS, False),
                            *((n, False) for n in sorted(bulk or {}))],
                      _CONTROLS: [(n.split(b"/", 1)[1], False)
                                  for n in (DYNAMIC_FIDELITY, *sorted(self._apply))]}
        self.static = {_MANIFEST, *(bulk or {})}
        self.writable = {DYNAMIC_FIDELITY, *self._apply}
        # node numbers (fs/inodes.py): the top, then every entry in a fixed order
        self._ordinals = {b"": 0}
        for d in sorted(self._dirs):
            for n, _ in self._dirs[d]:
                self._ordinals[d + b"/" + n if d else n] = len(self._ordinals)

    def lookup(self, path: bytes) -> Entry | None:
        if path in self._dirs:
            return Entry(True, 0, self._ordinals[path])
        make = self._files.get(path)
        if make is None:
            return None
        return Entry(False, len(make()), self._ordinals[path], live=path not in self.static,
                     writable=path in self.writable)

    def pending(self, path: bytes):
        # a bulk file's size is its rendered length, and '' lists them with attributes
        todo = [b for name, b in self._bulk.items()
                if b.value is None and path in (name, b"")]
        return (lambda: [b() for b in todo]) if todo else None

    def list(self, path: bytes, sizes: bool = False) -> Listing:
        if path in self._files:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        if path not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory")
        names = sorted(self._dirs[path])
        prefix = path + b"/" if path else b""
        return Listing(names, [self._ordinals[prefix + n] for n, _ in names], None)

    def read(self, path: bytes) -> bytes:
        return self._files[path]()

    def open(self, path: bytes) -> Opened:
        return Opened(self.read(path), None, True)

    def write(self, path: bytes, data: bytes) -> list[View]:
        apply = self._apply.get(path)
        if apply is not None:
            apply(data)
            return []
        if path != DYNAMIC_FIDELITY:
            raise PermissionError(errno.EROFS, "read-only file")
        k = parse_fidelity(data, self.groups)
        old = self.dynamic.fidelity
        if not self.dynamic.set_fidelity(k):
            return []
        log.info("dynamic fidelity q%d -> q%d", old, k)
        return [self.dynamic]
