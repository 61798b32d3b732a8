/* The fast lane: a C thread that owns /dev/fuse and answers the requests a warm epoch
 * consists of, so they never reach Python.
 *
 * With the page cache warm, every image a training job opens still costs the daemon
 * OPEN, IOCTL (Python's open() asks isatty(), which FUSE forwards) and RELEASE.  Through
 * pyfuse3 each is a trio wake-up, a task switch and a Python handler: about 100 us of
 * daemon CPU and a round trip that waits for the trio thread to be scheduled, on a node
 * whose cores are busy decoding.  For a read-only file of an immutable view all three
 * answers are constant (fh = inode with the page cache kept; ENOTTY; done), so this
 * thread reads each request, answers those in a few microseconds, and hands every other
 * request to pyfuse3 unchanged.  Files whose assembled image Python has handed over (the
 * image store below) also get their READ and GETATTR answered here, so a page cache that
 * memory reclaim dropped is refilled without Python.
 *
 * pyfuse3 has no hook for this, so the shim interposes two libfuse functions that it
 * calls: fuse_session_fd() (pyfuse3 then waits on an eventfd that counts handed-over
 * requests) and fuse_session_receive_buf() (which pops them).  The library is loaded into
 * the global symbol scope before pyfuse3 (pcrfs/fs/kernel_shim.py); the real functions
 * are looked up through pyfuse3's own link map.  Unless pcrfs_shim_want() was called,
 * both forward to libfuse and nothing changes.
 *
 * With skip_open (-o skip_open=yes) even the OPEN round trip goes: the lane answers the
 * first OPEN of a lane file with ENOSYS, which the kernel takes as success and as "never
 * send OPEN or RELEASE for a regular file again" (fc->no_open; the page cache is kept).
 * From then on requests about a file carry fh 0; the lane puts the inode there (adopt),
 * the handle every lane file already has, so Python needs no open table for them. */
#define FUSE_USE_VERSION 35
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <fuse_lowlevel.h>

#include "fuse_shim.h"
#include "lane_cold.h"
#include "pcr_native.h"

typedef int (*session_fd_fn)(struct fuse_session *);
typedef int (*receive_buf_fn)(struct fuse_session *, struct fuse_buf *);
typedef void (*session_exit_fn)(struct fuse_session *);
typedef int (*custom_io_fn)(struct fuse_session *, const struct fuse_custom_io *, int);

static session_fd_fn real_session_fd;
static receive_buf_fn real_receive_buf;
static session_exit_fn real_session_exit;
static custom_io_fn real_custom_io;

/* The largest request the kernel may send this session: a WRITE of max_write bytes plus
 * a header page, where max_write <= max_pages pages and the kernel caps max_pages at its
 * fs.fuse.max_pages_limit (256 where the sysctl is absent).  Sized from the kernel's own
 * bound, not libfuse's, so whatever libfuse negotiates fits; computed once when the lane
 * starts, and every buffer the lane hands pyfuse3 has this capacity. */
#define HEADER_PAGE 4096
static size_t kernel_max_request(void)
{
    long pages = 256;
    FILE *f = fopen("/proc/sys/fs/fuse/max_pages_limit", "re");
    if (f) {
        long v;
        if (fscanf(f, "%ld", &v) == 1 && v > pages && v <= 65536)
            pages = v;
        fclose(f);
    }
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE) + HEADER_PAGE;
}

struct handed {
    struct handed *next;
    size_t len;
    unsigned char data[];
};

/* One lane thread: thread 0 reads the session's own descriptor (a dup), the others each
 * a clone of it (FUSE_DEV_IOC_CLONE), so that requests are read and answered on every
 * core at once.  A request must be answered on the descriptor it was read from. */
#define MAX_LANE_THREADS 256
struct worker {
    pthread_t thread;
    int fd;
    unsigned index;
    unsigned char *buf;         /* its read buffer, lane.bufsize bytes */
};

static struct {
    uint64_t lo, hi;            /* inodes [lo, hi) are answered here */
    int wanted, running, eof;
    int event_fd;
    int stopping;               /* pcrfs_shim_stop(): lane threads leave their loop */
    int trace_fd;               /* --debug: one line per answered request, else -1 */
    unsigned want_threads, nthreads;
    struct worker workers[MAX_LANE_THREADS];
    pthread_mutex_t mu;
    struct handed *head, *tail; /* handed to pyfuse3, oldest first */
    size_t bufsize;
    uint64_t n_open, n_release, n_ioctl, n_handed, n_nomem;
    uint64_t read_bytes[256], read_files[256];   /* answered READs by tree (inode >> 56) */
    /* cold READs answered from the records (lane_cold.c), by tree: files, their bytes,
     * bytes pread, checksum failures, and cold attempts handed to Python */
    uint64_t cold_files[256], cold_bytes[256], cold_read[256], cold_bad[256], cold_handed[256];
    uint64_t cold_pack[256], cold_items[256];   /* raw pack bytes and items pread */
    uint64_t n_cold_getattr, n_cold_lookup;
    unsigned want_rt, is_rt;    /* lane threads to run SCHED_FIFO, and that do */
    int want_nice;              /* nice value of the other lane threads (0: leave it) */
    unsigned is_niced;          /* lane threads that got it */
    int skip_open;              /* answer OPEN with ENOSYS: the kernel stops sending it */
    uint8_t alias[256];         /* trees whose files Python opens with fh = a lane file's
                                   inode (dynamic/): their READs are that file's */
} lane = { .event_fd = -1, .trace_fd = -1, .want_threads = 1,
           .mu = PTHREAD_MUTEX_INITIALIZER };

