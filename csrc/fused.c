/* Decode, crop and resize in one step (pcrfs.torch.decode_resized_crop).
 *
 * A RandomResizedCrop to 224 of a 500x375 photo throws away most of a full decode.  Here
 * libjpeg-turbo scales in the DCT domain to the smallest n/8 at which the crop still covers
 * the output, decodes only the crop's iMCU columns (jpeg_crop_scanline) and rows
 * (jpeg_skip_scanlines), and a separable triangle filter (Pillow's BILINEAR, antialiased:
 * its support widens with the reduction; resize.c) resizes the box, flipping on the way.  PPM input
 * (the raw/ and mix/ views) skips the decode.  The box is in the source's pixels; only
 * pixels that meet it are read, as torchvision's crop-then-resize reads them.  Progressive
 * files have their scans entropy-decoded by pcrfs's own decoder, only in the restart
 * intervals the box's rows meet (see "progressive JPEG" below). */
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "fused_internal.h"
#include "jpeg_decode.h"
#include "jpeg_err.h"
#include "pcr_native.h"

/* ---- PPM (binary P6 / P5, maxval 255) ---------------------------------------------- */
static int ppm_token(const uint8_t *s, size_t len, size_t *pos, uint32_t *val) {
    size_t p = *pos;
    for (;;) { /* whitespace and comments */
        if (p >= len) return PCR_E_TRUNCATED;
        if (s[p] == '#') {
            while (p < len && s[p] != '\n') p++;
        } else if (s[p] == ' ' || s[p] == '\t' || s[p] == '\n' || s[p] == '\r') {
            p++;
        } else {
            break;
        }
    }
    uint64_t v = 0;
    size_t start = p;
    while (p < len && s[p] >= '0' && s[p] <= '9' && p - start < 10) v = v * 10 + (s[p++] - '0');
    if (p == start || v > 0xFFFFFFFFu || p >= len) return PCR_E_BAD_HEADER;
    *val = (uint32_t)v;
    *pos = p;
    return PCR_OK;
}

static int ppm_header(const uint8_t *s, size_t len, uint32_t *w, uint32_t *h, int *ch,
                      size_t *data_off) {
    if (len < 2 || s[0] != 'P' || (s[1] != '6' && s[1] != '5')) return PCR_E_NOT_JPEG;
    size_t p = 2;
    uint32_t maxval;
    int rc;
    if ((rc = ppm_token(s, len, &p, w)) || (rc = ppm_token(s, len, &p, h)) ||
        (rc = ppm_token(s, len, &p, &maxval)))
        return rc;
    if (maxval != 255) return PCR_E_UNSUPPORTED;
    if (*w == 0 || *h == 0) return PCR_E_BAD_HEADER;
    /* exactly one whitespace byte ends the header (ppm_token left p on it) */
    if (s[p] != ' ' && s[p] != '\t' && s[p] != '\n' && s[p] != '\r') return PCR_E_BAD_HEADER;
    p++;
    *ch = s[1] == '6' ? 3 : 1;
    uint64_t need = (uint64_t)*w * *h * (uint64_t)*ch;
    if (len - p < need) return PCR_E_TRUNCATED;
    *data_off = p;
    return PCR_OK;
}

static int check_crop(const pcr_crop *c, uint32_t w, uint32_t h, size_t dst_cap) {
    if (c->out_width == 0 || c->out_height == 0 || c->out_width > 65535 ||
        c->out_height > 65535 || c->width <= 0 || c->height <= 0 || c->left < 0 || c->top < 0 ||
        (uint64_t)c->left + (uint64_t)c->width > w || (uint64_t)c->top + (uint64_t)c->height > h)
        return PCR_E_RANGE;
    uint64_t px = (c->flags & PCR_CROP_FLOAT) ? sizeof(float) : 1;
    if ((uint64_t)c->out_width * c->out_height * 3 * px > dst_cap) return PCR_E_SPACE;
    return PCR_OK;
}

