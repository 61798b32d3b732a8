"""Helpers of the remote-dataset tests."""
import hashlib
import os
import random
from pathlib import Path


def files_of(ds, view: str, rel: bytes = b"") -> list[bytes]:
    out = []
    for name, is_dir in ds.listdir(rel, view):
        p = rel + b"/" + name if rel else name
        out.extend(files_of(ds, view, p) if is_dir else [p])
    return out


def every_file(ds) -> list[tuple[str, bytes]]:
    return [(v, p) for v in ds.all_views for p in files_of(ds, v)]


# Made per read from qG's bytes (a transcode or a full decode per file): the remote tests
# read a few of them, since their fetch path is qG's; tests/test_l3_view.py and
# tests/test_liquid.py check every file of them locally.
DERIVED = ("l3", "raw")


def files_to_read(ds, views=None) -> list[tuple[str, bytes]]:
    """Every file of `views` (default: all) except the derived views', of which the first
    image of each record: one read per record still goes through the remote fetch."""
    out = []
    for v in views or ds.all_views:
        files = files_of(ds, v)
        if v in DERIVED:
            first = {}
            for p in files:
                first.setdefault(ds.source_entry(p, v).record, p)
            files = sorted(first.values())
        out.extend((v, p) for p in files)
    return out


def one_view_of_each_kind(ds) -> list[str]:
    """q1, a middle q, qG and l3: the store-specific tests read these, and test_s3 reads
    every view (the fetch path is one for every store)."""
    g = ds.groups
    return [v for v in dict.fromkeys(["q1", f"q{max(1, g // 2)}", f"q{g}", "l3"])
            if v in ds.all_views]


def in_record_order(ds, view: str) -> list[bytes]:
    return sorted(files_of(ds, view), key=lambda p: (ds.lookup(p).record, ds.lookup(p).index))


def shuffled(items, seed=0):
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def read(mnt: Path, view: str, rel: bytes) -> bytes:
    with open(os.path.join(os.fsencode(mnt), view.encode(), rel), "rb") as f:
        return f.read()


_EXPECTED: dict[tuple, tuple[int, bytes]] = {}


def same_as_local(data: bytes, local, view: str, rel: bytes) -> bool:
    """data equals local.read(rel, view), whose length and BLAKE2b are remembered per
    dataset: several tests compare every file of the same local build, and its l3/ and
    raw/ files cost a transcode or a decode each time they are made."""
    key = (str(local.root), view, rel)
    want = _EXPECTED.get(key)
    if want is None:
        want = _EXPECTED[key] = _digest(local.read(rel, view))
    return _digest(data) == want


def _digest(data: bytes) -> tuple[int, bytes]:
    return len(data), hashlib.blake2b(data, digest_size=32).digest()



def read_view(m, local, view: str, order: str, seed: int = 1) -> dict:
    """Every file of a view through mount `m`, in record order or shuffled, each checked
    against the local dataset: the files, and the GETs and bytes the pass cost the store
    (payload: the served segment bytes, without each file's EOI)."""
    before = m.stats()
    paths = in_record_order(local, view)
    if order == "random":
        paths = shuffled(paths, seed)
    for rel in paths:
        assert same_as_local(read(m.mnt, view, rel), local, view, rel), rel
    st = m.stats()
    return {"paths": paths, "stats": st,
            "gets": st["remote_requests"] - before["remote_requests"],
            "fetched": st["remote_bytes"] - before["remote_bytes"],
            "payload": st["served_bytes"][view] - 2 * len(paths)}


def read_while_killed(m, local, files: list, kill, io_timeout: float, threads: int = 4) -> dict:
    """`threads` readers take files from `files` until it is empty or more than 8 reads
    failed; once 8 reads succeeded, `kill()` stops the store.  Returns the successful
    read count, the errnos of the failures, failures slower than io_timeout + 3 s, and
    reads that returned wrong bytes."""
    import threading
    import time

    from conftest import wait_until
    out = {"ok": 0, "eio": [], "slow": [], "wrong": []}
    lock = threading.Lock()

    def reader():
        while True:
            with lock:
                if not files:
                    return
                v, p = files.pop()
            t = time.monotonic()
            try:
                data = read(m.mnt, v, p)
            except OSError as e:
                took = time.monotonic() - t
                out["eio"].append(e.errno)
                if took > io_timeout + 3:
                    out["slow"].append(took)
                if len(out["eio"]) > 8:
                    return
                continue
            if not same_as_local(data, local, v, p):
                out["wrong"].append((v, p))
            out["ok"] += 1
    ts = [threading.Thread(target=reader) for _ in range(threads)]
    for t in ts:
        t.start()
    wait_until(lambda: out["ok"] >= 8, 60, "reads before the kill")
    kill()
    for t in ts:
        t.join(120)
    return out


def killed_then_restarted(m, local, store, io_timeout: float) -> dict:
    """Kill `store` (a testkit server) under readers of every non-l3 file, then start it
    again: in-flight reads fail with EIO within io_timeout, never with wrong bytes; then
    12 files the readers never reached read right without a remount, from the restarted
    store.  Returns the mount's stats after."""
    import errno

    from conftest import wait_until
    files = shuffled([(v, p) for v, p in every_file(local) if v != "l3"], 5)
    r = read_while_killed(m, local, files, store.kill, io_timeout)
    assert r["ok"] > 0 and r["eio"] and set(r["eio"]) == {errno.EIO}, r
    assert not r["slow"], f"reads took {r['slow']} s with --io-timeout {io_timeout}"
    assert not r["wrong"]
    store.start()
    left = files[:12]
    assert len(left) == 12

    def recovered():                     # the first read after the restart may still fail
        try:
            return same_as_local(read(m.mnt, *left[0]), local, *left[0])
        except OSError:
            return False
    wait_until(recovered, 60, "reads to recover after the restart", interval=0.5)
    before = m.stats()["remote_requests"]
    for v, p in left:
        assert same_as_local(read(m.mnt, v, p), local, v, p)
    st = m.stats()
    assert st["remote_requests"] > before and m.alive()
    return st
