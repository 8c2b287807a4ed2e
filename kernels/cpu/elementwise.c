/* The elementwise layers of a decoder step on the CPU, each one pass over its rows (fp32):
 *   rms_norm_f32   residual add + RMSNorm (x + residual -> residual_out; normed, times weight -> out)
 *   silu_mul_f32   SwiGLU's silu(gate) * up from the fused gate_up projection [rows, 2 * inter]
 *   rotary_f32     rotate q and k in place (the "rotate half" convention, as kernels.reference)
 *   rotary_store_f32  rotary, then the rotated k and v written into the paged KV cache: one pass
 *                  over each token's q, k and v instead of three (and no torch index ops)
 * The torch reference runs each as several ops, with fp32 temporaries the size of the activations:
 * passes over memory that at prefill sizes take a visible share of the step next to the matmuls
 * (bench/cpu_elementwise.py: each kernel against its torch reference at a 2,048-token chunk).
 * Rows are split over num_threads pthreads when there are enough of them to pay for the threads.
 * Built by kernels/cpu/build.py with -O3 -march=native.
 */
#include <math.h>
#include <stdint.h>

#include "layer_rows.h"
#include "threads.h"

#define MIN_FLOATS_PER_THREAD 65536 /* below this a thread costs more than it saves */

/* Split rows [0, total) of `floats_per_row` into contiguous ranges: tasks[i].lo / .hi of a task
 * array `tasks` (structs with int64_t lo, hi) copied from `base`; returns how many tasks. */
#define SPLIT_ROWS(tasks, base, total, floats_per_row, num_threads)                                  \
    ({                                                                                                \
        const int64_t n_ = threads_for((total) * (floats_per_row), MIN_FLOATS_PER_THREAD, num_threads); \
        for (int64_t i_ = 0; i_ < n_; i_++) {                                                         \
            (tasks)[i_] = (base);                                                                     \
            (tasks)[i_].lo = (total) * i_ / n_;                                                       \
            (tasks)[i_].hi = (total) * (i_ + 1) / n_;                                                 \
        }                                                                                             \
        n_;                                                                                           \
    })

/* ---- RMSNorm ------------------------------------------------------------------------------- */
typedef struct {
    const float *x, *residual, *weight;
    float *out, *residual_out;
    int64_t x_stride, r_stride, n;
    float eps;
    int64_t lo, hi;
} NormRows;

static void *rms_norm_rows(void *arg) {
    const NormRows *r = (const NormRows *)arg;
    for (int64_t row = r->lo; row < r->hi; row++) {
        rms_norm_row(r->x + row * r->x_stride, r->residual ? r->residual + row * r->r_stride : 0, r->weight, r->n,
                     r->eps, r->out + row * r->n, r->residual_out + row * r->n);
    }
    return 0;
}

/* x rows [rows, n] at row stride x_stride; residual (or 0) at r_stride; out and residual_out
 * contiguous [rows, n] (residual_out unused without a residual). */
void rms_norm_f32(const float *x, int64_t x_stride, const float *residual, int64_t r_stride, const float *weight,
                  float eps, int64_t rows, int64_t n, float *out, float *residual_out, int64_t num_threads) {
    const NormRows base = {x, residual, weight, out, residual_out, x_stride, r_stride, n, eps, 0, 0};
    NormRows tasks[MAX_THREADS];
    run_tasks(rms_norm_rows, tasks, sizeof(NormRows), SPLIT_ROWS(tasks, base, rows, n, num_threads));
}

/* ---- SiLU(gate) * up ----------------------------------------------------------------------- */
typedef struct {
    const float *gate_up;
    float *out;
    int64_t stride, n;
    int64_t lo, hi;
} SiluRows;

static void *silu_mul_rows(void *arg) {
    const SiluRows *r = (const SiluRows *)arg;
    for (int64_t row = r->lo; row < r->hi; row++) {
        const float *g = r->gate_up + row * r->stride;
        silu_mul_row(g, g + r->n, r->n, r->out + row * r->n);
    }
    return 0;
}

/* gate_up [rows, 2 * inter] at row stride `stride` (gate first) -> out [rows, inter] contiguous. */
void silu_mul_f32(const float *gate_up, int64_t stride, int64_t rows, int64_t inter, float *out,
                  int64_t num_threads) {
    const SiluRows base = {gate_up, out, stride, inter, 0, 0};
    SiluRows tasks[MAX_THREADS];
    run_tasks(silu_mul_rows, tasks, sizeof(SiluRows), SPLIT_ROWS(tasks, base, rows, 3 * inter, num_threads));
}

