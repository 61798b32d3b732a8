"""BalancedBatchSampler: Liquid's format-aware batch sampling for unmodified datasets.

Every batch holds each stratum (format x held-in-memory, from the mount's .pcrfs/mix.tsv)
in its share of the dataset, rounded by error diffusion: a batch's count of a stratum is
the floor or the ceiling of its share of the batch, and what rounding leaves over is
carried to the next batch, so the load per batch (bytes from storage, decode work) stays
the same from batch to batch.  Every index is drawn once per epoch, in random order.

Under DDP each global step of batch_size x num_replicas indices is dealt to the ranks
by stratum, so every rank gets exactly batch_size (the last step may be short) and the
same balance; the ranks' indices are disjoint and together cover the epoch."""
from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator

import torch.utils.data

from pcrfs.control import MIX_TSV, is_mount
from pcrfs.control import path as control_path
from pcrfs.liquid.rules import tsv_unescape
from pcrfs.torch.loading import epoch_seed

FORMAT_XATTR = "user.pcrfs.format"


def mount_root(path: str) -> tuple[str, str] | None:
    """(mount root, path below it) of a file on a pcrfs mount, or None."""
    d = os.path.dirname(os.path.abspath(path))
    while d != os.path.dirname(d):
        if is_mount(d):
            return d, os.path.relpath(os.path.abspath(path), d)
        d = os.path.dirname(d)
    return None


def read_layout(mount: str) -> dict[str, tuple[str, bool, int, int]]:
    """mix/-relative path -> (format, held, record, index), from .pcrfs/mix.tsv."""
    out = {}
    with open(control_path(mount, MIX_TSV), "rb") as f:
        for line in f:
            if line.startswith(b"#"):
                continue
            path, fmt, held, rec, idx = line.rstrip(b"\n").split(b"\t")
            out[os.fsdecode(tsv_unescape(path))] = (fmt.decode(), held == b"1", int(rec), int(idx))
    return out


def strata_of(dataset) -> list[tuple[str, bool]]:
    """(format, held) of every sample: from the bulk file for files of MNT/mix, else the
    format xattr (held: False)."""
    samples = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
    if samples is None:
        raise TypeError("BalancedBatchSampler needs a dataset with .samples (ImageFolder)")
    layouts: dict[str, dict] = {}
    out = []
    for path, *_ in samples:
        found = mount_root(path)
        if found is None:
            raise ValueError(f"{path}: not on a pcrfs mount")
        root, rel = found
        view, _, below = rel.partition(os.sep)
        if view == "mix":
            if root not in layouts:
                layouts[root] = read_layout(root)
            fmt, held, _, _ = layouts[root][below]
            out.append((fmt, held))
        else:
            out.append((os.getxattr(path, FORMAT_XATTR).decode()
                        if view in ("raw", "l3") else "jpeg", False))
    return out


def quotas(sizes: list[int], batches: list[int]) -> list[list[int]]:
    """Per batch, how many of each stratum: floor or ceiling of the stratum's share of
    the batch, the rounding error carried forward (error diffusion); every stratum used
    up exactly by the end."""
    total = sum(sizes)
    left = list(sizes)
    carry = [0.0] * len(sizes)
    out = []
    for j, m in enumerate(batches):
        if j == len(batches) - 1:
            q = list(left)
        else:
            ideal = [m * n / total for n in sizes]
            q = [min(int(math.floor(x)), r) for x, r in zip(ideal, left, strict=False)]
            order = sorted(range(len(sizes)), key=lambda s: -(ideal[s] - q[s] + carry[s]))
            spare = m - sum(q)
            while spare > 0:
                for s in order:
                    if spare and q[s] < left[s] and q[s] < math.ceil(ideal[s]):
                        q[s] += 1
                        spare -= 1
                if spare:       # the ceilings are used up or out of stock: any with stock
                    order = [s for s in order if q[s] < left[s]]
                    q[order[0]] += 1
                    spare -= 1
            carry = [c + x - k for c, x, k in zip(carry, ideal, q, strict=False)]
        left = [r - k for r, k in zip(left, q, strict=False)]
        out.append(q)
    return out


class BalancedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """A batch_sampler for DataLoader over an ImageFolder of a pcrfs mount (MNT/mix)."""

    def __init__(self, dataset, batch_size: int, *, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, drop_last: bool = False, strata=None):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} not in 0..{num_replicas - 1}")
        labels = strata if strata is not None else strata_of(dataset)
        self.groups: dict[object, list[int]] = {}
        for i, key in enumerate(labels):
            self.groups.setdefault(key, []).append(i)
        self.keys = sorted(self.groups, key=str)
        self.n = len(labels)
        self.batch_size, self.num_replicas, self.rank = batch_size, num_replicas, rank
        self.seed, self.drop_last, self.epoch = seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _steps(self) -> list[int]:
        g = self.batch_size * self.num_replicas
        full, rest = divmod(self.n, g)
        return [g] * full + ([] if self.drop_last or not rest else [rest])

    def __len__(self) -> int:
        steps = self._steps()
        if not steps:
            return 0
        last = steps[-1]
        mine_last = len(range(self.rank, last, self.num_replicas))
        return len(steps) - (1 if mine_last == 0 else 0)

    def __iter__(self) -> Iterator[list[int]]:
        rng = random.Random(epoch_seed(self.seed, self.epoch))
        pools = []
        for k in self.keys:
            idx = list(self.groups[k])
            rng.shuffle(idx)
            pools.append(idx)
        steps = self._steps()
        pos = [0] * len(pools)
        for _, q in zip(steps, quotas([len(p) for p in pools], steps), strict=False):
            step = []
            for s, k in enumerate(q):    # grouped by stratum: dealing keeps the balance
                step.extend(pools[s][pos[s] : pos[s] + k])
                pos[s] += k
            mine = step[self.rank :: self.num_replicas]
            order = random.Random(rng.random())    # drawn on every rank: same stream
            if mine:
                order.shuffle(mine)
                yield mine
