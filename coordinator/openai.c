/* OpenAI request parsing, the Generate request checks and strict UTF-8 cleaning (see openai.h).
 * Pure: no loop, no logging, nothing global; every failure is the caller's to report. */
#include "openai.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static st_status_t refuse(st_openai_err_t *e, st_status_t s, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static st_status_t refuse(st_openai_err_t *e, st_status_t s, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* a client's string (valid UTF-8: JSON) may have been cut mid-character: drop the cut one */
    size_t n = strlen(e->message);
    if (!st_openai_utf8_valid((const unsigned char *)e->message, n)) {
        while (n > 0 && ((unsigned char)e->message[n - 1] & 0xC0) == 0x80)
            n--;
        if (n > 0 && (unsigned char)e->message[n - 1] >= 0xC0) n--;
        e->message[n] = 0;
        if (!st_openai_utf8_valid((const unsigned char *)e->message, n))
            snprintf(e->message, sizeof e->message, "invalid request");
    }
    e->param = param;
    return s;
}

/* ================================================================ UTF-8 */

/* Table 3-7: the second byte's range depends on the lead; later bytes are 80..BF. Returns the
 * sequence length for a lead byte (0: cannot start one) and the second byte's bounds. */
static int utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0; /* continuation bytes, C0 and C1 (overlong 2-byte forms) */
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0; /* overlong 3-byte forms */
        if (c == 0xED) *hi = 0x9F; /* surrogates D800..DFFF */
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0) *lo = 0x90; /* overlong 4-byte forms */
        if (c == 0xF4) *hi = 0x8F; /* beyond U+10FFFF */
        return 4;
    }
    return 0; /* F5..FF */
}

size_t st_openai_utf8_clean(const unsigned char *in, size_t n, char *out, size_t *out_len, int final) {
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned char lo, hi;
        int len = utf8_lead(in[i], &lo, &hi);
        if (len == 1) {
            out[o++] = (char)in[i++];
            continue;
        }
        /* the maximal subpart: as many bytes as continue a well-formed prefix */
        size_t k = 1;
        if (len > 1)
            while (k < (size_t)len && i + k < n) {
                unsigned char b = in[i + k], l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
                if (b < l || b > h) break;
                k++;
            }
        if (len > 1 && k == (size_t)len) { /* well-formed */
            memcpy(out + o, in + i, k);
            o += k;
            i += k;
            continue;
        }
        if (len > 1 && i + k == n && !final) break; /* a prefix cut by the chunk's end: hold it */
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += k;
    }
    out[o] = 0;
    *out_len = o;
    return i;
}

int st_openai_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char lo, hi;
        int len = utf8_lead(s[i], &lo, &hi);
        if (len == 0 || i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++) {
            unsigned char b = s[i + k];
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
        }
        i += (size_t)len;
    }
    return 1;
}

/* ================================================================ checks */

