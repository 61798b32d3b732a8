"""Per-record sidecar `records/rNNNNNN.l3m`: the size and XXH3-64 of each image's L3
file, computed at build time (`--views l3`) so `ls -l MNT/l3` is exact before any
transcode, and kept next to the record so `pcrfs reindex` needs no re-transcoding.

Layout (little-endian): magic "PCRFSL3M", u32 record number, 16-byte dataset UUID,
u32 count, then count x (u32 size, u64 xxh3), then u64 XXH3-64 of everything before it."""
from __future__ import annotations

import struct
import uuid as uuidlib

import numpy as np
import xxhash

from pcrfs.errors import DatasetError
from pcrfs.format.atomic import atomic_write

MAGIC = b"PCRFSL3M"
HEAD = struct.Struct("<8sI16sI")
ITEM = np.dtype([("size", "<u4"), ("xxh", "<u8")])


def pack_l3meta(number: int, uid: uuidlib.UUID, items: list[tuple[int, int]]) -> bytes:
    arr = np.array(items, dtype=ITEM) if items else np.zeros(0, ITEM)
    body = HEAD.pack(MAGIC, number, uid.bytes, len(arr)) + arr.tobytes()
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def write_l3meta(path: str, number: int, uid: uuidlib.UUID, items: list[tuple[int, int]]) -> None:
    with atomic_write(path) as f:
        f.write(pack_l3meta(number, uid, items))


def read_l3meta(path: str, number: int, uid: uuidlib.UUID, count: int = -1) -> np.ndarray:
    """The (size, xxh) items; count -1 accepts any count."""
    with open(path, "rb") as f:
        return parse_l3meta(f.read(), path, number, uid, count)


def parse_l3meta(data: bytes, path: str, number: int, uid: uuidlib.UUID,
                 count: int = -1, strict: bool = True) -> np.ndarray:
    """read_l3meta on bytes already read (path names them in errors).

    strict=False accepts a body that fails the whole-file checksum if its header and
    length are sound: each item then only stands for its own image, whose l3 bytes are
    checked against it (and the index's size) anyway, so a damaged item costs that one
    image instead of the record's."""
    if len(data) < HEAD.size + 8:
        raise DatasetError(f"{path}: truncated")
    body = data[:-8]
    if strict and not l3meta_intact(data):
        raise DatasetError(f"{path}: checksum mismatch")
    magic, num, ub, n = HEAD.unpack_from(body)
    if magic != MAGIC or num != number or ub != uid.bytes or (count >= 0 and n != count):
        raise DatasetError(f"{path}: does not belong to record {number} of dataset {uid}")
    if len(body) != HEAD.size + n * ITEM.itemsize:
        raise DatasetError(f"{path}: wrong length")
    return np.frombuffer(body, ITEM, n, HEAD.size)


def l3meta_intact(data: bytes) -> bool:
    """Whether a sidecar's bytes pass its whole-file checksum."""
    return (len(data) >= HEAD.size + 8
            and xxhash.xxh3_64_intdigest(data[:-8]) == struct.unpack("<Q", data[-8:])[0])
