"""`pcrfs mount` / `pcrfs umount`: option handling, checks, daemonizing, clean shutdown.

The parent process forks before anything heavy is imported, then waits on a readiness
pipe: the child writes "OK" only after pyfuse3.init() has mounted the filesystem, so when
`pcrfs mount` returns, the mount is live; otherwise it prints the child's error."""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass, field

from pcrfs.errors import PcrfsError
from pcrfs.fs.listing import MODES
from pcrfs.storage.budget import LANE_SHARE, OPEN_SHARE, STATIC_OPEN_SHARE
from pcrfs.storage.cache import POLICIES

# FUSE / kernel options passed through to libfuse.
PASS_THROUGH = {"allow_other", "allow_root", "default_permissions", "ro", "nosuid", "suid",
                "nodev", "dev", "noexec", "exec", "noatime", "atime", "relatime",
                "sync", "async", "dirsync"}
# Options mount(8), fstab and systemd add that mean nothing to a FUSE daemon.
IGNORED = {"_netdev", "nofail", "noauto", "auto", "user", "users", "nouser", "owner",
           "defaults", "rw", "nonempty"}


@dataclass
class MountOptions:
    fuse: set[str] = field(default_factory=set)
    nonempty: bool = False
    ignored: list[str] = field(default_factory=list)
    fidelity: str | None = None     # initial fidelity of MNT/dynamic (default: qG)
    readdirplus: str = "auto"       # do listed files carry attributes (fs/listing.py)
    fast_lane: bool = True          # warm-epoch requests answered in C (fs/kernel_shim.py)
    lane_priority: str = "realtime"  # SCHED_FIFO for the first lane thread, all, or none
    lane_threads: int = 0           # lane threads (0: one per core)
    lane_cold: bool = True          # cold q-view reads of local records answered in C
    lane_lookup: bool = True        # ... and LOOKUP of their names (segtab.Names)
    skip_open: bool = False         # no OPEN/RELEASE round trips (fs/kernel_shim.py)
    default_permissions: bool = True  # kernel checks modes; off only if asked explicitly
    cache_policy: str = "lru"       # admission/eviction of the cache tiers (storage/cache.py)
    metrics: tuple[str, int] | None = None    # Prometheus endpoint (pcrfs/metrics.py)
    metrics_textfile: str | None = None       # ... or a file for node-exporter
    metrics_labels: dict[str, str] = field(default_factory=dict)
    metrics_interval: float = 15.0            # textfile rewrites
    mix: float | None = None        # raw share of MNT/mix (pcrfs/liquid.py)
    mix_fidelity: int | None = None
    hold: int = 0                   # bytes of mix/raw files held in memory (static)
    supervise: bool = False         # a supervisor holds the mount across daemons
    restart_limit: int = 5          # ... and gives up after this many failures in a row


def _split_options(value: str) -> list[str]:
    """Comma-separated options; NAME=VALUE items right after metrics_labels= are more
    labels (so -o metrics_labels=team=vision,job=r50 reads as the user meant)."""
    out: list[str] = []
    for opt in filter(None, (o.strip() for o in value.split(","))):
        name = opt.split("=", 1)[0]
        if out and out[-1].startswith("metrics_labels=") and "=" in opt \
                and name not in OPTIONS:
            out[-1] += ";" + opt
        else:
            out.append(opt)
    return out


# -- pcrfs's own -o options: one row each (name -> parser, usage, value when bare) -----
class _Expected(ValueError):
    """A value outside the option's form: the message says NAME=<this>."""


def _choice(*values: str):
    def parse(v: str) -> str:
        if v not in values:
            raise _Expected(", ".join(values[:-1]) + " or " + values[-1])
        return v
    return parse


def _yes_no(v: str) -> bool:
    return _choice("yes", "no")(v) == "yes"


def _int_in(lo: int, hi: int):
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            n = lo - 1
        if not lo <= n <= hi:
            raise _Expected(f"N, {lo} to {hi}")
        return n
    return parse


