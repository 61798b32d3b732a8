"""`pcrfs tune MNT`: Liquid's offline profiler, extended to move both ways.

On a sample of images it measures, on this machine and through this mount (its
bandwidth limit included):
- load rate: the sample's files read through the kernel with its page cache dropped, by
  W threads, as W DataLoader workers would (at most the mount's bandwidth limit over
  the bytes: a re-read file may come from the daemon's memory);
- decode rate: the same bytes decoded (plus the transform) from memory by W processes.
For a raw share r the sample's raw-ranked images are read from MNT/raw and the rest from
MNT/qk.  Liquid's binary search over r in 0, 0.1 .. 1 (about four probes) finds where load
and decode rates cross: load falls and decode rises as r grows, so a probe that is
I/O-bound moves r down and a decode-bound one moves it up (LIQUID-NOTES correction 1).
If even r = 0 is I/O-bound, raw cannot help and lower fidelities are probed instead:
the highest k within 5% of the best throughput wins.

The daemon serving the files runs on the job's cores: its CPU per image, measured while
loading, is charged to the CPU side (Model.cpu), which matters for raw files (~0.8 ms of
daemon CPU per 560 KB file read cold on the 2-core machine).

The table shows every probe beside the closed form (load(r) = r L_raw + (1-r) L_k; CPU(r)
= max(D(r), (W D(r) + d(r)) / cores), D and d the same mixes of the decode and daemon
seconds per image, over W workers) from the pure-format measurements, and the choice is
stored as liquid.json in the dataset for later mounts' MNT/mix."""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from pcrfs.errors import PcrfsError

GRID = [i / 10 for i in range(11)]


# -- decoding in worker processes -----------------------------------------------------
_TF = None


def _init(transform: str) -> None:
    global _TF
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if transform == "imagenet":
        import torch
        from torchvision import transforms
        torch.set_num_threads(1)
        _TF = transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    else:
        _TF = np.asarray


def _decode(paths: list[str]) -> int:
    from PIL import Image
    for p in paths:
        with Image.open(p) as im:
            _TF(im.convert("RGB"))
    return len(paths)


