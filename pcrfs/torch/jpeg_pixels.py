"""DCT coefficients to pixels, batched over images of mixed sizes, in integer arithmetic
that reproduces libjpeg-turbo's defaults (what Pillow decodes with): block smoothing of
incomplete progressive images, the "islow" IDCT, fancy upsampling, and its YCbCr->RGB.

Images of one sampling layout share a canvas per component (the largest image's size);
each image's samples beyond its own edge are replaced by its edge samples, so the
upsampling filters see libjpeg's edge replication without a per-image loop.  Everything
here is a handful of torch ops per group, on whichever device the coefficients are."""
from __future__ import annotations

import torch

from pcrfs.torch.transfer import constant

# jidctint.c's constants: FIX(x) = round(x * 2^13)
F0298, F0390, F0541, F0765, F0899, F1175 = 2446, 3196, 4433, 6270, 7373, 9633
F1501, F1847, F1961, F2053, F2562, F3072 = 12299, 15137, 16069, 16819, 20995, 25172
# jdcolor.c's, at 16 bits
CR_R, CB_B, CR_G, CB_G = 91881, 116130, 46802, 22554


def _idct_1d(x):
    x0, x1, x2, x3, x4, x5, x6, x7 = x
    z1 = (x2 + x6) * F0541
    tmp2 = z1 - x6 * F1847
    tmp3 = z1 + x2 * F0765
    tmp0 = (x0 + x4) << 13
    tmp1 = (x0 - x4) << 13
    t10, t13, t11, t12 = tmp0 + tmp3, tmp0 - tmp3, tmp1 + tmp2, tmp1 - tmp2
    z1, z2, z3, z4 = x7 + x1, x5 + x3, x7 + x3, x5 + x1
    z5 = (z3 + z4) * F1175
    o0, o1, o2, o3 = x7 * F0298, x5 * F2053, x3 * F3072, x1 * F1501
    z1, z2 = z1 * -F0899, z2 * -F2562
    z3, z4 = z3 * -F1961 + z5, z4 * -F0390 + z5
    o0 = o0 + z1 + z3
    o1 = o1 + z2 + z4
    o2 = o2 + z2 + z3
    o3 = o3 + z1 + z4
    return [t10 + o3, t11 + o2, t12 + o1, t13 + o0, t13 - o0, t12 - o1, t11 - o2, t10 - o3]


def _idct_matrix() -> torch.Tensor:
    """jidctint.c's 1-D pass is integer-linear until its descale: column k of this matrix
    is the pass applied to the k-th unit vector (exact in float64, whose 53 bits hold every
    product and sum of 16-bit coefficients)."""
    cols = []
    for k in range(8):
        unit = [torch.tensor(int(i == k), dtype=torch.int64) for i in range(8)]
        cols.append([int(v) for v in _idct_1d(unit)])
    return torch.tensor(cols, dtype=torch.float64).T.contiguous()


_M = _idct_matrix()


