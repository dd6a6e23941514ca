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

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Index of id among the n sorted servers, -1 if absent. */
static int find_server(const st_place_server_t *live, int n, uint64_t id) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int m = (lo + hi) / 2;
        if (live[m].id == id) return m;
        if (live[m].id < id) lo = m + 1;
        else hi = m - 1;
    }
    return -1;
}

void st_placement_counts(const st_placement_t *p, const uint64_t *ids, int n, int *out) {
    for (int i = 0; i < n; i++) out[i] = 0;
    st_place_server_t *s = malloc(sizeof *s * (size_t)(n + 1));
    if (!s) { /* the slow way, still right */
        for (int i = 0; i < n; i++) out[i] = st_placement_count(p, ids[i]);
        return;
    }
    /* NOTE: .capacity carries the caller's index through the sort */
    for (int i = 0; i < n; i++) s[i] = (st_place_server_t){.id = ids[i], .capacity = (uint32_t)i, .host = 0};
    qsort(s, (size_t)n, sizeof *s, cmp_server);
    size_t tot = (size_t)p->n_layers * (size_t)p->n_experts * (size_t)p->replicas;
    for (size_t i = 0; i < tot; i++) {
        int k = p->holder[i] ? find_server(s, n, p->holder[i]) : -1;
        if (k >= 0) out[s[k].capacity]++;
    }
    free(s);
}

typedef struct {
    const st_place_server_t *live;
    int n, L, strict; /* strict: replicas on distinct hosts (there are enough hosts) */
    int *tot;         /* [n] assignments per server */
    int *lay;         /* [n * L] assignments per server and layer */
} plan_t;

static int same_host(const plan_t *w, int a, int b) {
    return a == b || (w->live[a].host && w->live[a].host == w->live[b].host);
}

/* Server s may take replica slot `skip` of this expert (h: server indices of its R slots, -1 none;
 * slot `skip` is the one being filled or moved). */
static int may_hold(const plan_t *w, const int *h, int R, int skip, int s, int strict) {
    if (w->live[s].capacity && (uint32_t)w->tot[s] >= w->live[s].capacity) return 0;
    for (int r = 0; r < R; r++) {
        if (r == skip || h[r] < 0) continue;
        if (h[r] == s || (strict && same_host(w, h[r], s))) return 0;
    }
    return 1;
}

/* The least-loaded server (in layer l, then in total, then lowest id) that may take the slot. */
static int pick(const plan_t *w, const int *h, int R, int skip, int l) {
    for (int strict = w->strict; strict >= 0; strict--) {
        int best = -1;
        for (int s = 0; s < w->n; s++) {
            if (!may_hold(w, h, R, skip, s, strict)) continue;
            if (best < 0 || w->lay[s * w->L + l] < w->lay[best * w->L + l] ||
                (w->lay[s * w->L + l] == w->lay[best * w->L + l] && w->tot[s] < w->tot[best]))
                best = s;
        }
        if (best >= 0) return best;
    }
    return -1;
}

static void assign(plan_t *w, int l, int from, int to) {
    if (from >= 0) w->tot[from]--, w->lay[from * w->L + l]--;
    if (to >= 0) w->tot[to]++, w->lay[to * w->L + l]++;
}

