"""Dataset format guarantees: crash safety, resume, checksums, reindex, index size."""
import errno
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from PIL import Image

import pcrfs
from pcrfs.errors import CorruptDataError, DatasetError
from pcrfs.format.record import read_header_path

from conftest import PCRFS, run_pcrfs
from edgecases import photo_like
from test_build import image_paths


def all_reads(ds, view="q2"):
    return {p: ds.read(p, view) for p in image_paths(ds)}


def test_manifest_and_record_headers_describe_the_dataset(small_src, tmp_path):
    run_pcrfs("build", small_src, tmp_path / "ds", "--images-per-record", 10, "-q")
    m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert m["format_version"] == 1 and m["images"] == 24 and m["records"] == 3
    assert m["groups"] == 10 and m["build"]["images_per_record"] == 10
    heads = [read_header_path(str(p)) for p in sorted((tmp_path / "ds" / "records").glob("*.pcr"))]
    assert [h.count for h in heads] == [10, 10, 4]
    assert all(str(h.dataset_uuid) == m["uuid"] for h in heads)
    assert heads[0].images[0].path == b"c0/im00.jpg" and heads[0].classes == [b"c0", b"c1", b"c2"]


def test_existing_destination_is_refused(small_src, tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "keep.txt").write_text("mine")
    r = run_pcrfs("build", small_src, tmp_path / "ds", "-q", check=False)
    assert r.returncode == 2 and "already exists" in r.stderr
    assert (tmp_path / "ds" / "keep.txt").read_text() == "mine"


