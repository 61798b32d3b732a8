/* libFuzzer harness for the fast lane's whole request handling (make fuzz): a sequence
 * of image-store operations (keep, copy, budget changes) and requests, structured or raw,
 * processed as the lane thread does.  Every reply is captured and checked: it carries the
 * request's unique id, a READ answer holds at most the bytes asked for and exactly the
 * kept image's bytes, and nothing reads or writes outside its buffers (ASan/UBSan). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <linux/fuse.h>

#include "fuse_shim.h"

#define LO ((uint64_t)1 << 56)
#define HI ((uint64_t)5 << 56)
#define INOS 8

static int out_fd = -1;
static unsigned char kept[INOS][4096];   /* what was last kept per ino, for READ checks */
static size_t kept_len[INOS];
static int kept_ok[INOS];

static size_t take(const uint8_t **p, const uint8_t *end, void *dst, size_t n)
{
    size_t k = (size_t)(end - *p) < n ? (size_t)(end - *p) : n;
    memset(dst, 0, n);
    memcpy(dst, *p, k);
    *p += k;
    return k;
}

static void run(const unsigned char *req, size_t n)
{
    (void)!ftruncate(out_fd, 0);
    (void)!lseek(out_fd, 0, SEEK_SET);
    int r = pcrfs_lane_process(out_fd, req, n);
    if (r != 1)
        return;
    const struct fuse_in_header *in = (const void *)req;
    struct fuse_out_header out;
    off_t size = lseek(out_fd, 0, SEEK_END);
    if (size < (off_t)sizeof out || pread(out_fd, &out, sizeof out, 0) != sizeof out)
        abort();
    if (out.unique != in->unique || out.len != (uint64_t)size)
        abort();
    if (in->opcode == FUSE_READ && out.error == 0) {
        const struct fuse_read_in *rd = (const void *)(req + sizeof *in);
        size_t got = out.len - sizeof out;
        if (got > rd->size)
            abort();
        unsigned i = (unsigned)(in->nodeid - LO);
        if (i < INOS && kept_ok[i] && got) {
            unsigned char *b = malloc(got);
            if (b == NULL || pread(out_fd, b, got, sizeof out) != (ssize_t)got
                || rd->offset + got > kept_len[i]
                || memcmp(b, kept[i] + rd->offset, got) != 0)
                abort();
            free(b);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (out_fd < 0) {
        out_fd = memfd_create("lane-replies", MFD_CLOEXEC);
        if (out_fd < 0)
            abort();
        pcrfs_shim_want(LO, HI);
    }
    pcrfs_lane_configure(1 << 14, 0, 0, 0, 4096, 1);
    memset(kept_ok, 0, sizeof kept_ok);
    const uint8_t *p = data, *end = data + size;
    static const uint32_t ops[] = { FUSE_OPEN, FUSE_RELEASE, FUSE_IOCTL, FUSE_READ,
                                    FUSE_GETATTR, FUSE_FORGET, FUSE_LOOKUP, FUSE_INTERRUPT };
    while (p < end) {
        uint8_t op = *p++;
        switch (op % 5) {
        case 0: {                       /* keep an image */
            uint8_t h[3];
            take(&p, end, h, 3);
            unsigned i = h[0] % INOS;
            size_t len = (size_t)(h[1] | h[2] << 8) % 4096;
            if (len > (size_t)(end - p))
                len = (size_t)(end - p);
            int ok = pcrfs_lane_keep(LO + i, p, len) == 0;
            if (ok) {              /* a newer keep replaces the image the lane answers with */
                memcpy(kept[i], p, len);
                kept_len[i] = len;
            }
            kept_ok[i] = ok;       /* unknown after a failed keep (old one may be evicted) */
            p += len;
            break;
        }
        case 1: {                       /* the budget changes (evictions) */
            uint8_t b[2];
            take(&p, end, b, 2);
            pcrfs_lane_configure((uint64_t)(b[0] | b[1] << 8) * 4, 0, 0, 0, 4096, 1);
            memset(kept_ok, 0, sizeof kept_ok);   /* evicted or not: unknown */
            break;
        }
        case 2: {                       /* a well-formed request */
            uint8_t f[24];
            take(&p, end, f, sizeof f);
            unsigned char req[sizeof(struct fuse_in_header) + 64];
            memset(req, 0, sizeof req);
            struct fuse_in_header *in = (void *)req;
            in->opcode = ops[f[0] % 8];
            in->unique = (uint64_t)f[1] << 8 | f[2];
            in->nodeid = f[3] & 0x80 ? ((uint64_t)f[4] << 56 | f[5]) : LO + f[4] % (INOS + 2);
            size_t arg = 16 + f[6] % 48;
            if (in->opcode == FUSE_READ) {
                struct fuse_read_in *r = (void *)(req + sizeof *in);
                r->fh = f[7] & 1 ? in->nodeid : in->nodeid + 1;
                r->offset = (uint64_t)(f[8] | f[9] << 8) % 5000;
                r->size = (uint32_t)(f[10] | f[11] << 8) % 5000;
                arg = sizeof *r;
            } else if (in->opcode == FUSE_RELEASE || in->opcode == FUSE_IOCTL) {
                uint64_t fh = in->nodeid;
                memcpy(req + sizeof *in, &fh, sizeof fh);
                arg = in->opcode == FUSE_IOCTL ? sizeof(struct fuse_ioctl_in)
                                               : sizeof(struct fuse_release_in);
            } else if (in->opcode == FUSE_OPEN) {
                struct fuse_open_in *o = (void *)(req + sizeof *in);
                o->flags = f[12] | f[13] << 8;
                arg = sizeof *o;
            }
            if (arg > 64)
                arg = 64;
            in->len = (uint32_t)(sizeof *in + arg);
            run(req, in->len);
            break;
        }
        case 3: {                       /* raw bytes as a request (an exact-size copy) */
            uint8_t l;
            take(&p, end, &l, 1);
            size_t n = l < (size_t)(end - p) ? l : (size_t)(end - p);
            unsigned char *req = malloc(n ? n : 1);
            if (req == NULL)
                abort();
            memcpy(req, p, n);
            if (n >= sizeof(struct fuse_in_header))
                run(req, n);
            else
                pcrfs_lane_process(out_fd, req, n);
            free(req);
            p += n;
            break;
        }
        case 4: {                       /* Python reading a kept image */
            uint8_t c[5];
            take(&p, end, c, 5);
            unsigned i = c[0] % INOS;
            size_t cap = (size_t)(c[1] | c[2] << 8) % 5000;
            uint64_t off = (uint64_t)(c[3] | c[4] << 8) % 5000;
            uint8_t *b = malloc(cap ? cap : 1);
            if (b == NULL)
                abort();
            int64_t k = pcrfs_lane_copy(LO + i, off, b, cap);
            if (k > (int64_t)cap)
                abort();
            if (k > 0 && kept_ok[i]
                && (off + (uint64_t)k > kept_len[i] || memcmp(b, kept[i] + off, (size_t)k)))
                abort();
            free(b);
            break;
        }
        }
    }
    pcrfs_lane_drain();
    return 0;
}
