/* pcrfs native helper: scan splitting, lossless progressive transcoding, splicing.
 *
 * Conventions (zstd-like): explicit buffers and lengths, no global state, every input
 * length is validated, and every function returns PCR_OK or a negative PCR_E* code.
 * Nothing here calls exit() or aborts; libjpeg's fatal errors come back as codes.
 */
#ifndef PCR_NATIVE_H
#define PCR_NATIVE_H
#include <stddef.h>
#include <stdint.h>

#define PCR_OK 0
#define PCR_E_ARG -1        /* NULL pointer or impossible length */
#define PCR_E_NOT_JPEG -2   /* no SOI */
#define PCR_E_TRUNCATED -3  /* data ends inside a marker or scan, or before EOI */
#define PCR_E_BAD_MARKER -4 /* malformed marker segment */
#define PCR_E_TOO_MANY -5   /* more scans than the caller's array holds */
#define PCR_E_NO_SCAN -6    /* no SOS before EOI */
#define PCR_E_SPACE -7      /* destination buffer too small */
#define PCR_E_RANGE -8      /* segment outside the source */
#define PCR_E_IO -9         /* pread failed (errno preserved) */
#define PCR_E_SHORT -10     /* pread hit end of file */
#define PCR_E_JPEG -11      /* libjpeg reported a fatal error; message in the result */
#define PCR_E_CORRUPT -12   /* libjpeg warned that entropy-coded data is damaged */
#define PCR_E_NOMEM -13
#define PCR_E_NOT_L3 -14     /* no "LLL." magic */
#define PCR_E_BAD_HEADER -15 /* L3 width, height or patch size out of range */
#define PCR_E_TRAILING -16   /* bytes after the last L3 patch */
#define PCR_E_UNSUPPORTED -17 /* valid input this function does not handle (see its comment) */
#define PCR_E_TOO_LARGE -18   /* more pixels than the caller allows */

/* Split a progressive JPEG into scan segments.  ends[i] is the end offset (exclusive) of
 * segment i; segment 0 starts at 0.  Tables before a scan belong to that scan's segment;
 * EOI and anything after it are excluded. */
int pcr_split_scans(const uint8_t *buf, size_t len, uint64_t *ends, size_t max_ends,
                    size_t *n_ends);

/* Copy segments (offset[i], length[i]) of src, then EOI, into dst. */
int pcr_splice_buf(const uint8_t *src, size_t src_len, const uint64_t *offsets,
                   const uint64_t *lengths, size_t n_segs, uint8_t *dst, size_t dst_cap,
                   size_t *out_len);

/* Same, reading the segments from fd with pread (EINTR and short reads handled). */
int pcr_splice_fd(int fd, const uint64_t *offsets, const uint64_t *lengths, size_t n_segs,
                  uint8_t *dst, size_t dst_cap, size_t *out_len);

#define PCR_KEEP_NONE 0    /* only what libjpeg writes itself (JFIF / Adobe) */
#define PCR_KEEP_DEFAULT 1 /* + ICC profile (APP2) */
#define PCR_KEEP_ALL 2     /* + every APPn and COM */

typedef struct {
    uint8_t *data;   /* malloc'd output; free with pcr_free */
    size_t size;
    uint32_t width, height;
    int components;
    int color_space;     /* libjpeg J_COLOR_SPACE of the JPEG */
    int warnings;        /* non-fatal libjpeg warnings seen */
    char message[200];   /* last fatal error or first warning, "" if none */
} pcr_transcode_result;

/* Losslessly rewrite a JPEG as progressive JPEG with the same DCT coefficients.
 * scan_script: NULL for libjpeg's simple progression, else n_scans * 8 ints:
 * comps_in_scan, c0, c1, c2, c3, Ss, Se, (Ah << 4 | Al).  The script is used only when
 * script_components equals the image's component count (otherwise simple progression).
 * Damaged entropy-coded data (libjpeg warnings) yields PCR_E_CORRUPT.  More than max_pixels
 * pixels (unless 0) yields PCR_E_TOO_LARGE, with width and height set, from the header
 * alone.  Restart markers: every restart_rows MCU rows of every scan, or with restart_bytes > 0
 * per scan, intervals of at most that many entropy-coded bytes where 4 MCUs allow (two
 * encodes; transcode.c). */
int pcr_transcode(const uint8_t *src, size_t src_len, int keep_markers, const int *scan_script,
                  size_t n_scans, int script_components, uint64_t max_pixels,
                  int restart_rows, int restart_bytes, pcr_transcode_result *res);
/* The coefficients of a JPEG (a q_k cut included) as one sequential scan whose quantizers
 * absorb each coefficient's missing low bits (transcode.c); same result struct. */
int pcr_sequential(const uint8_t *src, size_t src_len, uint64_t max_pixels,
                   pcr_transcode_result *res);

void pcr_free(void *p);

/* ---- L3 (docs/L3.md).  Pixels are interleaved RGB, width * height * 3 bytes. ---- */
#define PCR_L3_MAX_PATCH 128  /* larger patches can overflow the uint16 size table */

