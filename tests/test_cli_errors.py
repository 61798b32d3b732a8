"""Every subcommand given bad input: a non-zero exit, one line on stderr naming the
problem, never a traceback.  And a mount by a user with no home and with no access to
/dev/fuse (runuser -u nobody)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from pcrfs.fs.kmount import is_mounted

from conftest import run_pcrfs, wait_until

PCRFS = str(Path(sys.executable).with_name("pcrfs"))


def _bad(cases: list[tuple]) -> list[str]:
    """Run each case (args, what stderr must say); the cases that broke the contract."""
    def one(case):
        args, says = case
        p = subprocess.run([PCRFS, *map(str, args)], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        ok = (p.returncode != 0 and len(lines) == 1 and "Traceback" not in p.stderr
              and says.lower() in p.stderr.lower())
        return None if ok else f"pcrfs {' '.join(map(str, args))}: rc {p.returncode}, " \
                               f"stderr {p.stderr.strip()[-600:]!r}"
    with ThreadPoolExecutor(4) as pool:
        return [r for r in pool.map(one, cases) if r]


def test_every_subcommand_refuses_bad_input_in_one_line(small_src, tmp_path, mount):
    ds = tmp_path / "ds"
    run_pcrfs("build", small_src, ds, "-q", "--images-per-record", "8")
    m = mount(ds)
    afile = tmp_path / "afile"
    afile.write_text("x")
    notds = tmp_path / "notds"
    notds.mkdir()
    missing = tmp_path / "missing"
    out = tmp_path / "out"
    points = iter(range(100))

    def empty():        # each mount case its own mount point: they run at once
        d = tmp_path / f"point{next(points)}"
        d.mkdir()
        return d
    cases = [
        (["build", missing, out], "missing"),
        (["build", afile, out], "afile"),
        (["build", small_src, afile], "afile"),
        (["info", missing], "missing"),
        (["info", afile], "afile"),
        (["info", notds], "not a pcrfs dataset"),
        (["info", "s3://"], "s3://"),
        (["info", "ftp://host/x"], "ftp"),
        (["verify", notds], "not a pcrfs dataset"),
        (["verify", "gs:///nobucket"], "gs:"),
        (["export", notds, "q2", out], "notds"),
        (["export", ds, "q99", out], "q99"),
        (["reindex", notds], "notds"),
        (["materialize", notds, "raw", "--fraction", "0.5"], "notds"),
        (["materialize", ds, "raw", "--fraction", "2"], "fraction"),
        (["push", missing, "s3://bucket/x"], "missing"),
        (["push", ds, "notaurl"], "notaurl"),
        (["mount", missing, empty()], "missing"),
        (["mount", notds, empty()], "not a pcrfs dataset"),
        (["mount", ds, missing], "missing"),
        (["mount", ds, afile], "afile"),
        (["mount", ds, m.mnt], "already a mount"),
        (["mount", ds, empty(), "-o", "hold=lots"], "hold"),
        (["mount", ds, empty(), "-o", "fetch=bogus"], "fetch"),
        (["mount", ds, empty(), "-o", "nosuchoption"], "nosuchoption"),
        (["mount", ds, empty(), "--cache-size", "lots"], "lots"),
        (["mount", "s3://", empty()], "s3://"),
        (["umount", notds], "not a mount point"),
        (["umount", missing], "missing"),
        (["status", notds], "notds"),
        (["status", missing], "missing"),
        (["set-fidelity", notds, "3"], "notds"),
        (["set-fidelity", m.mnt, "99"], "99"),
        (["tune", notds, "--dry-run"], "notds"),
        (["warm", notds], "notds"),
        (["upgrade", notds], "notds"),
        (["model", "--images", "100", "--bytes-per-image", "1,2", "--nodes", "0"], "nodes"),
    ]
    bad = _bad(cases)
    assert not bad, "\n".join(bad)


@contextmanager
def _mode(path: str, mode: int):
    old = stat.S_IMODE(os.stat(path).st_mode)
    os.chmod(path, mode)
    try:
        yield
    finally:
        os.chmod(path, old)


@contextmanager
def _traversable_by_others(path: str):
    """Each directory above `path` opened to others for traversal (o+x) while inside: the
    interpreter may live under /root (pyenv); restored after."""
    changed = []
    p = Path(path).resolve().parent
    for d in [p, *p.parents]:
        m = stat.S_IMODE(d.stat().st_mode)
        if not m & stat.S_IXOTH:
            os.chmod(d, m | stat.S_IXOTH)
            changed.append((d, m))
    try:
        yield
    finally:
        for d, m in changed:
            os.chmod(d, m)


def test_a_user_without_a_home_mounts_and_is_told_about_dev_fuse(small_src, tmp_path):
    """nobody (HOME=/nonexistent) mounts a local dataset; with /dev/fuse closed to it,
    the error names the device's mode and the mends."""
    import pwd
    nobody = pwd.getpwnam("nobody")
    assert not os.access(nobody.pw_dir, os.W_OK) or not os.path.isdir(nobody.pw_dir)
    base = tmp_path / "nohome"
    base.mkdir()
    ds, mnt = base / "ds", base / "mnt"
    run_pcrfs("build", small_src, ds, "-q", "--images-per-record", "8")
    mnt.mkdir()
    os.chown(mnt, nobody.pw_uid, nobody.pw_gid)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": nobody.pw_dir}

    def as_nobody(*args, **kw):
        return subprocess.run(["runuser", "-u", "nobody", "--", PCRFS, *map(str, args)],
                              capture_output=True, text=True, timeout=120, env=env, **kw)
    with _traversable_by_others(sys.executable), _traversable_by_others(PCRFS), \
            _traversable_by_others(str(mnt)), \
            _traversable_by_others(os.path.realpath(sys.executable)):
        for d in (base, ds):
            os.chmod(d, 0o755)
        with _mode("/dev/fuse", 0o600):
            p = as_nobody("mount", ds, mnt)
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert "/dev/fuse is mode 0600" in p.stderr and "0666" in p.stderr, p.stderr
        assert "fuse" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "usermod -aG root" not in p.stderr           # unsafe, and useless at 0600
        with _mode("/dev/fuse", 0o666):
            p = as_nobody("mount", ds, mnt)
            assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
            try:
                # not os.path.ismount: root may not stat a mount without allow_other
                wait_until(lambda: is_mounted(str(mnt)), 30, "nobody's mount")
                ls = subprocess.run(["runuser", "-u", "nobody", "--", "ls", f"{mnt}/l3",
                                     f"{mnt}/q2"], capture_output=True, text=True, timeout=60)
                assert ls.returncode == 0 and "c0" in ls.stdout, ls.stderr
                head = subprocess.run(["runuser", "-u", "nobody", "--", "djpeg", "-fast",
                                       f"{mnt}/q2/c0/im00.jpg"], capture_output=True,
                                      timeout=60)
                assert head.returncode == 0 and head.stdout[:2] == b"P6", head.stderr
            finally:
                u = as_nobody("umount", mnt)
                assert u.returncode == 0, u.stderr


