"""Many nodes, one bucket (issue 20), simulated on this machine with real parts.

SeaweedFS holds the dataset; 4 mounts of the same s3:// dataset are 4 nodes, each with
its own cache dir, a bandwidth limit of R/4 and (for the cached arms) `--shard i/4` and
its own memcached.  `torchrun --nproc_per_node=4` (gloo) runs one loading-only reader per
mount.  Four arms, per epoch after a warm-up epoch:

  regular       DistributedSampler, LRU disk caches of D/(8p) per node
  distributed   DistributedSampler over warmed --shard mounts with peers
  loc_peer      LocalityAwareBatchSampler(balance="peer")
  loc_storage   LocalityAwareBatchSampler(balance="storage")

Counted storage and peer bytes per epoch are set against `pcrfs model`.  Then the
ThreadedDataset grid: workers {1,2,4} x threads {1,2,4,8} on a warm local mount, a cold
SeaweedFS mount and a bandwidth-limited mount (the paper's Figure 7)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Mounted, ensure_dataset, ensure_imagenet_like, pcrfs, pyplot, write_result
from bench.remote_reads import BUCKET, s3_server
from testkit.pages import drop_page_cache
from testkit.servers import Memcached

NODES = 4
BATCH = 25            # per rank: 2,000 images = 20 global steps of 100, no padding
EPOCHS = 3            # the first is the warm-up
RATE = 8 << 20        # R: the bucket's bytes/s for the whole cluster
PEER_RATE = 8 << 20   # each node's link to its peers

READER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.datasets import ImageFolder
from pcrfs.torch import LocalityAwareBatchSampler, ThreadedDataset

arm, mounts, view, out = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
epochs, batch = int(sys.argv[5]), int(sys.argv[6])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mnt = mounts[rank]

def load(path):
    with open(path, "rb") as f:
        return len(f.read())

ds = ImageFolder(os.path.join(mnt, view), loader=load)
if arm.startswith("loc_"):
    sampler = LocalityAwareBatchSampler(ds, batch, world, rank, 1, seed=0, balance=arm[4:])
    loader = DataLoader(ThreadedDataset(ds, 8), batch_sampler=sampler, collate_fn=list)
else:
    sampler = DistributedSampler(ds, world, rank, shuffle=True, seed=0)
    loader = DataLoader(ThreadedDataset(ds, 8), batch_size=batch, sampler=sampler, collate_fn=list)

def stats():
    with open(os.path.join(mnt, ".pcrfs", "stats.json")) as f:
        return json.load(f)

report = []
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    dist.barrier()
    if rank == 0:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    dist.barrier()
    before, t0 = stats(), time.monotonic()
    sizes = [len(b) for b in loader]
    t = time.monotonic() - t0
    dist.barrier()
    wall = time.monotonic() - t0
    after = stats()
    report.append({"epoch": epoch, "seconds": t, "wall": wall, "batch_sizes": sizes,
                   "images": sum(sizes),
                   **{k: after[k] - before[k] for k in ("remote_bytes", "remote_requests",
                                                        "peer_bytes", "peer_hits", "owned_hits",
                                                        "peer_misses", "disk_cache_image_hits")}})
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
dist.barrier()
dist.destroy_process_group()
'''


def _torchrun(arm: str, mounts: list[Path], view: str, out: Path) -> list[list[dict]]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    script = out / "reader.py"
    script.write_text(READER)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    subprocess.run([torchrun, f"--nproc_per_node={NODES}", "--master_port", "29533",
                    str(script), arm, ",".join(map(str, mounts)), view, str(out), str(EPOCHS),
                    str(BATCH)], check=True, cwd="/", capture_output=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(NODES)]


def _arm_result(name: str, per_rank: list[list[dict]]) -> dict:
    epochs = []
    for e in range(1, EPOCHS):
        rows = [r[e] for r in per_rank]
        epochs.append({
            "storage_bytes": sum(x["remote_bytes"] for x in rows),
            "storage_requests": sum(x["remote_requests"] for x in rows),
            "peer_bytes": sum(x["peer_bytes"] for x in rows),
            "owned_hits": sum(x["owned_hits"] for x in rows),
            "images": sum(x["images"] for x in rows),
            "seconds": max(x["wall"] for x in rows),
            "batch_sizes_exact": all(s == BATCH for x in rows for s in x["batch_sizes"]),
            "steps_per_rank": sorted({len(x["batch_sizes"]) for x in rows})})
    mean = {k: sum(ep[k] for ep in epochs) / len(epochs)
            for k in ("storage_bytes", "peer_bytes", "seconds", "images", "owned_hits")}
    return {"arm": name, "epochs": epochs, "mean": mean,
            "images_per_s": mean["images"] / mean["seconds"],
            "every_rank_batch_size_every_step": all(ep["batch_sizes_exact"] for ep in epochs)}


def bench_arms(url: str, ds: Path, work: Path, endpoint: str) -> dict:
    from pcrfs import open_dataset
    from pcrfs.cluster.model import Params
    from pcrfs.cluster.model import epoch as model_epoch
    with open_dataset(str(ds)) as local:
        s = local.manifest["summary"]
        n = int(s["images"])
        groups = local.groups
        per_k = [s["total_bytes"][f"q{k}"] / n for k in range(1, groups + 1)]
    view = f"q{groups}"
    d = per_k[-1] * n
    root = work / "cluster"
    shutil.rmtree(root, ignore_errors=True)
    mcs = []
    res = {"nodes": NODES, "batch_per_rank": BATCH, "images": n, "view": view, "epoch_bytes": d,
           "storage_rate": RATE, "peer_rate_per_node": PEER_RATE, "arms": {}}
    try:
        for i in range(NODES):
            m = Memcached(root / f"mc{i}")
            m.start()
            mcs.append(m)
        peers = ",".join(m.address for m in mcs)
        common = ["--endpoint", endpoint, "--cache-size", "2M", "-o", "fast_lane=no",
                  "--bandwidth-limit", str(RATE // NODES)]
        lru = max(1 << 20, int(d / (8 * NODES)))
        mounts = [root / f"mnt-reg{i}" for i in range(NODES)]
        ctx = [Mounted(url, mounts[i], *common, "--cache-dir", root / f"cache-reg{i}",
                       "--cache-dir-size", str(lru)) for i in range(NODES)]
        for c in ctx:
            c.__enter__()
        try:
            res["arms"]["regular"] = _arm_result("regular", _torchrun("regular", mounts, view,
                                                                    root / "out-regular"))
            res["arms"]["regular"]["lru_bytes_per_node"] = lru
        finally:
            for c in ctx:
                c.__exit__()
        mounts = [root / f"mnt-shard{i}" for i in range(NODES)]
        ctx = [Mounted(url, mounts[i], *common, "--cache-dir", root / f"cache-shard{i}",
                       "--cache-dir-size", "1G", "--shard", f"{i}/{NODES}", "--peers", peers,
                       "--peer-bandwidth-limit", str(PEER_RATE)) for i in range(NODES)]
        for c in ctx:
            c.__enter__()
        try:
            t0 = time.monotonic()
            for m in mounts:
                pcrfs("warm", m, "-q")
            warm = [c.stats() for c in ctx]
            res["warm"] = {"seconds": time.monotonic() - t0,
                           "gets": sum(w["warm_gets"] for w in warm),
                           "owned_records": [w["shard"]["owned_records"] for w in warm],
                           "owned_images": [w["shard"]["owned_images"] for w in warm],
                           "bytes": sum(w["warm_bytes"] for w in warm)}
            for arm in ("distributed", "loc_peer", "loc_storage"):
                for m in mounts:
                    (m / ".pcrfs" / "control" / "balance").write_text(
                        "storage\n" if arm == "loc_storage" else "peer\n")
                res["arms"][arm] = _arm_result(arm, _torchrun(arm, mounts, view, root / f"out-{arm}"))
        finally:
            for c in ctx:
                c.__exit__()
    finally:
        for m in mcs:
            m.stop()
    # the model, with the same N, D, p, batch and rates
    model = {}
    for balance in ("peer", "storage"):
        pr = Params(images=n, bytes_per_image=per_k, nodes=NODES, train_rate=1e9,
                    storage_rate=RATE, peer_rate=PEER_RATE, cache_per_node=1 << 40,
                    local_batch=BATCH, ranks_per_node=1, balance=balance)
        model[balance] = model_epoch(pr)
    beta = model["peer"]["beta"]
    res["model"] = {"beta": beta, "alpha": model["peer"]["alpha"],
                    "regular": {"storage_bytes": model["peer"]["regular"]["storage_bytes"],
                                "peer_bytes": 0.0},
                    "distributed": {k: model["peer"]["distributed"][k]
                                    for k in ("storage_bytes", "peer_bytes")},
                    "loc_peer": {k: model["peer"]["locality"][k]
                                 for k in ("storage_bytes", "peer_bytes")},
                    "loc_storage": {k: model["storage"]["locality"][k]
                                    for k in ("storage_bytes", "peer_bytes")}}
    checks = {}
    for arm, r in res["arms"].items():
        m = res["model"][arm]
        counted = r["mean"]["storage_bytes"] + r["mean"]["peer_bytes"]
        want = m["storage_bytes"] + m["peer_bytes"]
        checks[arm] = {"counted_bytes": counted, "model_bytes": want,
                       "ratio": counted / want if want else None,
                       "within_10pct": abs(counted / want - 1) <= 0.10 if want else None}
    loc = res["arms"]["loc_storage"]["mean"]["storage_bytes"]
    checks["loc_storage_vs_beta_D"] = {"storage_bytes": loc, "beta_D": beta * d,
                                       "ratio": loc / (beta * d), "target": 1.2,
                                       "met": loc <= 1.2 * beta * d}
    checks["every_rank_batch_size"] = all(r["every_rank_batch_size_every_step"]
                                          for r in res["arms"].values())
    res["checks"] = checks
    return res


GRID_WORKERS = (1, 2, 4)
GRID_THREADS = (1, 2, 4, 8)
GRID_IMAGES = 256


def _grid_run(root: Path, workers: int, threads: int) -> float:
    import torch
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    from pcrfs.torch import ThreadedDataset
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    ds = ImageFolder(str(root), transform=tf)
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(workers * 10 + threads))
    loader = torch.utils.data.DataLoader(ThreadedDataset(ds, threads), batch_size=32,
                                         sampler=idx[:GRID_IMAGES].tolist(),
                                         num_workers=workers, collate_fn=len)
    t0 = time.monotonic()
    n = sum(loader)
    return n / (time.monotonic() - t0)


def bench_grid(url: str, ds: Path, work: Path, endpoint: str) -> dict:
    root = work / "threads"
    shutil.rmtree(root, ignore_errors=True)
    view = "q10"
    settings = {
        "warm_local": (ds, ["--cache-dir", "none"], False),
        "cold_seaweedfs": (url, ["--endpoint", endpoint, "--cache-dir", root / "cache",
                                 "--cache-dir-size", "1k", "--cache-size", "2M",
                                 "-o", "fast_lane=no"], True),
        "limited_20MBps": (ds, ["--cache-dir", "none", "--bandwidth-limit", "20M",
                                "--cache-size", "2M", "-o", "fast_lane=no"], True),
    }
    out = {}
    for name, (dst, args, cold) in settings.items():
        mnt = root / f"mnt-{name}"
        with Mounted(dst, mnt, *args):
            if not cold:      # every file once: the page cache is warm
                for d, _, files in os.walk(mnt / view):
                    for f in files:
                        Path(d, f).read_bytes()
            rows = []
            for w in GRID_WORKERS:
                for t in GRID_THREADS:
                    if cold:
                        drop_page_cache()
                    rows.append({"workers": w, "threads": t,
                                 "images_per_s": _grid_run(mnt / view, w, t)})
            out[name] = rows
    return out


def plot(res: dict, out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    arms = list(res["arms"])
    x = range(len(arms))
    st = [res["arms"][a]["mean"]["storage_bytes"] / 1e6 for a in arms]
    pe = [res["arms"][a]["mean"]["peer_bytes"] / 1e6 for a in arms]
    ms = [res["model"][a]["storage_bytes"] / 1e6 for a in arms]
    mp = [res["model"][a]["peer_bytes"] / 1e6 for a in arms]
    axes[0].bar([i - 0.2 for i in x], st, 0.4, label="storage, counted")
    axes[0].bar([i - 0.2 for i in x], pe, 0.4, bottom=st, label="peer, counted")
    axes[0].bar([i + 0.2 for i in x], ms, 0.4, label="storage, model", alpha=0.6)
    axes[0].bar([i + 0.2 for i in x], mp, 0.4, bottom=ms, label="peer, model", alpha=0.6)
    axes[0].set_xticks(list(x), arms)
    axes[0].set_ylabel("MB per epoch (4 nodes)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("bytes per epoch: counted vs pcrfs model")
    axes[1].bar(arms, [res["arms"][a]["images_per_s"] for a in arms])
    axes[1].set_ylabel("images/s (4 ranks)")
    axes[1].set_title(f"loading only, R = {res['storage_rate'] >> 20} MiB/s")
    for name, rows in res.get("threads", {}).items():
        for w in GRID_WORKERS:
            pts = [(r["threads"], r["images_per_s"]) for r in rows if r["workers"] == w]
            axes[2].plot(*zip(*pts, strict=False), marker="o", label=f"{name}, {w} workers")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("threads per worker")
    axes[2].set_ylabel("images/s (decode + crop)")
    axes[2].legend(fontsize=6)
    axes[2].set_title("ThreadedDataset grid")
    fig.tight_layout()
    fig.savefig(out)


def run_all(work: Path, out: Path, images: int, quick: bool) -> dict:
    src = ensure_imagenet_like(work, images)
    ds = ensure_dataset(src, work / f"ds-{images}-r128", "--views", "none", "--images-per-record", 128)
    with s3_server(work / "seaweed") as server:
        server.create_bucket(BUCKET)
        url = f"s3://{BUCKET}/{ds.name}"
        pcrfs("push", ds, url, "--endpoint", server.endpoint, "-q")
        env = {"AWS_ENDPOINT_URL": server.endpoint}
        os.environ.update(env)
        res = bench_arms(url, ds, work, server.endpoint)
        res["threads"] = bench_grid(url, ds, work, server.endpoint)
    write_result(out, "cluster", res)
    plot(res, out / "cluster.png")
    return res


def summary(res: dict) -> str:
    lines = [f"cluster: {res['nodes']} nodes, {res['images']} images, D = {res['epoch_bytes'] / 1e6:.1f} MB, "
             f"beta (model) = {res['model']['beta']:.4f}"]
    for arm, r in res["arms"].items():
        c = res["checks"][arm]
        lines.append(f"  {arm:<12} storage {r['mean']['storage_bytes'] / 1e6:7.2f} MB  peer "
                     f"{r['mean']['peer_bytes'] / 1e6:7.2f} MB  counted/model {c['ratio']:.3f}  "
                     f"{r['images_per_s']:.0f} images/s")
    c = res["checks"]["loc_storage_vs_beta_D"]
    lines.append(f"  loc_storage storage / (beta D) = {c['ratio']:.3f} (target <= 1.2: "
                 f"{'met' if c['met'] else 'MISSED'}); every rank batch_size every step: "
                 f"{res['checks']['every_rank_batch_size']}")
    return "\n".join(lines)
