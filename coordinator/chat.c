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
    if (b->oom || !n) return; /* NOTE: s may be NULL when n is 0 (an empty content array) */
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

static int key_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* compact: separators (",", ":") instead of (", ", ": "); sorted: keys in code-point order (UTF-8
 * byte order is code-point order), as K3's deep_sort_dict leaves them. */
static void py_json_fmt(sbuf_t *b, const json_t *v, int compact, int sorted) {
    char t[32];
    const char *comma = compact ? "," : ", ", *colon = compact ? ":" : ": ";
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        sb_put(b, "{", 1);
        size_t n = json_object_size(v), i = 0;
        const char **keys = n ? malloc(n * sizeof *keys) : NULL;
        if (n && !keys) {
            b->oom = 1;
            return;
        }
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) keys[i++] = k;
        if (sorted && n > 1) qsort(keys, n, sizeof *keys, key_cmp);
        for (i = 0; i < n; i++) {
            if (i) sb_str(b, comma);
            py_string(b, keys[i], strlen(keys[i]));
            sb_str(b, colon);
            py_json_fmt(b, json_object_get(v, keys[i]), compact, sorted);
        }
        free(keys);
        sb_put(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        sb_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_str(b, comma);
            py_json_fmt(b, json_array_get(v, i), compact, sorted);
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

static void py_json(sbuf_t *b, const json_t *v) { py_json_fmt(b, v, 0, 0); }

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

/* The end of a rendering: the last run encoded, then p (its ids and text) handed to out, or freed on error. */
static st_status_t render_done(render_t *r, st_status_t s, st_chat_prompt_t *p, st_chat_prompt_t *out) {
    flush_run(r);
    if (s == ST_OK) s = r->text.oom ? ST_ERR_NO_MEMORY : r->s;
    if (s != ST_OK) {
        free(r->text.p);
        st_tok_ids_free(&p->ids);
        return s;
    }
    p->text = r->text.p;
    p->len = r->text.n;
    *out = *p;
    return ST_OK;
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

/* The checks both formats make on "messages" and "tools". */
static st_status_t check_messages(const json_t *messages, const json_t *tools, st_openai_err_t *e) {
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
    return ST_OK;
}

st_status_t st_chat_render(const st_tokenizer_t *tk, const json_t *messages, const json_t *tools, st_chat_prompt_t *out,
                           st_openai_err_t *e) {
    st_status_t s = check_messages(messages, tools, e);
    if (s != ST_OK) return s;
    st_chat_prompt_t p = {0};
    render_t r = {.tk = tk, .ids = &p.ids, .s = ST_OK};
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
    return render_done(&r, s, &p, out);
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

/* ================================================================ K3 ("XTML") */

/* Kimi K3 has no Jinja template: its checkpoint renders chat in Python (encoding_k3.py,
 * build_chat_segments; vendored in vLLM as vllm/tokenizers/encoding_k3.py). Everything here follows
 * that file: markup is the specials <|open|> <|close|> <|sep|> <|end_of_msg|>; tag names,
 * attributes and content are text; and every text piece is its own BPE segment (the reference
 * encodes segment by segment, so ' role', '="', 'user' and '"' are four encodes, not one). */

#define K3_EFFORT_NOTE                                                                                              \
    "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), " \
    "supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort="

/* one text segment: encoded on its own, specials read as text */
static void kseg(render_t *r, const char *s, size_t n) {
    if (!n) return;
    textn(r, s, n);
    flush_run(r);
}
static void kstr(render_t *r, const char *s) { kseg(r, s, strlen(s)); }

/* _attr: ' key', '="', the value with & then " escaped, '"' */
static void kattr(render_t *r, const char *key, const char *val, size_t n) {
    char k[64];
    snprintf(k, sizeof k, " %s", key);
    kstr(r, k);
    kstr(r, "=\"");
    sbuf_t v = {0};
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (val[i] != '&' && val[i] != '"') continue;
        sb_put(&v, val + run, i - run);
        sb_str(&v, val[i] == '&' ? "&amp;" : "&quot;");
        run = i + 1;
    }
    sb_put(&v, val + run, n - run);
    if (v.oom) r->s = ST_ERR_NO_MEMORY;
    else kseg(r, v.p ? v.p : "", v.n);
    free(v.p);
    kstr(r, "\"");
}
static void kattr_s(render_t *r, const char *key, const char *val) { kattr(r, key, val, strlen(val)); }
static void kattr_i(render_t *r, const char *key, size_t v) {
    char t[32];
    snprintf(t, sizeof t, "%zu", v);
    kattr_s(r, key, t);
}

static void kopen(render_t *r, const char *tag) {
    marker(r, "<|open|>");
    kstr(r, tag);
}
static void ksep(render_t *r) { marker(r, "<|sep|>"); }
static void kclose(render_t *r, const char *tag) {
    marker(r, "<|close|>");
    kstr(r, tag);
    marker(r, "<|sep|>");
}
static void kend_message(render_t *r) {
    kclose(r, "message");
    marker(r, "<|end_of_msg|>");
}

/* _internal_system_message: a system turn with a type attribute */
static void k3_note(render_t *r, const char *type, const char *body) {
    kopen(r, "message");
    kattr_s(r, "role", "system");
    kattr_s(r, "type", type);
    ksep(r);
    kstr(r, body);
    kend_message(r);
}

static void k3_json(render_t *r, const json_t *v, int compact, int sorted) {
    sbuf_t b = {0};
    py_json_fmt(&b, v, compact, sorted);
    if (b.oom) r->s = ST_ERR_NO_MEMORY;
    else kseg(r, b.p ? b.p : "", b.n);
    free(b.p);
}

/* _render_tool_declare: compact JSON of the key-sorted tools inside a fixed text */
static void k3_tool_declare(render_t *r, const json_t *tools, int dynamic) {
    sbuf_t b = {0};
    sb_str(&b, dynamic ? "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                         "You have access to all existing and extended tools.\n"
                         "Here are the specs for the extended tools.\n\n```json\n"
                       : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n");
    py_json_fmt(&b, tools, 1, 1);
    sb_str(&b, "\n```");
    kopen(r, "message");
    kattr_s(r, "role", "system");
    kattr_s(r, "type", "tool-declare");
    ksep(r);
    if (b.oom) r->s = ST_ERR_NO_MEMORY;
    else kseg(r, b.p, b.n);
    free(b.p);
    kend_message(r);
}

/* Python's str.strip() leaves nothing (ASCII whitespace and the separators \x1c-\x1f, NEL, NBSP) */
static int py_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) continue;
        if (c == 0xc2 && i + 1 < n && ((unsigned char)s[i + 1] == 0x85 || (unsigned char)s[i + 1] == 0xa0)) {
            i++;
            continue;
        }
        return 0;
    }
    return 1;
}

