/* common/xfer: regions, handles and the host (POSIX shared memory) backend; the CUDA backend's
 * stream operations are in xfer_gpu.c. See strata/xfer.h for the contract. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "strata/kernels.h"
#include "xfer_impl.h"

/* Handle byte map (ST_XFER_HANDLE_BYTES, little-endian, every reserved byte zero):
 *   0   u32  magic XFER_MAGIC ("STXF")
 *   4   u16  version XFER_VERSION
 *   6   u16  kind (st_xfer_kind_t)
 *   8   u64  user bytes
 *  16   u64  nonce (random; equal to the one in the region's own header)
 *  24   u64  reserved
 *  32   64   HOST: shm name "/strata-xfer-<32 hex>", NUL-padded; DEVICE: cudaIpcMemHandle_t
 *  96   32   reserved */
#define XFER_MAGIC 0x46585453u
#define XFER_VERSION 1
#define XFER_NAME_PREFIX "/strata-xfer-"

/* Shared-memory layout: one header page (XFER_PAGE, xfer_shm_hdr_t), then the user bytes. */
typedef struct {
    uint32_t magic, version;
    uint64_t nonce;
    uint64_t bytes;
    uint64_t pidns[2]; /* pid namespace of owner [0] and opener [1] (inode of /proc/self/ns/pid; 0 unknown) */
    int32_t pid[2];    /* their pids; pid[1] published (release) after pidns[1] */
    uint32_t opened;   /* 0 → 1 by the one opener */
} xfer_shm_hdr_t;

/* spin before sleeping: a peer answering within the spin is never slept on (st_xfer_set_spin) */
static uint64_t g_spin_ns = 30000u; /* set at a role's start, before its threads */
#define XFER_SLICE_NS 1000000u    /* a sleeping waiter checks abort, peer and deadline every 1 ms */
/* an idle poll's (quiet) slices double up to this: its doorbell is rung by a CPU, which wakes it, so
 * the slice bounds only how soon it sees an abort or the peer's exit (an idle server: 1 000 wake-ups
 * a second took 2% of a CPU) */
#define XFER_IDLE_SLICE_NS 32000000u

static inline void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static uint64_t self_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static const char *label_of(const st_xfer_region_t *r) { return r->label[0] ? r->label : "peer"; }