def _seconds(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise ValueError("expected a positive number of seconds")
    return x


def _path(v: str) -> str:
    if not v:
        raise ValueError("no path")
    return v


def _metrics_address(v: str):
    from pcrfs import metrics
    return metrics.parse_address(v)


def _share(v: str) -> float:
    from pcrfs.liquid import parse_share
    return parse_share(v, f"-o mix={v}")


def _fidelity_k(v: str) -> int:
    from pcrfs.views.control import parse_fidelity
    return parse_fidelity(v, 255)


def _size(v: str) -> int:
    from pcrfs.storage.throttle import parse_size
    return parse_size(v)


@dataclass(frozen=True)
class Option:
    parse: object                   # value -> MountOptions field (ValueError: why not)
    usage: str                      # as the help and the errors spell it
    bare: object = None             # the value of the option given without "=VALUE"
    field: str = ""                 # MountOptions field, if not the option's name


OPTIONS: dict[str, Option] = {
    "fidelity": Option(str, "fidelity=K"),
    "readdirplus": Option(_choice(*MODES), "readdirplus=auto|yes|no"),
    "fast_lane": Option(_yes_no, "fast_lane=yes|no"),
    "lane_priority": Option(_choice("realtime", "all", "normal"),
                            "lane_priority=realtime|all|normal"),
    "lane_threads": Option(_int_in(1, 256), "lane_threads=N"),
    "lane_cold": Option(_yes_no, "lane_cold=yes|no"),
    "lane_lookup": Option(_yes_no, "lane_lookup=yes|no"),
    "skip_open": Option(_yes_no, "skip_open=yes|no"),
    "cache_policy": Option(_choice(*POLICIES), "cache_policy=lru|static"),
    "metrics": Option(_metrics_address, "metrics=[HOST:]PORT"),
    "metrics_textfile": Option(_path, "metrics_textfile=PATH"),
    "metrics_labels": Option(None, "metrics_labels=K=V,..."),    # accumulates: below
    "metrics_interval": Option(_seconds, "metrics_interval=SECONDS"),
    "mix": Option(_share, "mix=R"),
    "mix_fidelity": Option(_fidelity_k, "mix_fidelity=K"),
    "hold": Option(_size, "hold=SIZE"),
    "supervise": Option(_yes_no, "supervise[=yes|no]", bare=True),
    "restart_limit": Option(_int_in(0, 1000), "restart_limit=N"),
}
FLAGS = {"nonempty": "nonempty", "no_default_permissions": "default_permissions"}


def parse_mount_options(values: list[str] | None) -> MountOptions:
    from pcrfs import metrics
    mo = MountOptions()
    for value in values or []:
        for opt in _split_options(value):
            name, eq, arg = opt.partition("=")
            spec = OPTIONS.get(name)
            if opt in FLAGS:
                setattr(mo, FLAGS[opt], opt == "nonempty")
            elif spec is not None and (eq or spec.bare is not None):
                if name == "metrics_labels":
                    mo.metrics_labels.update(metrics.parse_labels(arg))
                    continue
                try:
                    parsed = spec.parse(arg) if eq else spec.bare
                except _Expected as e:
                    raise PcrfsError(f"-o {opt}: expected {name}={e}") from None
                except ValueError as e:
                    raise PcrfsError(f"-o {opt}: {e}") from None
                setattr(mo, spec.field or name, parsed)
            elif opt in PASS_THROUGH:
                mo.fuse.add(opt)
            elif opt in IGNORED or opt.startswith(("x-", "comment=")):
                mo.ignored.append(opt)
            else:
                known = PASS_THROUGH | set(FLAGS) | {o.usage for o in OPTIONS.values()}
                raise PcrfsError(f"unknown mount option {opt!r} (supported: "
                                 f"{', '.join(sorted(known))})")
    if mo.skip_open and not mo.fast_lane:
        raise PcrfsError("-o skip_open=yes needs the fast lane: it is the lane that tells "
                         "the kernel to stop sending OPEN (drop fast_lane=no)")
    return mo


FUSE_DEVICE = os.makedev(10, 229)   # /dev/fuse


def mounted_fd(mnt: str) -> int | None:
    """N when mnt is /dev/fd/N: a /dev/fuse descriptor that another process (a CSI driver,
    a privileged helper) opened and mounted with mount(2), then handed to this one.
    libfuse serves it as it is; nothing is mounted or unmounted here."""
    m = re.fullmatch(r"/dev/fd/(\d+)", mnt)
    return int(m.group(1)) if m else None


def kernel_options(mo: MountOptions) -> set[str]:
    """The mount's kernel options.  Not "ro" unless asked: the daemon refuses every write
    itself (EROFS), and .pcrfs/control/dynamic_fidelity must stay writable.  Under
    skip_open no OPEN reaches the daemon to refuse an open for writing, and nothing is
    writable, so there the kernel refuses it."""
    options = set(mo.fuse) | ({"ro"} if mo.skip_open else set())
    if mo.default_permissions:
        options.add("default_permissions")
    else:
        options.discard("default_permissions")
    return options


def lane_threads(mo: MountOptions) -> int:
    return (mo.lane_threads or os.cpu_count() or 1) if mo.fast_lane else 1


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
            raise PcrfsError(f"{mnt} is a stale mount (Transport endpoint is not connected): "
                             f"run `pcrfs umount {mnt}` first") from None
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


def serve(dst: str, mnt: str, mo: MountOptions, dataset_opts: dict, workers: int,
          ready=None) -> None:
    """Open the dataset, mount, report readiness, run until unmounted or signalled."""
    _few_malloc_arenas()
    from pcrfs.fs import kernel_shim
    from pcrfs.fs.supervisor import EX_HANDOVER, Session
    session = Session.from_env()    # serving a mount a supervisor holds (fs/supervisor.py)
    if mo.fast_lane or session:
        kernel_shim.load()  # before pyfuse3 is loaded: it interposes two libfuse calls
    if session and not kernel_shim.resume(bytes.fromhex(session.init), session.replay,
                                           session.clones, own_clones=not session.resend,
                                           epoch=session.epoch(), inflight=session.inflight):
        raise PcrfsError(f"cannot serve a supervised mount without the shim: "
                         f"{kernel_shim.why_not or 'INIT refused'}")
    import pyfuse3
    import trio

    from pcrfs.dataset import open_dataset
    from pcrfs.fs.operations import TIMEOUT, PcrfsOperations
    from pcrfs.storage.fds import raise_nofile_limit
    from pcrfs.views.control import parse_fidelity
    nofile = raise_nofile_limit()   # before the dataset sizes its descriptor cache from it
    from pcrfs.liquid import MixOptions
    try:
        ds = open_dataset(dst, **dataset_opts, cache_policy=mo.cache_policy,
                          mix=MixOptions(mo.mix, mo.mix_fidelity, mo.hold))
    except ValueError as e:     # a mix fidelity beyond this dataset's groups
        raise PcrfsError(str(e)) from None
    if not ds.index.numbered:
        ds.close()
        raise PcrfsError(
            f"{dst}: built by an older pcrfs, its index has no inode numbers; upgrade it "
            "with `pcrfs reindex DST` (for a dataset in object storage: reindex a local copy "
            "and push it again)")
    fds = getattr(ds.storage, "fds", None)
    if fds is not None:
        logging.getLogger("pcrfs.mount").info(
            "open-file limit %d: up to %d record files kept open", nofile, fds.capacity)
    try:
        fidelity = parse_fidelity(mo.fidelity, ds.groups) if mo.fidelity else ds.groups
    except ValueError as e:
        ds.close()
        raise PcrfsError(f"fidelity: {e}") from None
    _warm_index(ds)
    # the memory budget's shares (storage/budget.py); the memory tier keeps the rest
    lane = mo.fast_lane
    static = mo.cache_policy == "static"
    if static:   # the lane's store is the pinned set: it takes what the others leave
        held = ds.carve("open_files", ds.budget.total // STATIC_OPEN_SHARE)
        lane_store = ds.carve("lane_store", ds.budget.remaining) if lane else 0
        if lane:
            ds.pin_in_lane(lane_store)
    else:
        lane_store = ds.carve("lane_store", ds.budget.total // LANE_SHARE) if lane else 0
        held = ds.carve("open_files", ds.budget.total // OPEN_SHARE)
    ops = PcrfsOperations(ds, workers=workers, fidelity=fidelity, readdirplus=mo.readdirplus,
                          held_bytes=held, skip_open=mo.skip_open)
    options = {"fsname=pcrfs", "subtype=pcrfs"} | kernel_options(mo)
    exporter = _start_metrics(mo, ops, ds, mnt)
    kernel_shim.want(*ops.fast_inodes if lane else (0, 0),
                     realtime={"realtime": 1, "all": 256, "normal": 0}[mo.lane_priority],
                     skip_open=mo.skip_open, threads=lane_threads(mo))
    if lane and logging.getLogger("pcrfs.fs").isEnabledFor(logging.DEBUG):
        kernel_shim.trace(_log_fd())    # --debug: the lane's requests traced, not hidden
    if lane:   # images the lane serves itself
        kernel_shim.configure_store(lane_store, ops.uid, ops.gid,
                                    ops.mtime_ns, ops.BLKSIZE, int(TIMEOUT), pinned=static)
    pyfuse3.init(ops, mnt, options)
    from pcrfs.fs.notify import sd_notify
    log = logging.getLogger("pcrfs.mount")
    if session:
        _resumed(session, ds, ops, log)
    if lane and not kernel_shim.running():
        ds.uncarve("lane_store")     # its share (the pinned set, under static) to Python
        log.warning("no fast lane, every request goes through Python (slower warm epochs): "
                    "%s", kernel_shim.why_not or "pyfuse3 did not call the shim")
        if mo.skip_open:
            log.warning("-o skip_open has no effect without the fast lane")
    log.info("mounted %s on %s (%d views)", dst, mnt, len(ds.views))
    segtab = None
    if lane and kernel_shim.running():
        log.info("fast lane: %d threads", kernel_shim.threads())
        if not mo.skip_open:    # (without OPEN, dynamic/ files are read by their own inode)
            kernel_shim.alias_tree(ops.root.ids[b"dynamic"])
            ops.lane_aliases = True
        if mo.lane_cold:
            segtab = _serve_cold(ds, ops, mo, log)
    if ready:
        ready()
    if session:
        session.ready()
    sd_notify(f"READY=1\nSTATUS=serving {dst} on {mnt}")  # systemd Type=notify
    handover = False

    async def main():
        ops.loop.bind()             # the metrics threads take snapshots on this thread
        async with trio.open_nursery() as nursery:
            async def on_signal():
                nonlocal handover
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                               signal.SIGUSR2) as sigs:
                    async for s in sigs:
                        # supervised: stop serving, leave the mount to the next daemon
                        handover = session is not None and s in (signal.SIGUSR2,
                                                                 signal.SIGTERM)
                        log.info("signal %d: %s", s,
                                 "handing over" if handover else "unmounting")
                        pyfuse3.terminate()
                        return
            nursery.start_soon(on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        sd_notify("STOPPING=1")
        if segtab is not None:
            segtab.join()           # installed or given up before the lane stops
        kernel_shim.stop()          # joined before libfuse closes /dev/fuse
        if lane:
            log.info("fast lane stopped")
        pyfuse3.close(unmount=not handover)
        if exporter is not None:
            exporter.stop()
        ds.close()
        log.info("handed over %s" if handover else "unmounted %s", mnt)
    return EX_HANDOVER if handover else 0


def _resumed(session, ds, ops, log) -> None:
    """A supervised daemon: after a restart, name the inodes the kernel kept, and say
    whether the requests in flight come back."""
    from pcrfs.fs import kernel_shim
    from pcrfs.fs.recover import InodeRecovery
    ops.session = {"supervisor_pid": session.supervisor, "restarts": session.restarts,
                   "upgrades": session.upgrades}
    ops.fh_epoch = session.epoch()      # handles never a predecessor's (operations._fh)
    if not session.replay:
        return
    ops.recovery = InodeRecovery(ops.root, ds.index, ops.lane_names)
    rc = kernel_shim.resent()
    if not session.resend:
        log.warning("took over the mount (restart %d, upgrade %d) on a kernel that cannot "
                    "resend requests (FUSE_NOTIFY_RESEND, Linux 6.9): those in flight at "
                    "the restart failed once (EIO)%s", session.restarts, session.upgrades,
                    "" if kernel_shim.own_clones() else
                    "; this libfuse cannot route replies to clones, so they wait instead")
    elif rc == 1:
        log.info("took over the mount (restart %d, upgrade %d): the kernel resends the "
                 "requests in flight", session.restarts, session.upgrades)
    else:
        log.warning("took over the mount, but the kernel did not resend the requests in "
                    "flight (%s; FUSE_NOTIFY_RESEND needs Linux 6.9): their callers wait "
                    "until interrupted", os.strerror(-rc) if rc < 0 else "not asked")


def _serve_cold(ds, ops, mo: MountOptions, log) -> None:
    """Hand the lane the segment table, so it serves q-view files it has never seen from
    the records itself (csrc/lane_cold.c).  Only where the bytes are on this machine and
    nothing else must see each read: local records, no bandwidth limit (it meters reads
    in Python), no static cache (it pins images in Python).  The table is derived from the
    index in a thread; until it is in place, reads go through Python as before."""
    import threading

    from pcrfs.storage.local import LocalStorage
    from pcrfs.views.qk import QView
    why = ("records not local" if not isinstance(ds.storage, LocalStorage)
           else "a bandwidth limit is set" if ds.throttle is not None
           else "cache_policy=static" if mo.cache_policy != "lru" else "")
    if why:
        log.info("fast lane: cold reads through Python (%s)", why)
        return None
    views = {tree: v.k for tree, v in ops.root.trees.items() if isinstance(v, QView)}
    lo, hi = ops.fast_inodes        # raw/ and mix/ only while page-cached (no -o hold)
    formats = {v.name: tree for tree, v in ops.root.trees.items()
               if lo <= tree << 56 < hi and v.name in ("raw", "mix")}

    def run():
        from pcrfs.format import segtab
        from pcrfs.fs import kernel_shim
        try:
            # written by build/reindex (mapped, shared with the page cache), else derived
            table, names = segtab.load_file(ds.root, ds.index, ds.manifest)
            source = "file"
            if table is None:
                log.info("fast lane: deriving the segment table (%s)", names)
                table, names, source = segtab.derive(ds.index, ds.groups), None, "derived"
            why = kernel_shim.serve_cold(table, ds.storage.root, ds.storage.fds.capacity // 2,
                                         views, source)
            if not why and formats:
                why = _serve_raw(ds, ops, formats, table)
            if not why and mo.lane_lookup and ds.index.numbered:
                why = _serve_names(ds, ops, views, formats, table, names)
        except Exception as e:   # noqa: BLE001 - the mount goes on through Python
            why = f"{type(e).__name__}: {e}"
        if why:
            log.warning("fast lane: cold reads through Python (%s)", why)
        else:
            log.info("fast lane: cold reads of %d views answered in C (%d bytes of "
                     "segment table and names)", len(views) + len(formats),
                     kernel_shim.table_bytes())
    t = threading.Thread(target=run, name="pcrfs-segtab", daemon=True)
    t.start()
    return t


def _serve_names(ds, ops, views: dict[int, int], formats: dict[str, int], table,
                 names=None) -> str:
    """LOOKUP by name in C: of q-view files (the source's names; `names` if the table file
    had them), and of raw/ PPMs (foo.ppm) where the lane serves raw/ from packs.  Python
    gets each table before the lane, so it can name any file the kernel looked up there."""
    from pcrfs.format import segtab
    from pcrfs.fs import kernel_shim
    from pcrfs.views.raw import SUFFIX
    from pcrfs.views.tree import format_names
    if names is None:
        names = segtab.Names.derive(ds.index, table)
    ops.lane_names.update(dict.fromkeys(views, names))
    why = kernel_shim.serve_names(kernel_shim.KIND_Q, names)
    served = {t for t in (formats.get("raw"), formats.get("mix"))
              if t is not None and kernel_shim.serves(t)}
    if why or not served:
        return why
    raw = segtab.Names.derive(ds.index, table, lambda files: format_names(files, SUFFIX))
    if formats.get("raw") in served:
        ops.lane_names[formats["raw"]] = raw
    if formats.get("mix") in served:        # mix/: the PPM's name where it serves the PPM
        mix_raw = kernel_shim.mix_choice()
        ops.lane_names[formats["mix"]] = segtab.Names.pick(names, raw, mix_raw)
    return kernel_shim.serve_names(kernel_shim.KIND_RAW, raw)


def _serve_raw(ds, ops, formats: dict[str, int], table) -> str:
    """raw/ and mix/ PPMs from the raw packs `pcrfs materialize` stored, in C: the pack
    heads are read and verified here (views/raw.py), the items' places handed to the lane.
    An image no pack holds still goes to Python (decoded once, then its disk cache)."""
    import numpy as np

    from pcrfs.format import segtab
    from pcrfs.format.rawpack import RAW_DIR
    from pcrfs.fs import kernel_shim
    from pcrfs.liquid import ppm_size, raw_mask
    raw_view = ops.root.trees.get(formats.get("raw"))
    mix_view = ops.root.trees.get(formats.get("mix"))
    source = raw_view.source_bytes if raw_view is not None else mix_view.src
    if source.materialized <= 0:
        return ""                       # nothing stored: every PPM is a decode
    items = segtab.raw_items(ds.index, table, lambda o: raw_mask(o, source.materialized),
                             source.pack_head, ppm_size)
    mix = None
    mix_raw = None
    if mix_view is not None:
        mix_raw = raw_mask(segtab.slot_ordinals(table), mix_view.share).astype(np.uint8)
        mix = (formats["mix"], mix_view.k)
    return kernel_shim.serve_raw(items, mix_raw, os.path.join(ds.root, RAW_DIR),
                                 ds.storage.fds.capacity // 2, formats.get("raw"), mix)


def _start_metrics(mo: MountOptions, ops, ds, mnt: str):
    if mo.metrics is None and mo.metrics_textfile is None:
        return None
    from pcrfs import __version__, metrics
    from pcrfs.fs.operations import TIMED
    metrics.time_requests(ops, ds.stats, TIMED)
    labels = {"mountpoint": mnt, "dataset_uuid": str(ds.uuid), **mo.metrics_labels}
    collector = metrics.Collector(lambda: ops.loop.call(ops._stats_snapshot), ds.stats,
                                  labels, __version__, ds.url or ds.root)
    try:
        exporter = metrics.Exporter(collector, mo.metrics, mo.metrics_textfile,
                                    mo.metrics_interval)
    except PcrfsError:
        ds.close()
        raise
    ops.metrics_info = {k: v for k, v in (("metrics_endpoint", exporter.endpoint),
                                          ("metrics_textfile", mo.metrics_textfile)) if v}
    return exporter


def _few_malloc_arenas(n: int = 2) -> None:
    """glibc gives each thread that allocates concurrently an arena of its own, up to 8 per
    core, and each keeps its freed image buffers: the daemon's RSS then creeps up by the
    worker threads' high-water marks, outside the memory budget (measured: +5-11% over a
    60 s load, +2% with two arenas).  Before any worker thread starts."""
    import ctypes
    try:
        ctypes.CDLL(None).mallopt(-8, n)   # M_ARENA_MAX (malloc.h); not glibc: no such call
    except (AttributeError, OSError):
        pass


def _log_fd() -> int:
    """The file descriptor the daemon's log goes to (for the lane's C trace lines)."""
    for h in logging.getLogger().handlers:
        stream = getattr(h, "stream", None)
        if stream is not None:
            try:
                stream.flush()
                return stream.fileno()
            except (OSError, ValueError):
                continue
    return 2


def _warm_index(ds) -> None:
    """Read the index file once so lookups on the trio loop do not fault to disk."""
    import threading

    def run():
        path = os.path.join(ds.index.path, "data.mdb")
        try:
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
        except OSError:
            pass
    threading.Thread(target=run, name="pcrfs-warm-index", daemon=True).start()


def mount(dst: str, mnt: str, *, foreground: bool, options: list[str] | None,
          dataset_opts: dict, logfile: str | None, debug: bool, workers: int,
          argv: list[str] | None = None) -> int:
    """dataset_opts: keyword arguments of Dataset (cache sizes, bandwidth limit, cache dir);
    argv: this command's arguments, which a supervisor's daemons run again."""
    mo = parse_mount_options(options)
    check_mountpoint(mnt, mo.nonempty)
    from pcrfs.fs import supervisor
    if mo.supervise and mounted_fd(mnt) is None and supervisor.Session.from_env() is None:
        if argv is None:
            raise PcrfsError("-o supervise: only `pcrfs mount` starts a supervisor")
        if os.geteuid() != 0:
            raise PcrfsError("-o supervise mounts with mount(2) itself: run it as root "
                             "(or hand pcrfs a mounted /dev/fd/N)")
        return _supervise(mnt, mo, supervisor.daemon_command(argv, mnt), foreground,
                          logfile, debug)
    from pcrfs.storage.objclient import is_remote
    dst = dst if is_remote(dst) else os.path.abspath(dst)
    mnt = mnt if mounted_fd(mnt) is not None else os.path.abspath(mnt)
    if logfile:
        logfile = os.path.abspath(logfile)
    if foreground:
        session = supervisor.Session.from_env()   # a detached supervisor's daemon: the log
        _setup_logging(logfile, debug, not (session and session.detach))   # file only
        try:
            return serve(dst, mnt, mo, dataset_opts, workers)
        except Exception as e:
            if session:
                session.failed(str(e))
            raise
    return _daemonize(lambda ready: serve(dst, mnt, mo, dataset_opts, workers, ready),
                      logfile, debug)


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
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
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
    raise PcrfsError(f"cannot unmount {mnt}: {p.stderr.strip()}")
