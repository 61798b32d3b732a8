"""Crop-only decoding (decode_jpeg_canvases(boxes=...), what GPUImageFolder asks for):
an image is decoded only around the box it will be cropped to, and the box's pixels are
still Pillow's.  The GPU kernel decodes only the restart intervals the box's rows need
(csrc/jpeg_batch.c's take); the pixel stage reconstructs only the blocks under the box
and a margin of the upsampler's and block smoothing's reach."""
import random

import numpy as np
import torch
from PIL import Image
from test_jpeg_decode import pillow

from pcrfs import jpeg as cjpeg
from pcrfs.jpeg.crop import random_resized_box
from pcrfs.torch import jpeg_triton
from pcrfs.torch.jpeg import _window, decode_jpeg_canvases

from edgecases import cjpeg_encode, photo_like, save, views


def _boxes_for(rng, extra=None):
    """boxes(sizes) drawing RandomResizedCrop boxes (small scales, so windows are smaller
    than images), recording them; extra: {index: box} to use instead."""
    drawn = {}

    def boxes(sizes):
        out = []
        for i, hw in enumerate(sizes):
            h, w = hw
            b = (extra or {}).get(i) or random_resized_box(rng, w, h, (0.02, 0.3), (1 / 2, 2))
            drawn[i] = b
            out.append(b)
        return out
    return boxes, drawn


def _assert_boxes_are_pillows(blobs, res, drawn, mode="RGB") -> float:
    """Every image's box in its canvas equals Pillow's pixels there; returns the windows'
    share of the images' pixels."""
    win = whole = 0
    seen = set()
    for idx, canvas, sizes, origins in res:
        for k, i in enumerate(idx):
            top, left, h, w = drawn[i]
            (y0, x0), (hh, ww) = origins[k], sizes[k]
            assert y0 <= top and x0 <= left and top + h <= y0 + hh and left + w <= x0 + ww, (i, drawn[i])
            assert hh <= canvas.shape[2] and ww <= canvas.shape[3]
            got = canvas[k, :, top - y0: top - y0 + h, left - x0: left - x0 + w].permute(1, 2, 0).numpy()
            want = pillow(blobs[i], mode)
            d = np.abs(got.astype(int) - want[top: top + h, left: left + w]).max()
            assert d == 0, f"image {i}: box {drawn[i]} differs by {d}"
            win += hh * ww
            whole += want.shape[0] * want.shape[1]
            seen.add(i)
    assert seen == set(range(len(blobs)))
    return win / whole


def _layouts(w, h, seed):
    """Every chroma layout and both kinds of view (incomplete ones are smoothed)."""
    out = []
    for k, s in enumerate(["1x1", "2x1", "2x2", "1x2", "4x1", "2x1,1x2,1x1"]):
        src = cjpeg_encode(Image.fromarray(photo_like(w, h, seed + k)), s, 85)
        v = views(src, 1)
        out += [v[-1], v[2]]
    out.append(views(save(Image.fromarray(photo_like(w, h, seed)).convert("L"), quality=88), 3)[1])
    return out


def test_a_box_decodes_only_its_window_with_pillows_pixels():
    """The C decoder's coefficients and the torch pixel stage on windows: random boxes,
    boxes at the corners and the whole image, over every layout, complete and smoothed
    views: the box's pixels are Pillow's, and the windows are much smaller than the
    images (what the upsampler and smoothing reach, not more)."""
    blobs = _layouts(200, 152, 0)
    n = len(blobs)
    extra = {0: (151, 199, 1, 1), 1: (0, 0, 1, 1), 2: (0, 0, 152, 200), 3: (150, 0, 2, 200)}
    boxes, drawn = _boxes_for(random.Random(0), extra)
    res = decode_jpeg_canvases(blobs, "cpu", mode="rgb", backend="c", boxes=boxes)
    share = _assert_boxes_are_pillows(blobs, res, drawn)
    assert share < 0.6, share
    # the whole-image box and the corner boxes' windows are the image and small corners
    ps = [cjpeg.parse(b) for b in blobs]
    assert _window(ps[2], extra[2]) is None
    r0, r1, c0, c1 = _window(ps[0], extra[0])
    assert (r1, c1) == (ps[0].mcuy, ps[0].mcux) and (r1 - r0) * (c1 - c0) <= 9
    # a complete view is not smoothed: its margin is the upsampler's one MCU; an
    # incomplete one's is three (smoothing's two chroma blocks, and the upsampler's)
    assert _window(ps[4], (64, 64, 16, 16)) == (3, 6, 3, 6)       # q10 2x2: MCU 16 px
    assert _window(ps[5], (64, 64, 16, 16)) == (1, 8, 1, 8)       # partial view: smoothed
    assert n == 13


