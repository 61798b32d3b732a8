#!/usr/bin/env python3
"""Arrange real photographs from the corpus into an ImageFolder tree (class/xxx.jpg).

  copy   the original files, distributed over classes (keeps every JPEG variant)
  crops  the light set: random crops of the photos resized to WxH, saved at quality 90
         with 4:2:0 subsampling (Pillow's defaults); about 22-37 KB an image, far lighter
         than ImageNet (bench/README.md, "The two image sets")
  imagenet  the calibrated set: ImageNet's shapes, qualities, chroma layouts and bytes
         (the PCR paper's Table 1); bench/calibration.py checks it (bench/README.md)

The calibrated set is not ImageNet.  The corpus's photographs are wallpapers, smoother
than ImageNet's camera photos, so each crop is sharpened (Pillow's UnsharpMask, radius 2,
100%, threshold 2) to carry the detail per pixel that ImageNet's files have; that
sharpening is the one synthetic step.  Its parameters were fitted so that the set's
statistics fall inside bench/calibration.py's tolerances.
"""
import argparse
import os
import random
import shutil
import sys

from PIL import Image, ImageFilter

Image.MAX_IMAGE_PIXELS = None


def corpus_files(corpus: str, jpeg_only: bool) -> list[str]:
    exts = (".jpg",) if jpeg_only else (".jpg", ".png")
    return sorted(os.path.join(corpus, f) for f in os.listdir(corpus) if f.lower().endswith(exts))


def copy_mode(files, out, classes, per_class, smallest):
    if smallest:
        files = sorted(files, key=os.path.getsize)
    files = files[: classes * per_class]
    for i, f in enumerate(files):
        d = os.path.join(out, f"class_{i % classes:02d}")
        os.makedirs(d, exist_ok=True)
        shutil.copy(f, os.path.join(d, os.path.basename(f)))
    return len(files)


def _save_crop(job):
    i, k, box, flip, out, classes, size, quality = job
    crop = _PHOTOS[k].crop(box).resize(size, Image.BILINEAR)
    if flip:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    d = os.path.join(out, f"n{i % classes:08d}")
    os.makedirs(d, exist_ok=True)
    crop.save(os.path.join(d, f"img_{i:06d}.JPEG"), "JPEG", quality=quality)


_PHOTOS: list = []


