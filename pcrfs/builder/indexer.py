"""Deriving the index from record headers: used at the end of every build and by
`pcrfs reindex`, so the records alone always suffice to rebuild it."""
from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import shutil
import uuid as uuidlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from pcrfs.errors import DatasetError
from pcrfs.format import FORMAT_VERSION, INDEX_DIR, MANIFEST, RECORDS_DIR, segtab, sidecar_path
from pcrfs.format.index import (
    INDEX_BITS,
    ORDINAL_SCHEME,
    ORDINALS,
    RECIDX,
    RECORD_BITS,
    dir_ordinals,
    file_ordinal,
    file_runs,
    pack_entry_table,
    write_index,
)
from pcrfs.format.l3meta import read_l3meta
from pcrfs.format.manifest import SELF_SUM, metadata_sums, write_json_atomic
from pcrfs.format.record import RecordHeader, read_header_path

log = logging.getLogger("pcrfs.indexer")


@dataclass
class IndexStats:
    uuid: uuidlib.UUID
    images: int
    records: int
    groups: int
    classes: list[bytes]
    sizes: np.ndarray  # (images, G) bytes at q1..qG
    index_bytes: int
    empty_classes: list[bytes]
    l3: bool = False  # the l3 view's sizes are in the index


def record_paths(root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(root, RECORDS_DIR, "r*.pcr")))


def build_index(root: str, expect_uuid: uuidlib.UUID | None = None,
                index_path: str | None = None) -> IndexStats:
    """The index of the records under root (their headers and l3 sidecars)."""
    paths = record_paths(root)
    if not paths:
        raise DatasetError(f"{root}: no records")
    return index_headers(_record_headers(paths, expect_uuid), expect_uuid,
                         index_path or os.path.join(root, INDEX_DIR))


def _record_headers(paths: list[str], uid: uuidlib.UUID | None
                    ) -> Iterator[tuple[str, RecordHeader, np.ndarray | None]]:
    for p in paths:
        h = read_header_path(p)
        uid = uid or h.dataset_uuid
        if h.dataset_uuid != uid:   # before its sidecar, which would not match either
            raise DatasetError(f"{p}: belongs to dataset {h.dataset_uuid}, expected {uid}")
        meta_path = sidecar_path(p)
        l3m = None
        if os.path.exists(meta_path):
            l3m = read_l3meta(meta_path, h.number, uid, h.count)
        yield p, h, l3m


