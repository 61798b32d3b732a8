/* The fused path's resize (fused_internal.h): a separable triangle filter, Pillow's
 * BILINEAR antialiased (its support widens with the reduction), with Pillow's 22-bit
 * weights and its rounding to uint8 between the horizontal and vertical passes, so the
 * bytes equal Pillow's resize of the same pixels; the flip and the CHW split or
 * normalisation happen on the way out. */
#include <math.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PCR_AVX2_RESIZE 1 /* hrow8, compiled for AVX2 alone and picked at load */
#endif

#include "fused_internal.h"

/* PCRFS_NO_AVX2=1 / PCRFS_NO_SSSE3=1 keep the resize off those instruction sets (the tests
 * hold every path to the same bytes). */
static int env_off(const char *name) {
    const char *v = getenv(name);
    return v && *v && *v != '0';
}

#define PRECISION_BITS 22 /* Pillow's: 255 * 2^22 * (sum of weights = 1) fits an int32 */

static double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Weights mapping [in0, in1) of an input line onto `out` pixels, reading only indexes in
 * [lo, hi). */
static int make_taps(double in0, double in1, int lo, int hi, uint32_t out, taps *t) {
    double scale = (in1 - in0) / out;
    double fscale = scale < 1.0 ? 1.0 : scale;
    double support = fscale; /* triangle: 1.0, widened by the reduction */
    int ksize = (int)ceil(support) * 2 + 1;
    t->ksize = ksize;
    t->k = malloc(sizeof(int32_t) * (size_t)ksize * out);
    t->lo = malloc(sizeof(int32_t) * out);
    t->n = malloc(sizeof(int32_t) * out);
    double *w = malloc(sizeof(double) * (size_t)ksize);
    if (!t->k || !t->lo || !t->n || !w) {
        free(w);
        return PCR_E_NOMEM;
    }
    for (uint32_t o = 0; o < out; o++) {
        double center = in0 + (o + 0.5) * scale;
        int a = (int)floor(center - support + 0.5), b = (int)floor(center + support + 0.5);
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (b - a > ksize) b = a + ksize;
        if (b <= a) { /* a box thinner than a pixel: its nearest pixel */
            a = (int)floor(center);
            if (a < lo) a = lo;
            if (a >= hi) a = hi - 1;
            b = a + 1;
        }
        double sum = 0;
        for (int i = a; i < b; i++) sum += (w[i - a] = triangle((i + 0.5 - center) / fscale));
        if (sum <= 0) { /* every tap at the triangle's edge: take the middle one */
            for (int i = a; i < b; i++) w[i - a] = 0;
            w[(b - a) / 2] = sum = 1;
        }
        int32_t *k = t->k + (size_t)o * ksize;
        for (int i = 0; i < b - a; i++)
            k[i] = (int32_t)lround(w[i] / sum * (double)(1 << PRECISION_BITS));
        t->lo[o] = a;
        t->n[o] = b - a;
    }
    free(w);
    /* each weight as k = kh * 2^11 + kl, two taps to an int32 of int16 pairs */
    int pairs = (ksize + 1) / 2;
    t->split = calloc((size_t)out * pairs * 2, sizeof(int32_t));
    if (!t->split) return PCR_E_NOMEM;
    for (uint32_t o = 0; o < out; o++) {
        const int32_t *k = t->k + (size_t)o * ksize;
        int32_t *d = t->split + (size_t)o * pairs * 2;
        for (int i = 0; i < t->n[o]; i += 2) {
            int32_t k0 = k[i], k1 = i + 1 < t->n[o] ? k[i + 1] : 0;
            d[i] = (k1 >> 11) << 16 | (k0 >> 11);
            d[i + 1] = (k1 & 2047) << 16 | (k0 & 2047);
        }
    }
    return PCR_OK;
}

void pcr_free_taps(taps *t) {
    free(t->split);
    free(t->k);
    free(t->lo);
    free(t->n);
}

