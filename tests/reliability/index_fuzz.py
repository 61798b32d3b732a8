"""Fuzzing what pcrfs parses of an untrusted dataset (issue 84): the manifest's fields, the
index's entries and its directory listings, crafted with pcrfs's own writers so every
checksum holds.  Each example opens the dataset and reads every image at q1 and qG; the
only outcomes allowed are a refusal (DatasetError) and a file's own EIO (CorruptDataError);
any other exception, a MemoryError under the child's address-space limit included, is a
finding.  LMDB's own page structure is not mutated: LMDB does not check it, and
docs/SECURITY.md says so.

    python tests/reliability/index_fuzz.py DATASET --examples N [--seconds S]

reads each dataset under RLIMIT_AS at 3 GiB (`make fuzz`: FUZZ_SECONDS; the suite: a bounded
run, tests/reliability/test_index_fuzz.py).  Prints one JSON line: examples run, outcomes."""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))     # tests/: hostile.py

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

U32 = st.integers(0, 2**32 - 1)
LIMIT = [3 << 30]       # RLIMIT_AS while pcrfs reads a crafted dataset
ROUND = 500             # examples per hypothesis run (a deadline is checked between them)
ODD_INT = st.one_of(st.integers(-2**63, 2**63), st.floats(allow_nan=True), st.text(max_size=5),
                    st.none(), st.lists(st.integers(), max_size=3))
NAME = st.one_of(st.sampled_from([b"..", b".", b"", b"a/b", b"x\0y", b"/abs", b"n" * 300]),
                 st.binary(min_size=1, max_size=12))

MANIFEST = st.fixed_dictionaries({}, optional={
    "groups": ODD_INT, "images": ODD_INT, "uuid": st.one_of(st.text(max_size=40), ODD_INT),
    "classes": st.one_of(st.lists(st.one_of(st.text(max_size=8), st.integers()), max_size=4),
                         ODD_INT),
    "files": st.one_of(st.just({}), st.dictionaries(st.text(max_size=8), ODD_INT, max_size=2)),
})
ENTRY = st.fixed_dictionaries({}, optional={
    "record": U32, "index": U32, "nseg": st.integers(0, 255), "label": st.integers(-2**31, 2**31 - 1),
    "width": st.integers(0, 65535), "height": st.integers(0, 65535),
    "ends": st.lists(U32, min_size=1, max_size=12), "offsets": st.lists(U32, min_size=1, max_size=12),
})


def craft(template: Path, work: Path, manifest: dict, entries: dict[int, dict],
          rename: dict[int, bytes]) -> Path:
    """A copy of template with these manifest fields, entry fields (by position in the
    index) and image names (the last component of the i-th path), resealed."""
    from hostile import reseal, rewrite_index

    from pcrfs.format.index import ENTRY as HEAD
    ds = work / "ds"
    shutil.rmtree(ds, ignore_errors=True)
    shutil.copytree(template, ds)
    order = {}

    def patch(path: bytes, v: bytes) -> bytes:
        i = order.setdefault(path, len(order))
        e = entries.get(i)
        if not e:
            return v
        rec, idx, label, w, h, comps, flags, nseg = HEAD.unpack_from(v, 0)
        rec, idx, label = e.get("record", rec), e.get("index", idx), e.get("label", label)
        w, h, nseg = e.get("width", w), e.get("height", h), e.get("nseg", nseg)
        body = bytearray(v[HEAD.size:])
        for j, end in enumerate(e.get("ends", [])):
            if 12 * j + 4 <= len(body):
                struct.pack_into("<I", body, 12 * j, end)
        for j, off in enumerate(e.get("offsets", [])):
            if 12 * j + 8 <= len(body):
                struct.pack_into("<I", body, 12 * j + 4, off)
        return HEAD.pack(rec, idx, label, w, h, comps, flags, nseg) + bytes(body)

    from pcrfs.format.index import IndexReader
    r = IndexReader(str(ds / "index.lmdb"))
    paths = sorted(p for p, _ in r.iter_images())
    r.close(wait=True)
    names = {}
    for i, name in rename.items():
        if i < len(paths):
            head, _, _ = paths[i].rpartition(b"/")
            names[paths[i]] = (head + b"/" if head else b"") + name
    if len(set(names.values()) | (set(paths) - set(names))) < len(paths):
        names = {}                        # a duplicate path: the writer itself refuses it
    rewrite_index(ds, rename=names, patch=patch)
    reseal(ds, **manifest)
    return ds


def attempt(ds: Path) -> str:
    """'refused', or 'opened' with how many files were EIO; raises anything else."""
    import pcrfs
    from pcrfs.errors import CorruptDataError, DatasetError
    try:
        d = pcrfs.open_dataset(str(ds))
    except DatasetError:
        return "refused"
    try:
        eio = 0
        with d.index.env.begin() as txn:     # the keys alone: an entry may not decode
            paths = [bytes(k) for k in txn.cursor(d.index._db[b"images"]).iternext(values=False)]
        for view in ("q1", d.views[-1]):
            for p in paths:
                try:
                    d.read(p, view)
                except (CorruptDataError, FileNotFoundError):
                    eio += 1
        return f"opened, {eio} EIO"
    finally:
        d.close()


def run(template: Path, examples: int, seconds: float) -> dict:
    """Rounds of at most ROUND examples until `examples` ran or `seconds` passed."""
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    def one(manifest, entries, rename):
        with tempfile.TemporaryDirectory(prefix="pcrfs-index-fuzz-") as work:
            try:
                ds = craft(template, Path(work), manifest, entries, rename)
            except Exception as e:     # noqa: BLE001 - the writers refuse what they cannot write
                key = f"not writable ({type(e).__name__})"
                outcomes[key] = outcomes.get(key, 0) + 1
                return
            # the address-space limit holds while pcrfs reads the dataset (the writers
            # reserve LMDB's whole map, so crafting runs without it)
            resource.setrlimit(resource.RLIMIT_AS, (LIMIT[0], resource.RLIM_INFINITY))
            try:
                what = attempt(ds)
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
            key = what.split(",")[0]
            outcomes[key] = outcomes.get(key, 0) + 1

    done = 0
    while done < examples and time.monotonic() < deadline:
        n = min(ROUND, examples - done)

        @settings(max_examples=n, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.one_of(st.just({}), MANIFEST),    # half the examples reach the entries
               st.dictionaries(st.integers(0, 23), ENTRY, max_size=3),
               st.dictionaries(st.integers(0, 23), NAME, max_size=2))
        def rnd(manifest, entries, rename):
            one(manifest, entries, rename)
        rnd()
        done += n
    return {"examples": sum(outcomes.values()), "outcomes": outcomes}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("template", help="a small built dataset (24 images)")
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--memory", type=int, default=3 << 30, help="RLIMIT_AS bytes")
    a = ap.parse_args()
    LIMIT[0] = a.memory
    print(json.dumps(run(Path(a.template), a.examples, a.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
