/* Expert placement: coverage with R replicas, balance, order independence, minimal movement when
 * a server dies, capacity shortfall reported, a re-registered server keeps its experts. */
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
    st_place_server_t s3[3] = {{10, 0}, {20, 0}, {30, 0}};
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
    st_place_server_t s3r[3] = {{30, 0}, {10, 0}, {20, 0}};
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
    st_place_server_t s2[2] = {{10, 0}, {30, 0}};
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
    st_place_server_t s1[1] = {{30, 0}};
    CHECK(st_placement_update(&p, s1, 1) == ST_OK && st_placement_complete(&p), "one server: complete with R=1");
    /* no server: incomplete */
    CHECK(st_placement_update(&p, NULL, 0) == ST_OK && !st_placement_complete(&p), "no servers: incomplete");
    /* capacity shortfall is an error, map filled as far as possible */
    st_place_server_t small[2] = {{1, 10}, {2, 10}};
    CHECK(st_placement_update(&p, small, 2) == ST_ERR_CAPACITY, "capacity shortfall reported");
    CHECK(st_placement_count(&p, 1) == 10 && st_placement_count(&p, 2) == 10, "filled up to capacity");
    CHECK(st_placement_init(&q, 2, 4, 0) == ST_ERR_INVALID_ARG, "R=0 rejected");
    /* servers joining one by one end up balanced (R=1), moving only what must move */
    st_placement_t j;
    st_placement_init(&j, 3, 16, 1);
    st_place_server_t one[1] = {{5, 0}}, two[2] = {{5, 0}, {6, 0}}, three[3] = {{5, 0}, {6, 0}, {7, 0}};
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
    st_place_server_t three2[3] = {{5, 0}, {60, 0}, {7, 0}};
    jv = j.version;
    CHECK(st_placement_update(&j, three2, 3) == ST_OK && j.version == jv, "update after rename: nothing moves");
    CHECK(st_placement_rename(&j, 99, 100) == 0 && j.version == jv, "renaming an unknown server changes nothing");
    st_placement_cleanup(&j);
    st_placement_cleanup(&p);
    return st_test_done();
}
