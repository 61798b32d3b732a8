/* The fast lane's image store (lane_internal.h). */
#define FUSE_USE_VERSION 35
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuse_shim.h"
#include "lane_internal.h"
#include <sys/stat.h>

LANE_HIDDEN struct store_state store = { .mu = PTHREAD_MUTEX_INITIALIZER };


static struct img **slot(uint64_t ino)
{
    uint64_t h = ino * 0x9E3779B97F4A7C15ull;
    return &store.bucket[(h >> 40) & (STORE_BUCKETS - 1)];
}

LANE_HIDDEN void lru_unlink(struct img *e) { e->prev->next = e->next; e->next->prev = e->prev; }

LANE_HIDDEN void lru_front(struct img *e)
{
    e->next = store.lru.next;
    e->prev = &store.lru;
    store.lru.next->prev = e;
    store.lru.next = e;
}

/* caller holds store.mu */
LANE_HIDDEN struct img *find(uint64_t ino)
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
LANE_HIDDEN void drop(struct img *e, struct img **garbage)
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

LANE_HIDDEN void free_all(struct img *garbage)
{
    while (garbage) {
        struct img *n = garbage->hnext;
        free(garbage);
        garbage = n;
    }
}

__attribute__((constructor)) static void init_store_lock(void)
{
    lane_mutex_init_pi(&store.mu);
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

LANE_HIDDEN int store_fits(size_t len)
{
    pthread_mutex_lock(&store.mu);
    int fits = store.bucket != NULL && len <= store.budget;
    pthread_mutex_unlock(&store.mu);
    return fits;
}

/* Put e (e->ino, e->len and data set) in the store: 0, or -1 and the caller frees it. */
LANE_HIDDEN int store_insert(struct img *e)
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

