"""decode_jpeg: a batch of JPEGs (any q view's files, plain JPEGs) to uint8 CHW tensors,
with the pixels Pillow gives.

The steps, per batch:
1. headers in C (pcrfs.jpeg.parse), in threads that release the GIL;
2. entropy decoding: on CUDA, every restart interval of every scan of every image is a
   Triton program (pcrfs.torch.jpeg_triton), one launch per scan position; an image
   without restart markers is entropy-decoded by C on CPU threads instead (the "hybrid"
   path, as nvJPEG does for progressive files); on the CPU, C does it all;
3. block smoothing (incomplete progressive views), dequantisation, islow IDCT, fancy
   upsampling and YCbCr->RGB, batched over mixed sizes (pcrfs.torch.jpeg_pixels).
CMYK/YCCK, 12-bit, arithmetic-coded and other JPEGs this decoder does not take are decoded
by Pillow ("fallback").  `stats` counts each path.  On CUDA a batch runs on the decoder's
own stream, which the caller's stream then waits for; its canvases are capped at
CANVAS_PIXELS, so its work space does not grow with the batch.

A damaged image costs only itself: DecodeError names its index, or with on_error="none"
its slot is None and the rest decode."""
from __future__ import annotations

import io
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from pcrfs import jpeg as cjpeg
from pcrfs.torch import jpeg_pixels as px
from pcrfs.torch import pixels_triton as pxk
from pcrfs.torch.transfer import upload

stats: Counter = Counter()   # images by path, intervals on the GPU, errors
_POOL: ThreadPoolExecutor | None = None


class DecodeError(ValueError):
    def __init__(self, index: int, reason: str):
        self.index = index
        self.reason = reason
        super().__init__(f"image {index} of the batch: {reason}")


def _threads() -> int:
    """The CPUs this process may run on (a job pinned to some cores gets that many)."""
    try:
        return max(1, min(32, len(os.sched_getaffinity(0))))
    except AttributeError:   # not Linux
        return max(1, min(32, os.cpu_count() or 1))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(_threads(), thread_name_prefix="pcrfs-jpeg")
    return _POOL


def _map(fn, items):
    """[fn(x) for x in items] in the pool, a few slices per thread: a future per item cost
    more GIL-held time than a parse's C part."""
    items = list(items)
    if len(items) <= 2:
        return [fn(x) for x in items]
    size = -(-len(items) // (4 * _threads()))
    parts = [items[i: i + size] for i in range(0, len(items), size)]
    return [r for part in _pool().map(lambda xs: [fn(x) for x in xs], parts) for r in part]


def _parse(blob):
    try:
        return cjpeg.parse(blob)
    except cjpeg.JpegError as e:
        return e


def _pillow(blob, mode: str) -> torch.Tensor:
    from PIL import Image
    with Image.open(io.BytesIO(bytes(blob))) as im:
        if mode == "rgb" and im.mode != "RGB":
            im = im.convert("RGB")
        a = np.asarray(im)
    if a.ndim == 2:
        a = a[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))


def _gpu_entropy(p: cjpeg.Parsed) -> bool:
    """Restart-marked images (or ones small enough that one interval is no hardship)."""
    return p.restart_scans > 0 or len(p.data) <= 8192


