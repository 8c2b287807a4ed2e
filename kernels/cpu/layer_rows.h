/* One row's worth of the elementwise layers of a decoder step (fp32), shared by elementwise.c (the
 * layers one call each, rows split over threads) and decode_stack.c (whole decoder layers in one
 * call), so both compute exactly the same floats. kernels/cpu/build.py keys its cache on this file. */
#ifndef FREIGHT_LAYER_ROWS_H
#define FREIGHT_LAYER_ROWS_H

#include <math.h>
#include <stdint.h>

#include "simd.h"

/* RMSNorm of one row of n floats: with res, x + res is written to sum_out first and normed (sum_out
 * may be res itself: the residual updated in place); without, x is normed. out = normed * weight. */
static inline void rms_norm_row(const float *x, const float *res, const float *weight, int64_t n, float eps,
                                float *out, float *sum_out) {
    const int64_t nv = n - n % LANES;
    const float *h = x; /* the normed input: x, or x + res written to sum_out */
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
    const float inv = 1.0f / sqrtf((hsum(acc) + tail) / (float)n + eps);
    for (i = 0; i < nv; i += LANES) store(out + i, (load(h + i) * inv) * load(weight + i));
    for (; i < n; i++) out[i] = (h[i] * inv) * weight[i];
}

/* silu(g) * u over n floats. */
static inline void silu_mul_row(const float *g, const float *u, int64_t n, float *out) {
    const int64_t nv = n - n % LANES;
    int64_t i = 0;
    for (; i < nv; i += LANES) {
        const vf gv = load(g + i);
        store(out + i, gv / (1.0f + exp_any((vf){0} - gv)) * load(u + i));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* Rotary ("rotate half") of `heads` heads of d floats in place; cs = cos_sin row of the position:
 * cos for the first d / 2 floats, then sin. */
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

/* One token's k and v rows (n floats each) copied into their cache slot rows kc, vc. */
static inline void store_kv_row(const float *k, const float *v, int64_t n, float *kc, float *vc) {
    const int64_t nv = n - n % LANES;
    int64_t i = 0;
    for (; i < nv; i += LANES) {
        store(kc + i, load(k + i));
        store(vc + i, load(v + i));
    }
    for (; i < n; i++) {
        kc[i] = k[i];
        vc[i] = v[i];
    }
}

#endif
