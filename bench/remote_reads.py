"""Remote datasets: PCR records on a real SeaweedFS S3 server, read through the mount.

1. read amplification: remote bytes / served bytes for q1, q2, q5, qG, random and record
   order, each from a cold disk cache (target <= 1.05);
2. GET requests per image, same runs (target <= 1 in record order);
3. images/s under --bandwidth-limit: achieved qk/qG speedup against Theorem 4.1's
   prediction, mean qG bytes / mean qk bytes (target >= 0.9);
4. cold vs warm disk cache: epoch 2 after a remount (memory and page cache dropped)
   against epoch 1, with and without a bandwidth limit."""
from __future__ import annotations

import json
import random
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from bench.common import (
    Mounted,
    ensure_dataset,
    ensure_imagenet_like,
    environment,
    pcrfs,
    pyplot,
    write_result,
)
from testkit.pages import drop_page_cache
from testkit.servers import SeaweedFS

BUCKET = "pcrfs-bench"


@contextmanager
def s3_server(root: Path):
    """A SeaweedFS S3 server on 127.0.0.1 with fresh data, its credentials in the
    environment (as the pcrfs subprocesses read them) while it runs."""
    server = SeaweedFS(root)
    shutil.rmtree(root / "data", ignore_errors=True)
    (root / "data").mkdir(parents=True)
    server.start()
    try:
        with environment(server.env()):
            yield server
    finally:
        server.stop()




def read_once(paths: list[str], threads: int, seconds: float | None = None) -> tuple[int, float]:
    """Each file read once (whole) by one of `threads` readers: (files, seconds)."""
    todo = iter(paths)             # in the given order
    lock = threading.Lock()
    done = [0]
    stop = time.monotonic() + seconds if seconds else None

    def worker():
        while stop is None or time.monotonic() < stop:
            with lock:
                p = next(todo, None)
            if p is None:
                return
            with open(p, "rb") as f:
                while f.read(1 << 17):
                    pass
            with lock:
                done[0] += 1
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return done[0], time.monotonic() - t0


def ordered_files(view: str, mnt: Path, order: str) -> list[str]:
    """Files of a view in record order (the build keeps sorted order) or shuffled."""
    files = sorted(str(p) for p in (mnt / view).rglob("*") if p.is_file())
    if order == "random":
        random.Random(0).shuffle(files)
    return files


def _mount(url: str, mnt: Path, cache: Path, env_endpoint: str, *args) -> Mounted:
    shutil.rmtree(cache, ignore_errors=True)
    return Mounted(url, mnt, "--cache-dir", cache, "--endpoint", env_endpoint, *map(str, args))


def bench_amplification(url, endpoint, views, work) -> dict:
    out: dict = {"random": {}, "record_order": {}}
    for order in ("random", "record_order"):
        for v in views:
            with _mount(url, work / "mnt-remote", work / "cache-amp", endpoint) as m:
                files = ordered_files(v, m.mnt, "random" if order == "random" else "record")
                s0 = m.stats()
                read_once(files, 1)
                s1 = m.stats()
            remote = s1["remote_bytes"] - s0["remote_bytes"]
            gets = s1["remote_requests"] - s0["remote_requests"]
            served = s1["served_bytes"].get(v, 0) - s0["served_bytes"].get(v, 0)
            out[order][v] = {"remote_bytes": remote, "served_bytes": served,
                             "amplification": round(remote / served, 4),
                             "gets_per_image": round(gets / len(files), 4),
                             "extent_fetches": s1["extent_fetches"] - s0["extent_fetches"],
                             "images": len(files)}
    out["targets"] = {"amplification": 1.05, "record_order_gets_per_image": 1.0}
    out["reader"] = "1 thread, every file of the view once, cold disk cache, 1 GiB memory cache"
    return out


def bench_bandwidth(url, endpoint, views, mean, work, limit_mib: float, seconds: float) -> dict:
    top = views[-1]
    rates = {}
    for v in views:
        with _mount(url, work / "mnt-remote", work / "cache-bw", endpoint,
                    "--bandwidth-limit", f"{limit_mib}M", "--cache-size", "1M") as m:
            files = ordered_files(v, m.mnt, "random")
            n, t = read_once(files, 4, seconds)
            rates[v] = n / t
    res = {"limit_mib_per_s": limit_mib, "images_per_s": {v: round(r, 2) for v, r in rates.items()},
           "speedup": {}}
    for v in views[:-1]:
        achieved = rates[v] / rates[top]
        predicted = mean[top] / mean[v]
        res["speedup"][v] = {"achieved": round(achieved, 3), "predicted_theorem_4_1": round(predicted, 3),
                             "achieved_over_predicted": round(achieved / predicted, 3)}
    res["target_achieved_over_predicted"] = 0.9
    res["reader"] = ("4 threads, each file once (no disk-cache hits), random order, "
                     "1 MiB memory cache (no extents)")
    return res


def bench_cold_warm(url, endpoint, view, work, limit_mib: float | None) -> dict:
    cache = work / "cache-cw"
    shutil.rmtree(cache, ignore_errors=True)
    args = ["--cache-dir", cache, "--endpoint", endpoint]
    if limit_mib:
        args += ["--bandwidth-limit", f"{limit_mib}M"]
    rates, remote = [], []
    for _ in range(2):
        drop_page_cache()
        with Mounted(url, work / "mnt-remote", *map(str, args)) as m:
            files = ordered_files(view, m.mnt, "random")
            s0 = m.stats()
            n, t = read_once(files, 4)
            rates.append(n / t)
            remote.append(m.stats()["remote_bytes"] - s0["remote_bytes"])
    return {"view": view, "bandwidth_limit_mib_per_s": limit_mib,
            "files_per_s": {"cold": round(rates[0], 1), "warm": round(rates[1], 1)},
            "warm_over_cold": round(rates[1] / rates[0], 3),
            "remote_bytes": {"cold": remote[0], "warm": remote[1]}}


