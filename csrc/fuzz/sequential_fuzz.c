/* libFuzzer harness for pcr_sequential (make fuzz): any bytes, a cut progressive file
 * above all, must give a sequential JPEG or an error code; never a crash, a leak or an
 * out-of-bounds access.  What it makes must itself re-code (a valid JPEG in, it is one). */
#include <stdint.h>
#include <stdlib.h>

#include "pcr_native.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pcr_transcode_result r, again;
    if (size > (1u << 16)) return 0; /* keep it fast: the parse, not the pixels, is tested */
    if (pcr_sequential(data, size, 1u << 22, &r) != PCR_OK) return 0;   /* as the view bounds it */
    if (!r.data || r.size < 4 || r.data[0] != 0xFF || r.data[1] != 0xD8) abort();
    if (pcr_sequential(r.data, r.size, 1u << 22, &again) != PCR_OK) abort();
    free(again.data);
    free(r.data);
    return 0;
}
