"""The l3 view: every image as an L3 file (docs/L3.md) of its full-fidelity pixels.

Names: `class/foo.jpg` appears as `class/foo.l3`; when two files of a directory share a
stem (foo.jpg and foo.png) both keep their full name instead (foo.jpg.l3, foo.png.l3), so
the mapping is unambiguous and depends only on the directory listing."""
from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable

import numpy as np
from PIL import Image

import pcrfs.l3 as l3
from pcrfs.native import NativeError

NAME = "l3"
SUFFIX = b".l3"


def _stem(name: bytes) -> bytes:
    dot = name.rfind(b".")
    return name[:dot] if dot > 0 else name


def l3_names(files: Iterable[bytes]) -> dict[bytes, bytes]:
    """source file name -> its name in the l3 view, for the files of one directory."""
    files = list(files)
    stems = Counter(_stem(f) for f in files)
    return {f: (_stem(f) if stems[_stem(f)] == 1 else f) + SUFFIX for f in files}


def l3_bytes(jpeg: bytes) -> bytes:
    """The L3 encoding of a JPEG's decoded RGB pixels, as Pillow's decoder gives them
    (grayscale and CMYK converted to RGB, grayscale thus being three equal planes).  The C
    decoder does YCbCr, RGB and grayscale with the GIL released; Pillow the rest."""
    try:
        out = l3.from_jpeg(jpeg)
    except NativeError:
        out = None    # Pillow's decoder words the error (or copes) as it always has
    return out if out is not None else pillow_l3_bytes(jpeg)


def pillow_l3_bytes(jpeg: bytes) -> bytes:
    """l3_bytes through Pillow's decoder and numpy: the reference the C path is held to."""
    with Image.open(io.BytesIO(jpeg)) as im:
        rgb = np.asarray(im.convert("RGB"))
    return l3.encode(rgb)
