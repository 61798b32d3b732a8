"""How good is each fidelity?  MS-SSIM of qk against the full image, per view.

MS-SSIM follows Wang, Simoncelli & Bovik (2003): an 11-tap Gaussian window (sigma 1.5),
K1 = 0.01, K2 = 0.03, dynamic range 255, five scales with the weights below, contrast-
structure terms at scales 1..4 and the full SSIM at scale 5, each scale halved by a 2x2
mean.  Windows are 'valid' (no padding).  Images too small for five 11-pixel scales use
as many scales as fit, with the weights renormalised; that choice is recorded in the
report.  The paper's finding (groups with MS-SSIM >= 0.95 train about as well as full
fidelity) is what the recommendation uses."""
from __future__ import annotations

import io
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image

from pcrfs.format import QUALITY

WEIGHTS = np.array([0.0448, 0.2856, 0.3001, 0.2363, 0.1333])
WIN = 11
SIGMA = 1.5
K1, K2, L = 0.01, 0.03, 255.0
C1, C2 = (K1 * L) ** 2, (K2 * L) ** 2
QUALITY_FILE = QUALITY
METHOD = "ms-ssim/wang2003/luma/win11/sigma1.5/valid/5-scale"


def _gauss() -> np.ndarray:
    x = np.arange(WIN, dtype=np.float64) - WIN // 2
    g = np.exp(-(x**2) / (2 * SIGMA**2))
    return g / g.sum()


_G = _gauss().astype(np.float32)
STRIPE = 512   # output rows per pass: bounds memory on 50-megapixel images


def _filter(maps: np.ndarray) -> np.ndarray:
    """Separable valid Gaussian filter over the last two axes (float32, like most
    implementations; the sums below are float64)."""
    rows = sliding_window_view(maps, WIN, axis=-1) @ _G
    return sliding_window_view(rows, WIN, axis=-2) @ _G


