"""The L3 codec: bit-exact with the reference decoder's rules, lossless on any shape,
hostile input rejected, Pillow plugin and the torch decoder agreeing with the C one."""
import io
import pathlib
import struct

import l3_reference
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

import pcrfs.l3 as l3
from pcrfs.torch.l3 import decode_batch

from edgecases import photo_like

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REGRESSIONS = pathlib.Path(__file__).parent / "fuzz_regressions" / "l3"


def test_golden_bytes_by_hand():
    """A 2x2 gray image worked out from the spec by hand (docs/L3.md has the derivation)."""
    img = np.array([[10, 20], [30, 40]], np.uint8)
    data = l3.encode(img, 64)
    patch = bytes([0xA4, 0x00, 0x0A, 0x44, 0x01, 0x0A])
    want = b"LLL." + struct.pack("<IIB", 2, 2, 64) + struct.pack("<HHH", 6, 6, 6) + patch * 3
    assert data == want
    assert (l3.decode(want)[:, :, 1] == img).all()


def test_negative_base_and_full_range_row():
    row = np.array([[200, 0, 255, 1]], np.uint8)
    data = l3.encode(row, 32)
    # residuals = pixels as int8: -56, 0, -1, 1 -> base -56 (0xC8), span 57 -> nbit 6
    assert data[19] == 6 | (0xC8 & 0xF) << 4 and data[20] & 0xF == 0xC8 >> 4
    full = np.array([[0, 127, 128, 255]], np.uint8)  # int8 residuals -128..127: nbit 8
    assert l3.encode(full, 32)[19] & 0xF == 8
    for a in (row, full):
        assert (l3.decode(l3.encode(a, 32))[:, :, 0] == a).all()


def test_multiple_of_64_matches_reference_rules():
    img = photo_like(192, 128, 3)
    data = l3.encode(img, 64)
    assert data[12] == 64
    assert (l3_reference.decode(data) == img).all()
    assert (l3.decode(data) == img).all()


@FAST
@given(arrays(np.uint8, st.tuples(st.integers(1, 70), st.integers(1, 70), st.just(3))),
       st.sampled_from([1, 2, 7, 16, 32, 64, 128]))
def test_roundtrip_any_shape(img, patch):
    data = l3.encode(img, patch)
    assert (l3.decode(data) == img).all()
    assert (l3.decode(data, "CHW") == img.transpose(2, 0, 1)).all()


@settings(max_examples=25, deadline=None)
@given(arrays(np.uint8, st.tuples(st.integers(1, 20), st.integers(1, 20), st.just(3))),
       st.sampled_from([3, 8, 64]))
def test_encoder_agrees_with_independent_reference_decoder(img, patch):
    assert (l3_reference.decode(l3.encode(img, patch)) == img).all()


