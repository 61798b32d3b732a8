"""GPU L3 decoding: pcrfs.torch.l3.decode_batch on CUDA over the l3 files of the corpus
dataset, checked pixel for pixel against the C decoder, and its Mpixel/s beside the CPU
decoders (C L3 on one thread and on every core, torch L3 on the CPU, Pillow on the
progressive qG JPEGs) on the same machine.  Both GPU backends are checked and timed: the
Triton kernel (pcrfs.torch.l3_triton) and the torch-operations decoder it replaces.

It runs in two steps because the GPU machine may have no FUSE and no network:

  prepare DIR   here, through a real mount: builds the corpus dataset, reads every file of
                MNT/qG and MNT/l3, and writes the qG JPEGs to DIR with a manifest of each l3
                file's size and SHA-256 and of its C-decoded pixels' SHA-256.
  measure DIR   wherever CUDA is: remakes each l3 file from its qG JPEG with the l3 view's
                own transcoder (pcrfs.views.l3.l3_bytes), requires it to equal the mount's
                byte for byte, then checks and times the decoders; writes gpu.json
                and gpu.png.
  plot DIR      gpu.png again from DIR/gpu.json.

The JPEGs travel instead of the l3 files: 79 MB against 707 MB for the corpus.
`pcrfs-bench --only gpu` runs both steps when this machine has CUDA."""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import REPO, Mounted, best_seconds, ensure_dataset, pyplot, write_result


def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def prepare(work: Path, carry: Path, dataset: Path | None = None, max_images: int | None = None) -> dict:
    """Through a real mount of the corpus dataset (built under `work` unless `dataset` is
    given): the qG JPEGs and the l3 files' hashes; all images, or the `max_images` whose l3
    files are smallest (sizes are exact before any read, so only those are transcoded)."""

    import pcrfs.l3 as l3
    if dataset is None:
        corpus = REPO / ".cache" / "corpus"
        src = work / "corpus-src"
        if not src.exists():
            tmp = work / "corpus-src.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            for i, f in enumerate(sorted(p for p in corpus.iterdir() if p.suffix in (".jpg", ".png"))):
                d = tmp / f"class_{i % 5}"
                d.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, d / f.name)
            tmp.rename(src)
        dataset = ensure_dataset(src, work / "corpus-ds")
    mnt = work / "mnt-gpu"
    shutil.rmtree(carry, ignore_errors=True)
    (carry / "jpeg").mkdir(parents=True)
    images = []
    with Mounted(dataset, mnt, "--cache-dir", "none"):
        top = sorted((p for p in mnt.iterdir() if p.name[0] == "q" and p.name[1:].isdigit()),
                     key=lambda p: int(p.name[1:]))[-1]
        l3files = sorted(f for d in (mnt / "l3").iterdir() for f in d.iterdir())
        if max_images is not None:
            l3files = sorted(sorted(l3files, key=lambda f: f.stat().st_size)[:max_images])
        for f in l3files:
            qdir = top / f.parent.name
            base = f.name[: -len(".l3")]
            # foo.l3 comes from foo.<ext>, or foo.<ext>.l3 when two names shared the stem
            q = qdir / base if (qdir / base).exists() else next(
                p for p in sorted(qdir.iterdir()) if p.name.rsplit(".", 1)[0] == base)
            blob = f.read_bytes()
            hdr = l3.info(blob)
            jpeg = q.read_bytes()
            name = f"{len(images):03d}.jpg"
            (carry / "jpeg" / name).write_bytes(jpeg)
            images.append({"file": name, "path": f"l3/{f.parent.name}/{f.name}",
                           "qg": f"{top.name}/{q.parent.name}/{q.name}",
                           "width": hdr.width, "height": hdr.height, "patch": hdr.patch,
                           "l3_size": len(blob), "l3_sha256": _sha(blob),
                           "pixels_sha256": _sha(l3.decode(blob))})
    man = {"top_view": top.name, "images": images,
           "megapixels": round(sum(i["width"] * i["height"] for i in images) / 1e6, 2),
           "l3_bytes": sum(i["l3_size"] for i in images),
           "jpeg_bytes": sum((carry / "jpeg" / i["file"]).stat().st_size for i in images)}
    (carry / "manifest.json").write_text(json.dumps(man, indent=1) + "\n")
    return man


