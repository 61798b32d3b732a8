"""The cache interface: get, put, admission and eviction, one policy per tier.

A tier (MemoryTier here, DiskCache in storage/diskcache.py) stores bytes under a key and
asks its Policy two things: may this entry come in (admission), and may older entries
leave to make room (eviction).

- `lru` admits everything that fits and evicts the least recently used.  Under a
  shuffled sampler an LRU smaller than the data it serves hits little: an entry is
  usually evicted before its next use, an epoch later.
- `static` admits a fixed, deterministic subset and never evicts: the keys of lowest
  rank (a hash) whose bytes, taken in rank order, fit the tier's capacity.  The caller
  names the Universe a key is drawn from (every image of the view being read, with its
  bytes in that tier), so the subset fills the tier exactly, and the hit ratio is the
  capacity fraction under any order, from the second epoch on.  The admission key is
  chosen by the caller (an image's ordinal, a record number) so that every piece of one
  image or record is admitted or refused together.

Counters are kept per tier: hits, misses, entries admitted and refused."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import xxhash

POLICIES = ("lru", "static")
_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: integer keys (ordinals, records) spread over 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def rank(key) -> float:
    """A stable position of an admission key in [0, 1)."""
    if not isinstance(key, int):
        key = xxhash.xxh3_64_intdigest(repr(key).encode())
    return _mix(key) / 2.0 ** 64


def ranks(keys: np.ndarray) -> np.ndarray:
    """rank() of many integer keys at once (float64, equal to rank() of each)."""
    x = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (x ^ (x >> np.uint64(31))) / 2.0 ** 64


class Universe:
    """Every admission key a static tier may be asked about, with the bytes each takes in
    that tier; loaded on first use (load() -> (integer keys, sizes))."""

    def __init__(self, load: Callable[[], tuple[np.ndarray, np.ndarray]]):
        self._load = load
        self._lock = threading.Lock()
        self._ranks: np.ndarray | None = None
        self._cum: np.ndarray | None = None
        self._cuts: dict[int, float] = {}

    def _loaded(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self._ranks is None:
                keys, sizes = self._load()
                r = ranks(np.asarray(keys, dtype=np.uint64))
                order = np.argsort(r, kind="stable")
                self._ranks = r[order]
                self._cum = np.cumsum(np.asarray(sizes, dtype=np.int64)[order])
            return self._ranks, self._cum

    @property
    def total(self) -> int:
        _, cum = self._loaded()
        return int(cum[-1]) if len(cum) else 0

    def cut(self, capacity: int) -> float:
        """The rank below which keys are admitted: the lowest ranks whose bytes, summed in
        rank order, fit `capacity`."""
        found = self._cuts.get(capacity)
        if found is None:
            r, cum = self._loaded()
            n = int(np.searchsorted(cum, capacity, side="right"))   # keys that fit
            found = self._cuts[capacity] = 1.0 if n >= len(r) else float(r[n])
        return found


class Admission(NamedTuple):
    """An admission key with the universe it is drawn from, and the record its bytes
    belong to where the key is not an image ordinal (a --shard tier decides by record)."""
    key: object
    universe: Universe | None = None
    record: int | None = None


class Policy:
    name = "lru"
    evicts = True

    def admits(self, akey) -> bool:
        return True


class StaticPolicy(Policy):
    """Admits the keys whose rank is below `fraction`; for an Admission with a Universe,
    the lowest-ranked keys that fit `capacity` (the tier sets it)."""
    name = "static"
    evicts = False

    def __init__(self, fraction: float, capacity: int | None = None):
        self.fraction = max(0.0, min(1.0, float(fraction)))
        self.capacity = capacity

    def threshold(self, universe: Universe | None) -> float:
        if universe is not None and self.capacity is not None:
            return universe.cut(self.capacity)
        return self.fraction

    def admits(self, akey) -> bool:
        if isinstance(akey, Admission):
            return rank(akey.key) < self.threshold(akey.universe)
        return rank(akey) < self.fraction


def make_policy(name: str, capacity: int, universe: int | None) -> Policy:
    """universe: the bytes the tier could be asked for, for keys given without a
    Universe (a static tier then admits the share capacity / universe of them)."""
    if name == "lru":
        return Policy()
    if name == "static":
        return StaticPolicy(1.0 if not universe else capacity / universe, capacity)
    raise ValueError(f"no cache policy {name!r} (expected {' or '.join(POLICIES)})")


class TierCounters:
    def __init__(self):
        self.hits = self.misses = self.admitted = self.refused = self.evicted = 0

    def as_dict(self, policy: Policy, used: int, capacity: int) -> dict:
        return {"policy": policy.name, "hits": self.hits, "misses": self.misses,
                "admitted": self.admitted, "refused": self.refused, "evicted": self.evicted,
                "bytes": used, "capacity": capacity}


@runtime_checkable
class Tier(Protocol):
    """What every cache tier answers (MemoryTier here, DiskCache in storage/diskcache.py):
    bytes under a key, admitted by its Policy (by akey, default the key)."""

    def get(self, key) -> object | None: ...

    def put(self, key, value, akey=None) -> bool:
        """Whether the tier kept it."""
        ...

    def contains(self, key) -> bool:
        """Membership, counting nothing."""
        ...

    def would_keep(self, akey, size: int) -> bool:
        """Whether a put of this size would be kept now (asked before fetching it)."""
        ...

    def stats(self) -> dict:
        """hits, misses, admitted, refused, evicted, bytes, capacity, policy."""
        ...


class MemoryTier:
    """Byte-bounded, thread-safe, in memory.  sizeof: what an entry counts against the
    capacity (default its bytes; `lambda v: 1` bounds a metadata cache by entries)."""

    def __init__(self, capacity: int, policy: Policy | None = None,
                 sizeof: Callable[[object], int] = len):
        self.policy = policy or Policy()
        self.sizeof = sizeof
        self.used = 0
        self.counters = TierCounters()
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.capacity = 0
        self.resize(capacity)

    def get(self, key):
        with self._lock:
            v = self._d.get(key)
            if v is None:
                self.counters.misses += 1
                return None
            self._d.move_to_end(key)
            self.counters.hits += 1
            return v

    def resize(self, capacity: int) -> None:
        """A new capacity (its share of the memory budget); an evicting policy makes room
        at once, a static one keeps what it holds and admits by the new capacity."""
        self.capacity = max(0, int(capacity))
        if isinstance(self.policy, StaticPolicy):
            self.policy.capacity = self.capacity
        if self.policy.evicts:
            with self._lock:
                self._shrink(0)

    def _shrink(self, size: int) -> None:
        while self._d and self.used + size > self.capacity:
            _, v = self._d.popitem(last=False)
            self.used -= self.sizeof(v)
            self.counters.evicted += 1

    def discard(self, key) -> None:
        with self._lock:
            v = self._d.pop(key, None)
            if v is not None:
                self.used -= self.sizeof(v)

    def contains(self, key) -> bool:
        """Membership, counting nothing."""
        with self._lock:
            return key in self._d

    def _fits(self, size: int, replaced: int = 0) -> bool:
        """(Under the lock, for an entry the policy admits) room for it, made by eviction
        if the policy may; `replaced`: bytes of the entry it would replace."""
        return size <= self.capacity and (self.policy.evicts
                                          or self.used - replaced + size <= self.capacity)

    def would_keep(self, akey, size: int) -> bool:
        """Whether put() would keep an entry of this size now (check before fetching it)."""
        if not self.policy.admits(akey):      # outside the lock: a Universe may load
            return False
        with self._lock:
            return self._fits(size)

    def put(self, key, value, akey=None) -> bool:
        """Keep value under key if the policy admits it (by akey, default key) and it fits."""
        size = self.sizeof(value)
        admitted = self.policy.admits(key if akey is None else akey)
        with self._lock:
            old = self._d.get(key)
            if not admitted or not self._fits(size, 0 if old is None else self.sizeof(old)):
                self.counters.refused += 1
                return False
            if old is not None:
                del self._d[key]
                self.used -= self.sizeof(old)
            self._shrink(size)
            self._d[key] = value
            self.used += size
            self.counters.admitted += 1
            return True

    def stats(self) -> dict:
        with self._lock:
            return self.counters.as_dict(self.policy, self.used, self.capacity)

    def __len__(self) -> int:
        return len(self._d)
