"""L3 lossless images (docs/L3.md): numpy in, bytes out, and back.

The codec is C (csrc/l3.c) and releases the GIL.  Importing this module also registers the
Pillow plugin, so `Image.open("x.l3")` works afterwards."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pcrfs._native import ffi, lib  # noqa: F401  (lib: error codes for callers)
from pcrfs.native import NativeError

MAGIC = b"LLL."
HEADER_SIZE = 13
MAX_PATCH = int(lib.PCR_L3_MAX_PATCH)
# Refuse to allocate more than this for one decoded image (a 64k x 64k RGB image is 12 GiB).
MAX_PIXELS = 1 << 32

_L3_MESSAGES = {
    lib.PCR_E_NOT_L3: 'not an L3 file (no "LLL." magic)',
    lib.PCR_E_BAD_HEADER: "L3 header out of range (width, height or patch size)",
    lib.PCR_E_TRAILING: "bytes after the last L3 patch",
    lib.PCR_E_TRUNCATED: "truncated L3 file",
    lib.PCR_E_CORRUPT: "corrupt L3 row (nbit or length disagrees with its patch)",
}


class L3Error(ValueError):
    def __init__(self, code: int, detail: str = ""):
        self.code = code
        msg = _L3_MESSAGES.get(code) or str(NativeError(code))
        super().__init__(f"{msg}: {detail}" if detail else msg)


@dataclass(frozen=True)
class L3Info:
    width: int
    height: int
    patch: int


def choose_patch(width: int, height: int) -> int:
    """The paper's patch size for a resolution: 32 below 1280x720, 64 up to 1920x1080,
    128 above."""
    return int(lib.pcr_l3_choose_patch(width, height))


def as_rgb(pixels: np.ndarray) -> np.ndarray:
    """HxWx3 uint8, C-contiguous; HxW and HxWx1 (grayscale) become three equal planes."""
    a = np.asarray(pixels)
    if a.dtype != np.uint8:
        raise TypeError(f"L3 encodes uint8 pixels, got {a.dtype}")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"L3 encodes HxWx3 (or grayscale HxW) arrays, got shape {a.shape}")
    return np.ascontiguousarray(a)


def encode(pixels: np.ndarray, patch: int | None = None) -> bytes:
    """L3 bytes of an HxWx3 uint8 array; patch=None picks it from the resolution."""
    a = as_rgb(pixels)
    h, w = a.shape[:2]
    if patch is None:
        patch = choose_patch(w, h)
    if not 1 <= patch <= MAX_PATCH:
        raise ValueError(f"L3 patch size must be 1..{MAX_PATCH} (uint16 patch sizes), got {patch}")
    if not (1 <= w <= 0xFFFFFFFF and 1 <= h <= 0xFFFFFFFF):
        raise ValueError(f"L3 cannot encode a {w}x{h} image")
    cap = ffi.new("size_t *")
    rc = lib.pcr_l3_max_size(w, h, patch, cap)
    if rc != lib.PCR_OK:
        raise L3Error(rc)
    dst = bytearray(cap[0])
    out = ffi.new("size_t *")
    rc = lib.pcr_l3_encode(ffi.from_buffer(a), a.nbytes, w, h, patch, ffi.from_buffer(dst),
                           len(dst), out)
    if rc != lib.PCR_OK:
        raise L3Error(rc)
    del dst[out[0]:]
    return bytes(dst)


def from_jpeg(jpeg) -> bytes | None:
    """L3 bytes of a JPEG's pixels decoded in C, equal to encode() of Pillow's
    Image.open(jpeg).convert("RGB"); None for what the C path leaves to Pillow (CMYK/YCCK,
    or anything libjpeg warns about).  NativeError when libjpeg cannot decode it at all."""
    w, h = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    out = ffi.new("size_t *")
    src = ffi.from_buffer(jpeg)
    rc = lib.pcr_jpeg_to_l3(src, len(jpeg), ffi.NULL, 0, out, w, h)
    if rc == lib.PCR_E_SPACE:
        cap = ffi.new("size_t *")
        rc = lib.pcr_l3_max_size(w[0], h[0], choose_patch(w[0], h[0]), cap)
        if rc != lib.PCR_OK:
            raise L3Error(rc, f"{w[0]}x{h[0]}")
        dst = bytearray(cap[0])
        rc = lib.pcr_jpeg_to_l3(src, len(jpeg), ffi.from_buffer(dst), len(dst), out, w, h)
        if rc == lib.PCR_OK:
            del dst[out[0]:]
            return bytes(dst)
    if rc == lib.PCR_E_UNSUPPORTED:
        return None
    raise NativeError(rc)


def info(data) -> L3Info:
    """Validated header of an L3 file (the size table must account for every byte)."""
    w, h, n = ffi.new("uint32_t *"), ffi.new("uint32_t *"), ffi.new("uint32_t *")
    rc = lib.pcr_l3_info(ffi.from_buffer(data), len(data), w, h, n)
    if rc != lib.PCR_OK:
        raise L3Error(rc)
    return L3Info(w[0], h[0], n[0])


def decode(data, layout: str = "HWC") -> np.ndarray:
    """Pixels of an L3 file: HxWx3 uint8 ("HWC") or 3xHxW ("CHW", no interleaving pass).
    L3Error on anything malformed."""
    hdr = info(data)
    if hdr.width * hdr.height > MAX_PIXELS:
        raise L3Error(lib.PCR_E_BAD_HEADER, f"{hdr.width}x{hdr.height} is too large")
    if layout == "HWC":
        out = np.empty((hdr.height, hdr.width, 3), np.uint8)
        fn = lib.pcr_l3_decode
    elif layout == "CHW":
        out = np.empty((3, hdr.height, hdr.width), np.uint8)
        fn = lib.pcr_l3_decode_planar
    else:
        raise ValueError(f"layout must be 'HWC' or 'CHW', not {layout!r}")
    rc = fn(ffi.from_buffer(data), len(data), ffi.from_buffer(out), out.nbytes)
    if rc != lib.PCR_OK:
        raise L3Error(rc)
    return out


from pcrfs.l3 import pillow as _pillow  # noqa: E402,F401  (registers the plugin)

__all__ = ["L3Error", "L3Info", "MAGIC", "choose_patch", "decode", "encode", "from_jpeg", "info"]
