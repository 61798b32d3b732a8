#!/usr/bin/env python3
"""pcrfs benchmarks (`make bench`): JSON under bench/results/, PNG plots beside it.

  build   build throughput vs a jpegtran process loop and the in-process ceilings,
          scaling with workers, RSS, size and index ratios
  mount   mount overhead, DataLoader epochs, read amplification, bandwidth-limited
          speedup (Figure 5), index scale (1M entries)
  l3      L3 size vs PNG/WebP, decode Mpixel/s vs PNG/JPEG, /l3/ first vs second epoch
  remote  records on SeaweedFS (S3): read amplification, GETs/image, bandwidth-limited
          speedup vs Theorem 4.1, cold vs warm disk cache
  fidelity MS-SSIM and bytes per view, dynamic switch cost, autotune step cost,
          record-aware vs shuffled sampler under a bandwidth limit
  cache   hit ratio per epoch of the lru and static cache policies, memory and disk tiers
  liquid  MNT/mix vs original JPEGs and qG (CPU-bound), the sweep of bandwidth limit x raw
          share against `pcrfs tune` and the closed form, hit-ratio constancy under -o hold
  cluster 4 --shard mounts of one SeaweedFS dataset as 4 nodes under torchrun: storage
          and peer bytes per epoch of regular, distributed-cache and locality-aware
          loading against `pcrfs model`; the ThreadedDataset workers x threads grid
  gpu     L3 decode_batch on CUDA over the corpus dataset's l3 files (Triton kernel and
          torch operations) checked against the C decoder, Mpixel/s against the CPU
          decoders; needs CUDA, else says so and leaves gpu.json as it is (bench/gpu.py
          prepares here and measures on another machine)
  gpu_decode decode only: pcrfs.torch.decode_jpeg (restart-marked q views on the GPU, the
          hybrid path, the CPU) against nvJPEG and Pillow, crops and large photos, batch 64
          and 256; the restart intervals' byte cost
  dataplane cold files/s and daemon CPU per cold file of a fresh mount (q10, q5, raw, mix)
          by 1..16 reader processes, the lane's cold path in C against Python, and ext4
  fleet   what -o metrics costs (files/s on against off), az:// read amplification and
          GETs/image on Azurite
  supervise what supervision (the default) costs: mount time, cold and warm q10 files/s of
          supervised mounts against -o supervise=no, side by side
  paper   the PCR paper's Table 1 (scan-group sizes) and Table 2 (single-core decode per
          view, Pillow and the fused decoder) on the calibrated set, paper beside measured
  tuner   `pcrfs tune` three times per transform (imagenet, fused) on the calibrated set: are its picks
          stable (the spread of the chosen rate), within the writes it announced
  fused   the fused C decode-crop-resize in one thread: core-ms per image over the sources,
          q10 and q5 against Pillow + torchvision's resized_crop, PSNR for the same boxes
  peers   WebDataset, LitData, MosaicML Streaming, FFCV, DALI and ImageFolder files against
          pcrfs q10/tuned/mix and FastImageFolder's fused arms: conversion, CPU-bound
          epochs, S3 under one tc limit, the second epoch at a 30% cache (--source DIR,
          --regimes; .venv-peers)
  ddp     FastImageFolder's loader under torchrun on the same cores: 2 ranks x 1 thread
          against 1 rank x 2 threads, over q10 and the source JPEGs
  install `make demo` and `.ci/run` each in a fresh clone of HEAD: wall time, tests passed,
          disk (README's setup figures); runs the whole suite, so only with --only install
Ratios are measured side by side in one run; absolute numbers drift on a shared machine."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import common
from bench.common import REPO, write_result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--only", choices=["build", "mount", "l3", "fidelity", "remote", "cache", "fleet",
                                      "liquid", "cluster", "gpu", "gpu_decode", "dataplane", "restart",
                                      "supervise", "peers", "fused", "ddp", "install", "paper", "tuner"],
                   action="append")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--quick", action="store_true", help="shorter runs, 100k-entry scale test")
    p.add_argument("--mount-part", action="append", metavar="PART",
                   help="run only these parts of the mount benchmark (overhead, epoch, "
                        "lane_cost, amplification, bandwidth, scale), merged into mount.json")
    p.add_argument("--source", help="peers, gpu_decode --host-share-only: an ImageFolder tree "
                                    "to use instead of the corpus crops")
    p.add_argument("--host-share-only", action="store_true",
                   help="gpu_decode: only the counted host share and the cost model (no GPU)")
    p.add_argument("--limits", type=int, nargs="+", metavar="MBPS",
                   help="peers: the S3 limits to measure (default: 50 100 25 5)")
    p.add_argument("--regimes", nargs="+", choices=["cpu_local", "s3", "second_epoch_30pct", "gpu"],
                   help="peers: the regimes to measure (default: all)")
    p.add_argument("--set", default="imagenet", choices=["imagenet", "light"],
                   help="paper, peers, tuner: the image set (imagenet: calibrated to the PCR paper's Table "
                        "1, refused if it misses; light: the earlier 22-37 KB crops, written "
                        "to NAME_light.json)")
    p.add_argument("--work", default=str(REPO / ".cache" / "bench"))
    a = p.parse_args()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    only = set(a.only or ["build", "mount", "l3", "fidelity", "remote", "cache", "fleet", "liquid",
                          "cluster", "gpu", "gpu_decode", "dataplane", "restart", "supervise", "fused",
                          "ddp", "paper", "tuner", "peers"])
    if "build" in only:
        common.begin()
        from bench import build
        res = build.bench_build(work, a.images, a.runs, a.workers)
        write_result(out, "build", res)
        build.plot_build(res, out / "build.png")
        print(build.summary(res))
    if "mount" in only:
        common.begin()
        from bench import mount
        res = mount.run_all(work, out, a.images, a.runs, a.quick, a.mount_part)
        print(mount.summary(res))
    if "l3" in only:
        common.begin()
        from bench import l3
        print(l3.summary(l3.run_all(work, out, a.quick)))
    if "remote" in only:
        common.begin()
        import bench.remote_reads as remote
        print(remote.summary(remote.run_all(work, out, a.images, a.quick)))
    if "cache" in only:
        common.begin()
        from bench import cache
        print(cache.summary(cache.run_all(work, out, a.images)))
    if "fleet" in only:
        common.begin()
        from bench import fleet
        print(fleet.summary(fleet.run_all(work, out, a.images, a.quick)))
    if "dataplane" in only:
        common.begin()
        from bench import dataplane
        print(dataplane.summary(dataplane.run_all(work, out, a.images, a.quick)))
    if "restart" in only:
        common.begin()
        from bench import restart
        print(restart.summary(restart.run_all(work, out, a.images, a.quick)))
    if "supervise" in only:
        common.begin()
        from bench import supervise
        print(supervise.summary(supervise.run_all(work, out, a.images, a.quick)))
    if "paper" in only:
        common.begin()
        from bench import paper
        print(paper.summary(paper.run_all(work, out, a.images, a.quick, a.set)))
    if "tuner" in only:
        common.begin()
        from bench import tuner
        print(tuner.summary(tuner.run_all(work, out, a.images, a.quick, a.set)))
    if "fused" in only:
        common.begin()
        from bench import fused
        print(fused.summary(fused.run_all(work, out, a.images, a.quick)))
    if "ddp" in only:
        common.begin()
        from bench import ddp
        print(ddp.summary(ddp.run_all(work, out, a.images)))
    if "peers" in only:
        common.begin()
        from bench import peers
        print(peers.summary(peers.run_all(work, out, a.images, a.quick, a.source, a.regimes, a.runs,
                                          a.limits, a.set)))
    if "liquid" in only:
        common.begin()
        from bench import liquid
        print(liquid.summary(liquid.run_all(work, out, a.images, a.quick)))
    if "cluster" in only:
        common.begin()
        from bench import cluster
        print(cluster.summary(cluster.run_all(work, out, a.images, a.quick)))
    if "gpu" in only:
        common.begin()
        from bench import gpu
        res = gpu.run_all(work, out)
        if res is not None:
            print(gpu.summary(res))
    if "gpu_decode" in only:
        common.begin()
        from bench import gpu_decode
        if a.host_share_only:       # no GPU, no timed arms: the counted targets alone
            print(gpu_decode.host_share_only(work, out, a.source and Path(a.source),
                                             min(a.images, 256)))
        else:
            print(gpu_decode.summary(gpu_decode.run_all(work, out, min(a.images, 512), a.quick)))
    if "fidelity" in only:
        common.begin()
        from bench import fidelity
        print(fidelity.summary(fidelity.run_all(work, out, a.images, a.quick)))
    if "install" in (a.only or []):
        common.begin()
        from bench import install
        print(install.summary(install.run_all(out)))
    if out.resolve() == (REPO / "bench" / "results").resolve():
        # docs/PERFORMANCE.md's tables follow the results (tests/test_docs.py checks it)
        from bench import perf_doc
        perf_doc.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
