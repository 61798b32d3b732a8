"""The segment table: every image's segments in one flat array (docs/FORMAT.md, "Segment
table").  The fast lane reads it in C to serve a q-view file it has never seen straight
from its record (csrc/lane_cold.c), with no lock and no index lookup: an image's slot is
its record's first slot plus its index in the record.

It holds nothing the index does not: a mount derives it from the index in one cursor walk
(`derive`), so every dataset, whatever pcrfs built it, gets it."""
from __future__ import annotations

import os
import struct

import numpy as np

from pcrfs.errors import DatasetError
from pcrfs.format import SEGTAB
from pcrfs.format.index import DIR_BIT, ENTRY, INDEX_BITS, IndexReader

MAGIC = b"PCRFSSEG"
SPARSE, SLACK = 16, 1 << 16     # derive's bound on numbering gaps (slots per image or record)
VERSION = 1
HEADER = struct.Struct("<8sIIQQ32x")
assert HEADER.size == 64


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def derive(index: IndexReader, groups: int) -> np.ndarray:
    """The table of an index's images, as an 8-aligned uint8 array (the C side reads it in
    place).  Records the index does not list get no slots; an image whose entry has more
    segments than `groups` keeps the first `groups` (what every view serves of it).
    Entries are fixed-layout (format/index.py), so the walk only slices bytes and numpy
    does the rest: about a second per million images."""
    heads, tables = [], []
    with index.env.begin(buffers=True) as txn:
        for v in txn.cursor(index._db[b"images"]).iternext(keys=False, values=True):
            n = v[ENTRY.size - 1]
            heads.append(bytes(v[: ENTRY.size]))
            tables.append(bytes(v[ENTRY.size : ENTRY.size + 12 * min(n, groups)]))
    ent = np.frombuffer(b"".join(heads), dtype=_ENTRY_DT)
    rec = ent["record"].astype(np.int64)
    idx = ent["index"].astype(np.int64)
    nseg = np.minimum(ent["nseg"].astype(np.int64), groups)
    nrec = max(max(index.records, default=-1), int(rec.max(initial=-1))) + 1
    # an index is untrusted (docs/SECURITY.md): the table is sized by record numbers and
    # in-record indices, so a crafted entry at record 2^31-1 or index 2^24-1 asked for
    # gigabytes.  A build numbers both densely; far sparser is refused before allocating.
    if nrec > SPARSE * (len(index.records) + 1) + SLACK:
        raise DatasetError(f"index: record number {nrec - 1} for {len(index.records)} records "
                           "listed; the index is refused")
    count = np.zeros(nrec, dtype=np.int64)
    np.maximum.at(count, rec, idx + 1)
    if int(count.sum()) > SPARSE * len(heads) + SLACK:
        raise DatasetError(f"index: in-record indices up to {int(idx.max())} for {len(heads)} "
                           "images; the index is refused")
    first = np.zeros(nrec + 1, dtype="<u8")
    first[1:] = np.cumsum(count)
    n_img = int(first[-1])
    goff = np.zeros((nrec, groups + 1), dtype="<u8")
    for r, offs in index.records.items():
        m = min(len(offs), groups + 1)
        goff[r, :m] = offs[:m]
        goff[r, m:] = offs[-1]          # fewer groups: empty groups at the record's end
    size = (HEADER.size + 8 * (nrec + 1) + 8 * nrec * (groups + 1) + _pad8(n_img)
            + 12 * n_img * groups)
    buf = np.zeros(size + 8, dtype=np.uint8)
    start = (-buf.ctypes.data) % 8       # numpy aligns to 16 already; be sure anyway
    out = buf[start : start + size]
    out[: HEADER.size] = np.frombuffer(HEADER.pack(MAGIC, VERSION, groups, nrec, n_img),
                                       dtype=np.uint8)
    pos = HEADER.size
    out[pos : pos + first.nbytes] = first.view(np.uint8)
    pos += first.nbytes
    out[pos : pos + goff.nbytes] = goff.reshape(-1).view(np.uint8)
    pos += goff.nbytes
    scans = out[pos : pos + n_img]
    pos += _pad8(n_img)
    seg = out[pos:].view("<u4").reshape(n_img, groups, 3)
    slot = first[rec].astype(np.int64) + idx
    scans[slot] = nseg
    # every entry's (end, offset in group, checksum) rows, then scattered by slot and group
    rows = np.frombuffer(b"".join(tables), dtype="<u4").reshape(-1, 3)
    row_slot = np.repeat(slot, nseg)
    row_group = np.arange(len(rows)) - np.repeat(np.cumsum(nseg) - nseg, nseg)
    prev_end = np.where(row_group > 0, np.roll(rows[:, 0], 1), 0)
    seg[row_slot, row_group, 0] = rows[:, 1]
    seg[row_slot, row_group, 1] = rows[:, 0] - prev_end
    seg[row_slot, row_group, 2] = rows[:, 2]
    return out


