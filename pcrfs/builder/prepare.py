"""One image in, its scan segments out: the work each build worker process does.

JPEGs are transcoded losslessly (same coefficients) to progressive form in-process by the
C helper; other images are first encoded as JPEG at the requested quality."""
from __future__ import annotations

import io
import os
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from pcrfs import native
from pcrfs.format.checksum import block_checksum
from pcrfs.views.l3 import l3_bytes

JPEG_MAGIC = b"\xff\xd8\xff"
MAX_PIXELS = 178_956_970   # what Pillow refuses outright (2 x its MAX_IMAGE_PIXELS)
# pcrfs applies its own --max-pixels from the header alone, before anything is decoded
Image.MAX_IMAGE_PIXELS = None


@dataclass(frozen=True)
class PrepareOptions:
    keep_metadata: str = "default"
    quality: int = 95
    scan_script: tuple | None = None
    script_components: int = 0
    l3: bool = False            # also compute the l3 view's size and checksum
    max_pixels: int = MAX_PIXELS
    restart_rows: int = 0       # a restart marker every N MCU rows of every scan (0: none)
    restart_bytes: int = 0      # > 0: each scan's intervals of at most N entropy-coded bytes


@dataclass
class Prepared:
    relpath: bytes
    label: int
    ok: bool
    reason: str = ""
    data: bytes = b""          # the progressive JPEG (without trailing bytes after EOI)
    ends: tuple = ()           # scan end offsets in data
    width: int = 0
    height: int = 0
    components: int = 0
    converted: bool = False
    source_bytes: int = 0
    warning: str = ""
    l3_size: int = 0
    l3_xxh: int = 0

    def segments(self) -> list[bytes]:
        out, start = [], 0
        for e in self.ends:
            out.append(self.data[start:e])
            start = e
        return out


def _to_jpeg(raw: bytes, quality: int) -> bytes:
    with Image.open(io.BytesIO(raw)) as im:
        im.seek(0)  # first frame of GIF/TIFF/WebP animations
        im.load()
        if im.mode in ("L", "1", "I;16", "I", "F"):
            im = im.convert("L")
        elif im.mode == "CMYK":
            pass
        else:
            im = im.convert("RGB")  # drops alpha: JPEG has none
        out = io.BytesIO()
        im.save(out, "JPEG", quality=quality)
        return out.getvalue()


def _too_many(w: int, h: int, limit: int) -> str:
    return f"too many pixels: {w}x{h} = {w * h} > --max-pixels {limit} (decompression bomb?)"


def prepare(src_root: bytes, relpath: bytes, label: int, opts: PrepareOptions) -> Prepared:
    """prepare_data on the file SRC_ROOT/RELPATH."""
    try:
        with open(os.path.join(src_root, relpath), "rb") as f:
            raw = f.read()
    except OSError as e:
        return Prepared(relpath, label, ok=False, reason=f"unreadable: {e.strerror}")
    return prepare_data(raw, relpath, label, opts)


def prepare_data(raw: bytes, relpath: bytes, label: int, opts: PrepareOptions) -> Prepared:
    """One source image's bytes in, its scans (or the reason it is skipped) out."""
    res = Prepared(relpath, label, ok=False)
    res.source_bytes = len(raw)
    if not raw:
        res.reason = "empty file"
        return res
    if not raw.startswith(JPEG_MAGIC):
        try:  # the header alone: a decompression bomb is refused before any decoding
            with Image.open(io.BytesIO(raw)) as probe:
                w, h = probe.size
            if w * h > opts.max_pixels:
                res.reason = _too_many(w, h, opts.max_pixels)
                return res
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
            pass   # not something Pillow can size: the steps below give the precise reason
        try:
            raw = _to_jpeg(raw, opts.quality)
            res.converted = True
        except UnidentifiedImageError:
            res.reason = "not an image (no known image format)"
            return res
        except (OSError, ValueError, SyntaxError) as e:
            res.reason = f"unreadable image: {e}"
            return res
        except Image.DecompressionBombError as e:
            res.reason = f"image too large: {e}"
            return res
    try:  # JPEGs get the pixel limit in C, from the header, before any decoding
        t = native.transcode(raw, opts.keep_metadata, opts.scan_script, opts.script_components,
                             opts.max_pixels, opts.restart_rows, opts.restart_bytes)
        ends = native.split_scans(t.data)
    except native.NativeError as e:
        res.reason = (_too_many(*e.size, opts.max_pixels) if hasattr(e, "size")
                      else f"JPEG rejected: {e}")
        return res
    res.ok = True
    res.data = t.data[: ends[-1]]
    res.ends = tuple(ends)
    res.width, res.height, res.components = t.width, t.height, t.components
    res.warning = t.message if t.warnings else ""
    if opts.l3:
        # Exactly the bytes the mount will produce from q_G.  The source holds the same
        # coefficients, so its (baseline, cheaper) decode gives the same pixels; except
        # where libjpeg warned or a custom script may leave coefficients unrefined, when
        # q_G itself is decoded.
        same = opts.scan_script is None and not t.warnings
        try:
            out = l3_bytes(raw if same else res.data + native.EOI)
        except (OSError, ValueError, SyntaxError) as e:
            res.ok = False
            res.reason = f"cannot decode for the l3 view: {e}"
            return res
        res.l3_size, res.l3_xxh = len(out), block_checksum(out)
    return res
