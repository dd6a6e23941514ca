/* Coordinator: the client front door. Generate requests (gRPC and HTTP) wait in one bounded FIFO
 * until an attention worker has a free slot, then are proxied to its Worker/Generate stream. Also
 * the watchdogs that keep a stream from hanging (per-token idle timeout, a lost worker) and the
 * probe of the loop's longest stall. Runs on the coordinator's loop thread. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_impl.h"
#include "openai.h"

#define GEN_MAX_RETRIES 3      /* a worker refused before any chunk (full, draining): back to the queue */
#define GEN_BUSY_BACKOFF_S 0.2 /* a refusing worker is not picked again for this long */
#define FRONT_TICK_MS 20       /* the stall probe's period */
#define FRONT_SWEEP_TICKS 10   /* queue and stream timeouts every 200 ms */

int st_coord_queue_cap(const coord_t *co) {
    return co->o.max_queue < 0 ? 0 : co->o.max_queue ? co->o.max_queue : 1024;
}
static double queue_timeout(const coord_t *co) {
    return co->o.queue_timeout_s > 0 ? co->o.queue_timeout_s : 60.0;
}
static double idle_timeout(const coord_t *co) {
    return co->o.stream_idle_timeout_s > 0 ? co->o.stream_idle_timeout_s : 60.0;
}

/* ================================================================ lists */

static void list_push(gen_t **head, gen_t **tail, gen_t *g, int front) {
    g->prev = g->next = NULL;
    if (front) {
        g->next = *head;
        if (*head)
            (*head)->prev = g;
        else if (tail)
            *tail = g;
        *head = g;
    } else {
        g->prev = tail ? *tail : NULL;
        if (g->prev)
            g->prev->next = g;
        else
            *head = g;
        if (tail) *tail = g;
    }
}

static void list_unlink(gen_t **head, gen_t **tail, gen_t *g) {
    if (g->prev)
        g->prev->next = g->next;
    else
        *head = g->next;
    if (g->next)
        g->next->prev = g->prev;
    else if (tail)
        *tail = g->prev;
    g->prev = g->next = NULL;
}

static void q_push(coord_t *co, gen_t *g, int front) {
    g->state = ST_GEN_WAITING;
    list_push(&co->q_head, &co->q_tail, g, front);
    co->n_waiting++;
}

static void q_unlink(coord_t *co, gen_t *g) {
    list_unlink(&co->q_head, &co->q_tail, g);
    co->n_waiting--;
    g->state = 0;
}

static void run_unlink(coord_t *co, gen_t *g) {
    list_unlink(&co->run_head, NULL, g);
    g->state = 0;
}

/* ================================================================ workers */

static int worker_usable(const member_t *m) {
    return m->alive && m->role == ST_PROTO_ROLE_ATTENTION && m->ch;
}

/* The attention worker with the most free slots (capacity - requests proxied to it now), not
 * backing off; NULL when every slot is taken. */
static member_t *pick_worker(coord_t *co) {
    member_t *best = NULL;
    long best_free = 0;
    double now = st_time_sec();
    for (int i = 0; i < co->n_members; i++) {
        member_t *m = &co->members[i];
        if (!worker_usable(m) || m->busy_until > now) continue;
        long fr = (long)m->capacity - (long)m->active;
        if (fr > best_free) {
            best_free = fr;
            best = m;
        }
    }
    return best;
}

static int any_worker(coord_t *co) {
    for (int i = 0; i < co->n_members; i++)
        if (worker_usable(&co->members[i])) return 1;
    return 0;
}

/* ================================================================ ending a request */

static void gen_free(gen_t *g) {
    json_decref(g->lp);
    free(g->lp_off);
    free(g->echo);
    free(g->req);
    free(g->text);
    free(g);
}

void st_coord_gen_free(gen_t *g) { gen_free(g); }

/* Answer the client now with g->status / g->err (or success) and let go of it: a worker stream
 * still open is cancelled and only released when it ends. */
