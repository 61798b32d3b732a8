"""manifest.json: written last and atomically; its presence means the build is complete."""
from __future__ import annotations

import json
import os

from pcrfs.errors import DatasetError
from pcrfs.format import FORMAT_VERSION, MANIFEST


def write_json_atomic(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST)
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: no such dataset directory")
    try:
        with open(path) as f:
            m = json.load(f)
    except FileNotFoundError:
        raise DatasetError(
            f"{root}: no {MANIFEST}; the build did not finish (re-run `pcrfs build --resume`)"
        ) from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: unreadable manifest: {e}") from None
    if m.get("format") != "pcrfs" or m.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{path}: not a pcrfs v{FORMAT_VERSION} manifest")
    return m
