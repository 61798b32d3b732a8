"""`pcrfs verify`: every byte of a dataset that carries meaning.

- manifest.json: its own checksum, and the size and XXH3-64 of the metadata files it
  lists (the LMDB index, the build report);
- the index: every entry against its record's header, every directory listing against
  the set of image paths;
- records: header checksum, size, and every segment checksum;
- l3 sidecars: checksum, owner, count, and each item's size against the index.  A damaged
  sidecar is narrowed down to the items that are wrong (by transcoding that record's
  images), since at mount a damaged item costs only its own image;
- quality.json, if present: its own checksum;
- raw.json and the raw packs (`pcrfs materialize`), item by item.
Files it does not know are listed as notes (they cannot break a mount)."""
from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import xxhash

from pcrfs.builder.indexer import add_to_tree, record_paths
from pcrfs.errors import DatasetError
from pcrfs.format import (
    BUILD_REPORT,
    EOI,
    INDEX_DIR,
    MANIFEST,
    QUALITY,
    RAW_DIR,
    RAW_SUMMARY,
    RECORDS_DIR,
    TUNED,
    segtab,
    sidecar_path,
)
from pcrfs.format.checksum import block_checksum, segment_checksum
from pcrfs.format.index import IndexReader
from pcrfs.format.l3meta import l3meta_intact, parse_l3meta
from pcrfs.format.manifest import SUMMED_FILES, check_self_sum, file_sum, read_manifest
from pcrfs.format.names import open_regular, path_problem
from pcrfs.format.record import read_header
from pcrfs.liquid.rules import read_summary

# files a dataset may hold besides records/: checked, or (lock.mdb of older builds)
# known to carry no data
KNOWN = {MANIFEST, BUILD_REPORT, QUALITY, f"{INDEX_DIR}/data.mdb", f"{INDEX_DIR}/lock.mdb",
         RAW_SUMMARY, TUNED, segtab.FILE}


@dataclass
class VerifyReport:
    images_checked: int = 0
    segments_checked: int = 0
    damaged: dict[str, str] = field(default_factory=dict)   # image path -> reason
    problems: list[str] = field(default_factory=list)       # dataset-level problems
    notes: list[str] = field(default_factory=list)          # not failures
    files_checked: dict[str, int] = field(default_factory=dict)   # kind -> files

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.problems

    def checked(self, kind: str) -> None:
        self.files_checked[kind] = self.files_checked.get(kind, 0) + 1


def verify(root: str) -> VerifyReport:
    rep = VerifyReport()
    try:
        manifest = read_manifest(root)
    except DatasetError as e:
        rep.problems.append(str(e))
        return rep
    rep.checked(MANIFEST)
    if "xxh3" not in manifest:
        rep.notes.append("manifest has no checksums (built by an older pcrfs): the index and "
                         "build report are checked for consistency only")
    _check_listed_files(root, manifest, rep)
    _check_quality(root, rep)
    _unknown_files(root, rep)
    if any(p.startswith(INDEX_DIR) for p in rep.problems):
        return rep      # a damaged index is not mapped: LMDB can die of it (SIGBUS)
    try:
        index = IndexReader(os.path.join(root, INDEX_DIR))
    except (DatasetError, OSError) as e:
        rep.problems.append(f"index unreadable: {e}")
        return rep
    try:
        if (bad := index.unsafe_name()) is not None:
            rep.problems.append(f"the index names {bad}: mounts and export refuse it")
        _check_dataset(root, manifest, index, rep)
        _check_segtab(root, manifest, index, rep)
    except (DatasetError, ValueError, IndexError, KeyError, struct.error, MemoryError) as e:
        # a crafted index: a finding, never a traceback (what a mount would say of it)
        rep.problems.append(f"index: {e} ({type(e).__name__}; verify stopped there)")
    finally:
        index.close()
    return rep


