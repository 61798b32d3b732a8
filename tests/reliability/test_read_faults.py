"""Damage records on disk, then read every file of every view through the mount: each
damaged image is EIO, each undamaged one exact.  Bit flips at random offsets, a
truncated record, a missing record; a foreign index; the daemon killed mid-read."""
import errno
import os
import random
import shutil
import signal
import threading
import time

import pytest

import pcrfs

from conftest import run_pcrfs


def _all_files(ds):
    out = []
    for cls, _ in ds.listdir(b""):
        out += [cls + b"/" + n for n, d in ds.listdir(cls) if not d]
    return out


def _damaged(ds, path, view, bad_bytes):
    """Whether any byte of the file's segments at `view` is in bad_bytes ({record: pred})."""
    plan = ds.plan(path, view)
    pred = bad_bytes.get(plan.record)
    return pred is not None and any(pred(off, ln) for off, ln in plan.segments)


def _check_every_file(ds, mnt, bad_bytes):
    good = eio = wrong = 0
    for path in _all_files(ds):
        for view in ds.views:
            expect_eio = _damaged(ds, path, view, bad_bytes)
            try:
                data = (mnt / view / os.fsdecode(path)).read_bytes()
            except OSError as e:
                assert e.errno == errno.EIO and expect_eio, (view, path, e)
                eio += 1
                continue
            if expect_eio or data != ds.read(path, view):
                wrong += 1
            else:
                good += 1
    return good, eio, wrong


@pytest.fixture
def fresh_ds(crops_ds, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(crops_ds, dst)
    return dst


def test_bit_flips_at_random_offsets(fresh_ds, mount, record):
    clean = pcrfs.open_dataset(str(fresh_ds))
    rnd = random.Random(7)
    flips = {}
    for rec in sorted((fresh_ds / "records").glob("*.pcr")):
        raw = bytearray(rec.read_bytes())
        offs = sorted(rnd.sample(range(len(raw)), 6))
        for o in offs:
            raw[o] ^= 1 << rnd.randrange(8)
        rec.write_bytes(raw)
        flips[int(rec.stem[1:])] = offs
    bad = {r: (lambda offs: lambda off, ln: any(off <= o < off + ln for o in offs))(o)
           for r, o in flips.items()}
    m = mount(fresh_ds)
    good, eio, wrong = _check_every_file(clean, m.mnt, bad)
    record(fault="bit flips", flips=sum(map(len, flips.values())), files_checked=good + eio + wrong,
           eio=eio, correct=good, served_wrong=wrong)
    assert wrong == 0 and eio > 0 and good > eio


def test_truncated_and_missing_records(fresh_ds, mount, record):
    clean = pcrfs.open_dataset(str(fresh_ds))
    recs = sorted((fresh_ds / "records").glob("*.pcr"))
    cut = recs[0].stat().st_size * 2 // 3
    os.truncate(recs[0], cut)
    recs[1].unlink()
    bad = {0: lambda off, ln: off + ln > cut, 1: lambda off, ln: True}
    m = mount(fresh_ds)
    good, eio, wrong = _check_every_file(clean, m.mnt, bad)
    record(fault="truncated record + missing record", files_checked=good + eio + wrong, eio=eio,
           correct=good, served_wrong=wrong)
    assert wrong == 0 and eio > 0 and good > 0
    assert m.stats()["errors"]["EIO"] >= eio   # counted per request: the kernel may retry


def test_damaged_directory_listing_is_eio_for_that_directory_only(fresh_ds, mount, record,
                                                                  tmp_path):
    import lmdb
    from hostile import reseal

    from pcrfs.format.index import DBS, MAP_SIZE, dir_key
    clean = pcrfs.open_dataset(str(fresh_ds))
    classes = [c for c, _ in clean.listdir(b"")]
    want = sorted(n for n, _ in clean.listdir(classes[1]))
    clean.close()
    env = lmdb.open(str(fresh_ds / "index.lmdb"), map_size=MAP_SIZE, max_dbs=len(DBS))
    with env.begin(write=True) as txn:
        db = env.open_db(b"dirs", txn=txn)
        v = txn.get(dir_key(classes[0]), db=db)
        txn.put(dir_key(classes[0]), v[:-1], db=db)      # last name cut short
    env.close()
    # the index no longer matches the manifest's checksum: refused whole, before LMDB
    # maps it; sealed again (a dataset written that way), the one directory is EIO
    (tmp_path / "mnt").mkdir()
    r = run_pcrfs("mount", fresh_ds, tmp_path / "mnt", check=False)
    assert r.returncode != 0 and "does not match the manifest's checksum" in r.stderr
    reseal(fresh_ds)
    m = mount(fresh_ds)
    with pytest.raises(OSError) as e:
        os.listdir(m.mnt / "q1" / os.fsdecode(classes[0]))
    assert e.value.errno == errno.EIO
    other = m.mnt / "q1" / os.fsdecode(classes[1])
    assert sorted(os.fsencode(n) for n in os.listdir(other)) == want
    assert m.stats()["errors"]["EIO"] >= 1
    record(fault="truncated directory listing in the index", eio_dirs=1,
           other_dirs_listed=len(classes) - 1)


def test_foreign_or_corrupt_index_refuses_to_mount(fresh_ds, small_src, tmp_path, record):
    other = tmp_path / "other"
    run_pcrfs("build", small_src, other, "-q")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    shutil.rmtree(fresh_ds / "index.lmdb")
    shutil.copytree(other / "index.lmdb", fresh_ds / "index.lmdb")
    r = run_pcrfs("mount", fresh_ds, mnt, check=False)   # not the index the manifest sums
    assert r.returncode != 0 and "does not match the manifest's checksum" in r.stderr \
        and not os.path.ismount(mnt)
    (fresh_ds / "index.lmdb" / "data.mdb").write_bytes(os.urandom(8192))
    r2 = run_pcrfs("mount", fresh_ds, mnt, check=False)
    assert r2.returncode != 0 and r2.stderr.strip() and not os.path.ismount(mnt)
    record(fault="foreign index, corrupt index", refused=2)


def test_daemon_killed_mid_read_errors_not_hangs(crops_ds, tmp_path, mount, record):
    """-o supervise=no: nothing restarts the daemon (a supervised mount answers the read:
    test_supervised_daemon_killed_mid_read_answers_the_read)."""
    m = mount(crops_ds, "--bandwidth-limit", "20k", "--cache-size", "256k", "-o", "supervise=no")
    files = sorted((m.mnt / "q10").rglob("*.JPEG"))[:40]
    outcome, done = {}, [0]

    def reader():
        try:
            for f in files:
                f.read_bytes()
                done[0] += 1
            outcome["r"] = "finished"
        except OSError as e:
            outcome["r"] = e.errno

    t = threading.Thread(target=reader)
    t.start()
    from conftest import wait_until  # a file read, the next one in flight (20 KB/s)
    wait_until(lambda: done[0] >= 1, 60, "the first throttled read")
    assert "r" not in outcome
    os.kill(m.pid, signal.SIGKILL)
    t0 = time.monotonic()
    t.join(timeout=30)
    assert not t.is_alive(), "a reader hung after the daemon died"
    assert outcome["r"] in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO), outcome
    run_pcrfs("umount", m.mnt, check=False)
    m2 = mount(crops_ds, mnt=m.mnt)     # service restored on the same mount point
    assert (m2.mnt / "q1").is_dir() and files[0].read_bytes()[:2] == b"\xff\xd8"
    record(fault="daemon SIGKILL mid-read", reader_error=errno.errorcode[outcome["r"]],
           seconds_to_error=round(time.monotonic() - t0, 2), remount="ok")


