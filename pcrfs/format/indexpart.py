"""Per-record index part `parts/rNNNNNN.idx`: what the index needs from one record, written
by the build task that wrote the record, so that finalizing a build reads one small object
per record and never the records themselves (a distributed build's workers write records
straight to DST; the client only merges parts).

Layout (little-endian): magic "PCRFSIXP", u32 version (1), u32 header length H, u32 l3m
length L (0: no l3 sidecar), then the record's first H bytes (its header and metadata,
exactly as in the record), then the L bytes of its l3 sidecar, then u64 XXH3-64 of
everything before it.  A part is removed once the manifest is written."""
from __future__ import annotations

import io
import struct
import uuid as uuidlib

import numpy as np
import xxhash

from pcrfs.errors import DatasetError
from pcrfs.format.l3meta import parse_l3meta
from pcrfs.format.record import RecordHeader, read_header

MAGIC = b"PCRFSIXP"
VERSION = 1
HEAD = struct.Struct("<8sIII")
PARTS_DIR = "parts"


def part_key(number: int) -> str:
    return f"{PARTS_DIR}/r{number:06d}.idx"


def pack_part(header: bytes, l3m: bytes | None) -> bytes:
    l3m = l3m or b""
    body = HEAD.pack(MAGIC, VERSION, len(header), len(l3m)) + header + l3m
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def parse_part(data: bytes, where: str) -> tuple[RecordHeader, np.ndarray | None]:
    """(the record's header, its l3 items or None); DatasetError naming `where` if the
    part is damaged or inconsistent."""
    if len(data) < HEAD.size + 8:
        raise DatasetError(f"{where}: truncated index part")
    body = data[:-8]
    if struct.unpack("<Q", data[-8:])[0] != xxhash.xxh3_64_intdigest(body):
        raise DatasetError(f"{where}: index part checksum mismatch")
    magic, version, hlen, llen = HEAD.unpack_from(body)
    if magic != MAGIC or version != VERSION or len(body) != HEAD.size + hlen + llen:
        raise DatasetError(f"{where}: not a version-{VERSION} index part")
    try:
        header = read_header(io.BytesIO(body[HEAD.size: HEAD.size + hlen]))
    except DatasetError as e:
        raise DatasetError(f"{where}: {e}") from None
    l3 = None
    if llen:
        l3 = parse_l3meta(body[HEAD.size + hlen:], where, header.number, header.dataset_uuid,
                          len(header.images))
    return header, l3


def record_size(header: RecordHeader) -> int:
    """The record's length in bytes (its last scan group ends there)."""
    return int(header.group_offsets[-1])


def belongs(header: RecordHeader, number: int, uid: uuidlib.UUID) -> bool:
    return header.number == number and header.dataset_uuid == uid
