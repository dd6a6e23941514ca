/* Kimi's chat format in C against Jinja2 rendering the official template text (render_chat.py
 * writes the reference), on a Kimi tokenizer folder (kimi_tokenizer.py): the same text for every
 * case, markup as special ids and client text never (a user's "<|im_end|>" stays text), ids that
 * decode back to the text, Python's json.dumps for the tool declaration, tool calls parsed back,
 * and the chat request parser.
 *   test_chat TOKENIZER_DIR CASES.json EXPECTED.json */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "openai.h"

static st_tokenizer_t *tk;

static int count_id(const st_tok_ids_t *v, int32_t id) {
    int n = 0;
    for (size_t i = 0; i < v->n; i++) n += v->ids[i] == id;
    return n;
}

static void test_render(const char *cases_path, const char *expected_path) {
    json_error_t je;
    json_t *cases = json_load_file(cases_path, 0, &je), *exp = json_load_file(expected_path, 0, &je);
    CHECK(json_is_array(cases) && json_is_object(exp), "test data: %s", je.text);
    if (!json_is_array(cases) || !json_is_object(exp)) return;
    json_t *render = json_object_get(exp, "render"), *tojson = json_object_get(exp, "tojson");
    CHECK(json_array_size(render) == json_array_size(cases) && json_array_size(cases) >= 9, "%zu cases",
          json_array_size(cases));
    int32_t im_end = st_tokenizer_special_id(tk, "<|im_end|>");
    CHECK(im_end >= 0, "<|im_end|> in the tokenizer");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        st_chat_prompt_t p;
        st_openai_err_t e;
        st_status_t s = st_chat_render(tk, json_object_get(c, "messages"), json_object_get(c, "tools"), &p, &e);
        CHECK(s == ST_OK, "case %zu refused: %s", i, e.message);
        if (s != ST_OK) continue;
        const char *want = json_string_value(json_array_get(render, i));
        CHECK(want && p.len == strlen(want) && !memcmp(p.text, want, p.len), "case %zu: rendered\n  %s\nJinja2:\n  %s", i,
              p.text, want ? want : "?");
        /* the ids give the text back, markers included */
        char *back = NULL;
        size_t bl = 0;
        CHECK(st_tokenizer_decode(tk, p.ids.ids, p.ids.n, 0, &back, &bl) == ST_OK && bl == p.len &&
                  !memcmp(back, p.text, bl),
              "case %zu: ids decode to the text", i);
        free(back);
        /* one <|im_end|> id per turn: the default system one (when the first is not a system
         * message), one per tool declaration and one per message; a typed one is text */
        json_t *msgs = json_object_get(c, "messages");
        const char *r0 = json_string_value(json_object_get(json_array_get(msgs, 0), "role"));
        int turns = (int)json_array_size(msgs) + (strcmp(r0, "system") != 0) + (json_array_size(json_object_get(c, "tools")) > 0);
        CHECK(count_id(&p.ids, im_end) == turns, "case %zu: %d <|im_end|> ids, %d turns", i, count_id(&p.ids, im_end),
              turns);
        json_t *tools = json_object_get(c, "tools");
        if (tools) {
            char *js = st_chat_tojson(tools);
            const char *py = json_string_value(json_array_get(tojson, i));
            CHECK(js && py && !strcmp(js, py), "case %zu: tojson\n  %s\njson.dumps:\n  %s", i, js ? js : "?",
                  py ? py : "?");
            free(js);
        }
        st_chat_prompt_cleanup(&p);
    }
    json_decref(cases);
    json_decref(exp);
}

static void test_refused(void) {
    static const char *bad[] = {
        "[]", "{}", "[{\"content\":\"x\"}]", "[{\"role\":\"wizard\",\"content\":\"x\"}]", "[{\"role\":7}]",
        "[{\"role\":\"user\",\"content\":7}]",
        "[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]",
        "[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]", "[{\"role\":\"user\",\"name\":5,\"content\":\"x\"}]",
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]",
        "[{\"role\":\"assistant\",\"tool_calls\":{}}]", "[{\"role\":\"tool\",\"tool_call_id\":3,\"content\":\"x\"}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *m = json_loads(bad[i], 0, NULL);
        st_chat_prompt_t p;
        st_openai_err_t e = {0};
        st_status_t s = st_chat_render(tk, m, NULL, &p, &e);
        CHECK(s == ST_ERR_INVALID_ARG && e.message[0] && e.param, "refused: %s", bad[i]);
        if (s == ST_OK) st_chat_prompt_cleanup(&p);
        json_decref(m);
    }
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"x\"}]", 0, NULL), *t = json_loads("{}", 0, NULL);
    st_chat_prompt_t p;
    st_openai_err_t e = {0};
    CHECK(st_chat_render(tk, m, t, &p, &e) == ST_ERR_INVALID_ARG && !strcmp(e.param, "tools"), "tools not an array");
    json_decref(m);
    json_decref(t);
    /* an empty array of parts is empty content (no copy from NULL: UBSan, fuzz/corpus/openai/found_empty_parts.json) */
    m = json_loads("[{\"role\":\"user\",\"content\":[]}]", 0, NULL);
    CHECK(st_chat_render(tk, m, NULL, &p, &e) == ST_OK && strstr(p.text, "<|im_user|>user<|im_middle|><|im_end|>"),
          "empty parts");
    st_chat_prompt_cleanup(&p);
    json_decref(m);
}

