/* Coordinator HTTP: health, readiness, /status JSON, Prometheus /metrics, and the OpenAI-compatible
 * /v1/completions (plain and SSE streaming) and /v1/models. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "coord_impl.h"

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

static void json_reply(st_http_res_t *res, int status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    if (s) st_http_res_send(res, status, "application/json", s, strlen(s));
    else st_http_res_send(res, 500, "text/plain", "json\n", 5);
    free(s);
    json_decref(j);
}

static void api_error(st_http_res_t *res, int status, const char *type, const char *msg) {
    json_reply(res, status, json_pack("{s:{s:s, s:s, s:n}}", "error", "message", msg, "type", type, "code"));
}

/* Valid UTF-8 out of arbitrary bytes (byte-level tokens split characters): complete sequences are
 * copied, invalid bytes become U+FFFD, and an incomplete sequence at the end is held back unless
 * final. Returns bytes consumed from in; out needs 3·n + 1. */
static size_t utf8_clean(const unsigned char *in, size_t n, char *out, size_t *out_len, int final) {
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned char c = in[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0) goto bad;
        if (i + len > n) {
            if (!final) break;
            goto bad;
        }
        for (size_t k = 1; k < len; k++)
            if ((in[i + k] & 0xC0) != 0x80) goto bad;
        memcpy(out + o, in + i, len);
        o += len;
        i += len;
        continue;
    bad:
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i++;
    }
    out[o] = 0;
    *out_len = o;
    return i;
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
    for (int i = 0; i < co->n_members; i++) {
        member_t *m = &co->members[i];
        json_t *j = json_pack("{s:I, s:s, s:s, s:s, s:b, s:i, s:i, s:I, s:f, s:i}", "id", (json_int_t)m->id, "role",
                              role_name(m->role), "name", m->name, "endpoint", m->endpoint, "alive", m->alive, "capacity",
                              (int)m->capacity, "inflight", (int)m->inflight, "step", (json_int_t)m->step,
                              "last_seen_s_ago", st_time_sec() - m->last_seen, "active_requests", m->active);
        if (m->role == ST_PROTO_ROLE_EXPERT) json_object_set_new(j, "experts_held", json_integer(st_placement_count(&co->place, m->id)));
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
    json_t *root = json_pack(
        "{s:s, s:s, s:f, s:b, s:s, s:{s:i, s:i, s:i, s:i}, s:{s:I, s:i, s:b}, s:{s:I, s:I, s:f, s:I}, s:o, s:o, s:f,"
        " s:{s:I, s:I, s:I, s:I, s:i, s:f, s:I}}",
        "version", STRATA_VERSION, "model", co->model, "uptime_s", st_time_sec() - co->t_start, "ready", st_coord_ready(co),
        "routing", co->o.quantile ? "quantile" : "topk",
        "shape", "layers", c->n_layers, "experts", c->n_experts, "top_k", c->top_k, "moe_layers", c->n_layers - c->first_k_dense,
        "placement", "version", (json_int_t)co->place.version, "replicas", co->place.replicas, "complete", st_placement_complete(&co->place),
        "thresholds", "version", (json_int_t)co->tau_version, "steps", (json_int_t)co->tau_steps, "max_rel_uncertainty",
        qs.max_rel_uncert, "set", (json_int_t)qs.n_set,
        "members", members, "expert_load_last_step", loads, "expert_load_max_over_mean", maxmean,
        "throughput", "requests_total", (json_int_t)co->requests_total, "requests_ok", (json_int_t)co->requests_ok,
        "requests_error", (json_int_t)co->requests_err, "tokens_total", (json_int_t)co->tokens_total, "active_requests",
        co->active_requests, "tokens_per_s", co->tokens_per_s, "dispatch_bytes_total", (json_int_t)co->dispatch_bytes);
    /* where a worker step's time goes (means over the reported steps, all workers) */
    double n = co->stage_steps ? (double)co->stage_steps : 1.0;
    static const char *names[ST_PROTO_STAGES] = {"attention", "dispatch", "wait", "expert", "combine", "thresholds", "network"};
    json_t *split = json_object();
    for (int k = 0; k < ST_PROTO_STAGES; k++) json_object_set_new(split, names[k], json_real(1e3 * co->stage_s[k] / n));
    json_object_set_new(split, "coordinator_merge", json_real(co->merges ? 1e3 * co->merge_s / (double)co->merges : 0));
    json_object_set_new(split, "steps", json_integer((json_int_t)co->stage_steps));
    json_object_set_new(split, "dispatch_bytes", json_integer((json_int_t)co->dispatch_bytes));
    json_object_set_new(split, "reply_bytes", json_integer((json_int_t)co->reply_bytes));
    json_object_set_new(split, "messages", json_integer((json_int_t)co->messages));
    json_object_set_new(root, "step_ms", split);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

static void hist_metric(buf_t *b, const char *name, const char *help, const st_hist_t *h) {
    bprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        cum += h->count[i];
        bprintf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[HIST_BUCKETS];
    bprintf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum, name,
            (unsigned long long)h->n);
}

