"""The disk tier: a bounded on-disk cache of derived or fetched bytes (L3 transcodes,
remote extents), with the admission and eviction of a storage/cache.py Policy.

It survives remounts: recency is the file's mtime, refreshed on every hit, and the LRU
order is rebuilt from a directory scan at start (a static tier keeps what it finds).  Every entry carries its length and
XXH3-64, so a torn or corrupted file (crash mid-write, bad disk) is discarded, not served.
Writes go to a temporary file and are renamed into place."""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
from collections import OrderedDict

import xxhash

from pcrfs.format.atomic import atomic_write
from pcrfs.storage.cache import Policy, TierCounters
from pcrfs.storage.fds import OutOfDescriptors, opening

log = logging.getLogger("pcrfs.diskcache")
MAGIC = b"PCRFSDC1"
HEAD = struct.Struct("<8sQQ")  # magic, length, xxh3-64 of the payload
MAX_PENDING = 64 << 20         # bytes waiting for the background writer


def default_cache_dir() -> str:
    """$XDG_CACHE_HOME/pcrfs, else ~/.cache/pcrfs."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pcrfs")


class DiskCache:
    def __init__(self, root: str, capacity: int, policy: Policy | None = None):
        self.root = root
        self.capacity = int(capacity)
        self.policy = policy or Policy()
        self.counters = TierCounters()
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()  # file name -> bytes on disk
        self.used = 0
        self.discarded = 0
        # put_later(): entries waiting for the writer thread, served from memory meanwhile
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        self._wake = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._closing = False
        os.makedirs(root, exist_ok=True)
        found = []
        for e in os.scandir(root):
            if e.name.endswith(".tmp"):
                os.unlink(e.path)  # a write interrupted by a crash
            elif e.is_file():
                st = e.stat()
                found.append((st.st_mtime_ns, e.name, st.st_size))
        for _, name, size in sorted(found):
            self._lru[name] = size
            self.used += size
        if self.policy.evicts:
            self._evict()

    @property
    def hits(self) -> int:
        return self.counters.hits

    @property
    def misses(self) -> int:
        return self.counters.misses

    def stats(self) -> dict:
        with self._lock:
            return self.counters.as_dict(self.policy, self.used, self.capacity) | {
                "discarded": self.discarded}

    def _committed(self) -> int:
        """Bytes on disk plus those waiting for the writer, headers included."""
        return self.used + self._pending_bytes + len(self._pending) * HEAD.size

    def _fits(self, akey, size: int, entries: int = 1, rewrite: bool = False) -> bool:
        """(Under the lock) `entries` entries of `size` payload bytes in all: admitted by
        the policy, and room for them unless the policy may evict or they rewrite a kept
        entry."""
        need = size + entries * HEAD.size
        return (need <= self.capacity and self.policy.admits(akey)
                and (self.policy.evicts or rewrite
                     or self._committed() + need <= self.capacity))

    def _admit(self, name: str, size: int, akey) -> bool:
        """Admission of one entry (under the lock), counted when refused."""
        ok = self._fits(akey, size, rewrite=name in self._lru)
        if not ok:
            self.counters.refused += 1
        return ok

    @staticmethod
    def _name(key: str) -> str:
        return hashlib.blake2b(key.encode(), digest_size=16).hexdigest()

    def contains(self, key: str) -> bool:
        """Cheap membership test (no read, no counters)."""
        name = self._name(key)
        with self._lock:
            return name in self._lru or name in self._pending

    def get(self, key: str) -> bytes | None:
        name = self._name(key)
        with self._lock:
            pending = self._pending.get(name)
            if pending is not None:
                self.counters.hits += 1
                return pending
            if name not in self._lru:
                self.counters.misses += 1
                return None
            self._lru.move_to_end(name)
        path = os.path.join(self.root, name)
        try:
            with opening(lambda: open(path, "rb"), path) as f:
                raw = f.read()
            magic, n, want = HEAD.unpack_from(raw)
            payload = raw[HEAD.size:]
            if magic != MAGIC or len(payload) != n or xxhash.xxh3_64_intdigest(payload) != want:
                raise ValueError("checksum or length mismatch")
            os.utime(path)
        except OutOfDescriptors:
            raise            # the entry is fine; the process is short of descriptors
        except (OSError, ValueError, struct.error) as e:
            log.warning("disk cache entry %s discarded: %s", path, e)
            self._drop(name)
            with self._lock:
                self.discarded += 1
                self.counters.misses += 1
            return None
        with self._lock:
            self.counters.hits += 1
        return payload

    def put(self, key: str, data: bytes, akey=None) -> None:
        """Keep data under key if the policy admits it (by akey, default key)."""
        name = self._name(key)
        with self._lock:
            if not self._admit(name, len(data), key if akey is None else akey):
                return
        self._write(name, data)

    def would_keep(self, akey, size: int, entries: int = 1) -> bool:
        """Whether `entries` puts of `size` bytes in all would be kept now (one decision
        for the pieces of one image)."""
        with self._lock:
            return self._fits(akey, size, entries)

    def put_later(self, key: str, data: bytes, akey=None) -> None:
        """put() in a background thread, so a read does not wait for the disk (a file
        create, write and rename cost ~0.2 ms each).  Pending entries are served from
        memory; beyond MAX_PENDING bytes the entry is dropped (it is only a cache)."""
        name = self._name(key)
        with self._lock:
            if self._closing or name in self._pending or self._pending_bytes + len(data) > MAX_PENDING:
                return
            if not self._admit(name, len(data), key if akey is None else akey):
                return
            self._pending[name] = data
            self._pending_bytes += len(data)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_pending, daemon=True,
                                                name="pcrfs-diskcache")
                self._writer.start()
            self._wake.notify()

    def _write_pending(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._wake.wait()
                if not self._pending:
                    return
                name, data = next(iter(self._pending.items()))
            self._write(name, data)
            with self._lock:
                del self._pending[name]
                self._pending_bytes -= len(data)
                self._wake.notify_all()

    def close(self) -> None:
        """Write what is pending, then stop the writer."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            writer = self._writer
        if writer is not None:
            writer.join()

    def _write(self, name: str, data: bytes) -> None:
        path = os.path.join(self.root, name)
        try:     # no fsync: a torn entry fails its checksum and is discarded
            with atomic_write(path, durable=False, tmp=f"{path}.{threading.get_ident()}.tmp",
                              opener=lambda p, m: opening(lambda: open(p, m), p)) as f:
                f.write(HEAD.pack(MAGIC, len(data), xxhash.xxh3_64_intdigest(data)))
                f.write(data)
        except OSError as e:  # a full cache disk costs speed, never correctness
            log.warning("disk cache write failed: %s", e)
            return
        with self._lock:
            self.used += len(data) + HEAD.size - self._lru.pop(name, 0)
            self._lru[name] = len(data) + HEAD.size
            self.counters.admitted += 1
            if self.policy.evicts:
                self._evict()

    def _evict(self) -> None:
        while self.used > self.capacity and self._lru:
            name, size = self._lru.popitem(last=False)
            self.used -= size
            self.counters.evicted += 1
            try:
                os.unlink(os.path.join(self.root, name))
            except OSError:
                pass

    def _drop(self, name: str) -> None:
        with self._lock:
            size = self._lru.pop(name, None)
            if size is not None:
                self.used -= size
        try:
            os.unlink(os.path.join(self.root, name))
        except OSError:
            pass
