"""Record-aware reads: the policy between a read plan and the backend.

- A reader walking one record's images in order at one view (a record-aware sampler,
  `ls`/`cp -r`, `tar`) triggers an *extent fetch*: groups 1..k of the whole record are
  read with one sequential request and kept in the LRU; the following images are spliced
  from memory.
- Anything else (a shuffled DataLoader) reads exactly the k segments of the image with
  pread and caches nothing, so a random reader pays only for the bytes it needs.
docs/SEMANTICS.md states the policy; tests and `make bench` hold it to its numbers."""
from __future__ import annotations

import threading
from collections.abc import Sequence

from pcrfs import native
from pcrfs.errors import CorruptDataError
from pcrfs.stats import Stats
from pcrfs.storage.cache import ByteLRU
from pcrfs.storage.throttle import TokenBucket

SEQUENTIAL_RUN = 4   # consecutive in-order opens of one record before an extent fetch
NEAR = 4             # index distance still "in order" (a few parallel readers)
MAX_EXTENT_SHARE = 4  # an extent may use at most 1/4 of the cache, so a few records fit


class RecordReader:
    def __init__(self, backend, stats: Stats, cache_bytes: int = 1 << 30,
                 throttle: TokenBucket | None = None):
        self.backend = backend
        self.stats = stats
        self.cache = ByteLRU(cache_bytes)
        self.throttle = throttle
        self._lock = threading.Lock()
        self._runs: dict[int, tuple[int, int, int]] = {}   # view k -> (record, index, run)
        self._inflight: dict[tuple, threading.Event] = {}

    # -- policy ----------------------------------------------------------------
    def _in_order(self, k: int, record: int, index: int) -> bool:
        with self._lock:
            rec, idx, run = self._runs.get(k, (-1, -1, 0))
            run = run + 1 if rec == record and 0 < abs(index - idx) <= NEAR else 1
            self._runs[k] = (record, index, run)
            return run >= SEQUENTIAL_RUN

    def _cached_extent(self, record: int, k: int, groups: int):
        for kk in range(k, groups + 1):
            ext = self.cache.get((record, kk))
            if ext is not None:
                return ext
        return None

    # -- reads -----------------------------------------------------------------
    def assemble(self, record: int, index: int, k: int, segments: Sequence[tuple[int, int]],
                 group_offsets: Sequence[int]) -> bytearray:
        """segments (absolute offset, length) of `record` + EOI.  k is the view's group
        count, clamped to the record's."""
        groups = len(group_offsets) - 1
        k = min(k, groups)
        base = group_offsets[0]
        ext = self._cached_extent(record, k, groups)
        if (ext is None and self._in_order(k, record, index)
                and (group_offsets[k] - base) * MAX_EXTENT_SHARE <= self.cache.capacity):
            ext = self._fetch_extent(record, k, base, group_offsets[k])
        if ext is not None:
            self.stats.add(cache_hits=1)
            try:
                return bytearray(native.splice_buf(ext, [(o - base, n) for o, n in segments]))
            except native.NativeError as e:
                raise CorruptDataError(f"record {record}: extent too short ({e})") from None
        self.stats.add(cache_misses=1)
        total = sum(n for _, n in segments)
        if self.throttle:
            self.throttle.consume(total)
        self.stats.add(backend_bytes=total, backend_reads=len(segments))
        return self.backend.splice(record, segments)

    def _fetch_extent(self, record: int, k: int, start: int, end: int):
        key = (record, k)
        with self._lock:
            ev = self._inflight.get(key)
            leader = ev is None
            if leader:
                ev = self._inflight[key] = threading.Event()
        if not leader:
            ev.wait()
            return self.cache.get(key)
        try:
            if self.throttle:
                self.throttle.consume(end - start)
            data = self.backend.pread(record, start, end - start)
            self.stats.add(backend_bytes=len(data), backend_reads=1, extent_fetches=1)
            if not self.cache.put(key, data):
                return None  # larger than the whole cache: serve image by image
            return data
        finally:
            with self._lock:
                del self._inflight[key]
            ev.set()
