"""Entropy decoding on the GPU: one Triton program per restart interval.

An interval starts with zero DC predictions and no end-of-band run, so every interval of
a scan is independent work.  A scan that reads coefficients an earlier scan writes (a
refinement) runs after it; scans of disjoint coefficients share a launch, so the batch
takes one launch per dependency level (scan_levels: 3 for libjpeg's progressive script),
not one per scan.  The
program is csrc/jpeg_entropy.c step for step (sequential, DC first/refine, AC
first/refine with EOB runs), on the tables and unstuffed bytes the C parser prepared.

Every read of the entropy bytes is masked to the interval (past its end: zeros, and an
interval that needs them is damaged), every coefficient index is clamped to the block,
and every loop is bounded by the scan's band or its MCU count: a damaged interval sets
its flag and decodes nothing outside its own image.

With TRITON_INTERPRET=1 set before first use, the kernel runs on CPU tensors in Triton's
interpreter, which is how the tests check it without a GPU."""
from __future__ import annotations

import functools
import time

import numpy as np
import torch

from pcrfs import jpeg as cjpeg
from pcrfs.torch.transfer import constant, upload

# int64 words per descriptor (csrc/jpeg_decode.h): an interval's (start, end, first MCU,
# MCUs, its scan's row) and a scan's (kind, ncomp, Ss, Se, Al, MCUs per row, then per scan
# component: first block, blocks per row, h, v, DC and AC table offsets); the intervals of
# one scan of one image share its row, so the batch uploads one row per scan, not one per
# interval
NI, NS = cjpeg.IV_WORDS, cjpeg.SCAN_WORDS


