/* libFuzzer harness for the splice (make fuzz): the input is a source buffer plus a list of
 * (offset, length) pairs and an output capacity, all hostile.  Every call must either
 * succeed with exactly the requested bytes + EOI, or return an error code; ASan checks
 * that nothing is read or written out of bounds (buffer and fd paths). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pcr_native.h"

static uint64_t take(const uint8_t **p, size_t *left) {
    uint64_t v = 0;
    size_t n = *left < 8 ? *left : 8;
    memcpy(&v, *p, n);
    *p += n;
    *left -= n;
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t n_segs = data[0] % 9, cap_sel = data[1];
    const uint8_t *p = data + 2;
    size_t left = size - 2;
    uint64_t off[8], len[8];
    for (size_t i = 0; i < n_segs; i++) {
        uint64_t a = take(&p, &left), b = take(&p, &left);
        /* mostly plausible values, sometimes huge ones (overflow checks) */
        off[i] = (a >> 63) ? a : a % 4096;
        len[i] = (b >> 63) ? b : b % 4096;
    }
    const uint8_t *src = p;
    size_t src_len = left;
    size_t cap = cap_sel == 255 ? 0 : (cap_sel * 64) % 65536;
    uint8_t *dst = malloc(cap ? cap : 1);
    size_t out = 0;
    int rc = pcr_splice_buf(src, src_len, off, len, n_segs, dst, cap, &out);
    if (rc == PCR_OK) {
        size_t pos = 0;
        for (size_t i = 0; i < n_segs; i++) {
            if (off[i] + len[i] > src_len || memcmp(dst + pos, src + off[i], len[i])) abort();
            pos += len[i];
        }
        if (out != pos + 2 || out > cap || dst[pos] != 0xFF || dst[pos + 1] != 0xD9) abort();
    }
    /* the fd path with the same request: short files must be errors, never zeros */
    FILE *f = tmpfile();
    if (f) {
        if (src_len) fwrite(src, 1, src_len, f);
        fflush(f);
        size_t out2 = 0;
        int rc2 = pcr_splice_fd(fileno(f), off, len, n_segs, dst, cap, &out2);
        if (rc2 == PCR_OK && rc == PCR_OK) {   /* the same bytes through pread */
            if (out2 != out) abort();
            size_t pos = 0;
            for (size_t i = 0; i < n_segs; i++) {
                if (memcmp(dst + pos, src + off[i], len[i])) abort();
                pos += len[i];
            }
        }
        if (rc2 == PCR_OK && rc != PCR_OK) {
            /* only a zero-length segment past the end passes on the fd path (nothing is
             * read for it); any byte that is not in the file is an error there too */
            for (size_t i = 0; i < n_segs; i++)
                if (len[i] && (off[i] > src_len || len[i] > src_len - off[i])) abort();
        }
        fclose(f);
    }
    free(dst);
    return 0;
}
