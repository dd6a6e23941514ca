/* libFuzzer harness for HTTP request parsing (common/http), without sockets: arbitrary bytes are
 * what a client sends to a fake connection of a server with a few routes (plain, echo, SSE stream,
 * a response held open across loop iterations, a header lookup). Checks: no crash or sanitizer
 * report, the connection never stalls, and everything the server writes parses as a sequence of
 * complete HTTP/1.1 responses (each starts with "HTTP/1.1 ").
 *
 * Input: byte 0 = read size (low 6 bits) and whether the connection's deadline fires at the end
 * (bit 7); byte 1 = input buffer size; byte 2 = header/body limits; the rest is the client's bytes.
 * Build: clang -g -O1 -fsanitize=fuzzer,address,undefined -Icommon/base/include -Icommon/http/include
 *        -Icommon/http -I/usr/share/include/llhttp fuzz/fuzz_http.c common/http/http.c
 *        common/base/base.c common/base/secret.c /usr/share/llhttp/{api,http,llhttp}.c
 *        -luv -ljansson -lssl -lcrypto -lm */
#include <llhttp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "http_fuzz.h"
#include "strata/base.h"
#include "strata/http.h"

static uv_loop_t loop;
static int holds; /* responses held open, ended by a 0 ms timer */

static struct {
    char *p;
    size_t n, cap;
} out;

static void sink(void *arg, const void *d, size_t n) {
    if (out.n + n > out.cap) {
        size_t cap = out.cap ? out.cap : 4096;
        while (cap < out.n + n) cap *= 2;
        char *p = realloc(out.p, cap);
        if (!p) abort();
        out.p = p;
        out.cap = cap;
    }
    memcpy(out.p + out.n, d, n);
    out.n += n;
}

static void h_root(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    st_http_res_send(res, 200, "text/plain", "ok\n", 3);
}

static void h_echo(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    st_http_res_send(res, 200, "application/octet-stream", req->body, req->body_len);
}

static void h_header(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    const char *v = st_http_req_header(req, "x-a");
    if (!v) v = "-";
    st_http_res_send(res, 200, "text/plain", v, strlen(v));
}

static void h_sse(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    st_http_res_sse(res, "e", "a\nb");
    st_http_res_sse(res, NULL, req->query);
    st_http_res_stream_end(res);
}

typedef struct {
    uv_timer_t t;
    st_http_res_t *res;
} hold_t;

static void hold_free(uv_handle_t *h) {
    free(h->data);
    holds--;
}

static void hold_end(uv_timer_t *t) {
    hold_t *h = t->data;
    if (st_http_res_is_open(h->res)) st_http_res_sse(h->res, NULL, "late");
    st_http_res_stream_end(h->res);
    uv_close((uv_handle_t *)t, hold_free);
}

static void h_hold(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    hold_t *h = calloc(1, sizeof *h);
    if (!h) abort();
    h->res = res;
    h->t.data = h;
    holds++;
    st_http_res_stream_begin(res, 200, "text/plain");
    uv_timer_init(&loop, &h->t);
    uv_timer_start(&h->t, hold_end, 0, 0);
}

static int resp_headers(llhttp_t *p) {
    if (p->http_major != 1 || p->http_minor != 1) __builtin_trap(); /* every response says HTTP/1.1 */
    return 0;
}

static int server_done;
static void on_done(void *arg) { server_done = 1; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    st_log_set_level(ST_LOG_ERROR);
    uv_loop_init(&loop);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    static const size_t in_caps[8] = {0, 1, 7, 64, 300, 1024, 4096, 20000};
    size_t chunk = (data[0] & 63) ? (size_t)(data[0] & 63) * (data[0] & 64 ? 97 : 1) : 1u << 20;
    int expire = data[0] >> 7;
    st_http_opts_t o = {.max_header = (size_t)64 << (data[2] & 7), .max_body = (size_t)16 << ((data[2] >> 3) & 15)};
    st_http_server_t *srv;
    if (st_http_server_create_detached(&loop, &o, in_caps[data[1] & 7], &srv) != ST_OK) abort();
    st_http_route(srv, "GET", "/", h_root, NULL);
    st_http_route(srv, "POST", "/echo", h_echo, NULL);
    st_http_route(srv, "PUT", "/echo", h_echo, NULL);
    st_http_route(srv, "GET", "/h", h_header, NULL);
    st_http_route(srv, "GET", "/sse", h_sse, NULL);
    st_http_route(srv, "GET", "/hold", h_hold, NULL);
    out.n = 0;
    if (st_http_fuzz_run(srv, data + 3, size - 3, chunk, expire, sink, NULL) != 0) __builtin_trap(); /* a stall */
    for (int i = 0; holds && i < 1000; i++) uv_run(&loop, UV_RUN_NOWAIT);
    if (holds) __builtin_trap(); /* a held response never ended */
    server_done = 0;
    st_http_server_close(srv, on_done, NULL);
    if (!server_done) __builtin_trap();

    if (out.n) {
        if (out.n < 9 || memcmp(out.p, "HTTP/1.1 ", 9) != 0) __builtin_trap();
        llhttp_settings_t rs;
        llhttp_settings_init(&rs);
        rs.on_headers_complete = resp_headers;
        llhttp_t rp;
        llhttp_init(&rp, HTTP_RESPONSE, &rs);
        if (llhttp_execute(&rp, out.p, out.n) != HPE_OK) __builtin_trap(); /* not a sequence of responses */
        if (llhttp_finish(&rp) != HPE_OK) __builtin_trap(); /* the last response is complete */
    }
    return 0;
}
