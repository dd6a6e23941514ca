/* The coordinator's OpenAI request parsing and checks, the strict UTF-8 cleaner and the bearer
 * check (coordinator/openai.c): every numeric field is range-checked before its cast, client
 * mistakes are refused with a message and param, and any bytes become text jansson accepts. */
#include <jansson.h>
#include <stdint.h>

#include "harness.h"
#include "openai.h"

/* ================================================================ UTF-8 */

/* Independent reference: decode by arithmetic. Returns the length of the well-formed sequence at
 * s (n bytes available), 0 if ill-formed or incomplete. */
static int ref_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (size_t)len > n) return 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static int ref_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = ref_seq(s + i, n - i);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

static int json_ok(const char *s, size_t n) { /* jansson takes it, and it survives a dump + load */
    json_t *j = json_stringn(s, n);
    if (!j) return 0;
    char *d = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    if (!d) return 0;
    json_t *back = json_loads(d, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    free(d);
    int ok = back && json_is_string(back) && json_string_length(back) == n && !memcmp(json_string_value(back), s, n);
    json_decref(back);
    return ok;
}

static void test_utf8_exhaustive(void) {
    unsigned char in[4];
    char out[16];
    size_t ol;
    long bad_valid = 0, bad_clean = 0, bad_json = 0, n = 0;
    /* every 1, 2 and 3 byte string: the classification agrees with the reference, the cleaned
       output is always well-formed and jansson takes it, well-formed input comes back unchanged */
    for (int len = 1; len <= 3; len++) {
        long total = 1L << (8 * len);
        for (long v = 0; v < total; v++, n++) {
            for (int k = 0; k < len; k++)
                in[k] = (unsigned char)(v >> (8 * k));
            int valid = st_openai_utf8_valid(in, (size_t)len);
            bad_valid += valid != ref_valid(in, (size_t)len);
            size_t used = st_openai_utf8_clean(in, (size_t)len, out, &ol, 1);
            if (used != (size_t)len || !ref_valid((unsigned char *)out, ol) ||
                (valid && (ol != (size_t)len || memcmp(out, in, ol))))
                bad_clean++;
            json_t *j = json_stringn(out, ol);
            bad_json += !j;
            json_decref(j);
        }
    }
    CHECK(bad_valid == 0, "%ld of %ld strings classified unlike the reference", bad_valid, n);
    CHECK(bad_clean == 0, "%ld of %ld strings cleaned into something ill-formed or changed", bad_clean, n);
    CHECK(bad_json == 0, "%ld of %ld cleaned strings refused by jansson", bad_json, n);
    /* every 4-byte string with a lead F0..F7 and the second byte free, the rest sampled; then
       random 4-byte strings */
    st_rng_t rng = {7};
    bad_valid = bad_clean = n = 0;
    for (int lead = 0xF0; lead <= 0xF7; lead++)
        for (int b1 = 0; b1 < 256; b1++)
            for (int t = 0; t < 64; t++, n++) {
                uint64_t r = st_rng_next(&rng);
                in[0] = (unsigned char)lead, in[1] = (unsigned char)b1;
                in[2] = t < 32 ? (unsigned char)(0x80 | (r & 0x3F)) : (unsigned char)r;
                in[3] = t < 48 ? (unsigned char)(0x80 | ((r >> 8) & 0x3F)) : (unsigned char)(r >> 8);
                int valid = st_openai_utf8_valid(in, 4);
                bad_valid += valid != ref_valid(in, 4);
                st_openai_utf8_clean(in, 4, out, &ol, 1);
                bad_clean += !ref_valid((unsigned char *)out, ol) || (valid && (ol != 4 || memcmp(out, in, 4)));
            }
    for (int t = 0; t < 1000000; t++, n++) {
        uint64_t r = st_rng_next(&rng);
        memcpy(in, &r, 4);
        int valid = st_openai_utf8_valid(in, 4);
        bad_valid += valid != ref_valid(in, 4);
        st_openai_utf8_clean(in, 4, out, &ol, 1);
        bad_clean += !ref_valid((unsigned char *)out, ol);
    }
    CHECK(bad_valid == 0 && bad_clean == 0, "4-byte strings: %ld misclassified, %ld badly cleaned of %ld", bad_valid,
          bad_clean, n);
}

static void test_utf8_cases(void) {
    char out[256];
    size_t ol;
    /* The Unicode Standard's example of maximal subparts (ch. 3, "U+FFFD substitution"):
       61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 → a FFFD FFFD FFFD b FFFD c FFFD FFFD d */
    const unsigned char ex[] = {0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64};
    st_openai_utf8_clean(ex, sizeof ex, out, &ol, 1);
    const char *want = "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                       "b\xEF\xBF\xBD"
                       "c\xEF\xBF\xBD\xEF\xBF\xBD"
                       "d";
    CHECK(ol == strlen(want) && !memcmp(out, want, ol), "maximal subparts: got %zu bytes", ol);
    /* what the old cleaner let through: F5..F7 leads, overlong forms, surrogates, beyond U+10FFFF */
    const char *bad[] = {"\xF5\x80\x80\x80", "\xF7\xBF\xBF\xBF", "\xC0\xAF",
                         "\xE0\x80\xAF",     "\xF0\x80\x80\xAF", "\xED\xA0\x80",
                         "\xED\xBF\xBF",     "\xF4\x90\x80\x80", "\xF8\x88\x80\x80\x80"};
    for (size_t i = 0; i < ST_ARRAY_LEN(bad); i++) {
        st_openai_utf8_clean((const unsigned char *)bad[i], strlen(bad[i]), out, &ol, 1);
        CHECK(st_openai_utf8_valid((unsigned char *)out, ol) && json_ok(out, ol) && strstr(out, "\xEF\xBF\xBD"),
              "ill-formed case %zu not replaced", i);
    }
    /* C0 and C1 controls are well-formed (JSON escapes them) */
    st_openai_utf8_clean((const unsigned char *)"\x01\x1F\xC2\x80\xC2\x9F", 6, out, &ol, 1);
    CHECK(ol == 6 && json_ok(out, ol), "controls kept");
    /* a stream's cut: an incomplete but valid prefix waits for the next chunk, a broken one does not */
    CHECK(st_openai_utf8_clean((const unsigned char *)"ab\xF0\x9F\x98", 5, out, &ol, 0) == 2 && ol == 2,
          "prefix held back");
    CHECK(st_openai_utf8_clean((const unsigned char *)"ab\xF0\x9F\x98", 5, out, &ol, 1) == 5 && ol == 5,
          "final: replaced");
    CHECK(st_openai_utf8_clean((const unsigned char *)"ab\xF0\x41", 4, out, &ol, 0) == 4 && ol == 6,
          "broken prefix not held");
    CHECK(st_openai_utf8_clean((const unsigned char *)"\xF5", 1, out, &ol, 0) == 1 && ol == 3,
          "impossible lead not held");
}

/* Random bytes cut into random chunks, cleaned as a stream (holding back each chunk's tail), give
 * exactly the one-shot result; every piece is valid and accepted by jansson. */
static void test_utf8_stream(void) {
    st_rng_t rng = {42};
    unsigned char buf[512];
    char whole[3 * 512 + 1], part[3 * 512 + 1], acc[4 * 512];
    int bad = 0, bad_json = 0;
    for (int t = 0; t < 20000; t++) {
        size_t n = 1 + st_rng_next(&rng) % 64;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = st_rng_next(&rng);
            /* biased toward UTF-8-looking bytes so that long valid runs occur too */
            buf[i] = (r & 3) == 0   ? (unsigned char)(r >> 8)
                     : (r & 3) == 1 ? (unsigned char)(0x80 | ((r >> 8) & 0x3F))
                     : (r & 3) == 2 ? (unsigned char)(0xC2 + (r >> 8) % 0x33)
                                    : (unsigned char)('a' + (r >> 8) % 26);
        }
        size_t wl;
        st_openai_utf8_clean(buf, n, whole, &wl, 1);
        size_t al = 0, emitted = 0, have = 0;
        while (emitted < n) {
            size_t step = 1 + st_rng_next(&rng) % 8;
            have = ST_MIN(n, have + step);
            int final = have == n;
            size_t pl;
            emitted += st_openai_utf8_clean(buf + emitted, have - emitted, part, &pl, final);
            bad_json += !json_ok(part, pl);
            memcpy(acc + al, part, pl);
            al += pl;
            if (final) break;
        }
        bad += al != wl || memcmp(acc, whole, wl) || emitted != n;
    }
    CHECK(bad == 0, "%d streams differ from the one-shot cleaning", bad);
    CHECK(bad_json == 0, "%d stream pieces refused by jansson", bad_json);
}

