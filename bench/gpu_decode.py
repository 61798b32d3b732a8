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


RESTART_BYTES = 250      # the --restart-bytes build the bench measures (q10_bytes)


def restart_layouts(sources: list[bytes], rows=(1, 3), nbytes=(200, 250, 300, 400)) -> dict:
    """Each restart layout's cost in bytes over no markers and its longest interval, from
    transcoding the sources as the build does (--restart-rows N, --restart-bytes B)."""
    from pcrfs import jpeg as cjpeg
    from pcrfs import native
    plain = sum(len(native.transcode(b).data) for b in sources)
    out = {}
    for key, kw in [(f"rows{n}", {"restart_rows": n}) for n in rows] + [
            (f"bytes{n}", {"restart_bytes": n}) for n in nbytes]:
        data = [native.transcode(b, **kw).data for b in sources]
        ps = [cjpeg.parse(d) for d in data]
        out[key] = {"cost_over_none": round(sum(map(len, data)) / plain - 1, 4),
                    "longest_interval_bytes": max(int(p.intervals["data_len"].max()) for p in ps),
                    "intervals_per_image": round(sum(len(p.intervals) for p in ps) / len(ps), 1)}
    return out


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
    if arm.endswith("_crops"):     # GPUImageFolder's decode: only each box's window
        from pcrfs.torch.jpeg import decode_jpeg_canvases
        return lambda blobs: decode_jpeg_canvases(blobs, device, mode="rgb", boxes=crop_boxes())
    from pcrfs.torch.jpeg import decode_jpeg
    dev = "cpu" if arm.startswith("cpu_") else device
    return lambda blobs: decode_jpeg(blobs, dev, mode="rgb")


def crop_boxes(seed: int = 0):
    """decode_jpeg_canvases' boxes: RandomResizedCrop's defaults, drawn from one seed."""
    import random

    from pcrfs.jpeg.crop import random_resized_box
    rng = random.Random(seed)
    return lambda sizes: [None if hw is None else
                          random_resized_box(rng, hw[1], hw[0], (0.08, 1.0), (3 / 4, 4 / 3)) for hw in sizes]


def _time(fn, blobs, batch: int, cuda: bool) -> float:
    import torch
    t0 = time.perf_counter()
    for i in range(0, len(blobs), batch):
        fn(blobs[i: i + batch])
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _check_crops(blobs, device) -> int:
    """Largest difference from Pillow inside each RandomResizedCrop box, the batch decoded
    by decode_jpeg_canvases with those boxes (only their windows) on device."""
    import numpy as np
    from PIL import Image

    from pcrfs.torch.jpeg import decode_jpeg_canvases
    drawn: list = []
    draw = crop_boxes()

    def boxes(sizes):
        drawn[:] = draw(sizes)
        return drawn
    worst = 0
    for idx, canvas, _, origins in decode_jpeg_canvases(blobs, device, mode="rgb", boxes=boxes):
        host = canvas.cpu()
        for k, i in enumerate(idx):
            top, left, h, w = drawn[i]
            y0, x0 = origins[k]
            got = host[k, :, top - y0: top - y0 + h, left - x0: left - x0 + w].permute(1, 2, 0).numpy()
            want = np.asarray(Image.open(io.BytesIO(blobs[i])).convert("RGB"))[top: top + h, left: left + w]
            worst = max(worst, 255 if got.shape != want.shape else int(np.abs(got.astype(int) - want).max()))
    return worst


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


# -- the cost model (docs/GPU.md states it) -------------------------------------------------
# H100 SXM: HBM3 at 3.35 TB/s, of which a streaming kernel reaches ~70%; 132 SMs with at
# most 32 resident programs (thread blocks) each
H100_BW = 3.35e12 * 0.7
H100_SLOTS = 132 * 32
DEVICE_OP_US = 4.0        # the device's gap between back-to-back small kernels
HOST_LAUNCH_US = 4.0      # cudaLaunchKernel's host cost, over torch's own dispatch
TRITON_LAUNCH_US = 20.0   # a Triton kernel's Python launch path (argument binding)
BITS_PER_SYMBOL = 4       # an entropy program's serial chain: one step per ~4 bits
H100_SMS, H100_WARPS_PER_SM, H100_REGS_PER_SM = 132, 64, 65536
# a band-walk pass of an AC refinement (coefficients -> correction bits: 2 dependent loads)
# against a symbol step (bytes -> table entry -> value bits: 3)
WALK_PASS_STEPS = 2 / 3
# the entropy stage's device operations besides its launches: the descriptors' one
# upload, the coefficients' and the blocks' band ends' zero fills, the damage flags'
# read-back
ENTROPY_TORCH_OPS = 4
NVJPEG_SOURCE_MS_PER_64 = ("peers_gpu.json", "imagefolder", "nvjpeg")
# the device measurements the model is calibrated on and compared with: the shipped ones,
# wherever a run writes its own results
MEASURED = REPO / "bench" / "results"


