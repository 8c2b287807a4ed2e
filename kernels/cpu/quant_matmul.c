/* quant_matmul_f32: one quantized Linear, y = x W^T (+ bias), any number of rows, W packed as quant.h
 * lays it out (int8 per channel or int4 group-wise); the rows are quantized to int8 once, then the
 * packed tiles are split over num_threads pthreads when W is large enough to pay for them.
 * quant_rows_f32: the activation quantization alone (what the tests check against the reference).
 * Built by kernels/cpu/build.py with -O3 -march=native.
 */
#include <stdint.h>
#include <stdlib.h>

#include "quant.h"
#include "threads.h"

#define MIN_BYTES_PER_THREAD (1 << 18) /* packed weight bytes below which a thread costs more than it saves */

typedef struct {
    const QMatrix *w;
    const float *bias;
    const QRows *x;
    float *y;
    int64_t ys, lo, hi;
} QuantTask;

static void *quant_task(void *arg) {
    const QuantTask *t = (const QuantTask *)arg;
    qmatrix_rows(t->w, t->bias, t->x, t->y, t->ys, t->lo, t->hi, 0);
    return 0;
}

int quant_pack_width(void) { return QNB; }
int quant_int8_block(void) { return Q8_BLOCK; }
/* 3: AVX-512 VNNI, 2: AVX-VNNI, 1: AVX2, 0: portable C */
int quant_isa(void) { return Q_ISA; }

/* y [M, N] (row stride ys) = x [M, K] (row stride xs) . W^T (+ bias [N], or 0), W given packed (w, scales
 * as quant.h lays them out for `bits` 8 or 4; group: int4's group size, a multiple of 8 dividing K;
 * half_scales: int4 scales in fp16). Returns 0; -1 (nothing done) for arguments out of range, -2 when
 * out of memory. */
int quant_matmul_f32(const uint8_t *w, const void *scales, int64_t bits, int64_t group, int64_t half_scales,
                     const float *bias, int64_t N, int64_t K, const float *x, int64_t xs, int64_t M, float *y,
                     int64_t ys, int64_t num_threads) {
    if (M < 1 || N < 1 || K < 1 || (bits != 8 && bits != 4) || (bits == 4 && (group < 8 || group % 8 || K % group)))
        return -1;
    const QMatrix mat = {w, scales, bits, group, half_scales};
    const int64_t block = qmatrix_block(&mat);
    void *buf = aligned_alloc(64, (size_t)((qrows_bytes(M, K, block) + 63) / 64 * 64));
    if (!buf) return -2;
    QRows rows = qrows_at(buf, M, K, block);
    quantize_rows(x, xs, &rows);
    const int64_t tiles = (N + QNB - 1) / QNB;
    int64_t n = threads_for(N * K * bits / 8, MIN_BYTES_PER_THREAD, num_threads);
    if (n > tiles) n = tiles;
    QuantTask tasks[MAX_THREADS];
    for (int64_t i = 0; i < n; i++) {
        const int64_t lo = tiles * i / n * QNB, hi = i + 1 == n ? N : tiles * (i + 1) / n * QNB;
        tasks[i] = (QuantTask){&mat, bias, &rows, y, ys, lo, hi};
    }
    run_tasks(quant_task, tasks, sizeof(QuantTask), n);
    free(buf);
    return 0;
}

/* q int8 [M, K], scale fp32 [M, nb], sum int32 [M, nb] of x [M, K] (row stride xs) quantized per block
 * of `block` k, nb = ceil(K / block) (quant.h's activation quantization). Returns 0, -2 when out of
 * memory. */
int quant_rows_f32(const float *x, int64_t xs, int64_t M, int64_t K, int64_t block, int8_t *q, float *scale,
                   int32_t *sum) {
    void *buf = aligned_alloc(64, (size_t)((qrows_bytes(M, K, block) + 63) / 64 * 64));
    if (!buf) return -2;
    QRows rows = qrows_at(buf, M, K, block);
    quantize_rows(x, xs, &rows);
    for (int64_t m = 0; m < M; m++) {
        memcpy(q + m * K, rows.q + m * rows.stride, (size_t)K);
        memcpy(scale + m * rows.nb, rows.scale + m * rows.nb, sizeof(float) * (size_t)rows.nb);
        memcpy(sum + m * rows.nb, rows.sum + m * rows.nb, sizeof(int32_t) * (size_t)rows.nb);
    }
    free(buf);
    return 0;
}
