"""Hostile datasets (issue 84, docs/SECURITY.md): crafted with pcrfs's own writers, so every
checksum is valid, each must be refused with one clear line or give EIO for the one file it
damages, never reach outside the dataset, hang the mount, or exhaust the daemon."""
from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import copy_dataset, reseal, rewrite_index

from pcrfs.format import INDEX_FILE
from pcrfs.format.index import ENTRY

from conftest import Mount, run_pcrfs


@pytest.fixture
def ds(small_src, tmp_path) -> Path:
    """24 images in 3 records of 8."""
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    return dst


def _in_record(mnt: Path, record: int) -> list[Path]:
    """The q3 files of one record (user.pcrfs.record: "record index"), relative to the view."""
    return [p.relative_to(mnt / "q3") for p in sorted((mnt / "q3").rglob("*.jpg"))
            if int(os.getxattr(p, "user.pcrfs.record").split()[0]) == record]


def _read(path: Path, timeout: float = 30) -> tuple[int, bytes]:
    """(errno or 0, bytes) of a read in a child process: a hang fails the test, not the run."""
    code = ("import sys,os\ntry:\n  sys.stdout.buffer.write(open(sys.argv[1],'rb').read())\n"
            "except OSError as e:\n  sys.exit(e.errno)\n")
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                       timeout=timeout)
    return p.returncode, p.stdout


@pytest.mark.parametrize("lane", ["yes", "no"])
def test_a_symlinked_record_is_never_followed(ds, tmp_path, lane):
    """records/r000000.pcr -> a file outside the dataset (here the genuine record moved
    away, so every checksum would match): neither Python nor the C lane follows it; the
    other records' files are untouched, and verify names it."""
    outside = tmp_path / "outside.pcr"
    rec = ds / "records" / "r000000.pcr"
    with Mount(ds, tmp_path / "m1", "-o", f"fast_lane={lane}") as m:
        first, other = _in_record(m.mnt, 0), _in_record(m.mnt, 1)
    os.rename(rec, outside)
    rec.symlink_to(outside)
    with Mount(ds, tmp_path / "m2", "-o", f"fast_lane={lane}") as m:
        assert first and other
        for p in first:
            assert _read(m.mnt / "q3" / p)[0] == errno.EIO, p
        for p in other:
            rc, data = _read(m.mnt / "q3" / p)
            assert rc == 0 and data[:2] == b"\xff\xd8"
    r = run_pcrfs("verify", ds, check=False)
    assert r.returncode != 0 and "r000000.pcr" in r.stdout + r.stderr


def test_a_fifo_in_place_of_a_record_gives_eio_not_a_hang(ds, tmp_path):
    rec = ds / "records" / "r000000.pcr"
    rec.unlink()
    os.mkfifo(rec)
    with Mount(ds, tmp_path / "m3") as m:
        files = sorted((m.mnt / "q3").rglob("*.jpg"))      # the listing does not hang
        assert len(files) == 24
        codes = [_read(p)[0] for p in files]
        assert codes.count(errno.EIO) == 8 and codes.count(0) == 16
        assert json.loads((m.mnt / ".pcrfs" / "stats.json").read_text())["pid"]
    r = run_pcrfs("verify", ds, check=False, timeout=60)
    assert r.returncode != 0 and "r000000.pcr" in r.stdout + r.stderr


def test_a_path_that_escapes_is_refused_by_mount_export_and_verify(ds, tmp_path):
    victim = tmp_path / "escape.jpg"
    first = sorted((ds.parent / "src").rglob("*.jpg"))[0]
    rewrite_index(ds, rename={os.fsencode(first.relative_to(ds.parent / "src")):
                              b"../escape.jpg"})
    out = tmp_path / "out" / "deep"
    r = run_pcrfs("export", ds, "q3", out, check=False)
    assert r.returncode != 0 and "'..'" in r.stderr and "refused" in r.stderr
    assert not victim.exists() and not (tmp_path / "out" / "escape.jpg").exists()
    r = run_pcrfs("verify", ds, check=False)
    assert r.returncode != 0 and "unsafe image path" in r.stdout + r.stderr
    (tmp_path / "mnt").mkdir(exist_ok=True)
    r = run_pcrfs("mount", ds, tmp_path / "mnt", check=False, timeout=60)
    assert r.returncode != 0 and "'..'" in r.stderr and "refused" in r.stderr


@pytest.mark.parametrize("groups", [1000000, 1e9, 0, "3"])
def test_a_crafted_groups_field_is_refused_at_once(ds, tmp_path, groups):
    reseal(ds, groups=groups)
    (tmp_path / "mnt").mkdir()
    for cmd in (["mount", ds, tmp_path / "mnt"], ["verify", ds], ["info", ds]):
        r = run_pcrfs(*cmd, check=False, timeout=60)
        assert r.returncode != 0 and "'groups'" in r.stdout + r.stderr, cmd


