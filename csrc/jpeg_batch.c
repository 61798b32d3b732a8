/* A batch's descriptors for the GPU entropy kernel (pcrfs.torch.jpeg_triton), built here
 * so the host's share of a GPU batch holds the GIL only for the call: the Python loop
 * this replaces was most of a batch's GIL-held time.
 *
 * Every image's scans become one row of PCR_JPG_SCAN_WORDS int64 (jpeg_decode.h) and
 * every interval one of PCR_JPG_IV_WORDS, in launch order: by dependency level (a scan
 * follows the earlier scans of its image that touch one of its coefficients), then
 * image, then interval, so each level is one contiguous launch.
 *
 * A crop needs only some of an image's rows (pcr_jpeg_batch_take): the intervals that
 * meet them, and for an AC refinement's taken intervals the same rows of every earlier
 * scan of its component too (a refinement's bits depend on which coefficients earlier
 * scans left nonzero). */
#include <string.h>

#include "jpeg_decode.h"
#include "pcr_native.h"

/* Per scan: 1 + the deepest earlier scan it depends on (a shared component and an
 * overlapping band), 0 for none. */
static void scan_levels(const pcr_jpeg_info *in, int32_t *level) {
    for (int i = 0; i < in->nscans; i++) {
        const pcr_jpeg_scan *s = &in->scans[i];
        int32_t lv = 0;
        for (int j = 0; j < i; j++) {
            const pcr_jpeg_scan *t = &in->scans[j];
            if (t->Ss > s->Se || s->Ss > t->Se || level[j] + 1 <= lv) continue;
            int shared = 0;
            for (int a = 0; a < s->ncomp && !shared; a++)
                for (int b = 0; b < t->ncomp; b++)
                    if (s->comp[a] == t->comp[b]) { shared = 1; break; }
            if (shared) lv = level[j] + 1;
        }
        level[i] = lv;
    }
}

static int checked(const pcr_jpeg_info *in) {
    if (!in || in->nscans < 0 || in->nscans > PCR_JPG_MAX_SCANS || in->ntables < 0 ||
        in->ntables > PCR_JPG_MAX_TABLES || in->nintervals < 0 || in->ncomp < 1 || in->ncomp > 4)
        return 0;
    for (int i = 0; i < in->nscans; i++) {
        const pcr_jpeg_scan *s = &in->scans[i];
        if (s->ncomp < 1 || s->ncomp > 4) return 0;
        for (int c = 0; c < s->ncomp; c++)
            if (s->comp[c] < 0 || s->comp[c] >= in->ncomp || s->dc_tbl[c] >= in->ntables ||
                s->ac_tbl[c] >= in->ntables)
                return 0;
    }
    return 1;
}

int pcr_jpeg_batch_size(size_t n, const pcr_jpeg_info *const *info, int64_t out[4]) {
    if (!info || !out) return PCR_E_ARG;
    memset(out, 0, 4 * sizeof(int64_t));
    for (size_t j = 0; j < n; j++) {
        if (!checked(info[j])) return PCR_E_ARG;
        out[0] += info[j]->nscans;
        out[1] += info[j]->nintervals;
        out[2] += (int64_t)info[j]->data_len;
        out[3] += info[j]->ntables;
    }
    return PCR_OK;
}

/* The block rows of component c that interval v of scan s covers: an interleaved scan's
 * MCU row is v[c] block rows, a one-component scan's row one. */
static void iv_rows(const pcr_jpeg_info *in, const pcr_jpeg_scan *s, const pcr_jpeg_interval *v, int c,
                    int64_t *r0, int64_t *r1) {
    int64_t per = s->mcus_per_row > 0 ? s->mcus_per_row : 1, n = v->n_mcus > 0 ? v->n_mcus : 1;
    int64_t k = s->ncomp > 1 ? in->v[c] : 1;
    *r0 = (int64_t)v->first_mcu / per * k;
    *r1 = (((int64_t)v->first_mcu + n - 1) / per + 1) * k;
}

