/* /status and /metrics never break (issue 13): a NaN or an infinity reported by a member (one NaN
 * ReportScores used to poison both for good), or a member name that is not UTF-8, still renders
 * valid JSON and valid Prometheus text. Drives rest.c's renderers over a coordinator state built
 * by hand; no loop, no sockets. */
#include <jansson.h>
#include <math.h>

#include "coord_impl.h"
#include "harness.h"

/* Every sample line "name{labels} value" has a value Prometheus reads: a finite number, or NaN,
 * +Inf, -Inf spelled that way. */
static int prom_ok(const char *text, char *why, size_t wn) {
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p);
        p += n + (nl ? 1 : 0);
        if (!line[0] || line[0] == '#') continue;
        char *sp = strrchr(line, ' ');
        if (!sp) {
            snprintf(why, wn, "no value: %s", line);
            return 0;
        }
        const char *v = sp + 1;
        if (!strcmp(v, "NaN") || !strcmp(v, "+Inf") || !strcmp(v, "-Inf")) continue;
        char *end;
        double d = strtod(v, &end);
        if (end == v || *end || !isfinite(d)) {
            snprintf(why, wn, "bad value: %s", line);
            return 0;
        }
    }
    return 1;
}

int main(void) {
    coord_t *co = calloc(1, sizeof *co);
    co->cfg.n_layers = 3;
    co->cfg.n_experts = 4;
    co->cfg.first_k_dense = 1;
    co->cfg.top_k = 2;
    co->cfg.vocab = 512;
    snprintf(co->model, sizeof co->model, "tiny");
    CHECK(st_placement_init(&co->place, 2, 4, 1) == ST_OK, "placement");
    st_hist_init(&co->ttft);
    st_hist_init(&co->tpot);
    st_hist_init(&co->e2e);
    co->t_start = st_time_sec();
    co->n_members = 2;
    for (int i = 0; i < 2; i++)
        co->members[i].load = calloc(12, sizeof(uint32_t));
    co->members[0] = (member_t){.id = 1,
                                .role = ST_PROTO_ROLE_ATTENTION,
                                .alive = 1,
                                .capacity = 4,
                                .load = co->members[0].load,
                                .last_seen = st_time_sec(),
                                .load_step = 1};
    snprintf(co->members[0].name, sizeof co->members[0].name, "attn-\xff\xfe-\xed\xa0\x80"); /* not UTF-8 */
    snprintf(co->members[0].endpoint, sizeof co->members[0].endpoint, "127.0.0.1:1");
    co->members[1] =
        (member_t){.id = 2, .role = ST_PROTO_ROLE_EXPERT, .alive = 1, .load = co->members[1].load, .last_seen = NAN};
    snprintf(co->members[1].name, sizeof co->members[1].name, "expert-0");

    /* a clean state renders */
    char *s = st_coord_status_json(co);
    CHECK(s != NULL, "status of a clean state");
    free(s);

    /* what one bad ReportScores (or a bad clock) leaves behind */
    co->stage_s[0] = NAN;
    co->stage_s[1] = INFINITY;
    co->stage_s[2] = -INFINITY;
    co->stage_steps = 1;
    co->merge_s = NAN;
    co->merges = 1;
    co->tokens_per_s = INFINITY;
    st_hist_add(&co->tpot, NAN);
    st_hist_add(&co->ttft, INFINITY);
    s = st_coord_status_json(co);
    CHECK(s != NULL, "status with NaN/Inf members' numbers and a non-UTF-8 name is still rendered");
    json_error_t je;
    json_t *j = s ? json_loads(s, 0, &je) : NULL;
    CHECK(j != NULL, "status is JSON: %s", s ? je.text : "(none)");
    json_t *name = json_object_get(json_array_get(json_object_get(j, "members"), 0), "name");
    CHECK(json_is_string(name) && strstr(json_string_value(name), "attn-") &&
              strstr(json_string_value(name), "\xEF\xBF\xBD"),
          "the member's name with U+FFFD for its bad bytes");
    CHECK(json_is_null(json_object_get(json_object_get(j, "step_ms"), "attention")), "NaN → null");
    CHECK(json_is_null(json_object_get(json_object_get(j, "throughput"), "tokens_per_s")), "Inf → null");
    CHECK(json_is_object(json_object_get(j, "queue")) && json_is_object(json_object_get(j, "loop")),
          "queue and loop sections");
    json_decref(j);
    free(s);

    size_t n = 0;
    char *m = st_coord_metrics_text(co, &n);
    CHECK(m != NULL && n == strlen(m), "metrics rendered");
    char why[600] = "";
    CHECK(m && prom_ok(m, why, sizeof why), "every sample value is Prometheus-readable: %s", why);
    CHECK(m && strstr(m, "strata_step_stage_seconds_total{stage=\"attention\"} NaN\n") &&
              strstr(m, "strata_step_stage_seconds_total{stage=\"dispatch\"} +Inf\n") &&
              strstr(m, "strata_step_stage_seconds_total{stage=\"wait\"} -Inf\n"),
          "NaN, +Inf, -Inf spelled the Prometheus way");
    CHECK(m && strstr(m, "strata:num_requests_waiting{model_name=\"tiny\"} 0\n") &&
              strstr(m, "strata:num_requests_running{model_name=\"tiny\"} 0\n") &&
              strstr(m, "strata_loop_stall_max_seconds "),
          "queue and stall gauges (vLLM's names and model_name label)");
    CHECK(m && strstr(m, "strata:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.001\"} 0\n") &&
              strstr(m, "strata:e2e_request_latency_seconds_count{model_name=\"tiny\"} 0\n") &&
              strstr(m, "strata:prompt_tokens_total{model_name=\"tiny\"} 0\n") &&
              strstr(m, "strata:generation_tokens_total{model_name=\"tiny\"} 0\n"),
          "histograms and token counters with the model_name label");
    free(m);

    /* expert load, summarised: per expert server, the top experts, max/mean; never per expert */
    st_place_server_t live = {.id = 2};
    CHECK(st_placement_update(&co->place, &live, 1) == ST_OK, "every expert on expert-0");
    for (int k = 0; k < 12; k++) co->members[0].load[k] = (uint32_t)(k >= 4 ? k : 0); /* layers 1, 2 */
    m = st_coord_metrics_text(co, &n);
    CHECK(m && strstr(m, "strata:expert_server_load_tokens{server=\"expert-0\"} 60.000000\n"),
          "expert-0 had 4+..+11 = 60 tokens");
    CHECK(m && strstr(m, "strata:expert_load_top_tokens{rank=\"1\",layer=\"2\",expert=\"3\"} 11\n") &&
              strstr(m, "strata:expert_load_top_tokens{rank=\"8\",layer=\"1\",expert=\"0\"} 4\n") &&
              !strstr(m, "rank=\"9\""),
          "the most loaded experts, in order (8 with tokens)");
    CHECK(m && strstr(m, "strata:expert_load_max_over_mean 1.272727\n"), "max over mean of layer 1: 7 / 5.5");
    CHECK(m && !strstr(m, "strata_expert_load_tokens"), "no series per expert");
    free(m);

    for (int i = 0; i < 2; i++)
        free(co->members[i].load);
    st_placement_cleanup(&co->place);
    free(co);
    return st_test_done();
}