def idct_islow(coef: torch.Tensor, q: torch.Tensor | None = None, chunk: int = 1 << 20) -> torch.Tensor:
    """[N, ..., 8, 8] coefficients ([v][u]), dequantised by q (float64 [N, 1.., 8, 8]) if given
    -> uint8 samples of coef's shape: columns, then rows, each pass a matrix product
    followed by jidctint.c's descale; the final clamp is the SIMD code's saturation
    (libjpeg's C table wraps only for values no valid image reaches).  Equal to the
    butterfly (_idct_1d) bit for bit.
    Everything stays in float64, where every value is a multiple of a power of two well
    within 53 bits, so each pass is one product and a floor, with no integer copies:
    with a pass's descale 2^-n folded into its matrix, its exact result x / 2^n plus 1/2,
    floored, is jidctint.c's (x + 2^(n-1)) >> n.  The column pass's 1/2 rides in on the
    DC row (every output weighs it by 2^13, so 1/8 there adds 2^10), the row pass's 1/2
    and the +128 are the product's bias, and the final floor is the conversion to uint8
    (truncation, once clamped to 0..255).  About `chunk` blocks at a time (whole items of
    N), so the float64 work space is bounded whatever the batch."""
    dev = coef.device
    m1 = constant("idct_cols", dev, lambda: _M * 2.0 ** -11)
    m2t = constant("idct_rows", dev, lambda: _M.T.contiguous() * 2.0 ** -18)
    bias = constant("idct_bias", dev, lambda: _BIAS)
    out = torch.empty(coef.shape, dtype=torch.uint8, device=coef.device)
    step = max(1, chunk // max(1, coef[:1].numel() // 64))
    for a in range(0, coef.shape[0], step):
        # dequantised in the conversion itself (int16 x float64 -> float64): one pass
        ws = coef[a:a + step] * q[a:a + step] if q is not None else coef[a:a + step].to(torch.float64)
        ws[..., 0, :].add_(0.125)
        ws = torch.matmul(m1, ws).floor_()
        px = torch.addmm(bias, ws.view(-1, 8), m2t)
        del ws
        out[a:a + step] = px.clamp_(0, 255).view(out[a:a + step].shape)
    return out


_BIAS = torch.full((8,), 128.5, dtype=torch.float64)


def idct_islow_butterfly(coef: torch.Tensor) -> torch.Tensor:
    """The same, as jidctint.c's butterflies (the reference the tests hold idct_islow to)."""
    cols = _idct_1d(coef.unbind(-2))
    ws = torch.stack([(c + (1 << 10)) >> 11 for c in cols], -2)
    rows = _idct_1d(ws.unbind(-1))
    out = torch.stack([(r + (1 << 17)) >> 18 for r in rows], -1)
    return (out + 128).clamp_(0, 255).to(torch.uint8)


def smooth_rows(hib: torch.Tensor, v: torch.Tensor, total_rows: torch.Tensor, bh: int) -> torch.Tensor:
    """[N, bh, 5]: per image (hib, v, total_rows: [N]), the block rows jdcoefct.c's smoothing
    reads as rows -2..+2 of each block row, with its edge rules (the last iMCU row counts
    its own rows, and the image's row count is that count times the iMCU rows)."""
    hib, v, total_rows = hib[:, None], v[:, None], total_rows[:, None]
    r = torch.arange(bh, device=hib.device)[None]
    mrow, br = r // v, r % v
    last_rows = torch.where(hib % v == 0, v, hib % v)
    rows = torch.where(mrow < total_rows - 1, v, last_rows)
    image_rows = rows * total_rows
    ibr = mrow * rows + br
    prev = torch.where(ibr > 0, r - 1, r)
    pprev = torch.where(ibr > 1, r - 2, prev)
    nxt = torch.where(ibr < image_rows - 1, r + 1, r)
    nnxt = torch.where(ibr < image_rows - 2, r + 2, nxt)
    out = torch.stack([pprev, prev, r.expand_as(prev), nxt, nnxt], 2)
    # rows past the image's iMCU rows, or past its last iMCU row's count: their own row
    kept = ((mrow < total_rows) & (br < rows))[:, :, None]
    return torch.where(kept, out, r[:, :, None]).clamp_(0, bh - 1)


def _pred(num: torch.Tensor, q: torch.Tensor, al: torch.Tensor | None) -> torch.Tensor:
    q7, q8 = q << 7, q << 8
    mag = torch.where(num >= 0, (q7 + num) // q8, (q7 - num) // q8)
    if al is not None:
        lim = (1 << al.clamp(min=0, max=30)) - 1
        mag = torch.where((al > 0) & (mag > lim), lim, mag)
    return torch.where(num >= 0, mag, -mag)


# (natural position, zigzag index, DC weights with DC interpolation, without); the
# weights are jdcoefct.c's, DC01..DC25 row-major over the 5x5 neighbourhood
_AC = [
    (1, 1, {1: -1, 2: -1, 4: 1, 5: 1, 6: -3, 7: 13, 9: -13, 10: 3, 11: -3, 12: 38, 14: -38, 15: 3,
            16: -3, 17: 13, 19: -13, 20: 3, 21: -1, 22: -1, 24: 1, 25: 1},
     {11: -7, 12: 50, 14: -50, 15: 7}),
    (8, 2, {1: -1, 2: -3, 3: -3, 4: -3, 5: -1, 6: -1, 7: 13, 8: 38, 9: 13, 10: -1, 16: 1, 17: -13,
            18: -38, 19: -13, 20: 1, 21: 1, 22: 3, 23: 3, 24: 3, 25: 1},
     {3: -7, 8: 50, 18: -50, 23: 7}),
    (16, 3, {3: 1, 7: 2, 8: 7, 9: 2, 12: -5, 13: -14, 14: -5, 17: 2, 18: 7, 19: 2, 23: 1},
     {3: -1, 8: 13, 13: -24, 18: 13, 23: -1}),
    (9, 4, {1: -1, 5: 1, 7: 9, 9: -9, 17: -9, 19: 9, 21: 1, 25: -1},
     {10: 1, 16: 1, 17: -10, 19: 10, 2: -1, 20: -1, 22: 1, 24: -1, 4: 1, 6: -1, 7: 10, 9: -10}),
    (2, 5, {7: 2, 8: -5, 9: 2, 11: 1, 12: 7, 13: -14, 14: 7, 15: 1, 17: 2, 18: -5, 19: 2},
     {11: -1, 12: 13, 13: -24, 14: 13, 15: -1}),
    (3, 6, {7: 1, 9: -1, 12: 2, 14: -2, 17: 1, 19: -1}, None),
    (10, 7, {7: 1, 8: -3, 9: 1, 17: -1, 18: 3, 19: -1}, None),
    (17, 8, {7: 1, 9: -1, 12: -3, 14: 3, 17: 1, 19: -1}, None),
    (24, 9, {7: 1, 8: 2, 9: 1, 17: -1, 18: -2, 19: -1}, None),
]
_DC = {1: -2, 2: -6, 3: -8, 4: -6, 5: -2, 6: -6, 7: 6, 8: 42, 9: 6, 10: -6, 11: -8, 12: 42,
       13: 152, 14: 42, 15: -8, 16: -6, 17: 6, 18: 42, 19: 6, 20: -6, 21: -2, 22: -6, 23: -8,
       24: -6, 25: -2}


def _weight_matrix() -> torch.Tensor:
    """[25, 19]: the 5x5 DC neighbourhood -> each AC prediction's numerator with DC
    interpolation (columns 0-8), without it (9-17; zero where _AC has none), and the DC's
    (18).  float64 holds every sum exactly: |DC| < 2^16, weights < 2^8, 25 terms."""
    w = torch.zeros(25, 19, dtype=torch.float64)
    for j, (_, _, with_dc, without) in enumerate(_AC):
        for k, v in with_dc.items():
            w[k - 1, j] = v
        for k, v in (without or {}).items():
            w[k - 1, 9 + j] = v
    for k, v in _DC.items():
        w[k - 1, 18] = v
    return w


_W = _weight_matrix()
_POS = [pos for pos, _, _, _ in _AC]
_K = [k for _, k, _, _ in _AC]


def smooth(coef: torch.Tensor, q: torch.Tensor, bits: torch.Tensor, rows: torch.Tensor,
           wib: torch.Tensor) -> torch.Tensor:
    """libjpeg-turbo's block smoothing of one component over a canvas: coef int16 [N, BH,
    BW, 64]; q int64 [N, 64]; bits int32 [N, 10] (coef_bits, all 0 for an image that is
    not smoothed); rows [N, BH, 5] from smooth_rows; wib [N].  Returns a new int16 canvas.
    The nine AC predictions and the DC's are one matrix product over the 5x5 DC
    neighbourhoods and one batch of elementwise steps, not a loop of small ops."""
    n, bh, bw, _ = coef.shape
    dev = coef.device
    dc = coef[..., 0].to(torch.int64)
    r = rows.reshape(n, bh * 5, 1).expand(n, bh * 5, bw)
    d = dc.to(torch.float64).gather(1, r).reshape(n, bh, 5, bw)
    cols = torch.arange(bw, device=dev)[:, None] + torch.arange(-2, 3, device=dev)[None, :]
    cols = torch.minimum(cols.clamp(min=0)[None], (wib - 1).clamp(min=0)[:, None, None])
    d = d.gather(3, cols.reshape(n, 1, 1, bw * 5).expand(n, bh, 5, bw * 5)).reshape(n, bh, 5, bw, 5)
    d = d.permute(0, 1, 3, 2, 4).reshape(n, bh, bw, 25)
    sums = torch.matmul(d, constant("smooth_w", dev, lambda: _W)).to(torch.int64)          # [N, BH, BW, 19]
    change_dc = (bits[:, 1:10] == -1).all(1)[:, None, None, None]
    q00 = q[:, 0][:, None, None, None]
    # where _AC has no rule without DC interpolation, the zero column predicts 0, which
    # leaves the (zero) coefficient as it was: libjpeg skips those positions there
    num = q00 * torch.where(change_dc, sums[..., :9], sums[..., 9:18])
    # device index tensors: a Python list as an index is copied to the device each time
    pos = constant("smooth_pos", dev, lambda: torch.tensor(_POS))
    al = bits[:, constant("smooth_k", dev, lambda: torch.tensor(_K))].to(torch.int64)[:, None, None, :]
    pred = _pred(num, q[:, pos][:, None, None, :], al)
    ac = coef[..., pos].to(torch.int64)
    take = (al != 0) & (ac == 0)
    out = coef.clone()
    out[..., pos] = torch.where(take, pred, ac).to(torch.int16)
    dc_pred = _pred(q00[..., 0] * sums[..., 18], q00[..., 0], None)
    out[..., 0] = torch.where(change_dc[..., 0], dc_pred, dc).to(torch.int16)
    return out


def _edge_pad(x: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Each image's samples beyond (w, h) replaced by its last column / row."""
    n, hh, ww = x.shape
    dev = x.device
    ci = torch.minimum(torch.arange(ww, device=dev)[None], (w - 1)[:, None])
    x = x.gather(2, ci[:, None, :].expand(n, hh, ww))
    ri = torch.minimum(torch.arange(hh, device=dev)[None], (h - 1)[:, None])
    return x.gather(1, ri[:, :, None].expand(n, hh, ww))


def _shift(x: torch.Tensor, dim: int, step: int) -> torch.Tensor:
    """x moved one sample along dim (step -1: each gets its predecessor), edges repeated."""
    n = x.shape[dim]
    if step < 0:
        return torch.cat([x.narrow(dim, 0, 1), x.narrow(dim, 0, n - 1)], dim)
    return torch.cat([x.narrow(dim, 1, n - 1), x.narrow(dim, n - 1, 1)], dim)


def _interleave(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    s = torch.stack([a, b], dim + 1)
    shape = list(a.shape)
    shape[dim] *= 2
    return s.reshape(shape)


def upsample(x: torch.Tensor, hf: int, vf: int, fancy: bool) -> torch.Tensor:
    """[N, H, W] samples -> int16 [N, H * vf, W * hf], as jdsample.c picks: fancy (triangle)
    filters for 2x1, 1x2 and 2x2, replication otherwise.  int16 holds every intermediate
    (at most 16 x 255 + 8) at half int32's memory traffic."""
    if hf == 1 and vf == 1:
        return x
    x = x.to(torch.int16)
    if fancy and (hf, vf) == (2, 1):
        return _interleave((3 * x + _shift(x, 2, -1) + 1) >> 2, (3 * x + _shift(x, 2, 1) + 2) >> 2, 2)
    if fancy and (hf, vf) == (1, 2):
        return _interleave((3 * x + _shift(x, 1, -1) + 1) >> 2, (3 * x + _shift(x, 1, 1) + 2) >> 2, 1)
    if fancy and (hf, vf) == (2, 2):
        x3 = 3 * x
        halves = []
        for cs in (x3 + _shift(x, 1, -1), x3 + _shift(x, 1, 1)):
            cs3 = 3 * cs
            halves.append(_interleave((cs3 + _shift(cs, 2, -1) + 8) >> 4,
                                      (cs3 + _shift(cs, 2, 1) + 7) >> 4, 2))
        return _interleave(halves[0], halves[1], 1)
    return x.repeat_interleave(vf, 1).repeat_interleave(hf, 2)


def _ycc_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """jdcolor.c's tables, indexed by sample: Cr's red offset, Cb's blue offset, and
    (Cb << 8 | Cr)'s green offset (its two products summed before the shift)."""
    x = torch.arange(256, dtype=torch.int64) - 128
    r = (CR_R * x + 32768) >> 16
    b = (CB_B * x + 32768) >> 16
    g = ((-CB_G * x + 32768)[:, None] - CR_G * x[None, :]) >> 16
    return r.to(torch.int16), b.to(torch.int16), g.reshape(-1).to(torch.int16)


_TAB_R, _TAB_B, _TAB_G = _ycc_tables()


def ycc_to_rgb(y: torch.Tensor, cb: torch.Tensor, cr: torch.Tensor) -> torch.Tensor:
    """jdcolor.c's fixed-point conversion, as its table lookups: [N, H, W] planes of
    samples (0..255, any integer type) in, uint8 [N, 3, H, W] out, each channel written
    into it as it is computed (int16 offsets, so a third of the bytes of computing it)."""
    dev = y.device
    out = torch.empty((y.shape[0], 3) + tuple(y.shape[1:]), dtype=torch.uint8, device=dev)
    cb = cb.to(torch.int32).reshape(-1)
    cr = cr.to(torch.int32).reshape(-1)
    for ch, name, tab in ((0, "ycc_r", _TAB_R), (2, "ycc_b", _TAB_B), (1, "ycc_g", _TAB_G)):
        idx = cr if ch == 0 else cb if ch == 2 else cb.bitwise_left_shift_(8).bitwise_or_(cr)
        off = constant(name, dev, lambda tab=tab: tab).index_select(0, idx).view(y.shape)
        out[:, ch] = off.add_(y).clamp_(0, 255)
    return out
