#!/usr/bin/env python3
"""pcrfs benchmarks (`make bench`): JSON under bench/results/, PNG plots beside it.

Build throughput: `pcrfs build` vs a loop of `jpegtran -progressive -optimize` processes
over the same ImageNet-like files with the same parallelism, measured alternately in one
run (median of N); plus peak RSS, dataset/source size ratio, index bytes per image and the
per-fidelity size table (the paper's Table 1)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
PCRFS = str(VENV_BIN / "pcrfs")


def tree_rss(pid: int) -> int:
    """Resident bytes of pid and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def timed(cmd: list[str], **kw) -> tuple[float, int]:
    """Wall seconds and peak RSS of the whole process tree (sampled every 20 ms)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    peak = [0]
    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.02)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {err.decode()[-2000:]}")
    return time.perf_counter() - t0, peak[0]


def jpegtran_loop(src: Path, out: Path, workers: int) -> list[str]:
    """One jpegtran process per image, `workers` at a time, exec'd directly by xargs
    (no shell per file), output directories created up front: the fairest loop."""
    script = (f'cd "{src}" && find . -type d -exec mkdir -p "{out}/{{}}" \\; && '
              f'find . -type f -print0 | xargs -0 -P {workers} -I{{}} '
              f'jpegtran -progressive -optimize -copy none -outfile "{out}/{{}}" {{}}')
    return ["bash", "-c", script]


def bench_build(work: Path, images: int, runs: int, workers: int) -> dict:
    src = work / "imagenet-like"
    if not src.exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "make_imagefolder.py"),
                        str(REPO / ".cache" / "corpus"), str(src), "--mode", "crops",
                        "--count", str(images), "--classes", "20"], check=True)
    n = sum(1 for _ in src.rglob("*.JPEG"))
    src_bytes = sum(p.stat().st_size for p in src.rglob("*.JPEG"))
    samples = {"pcrfs": [], "jpegtran": []}
    rss = []
    # warm-up (page cache, first-run effects), then alternate the two tools
    for i in range(runs + 1):
        dst = work / f"ds{i}"
        shutil.rmtree(dst, ignore_errors=True)
        secs, peak = timed([PCRFS, "build", str(src), str(dst), "-q", "--workers", str(workers)])
        out = work / f"jt{i}"
        shutil.rmtree(out, ignore_errors=True)
        jsecs, _ = timed(jpegtran_loop(src, out, workers))
        if i == 0:
            continue
        samples["pcrfs"].append(n / secs)
        samples["jpegtran"].append(n / jsecs)
        rss.append(peak)
        info = json.loads(subprocess.run([PCRFS, "info", str(dst), "--json"], check=True,
                                         capture_output=True, text=True).stdout)
        shutil.rmtree(out)
        if i < runs:
            shutil.rmtree(dst)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "images": n, "source_bytes": src_bytes, "workers": workers, "runs": runs,
        "images_per_s": {"samples": samples, "median": med},
        "speedup_vs_jpegtran_loop": round(med["pcrfs"] / med["jpegtran"], 3),
        "target_speedup": 2.0,
        "peak_rss_bytes": {"samples": rss, "max": max(rss)},
        "target_peak_rss_bytes": 1 << 30,
        "dataset_over_source": round(info["dataset_bytes"] / src_bytes, 4),
        "index_bytes_per_image": info["index_bytes_per_image"],
        "target_index_bytes_per_image": 256,
        "size_table": info["summary"],
        "cache": "warm page cache (sources read once before timing)",
    }


def plot_build(res: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    med = res["images_per_s"]["median"]
    a.bar(["pcrfs build", "jpegtran loop"], [med["pcrfs"], med["jpegtran"]],
          color=["tab:blue", "tab:gray"])
    a.set_ylabel("images/s (median)")
    a.set_title(f"Build throughput, {res['images']} images, {res['workers']} workers: "
                f"{res['speedup_vs_jpegtran_loop']:.2f}x", fontsize=9)
    views = res["size_table"]["views"]
    b.bar([v["view"] for v in views], [v["mean_bytes"] / 1024 for v in views])
    for i, v in enumerate(views):
        b.text(i, v["mean_bytes"] / 1024, f"{v['full_over_k']:.1f}x", ha="center",
               va="bottom", fontsize=7)
    b.set_ylabel("mean KiB per image")
    b.set_title("Bytes read per image at qk (label: full/k)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--work", default=str(REPO / ".cache" / "bench"))
    a = p.parse_args()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    res = bench_build(work, a.images, a.runs, a.workers)
    doc = {"benchmark": "build", "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                                              "python": platform.python_version(),
                                              "platform": platform.platform()},
           "command": " ".join(sys.argv), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "result": res}
    (out / "build.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot_build(res, out / "build.png")
    med = res["images_per_s"]["median"]
    print(f"build: pcrfs {med['pcrfs']:.0f} img/s vs jpegtran loop {med['jpegtran']:.0f} img/s "
          f"= {res['speedup_vs_jpegtran_loop']:.2f}x (target >= 2x); peak RSS "
          f"{res['peak_rss_bytes']['max'] / 2**20:.0f} MiB; dataset/source "
          f"{res['dataset_over_source']}; index {res['index_bytes_per_image']} B/image")
    return 0


if __name__ == "__main__":
    sys.exit(main())
