"""The LMDB index: path -> image entry, directory listings, record table, class map.

Every lookup is a single B-tree get; nothing scans.  Entries are fixed-layout structs so
that decoding one is a couple of numpy views (see docs/FORMAT.md, "Index")."""
from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import lmdb
import numpy as np

from pcrfs.errors import CorruptDataError, DatasetError

DBS = (b"meta", b"images", b"dirs", b"records")
L3 = struct.Struct("<I")   # optional entry trailer: l3 view file size (checksum: .l3m sidecar)
ENTRY_HAS_L3 = 0x80        # entry flag bit: the L3 trailer follows the scan table
# Node ordinals (the low 56 bits of an inode, fs/inodes.py), unique by construction and
# fixed by the records alone, so stable across remounts, rebuilds and `reindex`:
# an image is record << 24 | index in record (both in its entry: no extra index bytes);
# a directory is DIR_BIT | its number in a breadth-first walk of the tree, stored in
# front of its listing together with its first subdirectory's number (subdirectories of
# one directory are numbered consecutively) and its files' ordinals in listing order as
# runs of consecutive numbers (a sorted build: a run per record the directory spans), so
# a listing without attributes needs no entry read.  Where runs would not be compact
# (a shuffled build) none are stored and a listing walks the entries instead.
INDEX_BITS = 24
RECORD_BITS = 31
DIR_BIT = 1 << (INDEX_BITS + RECORD_BITS)
DIR_HEAD = struct.Struct("<QQI")  # listing prefix: own ordinal, first subdirectory's, runs
RUN = struct.Struct("<QI")        # first ordinal, count
NO_RUNS = 0xFFFFFFFF
ORDINALS = "inodes"        # meta key; its value names the numbering scheme
ORDINAL_SCHEME = "record-index/bfs-dirs/runs-v2"
RECIDX = struct.Struct("<II")


def file_ordinal(record: int, index: int) -> int:
    return record << INDEX_BITS | index
ENTRY = struct.Struct("<IIiHHBBB")  # record, index, label, width, height, comps, flags, nseg
MAX_KEY = 400  # LMDB's default key limit is 511; longer paths are hashed
LONG_KEY_PREFIX = b"\x00#"
MAP_SIZE = 1 << 40  # address space only; the file grows as written


def image_key(path: bytes) -> bytes:
    if len(path) <= MAX_KEY:
        return path
    return LONG_KEY_PREFIX + hashlib.blake2b(path, digest_size=24).digest()


def dir_key(path: bytes) -> bytes:
    return b"/" + path


@dataclass(frozen=True, slots=True)
class ImageEntry:
    """Everything the read path needs for one image, decoded from one LMDB value."""
    record: int
    index: int
    label: int
    width: int
    height: int
    components: int
    flags: int
    ends: tuple[int, ...]      # cumulative segment bytes: ends[k-1] + 2 = size at qk
    offsets: tuple[int, ...]   # offset of segment g from the start of group g
    checksums: tuple[int, ...]
    path: bytes | None = None  # stored only for hashed (very long) keys
    l3_size: int | None = None  # bytes of the image's l3 view file

    @property
    def ordinal(self) -> int:
        """Node number, unique in the dataset (see DIR_BIT)."""
        return self.record << INDEX_BITS | self.index

    @property
    def scans(self) -> int:
        return len(self.ends)

    def size_at(self, k: int) -> int:
        """Bytes of the JPEG at fidelity k: segments 1..min(k, scans) plus EOI."""
        return self.ends[min(k, len(self.ends)) - 1] + 2

    def lengths(self) -> list[int]:
        return [b - a for a, b in zip((0,) + self.ends[:-1], self.ends, strict=True)]