/* One image's take: rows are MCU rows [r0, r1). */
static int take_rows(const pcr_jpeg_info *in, const pcr_jpeg_interval *ivs, int64_t r0, int64_t r1,
                     uint8_t *take, int64_t *bytes) {
    int64_t lo[4], hi[4];
    for (int c = 0; c < 4; c++) {
        lo[c] = c < in->ncomp ? r0 * in->v[c] : 0;
        hi[c] = c < in->ncomp ? r1 * in->v[c] : 0;
    }
    memset(take, 0, (size_t)in->nintervals);
    for (int si = in->nscans - 1; si >= 0; si--) {
        const pcr_jpeg_scan *s = &in->scans[si];
        if (s->first_interval < 0 || s->n_intervals < 0 ||
            s->first_interval > in->nintervals - s->n_intervals)
            return PCR_E_RANGE;
        int64_t nlo = INT64_MAX, nhi = INT64_MIN;
        for (int32_t i = s->first_interval; i < s->first_interval + s->n_intervals; i++) {
            if (ivs[i].scan != si || ivs[i].data_off < 0 || ivs[i].data_len < 0 ||
                ivs[i].data_off > (int64_t)in->data_len ||
                ivs[i].data_len > (int64_t)in->data_len - ivs[i].data_off)
                return PCR_E_RANGE;
            int meet = 0;
            for (int k = 0; k < s->ncomp; k++) {
                int64_t a, b;
                iv_rows(in, s, &ivs[i], s->comp[k], &a, &b);
                if (a < hi[s->comp[k]] && b > lo[s->comp[k]]) meet = 1;
            }
            if (!meet) continue;
            take[i] = 1;
            *bytes += ivs[i].data_len;
            if (s->ncomp == 1) {
                int64_t a, b;
                iv_rows(in, s, &ivs[i], s->comp[0], &a, &b);
                if (a < nlo) nlo = a;
                if (b > nhi) nhi = b;
            }
        }
        if (s->kind == PCR_SCAN_AC_REFINE && s->ncomp == 1 && nlo < nhi) {
            int c = s->comp[0];
            if (nlo < lo[c]) lo[c] = nlo;
            if (nhi > hi[c]) hi[c] = nhi;
        }
    }
    return PCR_OK;
}

int pcr_jpeg_batch_take(size_t n, const pcr_jpeg_info *const *info, const pcr_jpeg_interval *const *ivs,
                        const int64_t *windows, uint8_t *take, int64_t sizes[4]) {
    int rc = pcr_jpeg_batch_size(n, info, sizes);
    if (rc != PCR_OK) return rc;
    if (!windows || !take || !ivs) return PCR_E_ARG;
    sizes[1] = sizes[2] = 0;
    for (size_t j = 0; j < n; j++) {
        const pcr_jpeg_info *in = info[j];
        if (in->nintervals && !ivs[j]) return PCR_E_ARG;
        int64_t bytes = 0;
        if ((rc = take_rows(in, ivs[j], windows[2 * j], windows[2 * j + 1], take, &bytes)) != PCR_OK)
            return rc;
        for (int32_t i = 0; i < in->nintervals; i++) sizes[1] += take[i];
        sizes[2] += bytes;
        take += in->nintervals;
    }
    return PCR_OK;
}

