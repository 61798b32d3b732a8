"""cffi (API mode, out-of-line) build script for pcrfs._native.

cffi releases the GIL around every call into these functions, so worker threads run
splice and transcode in parallel with the trio loop."""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).parent
SOURCES = ["split.c", "splice.c", "transcode.c", "l3.c"]

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
                      pcr_transcode_result *res);
    void pcr_free(void *p);
    int pcr_l3_max_size(uint32_t width, uint32_t height, uint32_t patch, size_t *out);
    int pcr_l3_encode(const uint8_t *rgb, size_t rgb_len, uint32_t width, uint32_t height,
                      uint32_t patch, uint8_t *dst, size_t dst_cap, size_t *out_len);
    int pcr_l3_info(const uint8_t *src, size_t len, uint32_t *width, uint32_t *height,
                    uint32_t *patch);
    int pcr_l3_decode(const uint8_t *src, size_t len, uint8_t *rgb, size_t rgb_cap);
    int pcr_l3_decode_planar(const uint8_t *src, size_t len, uint8_t *planes, size_t cap);
    int pcr_l3_choose_patch(uint32_t width, uint32_t height);
    """
)
ffibuilder.set_source(
    "pcrfs._native",
    '#include "pcr_native.h"',
    sources=[str(Path("csrc") / s) for s in SOURCES],
    include_dirs=["csrc"],
    libraries=["jpeg"],
    extra_compile_args=["-O3", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
