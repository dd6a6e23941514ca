/* common/xfer channels (strata/xfer.h): request/reply slots in one host region, a doorbell, and the
 * per-slot flags; the waits are the host backend's (spin, then futex). Byte map of the region's user
 * bytes (little-endian):
 *   0     header: u32 magic CHAN_MAGIC ("STXC"), u32 n_slots, u64 req_cap, u64 rep_cap (creator, before export)
 *   64    doorbell flag: requests posted so far (client → server)
 *   128   n_slots control blocks of 64 bytes: +0 request flag, +8 reply flag (both: the slot's request
 *         count), +16 u32 request header bytes, +20 u32 reply header bytes, +24 u64 request payload
 *         bytes, +32 u64 reply payload bytes, +40 u64 request posted at, +48 u64 reply sent at (ns of
 *         CLOCK_MONOTONIC, one clock on one host) (each written before its flag)
 *   data  (256-aligned) n_slots × stride: request header [ST_XFER_MSG_HDR], request payload
 *         [A(req_cap)], reply header [ST_XFER_MSG_HDR], reply payload [A(rep_cap)]; A rounds up to 256 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xfer_impl.h"

#define CHAN_MAGIC 0x43585453u
#define CHAN_DOORBELL 64u
#define CHAN_CTL 128u
#define CHAN_CTL_BYTES 64u

struct st_xfer_chan {
    st_xfer_region_t *r;
    uint8_t *base; /* the region's user bytes */
    uint32_t n;
    size_t req_cap, rep_cap, stride, data;
    uint32_t *count;   /* per slot: requests posted (client) or taken (server) */
    uint8_t *pending;  /* client: posted, reply not taken yet */
    uint32_t doorbell; /* client: posts so far; server: requests taken so far */
    uint64_t t_taken;  /* server: when st_xfer_chan_next last returned a request (ns; 0: never) */
};

static size_t a256(size_t n) { return (n + 255) & ~(size_t)255; }

/* layout for n slots; 0 when it does not fit ST_XFER_MAX_BYTES */
static size_t layout(uint32_t n, size_t req_cap, size_t rep_cap, size_t *stride, size_t *data) {
    if (n == 0 || n > ST_XFER_CHAN_MAX_SLOTS || req_cap > ST_XFER_MAX_BYTES || rep_cap > ST_XFER_MAX_BYTES) return 0;
    size_t st = 2 * ST_XFER_MSG_HDR + a256(req_cap) + a256(rep_cap), d = a256(CHAN_CTL + (size_t)n * CHAN_CTL_BYTES);
    if (st > (ST_XFER_MAX_BYTES - d) / n) return 0;
    *stride = st;
    *data = d;
    return d + st * n;
}

static inline uint8_t *ctl(const st_xfer_chan_t *c, uint32_t s) { return c->base + CHAN_CTL + (size_t)s * CHAN_CTL_BYTES; }
static inline size_t req_flag(uint32_t s) { return CHAN_CTL + (size_t)s * CHAN_CTL_BYTES; }
static inline size_t rep_flag(uint32_t s) { return req_flag(s) + 8; }
static inline uint8_t *req_hdr(const st_xfer_chan_t *c, uint32_t s) { return c->base + c->data + (size_t)s * c->stride; }
static inline uint8_t *rep_hdr(const st_xfer_chan_t *c, uint32_t s) {
    return req_hdr(c, s) + ST_XFER_MSG_HDR + a256(c->req_cap);
}

static const char *chan_label(const st_xfer_chan_t *c) { return c->r->label[0] ? c->r->label : "peer"; }

static st_status_t chan_new(st_xfer_region_t *r, uint32_t n, size_t req_cap, size_t rep_cap, st_xfer_chan_t **out) {
    st_xfer_chan_t *c = calloc(1, sizeof *c);
    uint32_t *count = calloc(n, sizeof *count);
    uint8_t *pending = calloc(n, 1);
    if (!c || !count || !pending) {
        free(c), free(count), free(pending);
        return ST_FAIL(ST_ERR_NO_MEMORY, "xfer channel of %u slots", n);
    }
    *c = (st_xfer_chan_t){.r = r, .base = st_xfer_region_ptr(r), .n = n, .req_cap = req_cap, .rep_cap = rep_cap,
                          .count = count, .pending = pending};
    layout(n, req_cap, rep_cap, &c->stride, &c->data);
    *out = c;
    return ST_OK;
}