class Decoders:
    """W processes that decode and transform, started once for all probes."""

    def __init__(self, workers: int, transform: str):
        import multiprocessing as mp
        self.workers = workers
        self.pool = mp.get_context("forkserver").Pool(workers, _init, (transform,))
        self.pool.map(_decode, [[] for _ in range(workers)])     # started and warm

    def rate(self, blobs: list[bytes]) -> float:
        """Images per second over the sample (all workers busy).  The bytes are handed
        over in shared memory (a tmpfs), as a worker finds them in the page cache:
        what is timed is opening, decoding and transforming, not a pipe."""
        import shutil
        import tempfile
        tmp = tempfile.mkdtemp(prefix="pcrfs-tune-",
                               dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            paths = []
            for i, b in enumerate(blobs):
                paths.append(os.path.join(tmp, str(i)))
                with open(paths[-1], "wb") as f:
                    f.write(b)
            chunks = [paths[i::self.workers * 4] for i in range(self.workers * 4)]
            t = time.perf_counter()
            n = sum(self.pool.map(_decode, [c for c in chunks if c]))
            return n / (time.perf_counter() - t)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def close(self) -> None:
        self.pool.terminate()


# -- reading through the mount ----------------------------------------------------------
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (0.0 if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(paths: list[str], workers: int) -> tuple[float, list[bytes]]:
    """(images/s, the bytes) reading paths with the page cache dropped, W threads."""
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        blobs = list(pool.map(_cold_read, paths))
    return len(paths) / (time.perf_counter() - t), blobs


@dataclass
class Probe:
    share: float
    fidelity: int
    load: float          # images/s, measured
    decode: float        # images/s, measured: W workers, less the cores the daemon takes
    predicted: float     # images/s, closed form
    bytes_per_image: float
    daemon_us: float = 0.0   # the mount daemon's CPU per image while loading, measured

    @property
    def rate(self) -> float:
        return min(self.load, self.decode)


class Sample:
    """n images of a mount: their q paths, raw paths and raw ranks."""

    def __init__(self, mnt: str, n: int, seed: int = 0):
        from pcrfs.format.index import INDEX_BITS
        from pcrfs.liquid import raw_ranks
        from pcrfs.views.tree import format_names
        from pcrfs.views.raw import SUFFIX
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
        pick = np.random.default_rng(seed).permutation(len(rels))[: n]
        self.items = [rels[i] for i in sorted(pick)]
        ords = []
        for rel, _ in self.items:
            rec, idx = os.getxattr(os.path.join(top, rel), "user.pcrfs.record").split()
            ords.append(int(rec) << INDEX_BITS | int(idx))
        self.ranks = raw_ranks(np.array(ords, dtype=np.uint64))

    def paths(self, share: float, k: int) -> list[str]:
        return [os.path.join(self.mnt, "raw", raw) if r < share else
                os.path.join(self.mnt, f"q{k}", rel)
                for (rel, raw), r in zip(self.items, self.ranks, strict=True)]


class Model:
    """The closed form, from pure-format measurements: seconds per image to load (L), to
    decode (D) and of daemon CPU (d) for each format, mixed linearly in the share r; the
    pipeline's rate is 1 / max(L(r), cpu(D(r), d(r))).  L holds size / bandwidth plus the
    per-file cost of the mount, both measured."""

    def __init__(self, workers: int = 1, cores: int = 1):
        self.size: dict[str, float] = {}     # format -> mean bytes per image
        self.load: dict[str, float] = {}     # format -> s per image (W threads)
        self.decode: dict[str, float] = {}   # format -> s per image (W workers)
        self.daemon: dict[str, float] = {}   # format -> daemon CPU s per image
        self.workers, self.cores = workers, cores

    def cpu(self, decode_s: float, daemon_s: float) -> float:
        """Seconds per image on the CPU side: W workers each spend W x decode_s per image
        and the daemon daemon_s, on the same cores (both in one machine's budget)."""
        return max(decode_s, (self.workers * decode_s + daemon_s) / self.cores)

    @property
    def bandwidth(self) -> float:
        """Bytes/s through the mount when reading raw files (the large ones)."""
        return self.size["raw"] / self.load["raw"]

    def sides(self, share: float, k: int) -> tuple[float, float]:
        """(load, CPU) seconds per image at share r of raw, the rest at qk."""
        def mix(of: dict) -> float:
            return share * of.get("raw", 0.0) + (1 - share) * of.get(f"q{k}", 0.0)
        return mix(self.load), self.cpu(mix(self.decode), mix(self.daemon))

    def predict(self, share: float, k: int) -> float:
        return 1.0 / max(self.sides(share, k))

    def crossing(self, k: int) -> float:
        """r* where load and CPU time per image are equal, clamped to [0, 1] (the CPU
        side is piecewise linear in r: found on a fine grid)."""
        rs = np.linspace(0.0, 1.0, 1001)
        io_bound = [load >= cpu for load, cpu in (self.sides(r, k) for r in rs)]
        return float(rs[io_bound.index(True)]) if any(io_bound) else 1.0


class Tuner:
    def __init__(self, mnt: str, workers: int, transform: str, sample: int, log=print,
                 limit: int | None = None, pid: int = 0):
        self.sample = Sample(mnt, sample)
        self.limit = limit
        self.workers = workers
        self.decoders = Decoders(workers, transform)
        self.model = Model(workers, os.cpu_count() or 1)
        self.pid = pid             # the mount daemon's, whose CPU a load costs
        self.probes: dict[tuple[float, int], Probe] = {}
        self.log = log
        for _, raw in self.sample.items:       # produce any raw file not stored, once
            _cold_read(os.path.join(mnt, "raw", raw))

    def _load(self, paths: list[str]) -> tuple[float, list[bytes], float]:
        """(images/s, bytes, daemon CPU s per image).  A re-read sample may come from the
        daemon's own memory (the fast lane's store, open files), which a training epoch of
        a large dataset would not find there: the mount's bandwidth limit bounds the rate
        storage can give.  The daemon runs on the training job's cores, so what it spends
        serving the files counts against decoding (Model.cpu)."""
        before = cpu_seconds(self.pid)
        rate, blobs = load(paths, self.workers)
        daemon = max(0.0, cpu_seconds(self.pid) - before) / len(paths)
        if self.limit:
            rate = min(rate, self.limit * len(blobs) / max(1, sum(map(len, blobs))))
        return rate, blobs, daemon

    def _fit(self, fmt: str, paths: list[str]) -> None:
        rate, blobs, daemon = self._load(paths)
        self.model.size[fmt] = sum(map(len, blobs)) / len(blobs)
        self.model.load[fmt] = 1.0 / rate
        self.model.decode[fmt] = 1.0 / self.decoders.rate(blobs)
        self.model.daemon[fmt] = daemon

    def probe(self, share: float, k: int) -> Probe:
        key = (round(share, 1), k)
        if key not in self.probes:
            if f"q{k}" not in self.model.size:
                self._fit(f"q{k}", self.sample.paths(0.0, k))
            paths = self.sample.paths(share, k)
            rate, blobs, daemon = self._load(paths)
            cpu_s = self.model.cpu(1.0 / self.decoders.rate(blobs), daemon)
            p = Probe(share, k, rate, 1.0 / cpu_s, self.model.predict(share, k),
                      sum(map(len, blobs)) / len(blobs), round(daemon * 1e6, 1))
            self.probes[key] = p
            self.log(f"  probe r={share:.1f} q{k}: load {p.load:8.1f} img/s, decode "
                     f"{p.decode:8.1f} img/s (daemon {p.daemon_us:.0f} us/img), predicted "
                     f"{p.predicted:8.1f} img/s")
        return self.probes[key]

    def search_share(self, k: int) -> Probe:
        """Liquid's binary search on the 11 shares for the first I/O-bound one; the best
        of it and the share before it (the crossing lies between them)."""
        lo, hi = 0, len(GRID) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            p = self.probe(GRID[mid], k)
            if p.load < p.decode:      # I/O-bound: less raw
                hi = mid
            else:                      # decode-bound: more raw
                lo = mid + 1
        near = [self.probe(GRID[i], k) for i in {max(lo - 1, 0), lo}]
        return max(near, key=lambda p: p.rate)

    def run(self) -> tuple[Probe, list[Probe]]:
        G = self.sample.groups
        self._fit(f"q{G}", self.sample.paths(0.0, G))
        self._fit("raw", self.sample.paths(1.0, G))
        best = self.search_share(G)
        if best.share == 0.0 and best.load < best.decode:
            # I/O-bound with JPEG alone: trade fidelity instead
            cands = [best] + [self.probe(0.0, k) for k in range(G - 1, 0, -1)]
            top = max(p.rate for p in cands)
            best = max((p for p in cands if p.rate >= 0.95 * top), key=lambda p: p.fidelity)
        return best, sorted(self.probes.values(), key=lambda p: (-p.fidelity, p.share))

    def close(self) -> None:
        self.decoders.close()


def tune(mnt: str, transform: str = "imagenet", workers: int | None = None, sample: int = 200,
         store: bool = True, log=print, remote=None) -> dict:
    """Profile the mount, print the probes and store the choice in the dataset: DST/
    liquid.json, or the object of that name for a remote dataset (written with `remote`,
    RemoteOptions; mounts of the bucket fetch it afresh)."""
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
    t = Tuner(mnt, workers, transform, sample, log, limit, int(stats.get("pid", 0)))
    try:
        best, probes = t.run()
    finally:
        t.close()
    m = t.model
    log(f"fitted: {m.bandwidth / 1e6:.1f} MB/s reading raw files; per image " + ", ".join(
        f"{fmt} {m.size[fmt] / 1e3:.1f} kB, load {1 / m.load[fmt]:.0f} img/s, decode "
        f"{1 / m.decode[fmt]:.0f} img/s" for fmt in sorted(m.size)))
    log(f"{'share':>6} {'k':>3} {'load':>9} {'decode':>9} {'measured':>9} {'predicted':>9}")
    for p in probes:
        log(f"{p.share:6.1f} {p.fidelity:3d} {p.load:9.1f} {p.decode:9.1f} {p.rate:9.1f} "
            f"{p.predicted:9.1f}" + ("   <- chosen" if p is best else ""))
    cross = m.crossing(best.fidelity)
    log(f"closed form: r* = {cross:.2f} at q{best.fidelity}; chosen: mix={best.share:.1f}, "
        f"mix_fidelity={best.fidelity} ({best.rate:.0f} img/s measured)")
    choice = {"share": best.share, "fidelity": best.fidelity, "workers": workers,
              "transform": transform, "bandwidth_limit": limit,
              "measured_images_per_s": round(best.rate, 1), "closed_form_share": round(cross, 3),
              "probes": [asdict(p) for p in probes],
              "tuned": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    source = stats.get("source", "")
    if store:
        from pcrfs.liquid import store_tuned
        where = store_tuned(source, choice, remote)
        log(f"stored in {where}: later mounts serve mix/ at this setting (this mount keeps "
            f"its own)")
    return choice
