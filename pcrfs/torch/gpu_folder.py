"""GPUImageFolder: a training input pipeline that decodes on the GPU.

ImageFolder's classes, class_to_idx and samples (torchvision's own functions find them);
files are read by threads of the training process (file reads release the GIL, so nothing
is pickled through a loader pipe); each batch is decoded by pcrfs.torch.decode_jpeg (l3
files by pcrfs.torch.l3.decode_batch), then RandomResizedCrop, flip and normalisation run
on the device, a few operations per decoded canvas (pcrfs.torch.crop_resize), not several
per image.  It works on MNT/qk, MNT/l3 and plain folders of JPEGs alike.

The order, the DDP split, the reading threads, resumable state and the bad-file policy are
FastImageFolder's loader's (pcrfs/torch/loading.py): DistributedSampler's split of one
permutation drawn from (seed, epoch), or any sampler; `state_dict()` after any batch and
`load_state_dict()` in a new process resume with the next batch of the same epoch."""
from __future__ import annotations

import random
import warnings

import torch

from pcrfs.torch.crop_resize import resized_crops
from pcrfs.torch.jpeg import DecodeError, decode_jpeg_canvases
from pcrfs.torch.loading import (
    IMAGENET,
    IMAGENET_MEAN,
    IMAGENET_STD,
    BatchLoader,
    EpochPlan,
    SampleError,
    check_device,
    draw_box,
    epoch_seed,
    list_samples,
    normalizer,
    positional,
    read_file,
)
from pcrfs.torch.transfer import upload

JPEG_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif")
L3_EXTENSIONS = (".l3",)
MEAN, STD = IMAGENET_MEAN, IMAGENET_STD     # the names this module gave them first
READ_THREADS = 8      # threads=None: file reads in flight (the device decodes)


