/* strata-expert: holds latent experts and runs them on batches that arrive over UCX. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "strata/member.h"
#include "server.h"

static void usage_to(FILE *out) {
    fprintf(out, "usage: strata-expert --coordinator HOST:PORT[,HOST:PORT...] [--coordinator-file F] --ckpt DIR [--listen HOST:PORT] [--name NAME]\n"
                    "                     [--max-rows N] [--slots N] [--device cpu|cuda:N]\n"
                    "       " ST_SEC_USAGE "\n"
            "  HOST may be a name (localhost) or an address. --help, --version.\n");
}
static void usage(void) { usage_to(stderr); }

static int int_arg(const char *flag, const char *v, long lo, long hi, int *out) {
    long x;
    if (st_parse_long(flag, v, lo, hi, &x) != 0) return -1;
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv) {
    st_es_opts_t o = {0};
    static char host[256];
    static st_member_flags_t mf;
    if (st_help_version(argc, argv, "strata-expert", usage_to)) return 0; /* they win over everything */
    for (int i = 1; i < argc; i++) {
        int k = st_member_flags_parse(&mf, argc, argv, &i);
        if (k < 0) return 2;
        if (k) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "--max-rows")) {
            if (int_arg(a, v, 1, 1 << 22, &o.max_rows) != 0) return 2;
        } else if (!strcmp(a, "--slots")) {
            if (int_arg(a, v, 1, 1024, &o.slots) != 0) return 2;
        }
        else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) o.use_cuda = false;
            else if (!strncmp(v, "cuda:", 5) && int_arg("--device cuda:N", v + 5, 0, 63, &o.cuda_device) == 0) o.use_cuda = true;
            else { usage(); return 2; }
        }
        else if (!strcmp(a, "--listen")) {
            const char *c = strrchr(v, ':');
            if (!c || c == v || (size_t)(c - v) >= sizeof host) { usage(); return 2; }
            memcpy(host, v, (size_t)(c - v));
            o.host = host;
            int port;
            if (int_arg("--listen port", c + 1, 0, 65535, &port) != 0) return 2;
            o.port = (uint16_t)port;
        } else { usage(); return 2; }
        i++;
    }
    if (!mf.coordinator || !mf.ckpt) { usage(); return 2; }
    o.coordinator = mf.coordinator, o.coordinator_file = mf.coordinator_file, o.ckpt = mf.ckpt, o.name = mf.name;
#ifndef STRATA_WITH_CUDA
    if (o.use_cuda) {
        fprintf(stderr, "strata-expert: --device cuda:%d: this build has no CUDA (configure with -DSTRATA_WITH_CUDA=ON "
                        "on a machine with the CUDA toolkit), or use --device cpu\n", o.cuda_device);
        return 2;
    }
#endif
    st_log_set_tag(o.name ? o.name : "expert");
    st_fd_limit_raise();
    if (st_sec_opts_finish(&mf.sec, "strata-expert") != ST_OK) return 2;
    o.sec = &mf.sec;
    return st_es_run(&o);
}