st_status_t st_openai_check(const st_proto_generate_req_t *r, const st_openai_limits_t *lim, st_openai_err_t *e) {
    if (r->max_tokens < 1 || r->max_tokens > ST_OPENAI_MAX_TOKENS)
        return refuse(e, ST_ERR_OUT_OF_RANGE, "max_tokens", "'max_tokens' must be 1..%u", ST_OPENAI_MAX_TOKENS);
    if (!r->n_prompt_tokens && (!r->prompt || !r->prompt[0]))
        return refuse(e, ST_ERR_INVALID_ARG, "prompt", "the prompt is empty");
    if (r->n_prompt_tokens && !r->prompt_tokens) return refuse(e, ST_ERR_INVALID_ARG, "prompt", "no prompt tokens");
    for (size_t i = 0; lim->vocab > 0 && i < r->n_prompt_tokens; i++)
        if (r->prompt_tokens[i] >= (uint32_t)lim->vocab)
            return refuse(e, ST_ERR_OUT_OF_RANGE, "prompt", "prompt token %u is outside the vocabulary 0..%d",
                          r->prompt_tokens[i], lim->vocab - 1);
    if (!(r->temperature >= 0) || r->temperature > ST_OPENAI_MAX_TEMPERATURE) /* NaN fails both */
        return refuse(e, ST_ERR_OUT_OF_RANGE, "temperature", "'temperature' must be 0..%g", ST_OPENAI_MAX_TEMPERATURE);
    if (!(r->top_p >= 0) || r->top_p > 1) return refuse(e, ST_ERR_OUT_OF_RANGE, "top_p", "'top_p' must be 0..1");
    if (r->top_k > ST_OPENAI_MAX_TOP_K)
        return refuse(e, ST_ERR_OUT_OF_RANGE, "top_k", "'top_k' must be -1..%d", ST_OPENAI_MAX_TOP_K);
    if (r->n_stop_ids > ST_OPENAI_MAX_STOP || (r->n_stop_ids && !r->stop_ids))
        return refuse(e, ST_ERR_INVALID_ARG, "stop", "at most %d stop ids", ST_OPENAI_MAX_STOP);
    if (!(fabsf(r->presence_penalty) <= 2) || !(fabsf(r->frequency_penalty) <= 2))
        return refuse(e, ST_ERR_OUT_OF_RANGE, r->presence_penalty != 0 ? "presence_penalty" : "frequency_penalty",
                      "penalties must be -2..2");
    if (r->n_logit_bias > ST_OPENAI_MAX_LOGIT_BIAS || (r->n_logit_bias && (!r->logit_bias_ids || !r->logit_bias_values)))
        return refuse(e, ST_ERR_INVALID_ARG, "logit_bias", "at most %d logit_bias entries", ST_OPENAI_MAX_LOGIT_BIAS);
    for (size_t i = 0; i < r->n_logit_bias; i++)
        if ((lim->vocab > 0 && r->logit_bias_ids[i] >= (uint32_t)lim->vocab) || !(fabsf(r->logit_bias_values[i]) <= 100))
            return refuse(e, ST_ERR_OUT_OF_RANGE, "logit_bias", "logit_bias token %u: ids below %d, values -100..100",
                          r->logit_bias_ids[i], lim->vocab);
    for (size_t i = 0; lim->vocab > 0 && i < r->n_stop_ids; i++)
        if (r->stop_ids[i] >= (uint32_t)lim->vocab)
            return refuse(e, ST_ERR_OUT_OF_RANGE, "stop", "stop id %u is outside the vocabulary 0..%d", r->stop_ids[i],
                          lim->vocab - 1);
    return ST_OK;
}

/* ================================================================ /v1/completions */

