"""The fused decode-crop-resize (csrc/fused.c, pcrfs.jpeg.crop) and FastImageFolder, held
to what torchvision's Pillow path gives for the same box of the same file."""
from __future__ import annotations

import io
import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as F
from PIL import Image
from torchvision import datasets
from torchvision.transforms import InterpolationMode, RandomResizedCrop

from pcrfs.jpeg import JpegError
from pcrfs.jpeg.crop import decode_resized_crop, image_size, random_resized_box
from pcrfs.torch.fast_folder import FastImageFolder, SampleError

from edgecases import cjpeg_encode, views

REGRESSIONS = os.path.join(os.path.dirname(__file__), "fuzz_regressions", "crop")


def photo(w: int, h: int, seed: int = 0) -> Image.Image:
    """Smooth colour gradients with texture and edges: what a photo asks of a resampler."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 128 + 100 * np.sin(x / max(w, 1) * 6 + seed)
    g = 128 + 100 * np.cos(y / max(h, 1) * 5)
    b = 128 + 60 * np.sin((x + y) / 17.0)
    img = np.stack([r, g, b], -1) + rng.normal(0, 6, (h, w, 3))
    img[h // 3: h // 2, w // 4: w // 2] = (30, 200, 90)   # a hard-edged patch
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def encode(im: Image.Image, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, **({"format": "JPEG", "quality": 90} | kw))
    return b.getvalue()


def reference(data: bytes, box, size, flip=False) -> np.ndarray:
    """torchvision's path: ImageFolder's loader, resized_crop (bilinear, antialiased), hflip."""
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    out = F.resized_crop(rgb, *box, [size[0], size[1]] if isinstance(size, tuple) else [size, size],
                         InterpolationMode.BILINEAR, antialias=True)
    if flip:
        out = F.hflip(out)
    return np.asarray(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255 ** 2 / mse)


KINDS = {
    "4:2:0": lambda im: encode(im, subsampling=2),
    "4:2:2": lambda im: encode(im, subsampling=1),
    "4:4:4": lambda im: encode(im, subsampling=0),
    "progressive": lambda im: encode(im, progressive=True),
    "progressive-4:4:4": lambda im: encode(im, progressive=True, subsampling=0),
    "grayscale": lambda im: encode(im.convert("L")),
    "cmyk": lambda im: encode(im.convert("CMYK")),
    "ppm": lambda im: _ppm(im),
    "pgm": lambda im: _ppm(im.convert("L")),
}


def _ppm(im) -> bytes:
    b = io.BytesIO()
    im.save(b, format="PPM")
    return b.getvalue()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_pixels_match_torchvision_per_kind(kind):
    """For 40 random boxes each (DCT scaling on, so 1/8 to 8/8), the fused output is
    within PSNR 30 dB of torchvision's for the same box; measured minimum here is far above
    it (asserted at 30, the issue's target)."""
    data = KINDS[kind](photo(500, 375, seed=len(kind)))
    rng = random.Random(kind)
    worst = 99.0
    for _ in range(40):
        box = random_resized_box(rng, 500, 375)
        flip = rng.random() < 0.5
        size = rng.choice([224, (96, 160), 32])
        got = decode_resized_crop(data, box, size, flip)
        worst = min(worst, psnr(got, reference(data, box, size, flip)))
    assert worst >= 30, f"{kind}: worst PSNR {worst:.1f} dB"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unscaled_crops_equal_pillow_exactly(kind):
    """A box as large as the output (no resize) at 8/8 is Pillow's decode cut out: equal
    bytes.  This pins the column crop (jpeg_crop_scanline), the row skip
    (jpeg_skip_scanlines), the CMYK conversion and the flip."""
    data = KINDS[kind](photo(203, 157, seed=3))
    with Image.open(io.BytesIO(data)) as im:
        full = np.asarray(im.convert("RGB"))
    for top, left, h, w in [(0, 0, 157, 203), (37, 45, 64, 80), (100, 150, 57, 53), (0, 190, 1, 13)]:
        got = decode_resized_crop(data, (top, left, h, w), (h, w), scale=False)
        assert np.array_equal(got, full[top:top + h, left:left + w]), (kind, top, left)
        flipped = decode_resized_crop(data, (top, left, h, w), (h, w), True, chw=True, scale=False)
        assert np.array_equal(flipped.transpose(1, 2, 0), full[top:top + h, left:left + w][:, ::-1])


@pytest.mark.parametrize("w,h", [(1, 1), (1, 2000), (2000, 1), (17, 9)])
def test_extreme_shapes(w, h):
    data = encode(photo(w, h))
    assert image_size(data) == (w, h)
    rng = random.Random(0)
    for _ in range(5):
        box = random_resized_box(rng, w, h)
        got = decode_resized_crop(data, box, 24, rng.random() < 0.5)
        assert got.shape == (24, 24, 3)
        assert psnr(got, reference(data, box, 24)) >= 30 or box[2] * box[3] == 1 or \
            psnr(got, reference(data, box, 24, True)) >= 30


def test_resampler_is_pillows_filter_within_one_level():
    """Lossless input (PPM), so only the resampler differs from torchvision's: noise, any
    size, boxes, flips and output shapes, every pixel within one level of Pillow's.  The
    horizontal pass's SIMD form (split weights, two taps per multiply) and its scalar form at
    the buffer's end (a P6 file is read in place) both have to hold, or whole rows go wrong."""
    rng = random.Random(3)
    worst, equal, total = 0, 0, 0
    for t in range(40):
        w, h = rng.randint(1, 600), rng.randint(1, 600)
        im = Image.fromarray(np.random.default_rng(t).integers(0, 256, (h, w, 3), dtype=np.uint8))
        b = io.BytesIO()
        im.save(b, "PPM")
        data = b.getvalue()
        for _ in range(4):
            box = random_resized_box(rng, w, h) if rng.random() < 0.8 else (0, 0, h, w)
            size, flip = rng.choice([224, 64, 333, 7, (40, 90)]), rng.random() < 0.5
            got = decode_resized_crop(data, box, size, flip).astype(int)
            ref = reference(data, box, size, flip).astype(int)
            worst = max(worst, int(np.abs(got - ref).max()))
            equal += int((got == ref).sum())
            total += got.size
    assert worst <= 1
    assert equal / total > 0.9    # measured 0.96: Pillow rounds its weights its own way


def test_scaling_is_used_and_close():
    """A small output of a large box decodes at 1/8..4/8 and stays close to full-scale."""
    data = encode(photo(1600, 1200))
    box = (0, 0, 1200, 1600)
    scaled = decode_resized_crop(data, box, 64)
    full = decode_resized_crop(data, box, 64, scale=False)
    assert psnr(scaled, full) > 30
    assert psnr(scaled, reference(data, box, 64)) > 30


def test_dc_only_view_decodes_at_one_eighth_and_stays_as_close_to_the_original(corpus):
    """q1 holds one value per 8x8 block: it decodes at 1/8 whatever the box (the full-scale
    decode only interpolates those values, at 64x the pixels) and, over random boxes of
    the corpus's photographs, is as close to the full-fidelity crop as the full-scale
    decode of the same view (measured on the calibrated set: 0.09 dB lower on average;
    with the box mapped at libjpeg's rounded-up scaled size instead of n/8 it was 0.68 dB,
    7.9 dB at worst).  A view with AC coefficients keeps the scale its box allows."""
    rng = random.Random(1)
    ours, full = [], []
    for f in sorted(p for p in corpus.iterdir() if p.suffix == ".jpg")[:24]:
        src = f.read_bytes()
        q = views(src, 0)
        w, h = image_size(src)
        for _ in range(4):
            box = random_resized_box(rng, w, h)
            truth = decode_resized_crop(src, box, 224, scale=False)
            report = {}
            got = decode_resized_crop(q[0], box, 224, report=report)
            assert report["scale"] == 1, (f.name, report)
            ours.append(psnr(got, truth))
            full.append(psnr(decode_resized_crop(q[0], box, 224, scale=False), truth))
            report = {}
            decode_resized_crop(q[1], box, 224, report=report)
            box_n = next((n for n in (1, 2, 4) if box[2] * n >= 8 * 224 and box[3] * n >= 8 * 224), 8)
            assert report["scale"] == box_n, (f.name, box, report)
    assert len(ours) >= 80
    assert np.mean(ours) >= np.mean(full) - 0.3 and min(ours) >= min(full) - 2.0, \
        (np.mean(ours), np.mean(full), min(ours), min(full))


def test_boxes_follow_randomresizedcrop_and_repeat_with_a_seed():
    torch.manual_seed(0)
    ours = random.Random(5)
    for w, h in [(500, 375), (10, 400), (640, 480)]:
        for _ in range(50):
            top, left, bh, bw = random_resized_box(ours, w, h)
            assert 0 <= top and top + bh <= h and 0 <= left and left + bw <= w
    a = [random_resized_box(random.Random(9), 500, 375) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    # the same distribution as torchvision's: compare the mean area share over many draws
    rng = random.Random(1)
    img = torch.zeros(3, 375, 500)
    ta = np.mean([np.prod(RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))[2:])
                  for _ in range(2000)])
    oa = np.mean([np.prod(random_resized_box(rng, 500, 375)[2:]) for _ in range(2000)])
    assert abs(ta - oa) / ta < 0.08