def test_the_kernel_decodes_only_the_intervals_a_window_needs(interpreted):
    """The take (csrc/jpeg_batch.c) and the Triton kernel in the interpreter: a one-row
    window of restart-marked images describes only the intervals that meet its rows,
    packs only their bytes, and decodes the C decoder's coefficients in those rows (the
    rest stay zero); the whole path with boxes gives Pillow's pixels in them."""
    src = [save(Image.fromarray(photo_like(24, 80, s)), quality=90) for s in (1, 2)]
    blobs = [views(src[0], 1)[-1], views(src[1], 1)[4]]         # q10, and a partial view
    ps = [cjpeg.parse(b) for b in blobs]
    assert all(p.mcuy == 5 for p in ps)
    wins = np.array([(1, 2), (2, 3)], np.int64)                  # MCU rows
    firsts = [0, ps[0].total_blocks]
    data, _, rows, iv, where, counts = jpeg_triton.descriptors(ps, firsts, windows=wins)
    # per scan, the intervals whose block rows meet the window's (a 2x2 image: an
    # interleaved MCU row is 2 luma block rows; a luma scan's interval is one block row)
    want = set()
    for j, p in enumerate(ps):
        for k, v in enumerate(p.intervals):
            s = p.scans[v["scan"]]
            per = s[cjpeg.S["mcus_per_row"]]
            a, b = v["first_mcu"] // per, (v["first_mcu"] + v["n_mcus"] - 1) // per + 1
            comp = s[cjpeg.S["comp0"]]
            f = 1 if s[cjpeg.S["ncomp"]] > 1 else p.v[comp]      # in the window's MCU rows
            if a < wins[j][1] * f and b > wins[j][0] * f:
                want.add((j, k))
    assert 0 < len(want) < sum(len(p.intervals) for p in ps)
    assert len(iv) == len(want) == int(counts.sum())
    assert data.nbytes - 4 == sum(int(ps[j].intervals[k]["data_len"]) for j, k in want)
    for d, (j, _, _) in zip(iv, where, strict=True):     # every interval's bytes are its own
        own = [ps[j].data[v["data_off"]: v["data_off"] + v["data_len"]] for v in ps[j].intervals]
        assert any(bytes(data[d[0]: d[1]]) == bytes(o) for o in own)
    coefs = torch.zeros((sum(p.total_blocks for p in ps) + 1, 64), dtype=torch.int16)
    assert jpeg_triton.entropy_decode(ps, firsts, coefs, windows=wins) == {}
    for j, p in enumerate(ps):
        full = cjpeg.entropy_decode(p)
        got = coefs[firsts[j]: firsts[j] + p.total_blocks].numpy()
        for c in range(p.ncomp):
            r0, r1 = wins[j][0] * p.v[c], wins[j][1] * p.v[c]
            lo = p.coef_offset[c] + r0 * p.bw[c]
            hi = p.coef_offset[c] + r1 * p.bw[c]
            assert (got[lo:hi] == full[lo:hi]).all(), (j, c)
            assert not got[p.coef_offset[c]: p.coef_offset[c] + p.bw[c]].any() or r0 == 0  # row 0 untaken
    # wide images too, whose windows leave columns out (rows `stride` blocks apart)
    blobs.append(views(save(Image.fromarray(photo_like(80, 16, 3)), quality=90), 1)[-1])
    blobs.append(views(save(Image.fromarray(photo_like(160, 16, 4)), quality=90), 1)[3])   # smoothed
    assert _window(cjpeg.parse(blobs[2]), (0, 60, 8, 10)) == (0, 1, 2, 5)
    assert _window(cjpeg.parse(blobs[3]), (0, 120, 8, 10)) == (0, 1, 4, 10)
    boxes, drawn = _boxes_for(random.Random(0), {0: (40, 3, 6, 15), 1: (70, 0, 8, 24), 2: (0, 60, 8, 10),
                                                 3: (0, 120, 8, 10)})
    res = decode_jpeg_canvases(blobs, "cpu", mode="rgb", backend="triton", boxes=boxes)
    assert _assert_boxes_are_pillows(blobs, res, drawn) < 1


