/* common/xfer internals shared by xfer.c (regions, host backend) and xfer_gpu.c (CUDA backend). */
#ifndef STRATA_XFER_IMPL_H
#define STRATA_XFER_IMPL_H

#include <pthread.h>

#include "strata/xfer.h"

#define XFER_NAME_MAX 64 /* shm name, NUL-padded, in the handle */

struct st_xfer_region {
    st_xfer_kind_t kind;
    bool owner;          /* created here (frees and unlinks) or opened from a peer's handle */
    size_t bytes;        /* user bytes */
    uint64_t nonce;      /* random, in the handle and in the region's own header */
    char label[64];
    /* HOST */
    char name[XFER_NAME_MAX];
    uint8_t *map;        /* header page + user bytes */
    size_t map_bytes;
    void *gpu_map;       /* device address of map once st_xfer_region_gpu_map'ped */
    /* DEVICE */
    uint8_t *dev_base;   /* header (XFER_DEV_HDR bytes) + user bytes, device memory */
    uint8_t dev_ipc[64]; /* the IPC handle (owner) */
    /* peer liveness and abort; mu guards the lazily opened pidfd and the abort text */
    pthread_mutex_t mu;
    int peer_fd;         /* pidfd of the peer process, -1 unknown */
    int peer_pid;
    int aborted;         /* atomic builtins */
    char why[160];
};

#define XFER_PAGE 4096   /* HOST: the header page before the user bytes */
#define XFER_DEV_HDR 256 /* DEVICE: the header before the user bytes */

/* st_xfer_wait_host, spinning spin_ns before it sleeps; quiet: an idle server's poll, whose ending is
 * not an error worth a log line (its owner logs why its link ended: timeouts, aborts and the peer's
 * exit are recorded, logged at DEBUG) and whose sleep slices double up to XFER_IDLE_SLICE_NS */
st_status_t st_xfer__wait_host(st_xfer_region_t *r, size_t flag_off, uint32_t seq, int timeout_ms, bool quiet,
                               uint64_t spin_ns);

#ifdef STRATA_XFER_GPU
st_status_t st_xfer__dev_create(st_xfer_region_t *r);
st_status_t st_xfer__dev_open(st_xfer_region_t *r, const uint8_t ipc[64]);
void st_xfer__dev_close(st_xfer_region_t *r);
void st_xfer__gpu_unmap(st_xfer_region_t *r);
#endif

#endif