@pytest.mark.parametrize("sample", ["1x1", "2x1", "2x2", "1x2", "4x1", "1x3", "2x3", "gray"])
def test_own_entropy_path_equals_libjpegs_on_every_view(sample):
    """Progressive files go through pcrfs's entropy decoder, which decodes only the restart
    intervals the box's rows meet (plus a margin) into libjpeg's coefficient arrays.  Its
    output must be libjpeg's own, byte for byte: every view (the lower ones are block-
    smoothed from the coefficient precision handed over), restart markers every MCU row,
    every 3 rows and none, random boxes at every DCT scale, flips, the fast IDCT.  A wrong
    interval choice, margin or smoothing state changes rows of the crop."""
    im = photo(301, 227, seed=len(sample))
    src = encode(im.convert("L"), quality=88) if sample == "gray" else cjpeg_encode(im, sample, 88)
    rng = random.Random(sample)
    checked = 0
    for rows in (1, 3, 0):
        for view in views(src, rows)[1:]:
            for _ in range(8):
                box = random_resized_box(rng, 301, 227)
                size = rng.choice([224, 32, (96, 160), 12])
                flip, fast = rng.random() < 0.5, rng.random() < 0.3
                report = {}
                got = decode_resized_crop(view, box, size, flip, fast=fast, report=report)
                want = decode_resized_crop(view, box, size, flip, fast=fast, libjpeg_entropy=True)
                assert report["entropy"] == "pcrfs", (sample, rows)
                assert np.array_equal(got, want), (sample, rows, box, size, report,
                                                   int(np.abs(got.astype(int) - want).max()))
                checked += 1
    assert checked >= 120
    report = {}
    decode_resized_crop(src, (0, 0, 227, 301), 32, report=report)
    assert report["entropy"] == "libjpeg"  # baseline: libjpeg's Huffman decoder is faster


