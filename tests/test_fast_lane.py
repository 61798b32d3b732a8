"""The fast lane (pcrfs/fs/kernel_shim.py, csrc/fuse_shim.c) through the real kernel: warm
reads cost Python nothing, everything else still reaches it, and its classifier takes any
bytes."""
import errno
import fcntl
import json
import os
import struct
import subprocess
import sys
import termios
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pcrfs
from pcrfs import _fuseshim

from conftest import PCRFS, run_pcrfs, wait_until

LO, HI = 1 << 56, 12 << 56
HEADER = struct.Struct("<IIQQIIII")    # fuse_in_header: len opcode unique nodeid uid gid pid pad
FUSE_OPEN, FUSE_RELEASE, FUSE_IOCTL, FUSE_GETATTR, FUSE_READ = 14, 18, 39, 3, 15
lib = _fuseshim.lib


def files_of(root, limit=None):
    out = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
    return out[:limit]


def read_all(paths):
    for p in paths:
        with open(p, "rb") as f:   # Python's open() also asks isatty(): an IOCTL
            f.read()


def lane(m) -> dict:
    return m.stats()["fast_lane"]


def settled(m, key, want, timeout=5.0) -> tuple[dict, int]:
    """RELEASE is sent after close() returns: wait for the count to arrive.  Also says how
    many times stats.json was read (each costs Python a few requests of its own)."""
    deadline, polls = time.monotonic() + timeout, 0
    while True:
        s, polls = lane(m), polls + 1
        if s[key] >= want:
            return s, polls
        assert time.monotonic() < deadline, f"lane {key} stayed {s[key]} < {want} for {timeout} s"
        time.sleep(0.05)


def test_warm_reads_never_reach_python(crops_ds, mount):
    m = mount(crops_ds)
    assert lane(m)["running"] is True
    paths = files_of(m.mnt / "q10", 60)
    ds = pcrfs.open_dataset(crops_ds)
    for p in paths:   # cold: the data comes from the daemon (Python reads), exactly
        rel = os.path.relpath(p, m.mnt / "q10")
        assert open(p, "rb").read() == ds.read(rel, "q10")
    read_all(paths)   # one GETATTR each after the cold read (the kernel dropped atime)
    before, _ = settled(m, "release", lane(m)["open"])
    read_all(paths)
    read_all(paths)
    after, polls = settled(m, "release", before["release"] + 2 * len(paths))
    n = 2 * len(paths)
    assert after["open"] - before["open"] == n
    assert after["ioctl"] - before["ioctl"] == n
    assert after["release"] - before["release"] == n
    # Python saw only the stats.json reads around the window (getattr, open, read, release
    # each), nothing per image
    assert after["handed_to_python"] - before["handed_to_python"] <= 6 * (polls + 1) < n
    out = run_pcrfs("status", m.mnt).stdout
    assert "fast lane   on (SCHED_FIFO (1 of " in out and " ioctls, " in out
    assert "cold reads  q10 60 files " in out    # the first pass, from the records in C
    assert " getattrs answered" in out
    assert "lane store  60 images, " in out


def drop_page_cache(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_a_dropped_page_cache_is_refilled_by_the_lane(crops_ds, mount):
    """Memory reclaim drops the kernel's copy of a file between epochs; its next read and
    the GETATTR that follows (the kernel invalidated atime) are answered from the lane's
    image store, never from Python, with the same bytes and the same attributes."""
    m, ref = mount(crops_ds), mount(crops_ds, "-o", "fast_lane=no")
    ds = pcrfs.open_dataset(crops_ds)
    views = ("q1", "q10", "l3")
    paths = [p for v in views for p in files_of(m.mnt / v, 25)]
    want = {p: ds.read(*os.path.relpath(p, m.mnt).split("/", 1)[::-1]) for p in paths}
    read_all(paths)                 # cold: the lane reads q files, Python l3; both kept
    m.stats()
    s0 = m.stats()
    stats_reads = m.stats()["requests"]["read"] - s0["requests"]["read"]   # its own cost
    assert s0["fast_lane"]["store_images"] == len(paths)
    assert s0["fast_lane"]["store_bytes"] == sum(map(len, want.values()))
    for _ in range(2):
        drop_page_cache(paths)
        for p in paths:
            with open(p, "rb") as f:
                assert f.read() == want[p]
    s1 = m.stats()
    lane_reads = s1["fast_lane"]["read"] - s0["fast_lane"]["read"]
    assert lane_reads >= 2 * len(paths)
    # Python saw only the stats.json reads (a few READs and GETATTRs), nothing per image
    assert s1["requests"]["read"] - s0["requests"]["read"] <= 2 * stats_reads
    assert s1["requests"].get("getattr", 0) - s0["requests"].get("getattr", 0) <= 6
    assert s1["fast_lane"]["getattr"] - s0["fast_lane"]["getattr"] >= len(paths)
    fields = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks",
              "st_blksize", "st_mtime_ns", "st_atime_ns", "st_ctime_ns")
    drop_page_cache(paths)
    for p in paths:
        with open(p, "rb") as f:                     # the kernel asks again: the lane answers
            got = os.fstat(f.fileno())
        exp = os.stat(ref.mnt / os.path.relpath(p, m.mnt))   # Python's getattr
        assert [getattr(got, k) for k in fields] == [getattr(exp, k) for k in fields]
    assert m.stats()["fast_lane"]["getattr"] > s1["fast_lane"]["getattr"]


