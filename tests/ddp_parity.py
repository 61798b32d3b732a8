"""Run by torchrun (tests/test_ddp.py): on every rank, FastLoader and GPUImageFolder
(on the CPU) held against torch's DataLoader with DistributedSampler over the same
map-style dataset, under a real gloo process group.  Per epoch: the same batches, label
for label and pixel for pixel, after a peeked batch, after a pass left with break, and
from a resume in a fresh loader; len() equals the batches a pass yields.  Prints one
line per rank: "rank R ok N" (N checks), or raises."""
from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from pcrfs.torch import FastImageFolder


def reference(ds, epoch: int, batch: int, seed: int):
    s = DistributedSampler(ds, shuffle=True, seed=seed)   # the process group's world
    s.set_epoch(epoch)
    ds.set_epoch(epoch)
    return list(DataLoader(ds, batch_size=batch, sampler=s))


def same(got, want) -> bool:
    return len(got) == len(want) and all(
        torch.equal(xg, xw) and torch.equal(yg.reshape(-1), yw.reshape(-1))
        for (xg, yg), (xw, yw) in zip(got, want, strict=True))


def main() -> int:
    root, batch, seed = sys.argv[1], 4, 11
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    checks = 0
    ds = FastImageFolder(root, size=32, seed=seed)
    loader = ds.loader(batch, threads=1, seed=seed)
    ref_ds = FastImageFolder(root, size=32, seed=seed)
    want0, want1 = reference(ref_ds, 0, batch, seed), reference(ref_ds, 1, batch, seed)
    assert len(loader) == len(want0), (len(loader), len(want0))
    peeked = next(iter(loader))                       # a peek, then the whole epoch 0
    got0 = list(loader)
    assert same([peeked], want0[:1]) and same(got0, want0), "peek"
    checks += 2
    for i, _ in enumerate(loader):                    # epoch 1, left with break
        if i == 1:
            break
    got1 = list(loader)                               # epoch 1 again, whole
    assert same(got1, want1), "break"
    checks += 1
    it = iter(loader)                                 # epoch 2: 2 batches, then resume
    head = [next(it), next(it)]
    state = loader.state_dict()
    fresh = FastImageFolder(root, size=32, seed=seed).loader(batch, threads=1, seed=seed)
    fresh.load_state_dict(state)
    fresh.set_epoch(state["epoch"])
    want2 = reference(ref_ds, 2, batch, seed)
    assert same(head + list(fresh), want2), "resume"
    checks += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # "on the CPU": known here
        from pcrfs.torch import GPUImageFolder
        g = GPUImageFolder(root, batch, device="cpu", size=32, seed=seed, normalize=None,
                           threads=1)
    ref = DistributedSampler(range(len(g.samples)), shuffle=True, seed=seed)
    ref.set_epoch(0)
    order = list(ref)
    next(iter(g))
    labels = [int(v) for _, y in g for v in y]
    assert labels == [g.targets[i] for i in order] and len(g) == -(-len(order) // batch), "gpu"
    checks += 1
    print(f"rank {rank} ok {checks}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
