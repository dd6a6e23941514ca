/* Member side of cluster membership (see member.h). One call in flight at a time per kind. A
 * coordinator outage is logged rate-limited and retried with exponential backoff (up to 2 s); each
 * new registration re-reads the coordinator file and tries the seed list in turn, so a coordinator
 * restarted elsewhere is found again. Not here: the coordinator's side (coordinator/coord.c). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "strata/member.h"

#define MAX_SEEDS 16
#define ADDR_MAX 256
#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 2000u
#define HB_FAILS_REREGISTER 3 /* consecutive failed heartbeats: the coordinator has dropped us anyway */

struct st_member {
    uv_loop_t *loop;
    st_member_opts_t o;
    char *name, *endpoint, *file;
    char file_addr[ADDR_MAX]; /* the file's address when last read */
    char seeds[MAX_SEEDS][ADDR_MAX];
    int n_seeds;
    char target[ADDR_MAX]; /* the channel's coordinator address ("" before the first) */
    st_rpc_channel_t *ch;
    uv_timer_t timer;
    uint64_t id, step;
    char token[ST_PROTO_TOKEN_MAX + 1]; /* of the current registration */
    uint32_t hb_ms;
    uint64_t have_placement, have_thresholds;
    int calls;          /* rpc calls in flight (ours and report_scores') */
    int busy_hb, busy_pl, busy_th, busy_reg;
    int stopping, outage, hb_fails;
    unsigned attempt;   /* registration attempts since the last success: picks the address */
    uint32_t backoff_ms;
    uint64_t next_reg_ns; /* no registration before this */
    st_rng_t rng;       /* backoff jitter */
    void (*done)(void *);
    void *done_arg;
};

static void on_timer_closed(uv_handle_t *h) {
    st_member_t *m = h->data;
    void (*done)(void *) = m->done;
    void *arg = m->done_arg;
    free(m->name);
    free(m->endpoint);
    free(m->file);
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

/* A call failed: rate-limited (a coordinator outage fails every call of every member). */
static void call_failed(st_member_t *m, const char *what, st_status_t st, const char *detail) {
    m->outage = 1;
    st_log_every(ST_LOG_WARN, 10.0, "member %s: %s to coordinator %s failed: %s (%s); retrying", m->name, what,
                 m->target, st_status_str(st), detail ? detail : "");
}

static void reachable(st_member_t *m) {
    if (m->outage) st_log_info("member %s: coordinator %s reachable again", m->name, m->target);
    m->outage = 0;
}

/* The next registration waits backoff_ms (doubling up to 2 s, +-20 % jitter). */
static void backoff(st_member_t *m) {
    m->backoff_ms = m->backoff_ms ? ST_MIN(2 * m->backoff_ms, BACKOFF_MAX_MS) : BACKOFF_MIN_MS;
    double j = 0.8 + 0.4 * st_rng_uniform(&m->rng);
    m->next_reg_ns = st_time_ns() + (uint64_t)(j * m->backoff_ms * 1e6);
    m->attempt++;
}

/* ---- where the coordinator is ---- */

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = 0;
    size_t k = strspn(s, " \t");
    if (k) memmove(s, s + k, n - k + 1);
}

static int addr_ok(const char *s) { /* host:port, visible characters */
    size_t n = strlen(s);
    if (n == 0 || n >= ADDR_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f || s[i] == ',') return 0;
    const char *c = strrchr(s, ':');
    return c && c != s && c[1];
}

/* The coordinator file: a bare "host:port", or the ready file's "grpc=host:port" line. Read
 * quietly (it may not exist yet). 1 with the address in out. */
static int read_coord_file(const char *path, char out[ADDR_MAX]) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[ADDR_MAX + 16], bare[ADDR_MAX] = "";
    int found = 0, lines = 0;
    while (!found && lines++ < 64 && fgets(line, sizeof line, f)) {
        trim(line);
        if (!strncmp(line, "grpc=", 5)) {
            if ((found = addr_ok(line + 5))) memcpy(out, line + 5, strlen(line + 5) + 1); /* addr_ok: < ADDR_MAX */
        } else if (!bare[0] && !strchr(line, '=') && addr_ok(line)) {
            memcpy(bare, line, strlen(line) + 1);
        }
    }
    fclose(f);
    if (!found && bare[0]) {
        memcpy(out, bare, ADDR_MAX);
        found = 1;
    }
    return found;
}

/* The address for registration attempt m->attempt: the file's (re-read now) first, then the seeds,
 * in turn. 0 when none is known. */
