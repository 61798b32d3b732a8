"""Inode numbers that are stable across remounts: derived from (tree, path), not counters.

inode = tree id << 56 | low 56 bits of XXH3-64(path).  Tree ids: 1..G are the views
q1..qG, CONTROL is the hidden .pcrfs directory; the root is FUSE's inode 1.  The table
only remembers inodes the kernel holds (lookup counts), so memory follows the dcache."""
from __future__ import annotations

from dataclasses import dataclass

import pyfuse3
import xxhash

ROOT = pyfuse3.ROOT_INODE
CONTROL = 0xFE
MASK = (1 << 56) - 1


@dataclass(slots=True)
class Node:
    tree: int          # view id, CONTROL, or 0 for the root
    path: bytes        # relative to the tree's top ('' is the top itself)
    is_dir: bool
    lookups: int = 0


def inode_of(tree: int, path: bytes) -> int:
    return (tree << 56) | (xxhash.xxh3_64_intdigest(path) & MASK)


class InodeTable:
    def __init__(self):
        self._nodes: dict[int, Node] = {ROOT: Node(0, b"", True, 1)}
        self.collisions = 0

    def get(self, inode: int) -> Node | None:
        return self._nodes.get(inode)

    def remember(self, tree: int, path: bytes, is_dir: bool, ino: int = 0) -> int:
        """The inode for (tree, path) (pass ino if already computed); one more kernel
        reference to it."""
        ino = ino or inode_of(tree, path)
        node = self._nodes.get(ino)
        if node is None:
            node = self._nodes[ino] = Node(tree, path, is_dir)
        elif node.tree != tree or node.path != path:
            # 56-bit hash collision: about 1e-5 for a million paths.  Keep the first.
            self.collisions += 1
            raise KeyError(path)
        node.lookups += 1
        return ino

    def forget(self, inode: int, n: int) -> None:
        node = self._nodes.get(inode)
        if node is None or inode == ROOT:
            return
        node.lookups -= n
        if node.lookups <= 0:
            del self._nodes[inode]

    def __len__(self) -> int:
        return len(self._nodes)
