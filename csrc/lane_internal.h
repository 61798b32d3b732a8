/* The fast lane's parts and what they share (csrc/fuse_shim.c says what the lane is):
 *   fuse_shim.c     libfuse interposition, the lane's threads, its state and its API
 *   lane_answer.c   request handling: what the lane answers itself, what it hands over
 *   lane_store.c    the image store: assembled images Python handed over, LRU in bytes
 *   lane_route.c    replies to the clone a request was read on; the in-flight log a
 *                   supervisor reads
 *   lane_cold.c     cold reads from the records through the segment table (lane_cold.h)
 * Every name here is hidden: the shim is loaded into the global symbol scope, where only
 * the pcrfs_* API and libfuse's two interposed functions may appear. */
#ifndef PCRFS_LANE_INTERNAL_H
#define PCRFS_LANE_INTERNAL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <linux/fuse.h>
#include <fuse_lowlevel.h>

#define LANE_HIDDEN __attribute__((visibility("hidden")))

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

struct lane_state {
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
};
extern LANE_HIDDEN struct lane_state lane;
/* A priority-inheriting mutex (fuse_shim.c): a SCHED_FIFO lane waiting on a lock that a
 * Python worker holds lends that worker its priority instead of waiting behind the CPU
 * hogs that preempt it.  The lane's lock and the store's are both made so. */
LANE_HIDDEN void lane_mutex_init_pi(pthread_mutex_t *mu);

/* A session resumed under a supervisor: see resume_session in fuse_shim.c. */
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
struct resume_state {
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
};
extern LANE_HIDDEN struct resume_state resume;

static inline void bump(uint64_t *c) { __atomic_fetch_add(c, 1, __ATOMIC_RELAXED); }

/* lane_store.c */
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
struct store_state {
    struct img **bucket;
    struct img lru;             /* sentinel */
    size_t used, budget, count;
    pthread_mutex_t mu;
    struct fuse_attr tmpl;      /* what Python's getattr answers for a lane file */
    int configured;             /* tmpl is set: GETATTR may be answered here */
    int pinned;                 /* never evict (static): what comes in stays */
    uint64_t attr_valid;
    uint64_t n_read, n_getattr, n_evicted, n_kept, n_refused;
};
extern LANE_HIDDEN struct store_state store;
LANE_HIDDEN struct img *find(uint64_t ino);              /* these: caller holds store.mu */
LANE_HIDDEN void lru_unlink(struct img *e);
LANE_HIDDEN void lru_front(struct img *e);
LANE_HIDDEN void drop(struct img *e, struct img **garbage);
LANE_HIDDEN void free_all(struct img *garbage);
LANE_HIDDEN int store_fits(size_t len);
LANE_HIDDEN int store_insert(struct img *e);

/* lane_route.c */
LANE_HIDDEN int route_add(uint64_t unique, int fd);
LANE_HIDDEN int route_take(uint64_t unique);
LANE_HIDDEN void routes_clear(void);
LANE_HIDDEN uint64_t routes_routed(void);
LANE_HIDDEN void inflight_put(uint64_t unique, uint32_t lane_index);
LANE_HIDDEN void inflight_clear(uint64_t unique);
extern LANE_HIDDEN const struct fuse_custom_io lane_io;

/* lane_answer.c: 1 if answered here; else hand_over() queues it for pyfuse3 */
LANE_HIDDEN int answer(int fd, const unsigned char *buf, size_t n);
LANE_HIDDEN void hand_over(int fd, const unsigned char *buf, size_t n);
LANE_HIDDEN void refuse_nomem(int fd, const unsigned char *buf, size_t n);
#endif
