/* Expert placement: coverage with R replicas, balance, order independence, minimal movement when
 * a server dies, capacity shortfall reported, a re-registered server keeps its experts; at K3 shape
 * (92 x 896, R 2, 64 servers on 8 hosts, joining one by one): replicas on distinct hosts, per-layer
 * and total balance within one, each update and the republish after a loss under 1 s (issue 16). */
#include <stdlib.h>

#include "harness.h"
#include "placement.h"

static int holders(const st_placement_t *p, int l, int e) {
    int k = 0;
    for (int r = 0; r < p->replicas; r++) k += st_placement_holders(p, l, e)[r] != 0;
    return k;
}

int main(void) {
    st_placement_t p;
    CHECK(st_placement_init(&p, 7, 16, 2) == ST_OK, "init");
    st_place_server_t s3[3] = {{10, 0, 0}, {20, 0, 0}, {30, 0, 0}};
    CHECK(st_placement_update(&p, s3, 3) == ST_OK, "update 3 servers");
    CHECK(st_placement_complete(&p), "complete");
    int ok = 1;
    for (int l = 0; l < 7; l++)
        for (int e = 0; e < 16; e++) {
            const uint64_t *h = st_placement_holders(&p, l, e);
            ok &= holders(&p, l, e) == 2 && h[0] != h[1];
        }
    CHECK(ok, "every expert on 2 distinct servers");
    int c10 = st_placement_count(&p, 10), c20 = st_placement_count(&p, 20), c30 = st_placement_count(&p, 30);
    CHECK(c10 + c20 + c30 == 7 * 16 * 2 && abs(c10 - c20) <= 1 && abs(c20 - c30) <= 1, "balanced %d %d %d", c10, c20, c30);
    uint64_t v1 = p.version;
    CHECK(v1 >= 1, "version set");
    /* same servers in another order: nothing changes */
    st_place_server_t s3r[3] = {{30, 0, 0}, {10, 0, 0}, {20, 0, 0}};
    CHECK(st_placement_update(&p, s3r, 3) == ST_OK && p.version == v1, "no change, same version");
    /* independent map built from the reversed order equals it */
    st_placement_t q;
    st_placement_init(&q, 7, 16, 2);
    st_placement_update(&q, s3r, 3);
    CHECK(memcmp(p.holder, q.holder, sizeof(uint64_t) * 7 * 16 * 2) == 0, "order independent");
    st_placement_cleanup(&q);
    /* server 20 dies: only its assignments move */
    uint64_t before[7 * 16 * 2];
    memcpy(before, p.holder, sizeof before);
    st_place_server_t s2[2] = {{10, 0, 0}, {30, 0, 0}};
    CHECK(st_placement_update(&p, s2, 2) == ST_OK && p.version == v1 + 1, "republished");
    int kept = 1, cover = 1;
    for (int i = 0; i < 7 * 16; i++) {
        for (int r = 0; r < 2; r++) {
            uint64_t b = before[i * 2 + r];
            if (b == 20) continue;
            kept &= p.holder[i * 2] == b || p.holder[i * 2 + 1] == b;
        }
        cover &= p.holder[i * 2] != 0 && p.holder[i * 2 + 1] != 0 && p.holder[i * 2] != 20 && p.holder[i * 2 + 1] != 20;
    }
    CHECK(kept && cover, "survivors keep their experts; lost ones re-placed");
    /* one server left with R=2: every expert once, still complete */
    st_place_server_t s1[1] = {{30, 0, 0}};
    CHECK(st_placement_update(&p, s1, 1) == ST_OK && st_placement_complete(&p), "one server: complete with R=1");
    /* no server: incomplete */
    CHECK(st_placement_update(&p, NULL, 0) == ST_OK && !st_placement_complete(&p), "no servers: incomplete");
    /* capacity shortfall is an error, map filled as far as possible */
    st_place_server_t small[2] = {{1, 10, 0}, {2, 10, 0}};
    CHECK(st_placement_update(&p, small, 2) == ST_ERR_CAPACITY, "capacity shortfall reported");
    CHECK(st_placement_count(&p, 1) == 10 && st_placement_count(&p, 2) == 10, "filled up to capacity");
    CHECK(st_placement_init(&q, 2, 4, 0) == ST_ERR_INVALID_ARG, "R=0 rejected");
    /* servers joining one by one end up balanced (R=1), moving only what must move */
    st_placement_t j;
    st_placement_init(&j, 3, 16, 1);
    st_place_server_t one[1] = {{5, 0, 0}}, two[2] = {{5, 0, 0}, {6, 0, 0}}, three[3] = {{5, 0, 0}, {6, 0, 0}, {7, 0, 0}};
    st_placement_update(&j, one, 1);
    CHECK(st_placement_count(&j, 5) == 48, "first server holds everything");
    st_placement_update(&j, two, 2);
    CHECK(st_placement_count(&j, 5) == 24 && st_placement_count(&j, 6) == 24, "second server takes half");
    st_placement_update(&j, three, 3);
    CHECK(st_placement_count(&j, 5) == 16 && st_placement_count(&j, 6) == 16 && st_placement_count(&j, 7) == 16,
          "third server: balanced 16/16/16");
    /* server 6 re-registers as 60 (a new random id): it keeps exactly its experts, the others stay */
    uint64_t jb[3 * 16];
    memcpy(jb, j.holder, sizeof jb);
    uint64_t jv = j.version;
    CHECK(st_placement_rename(&j, 6, 60) == 16 && j.version == jv + 1, "rename moves 16 assignments, new version");
    int same = 1;
    for (int i = 0; i < 3 * 16; i++) same &= j.holder[i] == (jb[i] == 6 ? 60 : jb[i]);
    CHECK(same, "renamed server holds what it held");
    st_place_server_t three2[3] = {{5, 0, 0}, {60, 0, 0}, {7, 0, 0}};
    jv = j.version;
    CHECK(st_placement_update(&j, three2, 3) == ST_OK && j.version == jv, "update after rename: nothing moves");
    CHECK(st_placement_rename(&j, 99, 100) == 0 && j.version == jv, "renaming an unknown server changes nothing");
    st_placement_cleanup(&j);
    st_placement_cleanup(&p);

    /* fewer hosts than replicas: distinct servers still */
    st_place_server_t onehost[2] = {{1, 0, 7}, {2, 0, 7}};
    st_placement_init(&j, 2, 4, 2);
    CHECK(st_placement_update(&j, onehost, 2) == ST_OK && st_placement_complete(&j) && st_placement_count(&j, 1) == 8 &&
              st_placement_count(&j, 2) == 8, "two servers on one host, R 2: each holds every expert once");
    st_placement_cleanup(&j);

    /* K3 */
    enum { KL = 92, KE = 896, KR = 2, KS = 64, KH = 8 };
    st_place_server_t ks[KS];
    for (int i = 0; i < KS; i++) ks[i] = (st_place_server_t){.id = 1000 + (uint64_t)i * 7919, .capacity = 0, .host = 1 + (uint32_t)(i % KH)};
    CHECK(st_placement_init(&j, KL, KE, KR) == ST_OK, "K3 init");
    double worst = 0;
    for (int n = 1; n <= KS; n++) {
        double t0 = st_time_sec();
        CHECK(st_placement_update(&j, ks, n) == ST_OK, "K3 update with %d servers", n);
        double dt = st_time_sec() - t0;
        worst = dt > worst ? dt : worst;
    }
    CHECK(worst < 1.0, "K3: slowest update (a server joining) %.3f s < 1 s", worst);
    int host_ok = 1;
    for (int l = 0; l < KL; l++)
        for (int e = 0; e < KE; e++) {
            const uint64_t *h = st_placement_holders(&j, l, e);
            uint32_t h0 = (uint32_t)((h[0] - 1000) / 7919 % KH), h1 = (uint32_t)((h[1] - 1000) / 7919 % KH);
            host_ok &= h[0] && h[1] && h0 != h1;
        }
    CHECK(host_ok, "K3: every expert on 2 servers of 2 different hosts");
    uint64_t ids[KS];
    int cnt[KS], lo = 1 << 30, hi = 0;
    for (int i = 0; i < KS; i++) ids[i] = ks[i].id;
    st_placement_counts(&j, ids, KS, cnt);
    for (int i = 0; i < KS; i++) lo = cnt[i] < lo ? cnt[i] : lo, hi = cnt[i] > hi ? cnt[i] : hi;
    CHECK(hi - lo <= 1 && cnt[5] == st_placement_count(&j, ids[5]), "K3: experts per server %d..%d", lo, hi);
    int lay_spread = 0;
    for (int l = 0; l < KL; l++) {
        int c[KS] = {0};
        for (int e = 0; e < KE; e++)
            for (int r = 0; r < KR; r++) c[(st_placement_holders(&j, l, e)[r] - 1000) / 7919]++;
        int a = c[0], b = c[0];
        for (int i = 1; i < KS; i++) a = c[i] < a ? c[i] : a, b = c[i] > b ? c[i] : b;
        lay_spread = b - a > lay_spread ? b - a : lay_spread;
    }
    CHECK(lay_spread <= 1, "K3: within every layer the servers' counts differ by %d <= 1", lay_spread);
    /* server 17 is lost: only its experts move, constraints hold, republished fast */
    uint64_t *kb = malloc(sizeof(uint64_t) * KL * KE * KR);
    memcpy(kb, j.holder, sizeof(uint64_t) * KL * KE * KR);
    st_place_server_t ks2[KS - 1];
    for (int i = 0, k = 0; i < KS; i++)
        if (i != 17) ks2[k++] = ks[i];
    uint64_t kv = j.version;
    double t0 = st_time_sec();
    CHECK(st_placement_update(&j, ks2, KS - 1) == ST_OK && j.version == kv + 1, "K3: republished after a loss");
    double rep = st_time_sec() - t0;
    CHECK(rep < 1.0, "K3: republish %.3f s < 1 s", rep);
    int moved = 0, kept2 = 1;
    host_ok = 1;
    for (int i = 0; i < KL * KE; i++) {
        for (int r = 0; r < KR; r++) {
            uint64_t b = kb[i * KR + r];
            if (b == ks[17].id) continue;
            int found = j.holder[i * KR] == b || j.holder[i * KR + 1] == b;
            kept2 &= found;
        }
        for (int r = 0; r < KR; r++) moved += j.holder[i * KR + r] != kb[i * KR + r] && kb[i * KR + r] == ks[17].id;
        uint64_t a = j.holder[i * KR], b = j.holder[i * KR + 1];
        host_ok &= a && b && a != ks[17].id && b != ks[17].id && (a - 1000) / 7919 % KH != (b - 1000) / 7919 % KH;
    }
    CHECK(kept2 && host_ok, "K3: survivors keep their experts; the lost one's re-placed on distinct hosts");
    CHECK(moved == cnt[17], "K3: exactly the lost server's %d assignments moved (%d)", cnt[17], moved);
    free(kb);
    st_placement_cleanup(&j);
    return st_test_done();
}