def pack_entry(record: int, index: int, label: int, width: int, height: int, comps: int,
               flags: int, lengths: Iterable[int], offsets: Iterable[int],
               checksums: Iterable[int], long_path: bytes | None = None,
               l3_size: int | None = None) -> bytes:
    lengths = [int(x) for x in lengths]
    table = np.empty((len(lengths), 3), dtype="<u4")
    table[:, 0] = np.cumsum(lengths)
    table[:, 1] = list(offsets)
    table[:, 2] = list(checksums)
    return pack_entry_table(record, index, label, width, height, comps, flags, table,
                            long_path, l3_size)


def pack_entry_table(record: int, index: int, label: int, width: int, height: int,
                     comps: int, flags: int, table: np.ndarray, long_path: bytes | None = None,
                     l3_size: int | None = None) -> bytes:
    """pack_entry from its (scans, 3) little-endian uint32 table: segment ends, offsets
    in group, checksums."""
    if l3_size is not None:
        flags |= ENTRY_HAS_L3
    out = ENTRY.pack(record, index, label, min(width, 65535), min(height, 65535), comps, flags,
                     len(table)) + table.tobytes()
    if l3_size is not None:
        out += L3.pack(l3_size)
    return out + long_path if long_path is not None else out


def unpack_entry(value: bytes, hashed: bool = False) -> ImageEntry:
    """CorruptDataError (that image's EIO) for an entry whose lengths do not hold: an
    index is untrusted input (the index fuzzer, tests/reliability/index_fuzz.py)."""
    if len(value) < ENTRY.size:
        raise CorruptDataError(f"index entry of {len(value)} bytes is truncated")
    record, index, label, w, h, comps, flags, n = ENTRY.unpack_from(value, 0)
    end = ENTRY.size + 12 * n + (L3.size if flags & ENTRY_HAS_L3 else 0)
    if n == 0 or len(value) < end:
        raise CorruptDataError(f"index entry of record {record} image {index}: {n} scans "
                               f"in {len(value)} bytes")
    end = ENTRY.size + 12 * n
    table = np.frombuffer(value, "<u4", 3 * n, ENTRY.size).reshape(n, 3)
    l3 = None
    if flags & ENTRY_HAS_L3:
        l3 = L3.unpack_from(value, end)[0]
        end += L3.size
    return ImageEntry(record, index, label, w, h, comps, flags & ~ENTRY_HAS_L3,
                      tuple(table[:, 0].tolist()), tuple(table[:, 1].tolist()),
                      tuple(table[:, 2].tolist()), bytes(value[end:]) if hashed else None, l3)