def _take_reference(p, r0, r1, widen: bool = True) -> set:
    """The take's rule in Python: from the last scan back, the intervals meeting each
    component's rows; an AC refinement's taken rows join its component's for the scans
    before it."""
    lo = {c: r0 * p.v[c] for c in range(p.ncomp)}
    hi = {c: r1 * p.v[c] for c in range(p.ncomp)}
    taken = set()
    for si in range(len(p.scans) - 1, -1, -1):
        s = p.scans[si]
        comps = [int(s[cjpeg.S[f"comp{k}"]]) for k in range(s[cjpeg.S["ncomp"]])]
        per = s[cjpeg.S["mcus_per_row"]]
        span = []
        first = s[cjpeg.S["first_interval"]]
        for k in range(first, first + s[cjpeg.S["n_intervals"]]):
            v = p.intervals[k]
            a, b = v["first_mcu"] // per, (v["first_mcu"] + max(v["n_mcus"], 1) - 1) // per + 1
            f = {c: p.v[c] if len(comps) > 1 else 1 for c in comps}     # MCU rows -> block rows
            if any(a * f[c] < hi[c] and b * f[c] > lo[c] for c in comps):
                taken.add(k)
                span.append((a, b))
        if widen and s[cjpeg.S["kind"]] == cjpeg.AC_REFINE and span:
            c = comps[0]
            lo[c], hi[c] = min(lo[c], min(a for a, _ in span)), max(hi[c], max(b for _, b in span))
    return taken


def test_a_refinements_intervals_widen_the_earlier_scans_rows():
    """An AC refinement's bits depend on which of its blocks' coefficients earlier scans
    made nonzero, so a taken refinement interval reaching rows past the window needs the
    earlier scans' intervals over those rows too.  The build's scans share one grid, so
    here a refinement's intervals are made to straddle two rows each: the take then
    reaches the rows below the window in the scans before it, as the rule says."""
    p = cjpeg.parse(views(save(Image.fromarray(photo_like(16, 64, 4)), quality=90), 1)[-1])
    kinds = p.scans[:, cjpeg.S["kind"]]
    ref = int(np.flatnonzero(kinds == cjpeg.AC_REFINE)[-1])
    s = p.scans[ref]
    f, n = s[cjpeg.S["first_interval"]], s[cjpeg.S["n_intervals"]]
    per = int(s[cjpeg.S["mcus_per_row"]])
    for k in range(f + 1, f + n):                 # interval k covers rows k-1-f .. k-f
        p.intervals[k]["first_mcu"] = (k - f - 1) * per
        p.intervals[k]["n_mcus"] = 2 * per
    assert p.mcuy == 4
    r0, r1 = 2, 3                                                    # MCU rows
    want = _take_reference(p, r0, r1)
    assert _take_reference(p, r0, r1, widen=False) < want          # the widening matters here
    _, _, _, iv, where, _ = jpeg_triton.descriptors([p], [0], windows=[(r0, r1)])
    assert len(iv) == len(want)
    got = {(int(w[1]), int(d[2])) for d, w in zip(iv, where, strict=True)}
    assert got == {(int(p.intervals[k]["scan"]), int(p.intervals[k]["first_mcu"])) for k in want}
    # the widening's effect: an earlier luma scan takes the row above the window's rows
    comp = int(s[cjpeg.S["comp0"]])
    earlier = [k for k in want if p.intervals[k]["scan"] < ref
               and p.scans[p.intervals[k]["scan"]][cjpeg.S["ncomp"]] == 1
               and p.scans[p.intervals[k]["scan"]][cjpeg.S["comp0"]] == comp]
    rows = {int(p.intervals[k]["first_mcu"]) // per for k in earlier}
    assert min(rows) < r0 * p.v[comp], rows
