"""`pcrfs build`: plan, transcode in worker processes, write records, index, manifest.

Crash safety: everything is written under DST.partial/; each record appears only once
complete (tmp + fsync + rename), the manifest is written last, and DST.partial becomes
DST by one rename.  A killed build leaves only DST.partial, which never opens as a
dataset; `--resume` keeps its finished records and redoes the rest."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
import uuid as uuidlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tqdm import tqdm

from pcrfs.builder.indexer import build_index
from pcrfs.builder.prepare import MAX_PIXELS, Prepared, PrepareOptions, prepare
from pcrfs.builder.scans import parse_scan_script
from pcrfs.builder.walk import SourceFile, walk_sources
from pcrfs.errors import DatasetError, PcrfsError
from pcrfs.format import BUILD_REPORT, FORMAT_VERSION, INDEX_DIR, MANIFEST, RECORDS_DIR, record_name
from pcrfs.format import segtab
from pcrfs.format.l3meta import sidecar_path, write_l3meta
from pcrfs.format.atomic import fsync_dir
from pcrfs.format.manifest import metadata_sums, read_manifest, write_json_atomic
from pcrfs.format.record import FLAG_CONVERTED, ImageMeta, read_header_path, write_record
from pcrfs.summary import format_summary, size_summary

STATE = "build-state.json"
SKIPPED_DIR = "skipped"


@dataclass
class BuildOptions:
    workers: int = 0                 # worker threads; 0: all cores
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


def _display(p: bytes) -> str:
    return os.fsdecode(p)


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


def _params(opts: BuildOptions, script_text: str | None) -> dict:
    return {"images_per_record": opts.images_per_record, "shuffle_seed": opts.shuffle_seed,
            "scans": "default" if script_text is None else script_text,
            "keep_metadata": opts.keep_metadata, "quality": opts.quality,
            "views": sorted(opts.views), "max_pixels": opts.max_pixels}


def _open_partial(partial: str, opts: BuildOptions, plan_hash: str,
                  params: dict) -> uuidlib.UUID | None:
    """The build's UUID (new, or the interrupted build's); None when DST.partial is a
    finished dataset that only awaits its rename (killed in the last steps)."""
    state_path = os.path.join(partial, STATE)
    if os.path.exists(partial):
        if not opts.resume:
            raise PcrfsError(f"{partial} holds an interrupted build: re-run with --resume to "
                             "continue it, or remove it to start over")
        if not os.path.exists(state_path) and _finished(partial, params):
            return None
        try:
            with open(state_path) as f:
                state = json.load(f)
        except (OSError, json.JSONDecodeError):
            raise PcrfsError(f"{partial}: no usable {STATE}; remove it and build again") from None
        if state.get("plan_hash") != plan_hash:
            raise PcrfsError(f"{partial}: the source tree or build options changed since the "
                             "interrupted build; remove it to start over")
        os.makedirs(os.path.join(partial, SKIPPED_DIR), exist_ok=True)  # killed in _finish
        return uuidlib.UUID(state["uuid"])
    # Staged and renamed: a kill at any moment leaves either no DST.partial or one that
    # --resume can continue (never one without its state file).
    staging = partial + ".new"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(os.path.join(staging, RECORDS_DIR))
    os.makedirs(os.path.join(staging, SKIPPED_DIR))
    uid = uuidlib.uuid4()
    write_json_atomic(os.path.join(staging, STATE), {"uuid": str(uid), "plan_hash": plan_hash})
    os.rename(staging, partial)
    fsync_dir(os.path.dirname(os.path.abspath(partial)))
    return uid


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


def _finished_chunks(partial: str, uid: uuidlib.UUID, n_chunks: int) -> set[int]:
    done = set()
    for r in range(n_chunks):
        rec = os.path.join(partial, RECORDS_DIR, record_name(r))
        skipped = os.path.join(partial, SKIPPED_DIR, f"{r:06d}.json")
        if not (os.path.exists(rec) and os.path.exists(skipped)):
            continue
        try:
            if read_header_path(rec).dataset_uuid == uid:
                done.add(r)
                continue
        except DatasetError:
            pass
        os.unlink(rec)  # damaged by the crash: redo it
    return done


def _write_chunk(partial: str, r: int, uid: uuidlib.UUID, classes: list[bytes],
                 results: list[Prepared], l3: bool) -> None:
    good = [p for p in results if p.ok]
    skipped = [{"path": _display(p.relpath), "reason": p.reason} for p in results if not p.ok]
    notes = {"skipped": skipped,
             "converted": [_display(p.relpath) for p in good if p.converted],
             "warnings": [{"path": _display(p.relpath), "warning": p.warning}
                          for p in good if p.warning],
             "source_bytes": sum(p.source_bytes for p in good)}
    write_json_atomic(os.path.join(partial, SKIPPED_DIR, f"{r:06d}.json"), notes)
    metas = [ImageMeta(p.relpath, p.label, p.width, p.height, p.components,
                       FLAG_CONVERTED if p.converted else 0) for p in good]
    segments = [p.segments() for p in good]
    groups = max((len(s) for s in segments), default=1)
    path = os.path.join(partial, RECORDS_DIR, record_name(r))
    if l3:  # before the record: a record on disk means its chunk is complete
        write_l3meta(sidecar_path(path), r, uid, [(p.l3_size, p.l3_xxh) for p in good])
    write_record(path, r, uid, classes, metas, segments, groups)


def build(src: str, dst: str, opts: BuildOptions) -> BuildResult:
    t0 = time.monotonic()
    if not os.path.isdir(src):
        raise PcrfsError(f"{src}: not a directory")
    dst = dst.rstrip("/")
    if os.path.exists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
        raise PcrfsError(f"{dst} already exists; choose a new destination")
    if opts.images_per_record < 1:
        raise PcrfsError("--images-per-record must be at least 1")
    if not 1 <= opts.quality <= 100:
        raise PcrfsError("--quality must be 1-100")
    script_text = None
    script, script_comps = None, 0
    if opts.scans != "default":
        with open(opts.scans) as f:
            script_text = f.read()
        rows, script_comps = parse_scan_script(script_text)
        script = tuple(tuple(r) for r in rows)

    classes, files, stray = walk_sources(src)
    if not files:
        raise PcrfsError(f"{src}: no files under class directories (expected SRC/class/image)")
    plan = _plan(files, opts)
    params = _params(opts, script_text)
    partial = dst + ".partial"
    uid = _open_partial(partial, opts, _plan_hash(plan, classes, params), params)
    if uid is None:
        return _rename(partial, dst, t0)
    n = opts.images_per_record
    chunks = [plan[i : i + n] for i in range(0, len(plan), n)]
    done = _finished_chunks(partial, uid, len(chunks))
    todo = [r for r in range(len(chunks)) if r not in done]

    unknown = set(opts.views) - {"l3"}
    if unknown:
        raise PcrfsError(f"--views: unknown format view(s) {', '.join(sorted(unknown))} (known: l3)")
    l3 = "l3" in opts.views
    popts = PrepareOptions(opts.keep_metadata, opts.quality, script, script_comps, l3,
                           opts.max_pixels)
    src_b = os.fsencode(src)
    workers = opts.workers or os.cpu_count() or 1
    bar = tqdm(total=len(plan), initial=sum(len(chunks[r]) for r in done), unit="img",
               desc="build", disable=not opts.progress, smoothing=0.1)
    # Threads, not processes: the C transcoder and Pillow's codecs release the GIL, so
    # threads scale across cores without pickling every image between processes.  One
    # record is prepared ahead while the previous one is written.
    with ThreadPoolExecutor(workers, thread_name_prefix="pcrfs-build") as pool:
        pending: deque = deque()
        def submit(r):
            futs = [pool.submit(prepare, src_b, f.relpath, f.label, popts) for f in chunks[r]]
            for fut in futs:
                fut.add_done_callback(lambda _: bar.update(1))
            pending.append((r, futs))
        try:
            for r in todo:
                submit(r)
                if len(pending) > 1:
                    r0, futs = pending.popleft()
                    _write_chunk(partial, r0, uid, classes, [f.result() for f in futs], l3)
            while pending:
                r0, futs = pending.popleft()
                _write_chunk(partial, r0, uid, classes, [f.result() for f in futs], l3)
        except BaseException:
            for _, futs in pending:
                for f in futs:
                    f.cancel()
            raise
    bar.close()
    return _finish(src, dst, partial, uid, classes, stray, params, opts, t0, len(plan))


def _finish(src, dst, partial, uid, classes, stray, params, opts, t0, planned) -> BuildResult:
    notes = {"skipped": [], "converted": [], "warnings": [], "source_bytes": 0}
    for name in sorted(os.listdir(os.path.join(partial, SKIPPED_DIR))):
        with open(os.path.join(partial, SKIPPED_DIR, name)) as f:
            part = json.load(f)
        for k in ("skipped", "converted", "warnings"):
            notes[k] += part[k]
        notes["source_bytes"] += part["source_bytes"]
    notes["skipped"] += [{"path": _display(s), "reason": "not inside a class directory"}
                         for s in stray]
    if opts.strict and notes["skipped"]:
        shutil.rmtree(partial, ignore_errors=True)
        names = "\n  ".join(f"{s['path']}: {s['reason']}" for s in notes["skipped"])
        raise PcrfsError(f"--strict: {len(notes['skipped'])} file(s) could not be "
                         f"converted:\n  {names}")
    shutil.rmtree(os.path.join(partial, INDEX_DIR), ignore_errors=True)  # a killed run's
    stats = build_index(partial, uid)
    if stats.images == 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise PcrfsError(f"{src}: no image could be converted")
    summary = size_summary(stats.sizes, notes["source_bytes"] / stats.images)
    seconds = time.monotonic() - t0
    report = {
        "source": os.path.abspath(src), "planned": planned, "images": stats.images,
        "skipped": notes["skipped"], "converted": notes["converted"],
        "warnings": notes["warnings"], "summary": summary,
        "empty_classes": [os.fsdecode(c) for c in stats.empty_classes],
        "source_bytes": notes["source_bytes"],
        "dataset_bytes": _dir_bytes(os.path.join(partial, RECORDS_DIR)),
        "index_bytes": stats.index_bytes,
        "index_bytes_per_image": round(stats.index_bytes / stats.images, 1),
        "seconds": round(seconds, 3),
    }
    write_json_atomic(os.path.join(partial, BUILD_REPORT), report)
    manifest = {
        "format": "pcrfs", "format_version": FORMAT_VERSION, "uuid": str(uid),
        "images": stats.images, "records": stats.records, "groups": stats.groups,
        "classes": [os.fsdecode(c) for c in classes],
        "build": params, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "summary": summary, "index_bytes": stats.index_bytes,
        "format_views": ["l3"] if stats.l3 else [],
        "dataset_bytes": report["dataset_bytes"], "source_bytes": notes["source_bytes"],
        "files": metadata_sums(partial),
    }
    # the lane's segment table and names, tied to this index (format/segtab.py), so a
    # mount maps them; written before the manifest, which says the build is complete
    segtab.write_for(partial, manifest)
    write_json_atomic(os.path.join(partial, MANIFEST), manifest, self_sum=True)
    # The build's own files go last: a partial without its state file is complete.
    shutil.rmtree(os.path.join(partial, SKIPPED_DIR))
    os.unlink(os.path.join(partial, STATE))
    fsync_dir(partial)
    _rename(partial, dst, t0)
    return BuildResult(dst, str(uid), stats.images, stats.records, stats.groups,
                       notes["skipped"], len(notes["converted"]), seconds, summary,
                       report["index_bytes_per_image"])


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


def _dir_bytes(path: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


def format_result(res: BuildResult) -> str:
    lines = [f"built {res.dst}: {res.images} images in {res.records} records, "
             f"{res.groups} scan groups, {res.seconds:.1f} s "
             f"({res.images / max(res.seconds, 1e-9):.0f} images/s)",
             f"converted from other formats: {res.converted}; skipped: {len(res.skipped)}"
             f" (see {os.path.join(res.dst, BUILD_REPORT)})",
             f"index: {res.index_bytes_per_image:.0f} bytes per image", "",
             format_summary(res.summary)]
    for s in res.skipped[:20]:
        lines.insert(2, f"  skipped {s['path']}: {s['reason']}")
    return "\n".join(lines)

