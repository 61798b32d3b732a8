"""Directories of the mount: OPENDIR, READDIR(PLUS) and RELEASEDIR, as a part of
PcrfsOperations (fs/operations.py).  A listing is made once per opendir and shared by
every open of that directory (its handle is its inode, so a daemon that took over the
mount continues listings its predecessor began); which entries carry attributes is
fs/listing.py's policy."""
from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence

import pyfuse3

from pcrfs.fs.inodes import ROOT, TREE_SHIFT, Node, inode_of

log = logging.getLogger("pcrfs.fs")


class _OpenDir:
    __slots__ = ("ino", "node", "head", "names", "ords", "sizes", "generation", "files_plus")

    def __init__(self, ino: int, node: Node, head: list):
        self.ino, self.node = ino, node
        self.head = head              # (name, tree, path, is_dir, inode): dots, root, .pcrfs
        self.names: list[tuple[bytes, bool]] = []   # a dataset directory's entries
        self.ords: Sequence[int] = ()                # ... and their node ordinals
        self.sizes: dict[bytes, int] | None = None  # their sizes, if files get attributes
        self.generation = 0           # of the view when listed
        self.files_plus = True        # files carry attributes (else bare: fs/listing.py)


class DirectoryOps:
    """The directory handlers; the rest of the operations (inodes, views, attributes,
    counters) are PcrfsOperations'."""

    def _ino(self, tree: int, path: bytes) -> int:
        """The inode of a directory (the dot entries of a listing)."""
        if tree == 0:
            return ROOT
        e = self._view(tree).lookup(path)
        if e is None or not e.is_dir:
            raise ValueError(f"no directory {path!r} in {self._tree_name(tree)}")
        return inode_of(tree, e.ordinal)

    def _head(self, ino: int, node: Node) -> list[tuple[bytes, int, bytes, bool, int]]:
        """(name, tree, path, is_dir, inode) of '.', '..' and, for the root, every view;
        a directory's own entries follow them (`_OpenDir.names`)."""
        if node.tree == 0:
            return ([(b".", 0, b"", True, ROOT), (b"..", 0, b"", True, ROOT)]
                    + [(n, t, b"", True, self._ino(t, b"")) for n, t in self.root.names()])
        parent = node.path.rpartition(b"/")[0]
        ptree = node.tree if node.path else 0
        return [(b".", node.tree, node.path, True, ino),
                (b"..", ptree, parent, True, self._ino(ptree, parent))]

    async def opendir(self, inode, ctx):
        self._count("opendir", inode)
        node = await self._anode(inode)
        if not node.is_dir:
            raise self._error(errno.ENOTDIR)
        if node.tree:
            await self._ready(node.tree, node.path)
        return await self._open_dir(inode, node)

    async def _open_dir(self, inode: int, node: Node) -> int:
        """Its handle is its inode (one listing shared by every open of it, counted), so
        a daemon that took over the mount continues listings its predecessor began."""
        held = self._dirs.get(inode)
        if held is None:
            d = _OpenDir(inode, node, [])
            self._list(d)
            self._dirs[inode] = [d, 1]
        else:
            self._list(held[0])         # a fresh listing for a new opendir, as before
            held[1] += 1
        return inode

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
        d.files_plus = self._bare.offset is None or self.listing.files_plus()
        d.sizes = None
        if d.node.tree == 0:
            return
        view = self._view(d.node.tree)
        d.generation = view.generation()
        try:
            d.names, d.ords, d.sizes = view.list(d.node.path, d.files_plus)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ValueError(str(e)) from None

    async def readdir(self, fh, start_id, token):
        self._count("readdir")
        held = self._dirs.get(fh)
        if held is None:            # opened by the daemon this one took over from
            node = await self._anode(fh)
            if not node.is_dir:
                raise self._error(errno.EBADF)
            await self._open_dir(fh, node)
            held = self._dirs[fh]
        d = held[0]
        if d.node.tree and d.generation != self._view(d.node.tree).generation():
            self._list(d)   # changed since opendir: never hand out sizes of the old state
        head, names = d.head, d.names
        n_head = len(head)
        n_plus = n_bare = 0
        # readdir_reply copies the attributes into the reply at once, so one template per
        # kind serves many entries (large directories are dominated by the second loop).
        for i in range(start_id, n_head):
            name, tree, path, is_dir, ino = head[i]
            if not pyfuse3.readdir_reply(token, name, self._attrs(ino, True), i + 1):
                return self._listed(d, n_plus, n_bare)
            n_plus += 1
            if name not in (b".", b".."):  # dot entries take no lookup reference
                self.inodes.remember(tree, path, is_dir, ino)
        tree, sizes, ords = d.node.tree, d.sizes, d.ords
        prefix = d.node.path + b"/" if d.node.path else b""
        dir_attrs = file_attrs = bare = slot = None
        if not d.files_plus and names:
            bare = self._attrs(0, False)
            slot = self._bare.nodeid_slot(bare)
        top, reply = tree << TREE_SHIFT, pyfuse3.readdir_reply
        for j in range(max(0, start_id - n_head), len(names)):
            name, is_dir = names[j]
            path = prefix + name
            ino = top | ords[j]                               # = inode_of(tree, ords[j])
            if is_dir:
                a = dir_attrs = dir_attrs or self._attrs(ino, True)
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
                if size is None:      # a view without listed sizes (.pcrfs/)
                    a = self._entry_attrs(ino, tree, path, False)
                else:
                    a = file_attrs = file_attrs or self._attrs(ino, False, size)
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
        held = self._dirs.get(fh)
        if held is not None:
            held[1] -= 1
            if held[1] <= 0:
                del self._dirs[fh]
