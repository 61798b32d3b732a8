"""Host-to-device copies that do not stall the host.

A plain `.to("cuda")` from pageable memory waits for its stream: for everything queued
on it, a training step included, so the host cannot run ahead of the device.  From pinned
memory with non_blocking=True it only queues the copy; torch's caching host allocator
keeps the pinned buffer until the copy is done.  The decode path's uploads and constant
tables go through here; on the CPU both are plain tensors."""
from __future__ import annotations

from collections.abc import Callable

import torch

_CONSTANTS: dict = {}


def upload(x, device) -> torch.Tensor:
    """x (numpy array, list, CPU tensor) on device, queued without waiting."""
    t = torch.as_tensor(x)
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)


ALIGN = 16


def packed(specs: list, pinned: bool) -> tuple:
    """(buffer, spans, host arrays): one uint8 tensor (pinned on a CUDA host, where torch's
    caching host allocator hands it back batch after batch) holding an array per (shape,
    dtype) of specs at ALIGN-aligned offsets; spans are (offset, nbytes, dtype, shape) and
    the host arrays view the buffer, for C or numpy to fill in place.  on_device(buffer,
    spans, device) uploads them in one copy."""
    import numpy as np
    spans, at = [], 0
    for shape, dtype in specs:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        spans.append((at, n, np.dtype(dtype), tuple(shape)))
        at += -(-n // ALIGN) * ALIGN
    buf = torch.empty(max(at, ALIGN), dtype=torch.uint8, pin_memory=pinned)
    host = buf.numpy()
    return buf, spans, [host[o:o + n].view(d).reshape(sh) for o, n, d, sh in spans]


def on_device(buf: torch.Tensor, spans: list, device) -> list:
    """packed's arrays on device: one upload of their buffer, then typed views of it."""
    import numpy as np
    whole = upload(buf, device)
    return [whole[o:o + n].view(torch.from_numpy(np.empty(0, d)).dtype).view(sh) for o, n, d, sh in spans]


def upload_together(arrays: list, device) -> list:
    """numpy arrays on device in one copy (packed, filled, on_device)."""
    buf, spans, host = packed([(a.shape, a.dtype) for a in arrays], torch.device(device).type == "cuda")
    for h, a in zip(host, arrays, strict=True):
        h[...] = a
    return on_device(buf, spans, device)


def constant(name: str, device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """make() on device, uploaded once per device and kept (never freed, so no later
    allocation can reuse its memory under a stream still reading it)."""
    key = (name, str(torch.device(device)))
    t = _CONSTANTS.get(key)
    if t is None:
        t = _CONSTANTS[key] = upload(make(), device)
    return t