def _ssim_cs(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean SSIM, mean contrast-structure) of two equal-shape float images."""
    if min(x.shape) < WIN:  # smaller than one window: a single global window
        x, y = x.astype(np.float64), y.astype(np.float64)
        mx, my = x.mean(), y.mean()
        vx, vy, cxy = x.var(), y.var(), ((x - mx) * (y - my)).mean()
        cs = (2 * cxy + C2) / (vx + vy + C2)
        return float((2 * mx * my + C1) / (mx**2 + my**2 + C1) * cs), float(cs)
    h = x.shape[0]
    ssim_sum = cs_sum = 0.0
    count = 0
    for top in range(0, h - WIN + 1, STRIPE):
        xs, ys = x[top : top + STRIPE + WIN - 1], y[top : top + STRIPE + WIN - 1]
        mu_x, mu_y, xx, yy, xy = _filter(np.stack([xs, ys, xs * xs, ys * ys, xs * ys]))
        mx2, my2, mxy = mu_x * mu_x, mu_y * mu_y, mu_x * mu_y
        cs_map = (2 * (xy - mxy) + C2) / ((xx - mx2) + (yy - my2) + C2)
        ssim_map = (2 * mxy + C1) / (mx2 + my2 + C1) * cs_map
        ssim_sum += float(ssim_map.sum(dtype=np.float64))
        cs_sum += float(cs_map.sum(dtype=np.float64))
        count += cs_map.size
    return ssim_sum / count, cs_sum / count


def scales_for(shape: tuple[int, int]) -> int:
    s, side = 1, min(shape)
    while s < len(WEIGHTS) and side // 2 >= WIN:
        side //= 2
        s += 1
    return s


def _halve(a: np.ndarray) -> np.ndarray:
    h, w = a.shape[0] // 2 * 2, a.shape[1] // 2 * 2
    a = a[:h, :w]
    return 0.25 * (a[0::2, 0::2] + a[1::2, 0::2] + a[0::2, 1::2] + a[1::2, 1::2])


def ms_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """MS-SSIM of two 2-D luminance arrays with values in 0..255."""
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"ms_ssim needs two equal 2-D arrays, got {a.shape} and {b.shape}")
    x, y = a.astype(np.float32), b.astype(np.float32)
    m = scales_for(x.shape)
    w = WEIGHTS[:m] / WEIGHTS[:m].sum()
    result = 1.0
    for s in range(m):
        ssim, cs = _ssim_cs(x, y)
        # a negative term has no real fractional power; like most implementations, clamp.
        # A term is at most 1 (Cauchy-Schwarz), but float32 sums can land a few ulps above
        term = ssim if s == m - 1 else cs
        result *= min(max(term, 0.0), 1.0) ** w[s]
        if s < m - 1:
            x, y = _halve(x), _halve(y)
    return float(result)


def luminance(jpeg: bytes) -> np.ndarray:
    """Luma of an encoded image: the JPEG's own Y plane (libjpeg decodes straight to
    grayscale, skipping chroma), ITU-R 601 conversion for anything else."""
    with Image.open(io.BytesIO(jpeg)) as im:
        if im.format == "JPEG":
            im.draft("L", im.size)
        return np.asarray(im.convert("L"), dtype=np.uint8)


def sample_paths(ds, n: int, seed: int = 0) -> list[bytes]:
    """A deterministic sample: the same dataset, n and seed always give the same images."""
    paths = sorted(p for p, _ in ds.index.iter_images())
    if n >= len(paths):
        return paths
    pick = np.random.default_rng(seed).choice(len(paths), size=n, replace=False)
    return [paths[i] for i in sorted(pick)]


def _image_scores(ds, path: bytes) -> list[float]:
    """MS-SSIM of q1..qG of one image against qG (qG scores 1.0 by definition)."""
    full = luminance(ds.read(path, f"q{ds.groups}"))
    out = []
    for k in range(1, ds.groups):
        img = luminance(ds.read(path, f"q{k}"))
        out.append(ms_ssim(img, full))
    return [*out, 1.0]


def recommend(views: list[dict], threshold: float) -> str:
    """The lowest view whose mean MS-SSIM reaches the threshold (qG always does)."""
    for v in views:
        if v["ms_ssim_mean"] >= threshold:
            return v["view"]
    return views[-1]["view"]


def compute_quality(ds, sample: int = 500, seed: int = 0, workers: int | None = None,
                    progress: bool = False) -> dict:
    """Per-view mean and p5 MS-SSIM on a deterministic sample, with the size table."""
    t0 = time.perf_counter()
    paths = sample_paths(ds, sample, seed)
    workers = workers or os.cpu_count() or 1
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(paths), unit="img", desc="ms-ssim", leave=False)
    scores = []
    with ThreadPoolExecutor(workers) as pool:   # decoding and numpy release the GIL
        for s in pool.map(lambda p: _image_scores(ds, p), paths):
            scores.append(s)
            if bar:
                bar.update()
    if bar:
        bar.close()
    arr = np.array(scores, dtype=np.float64).reshape(len(paths), ds.groups)
    sizes = {r["view"]: r for r in ds.manifest["summary"]["views"]}
    views = []
    for k in range(1, ds.groups + 1):
        col = arr[:, k - 1]
        row = sizes.get(f"q{k}", {})
        views.append({
            "view": f"q{k}",
            "ms_ssim_mean": round(float(col.mean()), 5) if len(col) else None,
            "ms_ssim_p5": round(float(np.percentile(col, 5)), 5) if len(col) else None,
            "mean_bytes": row.get("mean_bytes"),
            "full_over_k": row.get("full_over_k"),
        })
    return {
        "uuid": ds.manifest["uuid"],
        "method": METHOD,
        "sample": len(paths),
        "requested_sample": sample,
        "seed": seed,
        "seconds": round(time.perf_counter() - t0, 2),
        "views": views,
    }


def quality_path(root: str) -> str:
    return os.path.join(root, QUALITY_FILE)


def load_quality(root: str, uuid: str, sample: int, seed: int = 0) -> dict | None:
    """The stored report for this dataset and sample, or None."""
    import json

    from pcrfs.errors import DatasetError
    from pcrfs.format.manifest import check_self_sum
    try:
        with open(quality_path(root)) as f:
            q = json.load(f)
        check_self_sum(q, quality_path(root))
    except (OSError, ValueError, DatasetError):
        return None    # unreadable or damaged: measured again
    if (q.get("uuid") != uuid or q.get("method") != METHOD or q.get("requested_sample") != sample
            or q.get("seed") != seed):
        return None
    return q


def store_quality(root: str, report: dict) -> None:
    from pcrfs.format.manifest import write_json_atomic
    write_json_atomic(quality_path(root), report, self_sum=True)


def format_quality(q: dict, threshold: float) -> str:
    rec = recommend(q["views"], threshold)
    lines = [f"MS-SSIM against full fidelity (luma, {q['sample']} images, seed {q['seed']})",
             f"{'view':>5} {'mean':>8} {'p5':>8} {'mean B':>10} {'full/k':>8}"]
    for v in q["views"]:
        mark = "  <- recommended" if v["view"] == rec else ""
        fk = f"{v['full_over_k']:>7.2f}x" if v.get("full_over_k") else f"{'-':>8}"
        mb = f"{v['mean_bytes']:>10.0f}" if v.get("mean_bytes") is not None else f"{'-':>10}"
        lines.append(f"{v['view']:>5} {v['ms_ssim_mean']:>8.4f} {v['ms_ssim_p5']:>8.4f} "
                     f"{mb} {fk}{mark}")
    lines.append(f"recommended: {rec} (lowest view with mean MS-SSIM >= {threshold})")
    return "\n".join(lines)


def plot_quality(q: dict, out: str, threshold: float = 0.95, title: str = "") -> None:
    """PNG: mean bytes and MS-SSIM (mean, p5) against k."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ks = [int(v["view"][1:]) for v in q["views"]]
    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(ks, [v["ms_ssim_mean"] for v in q["views"]], "o-", label="MS-SSIM mean")
    ax1.plot(ks, [v["ms_ssim_p5"] for v in q["views"]], "o--", label="MS-SSIM p5")
    ax1.axhline(threshold, color="gray", lw=0.8, ls=":", label=f"threshold {threshold}")
    ax1.set_xlabel("scan group k")
    ax1.set_ylabel("MS-SSIM vs full")
    ax1.set_xticks(ks)
    ax2 = ax1.twinx()
    ax2.bar(ks, [(v["mean_bytes"] or 0) / 1024 for v in q["views"]], alpha=0.25, color="C2",
            label="mean KiB")
    ax2.set_ylabel("mean KiB per image")
    ax1.set_zorder(ax2.get_zorder() + 1)
    ax1.patch.set_visible(False)
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, loc="lower right", fontsize=8)
    ax1.set_title(title or f"fidelity vs bytes ({q['sample']} images)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