def _coefficients(parsed: list, device: torch.device, backend: str,
                  timings: list | None = None, deferred: bool = False, wins: list | None = None) -> tuple:
    """int16 [sum of blocks + 1, 64] on device (the last block zero), each image's first
    block, and the errors found (index in `parsed` -> reason).  deferred: a fourth item, a
    function giving the GPU kernel's errors when called (the host queues the pixel stage
    first and waits for the entropy stage only then); the third has the CPU's alone.
    wins: per image None or its _window: the GPU kernel decodes only the intervals those
    MCU rows need (the C decoder decodes whole images)."""
    use_kernel = backend == "triton" or (backend == "auto" and device.type == "cuda")
    on_gpu = [i for i, p in enumerate(parsed) if use_kernel and _gpu_entropy(p)]
    on_cpu = sorted(set(range(len(parsed))) - set(on_gpu))
    # the CPU-decoded images' blocks first, so only they cross to the device
    firsts, total = [0] * len(parsed), 0
    for i in on_cpu + on_gpu:
        firsts[i] = total
        total += parsed[i].total_blocks
    cpu_blocks = sum(parsed[i].total_blocks for i in on_cpu)
    # one zero block past the end: the canvases' padding reads it
    coefs = torch.empty((total + 1, 64), dtype=torch.int16, device=device)
    coefs[cpu_blocks:].zero_()
    # The C decoder writes straight into coefs on the CPU; for a GPU, into a pinned
    # staging buffer (torch's caching host allocator), uploaded without a pageable copy.
    # Each thread zeroes its own image's blocks (numpy fills without the GIL).
    cuda = device.type == "cuda"
    staged = torch.empty((cpu_blocks, 64), dtype=torch.int16, pin_memory=bool(cpu_blocks)) if cuda \
        else coefs[:cpu_blocks]
    host = staged.numpy()
    errors: dict = {}

    def cpu(i):
        p = parsed[i]
        out = host[firsts[i]: firsts[i] + p.total_blocks]
        out.fill(0)
        try:
            cjpeg.entropy_decode(p, out=out)
        except cjpeg.JpegError as e:
            errors[i] = e.reason
    _map(cpu, on_cpu)
    if cuda and cpu_blocks:
        coefs[:cpu_blocks].copy_(staged, non_blocking=True)
    if on_gpu:
        from pcrfs.torch import jpeg_triton
        rows = None if wins is None else np.array(
            [(0, parsed[i].mcuy) if wins[i] is None else wins[i][:2] for i in on_gpu], np.int64)
        pending = jpeg_triton.entropy_decode([parsed[i] for i in on_gpu], [firsts[i] for i in on_gpu],
                                             coefs, timings, deferred=True, windows=rows)
        stats["gpu_entropy_images"] += len(on_gpu)
        stats["gpu_intervals"] += sum(len(parsed[i].intervals) for i in on_gpu)
    if device.type == "cuda":
        stats["hybrid_images"] += len(on_cpu)
    else:
        stats["cpu_images"] += len(on_cpu)

    def gpu_errors() -> dict:
        return {on_gpu[j]: reason for j, reason in pending().items()} if on_gpu else {}
    if deferred:
        return coefs, firsts, errors, gpu_errors
    errors.update(gpu_errors())
    return coefs, firsts, errors


def _group_key(p: cjpeg.Parsed) -> tuple:
    return (p.color, p.h, p.v, tuple(d > 2 for d in p.dw))   # dw > 2: jdsample's fancy rule


# a scan script's coef_bits, by script: a batch of one view shares one script
_SCRIPT = [cjpeg.S[k] for k in ("kind", "ncomp", "comp0", "comp1", "comp2", "comp3", "Ss", "Se", "Al")]
_BITS: dict = {}


def _smoothing(p: cjpeg.Parsed) -> np.ndarray | None:
    """coef_bits[:, :10] where libjpeg would smooth this image, else None."""
    if not p.progressive:
        return None
    key = (p.ncomp, p.scans[:, _SCRIPT].tobytes())
    bits = _BITS.get(key)
    if bits is None:
        bits = p.coef_bits()[:, :10]
        if len(_BITS) < 256:
            _BITS[key] = bits
    if ((bits[:, 0] < 0).any() or (p.qt[:, cjpeg.ZIGZAG[:10]] == 0).any()
            or not (bits[:, 1:] != 0).any()):
        return None
    return bits


def _canvas(coefs: torch.Tensor, g: torch.Tensor, bh: int, bw: int, zero: int) -> torch.Tensor:
    """int16 [N, bh, bw, 64]: each image's blocks of one component at the canvas's top
    left (g: its _pixels geometry rows), the zero block where the image has none."""
    dev = coefs.device
    ys = torch.arange(bh, device=dev)[None, :, None]
    xs = torch.arange(bw, device=dev)[None, None, :]
    rows_n, cols_n = g[:, _BH, None, None], g[:, _BW, None, None]
    idx = torch.where((ys < rows_n) & (xs < cols_n), g[:, _BASE, None, None] + ys * g[:, _STRIDE, None, None]
                      + xs, zero)
    return coefs[idx]


# per image and component, the columns of _pixels' one upload: the first block, the
# blocks (rows, columns), the blocks and samples covering the image (or its window),
# the iMCU's block rows, and the blocks from one row to the next
_BASE, _BH, _BW, _WIB, _HIB, _V, _DW, _DH, _STRIDE = range(9)


