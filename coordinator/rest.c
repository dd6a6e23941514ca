/* Coordinator HTTP: health, readiness, /status JSON, Prometheus /metrics, and the OpenAI-compatible
 * /v1/completions (plain and SSE streaming) and /v1/models, behind the client API key when one is
 * set. Request parsing lives in openai.c, queueing and proxying in gen.c. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "coord_impl.h"
#include "openai.h"

/* ================================================================ histograms */

void st_hist_init(st_hist_t *h) {
    static const double b[HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    memset(h, 0, sizeof *h);
    memcpy(h->le, b, sizeof b);
}

void st_hist_add(st_hist_t *h, double v) {
    int i = 0;
    while (i < HIST_BUCKETS && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

/* ================================================================ small helpers */

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

static void bprintf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(buf_t *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) return;
        b->p = np;
        b->cap = nc;
    }
}

/* A JSON string from bytes that may not be UTF-8 (member names, worker messages): never NULL. */
static json_t *jstr(const char *s) {
    size_t n = s ? strlen(s) : 0;
    json_t *j = NULL;
    if (st_openai_utf8_valid((const unsigned char *)(s ? s : ""), n)) {
        j = json_stringn(s ? s : "", n);
    } else {
        char *c = malloc(3 * n + 1);
        size_t cl = 0;
        if (c) {
            st_openai_utf8_clean((const unsigned char *)s, n, c, &cl, 1);
            j = json_stringn(c, cl);
        }
        free(c);
    }
    return j ? j : json_null();
}

/* A JSON number that NaN and infinities cannot break: they become null. */
static json_t *jnum(double v) {
    json_t *j = isfinite(v) ? json_real(v) : NULL;
    return j ? j : json_null();
}

/* NOTE: st_http_res_send takes no extra header yet; a header line of ours (a constant, never
 * client text) rides after the content type. Switch to an st_http_res_header() once common/http
 * has one. */
static void send_with(st_http_res_t *res, int status, const char *ctype, const char *extra_header, const void *body, size_t len) {
    char ct[256];
    if (extra_header) snprintf(ct, sizeof ct, "%s\r\n%s", ctype, extra_header);
    st_http_res_send(res, status, extra_header ? ct : ctype, body, len);
}

static void json_reply_with(st_http_res_t *res, int status, json_t *j, const char *extra_header) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s) send_with(res, status, "application/json", extra_header, s, strlen(s));
    else st_http_res_send(res, 500, "application/json", "{\"error\":{\"message\":\"reply\",\"type\":\"server_error\"}}", 51);
    free(s);
    json_decref(j);
}

static void json_reply(st_http_res_t *res, int status, json_t *j) { json_reply_with(res, status, j, NULL); }

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
static json_t *error_obj(const char *msg, const char *type, const char *param, const char *code) {
    return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", jstr(msg), "type", type, "param",
                     param ? json_string(param) : json_null(), "code", code ? json_string(code) : json_null());
}

static void api_error(st_http_res_t *res, int status, const char *type, const char *msg) {
    json_reply(res, status, error_obj(msg, type, NULL, NULL));
}

/* A refused or failed request by its status class: a client's mistake 400, no key 401, a full
 * queue 429, a queue wait or a lost worker 503, the worker's own failure 502; never a 500 for
 * either a client's mistake or for load. */
static void status_error(st_http_res_t *res, st_status_t s, const char *msg, const char *param) {
    switch (s) {
    case ST_ERR_INVALID_ARG:
    case ST_ERR_OUT_OF_RANGE:
    case ST_ERR_PARSE: json_reply(res, 400, error_obj(msg, "invalid_request_error", param, NULL)); return;
    case ST_ERR_NOT_FOUND: json_reply(res, 404, error_obj(msg, "invalid_request_error", param, "not_found")); return;
    case ST_ERR_AUTH:
        json_reply_with(res, 401, error_obj(msg, "invalid_request_error", NULL, "invalid_api_key"), "WWW-Authenticate: Bearer");
        return;
    case ST_ERR_CAPACITY: json_reply_with(res, 429, error_obj(msg, "rate_limit_error", NULL, "server_busy"), "Retry-After: 1"); return;
    case ST_ERR_TIMEOUT:
    case ST_ERR_PEER: json_reply_with(res, 503, error_obj(msg, "server_error", NULL, "server_busy"), "Retry-After: 2"); return;
    case ST_ERR_CANCELLED: json_reply(res, 499, error_obj(msg, "server_error", NULL, NULL)); return;
    case ST_ERR_NO_MEMORY: json_reply(res, 500, error_obj(msg, "server_error", NULL, NULL)); return;
    default: json_reply(res, 502, error_obj(msg, "server_error", NULL, NULL)); return;
    }
}

/* The client API key (docs/security.md): 1 when the request may go on, else answered 401. */
static int authorized(coord_t *co, const st_http_req_t *req, st_http_res_t *res) {
    if (!co->o.api_key) return 1;
    const char *h = st_http_req_header(req, "Authorization");
    if (st_openai_bearer_ok(h, co->o.api_key)) return 1;
    st_log_every(ST_LOG_WARN, 10.0, "coordinator: %s %s without a valid API key: 401", req->method, req->path);
    status_error(res, ST_ERR_AUTH,
                 h ? "Incorrect API key provided." : "You didn't provide an API key: send it as \"Authorization: Bearer <key>\".",
                 NULL);
    return 0;
}

/* ================================================================ status and metrics */

static const char *role_name(st_proto_role_t r) {
    return r == ST_PROTO_ROLE_EXPERT ? "expert" : r == ST_PROTO_ROLE_ATTENTION ? "attention" : "unknown";
}

/* per-expert tokens of the last reported step, summed over the live workers: [n_layers][n_experts] */
static void last_load(coord_t *co, uint64_t *out) {
    size_t cells = (size_t)co->cfg.n_layers * co->cfg.n_experts;
    memset(out, 0, sizeof(uint64_t) * cells);
    for (int i = 0; i < co->n_members; i++) {
        member_t *m = &co->members[i];
        if (!m->alive || m->role != ST_PROTO_ROLE_ATTENTION || !m->load_step) continue;
        for (size_t c = 0; c < cells; c++) out[c] += m->load[c];
    }
}

