"""The mounted filesystem through the real kernel path, with real clients."""
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from PIL import Image

import pcrfs

from conftest import PCRFS, run_pcrfs
from test_build import image_paths


def walk_files(root):
    for dirpath, _, files in os.walk(os.fsencode(root)):
        for f in files:
            yield os.path.join(dirpath, f)


def test_every_file_of_every_view_matches_open_dataset(corpus_ds, mount):
    m = mount(corpus_ds)
    ds = pcrfs.open_dataset(str(corpus_ds))
    # l3, raw and mix themselves: tests/test_l3_view.py, tests/test_liquid.py
    assert ds.all_views == ds.views + ["l3", "raw", "mix"]
    assert sorted(os.listdir(m.mnt)) == sorted(ds.all_views + ["dynamic", ".pcrfs"])
    assert subprocess.run(["ls", str(m.mnt)], capture_output=True, text=True).stdout.split() == \
        sorted(ds.all_views + ["dynamic"])  # ls hides the dot directory
    n = 0
    for view in [*ds.views, "dynamic"]:   # dynamic/ starts at full fidelity
        vroot = os.path.join(os.fsencode(m.mnt), view.encode())
        want = view if view != "dynamic" else ds.views[-1]
        for f in walk_files(vroot):
            rel = os.path.relpath(f, vroot)
            st = os.stat(f)
            with open(f, "rb") as fh:
                data = fh.read()
            assert st.st_size == len(data) == ds.stat(rel, want).size
            assert data == ds.read(rel, want), (view, rel)
            assert st.st_mode & 0o777 == 0o444
            n += 1
    assert n == ds.manifest["images"] * (len(ds.views) + 1)
    for dirpath, _, _ in os.walk(m.mnt / "q1"):
        assert os.stat(dirpath).st_mode & 0o777 == 0o555


def test_top_view_is_pixel_identical_and_djpeg_decodes(corpus_src, corpus_ds, mount):
    m = mount(corpus_ds)
    top = m.mnt / f"q{pcrfs.open_dataset(str(corpus_ds)).groups}"
    for src in corpus_src.rglob("*.jpg"):
        rel = src.relative_to(corpus_src)
        with Image.open(src) as a, Image.open(top / rel) as b:
            assert np.array_equal(np.array(a), np.array(b)), rel
    for view in ("q1", "q3"):
        for f in (m.mnt / view).rglob("*.*"):
            p = subprocess.run(["djpeg", "-scale", "1/8", "-strict", str(f)], capture_output=True)
            assert p.returncode == 0 and p.stdout[:2] in (b"P5", b"P6"), (f, p.stderr)


def test_edge_dataset_all_views_decode_through_the_mount(edge_ds, mount):
    m = mount(edge_ds)
    files = 0
    for view in pcrfs.open_dataset(str(edge_ds)).views:
        for f in walk_files(m.mnt / view):
            p = subprocess.run(["djpeg", "-strict", f], capture_output=True)
            assert p.returncode == 0, (f, p.stderr)
            with Image.open(f) as im:
                im.load()
            files += 1
    ds = pcrfs.open_dataset(str(edge_ds))
    assert files == ds.manifest["images"] * len(ds.views)


