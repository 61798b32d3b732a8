"""Record files: a self-describing header, per-image metadata, then scan groups 1..G.

Layout (little-endian) is specified in docs/FORMAT.md; this module is its only reader
and writer.  The header alone is enough to locate and verify every segment, so the index
can always be rebuilt from the records (`pcrfs reindex`)."""
from __future__ import annotations

import os
import struct
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from pcrfs.errors import DatasetError
from pcrfs.format import FORMAT_VERSION
from pcrfs.format.atomic import atomic_write
from pcrfs.format.checksum import block_checksum, segment_checksum

MAGIC = b"PCRFSREC"
FIXED = struct.Struct("<8sHHI16sIIQQII")  # 64 bytes
assert FIXED.size == 64
IMAGE_META = struct.Struct("<iIIBBH")
FLAG_CONVERTED = 1


@dataclass
class ImageMeta:
    path: bytes
    label: int
    width: int
    height: int
    components: int
    flags: int = 0


@dataclass
class RecordHeader:
    number: int
    dataset_uuid: uuidlib.UUID
    groups: int
    group_offsets: list[int]          # G + 1 entries; the last is the record's size
    lengths: np.ndarray               # (n, G) uint32; 0 = image has no scan in that group
    checksums: np.ndarray             # (n, G) uint32
    classes: list[bytes]
    images: list[ImageMeta] = field(default_factory=list)
    header_size: int = 0

    @property
    def count(self) -> int:
        return len(self.images)

    @property
    def size(self) -> int:
        return self.group_offsets[-1]

    def offsets_in_group(self) -> np.ndarray:
        """(n, G) offset of each segment from the start of its group."""
        cum = np.cumsum(self.lengths, axis=0, dtype=np.uint64)
        return (cum - self.lengths).astype(np.uint64)


def _pack_metadata(classes: list[bytes], images: list[ImageMeta]) -> bytes:
    parts = [struct.pack("<I", len(classes))]
    for c in classes:
        parts.append(struct.pack("<H", len(c)) + c)
    for m in images:
        parts.append(IMAGE_META.pack(m.label, m.width, m.height, m.components, m.flags,
                                     len(m.path)) + m.path)
    body = b"".join(parts)
    return body + struct.pack("<Q", block_checksum(body))


def _unpack_metadata(buf: bytes, n: int) -> tuple[list[bytes], list[ImageMeta]]:
    if len(buf) < 12 or struct.unpack_from("<Q", buf, len(buf) - 8)[0] != block_checksum(buf[:-8]):
        raise DatasetError("record metadata checksum mismatch")
    pos = 4
    (ncls,) = struct.unpack_from("<I", buf, 0)
    classes = []
    try:
        for _ in range(ncls):
            (ln,) = struct.unpack_from("<H", buf, pos)
            classes.append(bytes(buf[pos + 2 : pos + 2 + ln]))
            pos += 2 + ln
        images = []
        for _ in range(n):
            label, w, h, comps, flags, ln = IMAGE_META.unpack_from(buf, pos)
            pos += IMAGE_META.size
            images.append(ImageMeta(bytes(buf[pos : pos + ln]), label, w, h, comps, flags))
            pos += ln
    except struct.error as e:
        raise DatasetError(f"record metadata truncated: {e}") from None
    return classes, images


def pack_header(number: int, dataset_uuid: uuidlib.UUID, classes: list[bytes],
                images: list[ImageMeta], segments: list[list[bytes]], groups: int) -> bytes:
    """Header + metadata for a record whose images have the given segments."""
    n = len(images)
    lengths = np.zeros((n, groups), dtype=np.uint32)
    checksums = np.zeros((n, groups), dtype=np.uint32)
    for i, segs in enumerate(segments):
        for g, s in enumerate(segs):
            lengths[i, g] = len(s)
            checksums[i, g] = segment_checksum(s)
    meta = _pack_metadata(classes, images)
    header_size = FIXED.size + 8 * (groups + 1) + 8 * n * groups + 8
    offsets = [header_size + len(meta)]
    for g in range(groups):
        offsets.append(offsets[-1] + int(lengths[:, g].sum(dtype=np.uint64)))
    fixed = FIXED.pack(MAGIC, FORMAT_VERSION, 0, number, dataset_uuid.bytes, n, groups,
                       header_size, len(meta), header_size, 0)
    body = (fixed + struct.pack(f"<{groups + 1}Q", *offsets) + lengths.astype("<u4").tobytes()
            + checksums.astype("<u4").tobytes())
    return body + struct.pack("<Q", block_checksum(body)) + meta


def group_bytes(segments: list[list[bytes]], groups: int) -> Iterator[bytes]:
    """A record's body after its header: each scan group in turn (one in memory at a
    time when written to a file)."""
    for g in range(groups):
        yield b"".join(segs[g] for segs in segments if g < len(segs))


def write_record(path: str, number: int, dataset_uuid: uuidlib.UUID, classes: list[bytes],
                 images: list[ImageMeta], segments: list[list[bytes]], groups: int) -> int:
    """Write a complete record atomically (tmp + fsync + rename); returns its size."""
    with atomic_write(path) as f:
        f.write(pack_header(number, dataset_uuid, classes, images, segments, groups))
        for c in group_bytes(segments, groups):
            f.write(c)
        size = f.tell()
    return size


def read_header(f) -> RecordHeader:
    """Parse and verify a record's header and metadata from an open binary file."""
    f.seek(0)
    fixed = f.read(FIXED.size)
    if len(fixed) < FIXED.size:
        raise DatasetError("record too short for a header")
    (magic, version, _flags, number, uid, n, groups, header_size, meta_len, meta_off,
     _res) = FIXED.unpack(fixed)
    if magic != MAGIC:
        raise DatasetError("not a pcrfs record (bad magic)")
    if version != FORMAT_VERSION:
        raise DatasetError(f"record format version {version}, this pcrfs reads {FORMAT_VERSION}")
    if groups == 0 or groups > 255 or header_size != FIXED.size + 8 * (groups + 1) + 8 * n * groups + 8:
        raise DatasetError("record header sizes are inconsistent")
    rest = f.read(header_size - FIXED.size)
    if len(rest) != header_size - FIXED.size:
        raise DatasetError("record header truncated")
    body = fixed + rest[:-8]
    if struct.unpack("<Q", rest[-8:])[0] != block_checksum(body):
        raise DatasetError("record header checksum mismatch")
    pos = FIXED.size
    offsets = list(struct.unpack_from(f"<{groups + 1}Q", body, pos))
    pos += 8 * (groups + 1)
    lengths = np.frombuffer(body, "<u4", n * groups, pos).reshape(n, groups).astype(np.uint32)
    pos += 4 * n * groups
    checksums = np.frombuffer(body, "<u4", n * groups, pos).reshape(n, groups).astype(np.uint32)
    f.seek(meta_off)
    meta = f.read(meta_len)
    if len(meta) != meta_len:
        raise DatasetError("record metadata truncated")
    classes, images = _unpack_metadata(meta, n)
    return RecordHeader(number, uuidlib.UUID(bytes=uid), groups, offsets, lengths, checksums,
                        classes, images, header_size)


def read_header_path(path: str) -> RecordHeader:
    with open(path, "rb") as f:
        head = read_header(f)
        f.seek(0, os.SEEK_END)
        if f.tell() != head.size:
            raise DatasetError(f"record is {f.tell()} bytes, header says {head.size}")
    return head
