"""cffi build script for pcrfs._fuseshim (csrc/fuse_shim.c).

No -lfuse3: the shim calls libfuse only through addresses looked up in pyfuse3's own link
map at run time (pcrfs/fs/kernel_shim.py), so it can never mix two libfuse copies; the
kernel protocol structs come from <linux/fuse.h>.  XXH3 comes from Debian's libxxhash-dev
header, inlined (XXH_INLINE_ALL): no run-time library."""
import os
import subprocess
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).parent


def _fuse3_cflags() -> list[str]:
    try:
        out = subprocess.run(["pkg-config", "--cflags", "fuse3"], capture_output=True,
                             text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = ["-I/usr/include/fuse3"]
    return out


# tools/sanitized_load.sh: PCRFS_SHIM_SANITIZE=address builds the shim with ASan for one
# load run (the daemon then needs libasan preloaded); never set for a normal install
_SANITIZE = ([f"-fsanitize={os.environ['PCRFS_SHIM_SANITIZE']}", "-fno-omit-frame-pointer", "-g"]
             if os.environ.get("PCRFS_SHIM_SANITIZE") else [])

ffibuilder = FFI()
ffibuilder.cdef(
    """
    int pcrfs_shim_resolve(void *session_fd, void *receive_buf, void *session_exit,
                           void *custom_io);
    void pcrfs_shim_want(uint64_t lo, uint64_t hi);
    int pcrfs_shim_running(void);
    void pcrfs_shim_want_threads(unsigned n);
    void pcrfs_shim_alias_tree(unsigned tree, int on);
    unsigned pcrfs_shim_threads(void);
    void pcrfs_shim_want_realtime(unsigned n);
    unsigned pcrfs_shim_realtime(void);
    void pcrfs_shim_want_nice(int nice);
    unsigned pcrfs_shim_niced(void);
    void pcrfs_shim_want_skip_open(int on);
    int pcrfs_lane_adopt(uint8_t *buf, size_t n);
    void pcrfs_shim_counts(uint64_t *out, size_t n);
    void pcrfs_shim_stop(void);
    int pcrfs_shim_resume(const uint8_t *init, size_t n, int replay, const int *clones,
                          unsigned nclones, int own_clones, uint64_t epoch,
                          int inflight_fd);
    int pcrfs_lane_rehandle(uint8_t *buf, size_t n);
    int pcrfs_shim_own_clones(void);
    int pcrfs_shim_resent(void);
    void pcrfs_shim_trace(int fd);
    void pcrfs_lane_served(uint64_t *bytes, uint64_t *files, size_t n);
    #define PCRFS_LANE_HAND_OVER ...
    #define PCRFS_LANE_OPEN ...
    #define PCRFS_LANE_RELEASE ...
    #define PCRFS_LANE_IOCTL ...
    #define PCRFS_LANE_READ ...
    #define PCRFS_LANE_GETATTR ...
    #define PCRFS_LANE_LOOKUP ...
    int pcrfs_lane_configure(uint64_t budget, uint32_t uid, uint32_t gid, int64_t mtime_ns,
                             uint32_t blksize, uint64_t attr_valid);
    void pcrfs_lane_store_pin(int pinned);
    int pcrfs_lane_keep(uint64_t ino, const uint8_t *data, size_t len);
    int64_t pcrfs_lane_copy(uint64_t ino, uint64_t off, uint8_t *out, size_t cap);
    void pcrfs_lane_store_counts(uint64_t *out, size_t n);
    int pcrfs_lane_classify(const uint8_t *buf, size_t n, uint64_t lo, uint64_t hi);
    int pcrfs_lane_process(int reply_fd, const uint8_t *buf, size_t n);
    size_t pcrfs_lane_drain(void);
    void pcrfs_lane_cold_counts(uint64_t *out, size_t n);
    int pcrfs_segtab_check(const uint8_t *blob, size_t len, uint32_t *groups,
                           uint64_t *records, uint64_t *images);
    int pcrfs_cold_install(const uint8_t *blob, size_t len, int dir_fd, uint32_t max_fds);
    int pcrfs_cold_install_disk(const uint8_t *blob, size_t len, int dir_fd);
    int pcrfs_cold_install_l3(const uint64_t *sizes, uint64_t *sums, size_t n, int dir_fd);
    int pcrfs_cold_install_raw(const uint64_t *items, size_t n, const uint8_t *mix_raw,
                               int dir_fd, uint32_t max_fds);
    int pcrfs_cold_install_names(unsigned kind, const uint32_t *dir, const uint64_t *off,
                                 const uint8_t *blob, size_t blob_len, size_t n);
    int64_t pcrfs_cold_lookup(unsigned tree, uint64_t dir, const uint8_t *name, size_t len);
    uint64_t pcrfs_cold_names_bytes(void);
    void pcrfs_cold_view(unsigned tree, unsigned k);
    void pcrfs_cold_kind(unsigned tree, unsigned kind, unsigned k);
    int pcrfs_cold_serves(unsigned tree);
    int64_t pcrfs_cold_size(unsigned tree, uint64_t ordinal);
    int pcrfs_cold_assemble(unsigned tree, uint64_t ordinal, uint8_t *dst, size_t cap,
                            size_t *out, uint64_t *read_bytes, uint64_t *pack_bytes);
    void pcrfs_cold_reset(void);
    """
)
ffibuilder.set_source(
    "pcrfs._fuseshim",
    '#include "fuse_shim.h"\n#include "lane_cold.h"',
    # the lane's parts (csrc/lane_internal.h)
    sources=[str(Path("csrc") / f) for f in ("fuse_shim.c", "lane_answer.c", "lane_store.c",
                                              "lane_route.c", "lane_cold.c")],
    include_dirs=["csrc"],
    libraries=["pthread"],
    extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra",
                        "-Werror=implicit-function-declaration", *_fuse3_cflags(), *_SANITIZE],
    extra_link_args=_SANITIZE,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
