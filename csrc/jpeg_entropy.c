/* Entropy decoding, one restart interval at a time (see jpeg_decode.h).  Each interval
 * starts with zero DC predictions and no end-of-band run, so intervals of one scan are
 * independent; pcrfs/torch/jpeg_triton.py runs the same steps on the GPU, one program per
 * interval, and the tests hold the two to the same coefficients.
 *
 * Damage is refused, never decoded into garbage: a code no table holds, a coefficient
 * index past 63 (or past the scan's band), or an interval that needs more bits than it
 * has (past its end the reader supplies zeros, counted as overrun). */
#include <string.h>
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

typedef struct {
    const pcr_jpeg_scan *s;
    const int32_t *tables;
    bitreader br;
    int pred[4];
    int32_t eobrun;
} state;

static int block(state *st, int i, int16_t *blk) {
    const pcr_jpeg_scan *s = st->s;
    bitreader *b = &st->br;
    const int32_t *dct = s->dc_tbl[i] >= 0 ? st->tables + (size_t)s->dc_tbl[i] * PCR_HUFF_WORDS : NULL;
    const int32_t *act = s->ac_tbl[i] >= 0 ? st->tables + (size_t)s->ac_tbl[i] * PCR_HUFF_WORDS : NULL;
    switch (s->kind) {
    case PCR_SCAN_SEQ:
    case PCR_SCAN_DC_FIRST: {
        int t = huff(b, dct);
        if (t < 0 || t > 16) return -1;
        st->pred[i] += extend(get(b, t), t);
        blk[0] = (int16_t)(s->kind == PCR_SCAN_SEQ ? st->pred[i] : (int)((unsigned)st->pred[i] << s->Al));
        if (s->kind == PCR_SCAN_DC_FIRST) return 0;
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
    case PCR_SCAN_AC_REFINE: {
        int p1 = 1 << s->Al, m1 = -p1, k = s->Ss;
        if (st->eobrun == 0) {
            for (; k <= s->Se; k++) {
                int rs = huff(b, act);
                if (rs < 0) return -1;
                int r = rs >> 4, sz = rs & 15, val = 0;
                if (sz) {
                    if (sz != 1) return -1;
                    val = get(b, 1) ? p1 : m1;
                } else if (r != 15) {
                    st->eobrun = (1 << r) + (int32_t)get(b, r);
                    break;
                }
                /* skip r zero-history coefficients, refining the nonzero ones passed */
                for (; k <= s->Se; k++) {
                    int16_t *c = blk + pcr_zigzag[k];
                    if (*c) {
                        if (get(b, 1) && (*c & p1) == 0) *c = (int16_t)(*c >= 0 ? *c + p1 : *c + m1);
                    } else if (--r < 0) {
                        break;
                    }
                }
                if (sz) {
                    if (k > s->Se) return -1;
                    blk[pcr_zigzag[k]] = (int16_t)val;
                }
            }
        }
        if (st->eobrun > 0) {
            for (; k <= s->Se; k++) {
                int16_t *c = blk + pcr_zigzag[k];
                if (*c && get(b, 1) && (*c & p1) == 0) *c = (int16_t)(*c >= 0 ? *c + p1 : *c + m1);
            }
            st->eobrun--;
        }
        return 0;
    }
    }
    return -1;
}

static int interval(const pcr_jpeg_info *info, const int32_t *tables, const uint8_t *data,
                    const pcr_jpeg_interval *iv, int16_t *coefs) {
    if (iv->scan < 0 || iv->scan >= info->nscans || iv->data_off < 0 || iv->data_len < 0 ||
        (size_t)(iv->data_off + iv->data_len) > info->data_len)
        return PCR_E_ARG;
    const pcr_jpeg_scan *s = &info->scans[iv->scan];
    if (iv->first_mcu < 0 || iv->n_mcus < 0 || iv->first_mcu + iv->n_mcus > s->mcus) return PCR_E_ARG;
    state st;
    memset(&st, 0, sizeof(st));
    st.s = s;
    st.tables = tables;
    st.br.p = data + iv->data_off;
    st.br.end = st.br.p + iv->data_len;
    for (int m = iv->first_mcu; m < iv->first_mcu + iv->n_mcus; m++) {
        int row = m / s->mcus_per_row, col = m % s->mcus_per_row;
        for (int i = 0; i < s->ncomp; i++) {
            int c = s->comp[i];
            int hh = s->ncomp == 1 ? 1 : info->h[c], vv = s->ncomp == 1 ? 1 : info->v[c];
            for (int y = 0; y < vv; y++)
                for (int x = 0; x < hh; x++) {
                    int64_t blk = info->coef_offset[c] + (int64_t)(row * vv + y) * info->bw[c] +
                                  col * hh + x;
                    if (block(&st, i, coefs + blk * 64)) return PCR_E_CORRUPT;
                }
        }
        /* bits used past the interval's end: only damaged data needs them */
        if (st.br.zeros * 8 > st.br.bits) return PCR_E_CORRUPT;
    }
    return PCR_OK;
}

int pcr_jpeg_decode_intervals(const pcr_jpeg_info *info, const int32_t *tables,
                              const uint8_t *data, const pcr_jpeg_interval *intervals,
                              size_t first, size_t n, int16_t *coefs, int64_t *bad) {
    if (!info || !tables || !data || !intervals || !coefs || !bad) return PCR_E_ARG;
    *bad = -1;
    if (first > (size_t)info->nintervals || n > (size_t)info->nintervals - first) return PCR_E_ARG;
    for (size_t i = first; i < first + n; i++) {
        int rc = interval(info, tables, data, &intervals[i], coefs);
        if (rc != PCR_OK) {
            *bad = (int64_t)i;
            return rc;
        }
    }
    return PCR_OK;
}