/* Pillow's JPEG CMYK is Adobe's inverted form, and its convert("RGB") computes
 * (255 - k') - c' (255 - k') / 255 with c' = 255 - c: that is c k / 255, rounded as its
 * MULDIV255. */
static inline uint8_t muldiv255(unsigned a, unsigned b) {
    unsigned t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

static void cmyk_row(const uint8_t *in, uint8_t *out, size_t n) {
    for (size_t i = 0; i < n; i++, in += 4, out += 3) {
        out[0] = muldiv255(in[0], in[3]);
        out[1] = muldiv255(in[1], in[3]);
        out[2] = muldiv255(in[2], in[3]);
    }
}

int pcr_image_size(const uint8_t *src, size_t len, uint32_t *width, uint32_t *height,
                   int32_t *kind) {
    if (!src || !width || !height || !kind) return PCR_E_ARG;
    uint32_t w, h;
    int ch;
    size_t off;
    int rc = ppm_header(src, len, &w, &h, &ch, &off);
    if (rc != PCR_E_NOT_JPEG) {
        if (rc == PCR_OK) *width = w, *height = h, *kind = PCR_IMG_PPM;
        return rc;
    }
    if (len < 4 || src[0] != 0xFF || src[1] != 0xD8) return PCR_E_NOT_JPEG;
    struct jpeg_decompress_struct in;
    pcr_err err;
    memset(&err, 0, sizeof err);
    in.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    if (setjmp(err.jb)) {
        jpeg_destroy_decompress(&in);
        return PCR_E_JPEG;
    }
    jpeg_create_decompress(&in);
    jpeg_mem_src(&in, src, (unsigned long)len);
    jpeg_read_header(&in, TRUE);
    *width = in.image_width;
    *height = in.image_height;
    *kind = PCR_IMG_JPEG;
    jpeg_destroy_decompress(&in);
    return PCR_OK;
}

static int crop_ppm(const uint8_t *src, size_t len, const pcr_crop *c, uint8_t *dst,
                    size_t dst_cap, pcr_crop_result *res) {
    uint32_t w, h;
    int ch;
    size_t off;
    int rc = ppm_header(src, len, &w, &h, &ch, &off);
    if (rc) return rc;
    res->width = w;
    res->height = h;
    res->scale = 8;
    if (c->max_pixels && (uint64_t)w * h > c->max_pixels) return PCR_E_TOO_LARGE;
    if ((rc = check_crop(c, w, h, dst_cap))) return rc;
    taps tx = {0}, ty = {0};
    int cx0, cx1, cy0, cy1;
    uint8_t *region = NULL;
    rc = pcr_plan(c, 1.0, 1.0, w, h, &tx, &ty, &cx0, &cx1, &cy0, &cy1);
    const uint8_t *base = src + off;
    size_t rw = (size_t)(cx1 - cx0);
    if (rc == PCR_OK && ch == 3) {
        /* P6 rows are already RGB: resample straight from the file's bytes */
        rc = pcr_resample(base, src + len, (int)w, 0, 0, &tx, &ty, c, dst);
    } else if (rc == PCR_OK) {
        region = malloc(rw * (size_t)(cy1 - cy0) * 3);
        if (!region) rc = PCR_E_NOMEM;
        for (int y = cy0; rc == PCR_OK && y < cy1; y++) {
            const uint8_t *s = base + (size_t)y * w + cx0;
            uint8_t *d = region + (size_t)(y - cy0) * rw * 3;
            for (size_t x = 0; x < rw; x++) d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = s[x];
        }
        if (rc == PCR_OK)
            rc = pcr_resample(region, region + rw * (size_t)(cy1 - cy0) * 3, (int)rw, cx0, cy0, &tx, &ty,
                              c, dst);
    }
    free(region);
    pcr_free_taps(&tx);
    pcr_free_taps(&ty);
    return rc;
}

/* ---- progressive JPEG: pcrfs's entropy decoder, libjpeg-turbo's pixel stage ----------
 * libjpeg-turbo decodes progressive scans at about 2.6x the cost of baseline, and all of
 * them, over the whole image, before its first row.  jpeg_entropy.c decodes them at about
 * half its cost, and only the restart intervals whose rows the box meets.  So libjpeg is
 * handed the headers up to the first scan's SOS (starting a scan latches the quantisation
 * tables) in buffered-image mode, where jpeg_read_coefficients gives out its coefficient
 * arrays; pcrfs's decoder writes every scan's coefficients straight into them, and
 * libjpeg's SIMD IDCT, upsampling, colour conversion, crop and skip run on them as they
 * would on its own.  What the parser refuses (layouts it does not take, damaged headers or
 * segments) goes to the plain libjpeg path and gets its verdict; damaged entropy-coded data
 * in an interval this path decodes is an error here (the decoder is stricter than libjpeg,
 * which decodes some damage into garbage).  Damage in intervals the box does not meet is
 * not read, so it is not reported. */
#define OWN_FALLBACK 1  /* crop_jpeg: retry without the own entropy path */

/* A source that ends the stream with EOI after `len` bytes. */
static const JOCTET EOI_MARKER[2] = {0xFF, JPEG_EOI};
static void cut_init(j_decompress_ptr c) { (void)c; }
static void cut_term(j_decompress_ptr c) { (void)c; }
static boolean cut_fill(j_decompress_ptr c) {
    c->src->next_input_byte = EOI_MARKER;
    c->src->bytes_in_buffer = 2;
    return TRUE;
}
/* Past the cut every restart marker is missing: stay at the EOI (libjpeg then leaves the
 * rest of the scan zero, as for any data that ran out), without resync's warning. */
static boolean cut_resync(j_decompress_ptr c, int desired) {
    (void)c;
    (void)desired;
    return TRUE;
}
static void cut_skip(j_decompress_ptr c, long n) {
    if (n <= 0) return;
    if ((size_t)n > c->src->bytes_in_buffer) {
        cut_fill(c); /* past the cut: only the EOI is left */
        return;
    }
    c->src->next_input_byte += n;
    c->src->bytes_in_buffer -= (size_t)n;
}

/* Each coefficient's precision after every scan (libjpeg's coef_bits: -1 none yet, else
 * the last scan's Al), as libjpeg would have it had it read them all.  A view with scans
 * left out (q1..q9) keeps AC bits unknown, and libjpeg then smooths its blocks (as Pillow
 * does); giving it the real state keeps that smoothing the same.  Returns whether any of
 * the first ten AC positions, the ones smoothing looks at, is inexact. */
static int own_coef_bits(const pcr_jpeg_info *f, int bits[4][64]) {
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 64; k++) bits[c][k] = -1;
    for (int si = 0; si < f->nscans; si++) {
        const pcr_jpeg_scan *s = &f->scans[si];
        for (int i = 0; i < s->ncomp; i++)
            for (int k = s->Ss; k <= s->Se && k < 64; k++) bits[s->comp[i]][k] = s->Al;
    }
    int inexact = 0;
    for (int c = 0; c < f->ncomp; c++)
        for (int k = 1; k < 10; k++) inexact |= bits[c][k] != 0;
    return inexact;
}

