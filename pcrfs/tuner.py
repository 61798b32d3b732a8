"""`pcrfs tune MNT`: Liquid's offline profiler, extended to move both ways.

On a sample of images it measures, on this machine and through this mount (its
bandwidth limit included):
- load rate: the sample's files read through the kernel with its page cache dropped, by
  W threads, as W DataLoader workers would (at most the mount's bandwidth limit over
  the bytes: a re-read file may come from the daemon's memory);
- decode rate: the same bytes decoded (plus the transform) from memory by W processes
  (a torch DataLoader's workers with the ImageNet transform, as in training).
For a raw share r the sample's raw-ranked images are read from MNT/raw and the rest from
MNT/qk.  Liquid's binary search over r in 0, 0.1 .. 1 (about four probes) finds where load
and decode rates cross: load falls and decode rises as r grows, so a probe that is
I/O-bound moves r down and a decode-bound one moves it up (LIQUID-NOTES correction 1).
A worker loads, then decodes, so the two overlap only across workers: each probe's
combined rate is bounded by W / (load + CPU seconds) too (`throughput`), and the best of
the crossing, its neighbours and the pure formats wins.
If even r = 0 is I/O-bound, raw cannot help and lower fidelities are probed instead.
With --min-fidelity K (opt-in) every k down to K is probed in any regime, since a lower k
also decodes faster, and the share is searched again at the k that leads if that k is
decode-bound.

The model's rate decides which probes are finalists, not the choice: on the sweep its JPEG
rates ran 10-25% high, raw-heavy mixes' up to 20% low.  The probes within 65% of the
fastest (at most five) are measured end to end, a DataLoader's W workers reading images the
probes did not, through the mount, three interleaved passes each, the median kept; of
those the highest k within 3% of the fastest wins (`pick`).  A finalist is measured as
training would meet it from the second epoch on: warm when the mount has no bandwidth
limit and no hold and its bytes for the whole dataset fit in half the memory free now
(every file then comes from the page cache, where a raw file costs the daemon nothing),
cold otherwise (`Tuner.regime`).  Measured cold only, the CPU-bound choice flipped
between shares 0.9 and 1.0 on noise (a cold raw file costs the daemon ~1 ms), while warm
0.9 ran 11% below 1.0.

The daemon serving the files runs on the job's cores: its CPU per image, measured while
loading, is charged to the CPU side (Model.cpu), and so is the reading threads' own (the
kernel's copies through FUSE).  Measured on the 2-core machine: a 560 KB raw file costs
the daemon ~1.1-1.4 ms and the reader ~0.7 ms; a 20 kB q10 file read for the first time
~0.4-0.55 ms and ~0.1 ms (re-read, from the daemon's memory, ~0.05 ms).  JPEG formats are
therefore fitted on their first read, with a local dataset's records of the sample in the
page cache (the bandwidth limit stands for storage, not this disk's first touch); raw
files are read once before, so that those not materialized are produced.  A mixed probe
is charged at least the pure formats' per-file costs, mixed.

The table shows every probe beside the closed form (load(r) = r L_raw + (1-r) L_k, CPU
seconds(r) = min(W, cores) D(r) + d(r), D and d the same mixes of the decode and daemon
seconds per image, combined by `throughput`) from the pure-format measurements, and the
choice is stored as liquid.json in the dataset for later mounts' MNT/mix."""
from __future__ import annotations

import json
import os
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from pcrfs.errors import PcrfsError
from pcrfs.format import RECORDS_DIR, record_name
from pcrfs.liquid import raw_ranks

GRID = [i / 10 for i in range(11)]


# -- decoding in worker processes -----------------------------------------------------
def _imagenet():
    from torchvision import transforms
    return transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


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
            return self.transform(Image.open(f).convert("RGB"))


