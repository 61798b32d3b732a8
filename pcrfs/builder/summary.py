"""The paper's Table 1 for a dataset: bytes per image at each fidelity and what they buy;
and what `pcrfs build` prints when it is done."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from pcrfs.format import BUILD_REPORT

if TYPE_CHECKING:
    from pcrfs.builder.plan import BuildResult


def size_summary(sizes: np.ndarray, source_bytes: float | None = None) -> dict:
    """sizes: (images, G) bytes of each image at q1..qG (EOI included)."""
    n, groups = sizes.shape if sizes.size else (0, 0)
    rows = []
    full = float(sizes[:, -1].mean()) if n else 0.0
    for k in range(groups):
        col = sizes[:, k].astype(np.float64)
        mean = float(col.mean())
        rows.append({
            "view": f"q{k + 1}",
            "mean_bytes": round(mean, 1),
            "p50_bytes": float(np.percentile(col, 50)),
            "p95_bytes": float(np.percentile(col, 95)),
            "full_over_k": round(full / mean, 3) if mean else None,
            # Theorem 4.1: I/O-bound speedup of qk over full is bounded by the size ratio.
            "max_io_speedup": round(full / mean, 3) if mean else None,
        })
    out = {"images": int(n), "groups": int(groups), "views": rows,
           "total_bytes": {f"q{k + 1}": int(sizes[:, k].sum()) for k in range(groups)}}
    if source_bytes is not None:
        out["source_mean_bytes"] = round(source_bytes, 1)
    return out


def format_summary(s: dict) -> str:
    lines = [f"{'view':>5} {'mean B':>10} {'p50 B':>10} {'p95 B':>10} {'full/k':>8} "
             f"{'max I/O speedup':>16}"]
    for r in s["views"]:
        lines.append(f"{r['view']:>5} {r['mean_bytes']:>10.0f} {r['p50_bytes']:>10.0f} "
                     f"{r['p95_bytes']:>10.0f} {r['full_over_k']:>7.2f}x "
                     f"{r['max_io_speedup']:>15.2f}x")
    if s.get("source_mean_bytes"):
        lines.append(f"source files: mean {s['source_mean_bytes']:.0f} B")
    return "\n".join(lines)


def format_result(res: BuildResult) -> str:
    if res.part is not None:
        i, n = res.part
        first, stop = res.part_records
        return (f"part {i}/{n} of {res.dst}: records {first}..{stop - 1} ({res.images} images) "
                f"written in {res.seconds:.1f} s; when every part is done, run "
                f"`pcrfs build --finalize {res.dst}`"
                + (f"\n{_requests_line(res.requests, res.images)}" if res.requests else ""))
    lines = [f"built {res.dst}: {res.images} images in {res.records} records, "
             f"{res.groups} scan groups, {res.seconds:.1f} s "
             f"({res.images / max(res.seconds, 1e-9):.0f} images/s)",
             f"converted from other formats: {res.converted}; skipped: {len(res.skipped)}"
             f" (see {os.path.join(res.dst, BUILD_REPORT)})",
             f"index: {res.index_bytes_per_image:.0f} bytes per image", "",
             format_summary(res.summary)]
    for s in res.skipped[:20]:
        lines.insert(2, f"  skipped {s['path']}: {s['reason']}")
    if res.requests:
        lines.insert(3, _requests_line(res.requests, res.images))
    return "\n".join(lines)


def _requests_line(requests: dict, images: int) -> str:
    per = ", ".join(f"{n} {m} ({n / max(images, 1):.2f}/image)"
                    for m, n in sorted(requests.items()))
    return f"object-storage requests: {per}"
