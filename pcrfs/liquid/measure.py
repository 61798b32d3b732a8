"""What `pcrfs tune` measures on this machine, through the mount: decode rates in worker
processes (a torch DataLoader's, with the ImageNet transform or the fused C path that
FastImageFolder runs), cold reads by W threads
with their CPU, the daemon's CPU from /proc, and the page cache's room."""
from __future__ import annotations

import os
import resource
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


# -- decoding in worker processes -----------------------------------------------------
def imagenet_transform():
    from torchvision import transforms
    return transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


class FusedTransform:
    """--transform fused: what FastImageFolder does per sample (one C call that decodes a
    RandomResizedCrop(224) box at a DCT scale, resizes and flips it), on the file's
    bytes; a uint8 CHW tensor out, normalised later on the batch."""

    takes_bytes = True

    def __init__(self, size: int = 224):
        self.size = size
        self._rng = None
        self._pid = None

    def __call__(self, data: bytes):
        import random

        import torch

        from pcrfs.jpeg.crop import decode_resized_crop, image_size, random_resized_box
        if self._pid != os.getpid():        # forked workers draw apart
            self._rng, self._pid = random.Random(), os.getpid()
        w, h = image_size(data)
        box = random_resized_box(self._rng, w, h)
        return torch.from_numpy(decode_resized_crop(data, box, self.size,
                                                    self._rng.random() < 0.5, chw=True))


def _decode(paths: list[str]) -> int:
    """Decode only (--transform none), in a pool process."""
    from PIL import Image
    for p in paths:
        with Image.open(p) as im:
            np.asarray(im.convert("RGB"))
    return len(paths)


class _Files:
    """A map-style torch dataset: the sample's files, `repeat` times over, decoded as
    torchvision's default loader does and transformed."""

    def __init__(self, paths: list[str], repeat: int, transform):
        self.paths, self.repeat, self.transform = paths, repeat, transform

    def __len__(self) -> int:
        return len(self.paths) * self.repeat

    def __getitem__(self, i: int):
        from PIL import Image
        with open(self.paths[i % len(self.paths)], "rb") as f:
            if getattr(self.transform, "takes_bytes", False):
                return self.transform(f.read())
            return self.transform(Image.open(f).convert("RGB"))


def steady_rate(loader, workers: int, clock=time.perf_counter) -> float:
    """Images per second of one pass over a DataLoader in its steady state: from the
    arrival of the W-th batch to the end.  W workers start together, so their first
    batches arrive together; timing from the first one would credit the other W-1 batches
    to the timed span (a pass of 8 batches at W = 2 came out 7/6, 17%, high)."""
    arrivals = []
    t0 = clock()
    for batch in loader:
        arrivals.append((clock(), len(batch)))
    skip = min(workers, len(arrivals) - 1)
    if skip < 1:                   # one batch: the whole pass, fill included
        return sum(n for _, n in arrivals) / (arrivals[-1][0] - t0) if arrivals else 0.0
    return sum(n for _, n in arrivals[skip:]) / (arrivals[-1][0] - arrivals[skip - 1][0])


