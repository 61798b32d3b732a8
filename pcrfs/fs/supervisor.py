"""Mounts that outlive their daemon: `pcrfs mount -o supervise`.

The kernel keeps a FUSE connection alive while any process holds a descriptor of it, and
pcrfs can be restarted under it because nothing a daemon hands the kernel is private to
that process: inode numbers are index ordinals, files are immutable, and file and
directory handles name their inode (fs/operations.py).  So a small supervisor process
owns the mount:

1. It opens /dev/fuse, mounts it (mount(2), fs/kmount.py), reads the kernel's INIT
   request itself and opens the lane's clones (FUSE_DEV_IOC_CLONE).  It keeps all of them.
2. It starts the serving daemon, `pcrfs mount DST /dev/fd/N -f`, with the descriptors and
   a Session in its environment.  The daemon's shim has libfuse process that INIT before
   anything else (csrc/fuse_shim.c, resume_session): the first daemon answers the kernel;
   every later one comes up as an initialised session without a new FUSE_INIT and asks
   the kernel to resend the requests its predecessor had read (FUSE_NOTIFY_RESEND, Linux
   6.9+).  Readers see a stall, not an error.
3. A daemon that dies (SIGKILL, OOM, crash) is started again at once; one that keeps
   dying backs off (RESTART_DELAYS), and after `restart_limit` failures in a row the
   supervisor answers every request with EIO itself: the mount fails, it does not hang.
4. `pcrfs upgrade MNT` (SIGUSR1 here) asks the daemon to stop serving without unmounting
   (SIGUSR2, it exits EX_HANDOVER) and starts the pcrfs now installed in its place.
5. SIGTERM, SIGINT or SIGHUP unmount; an unmount (umount, `pcrfs umount`) ends the
   daemon (ENODEV) and then the supervisor.

A kernel without FUSE_NOTIFY_RESEND (Linux < 6.9; its INIT lacks FUSE_HAS_RESEND) cannot
give a new daemon the requests a dead one had read.  There each daemon's lane threads read clones
made for it alone (none reads the session's descriptor), and it records the requests it
hands to Python in a memfd until they are answered.  When it dies the supervisor answers
each recorded one with EIO on its clone, then closes the clones, which ends the few the
lane was answering itself with ECONNABORTED.  Everything after the restart works."""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from pcrfs.errors import PcrfsError
from pcrfs.fs import kmount
from pcrfs.fs.notify import sd_notify

log = logging.getLogger("pcrfs.supervisor")

ENV = "PCRFS_SESSION"
EX_HANDOVER = 75                  # a daemon that stopped serving on purpose (EX_TEMPFAIL)
FUSE_DEV_IOC_CLONE = 0x8004E500   # _IOR(229, 0, uint32_t)
IN_HEADER = struct.Struct("<IIQQ")    # len, opcode, unique, nodeid (of fuse_in_header)
OUT_HEADER = struct.Struct("<IiQ")    # len, error, unique
FUSE_FORGET, FUSE_INIT, FUSE_INTERRUPT, FUSE_BATCH_FORGET = 2, 26, 36, 42
FUSE_NOTIFY_RESEND = 7
FUSE_INIT_EXT, FUSE_HAS_RESEND_HI = 1 << 30, 1 << (39 - 32)
INFLIGHT = struct.Struct("<QII")     # csrc/fuse_shim.c struct inflight: unique, lane thread
INFLIGHT_SLOTS = 8192
RESTART_DELAYS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)   # by failures in a row
STABLE_S = 2.0                    # a daemon that served this long resets the count
RESTART_LIMIT = 5


def can_resend(init: bytes) -> bool:
    """Whether the kernel that sent this INIT request resends the requests a dead daemon
    had read (FUSE_HAS_RESEND, flags2 bit 7, which Linux sets with FUSE_INIT_EXT)."""
    if os.environ.get("PCRFS_TEST_NO_RESEND"):    # tests: as on a kernel before 6.9
        return False
    # fuse_in_header is 40 bytes, then major, minor, max_readahead, flags; flags2 follows
    # only from Linux 5.17 on: an older kernel's INIT is 56 bytes and has no FUSE_INIT_EXT
    at = 40 + 12
    if len(init) < at + 8:
        return False
    flags, flags2 = struct.unpack_from("<II", init, at)
    return bool(flags & FUSE_INIT_EXT) and bool(flags2 & FUSE_HAS_RESEND_HI)


