"""`pcrfs build`: plan, run one task per record (builder/task.py) on an engine
(builder/engine.py), then finalize: merge the records' index parts into the index and
write the manifest last.

SRC and DST may each be a local directory or an s3://, gs:// or az:// prefix (stores.py).

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

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
import uuid as uuidlib
from collections import Counter
from dataclasses import dataclass, field

from tqdm import tqdm

from pcrfs.admin.summary import format_summary, size_summary
from pcrfs.builder.engine import check_engine, default_workers, parse_engine, run_tasks
from pcrfs.builder.indexer import index_headers
from pcrfs.builder.prepare import MAX_PIXELS, PrepareOptions
from pcrfs.builder.scans import parse_scan_script
from pcrfs.builder.stores import LocalStore, open_store
from pcrfs.builder.task import NOTES_DIR, RecordTask, notes_key, run_record
from pcrfs.builder.walk import SourceFile, walk_listing, walk_sources
from pcrfs.errors import DatasetError, PcrfsError
from pcrfs.format import (
    AFTER_BUILD_META,
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
from pcrfs.format.indexpart import PARTS_DIR, belongs, parse_part, part_key, record_size
from pcrfs.format.manifest import metadata_sums, read_manifest, write_json_atomic

STATE = "build-state.json"
SKIPPED_DIR = NOTES_DIR
PART_NAMESPACE = uuidlib.UUID("6b1c5f0e-8d2a-4c1e-9a57-3f0c2b7d9e41")


@dataclass
class BuildOptions:
    workers: int = 0                 # transcoding threads (local) or processes (dask); 0: all cores
    images_per_record: int = 1024
    shuffle_seed: int | None = None
    scans: str = "default"           # "default" or a scan script file
    keep_metadata: str = "default"
    quality: int = 95
    strict: bool = False
    resume: bool = False
    progress: bool = True
    views: tuple[str, ...] = ("l3",)  # format views computed at build time
    max_pixels: int = MAX_PIXELS     # decompression-bomb limit (Pillow's error threshold)
    engine: str = "local"            # local | dask | dask=ADDRESS
    part: tuple[int, int] | None = None   # (i, N): build the i-th of N slices, no finalize
    remote: object = None            # storage.objclient.RemoteOptions for s3://, gs://, az://
    overwrite: bool = False          # a remote DST holding another dataset is replaced
    tmp_dir: str | None = None       # a remote DST's index is built here, then uploaded
    restart_rows: int = 3            # restart marker every N MCU rows per scan (GPU decode); 0: none


@dataclass
class BuildResult:
    dst: str
    uuid: str
    images: int
    records: int
    groups: int
    skipped: list = field(default_factory=list)
    converted: int = 0
    seconds: float = 0.0
    summary: dict = field(default_factory=dict)
    index_bytes_per_image: float = 0.0
    part: tuple[int, int] | None = None   # a --part build: only records first..last written
    part_records: tuple[int, int] = (0, 0)
    requests: dict = field(default_factory=dict)   # object-storage requests by method


def _plan(files: list[SourceFile], opts: BuildOptions) -> list[SourceFile]:
    files = list(files)
    if opts.shuffle_seed is not None:
        random.Random(opts.shuffle_seed).shuffle(files)
    return files


def _plan_hash(plan: list[SourceFile], classes: list[bytes], params: dict) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(params, sort_keys=True).encode())
    for c in classes:
        h.update(b"c" + c + b"\0")
    for f in plan:
        h.update(f.relpath + b"\0" + str(f.label).encode() + b"\0")
    return h.hexdigest()


def _part_uuid(plan: list[SourceFile], plan_hash: str, parts: int) -> uuidlib.UUID:
    """What every part of one --part build computes alike (sizes included, so a changed
    source gets a new UUID and no cache keyed by it serves old bytes)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{plan_hash}/{parts}".encode())
    for f in plan:
        h.update(f.size.to_bytes(8, "little", signed=True))
    return uuidlib.uuid5(PART_NAMESPACE, h.hexdigest())


