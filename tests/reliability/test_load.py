"""32 concurrent readers over several views for LOAD_SECONDS (30 s in make test, 30 min
in make soak): zero mismatches, no error counted, daemon RSS flat after warm-up, no
leaked file descriptors."""
import os
import random
import threading
import time

import pytest

from pcrfs.control import set_fidelity
from pcrfs.dataset import open_dataset
from reliability.conftest import LOAD_SECONDS

READERS = 32
VIEWS = ("q1", "q3", "q6", "q10", "dynamic")


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.timeout(int(LOAD_SECONDS) + 600)   # make soak runs far past the suite's 900 s
def test_32_readers_hold_for_the_configured_time(crops_ds, mount, record):
    ds = open_dataset(str(crops_ds))
    paths = []
    for cls, _ in ds.listdir(b""):
        paths += [os.fsdecode(cls + b"/" + n) for n, d in ds.listdir(cls) if not d]
    want = {(v, p): ds.read(p, v) for v in ds.views for p in paths}
    m = mount(crops_ds, "--cache-size", "8M", "--fidelity", "4")   # a cache far below the data
    set_fidelity(m.mnt, 4)
    # warm-up: the daemon opens each record file once and keeps it, and every file of
    # every view read once fills the budget's shares (memory tier, lane store, open files)
    for view in VIEWS:
        for p in paths:
            (m.mnt / view / p).read_bytes()
    fds_before = _fds(m.pid)
    stop = time.monotonic() + LOAD_SECONDS
    counts = {"reads": 0, "bytes": 0, "mismatches": 0, "errors": 0}
    lock = threading.Lock()
    problems = []

    def reader(seed):
        rnd = random.Random(seed)
        n = b = bad = err = 0
        while time.monotonic() < stop:
            view, path = rnd.choice(VIEWS), rnd.choice(paths)
            expect = want[("q4" if view == "dynamic" else view, path)]
            try:
                with open(m.mnt / view / path, "rb") as f:
                    if rnd.random() < 0.3:          # partial and chunked reads too
                        data = b"".join(iter(lambda: f.read(rnd.randint(1, 70000)), b""))
                    else:
                        data = f.read()
            except OSError as e:
                err += 1
                problems.append(f"{view}/{path}: {e}")
                continue
            n, b = n + 1, b + len(data)
            if data != expect:
                bad += 1
                problems.append(f"{view}/{path}: wrong bytes")
        with lock:
            for k, v in (("reads", n), ("bytes", b), ("mismatches", bad), ("errors", err)):
                counts[k] += v

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    # RSS: baseline after a quarter of the run (warm-up: caches fill), then sampled
    time.sleep(LOAD_SECONDS * 0.25)
    base = _rss(m.pid)
    peak = base
    while any(t.is_alive() for t in threads):
        time.sleep(min(1.0, LOAD_SECONDS / 20))
        peak = max(peak, _rss(m.pid))
    for t in threads:
        t.join()
    end = _rss(m.pid)
    fds_after = _fds(m.pid)
    stats = m.stats()
    record(readers=READERS, seconds=LOAD_SECONDS, views=list(VIEWS), **counts,
           rss_after_warmup=base, rss_peak=peak, rss_end=end, fds_before=fds_before,
           fds_after=fds_after, daemon_errors=stats["errors"],
           lane={k: stats["fast_lane"][k] for k in ("running", "realtime", "open", "read",
                                                     "getattr", "handed_to_python")},
           shim="asan" if "asan" in os.environ.get("LD_PRELOAD", "") else "normal",
           checksum_failures=stats["checksum_failures"])
    assert counts["mismatches"] == 0 and counts["errors"] == 0, problems[:5]
    assert counts["reads"] > READERS * 10
    assert stats["fast_lane"]["running"] and stats["fast_lane"]["open"] > READERS * 10
    assert stats["errors"] == {} and stats["checksum_failures"] == 0
    assert peak <= base * 1.10, (base, peak)
    assert fds_after == fds_before
    assert stats["open_files"] == 0