def test_the_image_store_is_a_quarter_of_the_memory_budget(crops_ds, mount):
    m = mount(crops_ds, "--cache-size", "256k")
    paths = files_of(m.mnt / "q10")
    read_all(paths)
    lane_state = lane(m)
    budget = m.stats()["memory_budget"]
    assert lane_state["store_budget"] == budget["lane_store"] == (256 << 10) // 4
    # the shares and the memory tier add up to the budget, nothing beside it
    assert budget["memory_tier"] == m.stats()["cache_capacity"]
    assert sum(v for k, v in budget.items() if k not in ("total", "open_files_bytes")) \
        == budget["total"] == 256 << 10
    assert 0 < lane_state["store_bytes"] <= lane_state["store_budget"]
    assert lane_state["store_evicted"] > 0
    ds = pcrfs.open_dataset(crops_ds)
    drop_page_cache(paths)       # some from the store, the rest assembled again: all exact
    for p in paths:
        assert open(p, "rb").read() == ds.read(os.path.relpath(p, m.mnt / "q10"), "q10")


def lane_thread(pid: int) -> int:
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            if f.read().strip() == "pcrfs-lane0":   # the first lane thread
                return int(tid)
    raise AssertionError("no pcrfs-lane thread")


def test_lane_thread_runs_sched_fifo_unless_asked_not_to(crops_ds, mount):
    rt, normal = mount(crops_ds), mount(crops_ds, "-o", "lane_priority=normal")
    # the thread takes SCHED_FIFO as it starts, which may be after the mount is live
    wait_until(lambda: lane(rt)["realtime"] == 1, 30, "the lane thread to take SCHED_FIFO")
    assert lane(normal)["realtime"] == 0
    assert os.sched_getscheduler(lane_thread(rt.stats()["pid"])) == os.SCHED_FIFO
    assert os.sched_getscheduler(lane_thread(normal.stats()["pid"])) == os.SCHED_OTHER
    # only the lane: pyfuse3's thread and the workers stay at normal priority
    assert os.sched_getscheduler(rt.stats()["pid"]) == os.SCHED_OTHER
    f = files_of(normal.mnt / "q2", 1)[0]
    assert open(f, "rb").read() == open(rt.mnt / os.path.relpath(f, normal.mnt), "rb").read()
    (rt.mnt.parent / "unused").mkdir(exist_ok=True)
    r = run_pcrfs("mount", crops_ds, rt.mnt.parent / "unused", "-o", "lane_priority=high",
                  check=False)
    assert r.returncode != 0 and "lane_priority=realtime, all or normal" in r.stderr


def test_lane_priority_all_and_the_default_first_thread_only(crops_ds, mount):
    """realtime (the default) lifts only the first of several lane threads, so realtime
    threads never hold every core; all lifts each."""
    def policies(m):
        pid = m.stats()["pid"]
        out = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            if name.startswith("pcrfs-lane"):
                out[name] = os.sched_getscheduler(int(tid))
        return out
    def nices(m):
        pid = m.stats()["pid"]
        return {open(f"/proc/{pid}/task/{t}/comm").read().strip():
                os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}
    one = mount(crops_ds, "-o", "lane_threads=3")
    every = mount(crops_ds, "-o", "lane_threads=3,lane_priority=all")
    # each lane thread sets its own policy as it starts, which may be after the mount is
    # live (seen failing under load): wait for the threads to say they did
    wait_until(lambda: lane(one)["realtime"] == 1 and lane(every)["realtime"] == 3, 30,
               "the lane threads to take SCHED_FIFO")
    assert policies(one) == {"pcrfs-lane0": os.SCHED_FIFO, "pcrfs-lane1": os.SCHED_OTHER,
                             "pcrfs-lane2": os.SCHED_OTHER}
    assert set(policies(every).values()) == {os.SCHED_FIFO} and len(policies(every)) == 3
    assert lane(one)["realtime"] == 1 and lane(every)["realtime"] == 3
    # -o lane_nice: the lane threads not at SCHED_FIFO run at that nice value, nothing
    # else does; by default (and with lane_priority=normal) none is changed
    assert {v for k, v in nices(one).items()} == {0} and lane(one)["niced"] == 0
    five = mount(crops_ds, "-o", "lane_threads=3,lane_nice=-5")
    wait_until(lambda: lane(five)["niced"] == 2 and lane(five)["realtime"] == 1, 30,
               "the lane threads to take their nice value")
    n = nices(five)
    assert n["pcrfs-lane1"] == n["pcrfs-lane2"] == -5 and lane(five)["niced"] == 2
    assert n["pcrfs-lane0"] == 0                      # SCHED_FIFO instead
    assert all(v == 0 for k, v in n.items() if not k.startswith("pcrfs-lane")), n
    plain = mount(crops_ds, "-o", "lane_threads=2,lane_priority=normal,lane_nice=-5")
    wait_until(lambda: sum(k.startswith("pcrfs-lane") for k in nices(plain)) == 2, 30,
               "both lane threads to start")
    assert {v for k, v in nices(plain).items() if k.startswith("pcrfs-lane")} == {0}
    assert lane(plain)["niced"] == 0


