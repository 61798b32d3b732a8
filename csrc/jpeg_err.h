/* The libjpeg error manager of every pcrfs call into libjpeg (internal; one copy per
 * translation unit that includes it). */
#ifndef PCR_JPEG_ERR_H
#define PCR_JPEG_ERR_H
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>
#include <jerror.h>

/* One error manager shared by the decompressor and compressor of a call: fatal errors
 * longjmp back to the caller's setjmp; warnings are counted, and those that mean coefficient
 * data was lost or invented mark the image corrupt. */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    int warnings;
    int corrupt;
    int cut; /* the data was cut short on purpose (fused.c's own path): running out is no damage */
    char msg[JMSG_LENGTH_MAX];
    unsigned char *outbuf; /* lives here so it survives longjmp */
    unsigned long outsize;
} pcr_err;

static inline void on_error(j_common_ptr c) {
    pcr_err *e = (pcr_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

static inline void on_message(j_common_ptr c, int level) {
    if (level >= 0) return; /* trace messages */
    pcr_err *e = (pcr_err *)c->err;
    int code = c->err->msg_code;
    if (e->cut && code == JWRN_HIT_MARKER) return;
    if (e->warnings++ == 0) c->err->format_message(c, e->msg);
    if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_HUFF_BAD_CODE ||
        code == JWRN_ARITH_BAD_CODE || code == JWRN_MUST_RESYNC ||
        code == JWRN_NOT_SEQUENTIAL || code == JWRN_BOGUS_PROGRESSION) {
        if (!e->corrupt) c->err->format_message(c, e->msg);
        e->corrupt = 1;
    }
}

#endif
