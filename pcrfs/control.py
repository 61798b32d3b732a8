"""Client side of a mount's control files: switch MNT/dynamic between fidelities from
Python or a shell, without remounting.  Plain file I/O, so it works from any process
(a training script, a scheduler, another container sharing the mount)."""
from __future__ import annotations

import errno
import os

from pcrfs.errors import PcrfsError

CONTROL_FILE = os.path.join(".pcrfs", "control", "dynamic_fidelity")


def _control(mnt: str | os.PathLike) -> str:
    path = os.path.join(os.fspath(mnt), CONTROL_FILE)
    if not os.path.exists(path):
        raise PcrfsError(f"{os.fspath(mnt)} is not a pcrfs mount with a dynamic view "
                         f"(no {CONTROL_FILE})")
    return path


def get_fidelity(mnt: str | os.PathLike) -> int:
    """The fidelity MNT/dynamic serves now (k of qk)."""
    with open(_control(mnt), "rb") as f:
        return int(f.read().strip().lstrip(b"q"))


def set_fidelity(mnt: str | os.PathLike, k: int | str) -> int:
    """Serve MNT/dynamic at fidelity k ('q5', '5' or 5) from the next open on.  Files
    already open keep their fidelity.  Returns k once the kernel's cached sizes are
    invalidated.  ValueError for a fidelity the dataset does not have."""
    value = f"q{k}" if isinstance(k, int) else str(k).strip()
    path = _control(mnt)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, value.encode() + b"\n")
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise ValueError(f"{os.fspath(mnt)}: invalid fidelity {value!r}") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise PermissionError(e.errno, "only the mounting user or root may switch fidelity",
                                  path) from None
        if e.errno == errno.EROFS:
            raise PcrfsError(f"{os.fspath(mnt)} is mounted with -o ro: the dynamic fidelity "
                             f"is fixed (remount without ro)") from None
        raise
    return get_fidelity(mnt)
