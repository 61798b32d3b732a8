"""docs/SEMANTICS.md's operation table, performed through the kernel row by row."""
import errno
import os
import re
import signal
from pathlib import Path

import pytest

from conftest import run_pcrfs

DOC = (Path(__file__).parent.parent / "docs" / "SEMANTICS.md").read_text()
ROWS = re.findall(r"^\| ([^|]+?) \| (ok|E[A-Z]+)\b", DOC.split("## Operations")[1], re.M)


def _tcgets(path):
    import fcntl
    import termios
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, termios.TCGETS, bytes(64))
    finally:
        os.close(fd)


def ops(m, corrupt_file, truncated_file):
    f = m.mnt / "q1" / "c0" / "im00.jpg"
    d = m.mnt / "q1" / "c0"

    def read_all(p):
        with open(p, "rb") as fh:
            return fh.read()

    return {
        "stat": lambda: os.stat(f),
        "readdir": lambda: os.listdir(d),
        "open read-only": lambda: os.close(os.open(f, os.O_RDONLY)),
        "read": lambda: read_all(f),
        "getxattr user.pcrfs.label": lambda: os.getxattr(f, "user.pcrfs.label"),
        "getxattr of any other name": lambda: os.getxattr(f, "user.nope"),
        "listxattr": lambda: os.listxattr(f),
        "statfs": lambda: os.statvfs(m.mnt),
        "ioctl on a file (e.g. TCGETS, which `isatty()` sends)": lambda: _tcgets(f),
        "open for writing": lambda: os.open(f, os.O_WRONLY),
        "open with O_CREAT (create)": lambda: os.open(d / "new", os.O_WRONLY | os.O_CREAT, 0o644),
        "open with O_TRUNC": lambda: os.open(f, os.O_RDONLY | os.O_TRUNC),
        "write": lambda: os.write(os.open(f, os.O_RDWR), b"x"),
        "truncate": lambda: os.truncate(f, 1),
        "unlink": lambda: os.unlink(f),
        "rmdir": lambda: os.rmdir(d),
        "mkdir": lambda: os.mkdir(d / "x"),
        "rename": lambda: os.rename(f, d / "y"),
        "link": lambda: os.link(f, d / "z"),
        "symlink": lambda: os.symlink("t", d / "s"),
        "mknod": lambda: os.mknod(d / "n", 0o600 | 0o010000),
        "chmod": lambda: os.chmod(f, 0o600),
        "chown": lambda: os.chown(f, 1, 1),
        "utime": lambda: os.utime(f, (1, 1)),
        "setxattr": lambda: os.setxattr(f, "user.x", b"1"),
        "removexattr": lambda: os.removexattr(f, "user.pcrfs.view"),
        "write q1..qG or 1..G to .pcrfs/control/dynamic_fidelity":
            lambda: (m.mnt / ".pcrfs/control/dynamic_fidelity").write_text("q3\n"),
        "write anything else to .pcrfs/control/dynamic_fidelity":
            lambda: (m.mnt / ".pcrfs/control/dynamic_fidelity").write_text("q99\n"),
        "write to .pcrfs/stats.json": lambda: (m.mnt / ".pcrfs/stats.json").write_text("x"),
        "open a missing file": lambda: os.open(d / "missing.jpg", os.O_RDONLY),
        "read a file whose record bytes fail their checksum": lambda: read_all(corrupt_file),
        "read a file whose record is truncated or missing": lambda: read_all(truncated_file),
    }


def test_every_documented_operation(small_src, tmp_path, mount):
    import pcrfs
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    ds = pcrfs.open_dataset(str(dst))
    off, ln = ds.plan(b"c1/im01.jpg", "q1").segments[0]
    rec = dst / "records" / f"r{ds.lookup(b'c1/im01.jpg').record:06d}.pcr"
    raw = bytearray(rec.read_bytes())
    raw[off + 3] ^= 0xFF
    rec.write_bytes(raw)
    last = dst / "records" / "r000002.pcr"
    os.truncate(last, last.stat().st_size // 3)
    truncated = next(p for p, _ in ds.listdir(b"c2") if ds.lookup(b"c2/" + p).record == 2)
    m = mount(dst, "-o", "supervise=no")    # the last row: an unsupervised daemon's death
    table = ops(m, m.mnt / "q1" / "c1" / "im01.jpg", m.mnt / "q10" / "c2" / os.fsdecode(truncated))
    documented = {op: res for op, res in ROWS if not op.startswith("any access")}
    assert set(documented) == set(table), "SEMANTICS.md and this test list different operations"
    for op, expected in documented.items():
        if expected == "ok":
            table[op]()
            continue
        with pytest.raises(OSError) as ei:
            table[op]()
        assert ei.value.errno == getattr(errno, expected), (op, ei.value)
    # last row: a killed daemon
    assert any(op.startswith("any access") and res == "ENOTCONN" for op, res in ROWS)
    os.kill(m.pid, signal.SIGKILL)
    from conftest import raises_errno, wait_until
    wait_until(lambda: raises_errno(lambda: os.listdir(m.mnt / "q1"), errno.ENOTCONN), 10,
               "ENOTCONN from the dead daemon's mount")
