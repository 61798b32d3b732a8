/* Entropy decoding, one restart interval at a time (see jpeg_decode.h).  Each interval
 * starts with zero DC predictions and no end-of-band run, so intervals of one scan are
 * independent; pcrfs/torch/jpeg_triton.py runs the same steps on the GPU, one program per
 * interval, and the tests hold the two to the same coefficients.
 *
 * Damage is refused, never decoded into garbage: a code no table holds, a coefficient
 * index past 63 (or past the scan's band), or an interval that needs more bits than it
 * has (past its end the reader supplies zeros, counted as overrun). */
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "jpeg_decode.h"
#include "pcr_native.h"

typedef struct {
    const uint8_t *p, *end;
    uint64_t acc;   /* next bits, MSB first */
    int bits;       /* valid bits in acc */
    int64_t zeros;  /* zero bytes supplied past the end */
} bitreader;

static inline void fill(bitreader *b) {
    if (b->end - b->p >= 8) {
        /* 8 bytes at once: the bits past the whole bytes taken are the stream's next bits
         * at their own places, so taking those bytes again later ORs in the same values */
        uint64_t x;
        memcpy(&x, b->p, 8);
        b->acc |= __builtin_bswap64(x) >> b->bits;
        int k = (63 - b->bits) >> 3;
        b->p += k;
        b->bits += 8 * k;
        return;
    }
    while (b->bits <= 56) {
        uint64_t x = 0;
        if (b->p < b->end) x = *b->p++;
        else b->zeros++;
        b->acc |= x << (56 - b->bits);
        b->bits += 8;
    }
}

static inline uint32_t get(bitreader *b, int n) {
    if (n == 0) return 0;
    if (b->bits < n) fill(b);
    uint32_t v = (uint32_t)(b->acc >> (64 - n));
    b->acc <<= n;
    b->bits -= n;
    return v;
}

/* One symbol, or -1 for a code the table does not hold. */
static inline int huff(bitreader *b, const int32_t *t) {
    if (b->bits < 16) fill(b);
    int32_t e = t[PCR_HUFF_LOOK + (b->acc >> 56)];
    if (e) {
        b->acc <<= e >> 8;
        b->bits -= e >> 8;
        return e & 0xFF;
    }
    for (int l = 9; l <= 16; l++) {
        int32_t code = (int32_t)(b->acc >> (64 - l));
        if (code <= t[PCR_HUFF_MAXCODE + l]) {
            b->acc <<= l;
            b->bits -= l;
            return t[PCR_HUFF_VALS + ((code + t[PCR_HUFF_VALOFF + l]) & 0xFF)];
        }
    }
    return -1;
}

/* The value of s extra bits (JPEG's EXTEND). */
static inline int extend(uint32_t v, int s) {
    return s == 0 ? 0 : (v < (1u << (s - 1)) ? (int)v - (1 << s) + 1 : (int)v);
}

/* Bit k set where the coefficient at zigzag index k is nonzero.  A refinement scan sends a
 * correction bit for each coefficient already nonzero, so walking these bits instead of
 * all 63 positions is most of its cost saved.  NZ_ZZ[j][v]: the zigzag bits of the
 * natural-order positions 8j..8j+7 flagged in v. */
static uint64_t NZ_ZZ[8][256];

static void __attribute__((constructor)) nz_tables(void) {
    uint8_t zz_of[64];
    for (int k = 0; k < 64; k++) zz_of[pcr_zigzag[k]] = (uint8_t)k;
    for (int j = 0; j < 8; j++)
        for (int v = 0; v < 256; v++) {
            uint64_t m = 0;
            for (int i = 0; i < 8; i++)
                if (v >> i & 1) m |= 1ull << zz_of[8 * j + i];
            NZ_ZZ[j][v] = m;
        }
}

static inline uint64_t nonzero_zz(const int16_t *blk) {
    uint64_t m = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    for (int i = 0; i < 4; i++) {
        __m128i a = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 16 * i)), zero);
        __m128i c = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 16 * i + 8)), zero);
        unsigned nz = ~(unsigned)_mm_movemask_epi8(_mm_packs_epi16(a, c)) & 0xFFFFu;
        m |= NZ_ZZ[2 * i][nz & 0xFF] | NZ_ZZ[2 * i + 1][nz >> 8];
    }
#else
    for (int j = 0; j < 8; j++) {
        unsigned v = 0;
        for (int i = 0; i < 8; i++) v |= (unsigned)(blk[8 * j + i] != 0) << i;
        m |= NZ_ZZ[j][v];
    }
