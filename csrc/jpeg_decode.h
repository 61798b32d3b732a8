/* The front half of pcrfs's batch JPEG decoder (pcrfs.torch.jpeg): header parsing and
 * entropy decoding to DCT coefficients.  Dequantisation, IDCT, upsampling and colour run
 * in torch (CPU or GPU); the entropy step runs here (CPU) or in a Triton kernel that
 * follows jpeg_entropy.c line for line, one restart interval per program.
 *
 * pcr_jpeg_parse walks the markers once: frame, quantisation and Huffman tables, every
 * scan, and each scan's entropy-coded data cut at its restart markers and unstuffed
 * (FF 00 -> FF), so an interval is a plain bit string that starts at byte 0.  Every
 * length is checked against the buffer; nothing is decoded yet.
 *
 * Coefficient layout (per image): component c's blocks, bh[c] rows of bw[c] (padded to
 * whole MCUs, as libjpeg's coefficient arrays are), at coef_offset[c] blocks from the
 * image's first; each block 64 int16 in natural (row-major) order. */
#ifndef PCR_JPEG_DECODE_H
#define PCR_JPEG_DECODE_H
#include <stddef.h>
#include <stdint.h>

#define PCR_JPG_MAX_SCANS 128
#define PCR_JPG_MAX_TABLES 64
/* One derived Huffman table, int32 words: [0,256) 8-bit lookahead ((len << 8) | symbol, 0:
 * longer code); [256,274) maxcode[0..17]; [274,292) valoffset[0..17]; [292,548) symbols. */
#define PCR_HUFF_WORDS 548
#define PCR_HUFF_LOOK 0
#define PCR_HUFF_MAXCODE 256
#define PCR_HUFF_VALOFF 274
#define PCR_HUFF_VALS 292

/* Zigzag index -> natural (row-major) position within a block (jpeg_parse.c). */
extern const uint8_t pcr_zigzag[64];

/* Colour spaces as decoded: libjpeg's rules (JFIF, Adobe transform, component ids). */
#define PCR_JPG_GRAY 1
#define PCR_JPG_RGB 2
#define PCR_JPG_YCC 3
#define PCR_JPG_CMYK 4
#define PCR_JPG_YCCK 5

/* Scan kinds, as the entropy decoders switch on them. */
#define PCR_SCAN_SEQ 0        /* baseline / extended sequential: DC and AC of each block */
#define PCR_SCAN_DC_FIRST 1
#define PCR_SCAN_DC_REFINE 2
#define PCR_SCAN_AC_FIRST 3
#define PCR_SCAN_AC_REFINE 4

typedef struct {
    int32_t kind, ncomp;          /* ncomp components in this scan */
    int32_t comp[4];              /* frame component indexes */
    int32_t dc_tbl[4], ac_tbl[4]; /* indexes into the image's derived tables (-1: none) */
    int32_t Ss, Se, Ah, Al;
    int32_t restart;              /* MCUs per restart interval (0: the scan is one interval) */
    int32_t mcus, mcus_per_row;   /* MCUs in the scan (a block each when ncomp == 1) */
    int32_t first_interval, n_intervals;
} pcr_jpeg_scan;

typedef struct {
    uint32_t width, height;
    int32_t ncomp, progressive, precision, color;
    int32_t h[4], v[4];
    int32_t max_h, max_v, mcux, mcuy;  /* MCUs per row / column of an interleaved scan */
    int32_t bw[4], bh[4];              /* component blocks, padded to whole MCUs */
    int32_t wib[4], hib[4];            /* blocks covering the component's samples */
    int32_t dw[4], dh[4];              /* the component's samples */
    int32_t coef_offset[4];            /* in blocks */
    int32_t total_blocks;
    uint16_t qt[4][64];                /* each component's quantisation table, natural order */
    int32_t nscans, ntables, nintervals;
    int32_t restart_scans;             /* scans cut into more than one interval */
    size_t data_len;                   /* unstuffed entropy bytes */
    pcr_jpeg_scan scans[PCR_JPG_MAX_SCANS];
    char message[120];                 /* why, for anything but PCR_OK */
} pcr_jpeg_info;

/* One restart interval: its scan, where its bytes are in the unstuffed buffer, its MCUs. */
typedef struct {
    int32_t scan, first_mcu, n_mcus, pad;
    int64_t data_off, data_len;
} pcr_jpeg_interval;

