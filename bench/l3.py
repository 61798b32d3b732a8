"""L3 benchmarks: compression against PNG and lossless WebP (the paper's Table 4), single-
thread decode throughput (C L3, torch L3 on CPU, Pillow PNG, Pillow baseline JPEG), and
the /l3/ view over the mount in a first and a second epoch (the transcode cache)."""
from __future__ import annotations

import io
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

import pcrfs.l3 as l3
from bench.common import REPO, Mounted, best_seconds, ensure_dataset, ensure_imagenet_like, pyplot

PAPER_TABLE4 = {  # compressed / raw, from Bae et al. (ECCV 2022), Table 4
    "Cityscapes": {"png": 0.39, "webp": 0.29, "l3": 0.44},
    "KITTI": {"png": 0.62, "webp": 0.55, "l3": 0.64},
    "DIV2K": {"png": 0.67, "webp": 0.49, "l3": 0.76},
    "FFHQ": {"png": 0.25, "webp": 0.15, "l3": 0.33},
    "RAISE-1K": {"png": 0.57, "webp": 0.37, "l3": 0.63},
}


def dev_corpus_crops(limit: int) -> list[np.ndarray]:
    """768x512 centre crops of the dev-corpus wallpapers (JPEG and PNG)."""
    files = sorted(p for p in (REPO / ".cache" / "corpus").iterdir() if p.suffix in (".jpg", ".png"))
    out = []
    for f in files[:limit]:
        with Image.open(f) as im:
            im = im.convert("RGB")
            if im.width < 768 or im.height < 512:
                im = im.resize((max(768, im.width), max(512, im.height)))
            x, y = (im.width - 768) // 2, (im.height - 512) // 2
            out.append(np.asarray(im.crop((x, y, x + 768, y + 512))))
    return out


