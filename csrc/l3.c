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

/* The reference's "custom Paeth": a == 0 / c == 0 are tests on VALUES (border pixels are
 * passed as 0), and the middle branch compares pa <= pc, not pb <= pc. */
static inline int predict(int a, int b, int c) {
    int p = a + c - b;
    if (a == 0) return abs(p - b) <= abs(p - c) ? b : c;
    if (c == 0) return abs(p - a) <= abs(p - b) ? a : b;
    int pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    if (pa <= pb && pa <= pc) return a;
    if (pa <= pc) return b;
    return c;
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

/* Encode one patch of one plane (stride = image width); returns its byte size. */
static size_t encode_patch(const uint8_t *plane, size_t stride, size_t pix_step, uint32_t x0,
                           uint32_t y0, uint32_t w, uint32_t h, uint8_t *out) {
    int8_t res[PCR_L3_MAX_PATCH];
    size_t pos = 0;
    for (uint32_t y = 0; y < h; y++) {
        const uint8_t *row = plane + ((size_t)(y0 + y) * stride + x0) * pix_step;
        const uint8_t *up = row - stride * pix_step;
        int lo = 127, hi = -128;
        for (uint32_t x = 0; x < w; x++) {
            int pred = 0;
            if (y > 0) {
                int a = x > 0 ? up[(x - 1) * pix_step] : 0;
                int b = up[x * pix_step];
                int c = x + 1 < w ? up[(x + 1) * pix_step] : 0;
                pred = predict(a, b, c);
            }
            int8_t r = (int8_t)(uint8_t)(row[x * pix_step] - pred);
            res[x] = r;
            if (r < lo) lo = r;
            if (r > hi) hi = r;
        }
        unsigned span = (unsigned)(hi - lo), nbit = 0;
        while (span >> nbit) nbit++;
        size_t nb = row_bytes(w, nbit);
        uint8_t *o = out + pos;
        memset(o, 0, nb);
        uint8_t base = (uint8_t)(int8_t)lo;
        o[0] = (uint8_t)(nbit | (base & 0x0F) << 4);
        o[1] = (uint8_t)(base >> 4);
        if (nbit) {
            size_t bit = 12;
            for (uint32_t x = 0; x < w; x++, bit += nbit) {
                unsigned d = (unsigned)(res[x] - lo); /* 0..255 */
                unsigned v = d << (bit & 7);
                o[bit >> 3] |= (uint8_t)v;
                if ((bit & 7) + nbit > 8) o[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
            }
        }
        pos += nb;
    }
    return pos;
}

int pcr_l3_encode(const uint8_t *rgb, size_t rgb_len, uint32_t width, uint32_t height,
                  uint32_t patch, uint8_t *dst, size_t dst_cap, size_t *out_len) {
    uint64_t px, py;
    size_t need;
    if (!rgb || !dst || !out_len) return PCR_E_ARG;
    int rc = geometry(width, height, patch, &px, &py);
    if (rc) return rc;
    if ((uint64_t)width * height * 3u != rgb_len) return PCR_E_ARG;
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
                size_t n = encode_patch(rgb + ch, width, 3, x0, y0, w, h, dst + pos);
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

/* Branch-free form of predict() on 16-bit lanes so the per-row loop vectorizes wide;
 * same results (|p - x| <= 510 fits easily). */
static inline int16_t abs16(int16_t v) { return v < 0 ? (int16_t)-v : v; }
static inline uint8_t predict_sel(int16_t a, int16_t b, int16_t c) {
    int16_t p = (int16_t)(a + c - b);
    int16_t pa = abs16((int16_t)(p - a)), pb = abs16((int16_t)(p - b)), pc = abs16((int16_t)(p - c));
    int16_t if_a0 = pb <= pc ? b : c;
    int16_t if_c0 = pa <= pb ? a : b;
    int16_t other = (pa <= pb && pa <= pc) ? a : (pa <= pc ? b : c);
    return (uint8_t)(a == 0 ? if_a0 : (c == 0 ? if_c0 : other));
}

static inline uint64_t load64le(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only (x86-64, aarch64) */
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
            for (uint32_t x = 0; x < w; x++)
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
