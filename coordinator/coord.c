/* Coordinator (see coord.h). Everything runs on one libuv loop thread: gRPC (through common/rpc's
 * completion-queue hand-off), HTTP, the heartbeat sweep and the threshold steps. Nothing here is on
 * a step's critical path: workers never wait for the coordinator.
 *
 * Membership security (docs/security.md): member methods need the cluster token (checked by
 * common/rpc before a handler runs); a registration gets a random id and a random member token,
 * and is bound to the connection it came on; Heartbeat and ReportScores count only with both, on
 * that connection. Every field of every accepted message is range-checked before use. */
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "coord.h"
#include "coord_impl.h"

/* Bounds on what members may claim (far beyond any real deployment, small enough that sums and
 * casts cannot overflow). */
#define MAX_CAPACITY (1u << 20)     /* sequences (workers) or rows (expert servers) */
#define MAX_INFLIGHT (1u << 24)
#define MAX_UCX_ADDRESS 4096u
#define MAX_STEP_LOAD (1u << 30)    /* tokens routed to one expert in one step */
#define MAX_STEP_BYTES (1ull << 40) /* dispatch / reply bytes in one step */
#define MAX_STEP_MESSAGES (1ull << 32)
#define MAX_STAGE_S 3600.0          /* seconds one stage of one step may take */
#define MAX_STEP (1ull << 53)       /* step counters (shown as JSON integers) */

/* ================================================================ members and placement */

member_t *st_coord_member_find(coord_t *co, uint64_t id) {
    if (id == 0) return NULL;
    for (int i = 0; i < co->n_members; i++)
        if (co->members[i].id == id) return &co->members[i];
    return NULL;
}

static int alive_count(const coord_t *co, st_proto_role_t role) {
    int n = 0;
    for (int i = 0; i < co->n_members; i++) n += co->members[i].alive && co->members[i].role == role;
    return n;
}

/* Ready means "can serve": the first time, the expected members are all there (so a starting
 * cluster is ready as a whole); after that, an attention worker is alive and every expert has a
 * live holder, whatever was lost since. */
int st_coord_ready(coord_t *co) {
    int can = st_placement_complete(&co->place) && alive_count(co, ST_PROTO_ROLE_ATTENTION) >= 1 &&
              alive_count(co, ST_PROTO_ROLE_EXPERT) >= 1;
    if (!co->was_ready)
        co->was_ready = can && alive_count(co, ST_PROTO_ROLE_ATTENTION) >= co->o.expect_workers &&
                        alive_count(co, ST_PROTO_ROLE_EXPERT) >= co->o.expect_experts;
    return co->was_ready && can;
}

static const char *role_name(st_proto_role_t r) {
    return r == ST_PROTO_ROLE_EXPERT ? "expert server" : "attention worker";
}

/* The host part of a "host:port" endpoint, as a nonzero number (FNV-1a): servers of one machine
 * share it, and placement keeps an expert's replicas on different ones. */
static uint32_t endpoint_host(const char *ep) {
    const char *c = strrchr(ep, ':');
    size_t n = c ? (size_t)(c - ep) : strlen(ep);
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)ep[i]) * 16777619u;
    return h ? h : 1;
}

static void replace_experts(coord_t *co) {
    st_place_server_t live[MAX_MEMBERS];
    int n = 0;
    for (int i = 0; i < co->n_members; i++)
        if (co->members[i].alive && co->members[i].role == ST_PROTO_ROLE_EXPERT)
            live[n++] = (st_place_server_t){.id = co->members[i].id, .capacity = 0, .host = endpoint_host(co->members[i].endpoint)};
    uint64_t v = co->place.version;
    double t0 = st_time_sec();
    st_placement_update(&co->place, live, n);
    co->place_s_last = st_time_sec() - t0;
    co->place_s_max = co->place_s_last > co->place_s_max ? co->place_s_last : co->place_s_max;
    if (co->place.version != v)
        st_log_info("coordinator: placement v%llu over %d expert servers (%s) in %.1f ms", (unsigned long long)co->place.version, n,
                    st_placement_complete(&co->place) ? "complete" : "INCOMPLETE", 1e3 * co->place_s_last);
}

/* The member is gone (missed heartbeats, or replaced by its own re-registration): no new work, its
 * requests end, its channel goes once nothing uses it. The entry stays (dead, listed in /status)
 * until the sweep forgets it. The caller re-places experts. */
static void member_drop(coord_t *co, member_t *m) {
    m->alive = 0;
    m->dead_at = st_time_sec();
    m->reported = 0;
    if (m->role == ST_PROTO_ROLE_ATTENTION) st_coord_worker_lost(co, m->id);
    if (m->ch && m->active == 0) {
        st_rpc_channel_destroy(m->ch);
        m->ch = NULL;
    }
}

/* Remove entry i (dead, nothing proxied through it): the last entry moves into its place. The
 * load buffers are swapped, not copied: each slot keeps one buffer for the process's life. */
