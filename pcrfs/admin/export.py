"""`pcrfs export`: write one view as a plain directory tree, without FUSE."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from pcrfs.dataset import Dataset


def walk_files(ds: Dataset, rel: bytes = b"", view: str | None = None):
    """(relative path, is_dir) of every entry below rel as `view` names it, depth first."""
    for name, is_dir in ds.listdir(rel, view):
        path = rel + b"/" + name if rel else name
        yield path, is_dir
        if is_dir:
            yield from walk_files(ds, path, view)


def export_view(ds: Dataset, view: str, out: str, workers: int = 4) -> tuple[int, list[str]]:
    """Returns (files written, errors)."""
    if view not in ds.served:  # validate the name before anything is created
        raise KeyError(f"no view {view!r} (views: {', '.join(ds.all_views)})")
    out_b = os.fsencode(out)
    os.makedirs(out_b, exist_ok=True)
    files = []
    for path, is_dir in walk_files(ds, view=view):
        if is_dir:
            os.makedirs(os.path.join(out_b, path), exist_ok=True)
        else:
            files.append(path)

    def one(path: bytes) -> str | None:
        try:
            data = ds.read(path, view)
        except OSError as e:
            return f"{os.fsdecode(path)}: {e.strerror or e}"
        with open(os.path.join(out_b, path), "wb") as f:
            f.write(data)
        return None

    with ThreadPoolExecutor(workers) as pool:
        errors = [e for e in pool.map(one, files) if e]
    return len(files) - len(errors), errors