typedef struct {
    struct jpeg_source_mgr src;
    int bits[4][64]; /* own_coef_bits */
    int smooth;      /* libjpeg will smooth blocks */
    int first;       /* the first scan the own decoder decodes: 0, or 1 when libjpeg did scan 0 */
    pcr_jpeg_info info;
    int32_t *tables;
    uint8_t *data;
    pcr_jpeg_interval *iv;
    uint8_t *take; /* per interval: decode it */
} own_path;

/* The offset just past the first SOS segment (0 if the markers before it do not walk to
 * one within len): libjpeg is handed the headers up to there and nothing of the first
 * scan's data.  It starts the scan (latching the quantisation tables), finds the data
 * gone and leaves its blocks zero; the own decoder writes the intervals the box needs. */
static size_t first_sos_end(const uint8_t *s, size_t len) {
    size_t p = 2;
    while (p + 4 <= len) {
        if (s[p] != 0xFF) return 0;
        if (s[p + 1] == 0xFF) { /* fill byte */
            p++;
            continue;
        }
        size_t seg = (size_t)s[p + 2] << 8 | s[p + 3];
        if (seg < 2 || seg > len - p - 2) return 0;
        if (s[p + 1] == 0xDA) return p + 2 + seg;
        p += 2 + seg;
    }
    return 0;
}