def index_headers(items: Iterable[tuple[str, RecordHeader, np.ndarray | None]],
                  expect_uuid: uuidlib.UUID | None, target: str) -> IndexStats:
    """Write the index at `target` from each record's (name, header, l3 items or None),
    in record order: from the records themselves, or from a build's index parts."""
    entries, records, all_sizes = [], {}, []
    listings: dict[bytes, set[tuple[bytes, bool]]] = {b"": set()}
    uid, classes, groups = expect_uuid, None, 0
    l3_any = l3_missing = False
    for p, h, l3m in items:
        if uid is None:
            uid = h.dataset_uuid
        if h.dataset_uuid != uid:
            raise DatasetError(f"{p}: belongs to dataset {h.dataset_uuid}, expected {uid}")
        if classes is None:
            classes = h.classes
        elif h.classes != classes:
            raise DatasetError(f"{p}: class list differs from the other records")
        if h.number in records:
            raise DatasetError(f"{p}: duplicate record number {h.number}")
        if h.number >= 1 << RECORD_BITS or h.count > 1 << INDEX_BITS:
            raise DatasetError(f"{p}: record number or image count beyond the inode scheme")
        records[h.number] = h.group_offsets
        groups = max(groups, h.groups)
        l3_missing |= l3m is None
        # A record's tables at once (numpy per image cost ~65 us, single-threaded, after
        # the last image of a build): an image's scans are the nonzero prefix of its row.
        lens = h.lengths
        nsegs = np.count_nonzero(lens, axis=1)
        ok = (nsegs > 0) & ((lens != 0) == (np.arange(lens.shape[1]) < nsegs[:, None])).all(axis=1)
        if not ok.all():
            bad = h.images[int(np.argmin(ok))]
            raise DatasetError(f"{p}: image {bad.path!r} has an invalid segment table")
        offs = h.offsets_in_group()
        if offs.size and int(offs.max()) >> 32:
            raise DatasetError(f"{p}: a scan group larger than 4 GiB")
        cum = np.cumsum(lens, axis=1, dtype=np.int64)   # constant past an image's last scan
        table = np.stack([cum, offs.astype(np.int64), h.checksums.astype(np.int64)],
                         axis=2).astype("<u4")
        for i, m in enumerate(h.images):
            l3 = None if l3m is None else int(l3m[i]["size"])
            entries.append((m.path, pack_entry_table(h.number, i, m.label, m.width, m.height,
                                                     m.components, m.flags,
                                                     table[i, : int(nsegs[i])], l3_size=l3)))
            add_to_tree(listings, m.path)
            l3_any |= l3 is not None
        all_sizes.append(cum)
    empty = [c for c in classes or [] if c not in listings]
    for c in classes or []:
        listings[b""].add((c, True))
        listings.setdefault(c, set())
    sizes = np.concatenate([np.pad(c, ((0, 0), (0, groups - c.shape[1])), mode="edge")
                            for c in all_sizes]) + 2
    meta = {"format_version": FORMAT_VERSION, "uuid": str(uid), "groups": groups,
            "images": len(entries), "records": len(records),
            "classes": [os.fsdecode(c) for c in classes or []]}
    l3 = l3_any and not l3_missing
    if not records:
        raise DatasetError(f"{target}: no records to index")
    if l3_any and l3_missing:
        log.warning("%s: some records have no l3 sidecar; the l3 view is disabled", target)
    meta["format_views"] = ["l3"] if l3 else []
    meta[ORDINALS] = ORDINAL_SCHEME
    tree = {d: sorted(v) for d, v in listings.items()}
    write_index(target, meta, entries, tree, records, listing_heads(tree, entries))
    return IndexStats(uid, len(entries), len(records), groups, classes or [], sizes,
                      os.path.getsize(os.path.join(target, "data.mdb")), empty, l3)


def listing_heads(tree: dict[bytes, list[tuple[bytes, bool]]], entries) -> dict:
    """directory -> (its ordinal, its first subdirectory's, its files' ordinal runs), the
    heads write_index stores in front of each listing; entries: (path, packed entry)."""
    ordinal = {p: file_ordinal(*RECIDX.unpack_from(v, 0)) for p, v in entries}
    heads = {}
    for d, (own, sub) in dir_ordinals(tree).items():
        prefix = d + b"/" if d else b""
        heads[d] = (own, sub, file_runs([ordinal[prefix + n] for n, is_dir in tree[d]
                                         if not is_dir]))
    return heads


def add_to_tree(listings, path: bytes) -> None:
    """Record path and every directory above it in listings (dir -> {(name, is_dir)})."""
    parent, _, name = path.rpartition(b"/")
    is_dir = False
    while True:
        listings.setdefault(parent, set()).add((name, is_dir))
        if not parent:
            return
        parent, _, name = parent.rpartition(b"/")
        is_dir = True


def reindex(root: str, expect_uuid: uuidlib.UUID | None) -> IndexStats:
    """Rebuild root/index.lmdb from the records, replacing the old one only on success."""
    new = os.path.join(root, INDEX_DIR + ".new")
    shutil.rmtree(new, ignore_errors=True)
    stats = build_index(root, expect_uuid, new)
    old = os.path.join(root, INDEX_DIR + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(os.path.join(root, INDEX_DIR)):
        os.rename(os.path.join(root, INDEX_DIR), old)
    os.rename(new, os.path.join(root, INDEX_DIR))
    shutil.rmtree(old, ignore_errors=True)
    m = _resum_manifest(root, stats)
    # the table of the old index no longer matches (a mount would ignore it): a new one
    if m is None or segtab.write_for(root, m) is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, segtab.FILE))
    return stats


def _resum_manifest(root: str, stats: IndexStats) -> dict | None:
    """The manifest vouches for the index's bytes: record the new index's.  The manifest,
    or None if there is none to update."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None  # no readable manifest: reindex alone does not complete a build
    m.pop(SELF_SUM, None)
    m["files"] = {**m.get("files", {}), **metadata_sums(root)}
    m["index_bytes"] = stats.index_bytes
    write_json_atomic(path, m, self_sum=True)
    return m