static inline uint8_t clip8(int32_t v) {
    v = (v + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* One output pixel of the horizontal pass: n taps of RGB from p into q. */
static void hrow_scalar(const uint8_t *p, const int32_t *k, int n, uint8_t *q) {
    int32_t s0 = 0, s1 = 0, s2 = 0;
    for (int i = 0; i < n; i++, p += 3) {
        s0 += p[0] * k[i];
        s1 += p[1] * k[i];
        s2 += p[2] * k[i];
    }
    q[0] = clip8(s0);
    q[1] = clip8(s1);
    q[2] = clip8(s2);
}

/* One output row of the horizontal pass, out_w RGB pixels into m, mirrored if flip: the
 * rows a group of four leaves (and every row without SSE2). */
static void hrow(const uint8_t *src, int rx, const taps *t, uint32_t out_w, int flip, uint8_t *m) {
    for (uint32_t o = 0; o < out_w; o++)
        hrow_scalar(src + (size_t)(t->lo[o] - rx) * 3, t->k + (size_t)o * t->ksize, t->n[o],
                    m + (size_t)(flip ? out_w - 1 - o : o) * 3);
}

#if defined(__SSE2__)
/* Two taps of R, G and B per pmaddwd.  A weight is split k = kh * 2^11 + kl (both < 2^12,
 * int16), so the two 16-bit products' sums, recombined, are exactly the 22-bit sums the
 * scalar loop makes: the same pixels, several times faster. */
static inline __m128i pair(const uint8_t *a, const uint8_t *b) {
    uint32_t x, y;
    memcpy(&x, a, 4);
    memcpy(&y, b, 4);
    const __m128i zero = _mm_setzero_si128();
    return _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128((int)x), zero),
                              _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)y), zero));
}

/* pair()'s lanes from one 8-byte load and a byte shuffle (pshufb, SSSE3; inline asm, so the
 * rest of the file needs no SSSE3 target, used where the CPU has it). */
static inline __attribute__((always_inline)) __m128i pair_at(const uint8_t *p, const int ssse3) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (ssse3) {
        const __m128i lanes = _mm_setr_epi8(0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128, -128,
                                            -128, -128, -128);
        __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)p);
        __asm__("pshufb %1, %0" : "+x"(x) : "x"(lanes));
        return x;
    }
#else
    (void)ssse3;
#endif
    return pair(p, p + 3);
}

static int have_ssse3;
static void __attribute__((constructor)) pick_ssse3(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    have_ssse3 = __builtin_cpu_supports("ssse3") && !env_off("PCRFS_NO_SSSE3");
#endif
}

/* Output pixel i for a group of `rows` rows: the source pixel its taps start at (*p), their
 * count (*n) and split weights (returned); NULL when loads over that many rows would pass
 * the end, once hrow_scalar has written the group's pixel instead. */
static inline __attribute__((always_inline)) const int32_t *group_pixel(const uint8_t *src, size_t src_stride,
                                                                       const uint8_t *end, int rx, const taps *t,
                                                                       uint32_t out_w, int flip, uint32_t i,
                                                                       int rows, uint8_t *q, size_t m_stride,
                                                                       const uint8_t **p, int *n) {
    uint32_t o = flip ? out_w - 1 - i : i;
    *p = src + (size_t)(t->lo[o] - rx) * 3;
    *n = t->n[o];
    if (end - (*p + (rows - 1) * src_stride) < 3 * (ptrdiff_t)*n + 6) {
        const int32_t *k = t->k + (size_t)o * t->ksize;
        for (int r = 0; r < rows; r++) hrow_scalar(*p + r * src_stride, k, *n, q + r * m_stride);
        return NULL;
    }
    return t->split + (size_t)o * (size_t)((t->ksize + 1) / 2) * 2;
}

/* Four rows at once: each output pixel's weights are fetched and broadcast once for all
 * four, and the four results packed together; the sums are hrow_scalar's, term for term.  Pixels
 * are written in increasing address order (right to left when flipped), so each can be
 * stored as 4 bytes, its fourth overwritten by the next; the row's last gets 3. */