def test_what_the_lane_does_not_own_still_reaches_python(crops_ds, mount):
    m = mount(crops_ds)
    f = files_of(m.mnt / "q5", 1)[0]
    before = lane(m)
    # write flags: EROFS from Python, as before
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
        with pytest.raises(OSError) as e:
            os.open(f, flags)
        assert e.value.errno == errno.EROFS
    # dynamic/ follows the control file: opened in Python, never cached across a switch
    dyn = m.mnt / "dynamic" / os.path.relpath(f, m.mnt / "q5")
    run_pcrfs("set-fidelity", m.mnt, 2)
    assert open(dyn, "rb").read() == open(m.mnt / "q2" / os.path.relpath(f, m.mnt / "q5"),
                                           "rb").read()
    run_pcrfs("set-fidelity", m.mnt, 5)
    assert open(dyn, "rb").read() == open(f, "rb").read()
    after = lane(m)
    assert after["open"] == before["open"] + 2   # the q2 and q5 files; dynamic/ was Python's
    # .pcrfs/stats.json is opened by Python each time, so it is never a stale copy
    a, b = m.stats()["requests"]["open"], m.stats()["requests"]["open"]
    assert b > a


def test_ioctl_on_a_file_is_enotty(crops_ds, mount):
    m = mount(crops_ds)
    f = files_of(m.mnt / "q1", 1)[0]
    fd = os.open(f, os.O_RDONLY)
    try:
        assert not os.isatty(fd)
        with pytest.raises(OSError) as e:
            fcntl.ioctl(fd, termios.TCGETS, bytes(64))
        assert e.value.errno == errno.ENOTTY
    finally:
        os.close(fd)
    assert lane(m)["ioctl"] >= 2


def test_fast_lane_off_serves_the_same_bytes(crops_ds, mount):
    on, off = mount(crops_ds), mount(crops_ds, "-o", "fast_lane=no")
    assert lane(on)["running"] is True and lane(off)["running"] is False
    paths = files_of(on.mnt / "q3", 40)
    for p in paths:
        q = off.mnt / os.path.relpath(p, on.mnt)
        assert open(p, "rb").read() == open(q, "rb").read()
    s = lane(off)
    assert s["open"] == s["handed_to_python"] == 0
    assert "fast lane   off" in run_pcrfs("status", off.mnt).stdout
    assert off.stats()["requests"]["open"] >= len(paths)
    bad = run_pcrfs("mount", crops_ds, off.mnt.parent, "-o", "fast_lane=maybe", check=False)
    assert bad.returncode != 0 and "expected fast_lane=yes or no" in bad.stderr


