"""pyfuse3 Operations: translate kernel requests into View calls (views/base.py), nothing
more.  An inode names a tree (a view, composed by fs/root.py) and a path in it.

Blocking work (record reads, splicing, checksums) runs in worker threads under a
CapacityLimiter; the trio loop only does index lookups (LMDB, memory-mapped and warmed
at mount) and bookkeeping.  Every write-type operation fails with EROFS, except writes to
a file its view marks writable, by the mounting user or root.  A write that changes what
a view serves drops the kernel's cached attributes of that view's inodes before it
returns; listings of a view whose generation moved are remade."""
from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from calendar import timegm
from time import strptime, time_ns

import pyfuse3
import trio

from pcrfs.dataset import Dataset
from pcrfs.errors import CorruptDataError
from pcrfs.fs import kernel_shim
from pcrfs.fs.directories import DirectoryOps
from pcrfs.fs.inodes import MASK, ROOT, TREE_SHIFT, InodeTable, Node, inode_of
from pcrfs.fs.listing import BareEntries, ListingPolicy
from pcrfs.fs.live import LiveFiles
from pcrfs.fs.loop import OnLoop
from pcrfs.fs.root import compose
from pcrfs.fs.stats import mount_stats
from pcrfs.singleflight import AsyncSingleFlight
from pcrfs.storage.cache import MemoryTier
from pcrfs.storage.fds import OutOfDescriptors
from pcrfs.views.base import Entry, Opened, View

log = logging.getLogger("pcrfs.fs")

TIMEOUT = 24 * 3600.0        # the dataset is immutable: let the kernel cache freely


REHANDLE = 1 << 55   # a predecessor's handle, made inode | REHANDLE by the shim


def _fail(code: int):
    return pyfuse3.FUSEError(code)


class _OpenFile:
    __slots__ = ("node", "view", "data", "make", "written")

    def __init__(self, node: Node, view: View, opened: Opened):
        self.node = node
        self.view = view
        self.data = opened.data   # bytes known at open (control files); images: _held
        self.make = opened.read   # bound at open (views/base.py Opened)
        self.written = b""        # writable files: what this open has written so far


