/* L3 lossless image codec (Bae et al., ECCV 2022), bit-compatible with the reference
 * decoder's rules; see docs/L3.md.  Every patch of every channel is independent, each row
 * is predicted only from the row above, so a GPU decodes all columns of a row at once.
 *
 * The decoder trusts nothing: header, patch sizes against the buffer length, every row's
 * nbit and length against its patch are checked before a byte is read. */
#include <stdlib.h>
#include <string.h>

#include "pcr_native.h"

#define L3_HEADER 13u

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

static inline size_t row_bytes(uint32_t w, unsigned nbit) { return (12u + (size_t)w * nbit + 7u) / 8u; }

static int geometry(uint64_t w, uint64_t h, uint32_t n, uint64_t *px, uint64_t *py) {
    if (w == 0 || h == 0 || w > 0xFFFFFFFFu || h > 0xFFFFFFFFu || n == 0 || n > PCR_L3_MAX_PATCH)
        return PCR_E_ARG;
    *px = (w + n - 1) / n;
    *py = (h + n - 1) / n;
    return PCR_OK;
}

int pcr_l3_max_size(uint32_t width, uint32_t height, uint32_t patch, size_t *out) {
    uint64_t px, py;
    if (!out) return PCR_E_ARG;
    int rc = geometry(width, height, patch, &px, &py);
    if (rc) return rc;
    /* worst row: nbit 8 -> w + 2 bytes; every image row crosses px patches */
    uint64_t per_channel = (uint64_t)height * ((uint64_t)width + 2u * px);
    uint64_t total = L3_HEADER + 6u * px * py + 3u * per_channel;
    if (total > (uint64_t)SIZE_MAX / 2) return PCR_E_ARG;
    *out = (size_t)total;
    return PCR_OK;
}

/* The reference's "custom Paeth": a == 0 / c == 0 are tests on VALUES (border pixels are
 * passed as 0), and the middle branch compares pa <= pc, not pb <= pc.  Branch-free on
 * 16-bit lanes so the row loops vectorize wide (|p - x| <= 510 fits easily). */
static inline int16_t abs16(int16_t v) { return v < 0 ? (int16_t)-v : v; }
static inline int16_t sel16(int16_t mask, int16_t x, int16_t y) { return (int16_t)((x & mask) | (y & ~mask)); }
static inline uint8_t predict_sel(int16_t a, int16_t b, int16_t c) {
    /* p = a + c - b, so |p - a| = |c - b|, |p - b| = |a + c - 2b|, |p - c| = |a - b| */
    int16_t pa = abs16((int16_t)(c - b)), pb = abs16((int16_t)(a + c - 2 * b)), pc = abs16((int16_t)(a - b));
    int16_t ab = (int16_t)-(pa <= pb), ac = (int16_t)-(pa <= pc), bc = (int16_t)-(pb <= pc);
    int16_t other = sel16(ab & ac, a, sel16(ac, b, c));
    int16_t if_a0 = sel16(bc, b, c), if_c0 = sel16(ab, a, b);
    return (uint8_t)sel16((int16_t)-(a == 0), if_a0, sel16((int16_t)-(c == 0), if_c0, other));
}

