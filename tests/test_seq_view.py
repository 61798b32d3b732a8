"""MNT/bK (-o seq=K): q_K re-coded as one sequential scan, through the kernel.  Its pixels
are q_K's coefficients decoded without progressive coding (what jpegtran's lossless
baseline rewrite of the q_K file decodes to), b_G is the source's pixels, sizes are exact
from the first lookup and across remounts, readers (Pillow, ImageFolder, cp, tar) see
whole files, and damage is EIO for its file alone."""
import errno
import io
import os
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import pcrfs
from pcrfs import native

from conftest import run_pcrfs
from edgecases import photo_like
from test_build import image_paths


def _rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def _frame(data: bytes) -> int:
    """The SOF marker's second byte (0xC0 baseline, 0xC1 extended, 0xC2 progressive)."""
    i = 2
    while i + 4 <= len(data):
        marker, n = data[i + 1], int.from_bytes(data[i + 2:i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return marker
        i += 2 + n
    raise AssertionError("no frame header")


def _jpegtran_baseline(data: bytes) -> bytes:
    return subprocess.run(["jpegtran", "-optimize"], input=data, capture_output=True,
                          check=True).stdout


def test_b_views_decode_to_q_coefficients_without_progression(edge_ds, mount):
    ds = pcrfs.open_dataset(str(edge_ds))
    g = ds.groups
    m = mount(edge_ds, "-o", f"seq=1:5:{g}")
    assert {"b1", "b5", f"b{g}"} <= set(os.listdir(m.mnt)) and "b2" not in os.listdir(m.mnt)
    n = 0
    for rel in image_paths(ds):
        for k in (1, 5, g):
            b = m.mnt / f"b{k}" / os.fsdecode(rel)
            size = b.stat().st_size            # the first lookup makes the file
            data = b.read_bytes()
            assert len(data) == size > 0
            assert _frame(data) in (0xC0, 0xC1), rel      # sequential, not progressive
            q = (m.mnt / f"q{k}" / os.fsdecode(rel)).read_bytes()
            assert np.array_equal(_rgb(data), _rgb(_jpegtran_baseline(q))), (k, rel)
            if k == g:
                assert np.array_equal(_rgb(data), _rgb(q)), rel     # complete: q_G's pixels
            n += 1
        assert os.getxattr(m.mnt / "b5" / os.fsdecode(rel), "user.pcrfs.format") == \
            b"jpeg-sequential"
    assert n == 3 * ds.manifest["images"]
    assert m.stats()["transcodes"] == n


def test_sizes_are_exact_and_survive_a_remount(small_src, tmp_path, mount):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    cache = tmp_path / "cache"
    m = mount(dst, "-o", "seq=4", "--cache-dir", cache)
    root = m.mnt / "b4"
    listed = {p.relative_to(root): p.stat().st_size for p in sorted(root.rglob("*.jpg"))}
    assert len(listed) == 24
    for rel, size in listed.items():
        assert len((root / rel).read_bytes()) == size
    made = m.stats()["transcodes"]
    assert made == 24
    m.__exit__(None, None, None)
    m = mount(dst, "-o", "seq=4", "--cache-dir", cache, mnt=tmp_path / "again")
    root = m.mnt / "b4"
    again = {p.relative_to(root): p.stat().st_size for p in sorted(root.rglob("*.jpg"))}
    assert again == listed
    assert m.stats()["transcodes"] == 0           # every file from the disk cache


def test_low_quality_needs_16_bit_quantizers(tmp_path, mount):
    """Quality 15's quantizers pass 255 once shifted: the file is extended sequential
    (SOF1, 16-bit tables), still the same pixels."""
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    Image.fromarray(photo_like(200, 150, 1)).save(src / "low.jpg", quality=15)
    dst = tmp_path / "ds"
    run_pcrfs("build", src.parent, dst, "-q")
    m = mount(dst, "-o", "seq=all")
    data = (m.mnt / "b3" / "c" / "low.jpg").read_bytes()
    assert _frame(data) == 0xC1
    q = (m.mnt / "q3" / "c" / "low.jpg").read_bytes()
    assert np.array_equal(_rgb(data), _rgb(_jpegtran_baseline(q)))


def test_imagefolder_cp_and_tar_read_whole_files(small_src, tmp_path, mount):
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    m = mount(dst, "-o", "seq=5")
    tf = transforms.Compose([transforms.Resize((32, 32)), transforms.PILToTensor()])
    over_b = datasets.ImageFolder(str(m.mnt / "b5"), tf)
    over_q = datasets.ImageFolder(str(m.mnt / "q5"))
    assert over_b.class_to_idx == over_q.class_to_idx
    assert [(os.path.relpath(p, m.mnt / "b5"), c) for p, c in over_b.samples] == \
        [(os.path.relpath(p, m.mnt / "q5"), c) for p, c in over_q.samples]
    seen = [int(y) for _, ys in DataLoader(over_b, batch_size=5, num_workers=2) for y in ys]
    assert sorted(seen) == sorted(c for _, c in over_q.samples)
    # cp and tar of a tree no lookup has made yet: whole files, sizes as stat says
    shutil.rmtree(tmp_path / "copy", ignore_errors=True)
    subprocess.run(["cp", "-r", str(m.mnt / "b5"), str(tmp_path / "copy")], check=True)
    tar = subprocess.run(["tar", "-C", str(m.mnt), "-cf", str(tmp_path / "b5.tar"), "b5"],
                         capture_output=True, text=True)
    assert tar.returncode == 0 and not tar.stderr, tar.stderr
    with tarfile.open(tmp_path / "b5.tar") as t:
        members = {mb.name: mb for mb in t.getmembers() if mb.isfile()}
        assert len(members) == 24
        for name, mb in members.items():
            body = t.extractfile(mb).read()
            assert body == (tmp_path / "copy" / os.path.relpath(name, "b5")).read_bytes()
            assert body == (m.mnt / name).read_bytes() and _frame(body) in (0xC0, 0xC1)


def test_corrupt_byte_gives_eio_for_that_file_only(small_src, tmp_path, mount):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    ds = pcrfs.open_dataset(str(dst))
    victim = b"c1/im04.jpg"
    e = ds.lookup(victim)
    off, ln = ds.plan(victim, "q2").segments[1]
    rec = dst / "records" / f"r{e.record:06d}.pcr"
    raw = bytearray(rec.read_bytes())
    raw[off + ln // 2] ^= 0x01
    rec.write_bytes(raw)
    m = mount(dst, "-o", "seq=2")
    with pytest.raises(OSError) as ei:
        (m.mnt / "b2" / "c1" / "im04.jpg").read_bytes()
    assert ei.value.errno == errno.EIO
    assert m.stats()["checksum_failures"] >= 1
    for p in image_paths(ds):
        if p != victim:
            got = (m.mnt / "b2" / os.fsdecode(p)).read_bytes()
            assert np.array_equal(_rgb(got), _rgb(_jpegtran_baseline(ds.read(p, "q2"))))
    with pytest.raises(OSError) as ei:
        (m.mnt / "b2" / "c1" / "new.jpg").write_bytes(b"x")
    assert ei.value.errno == errno.EROFS


def test_seq_option_refuses_what_it_cannot_serve(small_src, tmp_path):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    (tmp_path / "mnt").mkdir()
    for opt, words in (("seq=11", "no q11 to re-code"), ("seq=x", "not a fidelity")):
        p = run_pcrfs("mount", dst, tmp_path / "mnt", "-o", opt, check=False)
        assert p.returncode != 0 and words in p.stderr and "Traceback" not in p.stderr
        assert not os.path.ismount(tmp_path / "mnt")


_SEED = Image.fromarray(photo_like(64, 48, 2))


def _progressive() -> bytes:
    out = io.BytesIO()
    _SEED.save(out, "JPEG", quality=80, progressive=True)
    return out.getvalue()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_recoding_hostile_bytes_errs_or_gives_a_jpeg(data):
    """Cut, flipped and spliced inputs: NativeError, or a JPEG Pillow decodes."""
    base = bytearray(_progressive())
    cut = data.draw(st.integers(2, len(base)))
    blob = base[:cut]
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    try:
        out = native.sequential(bytes(blob))
    except native.NativeError:
        return
    assert out[:2] == b"\xff\xd8" and _frame(out) in (0xC0, 0xC1)


def test_unlisted_b_views_are_reached_by_name(small_src, tmp_path, mount):
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    m = mount(dst)
    assert not [n for n in os.listdir(m.mnt) if n.startswith("b")]     # none listed
    assert "b3" not in subprocess.run(["du", "-s", "--apparent-size", str(m.mnt)],
                                      capture_output=True, text=True).stdout
    assert m.stats()["transcodes"] == 0        # du made no b file
    f = m.mnt / "b3" / "c0" / "im00.jpg"
    assert _frame(f.read_bytes()) in (0xC0, 0xC1) and f.stat().st_size == len(f.read_bytes())


def test_tune_probes_b_views_and_later_mounts_list_its_choice(small_src, tmp_path, mount):
    import json

    from pcrfs.liquid.rules import store_tuned
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    m = mount(dst)
    r = run_pcrfs("tune", m.mnt, "--workers", 2, "--sample", 12, "--transform", "none")
    assert "probe b10" in r.stdout and "train on " in r.stdout, r.stdout
    stored = json.loads((dst / "liquid.json").read_text())
    bs = [p for p in stored["probes"] if p["coding"] == "b"]
    assert bs and all(p["share"] == 0.0 and p["bytes_per_image"] > 0 for p in bs)
    assert stored["view"] == (f"b{stored['seq']}" if stored["seq"] else "mix")
    assert f"train on {m.mnt / stored['view']}" in r.stdout
    # a raw share is never chosen unsaid: what it stores, and how
    assert ("pcrfs materialize DST raw --fraction" in r.stdout) == (stored["share"] > 0), r.stdout
    # a stored b choice: later mounts list that b view, -o seq overrides it
    store_tuned(str(dst), {**stored, "seq": 4, "view": "b4"})
    again = mount(dst)
    assert [n for n in os.listdir(again.mnt) if n.startswith("b")] == ["b4"]
    other = mount(dst, "-o", "seq=none")
    assert not [n for n in os.listdir(other.mnt) if n.startswith("b")]


def test_tune_says_what_it_writes_and_keeps_within_its_budget(small_src, tmp_path, mount):
    import json
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    m = mount(dst, "--cache-dir", tmp_path / "cache")
    r = run_pcrfs("tune", m.mnt, "--workers", 2, "--sample", 12, "--transform", "none",
                  "--budget", "4k", "--dry-run")
    assert "writes: at most" in r.stdout and "--budget 0 MB" in r.stdout, r.stdout
    assert "raw shares not probed" in r.stdout and "b10 not probed" in r.stdout, r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line[:6].strip() in ("0.0", "1.0")]
    assert rows and {row[0] for row in rows} == {"0.0"} and all(row[1][0] == "q" for row in rows)
    st = m.stats()
    assert st["raw_decodes"] == 0 and st["transcodes"] == 0      # nothing made, nothing written
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    r = run_pcrfs("tune", m.mnt, "--workers", 2, "--sample", 12, "--transform", "none")
    stored = json.loads((dst / "liquid.json").read_text())
    assert stored["writes"]["raw_probed"] and stored["writes"]["budget"] == 1 << 30
    made = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert 0 < made <= stored["writes"]["bound"], (made, stored["writes"])
    bad = run_pcrfs("tune", m.mnt, "--budget", "lots", check=False)
    assert bad.returncode != 0 and "--budget" in bad.stderr and "Traceback" not in bad.stderr


def test_fuzz_regressions_replay():
    """make fuzz's sequential target: its seeds re-code; every input it kept errs or gives
    a JPEG, and a header claiming more pixels than allowed is refused before libjpeg
    allocates for it (the fuzzer's out-of-memory input)."""
    where = os.path.join(os.path.dirname(__file__), "fuzz_regressions", "sequential")
    files = sorted(os.listdir(where))
    assert any(f.startswith("seed-") for f in files) and "oom-header-claims-huge-image" in files
    for f in files:
        data = open(os.path.join(where, f), "rb").read()
        try:
            out = native.sequential(data, 1 << 22)
        except native.NativeError as e:
            assert not f.startswith("seed-"), (f, e)
            if f.startswith("oom-"):
                assert e.code == native.lib.PCR_E_TOO_LARGE
            continue
        assert _frame(out) in (0xC0, 0xC1), f
