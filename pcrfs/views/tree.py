"""TreeView: a view that mirrors the dataset's directory tree, one file per image.

Directories, their node ordinals and listings come from the index; a subclass says how
an image is named, sized and produced.  Files of every tree view share the source image's
ordinal, so inode numbers are unique within each view by construction."""
from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Iterable

from pcrfs.format.index import ImageEntry
from pcrfs.storage.cache import MemoryTier
from pcrfs.views.base import Entry, Listing, View


class TreeView(View):
    def __init__(self, ds):
        self.ds = ds
        self.index = ds.index
        self._classes: dict[bytes, dict[bytes, int]] = {}   # directory -> its subdirs' ranks

    # -- what a subclass defines ---------------------------------------------------
    def entry(self, path: bytes) -> ImageEntry:
        """The source image behind a file of this view; FileNotFoundError if none."""
        e = self.index.lookup(path)
        if e is None:
            raise FileNotFoundError(errno.ENOENT, "no such image", os.fsdecode(path))
        return e

    def file_size(self, e: ImageEntry) -> int | None:
        raise NotImplementedError

    def produce(self, path: bytes, e: ImageEntry) -> bytes:
        """The bytes of file `path`, whose source image is e."""
        raise NotImplementedError

    def universe(self, tier: str):
        """What a static tier ("memory", "disk") admits this view's files from: a
        Dataset.universe; None: the policy's plain fraction."""
        return None

    # -- the View interface -----------------------------------------------------------
    def lookup(self, path: bytes) -> Entry | None:
        heads = self.index.dir_ordinals(path)
        if heads is not None:
            return Entry(True, 0, heads[0])
        if not self.index.numbered and self.index.is_dir(path):
            return Entry(True, 0, 0)   # an older index (tools only: the mount refuses it)
        try:
            e = self.entry(path)
        except FileNotFoundError:
            return None
        size = self.file_size(e)
        return None if size is None else Entry(False, size, e.ordinal)

    def names(self, path: bytes) -> list[tuple[bytes, bool]]:
        """[(name, is_dir)] as this view names them, sorted by name bytes."""
        out = self.index.listdir(path)
        if out is None:
            if self.index.lookup(path) is not None:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", os.fsdecode(path))
            raise FileNotFoundError(errno.ENOENT, "no such directory", os.fsdecode(path))
        return self.rename(path, out)

    def rename(self, path: bytes, src: list[tuple[bytes, bool]]) -> list[tuple[bytes, bool]]:
        """A directory's source listing as this view names it (sorted by name bytes)."""
        return src

    def source_name(self, parent: bytes, name: bytes) -> bytes:
        """The source file name behind `name` in directory `parent` of this view."""
        return name

    def files_in_dir(self, path: bytes) -> dict[bytes, tuple[int, int | None]]:
        """source name -> (ordinal, size in this view) of a directory's files: one walk."""
        raise NotImplementedError

    def list(self, path: bytes, sizes: bool = False) -> Listing:
        """One read of the listing, which holds the files' ordinals as runs in a sorted
        build; only sizes or a build without runs cost an ordered walk of the entries."""
        found = self.index.dir_numbering(path)
        if found is None:
            self.names(path)             # the error a missing directory gets
            raise ValueError("the index has no node numbers (older pcrfs): run `pcrfs reindex`")
        src, sub, file_ords = found
        names = self.rename(path, src)
        ords: list[int] = []
        if file_ords is not None and not sizes:    # stored runs: nothing per entry
            it = iter(file_ords)
            if names is not src:                     # renamed: runs follow source order
                by_src = {n: next(it) for n, d in src if not d}
                it = (by_src[self.source_name(path, n)] for n, d in names if not d)
            for _, d in names:
                if d:
                    ords.append(sub)
                    sub += 1
                else:
                    ords.append(next(it))
            return Listing(names, ords, None)
        files = self.files_in_dir(path)            # one ordered walk: ordinals and sizes
        out = {} if sizes else None
        try:
            for n, d in names:
                if d:
                    ords.append(sub)
                    sub += 1
                    continue
                o, size = files[self.source_name(path, n)]
                ords.append(o)
                if out is not None and size is not None:
                    out[n] = size
        except KeyError:
            raise ValueError("the directory listing names a file the index has no entry for") from None
        return Listing(names, ords, out)

    def read(self, path: bytes) -> bytes:
        e = self.entry(path)
        data = self.ds.pinned(self, e, lambda: self.produce(path, e))
        self.ds.stats.count("served_bytes", self.name, len(data))
        self.ds.stats.count("served_files", self.name)
        return data

    def where(self, path: bytes) -> str:
        try:
            return f"record {self.entry(path).record}"
        except (OSError, KeyError):
            return "record ?"

    def scans(self, e: ImageEntry) -> int:
        return e.scans

    def class_label(self, path: bytes, stored: int) -> int:
        """ImageFolder's label of the image at path for the root one level above its
        directory: that directory's rank among its sorted sibling directories.  On a
        flat tree (root/class/img) it is the build's label; on train/val trees it is
        ImageFolder("MNT/qk/train")'s, not the rank of train/ itself."""
        parent, _, _ = path.rpartition(b"/")
        if not parent:
            return stored
        grand, _, name = parent.rpartition(b"/")
        table = self._classes.get(grand)
        if table is None:
            listing = self.index.listdir(grand) or []
            table = {n: i for i, n in enumerate(sorted(n for n, d in listing if d))}
            if len(self._classes) >= 4096:
                self._classes.clear()
            self._classes[grand] = table
        return table.get(name, stored)

    def xattrs(self, path: bytes) -> dict[bytes, bytes]:
        e = self.entry(path)
        return {b"user.pcrfs.label": str(self.class_label(path, e.label)).encode(),
                b"user.pcrfs.scans": str(self.scans(e)).encode(),
                b"user.pcrfs.view": self.name.encode(),
                # "record index": what a record-aware sampler needs
                b"user.pcrfs.record": f"{e.record} {e.index}".encode()}