/* ================================================================ /v1/completions */

static st_status_t parse(const char *body, st_openai_req_t *r, st_openai_err_t *e) {
    st_openai_limits_t lim = {.model = "tiny", .vocab = 300};
    return st_openai_parse_completion(body, strlen(body), &lim, r, e);
}

static void expect_refused(const char *body, const char *param) {
    st_openai_req_t r;
    st_openai_err_t e;
    st_status_t s = parse(body, &r, &e);
    CHECK(s == ST_ERR_INVALID_ARG || s == ST_ERR_OUT_OF_RANGE, "accepted: %s", body);
    if (s == ST_OK) st_openai_req_cleanup(&r);
    if (s == ST_OK) return;
    CHECK(e.message[0] && st_openai_utf8_valid((unsigned char *)e.message, strlen(e.message)), "message for %s", body);
    if (param) CHECK(e.param && !strcmp(e.param, param), "param for %s: %s", body, e.param ? e.param : "(null)");
}

static void test_parse(void) {
    st_openai_req_t r;
    st_openai_err_t e;
    /* the case: 4294967297 was cast to 1 and served */
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":4294967297}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":4294967296}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":2147483648}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":1000001}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":0}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":-1}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":16.5}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":1e30}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":\"16\"}", "max_tokens");
    expect_refused("{\"prompt\":\"hi\",\"max_tokens\":99999999999999999999999}", NULL); /* jansson: too big */
    expect_refused("{\"prompt\":\"hi\",\"temperature\":1e300}", "temperature");
    expect_refused("{\"prompt\":\"hi\",\"temperature\":-0.5}", "temperature");
    expect_refused("{\"prompt\":\"hi\",\"temperature\":1e999}", NULL);
    expect_refused("{\"prompt\":\"hi\",\"top_p\":1.5}", "top_p");
    expect_refused("{\"prompt\":\"hi\",\"top_k\":4294967301}", "top_k");
    expect_refused("{\"prompt\":\"hi\",\"top_k\":-2}", "top_k");
    expect_refused("{\"prompt\":\"hi\",\"seed\":-1}", "seed");
    expect_refused("{\"prompt\":\"hi\",\"seed\":1.5}", "seed");
    expect_refused("{\"prompt\":\"hi\",\"n\":65}", "n");
    expect_refused("{\"prompt\":[\"a\",\"b\"],\"n\":33}", "n"); /* 66 choices */
    expect_refused("{\"prompt\":[\"a\",\"\"]}", "prompt");
    expect_refused("{\"prompt\":[[1,2],[]]}", "prompt");
    expect_refused("{\"prompt\":[\"a\",[1,400]]}", "prompt"); /* each prompt is checked */
    expect_refused("{\"prompt\":[\"a\",[1]],\"echo\":true}", "echo");
    expect_refused("{\"prompt\":\"hi\",\"best_of\":3}", "best_of");
    /* logprobs N asks the worker for values (the token's and N top ones), never the logits row */
    CHECK(parse("{\"prompt\":\"hi\",\"logprobs\":5}", &r, &e) == ST_OK && r.logprobs == 5 && r.req.logprobs &&
              r.req.top_logprobs == 5 && !r.req.dump_logits,
          "logprobs 5: values asked, no row");
    st_openai_req_cleanup(&r);
    CHECK(parse("{\"prompt\":\"hi\",\"logprobs\":0}", &r, &e) == ST_OK && r.req.logprobs && r.req.top_logprobs == 0 &&
              !r.req.dump_logits,
          "logprobs 0: the token's only");
    st_openai_req_cleanup(&r);
    CHECK(parse("{\"prompt\":\"hi\"}", &r, &e) == ST_OK && r.logprobs == -1 && !r.req.logprobs && !r.req.top_logprobs,
          "no logprobs: none asked");
    st_openai_req_cleanup(&r);
    expect_refused("{\"prompt\":\"hi\",\"logprobs\":21}", "logprobs");
    expect_refused("{\"prompt\":\"hi\",\"logprobs\":true}", "logprobs");
    expect_refused("{\"prompt\":\"hi\",\"echo\":1}", "echo");
    expect_refused("{\"prompt\":\"hi\",\"stream\":\"yes\"}", "stream");
    expect_refused("{\"prompt\":\"hi\",\"ignore_eos\":1}", "ignore_eos");
    expect_refused("{\"prompt\":\"hi\",\"stop\":[\"a\",\"\"]}", "stop");
    expect_refused("{\"prompt\":\"hi\",\"stop\":[\"a\",7]}", "stop");
    expect_refused("{\"prompt\":\"hi\",\"stop\":{}}", "stop");
    expect_refused("{\"prompt\":[1,2],\"echo\":true}", "echo");
    expect_refused("{\"prompt\":\"hi\",\"presence_penalty\":2.5}", "presence_penalty");
    expect_refused("{\"prompt\":\"hi\",\"frequency_penalty\":3}", "frequency_penalty");
    expect_refused("{\"prompt\":\"hi\",\"logit_bias\":{\"5\":101}}", "logit_bias");
    expect_refused("{\"prompt\":\"hi\",\"logit_bias\":{\"x5\":1}}", "logit_bias");
    expect_refused("{\"prompt\":\"hi\",\"logit_bias\":{\"-5\":1}}", "logit_bias");
    expect_refused("{\"prompt\":\"hi\",\"logit_bias\":{\"300\":1}}", "logit_bias"); /* outside the vocabulary */
    expect_refused("{\"prompt\":\"hi\",\"logit_bias\":[1]}", "logit_bias");
    expect_refused("{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":1}}", "include_usage");
    expect_refused("{\"prompt\":\"hi\",\"stop\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
                   "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"]}",
                   "stop");
    expect_refused("{\"prompt\":\"hi\",\"model\":\"other\"}", "model");
    expect_refused("{\"prompt\":\"hi\",\"model\":7}", "model");
    expect_refused("{\"max_tokens\":4}", "prompt");
    expect_refused("{\"prompt\":\"\"}", "prompt");
    expect_refused("{\"prompt\":[]}", "prompt");
    expect_refused("{\"prompt\":[1,\"a\"]}", "prompt");
    expect_refused("{\"prompt\":[1,-1]}", "prompt");
    expect_refused("{\"prompt\":[1,4294967296]}", "prompt");
    expect_refused("{\"prompt\":[1,300]}", "prompt"); /* outside the vocabulary */
    expect_refused("{\"prompt\":[1.5]}", "prompt");
    expect_refused("{\"prompt\":\"a\\u0000b\"}", NULL); /* jansson refuses \\u0000 */
    expect_refused("{\"prompt\":{}}", "prompt");
    expect_refused("{\"prompt\":\"hi\",\"prompt\":\"again\"}", NULL); /* duplicate keys */
    expect_refused("[1,2]", NULL);
    expect_refused("\"hi\"", NULL);
    expect_refused("{\"prompt\":\"hi\"", NULL);
    expect_refused("", NULL);
    /* a long model name cut in the middle of a character still gives a UTF-8 message */
    char big[600];
    int k = snprintf(big, sizeof big, "{\"prompt\":\"hi\",\"model\":\"");
    for (int i = 0; i < 200; i++)
        k += snprintf(big + k, sizeof big - (size_t)k, "\xC3\xA9");
    snprintf(big + k, sizeof big - (size_t)k, "\"}");
    expect_refused(big, "model");

    /* accepted, with every field where it belongs */
    const char *ok =
        "{\"model\":\"tiny\",\"prompt\":\"hello\",\"max_tokens\":1000000,\"temperature\":0.5,\"top_p\":0.9,"
        "\"top_k\":40,\"seed\":9223372036854775807,\"n\":1,\"best_of\":1,\"logprobs\":null,\"echo\":false,"
        "\"stream\":true,\"ignore_eos\":true,\"stop\":[\"\\n\",\"</end>\",\"\\u00e9t\u00e9\"],\"user\":\"x\","
        "\"presence_penalty\":0.5,\"frequency_penalty\":-1.5,\"logit_bias\":{\"5\":-100,\"299\":2.5},"
        "\"stream_options\":{\"include_usage\":true}}";
    CHECK(parse(ok, &r, &e) == ST_OK, "full request refused: %s", e.message);
    CHECK(r.req.max_tokens == 1000000 && r.req.temperature == 0.5f && r.req.top_p == 0.9f && r.req.top_k == 40 &&
              r.req.has_seed && r.req.seed == 9223372036854775807ull && r.stream && r.req.ignore_eos &&
              r.req.n_stop_ids == 0 && r.n_stop_strs == 3 && !strcmp(r.stop_strs[0], "\n") &&
              !strcmp(r.stop_strs[1], "</end>") && !strcmp(r.stop_strs[2], "\xC3\xA9t\xC3\xA9") && r.include_usage &&
              !r.chat && !strcmp(r.req.prompt, "hello") && r.req.presence_penalty == 0.5f &&
              r.req.frequency_penalty == -1.5f && r.req.n_logit_bias == 2 && r.req.logit_bias_ids == r.bias_ids &&
              r.bias_ids[0] == 5 && r.bias_values[0] == -100.0f && r.bias_ids[1] == 299 && r.bias_values[1] == 2.5f,
          "fields");
    st_openai_req_cleanup(&r);
    CHECK(parse("{\"prompt\":[5,6,299],\"top_k\":-1,\"max_tokens\":null}", &r, &e) == ST_OK, "token prompt: %s",
          e.message);
    CHECK(r.req.n_prompt_tokens == 3 && r.req.prompt_tokens[2] == 299 && r.req.top_k == 0 && r.req.max_tokens == 16 &&
              !r.stream,
          "token prompt fields");
    st_openai_req_cleanup(&r);
    CHECK(parse("{\"prompt\":[\"one\"]}", &r, &e) == ST_OK && !strcmp(r.req.prompt, "one") && r.n_prompts == 1,
          "one-string array");
    st_openai_req_cleanup(&r);
    CHECK(parse("{\"prompt\":[\"one\",[7,8],\"three\"],\"n\":2}", &r, &e) == ST_OK && r.n_prompts == 3 && r.n == 2 &&
              !strcmp(r.req.prompt, "one") && r.batch[0].n_ids == 2 && r.batch[0].ids[1] == 8 &&
              !strcmp(r.batch[1].text, "three"),
          "a batch of prompts, n = 2: %s", e.message);
    st_openai_req_cleanup(&r);
    /* not NUL-terminated: only len bytes are read */
    const char buf[] = "{\"prompt\":\"x\"}garbage";
    st_openai_limits_t lim = {.model = NULL, .vocab = 0};
    CHECK(st_openai_parse_completion(buf, 14, &lim, &r, &e) == ST_OK, "a body of len bytes: %s", e.message);
    st_openai_req_cleanup(&r);
}

