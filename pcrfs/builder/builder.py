"""`pcrfs build`: plan (builder/plan.py), open or resume the build's state
(builder/resume.py), run one task per record (builder/task.py) on an engine
(jobs/engine.py), then finish (builder/publish.py): merge the records' index parts into
the index and write the manifest last.

SRC and DST may each be a local directory or an s3://, gs:// or az:// prefix (jobs/stores.py).

Crash safety: a local build writes under DST.partial/, and DST.partial becomes DST by one
rename after the manifest; a remote build writes under the prefix, with a state object
that marks it unfinished, and the manifest last.  A record appears only once its task is
complete (its notes, l3 sidecar and index part are written before it), so a killed build
leaves no dataset, and `--resume` keeps its finished records and redoes the rest.

`--part i/N` runs the i-th of N contiguous slices of the records and no finalize;
`--finalize` finishes once every part has: for job arrays, with no engine at all.  The
parts agree on the dataset's UUID without talking: it is derived from the plan (paths,
labels, sizes and options), which every part computes alike."""
from __future__ import annotations

import os
import time
import uuid as uuidlib
from collections import Counter

from tqdm import tqdm

from pcrfs.builder.plan import (
    BuildOptions,
    BuildResult,
    check_options,
    open_source,
    params_of,
    part_uuid,
    plan_files,
    plan_hash,
    record_slice,
)
from pcrfs.builder.prepare import PrepareOptions
from pcrfs.builder.publish import finish, rename
from pcrfs.builder.resume import (
    STATE,
    finished_records,
    open_part,
    open_partial,
    open_remote,
    read_state,
)
from pcrfs.builder.summary import format_result
from pcrfs.builder.task import RecordTask, run_record
from pcrfs.errors import PcrfsError
from pcrfs.format import MANIFEST
from pcrfs.jobs.engine import default_workers, parse_engine, run_tasks
from pcrfs.jobs.stores import LocalStore, open_store

__all__ = ["BuildOptions", "BuildResult", "build", "finalize", "format_result"]


def build(src: str, dst: str, opts: BuildOptions) -> BuildResult:
    t0 = time.monotonic()
    dst = dst.rstrip("/")
    out = open_store(dst, opts.remote)
    if not out.remote and opts.part is None and os.path.exists(dst) and (
            not os.path.isdir(dst) or os.listdir(dst)):
        raise PcrfsError(f"{dst} already exists; choose a new destination")
    if not out.remote and os.path.exists(os.path.join(dst, MANIFEST)):
        raise PcrfsError(f"{dst} already holds a dataset; choose a new destination")
    script_text, script, script_comps = check_options(opts)
    src_store, classes, files, stray = open_source(src, opts)
    plan = plan_files(files, opts)
    params = params_of(opts, script_text)
    n = opts.images_per_record
    chunks = [plan[i : i + n] for i in range(0, len(plan), n)]
    digest = plan_hash(plan, classes, params)
    state = {"plan_hash": digest, "params": params, "records": len(chunks),
             "planned": len(plan), "classes": [os.fsdecode(c) for c in classes],
             "stray": [os.fsdecode(s) for s in stray], "source": src_store.describe(),
             "parts": opts.part[1] if opts.part else None}
    # absolute: Dask workers may run elsewhere in the file tree
    work = out if out.remote else LocalStore(os.path.abspath(dst) + ".partial")
    if opts.part is not None:
        uid = open_part(work, opts, state, part_uuid(plan, digest, opts.part[1]))
    elif out.remote:
        uid = open_remote(work, opts, state)
    else:
        uid = open_partial(work.root, opts, state)
        if uid is None:
            return rename(work.root, dst, t0)
    mine = record_slice(len(chunks), opts.part)
    done = finished_records(work, uid, list(mine))
    todo = [r for r in mine if r not in done]
    popts = PrepareOptions(opts.keep_metadata, opts.quality, script, script_comps,
                           "l3" in opts.views, opts.max_pixels, opts.restart_rows, opts.restart_bytes)
    name, _ = parse_engine(opts.engine)
    workers = opts.workers or default_workers()
    tasks = [RecordTask(src_store, work, r, str(uid), tuple(classes),
                        tuple((f.relpath, f.label) for f in chunks[r]), popts,
                        threads=1 if name == "dask" else workers) for r in todo]
    bar = tqdm(total=sum(len(chunks[r]) for r in mine),
               initial=sum(len(chunks[r]) for r in done), unit="img", desc="build",
               disable=not opts.progress, smoothing=0.1)
    requests: Counter = Counter()

    def finished(d):
        bar.update(d.planned)
        requests.update(d.requests)
    try:
        run_tasks(run_record, tasks, opts.engine, workers, finished,
                  name=f"pcrfs-build-{uid}-{os.getpid()}")
    finally:
        bar.close()
    if opts.part is not None:
        requests.update(src_store.counts + work.counts)
        return BuildResult(dst, str(uid), sum(len(chunks[r]) for r in mine), len(mine), 0,
                           seconds=time.monotonic() - t0, part=opts.part,
                           part_records=(mine.start, mine.stop), requests=dict(requests))
    res = finish(work, dst, uid, read_state(work), opts, t0)
    res.requests = dict(requests + src_store.counts + work.counts)
    return res


def finalize(dst: str, opts: BuildOptions) -> BuildResult:
    """`pcrfs build --finalize DST`: finish a --part build once every part is done."""
    t0 = time.monotonic()
    dst = dst.rstrip("/")
    out = open_store(dst, opts.remote)
    work = out if out.remote else LocalStore(os.path.abspath(dst) + ".partial")
    if not out.remote and not os.path.isdir(work.root):
        if os.path.exists(os.path.join(dst, MANIFEST)):
            raise PcrfsError(f"{dst}: already finalized")
        raise PcrfsError(f"{dst}: no --part build to finalize ({work.root} does not exist)")
    if work.size(STATE) is None:
        if not out.remote and os.path.exists(os.path.join(work.root, MANIFEST)):
            return rename(work.root, dst, t0)   # killed between its manifest and rename
        raise PcrfsError(f"{dst}: no --part build to finalize (no {STATE})")
    state = read_state(work)
    res = finish(work, dst, uuidlib.UUID(state["uuid"]), state, opts, t0)
    res.requests = dict(work.counts)
    return res