def _stem(name: bytes) -> bytes:
    dot = name.rfind(b".")
    return name[:dot] if dot > 0 else name


def format_names(files: Iterable[bytes], suffix: bytes) -> dict[bytes, bytes]:
    """source file name -> its name in a format view, for the files of one directory:
    foo.jpg -> foo<suffix>; when two files share a stem (foo.jpg, foo.png) both keep
    their full name (foo.jpg<suffix>), so the mapping is unambiguous and depends only on
    the directory listing."""
    files = list(files)
    stems = Counter(_stem(f) for f in files)
    return {f: (_stem(f) if stems[_stem(f)] == 1 else f) + suffix for f in files}


class FormatView(TreeView):
    """A tree view whose files are the images in another format, named by format_names
    with the class's `suffix` (l3, raw)."""
    suffix = b""

    def __init__(self, ds):
        super().__init__(ds)
        self._maps = MemoryTier(256, sizeof=lambda v: 1)   # dir -> {view name: source name}

    def rename(self, path, src):
        names = format_names((n for n, d in src if not d), self.suffix)
        return sorted((n if d else names[n], d) for n, d in src)

    def _dir_map(self, parent: bytes) -> dict[bytes, bytes]:
        found = self._maps.get(parent)
        if found is not None:
            return found
        listing = self.index.listdir(parent) or []
        rev = {v: k for k, v in format_names((n for n, d in listing if not d), self.suffix).items()}
        self._maps.put(parent, rev)
        return rev

    def source_name(self, parent: bytes, name: bytes) -> bytes:
        return self._dir_map(parent)[name]

    def source(self, path: bytes) -> bytes | None:
        """The source path behind a path of this view, or None (names map per directory)."""
        parent, _, name = path.rpartition(b"/")
        src = self._dir_map(parent).get(name)
        return None if src is None else (parent + b"/" + src if parent else src)
