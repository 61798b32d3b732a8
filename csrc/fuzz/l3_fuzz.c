/* libFuzzer harness for the L3 decoder (make fuzz): any input must decode or return an
 * error code, never crash or read out of bounds (AddressSanitizer checks the latter).
 * Whatever decodes must survive an encode/decode round trip unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pcr_native.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t w, h, n;
    if (pcr_l3_info(data, size, &w, &h, &n) != PCR_OK) return 0;
    size_t px = (size_t)w * h;
    if (px > (1u << 22)) return 0; /* keep the fuzzer fast; sizes are checked in l3.c */
    uint8_t *rgb = malloc(px * 3);
    if (!rgb) return 0;
    if (pcr_l3_decode(data, size, rgb, px * 3) == PCR_OK) {
        size_t cap, len;
        if (pcr_l3_max_size(w, h, n, &cap) != PCR_OK) abort();
        uint8_t *enc = malloc(cap), *back = malloc(px * 3);
        if (pcr_l3_encode(rgb, px * 3, w, h, n, enc, cap, &len) != PCR_OK) abort();
        if (pcr_l3_decode(enc, len, back, px * 3) != PCR_OK) abort();
        if (memcmp(rgb, back, px * 3) != 0) abort();
        free(enc);
        free(back);
    }
    free(rgb);
    return 0;
}
