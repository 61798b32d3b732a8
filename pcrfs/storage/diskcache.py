"""The disk tier: a bounded on-disk cache of derived or fetched bytes (L3 transcodes,
remote extents), with the admission and eviction of a storage/cache.py Policy.

It survives remounts: recency is the file's mtime, refreshed on every hit, and the LRU
order is rebuilt from a directory scan at start (a static tier keeps what it finds).
Every entry carries its length and XXH3-64, so a torn or corrupted file (crash
mid-write, bad disk) is discarded, not served.
Writes go to a temporary file and are renamed into place."""
from __future__ import annotations

import contextlib
import logging
import os
import stat
import struct
import threading
from collections import OrderedDict

import xxhash

from pcrfs.errors import DatasetError
from pcrfs.format.atomic import atomic_write
from pcrfs.storage.budget import Quota
from pcrfs.storage.cache import Policy, TierCounters
from pcrfs.storage.fds import OutOfDescriptors, opening

log = logging.getLogger("pcrfs.diskcache")
MAGIC = b"PCRFSDC1"
HEAD = struct.Struct("<8sQQ")  # magic, length, xxh3-64 of the payload
MAX_PENDING = 64 << 20         # bytes waiting for the background writer (no shared Quota)


NAME_PREFIX = "x"               # entry names: "x" + XXH3-128 of the key, in hex


def _named(name: str) -> bool:
    """An entry name of this version (pcrfs before it used BLAKE2b names, without the x)."""
    return len(name) == 33 and name[0] == NAME_PREFIX


def _creatable(path: str) -> bool:
    """Whether path is, or could be made, a directory this user writes: its nearest
    existing ancestor is a writable directory."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return False
        p = parent
    return os.path.isdir(p) and os.access(p, os.W_OK | os.X_OK)


def default_cache_dir() -> str:
    """$XDG_CACHE_HOME/pcrfs, else $HOME/.cache/pcrfs, else /var/tmp/pcrfs-<uid> (a
    service account or a container often has no home, or one it cannot write); the
    first that this user can create.  Nothing is created here: a disk cache makes its
    directory on its first write."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    home = os.path.expanduser("~")
    for base in ([os.path.join(xdg, "pcrfs")] if xdg else []) + (
            [os.path.join(home, ".cache", "pcrfs")] if home and home != "~" else []):
        if _creatable(base):
            return base
    return fallback_cache_dir()


def fallback_cache_dir() -> str:
    return f"/var/tmp/pcrfs-{os.getuid()}"


