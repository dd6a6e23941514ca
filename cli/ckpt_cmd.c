/* `strata ckpt init|inspect` */
#include <stdlib.h>

#include "cli.h"
#include "strata/model.h"

static int cmd_init(int argc, char **argv) {
    st_ckpt_init_opts_t o = {.seed = 1, .dtype = ST_DT_BF16};
    int mx = -1;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--preset"))) o.preset = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--out"))) o.out_dir = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--seed"))) o.seed = strtoull(v, NULL, 10);
        else if ((v = st_cli_opt(argc, argv, &i, "--skew-router"))) o.skew_router = strtof(v, NULL);
        else if ((v = st_cli_opt(argc, argv, &i, "--dtype"))) {
            if (!strcmp(v, "bf16")) o.dtype = ST_DT_BF16;
            else if (!strcmp(v, "f32")) o.dtype = ST_DT_F32;
            else { fprintf(stderr, "strata ckpt init: --dtype must be bf16 or f32\n"); return 2; }
        } else if (!strcmp(argv[i], "--mxfp4")) mx = 1;
        else if (!strcmp(argv[i], "--no-mxfp4")) mx = 0;
        else { fprintf(stderr, "strata ckpt init: unknown option %s\n", argv[i]); return 2; }
    }
    if (!o.preset || !o.out_dir) {
        fprintf(stderr, "strata ckpt init: --preset and --out are required\n");
        return 2;
    }
    o.mxfp4_experts = mx >= 0 ? mx == 1 : !strcmp(o.preset, "k3-mini");
    double t0 = st_time_sec();
    st_status_t s = st_ckpt_init(&o);
    if (s != ST_OK) {
        fprintf(stderr, "strata ckpt init: %s\n", st_err_last());
        return 1;
    }
    printf("wrote %s checkpoint to %s in %.1f s\n", o.preset, o.out_dir, st_time_sec() - t0);
    return 0;
}

static void human(char *buf, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) { bytes /= 1024; i++; }
    snprintf(buf, n, "%.2f %s", bytes, u[i]);
}

static int cmd_inspect(int argc, char **argv) {
    if (argc != 1) {
        fprintf(stderr, "usage: strata ckpt inspect DIR\n");
        return 2;
    }
    st_ckpt_t *ck;
    if (st_ckpt_open(&ck, argv[0]) != ST_OK) {
        fprintf(stderr, "strata ckpt inspect: %s\n", st_err_last());
        return 1;
    }
    const st_config_t *c = st_ckpt_config(ck);
    int n_mla = 0;
    for (int l = 0; l < c->n_layers; l++) n_mla += c->is_mla[l];
    printf("checkpoint   %s\n", argv[0]);
    printf("trunk        d=%d layers=%d (KDA %d, MLA %d) vocab=%d tie_embeddings=%s eps=%g\n", c->d, c->n_layers,
           c->n_layers - n_mla, n_mla, c->vocab, c->tie_embeddings ? "yes" : "no", c->rms_eps);
    printf("KDA          %d heads x %d, conv %d, gate %s%g, %s output gate\n", c->kda_heads, c->kda_head_dim,
           c->conv_k, c->gate_bounded ? "lower bound " : "unbounded softplus", c->gate_bounded ? c->gate_lower_bound : 0.0,
           c->full_rank_gate ? "full-rank" : "low-rank");
    printf("MLA          %d heads, q_lora %d, kv_lora %d, nope %d, rope %d, v %d, output gate %s\n", c->mla_heads,
           c->q_lora_rank, c->kv_lora_rank, c->qk_nope, c->qk_rope, c->v_head_dim, c->mla_output_gate ? "yes" : "no");
    printf("AttnRes      %s", c->attn_res_block > 0 ? "" : "none (plain residuals)\n");
    if (c->attn_res_block > 0) printf("block %d\n", c->attn_res_block);
    printf("FFN          dense layers < %d width %d, act %s\n", c->first_k_dense, c->intermediate,
           c->act == ST_ACT_SITU ? "SiTU-GLU" : "SwiGLU");
    printf("MoE          %d experts top-%d, %d shared x %d, latent %d%s, experts %s\n", c->n_experts, c->top_k,
           c->n_shared, c->moe_inter, c->latent, c->latent_norm ? " (normed)" : "", c->experts_mxfp4 ? "MXFP4" : "dense");
    st_ckpt_sizes_t z;
    if (st_ckpt_sizes(ck, &z) == ST_OK) {
        char a[32], b[32], e[32];
        human(a, sizeof a, (double)z.bytes_attention_worker);
        human(b, sizeof b, (double)z.bytes_routed_experts);
        human(e, sizeof e, (double)z.bytes_per_expert_layer);
        printf("parameters   %.3f B total, %.3f B active per token\n", z.params_total / 1e9, z.params_active / 1e9);
        printf("bytes        attention worker %s; routed experts %s in all (%s per expert per layer)\n", a, b, e);
        int n_moe = 0;
        for (int l = 0; l < c->n_layers; l++) n_moe += st_config_is_moe_layer(c, l);
        int shards[] = {1, 2, 4, 8};
        for (size_t i = 0; i < sizeof shards / sizeof shards[0]; i++) {
            if (shards[i] > c->n_experts) break;
            int per = (c->n_experts + shards[i] - 1) / shards[i];
            human(e, sizeof e, (double)z.bytes_per_expert_layer * per * n_moe);
            printf("expert shard %d-way: up to %d experts per layer per shard, %s each\n", shards[i], per, e);
        }
    }
    st_ckpt_close(ck);
    return 0;
}

int st_cmd_ckpt(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "init")) return cmd_init(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "inspect")) return cmd_inspect(argc - 1, argv + 1);
    fprintf(stderr, "usage: strata ckpt init|inspect ...\n");
    return 2;
}
