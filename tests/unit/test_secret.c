/* common/base secrets and file reading: SHA-256 and HMAC-SHA256 against FIPS 180-4 / RFC 4231 vectors, the secret
 * file rules (size, regular file, permissions), constant-time compare, rate-limited logging. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "strata/base.h"

static void hex_is(const uint8_t *d, const char *want, const char *what) {
    char h[65];
    st_hex(d, 32, h);
    CHECK(strcmp(h, want) == 0, "%s: %s", what, h);
}

int main(void) {
    uint8_t d[32];
    st_sha256("abc", 3, d);
    hex_is(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256(abc)");
    st_sha256("", 0, d);
    hex_is(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256()");
    const char *m56 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    st_sha256(m56, strlen(m56), d);
    hex_is(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "sha256(448 bits)");
    /* RFC 4231 test cases 2 and 6 (key longer than a block) */
    st_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, d);
    hex_is(d, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", "hmac case 2");
    uint8_t k131[131];
    memset(k131, 0xaa, sizeof k131);
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    st_hmac_sha256(k131, sizeof k131, m6, strlen(m6), d);
    hex_is(d, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", "hmac case 6");

    CHECK(st_ct_equal("abcd", "abcd", 4) == 1, "equal");
    CHECK(st_ct_equal("abcd", "abce", 4) == 0, "differ");

    const char *tmp = getenv("STRATA_TEST_TMP") ? getenv("STRATA_TEST_TMP") : "/tmp";
    char path[512];
    snprintf(path, sizeof path, "%s/secret.%d", tmp, (int)getpid());
    st_secret_t s1, s2;
    CHECK(st_secret_generate_file(path) == ST_OK, "generate");
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "mode 0600");
    CHECK(st_secret_load(path, &s1) == ST_OK && s1.len == 64, "load %zu", s1.len);
    CHECK(st_secret_generate_file(path) == ST_OK && st_secret_load(path, &s2) == ST_OK, "regenerate");
    CHECK(!(s1.len == s2.len && memcmp(s1.key, s2.key, s1.len) == 0), "two secrets differ");
    char t1[65], t2[65];
    st_secret_token(&s1, "grpc", t1);
    st_secret_token(&s1, "ucx", t2);
    CHECK(strlen(t1) == 64 && strcmp(t1, t2) != 0, "tokens per purpose");
    chmod(path, 0622);
    CHECK(st_secret_load(path, &s2) == ST_ERR_CONFIG, "writable by others refused");
    int fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0 && write(fd, "short\n", 6) == 6, "write");
    close(fd);
    chmod(path, 0600);
    CHECK(st_secret_load(path, &s2) == ST_ERR_CONFIG, "too short refused");
    unlink(path);
    CHECK(st_secret_load(path, &s2) == ST_ERR_IO, "missing");
    CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    CHECK(st_secret_load(path, &s2) == ST_ERR_CONFIG, "a FIFO is refused without blocking");
    unlink(path);
    CHECK(st_secret_load(tmp, &s2) == ST_ERR_CONFIG, "a directory is refused");

    /* st_file_read_all (API key files, ready files): a FIFO or a directory is refused, not waited on */
    char *txt = NULL;
    CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    CHECK(st_file_read_all(path, &txt, NULL) == ST_ERR_IO && !txt, "a FIFO is refused without blocking");
    unlink(path);
    CHECK(st_file_read_all(tmp, &txt, NULL) == ST_ERR_IO && !txt, "a directory is refused");
    size_t n = 0;
    CHECK(st_file_write_all(path, "abc", 3) == ST_OK && st_file_read_all(path, &txt, &n) == ST_OK && n == 3 &&
              !strcmp(txt, "abc"),
          "a regular file is read");
    free(txt);
    unlink(path);

    st_log_rl_t rl = {0};
    uint64_t sup = 99;
    int passed = 0;
    for (int i = 0; i < 1000; i++) passed += st_log_rl_pass(&rl, 60.0, &sup);
    CHECK(passed == 1 && sup == 0, "one line per interval (%d)", passed);
    return st_test_done();
}