static void h_metrics(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    coord_t *co = arg;
    const st_config_t *c = &co->cfg;
    buf_t b = {0};
    bprintf(&b, "# HELP strata_requests_total Generate requests by outcome.\n# TYPE strata_requests_total counter\n");
    bprintf(&b, "strata_requests_total{outcome=\"ok\"} %llu\nstrata_requests_total{outcome=\"error\"} %llu\n",
            (unsigned long long)co->requests_ok, (unsigned long long)co->requests_err);
    bprintf(&b, "# HELP strata_requests_active Requests being generated now.\n# TYPE strata_requests_active gauge\n"
                "strata_requests_active %d\n", co->active_requests);
    bprintf(&b, "# HELP strata_tokens_generated_total Tokens streamed to clients.\n# TYPE strata_tokens_generated_total counter\n"
                "strata_tokens_generated_total %llu\n", (unsigned long long)co->tokens_total);
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
    static const char *stages[ST_PROTO_STAGES] = {"attention", "dispatch", "wait", "expert", "combine", "thresholds", "network"};
    bprintf(&b, "# HELP strata_step_stage_seconds_total Worker step time by stage.\n# TYPE strata_step_stage_seconds_total counter\n");
    for (int k = 0; k < ST_PROTO_STAGES; k++)
        bprintf(&b, "strata_step_stage_seconds_total{stage=\"%s\"} %.6f\n", stages[k], co->stage_s[k]);
    bprintf(&b, "# HELP strata_reply_bytes_total Bytes expert servers sent back.\n# TYPE strata_reply_bytes_total counter\n"
                "strata_reply_bytes_total %llu\n", (unsigned long long)co->reply_bytes);
    hist_metric(&b, "strata_time_to_first_token_seconds", "Time from request to first token.", &co->ttft);
    hist_metric(&b, "strata_time_per_output_token_seconds", "Time between tokens of a request.", &co->tpot);
    size_t cells = (size_t)c->n_layers * c->n_experts;
    uint64_t *load = calloc(cells + 1, sizeof(uint64_t));
    if (load) {
        last_load(co, load);
        bprintf(&b, "# HELP strata_expert_load_tokens Tokens routed to an expert in the last reported step.\n"
                    "# TYPE strata_expert_load_tokens gauge\n");
        for (int l = c->first_k_dense; l < c->n_layers; l++)
            for (int e = 0; e < c->n_experts; e++)
                bprintf(&b, "strata_expert_load_tokens{layer=\"%d\",expert=\"%d\"} %llu\n", l, e,
                        (unsigned long long)load[(size_t)l * c->n_experts + e]);
        free(load);
    }
    st_http_res_send(res, 200, "text/plain; version=0.0.4", b.p ? b.p : "", b.n);
    free(b.p);
}

static void h_healthz(const st_http_req_t *req, st_http_res_t *res, void *arg) {
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
    char *s = st_coord_status_json(arg);
    if (s) st_http_res_send(res, 200, "application/json", s, strlen(s));
    else st_http_res_send(res, 500, "text/plain", "status\n", 7);
    free(s);
}

static void h_models(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    coord_t *co = arg;
    json_reply(res, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", co->model, "object",
                                   "model", "created", (json_int_t)co->t_start, "owned_by", "strata"));
}

/* ================================================================ /v1/completions */

static json_t *completion_obj(gen_t *g, const char *text, const char *finish) {
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:s, s:i, s:n, s:s?}]}", "id", g->id, "object", "text_completion", "created",
                     (json_int_t)time(NULL), "model", g->co->model, "choices", "text", text, "index", 0, "logprobs",
                     "finish_reason", finish);
}

static const char *finish_name(st_proto_finish_t f) {
    return f == ST_PROTO_FINISH_STOP ? "stop" : f == ST_PROTO_FINISH_LENGTH ? "length" : NULL;
}