/* _render_content_segments: a string is one segment, each text part of an array its own (content_of
 * has checked the parts) */
static st_status_t k3_content(render_t *r, const json_t *m, size_t i, st_openai_err_t *e) {
    sbuf_t c = {0};
    int present = 0;
    st_status_t s = content_of(m, i, &c, &present, e);
    free(c.p);
    if (s != ST_OK) return s;
    const json_t *v = json_object_get(m, "content");
    if (json_is_string(v)) kseg(r, json_string_value(v), json_string_length(v));
    for (size_t k = 0; json_is_array(v) && k < json_array_size(v); k++) {
        const json_t *t = json_object_get(json_array_get(v, k), "text");
        kseg(r, json_string_value(t), json_string_length(t));
    }
    return ST_OK;
}

static const char *xtml_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    case JSON_INTEGER:
    case JSON_REAL: return "number";
    case JSON_STRING: return "string";
    case JSON_OBJECT: return "object";
    default: return "array";
    }
}

/* A message's non-empty string "name", or NULL; a non-string name is refused. */
static st_status_t k3_name(const json_t *m, size_t i, const char *key, const char **out, st_openai_err_t *e) {
    const json_t *n = json_object_get(m, key);
    *out = NULL;
    if (!n || json_is_null(n)) return ST_OK;
    if (!json_is_string(n)) return refuse(e, "messages[%zu].%s must be a string", i, key);
    if (json_string_length(n)) *out = json_string_value(n);
    return ST_OK;
}

