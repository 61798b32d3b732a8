"""Installed and run as users do (issue 55): `make wheel`'s wheels installed into a fresh
virtual environment of the system's Python, then that venv's `pcrfs` run by an ordinary
user (nobody): build, a mount through fusermount3 that is supervised by default and so
survives a SIGKILL of its daemon, reads checked byte for byte, umount; allow_other refused
with the fuse.conf line to add; -o supervise=no through libfuse's own fusermount path."""
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import pcrfs

from conftest import REPO, wait_until

NOBODY = 65534
# a Python the user can run, of the version the wheel is built for (cp3XY)
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def wheel_venv() -> Path:
    """make wheel, then pip install of dist/pcrfs-*.whl (and dist/'s pyfuse3) into a new
    venv that everyone may read; its bin/."""
    r = subprocess.run(["make", "-s", "wheel"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    dist = REPO / "dist"
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert [w.split("-")[0] for w in wheels] == ["pcrfs", "pyfuse3"], wheels
    assert all("manylinux" in w for w in wheels), wheels      # auditwheel repaired both
    assert os.path.exists(SYSTEM_PYTHON), f"{SYSTEM_PYTHON}: the system's python3 package"
    root = open_dir("pcrfs-wheel-")
    venv = root / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True)
    pcrfs_whl = next(dist.glob("pcrfs-*.whl"))
    r = subprocess.run([venv / "bin" / "pip", "install", "-q", "--prefer-binary",
                        "--find-links", dist, pcrfs_whl], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    yield venv / "bin"
    shutil.rmtree(root, ignore_errors=True)


def open_dir(prefix: str) -> Path:
    """A directory the user may enter (pytest's own tmp_path is root's alone, 0700)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o755)
    return d


def test_the_wheel_bundles_libjpeg_and_leaves_libfuse_to_the_system(wheel_venv):
    py = wheel_venv / "python"
    where = subprocess.run([py, "-c", "import pcrfs._native as n, pyfuse3 as f; "
                            "print(n.__file__); print(f.__file__)"],
                           capture_output=True, text=True, check=True, cwd="/")
    native, fuse = where.stdout.split()
    assert native.startswith(str(wheel_venv.parent))       # not this checkout's pcrfs
    libs = subprocess.run(["ldd", native], capture_output=True, text=True).stdout
    jpeg = next(ln for ln in libs.splitlines() if "libjpeg" in ln)
    assert "pcrfs.libs" in jpeg, jpeg                      # auditwheel's copy
    fuse_libs = subprocess.run(["ldd", fuse], capture_output=True, text=True).stdout
    assert "/pyfuse3.libs/" not in fuse_libs
    line = next(ln for ln in fuse_libs.splitlines() if "libfuse3" in ln)
    assert "not found" not in line and "=> /" in line, line     # the system's libfuse3


@pytest.fixture
def user_fuse():
    """/dev/fuse as distributions ship it (0666: udev's fuse rule), for this test only."""
    st = os.stat("/dev/fuse")
    os.chmod("/dev/fuse", 0o666)
    yield
    os.chmod("/dev/fuse", stat.S_IMODE(st.st_mode))


def as_nobody(cmd, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    def drop():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, preexec_fn=drop, capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})
    if check:
        assert r.returncode == 0, f"{cmd}: {r.stderr[-2000:]}"
    return r


HASH_TREE = ("import hashlib, json, os, sys; root = sys.argv[1]; print(json.dumps("
             "{os.path.relpath(os.path.join(d, f), root): hashlib.md5(open(os.path.join("
             "d, f), 'rb').read()).hexdigest() for d, _, fs in os.walk(root) for f in fs}))")


def mounts_of(mnt: Path) -> list[str]:
    return [ln for ln in open("/proc/self/mounts") if ln.split()[1] == str(mnt)]


def test_a_user_mounts_supervised_through_fusermount3_and_survives_a_kill(
        wheel_venv, user_fuse, small_src):
    top = open_dir("pcrfs-user-")
    home = top / "home"
    shutil.copytree(small_src, home / "src")
    for p in (home, *home.rglob("*")):
        os.chown(p, NOBODY, NOBODY)
    exe = wheel_venv / "pcrfs"
    as_nobody([exe, "build", "src", "ds", "--images-per-record", 8, "-q"], home)
    (home / "mnt").mkdir()
    os.chown(home / "mnt", NOBODY, NOBODY)
    mnt = home / "mnt"
    as_nobody([exe, "mount", "ds", "mnt", "--log", "mount.log"], home)
    try:
        (line,) = mounts_of(mnt)
        assert line.split()[2] == "fuse.pcrfs" and f"user_id={NOBODY}" in line   # fusermount3's
        stats = json.loads(as_nobody(["cat", mnt / ".pcrfs" / "stats.json"], home).stdout)
        assert stats["supervisor"]["pid"], "a user's mount is supervised by default"
        got = json.loads(as_nobody([SYSTEM_PYTHON, "-c", HASH_TREE, mnt / "q5"], home).stdout)
        ds = pcrfs.open_dataset(str(home / "ds"))
        want = {rel: hashlib.md5(ds.read(rel.encode(), "q5")).hexdigest() for rel in got}
        ds.close()
        assert len(got) == 24 and got == want
        os.kill(stats["pid"], signal.SIGKILL)
        again = json.loads(as_nobody([SYSTEM_PYTHON, "-c", HASH_TREE, mnt / "q5"], home).stdout)
        assert again == want                              # served by the next daemon
        after = json.loads(as_nobody(["cat", mnt / ".pcrfs" / "stats.json"], home).stdout)
        assert after["pid"] != stats["pid"] and after["restarts"] == 1
        as_nobody([exe, "umount", "mnt"], home)
        assert not mounts_of(mnt)
        wait_until(lambda: not os.path.exists(f"/proc/{stats['supervisor']['pid']}/status")
                   or "zombie" in open(f"/proc/{stats['supervisor']['pid']}/status").read(),
                   30, "the supervisor to exit after the user's umount")
        # allow_other needs a line in /etc/fuse.conf: the error names it
        if "user_allow_other" not in [ln.strip() for ln in open("/etc/fuse.conf")]:
            for opt in ("allow_other", "allow_root"):   # fusermount3 drops allow_root quietly
                r = as_nobody([exe, "mount", "ds", "mnt", "-o", opt], home, check=False)
                assert r.returncode != 0 and "user_allow_other" in r.stderr \
                    and f"-o {opt}" in r.stderr and "/etc/fuse.conf" in r.stderr, r.stderr
                assert not mounts_of(mnt)
        # the opt-out: libfuse mounts through fusermount3 itself, no supervisor
        as_nobody([exe, "mount", "ds", "mnt", "-o", "supervise=no"], home)
        plain = json.loads(as_nobody(["cat", mnt / ".pcrfs" / "stats.json"], home).stdout)
        assert not plain.get("supervisor")
        assert json.loads(as_nobody([SYSTEM_PYTHON, "-c", HASH_TREE, mnt / "q5"],
                                    home).stdout) == want
        as_nobody([exe, "umount", "mnt"], home)
        assert not mounts_of(mnt)
    finally:
        if mounts_of(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)
