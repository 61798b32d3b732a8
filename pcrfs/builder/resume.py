"""Resuming a build: its state (STATE: the plan's hash, options and UUID) is written before
any record, so a killed build can be continued, in three ways: a local build's DST.partial
(--resume), a remote build's prefix (--resume, or --overwrite of another dataset), and a
--part build, whose parts share one state.  The records whose tasks completed are kept;
the rest are redone."""
from __future__ import annotations

import json
import os
import shutil
import uuid as uuidlib

from pcrfs.builder.plan import BuildOptions
from pcrfs.builder.task import NOTES_DIR, notes_key
from pcrfs.errors import DatasetError, PcrfsError
from pcrfs.format import AFTER_BUILD_META, MANIFEST, RECORDS_DIR, record_key
from pcrfs.format.atomic import fsync_dir
from pcrfs.format.indexpart import PARTS_DIR, belongs, parse_part, part_key, record_size
from pcrfs.format.manifest import read_manifest, write_json_atomic
from pcrfs.jobs.stores import LocalStore

STATE = "build-state.json"

SKIPPED_DIR = NOTES_DIR


def open_partial(partial: str, opts: BuildOptions, state: dict) -> uuidlib.UUID | None:
    """A local build's UUID (new, or the interrupted build's); None when DST.partial is a
    finished dataset that only awaits its rename (killed in the last steps)."""
    state_path = os.path.join(partial, STATE)
    if os.path.exists(partial):
        if not opts.resume:
            raise PcrfsError(f"{partial} holds an interrupted build: re-run with --resume to "
                             "continue it, or remove it to start over")
        if not os.path.exists(state_path) and _finished(partial, state["params"]):
            return None
        old = read_state(LocalStore(partial))
        same_plan(old, state, partial)
        os.makedirs(os.path.join(partial, SKIPPED_DIR), exist_ok=True)  # killed in finish
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


def read_state(work) -> dict:
    try:
        state = json.loads(work.read(STATE))
        state["uuid"], state["plan_hash"]   # noqa: B018 - the keys every state has
        return state
    except Exception as e:  # noqa: BLE001 - missing, unreadable or not our JSON
        from pcrfs.storage.objclient import RemoteError
        if isinstance(e, RemoteError) and not isinstance(e, not_found()):
            raise
        raise PcrfsError(f"{work.describe()}: no usable {STATE}; remove it and build again") from None


def not_found():
    from pcrfs.storage.objclient import RemoteNotFound
    return (FileNotFoundError, RemoteNotFound)


def same_plan(old: dict, state: dict, where: str) -> None:
    if old.get("plan_hash") != state["plan_hash"] or old.get("parts") != state.get("parts"):
        raise PcrfsError(f"{where}: the source tree or build options changed since the "
                         "interrupted build; remove it to start over")


def _finished(partial: str, params: dict) -> bool:
    """finish removes the state file only after the manifest is in place."""
    try:
        m = read_manifest(partial)
    except DatasetError:
        return False
    if m.get("build") != params:
        raise PcrfsError(f"{partial}: the build options changed since the interrupted build; "
                         "remove it to start over")
    return True


def open_remote(work, opts: BuildOptions, state: dict) -> uuidlib.UUID:
    """A remote build's UUID: the prefix holds no dataset (or --overwrite), and either no
    build state or this build's (--resume, or another part of the same --part build)."""
    try:
        old_manifest = json.loads(work.read(MANIFEST))
    except not_found():
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
        old = read_state(work)
        if opts.part is None and not opts.resume:
            raise PcrfsError(f"{work.describe()} holds an interrupted build: re-run with "
                             f"--resume to continue it")
        same_plan(old, state, work.describe())
        return uuidlib.UUID(old["uuid"])
    return _write_state(work, state, uuidlib.uuid4())


def _write_state(work, state: dict, uid: uuidlib.UUID) -> uuidlib.UUID:
    work.write(STATE, json.dumps({**state, "uuid": str(uid)}, indent=1,
                                 sort_keys=True).encode())
    return uid


def open_part(work, opts: BuildOptions, state: dict, uid: uuidlib.UUID) -> uuidlib.UUID:
    """Every part of a --part build writes the same state (if absent) and goes on; a state
    of another build is refused."""
    if not work.remote:
        os.makedirs(os.path.join(work.root, RECORDS_DIR), exist_ok=True)
        os.makedirs(os.path.join(work.root, SKIPPED_DIR), exist_ok=True)
    elif work.size(MANIFEST) is not None:
        raise PcrfsError(f"{work.describe()} already holds a dataset; remove it first")
    if work.size(STATE) is not None:
        old = read_state(work)
        same_plan(old, state, work.describe())
        if old["uuid"] != str(uid):
            raise PcrfsError(f"{work.describe()}: another build's state; remove it to start over")
        return uid
    return _write_state(work, state, uid)


def finished_records(work, uid: uuidlib.UUID, numbers: list[int]) -> set[int]:
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
