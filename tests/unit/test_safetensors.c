/* safetensors + index reading through st_ckpt_open, on files written by hand here: exact values
 * from a good file, and each kind of broken file rejected with a message, never a crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "strata/model.h"

/* all-MLA dense model: st_ckpt_open needs no KDA tensors */
static const char *k_cfg =
    "{\"hidden_size\":4,\"num_hidden_layers\":1,\"vocab_size\":8,\"num_attention_heads\":1,\"kv_lora_rank\":4,"
    "\"qk_nope_head_dim\":4,\"v_head_dim\":4,\"intermediate_size\":8}";

static char g_dir[512];

static void put(const char *name, const void *data, size_t n) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", p);
        exit(2);
    }
    fclose(f);
}

static void rm(const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    unlink(p);
}

/* u64 LE header length (hl, or strlen(hdr) when hl == ~0) + header + payload */
static void put_st(const char *name, uint64_t hl, const char *hdr, const void *payload, size_t pn) {
    size_t n = strlen(hdr);
    if (hl == ~0ull) hl = n;
    uint8_t *buf = malloc(8 + n + pn + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + 8, hdr, n);
    if (pn) memcpy(buf + 8 + n, payload, pn);
    put(name, buf, 8 + n + pn);
    free(buf);
}

static uint8_t g_payload[64];
static const float k_a[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
static const float k_b[4] = {1.0f, -0.5f, 2.0f, 384.0f}; /* exact in bf16 */

static void make_payload(void) {
    memcpy(g_payload, k_a, 24); /* a: F32 [2,3] at [0,24) */
    for (int i = 0; i < 4; i++) { /* b: BF16 [4] at [24,32) */
        uint16_t h = st_f32_to_bf16(k_b[i]);
        memcpy(g_payload + 24 + 2 * i, &h, 2);
    }
    for (int i = 0; i < 5; i++) g_payload[32 + i] = (uint8_t)(10 * i + 1); /* c: U8 [5] at [32,37) */
    float al[4] = {0.5f, 1.0f, 0.0f, 0.0f}; /* A_log: F32 [4] at [40,56): 2 heads + zero padding */
    memcpy(g_payload + 40, al, 16);
}

static const char *k_good_hdr =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"language_model.a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,4],\"data_offsets\":[24,32]},"
    "\"c\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[32,37]},"
    "\"e\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[37,37]},"
    "\"alog\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[40,56]}}  ";

/* st_ckpt_open on g_dir must fail with ST_ERR_CHECKPOINT (or IO) and a message containing `want` */
static void expect_reject(const char *what, const char *want) {
    st_ckpt_t *ck = (st_ckpt_t *)(uintptr_t)0x1;
    st_status_t s = st_ckpt_open(&ck, g_dir);
    CHECK(s == ST_ERR_CHECKPOINT || s == ST_ERR_IO || s == ST_ERR_CONFIG, "%s: status %d", what, (int)s);
    CHECK(ck == (st_ckpt_t *)(uintptr_t)0x1, "%s: output written on failure", what);
    CHECK(strstr(st_err_last(), want) != NULL, "%s: message '%s' lacks '%s'", what, st_err_last(), want);
    if (s == ST_OK) st_ckpt_close(ck);
}

static void bad_file(const char *what, const char *hdr, size_t pn, const char *want) {
    put_st("model.safetensors", ~0ull, hdr, g_payload, pn);
    expect_reject(what, want);
}

int main(void) {
    st_log_set_level(ST_LOG_WARN);
    const char *tmp = getenv("STRATA_TEST_TMP");
    if (!tmp || !*tmp) tmp = "/tmp";
    mkdir(tmp, 0755);
    snprintf(g_dir, sizeof g_dir, "%s/test_safetensors.%d", tmp, (int)getpid());
    mkdir(g_dir, 0755);
    put("config.json", k_cfg, strlen(k_cfg));
    make_payload();

    /* ---- good single file ---- */
    put_st("model.safetensors", ~0ull, k_good_hdr, g_payload, 56);
    st_ckpt_t *ck = NULL;
    CHECK(st_ckpt_open(&ck, g_dir) == ST_OK, "good file: %s", st_err_last());
    if (ck) {
        const st_tensor_t *t = st_ckpt_find(ck, "a.weight");
        CHECK(t && t->dtype == ST_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->nbytes == 24,
              "a: header");
        CHECK(t && memcmp(t->data, k_a, 24) == 0, "a: exact values");
        CHECK(st_ckpt_find(ck, "language_model.a.weight") == t, "lookup with the prefix");
        CHECK(st_ckpt_find(ck, "zz") == NULL, "absent name");
        int64_t sh[2] = {2, 3};
        const st_tensor_t *g = NULL;
        CHECK(st_ckpt_get(ck, "a.weight", 2, sh, &g) == ST_OK && g == t, "get a");
        sh[1] = 4;
        CHECK(st_ckpt_get(ck, "a.weight", 2, sh, &g) == ST_ERR_CHECKPOINT && strstr(st_err_last(), "[2, 3]") &&
                  strstr(st_err_last(), "[2, 4]"),
              "get a with the wrong shape: %s", st_err_last());
        st_weight_t w;
        float rows[6];
        CHECK(st_ckpt_weight(ck, "a", 2, 3, &w) == ST_OK && w.dtype == ST_DT_F32, "weight a");
        st_weight_rows_f32(&w, 0, 2, rows);
        CHECK(memcmp(rows, k_a, 24) == 0, "weight a rows");
        CHECK(st_ckpt_weight(ck, "c", 1, 5, &w) == ST_ERR_CHECKPOINT, "c.weight absent");
        float b[4];
        CHECK(st_ckpt_vec_f32(ck, "b", 4, false, b) == ST_OK && memcmp(b, k_b, 16) == 0, "b: bf16 [1,4] → fp32");
        CHECK(st_ckpt_vec_f32(ck, "b", 3, false, b) == ST_ERR_CHECKPOINT, "b: wrong length");
        const st_tensor_t *c = st_ckpt_find(ck, "c");
        CHECK(c && c->dtype == ST_DT_U8 && ((const uint8_t *)c->data)[4] == 41, "c: U8");
        const st_tensor_t *e = st_ckpt_find(ck, "e");
        CHECK(e && e->nbytes == 0 && e->shape[0] == 0, "e: empty tensor");
        float al[4];
        CHECK(st_ckpt_vec_f32(ck, "alog", 2, true, al) == ST_OK && al[0] == 0.5f && al[1] == 1.0f, "padded A_log");
        CHECK(st_ckpt_vec_f32(ck, "alog", 3, true, al) == ST_OK, "padded A_log, 3 heads");
        st_ckpt_close(ck);
    }
    /* A_log padding must be zero */
    {
        uint8_t p2[64];
        memcpy(p2, g_payload, 64);
        float nz = 0.25f;
        memcpy(p2 + 40 + 12, &nz, 4);
        put_st("model.safetensors", ~0ull, k_good_hdr, p2, 56);
        ck = NULL;
        CHECK(st_ckpt_open(&ck, g_dir) == ST_OK, "reopen");
        float al[4];
        if (ck) {
            CHECK(st_ckpt_vec_f32(ck, "alog", 2, true, al) == ST_ERR_CHECKPOINT && strstr(st_err_last(), "padding"),
                  "nonzero padding rejected: %s", st_err_last());
            st_ckpt_close(ck);
        }
    }

    /* ---- broken single files ---- */
    put("model.safetensors", "\x10\0\0", 3);
    expect_reject("truncated (3 bytes)", "truncated");
    put("model.safetensors", "", 0);
    expect_reject("empty file", "truncated");
    put_st("model.safetensors", 5000, k_good_hdr, g_payload, 56);
    expect_reject("header length beyond the file", "exceeds the file");
    put_st("model.safetensors", 0, k_good_hdr, g_payload, 56);
    expect_reject("header length 0", "length is 0");
    put_st("model.safetensors", ~0ull, k_good_hdr, g_payload, 40);
    expect_reject("payload cut short", "outside the payload");
    bad_file("header not JSON", "{\"a\":{\"dtype\":\"F32\",", 56, "not valid JSON");
    bad_file("header is an array", "[1,2]", 56, "not a JSON object");
    bad_file("entry not an object", "{\"a\":3}", 56, "'a'");
    bad_file("offsets beyond the file", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[40,64]}}", 56,
             "outside the payload");
    bad_file("begin > end", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 56, "'a'");
    bad_file("overlapping tensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[20,28]}}",
             56, "overlap");
    bad_file("size != dtype x shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 56,
             "needs 24");
    bad_file("unknown dtype", "{\"x.weight\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]}}", 56,
             "'x.weight': unsupported dtype I64");
    bad_file("5 dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 56, "'a'");
    bad_file("negative dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 56, "'a'");
    bad_file("huge shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,4]}}",
             56, "'a'");
    bad_file("missing offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 56, "data_offsets");
    bad_file("string offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[\"0\",1]}}", 56,
             "data_offsets");
    /* header length over 100 MB, inside a (sparse) file large enough to hold it */
    {
        put_st("model.safetensors", 100ull * 1024 * 1024 + 1, "{}", NULL, 0);
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
        CHECK(truncate(p, 101ll * 1024 * 1024) == 0, "sparse file");
        expect_reject("header over 100 MB", "100 MB");
    }
    rm("model.safetensors");
    expect_reject("no weights at all", "model.safetensors");

    /* ---- regressions (issue 13) ---- */
    /* A shard, index or config.json that is a FIFO is refused at once. Before the fix open() waited
     * forever for a writer (S_ISREG was checked after it); the alarm turns a hang into a failure. */
    {
        char p[700];
        alarm(20);
        snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
        CHECK(mkfifo(p, 0644) == 0, "mkfifo shard");
        expect_reject("shard is a FIFO", "not a regular file");
        rm("model.safetensors");
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", g_dir);
        CHECK(mkfifo(p, 0644) == 0, "mkfifo index");
        expect_reject("index is a FIFO", "not a regular file");
        rm("model.safetensors.index.json");
        put_st("model.safetensors", ~0ull, k_good_hdr, g_payload, 56);
        rm("config.json");
        snprintf(p, sizeof p, "%s/config.json", g_dir);
        CHECK(mkfifo(p, 0644) == 0, "mkfifo config");
        expect_reject("config.json is a FIFO", "not a regular file");
        rm("config.json");
        /* config.json as a directory: before the fix its read buffer was sized from lseek's LLONG_MAX
         * (an allocation failure; an abort under ASan) */
        CHECK(mkdir(p, 0755) == 0, "mkdir config.json");
        expect_reject("config.json is a directory", "not a regular file");
        rmdir(p);
        alarm(0);
        put("config.json", k_cfg, strlen(k_cfg));
        rm("model.safetensors");
    }
    /* A header of odd length puts every tensor at an odd address in the mapping: decoding must not
     * load misaligned uint16_t/float (UBSan: misaligned load at mxfp4.c:20 before the fix) and gives
     * the same values. */
    {
        const char *hdr = "{\"w.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                          "\"h\":{\"dtype\":\"F16\",\"shape\":[1,3],\"data_offsets\":[8,14]},"
                          "\"f\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[14,22]}}  ";
        const float wv[4] = {1.0f, -0.5f, 2.0f, 384.0f}, hv[3] = {0.25f, -3.0f, 1024.0f}, fv[2] = {1e-3f, -7.5f};
        uint8_t pl[22];
        for (int i = 0; i < 4; i++) {
            uint16_t b = st_f32_to_bf16(wv[i]);
            memcpy(pl + 2 * i, &b, 2);
        }
        for (int i = 0; i < 3; i++) {
            uint16_t h = st_f32_to_f16(hv[i]);
            memcpy(pl + 8 + 2 * i, &h, 2);
        }
        memcpy(pl + 14, fv, 8);
        CHECK((8 + strlen(hdr)) % 2 == 1, "header length is odd");
        put_st("model.safetensors", ~0ull, hdr, pl, sizeof pl);
        ck = NULL;
        CHECK(st_ckpt_open(&ck, g_dir) == ST_OK, "odd header: %s", st_err_last());
        if (ck) {
            st_weight_t w;
            float out[4] = {0}, vec[3] = {0};
            CHECK(((uintptr_t)st_ckpt_find(ck, "w.weight")->data & 1) == 1, "w lies at an odd address");
            CHECK(st_ckpt_weight(ck, "w", 2, 2, &w) == ST_OK, "weight w");
            st_weight_rows_f32(&w, 0, 2, out);
            CHECK(memcmp(out, wv, sizeof wv) == 0, "misaligned BF16 rows");
            st_weight_rows_f32(&w, 1, 1, out);
            CHECK(out[0] == 2.0f && out[1] == 384.0f, "misaligned BF16 row 1");
            const st_tensor_t *h = st_ckpt_find(ck, "h");
            st_weight_t hw = {ST_DT_F16, 1, 3, h->data, NULL};
            st_weight_rows_f32(&hw, 0, 1, vec);
            CHECK(memcmp(vec, hv, sizeof hv) == 0, "misaligned F16 row");
            const st_tensor_t *f = st_ckpt_find(ck, "f");
            st_weight_t fw = {ST_DT_F32, 1, 2, f->data, NULL};
            st_weight_rows_f32(&fw, 0, 1, out);
            CHECK(out[0] == fv[0] && out[1] == fv[1], "misaligned F32 row");
            CHECK(st_ckpt_vec_f32(ck, "h", 3, false, vec) == ST_OK && memcmp(vec, hv, sizeof hv) == 0,
                  "misaligned F16 vector");
            st_ckpt_close(ck);
        }
        rm("model.safetensors");
    }

    /* random corruption of the good file's header: never a crash */
    {
        size_t hn = strlen(k_good_hdr);
        char *h = malloc(hn + 1);
        st_rng_t r = {11};
        const char junk[] = "{}[],:\"0123456789-e. x";
        int rejected = 0;
        for (int it = 0; it < 1500; it++) {
            memcpy(h, k_good_hdr, hn + 1);
            for (int k = 0; k < 2; k++) h[st_rng_next(&r) % hn] = junk[st_rng_next(&r) % (sizeof junk - 1)];
            put_st("model.safetensors", ~0ull, h, g_payload, 56);
            ck = NULL;
            if (st_ckpt_open(&ck, g_dir) == ST_OK) {
                const st_tensor_t *t = st_ckpt_find(ck, "a.weight");
                if (t) { /* whatever was accepted must lie inside the mapping */
                    volatile uint8_t sink = 0;
                    for (size_t i = 0; i < t->nbytes; i++) sink ^= ((const uint8_t *)t->data)[i];
                    (void)sink;
                }
                st_ckpt_close(ck);
            } else {
                rejected++;
            }
        }
        CHECK(rejected > 0, "some corruptions rejected (%d)", rejected);
        free(h);
        rm("model.safetensors");
    }

    /* ---- sharded: index + two shards ---- */
    const char *s1 = "{\"language_model.model.x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    const char *s2 = "{\"language_model.lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}";
    put_st("model-00001-of-000002.safetensors", ~0ull, s1, g_payload, 24);
    put_st("model-00002-of-000002.safetensors", ~0ull, s2, g_payload + 24, 8);
    const char *idx =
        "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
        "\"language_model.model.x\":\"model-00001-of-000002.safetensors\","
        "\"language_model.lm_head.weight\":\"model-00002-of-000002.safetensors\"}}";
    put("model.safetensors.index.json", idx, strlen(idx));
    ck = NULL;
    CHECK(st_ckpt_open(&ck, g_dir) == ST_OK, "sharded: %s", st_err_last());
    if (ck) {
        const st_tensor_t *x = st_ckpt_find(ck, "model.x"), *l = st_ckpt_find(ck, "lm_head.weight");
        CHECK(x && memcmp(x->data, k_a, 24) == 0, "sharded x");
        float b[4];
        CHECK(l && st_ckpt_vec_f32(ck, "lm_head.weight", 4, false, b) == ST_OK && memcmp(b, k_b, 16) == 0,
              "sharded lm_head");
        st_ckpt_close(ck);
    }
    /* the index names a shard that is not there */
    const char *idx_missing =
        "{\"weight_map\":{\"language_model.model.x\":\"model-00001-of-000002.safetensors\","
        "\"language_model.lm_head.weight\":\"model-00003-of-000002.safetensors\"}}";
    put("model.safetensors.index.json", idx_missing, strlen(idx_missing));
    expect_reject("index names a missing shard", "model-00003-of-000002.safetensors");
    /* the index names a tensor its shard lacks */
    const char *idx_lacks =
        "{\"weight_map\":{\"language_model.model.x\":\"model-00001-of-000002.safetensors\","
        "\"language_model.model.y\":\"model-00001-of-000002.safetensors\"}}";
    put("model.safetensors.index.json", idx_lacks, strlen(idx_lacks));
    expect_reject("index names an absent tensor", "language_model.model.y");
    /* the index puts a tensor in the wrong shard */
    const char *idx_wrong =
        "{\"weight_map\":{\"language_model.model.x\":\"model-00002-of-000002.safetensors\","
        "\"language_model.lm_head.weight\":\"model-00001-of-000002.safetensors\"}}";
    put("model.safetensors.index.json", idx_wrong, strlen(idx_wrong));
    expect_reject("index disagrees with the shards", "model-0000");
    /* a tensor stored in two shards */
    put_st("model-00002-of-000002.safetensors", ~0ull, s1, g_payload, 24);
    put("model.safetensors.index.json", idx, strlen(idx));
    expect_reject("tensor stored twice", "twice");
    put_st("model-00002-of-000002.safetensors", ~0ull, s2, g_payload + 24, 8);
    /* malformed index files */
    put("model.safetensors.index.json", "{\"weight_map\":", 14);
    expect_reject("index not JSON", "invalid JSON");
    put("model.safetensors.index.json", "{\"weight_map\":[]}", 17);
    expect_reject("weight_map not an object", "weight_map");
    const char *idx_path = "{\"weight_map\":{\"language_model.model.x\":\"../x.safetensors\"}}";
    put("model.safetensors.index.json", idx_path, strlen(idx_path));
    expect_reject("shard name with a path", "plain file name");
    /* a bad config is reported before any shard is read */
    put("config.json", "{\"hidden_size\":4}", 17);
    expect_reject("bad config", "num_hidden_layers");

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return st_test_done();
}
