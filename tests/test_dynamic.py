"""MNT/dynamic through the kernel: switching fidelity without remounting, sizes the kernel
never serves stale, open files that keep their fidelity, who may switch, and a real
DataLoader reading across a switch."""
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile

import pytest

import pcrfs.control as control
from pcrfs.dataset import open_dataset

from conftest import run_pcrfs


def _some_files(ds, n):
    out = []
    for cls, _ in ds.listdir(b""):
        for name, d in ds.listdir(cls):
            if not d:
                out.append(os.fsdecode(cls + b"/" + name))
    return out[:: max(1, len(out) // n)][:n]


def test_switch_without_remount(crops_ds, mount):
    ds = open_dataset(str(crops_ds))
    m = mount(crops_ds)
    dyn, ctl = m.mnt / "dynamic", m.mnt / ".pcrfs" / "control" / "dynamic_fidelity"
    assert "dynamic" in os.listdir(m.mnt) and dyn.is_dir()
    assert ctl.read_text() == f"q{ds.groups}\n" and control.get_fidelity(m.mnt) == ds.groups
    assert stat.S_IMODE(ctl.stat().st_mode) == 0o644
    files = _some_files(ds, 12)
    # the kernel learns every size (readdirplus fills its attribute cache, 24 h timeout)
    for cls in {f.split("/")[0] for f in files}:
        os.listdir(dyn / cls)
    for f in files:
        assert (dyn / f).stat().st_size == ds.file_size(f, ds.views[-1])
        assert (dyn / f).read_bytes() == ds.read(f, ds.views[-1])
    for k in (2, 5, 1, ds.groups, 3):
        assert control.set_fidelity(m.mnt, k) == k
        for f in files:  # no sleep: the switch returns only after invalidation
            want = ds.read(f, f"q{k}")
            assert (dyn / f).stat().st_size == len(want), (k, f)
            assert (dyn / f).read_bytes() == want, (k, f)
            assert os.getxattr(dyn / f, "user.pcrfs.view") == f"q{k}".encode()
    # a file the kernel only knows from the listing, stat'ed for the first time
    fresh = [f for f in _some_files(ds, 40) if f not in files][-1]
    assert (dyn / fresh).stat().st_size == ds.file_size(fresh, "q3")
    # the shell and the CLI
    subprocess.run(["sh", "-c", f"echo q7 > '{ctl}'"], check=True)
    assert run_pcrfs("set-fidelity", m.mnt).stdout.strip() == "q7"
    out = run_pcrfs("set-fidelity", m.mnt, "4").stdout
    assert out.strip().endswith("q7 -> q4") and ctl.read_text() == "q4\n"
    s = m.stats()
    assert s["dynamic_fidelity"] == "q4" and s["fidelity_switches"] == 7
    assert s["served_bytes"].get("q1", 0) > 0 and "dynamic" not in s["served_bytes"]


@pytest.mark.parametrize("value", ["0", "q0", f"{11}", "q11", "qq5", "five", "", "5 6", "q-1",
                                   "1" * 70, "\xff"])
def test_invalid_values_are_einval(crops_ds, mount, value, tmp_path):
    m = mount(crops_ds, "--fidelity", "q6", mnt=tmp_path / "m")
    ctl = m.mnt / ".pcrfs" / "control" / "dynamic_fidelity"
    with pytest.raises(OSError) as ei:
        with open(ctl, "wb") as f:
            f.write(value.encode("latin-1") + b"\n")
    assert ei.value.errno == errno.EINVAL
    assert control.get_fidelity(m.mnt) == 6
    with pytest.raises(ValueError):
        control.set_fidelity(m.mnt, value or "x")
    bad = run_pcrfs("set-fidelity", m.mnt, value or "x", check=False)
    assert bad.returncode == 2 and "fidelity" in bad.stderr
    assert control.get_fidelity(m.mnt) == 6


def test_open_file_keeps_its_fidelity(crops_ds, mount):
    ds = open_dataset(str(crops_ds))
    m = mount(crops_ds)
    f = _some_files(ds, 1)[0]
    full, low = ds.read(f, ds.views[-1]), ds.read(f, "q1")
    with open(m.mnt / "dynamic" / f, "rb", buffering=0) as a:
        head = a.read(100)
        control.set_fidelity(m.mnt, 1)
        with open(m.mnt / "dynamic" / f, "rb") as b:   # opened after: the new fidelity
            assert b.read() == low
        assert os.fstat(a.fileno()).st_size == len(low)  # stat follows the switch ...
        rest = a.read()                                 # ... the open file does not
    assert head + rest == full
    # an open file does not mix after a second switch either
    with open(m.mnt / "dynamic" / f, "rb", buffering=0) as a:
        part = a.read(50)
        control.set_fidelity(m.mnt, ds.groups)
        assert part + a.read() == low


def test_only_the_mounting_user_may_switch(crops_ds, mount):
    base = tempfile.mkdtemp(prefix="pcrfs-dyn-", dir="/tmp")
    os.chmod(base, 0o755)                               # reachable by another uid
    m = mount(crops_ds, "-o", "allow_other", "--fidelity", "5", mnt=os.path.join(base, "mnt"))
    ctl = m.mnt / ".pcrfs" / "control" / "dynamic_fidelity"
    f = m.mnt / "dynamic" / _some_files(open_dataset(str(crops_ds)), 1)[0]
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    r = subprocess.run([*as_nobody, f"import sys; sys.stdout.write(open({str(ctl)!r}).read()); "
                        f"print(len(open({str(f)!r}, 'rb').read()))"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr       # others may read (allow_other) ...
    assert r.stdout.split() == ["q5", str(f.stat().st_size)]
    r = subprocess.run([*as_nobody, f"open({str(ctl)!r}, 'w').write('2')"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "PermissionError" in r.stderr   # ... but not switch
    assert control.get_fidelity(m.mnt) == 5
    control.set_fidelity(m.mnt, 2)                            # root may
    assert control.get_fidelity(m.mnt) == 2
    os.rmdir(base) if not os.listdir(base) else None


def test_explicit_ro_mount_keeps_fidelity_fixed(crops_ds, mount):
    m = mount(crops_ds, "-o", "ro")
    with pytest.raises(Exception, match="-o ro"):
        control.set_fidelity(m.mnt, 3)
    with pytest.raises(Exception, match="not a pcrfs mount"):
        control.set_fidelity(m.mnt / "q1", 3)


def test_dataloader_reads_across_a_switch(crops_ds, mount):
    torch = pytest.importorskip("torch")
    from torchvision.datasets import ImageFolder
    ds = open_dataset(str(crops_ds))
    m = mount(crops_ds)

    def raw(path):
        with open(path, "rb") as fh:
            return fh.read()

    folder = ImageFolder(str(m.mnt / "dynamic"), loader=raw)
    assert len(folder) == ds.manifest["images"]
    assert folder.classes == sorted(json.loads((m.mnt / ".pcrfs/manifest.json").read_text())["classes"])
    seen = {}
    for workers in (0, 2):
        control.set_fidelity(m.mnt, ds.groups)
        dl = torch.utils.data.DataLoader(folder, batch_size=8, num_workers=workers,
                                         collate_fn=lambda b: b)
        switched_at = None
        for i, batch in enumerate(dl):
            if i == 10:
                control.set_fidelity(m.mnt, 2)
                switched_at = i
            for j, (data, _label) in enumerate(batch):
                idx = i * 8 + j
                rel = os.path.relpath(folder.samples[idx][0], m.mnt / "dynamic")
                fid = [k for k in (2, ds.groups) if data == ds.read(rel, f"q{k}")]
                assert fid, f"{rel}: bytes of neither q2 nor q{ds.groups}"   # never a mix
                seen[(workers, idx)] = fid[0]
                if workers == 0:  # no prefetching: the switch point is exact
                    assert fid[0] == (ds.groups if switched_at is None or i <= switched_at else 2)
        assert {seen[(workers, i)] for i in range(len(folder))} == {2, ds.groups}
