"""`pcrfs export`: write one view as a plain directory tree, without FUSE."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from pcrfs.dataset import Dataset
from pcrfs.format.names import join_below


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
    # every path is checked before anything is written: an index naming ../x is refused
    # whole (DatasetError), not written up to its bad name
    tree = list(walk_files(ds, view=view))
    targets = {path: join_below(out_b, path, "export") for path, _ in tree}
    for path, is_dir in tree:
        if is_dir:
            os.makedirs(targets[path], exist_ok=True)
        else:
            files.append(path)

    def one(path: bytes) -> str | None:
        try:
            data = ds.read(path, view)
        except OSError as e:
            return f"{os.fsdecode(path)}: {e.strerror or e}"
        # a symlink at the target (planted in the output tree) is not written through
        fd = os.open(targets[path], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o666)
        with open(fd, "wb") as f:
            f.write(data)
        return None

    with ThreadPoolExecutor(workers) as pool:
        errors = [e for e in pool.map(one, files) if e]
    return len(files) - len(errors), errors