static inline uint64_t load64le(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only (x86-64, aarch64) */
}
static inline void store64le(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* The inverse of unpack_n below: eight n-bit deltas fill exactly n bytes, group g starting
 * at byte 1 + g*n, bit 4.  Each group is stored whole (8 bytes, of which the next group
 * overwrites all but its n) with the nibble it shares with the previous one carried in a
 * register: no read-modify-write of overlapping bytes.  bits[1] holds the header's high
 * nibble on entry; bits needs 9 bytes of room past the last group. */
static inline void pack_n(const uint8_t *d, unsigned n, uint32_t w, uint8_t *bits) {
    uint32_t groups = (w + 7) / 8;
    uint64_t carry = bits[1] & 0x0F;
    for (uint32_t g = 0; g < groups; g++) {
        uint64_t v = 0;
        for (unsigned j = 0; j < 8; j++) v |= (uint64_t)d[g * 8 + j] << (j * n);
        store64le(bits + 1 + (size_t)g * n, v << 4 | carry);
        carry = v >> (8 * n - 4);
    }
    bits[1 + (size_t)groups * n] = (uint8_t)carry;
}

static void pack_deltas(const uint8_t *d, unsigned nbit, uint32_t w, uint8_t *bits) {
    switch (nbit) {
    case 1: pack_n(d, 1, w, bits); break;
    case 2: pack_n(d, 2, w, bits); break;
    case 3: pack_n(d, 3, w, bits); break;
    case 4: pack_n(d, 4, w, bits); break;
    case 5: pack_n(d, 5, w, bits); break;
    case 6: pack_n(d, 6, w, bits); break;
    case 7: pack_n(d, 7, w, bits); break;
    default: pack_n(d, 8, w, bits); break;
    }
}

/* Encode one patch of a plane (row stride `stride`); returns its byte size.  Each row:
 * residuals against the prediction from the row above (a zero on each side of it is the
 * reference's border rule), then the row's minimum as base and the fewest bits that hold
 * every residual - base. */
__attribute__((target_clones("avx2", "default")))
static size_t encode_patch(const uint8_t *plane, size_t stride, uint32_t x0, uint32_t y0,
                           uint32_t w, uint32_t h, uint8_t *out) {
    uint8_t up[PCR_L3_MAX_PATCH + 2];
    int8_t res[PCR_L3_MAX_PATCH + 8];
    uint8_t d[PCR_L3_MAX_PATCH + 8];
    uint8_t bits[PCR_L3_MAX_PATCH + 2 + 16];
    size_t pos = 0;
    up[0] = 0;
    up[w + 1] = 0;
    for (uint32_t y = 0; y < h; y++) {
        const uint8_t *row = plane + (size_t)(y0 + y) * stride + x0;
        if (y == 0) {
            for (size_t x = 0; x < w; x++) res[x] = (int8_t)row[x];
        } else { /* size_t indices: with uint32_t ones GCC 12 does not vectorize this */
            for (size_t x = 0; x < w; x++)
                res[x] = (int8_t)(uint8_t)(row[x] - predict_sel(up[x], up[x + 1], up[x + 2]));
        }
        memcpy(up + 1, row, w);
        int8_t lo = 127, hi = -128;
        for (size_t x = 0; x < w; x++) {
            lo = res[x] < lo ? res[x] : lo;
            hi = res[x] > hi ? res[x] : hi;
        }
        unsigned span = (unsigned)(hi - lo), nbit = 0;
        while (span >> nbit) nbit++;
        size_t nb = row_bytes(w, nbit);
        uint8_t base = (uint8_t)lo;
        bits[0] = (uint8_t)(nbit | (base & 0x0F) << 4);
        bits[1] = (uint8_t)(base >> 4);
        if (nbit) {
            for (size_t x = 0; x < w; x++) d[x] = (uint8_t)(res[x] - lo);
            memset(d + w, 0, 8);
            pack_deltas(d, nbit, w, bits);
        }
        memcpy(out + pos, bits, nb);
        pos += nb;
    }
    return pos;
}

int pcr_l3_encode_planes(const uint8_t *const planes[3], uint32_t width, uint32_t height,
                         uint32_t patch, uint8_t *dst, size_t dst_cap, size_t *out_len) {
    uint64_t px, py;
    size_t need;
    if (!planes || !planes[0] || !planes[1] || !planes[2] || !dst || !out_len) return PCR_E_ARG;
    int rc = geometry(width, height, patch, &px, &py);
    if (rc) return rc;
    rc = pcr_l3_max_size(width, height, patch, &need);
    if (rc) return rc;
    if (dst_cap < need) return PCR_E_SPACE;
    uint64_t np = px * py;
    memcpy(dst, "LLL.", 4);
    wr32(dst + 4, width);
    wr32(dst + 8, height);
    dst[12] = (uint8_t)patch;
    size_t pos = L3_HEADER + 6u * np;
    for (unsigned ch = 0; ch < 3; ch++) {
        uint8_t *sizes = dst + L3_HEADER + 2u * np * ch;
        for (uint64_t j = 0; j < py; j++) {
            for (uint64_t i = 0; i < px; i++) {
                uint32_t x0 = (uint32_t)(i * patch), y0 = (uint32_t)(j * patch);
                uint32_t w = width - x0 < patch ? width - x0 : patch;
                uint32_t h = height - y0 < patch ? height - y0 : patch;
                size_t n = encode_patch(planes[ch], width, x0, y0, w, h, dst + pos);
                if (n > 0xFFFF) return PCR_E_RANGE; /* impossible for patch <= 128 */
                uint64_t k = j * px + i;
                sizes[2 * k] = (uint8_t)n;
                sizes[2 * k + 1] = (uint8_t)(n >> 8);
                pos += n;
            }
        }
    }
    *out_len = pos;
    return PCR_OK;
}

__attribute__((target_clones("avx2", "default")))
static void deinterleave3(const uint8_t *rgb, size_t n, uint8_t *r, uint8_t *g, uint8_t *b) {
    for (size_t i = 0; i < n; i++) {
        r[i] = rgb[3 * i];
        g[i] = rgb[3 * i + 1];
        b[i] = rgb[3 * i + 2];
    }
}

/* Exported plainly: clang does not resolve a target_clones function across files. */
void pcr_deinterleave3(const uint8_t *rgb, size_t n, uint8_t *r, uint8_t *g, uint8_t *b) {
    deinterleave3(rgb, n, r, g, b);
}

int pcr_l3_encode(const uint8_t *rgb, size_t rgb_len, uint32_t width, uint32_t height,
                  uint32_t patch, uint8_t *dst, size_t dst_cap, size_t *out_len) {
    uint64_t px, py;
    if (!rgb || !dst || !out_len) return PCR_E_ARG;
    int rc = geometry(width, height, patch, &px, &py);
    if (rc) return rc;
    if ((uint64_t)width * height * 3u != rgb_len) return PCR_E_ARG;
    /* Planar first, as in the decoder: the row loops then read contiguous bytes. */
    size_t n = (size_t)width * height;
    uint8_t *buf = malloc(3 * n);
    if (!buf) return PCR_E_NOMEM;
    const uint8_t *planes[3] = {buf, buf + n, buf + 2 * n};
    pcr_deinterleave3(rgb, n, buf, buf + n, buf + 2 * n);
    rc = pcr_l3_encode_planes(planes, width, height, patch, dst, dst_cap, out_len);
    free(buf);
    return rc;
}

int pcr_l3_info(const uint8_t *src, size_t len, uint32_t *width, uint32_t *height,
                uint32_t *patch) {
    uint64_t px, py;
    if (!src || !width || !height || !patch) return PCR_E_ARG;
    if (len < L3_HEADER) return PCR_E_TRUNCATED;
    if (memcmp(src, "LLL.", 4) != 0) return PCR_E_NOT_L3;
    uint32_t w = rd32(src + 4), h = rd32(src + 8), n = src[12];
    if (geometry(w, h, n, &px, &py) != PCR_OK) return PCR_E_BAD_HEADER;
    uint64_t np = px * py;
    /* Each patch needs 2 bytes per row in each channel: 6 * h * px payload bytes at least.
     * Checking this before anything else bounds the work a tiny hostile header can ask for. */
    if (np > (len - L3_HEADER) / 6u) return PCR_E_TRUNCATED;
    if ((uint64_t)h * px > (len - L3_HEADER - 6u * np) / 6u) return PCR_E_TRUNCATED;
    uint64_t total = L3_HEADER + 6u * np;
    for (uint64_t k = 0; k < 3u * np; k++) {
        const uint8_t *s = src + L3_HEADER + 2u * k;
        total += (uint64_t)s[0] | (uint64_t)s[1] << 8;
    }
    if (total > len) return PCR_E_TRUNCATED;
    if (total < len) return PCR_E_TRAILING;
    *width = w; *height = h; *patch = n;
    return PCR_OK;
}

/* Eight deltas of n bits take exactly n bytes; the first group starts at bit 12 (byte 1,
 * bit 4), so group g starts at byte 1 + g*n, bit 4.  A constant n lets the compiler unroll
 * the extraction into fixed shifts. */
static inline void unpack_n(const uint8_t *bits, unsigned n, uint32_t w, uint8_t *out) {
    const uint64_t mask = (1u << n) - 1u;
    uint32_t groups = (w + 7) / 8;
    for (uint32_t g = 0; g < groups; g++) {
        const uint8_t *p = bits + 1 + (size_t)g * n;
        uint64_t v = load64le(p) >> 4 | (uint64_t)p[8] << 60;
        for (unsigned j = 0; j < 8; j++) out[g * 8 + j] = (uint8_t)((v >> (j * n)) & mask);
    }
}

static void unpack_deltas(const uint8_t *bits, unsigned nbit, uint32_t w, uint8_t *out) {
    switch (nbit) {
    case 1: unpack_n(bits, 1, w, out); break;
    case 2: unpack_n(bits, 2, w, out); break;
    case 3: unpack_n(bits, 3, w, out); break;
    case 4: unpack_n(bits, 4, w, out); break;
    case 5: unpack_n(bits, 5, w, out); break;
    case 6: unpack_n(bits, 6, w, out); break;
    case 7: unpack_n(bits, 7, w, out); break;
    default: unpack_n(bits, 8, w, out); break;
    }
}

/* Decode one patch; `in` holds exactly its `size` bytes.  Rows are rebuilt in a planar
 * scratch row with a zero on each side, which is exactly the reference's border rule
 * (a and c are passed as the value 0 outside the patch). */
__attribute__((target_clones("avx2", "default")))
static int decode_patch(const uint8_t *in, size_t size, uint8_t *plane, size_t stride,
                        size_t pix_step, uint32_t x0, uint32_t y0, uint32_t w, uint32_t h) {
    uint8_t rows[2][PCR_L3_MAX_PATCH + 2];
    uint8_t bits[PCR_L3_MAX_PATCH + 2 + 16]; /* one row's bytes, zero-padded for wide loads */
    uint8_t delta[PCR_L3_MAX_PATCH + 8]; /* unpacking writes whole groups of 8 */
    uint8_t *prev = rows[0], *cur = rows[1];
    size_t pos = 0;
    memset(rows, 0, sizeof rows);
    for (uint32_t y = 0; y < h; y++) {
        if (size - pos < 2) return PCR_E_CORRUPT;
        const uint8_t *r = in + pos;
        unsigned nbit = r[0] & 0x0F;
        if (nbit > 8) return PCR_E_CORRUPT;
        uint8_t base = (uint8_t)(r[0] >> 4 | (r[1] & 0x0F) << 4);
        size_t nb = row_bytes(w, nbit);
        if (nb > size - pos) return PCR_E_CORRUPT;
        if (nbit == 0) {
            memset(delta, 0, w);
        } else {
            memcpy(bits, r, nb);
            memset(bits + nb, 0, 16);
            unpack_deltas(bits, nbit, w, delta);
        }
        if (y == 0) {
            for (uint32_t x = 0; x < w; x++) cur[x + 1] = (uint8_t)(delta[x] + base);
        } else {
            for (size_t x = 0; x < w; x++)
                cur[x + 1] = (uint8_t)(delta[x] + base + predict_sel(prev[x], prev[x + 1], prev[x + 2]));
        }
        uint8_t *row = plane + ((size_t)(y0 + y) * stride + x0) * pix_step;
        for (uint32_t x = 0; x < w; x++) row[x * pix_step] = cur[x + 1];
        uint8_t *t = prev; prev = cur; cur = t;
        pos += nb;
    }
    return pos == size ? PCR_OK : PCR_E_CORRUPT;
}

__attribute__((target_clones("avx2", "default")))
static void interleave3(const uint8_t *r, const uint8_t *g, const uint8_t *b, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        out[3 * i] = r[i];
        out[3 * i + 1] = g[i];
        out[3 * i + 2] = b[i];
    }
}