class PcrfsOperations(DirectoryOps, pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    BLKSIZE = 128 * 1024

    def __init__(self, ds: Dataset, workers: int = 8, fidelity: int | None = None,
                 readdirplus: str = "auto", held_bytes: int = 16 << 20,
                 skip_open: bool = False):
        super().__init__()
        self.ds = ds
        # -o skip_open: once the lane has told the kernel to stop sending OPEN, files are
        # read by inode; control files are then read-only and the dynamic view keeps the
        # fidelity it was mounted with (no open to bind a change to).
        self.skip_open = skip_open
        self._live = LiveFiles()            # counter files' sizes; skip_open: renderings
        self.stats = ds.stats
        self.inodes = InodeTable()
        self.limiter = trio.CapacityLimiter(workers)
        self.root = compose(ds, fidelity, self._stats_snapshot)
        self._switch_lock = trio.Lock()
        self.mtime_ns = timegm(strptime(ds.manifest["created"], "%Y-%m-%dT%H:%M:%SZ")) * 10**9
        self.uid, self.gid = os.getuid(), os.getgid()
        self._files: dict[int, _OpenFile] = {}
        self._trace = log.isEnabledFor(logging.DEBUG)     # --debug: one line per request
        self._eio_logged: set[tuple[str, bytes]] = set()
        self._dirs: dict[int, list] = {}      # inode -> [_OpenDir, opens]
        self.listing = ListingPolicy(readdirplus)
        self._bare = BareEntries()
        if self._bare.offset is None and readdirplus != "yes":
            log.warning("pyfuse3's EntryAttributes layout is not the expected one: every "
                        "listed file gets attributes (readdirplus=yes)")
        self.entries_listed = {"attrs": 0, "bare": 0}
        self._next_fh = 1
        self.fh_epoch = 0                     # the daemon's number under a supervisor
        # Files of immutable views are always served alike, so the fast lane opens them
        # in C with fh = inode (the root numbers those views first: one range).
        self.fast_inodes = self.root.lane_inodes
        # Images of files open through Python (key: fh), and of lane files whose READs
        # raced a first assembly or the store could not take (key: inode): the
        # `open_files` share of the memory budget.  One image too large for it is kept
        # beside it, so a large file is not assembled again for each READ.
        self._held = MemoryTier(held_bytes)
        self._largest: tuple[object, bytes | None] = (None, None)
        self._flight = AsyncSingleFlight()   # one assembly per file however many READs wait
        self.metrics_info: dict[str, str] = {}   # where metrics go (fs/daemon.py)
        # dynamic/ files are opened with fh = the inode of the q-view file they read, so
        # the lane serves their READs as that file's; that inode's node, for the READs
        # the lane hands back (the kernel never looked it up: InodeTable lacks it)
        self._aliases: dict[int, Node] = {}
        self.alias_opens = 0                  # ... their opens (the lane counts the releases)
        self.inode_opens = 0                  # files open here with fh = inode (no lane)
        self.lane_aliases = False             # set by fs/daemon.py once the lane runs
        self.loop = OnLoop()                  # snapshots for other threads (fs/loop.py)
        # tree -> the segment table's names of its files (format/segtab.Names), set by
        # fs/daemon.py before the lane answers LOOKUP in that tree: Python names a file
        # the kernel got from the lane, which InodeTable never saw
        self.lane_names: dict = {}
        # set by fs/daemon.py in a daemon that took over a live mount (fs/supervisor.py):
        # it names the inodes its predecessor handed out (fs/recover.py)
        self.recovery = None
        self.session: dict = {}               # the supervisor's counters, for stats.json

    # -- helpers -----------------------------------------------------------------
    def _stats_snapshot(self) -> dict:
        return mount_stats(self)

    def _view(self, tree: int) -> View:
        return self.root.trees[tree]

    async def _invalidate(self, views: list[View]) -> None:
        """Drop the kernel's cached attributes (sizes) of every file inode of these views
        it holds.  In a worker thread: the notification blocks, and must not stall the loop."""
        inos = [ino for v in views
                for ino in self.inodes.inodes_of(self.root.tree_of(v), files_only=True)]

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
        return "" if tree == 0 else self.root.trees[tree].name

    def _error(self, code: int):
        self.stats.count("errors", errno.errorcode.get(code, str(code)))
        return _fail(code)

    async def _anode(self, inode: int) -> Node:
        """_node, and in a daemon that took over a live mount, an inode its predecessor
        handed out, named again from the index (in a worker thread)."""
        node = self.inodes.get(inode) or self._lane_node(inode)
        if node is None and self.recovery is not None:
            node = await trio.to_thread.run_sync(self.recovery.node, inode,
                                                 limiter=self.limiter)
            if node is not None:
                self.inodes.remember(node.tree, node.path, node.is_dir, inode)
        if node is None:
            raise self._error(errno.ENOENT)
        return node

    def _lane_node(self, inode: int) -> Node | None:
        """A file the lane looked up (csrc/fuse_shim.c, cold_lookup)."""
        names = self.lane_names.get(inode >> TREE_SHIFT)
        if names is None:
            return None
        path = names.path(inode & MASK)
        return None if path is None else Node(inode >> TREE_SHIFT, path, False)

    def _fh(self) -> int:
        """A handle for one open through Python (control files, dynamic/ without the lane):
        (daemon number << 32) | count.  A daemon that took over a mount never hands out a
        number its predecessor gave the kernel (that would read another file): it has a
        new daemon number (fs/daemon.py sets it), and an old handle is unknown, EBADF."""
        self._next_fh += 1
        return self.fh_epoch << 32 | self._next_fh

    def _attrs(self, ino: int, is_dir: bool, size: int = 0, entry: Entry | None = None
               ) -> pyfuse3.EntryAttributes:
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
            a.st_size = size
            if entry is not None:
                if entry.writable:
                    a.st_mode = stat.S_IFREG | 0o644
                if entry.live:
                    a.attr_timeout = 0  # live counters: never cache the size
                    if self.skip_open:  # page-cached, not direct_io: a new mtime makes
                        a.st_mtime_ns = time_ns()   # the kernel drop it at each read()
        a.st_blocks = (a.st_size + 511) // 512
        return a

    def _entry_attrs(self, ino: int, tree: int, path: bytes, is_dir: bool
                     ) -> pyfuse3.EntryAttributes:
        """Attributes of a known node (a file's size asked of its view)."""
        if is_dir or tree == 0:
            return self._attrs(ino, True)
        e = self._view(tree).lookup(path)
        size = 0 if e is None else e.size
        if self.skip_open and e is not None and e.live:
            # size and bytes from one rendering: the kernel reads up to this size, so the
            # READs after this GETATTR must serve these very bytes
            data = self._view(tree).open(path).data
            if data is not None:
                size = len(self._live.render(ino, data, steady=not e.writable))
        elif e is not None:
            size = self._size(ino, e)
        a = self._attrs(ino, False, size, e)
        if e is None:   # not known yet (a b_k file not made): the kernel asks again (LOOKUP)
            a.entry_timeout = a.attr_timeout = 0
        return a

    def _size(self, ino: int, e: Entry) -> int:
        """A file's size as LOOKUP and GETATTR give it: a counter file's is steady, and
        open() pads its rendering to it (fs/live.py)."""
        if e.live and not e.writable and not e.is_dir and not self.skip_open:
            return self._live.size(ino, e.size)
        return e.size

    def _resolve(self, parent: Node, name: bytes) -> tuple[int, bytes, Entry] | None:
        """(tree, path, entry) of name inside parent, or None."""
        if parent.tree == 0:
            tree = self.root.ids.get(name)
            if tree is None:
                return None
            return tree, b"", self._view(tree).lookup(b"")
        path = parent.path + b"/" + name if parent.path else name
        e = self._view(parent.tree).lookup(path)
        return None if e is None else (parent.tree, path, e)

    # -- namespace -----------------------------------------------------------------
    async def lookup(self, parent_inode, name, ctx=None):
        self._count("lookup", parent_inode, name)
        parent = await self._anode(parent_inode)
        if not parent.is_dir:
            raise self._error(errno.ENOTDIR)
        if parent.tree:     # (a view's top is a directory: nothing to get ready)
            await self._ready(parent.tree, parent.path + b"/" + name if parent.path else name)
        found = self._resolve(parent, name)
        if found is None:
            a = pyfuse3.EntryAttributes()   # negative entry, cached by the kernel
            a.st_ino = 0
            a.entry_timeout = TIMEOUT
            return a
        tree, path, e = found
        ino = inode_of(tree, e.ordinal)
        if not e.is_dir:
            self.listing.looked_up(parent_inode)
        try:
            self.inodes.remember(tree, path, e.is_dir, ino)
        except KeyError:
            log.error("inode %d of %r is another path's: damaged index; entry hidden", ino, path)
            raise self._error(errno.EIO) from None
        return self._attrs(ino, e.is_dir, self._size(ino, e), e)

    async def _ready(self, tree: int, path: bytes) -> None:
        """Do a view's slow first-use work (View.pending) in a worker thread."""
        view = self._view(tree)
        work = view.pending(path)
        if work is None:
            return
        try:
            await trio.to_thread.run_sync(work, limiter=self.limiter)
        except CorruptDataError as e:    # (a b_k file made from damaged bytes)
            raise self._corrupt(view, path, e) from None

    async def forget(self, inode_list):
        for ino, n in inode_list:
            self.inodes.forget(ino, n)

    async def getattr(self, inode, ctx=None):
        self._count("getattr", inode)
        node = await self._anode(inode)
        return self._entry_attrs(inode, node.tree, node.path, node.is_dir)

    async def statfs(self, ctx):
        self._count("statfs")
        s = pyfuse3.StatvfsData()
        m = self.ds.manifest
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (m["dataset_bytes"] + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = m["images"] * (len(self.root.trees) - 1)
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # -- files ---------------------------------------------------------------------
    async def open(self, inode, flags, ctx):
        self._count("open", inode, f"flags=0x{flags:x}")
        node = await self._anode(inode)
        if node.is_dir:
            raise self._error(errno.EISDIR)
        view = self._view(node.tree)
        writing = flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_CREAT)
        if writing:
            e = view.lookup(node.path)
            if e is None or not e.writable or self.skip_open:
                raise self._error(errno.EROFS)
            if ctx.uid not in (0, self.uid):
                raise self._error(errno.EACCES)
        if self.lane_aliases and not writing and (other := view.serves_as(node.path)):
            alias = self._lane_alias(other, node.path)
            if alias is not None:
                self.alias_opens += 1
                return pyfuse3.FileInfo(fh=alias, direct_io=True)
        if view.immutable and not writing:
            # as the lane opens them: fh = the inode, the image assembled on first READ
            # (so a daemon that takes over the mount reads the handles it finds)
            self.inode_opens += 1
            return pyfuse3.FileInfo(fh=inode, keep_cache=True)
        fh = self._fh()
        opened = view.open(node.path)
        f = self._files[fh] = _OpenFile(node, view, opened)
        if f.data is not None:
            f.data = self._live.pad(inode, f.data)    # a counter file: to its GETATTR size
        if opened.direct_io:
            # no page cache: it would outlive a change and mix two states across opens
            return pyfuse3.FileInfo(fh=fh, direct_io=True)
        # Assembled on the first read, not here: with a warm page cache (keep_cache) the
        # kernel serves reads itself and an open costs no record I/O at all.
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    def _lane_alias(self, other: View, path: bytes) -> int | None:
        """The inode of the file of `other` a file is now (a dynamic/ file's q-view file,
        its fidelity bound at open as Python's own opens bind it), if the lane serves it."""
        e = other.lookup(path)
        tree = self.root.tree_of(other)
        ino = inode_of(tree, e.ordinal) if e is not None and not e.is_dir else None
        lo, hi = self.fast_inodes
        if ino is None or not lo <= ino < hi:
            return None
        self._aliases[ino] = Node(tree, path, False)
        return ino

    async def read(self, fh, off, size):
        f = self._files.get(fh)
        if f is None and fh & REHANDLE and fh >> TREE_SHIFT:
            f = await self._reopen(fh)
        if f is None:                 # opened by the fast lane: fh is the inode
            return await self._read_fast(fh, off, size)
        if self._trace:
            self._count("read", None,
                        f"{f.view.name}/{os.fsdecode(f.node.path)} off={off} size={size}")
        else:
            self.stats.count("requests", "read")
        data = f.data
        if data is None:
            data = await self._held_image(("fh", fh), lambda: self._assemble(f.node, f.view, f.make))
        return memoryview(data)[off : off + size]   # pyfuse3 takes any buffer: no copy

    async def _reopen(self, fh: int) -> _OpenFile:
        """A file a predecessor of this daemon opened (fs/supervisor.py): the shim made its
        handle the inode | REHANDLE (csrc/fuse_shim.c, pcrfs_lane_rehandle).  Opened
        again, as now (a control file's rendering, dynamic/'s fidelity), for every READ
        and WRITE of that handle until its RELEASE."""
        node = await self._anode(fh & ~REHANDLE)
        if node.is_dir:
            raise self._error(errno.EBADF)
        view = self._view(node.tree)
        try:
            f = self._files[fh] = _OpenFile(node, view, view.open(node.path))
        except FileNotFoundError:
            raise self._error(errno.ENOENT) from None
        return f

    async def _held_image(self, key, make):
        """An image of the open-files share, assembled once for all READs that wait."""
        data = self._held.get(key)
        if data is None and self._largest[0] == key:
            data = self._largest[1]
        if data is None:
            async def assemble():
                out = await make()
                if not self._held.put(key, out):
                    self._largest = (key, out)   # too large for the share: the newest one
                return out
            data = await self._flight.do(key, assemble)
        return data

    async def _read_fast(self, ino: int, off: int, size: int) -> bytes:
        if self._trace:
            self._count("read", ino, f"off={off} size={size}")
        else:
            self.stats.count("requests", "read")
        lo, hi = self.fast_inodes
        if not lo <= ino < hi:
            if self.skip_open:
                return await self._read_unopened(ino, off, size)
            raise self._error(errno.EBADF)
        # kept by the lane after this READ was handed over (a concurrent first read)
        data = kernel_shim.kept(ino, off, size)
        if data is not None:
            return data
        node = self.inodes.get(ino) or self._aliases.get(ino) or await self._anode(ino)
        view = self._view(node.tree)
        data = await self._held_image(
            ino, lambda: self._assemble(node, view, lambda: view.read(node.path), keep_as=ino))
        return memoryview(data)[off : off + size]

    async def _read_unopened(self, ino: int, off: int, size: int) -> bytes:
        """-o skip_open: a READ of a file outside the lane's views that the kernel never
        opened here (the lane made fh its inode): a live control file as rendered at its
        last GETATTR, another control file, or a dynamic-view file at the fidelity the
        mount keeps."""
        node = self.inodes.get(ino)
        if node is None or node.is_dir or node.tree == 0:
            raise self._error(errno.EBADF)
        data = self._live.get(ino)
        if data is None:
            view = self._view(node.tree)
            try:
                opened = view.open(node.path)
            except FileNotFoundError:
                raise self._error(errno.ENOENT) from None
            data = opened.data
            if data is None:
                data = await self._held_image(
                    ino, lambda: self._assemble(node, view, opened.read))
        return memoryview(data)[off : off + size]

    async def write(self, fh, off, buf):
        self._count("write")
        f = self._files.get(fh)
        if f is None and fh & REHANDLE and fh >> TREE_SHIFT:
            f = await self._reopen(fh)
        if f is None:
            raise self._error(errno.EROFS)
        value = f.written + bytes(buf) if off else bytes(buf)
        if len(value) > 64:
            raise self._error(errno.EINVAL)
        async with self._switch_lock:   # one change and its invalidation at a time
            try:
                changed = f.view.write(f.node.path, value)
            except PermissionError:
                raise self._error(errno.EROFS) from None
            except ValueError as e:
                log.warning("rejected write to %s/%s: %s", f.view.name,
                            os.fsdecode(f.node.path), e)
                raise self._error(errno.EINVAL) from None
            f.written = value
            if changed:
                await self._invalidate(changed)
        return len(buf)

    async def setattr(self, inode, attr, fields, fh, ctx):
        # `echo 5 > control_file` truncates first: a no-op for a control file
        self._count("setattr")
        node = await self._anode(inode)
        only_size = fields.update_size and not (fields.update_mode or fields.update_uid
                                               or fields.update_gid or fields.update_atime
                                               or fields.update_mtime)
        e = None if node.tree == 0 else self._view(node.tree).lookup(node.path)
        if e is not None and e.writable and only_size:
            if ctx.uid not in (0, self.uid):
                raise self._error(errno.EACCES)
            return self._attrs(inode, False, e.size, e)
        raise self._error(errno.EROFS)

    async def _assemble(self, node: Node, view: View, make, keep_as: int | None = None
                        ) -> bytes:
        """The file's bytes from make() (checksums verified by the view); with keep_as,
        also handed to the lane's image store (in the worker thread: it copies) so later
        READs and GETATTRs of it never reach Python, even once the kernel has dropped its
        page cache."""
        def read() -> bytes:
            data = make()
            # a file's inode is its view's tree << TREE_SHIFT | the entry's ordinal
            if keep_as is not None and self.ds.lane_keeps(view, keep_as & MASK):
                kernel_shim.keep(keep_as, data)
            return data
        try:
            return await trio.to_thread.run_sync(read, limiter=self.limiter)
        except CorruptDataError as e:
            raise self._corrupt(view, node.path, e) from None
        except FileNotFoundError:
            raise self._error(errno.ENOENT) from None
        except OutOfDescriptors as e:
            # a resource limit, not damage: counted apart, the file stays readable later
            self.stats.count("errors", "out_of_descriptors")
            log.error("EIO %s/%s: %s", view.name, os.fsdecode(node.path), e)
            raise _fail(errno.EIO) from None

    def _corrupt(self, view: View, path: bytes, e: CorruptDataError) -> pyfuse3.FUSEError:
        """EIO for damaged bytes, logged once per file at ERROR (a DataLoader retrying it
        would flood the log)."""
        key = (view.name, path)
        level = logging.DEBUG if key in self._eio_logged else logging.ERROR
        self._eio_logged.add(key)
        log.log(level, "EIO %s/%s (%s): %s", view.name, os.fsdecode(path), view.where(path),
                e.detail)
        return self._error(errno.EIO)

    async def release(self, fh):
        if fh not in self._files:
            lo, hi = self.fast_inodes
            if lo <= fh < hi and not fh & REHANDLE and self.inode_opens:   # (not one a
                # predecessor opened)
                self.inode_opens -= 1
            return
        if self._files.pop(fh, None) is not None:
            self._held.discard(("fh", fh))
            if self._largest[0] == ("fh", fh):
                self._largest = (None, None)

    # flush and fsync are left to pyfuse3's ENOSYS: the kernel then stops sending them,
    # which saves a round trip on every close().

    async def access(self, inode, mode, ctx):
        self._count("access")
        await self._anode(inode)
        if mode & os.W_OK:
            raise self._error(errno.EROFS)

    # -- xattrs ----------------------------------------------------------------------
    def _xattrs(self, node: Node) -> dict[bytes, bytes]:
        if node.is_dir or node.tree == 0:
            return {}
        try:
            return self._view(node.tree).xattrs(node.path)
        except FileNotFoundError:
            raise self._error(errno.ENOENT) from None

    async def getxattr(self, inode, name, ctx):
        self._count("getxattr")
        value = self._xattrs(await self._anode(inode)).get(name)
        if value is None:
            raise _fail(pyfuse3.ENOATTR)  # a normal answer (ls asks for ACLs), not an error
        return value

    async def listxattr(self, inode, ctx):
        self._count("listxattr")
        return list(self._xattrs(await self._anode(inode)))

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


# the handlers pyfuse3 calls (timed with metrics on: pcrfs/telemetry/metrics.py)
TIMED = ("lookup", "forget", "getattr", "opendir", "readdir", "releasedir", "statfs", "open",
         "read", "write", "setattr", "release", "access", "getxattr", "listxattr")
for _name in TIMED:
    setattr(PcrfsOperations, _name, _guard(_name, getattr(PcrfsOperations, _name)))

__all__ = ["PcrfsOperations", "ROOT"]
