/* The lane's cold path: a q-view image the lane's store does not hold, assembled in C.
 *
 * Before this, the first READ of every file went to Python: a trio wake-up, an index
 * lookup, a worker thread, the splice and the checksums, about 500 us of daemon CPU, on
 * one thread at a time.  Here a lane thread finds the image's segments in the segment
 * table (a flat, read-only array: no lock to look anything up), preads them from the
 * record through a descriptor LRU of its own, checks each segment's XXH3 and appends
 * EOI.  Anything it cannot do (a checksum that fails, a record it cannot open or read)
 * makes the caller hand the request to Python, which does it again the usual way and
 * answers EIO with its log line and counters: a wrong byte is never served.
 *
 * Table layout (docs/FORMAT.md, "Segment table"), all little-endian:
 *   64-byte header: "PCRFSSEG", u32 version, u32 G, u64 R, u64 N, zeros
 *   (R + 1) u64  first slot of record r (slot = first[r] + index in record); first[R] = N
 *   R (G + 1) u64  absolute offset of group g in record r; [G] = the record's size
 *   N u8 scan count of each slot (0: no image), padded to 8
 *   N G 3 u32  per slot and group: offset in group, length, checksum */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "lane_cold.h"
#include "pcr_native.h"

#define INDEX_BITS 24
#define FD_SHARDS 64

struct segtab {
    uint32_t groups;
    uint64_t records, images;
    const uint64_t *first;      /* R + 1 */
    const uint64_t *goff;       /* R (G + 1) */
    const uint8_t *scans;       /* N */
    const uint32_t *seg;        /* N G 3 */
};

struct rfd {
    int fd;                     /* -1: closed */
    uint32_t refs;              /* preads in flight through it */
    uint8_t recent;             /* second chance of the clock */
};

/* Descriptors of one kind of per-record file (records, raw packs), at most max open. */
struct fdcache {
    int dir_fd;
    const char *suffix;         /* "pcr", "ppk" */
    uint32_t max;
    uint64_t n;                 /* records */
    struct rfd *fds;
    uint64_t n_open, n_opens, n_evicted, hand;
};

/* Names of one view kind's files: per slot its directory's number and its name (the
 * arrays stay Python's), and an open-addressed hash of (directory, name) -> slot + 1;
 * published with ready. */
struct names {
    const uint32_t *dir;
    const uint64_t *off;
    const uint8_t *blob;
    uint32_t *bucket;
    uint64_t mask;
    int ready;
};

/* What a tree serves: a q view at k, the raw view, or the mix view at k. */
enum { KIND_NONE, KIND_Q, KIND_RAW, KIND_MIX, KIND_L3 };

static struct {
    struct segtab t;
    int ready;                  /* published with release: t is complete */
    struct fdcache rec, pack;
    const uint64_t *raw;        /* per slot: offset, length, XXH3-64 in its pack (length 0:
                                   not stored); published with raw_ready */
    const uint8_t *mix_raw;     /* per slot: 1 if the mix view serves it as PPM */
    int raw_ready;
    pthread_mutex_t mu[FD_SHARDS];
    uint8_t kind[256], k[256];
    /* A remote dataset's images come from its disk tier instead (rec.dir_fd is the tier's
     * directory): one entry file per segment, named as storage/diskcache.py names it. */
    int from_disk;
    uint64_t n_disk_hits, n_disk_misses;
    /* l3/ files whose transcode a view's disk tier holds (its directory l3_fd): per slot
     * the file's size (0: none); published with l3_ready.  l3_sum: per slot the XXH3-64
     * the build's sidecar records, written by Python once it has checked the image against
     * the sidecar in this mount (0: not yet; the file goes to Python).  An entry is served
     * only if its own checksum is that one: the tier is not trusted on its own word. */
    const uint64_t *l3_size;
    uint64_t *l3_sum;
    int l3_fd, l3_ready;
    /* LOOKUP by name: the q views' names (the source's) and raw/'s (foo.ppm) */
    struct names names[2];
} cold = { .rec = { .dir_fd = -1, .suffix = "pcr" }, .pack = { .dir_fd = -1, .suffix = "ppk" },
            .l3_fd = -1 };

__attribute__((constructor)) static void init_shards(void)
{
    for (int i = 0; i < FD_SHARDS; i++)
        pthread_mutex_init(&cold.mu[i], NULL);
}