static inline __attribute__((always_inline)) void hrow4_t(const uint8_t *src, size_t src_stride,
                                                           const uint8_t *end, int rx, const taps *t,
                                                           uint32_t out_w, int flip, uint8_t *m,
                                                           size_t m_stride, const int ssse3) {
    const __m128i round = _mm_set1_epi32(1 << (PRECISION_BITS - 1));
    for (uint32_t i = 0; i < out_w; i++) {
        uint8_t *q = m + (size_t)i * 3;
        const uint8_t *p;
        int n;
        const int32_t *w = group_pixel(src, src_stride, end, rx, t, out_w, flip, i, 4, q, m_stride, &p, &n);
        if (!w) continue;
        __m128i h0 = _mm_setzero_si128(), h1 = h0, h2 = h0, h3 = h0;
        __m128i l0 = h0, l1 = h0, l2 = h0, l3 = h0;
        for (int j = 0; j < n; j += 2, p += 6) {
            const __m128i wh = _mm_set1_epi32(w[j]), wl = _mm_set1_epi32(w[j + 1]);
            __m128i x0 = pair_at(p, ssse3), x1 = pair_at(p + src_stride, ssse3);
            __m128i x2 = pair_at(p + 2 * src_stride, ssse3), x3 = pair_at(p + 3 * src_stride, ssse3);
            h0 = _mm_add_epi32(h0, _mm_madd_epi16(x0, wh));
            l0 = _mm_add_epi32(l0, _mm_madd_epi16(x0, wl));
            h1 = _mm_add_epi32(h1, _mm_madd_epi16(x1, wh));
            l1 = _mm_add_epi32(l1, _mm_madd_epi16(x1, wl));
            h2 = _mm_add_epi32(h2, _mm_madd_epi16(x2, wh));
            l2 = _mm_add_epi32(l2, _mm_madd_epi16(x2, wl));
            h3 = _mm_add_epi32(h3, _mm_madd_epi16(x3, wh));
            l3 = _mm_add_epi32(l3, _mm_madd_epi16(x3, wl));
        }
#define PCR_HSUM(h, l) \
    _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(h, 11), l), round), PRECISION_BITS)
        __m128i v = _mm_packus_epi16(_mm_packs_epi32(PCR_HSUM(h0, l0), PCR_HSUM(h1, l1)),
                                     _mm_packs_epi32(PCR_HSUM(h2, l2), PCR_HSUM(h3, l3)));
#undef PCR_HSUM
        if (i + 1 < out_w) {
            uint32_t x = (uint32_t)_mm_cvtsi128_si32(v);
            memcpy(q, &x, 4);
            x = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(v, 4));
            memcpy(q + m_stride, &x, 4);
            x = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(v, 8));
            memcpy(q + 2 * m_stride, &x, 4);
            x = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(v, 12));
            memcpy(q + 3 * m_stride, &x, 4);
        } else {
            uint8_t px[16];
            _mm_storeu_si128((__m128i *)(void *)px, v);
            for (int r = 0; r < 4; r++) memcpy(q + r * m_stride, px + 4 * r, 3);
        }
    }
}

static void hrow4(const uint8_t *src, size_t src_stride, const uint8_t *end, int rx, const taps *t,
                  uint32_t out_w, int flip, uint8_t *m, size_t m_stride) {
    if (have_ssse3)
        hrow4_t(src, src_stride, end, rx, t, out_w, flip, m, m_stride, 1);
    else
        hrow4_t(src, src_stride, end, rx, t, out_w, flip, m, m_stride, 0);
}
#endif

#if PCR_AVX2_RESIZE
/* hrow4_t's sums for eight rows: rows r and r + 4 share a 256-bit register (one per
 * 128-bit lane), so each weight pair's multiply-adds cover two rows. */
__attribute__((target("avx2"))) static void hrow8(const uint8_t *src, size_t src_stride, const uint8_t *end,
                                                  int rx, const taps *t, uint32_t out_w, int flip,
                                                  uint8_t *m, size_t m_stride) {
    const __m256i lanes = _mm256_setr_epi8(0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128, -128, -128,
                                           -128, -128, 0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128,
                                           -128, -128, -128, -128);
    const __m256i round = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    const size_t s4 = 4 * src_stride;
    for (uint32_t i = 0; i < out_w; i++) {
        uint8_t *q = m + (size_t)i * 3;
        const uint8_t *p;
        int n;
        const int32_t *w = group_pixel(src, src_stride, end, rx, t, out_w, flip, i, 8, q, m_stride, &p, &n);
        if (!w) continue;
        __m256i h[4], l[4];
        for (int r = 0; r < 4; r++) h[r] = l[r] = _mm256_setzero_si256();
        for (int j = 0; j < n; j += 2, p += 6) {
            const __m256i wh = _mm256_set1_epi32(w[j]), wl = _mm256_set1_epi32(w[j + 1]);
            for (int r = 0; r < 4; r++) {
                const uint8_t *a = p + r * src_stride;
                __m256i x = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(const void *)a)),
                    _mm_loadl_epi64((const __m128i *)(const void *)(a + s4)), 1);
                x = _mm256_shuffle_epi8(x, lanes);
                h[r] = _mm256_add_epi32(h[r], _mm256_madd_epi16(x, wh));
                l[r] = _mm256_add_epi32(l[r], _mm256_madd_epi16(x, wl));
            }
        }
        __m256i v[4];
        for (int r = 0; r < 4; r++)
            v[r] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(h[r], 11), l[r]), round),
                                     PRECISION_BITS);
        /* per lane: rows 0-3, then rows 4-7, each pixel as R G B and a spare byte */
        uint32_t px[8];
        _mm256_storeu_si256((__m256i *)(void *)px,
                            _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])));
        if (i + 1 < out_w)
            for (int r = 0; r < 8; r++) memcpy(q + r * m_stride, &px[r], 4);
        else
            for (int r = 0; r < 8; r++) memcpy(q + r * m_stride, &px[r], 3);
    }
}

