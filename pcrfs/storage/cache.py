"""The cache interface: get, put, admission and eviction, one policy per tier.

A tier (MemoryTier here, DiskCache in storage/diskcache.py) stores bytes under a key and
asks its Policy two things: may this entry come in (admission), and may older entries
leave to make room (eviction).

- `lru` admits everything that fits and evicts the least recently used.  Under a
  shuffled sampler an LRU smaller than the data it serves hits little: an entry is
  usually evicted before its next use, an epoch later.
- `static` admits a fixed, deterministic subset (an entry whose admission key ranks
  below capacity / universe, the universe being the bytes of the view being read) until
  the tier is full, and never evicts.  Its hit ratio is the capacity fraction under any
  order, from the second epoch on.  The admission key is chosen by the caller (an
  image's ordinal, a record number) so that every piece of one image or record is
  admitted or refused together; subsets are nested (an image admitted at q10 is
  admitted at q3, whose universe is smaller).

Counters are kept per tier: hits, misses, entries admitted and refused."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

import xxhash

POLICIES = ("lru", "static")


def rank(key) -> float:
    """A stable position of an admission key in [0, 1)."""
    return xxhash.xxh3_64_intdigest(repr(key).encode()) / 2.0 ** 64


class Admission(NamedTuple):
    """An admission key with the universe it is drawn from (bytes of the view read)."""
    key: object
    universe: int | None = None


class Policy:
    name = "lru"
    evicts = True

    def admits(self, akey) -> bool:
        return True


class StaticPolicy(Policy):
    """Admits the keys whose rank is below `fraction`; for an Admission with a universe,
    below capacity / universe.  The chosen set's bytes vary around the capacity; when they
    exceed it the tier refuses the last few (it never evicts)."""
    name = "static"
    evicts = False

    def __init__(self, fraction: float, capacity: int | None = None):
        self.fraction = max(0.0, min(1.0, float(fraction)))
        self.capacity = capacity

    def threshold(self, universe: int | None) -> float:
        if universe and self.capacity is not None:
            return min(1.0, self.capacity / universe)
        return self.fraction

    def admits(self, akey) -> bool:
        if isinstance(akey, Admission):
            return rank(akey.key) < self.threshold(akey.universe)
        return rank(akey) < self.fraction


def make_policy(name: str, capacity: int, universe: int | None) -> Policy:
    """universe: the bytes the tier could be asked for, when the caller gives none."""
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


class MemoryTier:
    """Byte-bounded, thread-safe, in memory."""

    def __init__(self, capacity: int, policy: Policy | None = None):
        self.capacity = capacity
        self.policy = policy or Policy()
        self.used = 0
        self.counters = TierCounters()
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            v = self._d.get(key)
            if v is None:
                self.counters.misses += 1
                return None
            self._d.move_to_end(key)
            self.counters.hits += 1
            return v

    def peek(self, key) -> bool:
        """Membership, counting nothing."""
        with self._lock:
            return key in self._d

    def _fits(self, akey, size: int, replaced: int = 0) -> bool:
        """Admitted by the policy, and room for it (made by eviction, if the policy may);
        `replaced`: bytes of the entry it would replace."""
        return (size <= self.capacity and self.policy.admits(akey)
                and (self.policy.evicts or self.used - replaced + size <= self.capacity))

    def would_keep(self, akey, size: int) -> bool:
        """Whether put() would keep an entry of this size now (check before fetching it)."""
        with self._lock:
            return self._fits(akey, size)

    def put(self, key, value, akey=None) -> bool:
        """Keep value under key if the policy admits it (by akey, default key) and it fits."""
        size = len(value)
        with self._lock:
            old = self._d.get(key)
            if not self._fits(key if akey is None else akey, size,
                              0 if old is None else len(old)):
                self.counters.refused += 1
                return False
            if old is not None:
                del self._d[key]
                self.used -= len(old)
            while self.used + size > self.capacity:
                _, v = self._d.popitem(last=False)
                self.used -= len(v)
                self.counters.evicted += 1
            self._d[key] = value
            self.used += size
            self.counters.admitted += 1
            return True

    def stats(self) -> dict:
        with self._lock:
            return self.counters.as_dict(self.policy, self.used, self.capacity)

    def __len__(self) -> int:
        return len(self._d)