int pcr_jpeg_batch_descriptors(size_t n, const pcr_jpeg_info *const *info,
                               const uint8_t *const *data, const int32_t *const *tables,
                               const pcr_jpeg_interval *const *ivs, const int64_t *firsts,
                               const uint8_t *take, const int64_t sizes[4], uint8_t *all_data,
                               int32_t *all_tables, int64_t *rows, int64_t *iv, int64_t *where,
                               int64_t counts[PCR_JPG_MAX_SCANS]) {
    int64_t have[4];
    int rc = pcr_jpeg_batch_size(n, info, have);
    if (rc != PCR_OK) return rc;
    if (take) { /* the taken intervals' count and bytes, as pcr_jpeg_batch_take gave them */
        const uint8_t *t = take;
        have[1] = have[2] = 0;
        for (size_t j = 0; j < n; j++) {
            if (info[j]->nintervals && !ivs[j]) return PCR_E_ARG;
            for (int32_t k = 0; k < info[j]->nintervals; k++)
                if (t[k]) {
                    if (ivs[j][k].data_len < 0) return PCR_E_RANGE;
                    have[1]++;
                    have[2] += ivs[j][k].data_len;
                }
            t += info[j]->nintervals;
        }
    }
    if (!sizes || memcmp(have, sizes, sizeof(have)) != 0 || !counts) return PCR_E_ARG;
    memset(counts, 0, PCR_JPG_MAX_SCANS * sizeof(int64_t));
    int32_t level[PCR_JPG_MAX_SCANS];
    /* pass 1: intervals per level, so pass 2 writes each level's block in place */
    const uint8_t *t = take;
    for (size_t j = 0; j < n; t = t ? t + info[j]->nintervals : NULL, j++) {
        const pcr_jpeg_info *in = info[j];
        if (in->nintervals && (!ivs[j] || !data[j])) return PCR_E_ARG;
        scan_levels(in, level);
        for (int32_t k = 0; k < in->nintervals; k++) {
            const pcr_jpeg_interval *v = &ivs[j][k];
            if (v->scan < 0 || v->scan >= in->nscans || v->data_off < 0 || v->data_len < 0 ||
                v->data_off > (int64_t)in->data_len ||
                v->data_len > (int64_t)in->data_len - v->data_off)
                return PCR_E_RANGE;
            if (!t || t[k]) counts[level[v->scan]]++;
        }
    }
    int64_t at[PCR_JPG_MAX_SCANS], sum = 0;
    for (int l = 0; l < PCR_JPG_MAX_SCANS; l++) { at[l] = sum; sum += counts[l]; }
    int64_t scan_base = 0, data_base = 0, table_base = 0;
    t = take;
    for (size_t j = 0; j < n; t = t ? t + info[j]->nintervals : NULL, j++) {
        const pcr_jpeg_info *in = info[j];
        scan_levels(in, level);
        if (in->data_len && !t) memcpy(all_data + data_base, data[j], in->data_len);
        if (in->ntables) {
            if (!tables[j]) return PCR_E_ARG;
            memcpy(all_tables + table_base * PCR_HUFF_WORDS, tables[j],
                   (size_t)in->ntables * PCR_HUFF_WORDS * sizeof(int32_t));
        }
        for (int i = 0; i < in->nscans; i++) {
            const pcr_jpeg_scan *s = &in->scans[i];
            int64_t *r = rows + (scan_base + i) * PCR_JPG_SCAN_WORDS;
            memset(r, 0, PCR_JPG_SCAN_WORDS * sizeof(int64_t));
            r[0] = s->kind; r[1] = s->ncomp; r[2] = s->Ss; r[3] = s->Se; r[4] = s->Al;
            r[5] = s->mcus_per_row;
            for (int c = 0; c < 4; c++) {
                /* unused slots repeat a valid component, as the kernel never reads them */
                int comp = s->comp[c] < 0 ? 0 : s->comp[c] >= in->ncomp ? in->ncomp - 1 : s->comp[c];
                int64_t *f = r + 6 + 6 * c;
                f[0] = in->coef_offset[comp] + firsts[j];
                f[1] = in->bw[comp];
                f[2] = s->ncomp == 1 ? 1 : in->h[comp];
                f[3] = s->ncomp == 1 ? 1 : in->v[comp];
                f[4] = (table_base + (s->dc_tbl[c] > 0 ? s->dc_tbl[c] : 0)) * PCR_HUFF_WORDS;
                f[5] = (table_base + (s->ac_tbl[c] > 0 ? s->ac_tbl[c] : 0)) * PCR_HUFF_WORDS;
            }
        }
        int64_t kept = 0; /* with a take, only the taken intervals' bytes, in turn */
        for (int32_t k = 0; k < in->nintervals; k++) {
            const pcr_jpeg_interval *v = &ivs[j][k];
            if (t && !t[k]) continue;
            int64_t o = at[level[v->scan]]++;
            int64_t *d = iv + o * PCR_JPG_IV_WORDS;
            if (t) {
                d[0] = data_base + kept;
                memcpy(all_data + d[0], data[j] + v->data_off, (size_t)v->data_len);
                kept += v->data_len;
            } else {
                d[0] = data_base + v->data_off;
            }
            d[1] = d[0] + v->data_len;
            d[2] = v->first_mcu;
            d[3] = v->n_mcus;
            d[4] = scan_base + v->scan;
            int64_t *w = where + o * 3;
            w[0] = (int64_t)j; w[1] = v->scan; w[2] = level[v->scan];
        }
        scan_base += in->nscans;
        data_base += t ? kept : (int64_t)in->data_len;
        table_base += in->ntables;
    }
    /* the pads: a masked read past an interval's end, and an image with no tables */
    memset(all_data + data_base, 0, 4);
    memset(all_tables + table_base * PCR_HUFF_WORDS, 0, PCR_HUFF_WORDS * sizeof(int32_t));
    return PCR_OK;
}
