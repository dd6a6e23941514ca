/* common/base logging: every line dated (ISO-8601, UTC, milliseconds, within a second of now);
 * LOG_FORMAT=json from the environment gives one JSON object a line with the message escaped
 * (quotes, backslashes, control characters, bytes that are not UTF-8 as U+FFFD); --set
 * LOG_FORMAT=text goes back to text lines; the level still filters. stderr is read back from a file. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "strata/base.h"

static char buf[8192];

/* what the logging calls in fn wrote on stderr */
static const char *capture(void (*fn)(void)) {
    char path[] = "/tmp/test_log.XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    buf[0] = 0;
    if (fd < 0 || saved < 0) return buf;
    fflush(stderr);
    dup2(fd, 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    return buf;
}

/* "YYYY-MM-DDTHH:MM:SS.mmmZ" at s, within 2 s of now */
static int dated(const char *s) {
    struct tm tm = {0};
    int ms = -1;
    char z = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
               &tm.tm_sec, &ms, &z) != 8 || z != 'Z' || s[4] != '-' || s[10] != 'T' || s[19] != '.' || ms < 0)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    /* NOTE: not time(NULL): glibc reads a coarse clock there that can lag the log's CLOCK_REALTIME
     * stamp by a tick, so a line stamped just after a second boundary looked as if from the future */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t t = timegm(&tm), now = ts.tv_sec;
    return t <= now && now - t <= 2;
}

static int json_line;
static void log_json(void) {
    json_line = __LINE__ + 1;
    st_log_warn("a \"quoted\" \\ line\nwith\ta \x01 and \xff bytes and caf\xc3\xa9");
    st_log_debug("below the level");
}

static int text_line;
static void log_text(void) {
    text_line = __LINE__ + 1;
    st_log_info("plain %d", 42);
}

int main(void) {
    /* NOTE: before the first st_tun_* call or log line: the table reads the environment once */
    setenv("STRATA_LOG_FORMAT", "json", 1);
    setenv("STRATA_LOG", "info", 1);
    st_log_set_tag("test");
    CHECK(st_tun_load() == ST_OK && st_tun_int(ST_TUN_LOG_FORMAT) == ST_LOG_JSON, "LOG_FORMAT=json");

    const char *out = capture(log_json);
    CHECK(!strncmp(out, "{\"time\":\"", 9) && dated(out + 9), "a JSON line, dated: %s", out);
    char want[512];
    snprintf(want, sizeof want,
             "Z\",\"level\":\"warn\",\"role\":\"test\",\"src\":\"test_log.c:%d\",\"msg\":\"a \\\"quoted\\\" \\\\ "
             "line\\nwith\\ta \\u0001 and \\ufffd bytes and caf\xc3\xa9\"}\n",
             json_line);
    CHECK(strlen(out) > 32 && !strcmp(out + 9 + 23, want), "the fields, the message escaped:\n  %s\nwant ...%s", out, want);
    CHECK(strchr(out, '\n') == out + strlen(out) - 1, "one line (the debug line filtered out)");

    CHECK(st_tun_set("LOG_FORMAT", "text") == ST_OK, "--set LOG_FORMAT=text");
    CHECK(st_tun_set("LOG_FORMAT", "xml") == ST_ERR_INVALID_ARG, "LOG_FORMAT takes text|json");
    out = capture(log_text);
    snprintf(want, sizeof want, " INFO  [test] test_log.c:%d plain 42\n", text_line);
    CHECK(dated(out) && strlen(out) > 24 && !strcmp(out + 24, want), "a dated text line:\n  %s", out);
    return st_test_done();
}
