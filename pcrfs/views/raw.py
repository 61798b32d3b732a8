"""The raw view: every image as binary PPM of the pixels torchvision's loader gets from
its qG file (pcrfs/liquid.py), at I/O cost only.

Bytes come from, in order: the raw pack `pcrfs materialize` stored next to the records
(verified item by item: a damaged item is EIO for its image only), the view's disk cache
(images produced before), or one decode of the qG file, which is then kept in the disk
cache.  Names follow the l3 view's rule (foo.jpg -> foo.ppm; both keep their full name
when two files of a directory share a stem)."""
from __future__ import annotations

import errno
import logging
import os

from pcrfs.errors import CorruptDataError, DatasetError
from pcrfs.format.checksum import block_checksum
from pcrfs.format.index import ImageEntry
from pcrfs.format.rawpack import HEAD, Pack, count_of, decode, head_size, pack_key
from pcrfs.liquid import is_raw, ppm_bytes, ppm_size, read_summary
from pcrfs.singleflight import SingleFlight
from pcrfs.storage.cache import Admission, MemoryTier, StaticPolicy
from pcrfs.storage.diskcache import HEAD as DISK_HEAD
from pcrfs.storage.fds import OutOfDescriptors
from pcrfs.views.tree import FormatView

log = logging.getLogger("pcrfs.dataset")

NAME = "raw"
SUFFIX = b".ppm"
FORMAT = b"ppm"


class RawSource:
    """An image's PPM bytes, shared by raw/ and mix/.  hold: bytes of their files kept in
    memory under the static policy (a fixed, hash-chosen subset, never evicted)."""

    def __init__(self, ds, hold: int = 0):
        self.ds = ds
        summary = read_summary(ds.root) or {}
        if summary and summary.get("uuid") != str(ds.uuid):
            raise DatasetError(f"{ds.root}/raw.json belongs to dataset {summary.get('uuid')}")
        self.materialized = float(summary.get("fraction", 0.0))
        # each pack's XXH3: names its content in the remote disk tier's keys
        self._versions = {k: str(v.get("xxh3", "")) for k, v in summary.get("files", {}).items()}
        self.cache = ds.disk_cache(NAME)
        self._packs = MemoryTier(1024, sizeof=lambda v: 1)   # record -> Pack | False
        self._flight = SingleFlight()
        self.hold = None
        if hold:
            if ds.carve("hold", hold) < hold:
                raise DatasetError(f"-o hold={hold}: more than the memory budget leaves "
                                   f"(raise --cache-size)")
            self.hold = MemoryTier(hold, StaticPolicy(1.0, hold))

    def ppm(self, e: ImageEntry, relpath: bytes) -> bytes:
        return self._flight.do(e.ordinal, lambda: self._produce(e, relpath))

    def held(self, view: str, e: ImageEntry, universe, produce) -> bytes:
        """A mix/raw file through the hold, if there is one."""
        if self.hold is None:
            return produce()
        key = (view, e.ordinal)
        data = self.hold.get(key)
        if data is None:
            data = produce()
            self.hold.put(key, data, Admission(e.ordinal, universe))
        return data

    def _pack(self, record: int) -> Pack | None:
        found = self._packs.get(record)
        if found is not None:
            return found or None
        key = pack_key(record)
        try:
            st = self.ds.storage
            v = self._versions.get(key, "")
            n = count_of(st.read_file(key, 0, HEAD.size, version=v), key)
            pack = decode(st.read_file(key, 0, head_size(n), version=v), key, self.ds.uuid,
                          record)
        except FileNotFoundError:
            pack = None
        except OutOfDescriptors:
            raise
        except (OSError, DatasetError) as err:
            self.ds.stats.add(checksum_failures=1)
            raise CorruptDataError(f"raw pack {key}: {err}") from None
        self._packs.put(record, pack or False)
        return pack

    def _produce(self, e: ImageEntry, relpath: bytes) -> bytes:
        size = ppm_size(e.width, e.height)
        if is_raw(e.ordinal, self.materialized):
            pack = self._pack(e.record)
            item = pack.find(e.index) if pack is not None else None
            if item is not None:
                off, n, xxh = item
                key = pack_key(e.record)
                data = self.ds.storage.read_file(key, off, n, version=self._versions.get(key, ""))
                self.ds.stats.add(raw_pack_reads=1, raw_pack_bytes=len(data))
                if len(data) != size or block_checksum(data) != xxh:
                    self.ds.stats.add(checksum_failures=1)
                    detail = (f"{os.fsdecode(relpath)}: raw pack {pack_key(e.record)} item "
                              f"{e.index} is damaged ({len(data)} bytes, want {size}; "
                              f"checksum mismatch)")
                    log.error(detail)
                    raise CorruptDataError(detail)
                return data
        key = f"{e.ordinal:x}"
        if self.cache is not None:
            data = self.cache.get(key)
            if data is not None and len(data) == size:
                self.ds.stats.add(raw_cache_hits=1)
                return data
        data = ppm_bytes(self.ds.read_q(e, self.ds.groups, relpath))
        self.ds.stats.add(raw_decodes=1)
        if len(data) != size:
            raise CorruptDataError(f"{os.fsdecode(relpath)}: decodes to {len(data)} bytes of "
                                   f"PPM, its index says {e.width}x{e.height} ({size})")
        if self.cache is not None:
            self.cache.put(key, data, Admission(e.ordinal, self._disk_universe()))
        return data

    def _disk_universe(self):
        def load():
            t = self.ds.size_table()
            return t["ordinal"], sizes_of(t) + DISK_HEAD.size
        return self.ds.universe(NAME, "disk entries", load)   # sizes with the entry header

    def stats(self) -> dict:
        return {"raw": {"materialized_share": self.materialized}}


