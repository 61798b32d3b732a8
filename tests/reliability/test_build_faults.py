"""SIGKILL `pcrfs build` at five moments: the destination never opens or mounts, and
--resume yields the dataset an uninterrupted build gives.  A full disk: a clear error and
nothing that looks complete."""
import json
import os
import signal
import subprocess
import time

import pytest

import pcrfs
from pcrfs.errors import DatasetError

from conftest import PCRFS, run_pcrfs

ARGS = ["-q", "--images-per-record", "16", "--workers", "2"]


def _comparable(dst):
    m = json.loads((dst / "manifest.json").read_text())
    for k in ("uuid", "created", "xxh3"):   # the checksums cover uuid and timings
        m.pop(k)
    m["files"] = sorted(m["files"])
    return m


def _every_view(dst):
    ds = pcrfs.open_dataset(str(dst))
    out = {}
    for cls, _ in ds.listdir(b""):
        for n, d in ds.listdir(cls):
            if not d:
                p = cls + b"/" + n
                for v in ds.views:
                    out[(v, p)] = ds.read(p, v)
    return out


def test_sigkill_at_five_moments_then_resume(crops_src, tmp_path, mount, record):
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    run_pcrfs("build", crops_src, ref, *ARGS)
    full = time.monotonic() - t0
    want_manifest, want_bytes = _comparable(ref), _every_view(ref)
    moments = [full * f for f in (0.05, 0.25, 0.45, 0.65, 0.85)]
    survived = interrupted = 0
    for i, delay in enumerate(moments):
        dst = tmp_path / f"ds{i}"
        proc = subprocess.Popen([PCRFS, "build", str(crops_src), str(dst), *ARGS],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if dst.exists():        # the build won the race: it must then be complete
            assert (dst / "manifest.json").exists()
        else:
            interrupted += 1
            with pytest.raises(DatasetError):
                pcrfs.open_dataset(str(dst))
            mnt = tmp_path / f"mnt{i}"
            mnt.mkdir()
            r = run_pcrfs("mount", dst, mnt, check=False)
            assert r.returncode != 0 and not os.path.ismount(mnt)
            if (tmp_path / f"ds{i}.partial").exists():
                r = run_pcrfs("mount", tmp_path / f"ds{i}.partial", mnt, check=False)
                assert r.returncode != 0 and not os.path.ismount(mnt)
                run_pcrfs("build", crops_src, dst, *ARGS, "--resume")
            else:               # killed before anything was written: a plain rerun
                run_pcrfs("build", crops_src, dst, *ARGS)
        assert _comparable(dst) == want_manifest
        assert _every_view(dst) == want_bytes
        survived += 1
    record(fault="SIGKILL build", moments=[round(x, 2) for x in moments], build_seconds=round(full, 2),
           resumed_identical=survived, interrupted=interrupted)
    assert survived == 5
    assert interrupted >= 1, "no build was killed before it finished: the test proved nothing"


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_full_disk_during_build(crops_src, small_disk, record):
    dst = small_disk / "ds"
    r = run_pcrfs("build", crops_src, dst, *ARGS, check=False)
    assert r.returncode != 0
    assert "No space left on device" in r.stderr or "ENOSPC" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not (dst / "manifest.json").exists()
    for p in (dst, small_disk / "ds.partial"):
        with pytest.raises(DatasetError):
            pcrfs.open_dataset(str(p))
    record(fault="full disk (1.5 MiB tmpfs)", error=r.stderr.strip().splitlines()[-1][:200],
           complete_looking_dataset=False)