static void gen_answer(gen_t *g) {
    coord_t *co = g->co;
    if (g->detached) return;
    g->detached = 1;
    int ok = g->status == ST_OK && (g->finish == ST_PROTO_FINISH_STOP || g->finish == ST_PROTO_FINISH_LENGTH);
    if (ok) {
        co->requests_ok++;
        if (g->finish == ST_PROTO_FINISH_STOP) co->finished_stop++;
        else co->finished_length++;
        st_hist_add(&co->e2e, st_time_sec() - g->t_enq);
    } else {
        co->requests_err++;
    }
    if (g->call) {
        st_rpc_call_t *call = g->call;
        g->call = NULL;
        st_rpc_call_on_cancel(call, NULL, NULL);
        if (g->status != ST_OK && !g->err_in_chunk)
            st_rpc_call_finish(call, g->status, g->err);
        else if (g->finish == ST_PROTO_FINISH_NONE)
            st_rpc_call_finish(call, ST_ERR_PEER, "the attention worker ended the stream without finishing");
        else /* finished by the worker; an error travelled in the last chunk */
            st_rpc_call_finish(call, ST_OK, NULL);
    } else if (g->res) {
        st_coord_http_done(g); /* the HTTP request's own close callback is rest.c's */
        g->res = NULL;
    }
}

static void gen_fail(gen_t *g, st_status_t s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void gen_fail(gen_t *g, st_status_t s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof g->err, fmt, ap);
    va_end(ap);
    g->status = s;
    if (g->finish != ST_PROTO_FINISH_STOP && g->finish != ST_PROTO_FINISH_LENGTH) g->finish = ST_PROTO_FINISH_ERROR;
    gen_answer(g);
}

/* A running request's stream ended (on_done): give back the worker's slot. */
static void gen_release_slot(gen_t *g) {
    coord_t *co = g->co;
    member_t *m = st_coord_member_find(co, g->worker_id);
    if (m && m->active > 0) m->active--;
    co->active_requests--;
    run_unlink(co, g);
}

/* Stop a running request for a reason of ours (the worker was lost or went quiet): the client is
 * answered now, naming the worker; the upstream stream is cancelled and released when it ends. */
static void gen_abort(gen_t *g, const char *why) {
    if (g->detached) return;
    gen_fail(g, ST_ERR_PEER, "attention worker %s %s", g->worker[0] ? g->worker : "?", why);
    if (g->up) st_rpc_stream_cancel(g->up);
}

void st_coord_gen_stop(gen_t *g) {
    if (g->detached) return;
    g->finish = ST_PROTO_FINISH_STOP;
    g->status = ST_OK;
    gen_answer(g);
    if (g->up) st_rpc_stream_cancel(g->up);
}

/* ================================================================ the worker's stream */

/* The text of one token of the worker's chunk, into co->piece: the checkpoint's tokenizer
 * decodes it (holding back an unfinished UTF-8 character; special tokens give no text), the stop
 * token that ends a sequence gives none, and the end flushes what was held back. */
static const char *chunk_text(gen_t *g, const st_proto_generate_chunk_t *ch) {
    coord_t *co = g->co;
    size_t n = 0;
    int has_token = ch->finish == ST_PROTO_FINISH_NONE || ch->finish == ST_PROTO_FINISH_LENGTH;
    if (has_token &&
        st_tok_stream_put(co->tok, &g->dec, (int32_t)ch->token_id, co->piece, co->piece_cap - 16, &n) != ST_OK) {
        st_log_every(ST_LOG_WARN, 10.0, "coordinator: %s: token %u has no text in the checkpoint's tokenizer: left out",
                     g->id, ch->token_id);
        n = 0;
    }
    if (ch->finish != ST_PROTO_FINISH_NONE) n += st_tok_stream_flush(&g->dec, co->piece + n);
    co->piece[n] = 0;
    return co->piece;
}

