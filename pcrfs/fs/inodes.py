"""Inode numbers that are stable across remounts and unique by construction.

inode = tree id << 56 | node ordinal.  The ordinal is assigned at build time, one per
file and directory of the dataset (format/index.py, `assign_ordinals`), so it survives
remounts and `pcrfs reindex`, and no two paths of a tree can share an inode: every cache
keyed by inode (the fast lane's image store among them) is safe.  Tree ids: 1..G are the
views q1..qG, then the format views and dynamic/; CONTROL is the hidden .pcrfs directory,
numbered by views/control.py; the root is FUSE's inode 1.  The table only remembers inodes
the kernel holds (lookup counts), so memory follows the dcache."""
from __future__ import annotations

from typing import NamedTuple

import pyfuse3

ROOT = pyfuse3.ROOT_INODE
CONTROL = 0xFE
TREE_SHIFT = 56
MASK = (1 << TREE_SHIFT) - 1


class Node(NamedTuple):
    tree: int          # view id, CONTROL, or 0 for the root
    path: bytes        # relative to the tree's top ('' is the top itself)
    is_dir: bool


def inode_of(tree: int, ordinal: int) -> int:
    if not 0 <= ordinal <= MASK:
        raise ValueError(f"node ordinal {ordinal} out of range")
    return ROOT if tree == 0 else (tree << TREE_SHIFT) | ordinal


class InodeTable:
    """Nodes are stored as plain tuples of atoms and counts as ints, which Python's cyclic
    GC untracks: a million known inodes cost memory but no collector time."""

    def __init__(self):
        self._nodes: dict[int, tuple[int, bytes, bool]] = {ROOT: (0, b"", True)}
        self._lookups: dict[int, int] = {ROOT: 1}

    def get(self, inode: int) -> Node | None:
        t = self._nodes.get(inode)
        return None if t is None else Node(*t)

    def remember(self, tree: int, path: bytes, is_dir: bool, ino: int) -> int:
        """One more kernel reference to ino, the inode of (tree, path)."""
        node = self._nodes.get(ino)
        if node is None:
            self._nodes[ino] = (tree, path, is_dir)
        elif node[1] != path or node[0] != tree:
            # impossible with a sound index (ordinals are unique); a damaged one must not
            # make one path answer for another
            raise KeyError(path)
        self._lookups[ino] = self._lookups.get(ino, 0) + 1
        return ino

    def forget(self, inode: int, n: int) -> None:
        if inode == ROOT or inode not in self._lookups:
            return
        left = self._lookups[inode] - n
        if left > 0:
            self._lookups[inode] = left
        else:
            del self._lookups[inode]
            del self._nodes[inode]

    def inodes_of(self, tree: int, files_only: bool = False) -> list[int]:
        """Every inode of one tree the kernel holds."""
        return [ino for ino, (t, _, is_dir) in self._nodes.items()
                if t == tree and not (files_only and is_dir)]

    def __len__(self) -> int:
        return len(self._nodes)
