"""mount(2) of a /dev/fuse descriptor, for the processes that mount one and hand it on:
the CSI node plugin (pcrfs/csi) and the supervisor (fs/supervisor.py).  Root only, as
mount(2) is; libfuse's fusermount path stays the daemon's own (fs/mount.py)."""
from __future__ import annotations

import ctypes
import os

from pcrfs.errors import PcrfsError

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_NOATIME, MS_BIND = \
    1, 2, 4, 8, 32, 1024, 4096
MNT_DETACH = 2
# kernel mount options of a FUSE mount (fs/fuse/inode.c), as pcrfs's -o spells them
_FLAG_OPTIONS = {"ro": MS_RDONLY, "noexec": MS_NOEXEC, "noatime": MS_NOATIME}
_DATA_OPTIONS = ("allow_other", "default_permissions")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def is_mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def fuse_mount(target: str, options: set[str] | frozenset[str] = frozenset()) -> int:
    """Open /dev/fuse and mount it at target (fuse.pcrfs, nosuid, nodev, owned by the
    caller); the descriptor, close-on-exec.  options: pcrfs's pass-through -o names."""
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    flags = MS_NOSUID | MS_NODEV
    for o in options:
        flags |= _FLAG_OPTIONS.get(o, 0)
    data = ",".join([f"fd={fd}", "rootmode=40000", f"user_id={os.getuid()}",
                     f"group_id={os.getgid()}", *(o for o in _DATA_OPTIONS if o in options)])
    if _libc().mount(b"pcrfs", target.encode(), b"fuse.pcrfs", flags, data.encode()) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise PcrfsError(f"mount(2) at {target}: {os.strerror(err)}"
                         + (" (needs root or CAP_SYS_ADMIN)" if err == 1 else ""))
    return fd


def bind(source: str, target: str, readonly: bool = True) -> None:
    """A bind mount of source at target (read-only: a second, remounting call)."""
    libc = _libc()
    if libc.mount(source.encode(), target.encode(), None, MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise PcrfsError(f"bind mount {source} at {target}: {os.strerror(err)}")
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if readonly else 0)
    if libc.mount(None, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        libc.umount2(target.encode(), MNT_DETACH)
        raise PcrfsError(f"read-only bind mount at {target}: {os.strerror(err)}")


def unmount(target: str, lazy: bool = False) -> int:
    """0, or the errno of umount2(2) (EBUSY: files are open; lazy detaches anyway)."""
    if _libc().umount2(target.encode(), MNT_DETACH if lazy else 0) != 0:
        return ctypes.get_errno()
    return 0
