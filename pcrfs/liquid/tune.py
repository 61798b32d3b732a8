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

import os
import time
from dataclasses import asdict

from pcrfs.control import read_stats
from pcrfs.liquid.search import Tuner

DEFAULT_BUDGET = 1 << 30      # what the probes may write to the mount's disk caches
# epochs a training job reads the mount's disk cache for, by default: torchvision's
# ImageNet recipes run 90 to 600, a short fine-tune a few tens
DEFAULT_EPOCHS = 30


def tune(mnt: str, transform: str = "imagenet", workers: int | None = None, sample: int = 200,
         store: bool = True, log=print, remote=None, min_fidelity: int | None = None,
         bandwidth: int | None = None, budget: int = DEFAULT_BUDGET,
         epochs: int = DEFAULT_EPOCHS) -> dict:
    """Profile the mount, print the probes and store the choice in the dataset: DST/
    liquid.json, or the object of that name for a remote dataset (written with `remote`,
    RemoteOptions; mounts of the bucket fetch it afresh).  bandwidth: the link (bytes/s) the
    choice is for, in place of the mount's --bandwidth-limit.  min_fidelity: the lowest k the
    choice may have, in every regime (None: k < G only when JPEG at qG is I/O-bound).
    budget: the most bytes the probes may make the mount write to its disk caches (raw
    files not materialized, b_k files); formats whose bound passes it are not probed.
    epochs: how many epochs the job reads this mount's disk cache for; a b_k file is made
    once, so its making is charged 1/epochs per epoch (1: a single cold epoch)."""
    mnt = os.path.abspath(mnt)
    stats = read_stats(mnt)
    workers = workers or os.cpu_count() or 1
    # the link the choice is for: given (bytes/s), else the mount's own limit
    limit = bandwidth or stats.get("bandwidth_limit_bytes_per_s")
    log(f"tuning {mnt}: {workers} workers, transform {transform}, "
        f"bandwidth limit {limit or 'none'}, {sample} images per probe")
    t = Tuner(mnt, workers, transform, sample, log, limit, int(stats.get("pid", 0)),
              min_fidelity, stats.get("source", ""), "hold" in stats.get("cache_tiers", {}),
              epochs)
    writes = t.plan_writes(budget, float((stats.get("raw") or {}).get("materialized_share", 0.0)))
    try:
        best, probes = t.run()
    finally:
        t.close()
    writes["bound"] = int(t.spent)     # raw's bound and each b_k probed: at most this written
    m = t.model
    log("fitted: " + (f"{m.bandwidth / 1e6:.1f} MB/s reading raw files; " if "raw" in m.size
                      else "") + "per image " + ", ".join(
        f"{fmt} {m.size[fmt] / 1e3:.1f} kB, load {1 / m.load[fmt]:.0f} img/s, decode "
        f"{1 / m.decode[fmt]:.0f} img/s" for fmt in sorted(m.size)))
    log(f"{'share':>6} {'view':>4} {'load':>9} {'decode':>9} {'combined':>9} {'predicted':>9} "
        f"{'end2end':>9}")
    for p in probes:
        log(f"{p.share:6.1f} {p.coding + str(p.fidelity):>4} {p.load:9.1f} {p.decode:9.1f} "
            f"{p.rate:9.1f} {p.predicted:9.1f} " + (f"{p.measured:9.1f}" if p.measured else f"{'-':>9}")
            + ("   <- chosen" if p is best else ""))
    cross = m.crossing(best.fidelity) if "raw" in m.size else 0.0
    rate = best.measured
    log(f"closed form: r* = {cross:.2f} at q{best.fidelity}" + ("" if "raw" in m.size else
                                                                " (no raw probed)")
        + f"; chosen: mix={best.share:.1f}, mix_fidelity={best.fidelity} ({rate:.0f} img/s "
        "measured end to end)")
    if best.share > 0:     # raw files: stored by materialize, else made on first read
        raw_mb = best.share * t.sample.total * m.size.get("raw", 0.0) / 1e6
        log(f"raw files for {best.share:.0%} of the images (about {raw_mb:.0f} MB): `pcrfs "
            f"materialize DST raw --fraction {best.share:.1f}` stores them beside the records; "
            f"without it the mount makes each on its first read, into its disk cache")
    log(f"train on {os.path.join(mnt, best.view)}" + (
        f" (q{best.fidelity} re-coded as baseline JPEG; later mounts list it)"
        if best.coding == "b" else ""))
    choice = {"share": best.share, "fidelity": best.fidelity, "workers": workers,
              "epochs": epochs,
              "view": best.view, "seq": best.fidelity if best.coding == "b" else None,
              "min_fidelity": min_fidelity,
              "transform": transform, "bandwidth_limit": limit,
              "measured_images_per_s": round(rate, 1), "closed_form_share": round(cross, 3),
              "probes": [asdict(p) for p in probes], "writes": writes,
              "tuned": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    source = stats.get("source", "")
    if store:
        from pcrfs.liquid.rules import store_tuned
        where = store_tuned(source, choice, remote)
        log(f"stored in {where}: later mounts serve mix/ at this setting (this mount keeps "
            f"its own)")
    return choice
