/* strata-coordinator: membership, placement, global quantile thresholds, client front door, REST. */
#include <stdio.h>
#include <stdlib.h>

#include "coord.h"
#include "strata/base.h"

static void usage(void) {
    fprintf(stderr, "usage: strata-coordinator --ckpt DIR [--grpc HOST:PORT] [--http HOST:PORT] [--replicas R]\n"
                    "                          [--heartbeat-ms MS] [--routing topk|quantile] [--lambda L]\n"
                    "                          [--expect-workers N] [--expect-experts N] [--model-name NAME] [--ready-file PATH]\n"
                    "       " ST_SEC_USAGE "\n");
}

int main(int argc, char **argv) {
    st_coord_opts_t o = {0};
    static st_sec_opts_t sec;
    for (int i = 1; i < argc; i++) {
        int k = st_sec_opts_parse(&sec, argc, argv, &i);
        if (k < 0) return 2;
        if (k) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "--ckpt")) o.ckpt = v;
        else if (!strcmp(a, "--grpc")) o.grpc = v;
        else if (!strcmp(a, "--http")) o.http = v;
        else if (!strcmp(a, "--replicas")) o.replicas = atoi(v);
        else if (!strcmp(a, "--heartbeat-ms")) o.heartbeat_ms = (uint32_t)atoi(v);
        else if (!strcmp(a, "--lambda")) o.lambda = strtof(v, NULL);
        else if (!strcmp(a, "--expect-workers")) o.expect_workers = atoi(v);
        else if (!strcmp(a, "--expect-experts")) o.expect_experts = atoi(v);
        else if (!strcmp(a, "--model-name")) o.model_name = v;
        else if (!strcmp(a, "--ready-file")) o.ready_file = v;
        else if (!strcmp(a, "--routing")) {
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
    st_log_set_tag("coordinator");
    if (st_sec_opts_finish(&sec, "strata-coordinator") != ST_OK) return 2;
    o.sec = &sec;
    return st_coord_run(&o);
}
