"""Raw packs: the materialized PPM files of one record's images (docs/LIQUID.md).

raw/rNNNNNN.ppk holds, for the images of record NNNNNN that the raw rule picks at the
pack's fraction, each image's PPM bytes, one after another.  Its head says which
dataset and record it belongs to and lists every item (index in the record, offset,
length, XXH3-64); the head carries its own XXH3, so a damaged table is found before any
item is trusted, and a damaged item costs only its own image.

raw.json (dataset root, written last) names the fraction the packs were made for and the
size and XXH3 of every pack: `verify` checks both, a mount only the items it reads."""
from __future__ import annotations

import struct
import uuid as uuidlib
from typing import NamedTuple

import numpy as np
import xxhash

from pcrfs.errors import DatasetError
from pcrfs.format import RAW_DIR

MAGIC = b"PCRFSRP1"
HEAD = struct.Struct("<8s16sIId")          # magic, dataset uuid, record, items, fraction
ITEM = np.dtype([("index", "<u4"), ("offset", "<u8"), ("length", "<u8"), ("xxh", "<u8")])
SUM = struct.Struct("<Q")                   # XXH3-64 of head + table


def pack_name(record: int) -> str:
    return f"r{record:06d}.ppk"


def pack_key(record: int) -> str:
    return f"{RAW_DIR}/{pack_name(record)}"


class Pack(NamedTuple):
    record: int
    fraction: float
    items: np.ndarray          # ITEM rows, sorted by index
    sum: int = 0               # the head's own XXH3: names this pack's content

    def find(self, index: int):
        """(offset, length, xxh) of an image of the record, or None if not in the pack."""
        i = int(np.searchsorted(self.items["index"], index))
        if i < len(self.items) and int(self.items["index"][i]) == index:
            row = self.items[i]
            return int(row["offset"]), int(row["length"]), int(row["xxh"])
        return None


def head_size(count: int) -> int:
    return HEAD.size + count * ITEM.itemsize + SUM.size


def encode(uid: uuidlib.UUID, record: int, fraction: float,
           items: list[tuple[int, bytes]]) -> list[bytes]:
    """The pack's parts in file order (head, then each item's bytes)."""
    table = np.zeros(len(items), dtype=ITEM)
    pos = head_size(len(items))
    for i, (index, data) in enumerate(items):
        table[i] = (index, pos, len(data), xxhash.xxh3_64_intdigest(data))
        pos += len(data)
    head = HEAD.pack(MAGIC, uid.bytes, record, len(items), fraction) + table.tobytes()
    return [head + SUM.pack(xxhash.xxh3_64_intdigest(head))] + [d for _, d in items]


def count_of(prefix: bytes, where: str) -> int:
    """The item count from a pack's first HEAD.size bytes (DatasetError if not a pack)."""
    if len(prefix) < HEAD.size or prefix[:8] != MAGIC:
        raise DatasetError(f"{where}: not a raw pack")
    return HEAD.unpack_from(prefix)[3]


def decode(head: bytes, where: str, uid: uuidlib.UUID, record: int) -> Pack:
    """A pack's head (head_size(count) bytes) checked and parsed; DatasetError if damaged
    or someone else's."""
    n = count_of(head, where)
    if len(head) < head_size(n):
        raise DatasetError(f"{where}: cut short (head of {head_size(n)} bytes, {len(head)} read)")
    body = head[: head_size(n) - SUM.size]
    (want,) = SUM.unpack_from(head, len(body))
    if want != xxhash.xxh3_64_intdigest(body):
        raise DatasetError(f"{where}: damaged head (checksum mismatch)")
    _, u, rec, _, fraction = HEAD.unpack_from(head)
    if u != uid.bytes or rec != record:
        raise DatasetError(f"{where}: belongs to record {rec} of dataset {uuidlib.UUID(bytes=u)}")
    items = np.frombuffer(body, ITEM, n, HEAD.size).copy()
    return Pack(record, fraction, items, want)
