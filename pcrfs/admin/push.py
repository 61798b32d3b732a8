"""`pcrfs push DST URL`: publish a local dataset to s3://, gs:// or az:// object storage.

The manifest goes last, so a reader never sees half a dataset: until it lands the URL is
not a dataset (mount refuses it), and a mount of an earlier dataset at the same URL is
told apart by its UUID.  Replacing a *different* dataset needs --overwrite: its manifest
is deleted first (the URL stops being a dataset), then the new objects go up, then stale
ones are removed, then the new manifest.  Pushing the same dataset again, or after an
interrupted push (PUSH_MARKER names the dataset being uploaded), resumes: objects already
there with the right size are skipped."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from pcrfs.errors import PcrfsError
from pcrfs.format import (
    AFTER_BUILD_META,
    INDEX_FILE,
    MANIFEST,
    OPTIONAL_META,
    RAW_DIR,
    RECORDS_DIR,
    dataset_object,
)
from pcrfs.format.manifest import read_manifest
from pcrfs.storage.objclient import WRITABLE, ObjectClient, RemoteError, RemoteNotFound, RemoteOptions

log = logging.getLogger("pcrfs.push")
META = (INDEX_FILE, *OPTIONAL_META)      # what a remote mount fetches besides the records
PUSH_MARKER = "push-in-progress.json"


@dataclass
class PushResult:
    url: str
    uploaded: int = 0
    skipped: int = 0
    deleted: int = 0
    bytes: int = 0


def dataset_files(dst: str) -> list[tuple[str, str]]:
    """(key, local path) of everything a reader needs, manifest excluded."""
    out = []
    rec = os.path.join(dst, RECORDS_DIR)
    for name in sorted(os.listdir(rec)):
        if name.endswith((".pcr", ".l3m")):
            out.append((f"{RECORDS_DIR}/{name}", os.path.join(rec, name)))
    raw = os.path.join(dst, RAW_DIR)
    if os.path.isdir(raw):
        for name in sorted(os.listdir(raw)):
            if name.endswith(".ppk"):
                out.append((f"{RAW_DIR}/{name}", os.path.join(raw, name)))
    for key in META:
        path = os.path.join(dst, key)
        if os.path.isfile(path):
            out.append((key, path))
    return out


@dataclass(frozen=True)
class Upload:
    url: str
    opts: RemoteOptions | None
    key: str
    path: str


def upload(task: Upload, pool=None) -> int:
    """PUT one file (a task for jobs/engine.run_tasks); its size."""
    from pcrfs.jobs.stores import ObjectStore
    ObjectStore(task.url, task.opts).client.put_file(task.key, task.path)
    return os.path.getsize(task.path)


def push(dst: str, url: str, opts: RemoteOptions | None = None, *, overwrite: bool = False,
         jobs: int = 8, progress: bool = True, engine: str = "local") -> PushResult:
    """engine: jobs/engine.py's; with Dask, every worker must see DST at the same path
    (a shared file system) and hold the store's credentials."""
    from pcrfs.jobs.engine import check_engine, run_tasks
    check_engine(engine)
    if not url.startswith(WRITABLE):
        raise PcrfsError(f"{url}: push uploads to s3://, gs:// or az://; for http(s):// serve the "
                         f"dataset directory itself (any web server with Range support)")
    manifest = read_manifest(dst)   # refuses an incomplete build
    client = ObjectClient(url, opts)
    res = PushResult(url=client.describe())
    try:
        old = json.loads(client.get(MANIFEST))
    except RemoteNotFound:
        old = None
    except ValueError:
        old = {"uuid": "(unreadable manifest)"}
    except RemoteError as e:
        raise PcrfsError(f"cannot push to {client.describe()}: {e}") from None
    same = old is not None and old.get("uuid") == manifest["uuid"]
    if old is not None and not same:
        if not overwrite:
            raise PcrfsError(f"{client.describe()} holds another dataset ({old.get('uuid')}); "
                             f"use --overwrite to replace it")
        client.delete(MANIFEST)  # from here on the URL is not a dataset
        remote = dict(client.list())
        for key in AFTER_BUILD_META:     # the old dataset's: the new one must not inherit them
            if key in remote:
                client.delete(key)
    files = dataset_files(dst)
    remote = dict(client.list())
    if not same and remote.get(PUSH_MARKER) is not None:
        try:
            same = json.loads(client.get(PUSH_MARKER)).get("uuid") == manifest["uuid"]
        except (RemoteError, ValueError, AttributeError):
            same = False
    client.put_bytes(PUSH_MARKER, json.dumps({"uuid": manifest["uuid"]}).encode())
    todo = [(k, p) for k, p in files if not (same and remote.get(k) == os.path.getsize(p))]
    res.skipped = len(files) - len(todo)
    total = sum(os.path.getsize(p) for _, p in todo)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="push", leave=False)

    def uploaded(size: int):
        if bar is not None:
            bar.update(size)
    try:
        tasks = [Upload(url, opts, key, os.path.abspath(path)) for key, path in todo]
        # one upload per task; locally `jobs` at once, on Dask one per worker thread
        run_tasks(upload, tasks, engine, max(1, jobs), uploaded,
                  name=f"pcrfs-push-{manifest['uuid']}-{os.getpid()}", in_flight=max(1, jobs))
    except RemoteError as e:
        raise PcrfsError(f"push to {client.describe()} failed: {e}; the dataset is not "
                         f"published (no manifest); run the same command again to resume") from None
    finally:
        if bar is not None:
            bar.close()
    res.uploaded, res.bytes = len(todo), total
    keep = {k for k, _ in files} | {MANIFEST, PUSH_MARKER}
    for key in remote:
        if key not in keep and dataset_object(key):   # the old dataset's, index.segtab too
            client.delete(key)
            res.deleted += 1
    client.put_file(MANIFEST, os.path.join(dst, MANIFEST))
    client.delete(PUSH_MARKER)
    log.info("pushed %s to %s", dst, res.url)
    return res
