"""One memory budget (storage/budget.py): while 8 threads read a dataset at least 4x the
budget across q, l3 and dynamic views for 30 s per arm, the daemon's RSS stays under what it was
before the first read plus the budget plus a fixed overhead."""
import os
import random
import threading
import time

import pytest

from pcrfs.control import set_fidelity
from pcrfs.dataset import open_dataset

# per arm (the lane's cold path on, and off): 20 s in make test, PCRFS_BUDGET_SECONDS in soak
SECONDS = float(os.environ.get("PCRFS_BUDGET_SECONDS", "15"))
THREADS = 8
BUDGET = 8 << 20
# What the budget does not count (storage/budget.py): the index's pages, metadata, the
# image each worker thread is assembling (an l3 file with its decoded pixels), thread
# stacks and the allocator's slack.
FIXED = 40 << 20
VIEWS = ("q3", "q10", "l3", "dynamic")


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))


@pytest.mark.parametrize("lane_cold", ["yes", "no"])
def test_rss_stays_within_the_budget_plus_a_fixed_overhead(crops_ds, mount, record, tmp_path,
                                                          lane_cold):
    """lane_cold=yes: q and dynamic files the lane has not kept are read by it in C (its
    buffers are inside the lane store's share); no: by Python, and readers 0 and 1 fill
    the memory tier with record extents."""
    ds = open_dataset(str(crops_ds))
    files = {v: [p for p in _files(ds, v)] for v in ("q3", "q10", "l3")}
    data_bytes = sum(ds.file_size(p, v) for v, ps in files.items() for p in ps)
    assert data_bytes >= 4 * BUDGET
    m = mount(crops_ds, "--cache-size", str(BUDGET), "--cache-dir", tmp_path / "cache",
              "--fidelity", "10", "-o", f"lane_cold={lane_cold}")
    set_fidelity(m.mnt, 10)
    budget = m.stats()["memory_budget"]
    assert budget["total"] == BUDGET and budget["lane_store"] > 0 and budget["open_files"] > 0
    base = _rss(m.pid)
    stop = time.monotonic() + SECONDS
    counts = {"reads": 0, "bytes": 0}
    problems = []
    lock = threading.Lock()

    by_record = {}
    for p in files["q10"]:
        e = ds.lookup(p)
        by_record.setdefault(e.record, []).append((e.index, p))
    walks = [[p for _, p in sorted(v)] for v in by_record.values()]

    def reader(seed):
        """Random files of random views; readers 0 and 1 walk whole records in order at
        q10 (a record-aware sampler: record extents fill the memory tier)."""
        rnd = random.Random(seed)
        n = b = 0
        walk: list = []
        while time.monotonic() < stop:
            if seed < 2:
                walk = walk or list(rnd.choice(walks))
                view, path = "q10", walk.pop(0)
            else:
                view = rnd.choice(VIEWS)
                path = rnd.choice(files["q10" if view == "dynamic" else view])
            try:
                fd = os.open(m.mnt / view / os.fsdecode(path), os.O_RDONLY)
                try:
                    data = b"".join(iter(lambda fd=fd: os.read(fd, 1 << 20), b""))
                    # out of the kernel's page cache: the next read reaches the daemon
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except OSError as e:
                problems.append(f"{view}/{path}: {e}")
                continue
            n, b = n + 1, b + len(data)
            if len(data) != ds.file_size(path, "q10" if view == "dynamic" else view):
                problems.append(f"{view}/{path}: wrong size")
        with lock:
            counts["reads"] += n
            counts["bytes"] += b

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    peak = base
    while any(t.is_alive() for t in threads):
        peak = max(peak, _rss(m.pid))
        for t in threads:
            t.join(timeout=0.25)
    peak = max(peak, _rss(m.pid))
    s = m.stats()
    record(seconds=SECONDS, threads=THREADS, budget=BUDGET, data_bytes=data_bytes,
           lane_cold=lane_cold,
           rss_before=base, rss_peak=peak, over_budget=peak - base - BUDGET, **counts)
    assert not problems, problems[:5]
    assert counts["bytes"] >= data_bytes / 2      # much of the data went through
    assert all(s["served_files"].get(v) for v in ("q3", "q10", "l3"))   # dynamic: as q10
    tiers = s["cache_tiers"]["memory"]
    if lane_cold == "no":
        assert tiers["admitted"] > 0 and s["extent_fetches"] > 0
    else:
        assert sum(c["files"] for c in s["fast_lane"]["cold"].values()) > 0
    assert tiers["bytes"] <= tiers["capacity"] == s["memory_budget"]["memory_tier"]
    assert s["memory_budget"]["open_files_bytes"] <= s["memory_budget"]["open_files"]
    assert s["fast_lane"]["store_bytes"] <= s["memory_budget"]["lane_store"]
    assert peak - base <= BUDGET + FIXED, (
        f"RSS grew {(peak - base) >> 20} MiB over a {BUDGET >> 20} MiB budget")


def _files(ds, view, rel=b""):
    out = []
    for name, is_dir in ds.listdir(rel, view):
        p = rel + b"/" + name if rel else name
        out.extend(_files(ds, view, p) if is_dir else [p])
    return out
