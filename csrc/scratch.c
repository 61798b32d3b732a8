/* Per-thread scratch for the fused decode-crop-resize (fused_internal.h).
 *
 * A call's big buffers (the decoded region, the resampler's rows, the entropy path's
 * tables and data) are a few hundred KB: fresh from malloc each time, glibc hands them out
 * as new mmap'd or trimmed-and-regrown pages, and faulting them in cost more than the
 * resize itself.  So each thread keeps its own, grown as needed; any above SCRATCH_KEEP is
 * given back when the call ends, so one huge image does not pin memory. */
#include <pthread.h>
#include <stdlib.h>

#include "fused_internal.h"

#define SCRATCH_KEEP ((size_t)16 << 20)
typedef struct {
    void *p[S_N];
    size_t cap[S_N];
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *v) {
    scratch *s = v;
    for (int i = 0; i < S_N; i++) free(s->p[i]);
    free(s);
}
static void scratch_init(void) {
    if (pthread_key_create(&scratch_key, scratch_free)) scratch_key = 0;
}
static scratch *scratch_get(void) {
    pthread_once(&scratch_once, scratch_init);
    scratch *s = pthread_getspecific(scratch_key);
    if (!s && (s = calloc(1, sizeof *s)) && pthread_setspecific(scratch_key, s)) {
        free(s);
        s = NULL;
    }
    return s;
}

void *pcr_scratch_take(int i, size_t n) {
    scratch *s = scratch_get();
    if (!s) return NULL;
    if (n > s->cap[i]) {
        free(s->p[i]);
        s->p[i] = malloc(n);
        s->cap[i] = s->p[i] ? n : 0;
    }
    return s->p[i];
}

void pcr_scratch_trim(void) {
    scratch *s = scratch_get();
    for (int i = 0; s && i < S_N; i++)
        if (s->cap[i] > SCRATCH_KEEP) {
            free(s->p[i]);
            s->p[i] = NULL;
            s->cap[i] = 0;
        }
}
