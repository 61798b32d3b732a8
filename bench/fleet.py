"""Operating in a fleet: what metrics cost, and az:// next to s3://.

1. metrics cost: warm files/s of 4 threads over a mount with `-o metrics` (and a scraper
   pulling /metrics every second, as Prometheus would) against the same dataset mounted
   without, side by side, interleaved rounds; each file's pages are dropped after it is
   read (POSIX_FADV_DONTNEED, mount.read_rate) so every read reaches the daemon.  Both
   with the fast lane (the default) and without it (every request through Python, where
   the latency histograms are filled).  Target: on/off >= 0.97.
2. az://: read amplification and GETs per image on a real Azurite, as remote_reads.py measures
   them for s3:// on SeaweedFS."""
from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import bench.remote_reads as s3bench
from bench.common import (
    Mounted,
    ensure_dataset,
    ensure_imagenet_like,
    environment,
    median,
    pcrfs,
    pyplot,
    write_result,
)
from bench.mount import read_rate
from testkit.servers import Azurite, free_ports

CONTAINER = "pcrfs-bench"


@contextmanager
def _scraper(url: str, every: float = 1.0):
    stop = threading.Event()
    scrapes = [0, 0.0]

    def run():
        while not stop.wait(every):
            t = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as r:
                r.read()
            scrapes[0] += 1
            scrapes[1] += time.perf_counter() - t
    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        yield scrapes
    finally:
        stop.set()
        th.join()


def bench_metrics_cost(ds: Path, work: Path, view: str, rounds: int, seconds: float) -> dict:
    out = {}
    for lane in ("yes", "no"):
        (port,) = free_ports(1)
        with Mounted(ds, work / "mnt-metrics-off", "-o", f"fast_lane={lane}") as off, \
                Mounted(ds, work / "mnt-metrics-on", "-o",
                        f"fast_lane={lane},metrics=127.0.0.1:{port}") as on:
            files = {m: sorted(str(p) for p in (m.mnt / view).rglob("*") if p.is_file())
                     for m in (off, on)}
            for m in (off, on):            # warm the daemons' caches
                read_rate(files[m], 4, 3.0, drop=True)
            rates = {"off": [], "on": []}
            with _scraper(f"http://127.0.0.1:{port}/metrics") as scrapes:
                for r in range(rounds):   # interleaved, alternating which goes first
                    order = (off, on) if r % 2 == 0 else (on, off)
                    for m in order:
                        rates["off" if m is off else "on"].append(
                            read_rate(files[m], 4, seconds, drop=True))
            ratios = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
            out["fast_lane" if lane == "yes" else "python_only"] = {
                "files_per_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
                "median_files_per_s": {k: round(median(v), 1) for k, v in rates.items()},
                "on_over_off_per_round": [round(x, 4) for x in ratios],
                "on_over_off": round(median(ratios), 4),
                "scrapes": scrapes[0],
                "mean_scrape_ms": round(1000 * scrapes[1] / max(scrapes[0], 1), 2)}
    out["target"] = 0.97
    out["reader"] = (f"4 threads, every file of {view} in turn, pages dropped after each "
                     f"read, {rounds} interleaved rounds of {seconds:g} s per mount; a scraper "
                     f"pulls /metrics every second")
    return out


@contextmanager
def azurite(root: Path):
    shutil.rmtree(root, ignore_errors=True)
    server = Azurite(root)
    server.start()
    try:
        with environment(server.env()):
            server.create_container(CONTAINER)
            yield server
    finally:
        server.stop()


def bench_azure(ds: Path, work: Path, views: list[str]) -> dict:
    with azurite(work / "azurite") as server:
        url = f"az://{CONTAINER}/{ds.name}"
        pcrfs("push", ds, url, "-q")
        res = s3bench.bench_amplification(url, server.endpoint, views, work)
    res["server"] = "Azurite 3.37.0 (blob service) on 127.0.0.1"
    return res


def plot(res: dict, out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    mc = res["metrics_cost"]
    arms = ["fast_lane", "python_only"]
    for i, key in enumerate(("off", "on")):
        axes[0].bar([x + 0.38 * i for x in range(len(arms))],
                    [mc[a]["median_files_per_s"][key] for a in arms], 0.38,
                    label=f"metrics {key}")
    axes[0].set_xticks([x + 0.19 for x in range(len(arms))], arms)
    axes[0].set_ylabel("files/s (4 threads, daemon warm)")
    axes[0].set_title("cost of -o metrics (target on/off >= 0.97)")
    axes[0].legend()
    az = res["azure"]
    views = list(az["random"])
    for i, order in enumerate(("random", "record_order")):
        axes[1].bar([x + 0.38 * i for x in range(len(views))],
                    [az[order][v]["amplification"] for v in views], 0.38, label=order)
    axes[1].axhline(1.05, color="gray", ls="--", label="target 1.05")
    axes[1].set_xticks([x + 0.19 for x in range(len(views))], views)
    axes[1].set_ylabel("bytes from Azurite / bytes served")
    axes[1].set_title("az:// read amplification")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def run_all(work: Path, out: Path, images: int, quick: bool) -> dict:
    src = ensure_imagenet_like(work, images)
    ds = ensure_dataset(src, work / f"ds-{images}-r128", "--views", "none", "--images-per-record", 128)
    manifest = json.loads((ds / "manifest.json").read_text())
    top = f"q{manifest['groups']}"
    res = {"dataset": {"images": manifest["images"], "records": manifest["records"]}}
    res["metrics_cost"] = bench_metrics_cost(ds, work, "q5", 3 if quick else 6, 3.0 if quick else 4.0)
    write_result(out, "fleet", res)      # kept if the az:// part fails
    res["azure"] = bench_azure(ds, work, ["q1", "q2", "q5", top])
    write_result(out, "fleet", res)
    plot(res, out / "fleet.png")
    return res


def summary(res: dict) -> str:
    mc, az = res["metrics_cost"], res["azure"]
    return "\n".join([
        "metrics on/off (4 threads, warm): fast lane "
        f"{mc['fast_lane']['on_over_off']}, python only {mc['python_only']['on_over_off']} "
        "(target >= 0.97)",
        "az:// amplification random: " + ", ".join(
            f"{v} {r['amplification']}" for v, r in az["random"].items())
        + "; record order: " + ", ".join(
            f"{v} {r['amplification']}" for v, r in az["record_order"].items()),
        "az:// GETs/image record order: " + ", ".join(
            f"{v} {r['gets_per_image']}" for v, r in az["record_order"].items())
        + "; random: " + ", ".join(f"{v} {r['gets_per_image']}" for v, r in az["random"].items()),
    ])