@functools.cache
def kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def bits(data, start, end, pos, n):
        """The next n (0..16) bits at bit pos of the interval [start, end), not consumed."""
        byte = start + (pos >> 3)
        b0 = tl.load(data + byte, mask=byte < end, other=0).to(tl.int32)
        b1 = tl.load(data + byte + 1, mask=byte + 1 < end, other=0).to(tl.int32)
        b2 = tl.load(data + byte + 2, mask=byte + 2 < end, other=0).to(tl.int32)
        w = (b0 << 16) | (b1 << 8) | b2
        return ((w << (pos & 7).to(tl.int32)) & 0xFFFFFF) >> (24 - n)

    @triton.jit
    def extend(v, s):
        return tl.where((s > 0) & (v < (1 << tl.maximum(s - 1, 0))), v - (1 << s) + 1, v)

    @triton.jit
    def huff(data, start, end, pos, tables, tb):
        """(symbol, new pos, ok): the 8-bit lookahead, else the canonical code search."""
        peek = bits(data, start, end, pos, 16)
        e = tl.load(tables + tb + (peek >> 8))
        ln = tl.where(e != 0, e >> 8, 9)
        code = peek >> (16 - ln)
        mc = tl.load(tables + tb + 256 + ln)
        while (e == 0) & (code > mc) & (ln < 16):
            ln += 1
            code = peek >> (16 - ln)
            mc = tl.load(tables + tb + 256 + ln)
        slow = tl.load(tables + tb + 292 + ((code + tl.load(tables + tb + 274 + ln)) & 255))
        return tl.where(e != 0, e & 255, slow), pos + ln, (e != 0) | (code <= mc)

    @triton.jit
    def correct(data, start, end, pos, at, c, p1):
        """A nonzero coefficient's correction bit in an AC refinement; the new pos."""
        b = bits(data, start, end, pos, 1)
        if (b != 0) & ((c & p1) == 0):
            tl.store(at, tl.where(c >= 0, c + p1, c - p1).to(tl.int16))
        return pos + 1

    @triton.jit
    def block(data, start, end, pos, tables, dct, act, blk, zz, kind, Ss, Se, Al, pred, eob):
        err = tl.full([], 0, tl.int32)
        if kind <= 1:  # sequential, or DC first
            t, pos, ok = huff(data, start, end, pos, tables, dct)
            err = err | (~ok | (t > 16)).to(tl.int32)
            t = tl.minimum(t, 16)
            pred += extend(bits(data, start, end, pos, t), t)
            pos += t
            tl.store(blk, tl.where(kind == 0, pred, pred << Al).to(tl.int16))
            k = tl.where(kind == 0, 1, 64)
            while k < 64:
                rs, pos, ok = huff(data, start, end, pos, tables, act)
                r = rs >> 4
                s = rs & 15
                kk = k + r
                wrong = (~ok | ((s != 0) & (kk > 63))).to(tl.int32)
                err = err | wrong
                v = extend(bits(data, start, end, pos, s), s)
                pos += s
                if (s != 0) & (wrong == 0):
                    tl.store(blk + tl.load(zz + kk), v.to(tl.int16))
                k = tl.where(s != 0, kk + 1, tl.where(r == 15, k + 16, 64))
                k = tl.where(wrong != 0, 64, k)
        elif kind == 2:  # DC refinement: one bit
            b = bits(data, start, end, pos, 1)
            pos += 1
            if b != 0:
                tl.store(blk, (tl.load(blk).to(tl.int32) | (1 << Al)).to(tl.int16))
        elif kind == 3:  # AC first
            if eob > 0:
                eob -= 1
            else:
                k = Ss
                while k <= Se:
                    rs, pos, ok = huff(data, start, end, pos, tables, act)
                    r = rs >> 4
                    s = rs & 15
                    kk = k + r
                    wrong = (~ok | ((s != 0) & (kk > Se))).to(tl.int32)
                    err = err | wrong
                    n = tl.where(s != 0, s, tl.where(r == 15, 0, r))
                    v = bits(data, start, end, pos, n)
                    pos += n
                    if (s != 0) & (wrong == 0):
                        tl.store(blk + tl.load(zz + kk), (extend(v, s) << Al).to(tl.int16))
                    eob = tl.where((s == 0) & (r != 15), (1 << r) + v - 1, eob)
                    k = tl.where(s != 0, kk + 1, tl.where(r == 15, k + 16, Se + 1))
                    k = tl.where(wrong != 0, Se + 1, k)
        else:  # AC refinement
            p1 = 1 << Al
            k = Ss
            if eob == 0:
                done = tl.full([], 0, tl.int32)
                while (k <= Se) & (done == 0):
                    rs, pos, ok = huff(data, start, end, pos, tables, act)
                    r = rs >> 4
                    s = rs & 15
                    err = err | (~ok | ((s != 0) & (s != 1))).to(tl.int32)
                    n = tl.where(s != 0, 1, tl.where(r == 15, 0, r))
                    v = bits(data, start, end, pos, n)
                    pos += n
                    val = tl.where(v != 0, p1, -p1)
                    if (s == 0) & (r != 15):
                        eob = (1 << r) + v
                        done = done | 1
                    if ok == 0:
                        done = done | 1
                    if done == 0:
                        rr = r
                        going = tl.full([], 1, tl.int32)
                        while (k <= Se) & (going == 1):
                            at = blk + tl.load(zz + k)
                            c = tl.load(at).to(tl.int32)
                            if c != 0:
                                pos = correct(data, start, end, pos, at, c, p1)
                                k += 1
                            else:
                                rr -= 1
                                if rr < 0:
                                    going = going & 0
                                else:
                                    k += 1
                        if s != 0:
                            err = err | (k > Se).to(tl.int32)
                            tl.store(blk + tl.load(zz + tl.minimum(k, 63)), val.to(tl.int16))
                        k += 1
            if eob > 0:
                while k <= Se:
                    at = blk + tl.load(zz + k)
                    c = tl.load(at).to(tl.int32)
                    if c != 0:
                        pos = correct(data, start, end, pos, at, c, p1)
                    k += 1
                eob -= 1
        return pos, pred, eob, err

    # jit functions find their callees among their module's globals, and are built here
    # (not at import) so that TRITON_INTERPRET is read at first use
    globals().update(bits=bits, extend=extend, huff=huff, correct=correct, block=block)

    @triton.jit
    def intervals(data, tables, ivd, scd, coefs, zz, bad, NI: tl.constexpr, NS: tl.constexpr):
        pid = tl.program_id(0)
        iv = ivd + pid * NI
        start = tl.load(iv + 0)
        end = tl.load(iv + 1)
        first = tl.load(iv + 2).to(tl.int32)
        nm = tl.load(iv + 3).to(tl.int32)
        d = scd + tl.load(iv + 4) * NS
        kind = tl.load(d + 0).to(tl.int32)
        ncomp = tl.load(d + 1).to(tl.int32)
        Ss = tl.load(d + 2).to(tl.int32)
        Se = tl.load(d + 3).to(tl.int32)
        Al = tl.load(d + 4).to(tl.int32)
        mpr = tl.load(d + 5).to(tl.int32)
        pos = start * 0
        eob = tl.full([], 0, tl.int32)
        err = tl.full([], 0, tl.int32)
        p0 = tl.full([], 0, tl.int32)
        p1 = tl.full([], 0, tl.int32)
        p2 = tl.full([], 0, tl.int32)
        p3 = tl.full([], 0, tl.int32)
        for m in range(first, first + nm):
            row = m // mpr
            col = m % mpr
            for i in tl.static_range(4):
                if i < ncomp:
                    base = tl.load(d + 6 + 6 * i)
                    bw = tl.load(d + 7 + 6 * i)
                    h = tl.load(d + 8 + 6 * i).to(tl.int32)
                    v = tl.load(d + 9 + 6 * i).to(tl.int32)
                    dct = tl.load(d + 10 + 6 * i)
                    act = tl.load(d + 11 + 6 * i)
                    for y in range(0, v):
                        for x in range(0, h):
                            blk = coefs + (base + (row * v + y) * bw + col * h + x) * 64
                            if i == 0:
                                pos, p0, eob, e = block(data, start, end, pos, tables, dct, act, blk, zz,
                                                        kind, Ss, Se, Al, p0, eob)
                            elif i == 1:
                                pos, p1, eob, e = block(data, start, end, pos, tables, dct, act, blk, zz,
                                                        kind, Ss, Se, Al, p1, eob)
                            elif i == 2:
                                pos, p2, eob, e = block(data, start, end, pos, tables, dct, act, blk, zz,
                                                        kind, Ss, Se, Al, p2, eob)
                            else:
                                pos, p3, eob, e = block(data, start, end, pos, tables, dct, act, blk, zz,
                                                        kind, Ss, Se, Al, p3, eob)
                            err = err | e
        over = (pos > (end - start) * 8).to(tl.int32)
        tl.store(bad + pid, err | over)

    return intervals