static void gen_on_msg(const uint8_t *msg, size_t len, void *arg) {
    gen_t *g = arg;
    coord_t *co = g->co;
    st_proto_generate_chunk_t ch;
    if (g->detached || st_proto_generate_chunk_decode(msg, len, &ch) != ST_OK) return;
    co->stream_bytes += len;
    if (st_proto_generate_chunk_check(&ch, (uint32_t)co->cfg.vocab) != ST_OK) {
        /* a worker's bug: the token is dropped, never indexed with (the stream's end still comes) */
        st_log_every(ST_LOG_WARN, 10.0, "coordinator: %s: a worker's chunk refused: %s", g->id, st_err_last());
        st_proto_generate_chunk_cleanup(&ch);
        return;
    }
    double now = st_time_sec();
    g->chunks++;
    if (ch.finish != ST_PROTO_FINISH_ERROR && ch.finish != ST_PROTO_FINISH_CANCELLED &&
        (ch.text || ch.token_id || ch.finish == ST_PROTO_FINISH_NONE || g->n_tokens < (int)ch.index + 1)) {
        if (ch.finish == ST_PROTO_FINISH_NONE || ch.index >= (uint32_t)g->n_tokens) {
            if (g->n_tokens == 0)
                st_hist_add(&co->ttft, now - g->t0);
            else
                st_hist_add(&co->tpot, now - g->t_last);
            g->n_tokens++;
            co->tokens_total++;
            co->tokens_window++;
        }
    }
    g->t_last = now;
    /* a worker that streams is alive: its chunks count as heartbeats (a busy or starved worker's
     * heartbeats can come late; dropping it would cancel every request it is serving) */
    member_t *w = st_coord_member_find(co, g->worker_id);
    if (w && w->alive && now > w->last_seen) w->last_seen = now;
    if (ch.finish != ST_PROTO_FINISH_NONE) g->finish = ch.finish;
    if (ch.error && ch.error[0]) snprintf(g->err, sizeof g->err, "%s", ch.error);
    /* the worker's text is its byte-level view: the client gets the checkpoint tokenizer's */
    char *worker_text = ch.text;
    ch.text = (char *)chunk_text(g, &ch);
    if (g->call) {
        uint8_t *out = NULL;
        size_t out_len = 0;
        if ((st_proto_generate_chunk_encode(&ch, &out, &out_len) != ST_OK ||
             st_rpc_call_write(g->call, out, out_len) != ST_OK) && g->up)
            st_rpc_stream_cancel(g->up);
        free(out);
    } else if (g->res) {
        st_coord_http_chunk(g, &ch);
    }
    ch.text = worker_text;
    st_proto_generate_chunk_cleanup(&ch);
}

static st_status_t gen_dispatch(coord_t *co, gen_t *g, member_t *w);

static void gen_on_done(st_status_t st, const char *detail, void *arg) {
    gen_t *g = arg;
    coord_t *co = g->co;
    g->up = NULL;
    gen_release_slot(g);
    if (g->detached) { /* answered already (lost worker, idle timeout, client gone) */
        gen_free(g);
        st_coord_queue_pump(co);
        return;
    }
    member_t *m = st_coord_member_find(co, g->worker_id);
    /* full or draining (or not reachable) before any chunk: nothing reached the client, so the
       request goes back to the head of the queue and the worker is left alone for a moment */
    if ((st == ST_ERR_CAPACITY || st == ST_ERR_PEER) && g->chunks == 0 && g->retries < GEN_MAX_RETRIES &&
        !g->http_gone && !(g->call && st_rpc_call_is_cancelled(g->call)) && !co->stopping) {
        g->retries++;
        co->requeued++;
        if (m) m->busy_until = st_time_sec() + GEN_BUSY_BACKOFF_S;
        st_log_every(ST_LOG_INFO, 5.0, "coordinator: attention worker %s refused a request (%s: %s): queued again",
                     g->worker, st_status_str(st), detail ? detail : "");
        q_push(co, g, 1);
        st_coord_queue_pump(co);
        return;
    }
    if (st != ST_OK) {
        /* the worker's own word on a client's mistake stays a client's mistake (400); load and
           loss keep their class; anything else is the worker's failure (502) */
        if (st == ST_ERR_INVALID_ARG || st == ST_ERR_PARSE || st == ST_ERR_OUT_OF_RANGE)
            gen_fail(g, st == ST_ERR_OUT_OF_RANGE ? ST_ERR_OUT_OF_RANGE : ST_ERR_INVALID_ARG, "%s",
                     detail ? detail : st_status_str(st));
        else
            gen_fail(g,
                     st == ST_ERR_CAPACITY || st == ST_ERR_PEER || st == ST_ERR_TIMEOUT || st == ST_ERR_CANCELLED
                         ? st
                         : ST_ERR_INTERNAL,
                     "attention worker %s: %s (%s)", g->worker, st_status_str(st), detail ? detail : "");
    } else if (g->finish == ST_PROTO_FINISH_ERROR || g->finish == ST_PROTO_FINISH_CANCELLED) {
        /* failed by the worker: its message travelled in the last chunk (a gRPC client has it) */
        g->status = g->finish == ST_PROTO_FINISH_CANCELLED ? ST_ERR_CANCELLED : ST_ERR_INTERNAL;
        g->err_in_chunk = 1;
        if (!g->err[0]) snprintf(g->err, sizeof g->err, "attention worker %s: generation failed", g->worker);
        gen_answer(g);
    } else {
        gen_answer(g); /* success, or ended without a finish (answered as an error) */
    }
    gen_free(g);
    st_coord_queue_pump(co);
}