def protocol_of(init: bytes) -> str:
    """The kernel's FUSE protocol version, "7.N", from its INIT request."""
    major, minor = struct.unpack_from("<II", init, 40)
    return f"{major}.{minor}"


def as_test_kernel(init: bytes) -> bytes:
    """tests/test_kernels.py: another kernel's recorded INIT ($PCRFS_TEST_INIT, a file of
    its bytes in hex, '#' comments) with this kernel's unique id, in place of this one's:
    the supervisor and its daemons then parse, answer and resume as on that kernel."""
    path = os.environ.get("PCRFS_TEST_INIT")
    if not path:
        return init
    with open(path) as f:
        other = bytes.fromhex("".join(ln.split("#", 1)[0] for ln in f).strip())
    return other[:8] + init[8:16] + other[16:]


def _request_capacity() -> int:
    """A read buffer for any request of this kernel (as csrc/fuse_shim.c sizes its own)."""
    try:
        with open("/proc/sys/fs/fuse/max_pages_limit") as f:
            pages = int(f.read())
    except (OSError, ValueError):
        pages = 256
    return pages * 4096 + 4096


@dataclass
class Session:
    """What a supervised daemon gets in $PCRFS_SESSION."""
    init: str                     # the kernel's INIT request, hex
    replay: bool                  # a daemon after the first: resume, resend
    clones: list[int] = field(default_factory=list)
    control: int = -1             # pipe to the supervisor ("READY\n")
    supervisor: int = 0           # its pid
    restarts: int = 0             # daemons restarted after dying
    upgrades: int = 0             # daemons replaced on purpose
    resend: bool = True           # the kernel can resend requests in flight (Linux 6.9+)
    inflight: int = -1            # without resend: the memfd of requests in flight
    detach: bool = False          # the supervisor runs detached: so does the daemon, once ready
    mountpoint: str = ""          # the mount's path (the daemon is given /dev/fd/N)

    @classmethod
    def from_env(cls) -> Session | None:
        text = os.environ.get(ENV)
        if not text:
            return None
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as e:
            raise PcrfsError(f"${ENV} is not a supervisor's session: {e}") from None

    def epoch(self) -> int:
        """This daemon's number under its supervisor (in the handles Python gives out)."""
        return (self.restarts + self.upgrades) % (1 << 23)

    def ready(self) -> None:
        self._say(b"READY\n")
        if self.detach:     # its errors until now went to the terminal of `pcrfs mount`
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)


    def failed(self, reason: str) -> None:
        """The daemon could not start serving: why, for the supervisor to report."""
        self._say(b"ERROR " + reason.encode(errors="replace").replace(b"\n", b" ") + b"\n")

    def _say(self, line: bytes) -> None:
        if self.control < 0:
            return
        try:
            os.write(self.control, line)
            os.close(self.control)
        except OSError:
            pass
        self.control = -1


