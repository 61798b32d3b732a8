"""DDP scaling of FastImageFolder's loader on the same cores: R ranks x T threads against
1 rank x R*T threads (issue 71's row: 2 x 1 against 1 x 2 on the 2-core VM).

Every arm runs under torchrun (gloo), one process per rank, so process start and the
process group cost the same in each; the clock runs from a barrier to a barrier around
the measured epochs, and the images are summed over the ranks (all_reduce).  The first
epoch brings the view's files into the page cache and is not counted: what is measured
is the input pipeline's rate when the CPU binds.  Arms alternate round by round.

    python -m bench.ddp [--images 2000] [--rounds 3]     (pcrfs-bench --only ddp)"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import REPO, Mounted, ensure_dataset, ensure_imagenet_like, pyplot, write_result

ARMS = [(2, 1), (1, 2)]           # (ranks, threads per rank)
TARGET = 0.9                      # 2 ranks x 1 thread over 1 rank x 2 threads


def worker(root: str, threads: int, batch: int, epochs: int) -> None:
    """One rank (under torchrun): epochs of its share, the last epochs - 1 timed."""
    import time

    import torch
    import torch.distributed as dist

    from pcrfs.torch import FastImageFolder
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    ds = FastImageFolder(root, size=224, seed=0)
    loader = ds.loader(batch, threads=threads)
    n = 0
    t0 = 0.0
    for e in range(epochs):
        if e == 1:
            dist.barrier()
            t0 = time.perf_counter()
        for _, y in loader:
            n += len(y) if e else 0
    dist.barrier()
    seconds = time.perf_counter() - t0
    total = torch.tensor([n], dtype=torch.int64)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"images": int(total), "seconds": seconds,
                                      "batches_per_rank": len(loader),
                                      "failed": loader.failed}), flush=True)
    dist.destroy_process_group()


def one(root: Path, ranks: int, threads: int, batch: int, epochs: int) -> dict:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", str(ranks), "-m", "bench.ddp", "--worker", str(root),
                        str(threads), str(batch), str(epochs)],
                       capture_output=True, text=True, env=env, timeout=1800,
                       cwd=root.parent)   # not the repo: its pcrfs/ has no compiled parts
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        log = root.parent / f"ddp-failed-{ranks}x{threads}-{os.getpid()}.log"
        log.write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
        raise RuntimeError(f"torchrun {ranks}x{threads}: rc {p.returncode} (whole log: {log})")
    r = json.loads(line[7:])
    return r | {"images_per_s": r["images"] / r["seconds"]}


def run_all(work: Path, out: Path, images: int = 2000, rounds: int = 3, batch: int = 64,
            epochs: int = 3, views=("q10", "source")) -> dict:
    src = ensure_imagenet_like(work, images)
    ds = ensure_dataset(src, work / f"ds-ddp-{images}")
    rows, failures = [], []
    with Mounted(ds, work / "mnt-ddp") as m:
        for view in views:
            root = src if view == "source" else m.mnt / view
            got: dict = {arm: [] for arm in ARMS}
            for r in range(rounds):
                for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                    try:
                        got[arm].append(one(root, *arm, batch, epochs))
                    except RuntimeError as e:     # counted and kept, never hidden
                        failures.append(f"{view} round {r + 1}: {e}")
                        print(f"  {failures[-1]}", flush=True)
                print(f"  ddp {view} round {r + 1}/{rounds} done", flush=True)
            for (ranks, threads), runs in got.items():
                rows.append({"view": view, "ranks": ranks, "threads_per_rank": threads,
                             "images_per_s": round(statistics.median(
                                 x["images_per_s"] for x in runs), 1),
                             "rounds": [round(x["images_per_s"], 1) for x in runs],
                             "images_per_epoch": runs[0]["images"] // (epochs - 1),
                             "batches_per_rank": runs[0]["batches_per_rank"]})
    targets = {}
    for view in views:
        a = next(r for r in rows if r["view"] == view and r["ranks"] == 2)
        b = next(r for r in rows if r["view"] == view and r["ranks"] == 1)
        ratio = a["images_per_s"] / b["images_per_s"]
        targets[f"ddp_2x1_over_1x2_{view}"] = {"ratio": round(ratio, 3), "target": TARGET,
                                               "met": ratio >= TARGET}
    res = {"images": images, "batch": batch, "measured_epochs": epochs - 1, "rounds": rounds,
           "cpus": len(os.sched_getaffinity(0)), "rows": rows, "targets": targets,
           "failed_runs": failures}
    write_result(out, "ddp", res)
    plot(res, out / "ddp.png")
    return res


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    views = list(dict.fromkeys(r["view"] for r in res["rows"]))
    w = 0.38
    for k, (ranks, threads) in enumerate(ARMS):
        ys = [next(r["images_per_s"] for r in res["rows"] if r["view"] == v
                   and r["ranks"] == ranks) for v in views]
        ax.bar([i + (k - 0.5) * w for i in range(len(views))], ys, w,
               label=f"{ranks} rank(s) x {threads} thread(s)")
    ax.set_xticks(range(len(views)), [f"FastImageFolder over {v}" for v in views])
    ax.set_ylabel("images/s (all ranks)")
    ax.set_title(f"DDP scaling on {res['cpus']} cores (median of {res['rounds']} rounds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(res: dict) -> str:
    lines = ["ddp: images/s summed over ranks"]
    for r in res["rows"]:
        lines.append(f"  {r['view']:>7} {r['ranks']} x {r['threads_per_rank']}: "
                     f"{r['images_per_s']:.0f}")
    for k, t in res["targets"].items():
        lines.append(f"  {k}: {t['ratio']:.2f}x (target {t['target']}: "
                     f"{'met' if t['met'] else 'MISSED'})")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        root, threads, batch, epochs = sys.argv[2], *map(int, sys.argv[3:6])
        worker(root, threads, batch, epochs)
        return 0
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--work", default=str(REPO / ".cache" / "bench"))
    a = p.parse_args()
    print(summary(run_all(Path(a.work), Path(a.out), a.images, a.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
