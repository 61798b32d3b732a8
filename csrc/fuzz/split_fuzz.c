/* libFuzzer harness for the scan splitter (make fuzz): any bytes must split or return an
 * error code; segment ends must be increasing and inside the input. */
#include <stdint.h>
#include <stdlib.h>

#include "pcr_native.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint64_t ends[64];
    size_t n = 0;
    /* a small ends array too: running out of room must be an error, not an overflow */
    size_t cap = size && (data[0] & 1) ? 3 : 64;
    if (pcr_split_scans(data, size, ends, cap, &n) != PCR_OK) return 0;
    if (n > cap) abort();
    for (size_t i = 0; i < n; i++) {
        if (ends[i] > size) abort();
        if (i && ends[i] <= ends[i - 1]) abort();
    }
    return 0;
}