static void member_remove(coord_t *co, int i) {
    member_t *m = &co->members[i], *last = &co->members[co->n_members - 1];
    if (m->ch) st_rpc_channel_destroy(m->ch);
    m->ch = NULL;
    if (m != last) {
        member_t t = *m;
        *m = *last;
        *last = t;
    }
    co->n_members--;
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void on_sweep(uv_timer_t *t) {
    coord_t *co = t->data;
    double now = st_time_sec(), hb = co->o.heartbeat_ms / 1000.0, limit = 2.0 * hb;
    double forget = MEMBER_FORGET_BEATS * hb;
    int changed = 0, experts = 0;
    /* NOTE: silence counts only while this loop listened. After a stall (this process starved of
     * CPU, or a long callback) the timers run before the heartbeats that arrived meanwhile are
     * handled (libuv runs timers first), so a member is judged from when the loop ran on time again. */
    if (co->sweep_last == 0 || now - co->sweep_last > hb) co->listening_since = now;
    co->sweep_last = now;
    for (int i = 0; i < co->n_members; i++) {
        member_t *m = &co->members[i];
        if (!m->alive || now - fmax(m->last_seen, co->listening_since) <= limit) continue;
        st_log_warn("coordinator: %s %s (%llu, %s) missed two heartbeats: dropped", role_name(m->role), m->name,
                    (unsigned long long)m->id, m->endpoint);
        experts |= m->role == ST_PROTO_ROLE_EXPERT;
        member_drop(co, m);
        changed = 1;
    }
    /* the MEMBER_KEEP_DEAD most recently dead stay a while (operators look for them in /status) */
    double dead[MAX_MEMBERS], keep_from = -1.0;
    int n_dead = 0;
    for (int i = 0; i < co->n_members; i++)
        if (!co->members[i].alive) dead[n_dead++] = co->members[i].dead_at;
    if (n_dead > MEMBER_KEEP_DEAD) {
        qsort(dead, (size_t)n_dead, sizeof dead[0], cmp_desc);
        keep_from = dead[MEMBER_KEEP_DEAD - 1];
    }
    for (int i = co->n_members - 1; i >= 0; i--) { /* backwards: removal moves the last entry here */
        member_t *m = &co->members[i];
        if (m->alive || m->active > 0) continue;
        if (m->ch) {
            st_rpc_channel_destroy(m->ch);
            m->ch = NULL;
        }
        double age = now - m->dead_at;
        if ((age > forget && m->dead_at < keep_from) || age > MEMBER_KEEP_DEAD_S) {
            st_log_debug("coordinator: forgetting dead member %llu (%s)", (unsigned long long)m->id, m->name);
            member_remove(co, i);
        }
    }
    if (experts) replace_experts(co);
    if (changed) st_coord_queue_pump(co);
}

/* ---- checks of what members send ---- */

static int printable(const char *s, size_t max) { /* 1..max visible ASCII characters, no spaces */
    size_t n = 0;
    for (; s && s[n]; n++)
        if ((unsigned char)s[n] <= 0x20 || (unsigned char)s[n] >= 0x7f || n >= max) return 0;
    return n > 0;
}

static int endpoint_ok(const char *s, size_t max) { /* host:port, port 1..65535 */
    if (!printable(s, max)) return 0;
    const char *c = strrchr(s, ':');
    if (!c || c == s || !c[1] || strlen(c + 1) > 5) return 0;
    long port = 0;
    for (const char *p = c + 1; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        port = port * 10 + (*p - '0');
    }
    return port >= 1 && port <= 65535;
}

static st_status_t check_register(const st_proto_register_req_t *r) {
    if (r->role != ST_PROTO_ROLE_ATTENTION && r->role != ST_PROTO_ROLE_EXPERT)
        return ST_REJECT(ST_ERR_INVALID_ARG, "register: unknown role %d", (int)r->role);
    if (!printable(r->name, sizeof ((member_t *)0)->name - 1))
        return ST_REJECT(ST_ERR_INVALID_ARG, "register: name must be 1..%zu visible ASCII characters",
                         sizeof ((member_t *)0)->name - 1);
    if (!endpoint_ok(r->data_endpoint, sizeof ((member_t *)0)->endpoint - 1))
        return ST_REJECT(ST_ERR_INVALID_ARG, "register: data_endpoint must be host:port (port 1..65535, at most %zu characters)",
                         sizeof ((member_t *)0)->endpoint - 1);
    if (r->capacity > MAX_CAPACITY || (r->role == ST_PROTO_ROLE_ATTENTION && r->capacity == 0))
        return ST_REJECT(ST_ERR_INVALID_ARG, "register: capacity %u outside %u..%u", r->capacity,
                         r->role == ST_PROTO_ROLE_ATTENTION ? 1u : 0u, MAX_CAPACITY);
    if (r->ucx_address_len > MAX_UCX_ADDRESS)
        return ST_REJECT(ST_ERR_INVALID_ARG, "register: ucx_address of %zu bytes > %u", r->ucx_address_len, MAX_UCX_ADDRESS);
    return ST_OK;
}

static const char *call_peer(st_rpc_call_t *call) {
    const char *p = st_rpc_call_peer(call);
    return p ? p : "";
}

static void peer_hash(st_rpc_call_t *call, uint8_t out[32]) { /* any length of peer name */
    const char *p = call_peer(call);
    st_sha256(p, strlen(p), out);
}

/* The live member that id + token name, if the call came on the connection that registered it;
 * NULL otherwise (with why). Token compared in constant time. */
static member_t *member_auth(coord_t *co, st_rpc_call_t *call, uint64_t id, const char *token, const char **why) {
    member_t *m = st_coord_member_find(co, id);
    *why = NULL;
    if (!m) *why = "unknown member id";
    else if (strlen(token) != ST_PROTO_TOKEN_LEN || !st_ct_equal(token, m->token, ST_PROTO_TOKEN_LEN))
        *why = "wrong member token";
    else {
        uint8_t h[32];
        peer_hash(call, h);
        if (!st_ct_equal(h, m->peer_hash, sizeof h)) *why = "not the connection that registered";
    }
    return *why ? NULL : m;
}

/* A random id no entry has (never 0; below 2^53, so /status's JSON carries it exactly to any client,
 * JavaScript's included, and never as a negative number) and a 128-bit token. */
static st_status_t new_identity(coord_t *co, uint64_t *id, char token[ST_PROTO_TOKEN_LEN + 1]) {
    uint8_t t[ST_PROTO_TOKEN_LEN / 2];
    uint64_t v = 0;
    for (int tries = 0; v == 0 || st_coord_member_find(co, v); tries++) {
        if (tries > 16 || st_random_bytes(&v, sizeof v) != ST_OK)
            return ST_FAIL(ST_ERR_INTERNAL, "register: no randomness for a member id");
        v &= (1ull << 53) - 1;
    }
    if (st_random_bytes(t, sizeof t) != ST_OK) return ST_FAIL(ST_ERR_INTERNAL, "register: no randomness for a member token");
    st_hex(t, sizeof t, token);
    *id = v;
    return ST_OK;
}

/* A slot for a new registration: a never-used one, else the longest-dead entry with nothing
 * proxied through it. NULL when every entry is alive or busy. */
static member_t *member_slot(coord_t *co) {
    if (co->n_members < MAX_MEMBERS) return &co->members[co->n_members++];
    member_t *best = NULL;
    for (int i = 0; i < co->n_members; i++) {
        member_t *m = &co->members[i];
        if (!m->alive && m->active == 0 && (!best || m->dead_at < best->dead_at)) best = m;
    }
    return best;
}

static void worker_sec(const coord_t *co, const char *token, st_rpc_sec_t *out) {
    const st_sec_opts_t *sec = co->o.sec;
    *out = (st_rpc_sec_t){.token = token};
    if (!sec) return;
    /* the worker serves TLS when the cluster does; this certificate doubles as the client one */
    out->tls = sec->tls || sec->tls_cert;
    out->tls_ca = sec->tls_ca;
    out->tls_cert = sec->tls_cert;
    out->tls_key = sec->tls_key;
}

/* ================================================================ gRPC: membership */

static void reply_msg(st_rpc_call_t *call, st_status_t s, uint8_t *buf, size_t len) {
    if (s == ST_OK) st_rpc_call_reply(call, buf, len);
    else st_rpc_call_finish(call, s, st_err_last());
    free(buf);
}

static void h_register(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    st_proto_register_req_t r;
    if (st_proto_register_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        return;
    }
    st_status_t s = check_register(&r);
    uint64_t id = 0, old_id = 0;
    char token[ST_PROTO_TOKEN_LEN + 1] = "";
    if (s == ST_OK) s = new_identity(co, &id, token);
    member_t *m = NULL;
    if (s == ST_OK) {
        /* the same member again (restarted, or its connection changed): it replaces its old entry */
        for (int i = 0; i < co->n_members; i++) {
            member_t *o = &co->members[i];
            if (o->role != r.role || strcmp(o->name, r.name) != 0 || strcmp(o->endpoint, r.data_endpoint) != 0) continue;
            if (o->alive) {
                old_id = o->id;
                member_drop(co, o);
            }
            if (o->active == 0 && !m) m = o; /* a busy one stays, dead, until its requests end */
        }
        if (!m) m = member_slot(co);
        if (!m)
            s = ST_REJECT(ST_ERR_CAPACITY, "register: member table full (%d live or busy members); none can be recycled "
                          "until one misses its heartbeats", MAX_MEMBERS);
    }
    if (s == ST_OK) {
        if (m->ch) st_rpc_channel_destroy(m->ch);
        uint32_t *load = m->load; /* sized at start-up, kept across registrations */
        memset(m, 0, sizeof *m);
        m->load = load;
        if (r.role == ST_PROTO_ROLE_ATTENTION) /* expert servers never use theirs (untouched pages) */
            memset(load, 0, sizeof(uint32_t) * (size_t)co->cfg.n_layers * co->cfg.n_experts);
        m->id = id;
        memcpy(m->token, token, sizeof m->token);
        peer_hash(call, m->peer_hash);
        m->role = r.role;
        snprintf(m->name, sizeof m->name, "%s", r.name);
        snprintf(m->endpoint, sizeof m->endpoint, "%s", r.data_endpoint);
        m->capacity = r.capacity;
        m->alive = 1;
        m->last_seen = st_time_sec();
        m->registered_at = m->last_seen;
        if (m->role == ST_PROTO_ROLE_ATTENTION) {
            st_rpc_sec_t ws;
            worker_sec(co, m->token, &ws);
            if (st_rpc_channel_create_ex(m->endpoint, &ws, &m->ch) != ST_OK) m->ch = NULL;
        }
        st_log_info("coordinator: %s %s registered as %llu at %s%s", role_name(m->role), m->name, (unsigned long long)m->id,
                    m->endpoint, old_id ? " (replacing its previous registration)" : "");
        if (m->role == ST_PROTO_ROLE_EXPERT) {
            st_placement_rename(&co->place, old_id, m->id); /* it keeps its experts */
            replace_experts(co);
        }
    }
    uint8_t *buf = NULL;
    size_t n = 0;
    if (s == ST_OK) {
        st_proto_register_reply_t rep = {.member_id = m->id, .heartbeat_interval_ms = co->o.heartbeat_ms,
                                         .placement_version = co->place.version, .threshold_version = co->tau_version};
        memcpy(rep.member_token, m->token, sizeof m->token);
        s = st_proto_register_reply_encode(&rep, &buf, &n);
    } else if (s != ST_ERR_INVALID_ARG) {
        st_log_every(ST_LOG_WARN, 5.0, "coordinator: registration of %s from %s refused: %s", r.name ? r.name : "?",
                     call_peer(call), st_err_last());
    }
    reply_msg(call, s, buf, n);
    if (s == ST_OK) st_coord_queue_pump(co); /* a worker's slots, or the experts a full map needs */
    st_proto_register_req_cleanup(&r);
}

static void h_heartbeat(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    st_proto_heartbeat_req_t r;
    if (st_proto_heartbeat_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        return;
    }
    if (r.inflight > MAX_INFLIGHT || r.step > MAX_STEP) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, "heartbeat: inflight or step out of range");
        return;
    }
    const char *why;
    member_t *m = member_auth(co, call, r.member_id, r.member_token, &why);
    if (!m)
        st_log_every(ST_LOG_WARN, 5.0, "coordinator: heartbeat for member %llu from %s ignored: %s",
                     (unsigned long long)r.member_id, call_peer(call), why);
    /* known = false: the member registers again (a real member whose connection changed does) */
    st_proto_heartbeat_reply_t rep = {.known = m && m->alive, .placement_version = co->place.version,
                                      .threshold_version = co->tau_version};
    int freed = 0;
    if (m && m->alive) {
        m->last_seen = st_time_sec();
        m->step = r.step;
        freed = m->role == ST_PROTO_ROLE_ATTENTION && r.inflight < m->inflight;
        m->inflight = r.inflight;
    }
    uint8_t *buf;
    size_t n;
    st_status_t es_ = st_proto_heartbeat_reply_encode(&rep, &buf, &n);
    reply_msg(call, es_, buf, n);
    if (freed) st_coord_queue_pump(co);
    st_proto_heartbeat_req_cleanup(&r);
}

