/* The fast lane's request handling (lane_internal.h): the requests a lane thread answers
 * itself (OPEN, IOCTL, RELEASE of lane files; READ and GETATTR from the image store or
 * cold from the records; LOOKUP by name), and the rest handed to pyfuse3 unchanged. */
#define FUSE_USE_VERSION 35
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuse_shim.h"
#include "lane_internal.h"
#include "lane_cold.h"
#include "pcr_native.h"

static const char *op_name(uint32_t opcode)
{
    switch (opcode) {
    case FUSE_OPEN: return "open";
    case FUSE_RELEASE: return "release";
    case FUSE_IOCTL: return "ioctl";
    case FUSE_READ: return "read";
    case FUSE_GETATTR: return "getattr";
    case FUSE_LOOKUP: return "lookup";
    default: return "other";
    }
}

static void trace(const struct fuse_in_header *in, int error, size_t bytes)
{
    int fd = __atomic_load_n(&lane.trace_fd, __ATOMIC_RELAXED);
    if (fd >= 0)
        dprintf(fd, "pcrfs lane: %s ino=%llu -> %s (%zu bytes)\n", op_name(in->opcode),
                (unsigned long long)in->nodeid, error ? "error" : "answered", bytes);
}

static void reply(int fd, uint64_t unique, int error, const void *arg, size_t arg_len)
{
    struct fuse_out_header out = { .len = (uint32_t)(sizeof out + arg_len), .error = error,
                                   .unique = unique };
    struct iovec iov[2] = { { &out, sizeof out }, { (void *)arg, arg_len } };
    /* a failure means the request was interrupted or the mount is gone: nothing to do */
    (void)!writev(fd, iov, arg_len ? 2 : 1);
}

int pcrfs_lane_classify(const uint8_t *buf, size_t n, uint64_t lo, uint64_t hi)
{
    const struct fuse_in_header *in = (const void *)buf;
    if (buf == NULL || n < sizeof *in || in->len != n)
        return PCRFS_LANE_HAND_OVER;
    const void *arg = buf + sizeof *in;
    size_t arg_len = n - sizeof *in;
    switch (in->opcode) {
    case FUSE_OPEN: {
        const struct fuse_open_in *o = arg;
        if (arg_len >= sizeof *o && in->nodeid >= lo && in->nodeid < hi
            && (o->flags & O_ACCMODE) == O_RDONLY && !(o->flags & (O_TRUNC | O_CREAT)))
            return PCRFS_LANE_OPEN;
        break;
    }
    case FUSE_RELEASE: {
        const struct fuse_release_in *r = arg;   /* pyfuse3's own handles are small */
        if (arg_len >= sizeof *r && r->fh >= lo && r->fh < hi)
            return PCRFS_LANE_RELEASE;
        break;
    }
    case FUSE_IOCTL: {
        const struct fuse_ioctl_in *c = arg;
        if (arg_len >= sizeof *c && c->fh >= lo && c->fh < hi)
            return PCRFS_LANE_IOCTL;
        break;
    }
    case FUSE_READ: {           /* of a lane-opened file: fh = inode */
        const struct fuse_read_in *r = arg;
        if (arg_len >= sizeof *r && r->fh >= lo && r->fh < hi
            && (r->fh == in->nodeid
                || __atomic_load_n(&lane.alias[(in->nodeid >> 56) & 0xFF], __ATOMIC_RELAXED)))
            return PCRFS_LANE_READ;
        break;
    }
    case FUSE_GETATTR: {
        if (arg_len >= sizeof(struct fuse_getattr_in) && in->nodeid >= lo && in->nodeid < hi)
            return PCRFS_LANE_GETATTR;
        break;
    }
    case FUSE_LOOKUP:           /* a name in a directory of a lane view, NUL-terminated */
        if (arg_len >= 2 && in->nodeid >= lo && in->nodeid < hi
            && ((const char *)arg)[arg_len - 1] == '\0')
            return PCRFS_LANE_LOOKUP;
        break;
    }
    return PCRFS_LANE_HAND_OVER;
}

