"""A mounted /dev/fuse descriptor, for the processes that mount one and hand it on: the
CSI node plugin (pcrfs/csi) and the supervisor (fs/supervisor.py).  Root calls mount(2);
an ordinary user gets the descriptor from the setuid fusermount3, which mounts and sends
it back over a socket (libfuse's _FUSE_COMMFD protocol), as libfuse does for itself."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import subprocess

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


FUSE_CONF = "/etc/fuse.conf"


def fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def user_allow_other() -> bool:
    """Whether /etc/fuse.conf lets ordinary users mount with allow_other."""
    try:
        with open(FUSE_CONF) as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def check_user_options(options: set[str] | frozenset[str]) -> None:
    """What fusermount3 would refuse an ordinary user, said before it is tried."""
    for opt in ("allow_other", "allow_root"):   # fusermount3 drops allow_root silently
        if os.geteuid() != 0 and opt in options and not user_allow_other():
            raise PcrfsError(f"-o {opt} as a user (uid {os.getuid()}) needs the line "
                             f"'user_allow_other' in {FUSE_CONF} (as root: echo "
                             f"user_allow_other >> {FUSE_CONF}), or mount as root")


def fuse_mount(target: str, options: set[str] | frozenset[str] = frozenset()) -> int:
    """Open /dev/fuse and mount it at target (fuse.pcrfs, nosuid, nodev, owned by the
    caller); the descriptor, close-on-exec.  options: pcrfs's pass-through -o names."""
    if os.geteuid() != 0:
        return _fusermount_mount(target, options)
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


def _fuse_device_hint(said: str, dev: str = "/dev/fuse") -> str:
    """fusermount3's "failed to open /dev/fuse" says nothing of why: the device's mode
    and owner, and the two usual mends."""
    if "/dev/fuse" not in said:
        return ""
    import grp
    import stat
    try:
        st = os.stat(dev)
    except OSError as e:
        return f" ({dev}: {e.strerror}; load the fuse module: modprobe fuse)"
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    # never advice to join the device's group when that is root's (or any the mode does
    # not open to a group): joining root's group is unsafe, and at 0600 useless
    mode = stat.S_IMODE(st.st_mode)
    grouped = group not in ("root", "wheel", "0") and mode & 0o060 == 0o060
    return (f" ({dev} is mode {mode:04o}, group {group}; distributions ship it 0666: "
            f"chmod 0666 {dev} (as root; a udev rule keeps it), "
            + (f"or add the user to group {group}: usermod -aG {group} USER)" if grouped else
               f"or give it a group of its own: groupadd -f fuse; chgrp fuse {dev}; "
               f"chmod 0660 {dev}; usermod -aG fuse USER)"))


def _fusermount_mount(target: str, options: set[str] | frozenset[str]) -> int:
    tool = fusermount()
    if tool is None:
        raise PcrfsError("mounting as a user needs fusermount3 (the fuse3 package)")
    check_user_options(options)
    opts = ",".join(["nosuid", "nodev", "fsname=pcrfs", "subtype=pcrfs", "rootmode=40000",
                     *sorted(o for o in options if o in _FLAG_OPTIONS or o in _DATA_OPTIONS)])
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        p = subprocess.run([tool, "-o", opts, "--", target], capture_output=True, text=True,
                           pass_fds=(theirs.fileno(),),
                           env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())})
        theirs.close()
        if p.returncode != 0:
            raise PcrfsError(f"{os.path.basename(tool)} could not mount {target}: "
                             f"{p.stderr.strip() or f'exit {p.returncode}'}"
                             + _fuse_device_hint(p.stderr))
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    if not fds:
        raise PcrfsError(f"{os.path.basename(tool)} mounted {target} but sent no descriptor")
    os.set_inheritable(fds[0], False)
    return fds[0]


def unmount(target: str, lazy: bool = False) -> int:
    """0, or the errno of umount2(2) (EBUSY: files are open; lazy detaches anyway).  An
    ordinary user's mounts go through fusermount3 -u."""
    if _libc().umount2(target.encode(), MNT_DETACH if lazy else 0) == 0:
        return 0
    err = ctypes.get_errno()
    if err != errno.EPERM or os.geteuid() == 0 or (tool := fusermount()) is None:
        return err
    p = subprocess.run([tool, "-u", *(["-z"] if lazy else []), target], capture_output=True,
                       text=True)
    if p.returncode == 0:
        return 0
    if "busy" in p.stderr:
        return errno.EBUSY
    return errno.EINVAL if "not found" in p.stderr else err     # EINVAL: not mounted
