"""Generated edge-case inputs for the build (docs/BENCHMARKS.md's list), with what each
should become: 'jpeg' (transcoded, pixel-identical), 'converted', or 'skipped'."""
from __future__ import annotations

import io
import struct
import subprocess

import numpy as np
from PIL import Image


def photo_like(w: int, h: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus mild noise: compresses like a photo, unlike pure noise."""
    rnd = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (7 + seed) + c) * np.cos(y / 11) for c in range(3)], -1)
    img += rnd.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def save(im: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def jpegtran(data: bytes, *args: str) -> bytes:
    return subprocess.run(["jpegtran", *args], input=data, capture_output=True,
                          check=True).stdout


def cjpeg_encode(im: Image.Image, sample: str, quality: int = 85) -> bytes:
    """im encoded by cjpeg with the chroma sampling `sample` (e.g. "2x2", "2x1,1x2,1x1")."""
    return subprocess.run(["cjpeg", "-sample", sample, "-quality", str(quality)], input=save(im, "PPM"),
                          capture_output=True, check=True).stdout


def views(jpeg: bytes, restart_rows: int) -> list[bytes]:
    """Every q view's file of one image, as a build with restart_rows writes them."""
    from pcrfs import native
    t = native.transcode(jpeg, restart_rows=restart_rows).data
    return [t[:e] + b"\xff\xd9" for e in native.split_scans(t)]


def exif_with_thumbnail(thumb: bytes) -> bytes:
    """APP1 Exif payload: IFD0 with Orientation, IFD1 pointing at a JPEG thumbnail."""
    le = b"II*\x00" + struct.pack("<I", 8)
    ifd0 = struct.pack("<H", 1) + struct.pack("<HHII", 0x0112, 3, 1, 6)
    ifd1_off = 8 + len(ifd0) + 4
    ifd1 = struct.pack("<H", 2)
    thumb_off = ifd1_off + 2 + 2 * 12 + 4
    ifd1 += struct.pack("<HHII", 0x0201, 4, 1, thumb_off) + struct.pack("<HHII", 0x0202, 4, 1, len(thumb))
    return b"Exif\x00\x00" + le + ifd0 + struct.pack("<I", ifd1_off) + ifd1 + b"\0\0\0\0" + thumb


def edge_cases() -> dict[bytes, tuple[bytes, str]]:
    """relative path (bytes) -> (file content, expected outcome)."""
    rgb = Image.fromarray(photo_like(320, 240))
    base = save(rgb, quality=90)
    thumb = save(Image.fromarray(photo_like(160, 120, 3)), quality=95)
    cmyk = save(rgb.convert("CMYK"), quality=90)
    twelve = bytearray(base)
    sof = twelve.find(b"\xff\xc0")
    twelve[sof + 4] = 12
    gif = io.BytesIO()
    frames = [rgb.convert("P"), Image.fromarray(photo_like(320, 240, 5)).convert("P")]
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    cases = {
        b"jpeg/baseline_420.jpg": (base, "jpeg"),
        b"jpeg/baseline_444.jpg": (save(rgb, quality=92, subsampling=0), "jpeg"),
        b"jpeg/baseline_422.jpg": (save(rgb, quality=85, subsampling=1), "jpeg"),
        b"jpeg/grayscale.jpg": (save(rgb.convert("L"), quality=90), "jpeg"),
        b"jpeg/cmyk.jpg": (cmyk, "jpeg"),
        b"jpeg/progressive_in.jpg": (save(rgb, quality=90, progressive=True), "jpeg"),
        b"jpeg/restart_markers.jpg": (jpegtran(base, "-restart", "1"), "jpeg"),
        b"jpeg/arithmetic.jpg": (jpegtran(base, "-arithmetic"), "jpeg"),
        b"jpeg/exif_thumbnail.jpg": (save(rgb, quality=90, exif=exif_with_thumbnail(thumb)), "jpeg"),
        b"jpeg/one_pixel.jpg": (save(Image.new("RGB", (1, 1), (200, 10, 30))), "jpeg"),
        b"jpeg/thin_tall.jpg": (save(Image.fromarray(photo_like(1, 3000))), "jpeg"),
        b"jpeg/thin_wide.jpg": (save(Image.fromarray(photo_like(3000, 1))), "jpeg"),
        b"jpeg/trailing_garbage.jpg": (base + b"CAMERA-TRAILER" * 10, "jpeg"),
        b"names/with space.jpg": (base, "jpeg"),
        "names/ünïcödé ✓.jpg".encode(): (base, "jpeg"),
        b"names/latin1_\xe9\xff.jpg": (base, "jpeg"),
        b"names/deep/er/nested.jpg": (base, "jpeg"),
        b"other/rgba.png": (save(Image.fromarray(photo_like(64, 48)).convert("RGBA"), "PNG"), "converted"),
        b"other/gray.png": (save(rgb.convert("L"), "PNG"), "converted"),
        b"other/image.bmp": (save(rgb, "BMP"), "converted"),
        b"other/image.webp": (save(rgb, "WEBP", lossless=True), "converted"),
        b"other/image.tiff": (save(rgb, "TIFF"), "converted"),
        b"other/animated.gif": (gif.getvalue(), "converted"),
        b"other/jpeg_named.png": (base, "jpeg"),  # content decides, not the name
        b"bad/empty.jpg": (b"", "skipped"),
        b"bad/truncated.jpg": (base[: len(base) // 2], "skipped"),
        b"bad/header_only.jpg": (base[:400], "skipped"),
        b"bad/not_an_image.txt": (b"just some notes, not pixels\n" * 20, "skipped"),
        b"bad/garbage.jpg": (b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8, "skipped"),
        b"bad/twelve_bit.jpg": (bytes(twelve), "skipped"),
    }
    return cases