def test_killed_build_never_opens_and_resume_completes(corpus_part_src, tmp_path):
    dst = tmp_path / "ds"
    partial = tmp_path / "ds.partial"
    proc = subprocess.Popen([PCRFS, "build", str(corpus_part_src), str(dst), "-q",
                             "--images-per-record", "4", "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        recs = list((partial / "records").glob("*.pcr")) if partial.exists() else []
        if len(recs) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not dst.exists(), "a killed build must not produce the destination"
    for bad in (dst, partial):
        with pytest.raises(DatasetError):
            pcrfs.open_dataset(str(bad))
    info = run_pcrfs("info", partial, check=False)
    assert info.returncode == 2 and "did not finish" in info.stderr
    again = run_pcrfs("build", corpus_part_src, dst, "-q", "--images-per-record", "4", check=False)
    assert again.returncode == 2 and "--resume" in again.stderr
    done_before = {p.name: p.stat().st_mtime_ns for p in (partial / "records").glob("*.pcr")}
    run_pcrfs("build", corpus_part_src, dst, "-q", "--images-per-record", "4", "--resume")
    assert not partial.exists()
    for name, mtime in done_before.items():  # finished records were kept, not redone
        assert (dst / "records" / name).stat().st_mtime_ns == mtime
    ds = pcrfs.open_dataset(str(dst))
    assert ds.manifest["images"] == len(list(corpus_part_src.rglob("*.*")))
    assert run_pcrfs("verify", dst).returncode == 0


def test_resume_refuses_changed_sources(small_src, tmp_path):
    partial = tmp_path / "ds.partial"
    (partial / "records").mkdir(parents=True)
    (partial / "build-state.json").write_text(json.dumps({"uuid": "0" * 32, "plan_hash": "x"}))
    r = run_pcrfs("build", small_src, tmp_path / "ds", "--resume", "-q", check=False)
    assert r.returncode == 2 and "changed" in r.stderr


def test_corrupt_record_byte_fails_that_file_only(small_src, tmp_path):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    ds = pcrfs.open_dataset(str(dst))
    victim = b"c1/im04.jpg"
    e = ds.lookup(victim)
    plan = ds.plan(victim, "q1")
    good = all_reads(ds, "q10")
    ds.close()
    rec = dst / "records" / f"r{e.record:06d}.pcr"
    data = bytearray(rec.read_bytes())
    off, ln = plan.segments[0]
    data[off + ln // 2] ^= 0x40
    rec.write_bytes(data)
    ds = pcrfs.open_dataset(str(dst))
    for view in ds.views:
        with pytest.raises(CorruptDataError) as ei:
            ds.read(victim, view)
        assert ei.value.errno == errno.EIO and f"record {e.record}" in str(ei.value)
    assert ds.checksum_failures == len(ds.views)
    for p, want in good.items():
        if p != victim:
            assert ds.read(p, "q10") == want
    r = run_pcrfs("verify", dst, check=False)
    assert r.returncode == 1
    assert "DAMAGED c1/im04.jpg" in r.stdout and r.stdout.count("DAMAGED") == 1


def test_truncated_record_gives_eio_and_verify_names_images(small_src, tmp_path):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 24, "-q")
    rec = dst / "records" / "r000000.pcr"
    size = rec.stat().st_size
    os.truncate(rec, size - 5000)
    ds = pcrfs.open_dataset(str(dst))
    errors = 0
    for p in image_paths(ds):
        try:
            ds.read(p, "q10")
        except CorruptDataError:
            errors += 1
    assert 0 < errors < 24
    r = run_pcrfs("verify", dst, check=False)
    assert r.returncode == 1 and "DAMAGED" in r.stdout


def test_reindex_rebuilds_an_identical_index(edge_ds, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(edge_ds, dst)
    before = pcrfs.open_dataset(str(dst))
    entries = {p: before.lookup(p) for p in image_paths(before)}
    listing = before.listdir(b"names")
    before.close()
    shutil.rmtree(dst / "index.lmdb")
    with pytest.raises(DatasetError, match="index missing"):
        pcrfs.open_dataset(str(dst))
    assert "reindexed" in run_pcrfs("reindex", dst).stdout
    after = pcrfs.open_dataset(str(dst))
    assert {p: after.lookup(p) for p in image_paths(after)} == entries
    assert after.listdir(b"names") == listing and after.classes == before.classes


def test_index_and_manifest_must_agree(small_src, tmp_path):
    run_pcrfs("build", small_src, tmp_path / "a", "-q")
    run_pcrfs("build", small_src, tmp_path / "b", "-q")
    shutil.rmtree(tmp_path / "a" / "index.lmdb")
    shutil.copytree(tmp_path / "b" / "index.lmdb", tmp_path / "a" / "index.lmdb")
    with pytest.raises(DatasetError, match="reindex"):
        pcrfs.open_dataset(str(tmp_path / "a"))
    r = run_pcrfs("verify", tmp_path / "a", check=False)    # not the index it vouches for
    assert r.returncode == 1 and "PROBLEM index.lmdb/data.mdb" in r.stdout \
        and "run `pcrfs reindex`" in r.stdout
    # records from another build are refused by reindex too
    shutil.copy(tmp_path / "b" / "records" / "r000000.pcr", tmp_path / "a" / "records" / "r000000.pcr")
    r = run_pcrfs("reindex", tmp_path / "a", check=False)
    assert r.returncode == 2 and "belongs to dataset" in r.stderr


def test_index_is_at_most_256_bytes_per_image(tmp_path):
    src = tmp_path / "src"
    base = Image.fromarray(photo_like(24, 16))
    for c in range(20):
        d = src / f"n{c:08d}"
        d.mkdir(parents=True)
        for i in range(100):
            base.save(d / f"n{c:08d}_{i:05d}.JPEG", quality=50 + i % 40)
    r = run_pcrfs("build", src, tmp_path / "ds", "-q")
    info = json.loads(run_pcrfs("info", tmp_path / "ds", "--json").stdout)
    print(f"index bytes per image (2000 images): {info['index_bytes_per_image']}")
    assert info["index_bytes_per_image"] <= 256
    assert "bytes per image" in r.stdout


def test_sizes_in_dir_matches_per_file_sizes_at_every_depth(edge_ds):
    """The one-cursor directory walk (readdirplus sizes) jumps over subdirectories."""
    ds = pcrfs.open_dataset(str(edge_ds))
    todo, dirs = [b""], 0
    while todo:
        d = todo.pop()
        dirs += 1
        entries = ds.listdir(d)
        files = {n for n, is_dir in entries if not is_dir}
        todo += [(d + b"/" + n if d else n) for n, is_dir in entries if is_dir]
        for view in ("q1", ds.views[-1]):
            sizes = ds.sizes_in_dir(d, view)
            assert set(sizes) == files
            assert all(sizes[n] == ds.file_size((d + b"/" + n if d else n), view) for n in files)
    assert dirs >= 4


def test_listing_encoding_round_trips_and_rejects_truncation():
    from hypothesis import given
    from hypothesis import strategies as st

    from pcrfs.format.index import pack_listing, unpack_listing
    names = st.binary(min_size=1, max_size=300).filter(lambda n: b"/" not in n and b"\0" not in n)

    @given(st.dictionaries(names, st.booleans(), max_size=40))
    def round_trip(children):
        buf = pack_listing(children.items())
        assert unpack_listing(buf) == sorted(children.items())
        if buf:
            with pytest.raises(ValueError, match="truncated"):
                unpack_listing(buf[:-1] if len(buf) > 3 else buf[:2])
    round_trip()


def test_a_reader_collected_while_the_env_lock_is_held_does_not_deadlock(small_src, tmp_path):
    """The collector can run an IndexReader's __del__ inside _open_env on the thread that
    holds the lock (seen: test_limits hung in lmdb.open's allocation); the release waits for
    the next holder instead, and the environment is closed once its last reader is gone."""
    import threading

    from pcrfs.format import index
    run_pcrfs("build", small_src, tmp_path / "ds", "-q")
    path = str(tmp_path / "ds" / "index.lmdb")
    r = index.IndexReader(path)
    env = r.env
    done = threading.Event()

    def collect_under_the_lock():
        nonlocal r
        with index._ENVS_LOCK:
            r = None                  # __del__ runs here, on the lock's holder
        done.set()
    t = threading.Thread(target=collect_under_the_lock)
    t.start()
    t.join(10)
    assert done.is_set(), "__del__ blocked on the lock its own thread holds"
    assert index._DEFERRED
    import lmdb
    env.stat()                        # still open: its release only waits
    other = index.IndexReader(path)   # the next holder releases it: its last reader, closed
    assert not index._DEFERRED and other.env is not env
    with pytest.raises(lmdb.Error):
        env.stat()
    other.close()
    assert not any(k == other._key for k in index._ENVS)