static void h_placement(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    st_proto_version_req_t r;
    if (st_proto_version_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        return;
    }
    const st_config_t *c = &co->cfg;
    st_proto_placement_t p = {.version = co->place.version, .n_layers = (uint32_t)c->n_layers, .n_experts = (uint32_t)c->n_experts};
    uint8_t *buf = NULL;
    size_t n = 0;
    st_status_t s = ST_OK;
    if (r.known_version == co->place.version) {
        p.unchanged = 1;
    } else {
        size_t cells = (size_t)c->n_layers * c->n_experts;
        p.offsets = calloc(cells + 1, sizeof(uint32_t));
        p.member_ids = calloc(cells * co->place.replicas + 1, sizeof(uint64_t));
        p.members = calloc((size_t)co->n_members + 1, sizeof(st_proto_member_t));
        if (!p.offsets || !p.member_ids || !p.members) s = ST_FAIL(ST_ERR_NO_MEMORY, "placement reply");
        for (int l = 0; s == ST_OK && l < c->n_layers; l++)
            for (int e = 0; e < c->n_experts; e++) {
                size_t i = (size_t)l * c->n_experts + e;
                p.offsets[i + 1] = p.offsets[i];
                if (!st_config_is_moe_layer(c, l)) continue;
                const uint64_t *h = st_placement_holders(&co->place, l - c->first_k_dense, e);
                for (int q = 0; q < co->place.replicas; q++)
                    if (h[q]) p.member_ids[p.offsets[i + 1]++] = h[q];
            }
        p.n_member_ids = s == ST_OK ? p.offsets[cells] : 0;
        /* live members only: a dead entry is of no use to a worker and must not take its table slots */
        for (int i = 0; s == ST_OK && i < co->n_members; i++) {
            member_t *m = &co->members[i];
            if (!m->alive) continue;
            p.members[p.n_members++] = (st_proto_member_t){.member_id = m->id, .role = m->role, .name = m->name,
                                                           .data_endpoint = m->endpoint, .capacity = m->capacity, .alive = m->alive};
        }
    }
    if (s == ST_OK) s = st_proto_placement_encode(&p, &buf, &n);
    free(p.offsets);
    free(p.member_ids);
    free(p.members);
    reply_msg(call, s, buf, n);
    st_proto_version_req_cleanup(&r);
}

