"""A bounded on-disk LRU of derived or fetched bytes (L3 transcodes, remote extents).

It survives remounts: recency is the file's mtime, refreshed on every hit, and the LRU
order is rebuilt from a directory scan at start.  Every entry carries its length and
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
    def __init__(self, root: str, capacity: int):
        self.root = root
        self.capacity = int(capacity)
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()  # file name -> bytes on disk
        self.used = 0
        self.hits = self.misses = self.discarded = 0
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
        self._evict()

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
                self.hits += 1
                return pending
            if name not in self._lru:
                self.misses += 1
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
                self.misses += 1
            return None
        with self._lock:
            self.hits += 1
        return payload

    def put(self, key: str, data: bytes) -> None:
        if len(data) + HEAD.size <= self.capacity:
            self._write(self._name(key), data)

    def put_later(self, key: str, data: bytes) -> None:
        """put() in a background thread, so a read does not wait for the disk (a file
        create, write and rename cost ~0.2 ms each).  Pending entries are served from
        memory; beyond MAX_PENDING bytes the entry is dropped (it is only a cache)."""
        if len(data) + HEAD.size > self.capacity:
            return
        name = self._name(key)
        with self._lock:
            if self._closing or name in self._pending or self._pending_bytes + len(data) > MAX_PENDING:
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
        tmp = f"{path}.{threading.get_ident()}.tmp"
        try:
            with opening(lambda: open(tmp, "wb"), tmp) as f:
                f.write(HEAD.pack(MAGIC, len(data), xxhash.xxh3_64_intdigest(data)))
                f.write(data)
            os.rename(tmp, path)
        except OSError as e:  # a full cache disk costs speed, never correctness
            log.warning("disk cache write failed: %s", e)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        with self._lock:
            self.used += len(data) + HEAD.size - self._lru.pop(name, 0)
            self._lru[name] = len(data) + HEAD.size
            self._evict()

    def _evict(self) -> None:
        while self.used > self.capacity and self._lru:
            name, size = self._lru.popitem(last=False)
            self.used -= size
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
