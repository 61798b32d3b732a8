"""Finishing a build once every record is written: the records' index parts merged into
the index, the build report, the segment table, then the manifest, last.  A local build's
DST.partial then becomes DST by one rename; a remote build uploads its index and report,
then the manifest, then removes its own objects (and a replaced dataset's)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid as uuidlib

from pcrfs.builder.indexer import index_headers
from pcrfs.builder.plan import BuildResult, record_slice
from pcrfs.builder.resume import SKIPPED_DIR, STATE, not_found
from pcrfs.builder.summary import size_summary
from pcrfs.builder.task import notes_key
from pcrfs.errors import DatasetError, PcrfsError
from pcrfs.format import (
    BUILD_REPORT,
    FORMAT_VERSION,
    INDEX_DIR,
    MANIFEST,
    RECORDS_DIR,
    l3m_key,
    record_key,
    segtab,
)
from pcrfs.format.atomic import fsync_dir
from pcrfs.format.indexpart import PARTS_DIR, belongs, parse_part, part_key
from pcrfs.format.manifest import metadata_sums, read_manifest, write_json_atomic


def _missing(work, uid: uuidlib.UUID, state: dict) -> None:
    """Refuse to finalize with records missing, naming the parts that owe them."""
    have = work.list(RECORDS_DIR)
    missing = [r for r in range(state["records"]) if record_key(r) not in have]
    if not missing:
        return
    parts = state.get("parts")
    if parts:
        owe = sorted({i for i in range(parts) for r in missing
                      if r in record_slice(state["records"], (i, parts))})
        names = ", ".join(f"--part {i}/{parts}" for i in owe)
        raise PcrfsError(f"{work.describe()}: cannot finalize: {len(missing)} of "
                         f"{state['records']} records are missing; run {names} first")
    raise PcrfsError(f"{work.describe()}: cannot finalize: records "
                     f"{', '.join(record_key(r) for r in missing[:5])} are missing; "
                     f"run the build again with --resume")


def _parts(work, uid: uuidlib.UUID, n: int):
    for r in range(n):
        where = work.describe(part_key(r))
        try:
            data = work.read(part_key(r))
        except not_found():
            raise DatasetError(f"{where}: missing (its record was written without it?)") from None
        h, l3 = parse_part(data, where)
        if not belongs(h, r, uid):
            raise DatasetError(f"{where}: belongs to another build")
        yield where, h, l3


def _notes(work, n: int) -> dict:
    notes = {"skipped": [], "converted": [], "warnings": [], "source_bytes": 0}
    for r in range(n):
        part = json.loads(work.read(notes_key(r)))
        for k in ("skipped", "converted", "warnings"):
            notes[k] += part[k]
        notes["source_bytes"] += part["source_bytes"]
    return notes


def finish(work, dst, uid, state, opts, t0) -> BuildResult:
    _missing(work, uid, state)
    n = state["records"]
    notes = _notes(work, n)
    notes["skipped"] += [{"path": s, "reason": "not inside a class directory"}
                         for s in state["stray"]]
    if opts.strict and notes["skipped"]:
        if not work.remote:
            shutil.rmtree(work.root, ignore_errors=True)
        names = "\n  ".join(f"{s['path']}: {s['reason']}" for s in notes["skipped"])
        raise PcrfsError(f"--strict: {len(notes['skipped'])} file(s) could not be "
                         f"converted:\n  {names}")
    # the index and report are made in a local directory: DST.partial, or a temporary
    # that is uploaded (the parts come from the store; the records are never read)
    local = work.root if not work.remote else tempfile.mkdtemp(prefix="pcrfs-finalize-",
                                                                 dir=opts.tmp_dir)
    try:
        return _finish_in(work, dst, uid, state, opts, t0, notes, local)
    finally:
        if work.remote:
            shutil.rmtree(local, ignore_errors=True)


def _finish_in(work, dst, uid, state, opts, t0, notes, local) -> BuildResult:
    n = state["records"]
    shutil.rmtree(os.path.join(local, INDEX_DIR), ignore_errors=True)  # a killed run's
    stats = build_index(_parts(work, uid, n), uid, os.path.join(local, INDEX_DIR))
    if stats.images == 0:
        if not work.remote:
            shutil.rmtree(work.root, ignore_errors=True)
        raise PcrfsError(f"{state['source']}: no image could be converted")
    summary = size_summary(stats.sizes, notes["source_bytes"] / stats.images)
    seconds = time.monotonic() - t0
    records = work.list(RECORDS_DIR)
    planned = {k for r in range(n) for k in (record_key(r), l3m_key(r))}
    for key in set(records) - planned:      # a killed writer's temporary (PATH.tmp)
        work.delete(key)
    report = {
        "source": state["source"], "planned": state["planned"], "images": stats.images,
        "skipped": notes["skipped"], "converted": notes["converted"],
        "warnings": notes["warnings"], "summary": summary,
        "empty_classes": [os.fsdecode(c) for c in stats.empty_classes],
        "source_bytes": notes["source_bytes"],
        "dataset_bytes": sum(size for key, size in records.items() if key in planned),
        "index_bytes": stats.index_bytes,
        "index_bytes_per_image": round(stats.index_bytes / stats.images, 1),
        "seconds": round(seconds, 3),
    }
    write_json_atomic(os.path.join(local, BUILD_REPORT), report)
    classes = [os.fsencode(c) for c in state["classes"]]
    manifest = {
        "format": "pcrfs", "format_version": FORMAT_VERSION, "uuid": str(uid),
        "images": stats.images, "records": stats.records, "groups": stats.groups,
        "classes": [os.fsdecode(c) for c in classes],
        "build": state["params"], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "summary": summary, "index_bytes": stats.index_bytes,
        "format_views": ["l3"] if stats.l3 else [],
        "dataset_bytes": report["dataset_bytes"], "source_bytes": notes["source_bytes"],
        "files": metadata_sums(local),
    }
    if work.remote:
        _publish(work, local, manifest, n)
    else:
        # the lane's segment table and names, tied to this index (format/segtab.py), so a
        # mount maps them; written before the manifest, which says the build is complete
        segtab.write_for(local, manifest)
        write_json_atomic(os.path.join(local, MANIFEST), manifest, self_sum=True)
        # The build's own files go last: a partial without its state file is complete.
        for name in os.listdir(os.path.join(local, RECORDS_DIR)):
            if name.endswith(".tmp"):   # a killed task's (or worker's) unfinished write
                os.unlink(os.path.join(local, RECORDS_DIR, name))
        shutil.rmtree(os.path.join(local, PARTS_DIR), ignore_errors=True)
        shutil.rmtree(os.path.join(local, SKIPPED_DIR))
        os.unlink(os.path.join(local, STATE))
        fsync_dir(local)
        rename(local, dst, t0)
    return BuildResult(dst, str(uid), stats.images, stats.records, stats.groups,
                       notes["skipped"], len(notes["converted"]), seconds, summary,
                       report["index_bytes_per_image"])


def build_index(parts, uid, target):
    """The index from the records' parts (a name the crash tests interrupt after)."""
    return index_headers(parts, uid, target)