@functools.lru_cache(maxsize=256)
def _levels(script: bytes) -> tuple[int, ...]:
    """Each scan's launch level in one image's scan script (rows of (ncomp, comp0..3, Ss,
    Se) as int32 bytes): one more than the latest earlier scan that touches one of its
    coefficients (a shared component and an overlapping band), else 0.  Scans of one level
    write disjoint coefficients, so they run in one launch: libjpeg's 10-scan progressive
    script takes 3 (first scans, first refinements, the last Y refinement)."""
    rows = np.frombuffer(script, np.int32).reshape(-1, 7)
    levels: list[int] = []
    for i, (n, *comps, ss, se) in enumerate(rows.tolist()):
        mine = set(comps[:n])
        dep = [levels[j] for j, (m, *c, s2, e2) in enumerate(rows[:i].tolist())
               if mine & set(c[:m]) and s2 <= se and ss <= e2]
        levels.append(1 + max(dep) if dep else 0)
    return tuple(levels)


LEVEL_COLS = [cjpeg.S[k] for k in ("ncomp", "comp0", "comp1", "comp2", "comp3", "Ss", "Se")]


def scan_levels(parsed: list) -> np.ndarray:
    """Every scan's launch level, image after image (_levels per scan script)."""
    return np.concatenate([np.asarray(_levels(
        np.ascontiguousarray(p.scans[:, LEVEL_COLS], np.int32).tobytes()), np.int64)
        for p in parsed])


