"""manifest.json: written last and atomically; its presence means the build is complete.

It carries its own checksum (SELF_SUM: XXH3-64 of its canonical JSON without that key) and
the size and XXH3-64 of every metadata file written before it (`files`: the LMDB index,
the build report), so `pcrfs verify` can vouch for every byte that carries meaning.
Manifests of older builds have neither and stay readable."""
from __future__ import annotations

import json
import os
import uuid as uuidlib

import xxhash

from pcrfs.errors import DatasetError
from pcrfs.format import BUILD_REPORT, FORMAT_VERSION, INDEX_FILE, MANIFEST
from pcrfs.format.atomic import atomic_write, fsync_dir

SELF_SUM = "xxh3"


def canonical_sum(obj: dict) -> str:
    """XXH3-64 (hex) of a JSON object's content, its own SELF_SUM key left out: any change
    of meaning changes it, reformatting does not."""
    body = {k: v for k, v in obj.items() if k != SELF_SUM}
    return xxhash.xxh3_64_hexdigest(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def file_sum(path: str) -> dict:
    """{"bytes", "xxh3"} of a file, streamed."""
    h, n = xxhash.xxh3_64(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "xxh3": h.hexdigest()}


def check_self_sum(obj: dict, what: str) -> None:
    """DatasetError if obj carries a SELF_SUM that its content does not match."""
    want = obj.get(SELF_SUM)
    if want is not None and canonical_sum(obj) != want:
        raise DatasetError(f"{what}: damaged (its checksum does not match its content); "
                           "restore it from a backup or rebuild")


def json_text(obj, self_sum: bool = False) -> str:
    """A dataset JSON file's text: sorted keys, indented, with its SELF_SUM if asked."""
    if self_sum:
        obj = {**obj, SELF_SUM: canonical_sum(obj)}
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: str, obj, self_sum: bool = False) -> None:
    with atomic_write(path, "w") as f:
        f.write(json_text(obj, self_sum))
    fsync_dir(os.path.dirname(path) or ".")


def read_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST)
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: no such dataset directory")
    try:
        with open(path) as f:
            m = json.load(f)
    except FileNotFoundError:
        if not any(os.path.exists(os.path.join(root, n)) for n in (
                "records", "index.lmdb", "build-state.json", ".partial")):
            raise DatasetError(f"{root}: not a pcrfs dataset (no {MANIFEST}; "
                               f"`pcrfs build SRC DST` makes one)") from None
        raise DatasetError(
            f"{root}: no {MANIFEST}; the build did not finish (re-run `pcrfs build --resume`)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: unreadable manifest: {e}") from None
    if not isinstance(m, dict):
        raise DatasetError(f"{path}: unreadable manifest: not a JSON object")
    check_self_sum(m, path)
    if m.get("format") != "pcrfs" or m.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{path}: not a pcrfs v{FORMAT_VERSION} manifest")
    check_fields(m, path)
    return m


MAX_GROUPS = 64     # a JPEG has at most ~16 useful scans; anything more is crafted
MAX_IMAGES = 1 << 40
MAX_CLASSES = 1 << 24


def check_fields(m: dict, where: str) -> None:
    """The fields every reader sizes something by, bounded before anything is allocated
    (a crafted `groups: 1e9` ran out of memory, `1000000` spun for minutes): DatasetError
    naming the first bad one."""
    def bad(field: str, why: str):
        raise DatasetError(f"{where}: field {field!r} {why}; the manifest is refused")
    try:
        uuidlib.UUID(str(m.get("uuid")))
    except ValueError:
        bad("uuid", "is not a UUID")
    g = m.get("groups")
    if type(g) is not int or not 1 <= g <= MAX_GROUPS:
        bad("groups", f"is {g!r}, not an integer in 1..{MAX_GROUPS}")
    n = m.get("images")
    if type(n) is not int or not 0 <= n <= MAX_IMAGES:
        bad("images", f"is {n!r}, not an integer in 0..{MAX_IMAGES}")
    c = m.get("classes", [])
    if not isinstance(c, list) or len(c) > MAX_CLASSES or not all(isinstance(x, str) for x in c):
        bad("classes", "is not a list of names")
    files = m.get("files", {})
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and type(v.get("bytes")) is int and isinstance(v.get("xxh3"), str)
            for v in files.values()):
        bad("files", "is not a table of {bytes, xxh3}")


def check_index_sum(root: str, m: dict) -> None:
    """The index file against the size and XXH3 the manifest carries, before LMDB maps it
    (a truncated or damaged data.mdb gave SIGBUS, or worse, inside LMDB).  A manifest
    without them (an older build) is not checked here."""
    want = m.get("files", {}).get(INDEX_FILE)
    if want is None:
        return
    path = os.path.join(root, INDEX_FILE)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise DatasetError(f"index missing: {path} (`pcrfs reindex` rebuilds it)") from None
    except OSError as e:
        raise DatasetError(f"{path}: {e.strerror}") from None
    if size != want["bytes"] or file_sum(path) != want:
        raise DatasetError(f"{path}: does not match the manifest's checksum ({size} bytes, "
                           f"{want['bytes']} recorded): damaged or replaced; restore it or "
                           f"run `pcrfs reindex`")


# metadata files written before the manifest, whose bytes it vouches for
SUMMED_FILES = (INDEX_FILE, BUILD_REPORT)


def metadata_sums(root: str) -> dict:
    return {rel: file_sum(os.path.join(root, rel)) for rel in SUMMED_FILES
            if os.path.exists(os.path.join(root, rel))}
