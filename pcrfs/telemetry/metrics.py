"""Prometheus metrics of a mount: `-o metrics=HOST:PORT` (an HTTP endpoint) and
`-o metrics_textfile=PATH` (node-exporter's textfile collector).

Nothing here runs on the request path.  The counters stay where they are (pcrfs.telemetry.stats,
the fast lane's C counters) and the collector reads them when Prometheus scrapes, through
the same snapshot that renders .pcrfs/stats.json; latency histograms are fixed-bucket
arrays the request path already fills (stats.Latency).  METRICS below is the one list of
what is exported: the collector, docs/METRICS.md (tools/metrics_doc.py) and the test
that keeps the two equal all read it.  The counters of Stats are declared once, in
pcrfs.telemetry.stats.COUNTS (name, help, exported name, label); METRICS only places them (_s)."""
from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from pcrfs.errors import PcrfsError
from pcrfs.telemetry.stats import COUNT, COUNTS, LATENCY_BOUNDS, Stats

log = logging.getLogger("pcrfs.metrics")

PREFIX = "pcrfs_"
CONST_LABELS = ("mountpoint", "dataset_uuid")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TEXTFILE_INTERVAL = 15.0   # seconds between textfile rewrites (node-exporter reads on scrape)


@dataclass(frozen=True)
class Metric:
    name: str            # without the prefix, and without _total for counters
    kind: str            # counter | gauge | histogram
    help: str
    covers: str          # the stats.json path it exports; "*" stands for a label value
    label: str = ""      # the label the "*" becomes
    transform: Callable | None = None   # stats value -> number (None: drop the sample)
    only: tuple[str, ...] = ()   # the "*" keys exported (empty: all) ...
    skip: tuple[str, ...] = ()   # ... and those left to a metric of their own

    @property
    def exposed(self) -> str:
        """The name a PromQL query uses (histograms add _bucket/_sum/_count)."""
        return PREFIX + self.name + ("_total" if self.kind == "counter" else "")


def _c(name, covers, help, label="", **kw):
    return Metric(name, "counter", help, covers, label, **kw)


def _s(key):
    """A counter of Stats, exported as its row of pcrfs.telemetry.stats.COUNTS says."""
    c = COUNT[key]
    return Metric(c.metric or c.key, "counter", c.help, f"{c.key}.*" if c.keyed else c.key,
                  c.label)


def _g(name, covers, help, label="", transform=None, **kw):
    return Metric(name, "gauge", help, covers, label, transform, **kw)


def _fidelity(v):
    return int(v[1:]) if isinstance(v, str) and v[1:].isdigit() else None