/* ================================================================ gRPC: thresholds */

/* The published table as the wire carries it, built once per version: tau for every layer (non-MoE
 * rows NaN) and rho only for the layers this version probes (a whole row is set or NaN). */
static void wire_table(coord_t *co, const st_qtable_t *q) {
    uint32_t E = q->n_experts, off = (uint32_t)co->cfg.first_k_dense;
    for (size_t i = 0; i < (size_t)off * E; i++) co->tau_all[i] = NAN;
    memcpy(co->tau_all + (size_t)off * E, q->tau, sizeof(float) * q->n_layers * E);
    co->n_rho_layers = 0;
    for (uint32_t l = 0; l < q->n_layers; l++) {
        const float *row = q->rho + (size_t)l * E;
        if (!st_qtau_is_set(row[0])) continue;
        memcpy(co->rho_all + (size_t)co->n_rho_layers * E, row, sizeof(float) * E);
        co->rho_layers[co->n_rho_layers++] = l + off;
    }
}

static void publish_thresholds(coord_t *co) {
    st_qtable_t t;
    double t0 = st_time_sec();
    st_status_t es = st_qstate_end_step(co->q, &t);
    co->merge_s += st_time_sec() - t0;
    co->merges++;
    if (es != ST_OK) {
        st_log_error("coordinator: threshold step failed: %s", st_err_last());
    } else {
        co->tau_version = t.version;
        co->tau_steps++;
        wire_table(co, &t);
    }
    co->tau_data = 0;
    for (int i = 0; i < co->n_members; i++) co->members[i].reported = 0;
}

static void on_tau_timer(uv_timer_t *t) {
    coord_t *co = t->data;
    if (co->tau_data) publish_thresholds(co);
}

/* Tests only (--test-reply-delay-ms): a reply held back on a timer, as a slow coordinator would
 * answer. The call may be cancelled meanwhile (client deadline, shutdown): then it is dropped. */
typedef struct {
    uv_timer_t t;
    st_rpc_call_t *call; /* NULL once cancelled */
    st_status_t s;
    uint8_t *buf;
    size_t len;
    char err[256];
} delayed_t;

static void delayed_closed(uv_handle_t *h) {
    delayed_t *d = h->data;
    free(d->buf);
    free(d);
}

static void delayed_fire(uv_timer_t *t) {
    delayed_t *d = t->data;
    if (d->call) {
        if (d->s == ST_OK) st_rpc_call_reply(d->call, d->buf, d->len);
        else st_rpc_call_finish(d->call, d->s, d->err);
    }
    uv_close((uv_handle_t *)&d->t, delayed_closed);
}

static void delayed_cancelled(st_rpc_call_t *call, void *arg) {
    (void)call;
    ((delayed_t *)arg)->call = NULL;
}

