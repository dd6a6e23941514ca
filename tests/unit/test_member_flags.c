/* The member roles' shared command-line flags (st_member_flags_parse over st_sec_opts_parse and
 * st_parse_str_flag): every flag lands in its field, other flags are left to the role, a missing value
 * is an error, and the index steps past exactly what was consumed. */
#include "harness.h"
#include "strata/member.h"

/* Run the parser over argv the way a role's main does; returns the number of flags left to the role
 * (their names in rest[]), or -1 at the first error. */
static int parse(st_member_flags_t *f, int argc, char **argv, const char **rest) {
    int n_rest = 0;
    for (int i = 1; i < argc; i++) {
        int k = st_member_flags_parse(f, argc, argv, &i);
        if (k < 0) return -1;
        if (k == 0) rest[n_rest++] = argv[i];
    }
    return n_rest;
}

int main(void) {
    char *argv[] = {"role",          "--coordinator", "h1:1,h2:2", "--max-rows", "--coordinator-file", "/tmp/c",
                    "--ckpt",        "/ck",           "--insecure", "--name",    "e0",                 "--tls-ca",
                    "/ca.pem",       "--listen"};
    st_member_flags_t f = {0};
    const char *rest[16];
    int n = parse(&f, (int)(sizeof argv / sizeof *argv), argv, rest);
    CHECK(n == 2 && !strcmp(rest[0], "--max-rows") && !strcmp(rest[1], "--listen"), "left to the role: %d", n);
    CHECK(f.coordinator && !strcmp(f.coordinator, "h1:1,h2:2"), "--coordinator");
    CHECK(f.coordinator_file && !strcmp(f.coordinator_file, "/tmp/c"), "--coordinator-file");
    CHECK(f.ckpt && !strcmp(f.ckpt, "/ck"), "--ckpt");
    CHECK(f.name && !strcmp(f.name, "e0"), "--name");
    CHECK(f.sec.insecure == 1 && f.sec.tls_ca && !strcmp(f.sec.tls_ca, "/ca.pem"), "security flags");
    CHECK(!f.sec.tls_cert && !f.sec.secret_file, "flags not given stay unset");

    /* a value missing at the end: an error, whichever table the flag is in */
    char *miss1[] = {"role", "--ckpt"}, *miss2[] = {"role", "--tls-key"};
    st_member_flags_t g = {0};
    CHECK(parse(&g, 2, miss1, rest) == -1 && !g.ckpt, "--ckpt without a value");
    CHECK(parse(&g, 2, miss2, rest) == -1 && !g.sec.tls_key, "--tls-key without a value");

    /* the index steps past the value only */
    char *one[] = {"role", "--name", "x", "--slots"};
    st_member_flags_t h = {0};
    int i = 1;
    CHECK(st_member_flags_parse(&h, 4, one, &i) == 1 && i == 2, "consumed flag and value (i=%d)", i);
    i = 3;
    CHECK(st_member_flags_parse(&h, 4, one, &i) == 0 && i == 3, "not ours: untouched (i=%d)", i);
    /* HOST:PORT flags take localhost names as the loopback without a resolver (RFC 6761) */
    CHECK(st_host_is_localhost("localhost") && st_host_is_localhost("LocalHost.") &&
              st_host_is_localhost("a.b.localhost") && st_host_is_localhost("x.LOCALHOST."),
          "localhost names");
    CHECK(!st_host_is_localhost("localhost.com") && !st_host_is_localhost("mylocalhost") &&
              !st_host_is_localhost("127.0.0.1") && !st_host_is_localhost("") && !st_host_is_localhost("."),
          "other names are not localhost");
    return st_test_done();
}