static int pick_target(st_member_t *m, char out[ADDR_MAX]) {
    char cand[MAX_SEEDS + 1][ADDR_MAX];
    int n = 0;
    if (m->file && read_coord_file(m->file, cand[n])) n++;
    for (int i = 0; i < m->n_seeds; i++) memcpy(cand[n++], m->seeds[i], ADDR_MAX);
    if (n == 0) return 0;
    memcpy(out, cand[m->attempt % (unsigned)n], ADDR_MAX);
    return 1;
}

/* Point the channel at addr (a new channel only when the address changed and nothing is in flight
 * on the old one). 1 when the channel is ready for the call. */
static int use_target(st_member_t *m, const char *addr) {
    if (m->ch && !strcmp(addr, m->target)) return 1;
    if (m->calls > 0) return 0; /* wait: calls on the old channel finish within their deadline */
    st_rpc_channel_t *ch;
    if (st_rpc_channel_create_ex(addr, m->o.sec, &ch) != ST_OK) return 0;
    if (m->ch) st_log_info("member %s: coordinator now %s (was %s)", m->name, addr, m->target);
    st_rpc_channel_destroy(m->ch);
    m->ch = ch;
    snprintf(m->target, sizeof m->target, "%s", addr);
    return 1;
}

/* ---- calls ---- */

static void new_thresholds(st_member_t *m, const st_proto_thresholds_t *t) {
    if (t->unchanged || t->version <= m->have_thresholds) return;
    m->have_thresholds = t->version;
    m->o.on_thresholds(m->o.arg, t);
}

static void on_thresholds(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_th = 0;
    st_proto_thresholds_t t;
    if (st == ST_OK && !m->stopping) {
        if (st_proto_thresholds_decode(b, n, &t) == ST_OK) {
            new_thresholds(m, &t);
            st_proto_thresholds_cleanup(&t);
        } else {
            st_log_every(ST_LOG_WARN, 10.0, "member %s: bad Thresholds from %s: %s", m->name, m->target, st_err_last());
        }
    } else if (st != ST_OK && !m->stopping) {
        call_failed(m, "GetThresholds", st, detail);
    }
    maybe_finish_stop(m);
}

