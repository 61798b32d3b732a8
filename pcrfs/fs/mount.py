"""`pcrfs mount` / `pcrfs umount`: checks, daemonizing (or a supervisor), clean shutdown;
the options are fs/options.py's, the daemon fs/daemon.py's.

The parent process forks before anything heavy is imported, then waits on a readiness
pipe: the child writes "OK" only after pyfuse3.init() has mounted the filesystem, so when
`pcrfs mount` returns, the mount is live; otherwise it prints the child's error."""
from __future__ import annotations

import errno
import logging
import os
import re
import stat
import subprocess
import sys

from pcrfs.control import stale_mount
from pcrfs.errors import PcrfsError
from pcrfs.fs.daemon import NEEDS_SHIM, serve
from pcrfs.fs.options import MountOptions, kernel_options, lane_threads, parse_mount_options

FUSE_DEVICE = os.makedev(10, 229)   # /dev/fuse


def mounted_fd(mnt: str) -> int | None:
    """N when mnt is /dev/fd/N: a /dev/fuse descriptor that another process (a CSI driver,
    a privileged helper) opened and mounted with mount(2), then handed to this one.
    libfuse serves it as it is; nothing is mounted or unmounted here."""
    m = re.fullmatch(r"/dev/fd/(\d+)", mnt)
    return int(m.group(1)) if m else None


def check_mounted_fd(fd: int) -> None:
    try:
        st = os.fstat(fd)
    except OSError:
        raise PcrfsError(f"/dev/fd/{fd}: no such open descriptor (pass it to pcrfs, e.g. "
                         f"with pass_fds or systemd's socket/fd store)") from None
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != FUSE_DEVICE:
        raise PcrfsError(f"/dev/fd/{fd}: not a /dev/fuse descriptor")


def check_mountpoint(mnt: str, nonempty: bool) -> None:
    fd = mounted_fd(mnt)
    if fd is not None:
        return check_mounted_fd(fd)
    try:
        os.statvfs(mnt)  # never answered from the kernel's attribute cache
        st = os.stat(mnt)
    except FileNotFoundError:
        raise PcrfsError(f"mount point {mnt} does not exist") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise stale_mount(mnt) from None
        raise PcrfsError(f"mount point {mnt}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PcrfsError(f"mount point {mnt} is not a directory")
    if os.path.ismount(mnt):
        raise PcrfsError(f"{mnt} is already a mount point")
    if not nonempty and os.listdir(mnt):
        raise PcrfsError(f"mount point {mnt} is not empty (use -o nonempty to mount over it)")


class _JournalFormatter(logging.Formatter):
    """stderr under systemd: journald adds time and pid; "<N>" sets the priority."""
    PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                logging.CRITICAL: 2}

    def format(self, record):
        return f"<{self.PRIORITY.get(record.levelno, 6)}>{record.name}: {record.getMessage()}"


def _stderr_is_journal() -> bool:
    """True when systemd connected stderr to the journal ($JOURNAL_STREAM = dev:inode)."""
    try:
        dev, ino = (int(x) for x in os.environ.get("JOURNAL_STREAM", "").split(":"))
        st = os.fstat(2)
        return st.st_dev == dev and st.st_ino == ino
    except (ValueError, OSError):
        return False


def _setup_logging(logfile: str | None, debug: bool, foreground: bool) -> None:
    fmt = logging.Formatter("%(asctime)s pcrfs[%(process)d] %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = []
    if logfile:
        handlers.append(logging.FileHandler(logfile))
        handlers[-1].setFormatter(fmt)
    if foreground:
        handlers.append(logging.StreamHandler(sys.stderr))
        handlers[-1].setFormatter(_JournalFormatter() if _stderr_is_journal() else fmt)
    if not handlers:
        handlers.append(logging.NullHandler())
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, handlers=handlers,
                        force=True)


