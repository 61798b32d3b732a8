"""pcrfs.torch.GPUImageFolder over the mount (q view, l3 view) and plain folders, on the
CPU device here (the same code runs on CUDA; bench/peers_gpu.py measures it there)."""
import os

import torch
from torchvision import datasets

from pcrfs.torch import GPUImageFolder
from pcrfs.torch.gpu_folder import crop_box


def _labels(folder) -> list[int]:
    out = []
    for _, y in folder:
        out += y.tolist()
    return out


def test_same_samples_as_imagefolder_and_a_whole_epoch(crops_src, crops_ds, mount):
    m = mount(crops_ds)
    for root in (crops_src, m.mnt / "q4"):
        ref = datasets.ImageFolder(str(root))
        g = GPUImageFolder(root, batch_size=64, device="cpu", size=96, seed=1, threads=4)
        assert g.classes == ref.classes and g.class_to_idx == ref.class_to_idx
        assert g.samples == ref.samples and len(g) == 4
        seen = []
        for x, y in g:
            assert x.dtype == torch.float32 and x.shape[1:] == (3, 96, 96) and len(x) == len(y)
            assert -3 < x.mean() < 3 and x.std() > 0.1      # normalised pixels, not zeros
            seen += y.tolist()
        assert sorted(seen) == sorted(ref.targets) and g.skipped == 0
        assert g.epoch == 1


def test_resume_from_a_saved_state_gives_the_same_batches(crops_ds, mount):
    m = mount(crops_ds)
    kw = dict(batch_size=32, device="cpu", size=64, seed=7, normalize=None, threads=4)
    a = GPUImageFolder(m.mnt / "q2", **kw)
    full = [(x.clone(), y.clone()) for x, y in a]
    assert all(x.dtype == torch.uint8 for x, _ in full)
    b = GPUImageFolder(m.mnt / "q2", **kw)
    it = iter(b)
    for _ in range(3):
        next(it)
    state = b.state_dict()
    c = GPUImageFolder(m.mnt / "q2", **kw)
    c.load_state_dict(state)
    rest = list(c)
    assert len(rest) == len(full) - 3
    for (x1, y1), (x2, y2) in zip(full[3:], rest, strict=True):
        assert torch.equal(y1, y2) and torch.equal(x1, x2)
    # the next epoch is another order
    assert [y.tolist() for _, y in GPUImageFolder(m.mnt / "q2", **kw)] == [y.tolist() for _, y in full]
    c.set_epoch(1)
    assert [y.tolist() for _, y in c] != [y.tolist() for _, y in full]


def test_l3_view_and_eval_transform(crops_ds, mount):
    m = mount(crops_ds)
    g = GPUImageFolder(m.mnt / "l3", batch_size=40, device="cpu", size=80, train=False,
                       shuffle=False, threads=4)
    assert len(g.samples) == 240 and all(p.endswith(".l3") for p, _ in g.samples)
    x, y = next(iter(g))
    assert x.shape == (40, 3, 80, 80) and y.tolist() == [t for _, t in g.samples[:40]]


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