static void on_placement(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_pl = 0;
    st_proto_placement_t p;
    if (st == ST_OK && !m->stopping) {
        if (st_proto_placement_decode(b, n, &p) == ST_OK) {
            if (!p.unchanged && p.version > m->have_placement) {
                m->have_placement = p.version;
                if (m->o.on_placement) m->o.on_placement(m->o.arg, &p);
            }
            st_proto_placement_cleanup(&p);
        } else {
            st_log_every(ST_LOG_WARN, 10.0, "member %s: bad Placement from %s: %s", m->name, m->target, st_err_last());
        }
    } else if (st != ST_OK && !m->stopping) {
        call_failed(m, "GetPlacement", st, detail);
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

/* Register again at the next tick (re-reading where the coordinator is). */
static void forget_registration(st_member_t *m) {
    m->id = 0;
    m->token[0] = 0;
    m->have_placement = 0;
    m->hb_fails = 0;
    m->next_reg_ns = 0;
}

static void on_heartbeat(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_hb = 0;
    st_proto_heartbeat_reply_t r;
    if (m->stopping) {
    } else if (st == ST_OK && st_proto_heartbeat_reply_decode(b, n, &r) == ST_OK) {
        reachable(m);
        m->hb_fails = 0;
        if (!r.known) {
            st_log_warn("member %s: coordinator %s does not know member %llu (restarted, or our connection changed); "
                        "registering again", m->name, m->target, (unsigned long long)m->id);
            forget_registration(m);
        } else {
            follow_versions(m, r.placement_version, r.threshold_version);
        }
        st_proto_heartbeat_reply_cleanup(&r);
    } else if (st != ST_OK) {
        call_failed(m, "Heartbeat", st, detail);
        if (++m->hb_fails >= HB_FAILS_REREGISTER && m->id) forget_registration(m);
    }
    maybe_finish_stop(m);
}

static void on_register(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    st_member_t *m = arg;
    m->calls--;
    m->busy_reg = 0;
    st_proto_register_reply_t r;
    if (m->stopping) {
    } else if (st == ST_OK && st_proto_register_reply_decode(b, n, &r) == ST_OK && r.member_id != 0) {
        reachable(m);
        m->id = r.member_id;
        memcpy(m->token, r.member_token, sizeof m->token);
        m->backoff_ms = 0;
        m->attempt = 0;
        m->hb_fails = 0;
        if (r.heartbeat_interval_ms > 0 && r.heartbeat_interval_ms != m->hb_ms) {
            m->hb_ms = ST_MAX(r.heartbeat_interval_ms, 10u);
            uv_timer_set_repeat(&m->timer, m->hb_ms);
        }
        st_log_info("member %s: registered with %s as %llu (heartbeat %u ms)", m->name, m->target,
                    (unsigned long long)m->id, m->hb_ms);
        if (m->o.on_registered) m->o.on_registered(m->o.arg, m->id, m->token);
        follow_versions(m, r.placement_version, r.threshold_version);
        st_proto_register_reply_cleanup(&r);
    } else {
        call_failed(m, "RegisterMember", st != ST_OK ? st : ST_ERR_PROTOCOL, st != ST_OK ? detail : st_err_last());
        backoff(m);
    }
    maybe_finish_stop(m);
}

static void try_register(st_member_t *m) {
    char now_at[ADDR_MAX];
    if (m->file && read_coord_file(m->file, now_at) && strcmp(now_at, m->file_addr) != 0) {
        /* the coordinator (re)started and says where: try there at once */
        memcpy(m->file_addr, now_at, ADDR_MAX);
        m->attempt = 0;
        m->backoff_ms = 0;
        m->next_reg_ns = 0;
    }
    if (m->busy_reg || st_time_ns() < m->next_reg_ns) return;
    char addr[ADDR_MAX];
    if (!pick_target(m, addr)) {
        st_log_every(ST_LOG_WARN, 10.0, "member %s: no coordinator address yet (%s unreadable or without grpc=)", m->name,
                     m->file ? m->file : "no file");
        backoff(m);
        return;
    }
    if (!use_target(m, addr)) {
        backoff(m);
        return;
    }
    st_proto_register_req_t r = {.role = m->o.role, .name = m->name, .data_endpoint = m->endpoint,
                                 .capacity = m->o.capacity};
    uint8_t *buf;
    size_t len;
    if (st_proto_register_req_encode(&r, &buf, &len) != ST_OK) return;
    if (st_rpc_unary(m->ch, ST_PROTO_METHOD_REGISTER, buf, len, m->o.rpc_timeout_ms, on_register, m) == ST_OK) {
        m->calls++;
        m->busy_reg = 1;
    } else {
        backoff(m);
    }
    free(buf);
}

static void tick(uv_timer_t *t) {
    st_member_t *m = t->data;
    if (m->stopping) return;
    if (m->id == 0) {
        try_register(m);
        return;
    }
    if (m->busy_hb) return;
    st_proto_heartbeat_req_t r = {.member_id = m->id, .step = m->step,
                                  .inflight = m->o.inflight ? m->o.inflight(m->o.arg) : 0};
    memcpy(r.member_token, m->token, sizeof r.member_token);
    uint8_t *buf;
    size_t len;
    if (st_proto_heartbeat_req_encode(&r, &buf, &len) != ST_OK) return;
    if (st_rpc_unary(m->ch, ST_PROTO_METHOD_HEARTBEAT, buf, len, m->o.rpc_timeout_ms, on_heartbeat, m) == ST_OK) {
        m->calls++;
        m->busy_hb = 1;
    }
    free(buf);
}

/* ---- ReportScores on behalf of the worker ---- */

typedef struct {
    st_member_t *m;
    st_rpc_reply_fn cb;
    void *arg;
} report_t;

static void on_report(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    report_t *r = arg;
    st_member_t *m = r->m;
    m->calls--;
    /* the reply carries the newest table when the report routed with an older one, so a worker
     * routes with the table of ~2 steps before, the estimator's default lead, not one up to a
     * heartbeat old (docs/quantile.md, "Table delay") */
    st_proto_scores_reply_t rep;
    if (st == ST_OK && !m->stopping && m->o.on_thresholds) {
        if (st_proto_scores_reply_decode(b, n, &rep) == ST_OK) {
            if (rep.thresholds) new_thresholds(m, rep.thresholds);
            st_proto_scores_reply_cleanup(&rep);
        } else {
            st_log_every(ST_LOG_WARN, 10.0, "member %s: bad ReportScoresReply from %s: %s", m->name, m->target, st_err_last());
        }
    }
    r->cb(st, b, n, detail, r->arg);
    free(r);
    maybe_finish_stop(m);
}

st_status_t st_member_report_scores(st_member_t *m, const uint8_t *bytes, size_t len, uint32_t timeout_ms,
                                    st_rpc_reply_fn cb, void *arg) {
    if (m->stopping || m->id == 0 || !m->ch)
        return ST_REJECT(ST_ERR_INVALID_ARG, "member %s: not registered: no scores to report", m->name);
    uint8_t *stamped;
    size_t n;
    st_status_t s = st_proto_scores_stamp(bytes, len, m->id, m->token, &stamped, &n);
    if (s != ST_OK) return s;
    report_t *r = malloc(sizeof *r);
    if (!r) {
        free(stamped);
        return ST_FAIL(ST_ERR_NO_MEMORY, "member: report");
    }
    *r = (report_t){.m = m, .cb = cb, .arg = arg};
    s = st_rpc_unary(m->ch, ST_PROTO_METHOD_REPORT_SCORES, stamped, n, timeout_ms, on_report, r);
    free(stamped);
    if (s != ST_OK) {
        free(r);
        return s;
    }
    m->calls++;
    return ST_OK;
}

/* ---- start / stop ---- */

/* "h1:p1,h2:p2" into m->seeds. */
static st_status_t parse_seeds(st_member_t *m, const char *list) {
    const char *p = list;
    while (p && *p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char a[ADDR_MAX];
        if (n >= sizeof a || m->n_seeds >= MAX_SEEDS)
            return ST_FAIL(ST_ERR_INVALID_ARG, "member: coordinator list \"%s\": at most %d addresses of %d characters",
                           list, MAX_SEEDS, ADDR_MAX - 1);
        memcpy(a, p, n);
        a[n] = 0;
        trim(a);
        if (a[0]) {
            if (!addr_ok(a)) return ST_FAIL(ST_ERR_INVALID_ARG, "member: coordinator \"%s\" is not host:port", a);
            memcpy(m->seeds[m->n_seeds++], a, ADDR_MAX);
        }
        p = e ? e + 1 : NULL;
    }
    return ST_OK;
}

st_status_t st_member_start(uv_loop_t *loop, const st_member_opts_t *o, st_member_t **out) {
    st_member_t *m = calloc(1, sizeof *m);
    if (!m) return ST_FAIL(ST_ERR_NO_MEMORY, "member");
    m->loop = loop;
    m->o = *o;
    if (!m->o.rpc_timeout_ms) m->o.rpc_timeout_ms = 2000;
    m->name = strdup(o->name ? o->name : "member");
    m->endpoint = strdup(o->data_endpoint ? o->data_endpoint : "");
    m->file = o->coordinator_file && o->coordinator_file[0] ? strdup(o->coordinator_file) : NULL;
    m->hb_ms = 200; /* until the coordinator says otherwise */
    m->rng.s = st_time_ns() ^ (uint64_t)(uintptr_t)m;
    st_status_t s = ST_OK;
    if (!m->name || !m->endpoint || (o->coordinator_file && o->coordinator_file[0] && !m->file))
        s = ST_FAIL(ST_ERR_NO_MEMORY, "member");
    if (s == ST_OK) s = parse_seeds(m, o->coordinator);
    if (s == ST_OK && m->n_seeds == 0 && !m->file)
        s = ST_FAIL(ST_ERR_INVALID_ARG, "member %s: no coordinator address and no coordinator file", m->name);
    char addr[ADDR_MAX];
    if (s == ST_OK && pick_target(m, addr)) { /* a channel now (st_member_channel); else at registration */
        s = st_rpc_channel_create_ex(addr, o->sec, &m->ch);
        if (s == ST_OK) snprintf(m->target, sizeof m->target, "%s", addr);
    }
    if (s != ST_OK) {
        free(m->name);
        free(m->endpoint);
        free(m->file);
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
const char *st_member_token(const st_member_t *m) { return m->token; }
st_rpc_channel_t *st_member_channel(st_member_t *m) { return m->ch; }
void st_member_set_step(st_member_t *m, uint64_t step) { m->step = step; }

void st_member_serve(uv_loop_t *loop, uv_signal_t *sig_int, uv_signal_t *sig_term, uv_signal_cb on_signal, void *arg,
                     pthread_t compute, const char *what, const char *name, const char *endpoint) {
    uv_signal_init(loop, sig_int);
    uv_signal_init(loop, sig_term);
    sig_int->data = sig_term->data = arg;
    uv_signal_start(sig_int, on_signal, SIGINT);
    uv_signal_start(sig_term, on_signal, SIGTERM);
    printf("%s %s listening on %s\n", what, name, endpoint);
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    pthread_join(compute, NULL);
}

int st_member_flags_parse(st_member_flags_t *f, int argc, char **argv, int *i) {
    int k = st_sec_opts_parse(&f->sec, argc, argv, i);
    if (k) return k;
    static const char *const names[] = {"--coordinator", "--coordinator-file", "--ckpt", "--name"};
    const char **const dst[] = {&f->coordinator, &f->coordinator_file, &f->ckpt, &f->name};
    return st_parse_str_flag(names, dst, sizeof names / sizeof *names, argc, argv, i);
}
