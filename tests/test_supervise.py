"""-o supervise (issue 41): a mount that outlives its daemon.  Real kernel, real processes:
the supervisor mounts with mount(2) and keeps /dev/fuse; its daemons are SIGKILLed,
upgraded and crash-looped under readers that check every byte (tests/restart_load.py)."""
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import pcrfs
from testkit.restart_load import ReadLoad

from conftest import run_pcrfs, wait_until

RESTART_SECONDS = float(os.environ.get("PCRFS_RESTART_SECONDS", "0"))   # make soak: 60
KILLS, READERS = (5, 32) if RESTART_SECONDS else (3, 16)


def stats(mnt: Path) -> dict:
    return json.loads((mnt / ".pcrfs" / "stats.json").read_text())


def gone(pid: int) -> bool:
    try:   # a zombie (exited, not reaped by this container's init) counts as gone
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def mounted(mnt: Path) -> bool:
    return any(ln.split()[1] == str(mnt) for ln in open("/proc/self/mounts"))


@pytest.fixture
def supervised(tmp_path):
    """supervised(dst, *args) -> mount point; unmounted, supervisor gone, at teardown."""
    made = []

    def make(dst, *args, mnt=None):
        mnt = mnt or tmp_path / f"mnt{len(made)}"
        mnt.mkdir(exist_ok=True)
        run_pcrfs("mount", dst, mnt, "-o", "supervise", *args,
                  "--log", tmp_path / f"log{len(made)}")
        sup = stats(mnt)["supervisor"]["pid"]
        made.append((mnt, sup))
        return mnt
    yield make
    for mnt, sup in made:
        if mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        wait_until(lambda s=sup: gone(s), 30, "the supervisor to exit after the unmount")


def kill_daemon(mnt: Path, load: ReadLoad | None = None, progress: int = 200) -> int:
    """SIGKILL the serving daemon, wait for its successor to serve (and the readers to
    make progress through it); the successor's pid."""
    old = stats(mnt)["pid"]
    os.kill(old, signal.SIGKILL)

    def successor():
        try:
            p = stats(mnt)["pid"]
        except ConnectionAbortedError:   # in flight when it died, without resend: once
            return None
        return p if p != old else None
    new = wait_until(successor, 60, "a new daemon")
    if load is not None:
        base = load.reads()
        wait_until(lambda: load.reads() >= base + progress, 60, "reads through the new daemon")
    return new


def test_killed_daemons_are_replaced_under_readers_without_an_error(crops_ds, supervised,
                                                                    tmp_path):
    """16 readers of five views (and their directory listings) go on while the daemon is
    SIGKILLed 3 times (make soak: 32 readers, 5 kills over 60 s): every byte right, no
    ENOTCONN, no EIO.  The restarts are
    counted in stats.json and Prometheus, and the kernel kept its inodes: the new daemons
    named the ones they were asked about again."""
    prom = tmp_path / "pcrfs.prom"
    mnt = supervised(crops_ds, "-o", f"metrics_textfile={prom},metrics_interval=0.2")
    first = stats(mnt)
    assert first["restarts"] == 0 and first["fast_lane"]["running"]
    load = ReadLoad(mnt, crops_ds, ["q10", "l3", "raw", "mix", "dynamic"],
                    threads=READERS).start()
    try:
        started = time.monotonic()
        wait_until(lambda: load.reads() >= 300, 60, "readers under way")
        for k in range(KILLS):
            kill_daemon(mnt, load)
            if RESTART_SECONDS:        # make soak: 32 readers' worth of time between kills
                time.sleep(max(0.0, started + (k + 1) * RESTART_SECONDS / KILLS
                               - time.monotonic()))
    finally:
        summary = load.stop()
    assert summary["errors"] == 0, load.errors[:5]
    assert summary["mismatches"] == 0, load.mismatches[:5]
    assert summary["hung_readers"] == 0
    s = stats(mnt)
    assert s["restarts"] == KILLS and s["upgrades"] == 0
    assert s["supervisor"]["pid"] == first["supervisor"]["pid"]
    assert s["supervisor"]["recovered_inodes"] > 0      # the kernel's inodes, named again
    wait_until(lambda: prom.exists() and re.search(
        rf"^pcrfs_restarts_total(\{{[^}}]*\}})? {KILLS}(\.0)?$", prom.read_text(), re.M),
        30, "pcrfs_restarts_total in the textfile")