def test_skip_open_ends_open_and_release_round_trips(crops_ds, mount):
    """-o skip_open: the lane answers the first OPEN with ENOSYS, the kernel sends no OPEN
    or RELEASE after it, and everything still reads the same bytes through fh = inode."""
    m, ref = mount(crops_ds, "-o", "skip_open=yes"), mount(crops_ds)
    G = json.loads((m.mnt / ".pcrfs" / "manifest.json").read_text())["groups"]
    paths = files_of(m.mnt / f"q{G}", 30) + files_of(m.mnt / "q2", 20)
    for p in paths:                                   # cold: assembled by Python, by inode
        assert open(p, "rb").read() == open(ref.mnt / os.path.relpath(p, m.mnt), "rb").read()
    read_all(paths)
    read_all(paths)
    s = lane(m)
    assert s["open"] == 1 and s["release"] == 0       # the one answered ENOSYS
    assert s["ioctl"] == 3 * len(paths)              # isatty(): fh 0 made the inode, ENOTTY
    assert ref.stats()["fast_lane"]["open"] >= len(paths)       # without: one per open
    # the dynamic view (not a lane view) is read by inode too, at the mount's fidelity
    dyn = files_of(m.mnt / "dynamic", 10)
    for p in dyn:
        rel = os.path.relpath(p, m.mnt / "dynamic")
        assert open(p, "rb").read() == open(ref.mnt / f"q{G}" / rel, "rb").read()
    # live control files are page-cached now, yet every read is fresh: a new mtime per
    # GETATTR makes the kernel drop the cached copy
    before = m.stats()["served_files"].get("q1", 0)
    for p in files_of(m.mnt / "q1", 5):
        open(p, "rb").read()
    assert m.stats()["served_files"]["q1"] >= before + 5   # (cold: from the records in C)
    st = m.mnt / ".pcrfs" / "stats.json"      # each read counts a READ: never the same twice
    seen = [st.read_bytes() for _ in range(20)]
    assert len(set(seen)) == len(seen) and all(json.loads(b) for b in seen)   # whole, each
    # its size holds still while the counters grow (padded with newlines): a read()
    # that the size from fstat split in two would otherwise join two renderings
    sizes = {len(b) for b in seen} | {os.stat(st).st_size for _ in range(20)}
    assert len(sizes) == 1 and sizes.pop() % 4096 == 0
    # no OPEN asks the daemon, so the kernel mount is read-only and refuses an open for
    # writing itself (O_TRUNC included), as the daemon's OPEN does without skip_open
    img = paths[0]
    assert "ro" in m.kernel_options() and "ro" not in ref.kernel_options()
    ctl = m.mnt / ".pcrfs" / "control" / "dynamic_fidelity"    # no open to bind a switch to
    for path in (img, ctl):
        for flags in (os.O_WRONLY, os.O_WRONLY | os.O_TRUNC, os.O_RDWR | os.O_APPEND):
            with pytest.raises(OSError) as e:
                os.close(os.open(path, flags))
            assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        os.truncate(img, 0)
    assert e.value.errno == errno.EROFS
    assert open(img, "rb").read() == open(ref.mnt / os.path.relpath(img, m.mnt), "rb").read()
    bad = run_pcrfs("mount", crops_ds, m.mnt.parent, "-o", "skip_open=yes,fast_lane=no",
                    check=False)
    assert bad.returncode != 0 and "skip_open=yes needs the fast lane" in bad.stderr


@settings(max_examples=300, deadline=None)
@given(opcode=st.sampled_from([FUSE_READ, FUSE_IOCTL, FUSE_OPEN, FUSE_GETATTR, 16]),
       nodeid=st.integers(0, 2**64 - 1), fh=st.sampled_from([0, 1, 5 << 56]),
       tail=st.binary(max_size=80), cut=st.integers(0, 120))
def test_adopt_sets_only_a_zero_fh_of_read_and_ioctl(opcode, nodeid, fh, tail, cut):
    body = struct.pack("<Q", fh) + tail
    req = HEADER.pack(HEADER.size + len(body), opcode, 7, nodeid, 0, 0, 0, 0) + body
    req = req[: HEADER.size + cut] if cut < len(body) else req
    lib.pcrfs_shim_want_skip_open(1)
    try:
        buf = _fuseshim.ffi.new("uint8_t[]", req)
        changed = lib.pcrfs_lane_adopt(buf, len(req))
        out = bytes(_fuseshim.ffi.buffer(buf, len(req)))
    finally:
        lib.pcrfs_shim_want_skip_open(0)
    whole = len(req) == HEADER.size + len(body)      # header len matches what was read
    need = 40 if opcode == FUSE_READ else 32 if opcode == FUSE_IOCTL else None
    expect = (whole and need is not None and len(body) >= need and fh == 0 and nodeid != 0)
    assert changed == int(expect)
    if expect:
        assert out == req[: HEADER.size] + struct.pack("<Q", nodeid) + req[HEADER.size + 8 :]
    else:
        assert out == req
    assert lib.pcrfs_lane_adopt(_fuseshim.ffi.new("uint8_t[]", req), len(req)) == 0  # off


def test_umount_ends_the_lane_and_the_daemon(crops_ds, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_pcrfs("mount", crops_ds, mnt)
    pid = __import__("json").loads((mnt / ".pcrfs" / "stats.json").read_text())["pid"]
    read_all(files_of(mnt / "q1", 5))
    run_pcrfs("umount", mnt)
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}") or \
                open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the daemon did not exit after umount")
    assert not os.path.ismount(mnt)