static size_t pad8(uint64_t n) { return (size_t)((n + 7) & ~(uint64_t)7); }

int pcrfs_segtab_check(const uint8_t *blob, size_t len, uint32_t *groups, uint64_t *records,
                       uint64_t *images)
{
    if (blob == NULL || len < PCRFS_SEGTAB_HEADER || ((uintptr_t)blob & 7))
        return PCR_E_ARG;
    if (memcmp(blob, "PCRFSSEG", 8) != 0)
        return PCR_E_BAD_HEADER;
    uint32_t version, g;
    uint64_t r, n;
    memcpy(&version, blob + 8, 4);
    memcpy(&g, blob + 12, 4);
    memcpy(&r, blob + 16, 8);
    memcpy(&n, blob + 24, 8);
    if (version != PCRFS_SEGTAB_VERSION || g == 0 || g > 255 || r >= ((uint64_t)1 << 31)
        || n >= ((uint64_t)1 << 40))
        return PCR_E_BAD_HEADER;
    /* each term bounded above, so the sum cannot overflow 64 bits */
    uint64_t need = PCRFS_SEGTAB_HEADER + 8 * (r + 1) + 8 * r * (g + 1) + pad8(n)
                    + 12 * n * (uint64_t)g;
    if (need != len)
        return PCR_E_RANGE;
    const uint64_t *first = (const void *)(blob + PCRFS_SEGTAB_HEADER);
    const uint8_t *scans = blob + PCRFS_SEGTAB_HEADER + 8 * (r + 1) + 8 * r * (g + 1);
    uint64_t prev = 0;
    for (uint64_t i = 0; i <= r; i++) {
        if (first[i] < prev || first[i] > n)
            return PCR_E_RANGE;
        if (i && first[i] - first[i - 1] > ((uint64_t)1 << INDEX_BITS))
            return PCR_E_RANGE;
        prev = first[i];
    }
    if (first[0] != 0 || first[r] != n)
        return PCR_E_RANGE;
    for (uint64_t i = 0; i < n; i++)
        if (scans[i] > g)
            return PCR_E_RANGE;
    *groups = g;
    *records = r;
    *images = n;
    return PCR_OK;
}

/* A dataset is untrusted (docs/SECURITY.md): a record, pack or disk-tier entry is opened
 * only if it is a regular file and not a symlink, and never waited on (a FIFO would block
 * the lane thread for good).  -1 with errno set otherwise (ELOOP, or EINVAL: not regular). */
static int open_regular_at(int dir_fd, const char *name)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    int bad = fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (bad) {
        close(fd);
        errno = bad;
        return -1;
    }
    return fd;
}

static int fdcache_init(struct fdcache *c, int dir_fd, uint32_t max, uint64_t n)
{
    struct rfd *fds = malloc((n ? n : 1) * sizeof *fds);
    if (fds == NULL)
        return PCR_E_NOMEM;
    for (uint64_t i = 0; i < n; i++)
        fds[i] = (struct rfd){ .fd = -1 };
    c->fds = fds;
    c->n = n;
    c->dir_fd = dir_fd;
    c->max = max;
    c->n_open = c->hand = 0;
    return PCR_OK;
}

static void fdcache_free(struct fdcache *c)
{
    for (uint64_t i = 0; c->fds && i < c->n; i++)
        if (c->fds[i].fd >= 0)
            close(c->fds[i].fd);
    free(c->fds);
    c->fds = NULL;
    c->n = 0;
    c->dir_fd = -1;
}

int pcrfs_cold_install(const uint8_t *blob, size_t len, int dir_fd, uint32_t max_fds)
{
    if (__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE) || dir_fd < 0 || max_fds == 0)
        return PCR_E_ARG;
    struct segtab t;
    int rc = pcrfs_segtab_check(blob, len, &t.groups, &t.records, &t.images);
    if (rc)
        return rc;
    rc = fdcache_init(&cold.rec, dir_fd, max_fds, t.records);
    if (rc)
        return rc;
    t.first = (const void *)(blob + PCRFS_SEGTAB_HEADER);
    t.goff = t.first + t.records + 1;
    t.scans = (const uint8_t *)(t.goff + t.records * (t.groups + 1));
    t.seg = (const void *)(t.scans + pad8(t.images));
    cold.t = t;
    __atomic_store_n(&cold.ready, 1, __ATOMIC_RELEASE);
    return PCR_OK;
}

