#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "pcr_native.h"

/* Total output size (segments + 2-byte EOI), or an error if it does not fit. */
static int splice_size(const uint64_t *lengths, size_t n_segs, size_t dst_cap, size_t *total) {
    uint64_t t = 2;
    for (size_t i = 0; i < n_segs; i++) {
        if (lengths[i] > SIZE_MAX - t) return PCR_E_SPACE;
        t += lengths[i];
    }
    if (t > dst_cap) return PCR_E_SPACE;
    *total = (size_t)t;
    return PCR_OK;
}

int pcr_splice_buf(const uint8_t *src, size_t src_len, const uint64_t *offsets,
                   const uint64_t *lengths, size_t n_segs, uint8_t *dst, size_t dst_cap,
                   size_t *out_len) {
    if (!dst || !out_len || (n_segs && (!src || !offsets || !lengths))) return PCR_E_ARG;
    *out_len = 0;
    size_t total;
    int rc = splice_size(lengths, n_segs, dst_cap, &total);
    if (rc) return rc;
    size_t w = 0;
    for (size_t i = 0; i < n_segs; i++) {
        if (offsets[i] > src_len || lengths[i] > src_len - offsets[i]) return PCR_E_RANGE;
        memcpy(dst + w, src + offsets[i], (size_t)lengths[i]);
        w += lengths[i];
    }
    dst[w++] = 0xFF;
    dst[w++] = 0xD9;
    *out_len = w;
    return PCR_OK;
}

int pcr_splice_fd(int fd, const uint64_t *offsets, const uint64_t *lengths, size_t n_segs,
                  uint8_t *dst, size_t dst_cap, size_t *out_len) {
    if (fd < 0 || !dst || !out_len || (n_segs && (!offsets || !lengths))) return PCR_E_ARG;
    *out_len = 0;
    size_t total;
    int rc = splice_size(lengths, n_segs, dst_cap, &total);
    if (rc) return rc;
    size_t w = 0;
    for (size_t i = 0; i < n_segs; i++) {
        if (offsets[i] > (uint64_t)INT64_MAX - lengths[i]) return PCR_E_RANGE;
        uint64_t done = 0;
        while (done < lengths[i]) {
            ssize_t r = pread(fd, dst + w + done, (size_t)(lengths[i] - done),
                              (off_t)(offsets[i] + done));
            if (r < 0) {
                if (errno == EINTR) continue;
                return PCR_E_IO;
            }
            if (r == 0) return PCR_E_SHORT;
            done += (uint64_t)r;
        }
        w += lengths[i];
    }
    dst[w++] = 0xFF;
    dst[w++] = 0xD9;
    *out_len = w;
    return PCR_OK;
}

void pcr_free(void *p) { free(p); }
