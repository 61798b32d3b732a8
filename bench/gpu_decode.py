"""Decode only (`pcrfs-bench --only gpu_decode`): JPEG bytes in memory to uint8 pixels on
the device, batch by batch, for ImageNet-size crops and for large photos.

Arms (each over the same images; rounds alternate the arms, the figure is the median):
  pcrfs_q10          decode_jpeg on the q10 files of a default build (a restart marker
                     every 3 MCU rows; GPU entropy decoding)
  pcrfs_q10_rows1    the same, built with --restart-rows 1 (3x the intervals)
  pcrfs_q{k}         decode_jpeg on a lower view (fewer scans; block smoothing)
  pcrfs_q10_plain    decode_jpeg on q10 files built with --restart-rows 0 (entropy
                     decoding on CPU threads in C, the rest on the GPU: the hybrid path)
  pcrfs_source       decode_jpeg on the source (baseline) JPEGs: the hybrid path
  nvjpeg_source      torchvision.io.decode_jpeg on the device over the source JPEGs
  nvjpeg_q10         the same over the q10 files (nvJPEG's own hybrid for progressive)
  pcrfs_l3           pcrfs.torch.l3.decode_batch on the l3 files (Triton)
  cpu_pcrfs_* / cpu_pillow_*   the CPU: decode_jpeg(device="cpu") against Pillow in one
                     thread per core (both release the GIL), over q10 and the sources
Images/s and MP/s per arm at batch 64 and 256; on CUDA the pcrfs arms' first batch is
checked against Pillow (largest difference), and one batch is profiled per kernel and
per scan position.  Without CUDA only the CPU arms run, and the GPU arms say why.
Also the restart intervals' cost in stored bytes (--restart-rows 0, 1, 2, 3, 4, 8), and
the host's share of a GPU batch of 256 (`host_share`, measured on any machine): the work
that runs under the GIL while the device decodes (headers, interval descriptors) and the
number of device operations the pixel stage issues.  The JSON is rewritten after each
set and batch size, so a run cut short keeps what it measured.
-> bench/results/gpu_decode.{json,png}"""
from __future__ import annotations

import io
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import REPO, ensure_dataset, ensure_imagenet_like, pyplot, write_result

TARGET_Q10_OVER_NVJPEG = 2.0
TARGET_HYBRID_OVER_NVJPEG_SAME = 1.0


def restart_cost(work: Path, src: Path, rows=(0, 1, 2, 3, 4, 8)) -> dict:
    """Stored bytes of one source built at each --restart-rows, against 0."""
    from bench.common import du
    sizes = {}
    for r in rows:
        ds = ensure_dataset(src, work / f"restart-cost-{src.name}-{r}", "--restart-rows", str(r),
                            "--views", "none")
        sizes[r] = du(ds / "records")
    return {"records_bytes": {str(r): s for r, s in sizes.items()},
            "cost_over_none": {str(r): round(s / sizes[0] - 1, 5) for r, s in sizes.items() if r},
            "target": 0.02, "source": str(src)}


def _views(ds: Path, rels: list[str], view: str) -> list[bytes]:
    from pcrfs.dataset import open_dataset
    with open_dataset(str(ds)) as d:
        return [d.read(r, view) for r in rels]


