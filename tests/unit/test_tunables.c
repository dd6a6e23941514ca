/* common/base configuration table: the environment is read once through the table (valid values
 * taken, malformed ones refused by st_tun_load and named, the default kept), --set wins over the
 * environment and is type-checked, UCX's entries are read but never set, the log level follows LOG,
 * st_tun_export hands flag values to children, st_tun_print lists every entry with its source. */
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
#include "strata/base.h"

int main(void) {
    /* NOTE: before the first st_tun_* call or log line: the table reads the environment once */
    setenv("STRATA_THREADS", "3", 1);
    setenv("STRATA_XFER_SPIN_US", "lots", 1);
    setenv("STRATA_WORKER_SYNC", "yes", 1);
    setenv("STRATA_LOG", "warn", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    unsetenv("STRATA_STATE");
    unsetenv("UCX_TLS");

    CHECK(st_tun_load() == ST_ERR_CONFIG, "a malformed STRATA_ variable fails the load");
    CHECK(strstr(st_err_last(), "STRATA_XFER_SPIN_US") != NULL, "the error names it: %s", st_err_last());
    CHECK(strstr(st_err_last(), "THREADS") == NULL, "and only it: %s", st_err_last());
    CHECK(st_tun_int(ST_TUN_XFER_SPIN_US) == -1 && st_tun_source(ST_TUN_XFER_SPIN_US) == ST_TUN_FROM_DEFAULT,
          "its default is kept");
    CHECK(st_tun_int(ST_TUN_THREADS) == 3 && st_tun_source(ST_TUN_THREADS) == ST_TUN_FROM_ENV, "STRATA_THREADS=3");
    CHECK(st_tun_int(ST_TUN_WORKER_SYNC) == 1, "a boolean in words");
    CHECK(st_tun_int(ST_TUN_LOG) == ST_LOG_WARN, "LOG=warn is level %ld", st_tun_int(ST_TUN_LOG));
    CHECK(strcmp(st_tun_str(ST_TUN_STATE), "") == 0 && st_tun_source(ST_TUN_STATE) == ST_TUN_FROM_DEFAULT,
          "an unset string is empty, from the default");
    CHECK(st_tun_source(ST_TUN_UCX_NET_DEVICES) == ST_TUN_FROM_ENV && !strcmp(st_tun_str(ST_TUN_UCX_NET_DEVICES), "lo"),
          "UCX's variable is seen under its own name");
    CHECK(st_tun_source(ST_TUN_UCX_TLS) == ST_TUN_FROM_DEFAULT, "an unset UCX variable is not set");

    /* read once: a later change of the environment is not seen */
    setenv("STRATA_THREADS", "7", 1);
    CHECK(st_tun_int(ST_TUN_THREADS) == 3, "the environment is read once");

    /* flags: checked, then win over the environment */
    CHECK(st_tun_set("THREADS", "5") == ST_OK && st_tun_int(ST_TUN_THREADS) == 5 &&
              st_tun_source(ST_TUN_THREADS) == ST_TUN_FROM_FLAG,
          "--set THREADS=5 wins");
    CHECK(st_tun_set("STRATA_THREADS", "6") == ST_OK && st_tun_int(ST_TUN_THREADS) == 6, "the STRATA_ prefix is allowed");
    CHECK(st_tun_set("THREADS", "257") == ST_ERR_INVALID_ARG && st_tun_int(ST_TUN_THREADS) == 6,
          "out of range refused, value untouched");
    CHECK(strstr(st_err_last(), "0..256") != NULL, "the error gives the range: %s", st_err_last());
    CHECK(st_tun_set("THREADS", "4x") == ST_ERR_INVALID_ARG, "trailing junk refused");
    CHECK(st_tun_set("WORKER_SYNC", "maybe") == ST_ERR_INVALID_ARG, "a non-boolean refused");
    CHECK(st_tun_set("LOG", "loud") == ST_ERR_INVALID_ARG, "a value outside the enum refused");
    CHECK(st_tun_set("NO_SUCH", "1") == ST_ERR_INVALID_ARG, "an unknown name refused");
    CHECK(st_tun_set("UCX_TLS", "tcp") == ST_ERR_INVALID_ARG && st_tun_source(ST_TUN_UCX_TLS) == ST_TUN_FROM_DEFAULT,
          "UCX's entries are never set by Strata");
    CHECK(st_tun_set("API_KEY", "k3y") == ST_OK && !strcmp(st_tun_str(ST_TUN_API_KEY), "k3y"), "a string entry");
    CHECK(st_tun_set("XFER_SPIN_US", "0") == ST_OK && st_tun_int(ST_TUN_XFER_SPIN_US) == 0, "0 = no spin");

    /* the --set flag parser */
    char *argv[] = {"prog", "--set", "STATE=/tmp/x", "--other", "--set", "bad", "--set"};
    int i = 1;
    CHECK(st_tun_parse_flag(7, argv, &i) == 1 && i == 2 && !strcmp(st_tun_str(ST_TUN_STATE), "/tmp/x"),
          "--set NAME=VALUE consumed");
    i = 3;
    CHECK(st_tun_parse_flag(7, argv, &i) == 0 && i == 3, "not ours");
    i = 4;
    CHECK(st_tun_parse_flag(7, argv, &i) == -1, "--set without '=' refused");
    i = 6;
    CHECK(st_tun_parse_flag(7, argv, &i) == -1, "--set without a value refused");

    /* the log level follows LOG set by a flag */
    CHECK(st_tun_set("LOG", "debug") == ST_OK && st_tun_int(ST_TUN_LOG) == ST_LOG_DEBUG, "LOG=debug");

    /* children of strata up get the flag values */
    st_tun_export();
    const char *e = getenv("STRATA_STATE");
    CHECK(e && !strcmp(e, "/tmp/x"), "st_tun_export writes STRATA_STATE");
    e = getenv("STRATA_THREADS");
    CHECK(e && !strcmp(e, "6"), "and STRATA_THREADS (flag over env)");

    /* the printed table: every entry, its source; the secret by length only */
    char path[] = "/tmp/test_tunables.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "temp file");
    if (fd >= 0) {
        FILE *f = fdopen(fd, "w+");
        st_tun_print(f);
        fflush(f);
        rewind(f);
        char buf[8192];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        unlink(path);
        int lines = 0;
        for (char *p = buf; (p = strchr(p, '\n')); p++) lines++;
        CHECK(lines == ST_TUN_COUNT + 2, "header + one line per entry + the ignored-variable note: %d lines", lines);
        CHECK(strstr(buf, "STRATA_THREADS") && strstr(buf, "UCX_TLS") && strstr(buf, "STRATA_CLUSTER_SECRET_FILE"),
              "entries named by their variables");
        CHECK(strstr(buf, "k3y") == NULL && strstr(buf, "<3 characters>") != NULL, "the API key is not printed");
        CHECK(strstr(buf, "STRATA_XFER_SPIN_US='lots'") != NULL, "the ignored variable is named");
    }
    return st_test_done();
}