/* Once the kernel has stopped sending OPEN (skip_open), a request about an unopened file
 * carries fh 0, which no handle ever is (pyfuse3's start at 1, the lane's are inodes):
 * make it the inode, the handle of every lane file, which Python also reads by. */
int pcrfs_lane_adopt(uint8_t *buf, size_t n)
{
    if (buf == NULL || n < sizeof(struct fuse_in_header)
        || !__atomic_load_n(&lane.skip_open, __ATOMIC_RELAXED))
        return 0;
    struct fuse_in_header *in = (void *)buf;
    if (in->len != n)
        return 0;
    uint64_t *fh = NULL;
    size_t arg_len = n - sizeof *in;
    switch (in->opcode) {   /* fh is the first field of each */
    case FUSE_READ:
        if (arg_len >= sizeof(struct fuse_read_in))
            fh = &((struct fuse_read_in *)(buf + sizeof *in))->fh;
        break;
    case FUSE_IOCTL:
        if (arg_len >= sizeof(struct fuse_ioctl_in))
            fh = &((struct fuse_ioctl_in *)(buf + sizeof *in))->fh;
        break;
    }
    if (fh == NULL || *fh != 0 || in->nodeid == 0)
        return 0;
    *fh = in->nodeid;
    return 1;
}

/* A daemon that took over a mount finds the kernel holding handles its predecessor's
 * Python gave out for files it opened itself (control files, dynamic/ without the lane):
 * (daemon number << 32) | count, below bit 55 (pcrfs/fs/operations.py _fh).  Their state
 * died with that process, so such a handle on READ, WRITE, FLUSH or RELEASE becomes the
 * request's inode with bit 55 set, which Python opens again (`_reopen`).  Handles that
 * are inodes (tree in bits 56..63) are left alone, as are this daemon's own. */
#define REHANDLE_BIT ((uint64_t)1 << 55)
int pcrfs_lane_rehandle(uint8_t *buf, size_t n)
{
    if (buf == NULL || n < sizeof(struct fuse_in_header) || !resume.rehandle)
        return 0;
    struct fuse_in_header *in = (void *)buf;
    if (in->len != n || in->nodeid >> 56 == 0)
        return 0;               /* (the root and unknown trees: nothing to reopen) */
    size_t arg_len = n - sizeof *in, need;
    switch (in->opcode) {       /* fh is the first field of each */
    case FUSE_READ: need = sizeof(struct fuse_read_in); break;
    case FUSE_WRITE: need = sizeof(struct fuse_write_in); break;
    case FUSE_FLUSH: need = sizeof(struct fuse_flush_in); break;
    case FUSE_RELEASE: need = sizeof(struct fuse_release_in); break;
    default: return 0;
    }
    if (arg_len < need)
        return 0;
    uint64_t fh;
    memcpy(&fh, buf + sizeof *in, sizeof fh);
    if (fh == 0 || fh >> 55 != 0 || (fh >> 32) == resume.epoch)
        return 0;
    fh = in->nodeid | REHANDLE_BIT;
    memcpy(buf + sizeof *in, &fh, sizeof fh);
    return 1;
}

#define ORDINAL_MASK (((uint64_t)1 << 56) - 1)
#define DIR_BIT ((uint64_t)1 << 55)     /* a directory's ordinal (format/index.py) */

/* Inodes a lane thread is reading cold now (under store.mu), so that the other READs of
 * the same file wait for its image instead of reading it again. */
#define FLIGHT_MAX 64
static struct {
    uint64_t ino[FLIGHT_MAX];
    unsigned n;
    pthread_cond_t cv;
} flight = { .cv = PTHREAD_COND_INITIALIZER };

static int in_flight(uint64_t ino)
{
    for (unsigned i = 0; i < flight.n; i++)
        if (flight.ino[i] == ino)
            return 1;
    return 0;
}

