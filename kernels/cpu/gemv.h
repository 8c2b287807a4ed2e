/* Matrix-vector products for a few rows of activations (decode at small batches): y = x W^T (+ bias)
 * with W an nn.Linear weight [N, K] (rows contiguous, K weights apart; fp32, or fp16: gemv_rows_h), x [M, K] for M <= GEMV_MAX_ROWS.
 *
 * At M <= 8 the work is streaming W once: weight row by weight row, strictly in memory order (tiles
 * of several rows are several streams, which the hardware prefetcher follows less well), each vector
 * of a row multiplied with the same K slice of all M rows of x into partial sums summed across lanes
 * once per output. A software prefetch runs GEMV_PREFETCH bytes ahead, one per cache line (sparser
 * prefetches leave gaps the hardware prefetcher fills only on a quiet machine). 8 KB ahead rather
 * than 1 KB: batch-1 decode of the 109 MB bench model 14-27% faster on a Zen 4 VM
 * (bench/step_overhead.py --batch1-medium --baseline-rev REV, REV a tree with 1 KB); 16-32 KB no
 * better. The same command prints the plain vectorized sum over the same bytes (gemv.c's
 * stream_read_f32), the rate these loops approach. Past one row the loop is no longer memory-bound on
 * a core that retires one 512-bit FMA a cycle, and tiles of 2 or 4 weight rows (each x vector loaded
 * once for several rows) do not pay for the second stream they add. Included by gemv.c and
 * decode_stack.c; kernels/cpu/build.py keys its cache on it.
 */
#ifndef FREIGHT_GEMV_H
#define FREIGHT_GEMV_H

#include <math.h>
#include <stdint.h>

#include "simd.h"

#define GEMV_MAX_ROWS 8
#define GEMV_PREFETCH 8192 /* bytes ahead in each weight row */

/* One weight row w (K weights) times M rows of x (xs floats apart) -> y[m * ys] (+ *bias). C
 * independent chains of partial sums per x row (C x M >= 4 keeps the FMA latency hidden at M = 1).
 * SFX: "" for fp32 weights, _h for fp16 ones (raw half bits, widened exactly on load: the same sums). */
#define DEFINE_GEMV_ROW(M, C, SFX, WT, LOADW, WF)                                                      \
    static inline void gemv_row##SFX##_##M(const WT *w, int64_t K, const float *x, int64_t xs, const float *bias, \
                                           float *y, int64_t ys) {                                     \
        vf acc[C][M];                                                                                  \
        for (int c = 0; c < C; c++)                                                                    \
            for (int m = 0; m < M; m++) acc[c][m] = (vf){0};                                           \
        const int64_t kc = K - K % (C * LANES), kv = K - K % LANES;                                    \
        int64_t k = 0;                                                                                 \
        for (; k < kc; k += C * LANES) {                                                               \
            for (int c = 0; c < C; c++) {                                                              \
                __builtin_prefetch((const char *)(w + k + c * LANES) + GEMV_PREFETCH, 0, 3);           \
                const vf wv = LOADW(w + k + c * LANES);                                                \
                for (int m = 0; m < M; m++) acc[c][m] = vfma(wv, load(x + m * xs + k + c * LANES), acc[c][m]); \
            }                                                                                          \
        }                                                                                              \
        for (; k < kv; k += LANES) {                                                                   \
            __builtin_prefetch((const char *)(w + k) + GEMV_PREFETCH, 0, 3);                           \
            const vf wv = LOADW(w + k);                                                                \
            for (int m = 0; m < M; m++) acc[0][m] = vfma(wv, load(x + m * xs + k), acc[0][m]);     \
        }                                                                                              \
        for (int m = 0; m < M; m++) {                                                                  \
            vf total = acc[0][m];                                                                      \
            for (int c = 1; c < C; c++) total += acc[c][m];                                            \
            float s = hsum(total);                                                                     \
            for (int64_t j = kv; j < K; j++) s = __builtin_fmaf(WF(w[j]), x[m * xs + j], s);             \
            y[m * ys] = bias ? s + *bias : s;                                                          \
        }                                                                                              \
    }                                                                                                  \
    static void gemv_rows##SFX##_##M(const WT *w, const float *bias, int64_t K, const float *x, int64_t xs, \
                                     float *y, int64_t ys, int64_t lo, int64_t hi) {                   \
        for (int64_t n = lo; n < hi; n++)                                                              \
            gemv_row##SFX##_##M(w + n * K, K, x, xs, bias ? bias + n : 0, y + n, ys);                  \
    }

#define GEMV_F32(v) (v)
#define DEFINE_GEMV_ROWS(M, C)                                   \
    DEFINE_GEMV_ROW(M, C, , float, load, GEMV_F32)               \
    DEFINE_GEMV_ROW(M, C, _h, uint16_t, load_h, half_to_float)

DEFINE_GEMV_ROWS(1, 4)
DEFINE_GEMV_ROWS(2, 2)
DEFINE_GEMV_ROWS(3, 2)
DEFINE_GEMV_ROWS(4, 1)
DEFINE_GEMV_ROWS(5, 1)
DEFINE_GEMV_ROWS(6, 1)
DEFINE_GEMV_ROWS(7, 1)
DEFINE_GEMV_ROWS(8, 1)

#define GEMV_DISPATCH(SFX)                                                                  \
    switch (M) {                                                                            \
        case 1: gemv_rows##SFX##_1(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        case 2: gemv_rows##SFX##_2(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        case 3: gemv_rows##SFX##_3(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        case 4: gemv_rows##SFX##_4(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        case 5: gemv_rows##SFX##_5(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        case 6: gemv_rows##SFX##_6(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        case 7: gemv_rows##SFX##_7(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        case 8: gemv_rows##SFX##_8(w, bias, K, x, xs, y, ys, lo, hi); break;                \
        default: break;                                                                     \
    }

/* y [M, ys] rows [lo, hi) <- x [M, K] (row stride xs) W^T (+ bias); 1 <= M <= GEMV_MAX_ROWS. */
static void gemv_rows(const float *w, const float *bias, int64_t K, const float *x, int64_t xs, int64_t M, float *y,
                      int64_t ys, int64_t lo, int64_t hi) {
    GEMV_DISPATCH()
}

/* gemv_rows with fp16 weights (raw half bits). */
static void gemv_rows_h(const uint16_t *w, const float *bias, int64_t K, const float *x, int64_t xs, int64_t M,
                        float *y, int64_t ys, int64_t lo, int64_t hi) {
    GEMV_DISPATCH(_h)
}

/* The argmax of n logits (the first of equal maxima, as torch's and numpy's) into *token and its
 * softmax probability 1 / sum(e^(x - max)) into *prob: a draft model's greedy token and its
 * confidence, straight after its lm_head GEMV. */
static inline void top1_row(const float *row, int64_t n, int64_t *token, float *prob) {
    const int64_t nv = n - n % LANES;
    vf mx = (vf){0} - INFINITY;
    for (int64_t i = 0; i < nv; i += LANES) mx = vmax(load(row + i), mx);
    float top = hmax(mx);
    for (int64_t i = nv; i < n; i++) top = row[i] > top ? row[i] : top;
    int64_t best = 0;
    while (row[best] != top) best++; /* the first maximum */
    vf acc = {0};
    int64_t i = 0;
    for (; i < nv; i += LANES) acc += exp_nonpositive(load(row + i) - top);
    float sum = hsum(acc);
    for (; i < n; i++) sum += exp_nonpositive1(row[i] - top);
    *token = best;
    *prob = 1.0f / sum;
}

#endif