/* reply_msg, after the test delay when one is set (takes buf either way). */
static void reply_threshold_msg(coord_t *co, st_rpc_call_t *call, st_status_t s, uint8_t *buf, size_t len) {
    delayed_t *d = co->o.test_reply_delay_ms && !co->stopping ? calloc(1, sizeof *d) : NULL;
    if (!d) {
        reply_msg(call, s, buf, len);
        return;
    }
    *d = (delayed_t){.call = call, .s = s, .buf = buf, .len = len};
    if (s != ST_OK) snprintf(d->err, sizeof d->err, "%s", st_err_last());
    uv_timer_init(&co->loop, &d->t);
    d->t.data = d;
    st_rpc_call_on_cancel(call, delayed_cancelled, d);
    uv_timer_start(&d->t, delayed_fire, co->o.test_reply_delay_ms, 0);
}

/* Every value of a worker's step report, before any of it is used (one NaN would poison /metrics
 * and /status for good). */
static st_status_t check_scores(const coord_t *co, const st_proto_scores_t *r) {
    const st_config_t *c = &co->cfg;
    if (r->n_layers != (uint32_t)c->n_layers || r->n_experts != (uint32_t)c->n_experts)
        return ST_REJECT(ST_ERR_INVALID_ARG, "ReportScores: %u layers x %u experts, the model has %d x %d", r->n_layers,
                         r->n_experts, c->n_layers, c->n_experts);
    for (int k = 0; k < ST_PROTO_STAGES; k++)
        if (!(r->stage_s[k] >= 0.0 && r->stage_s[k] <= MAX_STAGE_S)) /* NOTE: false for NaN */
            return ST_REJECT(ST_ERR_INVALID_ARG, "ReportScores: stage %d time %g s outside 0..%g", k, r->stage_s[k], MAX_STAGE_S);
    if (r->step > MAX_STEP) return ST_REJECT(ST_ERR_INVALID_ARG, "ReportScores: step %llu out of range", (unsigned long long)r->step);
    if (r->dispatch_bytes > MAX_STEP_BYTES || r->reply_bytes > MAX_STEP_BYTES || r->messages > MAX_STEP_MESSAGES)
        return ST_REJECT(ST_ERR_INVALID_ARG, "ReportScores: %llu dispatch bytes, %llu reply bytes, %llu messages: out of range",
                         (unsigned long long)r->dispatch_bytes, (unsigned long long)r->reply_bytes,
                         (unsigned long long)r->messages);
    for (size_t i = 0; i < r->n_load; i++)
        if (r->load[i] > MAX_STEP_LOAD)
            return ST_REJECT(ST_ERR_INVALID_ARG, "ReportScores: load %u at cell %zu (of the loads from layer %u) > %u", r->load[i],
                             i, r->load_first_layer, MAX_STEP_LOAD);
    for (size_t k = 0; k < r->n_summaries; k++)
        if (r->summary_lens[k] < ST_QSUM_HEADER_BYTES)
            return ST_REJECT(ST_ERR_INVALID_ARG, "ReportScores: summary %zu of %zu bytes is shorter than its header", k,
                             r->summary_lens[k]);
    return ST_OK;
}

/* The newest table for a requester that knows version `known`: unchanged when that is the newest
 * or none is published. Points into co's wire table (wire_table). */
static st_proto_thresholds_t thresholds_msg(const coord_t *co, uint64_t known) {
    st_proto_thresholds_t t = {.version = co->tau_version, .n_layers = (uint32_t)co->cfg.n_layers,
                               .n_experts = (uint32_t)co->cfg.n_experts, .step = co->tau_steps};
    if (known == co->tau_version || co->tau_version == 0) {
        t.unchanged = 1;
        return t;
    }
    t.tau = co->tau_all;
    t.rho = co->rho_all;
    t.n_rho_layers = co->n_rho_layers;
    t.n_rho = (size_t)co->n_rho_layers * t.n_experts;
    t.rho_layers = co->rho_layers;
    return t;
}

static void h_report(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    st_proto_scores_t r;
    if (st_proto_scores_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        return;
    }
    st_status_t s = ST_OK;
    const char *why;
    member_t *m = member_auth(co, call, r.worker_id, r.member_token, &why);
    if (m && (!m->alive || m->role != ST_PROTO_ROLE_ATTENTION)) {
        why = m->alive ? "not an attention worker" : "dropped";
        m = NULL;
    }
    if (!m) {
        s = ST_REJECT(ST_ERR_AUTH, "ReportScores: worker %llu: %s", (unsigned long long)r.worker_id, why);
        st_log_every(ST_LOG_WARN, 5.0, "coordinator: scores from %s refused: %s", call_peer(call), st_err_last());
    }
    if (s == ST_OK) s = check_scores(co, &r);
    /* summaries first: a malformed one fails the report before any statistic moves.
     * NOTE: common/quantile cannot unstage, so summaries before a malformed one in the same report
     * stay merged (they were valid); nothing else is touched. The merge keeps none of the bytes. */
    double t_merge = st_time_sec();
    for (size_t k = 0; s == ST_OK && k < r.n_summaries && co->q; k++) {
        s = st_qstate_merge(co->q, r.summaries[k], r.summary_lens[k]);
        if (s == ST_OK) {
            co->tau_data = 1;
        } else if (s == ST_ERR_OUT_OF_RANGE) { /* built on a table older than the history: dropped */
            co->stale_summaries++;
            st_log_every(ST_LOG_WARN, 10.0, "coordinator: worker %s: %s (dropped; %llu so far)", m->name, st_err_last(),
                         (unsigned long long)co->stale_summaries);
            s = ST_OK;
        } else if (s != ST_ERR_NO_MEMORY) {
            s = ST_ERR_INVALID_ARG; /* the sender's bytes */
        }
    }
    co->merge_s += st_time_sec() - t_merge;
    /* per-expert load of the worker's step (for /status and /metrics) */
    if (s == ST_OK) {
        /* decode checked that the layers lie inside the shape check_scores compared */
        if (r.n_load && r.step != m->load_step) {
            m->load_step = r.step;
            memcpy(m->load + (size_t)r.load_first_layer * co->cfg.n_experts, r.load, sizeof(uint32_t) * r.n_load);
        }
        co->dispatch_bytes += r.dispatch_bytes;
        co->reply_bytes += r.reply_bytes;
        co->messages += r.messages;
        for (int k = 0; k < ST_PROTO_STAGES; k++) co->stage_s[k] += r.stage_s[k];
        co->stage_steps++;
        co->steps_total++;
        m->step = r.step;
        m->tau_used = r.threshold_version;
    }
    if (s == ST_OK && r.n_summaries && co->q) {
        /* the step ends when every live worker has reported (or on the timer) */
        m->reported = 1;
        int all = 1;
        for (int i = 0; i < co->n_members; i++)
            if (co->members[i].alive && co->members[i].role == ST_PROTO_ROLE_ATTENTION && !co->members[i].reported) all = 0;
        if (all && co->tau_data) publish_thresholds(co);
    }
    uint8_t *buf = NULL;
    size_t n = 0;
    if (s == ST_OK) {
        /* the newest table rides along when the worker routed with an older one: no GetThresholds
         * round trip per step, and the worker routes with it ~2 steps after the counts it reflects */
        st_proto_scores_reply_t rep = {.threshold_version = co->tau_version};
        st_proto_thresholds_t t = thresholds_msg(co, r.threshold_version);
        if (!t.unchanged) rep.thresholds = &t;
        s = st_proto_scores_reply_encode(&rep, &buf, &n);
    }
    reply_threshold_msg(co, call, s, buf, n);
    st_proto_scores_cleanup(&r);
}

