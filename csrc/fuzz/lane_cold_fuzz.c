/* libFuzzer harness for the lane's cold path (make fuzz): a synthetic segment table and
 * record files, both from the input (lengths, offsets and checksums that may lie), then
 * READ and GETATTR requests through the lane's whole handling.  Checked: the table
 * checker never reads outside the blob; a READ the lane answers carries exactly the bytes
 * of an independent assembly whose every checksum holds (never a wrong byte), and one
 * whose assembly fails is handed over, not answered; GETATTR sizes agree; nothing reads or
 * writes outside its buffers (ASan/UBSan).  The q view, and (if the input says so) raw
 * packs with items that may lie, served to the raw and mix trees; and (if it says so)
 * names for LOOKUP, which may be empty or collide: a LOOKUP the lane answers names a slot
 * of that directory with exactly that name, at the table's size.  Mode byte odd: the
 * rest is a raw table blob.  Mode bit 1: a remote dataset's disk tier instead of record
 * files: entries per segment and per extent, made from the same record bytes, honest,
 * absent, flipped, torn or with a foreign head (the same oracle: an answer is the record's
 * bytes, checksums holding).  Mode bit 2: l3/ files from transcode-tier entries of sizes
 * and bytes from the input, honest, absent, damaged or of another length (an answer is
 * exactly the honest entry's bytes). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/fuse.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fuse_shim.h"
#include "lane_cold.h"

#define TREE 1          /* q3 */
#define K 3
#define RAW_TREE 2      /* raw/ */
#define MIX_TREE 3      /* mix/, JPEGs at MIX_K */
#define MIX_K 2
#define L3_TREE 4      /* l3/ */
#define LO ((uint64_t)1 << 56)
#define HI ((uint64_t)5 << 56)
#define MAXR 3
#define MAXG 6
#define MAXN 4
#define MAXREC 2048

static int out_fd = -1, dir_fd = -1, disk_fd = -1;
#define MAXENT (MAXR * MAXN * MAXG + MAXR * MAXG + MAXR * MAXN)
#define MAXL3 256
static uint8_t l3bytes[MAXR * MAXN][MAXL3];
static uint64_t l3size[MAXR * MAXN];
static uint64_t l3sum[MAXR * MAXN];     /* the build's sidecar checksums Python learnt */
static int l3_ok[MAXR * MAXN], l3_on;
static char entries[MAXENT][40];    /* disk-tier entries of this input, unlinked after */
static unsigned n_entries;
static uint8_t recbytes[MAXR][MAXREC], packbytes[MAXR][MAXREC];
static size_t reclen[MAXR], packlen[MAXR];
static uint64_t items[MAXR * MAXN * 3];
static uint8_t mix_raw[MAXR * MAXN];
static int raw_on;
static uint32_t ndir[MAXR * MAXN];
static uint64_t noff[MAXR * MAXN + 1];
static uint8_t nblob[MAXR * MAXN * 4 + 1];
#define DIR_BIT ((uint64_t)1 << 55)

/* len bytes of input into dst, then written to rNNNNNN.<suffix> in the harness's dir */
static size_t input_file(const uint8_t **p, const uint8_t *end, uint64_t r, const char *suffix,
                         uint8_t *dst);

static uint8_t next(const uint8_t **p, const uint8_t *end)
{
    return *p < end ? *(*p)++ : 0;
}

static size_t input_file(const uint8_t **p, const uint8_t *end, uint64_t r, const char *suffix,
                         uint8_t *dst)
{
    size_t len = next(p, end) * 8u;
    for (size_t j = 0; j < len; j++)
        dst[j] = next(p, end);
    char name[32];
    snprintf(name, sizeof name, "r%06llu.%s", (unsigned long long)r, suffix);
    int fd = openat(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, dst, len) != (ssize_t)len)
        abort();
    close(fd);
    return len;
}

