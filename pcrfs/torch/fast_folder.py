"""FastImageFolder: ImageFolder's samples through the fused C decode-crop-resize.

The CPU-bound training path.  Each sample is one C call (pcrfs.jpeg.crop: DCT-domain
scaling, only the crop's rows and columns decoded, an antialiased resize, the flip) that
releases the GIL, so a batch is decoded by threads of the training process straight into
the batch tensor: no worker processes, no pickled tensors.  DataLoader worker processes
still work (it is a map-style Dataset) for those who want them.

Boxes follow torchvision's RandomResizedCrop; with a seed, each (epoch, index) draws from
its own generator, so a sample's box and flip repeat whatever thread or worker decodes
it.  Outputs are uint8 CHW, for the GPU to normalise; a CPU-only job can ask for float32
normalised in the same C pass (`normalize=(mean, std)`), by the decoding threads: done on
the whole uint8 batch in the training thread instead, it cost more than the decode here
(1,298 uint8 images/s against 519 normalised, 2 threads, 2-core VM, measured)."""
from __future__ import annotations

import math
import os
import random
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch.utils.data

from pcrfs.jpeg import JpegError
from pcrfs.jpeg.crop import center_box, decode_resized_crop, image_size, random_resized_box

FUSED_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif", ".ppm", ".pgm")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class SampleError(Exception):
    """A sample that could not be decoded: its index and path, and why."""

    def __init__(self, index: int, path: str, reason: str):
        self.index, self.path = index, path
        super().__init__(f"{path}: {reason}")


class FastImageFolder(torch.utils.data.Dataset):
    """ImageFolder's classes, class_to_idx, samples and targets (torchvision's own
    functions find them, with its extensions); item i is (uint8 tensor [3, size, size],
    class index), float32 with `normalize`.

    train=True: RandomResizedCrop(size, scale, ratio), then a horizontal flip with
    probability 0.5 if `flip`; train=False: the centre square that Resize(size / 0.875) +
    CenterCrop(size) keeps.  seed=None draws fresh boxes each time; a seed makes sample i of
    epoch e draw the same box wherever it is decoded.  normalize=(mean, std) (on 0..1, as
    torchvision's Normalize): float32 items, normalised in C.  fast=True: libjpeg's fast
    IDCT and no fancy upsampling.  Formats other than JPEG and PPM go through Pillow (counted in
    `fallbacks`)."""

    def __init__(self, root, size: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 flip: bool = True, seed: int | None = None, train: bool = True,
                 normalize=None, fast: bool = False):
        from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset
        self.root = os.fspath(root)
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_dataset(self.root, self.class_to_idx, extensions=IMG_EXTENSIONS)
        self.imgs = self.samples
        self.targets = [t for _, t in self.samples]
        self.size, self.scale, self.ratio = size, scale, ratio
        self.flip, self.seed, self.train, self.fast = flip, seed, train, fast
        self.normalize = normalize
        self.dtype = np.uint8 if normalize is None else np.float32
        self.epoch = 0
        self.fallbacks = 0
        self._fresh = random.Random()

    def __len__(self) -> int:
        return len(self.samples)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rng(self, index: int) -> random.Random:
        if self.seed is None:
            return random.Random(self._fresh.getrandbits(64))
        return random.Random((self.seed * 1_000_003 + self.epoch) * 10_000_019 + index)

    def box(self, index: int, width: int, height: int) -> tuple[tuple[int, int, int, int], bool]:
        """Sample `index`'s box (top, left, height, width) and flip for this epoch."""
        if not self.train:
            return center_box(width, height, self.size), False
        rng = self._rng(index)
        box = random_resized_box(rng, width, height, self.scale, self.ratio)
        return box, bool(self.flip and rng.random() < 0.5)

    def decode(self, index: int, data: bytes, out: np.ndarray | None = None) -> np.ndarray:
        """Sample `index` from its file's bytes, as uint8 CHW (into `out` if given)."""
        path = self.samples[index][0]
        try:
            if path.lower().endswith(FUSED_EXTENSIONS):
                w, h = image_size(data)
                box, flip = self.box(index, w, h)
                return decode_resized_crop(data, box, self.size, flip, chw=True,
                                           normalize=self.normalize, fast=self.fast, out=out)
            return self._pillow(index, data, out)
        except (JpegError, OSError, ValueError) as e:
            raise SampleError(index, path, str(e)) from None

    def _pillow(self, index: int, data: bytes, out) -> np.ndarray:
        """PNG, WebP and the rest: Pillow decodes, torchvision's crop and resize."""
        import io

        from PIL import Image
        self.fallbacks += 1
        with Image.open(io.BytesIO(data)) as im:
            rgb = im.convert("RGB")
        box, flip = self.box(index, *rgb.size)
        top, left, h, w = box
        rgb = rgb.resize((self.size, self.size), Image.BILINEAR,
                         box=(left, top, left + w, top + h))
        if flip:
            rgb = rgb.transpose(Image.FLIP_LEFT_RIGHT)
        arr = np.asarray(rgb).transpose(2, 0, 1)
        if self.normalize is not None:
            mean, std = (np.asarray(v, np.float32).reshape(3, 1, 1) for v in self.normalize)
            arr = ((arr / np.float32(255) - mean) / std).astype(np.float32)
        if out is None:
            return np.ascontiguousarray(arr)
        out[...] = arr
        return out

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        return torch.from_numpy(self.decode(index, _read(path))), target

    def loader(self, batch_size: int, shuffle: bool = True, threads: int | None = None,
               drop_last: bool = False, prefetch: int = 2, on_error: str = "skip",
               seed: int | None = None) -> FastLoader:
        """Batches decoded by `threads` threads of this process (default: one per core)."""
        return FastLoader(self, batch_size, shuffle, threads, drop_last, prefetch, on_error,
                          seed)


