"""`pcrfs model` (issue 20): the paper's equations, and docs/SCALE.md is what the command
written in it produces."""
import math
import shlex
from pathlib import Path

import pytest

from pcrfs.cluster.model import Params, beta, bottleneck_nodes, epoch

from conftest import run_pcrfs

ROOT = Path(__file__).resolve().parents[1]


def test_beta_closed_form_matches_the_papers_medians():
    # the paper's measured medians: 6.9 %, 4.8 %, 3.4 % at local batch 32, 64, 128
    for local, median in ((32, 0.069), (64, 0.048), (128, 0.034)):
        assert abs(beta(256, local) - median) < 0.003
    assert beta(1, 32) == 0.0


def test_equations():
    pr = Params(images=1e6, bytes_per_image=[1e4, 1e5], nodes=8, train_rate=1000,
                storage_rate=1e9, peer_rate=1e9, cache_per_node=5e9, local_batch=32,
                ranks_per_node=2)
    e = epoch(pr)
    d = 1e6 * 1e5
    alpha = 8 * 5e9 / d
    b = math.sqrt((1 - 1 / 8) / (2 * math.pi * 64))
    assert e["alpha"] == pytest.approx(alpha) and e["beta"] == pytest.approx(b)
    assert e["regular"]["io_s"] == pytest.approx(d / 1e9)                         # (2)
    assert e["distributed"]["io_s"] == pytest.approx(
        (1 - alpha) * d / 1e9 + alpha * d / (8 * 1e9) * 7 / 8)                     # (7)
    assert e["locality"]["io_s"] == pytest.approx(
        (1 - alpha) * d / 1e9 + alpha * d * b / (8 * 1e9))                         # (8)
    assert e["training_s"] == pytest.approx(1e6 / 8000)                            # (1)
    assert e["regular"]["cost_s"] == max(e["training_s"], e["regular"]["io_s"] + e["preprocess_s"])
    # (5)/(6): regular loading stops scaling at p = R / (V bytes)
    assert bottleneck_nodes(pr, "regular") == math.ceil(1e9 / (1000 * 1e5))
    assert epoch(pr, k=1)["epoch_bytes"] == 1e6 * 1e4


def test_scale_md_is_generated_by_the_command_in_it(tmp_path):
    text = (ROOT / "docs" / "SCALE.md").read_text()
    cmd = shlex.split(text.split("```\n", 2)[1].strip())
    assert cmd[:2] == ["pcrfs", "model"] and "--markdown" in cmd
    i = cmd.index("--markdown")
    cmd[i + 1] = str(tmp_path / "SCALE.md")
    run_pcrfs(*cmd[1:])
    assert (tmp_path / "SCALE.md").read_text().replace(str(tmp_path / "SCALE.md"),
                                                        "docs/SCALE.md") == text
    for needed in ("ranged GETs", "Index:", "fits up to q", "| locality |",
                   "Disk cache per node", "Steady storage requests/s"):
        assert needed in text


def test_model_from_a_dataset_and_bad_arguments(corpus_ds):
    out = run_pcrfs("model", corpus_ds, "--nodes", "4", "--json").stdout
    import json
    rep = json.loads(out)
    import pcrfs
    with pcrfs.open_dataset(str(corpus_ds)) as ds:
        n = ds.manifest["summary"]["images"]
        assert rep["params"]["images"] == n
        assert rep["params"]["bytes_per_image"][-1] == pytest.approx(
            ds.manifest["summary"]["total_bytes"][f"q{ds.groups}"] / n)
    for args, msg in ((["--nodes", "4"], "needs a dataset"),
                      ([str(corpus_ds), "--fidelity", "99"], "groups"),
                      ([str(corpus_ds), "--nodes", "0"], "positive")):
        p = run_pcrfs("model", *args, check=False)
        assert p.returncode != 0 and msg in p.stderr, p.stderr