static st_status_t k3_assistant(render_t *r, const json_t *m, size_t i, const st_chat_k3_opts_t *o,
                                st_openai_err_t *e) {
    st_status_t s = ST_OK;
    if (o->thinking) {
        /* reasoning_content or reasoning (the first that is non-empty), blank renders nothing */
        const json_t *rc = json_object_get(m, "reasoning_content"), *r2 = json_object_get(m, "reasoning");
        if ((rc && !json_is_null(rc) && !json_is_string(rc)) || (r2 && !json_is_null(r2) && !json_is_string(r2)))
            return refuse(e, "messages[%zu].reasoning_content and .reasoning must be strings", i);
        if (!json_is_string(rc) || !json_string_length(rc)) rc = r2;
        kopen(r, "think");
        ksep(r);
        if (json_is_string(rc) && !py_blank(json_string_value(rc), json_string_length(rc)))
            kseg(r, json_string_value(rc), json_string_length(rc));
        kclose(r, "think");
    }
    kopen(r, "response");
    ksep(r);
    if ((s = k3_content(r, m, i, e)) != ST_OK) return s;
    kclose(r, "response");
    const json_t *calls = json_object_get(m, "tool_calls");
    if (calls && !json_is_null(calls) && !json_is_array(calls))
        return refuse(e, "messages[%zu].tool_calls must be an array", i);
    if (json_array_size(calls) == 0) return ST_OK;
    kopen(r, "tools");
    ksep(r);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *tc = json_array_get(calls, k), *fn = json_object_get(tc, "function");
        if (!fn) fn = tc;
        const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(tc) || !json_is_object(fn) || !json_is_string(name) || !json_string_length(name)) {
            return refuse(e, "messages[%zu].tool_calls[%zu] needs a non-empty function name", i, k);
        }
        /* normalize_tool_arguments: null or blank → {}; a JSON object (or its text) → typed
         * arguments; text that is not JSON → a raw json block; other JSON → refused */
        json_t *parsed = NULL;
        const json_t *obj = NULL;
        const char *raw = NULL;
        size_t raw_n = 0;
        if (json_is_object(args)) {
            obj = args;
        } else if (json_is_string(args) && !py_blank(json_string_value(args), json_string_length(args))) {
            parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                NULL);
            if (!parsed) {
                raw = json_string_value(args);
                raw_n = json_string_length(args);
            } else if (!json_is_object(parsed)) {
                json_decref(parsed);
                return refuse(e, "messages[%zu].tool_calls[%zu].function.arguments must be a JSON object", i, k);
            } else {
                obj = parsed;
            }
        } else if (args && !json_is_null(args) && !json_is_string(args)) {
            return refuse(e, "messages[%zu].tool_calls[%zu].function.arguments must be a JSON object or its text", i,
                          k);
        }
        kopen(r, "call");
        kattr(r, "tool", json_string_value(name), json_string_length(name));
        kattr_i(r, "index", k + 1);
        ksep(r);
        if (raw) {
            kopen(r, "json");
            kattr_s(r, "type", "object");
            ksep(r);
            kseg(r, raw, raw_n);
            kclose(r, "json");
        } else if (obj) {
            const char *key;
            json_t *val;
            json_object_foreach((json_t *)obj, key, val) {
                kopen(r, "argument");
                kattr_s(r, "key", key);
                kattr_s(r, "type", xtml_type(val));
                ksep(r);
                if (json_is_string(val)) kseg(r, json_string_value(val), json_string_length(val));
                else k3_json(r, val, 0, 0);
                kclose(r, "argument");
            }
        }
        json_decref(parsed);
        kclose(r, "call");
    }
    kclose(r, "tools");
    return ST_OK;
}

/* normalize_xtml_tool_result_messages: each run of tool messages is put in the order of the
 * preceding assistant's tool_calls (matched by tool_call_id) and named after the matched call;
 * a run with any unmatched message stays as it is. order[i] is the message rendered i-th,
 * names[i] its tool name from the match (NULL: its own). */
