/* The coordinator's proxying against a scripted attention worker (issue 13): a real
 * strata-coordinator process, and in this process a fake worker that registers through
 * common/member and answers Worker/Generate as each prompt's first token says:
 *   1  refuse once (RESOURCE_EXHAUSTED), then serve: the request goes back to the queue → 200
 *   5  refuse always: bounded retries, then 429 with Retry-After
 *   2  INVALID_ARGUMENT (a client's mistake the worker found) → 400, also for a stream
 *   3  one token, then silence: the stream's idle timeout ends it with an error naming the worker
 *   4  an error chunk before any token → a real status (502), never a 500 or a 200
 *   6  serve three tokens (the control)
 *   7  stop heartbeating (st_member_stop), then stream twelve tokens 100 ms apart, 1.2 s in all, twice
 *      the coordinator's 600 ms limit: the chunks prove the worker alive and the request completes
 * HTTP clients run on a thread; the fake worker on the loop thread (common/rpc's rule). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "strata/base.h"
#include "strata/member.h"
#include "strata/proto.h"
#include "strata/rpc.h"

static const char *CONFIG =
    "{\"text_config\": {\"hidden_size\": 128, \"num_hidden_layers\": 8, \"vocab_size\": 512, \"intermediate_size\": "
    "256,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"q_lora_rank\": 64, \"kv_lora_rank\": 64,"
    " \"qk_nope_head_dim\": 32, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, \"first_k_dense_replace\": 1,"
    " \"num_experts\": 16, \"num_experts_per_token\": 4, \"num_shared_experts\": 1, \"moe_intermediate_size\": 64,"
    " \"bos_token_id\": 256, \"eos_token_id\": 257, \"attn_res_block_size\": 2,"
    " \"linear_attn_config\": {\"num_heads\": 4, \"head_dim\": 32, \"short_conv_kernel_size\": 4,"
    " \"full_attn_layers\": [4, 8], \"kda_layers\": [1, 2, 3, 5, 6, 7]}}}";

typedef struct {
    uv_loop_t loop;
    uv_async_t stop;
    st_rpc_server_t *srv;
    st_member_t *mem;
    int port, http_port, registered, calls[8];
    st_rpc_call_t *stalled, *slow; /* kind 3's call; kind 7's, streaming on slow_timer */
    uv_timer_t slow_timer;
    int slow_sent, mem_stopped;
    pthread_t client;
    int client_started;
} fake_t;
static fake_t F;

/* ================================================================ the fake worker */

static void send_chunk(st_rpc_call_t *call, uint32_t i, const char *text, st_proto_finish_t fin, const char *err) {
    st_proto_generate_chunk_t ch = {
        .index = i, .token_id = 65 + i, .text = (char *)text, .finish = fin, .error = (char *)err};
    uint8_t *b;
    size_t n;
    if (st_proto_generate_chunk_encode(&ch, &b, &n) == ST_OK) {
        st_rpc_call_write(call, b, n);
        free(b);
    }
}

static void on_stalled_cancel(st_rpc_call_t *call, void *arg) {
    (void)arg;
    if (F.stalled == call) F.stalled = NULL;
    st_rpc_call_finish(call, ST_ERR_CANCELLED, "cancelled");
}

static void on_mem_quiet(void *arg) {
    (void)arg;
    F.mem_stopped = 1;
}

static void on_slow_tick(uv_timer_t *t) {
    if (!F.slow) {
        uv_timer_stop(t);
        return;
    }
    int last = F.slow_sent == 11;
    send_chunk(F.slow, (uint32_t)F.slow_sent, NULL, last ? ST_PROTO_FINISH_LENGTH : ST_PROTO_FINISH_NONE, NULL);
    F.slow_sent++;
    if (last) {
        st_rpc_call_finish(F.slow, ST_OK, NULL);
        F.slow = NULL;
        uv_timer_stop(t);
    }
}

static void on_slow_cancel(st_rpc_call_t *call, void *arg) {
    (void)arg;
    if (F.slow == call) F.slow = NULL;
    st_rpc_call_finish(call, ST_ERR_CANCELLED, "cancelled");
}

