"""The pixel stage on the GPU in two fused Triton kernels, integer arithmetic throughout,
equal to pcrfs.torch.jpeg_pixels (and so to Pillow) sample for sample:

- `idct`: for each block of a component's canvas, the gather from the batch's
  coefficients (a zero block where the image has none), dequantisation and libjpeg's
  islow IDCT in int32, written as uint8 straight into the [N, H, W] sample plane.  The
  torch path's float64 passes, int16 canvas and permuted copy (about half of a batch's
  device traffic) become one read of the coefficients and one write of the samples.
- `ycc_rgb`: each output pixel's luma, its chroma upsampled by libjpeg's fancy (triangle)
  filter on the fly, with each image's edge replication, and jdcolor.c's fixed-point
  YCbCr->RGB: the upsampled planes and the table lookups' int16 offsets are never stored.

Each program takes BLOCK blocks (idct) or pixels (ycc_rgb) as [BLOCK] vectors.  The
IDCT is written out coefficient by coefficient: Triton's frontend has no lists of
tensors, and 64 named values let each 1-D pass stay elementwise, with no transposition.
With TRITON_INTERPRET=1 set before first use they run on CPU tensors (the tests)."""
from __future__ import annotations

import functools

import torch

from pcrfs.torch import jpeg_pixels as px
from pcrfs.torch.transfer import constant
from pcrfs.torch.triton_ops import combiners, lower

BLOCK_IDCT, BLOCK_RGB = 128, 512
# jidctint.c's constants: globals the jit functions read, made tl.constexpr when the
# kernels are built (the compiler takes no other globals; the interpreter takes both)
F0298, F0390, F0541, F0765, F0899, F1175 = px.F0298, px.F0390, px.F0541, px.F0765, px.F0899, px.F1175
F1501, F1847, F1961, F2053, F2562, F3072 = px.F1501, px.F1847, px.F1961, px.F2053, px.F2562, px.F3072
_IDCT_CONSTANTS = ("F0298", "F0390", "F0541", "F0765", "F0899", "F1175",
                   "F1501", "F1847", "F1961", "F2053", "F2562", "F3072")