static void text_append(gen_t *g, const char *s) {
    size_t n = strlen(s);
    if (g->text_len + n + 1 > g->text_cap) {
        size_t nc = (g->text_cap + n + 1) * 2;
        char *np = realloc(g->text, nc);
        if (!np) return;
        g->text = np;
        g->text_cap = nc;
    }
    memcpy(g->text + g->text_len, s, n + 1);
    g->text_len += n;
}

void st_coord_http_chunk(gen_t *g, const st_proto_generate_chunk_t *ch) {
    if (ch->finish == ST_PROTO_FINISH_ERROR || ch->finish == ST_PROTO_FINISH_CANCELLED) return;
    if (ch->text && ch->text[0]) text_append(g, ch->text);
    if (!g->stream || g->http_gone) return;
    /* emit the complete characters that arrived since the last event */
    int final = ch->finish != ST_PROTO_FINISH_NONE;
    size_t n = g->text_len - g->emitted, cl = 0;
    char *clean = malloc(3 * n + 1);
    if (!clean) return;
    g->emitted += utf8_clean((const unsigned char *)g->text + g->emitted, n, clean, &cl, final);
    if (cl > 0 || final) {
        json_t *o = completion_obj(g, clean, final ? finish_name(ch->finish) : NULL);
        char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (js) st_http_res_sse(g->res, NULL, js);
        free(js);
        json_decref(o);
    }
    free(clean);
}

void st_coord_http_done(gen_t *g) {
    int ok = g->finish == ST_PROTO_FINISH_STOP || g->finish == ST_PROTO_FINISH_LENGTH;
    if (g->stream) {
        if (!ok && !g->http_gone) {
            json_t *e = json_pack("{s:{s:s, s:s}}", "error", "message", g->err[0] ? g->err : "generation failed", "type",
                                  "server_error");
            char *js = e ? json_dumps(e, JSON_COMPACT) : NULL;
            if (js) st_http_res_sse(g->res, NULL, js);
            free(js);
            json_decref(e);
        }
        if (!g->http_gone) st_http_res_sse(g->res, NULL, "[DONE]");
        st_http_res_stream_end(g->res);
        return;
    }
    if (!ok) {
        api_error(g->res, g->finish == ST_PROTO_FINISH_CANCELLED ? 499 : 500, "server_error",
                  g->err[0] ? g->err : "generation failed");
        return;
    }
    size_t cl = 0;
    char *clean = malloc(3 * g->text_len + 1);
    if (!clean) {
        api_error(g->res, 500, "server_error", "out of memory");
        return;
    }
    utf8_clean((const unsigned char *)(g->text ? g->text : ""), g->text_len, clean, &cl, 1);
    json_t *o = completion_obj(g, clean, finish_name(g->finish));
    json_object_set_new(o, "usage", json_pack("{s:i, s:i, s:i}", "prompt_tokens", g->prompt_tokens, "completion_tokens",
                                              g->n_tokens, "total_tokens", g->prompt_tokens + g->n_tokens));
    json_reply(g->res, 200, o);
    free(clean);
}

static void http_gone(st_http_res_t *res, void *arg) {
    gen_t *g = arg;
    g->http_gone = 1;
    if (g->up) st_rpc_stream_cancel(g->up);
}

static int parse_prompt(json_t *p, st_proto_generate_req_t *r, const char **err) {
    if (json_is_string(p)) {
        r->prompt = (char *)json_string_value(p);
        return 0;
    }
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) {
        r->prompt = (char *)json_string_value(json_array_get(p, 0));
        return 0;
    }
    if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n = json_array_size(p);
        r->prompt_tokens = malloc(sizeof(uint32_t) * n);
        if (!r->prompt_tokens) return -1;
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(p, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff) {
                *err = "prompt token arrays must hold non-negative integers";
                return -1;
            }
            r->prompt_tokens[i] = (uint32_t)json_integer_value(v);
        }
        r->n_prompt_tokens = n;
        return 0;
    }
    *err = "prompt must be a string, a one-string array, or an array of token ids";
    return -1;
}

