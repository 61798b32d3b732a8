#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
#include <jpegint.h> /* struct jpeg_comp_master: a restart interval per scan */
#include "jpeg_decode.h"
#include "pcr_native.h"
#include "jpeg_err.h"

static int is_app(jpeg_saved_marker_ptr m, int n, const char *tag, size_t taglen) {
    return m->marker == JPEG_APP0 + n && m->data_length >= taglen &&
           memcmp(m->data, tag, taglen) == 0;
}

/* Which saved markers are copied: libjpeg writes JFIF APP0 / Adobe APP14 itself when the
 * colour space calls for them, so the source's copies would be duplicates. */
static int want_marker(j_compress_ptr out, jpeg_saved_marker_ptr m, int keep) {
    if (out->write_JFIF_header && is_app(m, 0, "JFIF\0", 5)) return 0;
    if (out->write_Adobe_marker && is_app(m, 14, "Adobe", 5)) return 0;
    if (keep == PCR_KEEP_ALL) return 1;
    if (keep == PCR_KEEP_DEFAULT)
        return is_app(m, 0, "JFIF\0", 5) || is_app(m, 2, "ICC_PROFILE\0", 12) ||
               is_app(m, 14, "Adobe", 5);
    return 0;
}

static int set_script(j_compress_ptr out, const int *script, size_t n_scans) {
    if (n_scans == 0 || n_scans > 1000) return PCR_E_ARG;
    jpeg_scan_info *s = (jpeg_scan_info *)out->mem->alloc_small(
        (j_common_ptr)out, JPOOL_IMAGE, n_scans * sizeof(jpeg_scan_info));
    for (size_t i = 0; i < n_scans; i++) {
        const int *r = script + 8 * i;
        if (r[0] < 1 || r[0] > MAX_COMPS_IN_SCAN) return PCR_E_ARG;
        s[i].comps_in_scan = r[0];
        for (int c = 0; c < MAX_COMPS_IN_SCAN; c++) {
            if (c < r[0] && (r[1 + c] < 0 || r[1 + c] >= out->num_components)) return PCR_E_ARG;
            s[i].component_index[c] = c < r[0] ? r[1 + c] : 0;
        }
        s[i].Ss = r[5];
        s[i].Se = r[6];
        s[i].Ah = (r[7] >> 4) & 0xF;
        s[i].Al = r[7] & 0xF;
    }
    out->scan_info = s; /* libjpeg validates the progression itself */
    out->num_scans = (int)n_scans;
    return PCR_OK;
}

/* Restart intervals balanced by bytes (restart_bytes > 0): one encode with a marker every
 * FINE_MCUS MCUs of every scan, parsed for each interval's bytes; then each scan restarts
 * every r of those, r the largest whose intervals hold at most restart_bytes bytes (none
 * in a scan that fits whole).  A restart every N rows of every scan gives the DC and
 * chroma scans intervals of a few bytes and the luma AC scans ones of a thousand or two;
 * the longest interval is a GPU entropy kernel's chain. */
#define FINE_MCUS 4

typedef struct {
    uint16_t mcus[PCR_JPG_MAX_SCANS]; /* each scan's restart interval (0: none) */
    int nscans, scan, gathered;
    void (*orig)(j_compress_ptr);
} scan_restarts;

/* libjpeg's master, before each pass: the interval of the scan this pass belongs to (with
 * optimize_coding a scan's statistics pass, then its output pass; a DC refinement, whose
 * Huffman coding needs no table, has only the output pass).  The interval reaches both
 * the entropy coder's start_pass and the scan header's DRI. */
static void prepare_scan(j_compress_ptr c) {
    scan_restarts *s = (scan_restarts *)c->client_data;
    if (s->scan < s->nscans && s->scan < c->num_scans) {
        const jpeg_scan_info *si = &c->scan_info[s->scan];
        c->restart_interval = s->mcus[s->scan];
        if (c->optimize_coding && !(si->Ss == 0 && si->Ah != 0) && !s->gathered) {
            s->gathered = 1;
        } else {
            s->gathered = 0;
            s->scan++;
        }
    }
    s->orig(c);
}