METRICS: tuple[Metric, ...] = (
    # what the mount served
    _s("served_bytes"),
    _s("served_files"),
    _s("requests"),
    _s("errors"),
    _c("readdir_entries", "readdir_entries.*",
       "Directory entries listed, with attributes (attrs) or bare.", "kind"),
    Metric("fuse_request_duration_seconds", "histogram",
           "Time Python took to answer a FUSE request, by operation (the fast lane's "
           "requests are not timed).", "latency.fuse.*", "op"),
    # where its bytes came from
    _s("backend_bytes"),
    _s("backend_reads"),
    _s("extent_fetches"),
    _s("extent_fill_fallbacks"),
    Metric("backend_fetch_duration_seconds", "histogram",
           "Time one storage call took: pread / pread_segments (local records), get, "
           "ranged_get, head, list, put, delete (object storage; each attempt).",
           "latency.backend.*", "op"),
    _s("checksum_failures"),
    _s("transcodes"),
    _s("transcode_cache_hits"),
    _s("raw_pack_reads"),
    _s("raw_pack_bytes"),
    _s("raw_decodes"),
    _s("raw_cache_hits"),
    _s("raw_packs_replaced"),
    _g("raw_materialized_share", "raw.materialized_share",
       "Share of the images stored as raw packs (pcrfs materialize)."),
    _g("mix_raw_share", "mix.share", "Share of MNT/mix served as PPM."),
    _g("mix_fidelity", "mix.fidelity", "Fidelity k of MNT/mix's JPEG files."),
    # object storage
    _s("remote_requests"),
    _s("remote_bytes"),
    _s("remote_retry_causes"),
    _s("remote_error_causes"),
    # caches
    _s("cache_hits"),
    _s("cache_misses"),
    _g("reader_cache_bytes", "cache_bytes", "Bytes in the reader's memory cache."),
    _g("reader_cache_capacity_bytes", "cache_capacity", "Capacity of the reader's memory cache."),
    _c("cache_tier_hits", "cache_tiers.*.hits", "Cache tier lookups that hit, by tier.", "tier"),
    _c("cache_tier_misses", "cache_tiers.*.misses", "Cache tier lookups that missed, by tier.", "tier"),
    _c("cache_tier_admitted", "cache_tiers.*.admitted", "Entries a cache tier took in.", "tier"),
    _c("cache_tier_refused", "cache_tiers.*.refused",
       "Entries a cache tier's policy refused (static: outside its fixed subset).", "tier"),
    _c("cache_tier_evicted", "cache_tiers.*.evicted", "Entries a cache tier evicted.", "tier"),
    _g("cache_tier_bytes", "cache_tiers.*.bytes", "Bytes held by a cache tier.", "tier"),
    _g("cache_tier_capacity_bytes", "cache_tiers.*.capacity", "Capacity of a cache tier.", "tier"),
    _s("disk_cache_hits"),
    _s("disk_cache_misses"),
    _s("disk_cache_image_hits"),
    _s("tier_damage_refetches"),
    _c("disk_cache_discarded", "disk_cache_discarded",
       "Disk-cache entries found damaged, dropped and fetched again."),
    _g("disk_cache_bytes", "disk_cache_bytes", "Bytes in the disk cache."),
    _g("disk_cache_capacity_bytes", "disk_cache_capacity", "Capacity of the disk cache."),
    _s("memory_image_hits"),
    # --shard / --peers (pcrfs/cluster/node.py, pcrfs/storage/peers.py)
    _s("owned_hits"),
    _s("peer_hits"),
    _s("peer_misses"),
    _s("peer_bytes"),
    _s("peer_errors"),
    _s("peer_corrupt"),
    _s("peer_published"),
    _s("warm_gets"),
    _s("warm_bytes"),
    _g("shard_owned_records", "shard.owned_records", "Records this node owns (--shard)."),
    _g("shard_owned_images", "shard.owned_images", "Images in the records this node owns."),
    _g("shard_warmed_records", "shard.warm.done", "Owned records the last warm has done."),
    _g("memory_budget_bytes", "memory_budget.*",
       "The memory budget (--cache-size) and its shares.", "share", skip=("open_files_bytes",)),
    _g("open_file_images_bytes", "memory_budget.open_files_bytes",
       "Bytes of open files' images held (the open_files share's use)."),
    # the fast lane (requests answered in C)
    _c("fast_lane_requests", "fast_lane.*",
       "Requests the fast lane answered in C, by operation.", "op",
       only=("open", "release", "ioctl", "read", "getattr")),
    _c("fast_lane_handed_to_python", "fast_lane.handed_to_python",
       "Requests the fast lane passed on to Python."),
    _c("fast_lane_refused_nomem", "fast_lane.refused_nomem",
       "Images the lane store could not take (no memory)."),
    _g("fast_lane_buffer_bytes", "fast_lane.buffer_bytes", "The fast lane's request buffer."),
    _g("fast_lane_running", "fast_lane.running", "1 if the fast lane runs.", transform=int),
    _g("fast_lane_realtime", "fast_lane.realtime", "Lane threads running SCHED_FIFO.",
       transform=int),
    _g("fast_lane_threads", "fast_lane.threads", "Lane threads reading /dev/fuse."),
    _g("lane_segment_table_bytes", "fast_lane.segment_table_bytes",
       "Bytes of the segment table cold reads are served from (0: not in place)."),
    _c("lane_cold_files", "fast_lane.cold.*.files",
       "Files the lane read from the records itself (cold), by view.", "view"),
    _c("lane_cold_bytes", "fast_lane.cold.*.bytes", "Bytes of those files, by view.", "view"),
    _c("lane_cold_read_bytes", "fast_lane.cold.*.read_bytes",
       "Record bytes the lane read for them, by view.", "view"),
    _c("lane_cold_checksum_failures", "fast_lane.cold.*.checksum_failures",
       "Segments whose checksum failed in the lane (the file then goes to Python), by view.",
       "view"),
    _c("lane_cold_pack_bytes", "fast_lane.cold.*.pack_bytes",
       "Raw pack bytes the lane read for raw/ and mix/ PPMs, by view.", "view"),
    _c("lane_cold_pack_items", "fast_lane.cold.*.pack_items",
       "Raw pack items (PPMs) the lane read, by view.", "view"),
    _c("lane_cold_handed_to_python", "fast_lane.cold.*.handed_to_python",
       "Cold reads the lane gave to Python after a failure, by view.", "view"),
    _c("lane_cold_getattrs", "fast_lane.cold_getattr",
       "GETATTRs the lane answered from the segment table."),
    _c("lane_cold_lookups", "fast_lane.cold_lookup",
       "LOOKUPs of q-view files the lane answered from the segment table's names."),
    _c("lane_routed_replies", "fast_lane.routed_replies",
       "Python's replies sent back to the lane thread that read the request."),
    _g("lane_record_files_open", "fast_lane.record_fds_open",
       "Record files the lane holds open."),
    _c("lane_record_file_opens", "fast_lane.record_fds_opened", "Record files the lane opened."),
    _c("lane_record_file_evictions", "fast_lane.record_fds_evicted",
       "Record files the lane closed to make room."),
    _c("lane_disk_images_read", "fast_lane.disk_images_read",
       "Disk-tier segment entries the lane read for a remote dataset's cold files."),
    _c("lane_disk_images_missing", "fast_lane.disk_images_missing",
       "Cold files of a remote dataset the lane gave to Python: a segment not in the disk tier."),
    _g("lane_store_bytes", "fast_lane.store_bytes", "Bytes of images in the lane store."),
    _g("lane_store_budget_bytes", "fast_lane.store_budget", "The lane store's share of the budget."),
    _g("lane_store_images", "fast_lane.store_images", "Images in the lane store."),
    _c("lane_store_kept", "fast_lane.store_kept", "Images put into the lane store."),
    _c("lane_store_evicted", "fast_lane.store_evicted", "Images evicted from the lane store."),
    _c("lane_store_refused", "fast_lane.store_refused",
       "Images the lane store refused: full under static (it never evicts), or shrunk."),
    # the process and its files
    _g("uptime_seconds", "uptime_s", "Seconds since the mount started."),
    _c("restarts", "restarts",
       "Serving daemons the supervisor restarted after they died (supervised mounts)."),
    _c("upgrades", "upgrades", "Serving daemons replaced by `pcrfs upgrade` (supervised "
       "mounts)."),
    _c("recovered_inodes", "supervisor.recovered_inodes",
       "Inodes a restarted daemon named again from the index."),
    _g("supervisor_resend", "supervisor.resend",
       "1 where the kernel resends a dead daemon's requests to the next one (FUSE_NOTIFY_"
       "RESEND, Linux 6.9+), 0 where they fail once (docs/SEMANTICS.md, Kernels)."),
    _g("open_files", "open_files", "Files open through the mount."),
    _g("known_inodes", "known_inodes", "Inodes the kernel holds references to."),
    _g("record_files_open", "record_files.open", "Record files held open (local datasets)."),
    _g("record_files_capacity", "record_files.capacity", "Record files that may be held open."),
    _c("record_file_opens", "record_files.opens", "Record files opened."),
    _c("record_file_evictions", "record_files.evictions", "Record files closed to make room."),
    _c("record_file_sheds", "record_files.sheds",
       "Record files closed because the process ran out of descriptors."),
    _g("bandwidth_limit_bytes_per_second", "bandwidth_limit_bytes_per_s",
       "--bandwidth-limit (absent: no limit)."),
    _g("dynamic_fidelity", "dynamic_fidelity", "The fidelity k MNT/dynamic serves.",
       transform=_fidelity),
    _c("dynamic_fidelity_switches", "fidelity_switches", "Fidelity changes of MNT/dynamic."),
)
INFO_LABELS = ("version", "source")
# stats.json entries that are not numbers to export (they become labels, or say nothing
# a time series should)
NOT_EXPORTED = {"pid", "supervisor.pid", "source", "readdirplus", "cache_tiers.*.policy",
                "fast_lane.cold_views", "fast_lane.segment_source",
                "metrics_endpoint", "metrics_textfile", "shard.node", "shard.nodes", "shard.seed",
                "shard.warm.*", *(c.key for c in COUNTS if c.metric is None)}