def test_version_bare_command_and_a_closed_pipe(small_src, tmp_path):
    import pcrfs as pkg
    v = run_pcrfs("--version")
    assert v.stdout.strip() == f"pcrfs {pkg.__version__}"
    bare = run_pcrfs()
    assert bare.returncode == 0 and "usage: pcrfs" in bare.stdout and "build" in bare.stdout
    assert "required" not in bare.stderr
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    # a reader gone before the first line (`| head` that has read enough): quiet, 141
    p = subprocess.Popen([PCRFS, "info", str(dst)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait() == 141 and err == "", err


def test_help_names_every_subcommand_and_explains_every_argument():
    """The top-level help lists every subcommand, and every argument of every one says
    what it is (issue 86: csi, materialize, tune, warm and model were missing; mount's
    dst/mnt, --log, --debug, umount --lazy had no text)."""
    from pcrfs.cli import parser
    p = parser()
    sub = p._subparsers._group_actions[0]          # noqa: SLF001
    assert p.description.split()[0] in run_pcrfs("--help").stdout
    words = p.description.replace(",", " ").replace(".", " ").split()
    assert [n for n in sub.choices if n not in words] == []
    bare = [(name, a.dest) for name, sp in sub.choices.items() for a in sp._actions  # noqa: SLF001
            if not a.help and a.dest != "help"]
    assert bare == []


def test_the_dev_fuse_hint_never_suggests_joining_roots_group(tmp_path):
    import grp

    from pcrfs.fs.kmount import _fuse_device_hint
    dev = tmp_path / "fuse"
    dev.touch()
    os.chown(dev, 0, 0)
    dev.chmod(0o600)
    hint = _fuse_device_hint("fusermount3: failed to open /dev/fuse", str(dev))
    assert "mode 0600, group root" in hint and "chmod 0666" in hint
    assert "usermod -aG root" not in hint and "usermod -aG fuse USER" in hint
    disk = grp.getgrnam("disk").gr_gid                 # a group of its own, opened to it
    os.chown(dev, 0, disk)
    dev.chmod(0o660)
    assert "usermod -aG disk USER" in _fuse_device_hint("failed to open /dev/fuse", str(dev))


def test_set_fidelity_full_and_a_busy_umount_say_what_to_do(small_src, tmp_path, mount):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    m = mount(dst)
    g = len([d for d in os.listdir(m.mnt) if d.startswith("q")])
    assert run_pcrfs("set-fidelity", m.mnt, "2").stdout.strip().endswith("q2")
    assert run_pcrfs("set-fidelity", m.mnt, "full").stdout.strip().endswith(f"-> q{g}")
    bad = run_pcrfs("set-fidelity", m.mnt, "0", check=False)
    assert bad.returncode != 0 and f"q1..q{g}" in bad.stderr and "full" in bad.stderr
    f = open(next((m.mnt / "q1").rglob("*.jpg")), "rb")      # noqa: SIM115 - held open
    try:
        busy = run_pcrfs("umount", m.mnt, check=False)
        assert busy.returncode != 0 and "busy" in busy.stderr and "--lazy" in busy.stderr
        assert len(busy.stderr.strip().splitlines()) == 1
    finally:
        f.close()