#endif
    return m;
}

/* Zigzag indexes lo..hi (lo <= hi <= 63) as a mask. */
static inline uint64_t band(int lo, int hi) {
    return ((2ull << hi) - 1) & (~0ull << lo);
}

/* One correction bit for each coefficient in `set` (zigzag order), as libjpeg applies it:
 * the magnitude gains p1 unless that bit is already there. */
static inline void correct(bitreader *b, int16_t *blk, uint64_t set, int p1) {
    while (set) {
        if (b->bits < 32) fill(b); /* then at least 57 bits (zeros past the end) */
        uint64_t acc = b->acc;
        int used = 0;
        for (; set && used < b->bits; used++, acc <<= 1) {
            /* without a branch on the bit: it is a coin toss, and a mispredicted jump costs
             * more than the arithmetic */
            int16_t *c = blk + pcr_zigzag[__builtin_ctzll(set)];
            set &= set - 1;
            int v = *c, sign = v >> 31, on = (int)(acc >> 63) & ((v & p1) == 0);
            *c = (int16_t)(v + (((p1 ^ sign) - sign) & -on));
        }
        b->acc = acc;
        b->bits -= used;
    }
}

typedef struct {
    const pcr_jpeg_scan *s;
    const int32_t *dct[4], *act[4]; /* each scan component's derived tables */
    bitreader br;
    int pred[4];
    int32_t eobrun;
    int16_t *const *base;           /* each frame component's first block */
} state;

/* The lowest set bit of m after skipping r set bits (0 if m has r or fewer).  With BMI2,
 * one pdep; as inline asm, so the rest of the file needs no BMI2 target. */
static inline __attribute__((always_inline)) uint64_t nth_set_bit(uint64_t m, int r, const int bmi2) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (bmi2) {
        uint64_t out;
        __asm__("pdep %2, %1, %0" : "=r"(out) : "r"(1ull << r), "r"(m));
        return out;
    }
#else
    (void)bmi2;
#endif
    for (; r > 0 && m; r--) m &= m - 1;
    return m & (~m + 1);
}

/* pdep is one fast instruction on Intel since Haswell and AMD since Zen 3; Zen 1 and 2
 * microcode it (slower than the loop).  PCRFS_NO_PDEP=1 takes the loop anywhere (the
 * tests hold the two to the same coefficients). */
static int use_pdep;
static void __attribute__((constructor)) pick_pdep(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    use_pdep = __builtin_cpu_supports("bmi2") && !__builtin_cpu_is("znver1") && !__builtin_cpu_is("znver2");
    const char *off = getenv("PCRFS_NO_PDEP");
    if (off && *off && *off != '0') use_pdep = 0;
#endif
}

/* AC refinement (G.1.2.3): new coefficients of magnitude p1, each after a run of r
 * coefficients with no history, and a correction bit for every coefficient with history
 * passed on the way; an end-of-band run corrects the rest of the band in each block. */
static inline __attribute__((always_inline)) int ac_refine_t(state *st, int16_t *blk, const int32_t *act,
                                                             const int bmi2) {
    const pcr_jpeg_scan *s = st->s;
    bitreader *b = &st->br;
    int p1 = 1 << s->Al, k = s->Ss, Se = s->Se;
    uint64_t nz = nonzero_zz(blk);
    if (st->eobrun == 0) {
        for (; k <= Se; k++) {
            int rs = huff(b, act);
            if (rs < 0) return -1;
            int r = rs >> 4, sz = rs & 15, val = 0;
            if (sz) {
                if (sz != 1) return -1;
                val = get(b, 1) ? p1 : -p1;
            } else if (r != 15) {
                st->eobrun = (1 << r) + (int32_t)get(b, r);
                break;
            }
            /* stop at the (r+1)th coefficient with no history, correcting those passed */
            uint64_t at = nth_set_bit(~nz & band(k, Se), r, bmi2);
            int stop = at ? __builtin_ctzll(at) : Se + 1;
            if (stop > k) correct(b, blk, nz & band(k, stop - 1), p1);
            k = stop;
            if (sz) {
                if (k > Se) return -1;
                blk[pcr_zigzag[k]] = (int16_t)val;
            }
        }
    }
    if (st->eobrun > 0) {
        if (k <= Se) correct(b, blk, nz & band(k, Se), p1);
        st->eobrun--;
    }
    return 0;
}

static int ac_refine_plain(state *st, int16_t *blk, const int32_t *act) { return ac_refine_t(st, blk, act, 0); }
static int ac_refine_pdep(state *st, int16_t *blk, const int32_t *act) { return ac_refine_t(st, blk, act, 1); }

