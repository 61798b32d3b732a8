"""JPEG headers and entropy decoding in C (csrc/jpeg_parse.c, csrc/jpeg_entropy.c): the
host half of pcrfs.torch.decode_jpeg.  numpy only; every call releases the GIL in C.

`parse` reads one JPEG's markers: frame, quantisation and Huffman tables (derived, ready
for either decoder), each scan, and each scan's entropy-coded data cut at its restart
markers and unstuffed.  `entropy_decode` turns that into DCT coefficients on the CPU; the
GPU does the same per interval (pcrfs.torch.jpeg_triton).  `coef_bits` replays the scan
script as libjpeg does, for its block smoothing of incomplete progressive images."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pcrfs._native import ffi, lib

HUFF_WORDS = int(lib.PCR_HUFF_WORDS)
MAX_TABLES = int(lib.PCR_JPG_MAX_TABLES)
MAX_SCANS = int(lib.PCR_JPG_MAX_SCANS)
GRAY, RGB, YCC, CMYK, YCCK = 1, 2, 3, 4, 5
SEQ, DC_FIRST, DC_REFINE, AC_FIRST, AC_REFINE = 0, 1, 2, 3, 4
# zigzag index -> natural (row-major) position within a block
ZIGZAG = [0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34,
          27, 20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44,
          51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63]
INTERVAL = np.dtype([("scan", "<i4"), ("first_mcu", "<i4"), ("n_mcus", "<i4"), ("pad", "<i4"),
                     ("data_off", "<i8"), ("data_len", "<i8")])
# pcr_jpeg_scan as int32 columns
SCAN_COLS = ["kind", "ncomp", "comp0", "comp1", "comp2", "comp3", "dc0", "dc1", "dc2", "dc3",
             "ac0", "ac1", "ac2", "ac3", "Ss", "Se", "Ah", "Al", "restart", "mcus",
             "mcus_per_row", "first_interval", "n_intervals"]
S = {name: i for i, name in enumerate(SCAN_COLS)}


class JpegError(ValueError):
    """Damaged or malformed JPEG data."""

    def __init__(self, code: int, reason: str):
        self.code = code
        self.reason = reason
        super().__init__(reason)


class Unsupported(JpegError):
    """A valid JPEG this decoder hands to another one (12-bit, arithmetic, lossless, ...)."""


@dataclass
class Parsed:
    width: int
    height: int
    ncomp: int
    progressive: bool
    color: int
    h: tuple
    v: tuple
    max_h: int
    max_v: int
    mcux: int
    mcuy: int
    bw: tuple        # blocks per component row / column, padded to whole MCUs
    bh: tuple
    wib: tuple       # blocks covering the component's samples
    hib: tuple
    dw: tuple        # the component's samples
    dh: tuple
    coef_offset: tuple
    total_blocks: int
    qt: np.ndarray          # uint16 [ncomp, 64], natural order
    scans: np.ndarray       # int32 [nscans, len(SCAN_COLS)]
    tables: np.ndarray      # int32 [ntables, HUFF_WORDS]
    data: np.ndarray        # uint8, the unstuffed entropy-coded bytes
    intervals: np.ndarray   # INTERVAL
    restart_scans: int      # scans cut into more than one interval
    info: object            # the parser's pcr_jpeg_info (cffi), which the C decoder reads

    def coef_bits(self) -> np.ndarray:
        """int32 [ncomp, 64]: per coefficient, the Al of the last scan that coded it (0:
        exact), -1 where no scan did: libjpeg's coef_bits after the whole file."""
        bits = np.full((self.ncomp, 64), -1, np.int32)
        if not self.progressive:
            return np.zeros_like(bits)
        for s in self.scans:
            for i in range(s[S["ncomp"]]):
                bits[s[S["comp0"] + i], s[S["Ss"]]: s[S["Se"]] + 1] = s[S["Al"]]
        return bits


