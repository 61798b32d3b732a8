"""The fused decode-crop-resize (pcrfs.torch.decode_resized_crop, issue 54) in one thread:
what one training sample costs, in core-ms, and how close its pixels are.

Over ImageNet-like crops the tests never used, with one box and flip per image drawn as
RandomResizedCrop(224) draws them, each arm produces the same uint8 CHW 224x224 tensor:

  torchvision_source   Pillow open + convert("RGB") (ImageFolder's loader), resized_crop
                       (bilinear, antialiased), hflip, pil_to_tensor: the source JPEGs
  torchvision_q10      the same over the q10 files
  fused_source         decode_resized_crop over the source JPEGs
  fused_q10            ... over the q10 files (progressive, every scan)
  fused_qK             ... over the view `pcrfs tune` would pick for a CPU-bound box (K=5
                       unless given): fewer scans, less Huffman work
  fused_*_fast         the same with libjpeg's fast IDCT and no fancy upsampling

Each arm is the best of 3 passes over files already in memory (so no I/O), in turn.  PSNR:
each fused arm against torchvision's output for the same file and box."""
from __future__ import annotations

import io
import random
import time
from pathlib import Path

import numpy as np

from bench.common import ensure_dataset, ensure_imagenet_like, pyplot, write_result

TARGET_Q10_SHARE = 0.5      # fused q10 core-ms <= half of torchvision over the sources
TARGET_PSNR_DB = 30.0


def _tv(data, box, flip):
    import torchvision.transforms.functional as F
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    out = F.resized_crop(rgb, *box, [224, 224], InterpolationMode.BILINEAR, antialias=True)
    if flip:
        out = F.hflip(out)
    return F.pil_to_tensor(out)


def _fused(fast: bool):
    import torch

    from pcrfs.jpeg.crop import decode_resized_crop

    def run(data, box, flip):
        return torch.from_numpy(decode_resized_crop(data, box, 224, flip, chw=True, fast=fast))
    return run


def _psnr(a, b) -> float:
    d = a.numpy().astype(np.float64) - b.numpy().astype(np.float64)
    mse = float((d ** 2).mean())
    return 99.0 if mse == 0 else float(10 * np.log10(255 ** 2 / mse))


def profile(views: dict[str, list[bytes]], passes: int = 3, seed: int = 0) -> dict:
    """views: "source", "q10" and any "qK", the same images in the same order.  One box
    and flip per image (drawn from the source's size), every arm over them."""
    from pcrfs.jpeg.crop import image_size, random_resized_box
    rng = random.Random(seed)
    boxes = []
    for data in views["source"]:
        w, h = image_size(data)
        boxes.append((random_resized_box(rng, w, h), rng.random() < 0.5))
    arms = {"torchvision_source": (_tv, "source"), "torchvision_q10": (_tv, "q10")}
    for v in views:
        arms[f"fused_{v}"] = (_fused(False), v)
        arms[f"fused_{v}_fast"] = (_fused(True), v)
    best = {a: float("inf") for a in arms}
    for _ in range(passes):
        for arm, (fn, v) in arms.items():
            t = time.perf_counter()
            for data, (box, flip) in zip(views[v], boxes, strict=True):
                fn(data, box, flip)
            best[arm] = min(best[arm], (time.perf_counter() - t) / len(boxes) * 1e3)
    psnr = {}
    for arm, (fn, v) in arms.items():
        if arm.startswith("fused_"):
            vals = [_psnr(fn(d, b, f), _tv(d, b, f)) for d, (b, f) in zip(views[v], boxes, strict=True)]
            psnr[arm] = {"mean": round(float(np.mean(vals)), 2), "min": round(min(vals), 2)}
    ms = {a: round(v, 3) for a, v in best.items()}
    return {"core_ms_per_image": ms, "psnr_db_vs_torchvision_same_file": psnr,
            "images": len(boxes),
            "method": f"one thread, files in memory, best of {passes} passes, arms in turn; "
                      "output uint8 CHW 224x224"}


def run_all(work: Path, out: Path, images: int = 400, quick: bool = False, k: int = 5) -> dict:
    from pcrfs.dataset import open_dataset
    n = 64 if quick else min(images, 400)
    src = ensure_imagenet_like(work, 400 if images >= 400 else images)
    ds = ensure_dataset(src, work / f"fused-{src.name}")
    files = sorted(p for p in src.rglob("*") if p.is_file())[:n]
    rels = [str(p.relative_to(src)) for p in files]
    views = {"source": [p.read_bytes() for p in files]}
    with open_dataset(str(ds)) as d:
        for v in ("q10", f"q{k}"):
            views[v] = [d.read(r, v) for r in rels]
    res = profile(views, passes=2 if quick else 3)
    ms = res["core_ms_per_image"]
    res["targets"] = {
        "fused_q10_over_torchvision_source": {
            "ratio": round(ms["fused_q10"] / ms["torchvision_source"], 3),
            "target": TARGET_Q10_SHARE,
            "met": ms["fused_q10"] / ms["torchvision_source"] <= TARGET_Q10_SHARE},
        f"fused_q{k}_over_torchvision_source": round(ms[f"fused_q{k}"] / ms["torchvision_source"], 3),
        "psnr_min_db": {"value": min(p["min"] for p in res["psnr_db_vs_torchvision_same_file"].values()),
                        "target": TARGET_PSNR_DB}}
    res["psnr_min_db_met"] = res["targets"]["psnr_min_db"]["value"] >= TARGET_PSNR_DB
    res["source"] = str(src)
    res["k"] = k
    write_result(out, "fused", res)
    plot(res, out / "fused.png")
    return res


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    ms = res["core_ms_per_image"]
    names = list(ms)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.barh(names, [ms[a] for a in names],
            color=["tab:gray" if a.startswith("torchvision") else "tab:blue" for a in names])
    ax.axvline(ms["torchvision_source"] * TARGET_Q10_SHARE, color="tab:red", ls="--",
               label="target for fused_q10")
    ax.set_xlabel("core-ms per image (one thread)")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.set_title(f"decode + RandomResizedCrop(224) + flip, {res['images']} images")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(res: dict) -> str:
    lines = [f"fused ({res['images']} images, one thread): core-ms per image, PSNR vs torchvision"]
    for arm, ms in res["core_ms_per_image"].items():
        p = res["psnr_db_vs_torchvision_same_file"].get(arm)
        lines.append(f"  {arm:26} {ms:7.3f} ms" + (f"   PSNR mean {p['mean']} min {p['min']}" if p else ""))
    lines.append(f"  targets: {res['targets']}")
    return "\n".join(lines)
