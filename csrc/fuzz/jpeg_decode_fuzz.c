/* libFuzzer harness for the batch decoder's C half (make fuzz): any bytes must parse or
 * return an error code; whatever parses must entropy-decode into its own coefficient
 * buffer or return PCR_E_CORRUPT, and every interval must lie inside the unstuffed data. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jpeg_decode.h"
#include "pcr_native.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int32_t tables[PCR_JPG_MAX_TABLES * PCR_HUFF_WORDS];
    static pcr_jpeg_info info;
    pcr_jpeg_interval ivs[64];
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    /* a small interval array sometimes: running out of room must be PCR_E_SPACE */
    size_t cap = size && (data[0] & 1) ? 2 : 64;
    int rc = pcr_jpeg_parse(data, size, &info, tables, buf, ivs, cap);
    if (rc == PCR_OK) {
        if ((size_t)info.nintervals > cap || info.data_len > size) abort();
        for (int i = 0; i < info.nintervals; i++)
            if (ivs[i].data_off < 0 || (size_t)(ivs[i].data_off + ivs[i].data_len) > info.data_len)
                abort();
        /* the decoder's buffer is sized by the header: cap it so the fuzzer stays fast */
        if (info.total_blocks <= (1 << 16)) {
            int16_t *coefs = calloc((size_t)info.total_blocks * 64, sizeof(int16_t));
            int64_t bad;
            if (coefs) {
                int r = pcr_jpeg_decode_intervals(&info, tables, buf, ivs, 0, (size_t)info.nintervals,
                                                  coefs, &bad);
                if (r != PCR_OK && r != PCR_E_CORRUPT) abort();
                free(coefs);
            }
        }
    }
    free(buf);
    return 0;
}
