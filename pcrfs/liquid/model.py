"""The tuner's closed form: a probe's rates, `throughput` of synchronous loader workers,
and Model, fitted from the pure formats' measurements (docs/LIQUID.md)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    coding: str = "q"        # its JPEG files: "q" (progressive q_k) or "b" (baseline b_k)

    @property
    def view(self) -> str:
        """The directory a job trains on for this probe: mix/ (which serves q_k when the
        share is 0), or b_k."""
        return f"b{self.fidelity}" if self.coding == "b" else "mix"


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

    def mix(self, of: dict, share: float, k: int, coding: str = "q") -> float:
        return share * of.get("raw", 0.0) + (1 - share) * of.get(f"{coding}{k}", 0.0)

    def sides(self, share: float, k: int) -> tuple[float, float]:
        """(load, CPU) seconds per image at share r of raw, the rest at qk."""
        return (self.mix(self.load, share, k),
                self.cpu(self.mix(self.decode, share, k), self.mix(self.daemon, share, k)))

    def predict(self, share: float, k: int, coding: str = "q") -> float:
        return self.rate(*(self.mix(of, share, k, coding) for of in (self.load, self.decode,
                                                                      self.daemon)))

    def crossing(self, k: int) -> float:
        """r* where load and CPU time per image are equal, clamped to [0, 1] (the CPU
        side is piecewise linear in r: found on a fine grid)."""
        rs = np.linspace(0.0, 1.0, 1001)
        io_bound = [load >= cpu for load, cpu in (self.sides(r, k) for r in rs)]
        return float(rs[io_bound.index(True)]) if any(io_bound) else 1.0