/* A session resumed under a supervisor: see resume_session below. */
#define INFLIGHT_SLOTS 8192     /* pcrfs/fs/supervisor.py INFLIGHT_SLOTS */
struct inflight {               /* 16 bytes a slot: unique 0 = free */
    uint64_t unique;
    uint32_t lane;              /* the lane thread (and clone) that read it */
    uint32_t pad;
};
#ifndef FUSE_NOTIFY_RESEND
#define FUSE_NOTIFY_RESEND 7
#endif
#define RESUME_UNIQUE 1ull      /* odd: never a request id (the kernel steps ids by 2) */
typedef int (*process_buf_fn)(struct fuse_session *, const struct fuse_buf *);
static struct {
    unsigned char *init;        /* the kernel's INIT request, to process first */
    size_t init_len;
    int resend;                 /* ask for the requests in flight again */
    int clones[MAX_LANE_THREADS];
    unsigned nclones;
    int resent;                 /* 1: asked, -errno: the kernel refused, 0: not asked */
    uint64_t epoch;             /* this daemon's number: Python's own handles carry it */
    int rehandle;               /* rewrite a predecessor's handles (pcrfs_lane_rehandle) */
    struct inflight *inflight;  /* no resend: requests handed to Python and not yet
                                   answered, shared with the supervisor (memfd) */
    int own_clones;             /* no resend (Linux < 6.9): every lane thread reads a clone
                                   of this process, none the session's descriptor, so the
                                   requests in flight end with this process (ECONNABORTED,
                                   once) instead of waiting forever on the supervisor's */
} resume;

/* Requests a clone thread handed to pyfuse3, by unique id: libfuse writes every reply to
 * the session's descriptor, and the custom writev below sends these to the clone that
 * read them instead. */
#define ROUTE_BUCKETS 1024
struct route {
    struct route *next;
    uint64_t unique;
    int fd;
};
static struct {
    struct route *bucket[ROUTE_BUCKETS];
    pthread_mutex_t mu;
    uint64_t n_routed;
} routes = { .mu = PTHREAD_MUTEX_INITIALIZER };

static int route_add(uint64_t unique, int fd)
{
    struct route *r = malloc(sizeof *r);
    if (r == NULL)
        return -1;
    r->unique = unique;
    r->fd = fd;
    pthread_mutex_lock(&routes.mu);
    struct route **b = &routes.bucket[(unique * 0x9E3779B97F4A7C15ull) >> 54];
    r->next = *b;
    *b = r;
    pthread_mutex_unlock(&routes.mu);
    return 0;
}

/* The descriptor a reply with this unique id goes to, taken out of the map; -1: none. */
static int route_take(uint64_t unique)
{
    int fd = -1;
    struct route *found = NULL;
    pthread_mutex_lock(&routes.mu);
    for (struct route **pp = &routes.bucket[(unique * 0x9E3779B97F4A7C15ull) >> 54]; *pp;
         pp = &(*pp)->next)
        if ((*pp)->unique == unique) {
            found = *pp;
            *pp = found->next;
            fd = found->fd;
            routes.n_routed++;
            break;
        }
    pthread_mutex_unlock(&routes.mu);
    free(found);
    return fd;
}

static void routes_clear(void)
{
    pthread_mutex_lock(&routes.mu);
    for (unsigned i = 0; i < ROUTE_BUCKETS; i++) {
        struct route *r = routes.bucket[i];
        routes.bucket[i] = NULL;
        while (r) {
            struct route *n = r->next;
            free(r);
            r = n;
        }
    }
    pthread_mutex_unlock(&routes.mu);
}

/* Without resend a request a dead daemon had read can only be failed by whoever holds
 * the clone it was read on: the supervisor, which answers EIO to each one recorded here
 * (supervisor.py _fail_in_flight).  Handed-over requests only: those the lane answers
 * itself are in flight for microseconds (a kill then ends them with ECONNABORTED).  A
 * full table records nothing more, with the same fallback. */