int pcrfs_cold_install_disk(const uint8_t *blob, size_t len, int dir_fd)
{
    if (__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE))
        return PCR_E_ARG;
    cold.from_disk = 1;         /* published with ready */
    int rc = pcrfs_cold_install(blob, len, dir_fd, 1);
    if (rc)
        cold.from_disk = 0;
    return rc;
}

int pcrfs_cold_install_l3(const uint64_t *sizes, uint64_t *sums, size_t n, int dir_fd)
{
    if (!__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE)
        || __atomic_load_n(&cold.l3_ready, __ATOMIC_ACQUIRE) || sizes == NULL || sums == NULL
        || n != cold.t.images || dir_fd < 0)
        return PCR_E_ARG;
    cold.l3_size = sizes;
    cold.l3_sum = sums;
    cold.l3_fd = dir_fd;
    __atomic_store_n(&cold.l3_ready, 1, __ATOMIC_RELEASE);
    return PCR_OK;
}

int pcrfs_cold_install_raw(const uint64_t *items, size_t n, const uint8_t *mix_raw,
                           int dir_fd, uint32_t max_fds)
{
    if (!__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE) || cold.from_disk
        || __atomic_load_n(&cold.raw_ready, __ATOMIC_ACQUIRE) || items == NULL
        || n != cold.t.images || dir_fd < 0 || max_fds == 0)
        return PCR_E_ARG;
    int rc = fdcache_init(&cold.pack, dir_fd, max_fds, cold.t.records);
    if (rc)
        return rc;
    cold.raw = items;
    cold.mix_raw = mix_raw;
    __atomic_store_n(&cold.raw_ready, 1, __ATOMIC_RELEASE);
    return PCR_OK;
}

static uint64_t name_hash(uint32_t dir, const uint8_t *name, size_t len)
{
    return XXH3_64bits_withSeed(name, len, dir);
}

/* The slot whose file is `name` in directory `dir`, or -1. */
static int64_t find_name(const struct names *t, uint32_t dir, const uint8_t *name, size_t len)
{
    for (uint64_t h = name_hash(dir, name, len);; h++) {
        uint32_t b = t->bucket[h & t->mask];
        if (b == 0)
            return -1;
        uint64_t s = b - 1;
        if (t->dir[s] == dir && t->off[s + 1] - t->off[s] == len
            && memcmp(t->blob + t->off[s], name, len) == 0)
            return (int64_t)s;
    }
}

/* which names a kind of tree looks up in: the q views the source's, raw/ its own */
static struct names *names_of(unsigned kind)
{
    return kind == KIND_Q ? &cold.names[0] : kind == KIND_RAW ? &cold.names[1] : NULL;
}

int pcrfs_cold_install_names(unsigned kind, const uint32_t *dir, const uint64_t *off,
                             const uint8_t *blob, size_t blob_len, size_t n)
{
    struct names *t = names_of(kind);
    if (t == NULL || !__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE)
        || __atomic_load_n(&t->ready, __ATOMIC_ACQUIRE) || dir == NULL || off == NULL
        || blob == NULL || n != cold.t.images || n >= UINT32_MAX / 2)
        return PCR_E_ARG;
    /* a name is 1..255 bytes inside the blob (the kernel sends no longer one) */
    if (off[0] != 0 || off[n] > blob_len)
        return PCR_E_RANGE;
    for (size_t s = 0; s < n; s++)
        if (off[s + 1] < off[s] || (dir[s] != PCRFS_NO_DIR && (off[s + 1] - off[s] == 0
                                                               || off[s + 1] - off[s] > 255)))
            return PCR_E_RANGE;
    uint64_t nb = 16;
    while (nb < 2 * (uint64_t)n)
        nb <<= 1;
    struct names h = { .dir = dir, .off = off, .blob = blob, .mask = nb - 1,
                       .bucket = calloc(nb, sizeof(uint32_t)) };
    if (h.bucket == NULL)
        return PCR_E_NOMEM;
    for (size_t s = 0; s < n; s++) {
        if (dir[s] == PCRFS_NO_DIR)
            continue;
        size_t len = (size_t)(off[s + 1] - off[s]);
        if (find_name(&h, dir[s], blob + off[s], len) >= 0) {  /* one name, two files */
            free(h.bucket);
            return PCR_E_RANGE;
        }
        uint64_t i = name_hash(dir[s], blob + off[s], len);
        while (h.bucket[i & h.mask])
            i++;
        h.bucket[i & h.mask] = (uint32_t)(s + 1);
    }
    *t = h;
    __atomic_store_n(&t->ready, 1, __ATOMIC_RELEASE);
    return PCR_OK;
}

