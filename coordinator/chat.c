/* Kimi's chat format in C (see openai.h): the K2 / Kimi Linear grammar rendered from OpenAI chat
 * messages into token ids, Python's json.dumps for the tool declaration, and the tool-call section
 * of generated text parsed back into OpenAI tool_calls. Pure: no loop, no logging. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"

#define K2_DEFAULT_SYSTEM "You are Kimi, an AI assistant created by Moonshot AI."

/* ================================================================ a growable string */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2 + 64;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

/* ================================================================ json.dumps */

/* A float as Python's repr: the shortest digits that read back to the same double; positional
 * for exponents -4..15 (with ".0" when integral), else d[.ddd]e±XX. */
static void py_float(sbuf_t *b, double v) {
    char t[64];
    if (isnan(v)) { sb_str(b, "NaN"); return; }
    if (isinf(v)) { sb_str(b, v > 0 ? "Infinity" : "-Infinity"); return; }
    int p = 1;
    for (; p < 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, v);
        if (strtod(t, NULL) == v) break;
    }
    snprintf(t, sizeof t, "%.*e", p - 1, v);
    /* t = [-]d[.ddd]e±XX */
    char digits[32];
    int nd = 0, neg = t[0] == '-';
    const char *q = t + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) sb_put(b, "-", 1);
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            sb_str(b, "0.");
            for (int i = 0; i < -exp - 1; i++) sb_put(b, "0", 1);
            sb_put(b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= exp; i++) sb_put(b, i < nd ? &digits[i] : "0", 1);
            sb_put(b, ".", 1);
            if (nd > exp + 1) sb_put(b, digits + exp + 1, (size_t)(nd - exp - 1));
            else sb_put(b, "0", 1);
        }
    } else {
        sb_put(b, digits, 1);
        if (nd > 1) {
            sb_put(b, ".", 1);
            sb_put(b, digits + 1, (size_t)(nd - 1));
        }
        snprintf(t, sizeof t, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        sb_str(b, t);
    }
}

static void py_string(sbuf_t *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            esc = u;
        }
        if (!esc) continue;
        sb_put(b, s + run, i - run);
        sb_str(b, esc);
        run = i + 1;
    }
    sb_put(b, s + run, n - run);
    sb_put(b, "\"", 1);
}

static void py_json(sbuf_t *b, const json_t *v) {
    char t[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        sb_put(b, "{", 1);
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) sb_str(b, ", ");
            first = 0;
            py_string(b, k, strlen(k));
            sb_str(b, ": ");
            py_json(b, x);
        }
        sb_put(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        sb_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_str(b, ", ");
            py_json(b, json_array_get(v, i));
        }
        sb_put(b, "]", 1);
        break;
    case JSON_STRING: py_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(t, sizeof t, "%lld", (long long)json_integer_value(v));
        sb_str(b, t);
        break;
    case JSON_REAL: py_float(b, json_real_value(v)); break;
    case JSON_TRUE: sb_str(b, "true"); break;
    case JSON_FALSE: sb_str(b, "false"); break;
    default: sb_str(b, "null"); break;
    }
}

char *st_chat_tojson(const json_t *v) {
    sbuf_t b = {0};
    py_json(&b, v);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p ? b.p : strdup("");
}

/* ================================================================ rendering */

/* The prompt under construction: text runs between markers are encoded as ordinary text (no
 * special tokens), each marker is its special id. */
typedef struct {
    const st_tokenizer_t *tk;
    sbuf_t text;   /* the whole rendering */
    size_t run;    /* where the current ordinary-text run starts in text */
    st_tok_ids_t *ids;
    st_status_t s;
} render_t;

static void flush_run(render_t *r) {
    if (r->s != ST_OK || r->text.oom) return;
    if (r->text.n > r->run) r->s = st_tokenizer_encode(r->tk, r->text.p + r->run, r->text.n - r->run, 0, r->ids);
    r->run = r->text.n;
}

static void marker(render_t *r, const char *name) {
    int32_t id = st_tokenizer_special_id(r->tk, name);
    if (id < 0) { /* no such special token: the marker is text */
        sb_str(&r->text, name);
        return;
    }
    flush_run(r);
    sb_str(&r->text, name);
    r->run = r->text.n;
    if (r->s != ST_OK) return;
    if (r->ids->n == r->ids->cap) {
        size_t nc = r->ids->cap ? r->ids->cap * 2 : 256;
        int32_t *np = realloc(r->ids->ids, nc * sizeof *np);
        if (!np) {
            r->s = ST_ERR_NO_MEMORY;
            return;
        }
        r->ids->ids = np;
        r->ids->cap = nc;
    }
    r->ids->ids[r->ids->n++] = id;
}

static void text(render_t *r, const char *s) { sb_str(&r->text, s); }
static void textn(render_t *r, const char *s, size_t n) { sb_put(&r->text, s, n); }

