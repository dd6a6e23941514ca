/* common/xfer, CUDA backend: device regions over CUDA IPC, the mapping of host regions into the
 * devices' address space, and the stream-ordered put / signal / wait (copies plus the one-thread flag
 * kernels of kernels/flag.cu: no host synchronisation, so all of it can be captured in a graph). */
#include "strata/gpu.h"
#include "strata/kernels.h"
#include "strata/kernels_cuda.h"
#include "xfer_impl.h"

#define XFER_DEV_MAGIC 0x44585453u /* "STXD" */

typedef struct { /* the first bytes of a device region's header */
    uint32_t magic, pad;
    uint64_t nonce, bytes;
} xfer_dev_hdr_t;

st_status_t st_xfer__dev_create(st_xfer_region_t *r) {
    void *p = NULL;
    size_t total = XFER_DEV_HDR + r->bytes;
    xfer_dev_hdr_t h = {.magic = XFER_DEV_MAGIC, .nonce = r->nonce, .bytes = r->bytes};
    st_status_t rc = st_gpu_malloc(&p, total);
    if (rc) return rc;
    rc = st_gpu_memset(p, 0, total);
    if (!rc) rc = st_gpu_memcpy_h2d(p, &h, sizeof h);
    if (!rc) rc = st_gpu_ipc_export(p, r->dev_ipc);
    if (rc) {
        st_gpu_free(p);
        return rc;
    }
    r->dev_base = p;
    return ST_OK;
}

st_status_t st_xfer__dev_open(st_xfer_region_t *r, const uint8_t ipc[64]) {
    void *p = NULL;
    xfer_dev_hdr_t h;
    st_status_t rc = st_gpu_ipc_open(ipc, &p);
    if (rc) return rc;
    rc = st_gpu_memcpy_d2h(&h, p, sizeof h);
    if (!rc && (h.magic != XFER_DEV_MAGIC || h.nonce != r->nonce || h.bytes != r->bytes))
        rc = ST_FAIL(ST_ERR_PROTOCOL, "xfer: the device region does not match its handle (magic %08x, %llu bytes)",
                     h.magic, (unsigned long long)h.bytes);
    if (rc) {
        st_gpu_ipc_close(p);
        return rc;
    }
    r->dev_base = p;
    return ST_OK;
}

void st_xfer__dev_close(st_xfer_region_t *r) {
    if (!r->dev_base) return;
    if (r->owner) st_gpu_free(r->dev_base);
    else st_gpu_ipc_close(r->dev_base);
    r->dev_base = NULL;
}

void st_xfer__gpu_unmap(st_xfer_region_t *r) {
    if (r->gpu_map) st_gpu_host_unregister(r->map);
    r->gpu_map = NULL;
}

st_status_t st_xfer_region_gpu_map(st_xfer_region_t *r) {
    if (r->kind != ST_XFER_HOST) return ST_OK; /* device memory is device-addressable already */
    if (r->gpu_map) return ST_OK;
    return st_gpu_host_register(r->map, r->map_bytes, &r->gpu_map);
}

void *st_xfer_region_dev_ptr(const st_xfer_region_t *r) {
    if (r->kind == ST_XFER_DEVICE) return r->dev_base + XFER_DEV_HDR;
    return r->gpu_map ? (uint8_t *)r->gpu_map + XFER_PAGE : NULL;
}

static st_status_t gpu_check(const st_xfer_region_t *r, size_t off, size_t bytes, bool flag, const char *what) {
    const char *who = r->label[0] ? r->label : "peer";
    if (!st_xfer_region_dev_ptr(r))
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer %s: %s's host region is not mapped for the GPU", what, who);
    if (flag && off % ST_XFER_FLAG_BYTES)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer %s: flag offset %zu is not 8-byte aligned", what, off);
    if (off > r->bytes || bytes > r->bytes - off)
        return ST_FAIL(ST_ERR_OUT_OF_RANGE, "xfer %s: [%zu, +%zu) outside the %zu bytes of %s's region", what, off,
                       bytes, r->bytes, who);
    if (__atomic_load_n(&r->aborted, __ATOMIC_ACQUIRE))
        return ST_FAIL(ST_ERR_PEER, "xfer %s: %s: %s", what, who, r->why);
    return ST_OK;
}

st_status_t st_xfer_put(const st_gpu_stream_t *s, st_xfer_region_t *dst, size_t off, const void *src, size_t bytes) {
    st_status_t rc = gpu_check(dst, off, bytes, false, "put");
    if (rc || !bytes) return rc;
    if (dst->kind == ST_XFER_HOST) /* DMA into the page-locked shared mapping (its host address) */
        return st_gpu_memcpy_async(s, dst->map + XFER_PAGE + off, src, bytes, ST_GPU_COPY_D2H);
    return st_gpu_memcpy_async(s, dst->dev_base + XFER_DEV_HDR + off, src, bytes, ST_GPU_COPY_D2D);
}

st_status_t st_xfer_signal(const st_gpu_stream_t *s, st_xfer_region_t *r, size_t flag_off, uint32_t seq,
                           const uint32_t *epoch) {
    st_status_t rc = gpu_check(r, flag_off, ST_XFER_FLAG_BYTES, true, "signal");
    if (rc) return rc;
    /* NOTE: a host thread sleeping on this flag (st_xfer_wait_host past its spin) is not woken by a
     * GPU store: it sees the flag at its next 1 ms slice. GPU→CPU hand-offs that matter spin. */
    return st_cuda_flag_signal(s, (uint32_t *)((uint8_t *)st_xfer_region_dev_ptr(r) + flag_off), seq, epoch);
}

st_status_t st_xfer_wait(const st_gpu_stream_t *s, st_xfer_region_t *r, size_t flag_off, uint32_t seq,
                         const uint32_t *epoch, int timeout_ms, uint32_t *err) {
    st_status_t rc = gpu_check(r, flag_off, ST_XFER_FLAG_BYTES, true, "wait");
    if (rc) return rc;
    if (timeout_ms <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "xfer wait: timeout %d ms (every wait is bounded)", timeout_ms);
    return st_cuda_flag_wait(s, (const uint32_t *)((uint8_t *)st_xfer_region_dev_ptr(r) + flag_off), seq, epoch,
                             (uint64_t)timeout_ms * 1000000u, err);
}