def _large(n: int, min_mp: float = 1.5) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Corpus photos of at least min_mp megapixels: sources, restart-marked and plain q10."""
    from pcrfs import native
    srcs, q10, plain = [], [], []
    for f in sorted((REPO / ".cache" / "corpus").glob("*.jpg")):
        data = f.read_bytes()
        try:
            t = native.transcode(data, restart_rows=3)
        except native.NativeError:
            continue
        if t.width * t.height < min_mp * 1e6 or t.components != 3:
            continue
        srcs.append(data)
        q10.append(t.data[: native.split_scans(t.data)[-1]] + native.EOI)
        p = native.transcode(data).data
        plain.append(p[: native.split_scans(p)[-1]] + native.EOI)
        if len(srcs) == n:
            break
    return srcs, q10, plain


def _pixels(blobs) -> int:
    from PIL import Image
    total = 0
    for b in blobs:
        with Image.open(io.BytesIO(b)) as im:
            total += im.width * im.height
    return total


def _arm_fn(arm: str, device: str):
    import torch
    if arm.startswith("nvjpeg"):
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as tv_decode

        def run(blobs):
            data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
            return tv_decode(data, mode=ImageReadMode.RGB, device=device)
        return run
    if arm == "pcrfs_l3":
        from pcrfs.torch.l3 import decode_batch
        return lambda blobs: decode_batch(blobs, device)
    if arm.startswith("cpu_pillow"):
        from PIL import Image
        pool = ThreadPoolExecutor(os.cpu_count() or 1)

        def one(b):
            with Image.open(io.BytesIO(b)) as im:
                im.load()
                return im
        return lambda blobs: list(pool.map(one, blobs))
    from pcrfs.torch.jpeg import decode_jpeg
    dev = "cpu" if arm.startswith("cpu_") else device
    return lambda blobs: decode_jpeg(blobs, dev, mode="rgb")


def _time(fn, blobs, batch: int, cuda: bool) -> float:
    import torch
    t0 = time.perf_counter()
    for i in range(0, len(blobs), batch):
        fn(blobs[i: i + batch])
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _check(blobs, device) -> int:
    """Largest difference from Pillow over a batch decoded by decode_jpeg on device."""
    import numpy as np
    from PIL import Image

    from pcrfs.torch.jpeg import decode_jpeg
    worst = 0
    for b, o in zip(blobs, decode_jpeg(blobs, device, mode="rgb"), strict=True):
        want = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
        got = o.permute(1, 2, 0).cpu().numpy()
        worst = max(worst, 255 if got.shape != want.shape else int(np.abs(got.astype(int) - want).max()))
    return worst


def host_share(blobs) -> dict:
    """One batch: ms of the host work a GPU batch does under the GIL (C header parsing in
    one thread, here; the interval descriptors; the pixel stage's own array builds), and
    the device operations (kernels) the entropy and pixel stages issue.  Runs the pixel
    stage on CPU tensors and counts operations (views excluded), the bytes they write, and
    its time on this CPU."""
    import numpy as np
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from pcrfs import jpeg as cjpeg
    from pcrfs.torch import jpeg as tj
    from pcrfs.torch import jpeg_triton

    # allocations and reshapes that move no bytes
    untouched = {torch.ops.aten.empty.memory_format, torch.ops.aten._unsafe_view.default}

    class Count(TorchDispatchMode):
        ops = written = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func not in untouched:
                Count.ops += 1
                Count.written += sum(t.nbytes for t in torch.utils._pytree.tree_leaves(out)
                                     if isinstance(t, torch.Tensor))
            return out

    def best(fn, n=5):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return round(1e3 * min(ts), 2)
    ps = [cjpeg.parse(b) for b in blobs]
    coefs, firsts, _ = tj._coefficients(ps, torch.device("cpu"), "c")
    groups: dict = {}
    for j, p in enumerate(ps):
        groups.setdefault(tj._group_key(p), []).append(j)
    chunks = [c for m in groups.values() for c in tj.canvases(m, ps)]
    with Count():
        for c in chunks:
            tj._pixels(c, ps, coefs, firsts, "rgb")
    return {"images": len(blobs), "parse_ms_one_thread": best(lambda: [cjpeg.parse(b) for b in blobs]),
            "descriptors_ms": best(lambda: jpeg_triton.descriptors(ps, firsts)),
            "descriptor_kb": round(sum(a.nbytes for a in jpeg_triton.descriptors(ps, firsts)[2:4]) / 1024),
            "entropy_launches": int(len(np.unique(np.concatenate([p.intervals["scan"] for p in ps])))),
            "canvases": len(chunks), "pixel_ops": Count.ops,
            # what the pixel stage's operations write: its device memory traffic's measure
            "pixel_mb_written": round(Count.written / 2**20, 1),
            "pixel_ms_cpu": best(lambda: [tj._pixels(c, ps, coefs, firsts, "rgb") for c in chunks], 3),
            "intervals": int(sum(len(p.intervals) for p in ps))}


def _profile(blobs, device) -> dict:
    """One batch, each stage synchronised: ms in parse, entropy (per launch, i.e. scan
    position, on the GPU) and pixels; on CUDA, the batch's peak device memory beside what
    it returns (its work space)."""
    import torch

    from pcrfs.torch.jpeg import decode_jpeg
    decode_jpeg(blobs, device)   # compile, warm
    prof = {"images": len(blobs)}
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    outs = decode_jpeg(blobs, device, profile=prof)
    if cuda:
        kept = sum({o.untyped_storage().data_ptr(): o.untyped_storage().nbytes()
                    for o in outs if o is not None}.values())      # the canvases the images view
        prof["workspace_mb"] = round((torch.cuda.max_memory_allocated() - base - kept) / 2**20, 1)
        # where the host waits for the device within a batch (one is meant: the entropy
        # kernels' damage flags); torch warns at each such operation in this mode
        import warnings
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                decode_jpeg(blobs, device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        prof["host_waits"] = [f"{Path(w.filename).name}:{w.lineno}: {str(w.message)[:100]}"
                              for w in caught if "synchroniz" in str(w.message)]
    return prof


def run_all(work: Path, out: Path, images: int = 512, quick: bool = False, k: int = 5,
            rounds: int = 3, device: str | None = None, large: int | None = None) -> dict:
    """device: None runs the GPU arms on CUDA where there is one (else only the CPU arms);
    "cpu" runs them on the CPU, a slow rehearsal of the GPU run's code (the tests use it)."""
    import torch
    gpu_arms_on = device is not None or torch.cuda.is_available()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    images = 128 if quick else images
    src = ensure_imagenet_like(work, images)
    marked = ensure_dataset(src, work / f"gpu-decode-{images}-default")   # --restart-rows 3
    dense = ensure_dataset(src, work / f"gpu-decode-{images}-r1", "--restart-rows", "1")
    plain = ensure_dataset(src, work / f"gpu-decode-{images}-r0", "--restart-rows", "0")
    rels = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.JPEG"))
    crops = {"source": [(src / r).read_bytes() for r in rels],
             "q10": _views(marked, rels, "q10"), f"q{k}": _views(marked, rels, f"q{k}"),
             "q10_plain": _views(plain, rels, "q10"), "q10_rows1": _views(dense, rels, "q10")}
    # the l3 files as the mount's l3 view makes them (from the full-fidelity JPEG)
    from pcrfs.views.l3 import l3_bytes
    crops["l3"] = [l3_bytes(b) for b in crops["q10"]]
    big_src, big_q10, big_plain = _large(large if large is not None else 8 if quick else 24)
    sets = {"crops": crops, "large": {"source": big_src, "q10": big_q10, "q10_plain": big_plain}}
    gpu_arms = {"pcrfs_q10": "q10", "pcrfs_q10_rows1": "q10_rows1", f"pcrfs_q{k}": f"q{k}",
                "pcrfs_q10_plain": "q10_plain",
                "pcrfs_source": "source", "nvjpeg_source": "source", "nvjpeg_q10": "q10",
                "pcrfs_l3": "l3"}
    cpu_arms = {"cpu_pcrfs_q10": "q10", "cpu_pillow_q10": "q10", "cpu_pcrfs_source": "source",
                "cpu_pillow_source": "source"}
    arms = (gpu_arms if gpu_arms_on else {}) | cpu_arms
    rows, checks, profiles = [], {}, {}
    for set_name, blobs_by in sets.items():
        for batch in (64, 256):
            todo = {a: v for a, v in arms.items() if blobs_by.get(v)}
            if quick or set_name == "large":
                todo = {a: v for a, v in todo.items() if not a.startswith("cpu_") or batch == 64}
            if not todo:
                continue
            times: dict = {a: [] for a in todo}
            fns = {a: _arm_fn(a, device) for a in todo}
            for a, v in todo.items():    # warm-up: compile, CUDA context, thread pools
                fns[a](blobs_by[v][: min(batch, 8)])
            for r in range(rounds):
                order = list(todo)[r % len(todo):] + list(todo)[: r % len(todo)]
                for a in order:
                    times[a].append(_time(fns[a], blobs_by[todo[a]], batch, cuda))
            for a, v in todo.items():
                n, px = len(blobs_by[v]), _pixels(blobs_by[v])
                t = statistics.median(times[a])
                rows.append({"set": set_name, "arm": a, "batch": batch, "images": n,
                             "device": "cpu" if a.startswith("cpu_") else device,
                             "images_per_s": round(n / t, 1), "mp_per_s": round(px / t / 1e6, 2),
                             "rounds_s": [round(x, 3) for x in times[a]]})
            write_result(out, "gpu_decode.partial", {"rows": rows, "checks": checks})
            print(f"  {set_name} batch {batch}: " + ", ".join(
                f"{r['arm']} {r['images_per_s']}" for r in rows if r["set"] == set_name
                and r["batch"] == batch), flush=True)
        if gpu_arms_on:
            for v in ("q10", "q10_plain", "source", f"q{k}"):
                if blobs_by.get(v):
                    checks[f"{set_name}/{v}"] = _check(blobs_by[v][:64], device)
            profiles[set_name] = _profile(blobs_by["q10"][:256], device)
    if not gpu_arms_on:
        profiles["crops_cpu"] = _profile(crops["q10"][:64], "cpu")

    def rate(set_name, arm, batch=256):
        for r in rows:
            if (r["set"], r["arm"], r["batch"]) == (set_name, arm, batch):
                return r["images_per_s"]
        return None
    ratios = {}
    for s in sets:
        for b in (64, 256):
            q, nv, hy, nvq = (rate(s, "pcrfs_q10", b), rate(s, "nvjpeg_source", b),
                              rate(s, "pcrfs_q10_plain", b), rate(s, "nvjpeg_q10", b))
            if q and nv:
                ratios[f"{s}_b{b}_pcrfs_q10_over_nvjpeg_source"] = round(q / nv, 3)
            if hy and nvq:
                ratios[f"{s}_b{b}_hybrid_q10_over_nvjpeg_q10"] = round(hy / nvq, 3)
        cp, pp = rate(s, "cpu_pcrfs_q10", 64), rate(s, "cpu_pillow_q10", 64)
        if cp and pp:
            ratios[f"{s}_cpu_pcrfs_q10_over_pillow"] = round(cp / pp, 3)
    res = {"device": torch.cuda.get_device_name(0) if cuda else
           "cpu (a rehearsal of the GPU arms)" if gpu_arms_on else "cpu (no CUDA on this host)",
           "host_cores": os.cpu_count(), "images": images, "k": k, "rows": rows,
           "ratios": ratios, "pillow_max_difference": checks, "profile": profiles,
           "targets": {"crops_b256_pcrfs_q10_over_nvjpeg_source": TARGET_Q10_OVER_NVJPEG,
                       "crops_b256_hybrid_q10_over_nvjpeg_q10": TARGET_HYBRID_OVER_NVJPEG_SAME},
           "gpu_arms": "measured" if cuda else "rehearsed on the CPU" if gpu_arms_on
           else "not run: no CUDA on this host",
           "restart_cost": restart_cost(work, src),
           "host_share": {v: host_share(crops[v][:256]) for v in ("q10", f"q{k}")}}
    write_result(out, "gpu_decode", res)
    (out / "gpu_decode.partial.json").unlink(missing_ok=True)
    plot(res, out / "gpu_decode.png")
    return res


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    rows = [r for r in res["rows"] if r["batch"] == 64]
    labels = [f"{r['set']}\n{r['arm']}" for r in rows]
    ax.barh(range(len(rows)), [r["images_per_s"] for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=6)
    ax.set_xlabel("images/s (batch 64)")
    ax.set_title(f"decode only, {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(res: dict) -> str:
    lines = [f"gpu_decode on {res['device']} ({res['host_cores']} cores): ratios {res['ratios']}",
             f"  restart intervals cost {res['restart_cost']['cost_over_none']} of the stored bytes "
             f"(target <= {res['restart_cost']['target']})",
             f"  host share of a batch: {res['host_share']}"]
    if res["pillow_max_difference"]:
        lines.append(f"  largest difference from Pillow: {res['pillow_max_difference']}")
    return "\n".join(lines)