/* 1 if marked (full: 0, and nobody waits for this one) */
static int fly(uint64_t ino)
{
    if (flight.n == FLIGHT_MAX)
        return 0;
    flight.ino[flight.n++] = ino;
    return 1;
}

static void land(uint64_t ino)
{
    for (unsigned i = 0; i < flight.n; i++)
        if (flight.ino[i] == ino) {
            flight.ino[i] = flight.ino[--flight.n];
            return;
        }
}

static void attr_reply(int fd, const struct fuse_in_header *in, uint64_t size)
{
    struct fuse_attr_out a;
    memset(&a, 0, sizeof a);
    a.attr = store.tmpl;        /* set once before the lane starts, never changed */
    a.attr.ino = in->nodeid;
    a.attr.size = size;
    a.attr.blocks = (size + 511) / 512;
    a.attr_valid = store.attr_valid;
    reply(fd, in->unique, 0, &a, sizeof a);
}

/* A file's entry, named in a q-view directory, from the segment table's names: its
 * ordinal and size, with the attributes Python gives a lane file, or 0 (a directory, a
 * name the table lacks, no table yet: Python answers, negative entries included). */
static int cold_lookup(int fd, const struct fuse_in_header *in, const char *name)
{
    uint64_t parent = in->nodeid & ORDINAL_MASK;
    unsigned tree = (unsigned)(in->nodeid >> 56);
    if (!store.configured || !(parent & DIR_BIT))
        return 0;
    int64_t ord = pcrfs_cold_lookup(tree, parent & (DIR_BIT - 1), (const uint8_t *)name,
                                    strlen(name));
    int64_t size = ord < 0 ? -1 : pcrfs_cold_size(tree, (uint64_t)ord);
    if (size < 0)
        return 0;
    struct fuse_entry_out e;
    memset(&e, 0, sizeof e);
    e.nodeid = (uint64_t)tree << 56 | (uint64_t)ord;
    e.entry_valid = e.attr_valid = store.attr_valid;
    e.attr = store.tmpl;
    e.attr.ino = e.nodeid;
    e.attr.size = (uint64_t)size;
    e.attr.blocks = ((uint64_t)size + 511) / 512;
    reply(fd, in->unique, 0, &e, sizeof e);
    bump(&lane.n_cold_lookup);
    trace(in, 0, 0);
    return 1;
}

/* A READ of a file the store does not hold, from the records (lane_cold.c): answered and
 * the image kept, or 0 (not a cold view, not in the table, or anything failed: Python
 * reads it again and answers, EIO with its log line for damage). */
static int cold_read(int fd, const struct fuse_in_header *in, const struct fuse_read_in *r,
                     uint64_t ino)
{
    unsigned tree = (unsigned)(ino >> 56);
    if (!pcrfs_cold_serves(tree))
        return 0;
    int64_t size = pcrfs_cold_size(tree, ino & ORDINAL_MASK);
    if (size < 0)
        return 0;
    struct img *e = malloc(sizeof *e + (size_t)size);
    if (e == NULL)
        return 0;
    size_t len;
    uint64_t pread_bytes, pack_bytes;
    int rc = pcrfs_cold_assemble(tree, ino & ORDINAL_MASK, e->data, (size_t)size, &len,
                                 &pread_bytes, &pack_bytes);
    __atomic_fetch_add(&lane.cold_read[tree], pread_bytes, __ATOMIC_RELAXED);
    if (pack_bytes) {
        __atomic_fetch_add(&lane.cold_pack[tree], pack_bytes, __ATOMIC_RELAXED);
        bump(&lane.cold_items[tree]);
    }
    if (rc != PCR_OK) {
        if (rc == PCR_E_CORRUPT)
            bump(&lane.cold_bad[tree]);
        bump(&lane.cold_handed[tree]);
        free(e);
        return 0;
    }
    size_t from = r->offset < len ? (size_t)r->offset : len;
    size_t kk = len - from < r->size ? len - from : r->size;
    reply(fd, in->unique, 0, e->data + from, kk);
    if (from == 0) {            /* a file counts once, as the store's READs count */
        bump(&lane.cold_files[tree]);
        __atomic_fetch_add(&lane.cold_bytes[tree], len, __ATOMIC_RELAXED);
    }
    trace(in, 0, kk);
    e->ino = ino;
    e->len = len;
    if (!store_fits(len) || store_insert(e) != 0)
        free(e);
    return 1;
}

