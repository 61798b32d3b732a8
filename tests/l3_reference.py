"""A deliberately naive L3 decoder written line by line from the reference decoder's rules
(docs/L3.md), sharing no code with csrc/l3.c.  Slow; for small test images only."""
import struct

import numpy as np


def _predict(a, b, c):
    p = a + c - b
    if a == 0:
        return b if abs(p - b) <= abs(p - c) else c
    if c == 0:
        return a if abs(p - a) <= abs(p - b) else b
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    if pa <= pc:
        return b
    return c


def _bits(data, start_byte, bit, n):
    v = 0
    for i in range(n):
        pos = start_byte * 8 + bit + i
        v |= ((data[pos // 8] >> (pos % 8)) & 1) << i
    return v


def decode(data: bytes) -> np.ndarray:
    assert data[:4] == b"LLL."
    width, height, n = struct.unpack_from("<IIB", data, 4)
    px, py = -(-width // n), -(-height // n)
    p = px * py
    sizes = [struct.unpack_from(f"<{p}H", data, 13 + 2 * p * ch) for ch in range(3)]
    out = np.zeros((height, width, 3), np.uint8)
    pos = 13 + 6 * p
    for ch in range(3):
        for k in range(p):
            j, i = divmod(k, px)
            x0, y0 = i * n, j * n
            w, h = min(n, width - x0), min(n, height - y0)
            start = pos
            prev = None
            for y in range(h):
                nbit = _bits(data, pos, 0, 4)
                base = _bits(data, pos, 4, 8)
                base = base - 256 if base > 127 else base
                row = []
                for x in range(w):
                    delta = _bits(data, pos, 12 + x * nbit, nbit)
                    res = (delta + base) % 256
                    if y == 0:
                        pred = 0
                    else:
                        a = prev[x - 1] if x > 0 else 0
                        c = prev[x + 1] if x < w - 1 else 0
                        pred = _predict(a, prev[x], c)
                    row.append((res + pred) % 256)
                out[y0 + y, x0 : x0 + w, ch] = row
                prev = row
                pos += (12 + w * nbit + 7) // 8
            assert pos - start == sizes[ch][k], "patch size entry disagrees with its rows"
    assert pos == len(data)
    return out
