/* tools/train/chat.py renders its chat-format training rows as strata's coordinator renders a K3
 * chat request: for each case written by test_chat_format.sh (chat.py on a K3 tokenizer folder), the
 * prompt ids equal st_chat_render_k3's for the same messages and thinking mode; prompt + the taught
 * reply is the start of the coordinator's rendering of the conversation with the answer as the
 * assistant's turn; and the reply, decoded, reads back (st_chat_k3_reply) as exactly the answer.
 * usage: test_chat_format K3_TOKENIZER_DIR CASES.json */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "openai.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s K3_TOKENIZER_DIR CASES.json\n", argv[0]);
        return 2;
    }
    st_tokenizer_t *tk = NULL;
    CHECK(st_tokenizer_load(&tk, argv[1], NULL) == ST_OK, "tokenizer: %s", st_err_last());
    json_error_t je;
    json_t *cases = json_load_file(argv[2], 0, &je);
    CHECK(cases && json_array_size(cases) >= 4, "cases: %s", je.text);
    if (!tk || !cases) return st_test_done();
    int32_t eom = st_tokenizer_special_id(tk, "<|end_of_msg|>");
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const json_t *m = json_object_get(c, "messages"), *want = json_object_get(c, "prompt"),
                     *reply = json_object_get(c, "reply");
        int thinking = json_is_true(json_object_get(c, "thinking"));
        st_chat_k3_opts_t o = {.thinking = thinking};
        st_chat_prompt_t p;
        st_openai_err_t e = {0};
        st_status_t s = st_chat_render_k3(tk, m, NULL, &o, &p, &e);
        CHECK(s == ST_OK, "case %zu refused: %s", i, e.message);
        if (s != ST_OK) continue;
        int same = p.ids.n == json_array_size(want);
        for (size_t k = 0; same && k < p.ids.n; k++) same = p.ids.ids[k] == json_integer_value(json_array_get(want, k));
        CHECK(same, "case %zu (thinking %d): chat.py's prompt ids differ from the coordinator's rendering\n  %s", i,
              thinking, p.text);
        st_chat_prompt_cleanup(&p);
        size_t nr = json_array_size(reply);
        int32_t *ids = malloc((nr ? nr : 1) * sizeof *ids);
        for (size_t k = 0; k < nr; k++) ids[k] = (int32_t)json_integer_value(json_array_get(reply, k));
        CHECK(nr > 0 && ids[nr - 1] == eom, "case %zu: the reply ends with <|end_of_msg|>", i);
        /* prompt + reply = the coordinator's rendering of the conversation with that answer as the
         * assistant's turn (K3 history form), up to the generation prompt that follows it */
        json_t *conv = json_deep_copy(m);
        json_array_append_new(conv, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                              json_string_value(json_object_get(c, "answer"))));
        if (st_chat_render_k3(tk, conv, NULL, &o, &p, &e) == ST_OK) {
            size_t np = json_array_size(want);
            int prefix = p.ids.n > np + nr;
            for (size_t k = 0; prefix && k < np + nr; k++)
                prefix = p.ids.ids[k] == (k < np ? json_integer_value(json_array_get(want, k)) : ids[k - np]);
            CHECK(prefix, "case %zu: prompt + reply is not the rendered conversation's start\n  %s", i, p.text);
            st_chat_prompt_cleanup(&p);
        } else {
            CHECK(0, "case %zu: conversation refused: %s", i, e.message);
        }
        json_decref(conv);
        char *text = NULL;
        size_t len = 0;
        /* the reply up to its stop token, as the server hands it to the reply parser */
        CHECK(st_tokenizer_decode(tk, ids, nr - 1, 0, &text, &len) == ST_OK, "case %zu: decode", i);
        if (text) {
            st_chat_k3_reply_t r = {0};
            st_chat_k3_reply(text, len, thinking, &r);
            const char *ans = json_string_value(json_object_get(c, "answer"));
            CHECK(r.content_len == strlen(ans) && !memcmp(text + r.content_off, ans, r.content_len) &&
                      r.reasoning_len == 0 && !r.tool_calls,
                  "case %zu: the reply reads back as content '%.*s', want '%s'", i, (int)r.content_len,
                  text + r.content_off, ans);
            json_decref(r.tool_calls);
        }
        free(text);
        free(ids);
    }
    printf("%zu cases\n", json_array_size(cases));
    json_decref(cases);
    st_tokenizer_destroy(tk);
    return st_test_done();
}
