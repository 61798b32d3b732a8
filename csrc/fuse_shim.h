/* pcrfs._fuseshim: the fast lane that answers warm-epoch requests in C (fuse_shim.c). */
#ifndef PCRFS_FUSE_SHIM_H
#define PCRFS_FUSE_SHIM_H
#include <stddef.h>
#include <stdint.h>

int pcrfs_shim_resolve(void *session_fd, void *receive_buf, void *session_exit);
void pcrfs_shim_want(uint64_t lo, uint64_t hi);
int pcrfs_shim_running(void);
/* What the lane does with a request read from /dev/fuse (exposed for the fuzz tests). */
#define PCRFS_LANE_HAND_OVER 0
#define PCRFS_LANE_OPEN 1
#define PCRFS_LANE_RELEASE 2
#define PCRFS_LANE_IOCTL 3
int pcrfs_lane_classify(const uint8_t *buf, size_t n, uint64_t lo, uint64_t hi);
/* opens, releases, ioctls answered; requests handed to pyfuse3 */
void pcrfs_shim_counts(uint64_t *out, size_t n);
#endif
