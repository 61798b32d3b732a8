/* pcrfs._fuseshim: the fast lane that answers warm-epoch requests in C (fuse_shim.c). */
#ifndef PCRFS_FUSE_SHIM_H
#define PCRFS_FUSE_SHIM_H
#include <stddef.h>
#include <stdint.h>

/* libfuse's real functions; custom_io may be NULL (then one lane thread) */
int pcrfs_shim_resolve(void *session_fd, void *receive_buf, void *session_exit,
                       void *custom_io);
void pcrfs_shim_want(uint64_t lo, uint64_t hi);
int pcrfs_shim_running(void);
/* stop the lane thread and join it; call before the session is unmounted */
void pcrfs_shim_stop(void);
/* --debug: a line per request the lane answers, written to fd (-1: off) */
void pcrfs_shim_trace(int fd);
/* files the lane served from its store (a READ at offset 0: the whole image, as Python
 * counts an assembly) and their bytes, by tree (inode >> 56), n <= 256 */
void pcrfs_lane_served(uint64_t *bytes, uint64_t *files, size_t n);
/* READs of this tree's files whose fh is a lane file's inode are served as that file (the
 * dynamic view: Python opens a file with the inode of the q-view file it reads) */
void pcrfs_shim_alias_tree(unsigned tree, int on);
/* lane threads (-o lane_threads): 1 on the session's descriptor, the rest on clones */
void pcrfs_shim_want_threads(unsigned n);
unsigned pcrfs_shim_threads(void);
/* run the first n lane threads SCHED_FIFO (asked before mounting; how many did) */
void pcrfs_shim_want_realtime(unsigned n);
unsigned pcrfs_shim_realtime(void);
/* the other lane threads' nice value (0: unchanged), and how many got it */
void pcrfs_shim_want_nice(int nice);
unsigned pcrfs_shim_niced(void);
/* -o skip_open: answer OPEN with ENOSYS (the kernel then sends no OPEN or RELEASE) and
 * give requests of unopened files (fh 0) the inode as handle; see fuse_shim.c */
void pcrfs_shim_want_skip_open(int on);
int pcrfs_lane_adopt(uint8_t *buf, size_t n);
/* What the lane does with a request read from /dev/fuse (exposed for the fuzz tests). */
#define PCRFS_LANE_HAND_OVER 0
#define PCRFS_LANE_OPEN 1
#define PCRFS_LANE_RELEASE 2
#define PCRFS_LANE_IOCTL 3
#define PCRFS_LANE_READ 4      /* answered only if the image store holds it */
#define PCRFS_LANE_GETATTR 5   /* likewise */
#define PCRFS_LANE_LOOKUP 6    /* answered only for a file the segment table names */
int pcrfs_lane_classify(const uint8_t *buf, size_t n, uint64_t lo, uint64_t hi);
/* one request through the lane's whole handling, replies to reply_fd (fuzzing; never
 * while the lane runs): 1 answered, 0 handed over, -1 refused; drain frees the queue */
int pcrfs_lane_process(int reply_fd, const uint8_t *buf, size_t n);
size_t pcrfs_lane_drain(void);
/* opens, releases, ioctls answered; requests handed to pyfuse3; requests answered ENOMEM;
 * the read buffer's size; GETATTRs answered from the segment table; replies routed to a
 * clone; record descriptors of the cold path open, opened, evicted; LOOKUPs answered from
 * the table's names */
void pcrfs_shim_counts(uint64_t *out, size_t n);
/* The image store (see fuse_shim.c): budget in bytes (0: none), the attributes Python
 * answers for a lane file, and what lets the lane answer READ and GETATTR itself. */
int pcrfs_lane_configure(uint64_t budget, uint32_t uid, uint32_t gid, int64_t mtime_ns,
                         uint32_t blksize, uint64_t attr_valid);
/* Static cache policy: a full store refuses what is offered instead of evicting. */
void pcrfs_lane_store_pin(int pinned);
int pcrfs_lane_keep(uint64_t ino, const uint8_t *data, size_t len);
/* bytes of ino from off (at most cap) copied to out, or -1 if not kept */
int64_t pcrfs_lane_copy(uint64_t ino, uint64_t off, uint8_t *out, size_t cap);
/* reads and getattrs answered, bytes kept, budget, images kept now, ever, evicted,
 * refused (full, or shrank) */
void pcrfs_lane_store_counts(uint64_t *out, size_t n);
/* cold READs from the records and packs, 7 x 256 by tree: files, bytes, record bytes
 * pread, checksum failures, handed to Python, pack bytes pread, pack items pread */
void pcrfs_lane_cold_counts(uint64_t *out, size_t n);
/* Serve a session a supervisor holds (pcrfs/fs/supervisor.py): init is the kernel's INIT
 * request it read at mount(2), processed by libfuse in pyfuse3.init(); replay: a later
 * daemon (its reply goes nowhere, and the kernel is asked to resend the requests in
 * flight); clones: descriptors lane threads 1.. read.  Call before pyfuse3.init(). */
int pcrfs_shim_resume(const uint8_t *init, size_t n, int replay, const int *clones,
                      unsigned nclones, int own_clones, uint64_t epoch, int inflight_fd);
/* a predecessor's handle for a file Python opened -> the request's inode | 1 << 55 */
int pcrfs_lane_rehandle(uint8_t *buf, size_t n);
/* 1: every lane thread reads a clone of this process (own_clones took effect) */
int pcrfs_shim_own_clones(void);
/* 1: the kernel took FUSE_NOTIFY_RESEND, -errno: it refused it, 0: not asked */
int pcrfs_shim_resent(void);
#endif
