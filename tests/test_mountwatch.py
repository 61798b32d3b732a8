"""tests/mountwatch.py counts the FUSE mounts this run makes, and only those: another
job's or a developer's mount elsewhere on the machine is not a test's (issue 86)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mountwatch import TOKEN_VAR, MountWatch

from conftest import Mount, run_pcrfs


def test_only_this_runs_fuse_mounts_are_counted(small_src, tmp_path):
    ds = tmp_path / "ds"
    run_pcrfs("build", small_src, ds, "-q")
    watch = MountWatch(str(tmp_path / "elsewhere"))     # a basetemp that holds no mount
    outside = Path(tempfile.mkdtemp(prefix="pcrfs-mountwatch-", dir="/tmp"))
    try:
        (outside / "foreign").mkdir()
        foreign_env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        run_pcrfs("mount", ds, outside / "foreign", env=foreign_env)
        try:
            with Mount(ds, outside / "ours") as m:
                seen = watch._ours()
                assert str(m.mnt) in seen
                assert str(outside / "foreign") not in seen
        finally:
            run_pcrfs("umount", outside / "foreign")
    finally:
        watch.close()
        for d in ("foreign", "ours"):
            (outside / d).rmdir()
        outside.rmdir()
