"""RecordAwareSampler: a DataLoader sampler that reads a mount record by record.

The PCR loaders shuffle records, not images, and mix images in a buffer.  A sampler
cannot reorder after loading, so this one does the equivalent up front: each epoch it
shuffles the records, takes them `shuffle_window` at a time, and emits a random merge of
those records' images, each record walked in index order from a random starting point.
A batch therefore mixes images from `shuffle_window` records, while the daemon still
sees every record read in order and fetches it as one extent (docs/SEMANTICS.md)."""
from __future__ import annotations

import os
import random
from collections.abc import Iterator

import torch.utils.data

from pcrfs.torch.loading import epoch_seed

RECORD_XATTR = "user.pcrfs.record"
LEAD = 8


def record_of(path: str | os.PathLike) -> tuple[int, int]:
    """(record, index within the record) of a file on a pcrfs mount."""
    rec, idx = os.getxattr(path, RECORD_XATTR).split()
    return int(rec), int(idx)


class RecordAwareSampler(torch.utils.data.Sampler[int]):
    """Indices into `dataset` (an ImageFolder/DatasetFolder over a pcrfs view, or anything
    with `.samples` or `.imgs` of (path, target)).

    shuffle_window: records whose images are mixed together (1: record after record).
    num_replicas / rank split the records between DDP processes, as DistributedSampler
    splits images.  Call set_epoch(e) each epoch for a new order."""

    def __init__(self, dataset, shuffle_window: int = 4, seed: int = 0, shuffle: bool = True,
                 num_replicas: int = 1, rank: int = 0):
        if shuffle_window < 1:
            raise ValueError("shuffle_window must be at least 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} not in 0..{num_replicas - 1}")
        samples = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
        if samples is None:
            raise TypeError("RecordAwareSampler needs a dataset with .samples (ImageFolder)")
        by_record: dict[int, list[tuple[int, int]]] = {}
        for i, (path, *_) in enumerate(samples):
            try:
                rec, idx = record_of(path)
            except OSError as e:
                raise ValueError(f"{path}: not on a pcrfs mount ({e.strerror})") from None
            by_record.setdefault(rec, []).append((idx, i))
        self.records = {r: [i for _, i in sorted(v)] for r, v in sorted(by_record.items())}
        self.window, self.seed, self.shuffle = shuffle_window, seed, shuffle
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _my_records(self, rng: random.Random) -> list[int]:
        recs = list(self.records)
        if self.shuffle:
            rng.shuffle(recs)
        return recs[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(epoch_seed(self.seed, self.epoch))
        recs = self._my_records(rng)
        for w in range(0, len(recs), self.window):
            streams = []
            for r in recs[w : w + self.window]:
                idx = self.records[r]
                # not in the last few images: the daemon's run detection needs a few
                # in-order opens before the walk wraps around to the record's start
                start = rng.randrange(max(1, len(idx) - LEAD)) if self.shuffle else 0
                streams.append(idx[start:] + idx[:start])
            if not self.shuffle:
                for s in streams:
                    yield from s
                continue
            # random merge, each stream drawn with probability proportional to what is left
            pos = [0] * len(streams)
            left = sum(len(s) for s in streams)
            while left:
                pick = rng.randrange(left)
                for j, s in enumerate(streams):
                    rem = len(s) - pos[j]
                    if pick < rem:
                        yield s[pos[j]]
                        pos[j] += 1
                        break
                    pick -= rem
                left -= 1

    def __len__(self) -> int:
        recs = self._my_records(random.Random(epoch_seed(self.seed, self.epoch)))
        return sum(len(self.records[r]) for r in recs)