static void h_completions(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    coord_t *co = arg;
    json_error_t je;
    json_t *body = json_loadb(req->body ? req->body : "", req->body_len, 0, &je);
    if (!body || !json_is_object(body)) {
        char msg[300];
        snprintf(msg, sizeof msg, "request body is not a JSON object: %s (line %d column %d)", je.text, je.line, je.column);
        api_error(res, 400, "invalid_request_error", msg);
        json_decref(body);
        return;
    }
    st_proto_generate_req_t r = {.max_tokens = 16, .temperature = 1.0f, .top_p = 1.0f};
    const char *err = NULL;
    json_t *v;
    if (!(v = json_object_get(body, "prompt"))) err = "missing 'prompt'";
    else if (parse_prompt(v, &r, &err) != 0 && !err) err = "out of memory";
    if (!err && (v = json_object_get(body, "max_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) err = "'max_tokens' must be a positive integer";
        else r.max_tokens = (uint32_t)json_integer_value(v);
    }
    if (!err && (v = json_object_get(body, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v)) err = "'temperature' must be a number";
        else r.temperature = (float)json_number_value(v);
    }
    if (!err && (v = json_object_get(body, "top_p")) && !json_is_null(v)) {
        if (!json_is_number(v)) err = "'top_p' must be a number";
        else r.top_p = (float)json_number_value(v);
    }
    if (!err && (v = json_object_get(body, "top_k")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < -1) err = "'top_k' must be an integer";
        else r.top_k = json_integer_value(v) > 0 ? (uint32_t)json_integer_value(v) : 0;
    }
    if (!err && (v = json_object_get(body, "seed")) && !json_is_null(v)) {
        if (!json_is_integer(v)) err = "'seed' must be an integer";
        else {
            r.seed = (uint64_t)json_integer_value(v);
            r.has_seed = 1;
        }
    }
    if (!err && (v = json_object_get(body, "n")) && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != 1))
        err = "only n = 1 is supported";
    if (!err && (v = json_object_get(body, "best_of")) && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != 1))
        err = "only best_of = 1 is supported";
    if (!err && (v = json_object_get(body, "logprobs")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 0))
        err = "logprobs are not supported";
    if (!err && (v = json_object_get(body, "echo")) && json_is_true(v)) err = "echo is not supported";
    if (!err && (v = json_object_get(body, "ignore_eos")) && !json_is_null(v)) { /* vLLM's extension */
        if (!json_is_boolean(v)) err = "'ignore_eos' must be a boolean";
        else r.ignore_eos = json_is_true(v);
    }
    uint32_t stops[16];
    if (!err && (v = json_object_get(body, "stop")) && !json_is_null(v)) {
        /* byte-level tokenizer: a one-byte stop string is a stop token */
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        for (size_t i = 0; i < n && !err; i++) {
            json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_string(s) || json_string_length(s) != 1 || n > 16) err = "'stop' supports up to 16 single-byte strings";
            else stops[i] = (unsigned char)json_string_value(s)[0];
        }
        if (!err) {
            r.stop_ids = stops;
            r.n_stop_ids = n;
        }
    }
    int stream = json_is_true(json_object_get(body, "stream"));
    if (!err && (v = json_object_get(body, "model")) && json_is_string(v) && strcmp(json_string_value(v), co->model) != 0) {
        static char m[300];
        snprintf(m, sizeof m, "model '%s' is not served here (this server has '%s')", json_string_value(v), co->model);
        err = m;
    }
    if (err) {
        api_error(res, 400, "invalid_request_error", err);
        free(r.prompt_tokens);
        json_decref(body);
        co->requests_err++;
        return;
    }
    gen_t *g = calloc(1, sizeof *g);
    st_status_t s = g ? st_coord_gen_start(co, g, &r) : ST_ERR_NO_MEMORY;
    free(r.prompt_tokens);
    json_decref(body);
    if (s != ST_OK) {
        co->requests_err++;
        api_error(res, s == ST_ERR_CAPACITY ? 503 : 400, s == ST_ERR_CAPACITY ? "server_busy" : "invalid_request_error",
                  st_err_last());
        free(g);
        return;
    }
    snprintf(g->id, sizeof g->id, "cmpl-%llx%04llx", (unsigned long long)co->t_start, (unsigned long long)++co->gen_seq);
    g->res = res;
    g->stream = stream;
    st_http_res_on_close(res, http_gone, g);
    if (stream) st_http_res_stream_begin(res, 200, "text/event-stream");
}

void st_coord_http_routes(coord_t *co) {
    st_http_route(co->http, "GET", "/healthz", h_healthz, co);
    st_http_route(co->http, "GET", "/readyz", h_readyz, co);
    st_http_route(co->http, "GET", "/status", h_status, co);
    st_http_route(co->http, "GET", "/metrics", h_metrics, co);
    st_http_route(co->http, "GET", "/v1/models", h_models, co);
    st_http_route(co->http, "POST", "/v1/completions", h_completions, co);
}
