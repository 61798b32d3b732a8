"""Every kernel from 4.18 (issue 55): the FUSE_INIT requests of the kernels in
docs/SEMANTICS.md's table (tests/data/fuse_init/; this VM's 6.18 recorded, the older ones
reconstructed from their releases' sources, as each file says) go through the supervisor's
parser, the first daemon's answer to the kernel, and a later daemon's resume after a
SIGKILL.  The kernel underneath is this one; what the INIT decides (its length, whether
requests in flight are resent) is the old kernel's."""
import os
import re
import signal
import struct
from pathlib import Path

import pytest

import pcrfs
from pcrfs.fs.supervisor import can_resend, protocol_of

from conftest import wait_until

INITS = sorted(Path(__file__).parent.joinpath("data", "fuse_init").glob("linux-*.hex"),
               key=lambda p: tuple(int(x) for x in p.stem[6:].split(".")))


def load(path: Path) -> bytes:
    return bytes.fromhex("".join(ln.split("#", 1)[0] for ln in path.read_text().splitlines()))


def minor_of(init: bytes) -> int:
    return struct.unpack_from("<I", init, 44)[0]


def test_the_table_covers_4_18_to_this_kernel():
    assert [p.stem for p in INITS] == ["linux-4.18", "linux-5.10", "linux-5.15", "linux-6.1",
                                       "linux-6.8", "linux-6.9", "linux-6.18"]
    table = Path(__file__).parent.parent.joinpath("docs", "SEMANTICS.md").read_text()
    for p in INITS:
        init = load(p)
        assert len(init) == struct.unpack_from("<I", init)[0] == (56 if minor_of(init) < 36
                                                                   else 104)
        assert re.search(rf"^\| {p.stem[6:]} \| 7\.{minor_of(init)} \|", table, re.M), \
            f"docs/SEMANTICS.md's kernel table has no row for {p.stem}"


@pytest.mark.parametrize("path", INITS, ids=lambda p: p.stem)
def test_parser_reads_each_kernels_init_by_its_length(path, monkeypatch):
    monkeypatch.delenv("PCRFS_TEST_NO_RESEND", raising=False)
    init = load(path)
    assert protocol_of(init) == f"7.{minor_of(init)}"
    assert can_resend(init) is (minor_of(init) >= 40)     # FUSE_HAS_RESEND: Linux 6.9
    for cut in range(len(init)):                          # truncated: never "resend"
        if cut < 60:
            assert can_resend(init[:cut]) is False


@pytest.mark.parametrize("path", INITS, ids=lambda p: p.stem)
def test_a_supervised_mount_serves_and_survives_a_kill_on_each_kernels_init(
        path, crops_ds, mount, monkeypatch):
    monkeypatch.delenv("PCRFS_TEST_NO_RESEND", raising=False)
    monkeypatch.setenv("PCRFS_TEST_INIT", str(path))
    init = load(path)
    m = mount(crops_ds, "-o", "supervise")
    sup = m.stats()["supervisor"]
    assert sup["fuse_protocol"] == f"7.{minor_of(init)}"
    assert sup["resend"] is (minor_of(init) >= 40)
    ds = pcrfs.open_dataset(str(crops_ds))
    files = sorted(str(p.relative_to(m.mnt / "q5")) for p in (m.mnt / "q5").rglob("*.*"))[:12]
    for view in ("q5", "q10"):
        for rel in files:
            assert (m.mnt / view / rel).read_bytes() == ds.read(rel.encode(), view)
    old = m.pid
    os.kill(old, signal.SIGKILL)

    def successor():
        try:
            return (p := m.stats()["pid"]) != old and p
        except ConnectionAbortedError:      # in flight at the kill, without resend: once
            return None
    m.pid = wait_until(successor, 60, "the next daemon")
    for rel in files:                      # a later daemon: resumed, no new FUSE_INIT
        assert (m.mnt / "q10" / rel).read_bytes() == ds.read(rel.encode(), "q10")
    assert m.stats()["restarts"] == 1
    ds.close()
