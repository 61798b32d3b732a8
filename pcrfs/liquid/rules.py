"""Liquid's mixed-format dataset, the rules every part shares (docs/LIQUID.md).

- Which images are raw: rank(ordinal) < share, with a rank of its own (salted, so the
  raw set is independent of what a static cache tier holds).  Subsets are nested: a
  larger share contains every smaller one, so packs made for 0.3 serve a mount at 0.2.
- A raw file is binary PPM (P6, maxval 255) of the pixels torchvision's default loader
  gets from the qG file: Image.open(...).convert("RGB").  Its size follows from the
  image's width and height, so it is exact before any read.
- The mix a mount serves: -o mix=R,mix_fidelity=K, else what `pcrfs tune` stored in the
  dataset (liquid.json), else the materialized share at full fidelity."""
from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image

from pcrfs.errors import DatasetError, PcrfsError
from pcrfs.format import RAW_SUMMARY, TUNED
from pcrfs.format.manifest import check_self_sum, json_text, write_json_atomic
from pcrfs.storage.cache import ranks

# the tuner's choice, at the dataset root: TUNED (pcrfs/format)
_SALT = np.uint64(0x5241_5750_4D49_5831)   # "RAWPMIX1"


_ESCAPES = {b"\\": b"\\\\", b"\t": b"\\t", b"\n": b"\\n"}
_UNESCAPES = {v: k for k, v in _ESCAPES.items()}


def tsv_escape(path: bytes) -> bytes:
    """A path as a mix.tsv field: backslash, tab and newline written \\\\, \\t, \\n."""
    return re.sub(rb"[\\\t\n]", lambda m: _ESCAPES[m.group()], path)


def tsv_unescape(field: bytes) -> bytes:
    return re.sub(rb"\\[\\tn]", lambda m: _UNESCAPES[m.group()], field)


def raw_ranks(ordinals) -> np.ndarray:
    return ranks(np.asarray(ordinals, dtype=np.uint64) ^ _SALT)


def raw_mask(ordinals, share: float) -> np.ndarray:
    """Which of these images are raw at `share` (bool array)."""
    return raw_ranks(ordinals) < share


def is_raw(ordinal: int, share: float) -> bool:
    return bool(raw_mask([ordinal], share)[0])


def ppm_header(width: int, height: int) -> bytes:
    return b"P6\n%d %d\n255\n" % (width, height)


def ppm_size(width: int, height: int) -> int:
    return len(ppm_header(width, height)) + 3 * width * height


def ppm_bytes(jpeg) -> bytes:
    """The PPM of a JPEG's pixels as torchvision's loader decodes them."""
    with Image.open(io.BytesIO(jpeg)) as im:
        rgb = im.convert("RGB")
        return ppm_header(*rgb.size) + rgb.tobytes()


@dataclass(frozen=True)
class MixOptions:
    share: float | None = None      # raw share of MNT/mix (None: stored or materialized)
    fidelity: int | None = None     # k of the JPEG part (None: stored, else G)
    seq: tuple[int, ...] | None = None   # the b_k views (None: stored; (0,): every k)
    hold: int = 0                   # bytes of mix/raw files held in memory (static)


def parse_share(text: str, what: str) -> float:
    try:
        r = float(text)
    except ValueError:
        r = -1.0
    if not 0.0 <= r <= 1.0:
        raise PcrfsError(f"{what}: expected a raw share between 0 and 1, got {text!r}")
    return r


def read_summary(root: str) -> dict | None:
    """raw.json of a dataset (what `materialize` made), or None."""
    return _read(os.path.join(root, RAW_SUMMARY))


def read_tuned(root: str) -> dict | None:
    """liquid.json: the (share, fidelity) `pcrfs tune` chose, or None."""
    return _read(os.path.join(root, TUNED))


def write_tuned(root: str, choice: dict) -> None:
    write_json_atomic(os.path.join(root, TUNED), choice, self_sum=True)


def store_tuned(source: str, choice: dict, remote=None) -> str:
    """Write liquid.json into the dataset at source, a directory or an object store URL
    (remote: its RemoteOptions); returns where."""
    from pcrfs.storage.objclient import ObjectClient, RemoteError, is_remote
    if not is_remote(source):
        write_tuned(source, choice)
        return os.path.join(source, TUNED)
    client = ObjectClient(source, remote)
    try:
        client.put_bytes(TUNED, json_text(choice, self_sum=True).encode())
    except RemoteError as e:
        raise PcrfsError(f"cannot store the choice in {client.describe(TUNED)}: {e}; mount "
                         f"with -o mix={choice['share']:.1f},mix_fidelity={choice['fidelity']}"
                         ) from None
    return client.describe(TUNED)


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            obj = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: unreadable ({e})") from None
    check_self_sum(obj, path)
    return obj
