"""MS-SSIM (numpy, Wang et al. 2003) and `pcrfs info --quality`: known properties, an
independent implementation's values, and the stored per-view report."""
import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFilter

from pcrfs.admin.quality import compute_quality, luminance, ms_ssim, recommend, sample_paths, scales_for
from pcrfs.dataset import open_dataset

from conftest import run_pcrfs


def _photo(h, w, seed=0):
    """Smooth structure plus texture, like a photograph's luma."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w)).astype(np.uint8)
    return np.asarray(Image.fromarray(a).filter(ImageFilter.GaussianBlur(2.5)), dtype=np.float64) * 3 - 200


def _noisy(a, sigma, seed=1):
    return np.clip(a + np.random.default_rng(seed).normal(0, sigma, a.shape), 0, 255)


def test_identical_images_score_one():
    a = np.clip(_photo(256, 320), 0, 255)
    assert ms_ssim(a, a) == pytest.approx(1.0, abs=1e-6)
    assert ms_ssim(a.astype(np.uint8), a.astype(np.uint8)) == pytest.approx(1.0, abs=1e-6)


def test_more_noise_scores_lower():
    a = np.clip(_photo(240, 320), 0, 255)
    scores = [ms_ssim(a, _noisy(a, s)) for s in (1, 4, 10, 25, 60, 120)]
    assert all(x > y for x, y in zip(scores, scores[1:], strict=False)), scores
    assert 0 <= scores[-1] < 0.5 < scores[0] <= 1


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 200), w=st.integers(1, 200), sigma=st.floats(0, 80))
def test_any_shape_scores_in_unit_interval(h, w, sigma):
    a = np.clip(_photo(h, w, seed=h * 1000 + w), 0, 255)
    s = ms_ssim(a, _noisy(a, sigma))
    assert 0.0 <= s <= 1.0 + 1e-6
    assert ms_ssim(a, a) == pytest.approx(1.0, abs=1e-5)


def test_scale_count_follows_image_size():
    assert scales_for((176, 500)) == 5       # 176 / 16 = 11: five 11-pixel scales fit
    assert scales_for((175, 500)) == 4
    assert scales_for((10, 10)) == 1
    with pytest.raises(ValueError):
        ms_ssim(np.zeros((4, 4)), np.zeros((4, 5)))


@pytest.mark.parametrize("shape", [(256, 320), (192, 400)])
@pytest.mark.parametrize("sigma", [3, 15, 50])
def test_matches_an_independent_implementation(shape, sigma):
    torch = pytest.importorskip("torch")   # the torch extra is part of `make test`
    from pytorch_msssim import ms_ssim as reference
    a = np.clip(_photo(*shape), 0, 255)
    b = _noisy(a, sigma)
    want = reference(torch.tensor(a)[None, None], torch.tensor(b)[None, None], data_range=255).item()
    assert ms_ssim(a, b) == pytest.approx(want, abs=1e-4)


def test_recommend_picks_lowest_view_at_threshold():
    views = [{"view": "q1", "ms_ssim_mean": 0.80}, {"view": "q2", "ms_ssim_mean": 0.96},
             {"view": "q3", "ms_ssim_mean": 0.95}, {"view": "q4", "ms_ssim_mean": 1.0}]
    assert recommend(views, 0.95) == "q2"
    assert recommend(views, 0.97) == "q4"
    assert recommend(views, 0.5) == "q1"


def test_quality_of_real_photos(crops_ds):
    ds = open_dataset(str(crops_ds))
    assert sample_paths(ds, 12) == sample_paths(ds, 12)          # deterministic
    assert sample_paths(ds, 12) != sample_paths(ds, 12, seed=1)
    q = compute_quality(ds, sample=12)
    views = q["views"]
    assert [v["view"] for v in views] == ds.views and q["sample"] == 12
    assert views[-1]["ms_ssim_mean"] == 1.0 and views[-1]["full_over_k"] == 1.0
    for v in views:
        assert 0 <= v["ms_ssim_p5"] <= v["ms_ssim_mean"] <= 1
        assert v["mean_bytes"] > 0
    assert views[0]["ms_ssim_mean"] < 0.99 < views[-2]["ms_ssim_mean"]
    # the report's number for one image is what ms_ssim of the decoded views gives
    p = sample_paths(ds, 1)[0]
    one = ms_ssim(luminance(ds.read(p, "q1")), luminance(ds.read(p, ds.views[-1])))
    assert 0 < one < 1


def test_info_quality_computes_once_then_is_instant(crops_ds, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(crops_ds, dst)
    out = run_pcrfs("info", dst, "--quality", "--sample", "10", "--plot", tmp_path / "q.png").stdout
    assert "MS-SSIM against full fidelity" in out and "recommended: q" in out
    stored = json.loads((dst / "quality.json").read_text())
    uuid = json.loads((dst / "manifest.json").read_text())["uuid"]
    assert stored["sample"] == 10 and stored["uuid"] == uuid
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mtime = (dst / "quality.json").stat().st_mtime_ns
    # stored: the second call reuses it, a plain `info` shows it, --json carries it
    again = run_pcrfs("info", dst, "--quality", "--sample", "10").stdout
    assert (dst / "quality.json").stat().st_mtime_ns == mtime
    assert again.split("MS-SSIM")[1] == out.split("MS-SSIM")[1]
    assert "MS-SSIM against full fidelity" in run_pcrfs("info", dst).stdout
    j = json.loads(run_pcrfs("info", dst, "--json", "--threshold", "0.5").stdout)
    assert j["quality"]["recommended"] == recommend(stored["views"], 0.5)
    assert j["quality"]["threshold"] == 0.5
    # a different sample size is computed afresh; a foreign report is ignored
    run_pcrfs("info", dst, "--quality", "--sample", "4")
    assert json.loads((dst / "quality.json").read_text())["sample"] == 4
    stored["uuid"] = "00000000-0000-0000-0000-000000000000"
    (dst / "quality.json").write_text(json.dumps(stored))
    assert "MS-SSIM" not in run_pcrfs("info", dst).stdout
    bad = run_pcrfs("info", dst, "--quality", "--threshold", "1.5", check=False)
    assert bad.returncode == 2 and "--threshold" in bad.stderr