/* A disk-tier entry of record r's bytes [off, off + len) (inside recbytes), named as
 * storage/diskcache.py names it; how (from the input): 0 honest, 1 a payload byte flipped,
 * 2 one byte short, 3 a foreign head. */
static void write_entry(const char *key, int kl, const uint8_t *data, uint64_t len,
                        uint64_t head_len, unsigned how)
{
    XXH128_hash_t h = XXH3_128bits(key, (size_t)kl);
    char *name = entries[n_entries++];
    snprintf(name, 40, "x%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    static uint8_t buf[24 + MAXREC];
    memcpy(buf, how == 3 ? "NOTPCRFS" : "PCRFSDC1", 8);
    uint64_t x = XXH3_64bits(data, len);
    memcpy(buf + 8, &head_len, 8);
    memcpy(buf + 16, &x, 8);
    memcpy(buf + 24, data, len);
    if (how == 1 && len)
        buf[24 + len / 2] ^= 0x20;
    size_t n = 24 + len - (how == 2);
    int fd = openat(disk_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, buf, n) != (ssize_t)n)
        abort();
    close(fd);
}

static void disk_entry(uint64_t r, uint64_t off, uint64_t len, unsigned how)
{
    char key[64];
    int kl = snprintf(key, sizeof key, "%llu:%llu:%llu", (unsigned long long)r,
                      (unsigned long long)off, (unsigned long long)len);
    write_entry(key, kl, recbytes[r] + off, len, len, how);
}

/* The reference: image (r, i) at fidelity K assembled from recbytes, or -1 if any
 * segment is outside the record or fails its checksum. */
static long reference(const uint8_t *blob, uint32_t g, uint64_t nrec, uint64_t n, uint64_t r,
                      uint64_t i, unsigned tree, uint8_t *out)
{
    const uint64_t *first = (const void *)(blob + 64);
    const uint64_t *goff = first + nrec + 1;
    const uint8_t *scans = (const uint8_t *)(goff + nrec * (g + 1));
    const uint32_t *seg = (const void *)(scans + ((n + 7) & ~7ull));
    uint64_t s = first[r] + i;
    if (s >= first[r + 1] || scans[s] == 0)
        return -2;              /* not in the table: handed over */
    if (tree == L3_TREE) {
        if (!l3_on || l3size[s] == 0)
            return -2;          /* not served: no size */
        if (!l3_ok[s])
            return -1;          /* no honest entry: never answered */
        memcpy(out, l3bytes[s], l3size[s]);
        return (long)l3size[s];
    }
    if (tree != TREE && !raw_on)
        return -2;
    if (tree == RAW_TREE || (tree == MIX_TREE && mix_raw[s])) {
        uint64_t off = items[3 * s], len = items[3 * s + 1];
        if (len == 0)
            return -2;          /* not in a pack: Python decodes it */
        if (off > packlen[r] || len > packlen[r] - off
            || XXH3_64bits(packbytes[r] + off, len) != items[3 * s + 2])
            return -1;
        memcpy(out, packbytes[r] + off, len);
        return (long)len;
    }
    unsigned kk = tree == MIX_TREE ? MIX_K : K;
    unsigned m = scans[s] < kk ? scans[s] : kk;
    uint64_t end = goff[r * (g + 1) + g];
    if (end > reclen[r])
        end = reclen[r];        /* a pread past the file's end fails: same as out of range */
    long w = 0;
    for (unsigned j = 0; j < m; j++) {
        const uint32_t *e = seg + (s * g + j) * 3;
        uint64_t off = goff[r * (g + 1) + j];
        if (off > end || e[0] > end - off || e[1] > end - off - e[0])
            return -1;
        off += e[0];
        if ((uint32_t)XXH3_64bits(recbytes[r] + off, e[1]) != e[2])
            return -1;
        memcpy(out + w, recbytes[r] + off, e[1]);
        w += e[1];
    }
    out[w++] = 0xFF;
    out[w++] = 0xD9;
    return w;
}

