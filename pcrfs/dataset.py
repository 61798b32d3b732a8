"""open_dataset(): the one read API.  The filesystem calls exactly these methods, so
anything a mount serves can be produced and tested without FUSE."""
from __future__ import annotations

import errno
import logging
import os
import stat as statmod
import uuid as uuidlib
from dataclasses import dataclass

from pcrfs.errors import CorruptDataError, DatasetError
from pcrfs.format import INDEX_DIR, RECORDS_DIR
from pcrfs.format.checksum import segment_checksum
from pcrfs.format.index import ImageEntry, IndexReader
from pcrfs.format.manifest import read_manifest
from pcrfs.stats import Stats
from pcrfs.storage.local import LocalStorage
from pcrfs.storage.reader import RecordReader
from pcrfs.storage.throttle import TokenBucket
from pcrfs.views import QView, parse_view
from pcrfs.views.qk import ReadPlan

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
    """A complete pcrfs dataset.  Thread-safe: the filesystem calls read() from worker
    threads.  cache_size bounds the record-extent LRU (see storage/reader.py);
    bandwidth_limit (bytes/s) throttles backend reads."""

    def __init__(self, root: str, cache_size: int = 1 << 30,
                 bandwidth_limit: int | None = None, stats: Stats | None = None):
        self.root = root
        self.manifest = read_manifest(root)
        self.uuid = uuidlib.UUID(self.manifest["uuid"])
        self.index = IndexReader(os.path.join(root, INDEX_DIR))
        if self.index.meta.get("uuid") != str(self.uuid):
            raise DatasetError(f"{root}: index belongs to dataset {self.index.meta.get('uuid')}, "
                               f"manifest says {self.uuid}; run `pcrfs reindex {root}`")
        if not os.path.isdir(os.path.join(root, RECORDS_DIR)):
            raise DatasetError(f"{root}: records directory missing")
        self.groups = int(self.manifest["groups"])
        self.views = [f"q{k}" for k in range(1, self.groups + 1)]
        self.classes = list(self.manifest["classes"])
        self.storage = LocalStorage(root)
        self.stats = stats or Stats()
        self.reader = RecordReader(self.storage, self.stats, cache_size,
                                   TokenBucket(bandwidth_limit) if bandwidth_limit else None)

    @property
    def checksum_failures(self) -> int:
        return self.stats.checksum_failures

    # -- lookups -------------------------------------------------------------
    def view(self, name: str) -> QView:
        return parse_view(name, self.groups)

    def lookup(self, relpath: str | bytes) -> ImageEntry:
        e = self.index.lookup(_b(relpath))
        if e is None:
            raise FileNotFoundError(errno.ENOENT, "no such image", os.fsdecode(relpath))
        return e

    def listdir(self, relpath: str | bytes = b"") -> list[tuple[bytes, bool]]:
        """[(name, is_dir)] sorted by name bytes."""
        out = self.index.listdir(_b(relpath))
        if out is None:
            if self.index.lookup(_b(relpath)) is not None:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", os.fsdecode(relpath))
            raise FileNotFoundError(errno.ENOENT, "no such directory", os.fsdecode(relpath))
        return out

    def stat(self, relpath: str | bytes, view: str) -> Stat:
        p = _b(relpath)
        if self.index.is_dir(p):
            return Stat(True, 0, statmod.S_IFDIR | 0o555)
        return Stat(False, self.view(view).size(self.lookup(p)), statmod.S_IFREG | 0o444)

    # -- reads ---------------------------------------------------------------
    def plan(self, relpath: str | bytes, view: str) -> ReadPlan:
        e = self.lookup(relpath)
        return self.view(view).plan(e, self.index.records[e.record])

    def read(self, relpath: str | bytes, view: str) -> bytes:
        """The file's bytes at `view`, every segment checksum verified."""
        e = self.lookup(relpath)
        v = self.view(view)
        offsets = self.index.records[e.record]
        plan = v.plan(e, offsets)
        data = self.reader.assemble(e.record, e.index, v.k, plan.segments, offsets)
        self.verify_plan(plan, data, relpath)
        self.stats.count("served_bytes", v.name, len(data))
        self.stats.count("served_files", v.name)
        return bytes(data)

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