static void inflight_put(uint64_t unique, uint32_t lane_index)
{
    struct inflight *t = resume.inflight;
    if (t == NULL || unique == 0)
        return;
    uint64_t h = (unique * 0x9E3779B97F4A7C15ull) >> 51;   /* 13 bits: 8192 slots */
    for (unsigned probe = 0; probe < 64; probe++) {
        struct inflight *e = &t[(h + probe) & (INFLIGHT_SLOTS - 1)];
        uint64_t free_ = 0;
        if (__atomic_compare_exchange_n(&e->unique, &free_, unique, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            __atomic_store_n(&e->lane, lane_index, __ATOMIC_RELEASE);
            return;
        }
    }
}

static void inflight_clear(uint64_t unique)
{
    struct inflight *t = resume.inflight;
    if (t == NULL || unique == 0)
        return;
    uint64_t h = (unique * 0x9E3779B97F4A7C15ull) >> 51;
    for (unsigned probe = 0; probe < 64; probe++) {
        struct inflight *e = &t[(h + probe) & (INFLIGHT_SLOTS - 1)];
        uint64_t want = unique;
        if (__atomic_compare_exchange_n(&e->unique, &want, 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return;
    }
}

/* libfuse's I/O for the session (fuse_session_custom_io): replies of requests read on a
 * clone go back to that clone; everything else (pyfuse3's replies to the session's own
 * requests, notifications) to the session's descriptor, as before. */
static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    (void)userdata;
    if (count > 0 && iov[0].iov_len >= sizeof(struct fuse_out_header)) {
        const struct fuse_out_header *out = iov[0].iov_base;
        if (out->unique != 0) {
            int to = route_take(out->unique);
            if (to >= 0)
                fd = to;
            inflight_clear(out->unique);
        }
    }
    return writev(fd, iov, count);
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
    (void)userdata;
    return read(fd, buf, len);
}

static const struct fuse_custom_io lane_io = { .writev = io_writev, .read = io_read };

static void bump(uint64_t *c) { __atomic_fetch_add(c, 1, __ATOMIC_RELAXED); }

/* The lane's image store: assembled images of lane files, by inode, LRU-bounded in bytes
 * (or, under the static cache policy, pinned: Python offers only the images of its
 * hash-chosen set and a full store refuses instead of evicting).
 * The kernel's page cache is not ours to keep: memory reclaim (on this VM, DAMON's proactive
 * pageout of pages idle for ~30 s) drops it between epochs, and every dropped file would cost
 * Python a READ plus a GETATTR (the kernel invalidates atime after each READ).  With the
 * image here the lane answers both itself.  Python fills it after assembling a file
 * (pcrfs_lane_keep, from a worker thread); only verified bytes are ever kept. */
struct img {
    struct img *hnext;          /* hash chain; once dropped, the garbage list */
    struct img *prev, *next;    /* LRU, newest at store.lru.next */
    uint64_t ino;
    size_t len;
    unsigned refs;              /* READ replies being written from data (outside the lock) */
    int dead;                   /* dropped while referenced: the last reference frees it */
    unsigned char data[];
};

#define STORE_BUCKETS (1u << 16)

static struct {
    struct img **bucket;
    struct img lru;             /* sentinel */
    size_t used, budget, count;
    pthread_mutex_t mu;
    struct fuse_attr tmpl;      /* what Python's getattr answers for a lane file */
    int configured;             /* tmpl is set: GETATTR may be answered here */
    int pinned;                 /* never evict (static): what comes in stays */
    uint64_t attr_valid;
    uint64_t n_read, n_getattr, n_evicted, n_kept, n_refused;
} store = { .mu = PTHREAD_MUTEX_INITIALIZER };

static struct img **slot(uint64_t ino)
{
    uint64_t h = ino * 0x9E3779B97F4A7C15ull;
    return &store.bucket[(h >> 40) & (STORE_BUCKETS - 1)];
}

static void lru_unlink(struct img *e) { e->prev->next = e->next; e->next->prev = e->prev; }

static void lru_front(struct img *e)
{
    e->next = store.lru.next;
    e->prev = &store.lru;
    store.lru.next->prev = e;
    store.lru.next = e;
}

/* caller holds store.mu */
static struct img *find(uint64_t ino)
{
    if (store.bucket == NULL)
        return NULL;
    for (struct img *e = *slot(ino); e; e = e->hnext)
        if (e->ino == ino)
            return e;
    return NULL;
}

/* Take e out of the store (caller holds store.mu).  Unreferenced, it goes on *garbage for
 * the caller to free once the lock is released (free may munmap: no syscalls under a lock
 * the lane takes); referenced, the last READ reply frees it. */
static void drop(struct img *e, struct img **garbage)
{
    struct img **pp = slot(e->ino);
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(e);
    store.used -= e->len;
    store.count--;
    if (e->refs) {
        e->dead = 1;
    } else {
        e->hnext = *garbage;
        *garbage = e;
    }
}

static void free_all(struct img *garbage)
{
    while (garbage) {
        struct img *n = garbage->hnext;
        free(garbage);
        garbage = n;
    }
}

/* Both locks priority-inheriting: a SCHED_FIFO lane waiting on a lock that a Python
 * worker holds lends that worker its priority instead of waiting behind the CPU hogs
 * that preempt it. */
__attribute__((constructor)) static void init_locks(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&store.mu, &a);
    pthread_mutex_init(&lane.mu, &a);
    pthread_mutexattr_destroy(&a);
}

int pcrfs_lane_configure(uint64_t budget, uint32_t uid, uint32_t gid, int64_t mtime_ns,
                         uint32_t blksize, uint64_t attr_valid)
{
    pthread_mutex_lock(&store.mu);
    if (store.bucket == NULL && budget > 0) {
        store.bucket = calloc(STORE_BUCKETS, sizeof *store.bucket);
        store.lru.next = store.lru.prev = &store.lru;
    }
    store.budget = store.bucket ? budget : 0;
    struct img *garbage = NULL;
    while (store.used > store.budget && store.lru.prev != &store.lru)
        drop(store.lru.prev, &garbage);
    memset(&store.tmpl, 0, sizeof store.tmpl);
    store.tmpl.mode = S_IFREG | 0444;
    store.tmpl.nlink = 1;
    store.tmpl.uid = uid;
    store.tmpl.gid = gid;
    store.tmpl.blksize = blksize;
    store.tmpl.atime = store.tmpl.mtime = store.tmpl.ctime = (uint64_t)(mtime_ns / 1000000000);
    store.tmpl.atimensec = store.tmpl.mtimensec = store.tmpl.ctimensec =
        (uint32_t)(mtime_ns % 1000000000);
    store.attr_valid = attr_valid;
    store.configured = 1;
    int ok = store.bucket != NULL || budget == 0;
    pthread_mutex_unlock(&store.mu);
    free_all(garbage);
    return ok ? 0 : -1;
}

static int store_fits(size_t len)
{
    pthread_mutex_lock(&store.mu);
    int fits = store.bucket != NULL && len <= store.budget;
    pthread_mutex_unlock(&store.mu);
    return fits;
}

/* Put e (e->ino, e->len and data set) in the store: 0, or -1 and the caller frees it. */
static int store_insert(struct img *e)
{
    uint64_t ino = e->ino;
    size_t len = e->len;
    e->refs = 0;
    e->dead = 0;
    struct img *garbage = NULL;
    pthread_mutex_lock(&store.mu);
    struct img *old = find(ino);
    if (old)
        drop(old, &garbage);
    while (!store.pinned && store.used + len > store.budget && store.lru.prev != &store.lru) {
        drop(store.lru.prev, &garbage);
        store.n_evicted++;
    }
    if (store.bucket == NULL || store.used + len > store.budget) {   /* full, or shrank */
        store.n_refused++;
        pthread_mutex_unlock(&store.mu);
        free_all(garbage);
        return -1;
    }
    struct img **pp = slot(ino);
    e->hnext = *pp;
    *pp = e;
    lru_front(e);
    store.used += len;
    store.count++;
    store.n_kept++;
    pthread_mutex_unlock(&store.mu);
    free_all(garbage);
    return 0;
}

void pcrfs_lane_store_pin(int pinned)
{
    pthread_mutex_lock(&store.mu);
    store.pinned = pinned != 0;
    pthread_mutex_unlock(&store.mu);
}

int pcrfs_lane_keep(uint64_t ino, const uint8_t *data, size_t len)
{
    if ((data == NULL && len > 0) || !store_fits(len))
        return -1;
    struct img *e = malloc(sizeof *e + len);   /* copied outside the lock */
    if (e == NULL)
        return -1;
    e->ino = ino;
    e->len = len;
    if (len)
        memcpy(e->data, data, len);
    if (store_insert(e) != 0) {
        free(e);
        return -1;
    }
    return 0;
}

int64_t pcrfs_lane_copy(uint64_t ino, uint64_t off, uint8_t *out, size_t cap)
{
    pthread_mutex_lock(&store.mu);
    struct img *e = find(ino);
    int64_t n = -1;
    if (e) {
        size_t from = off < e->len ? (size_t)off : e->len;
        size_t k = e->len - from < cap ? e->len - from : cap;
        if (k)
            memcpy(out, e->data + from, k);
        n = (int64_t)k;
    }
    pthread_mutex_unlock(&store.mu);
    return n;
}

void pcrfs_lane_store_counts(uint64_t *out, size_t n)
{
    pthread_mutex_lock(&store.mu);
    uint64_t v[] = { store.n_read, store.n_getattr, store.used, store.budget, store.count,
                     store.n_kept, store.n_evicted, store.n_refused };
    pthread_mutex_unlock(&store.mu);
    for (size_t i = 0; i < n && i < sizeof v / sizeof *v; i++)
        out[i] = v[i];
}

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
static int answer(int fd, const unsigned char *buf, size_t n)
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
static void refuse_nomem(int fd, const unsigned char *buf, size_t n)
{
    const struct fuse_in_header *in = (const void *)buf;
    bump(&lane.n_nomem);
    if (n >= sizeof *in && !no_reply(in->opcode))
        reply(fd, in->unique, -ENOMEM, NULL, 0);
}

/* Queue a request for pyfuse3.  Read on a clone (fd is not the session's), its reply must
 * go back there: the route is recorded before pyfuse3 can see the request. */
static void hand_over(int fd, const unsigned char *buf, size_t n)
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

static void *run_lane(void *arg)
{
    struct worker *w = arg;
    char name[16];
    snprintf(name, sizeof name, "pcrfs-lane%u", w->index);
    pthread_setname_np(pthread_self(), name);   /* for ps, top and chrt */
    /* Every synchronous request waits for a lane thread to run.  On a node whose cores are
     * busy decoding, a normal-priority thread queues behind the DataLoader workers: 286 us
     * per open+read+close under 2 busy loops on 2 cores, 70 us with SCHED_FIFO (measured).
     * It cannot hog a core: it runs only while the kernel has requests for it, each is a
     * few microseconds (a cold READ: a pread and a checksum), and the kernel's RT
     * throttling bounds it regardless.  Only the first want_rt threads ask for it, so
     * realtime threads never hold every core.  Without CAP_SYS_NICE this fails and the
     * thread runs at normal priority. */
    int rt = 0;
    if (w->index < lane.want_rt) {
        struct sched_param sp = { .sched_priority = 1 };
        if ((rt = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0))
            __atomic_fetch_add(&lane.is_rt, 1, __ATOMIC_RELAXED);
    }
    /* The rest run at a negative nice value, a per-thread attribute on Linux: when every
     * core decodes, CFS then gives them a larger share without letting them starve the
     * decoders.  Without CAP_SYS_NICE (or above RLIMIT_NICE) it fails quietly. */
    if (!rt && lane.want_nice != 0 &&
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), lane.want_nice) == 0)
        __atomic_fetch_add(&lane.is_niced, 1, __ATOMIC_RELAXED);
    unsigned char *buf = w->buf;
    /* A blocking read, no poll() before it: one system call per request, not two.
     * pcrfs_shim_stop() sets `stopping` and interrupts the read with STOP_SIGNAL. */
    while (!__atomic_load_n(&lane.stopping, __ATOMIC_ACQUIRE)) {
        ssize_t n = read(w->fd, buf, lane.bufsize);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR || errno == ENOENT)
                continue;       /* ENOENT: the request was interrupted before we read it */
            break;              /* ENODEV: unmounted */
        }
        if ((size_t)n < sizeof(struct fuse_in_header))
            continue;           /* not a request the kernel would send */
        pcrfs_lane_adopt(buf, (size_t)n);
        pcrfs_lane_rehandle(buf, (size_t)n);
        if (!answer(w->fd, buf, (size_t)n))
            hand_over(w->fd, buf, (size_t)n);
    }
    if (w->index == 0) {        /* the session's own descriptor: pyfuse3's loop ends too */
        __atomic_store_n(&lane.eof, 1, __ATOMIC_RELEASE);
        uint64_t many = (uint64_t)1 << 40;   /* every pyfuse3 task wakes up and sees the end */
        (void)!write(lane.event_fd, &many, sizeof many);
    }
    return NULL;
}