def _limit(c: dict) -> str:
    lim = c["bandwidth_limit_mib_per_s"]
    return f"{lim} MiB/s" if lim else "unlimited"


def plot(res: dict, out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    amp = res["amplification"]
    views = list(amp["random"])
    x = range(len(views))
    axes[0].bar([i - 0.2 for i in x], [amp["random"][v]["amplification"] for v in views], 0.4, label="random")
    axes[0].bar([i + 0.2 for i in x], [amp["record_order"][v]["amplification"] for v in views], 0.4,
                label="record order")
    axes[0].axhline(1.05, color="red", ls="--", label="target 1.05")
    axes[0].set_xticks(list(x), views)
    axes[0].set_ylabel("remote bytes / served bytes")
    axes[0].set_title("read amplification from SeaweedFS")
    axes[0].legend(fontsize=7)
    bw = res["bandwidth"]
    ks = list(bw["speedup"])
    axes[1].bar([i - 0.2 for i in range(len(ks))], [bw["speedup"][k]["predicted_theorem_4_1"] for k in ks],
                0.4, label="Theorem 4.1")
    axes[1].bar([i + 0.2 for i in range(len(ks))], [bw["speedup"][k]["achieved"] for k in ks], 0.4,
                label="achieved")
    axes[1].set_xticks(range(len(ks)), ks)
    axes[1].set_ylabel(f"images/s over {list(bw['images_per_s'])[-1]}")
    axes[1].set_title(f"speedup at {bw['limit_mib_per_s']} MiB/s")
    axes[1].legend(fontsize=7)
    cw = res["cold_warm"]
    labels = [f"{c['view']} {_limit(c)}" for c in cw]
    axes[2].bar([i - 0.2 for i in range(len(cw))], [c["files_per_s"]["cold"] for c in cw], 0.4,
                label="epoch 1 (cold)")
    axes[2].bar([i + 0.2 for i in range(len(cw))], [c["files_per_s"]["warm"] for c in cw], 0.4,
                label="epoch 2 (disk cache warm)")
    axes[2].set_xticks(range(len(cw)), labels, fontsize=8)
    axes[2].set_ylabel("files/s")
    axes[2].set_title("cold vs warm disk cache")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def run_all(work: Path, out: Path, images: int, quick: bool) -> dict:
    src = ensure_imagenet_like(work, images)
    ds = ensure_dataset(src, work / f"ds-{images}-r128", "--views", "none", "--images-per-record", 128)
    manifest = json.loads((ds / "manifest.json").read_text())
    top = f"q{manifest['groups']}"
    views = ["q1", "q2", "q5", top]
    mean = {v["view"]: v["mean_bytes"] for v in manifest["summary"]["views"]}
    with s3_server(work / "seaweed") as server:
        server.create_bucket(BUCKET)
        url = f"s3://{BUCKET}/{ds.name}"
        pcrfs("push", ds, url, "--endpoint", server.endpoint, "-q")
        res = {"dataset": {"images": manifest["images"], "records": manifest["records"],
                           "images_per_record": manifest["build"]["images_per_record"],
                           "groups": manifest["groups"], "mean_bytes": {v: mean[v] for v in views}},
               "server": "SeaweedFS (weed server -s3) on 127.0.0.1"}
        res["amplification"] = bench_amplification(url, server.endpoint, views, work)
        res["bandwidth"] = bench_bandwidth(url, server.endpoint, views, mean, work, 1.0,
                                           4.0 if quick else 8.0)
        res["cold_warm"] = [bench_cold_warm(url, server.endpoint, top, work, None),
                            bench_cold_warm(url, server.endpoint, top, work, 8.0)]
    write_result(out, "remote", res)
    plot(res, out / "remote.png")
    return res


def summary(res: dict) -> str:
    amp = res["amplification"]
    bw = res["bandwidth"]
    lines = [
        "remote amplification random: " + ", ".join(
            f"{v} {r['amplification']}" for v, r in amp["random"].items())
        + "; record order: " + ", ".join(f"{v} {r['amplification']}" for v, r in amp["record_order"].items())
        + " (target <= 1.05)",
        "remote GETs/image record order: " + ", ".join(
            f"{v} {r['gets_per_image']}" for v, r in amp["record_order"].items())
        + " (target <= 1); random: "
        + ", ".join(f"{v} {r['gets_per_image']}" for v, r in amp["random"].items()),
        f"remote speedup at {bw['limit_mib_per_s']} MiB/s achieved/predicted: " + ", ".join(
            f"{v} {r['achieved_over_predicted']}" for v, r in bw["speedup"].items()) + " (target >= 0.9)",
        "remote warm/cold epoch: " + ", ".join(
            f"{c['view']} {_limit(c)} {c['warm_over_cold']}x "
            f"({c['files_per_s']['cold']} -> {c['files_per_s']['warm']} files/s)"
            for c in res["cold_warm"]),
    ]
    return "\n".join(lines)
