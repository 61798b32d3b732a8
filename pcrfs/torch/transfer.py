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


def upload_together(arrays: list, device) -> list:
    """numpy arrays on device in one copy: packed (16-byte aligned) into one pinned host
    buffer, uploaded, and viewed back as each array's dtype and shape."""
    import numpy as np
    spans, at = [], 0
    for a in arrays:
        spans.append((at, a.nbytes))
        at += -(-a.nbytes // 16) * 16
    cuda = torch.device(device).type == "cuda"
    buf = torch.empty(max(at, 16), dtype=torch.uint8, pin_memory=cuda)
    host = buf.numpy()
    for a, (o, n) in zip(arrays, spans, strict=True):
        host[o:o + n] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    whole = upload(buf, device)
    return [whole[o:o + n].view(torch.from_numpy(np.empty(0, a.dtype)).dtype).view(a.shape)
            for a, (o, n) in zip(arrays, spans, strict=True)]


def constant(name: str, device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """make() on device, uploaded once per device and kept (never freed, so no later
    allocation can reuse its memory under a stream still reading it)."""
    key = (name, str(torch.device(device)))
    t = _CONSTANTS.get(key)
    if t is None:
        t = _CONSTANTS[key] = upload(make(), device)
    return t