static void h_thresholds(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    st_proto_version_req_t r;
    if (st_proto_version_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        return;
    }
    st_proto_thresholds_t t = thresholds_msg(co, r.known_version);
    uint8_t *buf;
    size_t n;
    st_status_t es_ = st_proto_thresholds_encode(&t, &buf, &n);
    reply_threshold_msg(co, call, es_, buf, n);
    st_proto_version_req_cleanup(&r);
}

static void h_status(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    if (st_coord_rpc_authorized(co, call) != ST_OK) return;
    char *json = st_coord_status_json(co);
    st_proto_member_t *mm = calloc((size_t)co->n_members + 1, sizeof *mm);
    for (int i = 0; mm && i < co->n_members; i++) {
        member_t *m = &co->members[i];
        mm[i] = (st_proto_member_t){.member_id = m->id, .role = m->role, .name = m->name, .data_endpoint = m->endpoint,
                                    .capacity = m->capacity, .alive = m->alive};
    }
    st_proto_status_reply_t rep = {.version = STRATA_VERSION, .uptime_s = st_time_sec() - co->t_start,
                                   .placement_version = co->place.version, .threshold_version = co->tau_version,
                                   .n_members = mm ? (size_t)co->n_members : 0, .members = mm, .detail_json = json};
    uint8_t *buf;
    size_t n;
    st_status_t es_ = st_proto_status_reply_encode(&rep, &buf, &n);
    reply_msg(call, es_, buf, n);
    free(mm);
    free(json);
}

/* ================================================================ grpc.health.v1.Health */

/* The standard gRPC health service (grpc/grpc doc/health-checking.md), Check only. Its two
 * messages are tiny enough to read and write here: HealthCheckRequest {string service = 1},
 * HealthCheckResponse {ServingStatus status = 1} (1 SERVING, 2 NOT_SERVING). "" and
 * "strata.v1.Coordinator" are SERVING when the cluster can serve (/readyz). */
#define ST_HEALTH_METHOD "/grpc.health.v1.Health/Check"

/* The service name of a HealthCheckRequest: 1 when well-formed (name may be empty), else 0. */
static int health_service(const uint8_t *p, size_t n, char *name, size_t cap) {
    name[0] = 0;
    size_t i = 0;
    while (i < n) {
        uint64_t key = 0, v = 0;
        for (int sh = 0; i < n && sh < 64; sh += 7) { /* the field key (varint) */
            key |= (uint64_t)(p[i] & 0x7f) << sh;
            if (!(p[i++] & 0x80)) break;
        }
        int wt = (int)(key & 7);
        if (wt == 0 || wt == 2) {
            int done = 0;
            for (int sh = 0; i < n && sh < 64; sh += 7) {
                v |= (uint64_t)(p[i] & 0x7f) << sh;
                if (!(p[i++] & 0x80)) {
                    done = 1;
                    break;
                }
            }
            if (!done) return 0;
            if (wt == 2) {
                if (v > n - i) return 0;
                if ((key >> 3) == 1) {
                    if (v >= cap) return 0;
                    memcpy(name, p + i, (size_t)v);
                    name[v] = 0;
                }
                i += (size_t)v;
            }
        } else if (wt == 1 || wt == 5) {
            size_t w = wt == 1 ? 8 : 4;
            if (w > n - i) return 0;
            i += w;
        } else {
            return 0;
        }
    }
    return 1;
}

static void h_health(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    char svc[128];
    if (!health_service(req, len, svc, sizeof svc)) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, "malformed HealthCheckRequest");
        return;
    }
    if (svc[0] && strcmp(svc, "strata.v1.Coordinator") != 0) {
        st_rpc_call_finish(call, ST_ERR_NOT_FOUND, "unknown service (this server has \"\" and strata.v1.Coordinator)");
        return;
    }
    const uint8_t rep[2] = {0x08, st_coord_ready(co) ? 1 : 2}; /* field 1, varint */
    st_rpc_call_reply(call, rep, sizeof rep);
}

/* ================================================================ start / stop */