@pytest.mark.mounts   # mounts from a python -c of its own
def test_without_the_shim_the_mount_still_works(crops_ds, tmp_path):
    """pyfuse3 loaded before the shim: no interposition possible, everything via Python."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = ("import sys, pyfuse3; from pcrfs.cli import main; "
            f"sys.exit(main(['mount', '-f', {str(crops_ds)!r}, {str(mnt)!r}, "
            "'-o', 'supervise=no']))")   # supervised, a fresh daemon process would load it
    # cwd elsewhere: `-c` puts the cwd on sys.path, and the checkout's pcrfs/ has no
    # compiled extensions; the installed package is what the daemon must run
    p = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path)
    try:
        for _ in range(600):
            if os.path.ismount(mnt) or p.poll() is not None:
                break
            time.sleep(0.05)
        assert os.path.ismount(mnt), p.stderr.read() if p.poll() is not None else "not mounted"
        import json
        s = json.loads((mnt / ".pcrfs" / "stats.json").read_text())
        assert s["fast_lane"]["running"] is False
        paths = files_of(mnt / "q2", 10)
        ds = pcrfs.open_dataset(crops_ds)
        for path in paths:
            assert open(path, "rb").read() == ds.read(os.path.relpath(path, mnt / "q2"), "q2")
    finally:
        subprocess.run([PCRFS, "umount", str(mnt)], capture_output=True)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
    assert "pyfuse3 was imported before the shim" in p.stderr.read()


def test_shim_loaded_but_libfuse_unresolved_serves_through_python(crops_ds, mount, tmp_path,
                                                                  monkeypatch):
    """The shim is in front of libfuse, and finding libfuse's own functions apart from it
    fails (forced here): the shim finds them itself in the libfuse pyfuse3 loaded, the
    lane stays off, and the mount serves every request through Python, saying why, with
    the lane's share of the budget given back to Python.  (Before, its receive_buf called
    a NULL pointer and the daemon died at mount.)"""
    monkeypatch.setenv("PCRFS_TEST_SHIM_UNRESOLVED", "1")
    log = tmp_path / "daemon.log"
    m = mount(crops_ds, "--log", log, "--cache-size", "8M", "-o", "cache_policy=static")
    s = m.stats()
    assert s["fast_lane"]["running"] is False and s["fast_lane"]["cold"] == {}
    # supervision (the default) resumes sessions through the shim: without it the mount
    # falls back to an unsupervised daemon rather than failing
    assert "supervisor" not in s
    # the lane's share (under static, the pinned set) went back to Python's memory tier
    assert "lane_store" not in s["memory_budget"]
    assert s["cache_tiers"]["memory"]["capacity"] == s["memory_budget"]["memory_tier"] > 6 << 20
    ds = pcrfs.open_dataset(crops_ds)
    for path in files_of(m.mnt / "q3", 20):
        assert open(path, "rb").read() == ds.read(os.path.relpath(path, m.mnt / "q3"), "q3")
    assert m.stats()["requests"]["open"] >= 20          # each open answered by Python
    assert "could not be resolved apart from the shim" in log.read_text()
    assert "mounting unsupervised" in log.read_text()
    m.__exit__(None, None, None)
    assert not os.path.ismount(m.mnt) and not m.alive()


# -- the classifier: what the lane answers, from the raw bytes the kernel sends ----------
def request(opcode, body, nodeid=LO + 7, length=None):
    n = HEADER.size + len(body)
    return HEADER.pack(length if length is not None else n, opcode, 99, nodeid, 0, 0, 1, 0) + body


def classify(buf: bytes) -> int:
    return lib.pcrfs_lane_classify(buf, len(buf), LO, HI)


def test_classifier_answers_only_read_only_opens_of_lane_files():
    open_in = lambda flags: struct.pack("<II", flags, 0)  # noqa: E731
    assert classify(request(FUSE_OPEN, open_in(os.O_RDONLY))) == lib.PCRFS_LANE_OPEN
    assert classify(request(FUSE_OPEN, open_in(os.O_RDONLY | os.O_NOFOLLOW))) == lib.PCRFS_LANE_OPEN
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_RDONLY | os.O_CREAT):
        assert classify(request(FUSE_OPEN, open_in(flags))) == lib.PCRFS_LANE_HAND_OVER
    for nodeid in (1, LO - 1, HI, (0xFE << 56) | 5):   # root, dynamic/, .pcrfs/
        assert classify(request(FUSE_OPEN, open_in(0), nodeid)) == lib.PCRFS_LANE_HAND_OVER
    release_in = lambda fh: struct.pack("<QIIQ", fh, 0, 0, 0)  # noqa: E731
    assert classify(request(FUSE_RELEASE, release_in(LO + 3))) == lib.PCRFS_LANE_RELEASE
    assert classify(request(FUSE_RELEASE, release_in(17))) == lib.PCRFS_LANE_HAND_OVER
    ioctl_in = lambda fh: struct.pack("<QIIQII", fh, 0, 0x5401, 0, 0, 60)  # noqa: E731
    assert classify(request(FUSE_IOCTL, ioctl_in(LO + 3))) == lib.PCRFS_LANE_IOCTL
    assert classify(request(FUSE_IOCTL, ioctl_in(3))) == lib.PCRFS_LANE_HAND_OVER
    # READ of a lane-opened file (fh = inode) and GETATTR of a lane inode: the lane answers
    # them if its image store holds the file (else Python does)
    read_in = lambda fh: struct.pack("<QQIIIIII", fh, 0, 4096, 0, 0, 0, 0, 0)  # noqa: E731
    assert classify(request(FUSE_READ, read_in(LO + 7))) == lib.PCRFS_LANE_READ
    assert classify(request(FUSE_READ, read_in(LO + 8))) == lib.PCRFS_LANE_HAND_OVER
    assert classify(request(FUSE_READ, read_in(12), nodeid=12)) == lib.PCRFS_LANE_HAND_OVER
    assert classify(request(FUSE_READ, read_in(LO + 7)[:-1])) == lib.PCRFS_LANE_HAND_OVER
    assert classify(request(FUSE_GETATTR, bytes(16))) == lib.PCRFS_LANE_GETATTR
    assert classify(request(FUSE_GETATTR, bytes(16), nodeid=HI)) == lib.PCRFS_LANE_HAND_OVER
    assert classify(request(FUSE_GETATTR, bytes(15))) == lib.PCRFS_LANE_HAND_OVER
    # a length that disagrees with the bytes read, or a body too short: never answered
    good = request(FUSE_OPEN, open_in(0))
    assert classify(request(FUSE_OPEN, open_in(0), length=len(good) + 1)) == lib.PCRFS_LANE_HAND_OVER
    assert classify(request(FUSE_OPEN, b"\0\0\0")) == lib.PCRFS_LANE_HAND_OVER
    assert classify(good[:-1]) == lib.PCRFS_LANE_HAND_OVER
    assert classify(b"") == lib.PCRFS_LANE_HAND_OVER


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200),
       st.sampled_from([FUSE_OPEN, FUSE_RELEASE, FUSE_IOCTL, FUSE_READ, FUSE_GETATTR, 0]))
def test_classifier_takes_any_bytes(tail, opcode):
    buf = request(opcode, tail) if opcode else tail
    kind = classify(buf)
    assert kind in (lib.PCRFS_LANE_HAND_OVER, lib.PCRFS_LANE_OPEN, lib.PCRFS_LANE_RELEASE,
                    lib.PCRFS_LANE_IOCTL, lib.PCRFS_LANE_READ, lib.PCRFS_LANE_GETATTR)
    if kind != lib.PCRFS_LANE_HAND_OVER:
        assert len(buf) >= HEADER.size and HEADER.unpack_from(buf)[0] == len(buf)


# -- the bridge the lane's files are read from while their first assembly runs ----------
def test_bridge_images_are_bounded_lru():
    from pcrfs.storage.cache import MemoryTier
    r = MemoryTier(100)
    r.put(1, b"a" * 60)
    r.put(2, b"b" * 30)
    assert r.get(1) is not None          # 1 is now the most recent
    r.put(3, b"c" * 30)                   # 120 > 100: the least recent (2) goes
    assert r.get(2) is None and r.get(1) is not None and r.get(3) is not None
    assert r.used == 90
    assert not r.put(4, b"d" * 500)       # bigger than the tier: refused (operations.py
    assert r.get(1) is not None           # keeps the newest such image apart)


def test_one_assembly_per_file_for_concurrent_reads():
    import trio

    from pcrfs.singleflight import AsyncSingleFlight
    flight, calls, failures = AsyncSingleFlight(), [], []

    async def make(ino, fail=False):
        calls.append(ino)
        await trio.sleep(0.01)
        if fail:
            raise OSError("EIO")
        return b"x" * ino

    async def read(ino, fail=False):
        try:
            assert await flight.do(ino, lambda: make(ino, fail)) == b"x" * ino
        except OSError:
            failures.append(ino)

    async def main():
        async with trio.open_nursery() as n:
            for _ in range(8):
                n.start_soon(read, 7)
        async with trio.open_nursery() as n:   # concurrent reads share the failure...
            for _ in range(3):
                n.start_soon(read, 9, True)
        await read(9, True)                    # ... which is not kept: a later read retries
    trio.run(main)
    assert calls == [7, 9, 9] and failures == [9, 9, 9, 9] and flight._calls == {}


def test_a_cancelled_leader_does_not_cancel_the_reads_waiting_on_it():
    """The first READ of a file is cancelled (its reader was interrupted) while another
    READ waits for its assembly: the waiter assembles the file itself instead of raising
    a Cancelled that belongs to the other request's cancel scope."""
    import trio
    import trio.testing

    from pcrfs.singleflight import AsyncSingleFlight
    flight, calls, got = AsyncSingleFlight(), [], []

    async def make():
        calls.append(len(calls))
        await trio.sleep(0 if len(calls) > 1 else 3600)    # the first never finishes
        return b"image"

    async def main():
        async with trio.open_nursery() as n:
            leader = trio.CancelScope()

            async def first():
                with leader:
                    await flight.do(1, make)

            async def second():
                got.append(await flight.do(1, make))

            n.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            leader.cancel()
    trio.run(main)
    assert got == [b"image"] and calls == [0, 1] and flight._calls == {}