def claim_private(path: str) -> None:
    """The shared-directory fallback (fallback_cache_dir) made 0700 by this user, or
    refused (DatasetError) if something else is there: in a world-writable /var/tmp,
    another user could have made it first, to read what is cached or plant entries."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise DatasetError(f"{path}: the fallback cache directory is not a private directory "
                           f"of this user (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
                           "; remove it, or pass --cache-dir")


class DiskCache:
    """pending: the memory budget's share for entries waiting to be written (shared by
    the disk tiers of one dataset)."""

    def __init__(self, root: str, capacity: int, policy: Policy | None = None,
                 pending: Quota | None = None):
        self.root = root
        self.capacity = int(capacity)
        self.policy = policy or Policy()
        self.counters = TierCounters()
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()  # file name -> bytes on disk
        self.used = 0
        self.discarded = 0
        self.bytes_read = 0        # payload bytes read back from entry files
        # put_later(): entries waiting for the writer thread, served from memory meanwhile
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        self._quota = pending if pending is not None else Quota(MAX_PENDING)
        self._wake = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._closing = False
        self._root_state = None      # None: not made yet; True: there; False: cannot be
        found = []
        for e in (os.scandir(root) if os.path.isdir(root) else ()):
            if e.name.endswith(".tmp") or (e.is_file() and not _named(e.name)):
                os.unlink(e.path)  # a write interrupted by a crash; an older pcrfs's name
            elif e.is_file():
                st = e.stat()
                found.append((st.st_mtime_ns, e.name, st.st_size))
        for _, name, size in sorted(found):
            self._lru[name] = size
            self.used += size
        if self.policy.evicts:
            for victim in self._evict():
                os.unlink(os.path.join(root, victim))

    @property
    def hits(self) -> int:
        return self.counters.hits

    @property
    def misses(self) -> int:
        return self.counters.misses

    def stats(self) -> dict:
        with self._lock:
            return self.counters.as_dict(self.policy, self.used, self.capacity) | {
                "discarded": self.discarded, "bytes_read": self.bytes_read,
                "pending_bytes": self._pending_bytes}

    def _committed(self) -> int:
        """Bytes on disk plus those waiting for the writer, headers included."""
        return self.used + self._pending_bytes + len(self._pending) * HEAD.size

    def _fits(self, size: int, entries: int = 1, rewrite: bool = False) -> bool:
        """(Under the lock, for entries the policy admits) room for `entries` entries of
        `size` payload bytes in all, unless the policy may evict or they rewrite a kept
        entry."""
        need = size + entries * HEAD.size
        return need <= self.capacity and (self.policy.evicts or rewrite
                                          or self._committed() + need <= self.capacity)

    def _admit(self, name: str, size: int, admitted: bool) -> bool:
        """(Under the lock) admission of one entry, counted when refused; `admitted`: the
        policy's answer, asked outside the lock (a Universe may load)."""
        ok = admitted and self._fits(size, rewrite=name in self._lru)
        if not ok:
            self.counters.refused += 1
        return ok

    @staticmethod
    def _name(key: str) -> str:
        """The lane reads remote segments' entries in C by this name (csrc/lane_cold.c,
        disk_entry): keep the two alike."""
        return NAME_PREFIX + xxhash.xxh3_128_hexdigest(key.encode())

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
            with opening(lambda: open(path, "rb", buffering=0), path) as f:
                n, want = self._head(f)
                payload = bytearray(n)
                if f.readinto(payload) != n or xxhash.xxh3_64_intdigest(payload) != want:
                    raise ValueError("checksum or length mismatch")
            os.utime(path)
        except OutOfDescriptors:
            raise            # the entry is fine; the process is short of descriptors
        except FileNotFoundError:      # evicted meanwhile (or removed by hand): a miss
            with self._lock:
                size = self._lru.pop(name, None)
                self.used -= size or 0
                self.counters.misses += 1
            return None
        except (OSError, ValueError, struct.error) as e:
            return self._discard(name, e)
        with self._lock:
            self.counters.hits += 1
            self.bytes_read += n
        return payload

    @staticmethod
    def _head(f) -> tuple[int, int]:
        """(payload length, XXH3) from an entry's header; ValueError if the file's size
        disagrees with it (torn or truncated)."""
        magic, n, want = HEAD.unpack(f.read(HEAD.size))
        if magic != MAGIC or os.fstat(f.fileno()).st_size != HEAD.size + n:
            raise ValueError("bad header or length")
        return n, want

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes] | None:
        """[start, end) ranges of an entry's payload, read by pread alone: the entry's
        whole-payload checksum is not verified, so the caller verifies what it reads
        (segment checksums) and drop()s the entry on a mismatch.  None: not cached."""
        name = self._name(key)
        with self._lock:
            pending = self._pending.get(name)
            if pending is None and name not in self._lru:
                self.counters.misses += 1
                return None
            if pending is None:
                self._lru.move_to_end(name)
        if pending is not None:
            out = [bytes(pending[s:e]) for s, e in ranges]
        else:
            path = os.path.join(self.root, name)
            try:
                with opening(lambda: open(path, "rb", buffering=0), path) as f:
                    n, _ = self._head(f)
                    if any(not 0 <= s <= e <= n for s, e in ranges):
                        raise ValueError("range outside the entry")
                    out = [os.pread(f.fileno(), e - s, HEAD.size + s) for s, e in ranges]
                    if any(len(b) != e - s for b, (s, e) in zip(out, ranges, strict=True)):
                        raise ValueError("short read")
            except OutOfDescriptors:
                raise
            except (OSError, ValueError, struct.error) as e:
                return self._discard(name, e)
        with self._lock:
            self.counters.hits += 1
            self.bytes_read += sum(e - s for s, e in ranges)
        return out

    def forget(self, key: str) -> None:
        """Remove an entry that a larger one replaces."""
        self._drop(self._name(key))

    def drop(self, key: str) -> None:
        """Forget an entry whose content a caller found damaged."""
        self._discard(self._name(key), "a checksum of its content failed", miss=False)

    def _discard(self, name: str, why, miss: bool = True) -> None:
        """A damaged entry (torn, truncated, bit rot) is removed, never served."""
        log.warning("disk cache entry %s discarded: %s", os.path.join(self.root, name), why)
        self._drop(name)
        with self._lock:
            self.discarded += 1
            self.counters.misses += miss

    def put(self, key: str, data: bytes, akey=None) -> bool:
        """Keep data under key if the policy admits it (by akey, default key)."""
        name = self._name(key)
        admitted = self.policy.admits(key if akey is None else akey)
        with self._lock:
            if not self._admit(name, len(data), admitted):
                return False
        self._write(name, data)
        return True

    def would_keep(self, akey, size: int, entries: int = 1) -> bool:
        """Whether `entries` puts of `size` bytes in all would be kept now (one decision
        for the pieces of one image)."""
        if not self.policy.admits(akey):
            return False
        with self._lock:
            return self._fits(size, entries)

    def put_later(self, key: str, data: bytes, akey=None) -> None:
        """put() in a background thread, so a read does not wait for the disk (a file
        create, write and rename cost ~0.2 ms each).  Pending entries are served from
        memory; when they fill their share of the memory budget, the entry is written
        now instead (backpressure, nothing dropped)."""
        name = self._name(key)
        admitted = self.policy.admits(key if akey is None else akey)
        with self._lock:
            if self._closing or name in self._pending:
                return
            if not self._admit(name, len(data), admitted):
                return
            queued = self._quota.take(len(data))
            if queued:
                self._pending[name] = data
                self._pending_bytes += len(data)
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_pending, daemon=True,
                                                    name="pcrfs-diskcache")
                    self._writer.start()
                self._wake.notify()
        if not queued:
            self._write(name, data)

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
            self._quota.give(len(data))

    def close(self) -> None:
        """Write what is pending, then stop the writer."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            writer = self._writer
        if writer is not None:
            writer.join()

    def have_root(self) -> bool:
        """The cache's directory, made on the first write (or when the fast lane opens
        it): a dataset that never caches (a local one's l3/ unread) needs none.  One that
        cannot be made costs speed, never the mount: one warning, then no writes."""
        if self._root_state is None:
            try:
                os.makedirs(self.root, exist_ok=True)
                self._root_state = True
            except OSError as e:
                self._root_state = False
                log.warning("disk cache off: cannot create %s (%s); give the mount "
                            "--cache-dir DIR (or --cache-dir none)", self.root,
                            e.strerror or e)
        return self._root_state

    def _write(self, name: str, data: bytes) -> None:
        if not self.have_root():
            return
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
            victims = self._evict() if self.policy.evicts else []
        # unlinked without the lock, which readers (and the trio thread's lookups of
        # control files) take: a file system call must not make them wait
        for victim in victims:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.root, victim))

    def _evict(self) -> list[str]:
        """Forget the oldest entries until the rest fit (under the lock); their names."""
        out = []
        while self.used > self.capacity and self._lru:
            name, size = self._lru.popitem(last=False)
            self.used -= size
            self.counters.evicted += 1
            out.append(name)
        return out

    def _drop(self, name: str) -> None:
        with self._lock:
            size = self._lru.pop(name, None)
            if size is not None:
                self.used -= size
        try:
            os.unlink(os.path.join(self.root, name))
        except OSError:
            pass
