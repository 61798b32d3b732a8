"""open_dataset(): the one read API.  The filesystem calls exactly these methods, so
anything a mount serves can be produced and tested without FUSE."""
from __future__ import annotations

import errno
import logging
import os
import stat as statmod
import threading
import uuid as uuidlib
from dataclasses import dataclass

import numpy as np

from pcrfs.errors import CorruptDataError, DatasetError
from pcrfs.format import INDEX_DIR, RECORDS_DIR
from pcrfs.format.checksum import segment_checksum
from pcrfs.format.index import ImageEntry, IndexReader
from pcrfs.format.manifest import check_index_sum, read_manifest
from pcrfs.liquid.rules import MixOptions
from pcrfs.storage.budget import (
    FILL_SHARE,
    PENDING_MAX,
    PENDING_SHARE,
    READAHEAD_SHARE,
    STATIC_PENDING_SHARE,
    MemoryBudget,
    Quota,
)
from pcrfs.storage.cache import Admission, StaticPolicy, Universe, make_policy
from pcrfs.storage.diskcache import HEAD as DISK_ENTRY_HEAD
from pcrfs.storage.diskcache import (
    DiskCache,
    claim_private,
    default_cache_dir,
    fallback_cache_dir,
)
from pcrfs.storage.local import LocalStorage
from pcrfs.storage.objclient import ObjectClient, RemoteOptions, is_remote
from pcrfs.storage.reader import RecordReader
from pcrfs.storage.throttle import TokenBucket
from pcrfs.telemetry.stats import Stats
from pcrfs.views import View, dataset_views
from pcrfs.views.qk import ReadPlan, plan

DEFAULT_CACHE_DIR_SIZE = 4 << 30

log = logging.getLogger("pcrfs.dataset")


@dataclass(frozen=True)
class Stat:
    is_dir: bool
    size: int
    mode: int


def _b(path: str | bytes) -> bytes:
    p = os.fsencode(path).strip(b"/")
    return p


