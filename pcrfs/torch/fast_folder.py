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
(1,298 uint8 images/s against 519 normalised, 2 threads, 2-core VM, measured).

The loader splits epochs between DDP ranks as DistributedSampler does, or follows any
sampler (pcrfs/torch/loading.py).  With device="cuda" it decodes uint8 into pinned memory,
uploads on a side stream with one batch in flight, and normalises on the device (4x fewer
bytes over PCIe than float32, and no CPU spent on the conversion)."""
from __future__ import annotations

import math
import random

import numpy as np
import torch.utils.data

from pcrfs.jpeg import JpegError
from pcrfs.jpeg.crop import decode_resized_crop, image_size
from pcrfs.torch.loading import (
    IMAGENET,
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

FUSED_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif", ".ppm", ".pgm")


__all__ = ["FUSED_EXTENSIONS", "FastImageFolder", "FastLoader", "SampleError"]


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
        from torchvision.datasets.folder import IMG_EXTENSIONS
        self.root, self.classes, self.class_to_idx, self.samples = list_samples(
            root, IMG_EXTENSIONS)
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
        return random.Random(epoch_seed(self.seed, self.epoch) * 10_000_019 + index)

    def box(self, index: int, width: int, height: int) -> tuple[tuple[int, int, int, int], bool]:
        """Sample `index`'s box (top, left, height, width) and flip for this epoch."""
        if not self.train:
            return draw_box(None, width, height, False, self.size, self.scale, self.ratio), False
        rng = self._rng(index)
        box = draw_box(rng, width, height, True, self.size, self.scale, self.ratio)
        return box, bool(self.flip and rng.random() < 0.5)

    def decode(self, index: int, data: bytes, out: np.ndarray | None = None,
               normalized: bool = True) -> np.ndarray:
        """Sample `index` from its file's bytes, CHW (into `out` if given): float32 with
        `normalize` unless normalized=False, else uint8."""
        path = self.samples[index][0]
        norm = self.normalize if normalized else None
        try:
            if path.lower().endswith(FUSED_EXTENSIONS):
                w, h = image_size(data)
                box, flip = self.box(index, w, h)
                return decode_resized_crop(data, box, self.size, flip, chw=True,
                                           normalize=norm, fast=self.fast, out=out)
            return self._pillow(index, data, out, norm)
        except (JpegError, OSError, ValueError) as e:
            raise SampleError(index, path, str(e)) from None

    def _pillow(self, index: int, data: bytes, out, normalize) -> np.ndarray:
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
        if normalize is not None:
            mean, std = (np.asarray(v, np.float32).reshape(3, 1, 1) for v in normalize)
            arr = ((arr / np.float32(255) - mean) / std).astype(np.float32)
        if out is None:
            return np.ascontiguousarray(arr)
        out[...] = arr
        return out

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        return torch.from_numpy(self.decode(index, read_file(path))), target

    def loader(self, batch_size: int, shuffle: bool = True, threads: int | None = None,
               drop_last: bool = False, prefetch: int = 2, on_error: str = "replace",
               seed: int | None = None, num_replicas: int | None = None,
               rank: int | None = None, sampler=None, device="cpu") -> FastLoader:
        """Batches decoded by `threads` threads of this process (default: one per core);
        FastLoader says what the arguments do."""
        return FastLoader(self, batch_size, shuffle=shuffle, threads=threads,
                          drop_last=drop_last, prefetch=prefetch, on_error=on_error, seed=seed,
                          num_replicas=num_replicas, rank=rank, sampler=sampler, device=device)