@FAST
@given(st.integers(1, 300), st.integers(1, 40), st.integers(0, 255), st.booleans())
def test_constant_and_full_range_rows(w, h, value, full):
    if full:  # alternating 0/255 rows stress nbit 8
        img = np.tile(np.array([0, 255, 128, 127], np.uint8), (h, w // 4 + 1))[:, :w]
    else:     # constant: nbit 0, the 2-byte row
        img = np.full((h, w), value, np.uint8)
    data = l3.encode(img)
    assert (l3.decode(data) == img[:, :, None]).all()
    if not full:
        n = l3.choose_patch(w, h)
        patches = -(-w // n) * -(-h // n)
        rows = h * -(-w // n)
        assert len(data) == 13 + 6 * patches + 3 * 2 * rows


def test_patch_size_choice_and_limits():
    assert [l3.choose_patch(*s) for s in [(640, 480), (1280, 720), (1920, 1080), (3840, 2160)]] \
        == [32, 64, 64, 128]
    img = np.zeros((4, 4, 3), np.uint8)
    for bad in (0, 129, 256):
        with pytest.raises(ValueError, match="patch size"):
            l3.encode(img, bad)
    with pytest.raises(ValueError):
        l3.encode(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(TypeError):
        l3.encode(np.zeros((4, 4, 3), np.float32))
    # N = 128 worst case still fits the uint16 size table
    worst = np.tile(np.array([0, 255], np.uint8), (128, 64))
    assert (l3.decode(l3.encode(worst, 128))[:, :, 0] == worst).all()


def test_grayscale_is_three_equal_planes():
    g = photo_like(50, 40, 1)[:, :, 0]
    d = l3.decode(l3.encode(g))
    assert (d[:, :, 0] == g).all() and (d[:, :, 1] == g).all() and (d[:, :, 2] == g).all()


def _corruptions(data: bytes):
    yield data[:-1], l3.lib.PCR_E_TRUNCATED
    yield data + b"\0", l3.lib.PCR_E_TRAILING
    yield b"LLM." + data[4:], l3.lib.PCR_E_NOT_L3
    yield data[:12] + b"\x00" + data[13:], l3.lib.PCR_E_BAD_HEADER      # N = 0
    yield data[:12] + b"\x81" + data[13:], l3.lib.PCR_E_BAD_HEADER      # N = 129
    yield data[:4] + b"\0\0\0\0" + data[8:], l3.lib.PCR_E_BAD_HEADER    # width 0
    yield data[:8] + b"\xff\xff\xff\x7f" + data[12:], l3.lib.PCR_E_TRUNCATED  # huge height
    first_row = 13 + 6 * 4
    yield data[:first_row] + bytes([data[first_row] | 0x0F]) + data[first_row + 1:], \
        l3.lib.PCR_E_CORRUPT                                              # nbit 15
    yield data[:first_row] + bytes([(data[first_row] & 0xF0) | 0]) + data[first_row + 1:], \
        l3.lib.PCR_E_CORRUPT                                              # rows no longer add up


def test_hostile_inputs_give_error_codes():
    data = l3.encode(photo_like(40, 40, 2), 32)  # 2x2 patches
    for bad, code in _corruptions(data):
        with pytest.raises(l3.L3Error) as e:
            l3.decode(bad)
        assert e.value.code == code, (e.value, code)
        with pytest.raises(l3.L3Error):
            decode_batch([bad])


@FAST
@given(st.binary(max_size=400))
def test_random_bytes_never_crash(blob):
    for data in (blob, b"LLL." + blob):
        try:
            out = l3.decode(data)
        except l3.L3Error:
            continue
        assert out.shape[2] == 3


@FAST
@given(st.data())
def test_mutated_files_decode_or_fail_cleanly_in_both_decoders(data):
    img = photo_like(data.draw(st.integers(1, 70)), data.draw(st.integers(1, 70)), 1)
    blob = bytearray(l3.encode(img, data.draw(st.sampled_from([8, 32]))))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    assert_batch_agrees_with_c(bytes(blob))


def assert_batch_agrees_with_c(blob: bytes, **kw):
    """decode_batch fails where the C decoder fails, and gives its pixels where it does not."""
    try:
        want = l3.decode(blob)
    except l3.L3Error:
        with pytest.raises(l3.L3Error):
            decode_batch([blob], **kw)
        return
    got = decode_batch([blob], layout="NHWC", **kw)
    assert (got[0].numpy() == want).all()


def test_fuzzer_regressions():
    """Inputs the libFuzzer run (make fuzz) found interesting enough to keep."""
    files = sorted(REGRESSIONS.iterdir())
    assert files, "fuzz_regressions/l3 must hold the seed and crash corpus"
    for f in files:
        data = f.read_bytes()
        try:
            l3.decode(data)
        except l3.L3Error:
            pass


def test_pillow_plugin(tmp_path):
    img = photo_like(75, 33, 4)
    p = tmp_path / "x.l3"
    p.write_bytes(l3.encode(img))
    with Image.open(p) as im:
        assert im.format == "L3" and im.mode == "RGB" and im.size == (75, 33)
        assert (np.asarray(im) == img).all()
    with Image.open(io.BytesIO(p.read_bytes())) as im:  # by magic, not by name
        assert (np.asarray(im.convert("L")) == np.asarray(Image.fromarray(img).convert("L"))).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 90), st.integers(1, 90), st.sampled_from([None, 4, 32, 64])),
                min_size=1, max_size=4), st.integers(0, 9))
def test_torch_batch_equals_c_decoder(shapes, seed):
    imgs = [photo_like(w, h, seed) for w, h, _ in shapes]
    blobs = [l3.encode(im, n) for im, (_, _, n) in zip(imgs, shapes, strict=True)]
    nchw = decode_batch(blobs, "cpu")
    nhwc = decode_batch(blobs, "cpu", layout="NHWC")
    for i, im in enumerate(imgs):
        assert nchw[i].dtype == torch.uint8
        assert (nchw[i].numpy() == l3.decode(blobs[i], "CHW")).all()
        assert (nhwc[i].numpy() == im).all()
    if len({im.shape for im in imgs}) == 1:
        assert isinstance(nchw, torch.Tensor) and nchw.shape == (len(imgs), 3) + imgs[0].shape[:2]


def test_decode_releases_the_gil():
    from conftest import concurrent_progress
    data = l3.encode(photo_like(2000, 1500, 0))

    def decode3():
        for _ in range(3):
            l3.decode(data)
    ratio = concurrent_progress(decode3)
    assert ratio > 0.2, ratio