static void test_check(void) {
    /* the gRPC path: a decoded request passes the same checks */
    st_openai_limits_t lim = {.vocab = 300};
    st_openai_err_t e;
    uint32_t toks[2] = {1, 2};
    st_proto_generate_req_t r = {.prompt_tokens = toks, .n_prompt_tokens = 2, .max_tokens = 8, .top_p = 1};
    CHECK(st_openai_check(&r, &lim, &e) == ST_OK, "plain: %s", e.message);
    r.max_tokens = 0;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "max_tokens 0");
    r.max_tokens = UINT32_MAX;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "max_tokens 2^32-1");
    r.max_tokens = 8;
    r.temperature = NAN;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "temperature NaN");
    r.temperature = INFINITY;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "temperature Inf");
    r.temperature = 0;
    r.top_p = NAN;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "top_p NaN");
    r.top_p = 1;
    r.top_k = 0x80000000u;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "top_k 2^31");
    r.top_k = 0;
    toks[1] = 300;
    CHECK(st_openai_check(&r, &lim, &e) == ST_ERR_OUT_OF_RANGE, "token outside the vocabulary");
    toks[1] = 2;
    uint32_t stops[17] = {0};
    r.stop_ids = stops;
    r.n_stop_ids = 17;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "17 stop ids");
    r.n_stop_ids = 1;
    stops[0] = 1000;
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "stop id outside the vocabulary");
    r.n_stop_ids = 0;
    r.n_prompt_tokens = 0;
    r.prompt = "";
    CHECK(st_openai_check(&r, &lim, &e) != ST_OK, "empty prompt");
}