static st_status_t gen_dispatch(coord_t *co, gen_t *g, member_t *w) {
    g->worker_id = w->id;
    snprintf(g->worker, sizeof g->worker, "%.63s", w->name[0] ? w->name : w->endpoint);
    g->t0 = g->t_last = st_time_sec();
    g->chunks = 0;
    st_status_t s = st_rpc_stream_open(w->ch, ST_PROTO_METHOD_WORKER_GENERATE, g->req, g->req_len, 3600u * 1000u,
                                       gen_on_msg, gen_on_done, g, &g->up);
    if (s != ST_OK) return s;
    w->active++;
    co->active_requests++;
    if (!g->retries) co->requests_total++;
    g->state = ST_GEN_RUNNING;
    list_push(&co->run_head, NULL, g, 1);
    return ST_OK;
}

/* ================================================================ the queue */

void st_coord_queue_pump(coord_t *co) {
    if (co->pumping) return; /* NOTE: answering a client can re-enter through a close callback */
    co->pumping = 1;
    while (co->q_head && !co->stopping) {
        member_t *w = pick_worker(co);
        if (!w) break;
        gen_t *g = co->q_head;
        q_unlink(co, g);
        if (gen_dispatch(co, g, w) != ST_OK) {
            w->busy_until = st_time_sec() + GEN_BUSY_BACKOFF_S;
            gen_fail(g, ST_ERR_PEER, "attention worker %s could not be reached: %s", w->name, st_err_last());
            gen_free(g);
        }
    }
    co->pumping = 0;
}

/* The request the worker gets: a text prompt encoded with the checkpoint's tokenizer (special
 * tokens' text allowed: a raw completion prompt is the client's whole template, as in vLLM), and
 * every eos id of the checkpoint among the stop ids unless ignore_eos. */
static st_status_t worker_request(coord_t *co, const st_proto_generate_req_t *r, st_tok_ids_t *ids, uint32_t *stops,
                                  st_proto_generate_req_t *w) {
    *w = *r;
    if (!r->n_prompt_tokens) {
        st_status_t s = st_tokenizer_encode(co->tok, r->prompt, strlen(r->prompt), ST_TOK_ALLOW_SPECIAL, ids);
        if (s != ST_OK) return s;
        if (ids->n == 0) return ST_REJECT(ST_ERR_INVALID_ARG, "the prompt encodes to no tokens");
        w->prompt = NULL;
        w->n_prompt_tokens = ids->n;
        w->prompt_tokens = (uint32_t *)ids->ids; /* ids are non-negative and below the vocabulary */
    }
    const int32_t *eos = NULL;
    int n_eos = r->ignore_eos ? 0 : st_tokenizer_eos(co->tok, &eos);
    if (r->n_stop_ids + (size_t)n_eos > ST_OPENAI_MAX_STOP)
        return ST_REJECT(ST_ERR_INVALID_ARG, "at most %d stop ids (the checkpoint's %d eos ids count too)",
                         ST_OPENAI_MAX_STOP - n_eos, n_eos);
    size_t n = 0;
    for (size_t i = 0; i < r->n_stop_ids; i++) stops[n++] = r->stop_ids[i];
    for (int i = 0; i < n_eos; i++) stops[n++] = (uint32_t)eos[i];
    w->stop_ids = n ? stops : NULL;
    w->n_stop_ids = n;
    return ST_OK;
}

