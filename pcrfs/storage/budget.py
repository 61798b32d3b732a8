"""One memory budget (`--cache-size`) for every image byte the daemon holds.

The budget is split into shares, each held by one bounded structure:

- `pending_disk_writes`: entries fetched or transcoded and waiting for a disk tier's
  writer thread (all disk tiers of a dataset draw on one Quota): 1/8, under static 1/16,
  at most 64 MiB;
- `lane_store`: the fast lane's image store (csrc/fuse_shim.c), when the lane is on: 1/4,
  an LRU of files; under static, what is left, holding the one pinned set;
- `open_files`: the images of files open through Python, and the bridge for lane reads
  that race a first assembly (fs/operations.py): 1/8, under static 1/16;
- `record_fills` (`-o fetch=record` on a remote dataset): the record extents being
  fetched piece by piece (storage/filling.py), 1/8; readers beyond it fetch their own
  image's segments;
- `readahead` (static only): record extents of in-order readers, an LRU, 1/16; under lru
  the memory tier holds them;
- `memory_tier`: what is left, the record extents (lru) or pinned images (static without
  the lane) of storage/reader.py.

Under static the pinned set takes every byte the other shares leave, 13/16 of a small
budget (all but 3 x 1/16), so a budget of 30% of a view hits about 24% of its bytes from
the second epoch on, whatever the order (before the lane's store held the pinned set,
its LRU and the memory tier held two sets: 15%).

What the budget does not count is a fixed overhead: the interpreter and libraries, the
index's mapped pages, metadata (name maps, listings, the lane's segment table and names:
about 140 bytes per image, mapped from index.segtab or derived at mount), and the images
being assembled right now (one per worker thread, and one per lane thread reading cold)."""
from __future__ import annotations

import threading

PENDING_SHARE, PENDING_MAX = 8, 64 << 20   # 1/8 of the budget, at most 64 MiB
STATIC_PENDING_SHARE = 16                  # 1/16 under the static policy
LANE_SHARE = 4                             # 1/4 (lru)
OPEN_SHARE, STATIC_OPEN_SHARE = 8, 16      # 1/8 (lru), 1/16 (static)
READAHEAD_SHARE = 16                       # 1/16, under the static policy
FILL_SHARE = 8                             # 1/8, -o fetch=record's fills in progress


class Quota:
    """Bytes several holders draw on together; take() refuses what would exceed it."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.used = self.peak = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.capacity:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class MemoryBudget:
    """`total` bytes; shares are carved out by name, the memory tier gets the rest."""

    def __init__(self, total: int):
        self.total = max(0, int(total))
        self.shares: dict[str, int] = {}
        self._lock = threading.Lock()

    def carve(self, name: str, nbytes: int) -> int:
        """Reserve up to nbytes for `name` out of what is left; returns the bytes given."""
        with self._lock:
            given = max(0, min(int(nbytes), self.remaining))
            self.shares[name] = self.shares.get(name, 0) + given
            return given

    def uncarve(self, name: str) -> None:
        with self._lock:
            self.shares.pop(name, None)

    @property
    def remaining(self) -> int:
        return self.total - sum(self.shares.values())

    def as_dict(self) -> dict:
        with self._lock:
            return {"total": self.total, **self.shares, "memory_tier": self.remaining}
