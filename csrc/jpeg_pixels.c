/* JPEG pixels for the build's l3 view: one libjpeg decode of the (baseline) source straight
 * into planes, then the L3 encoder, with no Python object in between.  The coefficients are
 * the ones the progressive output carries, so the pixels are those the mount's decode of
 * q_G gives; tests/test_build_output.py holds it to the bytes of the Pillow path. */
#include <stdlib.h>
#include <string.h>

#include "jpeg_err.h"
#include "pcr_native.h"

/* Decode into planes (of buf); rows holds rec_outbuf_height interleaved rows. */
static int decode_planes(j_decompress_ptr in, pcr_err *err, uint8_t *buf, uint8_t *rows) {
    uint32_t w = in->output_width, h = in->output_height;
    size_t n = (size_t)w * h;
    int gray = in->out_color_space == JCS_GRAYSCALE;
    JSAMPROW ptrs[16];
    int per_call = in->rec_outbuf_height < 16 ? in->rec_outbuf_height : 16;
    size_t stride = (size_t)w * (gray ? 1 : 3);
    for (int r = 0; r < per_call; r++) ptrs[r] = rows + r * stride;
    while (in->output_scanline < h) {
        size_t y0 = in->output_scanline;
        JDIMENSION got = jpeg_read_scanlines(in, ptrs, (JDIMENSION)per_call);
        if (err->warnings) return PCR_E_UNSUPPORTED; /* the caller falls back: pixels stay exact */
        for (JDIMENSION r = 0; r < got; r++) {
            const uint8_t *src = rows + r * stride;
            size_t off = (y0 + r) * w;
            if (gray) {
                memcpy(buf + off, src, w);
                continue;
            }
            pcr_deinterleave3(src, w, buf + off, buf + n + off, buf + 2 * n + off);
        }
    }
    return PCR_OK;
}

int pcr_jpeg_to_l3(const uint8_t *jpeg, size_t len, uint8_t *dst, size_t dst_cap,
                   size_t *out_len, uint32_t *width, uint32_t *height) {
    if (!jpeg || !out_len || !width || !height || len == 0 || len > 0xFFFFFFFFu) return PCR_E_ARG;
    if (len < 2 || jpeg[0] != 0xFF || jpeg[1] != 0xD8) return PCR_E_NOT_JPEG;
    struct jpeg_decompress_struct in;
    pcr_err err;
    memset(&err, 0, sizeof(err));
    in.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    uint8_t *volatile buf = NULL, *volatile rows = NULL;
    volatile int rc = PCR_OK;
    jpeg_create_decompress(&in);
    if (setjmp(err.jb)) {
        rc = PCR_E_JPEG;
        goto done;
    }
    jpeg_mem_src(&in, jpeg, (unsigned long)len);
    jpeg_read_header(&in, TRUE);
    *width = in.image_width;
    *height = in.image_height;
    if (err.warnings) {
        rc = PCR_E_UNSUPPORTED;
        goto done;
    }
    if ((uint64_t)in.image_width * in.image_height > PCR_JPEG_MAX_PIXELS) {
        rc = PCR_E_TOO_LARGE;
        goto done;
    }
    if (in.jpeg_color_space == JCS_YCbCr || in.jpeg_color_space == JCS_RGB)
        in.out_color_space = JCS_RGB;
    else if (in.jpeg_color_space == JCS_GRAYSCALE)
        in.out_color_space = JCS_GRAYSCALE;
    else {
        rc = PCR_E_UNSUPPORTED; /* CMYK, YCCK: Pillow's own conversion to RGB applies */
        goto done;
    }
    size_t need;
    uint32_t patch = (uint32_t)pcr_l3_choose_patch(in.image_width, in.image_height);
    if ((rc = pcr_l3_max_size(in.image_width, in.image_height, patch, &need)) != PCR_OK) goto done;
    if (!dst || dst_cap < need) {
        rc = PCR_E_SPACE;
        goto done;
    }
    jpeg_calc_output_dimensions(&in);
    size_t n = (size_t)in.output_width * in.output_height;
    int gray = in.out_color_space == JCS_GRAYSCALE;
    buf = malloc(gray ? n : 3 * n);
    rows = malloc((size_t)(in.rec_outbuf_height < 16 ? in.rec_outbuf_height : 16) * in.output_width * 3);
    if (!buf || !rows) {
        rc = PCR_E_NOMEM;
        goto done;
    }
    jpeg_start_decompress(&in);
    if ((rc = decode_planes(&in, &err, buf, rows)) != PCR_OK) goto done;
    jpeg_finish_decompress(&in);
    if (err.warnings) {
        rc = PCR_E_UNSUPPORTED;
        goto done;
    }
    const uint8_t *planes[3] = {buf, gray ? buf : buf + n, gray ? buf : buf + 2 * n};
    rc = pcr_l3_encode_planes(planes, in.output_width, in.output_height, patch, dst, dst_cap, out_len);
done:
    free(buf);
    free(rows);
    jpeg_destroy_decompress(&in);
    return rc;
}
