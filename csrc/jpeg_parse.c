/* pcr_jpeg_parse: one pass over a JPEG's markers (see jpeg_decode.h). */
#include <stdio.h>
#include <string.h>
#include "jpeg_decode.h"
#include "pcr_native.h"

/* zigzag index -> natural (row-major) position */
const uint8_t pcr_zigzag[64] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48,
    41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23,
    30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

#define FAIL(rc_, ...)                                                     \
    do {                                                                   \
        snprintf(info->message, sizeof(info->message), __VA_ARGS__);       \
        return (rc_);                                                      \
    } while (0)

static int div_up(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

/* Canonical Huffman codes from the DHT counts: the lookahead, maxcode and value offsets
 * both decoders use.  A table whose codes overflow their lengths is refused. */
static int derive_table(const uint8_t counts[17], const uint8_t *vals, int nvals, int32_t *t) {
    memset(t, 0, PCR_HUFF_WORDS * sizeof(int32_t));
    int32_t code = 0, p = 0;
    for (int l = 1; l <= 16; l++) {
        t[PCR_HUFF_VALOFF + l] = p - code;
        if (code + counts[l] > (1 << l) || p + counts[l] > nvals) return -1;
        for (int i = 0; i < counts[l]; i++, p++, code++)
            if (l <= 8)
                for (int j = 0; j < (1 << (8 - l)); j++)
                    t[PCR_HUFF_LOOK + (code << (8 - l)) + j] = (l << 8) | vals[p];
        t[PCR_HUFF_MAXCODE + l] = counts[l] ? code - 1 : -1;
        code <<= 1;
    }
    t[PCR_HUFF_MAXCODE + 0] = -1;
    t[PCR_HUFF_MAXCODE + 17] = 0x7FFFFFFF;
    for (int i = 0; i < nvals; i++) t[PCR_HUFF_VALS + i] = vals[i];
    return 0;
}

static int colour_space(const pcr_jpeg_info *info, int jfif, int adobe, int transform,
                        const int ids[4]) {
    switch (info->ncomp) {
    case 1: return PCR_JPG_GRAY;
    case 3:
        if (jfif) return PCR_JPG_YCC;
        if (adobe) return transform == 0 ? PCR_JPG_RGB : PCR_JPG_YCC;
        if (ids[0] == 82 && ids[1] == 71 && ids[2] == 66) return PCR_JPG_RGB;
        return PCR_JPG_YCC;
    case 4:
        return adobe && transform == 2 ? PCR_JPG_YCCK : PCR_JPG_CMYK;
    default: return 0;
    }
}

int pcr_jpeg_parse(const uint8_t *src, size_t len, pcr_jpeg_info *info, int32_t *tables,
                   uint8_t *data, pcr_jpeg_interval *intervals, size_t cap) {
    if (!src || !info || !tables || !data || (cap && !intervals)) return PCR_E_ARG;
    memset(info, 0, sizeof(*info));
    if (len < 4 || src[0] != 0xFF || src[1] != 0xD8) FAIL(PCR_E_NOT_JPEG, "not a JPEG (no SOI)");
    int ids[4] = {0}, tq[4] = {0}, latched[4] = {0};
    int qdef[4] = {0}, dc_slot[4] = {-1, -1, -1, -1}, ac_slot[4] = {-1, -1, -1, -1};
    uint16_t qtab[4][64];
    int jfif = 0, adobe = 0, transform = -1, have_frame = 0, ri = 0;
    size_t pos = 2, out = 0, niv = 0;
    for (;;) {
        if (pos >= len) FAIL(PCR_E_TRUNCATED, "ends before EOI");
        if (src[pos] != 0xFF) FAIL(PCR_E_BAD_MARKER, "no marker at byte %zu", pos);
        while (pos < len && src[pos] == 0xFF) pos++;
        if (pos >= len) FAIL(PCR_E_TRUNCATED, "ends inside a marker");
        uint8_t m = src[pos++];
        if (m == 0xD9) break;
        if (m == 0x00 || m == 0xD8) FAIL(PCR_E_BAD_MARKER, "marker FF%02X out of place", m);
        if ((m >= 0xD0 && m <= 0xD7) || m == 0x01) continue;
        if (len - pos < 2) FAIL(PCR_E_TRUNCATED, "ends inside marker FF%02X", m);
        size_t seg = ((size_t)src[pos] << 8) | src[pos + 1];
        if (seg < 2 || len - pos < seg) FAIL(PCR_E_TRUNCATED, "marker FF%02X runs past the end", m);
        const uint8_t *p = src + pos + 2;
        size_t n = seg - 2;
        pos += seg;
        if (m == 0xC0 || m == 0xC1 || m == 0xC2) {
            if (have_frame) FAIL(PCR_E_BAD_MARKER, "two frame headers");
            if (n < 6) FAIL(PCR_E_BAD_MARKER, "short SOF");
            info->precision = p[0];
            info->height = ((uint32_t)p[1] << 8) | p[2];
            info->width = ((uint32_t)p[3] << 8) | p[4];
            info->ncomp = p[5];
            info->progressive = m == 0xC2;
            if (info->precision != 8) FAIL(PCR_E_UNSUPPORTED, "%d-bit samples", info->precision);
            if (info->ncomp < 1 || info->ncomp > 4 || info->ncomp == 2)
                FAIL(PCR_E_UNSUPPORTED, "%d components", info->ncomp);
            if (info->width == 0 || info->height == 0)
                FAIL(PCR_E_UNSUPPORTED, "zero width or height (DNL)");
            if (n < 6 + 3 * (size_t)info->ncomp) FAIL(PCR_E_BAD_MARKER, "short SOF");
            info->max_h = info->max_v = 1;
            for (int c = 0; c < info->ncomp; c++) {
                ids[c] = p[6 + 3 * c];
                for (int d = 0; d < c; d++)
                    if (ids[d] == ids[c]) FAIL(PCR_E_BAD_MARKER, "component id %d twice", ids[c]);
                info->h[c] = p[7 + 3 * c] >> 4;
                info->v[c] = p[7 + 3 * c] & 15;
                tq[c] = p[8 + 3 * c];
                if (info->h[c] < 1 || info->h[c] > 4 || info->v[c] < 1 || info->v[c] > 4)
                    FAIL(PCR_E_BAD_MARKER, "sampling factor out of range");
                if (tq[c] > 3) FAIL(PCR_E_BAD_MARKER, "quantisation table %d", tq[c]);
                if (info->h[c] > info->max_h) info->max_h = info->h[c];
                if (info->v[c] > info->max_v) info->max_v = info->v[c];
            }
            info->mcux = div_up(info->width, 8 * info->max_h);
            info->mcuy = div_up(info->height, 8 * info->max_v);
            int64_t total = 0;
            for (int c = 0; c < info->ncomp; c++) {
                info->dw[c] = div_up((int64_t)info->width * info->h[c], info->max_h);
                info->dh[c] = div_up((int64_t)info->height * info->v[c], info->max_v);
                info->wib[c] = div_up(info->dw[c], 8);
                info->hib[c] = div_up(info->dh[c], 8);
                info->bw[c] = info->mcux * info->h[c];
                info->bh[c] = info->mcuy * info->v[c];
                info->coef_offset[c] = (int32_t)total;
                total += (int64_t)info->bw[c] * info->bh[c];
            }
            if (total > INT32_MAX) FAIL(PCR_E_UNSUPPORTED, "too many blocks");
            info->total_blocks = (int32_t)total;
            have_frame = 1;
        } else if ((m >= 0xC3 && m <= 0xCF && m != 0xC4 && m != 0xC8) || m == 0xDC) {
            FAIL(PCR_E_UNSUPPORTED, "frame type FF%02X (lossless, hierarchical or arithmetic)", m);
        } else if (m == 0xC4) {
            while (n > 0) {
                if (n < 17) FAIL(PCR_E_BAD_MARKER, "short DHT");
                int tc = p[0] >> 4, th = p[0] & 15, nv = 0;
                uint8_t counts[17] = {0};
                for (int l = 1; l <= 16; l++) nv += counts[l] = p[l];
                if (tc > 1 || th > 3 || nv > 256 || n < 17 + (size_t)nv)
                    FAIL(PCR_E_BAD_MARKER, "bad DHT");
                if (info->ntables >= PCR_JPG_MAX_TABLES)
                    FAIL(PCR_E_UNSUPPORTED, "more than %d Huffman tables", PCR_JPG_MAX_TABLES);
                if (derive_table(counts, p + 17, nv, tables + (size_t)info->ntables * PCR_HUFF_WORDS))
                    FAIL(PCR_E_BAD_MARKER, "Huffman table with impossible code lengths");
                (tc ? ac_slot : dc_slot)[th] = info->ntables++;
                p += 17 + nv;
                n -= 17 + nv;
            }
        } else if (m == 0xDB) {
            while (n > 0) {
                int pq = p[0] >> 4, t = p[0] & 15;
                size_t need = 1 + 64 * (pq ? 2 : 1);
                if (pq > 1 || t > 3 || n < need) FAIL(PCR_E_BAD_MARKER, "bad DQT");
                for (int k = 0; k < 64; k++)
                    qtab[t][pcr_zigzag[k]] = pq ? (uint16_t)((p[1 + 2 * k] << 8) | p[2 + 2 * k]) : p[1 + k];
                qdef[t] = 1;
                p += need;
                n -= need;
            }
        } else if (m == 0xDD) {
            if (n < 2) FAIL(PCR_E_BAD_MARKER, "short DRI");
            ri = (p[0] << 8) | p[1];
        } else if (m == 0xE0 && n >= 5 && memcmp(p, "JFIF\0", 5) == 0) {
            jfif = 1;
        } else if (m == 0xEE && n >= 12 && memcmp(p, "Adobe", 5) == 0) {
            adobe = 1;
            transform = p[11];
        } else if (m == 0xDA) {
            if (!have_frame) FAIL(PCR_E_BAD_MARKER, "scan before the frame header");
            if (info->nscans >= PCR_JPG_MAX_SCANS)
                FAIL(PCR_E_UNSUPPORTED, "more than %d scans", PCR_JPG_MAX_SCANS);
            pcr_jpeg_scan *s = &info->scans[info->nscans];
            if (n < 1 || p[0] < 1 || p[0] > 4 || n < 4 + 2 * (size_t)p[0])
                FAIL(PCR_E_BAD_MARKER, "bad SOS");
            s->ncomp = p[0];
            int blocks = 0;
            for (int i = 0; i < s->ncomp; i++) {
                int c = 0;
                while (c < info->ncomp && ids[c] != p[1 + 2 * i]) c++;
                if (c == info->ncomp) FAIL(PCR_E_BAD_MARKER, "scan names an unknown component");
                for (int j = 0; j < i; j++)
                    if (s->comp[j] == c) FAIL(PCR_E_BAD_MARKER, "component twice in a scan");
                s->comp[i] = c;
                int td = p[2 + 2 * i] >> 4, ta = p[2 + 2 * i] & 15;
                if (td > 3 || ta > 3) FAIL(PCR_E_BAD_MARKER, "bad table selector");
                s->dc_tbl[i] = dc_slot[td];
                s->ac_tbl[i] = ac_slot[ta];
                blocks += info->h[c] * info->v[c];
                if (!latched[c]) {  /* as libjpeg, a component keeps the table of its first scan */
                    if (!qdef[tq[c]]) FAIL(PCR_E_BAD_MARKER, "quantisation table %d undefined", tq[c]);
                    memcpy(info->qt[c], qtab[tq[c]], sizeof(info->qt[c]));
                    latched[c] = 1;
                }
            }
            const uint8_t *q = p + 1 + 2 * s->ncomp;
            s->Ss = q[0];
            s->Se = q[1];
            s->Ah = q[2] >> 4;
            s->Al = q[2] & 15;
            if (info->progressive) {
                int bad = s->Se > 63 || s->Ss > s->Se || s->Al > 13 || (s->Ah && s->Ah != s->Al + 1);
                if (s->Ss == 0 && s->Se != 0) bad = 1;
                if (s->Ss > 0 && s->ncomp != 1) bad = 1;
                if (bad) FAIL(PCR_E_BAD_MARKER, "bad progression parameters");
                s->kind = s->Ss == 0 ? (s->Ah ? PCR_SCAN_DC_REFINE : PCR_SCAN_DC_FIRST)
                                     : (s->Ah ? PCR_SCAN_AC_REFINE : PCR_SCAN_AC_FIRST);
            } else {
                if (s->Ss != 0 || s->Se != 63 || s->Ah || s->Al)
                    FAIL(PCR_E_UNSUPPORTED, "sequential scan with a spectral selection");
                s->kind = PCR_SCAN_SEQ;
            }
            if (s->ncomp > 1 && blocks > 10) FAIL(PCR_E_BAD_MARKER, "MCU of %d blocks", blocks);
            for (int i = 0; i < s->ncomp; i++) {
                int need_dc = s->kind == PCR_SCAN_SEQ || s->kind == PCR_SCAN_DC_FIRST;
                int need_ac = s->kind == PCR_SCAN_SEQ || s->kind == PCR_SCAN_AC_FIRST ||
                              s->kind == PCR_SCAN_AC_REFINE;
                if ((need_dc && s->dc_tbl[i] < 0) || (need_ac && s->ac_tbl[i] < 0))
                    FAIL(PCR_E_BAD_MARKER, "scan uses an undefined Huffman table");
                if (!need_dc) s->dc_tbl[i] = -1;
                if (!need_ac) s->ac_tbl[i] = -1;
            }
            for (int i = s->ncomp; i < 4; i++) s->dc_tbl[i] = s->ac_tbl[i] = -1;
            if (s->ncomp == 1) {
                int c = s->comp[0];
                s->mcus_per_row = info->wib[c];
                s->mcus = info->wib[c] * info->hib[c];
            } else {
                s->mcus_per_row = info->mcux;
                s->mcus = info->mcux * info->mcuy;
            }
            s->restart = ri;
            int expect = ri ? div_up(s->mcus, ri) : 1;
            s->first_interval = (int32_t)niv;
            /* Entropy-coded data up to the first marker that is not RSTn, unstuffed and cut
             * at each RSTn (which must count 0..7 in turn). */
            size_t start = out;
            int found = 0;
            for (;;) {
                const uint8_t *ff = pos < len ? memchr(src + pos, 0xFF, len - pos) : NULL;
                if (!ff) FAIL(PCR_E_TRUNCATED, "scan %d runs past the end", info->nscans + 1);
                size_t run = (size_t)(ff - (src + pos));
                memcpy(data + out, src + pos, run);
                out += run;
                pos += run;
                if (pos + 1 >= len) FAIL(PCR_E_TRUNCATED, "scan %d runs past the end", info->nscans + 1);
                uint8_t x = src[pos + 1];
                if (x == 0x00) {
                    data[out++] = 0xFF;
                    pos += 2;
                    continue;
                }
                if (x >= 0xD0 && x <= 0xD7) {
                    if (!ri || x - 0xD0 != found % 8 || found + 1 >= expect)
                        FAIL(PCR_E_CORRUPT, "scan %d: restart marker out of sequence", info->nscans + 1);
                } else if (x == 0xFF) {  /* fill bytes: the marker after them decides */
                    size_t f = pos + 1;
                    while (f < len && src[f] == 0xFF) f++;
                    if (f < len && src[f] >= 0xD0 && src[f] <= 0xD7) {
                        pos = f - 1;
                        continue;
                    }
                    if (f < len && src[f] == 0x00)
                        FAIL(PCR_E_CORRUPT, "scan %d: stuffed byte after fill", info->nscans + 1);
                }
                if (niv < cap) {
                    pcr_jpeg_interval *iv = &intervals[niv];
                    iv->scan = info->nscans;
                    iv->first_mcu = ri ? found * ri : 0;
                    iv->n_mcus = ri ? (s->mcus - iv->first_mcu < ri ? s->mcus - iv->first_mcu : ri)
                                    : s->mcus;
                    iv->pad = 0;
                    iv->data_off = (int64_t)start;
                    iv->data_len = (int64_t)(out - start);
                }
                niv++;
                found++;
                start = out;
                if (x >= 0xD0 && x <= 0xD7) {
                    pos += 2;
                    continue;
                }
                break;  /* pos is at the next marker's FF */
            }
            if (found != expect)
                FAIL(PCR_E_CORRUPT, "scan %d: %d restart intervals, %d expected", info->nscans + 1,
                     found, expect);
            s->n_intervals = found;
            if (found > 1) info->restart_scans++;
            info->nscans++;
        }
        /* anything else (APPn, COM, DNL-free extensions): skipped by its length */
    }
    if (!have_frame) FAIL(PCR_E_BAD_MARKER, "no frame header");
    if (info->nscans == 0) FAIL(PCR_E_NO_SCAN, "no scan");
    for (int c = 0; c < info->ncomp; c++)
        if (!latched[c]) {
            if (!qdef[tq[c]]) FAIL(PCR_E_BAD_MARKER, "quantisation table %d undefined", tq[c]);
            memcpy(info->qt[c], qtab[tq[c]], sizeof(info->qt[c]));
        }
    info->color = colour_space(info, jfif, adobe, transform, ids);
    info->nintervals = (int32_t)niv;
    info->data_len = out;
    if (niv > cap) FAIL(PCR_E_SPACE, "%zu restart intervals", niv);
    return PCR_OK;
}