static void write_ready_file(coord_t *co) {
    if (!co->o.ready_file) return;
    char tmp[1100], txt[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", co->o.ready_file);
    int n = snprintf(txt, sizeof txt, "grpc=%s:%d\nhttp=%s:%u\npid=%d\n", co->grpc_host, co->grpc_port, co->http_host,
                     st_http_server_port(co->http), (int)getpid());
    if (st_file_write_all(tmp, txt, (size_t)n) == ST_OK) rename(tmp, co->o.ready_file);
}

static void on_closed_http(void *arg) {
    coord_t *co = arg;
    st_rpc_cleanup();
    uv_close((uv_handle_t *)&co->sweep, NULL);
    uv_close((uv_handle_t *)&co->tau_timer, NULL);
    uv_close((uv_handle_t *)&co->tick, NULL);
    uv_close((uv_handle_t *)&co->sig_int, NULL);
    uv_close((uv_handle_t *)&co->sig_term, NULL);
}

static void on_closed_rpc(void *arg) {
    coord_t *co = arg;
    for (int i = 0; i < co->n_members; i++)
        if (co->members[i].ch) {
            st_rpc_channel_destroy(co->members[i].ch);
            co->members[i].ch = NULL;
        }
    st_http_server_close(co->http, on_closed_http, co);
}

static void on_signal(uv_signal_t *h, int sig) {
    coord_t *co = h->data;
    if (co->stopping) return;
    co->stopping = 1;
    st_log_info("coordinator: signal %d, stopping", sig);
    uv_timer_stop(&co->sweep);
    uv_timer_stop(&co->tau_timer);
    uv_timer_stop(&co->tick);
    st_rpc_server_close(co->rpc, on_closed_rpc, co);
}

static void on_tick(uv_timer_t *t) { /* throughput over the last interval */
    coord_t *co = t->data;
    double now = st_time_sec(), dt = now - co->tick_at;
    if (dt > 0) co->tokens_per_s = co->tokens_window / dt;
    co->tokens_window = 0;
    co->tick_at = now;
}

/* "HOST:PORT" → host and port; a host name (localhost) becomes its first IPv4 address, since the
 * HTTP listener binds an address. */
static int split_host(const char *s, char *host, size_t hn, int *port) {
    const char *c = strrchr(s, ':');
    if (!c || c == s || (size_t)(c - s) >= hn) return -1;
    char *end;
    long p = strtol(c + 1, &end, 10);
    if (end == c + 1 || *end || p < 0 || p > 65535) return -1;
    memcpy(host, s, (size_t)(c - s));
    host[c - s] = 0;
    *port = (int)p;
    struct in_addr a4;
    if (st_host_is_localhost(host)) snprintf(host, hn, "127.0.0.1");
    if (inet_pton(AF_INET, host, &a4) == 1) return 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai) return -1;
    inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, host, (socklen_t)hn);
    freeaddrinfo(ai);
    return 0;
}

