"""Live counters of a dataset reader / mount, rendered as .pcrfs/stats.json."""
from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections import Counter
from typing import NamedTuple

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


class Count(NamedTuple):
    """One counter of Stats: its key (the attribute, and the stats.json name), what it
    counts (Prometheus's help and docs/METRICS.md), the exported metric's name where it
    differs from the key (None: not exported), and for a counter kept per key (a view, an
    errno, a cause) the label that key becomes."""
    key: str
    help: str
    metric: str | None = ""
    label: str = ""

    @property
    def keyed(self) -> bool:
        return bool(self.label)


# The one table of Stats's counters: Stats, its snapshot (stats.json) and pcrfs.telemetry.metrics
# (Prometheus, docs/METRICS.md) are made from it.
COUNTS: tuple[Count, ...] = (
    # what the mount served (per view, operation or errno)
    Count("requests", "FUSE requests, by operation (the fast lane's opens and ioctls "
          "included).", "fuse_requests", "op"),
    Count("served_bytes", "Bytes returned to readers, by view.", label="view"),
    Count("served_files", "Files whose data was read, by view.", label="view"),
    Count("errors", "FUSE requests answered with an error, by errno.", "fuse_errors", "errno"),
    # where its bytes came from
    Count("backend_bytes", "Record bytes read from storage (or its disk cache).",
          "backend_read_bytes"),
    Count("backend_reads", "Reads of record bytes from storage."),
    Count("extent_fetches", "Whole record extents fetched for readers in record order."),
    Count("extent_fill_fallbacks", "Images read by their own segments under -o fetch=record "
          "because the record fills in progress held their whole share of the budget."),
    Count("checksum_failures", "Segments whose checksum did not match (EIO)."),
    Count("transcodes", "Format-view files produced (l3)."),
    Count("transcode_cache_hits", "Format-view files served from the on-disk transcode cache."),
    Count("raw_pack_reads", "Raw (PPM) files read from materialized packs."),
    Count("raw_pack_bytes", "Bytes of raw files read from materialized packs.",
          "raw_pack_read_bytes"),
    Count("raw_decodes", "Raw files produced by decoding the qG JPEG."),
    Count("raw_cache_hits", "Raw files served from the raw view's disk cache."),
    Count("raw_packs_replaced", "Raw packs found rewritten under the mount (materialize and "
          "push again); their new head is read."),
    # object storage (s3://, gs://, az://, http://)
    Count("remote_requests", "Requests sent to object storage (one per byte range)."),
    Count("remote_bytes", "Bytes received from object storage.", "remote_received_bytes"),
    Count("remote_retry_causes", "Object-storage attempts retried, by cause (HTTP status, "
          "timed out, connection failed).", "remote_retries", "cause"),
    Count("remote_error_causes", "Object-storage calls that failed for good (after "
          "retries), by cause.", "remote_errors", "cause"),
    Count("remote_retries", "Object-storage attempts retried (the causes' sum).", None),
    Count("remote_errors", "Calls that failed for good, 404s not counted (the causes' "
          "sum).", None),
    # caches
    Count("cache_hits", "Images whose bytes the reader found in memory.", "reader_cache_hits"),
    Count("cache_misses", "Images the reader had to fetch.", "reader_cache_misses"),
    Count("disk_cache_hits", "Segment or extent reads the disk cache answered."),
    Count("disk_cache_misses", "Reads the disk cache could not answer."),
    Count("disk_cache_image_hits", "Images served wholly from the disk cache."),
    Count("tier_damage_refetches", "Images whose cached bytes (memory, disk tier or a peer) "
          "failed their checksum and were fetched from storage instead."),
    Count("memory_image_hits", "Images served wholly from the memory tier."),
    # --shard / --peers (pcrfs/cluster/node.py, storage/peers.py) and `pcrfs warm`
    Count("owned_hits", "Images of this node's owned records served from its caches."),
    Count("peer_hits", "Segments read from another node's peer cache (memcached)."),
    Count("peer_misses", "Segments asked of a peer and not found there (or it was down)."),
    Count("peer_bytes", "Bytes received from peer caches.", "peer_received_bytes"),
    Count("peer_errors", "Failed calls to a peer (it is then skipped for a while)."),
    Count("peer_corrupt", "Peer values that failed their checksum (read from storage)."),
    Count("peer_published", "Segments this node stored in its peer cache."),
    Count("warm_gets", "Ranged GETs made by `pcrfs warm`."),
    Count("warm_bytes", "Bytes fetched by `pcrfs warm`.", "warm_fetched_bytes"),
)
COUNT = {c.key: c for c in COUNTS}


class Stats:
    """The counters of COUNTS (ints, or Counters for the keyed ones) and the latency
    histograms; add() and count() are safe from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.started = time.time()
        for c in COUNTS:
            setattr(self, c.key, Counter() if c.keyed else 0)
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
            return {"pid": os.getpid(), "uptime_s": round(time.time() - self.started, 3),
                    **{c.key: dict(getattr(self, c.key)) if c.keyed else getattr(self, c.key)
                       for c in COUNTS}}
