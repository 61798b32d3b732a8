"""The build's output does not depend on how fast it is made: every view's bytes (q1..qG
and l3, with its exact sizes) equal those of a build made before the C l3 path existed,
and that C path equals the Pillow decode it replaced, image by image."""
import json
import pathlib

import pytest
from golden import view_digests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import pcrfs.l3 as l3
from pcrfs import native
from pcrfs.builder.prepare import PrepareOptions, prepare
from pcrfs.views.l3 import l3_bytes, pillow_l3_bytes

from conftest import concurrent_progress, run_pcrfs
from edgecases import photo_like, save

DATA = pathlib.Path(__file__).parent / "data"
GOLDEN_SRC = DATA / "golden_src"


def test_every_view_equals_the_build_before_the_change(tmp_path, mount):
    golden = json.loads((DATA / "golden_views.json").read_text())
    ds = tmp_path / "ds"
    run_pcrfs("build", GOLDEN_SRC, ds, "-q", *golden["build_args"])
    m = mount(ds)
    got = view_digests(str(m.mnt))
    want = golden["files"]
    assert sorted(got) == sorted(want)
    differ = [k for k in want if got[k] != want[k]]
    assert not differ, f"{len(differ)} files changed, e.g. {differ[:5]}"
    assert any(k.startswith("l3/") for k in want) and any(k.startswith("q1/") for k in want)


def test_default_restart_intervals_keep_every_pixel(tmp_path, mount):
    """The default build (a restart marker per MCU row) differs from the golden bytes only
    in its q views' markers: its l3 files, which are the pixels of qG, are the golden's."""
    golden = json.loads((DATA / "golden_views.json").read_text())["files"]
    ds = tmp_path / "ds"
    run_pcrfs("build", GOLDEN_SRC, ds, "-q", "--images-per-record", "8")
    got = view_digests(str(mount(ds).mnt))
    assert sorted(got) == sorted(golden)
    l3_files = [k for k in golden if k.startswith("l3/")]
    assert l3_files and all(got[k] == golden[k] for k in l3_files)
    q = [k for k in golden if k.startswith("q") and golden[k][0] > 2000]
    assert q and all(got[k][1] != golden[k][1] for k in q)   # the markers are there


def _progressive(jpeg: bytes) -> bytes:
    t = native.transcode(jpeg)
    return t.data[: native.split_scans(t.data)[-1]] + native.EOI


@pytest.mark.parametrize("path", sorted(p.relative_to(GOLDEN_SRC).as_posix()
                                        for p in GOLDEN_SRC.rglob("*.jpg")))
def test_c_path_equals_pillow_on_source_and_progressive(path):
    raw = (GOLDEN_SRC / path).read_bytes()
    for data in (raw, _progressive(raw)):
        c = l3.from_jpeg(data)
        if path in ("jpeg/cmyk.jpg",) or (path == "jpeg/extraneous_bytes.jpg" and data is raw):
            assert c is None        # left to Pillow: its CMYK conversion, libjpeg's warning
        else:
            assert c is not None and c == pillow_l3_bytes(data)
        assert l3_bytes(data) == pillow_l3_bytes(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=st.integers(1, 300), h=st.integers(1, 300), quality=st.integers(5, 100),
       subsampling=st.sampled_from([0, 1, 2]), gray=st.booleans(),
       seed=st.integers(0, 50))
def test_c_path_equals_pillow_on_any_jpeg(w, h, quality, subsampling, gray, seed):
    im = Image.fromarray(photo_like(w, h, seed))
    jpeg = save(im.convert("L") if gray else im, quality=quality, subsampling=subsampling)
    for data in (jpeg, _progressive(jpeg)):
        assert l3.from_jpeg(data) == pillow_l3_bytes(data)


def test_prepare_gives_the_sizes_and_checksums_of_the_pillow_path():
    from pcrfs.format.checksum import block_checksum
    opts = PrepareOptions(l3=True)
    for p in sorted(GOLDEN_SRC.rglob("*")):
        if not p.is_file():
            continue
        res = prepare(str(GOLDEN_SRC).encode(), p.relative_to(GOLDEN_SRC).as_posix().encode(), 0, opts)
        assert res.ok, (p, res.reason)
        want = pillow_l3_bytes(res.data + native.EOI)
        assert (res.l3_size, res.l3_xxh) == (len(want), block_checksum(want)), p


def test_damaged_jpegs_fail_or_fall_back_never_crash():
    jpeg = save(Image.fromarray(photo_like(200, 150, 1)), quality=90)
    assert l3.from_jpeg(jpeg[: len(jpeg) // 2]) is None        # premature end: a warning
    with pytest.raises(native.NativeError):
        l3.from_jpeg(jpeg[:300])                                # no scan at all: fatal
    with pytest.raises(native.NativeError):
        l3.from_jpeg(b"not a jpeg")
    with pytest.raises(native.NativeError):
        l3.from_jpeg(b"")


def test_c_path_releases_the_gil():
    jpeg = save(Image.fromarray(photo_like(2000, 1500, 0)), quality=90)

    def encode3():
        for _ in range(3):
            l3.from_jpeg(jpeg)
    assert concurrent_progress(encode3) > 0.2
