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

/* a * b + c rounded once, in every loop. The compiler contracts `acc += a * b` into an FMA by its own
 * choice per loop (-ffp-contract=fast), so two instances of one macro could round differently; kernels
 * that promise the same floats for fp16 and fp32 weights (gemv.h, gemm.h) fuse explicitly. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline vf vfma(vf a, vf b, vf c) { return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#elif defined(__FMA__)
#include <immintrin.h>
static inline vf vfma(vf a, vf b, vf c) { return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
static inline vf vfma(vf a, vf b, vf c) {
    vf r;
    for (int i = 0; i < LANES; i++) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
}
#endif

/* s in every lane, in one broadcast: a vector filled lane by lane compiles to a chain of inserts (8 a
 * call on AVX2), and the GEMM tile splats once per row and k. */
#if defined(__AVX512F__)
static inline vf splat(float s) { return (vf)_mm512_set1_ps(s); }
#elif defined(__AVX__)
#include <immintrin.h>
static inline vf splat(float s) { return (vf)_mm256_set1_ps(s); }
#else
static inline vf splat(float s) {
    vf v;
    for (int i = 0; i < LANES; i++) v[i] = s;
    return v;
}
#endif

/* LANES fp16 values (raw IEEE half bits) widened to floats: exact (every half is a float). */
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
static inline vf load_h(const uint16_t *p) {
#if LANES == 16
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#endif
}
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
#else /* no F16C: the compiler's own half type converts (GCC >= 12 and clang on x86-64 and AArch64) */
static inline float half_to_float(uint16_t h) {
    _Float16 f;
    __builtin_memcpy(&f, &h, 2);
    return (float)f;
}
static inline vf load_h(const uint16_t *p) {
    vf v;
    for (int i = 0; i < LANES; i++) v[i] = half_to_float(p[i]);
    return v;
}
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline float hsum(vf v) {
#if LANES == 16
    const v8 x = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    const v8 x = v;
#endif
    const v4 y = __builtin_shufflevector(x, x, 0, 1, 2, 3) + __builtin_shufflevector(x, x, 4, 5, 6, 7);
    return (y[0] + y[2]) + (y[1] + y[3]);
}

typedef int32_t vi __attribute__((vector_size(LANES * 4)));

/* The indices for lanes 8..15 of a shuffle, on AVX-512 only. */
#if LANES == 16
#define LANES_TAIL(...) , __VA_ARGS__
#else
#define LANES_TAIL(...)
#endif

/* 0, 1, ..., LANES - 1. */
static inline vi lane_index(void) {
#if LANES == 16
    return (vi){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
    return (vi){0, 1, 2, 3, 4, 5, 6, 7};
#endif
}

/* Lane-wise mask ? a : b (mask lanes all ones or all zeros, as vector comparisons give). */
static inline vf blend(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* Sums of adjacent lane pairs: lanes [0, LANES/2) from a, the rest from b. */
static inline vf pair_sum(vf a, vf b) {
#if LANES == 16
    return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
    return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

/* LANES vectors in, one out: lane t = the sum of v[t]'s lanes (v is overwritten). LANES - 1 pair
 * sums, two shuffles each, where LANES horizontal sums would take about twice as many. Also
 * continues a reduction whose first levels are done: count = LANES / 2 vectors of pair_sum results
 * (pair_sum(v0, v1), pair_sum(v2, v3), ...), and so on. */
static inline vf transpose_sum(vf *v, int count) {
    for (int width = count; width > 1; width /= 2)
        for (int i = 0; i < width / 2; i++) v[i] = pair_sum(v[2 * i], v[2 * i + 1]);
    return v[0];
}

static inline vf vmax(vf a, vf b) { return blend(a > b, a, b); }

/* Maxima of adjacent lane pairs: lanes [0, LANES/2) from a, the rest from b. */
static inline vf pair_max(vf a, vf b) {
#if LANES == 16
    return vmax(__builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
#else
    return vmax(__builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14),
                __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15));
#endif
}

/* transpose_sum's counterpart: lane t = the largest lane of v[t] (v: LANES vectors, overwritten). */
static inline vf transpose_max(vf *v) {
    for (int width = LANES; width > 1; width /= 2)
        for (int i = 0; i < width / 2; i++) v[i] = pair_max(v[2 * i], v[2 * i + 1]);
    return v[0];
}

/* The largest lane (NaN-free input). */
static inline float hmax(vf v) {
#if LANES == 16
    v = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
#endif
    const vf a = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3 LANES_TAIL(12, 13, 14, 15, 8, 9, 10, 11));
    v = vmax(v, a);
    const vf b = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5 LANES_TAIL(10, 11, 8, 9, 14, 15, 12, 13));
    v = vmax(v, b);
    return v[0] > v[1] ? v[0] : v[1];
}

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
