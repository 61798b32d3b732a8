"""Dataset paths and files, checked before they meet a filesystem.

A dataset is untrusted input (docs/SECURITY.md): its index could name `../x`, an absolute
path, a NUL or a component no filesystem accepts, and `pcrfs export` (or anything else
that joins index paths onto a directory) would then write outside its output.  Every
path is checked here once; `join_below` is the only way such a path becomes a host path."""
from __future__ import annotations

import errno
import os
import stat

from pcrfs.errors import DatasetError

NAME_MAX = 255      # bytes in one path component (Linux, and every filesystem it mounts)


def path_problem(path: bytes) -> str | None:
    """Why an index path (components joined by '/') is unsafe, or None if it is fine."""
    if not path:
        return "an empty path"
    if path.startswith(b"/"):
        return "an absolute path"
    if b"\0" in path:
        return "a NUL byte"
    for part in path.split(b"/"):
        if not part:
            return "an empty component"
        if part in (b".", b".."):
            return f"a '{part.decode()}' component"
        if len(part) > NAME_MAX:
            return f"a component of {len(part)} bytes (at most {NAME_MAX})"
    return None


def check_path(path: bytes, where: str) -> None:
    """DatasetError naming the path and the problem."""
    why = path_problem(path)
    if why is not None:
        raise DatasetError(f"{where}: unsafe image path {path[:300]!r} ({why}); "
                           "the dataset is refused")


def join_below(base: bytes, path: bytes, where: str) -> bytes:
    """base/path, refused (DatasetError) unless path is safe and the result stays below
    base (so no symlink already below base redirects it either: see export)."""
    check_path(path, where)
    out = os.path.join(base, path)
    if os.path.commonpath([os.path.realpath(base), os.path.realpath(os.path.dirname(out))]) \
            != os.path.realpath(base):
        raise DatasetError(f"{where}: {path[:300]!r} would be written outside "
                           f"{os.fsdecode(base)}; refused")
    return out


# A dataset is untrusted input (docs/SECURITY.md): a record or pack that is a symlink
# would let an index read any file the daemon can (root's, through an allow_other mount),
# and a FIFO would block the opening thread for good.  Neither is followed or waited on.
SAFE_OPEN = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def open_regular(path: str, dir_fd: int | None = None) -> int:
    """A read-only descriptor of path if it is a regular file that is not a symlink;
    OSError otherwise (ELOOP for a symlink, EINVAL for a FIFO, device or directory)."""
    fd = os.open(path, SAFE_OPEN, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd
