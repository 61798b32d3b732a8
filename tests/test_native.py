"""The C helper on valid, random and hostile input: it must return errors, never crash,
never read out of bounds, and transcode losslessly."""
import io
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from pcrfs import native

from edgecases import photo_like, save

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode(b: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(b)) as im:
        return np.array(im)


@st.composite
def jpegs(draw):
    w = draw(st.integers(1, 80))
    h = draw(st.integers(1, 80))
    mode = draw(st.sampled_from(["RGB", "L", "CMYK"]))
    img = Image.fromarray(photo_like(w, h, draw(st.integers(0, 5)))).convert(mode)
    kw = {"quality": draw(st.integers(5, 100))}
    if mode == "RGB":
        kw["subsampling"] = draw(st.sampled_from([0, 1, 2]))
    kw["progressive"] = draw(st.booleans())
    return save(img, **kw)


@FAST
@given(jpegs())
def test_transcode_is_lossless_and_splits_into_valid_prefixes(src):
    t = native.transcode(src)
    assert np.array_equal(decode(src), decode(t.data))
    ends = native.split_scans(t.data)
    assert ends == sorted(ends) and ends[-1] <= len(t.data)
    assert len(ends) == {1: 6, 3: 10, 4: 18}[t.components]
    assert t.data[ends[-1]:] == b"\xff\xd9"
    for k in (1, len(ends) // 2, len(ends)):
        decode(t.data[: ends[k - 1]] + native.EOI)  # every prefix is a decodable JPEG


@FAST
@given(st.binary(max_size=2000))
def test_split_random_bytes_never_crashes(data):
    try:
        ends = native.split_scans(data)
    except native.NativeError as e:
        assert str(e), "a refusal names its reason"
        return
    assert all(0 < e <= len(data) for e in ends) and ends == sorted(ends)


@FAST
@given(st.data())
def test_split_and_transcode_survive_mutated_jpegs(data):
    src = bytearray(native.transcode(save(Image.fromarray(photo_like(40, 30)))).data)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(src) - 1))
        src[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(src)))
    mutated = bytes(src[:cut])
    # each call either refuses with a reason or returns something sound: scan ends inside
    # the input, or a transcode that is itself a JPEG whose scans split
    try:
        ends = native.split_scans(mutated)
        assert ends == sorted(ends) and all(0 < e <= len(mutated) for e in ends)
    except native.NativeError as e:
        assert str(e)
    try:
        t = native.transcode(mutated)
    except native.NativeError as e:
        assert str(e)
    else:
        assert t.data[:2] == b"\xff\xd8" and native.split_scans(t.data)


def test_split_rules_stuffing_restart_and_tables():
    # Hand-built stream: SOI, DHT, SOS + data with FF00 and RST, DHT, SOS + data, EOI + junk.
    sos = b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00"
    dht = b"\xff\xc4\x00\x04\x00\x00"
    seg1 = b"\xff\xd8" + dht + sos + b"\x12\xff\x00\x34\xff\xd3\x56"
    seg2 = dht + sos + b"\x78\x9a"
    data = seg1 + seg2 + b"\xff\xd9" + b"trailing camera junk\xff\xda"
    assert native.split_scans(data) == [len(seg1), len(seg1) + len(seg2)]
    with pytest.raises(native.NativeError, match="truncated"):
        native.split_scans(seg1 + seg2[:-1])        # no EOI: the last scan never ends
    with pytest.raises(native.NativeError, match="no scan"):
        native.split_scans(b"\xff\xd8" + dht + b"\xff\xd9")
    with pytest.raises(native.NativeError, match="not a JPEG"):
        native.split_scans(b"GIF89a....")
    with pytest.raises(native.NativeError, match="truncated"):
        native.split_scans(b"\xff\xd8\xff\xc4\x00\x40\x00")   # length runs past the end


@FAST
@given(st.binary(min_size=0, max_size=300),
       st.lists(st.tuples(st.integers(0, 400), st.integers(0, 400)), max_size=6))
