"""Operating a mount: mount -t fuse.pcrfs and fstab through libfuse's mount.fuse3,
systemd's readiness protocol and journal logging, the units under systemd-analyze,
`pcrfs status`, --debug tracing, and EIO logged once."""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import PCRFS, REPO, run_pcrfs

VENV_BIN = os.path.dirname(PCRFS)


def _env():
    return dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"])


@pytest.fixture
def helper_on_path():
    """mount(8) runs mount.fuse3 with a fixed PATH, and mount.fuse3 runs `pcrfs DST MNT -o
    ...`: pcrfs must be in /usr/local/bin, as `make install` links it.  Link this venv's
    for the test and put back whatever was there."""
    link = Path("/usr/local/bin/pcrfs")
    old = os.readlink(link) if link.is_symlink() else None
    if link.exists() and old is None:
        pytest.fail(f"{link} is a regular file, not `make install`'s link")
    tmp = link.with_name(".pcrfs.test-link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(PCRFS)
    tmp.rename(link)
    yield
    if old is None:
        link.unlink()
    else:
        tmp.symlink_to(old)
        tmp.rename(link)


def _umount(mnt):
    subprocess.run([PCRFS, "umount", str(mnt)], capture_output=True)


def test_mount_t_fuse_pcrfs_and_fstab(crops_ds, tmp_path, helper_on_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "fuse.pcrfs", str(crops_ds), str(mnt), "-o", "ro,allow_other"],
                       env=_env(), capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        # live the moment mount(8) returns
        assert os.path.ismount(mnt) and "q1" in os.listdir(mnt)
        line = next(x for x in open("/proc/mounts") if f" {mnt} " in x)
        assert line.split()[2] == "fuse.pcrfs" and "allow_other" in line
        assert line.split()[3].startswith("ro")
    finally:
        _umount(mnt)
    assert not os.path.ismount(mnt)
    # an fstab line with the generic options mount(8) and systemd add
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{crops_ds} {mnt} fuse.pcrfs ro,_netdev,nofail,allow_other,noatime,"
                     f"x-systemd.automount,x-systemd.device-timeout=10 0 0\n")
    r = subprocess.run(["mount", "--fstab", str(fstab), str(mnt)], env=_env(),
                       capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        f = next((mnt / "q2").rglob("*.JPEG"))
        assert f.read_bytes()[:2] == b"\xff\xd8"
    finally:
        _umount(mnt)


def test_mount_helper_failure_is_nonzero_with_the_reason(tmp_path, helper_on_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "fuse.pcrfs", str(tmp_path / "no-such-dataset"), str(mnt)],
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "no-such-dataset" in r.stderr + r.stdout and not os.path.ismount(mnt)
    r = subprocess.run([PCRFS, str(tmp_path), str(mnt), "-o", "bogus_option"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "unknown mount option 'bogus_option'" in r.stderr


def test_systemd_notify_ready_only_when_live_and_stopping(crops_ds, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sock_path = str(tmp_path / "notify.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(sock_path)
    srv.settimeout(60)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def message() -> tuple[str, int]:
        """A datagram and its sender's pid: systemd takes only the main process's
        (NotifyAccess=main), here the supervisor that `pcrfs mount -f` became."""
        data, anc, _, _ = srv.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = next(struct.unpack("<i", d[:4])[0] for lvl, t, d in anc
                   if lvl == socket.SOL_SOCKET and t == socket.SCM_CREDENTIALS)
        return data.decode(), pid
    err = open(tmp_path / "stderr", "wb")
    st = os.fstat(err.fileno())
    env = dict(os.environ, NOTIFY_SOCKET=sock_path, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
    p = subprocess.Popen([PCRFS, "mount", "-f", str(crops_ds), str(mnt)], env=env, stderr=err)
    try:
        msg, pid = message()
        assert msg.startswith("READY=1") and "STATUS=serving" in msg and pid == p.pid
        assert os.path.ismount(mnt) and "q1" in os.listdir(mnt)   # live when READY arrives
        p.send_signal(signal.SIGTERM)
        assert message() == ("STOPPING=1", p.pid)
        assert p.wait(timeout=30) == 0
        assert not os.path.ismount(mnt)
    finally:
        if p.poll() is None:
            p.kill()
            _umount(mnt)
        srv.close()
    # stderr connected to the journal: syslog priorities, no timestamps (journald adds them)
    log = (tmp_path / "stderr").read_text().splitlines()
    assert any(x.startswith("<6>pcrfs.mount: mounted ") for x in log), log
    assert all(x.startswith("<") for x in log if x)


def test_units_pass_systemd_analyze_verify(tmp_path):
    assert shutil.which("systemd-analyze"), "the systemd package is installed by make sysdeps"
    units = ["pcrfs@.service", "mnt-imagenet.mount", "mnt-imagenet.automount"]
    for u in units:
        text = (REPO / "systemd" / u).read_text()
        # the installed path (make install) may not exist here: check against this venv's
        (tmp_path / u).write_text(text.replace("/usr/local/bin/pcrfs", PCRFS))
    shutil.copy(tmp_path / "pcrfs@.service", tmp_path / "pcrfs@mnt-imagenet.service")
    svc = (tmp_path / "pcrfs@.service").read_text()
    assert "Type=notify" in svc and "ExecStop=" in svc and "Restart=on-failure" in svc
    assert "EnvironmentFile=/etc/pcrfs/%i.env" in svc
    ok = subprocess.run(["systemd-analyze", "verify", "--man=no", "pcrfs@mnt-imagenet.service",
                         "mnt-imagenet.mount", "mnt-imagenet.automount"], cwd=tmp_path,
                        capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout + ok.stderr == "", ok.stdout + ok.stderr
    # the check is real: a broken copy is reported
    (tmp_path / "broken@x.service").write_text(svc.replace("Type=notify", "Type=notifyy"))
    bad = subprocess.run(["systemd-analyze", "verify", "--man=no", "broken@x.service"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert "notifyy" in bad.stdout + bad.stderr


def test_status_debug_trace_and_eio_logged_once(small_src, tmp_path, mount):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    import pcrfs
    ds = pcrfs.open_dataset(str(dst))
    off, _ = ds.plan(b"c1/im01.jpg", "q1").segments[0]
    rec = ds.lookup(b"c1/im01.jpg").record
    path = dst / "records" / f"r{rec:06d}.pcr"
    raw = bytearray(path.read_bytes())
    raw[off + 3] ^= 0xFF
    path.write_bytes(raw)
    log = tmp_path / "daemon.log"
    m = mount(dst, "--debug", "--log", log, "--bandwidth-limit", "50M")
    good = (m.mnt / "q3" / "c0" / "im00.jpg").read_bytes()
    for _ in range(3):
        with pytest.raises(OSError):
            (m.mnt / "q1" / "c1" / "im01.jpg").read_bytes()
    out = run_pcrfs("status", m.mnt).stdout
    assert f"daemon pid {m.pid}" in out and "uptime" in out
    j = json.loads(run_pcrfs("status", m.mnt, "--json").stdout)
    n = j["errors"]["EIO"]   # the kernel may retry a failed read once
    assert n >= 3 and f"EIO {n}; checksum failures {j['checksum_failures']}" in out
    assert "limited to 50.0 MiB/s" in out and f"q3 {len(good)} B (1 files)" in out
    assert "hit rate" in out and "dynamic     q10" in out
    assert j["served_bytes"]["q3"] == len(good) and j["pid"] == m.pid
    text = log.read_text()
    # --debug keeps the fast lane: it answers the open in C and traces it; Python traces
    # the read it assembles
    ino = os.stat(m.mnt / "q3" / "c0" / "im00.jpg").st_ino
    assert f"pcrfs lane: open ino={ino} -> answered" in text
    assert "DEBUG pcrfs.fs: read q3/c0/im00.jpg off=0" in text
    errors = [x for x in text.splitlines() if " ERROR " in x and "EIO" in x]
    assert len(errors) == 1, errors          # once per file, however often it is retried
    assert f"EIO q1/c1/im01.jpg (record {rec})" in errors[0] and "checksum mismatch" in errors[0]
    bad = run_pcrfs("status", tmp_path, check=False)
    assert bad.returncode == 2 and "not a pcrfs mount" in bad.stderr



def test_a_descriptor_mounted_by_another_process_is_served(crops_ds, tmp_path):
    """`pcrfs mount DST /dev/fd/N` (issue 41, the CSI pattern): a privileged helper, here
    the test, opens /dev/fuse and calls mount(2) with fd=N; pcrfs only serves N, the fast
    lane included.  It unmounts nothing: the helper does, after the daemon has gone."""
    import ctypes
    import time

    import pcrfs
    libc = ctypes.CDLL(None, use_errno=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"pcrfs", str(mnt).encode(), b"fuse.pcrfs", 2 | 4, opts) != 0:   # NOSUID|NODEV
        pytest.fail(f"mount(2): {os.strerror(ctypes.get_errno())}")
    pid = None
    try:
        r = subprocess.run([PCRFS, "mount", str(crops_ds), f"/dev/fd/{fd}"], pass_fds=(fd,),
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        os.close(fd)                 # the daemon holds the connection alone now
        fd = None
        stats = json.loads((mnt / ".pcrfs" / "stats.json").read_text())
        pid = stats["pid"]
        assert stats["fast_lane"]["running"] is True
        ds = pcrfs.open_dataset(str(crops_ds))
        cls = sorted(os.listdir(mnt / "q5"))[0]
        names = sorted(os.listdir(mnt / "q5" / cls))[:10]
        assert names
        for n in names:
            rel = f"{cls}/{n}".encode()
            assert (mnt / "q5" / cls / n).read_bytes() == ds.read(rel, "q5")
        lane = json.loads((mnt / ".pcrfs" / "stats.json").read_text())["fast_lane"]
        # answered in C on that descriptor: the names and the cold reads
        assert lane["cold"]["q5"]["files"] >= len(names) and lane["cold_lookup"] >= len(names)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}"):
            assert time.monotonic() < deadline, "the daemon did not exit on SIGTERM"
            time.sleep(0.05)
        pid = None
        # the daemon did not unmount what it did not mount
        assert str(mnt) in Path("/proc/mounts").read_text()
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        if fd is not None:
            os.close(fd)
        assert libc.umount2(str(mnt).encode(), 2) == 0     # MNT_DETACH, as a helper would
    # descriptors that cannot be served are refused, naming the problem
    r = run_pcrfs("mount", crops_ds, "/dev/fd/987", check=False)
    assert r.returncode == 2 and "no such open descriptor" in r.stderr, r.stderr
    with open(tmp_path / "plain", "w") as f:
        r = subprocess.run([PCRFS, "mount", str(crops_ds), f"/dev/fd/{f.fileno()}"],
                           pass_fds=(f.fileno(),), capture_output=True, text=True)
    assert r.returncode == 2 and "not a /dev/fuse descriptor" in r.stderr, r.stderr