/* `kind` is a constant at each of walk()'s call sites, so each scan kind gets a loop of its
 * own with no per-block dispatch. */
static inline __attribute__((always_inline)) int block(state *st, int i, int16_t *blk, const int kind) {
    const pcr_jpeg_scan *s = st->s;
    bitreader *b = &st->br;
    const int32_t *dct = st->dct[i], *act = st->act[i];
    switch (kind) {
    case PCR_SCAN_SEQ:
    case PCR_SCAN_DC_FIRST: {
        int t = huff(b, dct);
        if (t < 0 || t > 16) return -1;
        st->pred[i] += extend(get(b, t), t);
        blk[0] = (int16_t)(kind == PCR_SCAN_SEQ ? st->pred[i] : (int)((unsigned)st->pred[i] << s->Al));
        if (kind == PCR_SCAN_DC_FIRST) return 0;
        for (int k = 1; k < 64; k++) {
            int rs = huff(b, act);
            if (rs < 0) return -1;
            int r = rs >> 4, sz = rs & 15;
            if (sz) {
                k += r;
                if (k > 63) return -1;
                blk[pcr_zigzag[k]] = (int16_t)extend(get(b, sz), sz);
            } else if (r == 15) {
                k += 15;
            } else {
                break;
            }
        }
        return 0;
    }
    case PCR_SCAN_DC_REFINE:
        if (get(b, 1)) blk[0] = (int16_t)(blk[0] | (1 << s->Al));
        return 0;
    case PCR_SCAN_AC_FIRST:
        if (st->eobrun > 0) {
            st->eobrun--;
            return 0;
        }
        for (int k = s->Ss; k <= s->Se; k++) {
            int rs = huff(b, act);
            if (rs < 0) return -1;
            int r = rs >> 4, sz = rs & 15;
            if (sz) {
                k += r;
                if (k > s->Se) return -1;
                blk[pcr_zigzag[k]] = (int16_t)((unsigned)extend(get(b, sz), sz) << s->Al);
            } else if (r == 15) {
                k += 15;
            } else {
                st->eobrun = (1 << r) + (int32_t)get(b, r) - 1;
                break;
            }
        }
        return 0;
    case PCR_SCAN_AC_REFINE:
        return use_pdep ? ac_refine_pdep(st, blk, act) : ac_refine_plain(st, blk, act);
    }
    return -1;
}

/* The interval's MCUs in order.  Block addresses are running pointers (a product per block
 * was a visible share of the one-symbol DC scans), and an AC first scan's end-of-band run
 * passes its blocks untouched in one step. */
static inline __attribute__((always_inline)) int walk(state *st, const pcr_jpeg_info *info,
                                                      const pcr_jpeg_interval *iv, const int kind) {
    const pcr_jpeg_scan *s = st->s;
    int mpr = s->mcus_per_row, row = iv->first_mcu / mpr, col = iv->first_mcu % mpr;
    if (s->ncomp == 1) {
        /* non-interleaved: an MCU is one block, over the component's own blocks */
        int c = s->comp[0];
        int64_t bw = info->bw[c];
        int16_t *p = st->base[c] + ((int64_t)row * bw + col) * 64;
        for (int m = 0; m < iv->n_mcus; m++) {
            if (kind == PCR_SCAN_AC_FIRST && st->eobrun > 0) {
                int skip = st->eobrun < iv->n_mcus - m ? st->eobrun : iv->n_mcus - m;
                st->eobrun -= skip;
                m += skip - 1;
                col += skip;
                row += col / mpr;
                col %= mpr;
                p = st->base[c] + ((int64_t)row * bw + col) * 64;
                continue;
            }
            if (block(st, 0, p, kind)) return PCR_E_CORRUPT;
            /* bits used past the interval's end: only damaged data needs them */
            if (st->br.zeros * 8 > st->br.bits) return PCR_E_CORRUPT;
            p += 64;
            if (++col == mpr) {
                col = 0;
                row++;
                p = st->base[c] + (int64_t)row * bw * 64;
            }
        }
        return PCR_OK;
    }
    /* interleaved: each MCU's blocks at fixed offsets from its components' corners */
    int nb = 0, bi[10]; /* the parser refuses MCUs of more than 10 blocks (B.2.3) */
    int64_t off[10];
    for (int i = 0; i < s->ncomp; i++) {
        int c = s->comp[i];
        for (int y = 0; y < info->v[c]; y++)
            for (int x = 0; x < info->h[c]; x++) {
                if (nb == 10) return PCR_E_ARG;
                bi[nb] = i;
                off[nb++] = ((int64_t)y * info->bw[c] + x) * 64;
            }
    }
    int16_t *corner[4];
    for (int m = 0; m < iv->n_mcus; m++) {
        if (m == 0 || col == 0)
            for (int i = 0; i < s->ncomp; i++) {
                int c = s->comp[i];
                corner[i] = st->base[c] +
                            ((int64_t)row * info->v[c] * info->bw[c] + (int64_t)col * info->h[c]) * 64;
            }
        for (int j = 0; j < nb; j++)
            if (block(st, bi[j], corner[bi[j]] + off[j], kind)) return PCR_E_CORRUPT;
        if (st->br.zeros * 8 > st->br.bits) return PCR_E_CORRUPT;
        for (int i = 0; i < s->ncomp; i++) corner[i] += (int64_t)info->h[s->comp[i]] * 64;
        if (++col == mpr) {
            col = 0;
            row++;
        }
    }
    return PCR_OK;
}