st_status_t st_coord_gen_submit(coord_t *co, gen_t *g, const st_proto_generate_req_t *r) {
    st_openai_limits_t lim = {.model = NULL, .vocab = co->cfg.vocab};
    st_openai_err_t e;
    st_status_t s = st_openai_check(r, &lim, &e);
    if (s != ST_OK) return ST_REJECT(s, "%s", e.message);
    if (!any_worker(co)) return ST_REJECT(ST_ERR_PEER, "no attention worker is available");
    st_coord_queue_pump(co);
    if (co->n_waiting >= st_coord_queue_cap(co) && (co->q_head || !pick_worker(co))) {
        co->rejected_full++;
        return ST_REJECT(ST_ERR_CAPACITY,
                         "server busy: every attention worker slot is taken and %d requests are waiting",
                         co->n_waiting);
    }
    st_tok_ids_t ids = {0};
    uint32_t stops[ST_OPENAI_MAX_STOP];
    st_proto_generate_req_t w;
    s = worker_request(co, r, &ids, stops, &w);
    if (s == ST_OK) s = st_proto_generate_req_encode(&w, &g->req, &g->req_len);
    st_tok_ids_free(&ids);
    if (s != ST_OK) return s;
    g->co = co;
    g->t_enq = st_time_sec();
    g->prompt_tokens = (int)w.n_prompt_tokens;
    co->prompt_tokens_total += w.n_prompt_tokens;
    st_tok_stream_init(&g->dec, ST_TOK_SKIP_SPECIAL);
    q_push(co, g, 0);
    st_coord_queue_pump(co);
    return ST_OK;
}

/* ================================================================ watchdogs */

/* NOTE: answering a client can run a pipelined HTTP request at once (which may queue or start
 * requests), so these loops restart from the head after each answer instead of keeping a next. */
static gen_t *running_on(coord_t *co, uint64_t worker_id) {
    for (gen_t *g = co->run_head; g; g = g->next)
        if (g->worker_id == worker_id && !g->detached) return g;
    return NULL;
}

void st_coord_worker_lost(coord_t *co, uint64_t worker_id) {
    gen_t *g;
    while ((g = running_on(co, worker_id))) {
        co->workers_lost_cancelled++;
        gen_abort(g, "was lost: request cancelled");
    }
}

static void front_sweep(coord_t *co) {
    double now = st_time_sec(), qt = queue_timeout(co), it = idle_timeout(co);
    /* FIFO (a request put back keeps its first arrival): the expired ones are at the head */
    while (co->q_head && now - co->q_head->t_enq > qt) {
        gen_t *g = co->q_head;
        q_unlink(co, g);
        co->rejected_timeout++;
        gen_fail(g, ST_ERR_TIMEOUT,
                 "server busy: no attention worker slot became free within %g s (%d requests waiting)", qt,
                 co->n_waiting);
        gen_free(g);
    }
    for (int again = 1; again;) {
        again = 0;
        for (gen_t *g = co->run_head; g; g = g->next) {
            if (g->detached) continue;
            member_t *m = st_coord_member_find(co, g->worker_id);
            if (!m || !m->alive) { /* membership dropped it (in case it did not say so) */
                st_coord_worker_lost(co, g->worker_id);
                again = 1;
                break;
            }
            if (now - g->t_last > it) {
                co->idle_timeouts++;
                char why[96];
                snprintf(why, sizeof why, "sent nothing for %g s: request cancelled", it);
                gen_abort(g, why);
                again = 1;
                break;
            }
        }
    }
    if (co->q_head) st_coord_queue_pump(co); /* backoffs expire */
}