/* The record of a slot: the last r with first[r] <= s. */
static uint64_t record_of(const struct segtab *t, uint64_t s)
{
    uint64_t lo = 0, hi = t->records;       /* first[lo] <= s < first[hi] */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (t->first[mid] <= s)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The slot named so in table t, or -1 (no such name, or t not installed). */
static int64_t named(const struct names *t, uint32_t dir, const uint8_t *name, size_t len)
{
    if (t == NULL || !__atomic_load_n(&t->ready, __ATOMIC_ACQUIRE))
        return -1;
    return find_name(t, dir, name, len);
}

int64_t pcrfs_cold_lookup(unsigned tree, uint64_t dir, const uint8_t *name, size_t len)
{
    if (tree >= 256 || dir >= PCRFS_NO_DIR || name == NULL || len == 0 || len > 255)
        return -1;
    unsigned kind = __atomic_load_n(&cold.kind[tree], __ATOMIC_ACQUIRE);
    int64_t s;
    if (kind == KIND_MIX) {
        /* a mix/ file has its PPM's name where mix/ serves the PPM, else the source's
         * (the renaming keeps the two apart: views/tree.py format_names) */
        if (!__atomic_load_n(&cold.raw_ready, __ATOMIC_ACQUIRE) || cold.mix_raw == NULL)
            return -1;
        s = named(&cold.names[1], (uint32_t)dir, name, len);
        if (s >= 0 && !cold.mix_raw[s])
            s = -1;
        if (s < 0) {
            s = named(&cold.names[0], (uint32_t)dir, name, len);
            if (s >= 0 && cold.mix_raw[s])
                s = -1;
        }
    } else {
        s = named(names_of(kind), (uint32_t)dir, name, len);
    }
    if (s < 0)
        return -1;
    uint64_t r = record_of(&cold.t, (uint64_t)s);
    return (int64_t)(r << INDEX_BITS | ((uint64_t)s - cold.t.first[r]));
}

uint64_t pcrfs_cold_names_bytes(void)
{
    uint64_t n = 0;
    for (int i = 0; i < 2; i++)
        if (__atomic_load_n(&cold.names[i].ready, __ATOMIC_ACQUIRE))
            n += (cold.names[i].mask + 1) * sizeof(uint32_t);
    return n;
}

void pcrfs_cold_view(unsigned tree, unsigned k)
{
    pcrfs_cold_kind(tree, k ? KIND_Q : KIND_NONE, k);
}

void pcrfs_cold_kind(unsigned tree, unsigned kind, unsigned k)
{
    if (tree < 256 && kind <= KIND_L3) {
        __atomic_store_n(&cold.k[tree], (uint8_t)(k > 255 ? 255 : k), __ATOMIC_RELAXED);
        __atomic_store_n(&cold.kind[tree], (uint8_t)kind, __ATOMIC_RELEASE);
    }
}

int pcrfs_cold_serves(unsigned tree)
{
    return tree < 256 && __atomic_load_n(&cold.kind[tree], __ATOMIC_ACQUIRE) != KIND_NONE;
}

void pcrfs_cold_reset(void)
{
    memset(cold.kind, 0, sizeof cold.kind);
    memset(cold.k, 0, sizeof cold.k);
    for (int i = 0; i < 2; i++)
        if (__atomic_load_n(&cold.names[i].ready, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&cold.names[i].ready, 0, __ATOMIC_RELEASE);
            free(cold.names[i].bucket);
            cold.names[i] = (struct names){ 0 };
        }
    if (__atomic_load_n(&cold.l3_ready, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&cold.l3_ready, 0, __ATOMIC_RELEASE);
        cold.l3_size = NULL;
        cold.l3_sum = NULL;
        cold.l3_fd = -1;
    }
    if (__atomic_load_n(&cold.raw_ready, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&cold.raw_ready, 0, __ATOMIC_RELEASE);
        fdcache_free(&cold.pack);
        cold.raw = NULL;
        cold.mix_raw = NULL;
    }
    if (!__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE))
        return;
    __atomic_store_n(&cold.ready, 0, __ATOMIC_RELEASE);
    fdcache_free(&cold.rec);
    cold.from_disk = 0;
}

