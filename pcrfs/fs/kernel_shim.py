"""The fast lane: warm-epoch requests answered by a C thread (csrc/fuse_shim.c).

With the page cache warm, each image a training job reads costs the daemon three requests,
OPEN, IOCTL (Python's open() calls isatty()) and RELEASE.  Through pyfuse3 each is a trio
wake-up and a Python handler, CPU that a 2-core node takes from its DataLoader workers, and
a round trip that waits for the trio thread.  The lane owns /dev/fuse: it answers those
three for read-only opens of files in the immutable views (fh = the inode, page cache kept;
ENOTTY; done) and hands every other request to pyfuse3 unchanged.  Once Python has
assembled such a file it hands the lane a copy (`keep`), and the lane answers READ and
GETATTR of it too, so a page cache dropped by memory reclaim does not bring the file back
to Python.  Files it has never seen are read by the lane too, where their bytes are on
this machine: q-view files from local records, raw/ and mix/ PPMs from raw packs, through
the segment table (`serve_cold`, `serve_raw`; csrc/lane_cold.c).  Several lane threads
(`want(threads=N)`) each read their own clone of /dev/fuse.  Control files, l3/ and opens
with write flags still reach PcrfsOperations.open; dynamic/ files are opened there with
the inode of the q-view file they read as their handle, so the lane serves their READs.

The shim interposes libfuse's fuse_session_fd and fuse_session_receive_buf, so its library
must be in the global symbol scope before pyfuse3's extension module is loaded: `load()`
runs first in the daemon.  If anything prevents that (pyfuse3 already imported, the module
missing, an unexpected libfuse), `why_not` says why and the mount works as before, with
every request going through Python."""
from __future__ import annotations

import ctypes
import logging
import os
import sys

import numpy as np

from pcrfs.format import segtab
from pcrfs.format.index import INDEX_BITS

log = logging.getLogger("pcrfs.fs")

_lib = None
_ffi = None
why_not = "not loaded"
_table: dict | None = None   # what the lane reads in place, kept alive until stop: the
                             # segment table and its names, raw items, directory fds