def test_own_entropy_path_reports_damage_it_reads_and_skips_what_it_does_not():
    """Bytes of 0xFF (stuffed) make a code no Huffman table holds.  Put them in the first
    restart interval of the last scan: a box over the top rows reads that interval and gets
    a clear error; a box over the bottom rows never reads it and gets the undamaged file's
    pixels, not garbage."""
    q10 = views(encode(photo(320, 240, seed=5)), 1)[-1]
    sos = q10.rindex(b"\xff\xda")
    start = sos + 2 + int.from_bytes(q10[sos + 2:sos + 4], "big")
    bad = q10[:start + 1] + b"\xff\x00" * 6 + q10[start + 1:]
    with pytest.raises(JpegError, match="damaged"):
        decode_resized_crop(bad, (0, 0, 60, 320), 32)
    assert np.array_equal(decode_resized_crop(bad, (180, 0, 60, 320), 32),
                          decode_resized_crop(q10, (180, 0, 60, 320), 32))


_CROPS_SHA = r"""
import hashlib, random, sys
from pathlib import Path
from pcrfs.jpeg.crop import decode_resized_crop, image_size
rng, h, n = random.Random(3), hashlib.sha1(), 0
for p in sys.argv[1:]:
    data = Path(p).read_bytes()
    w, hh = image_size(data)
    for _ in range(12):
        bw, bh = rng.randint(1, w), rng.randint(1, hh)
        box = (rng.randint(0, hh - bh), rng.randint(0, w - bw), bh, bw)
        size = rng.choice([224, (96, 160), 33, (7, 300), 1])
        norm = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)) if rng.random() < 0.2 else None
        out = decode_resized_crop(data, box, size, rng.random() < 0.5, chw=rng.random() < 0.5,
                                  normalize=norm)
        h.update(out.tobytes())
        n += 1
print(n, h.hexdigest())
"""


