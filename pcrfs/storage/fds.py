"""File descriptors as a budgeted resource.

A dataset can have more records than the process may open files (ImageNet: 1,252
records; a login shell or a systemd unit: a soft limit of 1,024).  So the daemon raises
its soft limit to the hard one at start, keeps open record files in an LRU sized from
that limit, and every other open (disk-cache entries, sidecars) goes through `opening()`,
which on EMFILE/ENFILE closes idle cached descriptors and tries again.  Running out is
reported as what it is (`OutOfDescriptors`), never as corrupt data.

Descriptors are reference-counted while in use: one is closed only when no thread is
reading through it, so a number the kernel hands out again can never be read by a
thread that still holds the old one."""
from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pcrfs.format.names import open_regular

log = logging.getLogger("pcrfs.fds")

# Descriptors left to everything else (stdio, /dev/fuse, LMDB, sockets of the HTTP pool,
# trio's wakeup pipes, transient disk-cache opens, threads' own).  Measured: a mounted
# remote dataset under load holds about 30.
RESERVE = 40
MIN_CACHED = 4
MAX_CACHED = 4096
_SHORT = (errno.EMFILE, errno.ENFILE)
T = TypeVar("T")


class OutOfDescriptors(OSError):
    """The process (EMFILE) or the system (ENFILE) has no file descriptor left, even after
    idle cached ones were closed: raise LimitNOFILE / `ulimit -n`."""


def raise_nofile_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, e)
    return soft


def budget_for(limit: int) -> int:
    """How many record files to keep open under an open-file limit."""
    return max(MIN_CACHED, min(MAX_CACHED, (limit - RESERVE) // 2))


class DescriptorCache:
    """LRU of read-only descriptors keyed by anything (a record number), at most
    `capacity` open at once beyond those in use."""

    def __init__(self, capacity: int | None = None):
        if capacity is None:
            capacity = budget_for(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self.capacity = max(1, capacity)
        self._lock = threading.Lock()
        self._idle: OrderedDict[Hashable, int] = OrderedDict()   # key -> fd, nobody using it
        self._busy: dict[Hashable, list[int]] = {}               # key -> [fd, users]
        self.opens = self.evictions = self.sheds = 0
        _CACHES.append(self)

    @contextmanager
    def use(self, key: Hashable, path: str) -> Iterator[int]:
        """An open O_RDONLY descriptor of `path`, valid for the `with` block."""
        fd = self._acquire(key, path)
        try:
            yield fd
        finally:
            self._release(key, fd)

    def _acquire(self, key, path: str) -> int:
        with self._lock:
            busy = self._busy.get(key)
            if busy is not None:
                busy[1] += 1
                return busy[0]
            fd = self._idle.pop(key, None)
            if fd is not None:
                self._busy[key] = [fd, 1]
                return fd
        fd = opening(lambda: open_regular(path), path)
        with self._lock:
            self.opens += 1
            busy = self._busy.get(key)
            if busy is not None:          # another thread opened it meanwhile: share theirs
                busy[1] += 1
                dup, fd = fd, busy[0]
            else:
                self._busy[key] = [fd, 1]
                dup = None
        if dup is not None:
            os.close(dup)
        return fd

    def _release(self, key, fd: int) -> None:
        close = []
        with self._lock:
            busy = self._busy[key]
            busy[1] -= 1
            if busy[1] == 0:
                del self._busy[key]
                self._idle[key] = fd
                while len(self._idle) + len(self._busy) > self.capacity and self._idle:
                    close.append(self._idle.popitem(last=False)[1])
                    self.evictions += 1
        for c in close:
            os.close(c)

    def shed(self) -> int:
        """Close every idle descriptor (another open failed with EMFILE); how many."""
        with self._lock:
            fds = list(self._idle.values())
            self._idle.clear()
            self.sheds += 1
        for fd in fds:
            os.close(fd)
        return len(fds)

    def open_count(self) -> int:
        with self._lock:
            return len(self._idle) + len(self._busy)

    def close(self) -> None:
        with self._lock:
            fds = list(self._idle.values())
            self._idle.clear()
        for fd in fds:
            os.close(fd)
        try:
            _CACHES.remove(self)
        except ValueError:
            pass


_CACHES: list[DescriptorCache] = []


def opening(make: Callable[[], T], what: str = "") -> T:
    """make() (an open of some kind); on EMFILE/ENFILE, close idle cached descriptors and
    try again, then raise OutOfDescriptors."""
    for attempt in range(3):
        try:
            return make()
        except OSError as e:
            if e.errno not in _SHORT:
                raise
            err = e
            freed = sum(c.shed() for c in list(_CACHES))
            if not freed and attempt:
                break
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    raise OutOfDescriptors(err.errno, f"out of file descriptors opening {what or 'a file'} "
                           f"({errno.errorcode[err.errno]}; open-file limit {limit}): raise "
                           "LimitNOFILE / ulimit -n")
