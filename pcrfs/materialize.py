"""`pcrfs materialize DST raw --fraction R`: store the raw (PPM) files of a hash-chosen
share R of the images next to the records (format/rawpack.py), so MNT/raw and MNT/mix
serve them at I/O cost only.

- Nested: the set for R is every image whose raw rank is below R (pcrfs/liquid.py).
- Resumable: packs are written one record at a time, atomically; a pack already made for
  R is kept, and a pack made for another share gives up the items it has (each checked)
  instead of decoding them again.
- raw.json is removed first and written last: it vouches (size, XXH3) for every pack."""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pcrfs.errors import DatasetError, PcrfsError
from pcrfs.format.atomic import atomic_write, fsync_dir
from pcrfs.format.checksum import block_checksum
from pcrfs.format.manifest import file_sum, write_json_atomic
from pcrfs.format.rawpack import (HEAD, RAW_DIR, RAW_SUMMARY, count_of, decode, encode,
                                  head_size, pack_key, pack_name)
from pcrfs.liquid import ppm_bytes, raw_ranks

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


def materialize(dst: str, fraction: float, jobs: int | None = None, progress: bool = True) -> dict:
    from tqdm import tqdm

    from pcrfs.dataset import open_dataset
    from pcrfs.storage.objclient import is_remote
    if is_remote(dst):
        raise PcrfsError(f"{dst}: materialize a local copy of the dataset, then `pcrfs push` it")
    if not 0.0 <= fraction <= 1.0:
        raise PcrfsError(f"--fraction {fraction}: expected a share between 0 and 1")
    with open_dataset(dst, cache_size=64 << 20) as ds:
        by_record: dict[int, list] = {}
        for path, e in ds.index.iter_images():
            by_record.setdefault(e.record, []).append((e.index, path, e))
        ords = np.array([e.ordinal for v in by_record.values() for _, _, e in v], dtype=np.uint64)
        chosen = set(ords[raw_ranks(ords) < fraction].tolist()) if len(ords) else set()
        rawdir = os.path.join(dst, RAW_DIR)
        os.makedirs(rawdir, exist_ok=True)
        try:
            os.unlink(os.path.join(dst, RAW_SUMMARY))   # vouches for nothing until rewritten
        except FileNotFoundError:
            pass
        files, stats = {}, {"images": len(chosen), "decoded": 0, "reused": 0, "kept_packs": 0}
        bar = tqdm(total=len(chosen), unit="img", desc="materialize raw", disable=not progress)
        pool = ThreadPoolExecutor(jobs or os.cpu_count() or 1)   # Pillow decodes without the GIL
        try:
            for record in sorted(by_record):
                items = sorted((i, p, e) for i, p, e in by_record[record] if e.ordinal in chosen)
                path = os.path.join(rawdir, pack_name(record))
                old = _old_pack(path, ds, record)
                if not items:
                    if old is not None:
                        os.unlink(path)
                    continue
                if old is not None and old[0].fraction == fraction and \
                        [int(x) for x in old[0].items["index"]] == [i for i, _, _ in items]:
                    stats["kept_packs"] += 1
                    files[pack_key(record)] = file_sum(path)
                    bar.update(len(items))
                    continue

                def make(item, old=old):
                    index, p, e = item
                    if old is not None:
                        found = old[0].find(index)
                        if found is not None:
                            off, n, xxh = found
                            data = old[1][off : off + n]
                            if len(data) == n and block_checksum(data) == xxh:
                                return data, True
                    return ppm_bytes(ds.read_q(e, ds.groups, p)), False
                made = list(pool.map(make, items))
                for _, reused in made:
                    stats["reused" if reused else "decoded"] += 1
                parts = encode(ds.uuid, record, fraction,
                               [(i, d) for (i, _, _), (d, _) in zip(items, made, strict=True)])
                with atomic_write(path) as f:
                    for part in parts:
                        f.write(part)
                files[pack_key(record)] = file_sum(path)
                bar.update(len(items))
        finally:
            pool.shutdown()
            bar.close()
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