def test_entries_claiming_too_much_give_eio_for_their_file_alone(ds, tmp_path):
    """One entry's first segment claims 4 GiB, another names record 2^31-1: those files
    are EIO in every view.  A third at index 2^24-1 (which would size the lane's table at
    16 M slots) reads, the lane refusing that table.  Every other file reads, and the
    daemon stays up."""
    crafted = {}

    def patch(path: bytes, v: bytes) -> bytes:
        kind = ("huge", "record", "index")[len(crafted)] if len(crafted) < 3 else None
        if kind is None:
            return v
        rec, idx, *rest = ENTRY.unpack_from(v, 0)
        if kind == "huge":       # the first segment's end
            v = v[:ENTRY.size] + struct.pack("<I", 0xFFFFFFF0) + v[ENTRY.size + 4:]
        else:
            rec, idx = (0x7FFFFFFF, idx) if kind == "record" else (rec, 0xFFFFFF)
            v = ENTRY.pack(rec, idx, *rest) + v[ENTRY.size:]
        crafted[path] = kind
        return v
    rewrite_index(ds, patch=patch)
    with Mount(ds, tmp_path / "m4") as m:
        for view in ("q1", "q3", "b2"):
            seen = 0
            for p in (m.mnt / view).rglob("*.jpg"):
                kind = crafted.get(os.fsencode(p.relative_to(m.mnt / view)))
                code = _read(p)[0]
                assert code == (errno.EIO if kind in ("huge", "record") else 0), (view, p, code)
                seen += 1
            assert seen == 24
        assert m.alive()
    r = run_pcrfs("verify", ds, check=False, timeout=120)      # findings, not a traceback
    assert r.returncode == 1 and "Traceback" not in r.stderr and "PROBLEM" in r.stdout


def test_a_damaged_index_is_refused_before_lmdb_maps_it(ds, tmp_path):
    index = ds / INDEX_FILE
    with open(index, "r+b") as f:
        f.truncate(os.path.getsize(index) // 2)
    r = run_pcrfs("verify", ds, check=False, timeout=60)
    assert r.returncode == 1 and "data.mdb" in r.stdout + r.stderr      # not SIGBUS (135)
    (tmp_path / "mnt").mkdir(exist_ok=True)
    r = run_pcrfs("mount", ds, tmp_path / "mnt", check=False, timeout=60)
    assert r.returncode != 0 and "checksum" in r.stderr


def test_a_remote_uuid_cannot_escape_the_cache_dir(ds, tmp_path):
    """A manifest whose uuid is "../victim": info (default cache dir) and mount
    (--cache-dir) refuse it before it names a path; the directory it aimed at is intact."""
    from testkit.servers import Nginx
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    served = copy_dataset(ds, tmp_path / "www" / "ds")
    reseal(served, uuid="../victim")
    n = Nginx(served.parent, tmp_path / "nginx")
    n.start()
    try:
        (tmp_path / "mnt").mkdir()
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}      # cache: tmp_path/pcrfs
        for args in (["info", f"{n.url}/ds"],
                     ["mount", f"{n.url}/ds", tmp_path / "mnt", "--cache-dir", tmp_path / "c"]):
            r = run_pcrfs(*args, check=False, timeout=60, env=env)
            assert r.returncode != 0 and "'uuid'" in r.stderr, r.stderr
        assert (victim / "keep").read_text() == "mine" and os.listdir(victim) == ["keep"]
    finally:
        n.stop()


def test_the_shared_fallback_cache_dir_is_private_or_refused(tmp_path):
    """/var/tmp/pcrfs-<uid> made by someone else first (here: chowned to another uid, or
    world-writable) is refused, never used; made by us, it is 0700."""
    from pcrfs.errors import DatasetError
    from pcrfs.storage.diskcache import claim_private, fallback_cache_dir
    assert fallback_cache_dir() == f"/var/tmp/pcrfs-{os.getuid()}"
    planted = tmp_path / "pcrfs-planted"
    planted.mkdir()
    os.chown(planted, 64123, 64123)
    with pytest.raises(DatasetError, match="not a private directory.*owner uid 64123"):
        claim_private(str(planted))
    os.chown(planted, os.getuid(), os.getgid())
    planted.chmod(0o777)
    with pytest.raises(DatasetError, match="mode 777"):
        claim_private(str(planted))
    planted.rmdir()
    claim_private(str(planted))
    st = planted.stat()
    assert st.st_uid == os.getuid() and (st.st_mode & 0o777) == 0o700