/* A LOOKUP of name (len bytes) in directory d of tree */
static void lookup_request(unsigned tree, uint64_t d, const uint8_t *name, size_t len,
                           uint8_t *req, size_t *n)
{
    struct fuse_in_header in = { .opcode = FUSE_LOOKUP, .unique = 7,
                                 .nodeid = (uint64_t)tree << 56 | DIR_BIT | d };
    in.len = (uint32_t)(sizeof in + len + 1);
    memcpy(req, &in, sizeof in);
    memcpy(req + sizeof in, name, len);
    req[sizeof in + len] = 0;
    *n = in.len;
}

/* The q view's size of slot s at kk */
static uint64_t q_size(const uint8_t *blob, uint32_t g, uint64_t nrec, uint64_t n, uint64_t s,
                       unsigned kk)
{
    const uint64_t *first = (const void *)(blob + 64);
    const uint8_t *scans = (const uint8_t *)(first + nrec + 1 + nrec * (g + 1));
    const uint32_t *seg = (const void *)(scans + ((n + 7) & ~7ull));
    uint64_t size = 2;
    for (unsigned j = 0; j < scans[s] && j < kk; j++)
        size += seg[(s * g + j) * 3 + 1];
    return size;
}

static void request(uint32_t opcode, uint64_t ino, uint64_t off, uint32_t size, uint8_t *req,
                    size_t *n)
{
    struct fuse_in_header in = { .opcode = opcode, .unique = 7, .nodeid = ino };
    size_t arg = opcode == FUSE_READ ? sizeof(struct fuse_read_in)
                                     : sizeof(struct fuse_getattr_in);
    in.len = (uint32_t)(sizeof in + arg);
    memset(req, 0, in.len);
    memcpy(req, &in, sizeof in);
    if (opcode == FUSE_READ) {
        struct fuse_read_in r = { .fh = ino, .offset = off, .size = size };
        memcpy(req + sizeof in, &r, sizeof r);
    }
    *n = in.len;
}