def test_supervised_daemon_killed_mid_read_answers_the_read(crops_ds, tmp_path, mount, record):
    """The same kill under -o supervise (docs/MOUNT.md): the read in flight is resent to
    the daemon that replaces the dead one and returns the right bytes; no error."""
    m = mount(crops_ds, "-o", "supervise", "--bandwidth-limit", "20k", "--cache-size", "256k")
    files = sorted((m.mnt / "q10").rglob("*.JPEG"))[:4]
    ds = pcrfs.open_dataset(str(crops_ds))
    expected = {f: ds.read(str(f.relative_to(m.mnt / "q10")).encode(), "q10") for f in files}
    ds.close()
    outcome, done = {}, [0]

    def reader():
        try:
            for f in files:
                if f.read_bytes() != expected[f]:
                    outcome["r"] = f"wrong bytes in {f.name}"
                    return
                done[0] += 1
            outcome["r"] = "finished"
        except OSError as e:
            outcome["r"] = errno.errorcode.get(e.errno, e.errno)

    t = threading.Thread(target=reader)
    t.start()
    from conftest import wait_until
    wait_until(lambda: done[0] >= 1, 60, "the first throttled read")
    at_kill = done[0]
    os.kill(m.stats()["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    wait_until(lambda: done[0] > at_kill or "r" in outcome, 120, "the read in flight to end")
    answered = time.monotonic() - t0
    t.join(timeout=300)
    assert not t.is_alive(), "a reader hung after the daemon died"
    assert outcome["r"] == "finished", outcome
    assert m.stats()["restarts"] == 1
    record(fault="daemon SIGKILL mid-read, -o supervise", reader_result="right bytes",
           seconds_to_answer=round(answered, 2), restarts=1)