def l3_calibration(gpu_json: Path) -> dict:
    """The model's serial-chain step fitted on the one Triton decoder measured on a GPU
    (gpu.json: the L3 kernel, a program per patch and channel, its rows in sequence), on
    the largest batch, then asked for the other: how well it predicts."""
    import json

    from pcrfs.l3 import choose_patch
    res = json.loads(gpu_json.read_text())["result"]
    pts = []
    for b in res["triton_breakdown_ms"]:
        w, h = (int(x) for x in b["resolution"].split("x"))
        n = choose_patch(w, h)
        programs = 3 * -(-w // n) * -(-h // n) * b["images"]
        moved = b["l3_megabytes"] * 1e6 + 3 * b["megapixels"] * 1e6
        pts.append({"resolution": b["resolution"], "images": b["images"], "programs": programs,
                    "chain": n * -(-programs // H100_SLOTS), "moved": moved,
                    "measured_ms": b["kernel_ms"]})
    fit = max(pts, key=lambda x: x["moved"])
    step_us = 1e3 * (fit["measured_ms"] - 1e3 * fit["moved"] / H100_BW) / fit["chain"]
    for x in pts:
        x["predicted_ms"] = round(1e3 * x["moved"] / H100_BW + x["chain"] * step_us / 1e3, 3)
        x["predicted_over_measured"] = round(x["predicted_ms"] / x["measured_ms"], 3)
        del x["moved"]
    return {"serial_step_us": round(step_us, 3), "fitted_on": fit["resolution"],
            "gpu": res.get("gpu"), "points": pts}


def nvjpeg_h100_ms(results: Path, batch: int = 256) -> float | None:
    """nvJPEG's measured decode time for `batch` source crops (peers_gpu.json's profile
    per batch of 64, scaled)."""
    import json
    path = results / NVJPEG_SOURCE_MS_PER_64[0]
    if not path.exists():
        return None
    for r in json.loads(path.read_text())["result"]["rows"]:
        if (r["system"], r["arm"]) == NVJPEG_SOURCE_MS_PER_64[1:] and r.get("profile"):
            return round(r["profile"]["decode_ms_per_batch"] * batch / 64, 2)
    return None


def kernel_resources(archs=(80, 90)) -> dict:
    """{kernel: {registers, spills}} of the decode path's Triton kernels, compiled for each
    sm_arch and assembled by Triton's bundled `ptxas -v` (no GPU needed)."""
    import itertools
    import re
    import subprocess
    import tempfile

    import triton

    from pcrfs.torch import jpeg_triton, pixels_triton, resize_triton
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    out = {}
    builds = (("entropy_intervals", jpeg_triton.compiled), ("smoothing", pixels_triton.compiled_smoothing),
              ("idct", pixels_triton.compiled_idct), ("ycc_rgb", pixels_triton.compiled_ycc_rgb),
              ("resize", resize_triton.compiled))
    for (name, build), arch in itertools.product(builds, archs):
        k = build(arch)
        ptx = k.asm["ptx"]
        target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)   # sm_90a on Hopper
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "k.ptx").write_text(ptx)
            log = subprocess.run([str(ptxas), "-v", "--gpu-name", target, f"{d}/k.ptx",
                                  "-o", f"{d}/k.cubin"], capture_output=True, text=True,
                                 check=True).stderr
        regs = int(re.search(r"Used (\d+) registers", log).group(1))
        spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
        out.setdefault(name, {})[target] = {"registers": regs, "spill_bytes": spills}
    return out


def _dispatch_us() -> float:
    """torch's eager dispatch per operation on this host (tiny CPU tensors): the Python and
    dispatcher share of every device operation."""
    import torch
    a = torch.zeros(4)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            torch.add(a, 1)
        best = min(best, (time.perf_counter() - t0) / 2000)
    return 1e6 * best