def _steady_rate(loader, workers: int, clock=time.perf_counter) -> float:
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
            self.transform = _imagenet()
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
        its steady state: `_steady_rate`)."""
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
        return _steady_rate(self.loader, self.workers)

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
            rates.append(_steady_rate(loader, self.workers))
        return rates[1:]

    def close(self) -> None:
        import shutil
        if self.pool is not None:
            self.pool.terminate()
        self.loader = None          # its persistent workers end with it
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- reading through the mount ----------------------------------------------------------
def _drop_pages(path: str) -> None:
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


@dataclass
class Probe:
    share: float
    fidelity: int
    load: float          # images/s, measured: W threads through the mount, cold
    decode: float        # images/s the cores allow: W workers' decoding and the daemon's CPU
    rate: float          # images/s of W synchronous workers doing both (`throughput`)
    predicted: float     # images/s, closed form from the pure formats
    bytes_per_image: float
    daemon_us: float = 0.0   # the mount daemon's CPU per image while loading, measured
    reader_us: float = 0.0   # the reading threads' CPU per image (system calls), measured
    measured: float = 0.0    # images/s end to end through the mount (finalists only)
    regime: str = ""         # how it was measured end to end: "warm" or "cold"


def throughput(io_s: float, cpu_s: float, workers: int, cores: int) -> float:
    """Images/s of W DataLoader workers that each load an image, then decode it, in turn.
    io_s: seconds of the I/O path per image (one server: the bandwidth limit is shared);
    cpu_s: CPU seconds per image, the daemon's included, on min(W, cores) cores.  Liquid's
    min(load, decode) assumes loading overlaps decoding; a synchronous worker overlaps
    them only with the other workers, so W of them also cannot beat W / (io_s + cpu_s).
    Exact for steady service times (the closed network's asymptotic bound); the sweep
    measured balanced mixes at 2 workers up to ~25% below min(load, decode)."""
    bound = min(1.0 / io_s if io_s > 0 else float("inf"),
                min(workers, cores) / cpu_s if cpu_s > 0 else float("inf"))
    return min(bound, workers / (io_s + cpu_s)) if io_s + cpu_s > 0 else bound


class Sample:
    """n images of a mount: their q paths, raw paths and raw ranks."""

    def __init__(self, mnt: str, n: int, seed: int = 0):
        from pcrfs.format.index import INDEX_BITS
        from pcrfs.views.raw import SUFFIX
        from pcrfs.views.tree import format_names
        with open(os.path.join(mnt, ".pcrfs", "manifest.json")) as f:
            self.groups = int(json.load(f)["groups"])
        self.mnt = mnt
        top = os.path.join(mnt, f"q{self.groups}")
        rels = []
        for d, dirs, files in os.walk(top):
            dirs.sort()
            names = format_names((os.fsencode(x) for x in files), SUFFIX)
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(d, f), top)
                rels.append((rel, os.path.join(os.path.dirname(rel), os.fsdecode(names[os.fsencode(f)]))))
        if not rels:
            raise PcrfsError(f"{mnt}: no images under q{self.groups}/")
        self.total = len(rels)
        order = np.random.default_rng(seed).permutation(len(rels))
        self.items = [rels[i] for i in sorted(order[: n])]
        # an image outside the sample where there is one, to wake the daemon's data path
        self.spare = rels[order[n]][0] if len(rels) > n else self.items[0][0]
        # the images never read by the probes, for the finalists' end-to-end passes
        self.rest = [rels[i] for i in order[n + 1:]]
        self._top = top
        ords = self._ordinals(self.items)
        self.records = sorted({int(o) >> INDEX_BITS for o in ords})
        self.ranks = raw_ranks(ords)

    def _ordinals(self, items) -> np.ndarray:
        from pcrfs.format.index import INDEX_BITS
        ords = []
        for rel, _ in items:
            rec, idx = os.getxattr(os.path.join(self._top, rel), "user.pcrfs.record").split()
            ords.append(int(rec) << INDEX_BITS | int(idx))
        return np.array(ords, dtype=np.uint64)

    def path(self, item: tuple[str, str], rank: float, share: float, k: int) -> str:
        rel, raw = item
        return (os.path.join(self.mnt, "raw", raw) if rank < share else
                os.path.join(self.mnt, f"q{k}", rel))

    def paths(self, share: float, k: int) -> list[str]:
        return [self.path(it, r, share, k) for it, r in zip(self.items, self.ranks, strict=True)]

    def passes(self, count: int, size: int) -> list[list[tuple[tuple[str, str], float]]]:
        """`count` sets of `size` images (item, raw rank) from those the probes did not
        read: a file read before may come from the daemon's memory, which an epoch over a
        large dataset would not find there.  Disjoint while there are enough; otherwise
        they go round the pool in one order, so a file is read again only after every
        other one of the pool (1,800 of the bench's 2,000: far more than the daemon
        holds).  Shrinking the sets instead left 6 batches a pass there, 4 of them timed:
        too few to resolve 5%."""
        pool = self.rest if len(self.rest) >= size else self.rest + self.items
        chosen = [pool[(i * size + j) % len(pool)] for i in range(count) for j in range(size)]
        ranks = raw_ranks(self._ordinals(chosen))
        out = list(zip(chosen, ranks, strict=True))
        return [out[i * size:(i + 1) * size] for i in range(count)]


class Model:
    """The closed form, from pure-format measurements: seconds per image to load (L), to
    decode (D) and of the I/O path's CPU (d: the daemon's and the reading thread's) for
    each format, mixed linearly in the share r; the pipeline's rate is `throughput` of
    L(r) and the CPU seconds of D(r) and d(r).  L holds size / bandwidth plus the
    per-file cost of the mount, both measured."""

    def __init__(self, workers: int = 1, cores: int = 1):
        self.size: dict[str, float] = {}     # format -> mean bytes per image
        self.load: dict[str, float] = {}     # format -> s per image (W threads)
        self.decode: dict[str, float] = {}   # format -> s per image (W workers)
        self.daemon: dict[str, float] = {}   # format -> daemon + reader CPU s per image
        self.workers, self.cores = workers, cores

    def cpu_seconds(self, decode_s: float, daemon_s: float) -> float:
        """CPU seconds an image costs: decode_s was measured with W workers busy on
        min(W, cores) cores; the daemon's CPU runs on the same cores."""
        return min(self.workers, self.cores) * decode_s + daemon_s

    def cpu(self, decode_s: float, daemon_s: float) -> float:
        """Seconds per image the CPU side allows (the cores all busy)."""
        return max(decode_s, self.cpu_seconds(decode_s, daemon_s)
                   / min(self.workers, self.cores))

    def rate(self, load_s: float, decode_s: float, daemon_s: float) -> float:
        return throughput(load_s, self.cpu_seconds(decode_s, daemon_s), self.workers,
                          self.cores)

    @property
    def bandwidth(self) -> float:
        """Bytes/s through the mount when reading raw files (the large ones)."""
        return self.size["raw"] / self.load["raw"]

    def mix(self, of: dict, share: float, k: int) -> float:
        return share * of.get("raw", 0.0) + (1 - share) * of.get(f"q{k}", 0.0)

    def sides(self, share: float, k: int) -> tuple[float, float]:
        """(load, CPU) seconds per image at share r of raw, the rest at qk."""
        return (self.mix(self.load, share, k),
                self.cpu(self.mix(self.decode, share, k), self.mix(self.daemon, share, k)))

    def predict(self, share: float, k: int) -> float:
        return self.rate(*(self.mix(of, share, k) for of in (self.load, self.decode,
                                                              self.daemon)))

    def crossing(self, k: int) -> float:
        """r* where load and CPU time per image are equal, clamped to [0, 1] (the CPU
        side is piecewise linear in r: found on a fine grid)."""
        rs = np.linspace(0.0, 1.0, 1001)
        io_bound = [load >= cpu for load, cpu in (self.sides(r, k) for r in rs)]
        return float(rs[io_bound.index(True)]) if any(io_bound) else 1.0


# A probe this close to the fastest counts as fast: fidelity decides.  3%, not 5%: the
# tuner's own passes and an epoch differ by a few percent, and the rate given up for
# fidelity plus that error should stay within the 5% the sweep's target allows.
NEAR = 0.97
# The sweep measured the model's JPEG rates 10-25% high and raw-heavy mixes up to 20% low
# (200 MB/s: r = 0.8 predicted 371 images/s, measured 467; r = 0, 523 and 430-466): the
# probes within FINAL of the fastest by the model, at most FINALISTS of them, are
# measured end to end, ROUNDS passes of PASS images each (2 x --sample when fewer: a
# small sample asks for a quick tune).  0.8 left out every mix there.
FINAL, FINALISTS, ROUNDS, PASS = 0.65, 5, 3, 384
# A finalist whose bytes for the whole dataset fit in this share of MemAvailable is
# measured warm: the rest is left to the training job itself.
WARM_ROOM = 0.5


def pick(probes, rate=lambda p: p.rate) -> Probe:
    """The highest fidelity among the probes within NEAR of the fastest, then the fastest
    of those: fidelity is what the model trains on, a few percent of rate is noise."""
    probes = list(probes)
    top = max(map(rate, probes))
    return max((p for p in probes if rate(p) >= NEAR * top), key=lambda p: (p.fidelity, rate(p)))


def finalists(probes) -> list[Probe]:
    """The probes within FINAL of the fastest by the model, fastest first, at most
    FINALISTS, the model's own pick always among them."""
    ranked = sorted(probes, key=lambda p: -p.rate)
    near = [p for p in ranked if p.rate >= FINAL * ranked[0].rate][:FINALISTS]
    best = pick(ranked)
    if best not in near:
        near[-1] = best
    return near


class Tuner:
    def __init__(self, mnt: str, workers: int, transform: str, sample: int, log=print,
                 limit: int | None = None, pid: int = 0, min_fidelity: int | None = None,
                 source: str = "", hold: bool = False):
        self.sample = Sample(mnt, sample)
        self.hold = hold           # mix/ and raw/ served with direct I/O: never warm
        self.pass_size = min(PASS, 2 * sample)
        G = self.sample.groups
        if min_fidelity is not None and not 1 <= min_fidelity <= G:
            raise PcrfsError(f"--min-fidelity {min_fidelity}: this dataset has fidelities "
                             f"1 to {G}")
        self.min_fidelity = min_fidelity
        self.limit = limit
        self.workers = workers
        self.decoders = Decoders(workers, transform)
        self.model = Model(workers, os.cpu_count() or 1)
        self.pid = pid             # the mount daemon's, whose CPU a load costs
        self.probes: dict[tuple[float, int], Probe] = {}
        self.reader: dict[str, float] = {}   # format -> reader CPU s per image
        self.log = log
        # JPEG formats are fitted on their first read (_fit).  So that every format's
        # first read finds storage alike, a local dataset's records of the sample are
        # brought into the page cache first (the bandwidth limit stands for storage), and
        # the daemon's first read, which carries one-time start-up (a 128 ms stall,
        # measured), is not one of them
        load([os.path.join(mnt, f"q{k}", self.sample.spare) for k in (1, G)], workers)
        if source and os.path.isdir(os.path.join(source, RECORDS_DIR)):
            for r in self.sample.records:
                try:
                    with open(os.path.join(source, RECORDS_DIR, record_name(r)), "rb") as f:
                        while f.read(1 << 22):
                            pass
                except OSError:
                    pass        # the mount reports it when the record is read

    def _load(self, paths: list[str]) -> tuple[float, list[bytes], float, float]:
        """(images/s, bytes, daemon CPU s, reader CPU s per image).  A re-read sample may
        come from the daemon's own memory (the fast lane's store, open files), which a
        training epoch of a large dataset would not find there: the mount's bandwidth
        limit bounds the rate storage can give.  The daemon runs on the training job's
        cores, and a worker's read through FUSE costs it kernel CPU (measured: ~100 us for
        a 20 kB JPEG, ~700 us for a 562 kB PPM), so both count against decoding."""
        before = cpu_seconds(self.pid)
        rate, blobs, reader = load(paths, self.workers)
        daemon = max(0.0, cpu_seconds(self.pid) - before) / len(paths)
        reader /= len(paths)
        if self.limit:
            rate = min(rate, self.limit * len(blobs) / max(1, sum(map(len, blobs))))
        return rate, blobs, daemon, reader

    def _measure(self, paths: list[str]) -> tuple[float, float, float, float, float]:
        """(load s, decode s, daemon CPU s, reader CPU s, bytes) per image of these files."""
        rate, blobs, daemon, reader = self._load(paths)
        return (1.0 / rate, 1.0 / self.decoders.rate(blobs), daemon, reader,
                sum(map(len, blobs)) / len(blobs))

    def _fit(self, fmt: str, paths: list[str]) -> None:
        """A pure format's costs, from the first read of its JPEG files: what an epoch
        over more data than the daemon keeps in memory costs every time (lookups,
        assembly: a q10 file read for the first time cost the daemon ~400-550 us of CPU
        here, a re-read one ~50 us).  Raw files are read once first, so those not stored
        are produced (a one-time cost, the disk cache keeps them)."""
        m = self.model
        if fmt == "raw":
            load(paths, self.workers)
        m.load[fmt], m.decode[fmt], daemon, reader, m.size[fmt] = self._measure(paths)
        m.daemon[fmt], self.reader[fmt] = daemon + reader, reader

    def probe(self, share: float, k: int) -> Probe:
        """A measured point; the pure formats (r = 0 and 1) are the model's fit itself."""
        key = (round(share, 1), k)
        if key not in self.probes:
            m = self.model
            if f"q{k}" not in m.size:
                self._fit(f"q{k}", self.sample.paths(0.0, k))
            pure = {0.0: f"q{k}", 1.0: "raw"}.get(key[0])
            if pure is not None:
                if pure not in m.size:
                    self._fit(pure, self.sample.paths(share, k))
                load_s, decode_s, io_cpu, reader, size = (
                    m.load[pure], m.decode[pure], m.daemon[pure], self.reader[pure],
                    m.size[pure])
            else:
                load_s, decode_s, daemon, reader, size = self._measure(
                    self.sample.paths(share, k))
                # the files were read before, some may come from the daemon's memory: the
                # per-file costs are at least the pure formats' first reads, mixed
                load_s = max(load_s, m.mix(m.load, share, k))
                io_cpu = max(daemon + reader, m.mix(m.daemon, share, k))
                reader = max(reader, m.mix(self.reader, share, k))
            p = Probe(share, k, 1.0 / load_s, 1.0 / m.cpu(decode_s, io_cpu),
                      m.rate(load_s, decode_s, io_cpu), m.predict(share, k), size,
                      round((io_cpu - reader) * 1e6, 1), round(reader * 1e6, 1))
            self.probes[key] = p
            self.log(f"  probe r={share:.1f} q{k}: load {p.load:8.1f} img/s, decode "
                     f"{p.decode:8.1f} img/s (daemon {p.daemon_us:.0f}, reader "
                     f"{p.reader_us:.0f} us/img), predicted {p.predicted:8.1f} img/s")
        return self.probes[key]

    def search_share(self, k: int) -> None:
        """Liquid's binary search on the 11 shares for the first I/O-bound one, then its
        neighbours probed too (the crossing lies next to it; waiting moves the best rate
        off the crossing, to either side): `pick` chooses among all probes."""
        lo, hi = 0, len(GRID) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            p = self.probe(GRID[mid], k)
            if p.load < p.decode:      # I/O-bound: less raw
                hi = mid
            else:                      # decode-bound: more raw
                lo = mid + 1
        for i in {max(lo - 1, 0), lo, min(lo + 1, len(GRID) - 1)}:
            self.probe(GRID[i], k)

    def run(self) -> tuple[Probe, list[Probe]]:
        G = self.sample.groups
        self.probe(0.0, G)
        self.probe(1.0, G)
        self.search_share(G)
        best = pick(self.probes.values())
        floor = self.min_fidelity
        if floor is None:     # by default fidelity is traded only when JPEG is I/O-bound
            floor = 1 if best.share == 0.0 and best.load < best.decode else G
        if floor < G:
            lower = [self.probe(0.0, k) for k in range(G - 1, floor - 1, -1)]
            k = pick(lower + [best]).fidelity
            if k < G and self.probe(0.0, k).load >= self.probe(0.0, k).decode:
                self.search_share(k)      # decode-bound at that k: raw helps there too
        best = self.confirm(finalists(p for p in self.probes.values() if p.fidelity >= floor))
        return best, sorted(self.probes.values(), key=lambda p: (-p.fidelity, p.share))

    def regime(self, p: Probe, room: int) -> str:
        """How p is measured end to end: "warm" when an epoch over the whole dataset in
        p's formats finds every file in the page cache from the second epoch on (no
        bandwidth limit, which stands for storage slower than memory; no hold, which
        means direct I/O; the bytes within WARM_ROOM of room), "cold" otherwise."""
        if self.limit or self.hold:
            return "cold"
        size = self.sample.total * self.model.mix(self.model.size, p.share, p.fidelity)
        return "warm" if size <= WARM_ROOM * room else "cold"

    def confirm(self, cands: list[Probe]) -> Probe:
        """`pick` among the finalists by their rate end to end: a DataLoader's W workers
        read images the probes did not, through the mount, in the finalist's `regime`:
        warm, each pass's files read through the mount just before it; cold, their pages
        dropped (raw files read once before, so that those not stored are produced),
        ROUNDS passes each, interleaved; each finalist's median pass counts (its best one
        favoured whichever was lucky once, against epochs that the bench scores by their
        median).  A lone finalist is measured too, so the rate stored is always one
        measured end to end."""
        t = time.perf_counter()
        passes = self.sample.passes(1 + ROUNDS * len(cands), self.pass_size)
        plan = [cands[0]] + [p for _ in range(ROUNDS) for p in cands]
        paths = [[self.sample.path(it, rank, p.share, p.fidelity) for it, rank in images]
                 for p, images in zip(plan, passes, strict=True)]
        raw = os.path.join(self.sample.mnt, "raw", "")
        room = page_cache_room()
        for p in cands:
            p.regime = self.regime(p, room)

        def prepare(i: int) -> None:
            if plan[i].regime == "warm":
                load(paths[i], self.workers)     # left in the page cache
                return
            load([x for x in paths[i] if x.startswith(raw)], self.workers)
            for x in paths[i]:
                _drop_pages(x)
        rates = self.decoders.through(paths, prepare)
        passes_of: dict[int, list[float]] = {id(p): [] for p in cands}
        for p, files, rate in zip(plan[1:], paths[1:], rates, strict=True):
            if self.limit:    # a file the daemon kept in memory costs storage nothing
                rate = min(rate, self.limit * len(files) / sum(map(os.path.getsize, files)))
            passes_of[id(p)].append(rate)
        for p in cands:
            p.measured = statistics.median(passes_of[id(p)])
            self.log(f"  end to end r={p.share:.1f} q{p.fidelity}: {p.measured:8.1f} img/s "
                     f"{p.regime} (model {p.rate:.1f})")
        self.log(f"  {len(cands)} finalists measured end to end, {ROUNDS} passes of "
                 f"{self.pass_size} images each, in {time.perf_counter() - t:.1f} s")
        return pick(cands, lambda p: p.measured)

    def close(self) -> None:
        self.decoders.close()


def tune(mnt: str, transform: str = "imagenet", workers: int | None = None, sample: int = 200,
         store: bool = True, log=print, remote=None, min_fidelity: int | None = None) -> dict:
    """Profile the mount, print the probes and store the choice in the dataset: DST/
    liquid.json, or the object of that name for a remote dataset (written with `remote`,
    RemoteOptions; mounts of the bucket fetch it afresh).  min_fidelity: the lowest k the
    choice may have, in every regime (None: k < G only when JPEG at qG is I/O-bound)."""
    mnt = os.path.abspath(mnt)
    try:
        with open(os.path.join(mnt, ".pcrfs", "stats.json")) as f:
            stats = json.load(f)
    except OSError:
        raise PcrfsError(f"{mnt} is not a pcrfs mount") from None
    workers = workers or os.cpu_count() or 1
    limit = stats.get("bandwidth_limit_bytes_per_s")
    log(f"tuning {mnt}: {workers} workers, transform {transform}, "
        f"bandwidth limit {limit or 'none'}, {sample} images per probe")
    t = Tuner(mnt, workers, transform, sample, log, limit, int(stats.get("pid", 0)),
              min_fidelity, stats.get("source", ""), "hold" in stats.get("cache_tiers", {}))
    try:
        best, probes = t.run()
    finally:
        t.close()
    m = t.model
    log(f"fitted: {m.bandwidth / 1e6:.1f} MB/s reading raw files; per image " + ", ".join(
        f"{fmt} {m.size[fmt] / 1e3:.1f} kB, load {1 / m.load[fmt]:.0f} img/s, decode "
        f"{1 / m.decode[fmt]:.0f} img/s" for fmt in sorted(m.size)))
    log(f"{'share':>6} {'k':>3} {'load':>9} {'decode':>9} {'combined':>9} {'predicted':>9} "
        f"{'end2end':>9}")
    for p in probes:
        log(f"{p.share:6.1f} {p.fidelity:3d} {p.load:9.1f} {p.decode:9.1f} {p.rate:9.1f} "
            f"{p.predicted:9.1f} " + (f"{p.measured:9.1f}" if p.measured else f"{'-':>9}")
            + ("   <- chosen" if p is best else ""))
    cross = m.crossing(best.fidelity)
    rate = best.measured
    log(f"closed form: r* = {cross:.2f} at q{best.fidelity}; chosen: mix={best.share:.1f}, "
        f"mix_fidelity={best.fidelity} ({rate:.0f} img/s measured end to end)")
    choice = {"share": best.share, "fidelity": best.fidelity, "workers": workers,
              "min_fidelity": min_fidelity,
              "transform": transform, "bandwidth_limit": limit,
              "measured_images_per_s": round(rate, 1), "closed_form_share": round(cross, 3),
              "probes": [asdict(p) for p in probes],
              "tuned": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    source = stats.get("source", "")
    if store:
        from pcrfs.liquid import store_tuned
        where = store_tuned(source, choice, remote)
        log(f"stored in {where}: later mounts serve mix/ at this setting (this mount keeps "
            f"its own)")
    return choice
