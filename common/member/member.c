/* Member side of cluster membership (see member.h). One call in flight at a time per kind;
 * failures are logged once per outage and retried on the next tick. */
#include <stdlib.h>
#include <uv.h>

#include "strata/member.h"

struct st_member {
    uv_loop_t *loop;
    st_member_opts_t o;
    char *name, *endpoint, *coord;
    st_rpc_channel_t *ch;
    uv_timer_t timer;
    uint64_t id, step;
    uint32_t hb_ms;
    uint64_t have_placement, have_thresholds;
    int calls;          /* rpc calls in flight */
    int busy_hb, busy_pl, busy_th, busy_reg;
    int stopping, warned;
    void (*done)(void *);
    void *done_arg;
};

static void tick(uv_timer_t *t);

static void on_timer_closed(uv_handle_t *h) {
    st_member_t *m = h->data;
    void (*done)(void *) = m->done;
    void *arg = m->done_arg;
    free(m->name);
    free(m->endpoint);
    free(m->coord);
    free(m);
    if (done) done(arg);
}

/* Once stopping and no call is in flight: release the channel, then the timer (whose close
 * callback frees m and reports done). */
static void maybe_finish_stop(st_member_t *m) {
    if (!m->stopping || m->calls > 0 || m->stopping == 2) return;
    m->stopping = 2;
    st_rpc_channel_destroy(m->ch);
    m->ch = NULL;
    m->timer.data = m;
    uv_close((uv_handle_t *)&m->timer, on_timer_closed);
}

static void warn_once(st_member_t *m, const char *what, st_status_t st, const char *detail) {
    if (m->warned) return;
    m->warned = 1;
    st_log_warn("member %s: %s to coordinator %s failed: %s (%s); retrying", m->name, what, m->coord,
                st_status_str(st), detail ? detail : "");
}

static void on_thresholds(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_th = 0;
    st_proto_thresholds_t t;
    if (st == ST_OK && !m->stopping && st_proto_thresholds_decode(b, n, &t) == ST_OK) {
        if (!t.unchanged && t.version > m->have_thresholds) {
            m->have_thresholds = t.version;
            m->o.on_thresholds(m->o.arg, &t);
        }
        st_proto_thresholds_cleanup(&t);
    } else if (st != ST_OK) {
        warn_once(m, "GetThresholds", st, detail);
    }
    maybe_finish_stop(m);
}

static void on_placement(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_pl = 0;
    st_proto_placement_t p;
    if (st == ST_OK && !m->stopping && st_proto_placement_decode(b, n, &p) == ST_OK) {
        if (!p.unchanged && p.version > m->have_placement) {
            m->have_placement = p.version;
            if (m->o.on_placement) m->o.on_placement(m->o.arg, &p);
        }
        st_proto_placement_cleanup(&p);
    } else if (st != ST_OK) {
        warn_once(m, "GetPlacement", st, detail);
    }
    maybe_finish_stop(m);
}

static void fetch(st_member_t *m, const char *path, uint64_t known, st_rpc_reply_fn cb, int *busy) {
    if (*busy) return;
    st_proto_version_req_t r = {.known_version = known};
    uint8_t *buf;
    size_t len;
    if (st_proto_version_req_encode(&r, &buf, &len) != ST_OK) return;
    if (st_rpc_unary(m->ch, path, buf, len, m->o.rpc_timeout_ms, cb, m) == ST_OK) {
        m->calls++;
        *busy = 1;
    }
    free(buf);
}

static void follow_versions(st_member_t *m, uint64_t pv, uint64_t tv) {
    if (pv > m->have_placement) fetch(m, ST_PROTO_METHOD_PLACEMENT, m->have_placement, on_placement, &m->busy_pl);
    if (m->o.on_thresholds && tv > m->have_thresholds)
        fetch(m, ST_PROTO_METHOD_THRESHOLDS, m->have_thresholds, on_thresholds, &m->busy_th);
}

