/* The elementwise layers of a decoder step on the CPU, each one pass over its rows (fp32):
 *   rms_norm_f32   residual add + RMSNorm (x + residual -> residual_out; normed, times weight -> out)
 *   silu_mul_f32   SwiGLU's silu(gate) * up from the fused gate_up projection [rows, 2 * inter]
 *   rotary_f32     rotate q and k in place (the "rotate half" convention, as kernels.reference)
 * The torch reference runs each as several ops, with fp32 temporaries the size of the activations;
 * at prefill sizes (2,048 rows) those passes cost ~15% of the step next to the matmuls.
 * Rows are split over num_threads pthreads when there are enough of them to pay for the threads.
 * Built by kernels/cpu/build.py with -O3 -march=native.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "simd.h"

#define MAX_THREADS 64
#define MIN_FLOATS_PER_THREAD 65536 /* below this a thread costs more than it saves */

typedef struct {
    /* rms_norm: x, residual (or 0), weight -> out, residual_out; silu_mul: x = gate_up -> out;
     * rotary: x = q, residual = k rotated in place, weight = cos_sin, positions */
    const float *x, *residual, *weight;
    float *out, *residual_out;
    const int64_t *positions;
    int64_t x_stride, r_stride, n, heads, heads2, head_dim;
    float eps;
    int64_t lo, hi; /* rows of this thread */
} Rows;

typedef void (*RowsFn)(const Rows *);

typedef struct {
    Rows rows;
    RowsFn fn;
} Task;

static void *run_task(void *arg) {
    Task *t = (Task *)arg;
    t->fn(&t->rows);
    return 0;
}

/* Run fn over rows [0, total) in up to num_threads contiguous ranges. */
static void parallel_rows(RowsFn fn, Rows base, int64_t total, int64_t floats_per_row, int64_t num_threads) {
    int64_t threads = num_threads < 1 ? 1 : num_threads > MAX_THREADS ? MAX_THREADS : num_threads;
    const int64_t by_size = total * floats_per_row / MIN_FLOATS_PER_THREAD;
    if (threads > by_size) threads = by_size < 1 ? 1 : by_size;
    if (threads > total) threads = total < 1 ? 1 : total;
    Task tasks[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int64_t i = 0; i < threads; i++) {
        tasks[i].rows = base;
        tasks[i].rows.lo = total * i / threads;
        tasks[i].rows.hi = total * (i + 1) / threads;
        tasks[i].fn = fn;
    }
    for (int64_t i = 1; i < threads; i++) started[i] = pthread_create(&ids[i], 0, run_task, &tasks[i]) == 0;
    for (int64_t i = 1; i < threads; i++)
        if (!started[i]) run_task(&tasks[i]); /* a thread that did not start: run its rows here */
    run_task(&tasks[0]);
    for (int64_t i = 1; i < threads; i++)
        if (started[i]) pthread_join(ids[i], 0);
}

/* ---- RMSNorm ------------------------------------------------------------------------------- */
static void rms_norm_rows(const Rows *r) {
    const int64_t n = r->n, nv = n - n % LANES;
    for (int64_t row = r->lo; row < r->hi; row++) {
        const float *x = r->x + row * r->x_stride;
        const float *res = r->residual ? r->residual + row * r->r_stride : 0;
        float *sum_out = r->residual_out + row * n, *o = r->out + row * n;
        const float *h = x; /* the normed input: x, or x + residual written to residual_out */
        vf acc = {0};
        float tail = 0.0f;
        int64_t i = 0;
        if (res) {
            for (; i < nv; i += LANES) {
                const vf s = load(x + i) + load(res + i);
                store(sum_out + i, s);
                acc += s * s;
            }
            for (; i < n; i++) {
                sum_out[i] = x[i] + res[i];
                tail += sum_out[i] * sum_out[i];
            }
            h = sum_out;
        } else {
            for (; i < nv; i += LANES) acc += load(x + i) * load(x + i);
            for (; i < n; i++) tail += x[i] * x[i];
        }
        const float inv = 1.0f / sqrtf((hsum(acc) + tail) / (float)n + r->eps);
        for (i = 0; i < nv; i += LANES) store(o + i, (load(h + i) * inv) * load(r->weight + i));
        for (; i < n; i++) o[i] = (h[i] * inv) * r->weight[i];
    }
}

