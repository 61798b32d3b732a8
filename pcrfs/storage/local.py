"""Records on a local filesystem: one cached read-only fd per record, pread via the C
helper straight into the output buffer (no intermediate copies)."""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from pcrfs import native
from pcrfs.errors import CorruptDataError
from pcrfs.format import RECORDS_DIR, record_name
from pcrfs.format.l3meta import sidecar_path
from pcrfs.storage.throttle import TokenBucket


class LocalStorage:
    def __init__(self, root: str, throttle: TokenBucket | None = None):
        self.root = os.path.join(root, RECORDS_DIR)
        self.throttle = throttle
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def _fd(self, record: int) -> int:
        fd = self._fds.get(record)
        if fd is None:
            with self._lock:
                fd = self._fds.get(record)
                if fd is None:
                    fd = os.open(os.path.join(self.root, record_name(record)),
                                 os.O_RDONLY | os.O_CLOEXEC)
                    self._fds[record] = fd
        return fd

    def splice(self, record: int, segments: Sequence[tuple[int, int]]) -> bytearray:
        """Segments (absolute offset, length) of a record followed by EOI."""
        if self.throttle:
            self.throttle.consume(sum(n for _, n in segments))
        try:
            return native.splice_fd(self._fd(record), segments)
        except FileNotFoundError:
            raise CorruptDataError(f"record {record_name(record)} is missing") from None
        except native.NativeError as e:
            raise CorruptDataError(f"record {record_name(record)}: {e}") from None

    def pread(self, record: int, offset: int, length: int) -> bytes:
        """One sequential read; may come back short if the record is truncated."""
        if self.throttle:
            self.throttle.consume(length)
        try:
            return os.pread(self._fd(record), length, offset)
        except FileNotFoundError:
            raise CorruptDataError(f"record {record_name(record)} is missing") from None
        except OSError as e:
            raise CorruptDataError(f"record {record_name(record)}: {e.strerror}") from None

    def cached_extent(self, record: int, start: int, ends) -> tuple[int, bytes] | None:
        return None  # the page cache is the local cache

    def sidecar(self, record: int) -> bytes:
        """The record's l3 sidecar (OSError if unreadable)."""
        with open(sidecar_path(os.path.join(self.root, record_name(record))), "rb") as f:
            return f.read()

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
