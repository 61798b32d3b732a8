#!/usr/bin/env python3
"""Train a tiny CNN on a pcrfs mount for a few epochs with fidelity autotuning.

    pcrfs mount DST MNT
    python examples/autotune_tiny.py MNT --epochs 8 --warmup 2 --every 3

Reads MNT/dynamic through torchvision's ImageFolder, unmodified, with the
record-aware sampler.  Starts at full fidelity; from epoch `--warmup` on, every `--every`
epochs, it compares gradients at each qk with qG on a few batches and switches
MNT/dynamic to the lowest k whose cosine similarity is at least `--threshold` (the paper:
warm-up 5, every 20, threshold 0.8).  Prints one line per epoch with the fidelity used."""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn
from torchvision import transforms
from torchvision.datasets import ImageFolder

from pcrfs.control import get_fidelity, set_fidelity
from pcrfs.torch import AutotuneSchedule, FidelityAutotuner, RecordAwareSampler, batches_from


def tiny_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mnt")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--size", type=int, default=64, help="training resolution")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tune-batches", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON object per epoch")
    a = ap.parse_args()

    torch.manual_seed(0)
    tf = transforms.Compose([transforms.Resize(a.size), transforms.CenterCrop(a.size),
                             transforms.ToTensor()])
    data = ImageFolder(os.path.join(a.mnt, "dynamic"), transform=tf)
    sampler = RecordAwareSampler(data, shuffle_window=4)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch_size, sampler=sampler,
                                         num_workers=a.workers)
    model = tiny_cnn(len(data.classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    tuner = FidelityAutotuner(model, loss_fn, a.mnt, transform=tf, threshold=a.threshold)
    schedule = AutotuneSchedule(warmup=a.warmup, every=a.every)
    before = get_fidelity(a.mnt)               # given back at exit: other jobs share dynamic/
    set_fidelity(a.mnt, tuner.groups)          # the paper starts at full fidelity
    try:
        train(a, data, loader, sampler, model, opt, loss_fn, tuner, schedule)
    finally:
        set_fidelity(a.mnt, before)


def train(a, data, loader, sampler, model, opt, loss_fn, tuner, schedule) -> None:
    for epoch in range(a.epochs):
        tuned = tuner.maybe_tune(epoch, batches_from(data, a.tune_batches, 16, seed=epoch), schedule)
        sampler.set_epoch(epoch)
        model.train()
        t0, total, n = time.perf_counter(), 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total, n = total + float(loss) * len(y), n + len(y)
        row = {"epoch": epoch, "k": get_fidelity(a.mnt), "loss": round(total / n, 4),
               "images_per_s": round(n / (time.perf_counter() - t0), 1),
               "tuned": tuned is not None}
        if tuned is not None:
            row["similarities"] = {f"q{k}": round(s, 4) for k, s in sorted(tuned.similarities.items())}
            row["tune_seconds"] = round(tuned.seconds, 2)
        print(json.dumps(row) if a.json else
              f"epoch {epoch}: q{row['k']} loss {row['loss']:.4f} {row['images_per_s']} img/s"
              + (f"  tuned -> q{tuned.k} ({row['tune_seconds']} s)" if tuned else ""), flush=True)


if __name__ == "__main__":
    main()