static void k3_tool_order(const json_t *msgs, size_t *order, const char **names, size_t *pos_all) {
    size_t n = json_array_size(msgs);
    const json_t *calls = NULL;
    for (size_t i = 0; i < n;) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        order[i] = i;
        names[i] = NULL;
        if (!strcmp(role, "assistant")) calls = json_object_get(m, "tool_calls");
        if (strcmp(role, "tool") != 0) {
            i++;
            continue;
        }
        size_t j = i, unresolved = 0;
        while (j < n && !strcmp(json_string_value(json_object_get(json_array_get(msgs, j), "role")), "tool")) j++;
        size_t *pos = pos_all + i;
        for (size_t t = i; t < j; t++) {
            const json_t *tm = json_array_get(msgs, t), *id = json_object_get(tm, "tool_call_id");
            if (!json_object_get(tm, "tool_call_id")) id = json_object_get(tm, "id");
            pos[t - i] = 0;
            for (size_t k = 0; json_is_string(id) && k < json_array_size(calls) && !pos[t - i]; k++) {
                const json_t *cid = json_object_get(json_array_get(calls, k), "id");
                if (json_is_string(cid) && !strcmp(json_string_value(cid), json_string_value(id))) pos[t - i] = k + 1;
            }
            unresolved += !pos[t - i];
        }
        for (size_t t = i; t < j; t++) order[t] = t;
        if (!unresolved) { /* stable insertion sort by the matched position */
            for (size_t a = i + 1; a < j; a++)
                for (size_t b = a; b > i && pos[b - i] < pos[b - 1 - i]; b--) {
                    size_t tp = pos[b - i], to = order[b];
                    pos[b - i] = pos[b - 1 - i];
                    order[b] = order[b - 1];
                    pos[b - 1 - i] = tp;
                    order[b - 1] = to;
                }
            for (size_t t = i; t < j; t++) {
                const json_t *tc = json_array_get(calls, pos[t - i] - 1), *fn = json_object_get(tc, "function");
                names[t] = json_string_value(json_object_get(json_is_object(fn) ? fn : tc, "name"));
            }
        } else {
            for (size_t t = i; t < j; t++) names[t] = NULL;
        }
        i = j;
    }
}