# pcr_jpeg_info's int32 words from width to total_blocks, read as one buffer: field by
# field through cffi, they were most of a parse's GIL-held time
_HDR_WORDS = 47
if int(ffi.offsetof("pcr_jpeg_info", "total_blocks")) != 4 * (_HDR_WORDS - 1):
    raise ImportError("pcr_jpeg_info's layout is not the one pcrfs.jpeg reads")


def parse(blob) -> Parsed:
    """Raises Unsupported for a valid JPEG this decoder leaves to another, JpegError for a
    damaged or malformed one."""
    src = ffi.from_buffer(blob)
    n = len(blob)
    info = ffi.new("pcr_jpeg_info *")
    tables = np.empty((MAX_TABLES, HUFF_WORDS), np.int32)
    data = np.empty(max(n, 1), np.uint8)
    cap = 256
    while True:
        ivs = np.empty(cap, INTERVAL)
        rc = lib.pcr_jpeg_parse(src, n, info, ffi.from_buffer("int32_t[]", tables),
                                ffi.from_buffer("uint8_t[]", data),
                                ffi.from_buffer("pcr_jpeg_interval[]", ivs), cap)
        if rc == lib.PCR_E_SPACE and info.nintervals > cap:
            cap = int(info.nintervals)
            continue
        break
    if rc != lib.PCR_OK:
        msg = ffi.string(info.message).decode("ascii", "replace")
        raise (Unsupported if rc == lib.PCR_E_UNSUPPORTED else JpegError)(rc, msg)
    w = np.frombuffer(ffi.buffer(info, 4 * _HDR_WORDS), np.int32).tolist()
    nc = w[2]

    def comps(at: int) -> tuple:     # one int32[4] field, its first nc entries
        return tuple(w[at: at + nc])
    qt = np.frombuffer(ffi.buffer(info.qt), np.uint16).reshape(4, 64)[:nc].copy()
    scans = np.frombuffer(ffi.buffer(info.scans), np.int32).reshape(-1, len(SCAN_COLS))
    return Parsed(
        w[0], w[1], nc, bool(w[3]), w[5], comps(6), comps(10), w[14], w[15], w[16], w[17],
        comps(18), comps(22), comps(26), comps(30), comps(34), comps(38), comps(42), w[46],
        qt, scans[: info.nscans].copy(), tables[: info.ntables].copy(),
        data[: info.data_len], ivs[: info.nintervals].copy(), int(info.restart_scans), info)