def _publish(work, local: str, manifest: dict, n: int) -> None:
    """A remote build's index and report go up, then the manifest; then the build's own
    objects, and anything stale from a dataset --overwrite replaced, are removed."""
    from pcrfs.format.manifest import json_text
    for key in (f"{INDEX_DIR}/data.mdb", BUILD_REPORT):
        with open(os.path.join(local, key), "rb") as f:
            work.write(key, f.read())
    work.write(MANIFEST, json_text(manifest, self_sum=True).encode())
    keep = {record_key(r) for r in range(n)} | {l3m_key(r) for r in range(n)}
    keep |= {f"{INDEX_DIR}/data.mdb", BUILD_REPORT, MANIFEST}
    for key in work.list(""):
        if key in keep:
            continue
        if key.startswith((f"{PARTS_DIR}/", f"{SKIPPED_DIR}/", f"{RECORDS_DIR}/", f"{INDEX_DIR}/",
                           "raw/")) or key == STATE:
            work.delete(key)


def rename(partial: str, dst: str, t0: float) -> BuildResult:
    """DST.partial becomes DST in one rename; the result as the build report tells it."""
    if os.path.isdir(dst):
        os.rmdir(dst)  # empty (checked at start)
    os.rename(partial, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)))
    m = read_manifest(dst)
    with open(os.path.join(dst, BUILD_REPORT)) as f:
        report = json.load(f)
    return BuildResult(dst, m["uuid"], m["images"], m["records"], m["groups"], report["skipped"],
                       len(report["converted"]), time.monotonic() - t0, m["summary"],
                       report["index_bytes_per_image"])