/* Parse src for the own path; PCR_OK, or why not (then libjpeg decodes it all). */
static int own_prepare(const uint8_t *src, size_t len, own_path *o) {
    size_t cap = 256, cut;
    o->tables = pcr_scratch_take(S_TABLES, sizeof(int32_t) * PCR_JPG_MAX_TABLES * PCR_HUFF_WORDS);
    o->data = pcr_scratch_take(S_DATA, len);
    o->iv = pcr_scratch_take(S_IV, cap * sizeof *o->iv);
    if (!o->tables || !o->data || !o->iv) return PCR_E_NOMEM;
    int rc = pcr_jpeg_parse(src, len, &o->info, o->tables, o->data, o->iv, cap);
    if (rc == PCR_E_SPACE && o->info.nintervals > 0) {
        cap = (size_t)o->info.nintervals;
        if (!(o->iv = pcr_scratch_take(S_IV, cap * sizeof *o->iv))) return PCR_E_NOMEM;
        rc = pcr_jpeg_parse(src, len, &o->info, o->tables, o->data, o->iv, cap);
    }
    if (rc != PCR_OK) return rc;
    const pcr_jpeg_info *f = &o->info;
    if (!f->progressive || f->nscans < 1 || f->scans[0].kind != PCR_SCAN_DC_FIRST ||
        f->scans[0].ncomp != f->ncomp || f->ncomp > 4)
        return PCR_E_UNSUPPORTED;
    /* Where libjpeg will smooth blocks it decodes the first scan itself: libjpeg-turbo 2.1+
     * smooths the rows after a scan's data ran out with the scan before's precision (its
     * last_good_iMCU_row), which would change those views' pixels.  Elsewhere it gets no
     * first-scan data at all, and the own decoder decodes only the intervals the box needs. */
    o->smooth = own_coef_bits(f, o->bits);
    o->first = o->smooth ? 1 : 0;
    if (o->smooth) {
        uint64_t ends[PCR_JPG_MAX_SCANS];
        size_t nends;
        if (pcr_split_scans(src, len, ends, PCR_JPG_MAX_SCANS, &nends) != PCR_OK) return PCR_E_UNSUPPORTED;
        cut = (size_t)ends[0];
    } else {
        cut = first_sos_end(src, len);
    }
    if (!cut) return PCR_E_UNSUPPORTED;
    if (!(o->take = pcr_scratch_take(S_TAKE, (size_t)f->nintervals + 1))) return PCR_E_NOMEM;
    memset(o->take, 0, (size_t)f->nintervals);
    o->src.next_input_byte = src;
    o->src.bytes_in_buffer = cut;
    o->src.init_source = cut_init;
    o->src.fill_input_buffer = cut_fill;
    o->src.skip_input_data = cut_skip;
    o->src.resync_to_restart = cut_resync;
    o->src.term_source = cut_term;
    return PCR_OK;
}

/* The source rows an interval's MCUs cover. */
static void interval_rows(const pcr_jpeg_info *f, const pcr_jpeg_scan *s, const pcr_jpeg_interval *iv,
                          int64_t *y0, int64_t *y1) {
    int64_t per_row = s->mcus_per_row > 0 ? s->mcus_per_row : 1;
    /* an MCU row is 8 * max_v source rows, or for one component's blocks 8 * max_v / v
     * (whole for every layout libjpeg decodes; rounded outwards all the same) */
    int64_t num = 8 * (int64_t)f->max_v, den = s->ncomp > 1 ? 1 : f->v[s->comp[0]];
    if (den < 1) den = 1;
    int64_t r0 = iv->first_mcu / per_row;
    int64_t r1 = ((int64_t)iv->first_mcu + (iv->n_mcus > 0 ? iv->n_mcus : 1) - 1) / per_row + 1;
    *y0 = r0 * num / den;
    *y1 = (r1 * num + den - 1) / den;
}