# ---------------------------------------------------------------- measure (CUDA side)

def _by_shape(items: list[dict]) -> list[list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for it in items:
        groups.setdefault((it["width"], it["height"]), []).append(it)
    return list(groups.values())


def measure(carry: Path, device: str = "cuda", repeat: int = 3, cpu_torch_mpix: float = 20.0,
            batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)) -> dict:
    import numpy as np
    from PIL import Image

    import pcrfs.l3 as l3
    from pcrfs.views.l3 import l3_bytes

    man = json.loads((carry / "manifest.json").read_text())
    items = man["images"]
    jpegs = {it["file"]: (carry / "jpeg" / it["file"]).read_bytes() for it in items}

    # 1. The same bytes the mount serves under MNT/l3.
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        blobs = dict(zip(jpegs, pool.map(l3_bytes, jpegs.values()), strict=False))
    wrong = [it["path"] for it in items if _sha(blobs[it["file"]]) != it["l3_sha256"]]
    if wrong:
        raise SystemExit(f"l3 bytes differ from the mount's for {len(wrong)} files: {wrong[:5]}")
    for it in items:
        it["blob"] = blobs[it["file"]]
        it["px"] = it["width"] * it["height"]
    total_px = sum(it["px"] for it in items)
    import torch  # after the byte check: a refusal costs no torch import

    from pcrfs.torch.l3 import _use_triton, decode_batch

    # 2. The C decoder: pixels as the mount's machine decoded them, then its rates.
    ref = {}
    for it in items:
        ref[it["file"]] = l3.decode(it["blob"], "CHW")
        if _sha(np.ascontiguousarray(ref[it["file"]].transpose(1, 2, 0))) != it["pixels_sha256"]:
            raise SystemExit(f"C decoder's pixels differ from the mount machine's for {it['path']}")
    cores = os.cpu_count()
    c_one = best_seconds(lambda: [l3.decode(it["blob"]) for it in items], repeat)
    rates = {"l3_c_1_thread": total_px / c_one}

    def c_all():
        with ThreadPoolExecutor(cores) as pool:
            list(pool.map(lambda it: l3.decode(it["blob"]), items))
    c_all()
    rates[f"l3_c_{cores}_threads"] = total_px / best_seconds(c_all, repeat)

    def pil(b):
        with Image.open(io.BytesIO(b)) as im:
            im.load()
    rates["jpeg_progressive_qG_pillow_1_thread"] = total_px / best_seconds(
        lambda: [pil(jpegs[it["file"]]) for it in items], repeat)

    def pil_all():
        with ThreadPoolExecutor(cores) as pool:
            list(pool.map(pil, jpegs.values()))
    rates[f"jpeg_progressive_qG_pillow_{cores}_threads"] = total_px / best_seconds(pil_all, repeat)

    # torch L3 on the CPU is slow: a subset of the smallest images, all threads.
    small = sorted(items, key=lambda it: it["px"])
    sub, acc = [], 0
    for it in small:
        if acc + it["px"] > cpu_torch_mpix * 1e6 and sub:
            break
        sub.append(it)
        acc += it["px"]
    sub_groups = _by_shape(sub)
    rates[f"l3_torch_cpu_{torch.get_num_threads()}_threads"] = acc / best_seconds(
        lambda: [decode_batch([i["blob"] for i in g], "cpu") for g in sub_groups], 1)

    out = {"device": device, "torch": torch.__version__, "cpu_cores": cores,
           "machine": platform.platform(), "images": len(items),
           "megapixels": round(total_px / 1e6, 2), "l3_bytes": man["l3_bytes"],
           "top_view": man["top_view"],
           "l3_bytes_equal_mount": True, "c_pixels_equal_mount_machine": True}
    if device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(0)
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)

    # 3. Every image decoded on the device equals the C decoder, with each backend: per
    # resolution as stacked batches, and once all together (mixed sizes and patch sizes,
    # the list path).
    backends = ["tensor"] + (["triton"] if _use_triton("auto", torch.device(device)) else [])
    mismatched = []
    groups = _by_shape(items)
    for be in backends:
        for g in groups:
            got = decode_batch([i["blob"] for i in g], device, backend=be).cpu()
            for k, it in enumerate(g):
                if not torch.equal(got[k], torch.from_numpy(ref[it["file"]])):
                    mismatched.append(f"{it['path']} ({be})")
        mixed = decode_batch([it["blob"] for it in items], device, layout="NHWC", backend=be)
        mixed = mixed if isinstance(mixed, list) else list(mixed)
        for it, t in zip(items, mixed, strict=False):
            if not torch.equal(t.cpu(), torch.from_numpy(ref[it["file"]].transpose(1, 2, 0))):
                mismatched.append(f"{it['path']} ({be}, mixed batch)")
        del mixed
    out["backends_checked"] = backends
    out["corrupt_rows_rejected"] = _corrupt_rows_rejected(min(items, key=lambda i: i["l3_size"])["blob"],
                                                          device, backends)
    out["equal_to_c_decoder"] = not mismatched
    out["mismatched"] = mismatched
    if mismatched:
        raise SystemExit(f"{len(mismatched)} images differ from the C decoder: {mismatched[:5]}")

    # 4. Rates on the device, host bytes to device pixels, synchronized.
    scaling = {}
    for be in backends:
        def dev_groups():
            for g in groups:
                decode_batch([i["blob"] for i in g], device, backend=be)
            sync()
        dev_groups()
        rates[f"l3_{be}_{device}_batch_per_resolution"] = total_px / best_seconds(dev_groups, repeat)

        def dev_one():
            for it in items:
                decode_batch([it["blob"]], device, backend=be)
            sync()
        rates[f"l3_{be}_{device}_batch_1"] = total_px / best_seconds(dev_one, repeat)

        # Batch-size scaling at the two most common resolutions, images repeated.
        for g in sorted(groups, key=len, reverse=True)[:2]:
            w, h = g[0]["width"], g[0]["height"]
            row = {}
            for bs in batch_sizes:
                if bs * w * h > 4e9:
                    break
                batch = [g[i % len(g)]["blob"] for i in range(bs)]
                decode_batch(batch, device, backend=be)
                sync()
                t = best_seconds(lambda: (decode_batch(batch, device, backend=be), sync()), repeat)
                row[str(bs)] = round(bs * w * h / t / 1e6, 1)
            scaling.setdefault(be, {})[f"{w}x{h}"] = row
    out["scaling_mpix_per_s_by_batch"] = scaling
    if "triton" in backends:
        small = min(groups, key=lambda g: g[0]["px"])
        out["triton_breakdown_ms"] = [
            _breakdown(max(groups, key=lambda g: sum(i["px"] for i in g)), device, sync, repeat),
            _breakdown([small[i % len(small)] for i in range(256)], device, sync, repeat)]

    # nvJPEG through torchvision on the same qG JPEGs, for reference, where it can.
    try:
        import torchvision.io as tio
        datas = [torch.frombuffer(bytearray(jpegs[it["file"]]), dtype=torch.uint8) for it in items]
        tio.decode_jpeg(datas, device=device)
        sync()
        rates[f"jpeg_progressive_qG_nvjpeg_{device}"] = total_px / best_seconds(
            lambda: (tio.decode_jpeg(datas, device=device), sync()), repeat)
    except Exception as e:  # noqa: BLE001 - a reference only; its failure is recorded
        out["nvjpeg_error"] = f"{type(e).__name__}: {e}"[:300]

    out["decode_mpix_per_s"] = {k: round(v / 1e6, 1) for k, v in rates.items()}
    best = rates[f"l3_{backends[-1]}_{device}_batch_per_resolution"]
    out["gpu_backend"] = backends[-1]
    out["gpu_over_c_1_thread"] = round(best / rates["l3_c_1_thread"], 2)
    out["gpu_over_c_all_threads"] = round(best / rates[f"l3_c_{cores}_threads"], 2)
    return out