char *st_coord_status_json(coord_t *co) {
    const st_config_t *c = &co->cfg;
    json_t *members = json_array();
    /* experts held: one pass over the map for every server (not one per server) */
    uint64_t ids[MAX_MEMBERS];
    int held[MAX_MEMBERS];
    for (int i = 0; i < co->n_members; i++) ids[i] = co->members[i].id;
    st_placement_counts(&co->place, ids, co->n_members, held);
    for (int i = 0; i < co->n_members; i++) {
        member_t *m = &co->members[i];
        /* names and endpoints are members' words: never trusted to be UTF-8 */
        json_t *j = json_pack("{s:I, s:s, s:o, s:o, s:b, s:I, s:I, s:I, s:o, s:i}", "id", (json_int_t)m->id, "role",
                              role_name(m->role), "name", jstr(m->name), "endpoint", jstr(m->endpoint), "alive", m->alive,
                              "capacity", (json_int_t)m->capacity, "inflight", (json_int_t)m->inflight, "step",
                              (json_int_t)m->step, "last_seen_s_ago", jnum(st_time_sec() - m->last_seen), "active_requests",
                              m->active);
        if (!j) continue;
        if (m->role == ST_PROTO_ROLE_EXPERT) json_object_set_new(j, "experts_held", json_integer(held[i]));
        if (m->role == ST_PROTO_ROLE_ATTENTION) json_object_set_new(j, "threshold_version", json_integer((json_int_t)m->tau_used));
        json_array_append_new(members, j);
    }
    size_t cells = (size_t)c->n_layers * c->n_experts;
    uint64_t *load = calloc(cells + 1, sizeof(uint64_t));
    json_t *loads = json_array();
    double maxmean = 0;
    if (load) {
        last_load(co, load);
        for (int l = c->first_k_dense; l < c->n_layers; l++) {
            json_t *row = json_array();
            uint64_t sum = 0, mx = 0;
            for (int e = 0; e < c->n_experts; e++) {
                uint64_t v = load[(size_t)l * c->n_experts + e];
                json_array_append_new(row, json_integer((json_int_t)v));
                sum += v;
                mx = v > mx ? v : mx;
            }
            if (sum) maxmean = fmax(maxmean, (double)mx * c->n_experts / (double)sum);
            json_array_append_new(loads, json_pack("{s:i, s:o}", "layer", l, "tokens", row));
        }
    }
    free(load);
    st_qstate_stats_t qs = {0};
    if (co->q) st_qstate_stats(co->q, &qs);
    /* NOTE: every double goes through jnum: one NaN or Inf reported by a member must not take
       /status down (json_pack refuses them) */
    json_t *root = json_pack(
        "{s:s, s:o, s:o, s:b, s:s, s:{s:i, s:i, s:i, s:i}, s:{s:I, s:i, s:b}, s:{s:I, s:I, s:o, s:I}, s:o, s:o, s:o,"
        " s:{s:I, s:I, s:I, s:I, s:i, s:o, s:I}}",
        "version", STRATA_VERSION, "model", jstr(co->model), "uptime_s", jnum(st_time_sec() - co->t_start), "ready", st_coord_ready(co),
        "routing", co->o.quantile ? "quantile" : "topk",
        "shape", "layers", c->n_layers, "experts", c->n_experts, "top_k", c->top_k, "moe_layers", c->n_layers - c->first_k_dense,
        "placement", "version", (json_int_t)co->place.version, "replicas", co->place.replicas, "complete", st_placement_complete(&co->place),
        "thresholds", "version", (json_int_t)co->tau_version, "steps", (json_int_t)co->tau_steps, "max_rel_uncertainty",
        jnum(qs.max_rel_uncert), "set", (json_int_t)qs.n_set,
        "members", members, "expert_load_last_step", loads, "expert_load_max_over_mean", jnum(maxmean),
        "throughput", "requests_total", (json_int_t)co->requests_total, "requests_ok", (json_int_t)co->requests_ok,
        "requests_error", (json_int_t)co->requests_err, "tokens_total", (json_int_t)co->tokens_total, "active_requests",
        co->active_requests, "tokens_per_s", jnum(co->tokens_per_s), "dispatch_bytes_total", (json_int_t)co->dispatch_bytes);
    if (!root) return NULL;
    json_t *tp = json_object_get(root, "throughput"); /* Generate chunk bytes from the workers */
    if (tp) json_object_set_new(tp, "stream_bytes_total", json_integer((json_int_t)co->stream_bytes));
    json_object_set_new(root, "queue",
                        json_pack("{s:i, s:i, s:o, s:I, s:I, s:I, s:I, s:I, s:o}", "waiting", co->n_waiting, "max",
                                  st_coord_queue_cap(co), "timeout_s", jnum(co->o.queue_timeout_s > 0 ? co->o.queue_timeout_s : 60),
                                  "rejected_full", (json_int_t)co->rejected_full, "rejected_timeout",
                                  (json_int_t)co->rejected_timeout, "requeued", (json_int_t)co->requeued, "idle_timeouts",
                                  (json_int_t)co->idle_timeouts, "cancelled_worker_lost", (json_int_t)co->workers_lost_cancelled,
                                  "stream_idle_timeout_s",
                                  jnum(co->o.stream_idle_timeout_s > 0 ? co->o.stream_idle_timeout_s : 60)));
    json_t *th = json_object_get(root, "thresholds");
    if (th) json_object_set_new(th, "stale_summaries", json_integer((json_int_t)co->stale_summaries));
    json_t *pl = json_object_get(root, "placement");
    if (pl) {
        json_object_set_new(pl, "update_ms_last", jnum(1e3 * co->place_s_last));
        json_object_set_new(pl, "update_ms_max", jnum(1e3 * co->place_s_max));
    }
    json_object_set_new(root, "loop", json_pack("{s:o, s:o}", "stall_max_s_last_60s", jnum(st_coord_stall_max_60s(co)),
                                                "stall_max_s", jnum(co->stall_max)));
    json_object_set_new(root, "auth", json_pack("{s:b, s:b}", "api_key", co->o.api_key != NULL, "all_endpoints", co->o.auth_all));
    /* where a worker step's time goes (means over the reported steps, all workers) */
    double n = co->stage_steps ? (double)co->stage_steps : 1.0;
    json_t *split = json_object();
    double step = 0;
    for (int k = 0; k < ST_PROTO_STAGES; k++) {
        json_object_set_new(split, st_proto_stage_names[k], jnum(1e3 * co->stage_s[k] / n));
        if (st_proto_stage_in_step(k)) step += co->stage_s[k];
    }
    json_object_set_new(split, "step", jnum(1e3 * step / n));
    json_object_set_new(split, "coordinator_merge", jnum(co->merges ? 1e3 * co->merge_s / (double)co->merges : 0));
    json_object_set_new(split, "steps", json_integer((json_int_t)co->stage_steps));
    json_object_set_new(split, "dispatch_bytes", json_integer((json_int_t)co->dispatch_bytes));
    json_object_set_new(split, "reply_bytes", json_integer((json_int_t)co->reply_bytes));
    json_object_set_new(split, "messages", json_integer((json_int_t)co->messages));
    json_object_set_new(root, "step_ms", split);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* A sample value as Prometheus writes it: NaN, +Inf and -Inf by name (never "nan" or "inf"). */
static const char *prom_num(char out[48], double v) {
    if (isnan(v)) return "NaN";
    if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    snprintf(out, 48, fabs(v) < 1e15 ? "%.6f" : "%.17g", v);
    return out;
}

/* A histogram; labels ("k=\"v\"" pairs, comma-separated, or "") go on every series. */
static void hist_metric(buf_t *b, const char *name, const char *help, const char *labels, const st_hist_t *h) {
    char nb[48];
    const char *sep = labels[0] ? "," : "";
    bprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        cum += h->count[i];
        bprintf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[HIST_BUCKETS];
    bprintf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    bprintf(b, "%s_sum{%s} %s\n%s_count{%s} %llu\n", name, labels, prom_num(nb, h->sum), name, labels,
            (unsigned long long)h->n);
}

/* A Prometheus label value: backslash, double quote and newline escaped; at most cap - 1 bytes. */
static void label_value(char *out, size_t cap, const char *v) {
    size_t o = 0;
    for (; *v && o + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') out[o++] = '\\';
        if (*v == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
            continue;
        }
        out[o++] = *v;
    }
    out[o] = 0;
}

#define TOP_EXPERTS 10 /* the most loaded experts listed in /metrics */

/* Expert load of the last reported step, summarised: tokens per expert server (an expert's tokens
 * shared among its holders), the TOP_EXPERTS most loaded (layer, expert), and max/mean over the
 * experts of the most skewed layer. Never one series per expert (K3 has ~82k). */
static void expert_load_metrics(coord_t *co, buf_t *b) {
    const st_config_t *c = &co->cfg;
    size_t cells = (size_t)c->n_layers * c->n_experts;
    uint64_t *load = calloc(cells + 1, sizeof(uint64_t));
    double *per = calloc((size_t)co->n_members + 1, sizeof(double));
    if (!load || !per) {
        free(load);
        free(per);
        return;
    }
    last_load(co, load);
    size_t top[TOP_EXPERTS];
    int nt = 0;
    double maxmean = 0;
    for (int l = c->first_k_dense; l < c->n_layers; l++) {
        uint64_t sum = 0, mx = 0;
        for (int e = 0; e < c->n_experts; e++) {
            size_t k = (size_t)l * c->n_experts + e;
            uint64_t v = load[k];
            sum += v;
            mx = v > mx ? v : mx;
            const uint64_t *hold = st_placement_holders(&co->place, l - c->first_k_dense, e);
            int nh = 0;
            for (int r = 0; r < co->place.replicas; r++) nh += hold[r] != 0;
            for (int r = 0; r < co->place.replicas && v; r++)
                for (int i = 0; hold[r] && i < co->n_members; i++)
                    if (co->members[i].id == hold[r]) per[i] += (double)v / nh;
            if (!v) continue;
            if (nt == TOP_EXPERTS && load[top[TOP_EXPERTS - 1]] >= v) continue;
            int j = nt < TOP_EXPERTS ? nt++ : TOP_EXPERTS - 1; /* insertion, descending */
            while (j > 0 && load[top[j - 1]] < v) {
                top[j] = top[j - 1];
                j--;
            }
            top[j] = k;
        }
        if (sum) maxmean = fmax(maxmean, (double)mx * c->n_experts / (double)sum);
    }
    char nb[48], name[160];
    bprintf(b, "# HELP strata:expert_server_load_tokens Tokens routed in the last reported step to the experts an "
               "expert server holds (shared among an expert's holders).\n# TYPE strata:expert_server_load_tokens gauge\n");
    for (int i = 0; i < co->n_members; i++) {
        const member_t *m = &co->members[i];
        if (m->role != ST_PROTO_ROLE_EXPERT || !m->alive) continue;
        label_value(name, sizeof name, m->name[0] ? m->name : m->endpoint);
        bprintf(b, "strata:expert_server_load_tokens{server=\"%s\"} %s\n", name, prom_num(nb, per[i]));
    }
    bprintf(b, "# HELP strata:expert_load_top_tokens The most loaded experts of the last reported step.\n"
               "# TYPE strata:expert_load_top_tokens gauge\n");
    for (int i = 0; i < nt; i++)
        bprintf(b, "strata:expert_load_top_tokens{rank=\"%d\",layer=\"%zu\",expert=\"%zu\"} %llu\n", i + 1,
                top[i] / (size_t)c->n_experts, top[i] % (size_t)c->n_experts, (unsigned long long)load[top[i]]);
    bprintf(b, "# HELP strata:expert_load_max_over_mean Most loaded expert over the mean, in the most skewed layer "
               "of the last reported step.\n# TYPE strata:expert_load_max_over_mean gauge\n"
               "strata:expert_load_max_over_mean %s\n", prom_num(nb, maxmean));
    free(load);
    free(per);
}

char *st_coord_metrics_text(coord_t *co, size_t *len) {
    buf_t b = {0};
    char nb[48];
    bprintf(&b, "# HELP strata_requests_total Generate requests by outcome.\n# TYPE strata_requests_total counter\n");
    bprintf(&b, "strata_requests_total{outcome=\"ok\"} %llu\nstrata_requests_total{outcome=\"error\"} %llu\n",
            (unsigned long long)co->requests_ok, (unsigned long long)co->requests_err);
    char mn[300], ml[320];
    label_value(mn, sizeof mn, co->model);
    snprintf(ml, sizeof ml, "model_name=\"%s\"", mn);
    /* the request-level series as vLLM names and labels them */
    bprintf(&b, "# HELP strata:num_requests_running Requests being generated now.\n"
                "# TYPE strata:num_requests_running gauge\nstrata:num_requests_running{%s} %d\n", ml, co->active_requests);
    bprintf(&b, "# HELP strata:num_requests_waiting Requests queued for a free attention worker slot.\n"
                "# TYPE strata:num_requests_waiting gauge\nstrata:num_requests_waiting{%s} %d\n", ml, co->n_waiting);
    bprintf(&b, "# HELP strata:prompt_tokens_total Prompt tokens of the requests started.\n"
                "# TYPE strata:prompt_tokens_total counter\nstrata:prompt_tokens_total{%s} %llu\n", ml,
            (unsigned long long)co->prompt_tokens_total);
    bprintf(&b, "# HELP strata:generation_tokens_total Tokens generated for clients.\n"
                "# TYPE strata:generation_tokens_total counter\nstrata:generation_tokens_total{%s} %llu\n", ml,
            (unsigned long long)co->tokens_total);
    bprintf(&b, "# HELP strata:request_success_total Requests finished, by finish reason.\n"
                "# TYPE strata:request_success_total counter\n"
                "strata:request_success_total{%s,finished_reason=\"stop\"} %llu\n"
                "strata:request_success_total{%s,finished_reason=\"length\"} %llu\n",
            ml, (unsigned long long)co->finished_stop, ml, (unsigned long long)co->finished_length);
    hist_metric(&b, "strata:time_to_first_token_seconds", "Time from request to first token.", ml, &co->ttft);
    hist_metric(&b, "strata:time_per_output_token_seconds", "Time between tokens of a request.", ml, &co->tpot);
    hist_metric(&b, "strata:e2e_request_latency_seconds", "Time from arrival to the last token of finished requests.", ml,
                &co->e2e);
    bprintf(&b, "# HELP strata_requests_rejected_total Requests refused for load: queue full (429) or queue wait timed out (503).\n"
                "# TYPE strata_requests_rejected_total counter\nstrata_requests_rejected_total{reason=\"queue_full\"} %llu\n"
                "strata_requests_rejected_total{reason=\"queue_timeout\"} %llu\n",
            (unsigned long long)co->rejected_full, (unsigned long long)co->rejected_timeout);
    bprintf(&b, "# HELP strata_requests_requeued_total Requests a worker refused before any token (full, draining), queued again.\n"
                "# TYPE strata_requests_requeued_total counter\nstrata_requests_requeued_total %llu\n", (unsigned long long)co->requeued);
    bprintf(&b, "# HELP strata_streams_cancelled_total Streams the coordinator cancelled: no token within the idle timeout, or the worker was lost.\n"
                "# TYPE strata_streams_cancelled_total counter\nstrata_streams_cancelled_total{reason=\"idle\"} %llu\n"
                "strata_streams_cancelled_total{reason=\"worker_lost\"} %llu\n",
            (unsigned long long)co->idle_timeouts, (unsigned long long)co->workers_lost_cancelled);
    bprintf(&b, "# HELP strata_loop_stall_max_seconds Longest stall of the coordinator's event loop over the last 60 s.\n"
                "# TYPE strata_loop_stall_max_seconds gauge\nstrata_loop_stall_max_seconds %s\n", prom_num(nb, st_coord_stall_max_60s(co)));
    bprintf(&b, "# HELP strata_worker_steps_total Steps reported by attention workers.\n# TYPE strata_worker_steps_total counter\n"
                "strata_worker_steps_total %llu\n", (unsigned long long)co->steps_total);
    bprintf(&b, "# HELP strata_dispatch_bytes_total Bytes attention workers sent to expert servers.\n"
                "# TYPE strata_dispatch_bytes_total counter\nstrata_dispatch_bytes_total %llu\n",
            (unsigned long long)co->dispatch_bytes);
    bprintf(&b, "# HELP strata_threshold_version Published quantile-threshold version.\n# TYPE strata_threshold_version gauge\n"
                "strata_threshold_version %llu\n", (unsigned long long)co->tau_version);
    bprintf(&b, "# HELP strata_placement_version Published placement version.\n# TYPE strata_placement_version gauge\n"
                "strata_placement_version %llu\n", (unsigned long long)co->place.version);
    bprintf(&b, "# HELP strata_members Members by role and liveness.\n# TYPE strata_members gauge\n");
    for (int r = 1; r <= 2; r++)
        for (int a = 0; a <= 1; a++) {
            int n = 0;
            for (int i = 0; i < co->n_members; i++) n += (int)co->members[i].role == r && co->members[i].alive == a;
            bprintf(&b, "strata_members{role=\"%s\",alive=\"%d\"} %d\n", role_name((st_proto_role_t)r), a, n);
        }
    bprintf(&b, "# HELP strata_step_stage_seconds_total Worker step time by stage.\n# TYPE strata_step_stage_seconds_total counter\n");
    for (int k = 0; k < ST_PROTO_STAGES; k++)
        bprintf(&b, "strata_step_stage_seconds_total{stage=\"%s\"} %s\n", st_proto_stage_names[k],
                prom_num(nb, co->stage_s[k]));
    bprintf(&b, "# HELP strata_reply_bytes_total Bytes expert servers sent back.\n# TYPE strata_reply_bytes_total counter\n"
                "strata_reply_bytes_total %llu\n", (unsigned long long)co->reply_bytes);
    expert_load_metrics(co, &b);
    if (!b.p) return NULL;
    *len = b.n;
    return b.p;
}

static void h_metrics(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    coord_t *co = arg;
    if (co->o.auth_all && !authorized(co, req, res)) return;
    size_t n = 0;
    char *t = st_coord_metrics_text(co, &n);
    if (t) st_http_res_send(res, 200, "text/plain; version=0.0.4", t, n);
    else st_http_res_send(res, 500, "text/plain", "metrics\n", 8);
    free(t);
}

static void h_healthz(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    /* gRPC core 1.51 never accepts again after accept() hit the fd limit: members could not
     * register any more, so report the process unhealthy (a supervisor restarts it) */
    if (st_rpc_accept_failures() > 0) {
        static const char msg[] = "gRPC port lost (accept failed: file descriptor limit)\n";
        st_http_res_send(res, 503, "text/plain", msg, sizeof msg - 1);
        return;
    }
    st_http_res_send(res, 200, "text/plain", "ok\n", 3);
}

static void h_readyz(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    coord_t *co = arg;
    if (st_coord_ready(co)) {
        st_http_res_send(res, 200, "text/plain", "ready\n", 6);
        return;
    }
    char why[256];
    int w = 0, x = 0;
    for (int i = 0; i < co->n_members; i++) {
        w += co->members[i].alive && co->members[i].role == ST_PROTO_ROLE_ATTENTION;
        x += co->members[i].alive && co->members[i].role == ST_PROTO_ROLE_EXPERT;
    }
    int n = snprintf(why, sizeof why, "not ready: %d/%d attention workers, %d/%d expert servers, placement %s\n", w,
                     co->o.expect_workers, x, co->o.expect_experts, st_placement_complete(&co->place) ? "complete" : "incomplete");
    st_http_res_send(res, 503, "text/plain", why, (size_t)n);
}

static void h_status(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    coord_t *co = arg;
    if (co->o.auth_all && !authorized(co, req, res)) return;
    char *s = st_coord_status_json(co);
    if (s) st_http_res_send(res, 200, "application/json", s, strlen(s));
    else st_http_res_send(res, 500, "text/plain", "status\n", 7);
    free(s);
}

static void h_models(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    coord_t *co = arg;
    if (!authorized(co, req, res)) return;
    json_reply(res, 200, json_pack("{s:s, s:[{s:o, s:s, s:I, s:s}]}", "object", "list", "data", "id", jstr(co->model), "object",
                                   "model", "created", (json_int_t)co->t_wall_start, "owned_by", "strata"));
}

/* ================================================================ /v1/completions, /v1/chat/completions */

/* One HTTP request: its choices are gen_t's (n per prompt, every prompt of a batch), each queued
 * and proxied on its own; the response is written here as they stream and end. Freed when every
 * choice has been answered (st_coord_http_done). */
typedef struct hreq {
    coord_t *co;
    st_http_res_t *res; /* NULL once the response is complete (or the client gone) */
    int stream, chat, tools, include_usage, begun, gone, answered;
    int k3, thinking;   /* chat in K3's format: the reply has think / response channels */
    char **stop;        /* stop strings (owned), never in the text the client gets */
    size_t n_stop;
    char id[48];
    int64_t created;
    int n_choices, n_per;  /* n_per: choices per prompt (the request's n) */
    int n_open;            /* choices not answered yet, plus one while a caller holds h */
    gen_t **kids;          /* [n_choices]; a kid's slot is cleared when it is answered */
    int *done_tokens, *done_prompt; /* per choice once answered */
    st_proto_finish_t *done_finish;
    char **done_text;                /* plain responses: each choice's final text (owned) */
    char **done_reasoning;           /* plain responses, K3: each choice's think channel (owned) */
    json_t **done_calls;             /* plain responses: each choice's tool calls */
    json_t **done_lp;                /* plain responses: each choice's logprobs */
    st_status_t status;              /* the first failure, if any */
    char err[256];
} hreq_t;

static const char *finish_of(st_proto_finish_t f) {
    if (f == ST_PROTO_FINISH_LENGTH) return "length";
    return f == ST_PROTO_FINISH_STOP ? "stop" : NULL;
}

static json_t *jtext(const char *text, size_t len) {
    json_t *t = json_stringn(text, len); /* text is st_openai_utf8_clean's output: always valid */
    return t ? t : json_string("");
}

/* One choice of a response (plain) or of a chunk (stream) holding text [text, len). */
static json_t *choice_json(hreq_t *h, int index, int *role_sent, const char *text, size_t len, const char *finish,
                           json_t *tool_calls, json_t *lp, int stream) {
    if (!lp) lp = json_null();
    if (!h->chat) {
        json_decref(tool_calls);
        return json_pack("{s:o, s:i, s:o, s:s?}", "text", jtext(text, len), "index", index, "logprobs", lp,
                         "finish_reason", finish);
    }
    json_t *m = json_object();
    if (!stream || !*role_sent) json_object_set_new(m, "role", json_string("assistant"));
    *role_sent = 1;
    if (!stream || len) json_object_set_new(m, "content", len || !tool_calls ? jtext(text, len) : json_null());
    if (tool_calls) {
        if (stream)
            for (size_t i = 0; i < json_array_size(tool_calls); i++)
                json_object_set_new(json_array_get(tool_calls, i), "index", json_integer((json_int_t)i));
        json_object_set_new(m, "tool_calls", tool_calls);
    }
    return json_pack("{s:i, s:o, s:o, s:s?}", "index", index, stream ? "delta" : "message", m, "logprobs", lp,
                     "finish_reason", finish);
}

static json_t *response_json(hreq_t *h, json_t *choices, int stream) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:o, s:o}", "id", h->id, "object",
                          h->chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion",
                          "created", (json_int_t)h->created, "model", jstr(h->co->model), "choices", choices);
    if (o && stream && h->include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

/* Usage: prompt tokens once per prompt (a batch's prompts each once, whatever n), completion
 * tokens of every choice. */
static json_t *usage_json(const hreq_t *h) {
    long p = 0, c = 0;
    for (int i = 0; i < h->n_choices; i++) {
        c += h->done_tokens[i];
        if (i % h->n_per == 0) p += h->done_prompt[i];
    }
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)c,
                     "total_tokens", (json_int_t)(p + c));
}