# -- the lane's image store, driven directly -----------------------------------------------
def test_image_store_keeps_copies_bounded_lru():
    ffi = _fuseshim.ffi
    assert lib.pcrfs_lane_configure(100, 0, 0, 0, 4096, 60) == 0

    def copy(ino, off=0, cap=1000):
        out = ffi.new("uint8_t[]", cap)
        n = lib.pcrfs_lane_copy(ino, off, out, cap)
        return None if n < 0 else bytes(ffi.buffer(out, n))
    assert lib.pcrfs_lane_keep(1, b"a" * 60, 60) == 0
    assert lib.pcrfs_lane_keep(2, b"b" * 30, 30) == 0
    assert copy(1, 10, 5) == b"aaaaa" and copy(1, 58) == b"aa" and copy(1, 600) == b""
    assert lib.pcrfs_lane_keep(3, b"c" * 30, 30) == 0    # 120 > 100: the oldest (1) goes
    assert copy(1) is None and copy(2) == b"b" * 30 and copy(3) == b"c" * 30
    assert lib.pcrfs_lane_keep(4, b"d" * 101, 101) == -1  # larger than the whole budget
    assert lib.pcrfs_lane_keep(2, b"e" * 10, 10) == 0     # replaced, not duplicated
    assert copy(2) == b"e" * 10
    counts = ffi.new("uint64_t[]", 7)
    lib.pcrfs_lane_store_counts(counts, 7)
    assert counts[2] == 40 and counts[3] == 100 and counts[4] == 2
    assert lib.pcrfs_lane_configure(0, 0, 0, 0, 4096, 60) == 0   # a budget of 0 empties it
    assert copy(3) is None
    assert lib.pcrfs_lane_keep(5, b"f", 1) == -1