static void h_worker_generate(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    (void)arg;
    st_proto_generate_req_t r;
    if (st_proto_generate_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, "undecodable");
        return;
    }
    int kind = r.n_prompt_tokens ? (int)r.prompt_tokens[0] : 0;
    st_proto_generate_req_cleanup(&r);
    if (kind < 0 || kind > 7) kind = 0;
    int nth = ++F.calls[kind];
    switch (kind) {
    case 1:
        if (nth == 1) {
            st_rpc_call_finish(call, ST_ERR_CAPACITY, "attention worker is full");
            return;
        }
        break;
    case 5:
        st_rpc_call_finish(call, ST_ERR_CAPACITY, "attention worker is full");
        return;
    case 2:
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, "prompt of 9999 tokens exceeds the 256-token step budget");
        return;
    case 3:
        send_chunk(call, 0, "A", ST_PROTO_FINISH_NONE, NULL);
        F.stalled = call;
        st_rpc_call_on_cancel(call, on_stalled_cancel, NULL);
        return;
    case 7:
        if (!F.mem_stopped) st_member_stop(F.mem, on_mem_quiet, NULL); /* no heartbeat from now on */
        F.slow = call;
        F.slow_sent = 0;
        st_rpc_call_on_cancel(call, on_slow_cancel, NULL);
        uv_timer_start(&F.slow_timer, on_slow_tick, 100, 100);
        return;
    case 4:
        send_chunk(call, 0, NULL, ST_PROTO_FINISH_ERROR, "an expert of this request has no live server");
        st_rpc_call_finish(call, ST_OK, NULL);
        return;
    default:
        break;
    }
    send_chunk(call, 0, "A", ST_PROTO_FINISH_NONE, NULL);
    send_chunk(call, 1, "B", ST_PROTO_FINISH_NONE, NULL);
    send_chunk(call, 2, "C", ST_PROTO_FINISH_LENGTH, NULL);
    st_rpc_call_finish(call, ST_OK, NULL);
}

/* ================================================================ HTTP client (its own thread) */

