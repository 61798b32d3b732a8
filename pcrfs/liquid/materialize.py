"""`pcrfs materialize DST raw --fraction R`: store the raw (PPM) files of a hash-chosen
share R of the images next to the records (format/rawpack.py), so MNT/raw and MNT/mix
serve them at I/O cost only.

- Nested: the set for R is every image whose raw rank is below R (pcrfs/liquid/rules.py).
- Resumable: packs are written one record at a time, atomically; a pack already made for
  R is kept, and a pack made for another share gives up the items it has (each checked)
  instead of decoding them again.
- raw.json is removed first and written last: it vouches (size, XXH3) for every pack."""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import numpy as np

from pcrfs.errors import DatasetError, PcrfsError
from pcrfs.format import RAW_DIR, RAW_SUMMARY
from pcrfs.format.atomic import atomic_write, fsync_dir
from pcrfs.format.checksum import block_checksum
from pcrfs.format.manifest import file_sum, write_json_atomic
from pcrfs.format.rawpack import (
    HEAD,
    count_of,
    decode,
    encode,
    head_size,
    pack_key,
    pack_name,
)
from pcrfs.liquid.rules import ppm_bytes, raw_ranks

log = logging.getLogger("pcrfs.materialize")


def _old_pack(path: str, ds, record: int):
    """(Pack, file bytes) of an existing pack, or None if absent or damaged."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return decode(data[: head_size(count_of(data[: HEAD.size], path))], path, ds.uuid,
                      record), data
    except (OSError, DatasetError):
        return None


@dataclass(frozen=True)
class PackTask:
    """One record's pack: its chosen images (record index, path), in record order."""
    dst: str
    uuid: str
    record: int
    fraction: float
    items: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True)
class PackDone:
    record: int
    key: str
    sum: dict | None      # file_sum of the pack written or kept; None: none (no image)
    decoded: int
    reused: int
    kept: bool


_OPEN: dict = {}                   # (dst, uuid) -> Dataset, one per worker process
_OPEN_LOCK = threading.Lock()


def _dataset(dst: str, uid: str):
    from pcrfs.dataset import open_dataset
    with _OPEN_LOCK:
        ds = _OPEN.get((dst, uid))
        if ds is None:
            ds = open_dataset(dst, cache_size=64 << 20)
            if str(ds.uuid) != uid:
                raise PcrfsError(f"{dst}: dataset {ds.uuid}, expected {uid} (replaced meanwhile?)")
            _OPEN[(dst, uid)] = ds
        return ds


def make_pack(task: PackTask, pool=None) -> PackDone:
    """Write (or keep) one record's raw pack: a task for jobs/engine.run_tasks."""
    ds = _dataset(task.dst, task.uuid)
    path = os.path.join(task.dst, RAW_DIR, pack_name(task.record))
    old = _old_pack(path, ds, task.record)
    key = pack_key(task.record)
    if not task.items:
        if old is not None:
            os.unlink(path)
        return PackDone(task.record, key, None, 0, 0, False)
    if old is not None and old[0].fraction == task.fraction and \
            [int(x) for x in old[0].items["index"]] == [i for i, _ in task.items]:
        return PackDone(task.record, key, file_sum(path), 0, 0, True)

    def make(item):
        index, p = item
        if old is not None:
            found = old[0].find(index)
            if found is not None:
                off, n, xxh = found
                data = old[1][off : off + n]
                if len(data) == n and block_checksum(data) == xxh:
                    return data, True
        return ppm_bytes(ds.read_q(ds.lookup(p), ds.groups, p)), False
    made = list(pool.map(make, task.items)) if pool is not None else [make(i) for i in task.items]
    parts = encode(ds.uuid, task.record, task.fraction,
                   [(i, d) for (i, _), (d, _) in zip(task.items, made, strict=True)])
    with atomic_write(path) as f:
        for part in parts:
            f.write(part)
    reused = sum(r for _, r in made)
    return PackDone(task.record, key, file_sum(path), len(made) - reused, reused, False)


def materialize(dst: str, fraction: float, jobs: int | None = None, progress: bool = True,
                engine: str = "local") -> dict:
    """engine: jobs/engine.py's; with Dask, every worker must see DST at the same path
    (a shared file system)."""
    from tqdm import tqdm

    from pcrfs.dataset import open_dataset
    from pcrfs.jobs.engine import check_engine, run_tasks
    from pcrfs.storage.objclient import is_remote
    if is_remote(dst):
        raise PcrfsError(f"{dst}: materialize a local copy of the dataset, then `pcrfs push` it")
    if not 0.0 <= fraction <= 1.0:
        raise PcrfsError(f"--fraction {fraction}: expected a share between 0 and 1")
    check_engine(engine)
    dst = os.path.abspath(dst)
    with open_dataset(dst, cache_size=64 << 20) as ds:
        by_record: dict[int, list] = {}
        for path, e in ds.index.iter_images():
            by_record.setdefault(e.record, []).append((e.index, path, e.ordinal))
        ords = np.array([o for v in by_record.values() for _, _, o in v], dtype=np.uint64)
        chosen = set(ords[raw_ranks(ords) < fraction].tolist()) if len(ords) else set()
        rawdir = os.path.join(dst, RAW_DIR)
        os.makedirs(rawdir, exist_ok=True)
        try:
            os.unlink(os.path.join(dst, RAW_SUMMARY))   # vouches for nothing until rewritten
        except FileNotFoundError:
            pass
        tasks = [PackTask(dst, str(ds.uuid), r, fraction,
                          tuple(sorted((i, p) for i, p, o in by_record[r] if o in chosen)))
                 for r in sorted(by_record)]
        files, stats = {}, {"images": len(chosen), "decoded": 0, "reused": 0, "kept_packs": 0}
        bar = tqdm(total=len(chosen), unit="img", desc="materialize raw", disable=not progress)

        def done(d: PackDone):
            if d.sum is not None:
                files[d.key] = d.sum
            stats["decoded"] += d.decoded
            stats["reused"] += d.reused
            stats["kept_packs"] += d.kept
            bar.update(sizes[d.record])
        sizes = {t.record: len(t.items) for t in tasks}
        key = (dst, str(ds.uuid))
        with _OPEN_LOCK:
            _OPEN[key] = ds     # the local engine's tasks use this process's dataset
        try:   # Pillow decodes without the GIL: threads locally
            run_tasks(make_pack, tasks, engine, jobs or os.cpu_count() or 1, done,
                      name=f"pcrfs-materialize-{ds.uuid}-{os.getpid()}")
        finally:
            bar.close()
            with _OPEN_LOCK:
                _OPEN.pop(key, None)
        for name in os.listdir(rawdir):          # packs of records no longer chosen
            if f"{RAW_DIR}/{name}" not in files:
                os.unlink(os.path.join(rawdir, name))
        fsync_dir(rawdir)
        summary = {"uuid": str(ds.uuid), "fraction": fraction, "images": len(chosen),
                   "bytes": sum(f["bytes"] for f in files.values()), "files": files}
        write_json_atomic(os.path.join(dst, RAW_SUMMARY), summary, self_sum=True)
    log.info("materialized %d raw images (%d decoded, %d reused) in %s", len(chosen),
             stats["decoded"], stats["reused"], dst)
    return summary | stats
