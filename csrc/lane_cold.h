/* The lane's cold path (lane_cold.c): images of the q views assembled in C from record files,
 * through the segment table (docs/FORMAT.md, "Segment table"). */
#ifndef PCRFS_LANE_COLD_H
#define PCRFS_LANE_COLD_H
#include <stddef.h>
#include <stdint.h>

#define PCRFS_SEGTAB_VERSION 1
#define PCRFS_SEGTAB_HEADER 64

/* Validate a table blob: sizes consistent with its length, record starts monotone, scan
 * counts within G.  0 if usable (groups, records, images set), else a PCR_E_* code. */
int pcrfs_segtab_check(const uint8_t *blob, size_t len, uint32_t *groups, uint64_t *records,
                       uint64_t *images);

/* Serve cold reads from this table (the blob must stay mapped until pcrfs_cold_reset) and
 * the records in dir_fd (rNNNNNN.pcr, kept open in an LRU of at most max_fds).  Once. */
int pcrfs_cold_install(const uint8_t *blob, size_t len, int dir_fd, uint32_t max_fds);
/* Tree (inode >> 56) served at fidelity k from the table; k = 0: not served. */
void pcrfs_cold_view(unsigned tree, unsigned k);
unsigned pcrfs_cold_k(unsigned tree);
/* Drop the table and close every record descriptor (no lane thread may be running). */
void pcrfs_cold_reset(void);

/* Bytes of image `ordinal` (record << 24 | index) at fidelity k: -1 if the table does not
 * hold it. */
int64_t pcrfs_cold_size(uint64_t ordinal, unsigned k);
/* The image at fidelity k (segments 1..min(k, scans), every checksum verified, then EOI)
 * into dst; *read_bytes: bytes pread.  PCR_OK, PCR_E_SPACE, PCR_E_RANGE (table and record
 * disagree), PCR_E_CORRUPT (a checksum), PCR_E_IO, PCR_E_SHORT, or -EMFILE / -ENFILE when
 * no descriptor could be had (the caller hands the request to Python, which sheds its own). */
int pcrfs_cold_assemble(uint64_t ordinal, unsigned k, uint8_t *dst, size_t cap, size_t *out,
                        uint64_t *read_bytes);
/* descriptors open now, opens, evictions */
void pcrfs_cold_fd_counts(uint64_t *out, size_t n);
#endif