static long replied(uint8_t *body, size_t cap, int32_t *error)
{
    struct fuse_out_header out;
    off_t size = lseek(out_fd, 0, SEEK_END);
    if (size < (off_t)sizeof out || pread(out_fd, &out, sizeof out, 0) != sizeof out
        || out.unique != 7 || out.len != (uint64_t)size || size - sizeof out > cap)
        abort();
    *error = out.error;
    size_t got = (size_t)size - sizeof out;
    if (got && pread(out_fd, body, got, sizeof out) != (ssize_t)got)
        abort();
    return (long)got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (out_fd < 0) {
        out_fd = memfd_create("lane-replies", MFD_CLOEXEC);
        char dir[] = "/tmp/lane-cold-fuzz-XXXXXX";
        if (out_fd < 0 || mkdtemp(dir) == NULL)
            abort();
        dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0 || mkdirat(dir_fd, "disk", 0700) != 0)
            abort();
        disk_fd = openat(dir_fd, "disk", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (disk_fd < 0)
            abort();
        pcrfs_shim_want(LO, HI);
    }
    const uint8_t *p = data, *end = data + size;
    uint8_t mode = next(&p, end);
    uint32_t g32;
    uint64_t r64, n64;
    if (mode & 1) {             /* a raw blob, 8-aligned copy */
        size_t len = (size_t)(end - p);
        uint64_t *copy = malloc(len + 8);
        if (copy == NULL)
            return 0;
        memcpy(copy, p, len);
        pcrfs_segtab_check((const uint8_t *)copy, len, &g32, &r64, &n64);
        free(copy);
        return 0;
    }
    uint32_t g = 1 + next(&p, end) % MAXG;
    uint64_t nrec = 1 + next(&p, end) % MAXR;
    uint64_t count[MAXR], n = 0;
    for (uint64_t r = 0; r < nrec; r++)
        n += count[r] = next(&p, end) % (MAXN + 1);
    size_t len = 64 + 8 * (nrec + 1) + 8 * nrec * (g + 1) + ((n + 7) & ~7ull) + 12 * n * g;
    uint64_t *words = calloc(len / 8 + 1, 8);
    if (words == NULL)
        return 0;
    uint8_t *blob = (uint8_t *)words;
    memcpy(blob, "PCRFSSEG", 8);
    uint32_t version = PCRFS_SEGTAB_VERSION;
    memcpy(blob + 8, &version, 4);
    memcpy(blob + 12, &g, 4);
    memcpy(blob + 16, &nrec, 8);
    memcpy(blob + 24, &n, 8);
    uint64_t *first = (uint64_t *)(blob + 64);
    for (uint64_t r = 0; r < nrec; r++)
        first[r + 1] = first[r] + count[r];
    /* records first, so that honest segments can be made from their bytes */
    for (uint64_t r = 0; r < nrec; r++)
        reclen[r] = input_file(&p, end, r, "pcr", recbytes[r]);
    uint64_t *goff = first + nrec + 1;
    for (uint64_t r = 0; r < nrec; r++)
        for (uint32_t j = 0; j <= g; j++)   /* mostly inside the record, sometimes not */
            goff[r * (g + 1) + j] = (next(&p, end) * reclen[r]) / 200;
    uint8_t *scans = (uint8_t *)(goff + nrec * (g + 1));
    uint32_t *seg = (uint32_t *)(scans + ((n + 7) & ~7ull));
    for (uint64_t r = 0; r < nrec; r++)
        for (uint64_t s = first[r]; s < first[r + 1]; s++) {
            scans[s] = next(&p, end) % (g + 1);
            for (uint32_t j = 0; j < g; j++) {
                uint32_t *e = seg + (s * g + j) * 3;
                e[0] = next(&p, end);
                e[1] = next(&p, end);
                uint64_t off = goff[r * (g + 1) + j] + e[0];
                /* an honest checksum unless the input says otherwise */
                if (next(&p, end) & 1 || off + e[1] > reclen[r])
                    e[2] = (uint32_t)next(&p, end) << 8 | next(&p, end);
                else
                    e[2] = (uint32_t)XXH3_64bits(recbytes[r] + off, e[1]);
            }
        }
    int disk = mode & 2;
    n_entries = 0;
    if (disk) {                 /* entries of segments, then of extents (groups 1..kk) */
        for (uint64_t r = 0; r < nrec; r++)
            for (uint64_t s = first[r]; s < first[r + 1]; s++)
                for (uint32_t j = 0; j < g; j++) {
                    const uint32_t *e = seg + (s * g + j) * 3;
                    uint64_t off = goff[r * (g + 1) + j] + e[0];
                    uint8_t b = next(&p, end);
                    if (b & 1 && e[1] && off + e[1] <= reclen[r])
                        disk_entry(r, off, e[1], (b >> 1) % 4 * ((b >> 3) & 1));
                }
        for (uint64_t r = 0; r < nrec; r++) {
            uint8_t b = next(&p, end);
            uint64_t from = goff[r * (g + 1)], to = goff[r * (g + 1) + 1 + b % g];
            if (b & 0x80 && from <= to && to <= reclen[r])
                disk_entry(r, from, to - from, (b >> 4) % 4 * ((b >> 6) & 1));
        }
    }
    pcrfs_cold_reset();
    pcrfs_lane_configure(next(&p, end) & 1 ? 4096 : 0, 0, 0, 0, 4096, 1);
    int rc = disk ? pcrfs_cold_install_disk(blob, len, disk_fd)
                  : pcrfs_cold_install(blob, len, dir_fd, 1 + next(&p, end) % 3);
    if (rc != 0) {
        for (unsigned e = 0; e < n_entries; e++)
            unlinkat(disk_fd, entries[e], 0);
        free(words);
        return 0;
    }
    pcrfs_cold_view(TREE, K);
    raw_on = 0;
    if (!disk && next(&p, end) & 1) {   /* raw packs: items honest or lying, mix choices */
        memset(items, 0, sizeof items);
        for (uint64_t r = 0; r < nrec; r++) {
            packlen[r] = input_file(&p, end, r, "ppk", packbytes[r]);
            for (uint64_t s = first[r]; s < first[r + 1]; s++) {
                uint64_t *it = items + 3 * s;
                it[0] = (next(&p, end) * packlen[r]) / 200;
                it[1] = next(&p, end) * 4u;
                if (next(&p, end) & 1 || it[0] + it[1] > packlen[r])
                    it[2] = next(&p, end);
                else
                    it[2] = XXH3_64bits(packbytes[r] + it[0], it[1]);
                mix_raw[s] = next(&p, end) & 1;
            }
        }
        if (pcrfs_cold_install_raw(items, n, mix_raw, dir_fd, 1 + next(&p, end) % 2) != 0)
            abort();
        pcrfs_cold_kind(RAW_TREE, 2, 0);
        pcrfs_cold_kind(MIX_TREE, 3, MIX_K);
        raw_on = 1;
    }
    l3_on = 0;
    if (mode & 4) {             /* l3/: per slot a size, bytes, and an entry or none */
        for (uint64_t r = 0; r < nrec; r++)
            for (uint64_t s = first[r]; s < first[r + 1]; s++) {
                uint8_t b = next(&p, end);
                l3size[s] = b % 4 ? 1 + next(&p, end) % (MAXL3 - 1) : 0;
                for (uint64_t j = 0; j < l3size[s]; j++)
                    l3bytes[s][j] = next(&p, end);
                l3_ok[s] = 0;
                /* the sidecar's checksum: not learnt yet (the lane hands the file to
                 * Python), the image's, or another's (an entry replaced and re-sealed) */
                unsigned sidecar = (b >> 6) & 3;
                uint64_t mine = XXH3_64bits(l3bytes[s], (size_t)l3size[s]);
                l3sum[s] = sidecar == 0 ? 0 : sidecar == 3 ? mine ^ 1 : mine;
                if (!(b & 4) || l3size[s] == 0)
                    continue;
                unsigned how = (b >> 3) % 4;        /* honest, flipped, torn, foreign */
                int other = (b >> 5) & 1;           /* a head of another length */
                char key[32];
                int kl = snprintf(key, sizeof key, "l3:%llu",
                                  (unsigned long long)(r << 24 | (s - first[r])));
                write_entry(key, kl, l3bytes[s], l3size[s] - other, l3size[s] - other, how);
                l3_ok[s] = how == 0 && !other && (sidecar == 1 || sidecar == 2);
            }
        if (pcrfs_cold_install_l3(l3size, l3sum, n, disk_fd) != 0)
            abort();
        pcrfs_cold_kind(L3_TREE, 4, 0);
        l3_on = 1;
    }
    int names_on = 0, raw_names_on = 0;
    if (next(&p, end) & 1) {    /* names: a directory 0..2 or none, 0..4 letters of 3 */
        size_t w = 0;
        for (uint64_t s = 0; s < n; s++) {
            uint8_t b = next(&p, end);
            ndir[s] = b % 4 == 3 ? PCRFS_NO_DIR : b % 4;
            noff[s] = w;
            for (unsigned j = 0; j < (b >> 2) % 5; j++)
                nblob[w++] = (uint8_t)('a' + next(&p, end) % 3);
        }
        noff[n] = w;
        names_on = pcrfs_cold_install_names(1, ndir, noff, nblob, w, n) == 0;
        /* raw/'s names: the same ones here */
        raw_names_on = raw_on && names_on && pcrfs_cold_install_names(2, ndir, noff, nblob,
                                                                      w, n) == 0;
    }
    static uint8_t req[256], body[1 << 17], want[1 << 17];
    while (p < end) {
        unsigned tree = 1 + next(&p, end) % 4;
        uint64_t r = next(&p, end) % (nrec + 1), i = next(&p, end) % (MAXN + 1);
        uint64_t ino = (uint64_t)tree << 56 | r << 24 | i;
        uint8_t op = next(&p, end);
        int getattr = op & 1;
        if ((op & 6) == 6) {    /* LOOKUP in directory r of a name of 0..4 letters */
            uint8_t name[8];
            size_t len = i;
            for (size_t j = 0; j < len; j++)
                name[j] = (uint8_t)('a' + next(&p, end) % 3);
            size_t rn;
            lookup_request(tree, r, name, len, req, &rn);
            (void)!ftruncate(out_fd, 0);
            (void)!lseek(out_fd, 0, SEEK_SET);
            int answered = pcrfs_lane_process(out_fd, req, rn);
            pcrfs_lane_drain();
            if (answered != 1)
                continue;
            int32_t error;
            struct fuse_entry_out e;
            int named = tree == TREE ? names_on : tree == RAW_TREE ? raw_names_on
                                                                   : names_on || raw_names_on;
            if (!named || len == 0
                || replied((uint8_t *)&e, sizeof e, &error) != (long)sizeof e || error != 0
                || e.nodeid >> 56 != tree)
                abort();
            uint64_t o = e.nodeid & ((DIR_BIT << 1) - 1), er = o >> 24, ei = o & 0xFFFFFF;
            if (er >= nrec || ei >= count[er])
                abort();
            uint64_t s = first[er] + ei;
            /* mix/: the PPM (raw names) where mix_raw, else the JPEG at MIX_K (q names) */
            int ppm = tree == RAW_TREE || (tree == MIX_TREE && mix_raw[s]);
            uint64_t size = ppm ? items[3 * s + 1]
                                : q_size(blob, g, nrec, n, s, tree == MIX_TREE ? MIX_K : K);
            if (ndir[s] != r || noff[s + 1] - noff[s] != len
                || memcmp(nblob + noff[s], name, len) != 0 || scans[s] == 0
                || (tree == MIX_TREE && !(ppm ? raw_names_on : names_on))
                || e.attr.size != size || e.attr.ino != e.nodeid)
                abort();
            continue;
        }
        uint64_t off = next(&p, end);
        uint32_t sz = 1 + next(&p, end) * 4u;
        size_t rn;
        request(getattr ? FUSE_GETATTR : FUSE_READ, ino, off, sz, req, &rn);
        (void)!ftruncate(out_fd, 0);
        (void)!lseek(out_fd, 0, SEEK_SET);
        int answered = pcrfs_lane_process(out_fd, req, rn);
        pcrfs_lane_drain();
        long ref = r < nrec ? reference(blob, g, nrec, n, r, i, tree, want) : -2;
        int32_t error;
        if (answered != 1)
            continue;           /* handed over: always allowed, Python decides */
        long got = replied(body, sizeof body, &error);
        if (error != 0)
            abort();
        if (getattr) {
            if (ref == -2 || got != (long)sizeof(struct fuse_attr_out))
                abort();
            continue;
        }
        if (ref < 0)            /* a READ answered from damaged or unknown data */
            abort();
        long from = (long)off < ref ? (long)off : ref;
        long k = ref - from < (long)sz ? ref - from : (long)sz;
        if (got != k || memcmp(body, want + from, (size_t)k) != 0)
            abort();
    }
    pcrfs_cold_reset();
    pcrfs_lane_configure(0, 0, 0, 0, 4096, 1);   /* empties the store: the next input's
                                                    table may give these inodes new bytes */
    for (unsigned e = 0; e < n_entries; e++)
        unlinkat(disk_fd, entries[e], 0);
    free(words);
    return 0;
}