static st_xfer_region_t *region_new(st_xfer_kind_t kind, bool owner) {
    st_xfer_region_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->kind = kind;
    r->owner = owner;
    r->peer_fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void region_free(st_xfer_region_t *r) {
    if (r->peer_fd >= 0) close(r->peer_fd);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static size_t page_up(size_t n) { return (n + XFER_PAGE - 1) & ~(size_t)(XFER_PAGE - 1); }

static st_status_t shm_create(st_xfer_region_t *r) {
    uint8_t rnd[16];
    char hex[33];
    st_status_t rc = st_random_bytes(rnd, sizeof rnd);
    if (rc) return rc;
    st_hex(rnd, sizeof rnd, hex);
    snprintf(r->name, sizeof r->name, "%s%s", XFER_NAME_PREFIX, hex);
    r->map_bytes = XFER_PAGE + page_up(r->bytes);
    int fd = shm_open(r->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return ST_FAIL(ST_ERR_IO, "xfer: shm_open %s: %s", r->name, strerror(errno));
    if (ftruncate(fd, (off_t)r->map_bytes) != 0) {
        rc = ST_FAIL(ST_ERR_IO, "xfer: ftruncate %s to %zu bytes: %s", r->name, r->map_bytes, strerror(errno));
        goto err_unlink;
    }
    /* NOTE: MAP_POPULATE: the pages are allocated and mapped now, not faulted in by the first puts */
    void *m = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = ST_FAIL(ST_ERR_NO_MEMORY, "xfer: mmap %zu bytes of %s: %s", r->map_bytes, r->name, strerror(errno));
        goto err_unlink;
    }
    close(fd);
    r->map = m;
    xfer_shm_hdr_t *h = (xfer_shm_hdr_t *)r->map; /* the object is zero-filled by ftruncate */
    h->magic = XFER_MAGIC;
    h->version = XFER_VERSION;
    h->nonce = r->nonce;
    h->bytes = r->bytes;
    h->pidns[0] = self_pidns();
    h->pid[0] = (int32_t)getpid();
    return ST_OK;
err_unlink:
    shm_unlink(r->name);
    close(fd);
    r->name[0] = 0;
    return rc;
}

st_status_t st_xfer_region_create(st_xfer_kind_t kind, size_t bytes, st_xfer_region_t **out) {
    if (kind != ST_XFER_HOST && kind != ST_XFER_DEVICE)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer: region kind %d", (int)kind);
    if (bytes == 0 || bytes > ST_XFER_MAX_BYTES)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer: region of %zu bytes (1 .. %zu)", bytes, ST_XFER_MAX_BYTES);
#ifndef STRATA_XFER_GPU
    if (kind == ST_XFER_DEVICE)
        return ST_FAIL(ST_ERR_UNSUPPORTED, "xfer: device regions need the CUDA build");
#endif
    st_xfer_region_t *r = region_new(kind, true);
    if (!r) return ST_FAIL(ST_ERR_NO_MEMORY, "xfer: region");
    r->bytes = bytes;
    st_status_t rc = st_random_bytes(&r->nonce, sizeof r->nonce);
    if (!rc) {
#ifdef STRATA_XFER_GPU
        rc = kind == ST_XFER_HOST ? shm_create(r) : st_xfer__dev_create(r);
#else
        rc = shm_create(r);
#endif
    }
    if (rc) {
        region_free(r);
        return rc;
    }
    *out = r;
    return ST_OK;
}

st_status_t st_xfer_region_export(const st_xfer_region_t *r, uint8_t handle[ST_XFER_HANDLE_BYTES]) {
    if (!r->owner) return ST_FAIL(ST_ERR_INVALID_ARG, "xfer: export of a region opened from a peer (%s)", label_of(r));
    memset(handle, 0, ST_XFER_HANDLE_BYTES);
    put_u32(handle, XFER_MAGIC);
    put_u16(handle + 4, XFER_VERSION);
    put_u16(handle + 6, (uint16_t)r->kind);
    put_u64(handle + 8, (uint64_t)r->bytes);
    put_u64(handle + 16, r->nonce);
    if (r->kind == ST_XFER_HOST) memcpy(handle + 32, r->name, strlen(r->name));
    else memcpy(handle + 32, r->dev_ipc, sizeof r->dev_ipc);
    return ST_OK;
}

static bool name_ok(const char *n, size_t cap) {
    size_t pl = strlen(XFER_NAME_PREFIX);
    if (strnlen(n, cap) != pl + 32 || strncmp(n, XFER_NAME_PREFIX, pl) != 0) return false;
    for (size_t i = pl; i < pl + 32; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return false;
    return true;
}

static st_status_t shm_open_peer(st_xfer_region_t *r) {
    int fd = shm_open(r->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return ST_FAIL(errno == ENOENT ? ST_ERR_PEER : ST_ERR_IO, "xfer: shm_open %s: %s (the peer's region is gone "
                       "or already opened)", r->name, strerror(errno));
    st_status_t rc = ST_OK;
    struct stat st;
    r->map_bytes = XFER_PAGE + page_up(r->bytes);
    if (fstat(fd, &st) != 0) {
        rc = ST_FAIL(ST_ERR_IO, "xfer: fstat %s: %s", r->name, strerror(errno));
        goto err_close;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0 || (size_t)st.st_size != r->map_bytes) {
        rc = ST_FAIL(ST_ERR_PROTOCOL, "xfer: %s is owned by uid %u mode %03o size %lld, want uid %u mode 0600 size %zu",
                     r->name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (long long)st.st_size,
                     (unsigned)geteuid(), r->map_bytes);
        goto err_close;
    }
    void *m = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = ST_FAIL(ST_ERR_NO_MEMORY, "xfer: mmap %zu bytes of %s: %s", r->map_bytes, r->name, strerror(errno));
        goto err_close;
    }
    close(fd);
    xfer_shm_hdr_t *h = m;
    uint32_t zero = 0;
    if (h->magic != XFER_MAGIC || h->version != XFER_VERSION || h->nonce != r->nonce || h->bytes != r->bytes) {
        rc = ST_FAIL(ST_ERR_PROTOCOL, "xfer: %s does not match its handle (magic %08x, version %u, %llu bytes)",
                     r->name, h->magic, h->version, (unsigned long long)h->bytes);
        goto err_unmap;
    }
    if (!__atomic_compare_exchange_n(&h->opened, &zero, 1u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        rc = ST_FAIL(ST_ERR_PEER, "xfer: %s was already opened by another process", r->name);
        goto err_unmap;
    }
    h->pidns[1] = self_pidns();
    __atomic_store_n(&h->pid[1], (int32_t)getpid(), __ATOMIC_RELEASE);
    /* both sides have it mapped: the name goes (a crash from here on leaves nothing in /dev/shm) */
    shm_unlink(r->name);
    r->map = m;
    return ST_OK;
err_unmap:
    munmap(m, r->map_bytes);
    return rc;
err_close:
    close(fd);
    return rc;
}

st_status_t st_xfer_region_open(const uint8_t *handle, size_t len, size_t min_bytes, st_xfer_region_t **out) {
    if (!handle || len != ST_XFER_HANDLE_BYTES)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer: handle of %zu bytes, want %d", len, ST_XFER_HANDLE_BYTES);
    uint32_t magic = get_u32(handle);
    uint16_t ver = get_u16(handle + 4), kind = get_u16(handle + 6);
    uint64_t bytes = get_u64(handle + 8), nonce = get_u64(handle + 16);
    bool zero = get_u64(handle + 24) == 0;
    for (int i = 96; i < ST_XFER_HANDLE_BYTES; i++) zero = zero && handle[i] == 0;
    if (magic != XFER_MAGIC || ver != XFER_VERSION || !zero)
        return ST_FAIL(ST_ERR_PROTOCOL, "xfer: not a region handle (magic %08x, version %u)", magic, ver);
    if (kind != ST_XFER_HOST && kind != ST_XFER_DEVICE)
        return ST_FAIL(ST_ERR_PROTOCOL, "xfer: handle of unknown kind %u", kind);
    if (bytes == 0 || bytes > ST_XFER_MAX_BYTES || bytes < min_bytes)
        return ST_FAIL(ST_ERR_PROTOCOL, "xfer: handle for %llu bytes (need %zu .. %zu)", (unsigned long long)bytes,
                       min_bytes, ST_XFER_MAX_BYTES);
#ifndef STRATA_XFER_GPU
    if (kind == ST_XFER_DEVICE) return ST_FAIL(ST_ERR_UNSUPPORTED, "xfer: device regions need the CUDA build");
#endif
    st_xfer_region_t *r = region_new((st_xfer_kind_t)kind, false);
    if (!r) return ST_FAIL(ST_ERR_NO_MEMORY, "xfer: region");
    r->bytes = (size_t)bytes;
    r->nonce = nonce;
    st_status_t rc;
    if (kind == ST_XFER_HOST) {
        memcpy(r->name, handle + 32, XFER_NAME_MAX);
        size_t n = strnlen(r->name, XFER_NAME_MAX);
        bool ok = n < XFER_NAME_MAX && name_ok(r->name, XFER_NAME_MAX);
        for (size_t i = n; ok && i < XFER_NAME_MAX; i++) ok = r->name[i] == 0;
        rc = ok ? shm_open_peer(r) : ST_FAIL(ST_ERR_PROTOCOL, "xfer: handle with a malformed shared-memory name");
    } else {
#ifdef STRATA_XFER_GPU
        rc = st_xfer__dev_open(r, handle + 32);
#else
        rc = ST_ERR_UNSUPPORTED; /* refused above */
#endif
    }
    if (rc) {
        region_free(r);
        return rc;
    }
    *out = r;
    return ST_OK;
}

void st_xfer_region_destroy(st_xfer_region_t *r) {
    if (!r) return;
    if (r->kind == ST_XFER_HOST) {
#ifdef STRATA_XFER_GPU
        st_xfer__gpu_unmap(r);
#endif
        if (r->map) munmap(r->map, r->map_bytes);
        /* a peer that never opened it leaves the name: ours to remove (ENOENT once the peer did) */
        if (r->owner && r->name[0]) shm_unlink(r->name);
    } else {
#ifdef STRATA_XFER_GPU
        st_xfer__dev_close(r);
#endif
    }
    region_free(r);
}

void st_xfer_region_label(st_xfer_region_t *r, const char *label) {
    snprintf(r->label, sizeof r->label, "%s", label ? label : "");
}

void *st_xfer_region_ptr(const st_xfer_region_t *r) {
    return r->kind == ST_XFER_HOST ? (void *)(r->map + XFER_PAGE) : (void *)(r->dev_base + XFER_DEV_HDR);
}
size_t st_xfer_region_bytes(const st_xfer_region_t *r) { return r->bytes; }
st_xfer_kind_t st_xfer_region_kind(const st_xfer_region_t *r) { return r->kind; }

void st_xfer_region_abort(st_xfer_region_t *r, const char *why) {
    pthread_mutex_lock(&r->mu);
    if (!__atomic_load_n(&r->aborted, __ATOMIC_RELAXED)) {
        snprintf(r->why, sizeof r->why, "%s", why ? why : "aborted");
        __atomic_store_n(&r->aborted, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---------------- host backend ---------------- */

static st_status_t host_check(const st_xfer_region_t *r, size_t off, size_t bytes, const char *what) {
    if (r->kind != ST_XFER_HOST)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer %s: region of %s is not a host region", what, label_of(r));
    if (off > r->bytes || bytes > r->bytes - off)
        return ST_FAIL(ST_ERR_OUT_OF_RANGE, "xfer %s: [%zu, +%zu) outside the %zu bytes of %s's region", what, off,
                       bytes, r->bytes, label_of(r));
    return ST_OK;
}

static inline uint32_t *flag_at(const st_xfer_region_t *r, size_t off) {
    return (uint32_t *)(r->map + XFER_PAGE + off);
}

static st_status_t flag_check(const st_xfer_region_t *r, size_t off, const char *what) {
    if (off % ST_XFER_FLAG_BYTES)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer %s: flag offset %zu is not 8-byte aligned", what, off);
    return host_check(r, off, ST_XFER_FLAG_BYTES, what);
}

st_status_t st_xfer_put_host(st_xfer_region_t *r, size_t off, const void *src, size_t bytes) {
    st_status_t rc = host_check(r, off, bytes, "put");
    if (rc == ST_OK && bytes) memcpy(r->map + XFER_PAGE + off, src, bytes);
    return rc;
}

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    /* NOTE: not FUTEX_PRIVATE_FLAG: the word is in a mapping shared with another process */
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

st_status_t st_xfer_signal_host(st_xfer_region_t *r, size_t flag_off, uint32_t seq) {
    st_status_t rc = flag_check(r, flag_off, "signal");
    if (rc) return rc;
    uint32_t *f = flag_at(r, flag_off);
    /* NOTE: Dekker pair with the waiter: we store seq then read the sleeper count, it raises the count
     * then reads seq (all seq_cst), so either it sees seq or we see it and wake it */
    st_flag_signal(f, seq, NULL);
    if (__atomic_load_n(&f[1], __ATOMIC_SEQ_CST)) futex(f, FUTEX_WAKE, INT_MAX, NULL);
    return ST_OK;
}

bool st_xfer_test_host(const st_xfer_region_t *r, size_t flag_off, uint32_t seq) {
    if (r->kind != ST_XFER_HOST || flag_off % ST_XFER_FLAG_BYTES || flag_off + ST_XFER_FLAG_BYTES > r->bytes)
        return false;
    return st_flag_met(flag_at(r, flag_off), seq, NULL);
}

/* ST_OK while the peer may be alive; ST_ERR_PEER (logged) once its process exited. The peer's pid is
 * only trusted inside our own pid namespace; elsewhere the deadline is the only bound. */
static st_status_t peer_check(st_xfer_region_t *r, bool quiet) {
    const xfer_shm_hdr_t *h = (const xfer_shm_hdr_t *)r->map;
    int side = r->owner ? 1 : 0; /* the peer's slot */
    st_status_t rc = ST_OK;
    pthread_mutex_lock(&r->mu);
    if (r->peer_pid == 0) {
        int32_t pid = __atomic_load_n(&h->pid[side], __ATOMIC_ACQUIRE);
        if (pid > 0 && h->pidns[side] != 0 && h->pidns[side] == self_pidns()) {
            r->peer_pid = pid;
            r->peer_fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
            if (r->peer_fd < 0 && errno == ESRCH) r->peer_pid = -pid; /* gone already */
        }
    }
    bool dead = r->peer_pid < 0;
    if (!dead && r->peer_pid > 0) {
        if (r->peer_fd >= 0) {
            struct pollfd p = {.fd = r->peer_fd, .events = POLLIN};
            dead = poll(&p, 1, 0) > 0; /* a pidfd polls readable once the process exited (before it is reaped) */
        } else {
            dead = kill(r->peer_pid, 0) != 0 && errno == ESRCH; /* no pidfd_open (kernel < 5.3) */
        }
        if (dead) r->peer_pid = -r->peer_pid;
    }
    if (dead && quiet)
        rc = ST_REJECT(ST_ERR_PEER, "xfer wait: %s (process %d) exited", label_of(r), -r->peer_pid);
    else if (dead)
        rc = ST_FAIL(ST_ERR_PEER, "xfer wait: %s (process %d) exited", label_of(r), -r->peer_pid);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static st_status_t aborted_status(st_xfer_region_t *r, bool quiet) {
    pthread_mutex_lock(&r->mu);
    st_status_t rc = quiet ? ST_REJECT(ST_ERR_PEER, "xfer wait: %s: %s", label_of(r), r->why)
                           : ST_FAIL(ST_ERR_PEER, "xfer wait: %s: %s", label_of(r), r->why);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void st_xfer_set_spin(bool gpu_role) {
    long us = st_tun_int(ST_TUN_XFER_SPIN_US);
    g_spin_ns = (uint64_t)(us >= 0 ? us : gpu_role ? 2000 : 30) * 1000u;
}

uint64_t st_xfer_spin_ns(void) { return g_spin_ns; }

st_status_t st_xfer_wait_host(st_xfer_region_t *r, size_t flag_off, uint32_t seq, int timeout_ms) {
    return st_xfer__wait_host(r, flag_off, seq, timeout_ms, false, g_spin_ns);
}

st_status_t st_xfer__wait_host(st_xfer_region_t *r, size_t flag_off, uint32_t seq, int timeout_ms, bool quiet,
                               uint64_t spin_ns) {
    st_status_t rc = flag_check(r, flag_off, "wait");
    if (rc) return rc;
    if (timeout_ms <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "xfer wait: timeout %d ms (every wait is bounded)", timeout_ms);
    uint32_t *f = flag_at(r, flag_off);
    if (st_flag_met(f, seq, NULL)) return ST_OK;
    uint64_t t0 = st_time_ns(), deadline = t0 + (uint64_t)timeout_ms * 1000000u;
    if (spin_ns > deadline - t0) spin_ns = deadline - t0; /* no spin past the wait's bound */
    if (!__atomic_load_n(&r->aborted, __ATOMIC_ACQUIRE) && st_flag_wait(f, seq, NULL, spin_ns, NULL)) return ST_OK;
    for (uint64_t cur = XFER_SLICE_NS;; cur = quiet && 2 * cur <= XFER_IDLE_SLICE_NS ? 2 * cur : cur) {
        if (st_flag_met(f, seq, NULL)) return ST_OK; /* met before the peer died or the abort: the data is there */
        if (__atomic_load_n(&r->aborted, __ATOMIC_ACQUIRE)) return aborted_status(r, quiet);
        if ((rc = peer_check(r, quiet)) != ST_OK) return rc;
        uint64_t now = st_time_ns();
        if (now >= deadline && quiet) /* an idle poll's timeout: recorded, logged at DEBUG only */
            return ST_REJECT(ST_ERR_TIMEOUT, "xfer wait: nothing from %s within %d ms", label_of(r), timeout_ms);
        if (now >= deadline)
            return ST_FAIL(ST_ERR_TIMEOUT, "xfer wait: %s did not signal within %d ms (flag at %zu is %u, want %u)",
                           label_of(r), timeout_ms, flag_off, __atomic_load_n(f, __ATOMIC_ACQUIRE), seq);
        uint64_t left = deadline - now, slice = left < cur ? left : cur;
        struct timespec ts = {.tv_sec = (time_t)(slice / 1000000000u), .tv_nsec = (long)(slice % 1000000000u)};
        __atomic_add_fetch(&f[1], 1u, __ATOMIC_SEQ_CST);
        uint32_t v = __atomic_load_n(f, __ATOMIC_SEQ_CST);
        if ((int32_t)(v - seq) < 0) futex(f, FUTEX_WAIT, v, &ts); /* EAGAIN if it moved, ETIMEDOUT, EINTR: all loop */
        __atomic_sub_fetch(&f[1], 1u, __ATOMIC_SEQ_CST);
    }
}
