"""Thin wrapper over the cffi extension: numbers in, bytes out, errors as exceptions.

cffi releases the GIL for the duration of every lib.* call, so these are safe to run in
worker threads next to the trio loop."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from pcrfs._native import ffi, lib
from pcrfs.format import EOI  # noqa: F401 - the splice appends it; callers use native.EOI

MAX_SCANS = 256

_MESSAGES = {
    lib.PCR_E_ARG: "invalid argument",
    lib.PCR_E_NOT_JPEG: "not a JPEG (no SOI marker)",
    lib.PCR_E_TRUNCATED: "truncated JPEG",
    lib.PCR_E_BAD_MARKER: "malformed JPEG marker",
    lib.PCR_E_TOO_MANY: "too many scans",
    lib.PCR_E_NO_SCAN: "no scan (SOS) in JPEG",
    lib.PCR_E_SPACE: "output buffer too small",
    lib.PCR_E_RANGE: "segment outside source",
    lib.PCR_E_IO: "read error",
    lib.PCR_E_SHORT: "short read (file ends early)",
    lib.PCR_E_JPEG: "libjpeg error",
    lib.PCR_E_CORRUPT: "corrupt JPEG data",
    lib.PCR_E_NOMEM: "out of memory",
    lib.PCR_E_UNSUPPORTED: "not handled by this function",
    lib.PCR_E_TOO_LARGE: "too many pixels",
}

KEEP_METADATA = {"none": lib.PCR_KEEP_NONE, "default": lib.PCR_KEEP_DEFAULT, "all": lib.PCR_KEEP_ALL}


class NativeError(Exception):
    def __init__(self, code: int, detail: str = ""):
        self.code = code
        msg = _MESSAGES.get(code, f"error {code}")
        super().__init__(f"{msg}: {detail}" if detail else msg)


def split_scans(jpeg: bytes) -> list[int]:
    """End offsets of each scan segment of a progressive JPEG (segment 0 starts at 0)."""
    ends = ffi.new("uint64_t[]", MAX_SCANS)
    n = ffi.new("size_t *")
    rc = lib.pcr_split_scans(ffi.from_buffer(jpeg), len(jpeg), ends, MAX_SCANS, n)
    if rc != lib.PCR_OK:
        raise NativeError(rc)
    return list(ends[0 : n[0]])


def _segment_arrays(segments: Sequence[tuple[int, int]]):
    for o, n in segments:
        if o < 0 or n < 0:
            raise NativeError(lib.PCR_E_ARG, "negative offset or length")
    offs = ffi.new("uint64_t[]", [o for o, _ in segments] or [0])
    lens = ffi.new("uint64_t[]", [n for _, n in segments] or [0])
    return offs, lens, sum(n for _, n in segments) + 2


def splice_buf(src, segments: Sequence[tuple[int, int]]) -> bytearray:
    """segments of src (offset, length) + EOI, as one buffer."""
    offs, lens, total = _segment_arrays(segments)
    dst = bytearray(total)
    out = ffi.new("size_t *")
    rc = lib.pcr_splice_buf(ffi.from_buffer(src), len(src), offs, lens, len(segments),
                            ffi.from_buffer(dst), total, out)
    if rc != lib.PCR_OK:
        raise NativeError(rc)
    return dst


def splice_fd(fd: int, segments: Sequence[tuple[int, int]]) -> bytearray:
    """Read segments (offset, length) of fd with pread and append EOI."""
    offs, lens, total = _segment_arrays(segments)
    dst = bytearray(total)
    out = ffi.new("size_t *")
    rc = lib.pcr_splice_fd(fd, offs, lens, len(segments), ffi.from_buffer(dst), total, out)
    if rc == lib.PCR_E_IO:
        raise NativeError(rc, os.strerror(ffi.errno))
    if rc != lib.PCR_OK:
        raise NativeError(rc)
    return dst


def sequential(jpeg, max_pixels: int = 0) -> bytes:
    """jpeg's coefficients as one sequential (baseline-coded) scan, each coefficient's
    missing low bits moved into its quantizer: a q_k file becomes a JPEG that decodes to
    the same coefficients without progressive decoding (and without block smoothing).
    max_pixels (0: none) refuses a larger image from its header (PCR_E_TOO_LARGE)."""
    res = ffi.new("pcr_transcode_result *")
    rc = lib.pcr_sequential(ffi.from_buffer(jpeg), len(jpeg), max_pixels, res)
    if rc != lib.PCR_OK:
        raise NativeError(rc, ffi.string(res.message).decode("utf-8", "replace"))
    try:
        return bytes(ffi.buffer(res.data, res.size))
    finally:
        lib.pcr_free(res.data)


@dataclass(frozen=True)
class Transcoded:
    data: bytes
    width: int
    height: int
    components: int
    color_space: int
    warnings: int
    message: str


def transcode(jpeg: bytes, keep_metadata: str = "default",
              scan_script: Sequence[Sequence[int]] | None = None,
              script_components: int = 0, max_pixels: int = 0,
              restart_rows: int = 0, restart_bytes: int = 0) -> Transcoded:
    """Lossless progressive rewrite of a JPEG (same DCT coefficients).  max_pixels (0: no
    limit) refuses larger images from the header alone: NativeError PCR_E_TOO_LARGE with
    `.size` (width, height).  restart_rows > 0 puts a restart marker every that many MCU
    rows in every scan (0: none); restart_bytes > 0 instead chooses each scan's interval so
    that its intervals hold at most that many entropy-coded bytes (where 4 MCUs do)."""
    res = ffi.new("pcr_transcode_result *")
    if scan_script:
        flat = [int(v) for row in scan_script for v in row]
        script = ffi.new("int[]", flat)
        n = len(scan_script)
    else:
        script, n = ffi.NULL, 0
    rc = lib.pcr_transcode(ffi.from_buffer(jpeg), len(jpeg), KEEP_METADATA[keep_metadata],
                           script, n, script_components, max_pixels, restart_rows, restart_bytes, res)
    message = ffi.string(res.message).decode("utf-8", "replace")
    if rc == lib.PCR_E_TOO_LARGE:
        err = NativeError(rc, f"{res.width}x{res.height}")
        err.size = (res.width, res.height)
        raise err
    if rc != lib.PCR_OK:
        raise NativeError(rc, message)
    try:
        data = bytes(ffi.buffer(res.data, res.size))
    finally:
        lib.pcr_free(res.data)
    return Transcoded(data, res.width, res.height, res.components, res.color_space,
                      res.warnings, message)