static int have_avx2;
static void __attribute__((constructor)) pick_avx2(void) {
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") && !env_off("PCRFS_NO_AVX2");
}
#endif

/* RGB pixels to three planes, one at a time (the tail, and CPUs without SSSE3).  GCC's
 * vectorised form of this loop gathers bytes one by one and is slower. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static void planes_scalar(const uint8_t *rgb, size_t n, uint8_t *d, size_t plane) {
    for (size_t x = 0; x < n; x++, rgb += 3) {
        d[x] = rgb[0];
        d[plane + x] = rgb[1];
        d[2 * plane + x] = rgb[2];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* SPLIT[ch][j]: the pshufb mask taking channel ch's bytes out of the jth 16 bytes of 16
 * pixels (48 bytes) to their places in the channel's 16; 0x80 zeroes the rest. */
static uint8_t SPLIT[3][3][16] __attribute__((aligned(16)));
static void __attribute__((constructor)) split_masks(void) {
    for (int ch = 0; ch < 3; ch++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 16; i++) {
                int at = 3 * i + ch;
                SPLIT[ch][j][i] = at / 16 == j ? (uint8_t)(at % 16) : 0x80;
            }
}

static inline __attribute__((always_inline)) __m128i shuffled(__m128i x, const uint8_t *mask) {
    __m128i m = _mm_load_si128((const __m128i *)(const void *)mask);
    __asm__("pshufb %1, %0" : "+x"(x) : "x"(m));
    return x;
}

/* 16 pixels at a time: three 16-byte loads, each channel ORed from three shuffles. */
static void planes_ssse3(const uint8_t *rgb, size_t n, uint8_t *d, size_t plane) {
    size_t x = 0;
    for (; x + 16 <= n; x += 16, rgb += 48) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)rgb);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(rgb + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(rgb + 32));
        for (int ch = 0; ch < 3; ch++) {
            __m128i v = _mm_or_si128(_mm_or_si128(shuffled(a, SPLIT[ch][0]), shuffled(b, SPLIT[ch][1])),
                                     shuffled(c, SPLIT[ch][2]));
            _mm_storeu_si128((__m128i *)(void *)(d + (size_t)ch * plane + x), v);
        }
    }
    planes_scalar(rgb, n - x, d + x, plane);
}
#endif

static void planes(const uint8_t *rgb, size_t n, uint8_t *d, size_t plane) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_ssse3) {
        planes_ssse3(rgb, n, d, plane);
        return;
    }
#endif
    planes_scalar(rgb, n, d, plane);
}

