/* st_http on loopback: the server's loop runs on its own thread; this thread is a raw-socket client
 * with receive timeouts. Covers routes (200/404/405), request body, malformed → 400 + close,
 * oversized body → 413 (Content-Length and chunked), oversized headers → 431, keep-alive (sequential
 * and pipelined), SSE streaming of several events then end, and a client leaving mid-stream. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "strata/http.h"

static uv_loop_t loop;
static uv_async_t stop_async;
static st_http_server_t *srv;
static atomic_int closed_streams;

static void h_health(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    st_http_res_send(res, 200, "text/plain", "ok\n", 3);
}

static void h_echo(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    const char *ct = st_http_req_header(req, "content-type");
    st_http_res_json(res, 200, "{s:s%, s:s, s:s}", "body", req->body, req->body_len, "query", req->query, "ct",
                     ct ? ct : "");
}

typedef struct {
    st_http_res_t *res;
    uv_timer_t t;
    int i, n;
} sse_t;

static void sse_free(uv_handle_t *h) { free(h->data); }

static void sse_tick(uv_timer_t *t) {
    sse_t *s = t->data;
    char d[64];
    snprintf(d, sizeof d, "{\"i\":%d}", s->i);
    st_http_res_sse(s->res, "tok", d);
    if (++s->i == s->n) {
        st_http_res_sse(s->res, NULL, "[DONE]");
        st_http_res_stream_end(s->res);
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, sse_free);
    }
}

static void h_events(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    sse_t *s = calloc(1, sizeof *s);
    s->res = res;
    s->n = 5;
    st_http_res_stream_begin(res, 200, "text/event-stream");
    uv_timer_init(&loop, &s->t);
    s->t.data = s;
    uv_timer_start(&s->t, sse_tick, 5, 5);
}

static void slow_closed(st_http_res_t *res, void *arg) {
    atomic_fetch_add(&closed_streams, 1);
    CHECK(!st_http_res_is_open(res), "closed stream reports open");
    CHECK(st_http_res_sse(res, NULL, "late") == ST_ERR_PEER, "write after close must fail with ST_ERR_PEER");
    st_http_res_stream_end(res);
}

static void h_slow(const st_http_req_t *req, st_http_res_t *res, void *arg) {
    st_http_res_on_close(res, slow_closed, NULL);
    st_http_res_sse(res, "first", "hello\nworld"); /* two data lines */
}