/* The slot of an ordinal, or -1 if the table has no image there. */
static int64_t slot_of(const struct segtab *t, uint64_t ordinal)
{
    uint64_t r = ordinal >> INDEX_BITS, i = ordinal & (((uint64_t)1 << INDEX_BITS) - 1);
    if (r >= t->records || i >= t->first[r + 1] - t->first[r])
        return -1;
    uint64_t s = t->first[r] + i;
    return t->scans[s] ? (int64_t)s : -1;
}

/* What tree serves of a slot: its JPEG at *k (returns 0), its PPM from the pack
 * (returns 1), or nothing here (-1). */
static int what(unsigned tree, uint64_t slot, unsigned *k)
{
    unsigned kind = __atomic_load_n(&cold.kind[tree], __ATOMIC_ACQUIRE);
    *k = __atomic_load_n(&cold.k[tree], __ATOMIC_RELAXED);
    int raw = __atomic_load_n(&cold.raw_ready, __ATOMIC_ACQUIRE);
    switch (kind) {
    case KIND_Q:
        return *k ? 0 : -1;
    case KIND_RAW:
        return raw && cold.raw[3 * slot + 1] ? 1 : -1;
    case KIND_MIX:
        if (!raw || cold.mix_raw == NULL)
            return -1;
        if (!cold.mix_raw[slot])
            return *k ? 0 : -1;
        return cold.raw[3 * slot + 1] ? 1 : -1;   /* not stored: decoded by Python */
    case KIND_L3:
        return __atomic_load_n(&cold.l3_ready, __ATOMIC_ACQUIRE) && cold.l3_size[slot] ? 2 : -1;
    }
    return -1;
}

int64_t pcrfs_cold_size(unsigned tree, uint64_t ordinal)
{
    if (tree >= 256 || !__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE))
        return -1;
    const struct segtab *t = &cold.t;
    int64_t s = slot_of(t, ordinal);
    unsigned k;
    int w = s < 0 ? -1 : what(tree, (uint64_t)s, &k);
    if (w < 0)
        return -1;
    if (w == 1)
        return cold.raw[3 * s + 1] > INT64_MAX ? -1 : (int64_t)cold.raw[3 * s + 1];
    if (w == 2)
        return cold.l3_size[s] > INT64_MAX ? -1 : (int64_t)cold.l3_size[s];
    unsigned n = t->scans[s] < k ? t->scans[s] : k;
    const uint32_t *seg = t->seg + (uint64_t)s * t->groups * 3;
    uint64_t size = 2;
    for (unsigned g = 0; g < n; g++)
        size += seg[3 * g + 1];
    return (int64_t)size;
}