def verify_remote(url: str, opts=None, tmp_dir: str | None = None,
                  progress: bool = False) -> VerifyReport:
    """A dataset in object storage, checked as it is stored: every object is downloaded
    (ranged GETs, each retried on its own) into a temporary directory and verified there,
    so a byte damaged in the store, or a missing or cut-short object, is found exactly
    as it would be locally.  Only objects under the prefix are read; a push marker is a
    note, not a problem."""
    import shutil
    import tempfile

    from tqdm import tqdm

    from pcrfs.admin.push import PUSH_MARKER
    from pcrfs.storage.objclient import ObjectClient, RemoteError
    client = ObjectClient(url, opts)
    tmp = tempfile.mkdtemp(prefix="pcrfs-verify-", dir=tmp_dir)
    try:
        try:
            objects = [(k, n) for k, n in client.list() if k != PUSH_MARKER]
        except RemoteError as e:
            rep = VerifyReport()
            rep.problems.append(str(e))
            return rep
        bar = tqdm(total=sum(n for _, n in objects), unit="B", unit_scale=True,
                   desc="download", disable=not progress)
        with bar:
            for key, _ in objects:
                path = os.path.join(tmp, *key.split("/"))
                if os.path.relpath(path, tmp).startswith(".."):
                    continue       # a hostile key cannot write outside the directory
                os.makedirs(os.path.dirname(path), exist_ok=True)
                bar.update(client.download(key, path))
        return verify(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_listed_files(root: str, manifest: dict, rep: VerifyReport) -> None:
    files = manifest.get("files", {})
    for rel in SUMMED_FILES:
        if rel not in files:
            continue
        path = os.path.join(root, rel)
        try:
            got = file_sum(path)
        except OSError as e:
            rep.problems.append(f"{rel}: unreadable: {e.strerror}")
            continue
        rep.checked(rel.rsplit("/", 1)[-1])
        if got != files[rel]:
            rep.problems.append(f"{rel}: {got['bytes']} bytes, XXH3 {got['xxh3']}; the manifest "
                                f"recorded {files[rel]['bytes']}, {files[rel]['xxh3']}"
                                + ("; run `pcrfs reindex`" if rel.startswith(INDEX_DIR) else ""))


def _check_quality(root: str, rep: VerifyReport) -> None:
    path = os.path.join(root, QUALITY)
    if not os.path.exists(path):
        return
    rep.checked(QUALITY)
    try:
        with open(path) as f:
            q = json.load(f)
        if "xxh3" not in q:
            rep.notes.append(f"{QUALITY} has no checksum (written by an older pcrfs)")
        check_self_sum(q, QUALITY)
    except (OSError, ValueError, DatasetError) as e:
        rep.problems.append(f"{QUALITY}: {e} (delete it; `pcrfs info --quality` remakes it)")


def _check_segtab(root: str, manifest: dict, index: IndexReader, rep: VerifyReport) -> None:
    """index.segtab, if present, is exactly what this index derives (format/segtab.py).
    Mounts would ignore a damaged or stale one; verify says so all the same."""
    if not os.path.exists(os.path.join(root, segtab.FILE)):
        return
    rep.checked(segtab.FILE)
    fix = " (mounts ignore it and derive the table; `pcrfs reindex` writes a new one)"
    table, names = segtab.load_file(root, index, manifest)
    if table is None:
        rep.problems.append(names + fix)
        return
    fresh = segtab.derive(index, int(manifest["groups"]))
    same = table.tobytes() == fresh.tobytes()
    if same and names is not None and index.numbered:
        want = segtab.Names.derive(index, fresh)
        same = all(np.array_equal(getattr(names, a), getattr(want, a))
                   for a in ("dir", "off", "blob"))
    if not same:
        rep.problems.append(f"{segtab.FILE}: does not match the index" + fix)


def _unknown_files(root: str, rep: VerifyReport) -> None:
    for d, _, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root)
            if rel in KNOWN or (os.path.dirname(rel) == RECORDS_DIR
                                and f.startswith("r") and f.endswith((".pcr", ".l3m"))) \
                    or (os.path.dirname(rel) == "raw" and f.startswith("r") and f.endswith(".ppk")):
                continue
            rep.notes.append(f"{rel}: not part of a pcrfs dataset (not checked)")