/* The source rows each component's blocks must hold for output rows [cy0, cy1): the
 * blocks behind those rows, one component row more each side where the upsampler
 * stretches a component (fancy upsampling reads the neighbouring row), and two block rows
 * each side where libjpeg smooths blocks (it reads a 5x5 neighbourhood).  Rows outside are
 * IDCT'd and thrown away by libjpeg's skip and crop, so what they hold does not matter. */
static void own_windows(const pcr_jpeg_info *f, j_decompress_ptr in, int64_t cy0, int64_t cy1, int smooth,
                        int64_t wlo[4], int64_t whi[4]) {
#if JPEG_LIB_VERSION >= 70 /* the libjpeg 7+ API names the vertical size apart */
    int vout = in->max_v_samp_factor, minsz = in->min_DCT_v_scaled_size;
#else
    int vout = in->max_v_samp_factor, minsz = in->min_DCT_scaled_size;
#endif
    for (int c = 0; c < 4; c++) {
        wlo[c] = 0;
        whi[c] = INT64_MAX / 4;
    }
    for (int c = 0; c < f->ncomp && c < 4; c++) {
        jpeg_component_info *ci = &in->comp_info[c];
#if JPEG_LIB_VERSION >= 70
        int sz = ci->DCT_v_scaled_size, v = ci->v_samp_factor;
#else
        int sz = ci->DCT_scaled_size, v = ci->v_samp_factor;
#endif
        int64_t vin = (int64_t)v * sz / (minsz > 0 ? minsz : 1);
        if (sz < 1 || vin < 1 || vout < 1 || v < 1) continue; /* the whole image */
        int64_t r0 = cy0 * vin / vout, r1 = (cy1 - 1) * vin / vout;
        if (vin != vout) {
            r0--;
            r1++;
        }
        int64_t b0 = (r0 < 0 ? 0 : r0) / sz - (smooth ? 2 : 0), b1 = r1 / sz + (smooth ? 2 : 0);
        if (b0 < 0) b0 = 0;
        /* block row b of a component with v rows per iMCU covers source rows
         * [b, b + 1) * 8 * max_v / v (rounded outwards) */
        wlo[c] = b0 * 8 * f->max_v / v;
        whi[c] = ((b1 + 1) * 8 * f->max_v + v - 1) / v;
    }
}

/* Once libjpeg has reached EOI (having decoded the first scan, or found none of its data):
 * decode the own decoder's scans' intervals that meet each component's window into its
 * coefficient arrays.  An AC refinement reads the coefficients
 * earlier scans left in its blocks, so going back from the last scan, each taken
 * refinement interval widens its component's rows for the scans before it. */
