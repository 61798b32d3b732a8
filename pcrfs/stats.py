"""Live counters of a dataset reader / mount, rendered as .pcrfs/stats.json."""
from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections import Counter

# upper bounds (seconds) of the latency histograms: a warm FUSE request takes tens of
# microseconds, a cold ranged GET tens of milliseconds, a retried one seconds
LATENCY_BOUNDS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
                  50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0, 30.0)


class Latency:
    """A fixed-bucket histogram: observe() is a bisect and two additions under a lock, so
    it can stay on the hot path; exporters read it when asked (snapshot)."""
    __slots__ = ("_lock", "counts", "sum")

    def __init__(self):
        self._lock = threading.Lock()
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)    # the last: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        i = bisect_left(LATENCY_BOUNDS, seconds)
        with self._lock:
            self.counts[i] += 1
            self.sum += seconds

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self.counts), self.sum


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
        self.raw_pack_reads = 0          # raw files read from materialized packs
        self.raw_pack_bytes = 0
        self.raw_decodes = 0             # raw files produced by decoding qG
        self.raw_cache_hits = 0          # ... and served from the raw view's disk cache
        self.raw_packs_replaced = 0      # packs found rewritten under the mount (new head read)
        # remote datasets (s3://, http://): network calls and the on-disk extent cache
        self.remote_requests = 0         # GET/HEAD/PUT requests sent (one per byte range)
        self.remote_bytes = 0            # bytes received from the store
        self.remote_retries = 0
        self.remote_errors = 0           # calls that failed for good (404s not counted)
        self.disk_cache_hits = 0
        self.disk_cache_misses = 0
        self.disk_cache_image_hits = 0   # images served wholly from the disk tier
        self.memory_image_hits = 0       # images served from the memory tier (static)
        # --shard / --peers (pcrfs/cluster.py, storage/peers.py)
        self.owned_hits = 0              # images of owned records served from the disk tier
        self.peer_hits = 0               # segments read from another node's memcached
        self.peer_misses = 0             # ... asked for and not there (or peer down)
        self.peer_bytes = 0
        self.peer_errors = 0             # failed calls to a peer (it is then skipped a while)
        self.peer_corrupt = 0            # values that failed their checksum (read from storage)
        self.peer_published = 0          # segments this node stored in its memcached
        self.warm_gets = 0               # ranged GETs of `pcrfs warm`
        self.warm_bytes = 0
        self.remote_retry_causes: Counter = Counter()   # "HTTP 503", "timed out", ...
        self.remote_error_causes: Counter = Counter()
        # (kind, op) -> Latency: kind "fuse" (requests Python answers) or "backend"
        self.latency: dict[tuple[str, str], Latency] = {}

    def add(self, **kw) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def count(self, counter: str, key: str, n: int = 1) -> None:
        with self._lock:
            getattr(self, counter)[key] += n

    def latency_of(self, kind: str, op: str) -> Latency:
        h = self.latency.get((kind, op))
        if h is None:
            with self._lock:
                h = self.latency.setdefault((kind, op), Latency())
        return h

    def latency_snapshot(self) -> dict[tuple[str, str], tuple[list[int], float]]:
        with self._lock:
            items = list(self.latency.items())
        return {k: h.snapshot() for k, h in items}

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
                "raw_pack_reads": self.raw_pack_reads,
                "raw_pack_bytes": self.raw_pack_bytes,
                "raw_decodes": self.raw_decodes,
                "raw_cache_hits": self.raw_cache_hits,
                "raw_packs_replaced": self.raw_packs_replaced,
                "remote_requests": self.remote_requests,
                "remote_bytes": self.remote_bytes,
                "remote_retries": self.remote_retries,
                "remote_errors": self.remote_errors,
                "disk_cache_hits": self.disk_cache_hits,
                "disk_cache_misses": self.disk_cache_misses,
                "disk_cache_image_hits": self.disk_cache_image_hits,
                "memory_image_hits": self.memory_image_hits,
                "owned_hits": self.owned_hits,
                "peer_hits": self.peer_hits,
                "peer_misses": self.peer_misses,
                "peer_bytes": self.peer_bytes,
                "peer_errors": self.peer_errors,
                "peer_corrupt": self.peer_corrupt,
                "peer_published": self.peer_published,
                "warm_gets": self.warm_gets,
                "warm_bytes": self.warm_bytes,
                "errors": dict(self.errors),
                "remote_retry_causes": dict(self.remote_retry_causes),
                "remote_error_causes": dict(self.remote_error_causes),
            }