def file_runs(ordinals: list[int]) -> list[tuple[int, int]] | None:
    """A directory's file ordinals (listing order) as (first, count) runs, or None where
    that would take more than a quarter of what storing them one by one would."""
    runs: list[list[int]] = []
    for o in ordinals:
        if runs and runs[-1][0] + runs[-1][1] == o:
            runs[-1][1] += 1
        else:
            runs.append([o, 1])
            if len(runs) > max(4, len(ordinals) // 4):
                return None
    return [(a, n) for a, n in runs]


def dir_ordinals(listings: dict[bytes, list[tuple[bytes, bool]]]) -> dict[bytes, tuple[int, int]]:
    """directory -> (its ordinal, its first subdirectory's): the top is DIR_BIT | 0, then
    directories breadth first, each one's subdirectories consecutively in listing order.
    Depends only on the set of paths."""
    own = {b"": DIR_BIT}
    out: dict[bytes, tuple[int, int]] = {}
    queue, nxt, i = [b""], DIR_BIT + 1, 0
    while i < len(queue):
        d = queue[i]
        i += 1
        out[d] = (own[d], nxt)
        prefix = d + b"/" if d else b""
        for name, is_dir in sorted(listings.get(d, ())):
            if is_dir:
                p = prefix + name
                own[p] = nxt
                nxt += 1
                queue.append(p)
    return out


def pack_listing(children: Iterable[tuple[bytes, bool]]) -> bytes:
    parts = []
    for name, is_dir in sorted(children):
        parts.append(struct.pack("<BH", 1 if is_dir else 0, len(name)) + name)
    return b"".join(parts)


def unpack_listing(buf: bytes) -> list[tuple[bytes, bool]]:
    out, pos, end = [], 0, len(buf)
    append = out.append
    try:
        while pos < end:   # a readdir of a big directory waits on this loop: bare ints
            start = pos + 3
            pos = start + (buf[pos + 1] | buf[pos + 2] << 8)
            append((buf[start:pos], buf[start - 3] != 0))
    except IndexError:
        pos = -1
    if pos != end:
        raise ValueError("directory listing in the index is truncated")
    return out


def write_index(path: str, meta: dict, entries: Iterable[tuple[bytes, bytes]],
                listings: dict[bytes, list[tuple[bytes, bool]]],
                records: dict[int, list[int]],
                dir_heads: dict[bytes, tuple[int, int, list | None]] | None = None) -> None:
    """Write a fresh, compact index at `path` (must not exist).

    entries: (relative path, packed entry) in any order; they are sorted so LMDB fills
    its pages densely (sequential appends split pages at the end, not the middle)."""
    tmp = path + ".tmp"
    _rmtree(tmp)
    env = lmdb.open(tmp, map_size=MAP_SIZE, max_dbs=len(DBS), subdir=True, sync=False)
    dbs = {name: env.open_db(name) for name in DBS}
    keyed = sorted((image_key(p), v + (p if len(p) > MAX_KEY else b"")) for p, v in entries)
    with env.begin(write=True) as txn:
        for name, value in meta.items():
            txn.put(name.encode(), json.dumps(value).encode(), db=dbs[b"meta"])
        cur = txn.cursor(dbs[b"images"])
        for k, v in keyed:
            if not cur.put(k, v, append=True, overwrite=False):
                raise DatasetError(f"duplicate image path in index: {k!r}")
        for d in sorted(listings):
            head = b""
            if dir_heads is not None:
                own, sub, runs = dir_heads[d]
                head = DIR_HEAD.pack(own, sub, NO_RUNS if runs is None else len(runs)) + b"".join(
                    RUN.pack(a, n) for a, n in runs or ())
            txn.put(dir_key(d), head + pack_listing(listings[d]), db=dbs[b"dirs"], append=True)
        for rec in sorted(records):
            txn.put(struct.pack(">I", rec), struct.pack(f"<{len(records[rec])}Q", *records[rec]),
                    db=dbs[b"records"], append=True)

    env.sync(True)
    env.close()
    # readers open the index read-only without locking: the lock file is writer state
    # only, and a dataset should hold nothing that verify cannot vouch for
    try:
        os.unlink(os.path.join(tmp, "lock.mdb"))
    except FileNotFoundError:
        pass
    os.rename(tmp, path)


def _rmtree(p: str) -> None:
    import shutil
    shutil.rmtree(p, ignore_errors=True)


_ENVS: dict[tuple[int, int], list] = {}  # (st_dev, st_ino) -> [env, users]
_ENVS_LOCK = threading.Lock()
# Readers collected while the lock was taken: the garbage collector can run a reader's
# __del__ inside _open_env (lmdb.open allocates) on the thread that holds the lock, where
# waiting for it would never end.  Their releases wait here for the next holder.
_DEFERRED: list = []


def _release(key) -> None:
    slot = _ENVS.get(key)
    if slot is not None:
        slot[1] -= 1
        if slot[1] == 0:
            del _ENVS[key]
            slot[0].close()


def _drain() -> None:
    while _DEFERRED:
        _release(_DEFERRED.pop())


def _open_env(path: str) -> tuple[lmdb.Environment, tuple[int, int]]:
    """LMDB allows one handle per environment and process: share it between readers."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino)
    with _ENVS_LOCK:
        _drain()
        slot = _ENVS.get(key)
        if slot is None:
            env = lmdb.open(path, readonly=True, lock=False, max_dbs=len(DBS), subdir=True,
                            readahead=False, max_readers=512)
            slot = _ENVS[key] = [env, 0]
        slot[1] += 1
        return slot[0], key


def _close_env(key, wait: bool = True) -> None:
    if not _ENVS_LOCK.acquire(blocking=wait):
        _DEFERRED.append(key)      # atomic under the GIL
        return
    try:
        _drain()
        _release(key)
    finally:
        _ENVS_LOCK.release()


class IndexReader:
    """Read-only view of index.lmdb, safe to share between threads."""

    _closed = True   # until the environment is open (a failed __init__ has nothing to close)

    def __init__(self, path: str):
        if not os.path.isdir(path):
            raise DatasetError(f"index missing: {path}")
        self.path = path
        self.env, self._key = _open_env(path)
        self._closed = False
        self._db = {name: self.env.open_db(name, create=False) for name in DBS}
        self.meta = {}
        with self.env.begin() as txn:
            for k, v in txn.cursor(self._db[b"meta"]):
                self.meta[bytes(k).decode()] = json.loads(bytes(v))
            self.records: dict[int, list[int]] = {}
            for k, v in txn.cursor(self._db[b"records"]):
                self.records[struct.unpack(">I", k)[0]] = list(
                    struct.unpack(f"<{len(v) // 8}Q", v))
        self.numbered = self.meta.get(ORDINALS) == ORDINAL_SCHEME

    def lookup(self, path: bytes) -> ImageEntry | None:
        key = image_key(path)
        with self.env.begin(buffers=True) as txn:
            v = txn.get(key, db=self._db[b"images"])
            if v is None:
                return None
            entry = unpack_entry(v, hashed=key is not path)
        if entry.path is not None and entry.path != path:
            return None
        return entry

    def files_in_dir(self, path: bytes, k: int | None) -> dict[bytes, tuple[int, int | None]]:
        """source file name -> (node ordinal, bytes at qk, or of the l3 file if k is None),
        for the files directly in `path`: one ordered walk."""
        unpack, size_at, base = RECIDX.unpack_from, struct.Struct("<I").unpack_from, ENTRY.size

        def value(v):
            r, i = unpack(v, 0)
            n = v[base - 1]
            if k is not None:
                size = size_at(v, base + 12 * (min(k, n) - 1))[0] + 2
            elif v[base - 2] & ENTRY_HAS_L3:
                size = size_at(v, base + 12 * n)[0]
            else:
                size = None
            return r << INDEX_BITS | i, size
        return self._walk_dir(b"images", path, value)

    def dims_in_dir(self, path: bytes, k: int) -> dict[bytes, tuple[int, int, int, int]]:
        """source file name -> (node ordinal, bytes at qk, width, height) for the files
        directly in `path` (what the raw and mix views list)."""
        def value(v):
            r, i, _, w, h, _, _, n = ENTRY.unpack_from(v, 0)
            size = struct.unpack_from("<I", v, ENTRY.size + 12 * (min(k, n) - 1))[0] + 2
            return r << INDEX_BITS | i, size, w, h
        return self._walk_dir(b"images", path, value)

    def sizes_in_dir(self, path: bytes, k: int) -> dict[bytes, int]:
        """name -> bytes at qk for the files directly in `path`."""
        def size(v):
            n = v[ENTRY.size - 1]
            return struct.unpack_from("<I", v, ENTRY.size + 12 * (min(k, n) - 1))[0] + 2
        return self._walk_dir(b"images", path, size)

    def l3_sizes_in_dir(self, path: bytes) -> dict[bytes, int]:
        """source file name -> bytes of its l3 view file, for the files directly in `path`."""
        def size(v):
            if not v[ENTRY.size - 2] & ENTRY_HAS_L3:
                return None
            return L3.unpack_from(v, ENTRY.size + 12 * v[ENTRY.size - 1])[0]
        return self._walk_dir(b"images", path, size)

    def _walk_dir(self, db: bytes, path: bytes, value) -> dict[bytes, int]:
        """One ordered cursor walk over the keys directly in `path` (a directory's keys are
        contiguous; subdirectories are jumped over)."""
        prefix = path + b"/" if path else b""
        skip = len(prefix)
        out: dict[bytes, int] = {}
        with self.env.begin(buffers=True) as txn:
            cur = txn.cursor(self._db[db])
            if not cur.set_range(prefix or b"\x01"):
                return out
            while True:   # iternext() walks in C; it restarts after each jump
                for key, v in cur.iternext():
                    key = bytes(key)
                    if not key.startswith(prefix):
                        return out
                    rest = key[skip:]
                    slash = rest.find(b"/")
                    if slash >= 0:  # inside a subdirectory: skip all of it ('0' follows '/')
                        if not cur.set_range(prefix + rest[:slash] + b"0"):
                            return out
                        break
                    out[rest] = value(v)
                else:
                    return out

    def _listing_start(self, v) -> int:
        """Where the listing starts in a `dirs` value (after the ordinal head, if any)."""
        if not self.numbered:
            return 0
        if len(v) < DIR_HEAD.size:
            raise ValueError("directory listing in the index is truncated")
        nruns = DIR_HEAD.unpack_from(v, 0)[2]
        start = DIR_HEAD.size + (0 if nruns == NO_RUNS else RUN.size * nruns)
        if start > len(v):
            raise ValueError("directory listing in the index is truncated")
        return start

    def listdir(self, path: bytes) -> list[tuple[bytes, bool]] | None:
        with self.env.begin(buffers=True) as txn:
            v = txn.get(dir_key(path), db=self._db[b"dirs"])
            return None if v is None else unpack_listing(bytes(v[self._listing_start(v):]))

    def dir_ordinals(self, path: bytes) -> tuple[int, int] | None:
        """(the directory's own ordinal, its first subdirectory's), or None if no such
        directory (or an index without ordinals)."""
        with self.env.begin(buffers=True) as txn:
            v = txn.get(dir_key(path), db=self._db[b"dirs"])
            if v is None or not self.numbered:
                return None
            if len(v) < DIR_HEAD.size:
                raise ValueError("directory listing in the index is truncated")
            return DIR_HEAD.unpack_from(v, 0)[:2]

    def dir_numbering(self, path: bytes):
        """(listing, first subdirectory's ordinal, the files' ordinals in listing order or
        None if the index stores no runs for it) in one read; None if no such directory."""
        with self.env.begin(buffers=True) as txn:
            v = txn.get(dir_key(path), db=self._db[b"dirs"])
            if v is None or not self.numbered:
                return None
            start = self._listing_start(v)
            _, sub, nruns = DIR_HEAD.unpack_from(v, 0)
            listing = unpack_listing(bytes(v[start:]))
            if nruns == NO_RUNS:
                return listing, sub, None
            files: list[int] = []
            for i in range(nruns):
                a, n = RUN.unpack_from(v, DIR_HEAD.size + RUN.size * i)
                files.extend(range(a, a + n))
            if len(files) != sum(1 for _, d in listing if not d):
                raise ValueError("directory ordinals in the index do not match its listing")
            return listing, sub, files

    def is_dir(self, path: bytes) -> bool:
        with self.env.begin(buffers=True) as txn:
            return txn.get(dir_key(path), db=self._db[b"dirs"]) is not None

    def image_places(self) -> Iterator[tuple[bytes, int, int]]:
        """(path, record, index in record) of every image, in one cursor walk."""
        with self.env.begin(buffers=True) as txn:
            for k, v in txn.cursor(self._db[b"images"]):
                record, index = RECIDX.unpack_from(v, 0)
                path = (unpack_entry(bytes(v), True).path if k[:2] == LONG_KEY_PREFIX
                        else bytes(k))
                yield path, record, index

    def directory_ordinals(self) -> dict[bytes, int]:
        """Every directory's path -> its node ordinal (empty for an index without them)."""
        if not self.numbered:
            return {}
        out = {}
        with self.env.begin(buffers=True) as txn:
            for k, v in txn.cursor(self._db[b"dirs"]):
                if len(v) < DIR_HEAD.size:
                    raise ValueError("directory listing in the index is truncated")
                out[bytes(k[1:])] = DIR_HEAD.unpack_from(v, 0)[0]
        return out

    def unsafe_name(self) -> str | None:
        """The first directory or listed name that could not be a path component below a
        mount or an export (format/names.py), described; None if every one is safe.  One
        cursor walk of the listings, the names checked in bulk: under a second per
        million names."""
        from pcrfs.format.names import NAME_MAX, path_problem
        with self.env.begin(buffers=True) as txn:
            for k, v in txn.cursor(self._db[b"dirs"]):
                d = bytes(k[1:])
                if d and (why := path_problem(d)):
                    return f"directory {d[:300]!r} ({why})"
                try:
                    names = [n for n, _ in unpack_listing(bytes(v[self._listing_start(v):]))]
                except (ValueError, struct.error):
                    continue        # damaged, not unsafe: that directory's listing is EIO
                joined = b"\x01".join(names)
                if (b"/" in joined or b"\0" in joined or b"." in names or b".." in names
                        or (names and not 0 < min(map(len, names)) <= max(map(len, names)) <= NAME_MAX)):
                    bad = next(n for n in names if path_problem(n) or b"/" in n)
                    return f"{bad[:300]!r} in {d[:300]!r} ({path_problem(bad) or 'a /'})"
        return None

    def iter_images(self) -> Iterator[tuple[bytes, ImageEntry]]:
        with self.env.begin() as txn:
            for k, v in txn.cursor(self._db[b"images"]):
                hashed = k.startswith(LONG_KEY_PREFIX)
                e = unpack_entry(v, hashed)
                yield (e.path if hashed else bytes(k)), e

    def size_table(self, groups: int) -> dict[str, np.ndarray]:
        """Every image's sizes, for a static cache's universe (one cursor walk): its
        ordinal, segment count, cumulative segment bytes per scan group (padded to
        `groups` with its total) and l3 file size (-1 when none)."""
        ords, nseg, l3, wh = [], [], [], []
        ends = []
        pad = np.zeros(groups, dtype=np.int64)
        with self.env.begin(buffers=True) as txn:
            for v in txn.cursor(self._db[b"images"]).iternext(keys=False, values=True):
                record, index, _, w, h, _, flags, n = ENTRY.unpack_from(v, 0)
                wh.append((w, h))
                row = np.frombuffer(v, "<u4", 3 * n, ENTRY.size)[0::3]
                m = min(n, groups)
                pad[:m] = row[:m]
                pad[m:] = row[m - 1] if m else 0
                ends.append(pad.copy())
                ords.append(record << INDEX_BITS | index)
                nseg.append(n)
                l3.append(L3.unpack_from(v, ENTRY.size + 12 * n)[0]
                          if flags & ENTRY_HAS_L3 else -1)
        return {"ordinal": np.array(ords, dtype=np.uint64),
                "segments": np.array(nseg, dtype=np.int64),
                "ends": np.array(ends, dtype=np.int64).reshape(len(ords), groups),
                "l3": np.array(l3, dtype=np.int64),
                "width": np.array([w for w, _ in wh], dtype=np.int64),
                "height": np.array([h for _, h in wh], dtype=np.int64)}

    def data_bytes(self) -> int:
        return os.path.getsize(os.path.join(self.path, "data.mdb"))

    def close(self, wait: bool = True) -> None:
        if not self._closed:
            self._closed = True
            _close_env(self._key, wait)

    def __del__(self):
        self.close(wait=False)   # never block in the collector (see _DEFERRED)
