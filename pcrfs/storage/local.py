"""Records on a local filesystem: read-only descriptors from a bounded LRU
(storage/fds.py), pread via the C helper straight into the output buffer (no
intermediate copies)."""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Sequence

from pcrfs import native
from pcrfs.errors import CorruptDataError
from pcrfs.format import RECORDS_DIR, record_name, sidecar_path
from pcrfs.format.names import open_regular
from pcrfs.storage.fds import DescriptorCache, OutOfDescriptors, opening
from pcrfs.storage.throttle import TokenBucket
from pcrfs.telemetry.stats import Stats

# errors of the storage itself (a missing or unreadable record), as opposed to the
# process running out of resources, which must not be reported as damage
_DAMAGE = (errno.ENOENT, errno.EIO, errno.EISDIR, errno.ENXIO, errno.ENODEV, errno.ESTALE,
           errno.ELOOP, errno.EINVAL)     # a symlink or a non-regular file (fds.open_regular)


class LocalStorage:
    """A Storage (storage/__init__.py) over record files on a local filesystem."""

    def __init__(self, root: str, throttle: TokenBucket | None = None,
                 fds: DescriptorCache | None = None, stats: Stats | None = None):
        self.root = os.path.join(root, RECORDS_DIR)
        self.top = root
        stats = stats or Stats()
        # after the bandwidth limit's wait: the time the storage itself takes
        self._t_splice = stats.latency_of("backend", "pread_segments")
        self._t_pread = stats.latency_of("backend", "pread")
        self.throttle = throttle
        self.fds = fds or DescriptorCache()

    def held_image(self, record: int) -> None:
        """(A remote backend counts owned images here; records on disk have no owner.)"""

    def _path(self, record: int) -> str:
        return os.path.join(self.root, record_name(record))

    def splice(self, record: int, segments: Sequence[tuple[int, int]], akey=None,
               checksums=None) -> bytearray:
        """Segments (absolute offset, length) of a record followed by EOI (akey, checksums:
        unused, the page cache is the local cache and the caller verifies)."""
        if self.throttle:
            self.throttle.consume(sum(n for _, n in segments))
        t = time.perf_counter()
        try:
            with self.fds.use(record, self._path(record)) as fd:
                out = native.splice_fd(fd, segments)
            self._t_splice.observe(time.perf_counter() - t)
            return out
        except native.NativeError as e:
            raise CorruptDataError(f"record {record_name(record)}: {e}") from None
        except OSError as e:
            raise _classify(record, e) from None

    def pread(self, record: int, offset: int, length: int, akey=None) -> bytes:
        """One sequential read; may come back short if the record is truncated."""
        if self.throttle:
            self.throttle.consume(length)
        t = time.perf_counter()
        try:
            with self.fds.use(record, self._path(record)) as fd:
                out = os.pread(fd, length, offset)
            self._t_pread.observe(time.perf_counter() - t)
            return out
        except OSError as e:
            raise _classify(record, e) from None

    def forget(self, record: int, group_offsets, segments) -> bool:
        """Nothing cached to drop: damage here is the record's own (False: no re-read)."""
        return False

    def cached_extent(self, record: int, start: int, ends) -> tuple[int, bytes] | None:
        return None  # the page cache is the local cache

    def cached_segments(self, record: int, start: int, ends, plan) -> bytearray | None:
        return None

    def sidecar(self, record: int) -> bytes:
        """The record's l3 sidecar (OSError if unreadable)."""
        path = sidecar_path(self._path(record))
        with opening(lambda: os.fdopen(open_regular(path), "rb"), path) as f:
            return f.read()

    def read_file(self, key: str, offset: int, length: int, akey=None, version: str = "",
                  fresh: bool = False) -> bytes:
        """Bytes of another dataset file (a raw pack), through the bandwidth limit like
        record bytes; FileNotFoundError if there is no such file.  fresh changes nothing
        here: the open descriptor keeps reading the file it was opened on, replaced or not."""
        if self.throttle:
            self.throttle.consume(length)
        t = time.perf_counter()
        with self.fds.use(("file", key), os.path.join(self.top, key)) as fd:
            out = os.pread(fd, length, offset)
        self._t_pread.observe(time.perf_counter() - t)
        return out

    def close(self) -> None:
        self.fds.close()


def _classify(record: int, e: OSError) -> OSError:
    """Damage (the file is gone or unreadable) becomes CorruptDataError: one file EIO.
    Anything else (out of descriptors, out of memory) passes through as itself."""
    if isinstance(e, (CorruptDataError, OutOfDescriptors)):
        return e
    if isinstance(e, FileNotFoundError):
        return CorruptDataError(f"record {record_name(record)} is missing")
    if e.errno in _DAMAGE:
        return CorruptDataError(f"record {record_name(record)}: {e.strerror}")
    return e
