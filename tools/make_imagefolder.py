#!/usr/bin/env python3
"""Arrange real photographs from the corpus into an ImageFolder tree (class/xxx.jpg).

  copy   the original files, distributed over classes (keeps every JPEG variant)
  crops  ImageNet-like images: random crops of the photos resized to WxH, saved at
         quality 90 with 4:2:0 subsampling (Pillow's defaults), as in docs/BENCHMARKS.md
"""
import argparse
import os
import random
import shutil
import sys

from PIL import Image

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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("corpus")
    p.add_argument("out")
    p.add_argument("--mode", choices=["copy", "crops"], default="copy")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--per-class", type=int, default=6, help="copy mode")
    p.add_argument("--smallest", action="store_true", help="copy mode: take the smallest files")
    p.add_argument("--jpeg-only", action="store_true")
    p.add_argument("--count", type=int, default=2000, help="crops mode")
    p.add_argument("--size", default="500x375", help="crops mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="crops mode: encoding processes")
    a = p.parse_args()
    files = corpus_files(a.corpus, a.jpeg_only or a.mode == "copy")
    if not files:
        sys.exit(f"no images in {a.corpus}")
    if a.mode == "copy":
        n = copy_mode(files, a.out, a.classes, a.per_class, a.smallest)
    else:
        n = crops_mode(files, a.out, a.classes, a.count,
                       tuple(int(v) for v in a.size.split("x")), a.seed, a.workers)
    print(f"{a.out}: {n} images in {a.classes} classes")


if __name__ == "__main__":
    main()
