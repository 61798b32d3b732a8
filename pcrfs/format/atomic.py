"""The one way pcrfs writes a file in place: a temporary beside it, then a rename, so a
reader (or a crash) sees the old file or the new one, never a torn one."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path: str, mode: str = "wb", durable: bool = True, tmp: str | None = None,
                 opener=None) -> Iterator:
    """Yield a file open on `tmp` (default PATH.tmp); on success it becomes `path`.
    durable: fsync the data before the rename (dataset files; a cache skips it and relies
    on its own checksums).  On any error the temporary is removed and the error raised.
    opener(tmp, mode) replaces open() (the descriptor budget wraps it)."""
    tmp = tmp or path + ".tmp"
    try:
        with (opener or open)(tmp, mode) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