def test_resize_gives_the_same_bytes_on_every_instruction_set(tmp_path):
    """The horizontal pass runs eight rows at a time with AVX2, four with SSE2 (pixel pairs
    by pshufb where there is SSSE3), leftovers one at a time; the CHW split uses pshufb
    where it can.  PCRFS_NO_AVX2 and PCRFS_NO_SSSE3 turn those off: every combination must
    give the bytes the others give, over boxes, sizes, flips, layouts and PPM input."""
    paths = []
    for i, (w, h) in enumerate([(301, 227), (64, 500), (500, 40), (9, 9)]):
        im = photo(w, h, seed=i)
        for fmt, kw in (("jpg", {"format": "JPEG", "quality": 90}), ("ppm", {"format": "PPM"})):
            paths.append(tmp_path / f"{i}.{fmt}")
            im.save(paths[-1], **kw)
    runs = set()
    for env in ({}, {"PCRFS_NO_AVX2": "1"}, {"PCRFS_NO_AVX2": "1", "PCRFS_NO_SSSE3": "1"}):
        out = subprocess.run([sys.executable, "-P", "-c", _CROPS_SHA, *map(str, paths)],
                             env=dict(os.environ, **env), capture_output=True, text=True, check=True)
        runs.add(out.stdout.strip())
    assert len(runs) == 1 and runs.pop().startswith("96 ")


@pytest.mark.parametrize("damage", ["truncate", "flip_bytes", "garbage", "empty", "bad_ppm"])
def test_bad_input_is_a_clear_error(damage):
    data = encode(photo(120, 90), progressive=True)
    bad = {"truncate": data[: len(data) // 2],
           "flip_bytes": data[:300] + bytes(b ^ 0x5A for b in data[300:900]) + data[900:],
           "garbage": os.urandom(2000), "empty": b"",
           "bad_ppm": b"P6\n120 90\n255\n" + b"\0" * 100}[damage]
    with pytest.raises(JpegError) as e:
        decode_resized_crop(bad, (0, 0, 90, 120), 32)
    assert str(e.value)


def test_box_and_size_are_checked():
    data = encode(photo(100, 80))
    for box in [(0, 0, 81, 100), (0, 1, 80, 100), (-1, 0, 10, 10), (0, 0, 0, 10)]:
        with pytest.raises(JpegError, match="outside"):
            decode_resized_crop(data, box, 16)
    with pytest.raises(ValueError):
        decode_resized_crop(data, (0, 0, 80, 100), 0)
    with pytest.raises(ValueError):
        decode_resized_crop(data, (0, 0, 80, 100), 16, out=np.empty((16, 16, 3), np.float32))
    with pytest.raises(JpegError, match="too many pixels"):
        decode_resized_crop(data, (0, 0, 80, 100), 16, max_pixels=100)


def test_fuzz_regressions_replay():
    """The fuzz corpus's seeds and any crash it found run without crashing (their first
    16 bytes are the harness's box and size)."""
    files = sorted(os.listdir(REGRESSIONS))
    assert any(f.startswith("seed-") for f in files)
    for name in files:
        with open(os.path.join(REGRESSIONS, name), "rb") as f:
            blob = f.read()[16:]
        try:
            w, h = image_size(blob)
            decode_resized_crop(blob, (0, 0, h, w), 32)
        except JpegError:
            pass


def _folder(root, n_per_class=6, corrupt=None):
    for c, name in enumerate(["cat", "dog", "eel"]):
        d = root / name
        d.mkdir(parents=True)
        for i in range(n_per_class):
            im = photo(160 + 13 * i, 120 + 7 * c, seed=c * 10 + i)
            (d / f"{i}.jpg").write_bytes(encode(im, progressive=i % 2 == 1))
    (root / "eel" / "x.png").write_bytes(b"")     # replaced below: a PNG goes through Pillow
    b = io.BytesIO()
    photo(90, 70).save(b, format="PNG")
    (root / "eel" / "x.png").write_bytes(b.getvalue())
    (root / "dog" / "r.ppm").write_bytes(_ppm(photo(120, 100, seed=7)))
    if corrupt:
        (root / "cat" / corrupt).write_bytes(encode(photo(100, 100))[:200])
    return root


def test_imagefolder_parity_and_samples(tmp_path):
    root = _folder(tmp_path / "ds")
    ours, tv = FastImageFolder(root, size=64, seed=1), datasets.ImageFolder(root)
    assert ours.classes == tv.classes and ours.class_to_idx == tv.class_to_idx
    assert ours.samples == tv.samples and ours.targets == tv.targets
    for i in range(len(ours)):
        x, y = ours[i]
        assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 64, 64) and y == tv.targets[i]
        # the same box through torchvision gives the same picture
        with open(ours.samples[i][0], "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
        box, flip = ours.box(i, w, h)
        ref = reference(data, box, 64, flip)
        assert psnr(x.permute(1, 2, 0).numpy(), ref) >= 30, ours.samples[i][0]
    assert ours.fallbacks >= 1     # the PNG


def test_seeded_samples_repeat_and_epochs_differ(tmp_path):
    root = _folder(tmp_path / "ds")
    a, b = FastImageFolder(root, size=32, seed=3), FastImageFolder(root, size=32, seed=3)
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(len(a)))
    b.set_epoch(1)
    assert not all(torch.equal(a[i][0], b[i][0]) for i in range(len(a)))
    c = FastImageFolder(root, size=32, seed=None)
    assert not all(torch.equal(c[i][0], c[i][0]) for i in range(len(c)))
    v = FastImageFolder(root, size=32, train=False)
    assert torch.equal(v[0][0], v[0][0])      # eval: the centre crop, no randomness


