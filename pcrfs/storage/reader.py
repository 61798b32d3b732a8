"""Record-aware reads: the policy between a read plan and the backend.

- A reader walking one record's images in order at one view (a record-aware sampler,
  `ls`/`cp -r`, `tar`) triggers an *extent fetch*: groups 1..k of the whole record are
  read with one sequential request and kept in the LRU; the following images are spliced
  from memory.  Runs are tracked per record, so several records walked at once (a
  sampler's window of records, DataLoader workers on neighbouring batches) each count.
- Anything else (a shuffled DataLoader) reads exactly the k segments of the image with
  pread and caches nothing, so a random reader pays only for the bytes it needs; unless
  a remote dataset is mounted with `-o fetch=record`, where every reader is treated as
  in order: a cold shuffled epoch from object storage then fetches each record's extent
  once per view, in pieces whose readers wait only for their own (storage/filling.py),
  instead of k GETs per image (the same bytes when the epoch reads every image).  The
  fills in progress hold a share of the memory budget (fill_quota, at most MAX_FILLS of
  them): a reader that would start one beyond it reads its image's segments instead, so
  a shuffled epoch over more records than fit never holds more than that share.  Where
  a remote dataset's disk tier holds the record's extent, it reads just those segments
  from the extent's entry (a ranged read, verified segment by segment).
docs/SEMANTICS.md states the policy; tests and `make bench` hold it to its numbers."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from pcrfs import native
from pcrfs.errors import CorruptDataError
from pcrfs.format.index import file_ordinal
from pcrfs.singleflight import SingleFlight
from pcrfs.storage.budget import Quota
from pcrfs.storage.cache import Admission, MemoryTier, Policy, Universe
from pcrfs.storage.filling import FillingExtent, cut
from pcrfs.telemetry.stats import Stats

SEQUENTIAL_RUN = 5   # consecutive in-order opens of one record before an extent fetch
NEAR = 4             # forward index distance still "in order" (a few parallel readers)
RECENT = 8           # indices remembered per record: "near" any of them counts
WINDOW = 12          # ... if that record was opened within the last WINDOW opens of the view
TRACKED = 256        # records tracked at once
MAX_EXTENT_SHARE = 4  # an extent may use at most 1/4 of the cache, so a few records fit
MAX_FILLS = 16       # -o fetch=record: fills in progress at once (a fetcher thread each)


class RecordReader:
    """backend: LocalStorage or RemoteStorage (splice, pread, cached_extent); it applies
    --bandwidth-limit to the bytes it actually fetches."""

    def __init__(self, backend, stats: Stats, cache_bytes: int = 1 << 30,
                 policy: Policy | None = None,
                 universe: Callable[[str, int], Universe] | None = None,
                 readahead_bytes: int = 0, whole_records: bool = False,
                 fill_quota: Quota | None = None):
        self.backend = backend
        self.whole_records = whole_records     # -o fetch=record (a remote dataset)
        self.fill_quota = fill_quota or Quota(0)   # ... the budget's share for its fills
        self.stats = stats
        self.universe = universe   # Dataset.universe: what a static tier admits from
        self.cache = MemoryTier(cache_bytes, policy)   # the memory tier: record extents
        # Where in-order readers' extents go: the memory tier under lru; under static,
        # which pins images, a small LRU of its own (readahead: an extent serves the rest
        # of its record within the epoch, it is not kept for the next one).
        self.readahead = None if self.cache.policy.evicts else MemoryTier(readahead_bytes)
        self._extents = self.cache if self.readahead is None else self.readahead
        self._lock = threading.Lock()
        # (view k, record) -> (view's open count when last seen, recent indices, run)
        self._runs: OrderedDict[tuple[int, int], tuple[int, tuple[int, ...], int]] = OrderedDict()
        self._opens: dict[int, int] = {}                     # view k -> opens so far
        self._flight = SingleFlight()
        self._fills: dict[tuple[int, int], FillingExtent] = {}   # (record, k): fetch=record

    # -- policy ----------------------------------------------------------------
    def _admission(self, kind: str, key: int, k: int) -> Admission:
        """A static tier's decision for an image ordinal ("segments") or a record
        ("record") read at view qk."""
        return Admission(key, self.universe(kind, k) if self.universe else None,
                         key if kind == "record" else None)

    def _in_order(self, k: int, record: int, index: int) -> bool:
        """A random reader almost never qualifies: it would need SEQUENTIAL_RUN - 1 opens
        of one record in a row for that record, each within WINDOW opens of the previous
        and 1..NEAR indices after a recent one.  Measured on 16 records of 128 images with
        the whole dataset in cache (the worst case): shuffled epoch amplification 1.037."""
        key = (k, record)
        with self._lock:
            seq = self._opens[k] = self._opens.get(k, 0) + 1
            last, recent, run = self._runs.pop(key, (-WINDOW, (), 0))
            near = seq - last <= WINDOW and any(0 < index - j <= NEAR for j in recent)
            run = run + 1 if near else 1     # anything else starts over: random readers
            self._runs[key] = (seq, (*recent[-(RECENT - 1):], index), run)
            if len(self._runs) > TRACKED:
                self._runs.popitem(last=False)
            return run >= SEQUENTIAL_RUN

    def _memory_extent(self, record: int, k: int, groups: int):
        """An extent of groups 1..kk (kk >= k) in memory (the memory tier, or under static
        the readahead share)."""
        for kk in range(k, groups + 1):
            if self._extents.contains((record, kk)):
                ext = self._extents.get((record, kk))
                if ext is not None:
                    return ext
        return None

    def _disk_extent(self, record: int, k: int, group_offsets: Sequence[int]):
        """A whole extent from the backend's disk tier, promoted to memory: an in-order
        reader's next images are in it."""
        found = self.backend.cached_extent(record, group_offsets[0], group_offsets[k:])
        if found is None:
            return None
        kk, ext = found
        self._extents.put((record, k + kk), ext, self._admission("record", record, k + kk))
        return ext

    # -- reads -----------------------------------------------------------------
    def assemble(self, record: int, index: int, k: int, plan,
                 group_offsets: Sequence[int]) -> bytearray:
        """The plan's segments (absolute offset, length) of `record` + EOI.  k is the
        view's group count, clamped to the record's."""
        segments = plan.segments
        groups = len(group_offsets) - 1
        k = min(k, groups)
        base = group_offsets[0]
        ext = self._memory_extent(record, k, groups)
        held = ext is not None      # in memory or the disk tier, not fetched now
        if ext is None:
            in_order = self._in_order(k, record, index) or self.whole_records
            if in_order:
                ext = self._disk_extent(record, k, group_offsets)
                held = ext is not None
            else:
                data = self.backend.cached_segments(record, base, group_offsets[k:], plan)
                if data is not None:
                    self.stats.add(cache_hits=1)
                    return data
            size = group_offsets[k] - base
            if (ext is None and in_order
                    and size * MAX_EXTENT_SHARE <= self._extents.capacity
                    and self._extents.would_keep(self._admission("record", record, k), size)):
                if not self.whole_records:
                    ext = self._fetch_extent(record, k, base, group_offsets[k])
                elif (data := self._from_fill(record, k, group_offsets, segments)) is not None:
                    return data
        if ext is not None:
            self.stats.add(cache_hits=1)
            if held:
                self.backend.held_image(record)
            try:
                return native.splice_buf(ext, [(o - base, n) for o, n in segments])
            except native.NativeError as e:
                raise CorruptDataError(f"record {record}: extent too short ({e})") from None
        self.stats.add(cache_misses=1)
        self.stats.add(backend_bytes=sum(n for _, n in segments), backend_reads=len(segments))
        return self.backend.splice(record, segments,
                                   self._admission("segments", file_ordinal(record, index), k),
                                   checksums=plan.checksums)

    def forget(self, record: int, group_offsets: Sequence[int], segments) -> bool:
        """Drop every cached copy of the record's extents (an assembled image failed its
        checksums); True if the backend would then read it from elsewhere."""
        for kk in range(1, len(group_offsets)):
            self._extents.discard((record, kk))
        return self.backend.forget(record, group_offsets, segments)

    def _from_fill(self, record: int, k: int, group_offsets: Sequence[int],
                   segments: Sequence[tuple[int, int]]) -> bytearray | None:
        """An image from its record's extent fetched piece by piece (storage/filling.py),
        waiting only for its own pieces; concurrent readers of the record share the fill,
        and the finished extent goes to the memory and disk tiers as one read's would.
        None when a new fill would exceed fill_quota or MAX_FILLS."""
        key, base = (record, k), group_offsets[0]
        size = group_offsets[k] - base
        with self._lock:
            fill = self._fills.get(key)
            if fill is None or fill.error is not None:
                if len(self._fills) >= MAX_FILLS or not self.fill_quota.take(size):
                    self.stats.add(extent_fill_fallbacks=1)
                    return None
                akey = self._admission("record", record, k)

                def fetch(ranges):
                    self.stats.add(backend_bytes=sum(e - s for s, e in ranges),
                                   backend_reads=len(ranges))
                    return self.backend.fetch_ranges(record, [(base + s, base + e) for s, e in ranges])

                def done(f):
                    self.stats.add(extent_fetches=1)
                    self._extents.put(key, f.buf, akey)
                    self.backend.keep_extent(record, base, f.buf, akey)

                def end(f):         # done or failed: its buffer leaves the fills' share
                    with self._lock:
                        if self._fills.get(key) is f:
                            del self._fills[key]
                    self.fill_quota.give(size)
                fill = self._fills[key] = FillingExtent(
                    size, cut([o - base for o in group_offsets[1 : k + 1]]), fetch, done,
                    on_end=end)
        fill.wait([(o - base, o - base + n) for o, n in segments])
        self.stats.add(cache_misses=1)
        try:
            return native.splice_buf(fill.buf, [(o - base, n) for o, n in segments])
        except native.NativeError as e:
            raise CorruptDataError(f"record {record}: extent too short ({e})") from None

    def _fetch_extent(self, record: int, k: int, start: int, end: int):
        """Concurrent readers of one record share one fetch."""
        def fetch():
            akey = self._admission("record", record, k)
            data = self.backend.pread(record, start, end - start, akey)
            self.stats.add(backend_bytes=len(data), backend_reads=1, extent_fetches=1)
            # larger than the whole cache: None, served image by image
            return data if self._extents.put((record, k), data, akey) else None
        return self._flight.do((record, k), fetch)