st_status_t st_xfer_chan_create(uint32_t n_slots, size_t req_cap, size_t rep_cap, st_xfer_chan_t **out) {
    size_t stride, data, bytes = layout(n_slots, req_cap, rep_cap, &stride, &data);
    if (!bytes)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer channel: %u slots of %zu + %zu bytes (1 .. %u slots, %zu bytes in all)",
                       n_slots, req_cap, rep_cap, ST_XFER_CHAN_MAX_SLOTS, ST_XFER_MAX_BYTES);
    st_xfer_region_t *r = NULL;
    st_status_t rc = st_xfer_region_create(ST_XFER_HOST, bytes, &r);
    if (rc) return rc;
    uint8_t *b = st_xfer_region_ptr(r);
    uint32_t magic = CHAN_MAGIC;
    uint64_t rq = req_cap, rp = rep_cap;
    memcpy(b, &magic, 4), memcpy(b + 4, &n_slots, 4), memcpy(b + 8, &rq, 8), memcpy(b + 16, &rp, 8);
    rc = chan_new(r, n_slots, req_cap, rep_cap, out);
    if (rc) st_xfer_region_destroy(r);
    return rc;
}

st_status_t st_xfer_chan_export(const st_xfer_chan_t *c, uint8_t handle[ST_XFER_HANDLE_BYTES]) {
    return st_xfer_region_export(c->r, handle);
}

st_status_t st_xfer_chan_open(const uint8_t *handle, size_t len, st_xfer_chan_t **out) {
    st_xfer_region_t *r = NULL;
    st_status_t rc = st_xfer_region_open(handle, len, CHAN_CTL, &r);
    if (rc) return rc;
    const uint8_t *b = st_xfer_region_ptr(r);
    uint32_t magic, n;
    uint64_t rq, rp;
    size_t stride, data, need;
    memcpy(&magic, b, 4), memcpy(&n, b + 4, 4), memcpy(&rq, b + 8, 8), memcpy(&rp, b + 16, 8);
    need = magic == CHAN_MAGIC ? layout(n, (size_t)rq, (size_t)rp, &stride, &data) : 0;
    if (!need || need > st_xfer_region_bytes(r)) {
        rc = ST_FAIL(ST_ERR_PROTOCOL, "xfer channel: the region (%zu bytes) holds no channel layout (magic %08x, %u slots "
                     "of %llu + %llu bytes)", st_xfer_region_bytes(r), magic, n, (unsigned long long)rq, (unsigned long long)rp);
        st_xfer_region_destroy(r);
        return rc;
    }
    rc = chan_new(r, n, (size_t)rq, (size_t)rp, out);
    if (rc) st_xfer_region_destroy(r);
    return rc;
}

void st_xfer_chan_destroy(st_xfer_chan_t *c) {
    if (!c) return;
    st_xfer_region_destroy(c->r);
    free(c->count);
    free(c->pending);
    free(c);
}

void st_xfer_chan_label(st_xfer_chan_t *c, const char *label) { st_xfer_region_label(c->r, label); }
void st_xfer_chan_abort(st_xfer_chan_t *c, const char *why) { st_xfer_region_abort(c->r, why); }
uint32_t st_xfer_chan_slots(const st_xfer_chan_t *c) { return c->n; }
size_t st_xfer_chan_req_cap(const st_xfer_chan_t *c) { return c->req_cap; }
size_t st_xfer_chan_rep_cap(const st_xfer_chan_t *c) { return c->rep_cap; }

void *st_xfer_chan_req_buf(st_xfer_chan_t *c, uint32_t slot) {
    return slot < c->n ? req_hdr(c, slot) + ST_XFER_MSG_HDR : NULL;
}
void *st_xfer_chan_rep_buf(st_xfer_chan_t *c, uint32_t slot) {
    return slot < c->n ? rep_hdr(c, slot) + ST_XFER_MSG_HDR : NULL;
}

/* A message's header into its slot, and its lengths and send time into the slot's control words at
 * the given offsets (request and reply keep theirs side by side). */