def test_pinned_store_refuses_instead_of_evicting():
    """The static policy's store (pcrfs_lane_store_pin): what is in stays; a full store
    refuses (counted) rather than evicting, and replacing a kept image frees its bytes."""
    ffi = _fuseshim.ffi

    def counts():
        out = ffi.new("uint64_t[]", 8)
        lib.pcrfs_lane_store_counts(out, 8)
        return list(out)

    def held(ino):
        out = ffi.new("uint8_t[]", 1)
        return lib.pcrfs_lane_copy(ino, 0, out, 1) >= 0
    lib.pcrfs_lane_store_pin(1)
    try:
        assert lib.pcrfs_lane_configure(100, 0, 0, 0, 4096, 60) == 0
        c0 = counts()
        assert lib.pcrfs_lane_keep(1, b"a" * 60, 60) == 0
        assert lib.pcrfs_lane_keep(2, b"b" * 30, 30) == 0
        assert lib.pcrfs_lane_keep(3, b"c" * 30, 30) == -1     # full: refused
        assert held(1) and held(2) and not held(3)
        c1 = counts()
        assert c1[6] == c0[6] and c1[7] == c0[7] + 1 and c1[2] == 90
        assert lib.pcrfs_lane_keep(2, b"e" * 10, 10) == 0     # replaced in place
        assert lib.pcrfs_lane_keep(3, b"c" * 30, 30) == 0     # 60 + 10 + 30 fit
        assert held(1) and held(2) and held(3) and counts()[6] == c0[6]
    finally:
        lib.pcrfs_lane_store_pin(0)
        assert lib.pcrfs_lane_configure(0, 0, 0, 0, 4096, 60) == 0


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_unmount_under_load_twenty_times(crops_ds, tmp_path):
    """SIGTERM while 4 threads read (the lane answering opens, reads from its store):
    the lane is stopped and joined before libfuse closes /dev/fuse and unmounts, the
    daemon exits every time, and the log shows that order."""
    import threading
    for i in range(20):
        mnt, log = tmp_path / f"mnt{i}", tmp_path / f"log{i}"
        mnt.mkdir()
        run_pcrfs("mount", crops_ds, mnt, "--log", log, "-o", "supervise=no")   # its SIGTERM
        pid = __import__("json").loads((mnt / ".pcrfs" / "stats.json").read_text())["pid"]
        paths = files_of(mnt / "q5", 40)
        read_all(paths)                   # warm: the load below is lane-answered
        stop, reads = threading.Event(), [0]

        def load(stop=stop, paths=paths, reads=reads):
            while not stop.is_set():
                for p in paths:
                    try:
                        with open(p, "rb") as f:
                            f.read()
                        reads[0] += 1
                    except OSError:       # ENOTCONN/EIO once the mount is gone
                        if stop.is_set():
                            return
        ts = [threading.Thread(target=load) for _ in range(4)]
        for t in ts:
            t.start()
        deadline = time.monotonic() + 5
        while reads[0] < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, 15)
        gone = _wait_gone(pid, 20)
        stop.set()
        for t in ts:
            t.join(10)
        if not gone:
            os.kill(pid, 9)
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        assert gone, f"round {i}: the daemon hung on unmount under load"
        assert not any(t.is_alive() for t in ts), f"round {i}: a reader hangs"
        assert not os.path.ismount(mnt)
        text = log.read_text()
        assert reads[0] >= 50, f"round {i}: no load before the signal"
        assert text.index("fast lane stopped") < text.index("unmounted"), text