/* x rows [rows, n] at row stride x_stride; residual (or 0) at r_stride; out and residual_out
 * contiguous [rows, n] (residual_out unused without a residual). */
void rms_norm_f32(const float *x, int64_t x_stride, const float *residual, int64_t r_stride, const float *weight,
                  float eps, int64_t rows, int64_t n, float *out, float *residual_out, int64_t num_threads) {
    const Rows base = {.x = x, .residual = residual, .weight = weight, .out = out, .residual_out = residual_out,
                       .x_stride = x_stride, .r_stride = r_stride, .n = n, .eps = eps};
    parallel_rows(rms_norm_rows, base, rows, n, num_threads);
}

/* ---- SiLU(gate) * up ----------------------------------------------------------------------- */
static void silu_mul_rows(const Rows *r) {
    const int64_t n = r->n, nv = n - n % LANES;
    for (int64_t row = r->lo; row < r->hi; row++) {
        const float *g = r->x + row * r->x_stride, *u = g + n;
        float *o = r->out + row * n;
        int64_t i = 0;
        for (; i < nv; i += LANES) {
            const vf gv = load(g + i);
            store(o + i, gv / (1.0f + exp_any((vf){0} - gv)) * load(u + i));
        }
        for (; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* gate_up [rows, 2 * inter] at row stride `stride` (gate first) -> out [rows, inter] contiguous. */
void silu_mul_f32(const float *gate_up, int64_t stride, int64_t rows, int64_t inter, float *out,
                  int64_t num_threads) {
    const Rows base = {.x = gate_up, .out = out, .x_stride = stride, .n = inter};
    parallel_rows(silu_mul_rows, base, rows, 3 * inter, num_threads);
}

/* ---- rotary -------------------------------------------------------------------------------- */
static inline void rotate_heads(float *x, int64_t heads, int64_t d, const float *cs) {
    const int64_t half = d / 2, hv = half - half % LANES;
    for (int64_t h = 0; h < heads; h++) {
        float *a = x + h * d, *b = a + half;
        int64_t i = 0;
        for (; i < hv; i += LANES) {
            const vf x1 = load(a + i), x2 = load(b + i), c = load(cs + i), s = load(cs + half + i);
            store(a + i, x1 * c - x2 * s);
            store(b + i, x2 * c + x1 * s);
        }
        for (; i < half; i++) {
            const float x1 = a[i], x2 = b[i], c = cs[i], s = cs[half + i];
            a[i] = x1 * c - x2 * s;
            b[i] = x2 * c + x1 * s;
        }
    }
}

static void rotary_rows(const Rows *r) {
    float *q = r->out, *k = r->residual_out;
    for (int64_t t = r->lo; t < r->hi; t++) {
        const float *cs = r->weight + r->positions[t] * r->head_dim;
        rotate_heads(q + t * r->x_stride, r->heads, r->head_dim, cs);
        rotate_heads(k + t * r->r_stride, r->heads2, r->head_dim, cs);
    }
}

/* q [T, Hq, D] and k [T, Hkv, D] (token strides q_stride, k_stride; heads D apart) rotated in place
 * at positions [T] with cos_sin [max_pos, D] (row p: cos(p * f) for the first D/2, then sin). */
void rotary_f32(float *q, int64_t q_stride, int64_t num_heads, float *k, int64_t k_stride, int64_t num_kv_heads,
                int64_t head_dim, const int64_t *positions, const float *cos_sin, int64_t tokens, int64_t num_threads) {
    const Rows base = {.weight = cos_sin, .out = q, .residual_out = k, .positions = positions, .x_stride = q_stride,
                       .r_stride = k_stride, .heads = num_heads, .heads2 = num_kv_heads, .head_dim = head_dim};
    parallel_rows(rotary_rows, base, tokens, (num_heads + num_kv_heads) * head_dim, num_threads);
}
