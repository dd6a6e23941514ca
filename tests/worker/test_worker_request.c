/* The attention worker's request checks (st_aw_check_request): every numeric field of a
 * Worker/Generate request is range-checked before anything is cast or sized from it. The max_tokens
 * cases are the remote heap overflow of issue 13 (a value >= 2^31 wrapped negative and sized the
 * token buffer too small). */
#include <math.h>
#include <stdint.h>

#include "harness.h"
#include "worker.h"

static st_config_t cfg;
static const st_aw_limits_t lim = {.max_ctx = 128, .max_prompt = 64, .max_stop = 16};
static uint32_t toks[256];

static st_proto_generate_req_t base(size_t n) {
    for (size_t i = 0; i < ST_ARRAY_LEN(toks); i++)
        toks[i] = (uint32_t)(i % 300);
    return (st_proto_generate_req_t){.n_prompt_tokens = n, .prompt_tokens = toks, .max_tokens = 8};
}

/* expect status `want`; on failure the outputs stay untouched and the reason names `word` */
static void expect(const char *what, const st_proto_generate_req_t *r, st_status_t want, const char *word) {
    int n = -7, mt = -7;
    st_status_t s = st_aw_check_request(&cfg, &lim, r, &n, &mt);
    CHECK(s == want, "%s: got %s, want %s (%s)", what, st_status_str(s), st_status_str(want), s ? st_err_last() : "");
    if (want != ST_OK) {
        CHECK(n == -7 && mt == -7, "%s: outputs written on failure (%d, %d)", what, n, mt);
        if (word)
            CHECK(strstr(st_err_last(), word) != NULL, "%s: reason '%s' does not name %s", what, st_err_last(), word);
    }
}

