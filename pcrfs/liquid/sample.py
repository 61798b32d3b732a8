"""The images `pcrfs tune` probes: a seeded sample of a mount's files, their q and raw
paths, raw ranks, and end-to-end passes over images the probes did not read."""
from __future__ import annotations

import os

import numpy as np

from pcrfs.control import read_manifest
from pcrfs.errors import PcrfsError
from pcrfs.liquid.rules import raw_ranks


class Sample:
    """n images of a mount: their q paths, raw paths and raw ranks."""

    def __init__(self, mnt: str, n: int, seed: int = 0):
        from pcrfs.format.index import INDEX_BITS
        from pcrfs.views.raw import SUFFIX
        from pcrfs.views.tree import format_names
        self.groups = int(read_manifest(mnt)["groups"])
        self.mnt = mnt
        top = os.path.join(mnt, f"q{self.groups}")
        rels = []
        for d, dirs, files in os.walk(top):
            dirs.sort()
            names = format_names((os.fsencode(x) for x in files), SUFFIX)
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(d, f), top)
                rels.append((rel, os.path.join(os.path.dirname(rel), os.fsdecode(names[os.fsencode(f)]))))
        if not rels:
            raise PcrfsError(f"{mnt}: no images under q{self.groups}/")
        self.total = len(rels)
        order = np.random.default_rng(seed).permutation(len(rels))
        self.items = [rels[i] for i in sorted(order[: n])]
        # an image outside the sample where there is one, to wake the daemon's data path
        self.spare = rels[order[n]][0] if len(rels) > n else self.items[0][0]
        # the images never read by the probes, for the finalists' end-to-end passes
        self.rest = [rels[i] for i in order[n + 1:]]
        self._top = top
        ords = self._ordinals(self.items)
        self.records = sorted({int(o) >> INDEX_BITS for o in ords})
        self.ranks = raw_ranks(ords)

    def _ordinals(self, items) -> np.ndarray:
        from pcrfs.format.index import INDEX_BITS
        ords = []
        for rel, _ in items:
            rec, idx = os.getxattr(os.path.join(self._top, rel), "user.pcrfs.record").split()
            ords.append(int(rec) << INDEX_BITS | int(idx))
        return np.array(ords, dtype=np.uint64)

    def path(self, item: tuple[str, str], rank: float, share: float, k: int,
             coding: str = "q") -> str:
        """An image's file at raw share `share`, its JPEG part q_k or (coding "b") b_k."""
        rel, raw = item
        return (os.path.join(self.mnt, "raw", raw) if rank < share else
                os.path.join(self.mnt, f"{coding}{k}", rel))

    def paths(self, share: float, k: int, coding: str = "q") -> list[str]:
        return [self.path(it, r, share, k, coding)
                for it, r in zip(self.items, self.ranks, strict=True)]

    def passes(self, count: int, size: int) -> list[list[tuple[tuple[str, str], float]]]:
        """`count` sets of `size` images (item, raw rank) from those the probes did not
        read: a file read before may come from the daemon's memory, which an epoch over a
        large dataset would not find there.  Disjoint while there are enough; otherwise
        they go round the pool in one order, so a file is read again only after every
        other one of the pool (1,800 of the bench's 2,000: far more than the daemon
        holds).  Shrinking the sets instead left 6 batches a pass there, 4 of them timed:
        too few to resolve 5%."""
        pool = self.rest if len(self.rest) >= size else self.rest + self.items
        chosen = [pool[(i * size + j) % len(pool)] for i in range(count) for j in range(size)]
        ranks = raw_ranks(self._ordinals(chosen))
        out = list(zip(chosen, ranks, strict=True))
        return [out[i * size:(i + 1) * size] for i in range(count)]