class Dataset:
    """A complete pcrfs dataset, in a local directory or at an s3:// or http(s):// URL.
    Its views: `views` are the fidelity views q1..qG; `all_views` every view `read()`
    accepts and a mount lists (q1..qG and l3, raw, mix where the dataset has them);
    `format_views` those other than q1..qG.
    Thread-safe: the filesystem calls read() from worker threads.  cache_size is the
    memory budget (storage/budget.py): the memory tier of storage/reader.py gets what the
    other holders of image bytes do not carve out; bandwidth_limit (bytes/s) throttles the
    bytes fetched from disk or network.  cache_dir holds the on-disk caches (l3
    transcodes; for a URL also the metadata copy and fetched extents), each bounded by
    cache_dir_size; a URL without one uses the default cache dir.  shard (pcrfs.cluster.shard.Shard)
    makes this node of a cluster (pcrfs/cluster/node.py): its disk tier keeps the records it
    owns, and with peers (node i's memcached at position i) it reads other nodes'
    records from their memcached first."""

    def __init__(self, root: str, cache_size: int = 1 << 30,
                 bandwidth_limit: int | None = None, stats: Stats | None = None,
                 cache_dir: str | None = None, cache_dir_size: int = DEFAULT_CACHE_DIR_SIZE,
                 remote: RemoteOptions | None = None, cache_policy: str = "lru",
                 mix: MixOptions | None = None, shard=None,
                 peers: list[tuple[str, int]] | None = None,
                 peer_bandwidth_limit: int | None = None, fetch: str = "image",
                 peer_key_file: str | None = None):
        self.stats = stats or Stats()
        self.mix_options = mix or MixOptions()
        self.url = root if is_remote(root) else None
        client = None
        if self.url:
            cache_dir = cache_dir or default_cache_dir()
        if cache_dir and os.path.abspath(cache_dir) == fallback_cache_dir():
            claim_private(cache_dir)
        if self.url:
            from pcrfs.storage.remote import fetch_metadata
            client = ObjectClient(root, remote, self.stats)
            root = fetch_metadata(client, cache_dir)
        self.root = root
        self.manifest = read_manifest(root)
        self.uuid = uuidlib.UUID(self.manifest["uuid"])
        check_index_sum(root, self.manifest)      # before LMDB maps it (docs/SECURITY.md)
        self.index = IndexReader(os.path.join(root, INDEX_DIR))
        if self.index.meta.get("uuid") != str(self.uuid):
            raise DatasetError(f"{root}: index belongs to dataset {self.index.meta.get('uuid')}, "
                               f"manifest says {self.uuid}; run `pcrfs reindex {root}`")
        if (bad := self.index.unsafe_name()) is not None:
            self.index.close()
            raise DatasetError(f"{root}: the index names {bad}: refused (pcrfs verify "
                               "lists every finding)")
        if client is None and not os.path.isdir(os.path.join(root, RECORDS_DIR)):
            raise DatasetError(f"{root}: records directory missing")
        self.groups = int(self.manifest["groups"])
        self.classes = list(self.manifest["classes"])
        self.throttle = TokenBucket(bandwidth_limit) if bandwidth_limit else None
        # admission and eviction of every cache tier (storage/cache.py); a static tier
        # admits the share of the dataset's bytes its capacity holds
        self.cache_policy = cache_policy
        universe = int(self.manifest.get("dataset_bytes") or 0) or None
        self.cache_dir, self.cache_dir_size = cache_dir, cache_dir_size
        self._disk_policy = make_policy(cache_policy, cache_dir_size, universe)
        self._universes: dict[tuple, Universe] = {}
        self._sizes: dict | None = None
        self._sizes_lock = threading.Lock()
        self.node = None
        if shard is not None:
            self.node = self._node(client, shard, peers, peer_bandwidth_limit, peer_key_file)
            self._disk_policy = self.node.policy
        elif peers:
            raise DatasetError("--peers needs --shard (which node this is)")
        self.budget = MemoryBudget(cache_size)
        share = STATIC_PENDING_SHARE if cache_policy == "static" else PENDING_SHARE
        self.pending = Quota(self.budget.carve(
            "pending_disk_writes", min(PENDING_MAX, cache_size // share))
        ) if cache_dir else None
        if client is None:
            self.storage = LocalStorage(root, self.throttle, stats=self.stats)
        else:
            from pcrfs.storage.remote import RemoteStorage
            disk = DiskCache(os.path.join(cache_dir, str(self.uuid), RECORDS_DIR), cache_dir_size,
                             self._disk_policy, self.pending)
            self.storage = RemoteStorage(client, disk, self.stats, self.throttle)
            self.storage.node = self.node
        policy = make_policy(cache_policy, cache_size, universe)
        readahead = 0 if policy.evicts else self.budget.carve("readahead", cache_size // READAHEAD_SHARE)
        whole = fetch == "record" and client is not None
        fills = Quota(self.budget.carve("record_fills", cache_size // FILL_SHARE) if whole else 0)
        self.reader = RecordReader(self.storage, self.stats, self.budget.remaining, policy,
                                   self.universe, readahead, whole_records=whole,
                                   fill_quota=fills)
        self._lane_pins: StaticPolicy | None = None    # pin_in_lane()
        self.views = [f"q{k}" for k in range(1, self.groups + 1)]   # fidelity views
        self.tiers: dict = {}    # tiers views own (add_tier): -o hold's, views/raw.py
        self.served: dict[str, View] = {}
        for v in dataset_views(self):
            self.served[v.name] = v
        # the views a listing shows (b_k not asked for is reached by name only)
        self.all_views = [n for n, v in self.served.items() if v.listed]
        self.format_views = [n for n in self.all_views if n not in self.views]

    def _node(self, client, shard, peers, peer_bandwidth_limit, peer_key_file=None):
        from pcrfs.cluster.node import ShardNode
        if client is None or not self.cache_dir:
            raise DatasetError("--shard needs a remote dataset (s3://...) and a --cache-dir: "
                               "each node keeps its shard of the bucket on its own disk")
        cache = None
        if peers:
            from pcrfs.storage.peers import PeerCache, namespace, read_key
            if len(peers) != shard.nodes:
                raise DatasetError(f"--peers lists {len(peers)} memcached servers for "
                                   f"{shard.nodes} nodes (--shard {shard}): one per node")
            cache = PeerCache(peers, shard.index, namespace(str(self.uuid)), self.stats,
                              peer_bandwidth_limit,
                              key=read_key(peer_key_file) if peer_key_file else None)
        return ShardNode(self, shard, cache)

    def disk_cache(self, name: str) -> DiskCache | None:
        """A view's own disk cache (derived bytes kept across epochs and remounts), under
        the cache dir; None when the dataset has no cache dir."""
        if not self.cache_dir:
            return None
        return DiskCache(os.path.join(self.cache_dir, str(self.uuid), name), self.cache_dir_size,
                         self._disk_policy, self.pending)

    def carve(self, name: str, nbytes: int) -> int:
        """Give `name` (the lane's store, open files) up to nbytes of the memory budget,
        taken from the memory tier; returns the bytes given."""
        given = self.budget.carve(name, nbytes)
        self.reader.cache.resize(self.budget.remaining)
        return given

    def uncarve(self, name: str) -> None:
        """Give `name`'s share back to the memory tier (a lane that did not start)."""
        self.budget.uncarve(name)
        self.reader.cache.resize(self.budget.remaining)

    def pin_in_lane(self, capacity: int | None) -> None:
        """Static with the fast lane: its image store holds the one pinned set (it answers
        READ and GETATTR of those files itself), which Python offers it through
        lane_keeps(); the memory tier, given none of the budget, holds no second copy.
        None: no pinned set (a lane that did not start)."""
        self._lane_pins = None if capacity is None else StaticPolicy(1.0, capacity)

    def lane_keeps(self, view, ordinal: int) -> bool:
        """Whether the lane's store should be offered file `ordinal` of view, once
        assembled: every file under lru (it evicts the least recent), the pinned set's
        under static."""
        if self._lane_pins is None:
            return True
        of = getattr(view, "universe", None)
        universe = of("memory") if of is not None else None
        return universe is not None and self._lane_pins.admits(Admission(ordinal, universe))

    # -- what a static tier admits from (storage/cache.py) ---------------------------
    def size_table(self) -> dict:
        """Every image's sizes (IndexReader.size_table), read once, on first need."""
        with self._sizes_lock:
            if self._sizes is None:
                self._sizes = self.index.size_table(self.groups)
            return self._sizes

    def universe(self, kind: str, k=None, load=None) -> Universe:
        """A Universe, made once per (kind, k); load: its (keys, sizes), else one of
        - ("file", k): each image's qk file, in memory;
        - ("segments", k): its k segments in a disk tier, a header each;
        - ("record", k): each record's extent of groups 1..k."""
        key = (kind, k)
        found = self._universes.get(key)
        if found is None:
            found = self._universes.setdefault(
                key, Universe(load or (lambda: self._q_universe(kind, k))))
        return found

    def _q_universe(self, kind: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(int(k), self.groups)
        if kind == "record":
            recs = sorted(self.index.records)
            offs = [self.index.records[r] for r in recs]
            return (np.array(recs, dtype=np.uint64),
                    np.array([o[min(k, len(o) - 1)] - o[0] for o in offs], dtype=np.int64))
        t = self.size_table()
        sizes = t["ends"][:, k - 1] + 2
        if kind == "segments":   # stored without EOI, each segment with its header
            sizes = sizes - 2 + DISK_ENTRY_HEAD.size * np.minimum(t["segments"], k)
        return t["ordinal"], sizes

    def cache_tiers(self) -> dict:
        """Counters of the memory tier, the disk tier of a remote dataset, and the tiers
        views own."""
        out = {"memory": self.reader.cache.stats()}
        if self.reader.readahead is not None:
            out["readahead"] = self.reader.readahead.stats()
        disk = getattr(self.storage, "disk", None)
        if disk is not None:
            out["disk"] = disk.stats()
        for name, tier in self.tiers.items():
            out[name] = tier.stats()
        return out

    def add_tier(self, name: str, tier) -> None:
        """A cache tier a view owns (it answers Tier.stats), shown in cache_tiers."""
        self.tiers[name] = tier

    @property
    def checksum_failures(self) -> int:
        return self.stats.checksum_failures

    # -- by path and view name (what tools and tests use; the mount calls the views) --
    def view(self, name: str) -> View:
        try:
            return self.served[name]
        except KeyError:
            raise KeyError(f"no view {name!r} (views: {', '.join(self.served)})") from None

    def lookup(self, relpath: str | bytes) -> ImageEntry:
        e = self.index.lookup(_b(relpath))
        if e is None:
            raise FileNotFoundError(errno.ENOENT, "no such image", os.fsdecode(relpath))
        return e

    def source_entry(self, relpath: str | bytes, view: str) -> ImageEntry:
        """The image behind a file of any view (l3 names map back to the source's)."""
        return self.view(view).entry(_b(relpath))

    def file_size(self, relpath: str | bytes, view: str) -> int | None:
        """Bytes of a file in `view`, or None if there is no such file."""
        e = self.view(view).lookup(_b(relpath))
        return None if e is None or e.is_dir else e.size

    def file_node(self, relpath: str | bytes, view: str) -> tuple[int, int] | None:
        """(size, node ordinal) of a file of `view`, or None if there is no such file."""
        e = self.view(view).lookup(_b(relpath))
        return None if e is None or e.is_dir else (e.size, e.ordinal)

    def listdir_numbered(self, relpath: str | bytes, view: str, sizes: bool = False
                         ) -> tuple[list[tuple[bytes, bool]], list[int], dict[bytes, int] | None]:
        """listdir(), the node ordinal of each entry, and with sizes the file sizes by
        name (views/tree.py).  ValueError if the index is damaged or has no numbers."""
        return tuple(self.view(view).list(_b(relpath), sizes))

    def listdir(self, relpath: str | bytes = b"", view: str | None = None) -> list[tuple[bytes, bool]]:
        """[(name, is_dir)] sorted by name bytes, as `view` (default: q1) names them."""
        return self.view(view or self.views[0]).names(_b(relpath))

    def sizes_in_dir(self, relpath: str | bytes, view: str) -> dict[bytes, int]:
        """name -> size for the files directly in a directory of `view` (one index walk)."""
        return self.view(view).sizes_in_dir(_b(relpath))

    def stat(self, relpath: str | bytes, view: str) -> Stat:
        e = self.view(view).lookup(_b(relpath))
        if e is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", os.fsdecode(relpath))
        if e.is_dir:
            return Stat(True, 0, statmod.S_IFDIR | 0o555)
        return Stat(False, e.size, statmod.S_IFREG | 0o444)

    def plan(self, relpath: str | bytes, view: str) -> ReadPlan:
        e = self.lookup(relpath)
        return self.view(view).plan(e, self.group_offsets(e))

    def read(self, relpath: str | bytes, view: str) -> bytes:
        """The file's bytes at `view`, every checksum verified."""
        return self.view(view).read(_b(relpath))

    # -- the data plane the views share ----------------------------------------------
    def pinned(self, view, e: ImageEntry, produce) -> bytes:
        """A file of a dataset view through the memory tier, when its policy pins images
        (static: a hash-chosen subset, kept for the life of the mount) and the lane's
        store does not hold that set instead (pin_in_lane).  Under lru the
        tier keeps record extents only: images are what the kernel's page cache holds,
        and a second LRU of the same bytes would only double them."""
        tier = self.reader.cache
        if tier.policy.evicts or self._lane_pins is not None:   # (the lane's store pins)
            return produce()
        key = ("image", view.name, e.ordinal)
        data = tier.get(key)
        if data is not None:
            self.stats.add(memory_image_hits=1)
        else:
            data = produce()
            tier.put(key, data, Admission(e.ordinal, view.universe("memory")))
        return data

    def group_offsets(self, e: ImageEntry) -> list[int]:
        """e's record's scan-group offsets; CorruptDataError (this file's EIO) if the
        index lists no such record."""
        offsets = self.index.records.get(e.record)
        if offsets is None:
            raise CorruptDataError(f"image {e.index} names record {e.record}, which the index "
                                   "does not list")
        return offsets

    def read_q(self, e: ImageEntry, k: int, relpath: bytes) -> bytes:
        """Image e at fidelity k (scan groups 1..k + EOI), every segment checksum verified."""
        offsets = self.group_offsets(e)
        p = plan(e, k, offsets)
        data = self.reader.assemble(e.record, e.index, k, p, offsets)
        try:
            self.verify_plan(p, data, relpath)
        except CorruptDataError:
            # bytes a cache tier kept (memory, disk, a peer) are damaged or forged: once,
            # from the store itself; damage in the store itself stays this file's EIO
            if not self.reader.forget(e.record, offsets, p.segments):
                raise
            self.stats.add(tier_damage_refetches=1)
            data = self.reader.assemble(e.record, e.index, k, p, offsets)
            self.verify_plan(p, data, relpath)
        return data

    def verify_plan(self, plan: ReadPlan, data, relpath) -> None:
        mv = memoryview(data)
        pos = 0
        for (off, ln), want in zip(plan.segments, plan.checksums, strict=True):
            if segment_checksum(mv[pos : pos + ln]) != want:
                self.stats.add(checksum_failures=1)
                detail = (f"{os.fsdecode(relpath)}: checksum mismatch in record "
                          f"{plan.record} at offset {off} (+{ln} bytes)")
                log.error(detail)
                raise CorruptDataError(detail)
            pos += ln

    def close(self) -> None:
        self.storage.close()
        self.index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_dataset(path: str, **kw) -> Dataset:
    return Dataset(path, **kw)
