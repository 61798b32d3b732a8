#!/usr/bin/env python3
"""Train a small CNN with DistributedDataParallel on a pcrfs view, resumable mid-epoch.

    pcrfs mount DST MNT
    torchrun --nproc_per_node 2 examples/train_ddp.py MNT/q5 --epochs 2 --checkpoint ckpt.pt
    # killed?  the same command resumes from ckpt.pt with the next batch of its epoch

The root is an ImageFolder tree, or, as torchvision's references take it, a directory
holding train/ and val/ ones: the model trains on train/ and each epoch ends with a
validation pass over val/ (the centre crop; top-1 accuracy over every rank).  A root whose
only "classes" are splits (train, val, test) is refused: it would train a model to tell
the splits apart.

FastImageFolder's fused C path decodes on this process's threads (--threads per rank);
`--loader gpu` decodes with GPUImageFolder on the device instead.  Either loader splits
each epoch between the ranks as DistributedSampler does (num_replicas and rank come from
the process group), so every rank takes the same number of steps; a file that cannot be
read or decoded is replaced by another sample of its batch and counted, never a step
short.  The checkpoint (written by rank 0 every --checkpoint-every steps and at the end of
each epoch, atomically) holds the model, the optimiser and the loader's state; every rank
loads it.  --sample-log FILE appends one JSON line per step and rank: the indices of its samples."""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def small_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


SPLITS = {"train", "val", "validation", "test"}


def split_roots(root: str) -> tuple[str, str | None]:
    """(the training tree, the validation tree or None) of a root: root/train and root/val
    (or validation) when root has train/, else root itself.  SystemExit with the fix when
    the training tree's classes are split names."""
    def classes(d: str) -> set[str]:
        return {e.name for e in os.scandir(d) if e.is_dir() and not e.name.startswith(".")}
    train, val = root, None
    if "train" in classes(root):
        train = os.path.join(root, "train")
        val = next((os.path.join(root, v) for v in ("val", "validation")
                    if os.path.isdir(os.path.join(root, v))), None)
    names = classes(train)
    if names and names <= SPLITS:
        raise SystemExit(f"{train}: its only classes are {sorted(names)}, which name splits, "
                         f"not classes; give the directory that holds train/ and val/, or "
                         f"an ImageFolder tree of class directories")
    return train, val


def make_loader(a, root, device, train=True):
    """Either loader, one shape (normalised with ImageNet's mean and std by default)."""
    from pcrfs.torch import FastLoader, GPUImageFolder
    cls = GPUImageFolder if a.loader == "gpu" else FastLoader
    return cls(root, a.batch_size, device=device, size=a.size, seed=a.seed, threads=a.threads,
               drop_last=a.drop_last and train, train=train, shuffle=train)


def classes_of(loader) -> list[str]:
    return loader.ds.classes if hasattr(loader, "ds") else loader.classes


def images_of(loader) -> int:
    return len(loader.ds) if hasattr(loader, "ds") else len(loader.samples)


def validate(model, loader, device) -> tuple[int, int]:
    """(correct, images) over every rank: the split pads a rank's share by repeating the
    head of the epoch, so a few images may count twice."""
    model.eval()
    got = torch.zeros(2, dtype=torch.int64, device=device)
    with torch.no_grad():
        for x, y in loader:
            pred = model(x).argmax(1)
            got += torch.stack([(pred == y.to(device)).sum(), torch.tensor(len(y), device=device)])
    model.train()
    dist.all_reduce(got)
    return int(got[0]), int(got[1])


def save(path: str, state: dict) -> None:
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)       # a kill mid-write leaves the previous checkpoint


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="an ImageFolder tree (MNT/qK, MNT/dynamic, MNT/l3 for gpu), "
                    "or a directory holding train/ and val/ ones")
    ap.add_argument("--loader", choices=("fast", "gpu"), default="fast")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--threads", type=int, default=None, help="decoding threads per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drop-last", action="store_true")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--checkpoint", default=None, help="resume from and save to this file")
    ap.add_argument("--checkpoint-every", type=int, default=50, metavar="STEPS")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop (after a checkpoint) once this run took this many steps")
    ap.add_argument("--sample-log", default=None, help="append each step's sample indices (JSON)")
    a = ap.parse_args()
    train_root, val_root = split_roots(a.root)    # before the process group: fail early

    cuda = a.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    torch.manual_seed(a.seed)
    loader = make_loader(a, train_root, device)
    classes = classes_of(loader)
    val = make_loader(a, val_root, device, train=False) if val_root else None
    if val is not None and classes_of(val) != classes:
        raise SystemExit(f"{val_root}: its classes differ from {train_root}'s (only in val: "
                         f"{sorted(set(classes_of(val)) - set(classes))[:5]}, only in train: "
                         f"{sorted(set(classes) - set(classes_of(val)))[:5]})")
    if rank == 0:
        print(f"train: {train_root}, {images_of(loader)} images in {len(classes)} classes "
              f"({', '.join(classes[:5])}{', ...' if len(classes) > 5 else ''}); val: "
              + (f"{val_root}, {images_of(val)} images" if val is not None
                 else "none (no val/ beside train/)"), flush=True)
    model = small_cnn(len(classes))
    model = nn.parallel.DistributedDataParallel(model.to(device),
                                                device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    start_epoch = 0
    if a.checkpoint and os.path.exists(a.checkpoint):
        ck = torch.load(a.checkpoint, map_location=device, weights_only=False)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        loader.load_state_dict(ck["loader"])      # the same state on every rank
        start_epoch = ck["loader"]["epoch"]
        if rank == 0:
            print(f"resumed from {a.checkpoint}: epoch {start_epoch}, "
                  f"batch {ck['loader']['next_batch']} of {len(loader)}", flush=True)

    def checkpoint():
        if a.checkpoint and rank == 0:
            save(a.checkpoint, {"model": model.module.state_dict(),
                                "optimizer": opt.state_dict(), "loader": loader.state_dict()})
        dist.barrier()

    log = open(a.sample_log, "a") if a.sample_log else None
    taken = 0
    for epoch in range(start_epoch, a.epochs):
        first = loader.plan.next_batch if epoch == start_epoch else 0
        if epoch != loader.epoch:
            loader.set_epoch(epoch)
        plan = loader.batches()
        t0, seen, loss_sum = time.perf_counter(), 0, 0.0
        for step, (x, y) in enumerate(loader, start=first):
            loss = nn.functional.cross_entropy(model(x), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen, loss_sum, taken = seen + len(y), loss_sum + loss.item(), taken + 1
            if log:
                log.write(json.dumps({"rank": rank, "epoch": epoch, "step": step,
                                      "samples": plan[step]}) + "\n")
                log.flush()
            if a.max_steps and taken >= a.max_steps:
                checkpoint()
                print(f"rank {rank}: stopped after {taken} steps", flush=True)
                dist.destroy_process_group()
                return 0
            if a.checkpoint_every and (step + 1) % a.checkpoint_every == 0:
                checkpoint()
        dt = time.perf_counter() - t0
        print(f"rank {rank} epoch {epoch}: {seen} images in {dt:.1f} s "
              f"({seen / max(dt, 1e-9):.0f}/s), mean loss {loss_sum / max(taken, 1):.3f}, "
              f"bad files {loader.failed}", flush=True)
        if val is not None:
            correct, total = validate(model, val, device)
            if rank == 0:
                print(f"epoch {epoch} val: top-1 {correct / max(total, 1):.3f} "
                      f"({correct} of {total})", flush=True)
        checkpoint()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