def imagenet_like(work: Path, limit: int) -> list[np.ndarray]:
    src = ensure_imagenet_like(work, 2000)
    files = sorted(src.rglob("*.JPEG"))[:: max(1, 2000 // limit)][:limit]
    return [np.asarray(Image.open(f).convert("RGB")) for f in files]


def _encode(img: np.ndarray, fmt: str) -> bytes:
    if fmt == "l3":
        return l3.encode(img)
    b = io.BytesIO()
    im = Image.fromarray(img)
    if fmt == "png":
        im.save(b, "PNG")
    elif fmt == "webp":
        im.save(b, "WEBP", lossless=True)
    else:
        im.save(b, "JPEG", quality=95)
    return b.getvalue()


def _decode_rate(blobs: list[bytes], pixels: int, fn, repeat: int) -> float:
    return pixels / best_seconds(lambda: [fn(b) for b in blobs], repeat) / 1e6


def _pil_decode(b: bytes):
    with Image.open(io.BytesIO(b)) as im:
        im.load()


def bench_corpus(name: str, imgs: list[np.ndarray]) -> dict:
    import torch

    from pcrfs.torch.l3 import decode_batch
    raw = sum(i.nbytes for i in imgs)
    px = sum(i.shape[0] * i.shape[1] for i in imgs)
    enc = {f: [_encode(i, f) for i in imgs] for f in ("l3", "png", "webp", "jpeg")}
    ratio = {f: round(sum(map(len, enc[f])) / raw, 4) for f in ("l3", "png", "webp")}
    torch.set_num_threads(1)
    rates = {
        "l3_c": _decode_rate(enc["l3"], px, l3.decode, 3),
        "png_pillow": _decode_rate(enc["png"], px, _pil_decode, 3),
        "jpeg_baseline_pillow": _decode_rate(enc["jpeg"], px, _pil_decode, 3),
        "webp_lossless_pillow": _decode_rate(enc["webp"], px, _pil_decode, 1),
    }
    sub = enc["l3"][:8]
    sub_px = sum(i.shape[0] * i.shape[1] for i in imgs[:8])
    rates["l3_torch_cpu"] = _decode_rate([sub], sub_px, lambda b: decode_batch(b, "cpu"), 1)
    torch.set_num_threads(torch.get_num_threads())
    return {
        "images": len(imgs), "megapixels": round(px / 1e6, 2),
        "size_over_raw": ratio,
        "l3_over_png": round(ratio["l3"] / ratio["png"], 3),
        "l3_over_webp": round(ratio["l3"] / ratio["webp"], 3),
        "decode_mpix_per_s_single_thread": {k: round(v, 1) for k, v in rates.items()},
        "l3_decode_over_png": round(rates["l3_c"] / rates["png_pillow"], 2),
        "l3_decode_over_jpeg": round(rates["l3_c"] / rates["jpeg_baseline_pillow"], 2),
        "target_l3_decode_over_png": 3.0,
    }


def _read_all(files: list[Path], threads: int = 2) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        n = sum(pool.map(lambda f: len(f.read_bytes()) > 0, files))
    assert n == len(files)
    return len(files) / (time.perf_counter() - t0)


def bench_view(work: Path) -> dict:
    """First epoch transcodes, the second (after a remount, so no page cache) hits the
    on-disk transcode cache; the top q view is read the same way for reference."""
    src = ensure_imagenet_like(work, 2000)
    ds = ensure_dataset(src, work / "ds-2000")
    cache = work / "l3-cache"
    shutil.rmtree(cache, ignore_errors=True)
    mnt = work / "mnt-l3"
    out = {}
    for epoch in (1, 2):
        with Mounted(ds, mnt, "--cache-dir", cache) as m:
            files = sorted((mnt / "l3").rglob("*.l3"))
            rate = _read_all(files)
            st = m.stats()
        out[f"epoch{epoch}_files_per_s"] = round(rate, 1)
        out[f"epoch{epoch}_transcodes"] = st["transcodes"]
        out[f"epoch{epoch}_cache_hits"] = st["transcode_cache_hits"]
    with Mounted(ds, mnt, "--cache-dir", "none") as m:
        top = sorted(p for p in mnt.iterdir() if p.name.startswith("q"))[-1]
        out["top_q_view"] = top.name
        out["top_q_files_per_s"] = round(_read_all(sorted(top.rglob("*.JPEG"))), 1)
    out["files"] = len(files)
    out["epoch2_over_epoch1"] = round(out["epoch2_files_per_s"] / out["epoch1_files_per_s"], 2)
    return out


def run_all(work: Path, out_dir: Path, quick: bool) -> dict:
    from bench.common import write_result
    res = {
        "corpora": {
            "dev_corpus_768x512": bench_corpus("dev", dev_corpus_crops(30 if quick else 102)),
            "imagenet_like_500x375": bench_corpus("imagenet", imagenet_like(work, 60 if quick else 200)),
        },
        "paper_table4": PAPER_TABLE4,
        "view": bench_view(work),
    }
    write_result(out_dir, "l3", res)
    plot(res, out_dir / "l3.png")
    return res


def plot(res: dict, out: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(res["corpora"])
    fmts = ["png", "webp", "l3"]
    x = np.arange(len(names))
    for i, f in enumerate(fmts):
        a.bar(x + i * 0.25, [res["corpora"][n]["size_over_raw"][f] for n in names], 0.25, label=f)
    a.set_xticks(x + 0.25, names)
    a.set_ylabel("compressed / raw (lower is better)")
    a.legend()
    a.set_title("lossless size")
    dec = ["l3_c", "l3_torch_cpu", "png_pillow", "jpeg_baseline_pillow", "webp_lossless_pillow"]
    for i, d in enumerate(dec):
        b.bar(x + i * 0.16, [res["corpora"][n]["decode_mpix_per_s_single_thread"][d] for n in names],
              0.16, label=d)
    b.set_xticks(x + 0.32, names)
    b.set_ylabel("Mpixel/s, one thread")
    b.legend(fontsize=7)
    b.set_title("decode throughput")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def summary(res: dict) -> str:
    lines = []
    for n, r in res["corpora"].items():
        d = r["decode_mpix_per_s_single_thread"]
        lines.append(f"l3 {n}: size/raw L3 {r['size_over_raw']['l3']} PNG {r['size_over_raw']['png']} "
                     f"WebP {r['size_over_raw']['webp']} (L3/PNG {r['l3_over_png']}x); decode MP/s "
                     f"L3 {d['l3_c']} torch-cpu {d['l3_torch_cpu']} PNG {d['png_pillow']} JPEG "
                     f"{d['jpeg_baseline_pillow']}: L3/PNG {r['l3_decode_over_png']}x (target >= 3)")
    v = res["view"]
    lines.append(f"/l3/ over the mount: epoch 1 {v['epoch1_files_per_s']} files/s "
                 f"({v['epoch1_transcodes']} transcodes), epoch 2 {v['epoch2_files_per_s']} files/s "
                 f"({v['epoch2_cache_hits']} cache hits) = {v['epoch2_over_epoch1']}x; "
                 f"{v['top_q_view']} {v['top_q_files_per_s']} files/s")
    return "\n".join(lines)