static int own_decode(own_path *o, j_decompress_ptr in, int64_t cy0, int64_t cy1) {
    const pcr_jpeg_info *f = &o->info;
    jvirt_barray_ptr *arrays = jpeg_read_coefficients(in);
    int16_t *base[4] = {NULL, NULL, NULL, NULL};
    if (!arrays || in->num_components != f->ncomp || sizeof(JCOEF) != sizeof(int16_t))
        return PCR_E_UNSUPPORTED;
    for (int c = 0; c < f->ncomp; c++) {
        jpeg_component_info *ci = &in->comp_info[c];
        int h = ci->h_samp_factor, v = ci->v_samp_factor;
        int64_t bw = (ci->width_in_blocks + h - 1) / h * h, bh = (ci->height_in_blocks + v - 1) / v * v;
        if (h != f->h[c] || v != f->v[c] || bw != f->bw[c] || bh != f->bh[c]) return PCR_E_UNSUPPORTED;
        /* in memory, one allocation: rows bw blocks apart (checked, as libjpeg hands them out
         * v rows at a time) */
        for (int64_t r = 0; r < bh; r += v) {
            JBLOCKARRAY rows = in->mem->access_virt_barray((j_common_ptr)in, arrays[c], (JDIMENSION)r,
                                                           (JDIMENSION)v, TRUE);
            if (r == 0) base[c] = (int16_t *)rows[0][0];
            for (int j = 0; j < v; j++)
                if ((int16_t *)rows[j][0] != base[c] + (r + j) * bw * 64) return PCR_E_UNSUPPORTED;
        }
    }
    int64_t wlo[4], whi[4];
    own_windows(f, in, cy0, cy1, o->smooth, wlo, whi);
    for (int si = f->nscans - 1; si >= o->first; si--) {
        const pcr_jpeg_scan *s = &f->scans[si];
        int64_t nlo = INT64_MAX, nhi = INT64_MIN;
        for (int i = s->first_interval; i < s->first_interval + s->n_intervals; i++) {
            int64_t y0, y1;
            interval_rows(f, s, &o->iv[i], &y0, &y1);
            int meet = 0;
            for (int k = 0; k < s->ncomp; k++)
                meet |= y0 < whi[s->comp[k]] && y1 > wlo[s->comp[k]];
            if (!meet) continue;
            o->take[i] = 1;
            if (y0 < nlo) nlo = y0;
            if (y1 > nhi) nhi = y1;
        }
        if (s->kind == PCR_SCAN_AC_REFINE && nlo < nhi)
            for (int k = 0; k < s->ncomp; k++) {
                int c = s->comp[k];
                if (nlo < wlo[c]) wlo[c] = nlo;
                if (nhi > whi[c]) whi[c] = nhi;
            }
    }
    /* in scan order, runs of taken intervals at a time */
    size_t n = (size_t)f->nintervals, i = o->first ? (size_t)f->scans[0].n_intervals : 0;
    while (i < n) {
        if (!o->take[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && o->take[j]) j++;
        int64_t bad;
        int rc = pcr_jpeg_decode_into(f, o->tables, o->data, o->iv, i, j - i, base, &bad);
        if (rc != PCR_OK) return rc;
        i = j;
    }
    return PCR_OK;
}

/* Whether every scan of src codes DC only (Se 0): a progressive view of the first scan
 * group (q1).  Its information is one value per 8x8 block, which the 1/8 IDCT gives
 * exactly; a larger scale only interpolates it (libjpeg's block smoothing) at 64 times
 * the pixels, and the resize interpolates as well: half the CPU per crop, as close to
 * the original on photographs (tests/test_fused.py; saturated synthetic 4:2:0 chroma,
 * held at 1 value per 16 pixels, loses up to 2 dB).  Walks the markers, and each scan's data to the marker after it;
 * anything it cannot walk within len is "no". */
static int dc_only(const uint8_t *s, size_t len) {
    size_t p = 2;
    int scans = 0;
    while (p + 2 <= len) {
        if (s[p] != 0xFF) return 0;
        uint8_t m = s[p + 1];
        if (m == 0xFF) { /* fill byte */
            p++;
            continue;
        }
        if (m == 0xD9) return scans > 0; /* EOI */
        if (p + 4 > len) return 0;
        size_t seg = (size_t)s[p + 2] << 8 | s[p + 3];
        if (seg < 2 || seg > len - p - 2) return 0;
        if (m != 0xDA) {
            p += 2 + seg;
            continue;
        }
        /* SOS: Ls, Ns, Ns x (Cs, Td/Ta), Ss, Se, Ah/Al */
        size_t ns = seg >= 3 ? s[p + 4] : 0;
        if (ns < 1 || ns > 4 || seg != 6 + 2 * ns) return 0;
        if (s[p + 4 + 1 + 2 * ns + 1] != 0) return 0; /* Se */
        scans++;
        p += 2 + seg;
        for (;;) { /* the entropy-coded data: to the next marker that is not RSTn */
            const uint8_t *f = p < len ? memchr(s + p, 0xFF, len - p) : NULL;
            if (!f) return 0;
            p = (size_t)(f - s);
            if (p + 1 >= len) return 0;
            uint8_t n = s[p + 1];
            if (n == 0x00 || (n >= 0xD0 && n <= 0xD7)) {
                p += 2;
                continue;
            }
            if (n == 0xFF) { /* fill bytes before a marker */
                p++;
                continue;
            }
            break;
        }
    }
    return 0;
}

static int crop_jpeg(const uint8_t *src, size_t len, const pcr_crop *c, uint8_t *dst,
                     size_t dst_cap, pcr_crop_result *res, int own) {
    struct jpeg_decompress_struct in;
    pcr_err err;
    own_path o;
    volatile int own_on = 0;
    /* set before setjmp, freed after a longjmp: volatile so the values survive it */
    taps tx = {0}, ty = {0};
    uint8_t *volatile region = NULL;
    uint8_t *volatile cmyk = NULL;
    volatile int rc = PCR_OK;
    memset(&err, 0, sizeof err);
    in.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    if (setjmp(err.jb)) {
        snprintf(res->message, sizeof res->message, "%s", err.msg);
        rc = PCR_E_JPEG;
        goto out;
    }
    jpeg_create_decompress(&in);
    jpeg_mem_src(&in, src, (unsigned long)len);
    jpeg_read_header(&in, TRUE);
    uint32_t w = in.image_width, h = in.image_height;
    res->width = w;
    res->height = h;
    if (c->max_pixels && (uint64_t)w * h > c->max_pixels) {
        rc = PCR_E_TOO_LARGE;
        goto out;
    }
    if ((rc = check_crop(c, w, h, dst_cap))) goto out;
    int is_cmyk = in.jpeg_color_space == JCS_CMYK || in.jpeg_color_space == JCS_YCCK;
    if (own && in.progressive_mode && !is_cmyk) {
        int prc = own_prepare(src, len, &o);
        if (prc == PCR_E_NOMEM) {
            rc = prc;
            goto out;
        }
        if (prc == PCR_OK) {
            jpeg_abort_decompress(&in);
            in.src = &o.src;
            jpeg_read_header(&in, TRUE);
            in.buffered_image = TRUE;
            own_on = 1;
            err.cut = !o.smooth;
        }
    }
    in.out_color_space = is_cmyk ? JCS_CMYK : JCS_RGB;
    /* the smallest n/8 whose crop still covers the output; only 1/8, 2/8 and 4/8: the
     * other scaled IDCTs have no SIMD in libjpeg-turbo, and 6/8 or 7/8 cost more than 8/8
     * (measured: 1.62 against 1.16 ms per ImageNet-sized crop) */
    int n = 8;
    if (!(c->flags & PCR_CROP_FULL_SCALE))
        for (int s = 1; s < 8; s *= 2)
            if ((uint64_t)c->width * s >= 8ull * c->out_width &&
                (uint64_t)c->height * s >= 8ull * c->out_height) {
                n = s;
                break;
            }
    /* DC only: 1/8 whatever the box (dc_only); the resize interpolates the block values */
    if (n > 1 && !(c->flags & PCR_CROP_FULL_SCALE) && in.progressive_mode && dc_only(src, len)) {
        n = 1;
        in.do_block_smoothing = FALSE; /* the 1/8 IDCT reads DC only: nothing to smooth */
    }
    in.scale_num = (unsigned)n;
    in.scale_denom = 8;
    if (c->flags & PCR_CROP_FAST) {
        in.dct_method = JDCT_IFAST;
        in.do_fancy_upsampling = FALSE;
    }
    res->scale = n;
    jpeg_start_decompress(&in);
    uint32_t sw = in.output_width, sh = in.output_height;
    int cx0, cx1, cy0, cy1;
    /* n/8 exactly: libjpeg rounds the scaled size up, and sw / w would drift to the far edge */
    if ((rc = pcr_plan(c, n / 8.0, n / 8.0, sw, sh, &tx, &ty, &cx0, &cx1, &cy0,
                   &cy1)))
        goto out;
    if (own_on) {
        int r;
        while ((r = jpeg_consume_input(&in)) != JPEG_REACHED_EOI)
            if (r == JPEG_SUSPENDED) break;
        int drc = r == JPEG_REACHED_EOI && !err.corrupt && in.coef_bits ? own_decode(&o, &in, cy0, cy1)
                                                                        : PCR_E_UNSUPPORTED;
        if (drc == PCR_E_CORRUPT) { /* the strict decoder's verdict: a code no table
                                       holds, a coefficient past its band, bits run out */
            snprintf(res->message, sizeof res->message,
                     "damaged entropy-coded data in a restart interval the box's rows meet");
            rc = drc;
            goto out;
        }
        if (drc != PCR_OK) {
            rc = drc == PCR_E_NOMEM ? drc : OWN_FALLBACK;
            goto out;
        }
        for (int ci = 0; ci < in.num_components; ci++) memcpy(in.coef_bits[ci], o.bits[ci], sizeof o.bits[ci]);
        jpeg_start_output(&in, in.input_scan_number);
        res->entropy = 1;
    }
    JDIMENSION xoff = (JDIMENSION)cx0, cw = (JDIMENSION)(cx1 - cx0);
    if (cw < sw) jpeg_crop_scanline(&in, &xoff, &cw); /* widened to iMCU columns */
    size_t rw = cw, rows = (size_t)(cy1 - cy0);
    region = pcr_scratch_take(S_REGION, rw * rows * 3);
    if (is_cmyk) cmyk = malloc(rw * 4);
    if (!region || (is_cmyk && !cmyk)) {
        rc = PCR_E_NOMEM;
        goto out;
    }
    if (cy0 > 0 && jpeg_skip_scanlines(&in, (JDIMENSION)cy0) != (JDIMENSION)cy0) {
        rc = PCR_E_TRUNCATED;
        goto out;
    }
    while (in.output_scanline < (JDIMENSION)cy1) {
        size_t r = in.output_scanline - (JDIMENSION)cy0;
        JSAMPROW row = is_cmyk ? cmyk : region + r * rw * 3;
        if (jpeg_read_scanlines(&in, &row, 1) != 1) {
            rc = PCR_E_TRUNCATED;
            goto out;
        }
        if (is_cmyk) cmyk_row(cmyk, region + r * rw * 3, rw);
    }
    if (err.corrupt) {
        snprintf(res->message, sizeof res->message, "%s", err.msg);
        rc = PCR_E_CORRUPT;
        goto out;
    }
    rc = pcr_resample(region, region + rw * rows * 3, (int)rw, (int)xoff, cy0, &tx, &ty, c, dst);
out:
    jpeg_destroy_decompress(&in);
    free(cmyk);
    pcr_free_taps(&tx);
    pcr_free_taps(&ty);
    return rc;
}

int pcr_decode_resized_crop(const uint8_t *src, size_t len, const pcr_crop *crop, uint8_t *dst,
                            size_t dst_cap, pcr_crop_result *res) {
    if (!src || !crop || !dst || !res) return PCR_E_ARG;
    memset(res, 0, sizeof *res);
    int rc;
    if (len >= 2 && src[0] == 'P') {
        rc = crop_ppm(src, len, crop, dst, dst_cap, res);
    } else if (len < 4 || src[0] != 0xFF || src[1] != 0xD8) {
        return PCR_E_NOT_JPEG;
    } else {
        rc = crop_jpeg(src, len, crop, dst, dst_cap, res, !(crop->flags & PCR_CROP_LIBJPEG_ENTROPY));
        if (rc == OWN_FALLBACK) {
            memset(res, 0, sizeof *res);
            rc = crop_jpeg(src, len, crop, dst, dst_cap, res, 0);
        }
    }
    pcr_scratch_trim();
    return rc;
}
