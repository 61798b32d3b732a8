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
#include "lane_internal.h"
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

/* The lane's state (lane_internal.h), and a resumed session's (resume_session below). */
LANE_HIDDEN struct lane_state lane = { .event_fd = -1, .trace_fd = -1, .want_threads = 1,
                                       .mu = PTHREAD_MUTEX_INITIALIZER };
LANE_HIDDEN struct resume_state resume;
typedef int (*process_buf_fn)(struct fuse_session *, const struct fuse_buf *);

void lane_mutex_init_pi(pthread_mutex_t *mu)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
}

__attribute__((constructor)) static void init_lane_lock(void)
{
    lane_mutex_init_pi(&lane.mu);
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
    uint64_t bufsize = lane.bufsize, routed = routes_routed(), fds[5];
    pcrfs_cold_fd_counts(fds, 5);
    uint64_t *c[] = { &lane.n_open, &lane.n_release, &lane.n_ioctl, &lane.n_handed,
                      &lane.n_nomem, &bufsize, &lane.n_cold_getattr, &routed, &fds[0],
                      &fds[1], &fds[2], &lane.n_cold_lookup, &fds[3], &fds[4] };
    for (size_t i = 0; i < n && i < sizeof c / sizeof *c; i++)
        out[i] = __atomic_load_n(c[i], __ATOMIC_RELAXED);
}