int st_coord_run(const st_coord_opts_t *opts) {
    coord_t *co = calloc(1, sizeof *co);
    if (!co) return 1;
    co->o = *opts;
    if (co->o.replicas <= 0) co->o.replicas = 1;
    if (!co->o.heartbeat_ms) co->o.heartbeat_ms = 500;
    if (co->o.lambda < 0 || co->o.lambda >= 1) co->o.lambda = 0.9f;
    if (co->o.expect_workers <= 0) co->o.expect_workers = 1;
    if (co->o.expect_experts <= 0) co->o.expect_experts = 1;
    if (!co->o.grpc) co->o.grpc = "127.0.0.1:0";
    if (!co->o.http) co->o.http = "127.0.0.1:0";
    int rc = 1;
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", co->o.ckpt);
    if (st_config_load(&co->cfg, path) != ST_OK) goto out;
    const st_config_t *c = &co->cfg;
    if (c->n_experts <= 0) {
        ST_FAIL(ST_ERR_CONFIG, "%s: no routed experts to place", path);
        goto out;
    }
    if (st_tokenizer_load(&co->tok, co->o.ckpt, NULL) != ST_OK) goto out;
    json_t *cj = json_load_file(path, 0, NULL); /* st_config_load has read it: only model_type matters */
    co->chat_format = st_chat_format_of_config(cj, co->tok);
    json_decref(cj);
    if (co->chat_format == ST_CHAT_K3) st_log_info("coordinator: chat in K3's format (config.json)");
    co->piece_cap = 3 * st_tokenizer_max_token_bytes(co->tok) + 32; /* a step, the flush, a NUL */
    if (!(co->piece = malloc(co->piece_cap))) {
        ST_FAIL(ST_ERR_NO_MEMORY, "coordinator: token buffer");
        goto out;
    }
    const char *base = strrchr(co->o.ckpt, '/');
    snprintf(co->model, sizeof co->model, "%s", co->o.model_name ? co->o.model_name : base && base[1] ? base + 1 : co->o.ckpt);
    int n_moe = c->n_layers - c->first_k_dense;
    if (st_placement_init(&co->place, n_moe, c->n_experts, co->o.replicas) != ST_OK) goto out;
    /* NOTE: history 32: workers fetch a table when a heartbeat announces one (500 ms) and the 50 ms
     * timer may close a step before every worker reported: up to ~10 versions behind, plus a step */
    st_qstate_opts_t qo;
    st_qstate_opts_default(&qo);
    qo.history = 32;
    if (st_qstate_create((uint32_t)n_moe, (uint32_t)c->n_experts, (uint32_t)c->top_k, co->o.lambda, &qo, &co->q) != ST_OK)
        goto out_place;
    size_t cells = (size_t)c->n_layers * c->n_experts;
    co->tau_all = malloc(sizeof(float) * cells);
    co->rho_all = malloc(sizeof(float) * cells);
    co->rho_layers = malloc(sizeof(uint32_t) * ((size_t)c->n_layers + 1));
    int nomem = !co->tau_all || !co->rho_all || !co->rho_layers;
    for (int i = 0; i < MAX_MEMBERS; i++) nomem |= !(co->members[i].load = calloc(cells, sizeof(uint32_t)));
    if (nomem) {
        ST_FAIL(ST_ERR_NO_MEMORY, "coordinator: member tables for %zu experts", cells);
        goto out_q;
    }
    st_hist_init(&co->ttft);
    st_hist_init(&co->tpot);
    st_hist_init(&co->e2e);
    co->t_start = co->tick_at = st_time_sec();
    co->t_wall_start = (int64_t)time(NULL);
    uv_loop_init(&co->loop);
    if (st_rpc_init(&co->loop) != ST_OK) goto out_q;
    int gport = 0, hport = 0;
    if (split_host(co->o.grpc, co->grpc_host, sizeof co->grpc_host, &gport) != 0 ||
        split_host(co->o.http, co->http_host, sizeof co->http_host, &hport) != 0) {
        ST_FAIL(ST_ERR_INVALID_ARG, "--grpc and --http take HOST:PORT (a host name that resolves, or an IPv4 address)");
        goto out_rpc;
    }
    /* member methods need the cluster token; Generate and Status are the clients' (API key, checked
     * in their handlers). TLS when the coordinator has a certificate; with a CA too, members must
     * present a certificate from it (mTLS). */
    st_rpc_sec_t rs = {0};
    const st_sec_opts_t *sec = co->o.sec;
    if (sec) {
        if (sec->have_secret) rs.token = sec->grpc_token;
        rs.tls_cert = sec->tls_cert;
        rs.tls_key = sec->tls_key;
        if (sec->tls_cert && sec->tls_ca) {
            rs.tls_ca = sec->tls_ca;
            rs.tls_client_auth = 1;
        }
    }
    if (!rs.token) st_log_warn("coordinator: no cluster secret: anyone who reaches %s can register as a member", co->o.grpc);
    if (st_rpc_server_create_ex(co->o.grpc, &rs, &co->rpc) != ST_OK) goto out_rpc;
    if (st_rpc_server_add_method(co->rpc, ST_PROTO_METHOD_REGISTER, h_register, co) != ST_OK ||
        st_rpc_server_add_method(co->rpc, ST_PROTO_METHOD_HEARTBEAT, h_heartbeat, co) != ST_OK ||
        st_rpc_server_add_method(co->rpc, ST_PROTO_METHOD_PLACEMENT, h_placement, co) != ST_OK ||
        st_rpc_server_add_method(co->rpc, ST_PROTO_METHOD_REPORT_SCORES, h_report, co) != ST_OK ||
        st_rpc_server_add_method(co->rpc, ST_PROTO_METHOD_THRESHOLDS, h_thresholds, co) != ST_OK ||
        st_rpc_server_add_open_method(co->rpc, ST_PROTO_METHOD_GENERATE, st_coord_h_generate, co) != ST_OK ||
        st_rpc_server_add_open_method(co->rpc, ST_PROTO_METHOD_STATUS, h_status, co) != ST_OK ||
        st_rpc_server_add_open_method(co->rpc, ST_HEALTH_METHOD, h_health, co) != ST_OK ||
        st_rpc_server_start(co->rpc, &co->grpc_port) != ST_OK)
        goto out_rpc;
    st_http_opts_t ho = {.tls_cert = co->o.http_tls_cert, .tls_key = co->o.http_tls_key, .access_log = true};
    if (st_http_server_create(&co->loop, co->http_host, (uint16_t)hport, &ho, &co->http) != ST_OK) goto out_rpc;
    st_coord_http_routes(co);
    uv_timer_init(&co->loop, &co->sweep);
    uv_timer_init(&co->loop, &co->tau_timer);
    uv_timer_init(&co->loop, &co->tick);
    co->sweep.data = co->tau_timer.data = co->tick.data = co;
    uv_timer_start(&co->sweep, on_sweep, co->o.heartbeat_ms / 2, co->o.heartbeat_ms / 2);
    uv_timer_start(&co->tau_timer, on_tau_timer, 50, 50);
    uv_timer_start(&co->tick, on_tick, 1000, 1000);
    uv_signal_init(&co->loop, &co->sig_int);
    uv_signal_init(&co->loop, &co->sig_term);
    co->sig_int.data = co->sig_term.data = co;
    uv_signal_start(&co->sig_int, on_signal, SIGINT);
    uv_signal_start(&co->sig_term, on_signal, SIGTERM);
    write_ready_file(co);
    st_log_info("coordinator: model %s (%d layers, %d experts top-%d), gRPC %s:%d, HTTP %s:%u, replicas %d", co->model,
                c->n_layers, c->n_experts, c->top_k, co->grpc_host, co->grpc_port, co->http_host,
                st_http_server_port(co->http), co->o.replicas);
    printf("coordinator grpc=%s:%d http=%s:%u\n", co->grpc_host, co->grpc_port, co->http_host, st_http_server_port(co->http));
    fflush(stdout);
    uv_run(&co->loop, UV_RUN_DEFAULT);
    uv_loop_close(&co->loop);
    rc = 0;
    goto out_q;
out_rpc:
    st_rpc_cleanup();
    uv_run(&co->loop, UV_RUN_DEFAULT);
    uv_loop_close(&co->loop);
out_q:
    st_qstate_destroy(co->q);
out_place:
    st_placement_cleanup(&co->place);
out:
    if (rc) fprintf(stderr, "strata-coordinator: %s\n", st_err_last());
    for (int i = 0; i < MAX_MEMBERS; i++) free(co->members[i].load);
    free(co->tau_all);
    free(co->rho_all);
    free(co->rho_layers);
    free(co->piece);
    if (co->tok) st_tokenizer_destroy(co->tok);
    free(co);
    return rc;
}