int pcr_l3_decode_planar(const uint8_t *src, size_t len, uint8_t *planes, size_t cap) {
    uint32_t width, height, patch;
    int rc = pcr_l3_info(src, len, &width, &height, &patch);
    if (rc) return rc;
    if (!planes) return PCR_E_ARG;
    size_t plane_size = (size_t)width * height;
    if ((uint64_t)plane_size * 3u > cap) return PCR_E_SPACE;
    uint64_t px = (width + (uint64_t)patch - 1) / patch, py = (height + (uint64_t)patch - 1) / patch;
    uint64_t np = px * py;
    size_t pos = L3_HEADER + 6u * np;
    for (unsigned ch = 0; ch < 3; ch++) {
        const uint8_t *sizes = src + L3_HEADER + 2u * np * ch;
        for (uint64_t j = 0; j < py; j++) {
            for (uint64_t i = 0; i < px; i++) {
                uint64_t k = j * px + i;
                size_t n = (size_t)sizes[2 * k] | (size_t)sizes[2 * k + 1] << 8;
                uint32_t x0 = (uint32_t)(i * patch), y0 = (uint32_t)(j * patch);
                uint32_t w = width - x0 < patch ? width - x0 : patch;
                uint32_t h = height - y0 < patch ? height - y0 : patch;
                rc = decode_patch(src + pos, n, planes + ch * plane_size, width, 1, x0, y0, w, h);
                if (rc) return rc;
                pos += n;
            }
        }
    }
    return PCR_OK;
}

