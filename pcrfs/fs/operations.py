"""pyfuse3 Operations: translate kernel requests into Dataset calls, nothing more.

Blocking work (record reads, splicing, checksums) runs in worker threads under a
CapacityLimiter; the trio loop only does index lookups (LMDB, memory-mapped and warmed
at mount) and bookkeeping.  Every write-type operation fails with EROFS."""
from __future__ import annotations

import errno
import logging
import os
import stat
from calendar import timegm
from time import strptime

import pyfuse3
import trio

from pcrfs.dataset import Dataset
from pcrfs.errors import CorruptDataError
from pcrfs.fs.control import ControlFiles
from pcrfs.fs.inodes import CONTROL, ROOT, InodeTable, Node, inode_of

log = logging.getLogger("pcrfs.fs")

TIMEOUT = 24 * 3600.0        # the dataset is immutable: let the kernel cache freely
CONTROL_DIR = b".pcrfs"
XATTRS = (b"user.pcrfs.label", b"user.pcrfs.scans", b"user.pcrfs.view")


def _fail(code: int):
    return pyfuse3.FUSEError(code)


class _OpenFile:
    __slots__ = ("node", "data", "lock")

    def __init__(self, node: Node, data: bytes | None = None):
        self.node = node
        self.data = data
        self.lock = trio.Lock()


class PcrfsOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, ds: Dataset, workers: int = 8):
        super().__init__()
        self.ds = ds
        self.stats = ds.stats
        self.inodes = InodeTable()
        self.limiter = trio.CapacityLimiter(workers)
        self.view_names = list(ds.all_views)                        # tree id i+1 -> name
        self.view_ids = {v.encode(): i + 1 for i, v in enumerate(self.view_names)}
        self.control = ControlFiles(ds.manifest, self._stats_snapshot)
        self.mtime_ns = timegm(strptime(ds.manifest["created"], "%Y-%m-%dT%H:%M:%SZ")) * 10**9
        self.uid, self.gid = os.getuid(), os.getgid()
        self._files: dict[int, _OpenFile] = {}
        self._dirs: dict[int, list[tuple[bytes, int, bytes, bool, int | None]]] = {}
        self._next_fh = 1

    # -- helpers -----------------------------------------------------------------
    def _stats_snapshot(self) -> dict:
        s = self.stats.snapshot()
        s["open_files"] = len(self._files)
        s["known_inodes"] = len(self.inodes)
        s["cache_bytes"] = self.ds.reader.cache.used
        s["cache_capacity"] = self.ds.reader.cache.capacity
        t = self.ds.reader.throttle
        s["bandwidth_limit_bytes_per_s"] = int(t.rate) if t else None
        return s

    def _count(self, op: str) -> None:
        self.stats.count("requests", op)

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
        a.st_blksize = 128 * 1024
        if is_dir:
            a.st_mode = stat.S_IFDIR | 0o555
            a.st_nlink = 2
            a.st_size = 0
        else:
            a.st_mode = stat.S_IFREG | 0o444
            a.st_nlink = 1
            if tree == CONTROL:
                a.st_size = len(self.control.render(path))
                if path not in self.control.static:
                    a.attr_timeout = 0  # live counters: never cache the size
            elif size is not None:
                a.st_size = size
            else:
                a.st_size = self.ds.file_size(path, self.view_names[tree - 1]) or 0
        a.st_blocks = (a.st_size + 511) // 512
        return a

    def _resolve(self, parent: Node, name: bytes) -> tuple[int, bytes, bool] | None:
        """(tree, path, is_dir) of name inside parent, or None."""
        if parent.tree == 0:
            if name in self.view_ids:
                return self.view_ids[name], b"", True
            if name == CONTROL_DIR:
                return CONTROL, b"", True
            return None
        if parent.tree == CONTROL:
            return (CONTROL, name, False) if parent.path == b"" and self.control.exists(name) else None
        path = parent.path + b"/" + name if parent.path else name
        if self.ds.index.is_dir(path):
            return parent.tree, path, True
        if self.ds.file_size(path, self.view_names[parent.tree - 1]) is not None:
            return parent.tree, path, False
        return None

    def _children(self, node: Node) -> list[tuple[bytes, int, bytes, bool]]:
        """(name, tree, path, is_dir) for '.', '..' and every entry of a directory."""
        if node.tree == 0:
            return ([(b".", 0, b"", True), (b"..", 0, b"", True)]
                    + [(v, i, b"", True) for v, i in self.view_ids.items()]
                    + [(CONTROL_DIR, CONTROL, b"", True)])
        parent = node.path.rpartition(b"/")[0]
        out = [(b".", node.tree, node.path, True),
               (b"..", node.tree if node.path else 0, parent, True)]
        if node.tree == CONTROL:
            return out + [(n, CONTROL, n, False) for n in self.control.names()]
        for name, is_dir in self.ds.listdir(node.path, self.view_names[node.tree - 1]):
            out.append((name, node.tree, node.path + b"/" + name if node.path else name, is_dir))
        return out

    # -- namespace -----------------------------------------------------------------
    async def lookup(self, parent_inode, name, ctx=None):
        self._count("lookup")
        parent = self._node(parent_inode)
        if not parent.is_dir:
            raise self._error(errno.ENOTDIR)
        found = self._resolve(parent, name)
        if found is None:
            a = pyfuse3.EntryAttributes()   # negative entry, cached by the kernel
            a.st_ino = 0
            a.entry_timeout = TIMEOUT
            return a
        tree, path, is_dir = found
        try:
            ino = self.inodes.remember(tree, path, is_dir)
        except KeyError:
            log.error("inode collision for %r; entry hidden", path)
            raise self._error(errno.EIO) from None
        return self._attrs(ino, tree, path, is_dir)

    async def forget(self, inode_list):
        for ino, n in inode_list:
            self.inodes.forget(ino, n)

    async def getattr(self, inode, ctx=None):
        self._count("getattr")
        node = self._node(inode)
        return self._attrs(inode, node.tree, node.path, node.is_dir)

    async def opendir(self, inode, ctx):
        self._count("opendir")
        node = self._node(inode)
        if not node.is_dir:
            raise self._error(errno.ENOTDIR)
        fh = self._fh()
        children = self._children(node)
        sizes = [None] * len(children)
        if 0 < node.tree < CONTROL and any(not c[3] for c in children):
            # file sizes for readdirplus, from one ordered index walk
            known = self.ds.sizes_in_dir(node.path, self.view_names[node.tree - 1])
            sizes = [known.get(c[0]) if not c[3] else None for c in children]
        self._dirs[fh] = [(*c, s) for c, s in zip(children, sizes, strict=True)]
        return fh

    async def readdir(self, fh, start_id, token):
        self._count("readdir")
        entries = self._dirs[fh]
        # readdir_reply copies the attributes into the reply at once, so one template
        # per kind serves every entry (large directories are dominated by this loop).
        tpl = {True: None, False: None}
        for i in range(start_id, len(entries)):
            name, tree, path, is_dir, size = entries[i]
            ino = ROOT if tree == 0 else inode_of(tree, path)
            a = tpl[is_dir]
            if a is None or tree == CONTROL or size is None:
                a = tpl[is_dir] = self._attrs(ino, tree, path, is_dir, size)
            else:
                a.st_ino = ino
                a.st_size = size
                a.st_blocks = (size + 511) // 512
            if not pyfuse3.readdir_reply(token, name, a, i + 1):
                return
            if name not in (b".", b".."):  # dot entries take no lookup reference
                self.inodes.remember(tree, path, is_dir, ino)
            if tree == CONTROL or size is None:
                tpl[is_dir] = None

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
        self._count("open")
        node = self._node(inode)
        if node.is_dir:
            raise self._error(errno.EISDIR)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_CREAT):
            raise self._error(errno.EROFS)
        fh = self._fh()
        if node.tree == CONTROL:
            self._files[fh] = _OpenFile(node, self.control.render(node.path))
            return pyfuse3.FileInfo(fh=fh, direct_io=True)
        # Assembled on the first read, not here: with a warm page cache (keep_cache) the
        # kernel serves reads itself and an open costs no record I/O at all.
        self._files[fh] = _OpenFile(node)
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh, off, size):
        self._count("read")
        f = self._files[fh]
        if f.data is None:
            async with f.lock:
                if f.data is None:
                    f.data = await self._assemble(f.node)
        return f.data[off : off + size]

    async def _assemble(self, node: Node) -> bytes:
        view = self.view_names[node.tree - 1]
        try:
            return await trio.to_thread.run_sync(self.ds.read, node.path, view,
                                                 limiter=self.limiter)
        except CorruptDataError as e:
            log.error("EIO %s/%s: %s", view, os.fsdecode(node.path), e.detail)
            raise self._error(errno.EIO) from None
        except FileNotFoundError:
            raise self._error(errno.ENOENT) from None

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
        view = self.view_names[node.tree - 1]
        e = self.ds.source_entry(node.path, view)
        if name == b"user.pcrfs.label":
            return str(e.label).encode()
        if name == b"user.pcrfs.scans":  # format views hold the full image
            return str(e.scans if view in self.ds.format_views else min(node.tree, e.scans)).encode()
        return view.encode()

    async def listxattr(self, inode, ctx):
        self._count("listxattr")
        node = self._node(inode)
        return [] if node.is_dir or node.tree in (0, CONTROL) else list(XATTRS)

    # -- everything that would modify the dataset -------------------------------------
    async def _read_only(self, *args, **kw):
        raise self._error(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _read_only
    create = write = setxattr = removexattr = _read_only


__all__ = ["PcrfsOperations", "ROOT"]