def mount(dst: str, mnt: str, *, foreground: bool, options: list[str] | None,
          dataset_opts: dict, logfile: str | None, debug: bool, workers: int,
          argv: list[str] | None = None) -> int:
    """dataset_opts: keyword arguments of Dataset (cache sizes, bandwidth limit, cache dir);
    argv: this command's arguments, which a supervisor's daemons run again."""
    mo = parse_mount_options(options)
    check_mountpoint(mnt, mo.nonempty)
    from pcrfs.fs import kmount, supervisor
    if logfile:
        logfile = os.path.abspath(logfile)    # both daemonize in /
    if mounted_fd(mnt) is None and supervisor.Session.from_env() is None:
        kmount.check_user_options(kernel_options(mo))
        if _supervised(mo, argv):
            try:
                return _supervise(mnt, mo, supervisor.daemon_command(argv, mnt), foreground,
                                  logfile, debug)
            except PcrfsError as e:
                # the default, where this libfuse cannot be resumed by the shim: serve
                # unsupervised, as before supervision was the default
                if mo.supervise is not None or NEEDS_SHIM not in str(e):
                    raise
                print(f"pcrfs: {e}: mounting unsupervised", file=sys.stderr)
                _setup_logging(logfile, debug, False)
                logging.getLogger("pcrfs.mount").warning("%s: mounting unsupervised", e)
    from pcrfs.storage.objclient import is_remote
    dst = dst if is_remote(dst) else os.path.abspath(dst)
    mnt = mnt if mounted_fd(mnt) is not None else os.path.abspath(mnt)
    if foreground:
        session = supervisor.Session.from_env()   # a detached supervisor's daemon: the log
        _setup_logging(logfile, debug, not (session and session.detach))   # file only
        try:
            return serve(dst, mnt, mo, dataset_opts, workers)
        except Exception as e:
            if session:
                session.failed(str(e))
                if isinstance(e, PcrfsError):   # the supervisor says it, once
                    raise SystemExit(2) from None
            raise
    return _daemonize(lambda ready: serve(dst, mnt, mo, dataset_opts, workers, ready),
                      logfile, debug)


def _supervised(mo: MountOptions, argv: list[str] | None) -> bool:
    """Supervision is the default wherever a supervisor can hold the mount's descriptor:
    root mounts with mount(2), an ordinary user through fusermount3.  -o supervise=no
    opts out; an explicit -o supervise that cannot be had is an error, the default is not."""
    from pcrfs.fs import kmount
    why = ("only `pcrfs mount` starts a supervisor" if argv is None else
           "an ordinary user's mount needs fusermount3 (the fuse3 package)"
           if os.geteuid() != 0 and kmount.fusermount() is None else "")
    if mo.supervise is False or (why and mo.supervise is None):
        return False
    if why:
        raise PcrfsError(f"-o supervise: {why}")
    return True


def _supervise(mnt: str, mo: MountOptions, command: list[str], foreground: bool,
               logfile: str | None, debug: bool) -> int:
    from pcrfs.fs.supervisor import Supervisor
    cwd = os.getcwd()
    mnt = os.path.abspath(mnt)

    def run(ready) -> int:
        sup = Supervisor(mnt, kernel_options(mo), lane_threads(mo), command, cwd,
                         mo.restart_limit)
        return sup.run(ready)
    if foreground:
        _setup_logging(logfile, debug, True)
        return run(None)
    return _daemonize(run, logfile, debug)


def _daemonize(work, logfile: str | None, debug: bool) -> int:
    """Fork; the child detaches and runs work(ready); this process returns once the
    child calls ready() (the mount is live), or raises the child's error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode(errors="replace")
        if msg.startswith("OK"):
            return 0
        os.waitpid(pid, 0)
        raise PcrfsError(msg.strip() or "the mount daemon exited before the mount was ready")
    # child: become a daemon, report readiness or the error through the pipe
    os.close(r)
    os.setsid()
    os.chdir("/")
    code = 0
    try:
        _setup_logging(logfile, debug, False)

        def ready():
            os.write(w, b"OK\n")
            os.close(w)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
        code = work(ready)
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        try:
            os.write(w, f"{e}\n".encode())
        except OSError:
            logging.getLogger("pcrfs.mount").exception("daemon failed")
        code = 1
    os._exit(code)


def umount(mnt: str, lazy: bool = False) -> None:
    from pcrfs.fs import kmount
    tool = kmount.fusermount()
    if tool is None:
        raise PcrfsError("fusermount3 not found (install the fuse3 package)")
    p = subprocess.run([tool, "-u", *(["-z"] if lazy else []), mnt], capture_output=True, text=True)
    if p.returncode == 0:
        return
    # fusermount refuses mounts it did not make (e.g. mount -t fuse.pcrfs as root).
    if os.geteuid() == 0:
        q = subprocess.run(["umount", *(["-l"] if lazy else []), mnt], capture_output=True, text=True)
        if q.returncode == 0:
            return
    if not os.path.lexists(mnt):
        raise PcrfsError(f"cannot unmount {mnt}: no such file or directory")
    # mountinfo, not os.path.ismount: a stale mount's lstat fails, so ismount says no
    if not kmount.is_mounted(os.path.abspath(mnt)):
        raise PcrfsError(f"cannot unmount {mnt}: not a mount point")
    said = p.stderr.strip()
    if not lazy and "busy" in (said + (q.stderr if os.geteuid() == 0 else "")).lower():
        raise PcrfsError(f"cannot unmount {mnt}: it is busy (a process has a file open or its "
                         f"working directory there: fuser -vm {mnt}); `pcrfs umount --lazy "
                         f"{mnt}` detaches it now and finishes when they close")
    raise PcrfsError(f"cannot unmount {mnt}: {said}")