def test_cp_find_du_tar_stat_getfattr(crops_ds, mount, tmp_path):
    m = mount(crops_ds)
    ds = pcrfs.open_dataset(str(crops_ds))
    subprocess.run(["cp", "-r", str(m.mnt / "q5"), str(tmp_path / "cp")], check=True)
    run_pcrfs("export", crops_ds, "q5", tmp_path / "export")
    assert subprocess.run(["diff", "-r", str(tmp_path / "cp"), str(tmp_path / "export")]).returncode == 0
    found = subprocess.run(["find", str(m.mnt / "q5"), "-type", "f"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert len(found) == ds.manifest["images"]
    du = subprocess.run(["du", "-sb", str(m.mnt / "q5")], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) == ds.manifest["summary"]["total_bytes"]["q5"]
    tar = subprocess.run(["tar", "c", "-C", str(m.mnt), "q2"], capture_output=True, check=True).stdout
    (tmp_path / "untar").mkdir()
    subprocess.run(["tar", "x", "-C", str(tmp_path / "untar")], input=tar, check=True)
    run_pcrfs("export", crops_ds, "q2", tmp_path / "export2")
    assert subprocess.run(["diff", "-r", str(tmp_path / "untar" / "q2"),
                           str(tmp_path / "export2")]).returncode == 0
    f = found[0]
    st = subprocess.run(["stat", "-c", "%s %a %h %F", f], capture_output=True, text=True).stdout
    assert st.split()[1:] == ["444", "1", "regular", "file"]
    rel = os.path.relpath(f, m.mnt / "q5")
    fa = subprocess.run(["getfattr", "-d", "-m", "user.pcrfs", f], capture_output=True, text=True)
    e = ds.lookup(rel)
    assert f'user.pcrfs.label="{e.label}"' in fa.stdout
    assert 'user.pcrfs.view="q5"' in fa.stdout and 'user.pcrfs.scans="5"' in fa.stdout
    assert os.getxattr(m.mnt / "q10" / rel, "user.pcrfs.scans") == str(e.scans).encode()
    with pytest.raises(OSError) as ei:
        os.getxattr(f, "user.other")
    assert ei.value.errno == errno.ENODATA
    df = subprocess.run(["df", str(m.mnt)], capture_output=True, text=True)
    assert df.returncode == 0 and "pcrfs" in df.stdout


def test_inodes_and_mtimes_are_stable_across_remounts(crops_ds, mount, tmp_path):
    def snapshot(mnt):
        out = {}
        for dirpath, dirs, files in os.walk(mnt):
            for n in dirs + files:
                st = os.stat(os.path.join(dirpath, n))
                out[os.path.relpath(os.path.join(dirpath, n), mnt)] = (st.st_ino, st.st_mtime_ns)
        return out
    m = mount(crops_ds)
    first = snapshot(m.mnt)
    m.__exit__(None, None, None)
    m2 = mount(crops_ds, mnt=m.mnt)
    assert snapshot(m2.mnt) == first
    inos = [ino for ino, _ in first.values()]
    assert len(set(inos)) == len(inos)


def _scan(d):
    """(name -> d_ino, name -> d_type is regular file) from one listing, no stat."""
    with os.scandir(d) as it:
        entries = list(it)
    return ({e.name: e.inode() for e in entries},
            {e.name: e.is_file(follow_symlinks=False) for e in entries})


def test_listing_attributes_follow_what_the_reader_does(crops_ds, mount):
    """readdirplus=auto: a listing nobody stats leaves no inode in the kernel (each later
    stat is a LOOKUP); once listed files get stat'ed, the next listings carry attributes
    (stats need no LOOKUP).  d_ino and d_type are right either way.  (The policy weighs
    LOOKUPs Python answers: -o lane_lookup=no, else the lane answers these in C, for about
    what a listed file's attributes cost, and listings stay bare: test_dataplane.)"""
    m = mount(crops_ds, "-o", "lane_lookup=no")
    classes = sorted(os.listdir(m.mnt / "q1"))
    lookups = lambda: m.stats()["requests"].get("lookup", 0)   # noqa: E731
    listed = lambda: m.stats()["readdir_entries"]               # noqa: E731

    d = m.mnt / "q1" / classes[0]
    before, l0 = listed(), lookups()
    inos, is_file = _scan(d)
    assert len(inos) == 30 and all(is_file.values())
    assert listed()["bare"] - before["bare"] == 30
    sts = {n: os.stat(d / n) for n in inos}        # what ls -l does after listing
    assert lookups() - l0 == 30                     # nothing was instantiated by the listing
    assert all(sts[n].st_ino == ino for n, ino in inos.items())   # d_ino == st_ino
    sizes = {n: st.st_size for n, st in sts.items()}

    d2 = m.mnt / "q1" / classes[1]                  # stats followed: attributes now
    before, l0 = listed(), lookups()
    inos2, _ = _scan(d2)
    assert listed()["attrs"] - before["attrs"] == 30 + 2 and listed()["bare"] == before["bare"]
    assert all(os.stat(d2 / n).st_ino == ino for n, ino in inos2.items())
    assert lookups() == l0                          # stats answered from the listing
    assert {n: os.stat(d / n).st_size for n in inos} == sizes


@pytest.mark.parametrize("mode", ["yes", "no"])
def test_listing_attributes_pinned(crops_ds, mount, mode):
    m = mount(crops_ds, "-o", f"readdirplus={mode}")
    cls = sorted(os.listdir(m.mnt / "q2"))[2]
    for _ in range(2):                              # no adaptation either way
        subprocess.run(["sh", "-c", "echo 2 > /proc/sys/vm/drop_caches"], check=True)
        (m.mnt / "q2" / cls).stat()                 # the directories' own lookups
        l0 = m.stats()["requests"].get("lookup", 0)
        subprocess.run(["ls", "-l", m.mnt / "q2" / cls], check=True, capture_output=True)
        assert m.stats()["requests"].get("lookup", 0) - l0 == (30 if mode == "no" else 0)
    assert m.stats()["readdirplus"] == mode
    bad = subprocess.run([PCRFS, "mount", crops_ds, m.mnt.parent / "x", "-o", "readdirplus=maybe"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "readdirplus=auto, yes or no" in bad.stderr


def test_large_directory_readdir_with_offsets(tmp_path, mount):
    from testkit.synthetic import build_synthetic
    build_synthetic(str(tmp_path / "big"), classes=1, per_class=100_000)
    m = mount(tmp_path / "big")
    d = m.mnt / "q1" / "c00000"
    names = os.listdir(d)          # many getdents calls, each resuming at an offset
    assert len(names) == 100_000 == len(set(names))
    assert sorted(names)[:2] == ["img_00000000.jpg", "img_00000001.jpg"]
    ls = subprocess.run(f"ls -f '{d}' | wc -l", shell=True, capture_output=True, text=True)
    assert int(ls.stdout) == 100_002  # . and ..
    with open(d / "img_00099999.jpg", "rb") as f:
        assert f.read(2) == b"\xff\xd8"


def test_control_files(crops_ds, mount):
    m = mount(crops_ds)
    manifest = json.loads((m.mnt / ".pcrfs" / "manifest.json").read_text())
    assert manifest == pcrfs.open_dataset(str(crops_ds)).manifest
    before = m.stats()
    data = (m.mnt / "q3" / "n00000000" / "img_000000.JPEG").read_bytes()
    after = m.stats()
    assert after["served_bytes"]["q3"] - before.get("served_bytes", {}).get("q3", 0) == len(data)
    assert after["backend_bytes"] > before["backend_bytes"]
    assert after["requests"]["open"] > before["requests"].get("open", 0)
    for key in ("cache_hits", "cache_misses", "checksum_failures", "errors", "uptime_s"):
        assert key in after


def test_a_counter_files_size_is_what_a_reader_then_reads(crops_ds, mount, tmp_path):
    """stats.json's counters move between a stat() and the open() after it; its size is
    steady (padded with newlines), so the size a reader stat()s is the size it reads, and
    tar archives it without 'file changed as we read it'."""
    m = mount(crops_ds)
    p = m.mnt / ".pcrfs" / "stats.json"
    grown = []
    for i in range(200):
        size = os.stat(p).st_size
        (m.mnt / "q1").stat()                  # moves the counters in between
        data = p.read_bytes()
        assert len(data) == size, (i, size, len(data))
        grown.append(len(data.rstrip(b"\n")))
    assert len(set(grown)) > 1         # the renderings' lengths did move
    assert json.loads(data)["requests"]["getattr"] > 0
    r = subprocess.run(["tar", "-cf", tmp_path / "s.tar", "-C", m.mnt, ".pcrfs/stats.json"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr, r.stderr
    subprocess.run(["tar", "-xf", tmp_path / "s.tar", "-C", tmp_path], check=True)
    assert "requests" in json.loads((tmp_path / ".pcrfs" / "stats.json").read_bytes())


def test_writes_get_erofs(crops_ds, mount):
    m = mount(crops_ds)
    f = m.mnt / "q1" / "n00000000" / "img_000000.JPEG"
    d = m.mnt / "q1" / "n00000000"
    attempts = {
        "open for write": lambda: open(f, "r+b"),
        "create": lambda: open(d / "new.jpg", "wb"),
        "unlink": lambda: os.unlink(f),
        "rename": lambda: os.rename(f, d / "x.jpg"),
        "mkdir": lambda: os.mkdir(d / "sub"),
        "rmdir": lambda: os.rmdir(d),
        "chmod": lambda: os.chmod(f, 0o644),
        "truncate": lambda: os.truncate(f, 0),
        "setxattr": lambda: os.setxattr(f, "user.x", b"1"),
        "symlink": lambda: os.symlink("a", d / "link"),
        "link": lambda: os.link(f, d / "hard"),
        "mknod": lambda: os.mknod(d / "fifo", 0o600 | 0o010000),
        "utime": lambda: os.utime(f, (0, 0)),
    }
    for name, fn in attempts.items():
        with pytest.raises(OSError) as ei:
            fn()
        assert ei.value.errno == errno.EROFS, name


@pytest.mark.parametrize("opts", [(), ("-o", "skip_open=yes")], ids=["default", "skip_open"])
def test_corrupt_byte_gives_eio_for_that_file_only(small_src, tmp_path, mount, opts):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    ds = pcrfs.open_dataset(str(dst))
    victim = b"c1/im04.jpg"
    e = ds.lookup(victim)
    off, ln = ds.plan(victim, "q1").segments[0]
    rec = dst / "records" / f"r{e.record:06d}.pcr"
    raw = bytearray(rec.read_bytes())
    raw[off + ln // 2] ^= 0x01
    rec.write_bytes(raw)
    m = mount(dst, *opts)
    with pytest.raises(OSError) as ei:
        (m.mnt / "q2" / "c1" / "im04.jpg").read_bytes()
    assert ei.value.errno == errno.EIO
    assert m.stats()["checksum_failures"] >= 1 and m.stats()["errors"]["EIO"] >= 1
    for p in image_paths(ds):
        if p != victim:
            assert (m.mnt / "q2" / os.fsdecode(p)).read_bytes() == ds.read(p, "q2")


def test_truncated_record_gives_eio_others_fine(small_src, tmp_path, mount):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    ds = pcrfs.open_dataset(str(dst))
    good = {p: ds.read(p, "q10") for p in image_paths(ds)}
    rec = dst / "records" / "r000001.pcr"
    os.truncate(rec, rec.stat().st_size // 2)
    m = mount(dst)
    bad = 0
    for p, want in good.items():
        try:
            got = (m.mnt / "q10" / os.fsdecode(p)).read_bytes()
        except OSError as e:
            assert e.errno == errno.EIO and ds.lookup(p).record == 1
            bad += 1
            continue
        assert got == want
    assert bad > 0


def test_sigkill_leaves_stale_mount_that_umount_cleans(crops_ds, mount, tmp_path):
    m = mount(crops_ds, "-o", "supervise=no")     # the opt-out: nothing restarts the daemon
    os.kill(m.pid, signal.SIGKILL)
    from conftest import raises_errno, wait_until
    wait_until(lambda: raises_errno(lambda: os.listdir(m.mnt), errno.ENOTCONN), 10,
               "ENOTCONN from the dead daemon's mount")
    r = run_pcrfs("mount", crops_ds, m.mnt, check=False)
    assert r.returncode != 0 and "pcrfs umount" in r.stderr and "stale" in r.stderr
    run_pcrfs("umount", m.mnt)
    assert os.listdir(m.mnt) == []
    m2 = mount(crops_ds, mnt=m.mnt)
    assert "q1" in os.listdir(m2.mnt)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_foreground_and_signals_unmount_cleanly(crops_ds, tmp_path, sig):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    p = subprocess.Popen([PCRFS, "mount", "-f", str(crops_ds), str(mnt)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            if os.path.ismount(mnt):
                break
            time.sleep(0.05)
        assert os.path.ismount(mnt) and "q1" in os.listdir(mnt)
        p.send_signal(sig)
        assert p.wait(timeout=20) == 0
        assert not os.path.ismount(mnt)
    finally:
        if p.poll() is None:
            p.kill()
            subprocess.run(["fusermount3", "-uz", str(mnt)])


def test_mount_returns_only_when_live(crops_ds, tmp_path):
    for i in range(3):
        mnt = tmp_path / f"m{i}"
        mnt.mkdir()
        run_pcrfs("mount", crops_ds, mnt)
        try:
            assert "q1" in os.listdir(mnt)  # no sleep, no retry
        finally:
            run_pcrfs("umount", mnt)


def test_mount_refusals(crops_ds, small_src, tmp_path, mount):
    r = run_pcrfs("mount", crops_ds, tmp_path / "missing", check=False)
    assert r.returncode == 2 and "does not exist" in r.stderr
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    r = run_pcrfs("mount", crops_ds, full, check=False)
    assert r.returncode == 2 and "not empty" in r.stderr and "nonempty" in r.stderr
    m = mount(crops_ds, "-o", "nonempty", mnt=full)
    assert "q1" in os.listdir(m.mnt)
    empty = tmp_path / "empty"
    empty.mkdir()
    partial = tmp_path / "half"
    shutil.copytree(crops_ds, partial)
    (partial / "manifest.json").unlink()
    r = run_pcrfs("mount", partial, empty, check=False)
    assert r.returncode == 2 and "did not finish" in r.stderr
    other = tmp_path / "other"
    run_pcrfs("build", small_src, other, "-q")
    mixed = tmp_path / "mixed"
    shutil.copytree(crops_ds, mixed)
    shutil.rmtree(mixed / "index.lmdb")
    shutil.copytree(other / "index.lmdb", mixed / "index.lmdb")
    r = run_pcrfs("mount", mixed, empty, check=False)
    assert r.returncode == 2 and "reindex" in r.stderr
    r = run_pcrfs("mount", crops_ds, empty, "-o", "bogus_option", check=False)
    assert r.returncode == 2 and "unknown mount option" in r.stderr
    assert not os.path.ismount(empty)


def test_every_mount_option_is_one_row_that_parses_and_refuses_by_name():
    """fs/options.py's OPTIONS table: each of pcrfs's own -o options parses its usage and
    refuses a bad value with a message naming the option and what it expects."""
    from pcrfs.errors import PcrfsError
    from pcrfs.fs.options import OPTIONS, parse_mount_options
    good = {"fidelity": "5", "readdirplus": "yes", "fast_lane": "yes", "lane_priority": "all",
            "lane_threads": "4", "lane_cold": "no", "lane_lookup": "no", "skip_open": "yes",
            "cache_policy": "static", "fetch": "record", "metrics": "9567",
            "metrics_textfile": "/run/x.prom",
            "metrics_labels": "team=vision", "metrics_interval": "2.5", "mix": "0.3",
            "mix_fidelity": "5", "seq": "3:5", "hold": "1M", "supervise": "yes", "restart_limit": "3",
            "lane_nice": "-7"}
    assert set(good) == set(OPTIONS)      # a new option gets a row here too
    mo = parse_mount_options([",".join(f"{k}={v}" for k, v in good.items())])
    assert (mo.fidelity, mo.readdirplus, mo.lane_priority, mo.lane_threads) == ("5", "yes", "all", 4)
    assert (mo.lane_cold, mo.lane_lookup, mo.skip_open, mo.supervise) == (False, False, True, True)
    assert (mo.cache_policy, mo.metrics[1], mo.metrics_textfile) == ("static", 9567, "/run/x.prom")
    assert mo.fetch == "record" and parse_mount_options([]).fetch == "image"
    assert mo.metrics_labels == {"team": "vision"} and mo.metrics_interval == 2.5
    assert (mo.mix, mo.mix_fidelity, mo.hold, mo.restart_limit) == (0.3, 5, 1 << 20, 3)
    assert mo.lane_nice == -7 and parse_mount_options([]).lane_nice == 0
    assert mo.seq == (3, 5) and parse_mount_options([]).seq is None
    assert parse_mount_options(["seq=all"]).seq == (0,)
    assert parse_mount_options(["seq=none"]).seq == ()
    assert parse_mount_options(["supervise"]).supervise is True
    assert parse_mount_options(["supervise=no"]).supervise is False
    for name in set(OPTIONS) - {"fidelity", "metrics_labels", "metrics_textfile"}:
        with pytest.raises(PcrfsError) as e:
            parse_mount_options([f"{name}=@@"])
        assert f"-o {name}=@@: " in str(e.value), str(e.value)
    with pytest.raises(PcrfsError, match="expected fast_lane=yes or no"):
        parse_mount_options(["fast_lane=maybe"])
    with pytest.raises(PcrfsError, match="expected readdirplus=auto, yes or no"):
        parse_mount_options(["readdirplus=maybe"])
    with pytest.raises(PcrfsError, match="expected metrics_interval=|a positive number"):
        parse_mount_options(["metrics_interval=-1"])
    with pytest.raises(PcrfsError, match="expected lane_threads=N, 1 to 256"):
        parse_mount_options(["lane_threads=0"])
    with pytest.raises(PcrfsError, match="expected lane_nice=N, -20 to 0"):
        parse_mount_options(["lane_nice=5"])
    with pytest.raises(PcrfsError, match="metrics_textfile=: no path"):
        parse_mount_options(["metrics_textfile="])
    with pytest.raises(PcrfsError, match="unknown mount option 'lane_threads'"):
        parse_mount_options(["lane_threads"])            # needs its value


def test_generic_mount_options_are_tolerated(crops_ds, mount):
    m = mount(crops_ds, "-o", "ro,_netdev,nofail,noauto,user,x-systemd.automount",
              "-o", "default_permissions,allow_other")
    assert "q1" in os.listdir(m.mnt)
    opts = [line for line in open("/proc/mounts") if str(m.mnt) in line][0]
    assert "allow_other" in opts and " ro," in opts.replace("fuse.pcrfs ro,", " ro,")


def test_concurrent_random_reads_match(crops_ds, mount):
    """16 threads of random reads across views: zero mismatches, bounded daemon RSS."""
    cache = 64 << 20
    m = mount(crops_ds, "--cache-size", "64M")
    ds = pcrfs.open_dataset(str(crops_ds))
    paths = list(image_paths(ds))
    views = ds.views
    expected = {(p, v): ds.read(p, v) for p in paths for v in views}
    stop = time.monotonic() + float(os.environ.get("PCRFS_STRESS_SECONDS", "10"))  # soak: 60
    mismatches, reads, errors = [], [0], []

    def worker(seed):
        rnd = random.Random(seed)
        while time.monotonic() < stop:
            p, v = rnd.choice(paths), rnd.choice(views)
            f = os.path.join(os.fsencode(m.mnt), v.encode(), p)
            try:
                fd = os.open(f, os.O_RDONLY)
                try:
                    chunks = []
                    while chunk := os.read(fd, rnd.choice([4096, 65536, 131072])):
                        chunks.append(chunk)
                    # drop the kernel's cached copy so the daemon keeps serving
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except OSError as e:
                errors.append(e)
                continue
            if b"".join(chunks) != expected[(p, v)]:
                mismatches.append((p, v))
            reads[0] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rss = int(open(f"/proc/{m.pid}/status").read().split("VmRSS:")[1].split()[0]) * 1024
    print(f"{reads[0]} reads, daemon RSS {rss >> 20} MiB")
    assert not mismatches and not errors and reads[0] > 1000
    assert rss < cache + (300 << 20)
    assert m.stats()["errors"] == {}


def test_record_order_uses_extents_and_random_order_reads_only_what_it_needs(crops_ds, mount):
    ds = pcrfs.open_dataset(str(crops_ds))
    paths = list(image_paths(ds))            # sorted = record order for an unshuffled build
    # the Python reader's policy (remote records, and local ones when the lane's cold path
    # is off); the lane's cold path reads exactly the segments, like a random reader
    m = mount(crops_ds, "-o", "lane_cold=no")
    for p in paths:
        (m.mnt / "q5" / os.fsdecode(p)).read_bytes()
    s = m.stats()
    from pcrfs.storage.reader import SEQUENTIAL_RUN
    records = ds.manifest["records"]
    assert s["extent_fetches"] == records
    # per record: the first SEQUENTIAL_RUN - 1 images read their 5 segments, then one extent
    assert s["backend_reads"] == records * ((SEQUENTIAL_RUN - 1) * 5 + 1)
    # the images read before the extent are read twice: (RUN-1)/64 extra per 64-image record
    served = sum(ds.stat(p, "q5").size for p in paths)
    assert s["backend_bytes"] <= served * (1 + (SEQUENTIAL_RUN - 1) / 64 + 0.01)
    m2 = mount(crops_ds, "--cache-size", "256k")   # smaller than any record extent
    order = paths[:]
    random.Random(1).shuffle(order)
    for p in order:
        (m2.mnt / "q2" / os.fsdecode(p)).read_bytes()
    s = m2.stats()
    served = s["served_bytes"]["q2"]
    assert s["extent_fetches"] == 0
    assert s["backend_bytes"] == served - 2 * len(paths)   # exactly the segments (EOI is free)


def test_bandwidth_limit_throttles_backend_bytes(crops_ds, mount):
    m = mount(crops_ds, "--bandwidth-limit", "200k", "--cache-size", "256k")
    assert m.stats()["bandwidth_limit_bytes_per_s"] == 200 * 1024
    files = sorted((m.mnt / "q10").rglob("*.JPEG"))[:40]
    t = time.monotonic()
    total = sum(len(f.read_bytes()) for f in files)
    elapsed = time.monotonic() - t
    # the bucket allows a 50 ms burst; everything else flows at 200 KiB/s
    assert elapsed >= (total - 0.05 * 200 * 1024) / (200 * 1024) * 0.95


def test_label_xattr_is_imagefolders_on_flat_and_train_val_trees(tmp_path, mount):
    """user.pcrfs.label equals ImageFolder's label for the root one level above the
    image's directory: on a train/val tree, ImageFolder("MNT/q3/train")'s, never the rank
    of train/ or val/ (issue 83)."""
    from torchvision import datasets

    from edgecases import photo_like
    src = tmp_path / "src"
    for split in ("train", "val"):
        for i, cls in enumerate(("ant", "bee", "cat")):
            d = src / split / cls
            d.mkdir(parents=True)
            for j in range(2):
                Image.fromarray(photo_like(40 + j, 32 + i, i * 7 + j)).save(d / f"{j}.jpg")
    run_pcrfs("build", src, tmp_path / "ds", "-q")
    m = mount(tmp_path / "ds")
    for root in (m.mnt / "q3" / "train", m.mnt / "q3" / "val", m.mnt / "l3" / "val"):
        folder = datasets.ImageFolder(str(root), loader=lambda p: p,
                                      is_valid_file=lambda p: p.endswith((".jpg", ".l3")))
        assert folder.classes == ["ant", "bee", "cat"]
        for path, label in folder.samples:
            assert int(os.getxattr(path, "user.pcrfs.label")) == label, path
