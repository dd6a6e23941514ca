/* GLU feed-forward (SPEC §6): dense layers, shared experts and routed experts all use it. */
#include "strata/kernels.h"

size_t st_ffn_ws_floats(int T, const st_weight_t *gate, const st_weight_t *up, const st_weight_t *down) {
    size_t lin = st_linear_ws_floats(gate);
    if (st_linear_ws_floats(up) > lin) lin = st_linear_ws_floats(up);
    if (st_linear_ws_floats(down) > lin) lin = st_linear_ws_floats(down);
    return (size_t)T * (size_t)gate->rows * 3 + lin + 64;
}

void st_ffn(float *y, const float *x, int T, const st_weight_t *gate, const st_weight_t *up,
            const st_weight_t *down, st_act_t act, float b1, float b2, float *ws) {
    size_t n = (size_t)T * (size_t)gate->rows;
    float *g = ws, *u = ws + n, *h = ws + 2 * n, *lin = ws + 3 * n;
    st_linear(g, x, gate, T, lin);
    st_linear(u, x, up, T, lin);
    st_glu(h, g, u, T, gate->rows, gate->rows, act, b1, b2);
    st_linear(y, h, down, T, lin);
}
