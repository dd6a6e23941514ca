/* strata-attn: attention worker — embeddings, KDA/MLA + AttnRes stacks, routers and shared experts;
 * routed tokens go to the expert servers over UCX. */
#include <stdio.h>
#include <stdlib.h>

#include "worker.h"

static void usage(void) {
    fprintf(stderr, "usage: strata-attn --coordinator HOST:PORT --ckpt DIR [--listen HOST:PORT] [--name NAME]\n"
                    "                   [--max-seqs N] [--max-batch-tokens N] [--max-ctx N] [--routing topk|quantile]\n"
                    "                   [--k-max N] [--micro-batches 1|2] [--min-mb-tokens N] [--expert-timeout-ms MS]\n"
                    "                   [--device cpu|cuda:N]\n"
                    "       " ST_SEC_USAGE "\n");
}

int main(int argc, char **argv) {
    st_aw_opts_t o = {.routing = ST_ROUTE_TOPK, .device = -1};
    static st_sec_opts_t sec;
    for (int i = 1; i < argc; i++) {
        int k = st_sec_opts_parse(&sec, argc, argv, &i);
        if (k < 0) return 2;
        if (k) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "--coordinator")) o.coordinator = v;
        else if (!strcmp(a, "--ckpt")) o.ckpt = v;
        else if (!strcmp(a, "--listen")) o.listen = v;
        else if (!strcmp(a, "--name")) o.name = v;
        else if (!strcmp(a, "--max-seqs")) o.max_seqs = atoi(v);
        else if (!strcmp(a, "--max-batch-tokens")) o.max_batch_tokens = atoi(v);
        else if (!strcmp(a, "--max-ctx")) o.max_ctx = atoi(v);
        else if (!strcmp(a, "--k-max")) o.k_max = atoi(v);
        else if (!strcmp(a, "--micro-batches")) o.micro_batches = atoi(v);
        else if (!strcmp(a, "--min-mb-tokens")) o.min_mb_tokens = atoi(v);
        else if (!strcmp(a, "--expert-timeout-ms")) o.expert_timeout_ms = (uint32_t)atoi(v);
        else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) o.device = -1;
            else if (!strncmp(v, "cuda:", 5) && v[5] >= '0' && v[5] <= '9') o.device = atoi(v + 5);
            else { usage(); return 2; }
        } else if (!strcmp(a, "--routing")) {
            if (!strcmp(v, "topk")) o.routing = ST_ROUTE_TOPK;
            else if (!strcmp(v, "quantile")) o.routing = ST_ROUTE_QUANTILE;
            else { usage(); return 2; }
        } else { usage(); return 2; }
        i++;
    }
    if (!o.coordinator || !o.ckpt) { usage(); return 2; }
    st_log_set_tag(o.name ? o.name : "attn");
    if (st_sec_opts_finish(&sec, "strata-attn") != ST_OK) return 2;
    o.sec = &sec;
    return st_aw_run(&o);
}