def _params(opts: BuildOptions, script_text: str | None) -> dict:
    return {"images_per_record": opts.images_per_record, "shuffle_seed": opts.shuffle_seed,
            "scans": "default" if script_text is None else script_text,
            "keep_metadata": opts.keep_metadata, "quality": opts.quality,
            "views": sorted(opts.views), "max_pixels": opts.max_pixels,
            "restart_rows": opts.restart_rows}


def _open_partial(partial: str, opts: BuildOptions, state: dict) -> uuidlib.UUID | None:
    """A local build's UUID (new, or the interrupted build's); None when DST.partial is a
    finished dataset that only awaits its rename (killed in the last steps)."""
    state_path = os.path.join(partial, STATE)
    if os.path.exists(partial):
        if not opts.resume:
            raise PcrfsError(f"{partial} holds an interrupted build: re-run with --resume to "
                             "continue it, or remove it to start over")
        if not os.path.exists(state_path) and _finished(partial, state["params"]):
            return None
        old = _read_state(LocalStore(partial))
        _same_plan(old, state, partial)
        os.makedirs(os.path.join(partial, SKIPPED_DIR), exist_ok=True)  # killed in _finish
        return uuidlib.UUID(old["uuid"])
    # Staged and renamed: a kill at any moment leaves either no DST.partial or one that
    # --resume can continue (never one without its state file).
    staging = partial + ".new"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(os.path.join(staging, RECORDS_DIR))
    os.makedirs(os.path.join(staging, SKIPPED_DIR))
    uid = uuidlib.uuid4()
    write_json_atomic(os.path.join(staging, STATE), {**state, "uuid": str(uid)})
    os.rename(staging, partial)
    fsync_dir(os.path.dirname(os.path.abspath(partial)))
    return uid


def _read_state(work) -> dict:
    try:
        state = json.loads(work.read(STATE))
        state["uuid"], state["plan_hash"]   # noqa: B018 - the keys every state has
        return state
    except Exception as e:  # noqa: BLE001 - missing, unreadable or not our JSON
        from pcrfs.storage.objclient import RemoteError
        if isinstance(e, RemoteError) and not isinstance(e, _not_found()):
            raise
        raise PcrfsError(f"{work.describe()}: no usable {STATE}; remove it and build again") from None


def _not_found():
    from pcrfs.storage.objclient import RemoteNotFound
    return (FileNotFoundError, RemoteNotFound)


def _same_plan(old: dict, state: dict, where: str) -> None:
    if old.get("plan_hash") != state["plan_hash"] or old.get("parts") != state.get("parts"):
        raise PcrfsError(f"{where}: the source tree or build options changed since the "
                         "interrupted build; remove it to start over")


def _finished(partial: str, params: dict) -> bool:
    """_finish removes the state file only after the manifest is in place."""
    try:
        m = read_manifest(partial)
    except DatasetError:
        return False
    if m.get("build") != params:
        raise PcrfsError(f"{partial}: the build options changed since the interrupted build; "
                         "remove it to start over")
    return True


def _open_remote(work, opts: BuildOptions, state: dict) -> uuidlib.UUID:
    """A remote build's UUID: the prefix holds no dataset (or --overwrite), and either no
    build state or this build's (--resume, or another part of the same --part build)."""
    try:
        old_manifest = json.loads(work.read(MANIFEST))
    except _not_found():
        old_manifest = None
    except ValueError:
        old_manifest = {"uuid": "(unreadable manifest)"}
    if old_manifest is not None:
        if not opts.overwrite:
            raise PcrfsError(f"{work.describe()} holds another dataset "
                             f"({old_manifest.get('uuid')}); use --overwrite to replace it")
        work.delete(MANIFEST)    # from here on the prefix is not a dataset
        for key in AFTER_BUILD_META:     # the old dataset's, which the new one must not inherit
            if work.size(key) is not None:
                work.delete(key)
    if work.size(STATE) is not None:
        old = _read_state(work)
        if opts.part is None and not opts.resume:
            raise PcrfsError(f"{work.describe()} holds an interrupted build: re-run with "
                             f"--resume to continue it")
        _same_plan(old, state, work.describe())
        return uuidlib.UUID(old["uuid"])
    return _write_state(work, state, uuidlib.uuid4())


