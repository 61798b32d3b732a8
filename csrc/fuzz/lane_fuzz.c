/* libFuzzer harness for the fast lane's request classifier (make fuzz): any bytes, as if
 * read from /dev/fuse, must classify without reading past the buffer, and only a request
 * whose header length matches and whose inode or handle is in range may be answered. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <linux/fuse.h>

#include "fuse_shim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size heap copy, so ASan sees any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL) return 0;
    memcpy(buf, data, size);
    uint64_t lo = (uint64_t)1 << 56, hi = (uint64_t)5 << 56;
    int kind = pcrfs_lane_classify(buf, size, lo, hi);
    if (kind != PCRFS_LANE_HAND_OVER) {
        const struct fuse_in_header *in = (const void *)buf;
        if (size < sizeof *in || in->len != size) abort();
        if ((kind == PCRFS_LANE_OPEN || kind == PCRFS_LANE_GETATTR)
            && (in->nodeid < lo || in->nodeid >= hi)) abort();
        if (kind == PCRFS_LANE_READ) {
            const struct fuse_read_in *r = (const void *)(buf + sizeof *in);
            if (size < sizeof *in + sizeof *r || r->fh != in->nodeid || r->fh < lo || r->fh >= hi)
                abort();
        }
    }
    free(buf);
    return 0;
}
