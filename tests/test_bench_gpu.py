"""bench/gpu.py, the GPU decode benchmark, runs on a machine this suite never sees, so its
two steps are run here on the CPU: `prepare` through a real mount of the corpus dataset,
`measure` with device cpu.  A broken step would otherwise surface only in a GPU session."""
import json
import shutil
import subprocess
import sys

import pytest


def _run(*args):
    return subprocess.run([sys.executable, "-P", "-m", "bench.gpu", *map(str, args)], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.mounts   # bench.gpu prepare mounts the dataset
def test_prepare_through_the_mount_then_measure(corpus_ds, tmp_path):
    carry, out = tmp_path / "carry", tmp_path / "out"
    p = _run("prepare", carry, "--dataset", corpus_ds, "--max-images", 4, "--work", tmp_path)
    assert p.returncode == 0, p.stderr
    man = json.loads((carry / "manifest.json").read_text())
    assert len(man["images"]) == 4 and len(list((carry / "jpeg").iterdir())) == 4
    assert all(i["path"].startswith("l3/") and i["qg"].startswith(man["top_view"]) for i in man["images"])

    p = _run("measure", carry, "--device", "cpu", "--repeat", 1, "--batch-sizes", "1,2", "--out", out)
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "gpu.json").read_text())["result"]
    assert res["images"] == 4 and res["equal_to_c_decoder"] and res["l3_bytes_equal_mount"]
    assert res["backends_checked"] == ["tensor"]
    assert res["corrupt_rows_rejected"]["tensor"] >= 2
    assert res["decode_mpix_per_s"]["l3_c_1_thread"] > 0
    assert (out / "gpu.png").stat().st_size > 0

    # a JPEG that is not the mount's: measure refuses rather than time other bytes
    victim = carry / "jpeg" / man["images"][0]["file"]
    from PIL import Image
    with Image.open(victim) as im:
        im.rotate(90, expand=True).save(victim, "JPEG", quality=90)
    p = _run("measure", carry, "--device", "cpu", "--repeat", 1, "--batch-sizes", "1", "--out", out)
    assert p.returncode != 0 and "differ from the mount's" in p.stderr + p.stdout


