/* gemv_f32: an nn.Linear on a few rows of activations (y = x W^T + bias, M <= GEMV_MAX_ROWS), the
 * weight streamed once (gemv.h); output rows split over num_threads pthreads when W is large enough
 * to pay for them. Built by kernels/cpu/build.py with -O3 -march=native.
 */
#include <stdint.h>

#include "gemv.h"
#include "threads.h"

#define MIN_WEIGHTS_PER_THREAD (1 << 18) /* 1 MB of fp32 weights: below this a thread costs more than it saves */

typedef struct {
    const float *w, *bias, *x;
    float *y;
    int64_t K, xs, M, ys, lo, hi;
} GemvTask;

static void *gemv_task(void *arg) {
    const GemvTask *t = (const GemvTask *)arg;
    gemv_rows(t->w, t->bias, t->K, t->x, t->xs, t->M, t->y, t->ys, t->lo, t->hi);
    return 0;
}

int gemv_max_rows(void) { return GEMV_MAX_ROWS; }

/* y [M, N] (row stride ys) = x [M, K] (row stride xs) . w [N, K]^T (+ bias [N], or 0); returns 0, or
 * -1 (nothing done) when M is outside 1..GEMV_MAX_ROWS. */
int gemv_f32(const float *w, const float *bias, int64_t N, int64_t K, const float *x, int64_t xs, int64_t M, float *y,
             int64_t ys, int64_t num_threads) {
    if (M < 1 || M > GEMV_MAX_ROWS) return -1;
    const int64_t n = threads_for(N * K, MIN_WEIGHTS_PER_THREAD, num_threads);
    GemvTask tasks[MAX_THREADS];
    for (int64_t i = 0; i < n; i++) {
        /* split on multiples of 4 rows, so every thread runs whole tiles */
        const int64_t lo = N * i / n / 4 * 4, hi = i + 1 == n ? N : N * (i + 1) / n / 4 * 4;
        tasks[i] = (GemvTask){w, bias, x, y, K, xs, M, ys, lo, hi};
    }
    run_tasks(gemv_task, tasks, sizeof(GemvTask), n);
    return 0;
}