_ENTRY_DT = np.dtype([("record", "<u4"), ("index", "<u4"), ("label", "<i4"), ("width", "<u2"),
                      ("height", "<u2"), ("comps", "u1"), ("flags", "u1"), ("nseg", "u1")])
assert _ENTRY_DT.itemsize == ENTRY.size


def parse(blob) -> dict:
    """Header fields and arrays of a table (tests and tools; the lane reads it in C)."""
    magic, version, groups, nrec, n_img = HEADER.unpack_from(blob, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a version-1 segment table")
    a = np.frombuffer(blob, dtype=np.uint8)
    pos = HEADER.size
    first = a[pos : pos + 8 * (nrec + 1)].view("<u8")
    pos += 8 * (nrec + 1)
    goff = a[pos : pos + 8 * nrec * (groups + 1)].view("<u8").reshape(nrec, groups + 1)
    pos += 8 * nrec * (groups + 1)
    scans = a[pos : pos + n_img]
    pos += _pad8(n_img)
    seg = a[pos : pos + 12 * n_img * groups].view("<u4").reshape(n_img, groups, 3)
    return {"groups": groups, "records": nrec, "images": n_img, "first": first,
            "group_offsets": goff, "scans": scans, "segments": seg}


def per_slot(table: np.ndarray, ordinals: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A uint64 array with values[i] at the slot of image ordinals[i], 0 elsewhere (and
    where an ordinal has no slot)."""
    t = parse(table)
    out = np.zeros(t["images"], dtype="<u8")
    rec = (ordinals >> INDEX_BITS).astype(np.int64)
    idx = (ordinals & ((1 << INDEX_BITS) - 1)).astype(np.int64)
    ok = rec < t["records"]
    first = t["first"].astype(np.int64)
    slot = first[rec[ok]] + idx[ok]
    inside = slot < first[rec[ok] + 1]
    out[slot[inside]] = values[ok][inside]
    return out


def raw_items(index: IndexReader, table: np.ndarray, stored: np.ndarray, pack_of,
              ppm_size) -> np.ndarray:
    """Per slot of `table`, where its PPM is in its record's raw pack: (offset, length,
    XXH3-64) as a (N, 3) uint64 array, zeros where no pack holds it.  stored(ordinals) says
    which images the packs were made to hold; pack_of(record) gives a record's pack head
    (format/rawpack.Pack, verified) or None; an item whose length is not the image's PPM
    size is left out, for Python to find damaged."""
    t = parse(table)
    out = np.zeros((t["images"], 3), dtype="<u8")
    first = t["first"]
    with index.env.begin(buffers=True) as txn:
        vals = [ENTRY.unpack_from(v, 0) for v in
                txn.cursor(index._db[b"images"]).iternext(keys=False, values=True)]
    if not vals:
        return out
    rec = np.array([v[0] for v in vals], dtype=np.uint64)
    idx = np.array([v[1] for v in vals], dtype=np.uint64)
    keep = np.flatnonzero(stored(rec << np.uint64(INDEX_BITS) | idx))
    for i in keep:
        record, index_in, _, w, h = vals[i][:5]
        pack = pack_of(record)
        item = pack.find(index_in) if pack is not None else None
        if item is not None and item[1] == ppm_size(w, h):
            out[int(first[record]) + index_in] = item
    return out


NO_DIR = 0xFFFFFFFF


class Names:
    """Every slot's file name and directory, for the lane's LOOKUP (csrc/lane_cold.c) and
    for Python to name a file the kernel looked up there: `dir` (uint32 per slot, NO_DIR
    where no image), `off` (uint64, N + 1) into `blob`, and `dirs`, directory number ->
    path.  The q views name files as the source tree does; rename(names of one
    directory's files) -> {name: view's name} gives another view's names (raw/'s)."""

    def __init__(self, dir: np.ndarray, off: np.ndarray, blob: np.ndarray,
                 dirs: dict[int, bytes], first: np.ndarray):
        self.dir, self.off, self.blob, self.dirs, self.first = dir, off, blob, dirs, first

    @staticmethod
    def directories(index: IndexReader) -> dict[bytes, int]:
        """directory path -> its number (the low bits of its ordinal)."""
        return {p: o & (DIR_BIT - 1) for p, o in index.directory_ordinals().items()}

    @classmethod
    def derive(cls, index: IndexReader, table: np.ndarray, rename=None) -> Names:
        """The names of the index's images, in one cursor walk: about 5 s per million."""
        t = parse(table)
        first = t["first"]
        n = t["images"]
        numbers = cls.directories(index)
        rows = []                   # (slot, directory, name)
        for path, record, i in index.image_places():
            cut = path.rfind(b"/")
            d = numbers.get(path[:cut] if cut >= 0 else b"")
            if d is not None and d < NO_DIR and record + 1 < len(first):
                rows.append((int(first[record]) + i, d, path[cut + 1:]))
        if rename is not None:
            by_dir: dict[int, list[int]] = {}
            for j, (_, d, _) in enumerate(rows):
                by_dir.setdefault(d, []).append(j)
            for js in by_dir.values():
                new = rename([rows[j][2] for j in js])
                for j in js:
                    rows[j] = (rows[j][0], rows[j][1], new[rows[j][2]])
        rows = [r for r in rows if 0 < len(r[2]) <= 255]   # longer: Python's to look up
        sl = np.array([r[0] for r in rows], dtype=np.int64)
        if len(np.unique(sl)) != len(sl):
            raise ValueError("two images of the index share a record slot")
        dir_ = np.full(n, NO_DIR, dtype="<u4")
        names = [b""] * n
        for slot, d, name in rows:
            dir_[slot] = d
            names[slot] = name
        return cls._packed(dir_, names, {d: p for p, d in numbers.items()}, first)

    @classmethod
    def _packed(cls, dir_: np.ndarray, names: list[bytes], dirs: dict[int, bytes],
                first: np.ndarray) -> Names:
        """Names from each slot's directory and name (b"" where none)."""
        off = np.zeros(len(names) + 1, dtype="<u8")
        np.cumsum(np.fromiter(map(len, names), dtype="<u8", count=len(names)), out=off[1:])
        blob = np.frombuffer(b"".join(names) or b"\0", dtype=np.uint8)
        return cls(dir_, off, blob, dirs, first)

    @classmethod
    def pick(cls, a: Names, b: Names, use_b) -> Names:
        """Per slot, b's name where use_b is set, else a's (mix/: the PPM's name or the
        source's).  a and b are names of one table."""
        use_b = np.asarray(use_b, dtype=bool)
        names = [(b if use_b[s] else a).name(s) for s in range(len(use_b))]
        return cls._packed(np.where(use_b, b.dir, a.dir).astype("<u4"), names, a.dirs, a.first)

    @property
    def nbytes(self) -> int:
        return self.dir.nbytes + self.off.nbytes + self.blob.nbytes

    def path(self, ordinal: int) -> bytes | None:
        """The path of the image with this node ordinal, or None if the table names none."""
        r, i = ordinal >> INDEX_BITS, ordinal & ((1 << INDEX_BITS) - 1)
        if r + 1 >= len(self.first) or i >= int(self.first[r + 1]) - int(self.first[r]):
            return None
        s = int(self.first[r]) + i
        d = int(self.dir[s])
        if d == NO_DIR:
            return None
        top, name = self.dirs[d], self.name(s)
        return top + b"/" + name if top else name

    def name(self, slot: int) -> bytes:
        """Slot's file name (b"" where none)."""
        return self.blob[int(self.off[slot]) : int(self.off[slot + 1])].tobytes()