class FastLoader:
    """(images [B, 3, size, size], labels int64 [B]) batches of a FastImageFolder: uint8,
    or float32 with its `normalize`.

    The order is a permutation drawn from (seed, epoch); `state_dict()` after a batch and
    `load_state_dict()` in a new process resume with the next batch of the same epoch.
    on_error="skip": a file that cannot be read or decoded is left out of its batch and
    counted in `skipped` (its error in `errors`); "raise": SampleError."""

    def __init__(self, ds: FastImageFolder, batch_size: int, shuffle: bool = True,
                 threads: int | None = None, drop_last: bool = False, prefetch: int = 2,
                 on_error: str = "skip", seed: int | None = None):
        if on_error not in ("skip", "raise"):
            raise ValueError('on_error: "skip" or "raise"')
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.ds, self.batch_size, self.shuffle, self.drop_last = ds, batch_size, shuffle, drop_last
        self.threads = threads or len(os.sched_getaffinity(0))
        self.prefetch, self.on_error = max(1, prefetch), on_error
        self.seed = seed if seed is not None else (ds.seed if ds.seed is not None
                                                   else random.getrandbits(32))
        self._next_batch = 0
        self.skipped = 0
        self.errors: list[str] = []
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        n = len(self.ds)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.ds.set_epoch(epoch)
        self._next_batch = 0

    def state_dict(self) -> dict:
        return {"epoch": self.ds.epoch, "next_batch": self._next_batch, "seed": self.seed,
                "samples": len(self.ds)}

    def load_state_dict(self, state: dict) -> None:
        if state["samples"] != len(self.ds) or state["seed"] != self.seed:
            raise ValueError("state from another folder or seed")
        self.ds.set_epoch(state["epoch"])
        self._next_batch = state["next_batch"]

    def _batches(self) -> list[list[int]]:
        n = len(self.ds)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.ds.epoch)
            idx = torch.randperm(n, generator=g).tolist()
        else:
            idx = list(range(n))
        b = self.batch_size
        out = [idx[i: i + b] for i in range(0, n, b)]
        if self.drop_last and out and len(out[-1]) < b:
            out.pop()
        return out

    def _chunk(self, members: list[int], x: np.ndarray, lo: int, hi: int) -> list:
        """Decode members[lo:hi] into x[lo:hi]; the SampleErrors, None where it worked."""
        errs: list[SampleError | None] = []
        for j in range(lo, hi):
            i = members[j]
            path = self.ds.samples[i][0]
            try:
                self.ds.decode(i, _read(path), out=x[j])
                errs.append(None)
            except SampleError as e:
                errs.append(e)
            except OSError as e:
                errs.append(SampleError(i, path, str(e)))
        return errs

    def _submit(self, members: list[int]):
        s = self.ds.size
        x = np.empty((len(members), 3, s, s), self.ds.dtype)
        step = max(1, math.ceil(len(members) / self.threads))
        futs = [self._pool.submit(self._chunk, members, x, lo, min(lo + step, len(members)))
                for lo in range(0, len(members), step)]
        return members, x, futs

    def __iter__(self):
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pcrfs-fused")
        batches = self._batches()
        pending: deque = deque()
        nxt = self._next_batch
        while nxt < len(batches) and len(pending) < self.prefetch:
            pending.append(self._submit(batches[nxt]))
            nxt += 1
        while pending:
            members, x, futs = pending.popleft()
            if nxt < len(batches):
                pending.append(self._submit(batches[nxt]))
                nxt += 1
            errs = [e for f in futs for e in f.result()]
            self._next_batch += 1
            yield self._finish(members, x, errs)
        self.ds.set_epoch(self.ds.epoch + 1)
        self._next_batch = 0

    def _finish(self, members, x, errs):
        bad = [j for j, e in enumerate(errs) if e is not None]
        if bad and self.on_error == "raise":
            raise errs[bad[0]]
        labels = [self.ds.samples[i][1] for i in members]
        if bad:
            self.skipped += len(bad)
            self.errors.extend(str(errs[j]) for j in bad)
            keep = [j for j in range(len(members)) if errs[j] is None]
            x = x[keep]
            labels = [labels[j] for j in keep]
        return torch.from_numpy(x), torch.tensor(labels, dtype=torch.int64)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