static void text_append(gen_t *g, const char *s, size_t n) {
    if (g->text_len + n + 1 > g->text_cap) {
        size_t nc = (g->text_cap + n + 1) * 2;
        char *np = realloc(g->text, nc);
        if (!np) return;
        g->text = np;
        g->text_cap = nc;
    }
    memcpy(g->text + g->text_len, s, n);
    g->text_len += n;
    g->text[g->text_len] = 0;
}

static void sse_json(hreq_t *h, json_t *o) {
    char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (js) st_http_res_sse(h->res, NULL, js);
    else st_log_error("coordinator: %s: an event could not be encoded", h->id);
    free(js);
    json_decref(o);
}

/* ---- logprobs: the engine computes them (the processed row at temperature 1, kernels.h
 * st_sample_rows); each chunk carries its token's log-probability and the top k as values, checked
 * against the vocabulary on arrival (gen.c) */

static json_t *lp_token(const st_tokenizer_t *tk, int32_t id, float lp) {
    const char *b = "";
    size_t n = 0;
    if (st_tokenizer_token_bytes(tk, id, &b, &n) != ST_OK) n = 0;
    char *clean = malloc(3 * n + 1);
    size_t cl = 0;
    if (clean) st_openai_utf8_clean((const unsigned char *)b, n, clean, &cl, 1);
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)b[i]));
    json_t *o = json_pack("{s:o, s:o, s:o}", "token", jtext(clean ? clean : "", cl), "logprob", jnum((double)lp), "bytes", bytes);
    free(clean);
    return o;
}

