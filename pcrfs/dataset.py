"""open_dataset(): the one read API.  The filesystem calls exactly these methods, so
anything a mount serves can be produced and tested without FUSE."""
from __future__ import annotations

import errno
import logging
import os
import stat as statmod
import threading
import uuid as uuidlib
from collections import OrderedDict
from concurrent.futures import Future
from collections.abc import Sequence
from dataclasses import dataclass

from pcrfs.errors import CorruptDataError, DatasetError
from pcrfs.format import INDEX_DIR, RECORDS_DIR, record_name
from pcrfs.format.checksum import block_checksum, segment_checksum
from pcrfs.format.index import ImageEntry, IndexReader
from pcrfs.format.l3meta import l3meta_intact, parse_l3meta
from pcrfs.format.manifest import read_manifest
from pcrfs.stats import Stats
from pcrfs.storage.diskcache import DiskCache, default_cache_dir
from pcrfs.storage.fds import OutOfDescriptors
from pcrfs.storage.local import LocalStorage
from pcrfs.storage.objclient import ObjectClient, RemoteOptions, is_remote
from pcrfs.storage.reader import RecordReader
from pcrfs.storage.throttle import TokenBucket
from pcrfs.views import QView, parse_view
from pcrfs.views.l3 import NAME as L3_VIEW
from pcrfs.views.l3 import l3_bytes, l3_names
from pcrfs.views.qk import ReadPlan

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
    Thread-safe: the filesystem calls read() from worker threads.  cache_size bounds the
    record-extent LRU (see storage/reader.py); bandwidth_limit (bytes/s) throttles the
    bytes fetched from disk or network.  cache_dir holds the on-disk caches (l3
    transcodes; for a URL also the metadata copy and fetched extents), each bounded by
    cache_dir_size; a URL without one uses the default cache dir."""

    def __init__(self, root: str, cache_size: int = 1 << 30,
                 bandwidth_limit: int | None = None, stats: Stats | None = None,
                 cache_dir: str | None = None, cache_dir_size: int = DEFAULT_CACHE_DIR_SIZE,
                 remote: RemoteOptions | None = None):
        self.stats = stats or Stats()
        self.url = root if is_remote(root) else None
        client = None
        if self.url:
            from pcrfs.storage.remote import fetch_metadata
            cache_dir = cache_dir or default_cache_dir()
            client = ObjectClient(root, remote, self.stats)
            root = fetch_metadata(client, cache_dir)
        self.root = root
        self.manifest = read_manifest(root)
        self.uuid = uuidlib.UUID(self.manifest["uuid"])
        self.index = IndexReader(os.path.join(root, INDEX_DIR))
        if self.index.meta.get("uuid") != str(self.uuid):
            raise DatasetError(f"{root}: index belongs to dataset {self.index.meta.get('uuid')}, "
                               f"manifest says {self.uuid}; run `pcrfs reindex {root}`")
        if client is None and not os.path.isdir(os.path.join(root, RECORDS_DIR)):
            raise DatasetError(f"{root}: records directory missing")
        self.groups = int(self.manifest["groups"])
        self.format_views = [v for v in self.index.meta.get("format_views", []) if v == L3_VIEW]
        self.views = [f"q{k}" for k in range(1, self.groups + 1)]   # fidelity views
        self.all_views = self.views + self.format_views
        self.classes = list(self.manifest["classes"])
        self.throttle = TokenBucket(bandwidth_limit) if bandwidth_limit else None
        if client is None:
            self.storage = LocalStorage(root, self.throttle)
        else:
            from pcrfs.storage.remote import RemoteStorage
            disk = DiskCache(os.path.join(cache_dir, str(self.uuid), RECORDS_DIR), cache_dir_size)
            self.storage = RemoteStorage(client, disk, self.stats, self.throttle)
        self.reader = RecordReader(self.storage, self.stats, cache_size)
        # Transcoded format-view files, kept across epochs and remounts (None: no cache).
        self.transcode_cache = (DiskCache(os.path.join(cache_dir, str(self.uuid), L3_VIEW),
                                          cache_dir_size)
                                if cache_dir and self.format_views else None)
        self._inflight: dict[bytes, Future] = {}
        self._l3_maps: OrderedDict[bytes, dict[bytes, bytes]] = OrderedDict()
        self._l3_maps_lock = threading.Lock()
        self._l3_sums: OrderedDict[int, object] = OrderedDict()  # record -> xxh3 array
        self._inflight_lock = threading.Lock()

    @property
    def checksum_failures(self) -> int:
        return self.stats.checksum_failures

    # -- lookups -------------------------------------------------------------
    def view(self, name: str) -> QView:
        """The q view `name` (format views have no read plan of their own)."""
        return parse_view(name, self.groups)

    def lookup(self, relpath: str | bytes) -> ImageEntry:
        e = self.index.lookup(_b(relpath))
        if e is None:
            raise FileNotFoundError(errno.ENOENT, "no such image", os.fsdecode(relpath))
        return e

    def source_entry(self, relpath: str | bytes, view: str) -> ImageEntry:
        """The image behind a file of any view (l3 names map back to the source's)."""
        if view == L3_VIEW:
            return self._l3(relpath)[2]
        return self.lookup(relpath)

    def l3_source(self, relpath: bytes) -> bytes | None:
        """The source path behind an l3 view path, or None (the name map is per directory)."""
        if not self.format_views:
            return None
        parent, _, name = relpath.rpartition(b"/")
        src = self._l3_dir_map(parent).get(name)
        return None if src is None else (parent + b"/" + src if parent else src)

    def _l3_dir_map(self, parent: bytes) -> dict[bytes, bytes]:
        with self._l3_maps_lock:
            found = self._l3_maps.get(parent)
            if found is not None:
                self._l3_maps.move_to_end(parent)
                return found
        listing = self.index.listdir(parent) or []
        rev = {v: k for k, v in l3_names(n for n, d in listing if not d).items()}
        with self._l3_maps_lock:
            self._l3_maps[parent] = rev
            while len(self._l3_maps) > 256:
                self._l3_maps.popitem(last=False)
        return rev

    def _l3(self, relpath) -> tuple[int, bytes, ImageEntry]:
        """(size, source path, source entry) of an l3 view file."""
        src = self.l3_source(_b(relpath))
        e = None if src is None else self.index.lookup(src)
        if e is None or e.l3_size is None:
            raise FileNotFoundError(errno.ENOENT, "no such l3 file", os.fsdecode(relpath))
        return e.l3_size, src, e

    def _l3_checksum(self, e: ImageEntry) -> int:
        """XXH3-64 of an image's l3 file, from its record's sidecar (kept out of the index
        to keep entries small; sidecars are cached per record).  A sidecar that fails its
        own checksum is still used item by item (format/l3meta.py): a damaged item then
        fails only its image's l3 check."""
        with self._l3_maps_lock:
            arr = self._l3_sums.get(e.record)
        if arr is None:
            name = f"sidecar of {record_name(e.record)}"
            try:
                data = self.storage.sidecar(e.record)
                arr = parse_l3meta(data, name, e.record, self.uuid, -1, strict=False)["xxh"]
            except OutOfDescriptors:
                raise
            except (OSError, DatasetError) as err:
                self.stats.add(checksum_failures=1)
                raise CorruptDataError(f"l3 sidecar of record {e.record}: {err}") from None
            if not l3meta_intact(data):
                self.stats.add(checksum_failures=1)
                log.error("%s fails its checksum: each of its images is checked on its own; "
                          "`pcrfs verify` names the damaged ones", name)
            with self._l3_maps_lock:
                self._l3_sums[e.record] = arr
                while len(self._l3_sums) > 512:
                    self._l3_sums.popitem(last=False)
        if e.index >= len(arr):
            raise CorruptDataError(f"l3 sidecar of record {e.record} has no item {e.index}")
        return int(arr[e.index])

    def file_size(self, relpath: str | bytes, view: str) -> int | None:
        """Bytes of a file in `view`, or None if there is no such file."""
        p = _b(relpath)
        if view == L3_VIEW:
            try:
                return self._l3(p)[0]
            except FileNotFoundError:
                return None
        e = self.index.lookup(p)
        return None if e is None else self.view(view).size(e)

    def file_node(self, relpath: str | bytes, view: str) -> tuple[int, int] | None:
        """(size, node ordinal) of a file of `view`, or None if there is no such file.
        The ordinal is the source image's, so it is unique within every view."""
        p = _b(relpath)
        if view == L3_VIEW:
            try:
                size, _, e = self._l3(p)
            except FileNotFoundError:
                return None
            return size, e.ordinal
        e = self.index.lookup(p)
        return None if e is None else (self.view(view).size(e), e.ordinal)

    def listdir_numbered(self, relpath: str | bytes, view: str, sizes: bool = False
                         ) -> tuple[list[tuple[bytes, bool]], list[int], dict[bytes, int] | None]:
        """listdir(), the node ordinal of each entry in the same order, and with sizes the
        file sizes by name.  One read of the listing, which holds the files' ordinals as
        runs in a sorted build; only sizes or a build without runs cost an ordered walk of
        the entries.  ValueError if the index is damaged or has no node numbers."""
        p = _b(relpath)
        found = self.index.dir_numbering(p)
        if found is None:
            self.listdir(p, view)        # the error a missing directory gets
            raise ValueError("the index has no node numbers (older pcrfs): run `pcrfs reindex`")
        src, sub, file_ords = found
        l3 = view == L3_VIEW
        names = self.listdir(p, view) if l3 else src
        files = None
        if file_ords is None or sizes:   # one ordered walk gives ordinals and sizes
            files = self.index.files_in_dir(p, None if l3 else self.view(view).k)
        elif l3:
            it = iter(file_ords)
            files = {n: (next(it), None) for n, d in src if not d}
        ords: list[int] = []
        out = {} if sizes else None
        if files is None:                # stored runs, listing order: nothing per entry
            it = iter(file_ords)
            for _, d in names:
                if d:
                    ords.append(sub)
                    sub += 1
                else:
                    ords.append(next(it))
            return names, ords, out
        rev = self._l3_dir_map(p) if l3 else None
        try:
            for n, d in names:
                if d:
                    ords.append(sub)
                    sub += 1
                    continue
                o, size = files[rev[n] if l3 else n]
                ords.append(o)
                if out is not None and size is not None:
                    out[n] = size
        except KeyError:
            raise ValueError("the directory listing names a file the index has no entry for") from None
        return names, ords, out

    def listdir(self, relpath: str | bytes = b"", view: str | None = None) -> list[tuple[bytes, bool]]:
        """[(name, is_dir)] sorted by name bytes, as `view` names them."""
        out = self.index.listdir(_b(relpath))
        if out is None:
            if self.index.lookup(_b(relpath)) is not None:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", os.fsdecode(relpath))
            raise FileNotFoundError(errno.ENOENT, "no such directory", os.fsdecode(relpath))
        if view == L3_VIEW:
            names = l3_names(n for n, d in out if not d)
            out = sorted((n if d else names[n], d) for n, d in out)
        return out

    def sizes_in_dir(self, relpath: str | bytes, view: str) -> dict[bytes, int]:
        """name -> size for the files directly in a directory of `view` (one index walk)."""
        if view == L3_VIEW:
            sizes = self.index.l3_sizes_in_dir(_b(relpath))
            return {l3n: sizes[src] for l3n, src in self._l3_dir_map(_b(relpath)).items()
                    if sizes.get(src) is not None}
        return self.index.sizes_in_dir(_b(relpath), self.view(view).k)

    def stat(self, relpath: str | bytes, view: str) -> Stat:
        p = _b(relpath)
        if self.index.is_dir(p):
            return Stat(True, 0, statmod.S_IFDIR | 0o555)
        size = self.file_size(p, view)
        if size is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", os.fsdecode(relpath))
        return Stat(False, size, statmod.S_IFREG | 0o444)

    # -- reads ---------------------------------------------------------------
    def plan(self, relpath: str | bytes, view: str) -> ReadPlan:
        e = self.lookup(relpath)
        return self.view(view).plan(e, self.index.records[e.record])

    def read(self, relpath: str | bytes, view: str) -> bytes:
        """The file's bytes at `view`, every segment checksum verified."""
        if view == L3_VIEW:
            data = self._read_l3(relpath)
        else:
            data = self._read_q(relpath, self.view(view))
        self.stats.count("served_bytes", view, len(data))
        self.stats.count("served_files", view)
        return data

    def _read_q(self, relpath, v: QView) -> bytes:
        e = self.lookup(relpath)
        offsets = self.index.records[e.record]
        plan = v.plan(e, offsets)
        data = self.reader.assemble(e.record, e.index, v.k, plan.segments, offsets)
        self.verify_plan(plan, data, relpath)
        return bytes(data)

    def _read_l3(self, relpath) -> bytes:
        """Concurrent first reads of one file share a single transcode."""
        size, src, e = self._l3(relpath)
        with self._inflight_lock:
            fut = self._inflight.get(src)
            owner = fut is None
            if owner:
                fut = self._inflight[src] = Future()
        if not owner:
            return fut.result()
        try:
            data = self._produce_l3(relpath, src, size, e)
            fut.set_result(data)
            return data
        except BaseException as e:
            fut.set_exception(e)
            raise
        finally:
            with self._inflight_lock:
                del self._inflight[src]

    def _produce_l3(self, relpath, src: bytes, size: int, e: ImageEntry) -> bytes:
        key = src.hex()
        xxh = self._l3_checksum(e)
        cache = self.transcode_cache
        if cache is not None:
            data = cache.get(key)
            if data is not None and len(data) == size and block_checksum(data) == xxh:
                self.stats.add(transcode_cache_hits=1)
                return data
        jpeg = self._read_q(src, QView(self.groups))
        data = l3_bytes(jpeg)
        self.stats.add(transcodes=1)
        if len(data) != size or block_checksum(data) != xxh:
            self.stats.add(checksum_failures=1)
            detail = (f"{os.fsdecode(relpath)}: the l3 transcode of {os.fsdecode(src)} gives "
                      f"{len(data)} bytes / checksum {block_checksum(data):016x}, the build "
                      f"recorded {size} / {xxh:016x}: this JPEG decoder differs from the "
                      f"build's (another Pillow/libjpeg version?); rebuild, or serve qG")
            log.error(detail)
            raise CorruptDataError(detail)
        if cache is not None:
            cache.put(key, data)
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
