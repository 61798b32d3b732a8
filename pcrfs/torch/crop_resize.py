"""RandomResizedCrop's crop, resize and flip for a whole batch on the device, in a few
operations per canvas instead of several per image.

torchvision resizes each crop with an antialiased bilinear filter (F.interpolate,
antialias=True). That filter is separable, so resizing a crop to size x size is
Wy @ crop @ Wx^T. Wy and Wx are [size, extent] weight matrices, and they can take the
crop's offset into the image too: a canvas of images padded to one extent (what
decode_jpeg's batches are) gets every crop by two batched matrix products. A flip
reverses Wx's rows. The weights follow ATen's antialiased bilinear kernel step for step
(support, centre, truncation, normalisation), in float64. The products run in float32,
as torchvision's resize does (half float64's work and bytes); where torch would run
them in TF32 (torch.backends.cuda.matmul.allow_tf32, or a float32 matmul precision
other than "highest"), in float64, so the setting cannot change them. They can differ
from F.interpolate's own float32 rounding by at most one level after the final
rounding."""
from __future__ import annotations

import numpy as np
import torch

from pcrfs.torch.transfer import upload

# temporaries' elements per chunk of a canvas: bounded, however large the images
_CHUNK_ELEMENTS = 1 << 27


def aa_weights(start: torch.Tensor, length: torch.Tensor, out: int, extent: int) -> torch.Tensor:
    """float64 [N, out, extent]: row i holds the weights of output sample i over the
    input samples, for a crop of `length` samples at `start` (both [N]) resized to `out`,
    as ATen's antialiased bilinear filter (align_corners=False) weighs them."""
    dev = start.device
    length = length.to(torch.float64)[:, None, None]
    scale = length / out
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))
    invscale = torch.where(scale >= 1, 1 / scale, torch.ones_like(scale))
    i = torch.arange(out, device=dev, dtype=torch.float64)[None, :, None]
    center = scale * (i + 0.5)
    lo = (center - support + 0.5).to(torch.int64).clamp(min=0)
    hi = torch.minimum((center + support + 0.5).to(torch.int64), length.to(torch.int64))
    j = torch.arange(extent, device=dev)[None, None, :] - start.to(torch.int64)[:, None, None]
    w = (1 - ((j - center + 0.5) * invscale).abs()).clamp(min=0)
    w = torch.where((j >= lo) & (j < hi), w, torch.zeros_like(w))
    total = w.sum(-1, keepdim=True)
    return w / torch.where(total != 0, total, torch.ones_like(total))


def aa_taps(start, length, out: int) -> tuple:
    """aa_weights' rows as taps, on the host (numpy: no device operations per batch):
    (int64 [N, out] first input sample of each output sample, in the canvas's
    coordinates; float32 [N, out, K] its weights over the K samples from there, zero past
    its own).  The same filter step for step, without the dense [N, out, extent] matrix."""
    start = np.asarray(start, np.int64)
    length = np.asarray(length, np.float64)[:, None, None]
    scale = length / out
    support = np.where(scale >= 1, scale, 1.0)
    invscale = np.where(scale >= 1, 1 / scale, 1.0)
    center = scale * (np.arange(out, dtype=np.float64)[None, :, None] + 0.5)
    lo = np.maximum((center - support + 0.5).astype(np.int64), 0)
    hi = np.minimum((center + support + 0.5).astype(np.int64), length.astype(np.int64))
    k = max(int((hi - lo).max()), 1) if lo.size else 1
    j = lo + np.arange(k)[None, None, :]
    w = np.clip(1 - np.abs((j - center + 0.5) * invscale), 0, None)
    w = np.where(j < hi, w, 0.0)
    total = w.sum(-1, keepdims=True)
    w = w / np.where(total != 0, total, 1.0)
    return lo[:, :, 0] + start[:, None], w.astype(np.float32)


def _dtype(device: torch.device) -> torch.dtype:
    """float32 unless this device's float32 products would be TF32's 10-bit ones."""
    if device.type == "cuda" and (torch.backends.cuda.matmul.allow_tf32
                                  or torch.get_float32_matmul_precision() != "highest"):
        return torch.float64
    return torch.float32


def resized_crops(canvas: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor, size: int,
                  kernel: bool | None = None) -> torch.Tensor:
    """canvas uint8 [N, C, H, W] (each image at its top left), boxes int64 [N, 4] (top,
    left, height, width), flips bool [N] -> uint8 [N, C, size, size]: each box resized to
    size x size, rounded as torchvision rounds a uint8 resize, and mirrored where flips.
    boxes and flips may be on the host (what a loader has): the kernel's taps are made
    there.  kernel: pcrfs.torch.resize_triton's one kernel, each output pixel its taps
    only (default on CUDA), else the two matrix products below."""
    if kernel if kernel is not None else canvas.device.type == "cuda":
        from pcrfs.torch import resize_triton
        bx = np.asarray(boxes.cpu() if isinstance(boxes, torch.Tensor) else boxes, np.int64).reshape(-1, 4)
        fl = np.asarray(flips.cpu() if isinstance(flips, torch.Tensor) else flips, bool).reshape(-1)
        loy, wy = aa_taps(bx[:, 0], bx[:, 2], size)
        lox, wx = aa_taps(bx[:, 1], bx[:, 3], size)
        lox = np.where(fl[:, None], lox[:, ::-1], lox)
        wx = np.where(fl[:, None, None], wx[:, ::-1], wx)
        return resize_triton.resized_crops(canvas, loy, wy, lox, wx, size)
    boxes, flips = (x.to(canvas.device) if isinstance(x, torch.Tensor) else upload(x, canvas.device)
                    for x in (boxes, flips))
    n, c, h, w = canvas.shape
    out = torch.empty((n, c, size, size), dtype=torch.uint8, device=canvas.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, c * h * w))
    dt = _dtype(canvas.device)
    for a in range(0, n, step):
        b = min(n, a + step)
        bx = boxes[a:b]
        wy = aa_weights(bx[:, 0], bx[:, 2], size, h)
        wx = aa_weights(bx[:, 1], bx[:, 3], size, w)
        wx = torch.where(flips[a:b, None, None], wx.flip(1), wx).to(dt)
        x = torch.matmul(wy[:, None].to(dt), canvas[a:b].to(dt))
        x = torch.matmul(x, wx[:, None].transpose(-1, -2))
        out[a:b] = x.round_().clamp_(0, 255).to(torch.uint8)
    return out