class _Order:
    """A DataLoader's sampler whose indices change between passes: its persistent
    workers hold every pass's files, the main process picks which are read."""

    def __init__(self):
        self.indices: list[int] = []

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class Decoders:
    """W processes that decode and transform, started once for all probes.  With the
    ImageNet transform they are a torch DataLoader's workers, as in training: batches of
    32, collated and handed over in shared memory (bare decoding in a process pool ran
    1.3-1.5x faster than that on the 2-core machine, measured, and predicted rates were
    high by as much).  The sample's bytes wait in a tmpfs, as a worker would find them in
    the page cache: what is timed is opening, decoding, transforming and handing over."""

    BATCH = 32
    REPEAT = 3          # each probe decodes the sample 3 times: pipeline fill amortized

    def __init__(self, workers: int, transform: str):
        import tempfile
        self.workers = workers
        self.tmp = tempfile.mkdtemp(prefix="pcrfs-tune-",
                                    dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.pool = self.loader = None
        if transform == "imagenet":
            self.transform = imagenet_transform()
        elif transform == "fused":
            self.transform = FusedTransform()
        else:
            import multiprocessing as mp
            self.pool = mp.get_context("forkserver").Pool(workers)
            self.pool.map(_decode, [[] for _ in range(workers)])     # started and warm

    def _files(self, blobs: list[bytes]) -> list[str]:
        paths = []
        for i, b in enumerate(blobs):
            paths.append(os.path.join(self.tmp, str(i)))
            with open(paths[-1], "wb") as f:
                f.write(b)
        return paths

    def rate(self, blobs: list[bytes]) -> float:
        """Images per second over the sample, all workers busy (a DataLoader's rate in
        its steady state: `steady_rate`)."""
        paths = self._files(blobs)
        if self.pool is not None:
            return self._pool_rate(paths)
        if self.loader is None or len(self.loader.dataset.paths) != len(paths):
            import torch
            self.loader = torch.utils.data.DataLoader(
                _Files(paths, self.REPEAT, self.transform), batch_size=self.BATCH,
                shuffle=True, num_workers=self.workers, persistent_workers=True)
            # one untimed pass: freshly forked workers fault in their copied pages and
            # load decoders lazily (measured: the first format probed decoded 10-20%
            # slower than its neighbours in k without this)
            for _ in self.loader:
                pass
        return steady_rate(self.loader, self.workers)

    def _pool_rate(self, paths: list[str]) -> float:
        chunks = [paths[i::self.workers * 4] for i in range(self.workers * 4)]
        t = time.perf_counter()
        n = sum(self.pool.map(_decode, [c for c in chunks if c]))
        return n / (time.perf_counter() - t)

    def through(self, passes: list[list[str]], prepare) -> list[float]:
        """Images per second of each pass over files of the mount, end to end: opened,
        read through the kernel, decoded and transformed by the W workers (the first pass
        untimed: it starts them).  prepare(i) runs before pass i."""
        rates = []
        if self.pool is not None:
            for i, paths in enumerate(passes):
                prepare(i)
                rates.append(self._pool_rate(paths))
            return rates[1:]
        import torch
        every = [p for paths in passes for p in paths]
        order = _Order()
        loader = torch.utils.data.DataLoader(
            _Files(every, 1, self.transform), batch_size=self.BATCH, sampler=order,
            num_workers=self.workers, persistent_workers=True)
        start = 0
        for i, paths in enumerate(passes):
            prepare(i)
            order.indices = list(np.random.default_rng(i).permutation(len(paths)) + start)
            start += len(paths)
            rates.append(steady_rate(loader, self.workers))
        return rates[1:]

    def close(self) -> None:
        import shutil
        if self.pool is not None:
            self.pool.terminate()
        self.loader = None          # its persistent workers end with it
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- reading through the mount ----------------------------------------------------------
def drop_pages(path: str) -> None:
    """The kernel's cached pages of the file dropped, as memory reclaim does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cold_read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # the kernel's copy of the pages
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def page_cache_room() -> int:
    """Bytes the kernel could give the page cache now without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads, those ended included (0.0 if it
    cannot be read).  Its CPU-time clock counts nanoseconds; /proc's ticks (10 ms), the
    fallback, round a 60-file probe's ~15 ms of daemon CPU to 0 or 20 ms."""
    if pid <= 0:             # unknown (0 would name this process's own clock)
        return 0.0
    try:     # clock_getcpuclockid(pid): the process's CPUCLOCK_SCHED clock
        return time.clock_gettime(((~pid) << 3) | 2)
    except (OSError, OverflowError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed_read(path: str) -> tuple[bytes, float]:
    """The file's bytes and the CPU this thread spent reading them (its system calls:
    the kernel's side of FUSE); per thread, so nothing else in the process counts."""
    before = resource.getrusage(resource.RUSAGE_THREAD)
    data = _cold_read(path)
    after = resource.getrusage(resource.RUSAGE_THREAD)
    return data, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def load(paths: list[str], workers: int) -> tuple[float, list[bytes], float]:
    """(images/s, the bytes, the reading threads' CPU s) reading paths with the page cache
    dropped, W threads."""
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(_timed_read, paths))
    rate = len(paths) / (time.perf_counter() - t)
    return rate, [b for b, _ in done], sum(c for _, c in done)
