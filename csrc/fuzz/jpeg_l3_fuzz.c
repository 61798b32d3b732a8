/* libFuzzer harness for the build's JPEG-to-L3 path (make fuzz): any bytes must give L3
 * bytes that decode, or an error code; never a crash, a leak or an out-of-bounds access.
 * libjpeg itself is not instrumented; what is checked is pcrfs's use of it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pcr_native.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t len, cap;
    uint32_t w, h;
    if (pcr_jpeg_to_l3(data, size, NULL, 0, &len, &w, &h) != PCR_E_SPACE) return 0;
    if ((uint64_t)w * h > (1u << 20)) return 0; /* keep it fast; the size limit is tested */
    if (pcr_l3_max_size(w, h, (uint32_t)pcr_l3_choose_patch(w, h), &cap) != PCR_OK) abort();
    uint8_t *dst = malloc(cap), *rgb = malloc((size_t)w * h * 3);
    if (pcr_jpeg_to_l3(data, size, dst, cap, &len, &w, &h) == PCR_OK) {
        if (len > cap) abort();
        if (pcr_l3_decode(dst, len, rgb, (size_t)w * h * 3) != PCR_OK) abort();
    }
    free(dst);
    free(rgb);
    return 0;
}
