/* Coordinator: the client front door. Generate requests (gRPC and HTTP) are started here and
 * proxied to an attention worker's Worker/Generate stream. Runs on the coordinator's loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_impl.h"


/* The attention worker with the most free capacity. */
static member_t *pick_worker(coord_t *co) {
    member_t *best = NULL;
    long best_free = -(1L << 40);
    for (int i = 0; i < co->n_members; i++) {
        member_t *m = &co->members[i];
        if (!m->alive || m->role != ST_PROTO_ROLE_ATTENTION || !m->ch) continue;
        long used = (long)ST_MAX((long)m->inflight, (long)m->active);
        long fr = (long)m->capacity - used;
        if (fr > best_free) {
            best_free = fr;
            best = m;
        }
    }
    return best; /* a full worker queues the request (up to twice its slots) */
}

static void gen_release(gen_t *g) {
    member_t *m = st_coord_member_find(g->co, g->worker_id);
    if (m) m->active--;
    g->co->active_requests--;
    free(g->text);
    free(g);
}

static void gen_on_msg(const uint8_t *msg, size_t len, void *arg) {
    gen_t *g = arg;
    coord_t *co = g->co;
    st_proto_generate_chunk_t ch;
    if (st_proto_generate_chunk_decode(msg, len, &ch) != ST_OK) return;
    double now = st_time_sec();
    if (ch.finish != ST_PROTO_FINISH_ERROR && ch.finish != ST_PROTO_FINISH_CANCELLED && (ch.text || ch.token_id || ch.finish == ST_PROTO_FINISH_NONE || g->n_tokens < (int)ch.index + 1)) {
        if (ch.finish == ST_PROTO_FINISH_NONE || ch.index >= (uint32_t)g->n_tokens) {
            if (g->n_tokens == 0) st_hist_add(&co->ttft, now - g->t0);
            else st_hist_add(&co->tpot, now - g->t_last);
            g->t_last = now;
            g->n_tokens++;
            co->tokens_total++;
            co->tokens_window++;
        }
    }
    if (ch.finish != ST_PROTO_FINISH_NONE) g->finish = ch.finish;
    if (ch.error && ch.error[0]) snprintf(g->err, sizeof g->err, "%s", ch.error);
    if (g->call) {
        if (st_rpc_call_write(g->call, msg, len) != ST_OK && g->up) st_rpc_stream_cancel(g->up);
    } else if (g->res) {
        st_coord_http_chunk(g, &ch);
    }
    st_proto_generate_chunk_cleanup(&ch);
}

static void gen_on_done(st_status_t st, const char *detail, void *arg) {
    gen_t *g = arg;
    coord_t *co = g->co;
    g->up = NULL;
    if (st != ST_OK && !g->err[0]) {
        member_t *m = st_coord_member_find(co, g->worker_id);
        snprintf(g->err, sizeof g->err, "attention worker %s: %s (%s)", m ? m->name : "?", st_status_str(st), detail ? detail : "");
        g->finish = ST_PROTO_FINISH_ERROR;
    }
    int ok = g->finish == ST_PROTO_FINISH_STOP || g->finish == ST_PROTO_FINISH_LENGTH;
    if (ok) co->requests_ok++;
    else co->requests_err++;
    if (g->call) {
        if (st != ST_OK) /* the worker went away mid-stream: the client sees the error, naming it */
            st_rpc_call_finish(g->call, st, g->err);
        else if (g->finish == ST_PROTO_FINISH_NONE)
            st_rpc_call_finish(g->call, ST_ERR_INTERNAL, "the attention worker ended the stream without finishing");
        else /* finished by the worker; an error travelled in the last chunk */
            st_rpc_call_finish(g->call, ST_OK, NULL);
    } else if (g->res) {
        st_coord_http_done(g);
    }
    gen_release(g);
}

static void gen_client_cancel(st_rpc_call_t *call, void *arg) {
    gen_t *g = arg;
    if (g->up) st_rpc_stream_cancel(g->up);
}

st_status_t st_coord_gen_start(coord_t *co, gen_t *g, const st_proto_generate_req_t *r) {
    if (r->max_tokens == 0 || r->max_tokens > 1000000)
        return ST_FAIL(ST_ERR_INVALID_ARG, "max_tokens must be 1..1000000");
    if (!r->n_prompt_tokens && (!r->prompt || !r->prompt[0])) return ST_FAIL(ST_ERR_INVALID_ARG, "empty prompt");
    for (size_t i = 0; i < r->n_prompt_tokens; i++)
        if (r->prompt_tokens[i] >= (uint32_t)co->cfg.vocab)
            return ST_FAIL(ST_ERR_OUT_OF_RANGE, "prompt token %u outside vocabulary 0..%d", r->prompt_tokens[i], co->cfg.vocab - 1);
    if (!(r->temperature >= 0) || r->temperature > 100 || !(r->top_p >= 0) || r->top_p > 1)
        return ST_FAIL(ST_ERR_INVALID_ARG, "temperature must be 0..100 and top_p 0..1");
    member_t *w = pick_worker(co);
    if (!w) return ST_FAIL(ST_ERR_CAPACITY, "no attention worker with free capacity");
    uint8_t *buf;
    size_t len;
    st_status_t s = st_proto_generate_req_encode(r, &buf, &len);
    if (s != ST_OK) return s;
    g->co = co;
    g->worker_id = w->id;
    g->t0 = g->t_last = st_time_sec();
    g->prompt_tokens = r->n_prompt_tokens ? (int)r->n_prompt_tokens : (int)strlen(r->prompt);
    s = st_rpc_stream_open(w->ch, ST_PROTO_METHOD_WORKER_GENERATE, buf, len, 3600u * 1000u, gen_on_msg, gen_on_done, g, &g->up);
    free(buf);
    if (s != ST_OK) return s;
    w->active++;
    co->active_requests++;
    co->requests_total++;
    return ST_OK;
}

void st_coord_h_generate(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    st_proto_generate_req_t r;
    if (st_proto_generate_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        return;
    }
    gen_t *g = calloc(1, sizeof *g);
    st_status_t s = g ? st_coord_gen_start(co, g, &r) : ST_ERR_NO_MEMORY;
    if (s != ST_OK) {
        co->requests_err++;
        st_rpc_call_finish(call, s, st_err_last());
        free(g);
    } else {
        g->call = call;
        st_rpc_call_on_cancel(call, gen_client_cancel, g);
    }
    st_proto_generate_req_cleanup(&r);
}

void st_coord_worker_lost(coord_t *co, uint64_t worker_id) {
    (void)co;
    (void)worker_id;
}

void st_coord_queue_pump(coord_t *co) { (void)co; }