static void on_heartbeat(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_hb = 0;
    st_proto_heartbeat_reply_t r;
    if (st == ST_OK && !m->stopping && st_proto_heartbeat_reply_decode(b, n, &r) == ST_OK) {
        if (m->warned) st_log_info("member %s: coordinator reachable again", m->name);
        m->warned = 0;
        if (!r.known) {
            st_log_warn("member %s: coordinator forgot member %llu; registering again", m->name, (unsigned long long)m->id);
            m->id = 0;
            m->have_placement = 0;
        } else {
            follow_versions(m, r.placement_version, r.threshold_version);
        }
        st_proto_heartbeat_reply_cleanup(&r);
    } else if (st != ST_OK) {
        warn_once(m, "Heartbeat", st, detail);
    }
    maybe_finish_stop(m);
}

static void on_register(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_reg = 0;
    st_proto_register_reply_t r;
    if (st == ST_OK && !m->stopping && st_proto_register_reply_decode(b, n, &r) == ST_OK) {
        m->id = r.member_id;
        m->warned = 0;
        if (r.heartbeat_interval_ms > 0 && r.heartbeat_interval_ms != m->hb_ms) {
            m->hb_ms = r.heartbeat_interval_ms;
            uv_timer_set_repeat(&m->timer, m->hb_ms);
        }
        st_log_info("member %s: registered as %llu (heartbeat %u ms)", m->name, (unsigned long long)m->id, m->hb_ms);
        if (m->o.on_registered) m->o.on_registered(m->o.arg, m->id, "");
        follow_versions(m, r.placement_version, r.threshold_version);
        st_proto_register_reply_cleanup(&r);
    } else if (st != ST_OK) {
        warn_once(m, "RegisterMember", st, detail);
    }
    maybe_finish_stop(m);
}

static void tick(uv_timer_t *t) {
    st_member_t *m = t->data;
    if (m->stopping) return;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (m->id == 0) {
        if (m->busy_reg) return;
        st_proto_register_req_t r = {.role = m->o.role, .name = m->name, .data_endpoint = m->endpoint,
                                     .capacity = m->o.capacity};
        if (st_proto_register_req_encode(&r, &buf, &len) != ST_OK) return;
        if (st_rpc_unary(m->ch, ST_PROTO_METHOD_REGISTER, buf, len, m->o.rpc_timeout_ms, on_register, m) == ST_OK) {
            m->calls++;
            m->busy_reg = 1;
        }
    } else {
        if (m->busy_hb) return;
        st_proto_heartbeat_req_t r = {.member_id = m->id, .step = m->step,
                                      .inflight = m->o.inflight ? m->o.inflight(m->o.arg) : 0};
        if (st_proto_heartbeat_req_encode(&r, &buf, &len) != ST_OK) return;
        if (st_rpc_unary(m->ch, ST_PROTO_METHOD_HEARTBEAT, buf, len, m->o.rpc_timeout_ms, on_heartbeat, m) == ST_OK) {
            m->calls++;
            m->busy_hb = 1;
        }
    }
    free(buf);
}

st_status_t st_member_start(uv_loop_t *loop, const st_member_opts_t *o, st_member_t **out) {
    st_member_t *m = calloc(1, sizeof *m);
    if (!m) return ST_FAIL(ST_ERR_NO_MEMORY, "member");
    m->loop = loop;
    m->o = *o;
    if (!m->o.rpc_timeout_ms) m->o.rpc_timeout_ms = 2000;
    m->name = strdup(o->name ? o->name : "member");
    m->endpoint = strdup(o->data_endpoint ? o->data_endpoint : "");
    m->coord = strdup(o->coordinator);
    m->hb_ms = 200; /* until the coordinator says otherwise */
    st_status_t s = st_rpc_channel_create_ex(o->coordinator, o->sec, &m->ch);
    if (s != ST_OK) {
        free(m->name);
        free(m->endpoint);
        free(m->coord);
        free(m);
        return s;
    }
    uv_timer_init(loop, &m->timer);
    m->timer.data = m;
    uv_timer_start(&m->timer, tick, 0, m->hb_ms);
    *out = m;
    return ST_OK;
}

void st_member_stop(st_member_t *m, void (*done)(void *), void *arg) {
    m->stopping = 1;
    m->done = done;
    m->done_arg = arg;
    uv_timer_stop(&m->timer);
    maybe_finish_stop(m);
}

uint64_t st_member_id(const st_member_t *m) { return m->id; }
st_rpc_channel_t *st_member_channel(st_member_t *m) { return m->ch; }
void st_member_set_step(st_member_t *m, uint64_t step) { m->step = step; }
