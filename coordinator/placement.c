/* Expert placement (see placement.h). */
#include <stdlib.h>

#include "placement.h"

st_status_t st_placement_init(st_placement_t *p, int n_layers, int n_experts, int replicas) {
    memset(p, 0, sizeof *p);
    if (n_layers < 0 || n_experts <= 0 || replicas < 1 || replicas > ST_PLACE_MAX_REPLICAS)
        return ST_FAIL(ST_ERR_INVALID_ARG, "placement: %d layers × %d experts × %d replicas", n_layers, n_experts, replicas);
    p->holder = calloc((size_t)n_layers * (size_t)n_experts * (size_t)replicas + 1, sizeof(uint64_t));
    if (!p->holder) return ST_FAIL(ST_ERR_NO_MEMORY, "placement map");
    p->n_layers = n_layers;
    p->n_experts = n_experts;
    p->replicas = replicas;
    return ST_OK;
}

void st_placement_cleanup(st_placement_t *p) {
    free(p->holder);
    memset(p, 0, sizeof *p);
}

int st_placement_count(const st_placement_t *p, uint64_t server) {
    int n = 0;
    size_t tot = (size_t)p->n_layers * (size_t)p->n_experts * (size_t)p->replicas;
    for (size_t i = 0; i < tot; i++) n += p->holder[i] == server;
    return n;
}

int st_placement_rename(st_placement_t *p, uint64_t from, uint64_t to) {
    if (from == 0 || to == 0 || from == to) return 0;
    size_t tot = (size_t)p->n_layers * (size_t)p->n_experts * (size_t)p->replicas;
    int n = 0;
    for (size_t i = 0; i < tot; i++)
        if (p->holder[i] == from) {
            p->holder[i] = to;
            n++;
        }
    if (n) p->version++;
    return n;
}

bool st_placement_complete(const st_placement_t *p) {
    for (int l = 0; l < p->n_layers; l++)
        for (int e = 0; e < p->n_experts; e++)
            if (st_placement_holders(p, l, e)[0] == 0) return false;
    return true;
}

static int cmp_server(const void *a, const void *b) {
    uint64_t x = ((const st_place_server_t *)a)->id, y = ((const st_place_server_t *)b)->id;
    return x < y ? -1 : x > y;
}

st_status_t st_placement_update(st_placement_t *p, const st_place_server_t *live_in, int n_live) {
    size_t tot = (size_t)p->n_layers * (size_t)p->n_experts;
    int R = p->replicas;
    st_place_server_t *live = malloc(sizeof *live * (size_t)(n_live + 1));
    int *load = calloc((size_t)n_live + 1, sizeof(int));
    if (!live || !load) {
        free(live);
        free(load);
        return ST_FAIL(ST_ERR_NO_MEMORY, "placement update");
    }
    if (n_live > 0) memcpy(live, live_in, sizeof *live * (size_t)n_live);
    qsort(live, (size_t)n_live, sizeof *live, cmp_server); /* order-independent result */
    bool changed = false;
    /* 1. drop holders that are gone; compact each expert's list */
    for (size_t i = 0; i < tot; i++) {
        uint64_t *h = p->holder + i * (size_t)R;
        int k = 0;
        for (int r = 0; r < R; r++) {
            int found = -1;
            for (int s = 0; s < n_live && h[r]; s++)
                if (live[s].id == h[r]) found = s;
            if (found >= 0) {
                h[k++] = h[r];
                load[found]++;
            } else if (h[r]) {
                changed = true;
            }
        }
        for (int r = k; r < R; r++) h[r] = 0;
    }
    /* 2. fill holes: least-loaded live server with room that does not hold it yet (ties: lowest
     * id); layer-major order spreads each layer's experts evenly over the servers */
    int want = R < n_live ? R : n_live;
    bool short_cap = false;
    for (size_t i = 0; i < tot; i++) {
        uint64_t *h = p->holder + i * (size_t)R;
        for (int r = 0; r < want; r++) {
            if (h[r]) continue;
            int best = -1;
            for (int s = 0; s < n_live; s++) {
                bool holds = false;
                for (int q = 0; q < r; q++) holds |= h[q] == live[s].id;
                if (holds || (live[s].capacity && (uint32_t)load[s] >= live[s].capacity)) continue;
                if (best < 0 || load[s] < load[best]) best = s;
            }
            if (best < 0) {
                short_cap = true;
                break;
            }
            h[r] = live[best].id;
            load[best]++;
            changed = true;
        }
    }
    /* 3. rebalance (a server joined, or holes were filled unevenly): move single assignments from
     * the most to the least loaded server until loads differ by at most one; deterministic */
    for (int guard = 0; n_live > 1 && guard < (int)(tot * R); guard++) {
        int hi = 0, lo = 0;
        for (int s = 1; s < n_live; s++) {
            if (load[s] > load[hi]) hi = s;
            if (load[s] < load[lo]) lo = s;
        }
        if (load[hi] - load[lo] <= 1) break;
        int moved = 0;
        for (size_t i = 0; i < tot && !moved; i++) {
            uint64_t *h = p->holder + i * (size_t)R;
            int has_lo = 0, r_hi = -1;
            for (int r = 0; r < R; r++) {
                has_lo |= h[r] == live[lo].id;
                if (h[r] == live[hi].id) r_hi = r;
            }
            if (r_hi < 0 || has_lo || (live[lo].capacity && (uint32_t)load[lo] >= live[lo].capacity)) continue;
            h[r_hi] = live[lo].id;
            load[hi]--;
            load[lo]++;
            moved = changed = true;
        }
        if (!moved) break;
    }
    if (changed || p->version == 0) p->version++;
    free(live);
    free(load);
    if (short_cap)
        return ST_FAIL(ST_ERR_CAPACITY, "placement: live expert servers cannot hold %d layers × %d experts × %d replicas",
                       p->n_layers, p->n_experts, want);
    return ST_OK;
}