/* Parse src.  tables: PCR_JPG_MAX_TABLES * PCR_HUFF_WORDS int32; data: at least len bytes;
 * intervals: cap entries (PCR_E_SPACE with info->nintervals set to the count needed).
 * PCR_E_UNSUPPORTED (valid JPEG, other path: arithmetic coding, 12-bit, lossless,
 * hierarchical, more than 4 components, unusual sampling) or a corruption code, with
 * info->message saying which. */
int pcr_jpeg_parse(const uint8_t *src, size_t len, pcr_jpeg_info *info, int32_t *tables,
                   uint8_t *data, pcr_jpeg_interval *intervals, size_t cap);

/* Entropy-decode intervals [first, first + n) of one image into coefs (info->total_blocks
 * * 64 int16, zeroed by the caller before the first scan).  Intervals must come in scan
 * order: a refinement reads what earlier scans wrote.  PCR_E_CORRUPT on a bad code, a
 * coefficient past 63 or an interval whose bits run out; *bad is the interval. */
int pcr_jpeg_decode_intervals(const pcr_jpeg_info *info, const int32_t *tables,
                              const uint8_t *data, const pcr_jpeg_interval *intervals,
                              size_t first, size_t n, int16_t *coefs, int64_t *bad);

/* The same into any per-component layout: component c's block (row, col) at base[c] +
 * (row * bw[c] + col) * 64, e.g. libjpeg's own coefficient arrays (fused.c). */
int pcr_jpeg_decode_into(const pcr_jpeg_info *info, const int32_t *tables, const uint8_t *data,
                         const pcr_jpeg_interval *intervals, size_t first, size_t n,
                         int16_t *const base[4], int64_t *bad);

/* The GPU entropy kernel's batch descriptors (jpeg_batch.c): per scan, PCR_JPG_SCAN_WORDS
 * int64 (kind, ncomp, Ss, Se, Al, MCUs per row, then per component slot: first block,
 * blocks per row, h, v, DC and AC table word offsets); per interval, PCR_JPG_IV_WORDS
 * (start, end, first MCU, MCUs, its scan's row) and 3 in `where` (image, scan, level). */
#define PCR_JPG_SCAN_WORDS 30
#define PCR_JPG_IV_WORDS 5

/* out: the batch's scans, intervals, entropy bytes and tables.  PCR_E_ARG for an info
 * the parser could not have produced. */
int pcr_jpeg_batch_size(size_t n, const pcr_jpeg_info *const *info, int64_t out[4]);

/* Fill the batch's buffers (sizes: pcr_jpeg_batch_size's, or with a take (NULL: every
 * interval) pcr_jpeg_batch_take's; all_data holds 4 bytes more and all_tables one table
 * more, zeroed here: the kernel's pads) with image j's coefficients at block firsts[j].
 * Intervals come out by level, then image, then interval; counts[l] is level l's.  A
 * take's intervals' bytes are packed in turn.  PCR_E_RANGE for an interval outside its
 * image's scans or bytes. */
int pcr_jpeg_batch_descriptors(size_t n, const pcr_jpeg_info *const *info,
                               const uint8_t *const *data, const int32_t *const *tables,
                               const pcr_jpeg_interval *const *ivs, const int64_t *firsts,
                               const uint8_t *take, const int64_t sizes[4], uint8_t *all_data,
                               int32_t *all_tables, int64_t *rows, int64_t *iv, int64_t *where,
                               int64_t counts[PCR_JPG_MAX_SCANS]);

/* A crop's intervals: windows[2j], windows[2j + 1] are image j's MCU rows [r0, r1) that
 * must come out exact; take gets a byte per interval (the images' in turn), 1 for those
 * the rows need (the intervals meeting them, and an AC refinement's taken rows in every
 * earlier scan of its component).  sizes: pcr_jpeg_batch_size's, of the taken intervals
 * (pass take and sizes to pcr_jpeg_batch_descriptors, NULL there for every interval). */
int pcr_jpeg_batch_take(size_t n, const pcr_jpeg_info *const *info,
                        const pcr_jpeg_interval *const *ivs, const int64_t *windows,
                        uint8_t *take, int64_t sizes[4]);
#endif
