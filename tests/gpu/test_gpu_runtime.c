/* common/gpu's plumbing (strata/gpu.h): stream-ordered copies of every kind and memset through pinned
 * mapped host memory, ordering events between two streams (the second stream's copy sees the first's
 * memset only because it waits), event done/sync, timing events, a captured graph replayed twice, and
 * CUDA's errors coming back as ST_ERR_DEVICE with CUDA's own text. */
#include <string.h>

#include "gpu_test.h"

#define N 4096 /* bytes */

static void copies_and_events(void) {
    st_gpu_stream_t s2;
    GT_OK(st_gpu_stream_create(&s2));
    uint8_t *h = NULL, *back = NULL, *d1 = gt_dev(N), *d2 = gt_dev(N);
    GT_OK(st_gpu_host_alloc((void **)&h, N));
    GT_OK(st_gpu_host_alloc((void **)&back, N));
    for (int i = 0; i < N; i++) h[i] = (uint8_t)(i * 7 + 1);
    /* H2D, D2D, D2H on one stream: a round trip */
    GT_OK(st_gpu_memcpy_async(&gt_stream, d1, h, N, ST_GPU_COPY_H2D));
    GT_OK(st_gpu_memcpy_async(&gt_stream, d2, d1, N, ST_GPU_COPY_D2D));
    memset(back, 0, N);
    GT_OK(st_gpu_memcpy_async(&gt_stream, back, d2, N, ST_GPU_COPY_D2H));
    GT_OK(st_gpu_stream_sync(&gt_stream));
    CHECK(memcmp(back, h, N) == 0, "H2D -> D2D -> D2H round trip");
    GT_OK(st_gpu_memcpy_async(&gt_stream, back, d2, 0, ST_GPU_COPY_D2H));
    CHECK(st_gpu_memcpy_async(&gt_stream, back, d2, N, (st_gpu_copy_t)3) == ST_ERR_INVALID_ARG, "unknown copy kind");

    /* ordering: stream 1 sets d1 to 0x5a after a long queue of copies; stream 2 waits for its event, then
     * copies d1 back. Without the wait the copy could see the old bytes. */
    void *ev = NULL;
    GT_OK(st_gpu_event_create(&ev));
    for (int i = 0; i < 64; i++) GT_OK(st_gpu_memcpy_async(&gt_stream, d2, d1, N, ST_GPU_COPY_D2D));
    GT_OK(st_gpu_memset_async(&gt_stream, d1, 0x5a, N));
    GT_OK(st_gpu_event_record(ev, &gt_stream));
    GT_OK(st_gpu_stream_wait(&s2, ev));
    GT_OK(st_gpu_memcpy_async(&s2, back, d1, N, ST_GPU_COPY_D2H));
    GT_OK(st_gpu_stream_sync(&s2));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += back[i] != 0x5a;
    CHECK(bad == 0, "stream 2 waited for stream 1's memset (%d bytes differ)", bad);
    GT_OK(st_gpu_event_sync(ev));
    CHECK(st_gpu_event_done(ev), "event done after its sync");

    /* timing events: elapsed time of a recorded pair is ≥ 0; an unrecorded pair gives -1 */
    void *tev[2] = {NULL, NULL};
    GT_OK(st_gpu_events_create(tev, 2));
    GT_OK(st_gpu_event_record(tev[0], &gt_stream));
    GT_OK(st_gpu_memset_async(&gt_stream, d2, 0, N));
    GT_OK(st_gpu_event_record(tev[1], &gt_stream));
    GT_OK(st_gpu_event_sync(tev[1]));
    double ms = st_gpu_event_elapsed_ms(tev[0], tev[1]);
    CHECK(ms >= 0 && ms < 1000, "elapsed %.4f ms", ms);
    void *fresh[2] = {NULL, NULL};
    GT_OK(st_gpu_events_create(fresh, 2));
    CHECK(st_gpu_event_elapsed_ms(fresh[0], fresh[1]) == -1.0, "unrecorded events give -1");
    CHECK(st_gpu_event_elapsed_ms(ev, ev) == -1.0, "an ordering event has no timing");
    st_gpu_events_destroy(fresh, 2);
    st_gpu_events_destroy(tev, 2);
    CHECK(tev[0] == NULL && tev[1] == NULL, "destroy clears the handles");
    st_gpu_events_destroy(&ev, 1);
    CHECK(ev == NULL, "an ordering event destroyed as an array of one");
    st_gpu_events_destroy(tev, 2); /* NULL entries are fine */

    /* a graph: memset + copies captured once, replayed twice with new host input in between */
    void *exec = NULL;
    GT_OK(st_gpu_capture_begin(&gt_stream));
    GT_OK(st_gpu_memset_async(&gt_stream, d2, 0, N));
    GT_OK(st_gpu_memcpy_async(&gt_stream, d2, h, N / 2, ST_GPU_COPY_H2D));
    GT_OK(st_gpu_memcpy_async(&gt_stream, back, d2, N, ST_GPU_COPY_D2H));
    GT_OK(st_gpu_capture_end(&gt_stream, &exec));
    CHECK(exec != NULL, "graph instantiated");
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) h[i] = (uint8_t)(i + 3 * round + 1), back[i] = 0xee;
        GT_OK(st_gpu_graph_launch(exec, &gt_stream));
        GT_OK(st_gpu_stream_sync(&gt_stream));
        int wrong = 0;
        for (int i = 0; i < N; i++) wrong += back[i] != (i < N / 2 ? h[i] : 0);
        CHECK(wrong == 0, "graph replay %d: %d bytes wrong", round, wrong);
    }
    st_gpu_graph_destroy(exec);
    st_gpu_graph_destroy(NULL);

    /* CUDA's errors: a copy to a bogus device address fails with the runtime's text */
    st_status_t rc = st_gpu_memcpy_async(&gt_stream, (void *)(uintptr_t)0x10, d1, N, ST_GPU_COPY_D2D);
    if (rc == ST_OK) rc = st_gpu_stream_sync(&gt_stream);
    CHECK(rc == ST_ERR_DEVICE && strstr(st_err_last(), "CUDA error") != NULL, "bad copy: %d '%s'", rc,
          st_err_last());

    st_gpu_host_free(h);
    st_gpu_host_free(back);
    st_gpu_host_free(NULL);
    st_gpu_free(d1);
    st_gpu_free(d2);
    st_gpu_stream_destroy(&s2);
}

int main(void) {
    gt_init_or_skip("test_gpu_runtime");
    copies_and_events();
    return st_test_done();
}