@functools.cache
def kernels():
    import triton
    import triton.language as tl
    globals().update({k: tl.constexpr(getattr(px, k)) for k in _IDCT_CONSTANTS})

    @triton.jit
    def idct_pass(x0, x1, x2, x3, x4, x5, x6, x7, rnd: tl.constexpr, shift: tl.constexpr):
        """jidctint.c's 1-D pass and its descale (jpeg_pixels._idct_1d)."""
        z1 = (x2 + x6) * F0541
        tmp2 = z1 - x6 * F1847
        tmp3 = z1 + x2 * F0765
        tmp0 = (x0 + x4) << 13
        tmp1 = (x0 - x4) << 13
        t10 = tmp0 + tmp3
        t13 = tmp0 - tmp3
        t11 = tmp1 + tmp2
        t12 = tmp1 - tmp2
        z5 = (x7 + x3 + x5 + x1) * F1175
        za = (x7 + x1) * -F0899
        zb = (x5 + x3) * -F2562
        zc = (x7 + x3) * -F1961 + z5
        zd = (x5 + x1) * -F0390 + z5
        o0 = x7 * F0298 + za + zc
        o1 = x5 * F2053 + zb + zd
        o2 = x3 * F3072 + zb + zc
        o3 = x1 * F1501 + za + zd
        return ((t10 + o3 + rnd) >> shift, (t11 + o2 + rnd) >> shift, (t12 + o1 + rnd) >> shift,
                (t13 + o0 + rnd) >> shift, (t13 - o0 + rnd) >> shift, (t12 - o1 + rnd) >> shift,
                (t11 - o2 + rnd) >> shift, (t10 - o3 + rnd) >> shift)

    @triton.jit
    def dequant(c, p, inside, ok):
        return tl.load(c, mask=inside, other=0).to(tl.int32) * tl.load(p, mask=ok, other=0).to(tl.int32)

    @triton.jit
    def idct_column(src, q, blk, qrow, inside, ok, u: tl.constexpr):
        """Column u's 8 dequantised coefficients through the column pass."""
        c = src + blk * 64 + u
        p = q + qrow + u
        return idct_pass(dequant(c, p, inside, ok),
                         dequant(c + 8, p + 8, inside, ok),
                         dequant(c + 16, p + 16, inside, ok),
                         dequant(c + 24, p + 24, inside, ok),
                         dequant(c + 32, p + 32, inside, ok),
                         dequant(c + 40, p + 40, inside, ok),
                         dequant(c + 48, p + 48, inside, ok),
                         dequant(c + 56, p + 56, inside, ok),
                         1024, 11)

    @triton.jit
    def idct_row(dst, at, ok, w0, w1, w2, w3, w4, w5, w6, w7):
        """One workspace row through the row pass: 8 samples, +128, saturated to uint8."""
        p0, p1, p2, p3, p4, p5, p6, p7 = idct_pass(w0, w1, w2, w3, w4, w5, w6, w7, 131072, 18)
        tl.store(dst + at, tl.minimum(tl.maximum(p0 + 128, 0), 255).to(tl.uint8), mask=ok)
        tl.store(dst + at + 1, tl.minimum(tl.maximum(p1 + 128, 0), 255).to(tl.uint8), mask=ok)
        tl.store(dst + at + 2, tl.minimum(tl.maximum(p2 + 128, 0), 255).to(tl.uint8), mask=ok)
        tl.store(dst + at + 3, tl.minimum(tl.maximum(p3 + 128, 0), 255).to(tl.uint8), mask=ok)
        tl.store(dst + at + 4, tl.minimum(tl.maximum(p4 + 128, 0), 255).to(tl.uint8), mask=ok)
        tl.store(dst + at + 5, tl.minimum(tl.maximum(p5 + 128, 0), 255).to(tl.uint8), mask=ok)
        tl.store(dst + at + 6, tl.minimum(tl.maximum(p6 + 128, 0), 255).to(tl.uint8), mask=ok)
        tl.store(dst + at + 7, tl.minimum(tl.maximum(p7 + 128, 0), 255).to(tl.uint8), mask=ok)

    # jit functions find their callees among their module's globals, and are built here
    # (on first use) so that importing this module needs no Triton
    globals().update(tl=tl, idct_pass=idct_pass, dequant=dequant, idct_column=idct_column, idct_row=idct_row)

    @triton.jit
    def idct(src, base, rows, cols, strides, q, q_stride, dst, bh, bw,
             DENSE: tl.constexpr, BLOCK: tl.constexpr):
        """Image program_id(0)'s blocks [program_id(1) * BLOCK, +BLOCK) of its own
        rows[i] x cols[i] (a canvas [N, bh, bw] holds it at its top left; the blocks past
        its own are not written, nor is anything done for them): block (r, c) is
        src[base[i] + r * strides[i] + c] (DENSE: src is the canvas itself).  q: image
        i's table at q + i * q_stride."""
        img = tl.program_id(0).to(tl.int64)
        first = tl.program_id(1).to(tl.int64) * BLOCK
        nr = tl.load(rows + img)
        nc = tl.load(cols + img)
        if first < nr * nc:
            t = first + tl.arange(0, BLOCK)
            ok = t < nr * nc
            r = t // tl.maximum(nc, 1)
            c = t % tl.maximum(nc, 1)
            per = bh * bw
            if DENSE:
                blk = img * per + r * bw + c
            else:
                blk = tl.load(base + img) + r * tl.load(strides + img) + c
            inside = ok
            qrow = img * q_stride + t * 0        # a vector, as the masked table loads need
            w00, w10, w20, w30, w40, w50, w60, w70 = idct_column(src, q, blk, qrow, inside, ok, 0)
            w01, w11, w21, w31, w41, w51, w61, w71 = idct_column(src, q, blk, qrow, inside, ok, 1)
            w02, w12, w22, w32, w42, w52, w62, w72 = idct_column(src, q, blk, qrow, inside, ok, 2)
            w03, w13, w23, w33, w43, w53, w63, w73 = idct_column(src, q, blk, qrow, inside, ok, 3)
            w04, w14, w24, w34, w44, w54, w64, w74 = idct_column(src, q, blk, qrow, inside, ok, 4)
            w05, w15, w25, w35, w45, w55, w65, w75 = idct_column(src, q, blk, qrow, inside, ok, 5)
            w06, w16, w26, w36, w46, w56, w66, w76 = idct_column(src, q, blk, qrow, inside, ok, 6)
            w07, w17, w27, w37, w47, w57, w67, w77 = idct_column(src, q, blk, qrow, inside, ok, 7)
            pitch = bw * 8
            at = img * per * 64 + r * 8 * pitch + c * 8
            idct_row(dst, at, ok, w00, w01, w02, w03, w04, w05, w06, w07)
            idct_row(dst, at + pitch, ok, w10, w11, w12, w13, w14, w15, w16, w17)
            idct_row(dst, at + 2 * pitch, ok, w20, w21, w22, w23, w24, w25, w26, w27)
            idct_row(dst, at + 3 * pitch, ok, w30, w31, w32, w33, w34, w35, w36, w37)
            idct_row(dst, at + 4 * pitch, ok, w40, w41, w42, w43, w44, w45, w46, w47)
            idct_row(dst, at + 5 * pitch, ok, w50, w51, w52, w53, w54, w55, w56, w57)
            idct_row(dst, at + 6 * pitch, ok, w60, w61, w62, w63, w64, w65, w66, w67)
            idct_row(dst, at + 7 * pitch, ok, w70, w71, w72, w73, w74, w75, w76, w77)

    @triton.jit
    def sample_at(plane, img, y, x, hh, ww, dh, dw):
        """A chroma sample as the torch path sees it: the canvas edge, then the image's."""
        y = tl.minimum(tl.minimum(tl.maximum(y, 0), hh - 1), dh - 1)
        x = tl.minimum(tl.minimum(tl.maximum(x, 0), ww - 1), dw - 1)
        return tl.load(plane + (img * hh + y) * ww + x).to(tl.int32)

    @triton.jit
    def three_one(plane, img, ya, xa, yb, xb, hh, ww, dh, dw):
        """3 x sample a + sample b: the triangle filter's weights."""
        return (3 * sample_at(plane, img, ya, xa, hh, ww, dh, dw)
                + sample_at(plane, img, yb, xb, hh, ww, dh, dw))

    @triton.jit
    def chroma_at(plane, img, y, x, hh, ww, dh, dw, HF: tl.constexpr, VF: tl.constexpr):
        """Output pixel (y, x)'s sample of a plane upsampled HF x VF by jdsample.c's fancy
        filters (1 x 1: the sample itself)."""
        sy = y // VF
        sx = x // HF
        if HF == 1 and VF == 1:     # as sampled: no edge replication, as the torch path
            return tl.load(plane + (img * hh + sy) * ww + sx).to(tl.int32)
        if VF == 1:     # h2v1: 3/4 this sample, 1/4 the nearer neighbour
            nb = tl.where(x % 2 == 0, sx - 1, sx + 1)
            return (three_one(plane, img, sy, sx, sy, nb, hh, ww, dh, dw)
                    + tl.where(x % 2 == 0, 1, 2)) >> 2
        if HF == 1:     # h1v2
            nb = tl.where(y % 2 == 0, sy - 1, sy + 1)
            return (three_one(plane, img, sy, sx, nb, sx, hh, ww, dh, dw)
                    + tl.where(y % 2 == 0, 1, 2)) >> 2
        # h2v2: column sums with the nearer row, then the horizontal triangle
        ny = tl.where(y % 2 == 0, sy - 1, sy + 1)
        nx = tl.where(x % 2 == 0, sx - 1, sx + 1)
        this = three_one(plane, img, sy, sx, ny, sx, hh, ww, dh, dw)
        # the neighbour column's sum, at the canvas edge repeated as _shift repeats it
        nxc = tl.minimum(tl.maximum(nx, 0), ww - 1)
        other = three_one(plane, img, sy, nxc, ny, nxc, hh, ww, dh, dw)
        return (3 * this + other + tl.where(x % 2 == 0, 8, 7)) >> 4

    globals().update(sample_at=sample_at, three_one=three_one, chroma_at=chroma_at)

    @triton.jit
    def ycc_rgb(yp, cbp, crp, dws, dhs, hs, ws, out, H, W, yh, yw, ch, cw,
                HF: tl.constexpr, VF: tl.constexpr, BLOCK: tl.constexpr):
        """Image program_id(0)'s pixels [program_id(1) * BLOCK, +BLOCK) of its own hs[i]
        x ws[i] (in out [N, 3, H, W] at its top left; the rest is not written): luma from
        yp ([N, yh, yw]), chroma from cbp / crp ([N, ch, cw], image i's dws[i] x dhs[i]
        samples), upsampled HF x VF, to RGB."""
        img = tl.program_id(0).to(tl.int64)
        first = tl.program_id(1).to(tl.int64) * BLOCK
        hh = tl.load(hs + img)
        ww = tl.load(ws + img)
        if first < hh * ww:
            t = first + tl.arange(0, BLOCK)
            ok = t < hh * ww
            y = tl.where(ok, t // tl.maximum(ww, 1), 0)
            x = tl.where(ok, t % tl.maximum(ww, 1), 0)
            dw = tl.load(dws + img)
            dh = tl.load(dhs + img)
            lum = tl.load(yp + (img * yh + y) * yw + x, mask=ok, other=0).to(tl.int32)
            cb = chroma_at(cbp, img, y, x, ch, cw, dh, dw, HF, VF) - 128
            cr = chroma_at(crp, img, y, x, ch, cw, dh, dw, HF, VF) - 128
            red = lum + ((91881 * cr + 32768) >> 16)
            green = lum + ((-22554 * cb + 32768 - 46802 * cr) >> 16)
            blue = lum + ((116130 * cb + 32768) >> 16)
            o = out + img * 3 * H * W + y * W + x
            tl.store(o, tl.minimum(tl.maximum(red, 0), 255).to(tl.uint8), mask=ok)
            tl.store(o + H * W, tl.minimum(tl.maximum(green, 0), 255).to(tl.uint8), mask=ok)
            tl.store(o + 2 * H * W, tl.minimum(tl.maximum(blue, 0), 255).to(tl.uint8), mask=ok)

    return idct, ycc_rgb


def idct_plane(src: torch.Tensor, q: torch.Tensor, n: int, bh: int, bw: int, geo: tuple,
               dense: bool = False) -> torch.Tensor:
    """uint8 [n, bh * 8, bw * 8], image i's own samples at its top left (the rest not
    written): geo = (base, rows, cols, stride), int64 [n] each, places image i's rows x
    cols blocks in src (int16 [*, 64]), a row `stride` blocks from the next (dense: src
    is the [n * bh * bw, 64] canvas, and base and stride unused); q [n, 64] (int32 or
    int64; rows may be strided) dequantises them."""
    dst = torch.empty((n, bh * 8, bw * 8), dtype=torch.uint8, device=src.device)
    if n * bh * bw == 0:
        return dst
    base, rows, cols, strides = geo
    k, _ = kernels()
    k[(n, -(-(bh * bw) // BLOCK_IDCT))](src, base, rows, cols, strides, q, q.stride(0), dst, bh, bw,
                                       DENSE=dense, BLOCK=BLOCK_IDCT)
    return dst


def fancy_ok(hf: int, vf: int, fancy: bool) -> bool:
    """The sampling ycc_rgb upsamples itself (jpeg_pixels.upsample's fancy cases, or none)."""
    return (hf, vf) == (1, 1) or (fancy and (hf, vf) in ((2, 1), (1, 2), (2, 2)))


def ycc_to_rgb(y: torch.Tensor, cb: torch.Tensor, cr: torch.Tensor, dw: torch.Tensor,
               dh: torch.Tensor, hf: int, vf: int, h: int, w: int, sizes: tuple) -> torch.Tensor:
    """uint8 [N, 3, h, w], image i's own hs[i] x ws[i] pixels at its top left (sizes =
    (hs, ws), int64 [N]; the rest not written): luma plane y [N, *, *] and chroma planes
    cb, cr [N, *, *] (not yet upsampled; dw, dh int64 [N], contiguous: each image's
    chroma samples)."""
    n = y.shape[0]
    out = torch.empty((n, 3, h, w), dtype=torch.uint8, device=y.device)
    if n * h * w == 0:
        return out
    _, k = kernels()
    k[(n, -(-(h * w) // BLOCK_RGB))](y, cb, cr, dw, dh, sizes[0], sizes[1], out, h, w, y.shape[1], y.shape[2],
                                     cb.shape[1], cb.shape[2], HF=hf, VF=vf, BLOCK=BLOCK_RGB)
    return out


BLOCK_SMOOTH, WARPS_SMOOTH = 16, 4     # 0 spills on sm_80 and sm_90a (ptxas -v)


@functools.cache
def smoothing():
    """libjpeg-turbo's block smoothing (jpeg_pixels.smooth, its rows from smooth_rows and
    its columns) as one kernel over a component's canvas, reading each image's blocks
    where they are: the 5x5 DC neighbourhood in one gather, the nine AC predictions and
    the DC's as sums against jdcoefct.c's weights, in int64."""
    import triton
    import triton.language as tl
    _add, _, _ = combiners()

    @triton.jit
    def pred(num, q, al, LIMIT: tl.constexpr):
        """jpeg_pixels._pred: the prediction's magnitude rounded, limited by Al's bits."""
        q7 = q << 7
        q8 = q << 8
        mag = tl.where(num >= 0, (q7 + num) // q8, (q7 - num) // q8)
        if LIMIT:
            lim = (tl.full(al.shape, 1, tl.int64) << tl.minimum(tl.maximum(al, 0), 30).to(tl.int64)) - 1
            mag = tl.where((al > 0) & (mag > lim), lim, mag)
        return tl.where(num >= 0, mag, -mag)

    globals().update(pred=pred, _add=_add)

    @triton.jit
    def smooth(src, geo, n, q, q_stride, bits, b_stride, mcuy, w, pos, zk, dst, bh, bw,
               BLOCK: tl.constexpr):
        """Image program_id(0)'s blocks [program_id(1) * BLOCK, +BLOCK) of its own, smoothed,
        to its place in the canvas dst [N * bh * bw, 64] (the blocks past its own are not
        written): block (r, c) is src[base + r * stride + c] (geo: [9, N], jpeg._pixels'
        fields); q, bits: image i's tables at i * stride;
        w: [19, 32] weights (columns the 25 DCs), pos / zk: the nine AC positions
        (natural) and their zigzag indices."""
        img = tl.program_id(0).to(tl.int64)
        first = tl.program_id(1).to(tl.int64) * BLOCK
        nr = tl.load(geo + n + img)
        nc = tl.load(geo + 2 * n + img)
        if first < nr * nc:
            own = first + tl.arange(0, BLOCK)
            ok = own < nr * nc
            r = own // tl.maximum(nc, 1)
            c = own % tl.maximum(nc, 1)
            t = img * bh * bw + r * bw + c        # the block's place in the canvas
            base = tl.load(geo + img)
            wib = tl.load(geo + 3 * n + img)
            hib = tl.load(geo + 4 * n + img)
            v = tl.maximum(tl.load(geo + 5 * n + img), 1)
            tot = tl.load(mcuy + img)
            stride = tl.load(geo + 8 * n + img)
            # smooth_rows: rows -2..+2 of this block row, with jdcoefct.c's edge rules
            mrow = r // v
            br = r % v
            last = tl.where(hib % v == 0, v, hib % v)
            rows = tl.where(mrow < tot - 1, v, last)
            image_rows = rows * tot
            ibr = mrow * rows + br
            prev = tl.where(ibr > 0, r - 1, r)
            pprev = tl.where(ibr > 1, r - 2, prev)
            nxt = tl.where(ibr < image_rows - 1, r + 1, r)
            nnxt = tl.where(ibr < image_rows - 2, r + 2, nxt)
            kept = (mrow < tot) & (br < rows)
            u = tl.arange(0, 32)[None, :]
            dr = u // 5
            rr = tl.where(dr == 0, pprev[:, None], tl.where(dr == 1, prev[:, None], tl.where(
                dr == 2, r[:, None], tl.where(dr == 3, nxt[:, None], nnxt[:, None]))))
            rr = tl.minimum(tl.maximum(tl.where(kept[:, None], rr, r[:, None]), 0), bh - 1)
            cc = tl.minimum(tl.maximum(c[:, None] + u % 5 - 2, 0), tl.maximum(wib - 1, 0))
            have = ok[:, None] & (u < 25) & (rr < nr) & (cc < nc)
            # int32: |DC| < 2^16 and 25 weights under 2^8 keep every sum under 2^31
            d = tl.load(src + (base + rr * stride + cc) * 64, mask=have, other=0).to(tl.int32)
            inside = ok
            blk = (base + r * stride + c) * 64
            out = dst + t * 64
            qrow = q + img * q_stride
            brow = bits + img * b_stride
            change = tl.full([BLOCK], 1, tl.int1)
            for k in tl.static_range(1, 10):
                change = change & (tl.load(brow + k) == -1)
            q00 = tl.load(qrow).to(tl.int64)
            # the ten coefficients smoothing may change are stored one by one, the other 54
            # copied as they are (no address is written twice)
            k64 = tl.arange(0, 64)[None, :]
            mine = (k64 == 0) | (k64 == 1) | (k64 == 8) | (k64 == 16) | (k64 == 9) | (k64 == 2) | (
                k64 == 3) | (k64 == 10) | (k64 == 17) | (k64 == 24)
            tl.store(out[:, None] + k64, tl.load(src + blk[:, None] + k64, mask=inside[:, None], other=0),
                     mask=ok[:, None] & ~mine)
            for j in range(9):     # a loop, not unrolled: the weights' rows would stay live
                with_dc = tl.reduce(d * tl.load(w + j * 32 + u), 1, _add).to(tl.int64)
                without = tl.reduce(d * tl.load(w + (9 + j) * 32 + u), 1, _add).to(tl.int64)
                p = tl.load(pos + j)
                al = tl.load(brow + tl.load(zk + j)).to(tl.int64)
                guess = pred(q00 * tl.where(change, with_dc, without), tl.load(qrow + p).to(tl.int64),
                             al, True)
                ac = tl.load(src + blk + p, mask=inside, other=0).to(tl.int64)
                tl.store(out + p, tl.where((al != 0) & (ac == 0), guess, ac).to(tl.int16), mask=ok)
            dc = tl.load(src + blk, mask=inside, other=0).to(tl.int64)
            guess = pred(q00 * tl.reduce(d * tl.load(w + 18 * 32 + u), 1, _add).to(tl.int64), q00, q00, False)
            tl.store(out, tl.where(change, guess, dc).to(tl.int16), mask=ok)

    return smooth


def compiled_idct(arch: int):
    """The IDCT kernel (reading the batch's coefficients) lowered for sm_<arch>."""
    sig = {"src": "*i16", "base": "*i64", "rows": "*i64", "cols": "*i64", "strides": "*i64", "q": "*i64",
           "q_stride": "i32", "dst": "*u8", "bh": "i32", "bw": "i32", "DENSE": "constexpr",
           "BLOCK": "constexpr"}
    return lower(kernels()[0], sig, {"DENSE": False, "BLOCK": BLOCK_IDCT}, arch, 4)


def compiled_ycc_rgb(arch: int):
    """The colour kernel (4:2:0's fancy upsampling) lowered for sm_<arch>."""
    sig = {"yp": "*u8", "cbp": "*u8", "crp": "*u8", "dws": "*i64", "dhs": "*i64", "hs": "*i64", "ws": "*i64",
           "out": "*u8", "H": "i32", "W": "i32", "yh": "i32", "yw": "i32", "ch": "i32", "cw": "i32",
           "HF": "constexpr", "VF": "constexpr", "BLOCK": "constexpr"}
    return lower(kernels()[1], sig, {"HF": 2, "VF": 2, "BLOCK": BLOCK_RGB}, arch, 4)


def compiled_smoothing(arch: int):
    """The smoothing kernel lowered for sm_<arch> (triton_ops.lower)."""
    sig = {"src": "*i16", "geo": "*i64", "n": "i32", "q": "*i64", "q_stride": "i32", "bits": "*i64",
           "b_stride": "i32", "mcuy": "*i64", "w": "*i32", "pos": "*i32", "zk": "*i32", "dst": "*i16",
           "bh": "i32", "bw": "i32", "BLOCK": "constexpr"}
    return lower(smoothing(), sig, {"BLOCK": BLOCK_SMOOTH}, arch, WARPS_SMOOTH)


def _smooth_tables(dev):
    w = px._W.t().contiguous()                                   # [19, 25]
    return (constant("smooth_w32", dev, lambda: torch.nn.functional.pad(w, (0, 7)).to(torch.int32)),
            constant("smooth_pos32", dev, lambda: torch.tensor(px._POS, dtype=torch.int32)),
            constant("smooth_zk32", dev, lambda: torch.tensor(px._K, dtype=torch.int32)))


def smooth_blocks(coefs: torch.Tensor, geo: torch.Tensor, q: torch.Tensor, bits: torch.Tensor,
                  mcuy: torch.Tensor, n: int, bh: int, bw: int) -> torch.Tensor:
    """int16 [n * bh * bw, 64]: one component's canvas of n images, each image's own
    blocks smoothed as jpeg_pixels.smooth smooths _canvas's (the blocks past them are not
    written); geo [9, n] int64 contiguous (jpeg._pixels' fields for this component), q
    [n, 64] and bits [n, 10] (rows may be strided), mcuy [n]: each image's iMCU rows."""
    dst = torch.empty((n * bh * bw, 64), dtype=torch.int16, device=coefs.device)
    if n * bh * bw == 0:
        return dst
    w, pos, zk = _smooth_tables(coefs.device)
    smoothing()[(n, -(-(bh * bw) // BLOCK_SMOOTH))](coefs, geo, n, q, q.stride(0), bits, bits.stride(0), mcuy,
                                                   w, pos, zk, dst, bh, bw, BLOCK=BLOCK_SMOOTH,
                                                   num_warps=WARPS_SMOOTH)
    return dst
