"""bench/gpu.py, the GPU decode benchmark, runs on a machine this suite never sees, so its
two steps are run here on the CPU: `prepare` through a real mount of the corpus dataset,
`measure` with device cpu.  A broken step would otherwise surface only in a GPU session."""
import json
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