def test_splice_buf_matches_slicing_or_errors(src, segs):
    fits = all(o + n <= len(src) for o, n in segs)
    if fits:
        assert native.splice_buf(src, segs) == b"".join(src[o:o + n] for o, n in segs) + native.EOI
    else:
        with pytest.raises(native.NativeError, match="outside"):
            native.splice_buf(src, segs)


@FAST
@given(st.binary(min_size=1, max_size=300),
       st.lists(st.tuples(st.integers(0, 400), st.integers(0, 400)), max_size=6))
def test_splice_fd_matches_slicing_or_short_read(src, segs):
    with tempfile.TemporaryFile() as f:
        f.write(src)
        f.flush()
        # A zero-length segment reads nothing, so pread cannot notice it lies past EOF.
        if all(n == 0 or o + n <= len(src) for o, n in segs):
            got = native.splice_fd(f.fileno(), segs)
            assert bytes(got) == b"".join(src[o:o + n] for o, n in segs) + native.EOI
        else:
            with pytest.raises(native.NativeError, match="short read"):
                native.splice_fd(f.fileno(), segs)


def test_splice_rejects_bad_arguments():
    with pytest.raises(native.NativeError):
        native.splice_fd(-1, [(0, 1)])
    with pytest.raises(native.NativeError):
        native.splice_buf(b"abc", [(-1, 2)])
    with pytest.raises(native.NativeError, match="read error"):
        r, w = os.pipe()
        try:
            native.splice_fd(r, [(0, 1)])  # pread on a pipe: ESPIPE
        finally:
            os.close(r), os.close(w)


def test_transcode_marker_policy():
    from edgecases import exif_with_thumbnail
    img = Image.fromarray(photo_like(64, 48))
    icc = b"\x00" * 300  # Pillow stores any bytes as APP2 ICC_PROFILE
    src = save(img, quality=90, exif=exif_with_thumbnail(save(img, quality=50)),
               icc_profile=icc)
    src = src[:2] + b"\xff\xfe\x00\x07hello" + src[2:]  # a COM marker
    default = native.transcode(src).data
    everything = native.transcode(src, "all").data
    nothing = native.transcode(src, "none").data
    assert b"Exif" not in default and b"ICC_PROFILE" in default and b"JFIF" in default
    assert b"hello" not in default
    assert b"Exif" in everything and b"hello" in everything and b"ICC_PROFILE" in everything
    assert b"ICC_PROFILE" not in nothing and b"Exif" not in nothing
    assert default.count(b"JFIF\x00") == 1  # no duplicated APP0
    for d in (default, everything, nothing):
        assert np.array_equal(decode(src), decode(d))


def test_transcode_custom_scan_script():
    src = save(Image.fromarray(photo_like(64, 48)), quality=90)
    script = [[3, 0, 1, 2, 0, 0, 0, 0x01], [1, 0, 0, 0, 0, 1, 63, 0x01],
              [1, 1, 0, 0, 0, 1, 63, 0], [1, 2, 0, 0, 0, 1, 63, 0],
              [3, 0, 1, 2, 0, 0, 0, 0x10], [1, 0, 0, 0, 0, 1, 63, 0x10]]
    t = native.transcode(src, scan_script=script, script_components=3)
    assert len(native.split_scans(t.data)) == 6
    assert np.array_equal(decode(src), decode(t.data))
    # An invalid progression comes back as an error code, not an exit().
    with pytest.raises(native.NativeError, match="libjpeg"):
        native.transcode(src, scan_script=[[1, 0, 0, 0, 0, 5, 2, 0]], script_components=3)
    with pytest.raises(native.NativeError, match="invalid argument"):
        native.transcode(src, scan_script=[[1, 7, 0, 0, 0, 0, 0, 0]], script_components=3)


def test_c_calls_release_the_gil():
    """A long transcode in one thread must not stop Python code in another: a counter
    thread keeps at least a fifth of the pace it has beside an idle main thread (with the
    GIL held it would stall for the whole call)."""
    from conftest import concurrent_progress
    big = save(Image.fromarray(photo_like(3000, 2000)), quality=95)
    ratio = concurrent_progress(lambda: native.transcode(big))
    assert ratio > 0.2, ratio