def _window(p: cjpeg.Parsed, box) -> tuple | None:
    """(MCU rows r0, r1, MCU columns c0, c1) whose blocks give the pixels of box (top,
    left, height, width) exactly: the box's MCUs and a margin around them as wide as the
    reach of the steps after the IDCT (the upsampler reads one sample further, so one
    block of a subsampled component; block smoothing reads two blocks each way, and the
    blocks the upsampler reads must be smoothed right too).  Past the margin the blocks
    are left out; the margin's own pixels are not exact.  None: the whole image."""
    if box is None:
        return None
    top, left, h, w = (int(x) for x in box)
    smooth = 2 if _smoothing(p) is not None else 0
    my = mx = 0
    for c in range(p.ncomp):
        need = smooth + ((p.h[c], p.v[c]) != (p.max_h, p.max_v))
        my, mx = max(my, -(-need // p.v[c])), max(mx, -(-need // p.h[c]))
    mh, mw = 8 * p.max_v, 8 * p.max_h
    top, left = min(max(top, 0), p.height - 1), min(max(left, 0), p.width - 1)
    bottom, right = min(max(top + h, top + 1), p.height), min(max(left + w, left + 1), p.width)
    win = (max(0, top // mh - my), min(p.mcuy, -(-bottom // mh) + my),
           max(0, left // mw - mx), min(p.mcux, -(-right // mw) + mx))
    return None if win == (0, p.mcuy, 0, p.mcux) else win


def _geometry(p: cjpeg.Parsed, win) -> list:
    """_pixels' fields for p's blocks under win (None: all of them), each a tuple over the
    components: the window's blocks as an image of their own, `stride` apart a row."""
    if win is None:
        return [p.coef_offset, p.bh, p.bw, p.wib, p.hib, p.v, p.dw, p.dh, p.bw]
    r0m, r1m, c0m, c1m = win
    out = [[] for _ in range(9)]
    for c in range(p.ncomp):
        r0, r1, c0, c1 = r0m * p.v[c], r1m * p.v[c], c0m * p.h[c], c1m * p.h[c]
        for f, x in zip(out, (p.coef_offset[c] + r0 * p.bw[c] + c0, r1 - r0, c1 - c0,
                              max(min(p.wib[c], c1) - c0, 0), max(min(p.hib[c], r1) - r0, 0), p.v[c],
                              max(min(p.dw[c], 8 * c1) - 8 * c0, 0), max(min(p.dh[c], 8 * r1) - 8 * r0, 0),
                              p.bw[c]), strict=True):
            f.append(x)
    return out


def _extent(p: cjpeg.Parsed, win) -> tuple:
    """(MCU rows, MCU columns, pixel rows, pixel columns, top, left) of p's window."""
    if win is None:
        return p.mcuy, p.mcux, p.height, p.width, 0, 0
    r0, r1, c0, c1 = win
    mh, mw = 8 * p.max_v, 8 * p.max_h
    return (r1 - r0, c1 - c0, min(p.height, r1 * mh) - r0 * mh, min(p.width, c1 * mw) - c0 * mw,
            r0 * mh, c0 * mw)


def _pixels(group: list, parsed: list, coefs: torch.Tensor, firsts: list, mode: str,
            kernels: bool = False, wins: list | None = None) -> torch.Tensor:
    """Decode one group of images sharing a sampling layout into a uint8 [N, C, H, W]
    canvas, each image (or its _window, wins[i] when given) at its top left.  kernels:
    the fused Triton kernels (pcrfs.torch.pixels_triton) for the IDCT and, where they cover the sampling, the
    upsampling and colour; else torch ops.  Both give the same samples.
    The host's part is a few array builds and one upload per canvas: on a GPU it runs under
    the GIL while the device works, so nothing here loops over blocks or rows."""
    dev = coefs.device
    ps = [parsed[i] for i in group]
    n = len(ps)
    p0 = ps[0]
    nc = p0.ncomp
    zero = coefs.shape[0] - 1      # the zero block at the end
    # [component, field, image]: each field's row contiguous, as the kernels read it
    ws = [None] * n if wins is None else [wins[i] for i in group]
    geo = np.array([_geometry(p, w) for p, w in zip(ps, ws, strict=True)],
                   np.int64).reshape(n, 9, nc).transpose(2, 1, 0).copy()
    geo[:, _BASE] += np.asarray([firsts[i] for i in group], np.int64)[None, :]
    bits = [_smoothing(p) for p in ps]
    smoothed = any(b is not None for b in bits)
    qt = np.stack([p.qt for p in ps]).astype(np.int64)
    cb = np.stack([b if b is not None else np.zeros((nc, 10), np.int32) for b in bits]) if smoothed else None
    # one upload for the canvas's tables, sliced on the device
    ext = np.array([_extent(p, w) for p, w in zip(ps, ws, strict=True)], np.int64).T.copy()  # [6, n]
    parts = [geo, qt, ext[2:4]] + ([cb.astype(np.int64), ext[0]] if smoothed else [])
    whole = upload(np.concatenate([a.reshape(-1) for a in parts]), dev)
    at = np.cumsum([0] + [a.size for a in parts])
    geo_t, qt_t, sizes, cb_t, mcuy = ([whole[at[i]:at[i + 1]].view(a.shape) for i, a in enumerate(parts)]
                                      + [None, None])[:5]
    hv = [(p0.max_h // p0.h[c], p0.max_v // p0.v[c]) for c in range(nc)]
    fancy = [p0.dw[c] > 2 or hv[c] == (1, 2) for c in range(nc)]
    # the colour kernel upsamples chroma itself: luma as sampled, both chromas alike
    fused_rgb = (kernels and p0.color == cjpeg.YCC and nc == 3 and hv[0] == (1, 1)
                 and hv[1] == hv[2] and fancy[1] == fancy[2] and pxk.fancy_ok(*hv[1], fancy[1]))
    planes = []
    for c in range(nc):
        g = geo_t[c].t()                                   # [image, field]
        bh, bw = int(geo[c, _BH].max()), int(geo[c, _BW].max())
        if kernels:
            places = (geo_t[c, _BASE], geo_t[c, _BH], geo_t[c, _BW], geo_t[c, _STRIDE])
            if smoothed:
                canvas = pxk.smooth_blocks(coefs, geo_t[c], qt_t[:, c], cb_t[:, c], mcuy, n, bh, bw)
                plane = pxk.idct_plane(canvas, qt_t[:, c], n, bh, bw, places, dense=True)
            else:
                plane = pxk.idct_plane(coefs, qt_t[:, c], n, bh, bw, places)
            if not fused_rgb and hv[c] != (1, 1):
                plane = px.upsample(px._edge_pad(plane, g[:, _DW], g[:, _DH]), *hv[c], fancy=fancy[c])
            planes.append(plane)
            continue
        canvas = _canvas(coefs, g, bh, bw, zero)
        q = qt_t[:, c]
        if smoothed:
            canvas = px.smooth(canvas, q, cb_t[:, c], px.smooth_rows(g[:, _HIB], g[:, _V], mcuy, bh),
                               g[:, _WIB])
        samples = px.idct_islow(canvas.reshape(n, bh, bw, 8, 8),
                                q.to(torch.float64).reshape(n, 1, 1, 8, 8))
        plane = samples.permute(0, 1, 3, 2, 4).reshape(n, bh * 8, bw * 8)     # uint8
        hf, vf = p0.max_h // p0.h[c], p0.max_v // p0.v[c]
        if (hf, vf) != (1, 1):
            plane = px._edge_pad(plane, g[:, _DW], g[:, _DH])
            plane = px.upsample(plane, hf, vf, fancy=p0.dw[c] > 2 or (hf, vf) == (1, 2))
        planes.append(plane)
    if fused_rgb:
        hf, vf = hv[1]
        hmin = min(planes[0].shape[1], planes[1].shape[1] * vf)
        wmin = min(planes[0].shape[2], planes[1].shape[2] * hf)
        return pxk.ycc_to_rgb(*planes, geo_t[1, _DW], geo_t[1, _DH], hf, vf, hmin, wmin, (sizes[0], sizes[1]))
    hmin = min(pl.shape[1] for pl in planes)
    wmin = min(pl.shape[2] for pl in planes)
    planes = [pl[:, :hmin, :wmin] for pl in planes]
    if p0.color == cjpeg.YCC:
        img = px.ycc_to_rgb(*planes)
    else:  # RGB (Adobe transform 0) or grayscale: samples as they are
        img = torch.stack(planes, 1).clamp_(0, 255).to(torch.uint8)
    if img.shape[1] == 1 and mode == "rgb":
        img = img.repeat(1, 3, 1, 1)
    return img


class _Clock:
    """Stage times for decode_jpeg's profile (nothing, and no synchronisation, without one)."""

    def __init__(self, device: torch.device, into: dict | None):
        self.into, self.cuda = into, device.type == "cuda"
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.into is None:
            return
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.into[name] = round(1e3 * (now - self.t), 2)
        self.t = now


# pixels per canvas: the pixel stage's work space grows with its canvas (about 20 bytes a
# pixel at its peak, plus the IDCT's bounded float64 chunk), so a batch of large photos
# is cut into canvases of at most this many (an image larger than it has one of its own)
CANVAS_PIXELS = 1 << 26
# the kernels (pixels_triton) work on each image's own blocks and pixels only, so a
# canvas's padding costs them memory, not traffic: they share canvases more freely (each
# one a few launches fewer), within the pixel cap
KERNEL_WASTE = 3.0


def canvases(members: list, parsed: list, waste: float = 0.3, max_pixels: int | None = None,
             wins: list | None = None) -> list[list]:
    """Split one sampling layout's images into canvases that waste at most `waste` of their
    blocks on padding and hold at most max_pixels (default CANVAS_PIXELS): sorted by block
    rows, then columns, a canvas takes the next image while max rows x max columns x count
    stays within (1 + waste) x their own blocks and within the pixel cap.  wins: each
    image's _window (its size is the window's)."""
    cap = CANVAS_PIXELS if max_pixels is None else max_pixels
    size = {j: _extent(parsed[j], None if wins is None else wins[j])[:2] for j in members}
    order = sorted(members, key=lambda j: size[j])
    out, cur, rows, cols, area = [], [], 0, 0, 0
    for j in order:
        p = parsed[j]
        my, mx = size[j]
        r, c = max(rows, my), max(cols, mx)
        mcu_px = 64 * p.max_h * p.max_v
        if cur and (r * c * (len(cur) + 1) > (1 + waste) * (area + my * mx)
                    or r * c * (len(cur) + 1) * mcu_px > cap):
            out.append(cur)
            cur, r, c, area = [], my, mx, 0
        cur.append(j)
        rows, cols, area = r, c, area + my * mx
    if cur:
        out.append(cur)
    return out


def decode_jpeg(blobs, device="cuda", on_error: str = "raise", mode: str = "unchanged",
                backend: str = "auto", profile: dict | None = None) -> list:
    """JPEG bytes in (a sequence of bytes-like objects), a list of uint8 [C, H, W] tensors on
    `device` out: C is 1 for grayscale, 3 for colour (mode="rgb": always 3, CMYK converted
    as Pillow's .convert("RGB")).  on_error: "raise" (DecodeError naming the first damaged
    image) or "none" (its slot is None).  backend: "auto" (Triton on CUDA, C elsewhere),
    "c" (CPU entropy decoding everywhere) or "triton" (the kernels even on CPU tensors, for
    Triton's interpreter); the pixel stage runs in pcrfs.torch.pixels_triton's kernels on
    CUDA (and with "triton"), in torch ops elsewhere.  profile: a dict to receive each
    stage's milliseconds (parse, entropy and each GPU launch, pixels); it synchronises the
    device between stages."""
    blobs = list(blobs)
    out: list = [None] * len(blobs)
    for members, canvas, sizes, _ in decode_jpeg_canvases(blobs, device, on_error, mode, backend, profile):
        for k, (i, (h, w)) in enumerate(zip(members, sizes, strict=True)):
            out[i] = canvas[k, :, :h, :w]
    return out


def decode_jpeg_canvases(blobs, device="cuda", on_error: str = "raise", mode: str = "unchanged",
                         backend: str = "auto", profile: dict | None = None, boxes=None) -> list:
    """decode_jpeg's images as the batch holds them, before they are cut apart: a list of
    (indices into blobs, uint8 [n, C, H, W] canvas, [(height, width)] per image, [(top,
    left)] per image), each image at its canvas's top left (what a canvas holds past an
    image's own size is unspecified).  A consumer that crops and resizes the whole batch
    (GPUImageFolder) works on these in a few operations per canvas.

    boxes: a function given each image's (height, width) once its header is read (None for
    one that failed), returning per image None or the box (top, left, height, width) it
    will use.  Then only what a box needs is decoded: on the GPU only the restart
    intervals that meet its rows (and the earlier scans' intervals a refinement among
    them reads), and for every image only its blocks under the box and a margin as wide as
    the upsampler's and block smoothing's reach.  Such an image's canvas holds that
    window, whose (top, left) in the image is its fourth item: the box's pixels are
    decode_jpeg's, outside the box they are not.
    The other arguments and the errors are decode_jpeg's; an image left out
    (on_error="none") is in no canvas."""
    if on_error not in ("raise", "none"):
        raise ValueError('on_error: "raise" or "none"')
    if mode not in ("unchanged", "rgb"):
        raise ValueError('mode: "unchanged" or "rgb"')
    device = torch.device(device)
    if device.type != "cuda":
        return _canvases(blobs, device, on_error, mode, backend, profile, boxes)
    # On the decoder's own stream, so its one wait (for the entropy kernels' damage flags)
    # waits for the decode alone, not for the training work queued before it (the decode
    # reads nothing the caller's stream makes: its input is host bytes, so the side stream
    # does not wait for it); the caller's stream then orders its use of the canvases after
    # the decode.
    caller = torch.cuda.current_stream(device)
    side = _stream(device)
    with torch.cuda.stream(side):
        out = _canvases(blobs, device, on_error, mode, backend, profile, boxes)
    caller.wait_stream(side)
    for _, canvas, _, _ in out:
        canvas.record_stream(caller)   # its memory is not reused while the caller's stream reads it
    return out


_STREAMS: dict = {}


def _stream(device: torch.device):
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _STREAMS:
        _STREAMS[i] = torch.cuda.Stream(device=i)
    return _STREAMS[i]


def _canvases(blobs, device: torch.device, on_error: str, mode: str, backend: str,
              profile: dict | None, boxes=None) -> list:
    clock = _Clock(device, profile)
    blobs = list(blobs)
    out: list = []
    errors: dict = {}
    parsed = _map(_parse, blobs)
    clock.lap("parse_ms")
    ok = []
    for i, p in enumerate(parsed):
        if isinstance(p, cjpeg.Parsed) and p.color in (cjpeg.CMYK, cjpeg.YCCK):
            p = cjpeg.Unsupported(0, "CMYK / YCCK")
        if isinstance(p, cjpeg.Unsupported):
            try:
                t = upload(_pillow(blobs[i], mode), device)
                out.append(([i], t[None], [tuple(t.shape[1:])], [(0, 0)]))
                stats["fallback_images"] += 1
            except Exception as e:  # Pillow's reasons: OSError, SyntaxError, ValueError...
                errors[i] = f"{p.reason}; Pillow: {e}"
        elif isinstance(p, cjpeg.JpegError):
            errors[i] = p.reason
        else:
            ok.append(i)
    wins = None
    if boxes is not None:
        sizes = {i: (parsed[i].height, parsed[i].width) for i in ok}
        sizes.update({i: tuple(c.shape[2:]) for idx, c, _, _ in out for i in idx})   # Pillow's
        drawn = list(boxes([sizes.get(i) for i in range(len(blobs))]))
        if len(drawn) != len(blobs):
            raise ValueError(f"boxes gave {len(drawn)} boxes for {len(blobs)} images")
        wins = [_window(parsed[i], drawn[i]) for i in ok]
    if ok:
        launches = [] if profile is not None else None
        coefs, firsts, bad, later = _coefficients([parsed[i] for i in ok], device, backend, launches,
                                                  deferred=True, wins=wins)
        clock.lap("entropy_ms")
        good = [j for j in range(len(ok)) if j not in bad]
        sub = [parsed[i] for i in ok]
        kernels = backend == "triton" or device.type == "cuda"

        def pixels(members):
            groups: dict = {}
            for j in members:
                groups.setdefault(_group_key(sub[j]), []).append(j)
            return [(chunk, _pixels(chunk, sub, coefs, firsts, mode, kernels, wins))
                    for m in groups.values()
                    for chunk in canvases(m, sub, KERNEL_WASTE if kernels else 0.3, wins=wins)]
        # the pixel stage is queued before the GPU's damage flags are read; a canvas holding
        # a damaged image (its samples are its own, the others' intact) is made again
        # without it, which only damage costs
        made = pixels(good)
        bad.update(later())
        hit = [chunk for chunk, _ in made if not bad.keys().isdisjoint(chunk)]
        if hit:
            made = [m for m in made if m[0] not in hit] + pixels(
                [j for chunk in hit for j in chunk if j not in bad])
        for j, reason in bad.items():
            errors[ok[j]] = reason
        for chunk, canvas in made:
            ext = [_extent(sub[j], None if wins is None else wins[j]) for j in chunk]
            out.append(([ok[j] for j in chunk], canvas, [e[2:4] for e in ext], [e[4:] for e in ext]))
        clock.lap("pixels_ms")
        if profile is not None:
            profile["entropy_ms_by_scan_position"] = [round(x, 3) for x in launches]
            profile["intervals"] = int(sum(len(p.intervals) for p in sub))
    stats["errors"] += len(errors)
    if errors and on_error == "raise":
        i = min(errors)
        raise DecodeError(i, errors[i])
    return out