class Supervisor:
    def __init__(self, mnt: str, fuse_options: set[str], threads: int, command: list[str],
                 cwd: str, restart_limit: int = RESTART_LIMIT):
        self.mnt, self.command, self.cwd = mnt, command, cwd
        self.restart_limit = restart_limit
        self.fd = kmount.fuse_mount(mnt, fuse_options)
        try:
            self.init = self._read_init()
            self.resend = can_resend(self.init)
            self.threads = max(1, threads)
            # without resend, requests read on a descriptor nobody reads again would wait
            # forever: each daemon gets clones of its own (fuse_shim.c own_clones), and
            # the requests it leaves are failed on them (_fail_in_flight)
            self.clones = [self._clone() for _ in range(self.threads - 1)] if self.resend else []
            self.inflight = -1 if self.resend else os.memfd_create("pcrfs-inflight")
            if self.inflight >= 0:
                os.ftruncate(self.inflight, INFLIGHT_SLOTS * INFLIGHT.size)
        except BaseException:
            kmount.unmount(mnt, lazy=True)
            os.close(self.fd)
            raise
        self.child: subprocess.Popen | None = None
        self.restarts = self.upgrades = 0
        self.initialised = False      # a daemon has answered the kernel's INIT
        self.stopping = self.upgrading = False
        self.detach = False
        self.why = ""                 # what the last daemon said when it could not start

    def _read_init(self) -> bytes:
        buf = os.read(self.fd, _request_capacity())   # queued by mount(2): no wait
        n, opcode = struct.unpack_from("<II", buf)
        if opcode != FUSE_INIT or n != len(buf):
            raise PcrfsError(f"expected the kernel's INIT on a new mount, got opcode {opcode}")
        return as_test_kernel(buf)

    def _clone(self) -> int:
        c = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(c, FUSE_DEV_IOC_CLONE, struct.pack("I", self.fd))
        except OSError:
            os.close(c)
            raise
        return c

    # -- daemons -------------------------------------------------------------------
    def _start(self) -> tuple[subprocess.Popen, int]:
        if not self.resend:             # this daemon's own clones
            self.clones = [self._clone() for _ in range(self.threads)]
        r, w = os.pipe2(os.O_CLOEXEC)
        session = Session(init=self.init.hex(), replay=self.initialised, clones=self.clones,
                          control=w, supervisor=os.getpid(), restarts=self.restarts,
                          upgrades=self.upgrades, detach=self.detach, resend=self.resend,
                          inflight=self.inflight, mountpoint=self.mnt)
        env = {**os.environ, ENV: json.dumps(asdict(session))}
        cmd = [a if a != "{fd}" else f"/dev/fd/{self.fd}" for a in self.command]
        fds = (self.fd, *self.clones, w, *([self.inflight] if self.inflight >= 0 else []))
        child = subprocess.Popen(cmd, pass_fds=fds, env=env, cwd=self.cwd)
        os.close(w)
        return child, r

    def _wait_ready(self, r: int) -> bool:
        """True once the daemon serves; False if it ended first (self.why: its reason)."""
        with os.fdopen(r, "rb") as f:
            line = f.readline()
        self.why = line[6:].decode(errors="replace").strip() if line.startswith(b"ERROR ") else ""
        return line.startswith(b"READY")

    def _connected(self) -> bool:
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        return not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))

    def run(self, ready=None) -> int:
        """Serve until unmounted.  ready(): called once the first daemon serves (then
        the mount is live); if that daemon fails first, the mount is undone and the error
        raised."""
        self.detach = ready is not None
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_upgrade)
        failures = 0
        while not self.stopping and self._connected():
            self.child, r = self._start()
            started = time.monotonic()
            if self._wait_ready(r):
                if not self.initialised:
                    self.initialised = True
                    log.info("serving %s: daemon %d", self.mnt, self.child.pid)
                    # systemd's main process is this one (NotifyAccess=main)
                    sd_notify(f"READY=1\nSTATUS=serving {self.mnt} (supervised)")
                    if ready:
                        ready()
            elif not self.initialised:
                code = self.child.wait()
                self._unmount(lazy=True)
                raise PcrfsError(f"the daemon failed before serving: "
                                 f"{self.why or f'it exited ({_how(code)})'}")
            code = self.child.wait()
            served = time.monotonic() - started
            pid, self.child = self.child.pid, None
            if not self.resend:
                self._fail_in_flight()
            upgrading, self.upgrading = self.upgrading, False
            if self.stopping or not self._connected():
                log.info("daemon %d ended (%d): unmounted", pid, code)
                break
            if code == EX_HANDOVER:
                if upgrading:
                    self.upgrades += 1
                    log.info("daemon %d handed over (upgrade %d)", pid, self.upgrades)
                else:
                    self.restarts += 1
                    log.warning("daemon %d stopped without unmounting: restarting", pid)
                continue
            failures = 1 if served >= STABLE_S else failures + 1
            self.restarts += 1
            if failures > self.restart_limit:
                log.error("daemon %d died (%s), %d times in a row: answering EIO until "
                          "unmounted", pid, _how(code), failures)
                self._serve_eio()
                break
            delay = RESTART_DELAYS[min(failures - 1, len(RESTART_DELAYS) - 1)]
            log.warning("daemon %d died (%s) after %.1f s: restart %d in %.2f s", pid,
                        _how(code), served, self.restarts, delay)
            self._sleep(delay)
        sd_notify("STOPPING=1")
        self._close()
        return 0

    def _fail_in_flight(self) -> None:
        """Without resend: answer EIO to each request the dead daemon had handed to its
        Python and not answered, on the clone it was read from; closing the clones then
        ends the rest (the few the lane was answering itself) with ECONNABORTED."""
        table = os.pread(self.inflight, INFLIGHT_SLOTS * INFLIGHT.size, 0)
        failed = 0
        for unique, lane, _ in INFLIGHT.iter_unpack(table):
            if unique and lane < len(self.clones):
                try:
                    os.write(self.clones[lane], OUT_HEADER.pack(OUT_HEADER.size, -errno.EIO,
                                                                 unique))
                    failed += 1
                except OSError:
                    pass        # answered meanwhile, or interrupted
        os.pwrite(self.inflight, bytes(len(table)), 0)
        for c in self.clones:
            os.close(c)
        self.clones = []
        if failed:
            log.warning("%d requests in flight failed with EIO (no FUSE_NOTIFY_RESEND)",
                        failed)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))

    def _serve_eio(self) -> None:
        """Answer every request with EIO (the requests the last daemon had read first)
        until the mount goes (ENODEV)."""
        if self.resend:
            try:
                os.write(self.fd, OUT_HEADER.pack(16, FUSE_NOTIFY_RESEND, 0))
            except OSError:
                pass
        cap = _request_capacity()
        while not self.stopping:
            try:
                buf = os.read(self.fd, cap)
            except OSError as e:
                if e.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return      # ENODEV: unmounted
            if len(buf) < IN_HEADER.size:
                continue
            _, opcode, unique, _ = IN_HEADER.unpack_from(buf)
            if opcode in (FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_INTERRUPT):
                continue    # no reply expected
            try:
                os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size, -errno.EIO, unique))
            except OSError:
                pass        # ENOENT: interrupted meanwhile

    # -- signals -------------------------------------------------------------------
    def _on_stop(self, sig, _frame) -> None:
        log.info("signal %d: unmounting %s", sig, self.mnt)
        self.stopping = True
        self._unmount(lazy=False)

    def _on_upgrade(self, _sig, _frame) -> None:
        if self.child is not None and not self.upgrading:
            self.upgrading = True
            log.info("upgrade: daemon %d hands over", self.child.pid)
            self.child.send_signal(signal.SIGUSR2)

    def _unmount(self, lazy: bool) -> None:
        err = kmount.unmount(self.mnt)
        if err == errno.EBUSY or (err and lazy):
            err = kmount.unmount(self.mnt, lazy=True)
        if err and err != errno.EINVAL:     # EINVAL: not mounted any more
            log.error("umount %s: %s", self.mnt, os.strerror(err))

    def _close(self) -> None:
        for fd in (*self.clones, self.fd, *([self.inflight] if self.inflight >= 0 else [])):
            os.close(fd)
        self.clones = []


