/* The online softmax of freight's CPU attention kernels: one query row's running max and sum moved
 * on by a vector of scores. Included by the kernels in this folder; kernels/cpu/build.py keys its
 * cache on this file too. */
#ifndef FREIGHT_SOFTMAX_H
#define FREIGHT_SOFTMAX_H

#include <math.h>
#include <stdint.h>

#include "simd.h"

/* Scores s of one row, of which lanes < n (>= 1) are keys: the row's running max *m and sum *l move
 * on, p (LANES floats) gets e^(s - max) with 0 past n, and the result is the factor the row's
 * earlier output must be scaled by (~0 on a row's first keys, while *m is -inf). */
static inline float softmax_update(vf s, int64_t n, float *m, float *l, float *p) {
    const vi valid = lane_index() < (int32_t)n;
    s = blend(valid, s, (vf){0} - INFINITY);
    const float top = hmax(s), mx = *m > top ? *m : top;
    const float correction = exp_nonpositive1(*m - mx);
    const vf e = blend(valid, exp_nonpositive(s - mx), (vf){0});
    store(p, e);
    *l = *l * correction + hsum(e);
    *m = mx;
    return correction;
}

#endif