def sizes_of(table: dict):
    """Every image's PPM size, from the size table's widths and heights."""
    w, h = table["width"], table["height"]
    digits = (lambda a: 1 + (a >= 10) + (a >= 100) + (a >= 1000) + (a >= 10000))
    return 9 + digits(w) + digits(h) + 3 * w * h    # "P6\n" "W H\n" "255\n"


class RawView(FormatView):
    """The l3 view's naming (stem collisions keep full names), PPM bytes."""
    name = NAME
    suffix = SUFFIX
    fmt = FORMAT

    def __init__(self, ds, source: RawSource, direct: bool = False):
        super().__init__(ds)
        self.source_bytes = source
        self.immutable = not direct    # a hold bypasses the page cache (constant hit ratio)

    def entry(self, path: bytes) -> ImageEntry:
        src = self.source(path)
        e = None if src is None else self.index.lookup(src)
        if e is None:
            raise FileNotFoundError(errno.ENOENT, "no such raw file", os.fsdecode(path))
        return e

    def file_size(self, e: ImageEntry) -> int:
        return ppm_size(e.width, e.height)

    def files_in_dir(self, path):
        return {n: (o, ppm_size(w, h))
                for n, (o, _, w, h) in self.index.dims_in_dir(path, self.ds.groups).items()}

    def sizes_in_dir(self, path: bytes) -> dict[bytes, int]:
        files = self.files_in_dir(path)
        return {name: files[src][1] for name, src in self._dir_map(path).items() if src in files}

    def universe(self, tier: str):
        def load():
            t = self.ds.size_table()
            return t["ordinal"], sizes_of(t)
        return self.ds.universe(NAME, tier, load)

    def produce(self, path: bytes, e: ImageEntry) -> bytes:
        src = self.source(path)
        return self.source_bytes.held(NAME, e, self.universe("hold"),
                                      lambda: self.source_bytes.ppm(e, src))

    def xattrs(self, path: bytes) -> dict[bytes, bytes]:
        return super().xattrs(path) | {b"user.pcrfs.format": self.fmt}

    def stats(self) -> dict:
        return self.source_bytes.stats()

