/* The cluster secret and the primitives that prove it: SHA-256 and HMAC-SHA256 (FIPS 180-4,
 * RFC 2104), OS randomness, constant-time comparison. Self-contained: base wraps no library. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/base.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

typedef struct {
    uint32_t h[8];
    uint8_t blk[64];
    size_t fill;
    uint64_t total;
} sha_t;

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(sha_t *c, const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g, g = f, f = e, e = d + t1, d = cc, cc = b, b = a, a = t1 + t2;
    }
    c->h[0] += a, c->h[1] += b, c->h[2] += cc, c->h[3] += d, c->h[4] += e, c->h[5] += f, c->h[6] += g, c->h[7] += h;
}

static void sha_init(sha_t *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->fill = 0;
    c->total = 0;
}

static void sha_update(sha_t *c, const void *msg, size_t n) {
    const uint8_t *p = msg;
    c->total += n;
    while (n) {
        size_t k = ST_MIN(n, 64 - c->fill);
        memcpy(c->blk + c->fill, p, k);
        c->fill += k, p += k, n -= k;
        if (c->fill == 64) {
            sha_block(c, c->blk);
            c->fill = 0;
        }
    }
}

static void sha_final(sha_t *c, uint8_t out[32]) {
    uint64_t bits = c->total * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    sha_update(c, &pad, 1);
    while (c->fill != 56) sha_update(c, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(c, len, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24), out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8), out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

void st_sha256(const void *msg, size_t len, uint8_t out[32]) {
    sha_t c;
    sha_init(&c);
    sha_update(&c, msg, len);
    sha_final(&c, out);
}

void st_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]) {
    uint8_t k[64] = {0}, pad[64], inner[32];
    if (klen > 64) st_sha256(key, klen, k);
    else if (klen) memcpy(k, key, klen);
    sha_t c;
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, msg, mlen);
    sha_final(&c, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, inner, 32);
    sha_final(&c, out);
}

void st_hex(const void *in, size_t n, char *out) {
    static const char d[] = "0123456789abcdef";
    const uint8_t *p = in;
    for (size_t i = 0; i < n; i++) out[2 * i] = d[p[i] >> 4], out[2 * i + 1] = d[p[i] & 15];
    out[2 * n] = 0;
}

void st_secret_token(const st_secret_t *s, const char *purpose, char out[65]) {
    uint8_t mac[32];
    st_hmac_sha256(s->key, s->len, purpose, strlen(purpose), mac);
    st_hex(mac, 32, out);
}

int st_ct_equal(const void *a, const void *b, size_t n) {
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++) d |= x[i] ^ y[i];
    return d == 0;
}

st_status_t st_random_bytes(void *buf, size_t n) {
    uint8_t *p = buf;
    while (n) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return ST_FAIL(ST_ERR_IO, "getrandom: %s", strerror(errno));
        }
        p += k, n -= (size_t)k;
    }
    return ST_OK;
}

st_status_t st_secret_load(const char *path, st_secret_t *out) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* NONBLOCK: a FIFO must not hang us */
    if (fd < 0) return ST_FAIL(ST_ERR_IO, "cluster secret %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ST_FAIL(ST_ERR_CONFIG, "cluster secret %s: not a regular file", path);
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        close(fd);
        return ST_FAIL(ST_ERR_CONFIG, "cluster secret %s: writable by others (chmod 600 it)", path);
    }
    if (st.st_mode & (S_IRGRP | S_IROTH))
        st_log_warn("cluster secret %s is readable by others (chmod 600 it)", path);
    uint8_t buf[ST_SECRET_MAX + 64];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n < 0) return ST_FAIL(ST_ERR_IO, "cluster secret %s: %s", path, strerror(errno));
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) n--;
    if (n < 32 || n > ST_SECRET_MAX)
        return ST_FAIL(ST_ERR_CONFIG, "cluster secret %s: %zd bytes, need 32..%d", path, n, ST_SECRET_MAX);
    memcpy(out->key, buf, (size_t)n);
    out->len = (size_t)n;
    return ST_OK;
}

st_status_t st_secret_generate_file(const char *path) {
    uint8_t r[32];
    char hex[66], tmp[4096];
    st_status_t s = st_random_bytes(r, sizeof r);
    if (s != ST_OK) return s;
    st_hex(r, sizeof r, hex);
    hex[64] = '\n', hex[65] = 0;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return ST_FAIL(ST_ERR_INVALID_ARG, "secret path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return ST_FAIL(ST_ERR_IO, "%s: %s", tmp, strerror(errno));
    ssize_t w = write(fd, hex, 65);
    if (close(fd) != 0 || w != 65 || rename(tmp, path) != 0) {
        unlink(tmp);
        return ST_FAIL(ST_ERR_IO, "cannot write the cluster secret %s: %s", path, strerror(errno));
    }
    return ST_OK;
}

int st_sec_opts_parse(st_sec_opts_t *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--set")) return st_tun_parse_flag(argc, argv, i); /* the configuration table's flag */
    if (!strcmp(a, "--insecure")) return o->insecure = 1;
    if (!strcmp(a, "--tls")) return o->tls = 1;
    static const char *const names[] = {"--cluster-secret-file", "--tls-cert", "--tls-key", "--tls-ca"};
    const char **const dst[] = {&o->secret_file, &o->tls_cert, &o->tls_key, &o->tls_ca};
    return st_parse_str_flag(names, dst, sizeof names / sizeof *names, argc, argv, i);
}

st_status_t st_sec_opts_finish(st_sec_opts_t *o, const char *role) {
    st_status_t ts = st_tun_load(); /* every role's flags are parsed by now: the table is final */
    if (ts != ST_OK) return ts;
    st_tun_log(role);
    if (!o->secret_file) {
        const char *e = st_tun_str(ST_TUN_CLUSTER_SECRET_FILE);
        if (*e) o->secret_file = e;
    }
    if (!!o->tls_cert != !!o->tls_key)
        return ST_FAIL(ST_ERR_CONFIG, "%s: --tls-cert and --tls-key go together", role);
    if (o->tls_cert || o->tls_ca) o->tls = 1;
    if (o->secret_file) {
        st_status_t s = st_secret_load(o->secret_file, &o->secret);
        if (s != ST_OK) return s;
        o->have_secret = 1;
        st_secret_token(&o->secret, "strata-grpc-v1", o->grpc_token);
        return ST_OK;
    }
    if (!o->insecure)
        return ST_FAIL(ST_ERR_CONFIG,
                       "%s: no cluster secret: pass --cluster-secret-file F (strata up writes one; on Kubernetes mount "
                       "a Secret) or STRATA_CLUSTER_SECRET_FILE, or --insecure to run without cluster authentication",
                       role);
    st_log_warn("%s: --insecure: the control and data planes accept anyone who can reach them", role);
    return ST_OK;
}
