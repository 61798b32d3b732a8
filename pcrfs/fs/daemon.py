"""The mount daemon, wired in one place: the dataset opened with the mount's options, the
memory budget's shares, the FUSE operations, the fast lane (its store, cold reads, names),
metrics, readiness and resumption under a supervisor; then the trio loop until unmounted
or signalled (serve)."""
from __future__ import annotations

import logging
import os
import signal

from pcrfs.errors import PcrfsError
from pcrfs.fs.options import MountOptions, kernel_options, lane_threads
from pcrfs.fs.supervisor import protocol_of
from pcrfs.storage.budget import LANE_SHARE, OPEN_SHARE, STATIC_OPEN_SHARE

NEEDS_SHIM = "cannot serve a supervised mount without the shim"


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
        raise PcrfsError(f"{NEEDS_SHIM}: "
                         f"{kernel_shim.why_not or 'INIT refused'}")
    import pyfuse3
    import trio

    from pcrfs.dataset import open_dataset
    from pcrfs.fs.operations import TIMEOUT, PcrfsOperations
    from pcrfs.storage.fds import raise_nofile_limit
    from pcrfs.views.control import parse_fidelity
    nofile = raise_nofile_limit()   # before the dataset sizes its descriptor cache from it
    from pcrfs.liquid.rules import MixOptions
    try:
        ds = open_dataset(dst, **dataset_opts, cache_policy=mo.cache_policy, fetch=mo.fetch,
                          mix=MixOptions(mo.mix, mo.mix_fidelity, hold=mo.hold, seq=mo.seq))
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
    # under a supervisor mnt is its descriptor (/dev/fd/N): labels and logs name the path
    shown = session.mountpoint if session and session.mountpoint else mnt
    exporter = _start_metrics(mo, ops, ds, shown)
    kernel_shim.want(*ops.fast_inodes if lane else (0, 0),
                     realtime={"realtime": 1, "all": 256, "normal": 0}[mo.lane_priority],
                     nice=0 if mo.lane_priority == "normal" else mo.lane_nice,
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
        ds.pin_in_lane(None)
        log.warning("no fast lane, every request goes through Python (slower warm epochs): "
                    "%s", kernel_shim.why_not or "pyfuse3 did not call the shim")
        if mo.skip_open:
            log.warning("-o skip_open has no effect without the fast lane")
    log.info("mounted %s on %s (%d views)", dst, shown, len(ds.views))
    segtab = None
    if lane and kernel_shim.running():
        log.info("fast lane: %d threads", kernel_shim.threads())
        if not mo.skip_open:    # (without OPEN, dynamic/ files are read by their own inode)
            for tree, v in ops.root.trees.items():
                if v.aliases:
                    kernel_shim.alias_tree(tree)
            ops.lane_aliases = True
        if mo.lane_cold:
            segtab = _serve_cold(ds, ops, mo, log)
    if ready:
        ready()
    if session:
        session.ready()
    if session is None:     # a supervised daemon's supervisor tells systemd
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
        if session is None:
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
        log.info("handed over %s" if handover else "unmounted %s", shown)
    return EX_HANDOVER if handover else 0


def _resumed(session, ds, ops, log) -> None:
    """A supervised daemon: after a restart, name the inodes the kernel kept, and say
    whether the requests in flight come back."""
    from pcrfs.fs import kernel_shim
    from pcrfs.fs.recover import InodeRecovery
    ops.session = {"supervisor_pid": session.supervisor, "restarts": session.restarts,
                   "upgrades": session.upgrades, "resend": session.resend,
                   "fuse_protocol": protocol_of(bytes.fromhex(session.init))}
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
    """Hand the lane the segment table, so it serves q-view files it has never seen itself
    (csrc/lane_cold.c): from the records of a local dataset, from the segments a remote
    dataset's disk tier holds (what it lacks goes to Python, which fetches).  Only where
    nothing else must see each read: no bandwidth limit on local records (it meters reads
    in Python; disk-tier hits are free of it), no static cache (it pins images in Python).
    The table is derived from the index in a thread; until it is in place, reads go
    through Python as before."""
    import threading

    from pcrfs.storage.local import LocalStorage
    from pcrfs.views.base import LANE_L3, LANE_MIX, LANE_Q, LANE_RAW
    local = isinstance(ds.storage, LocalStorage)
    disk = None if local else getattr(ds.storage, "disk", None)
    why = ("records remote, no disk tier" if not local and disk is None
           else "a bandwidth limit is set" if local and ds.throttle is not None
           else "cache_policy=static" if mo.cache_policy != "lru" else "")
    if why:
        log.info("fast lane: cold reads through Python (%s)", why)
        return None
    views = {tree: v.k for tree, v in ops.root.trees.items() if v.lane_kind == LANE_Q}
    lo, hi = ops.fast_inodes        # raw/ and mix/ only while page-cached (no -o hold)
    formats = {v.lane_kind: tree for tree, v in ops.root.trees.items()
               if local and lo <= tree << 56 < hi and v.lane_kind in (LANE_RAW, LANE_MIX)}
    l3 = next(((tree, v) for tree, v in ops.root.trees.items()
               if lo <= tree << 56 < hi and v.lane_kind == LANE_L3 and v.cache is not None),
              None)

    def run():
        from pcrfs.format import segtab
        from pcrfs.fs import kernel_shim
        try:
            # written by build/reindex (mapped, shared with the page cache), else derived
            table, names = (segtab.load_file(ds.root, ds.index, ds.manifest) if local
                            else (None, "a remote dataset's is not pushed"))
            source = "file"
            if table is None:
                log.info("fast lane: deriving the segment table (%s)", names)
                table, names, source = segtab.derive(ds.index, ds.groups), None, "derived"
            if local:
                why = kernel_shim.serve_cold(table, ds.storage.root,
                                             ds.storage.fds.capacity // 2, views, source)
            elif not disk.have_root():      # (made on its first write, else)
                why = f"the disk tier's directory {disk.root} cannot be made"
            else:
                why = kernel_shim.serve_cold(table, disk.root, 0, views, source, disk=True)
            if not why and formats:
                why = _serve_raw(ds, ops, formats, table)
            # the transcodes its disk tier holds (its directory made now: the lane
            # keeps it open and finds the files written later; none made, no l3/ in C)
            if not why and l3 is not None and l3[1].cache.have_root():
                why = kernel_shim.serve_l3(segtab.per_slot(table, *l3[1].known_sizes()),
                                           l3[1].cache.root, l3[0])
                if not why:
                    l3[1].verified = kernel_shim.learn_l3
                    if local:   # every sidecar now (one small file per record); a remote
                        _learn_sidecars(ds, l3[1])   # dataset's as Python checks images
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
    from pcrfs.views.base import LANE_MIX, LANE_RAW
    from pcrfs.views.raw import SUFFIX
    from pcrfs.views.tree import format_names
    if names is None:
        names = segtab.Names.derive(ds.index, table)
    ops.lane_names.update(dict.fromkeys(views, names))
    why = kernel_shim.serve_names(kernel_shim.KIND_Q, names)
    served = {t for t in (formats.get(LANE_RAW), formats.get(LANE_MIX))
              if t is not None and kernel_shim.serves(t)}
    if why or not served:
        return why
    raw = segtab.Names.derive(ds.index, table, lambda files: format_names(files, SUFFIX))
    if formats.get(LANE_RAW) in served:
        ops.lane_names[formats[LANE_RAW]] = raw
    if formats.get(LANE_MIX) in served:        # mix/: the PPM's name where it serves the PPM
        mix_raw = kernel_shim.mix_choice()
        ops.lane_names[formats[LANE_MIX]] = segtab.Names.pick(names, raw, mix_raw)
    return kernel_shim.serve_names(kernel_shim.KIND_RAW, raw)


def _learn_sidecars(ds, view) -> None:
    """The build's l3 checksums of every image, for the lane to check transcode-tier
    entries against (a replaced entry is never served on its own checksum)."""
    from pcrfs.errors import CorruptDataError
    from pcrfs.fs import kernel_shim
    for r in sorted(ds.index.records):
        try:
            kernel_shim.learn_l3_record(r, view.record_sums(r))
        except CorruptDataError:
            continue        # that record's l3 files go to Python, which says why


def _serve_raw(ds, ops, formats: dict[str, int], table) -> str:
    """raw/ and mix/ PPMs from the raw packs `pcrfs materialize` stored, in C: the pack
    heads are read and verified here (views/raw.py), the items' places handed to the lane.
    An image no pack holds still goes to Python (decoded once, then its disk cache)."""
    import numpy as np

    from pcrfs.format import RAW_DIR, segtab
    from pcrfs.fs import kernel_shim
    from pcrfs.liquid.rules import ppm_size, raw_mask
    from pcrfs.views.base import LANE_MIX, LANE_RAW
    raw_view = ops.root.trees.get(formats.get(LANE_RAW))
    mix_view = ops.root.trees.get(formats.get(LANE_MIX))
    source = raw_view.source_bytes if raw_view is not None else mix_view.src
    if source.materialized <= 0:
        return ""                       # nothing stored: every PPM is a decode
    items = segtab.raw_items(ds.index, table, lambda o: raw_mask(o, source.materialized),
                             source.pack_head, ppm_size)
    mix = None
    mix_raw = None
    if mix_view is not None:
        mix_raw = raw_mask(segtab.slot_ordinals(table), mix_view.share).astype(np.uint8)
        mix = (formats[LANE_MIX], mix_view.k)
    return kernel_shim.serve_raw(items, mix_raw, os.path.join(ds.root, RAW_DIR),
                                 ds.storage.fds.capacity // 2, formats.get(LANE_RAW), mix)


def _start_metrics(mo: MountOptions, ops, ds, mnt: str):
    if mo.metrics is None and mo.metrics_textfile is None:
        return None
    from pcrfs import __version__
    from pcrfs.fs.operations import TIMED
    from pcrfs.telemetry import metrics
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
