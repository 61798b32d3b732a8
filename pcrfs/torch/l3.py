"""Batched L3 decoding with tensor operations, the paper's parallel scheme: every patch of
every channel of every image at once, every pixel of a row at once, rows in sequence.

It runs wherever torch does (CUDA when present, CPU in tests) and returns exactly the C
decoder's pixels.  Headers and patch-size tables are validated on the CPU by the C code
first; row-level damage (bad nbit, rows that overrun their patch) is detected on the device
and reported after the loop, with every gather index clamped so it never reads out of
bounds."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

import pcrfs.l3 as l3

_PAD = 16  # bytes after the data so two-byte gathers never leave the buffer


def _patch_table(blobs: Sequence[bytes]):
    """Per patch: start byte, size, width, height, and where it lands."""
    starts, sizes, ws, hs, heads = [], [], [], [], []
    base = 0
    for blob in blobs:
        h = l3.info(blob)
        n = h.patch
        px, py = -(-h.width // n), -(-h.height // n)
        np_ = px * py
        table = np.frombuffer(blob, "<u2", 3 * np_, l3.HEADER_SIZE).astype(np.int64)
        start = base + l3.HEADER_SIZE + 6 * np_ + np.concatenate(([0], np.cumsum(table)[:-1]))
        xs = np.arange(px) * n
        ys = np.arange(py) * n
        w = np.minimum(n, h.width - xs)[None, :].repeat(py, 0).ravel()
        hh = np.minimum(n, h.height - ys)[:, None].repeat(px, 1).ravel()
        starts.append(start)
        sizes.append(table)
        ws.append(np.tile(w, 3))
        hs.append(np.tile(hh, 3))
        heads.append((h, px, py, np_))
        base += len(blob)
    return (np.concatenate(starts), np.concatenate(sizes), np.concatenate(ws),
            np.concatenate(hs), heads)


def _predict(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The reference's custom Paeth on whole rows (int16 tensors)."""
    p = a + c - b
    pa, pb, pc = (p - a).abs(), (p - b).abs(), (p - c).abs()
    if_a0 = torch.where(pb <= pc, b, c)
    if_c0 = torch.where(pa <= pb, a, b)
    other = torch.where((pa <= pb) & (pa <= pc), a, torch.where(pa <= pc, b, c))
    return torch.where(a == 0, if_a0, torch.where(c == 0, if_c0, other))


def decode_batch(blobs: Sequence[bytes], device: str | torch.device = "cpu",
                 layout: str = "NCHW") -> torch.Tensor | list[torch.Tensor]:
    """Decode L3 files on `device`.  Returns one uint8 tensor (N,3,H,W) or (N,H,W,3) when
    every image has the same size, else a list of (3,H,W) / (H,W,3) tensors.
    Raises pcrfs.l3.L3Error for any malformed input."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', not {layout!r}")
    if not blobs:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8, device=device)
    device = torch.device(device)
    starts, sizes, ws, hs, heads = _patch_table(blobs)
    nmax = max(h.patch for h, *_ in heads)
    total = sum(len(b) for b in blobs)
    buf = np.zeros(total + _PAD, np.uint8)
    pos = 0
    for b in blobs:
        buf[pos : pos + len(b)] = np.frombuffer(b, np.uint8)
        pos += len(b)
    data = torch.from_numpy(buf).to(device).to(torch.int32)
    limit = total + _PAD - 2

    off = torch.from_numpy(starts).to(device)
    end = off + torch.from_numpy(sizes).to(device)
    w = torch.from_numpy(ws).to(device)
    h = torch.from_numpy(hs).to(device)
    t = off.numel()
    cols = torch.arange(nmax, device=device)
    in_patch = cols[None, :] < w[:, None]
    prev = torch.zeros((t, nmax + 2), dtype=torch.int16, device=device)
    out = torch.zeros((t, nmax, nmax), dtype=torch.uint8, device=device)
    bad = torch.zeros(t, dtype=torch.bool, device=device)

    for r in range(int(hs.max())):
        active = h > r
        b0 = data[off.clamp(max=limit)]
        b1 = data[(off + 1).clamp(max=limit)]
        nbit = b0 & 0xF
        base = ((b0 >> 4) | ((b1 & 0xF) << 4)).to(torch.int16)
        base = torch.where(base > 127, base - 256, base)
        bitpos = off[:, None] * 8 + 12 + cols[None, :] * nbit[:, None]
        byte = (bitpos >> 3).clamp(max=limit)
        v = data[byte] | (data[byte + 1] << 8)
        delta = (v >> (bitpos & 7)) & ((1 << nbit[:, None]) - 1)
        pred = _predict(prev[:, :nmax], prev[:, 1 : nmax + 1], prev[:, 2:])
        cur = (delta.to(torch.int16) + base[:, None] + pred) & 0xFF
        cur = torch.where(in_patch, cur, 0)
        out[:, r, :] = cur.to(torch.uint8)
        prev[:, 1 : nmax + 1] = torch.where(active[:, None], cur, prev[:, 1 : nmax + 1])
        row_bytes = (12 + w * nbit + 7) // 8
        bad |= active & ((nbit > 8) | (off + row_bytes > end))
        off = torch.where(active, off + row_bytes, off)
    bad |= off != end
    if bool(bad.any()):
        first = int(torch.nonzero(bad)[0, 0])
        raise l3.L3Error(l3.lib.PCR_E_CORRUPT, f"patch {first} of the batch")

    images, p0 = [], 0
    for hdr, px, py, np_ in heads:
        n = hdr.patch
        patches = out[p0 : p0 + 3 * np_, :n, :n].reshape(3, py, px, n, n)
        img = patches.permute(0, 1, 3, 2, 4).reshape(3, py * n, px * n)[:, : hdr.height, : hdr.width]
        images.append(img if layout == "NCHW" else img.permute(1, 2, 0))
        p0 += 3 * np_
    if all(i.shape == images[0].shape for i in images):
        return torch.stack(images).contiguous()
    return [i.contiguous() for i in images]
