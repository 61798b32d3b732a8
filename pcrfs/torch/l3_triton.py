"""The L3 decoder as one Triton kernel, the paper's own GPU scheme: a program per patch of
a channel, a lane per column, rows in sequence inside the program.  The tensor decoder in
pcrfs.torch.l3 issues some forty small kernels per row of patches and is bound by their
launches; this one is launched once per batch and writes every pixel straight into the
output layout, so no reshape pass follows.

The row above is read back from the output (it was just written there, and the cache
holds it) after a barrier, since a lane needs its neighbours' pixels.  Damage is found
exactly as in the tensor decoder: a row's nbit above 8 or a row that overruns its patch,
and a patch whose rows do not end where its size says; every load is clamped or masked to
the buffer.

Triton is imported on first use, so importing pcrfs.torch.l3 needs none.  With
TRITON_INTERPRET=1 set before that first use, the kernel runs on CPU tensors in Triton's
interpreter, which is how the test suite checks it on a machine without a GPU."""
from __future__ import annotations

import functools

import numpy as np
import torch


@functools.cache
def kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def l3_rows(data, starts, ends, widths, heights, origins, row_strides, out, bad_out, limit,
                COL: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        off = tl.load(starts + pid)
        end = tl.load(ends + pid)
        w = tl.load(widths + pid)
        h = tl.load(heights + pid)
        origin = tl.load(origins + pid)
        rs = tl.load(row_strides + pid)
        cols = tl.arange(0, BLOCK)
        inside = cols < w
        left = inside & (cols >= 1)
        right = (cols + 1) < w
        bad = tl.full([], 0, tl.int32)
        for r in range(0, h):
            o = tl.minimum(off, limit)
            b0 = tl.load(data + o).to(tl.int32)
            b1 = tl.load(data + o + 1).to(tl.int32)
            nbit = b0 & 0xF
            base = (b0 >> 4) | ((b1 & 0xF) << 4)
            base = tl.where(base > 127, base - 256, base)
            bitpos = off * 8 + 12 + cols * nbit
            byte = tl.minimum(bitpos >> 3, limit)
            v = (tl.load(data + byte, mask=inside, other=0).to(tl.int32)
                 | (tl.load(data + byte + 1, mask=inside, other=0).to(tl.int32) << 8))
            delta = (v >> (bitpos & 7).to(tl.int32)) & ((1 << nbit) - 1)
            row = out + origin + r * rs
            above = row - rs
            has = r > 0
            a = tl.load(above + (cols - 1) * COL, mask=left & has, other=0).to(tl.int32)
            b = tl.load(above + cols * COL, mask=inside & has, other=0).to(tl.int32)
            c = tl.load(above + (cols + 1) * COL, mask=right & has, other=0).to(tl.int32)
            # the reference's custom Paeth (pcrfs.torch.l3._predict), whole row at once
            pa = tl.abs(c - b)
            pb = tl.abs(a + c - 2 * b)
            pc = tl.abs(a - b)
            if_a0 = tl.where(pb <= pc, b, c)
            if_c0 = tl.where(pa <= pb, a, b)
            other_ = tl.where((pa <= pb) & (pa <= pc), a, tl.where(pa <= pc, b, c))
            pred = tl.where(a == 0, if_a0, tl.where(c == 0, if_c0, other_))
            cur = (delta + base + pred) & 0xFF
            tl.store(row + cols * COL, cur.to(tl.uint8), mask=inside)
            tl.debug_barrier()  # the next row reads this one's neighbours
            rb = (12 + w * nbit + 7) // 8
            bad = bad | ((nbit > 8) | (off + rb > end)).to(tl.int32)
            off = off + rb
        bad = bad | (off != end).to(tl.int32)
        tl.store(bad_out + pid, bad)

    return l3_rows


@functools.lru_cache(maxsize=256)
def _corners(hdr, px: int, py: int, layout: str) -> np.ndarray:
    """Each patch's top-left element within its image (R, G, B patches in turn)."""
    n, w, h = hdr.patch, hdr.width, hdr.height
    corner = ((np.arange(py) * n)[:, None] * w + (np.arange(px) * n)[None, :]).ravel()
    if layout == "NCHW":
        return np.concatenate([ch * w * h + corner for ch in range(3)])
    return np.concatenate([3 * corner + ch for ch in range(3)])


def output_table(heads, layout: str) -> tuple[np.ndarray, np.ndarray, list[int], int]:
    """Per patch (R patches, then G, then B, image after image): the element offset of its
    top-left pixel in one flat buffer holding the images one after another in `layout`, and
    its row stride; each image's first element, and the buffer's size."""
    sizes = np.fromiter((3 * hdr.width * hdr.height for hdr, *_ in heads), np.int64, len(heads))
    firsts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    counts = np.fromiter((3 * np_ for *_, np_ in heads), np.int64, len(heads))
    corners = np.concatenate([_corners(hdr, px, py, layout) for hdr, px, py, _ in heads])
    widths = np.fromiter((hdr.width for hdr, *_ in heads), np.int64, len(heads))
    strides = np.repeat(widths if layout == "NCHW" else 3 * widths, counts)
    return np.repeat(firsts, counts) + corners, strides, firsts.tolist(), int(sizes.sum())


def decode(data: torch.Tensor, limit: int, starts: np.ndarray, sizes: np.ndarray, ws: np.ndarray,
           hs: np.ndarray, heads, layout: str, nmax: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Launch over every patch; returns the flat output, the per-patch damage flags and
    each image's first element.  `data` is the batch's bytes (uint8) on the device."""
    device = data.device
    origins, strides, firsts, total = output_table(heads, layout)
    out = torch.empty(total, dtype=torch.uint8, device=device)
    t = len(starts)
    bad = torch.zeros(t, dtype=torch.int32, device=device)

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a, np.int64)).to(device)
    block = max(16, 1 << (nmax - 1).bit_length())
    kernel()[(t,)](data, dev(starts), dev(starts + sizes), dev(ws), dev(hs), dev(origins), dev(strides),
                   out, bad, limit, COL=1 if layout == "NCHW" else 3, BLOCK=block,
                   num_warps=max(1, min(4, block // 32)))
    return out, bad, firsts
