"""Segment checksums: the low 32 bits of XXH3-64 (fast, and 4 bytes keep the index small)."""
import xxhash


def segment_checksum(data) -> int:
    return xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF


def block_checksum(data) -> int:
    return xxhash.xxh3_64_intdigest(data)
