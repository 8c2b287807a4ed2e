/* The decode stack's types and its matrix product (decode_stack.c, draft_chain.h): a layer's and a
 * model's tensors as the Python side binds them, one call's shared state, and `linear`, which picks
 * a step's product (integer tiles for a quantized matrix; else packed tiles, GEMVs or the caller's
 * sgemm by its rows). */
#ifndef FREIGHT_STACK_STEP_H
#define FREIGHT_STACK_STEP_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "gemm.h"
#include "gemv.h"
#include "quant.h"

/* One decoder layer's tensors; qkv_bias, q_norm and k_norm may be 0 (no bias / no qk-norm). window:
 * the layer's sliding window (its queries read their last `window` keys; 0: the whole context).
 * *_packed: the four matrices packed for gemm.h ([ceil(N / GEMM_NB)][K][GEMM_NB], fp32 or with
 * half_weights fp16), or 0. *_q: the matrix quantized (int8 or int4, packed as quant.h lays it out;
 * its w 0: not quantized); a quantized matrix's fp32 pointers are 0 and its products are quant.h's,
 * on rows quantized to int8 per block of its qmatrix_block. */
typedef struct {
    const float *input_norm, *qkv, *qkv_bias, *q_norm, *k_norm, *o_proj, *post_norm, *gate_up, *down;
    float *k_cache, *v_cache;
    int64_t window;
    const float *qkv_packed, *o_proj_packed, *gate_up_packed, *down_packed;
    QMatrix qkv_q, o_proj_q, gate_up_q, down_q;
} StackLayer;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size, num_slots,
        max_positions, half_weights; /* half_weights: qkv, o_proj, gate_up, down are fp16 (raw half bits) */
    float eps, scale;
    const StackLayer *layers;
    const float *final_norm, *cos_sin;
    int64_t packed;  /* every layer has its *_packed matrices (or *_q ones) */
    int64_t q_block; /* the smallest qmatrix_block of the quantized matrices (the head's too); 0: none is */
    QMatrix head;    /* the lm_head quantized (w 0: not quantized) */
    const float *head_bias; /* [vocab] or 0 */
    int64_t vocab;          /* the head's output rows */
    const void *head_packed; /* or the lm_head packed for gemm.h (fp32, or fp16 with head_half); 0: none.
                              * decode_stack_logits_f32 needs a head, quantized or packed */
    int64_t head_half;
} StackModel;

/* One wrapped projection's LoRA adapters (worker/engine/lora/stacks.py's layout, fp32; S slots of
 * `slices` slices, each padded to the rank R): a [S, slices * R, K] (slice i's A in rows [i R, i R + R)),
 * b [S, N, R] (slice i's B in its output columns [bounds[i], bounds[i + 1])), scaling [S, slices]
 * (0: the slot's adapter does not wrap the slice). a 0: the projection carries no adapter. */
#define LORA_MAX_SLICES 3 /* q | k | v of qkv_proj */
typedef struct {
    const float *a, *b, *scaling;
    int64_t slices;
    int64_t bounds[LORA_MAX_SLICES + 1];
} LoraMatrix;

typedef struct {
    LoraMatrix qkv, o_proj, gate_up, down;
} LoraLayer;

/* The adapters bound to a model's stack: one LoraLayer per layer, every projection at rank R with S
 * slots. */
typedef struct {
    const LoraLayer *layers;
    int64_t rank, num_slots;
} StackLora;

/* Rows [row, row + rows) of a step, all of adapter slot `slot` (rows <= GEMV_MAX_ROWS). */
typedef struct {
    int64_t row, rows, slot;
} LoraRun;

/* The Fortran BLAS sgemm (column-major, arguments by pointer), passed in by the caller (kernels.cpu.blas
 * finds torch's), or 0. Integers are passed as pointers to int64 values below 2^31: an LP64 BLAS reads
 * their low half (little-endian), an ILP64 one all of it, both the same number. */
typedef void (*Sgemm)(const char *transa, const char *transb, const int64_t *m, const int64_t *n, const int64_t *k,
                      const float *alpha, const float *a, const int64_t *lda, const float *b, const int64_t *ldb,
                      const float *beta, float *c, const int64_t *ldc);

/* Up to this many rows the matmuls are GEMVs (in passes of at most GEMV_MAX_ROWS rows, re-reading
 * the weights: at 9-15 rows still faster than sgemm, bench/cpu_wide_decode.py); from 16 rows sgemm,
 * when there is one. A model bound with packed matrices takes gemm.h's products from
 * STACK_PACKED_ROWS rows instead, and any number of rows up to STACK_MAX_ROWS: one row too (from 3 rows the fp16 GEMV is no longer bound
 * by the weights' bytes and the tiles are faster; at 1-2 rows the tiles stream a model's weights as
 * fast as the GEMV, and are faster on a draft the L2 cache holds: no horizontal sums). One layout for
 * every row count: a token's logits are the same floats in a one-row step as among a verify step's
 * rows, and a speculating engine reads one copy of the weights (with two copies, its one-row steps
 * after verify steps would read the GEMV copy cold). */
#define STACK_GEMV_ROWS 15
#define STACK_PACKED_ROWS 1
#define STACK_MAX_ROWS 4096
#define ALIGN16(n) (((n) + 15) / 16 * 16) /* floats, rounded up to a 64-byte line */

