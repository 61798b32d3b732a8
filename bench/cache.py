"""Cache tiers under a shuffled sampler: hit ratio per epoch of `lru` and `static` at 10%,
30% and 50% of the view's bytes, 3 epochs, on the memory tier of a local dataset and the
disk tier of a dataset on SeaweedFS (S3).  Counted through the Dataset API, which the
mount's views call, so the kernel's page cache does not hide the tier.

- memory tier: hits = images served from pinned images (static) or spliced from a cached
  record extent (both policies; a shuffled reader almost never triggers one);
- disk tier: hits = images whose every segment came from the disk cache.
Target: `static` within 0.02 of the tier's capacity fraction from the second epoch on
(`--cache-size` is the whole memory budget: under static the memory tier gets it less
the readahead share)."""
from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

from bench.common import ensure_dataset, ensure_imagenet_like, pcrfs, pyplot, write_result
from bench.remote_reads import s3_server

FRACTIONS = (0.1, 0.3, 0.5)
POLICIES = ("lru", "static")
EPOCHS = 3
VIEW = "q5"
BUCKET = "pcrfs-bench"


def _epochs(open_ds, paths: list[bytes], counter, capacities: dict, key: str, tier: str
            ) -> list[float]:
    ds = open_ds()
    t = ds.cache_tiers()[tier]
    # the tier's own capacity: the memory budget gives other holders their shares
    capacities[key] = round(t["capacity"] / ds.manifest["summary"]["total_bytes"][VIEW], 4)
    out = []
    try:
        for epoch in range(EPOCHS):
            order = list(paths)
            random.Random(epoch).shuffle(order)
            before = counter(ds.stats)
            for p in order:
                ds.read(p, VIEW)
            out.append(round((counter(ds.stats) - before) / len(paths), 4))
    finally:
        ds.close()
    return out


def run_all(work: Path, out: Path, images: int) -> dict:
    from pcrfs.dataset import open_dataset
    from pcrfs.storage.objclient import RemoteOptions
    src = ensure_imagenet_like(work, images)
    ds_path = ensure_dataset(src, work / f"ds-{images}-r128", "--views", "none",
                             "--images-per-record", 128)
    manifest = json.loads((ds_path / "manifest.json").read_text())
    view_bytes = manifest["summary"]["total_bytes"][VIEW]
    with open_dataset(str(ds_path)) as ds:
        paths = [p for p, _ in ds.index.iter_images()]
    res = {"view": VIEW, "images": len(paths), "view_bytes": view_bytes, "epochs": EPOCHS,
           "order": "shuffled, a new permutation each epoch", "memory": {}, "disk": {},
           "tier_capacity": {"memory": {}, "disk": {}}}
    mem_hits = lambda s: s.memory_image_hits + s.cache_hits   # noqa: E731
    for f in FRACTIONS:
        for pol in POLICIES:
            res["memory"][f"{pol}@{f}"] = _epochs(
                lambda: open_dataset(str(ds_path), cache_size=int(f * view_bytes),
                                     cache_policy=pol), paths, mem_hits,
                res["tier_capacity"]["memory"], f"{pol}@{f}", "memory")
    with s3_server(work / "seaweed-cache") as server:
        server.create_bucket(BUCKET)
        url = f"s3://{BUCKET}/{ds_path.name}"
        pcrfs("push", ds_path, url, "--endpoint", server.endpoint, "-q")
        remote = RemoteOptions(endpoint=server.endpoint)
        for f in FRACTIONS:
            for pol in POLICIES:
                cache = Path(tempfile.mkdtemp(dir=work, prefix="cachebench-"))
                try:
                    res["disk"][f"{pol}@{f}"] = _epochs(
                        lambda: open_dataset(url, cache_dir=str(cache), cache_size=0,   # disk tier alone
                                             cache_dir_size=int(f * view_bytes),
                                             cache_policy=pol, remote=remote),
                        paths, lambda s: s.disk_cache_image_hits,
                        res["tier_capacity"]["disk"], f"{pol}@{f}", "disk")
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
    res["target"] = ("static within 0.02 of the tier's capacity fraction (tier_capacity: "
                     "--cache-size less the budget's other shares; --cache-dir-size), "
                     "epochs 2 and 3")
    res["met"] = {tier: all(abs(r - res["tier_capacity"][tier][f"static@{f}"]) <= 0.02
                            for f in FRACTIONS for r in res[tier][f"static@{f}"][1:])
                  for tier in ("memory", "disk")}
    write_result(out, "cache", res)
    plot(res, out / "cache.png")
    return res


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, tier in zip(axes, ("memory", "disk"), strict=False):
        for pol, style in (("lru", "--"), ("static", "-")):
            for f in FRACTIONS:
                ys = res[tier][f"{pol}@{f}"]
                ax.plot(range(1, EPOCHS + 1), ys, style, marker="o", label=f"{pol} {int(f * 100)}%")
        for f in FRACTIONS:
            ax.axhline(res["tier_capacity"][tier][f"static@{f}"], color="grey", lw=0.5)
        ax.set_title(f"{tier} tier, shuffled epochs of {res['view']}")
        ax.set_xlabel("epoch")
        ax.set_xticks(range(1, EPOCHS + 1))
    axes[0].set_ylabel("hit ratio")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def summary(res: dict) -> str:
    lines = [f"cache hit ratio per epoch ({res['images']} images of {res['view']}, shuffled):"]
    for tier in ("memory", "disk"):
        for k, v in res[tier].items():
            lines.append(f"  {tier:6} {k:11} {v} (tier capacity {res['tier_capacity'][tier][k]})")
    lines.append(f"  static within 0.02 of capacity: {res['met']}")
    return "\n".join(lines)
