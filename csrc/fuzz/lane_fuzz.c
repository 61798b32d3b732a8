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
    /* a resumed daemon's handle rewrite (pcrfs_lane_rehandle): it may only ever turn a
     * predecessor's Python handle into this request's inode | 1 << 55, in place */
    static int resumed;
    if (!resumed) {
        uint8_t init[sizeof(struct fuse_in_header) + 64] = {0};
        struct fuse_in_header *h = (void *)init;
        h->len = sizeof init;
        h->opcode = FUSE_INIT;
        if (pcrfs_shim_resume(init, sizeof init, 1, NULL, 0, 0, 3, -1) != 0) abort();
        resumed = 1;
    }
    uint8_t *before = malloc(size ? size : 1);
    if (before == NULL) { free(buf); return 0; }
    memcpy(before, buf, size);
    if (pcrfs_lane_rehandle(buf, size)) {
        const struct fuse_in_header *in = (const void *)buf;
        uint64_t fh, old;
        if (size < sizeof *in + sizeof fh || in->len != size) abort();
        memcpy(&fh, buf + sizeof *in, sizeof fh);
        memcpy(&old, before + sizeof *in, sizeof old);
        if (fh != (in->nodeid | (uint64_t)1 << 55) || old == 0 || old >> 55 || old >> 32 == 3)
            abort();
        if (memcmp(buf + sizeof *in + 8, before + sizeof *in + 8, size - sizeof *in - 8)
            || memcmp(buf, before, sizeof *in))
            abort();        /* nothing else changed */
    } else if (memcmp(buf, before, size)) {
        abort();
    }
    free(before);
    free(buf);
    return 0;
}
