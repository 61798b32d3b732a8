"""Replay the fuzzers' kept inputs (tests/fuzz_regressions/<target>/: seeds, the smallest
corpus units, any crash a `make fuzz` found) through the Python bindings, so a fixed crash
stays fixed without clang.  The L3 corpus is replayed in tests/test_l3.py."""
import re
import tempfile
from pathlib import Path

from pcrfs import native

ROOT = Path(__file__).resolve().parents[1] / "fuzz_regressions"
REPO = ROOT.parents[1]
# the fast lane's sources, as `make fuzz` links them (csrc/lane_internal.h)
LANE_SRC = re.search(r"^LANE_SRC := (.*)$", (REPO / "Makefile").read_text(), re.M)[1].split()


def test_the_fuzzers_link_every_lane_source_the_extension_builds():
    """A lane file the fuzz targets left out would be compiled into the shim unfuzzed."""
    built = re.findall(r'"((?:fuse_shim|lane_\w+)\.c)"', (REPO / "csrc" / "build_fuseshim.py").read_text())
    assert sorted(f"csrc/{f}" for f in built) == sorted(LANE_SRC)
    every = {str(p.relative_to(REPO)) for p in (REPO / "csrc").glob("lane_*.c")}
    assert every | {"csrc/fuse_shim.c"} == set(LANE_SRC)


def _inputs(target):
    files = sorted((ROOT / target).glob("*"))
    assert files, f"tests/fuzz_regressions/{target} must hold the kept corpus"
    return files


def test_split_corpus():
    for f in _inputs("split"):
        data = f.read_bytes()
        try:
            ends = native.split_scans(data)
        except native.NativeError:
            continue
        assert all(0 < e <= len(data) for e in ends) and ends == sorted(set(ends)), f.name


def _splice_request(data: bytes):
    """The harness's input format: n_segs, capacity selector, (offset, length) pairs, source."""
    n, p = data[0] % 9, data[2:]
    segs = []
    for _ in range(n):
        a, b = (int.from_bytes(p[i : i + 8].ljust(8, b"\0"), "little") for i in (0, 8))
        segs.append((a if a >> 63 else a % 4096, b if b >> 63 else b % 4096))
        p = p[min(16, len(p)):]
    return segs, p


def test_splice_corpus():
    replayed = 0
    for f in _inputs("splice"):
        data = f.read_bytes()
        if len(data) < 2:
            continue
        segs, src = _splice_request(data)
        if sum(n for _, n in segs) > 1 << 20:
            continue       # huge lengths: only the C harness exercises those (no 2^63 buffers here)
        in_range = all(o + n <= len(src) for o, n in segs)
        try:
            out = native.splice_buf(src, segs)
        except native.NativeError:
            assert not in_range, f.name
        else:
            assert in_range and out == b"".join(src[o : o + n] for o, n in segs) + b"\xff\xd9"
        with tempfile.TemporaryFile() as t:
            t.write(src)
            t.flush()
            try:
                got = native.splice_fd(t.fileno(), segs)
            except native.NativeError:
                pass   # refusing is always allowed; serving wrong or short bytes never is
            else:
                assert all(n == 0 or o + n <= len(src) for o, n in segs), f.name
                assert bytes(got) == b"".join(src[o : o + n] for o, n in segs) + b"\xff\xd9"
        replayed += 1
    assert replayed >= 3



def _replay_with_asan(tmp_path, target: str, sources: list[str], flags: list[str]) -> None:
    """Build a libFuzzer harness with gcc and AddressSanitizer/UBSan around a plain main()
    and run it over the target's kept inputs."""
    import subprocess
    repo = ROOT.parents[1]
    exe = tmp_path / f"{target}_replay"
    subprocess.run(["gcc", "-g", "-O1", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined", "-D_GNU_SOURCE", f"-I{repo / 'csrc'}",
                    *[str(repo / s) for s in sources], str(repo / "csrc/fuzz/replay_main.c"),
                    *flags, "-o", str(exe)], check=True, capture_output=True)
    files = [str(f) for f in _inputs(target)]
    p = subprocess.run([str(exe), *files], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"replayed {len(files)} inputs" in p.stdout


def test_lane_sequence_corpus(tmp_path):
    """The lane_seq harness: whole request handling and the image store."""
    import subprocess
    cflags = subprocess.run(["pkg-config", "--cflags", "fuse3"], capture_output=True,
                            text=True, check=True).stdout.split()
    _replay_with_asan(tmp_path, "lane_seq", ["csrc/fuzz/lane_seq_fuzz.c", *LANE_SRC],
                      cflags + ["-lpthread"])


def test_lane_cold_corpus(tmp_path):
    """The lane_cold harness: cold READs, GETATTRs and LOOKUPs from hostile segment
    tables, records and name tables (a wrong byte answered, damage not handed over, or a
    LOOKUP answered with another name's file, aborts it).  The lookup-tree* inputs answer
    LOOKUPs in the q, raw and mix trees."""
    import subprocess
    cflags = subprocess.run(["pkg-config", "--cflags", "fuse3"], capture_output=True,
                            text=True, check=True).stdout.split()
    _replay_with_asan(tmp_path, "lane_cold", ["csrc/fuzz/lane_cold_fuzz.c", *LANE_SRC],
                      cflags + ["-lpthread"])


def test_jpeg_to_l3_corpus(tmp_path):
    """The build's JPEG-to-L3 path over valid, grayscale, CMYK and truncated JPEGs."""
    _replay_with_asan(tmp_path, "jpeg_l3", ["csrc/fuzz/jpeg_l3_fuzz.c", "csrc/jpeg_pixels.c",
                                            "csrc/l3.c"], ["-ljpeg"])