def upgrade(mnt: str, timeout: float = 120.0) -> tuple[int, int]:
    """Have the supervisor of mnt replace its daemon; (old pid, new pid) once the new one
    serves."""
    from pcrfs.control import read_stats
    stats = read_stats(mnt)
    sup = stats.get("supervisor")
    if not sup:
        raise PcrfsError(f"{mnt} is not supervised (mounted with -o supervise=no, or on a "
                         "descriptor another process holds): remount it to upgrade it")
    old, before = stats["pid"], stats.get("upgrades", 0)
    try:
        os.kill(sup["pid"], signal.SIGUSR1)
    except ProcessLookupError:
        raise PcrfsError(f"{mnt}: its supervisor ({sup['pid']}) is gone") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = read_stats(mnt)     # waits in the kernel while no daemon serves
        if stats["pid"] != old and stats.get("upgrades", 0) > before:
            return old, stats["pid"]
        time.sleep(0.05)
    raise PcrfsError(f"{mnt}: no new daemon within {timeout:.0f} s (see the mount's log)")


def _how(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def daemon_command(argv: list[str], mnt: str) -> list[str]:
    """The serving daemon's command: this pcrfs mount's own arguments, on the supervisor's
    descriptor ("{fd}"), in the foreground.  -P: the caller's working directory (maybe a
    source checkout) is not put on sys.path, so the installed pcrfs runs."""
    args = list(argv)
    for i in range(len(args) - 1, -1, -1):
        if args[i] == mnt:
            args[i] = "{fd}"
            break
    else:
        raise PcrfsError(f"cannot find the mount point {mnt} among the arguments")
    return [sys.executable, "-P", "-m", "pcrfs.cli", *args, "--foreground"]