/* One call's state, shared by the team. */
typedef struct {
    Sgemm sgemm;
    const StackModel *model;
    const float *x;
    const int64_t *positions, *slots;
    const int32_t *tables, *lens;
    int64_t rows, bt_stride, num_threads;
    int rows_share; /* some rows share their first KV block (one sequence's verify rows, forks) */
    float *out;
    float *logits; /* [rows, vocab] from the model's head, or 0: the final-normed rows only */
    float *qkv, *attn, *o, *act, *down; /* shared activations, written in slices */
    float *private;                     /* per thread: h, residual [rows, hidden] each */
    int64_t private_stride;             /* floats from one thread's private part to the next's */
    char *qrows;                        /* per thread: a QRows buffer for the quantized matrices' inputs */
    int64_t qrows_stride;               /* bytes from one thread's QRows buffer to the next's */
    const StackLora *lora;              /* the adapters of this call's rows, or 0 */
    const LoraRun *lora_runs;           /* the rows with an adapter, in runs of one slot */
    int64_t lora_num_runs;
    float *lora_h;                      /* per thread: the adapters' shrunk rows [rows, LORA_MAX_SLICES * R] */
    int64_t lora_h_stride;              /* floats from one thread's part to the next's */
    pthread_barrier_t barrier;
    pthread_mutex_t start_lock;
    pthread_cond_t start_cond;
    int started;
} Step;

typedef struct {
    Step *step;
    int64_t tid;
} Member;

/* x's rows [M, K] (row stride xs) quantized for the matrix q, in thread tid's buffer; 0 when q is not
 * quantized. A thread quantizes the whole input it multiplies (every thread the same rows, into its
 * own buffer): the same integers and scales as the one-Linear kernel, whatever the thread count. */
static QRows quantize_input(const Step *s, int64_t tid, const QMatrix *q, const float *x, int64_t xs, int64_t K) {
    QRows r = {0};
    if (!q->w) return r;
    r = qrows_at(s->qrows + tid * s->qrows_stride, s->rows, K, qmatrix_block(q));
    quantize_rows(x, xs, &r);
    return r;
}

/* y[:, lo:hi] <- x [rows, K] (row stride xs) . w[lo:hi]^T (+ bias[lo:hi]), y's row stride ys; w
 * starts `at` weights into the tensor (fp32, or fp16 with the model's half_weights: GEMVs only);
 * packed: the same tensor packed for gemm.h (of the same dtype), or 0; q: the tensor quantized (its w
 * 0: not), with qx the rows of x quantized for it (quantize_input). */
static void linear(const Step *s, const float *w, const float *packed, const QMatrix *q, const QRows *qx, int64_t at,
                   const float *bias, int64_t K, const float *x, int64_t xs, float *y, int64_t ys, int64_t lo,
                   int64_t hi) {
    const int64_t M = s->rows;
    if (hi <= lo) return;
    if (q && q->w) { /* weight rows at / K + [lo, hi) into y's columns [lo, hi) */
        const int64_t row0 = at / K;
        qmatrix_rows(q, bias ? bias - row0 : 0, qx, y, ys, row0 + lo, row0 + hi, row0);
        return;
    }
    if (packed && M >= STACK_PACKED_ROWS) { /* weight rows at / K + [lo, hi) into y's columns [lo, hi) */
        const int64_t row0 = at / K;
        if (s->model->half_weights)
            gemm_packed_h((const uint16_t *)(const void *)packed, bias ? bias - row0 : 0, K, x, xs, M, y, ys, row0 + lo,
                          row0 + hi, row0);
        else
            gemm_packed(packed, bias ? bias - row0 : 0, K, x, xs, M, y, ys, row0 + lo, row0 + hi, row0);
        return;
    }
    if (s->model->half_weights) {
        const uint16_t *wh = (const uint16_t *)(const void *)w + at;
        for (int64_t r = 0; r < M; r += GEMV_MAX_ROWS) {
            const int64_t rows = M - r < GEMV_MAX_ROWS ? M - r : GEMV_MAX_ROWS;
            gemv_rows_h(wh, bias, K, x + r * xs, xs, rows, y + r * ys, ys, lo, hi);
        }
        return;
    }
    w += at;
    if (M > STACK_GEMV_ROWS && s->sgemm) {
        /* column-major: y^T [hi - lo, M] = W[lo:hi] (a [K, hi - lo] matrix, transposed) . x^T [K, M]; a
         * bias is the initial y with beta = 1, as torch's addmm does (the same floats as F.linear) */
        const int64_t n = hi - lo, m = M, k = K, lda = K, ldb = xs, ldc = ys;
        const float one = 1.0f, beta = bias ? 1.0f : 0.0f;
        if (bias)
            for (int64_t r = 0; r < M; r++) memcpy(y + r * ys + lo, bias + lo, (hi - lo) * sizeof(float));
        s->sgemm("T", "N", &n, &m, &k, &one, w + lo * K, &lda, x, &ldb, &beta, y + lo, &ldc);
        return;
    }
    for (int64_t r = 0; r < M; r += GEMV_MAX_ROWS) {
        const int64_t rows = M - r < GEMV_MAX_ROWS ? M - r : GEMV_MAX_ROWS;
        gemv_rows(w, bias, K, x + r * xs, xs, rows, y + r * ys, ys, lo, hi);
    }
}

#endif