/* The vertical pass's inner loop, a row of multiply-adds, vectorises; built for AVX2 too
 * where the compiler can pick the clone at load time (not under the sanitizers' builds). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define PCR_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PCR_VECTOR_CLONES
#endif

/* out[x] = clip8(sum over i < n of rows[i * stride + x] * k[i]), for x < len */
PCR_VECTOR_CLONES
static void vrow(const uint8_t *rows, size_t stride, const int32_t *k, int n, size_t len, int32_t *acc,
                 uint8_t *out) {
    int32_t w = k[0];
    for (size_t x = 0; x < len; x++) acc[x] = rows[x] * w;
    for (int i = 1; i < n; i++) {
        const uint8_t *r = rows + (size_t)i * stride;
        w = k[i];
        for (size_t x = 0; x < len; x++) acc[x] += r[x] * w;
    }
    for (size_t x = 0; x < len; x++) {
        int32_t v = (acc[x] + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS;
        v = v < 0 ? 0 : v;
        out[x] = (uint8_t)(v > 255 ? 255 : v);
    }
}

/* Resize the region (rw x rh RGB, origin at (rx, ry) of the scaled image) through the taps
 * into dst (out_h x out_w, HWC or CHW).  The horizontal pass first, into uint8 as Pillow
 * rounds between its passes. */
int pcr_resample(const uint8_t *region, const uint8_t *end, int rw, int rx, int ry,
                    const taps *tx, const taps *ty, const pcr_crop *c, uint8_t *dst) {
    uint32_t out_w = c->out_width, out_h = c->out_height;
    int flip = c->flip, chw = c->flags & PCR_CROP_CHW, fl = c->flags & PCR_CROP_FLOAT;
    float *fdst = (float *)(void *)dst;
    int y0 = ty->lo[0], y1 = ty->lo[0] + ty->n[0];
    for (uint32_t o = 1; o < out_h; o++) {
        if (ty->lo[o] < y0) y0 = ty->lo[o];
        if (ty->lo[o] + ty->n[o] > y1) y1 = ty->lo[o] + ty->n[o];
    }
    size_t rows = (size_t)(y1 - y0), stride = (size_t)out_w * 3;
    uint8_t *mid = pcr_scratch_take(S_MID, rows * stride + stride);
    int32_t *acc = malloc(stride * sizeof(int32_t));
    if (!mid || !acc) {
        free(acc);
        return PCR_E_NOMEM;
    }
    uint8_t *row = mid + rows * stride;
    size_t r = 0;
#if PCR_AVX2_RESIZE
    if (have_avx2)
        for (; r + 8 <= rows; r += 8)
            hrow8(region + (size_t)(y0 + (int)r - ry) * (size_t)rw * 3, (size_t)rw * 3, end, rx, tx, out_w,
                  flip, mid + r * stride, stride);
#endif
#if defined(__SSE2__)
    for (; r + 4 <= rows; r += 4)
        hrow4(region + (size_t)(y0 + (int)r - ry) * (size_t)rw * 3, (size_t)rw * 3, end, rx, tx, out_w,
              flip, mid + r * stride, stride);
#endif
    for (; r < rows; r++)
        hrow(region + (size_t)(y0 + (int)r - ry) * (size_t)rw * 3, rx, tx, out_w, flip,
             mid + r * stride);
    size_t plane = (size_t)out_w * out_h;
    for (uint32_t o = 0; o < out_h; o++) {
        vrow(mid + (size_t)(ty->lo[o] - y0) * stride, stride, ty->k + (size_t)o * ty->ksize,
             ty->n[o], stride, acc, row);
        size_t at = (size_t)o * out_w;
        if (fl) { /* the uint8 value, then (v - mean) / std: the same pixels, normalised */
            for (int ch = 0; ch < 3; ch++)
                for (size_t x = 0; x < out_w; x++)
                    fdst[ch * plane + at + x] = ((float)row[3 * x + ch] - c->mean[ch]) * c->inv_std[ch];
        } else if (chw) {
            planes(row, out_w, dst + at, plane);
        } else {
            memcpy(dst + at * 3, row, stride);
        }
    }
    free(acc);
    return PCR_OK;
}

/* The box in scaled coordinates, the taps over it, and the integer span they read. */
int pcr_plan(const pcr_crop *c, double sx, double sy, uint32_t sw, uint32_t sh, taps *tx,
                taps *ty, int *cx0, int *cx1, int *cy0, int *cy1) {
    double x0 = c->left * sx, x1 = (c->left + c->width) * sx;
    double y0 = c->top * sy, y1 = (c->top + c->height) * sy;
    int lx = (int)floor(x0), hx = (int)ceil(x1), ly = (int)floor(y0), hy = (int)ceil(y1);
    if (lx < 0) lx = 0;
    if (ly < 0) ly = 0;
    if (hx > (int)sw) hx = (int)sw;
    if (hy > (int)sh) hy = (int)sh;
    if (hx <= lx) hx = lx + 1;
    if (hy <= ly) hy = ly + 1;
    int rc = make_taps(x0, x1, lx, hx, c->out_width, tx);
    if (rc == PCR_OK) rc = make_taps(y0, y1, ly, hy, c->out_height, ty);
    if (rc != PCR_OK) return rc;
    *cx0 = lx;
    *cx1 = hx;
    *cy0 = ly;
    *cy1 = hy;
    return PCR_OK;
}
