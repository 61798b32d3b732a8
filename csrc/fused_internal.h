/* Internal to the fused decode-crop-resize (pcrfs.torch.decode_resized_crop): fused.c
 * decodes the box, resize.c resizes it, scratch.c keeps each thread's big buffers. */
#ifndef PCR_FUSED_INTERNAL_H
#define PCR_FUSED_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "pcr_native.h"

#define PCR_FUSED_HIDDEN __attribute__((visibility("hidden")))

/* Buffer i of this thread, at least n bytes (contents undefined), or NULL; trim() gives
 * back any grown past what a thread keeps, at the end of a call. */
enum { S_REGION, S_MID, S_TABLES, S_DATA, S_IV, S_TAKE, S_N };
PCR_FUSED_HIDDEN void *pcr_scratch_take(int i, size_t n);
PCR_FUSED_HIDDEN void pcr_scratch_trim(void);

/* A resize of one axis: each output pixel's weights over its input span. */
typedef struct {
    int32_t *k;     /* ksize weights per output pixel */
    int32_t *lo;    /* first input index per output pixel */
    int32_t *n;     /* weights used per output pixel */
    int ksize;
    int32_t *split; /* per output, per pair of taps: (kh1 << 16 | kh0, kl1 << 16 | kl0), for hrow */
} taps;

/* The box in scaled coordinates (the source scaled by sx, sy to sw x sh), the taps over
 * it, and the integer span [cx0, cx1) x [cy0, cy1) they read. */
PCR_FUSED_HIDDEN int pcr_plan(const pcr_crop *c, double sx, double sy, uint32_t sw, uint32_t sh,
                              taps *tx, taps *ty, int *cx0, int *cx1, int *cy0, int *cy1);
/* Resize the region (rw x rh RGB, origin at (rx, ry) of the scaled image; its bytes end at
 * `end`) through the taps into dst (out_h x out_w, HWC, CHW or normalised float CHW). */
PCR_FUSED_HIDDEN int pcr_resample(const uint8_t *region, const uint8_t *end, int rw, int rx, int ry,
                                  const taps *tx, const taps *ty, const pcr_crop *c, uint8_t *dst);
PCR_FUSED_HIDDEN void pcr_free_taps(taps *t);
#endif