static int interval(const pcr_jpeg_info *info, const int32_t *tables, const uint8_t *data,
                    const pcr_jpeg_interval *iv, int16_t *const *base) {
    if (iv->scan < 0 || iv->scan >= info->nscans || iv->data_off < 0 || iv->data_len < 0 ||
        (size_t)(iv->data_off + iv->data_len) > info->data_len)
        return PCR_E_ARG;
    const pcr_jpeg_scan *s = &info->scans[iv->scan];
    if (iv->first_mcu < 0 || iv->n_mcus < 0 || iv->first_mcu + iv->n_mcus > s->mcus ||
        s->mcus_per_row <= 0)
        return PCR_E_ARG;
    state st;
    memset(&st, 0, sizeof(st));
    st.s = s;
    st.base = base;
    for (int i = 0; i < s->ncomp && i < 4; i++) {
        st.dct[i] = s->dc_tbl[i] >= 0 ? tables + (size_t)s->dc_tbl[i] * PCR_HUFF_WORDS : NULL;
        st.act[i] = s->ac_tbl[i] >= 0 ? tables + (size_t)s->ac_tbl[i] * PCR_HUFF_WORDS : NULL;
    }
    st.br.p = data + iv->data_off;
    st.br.end = st.br.p + iv->data_len;
    switch (s->kind) {
    case PCR_SCAN_SEQ: return walk(&st, info, iv, PCR_SCAN_SEQ);
    case PCR_SCAN_DC_FIRST: return walk(&st, info, iv, PCR_SCAN_DC_FIRST);
    case PCR_SCAN_DC_REFINE: return walk(&st, info, iv, PCR_SCAN_DC_REFINE);
    case PCR_SCAN_AC_FIRST: return walk(&st, info, iv, PCR_SCAN_AC_FIRST);
    case PCR_SCAN_AC_REFINE: return walk(&st, info, iv, PCR_SCAN_AC_REFINE);
    }
    return PCR_E_ARG;
}

int pcr_jpeg_decode_into(const pcr_jpeg_info *info, const int32_t *tables, const uint8_t *data,
                         const pcr_jpeg_interval *intervals, size_t first, size_t n,
                         int16_t *const base[4], int64_t *bad) {
    if (!info || !tables || !data || !intervals || !base || !bad) return PCR_E_ARG;
    *bad = -1;
    if (first > (size_t)info->nintervals || n > (size_t)info->nintervals - first) return PCR_E_ARG;
    for (int c = 0; c < info->ncomp && c < 4; c++)
        if (!base[c]) return PCR_E_ARG;
    for (size_t i = first; i < first + n; i++) {
        int rc = interval(info, tables, data, &intervals[i], base);
        if (rc != PCR_OK) {
            *bad = (int64_t)i;
            return rc;
        }
    }
    return PCR_OK;
}

int pcr_jpeg_decode_intervals(const pcr_jpeg_info *info, const int32_t *tables,
                              const uint8_t *data, const pcr_jpeg_interval *intervals,
                              size_t first, size_t n, int16_t *coefs, int64_t *bad) {
    if (!info || !coefs || !bad) return PCR_E_ARG;
    int16_t *base[4] = {NULL, NULL, NULL, NULL};
    for (int c = 0; c < info->ncomp && c < 4; c++) base[c] = coefs + (size_t)info->coef_offset[c] * 64;
    return pcr_jpeg_decode_into(info, tables, data, intervals, first, n, base, bad);
}
