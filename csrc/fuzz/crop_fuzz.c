/* libFuzzer harness for the fused decode-crop-resize (make fuzz): any bytes, any box, any
 * output size give the output or an error code; never a crash, a leak or an out-of-bounds
 * access.  The first 16 bytes choose the box, size and flags (as fractions of the image
 * the header reports, so most boxes are valid); the rest is the image. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pcr_native.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 16) return 0;
    const uint8_t *p = data;
    const uint8_t *img = data + 16;
    size_t len = size - 16;
    uint32_t w, h;
    int32_t kind;
    if (pcr_image_size(img, len, &w, &h, &kind) != PCR_OK) {
        w = 64; /* still drive the decoder with the bytes */
        h = 64;
    }
    if ((uint64_t)w * h > (1u << 20)) return 0; /* keep it fast; the size limit is tested */
    pcr_crop c;
    memset(&c, 0, sizeof c);
    c.left = (int32_t)((uint64_t)w * p[0] / 256) - (p[8] == 0xFF);
    c.top = (int32_t)((uint64_t)h * p[1] / 256);
    c.width = (int32_t)(1 + (uint64_t)w * p[2] / 256) + (p[9] == 0xFF);
    c.height = (int32_t)(1 + (uint64_t)h * p[3] / 256);
    c.out_width = 1 + (p[4] | (p[10] & 1) << 8);
    c.out_height = 1 + (p[5] | (p[10] & 2) << 7);
    c.flip = p[6] & 1;
    c.flags = p[7] & 31; /* 16: libjpeg's entropy decoder, so both paths run */
    c.max_pixels = 1u << 20;
    for (int i = 0; i < 3; i++) c.mean[i] = 120, c.inv_std[i] = 1 / 60.0f;
    size_t cap = (size_t)c.out_width * c.out_height * 3 * ((c.flags & PCR_CROP_FLOAT) ? 4 : 1);
    uint8_t *dst = malloc(cap);
    pcr_crop_result res;
    int rc = pcr_decode_resized_crop(img, len, &c, dst, cap - (p[11] == 0xFF), &res);
    if (rc == PCR_OK && p[11] == 0xFF) abort(); /* a short destination must be refused */
    free(dst);
    return 0;
}
