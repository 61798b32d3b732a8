"""Inode numbers that are stable across remounts: derived from (tree, path), not counters.

inode = tree id << 56 | low 56 bits of XXH3-64(path).  Tree ids: 1..G are the views
q1..qG, then the format views and dynamic/; CONTROL is the hidden .pcrfs directory; the
root is FUSE's inode 1.  The table
only remembers inodes the kernel holds (lookup counts), so memory follows the dcache."""
from __future__ import annotations

from typing import NamedTuple

import pyfuse3
import xxhash

ROOT = pyfuse3.ROOT_INODE
CONTROL = 0xFE
MASK = (1 << 56) - 1


class Node(NamedTuple):
    tree: int          # view id, CONTROL, or 0 for the root
    path: bytes        # relative to the tree's top ('' is the top itself)
    is_dir: bool


def inode_of(tree: int, path: bytes) -> int:
    return (tree << 56) | (xxhash.xxh3_64_intdigest(path) & MASK)


class InodeTable:
    """Nodes are stored as plain tuples of atoms and counts as ints, which Python's cyclic
    GC untracks: a million known inodes cost memory but no collector time."""

    def __init__(self):
        self._nodes: dict[int, tuple[int, bytes, bool]] = {ROOT: (0, b"", True)}
        self._lookups: dict[int, int] = {ROOT: 1}
        self.collisions = 0

    def get(self, inode: int) -> Node | None:
        t = self._nodes.get(inode)
        return None if t is None else Node(*t)

    def remember(self, tree: int, path: bytes, is_dir: bool, ino: int = 0) -> int:
        """The inode for (tree, path) (pass ino if already computed); one more kernel
        reference to it."""
        ino = ino or inode_of(tree, path)
        node = self._nodes.get(ino)
        if node is None:
            self._nodes[ino] = (tree, path, is_dir)
        elif node[1] != path or node[0] != tree:
            # 56-bit hash collision: about 1e-5 for a million paths.  Keep the first.
            self.collisions += 1
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