st_status_t st_placement_update(st_placement_t *p, const st_place_server_t *live_in, int n_live) {
    const int L = p->n_layers, E = p->n_experts, R = p->replicas;
    size_t tot = (size_t)L * (size_t)E;
    st_place_server_t *live = malloc(sizeof *live * (size_t)(n_live + 1));
    int *tl = calloc((size_t)n_live + 1, sizeof(int));
    int *lay = calloc((size_t)n_live * (size_t)(L > 0 ? L : 1) + 1, sizeof(int));
    int *idx = malloc(sizeof(int) * tot * (size_t)R + 1); /* holder slots as server indices */
    uint64_t *hosts = malloc(sizeof(uint64_t) * (size_t)(n_live + 1));
    if (!live || !tl || !lay || !idx || !hosts) {
        free(live), free(tl), free(lay), free(idx), free(hosts);
        return ST_FAIL(ST_ERR_NO_MEMORY, "placement update");
    }
    if (n_live > 0) memcpy(live, live_in, sizeof *live * (size_t)n_live);
    qsort(live, (size_t)n_live, sizeof *live, cmp_server); /* order-independent result */
    /* distinct hosts (a server with host 0 is a host of its own) */
    int n_hosts = 0;
    for (int s = 0; s < n_live; s++) hosts[s] = live[s].host ? live[s].host : (1ull << 32) + (uint64_t)s;
    qsort(hosts, (size_t)n_live, sizeof *hosts, cmp_u64);
    for (int s = 0; s < n_live; s++) n_hosts += s == 0 || hosts[s] != hosts[s - 1];
    int want = R < n_live ? R : n_live;
    plan_t w = {.live = live, .n = n_live, .L = L, .strict = n_hosts >= want, .tot = tl, .lay = lay};
    bool changed = false, short_cap = false;
    /* 1. drop holders that are gone, or that share a server (or, with enough hosts, a host) with an
     * earlier replica of the same expert; compact each expert's list */
    for (size_t i = 0; i < tot; i++) {
        uint64_t *h = p->holder + i * (size_t)R;
        int *x = idx + i * (size_t)R, k = 0, l = (int)(i / (size_t)E);
        for (int r = 0; r < R; r++) {
            int s = h[r] ? find_server(live, n_live, h[r]) : -1;
            if (s >= 0 && !may_hold(&w, x, k, -1, s, w.strict)) s = -1;
            if (s < 0) {
                changed |= h[r] != 0;
                continue;
            }
            x[k++] = s;
            assign(&w, l, -1, s);
        }
        for (int r = k; r < R; r++) x[r] = -1;
    }
    /* 2. fill holes: least-loaded server of the layer (then in total) that may hold the expert */
    for (size_t i = 0; i < tot; i++) {
        int *x = idx + i * (size_t)R, l = (int)(i / (size_t)E);
        for (int r = 0; r < want; r++) {
            if (x[r] >= 0) continue;
            int s = pick(&w, x, R, r, l);
            if (s < 0) {
                short_cap = true;
                break;
            }
            x[r] = s;
            assign(&w, l, -1, s);
            changed = true;
        }
    }
    /* 3. rebalance within each layer (a server joined): move an assignment from a server holding
     * >= 2 more of the layer than the least-loaded one that may take it */
    for (int l = 0; l < L && n_live > 1; l++) {
        int mn = lay[l];
        for (int s = 1; s < n_live; s++) mn = lay[s * L + l] < mn ? lay[s * L + l] : mn;
        for (int e = 0; e < E; e++)
            for (int r = 0; r < R; r++) {
                int *x = idx + ((size_t)l * E + e) * (size_t)R, s = x[r];
                if (s < 0 || lay[s * L + l] - mn < 2) continue; /* nobody could take it usefully */
                int t = pick(&w, x, R, r, l);
                if (t < 0 || t == s || lay[s * L + l] - lay[t * L + l] < 2) continue;
                x[r] = t;
                assign(&w, l, s, t);
                changed = true;
                mn = lay[l];
                for (int q = 1; q < n_live; q++) mn = lay[q * L + l] < mn ? lay[q * L + l] : mn;
            }
    }
    /* 4. totals: while two servers differ by >= 2, move one assignment of a layer where the fuller
     * holds more than the emptier (per-layer spread stays within one) */
    for (int guard = 0; n_live > 1 && guard < (int)(tot * (size_t)R); guard++) {
        int hi = 0, lo = 0;
        for (int s = 1; s < n_live; s++) {
            if (tl[s] > tl[hi]) hi = s;
            if (tl[s] < tl[lo]) lo = s;
        }
        if (tl[hi] - tl[lo] <= 1) break;
        int moved = 0;
        for (int l = 0; l < L && !moved; l++) {
            if (lay[hi * L + l] <= lay[lo * L + l]) continue;
            for (int e = 0; e < E && !moved; e++) {
                int *x = idx + ((size_t)l * E + e) * (size_t)R;
                for (int r = 0; r < R && !moved; r++)
                    if (x[r] == hi && may_hold(&w, x, R, r, lo, w.strict)) {
                        x[r] = lo;
                        assign(&w, l, hi, lo);
                        moved = 1;
                    }
            }
        }
        if (!moved) break;
        changed = true;
    }
    /* write back (slot order kept: replicas compacted to the front) */
    for (size_t i = 0; i < tot * (size_t)R; i++) {
        uint64_t id = idx[i] >= 0 ? live[idx[i]].id : 0;
        changed |= p->holder[i] != id;
        p->holder[i] = id;
    }
    if (changed || p->version == 0) p->version++;
    free(live), free(tl), free(lay), free(idx), free(hosts);
    if (short_cap)
        return ST_FAIL(ST_ERR_CAPACITY, "placement: live expert servers cannot hold %d layers × %d experts × %d replicas",
                       p->n_layers, p->n_experts, want);
    return ST_OK;
}
