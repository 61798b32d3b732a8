"""The l3 view: every image as an L3 file (docs/L3.md) of its full-fidelity pixels.

Names: `class/foo.jpg` appears as `class/foo.l3`; when two files of a directory share a
stem (foo.jpg and foo.png) both keep their full name instead (foo.jpg.l3, foo.png.l3), so
the mapping is unambiguous and depends only on the directory listing."""
from __future__ import annotations

import errno
import io
import logging
import os

import numpy as np
from PIL import Image

import pcrfs.l3 as l3
from pcrfs.errors import CorruptDataError, DatasetError
from pcrfs.format import record_name
from pcrfs.format.checksum import block_checksum
from pcrfs.format.index import ImageEntry
from pcrfs.format.l3meta import l3meta_intact, parse_l3meta
from pcrfs.native import NativeError
from pcrfs.singleflight import SingleFlight
from pcrfs.storage.cache import Admission, MemoryTier
from pcrfs.storage.diskcache import HEAD as DISK_HEAD
from pcrfs.storage.fds import OutOfDescriptors
from pcrfs.views.base import LANE_L3
from pcrfs.views.tree import FormatView

log = logging.getLogger("pcrfs.dataset")

NAME = "l3"
SUFFIX = b".l3"


def l3_bytes(jpeg: bytes) -> bytes:
    """The L3 encoding of a JPEG's decoded RGB pixels, as Pillow's decoder gives them
    (grayscale and CMYK converted to RGB, grayscale thus being three equal planes).  The C
    decoder does YCbCr, RGB and grayscale with the GIL released; Pillow the rest."""
    try:
        out = l3.from_jpeg(jpeg)
    except NativeError:
        out = None    # Pillow's decoder words the error (or copes) as it always has
    return out if out is not None else pillow_l3_bytes(jpeg)


def pillow_l3_bytes(jpeg: bytes) -> bytes:
    """l3_bytes through Pillow's decoder and numpy: the reference the C path is held to."""
    with Image.open(io.BytesIO(jpeg)) as im:
        rgb = np.asarray(im.convert("RGB"))
    return l3.encode(rgb)