static void front_stall(coord_t *co, double now) {
    double gap = now - co->front_last - FRONT_TICK_MS / 1000.0;
    co->front_last = now;
    if (!(gap > 0)) gap = 0;
    if (gap > co->stall_max) co->stall_max = gap;
    int64_t sec = (int64_t)now;
    int i = (int)(sec % 60);
    if (co->stall_sec_at[i] != sec) {
        co->stall_sec_at[i] = sec;
        co->stall_sec_max[i] = 0;
    }
    if (gap > co->stall_sec_max[i]) co->stall_sec_max[i] = gap;
}

double st_coord_stall_max_60s(const coord_t *co) {
    int64_t now = (int64_t)st_time_sec();
    double mx = 0;
    for (int i = 0; i < 60; i++)
        if (now - co->stall_sec_at[i] < 60 && co->stall_sec_max[i] > mx) mx = co->stall_sec_max[i];
    return mx;
}

static void on_front_timer(uv_timer_t *t) {
    coord_t *co = t->data;
    if (co->stopping) { /* the roles' shutdown closes everything else; this closes itself */
        uv_close((uv_handle_t *)t, NULL);
        return;
    }
    front_stall(co, st_time_sec());
    if (++co->front_ticks % FRONT_SWEEP_TICKS == 0) front_sweep(co);
}

void st_coord_front_start(coord_t *co) {
    if (co->front_started) return;
    co->front_started = 1;
    uv_timer_init(&co->loop, &co->front_timer);
    co->front_timer.data = co;
    co->front_last = st_time_sec();
    uv_timer_start(&co->front_timer, on_front_timer, FRONT_TICK_MS, FRONT_TICK_MS);
}

/* ================================================================ gRPC Generate */

st_status_t st_coord_rpc_authorized(coord_t *co, st_rpc_call_t *call) {
    if (!co->o.api_key || st_openai_bearer_ok(st_rpc_call_header(call, "authorization"), co->o.api_key)) return ST_OK;
    st_log_every(ST_LOG_WARN, 10.0, "coordinator: %s from %s without a valid API key: refused",
                 st_rpc_call_method(call), st_rpc_call_peer(call) ? st_rpc_call_peer(call) : "?");
    st_rpc_call_finish(call, ST_ERR_AUTH, "missing or invalid API key (send \"authorization: Bearer <key>\")");
    return ST_ERR_AUTH;
}

void st_coord_gen_client_gone(gen_t *g) {
    if (g->detached) return;
    if (g->state == ST_GEN_WAITING) { /* it leaves the queue */
        q_unlink(g->co, g);
        gen_fail(g, ST_ERR_CANCELLED, "cancelled by the client");
        gen_free(g);
        return;
    }
    if (g->up) st_rpc_stream_cancel(g->up); /* answered when the worker's stream ends */
}

static void gen_client_cancel(st_rpc_call_t *call, void *arg) {
    (void)call;
    st_coord_gen_client_gone(arg);
}

void st_coord_h_generate(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    coord_t *co = arg;
    if (st_coord_rpc_authorized(co, call) != ST_OK) return;
    st_proto_generate_req_t r;
    if (st_proto_generate_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        return;
    }
    gen_t *g = calloc(1, sizeof *g);
    if (!g) {
        st_rpc_call_finish(call, ST_ERR_NO_MEMORY, "out of memory");
        st_proto_generate_req_cleanup(&r);
        return;
    }
    g->co = co;
    g->call = call;
    st_rpc_call_on_cancel(call, gen_client_cancel, g);
    st_status_t s = st_coord_gen_submit(co, g, &r);
    st_proto_generate_req_cleanup(&r);
    if (s != ST_OK) {
        co->requests_err++;
        st_rpc_call_on_cancel(call, NULL, NULL);
        st_rpc_call_finish(call, s, st_err_last());
        gen_free(g);
    }
}
