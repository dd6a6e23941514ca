/* strata-coordinator: membership, placement, global quantile thresholds, client front door, REST. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "coord.h"
#include "strata/base.h"

static void usage_to(FILE *out) {
    fprintf(out, "usage: strata-coordinator --ckpt DIR [--grpc HOST:PORT] [--http HOST:PORT] [--replicas R]\n"
                    "                          [--heartbeat-ms MS] [--routing topk|quantile] [--lambda L]\n"
                    "                          [--expect-workers N] [--expect-experts N] [--model-name NAME] [--ready-file PATH]\n"
                    "                          [--api-key KEY | --api-key-file F] [--auth-all] [--max-queue N]\n"
                    "                          [--queue-timeout-s S] [--stream-idle-timeout-s S]\n"
                    "                          [--http-tls-cert F --http-tls-key F]\n"
                    "       " ST_SEC_USAGE "\n"
                    "  --api-key-file F / $STRATA_API_KEY: clients send \"Authorization: Bearer KEY\" on /v1/* (and gRPC\n"
                    "  Generate/Status); --auth-all requires it on /metrics and /status too (/healthz, /readyz stay open).\n"
                    "  --max-queue N: requests waiting for a worker slot (default 1024, 0: none); beyond it 429.\n"
                    "  HOST may be a name (localhost) or an address. --help, --version.\n");
}
static void usage(void) { usage_to(stderr); }

static int secs_arg(const char *flag, const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0 && x <= 86400)) {
        fprintf(stderr, "strata-coordinator: %s takes seconds in (0, 86400] (got '%s')\n", flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* An API key: printable ASCII without spaces (it travels in a header), from the flag, the file or
 * the environment, in that order. Returns 0 (none or one), -1 on error. */
static int load_api_key(const char *flag, const char *file, char *out, size_t cap) {
    const char *src = flag ? "--api-key" : file ? "--api-key-file" : "STRATA_API_KEY";
    char *txt = NULL;
    const char *k = flag;
    if (!k && file) {
        if (st_file_read_all(file, &txt, NULL) != ST_OK) {
            fprintf(stderr, "strata-coordinator: --api-key-file: %s\n", st_err_last());
            return -1;
        }
        k = txt;
    }
    if (!k && *st_tun_str(ST_TUN_API_KEY)) k = st_tun_str(ST_TUN_API_KEY);
    if (!k) return 0;
    size_t n = strlen(k);
    while (n > 0 && (k[n - 1] == '\n' || k[n - 1] == '\r' || k[n - 1] == ' ' || k[n - 1] == '\t')) n--;
    int ok = n > 0 && n < cap;
    for (size_t i = 0; ok && i < n; i++) ok = k[i] > 0x20 && k[i] < 0x7f;
    if (ok) {
        memcpy(out, k, n);
        out[n] = 0;
    } else {
        fprintf(stderr, "strata-coordinator: the API key (%s) must be 1..%zu printable ASCII characters without spaces\n", src,
                cap - 1);
    }
    free(txt);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    st_coord_opts_t o = {0};
    static st_sec_opts_t sec;
    static char api_key[1024];
    const char *key_flag = NULL, *key_file = NULL;
    if (st_help_version(argc, argv, "strata-coordinator", usage_to)) return 0; /* they win over everything */
    for (int i = 1; i < argc; i++) {
        int k = st_sec_opts_parse(&sec, argc, argv, &i);
        if (k < 0) return 2;
        if (k) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--auth-all")) {
            o.auth_all = 1;
            continue;
        }
        if (!v) { usage(); return 2; }
        long x = 0;
        if (!strcmp(a, "--ckpt")) o.ckpt = v;
        else if (!strcmp(a, "--grpc")) o.grpc = v;
        else if (!strcmp(a, "--http")) o.http = v;
        else if (!strcmp(a, "--replicas")) {
            if (st_parse_long(a, v, 1, 8, &x) != 0) return 2;
            o.replicas = (int)x;
        } else if (!strcmp(a, "--heartbeat-ms")) {
            if (st_parse_long(a, v, 10, 60000, &x) != 0) return 2;
            o.heartbeat_ms = (uint32_t)x;
        } else if (!strcmp(a, "--lambda")) {
            char *end;
            o.lambda = strtof(v, &end);
            if (end == v || *end || !(o.lambda >= 0 && o.lambda < 1)) {
                fprintf(stderr, "strata-coordinator: --lambda takes a decay in [0, 1) (got '%s')\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--expect-workers")) {
            if (st_parse_long(a, v, 0, 4096, &x) != 0) return 2;
            o.expect_workers = (int)x;
        } else if (!strcmp(a, "--expect-experts")) {
            if (st_parse_long(a, v, 0, 4096, &x) != 0) return 2;
            o.expect_experts = (int)x;
        }
        else if (!strcmp(a, "--http-tls-cert")) o.http_tls_cert = v;
        else if (!strcmp(a, "--http-tls-key")) o.http_tls_key = v;
        else if (!strcmp(a, "--model-name")) o.model_name = v;
        else if (!strcmp(a, "--ready-file")) o.ready_file = v;
        else if (!strcmp(a, "--api-key")) key_flag = v;
        else if (!strcmp(a, "--api-key-file")) key_file = v;
        else if (!strcmp(a, "--max-queue")) {
            if (st_parse_long(a, v, 0, 1000000, &x) != 0) return 2;
            o.max_queue = x ? (int)x : -1;
        } else if (!strcmp(a, "--queue-timeout-s")) {
            if (secs_arg(a, v, &o.queue_timeout_s) != 0) return 2;
        } else if (!strcmp(a, "--stream-idle-timeout-s")) {
            if (secs_arg(a, v, &o.stream_idle_timeout_s) != 0) return 2;
        } else if (!strcmp(a, "--test-reply-delay-ms")) { /* tests: a slow coordinator (docs/quantile.md) */
            if (st_parse_long(a, v, 0, 60000, &x) != 0) return 2;
            o.test_reply_delay_ms = (uint32_t)x;
        } else if (!strcmp(a, "--routing")) {
            if (!strcmp(v, "quantile")) o.quantile = 1;
            else if (strcmp(v, "topk") != 0) { usage(); return 2; }
        } else { usage(); return 2; }
        i++;
    }
    if (!o.ckpt) { usage(); return 2; }
    if (o.replicas < 0 || o.replicas > 8) {
        fprintf(stderr, "strata-coordinator: --replicas must be 1..8\n");
        return 2;
    }
    if (key_flag && key_file) {
        fprintf(stderr, "strata-coordinator: one of --api-key / --api-key-file\n");
        return 2;
    }
    if (load_api_key(key_flag, key_file, api_key, sizeof api_key) != 0) return 2;
    o.api_key = api_key[0] ? api_key : NULL;
    st_log_set_tag("coordinator");
    if (o.auth_all && !o.api_key) st_log_warn("coordinator: --auth-all without an API key: nothing to require");
    st_fd_limit_raise();
    if (st_sec_opts_finish(&sec, "strata-coordinator") != ST_OK) return 2;
    o.sec = &sec;
    return st_coord_run(&o);
}
