"""RandomResizedCrop's crop, resize and flip for a whole batch on the device, in a few
operations per canvas instead of several per image.

torchvision resizes each crop with an antialiased bilinear filter (F.interpolate,
antialias=True). That filter is separable, so resizing a crop to size x size is
Wy @ crop @ Wx^T. Wy and Wx are [size, extent] weight matrices, and they can take the
crop's offset into the image too: a canvas of images padded to one extent (what
decode_jpeg's batches are) gets every crop by two batched matrix products. A flip
reverses Wx's rows. The weights follow ATen's antialiased bilinear kernel step for step
(support, centre, truncation, normalisation). Products run in float64, so TF32
settings cannot change them. They can still differ from F.interpolate's float32
rounding, by at most one level after the final rounding."""
from __future__ import annotations

import torch

# float64 temporaries per chunk of a canvas: bounded, however large the images
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


def resized_crops(canvas: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor, size: int) -> torch.Tensor:
    """canvas uint8 [N, C, H, W] (each image at its top left), boxes int64 [N, 4] (top,
    left, height, width), flips bool [N] -> uint8 [N, C, size, size]: each box resized to
    size x size, rounded as torchvision rounds a uint8 resize, and mirrored where flips."""
    n, c, h, w = canvas.shape
    out = torch.empty((n, c, size, size), dtype=torch.uint8, device=canvas.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, c * h * w))
    for a in range(0, n, step):
        b = min(n, a + step)
        bx = boxes[a:b]
        wy = aa_weights(bx[:, 0], bx[:, 2], size, h)
        wx = aa_weights(bx[:, 1], bx[:, 3], size, w)
        wx = torch.where(flips[a:b, None, None], wx.flip(1), wx)
        x = torch.matmul(wy[:, None], canvas[a:b].to(torch.float64))
        x = torch.matmul(x, wx[:, None].transpose(-1, -2))
        out[a:b] = x.round_().clamp_(0, 255).to(torch.uint8)
    return out
