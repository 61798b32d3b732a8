"""The Triton L3 kernel (pcrfs.torch.l3_triton) gives the C decoder's pixels and its errors.

CI has no GPU, so the kernel runs here in Triton's interpreter (TRITON_INTERPRET=1, CPU
tensors): the same kernel source, the same masks and clamps, executed lane by lane.  The
compiled kernel is checked on CUDA by `python -m bench.gpu measure` (bench/results/gpu.json):
every corpus image against the C decoder, and damaged rows rejected."""
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_l3 import _corruptions, assert_batch_agrees_with_c

import pcrfs.l3 as l3
from pcrfs.torch import l3 as torch_l3
from pcrfs.torch import l3_triton
from pcrfs.torch.l3 import decode_batch

from edgecases import photo_like

SLOW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])


def _check(blobs, imgs):
    for layout in ("NCHW", "NHWC"):
        got = decode_batch(blobs, "cpu", layout=layout, backend="triton")
        if len({im.shape for im in imgs}) == 1:
            assert isinstance(got, torch.Tensor) and got.shape[0] == len(imgs)
        else:
            assert isinstance(got, list)
        for g, im, b in zip(got, imgs, blobs, strict=True):
            want = l3.decode(b, "CHW" if layout == "NCHW" else "HWC")
            assert g.dtype == torch.uint8 and g.shape == want.shape
            assert (g.numpy() == want).all(), (layout, im.shape)
            assert (l3.decode(b) == im).all()  # and the C decoder is lossless


@pytest.mark.parametrize("shapes", [
    [(40, 30, None)],                                   # one patch, the chosen size
    [(33, 17, 8), (33, 17, 8)],                         # stacked batch, partial patches
    [(40, 37, 32), (5, 30, 4), (1, 1, None), (90, 1, 64)],  # mixed sizes and patch sizes
    [(130, 3, 128), (3, 7, 1), (19, 4, 3)],             # the largest patch, the smallest, odd
])
def test_kernel_equals_the_c_decoder(interpreted, shapes):
    imgs = [photo_like(w, h, i) for i, (w, h, _) in enumerate(shapes)]
    _check([l3.encode(im, n) for im, (_, _, n) in zip(imgs, shapes, strict=True)], imgs)


def test_kernel_on_a_gray_and_a_flat_image(interpreted):
    flat = np.full((9, 11, 3), 200, np.uint8)            # every row nbit 0
    gray = np.repeat(photo_like(12, 10, 3)[:, :, :1], 3, axis=2)
    _check([l3.encode(flat, 4), l3.encode(gray, 8)], [flat, gray])


def test_kernel_rejects_what_the_c_decoder_rejects(interpreted):
    data = l3.encode(photo_like(40, 40, 2), 32)
    for bad, _ in _corruptions(data):
        with pytest.raises(l3.L3Error):
            l3.decode(bad)
        with pytest.raises(l3.L3Error):
            decode_batch([bad], backend="triton")
    # damage in one image of a batch fails the batch; the good images alone still decode
    good = l3.encode(photo_like(20, 12, 5), 8)
    nbit15 = bytearray(data)
    nbit15[13 + 6 * 4] |= 0x0F
    with pytest.raises(l3.L3Error):
        decode_batch([good, bytes(nbit15), good], backend="triton")
    assert decode_batch([good, good], backend="triton").shape == (2, 3, 12, 20)


@SLOW
@given(st.data())
def test_mutated_files_agree_with_the_c_decoder(interpreted, data):
    img = photo_like(data.draw(st.integers(1, 24)), data.draw(st.integers(1, 20)), 1)
    blob = bytearray(l3.encode(img, data.draw(st.sampled_from([4, 8, 16]))))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    assert_batch_agrees_with_c(bytes(blob), backend="triton")


def test_backend_choice(monkeypatch):
    blob = l3.encode(photo_like(9, 7, 0), 4)

    def no_kernel(*a, **k):
        raise AssertionError("auto must not pick the Triton kernel on a CPU device")
    monkeypatch.setattr(l3_triton, "decode", no_kernel)
    assert (decode_batch([blob], "cpu")[0].numpy() == l3.decode(blob, "CHW")).all()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA"):
        decode_batch([blob], "cpu", backend="triton")
    with pytest.raises(ValueError, match="backend"):
        decode_batch([blob], "cpu", backend="cuda")


def test_upload_lays_the_blobs_back_to_back():
    """The staging copy (threaded above _PARALLEL_COPY) keeps order and pads with zeros."""
    blobs = [os.urandom(n) for n in (torch_l3._PARALLEL_COPY // 2, 1, 0, torch_l3._PARALLEL_COPY, 77)]
    total = sum(map(len, blobs))
    for b in (blobs, blobs[1:2]):
        t = sum(map(len, b))
        got = torch_l3._upload(b, t, torch.device("cpu"))
        assert bytes(got.numpy()) == b"".join(b) + bytes(torch_l3._PAD)
    assert total >= torch_l3._PARALLEL_COPY