# The table file (docs/FORMAT.md, "Segment table file"): `build` and `reindex` write the
# table and the q views' names beside the index, so a mount maps them instead of deriving
# them (about 9 s per million images).  It belongs to one index: its header carries the
# index's size and XXH3 as the manifest records them, and a mount uses it only if they
# match.  Everything a wrong byte could turn into another file's bytes (the header, record
# starts, group offsets, scan counts, names) is under a checksum checked at mount; the
# segment rows are not (a damaged row fails its segment's checksum, and Python reads it).
FILE = SEGTAB
FILE_MAGIC = b"PCRFSTAB"
FILE_VERSION = 1
FILE_HEADER = struct.Struct("<8sIIQQQQQQ")
assert FILE_HEADER.size == 64


def _index_sum(manifest: dict) -> tuple[int, int] | None:
    """(bytes, XXH3) of the index as the manifest records it."""
    f = manifest.get("files", {}).get("index.lmdb/data.mdb")
    try:
        return int(f["bytes"]), int(f["xxh3"], 16)
    except (TypeError, KeyError, ValueError):
        return None


def _seg_start(table) -> int:
    """Where the segment rows start: the table bytes before them are checksummed."""
    _, _, groups, nrec, n_img = HEADER.unpack_from(table, 0)
    return HEADER.size + 8 * (nrec + 1) + 8 * nrec * (groups + 1) + _pad8(n_img)


