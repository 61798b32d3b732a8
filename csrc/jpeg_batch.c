/* A batch's descriptors for the GPU entropy kernel (pcrfs.torch.jpeg_triton), built here
 * so the host's share of a GPU batch holds the GIL only for the call: the Python loop
 * this replaces was most of a batch's GIL-held time.
 *
 * Every image's scans become one row of PCR_JPG_SCAN_WORDS int64 (jpeg_decode.h) and
 * every interval one of PCR_JPG_IV_WORDS, in launch order: by dependency level (a scan
 * follows the earlier scans of its image that touch one of its coefficients), then
 * image, then interval, so each level is one contiguous launch. */
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

int pcr_jpeg_batch_descriptors(size_t n, const pcr_jpeg_info *const *info,
                               const uint8_t *const *data, const int32_t *const *tables,
                               const pcr_jpeg_interval *const *ivs, const int64_t *firsts,
                               const int64_t sizes[4], uint8_t *all_data, int32_t *all_tables,
                               int64_t *rows, int64_t *iv, int64_t *where,
                               int64_t counts[PCR_JPG_MAX_SCANS]) {
    int64_t have[4];
    int rc = pcr_jpeg_batch_size(n, info, have);
    if (rc != PCR_OK) return rc;
    if (!sizes || memcmp(have, sizes, sizeof(have)) != 0 || !counts) return PCR_E_ARG;
    memset(counts, 0, PCR_JPG_MAX_SCANS * sizeof(int64_t));
    int32_t level[PCR_JPG_MAX_SCANS];
    /* pass 1: intervals per level, so pass 2 writes each level's block in place */
    for (size_t j = 0; j < n; j++) {
        const pcr_jpeg_info *in = info[j];
        if (in->nintervals && (!ivs[j] || !data[j])) return PCR_E_ARG;
        scan_levels(in, level);
        for (int32_t k = 0; k < in->nintervals; k++) {
            const pcr_jpeg_interval *v = &ivs[j][k];
            if (v->scan < 0 || v->scan >= in->nscans || v->data_off < 0 || v->data_len < 0 ||
                v->data_off > (int64_t)in->data_len ||
                v->data_len > (int64_t)in->data_len - v->data_off)
                return PCR_E_RANGE;
            counts[level[v->scan]]++;
        }
    }
    int64_t at[PCR_JPG_MAX_SCANS], sum = 0;
    for (int l = 0; l < PCR_JPG_MAX_SCANS; l++) { at[l] = sum; sum += counts[l]; }
    int64_t scan_base = 0, data_base = 0, table_base = 0;
    for (size_t j = 0; j < n; j++) {
        const pcr_jpeg_info *in = info[j];
        scan_levels(in, level);
        if (in->data_len) memcpy(all_data + data_base, data[j], in->data_len);
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
        for (int32_t k = 0; k < in->nintervals; k++) {
            const pcr_jpeg_interval *v = &ivs[j][k];
            int64_t o = at[level[v->scan]]++;
            int64_t *d = iv + o * PCR_JPG_IV_WORDS;
            d[0] = data_base + v->data_off;
            d[1] = d[0] + v->data_len;
            d[2] = v->first_mcu;
            d[3] = v->n_mcus;
            d[4] = scan_base + v->scan;
            int64_t *w = where + o * 3;
            w[0] = (int64_t)j; w[1] = v->scan; w[2] = level[v->scan];
        }
        scan_base += in->nscans;
        data_base += (int64_t)in->data_len;
        table_base += in->ntables;
    }
    /* the pads: a masked read past an interval's end, and an image with no tables */
    memset(all_data + data_base, 0, 4);
    memset(all_tables + table_base * PCR_HUFF_WORDS, 0, PCR_HUFF_WORDS * sizeof(int32_t));
    return PCR_OK;
}