/* ---- rotary -------------------------------------------------------------------------------- */
typedef struct {
    float *q, *k;
    const float *cos_sin;
    const int64_t *positions;
    int64_t q_stride, k_stride, num_heads, num_kv_heads, head_dim;
    int64_t lo, hi;
} RotaryRows;

static void *rotary_rows(void *arg) {
    const RotaryRows *r = (const RotaryRows *)arg;
    for (int64_t t = r->lo; t < r->hi; t++) {
        const float *cs = r->cos_sin + r->positions[t] * r->head_dim;
        rotate_heads(r->q + t * r->q_stride, r->num_heads, r->head_dim, cs);
        rotate_heads(r->k + t * r->k_stride, r->num_kv_heads, r->head_dim, cs);
    }
    return 0;
}

/* q [T, Hq, D] and k [T, Hkv, D] (token strides q_stride, k_stride; heads D apart) rotated in place
 * at positions [T] with cos_sin [max_pos, D] (row p: cos(p * f) for the first D/2, then sin). */
void rotary_f32(float *q, int64_t q_stride, int64_t num_heads, float *k, int64_t k_stride, int64_t num_kv_heads,
                int64_t head_dim, const int64_t *positions, const float *cos_sin, int64_t tokens, int64_t num_threads) {
    const RotaryRows base = {q, k, cos_sin, positions, q_stride, k_stride, num_heads, num_kv_heads, head_dim, 0, 0};
    const int64_t floats = (num_heads + num_kv_heads) * head_dim;
    RotaryRows tasks[MAX_THREADS];
    run_tasks(rotary_rows, tasks, sizeof(RotaryRows), SPLIT_ROWS(tasks, base, tokens, floats, num_threads));
}

/* ---- rotary + KV store --------------------------------------------------------------------- */
typedef struct {
    float *q, *k;
    const float *v, *cos_sin;
    const int64_t *positions, *slots;
    float *k_cache, *v_cache;
    int64_t q_stride, k_stride, v_stride, num_heads, num_kv_heads, head_dim;
    int64_t lo, hi;
} RotaryStoreRows;

static void *rotary_store_rows(void *arg) {
    const RotaryStoreRows *r = (const RotaryStoreRows *)arg;
    const int64_t row = r->num_kv_heads * r->head_dim;
    for (int64_t t = r->lo; t < r->hi; t++) {
        const float *cs = r->cos_sin + r->positions[t] * r->head_dim;
        float *k = r->k + t * r->k_stride;
        rotate_heads(r->q + t * r->q_stride, r->num_heads, r->head_dim, cs);
        rotate_heads(k, r->num_kv_heads, r->head_dim, cs);
        const int64_t slot = r->slots[t];
        if (slot < 0) continue; /* the slot already holds this K/V (a shared cached block) */
        store_kv_row(k, r->v + t * r->v_stride, row, r->k_cache + slot * row, r->v_cache + slot * row);
    }
    return 0;
}

/* q [T, Hq, D], k and v [T, Hkv, D] (token strides; heads D apart): q and k rotated in place at
 * positions [T] (cos_sin [max_pos, D]), then k and v copied to slot slots[t] (-1: skipped) of the
 * contiguous caches [num_slots, Hkv, D]. Returns 0, or -1 (nothing done) if a position or slot is
 * out of range. */
int rotary_store_f32(float *q, int64_t q_stride, int64_t num_heads, float *k, int64_t k_stride, const float *v,
                     int64_t v_stride, int64_t num_kv_heads, int64_t head_dim, const int64_t *positions,
                     const float *cos_sin, int64_t max_positions, const int64_t *slots, float *k_cache,
                     float *v_cache, int64_t num_slots, int64_t tokens, int64_t num_threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_positions || slots[t] < -1 || slots[t] >= num_slots) return -1;
    const RotaryStoreRows base = {q, k, v, cos_sin, positions, slots, k_cache, v_cache, q_stride, k_stride,
                                  v_stride, num_heads, num_kv_heads, head_dim, 0, 0};
    const int64_t floats = (num_heads + 3 * num_kv_heads) * head_dim;
    RotaryStoreRows tasks[MAX_THREADS];
    run_tasks(rotary_store_rows, tasks, sizeof(RotaryStoreRows), SPLIT_ROWS(tasks, base, tokens, floats, num_threads));
    return 0;
}