def write_file(root: str, index: IndexReader, groups: int, manifest: dict) -> str | None:
    """Write root/index.segtab for this index (tmp, fsync, rename); its path, or None if the
    manifest records no index sum to tie it to."""
    import xxhash

    from pcrfs.format.atomic import atomic_write, fsync_dir
    key = _index_sum(manifest)
    if key is None:
        return None
    table = derive(index, groups)
    names = Names.derive(index, table) if index.numbered else None
    n = parse(table)["images"]
    parts = [table.tobytes(), b"\0" * (_pad8(len(table)) - len(table))]
    if names is not None:
        parts += [names.dir.tobytes(), b"\0" * (_pad8(4 * n) - 4 * n), names.off.tobytes(),
                  names.blob.tobytes()]
    h = xxhash.xxh3_64()
    h.update(memoryview(table)[: _seg_start(table)])
    for part in parts[2:]:
        h.update(part)
    head = FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 1 if names is not None else 0, key[0],
                            key[1], len(table), n, len(names.blob) if names is not None else 0,
                            h.intdigest())
    path = os.path.join(root, FILE)
    with atomic_write(path) as f:
        f.write(head)
        for part in parts:
            f.write(part)
    fsync_dir(root)
    return path


def write_for(root: str, manifest: dict) -> str | None:
    """write_file for the dataset at root (its index opened here)."""
    from pcrfs.format import INDEX_DIR
    index = IndexReader(os.path.join(root, INDEX_DIR))
    try:
        return write_file(root, index, int(manifest["groups"]), manifest)
    finally:
        index.close()


def load_file(root: str, index: IndexReader, manifest: dict):
    """(table, names or None) mapped from root/index.segtab, or (None, why not)."""
    import mmap

    import xxhash
    path = os.path.join(root, FILE)
    try:
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    except FileNotFoundError:
        return None, "no table file"
    except (OSError, ValueError) as e:
        return None, f"{FILE}: {e}"
    size = len(m)
    if size < 64:
        return None, f"{FILE}: truncated"
    magic, version, flags, ibytes, ixxh, tlen, n, blen, want = FILE_HEADER.unpack_from(m, 0)
    if magic != FILE_MAGIC or version != FILE_VERSION:
        return None, f"{FILE}: not a version-{FILE_VERSION} table file"
    if (ibytes, ixxh) != _index_sum(manifest):
        return None, f"{FILE}: made for another index"
    named = flags & 1
    need = 64 + _pad8(tlen) + (_pad8(4 * n) + 8 * (n + 1) + blen if named else 0)
    if need != size or tlen < HEADER.size:
        return None, f"{FILE}: its sizes disagree with its length"
    a = np.frombuffer(m, dtype=np.uint8)
    table = a[64 : 64 + tlen]
    try:
        if parse(table)["images"] != n:
            return None, f"{FILE}: its sizes disagree with its length"
        start = _seg_start(table)
    except (ValueError, struct.error):
        return None, f"{FILE}: not a version-{VERSION} segment table"
    if start > tlen:
        return None, f"{FILE}: its sizes disagree with its length"
    h = xxhash.xxh3_64()
    h.update(table[:start])
    h.update(a[64 + _pad8(tlen) :])
    if h.intdigest() != want:
        return None, f"{FILE}: damaged (checksum)"
    if not named:
        return table, None
    pos = 64 + _pad8(tlen)
    dir_ = a[pos : pos + 4 * n].view("<u4")
    pos += _pad8(4 * n)
    off = a[pos : pos + 8 * (n + 1)].view("<u8")
    blob = a[pos + 8 * (n + 1) :]
    dirs = {d: p for p, d in Names.directories(index).items()}
    return table, Names(dir_, off, blob if len(blob) else np.zeros(1, np.uint8), dirs,
                        parse(table)["first"])


def slot_ordinals(table: np.ndarray) -> np.ndarray:
    """The node ordinal of every slot (format/index.py file_ordinal), in slot order."""
    t = parse(table)
    first = t["first"].astype(np.int64)
    counts = np.diff(first)
    rec = np.repeat(np.arange(len(counts), dtype=np.uint64), counts)
    idx = np.arange(int(first[-1]), dtype=np.uint64) - np.repeat(first[:-1], counts).astype(np.uint64)
    return rec << np.uint64(INDEX_BITS) | idx
