"""Helpers of the remote-dataset tests."""
import os
import random
from pathlib import Path


def files_of(ds, view: str, rel: bytes = b"") -> list[bytes]:
    out = []
    for name, is_dir in ds.listdir(rel, view):
        p = rel + b"/" + name if rel else name
        out.extend(files_of(ds, view, p) if is_dir else [p])
    return out


def every_file(ds) -> list[tuple[str, bytes]]:
    return [(v, p) for v in ds.all_views for p in files_of(ds, v)]


def in_record_order(ds, view: str) -> list[bytes]:
    return sorted(files_of(ds, view), key=lambda p: (ds.lookup(p).record, ds.lookup(p).index))


def shuffled(items, seed=0):
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def read(mnt: Path, view: str, rel: bytes) -> bytes:
    with open(os.path.join(os.fsencode(mnt), view.encode(), rel), "rb") as f:
        return f.read()

