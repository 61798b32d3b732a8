"""The raw view: every image as binary PPM of the pixels torchvision's loader gets from
its qG file (pcrfs/liquid/rules.py), at I/O cost only.

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
from pcrfs.liquid.rules import is_raw, ppm_bytes, ppm_size, read_summary
from pcrfs.singleflight import SingleFlight
from pcrfs.storage.cache import Admission, MemoryTier, StaticPolicy
from pcrfs.storage.diskcache import HEAD as DISK_HEAD
from pcrfs.storage.fds import OutOfDescriptors
from pcrfs.views.base import LANE_RAW
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

    def pack_head(self, record: int) -> Pack | None:
        """The record's pack head, verified, or None if it has none or it is damaged (its
        images then come here, which says so): what the fast lane serves PPMs from."""
        try:
            return self._pack(record)
        except CorruptDataError:
            return None

    def _pack(self, record: int, fresh: bool = False) -> Pack | None:
        """The record's pack head, kept once read; fresh: read again from the store (and
        kept), for a pack that may have been rewritten since."""
        found = None if fresh else self._packs.get(record)
        if found is not None:
            return found or None
        key = pack_key(record)
        try:
            st = self.ds.storage
            v = self._versions.get(key, "")
            n = count_of(st.read_file(key, 0, HEAD.size, version=v, fresh=fresh), key)
            pack = decode(st.read_file(key, 0, head_size(n), version=v, fresh=fresh), key,
                          self.ds.uuid, record)
        except FileNotFoundError:
            pack = None
        except OutOfDescriptors:
            raise
        except (OSError, DatasetError) as err:
            self.ds.stats.add(checksum_failures=1)
            raise CorruptDataError(f"raw pack {key}: {err}") from None
        self._packs.put(record, pack or False)
        return pack

    def _stored(self, e: ImageEntry, relpath: bytes, size: int) -> bytes | None:
        """The image's PPM from its record's pack; None if the pack does not hold it.
        An item that fails its checksum sends for the pack's head again: `materialize`
        and `push` may have replaced the pack under this mount (a remote one reads each
        range afresh), and the head read before would point into the new pack's bytes.
        Only if the head is unchanged is the item damaged."""
        key = pack_key(e.record)
        pack = self._pack(e.record)
        data = self._item(pack, e, size)
        if data is None or len(data) == size:
            return data
        now = self._pack(e.record, fresh=True)
        if now is None or now.sum != pack.sum:
            log.info("raw pack %s was replaced under the mount: its new head is used", key)
            self.ds.stats.add(raw_packs_replaced=1)
            if now is not None:                  # new content: new disk-tier keys too
                self._versions[key] = f"head-{now.sum:016x}"
            data = self._item(now, e, size)
            if data is None or len(data) == size:
                return data
        self.ds.stats.add(checksum_failures=1)
        detail = (f"{os.fsdecode(relpath)}: raw pack {key} item {e.index} is damaged "
                  f"(its length or checksum does not match the pack's head)")
        log.error(detail)
        raise CorruptDataError(detail)

    def _item(self, pack: Pack | None, e: ImageEntry, size: int) -> bytes | None:
        """The item's bytes if they pass their checksum, b"" if not (or if the pack is
        gone), None if the pack does not hold the image."""
        item = pack.find(e.index) if pack is not None else None
        if item is None:
            return None
        off, n, xxh = item
        key = pack_key(e.record)
        try:
            data = self.ds.storage.read_file(key, off, n, version=self._versions.get(key, ""))
        except FileNotFoundError:
            return b""                              # removed since: the head decides
        self.ds.stats.add(raw_pack_reads=1, raw_pack_bytes=len(data))
        if len(data) != size or block_checksum(data) != xxh:
            return b""
        return data

    def _produce(self, e: ImageEntry, relpath: bytes) -> bytes:
        size = ppm_size(e.width, e.height)
        if is_raw(e.ordinal, self.materialized):
            data = self._stored(e, relpath, size)
            if data is not None:
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
    def digits(a):
        return 1 + (a >= 10) + (a >= 100) + (a >= 1000) + (a >= 10000)
    return 9 + digits(w) + digits(h) + 3 * w * h    # "P6\n" "W H\n" "255\n"


class RawView(FormatView):
    """The l3 view's naming (stem collisions keep full names), PPM bytes."""
    name = NAME
    lane_kind = LANE_RAW
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

