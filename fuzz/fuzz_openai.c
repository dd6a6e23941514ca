/* libFuzzer harness: the coordinator's OpenAI request side (coordinator/openai.c, chat.c) over
 * arbitrary bytes: /v1/completions and /v1/chat/completions body parsing with every check (chat
 * rendered in K2's and in K3's format over the byte tokenizer), K2's and K3's reply readers, the
 * strict UTF-8 cleaner (one-shot and as a stream cut anywhere) and the bearer check. Invariants, not
 * just "no crash": an accepted request passes the checks again and has its fields in range; a
 * refusal carries a UTF-8 message; a reply's parts lie inside the text and its tool calls have a
 * name and arguments; cleaned text is always well-formed and accepted by jansson, and a stream
 * gives the one-shot result.
 *
 * Build (clang from Debian):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icoordinator -Icommon/base/include -Iproto/include \
 *     fuzz/fuzz_openai.c coordinator/openai.c coordinator/chat.c (+ common/model: the tokenizer) ... \
 *     -o fuzz_openai && ./fuzz_openai -max_total_time=60 fuzz/corpus/openai */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) abort();                                                                                             \
    } while (0)

static st_tokenizer_t *g_bytes; /* the byte tokenizer: chat renders without a checkpoint */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    st_tokenizer_opts_t o = {.quiet = true};
    REQUIRE(st_tokenizer_load_files(&g_bytes, NULL, NULL, NULL, NULL, &o) == ST_OK);
    return 0;
}

static void check_refusal(st_status_t s, const st_openai_err_t *e) {
    REQUIRE(s == ST_ERR_INVALID_ARG || s == ST_ERR_OUT_OF_RANGE || s == ST_ERR_NO_MEMORY);
    size_t ml = strlen(e->message);
    REQUIRE(ml > 0 && ml < sizeof e->message && st_openai_utf8_valid((const unsigned char *)e->message, ml));
    json_t *j = json_string(e->message);
    REQUIRE(j != NULL);
    json_decref(j);
}

static void check_calls(json_t *calls) {
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *c = json_array_get(calls, i), *f = json_object_get(c, "function");
        REQUIRE(json_is_string(json_object_get(c, "id")) && json_is_string(json_object_get(f, "name")) &&
                json_is_string(json_object_get(f, "arguments")));
    }
    json_decref(calls);
}

static void check_chat(const uint8_t *data, size_t size, st_chat_format_t fmt) {
    st_openai_limits_t lim = {.model = "tiny", .vocab = 512, .tok = g_bytes, .chat_format = fmt};
    st_openai_req_t r;
    st_openai_err_t e;
    st_status_t s = st_openai_parse_chat((const char *)data, size, &lim, &r, &e);
    if (s != ST_OK) {
        check_refusal(s, &e);
        return;
    }
    const st_proto_generate_req_t *q = &r.req;
    REQUIRE(r.chat && r.chat_format == fmt && st_openai_check(q, &lim, &e) == ST_OK);
    REQUIRE(q->n_prompt_tokens > 0 && q->prompt_tokens && !q->prompt);
    for (size_t i = 0; i < q->n_prompt_tokens; i++)
        REQUIRE(q->prompt_tokens[i] < (uint32_t)st_tokenizer_n_ids(g_bytes));
    st_openai_req_cleanup(&r);
}

static void check_replies(const uint8_t *data, size_t size) {
    size_t cl = (size_t)-1;
    json_t *calls = st_chat_tool_calls((const char *)data, size, &cl);
    REQUIRE(!calls || cl <= size);
    check_calls(calls);
    st_chat_k3_reply_t k;
    st_chat_k3_reply((const char *)data, size, size && (data[0] & 1), &k);
    REQUIRE(k.reasoning_off + k.reasoning_len <= size && k.content_off + k.content_len <= size);
    REQUIRE(k.reasoning_off + k.reasoning_len <= k.content_off || !k.reasoning_len);
    check_calls(k.tool_calls);
}

static void check_clean(const uint8_t *d, size_t n) {
    char *whole = malloc(3 * n + 1), *part = malloc(3 * n + 1), *acc = malloc(3 * n + 1);
    REQUIRE(whole && part && acc);
    size_t wl, al = 0, pl;
    REQUIRE(st_openai_utf8_clean(d, n, whole, &wl, 1) == n);
    REQUIRE(wl <= 3 * n && st_openai_utf8_valid((const unsigned char *)whole, wl));
    json_t *j = json_stringn(whole, wl);
    REQUIRE(j != NULL);
    json_decref(j);
    if (st_openai_utf8_valid(d, n)) REQUIRE(wl == n && !memcmp(whole, d, n));
    /* as a stream: cut every few bytes (the cut sizes come from the data itself) */
    size_t emitted = 0, have = 0;
    for (size_t k = 0; emitted < n; k++) {
        have += 1 + (n ? d[k % n] % 7 : 0);
        if (have > n) have = n;
        int final = have == n;
        emitted += st_openai_utf8_clean(d + emitted, have - emitted, part, &pl, final);
        REQUIRE(st_openai_utf8_valid((const unsigned char *)part, pl));
        memcpy(acc + al, part, pl);
        al += pl;
        if (final) REQUIRE(emitted == n);
    }
    REQUIRE(al == wl && !memcmp(acc, whole, wl));
    free(whole);
    free(part);
    free(acc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_openai_limits_t lim = {.model = "tiny", .vocab = 512};
    st_openai_req_t r;
    st_openai_err_t e;
    st_status_t s = st_openai_parse_completion((const char *)data, size, &lim, &r, &e);
    if (s == ST_OK) {
        const st_proto_generate_req_t *q = &r.req;
        REQUIRE(st_openai_check(q, &lim, &e) == ST_OK);
        REQUIRE(q->max_tokens >= 1 && q->max_tokens <= ST_OPENAI_MAX_TOKENS);
        REQUIRE(q->temperature >= 0 && q->temperature <= ST_OPENAI_MAX_TEMPERATURE);
        REQUIRE(q->top_p >= 0 && q->top_p <= 1 && q->top_k <= ST_OPENAI_MAX_TOP_K);
        REQUIRE(q->n_prompt_tokens ? q->prompt_tokens != NULL : (q->prompt && q->prompt[0]));
        for (size_t i = 0; i < q->n_prompt_tokens; i++)
            REQUIRE(q->prompt_tokens[i] < 512);
        REQUIRE(q->n_stop_ids <= ST_OPENAI_MAX_STOP && (!q->n_stop_ids || q->stop_ids == r.stops));
        st_openai_req_cleanup(&r);
    } else {
        check_refusal(s, &e);
    }
    check_chat(data, size, ST_CHAT_K2);
    check_chat(data, size, ST_CHAT_K3);
    check_replies(data, size);
    check_clean(data, size);
    /* the bearer check over a NUL-terminated copy */
    char *h = malloc(size + 1);
    REQUIRE(h);
    memcpy(h, data, size);
    h[size] = 0;
    (void)st_openai_bearer_ok(h, "sk-fuzz");
    free(h);
    return 0;
}