def _check_dataset(root: str, manifest: dict, index: IndexReader, rep: VerifyReport) -> None:
    uid = manifest["uuid"]
    if index.meta.get("uuid") != uid:
        rep.problems.append(f"index uuid {index.meta.get('uuid')} != manifest uuid {uid}")
    by_record: dict[int, list[tuple[bytes, object]]] = {}
    paths = []
    unsafe = None
    for path, e in index.iter_images():
        by_record.setdefault(e.record, []).append((path, e))
        paths.append(path)
        if unsafe is None and (why := path_problem(path)) is not None:
            unsafe = f"unsafe image path {path[:300]!r} ({why}): mounts and export refuse it"
    if unsafe:
        rep.problems.append(unsafe)
    if len(paths) != manifest["images"]:
        rep.problems.append("index image count differs from the manifest")
    _check_listings(index, paths, rep)
    l3 = "l3" in index.meta.get("format_views", [])
    seen = set()
    for rpath in record_paths(root):
        num = int(os.path.basename(rpath)[1:7])
        seen.add(num)
        entries = by_record.get(num, [])
        for path, reason in _check_record(rpath, num, uid, entries, index, rep, l3):
            rep.damaged.setdefault(os.fsdecode(path), reason)
    for num, entries in by_record.items():
        if num not in seen:
            for path, _ in entries:
                rep.damaged.setdefault(os.fsdecode(path), f"record {num} is missing")
    _check_raw(root, uid, by_record, rep)


def _check_raw(root: str, uid: str, by_record: dict, rep: VerifyReport) -> None:
    """raw.json (pcrfs materialize) and every pack it lists: size and XXH3 of the file,
    the head's own checksum, each item against its checksum and its image's PPM size,
    and the items against the raw rule at the stated share."""
    import uuid as uuidlib

    import numpy as np

    from pcrfs.format.rawpack import count_of, decode, head_size, pack_key
    from pcrfs.liquid.rules import ppm_size, raw_ranks
    try:
        summary = read_summary(root)
    except DatasetError as e:
        rep.problems.append(str(e))
        return
    if summary is None:
        if os.path.isdir(os.path.join(root, RAW_DIR)):
            rep.notes.append(f"{RAW_DIR}/ without {RAW_SUMMARY}: an unfinished `pcrfs materialize`"
                             " (mounts decode raw files instead; run it again to finish)")
        return
    rep.checked(RAW_SUMMARY)
    if summary.get("uuid") != uid:
        rep.problems.append(f"{RAW_SUMMARY} belongs to dataset {summary.get('uuid')}")
        return
    share, files = float(summary["fraction"]), summary.get("files", {})
    for num, entries in sorted(by_record.items()):
        ords = np.array([e.ordinal for _, e in entries], dtype=np.uint64)
        want = {e.index: (p, e) for (p, e), r in zip(entries, raw_ranks(ords) < share, strict=False) if r}
        key = pack_key(num)
        if not want:
            continue
        try:
            with os.fdopen(open_regular(os.path.join(root, *key.split("/"))), "rb") as f:
                data = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if os.fstat(f.fileno()).st_size \
                    else b""
        except OSError:
            for p, _ in want.values():
                rep.damaged.setdefault(os.fsdecode(p), f"{key} is missing")
            continue
        rep.checked("ppk")
        got = {"bytes": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}   # file_sum's form
        if files.get(key) != got:
            rep.problems.append(f"{key}: {got['bytes']} bytes, XXH3 {got['xxh3']}; "
                                f"{RAW_SUMMARY} recorded {files.get(key)}")
        try:
            pack = decode(data[: head_size(count_of(data, key))], key, uuidlib.UUID(uid), num)
        except DatasetError as e:
            for p, _ in want.values():
                rep.damaged.setdefault(os.fsdecode(p), f"raw: {e}")
            continue
        for index, (p, e) in want.items():
            found = pack.find(index)
            if found is None:
                rep.damaged.setdefault(os.fsdecode(p), f"raw: not in {key}")
                continue
            off, n, xxh = found
            item = data[off : off + n]
            rep.images_checked += 1
            if len(item) != ppm_size(e.width, e.height) or block_checksum(item) != xxh:
                rep.damaged.setdefault(os.fsdecode(p), f"raw: item {index} of {key} is damaged")