/* Each scan's interval from an encode restarting every FINE_MCUS MCUs. */
static int balance(const uint8_t *buf, size_t len, int bytes, scan_restarts *out) {
    pcr_jpeg_info *info = malloc(sizeof(*info));
    int32_t *tables = malloc((size_t)PCR_JPG_MAX_TABLES * PCR_HUFF_WORDS * sizeof(int32_t));
    uint8_t *data = malloc(len + 1);
    size_t cap = len / 2 + PCR_JPG_MAX_SCANS;
    pcr_jpeg_interval *ivs = malloc(cap * sizeof(*ivs));
    int rc = PCR_E_NOMEM;
    if (info && tables && data && ivs) rc = pcr_jpeg_parse(buf, len, info, tables, data, ivs, cap);
    if (rc == PCR_OK && (info->nscans < 1 || info->nscans > PCR_JPG_MAX_SCANS)) rc = PCR_E_UNSUPPORTED;
    if (rc == PCR_OK) {
        out->nscans = info->nscans;
        for (int i = 0; i < info->nscans; i++) {
            const pcr_jpeg_scan *s = &info->scans[i];
            int n = s->n_intervals, r = n;
            for (; r > 1; r--) { /* the largest r whose joined intervals fit */
                int fits = 1;
                for (int a = 0; a < n && fits; a += r) {
                    int64_t sum = 0;
                    for (int k = a; k < a + r && k < n; k++) sum += ivs[s->first_interval + k].data_len;
                    fits = sum <= bytes;
                }
                if (fits) break;
            }
            long m = (long)r * FINE_MCUS;
            out->mcus[i] = r >= n ? 0 : (uint16_t)(m > 65532 ? 65532 : m);
        }
    }
    free(info);
    free(tables);
    free(data);
    free(ivs);
    return rc;
}

/* One encode of in's coefficients into err->outbuf: every restart_rows MCU rows of every
 * scan, or every restart_mcus MCUs, or per scan (per_scan). */
static int encode(j_compress_ptr out, j_decompress_ptr in, jvirt_barray_ptr *coefs, const int *scan_script,
                  size_t n_scans, int script_components, int keep_markers, int restart_rows,
                  unsigned int restart_mcus, scan_restarts *per_scan, pcr_err *err) {
    int rc;
    jpeg_copy_critical_parameters(in, out);
    out->optimize_coding = TRUE;
    if (scan_script && script_components == in->num_components) {
        if ((rc = set_script(out, scan_script, n_scans)) != PCR_OK) return rc;
    } else {
        jpeg_simple_progression(out);
    }
    /* libjpeg converts rows to MCUs per scan, so non-interleaved AC scans restart every N
     * block rows of their component: the coefficients are unchanged, and each interval can
     * be entropy-decoded alone. */
    out->restart_in_rows = per_scan ? 0 : restart_rows;
    out->restart_interval = per_scan ? 0 : restart_mcus;
    jpeg_mem_dest(out, &err->outbuf, &err->outsize);
    jpeg_write_coefficients(out, coefs);
    if (per_scan) {
        per_scan->scan = per_scan->gathered = 0;
        per_scan->orig = out->master->prepare_for_pass;
        out->client_data = per_scan;
        out->master->prepare_for_pass = prepare_scan;
    }
    for (jpeg_saved_marker_ptr m = in->marker_list; m; m = m->next)
        if (want_marker(out, m, keep_markers))
            jpeg_write_marker(out, m->marker, m->data, m->data_length);
    jpeg_finish_compress(out);
    return PCR_OK;
}

/* A call's libjpeg state: one error manager for both (fatal errors longjmp to the caller's
 * setjmp, which must follow at once: it cannot live in a function that returns). */
static void start_call(j_decompress_ptr in, j_compress_ptr out, pcr_err *err) {
    memset(err, 0, sizeof(*err));
    in->err = jpeg_std_error(&err->pub);
    out->err = &err->pub;
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    jpeg_create_decompress(in);
    jpeg_create_compress(out);
}

/* The source's header read, the markers `keep` asks for saved, and what the caller
 * reports of it (called inside the caller's setjmp: libjpeg's errors longjmp there). */