/* Answer the request in buf, read from fd, if it is one of ours; 0 if it must go to
 * pyfuse3.  No syscall is made while holding a lock that Python threads take. */
LANE_HIDDEN int answer(int fd, const unsigned char *buf, size_t n)
{
    const struct fuse_in_header *in = (const void *)buf;
    switch (pcrfs_lane_classify(buf, n, lane.lo, lane.hi)) {
    case PCRFS_LANE_OPEN: {
        struct fuse_open_out r = { .fh = in->nodeid, .open_flags = FOPEN_KEEP_CACHE };
        if (__atomic_load_n(&lane.skip_open, __ATOMIC_RELAXED))
            reply(fd, in->unique, -ENOSYS, NULL, 0);   /* success, and no OPEN ever again */
        else
            reply(fd, in->unique, 0, &r, sizeof r);
        bump(&lane.n_open);
        trace(in, 0, 0);
        return 1;
    }
    case PCRFS_LANE_RELEASE:
        reply(fd, in->unique, 0, NULL, 0);
        bump(&lane.n_release);
        trace(in, 0, 0);
        return 1;
    case PCRFS_LANE_IOCTL:
        reply(fd, in->unique, -ENOTTY, NULL, 0);  /* what a regular file on ext4 answers */
        bump(&lane.n_ioctl);
        trace(in, 0, 0);
        return 1;
    case PCRFS_LANE_READ: {
        const struct fuse_read_in *r = (const void *)(buf + sizeof *in);
        /* the file's bytes are those of fh (a dynamic/ file's handle is the inode of the
         * q-view file it was opened at), and counted under that view, as Python counts */
        uint64_t ino = r->fh;
        unsigned tree = (unsigned)(ino >> 56);
        int leader = 0;
        pthread_mutex_lock(&store.mu);
        struct img *e;
        for (;;) {
            e = find(ino);
            if (e) {            /* referenced: stays alive while the kernel copies it */
                e->refs++;
                lru_unlink(e);
                lru_front(e);
                store.n_read++;
                break;
            }
            if (!pcrfs_cold_serves((unsigned)(ino >> 56)))
                break;
            /* The kernel sends a large file's READs at once (readahead), to several lane
             * threads: one reads the image, the others wait for it in the store instead
             * of reading it again.  (Not kept after all: each then reads it itself.) */
            if (!in_flight(ino)) {
                leader = fly(ino);
                break;
            }
            pthread_cond_wait(&flight.cv, &store.mu);
        }
        pthread_mutex_unlock(&store.mu);
        if (!e) {               /* not kept: from the records, else Python */
            int done = cold_read(fd, in, r, ino);
            if (leader) {
                pthread_mutex_lock(&store.mu);
                land(ino);
                pthread_cond_broadcast(&flight.cv);
                pthread_mutex_unlock(&store.mu);
            }
            return done;
        }
        size_t from = r->offset < e->len ? (size_t)r->offset : e->len;
        size_t k = e->len - from < r->size ? e->len - from : r->size;
        reply(fd, in->unique, 0, e->data + from, k);
        /* counted as Python counts a file it assembles: the whole image once per read
         * from the start (the rest of the file's READs are the same serving) */
        if (from == 0) {
            __atomic_fetch_add(&lane.read_bytes[tree], e->len, __ATOMIC_RELAXED);
            bump(&lane.read_files[tree]);
        }
        trace(in, 0, k);
        struct img *garbage = NULL;
        pthread_mutex_lock(&store.mu);
        if (--e->refs == 0 && e->dead)
            garbage = e;
        pthread_mutex_unlock(&store.mu);
        free(garbage);
        return 1;
    }
    case PCRFS_LANE_GETATTR: {
        pthread_mutex_lock(&store.mu);
        struct img *e = find(in->nodeid);
        int64_t size = e ? (int64_t)e->len : -1;
        if (e)
            store.n_getattr++;
        pthread_mutex_unlock(&store.mu);
        if (size < 0 && store.configured) {   /* the size from the segment table */
            size = pcrfs_cold_size((unsigned)(in->nodeid >> 56), in->nodeid & ORDINAL_MASK);
            if (size >= 0)
                bump(&lane.n_cold_getattr);
        }
        if (size < 0)
            return 0;           /* Python knows the size without assembling */
        attr_reply(fd, in, (uint64_t)size);
        trace(in, 0, 0);
        return 1;
    }
    case PCRFS_LANE_LOOKUP:
        return cold_lookup(fd, in, (const char *)(buf + sizeof *in));
    default:
        return 0;
    }
}