def _check_listings(index: IndexReader, paths: list[bytes], rep: VerifyReport) -> None:
    """Every directory listing equals what the image paths imply."""
    want: dict[bytes, set[tuple[bytes, bool]]] = {b"": set()}
    for p in paths:
        add_to_tree(want, p)
    for d, children in want.items():
        try:
            got = index.listdir(d)
        except ValueError as e:
            rep.problems.append(f"index listing of '{os.fsdecode(d)}': {e}")
            continue
        bad = next(((n, why) for n, _ in got or () if (why := path_problem(n) or (
            "a '/'" if b"/" in n else None))), None)
        if bad:
            rep.problems.append(f"index listing of '{os.fsdecode(d)}' names {bad[0][:300]!r} "
                                f"({bad[1]})")
        if got is None:
            rep.problems.append(f"index has no listing of '{os.fsdecode(d)}'")
        elif not children <= set(got):
            rep.problems.append(f"index listing of '{os.fsdecode(d)}' misses entries")
        else:   # class directories may be empty: extra directories are fine, files not
            extra = [n for n, is_dir in set(got) - children if not is_dir]
            if extra:
                rep.problems.append(f"index listing of '{os.fsdecode(d)}' names files that "
                                    f"have no entry: {extra[:3]}")


def _check_record(rpath, num, uid, entries, index, rep, l3) -> Iterator[tuple[bytes, str]]:
    name = os.path.basename(rpath)
    try:
        with os.fdopen(open_regular(rpath), "rb") as f:
            head = read_header(f)
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if size else b""
    except (DatasetError, OSError) as e:
        for path, _ in entries:
            yield path, f"{name}: {e}"
        return
    rep.checked("pcr")
    try:
        if str(head.dataset_uuid) != uid:
            rep.problems.append(f"{name}: belongs to dataset {head.dataset_uuid}")
        if head.group_offsets != index.records.get(num):
            rep.problems.append(f"{name}: group offsets differ between record and index")
        if size != head.size:
            rep.problems.append(f"{name}: {size} bytes on disk, header says {head.size}")
        offs = head.offsets_in_group()
        pos_by_path = {m.path: i for i, m in enumerate(head.images)}
        sound = []
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
            bad = _check_segments(mm, head, e, lengths, name, rep)
            if bad:
                yield path, bad
            else:
                sound.append((path, e))
        if l3:
            yield from _check_sidecar(rpath, num, uid, head, entries, sound, mm, rep)
    finally:
        if isinstance(mm, mmap.mmap):
            mm.close()


def _check_segments(mm, head, e, lengths, name, rep) -> str | None:
    for g in range(e.scans):
        start = head.group_offsets[g] + e.offsets[g]
        seg = mm[start : start + lengths[g]]
        rep.segments_checked += 1
        if len(seg) != lengths[g]:
            return f"{name}: group {g + 1} truncated at offset {start}"
        if segment_checksum(seg) != e.checksums[g]:
            return f"{name}: checksum mismatch in group {g + 1} at offset {start}"
    return None


def _check_sidecar(rpath, num, uid, head, entries, sound, mm, rep):
    import uuid as uuidlib
    spath = sidecar_path(rpath)
    sname = os.path.basename(spath)
    try:
        with open(spath, "rb") as f:
            data = f.read()
        items = parse_l3meta(data, sname, num, uuidlib.UUID(uid), head.count, strict=False)
    except FileNotFoundError:
        for path, _ in entries:
            yield path, f"{sname} is missing (l3 view)"
        return
    except (OSError, DatasetError) as e:
        for path, _ in entries:
            yield path, f"{sname}: {e} (l3 view)"
        return
    rep.checked("l3m")
    intact = l3meta_intact(data)
    for path, e in entries:
        if e.l3_size is not None and int(items[e.index]["size"]) != e.l3_size:
            yield path, f"{sname}: item {e.index} size differs from the index (l3 view)"
    if intact:
        return
    # the whole-file checksum fails: find the items that are wrong by recomputing them
    from pcrfs.views.l3 import l3_bytes
    found = False
    for path, e in sound:
        jpeg = b"".join(mm[head.group_offsets[g] + e.offsets[g]:
                           head.group_offsets[g] + e.offsets[g] + n]
                        for g, n in enumerate(e.lengths())) + EOI
        want = l3_bytes(jpeg)
        item = items[e.index]
        if int(item["size"]) != len(want) or int(item["xxh"]) != block_checksum(want):
            found = True
            yield path, f"{sname}: item {e.index} is damaged (l3 view)"
    if not found:
        rep.problems.append(f"{sname}: fails its checksum, but every item is right "
                            "(the damage is in the checksum itself)")
