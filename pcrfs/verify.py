"""`pcrfs verify`: every segment checksum, and record / index / manifest agreement."""
from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from pcrfs.build.indexer import record_paths
from pcrfs.errors import DatasetError
from pcrfs.format import INDEX_DIR
from pcrfs.format.checksum import segment_checksum
from pcrfs.format.index import IndexReader
from pcrfs.format.manifest import read_manifest
from pcrfs.format.record import read_header


@dataclass
class VerifyReport:
    images_checked: int = 0
    segments_checked: int = 0
    damaged: dict[str, str] = field(default_factory=dict)   # image path -> reason
    problems: list[str] = field(default_factory=list)       # dataset-level problems

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.problems


def verify(root: str) -> VerifyReport:
    rep = VerifyReport()
    manifest = read_manifest(root)
    try:
        index = IndexReader(os.path.join(root, INDEX_DIR))
    except (DatasetError, OSError) as e:
        rep.problems.append(f"index unreadable: {e}")
        return rep
    uid = manifest["uuid"]
    if index.meta.get("uuid") != uid:
        rep.problems.append(f"index uuid {index.meta.get('uuid')} != manifest uuid {uid}")
    by_record: dict[int, list[tuple[bytes, object]]] = {}
    for path, e in index.iter_images():
        by_record.setdefault(e.record, []).append((path, e))
    if sum(len(v) for v in by_record.values()) != manifest["images"]:
        rep.problems.append("index image count differs from the manifest")
    seen = set()
    for rpath in record_paths(root):
        num = int(os.path.basename(rpath)[1:7])
        seen.add(num)
        entries = by_record.get(num, [])
        for path, reason in _check_record(rpath, num, uid, entries, index, rep):
            rep.damaged.setdefault(os.fsdecode(path), reason)
    for num, entries in by_record.items():
        if num not in seen:
            for path, _ in entries:
                rep.damaged.setdefault(os.fsdecode(path), f"record {num} is missing")
    index.close()
    return rep


def _check_record(rpath, num, uid, entries, index, rep) -> Iterator[tuple[bytes, str]]:
    name = os.path.basename(rpath)
    try:
        with open(rpath, "rb") as f:
            head = read_header(f)
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if size else b""
    except (DatasetError, OSError) as e:
        for path, _ in entries:
            yield path, f"{name}: {e}"
        return
    if str(head.dataset_uuid) != uid:
        rep.problems.append(f"{name}: belongs to dataset {head.dataset_uuid}")
    if head.group_offsets != index.records.get(num):
        rep.problems.append(f"{name}: group offsets differ between record and index")
    if size != head.size:
        rep.problems.append(f"{name}: {size} bytes on disk, header says {head.size}")
    offs = head.offsets_in_group()
    pos_by_path = {m.path: i for i, m in enumerate(head.images)}
    for path, e in entries:
        i = pos_by_path.get(path)
        if i is None or i != e.index:
            yield path, f"{name}: index entry does not match the record header"
            continue
        rep.images_checked += 1
        lengths = e.lengths()
        if (list(head.lengths[i, : e.scans]) != lengths
                or list(offs[i, : e.scans]) != list(e.offsets)
                or list(head.checksums[i, : e.scans]) != list(e.checksums)):
            yield path, f"{name}: index entry does not match the record header"
            continue
        for g in range(e.scans):
            start = head.group_offsets[g] + e.offsets[g]
            seg = mm[start : start + lengths[g]]
            rep.segments_checked += 1
            if len(seg) != lengths[g]:
                yield path, f"{name}: group {g + 1} truncated at offset {start}"
                break
            if segment_checksum(seg) != e.checksums[g]:
                yield path, f"{name}: checksum mismatch in group {g + 1} at offset {start}"
                break
    if isinstance(mm, mmap.mmap):
        mm.close()