static int server_closed;
static void on_server_closed(void *arg) { server_closed = 1; }
static void on_stop(uv_async_t *a) {
    st_http_server_close(srv, on_server_closed, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg) {
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---- raw client ---- */

static int port;

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* Read one response: headers, then Content-Length bytes or chunks up to the 0-chunk. Returns the
 * status, fills body (de-chunked, NUL-terminated). *eof set if the peer closed. -1 on timeout. */
typedef struct {
    char raw[1 << 16];
    size_t len;
} rbuf_t;

static int fill(int fd, rbuf_t *b) {
    if (b->len >= sizeof b->raw - 1) return -1;
    ssize_t r = recv(fd, b->raw + b->len, sizeof b->raw - 1 - b->len, 0);
    if (r <= 0) return (int)r;
    b->len += (size_t)r;
    b->raw[b->len] = 0;
    return 1;
}

static void consume(rbuf_t *b, size_t n) {
    memmove(b->raw, b->raw + n, b->len - n);
    b->len -= n;
    b->raw[b->len] = 0;
}

static int read_response(int fd, rbuf_t *b, char *body, size_t cap, char *head, size_t hcap) {
    char *end;
    while (!(end = strstr(b->raw, "\r\n\r\n")))
        if (fill(fd, b) <= 0) return -1;
    size_t hl = (size_t)(end - b->raw) + 4;
    snprintf(head, hcap, "%.*s", (int)hl, b->raw);
    int status = 0;
    sscanf(b->raw, "HTTP/1.1 %d", &status);
    consume(b, hl);
    size_t bl = 0;
    const char *cl = strcasestr(head, "Content-Length:");
    if (cl) {
        size_t want = strtoul(cl + 15, NULL, 10);
        while (b->len < want)
            if (fill(fd, b) <= 0) return -1;
        bl = ST_MIN(want, cap - 1);
        memcpy(body, b->raw, bl);
        consume(b, want);
    } else if (strcasestr(head, "Transfer-Encoding: chunked")) {
        for (;;) {
            char *le;
            while (!(le = strstr(b->raw, "\r\n")))
                if (fill(fd, b) <= 0) return -1;
            size_t n = strtoul(b->raw, NULL, 16);
            size_t hdr = (size_t)(le - b->raw) + 2;
            while (b->len < hdr + n + 2)
                if (fill(fd, b) <= 0) return -1;
            if (bl + n < cap) {
                memcpy(body + bl, b->raw + hdr, n);
                bl += n;
            }
            consume(b, hdr + n + 2);
            if (n == 0) break;
        }
    }
    body[bl] = 0;
    return status;
}

static int peer_closed(int fd) {
    char c;
    return recv(fd, &c, 1, 0) == 0;
}

static int simple(const char *req, char *body, size_t cap, int *closed) {
    int fd = dial();
    if (fd < 0) return -2;
    send_all(fd, req, strlen(req));
    rbuf_t *b = calloc(1, sizeof *b);
    char head[1024];
    int st = read_response(fd, b, body, cap, head, sizeof head);
    if (closed) *closed = peer_closed(fd);
    free(b);
    close(fd);
    return st;
}

int main(void) {
    alarm(60);
    uv_loop_init(&loop);
    st_http_opts_t o = {.max_body = 4096, .max_header = 2048, .idle_timeout_ms = 5000};
    CHECK(st_http_server_create(&loop, "127.0.0.1", 0, &o, &srv) == ST_OK, "create");
    port = st_http_server_port(srv);
    CHECK(port > 0, "port %d", port);
    st_http_route(srv, "GET", "/healthz", h_health, NULL);
    st_http_route(srv, "POST", "/echo", h_echo, NULL);
    st_http_route(srv, "GET", "/events", h_events, NULL);
    st_http_route(srv, "GET", "/slow", h_slow, NULL);
    uv_async_init(&loop, &stop_async, on_stop);
    pthread_t th;
    pthread_create(&th, NULL, loop_thread, NULL);

    char body[8192];
    int closed = 0;
    CHECK(simple("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", body, sizeof body, NULL) == 200, "healthz");
    CHECK(strcmp(body, "ok\n") == 0, "healthz body '%s'", body);
    CHECK(simple("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", body, sizeof body, NULL) == 404, "unknown path");
    CHECK(strstr(body, "\"/nope\"") != NULL, "404 body names the path: %s", body);
    CHECK(simple("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", body, sizeof body, NULL) == 405, "wrong method");
    CHECK(simple("POST /echo?a=1 HTTP/1.1\r\nHost: x\r\nContent-Type: text/x\r\nContent-Length: 5\r\n\r\nhello", body,
                 sizeof body, NULL) == 200,
          "echo");
    CHECK(strcmp(body, "{\"body\":\"hello\",\"query\":\"a=1\",\"ct\":\"text/x\"}\n") == 0, "echo body %s", body);
    CHECK(simple("POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", body,
                 sizeof body, NULL) == 200 &&
              strstr(body, "\"abcde\""),
          "chunked request body: %s", body);

    CHECK(simple("GARBAGE\r\n\r\n", body, sizeof body, &closed) == 400 && closed, "malformed → 400 + close");
    CHECK(simple("GET /healthz HTTP/1.1\r\nContent-Length: abc\r\n\r\n", body, sizeof body, &closed) == 400 && closed,
          "bad content-length → 400");
    CHECK(simple("POST /echo HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", body, sizeof body, &closed) == 413 && closed,
          "oversized content-length → 413 + close");
    {
        char big[6000];
        int n = snprintf(big, sizeof big, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1400\r\n");
        memset(big + n, 'x', sizeof big - (size_t)n - 1);
        big[sizeof big - 1] = 0;
        CHECK(simple(big, body, sizeof body, &closed) == 413 && closed, "oversized chunked body → 413");
    }
    {
        char hdr[4096];
        int n = snprintf(hdr, sizeof hdr, "GET /healthz HTTP/1.1\r\nX-Big: ");
        memset(hdr + n, 'y', 3000);
        strcpy(hdr + n + 3000, "\r\n\r\n");
        CHECK(simple(hdr, body, sizeof body, &closed) == 431 && closed, "oversized headers → 431");
    }

    /* keep-alive: sequential, then pipelined on the same connection */
    {
        int fd = dial();
        rbuf_t *b = calloc(1, sizeof *b);
        char head[1024];
        const char *r1 = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        send_all(fd, r1, strlen(r1));
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 200, "keep-alive 1");
        CHECK(strcasestr(head, "Connection: keep-alive") != NULL, "keep-alive header: %s", head);
        send_all(fd, r1, strlen(r1));
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 200 && !strcmp(body, "ok\n"), "keep-alive 2");
        const char *pipe3 = "GET /healthz HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /nope HTTP/1.1\r\n\r\n";
        send_all(fd, pipe3, strlen(pipe3));
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 200, "pipelined 1");
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 200 && strstr(body, "\"hi\""),
              "pipelined 2: %s", body);
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 404, "pipelined 3");
        const char *last = "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n";
        send_all(fd, last, strlen(last));
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 200, "close request");
        CHECK(peer_closed(fd), "server closes after Connection: close");
        free(b);
        close(fd);
    }

    /* SSE: 5 events + [DONE], then the stream ends and the connection stays usable */
    {
        int fd = dial();
        rbuf_t *b = calloc(1, sizeof *b);
        char head[1024];
        const char *r = "GET /events HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n";
        send_all(fd, r, strlen(r));
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 200, "sse status");
        CHECK(strcasestr(head, "Content-Type: text/event-stream") != NULL, "sse content type: %s", head);
        const char *want = "event: tok\ndata: {\"i\":0}\n\nevent: tok\ndata: {\"i\":1}\n\nevent: tok\ndata: {\"i\":2}\n\n"
                           "event: tok\ndata: {\"i\":3}\n\nevent: tok\ndata: {\"i\":4}\n\ndata: [DONE]\n\n";
        CHECK(strcmp(body, want) == 0, "sse body:\n%s", body);
        const char *r1 = "GET /healthz HTTP/1.1\r\n\r\n";
        send_all(fd, r1, strlen(r1));
        CHECK(read_response(fd, b, body, sizeof body, head, sizeof head) == 200, "request after a stream");
        free(b);
        close(fd);
    }

    /* client leaves mid-stream: the handler's on_close fires and it ends the response */
    {
        int fd = dial();
        const char *r = "GET /slow HTTP/1.1\r\n\r\n";
        send_all(fd, r, strlen(r));
        char tmp[512];
        size_t got = 0;
        while (!strstr(tmp, "world\n\n") && got < sizeof tmp - 1) {
            ssize_t n = recv(fd, tmp + got, sizeof tmp - 1 - got, 0);
            if (n <= 0) break;
            got += (size_t)n;
            tmp[got] = 0;
        }
        CHECK(strstr(tmp, "event: first\ndata: hello\ndata: world\n\n") != NULL, "first event: %s", tmp);
        close(fd);
        for (int i = 0; i < 200 && atomic_load(&closed_streams) == 0; i++) usleep(10000);
        CHECK(atomic_load(&closed_streams) == 1, "on_close fired %d times", atomic_load(&closed_streams));
    }

    /* server still healthy after all of that */
    CHECK(simple("GET /healthz HTTP/1.1\r\n\r\n", body, sizeof body, NULL) == 200, "still serving");

    uv_async_send(&stop_async);
    pthread_join(th, NULL);
    CHECK(server_closed, "server close callback");
    CHECK(uv_loop_close(&loop) == 0, "loop closed cleanly");
    return st_test_done();
}
