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
            data, damaged = data[: len(data) // 3], f"c{i % 2}/{f.name}"
        (root / f"c{i % 2}" / f.name).write_bytes(data)
    g = GPUImageFolder(root, batch_size=10, device="cpu", size=32, threads=2, on_error="skip")
    x, y = next(iter(g))
    assert len(x) == 9 and g.skipped == 1 and g.failed == 1
    # the default keeps the batch's size (DDP ranks stay in step): a sample of the
    # batch that decoded fills the slot, its own label with it
    g = GPUImageFolder(root, batch_size=10, device="cpu", size=32, threads=2, normalize=None,
                       shuffle=False)
    x, y = next(iter(g))
    assert len(x) == len(y) == 10 and g.failed == 1 and g.replaced == 1
    bad = next(j for j, (p, _) in enumerate(g.samples) if p.endswith(damaged))
    twin = next(j for j in range(10) if j != bad and torch.equal(x[j], x[bad]))
    assert y[bad] == y[twin] == g.samples[twin][1]


def test_crop_boxes_follow_randomresizedcrop():
    import random
    rng = random.Random(0)
    for w, h in [(500, 375), (37, 600), (900, 20)]:
        for _ in range(200):
            top, left, ch, cw = crop_box(rng, w, h, (0.08, 1.0), (3 / 4, 4 / 3))
            assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w and ch > 0 and cw > 0
            assert ch * cw <= w * h
    assert os.cpu_count()


def _torchvision_crop(img, box, flip, size):
    """What torchvision's RandomResizedCrop (antialias) and RandomHorizontalFlip give for
    one uint8 image, box and flip: the per-image reference of the batched path."""
    from torchvision.transforms.v2 import functional as F
    top, left, h, w = box
    out = F.resized_crop(img.float(), top, left, h, w, [size, size], antialias=True)
    return (out.flip(-1) if flip else out).round_().clamp_(0, 255).to(torch.uint8)


def _crops_against_torchvision(sizes, n, hc, wc, kernel) -> tuple:
    """resized_crops over random canvases and boxes (downscaled and upscaled, 1-sample
    edges, flips, images smaller than their canvas) against torchvision per image: the
    largest difference, the samples that differ, all samples."""
    import random

    from pcrfs.torch.crop_resize import resized_crops
    rng = random.Random(3)
    g = torch.Generator().manual_seed(3)
    worst, off, total = 0, 0, 0
    for size in sizes:
        base = torch.randint(0, 256, (n, 3, max(hc // 8, 1), max(wc // 8, 1)), generator=g).float()
        canvas = torch.nn.functional.interpolate(base, size=(hc, wc), mode="bicubic").clamp(0, 255)
        canvas = canvas.round().to(torch.uint8)       # smooth, photo-like content
        boxes, flips, want = [], [], []
        for j in range(n):
            h, w = rng.randint(1, hc), rng.randint(1, wc)          # the image's own size
            box = crop_box(rng, w, h, (0.01, 1.0), (1 / 3, 3)) if j else (h - 1, w - 1, 1, 1)
            flip = rng.random() < 0.5
            boxes.append(box)
            flips.append(flip)
            want.append(_torchvision_crop(canvas[j], box, flip, size))
        got = resized_crops(canvas, torch.tensor(boxes), torch.tensor(flips), size, kernel=kernel)
        d = (got.int() - torch.stack(want).int()).abs()
        worst, off, total = max(worst, int(d.max())), off + int((d > 0).sum()), total + d.numel()
    return worst, off, total


def test_batched_crops_equal_torchvisions_per_image_resize():
    """Every crop of a canvas in two matrix products (float32).  Off by at most one level
    (float32 rounding inside torchvision), and almost never."""
    worst, off, total = _crops_against_torchvision((1, 7, 64, 224), 10, 300, 260, kernel=False)
    assert worst <= 1 and off <= total // 1000, (worst, off, total)


def test_the_resize_kernel_equals_torchvisions_per_image_resize(interpreted):
    """pcrfs.torch.resize_triton (the crop-resize on CUDA) in Triton's interpreter: each
    output pixel from its taps alone, the same boxes and flips, the same tolerance."""
    worst, off, total = _crops_against_torchvision((1, 5, 24), 6, 70, 52, kernel=True)
    assert worst <= 1 and off <= max(total // 1000, 1), (worst, off, total)


def test_the_resize_kernels_taps_are_the_dense_filters_rows():
    """aa_taps (the kernel's weights) holds aa_weights' nonzero weights, where they are."""
    from pcrfs.torch.crop_resize import aa_taps, aa_weights
    start, length = torch.tensor([0, 5, 17, 0]), torch.tensor([40, 3, 1, 7])
    for out in (1, 6, 24):
        dense = aa_weights(start, length, out, 60)
        lo, w = aa_taps(start, length, out)
        rebuilt = torch.zeros_like(dense)
        for n in range(4):
            for i in range(out):
                for k in range(w.shape[2]):
                    if w[n, i, k] != 0:
                        rebuilt[n, i, lo[n, i] + k] = float(w[n, i, k])
        assert torch.allclose(rebuilt, dense, atol=1e-6), out
        assert (dense.count_nonzero(-1) <= w.shape[2]).all()


def test_gpu_folder_batches_are_torchvisions_crops_of_the_decoded_images(small_mount):
    """The batch path's wiring: the same boxes and flips, drawn in member order, applied
    to decode_jpeg's pixels by torchvision's per-image transforms, give the batch."""
    import random

    from pcrfs.torch.jpeg import decode_jpeg
    root = small_mount.mnt / "q3"
    g = GPUImageFolder(root, batch_size=12, device="cpu", size=48, seed=5, normalize=None, threads=2)
    x, y = next(iter(g))
    members = g.batches()[0]
    imgs = decode_jpeg([open(g.samples[i][0], "rb").read() for i in members], "cpu", mode="rgb")
    rng = random.Random((g.seed * 1_000_003 + 0) * 1_000_033 + 1)
    for k, img in enumerate(imgs):
        box = crop_box(rng, img.shape[2], img.shape[1], g.scale, g.ratio)
        want = _torchvision_crop(img, box, rng.random() < 0.5, 48)
        assert (x[k].int() - want.int()).abs().max() <= 1
        assert y[k] == g.samples[members[k]][1]


def test_uploads_keep_values_and_constants_are_made_once_per_device():
    """pcrfs.torch.transfer on the CPU (on CUDA it pins and queues; a GPU host's gpu_decode
    profile lists where a batch still waits, in host_waits)."""
    import numpy as np

    from pcrfs.torch.transfer import constant, upload
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert upload(a, "cpu").tolist() == a.tolist()
    assert upload([(1, 2), (3, 4)], "cpu").tolist() == [[1, 2], [3, 4]]
    assert upload([True, False], "cpu").dtype == torch.bool
    made = []

    def make():
        made.append(1)
        return torch.ones(3)
    assert constant("test-ones", "cpu", make) is constant("test-ones", "cpu", make)
    assert len(made) == 1
