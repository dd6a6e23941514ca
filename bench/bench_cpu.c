/* CPU benchmark: prefill and decode tokens/s of the one-process engine on the tiny and small
 * presets, next to the BLAS SGEMM GFLOP/s measured in the same run, so the fraction of the CPU's
 * ceiling is visible. Usage: bench_cpu [--presets tiny,small] [--dir DIR] [--prompt N] [--decode N]
 * [--batch B]. Checkpoints are created under DIR (default build/bench-ckpt) when missing. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "strata/engine.h"

static double sgemm_gflops(int n) {
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = st_time_sec();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double g = 2.0 * n * n * (double)n / (st_time_sec() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(a); free(b); free(c);
    return best;
}

static void bench_preset(const char *preset, const char *dir, int n_prompt, int n_decode, int batch, double peak) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, preset);
    char cfgp[1100];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", path);
    struct stat st;
    if (stat(cfgp, &st) != 0) {
        st_ckpt_init_opts_t o = {.preset = preset, .out_dir = path, .seed = 1, .dtype = ST_DT_BF16};
        fprintf(stderr, "creating %s checkpoint in %s ...\n", preset, path);
        if (st_ckpt_init(&o) != ST_OK) { fprintf(stderr, "init failed: %s\n", st_err_last()); return; }
    }
    st_ckpt_t *ck;
    if (st_ckpt_open(&ck, path) != ST_OK) { fprintf(stderr, "%s\n", st_err_last()); return; }
    const st_config_t *c = st_ckpt_config(ck);
    st_ckpt_sizes_t z;
    st_ckpt_sizes(ck, &z);
    /* matmul FLOPs per token: 2 × active parameters, less the embedding lookup */
    double flops_tok = 2.0 * ((double)z.params_active - (double)c->vocab * c->d);
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = batch;
    eo.max_ctx = n_prompt + n_decode + 1;
    eo.max_batch_tokens = n_prompt * batch;
    st_engine_t *e;
    if (st_engine_create(&e, ck, &eo) != ST_OK) { fprintf(stderr, "%s\n", st_err_last()); st_ckpt_close(ck); return; }
    int V = c->vocab;
    float *logits = malloc(sizeof(float) * (size_t)batch * V);
    int *toks = malloc(sizeof(int) * (size_t)n_prompt * batch);
    for (int i = 0; i < n_prompt * batch; i++) toks[i] = (i * 2654435761u) % (unsigned)V;
    st_seq_chunk_t *ch = calloc((size_t)batch, sizeof *ch);
    int *slot = calloc((size_t)batch, sizeof(int));
    for (int i = 0; i < batch; i++) {
        st_engine_seq_open(e, &slot[i]);
        ch[i] = (st_seq_chunk_t){.slot = slot[i], .n_tokens = n_prompt, .tokens = toks + (size_t)i * n_prompt};
    }
    double t0 = st_time_sec();
    st_engine_step(e, ch, batch, logits);
    double tp = st_time_sec() - t0;
    int *next = calloc((size_t)batch, sizeof(int));
    t0 = st_time_sec();
    for (int s = 0; s < n_decode; s++) {
        for (int i = 0; i < batch; i++) {
            next[i] = (s * 31 + i) % V;
            ch[i] = (st_seq_chunk_t){.slot = slot[i], .n_tokens = 1, .tokens = &next[i]};
        }
        st_engine_step(e, ch, batch, logits);
    }
    double td = st_time_sec() - t0;
    double ptps = n_prompt * batch / tp, dtps = n_decode * batch / td;
    printf("%-8s prefill %5d tok x %d: %9.1f tok/s = %7.2f GFLOP/s (%5.1f%% of SGEMM)   "
           "decode batch %d: %8.1f tok/s = %7.2f GFLOP/s (%5.1f%%)\n",
           preset, n_prompt, batch, ptps, ptps * flops_tok / 1e9, 100 * ptps * flops_tok / 1e9 / peak, batch, dtps,
           dtps * flops_tok / 1e9, 100 * dtps * flops_tok / 1e9 / peak);
    free(next); free(slot); free(ch); free(toks); free(logits);
    st_engine_destroy(e);
    st_ckpt_close(ck);
}

int main(int argc, char **argv) {
    const char *presets = "tiny,small", *dir = "build/bench-ckpt";
    int n_prompt = 256, n_decode = 16, batch = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--presets")) presets = argv[i + 1];
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt")) n_prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode")) n_decode = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
    }
    mkdir(dir, 0755);
    st_log_set_level(ST_LOG_WARN);
    double peak = sgemm_gflops(1024);
    printf("OpenBLAS SGEMM 1024^3 (%s): %.1f GFLOP/s — the CPU ceiling for the ratios below\n", openblas_get_config(), peak);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", presets);
    char *save = NULL;
    for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
        bench_preset(p, dir, n_prompt, n_decode, batch, peak);
    return 0;
}
