"""Who may do what on a mount, checked as a second uid (setpriv): without allow_other
nobody else gets in; with allow_other others read, the kernel checks modes
(default_permissions) unless explicitly disabled, and the daemon still refuses them the
control file; every mutating operation is refused."""
import errno
import os
import subprocess
import sys
import tempfile

import pytest

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _as_nobody(code):
    r = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def _probe(mnt, f):
    """What uid 65534 gets: listing, reading a file, writing the control file, creating."""
    code = f"""
import errno, os
out = []
for name, op in [("list", lambda: os.listdir({str(mnt)!r})),
                 ("read", lambda: open({str(f)!r}, "rb").read()),
                 ("control", lambda: open({str(mnt / '.pcrfs/control/dynamic_fidelity')!r}, "w").write("1")),
                 ("create", lambda: open({str(f.parent / 'new.jpg')!r}, "w")),
                 ("unlink", lambda: os.unlink({str(f)!r}))]:
    try:
        op()
        out.append(name + "=ok")
    except OSError as e:
        out.append(name + "=" + errno.errorcode[e.errno])
print(" ".join(out))
"""
    rc, out = _as_nobody(code)
    assert rc == 0, out
    return dict(x.split("=") for x in out.split())


@pytest.fixture
def public_dir():
    d = tempfile.mkdtemp(prefix="pcrfs-sec-", dir="/tmp")
    os.chmod(d, 0o755)
    return d


@pytest.mark.parametrize("opts,expect", [
    ((), {"list": "EACCES", "read": "EACCES", "control": "EACCES", "create": "EACCES",
          "unlink": "EACCES"}),
    (("-o", "allow_other"), {"list": "ok", "read": "ok", "control": "EACCES", "create": "EACCES",
                             "unlink": "EACCES"}),
    (("-o", "allow_other,no_default_permissions"),
     {"list": "ok", "read": "ok", "control": "EACCES", "create": "EROFS", "unlink": "EROFS"}),
])
def test_second_uid(crops_ds, mount, public_dir, record, opts, expect):
    m = mount(crops_ds, *opts, mnt=os.path.join(public_dir, "mnt"))
    f = next((m.mnt / "q1").rglob("*.JPEG"))
    got = _probe(m.mnt, f)
    assert got == expect
    line = next(x for x in open("/proc/mounts") if f" {m.mnt} " in x)
    assert ("default_permissions" in line) == ("no_default_permissions" not in " ".join(opts))
    # root, the mounting user, is refused every mutation too (not by permissions: EROFS)
    for op in (lambda: os.unlink(f), lambda: os.rename(f, f.parent / "x"),
               lambda: open(f, "r+b"), lambda: os.mkdir(f.parent / "d"),
               lambda: os.truncate(f, 0), lambda: os.setxattr(f, "user.x", b"1")):
        with pytest.raises(OSError) as ei:
            op()
        assert ei.value.errno in (errno.EROFS, errno.EPERM)
    record(security=" ".join(opts) or "default", second_uid=got)
