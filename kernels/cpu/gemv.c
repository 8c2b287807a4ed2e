/* gemv_f32: an nn.Linear on a few rows of activations (y = x W^T + bias, M <= GEMV_MAX_ROWS), the
 * weight streamed once (gemv.h); output rows split over num_threads pthreads when W is large enough
 * to pay for them. gemv_f16: the same with fp16 weights (raw half bits, widened exactly: half the
 * bytes to stream, the same products). gemm_packed_f32: any number of rows over a weight packed for
 * gemm.h's register tiles (the decode stack's product; the engine's lm_head from 3 rows). Built by
 * kernels/cpu/build.py with -O3 -march=native.
 */
#include <stdint.h>

#include <math.h>

#include "gemm.h"
#include "gemv.h"
#include "threads.h"

#define MIN_WEIGHTS_PER_THREAD (1 << 18) /* 1 MB of fp32 weights: below this a thread costs more than it saves */

/* One thread's share of y = x . w^T (+ bias): weight rows (y's columns) lo..hi-1 for all M rows of x;
 * w fp32, or fp16 raw half bits with half; [N, K] for gemv_task, packed (gemm.h) for packed_task. */
typedef struct {
    const void *w;
    const float *bias, *x;
    float *y;
    int64_t K, xs, M, ys, lo, hi, half;
} RowsTask;

static void *gemv_task(void *arg) {
    const RowsTask *t = (const RowsTask *)arg;
    if (t->half)
        gemv_rows_h((const uint16_t *)t->w, t->bias, t->K, t->x, t->xs, t->M, t->y, t->ys, t->lo, t->hi);
    else
        gemv_rows((const float *)t->w, t->bias, t->K, t->x, t->xs, t->M, t->y, t->ys, t->lo, t->hi);
    return 0;
}

static int gemv_any(const void *w, int64_t half, const float *bias, int64_t N, int64_t K, const float *x, int64_t xs,
                    int64_t M, float *y, int64_t ys, int64_t num_threads) {
    if (M < 1 || M > GEMV_MAX_ROWS) return -1;
    const int64_t n = threads_for(N * K, MIN_WEIGHTS_PER_THREAD, num_threads);
    RowsTask tasks[MAX_THREADS];
    for (int64_t i = 0; i < n; i++) {
        /* split on multiples of 4 rows, so every thread runs whole tiles */
        const int64_t lo = N * i / n / 4 * 4, hi = i + 1 == n ? N : N * (i + 1) / n / 4 * 4;
        tasks[i] = (RowsTask){w, bias, x, y, K, xs, M, ys, lo, hi, half};
    }
    run_tasks(gemv_task, tasks, sizeof(RowsTask), n);
    return 0;
}

int gemv_max_rows(void) { return GEMV_MAX_ROWS; }

/* y [M, N] (row stride ys) = x [M, K] (row stride xs) . w [N, K]^T (+ bias [N], or 0); returns 0, or
 * -1 (nothing done) when M is outside 1..GEMV_MAX_ROWS. */
int gemv_f32(const float *w, const float *bias, int64_t N, int64_t K, const float *x, int64_t xs, int64_t M, float *y,
             int64_t ys, int64_t num_threads) {
    return gemv_any(w, 0, bias, N, K, x, xs, M, y, ys, num_threads);
}

/* gemv_f32 with w fp16 [N, K] (raw half bits). */
int gemv_f16(const uint16_t *w, const float *bias, int64_t N, int64_t K, const float *x, int64_t xs, int64_t M,
             float *y, int64_t ys, int64_t num_threads) {
    return gemv_any(w, 1, bias, N, K, x, xs, M, y, ys, num_threads);
}

static void *packed_task(void *arg) {
    const RowsTask *t = (const RowsTask *)arg;
    if (t->half)
        gemm_packed_h((const uint16_t *)t->w, t->bias, t->K, t->x, t->xs, t->M, t->y, t->ys, t->lo, t->hi, 0);
    else
        gemm_packed((const float *)t->w, t->bias, t->K, t->x, t->xs, t->M, t->y, t->ys, t->lo, t->hi, 0);
    return 0;
}

int gemm_pack_width(void) { return GEMM_NB; }

/* y [M, N] (row stride ys) = x [M, K] (row stride xs) . w^T (+ bias [N], or 0) for any M >= 1, w [N, K]
 * given packed as [ceil(N / GEMM_NB)][K][GEMM_NB] (fp32, or fp16 raw half bits with half); whole tiles
 * split over num_threads. Returns 0, or -1 when M < 1. */
int gemm_packed_f32(const void *packed, int64_t half, const float *bias, int64_t N, int64_t K, const float *x,
                    int64_t xs, int64_t M, float *y, int64_t ys, int64_t num_threads) {
    if (M < 1) return -1;
    const int64_t tiles = (N + GEMM_NB - 1) / GEMM_NB;
    int64_t n = threads_for(N * K, MIN_WEIGHTS_PER_THREAD, num_threads);
    if (n > tiles) n = tiles;
    RowsTask tasks[MAX_THREADS];
    for (int64_t i = 0; i < n; i++) {
        const int64_t lo = tiles * i / n * GEMM_NB, hi = i + 1 == n ? N : tiles * (i + 1) / n * GEMM_NB;
        tasks[i] = (RowsTask){packed, bias, x, y, K, xs, M, ys, lo, hi, half};
    }
    run_tasks(packed_task, tasks, sizeof(RowsTask), n);
    return 0;
}

/* The sum of n floats, read once in order with 4 vector accumulators: the rate a single core streams
 * memory at, the bound gemv_f32 is measured against (bench/step_overhead.py --batch1-medium). */
float stream_read_f32(const float *a, int64_t n) {
    vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    const int64_t nv = n - n % (4 * LANES);
    int64_t i = 0;
    for (; i < nv; i += 4 * LANES) {
        s0 += load(a + i);
        s1 += load(a + i + LANES);
        s2 += load(a + i + 2 * LANES);
        s3 += load(a + i + 3 * LANES);
    }
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i];
    return hsum(s0 + s1 + s2 + s3) + tail;
}

/* For each of `rows` rows of n logits (row stride n): the argmax (the first of equal maxima, as
 * torch's and numpy's) into token[r] and its softmax probability 1 / sum(e^(x - max)) into prob[r]:
 * a draft model's greedy token and its confidence, straight after its lm_head GEMV (in C: numpy's
 * ufuncs cost several times this when the step has just evicted them from the caches). */
void top1_f32(const float *x, int64_t rows, int64_t n, int64_t *token, float *prob) {
    for (int64_t r = 0; r < rows; r++) top1_row(x + r * n, n, token + r, prob + r);
}