def test_the_python_request_path_survives_a_kill_too(crops_ds, supervised):
    """Without the fast lane every request is Python's: handles are inodes there too
    (files of immutable views and directories), so a new daemon continues them.  Files
    Python opened with a handle of its own (a control file, a dynamic/ file) are opened
    again from their inode by the daemon that finds the handle (the shim rewrites it)."""
    mnt = supervised(crops_ds, "-o", "fast_lane=no")
    assert not stats(mnt)["fast_lane"]["running"]
    ds = pcrfs.open_dataset(str(crops_ds))
    rel = sorted(p.relative_to(mnt / "q10") for p in (mnt / "q10").rglob("*") if p.is_file())[7]
    manifest = (mnt / ".pcrfs" / "manifest.json").read_bytes()
    held = os.open(mnt / ".pcrfs" / "manifest.json", os.O_RDONLY)   # per-open handles
    dyn = os.open(mnt / "dynamic" / rel, os.O_RDONLY)
    load = ReadLoad(mnt, crops_ds, ["q5", "l3", "raw"], threads=8).start()
    try:
        wait_until(lambda: load.reads() >= 200, 60, "readers under way")
        for _ in range(2):
            kill_daemon(mnt, load)
        assert os.pread(held, 1 << 20, 0) == manifest
        assert os.pread(dyn, 1 << 22, 0) == ds.read(str(rel).encode(), f"q{ds.groups}")
        assert stats(mnt)["supervisor"]["recovered_inodes"] > 0
    finally:
        os.close(held)
        os.close(dyn)
        ds.close()
        summary = load.stop()
    assert summary["errors"] == 0 and summary["mismatches"] == 0, load.errors[:5]
    assert stats(mnt)["restarts"] == 2