/* Close one idle descriptor, by the clock (second chance for recently used ones). */
static void evict_one(struct fdcache *c)
{
    uint64_t r = c->n;
    for (uint64_t step = 0; step < 2 * r + 1; step++) {
        uint64_t i = __atomic_fetch_add(&c->hand, 1, __ATOMIC_RELAXED) % r;
        pthread_mutex_t *mu = &cold.mu[i % FD_SHARDS];
        pthread_mutex_lock(mu);
        struct rfd *e = &c->fds[i];
        int fd = -1;
        if (e->fd >= 0 && e->refs == 0) {
            if (e->recent) {
                e->recent = 0;
            } else {
                fd = e->fd;
                e->fd = -1;
            }
        }
        pthread_mutex_unlock(mu);
        if (fd >= 0) {
            close(fd);
            __atomic_fetch_sub(&c->n_open, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&c->n_evicted, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

/* Close every idle descriptor (an open failed with EMFILE or ENFILE). */
static void evict_idle(struct fdcache *c)
{
    for (uint64_t i = 0; i < c->n; i++) {
        pthread_mutex_t *mu = &cold.mu[i % FD_SHARDS];
        pthread_mutex_lock(mu);
        int fd = -1;
        if (c->fds[i].fd >= 0 && c->fds[i].refs == 0) {
            fd = c->fds[i].fd;
            c->fds[i].fd = -1;
        }
        pthread_mutex_unlock(mu);
        if (fd >= 0) {
            close(fd);
            __atomic_fetch_sub(&c->n_open, 1, __ATOMIC_RELAXED);
        }
    }
}

/* A descriptor of record r's file with a reference held, or -errno. */
static int acquire(struct fdcache *c, uint64_t r)
{
    pthread_mutex_t *mu = &cold.mu[r % FD_SHARDS];
    struct rfd *e = &c->fds[r];
    pthread_mutex_lock(mu);
    if (e->fd >= 0) {
        e->refs++;
        e->recent = 1;
        int fd = e->fd;
        pthread_mutex_unlock(mu);
        return fd;
    }
    pthread_mutex_unlock(mu);
    if (__atomic_load_n(&c->n_open, __ATOMIC_RELAXED) >= c->max)
        evict_one(c);
    char name[40];
    snprintf(name, sizeof name, "r%06llu.%s", (unsigned long long)r, c->suffix);
    int fd = open_regular_at(c->dir_fd, name);
    if (fd == -1 && (errno == EMFILE || errno == ENFILE)) {
        evict_idle(&cold.rec);
        evict_idle(&cold.pack);
        fd = open_regular_at(c->dir_fd, name);
    }
    if (fd < 0)
        return -errno;
    __atomic_fetch_add(&c->n_opens, 1, __ATOMIC_RELAXED);
    int spare = -1;
    pthread_mutex_lock(mu);
    if (e->fd >= 0) {           /* another thread opened it meanwhile: share theirs */
        spare = fd;
        fd = e->fd;
    } else {
        e->fd = fd;
        __atomic_fetch_add(&c->n_open, 1, __ATOMIC_RELAXED);
    }
    e->refs++;
    e->recent = 1;
    pthread_mutex_unlock(mu);
    if (spare >= 0)
        close(spare);
    return fd;
}

static void release(struct fdcache *c, uint64_t r)
{
    pthread_mutex_t *mu = &cold.mu[r % FD_SHARDS];
    pthread_mutex_lock(mu);
    c->fds[r].refs--;
    pthread_mutex_unlock(mu);
}

/* len bytes at off of fd into dst: PCR_OK, PCR_E_IO or PCR_E_SHORT. */
static int pread_all(int fd, uint8_t *dst, uint64_t len, uint64_t off)
{
    uint64_t done = 0;
    while (done < len) {
        ssize_t got = pread(fd, dst + done, (size_t)(len - done), (off_t)(off + done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return PCR_E_IO;
        }
        if (got == 0)
            return PCR_E_SHORT;
        done += (uint64_t)got;
    }
    return PCR_OK;
}

/* The PPM item of slot s from record r's pack, its XXH3-64 checked. */
static int raw_item(uint64_t r, uint64_t s, uint8_t *dst, size_t cap, size_t *out,
                    uint64_t *pack_bytes)
{
    uint64_t off = cold.raw[3 * s], len = cold.raw[3 * s + 1], xxh = cold.raw[3 * s + 2];
    if (len > cap)
        return PCR_E_SPACE;
    if (off > (uint64_t)INT64_MAX - len)
        return PCR_E_RANGE;
    int fd = acquire(&cold.pack, r);
    if (fd < 0)
        return fd;
    int rc = pread_all(fd, dst, len, off);
    release(&cold.pack, r);
    if (rc != PCR_OK)
        return rc;
    *pack_bytes += len;
    if (XXH3_64bits(dst, (size_t)len) != xxh)
        return PCR_E_CORRUPT;
    *out = (size_t)len;
    return PCR_OK;
}

/* The disk-tier entry of bytes [off, off + len) of record r, open, its head checked
 * against len and the file's size: the entry's name is XXH3-128 of "r:off:len" in hex
 * after an "x" (storage/diskcache.py), its body a 24-byte head ("PCRFSDC1", u64 length,
 * u64 XXH3-64 of the payload) and the payload.  *want: the head's checksum.  A descriptor,
 * PCR_E_ARG (the tier does not hold it), PCR_E_CORRUPT (torn or not an entry), PCR_E_IO,
 * or -EMFILE / -ENFILE. */
#define DISK_HEAD 24
static int entry_open(int dir_fd, const char *key, int kl, uint64_t len, uint64_t *want)
{
    char name[40];
    XXH128_hash_t h = XXH3_128bits(key, (size_t)kl);
    snprintf(name, sizeof name, "x%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    int fd = open_regular_at(dir_fd, name);
    if (fd == -1 && (errno == EMFILE || errno == ENFILE)) {
        evict_idle(&cold.rec);
        evict_idle(&cold.pack);
        fd = open_regular_at(dir_fd, name);
    }
    if (fd < 0)
        return errno == EMFILE || errno == ENFILE ? -errno : PCR_E_ARG;
    uint8_t head[DISK_HEAD];
    struct stat st;
    int rc = pread_all(fd, head, sizeof head, 0);
    if (rc == PCR_OK && fstat(fd, &st) != 0)
        rc = PCR_E_IO;
    uint64_t n;
    memcpy(&n, head + 8, 8);
    memcpy(want, head + 16, 8);
    if (rc == PCR_E_SHORT || (rc == PCR_OK && (memcmp(head, "PCRFSDC1", 8) != 0 || n != len
                                               || (uint64_t)st.st_size != DISK_HEAD + len)))
        rc = PCR_E_CORRUPT;
    if (rc != PCR_OK) {
        close(fd);
        return rc;
    }
    return fd;
}

/* The entry of record bytes [off, off + len) of record r: key "r:off:len". */
static int disk_open(uint64_t r, uint64_t off, uint64_t len, uint64_t *want)
{
    char key[64];
    int kl = snprintf(key, sizeof key, "%llu:%llu:%llu", (unsigned long long)r,
                      (unsigned long long)off, (unsigned long long)len);
    return entry_open(cold.rec.dir_fd, key, kl, len, want);
}

/* The l3/ file of image `ordinal` (slot s) from the transcode tier (key "l3:ordinal"),
 * served only if its entry's XXH3-64 is the sidecar's (l3_sum) and its bytes match it;
 * PCR_E_ARG (to Python) while this mount has not checked the image's sidecar yet. */
static int l3_file(uint64_t ordinal, uint64_t s, uint8_t *dst, size_t cap, size_t *out)
{
    uint64_t len = cold.l3_size[s], want;
    uint64_t expect = __atomic_load_n(&cold.l3_sum[s], __ATOMIC_ACQUIRE);
    if (expect == 0)
        return PCR_E_ARG;
    if (len > cap)
        return PCR_E_SPACE;
    char key[32];
    int kl = snprintf(key, sizeof key, "l3:%llu", (unsigned long long)ordinal);
    int fd = entry_open(cold.l3_fd, key, kl, len, &want);
    if (fd < 0)
        return fd;
    int rc = pread_all(fd, dst, len, DISK_HEAD);
    close(fd);
    if (rc == PCR_OK && (want != expect || XXH3_64bits(dst, len) != want))
        rc = PCR_E_CORRUPT;
    if (rc == PCR_OK)
        *out = (size_t)len;
    return rc;
}

/* Segment [off, off + len) of record r from its own entry into dst, the entry's checksum
 * and the table's (sum) both checked. */
static int disk_segment(uint64_t r, uint64_t off, uint32_t len, uint32_t sum, uint8_t *dst)
{
    uint64_t want;
    int fd = disk_open(r, off, len, &want);
    if (fd < 0)
        return fd;
    int rc = pread_all(fd, dst, len, DISK_HEAD);
    close(fd);
    if (rc == PCR_OK) {
        uint64_t x = XXH3_64bits(dst, len);
        rc = x == want && (uint32_t)x == sum ? PCR_OK : PCR_E_CORRUPT;
    }
    return rc;
}

/* An entry holding groups 1..kk (kk >= n) of record r, which an in-order reader fetched
 * whole: a descriptor (its segments are read by offset, each checked against the table,
 * as Python reads them), or PCR_E_ARG if the tier holds none. */
static int disk_extent(uint64_t r, const uint64_t *goff, unsigned n)
{
    uint64_t want, prev = UINT64_MAX;
    for (unsigned kk = n ? n : 1; kk <= cold.t.groups; kk++) {
        uint64_t len = goff[kk] - goff[0];
        if (goff[kk] < goff[0] || len == prev)   /* (past a record's groups: the same) */
            continue;
        prev = len;
        int fd = disk_open(r, goff[0], len, &want);
        if (fd != PCR_E_ARG)
            return fd;
    }
    return PCR_E_ARG;
}

int pcrfs_cold_assemble(unsigned tree, uint64_t ordinal, uint8_t *dst, size_t cap,
                        size_t *out, uint64_t *read_bytes, uint64_t *pack_bytes)
{
    if (dst == NULL || out == NULL || read_bytes == NULL || pack_bytes == NULL)
        return PCR_E_ARG;
    *out = 0;
    *read_bytes = *pack_bytes = 0;
    if (tree >= 256 || !__atomic_load_n(&cold.ready, __ATOMIC_ACQUIRE))
        return PCR_E_ARG;
    const struct segtab *t = &cold.t;
    int64_t s = slot_of(t, ordinal);
    unsigned k;
    int w = s < 0 ? -1 : what(tree, (uint64_t)s, &k);
    if (w < 0)
        return PCR_E_ARG;
    uint64_t r = ordinal >> INDEX_BITS;
    if (w == 1)
        return raw_item(r, (uint64_t)s, dst, cap, out, pack_bytes);
    if (w == 2)
        return l3_file(ordinal, (uint64_t)s, dst, cap, out);
    unsigned n = t->scans[s] < k ? t->scans[s] : k;
    const uint32_t *seg = t->seg + (uint64_t)s * t->groups * 3;
    const uint64_t *goff = t->goff + r * (t->groups + 1);
    uint64_t end = goff[t->groups];
    uint64_t size = 2;
    for (unsigned g = 0; g < n; g++)
        size += seg[3 * g + 1];
    if (size > cap)
        return PCR_E_SPACE;
    /* the source: the record; or a remote dataset's disk tier, an entry per segment, else
     * an entry of the record's groups 1..kk (base: where its payload starts in the record) */
    int disk = cold.from_disk, fd = disk ? -1 : acquire(&cold.rec, r);
    if (fd < 0 && !disk)
        return fd;
    uint64_t base = 0, skip = 0;
    int rc = PCR_OK;
    size_t w_at = 0;
    for (unsigned g = 0; g < n && rc == PCR_OK; g++) {
        uint64_t off = goff[g], len = seg[3 * g + 1];
        /* the table's numbers are checked against the record's size, never trusted */
        if (off > end || seg[3 * g] > end - off || len > end - off - seg[3 * g]) {
            rc = PCR_E_RANGE;
            break;
        }
        int checked = 0;
        if (disk && fd < 0 && len) {
            rc = disk_segment(r, off + seg[3 * g], (uint32_t)len, seg[3 * g + 2], dst + w_at);
            checked = 1;
            if (rc == PCR_E_ARG && w_at == 0) {     /* no entry of its own: an extent? */
                fd = disk_extent(r, goff, n);
                rc = fd >= 0 ? PCR_OK : fd;
                base = goff[0];
                skip = DISK_HEAD;
                checked = 0;
            }
            if (rc != PCR_OK)
                break;
        }
        if (fd >= 0)
            rc = pread_all(fd, dst + w_at, len, off + seg[3 * g] - base + skip);
        if (rc != PCR_OK)
            break;
        *read_bytes += len;
        if (!checked && (uint32_t)XXH3_64bits(dst + w_at, (size_t)len) != seg[3 * g + 2])
            rc = PCR_E_CORRUPT;
        w_at += (size_t)len;
    }
    if (!disk)
        release(&cold.rec, r);
    else if (fd >= 0)
        close(fd);
    if (disk)
        __atomic_fetch_add(rc == PCR_OK ? &cold.n_disk_hits : &cold.n_disk_misses,
                           rc == PCR_OK || rc == PCR_E_ARG, __ATOMIC_RELAXED);
    if (rc != PCR_OK)
        return rc;
    dst[w_at++] = 0xFF;
    dst[w_at++] = 0xD9;
    *out = w_at;
    return PCR_OK;
}

void pcrfs_cold_fd_counts(uint64_t *out, size_t n)
{
    uint64_t v[] = { __atomic_load_n(&cold.rec.n_open, __ATOMIC_RELAXED)
                         + __atomic_load_n(&cold.pack.n_open, __ATOMIC_RELAXED),
                     __atomic_load_n(&cold.rec.n_opens, __ATOMIC_RELAXED)
                         + __atomic_load_n(&cold.pack.n_opens, __ATOMIC_RELAXED),
                     __atomic_load_n(&cold.rec.n_evicted, __ATOMIC_RELAXED)
                         + __atomic_load_n(&cold.pack.n_evicted, __ATOMIC_RELAXED),
                     __atomic_load_n(&cold.n_disk_hits, __ATOMIC_RELAXED),
                     __atomic_load_n(&cold.n_disk_misses, __ATOMIC_RELAXED) };
    for (size_t i = 0; i < n && i < sizeof v / sizeof *v; i++)
        out[i] = v[i];
}