def test_gpu_decode_rehearses_every_gpu_arm_on_the_cpu(corpus, crops_src, tmp_path):
    """bench/gpu_decode.py with device="cpu": every arm the GPU run times (the pcrfs views,
    nvJPEG's through torchvision, l3), the Pillow check, the profile and the host's share,
    on 16 crops and one large photo.  The GPU host's lease is minutes; a crash there costs
    the measurement."""
    # its 16 crops: two of each class of the suite's crops (the bench would cut its own)
    for d in sorted(crops_src.iterdir()):
        (tmp_path / "imagenet-like-16" / d.name).mkdir(parents=True)
        for f in sorted(d.iterdir())[:2]:
            shutil.copy(f, tmp_path / "imagenet-like-16" / d.name)
    assert len(list((tmp_path / "imagenet-like-16").rglob("*.JPEG"))) == 16
    code = ("import json, sys; from pathlib import Path; from bench import gpu_decode; "
            "r = gpu_decode.run_all(Path(sys.argv[1]), Path(sys.argv[2]), images=16, rounds=1, "
            "device='cpu', large=1); print(gpu_decode.summary(r))")
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run([sys.executable, "-P", "-c", code, tmp_path, out], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "gpu_decode.json").read_text())["result"]
    arms = {(r["set"], r["arm"], r["batch"]) for r in res["rows"]}
    for arm in ("pcrfs_q10", "pcrfs_q10_crops", "pcrfs_q10_rows1", "pcrfs_q10_bytes", "pcrfs_q5",
                "pcrfs_q10_plain",
                "pcrfs_source",
                "nvjpeg_source", "nvjpeg_q10", "pcrfs_l3", "cpu_pcrfs_q10", "cpu_pillow_q10"):
        assert ("crops", arm, 64) in arms, arm
    assert ("large", "pcrfs_q10", 256) in arms and ("large", "nvjpeg_source", 256) in arms
    assert all(r["images_per_s"] > 0 and r["mp_per_s"] > 0 for r in res["rows"])
    assert res["pillow_max_difference"] and set(res["pillow_max_difference"].values()) == {0}
    assert {"crops/q10_crops", "crops/q5_crops"} <= set(res["pillow_max_difference"])   # boxes' windows
    assert res["profile"]["crops"]["pixels_ms"] > 0 and res["profile"]["large"]["intervals"] > 0
    assert res["gpu_arms"] == "rehearsed on the CPU"
    assert "crops_b256_pcrfs_q10_over_nvjpeg_source" in res["ratios"]
    for view in ("q10", "q5"):
        share = res["host_share"][view]
        assert share["images"] == 16 and share["pixel_ops"] > 0 and share["intervals"] > 16
    assert not (out / "gpu_decode.partial.json").exists() and (out / "gpu_decode.png").stat().st_size > 0

    # --host-share-only: the counted batch and the cost model for another source, merged
    # into the file without touching the timed arms, no GPU
    p = subprocess.run([sys.executable, "-P", "-m", "bench.run", "--only", "gpu_decode", "--host-share-only",
                        "--source", tmp_path / "imagenet-like-16", "--images", "16", "--out", out,
                        "--work", tmp_path / "work"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    doc = json.loads((out / "gpu_decode.json").read_text())
    assert doc["result"]["rows"] == res["rows"] and doc["result"]["arms_measured"]["time"]
    q10 = doc["result"]["host_share"]["q10"]
    for key in ("host_ms", "device_ops", "device_mb_moved", "predicted_h100_ms", "nvjpeg_h100_ms"):
        assert q10[key] > 0, key
    # one launch per dependency level, not per scan: libjpeg's 10-scan q10 script in 3
    assert q10["scan_positions"] == 10 and q10["entropy_launches"] == 3
    # the pixel stage is its kernels (3 IDCT planes, 1 colour) and one upload; with the
    # entropy stage's one upload, two fills, read-back and launches, within the 16 the
    # issue sets
    assert q10["pixel_ops"] == 4 and q10["device_ops"] == 4 + 1 + 4 + 3 <= 16
    # the device does at least its bytes' time; the host at least the descriptors', of
    # which only the Python side holds the GIL (the C call releases it)
    assert q10["predicted_h100_ms"] >= q10["bytes_ms"] > 0
    assert q10["host_total_ms"] >= q10["descriptors_ms"] > 0 and 0 < q10["descriptors_c_ms"]
    assert q10["host_ms"] == pytest.approx(q10["descriptors_gil_ms"] + q10["dispatch_ms"], abs=0.02)
    # lanes in lock step and the chunked walk: under the same model, less than the
    # program-per-interval kernel they replaced (a coefficient a step to the band's end)
    assert 0 < q10["entropy_ms"] < q10["replaced_kernel_entropy_ms"]
    # the decode path's kernels assembled for sm_80 and Hopper by Triton's ptxas: no spills
    assert set(q10["kernels"]) == {"entropy_intervals", "smoothing", "idct", "ycc_rgb", "resize"}
    # GPUImageFolder's batch (RandomResizedCrop boxes): only the windows' intervals and
    # blocks, in as few device operations, and the resize kernel's taps, not the dense
    # products' whole canvases
    crops = q10["crops"]
    assert 0 < crops["intervals_share"] <= 1 and 0 < crops["blocks_share"] < 1
    assert crops["entropy_bytes"] <= q10["entropy_bytes"] and crops["device_ops"] <= 16
    assert 0 < crops["resize_gflop"] < crops["matmul_resize_gflop"] and crops["predicted_h100_ms"] > 0
    # q5 (incomplete: block smoothing) in a few kernels too, not torch's hundreds of ops
    q5 = doc["result"]["host_share"]["q5"]
    assert q5["pixel_ops"] <= 7 * q5["canvases"]      # 3 smoothing, 3 IDCT, 1 colour a canvas
    for kern in q10["kernels"].values():
        assert all(k["spill_bytes"] == 0 for k in kern.values())
    kern = q10["kernels"]["entropy_intervals"]
    assert set(kern) == {"sm_80", "sm_90a"} and all(k["registers"] > 0 and k["spill_bytes"] == 0
                                                    for k in kern.values())
    # calibrated on gpu.json's L3 kernel: exact where fitted, within 2x on the other batch
    points = doc["result"]["host_share"]["model"]["calibration"]["points"]
    assert points[0]["predicted_over_measured"] == 1.0 and 0.5 < points[1]["predicted_over_measured"] < 2
