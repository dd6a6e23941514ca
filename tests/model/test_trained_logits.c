/* The independent check of the engine's math (issue 18 item 3, CPU part): the CPU engine's logits
 * on a trained checkpoint against the PyTorch fp32 forward of tools/train (its own code, written
 * from SPEC.md), stored beside the checkpoint as reference/logits.npy + reference/prompts.json.
 * Every position of every prompt must agree to max|Δ| ≤ 1e-4 · max|logit| of that position's
 * reference row (SPEC §8's CPU-vs-reference rule), with no NaN/Inf.
 * usage: test_trained_logits CKPT_DIR */
#include <jansson.h>
#include <math.h>
#include <stdint.h>

#include "harness.h"
#include "strata/engine.h"

#define TOL 1e-4

/* A float32 C-order 2-D .npy (version 1 or 2): rows × cols, data malloc'd. */
static float *read_npy(const char *path, int *rows, int *cols) {
    char *buf = NULL;
    size_t len = 0;
    if (st_file_read_all(path, &buf, &len) != ST_OK || len < 12 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        free(buf);
        return NULL;
    }
    size_t hl = buf[6] == 1 ? (size_t)(uint8_t)buf[8] | (size_t)(uint8_t)buf[9] << 8
                            : (size_t)(uint8_t)buf[8] | (size_t)(uint8_t)buf[9] << 8 | (size_t)(uint8_t)buf[10] << 16;
    size_t off = (buf[6] == 1 ? 10 : 12) + hl;
    const char *h = buf + (buf[6] == 1 ? 10 : 12);
    const char *sh = strstr(h, "'shape': (");
    if (off > len || !strstr(h, "'descr': '<f4'") || !strstr(h, "'fortran_order': False") || !sh ||
        sscanf(sh, "'shape': (%d, %d)", rows, cols) != 2 || *rows <= 0 || *cols <= 0 ||
        len - off != (size_t)*rows * (size_t)*cols * 4) {
        free(buf);
        return NULL;
    }
    float *out = malloc((size_t)*rows * (size_t)*cols * sizeof(float));
    if (out) memcpy(out, buf + off, (size_t)*rows * (size_t)*cols * 4);
    free(buf);
    return out;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CKPT_DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    char path[4096];
    snprintf(path, sizeof path, "%s/reference/logits.npy", dir);
    int rows = 0, cols = 0;
    float *ref = read_npy(path, &rows, &cols);
    CHECK(ref != NULL, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/reference/prompts.json", dir);
    json_error_t jerr;
    json_t *meta = json_load_file(path, 0, &jerr);
    CHECK(meta != NULL, "cannot read %s: %s", path, jerr.text);
    st_ckpt_t *ck = NULL;
    st_status_t s = st_ckpt_open(&ck, dir);
    CHECK(s == ST_OK, "st_ckpt_open(%s): %s", dir, st_err_last());
    if (!ref || !meta || s != ST_OK) return st_test_done();
    const st_config_t *c = st_ckpt_config(ck);
    CHECK(cols == c->vocab, "reference rows have %d logits, the checkpoint's vocabulary is %d", cols, c->vocab);
    json_t *prompts = json_object_get(meta, "prompts");
    size_t np = json_array_size(prompts), total = 0, longest = 0;
    for (size_t i = 0; i < np; i++) {
        size_t n = json_array_size(json_object_get(json_array_get(prompts, i), "ids"));
        total += n;
        longest = n > longest ? n : longest;
    }
    CHECK(np >= 3 && (int)total == rows, "%zu prompts with %zu positions; logits.npy has %d rows", np, total, rows);
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = 1;
    eo.max_ctx = (int)longest;
    eo.max_batch_tokens = (int)longest;
    st_engine_t *e = NULL;
    s = st_engine_create(&e, ck, &eo);
    CHECK(s == ST_OK, "st_engine_create: %s", st_err_last());
    float *lg = malloc(longest * (size_t)c->vocab * sizeof(float));
    int *toks = malloc(longest * sizeof(int));
    const float *r = ref;
    double worst = 0;
    for (size_t i = 0; e && cols == c->vocab && (int)total == rows && i < np; i++) {
        json_t *p = json_array_get(prompts, i), *jids = json_object_get(p, "ids");
        int n = (int)json_array_size(jids);
        for (int t = 0; t < n; t++) toks[t] = (int)json_integer_value(json_array_get(jids, (size_t)t));
        int slot = -1;
        CHECK(st_engine_seq_open(e, &slot) == ST_OK, "seq_open");
        st_seq_chunk_t ch = {.slot = slot, .n_tokens = n, .tokens = toks, .all_logits = true};
        CHECK(st_engine_step(e, &ch, 1, lg) == ST_OK, "step: %s", st_err_last());
        st_engine_seq_close(e, slot);
        int bad = 0, nonfinite = 0, worst_pos = 0;
        double wrel = 0;
        for (int t = 0; t < n; t++, r += c->vocab) {
            const float *a = lg + (size_t)t * c->vocab;
            double mx = 0, md = 0;
            for (int v = 0; v < c->vocab; v++) {
                if (!isfinite(a[v])) nonfinite++;
                mx = fmax(mx, fabs((double)r[v]));
                md = fmax(md, fabs((double)a[v] - (double)r[v]));
            }
            double rel = md / mx;
            if (rel > wrel) wrel = rel, worst_pos = t;
            bad += !(rel <= TOL);
        }
        worst = fmax(worst, wrel);
        printf("%s prompt %zu (%d positions, routing margin %.1e): worst max|d|/max|logit| %.2e at position %d\n",
               bad || nonfinite ? "FAIL" : "ok  ", i, n,
               json_real_value(json_object_get(p, "routing_margin")), wrel, worst_pos);
        CHECK(bad == 0 && nonfinite == 0, "prompt %zu: %d positions over %.0e, %d non-finite logits", i, bad, TOL,
              nonfinite);
    }
    printf("worst over all prompts: %.2e (tolerance %.0e)\n", worst, TOL);
    free(toks);
    free(lg);
    st_engine_destroy(e);
    st_ckpt_close(ck);
    json_decref(meta);
    free(ref);
    return st_test_done();
}