/* present and not null */
static json_t *field(json_t *body, const char *key) {
    json_t *v = json_object_get(body, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* One prompt: a non-empty string, or a non-empty array of token ids. */
static st_status_t parse_one_prompt(json_t *p, char **text, uint32_t **ids, size_t *n_ids, st_openai_err_t *e) {
    if (json_is_string(p)) {
        size_t n = json_string_length(p);
        if (n == 0) return refuse(e, ST_ERR_INVALID_ARG, "prompt", "the prompt is empty");
        if (memchr(json_string_value(p), 0, n))
            return refuse(e, ST_ERR_INVALID_ARG, "prompt", "the prompt contains a NUL character");
        if (!(*text = malloc(n + 1))) return ST_ERR_NO_MEMORY;
        memcpy(*text, json_string_value(p), n + 1);
        return ST_OK;
    }
    if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n = json_array_size(p);
        if (!(*ids = malloc(sizeof(uint32_t) * n))) return ST_ERR_NO_MEMORY;
        *n_ids = n;
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(p, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
                return refuse(e, ST_ERR_INVALID_ARG, "prompt", "a token-id prompt must hold non-negative integers");
            (*ids)[i] = (uint32_t)json_integer_value(v);
        }
        return ST_OK;
    }
    return refuse(e, ST_ERR_INVALID_ARG, "prompt",
                  "'prompt' must be a string, an array of token ids, or a batch: an array of strings or of "
                  "token-id arrays");
}

/* "prompt": one prompt, or a batch (an array of strings, or of token-id arrays): the first into
 * out->req, the others into out->batch. */
static st_status_t parse_prompt(json_t *p, st_openai_req_t *out, st_openai_err_t *e) {
    st_proto_generate_req_t *r = &out->req;
    size_t n = json_array_size(p);
    int batch = json_is_array(p) && n > 0 && (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    if (!batch) {
        out->n_prompts = 1;
        return parse_one_prompt(p, &r->prompt, &r->prompt_tokens, &r->n_prompt_tokens, e);
    }
    if (n > ST_OPENAI_MAX_CHOICES)
        return refuse(e, ST_ERR_INVALID_ARG, "prompt", "a batch holds at most %d prompts", ST_OPENAI_MAX_CHOICES);
    for (size_t i = 0; i < n; i++)
        if (!json_is_string(json_array_get(p, i)) && !json_is_array(json_array_get(p, i)))
            return refuse(e, ST_ERR_INVALID_ARG, "prompt", "a batch is an array of strings or of token-id arrays");
    if (n > 1 && !(out->batch = calloc(n - 1, sizeof *out->batch))) return ST_ERR_NO_MEMORY;
    out->n_prompts = n;
    st_status_t s = parse_one_prompt(json_array_get(p, 0), &r->prompt, &r->prompt_tokens, &r->n_prompt_tokens, e);
    for (size_t i = 1; i < n && s == ST_OK; i++) {
        st_openai_prompt_t *b = &out->batch[i - 1];
        s = parse_one_prompt(json_array_get(p, i), &b->text, &b->ids, &b->n_ids, e);
    }
    return s;
}

/* An integer field in [lo, hi]; *out untouched when absent. 1 present, 0 absent, -1 refused. */
static int int_field(json_t *body, const char *key, json_int_t lo, json_int_t hi, json_int_t *out, st_openai_err_t *e,
                     st_status_t *s) {
    json_t *v = field(body, key);
    if (!v) return 0;
    /* 16.0 is not an integer to OpenAI either; huge values arrive as reals (or fail to parse) */
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        *s = refuse(e, json_is_integer(v) ? ST_ERR_OUT_OF_RANGE : ST_ERR_INVALID_ARG, key,
                    "'%s' must be an integer %lld..%lld", key, (long long)lo, (long long)hi);
        return -1;
    }
    *out = json_integer_value(v);
    return 1;
}

static int num_field(json_t *body, const char *key, double lo, double hi, double *out, st_openai_err_t *e,
                     st_status_t *s) {
    json_t *v = field(body, key);
    if (!v) return 0;
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    if (!json_is_number(v) || !(d >= lo && d <= hi)) {
        *s = refuse(e, json_is_number(v) ? ST_ERR_OUT_OF_RANGE : ST_ERR_INVALID_ARG, key,
                    "'%s' must be a number %g..%g", key, lo, hi);
        return -1;
    }
    *out = d;
    return 1;
}

static int bool_field(json_t *body, const char *key, int *out, st_openai_err_t *e, st_status_t *s) {
    json_t *v = field(body, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) {
        *s = refuse(e, ST_ERR_INVALID_ARG, key, "'%s' must be a boolean", key);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

/* "stop": a string or an array of strings, each 1..ST_OPENAI_MAX_STOP_BYTES bytes */
static st_status_t parse_stop(json_t *v, st_openai_req_t *out, st_openai_err_t *e) {
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > ST_OPENAI_MAX_STOP_STRINGS || !(json_is_array(v) || json_is_string(v)))
        return refuse(e, ST_ERR_INVALID_ARG, "stop", "'stop' takes a string or up to %d strings",
                      ST_OPENAI_MAX_STOP_STRINGS);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(x) || json_string_length(x) == 0 || json_string_length(x) > ST_OPENAI_MAX_STOP_BYTES ||
            memchr(json_string_value(x), 0, json_string_length(x)))
            return refuse(e, ST_ERR_INVALID_ARG, "stop", "each 'stop' string must have 1..%d bytes and no NUL",
                          ST_OPENAI_MAX_STOP_BYTES);
        if (!(out->stop_strs[out->n_stop_strs] = strdup(json_string_value(x)))) return ST_ERR_NO_MEMORY;
        out->n_stop_strs++;
    }
    return ST_OK;
}

