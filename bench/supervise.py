"""What supervision costs (`pcrfs-bench --only supervise`): supervised mounts are the
default (issue 55), so they must serve as fast as `-o supervise=no`.  Each round mounts
the same dataset both ways (order alternating), with the page cache dropped first, and
times `pcrfs mount` until it returns (the mount is live), one pass of cold q10 reads by 4
reader threads over every file of a fresh mount, then a warm pass.  Medians of the rounds;
the ratios are supervised over unsupervised, measured side by side in one run.
-> bench/results/supervise.{json,png}"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import ensure_dataset, ensure_imagenet_like, median, pcrfs, pyplot, write_result
from testkit.pages import drop_page_cache

READERS, ROUNDS = 4, 5
MODES = ("yes", "no")




def _files_per_s(paths: list[str]) -> float:
    def read(p: str) -> int:
        with open(p, "rb") as f:
            return len(f.read())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(READERS) as pool:
        n = sum(1 for size in pool.map(read, paths, chunksize=16) if size > 0)
    assert n == len(paths), "an empty read"
    return len(paths) / (time.perf_counter() - t0)


def _one(ds: Path, mnt: Path, supervise: str, log: Path) -> dict:
    drop_page_cache()
    t0 = time.perf_counter()
    pcrfs("mount", ds, mnt, "-o", f"supervise={supervise}", "--log", str(log))
    mount_s = time.perf_counter() - t0
    try:
        import json
        stats = json.loads((mnt / ".pcrfs" / "stats.json").read_text())
        assert bool(stats.get("supervisor")) == (supervise == "yes")
        paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(mnt / "q10") for f in fs)
        cold = _files_per_s(paths)
        warm = _files_per_s(paths)
    finally:
        pcrfs("umount", mnt)
    return {"mount_s": mount_s, "cold_files_per_s": cold, "warm_files_per_s": warm,
            "files": len(paths)}


def run_all(work: Path, out: Path, images: int = 0, quick: bool = False) -> dict:
    n = images or 2000
    src = ensure_imagenet_like(work, n)
    ds = ensure_dataset(src, work / f"supervise-{n}.pcr", "--images-per-record", "64")
    mnt = work / "supervise-mnt"
    mnt.mkdir(exist_ok=True)
    rounds = 2 if quick else ROUNDS
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            runs[mode].append(_one(ds, mnt, mode, work / "supervise.log"))
    keys = ("mount_s", "cold_files_per_s", "warm_files_per_s")
    med = {m: {k: round(median([x[k] for x in runs[m]]), 3) for k in keys} for m in MODES}
    result = {
        "images": n, "rounds": rounds, "readers": READERS, "cpus": os.cpu_count(),
        "supervised": med["yes"], "unsupervised": med["no"],
        "ratio_supervised_over_unsupervised": {
            k: round(med["yes"][k] / med["no"][k], 3) for k in keys},
        "runs": runs,
    }
    write_result(out, "supervise", result)
    _plot(out, med)
    return result


def _plot(out: Path, med: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for ax, (key, label) in zip(axes, (("cold_files_per_s", "cold q10 files/s"),
                                       ("warm_files_per_s", "warm q10 files/s"),
                                       ("mount_s", "pcrfs mount (s)")), strict=True):
        ax.bar(["supervised", "supervise=no"], [med["yes"][key], med["no"][key]],
               color=["tab:blue", "tab:gray"])
        ax.set_title(label)
    fig.tight_layout()
    fig.savefig(out / "supervise.png", dpi=110)
    plt.close(fig)


def summary(r: dict) -> str:
    ratio = r["ratio_supervised_over_unsupervised"]
    return (f"supervise: cold {r['supervised']['cold_files_per_s']:.0f} vs "
            f"{r['unsupervised']['cold_files_per_s']:.0f} files/s ({ratio['cold_files_per_s']:.3f}x), "
            f"warm {ratio['warm_files_per_s']:.3f}x, mount {r['supervised']['mount_s']:.2f} vs "
            f"{r['unsupervised']['mount_s']:.2f} s")