int pcr_l3_decode(const uint8_t *src, size_t len, uint8_t *rgb, size_t rgb_cap) {
    uint32_t width, height, patch;
    int rc = pcr_l3_info(src, len, &width, &height, &patch);
    if (rc) return rc;
    if (!rgb) return PCR_E_ARG;
    size_t plane_size = (size_t)width * height;
    if ((uint64_t)plane_size * 3u > rgb_cap) return PCR_E_SPACE;
    /* Planar first: contiguous row stores vectorize; one interleaving pass at the end is
     * cheaper than strided stores in the row loop. */
    uint8_t *planes = malloc(3 * plane_size);
    if (!planes) return PCR_E_NOMEM;
    rc = pcr_l3_decode_planar(src, len, planes, 3 * plane_size);
    if (rc == PCR_OK)
        interleave3(planes, planes + plane_size, planes + 2 * plane_size, plane_size, rgb);
    free(planes);
    return rc;
}

int pcr_l3_choose_patch(uint32_t width, uint32_t height) {
    /* The paper: N = 32 below 1280x720, 64 up to 1920x1080, 128 above (by pixel count). */
    uint64_t px = (uint64_t)width * height;
    if (px < 1280u * 720u) return 32;
    if (px <= 1920u * 1080u) return 64;
    return 128;
}