static st_status_t parse_body(json_t *body, const st_openai_limits_t *lim, int chat, st_openai_req_t *out,
                              st_openai_err_t *e) {
    st_proto_generate_req_t *r = &out->req;
    st_status_t s = ST_OK;
    json_t *v;
    if ((v = field(body, "model"))) {
        if (!json_is_string(v)) return refuse(e, ST_ERR_INVALID_ARG, "model", "'model' must be a string");
        if (lim->model && strcmp(json_string_value(v), lim->model) != 0)
            return refuse(e, ST_ERR_INVALID_ARG, "model", "model '%.120s' is not served here (this server has '%s')",
                          json_string_value(v), lim->model);
    }
    out->chat = chat;
    if (chat) {
        if (!lim->tok) return refuse(e, ST_ERR_INVALID_ARG, NULL, "chat needs the checkpoint's tokenizer");
        if (!(v = field(body, "messages"))) return refuse(e, ST_ERR_INVALID_ARG, "messages", "missing 'messages'");
        json_t *tools = field(body, "tools"), *choice = field(body, "tool_choice");
        int k3 = lim->chat_format == ST_CHAT_K3;
        const char *cs = json_string_value(choice);
        if (choice && !(cs && (!strcmp(cs, "auto") || !strcmp(cs, "none") || (k3 && !strcmp(cs, "required")))))
            return refuse(e, ST_ERR_INVALID_ARG, "tool_choice",
                          k3 ? "'tool_choice' supports \"auto\", \"none\" and \"required\""
                             : "'tool_choice' supports \"auto\" and \"none\"");
        st_chat_prompt_t p;
        out->chat_format = lim->chat_format;
        if (k3) {
            /* K3 is told tool_choice and response_format in notes; reasoning_effort "none" turns
             * thinking off, other values are the thinking-effort note's */
            st_chat_k3_opts_t o = {.thinking = 1, .tool_choice = cs};
            json_t *re = field(body, "reasoning_effort"), *rf = field(body, "response_format");
            if (re && !json_is_string(re))
                return refuse(e, ST_ERR_INVALID_ARG, "reasoning_effort", "'reasoning_effort' must be a string");
            if (re && !strcmp(json_string_value(re), "none")) o.thinking = 0;
            else if (re) o.effort = json_string_value(re);
            const char *rft = json_string_value(json_object_get(rf, "type"));
            if (rf && !(rft && (!strcmp(rft, "text") || !strcmp(rft, "json_object") || !strcmp(rft, "json_schema"))))
                return refuse(e, ST_ERR_INVALID_ARG, "response_format",
                              "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
            o.response_format = rf;
            if ((s = st_chat_render_k3(lim->tok, v, tools, &o, &p, e)) != ST_OK) return s;
            out->thinking = o.thinking;
        } else {
            if (cs && !strcmp(cs, "none")) tools = NULL;
            if ((s = st_chat_render(lim->tok, v, tools, &p, e)) != ST_OK) return s;
        }
        out->tools = json_array_size(tools) > 0 && !(cs && !strcmp(cs, "none"));
        r->n_prompt_tokens = p.ids.n;
        r->prompt_tokens = (uint32_t *)p.ids.ids; /* the tokenizer's ids are non-negative */
        p.ids.ids = NULL;
        p.ids.n = 0;
        st_chat_prompt_cleanup(&p);
        out->n_prompts = 1;
    } else {
        if (!(v = field(body, "prompt"))) return refuse(e, ST_ERR_INVALID_ARG, "prompt", "missing 'prompt'");
        if ((s = parse_prompt(v, out, e)) != ST_OK) return s;
    }
    json_int_t iv = chat ? ST_OPENAI_MAX_TOKENS : 16;
    if (int_field(body, "max_tokens", 1, ST_OPENAI_MAX_TOKENS, &iv, e, &s) < 0) return s;
    if (chat && int_field(body, "max_completion_tokens", 1, ST_OPENAI_MAX_TOKENS, &iv, e, &s) < 0) return s;
    r->max_tokens = (uint32_t)iv;
    double dv = 1.0;
    if (num_field(body, "temperature", 0, ST_OPENAI_MAX_TEMPERATURE, &dv, e, &s) < 0) return s;
    r->temperature = (float)dv;
    dv = 1.0;
    if (num_field(body, "top_p", 0, 1, &dv, e, &s) < 0) return s;
    r->top_p = (float)dv;
    iv = 0;
    if (int_field(body, "top_k", -1, ST_OPENAI_MAX_TOP_K, &iv, e, &s) < 0) return s;
    r->top_k = iv > 0 ? (uint32_t)iv : 0;
    int k = int_field(body, "seed", 0, INT64_MAX, &iv, e, &s);
    if (k < 0) return s;
    if (k > 0) {
        r->seed = (uint64_t)iv;
        r->has_seed = 1;
    }
    iv = 1;
    if (int_field(body, "n", 1, ST_OPENAI_MAX_CHOICES, &iv, e, &s) < 0) return s;
    out->n = (int)iv;
    if ((size_t)out->n * (out->n_prompts ? out->n_prompts : 1) > ST_OPENAI_MAX_CHOICES)
        return refuse(e, ST_ERR_INVALID_ARG, "n", "n x prompts is at most %d choices", ST_OPENAI_MAX_CHOICES);
    if (int_field(body, "best_of", 1, 1, &iv, e, &s) < 0)
        return refuse(e, s, "best_of", "only best_of = 1 is supported");
    int b = 0;
    out->logprobs = -1;
    if (chat) {
        if (bool_field(body, "logprobs", &b, e, &s) < 0) return s;
        iv = 0;
        int k = int_field(body, "top_logprobs", 0, ST_OPENAI_MAX_LOGPROBS, &iv, e, &s);
        if (k < 0) return s;
        if (k > 0 && !b) return refuse(e, ST_ERR_INVALID_ARG, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (b) out->logprobs = (int)iv;
    } else {
        iv = -1;
        if (int_field(body, "logprobs", 0, ST_OPENAI_MAX_LOGPROBS, &iv, e, &s) < 0) return s;
        out->logprobs = (int)iv;
    }
    /* the engine computes them: each chunk carries its token's logprob and the top ones (values) */
    r->logprobs = out->logprobs >= 0;
    r->top_logprobs = out->logprobs > 0 ? (uint32_t)out->logprobs : 0;
    dv = 0;
    if (num_field(body, "presence_penalty", -2, 2, &dv, e, &s) < 0) return s;
    r->presence_penalty = (float)dv;
    dv = 0;
    if (num_field(body, "frequency_penalty", -2, 2, &dv, e, &s) < 0) return s;
    r->frequency_penalty = (float)dv;
    if ((v = field(body, "logit_bias"))) {
        if (!json_is_object(v) || json_object_size(v) > ST_OPENAI_MAX_LOGIT_BIAS)
            return refuse(e, ST_ERR_INVALID_ARG, "logit_bias", "'logit_bias' maps up to %d token ids to -100..100",
                          ST_OPENAI_MAX_LOGIT_BIAS);
        const char *key;
        json_t *x;
        size_t n = 0;
        json_object_foreach(v, key, x) {
            char *end;
            unsigned long id = strtoul(key, &end, 10);
            double bv = json_is_number(x) ? json_number_value(x) : NAN;
            if (!key[0] || *end || key[0] == '-' || key[0] == '+' || id > UINT32_MAX || !(bv >= -100 && bv <= 100))
                return refuse(e, ST_ERR_INVALID_ARG, "logit_bias",
                              "'logit_bias' keys are token ids (decimal) and values numbers -100..100 ('%.40s')", key);
            out->bias_ids[n] = (uint32_t)id;
            out->bias_values[n++] = (float)bv;
        }
        r->n_logit_bias = n;
        r->logit_bias_ids = n ? out->bias_ids : NULL;
        r->logit_bias_values = n ? out->bias_values : NULL;
    }
    b = 0;
    if (!chat) {
        if (bool_field(body, "echo", &b, e, &s) < 0) return s;
        out->echo = b;
        for (size_t i = 0; b && i < out->n_prompts; i++)
            if (!(i ? out->batch[i - 1].text : r->prompt))
                return refuse(e, ST_ERR_INVALID_ARG, "echo", "echo needs text prompts");
    }
    b = 0;
    if (bool_field(body, "ignore_eos", &b, e, &s) < 0) return s; /* vLLM's extension */
    r->ignore_eos = b;
    b = 0;
    if (bool_field(body, "stream", &b, e, &s) < 0) return s;
    out->stream = b;
    if ((v = field(body, "stream_options"))) {
        if (!json_is_object(v)) return refuse(e, ST_ERR_INVALID_ARG, "stream_options", "'stream_options' must be an object");
        b = 0;
        if (bool_field(v, "include_usage", &b, e, &s) < 0) return s;
        out->include_usage = b;
    }
    if ((v = field(body, "stop")) && (s = parse_stop(v, out, e)) != ST_OK) return s;
    if ((s = st_openai_check(r, lim, e)) != ST_OK) return s;
    for (size_t i = 1; i < out->n_prompts; i++) { /* each prompt of a batch passes the same checks */
        st_proto_generate_req_t o = *r;
        o.prompt = out->batch[i - 1].text;
        o.prompt_tokens = out->batch[i - 1].ids;
        o.n_prompt_tokens = out->batch[i - 1].n_ids;
        if ((s = st_openai_check(&o, lim, e)) != ST_OK) return s;
    }
    return ST_OK;
}

static st_status_t parse_any(const char *body, size_t len, const st_openai_limits_t *lim, int chat, st_openai_req_t *out,
                             st_openai_err_t *e) {
    st_openai_req_t r;
    memset(&r, 0, sizeof r);
    e->message[0] = 0;
    e->param = NULL;
    json_error_t je;
    json_t *j = json_loadb(body ? body : "", body ? len : 0, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        if (!j)
            return refuse(e, ST_ERR_INVALID_ARG, NULL, "the request body is not valid JSON: %s (line %d column %d)",
                          je.text, je.line, je.column);
        return refuse(e, ST_ERR_INVALID_ARG, NULL, "the request body must be a JSON object");
    }
    st_status_t s = parse_body(j, lim, chat, &r, e);
    json_decref(j);
    if (s != ST_OK) {
        st_openai_req_cleanup(&r);
        return s;
    }
    *out = r;
    if (out->req.n_stop_ids) out->req.stop_ids = out->stops; /* into *out, not the local copy */
    if (out->req.n_logit_bias) {
        out->req.logit_bias_ids = out->bias_ids;
        out->req.logit_bias_values = out->bias_values;
    }
    return ST_OK;
}

st_status_t st_openai_parse_completion(const char *body, size_t len, const st_openai_limits_t *lim,
                                       st_openai_req_t *out, st_openai_err_t *e) {
    return parse_any(body, len, lim, 0, out, e);
}

st_status_t st_openai_parse_chat(const char *body, size_t len, const st_openai_limits_t *lim, st_openai_req_t *out,
                                 st_openai_err_t *e) {
    return parse_any(body, len, lim, 1, out, e);
}

void st_openai_req_cleanup(st_openai_req_t *r) {
    for (size_t i = 0; i < r->n_stop_strs; i++) free(r->stop_strs[i]);
    for (size_t i = 0; r->batch && i + 1 < r->n_prompts; i++) {
        free(r->batch[i].text);
        free(r->batch[i].ids);
    }
    free(r->batch);
    free(r->req.prompt);
    free(r->req.prompt_tokens);
    memset(r, 0, sizeof *r);
}

/* ================================================================ client authentication */

int st_openai_bearer_ok(const char *h, const char *key) {
    if (!h || !key) return 0;
    while (*h == ' ' || *h == '\t')
        h++;
    if (strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return 0;
    h += 6;
    while (*h == ' ' || *h == '\t')
        h++;
    size_t n = strlen(h);
    while (n > 0 && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    uint8_t a[32], b[32];
    st_sha256(h, n, a);
    st_sha256(key, strlen(key), b);
    return st_ct_equal(a, b, sizeof a);
}