def entropy_slots(registers: int) -> int:
    """Intervals the H100 decodes at once: resident programs per SM (by the kernel's
    registers, allocated per warp in units of 256, and warps) x lanes per program."""
    from pcrfs.torch import jpeg_triton as jt
    per_warp = -(-registers * 32 // 256) * 256
    programs = min(32, H100_WARPS_PER_SM // jt.WARPS, H100_REGS_PER_SM // per_warp // jt.WARPS)
    return H100_SMS * max(programs, 1) * jt.LANES


def interval_steps(rows, iv, where, parsed, coefs, firsts, chunk=None, to_band_end=False):
    """Each interval's serial steps in the lane-parallel kernel: a symbol step per
    BITS_PER_SYMBOL bits, and in an AC refinement the band walk's passes, CHUNK
    coefficients each, WALK_PASS_STEPS a pass: per block, from the band's start to its
    last nonzero coefficient (no further: the zeros past it are counted, not walked; taken
    from the image's final coefficients, an upper bound), plus one restart per symbol.
    A refinement's correction bits (one per coefficient already nonzero, i.e. with a bit
    above Al in the final coefficients) are taken by the walk's passes, not by symbol
    steps, so they leave the symbols' share.  chunk, to_band_end: another kernel's walk
    (the replaced one's: a coefficient a step, to the band's end)."""
    import numpy as np

    from pcrfs import jpeg as cjpeg
    from pcrfs.torch import jpeg_triton as jt
    bits = (iv[:, 1] - iv[:, 0]) * 8
    symbols = bits / BITS_PER_SYMBOL
    sc = rows[iv[:, 4]]
    ncomp = sc[:, 1]
    bpm = sum(np.where(ncomp > i, sc[:, 8 + 6 * i] * sc[:, 9 + 6 * i], 0) for i in range(4))
    blocks = iv[:, 3] * np.maximum(bpm, 1)
    refine = sc[:, 0] == cjpeg.AC_REFINE
    # per (image, scan): a refinement block's mean passes (AC scans have one component)
    zz = np.asarray(cjpeg.ZIGZAG)
    c = coefs.numpy() if hasattr(coefs, "numpy") else coefs
    per_block = np.zeros(len(iv))
    corrections = np.zeros(len(iv))
    for (j, sp), idx in _groups(where[:, :2], refine):
        p, sc0 = parsed[j], sc[idx[0]]
        ss, se = int(sc0[2]), int(sc0[3])
        comp = int(p.scans[sp][cjpeg.S["comp0"]])
        first = firsts[j] + int(p.coef_offset[comp])
        blk = c[first: first + int(p.bh[comp]) * int(p.bw[comp])][:, zz]
        nz = blk != 0
        end = np.where(nz.any(1), 64 - np.argmax(nz[:, ::-1], 1), 0)     # past the last nonzero
        span = np.clip(np.minimum(np.full_like(end, 64) if to_band_end else end, se + 1) - ss, 0, None)
        per_block[idx] = np.mean(-(-span // (chunk or jt.CHUNK))) if len(span) else 0
        al = int(sc0[4])
        older = (np.abs(blk[:, ss: se + 1].astype(np.int32)) >> (al + 1)) != 0
        corrections[idx] = older.sum(1).mean() if len(blk) else 0
    symbols = np.where(refine, np.maximum(bits - blocks * corrections, 0) / BITS_PER_SYMBOL, symbols)
    passes = np.where(refine, blocks * per_block + symbols, 0)
    return symbols + passes * WALK_PASS_STEPS


def _groups(keys, mask):
    """((image, scan), the rows of that key) for the masked rows."""
    import numpy as np
    out: dict = {}
    for i in np.flatnonzero(mask):
        out.setdefault((int(keys[i, 0]), int(keys[i, 1])), []).append(i)
    return out.items()


def level_ms(chains, calib: dict, lanes: int, slots: int, parts: list | None = None) -> float:
    """The entropy stage's ms: per level, max(longest program, all programs / resident
    ones) serial steps, a program being `lanes` intervals in launch order.  parts: gets
    per level {intervals, longest_program_ms, all_programs_over_resident_ms}."""
    import numpy as np
    total = 0.0
    step = calib["serial_step_us"] / 1e3
    for c in chains:
        if len(c):
            c = np.asarray(c, float)
            prog = np.concatenate([c, np.zeros(-len(c) % lanes)]).reshape(-1, lanes).max(1)
            longest, spread = prog.max(), prog.sum() / max(slots // lanes, 1)
            total += max(longest, spread)
            if parts is not None:
                parts.append({"intervals": len(c), "longest_program_ms": round(float(longest * step), 2),
                              "all_programs_over_resident_ms": round(float(spread * step), 2)})
    return float(total * step)


def predict(share: dict, entropy_chains, calib: dict, slots: int) -> dict:
    """The model: host and device run as a pipeline (the host builds batch n+1 while the
    device decodes batch n), so a batch costs the larger of
      host   = descriptors' C call (GIL released) + its Python side + device ops x
               (dispatch + HOST_LAUNCH_US) + entropy launches x TRITON_LAUNCH_US
               (host_total_ms; host_ms is the part under the GIL)
      device = bytes moved / H100_BW + device ops x DEVICE_OP_US
               + per entropy level: max(longest program, all programs / resident ones)
                 x the serial step (L3's, fitted: a step of dependent loads), a program
                 being LANES intervals in launch order in lock step, as long as its longest
    entropy_chains: per level, each interval's serial steps (interval_steps); slots: the
    intervals resident at once (entropy_slots)."""
    from pcrfs.torch import jpeg_triton as jt
    levels: list = []
    entropy_ms = level_ms(entropy_chains, calib, jt.LANES, slots, levels)
    bytes_ms = share["device_mb_moved"] * 2**20 / H100_BW * 1e3
    device = bytes_ms + share["device_ops"] * DEVICE_OP_US / 1e3 + entropy_ms
    device, entropy_ms = float(device), float(entropy_ms)
    return {"device_ms": round(device, 2), "entropy_ms": round(entropy_ms, 2),
            "bytes_ms": round(bytes_ms, 3), "entropy_slots": slots, "entropy_levels": levels,
            "predicted_h100_ms": round(max(share["host_total_ms"], device), 2)}


def _band_bytes(rows, iv) -> int:
    """Device bytes the entropy kernel moves in the coefficients of the described
    intervals (rows, iv: descriptors'): each block an interval codes has the 32-byte
    sectors its band's coefficients (natural order, int16) fall in written, or read and
    written by a refinement."""
    import numpy as np

    from pcrfs import jpeg as cjpeg
    sc = rows[iv[:, 4]]
    per_mcu = np.where(sc[:, 1] == 1, 1, sum(np.where(sc[:, 1] > i, sc[:, 8 + 6 * i] * sc[:, 9 + 6 * i], 0)
                                             for i in range(4)))
    sectors = {(a, b): len({cjpeg.ZIGZAG[k] * 2 // 32 for k in range(a, b + 1)})
               for a, b in {(int(x), int(y)) for x, y in sc[:, 2:4]}}
    sec = np.array([sectors[(int(a), int(b))] for a, b in sc[:, 2:4]], np.int64)
    rw = np.where(np.isin(sc[:, 0], (cjpeg.DC_REFINE, cjpeg.AC_REFINE)), 2, 1)
    return int((iv[:, 3] * per_mcu * sec * 32 * rw).sum())


def _resize_work(shapes, chunks, drawn, size: int = 224) -> dict:
    """GPUImageFolder's crop-resize of the canvases ([n, C, H, W], holding chunks' images)
    to size x size: resize_triton's kernel (each output pixel its KY x KX taps, the
    canvas's largest; it reads each box's samples and writes the output), and the two
    batched float products of crop_resize's other path, for comparison: GFLOP and MB."""
    import numpy as np

    from pcrfs.torch.crop_resize import aa_taps
    flop = moved = dense_flop = dense_moved = 0
    for (n, c, h, w), chunk in zip(shapes, chunks, strict=True):
        bx = np.array([drawn[j] for j in chunk], np.int64).reshape(-1, 4)
        ky, kx = aa_taps(bx[:, 0], bx[:, 2], size)[1].shape[2], aa_taps(bx[:, 1], bx[:, 3], size)[1].shape[2]
        flop += 2 * n * c * size * size * (ky * kx + ky)
        moved += int(c * (bx[:, 2] * bx[:, 3]).sum()) + n * c * size * size + n * size * 16 * (ky + kx + 2)
        dense_flop += 2 * n * c * size * w * (h + size)
        dense_moved += n * c * (h * w * (1 + 4 + 4) + 2 * 4 * size * w + 4 * size * size)
    return {"resize_gflop": round(flop / 1e9, 2), "resize_mb_moved": round(moved / 2**20, 1),
            "matmul_resize_gflop": round(dense_flop / 1e9, 1),
            "matmul_resize_mb_moved": round(dense_moved / 2**20, 1)}


def host_share(blobs, boxes=None) -> dict:
    """One batch: ms of the host work a GPU batch does under the GIL (C header parsing in
    one thread, here; the interval descriptors; the pixel stage's own array builds), and
    the device operations (kernels) the entropy and pixel stages issue.  Runs the pixel
    stage on CPU tensors and counts operations (views excluded), the bytes they write, and
    its time on this CPU.  boxes: decode_jpeg_canvases' (crop_boxes()): only each box's
    window, as GPUImageFolder decodes."""
    import numpy as np
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from pcrfs import jpeg as cjpeg
    from pcrfs.torch import jpeg as tj
    from pcrfs.torch import jpeg_triton

    # allocations and reshapes that move no bytes
    untouched = {torch.ops.aten.empty.memory_format, torch.ops.aten._unsafe_view.default}

    class Count(TorchDispatchMode):
        ops = written = read = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func not in untouched:
                Count.ops += 1
                Count.written += sum(t.nbytes for t in torch.utils._pytree.tree_leaves(out)
                                     if isinstance(t, torch.Tensor))
                # its inputs, read whole (an index or gather reads less: an upper bound)
                Count.read += sum(t.nbytes for t in torch.utils._pytree.tree_leaves(
                    (args, kwargs)) if isinstance(t, torch.Tensor))
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
    drawn = (boxes or crop_boxes())([(p.height, p.width) for p in ps])   # for the resize's count
    wins = None if boxes is None else [tj._window(p, b) for p, b in zip(ps, drawn, strict=True)]
    windows = None if wins is None else [(0, p.mcuy) if w is None else w[:2]
                                         for p, w in zip(ps, wins, strict=True)]
    groups: dict = {}
    for j, p in enumerate(ps):
        groups.setdefault(tj._group_key(p), []).append(j)
    # canvases as each path makes them (the kernels share them more freely)
    chunks = {k: [c for m in groups.values()
                  for c in tj.canvases(m, ps, tj.KERNEL_WASTE if k else 0.3, wins=wins)]
              for k in (False, True)}
    uploads = [0, 0]
    real_upload = tj.upload

    def counted(a, dev):
        uploads[0] += 1
        uploads[1] += a.nbytes
        return real_upload(a, dev)
    # CUDA's pixel stage (pixels_triton's kernels) counted from the kernels' shapes: each
    # launch one device op, its bytes the coefficients or samples it reads once (a
    # neighbour's re-read hits the cache) and the samples it writes; they return
    # uninitialised tensors, as nothing downstream is timed
    from pcrfs.torch import pixels_triton as pxk
    real = (pxk.idct_plane, pxk.ycc_to_rgb, pxk.smooth_blocks)
    kern = {"ops": 0, "read": 0, "written": 0}

    def idct_counted(src, q, n, bh, bw, geo, dense=False):
        kern["ops"] += 1
        # each image's own blocks (the kernel does nothing past them); numpy, so the
        # counter's own arithmetic is not counted as the decoder's
        blocks = int((geo[1].numpy() * geo[2].numpy()).sum())
        kern["read"] += blocks * 128 + n * 64 * 4 + 4 * n * 8
        kern["written"] += blocks * 64
        return torch.empty((n, bh * 8, bw * 8), dtype=torch.uint8)

    def smooth_counted(src, geo, q, bits, mcuy, n, bh, bw):
        kern["ops"] += 1
        blocks = int((geo[1].numpy() * geo[2].numpy()).sum())
        # each image's blocks read once (the neighbours' DCs are cache hits) and written
        kern["read"] += blocks * 128 + n * (64 + 10) * 8 + 9 * n * 8
        kern["written"] += blocks * 128
        return torch.empty((n * bh * bw, 64), dtype=torch.int16)

    def rgb_counted(y, cb, cr, dw, dh, hf, vf, h, w, sizes):
        kern["ops"] += 1
        n = y.shape[0]
        px = int((sizes[0].numpy() * sizes[1].numpy()).sum())     # each image's own pixels
        kern["read"] += px + 2 * px // (hf * vf) + dw.nbytes + dh.nbytes + 2 * n * 8
        kern["written"] += 3 * px
        return torch.empty((n, 3, h, w), dtype=torch.uint8)

    def pixel_stage(kernels: bool):
        Count.ops = Count.written = Count.read = 0
        kern.update(ops=0, read=0, written=0)
        uploads[:] = [0, 0]
        tj.upload, pxk.idct_plane, pxk.ycc_to_rgb, pxk.smooth_blocks = (counted, idct_counted, rgb_counted,
                                                                        smooth_counted)
        try:
            with Count():
                shapes = [tuple(tj._pixels(c, ps, coefs, firsts, "rgb", kernels, wins).shape)
                          for c in chunks[kernels]]
        finally:
            tj.upload = real_upload
            pxk.idct_plane, pxk.ycc_to_rgb, pxk.smooth_blocks = real
        return {"ops": Count.ops + kern["ops"], "torch_ops": Count.ops, "kernel_ops": kern["ops"],
                "written": Count.written + kern["written"],
                "read": Count.read + kern["read"], "uploads": list(uploads), "shapes": shapes}
    torch_path = pixel_stage(False)     # what a CPU device runs, for comparison
    stage = pixel_stage(True)
    data, tables, rows, iv, where, _ = jpeg_triton.descriptors(ps, firsts, windows=windows)
    launches = int(len(np.unique(where[:, 2])))
    # the entropy stage: 1 upload (bytes, tables, scan and interval rows in one pinned
    # buffer), the coefficients' and band ends' zero fills, a launch per level (each
    # program writes its own damage flag: no fill), the flags' read-back.  It reads its
    # bytes and tables, the band ends (filled, then a 32-byte sector read and written per
    # block and scan: counted as the fill twice), and per scan writes (first scans) or reads and writes
    # (refinements) the 32-byte sectors of each block its band touches
    ends_bytes = 4 * coefs.shape[0]
    entropy_moved = (data.nbytes + tables.nbytes + rows.nbytes + iv.nbytes + coefs.nbytes
                     + 3 * ends_bytes + _band_bytes(rows, iv))
    # + 1 upload, the two zero fills, the launches, the read-back
    device_ops = stage["ops"] + stage["uploads"][0] + ENTROPY_TORCH_OPS + launches
    # On a CUDA host the descriptors land in pinned buffers that torch's caching host
    # allocator hands back batch after batch (jpeg_triton.staging): warm pages, as here.
    arena: dict = {}

    def warm(specs):
        return [arena.setdefault((s, np.dtype(d).str), np.empty(s, d)) for s, d in specs]
    timed: dict = {}

    def described(alloc=warm):
        timed.clear()
        jpeg_triton.descriptors(ps, firsts, alloc, timed, windows)
        return timed["c_ms"]
    descriptors_ms = best(described)
    c_ms = min(described() for _ in range(5))
    gil_ms = max(descriptors_ms - c_ms, 0.0)     # the call's Python side; C releases the GIL
    torch_ops = stage["torch_ops"] + stage["uploads"][0] + ENTROPY_TORCH_OPS
    dispatch_ms = (torch_ops * (_dispatch_us() + HOST_LAUNCH_US)
                   + (launches + stage["kernel_ops"]) * TRITON_LAUNCH_US) / 1e3
    host_ms = gil_ms + dispatch_ms
    lengths = iv[:, 1] - iv[:, 0]
    def by_level(steps):
        return [steps[where[:, 2] == lv] for lv in np.unique(where[:, 2])]
    steps = interval_steps(rows, iv, where, ps, coefs, firsts)
    chains = by_level(steps)
    # per level, the interval with the longest chain: what bounds that launch
    longest = []
    for lv in np.unique(where[:, 2]):
        idx = np.flatnonzero(where[:, 2] == lv)
        o = idx[np.argmax(steps[idx])]
        sc = rows[iv[o, 4]]
        longest.append({"level": int(lv), "scan": int(where[o, 1]) + 1, "kind": int(sc[0]),
                        "components": int(sc[1]), "band": [int(sc[2]), int(sc[3])], "al": int(sc[4]),
                        "bytes": int(iv[o, 1] - iv[o, 0]), "steps": round(float(steps[o]))})
    # the kernel this one replaced under the same model: a program an interval (61
    # registers: 32 resident a SM), its band walk a coefficient a step to the band's end
    replaced = by_level(interval_steps(rows, iv, where, ps, coefs, firsts, chunk=1, to_band_end=True))
    out = {"images": len(blobs), "parse_ms_one_thread": best(lambda: [cjpeg.parse(b) for b in blobs]),
           "descriptors_ms": descriptors_ms, "descriptors_c_ms": round(c_ms, 2),
           "descriptors_gil_ms": round(gil_ms, 2),
           "descriptors_cold_ms": best(lambda: described(None)),   # fresh pages each time
           "dispatch_ms": round(dispatch_ms, 2),
           "descriptor_kb": round((rows.nbytes + iv.nbytes) / 1024),
           "entropy_launches": launches, "scan_positions": int(where[:, 1].max()) + 1,
           "canvases": len(chunks[True]), "pixel_ops": stage["ops"],
           # what the pixel stage's operations write and read: its device memory traffic
           "pixel_mb_written": round(stage["written"] / 2**20, 1),
           "pixel_mb_read": round(stage["read"] / 2**20, 1),
           "torch_pixel_ops": torch_path["ops"],
           "torch_pixel_mb_moved": round((torch_path["written"] + torch_path["read"]) / 2**20, 1),
           "entropy_mb_moved": round(entropy_moved / 2**20, 1),
           "pixel_ms_cpu": best(lambda: [tj._pixels(c, ps, coefs, firsts, "rgb", False, wins)
                                         for c in chunks[False]], 3),
           "intervals": len(iv), "blocks": int(sum(
               np.prod(tj._extent(p, None if wins is None else wins[j])[:2]) * sum(
                   h * v for h, v in zip(p.h, p.v, strict=True)) for j, p in enumerate(ps))),
           "entropy_bytes": int(lengths.sum()), "longest_interval_bytes": int(lengths.max()),
           "longest_chain_by_level": longest,
           "view_bytes": int(sum(len(b) for b in blobs)),
           "markers": int(len(iv) - len({(int(a), int(b)) for a, b in where[:, :2]})),
           "host_ms": round(host_ms, 2), "host_total_ms": round(host_ms + c_ms, 2),
           "device_ops": device_ops,
           "device_mb_moved": round((stage["written"] + stage["read"] + stage["uploads"][1]
                                     + entropy_moved) / 2**20, 1)}
    out.update(_resize_work(stage["shapes"], chunks[True], drawn))
    return out, (chains, replaced, (iv, where, steps, rows[iv[:, 4], 5]))


FINE_RESTART_MCUS = 4


def fine_restarts(blobs: list[bytes]) -> list[bytes]:
    """The same progressive JPEGs (libjpeg's simple progression, as the build's) with a
    restart marker every FINE_RESTART_MCUS MCUs of every scan (jpegtran), for the what-if
    of balanced_restarts."""
    import subprocess
    return [subprocess.run(["jpegtran", "-progressive", "-optimize", "-copy", "none", "-restart",
                            f"{FINE_RESTART_MCUS}B"], input=b, capture_output=True, check=True).stdout
            for b in blobs]


def balanced_restarts(raw, share: dict, base: dict, calib: dict, slots: int,
                      bounds=(100, 150, 200, 300, 400)) -> dict:
    """A what-if from a build with a restart marker every few MCUs (raw: its intervals,
    where, steps and each interval's scan's MCUs a row): each scan of each image
    restarting every r of those intervals, r the largest whose intervals stay within
    `bound` bytes, instead of every scan every 3 rows.  Joined intervals add their bytes
    and steps.  Per bound: markers an image, their byte cost (a marker's 2 bytes plus what
    the fine build adds to the entropy-coded bytes per marker over the default one,
    against the view's bytes without markers) and the predicted H100 time (the host's
    share scaled from the default build's, base, by the intervals).  uniform_rows3
    and uniform_rows1 are the default and --restart-rows 1 layouts by the same joins: a
    check on the what-if against their own builds' predictions."""
    import numpy as np
    iv, where, steps, mpr = raw
    nbytes = (iv[:, 1] - iv[:, 0]).astype(np.int64)
    groups: dict = {}
    for o in np.lexsort((iv[:, 2], where[:, 1], where[:, 0])):
        groups.setdefault((int(where[o, 0]), int(where[o, 1])), []).append(o)
    images = len({j for j, _ in groups})
    per_marker = 2 + share["extra_bytes_per_marker"]
    plain = share["view_bytes"] - share["markers"] * per_marker

    def plan(pick):
        chains: dict = {}
        markers = intervals = 0
        for at in groups.values():
            r = max(1, pick(nbytes[at], int(mpr[at[0]]), int(iv[at[0], 3])))
            n = -(-len(at) // r)
            markers += n - 1
            intervals += n
            st = steps[at]
            chains.setdefault(int(where[at[0], 2]), []).extend(
                float(st[i * r:(i + 1) * r].sum()) for i in range(n))
        ent = level_ms([np.asarray(chains[lv]) for lv in sorted(chains)], calib, 32, slots)
        device = share["bytes_ms"] + share["device_ops"] * DEVICE_OP_US / 1e3 + ent
        host = base["host_total_ms"] * intervals / base["intervals"]
        return {"markers_per_image": round(markers / images, 1),
                "byte_cost_over_none": round(markers * per_marker / plain, 4), "entropy_ms": round(ent, 2),
                "host_total_ms": round(host, 2), "predicted_h100_ms": round(max(device, host), 2)}

    def within(bound):
        def pick(b, _mpr, _m):
            for r in range(len(b), 1, -1):
                if max(b[i:i + r].sum() for i in range(0, len(b), r)) <= bound:
                    return r
            return 1
        return pick
    out = {f"uniform_rows{n}": plan(lambda b, m, per, n=n: n * m // per) for n in (3, 1)}
    out.update({f"within_{bound}_bytes": plan(within(bound)) for bound in bounds})
    return out


CROP_KEYS = ("intervals", "entropy_bytes", "longest_interval_bytes", "blocks", "entropy_mb_moved",
             "pixel_mb_written", "device_mb_moved", "device_ops", "canvases", "resize_gflop",
             "resize_mb_moved", "matmul_resize_gflop", "matmul_resize_mb_moved",
             "host_ms", "host_total_ms", "entropy_ms", "bytes_ms", "predicted_h100_ms")


def host_shares(views: dict, results: Path = MEASURED) -> dict:
    """host_share per view with the model's prediction, the kernels' registers and spills,
    nvJPEG's measured time for as many source crops, and the model's calibration."""
    calib = l3_calibration(results / "gpu.json")
    try:
        kernels = kernel_resources()
    except Exception as e:  # noqa: BLE001 - a Triton without the CUDA backend: say so
        kernels = {"error": f"{type(e).__name__}: {e}"}
    from pcrfs.torch import jpeg_triton as jt
    # resident programs by the Hopper build's registers (all of them when unknown)
    regs = kernels.get("entropy_intervals", {}).get("sm_90a", {}).get("registers", 255)
    slots = entropy_slots(regs)
    out = {}
    for v, blobs in views.items():
        share, (chains, replaced, raw) = host_share(blobs)
        share.update(predict(share, chains, calib, slots), kernels=kernels,
                     replaced_kernel_entropy_ms=round(level_ms(replaced, calib, 1, H100_SLOTS), 2),
                     nvjpeg_h100_ms=nvjpeg_h100_ms(results, len(blobs)))
        # GPUImageFolder's batch: RandomResizedCrop boxes, only their windows decoded
        if v == "q10":      # what restart intervals balanced by bytes would give
            fine, (fine_chains, _, raw) = host_share(fine_restarts(blobs))
            fine.update(predict(fine, fine_chains, calib, slots))
            fine["extra_bytes_per_marker"] = round((fine["entropy_bytes"] - share["entropy_bytes"])
                                                   / max(fine["markers"] - share["markers"], 1), 3)
            share["balanced_restarts"] = {"fine_restart_mcus": FINE_RESTART_MCUS, "plans": balanced_restarts(
                raw, fine, share, calib, slots), "extra_bytes_per_marker": fine["extra_bytes_per_marker"]}
        crop, (chains, _, _) = host_share(blobs, crop_boxes())
        crop.update(predict(crop, chains, calib, slots))
        share["crops"] = {k: crop[k] for k in CROP_KEYS} | {
            f"{k}_share": round(crop[k] / share[k], 3) for k in ("intervals", "entropy_bytes", "blocks",
                                                                  "device_mb_moved", "matmul_resize_gflop")}
        out[v] = share
    out["model"] = {"calibration": calib, "h100_bandwidth_gb_s": H100_BW / 1e9,
                    "l3_slots": H100_SLOTS, "entropy_slots": slots, "lanes": jt.LANES,
                    "warps": jt.WARPS, "walk_chunk": jt.CHUNK, "walk_pass_steps": round(WALK_PASS_STEPS, 3),
                    "device_op_us": DEVICE_OP_US,
                    "host_launch_us": HOST_LAUNCH_US, "triton_launch_us": TRITON_LAUNCH_US,
                    "bits_per_symbol": BITS_PER_SYMBOL}
    return out


def host_share_only(work: Path, out: Path, source: Path | None, images: int = 256,
                    k: int = 5) -> dict:
    """`--host-share-only`: host_share for `images` crops of `source` (an ImageFolder tree;
    default the bench's ImageNet-like crops), no GPU, merged into gpu_decode.json."""
    import json
    src = source or ensure_imagenet_like(work, images)
    rels = sorted(p.relative_to(src).as_posix() for p in src.rglob("*")
                  if p.suffix.lower() in (".jpg", ".jpeg"))[:images]
    ds = ensure_dataset(src, work / f"gpu-decode-share-{src.name}-{len(rels)}")
    dense = ensure_dataset(src, work / f"gpu-decode-share-{src.name}-{len(rels)}-r1",
                           "--restart-rows", "1")
    by_bytes = ensure_dataset(src, work / f"gpu-decode-share-{src.name}-{len(rels)}-b{RESTART_BYTES}",
                              "--restart-bytes", str(RESTART_BYTES))
    views = {v: _views(ds, rels, v) for v in ("q10", f"q{k}")}
    views["q10_rows1"] = _views(dense, rels, "q10")   # the model's shorter chains
    views["q10_bytes"] = _views(by_bytes, rels, "q10")   # intervals balanced by bytes
    shares = host_shares(views)
    shares["source"] = str(src)
    shares["restart_layouts"] = restart_layouts([(src / r).read_bytes() for r in rels])
    path = out / "gpu_decode.json"
    prior = json.loads(path.read_text()) if path.exists() else {"result": {}}
    res = prior["result"]
    res["host_share"] = shares
    # the timed arms keep the run that measured them; the file's stamp is this run's
    res.setdefault("arms_measured", {k: prior.get(k) for k in ("time", "command", "machine")})
    write_result(out, "gpu_decode", res)
    return shares


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
             "q10_plain": _views(plain, rels, "q10"), "q10_rows1": _views(dense, rels, "q10"),
             "q10_bytes": _views(ensure_dataset(src, work / f"gpu-decode-{images}-b{RESTART_BYTES}",
                                                "--restart-bytes", str(RESTART_BYTES)), rels, "q10")}
    # the l3 files as the mount's l3 view makes them (from the full-fidelity JPEG)
    from pcrfs.views.l3 import l3_bytes
    crops["l3"] = [l3_bytes(b) for b in crops["q10"]]
    big_src, big_q10, big_plain = _large(large if large is not None else 8 if quick else 24)
    sets = {"crops": crops, "large": {"source": big_src, "q10": big_q10, "q10_plain": big_plain}}
    gpu_arms = {"pcrfs_q10": "q10", "pcrfs_q10_crops": "q10", "pcrfs_q10_rows1": "q10_rows1",
                "pcrfs_q10_bytes": "q10_bytes",
                f"pcrfs_q{k}": f"q{k}",
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
            for v in ("q10", f"q{k}"):      # GPUImageFolder's decode: each box's window
                if blobs_by.get(v):
                    checks[f"{set_name}/{v}_crops"] = _check_crops(blobs_by[v][:64], device)
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
           "host_share": host_shares({v: crops[v][:256] for v in ("q10", f"q{k}", "q10_rows1", "q10_bytes")})}
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