def time_requests(ops, stats: Stats, names) -> None:
    """Wrap the handlers pyfuse3 calls on `ops` (looked up on the instance for every
    request) so each one's time lands in a histogram; only done with metrics on."""
    for name in names:
        handler = getattr(ops, name)
        hist = stats.latency_of("fuse", name)

        async def timed(*args, _handler=handler, _hist=hist):
            t = time.perf_counter()
            try:
                return await _handler(*args)
            finally:
                _hist.observe(time.perf_counter() - t)
        setattr(ops, name, timed)


def safe_source(source: str) -> str:
    """A dataset URL as a label: user, password, query and fragment removed (a presigned
    or basic-auth URL must not end up in a time-series database)."""
    if "://" not in source:
        return source
    p = urlsplit(source)
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return urlunsplit((p.scheme, host, p.path, "", ""))


def parse_labels(text: str) -> dict[str, str]:
    """'k=v;k2=v2' (the mount option parser joins k=v,k2=v2 with ';')."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        k, sep, v = part.partition("=")
        if not sep or not _LABEL.match(k) or k.startswith("__"):
            raise PcrfsError(f"-o metrics_labels: {part!r} is not NAME=VALUE with a Prometheus "
                             f"label name")
        if k in CONST_LABELS or k in ("le", "quantile") or any(k == m.label for m in METRICS) \
                or k in INFO_LABELS:
            raise PcrfsError(f"-o metrics_labels: {k!r} is a label pcrfs sets itself")
        out[k] = v
    return out


def parse_address(text: str) -> tuple[str, int]:
    """'PORT', 'HOST:PORT' or '[V6]:PORT'; the host defaults to 127.0.0.1 (metrics say
    what is read, and by whom: not for every network by default)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise PcrfsError(f"-o metrics={text}: expected PORT or HOST:PORT")
    return host, int(port)