/* Requests the kernel expects no answer to. */
static int no_reply(uint32_t opcode)
{
    return opcode == FUSE_FORGET || opcode == FUSE_BATCH_FORGET || opcode == FUSE_INTERRUPT
        || opcode == FUSE_NOTIFY_REPLY;
}

/* A request that cannot be handed over for want of memory is answered ENOMEM, never
 * dropped: a dropped request leaves its caller waiting forever. */
LANE_HIDDEN void refuse_nomem(int fd, const unsigned char *buf, size_t n)
{
    const struct fuse_in_header *in = (const void *)buf;
    bump(&lane.n_nomem);
    if (n >= sizeof *in && !no_reply(in->opcode))
        reply(fd, in->unique, -ENOMEM, NULL, 0);
}

/* Queue a request for pyfuse3.  Read on a clone (fd is not the session's), its reply must
 * go back there: the route is recorded before pyfuse3 can see the request. */
LANE_HIDDEN void hand_over(int fd, const unsigned char *buf, size_t n)
{
    const struct fuse_in_header *in = (const void *)buf;
    struct handed *h = malloc(sizeof *h + n);
    if (h == NULL || ((resume.own_clones || fd != lane.workers[0].fd) && !no_reply(in->opcode)
                      && route_add(in->unique, fd) != 0)) {
        free(h);
        refuse_nomem(fd, buf, n);
        return;
    }
    if (resume.inflight != NULL && !no_reply(in->opcode))
        for (unsigned i = 0; i < lane.nthreads; i++)
            if (lane.workers[i].fd == fd) {
                inflight_put(in->unique, i);
                break;
            }
    h->next = NULL;
    h->len = n;
    memcpy(h->data, buf, n);
    pthread_mutex_lock(&lane.mu);
    if (lane.tail)
        lane.tail->next = h;
    else
        lane.head = h;
    lane.tail = h;
    pthread_mutex_unlock(&lane.mu);
    bump(&lane.n_handed);
    uint64_t one = 1;
    (void)!write(lane.event_fd, &one, sizeof one);
}

/* One request processed as a lane thread does, replies written to reply_fd; what it
 * hands over is queued until pcrfs_lane_drain().  For the fuzzer and the replay test
 * only, never while the lane runs.  1: answered here, 0: handed over, -1: refused. */
int pcrfs_lane_process(int reply_fd, const uint8_t *buf, size_t n)
{
    if (lane.running || buf == NULL)
        return -1;
    lane.workers[0].fd = reply_fd;
    int r = 0;
    if (n >= sizeof(struct fuse_in_header)) {
        uint8_t *own = malloc(n);   /* adopt writes; the caller's buffer is const */
        if (own == NULL) {
            lane.workers[0].fd = -1;
            return -1;
        }
        memcpy(own, buf, n);
        pcrfs_lane_adopt(own, n);
        r = answer(reply_fd, own, n);
        if (!r)
            hand_over(reply_fd, own, n);
        free(own);
    }
    lane.workers[0].fd = -1;
    return r;
}

