"""Batched L3 decoding with tensor operations, the paper's parallel scheme: every patch of
every channel of every image at once, every pixel of a row at once, rows in sequence.

It runs wherever torch does (CUDA when present, CPU in tests) and returns exactly the C
decoder's pixels.  Headers and patch-size tables are validated on the CPU by the C code
first; row-level damage (bad nbit, rows that overrun their patch) is detected on the device
and reported after the loop, with every gather index clamped so it never reads out of
bounds.  On CUDA with Triton present the row loop is one kernel instead
(pcrfs.torch.l3_triton): same pixels, same errors, no per-row launches."""
from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import pcrfs.l3 as l3

_PAD = 16  # bytes after the data so two-byte gathers never leave the buffer


@functools.lru_cache(maxsize=256)
def _geometry(hdr: l3.L3Info) -> tuple[int, int, np.ndarray, np.ndarray]:
    """patches_x, patches_y, and each patch's width and height (R, G, B patches in turn):
    the same for every image of one header, so a batch of one resolution computes it once."""
    n = hdr.patch
    px, py = -(-hdr.width // n), -(-hdr.height // n)
    w = np.minimum(n, hdr.width - np.arange(px) * n)[None, :].repeat(py, 0).ravel()
    h = np.minimum(n, hdr.height - np.arange(py) * n)[:, None].repeat(px, 1).ravel()
    return px, py, np.tile(w, 3), np.tile(h, 3)


def _patch_table(blobs: Sequence[bytes]):
    """Per patch: start byte, size, width, height; and per image its header and patch grid.
    Python does a header check and a table view per image; the rest is whole-batch numpy."""
    heads, tables, ws, hs = [], [], [], []
    for blob in blobs:
        hdr = l3.info(blob)
        px, py, w, h = _geometry(hdr)
        heads.append((hdr, px, py, px * py))
        tables.append(np.frombuffer(blob, "<u2", 3 * px * py, l3.HEADER_SIZE))
        ws.append(w)
        hs.append(h)
    sizes = np.concatenate(tables).astype(np.int64)
    counts = np.fromiter((3 * np_ for *_, np_ in heads), np.int64, len(heads))
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    lens = np.fromiter(map(len, blobs), np.int64, len(blobs))
    payload = np.concatenate(([0], np.cumsum(lens)[:-1])) + l3.HEADER_SIZE + 2 * counts
    before = np.cumsum(sizes) - sizes                    # exclusive, over the whole batch
    starts = np.repeat(payload, counts) + before - np.repeat(before[first], counts)
    return starts, sizes, np.concatenate(ws), np.concatenate(hs), heads


def _predict(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The reference's custom Paeth on whole rows (int16 tensors)."""
    p = a + c - b
    pa, pb, pc = (p - a).abs(), (p - b).abs(), (p - c).abs()
    if_a0 = torch.where(pb <= pc, b, c)
    if_c0 = torch.where(pa <= pb, a, b)
    other = torch.where((pa <= pb) & (pa <= pc), a, torch.where(pa <= pc, b, c))
    return torch.where(a == 0, if_a0, torch.where(c == 0, if_c0, other))


def _use_triton(backend: str, device: torch.device) -> bool:
    if backend not in ("auto", "tensor", "triton"):
        raise ValueError(f"backend must be 'auto', 'tensor' or 'triton', not {backend!r}")
    if backend == "auto":
        return device.type == "cuda" and importlib.util.find_spec("triton") is not None
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend 'triton' needs a CUDA device (or TRITON_INTERPRET=1, its interpreter)")
    return backend == "triton"


def decode_batch(blobs: Sequence[bytes], device: str | torch.device = "cpu",
                 layout: str = "NCHW", backend: str = "auto") -> torch.Tensor | list[torch.Tensor]:
    """Decode L3 files on `device`.  Returns one uint8 tensor (N,3,H,W) or (N,H,W,3) when
    every image has the same size, else a list of (3,H,W) / (H,W,3) tensors.
    `backend`: "triton" (one kernel; CUDA, or CPU under TRITON_INTERPRET=1), "tensor"
    (torch operations, any device), "auto" (triton on CUDA when importable).
    Raises pcrfs.l3.L3Error for any malformed input."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', not {layout!r}")
    device = torch.device(device)
    triton = _use_triton(backend, device)
    if not blobs:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8, device=device)
    starts, sizes, ws, hs, heads = _patch_table(blobs)
    nmax = max(h.patch for h, *_ in heads)
    total = sum(len(b) for b in blobs)
    limit = total + _PAD - 2
    data = _upload(blobs, total, device)
    if triton:
        return _decode_triton(data, limit, starts, sizes, ws, hs, heads, layout, nmax)
    data = data.to(torch.int32)

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
    _raise_if_bad(bad)

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


_staging = threading.local()
_PARALLEL_COPY = 32 << 20
_COPY_THREADS = min(8, os.cpu_count() or 1)


@functools.cache
def _copiers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="l3-stage")


def _upload(blobs: Sequence[bytes], total: int, device: torch.device) -> torch.Tensor:
    """The blobs back to back, then _PAD zero bytes, as one uint8 tensor on `device`.

    For CUDA they are gathered in a pinned buffer kept per thread (grow-only), so the copy
    to the device runs at full bus speed; a thread's next call may reuse it because every
    call has synchronized on its result before returning.  Large batches are gathered by
    several threads: one core's memcpy is slower than the bus."""
    n = total + _PAD
    if device.type == "cuda":
        host = getattr(_staging, "buf", None)
        if host is not None:
            _staging.done.synchronize()  # the last copy out of it, should that call have failed
        if host is None or host.numel() < n:
            host = _staging.buf = torch.empty(max(n, 1 << 20), dtype=torch.uint8, pin_memory=True)
        arr = host.numpy()
    else:
        host, arr = None, np.empty(n, np.uint8)
    spans, pos = [], 0
    for b in blobs:
        spans.append((pos, b))
        pos += len(b)
    arr[total:n] = 0

    def put(chunk):
        for p, b in chunk:
            arr[p : p + len(b)] = np.frombuffer(b, np.uint8)
    if total >= _PARALLEL_COPY and len(blobs) > 1:
        k = _COPY_THREADS
        list(_copiers().map(put, [spans[i::k] for i in range(k)]))  # one task per thread
    else:
        put(spans)
    if host is None:
        return torch.from_numpy(arr).to(device)
    data = host[:n].to(device, non_blocking=True)
    _staging.done = torch.cuda.Event()
    _staging.done.record(torch.cuda.current_stream(device))  # the stream the copy went on
    return data


def _raise_if_bad(bad: torch.Tensor) -> None:
    if bool(bad.any()):
        first = int(torch.nonzero(bad)[0, 0])
        raise l3.L3Error(l3.lib.PCR_E_CORRUPT, f"patch {first} of the batch")


def _decode_triton(data, limit, starts, sizes, ws, hs, heads, layout, nmax):
    from pcrfs.torch import l3_triton
    out, bad, firsts = l3_triton.decode(data, limit, starts, sizes, ws, hs, heads, layout, nmax)
    _raise_if_bad(bad)
    shapes = [(3, h.height, h.width) if layout == "NCHW" else (h.height, h.width, 3) for h, *_ in heads]
    if all(s == shapes[0] for s in shapes):
        return out.view(len(shapes), *shapes[0])
    return [out[f : f + 3 * h.width * h.height].view(s)
            for f, s, (h, *_) in zip(firsts, shapes, heads, strict=False)]