def crops_mode(files, out, classes, count, size, seed, workers=1):
    global _PHOTOS
    rnd = random.Random(seed)
    w, h = size
    _PHOTOS = []
    for f in files:
        with Image.open(f) as im:
            im.draft("RGB", (im.width // 4, im.height // 4))  # fast JPEG downscale on load
            _PHOTOS.append(im.convert("RGB"))
    jobs = []
    for i in range(count):      # every random draw here, in order: any --workers, same images
        k = i % len(_PHOTOS)
        im = _PHOTOS[k]
        scale = rnd.uniform(0.35, 1.0)
        cw = int(min(im.width, im.height * w / h) * scale)
        ch = int(cw * h / w)
        x, y = rnd.randint(0, im.width - cw), rnd.randint(0, im.height - ch)
        jobs.append((i, k, (x, y, x + cw, y + ch), rnd.random() < 0.5, out, classes, (w, h), 90))
    if workers > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(workers) as pool:     # children share _PHOTOS
            pool.map(_save_crop, jobs, chunksize=64)
    else:
        for job in jobs:
            _save_crop(job)
    return count


# ImageNet's shapes: mostly at most 500 on the long side (Flickr's "medium" size), landscape
# 4:3 and 3:2 first, then portrait and square, and about one in eight larger
SHAPES = ((500, 375, 40), (500, 333, 20), (375, 500, 15), (500, 500, 8), (333, 500, 5),
          (640, 480, 5), (800, 600, 4), (1024, 768, 3))
# ImageNet's encodings: a survey of the train set (read through its quantization tables)
# found most files at quality 96 without chroma subsampling; the rest spread lower, 4:2:0
QUALITY_96 = 0.7
QUALITY_LOW = (85, 95)
FULL_CHROMA = 0.7
SHARPEN = (2, 100, 2)        # UnsharpMask(radius, percent, threshold): the synthetic step
DOWNSCALE = (3.0, 6.0)       # crop side / output side, from the full-resolution photograph


def photographs(files: list[str]) -> list[str]:
    """The corpus's natural photographs: colour JPEGs of at least 1280 pixels across (its
    screenshots, PNG renders and grey images left out)."""
    out = []
    for f in files:
        if not f.lower().endswith(".jpg") or "screenshot" in os.path.basename(f):
            continue
        with Image.open(f) as im:
            if im.mode == "RGB" and min(im.size) >= 1000 and max(im.size) >= 1280:
                out.append(f)
    return out


def _imagenet_one(job):
    i, f, shape, box, quality, chroma, flip, out, classes = job
    with Image.open(f) as im:
        crop = im.convert("RGB").crop(box).resize(shape, Image.LANCZOS)
    crop = crop.filter(ImageFilter.UnsharpMask(*SHARPEN))
    if flip:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    d = os.path.join(out, f"n{i % classes:08d}")
    os.makedirs(d, exist_ok=True)
    crop.save(os.path.join(d, f"img_{i:06d}.JPEG"), "JPEG", quality=quality,
              subsampling=0 if chroma == "4:4:4" else 2)


def imagenet_mode(files, out, classes, count, seed, workers=1):
    """The calibrated set: every draw here, in order, so any --workers gives the same bytes."""
    rnd = random.Random(seed)
    photos = photographs(files)
    if not photos:
        sys.exit("no colour JPEG photographs of 1280+ pixels in the corpus")
    sizes = {}
    for f in photos:
        with Image.open(f) as im:
            sizes[f] = im.size
    shapes = [(w, h) for w, h, _ in SHAPES]
    weights = [n for _, _, n in SHAPES]
    jobs = []
    for i in range(count):
        f = photos[i % len(photos)]
        W, H = sizes[f]
        w, h = rnd.choices(shapes, weights)[0]
        scale = min(rnd.uniform(*DOWNSCALE), W / w, H / h)
        cw, ch = int(w * scale), int(h * scale)
        x, y = rnd.randint(0, W - cw), rnd.randint(0, H - ch)
        quality = 96 if rnd.random() < QUALITY_96 else rnd.randint(*QUALITY_LOW)
        chroma = "4:4:4" if rnd.random() < FULL_CHROMA else "4:2:0"
        jobs.append((i, f, (w, h), (x, y, x + cw, y + ch), quality, chroma,
                     rnd.random() < 0.5, out, classes))
    if workers > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(workers) as pool:
            pool.map(_imagenet_one, jobs, chunksize=16)
    else:
        for job in jobs:
            _imagenet_one(job)
    return count


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("corpus")
    p.add_argument("out")
    p.add_argument("--mode", choices=["copy", "crops", "imagenet"], default="copy")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--per-class", type=int, default=6, help="copy mode")
    p.add_argument("--smallest", action="store_true", help="copy mode: take the smallest files")
    p.add_argument("--jpeg-only", action="store_true")
    p.add_argument("--count", type=int, default=2000, help="crops and imagenet modes")
    p.add_argument("--size", default="500x375", help="crops mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="crops, imagenet: encoding processes")
    a = p.parse_args()
    files = corpus_files(a.corpus, a.jpeg_only or a.mode == "copy")
    if not files:
        sys.exit(f"no images in {a.corpus}")
    if a.mode == "copy":
        n = copy_mode(files, a.out, a.classes, a.per_class, a.smallest)
    elif a.mode == "imagenet":
        n = imagenet_mode(files, a.out, a.classes, a.count, a.seed, a.workers)
    else:
        n = crops_mode(files, a.out, a.classes, a.count,
                       tuple(int(v) for v in a.size.split("x")), a.seed, a.workers)
    print(f"{a.out}: {n} images in {a.classes} classes")


if __name__ == "__main__":
    main()
