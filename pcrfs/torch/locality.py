"""LocalityAwareBatchSampler: the IBM paper's locality-aware loading for DDP.

Every rank draws the same global permutation and cuts it into the same global batches of
batch_size x num_replicas.  Each sample belongs to the node whose `--shard` owns its
record (pcrfs/cluster/shard.py, the rule the daemons use).  Per step the samples are counted per
node, Algorithm 1 (`balance()`) moves the surplus of the fullest nodes to the emptiest
ones until every node has batch_size x ranks_per_node, and each node's samples are dealt
evenly to its ranks.  So:

- the ranks' indices of a step are exactly the global batch (Theorem 1);
- every rank gets exactly batch_size per step, which DDP's gradient averaging needs for
  that equivalence (the spec's correction), and the same number of steps;
- no collective: everything follows from the seed and the epoch.

`balance` says where a node reads the samples moved to it: "peer" from the owner's peer
cache (memcached), "storage" from the bucket.  The sampler tells the node's mount by
writing it to `.pcrfs/control/balance` (when the dataset lives on a mount)."""
from __future__ import annotations

import heapq
import os
from collections.abc import Iterator, Sequence

import torch
import torch.utils.data

from pcrfs.cluster.shard import counts_of, owners
from pcrfs.control import BALANCE_CONTROL
from pcrfs.torch.balanced import mount_root
from pcrfs.torch.loading import epoch_seed, world
from pcrfs.torch.sampler import record_of

BALANCES = ("peer", "storage")


def balance(counts: Sequence[int], target: int | Sequence[int]) -> list[tuple[int, int, int]]:
    """Algorithm 1: transfers (src, dst, m) that bring every node's count to its target.
    Max-heaps of surplus and deficit; the top surplus gives min(surplus, deficit) to the
    top deficit.  At most nodes - 1 transfers."""
    targets = [target] * len(counts) if isinstance(target, int) else list(target)
    if sum(counts) != sum(targets):
        raise ValueError(f"counts sum {sum(counts)} != targets sum {sum(targets)}")
    surplus = [(-(c - t), n) for n, (c, t) in enumerate(zip(counts, targets, strict=False)) if c > t]
    deficit = [(-(t - c), n) for n, (c, t) in enumerate(zip(counts, targets, strict=False)) if c < t]
    heapq.heapify(surplus)
    heapq.heapify(deficit)
    moves = []
    while surplus and deficit:
        s, src = heapq.heappop(surplus)
        d, dst = heapq.heappop(deficit)
        m = min(-s, -d)
        moves.append((src, dst, m))
        if -s > m:
            heapq.heappush(surplus, (s + m, src))
        if -d > m:
            heapq.heappush(deficit, (d + m, dst))
    return moves


def _dist_default(num_replicas, rank, ranks_per_node):
    num_replicas, rank = world(num_replicas, rank)
    if ranks_per_node is None:
        ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return num_replicas, rank, ranks_per_node