static void read_input(j_decompress_ptr in, const uint8_t *src, size_t len, int keep,
                       pcr_transcode_result *res) {
    jpeg_mem_src(in, src, (unsigned long)len);
    if (keep == PCR_KEEP_ALL) {
        jpeg_save_markers(in, JPEG_COM, 0xFFFF);
        for (int m = 0; m < 16; m++) jpeg_save_markers(in, JPEG_APP0 + m, 0xFFFF);
    } else if (keep == PCR_KEEP_DEFAULT) {
        jpeg_save_markers(in, JPEG_APP0, 0xFFFF);
        jpeg_save_markers(in, JPEG_APP0 + 2, 0xFFFF);
        jpeg_save_markers(in, JPEG_APP0 + 14, 0xFFFF);
    }
    jpeg_read_header(in, TRUE);
    res->width = in->image_width;
    res->height = in->image_height;
    res->components = in->num_components;
    res->color_space = in->jpeg_color_space;
}

/* A call's end, success or not: its warnings and first message, libjpeg's state freed, and
 * an output buffer not handed to the caller freed. */
static int end_call(int rc, pcr_transcode_result *res, pcr_err *err, j_compress_ptr out,
                    j_decompress_ptr in) {
    res->warnings = err->warnings;
    memcpy(res->message, err->msg, sizeof(res->message) - 1);
    res->message[sizeof(res->message) - 1] = 0;
    jpeg_destroy_compress(out);
    jpeg_destroy_decompress(in);
    free(err->outbuf);
    return rc;
}

int pcr_transcode(const uint8_t *src, size_t src_len, int keep_markers, const int *scan_script,
                  size_t n_scans, int script_components, uint64_t max_pixels,
                  int restart_rows, int restart_bytes, pcr_transcode_result *res) {
    if (!src || !res || src_len == 0 || src_len > ULONG_MAX) return PCR_E_ARG;
    if (restart_rows < 0 || restart_rows > 65535 || restart_bytes < 0) return PCR_E_ARG;
    if (keep_markers < PCR_KEEP_NONE || keep_markers > PCR_KEEP_ALL) return PCR_E_ARG;
    if (scan_script && (n_scans == 0 || n_scans > 1000)) return PCR_E_ARG;
    memset(res, 0, sizeof(*res));
    if (src_len < 2 || src[0] != 0xFF || src[1] != 0xD8) return PCR_E_NOT_JPEG;

    struct jpeg_decompress_struct in;
    struct jpeg_compress_struct out;
    pcr_err err;
    volatile int rc = PCR_OK;
    start_call(&in, &out, &err);
    if (setjmp(err.jb)) {
        rc = PCR_E_JPEG;
        goto done;
    }
    read_input(&in, src, src_len, keep_markers, res);
    if (max_pixels && (uint64_t)in.image_width * in.image_height > max_pixels) {
        rc = PCR_E_TOO_LARGE; /* refused from the header, before any coefficient is read */
        goto done;
    }
    jvirt_barray_ptr *coefs = jpeg_read_coefficients(&in);
    if (err.corrupt) {
        rc = PCR_E_CORRUPT;
        goto done;
    }
    if (restart_bytes > 0) {
        scan_restarts per;
        memset(&per, 0, sizeof(per));
        if ((rc = encode(&out, &in, coefs, scan_script, n_scans, script_components, keep_markers, 0,
                         FINE_MCUS, NULL, &err)) != PCR_OK)
            goto done;
        rc = balance(err.outbuf, err.outsize, restart_bytes, &per);
        free(err.outbuf);
        err.outbuf = NULL;
        err.outsize = 0;
        if (rc != PCR_OK) goto done;
        if ((rc = encode(&out, &in, coefs, scan_script, n_scans, script_components, keep_markers, 0, 0,
                         &per, &err)) != PCR_OK)
            goto done;
    } else if ((rc = encode(&out, &in, coefs, scan_script, n_scans, script_components, keep_markers,
                            restart_rows, 0, NULL, &err)) != PCR_OK) {
        goto done;
    }
    jpeg_finish_decompress(&in);
    res->data = err.outbuf;
    res->size = err.outsize;
    err.outbuf = NULL;
done:
    return end_call(rc, res, &err, &out, &in);
}

/* A sequential (baseline-coded) rendering of a JPEG's coefficients, for decoders that pay
 * for progressive files: one Huffman pass, no coefficient buffer, no block smoothing.  A
 * progressive file cut after scan k (a q_k view) holds each coefficient without its low
 * coef_bits[c][k] bits, always zero there; dividing the coefficient by 2^bits and
 * multiplying its quantizer by as much keeps every dequantized value, so the pixels are the
 * cut file's decoded without block smoothing, in fewer bits than its coefficients coded as
 * they are.  A quantizer that would pass 32767 keeps that much of its shift.  Markers as
 * pcr_transcode's default (JFIF, ICC, Adobe).  max_pixels (0: none) refuses a larger image
 * from its header, before libjpeg allocates a coefficient buffer for all of it. */