static void lp_add(gen_t *g, const st_proto_generate_chunk_t *ch, size_t off) {
    const st_tokenizer_t *tk = g->co->tok;
    if (!ch->has_logprob) return; /* a worker that did not compute them: no entry */
    json_t *e = lp_token(tk, (int32_t)ch->token_id, ch->logprob), *top = json_array();
    size_t nt = ST_MIN(ch->n_top, (size_t)ST_MAX(g->lp_k, 0));
    for (size_t i = 0; i < nt; i++) json_array_append_new(top, lp_token(tk, (int32_t)ch->top_ids[i], ch->top_logprobs[i]));
    if (e) json_object_set_new(e, "top_logprobs", top);
    else json_decref(top);
    size_t n = json_array_size(g->lp);
    size_t *no = realloc(g->lp_off, (n + 1) * sizeof *no);
    if (!e || !no) {
        json_decref(e);
        if (no) g->lp_off = no;
        return;
    }
    g->lp_off = no;
    g->lp_off[n] = off;
    json_array_append_new(g->lp, e);
}

/* The entries not sent yet whose text starts before upto, in the response's shape: chat
 * {"content": [...]}, completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
 * NULL without logprobs. */
static json_t *lp_take(const hreq_t *h, gen_t *g, size_t upto) {
    if (g->lp_k < 0) return NULL;
    size_t j = g->lp_sent, n = json_array_size(g->lp), base = g->echo ? strlen(g->echo) : 0;
    json_t *content = json_array(), *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (; j < n && g->lp_off[j] < upto; j++) {
        json_t *e = json_array_get(g->lp, j);
        json_array_append(content, e);
        json_array_append(toks, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *d = json_object(), *t;
        size_t i;
        json_array_foreach(json_object_get(e, "top_logprobs"), i, t)
            json_object_set(d, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
        json_array_append_new(tops, d);
        json_array_append_new(offs, json_integer((json_int_t)(base + g->lp_off[j])));
    }
    g->lp_sent = j;
    if (h->chat) {
        json_decref(toks);
        json_decref(lps);
        json_decref(tops);
        json_decref(offs);
        return json_pack("{s:o}", "content", content);
    }
    json_decref(content);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

/* At the end every token's entry goes out (those without text too), except the ones from where
 * a stop string began. */
static size_t lp_end(const gen_t *g) { return g->stop_hit ? g->text_len : (size_t)-1; }

static void sse_choice(hreq_t *h, gen_t *g, const char *text, size_t len, const char *finish, json_t *calls, json_t *lp) {
    sse_json(h, response_json(h, json_pack("[o]", choice_json(h, g->index, &g->role_sent, text, len, finish, calls, lp, 1)),
                              1));
}

static const char TOOL_SECTION[] = "<|tool_calls_section_begin|>";

static const char *find_bytes(const char *hay, size_t hn, const char *n, size_t nn) {
    for (size_t i = 0; nn <= hn && i + nn <= hn; i++)
        if (hay[i] == n[0] && !memcmp(hay + i, n, nn)) return hay + i;
    return NULL;
}

/* How much of a choice's text may reach the client now: not a suffix that could still become a
 * stop string (or, with K2's tools, the tool-call section's marker), nor anything from that marker
 * on. (K3's channel markers: st_chat_k3_stream, within this.) */
static size_t safe_len(const hreq_t *h, const gen_t *g) {
    size_t end = g->text_len;
    int k2_tools = h->tools && !h->k3;
    if (k2_tools) {
        const char *sec = find_bytes(g->text ? g->text : "", g->text_len, TOOL_SECTION, sizeof TOOL_SECTION - 1);
        if (sec) end = (size_t)(sec - g->text);
    }
    size_t lim = end;
    for (size_t w = 0; w < h->n_stop + (size_t)k2_tools; w++) {
        const char *ws = w < h->n_stop ? h->stop[w] : TOOL_SECTION;
        size_t wn = strlen(ws);
        for (size_t k = wn - 1 < end ? wn - 1 : end; k > 0; k--)
            if (!memcmp(g->text + end - k, ws, k)) {
                if (end - k < lim) lim = end - k;
                break;
            }
    }
    return lim;
}

/* A stop string in the text (looked for where the newest bytes could complete one): the text
 * ends before it. 1 when found. */
static int cut_at_stop(const hreq_t *h, gen_t *g, size_t added) {
    size_t best = (size_t)-1;
    for (size_t w = 0; w < h->n_stop; w++) {
        size_t wn = strlen(h->stop[w]), from = g->text_len - added;
        from = from > wn ? from - wn + 1 : 0;
        const char *hit = find_bytes(g->text + from, g->text_len - from, h->stop[w], wn);
        if (hit && (size_t)(hit - g->text) < best) best = (size_t)(hit - g->text);
    }
    if (best == (size_t)-1) return 0;
    g->text_len = best;
    g->text[best] = 0;
    return 1;
}

/* Stream a choice's text that is safe now (complete characters only). */
static void stream_text(hreq_t *h, gen_t *g, size_t upto, int final) {
    if (upto <= g->emitted) return;
    size_t n = upto - g->emitted, cl = 0;
    char *clean = malloc(3 * n + 1);
    if (!clean) return;
    g->emitted += st_openai_utf8_clean((const unsigned char *)g->text + g->emitted, n, clean, &cl, final);
    if (cl > 0) sse_choice(h, g, clean, cl, NULL, NULL, lp_take(h, g, g->emitted));
    free(clean);
}

/* K3: the think channel's text as reasoning_content deltas, then the response channel's as content,
 * of [g->emitted, upto) where no marker can still form (complete characters only). The reply's
 * end goes out through final_text. */
static void stream_k3(hreq_t *h, gen_t *g, size_t upto) {
    size_t ro, rl, co, cl;
    st_chat_k3_stream(g->text ? g->text : "", upto, h->thinking, 0, g->emitted, &ro, &rl, &co, &cl);
    for (int ch = 0; ch < 2; ch++) {
        size_t off = ch ? co : ro, n = ch ? cl : rl, out = 0;
        if (!n) continue;
        char *clean = malloc(3 * n + 1);
        if (!clean) return;
        size_t used = st_openai_utf8_clean((const unsigned char *)g->text + off, n, clean, &out, 0);
        g->emitted = off + used;
        if (out > 0) {
            json_t *lp = lp_take(h, g, g->emitted);
            if (ch) sse_choice(h, g, clean, out, NULL, NULL, lp);
            else {
                json_t *c = choice_json(h, g->index, &g->role_sent, "", 0, NULL, NULL, lp, 1);
                json_object_set_new(json_object_get(c, "delta"), "reasoning_content", jtext(clean, out));
                sse_json(h, response_json(h, json_pack("[o]", c), 1));
            }
        }
        free(clean);
        if (used < n) return; /* a character still incomplete: the rest waits for it */
    }
}

static void stream_begin(hreq_t *h) {
    if (h->begun) return;
    h->begun = 1;
    st_http_res_stream_begin(h->res, 200, "text/event-stream");
    for (int i = 0; i < h->n_choices; i++) /* completions' echo: the prompt first */
        if (h->kids[i] && h->kids[i]->echo)
            sse_choice(h, h->kids[i], h->kids[i]->echo, strlen(h->kids[i]->echo), NULL, NULL, NULL);
}

/* NOTE: a stream's 200 is sent with the first good chunk of any choice, not before: an error
 * before then (a refusal, a lost worker, a client's mistake the worker found) is a proper status. */
void st_coord_http_chunk(gen_t *g, const st_proto_generate_chunk_t *ch) {
    hreq_t *h = g->parent;
    if (ch->finish == ST_PROTO_FINISH_ERROR || ch->finish == ST_PROTO_FINISH_CANCELLED) return; /* gen.c keeps the error */
    if (g->stop_hit) return;
    if (g->lp_k >= 0 && (ch->finish == ST_PROTO_FINISH_NONE || ch->finish == ST_PROTO_FINISH_LENGTH))
        lp_add(g, ch, g->text_len);
    size_t added = ch->text ? strlen(ch->text) : 0;
    if (added) text_append(g, ch->text, added);
    if (added && h->n_stop && cut_at_stop(h, g, added)) {
        g->stop_hit = 1;
        st_coord_gen_stop(g); /* answers this choice: st_coord_http_done */
        return;
    }
    if (!h->stream || !h->res || h->status != ST_OK) return;
    stream_begin(h);
    if (ch->finish != ST_PROTO_FINISH_NONE) return;
    if (h->k3) stream_k3(h, g, safe_len(h, g));
    else stream_text(h, g, safe_len(h, g), 0);
}

static void hreq_free(hreq_t *h) {
    for (size_t i = 0; i < h->n_stop; i++) free(h->stop[i]);
    for (int i = 0; i < h->n_choices; i++) {
        if (h->done_text) free(h->done_text[i]);
        if (h->done_reasoning) free(h->done_reasoning[i]);
        if (h->done_calls) json_decref(h->done_calls[i]);
        if (h->done_lp) json_decref(h->done_lp[i]);
    }
    free(h->stop);
    free(h->kids);
    free(h->done_tokens);
    free(h->done_prompt);
    free(h->done_finish);
    free(h->done_text);
    free(h->done_reasoning);
    free(h->done_calls);
    free(h->done_lp);
    free(h);
}

static void http_gone(st_http_res_t *res, void *arg);
static void hreq_release(hreq_t *h);

/* Every choice answered: the plain response, or the stream's usage and end. */
static void hreq_complete(hreq_t *h) {
    if (!h->res) return;
    st_http_res_t *res = h->res;
    st_http_res_on_close(res, NULL, NULL);
    if (h->stream && h->begun) {
        if (h->status != ST_OK) {
            sse_json(h, error_obj(h->err, "server_error", NULL, NULL));
        } else if (h->include_usage) {
            json_t *o = response_json(h, json_array(), 1);
            json_object_set_new(o, "usage", usage_json(h));
            sse_json(h, o);
        }
        st_http_res_sse(res, NULL, "[DONE]");
        st_http_res_stream_end(res);
    } else if (h->status != ST_OK) {
        status_error(res, h->status, h->err, NULL);
    } else {
        json_t *choices = json_array();
        for (int i = 0; i < h->n_choices; i++) {
            int rs = 0;
            const char *t = h->done_text[i] ? h->done_text[i] : "";
            json_t *c = choice_json(h, i, &rs, t, strlen(t),
                                    h->done_calls[i] ? "tool_calls" : finish_of(h->done_finish[i]), h->done_calls[i],
                                    h->done_lp[i], 0);
            if (h->done_reasoning[i])
                json_object_set_new(json_object_get(c, "message"), "reasoning_content",
                                    jtext(h->done_reasoning[i], strlen(h->done_reasoning[i])));
            json_array_append_new(choices, c);
            h->done_calls[i] = NULL;
            h->done_lp[i] = NULL;
        }
        json_t *o = response_json(h, choices, 0);
        json_object_set_new(o, "usage", usage_json(h));
        json_reply(res, 200, o);
    }
    h->res = NULL;
}

static char *clean_copy(const char *s, size_t n) {
    char *out = malloc(3 * n + 1);
    size_t cl = 0;
    if (out) st_openai_utf8_clean((const unsigned char *)s, n, out, &cl, 1);
    return out;
}

/* K3: the response channel's text, the think channel's (*reasoning, NULL when empty), both from
 * byte `from` on (what a stream has not given yet), and the tools channel's calls. */
static char *final_k3(const hreq_t *h, gen_t *g, json_t **calls, size_t from, char **reasoning) {
    st_chat_k3_reply_t rp;
    const char *t = g->text ? g->text : "";
    st_chat_k3_reply(t, g->text_len, h->thinking, &rp);
    *calls = rp.tool_calls;
    if (!h->tools) {
        json_decref(rp.tool_calls);
        *calls = NULL;
    }
    size_t ro, rl, co, cl;
    st_chat_k3_stream(t, g->text_len, h->thinking, 1, from, &ro, &rl, &co, &cl);
    *reasoning = rl ? clean_copy(t + ro, rl) : NULL;
    return clean_copy(t + co, cl);
}

/* The final text of a choice: echo + text before any tool-call section, as valid UTF-8. */
static char *final_text(const hreq_t *h, gen_t *g, json_t **calls, size_t from, char **reasoning) {
    *reasoning = NULL;
    if (h->k3) return final_k3(h, g, calls, from, reasoning);
    size_t content = g->text_len;
    *calls = h->tools ? st_chat_tool_calls(g->text ? g->text : "", g->text_len, &content) : NULL;
    if (content < from) content = from;
    size_t el = g->echo && !from ? strlen(g->echo) : 0, cl = 0, tl = 0;
    char *out = malloc(3 * (el + content - from) + 1);
    if (!out) return NULL;
    if (el) st_openai_utf8_clean((const unsigned char *)g->echo, el, out, &cl, 1);
    st_openai_utf8_clean((const unsigned char *)(g->text ? g->text : "") + from, content - from, out + cl, &tl, 1);
    return out;
}

void st_coord_http_done(gen_t *g) {
    hreq_t *h = g->parent;
    int ok = g->status == ST_OK && (g->finish == ST_PROTO_FINISH_STOP || g->finish == ST_PROTO_FINISH_LENGTH);
    h->kids[g->index] = NULL;
    h->done_tokens[g->index] = g->n_tokens;
    h->done_prompt[g->index] = g->prompt_tokens;
    h->done_finish[g->index] = g->finish;
    if (!ok && h->status == ST_OK) { /* the first failure answers the request; the others are cancelled */
        h->status = g->status != ST_OK ? g->status : ST_ERR_INTERNAL;
        snprintf(h->err, sizeof h->err, "%s", g->err[0] ? g->err : "the attention worker ended the stream without finishing");
        for (int i = 0; i < h->n_choices; i++)
            if (h->kids[i]) {
                h->kids[i]->http_gone = 1;
                st_coord_gen_client_gone(h->kids[i]);
            }
    }
    if (ok && h->res && h->status == ST_OK) {
        json_t *calls = NULL;
        char *reasoning = NULL;
        if (h->stream) {
            stream_begin(h);
            char *rest = final_text(h, g, &calls, g->emitted, &reasoning);
            if (reasoning && reasoning[0]) {
                json_t *c = choice_json(h, g->index, &g->role_sent, "", 0, NULL, NULL, NULL, 1);
                json_object_set_new(json_object_get(c, "delta"), "reasoning_content", jtext(reasoning, strlen(reasoning)));
                sse_json(h, response_json(h, json_pack("[o]", c), 1));
            }
            free(reasoning);
            if (rest && rest[0]) sse_choice(h, g, rest, strlen(rest), NULL, NULL, lp_take(h, g, lp_end(g)));
            free(rest);
            sse_choice(h, g, "", 0, calls ? "tool_calls" : finish_of(g->finish), calls, lp_take(h, g, lp_end(g)));
        } else {
            h->done_text[g->index] = final_text(h, g, &calls, 0, &reasoning);
            h->done_reasoning[g->index] = reasoning;
            h->done_calls[g->index] = calls;
            h->done_lp[g->index] = lp_take(h, g, lp_end(g));
        }
    }
    hreq_release(h);
}

/* Drop a hold on h (see n_open): the last one completes the response and frees h. */
static void hreq_release(hreq_t *h) {
    if (--h->n_open > 0) return;
    hreq_complete(h);
    hreq_free(h);
}

static void http_gone(st_http_res_t *res, void *arg) {
    hreq_t *h = arg;
    (void)res;
    h->res = NULL; /* no response any more; the choices still open end and free h */
    h->n_open++;   /* NOTE: a queued choice is answered (and may drop the last hold) inside the loop */
    for (int i = 0; i < h->n_choices; i++)
        if (h->kids[i]) {
            h->kids[i]->http_gone = 1;
            st_coord_gen_client_gone(h->kids[i]);
        }
    hreq_release(h);
}

static void h_generate(const st_http_req_t *req, st_http_res_t *res, coord_t *co, int chat) {
    if (!authorized(co, req, res)) return;
    st_openai_limits_t lim = {.model = co->model, .vocab = co->cfg.vocab, .tok = co->tok, .chat_format = co->chat_format};
    st_openai_req_t r;
    st_openai_err_t e;
    st_status_t s = chat ? st_openai_parse_chat(req->body, req->body_len, &lim, &r, &e)
                         : st_openai_parse_completion(req->body, req->body_len, &lim, &r, &e);
    if (s != ST_OK) {
        co->requests_err++;
        if (s == ST_ERR_NO_MEMORY) api_error(res, 500, "server_error", "out of memory");
        else status_error(res, ST_ERR_INVALID_ARG, e.message, e.param);
        return;
    }
    int n = (int)r.n_prompts * r.n;
    hreq_t *h = calloc(1, sizeof *h);
    int nomem = !h;
    if (h) {
        h->kids = calloc((size_t)n, sizeof *h->kids);
        h->done_tokens = calloc((size_t)n, sizeof(int));
        h->done_prompt = calloc((size_t)n, sizeof(int));
        h->done_finish = calloc((size_t)n, sizeof *h->done_finish);
        h->done_text = calloc((size_t)n, sizeof(char *));
        h->done_reasoning = calloc((size_t)n, sizeof(char *));
        h->done_calls = calloc((size_t)n, sizeof(json_t *));
        h->done_lp = calloc((size_t)n, sizeof(json_t *));
        h->stop = r.n_stop_strs ? calloc(r.n_stop_strs, sizeof(char *)) : NULL;
        nomem = !h->kids || !h->done_tokens || !h->done_prompt || !h->done_finish || !h->done_text || !h->done_reasoning ||
                !h->done_calls || !h->done_lp ||
                (r.n_stop_strs && !h->stop);
        for (int i = 0; i < n && !nomem; i++) {
            gen_t *g = h->kids[i] = calloc(1, sizeof *g);
            const char *ptext = i / r.n ? r.batch[i / r.n - 1].text : r.req.prompt;
            nomem = !g || (r.echo && !(g->echo = strdup(ptext))) || (r.logprobs >= 0 && !(g->lp = json_array()));
            if (g) g->lp_k = r.logprobs;
        }
    }
    if (nomem) {
        for (int i = 0; h && h->kids && i < n; i++)
            if (h->kids[i]) st_coord_gen_free(h->kids[i]);
        if (h) hreq_free(h);
        st_openai_req_cleanup(&r);
        api_error(res, 500, "server_error", "out of memory");
        return;
    }
    if (r.n_stop_strs) memcpy(h->stop, r.stop_strs, r.n_stop_strs * sizeof(char *));
    h->n_stop = r.n_stop_strs;
    r.n_stop_strs = 0; /* h owns them now */
    h->co = co;
    h->res = res;
    h->stream = r.stream;
    h->chat = r.chat;
    h->tools = r.tools;
    h->k3 = r.chat && r.chat_format == ST_CHAT_K3;
    h->thinking = r.thinking;
    h->include_usage = r.stream && r.include_usage;
    h->created = (int64_t)time(NULL);
    h->n_choices = n;
    h->n_per = r.n;
    h->n_open = 1; /* this function's hold: a choice answered at once cannot free h under it */
    snprintf(h->id, sizeof h->id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)co->t_start,
             (unsigned long long)++co->gen_seq);
    st_http_res_on_close(res, http_gone, h);
    for (int i = 0; i < n; i++) {
        gen_t *g = h->kids[i];
        g->co = co;
        g->res = res;
        g->stream = r.stream;
        g->parent = h;
        g->index = i;
        snprintf(g->id, sizeof g->id, "%s", h->id);
        st_proto_generate_req_t one = r.req;
        if (i / r.n) {
            const st_openai_prompt_t *p = &r.batch[i / r.n - 1];
            one.prompt = p->text;
            one.prompt_tokens = p->ids;
            one.n_prompt_tokens = p->n_ids;
        }
        if (one.has_seed) one.seed += (uint64_t)i; /* n samples of one seed differ, and repeat */
        h->n_open++;
        s = st_coord_gen_submit(co, g, &one); /* ST_OK: g is the front door's now */
        if (s != ST_OK) {
            h->n_open--;
            co->requests_err++;
            h->kids[i] = NULL;
            st_coord_gen_free(g);
            if (h->status == ST_OK) {
                h->status = s;
                snprintf(h->err, sizeof h->err, "%s", st_err_last());
            }
            for (int k = i + 1; k < n; k++) { /* never submitted */
                st_coord_gen_free(h->kids[k]);
                h->kids[k] = NULL;
            }
            for (int k = 0; k < i; k++) /* submitted: cancelled, answered through st_coord_http_done */
                if (h->kids[k]) {
                    h->kids[k]->http_gone = 1;
                    st_coord_gen_client_gone(h->kids[k]);
                }
            break;
        }
    }
    st_openai_req_cleanup(&r);
    hreq_release(h);
}

static void h_completions(const st_http_req_t *req, st_http_res_t *res, void *arg) { h_generate(req, res, arg, 0); }
static void h_chat(const st_http_req_t *req, st_http_res_t *res, void *arg) { h_generate(req, res, arg, 1); }

void st_coord_http_routes(coord_t *co) {
    st_http_route(co->http, "GET", "/healthz", h_healthz, co);
    st_http_route(co->http, "GET", "/health", h_healthz, co); /* vLLM's name */
    st_http_route(co->http, "GET", "/readyz", h_readyz, co);
    st_http_route(co->http, "GET", "/status", h_status, co);
    st_http_route(co->http, "GET", "/metrics", h_metrics, co);
    st_http_route(co->http, "GET", "/v1/models", h_models, co);
    st_http_route(co->http, "POST", "/v1/completions", h_completions, co);
    st_http_route(co->http, "POST", "/v1/chat/completions", h_chat, co);
    st_coord_front_start(co);
}