class LocalityAwareBatchSampler(torch.utils.data.Sampler[list[int]]):
    """A batch_sampler for DataLoader over an ImageFolder of a pcrfs mount mounted with
    `--shard node/nodes` on every node (ranks rank // ranks_per_node share node).

    records: the record of each sample (default: the `user.pcrfs.record` xattr of each
    file); shard_seed: the mounts' `--shard-seed`.  drop_last=False pads the last global
    batch with the epoch's first samples (as DistributedSampler does), so every rank
    still gets batch_size."""

    def __init__(self, dataset, batch_size: int, num_replicas: int | None = None,
                 rank: int | None = None, ranks_per_node: int | None = None, seed: int = 0,
                 balance: str = "peer", *, drop_last: bool = False,
                 records: Sequence[int] | None = None, shard_seed: int = 0):
        num_replicas, rank, ranks_per_node = _dist_default(num_replicas, rank, ranks_per_node)
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} not in 0..{num_replicas - 1}")
        if ranks_per_node < 1 or num_replicas % ranks_per_node:
            raise ValueError(f"num_replicas {num_replicas} is not a multiple of "
                             f"ranks_per_node {ranks_per_node}")
        if balance not in BALANCES:
            raise ValueError(f"balance must be one of {BALANCES}, not {balance!r}")
        paths = None
        if records is None:
            samples = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
            if samples is None:
                raise TypeError("give records=, or a dataset with .samples (ImageFolder)")
            paths = [p for p, *_ in samples]
            try:
                records = [record_of(p)[0] for p in paths]
            except OSError as e:
                raise ValueError(f"{e.filename}: not on a pcrfs mount ({e.strerror})") from None
        self.n = len(records)
        if self.n != len(dataset):
            raise ValueError(f"{self.n} records for a dataset of {len(dataset)}")
        self.nodes = num_replicas // ranks_per_node
        own = owners(counts_of(records), self.nodes, shard_seed)
        self.owner = torch.tensor([own[int(r)] for r in records], dtype=torch.int64)
        self.batch_size, self.num_replicas, self.rank = batch_size, num_replicas, rank
        self.ranks_per_node, self.node = ranks_per_node, rank // ranks_per_node
        self.seed, self.balance_mode, self.drop_last = seed, balance, drop_last
        self.epoch, self._start, self._yielded = 0, 0, 0
        if paths:
            self._tell_mount(paths[0])

    def _tell_mount(self, path: str) -> None:
        """Where this node reads moved samples (the mount's balance control), if the
        dataset is on a pcrfs mount that has one."""
        found = mount_root(path)
        ctl = found and os.path.join(found[0], BALANCE_CONTROL)
        if not ctl or not os.path.exists(ctl):
            return
        try:
            with open(ctl, "r+b") as f:
                if f.read().strip() != self.balance_mode.encode():
                    f.seek(0)
                    f.truncate()
                    f.write(self.balance_mode.encode() + b"\n")
        except OSError:
            pass      # a read-only mount keeps its setting

    # -- the schedule (the same on every rank) ---------------------------------------
    @property
    def global_batch(self) -> int:
        return self.batch_size * self.num_replicas

    def __len__(self) -> int:
        full, rest = divmod(self.n, self.global_batch)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch: int | None = None) -> torch.Tensor:
        """The epoch's global order, cut into len(self) global batches."""
        g = torch.Generator()
        g.manual_seed(epoch_seed(self.seed, self.epoch if epoch is None else epoch))
        perm = torch.randperm(self.n, generator=g)
        need = len(self) * self.global_batch
        if need > self.n:
            perm = torch.cat([perm, perm[: need - self.n]])
        return perm[:need]

    def step(self, batch: torch.Tensor) -> tuple[list[list[int]], list[tuple[int, int, int]]]:
        """One global batch -> (indices of every rank, transfers (src, dst, m))."""
        owner = self.owner[batch]
        per_node = [batch[owner == n].tolist() for n in range(self.nodes)]
        moves = balance([len(s) for s in per_node], self.batch_size * self.ranks_per_node)
        for src, dst, m in moves:       # the last m of the source: random, as the order is
            per_node[dst].extend(per_node[src][-m:])
            del per_node[src][-m:]
        b = self.batch_size
        ranks = [node[j * b : (j + 1) * b] for node in per_node
                 for j in range(self.ranks_per_node)]
        return ranks, moves

    def schedule(self, epoch: int | None = None) -> Iterator[tuple[list[list[int]], list]]:
        """(every rank's indices, transfers) of each step of an epoch."""
        order = self.order(epoch)
        for s in range(len(self)):
            yield self.step(order[s * self.global_batch : (s + 1) * self.global_batch])

    def __iter__(self) -> Iterator[list[int]]:
        start, self._start = self._start, 0
        self._yielded = start
        for i, (ranks, _) in enumerate(self.schedule()):
            if i < start:
                continue
            self._yielded = i + 1
            yield ranks[self.rank]

    # -- epochs and resume ------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self, steps_done: int | None = None) -> dict:
        """Where this epoch stands.  steps_done: the steps the training loop finished
        (default: the batches handed out so far; a DataLoader's prefetch runs ahead)."""
        return {"epoch": self.epoch, "step": self._yielded if steps_done is None else steps_done,
                "seed": self.seed, "n": self.n, "num_replicas": self.num_replicas}

    def load_state_dict(self, state: dict) -> None:
        """The next iteration resumes the saved epoch at its saved step."""
        if (state.get("seed"), state.get("n"), state.get("num_replicas")) != (
                self.seed, self.n, self.num_replicas):
            raise ValueError("state is from a sampler with another seed, dataset or world size")
        self.epoch, self._start = int(state["epoch"]), int(state["step"])

    def imbalance(self, epoch: int | None = None) -> float:
        """beta: the moved samples over the epoch's samples (sum of deficits / batch)."""
        moved = sum(m for _, moves in self.schedule(epoch) for _, _, m in moves)
        return moved / (len(self) * self.global_batch) if len(self) else 0.0