/* POST body; returns the status (0 on failure), the whole response (headers + body) in out. */
static int http_post(const char *body, char *out, size_t cap, double timeout_s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)F.http_port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {.tv_sec = (time_t)timeout_s, .tv_usec = (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    out[0] = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return 0;
    }
    char req[2048];
    int n =
        snprintf(req, sizeof req,
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return 0;
    }
    size_t got = 0;
    for (;;) {
        ssize_t k = read(fd, out + got, cap - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
        if (got + 1 >= cap) break;
    }
    out[got] = 0;
    close(fd);
    int st = 0;
    if (sscanf(out, "HTTP/1.1 %d", &st) != 1) st = 0;
    return st;
}

static void *client_main(void *arg) {
    (void)arg;
    static char r[65536];
    int st;
    /* the control */
    st = http_post("{\"prompt\":[6,1],\"max_tokens\":3}", r, sizeof r, 10);
    CHECK(st == 200 && strstr(r, "\"text\":\"ABC\""), "a plain request: %d %s", st, r);

    /* refused once before any chunk: queued again at the head, served */
    st = http_post("{\"prompt\":[1,1],\"max_tokens\":3}", r, sizeof r, 10);
    CHECK(st == 200 && strstr(r, "\"text\":\"ABC\""), "a request refused once (full) is served after a re-queue: %d %s",
          st, r);
    CHECK(F.calls[1] == 2, "the worker saw it twice (%d)", F.calls[1]);
    st = http_post("{\"prompt\":[1,1],\"max_tokens\":3,\"stream\":true}", r, sizeof r, 10);
    CHECK(st == 200 && strstr(r, "[DONE]") && !strstr(r, "error"), "the same for a stream: %d", st);

    /* refused every time: bounded retries, then 429 */
    double t0 = st_time_sec();
    st = http_post("{\"prompt\":[5,1],\"max_tokens\":3}", r, sizeof r, 10);
    CHECK(st == 429 && strstr(r, "\r\nRetry-After: "), "a request refused every time ends 429 with Retry-After: %d %s",
          st, r);
    CHECK(F.calls[5] >= 2 && F.calls[5] <= 5, "after a bounded number of tries (%d) in %.2f s", F.calls[5],
          st_time_sec() - t0);

    /* a client's mistake found by the worker is the client's: 400, a stream included */
    st = http_post("{\"prompt\":[2,1],\"max_tokens\":3}", r, sizeof r, 10);
    CHECK(st == 400 && strstr(r, "step budget") && strstr(r, "invalid_request_error"),
          "worker INVALID_ARGUMENT → 400: %d %s", st, r);
    st = http_post("{\"prompt\":[2,1],\"max_tokens\":3,\"stream\":true}", r, sizeof r, 10);
    CHECK(st == 400 && !strstr(r, "text/event-stream"), "for a stream too, before its first byte: %d %s", st, r);

    /* the worker's failure before any token: a status, not a 200 with an event nor a 500 */
    st = http_post("{\"prompt\":[4,1],\"max_tokens\":3,\"stream\":true}", r, sizeof r, 10);
    CHECK(st == 502 && strstr(r, "no live server"), "an error chunk before the first token → 502: %d %s", st, r);
    st = http_post("{\"prompt\":[4,1],\"max_tokens\":3}", r, sizeof r, 10);
    CHECK(st == 502 && strstr(r, "no live server"), "the same without streaming → 502: %d", st);

    /* a worker that goes quiet mid-stream: the idle timeout (1 s) ends it, naming the worker */
    t0 = st_time_sec();
    st = http_post("{\"prompt\":[3,1],\"max_tokens\":50,\"stream\":true}", r, sizeof r, 8);
    double dt = st_time_sec() - t0;
    CHECK(st == 200 && strstr(r, "\"text\":\"A\"") && strstr(r, "fake-attn") && strstr(r, "sent nothing") &&
              strstr(r, "[DONE]"),
          "a silent stream ends with an error event naming the worker: %d %s", st, r);
    CHECK(dt > 0.8 && dt < 3.5, "after the idle timeout (%.2f s)", dt);
    /* and its slot comes back once the worker's stream is cancelled */
    st = http_post("{\"prompt\":[6,1],\"max_tokens\":3}", r, sizeof r, 10);
    CHECK(st == 200, "served afterwards: %d", st);

    /* a worker whose heartbeats stop (late, as a starved process's are) while it streams: its chunks
     * keep it a member, so its request is not cancelled as lost (last: the fake stops heartbeating) */
    t0 = st_time_sec();
    st = http_post("{\"prompt\":[7,1],\"max_tokens\":12}", r, sizeof r, 10);
    dt = st_time_sec() - t0;
    CHECK(st == 200 && strstr(r, "\"text\":\"ABCDEFGHIJKL\""),
          "a streaming worker without heartbeats for %.2f s (limit 0.6 s) completes its request: %d %s", dt, st, r);
    CHECK(dt > 1.0, "the stream outlasted the heartbeat limit (%.2f s)", dt);
    uv_async_send(&F.stop);
    return NULL;
}

/* ================================================================ loop side */

static void on_registered(void *arg, uint64_t id, const char *token) {
    (void)arg;
    (void)id;
    (void)token;
    if (F.client_started) return;
    F.client_started = 1;
    pthread_create(&F.client, NULL, client_main, NULL);
}

static void on_srv_closed(void *arg) {
    (void)arg;
    st_rpc_cleanup();
    uv_close((uv_handle_t *)&F.stop, NULL);
    uv_close((uv_handle_t *)&F.slow_timer, NULL);
}

static void on_mem_stopped(void *arg) {
    (void)arg;
    if (F.slow) {
        st_rpc_call_finish(F.slow, ST_ERR_CANCELLED, "stopping");
        F.slow = NULL;
    }
    if (F.stalled) {
        st_rpc_call_finish(F.stalled, ST_ERR_CANCELLED, "stopping");
        F.stalled = NULL;
    }
    st_rpc_server_close(F.srv, on_srv_closed, NULL);
}

static void on_stop(uv_async_t *a) {
    (void)a;
    if (F.mem_stopped) /* kind 7 stopped it already */
        on_mem_stopped(NULL);
    else
        st_member_stop(F.mem, on_mem_stopped, NULL);
}

static void on_placement(void *arg, const st_proto_placement_t *p) {
    (void)arg;
    (void)p;
}

int main(void) {
    const char *bin = getenv("STRATA_BIN");
    const char *tmp = getenv("STRATA_TEST_TMP") ? getenv("STRATA_TEST_TMP") : "/tmp";
    if (!bin) {
        printf("STRATA_BIN not set (ctest sets it)\n");
        return 1;
    }
    char dir[512], path[700], coord[600], ready[700], secret[700];
    snprintf(dir, sizeof dir, "%s/proxy.XXXXXX", tmp);
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_file_write_all(path, CONFIG, strlen(CONFIG));
    snprintf(secret, sizeof secret, "%s/cluster.secret", dir);
    CHECK(st_secret_generate_file(secret) == ST_OK, "secret");
    snprintf(ready, sizeof ready, "%s/coord.ready", dir);
    snprintf(coord, sizeof coord, "%s/strata-coordinator", bin);
    pid_t pid = fork();
    if (pid == 0) {
        char log[760];
        snprintf(log, sizeof log, "%s/coordinator.log", dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(coord, coord, "--ckpt", dir, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--heartbeat-ms", "300",
              "--ready-file", ready, "--cluster-secret-file", secret, "--max-queue", "8", "--stream-idle-timeout-s",
              "1", (char *)NULL);
        _exit(127);
    }
    char grpc[200] = "";
    for (int i = 0; i < 200 && !grpc[0]; i++) {
        char *txt;
        if (access(ready, R_OK) == 0 && st_file_read_all(ready, &txt, NULL) == ST_OK) {
            if (strstr(txt, "grpc=")) sscanf(strstr(txt, "grpc="), "grpc=%199s", grpc);
            if (strstr(txt, "http=")) sscanf(strstr(txt, "http="), "http=%*[^:]:%d", &F.http_port);
            free(txt);
        }
        if (!grpc[0]) usleep(50000);
    }
    CHECK(grpc[0] && F.http_port > 0, "the coordinator started (%s, http port %d)", grpc, F.http_port);
    if (!grpc[0] || F.http_port <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return st_test_done();
    }

    st_sec_opts_t sec = {.secret_file = secret};
    CHECK(st_sec_opts_finish(&sec, "test") == ST_OK, "cluster token");
    uv_loop_init(&F.loop);
    uv_async_init(&F.loop, &F.stop, on_stop);
    uv_timer_init(&F.loop, &F.slow_timer);
    CHECK(st_rpc_init(&F.loop) == ST_OK, "rpc");
    CHECK(st_rpc_server_create("127.0.0.1:0", &F.srv) == ST_OK, "fake worker server");
    st_rpc_server_add_method(F.srv, ST_PROTO_METHOD_WORKER_GENERATE, h_worker_generate, NULL);
    CHECK(st_rpc_server_start(F.srv, &F.port) == ST_OK, "fake worker listening");
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", F.port);
    st_rpc_sec_t rs = {.token = sec.grpc_token};
    st_member_opts_t mo = {.role = ST_PROTO_ROLE_ATTENTION,
                           .name = "fake-attn",
                           .data_endpoint = ep,
                           .capacity = 2,
                           .coordinator = grpc,
                           .sec = &rs,
                           .on_placement = on_placement,
                           .on_registered = on_registered};
    CHECK(st_member_start(&F.loop, &mo, &F.mem) == ST_OK, "member start");
    /* bounded: the client thread has its own timeouts; the coordinator's own deadline guards the rest */
    uv_run(&F.loop, UV_RUN_DEFAULT);
    uv_loop_close(&F.loop);
    if (F.client_started) pthread_join(F.client, NULL);
    CHECK(F.client_started, "the fake worker registered");
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the coordinator stopped cleanly (status %d)", status);
    return st_test_done();
}