def test_loader_threads_equal_getitem_and_resume(tmp_path):
    root = _folder(tmp_path / "ds")
    ds = FastImageFolder(root, size=48, seed=4)
    loader = ds.loader(batch_size=5, threads=3, seed=11)
    batches = list(loader)
    assert sum(len(y) for _, y in batches) == len(ds) and loader.skipped == 0
    assert all(x.dtype == torch.uint8 and x.shape[1:] == (3, 48, 48) for x, _ in batches)
    # epoch 0's batches equal the per-sample path for the same indices
    order = FastImageFolder(root, size=48, seed=4).loader(5, seed=11).batches()
    ref = FastImageFolder(root, size=48, seed=4)
    for members, (x, y) in zip(order, batches, strict=True):
        assert torch.equal(x, torch.stack([ref[i][0] for i in members]))
        assert y.tolist() == [ref.targets[i] for i in members]
    # resume mid-epoch in a "new process"
    ds2 = FastImageFolder(root, size=48, seed=4)
    first = ds2.loader(5, threads=2, seed=11)
    it = iter(first)
    next(it)
    state = first.state_dict()
    again = FastImageFolder(root, size=48, seed=4).loader(5, threads=2, seed=11)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == len(batches) - 1
    assert torch.equal(rest[0][0], batches[1][0])


def test_a_corrupt_file_costs_only_itself(tmp_path):
    root = _folder(tmp_path / "ds", corrupt="broken.jpg")
    ds = FastImageFolder(root, size=32, seed=0)
    # the default keeps the batch's size: another sample of the batch fills the slot
    loader = ds.loader(batch_size=4, threads=2)
    sizes = [len(y) for _, y in loader]
    assert sizes == [4] * 5 + [len(ds) - 20] and len(sizes) == len(loader)
    assert loader.failed == 1 and loader.replaced == 1 and loader.skipped == 0
    assert "broken.jpg" in loader.errors[0]
    loader = ds.loader(batch_size=4, threads=2, on_error="skip")
    batches = list(loader)
    n = sum(len(y) for _, y in batches)
    assert n == len(ds) - 1 and loader.skipped == 1 and len(batches) == len(loader)
    assert "broken.jpg" in loader.errors[0]
    bad = next(i for i, (p, _) in enumerate(ds.samples) if p.endswith("broken.jpg"))
    with pytest.raises(SampleError, match="broken.jpg"):
        ds[bad]
    with pytest.raises(SampleError):
        list(ds.loader(batch_size=4, on_error="raise"))