class FastLoader(BatchLoader):
    """(images [B, 3, size, size], labels int64 [B]) batches of a FastImageFolder: uint8,
    or float32 with its `normalize`, on `device`.

    The epoch's order is DistributedSampler's: one permutation drawn from (seed, epoch)
    (seed default: the folder's, else 0, the same on every rank), split between
    num_replicas ranks (default: the process group's, else torchrun's environment, else
    one), padded so every rank gets len() batches (drop_last: truncated).  sampler: any
    torch Sampler of indices or batch sampler (RecordAwareSampler,
    LocalityAwareBatchSampler) decides the order and split instead.  The epoch advances
    after each full pass; set_epoch(e) sets it.  `state_dict()` after a batch and
    `load_state_dict()` in a new process resume with the next batch of the same epoch.
    on_error: "replace" (default), "skip" or "raise", as pcrfs.torch.loading.BatchLoader
    says; `failed`, `replaced`, `skipped` and `errors` count what happened.
    device="cuda": pinned host batches uploaded with one in flight, normalised there.

    FastLoader(root, batch_size, *, device="cpu", size=224, ..., normalize=IMAGENET,
    seed=0, ...) is GPUImageFolder's shape and defaults (device aside): the folder is made
    from root with size, scale, ratio, flip, train, normalize, fast and the seed.  Given
    a FastImageFolder instead (what its .loader() does), those come from it and the
    arguments for them are not read."""

    def __init__(self, ds, batch_size: int, *old, device="cpu", size: int = 224,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip: bool = True, train: bool = True,
                 normalize=IMAGENET, shuffle: bool = True, seed: int | None = None,
                 drop_last: bool = False, threads: int | None = None, prefetch: int = 2,
                 on_error: str = "replace", num_replicas: int | None = None,
                 rank: int | None = None, sampler=None, fast: bool = False):
        if old:      # the positional call of before: (ds, batch_size, shuffle, threads, ...)
            (shuffle, threads, drop_last, prefetch, on_error, seed, num_replicas, rank,
             sampler, device) = positional(
                FastLoader.__init__, old, locals(),
                ("shuffle", "threads", "drop_last", "prefetch", "on_error", "seed",
                 "num_replicas", "rank", "sampler", "device"))
        if not isinstance(ds, FastImageFolder):
            ds = FastImageFolder(ds, size=size, scale=scale, ratio=ratio, flip=flip,
                                 seed=0 if seed is None else seed, train=train,
                                 normalize=normalize, fast=fast)
        seed = seed if seed is not None else (ds.seed if ds.seed is not None else 0)
        plan = EpochPlan(len(ds), batch_size, shuffle, seed, drop_last, num_replicas, rank,
                         sampler)
        super().__init__(plan, len(ds), threads, prefetch, on_error, "pcrfs-fused")
        self.ds, self.batch_size, self.shuffle, self.drop_last = ds, batch_size, shuffle, drop_last
        self.device = check_device(device, "FastImageFolder.loader")
        self._cuda = self.device.type == "cuda"
        # uint8 over the bus and normalised on the device; on the CPU, in the C pass
        self._device_normalize = self._cuda and ds.normalize is not None
        self.lag = 1 if self._cuda else 0
        self._stream = None
        self._norm = None

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.ds.set_epoch(epoch)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.ds.set_epoch(self.plan.epoch)

    def _begin_epoch(self) -> None:
        self.ds.set_epoch(self.plan.epoch)   # the boxes are drawn from the plan's epoch

    def _chunk(self, members: list[int], x: np.ndarray, lo: int, hi: int) -> list:
        """Decode members[lo:hi] into x[lo:hi]; the SampleErrors, None where it worked."""
        errs: list[SampleError | None] = []
        for j in range(lo, hi):
            i = members[j]
            path = self.ds.samples[i][0]
            try:
                self.ds.decode(i, read_file(path), out=x[j],
                               normalized=not self._device_normalize)
                errs.append(None)
            except SampleError as e:
                errs.append(e)
            except OSError as e:
                errs.append(SampleError(i, path, str(e)))
        return errs

    def _submit(self, members: list[int], pos: int):
        s = self.ds.size
        dtype = (torch.uint8 if self.ds.normalize is None or self._device_normalize
                 else torch.float32)
        # pinned on CUDA: the upload then only queues a copy (pcrfs/torch/transfer.py)
        xt = torch.empty((len(members), 3, s, s), dtype=dtype, pin_memory=self._cuda)
        x = xt.numpy()
        step = max(1, math.ceil(len(members) / self.threads))
        futs = [self._pool.submit(self._chunk, members, x, lo, min(lo + step, len(members)))
                for lo in range(0, len(members), step)]
        return members, xt, futs

    def _result(self, job):
        members, xt, futs = job
        errs = [e for f in futs for e in f.result()]
        labels = [self.ds.samples[i][1] for i in members]
        if any(e is not None for e in errs):
            keep = [j for j, e in enumerate(errs) if e is None]
            xt, labels = xt[keep], [labels[j] for j in keep]
        return xt, labels, errs

    def normalize_on_device(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 batch -> float32 normalised by the folder's (mean, std), where x is."""
        if self._norm is None or self._norm[0] != x.device:
            self._norm = x.device, normalizer(*self.ds.normalize, x.device)
        return self._norm[1](x)

    def _stage(self, x: torch.Tensor, y: torch.Tensor):
        if not self._cuda:
            return (self.normalize_on_device(x) if self._device_normalize else x), y
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._stream):
            xd = (x if x.is_pinned() else x.pin_memory()).to(self.device, non_blocking=True)
            yd = y.pin_memory().to(self.device, non_blocking=True)
            if self._device_normalize:
                xd = self.normalize_on_device(xd)
            done = torch.cuda.Event()
            done.record(self._stream)
        return xd, yd, done

    def _handoff(self, staged):
        if not self._cuda:
            return staged
        xd, yd, done = staged
        cur = torch.cuda.current_stream(self.device)
        cur.wait_event(done)           # the training step's stream, not the host, waits
        xd.record_stream(cur)
        yd.record_stream(cur)
        return xd, yd