int main(void) {
    st_log_set_level(ST_LOG_WARN); /* ST_REJECT logs at DEBUG: nothing should print */
    if (st_config_preset(&cfg, "tiny") != ST_OK) return 1;
    CHECK(cfg.vocab == 512, "tiny vocab %d", cfg.vocab);

    /* valid requests and what they yield */
    st_proto_generate_req_t r = base(10);
    int n = 0, mt = 0;
    CHECK(st_aw_check_request(&cfg, &lim, &r, &n, &mt) == ST_OK && n == 10 && mt == 8, "tokens: n %d mt %d", n, mt);
    r.max_tokens = 0; /* default */
    CHECK(st_aw_check_request(&cfg, &lim, &r, &n, &mt) == ST_OK && mt == ST_AW_DEFAULT_MAX_TOKENS, "default mt %d", mt);
    r = base(64);
    r.max_tokens = 64; /* exactly the context */
    CHECK(st_aw_check_request(&cfg, &lim, &r, &n, &mt) == ST_OK && n == 64 && mt == 64, "full ctx: %d %d", n, mt);
    st_proto_generate_req_t t = {.prompt = "hello", .max_tokens = 3, .temperature = 100, .top_p = 1, .top_k = 512};
    CHECK(st_aw_check_request(&cfg, &lim, &t, &n, &mt) == ST_OK && n == 5 && mt == 3, "text: %d %d", n, mt);
    /* the default never overflows the context: it shrinks to the room left */
    st_aw_limits_t tight = {.max_ctx = 12, .max_prompt = 64, .max_stop = 16};
    r = base(10);
    r.max_tokens = 0;
    CHECK(st_aw_check_request(&cfg, &tight, &r, &n, &mt) == ST_OK && mt == 2, "default clamps: %d", mt);

    /* max_tokens: the wrap-around values of the overflow, and one past the context */
    r = base(60);
    r.max_tokens = 0x80000000u;
    expect("max_tokens 2^31", &r, ST_ERR_OUT_OF_RANGE, "max_tokens");
    r.max_tokens = 0xFFFFFFFFu - 58; /* (int) = -59: a 2-int buffer for 60 prompt tokens before the fix */
    expect("max_tokens 2^32-59", &r, ST_ERR_OUT_OF_RANGE, "max_tokens");
    r.max_tokens = UINT32_MAX;
    expect("max_tokens 2^32-1", &r, ST_ERR_OUT_OF_RANGE, "max_tokens");
    r.max_tokens = 69; /* 60 + 69 = 129 > 128 */
    expect("max_tokens one past the context", &r, ST_ERR_OUT_OF_RANGE, "max_tokens");
    r.max_tokens = 68;
    expect("max_tokens filling the context", &r, ST_OK, NULL);

    /* prompt length and ids */
    r = base(65);
    expect("prompt over the step budget", &r, ST_ERR_OUT_OF_RANGE, "prompt");
    r = base(1);
    r.n_prompt_tokens = SIZE_MAX; /* must be refused before any token is read */
    expect("prompt count SIZE_MAX", &r, ST_ERR_OUT_OF_RANGE, "prompt");
    r.n_prompt_tokens = (size_t)1 << 32 | 3; /* truncates to 3 as an int */
    expect("prompt count 2^32+3", &r, ST_ERR_OUT_OF_RANGE, "prompt");
    r = base(5);
    toks[3] = 512;
    expect("prompt token = vocab", &r, ST_ERR_OUT_OF_RANGE, "vocabulary");
    toks[3] = 0x80000000u;
    expect("prompt token 2^31", &r, ST_ERR_OUT_OF_RANGE, "vocabulary");
    toks[3] = 511;
    expect("prompt token vocab-1", &r, ST_OK, NULL);
    r.prompt_tokens = NULL;
    expect("prompt tokens announced, missing", &r, ST_ERR_INVALID_ARG, "prompt");
    st_proto_generate_req_t e = {.prompt = "", .max_tokens = 1};
    expect("empty text prompt", &e, ST_ERR_INVALID_ARG, "empty");
    e.prompt = NULL;
    expect("no prompt", &e, ST_ERR_INVALID_ARG, "empty");
    char big[200];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    e.prompt = big;
    expect("text prompt over the budget", &e, ST_ERR_OUT_OF_RANGE, "prompt");
    big[64] = 0;
    expect("text prompt at the budget", &e, ST_OK, NULL);
    st_config_t small = cfg;
    small.vocab = 100; /* a byte above the vocabulary */
    e.prompt = "ok\xff";
    {
        int a = -7, b = -7;
        st_status_t s = st_aw_check_request(&small, &lim, &e, &a, &b);
        CHECK(s == ST_ERR_OUT_OF_RANGE && a == -7, "text byte outside a small vocabulary: %s", st_status_str(s));
    }

    /* sampling parameters */
    float bad_t[] = {NAN, -1.0f, 100.5f, INFINITY, -0.0001f};
    for (size_t i = 0; i < ST_ARRAY_LEN(bad_t); i++) {
        r = base(4);
        r.temperature = bad_t[i];
        expect("temperature", &r, ST_ERR_INVALID_ARG, "temperature");
    }
    float bad_p[] = {NAN, -0.1f, 1.5f, INFINITY};
    for (size_t i = 0; i < ST_ARRAY_LEN(bad_p); i++) {
        r = base(4);
        r.top_p = bad_p[i];
        expect("top_p", &r, ST_ERR_INVALID_ARG, "top_p");
    }
    r = base(4);
    r.top_p = 0.0f;
    r.temperature = 0.0f;
    expect("top_p 0, greedy", &r, ST_OK, NULL);
    r.top_k = 513;
    expect("top_k past the vocabulary", &r, ST_ERR_OUT_OF_RANGE, "top_k");
    r.top_k = UINT32_MAX; /* (int) = -1 before the fix */
    expect("top_k 2^32-1", &r, ST_ERR_OUT_OF_RANGE, "top_k");

    /* logprobs: the chosen token's and up to 20 top ones, only with logprobs */
    r = base(4);
    r.logprobs = 1;
    r.top_logprobs = 20;
    expect("top_logprobs 20", &r, ST_OK, NULL);
    r.top_logprobs = 21;
    expect("top_logprobs 21", &r, ST_ERR_OUT_OF_RANGE, "top_logprobs");
    r.top_logprobs = UINT32_MAX;
    expect("top_logprobs 2^32-1", &r, ST_ERR_OUT_OF_RANGE, "top_logprobs");
    r.top_logprobs = 2;
    r.logprobs = 0;
    expect("top_logprobs without logprobs", &r, ST_ERR_OUT_OF_RANGE, "top_logprobs");

    /* stop ids */
    uint32_t stops[40] = {0};
    r = base(4);
    r.stop_ids = stops;
    r.n_stop_ids = 16;
    expect("16 stop ids", &r, ST_OK, NULL);
    r.n_stop_ids = 17;
    expect("17 stop ids", &r, ST_ERR_OUT_OF_RANGE, "stop");
    r.n_stop_ids = SIZE_MAX;
    expect("stop id count SIZE_MAX", &r, ST_ERR_OUT_OF_RANGE, "stop");
    r.n_stop_ids = 2;
    stops[1] = 512;
    expect("stop id = vocab", &r, ST_ERR_OUT_OF_RANGE, "stop");
    r.stop_ids = NULL;
    expect("stop ids announced, missing", &r, ST_ERR_INVALID_ARG, "stop");

    /* request id */
    char rid[300];
    memset(rid, 'x', sizeof rid - 1);
    rid[sizeof rid - 1] = 0;
    r = base(4);
    r.request_id = rid;
    expect("request id over 256 bytes", &r, ST_ERR_INVALID_ARG, "request_id");
    rid[256] = 0;
    expect("request id of 256 bytes", &r, ST_OK, NULL);
    return st_test_done();
}
