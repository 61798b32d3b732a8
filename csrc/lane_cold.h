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
/* The same for a remote dataset: its images come from what its disk tier holds in dir_fd
 * (storage/diskcache.py's entries: one per segment, or one of a record's groups 1..kk); an
 * image with a segment the tier lacks is not served here (Python fetches it).  No raw
 * packs then.  Once. */
int pcrfs_cold_install_disk(const uint8_t *blob, size_t len, int dir_fd);
/* Raw PPMs of the raw and mix views from the packs in dir_fd (rNNNNNN.ppk): items, per
 * slot of the segment table (n of them), offset, length and XXH3-64 in the record's pack,
 * length 0 where the pack does not hold it; mix_raw, per slot, 1 where mix/ serves the PPM
 * (NULL: no mix view).  Both must stay mapped until pcrfs_cold_reset.  Once, after
 * pcrfs_cold_install. */
int pcrfs_cold_install_raw(const uint64_t *items, size_t n, const uint8_t *mix_raw,
                           int dir_fd, uint32_t max_fds);
/* l3/ files from a view's transcode tier in dir_fd (storage/diskcache.py's entries, key
 * "l3:<ordinal>"): per slot of the table (n), the file's size (0: not served here).  The
 * array must stay mapped until pcrfs_cold_reset.  Once, after pcrfs_cold_install. */
int pcrfs_cold_install_l3(const uint64_t *sizes, uint64_t *sums, size_t n, int dir_fd);
/* LOOKUP by name, for the trees of one kind (1: the q views, whose files have the source's
 * names; 2: raw/): per slot of the table (n), the number of its file's directory
 * (PCRFS_NO_DIR: no name) and its name, bytes [off[s], off[s + 1]) of blob.  The arrays
 * must stay mapped until pcrfs_cold_reset.  PCR_E_RANGE if a name is empty, over 255
 * bytes, outside the blob, or two files of one directory share it.  Once per kind, after
 * pcrfs_cold_install. */
#define PCRFS_NO_DIR 0xFFFFFFFFu
int pcrfs_cold_install_names(unsigned kind, const uint32_t *dir, const uint64_t *off,
                             const uint8_t *blob, size_t blob_len, size_t n);
/* The ordinal of file `name` in directory number `dir` of tree, or -1 (not a file of that
 * directory, a tree of another kind, no names installed).  A mix tree looks in both: the
 * raw names where mix/ serves the PPM, the q names elsewhere. */
int64_t pcrfs_cold_lookup(unsigned tree, uint64_t dir, const uint8_t *name, size_t len);
/* bytes of the name hash the lane allocated (0: none) */
uint64_t pcrfs_cold_names_bytes(void);
/* What tree (inode >> 56) serves: kind 0 nothing, 1 the q view at k, 2 the raw view, 3 the
 * mix view with JPEGs at k, 4 the l3 view (its cached transcodes).  pcrfs_cold_view(tree, k) is kind 1 (k = 0: nothing). */
void pcrfs_cold_kind(unsigned tree, unsigned kind, unsigned k);
void pcrfs_cold_view(unsigned tree, unsigned k);
int pcrfs_cold_serves(unsigned tree);
/* Drop the tables and close every descriptor (no lane thread may be running). */
void pcrfs_cold_reset(void);

/* Bytes of the file of image `ordinal` (record << 24 | index) in tree: -1 if not served
 * here (not in the table, not a cold view, a PPM no pack holds). */
int64_t pcrfs_cold_size(unsigned tree, uint64_t ordinal);
/* That file into dst: segments 1..min(k, scans) with every checksum verified, then EOI;
 * or a pack item with its XXH3-64 verified.  *read_bytes: record bytes pread;
 * *pack_bytes: pack bytes pread.  PCR_OK, PCR_E_ARG (not served here), PCR_E_SPACE,
 * PCR_E_RANGE (table and record disagree), PCR_E_CORRUPT (a checksum), PCR_E_IO,
 * PCR_E_SHORT, or -EMFILE / -ENFILE when no descriptor could be had (the caller hands the
 * request to Python, which sheds its own). */
int pcrfs_cold_assemble(unsigned tree, uint64_t ordinal, uint8_t *dst, size_t cap,
                        size_t *out, uint64_t *read_bytes, uint64_t *pack_bytes);
/* descriptors open now, opens, evictions; images read from the disk tier, images it
 * did not hold */
void pcrfs_cold_fd_counts(uint64_t *out, size_t n);
#endif