static st_status_t refuse(st_openai_err_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static st_status_t refuse(st_openai_err_t *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->param = "messages";
    return ST_ERR_INVALID_ARG;
}

/* A message's content: a string, null, or an array of {"type":"text","text":...} parts (joined).
 * Images are refused: this server has no image input. */
static st_status_t content_of(const json_t *m, size_t i, sbuf_t *out, int *present, st_openai_err_t *e) {
    const json_t *c = json_object_get(m, "content");
    *present = 0;
    if (!c || json_is_null(c)) return ST_OK;
    if (json_is_string(c)) {
        sb_put(out, json_string_value(c), json_string_length(c));
        *present = 1;
        return ST_OK;
    }
    if (!json_is_array(c)) return refuse(e, "messages[%zu].content must be a string, null or an array of parts", i);
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *p = json_array_get(c, k), *ty = json_object_get(p, "type"), *tx = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(ty))
            return refuse(e, "messages[%zu].content[%zu] must be an object with a \"type\"", i, k);
        if (strcmp(json_string_value(ty), "text") != 0)
            return refuse(e, "messages[%zu].content[%zu]: type '%.40s' is not supported (text only)", i, k,
                          json_string_value(ty));
        if (!json_is_string(tx)) return refuse(e, "messages[%zu].content[%zu].text must be a string", i, k);
        sb_put(out, json_string_value(tx), json_string_length(tx));
    }
    *present = 1;
    return ST_OK;
}

static st_status_t render_message(render_t *r, const json_t *m, size_t i, st_openai_err_t *e) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *name = json_object_get(m, "name");
    if (name && !json_is_null(name) && !json_is_string(name))
        return refuse(e, "messages[%zu].name must be a string", i);
    const char *who = name && json_is_string(name) && json_string_length(name) ? json_string_value(name) : role;
    marker(r, !strcmp(role, "user") ? "<|im_user|>" : !strcmp(role, "assistant") ? "<|im_assistant|>" : "<|im_system|>");
    text(r, who);
    marker(r, "<|im_middle|>");
    sbuf_t c = {0};
    int present = 0;
    st_status_t s = content_of(m, i, &c, &present, e);
    if (s != ST_OK) {
        free(c.p);
        return s;
    }
    const json_t *calls = json_object_get(m, "tool_calls");
    if (calls && !json_is_null(calls) && !json_is_array(calls)) {
        free(c.p);
        return refuse(e, "messages[%zu].tool_calls must be an array", i);
    }
    if (!strcmp(role, "assistant") && json_array_size(calls) > 0) {
        if (c.n) textn(r, c.p, c.n);
        marker(r, "<|tool_calls_section_begin|>");
        for (size_t k = 0; k < json_array_size(calls); k++) {
            const json_t *tc = json_array_get(calls, k), *id = json_object_get(tc, "id"),
                         *fn = json_object_get(tc, "function"), *args = json_object_get(fn, "arguments");
            if (!json_is_object(tc) || !json_is_string(id) || !json_is_object(fn) || !args) {
                free(c.p);
                return refuse(e, "messages[%zu].tool_calls[%zu] needs \"id\" and \"function\".\"arguments\"", i, k);
            }
            marker(r, "<|tool_call_begin|>");
            text(r, json_string_value(id));
            marker(r, "<|tool_call_argument_begin|>");
            if (json_is_string(args)) {
                textn(r, json_string_value(args), json_string_length(args));
            } else {
                char *js = st_chat_tojson(args);
                if (!js) r->s = ST_ERR_NO_MEMORY;
                else text(r, js);
                free(js);
            }
            marker(r, "<|tool_call_end|>");
        }
        marker(r, "<|tool_calls_section_end|>");
    } else if (!strcmp(role, "tool")) {
        const json_t *id = json_object_get(m, "tool_call_id");
        if (id && !json_is_null(id) && !json_is_string(id)) {
            free(c.p);
            return refuse(e, "messages[%zu].tool_call_id must be a string", i);
        }
        text(r, "## Return of ");
        if (json_is_string(id)) text(r, json_string_value(id));
        text(r, "\n    ");
        if (present) textn(r, c.p, c.n);
        else text(r, "None"); /* Jinja2 prints Python's None */
    } else if (present) {
        textn(r, c.p, c.n);
    }
    free(c.p);
    marker(r, "<|im_end|>");
    return ST_OK;
}