def _leaves(snap: dict, path: str) -> Iterator[tuple[str, object]]:
    """(label value, value) for a covers path; '*' binds the label."""
    def walk(node, parts, bound):
        if not parts:
            yield bound, node
            return
        head, rest = parts[0], parts[1:]
        if not isinstance(node, dict):
            return
        if head == "*":
            for k, v in node.items():
                yield from walk(v, rest, k)
        elif head in node:
            yield from walk(node[head], rest, bound)
    yield from walk(snap, path.split("."), "")


class Collector:
    """Reads a mount's counters on each scrape (prometheus_client's custom-collector
    interface)."""

    def __init__(self, snapshot: Callable[[], dict], stats: Stats, labels: dict[str, str],
                 version: str, source: str):
        self.snapshot, self.stats = snapshot, stats
        self.names, self.values = list(labels), list(labels.values())
        self.info = {"version": version, "source": safe_source(source)}

    def describe(self):
        return []   # no scrape at registration time

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        snap = self.snapshot()      # taken on the trio thread (fs/loop.py)
        latency = self.stats.latency_snapshot()
        info = GaugeMetricFamily(PREFIX + "info", "pcrfs version and the dataset it serves "
                                 "(credentials removed from URLs).",
                                 labels=self.names + list(INFO_LABELS))
        info.add_metric(self.values + list(self.info.values()), 1)
        yield info
        for m in METRICS:
            labels = self.names + ([m.label] if m.label else [])
            name = PREFIX + m.name
            if m.kind == "histogram":
                fam = HistogramMetricFamily(name, m.help, labels=labels)
                kind = m.covers.split(".")[1]
                for (k, op), (counts, total) in sorted(latency.items()):
                    if k != kind or not sum(counts):
                        continue
                    cum, buckets = 0, []
                    for bound, n in zip((*LATENCY_BOUNDS, float("inf")), counts, strict=True):
                        cum += n
                        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cum))
                    fam.add_metric(self.values + [op], buckets, total)
                yield fam
                continue
            fam = (CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily)(
                name, m.help, labels=labels)
            for bound, value in _leaves(snap, m.covers):
                if (m.only and bound not in m.only) or bound in m.skip:
                    continue
                if m.transform is not None:
                    value = m.transform(value)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                fam.add_metric(self.values + ([bound] if m.label else []), value)
            yield fam


class Exporter:
    """The endpoint and/or the textfile writer of one mount; stop() at unmount."""

    def __init__(self, collector: Collector, address: tuple[str, int] | None,
                 textfile: str | None, interval: float = TEXTFILE_INTERVAL):
        from prometheus_client import CollectorRegistry
        from prometheus_client.process_collector import ProcessCollector
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)   # RSS, CPU, descriptors of the daemon
        self.textfile, self.interval = textfile, interval
        self._server = None
        self._stop = threading.Event()
        self.endpoint: str | None = None
        if address is not None:
            from prometheus_client import start_http_server
            try:
                self._server, _ = start_http_server(address[1], address[0],
                                                               registry=self.registry)
            except OSError as e:
                raise PcrfsError(f"-o metrics={address[0]}:{address[1]}: cannot listen "
                                 f"({e.strerror})") from None
            host, port = self._server.server_address[:2]
            self.endpoint = f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
            log.info("metrics at %s", self.endpoint)
        if textfile:
            self.write_textfile()       # fails now, at mount, if the path is unwritable
            self._writer = threading.Thread(target=self._rewrite, name="pcrfs-metrics-file",
                                            daemon=True)
            self._writer.start()

    def write_textfile(self) -> None:
        from prometheus_client import write_to_textfile
        try:
            write_to_textfile(self.textfile, self.registry)   # a temporary file, renamed
        except OSError as e:
            raise PcrfsError(f"-o metrics_textfile={self.textfile}: {e.strerror}") from None

    def _rewrite(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write_textfile()
            except PcrfsError as e:
                log.warning("%s", e)

    def stop(self) -> None:
        self._stop.set()
        if self.textfile:
            try:
                self.write_textfile()   # the final counts
            except PcrfsError as e:
                log.warning("%s", e)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
