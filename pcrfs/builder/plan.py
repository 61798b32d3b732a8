"""A build's plan, before anything is written: the options, the source (a directory or
an object-store prefix, walked into class-labelled files), their order (sorted or
shuffled), the records they fall into and the slice a --part build owns; and the hash and
UUID every part of one build derives alike from it."""
from __future__ import annotations

import hashlib
import json
import os
import random
import uuid as uuidlib
from dataclasses import dataclass, field

from pcrfs.builder.prepare import MAX_PIXELS
from pcrfs.builder.scans import parse_scan_script
from pcrfs.builder.walk import SourceFile, walk_listing, walk_sources
from pcrfs.errors import PcrfsError
from pcrfs.jobs.engine import check_engine
from pcrfs.jobs.stores import LocalStore, open_store

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
    restart_bytes: int = 0           # > 0: instead, each scan's intervals of at most N bytes


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


def plan_files(files: list[SourceFile], opts: BuildOptions) -> list[SourceFile]:
    files = list(files)
    if opts.shuffle_seed is not None:
        random.Random(opts.shuffle_seed).shuffle(files)
    return files


def plan_hash(plan: list[SourceFile], classes: list[bytes], params: dict) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(params, sort_keys=True).encode())
    for c in classes:
        h.update(b"c" + c + b"\0")
    for f in plan:
        h.update(f.relpath + b"\0" + str(f.label).encode() + b"\0")
    return h.hexdigest()


def part_uuid(plan: list[SourceFile], plan_hash: str, parts: int) -> uuidlib.UUID:
    """What every part of one --part build computes alike (sizes included, so a changed
    source gets a new UUID and no cache keyed by it serves old bytes)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{plan_hash}/{parts}".encode())
    for f in plan:
        h.update(f.size.to_bytes(8, "little", signed=True))
    return uuidlib.uuid5(PART_NAMESPACE, h.hexdigest())


def params_of(opts: BuildOptions, script_text: str | None) -> dict:
    return {"images_per_record": opts.images_per_record, "shuffle_seed": opts.shuffle_seed,
            "scans": "default" if script_text is None else script_text,
            "keep_metadata": opts.keep_metadata, "quality": opts.quality,
            "views": sorted(opts.views), "max_pixels": opts.max_pixels,
            "restart_rows": opts.restart_rows} | (
                {"restart_bytes": opts.restart_bytes} if opts.restart_bytes else {})


def open_source(src: str, opts: BuildOptions):
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


def check_options(opts: BuildOptions) -> tuple[str | None, tuple | None, int]:
    if opts.images_per_record < 1:
        raise PcrfsError("--images-per-record must be at least 1")
    if not 1 <= opts.quality <= 100:
        raise PcrfsError("--quality must be 1-100")
    if not 0 <= opts.restart_rows <= 65535:
        raise PcrfsError("--restart-rows must be 0-65535 (0: no restart markers)")
    if not 0 <= opts.restart_bytes <= 1 << 20:
        raise PcrfsError("--restart-bytes must be 0-1048576 (0: --restart-rows decides)")
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


def record_slice(n_records: int, part: tuple[int, int] | None) -> range:
    if part is None:
        return range(n_records)
    i, n = part
    return range(i * n_records // n, (i + 1) * n_records // n)