int pcr_sequential(const uint8_t *src, size_t src_len, uint64_t max_pixels,
                   pcr_transcode_result *res) {
    if (!src || !res || src_len == 0 || src_len > ULONG_MAX) return PCR_E_ARG;
    memset(res, 0, sizeof(*res));
    if (src_len < 2 || src[0] != 0xFF || src[1] != 0xD8) return PCR_E_NOT_JPEG;

    struct jpeg_decompress_struct in;
    struct jpeg_compress_struct out;
    pcr_err err;
    volatile int rc = PCR_OK;
    start_call(&in, &out, &err);
    if (setjmp(err.jb)) {
        rc = PCR_E_JPEG;
        goto done;
    }
    read_input(&in, src, src_len, PCR_KEEP_DEFAULT, res);
    if (max_pixels && (uint64_t)in.image_width * in.image_height > max_pixels) {
        rc = PCR_E_TOO_LARGE; /* from the header: libjpeg would buffer every coefficient */
        goto done;
    }
    if (in.num_components > NUM_QUANT_TBLS) {
        rc = PCR_E_UNSUPPORTED; /* a quantizer of its own per component */
        goto done;
    }
    jvirt_barray_ptr *coefs = jpeg_read_coefficients(&in);
    if (err.corrupt) {
        rc = PCR_E_CORRUPT;
        goto done;
    }
    int shift[MAX_COMPS_IN_SCAN][DCTSIZE2]; /* by natural position */
    uint16_t q[MAX_COMPS_IN_SCAN][DCTSIZE2];
    for (int c = 0; c < in.num_components; c++) {
        JQUANT_TBL *t = in.comp_info[c].quant_table;
        if (!t) {
            rc = PCR_E_CORRUPT; /* a component no scan carried */
            goto done;
        }
        for (int k = 0; k < DCTSIZE2; k++) {
            int pos = jpeg_natural_order[k];
            int bits = (in.progressive_mode && in.coef_bits) ? in.coef_bits[c][k] : 0;
            if (bits < 0) bits = 0; /* never sent: zero */
            while (bits > 0 && ((uint32_t)t->quantval[pos] << bits) > 32767) bits--;
            shift[c][pos] = bits;
            q[c][pos] = (uint16_t)(t->quantval[pos] << bits);
        }
        jpeg_component_info *ci = &in.comp_info[c];
        for (JDIMENSION row = 0; row < ci->height_in_blocks; row++) {
            JBLOCKARRAY b = (*in.mem->access_virt_barray)((j_common_ptr)&in, coefs[c], row, 1, TRUE);
            for (JDIMENSION x = 0; x < ci->width_in_blocks; x++)
                for (int pos = 0; pos < DCTSIZE2; pos++)
                    if (shift[c][pos]) b[0][x][pos] = (JCOEF)(b[0][x][pos] / (1 << shift[c][pos]));
        }
    }
    jpeg_copy_critical_parameters(&in, &out);
    for (int c = 0; c < in.num_components; c++) {
        JQUANT_TBL *t = jpeg_alloc_quant_table((j_common_ptr)&out);
        memcpy(t->quantval, q[c], sizeof(t->quantval));
        t->sent_table = FALSE;
        out.quant_tbl_ptrs[c] = t;
        out.comp_info[c].quant_tbl_no = c;
    }
    for (int c = in.num_components; c < NUM_QUANT_TBLS; c++) out.quant_tbl_ptrs[c] = NULL;
    out.optimize_coding = TRUE;
    jpeg_mem_dest(&out, &err.outbuf, &err.outsize);
    jpeg_write_coefficients(&out, coefs);
    for (jpeg_saved_marker_ptr m = in.marker_list; m; m = m->next)
        if (want_marker(&out, m, PCR_KEEP_DEFAULT))
            jpeg_write_marker(&out, m->marker, m->data, m->data_length);
    jpeg_finish_compress(&out);
    jpeg_finish_decompress(&in);
    res->data = err.outbuf;
    res->size = err.outsize;
    err.outbuf = NULL;
done:
    return end_call(rc, res, &err, &out, &in);
}
