"""Walking an ImageFolder tree: relative paths as exact bytes, classes as torchvision sees them."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SourceFile:
    relpath: bytes  # exact bytes, '/'-separated, relative to SRC
    label: int
    size: int = field(default=-1, compare=False)   # as listed (ties --part builds together)


def find_classes(src: bytes) -> list[bytes]:
    """Top-level directories sorted the way torchvision's ImageFolder sorts them (by str)."""
    names = [e.name for e in os.scandir(src) if e.is_dir()]
    return sorted(names, key=os.fsdecode)


def walk_sources(src: str | bytes) -> tuple[list[bytes], list[SourceFile], list[bytes]]:
    """(classes, files under class directories in sorted order, files outside any class)."""
    root = os.fsencode(src)
    classes = find_classes(root)
    label = {c: i for i, c in enumerate(classes)}
    files, stray = [], []
    for e in os.scandir(root):
        if e.is_file():
            stray.append(e.name)
    seen: set[tuple[int, int]] = set()   # directories walked, by (device, inode)
    for c in classes:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, c), followlinks=True):
            # Symlinks are followed, but each directory is walked once: a link loop or a
            # second link to the same directory adds nothing (and cannot recurse forever).
            st = os.stat(dirpath)
            if (st.st_dev, st.st_ino) in seen:
                dirnames[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            for name in filenames:
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    files.append(SourceFile(os.path.join(rel, name), label[c], st.st_size))
    files.sort(key=lambda f: f.relpath)
    return classes, files, sorted(stray)


def walk_listing(keys: dict[str, int]) -> tuple[list[bytes], list[SourceFile], list[bytes]]:
    """walk_sources for an object-store prefix, from its listing (key -> size).  Object
    stores have no directories: a class is a first path component with an object below
    it (an empty class directory cannot exist there)."""
    classes = sorted({os.fsencode(k.split("/", 1)[0]) for k in keys if "/" in k.strip("/")},
                     key=os.fsdecode)
    label = {c: i for i, c in enumerate(classes)}
    files, stray = [], []
    for k, size in keys.items():
        if k.endswith("/"):
            continue            # a "directory marker" some tools create
        rel = os.fsencode(k)
        if b"/" in rel:
            files.append(SourceFile(rel, label[rel.split(b"/", 1)[0]], size))
        else:
            stray.append(rel)
    files.sort(key=lambda f: f.relpath)
    return classes, files, sorted(stray)