class GPUImageFolder(BatchLoader):
    """Iterate (images, labels) batches on `device`: images float [B, 3, size, size],
    normalised (normalize=None: uint8, unnormalised), labels int64 [B].

    train=True: RandomResizedCrop(size, scale, ratio) and a random horizontal flip;
    train=False: resize the shorter side to size / 0.875, centre crop.  num_replicas /
    rank (default: the process group's) split each epoch as DistributedSampler does, or
    `sampler` decides; a file that cannot be read or decoded takes on_error's policy
    ("replace" by default: another sample of its batch fills its slot), so every rank
    still yields len() batches.

    The shape and defaults are FastLoader's (pcrfs/torch/fast_folder.py), device aside:
    (root, batch_size, *, device, size, scale, ratio, flip, train, normalize=IMAGENET,
    shuffle, seed=0, drop_last, threads, prefetch, on_error, num_replicas, rank, sampler).
    threads=None: READ_THREADS (they only read files; the device decodes)."""

    def __init__(self, root, batch_size: int, *old, device="cuda", size: int = 224,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip: bool = True, train: bool = True,
                 normalize=IMAGENET, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, threads: int | None = None, prefetch: int = 2,
                 on_error: str = "replace", num_replicas: int | None = None,
                 rank: int | None = None, sampler=None):
        if old:      # the positional call of before: (root, batch_size, device, size, ...)
            (device, size, scale, ratio, flip, train, normalize, shuffle, seed, drop_last,
             threads, prefetch, on_error, num_replicas, rank, sampler) = positional(
                GPUImageFolder.__init__, old, locals())
        threads = threads or READ_THREADS
        device = check_device(device, "GPUImageFolder")
        if device.type == "cpu":
            warnings.warn("GPUImageFolder on the CPU decodes with the GPU decoder's C "
                          "entropy stage and torch ops for the pixels, many times slower than "
                          "pcrfs.torch.FastImageFolder's fused C path; use that on a CPU",
                          stacklevel=2)
        self.root, self.classes, self.class_to_idx, self.samples = list_samples(
            root, JPEG_EXTENSIONS + L3_EXTENSIONS)
        self.targets = [t for _, t in self.samples]
        plan = EpochPlan(len(self.samples), batch_size, shuffle, seed, drop_last,
                         num_replicas, rank, sampler)
        super().__init__(plan, len(self.samples), threads, prefetch, on_error, "pcrfs-read")
        self.batch_size, self.device, self.size = batch_size, torch.device(device), size
        self.scale, self.ratio, self.flip, self.train = scale, ratio, flip, train
        self.shuffle, self.drop_last = shuffle, drop_last
        self._normalize = normalizer(*normalize, self.device) if normalize is not None else None

    def _submit(self, members: list[int], pos: int):
        return members, [self._pool.submit(self._read, i) for i in members], pos

    def _read(self, i: int):
        path = self.samples[i][0]
        try:
            return read_file(path)
        except OSError as e:
            return SampleError(i, path, str(e))

    def _result(self, job):
        members, futs, pos = job
        return self._batch(members, [f.result() for f in futs], pos + 1)

    def _stage(self, x: torch.Tensor, y: torch.Tensor):
        return x, upload(y, self.device)

    def _decode(self, members: list[int], blobs: list, draw) -> list:
        """[(positions in members, uint8 canvas [n, 3, H, W], [(h, w)], [(top, left)])] for
        the images that decoded: decode_jpeg's canvases of each JPEG's window around the
        box draw(position, (h, w)) gives it once its header is read (only what the box
        needs is decoded), and l3 files whole (one canvas when all share a size).
        blobs: bytes, or the SampleError of a file that could not be read."""
        read = [j for j, b in enumerate(blobs) if isinstance(b, bytes)]
        l3 = [j for j in read if self.samples[members[j]][0].endswith(L3_EXTENSIONS)]
        jpg = sorted(set(read) - set(l3))
        out: list = []
        if jpg:
            def boxes(sizes):
                return [None if hw is None else draw(jpg[k], hw) for k, hw in enumerate(sizes)]
            for idx, canvas, sizes, origins in decode_jpeg_canvases(
                    [blobs[j] for j in jpg], self.device,
                    on_error="raise" if self.on_error == "raise" else "none", mode="rgb", boxes=boxes):
                out.append(([jpg[k] for k in idx], canvas, sizes, origins))
        if l3:
            from pcrfs.l3 import L3Error
            from pcrfs.torch.l3 import decode_batch
            try:
                res = decode_batch([blobs[j] for j in l3], self.device)
                if isinstance(res, torch.Tensor):
                    out.append((l3, res, [tuple(res.shape[2:])] * len(l3), [(0, 0)] * len(l3)))
                else:
                    out += [([j], t[None], [tuple(t.shape[1:])], [(0, 0)])
                            for j, t in zip(l3, res, strict=True)]
            except L3Error:
                for j in l3:   # find the damaged one(s); the rest still count
                    try:
                        t = decode_batch([blobs[j]], self.device)[0]
                        out.append(([j], t[None], [tuple(t.shape[1:])], [(0, 0)]))
                    except L3Error as e:
                        if self.on_error == "raise":
                            raise DecodeError(j, str(e)) from None
        return out

    def _batch(self, members: list[int], blobs: list, bno: int):
        """(x of the members that decoded, their labels, per member None or its error)."""
        # batch bno of the epoch draws its boxes from (seed, epoch, bno, rank): the JPEGs'
        # as their headers are read (in member order), then any the decoder drew no box
        # for (l3 files, once decoded)
        rng = random.Random(epoch_seed(self.seed, self.epoch) * 1_000_033 + bno
                            + self.plan.rank * 1_000_000_007)
        drawn: dict = {}

        def draw(j: int, hw) -> tuple:
            h, w = hw
            box = draw_box(rng, w, h, self.train, self.size, self.scale, self.ratio)
            drawn[j] = (box, self.train and self.flip and rng.random() < 0.5)
            return box
        groups = self._decode(members, blobs, draw)
        for idx, _, hws, _ in groups:
            for j, hw in zip(idx, hws, strict=True):
                if j not in drawn:
                    draw(j, hw)
        done = {j for idx, _, _, _ in groups for j in idx}
        kept = [j for j in range(len(members)) if j in done]
        errs = [None if j in done else
                blobs[j] if isinstance(blobs[j], SampleError) else
                SampleError(i, self.samples[i][0], "could not be decoded")
                for j, i in enumerate(members)]
        slot = {j: s for s, j in enumerate(kept)}
        x = torch.empty((len(kept), 3, self.size, self.size), dtype=torch.uint8, device=self.device)
        for idx, canvas, _, origins in groups:
            at = [slot[j] for j in idx]
            # each box in its canvas's coordinates: the window's origin off
            boxes = []
            for j, (y0, x0) in zip(idx, origins, strict=True):
                top, left, h, w = drawn[j][0]
                boxes.append((top - y0, left - x0, h, w))
            crops = resized_crops(canvas, boxes, [drawn[j][1] for j in idx], self.size)
            if at == list(range(at[0], at[0] + len(at))):
                x[at[0]: at[0] + len(at)] = crops
            else:
                x.index_copy_(0, upload(at, self.device), crops)
        if self._normalize is not None:
            x = self._normalize(x)
        return x, [self.samples[members[j]][1] for j in kept], errs
