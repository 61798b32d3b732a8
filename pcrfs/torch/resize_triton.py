"""RandomResizedCrop's crop, resize and flip for a batch in one Triton kernel.

crop_resize.resized_crops' matrix products weigh every sample of a canvas, though each
output sample has only a few taps (about 2 x the scale + 1 a side): over a padded canvas
of 256 ImageNet-sized images that is ~100 GFLOP and ~2 GB of float temporaries.  Here
each output pixel sums only its taps, read from the uint8 canvas where the box is,
against the same weights (crop_resize.aa_taps, ATen's antialiased bilinear filter),
and is rounded (half to even, as torch rounds) and stored as uint8: the box's samples
are read once and nothing but the output is written.  It runs on CUDA tensors, and with
TRITON_INTERPRET=1 on CPU ones (the tests)."""
from __future__ import annotations

import functools

import torch

from pcrfs.torch.transfer import upload_together

BLOCK = 64


@functools.cache
def kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def resize(src, loy, wy, lox, wx, dst, C, H, W, S, KY, KX, BLOCK: tl.constexpr):
        """Output row oy of channel c of image n (program 0's id: (n * C + c) * S + oy),
        columns [program 1's id * BLOCK, +BLOCK): the sum over its KY x KX taps of
        src [N, C, H, W] at rows loy[n, oy] + ky, columns lox[n, ox] + kx, weighted by
        wy[n, oy, ky] * wx[n, ox, kx] (zero past each sample's own taps)."""
        row = tl.program_id(0).to(tl.int64)
        oy = row % S
        nc = row // S
        n = nc // C
        ox = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = ox < S
        x0 = tl.load(lox + n * S + ox, mask=ok, other=0)
        y0 = tl.load(loy + n * S + oy)
        plane = src + nc * H * W
        acc = tl.full([BLOCK], 0.0, tl.float32)
        for ky in range(0, KY):
            y = y0 + ky
            a = tl.load(wy + (n * S + oy) * KY + ky)
            line = tl.full([BLOCK], 0.0, tl.float32)
            for kx in range(0, KX):
                x = x0 + kx
                b = tl.load(wx + (n * S + ox) * KX + kx, mask=ok, other=0.0)
                v = tl.load(plane + y * W + x, mask=ok & (x < W) & (y < H), other=0).to(tl.float32)
                line += b * v
            acc += a * line
        # torch's round: half to even
        f = tl.floor(acc + 0.5)
        f = tl.where(((f - acc) == 0.5) & (f - 2 * tl.floor(f * 0.5) != 0), f - 1, f)
        f = tl.minimum(tl.maximum(f, 0.0), 255.0)
        tl.store(dst + (nc * S + oy) * S + ox, f.to(tl.uint8), mask=ok)

    return resize


def compiled(arch: int):
    """The kernel lowered for sm_<arch> (triton_ops.lower), as a GPU runs it."""
    from pcrfs.torch.triton_ops import lower
    sig = {"src": "*u8", "loy": "*i64", "wy": "*fp32", "lox": "*i64", "wx": "*fp32", "dst": "*u8", "C": "i32",
           "H": "i32", "W": "i32", "S": "i32", "KY": "i32", "KX": "i32", "BLOCK": "constexpr"}
    return lower(kernel(), sig, {"BLOCK": BLOCK}, arch, 4)


def resized_crops(canvas: torch.Tensor, loy: torch.Tensor, wy: torch.Tensor, lox: torch.Tensor,
                  wx: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [N, C, size, size] from canvas uint8 [N, C, H, W] and each output row's and
    column's taps, numpy on the host (crop_resize.aa_taps: int64 [N, size] first samples,
    float32 [N, size, K] weights; columns already mirrored where flipped): one upload and
    one launch."""
    n, c, h, w = canvas.shape
    out = torch.empty((n, c, size, size), dtype=torch.uint8, device=canvas.device)
    if out.numel() == 0:
        return out
    loy, wy, lox, wx = upload_together([loy, wy, lox, wx], canvas.device)    # made on the host
    grid = (n * c * size, -(-size // BLOCK))
    kernel()[grid](canvas.contiguous(), loy, wy, lox, wx, out, c, h, w, size, wy.shape[2], wx.shape[2],
                   BLOCK=BLOCK)
    return out
