"""Entropy decoding on the GPU: restart intervals, LANES to a Triton program, in lock step.

An interval starts with zero DC predictions and no end-of-band run, so every interval of
a scan is independent work: each lane of a program takes one, and every step each lane
decodes one symbol (or skips a block of an EOB run, or takes a DC refinement bit), so a
program lasts as long as its longest interval.  Neighbours in launch order are the same
scan of one image, of similar length and the same kind.  A scan that reads coefficients
an earlier scan writes (a refinement) runs after it; scans of disjoint coefficients share
a launch, so the batch takes one launch per dependency level (scan_levels: 3 for
libjpeg's progressive script), not one per scan.  The decoding is csrc/jpeg_entropy.c's
(sequential, DC first/refine, AC first/refine with EOB runs), on the tables and
unstuffed bytes the C parser prepared; an AC refinement's band walk is done CHUNK
coefficients a pass with prefix counts, not a coefficient a step.

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
from pcrfs.torch import transfer
from pcrfs.torch.transfer import constant
from pcrfs.torch.triton_ops import combiners, lower

# int64 words per descriptor (csrc/jpeg_decode.h): an interval's (start, end, first MCU,
# MCUs, its scan's row) and a scan's (kind, ncomp, Ss, Se, Al, MCUs per row, then per scan
# component: first block, blocks per row, h, v, DC and AC table offsets); the intervals of
# one scan of one image share its row, so the batch uploads one row per scan, not one per
# interval
NI, NS = cjpeg.IV_WORDS, cjpeg.SCAN_WORDS
# intervals per program, one a lane, in lock step; the warps share the band walk's tile
# and the refinement's band walk goes CHUNK coefficients at a time
LANES, WARPS, CHUNK = 32, 4, 8


@functools.cache
def kernel():
    import triton
    import triton.language as tl
    _add, _most, _least = combiners()

    @triton.jit
    def bits(data, start, end, pos, n, m):
        """Each lane's next n (0..16) bits at bit pos of its interval [start, end), not
        consumed (m: the lanes that read)."""
        byte = start + (pos >> 3)
        b0 = tl.load(data + byte, mask=m & (byte < end), other=0).to(tl.int32)
        b1 = tl.load(data + byte + 1, mask=m & (byte + 1 < end), other=0).to(tl.int32)
        b2 = tl.load(data + byte + 2, mask=m & (byte + 2 < end), other=0).to(tl.int32)
        w = (b0 << 16) | (b1 << 8) | b2
        return ((w << (pos & 7)) & 0xFFFFFF) >> (24 - n)

    @triton.jit
    def extend(v, s):
        return tl.where((s > 0) & (v < (1 << tl.maximum(s - 1, 0))), v - (1 << s) + 1, v)

    @triton.jit
    def huff(data, start, end, pos, tables, tb, m):
        """Each lane's (symbol, code length, ok): the 8-bit lookahead in one load, else the
        canonical search, lengths 9..16, while any lane still needs it."""
        peek = bits(data, start, end, pos, 16, m)
        e = tl.load(tables + tb + (peek >> 8), mask=m, other=0)
        ln = tl.where(e != 0, e >> 8, 9)
        slow = m & (e == 0)
        code = peek >> (16 - ln)
        mc = tl.load(tables + tb + 256 + ln, mask=slow, other=0)
        more = slow & (code > mc) & (ln < 16)
        while tl.reduce(more.to(tl.int32), 0, _most) > 0:
            ln = tl.where(more, ln + 1, ln)
            code = peek >> (16 - ln)
            mc = tl.where(more, tl.load(tables + tb + 256 + ln, mask=more, other=0), mc)
            more = more & (code > mc) & (ln < 16)
        at = (code + tl.load(tables + tb + 274 + ln, mask=slow, other=0)) & 255
        sym = tl.where(e != 0, e & 255, tl.load(tables + tb + 292 + at, mask=slow, other=0))
        return sym, ln, (e != 0) | (code <= mc)

    @triton.jit
    def field(d, i, f, m):
        """Scan component i's field f (0 first block, 1 blocks per row, 2 h, 3 v, 4 DC and
        5 AC table offsets), per lane."""
        return tl.load(d + 6 + 6 * i + f, mask=m, other=0)

    globals().update(bits=bits, extend=extend, huff=huff, field=field, _add=_add, _most=_most, _least=_least)

    @triton.jit
    def intervals(data, tables, ivd, scd, coefs, ends, zz, bad, total, NI: tl.constexpr, NS: tl.constexpr,
                  L: tl.constexpr, CH: tl.constexpr):
        lane = tl.program_id(0) * L + tl.arange(0, L)
        live = lane < total
        iv = ivd + lane.to(tl.int64) * NI
        start = tl.load(iv + 0, mask=live, other=0)
        end = tl.load(iv + 1, mask=live, other=0)
        first = tl.load(iv + 2, mask=live, other=0).to(tl.int32)
        nm = tl.load(iv + 3, mask=live, other=0).to(tl.int32)
        d = scd + tl.load(iv + 4, mask=live, other=0) * NS
        kind = tl.load(d + 0, mask=live, other=0).to(tl.int32)
        ncomp = tl.load(d + 1, mask=live, other=0).to(tl.int32)
        Ss = tl.load(d + 2, mask=live, other=0).to(tl.int32)
        Se = tl.load(d + 3, mask=live, other=0).to(tl.int32)
        Al = tl.load(d + 4, mask=live, other=0).to(tl.int32)
        mpr = tl.maximum(tl.load(d + 5, mask=live, other=1).to(tl.int32), 1)
        # blocks per MCU: the scan's components' h x v (1 x 1 for a single-component scan)
        n0 = (field(d, 0, 2, live) * field(d, 0, 3, live)).to(tl.int32)
        n1 = tl.where(ncomp > 1, field(d, 1, 2, live) * field(d, 1, 3, live), 0).to(tl.int32)
        n2 = tl.where(ncomp > 2, field(d, 2, 2, live) * field(d, 2, 3, live), 0).to(tl.int32)
        n3 = tl.where(ncomp > 3, field(d, 3, 2, live) * field(d, 3, 3, live), 0).to(tl.int32)
        bpm = tl.maximum(n0 + n1 + n2 + n3, 1)
        nblk = nm * bpm
        p1 = (1 << Al)
        zero = tl.full([L], 0, tl.int32)
        pos = zero             # bits consumed of the interval
        b = zero               # the block (of the interval's MCUs, in scan order) being decoded
        k = zero - 1           # its next coefficient; -1: the block is yet to be located
        eob = zero
        err = zero
        pr0 = zero
        pr1 = zero
        pr2 = zero
        pr3 = zero
        ci = zero
        last = zero            # past the last coefficient a first scan wrote in the block
        blk = start * 0        # the block's first coefficient, int64
        dct = start * 0
        act = start * 0
        active = live & (nblk > 0)
        while tl.reduce(active.to(tl.int32), 0, _most) > 0:
            # lanes at a new block: which component, where its coefficients are, its tables
            fresh = active & (k < 0)
            m = first + b // bpm
            w = b % bpm
            c = tl.where(w < n0, 0, tl.where(w < n0 + n1, 1, tl.where(w < n0 + n1 + n2, 2, 3)))
            local = w - tl.where(c == 0, 0, tl.where(c == 1, n0, tl.where(c == 2, n0 + n1, n0 + n1 + n2)))
            h = tl.maximum(field(d, c, 2, fresh).to(tl.int32), 1)
            v = field(d, c, 3, fresh).to(tl.int32)
            at = (field(d, c, 0, fresh) + ((m // mpr) * v + local // h) * field(d, c, 1, fresh)
                  + (m % mpr) * h + local % h)
            blk = tl.where(fresh, at * 64, blk)
            dct = tl.where(fresh, field(d, c, 4, fresh), dct)
            act = tl.where(fresh, field(d, c, 5, fresh), act)
            ci = tl.where(fresh, c, ci)
            last = tl.where(fresh, 0, last)
            k = tl.where(fresh, tl.where(kind >= 3, Ss, 0), k)

            # what each lane does this step
            dc = active & (kind <= 1) & (k == 0)              # a DC difference
            skip = active & (kind == 3) & (eob > 0)           # a block inside an EOB run
            walk_all = active & (kind == 4) & (eob > 0)       # the same, in a refinement
            sym = active & ~skip & ~walk_all & (kind != 2)    # a Huffman symbol
            s_, ln, ok = huff(data, start, end, pos, tables, tl.where(dc, dct, act), sym)
            err = err | (sym & ~ok).to(tl.int32)
            pos = tl.where(sym, pos + ln, pos)
            r = tl.where(dc, 0, s_ >> 4)
            s = tl.where(dc, s_, s_ & 15)
            err = err | (dc & (s > 16)).to(tl.int32)
            s = tl.minimum(s, 16)
            ac_first = sym & ((kind == 0) | (kind == 3)) & ~dc
            refine = sym & (kind == 4)
            is_eob = (s == 0) & (r != 15)
            # its extra bits: a magnitude, an EOB run's length, a sign, a DC refinement's bit
            n = tl.where(dc, s, tl.where(s != 0, tl.where(refine, 1, s),
                                         tl.where((kind >= 3) & is_eob, r, 0)))
            n = tl.where(active & (kind == 2), 1, tl.where(sym, n, 0))
            val = bits(data, start, end, pos, n, n > 0)
            pos = pos + n
            done = zero

            # DC: the component's prediction, sequential or first (shifted) scans
            pred = tl.where(ci == 0, pr0, tl.where(ci == 1, pr1, tl.where(ci == 2, pr2, pr3)))
            pred = tl.where(dc, pred + extend(val, s), pred)
            pr0 = tl.where(ci == 0, pred, pr0)
            pr1 = tl.where(ci == 1, pred, pr1)
            pr2 = tl.where(ci == 2, pred, pr2)
            pr3 = tl.where(ci == 3, pred, pr3)
            tl.store(coefs + blk, tl.where(kind == 0, pred, pred << Al).to(tl.int16), mask=dc)
            k = tl.where(dc, 1, k)
            done = done | (dc & (kind == 1)).to(tl.int32)

            # DC refinement: one bit
            dr = active & (kind == 2)
            old = tl.load(coefs + blk, mask=dr, other=0).to(tl.int32)
            tl.store(coefs + blk, (old | (val << Al)).to(tl.int16), mask=dr & (val != 0))
            done = done | dr.to(tl.int32)

            # AC, sequential or first: a run of zeros and a value, ZRL or an EOB (run)
            top = tl.where(kind == 0, 63, Se)
            kk = k + r
            wrong = ac_first & (s != 0) & (kk > top)
            err = err | wrong.to(tl.int32)
            put = ac_first & (s != 0) & ~wrong
            zk = tl.load(zz + tl.minimum(kk, 63), mask=put, other=0)
            tl.store(coefs + blk + zk, (extend(val, s) << tl.where(kind == 0, 0, Al)).to(tl.int16), mask=put)
            last = tl.where(put, kk + 1, last)
            eob = tl.where(ac_first & (kind == 3) & is_eob, (1 << r) + val - 1, eob)
            k = tl.where(ac_first, tl.where(s != 0, kk + 1, tl.where(r == 15, k + 16, top + 1)), k)
            done = done | (ac_first & (k > top)).to(tl.int32)
            # a first scan's block done: where its band's nonzeros end, for the refinements
            # (scans of one level write disjoint bands of a block, hence the max)
            tl.atomic_max(ends + blk // 64, last, mask=ac_first & (kind == 3) & (k > top) & (last > 0))
            eob = tl.where(skip, eob - 1, eob)
            done = done | skip.to(tl.int32)

            # AC refinement: s is 0 or 1; the band walk from k in one step over the block:
            # each nonzero coefficient passed takes the next correction bit, and the new
            # value lands on the (r + 1)-th zero (ZRL: past the 16th; an EOB: none, the
            # rest of the band corrected and the run counted down)
            err = err | (refine & (s > 1)).to(tl.int32)
            eob = tl.where(refine & is_eob, (1 << r) + val, eob)
            rest = walk_all | (refine & is_eob)
            walking = rest | refine
            if tl.reduce(walking.to(tl.int32), 0, _most) > 0:
                # the band in chunks of CH coefficients, the counts carried from chunk to
                # chunk (a [L, 64] tile at once would spill)
                t = zero + 64
                zs = zero
                fixed = zero
                # from the lowest chunk a lane starts in, until every lane has its target
                # or has passed its band's end or its block's last nonzero coefficient
                # (past that, only zeros, which take no bits)
                e = tl.load(ends + blk // 64, mask=walking, other=0)
                j = tl.reduce(tl.where(walking, k, 64), 0, _least) // CH
                going = walking & (k <= Se) & (k < e)
                while tl.reduce(going.to(tl.int32), 0, _most) > 0:
                    qj = j * CH + tl.arange(0, CH)[None, :]
                    band = walking[:, None] & (qj >= k[:, None]) & (qj <= Se[:, None])
                    nat = tl.load(zz + qj)
                    cz = tl.load(coefs + blk[:, None] + nat, mask=band, other=0).to(tl.int32)
                    zeros = band & (cz == 0)
                    zc = zs[:, None] + tl.associative_scan(zeros.to(tl.int32), 1, _add)
                    target = zeros & (zc == r[:, None] + 1) & ~rest[:, None]
                    t = tl.minimum(t, tl.reduce(tl.where(target, qj, 64), 1, _least))
                    fix = band & (cz != 0) & (qj < t[:, None])
                    bp = pos[:, None] + fixed[:, None] + tl.associative_scan(fix.to(tl.int32), 1, _add) - 1
                    by = start[:, None] + (bp >> 3)
                    bit = (tl.load(data + by, mask=fix & (by < end[:, None]), other=0).to(tl.int32)
                           >> (7 - (bp & 7))) & 1
                    up = fix & (bit != 0) & ((cz & p1[:, None]) == 0)
                    tl.store(coefs + blk[:, None] + nat,
                             tl.where(cz >= 0, cz + p1[:, None], cz - p1[:, None]).to(tl.int16), mask=up)
                    zs = zs + tl.reduce(zeros.to(tl.int32), 1, _add)
                    fixed = fixed + tl.reduce(fix.to(tl.int32), 1, _add)
                    j += 1
                    going = going & (t > 63) & (j * CH <= Se) & (j * CH < e)
                pos = pos + fixed
                # a target among the zeros past what was looked at: counted, not walked
                seen = tl.maximum(k, tl.minimum(j * CH, Se + 1))
                far = seen + r - zs
                t = tl.where(refine & ~rest & (t > 63) & (far <= Se), far, t)
                placed = refine & (s != 0)
                err = err | (placed & (t > 63)).to(tl.int32)
                zt = tl.load(zz + tl.minimum(t, 63), mask=placed & (t <= 63), other=0)
                tl.store(coefs + blk + zt, tl.where(val != 0, p1, -p1).to(tl.int16), mask=placed & (t <= 63))
                tl.atomic_max(ends + blk // 64, t + 1, mask=placed & (t <= 63))
                k = tl.where(walking, tl.where(rest, Se + 1, t + 1), k)
                eob = tl.where(rest, eob - 1, eob)
                done = done | (walking & (k > Se)).to(tl.int32)

            b = tl.where(done != 0, b + 1, b)
            k = tl.where(done != 0, -1, k)
            active = active & (b < nblk) & (err == 0) & (pos <= (end - start) * 8)
        over = (pos > (end - start) * 8).to(tl.int32)
        tl.store(bad + lane, err | over, mask=live)

    return intervals


def compiled(arch: int):
    """The kernel lowered for sm_<arch> (triton_ops.lower)."""
    sig = {"data": "*u8", "tables": "*i32", "ivd": "*i64", "scd": "*i64", "coefs": "*i16",
           "ends": "*i32", "zz": "*i32", "bad": "*i32", "total": "i32", "NI": "constexpr", "NS": "constexpr",
           "L": "constexpr", "CH": "constexpr"}
    return lower(kernel(), sig, {"NI": NI, "NS": NS, "L": LANES, "CH": CHUNK}, arch, WARPS)


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


def descriptors(parsed: list, firsts: list, alloc=None, timings: dict | None = None,
                windows=None) -> tuple:
    """(data, tables, scan rows [scans, NS], interval rows [intervals, NI], where, counts):
    the batch's bytes and tables, one descriptor per scan of each image, one per interval
    in launch order (by dependency level, as scan_levels), each interval's image, scan
    position and level ([intervals, 3]), and the intervals per level.  One C call with the
    GIL released (csrc/jpeg_batch.c): this is the host's share of a GPU batch.  windows:
    per image the MCU rows a crop needs (cjpeg.batch_descriptors): only their intervals."""
    return cjpeg.batch_descriptors(parsed, firsts, alloc, timings, windows)


# descriptors' outputs the kernel reads (bytes, tables, scan rows, interval rows); the
# rest (each interval's place, the counts per level) stay on the host
DEVICE_OUTPUTS = 4
ALIGN = transfer.ALIGN


def staging(pinned: bool):
    """(alloc, held): an allocator for descriptors that lays the outputs the kernel reads
    out in one buffer (transfer.packed: pinned on a CUDA host, so the C call writes warm
    pages and the four arrays go up in one queued copy); held gets [that tensor,
    [(offset, nbytes, dtype, shape), ...]]."""
    held: list = []

    def alloc(specs):
        buf, spans, host = transfer.packed(specs[:DEVICE_OUTPUTS], pinned)
        held[:] = [buf, spans]
        return host + [np.empty(sh, d) for sh, d in specs[DEVICE_OUTPUTS:]]
    return alloc, held


def on_device(held: list, dev) -> list:
    """The staged outputs on dev: one upload, then typed views of it (no more copies)."""
    return transfer.on_device(*held, dev)


def entropy_decode(parsed: list, firsts: list, coefs: torch.Tensor, timings: list | None = None,
                   deferred: bool = False, windows=None):
    """Decode the intervals of `parsed` into coefs (int16 [blocks, 64], zeros where these
    images' blocks are; image j at block firsts[j]).  Returns {image: reason} for damaged
    ones.  timings: a list to receive each launch's milliseconds (a profile; it synchronises).
    deferred: return a function giving that dict instead, which waits only for the
    entropy stage (on CUDA, an event behind the flags' copy).  windows: decode only the
    intervals each image's MCU rows [r0, r1) need (descriptors); the rest stay zero."""
    dev = coefs.device
    cuda = dev.type == "cuda"
    alloc, held = staging(cuda)
    _, _, _, iv, where, counts = descriptors(parsed, firsts, alloc, windows=windows)
    data_t, tables_t, rows_t, iv_t = on_device(held, dev)
    tables_t = tables_t.reshape(-1)
    zz = constant("zigzag", dev, lambda: torch.tensor(cjpeg.ZIGZAG, dtype=torch.int32))
    bad = torch.empty(len(iv), dtype=torch.int32, device=dev)   # every program writes its own
    # per block, past its last nonzero coefficient (zigzag): the refinements walk no further
    ends = torch.zeros(coefs.shape[0], dtype=torch.int32, device=dev)
    k = kernel()
    done = 0
    for n in counts.tolist():   # level by level: a scan follows the scans whose coefficients it reads
        if n:
            if timings is not None:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            k[(-(-n // LANES),)](data_t, tables_t, iv_t[done:], rows_t, coefs, ends, zz, bad[done:], n,
                                 NI=NI, NS=NS, L=LANES, CH=CHUNK, num_warps=WARPS)
            if timings is not None:
                if cuda:
                    torch.cuda.synchronize()
                timings.append(1e3 * (time.perf_counter() - t0))
            done += n
    # the flags come back in a queued copy to pinned memory behind an event, so the host
    # goes on queueing the pixel stage and waits, when it asks, for the entropy stage only
    flags = torch.empty(len(iv), dtype=torch.int32, pin_memory=cuda)
    flags.copy_(bad, non_blocking=cuda)
    ready = None
    if cuda:
        ready = torch.cuda.Event()
        ready.record()

    def check() -> dict:
        if ready is not None:
            ready.synchronize()
        errors = {}
        for o in np.flatnonzero(flags.numpy()):
            j, s = (int(x) for x in where[o][:2])
            errors.setdefault(j, f"corrupt entropy-coded data in scan {s + 1}")
        return errors
    return check if deferred else check()