static void put_meta(uint8_t *k, size_t o_hl, size_t o_pl, size_t o_t, uint8_t *hdr_dst, const void *hdr,
                     size_t hdr_len, size_t len) {
    uint32_t hl = (uint32_t)hdr_len;
    uint64_t pl = len, now = st_time_ns();
    if (hdr_len) memcpy(hdr_dst, hdr, hdr_len);
    memcpy(k + o_hl, &hl, 4), memcpy(k + o_pl, &pl, 8), memcpy(k + o_t, &now, 8);
}

st_status_t st_xfer_chan_post(st_xfer_chan_t *c, uint32_t slot, const void *hdr, size_t hdr_len, size_t len) {
    if (slot >= c->n || hdr_len > ST_XFER_MSG_HDR || len > c->req_cap || c->pending[slot])
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer channel post to %s: slot %u of %u (%s), header %zu bytes, payload %zu of %zu",
                       chan_label(c), slot, c->n, slot < c->n && c->pending[slot] ? "busy" : "free", hdr_len, len,
                       c->req_cap);
    put_meta(ctl(c, slot), 16, 24, 40, req_hdr(c, slot), hdr, hdr_len, len);
    c->pending[slot] = 1;
    /* NOTE: the slot's flag before the doorbell: a server that sees the doorbell finds the slot */
    st_status_t rc = st_xfer_signal_host(c->r, req_flag(slot), ++c->count[slot]);
    if (!rc) rc = st_xfer_signal_host(c->r, CHAN_DOORBELL, ++c->doorbell);
    return rc;
}

/* a view of a message whose lengths sit at k+hl_at / k+pl_at, checked against the caps */
static st_status_t view(const st_xfer_chan_t *c, uint32_t slot, bool reply, st_xfer_msg_t *m) {
    const uint8_t *k = ctl(c, slot);
    uint32_t hl;
    uint64_t pl, at;
    memcpy(&hl, k + (reply ? 20 : 16), 4); /* NOTE: read once: the peer could change them under us */
    memcpy(&pl, k + (reply ? 32 : 24), 8);
    memcpy(&at, k + (reply ? 48 : 40), 8);
    size_t cap = reply ? c->rep_cap : c->req_cap;
    if (hl > ST_XFER_MSG_HDR || pl > cap)
        return ST_FAIL(ST_ERR_PROTOCOL, "xfer channel: %s wrote a %s of %u + %llu bytes into slot %u (caps %u + %zu)",
                       chan_label(c), reply ? "reply" : "request", hl, (unsigned long long)pl, slot, ST_XFER_MSG_HDR, cap);
    const uint8_t *h = reply ? rep_hdr(c, slot) : req_hdr(c, slot);
    *m = (st_xfer_msg_t){.hdr = h, .hdr_len = hl, .payload = h + ST_XFER_MSG_HDR, .len = (size_t)pl, .sent_ns = at};
    return ST_OK;
}

st_status_t st_xfer_chan_wait_reply(st_xfer_chan_t *c, uint32_t slot, int timeout_ms, st_xfer_msg_t *m) {
    if (slot >= c->n || !c->pending[slot])
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer channel: no request pending in slot %u of %s", slot, chan_label(c));
    c->pending[slot] = 0;
    st_status_t rc = st_xfer_wait_host(c->r, rep_flag(slot), c->count[slot], timeout_ms);
    return rc ? rc : view(c, slot, true, m);
}

bool st_xfer_chan_reply_in(const st_xfer_chan_t *c, uint32_t slot) {
    return slot >= c->n || !c->pending[slot] || st_xfer_test_host(c->r, rep_flag(slot), c->count[slot]);
}

void st_xfer_chan_memory(const st_xfer_chan_t *c, void **p, size_t *n) {
    *p = c->r->map;
    *n = c->r->map_bytes;
}

#ifdef STRATA_XFER_GPU
st_status_t st_xfer_chan_gpu_map(st_xfer_chan_t *c) { return st_xfer_region_gpu_map(c->r); }
#endif