/* Interrupts a lane thread's read of /dev/fuse at stop (a handler without SA_RESTART
 * makes the read fail with EINTR).  A realtime signal nobody else in the daemon uses. */
#define STOP_SIGNAL (SIGRTMAX - 3)

static void on_stop_signal(int sig) { (void)sig; }

/* A descriptor of the same FUSE connection as fd, with a request queue of its own. */
static int clone_dev(int fd)
{
    int c = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (c < 0)
        return -1;
    uint32_t master = (uint32_t)fd;
    if (ioctl(c, FUSE_DEV_IOC_CLONE, &master) != 0) {
        close(c);
        return -1;
    }
    return c;
}

static void free_workers(unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (lane.workers[i].fd >= 0)
            close(lane.workers[i].fd);
        free(lane.workers[i].buf);
        lane.workers[i].fd = -1;
        lane.workers[i].buf = NULL;
    }
}

/* Python finds libfuse's own functions apart from the shim (kernel_shim.load).  Where that
 * failed, the shim still stands in front of libfuse for pyfuse3, which must then work as
 * if it were not there (no lane): look them up in the libfuse pyfuse3 loaded.  Called on
 * pyfuse3's thread only, before the session runs. */
static void resolve_fallback(void)
{
    if (real_session_fd != NULL && real_receive_buf != NULL && real_session_exit != NULL)
        return;
    void *h = dlopen("libfuse3.so.3", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        h = dlopen("libfuse3.so.3", RTLD_NOW);
    if (h == NULL)
        return;
    void *fd = dlsym(h, "fuse_session_fd"), *rb = dlsym(h, "fuse_session_receive_buf"),
         *ex = dlsym(h, "fuse_session_exit");
    if (fd == NULL || rb == NULL || ex == NULL || fd == (void *)fuse_session_fd
        || rb == (void *)fuse_session_receive_buf)
        return;                 /* (the handle stays open: libfuse stays loaded anyway) */
    real_session_fd = (session_fd_fn)fd;
    real_receive_buf = (receive_buf_fn)rb;
    real_session_exit = (session_exit_fn)ex;
}

/* A session that outlives its daemon (pcrfs/fs/supervisor.py).  A supervisor opened
 * /dev/fuse, mounted it, read the kernel's INIT itself and keeps the descriptor (and the
 * lane's clones) open across daemons.  A daemon it starts hands that INIT to libfuse
 * before anything else: the first with the kernel's own unique id, so libfuse's reply
 * initialises the connection; a later one with an id the kernel never issued (its reply
 * is refused with ENOENT, which libfuse ignores), so libfuse and pyfuse3 come up as
 * an initialised session without a new FUSE_INIT.  A later daemon then asks the kernel to
 * queue again every request the dead one had read and not answered (FUSE_NOTIFY_RESEND,
 * Linux 6.9+); they come back with bit 63 of their unique id set, which the replies echo.
 * Lane threads 1.. read the supervisor's clones, so the requests queued on them are not
 * aborted when a daemon dies (a clone's last close ends its requests with ECONNABORTED). */

int pcrfs_shim_resume(const uint8_t *init, size_t n, int replay, const int *clones,
                      unsigned nclones, int own_clones, uint64_t epoch, int inflight_fd)
{
    const struct fuse_in_header *in = (const void *)init;
    if (init == NULL || n < sizeof *in + 16 || n > 4096   /* 16: major..flags, any kernel */
        || in->len != n || in->opcode != FUSE_INIT || nclones > MAX_LANE_THREADS - 1)
        return -1;
    unsigned char *copy = malloc(n);
    if (copy == NULL)
        return -1;
    memcpy(copy, init, n);
    if (replay)
        ((struct fuse_in_header *)copy)->unique = RESUME_UNIQUE;
    free(resume.init);
    resume.init = copy;
    resume.init_len = n;
    resume.resend = replay;
    for (unsigned i = 0; i < nclones; i++)
        resume.clones[i] = clones[i];
    resume.nclones = nclones;
    resume.own_clones = own_clones;
    resume.epoch = epoch;
    resume.rehandle = replay;
    if (inflight_fd >= 0 && resume.inflight == NULL) {
        void *m = mmap(NULL, INFLIGHT_SLOTS * sizeof(struct inflight), PROT_READ | PROT_WRITE,
                       MAP_SHARED, inflight_fd, 0);
        if (m == MAP_FAILED)
            return -1;
        resume.inflight = m;
    }
    return 0;
}

int pcrfs_shim_resent(void) { return resume.resent; }

int pcrfs_shim_own_clones(void) { return lane.running && resume.own_clones; }

/* libfuse's fuse_session_process_buf, found as resolve_fallback finds the others (the
 * shim does not interpose it). */
static process_buf_fn real_process_buf(void)
{
    void *h = dlopen("libfuse3.so.3", RTLD_NOW | RTLD_NOLOAD);
    return h == NULL ? NULL : (process_buf_fn)dlsym(h, "fuse_session_process_buf");
}

/* On pyfuse3's thread, inside pyfuse3.init(), before any request is read. */
static int resume_session(struct fuse_session *se, int fd)
{
    process_buf_fn process = real_process_buf();
    if (process == NULL)
        return -1;
    struct fuse_buf b = { .mem = resume.init, .size = resume.init_len };
    process(se, &b);
    free(resume.init);
    resume.init = NULL;
    if (resume.resend && !resume.own_clones) {
        struct fuse_out_header oh = { .len = sizeof oh, .error = FUSE_NOTIFY_RESEND,
                                      .unique = 0 };
        resume.resent = write(fd, &oh, sizeof oh) == (ssize_t)sizeof oh ? 1 : -errno;
    }
    return 0;
}

/* The descriptor lane thread i reads: thread 0 the session's own (a dup), unless
 * own_clones; the others the supervisor's clones, or new ones. */
static int lane_fd(int fd, unsigned i)
{
    if (resume.own_clones)      /* the supervisor's clones for this daemon alone: 0.. */
        return i < resume.nclones ? fcntl(resume.clones[i], F_DUPFD_CLOEXEC, 3)
                                  : clone_dev(fd);
    if (i == 0)
        return fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (i - 1 < resume.nclones)
        return fcntl(resume.clones[i - 1], F_DUPFD_CLOEXEC, 3);
    return clone_dev(fd);
}

__attribute__((visibility("default")))
int fuse_session_fd(struct fuse_session *se)
{
    resolve_fallback();
    if (real_session_fd == NULL)
        return -1;
    if (lane.running)
        return lane.event_fd;
    int fd = real_session_fd(se);
    if (fd >= 0 && resume.init != NULL && resume_session(se, fd) != 0)
        return -1;              /* pyfuse3.init fails: no session without its INIT */
    if (!(lane.wanted || resume.own_clones) || fd < 0)
        return fd;              /* (own_clones: the lane reads even if C answers nothing) */
    /* Everything the lane needs is made here; if any of it fails, no lane: libfuse's fd
     * goes back to pyfuse3 and every request is handled in Python. */
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
    struct sigaction sa = { .sa_handler = on_stop_signal };
    sigemptyset(&sa.sa_mask);
    int sig_ok = sigaction(STOP_SIGNAL, &sa, NULL) == 0;
    size_t cap = kernel_max_request();
    unsigned want = lane.want_threads ? lane.want_threads : 1;
    if (want > MAX_LANE_THREADS)
        want = MAX_LANE_THREADS;
    /* More than one thread needs replies routed to clones: libfuse's writes go through
     * lane_io from now on (else one thread, on the session's descriptor). */
    if ((want > 1 || resume.own_clones)
        && (real_custom_io == NULL || real_custom_io(se, &lane_io, fd) != 0)) {
        want = 1;
        resume.own_clones = 0;  /* replies cannot be routed: thread 0 reads the session's */
    }
    unsigned made = 0;
    for (; made < want; made++) {
        struct worker *w = &lane.workers[made];
        /* thread 0: its own dup, so libfuse closing the session's at unmount can never
         * leave it reading a number the process has reused for another file */
        w->fd = lane_fd(fd, made);
        if (made == 0 && w->fd >= 0) {   /* blocking reads (the flag is the session's too:
                                            libfuse only writes to it now) */
            int fl = fcntl(w->fd, F_GETFL);
            if (fl >= 0 && (fl & O_NONBLOCK))
                (void)fcntl(w->fd, F_SETFL, fl & ~O_NONBLOCK);
        }
        w->buf = malloc(cap);
        w->index = made;
        if (w->fd < 0 || w->buf == NULL) {
            if (w->fd >= 0)
                close(w->fd);
            free(w->buf);
            w->fd = -1;
            w->buf = NULL;
            break;              /* fewer threads, or none */
        }
    }
    if (efd < 0 || !sig_ok || made == 0) {
        if (efd >= 0) close(efd);
        free_workers(made);
        return fd;
    }
    lane.event_fd = efd;
    lane.stopping = 0;
    lane.bufsize = cap;
    lane.eof = 0;
    lane.is_rt = 0;
    lane.is_niced = 0;
    unsigned started = 0;
    for (; started < made; started++)
        if (pthread_create(&lane.workers[started].thread, NULL, run_lane,
                           &lane.workers[started]) != 0)
            break;
    if (started == 0) {
        close(efd);
        free_workers(made);
        lane.event_fd = -1;
        return fd;
    }
    for (unsigned i = started; i < made; i++) {   /* could not start: never used */
        close(lane.workers[i].fd);
        free(lane.workers[i].buf);
        lane.workers[i].fd = -1;
        lane.workers[i].buf = NULL;
    }
    lane.nthreads = started;
    lane.running = 1;
    return efd;
}

/* Free every request still queued for pyfuse3; how many. */
static size_t drain_handed(void)
{
    pthread_mutex_lock(&lane.mu);
    struct handed *h = lane.head;
    lane.head = lane.tail = NULL;
    pthread_mutex_unlock(&lane.mu);
    size_t k = 0;
    for (; h; k++) {
        struct handed *n = h->next;
        free(h);
        h = n;
    }
    return k;
}

/* Stop every lane thread and wait for them (before the session is unmounted and libfuse
 * closes /dev/fuse).  Requests still queued for pyfuse3 are dropped: the unmount that
 * follows aborts them in the kernel. */
void pcrfs_shim_stop(void)
{
    if (!lane.running)
        return;
    __atomic_store_n(&lane.stopping, 1, __ATOMIC_RELEASE);
    for (unsigned i = 0; i < lane.nthreads; i++) {
        /* again every 10 ms: a signal that lands just before the read blocks is lost */
        for (;;) {
            pthread_kill(lane.workers[i].thread, STOP_SIGNAL);
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 10 * 1000 * 1000;
            if (t.tv_nsec >= 1000000000) {
                t.tv_sec++;
                t.tv_nsec -= 1000000000;
            }
            if (pthread_timedjoin_np(lane.workers[i].thread, NULL, &t) == 0)
                break;
        }
    }
    lane.running = 0;
    drain_handed();
    routes_clear();
    free_workers(lane.nthreads);
    lane.nthreads = 0;
    close(lane.event_fd);
    lane.event_fd = -1;
    pcrfs_cold_reset();
}

__attribute__((visibility("default")))
int fuse_session_receive_buf(struct fuse_session *se, struct fuse_buf *buf)
{
    if (!lane.running) {
        resolve_fallback();
        if (real_receive_buf == NULL)
            return -ENOSYS;
        int got = real_receive_buf(se, buf);
        if (got > 0 && buf->mem != NULL && !(buf->flags & FUSE_BUF_IS_FD))
            pcrfs_lane_rehandle(buf->mem, (size_t)got);
        return got;
    }
    uint64_t one;
    if (read(lane.event_fd, &one, sizeof one) != sizeof one)
        return -EINTR;          /* nothing handed over: pyfuse3 waits again */
    pthread_mutex_lock(&lane.mu);
    struct handed *h = lane.head;
    if (h) {
        lane.head = h->next;
        if (lane.head == NULL)
            lane.tail = NULL;
    }
    pthread_mutex_unlock(&lane.mu);
    if (h == NULL) {
        if (__atomic_load_n(&lane.eof, __ATOMIC_ACQUIRE)) {
            real_session_exit(se);
            return 0;           /* as libfuse does on ENODEV */
        }
        return -EINTR;
    }
    if (buf->mem == NULL) {     /* pyfuse3 keeps the buffer across calls and frees it */
        buf->mem = malloc(lane.bufsize);
        if (buf->mem == NULL) {
            const struct fuse_in_header *in = (const void *)h->data;
            int fd = route_take(in->unique);
            refuse_nomem(fd >= 0 ? fd : lane.workers[0].fd, h->data, h->len);
            free(h);
            return -EINTR;      /* pyfuse3 waits for the next request */
        }
    }
    memcpy(buf->mem, h->data, h->len);   /* h->len <= lane.bufsize: read() bounded it */
    buf->size = h->len;
    buf->flags = 0;
    buf->pos = 0;
    int n = (int)h->len;
    free(h);
    return n;
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

size_t pcrfs_lane_drain(void) { return lane.running ? 0 : drain_handed(); }

int pcrfs_shim_resolve(void *session_fd, void *receive_buf, void *session_exit,
                       void *custom_io)
{
    if (session_fd == NULL || receive_buf == NULL || session_exit == NULL
        || session_fd == (void *)fuse_session_fd || receive_buf == (void *)fuse_session_receive_buf)
        return -1;              /* would call itself */
    real_session_fd = (session_fd_fn)session_fd;
    real_receive_buf = (receive_buf_fn)receive_buf;
    real_session_exit = (session_exit_fn)session_exit;
    real_custom_io = (custom_io_fn)custom_io;   /* NULL (an older libfuse): one thread */
    return 0;
}

void pcrfs_shim_want(uint64_t lo, uint64_t hi)
{
    lane.lo = lo;
    lane.hi = hi;
    lane.wanted = lo < hi;
}

void pcrfs_shim_alias_tree(unsigned tree, int on)
{
    if (tree < 256)
        __atomic_store_n(&lane.alias[tree], (uint8_t)(on != 0), __ATOMIC_RELAXED);
}

void pcrfs_shim_want_threads(unsigned n) { lane.want_threads = n ? n : 1; }

unsigned pcrfs_shim_threads(void) { return lane.running ? lane.nthreads : 0; }

int pcrfs_shim_running(void) { return lane.running; }

void pcrfs_shim_want_realtime(unsigned n) { lane.want_rt = n; }

void pcrfs_shim_want_nice(int nice) { lane.want_nice = nice; }

unsigned pcrfs_shim_niced(void) { return __atomic_load_n(&lane.is_niced, __ATOMIC_RELAXED); }

void pcrfs_shim_want_skip_open(int on) { __atomic_store_n(&lane.skip_open, on, __ATOMIC_RELAXED); }

unsigned pcrfs_shim_realtime(void) { return __atomic_load_n(&lane.is_rt, __ATOMIC_RELAXED); }

void pcrfs_shim_trace(int fd) { __atomic_store_n(&lane.trace_fd, fd, __ATOMIC_RELAXED); }

void pcrfs_lane_served(uint64_t *bytes, uint64_t *files, size_t n)
{
    for (size_t i = 0; i < n && i < 256; i++) {
        bytes[i] = __atomic_load_n(&lane.read_bytes[i], __ATOMIC_RELAXED);
        files[i] = __atomic_load_n(&lane.read_files[i], __ATOMIC_RELAXED);
    }
}

void pcrfs_lane_cold_counts(uint64_t *out, size_t n)
{
    /* 7 x 256: files, bytes, record bytes pread, checksum failures, handed to Python,
     * pack bytes pread, pack items pread, by tree */
    uint64_t *c[] = { lane.cold_files, lane.cold_bytes, lane.cold_read, lane.cold_bad,
                      lane.cold_handed, lane.cold_pack, lane.cold_items };
    for (size_t i = 0; i < n && i < 7 * 256; i++)
        out[i] = __atomic_load_n(&c[i / 256][i % 256], __ATOMIC_RELAXED);
}

void pcrfs_shim_counts(uint64_t *out, size_t n)
{
    uint64_t bufsize = lane.bufsize, routed, fds[5];
    pthread_mutex_lock(&routes.mu);
    routed = routes.n_routed;
    pthread_mutex_unlock(&routes.mu);
    pcrfs_cold_fd_counts(fds, 5);
    uint64_t *c[] = { &lane.n_open, &lane.n_release, &lane.n_ioctl, &lane.n_handed,
                      &lane.n_nomem, &bufsize, &lane.n_cold_getattr, &routed, &fds[0],
                      &fds[1], &fds[2], &lane.n_cold_lookup, &fds[3], &fds[4] };
    for (size_t i = 0; i < n && i < sizeof c / sizeof *c; i++)
        out[i] = __atomic_load_n(c[i], __ATOMIC_RELAXED);
}