static void test_bearer(void) {
    CHECK(st_openai_bearer_ok("Bearer s3cret-key", "s3cret-key"), "exact");
    CHECK(st_openai_bearer_ok("bearer  s3cret-key ", "s3cret-key"), "scheme case, spaces");
    CHECK(!st_openai_bearer_ok("Bearer s3cret-kez", "s3cret-key"), "wrong key");
    CHECK(!st_openai_bearer_ok("Bearer s3cret-key2", "s3cret-key"), "longer key");
    CHECK(!st_openai_bearer_ok("Bearer s3cret", "s3cret-key"), "prefix of the key");
    CHECK(!st_openai_bearer_ok("Bearer ", "s3cret-key"), "empty");
    CHECK(!st_openai_bearer_ok("Basic s3cret-key", "s3cret-key"), "other scheme");
    CHECK(!st_openai_bearer_ok("Bearers3cret-key", "s3cret-key"), "no space");
    CHECK(!st_openai_bearer_ok("s3cret-key", "s3cret-key"), "no scheme");
    CHECK(!st_openai_bearer_ok(NULL, "s3cret-key"), "no header");
}

int main(void) {
    test_utf8_cases();
    test_utf8_stream();
    test_utf8_exhaustive();
    test_parse();
    test_check();
    test_bearer();
    return st_test_done();
}
