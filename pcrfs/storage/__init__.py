"""Where record bytes come from.  A backend (storage/local.py, storage/remote.py) is a
Storage: it turns a read plan into the assembled image, and keeps what it fetches in
cache tiers (storage/cache.py's Tier) whose admission the caller's key decides."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

# seconds one remote read may take, retries included (--io-timeout; storage/objclient.py)
DEFAULT_IO_TIMEOUT = 60.0


@runtime_checkable
class Storage(Protocol):
    """Record bytes, local or remote.  Every read may take an admission key (akey) for
    the tiers behind it; reads raise CorruptDataError for damage, never return it."""

    def splice(self, record: int, segments: Sequence[tuple[int, int]], akey=None,
               checksums: Sequence[int] | None = None) -> bytearray:
        """The segments (absolute offset, length) of a record, then EOI."""
        ...

    def forget(self, record: int, group_offsets: Sequence[int], segments) -> bool:
        """Drop cached copies of the record's bytes that failed a checksum; True if a
        re-read would come from somewhere else (the store)."""
        ...

    def pread(self, record: int, offset: int, length: int, akey=None) -> bytes:
        """One sequential range of a record (an extent of its groups)."""
        ...

    def cached_extent(self, record: int, start: int, ends: Sequence[int]):
        """(groups, bytes) of an extent a cache tier already holds, or None."""
        ...

    def cached_segments(self, record: int, start: int, ends: Sequence[int], plan):
        """An image's segments from a cached extent, or None."""
        ...

    def held_image(self, record: int) -> None:
        """An image was served without a fetch (for a --shard node's counters)."""
        ...

    def sidecar(self, record: int) -> bytes:
        """The record's l3 sidecar."""
        ...

    def read_file(self, key: str, offset: int, length: int, akey=None, version: str = "",
                  fresh: bool = False) -> bytes:
        """Bytes of another dataset file (a raw pack)."""
        ...

    def close(self) -> None: ...
