/* The online softmax of freight's CPU attention kernels: one query row's running max and sum moved
 * on by a vector of scores. Included by the kernels in this folder; kernels/cpu/build.py keys its
 * cache on this file too. */
#ifndef FREIGHT_SOFTMAX_H
#define FREIGHT_SOFTMAX_H

#include <math.h>
#include <stdint.h>

#include "simd.h"

/* Scores s of one row, of which the `valid` lanes are keys (at least one): the row's running max *m
 * and sum *l move on, p (LANES floats) gets e^(s - max) with 0 elsewhere, and the result is the
 * factor the row's earlier output must be scaled by (~0 on a row's first keys, while *m is -inf). */
static inline float softmax_update_lanes(vf s, vi valid, float *m, float *l, float *p) {
    s = blend(valid, s, (vf){0} - INFINITY);
    const float top = hmax(s), mx = *m > top ? *m : top;
    const float correction = exp_nonpositive1(*m - mx);
    const vf e = blend(valid, exp_nonpositive(s - mx), (vf){0});
    store(p, e);
    *l = *l * correction + hsum(e);
    *m = mx;
    return correction;
}

/* softmax_update_lanes for lanes < n (>= 1). */
static inline float softmax_update(vf s, int64_t n, float *m, float *l, float *p) {
    return softmax_update_lanes(s, lane_index() < (int32_t)n, m, l, p);
}

/* softmax_update_lanes for lanes lo <= lane < n only (a sliding window's first keys cut the vector too). */
static inline float softmax_update_range(vf s, int64_t lo, int64_t n, float *m, float *l, float *p) {
    return softmax_update_lanes(s, (lane_index() < (int32_t)n) & (lane_index() >= (int32_t)lo), m, l, p);
}

/* softcap * tanh(s / softcap) per lane (softcap > 0: attention soft-capping), tanh from one exp of a
 * non-positive argument. */
static inline vf soft_cap(vf s, float softcap) {
    const vf x = s / softcap;
    const vi negative = x < 0.0f;
    const vf a = blend(negative, -x, x);
    const vf e = exp_nonpositive(-2.0f * a);
    const vf t = (1.0f - e) / (1.0f + e);
    return blend(negative, -t, t) * softcap;
}

#endif