static void test_tool_calls(void) {
    const char *out = "I'll check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                      "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|> "
                      "functions.get_time:1 <|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
    size_t cl = 0;
    json_t *calls = st_chat_tool_calls(out, strlen(out), &cl);
    CHECK(calls && json_array_size(calls) == 2, "two calls");
    CHECK(cl == strlen("I'll check."), "content before the section: %zu", cl);
    json_t *c0 = json_array_get(calls, 0), *c1 = json_array_get(calls, 1);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "id")), "functions.get_weather:0") &&
              !strcmp(json_string_value(json_object_get(c0, "type")), "function") &&
              !strcmp(json_string_value(json_object_get(json_object_get(c0, "function"), "name")), "get_weather") &&
              !strcmp(json_string_value(json_object_get(json_object_get(c0, "function"), "arguments")),
                      "{\"city\": \"Paris\"}"),
          "first call");
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(c1, "function"), "name")), "get_time") &&
              !strcmp(json_string_value(json_object_get(c1, "id")), "functions.get_time:1"),
          "second call (spaces trimmed)");
    json_decref(calls);
    /* the section cut off (max_tokens) keeps the complete calls; none at all is no tool call */
    const char *cut = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}"
                      "<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{\"a";
    calls = st_chat_tool_calls(cut, strlen(cut), &cl);
    CHECK(calls && json_array_size(calls) == 1 && cl == 0, "a cut section keeps its complete call");
    json_decref(calls);
    CHECK(!st_chat_tool_calls("plain text", 10, &cl), "no section");
    const char *empty = "x<|tool_calls_section_begin|><|tool_calls_section_end|>";
    CHECK(!st_chat_tool_calls(empty, strlen(empty), &cl), "an empty section is no call");
}

static void test_parse_chat(void) {
    st_openai_limits_t lim = {.model = "m", .vocab = (int)st_tokenizer_n_ids(tk), .tok = tk};
    st_openai_req_t r;
    st_openai_err_t e;
    const char *ok = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":7,"
                     "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"stop\":\"END\",\"logprobs\":false,"
                     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"auto\"}";
    CHECK(st_openai_parse_chat(ok, strlen(ok), &lim, &r, &e) == ST_OK, "chat request: %s", e.message);
    CHECK(r.chat && r.stream && r.include_usage && r.tools && r.req.max_tokens == 7 && r.req.n_prompt_tokens > 10 &&
              !r.req.prompt && r.n_stop_strs == 1 && !strcmp(r.stop_strs[0], "END"),
          "chat fields");
    CHECK(!r.req.logprobs && !r.req.top_logprobs && !r.req.dump_logits, "logprobs false: none asked");
    st_openai_req_cleanup(&r);
    const char *lp = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":20}";
    CHECK(st_openai_parse_chat(lp, strlen(lp), &lim, &r, &e) == ST_OK && r.req.logprobs && r.req.top_logprobs == 20 &&
              !r.req.dump_logits,
          "logprobs with top 20: values asked of the worker, no logits row");
    st_openai_req_cleanup(&r);
    const char *none = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\","
                       "\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}";
    CHECK(st_openai_parse_chat(none, strlen(none), &lim, &r, &e) == ST_OK && !r.tools && r.req.max_tokens == 1000000,
          "tool_choice none: no tools; no max_tokens: up to the context");
    st_openai_req_cleanup(&r);
    static const char *bad[][2] = {
        {"{\"messages\":[]}", "messages"},
        {"{\"prompt\":\"hi\"}", "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":2}", "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"required\"}", "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":0}", "max_completion_tokens"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":65}", "n"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"model\":\"other\"}", "model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_status_t s = st_openai_parse_chat(bad[i][0], strlen(bad[i][0]), &lim, &r, &e);
        CHECK((s == ST_ERR_INVALID_ARG || s == ST_ERR_OUT_OF_RANGE) && e.param && !strcmp(e.param, bad[i][1]),
              "refused %s (param %s)", bad[i][0], e.param ? e.param : "null");
        if (s == ST_OK) st_openai_req_cleanup(&r);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: test_chat TOKENIZER_DIR CASES.json EXPECTED.json\n");
        return 2;
    }
    st_tokenizer_opts_t o = {.quiet = true};
    if (st_tokenizer_load(&tk, argv[1], &o) != ST_OK || st_tokenizer_kind(tk) != ST_TOKENIZER_TIKTOKEN) {
        fprintf(stderr, "test_chat: %s: %s\n", argv[1], st_err_last());
        return 1;
    }
    test_render(argv[2], argv[3]);
    test_refused();
    test_tool_calls();
    test_parse_chat();
    st_tokenizer_destroy(tk);
    return st_test_done();
}
