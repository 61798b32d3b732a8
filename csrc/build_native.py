"""cffi (API mode, out-of-line) build script for pcrfs._native.

cffi releases the GIL around every call into these functions, so worker threads run
splice and transcode in parallel with the trio loop."""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).parent
SOURCES = ["split.c", "splice.c", "transcode.c", "jpeg_pixels.c", "l3.c", "jpeg_parse.c",
           "jpeg_entropy.c", "jpeg_batch.c", "fused.c", "resize.c", "scratch.c"]

ffibuilder = FFI()
ffibuilder.cdef(
    """
    #define PCR_OK ...
    #define PCR_E_ARG ...
    #define PCR_E_NOT_JPEG ...
    #define PCR_E_TRUNCATED ...
    #define PCR_E_BAD_MARKER ...
    #define PCR_E_TOO_MANY ...
    #define PCR_E_NO_SCAN ...
    #define PCR_E_SPACE ...
    #define PCR_E_RANGE ...
    #define PCR_E_IO ...
    #define PCR_E_SHORT ...
    #define PCR_E_JPEG ...
    #define PCR_E_CORRUPT ...
    #define PCR_E_NOMEM ...
    #define PCR_E_NOT_L3 ...
    #define PCR_E_BAD_HEADER ...
    #define PCR_E_TRAILING ...
    #define PCR_E_UNSUPPORTED ...
    #define PCR_E_TOO_LARGE ...
    #define PCR_L3_MAX_PATCH ...
    #define PCR_KEEP_NONE ...
    #define PCR_KEEP_DEFAULT ...
    #define PCR_KEEP_ALL ...
    typedef struct {
        uint8_t *data; size_t size; uint32_t width, height;
        int components; int color_space; int warnings; char message[200];
    } pcr_transcode_result;
    int pcr_split_scans(const uint8_t *buf, size_t len, uint64_t *ends, size_t max_ends,
                        size_t *n_ends);
    int pcr_splice_buf(const uint8_t *src, size_t src_len, const uint64_t *offsets,
                       const uint64_t *lengths, size_t n_segs, uint8_t *dst, size_t dst_cap,
                       size_t *out_len);
    int pcr_splice_fd(int fd, const uint64_t *offsets, const uint64_t *lengths, size_t n_segs,
                      uint8_t *dst, size_t dst_cap, size_t *out_len);
    int pcr_transcode(const uint8_t *src, size_t src_len, int keep_markers,
                      const int *scan_script, size_t n_scans, int script_components,
                      uint64_t max_pixels, int restart_rows, int restart_bytes,
                      pcr_transcode_result *res);
    int pcr_sequential(const uint8_t *src, size_t src_len, uint64_t max_pixels,
                   pcr_transcode_result *res);
    void pcr_free(void *p);
    int pcr_l3_max_size(uint32_t width, uint32_t height, uint32_t patch, size_t *out);
    int pcr_l3_encode(const uint8_t *rgb, size_t rgb_len, uint32_t width, uint32_t height,
                      uint32_t patch, uint8_t *dst, size_t dst_cap, size_t *out_len);
    int pcr_jpeg_to_l3(const uint8_t *jpeg, size_t len, uint8_t *dst, size_t dst_cap,
                       size_t *out_len, uint32_t *width, uint32_t *height);
    int pcr_l3_info(const uint8_t *src, size_t len, uint32_t *width, uint32_t *height,
                    uint32_t *patch);
    int pcr_l3_decode(const uint8_t *src, size_t len, uint8_t *rgb, size_t rgb_cap);
    int pcr_l3_decode_planar(const uint8_t *src, size_t len, uint8_t *planes, size_t cap);
    int pcr_l3_choose_patch(uint32_t width, uint32_t height);

    #define PCR_JPG_MAX_SCANS ...
    #define PCR_JPG_MAX_TABLES ...
    #define PCR_HUFF_WORDS ...
    typedef struct {
        int32_t kind, ncomp; int32_t comp[4]; int32_t dc_tbl[4], ac_tbl[4];
        int32_t Ss, Se, Ah, Al; int32_t restart; int32_t mcus, mcus_per_row;
        int32_t first_interval, n_intervals;
    } pcr_jpeg_scan;
    typedef struct {
        uint32_t width, height; int32_t ncomp, progressive, precision, color;
        int32_t h[4], v[4]; int32_t max_h, max_v, mcux, mcuy;
        int32_t bw[4], bh[4]; int32_t wib[4], hib[4]; int32_t dw[4], dh[4];
        int32_t coef_offset[4]; int32_t total_blocks; uint16_t qt[4][64];
        int32_t nscans, ntables, nintervals; int32_t restart_scans; size_t data_len;
        pcr_jpeg_scan scans[128]; char message[120];
    } pcr_jpeg_info;
    typedef struct { int32_t scan, first_mcu, n_mcus, pad; int64_t data_off, data_len; } pcr_jpeg_interval;
    int pcr_jpeg_parse(const uint8_t *src, size_t len, pcr_jpeg_info *info, int32_t *tables,
                       uint8_t *data, pcr_jpeg_interval *intervals, size_t cap);
    int pcr_jpeg_decode_intervals(const pcr_jpeg_info *info, const int32_t *tables,
                                  const uint8_t *data, const pcr_jpeg_interval *intervals,
                                  size_t first, size_t n, int16_t *coefs, int64_t *bad);
    #define PCR_JPG_SCAN_WORDS ...
    #define PCR_JPG_IV_WORDS ...
    int pcr_jpeg_batch_size(size_t n, const pcr_jpeg_info *const *info, int64_t out[4]);
    int pcr_jpeg_batch_descriptors(size_t n, const pcr_jpeg_info *const *info,
                                   const uint8_t *const *data, const int32_t *const *tables,
                                   const pcr_jpeg_interval *const *ivs, const int64_t *firsts,
                                   const uint8_t *take, const int64_t sizes[4], uint8_t *all_data,
                                   int32_t *all_tables, int64_t *rows, int64_t *iv, int64_t *where,
                                   int64_t counts[128]);
    int pcr_jpeg_batch_take(size_t n, const pcr_jpeg_info *const *info,
                            const pcr_jpeg_interval *const *ivs, const int64_t *windows,
                            uint8_t *take, int64_t sizes[4]);

    #define PCR_IMG_JPEG ...
    #define PCR_IMG_PPM ...
    #define PCR_CROP_CHW ...
    #define PCR_CROP_FAST ...
    #define PCR_CROP_FULL_SCALE ...
    #define PCR_CROP_FLOAT ...
    #define PCR_CROP_LIBJPEG_ENTROPY ...
    typedef struct {
        int32_t top, left, height, width; uint32_t out_width, out_height; int32_t flip;
        int32_t flags; uint64_t max_pixels; float mean[3], inv_std[3];
    } pcr_crop;
    typedef struct { uint32_t width, height; int32_t scale, entropy; char message[200]; } pcr_crop_result;
    int pcr_image_size(const uint8_t *src, size_t len, uint32_t *width, uint32_t *height,
                       int32_t *kind);
    int pcr_decode_resized_crop(const uint8_t *src, size_t len, const pcr_crop *crop,
                                uint8_t *dst, size_t dst_cap, pcr_crop_result *res);
    """
)
ffibuilder.set_source(
    "pcrfs._native",
    '#include "pcr_native.h"\n#include "jpeg_decode.h"',
    sources=[str(Path("csrc") / s) for s in SOURCES],
    include_dirs=["csrc"],
    libraries=["jpeg"],
    extra_compile_args=["-O3", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
