"""GPUImageFolder: a training input pipeline that decodes on the GPU.

ImageFolder's classes, class_to_idx and samples (torchvision's own functions find them);
files are read by threads of the training process (file reads release the GIL, so nothing
is pickled through a loader pipe); each batch is decoded by pcrfs.torch.decode_jpeg (l3
files by pcrfs.torch.l3.decode_batch), then RandomResizedCrop, flip and normalisation run
on the device, a few operations per decoded canvas (pcrfs.torch.crop_resize), not several
per image.  It works on MNT/qk, MNT/l3 and plain folders of JPEGs alike.

The order is a permutation drawn from (seed, epoch), so `state_dict()` after any batch and
`load_state_dict()` in a new process resume with the next batch of the same epoch."""
from __future__ import annotations

import math
import os
import random
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from pcrfs.jpeg.crop import center_box, random_resized_box
from pcrfs.torch.crop_resize import resized_crops
from pcrfs.torch.jpeg import DecodeError, decode_jpeg_canvases
from pcrfs.torch.transfer import upload

JPEG_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif")
L3_EXTENSIONS = (".l3",)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class GPUImageFolder:
    """Iterate (images, labels) batches on `device`: images float [B, 3, size, size],
    normalised (normalize=None: uint8, unnormalised), labels int64 [B].

    train=True: RandomResizedCrop(size, scale, ratio) and a random horizontal flip;
    train=False: resize the shorter side to size / 0.875, centre crop.  A file that cannot
    be decoded is left out of its batch and counted in `skipped` (on_error="raise": raise)."""

    def __init__(self, root, batch_size: int, device="cuda", size: int = 224,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip: bool = True, train: bool = True,
                 normalize=(MEAN, STD), shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, threads: int = 8, prefetch: int = 2,
                 on_error: str = "skip"):
        from torchvision.datasets.folder import find_classes, make_dataset
        if on_error not in ("skip", "raise"):
            raise ValueError('on_error: "skip" or "raise"')
        self.root = os.fspath(root)
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_dataset(self.root, self.class_to_idx,
                                    extensions=JPEG_EXTENSIONS + L3_EXTENSIONS)
        self.targets = [t for _, t in self.samples]
        self.batch_size, self.device, self.size = batch_size, torch.device(device), size
        self.scale, self.ratio, self.flip, self.train = scale, ratio, flip, train
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.threads, self.prefetch, self.on_error = threads, max(1, prefetch), on_error
        self.epoch = 0
        self._next_batch = 0   # within self.epoch
        self.skipped = 0
        if normalize is not None:
            mean, std = normalize
            self._mean = torch.tensor(mean, device=self.device).view(1, 3, 1, 1) * 255
            self._std = torch.tensor(std, device=self.device).view(1, 3, 1, 1) * 255
        else:
            self._mean = self._std = None
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        n = len(self.samples)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._next_batch = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next_batch": self._next_batch, "seed": self.seed,
                "samples": len(self.samples)}

    def load_state_dict(self, state: dict) -> None:
        if state["samples"] != len(self.samples) or state["seed"] != self.seed:
            raise ValueError("state from another folder or seed")
        self.epoch, self._next_batch = state["epoch"], state["next_batch"]

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.samples)))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.samples), generator=g).tolist()

    def _batches(self) -> list[list[int]]:
        idx = self.order(self.epoch)
        b = self.batch_size
        out = [idx[i: i + b] for i in range(0, len(idx), b)]
        if self.drop_last and out and len(out[-1]) < b:
            out.pop()
        return out

    def __iter__(self):
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pcrfs-read")
        batches = self._batches()
        start = self._next_batch
        pending: deque = deque()
        nxt = start
        while nxt < len(batches) and len(pending) < self.prefetch:
            pending.append(self._submit(batches[nxt]))
            nxt += 1
        bno = start
        while pending:
            members, futs = pending.popleft()
            if nxt < len(batches):
                pending.append(self._submit(batches[nxt]))
                nxt += 1
            blobs = [f.result() for f in futs]
            bno += 1
            self._next_batch = bno
            yield self._batch(members, blobs, bno)
        self.epoch += 1
        self._next_batch = 0

    def _submit(self, members: list[int]):
        return members, [self._pool.submit(_read, self.samples[i][0]) for i in members]

    def _decode(self, members: list[int], blobs: list[bytes]) -> list:
        """[(positions in members, uint8 canvas [n, 3, H, W], [(h, w)])] for the images that
        decoded: decode_jpeg's canvases, and l3 files (one canvas when all share a size)."""
        l3 = [j for j, i in enumerate(members) if self.samples[i][0].endswith(L3_EXTENSIONS)]
        jpg = sorted(set(range(len(members))) - set(l3))
        out: list = []
        if jpg:
            for idx, canvas, sizes in decode_jpeg_canvases(
                    [blobs[j] for j in jpg], self.device,
                    on_error="raise" if self.on_error == "raise" else "none", mode="rgb"):
                out.append(([jpg[k] for k in idx], canvas, sizes))
        if l3:
            from pcrfs.l3 import L3Error
            from pcrfs.torch.l3 import decode_batch
            try:
                res = decode_batch([blobs[j] for j in l3], self.device)
                if isinstance(res, torch.Tensor):
                    out.append((l3, res, [tuple(res.shape[2:])] * len(l3)))
                else:
                    out += [([j], t[None], [tuple(t.shape[1:])]) for j, t in zip(l3, res, strict=True)]
            except L3Error:
                for j in l3:   # find the damaged one(s); the rest still count
                    try:
                        t = decode_batch([blobs[j]], self.device)[0]
                        out.append(([j], t[None], [tuple(t.shape[1:])]))
                    except L3Error as e:
                        if self.on_error == "raise":
                            raise DecodeError(j, str(e)) from None
        return out

    def _batch(self, members: list[int], blobs: list[bytes], bno: int):
        groups = self._decode(members, blobs)
        rng = random.Random((self.seed * 1_000_003 + self.epoch) * 1_000_033 + bno)
        sizes = {j: hw for idx, _, hws in groups for j, hw in zip(idx, hws, strict=True)}
        kept = [j for j in range(len(members)) if j in sizes]
        self.skipped += len(members) - len(kept)
        slot = {j: s for s, j in enumerate(kept)}
        # the draws in member order, as torchvision's per-sample transforms make them
        boxes, flips = [], []
        for j in kept:
            h, w = sizes[j]
            if self.train:
                boxes.append(random_resized_box(rng, w, h, self.scale, self.ratio))
            else:
                boxes.append(center_box(w, h, self.size))
            flips.append(self.train and self.flip and rng.random() < 0.5)
        x = torch.empty((len(kept), 3, self.size, self.size), dtype=torch.uint8, device=self.device)
        for idx, canvas, _ in groups:
            at = [slot[j] for j in idx]
            crops = resized_crops(canvas, upload([boxes[s] for s in at], self.device),
                                  upload([flips[s] for s in at], self.device), self.size)
            if at == list(range(at[0], at[0] + len(at))):
                x[at[0]: at[0] + len(at)] = crops
            else:
                x.index_copy_(0, upload(at, self.device), crops)
        y = upload(np.array([self.samples[members[j]][1] for j in kept], np.int64), self.device)
        if self._mean is not None:
            x = (x.float() - self._mean) / self._std
        return x, y
