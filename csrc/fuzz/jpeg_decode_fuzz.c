/* libFuzzer harness for the batch decoder's C half (make fuzz): any bytes must parse or
 * return an error code; whatever parses must entropy-decode into its own coefficient
 * buffer or return PCR_E_CORRUPT, every interval must lie inside the unstuffed data, and
 * a batch of it twice must give descriptors inside the batch's bytes and scans. */
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
        const pcr_jpeg_info *infos[2] = {&info, &info};
        const uint8_t *datas[2] = {buf, buf};
        const int32_t *tabs[2] = {tables, tables};
        const pcr_jpeg_interval *ivp[2] = {ivs, ivs};
        int64_t firsts[2] = {0, info.total_blocks}, sizes[4], counts[PCR_JPG_MAX_SCANS];
        if (pcr_jpeg_batch_size(2, infos, sizes) != PCR_OK) abort();
        uint8_t *all = malloc((size_t)sizes[2] + 4);     /* + the kernel's pad */
        int32_t *alltab = malloc(((size_t)sizes[3] + 1) * PCR_HUFF_WORDS * sizeof(int32_t));
        int64_t *rows = malloc(((size_t)sizes[0] + 1) * PCR_JPG_SCAN_WORDS * sizeof(int64_t));
        int64_t *iv = malloc(((size_t)sizes[1] + 1) * PCR_JPG_IV_WORDS * sizeof(int64_t));
        int64_t *where = malloc(((size_t)sizes[1] + 1) * 3 * sizeof(int64_t));
        if (all && alltab && rows && iv && where) {
            if (pcr_jpeg_batch_descriptors(2, infos, datas, tabs, ivp, firsts, NULL, sizes, all, alltab,
                                           rows, iv, where, counts) != PCR_OK)
                abort();
            for (int64_t i = 0; i < sizes[1]; i++) {
                int64_t *d = iv + i * PCR_JPG_IV_WORDS;
                if (d[0] < 0 || d[1] < d[0] || d[1] > sizes[2] || d[4] < 0 || d[4] >= sizes[0]) abort();
            }
        }
        /* a crop's take over the same buffers: the first image's middle rows, none of the second */
        int64_t windows[4] = {info.mcuy / 3, info.mcuy / 2 + 1, 0, 0}, tsizes[4];
        uint8_t *take = malloc(2 * (size_t)info.nintervals + 1);
        if (all && alltab && rows && iv && where && take) {
            if (pcr_jpeg_batch_take(2, infos, ivp, windows, take, tsizes) != PCR_OK) abort();
            if (tsizes[1] > sizes[1] || tsizes[2] > sizes[2]) abort();
            for (int i = 0; i < info.nintervals; i++)
                if (take[info.nintervals + i]) abort();
            if (pcr_jpeg_batch_descriptors(2, infos, datas, tabs, ivp, firsts, take, tsizes, all, alltab,
                                           rows, iv, where, counts) != PCR_OK)
                abort();
            for (int64_t i = 0; i < tsizes[1]; i++) {
                int64_t *d = iv + i * PCR_JPG_IV_WORDS;
                if (d[0] < 0 || d[1] < d[0] || d[1] > tsizes[2] || where[3 * i] != 0) abort();
            }
        }
        free(take);
        free(all); free(alltab); free(rows); free(iv); free(where);
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