/* Upper bound of an encoding's size (every row at nbit 8). */
int pcr_l3_max_size(uint32_t width, uint32_t height, uint32_t patch, size_t *out);
int pcr_l3_encode(const uint8_t *rgb, size_t rgb_len, uint32_t width, uint32_t height,
                  uint32_t patch, uint8_t *dst, size_t dst_cap, size_t *out_len);
/* Same, from three planes (R, G, B) of width * height bytes each; a grayscale image passes
 * one plane three times. */
int pcr_l3_encode_planes(const uint8_t *const planes[3], uint32_t width, uint32_t height,
                         uint32_t patch, uint8_t *dst, size_t dst_cap, size_t *out_len);
/* The L3 encoding of a JPEG's decoded pixels, as Pillow's Image.open(..).convert("RGB")
 * gives them (libjpeg defaults: islow IDCT, fancy upsampling; grayscale as three equal
 * planes), patch from the resolution.  Only YCbCr, RGB and grayscale JPEGs decoded
 * without any libjpeg warning: anything else is PCR_E_UNSUPPORTED, for the caller to
 * decode another way; more than PCR_JPEG_MAX_PIXELS is PCR_E_TOO_LARGE.  *width and *height
 * are set first, so a PCR_E_SPACE caller can size dst with pcr_l3_max_size and call again. */
#define PCR_JPEG_MAX_PIXELS (1ull << 32)
int pcr_jpeg_to_l3(const uint8_t *jpeg, size_t len, uint8_t *dst, size_t dst_cap,
                   size_t *out_len, uint32_t *width, uint32_t *height);
/* Validates the header and that the patch-size table accounts for exactly len bytes. */
int pcr_l3_info(const uint8_t *src, size_t len, uint32_t *width, uint32_t *height,
                uint32_t *patch);
/* PCR_E_CORRUPT when a row's nbit or length disagrees with its patch. */
int pcr_l3_decode(const uint8_t *src, size_t len, uint8_t *rgb, size_t rgb_cap);
/* Same, into three planes R, G, B of width * height bytes each (CHW). */
int pcr_l3_decode_planar(const uint8_t *src, size_t len, uint8_t *planes, size_t cap);
/* n RGB pixels into three planes (vectorized; shared by the encoders). */
void pcr_deinterleave3(const uint8_t *rgb, size_t n, uint8_t *r, uint8_t *g, uint8_t *b);
/* The paper's patch size for a resolution: 32, 64 or 128. */
int pcr_l3_choose_patch(uint32_t width, uint32_t height);
/* ---- decode, crop and resize in one step (fused.c) ---- */
#define PCR_IMG_JPEG 1
#define PCR_IMG_PPM 2
#define PCR_CROP_CHW 1        /* write three planes instead of interleaved RGB */
#define PCR_CROP_FAST 2       /* libjpeg's fast integer IDCT, no fancy upsampling */
#define PCR_CROP_FULL_SCALE 4 /* no DCT-domain scaling (8/8) */
#define PCR_CROP_FLOAT 8      /* float32 CHW planes, (v - mean[c]) * inv_std[c] */
#define PCR_CROP_LIBJPEG_ENTROPY 16 /* progressive: libjpeg's entropy decoder, every scan */
typedef struct {
    int32_t top, left, height, width;   /* the box, in the source's pixels */
    uint32_t out_width, out_height;     /* at most 65535 each */
    int32_t flip;                       /* mirror left-right */
    int32_t flags;                      /* PCR_CROP_* */
    uint64_t max_pixels;                /* 0: no limit */
    float mean[3], inv_std[3];          /* PCR_CROP_FLOAT: per channel, on 0..255 */
} pcr_crop;
typedef struct {
    uint32_t width, height;  /* the source's */
    int32_t scale;           /* n of the n/8 DCT scaling used (8 for PPM) */
    int32_t entropy;         /* 1: pcrfs's entropy decoder read the box's intervals */
    char message[200];       /* libjpeg's, on PCR_E_JPEG / PCR_E_CORRUPT */
} pcr_crop_result;
/* Width and height from a JPEG's or binary PPM's header; kind is PCR_IMG_*. */
int pcr_image_size(const uint8_t *src, size_t len, uint32_t *width, uint32_t *height,
                   int32_t *kind);
/* The box of a JPEG (baseline or progressive; gray, YCbCr, RGB, CMYK/YCCK as Pillow's
 * convert("RGB")) or a binary PPM (P6, P5; maxval 255), resized to out_width x out_height
 * RGB into dst (out_width * out_height * 3 bytes).  A box outside the image is
 * PCR_E_RANGE; damaged entropy-coded data in the rows read is PCR_E_CORRUPT. */
int pcr_decode_resized_crop(const uint8_t *src, size_t len, const pcr_crop *crop, uint8_t *dst,
                            size_t dst_cap, pcr_crop_result *res);
#endif