def _write_state(work, state: dict, uid: uuidlib.UUID) -> uuidlib.UUID:
    work.write(STATE, json.dumps({**state, "uuid": str(uid)}, indent=1,
                                 sort_keys=True).encode())
    return uid


def _open_part(work, opts: BuildOptions, state: dict, uid: uuidlib.UUID) -> uuidlib.UUID:
    """Every part of a --part build writes the same state (if absent) and goes on; a state
    of another build is refused."""
    if not work.remote:
        os.makedirs(os.path.join(work.root, RECORDS_DIR), exist_ok=True)
        os.makedirs(os.path.join(work.root, SKIPPED_DIR), exist_ok=True)
    elif work.size(MANIFEST) is not None:
        raise PcrfsError(f"{work.describe()} already holds a dataset; remove it first")
    if work.size(STATE) is not None:
        old = _read_state(work)
        _same_plan(old, state, work.describe())
        if old["uuid"] != str(uid):
            raise PcrfsError(f"{work.describe()}: another build's state; remove it to start over")
        return uid
    return _write_state(work, state, uid)


def _finished_records(work, uid: uuidlib.UUID, numbers: list[int]) -> set[int]:
    """The records whose tasks completed (record, notes and part present and agreeing);
    a record a crash left without its part or notes is redone."""
    want = set(numbers)
    have = {k: v for k, v in work.list(RECORDS_DIR).items()}
    if not any(record_key(r) in have for r in want):
        return set()
    parts, notes = work.list(PARTS_DIR), work.list(SKIPPED_DIR)
    done = set()
    for r in sorted(want):
        if record_key(r) not in have or part_key(r) not in parts or notes_key(r) not in notes:
            continue
        try:
            h, _ = parse_part(work.read(part_key(r)), work.describe(part_key(r)))
            if belongs(h, r, uid) and record_size(h) == have[record_key(r)]:
                done.add(r)
                continue
        except DatasetError:
            pass
        work.delete(record_key(r))   # damaged by the crash: redo it
    return done


def _source(src: str, opts: BuildOptions):
    store = open_store(src, opts.remote)
    if store.remote:
        classes, files, stray = walk_listing(store.list(""))
    else:
        if not os.path.isdir(src):
            raise PcrfsError(f"{src}: not a directory")
        classes, files, stray = walk_sources(src)
        store = LocalStore(os.path.abspath(src))
    if not files:
        raise PcrfsError(f"{src}: no files under class directories (expected SRC/class/image)")
    return store, classes, files, stray


def _check_options(opts: BuildOptions) -> tuple[str | None, tuple | None, int]:
    if opts.images_per_record < 1:
        raise PcrfsError("--images-per-record must be at least 1")
    if not 1 <= opts.quality <= 100:
        raise PcrfsError("--quality must be 1-100")
    if not 0 <= opts.restart_rows <= 65535:
        raise PcrfsError("--restart-rows must be 0-65535 (0: no restart markers)")
    unknown = set(opts.views) - {"l3"}
    if unknown:
        raise PcrfsError(f"--views: unknown format view(s) {', '.join(sorted(unknown))} (known: l3)")
    check_engine(opts.engine)
    if opts.part is not None:
        i, n = opts.part
        if not 0 <= i < n:
            raise PcrfsError(f"--part {i}/{n}: expected i/N with 0 <= i < N")
    if opts.scans == "default":
        return None, None, 0
    with open(opts.scans) as f:
        script_text = f.read()
    rows, script_comps = parse_scan_script(script_text)
    return script_text, tuple(tuple(r) for r in rows), script_comps


