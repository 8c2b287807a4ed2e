/* SIMD helpers shared by freight's CPU kernels: LANES-wide float vectors through GCC vector
 * extensions (the compiler picks the instructions for -march=native), unaligned loads and stores,
 * a horizontal sum, and a vectorized e^x. Included by the kernels in this folder; kernels/cpu/build.py
 * keys its cache on this file too. */
#ifndef FREIGHT_SIMD_H
#define FREIGHT_SIMD_H

#include <stdint.h>

/* Vectors of LANES floats (GCC vector extensions: the compiler picks the instructions). */
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
typedef float vf __attribute__((vector_size(LANES * 4)));
typedef float vf_unaligned __attribute__((vector_size(LANES * 4), aligned(4)));

static inline vf load(const float *p) { return *(const vf_unaligned *)p; }
static inline void store(float *p, vf v) { *(vf_unaligned *)p = v; }

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline float hsum(vf v) {
#if LANES == 16
    v8 lo, hi;
    __builtin_memcpy(&lo, &v, 32);
    __builtin_memcpy(&hi, (char *)&v + 32, 32);
    const v8 x = lo + hi;
#else
    const v8 x = v;
#endif
    v4 a, b;
    __builtin_memcpy(&a, &x, 16);
    __builtin_memcpy(&b, (const char *)&x + 16, 16);
    const v4 y = a + b;
    return (y[0] + y[2]) + (y[1] + y[3]);
}

typedef int32_t vi __attribute__((vector_size(LANES * 4)));

/* e^x for x in [-87, 88] (Cephes' expf polynomial, ~1 ulp). */
static inline vf exp_core(vf x) {
    const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    const vf r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    vf p = (vf){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const vf y = p * r * r + r + 1.0f;
    const vi two_n = (__builtin_convertvector(n, vi) + 127) << 23;
    return y * (vf)two_n;
}

/* e^x for x <= 0; below -87 it returns e^-87 (~1e-38), which every use here multiplies away. */
static inline vf exp_nonpositive(vf x) {
    const vf floor = (vf){0} - 87.0f;
    const vi below = x < floor;
    x = (vf)(((vi)x & ~below) | ((vi)floor & below));
    return exp_core(x);
}

/* e^x for any x, LANES at a time: clamped to [-87, 88] (e^88 ~ 1.7e38 still fits an fp32). */
static inline vf exp_any(vf x) {
    const vf top = (vf){0} + 88.0f;
    const vi above = x > top;
    x = (vf)(((vi)x & ~above) | ((vi)top & above));
    const vf floor = (vf){0} - 87.0f;
    const vi below = x < floor;
    x = (vf)(((vi)x & ~below) | ((vi)floor & below));
    return exp_core(x);
}

static inline float exp_nonpositive1(float x) {
    vf v = (vf){0} + x;
    return exp_nonpositive(v)[0];
}

#endif
