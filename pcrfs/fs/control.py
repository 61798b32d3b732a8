"""The hidden .pcrfs/ directory: read-only files generated from the daemon's state."""
from __future__ import annotations

import json
from collections.abc import Callable


class ControlFiles:
    def __init__(self, manifest: dict, stats_snapshot: Callable[[], dict]):
        manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        self._files: dict[bytes, Callable[[], bytes]] = {
            b"manifest.json": lambda: manifest_bytes,
            b"stats.json": lambda: (json.dumps(stats_snapshot(), indent=2, sort_keys=True)
                                    + "\n").encode(),
        }
        self.static = {b"manifest.json"}

    def names(self) -> list[bytes]:
        return sorted(self._files)

    def exists(self, name: bytes) -> bool:
        return name in self._files

    def render(self, name: bytes) -> bytes:
        return self._files[name]()
