"""The peers' gpu regime (issue 40): the same training input as the other regimes
(RandomResizedCrop(224), flip, normalize; float batches of 64; 2 loader processes), with the
decode on the GPU:

  pcrfs/l3            unmodified reads of MNT/l3 (the lossless L3 files, served by the mount
                      from its transcode tier), decoded by pcrfs.torch.l3.decode_batch
  imagefolder/nvjpeg  the source JPEG files, decoded by torchvision's nvJPEG (decode_jpeg on
                      the device), which is what a torchvision user would do
  dali/dali           DALI's GPU decoder, where it can be installed (its row keeps why not)
  pcrfs/q10_gpufolder pcrfs.torch.GPUImageFolder over MNT/q10 (restart-marked): reader
                      threads, decode_jpeg with its entropy decoding on the GPU, crop, flip
                      and normalize on the device
  pcrfs/tuned_gpufolder  the same over MNT/q{k}, k being peers.json's tuned choice (default 3)
  imagefolder/source_gpufolder  GPUImageFolder over the source JPEGs (the hybrid path)
  */*_threads         the same two without loader processes: the training process reads
                      each batch with 4 threads (pcrfs.torch.ThreadedDataset), so no byte
                      is pickled between processes (an l3 file is ~12x its JPEG's bytes)

The loader processes only read bytes; decoding, cropping, flipping and normalizing run on
the device in the training process, for both arms alike.  Rounds alternate the arms; each
round is `epochs` epochs, and the regime's figure is the median round.  The l3 files are
read once first, so the mount's transcodes are outside the timing (its first_epoch row).

Runs wherever CUDA is (bench/devkit_run.sh on a borrowed GPU host), writing
peers_gpu.json; bench/peers.py takes its rows into peers.json.  On the CPU (device='cpu')
the same code is the test's tiny run."""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from bench.common import REPO, Mounted, du, ensure_dataset, write_result

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DALI_ERROR = ("not installable on the GPU host: it has no network, and DALI's CUDA 13 wheels "
              "(nvidia-dali-cuda130 with nvimgcodec, nvjpeg and nvcomp: 591 MB installed "
              "here) exceed the 64 MiB a call may carry there")