def test_a_maximum_size_request_passes_through_the_lane(crops_ds, mount):
    """The lane's buffer is the kernel's largest request (fs.fuse.max_pages_limit pages
    plus a header page): a WRITE of max_write bytes to the control file reaches Python,
    which refuses the value (EINVAL), instead of failing in the kernel (EIO)."""
    m = mount(crops_ds)
    limit = int(open("/proc/sys/fs/fuse/max_pages_limit").read())
    assert lane(m)["buffer_bytes"] == max(limit, 256) * os.sysconf("SC_PAGESIZE") + 4096
    fd = os.open(m.mnt / ".pcrfs" / "control" / "dynamic_fidelity", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, b"5" * (4 << 20))  # the kernel sends max_write-sized WRITEs
        assert e.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    assert lane(m)["refused_nomem"] == 0
    assert m.stats()["dynamic_fidelity"] == "q10"


def test_a_raised_kernel_page_limit_grows_the_lane_buffer(crops_ds, mount):
    path = "/proc/sys/fs/fuse/max_pages_limit"
    old = open(path).read().strip()
    try:
        with open(path, "w") as f:
            f.write("1024")
        m = mount(crops_ds)
        assert lane(m)["buffer_bytes"] == 1024 * os.sysconf("SC_PAGESIZE") + 4096
        read_all(files_of(m.mnt / "q3", 10))
        read_all(files_of(m.mnt / "q3", 10))
        assert lane(m)["open"] >= 10
    finally:
        with open(path, "w") as f:
            f.write(old)


def test_debug_traces_lane_requests(crops_ds, mount, tmp_path):
    log = tmp_path / "debug.log"
    m = mount(crops_ds, "--debug", "--log", log)
    assert lane(m)["running"] is True
    paths = files_of(m.mnt / "q2", 3)
    read_all(paths)
    read_all(paths)
    settled(m, "open", 3)
    deadline = time.monotonic() + 5
    while "pcrfs lane: open" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    text = log.read_text()
    assert "pcrfs lane: open ino=" in text and "pcrfs lane: ioctl" in text
    assert "lookup" in text      # Python's own trace goes on


def test_lane_reads_count_as_served_bytes(crops_ds, mount):
    m = mount(crops_ds)
    paths = files_of(m.mnt / "q4", 20)
    read_all(paths)
    s0 = m.stats()
    drop_page_cache(paths)
    read_all(paths)
    s1 = m.stats()
    assert s1["fast_lane"]["read"] > s0["fast_lane"]["read"]
    total = sum(os.path.getsize(p) for p in paths)
    assert s1["served_bytes"]["q4"] - s0["served_bytes"]["q4"] == total
    assert s1["served_files"]["q4"] - s0["served_files"]["q4"] == len(paths)


def test_a_large_file_counts_once_per_read_whatever_serves_its_chunks(corpus_ds, mount):
    """The kernel reads a multi-MB image in 128 KiB READs: the first goes to Python, which
    assembles and counts the whole file, the rest come from the lane's store and must not
    count it again; a re-read after the page cache was dropped counts it once more."""
    m = mount(corpus_ds)
    path = max(files_of(m.mnt / "q10"), key=os.path.getsize)
    size = os.path.getsize(path)
    assert size > 4 * 128 * 1024
    s0 = m.stats()
    read_all([path])
    s1 = m.stats()
    assert s1["served_bytes"]["q10"] - s0["served_bytes"].get("q10", 0) == size
    drop_page_cache([path])
    read_all([path])
    s2 = m.stats()
    assert s2["fast_lane"]["read"] - s1["fast_lane"]["read"] >= size // (128 * 1024)
    assert s2["served_bytes"]["q10"] - s1["served_bytes"]["q10"] == size
    assert s2["served_files"]["q10"] - s1["served_files"]["q10"] == 1