st_status_t st_chat_render(const st_tokenizer_t *tk, const json_t *messages, const json_t *tools, st_chat_prompt_t *out,
                           st_openai_err_t *e) {
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return refuse(e, "'messages' must be a non-empty array");
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *m = json_array_get(messages, i), *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role))
            return refuse(e, "messages[%zu] must be an object with a string \"role\"", i);
        const char *ro = json_string_value(role);
        if (strcmp(ro, "system") && strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "tool") &&
            strcmp(ro, "developer"))
            return refuse(e, "messages[%zu].role '%.40s' is not one of system, developer, user, assistant, tool", i, ro);
    }
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        e->param = "tools";
        snprintf(e->message, sizeof e->message, "'tools' must be an array");
        return ST_ERR_INVALID_ARG;
    }
    st_chat_prompt_t p = {0};
    render_t r = {.tk = tk, .ids = &p.ids, .s = ST_OK};
    st_status_t s = ST_OK;
    if (json_array_size(tools) > 0) {
        marker(&r, "<|im_system|>");
        text(&r, "tool_declare");
        marker(&r, "<|im_middle|>");
        text(&r, "\n  # Tools\n  ");
        char *js = st_chat_tojson(tools);
        if (!js) r.s = ST_ERR_NO_MEMORY;
        else text(&r, js);
        free(js);
        marker(&r, "<|im_end|>");
    }
    const char *first = json_string_value(json_object_get(json_array_get(messages, 0), "role"));
    if (strcmp(first, "system") != 0) {
        marker(&r, "<|im_system|>");
        text(&r, "system");
        marker(&r, "<|im_middle|>");
        text(&r, K2_DEFAULT_SYSTEM);
        marker(&r, "<|im_end|>");
    }
    for (size_t i = 0; i < json_array_size(messages) && s == ST_OK; i++)
        s = render_message(&r, json_array_get(messages, i), i, e);
    marker(&r, "<|im_assistant|>");
    text(&r, "assistant");
    marker(&r, "<|im_middle|>");
    flush_run(&r);
    if (s == ST_OK) s = r.text.oom ? ST_ERR_NO_MEMORY : r.s;
    if (s != ST_OK) {
        free(r.text.p);
        st_tok_ids_free(&p.ids);
        return s;
    }
    p.text = r.text.p;
    p.len = r.text.n;
    *out = p;
    return ST_OK;
}

void st_chat_prompt_cleanup(st_chat_prompt_t *p) {
    st_tok_ids_free(&p->ids);
    free(p->text);
    memset(p, 0, sizeof *p);
}

/* ================================================================ tool calls back */

static const char *find(const char *s, const char *end, const char *what) {
    size_t n = strlen(what);
    for (const char *p = s; p + n <= end; p++)
        if (*p == what[0] && !memcmp(p, what, n)) return p;
    return NULL;
}

/* leading and trailing ASCII whitespace off [*s, *e) */
static void trim(const char **s, const char **e) {
    while (*s < *e && (**s == ' ' || **s == '\n' || **s == '\t' || **s == '\r')) (*s)++;
    while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\n' || (*e)[-1] == '\t' || (*e)[-1] == '\r')) (*e)--;
}

json_t *st_chat_tool_calls(const char *text, size_t len, size_t *content_len) {
    const char *end = text + len, *sec = find(text, end, "<|tool_calls_section_begin|>");
    if (!sec) return NULL;
    const char *p = sec + strlen("<|tool_calls_section_begin|>");
    const char *sec_end = find(p, end, "<|tool_calls_section_end|>");
    if (!sec_end) sec_end = end;
    json_t *calls = json_array();
    if (!calls) return NULL;
    for (;;) {
        const char *b = find(p, sec_end, "<|tool_call_begin|>");
        if (!b) break;
        const char *id = b + strlen("<|tool_call_begin|>");
        const char *a = find(id, sec_end, "<|tool_call_argument_begin|>");
        if (!a) break;
        const char *args = a + strlen("<|tool_call_argument_begin|>");
        const char *ce = find(args, sec_end, "<|tool_call_end|>");
        if (!ce) break;
        const char *id_end = a, *args_end = ce;
        trim(&id, &id_end);
        trim(&args, &args_end);
        /* "functions.NAME:IDX" (K2's ids); a bare "NAME:IDX" or "NAME" is read the same way */
        const char *nm = id, *nm_end = id_end;
        const char *dot = memchr(nm, '.', (size_t)(nm_end - nm));
        if (dot) nm = dot + 1;
        const char *colon = nm;
        while (colon < nm_end && *colon != ':') colon++;
        nm_end = colon;
        json_t *name = json_stringn(nm, (size_t)(nm_end - nm)), *jid = json_stringn(id, (size_t)(id_end - id)),
               *jargs = json_stringn(args, (size_t)(args_end - args));
        json_t *call = name && jid && jargs
                           ? json_pack("{s:o, s:s, s:{s:o, s:o}}", "id", jid, "type", "function", "function", "name",
                                       name, "arguments", jargs)
                           : NULL;
        if (!call) { /* not valid UTF-8 (json_stringn refuses it) or no memory: not a call */
            json_decref(name);
            json_decref(jid);
            json_decref(jargs);
        } else {
            json_array_append_new(calls, call);
        }
        p = ce + strlen("<|tool_call_end|>");
    }
    if (json_array_size(calls) == 0) {
        json_decref(calls);
        return NULL;
    }
    *content_len = (size_t)(sec - text);
    return calls;
}