class _Bytes:
    """(file bytes, label): the loader processes only read."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        with open(path, "rb") as f:
            return f.read(), label


def _collate(batch):
    import torch
    return [b for b, _ in batch], torch.tensor([y for _, y in batch])


def augment(images, device, rng):
    """RandomResizedCrop(224) + flip + normalize, per image on `device`, as torchvision's
    transforms do them: the same parameter draws (scale 0.08-1, ratio 3/4-4/3)."""
    import torch
    from torchvision.transforms import RandomResizedCrop
    from torchvision.transforms.v2 import functional as F
    out = torch.empty((len(images), 3, 224, 224), dtype=torch.float32, device=device)
    for n, img in enumerate(images):
        i, j, h, w = RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
        crop = F.resized_crop(img, i, j, h, w, [224, 224], antialias=True)
        if rng.random() < 0.5:
            crop = crop.flip(-1)
        out[n] = crop
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    return out.sub_(mean).div_(std)


def decoder(arm: str, device):
    """blobs -> list of uint8 (3,H,W) tensors on `device`."""
    import torch
    if arm == "l3":
        from pcrfs.torch.l3 import decode_batch

        def dec(blobs):
            x = decode_batch(blobs, device)
            return list(x) if isinstance(x, torch.Tensor) else x
        return dec
    from torchvision.io import ImageReadMode, decode_jpeg

    def dec(blobs):
        data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    return dec


def _loader(items, batch: int, workers: int, threads: int = 0):
    """Shuffled batches of (bytes, label): read by `workers` loader processes, or with
    threads, by that many threads of this process (pcrfs.torch.ThreadedDataset)."""
    import torch
    data = _Bytes(items)
    if threads:
        from pcrfs.torch.threaded import ThreadedDataset
        data, workers = ThreadedDataset(data, threads), 0
    return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True,
                                       num_workers=workers, collate_fn=_collate,
                                       multiprocessing_context="fork" if workers else None)


def epoch(items, arm: str, device, batch: int = 64, workers: int = 2, check: bool = False,
          seed: int = 0, threads: int = 0) -> dict:
    """One shuffled epoch of training input; images/s, and with check the batches'
    shapes and label counts (the test's).  threads: no loader processes; the training
    process reads each batch with that many threads (pcrfs.torch.ThreadedDataset), so no
    byte is pickled between processes."""
    import random

    import torch
    loader = _loader(items, batch, workers, threads)
    dec, rng = decoder(arm, device), random.Random(seed)
    shapes, labels, n, miss = set(), {}, 0, 0
    t0 = time.perf_counter()
    for blobs, y in loader:
        x = augment(dec(blobs), device, rng)
        y = y.to(device, non_blocking=True)
        n += len(blobs)
        if check:
            shapes.add((tuple(x.shape[1:]), str(x.dtype), x.device.type))
            for v in y.tolist():
                labels[v] = labels.get(v, 0) + 1
            # the test's images of class c are saturated in channel c
            miss += int((x.mean(dim=(2, 3)).argmax(dim=1) != y).sum())
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    out = {"images": n, "rate": n / (time.perf_counter() - t0)}
    if check:
        out.update(shapes=sorted(shapes), labels=labels, colour_miss=miss)
    return out


def profile(items, arm: str, device, batch: int = 64, workers: int = 2) -> dict:
    """Where one epoch's time goes: waiting for the loader processes' next batch (reading
    and passing the bytes), decoding, and the crop/flip/normalize, each stage synchronized
    (so slower overall than the timed epochs); ms per batch, and bytes per image."""
    import random

    import torch
    cuda = torch.device(device).type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()
    loader = _loader(items, batch, workers)
    dec, rng = decoder(arm, device), random.Random(0)
    t = {"wait": 0.0, "decode": 0.0, "augment": 0.0}
    batches = nbytes = 0
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            blobs, _ = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        x = dec(blobs)
        sync()
        t2 = time.perf_counter()
        augment(x, device, rng)
        sync()
        t3 = time.perf_counter()
        t["wait"] += t1 - t0
        t["decode"] += t2 - t1
        t["augment"] += t3 - t2
        batches += 1
        nbytes += sum(len(b) for b in blobs)
    return {f"{k}_ms_per_batch": round(1e3 * v / batches, 2) for k, v in t.items()} | {
        "bytes_per_image": round(nbytes / len(items)), "workers": workers}


def folder_epoch(root: Path, device, batch: int = 64, threads: int = 8, seed: int = 0,
                 check: bool = False) -> dict:
    """One epoch of pcrfs.torch.GPUImageFolder (the same crop, flip and normalize)."""
    import torch

    from pcrfs.torch import GPUImageFolder
    g = GPUImageFolder(root, batch_size=batch, device=device, seed=seed, threads=threads)
    g.set_epoch(seed)
    n, labels = 0, {}
    t0 = time.perf_counter()
    for _, y in g:
        n += len(y)
        if check:
            for v in y.tolist():
                labels[v] = labels.get(v, 0) + 1
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    out = {"images": n, "rate": n / (time.perf_counter() - t0), "skipped": g.skipped}
    if check:
        out["labels"] = labels
    return out


def tuned_k(default: int = 3) -> int:
    """peers.json's tuned fidelity for the CPU-bound regime, if measured."""
    import json
    try:
        return int(json.loads((REPO / "bench" / "results" / "peers.json").read_text())
                   ["result"]["pcrfs_choice"]["fidelity"])
    except (OSError, KeyError, ValueError, TypeError):
        return default


def items_of(root: Path, suffix: str | None = None) -> list[tuple[str, int]]:
    """ImageFolder's (path, label) list, unmodified but for the l3 files' suffix."""
    from torchvision import datasets
    valid = (lambda p: p.endswith(suffix)) if suffix else None
    return datasets.ImageFolder(str(root), is_valid_file=valid).samples


def run(src: Path, work: Path, out: Path, device: str = "cuda", rounds: int = 5,
        epochs: int = 3, batch: int = 64, workers: int = 2, threads: int = 4) -> dict:
    import torch
    ds = ensure_dataset(src, work / f"peers-gpu-{src.name}")
    files = items_of(src)
    rows = []
    with Mounted(ds, work / "mnt-peers-gpu") as m:
        l3 = items_of(m.mnt / "l3", suffix=".l3")
        assert [y for _, y in l3] == [y for _, y in files], "l3/ lists other images"
        # arm: (its decoder, its files, loader processes, reader threads)
        arms = {"l3": ("l3", l3, workers, 0), "nvjpeg": ("nvjpeg", files, workers, 0),
                "l3_threads": ("l3", l3, 0, threads), "nvjpeg_threads": ("nvjpeg", files, 0, threads)}
        k = tuned_k()
        folders = {"q10_gpufolder": m.mnt / "q10", "tuned_gpufolder": m.mnt / f"q{k}",
                   "source_gpufolder": src}
        for name in folders:
            arms[name] = ("gpufolder", None, 0, 8)
        rates: dict[str, list[float]] = {a: [] for a in arms}
        first = epoch(l3, "l3", device, batch, workers)           # transcodes, then cached
        epoch(files, "nvjpeg", device, batch, workers)            # warm-up: CUDA, page cache
        for root in folders.values():                             # Triton compile, page cache
            folder_epoch(root, device, batch)
        for r in range(rounds):
            order = list(arms)[r % len(arms):] + list(arms)[:r % len(arms)]
            for arm in order:
                dec, it, procs, thr = arms[arm]
                if dec == "gpufolder":
                    got = [folder_epoch(folders[arm], device, batch, thr, seed=r) for _ in range(epochs)]
                else:
                    got = [epoch(it, dec, device, batch, procs, seed=r, threads=thr)
                           for _ in range(epochs)]
                rates[arm].append(sum(g["images"] for g in got)
                                  / sum(g["images"] / g["rate"] for g in got))
            print(f"  gpu round {r + 1}/{rounds}: " + ", ".join(
                f"{a} {v[-1]:.0f}" for a, v in rates.items()), flush=True)
        l3_bytes = sum(os.path.getsize(p) for p, _ in l3)        # cached in its tier
        prof = {arm: profile(it, arm, device, batch, workers)
                for arm, it in (("l3", l3), ("nvjpeg", files))}
        print(f"  profile: {prof}", flush=True)
        more = {arm: statistics.median(epoch(it, arm, device, batch, 8)["rate"]
                                       for _ in range(3))
                for arm, it in (("l3", l3), ("nvjpeg", files))}
        print(f"  8 loader processes: {more}", flush=True)
    dev_name = torch.cuda.get_device_name(0) if torch.device(device).type == "cuda" else "cpu"
    stored = {"l3": du(ds), "nvjpeg": du(src), "gpufolder": du(ds)}
    for arm, (dec, _, procs, thr) in arms.items():
        system = "imagefolder" if dec == "nvjpeg" or arm == "source_gpufolder" else "pcrfs"
        row = {"system": system, "arm": arm, "regime": "gpu",
               "images_per_s": round(statistics.median(rates[arm]), 1),
               "rounds": [round(x, 1) for x in rates[arm]], "bytes_read": None,
               "stored_bytes": stored[dec], "hit_ratio": None,
               "error": None, "device": dev_name, "host_cores": os.cpu_count(),
               "loader_processes": procs, "reader_threads": thr, "epochs_per_round": epochs}
        if arm in prof:
            row.update(profile=prof[arm], images_per_s_8_loader_processes=round(more[arm], 1))
        if arm == "l3":
            row.update(first_epoch_images_per_s=round(first["rate"], 1),
                       l3_cached_bytes=l3_bytes)
        if arm == "tuned_gpufolder":
            row.update(fidelity=k)
        if arm == "source_gpufolder":
            row.update(stored_bytes=du(src))
        rows.append(row)
    rows.append({"system": "dali", "arm": "dali", "regime": "gpu", "images_per_s": None,
                 "rounds": None, "bytes_read": None, "stored_bytes": None, "hit_ratio": None,
                 "error": DALI_ERROR, "device": dev_name, "host_cores": os.cpu_count()})
    res = {"images": len(files), "source": str(src), "rows": rows,
           "pipeline": "RandomResizedCrop(224) + flip + normalize on the device, float32 "
                       f"batches of {batch}; {workers} loader processes read the bytes "
                       f"(the _threads arms: {threads} threads of the training process)",
           "host": platform.node()}
    write_result(out, "peers_gpu", res)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="the ImageFolder source the other regimes use")
    p.add_argument("--work", type=Path, default=REPO / ".cache" / "bench")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    res = run(a.src, a.work, a.out, a.device, a.rounds, a.epochs)
    for r in res["rows"]:
        print(f"  {r['system']}/{r['arm']}: {r['images_per_s']} images/s"
              + (f" ({r['error']})" if r["error"] else ""))


if __name__ == "__main__":
    main()
