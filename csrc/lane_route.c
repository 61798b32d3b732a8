/* The fast lane's routing (lane_internal.h): a reply goes to the clone its request was
 * read on, and without FUSE_NOTIFY_RESEND the requests handed to Python are logged where
 * a supervisor finds them if this daemon dies. */
#define FUSE_USE_VERSION 35
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuse_shim.h"
#include "lane_internal.h"

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

LANE_HIDDEN int route_add(uint64_t unique, int fd)
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
LANE_HIDDEN int route_take(uint64_t unique)
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

LANE_HIDDEN void routes_clear(void)
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
LANE_HIDDEN void inflight_put(uint64_t unique, uint32_t lane_index)
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

LANE_HIDDEN void inflight_clear(uint64_t unique)
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

LANE_HIDDEN const struct fuse_custom_io lane_io = { .writev = io_writev, .read = io_read };

LANE_HIDDEN uint64_t routes_routed(void)
{
    pthread_mutex_lock(&routes.mu);
    uint64_t n = routes.n_routed;
    pthread_mutex_unlock(&routes.mu);
    return n;
}
