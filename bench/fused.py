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
  fused_qK_libjpeg_entropy  a progressive view with libjpeg-turbo decoding every scan, the
                       path before pcrfs's own entropy decoder took over (same pixels)
  resize_only          the fused call over each source already decoded to a PPM: the
                       crop's copy, resize, flip and CHW split alone, no JPEG decode

interval_reach_q10: the share of q10's entropy-coded bytes in the restart intervals each
box's rows meet, i.e. what an entropy decoder that skips the others would still decode.

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


def _fused(fast: bool, libjpeg_entropy: bool = False):
    import torch

    from pcrfs.jpeg.crop import decode_resized_crop

    def run(data, box, flip):
        return torch.from_numpy(decode_resized_crop(data, box, 224, flip, chw=True, fast=fast,
                                                    libjpeg_entropy=libjpeg_entropy))
    return run


def _ppm(data: bytes) -> bytes:
    from PIL import Image
    with Image.open(io.BytesIO(data)) as im:
        out = io.BytesIO()
        im.convert("RGB").save(out, "PPM")
    return out.getvalue()


def _psnr(a, b) -> float:
    d = a.numpy().astype(np.float64) - b.numpy().astype(np.float64)
    mse = float((d ** 2).mean())
    return 99.0 if mse == 0 else float(10 * np.log10(255 ** 2 / mse))


def draw_boxes(sources: list[bytes], seed: int = 0) -> list:
    """One RandomResizedCrop box and flip per image, from the source's size, seeded."""
    from pcrfs.jpeg.crop import image_size, random_resized_box
    rng = random.Random(seed)
    boxes = []
    for data in sources:
        w, h = image_size(data)
        boxes.append((random_resized_box(rng, w, h), rng.random() < 0.5))
    return boxes


def _ms_per_item(run, n: int) -> float:
    """Wall ms per item of one call of run() over n items."""
    t = time.perf_counter()
    run()
    return (time.perf_counter() - t) / n * 1e3


def profile(views: dict[str, list[bytes]], boxes: list, passes: int = 3) -> dict:
    """views: "source", "q10" and any "qK", the same images in the same order; boxes: one
    box and flip per image (draw_boxes), every arm over them."""
    views = dict(views, ppm=[_ppm(d) for d in views["source"]])
    arms = {"torchvision_source": (_tv, "source"), "torchvision_q10": (_tv, "q10")}
    for v in views:
        if v == "ppm":
            continue
        arms[f"fused_{v}"] = (_fused(False), v)
        arms[f"fused_{v}_fast"] = (_fused(True), v)
        if v != "source":
            arms[f"fused_{v}_libjpeg_entropy"] = (_fused(False, True), v)
    arms["resize_only"] = (_fused(False), "ppm")
    best = {a: float("inf") for a in arms}
    for _ in range(passes):
        for arm, (fn, v) in arms.items():
            best[arm] = min(best[arm], _ms_per_item(
                lambda fn=fn, v=v: [fn(d, b, f) for d, (b, f) in zip(views[v], boxes, strict=True)],
                len(boxes)))
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


def entropy_profile(views: dict[str, list[bytes]], passes: int = 3) -> dict:
    """Core-ms per image of the entropy step alone in pcrfs's C decoder (pcrfs.jpeg, the
    host half of decode_jpeg: headers and every scan to coefficients), against a whole
    libjpeg-turbo decode (through Pillow: entropy, IDCT, upsampling, colour) of the same
    file, for the sources and q10."""
    from PIL import Image

    from pcrfs import jpeg as cjpeg

    def ours(data):
        cjpeg.entropy_decode(cjpeg.parse(data))

    def libjpeg(data):
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    out = {}
    for v in ("source", "q10"):
        for name, fn in (("pcrfs_entropy", ours), ("libjpeg_whole_decode", libjpeg)):
            best = min(_ms_per_item(lambda fn=fn, v=v: [fn(d) for d in views[v]], len(views[v]))
                       for _ in range(passes))
            out[f"{name}_{v}"] = round(best, 3)
    return out


def interval_reach(blobs: list[bytes], boxes: list) -> dict:
    """How much of a restart-marked progressive file's entropy-coded data a crop needs:
    the bytes of the restart intervals whose MCU rows meet the box's rows (a component
    the upsampler stretches with one of its rows more each side, as the fused path decodes
    them), over all of them.  An entropy decoder that skipped the
    other intervals in every scan could save at most the rest of the Huffman work; no
    interval can be cut by columns, since each spans whole MCU rows."""
    from pcrfs.jpeg import S, parse
    needed = total = 0
    fractions = []
    for data, ((top, _left, h, _w), _flip) in zip(blobs, boxes, strict=True):
        p = parse(data)
        need = have = 0
        for iv in p.intervals:
            sc = p.scans[iv["scan"]]
            per_row = max(1, int(sc[S["mcus_per_row"]]))
            if sc[S["ncomp"]] > 1:         # interleaved: an MCU row is max_v blocks high
                rows_px, v = 8 * p.max_v, min(p.v)
            else:                          # one component: a row of its blocks
                v = p.v[int(sc[S["comp0"]])]
                rows_px = 8 * p.max_v // v
            margin = 0 if v == p.max_v else p.max_v // v   # one row of the component
            r0 = int(iv["first_mcu"]) // per_row
            r1 = (int(iv["first_mcu"]) + int(iv["n_mcus"]) - 1) // per_row
            y0, y1 = r0 * rows_px, (r1 + 1) * rows_px
            n = int(iv["data_len"])
            have += n
            if y1 > top - margin and y0 < top + h + margin:
                need += n
        needed, total = needed + need, total + have
        fractions.append(need / have if have else 1.0)
    return {"needed_bytes_fraction": round(needed / total, 3) if total else 1.0,
            "median_image_fraction": round(float(np.median(fractions)), 3),
            "images": len(fractions),
            "method": "bytes of the restart intervals whose rows meet the box's rows (+- one row of "
                      "a component the upsampler stretches), "
                      "over all intervals' bytes, every scan"}


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
    boxes = draw_boxes(views["source"])
    res = profile(views, boxes, passes=2 if quick else 3)
    res["interval_reach_q10"] = interval_reach(views["q10"], boxes)
    res["entropy_core_ms_per_image"] = entropy_profile(views, passes=2 if quick else 3)
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
    q10 = res["targets"]["fused_q10_over_torchvision_source"]
    # what progressive coding alone adds to the fused path (the same coefficients as the
    # baseline sources), against the whole budget the target allows
    q10["progressive_extra_ms"] = round(ms["fused_q10"] - ms["fused_source"], 3)
    q10["budget_ms"] = round(ms["torchvision_source"] * TARGET_Q10_SHARE, 3)
    # the same arm with libjpeg-turbo decoding every scan of the whole image: what pcrfs's
    # entropy decoder (only the intervals the box meets) saves
    q10["libjpeg_entropy_ratio"] = round(ms["fused_q10_libjpeg_entropy"] / ms["torchvision_source"], 3)
    q10["resize_only_ms"] = ms["resize_only"]
    # the entropy step alone, every scan of the whole image, scaled to the share of bytes
    # in the intervals the boxes meet: about what the fused arm's entropy step costs
    res["entropy_core_ms_per_image"]["pcrfs_entropy_q10_box_share"] = round(
        res["entropy_core_ms_per_image"]["pcrfs_entropy_q10"]
        * res["interval_reach_q10"]["needed_bytes_fraction"], 3)
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
