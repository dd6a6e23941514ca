/* strata-attn: attention worker — embeddings, KDA/MLA + AttnRes stacks, routers and shared experts;
 * routed tokens go to the expert servers over UCX. */
#include <stdio.h>
#include <stdlib.h>

#include "strata/member.h"
#include "worker.h"

static void usage_to(FILE *out) {
    fprintf(out,
            "usage: strata-attn --coordinator HOST:PORT[,HOST:PORT...] [--coordinator-file F] --ckpt DIR [--listen HOST:PORT] [--name NAME]\n"
            "                   [--max-seqs N] [--max-batch-tokens N] [--max-ctx N] [--routing topk|quantile]\n"
            "                   [--k-max N] [--micro-batches 1..4] [--min-mb-tokens N] [--expert-timeout-ms MS]\n"
            "                   [--device cpu|cuda:N] [--drain-timeout-s S]\n"
            "       " ST_SEC_USAGE "\n"
            "  HOST may be a name (localhost) or an address. --help, --version.\n");
}
static void usage(void) { usage_to(stderr); }

/* A whole decimal number in lo..hi, else -1 (after saying why). */
static long num(const char *flag, const char *v, long lo, long hi) {
    long x;
    return st_parse_long(flag, v, lo, hi, &x) != 0 ? -1 : x;
}

int main(int argc, char **argv) {
    st_aw_opts_t o = {.routing = ST_ROUTE_TOPK, .device = -1, .drain_timeout_s = 30};
    static st_member_flags_t mf;
    if (st_help_version(argc, argv, "strata-attn", usage_to)) return 0; /* they win over everything */
    for (int i = 1; i < argc; i++) {
        int k = st_member_flags_parse(&mf, argc, argv, &i);
        if (k < 0) return 2;
        if (k) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "--listen")) o.listen = v;
        else if (!strcmp(a, "--max-seqs")) {
            if ((o.max_seqs = (int)num(a, v, 0, 1 << 16)) < 0) return 2;
        } else if (!strcmp(a, "--max-batch-tokens")) {
            if ((o.max_batch_tokens = (int)num(a, v, 0, 1 << 20)) < 0) return 2;
        } else if (!strcmp(a, "--max-ctx")) {
            if ((o.max_ctx = (int)num(a, v, 0, 1 << 24)) < 0) return 2;
        } else if (!strcmp(a, "--k-max")) {
            if ((o.k_max = (int)num(a, v, 0, 4096)) < 0) return 2;
        } else if (!strcmp(a, "--micro-batches")) {
            if ((o.micro_batches = (int)num(a, v, 0, 64)) < 0) return 2;
        } else if (!strcmp(a, "--min-mb-tokens")) {
            if ((o.min_mb_tokens = (int)num(a, v, 0, 1 << 20)) < 0) return 2;
        } else if (!strcmp(a, "--expert-timeout-ms")) {
            long t = num(a, v, 0, 3600 * 1000);
            if (t < 0) return 2;
            o.expert_timeout_ms = (uint32_t)t;
        } else if (!strcmp(a, "--drain-timeout-s")) {
            if ((o.drain_timeout_s = (int)num(a, v, 0, 86400)) < 0) return 2;
        } else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) o.device = -1;
            else if (!strncmp(v, "cuda:", 5) && v[5] >= '0' && v[5] <= '9') {
                if ((o.device = (int)num(a, v + 5, 0, 1023)) < 0) return 2;
            } else {
                usage();
                return 2;
            }
        } else if (!strcmp(a, "--routing")) {
            if (!strcmp(v, "topk")) o.routing = ST_ROUTE_TOPK;
            else if (!strcmp(v, "quantile")) o.routing = ST_ROUTE_QUANTILE;
            else { usage(); return 2; }
        } else {
            usage();
            return 2;
        }
        i++;
    }
    if (!mf.coordinator || !mf.ckpt) { usage(); return 2; }
    o.coordinator = mf.coordinator, o.coordinator_file = mf.coordinator_file, o.ckpt = mf.ckpt, o.name = mf.name;
    st_log_set_tag(o.name ? o.name : "attn");
    st_fd_limit_raise();
    if (st_sec_opts_finish(&mf.sec, "strata-attn") != ST_OK) return 2;
    if (mf.sec.tls && !mf.sec.tls_cert) { /* the coordinator reaches a TLS cluster's workers over TLS */
        fprintf(
            stderr,
            "strata-attn: --tls needs --tls-cert and --tls-key: the coordinator calls this worker's port over TLS\n");
        return 2;
    }
    o.sec = &mf.sec;
    return st_aw_run(&o);
}