st_status_t st_chat_render_k3(const st_tokenizer_t *tk, const json_t *messages, const json_t *tools,
                              const st_chat_k3_opts_t *o, st_chat_prompt_t *out, st_openai_err_t *e) {
    st_status_t s = check_messages(messages, tools, e);
    if (s != ST_OK) return s;
    const char *effort = o->effort ? o->effort : "max";
    if (o->thinking && strcmp(effort, "low") && strcmp(effort, "high") && strcmp(effort, "max")) {
        e->param = "reasoning_effort";
        snprintf(e->message, sizeof e->message, "reasoning_effort '%.40s': this model supports low, high, max and none",
                 effort);
        return ST_ERR_INVALID_ARG;
    }
    size_t n = json_array_size(messages);
    size_t *order = malloc(n * sizeof *order), *pos = malloc(n * sizeof *pos);
    const char **names = malloc(n * sizeof *names);
    if (!order || !names || !pos) {
        free(order);
        free(names);
        free(pos);
        return ST_ERR_NO_MEMORY;
    }
    k3_tool_order(messages, order, names, pos);
    free(pos);
    st_chat_prompt_t p = {0};
    render_t r = {.tk = tk, .ids = &p.ids, .s = ST_OK};
    if (json_array_size(tools) > 0) k3_tool_declare(&r, tools, 0);
    if (o->thinking) {
        char note[sizeof K3_EFFORT_NOTE + 16];
        snprintf(note, sizeof note, "%s%s`.", K3_EFFORT_NOTE, effort);
        k3_note(&r, "thinking-effort", note);
    }
    const json_t *calls = NULL;
    size_t tool_index = 0;
    for (size_t q = 0; q < n && s == ST_OK && r.s == ST_OK; q++) {
        size_t i = order[q];
        const json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role")), *name = NULL;
        if (!strcmp(role, "tool")) {
            /* the tool's name: the matched call's, the message's "tool" or "name", or the
             * assistant's call at this position */
            const json_t *own = json_object_get(m, "tool");
            if (!own) own = json_object_get(m, "name");
            if (own && !json_is_null(own) && !json_is_string(own)) {
                s = refuse(e, "messages[%zu].name must be a string", i);
                break;
            }
            const char *tname = names[q] ? names[q] : json_string_value(own);
            tool_index++;
            if (!tname && tool_index <= json_array_size(calls)) {
                const json_t *tc = json_array_get(calls, tool_index - 1), *fn = json_object_get(tc, "function");
                tname = json_string_value(json_object_get(json_is_object(fn) ? fn : tc, "name"));
            }
            if (!tname) {
                s = refuse(e, "messages[%zu]: a tool message needs \"name\" or a tool_call_id of the assistant's calls",
                           i);
                break;
            }
            kopen(&r, "message");
            kattr_s(&r, "role", "tool");
            kattr_s(&r, "tool", tname);
            kattr_i(&r, "index", tool_index);
            ksep(&r);
            if ((s = k3_content(&r, m, i, e)) != ST_OK) break;
            kend_message(&r);
        } else if (!strcmp(role, "assistant")) {
            calls = json_object_get(m, "tool_calls");
            tool_index = 0;
            if ((s = k3_name(m, i, "name", &name, e)) != ST_OK) break;
            kopen(&r, "message");
            kattr_s(&r, "role", "assistant");
            if (name) kattr_s(&r, "name", name);
            ksep(&r);
            if ((s = k3_assistant(&r, m, i, o, e)) != ST_OK) break;
            kend_message(&r);
        } else if (!strcmp(role, "system") && json_is_array(json_object_get(m, "tools")) &&
                   json_array_size(json_object_get(m, "tools")) > 0) {
            k3_tool_declare(&r, json_object_get(m, "tools"), 1);
        } else {
            /* user, system, and OpenAI's developer as system (the reference knows no developer
             * role and would drop the message) */
            if ((s = k3_name(m, i, "name", &name, e)) != ST_OK) break;
            kopen(&r, "message");
            kattr_s(&r, "role", !strcmp(role, "user") ? "user" : "system");
            if (name) kattr_s(&r, "name", name);
            ksep(&r);
            if ((s = k3_content(&r, m, i, e)) != ST_OK) break;
            kend_message(&r);
        }
    }
    free(order);
    free(names);
    if (s == ST_OK && o->tool_choice && !strcmp(o->tool_choice, "required"))
        k3_note(&r, "tool-choice", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
    else if (s == ST_OK && o->tool_choice && !strcmp(o->tool_choice, "none"))
        k3_note(&r, "tool-choice",
                "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
    const char *rf = json_string_value(json_object_get(o->response_format, "type"));
    if (s == ST_OK && rf && !strcmp(rf, "json_object")) {
        k3_note(&r, "response-format",
                "The system is invoked with `response_format=json_object`.\nYour response must be raw JSON data "
                "without markdown code blocks (```json) or any additional formatting.");
    } else if (s == ST_OK && rf && !strcmp(rf, "json_schema")) {
        /* extract_response_schema: json_schema.schema, else json_schema.json_schema, else json_schema */
        const json_t *js = json_object_get(o->response_format, "json_schema"), *schema = js;
        if (json_is_object(js)) {
            if (json_object_get(js, "schema")) schema = json_object_get(js, "schema");
            else if (json_object_get(js, "json_schema")) schema = json_object_get(js, "json_schema");
        }
        sbuf_t b = {0};
        sb_str(&b, "The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data "
                   "without markdown code blocks (```json) or any additional formatting.\nThe JSON data must match "
                   "the following schema:\n```json\n");
        if (schema) py_json_fmt(&b, schema, 1, 1);
        else sb_str(&b, "null");
        sb_str(&b, "\n```");
        if (b.oom) r.s = ST_ERR_NO_MEMORY;
        else k3_note(&r, "response-format", b.p);
        free(b.p);
    }
    kopen(&r, "message");
    kattr_s(&r, "role", "assistant");
    ksep(&r);
    kopen(&r, o->thinking ? "think" : "response");
    ksep(&r);
    return render_done(&r, s, &p, out);
}

st_chat_format_t st_chat_format_of_config(const json_t *config, const st_tokenizer_t *tk) {
    int k3 = 0;
    const char *mt = json_string_value(json_object_get(config, "model_type"));
    if (mt && !strcmp(mt, "kimi_k3")) k3 = 1;
    const json_t *arch = json_object_get(config, "architectures");
    for (size_t i = 0; i < json_array_size(arch); i++) {
        const char *a = json_string_value(json_array_get(arch, i));
        if (a && !strncmp(a, "KimiK3", 6)) k3 = 1;
    }
    static const char *const marks[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
    for (size_t i = 0; k3 && tk && i < sizeof marks / sizeof marks[0]; i++)
        if (st_tokenizer_special_id(tk, marks[i]) < 0) k3 = 0;
    return k3 ? ST_CHAT_K3 : ST_CHAT_K2;
}

/* ================================================================ K3 replies back */

#define K3_THINK_END "<|close|>think<|sep|>"
#define K3_RESPONSE_OPEN "<|open|>response<|sep|>"
#define K3_TOOLS_OPEN "<|open|>tools<|sep|>"

static const char *first_of(const char *p, const char *end, const char *const *what, size_t n) {
    const char *best = end;
    for (size_t i = 0; i < n; i++) {
        const char *f = find(p, best, what[i]);
        if (f && f < best) best = f;
    }
    return best;
}

static int starts(const char *p, const char *end, const char *what) {
    size_t n = strlen(what);
    return (size_t)(end - p) >= n && !memcmp(p, what, n);
}

/* An attribute's value in [a, e): the text between key=" and the next ", unescaped (&quot; before
 * &amp;, the reverse of the escaping). NULL when absent or not UTF-8. */
static json_t *attr_value(const char *a, const char *e, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, " %s=\"", key);
    const char *v = find(a, e, pat);
    if (!v) return NULL;
    v += strlen(pat);
    const char *q = memchr(v, '"', (size_t)(e - v));
    if (!q) return NULL;
    sbuf_t b = {0};
    for (const char *p = v; p < q;) {
        if (starts(p, q, "&quot;")) {
            sb_put(&b, "\"", 1);
            p += 6;
        } else if (starts(p, q, "&amp;")) {
            sb_put(&b, "&", 1);
            p += 5;
        } else {
            sb_put(&b, p++, 1);
        }
    }
    json_t *s = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    free(b.p);
    return s;
}

/* One call's body [p, e): its arguments as JSON text (malloc'd), NULL when malformed */
static char *k3_call_args(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\n')) p++;
    if (starts(p, e, "<|open|>json")) {
        const char *s = find(p, e, "<|sep|>"), *c = s ? find(s, e, "<|close|>json<|sep|>") : NULL;
        if (!c) return NULL;
        s += strlen("<|sep|>");
        char *raw = malloc((size_t)(c - s) + 1);
        if (raw) {
            memcpy(raw, s, (size_t)(c - s));
            raw[c - s] = 0;
        }
        return raw;
    }
    json_t *obj = json_object();
    if (!obj) return NULL;
    while (p < e) {
        const char *o = find(p, e, "<|open|>argument");
        if (!o) break;
        const char *s = find(o, e, "<|sep|>"), *c = s ? find(s, e, "<|close|>argument<|sep|>") : NULL;
        if (!c) break;
        json_t *key = attr_value(o, s, "key"), *type = attr_value(o, s, "type"), *val = NULL;
        const char *v = s + strlen("<|sep|>");
        if (key && type && strcmp(json_string_value(type), "string") != 0)
            val = json_loadb(v, (size_t)(c - v), JSON_DECODE_ANY, NULL);
        if (!val) val = json_stringn(v, (size_t)(c - v)); /* a string, or a value that is not JSON */
        if (key && val) json_object_set_new(obj, json_string_value(key), val);
        else json_decref(val);
        json_decref(key);
        json_decref(type);
        p = c + strlen("<|close|>argument<|sep|>");
    }
    char *js = st_chat_tojson(obj);
    json_decref(obj);
    return js;
}

static json_t *k3_calls(const char *p, const char *end) {
    const char *te = find(p, end, "<|close|>tools<|sep|>");
    if (!te) te = end;
    json_t *calls = json_array();
    while (calls) {
        const char *o = find(p, te, "<|open|>call");
        if (!o) break;
        const char *s = find(o, te, "<|sep|>"), *c = s ? find(s, te, "<|close|>call<|sep|>") : NULL;
        if (!c) break; /* cut short: not a call */
        json_t *name = attr_value(o, s, "tool"), *index = attr_value(o, s, "index");
        char *args = k3_call_args(s + strlen("<|sep|>"), c);
        long idx = index ? strtol(json_string_value(index), NULL, 10) : 0;
        char id[96];
        snprintf(id, sizeof id, "functions.%.64s:%ld", name ? json_string_value(name) : "", idx > 0 ? idx - 1 : 0);
        json_t *jargs = args ? json_string(args) : NULL, *jid = json_string(id);
        json_t *call = name && jargs && jid && json_string_length(name)
                           ? json_pack("{s:o, s:s, s:{s:o, s:o}}", "id", jid, "type", "function", "function", "name",
                                       name, "arguments", jargs)
                           : NULL;
        if (call) json_array_append_new(calls, call);
        else {
            json_decref(name);
            json_decref(jargs);
            json_decref(jid);
        }
        json_decref(index);
        free(args);
        p = c + strlen("<|close|>call<|sep|>");
    }
    if (json_array_size(calls) == 0) {
        json_decref(calls);
        return NULL;
    }
    return calls;
}

/* The channels of a reply (st_chat_k3_reply without the calls); returns where the content ended */
static const char *k3_split(const char *text, size_t len, int thinking, st_chat_k3_reply_t *out) {
    const char *p = text, *end = text + len;
    memset(out, 0, sizeof *out);
    if (thinking) {
        const char *t = find(p, end, K3_THINK_END);
        out->reasoning_len = (size_t)((t ? t : end) - p);
        if (!t) {
            out->content_off = len;
            return end;
        }
        p = t + strlen(K3_THINK_END);
        if (starts(p, end, K3_RESPONSE_OPEN)) p += strlen(K3_RESPONSE_OPEN);
    }
    static const char *const stops[] = {"<|close|>response<|sep|>", K3_TOOLS_OPEN, "<|close|>message<|sep|>"};
    const char *ce = first_of(p, end, stops, 3);
    out->content_off = (size_t)(p - text);
    out->content_len = (size_t)(ce - p);
    return ce;
}

void st_chat_k3_reply(const char *text, size_t len, int thinking, st_chat_k3_reply_t *out) {
    const char *end = text + len, *ce = k3_split(text, len, thinking, out);
    const char *tools = find(ce, end, K3_TOOLS_OPEN);
    if (tools) out->tool_calls = k3_calls(tools + strlen(K3_TOOLS_OPEN), end);
}

void st_chat_k3_stream(const char *text, size_t len, int thinking, int final, size_t sent, size_t *r_off,
                       size_t *r_len, size_t *c_off, size_t *c_len) {
    static const char *const marks[] = {K3_THINK_END, K3_RESPONSE_OPEN, K3_TOOLS_OPEN, "<|close|>response<|sep|>",
                                        "<|close|>message<|sep|>"};
    size_t end = len;
    for (size_t w = 0; !final && w < sizeof marks / sizeof marks[0]; w++) { /* the longest tail that begins a marker */
        size_t wn = strlen(marks[w]);
        for (size_t k = wn - 1 < len ? wn - 1 : len; k > 0; k--)
            if (!memcmp(text + len - k, marks[w], k)) {
                if (len - k < end) end = len - k;
                break;
            }
    }
    st_chat_k3_reply_t rp;
    k3_split(text, end, thinking, &rp);
    size_t re = rp.reasoning_off + rp.reasoning_len, ce = rp.content_off + rp.content_len;
    *r_off = sent > rp.reasoning_off ? sent : rp.reasoning_off;
    *r_len = re > *r_off ? re - *r_off : 0;
    *c_off = sent > rp.content_off ? sent : rp.content_off;
    *c_len = ce > *c_off ? ce - *c_off : 0;
}