class L3View(FormatView):
    """Sizes come from the index (computed at build time); the bytes are transcoded from
    the qG file on first read, checked against the build's XXH3 (kept per record in a
    sidecar), and kept in the transcode disk cache across epochs and remounts."""
    name = NAME
    lane_kind = LANE_L3
    suffix = SUFFIX

    def __init__(self, ds, transcode_cache=None):
        super().__init__(ds)
        self.cache = transcode_cache
        self._sums = MemoryTier(512, sizeof=lambda v: 1)   # record -> XXH3 per image
        self._flight = SingleFlight()

    # (ordinal, XXH3-64) of an image just checked against the build's sidecar: the fast
    # lane serves its cached transcode only then (fs/kernel_shim.learn_l3, set by the daemon)
    verified = staticmethod(lambda ordinal, xxh: None)

    def known_sizes(self):
        """(ordinals, sizes as <u8) of the images whose L3 size the build recorded: what
        the fast lane serves of this view from the transcode cache."""
        t = self.ds.size_table()
        has = t["l3"] >= 0
        return t["ordinal"][has], t["l3"][has].astype("<u8")

    def entry(self, path: bytes) -> ImageEntry:
        src = self.source(path)
        e = None if src is None else self.index.lookup(src)
        if e is None or e.l3_size is None:
            raise FileNotFoundError(errno.ENOENT, "no such l3 file", os.fsdecode(path))
        return e

    def file_size(self, e: ImageEntry) -> int | None:
        return e.l3_size

    def files_in_dir(self, path):
        return self.index.files_in_dir(path, None)

    def sizes_in_dir(self, path: bytes) -> dict[bytes, int]:
        sizes = self.index.l3_sizes_in_dir(path)
        return {l3n: sizes[src] for l3n, src in self._dir_map(path).items()
                if sizes.get(src) is not None}

    def universe(self, tier: str):
        """Every image's l3 file, in memory or as a disk-tier entry (with its header)."""
        def load():
            t = self.ds.size_table()
            has = t["l3"] >= 0
            return t["ordinal"][has], t["l3"][has] + (DISK_HEAD.size if tier == "disk" else 0)
        return self.ds.universe(NAME, tier, load)

    # -- bytes ---------------------------------------------------------------------
    def _checksum(self, e: ImageEntry) -> int:
        """XXH3-64 of an image's l3 file, from its record's sidecar (kept out of the index
        to keep entries small; sidecars are cached per record).  A sidecar that fails its
        own checksum is still used item by item (format/l3meta.py): a damaged item then
        fails only its image's l3 check."""
        arr = self.record_sums(e.record)
        if e.index >= len(arr):
            raise CorruptDataError(f"l3 sidecar of record {e.record} has no item {e.index}")
        return int(arr[e.index])

    def record_sums(self, record: int):
        """The XXH3-64 of each l3 file of a record, by index in the record (its sidecar,
        cached); CorruptDataError if the sidecar cannot be read."""
        arr = self._sums.get(record)
        if arr is None:
            name = f"sidecar of {record_name(record)}"
            try:
                data = self.ds.storage.sidecar(record)
                arr = parse_l3meta(data, name, record, self.ds.uuid, -1, strict=False)["xxh"]
            except OutOfDescriptors:
                raise
            except (OSError, DatasetError) as err:
                self.ds.stats.add(checksum_failures=1)
                raise CorruptDataError(f"l3 sidecar of record {record}: {err}") from None
            if not l3meta_intact(data):
                self.ds.stats.add(checksum_failures=1)
                log.error("%s fails its checksum: each of its images is checked on its own; "
                          "`pcrfs verify` names the damaged ones", name)
            self._sums.put(record, arr)
        return arr

    def produce(self, path: bytes, e: ImageEntry) -> bytes:
        """Concurrent first reads of one file share a single transcode."""
        src = self.source(path)
        return self._flight.do(src, lambda: self._transcode(path, src, e))

    def lane_counts(self, cold: dict[str, int], from_disk: bool) -> dict[str, int]:
        return {"transcode_cache_hits": cold["files"]}   # the lane reads cached ones only

    @staticmethod
    def cache_key(ordinal: int) -> str:
        """An image's entry in the transcode tier; the lane reads it in C by this key
        (csrc/lane_cold.c, l3_file): keep the two alike."""
        return f"l3:{ordinal}"

    def _transcode(self, path: bytes, src: bytes, e: ImageEntry) -> bytes:
        key, size = self.cache_key(e.ordinal), e.l3_size
        xxh = self._checksum(e)
        if self.cache is not None:
            data = self.cache.get(key)
            if data is not None and len(data) == size and block_checksum(data) == xxh:
                self.ds.stats.add(transcode_cache_hits=1)
                self.verified(e.ordinal, xxh)
                return data
        data = l3_bytes(self.ds.read_q(e, self.ds.groups, src))
        self.ds.stats.add(transcodes=1)
        if len(data) != size or block_checksum(data) != xxh:
            self.ds.stats.add(checksum_failures=1)
            detail = (f"{os.fsdecode(path)}: the l3 transcode of {os.fsdecode(src)} gives "
                      f"{len(data)} bytes / checksum {block_checksum(data):016x}, the build "
                      f"recorded {size} / {xxh:016x}: this JPEG decoder differs from the "
                      f"build's (another Pillow/libjpeg version?); rebuild, or serve qG")
            log.error(detail)
            raise CorruptDataError(detail)
        if self.cache is not None:
            self.cache.put(key, data, Admission(e.ordinal, self.universe("disk")))
            self.verified(e.ordinal, xxh)
        return data
