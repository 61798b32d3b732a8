"""The segment table: every image's segments in one flat array (docs/FORMAT.md, "Segment
table").  The fast lane reads it in C to serve a q-view file it has never seen straight
from its record (csrc/lane_cold.c), with no lock and no index lookup: an image's slot is
its record's first slot plus its index in the record.

It holds nothing the index does not: a mount derives it from the index in one cursor walk
(`derive`), so every dataset, whatever pcrfs built it, gets it."""
from __future__ import annotations

import struct

import numpy as np

from pcrfs.format.index import DIR_BIT, ENTRY, INDEX_BITS, IndexReader

MAGIC = b"PCRFSSEG"
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
    count = np.zeros(nrec, dtype=np.int64)
    np.maximum.at(count, rec, idx + 1)
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

    def __init__(self, index: IndexReader, table: np.ndarray, rename=None):
        t = parse(table)
        first = t["first"]
        n = t["images"]
        numbers = {p: o & (DIR_BIT - 1) for p, o in index.directory_ordinals().items()}
        self.dirs = {d: p for p, d in numbers.items()}
        self.first = first
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
        rows.sort()
        sl = np.array([r[0] for r in rows], dtype=np.int64)
        if len(np.unique(sl)) != len(sl):
            raise ValueError("two images of the index share a record slot")
        self.dir = np.full(n, NO_DIR, dtype="<u4")
        lengths = np.zeros(n, dtype="<u8")
        if len(sl):
            self.dir[sl] = [r[1] for r in rows]
            lengths[sl] = [len(r[2]) for r in rows]
        self.off = np.zeros(n + 1, dtype="<u8")
        np.cumsum(lengths, out=self.off[1:])
        blob = b"".join(r[2] for r in rows)
        self.blob = np.frombuffer(blob or b"\0", dtype=np.uint8)

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
        name = self.blob[int(self.off[s]) : int(self.off[s + 1])].tobytes()
        top = self.dirs[d]
        return top + b"/" + name if top else name


def slot_ordinals(table: np.ndarray) -> np.ndarray:
    """The node ordinal of every slot (format/index.py file_ordinal), in slot order."""
    t = parse(table)
    first = t["first"].astype(np.int64)
    counts = np.diff(first)
    rec = np.repeat(np.arange(len(counts), dtype=np.uint64), counts)
    idx = np.arange(int(first[-1]), dtype=np.uint64) - np.repeat(first[:-1], counts).astype(np.uint64)
    return rec << np.uint64(INDEX_BITS) | idx
