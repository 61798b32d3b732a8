"""Live counters of a dataset reader / mount, rendered as .pcrfs/stats.json."""
from __future__ import annotations

import os
import threading
import time
from collections import Counter


class Stats:
    def __init__(self):
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests: Counter = Counter()
        self.served_bytes: Counter = Counter()     # per view
        self.served_files: Counter = Counter()     # per view (opens that assembled data)
        self.errors: Counter = Counter()           # per errno name
        self.backend_bytes = 0
        self.backend_reads = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.extent_fetches = 0
        self.checksum_failures = 0
        self.transcodes = 0              # format-view files produced (l3)
        self.transcode_cache_hits = 0    # ... and served from the on-disk transcode cache
        self.extra: dict = {}

    def add(self, **kw) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def count(self, counter: str, key: str, n: int = 1) -> None:
        with self._lock:
            getattr(self, counter)[key] += n

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 3),
                "requests": dict(self.requests),
                "served_bytes": dict(self.served_bytes),
                "served_files": dict(self.served_files),
                "backend_bytes": self.backend_bytes,
                "backend_reads": self.backend_reads,
                "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses,
                "extent_fetches": self.extent_fetches,
                "checksum_failures": self.checksum_failures,
                "transcodes": self.transcodes,
                "transcode_cache_hits": self.transcode_cache_hits,
                "errors": dict(self.errors),
                **self.extra,
            }
