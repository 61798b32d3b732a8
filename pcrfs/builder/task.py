"""One build task: one record.  It reads the record's source images from SRC, transcodes
them, and writes straight to DST, in this order: the notes (skipped/converted images), the
l3 sidecar, the index part, and the record itself last, so a record that exists means its
task finished.  A task is idempotent: run again (an engine's retry, --resume) it writes the
same bytes under the same names.  Tasks are pickled to Dask workers; a store is only its
description, and each worker opens its own clients."""
from __future__ import annotations

import itertools
import json
import os
import uuid as uuidlib
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from pcrfs.builder.prepare import Prepared, PrepareOptions, prepare_data
from pcrfs.format import l3m_key, record_key
from pcrfs.format.indexpart import pack_part, part_key
from pcrfs.format.l3meta import pack_l3meta
from pcrfs.format.record import FLAG_CONVERTED, ImageMeta, group_bytes, pack_header

NOTES_DIR = "skipped"


def notes_key(number: int) -> str:
    return f"{NOTES_DIR}/{number:06d}.json"




@dataclass(frozen=True)
class RecordTask:
    src: object                   # jobs.stores.LocalStore | ObjectStore
    dst: object                   # where the build is written (DST.partial, or the prefix)
    number: int
    uid: str
    classes: tuple[bytes, ...]
    files: tuple[tuple[bytes, int], ...]   # (relpath, label) in record order
    popts: PrepareOptions
    threads: int = 1              # transcoding threads inside the task, without a shared pool


@dataclass(frozen=True)
class RecordDone:
    number: int
    planned: int
    written: int
    requests: dict        # object-storage requests by method (GET, PUT, ...) of this task


def _display(p: bytes) -> str:
    return os.fsdecode(p)


def _one(src, task: RecordTask, item: tuple[bytes, int]) -> Prepared:
    from pcrfs.storage.objclient import RemoteAccessDenied, RemoteNotFound
    relpath, label = item
    try:
        raw = src.read(os.fsdecode(relpath))
    except OSError as e:
        return Prepared(relpath, label, ok=False, reason=f"unreadable: {e.strerror}")
    except (RemoteNotFound, RemoteAccessDenied) as e:
        # the source itself is gone or refused: skipped and reported like a local EACCES.
        # Other remote errors (unavailable, time-outs) fail the task, which is retried.
        return Prepared(relpath, label, ok=False, reason=f"unreadable: {e}")
    return prepare_data(raw, relpath, label, task.popts)


def run_record(task: RecordTask, pool: Executor | None = None) -> RecordDone:
    """Build one record into task.dst.  pool: an executor to transcode in (the local
    engine shares one across records); otherwise task.threads threads of its own."""
    src, dst = task.src.view(), task.dst.view()
    if pool is not None:
        results = list(pool.map(lambda f: _one(src, task, f), task.files))
    elif task.threads > 1:
        with ThreadPoolExecutor(task.threads, thread_name_prefix="pcrfs-build") as own:
            results = list(own.map(lambda f: _one(src, task, f), task.files))
    else:
        results = [_one(src, task, f) for f in task.files]
    write_outputs(dst, task.number, uuidlib.UUID(task.uid), list(task.classes), results,
                  task.popts.l3)
    return RecordDone(task.number, len(task.files), sum(p.ok for p in results),
                      dict(src.counts + dst.counts))


def write_outputs(dst, r: int, uid: uuidlib.UUID, classes: list[bytes],
                  results: list[Prepared], l3: bool) -> None:
    good = [p for p in results if p.ok]
    notes = {"skipped": [{"path": _display(p.relpath), "reason": p.reason}
                         for p in results if not p.ok],
             "converted": [_display(p.relpath) for p in good if p.converted],
             "warnings": [{"path": _display(p.relpath), "warning": p.warning}
                          for p in good if p.warning],
             "source_bytes": sum(p.source_bytes for p in good)}
    dst.write(notes_key(r), json.dumps(notes, sort_keys=True).encode())
    metas = [ImageMeta(p.relpath, p.label, p.width, p.height, p.components,
                       FLAG_CONVERTED if p.converted else 0) for p in good]
    segments = [p.segments() for p in good]
    groups = max((len(s) for s in segments), default=1)
    head = pack_header(r, uid, classes, metas, segments, groups)
    l3m = pack_l3meta(r, uid, [(p.l3_size, p.l3_xxh) for p in good]) if l3 else None
    if l3m is not None:
        dst.write(l3m_key(r), l3m)
    dst.write(part_key(r), pack_part(head, l3m))
    # last: a record that exists is a finished task
    dst.write(record_key(r), itertools.chain([head], group_bytes(segments, groups)))