def test_dataloader_workers(tmp_path):
    root = _folder(tmp_path / "ds")
    ds = FastImageFolder(root, size=32, seed=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    xs = torch.cat([x for x, _ in dl])
    assert xs.shape == (len(ds), 3, 32, 32)
    assert torch.equal(xs[0], ds[0][0])


def test_normalize_in_c_equals_normalizing_the_uint8_output(tmp_path):
    data = encode(photo(300, 200), progressive=True)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    u = decode_resized_crop(data, (10, 20, 150, 200), 64, True, chw=True)
    f = decode_resized_crop(data, (10, 20, 150, 200), 64, True, normalize=(mean, std))
    ref = (u / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    assert f.dtype == np.float32 and f.shape == (3, 64, 64)
    assert np.abs(f - ref).max() < 1e-5
    root = _folder(tmp_path / "ds")
    ds = FastImageFolder(root, size=32, seed=1, normalize=(mean, std))
    plain = FastImageFolder(root, size=32, seed=1)
    for i in range(len(ds)):       # the PNG (Pillow) and the PPM included
        x, u8 = ds[i][0], plain[i][0].numpy()
        want = (u8 / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
        assert x.dtype == torch.float32 and np.abs(x.numpy() - want).max() < 1e-5
    x, _ = next(iter(ds.loader(batch_size=4, threads=2, shuffle=False)))
    assert x.dtype == torch.float32 and torch.allclose(x[0], ds[0][0])


def test_every_iter_is_a_pass_of_its_own_as_a_dataloader(tmp_path):
    """torch's iteration contract (issue 83): a peeked batch, a pass left with break, or a
    second live iterator takes nothing from another pass; each pass has len(loader)
    batches and ImageFolder's labels, like a DataLoader over ImageFolder; only a whole
    pass moves to the next epoch; a resumed pass starts after the saved batch, and the
    pass after it from the first again."""
    from collections import Counter
    root = _folder(tmp_path / "ds")
    tv = datasets.ImageFolder(root)
    want = Counter(tv.targets)
    ref = torch.utils.data.DataLoader(tv, batch_size=4, collate_fn=lambda b: b)
    ds = FastImageFolder(root, size=32, seed=5)
    loader = ds.loader(batch_size=4, threads=2, seed=7)
    assert len(loader) == len(ref) == len(list(ref))

    def labels(batches):
        return Counter(int(v) for _, y in batches for v in y)

    peeked = next(iter(loader))                                  # peek, then a pass
    whole = list(loader)
    assert len(whole) == len(loader) and labels(whole) == want
    assert torch.equal(peeked[0], whole[0][0])                   # the same epoch's order
    assert loader.epoch == 1                                     # the whole pass moved it
    for i, _ in enumerate(loader):                               # a pass left with break
        if i == 1:
            break
    assert loader.epoch == 1
    again = list(loader)
    assert len(again) == len(loader) and labels(again) == want
    assert not torch.equal(again[0][0], whole[0][0])             # epoch 1: another order
    a, b = iter(loader), iter(loader)                            # two live iterators
    got_a, got_b = [], []
    for xa, xb in zip(a, b, strict=True):
        got_a.append(xa)
        got_b.append(xb)
    assert labels(got_a) == labels(got_b) == want and torch.equal(got_a[0][0], got_b[0][0])
    # resume after 2 batches in a "new process": the next iter() gives batch 3 on, even
    # with the training loop's set_epoch(e) first; the pass after that, the whole epoch
    it = iter(loader)
    head = [next(it), next(it)]
    state = loader.state_dict()
    resumed = FastImageFolder(root, size=32, seed=5).loader(batch_size=4, threads=2, seed=7)
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])
    rest = list(resumed)
    assert len(rest) == len(loader) - 2
    assert labels(head + rest) == want and torch.equal(rest[0][0], list(it)[0][0])
    assert len(list(resumed)) == len(loader)
    # two ranks, each peeked first: together every sample of the epoch once (+ padding)
    ranks = [ds.loader(batch_size=4, threads=2, seed=7, num_replicas=2, rank=r)
             for r in range(2)]
    for r in ranks:
        next(iter(r))
    both = [batch for r in ranks for batch in r]
    assert sum(len(y) for _, y in both) == 2 * math.ceil(len(tv) / 2)
    assert set(labels(both)) == set(want)


def test_loaders_refuse_a_mount_root_a_dataset_and_a_missing_gpu_at_once(crops_ds, mount):
    """One line with the fix, at construction (issue 83): a mount's root or a dataset
    directory where a view was meant; device="cuda" with no CUDA; and GPUImageFolder on
    the CPU warns that FastImageFolder is the CPU path."""
    from pcrfs.torch import GPUImageFolder
    m = mount(crops_ds)
    for cls in (lambda r: FastImageFolder(r, size=32), lambda r: GPUImageFolder(r, 4, device="cpu")):
        with pytest.raises(ValueError, match=r"a pcrfs mount's root: give a view, e\.g\. .*/q5"):
            cls(m.mnt)
        with pytest.raises(ValueError, match="a pcrfs dataset directory.*pcrfs mount"):
            cls(crops_ds)
    if not torch.cuda.is_available():                # (a GPU host takes device="cuda")
        with pytest.raises(ValueError, match="FastImageFolder.loader: device='cuda'.*no CUDA"):
            FastImageFolder(m.mnt / "q5", size=32).loader(4, device="cuda")
        with pytest.raises(ValueError, match="GPUImageFolder: device='cuda'.*no CUDA"):
            GPUImageFolder(m.mnt / "q5", 4)
    with pytest.warns(UserWarning, match="FastImageFolder"):
        GPUImageFolder(m.mnt / "q5", 4, device="cpu")


def test_both_loaders_take_one_shape_and_the_old_calls_still_work(tmp_path):
    """FastLoader(root, batch_size, ...) and GPUImageFolder(root, batch_size, ...) take the
    same keywords with the same defaults, device aside (issue 83): ImageNet's
    normalisation, seed 0, float32 batches.  A FastLoader from a root equals
    FastImageFolder(root, normalize=IMAGENET, seed=0).loader(); the positional calls of
    before work with a DeprecationWarning."""
    import inspect
    import warnings

    from pcrfs.torch import IMAGENET, FastLoader, GPUImageFolder
    fast = inspect.signature(FastLoader.__init__).parameters
    gpu = inspect.signature(GPUImageFolder.__init__).parameters
    assert [k for k in fast if k not in ("ds", "fast")] == [k for k in gpu if k != "root"]
    differ = {k for k in gpu if k not in ("self", "root", "batch_size", "old")
              and gpu[k].default != fast[k].default}
    assert differ == {"device", "seed"}     # FastLoader seed None: the folder's, else 0
    root = _folder(tmp_path / "ds")
    a = FastLoader(root, 4, size=32, threads=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)        # GPUImageFolder on the CPU
        g = GPUImageFolder(root, 4, device="cpu", size=32)
    assert a.seed == g.seed == 0 and a.ds.normalize == IMAGENET
    b = FastImageFolder(root, size=32, normalize=IMAGENET, seed=0).loader(4, threads=2)
    xa, xb = list(a), list(b)
    assert xa[0][0].dtype == torch.float32 and next(iter(g))[0].dtype == torch.float32
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1])
               for p, q in zip(xa, xb, strict=True))
    with pytest.warns(DeprecationWarning, match="pass device, size by keyword"):
        old = GPUImageFolder(root, 4, "cpu", 32)
    assert old.size == 32 and old.device.type == "cpu"
    with pytest.warns(DeprecationWarning, match="pass shuffle, threads by keyword"):
        old = FastLoader(FastImageFolder(root, size=32), 4, False, 1)
    assert not old.shuffle and old.threads == 1
    with pytest.raises(TypeError, match="given twice"):
        GPUImageFolder(root, 4, "cpu", device="cpu")
