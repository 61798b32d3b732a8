"""Naming inodes this process never handed out, for a daemon that took over a live mount
(fs/supervisor.py).  The kernel keeps the inodes, dentries and open handles its
predecessor gave it and goes on sending requests for them with no LOOKUP first.  An
inode says its tree and node ordinal (fs/inodes.py), and ordinals come from the index, so
the path is found again: a directory's from the index's directory numbering, a file's
from its record and index (the lane's name table, or one walk of the index), then the
view's own name for it from its directory's listing.  Blocking (index reads): call it in
a worker thread.  Memory: the directory map, and the file map only where the lane has no
name table (fast_lane=no, remote datasets), about 100 bytes per image, built on the
first file a restarted daemon has to name."""
from __future__ import annotations

import os
import threading

from pcrfs.format.index import DIR_BIT, INDEX_BITS
from pcrfs.fs.inodes import CONTROL, MASK, TREE_SHIFT, Node


class InodeRecovery:
    def __init__(self, root, index, lane_names: dict):
        self.root, self.index, self.lane_names = root, index, lane_names
        self._lock = threading.Lock()           # listings, directories, the counter
        self._files_lock = threading.Lock()     # the file map only: its build is long
        self._dirs: dict[int, bytes] | None = None      # directory ordinal -> path
        self._files: dict[int, bytes] | None = None     # file ordinal -> source path
        self._listings: dict[tuple[int, bytes], dict[int, tuple[bytes, bool]]] = {}
        self.recovered = 0

    def node(self, inode: int) -> Node | None:
        tree, ordinal = inode >> TREE_SHIFT, inode & MASK
        view = self.root.trees.get(tree)
        if view is None:
            return None
        path = self._path(tree, view, ordinal)
        if path is None:
            return None
        e = view.lookup(path)
        if e is None or e.ordinal != ordinal:
            return None
        with self._lock:
            self.recovered += 1
        return Node(tree, path, e.is_dir)

    def _path(self, tree: int, view, ordinal: int) -> bytes | None:
        top = view.lookup(b"")
        if top is not None and top.ordinal == ordinal:
            return b""
        if tree == CONTROL:                 # a few entries, numbered by the view itself
            return self._search(tree, view, b"", ordinal)
        if ordinal & DIR_BIT:
            return self._dir_paths().get(ordinal)
        source = self._source_path(ordinal)
        if source is None:
            return None
        parent = os.path.dirname(source)
        found = self._listing(tree, view, parent).get(ordinal)
        if found is None:
            return None
        return parent + b"/" + found[0] if parent else found[0]

    def _dir_paths(self) -> dict[int, bytes]:
        with self._lock:
            if self._dirs is None:
                self._dirs = {o: p for p, o in self.index.directory_ordinals().items()}
            return self._dirs

    def _source_path(self, ordinal: int) -> bytes | None:
        for names in self.lane_names.values():    # q views keep the source's names
            path = names.path(ordinal)
            e = None if path is None else self.index.lookup(path)
            if e is not None and e.ordinal == ordinal:
                return path
        # one walk of the index, under its own lock: directories and the names the lane
        # knows are recovered meanwhile
        with self._files_lock:
            if self._files is None:
                self._files = {record << INDEX_BITS | index: path
                               for path, record, index in self.index.image_places()}
            return self._files.get(ordinal)

    def _listing(self, tree: int, view, path: bytes) -> dict[int, tuple[bytes, bool]]:
        key = (tree, path)
        with self._lock:
            got = self._listings.get(key)
        if got is None:
            try:
                listing = view.list(path)
            except (FileNotFoundError, NotADirectoryError):
                return {}
            got = {o: n for n, o in zip(listing.names, listing.ords, strict=True)}
            with self._lock:
                if len(self._listings) > 256:    # the directories being read right now
                    self._listings.clear()
                self._listings[key] = got
        return got

    def _search(self, tree: int, view, path: bytes, ordinal: int) -> bytes | None:
        for o, (name, is_dir) in self._listing(tree, view, path).items():
            child = path + b"/" + name if path else name
            if o == ordinal:
                return child
            if is_dir:
                found = self._search(tree, view, child, ordinal)
                if found is not None:
                    return found
        return None