def _slice(n_records: int, part: tuple[int, int] | None) -> range:
    if part is None:
        return range(n_records)
    i, n = part
    return range(i * n_records // n, (i + 1) * n_records // n)


def build(src: str, dst: str, opts: BuildOptions) -> BuildResult:
    t0 = time.monotonic()
    dst = dst.rstrip("/")
    out = open_store(dst, opts.remote)
    if not out.remote and opts.part is None and os.path.exists(dst) and (
            not os.path.isdir(dst) or os.listdir(dst)):
        raise PcrfsError(f"{dst} already exists; choose a new destination")
    if not out.remote and os.path.exists(os.path.join(dst, MANIFEST)):
        raise PcrfsError(f"{dst} already holds a dataset; choose a new destination")
    script_text, script, script_comps = _check_options(opts)
    src_store, classes, files, stray = _source(src, opts)
    plan = _plan(files, opts)
    params = _params(opts, script_text)
    n = opts.images_per_record
    chunks = [plan[i : i + n] for i in range(0, len(plan), n)]
    plan_hash = _plan_hash(plan, classes, params)
    state = {"plan_hash": plan_hash, "params": params, "records": len(chunks),
             "planned": len(plan), "classes": [os.fsdecode(c) for c in classes],
             "stray": [os.fsdecode(s) for s in stray], "source": src_store.describe(),
             "parts": opts.part[1] if opts.part else None}
    # absolute: Dask workers may run elsewhere in the file tree
    work = out if out.remote else LocalStore(os.path.abspath(dst) + ".partial")
    if opts.part is not None:
        uid = _open_part(work, opts, state, _part_uuid(plan, plan_hash, opts.part[1]))
    elif out.remote:
        uid = _open_remote(work, opts, state)
    else:
        uid = _open_partial(work.root, opts, state)
        if uid is None:
            return _rename(work.root, dst, t0)
    mine = _slice(len(chunks), opts.part)
    done = _finished_records(work, uid, list(mine))
    todo = [r for r in mine if r not in done]
    popts = PrepareOptions(opts.keep_metadata, opts.quality, script, script_comps,
                           "l3" in opts.views, opts.max_pixels, opts.restart_rows)
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
    res = _finish(work, dst, uid, _read_state(work), opts, t0)
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
            return _rename(work.root, dst, t0)   # killed between its manifest and rename
        raise PcrfsError(f"{dst}: no --part build to finalize (no {STATE})")
    state = _read_state(work)
    res = _finish(work, dst, uuidlib.UUID(state["uuid"]), state, opts, t0)
    res.requests = dict(work.counts)
    return res


def _missing(work, uid: uuidlib.UUID, state: dict) -> None:
    """Refuse to finalize with records missing, naming the parts that owe them."""
    have = work.list(RECORDS_DIR)
    missing = [r for r in range(state["records"]) if record_key(r) not in have]
    if not missing:
        return
    parts = state.get("parts")
    if parts:
        owe = sorted({i for i in range(parts) for r in missing
                      if r in _slice(state["records"], (i, parts))})
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
        except _not_found():
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


def _finish(work, dst, uid, state, opts, t0) -> BuildResult:
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
        _rename(local, dst, t0)
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


def _rename(partial: str, dst: str, t0: float) -> BuildResult:
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


def format_result(res: BuildResult) -> str:
    if res.part is not None:
        i, n = res.part
        first, stop = res.part_records
        return (f"part {i}/{n} of {res.dst}: records {first}..{stop - 1} ({res.images} images) "
                f"written in {res.seconds:.1f} s; when every part is done, run "
                f"`pcrfs build --finalize {res.dst}`"
                + (f"\n{_requests_line(res.requests, res.images)}" if res.requests else ""))
    lines = [f"built {res.dst}: {res.images} images in {res.records} records, "
             f"{res.groups} scan groups, {res.seconds:.1f} s "
             f"({res.images / max(res.seconds, 1e-9):.0f} images/s)",
             f"converted from other formats: {res.converted}; skipped: {len(res.skipped)}"
             f" (see {os.path.join(res.dst, BUILD_REPORT)})",
             f"index: {res.index_bytes_per_image:.0f} bytes per image", "",
             format_summary(res.summary)]
    for s in res.skipped[:20]:
        lines.insert(2, f"  skipped {s['path']}: {s['reason']}")
    if res.requests:
        lines.insert(3, _requests_line(res.requests, res.images))
    return "\n".join(lines)


def _requests_line(requests: dict, images: int) -> str:
    per = ", ".join(f"{n} {m} ({n / max(images, 1):.2f}/image)"
                    for m, n in sorted(requests.items()))
    return f"object-storage requests: {per}"