@pytest.mark.parametrize("lane", ["yes", "no"])
def test_without_resend_reads_in_flight_fail_once_and_the_rest_work(crops_ds, tmp_path, lane):
    """As on a kernel before 6.9 (no FUSE_NOTIFY_RESEND; forced here by
    PCRFS_TEST_NO_RESEND, as the INIT's flags would say): each daemon's lane reads clones
    made for it, and records what it hands to Python; at a kill the supervisor fails those
    with EIO on their clones, and closing the clones ends the few the lane was answering
    itself with ECONNABORTED.  Once each, no reader hangs, every later read is right."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "PCRFS_TEST_NO_RESEND": "1"}
    run_pcrfs("mount", crops_ds, mnt, "-o", f"supervise,fast_lane={lane}", env=env)
    sup = stats(mnt)["supervisor"]["pid"]
    try:
        load = ReadLoad(mnt, crops_ds, ["q10", "l3"], threads=8).start()
        try:
            wait_until(lambda: load.reads() >= 200, 60, "readers under way")
            for _ in range(2):
                kill_daemon(mnt, load)
        finally:
            summary = load.stop()
        assert summary["hung_readers"] == 0 and summary["mismatches"] == 0
        kinds = {"EIO" if "[Errno 5]" in e else e.split(":")[0] for _, e in load.errors}
        assert kinds <= {"EIO", "ConnectionAbortedError"}, load.errors[:5]
        assert len(load.errors) <= 2 * 8        # at most one per reader per kill
        assert stats(mnt)["restarts"] == 2
    finally:
        run_pcrfs("umount", mnt)
        wait_until(lambda: gone(sup), 30, "the supervisor to exit")


def test_upgrade_replaces_the_daemon_under_readers(crops_ds, supervised, tmp_path):
    mnt = supervised(crops_ds)
    before = stats(mnt)
    load = ReadLoad(mnt, crops_ds, ["q10", "l3", "dynamic"], threads=8).start()
    try:
        wait_until(lambda: load.reads() >= 200, 60, "readers under way")
        r = run_pcrfs("upgrade", mnt)
        base = load.reads()
        wait_until(lambda: load.reads() >= base + 200, 60, "reads through the new daemon")
    finally:
        summary = load.stop()
    assert summary["errors"] == 0 and summary["mismatches"] == 0, load.errors[:5]
    after = stats(mnt)
    assert r.stdout.strip() == f"{mnt}: daemon {before['pid']} -> {after['pid']}"
    assert gone(before["pid"]) and not gone(after["pid"])
    assert after["upgrades"] == 1 and after["restarts"] == 0
    # a mount without a supervisor says so
    (tmp_path / "plain").mkdir()
    run_pcrfs("mount", crops_ds, tmp_path / "plain", "-o", "supervise=no")
    try:
        bad = run_pcrfs("upgrade", tmp_path / "plain", check=False)
        assert bad.returncode == 2 and "not supervised" in bad.stderr, bad.stderr
    finally:
        run_pcrfs("umount", tmp_path / "plain")


def test_a_daemon_that_keeps_dying_leaves_eio_not_a_hang(small_src, supervised, tmp_path):
    """The dataset vanishes under a supervised mount and the daemon is killed: each new
    one fails to open it.  After restart_limit failures in a row the supervisor answers
    EIO itself, the mount can still be unmounted, and the supervisor then exits."""
    ds = tmp_path / "ds"
    run_pcrfs("build", small_src, ds, "-q")
    mnt = supervised(ds, "-o", "restart_limit=2")
    sup = stats(mnt)["supervisor"]["pid"]
    some = next(p for p in (mnt / "q5").rglob("*.jpg"))
    assert some.read_bytes()[:2] == b"\xff\xd8"
    ds.rename(tmp_path / "ds.gone")
    try:
        os.kill(stats(mnt)["pid"], signal.SIGKILL)
        result: list = []

        def read():
            try:
                (mnt / "q1" / some.relative_to(mnt / "q5")).read_bytes()
                result.append("read")
            except OSError as e:
                result.append(e.errno)
        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(60)          # 3 failures with back-off: a few seconds
        assert result == [5], f"expected EIO, got {result or 'a hang'}"
        assert not gone(sup)
        run_pcrfs("umount", mnt)
        wait_until(lambda: gone(sup), 30, "the supervisor to exit")
        assert not mounted(mnt)
    finally:
        (tmp_path / "ds.gone").rename(ds)


def test_a_daemon_that_cannot_start_fails_the_mount_and_leaves_nothing(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_pcrfs("mount", tmp_path / "missing", mnt, "-o", "supervise", check=False)
    # the daemon's own reason, through the supervisor
    assert r.returncode == 2 and re.search(r"failed before serving: .*missing", r.stderr), r.stderr
    assert not mounted(mnt)
    bad = run_pcrfs("mount", tmp_path, mnt, "-o", "supervise,restart_limit=x", check=False)
    assert bad.returncode == 2 and "restart_limit=N" in bad.stderr


def test_sigterm_to_the_supervisor_unmounts(crops_ds, supervised):
    mnt = supervised(crops_ds)
    s = stats(mnt)
    os.kill(s["supervisor"]["pid"], signal.SIGTERM)
    wait_until(lambda: gone(s["supervisor"]["pid"]) and gone(s["pid"]), 30,
               "supervisor and daemon to exit")
    assert not mounted(mnt)


def test_can_resend_reads_only_what_an_old_kernels_init_holds(monkeypatch):
    """Before Linux 5.17 FUSE_INIT is 56 bytes (no flags2): supervising must read it as
    "no resend", not fail (Ubuntu 22.04's 5.15, Amazon Linux 2, Debian 11, RHEL 8/9)."""
    import struct

    from pcrfs.fs.supervisor import FUSE_HAS_RESEND_HI, FUSE_INIT_EXT, can_resend
    monkeypatch.delenv("PCRFS_TEST_NO_RESEND", raising=False)
    header = struct.pack("<IIQQIIIHH", 0, 26, 1, 0, 0, 0, 0, 0, 0)      # 40 bytes
    assert len(header) == 40
    old = header + struct.pack("<IIII", 7, 31, 131072, FUSE_INIT_EXT)    # 56 bytes
    assert can_resend(old) is False
    for cut in range(len(old) + 1):
        assert can_resend(old[:cut]) is False
    new = header + struct.pack("<IIIII44x", 7, 41, 131072, FUSE_INIT_EXT, FUSE_HAS_RESEND_HI)
    assert len(new) == 104 and can_resend(new) is True
    assert can_resend(header + struct.pack("<IIIII44x", 7, 41, 131072, FUSE_INIT_EXT, 0)) is False
    assert can_resend(header + struct.pack("<IIIII44x", 7, 41, 131072, 0, FUSE_HAS_RESEND_HI)) is False