def _corrupt_rows_rejected(blob: bytes, device: str, backends: list[str]) -> dict:
    """Row damage the header check cannot see (the C decoder finds it too) must raise
    L3Error on the device, never return pixels: nbit 15 in the first row, a first row
    shortened so the patch's rows no longer add up, and each of those in the last patch."""
    import pcrfs.l3 as l3
    from pcrfs.torch.l3 import decode_batch
    hdr = l3.info(blob)
    np_ = -(-hdr.width // hdr.patch) * -(-hdr.height // hdr.patch)
    first = l3.HEADER_SIZE + 6 * np_
    sizes = [int.from_bytes(blob[l3.HEADER_SIZE + 2 * i: l3.HEADER_SIZE + 2 * i + 2], "little")
             for i in range(3 * np_)]
    last = len(blob) - sizes[-1]
    bad = []
    for at in (first, last):
        b = bytearray(blob)
        b[at] |= 0x0F
        bad.append(bytes(b))
        b = bytearray(blob)
        b[at] = (b[at] & 0xF0) | max(0, (b[at] & 0xF) - 1)
        bad.append(bytes(b))
    out = {}
    for be in backends:
        n = 0
        for b in bad:
            try:
                l3.decode(b)
            except l3.L3Error:
                pass
            else:
                continue  # this mutation happens to stay valid: nothing to ask
            try:
                decode_batch([b], device, backend=be)
            except l3.L3Error:
                n += 1
            else:
                raise SystemExit(f"{be} on {device} returned pixels for a corrupt file")
        out[be] = n
    return out


def _breakdown(group: list[dict], device: str, sync, repeat: int) -> dict:
    """Where a batch's time goes: the patch tables (once, on the host), gathering and
    copying its bytes to the device, and the kernel on bytes already there."""
    import torch

    from pcrfs.torch import l3 as tl3
    from pcrfs.torch import l3_triton
    blobs = [i["blob"] for i in group]
    dev = torch.device(device)
    total = sum(map(len, blobs))
    t0 = time.perf_counter()
    starts, sizes, ws, hs, heads = tl3._patch_table(blobs)
    l3_triton.output_table(heads, "NCHW")
    t_tables = time.perf_counter() - t0
    nmax = max(h.patch for h, *_ in heads)
    data = tl3._upload(blobs, total, dev)

    def kernel():
        l3_triton.decode(data, total + tl3._PAD - 2, starts, sizes, ws, hs, heads, "NCHW", nmax)
        sync()
    kernel()
    px = sum(i["px"] for i in group)
    t_up = best_seconds(lambda: (tl3._upload(blobs, total, dev), sync()), repeat)
    t_k = best_seconds(kernel, repeat)
    t_all = best_seconds(lambda: (tl3.decode_batch(blobs, device, backend="triton"), sync()), repeat)
    return {"resolution": f"{group[0]['width']}x{group[0]['height']}", "images": len(group),
            "megapixels": round(px / 1e6, 2), "l3_megabytes": round(total / 1e6, 1),
            "tables_ms": round(t_tables * 1e3, 2),
            "upload_ms": round(t_up * 1e3, 2), "kernel_ms": round(t_k * 1e3, 2),
            "decode_batch_ms": round(t_all * 1e3, 2),
            "kernel_mpix_per_s": round(px / t_k / 1e6, 1),
            "upload_gb_per_s": round(total / t_up / 1e9, 2)}


def plot(res: dict, out: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    rates = res["decode_mpix_per_s"]
    names = list(rates)
    a.barh(range(len(names)), [rates[n] for n in names],
           color=["tab:green" if "triton" in n else "tab:blue" if "l3" in n else "tab:gray" for n in names])
    a.set_yticks(range(len(names)), names, fontsize=7)
    a.set_xscale("log")
    a.set_xlabel("Mpixel/s (log)")
    a.set_title(f"{res['images']} corpus images, {res['megapixels']} MP, on {res.get('gpu', res['device'])}",
                fontsize=9)
    for be, by_res in res["scaling_mpix_per_s_by_batch"].items():
        for reso, row in by_res.items():
            b.plot([int(k) for k in row], list(row.values()), marker="o", label=f"{be} {reso}")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("images per decode_batch call")
    b.set_ylabel("Mpixel/s (log)")
    b.axhline(rates["l3_c_1_thread"], ls=":", color="k", label="C L3, 1 thread")
    cores = [k for k in rates if k.startswith("l3_c_") and k.endswith("_threads")]
    if cores:
        b.axhline(rates[cores[0]], ls="--", color="k", label=cores[0].replace("_", " "))
    b.legend(fontsize=7)
    b.set_title("batch scaling", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def summary(res: dict) -> str:
    r = res["decode_mpix_per_s"]
    on = res.get("gpu", res["device"])
    return (f"gpu: {res['images']} corpus l3 files ({res['megapixels']} MP) on {on}, "
            f"equal to the C decoder: {res['equal_to_c_decoder']}; MP/s "
            + ", ".join(f"{k} {v}" for k, v in r.items()))


def run_all(work: Path, out_dir: Path) -> dict | None:
    import torch
    if not torch.cuda.is_available():
        print("gpu: no CUDA device here; bench/results/gpu.json is measured on a GPU machine "
              "with `python -m bench.gpu prepare DIR` here and `python -m bench.gpu measure DIR` there")
        return None
    carry = work / "gpu-carry"
    prepare(work, carry)
    res = measure(carry)
    write_result(out_dir, "gpu", res)
    plot(res, out_dir / "gpu.png")
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("step", choices=["prepare", "measure", "plot"])
    p.add_argument("dir", type=Path, help="the folder that carries the JPEGs and manifest")
    p.add_argument("--work", type=Path, default=REPO / ".cache" / "bench")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch-sizes", default="1,4,16,64,256",
                   help="measure: batch sizes of the scaling rows (images repeated)")
    p.add_argument("--dataset", type=Path, help="prepare: mount this dataset instead of building one")
    p.add_argument("--max-images", type=int, help="prepare: only the images with the smallest l3 files")
    a = p.parse_args()
    if a.step == "prepare":
        man = prepare(a.work, a.dir, a.dataset, a.max_images)
        print(f"{len(man['images'])} images, {man['megapixels']} MP: l3 {man['l3_bytes'] / 1e6:.1f} MB, "
              f"qG JPEGs {man['jpeg_bytes'] / 1e6:.1f} MB in {a.dir}")
        return 0
    if a.step == "plot":  # DIR holds a gpu.json measured elsewhere
        plot(json.loads((a.dir / "gpu.json").read_text())["result"], a.dir / "gpu.png")
        return 0
    res = measure(a.dir, a.device, a.repeat, batch_sizes=tuple(int(b) for b in a.batch_sizes.split(",")))
    a.out.mkdir(parents=True, exist_ok=True)
    write_result(a.out, "gpu", res)
    try:
        plot(res, a.out / "gpu.png")
    except ImportError as e:  # matplotlib is the bench extra; the JSON is the result
        print(f"gpu.png not drawn: {e}")
    print(summary(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
