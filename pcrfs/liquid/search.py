"""The tuner's search: probes over raw share and fidelity (Liquid's binary search, then
lower k when JPEG is I/O-bound), the finalists measured end to end, and the pick."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping
from types import MappingProxyType

from pcrfs.errors import PcrfsError
from pcrfs.format import RECORDS_DIR, record_name
from pcrfs.liquid.measure import Decoders, cpu_seconds, drop_pages, load, page_cache_room
from pcrfs.liquid.model import Model, Probe
from pcrfs.liquid.sample import Sample

GRID = [i / 10 for i in range(11)]   # the shares Liquid's binary search probes

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


def _mean_size(paths: list[str]) -> float:
    return statistics.mean(os.stat(p).st_size for p in paths) if paths else 0.0


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
    epochs = 1                        # __init__ sets both
    making: Mapping[str, float] = MappingProxyType({})

    def __init__(self, mnt: str, workers: int, transform: str, sample: int, log=print,
                 limit: int | None = None, pid: int = 0, min_fidelity: int | None = None,
                 source: str = "", hold: bool = False, epochs: int = 1):
        self.sample = Sample(mnt, sample)
        if epochs < 1:
            raise PcrfsError(f"--epochs {epochs}: at least 1")
        # b_k files are made on their first read and kept in the disk cache: over `epochs`
        # epochs each costs its making once, so a fit and an end-to-end pass charge an
        # epoch 1/epochs of it (1: a single cold epoch, what the S3 bench measures)
        self.epochs = epochs
        self.making: dict[str, float] = {}     # b_k -> the daemon's making, CPU s per image
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
        # b_k (views/seq.py): q_k without progressive decoding, for Pillow's whole-image
        # decode and the fused crop path alike (the paper bench: fused over b5 at 1.6x q5)
        self.seq = True
        # what the probes may write (plan_writes): none set, no limit
        self.budget: int | None = None
        self.spent, self.raw_ok = 0.0, True
        self.model = Model(workers, os.cpu_count() or 1)
        self.pid = pid             # the mount daemon's, whose CPU a load costs
        self.probes: dict[tuple, Probe] = {}     # (share, k) or (0.0, k, "b")
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

    def plan_writes(self, budget: int, materialized: float) -> dict:
        """Say what the probes may write to the mount's disk caches, at most, and keep
        within `budget`: raw files the packs do not hold (the tuner reads raw/ for every
        share it probes, over the sample and every end-to-end pass) and b_k files (made on
        first lookup, at most about 1.2x q_k's bytes: the paper bench measured b1 at 1.18x
        q1, b5 at 1.0x), charged per k as it is probed (the sample, then the passes of a
        finalist).  Sizes come from stat of the sample's raw and q files (known without
        making them).  Raw shares whose bound does not fit are not probed; a b_k whose
        bound does not fit what is left is skipped when it comes; the log says which."""
        s = self.sample
        G = s.groups
        unique = min(s.total, len(s.items) + (1 + ROUNDS * FINALISTS) * self.pass_size)
        raw = unique * _mean_size(s.paths(1.0, G)) * (1.0 - materialized)
        self.raw_ok = raw <= budget
        self.budget, self.spent = budget, raw if self.raw_ok else 0.0
        seq = self.seq_bound(G)
        mb = 1e6
        self.log(f"writes: at most {raw / mb:.0f} MB of raw files ({1 - materialized:.0%} not "
                 f"materialized)" + (f" and {seq / mb:.0f} MB of b{G} files (about as much per "
                                     f"lower k probed)" if self.seq else "")
                 + f" to the mount's disk caches; --budget {budget / mb:.0f} MB")
        if not self.raw_ok:
            self.log(f"writes: raw shares not probed: {raw / mb:.0f} MB would pass the budget")
        return {"budget": budget, "raw_bound": int(raw), "seq_bound_at_G": int(seq),
                "raw_probed": self.raw_ok}

    def seq_bound(self, k: int) -> float:
        """Bytes of b_k files one b_k probe may make: its sample, then a finalist's passes."""
        s = self.sample
        n = min(s.total, len(s.items) + (1 + ROUNDS) * self.pass_size)
        return n * 1.2 * _mean_size(s.paths(0.0, k))

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
        are produced (a one-time cost, the disk cache keeps them).  b_k files are fitted on
        their first read, which makes them (the re-coding in the daemon): what a cold epoch
        pays, and what the peers bench measured a b_k pick losing by over S3 when the fit
        left it out (the warm finalists' passes read them made)."""
        m = self.model
        if fmt == "raw":
            load(paths, self.workers)
        m.load[fmt], m.decode[fmt], daemon, reader, m.size[fmt] = self._measure(paths)
        m.daemon[fmt], self.reader[fmt] = daemon + reader, reader
        if fmt.startswith("b") and self.epochs > 1:
            # read again, made (the kernel's pages dropped: from the disk cache), and the
            # making spread over the epochs
            for x in paths:
                drop_pages(x)
            load_s, _, daemon2, reader2, _ = self._measure(paths)
            self.making[fmt] = max(0.0, daemon - daemon2)
            spread = lambda first, again: again + max(0.0, first - again) / self.epochs  # noqa: E731
            m.load[fmt] = spread(m.load[fmt], load_s)
            m.daemon[fmt] = spread(daemon, daemon2) + reader2
            self.reader[fmt] = reader2

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

    def probe_seq(self, k: int) -> Probe | None:
        """b_k as it is (no raw share: mix/ serves q_k): its own fit, as a pure format's;
        None when its files would pass the write budget (plan_writes)."""
        key = (0.0, k, "b")
        if key not in self.probes:
            need = self.seq_bound(k)
            if self.budget is not None and self.spent + need > self.budget:
                self.log(f"  b{k} not probed: its files ({need / 1e6:.0f} MB) would pass "
                         f"--budget ({(self.budget - self.spent) / 1e6:.0f} MB left)")
                return None
            self.spent += need
            m, fmt = self.model, f"b{k}"
            if fmt not in m.size:
                self._fit(fmt, self.sample.paths(0.0, k, "b"))
            p = Probe(0.0, k, 1.0 / m.load[fmt], 1.0 / m.cpu(m.decode[fmt], m.daemon[fmt]),
                      m.rate(m.load[fmt], m.decode[fmt], m.daemon[fmt]),
                      m.predict(0.0, k, "b"), m.size[fmt],
                      round((m.daemon[fmt] - self.reader[fmt]) * 1e6, 1),
                      round(self.reader[fmt] * 1e6, 1), coding="b")
            self.probes[key] = p
            self.log(f"  probe b{k}: load {p.load:8.1f} img/s, decode {p.decode:8.1f} img/s "
                     f"(daemon {p.daemon_us:.0f}, reader {p.reader_us:.0f} us/img), "
                     f"predicted {p.predicted:8.1f} img/s")
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
        if self.raw_ok:
            self.probe(1.0, G)
            self.search_share(G)
        best = pick(self.probes.values())
        floor = self.min_fidelity
        if floor is None:     # by default fidelity is traded only when JPEG is I/O-bound
            floor = 1 if best.share == 0.0 and best.load < best.decode else G
        if floor < G:
            lower = [self.probe(0.0, k) for k in range(G - 1, floor - 1, -1)]
            k = pick(lower + [best]).fidelity
            if (k < G and self.probe(0.0, k).load >= self.probe(0.0, k).decode
                    and self.raw_ok):
                self.search_share(k)      # decode-bound at that k: raw helps there too
        if self.seq:   # b_k beside every q_k probed pure
            for k in sorted({p.fidelity for p in list(self.probes.values())
                             if p.share == 0.0 and p.fidelity >= floor}):
                self.probe_seq(k)
        best = self.confirm(finalists(p for p in self.probes.values() if p.fidelity >= floor))
        return best, sorted(self.probes.values(), key=lambda p: (-p.fidelity, p.share))

    def regime(self, p: Probe, room: int) -> str:
        """How p is measured end to end: "warm" when an epoch over the whole dataset in
        p's formats finds every file in the page cache from the second epoch on (no
        bandwidth limit, which stands for storage slower than memory; no hold, which
        means direct I/O; the bytes within WARM_ROOM of room), "cold" otherwise."""
        if self.limit or self.hold:
            return "cold"
        size = self.sample.total * self.model.mix(self.model.size, p.share, p.fidelity,
                                                  p.coding)
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
        paths = [[self.sample.path(it, rank, p.share, p.fidelity, p.coding)
                  for it, rank in images]
                 for p, images in zip(plan, passes, strict=True)]
        raw = os.path.join(self.sample.mnt, "raw", "")
        room = page_cache_room()
        for p in cands:
            p.regime = self.regime(p, room)

        def made_before(p: Probe) -> bool:
            """b_k files read made: warm (from the second epoch on), or over N epochs"""
            return p.coding == "b" and (p.regime == "warm" or self.epochs > 1)

        def prepare(i: int) -> None:
            if plan[i].regime == "warm":
                load(paths[i], self.workers)     # left in the page cache
                return
            # raw files produced before (the disk cache keeps them), then cold; b_k files
            # are made in the pass, as in a cold epoch with an empty cache, or over several
            # epochs made before (their making is charged below)
            made = made_before(plan[i])
            load([x for x in paths[i] if made or x.startswith(raw)], self.workers)
            for x in paths[i]:
                drop_pages(x)
        rates = self.decoders.through(paths, prepare)
        passes_of: dict[int, list[float]] = {id(p): [] for p in cands}
        cores = os.cpu_count() or 1
        for p, files, rate in zip(plan[1:], paths[1:], rates, strict=True):
            if self.limit:    # a file the daemon kept in memory costs storage nothing
                rate = min(rate, self.limit * len(files) / sum(map(os.path.getsize, files)))
            making = self.making.get(p.view, 0.0) if made_before(p) else 0.0
            if making:        # made before the pass: an epoch's share of it, on every core
                rate = 1.0 / (1.0 / rate + making / (cores * self.epochs))
            passes_of[id(p)].append(rate)
        for p in cands:
            p.measured = statistics.median(passes_of[id(p)])
            self.log(f"  end to end r={p.share:.1f} {p.coding}{p.fidelity}: {p.measured:8.1f} img/s "
                     f"{p.regime} (model {p.rate:.1f})")
        self.log(f"  {len(cands)} finalists measured end to end, {ROUNDS} passes of "
                 f"{self.pass_size} images each, in {time.perf_counter() - t:.1f} s")
        return pick(cands, lambda p: p.measured)

    def close(self) -> None:
        self.decoders.close()