st_status_t st_xfer_chan_next(st_xfer_chan_t *c, int timeout_ms, uint32_t *slot, st_xfer_msg_t *m) {
    /* spin only within the data path's spin of the last request: an idle server's polls sleep at once */
    uint64_t now = st_time_ns(), spin = st_xfer_spin_ns();
    spin = c->t_taken && now - c->t_taken < spin ? spin - (now - c->t_taken) : 0;
    st_status_t rc = st_xfer__wait_host(c->r, CHAN_DOORBELL, c->doorbell + 1, timeout_ms, true, spin);
    if (rc) return rc;
    c->t_taken = st_time_ns();
    for (uint32_t s = 0; s < c->n; s++) {
        uint32_t posted = __atomic_load_n((const uint32_t *)(c->base + req_flag(s)), __ATOMIC_ACQUIRE);
        if (posted == c->count[s]) continue;
        if (posted != c->count[s] + 1)
            return ST_FAIL(ST_ERR_PROTOCOL, "xfer channel: %s posted slot %u as request %u after %u", chan_label(c), s,
                           posted, c->count[s]);
        c->count[s] = posted;
        c->doorbell++;
        rc = view(c, s, false, m);
        if (rc == ST_OK) *slot = s;
        return rc;
    }
    return ST_FAIL(ST_ERR_PROTOCOL, "xfer channel: %s rang the doorbell (%u) with no slot posted", chan_label(c),
                   c->doorbell + 1);
}

st_status_t st_xfer_chan_reply(st_xfer_chan_t *c, uint32_t slot, const void *hdr, size_t hdr_len, size_t len) {
    if (slot >= c->n || hdr_len > ST_XFER_MSG_HDR || len > c->rep_cap)
        return ST_FAIL(ST_ERR_INVALID_ARG, "xfer channel reply to %s: slot %u of %u, header %zu bytes, payload %zu of %zu",
                       chan_label(c), slot, c->n, hdr_len, len, c->rep_cap);
    put_meta(ctl(c, slot), 20, 32, 48, rep_hdr(c, slot), hdr, hdr_len, len);
    return st_xfer_signal_host(c->r, rep_flag(slot), c->count[slot]);
}

st_status_t st_xfer_host_id(char out[37]) {
    /* NOTE: a /proc file reports size 0, so it is read with read(2), not st_file_read_all */
    char b[64];
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ST_FAIL(ST_ERR_IO, "xfer: /proc/sys/kernel/random/boot_id: %s", strerror(errno));
    ssize_t n = read(fd, b, sizeof b);
    close(fd);
    while (n > 0 && (b[n - 1] == '\n' || b[n - 1] == ' ')) n--;
    if (n != 36) return ST_FAIL(ST_ERR_IO, "xfer: /proc/sys/kernel/random/boot_id holds %zd characters, want 36", n);
    memcpy(out, b, 36);
    out[36] = 0;
    return ST_OK;
}

_Static_assert(sizeof(st_xfer_hello_t) == 56, "hello byte map");

st_status_t st_xfer_hello_init(st_xfer_hello_t *h, uint32_t n_slots, uint64_t req_bytes) {
    st_xfer_hello_t x = {.magic = ST_XFER_HELLO_MAGIC, .n_slots = n_slots, .req_bytes = req_bytes};
    st_status_t rc = st_xfer_host_id(x.host);
    if (rc == ST_OK) *h = x;
    return rc;
}

st_status_t st_xfer_hello_check(const void *msg, size_t len, st_xfer_hello_t *out) {
    st_xfer_hello_t h;
    char me[37];
    if (len != sizeof h) return ST_FAIL(ST_ERR_PROTOCOL, "xfer hello of %zu bytes, want %zu", len, sizeof h);
    memcpy(&h, msg, sizeof h);
    if (h.magic != ST_XFER_HELLO_MAGIC || h.n_slots == 0 || h.n_slots > ST_XFER_CHAN_MAX_SLOTS || h.host[36] ||
        strlen(h.host) != 36 || h.pad[0] || h.pad[1] || h.pad[2])
        return ST_FAIL(ST_ERR_PROTOCOL, "xfer hello malformed (magic %08x, %u slots)", h.magic, h.n_slots);
    st_status_t rc = st_xfer_host_id(me);
    if (rc) return rc;
    if (strcmp(me, h.host) != 0) {
        st_err_set("xfer hello from another host (%s)", h.host);
        return ST_ERR_UNSUPPORTED;
    }
    *out = h;
    return ST_OK;
}
