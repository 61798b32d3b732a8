"""pyfuse3 Operations: translate kernel requests into Dataset calls, nothing more.

Blocking work (record reads, splicing, checksums) runs in worker threads under a
CapacityLimiter; the trio loop only does index lookups (LMDB, memory-mapped and warmed
at mount) and bookkeeping.  Every write-type operation fails with EROFS, except writes to
.pcrfs/control/dynamic_fidelity by the mounting user or root.

MNT/dynamic/ serves the current dynamic fidelity.  An open file keeps the fidelity it was
opened with (direct I/O, so the page cache never mixes two); a switch invalidates the
attributes of every dynamic inode the kernel holds before the control write returns."""
from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from calendar import timegm
from collections import OrderedDict
from collections.abc import Sequence
from time import strptime

import pyfuse3
import trio

from pcrfs.dataset import Dataset
from pcrfs.errors import CorruptDataError
from pcrfs.fs import kernel_shim
from pcrfs.fs.control import DYNAMIC_FIDELITY, ControlFiles
from pcrfs.fs.inodes import CONTROL, ROOT, InodeTable, Node, inode_of
from pcrfs.format.index import DIR_BIT as TOP   # the dataset's top directory
from pcrfs.fs.listing import BareEntries, ListingPolicy
from pcrfs.storage.fds import OutOfDescriptors

log = logging.getLogger("pcrfs.fs")

TIMEOUT = 24 * 3600.0        # the dataset is immutable: let the kernel cache freely
CONTROL_DIR = b".pcrfs"
DYNAMIC = "dynamic"
XATTRS = (b"user.pcrfs.label", b"user.pcrfs.scans", b"user.pcrfs.view", b"user.pcrfs.record")


def _fail(code: int):
    return pyfuse3.FUSEError(code)


class _OpenFile:
    __slots__ = ("node", "view", "data", "lock", "written")

    def __init__(self, node: Node, view: str = "", data: bytes | None = None):
        self.node = node
        self.view = view          # the view this open serves (fixed at open for dynamic/)
        self.data = data
        self.lock = trio.Lock()
        self.written = b""        # control files: what this open has written so far


class _Recent:
    """Images assembled for files the fast lane opened (fs/kernel_shim.py), which have no
    per-open state: the kernel reads a file in 128 KiB requests, and each must not assemble
    it again.  Bounded in bytes; the newest image is always kept.  Behind the lane's own
    image store, it catches reads that race a first assembly."""

    def __init__(self, budget: int = 64 << 20):
        self.budget, self.used = budget, 0
        self._data: OrderedDict[int, bytes] = OrderedDict()
        self._locks: dict[int, trio.Lock] = {}

    def get(self, ino: int) -> bytes | None:
        data = self._data.get(ino)
        if data is not None:
            self._data.move_to_end(ino)
        return data

    def put(self, ino: int, data: bytes) -> None:
        old = self._data.pop(ino, None)
        self.used += len(data) - (len(old) if old is not None else 0)
        self._data[ino] = data
        while self.used > self.budget and len(self._data) > 1:
            self.used -= len(self._data.popitem(last=False)[1])

    async def get_or_make(self, ino: int, make) -> bytes:
        """The image of ino, made by `await make()` once however many reads wait for it."""
        data = self.get(ino)
        if data is not None:
            return data
        lock = self._locks.get(ino)
        if lock is None:
            lock = self._locks[ino] = trio.Lock()
        await lock.acquire()
        try:
            data = self.get(ino)
            if data is None:
                data = await make()
                self.put(ino, data)
            return data
        finally:
            lock.release()
            if not lock.statistics().tasks_waiting:
                self._locks.pop(ino, None)


class _OpenDir:
    __slots__ = ("ino", "node", "head", "names", "ords", "sizes", "fidelity", "files_plus")

    def __init__(self, ino: int, node: Node, head: list):
        self.ino, self.node = ino, node
        self.head = head              # (name, tree, path, is_dir, inode): dots, root, .pcrfs
        self.names: list[tuple[bytes, bool]] = []   # a dataset directory's entries
        self.ords: Sequence[int] = ()                # ... and their node ordinals
        self.sizes: dict[bytes, int] | None = None  # their sizes, if files get attributes
        self.fidelity = 0             # of dynamic/ when listed
        self.files_plus = True        # files carry attributes (else bare: fs/listing.py)


class PcrfsOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    BLKSIZE = 128 * 1024

    def __init__(self, ds: Dataset, workers: int = 8, fidelity: int | None = None,
                 readdirplus: str = "auto"):
        super().__init__()
        self.ds = ds
        self.stats = ds.stats
        self.inodes = InodeTable()
        self.limiter = trio.CapacityLimiter(workers)
        self.view_names = [*ds.all_views, DYNAMIC]                  # tree id i+1 -> name
        self.view_ids = {v.encode(): i + 1 for i, v in enumerate(self.view_names)}
        self.dynamic_tree = self.view_ids[DYNAMIC.encode()]
        self.fidelity = fidelity or ds.groups                        # paper: start at full
        self.fidelity_switches = 0
        self._switch_lock = trio.Lock()
        self.control = ControlFiles(ds.manifest, self._stats_snapshot, lambda: self.fidelity,
                                    self._set_fidelity)
        self.mtime_ns = timegm(strptime(ds.manifest["created"], "%Y-%m-%dT%H:%M:%SZ")) * 10**9
        self.uid, self.gid = os.getuid(), os.getgid()
        self._files: dict[int, _OpenFile] = {}
        self._trace = log.isEnabledFor(logging.DEBUG)     # --debug: one line per request
        self._eio_logged: set[tuple[str, bytes]] = set()
        self._dirs: dict[int, _OpenDir] = {}
        self.listing = ListingPolicy(readdirplus)
        self._bare = BareEntries()
        if self._bare.offset is None and readdirplus != "yes":
            log.warning("pyfuse3's EntryAttributes layout is not the expected one: every "
                        "listed file gets attributes (readdirplus=yes)")
        self.entries_listed = {"attrs": 0, "bare": 0}
        self._next_fh = 1
        # Files of these trees are immutable and always served alike, so the fast lane
        # opens them in C with fh = inode; dynamic/ and .pcrfs/ follow the control file.
        self.fast_inodes = (1 << 56, self.dynamic_tree << 56)
        # Lane files are read from the lane's image store (fs/kernel_shim.py); this only
        # bridges reads that race a first assembly, and images the store cannot take.
        self._recent = _Recent(16 << 20)

    # -- helpers -----------------------------------------------------------------
    def _stats_snapshot(self) -> dict:
        s = self.stats.snapshot()
        lane = kernel_shim.counts()
        req = s.setdefault("requests", {})
        for op in ("open", "ioctl"):
            if lane[op]:
                req[op] = req.get(op, 0) + lane[op]
        s["fast_lane"] = {"running": kernel_shim.running(), "realtime": kernel_shim.realtime(),
                          **lane}
        for tree, (nbytes, files) in kernel_shim.served().items():   # READs the lane answered
            if 0 < tree <= len(self.view_names):
                view = self.view_names[tree - 1]
                for key, n in (("served_bytes", nbytes), ("served_files", files)):
                    s.setdefault(key, {})[view] = s.get(key, {}).get(view, 0) + n
        s["open_files"] = len(self._files) + lane["open"] - lane["release"]
        s["known_inodes"] = len(self.inodes)
        s["cache_bytes"] = self.ds.reader.cache.used
        s["cache_capacity"] = self.ds.reader.cache.capacity
        t = self.ds.throttle
        s["bandwidth_limit_bytes_per_s"] = int(t.rate) if t else None
        fds = getattr(self.ds.storage, "fds", None)      # a local dataset's record files
        if fds is not None:
            s["record_files"] = {"open": fds.open_count(), "capacity": fds.capacity,
                                 "opens": fds.opens, "evictions": fds.evictions,
                                 "sheds": fds.sheds}
        disk = getattr(self.ds.storage, "disk", None)    # a remote dataset's extent cache
        if disk is not None:
            s["disk_cache_bytes"], s["disk_cache_capacity"] = disk.used, disk.capacity
            s["disk_cache_discarded"] = disk.discarded
        s["source"] = self.ds.url or self.ds.root
        s["dynamic_fidelity"] = f"q{self.fidelity}"
        s["fidelity_switches"] = self.fidelity_switches
        s["readdir_entries"] = dict(self.entries_listed)
        s["readdirplus"] = self.listing.mode
        return s

    def _view(self, tree: int) -> str:
        """The dataset view a tree serves now (dynamic/ follows the control file)."""
        return f"q{self.fidelity}" if tree == self.dynamic_tree else self.view_names[tree - 1]

    def _set_fidelity(self, k: int) -> None:
        if k != self.fidelity:
            log.info("dynamic fidelity q%d -> q%d", self.fidelity, k)
            self.fidelity = k
            self.fidelity_switches += 1

    async def _invalidate_dynamic(self) -> None:
        """Drop the kernel's cached attributes (sizes) of every dynamic inode it holds.
        In a worker thread: the notification blocks, and must not stall the loop."""
        inos = self.inodes.inodes_of(self.dynamic_tree, files_only=True)

        def run():
            for ino in inos:
                try:
                    pyfuse3.invalidate_inode(ino, attr_only=True)
                except OSError:   # ENOENT: the kernel already forgot it
                    pass
        await trio.to_thread.run_sync(run)

    def _count(self, op: str, inode: int | None = None, detail: object = "") -> None:
        self.stats.count("requests", op)
        if self._trace:
            node = self.inodes.get(inode) if inode is not None else None
            where = "" if node is None else (
                f" {self._tree_name(node.tree)}/{os.fsdecode(node.path)}")
            log.debug("%s%s %s", op, where, detail)

    def _tree_name(self, tree: int) -> str:
        return {0: "", CONTROL: ".pcrfs"}.get(tree) or self.view_names[tree - 1]

    def _error(self, code: int):
        self.stats.count("errors", errno.errorcode.get(code, str(code)))
        return _fail(code)

    def _node(self, inode: int) -> Node:
        node = self.inodes.get(inode)
        if node is None:
            raise self._error(errno.ENOENT)
        return node

    def _fh(self) -> int:
        self._next_fh += 1
        return self._next_fh

    def _attrs(self, ino: int, tree: int, path: bytes, is_dir: bool,
               size: int | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.mtime_ns
        a.entry_timeout = a.attr_timeout = TIMEOUT
        a.st_blksize = self.BLKSIZE
        if is_dir:
            a.st_mode = stat.S_IFDIR | 0o555
            a.st_nlink = 2
            a.st_size = 0
        else:
            a.st_mode = stat.S_IFREG | 0o444
            a.st_nlink = 1
            if tree == CONTROL:
                a.st_size = len(self.control.render(path))
                if path in self.control.writable:
                    a.st_mode = stat.S_IFREG | 0o644
                if path not in self.control.static:
                    a.attr_timeout = 0  # live counters: never cache the size
            elif size is not None:
                a.st_size = size
            else:
                a.st_size = self.ds.file_size(path, self._view(tree)) or 0
        a.st_blocks = (a.st_size + 511) // 512
        return a

    def _resolve(self, parent: Node, name: bytes) -> tuple[int, bytes, bool, int, int | None] | None:
        """(tree, path, is_dir, inode, file size) of name inside parent, or None."""
        if parent.tree == 0:
            if name in self.view_ids:
                tree = self.view_ids[name]
                return tree, b"", True, inode_of(tree, TOP), None
            if name == CONTROL_DIR:
                return CONTROL, b"", True, inode_of(CONTROL, 0), None
            return None
        if parent.tree == CONTROL:
            found = self.control.lookup(parent.path, name)
            if found is None:
                return None
            path, is_dir = found
            return CONTROL, path, is_dir, inode_of(CONTROL, self.control.ordinal(path)), None
        path = parent.path + b"/" + name if parent.path else name
        heads = self.ds.index.dir_ordinals(path)
        if heads is not None:
            return parent.tree, path, True, inode_of(parent.tree, heads[0]), None
        found = self.ds.file_node(path, self._view(parent.tree))
        if found is not None:
            return parent.tree, path, False, inode_of(parent.tree, found[1]), found[0]
        return None

    def _ino(self, tree: int, path: bytes) -> int:
        """The inode of a directory (the dot entries of a listing)."""
        if tree == 0:
            return ROOT
        if tree == CONTROL:
            return inode_of(CONTROL, self.control.ordinal(path))
        if not path:
            return inode_of(tree, TOP)
        heads = self.ds.index.dir_ordinals(path)
        if heads is None:
            raise ValueError(f"no directory {path!r} in the index")
        return inode_of(tree, heads[0])

    def _head(self, ino: int, node: Node) -> list[tuple[bytes, int, bytes, bool, int]]:
        """(name, tree, path, is_dir, inode) of '.', '..' and, for the root and .pcrfs,
        every entry; a dataset directory's own entries follow them (`_OpenDir.names`)."""
        if node.tree == 0:
            return ([(b".", 0, b"", True, ROOT), (b"..", 0, b"", True, ROOT)]
                    + [(v, i, b"", True, inode_of(i, TOP)) for v, i in self.view_ids.items()]
                    + [(CONTROL_DIR, CONTROL, b"", True, inode_of(CONTROL, 0))])
        parent = node.path.rpartition(b"/")[0]
        ptree = node.tree if node.path else 0
        out = [(b".", node.tree, node.path, True, ino),
               (b"..", ptree, parent, True, self._ino(ptree, parent))]
        if node.tree == CONTROL:
            for n, d in self.control.entries(node.path):
                p = node.path + b"/" + n if node.path else n
                out.append((n, CONTROL, p, d, inode_of(CONTROL, self.control.ordinal(p))))
        return out

    # -- namespace -----------------------------------------------------------------
    async def lookup(self, parent_inode, name, ctx=None):
        self._count("lookup", parent_inode, name)
        parent = self._node(parent_inode)
        if not parent.is_dir:
            raise self._error(errno.ENOTDIR)
        found = self._resolve(parent, name)
        if found is None:
            a = pyfuse3.EntryAttributes()   # negative entry, cached by the kernel
            a.st_ino = 0
            a.entry_timeout = TIMEOUT
            return a
        tree, path, is_dir, ino, size = found
        if not is_dir:
            self.listing.looked_up(parent_inode)
        try:
            self.inodes.remember(tree, path, is_dir, ino)
        except KeyError:
            log.error("inode %d of %r is another path's: damaged index; entry hidden", ino, path)
            raise self._error(errno.EIO) from None
        return self._attrs(ino, tree, path, is_dir, size)

    async def forget(self, inode_list):
        for ino, n in inode_list:
            self.inodes.forget(ino, n)

    async def getattr(self, inode, ctx=None):
        self._count("getattr", inode)
        node = self._node(inode)
        return self._attrs(inode, node.tree, node.path, node.is_dir)

    async def opendir(self, inode, ctx):
        self._count("opendir", inode)
        node = self._node(inode)
        if not node.is_dir:
            raise self._error(errno.ENOTDIR)
        d = _OpenDir(inode, node, [])
        self._list(d)
        fh = self._fh()
        self._dirs[fh] = d
        return fh

    def _list(self, d: _OpenDir) -> None:
        """Fill d's dataset entries for the current fidelity, with file sizes if this
        listing gives files attributes.  A damaged listing fails this directory with EIO;
        the mount goes on."""
        try:
            if not d.head:
                d.head = self._head(d.ino, d.node)
            self._fill(d)
        except ValueError as e:
            log.error("EIO listing %s/%s: %s", self._tree_name(d.node.tree),
                      os.fsdecode(d.node.path), e)
            raise self._error(errno.EIO) from None

    def _fill(self, d: _OpenDir) -> None:
        d.fidelity = self.fidelity
        d.files_plus = self._bare.offset is None or self.listing.files_plus()
        d.sizes = None
        tree = d.node.tree
        if not 0 < tree < CONTROL:
            return
        view = self._view(tree)
        d.names, d.ords, d.sizes = self.ds.listdir_numbered(d.node.path, view, d.files_plus)

    async def readdir(self, fh, start_id, token):
        self._count("readdir")
        d = self._dirs[fh]
        if d.node.tree == self.dynamic_tree and d.fidelity != self.fidelity:
            self._list(d)   # switched since opendir: never hand out sizes of the old fidelity
        head, names = d.head, d.names
        n_head = len(head)
        n_plus = n_bare = 0
        # readdir_reply copies the attributes into the reply at once, so one template per
        # kind serves many entries (large directories are dominated by the second loop).
        for i in range(start_id, n_head):
            name, tree, path, is_dir, ino = head[i]
            if not pyfuse3.readdir_reply(token, name, self._attrs(ino, tree, path, is_dir), i + 1):
                return self._listed(d, n_plus, n_bare)
            n_plus += 1
            if name not in (b".", b".."):  # dot entries take no lookup reference
                self.inodes.remember(tree, path, is_dir, ino)
        tree, sizes, ords = d.node.tree, d.sizes, d.ords
        prefix = d.node.path + b"/" if d.node.path else b""
        dir_attrs = file_attrs = bare = slot = None
        if not d.files_plus and names:
            bare = self._attrs(0, tree, b"", False, 0)
            slot = self._bare.nodeid_slot(bare)
        top, reply = tree << 56, pyfuse3.readdir_reply
        for j in range(max(0, start_id - n_head), len(names)):
            name, is_dir = names[j]
            path = prefix + name
            ino = top | ords[j]                               # = inode_of(tree, ords[j])
            if is_dir:
                a = dir_attrs = dir_attrs or self._attrs(ino, tree, path, True)
                a.st_ino = ino
            elif bare is not None:
                bare.st_ino = ino     # d_ino stays stable; node id 0: the kernel keeps nothing
                slot.value = 0
                if not reply(token, name, bare, n_head + j + 1):
                    break
                n_bare += 1
                continue
            else:
                size = sizes.get(name) if sizes else None
                if size is None:      # not in the walk (cannot happen in a sound index)
                    a = self._attrs(ino, tree, path, False)
                else:
                    a = file_attrs = file_attrs or self._attrs(ino, tree, path, False, size)
                    a.st_ino, a.st_size, a.st_blocks = ino, size, (size + 511) // 512
            if not reply(token, name, a, n_head + j + 1):
                break
            n_plus += 1
            self.inodes.remember(tree, path, is_dir, ino)
        self._listed(d, n_plus, n_bare)

    def _listed(self, d: _OpenDir, n_plus: int, n_bare: int) -> None:
        if n_bare:
            self.listing.listed_bare(d.ino)
        self.entries_listed["attrs"] += n_plus
        self.entries_listed["bare"] += n_bare

    async def releasedir(self, fh):
        self._dirs.pop(fh, None)

    async def statfs(self, ctx):
        self._count("statfs")
        s = pyfuse3.StatvfsData()
        m = self.ds.manifest
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (m["dataset_bytes"] + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = m["images"] * len(self.view_names)
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # -- files ---------------------------------------------------------------------
    async def open(self, inode, flags, ctx):
        self._count("open", inode, f"flags=0x{flags:x}")
        node = self._node(inode)
        if node.is_dir:
            raise self._error(errno.EISDIR)
        writing = flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_CREAT)
        if writing and not (node.tree == CONTROL and node.path in self.control.writable):
            raise self._error(errno.EROFS)
        if writing and ctx.uid not in (0, self.uid):
            raise self._error(errno.EACCES)
        fh = self._fh()
        if node.tree == CONTROL:
            self._files[fh] = _OpenFile(node, data=self.control.render(node.path))
            return pyfuse3.FileInfo(fh=fh, direct_io=True)
        view = self._view(node.tree)
        self._files[fh] = _OpenFile(node, view)
        if node.tree == self.dynamic_tree:
            # no page cache: it would outlive a switch and mix fidelities across opens
            return pyfuse3.FileInfo(fh=fh, direct_io=True)
        # Assembled on the first read, not here: with a warm page cache (keep_cache) the
        # kernel serves reads itself and an open costs no record I/O at all.
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh, off, size):
        f = self._files.get(fh)
        if f is None:                 # opened by the fast lane: fh is the inode
            return await self._read_fast(fh, off, size)
        if self._trace:
            self._count("read", None, f"{f.view}/{os.fsdecode(f.node.path)} off={off} size={size}")
        else:
            self.stats.count("requests", "read")
        if f.data is None:
            async with f.lock:
                if f.data is None:
                    f.data = await self._assemble(f.node, f.view)
        return f.data[off : off + size]

    async def _read_fast(self, ino: int, off: int, size: int) -> bytes:
        if self._trace:
            self._count("read", ino, f"off={off} size={size}")
        else:
            self.stats.count("requests", "read")
        lo, hi = self.fast_inodes
        if not lo <= ino < hi:
            raise self._error(errno.EBADF)
        # kept by the lane after this READ was handed over (a concurrent first read)
        data = kernel_shim.kept(ino, off, size)
        if data is not None:
            return data
        node = self._node(ino)
        data = await self._recent.get_or_make(
            ino, lambda: self._assemble(node, self._view(node.tree), keep_as=ino))
        return data[off : off + size]

    async def write(self, fh, off, buf):
        self._count("write")
        f = self._files.get(fh)
        if f is None or f.node.tree != CONTROL or f.node.path not in self.control.writable:
            raise self._error(errno.EROFS)
        value = f.written + bytes(buf) if off else bytes(buf)
        if len(value) > 64:
            raise self._error(errno.EINVAL)
        async with self._switch_lock:   # one switch and its invalidation at a time
            try:
                self.control.write(f.node.path, value)
            except ValueError as e:
                log.warning("rejected write to .pcrfs/%s: %s", os.fsdecode(f.node.path), e)
                raise self._error(errno.EINVAL) from None
            f.written = value
            if f.node.path == DYNAMIC_FIDELITY:
                await self._invalidate_dynamic()
        return len(buf)

    async def setattr(self, inode, attr, fields, fh, ctx):
        # `echo 5 > control_file` truncates first: a no-op for a control file
        self._count("setattr")
        node = self._node(inode)
        only_size = fields.update_size and not (fields.update_mode or fields.update_uid
                                               or fields.update_gid or fields.update_atime
                                               or fields.update_mtime)
        if node.tree == CONTROL and node.path in self.control.writable and only_size:
            if ctx.uid not in (0, self.uid):
                raise self._error(errno.EACCES)
            return self._attrs(inode, node.tree, node.path, node.is_dir)
        raise self._error(errno.EROFS)

    async def _assemble(self, node: Node, view: str, keep_as: int | None = None) -> bytes:
        """The file's bytes, checksums verified; with keep_as, also handed to the lane's
        image store (in the worker thread: it copies) so later READs and GETATTRs of it
        never reach Python, even once the kernel has dropped its page cache."""
        def read() -> bytes:
            data = self.ds.read(node.path, view)
            if keep_as is not None:
                kernel_shim.keep(keep_as, data)
            return data
        try:
            return await trio.to_thread.run_sync(read, limiter=self.limiter)
        except CorruptDataError as e:
            # once per file at ERROR (a DataLoader retrying it would flood the log)
            key = (view, node.path)
            level = logging.DEBUG if key in self._eio_logged else logging.ERROR
            self._eio_logged.add(key)
            try:
                rec = self.ds.source_entry(node.path, view).record
            except (OSError, KeyError):
                rec = "?"
            log.log(level, "EIO %s/%s (record %s): %s", view, os.fsdecode(node.path), rec,
                    e.detail)
            raise self._error(errno.EIO) from None
        except FileNotFoundError:
            raise self._error(errno.ENOENT) from None
        except OutOfDescriptors as e:
            # a resource limit, not damage: counted apart, the file stays readable later
            self.stats.count("errors", "out_of_descriptors")
            log.error("EIO %s/%s: %s", view, os.fsdecode(node.path), e)
            raise _fail(errno.EIO) from None

    async def release(self, fh):
        self._files.pop(fh, None)

    # flush and fsync are left to pyfuse3's ENOSYS: the kernel then stops sending them,
    # which saves a round trip on every close().

    async def access(self, inode, mode, ctx):
        self._count("access")
        self._node(inode)
        if mode & os.W_OK:
            raise self._error(errno.EROFS)

    # -- xattrs ----------------------------------------------------------------------
    async def getxattr(self, inode, name, ctx):
        self._count("getxattr")
        node = self._node(inode)
        if node.is_dir or node.tree in (0, CONTROL) or name not in XATTRS:
            raise _fail(pyfuse3.ENOATTR)  # a normal answer (ls asks for ACLs), not an error
        view = self._view(node.tree)
        e = self.ds.source_entry(node.path, view)
        if name == b"user.pcrfs.label":
            return str(e.label).encode()
        if name == b"user.pcrfs.scans":  # format views hold the full image
            return str(e.scans if view in self.ds.format_views
                       else min(self.ds.view(view).k, e.scans)).encode()
        if name == b"user.pcrfs.record":  # "record index": what a record-aware sampler needs
            return f"{e.record} {e.index}".encode()
        return view.encode()

    async def listxattr(self, inode, ctx):
        self._count("listxattr")
        node = self._node(inode)
        return [] if node.is_dir or node.tree in (0, CONTROL) else list(XATTRS)

    # -- everything that would modify the dataset -------------------------------------
    async def _read_only(self, *args, **kw):
        raise self._error(errno.EROFS)

    mknod = mkdir = unlink = rmdir = symlink = rename = link = _read_only
    create = setxattr = removexattr = _read_only



def _guard(name: str, handler):
    """pyfuse3 lets a handler raise only FUSEError: anything else ends the main loop and
    with it the mount.  A bug or a damaged index must cost one request, not the mount."""
    @functools.wraps(handler)
    async def guarded(self, *args):
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Exception:
            log.exception("internal error in %s; answered EIO", name)
            if name == "forget":     # no reply to carry an errno
                return None
            raise self._error(errno.EIO) from None
    return guarded


for _name in ("lookup", "forget", "getattr", "opendir", "readdir", "releasedir", "statfs",
              "open", "read", "write", "setattr", "release", "access", "getxattr",
              "listxattr"):
    setattr(PcrfsOperations, _name, _guard(_name, getattr(PcrfsOperations, _name)))

__all__ = ["PcrfsOperations", "ROOT"]