def entropy_decode(p: Parsed, scans: range | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """int16 [total_blocks, 64] coefficients (natural order) of `scans` (default: all),
    decoded in C into `out` (zeros when not given).  JpegError names the damaged interval."""
    if out is None:
        out = np.zeros((p.total_blocks, 64), np.int16)
    if out.shape != (p.total_blocks, 64) or out.dtype != np.int16 or not out.flags.c_contiguous:
        raise ValueError("out: a C-contiguous int16 array of [total_blocks, 64]")
    ivs = p.intervals
    if scans is None:
        first, count = 0, len(ivs)
    else:
        sel = np.flatnonzero((ivs["scan"] >= scans.start) & (ivs["scan"] < scans.stop))
        first, count = (int(sel[0]), len(sel)) if len(sel) else (0, 0)
    if count == 0:
        return out
    bad = ffi.new("int64_t *")
    tables = p.tables if len(p.tables) else np.zeros((1, HUFF_WORDS), np.int32)
    data = p.data if len(p.data) else np.zeros(1, np.uint8)
    rc = lib.pcr_jpeg_decode_intervals(
        p.info, ffi.from_buffer("int32_t[]", tables), ffi.from_buffer("uint8_t[]", data),
        ffi.from_buffer("pcr_jpeg_interval[]", ivs), first, count,
        ffi.from_buffer("int16_t[]", out), bad)
    if rc != lib.PCR_OK:
        iv = ivs[bad[0]] if 0 <= bad[0] < len(ivs) else None
        where = f" in scan {int(iv['scan']) + 1}, MCUs {int(iv['first_mcu'])}.." if iv is not None else ""
        raise JpegError(rc, f"corrupt entropy-coded data{where}")
    return out


SCAN_WORDS = int(lib.PCR_JPG_SCAN_WORDS)
IV_WORDS = int(lib.PCR_JPG_IV_WORDS)


def batch_descriptors(parsed: list, firsts, alloc=None, timings: dict | None = None,
                      windows=None) -> tuple:
    """(data, tables, scan rows [scans, SCAN_WORDS], interval rows [intervals, IV_WORDS],
    where [intervals, 3], counts per level): the GPU entropy kernel's inputs for a batch,
    built in one C call (csrc/jpeg_batch.c) that releases the GIL.  data ends in 4 zero
    bytes and tables in a zero table, so an empty batch or image still has a buffer.
    alloc([(shape, dtype), ...]) gives the outputs' memory in one call (default numpy.empty
    each): one pinned buffer there lets the four the device reads go up in one copy.
    windows: int64 [n, 2], image j's MCU rows [r0, r1) a crop needs: only the intervals
    those rows need are described (their bytes packed), not every one.
    timings["c_ms"]: the C calls' own time."""
    alloc = alloc or (lambda specs: [np.empty(s, d) for s, d in specs])
    n = len(parsed)
    infos = ffi.new("pcr_jpeg_info *[]", [p.info for p in parsed])
    sizes = np.empty(4, np.int64)
    # from_buffer's objects keep the arrays' memory pinned while these lists hold them
    keep = ([ffi.from_buffer("uint8_t[]", p.data) for p in parsed],
            [ffi.from_buffer("int32_t[]", p.tables) for p in parsed],
            [ffi.from_buffer("pcr_jpeg_interval[]", p.intervals) for p in parsed])
    ivs = ffi.new("pcr_jpeg_interval *[]", keep[2])
    t0 = time.perf_counter()
    take = ffi.NULL
    if windows is None:
        rc = lib.pcr_jpeg_batch_size(n, infos, ffi.from_buffer("int64_t[]", sizes))
    else:
        windows = np.ascontiguousarray(windows, np.int64).reshape(n, 2)
        take_a = np.empty(sum(len(p.intervals) for p in parsed) + 1, np.uint8)
        take = ffi.from_buffer("uint8_t[]", take_a)
        rc = lib.pcr_jpeg_batch_take(n, infos, ivs, ffi.from_buffer("int64_t[]", windows), take,
                                     ffi.from_buffer("int64_t[]", sizes))
    c_s = time.perf_counter() - t0
    if rc != lib.PCR_OK:
        raise ValueError(f"a batch of parsed JPEGs the parser could not have produced (code {rc})")
    nscans, nivs, nbytes, ntables = sizes.tolist()
    firsts = np.ascontiguousarray(firsts, np.int64)
    outs = tuple(alloc([((nbytes + 4,), np.uint8), ((ntables + 1, HUFF_WORDS), np.int32),
                        ((nscans, SCAN_WORDS), np.int64), ((nivs, IV_WORDS), np.int64),
                        ((nivs, 3), np.int64), ((MAX_SCANS,), np.int64)]))
    args = [ffi.from_buffer(t, a, require_writable=True) for t, a in
            zip(("uint8_t[]", "int32_t[]") + ("int64_t[]",) * 4, outs, strict=True)]
    t0 = time.perf_counter()
    rc = lib.pcr_jpeg_batch_descriptors(
        n, infos, ffi.new("uint8_t *[]", keep[0]), ffi.new("int32_t *[]", keep[1]), ivs,
        ffi.from_buffer("int64_t[]", firsts), take, ffi.from_buffer("int64_t[]", sizes), *args)
    if timings is not None:
        timings["c_ms"] = timings.get("c_ms", 0.0) + 1e3 * (c_s + time.perf_counter() - t0)
    if rc != lib.PCR_OK:
        raise ValueError(f"a batch of parsed JPEGs with an interval outside its image (code {rc})")
    return outs
