"""pcrfs.torch.GPUImageFolder over the mount (q view, l3 view) and plain folders, on the
CPU device here (the same code runs on CUDA; bench/peers_gpu.py measures it there)."""
import os

import pytest
import torch
from torchvision import datasets

from pcrfs.jpeg.crop import random_resized_box as crop_box
from pcrfs.torch import GPUImageFolder

from conftest import run_pcrfs


def _labels(folder) -> list[int]:
    out = []
    for _, y in folder:
        out += y.tolist()
    return out


def test_same_samples_as_imagefolder_and_a_whole_epoch(crops_src, crops_ds, mount):
    m = mount(crops_ds)
    ref = datasets.ImageFolder(str(crops_src))
    src = GPUImageFolder(crops_src, batch_size=64, device="cpu")
    assert src.samples == ref.samples and src.classes == ref.classes
    g = GPUImageFolder(m.mnt / "q4", batch_size=64, device="cpu", size=96, seed=1, threads=4)
    mnt = datasets.ImageFolder(str(m.mnt / "q4"))
    assert g.classes == mnt.classes and g.class_to_idx == mnt.class_to_idx
    assert g.samples == mnt.samples and len(g) == 4
    seen = []
    for x, y in g:
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 96, 96) and len(x) == len(y)
        assert -3 < x.mean() < 3 and x.std() > 0.1      # normalised pixels, not zeros
        seen += y.tolist()
    assert sorted(seen) == sorted(ref.targets) and g.skipped == 0
    assert g.epoch == 1


@pytest.fixture
def small_mount(small_src, tmp_path, mount):
    ds = tmp_path / "ds"
    run_pcrfs("build", small_src, ds, "-q", "--images-per-record", "8")
    return mount(ds)


def test_resume_from_a_saved_state_gives_the_same_batches(small_mount):
    root = small_mount.mnt / "q2"
    kw = dict(batch_size=5, device="cpu", size=32, seed=7, normalize=None, threads=2)
    a = GPUImageFolder(root, **kw)
    full = [(x.clone(), y.clone()) for x, y in a]
    assert len(full) == 5 and all(x.dtype == torch.uint8 for x, _ in full)
    b = GPUImageFolder(root, **kw)
    it = iter(b)
    for _ in range(3):
        next(it)
    state = b.state_dict()
    c = GPUImageFolder(root, **kw)
    c.load_state_dict(state)
    rest = list(c)
    assert len(rest) == len(full) - 3
    for (x1, y1), (x2, y2) in zip(full[3:], rest, strict=True):
        assert torch.equal(y1, y2) and torch.equal(x1, x2)
    # the same epoch again in a new object: the same order; the next epoch: another
    assert [y.tolist() for _, y in GPUImageFolder(root, **kw)] == [y.tolist() for _, y in full]
    c.set_epoch(1)
    assert [y.tolist() for _, y in c] != [y.tolist() for _, y in full]
    with pytest.raises(ValueError):
        GPUImageFolder(root, **(kw | {"seed": 8})).load_state_dict(state)


def test_l3_view_and_eval_transform(small_mount):
    g = GPUImageFolder(small_mount.mnt / "l3", batch_size=10, device="cpu", size=40, train=False,
                       shuffle=False, threads=2)
    assert len(g.samples) == 24 and all(p.endswith(".l3") for p, _ in g.samples)
    x, y = next(iter(g))
    assert x.shape == (10, 3, 40, 40) and y.tolist() == [t for _, t in g.samples[:10]]


def test_a_damaged_file_is_skipped_and_counted(tmp_path, crops_src):
    root = tmp_path / "folder"
    for i, f in enumerate(sorted(next(p for p in crops_src.iterdir() if p.is_dir()).iterdir())[:10]):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        data = f.read_bytes()
        if i == 4:
            data = data[: len(data) // 3]
        (root / f"c{i % 2}" / f.name).write_bytes(data)
    g = GPUImageFolder(root, batch_size=10, device="cpu", size=32, threads=2)
    x, y = next(iter(g))
    assert len(x) == 9 and g.skipped == 1


def test_crop_boxes_follow_randomresizedcrop():
    import random
    rng = random.Random(0)
    for w, h in [(500, 375), (37, 600), (900, 20)]:
        for _ in range(200):
            top, left, ch, cw = crop_box(rng, w, h, (0.08, 1.0), (3 / 4, 4 / 3))
            assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w and ch > 0 and cw > 0
            assert ch * cw <= w * h
    assert os.cpu_count()
