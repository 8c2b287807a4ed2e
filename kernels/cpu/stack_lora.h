/* LoRA adapters inside the decode stack (decode_stack.c): after a wrapped projection's base product,
 * each row of an adapter slot s gets, per slice i of the projection, scaling[s, i] * B_i (A_i x) added
 * to the slice's output columns: what worker/engine/lora/linear.py's LoraLinear adds op by op
 * (kernels/reference/lora.py's shrink, then expand), in another summation order.
 *
 * Rows of one slot that follow each other in the step (the engine admits rows adapter by adapter) are
 * one run (stack_step.h's LoraRun): its A is read once for up to GEMV_MAX_ROWS rows (gemv.h), and each
 * block of LANES rows of its B once too (lora_expand).
 * Every thread shrinks every run's rows (L x R floats a row: small next to the projection) into its
 * own buffer, so the adapters add no barrier and their floats do not depend on the thread count; each
 * thread then expands into its own slice of the output columns. A slice whose scaling is 0 for the
 * slot (its adapter does not wrap it) is skipped: its product adds exactly nothing. */
#ifndef FREIGHT_STACK_LORA_H
#define FREIGHT_STACK_LORA_H

#include <stdint.h>

#include "gemv.h"
#include "stack_step.h"

/* Layer l's adapters, or 0 when the call has none. */
static inline const LoraLayer *lora_layer(const Step *s, int64_t l) {
    return s->lora && s->lora_num_runs ? s->lora->layers + l : 0;
}

/* Thread tid's h [rows, slices * R] <- each run's rows of x [rows, K] (row stride xs) times its slot's
 * A (the slices of nonzero scaling only; other rows and slices are not written), or 0 when the
 * projection p carries no adapter. */
static const float *lora_shrink(const Step *s, int64_t tid, const LoraMatrix *p, const float *x, int64_t xs,
                                int64_t K) {
    if (!p->a) return 0;
    const int64_t R = s->lora->rank, L = p->slices, LR = L * R;
    float *h = s->lora_h + tid * s->lora_h_stride;
    for (int64_t r = 0; r < s->lora_num_runs; r++) {
        const LoraRun *run = s->lora_runs + r;
        for (int64_t i = 0; i < L; i++)
            if (p->scaling[run->slot * L + i] != 0.0f)
                gemv_rows(p->a + run->slot * LR * K, 0, K, x + run->row * xs, xs, run->rows, h + run->row * LR, LR,
                          i * R, (i + 1) * R);
    }
    return h;
}

/* Lane j: the dot product of b's row j (rows R floats apart, R floats each) with h, j < LANES: each
 * row's vector part into its own partial sums, summed across lanes for all LANES rows at once
 * (transpose_sum: no horizontal sum per output), then the rows' last R % LANES products. */
static inline vf lora_dots(const float *b, int64_t R, const float *h) {
    const int64_t rv = R - R % LANES;
    vf v[LANES];
    for (int j = 0; j < LANES; j++) {
        vf acc = (vf){0};
        for (int64_t r = 0; r < rv; r += LANES) acc = vfma(load(b + j * R + r), load(h + r), acc);
        v[j] = acc;
    }
    vf sum = transpose_sum(v, LANES);
    if (rv < R) {
        float tail[LANES];
        for (int j = 0; j < LANES; j++) {
            float t = 0.0f;
            for (int64_t r = rv; r < R; r++) t += b[j * R + r] * h[r];
            tail[j] = t;
        }
        sum += load(tail);
    }
    return sum;
}

/* y [rows, c1 - c0] (row stride ys) += each run's rows' adapter products in the projection's output
 * columns [c0, c1) (y's column j is the projection's column c0 + j), from lora_shrink's h (0: none):
 * LANES columns at a time, their B rows (LANES x R floats, read from L1 after the first row) dotted
 * with each row's h. */
static void lora_expand(const Step *s, const LoraMatrix *p, const float *h, int64_t c0, int64_t c1, float *y,
                        int64_t ys) {
    if (!h) return;
    const int64_t R = s->lora->rank, L = p->slices, LR = L * R, N = p->bounds[L];
    for (int64_t r = 0; r < s->lora_num_runs; r++) {
        const LoraRun *run = s->lora_runs + r;
        const float *b = p->b + run->slot * N * R;
        for (int64_t i = 0; i < L; i++) {
            const float scale = p->scaling[run->slot * L + i];
            const int64_t lo = c0 > p->bounds[i] ? c0 : p->bounds[i], hi = c1 < p->bounds[i + 1] ? c1 : p->bounds[i + 1];
            if (scale == 0.0f) continue;
            const float *hi_rows = h + run->row * LR + i * R; /* the run's rows of slice i */
            int64_t c = lo;
            for (; c + LANES <= hi; c += LANES)
                for (int64_t m = 0; m < run->rows; m++) {
                    float *out = y + (run->row + m) * ys + (c - c0);
                    store(out, load(out) + lora_dots(b + c * R, R, hi_rows + m * LR) * splat(scale));
                }
            for (; c < hi; c++)
                for (int64_t m = 0; m < run->rows; m++) {
                    float t = 0.0f;
                    for (int64_t k = 0; k < R; k++) t += b[c * R + k] * hi_rows[m * LR + k];
                    y[(run->row + m) * ys + (c - c0)] += t * scale;
                }
        }
    }
}

/* The adapters' products of one projection into this thread's output columns [c0, c1) (y as
 * lora_expand's), its input x [rows, K] (row stride xs) shrunk first; nothing without adapters. */
static void lora_add(const Step *s, int64_t tid, const LoraMatrix *p, const float *x, int64_t xs, int64_t K,
                     int64_t c0, int64_t c1, float *y, int64_t ys) {
    if (c1 > c0) lora_expand(s, p, lora_shrink(s, tid, p, x, xs, K), c0, c1, y, ys);
}

#endif