def load() -> bool:
    """Put the shim in front of libfuse for the pyfuse3 about to be imported."""
    global _lib, _ffi, why_not
    if _lib is not None:
        return True
    if "pyfuse3" in sys.modules:
        why_not = "pyfuse3 was imported before the shim"
        return False
    try:
        from pcrfs import _fuseshim
        # Promote the already-loaded module to the global scope: pyfuse3's references to
        # libfuse, bound when it is loaded (RTLD_NOW), then find the shim's two first.
        ctypes.CDLL(_fuseshim.__file__, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
        import pyfuse3
        # dlsym on pyfuse3's handle searches only its own dependencies: the real libfuse.
        fuse = ctypes.CDLL(pyfuse3.__file__)
        addr = [ctypes.cast(getattr(fuse, f), ctypes.c_void_p).value
                for f in ("fuse_session_fd", "fuse_session_receive_buf", "fuse_session_exit")]
        # libfuse >= 3.14: replies of requests read on clones are routed (several threads)
        custom = getattr(fuse, "fuse_session_custom_io", None)
        addr.append(ctypes.cast(custom, ctypes.c_void_p).value if custom is not None else 0)
    except (ImportError, OSError, AttributeError) as e:
        why_not = f"{type(e).__name__}: {e}"
        return False
    ffi, lib = _fuseshim.ffi, _fuseshim.lib
    if os.environ.get("PCRFS_TEST_SHIM_UNRESOLVED"):    # tests: as if dlsym found nothing
        addr = [0] * len(addr)
    if lib.pcrfs_shim_resolve(*(ffi.cast("void *", a or 0) for a in addr)) != 0:
        why_not = "libfuse's functions could not be resolved apart from the shim"
        return False
    _lib, _ffi, why_not = lib, ffi, ""
    return True


def want(lo: int, hi: int, realtime: int = 1, skip_open: bool = False,
         threads: int = 1, nice: int = 0) -> None:
    """Answer requests for inodes [lo, hi) in C in the session pyfuse3.init() mounts next,
    on `threads` lane threads (one on the session's descriptor, the rest on clones); the
    first `realtime` of them run SCHED_FIFO and the rest at `nice` (if the process may:
    otherwise at normal priority, quietly); with skip_open, the first
    OPEN of a lane file tells the kernel to send no OPEN or RELEASE again."""
    if _lib is not None:
        _lib.pcrfs_shim_want(lo, hi)
        _lib.pcrfs_shim_want_threads(max(1, threads))
        _lib.pcrfs_shim_want_realtime(max(0, realtime))
        _lib.pcrfs_shim_want_nice(nice)
        _lib.pcrfs_shim_want_skip_open(int(skip_open))


KIND_Q, KIND_RAW, KIND_MIX, KIND_L3 = 1, 2, 3, 4   # what a tree serves cold (lane_cold.h)


def serve_cold(table, records_dir: str, max_fds: int, views: dict[int, int],
               source: str = "derived", disk: bool = False) -> str:
    """Let the lane serve READ and GETATTR of files it has never seen from the records in
    records_dir, through the segment table (pcrfs/format/segtab.py; source: "file" if
    mapped from the dataset's table file, "derived" at mount); views: tree id -> fidelity
    k.  disk: records_dir is a remote dataset's disk tier (storage/diskcache.py), whose
    segment entries the lane reads instead.  Returns "" or why not."""
    global _table
    if _lib is None or not running():
        return "no fast lane"
    fd = os.open(records_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    blob = _ffi.from_buffer("uint8_t[]", table)
    rc = (_lib.pcrfs_cold_install_disk(blob, len(table), fd) if disk
          else _lib.pcrfs_cold_install(blob, len(table), fd, max(1, max_fds)))
    if rc != 0:
        os.close(fd)
        return f"segment table refused (code {rc})"
    _table = {"segments": table, "fds": [fd], "source": source, "disk": disk}
    for tree, k in views.items():
        _lib.pcrfs_cold_kind(tree, KIND_Q, k)
    return ""


def learn_l3(ordinal: int, xxh: int) -> None:
    """The lane may serve image `ordinal`'s l3/ file from the transcode tier when the
    entry's checksum is xxh, which Python has just checked against the build's sidecar."""
    t = _table
    if t is None or "l3_sums" not in t:
        return
    rec, idx = ordinal >> INDEX_BITS, ordinal & ((1 << INDEX_BITS) - 1)
    first = t["first"]
    if rec + 1 < len(first) and first[rec] + idx < first[rec + 1]:
        t["l3_sums"][int(first[rec]) + idx] = xxh


def learn_l3_record(record: int, sums) -> None:
    """learn_l3 for every image of a record at once (its sidecar's XXH3-64s, by index)."""
    t = _table
    if t is None or "l3_sums" not in t or record + 1 >= len(t["first"]):
        return
    a, b = int(t["first"][record]), int(t["first"][record + 1])
    n = min(b - a, len(sums))
    t["l3_sums"][a : a + n] = sums[:n]


def serve_l3(sizes, cache_dir: str, tree: int) -> str:
    """Let the lane serve l3/ files (tree) whose transcode the view's disk tier in cache_dir
    holds: sizes, per slot of the segment table, the file's size (0: none).  After
    serve_cold.  Returns "" or why not."""
    if _lib is None or _table is None:
        return "no segment table"
    fd = os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    sums = np.zeros(len(sizes), dtype="<u8")      # learn_l3 fills it
    rc = _lib.pcrfs_cold_install_l3(_ffi.from_buffer("uint64_t[]", sizes),
                                    _ffi.from_buffer("uint64_t[]", sums), len(sizes), fd)
    if rc != 0:
        os.close(fd)
        return f"l3 sizes refused (code {rc})"
    parsed = segtab.parse(_table["segments"])
    _table.update(l3_sizes=sizes, l3_sums=sums, first=parsed["first"])
    _table["fds"].append(fd)
    _lib.pcrfs_cold_kind(tree, KIND_L3, 0)
    return ""


def serve_raw(items, mix_raw, packs_dir: str, max_fds: int, raw_tree: int | None,
              mix: tuple[int, int] | None) -> str:
    """Let the lane serve raw/ and mix/ PPMs from the raw packs in packs_dir: items, per
    slot of the segment table, (offset, length, XXH3-64) in its pack (segtab.raw_items);
    mix_raw, per slot, 1 where mix/ serves the PPM; mix: (tree, k of its JPEGs).  After
    serve_cold.  Returns "" or why not."""
    global _table
    if _lib is None or _table is None:
        return "no segment table"
    fd = os.open(packs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    mix_ptr = _ffi.NULL if mix_raw is None else _ffi.from_buffer("uint8_t[]", mix_raw)
    rc = _lib.pcrfs_cold_install_raw(_ffi.from_buffer("uint64_t[]", items), len(items),
                                     mix_ptr, fd, max(1, max_fds))
    if rc != 0:
        os.close(fd)
        return f"raw table refused (code {rc})"
    _table.update(items=items, mix_raw=mix_raw)
    _table["fds"].append(fd)
    if raw_tree is not None:
        _lib.pcrfs_cold_kind(raw_tree, KIND_RAW, 0)
    if mix is not None:
        _lib.pcrfs_cold_kind(mix[0], KIND_MIX, mix[1])
    return ""


def serve_names(kind: int, names) -> str:
    """Let the lane answer LOOKUP of the files of the trees of one kind (KIND_Q: the q
    views, KIND_RAW: raw/) by name (segtab.Names), so a file is looked up, opened and read
    without Python.  After serve_cold (and serve_raw for raw/).  Returns "" or why not."""
    if _lib is None or _table is None:
        return "no segment table"
    rc = _lib.pcrfs_cold_install_names(
        kind, _ffi.from_buffer("uint32_t[]", names.dir),
        _ffi.from_buffer("uint64_t[]", names.off), _ffi.from_buffer("uint8_t[]", names.blob),
        len(names.blob), len(names.dir))
    if rc != 0:
        return f"name table refused (code {rc})"
    _table.setdefault("names", []).append(names)
    return ""


def alias_tree(tree: int) -> None:
    """READs of this tree's files whose handle is a lane file's inode are that file's
    (dynamic/: pcrfs/fs/operations.py opens its files so)."""
    if _lib is not None:
        _lib.pcrfs_shim_alias_tree(tree, 1)


def resume(init: bytes, replay: bool, clones: list[int], own_clones: bool = False,
           epoch: int = 0, inflight: int = -1) -> bool:
    """Serve a session a supervisor holds (pcrfs/fs/supervisor.py): libfuse processes the
    kernel's INIT request `init` inside pyfuse3.init(), which mounts nothing; with replay
    (a daemon after the first) its reply goes nowhere and the kernel is asked to resend
    the requests the previous daemon had read.  Lane threads 1.. read `clones`.  With
    own_clones (a kernel that cannot resend) every lane thread reads a clone of this
    process instead, the lane runs even without fast_lane, and requests in flight die with
    the process (ECONNABORTED once) rather than wait on the supervisor's descriptor.
    epoch: this daemon's number, in the handles Python gives out (fs/operations.py _fh);
    with replay, a predecessor's such handle reaches Python as inode | 1 << 55.
    inflight: the supervisor's memfd where requests handed to Python are recorded until
    answered (own_clones), so that it can fail them with EIO if this process dies."""
    if _lib is None:
        return False
    arr = _ffi.new("int[]", list(clones) or [0])
    return _lib.pcrfs_shim_resume(init, len(init), int(replay), arr, len(clones),
                                  int(own_clones), epoch, inflight) == 0


def own_clones() -> bool:
    """Whether every lane thread reads a clone of this process (resume(own_clones))."""
    return _lib is not None and bool(_lib.pcrfs_shim_own_clones())


def resent() -> int:
    """1: the kernel queued the requests in flight again; -errno: it refused
    (FUSE_NOTIFY_RESEND needs Linux 6.9); 0: not asked."""
    return 0 if _lib is None else int(_lib.pcrfs_shim_resent())


def stop() -> None:
    """Stop the lane threads and join them.  Call before pyfuse3.close() unmounts: the
    session's /dev/fuse fd is then closed with no thread left to use it."""
    global _table
    if _lib is not None:
        _lib.pcrfs_shim_stop()
        if _table is not None:          # the lane no longer reads it (reset by stop)
            for fd in _table["fds"]:
                os.close(fd)
            _table = None


def trace(fd: int) -> None:
    """--debug: the lane writes a line per request it answers to fd (-1: off)."""
    if _lib is not None:
        _lib.pcrfs_shim_trace(fd)


def served() -> dict[int, tuple[int, int]]:
    """tree id -> (bytes, files) the lane served from its image store."""
    if _lib is None:
        return {}
    b, f = _ffi.new("uint64_t[]", 256), _ffi.new("uint64_t[]", 256)
    _lib.pcrfs_lane_served(b, f, 256)
    return {t: (int(b[t]), int(f[t])) for t in range(256) if b[t] or f[t]}


def table_bytes() -> int:
    """Bytes of the segment table the lane serves cold reads from, with its names and
    their hash (0: none yet)."""
    if _table is None:
        return 0
    names = sum(n.nbytes for n in _table.get("names", []))
    return len(_table["segments"]) + names + int(_lib.pcrfs_cold_names_bytes())


def mix_choice():
    """Per slot, 1 where the lane's mix/ serves the PPM (serve_raw's mix_raw), or None."""
    return None if _table is None else _table.get("mix_raw")


def serves(tree: int) -> bool:
    """Whether the lane reads this tree's files cold."""
    return _lib is not None and bool(_lib.pcrfs_cold_serves(tree))


def table_source() -> str | None:
    """Where the lane's segment table came from: "file", "derived", or None (none yet)."""
    return None if _table is None else _table["source"]


def from_disk_tier() -> bool:
    """Whether the lane's cold reads come from a remote dataset's disk tier."""
    return _table is not None and _table["disk"]


def names_in_place() -> bool:
    """Whether the lane answers LOOKUP of q-view files (serve_names)."""
    return _table is not None and "names" in _table


def realtime() -> int:
    """How many lane threads run SCHED_FIFO."""
    return 0 if _lib is None else int(_lib.pcrfs_shim_realtime())


def niced() -> int:
    """How many lane threads run at the asked nice value."""
    return 0 if _lib is None else int(_lib.pcrfs_shim_niced())


def threads() -> int:
    """Lane threads serving now."""
    return 0 if _lib is None else int(_lib.pcrfs_shim_threads())


COLD = ("files", "bytes", "read_bytes", "checksum_failures", "handed_to_python",
        "pack_bytes", "pack_items")


def cold() -> dict[int, dict[str, int]]:
    """tree id -> cold READs the lane answered from the records and raw packs: files,
    their bytes, record bytes pread, checksum failures, attempts handed to Python, pack
    bytes and items pread."""
    if _lib is None:
        return {}
    out = _ffi.new("uint64_t[]", len(COLD) * 256)
    _lib.pcrfs_lane_cold_counts(out, len(COLD) * 256)
    return {t: {k: int(out[i * 256 + t]) for i, k in enumerate(COLD)}
            for t in range(256) if any(out[i * 256 + t] for i in range(len(COLD)))}


def running() -> bool:
    """Whether the fast lane owns this daemon's /dev/fuse."""
    return _lib is not None and bool(_lib.pcrfs_shim_running())


def configure_store(budget: int, uid: int, gid: int, mtime_ns: int, blksize: int,
                    attr_valid: int, pinned: bool = False) -> None:
    """Give the lane an image store of `budget` bytes and the attributes Python answers for
    a lane file, so it can answer READ and GETATTR of kept images itself.  pinned (the
    static policy): the store never evicts, and Python offers only its pinned set."""
    if _lib is None:
        return
    _lib.pcrfs_lane_store_pin(int(pinned))
    if _lib.pcrfs_lane_configure(budget, uid, gid, mtime_ns, blksize, attr_valid) != 0:
        log.warning("fast lane: no memory for its image store; reads go through Python")


def keep(ino: int, data: bytes) -> bool:
    """Hand an assembled (verified) image to the lane.  Call from a worker thread: it copies."""
    return _lib is not None and _lib.pcrfs_lane_keep(ino, _ffi.from_buffer("uint8_t[]", data),
                                                     len(data)) == 0


def kept(ino: int, off: int, size: int) -> bytes | None:
    """Bytes [off, off + size) of a kept image, or None if the lane does not hold it."""
    if _lib is None:
        return None
    out = _ffi.new("uint8_t[]", max(size, 1))
    n = _lib.pcrfs_lane_copy(ino, off, out, size)
    return None if n < 0 else bytes(_ffi.buffer(out, n))


COUNTS = ("open", "release", "ioctl", "handed_to_python", "refused_nomem", "buffer_bytes",
          "cold_getattr", "routed_replies", "record_fds_open", "record_fds_opened",
          "record_fds_evicted", "cold_lookup", "disk_images_read", "disk_images_missing")
STORE = ("read", "getattr", "store_bytes", "store_budget", "store_images", "store_kept",
         "store_evicted", "store_refused")


def counts() -> dict[str, int]:
    """Requests the lane answered, by kind, and those it handed to pyfuse3."""
    if _lib is None:
        return dict.fromkeys(COUNTS + STORE, 0)
    out = _ffi.new("uint64_t[]", len(COUNTS))
    _lib.pcrfs_shim_counts(out, len(COUNTS))
    store = _ffi.new("uint64_t[]", len(STORE))
    _lib.pcrfs_lane_store_counts(store, len(STORE))
    return {**{k: int(v) for k, v in zip(COUNTS, out, strict=True)},
            **{k: int(v) for k, v in zip(STORE, store, strict=True)}}