def descriptors(parsed: list, firsts: list, alloc=None, timings: dict | None = None) -> tuple:
    """(data, tables, scan rows [scans, NS], interval rows [intervals, NI], where, counts):
    the batch's bytes and tables, one descriptor per scan of each image, one per interval
    in launch order (by dependency level, as scan_levels), each interval's image, scan
    position and level ([intervals, 3]), and the intervals per level.  One C call with the
    GIL released (csrc/jpeg_batch.c): this is the host's share of a GPU batch."""
    return cjpeg.batch_descriptors(parsed, firsts, alloc, timings)


# descriptors' outputs the kernel reads (bytes, tables, scan rows, interval rows); the
# rest (each interval's place, the counts per level) stay on the host
DEVICE_OUTPUTS = 4
ALIGN = 16


def staging(pinned: bool):
    """(alloc, held): an allocator for descriptors that lays the outputs the kernel reads
    out in one uint8 tensor, pinned on a CUDA host (the caching host allocator hands it
    back batch after batch, so the C call writes warm pages and the four arrays go up in
    one queued copy); held gets [that tensor, [(offset, nbytes, dtype, shape), ...]]."""
    held: list = []

    def alloc(specs):
        spans, at = [], 0
        for shape, dtype in specs[:DEVICE_OUTPUTS]:
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            spans.append((at, n, np.dtype(dtype), shape))
            at += -(-n // ALIGN) * ALIGN
        buf = torch.empty(max(at, ALIGN), dtype=torch.uint8, pin_memory=pinned)
        held[:] = [buf, spans]
        host = buf.numpy()
        return ([host[o:o + n].view(d).reshape(sh) for o, n, d, sh in spans]
                + [np.empty(sh, d) for sh, d in specs[DEVICE_OUTPUTS:]])
    return alloc, held


def on_device(held: list, dev) -> list:
    """The staged outputs on dev: one upload, then typed views of it (no more copies)."""
    buf, spans = held
    whole = upload(buf, dev)
    return [whole[o:o + n].view(_TORCH_DTYPES[d]).reshape(sh) for o, n, d, sh in spans]


_TORCH_DTYPES = {np.dtype(np.uint8): torch.uint8, np.dtype(np.int32): torch.int32,
                 np.dtype(np.int64): torch.int64}


def entropy_decode(parsed: list, firsts: list, coefs: torch.Tensor, timings: list | None = None) -> dict:
    """Decode every interval of `parsed` into coefs (int16 [blocks, 64], zeros where these
    images' blocks are; image j at block firsts[j]).  Returns {image: reason} for damaged
    ones.  timings: a list to receive each launch's milliseconds (a profile; it synchronises)."""
    dev = coefs.device
    cuda = dev.type == "cuda"
    alloc, held = staging(cuda)
    _, _, _, iv, where, counts = descriptors(parsed, firsts, alloc)
    data_t, tables_t, rows_t, iv_t = on_device(held, dev)
    tables_t = tables_t.reshape(-1)
    zz = constant("zigzag", dev, lambda: torch.tensor(cjpeg.ZIGZAG, dtype=torch.int32))
    bad = torch.empty(len(iv), dtype=torch.int32, device=dev)   # every program writes its own
    k = kernel()
    done = 0
    for n in counts.tolist():   # level by level: a scan follows the scans whose coefficients it reads
        if n:
            if timings is not None:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            k[(n,)](data_t, tables_t, iv_t[done:], rows_t, coefs, zz, bad[done:], NI=NI, NS=NS,
                    num_warps=1)
            if timings is not None:
                if cuda:
                    torch.cuda.synchronize()
                timings.append(1e3 * (time.perf_counter() - t0))
            done += n
    errors = {}
    for o in np.flatnonzero(bad.cpu().numpy()):
        j, s = (int(x) for x in where[o][:2])
        errors.setdefault(j, f"corrupt entropy-coded data in scan {s + 1}")
    return errors
