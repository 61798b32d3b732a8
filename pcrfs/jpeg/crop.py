"""Decode, crop and resize in one C step (csrc/fused.c): the CPU-bound training path.

`decode_resized_crop(data, box, size)` gives what torchvision's
`RandomResizedCrop`/`F.resized_crop` gives for the same box of the same file (Pillow's
decode, crop, antialiased bilinear resize), but decodes at the smallest DCT scale n/8 whose
crop still covers `size`, and only the crop's iMCU columns and rows.  JPEG (baseline and
progressive; gray, YCbCr, RGB, CMYK) and binary PPM (the raw/ and mix/ views).  numpy only;
the GIL is released in C, so threads decode in parallel."""
from __future__ import annotations

import math
import random

import numpy as np

from pcrfs._native import ffi, lib
from pcrfs.jpeg import JpegError

MAX_PIXELS = 1 << 28      # 16k x 16k: a header asking for more is refused before any work
_REASONS = {
    lib.PCR_E_ARG: "invalid argument",
    lib.PCR_E_NOT_JPEG: "neither JPEG nor binary PPM",
    lib.PCR_E_TRUNCATED: "truncated image",
    lib.PCR_E_RANGE: "crop box outside the image",
    lib.PCR_E_SPACE: "output too small",
    lib.PCR_E_JPEG: "libjpeg error",
    lib.PCR_E_CORRUPT: "corrupt JPEG data",
    lib.PCR_E_NOMEM: "out of memory",
    lib.PCR_E_BAD_HEADER: "malformed PPM header",
    lib.PCR_E_UNSUPPORTED: "unsupported PPM (maxval other than 255)",
    lib.PCR_E_TOO_LARGE: "too many pixels",
}


def _error(rc: int, message: bytes | None = None) -> JpegError:
    reason = _REASONS.get(rc, f"error {rc}")
    if message:
        reason += ": " + message.decode(errors="replace")
    return JpegError(rc, reason)


def image_size(data) -> tuple[int, int]:
    """(width, height) from the header of a JPEG or binary PPM."""
    w, h, kind = ffi.new("uint32_t *"), ffi.new("uint32_t *"), ffi.new("int32_t *")
    rc = lib.pcr_image_size(ffi.from_buffer(data), len(data), w, h, kind)
    if rc != lib.PCR_OK:
        raise _error(rc)
    return w[0], h[0]


def _size2(size) -> tuple[int, int]:
    """(height, width) from an int or a pair, as torchvision takes `size`."""
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def decode_resized_crop(data, box, size, flip: bool = False, *, chw: bool = False,
                        normalize=None, fast: bool = False, scale: bool = True, out=None,
                        max_pixels: int = MAX_PIXELS, libjpeg_entropy: bool = False,
                        report: dict | None = None) -> np.ndarray:
    """The box (top, left, height, width: RandomResizedCrop.get_params' order) of the image
    in `data`, resized to `size` (int or (height, width)) and mirrored if `flip`, as uint8
    HWC (chw=True: CHW).  normalize=(mean, std), per channel on 0..1 as torchvision's
    Normalize takes them: float32 CHW, (v / 255 - mean) / std, computed in the same C pass.
    fast: libjpeg's fast IDCT without fancy upsampling; scale=False: no DCT-domain
    scaling.  libjpeg_entropy: decode a progressive file's scans with libjpeg-turbo (all of
    them) instead of pcrfs's decoder (only the restart intervals the box's rows meet); the
    pixels are the same.  report: a dict to fill with what the call did: the source's width
    and height, the DCT scale n (of n/8) and which entropy decoder ran.  out: a C-contiguous
    array of the result's shape and dtype to fill.
    Raises JpegError for damaged or unsupported input and for a box outside the image."""
    oh, ow = _size2(size)
    top, left, bh, bw = (int(v) for v in box)
    chw = chw or normalize is not None
    shape, dtype = ((3, oh, ow) if chw else (oh, ow, 3)), (np.float32 if normalize else np.uint8)
    if out is None:
        out = np.empty(shape, dtype)
    elif out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {np.dtype(dtype).name} array of shape {shape}")
    crop = ffi.new("pcr_crop *")
    crop.top, crop.left, crop.height, crop.width = top, left, bh, bw
    if not (0 < ow <= 65535 and 0 < oh <= 65535):
        raise ValueError(f"size out of range: {size}")
    crop.out_width, crop.out_height = ow, oh
    crop.flip = int(bool(flip))
    crop.flags = ((lib.PCR_CROP_CHW if chw else 0) | (lib.PCR_CROP_FAST if fast else 0)
                  | (0 if scale else lib.PCR_CROP_FULL_SCALE)
                  | (lib.PCR_CROP_FLOAT if normalize is not None else 0)
                  | (lib.PCR_CROP_LIBJPEG_ENTROPY if libjpeg_entropy else 0))
    if normalize is not None:
        mean, std = normalize
        for c in range(3):
            crop.mean[c] = 255.0 * mean[c]
            crop.inv_std[c] = 1.0 / (255.0 * std[c])
    crop.max_pixels = max_pixels
    res = ffi.new("pcr_crop_result *")
    rc = lib.pcr_decode_resized_crop(ffi.from_buffer(data), len(data), crop,
                                     ffi.from_buffer(out), out.nbytes, res)
    if rc != lib.PCR_OK:
        raise _error(rc, ffi.string(res.message))
    if report is not None:
        report.update(width=res.width, height=res.height, scale=res.scale,
                      entropy="pcrfs" if res.entropy else "libjpeg")
    return out


def center_box(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """(top, left, height, width): the centre square that Resize(size / 0.875) +
    CenterCrop(size), the evaluation transform, keeps of a width x height image."""
    short = min(width, height)
    side = min(short, max(1, round(size * short / round(size / 0.875))))
    return (height - side) // 2, (width - side) // 2, side, side


def random_resized_box(rng: random.Random, width: int, height: int, scale=(0.08, 1.0),
                       ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, height, width): torchvision's RandomResizedCrop.get_params, drawn from
    rng (the same steps, so the same distribution; a seeded rng repeats its boxes)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
