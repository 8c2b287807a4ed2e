/* Integer matrix products for quantized weights: y = x W^T (+ bias) with W int8 per output channel or
 * int4 in groups along K, x fp32 quantized to int8 on the fly. Included by quant_matmul.c (one
 * Linear a call) and decode_stack.c (inside the whole-layer step); kernels/cpu/build.py keys its cache
 * on this file too.
 *
 * Activations (QRows): each row is quantized per block of `block` k (int8 matrices Q8_BLOCK; int4
 * matrices their group size), symmetric: scale = max |x| / 127 over the block, q = round(x * (127 /
 * max |x|)) to nearest even, q in [-127, 127]; the block's integer sum of q is kept too.
 *
 * Weights, packed once (kernels/cpu/quant_matmul.py): tiles of QNB output rows, the same layout on
 * every instruction set.
 * - int8: bytes [ceil(N / QNB)][ceil(K / 4)][QNB][4]: byte (n, j) of k-step s is q[n, 4s + j] + 128
 *   (unsigned; zero weight past K and N), scales fp32 [ceil(N / QNB) * QNB].
 * - int4: bytes [ceil(N / QNB)][K / 8][QNB][4]: byte (n, j) of k-step s holds q[n, 8s + j] + 8 in its
 *   low nibble and q[n, 8s + 4 + j] + 8 in its high one; scales [ceil(N / QNB)][K / G][QNB], fp32 or
 *   fp16 (raw half bits). K is a multiple of G, G of 8.
 * One vector load of a tile's k-step holds 4 consecutive k of 16 (AVX-512) outputs: the 4 matching
 * activation bytes are broadcast and one vpdpbusd adds the 4 products into each output's int32. No
 * horizontal sums; each weight vector is loaded once for all the rows of a register tile. vpdpbusd
 * multiplies unsigned by signed bytes, hence the +128 / +8 offsets on the weights: a block's sum over
 * (q_w + o) q_x is corrected by o * sum(q_x), exactly, in int32 (|q_x| <= 127, q_w + o <= 255: a
 * block of 128 stays below 2^22).
 *
 * Instruction sets, picked by the compiler flags (-march=native): AVX-512 VNNI (512-bit vpdpbusd),
 * AVX-VNNI (256-bit vpdpbusd), AVX2 (vpmaddubsw + vpmaddwd: for int8 on sign-folded operands, whose
 * pair sums fit int16), or portable C. Every path computes the same block integers and then the same
 * float operations in the same order: the same floats on every machine.
 *
 * Result: y[m, n] = sum over blocks b, in order, of the fp32 product of the block's integer dot
 * d[m, n, b] (weights without their offset) and the scales:
 *   int8: acc = fma(float(d), sx[m, b], acc); y = acc * sw[n] (+ bias[n])
 *   int4: acc = fma(float(d), sx[m, b] * sw[n, b], acc); y = acc (+ bias[n])
 * kernels/reference/quant_matmul.py (int8_dynamic_matmul, int4_dynamic_matmul) computes the same
 * from freight's layouts.
 */
#ifndef FREIGHT_QUANT_H
#define FREIGHT_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define QNB 64        /* output rows per packed tile */
#define Q8_BLOCK 128  /* activation block of an int8 matrix, in k */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && LANES == 16
#define Q_ISA 3
#elif defined(__AVXVNNI__) && LANES == 8
#define Q_ISA 2
#elif defined(__AVX2__) && LANES == 8
#define Q_ISA 1
#else
#define Q_ISA 0
#endif

#if defined(__AVX__)
#include <immintrin.h>
#endif

/* p rounded to the nearest integer, ties to even (the default rounding mode). A separate step from
 * the product that made p: rounding fl(x * inv), never a fused x * inv + c. */
static inline vi round_lanes(vf p) {
#if LANES == 16
    return (vi)_mm512_cvtps_epi32((__m512)p);
#elif defined(__AVX__)
    return (vi)_mm256_cvtps_epi32((__m256)p);
#else
    vi r;
    for (int i = 0; i < LANES; i++) r[i] = (int32_t)lrintf(p[i]);
    return r;
#endif
}

/* Rows of activations quantized for one matrix's block size. */
typedef struct {
    int8_t *q;      /* [rows][stride], zeros past K */
    float *scale;   /* [rows][nb]: max |x| / 127 of each block */
    int32_t *sum;   /* [rows][nb]: the block's sum of q */
    int64_t rows, stride, nb, block, k;
} QRows;

/* Bytes a QRows of `rows` rows of K needs at this block size (for the caller's buffer). */
static inline int64_t qrows_bytes(int64_t rows, int64_t K, int64_t block) {
    const int64_t stride = (K + 63) / 64 * 64, nb = (K + block - 1) / block;
    return rows * stride + rows * nb * 8 + 64;
}

/* Lays a QRows out in buf (qrows_bytes of it, 64-byte aligned). */
static inline QRows qrows_at(void *buf, int64_t rows, int64_t K, int64_t block) {
    QRows r;
    r.rows = rows, r.k = K, r.block = block;
    r.stride = (K + 63) / 64 * 64, r.nb = (K + block - 1) / block;
    r.q = (int8_t *)buf;
    r.scale = (float *)(void *)(r.q + rows * r.stride);
    r.sum = (int32_t *)(void *)(r.scale + rows * r.nb);
    return r;
}

/* q, scale and sum of the rows x [rows, K] (row stride xs) into r (laid out by qrows_at). */
static void quantize_rows(const float *x, int64_t xs, QRows *r) {
    const int64_t K = r->k, B = r->block;
    for (int64_t m = 0; m < r->rows; m++) {
        const float *xm = x + m * xs;
        int8_t *qm = r->q + m * r->stride;
        for (int64_t b = 0; b < r->nb; b++) {
            const int64_t k0 = b * B, k1 = k0 + B < K ? k0 + B : K, kv = k0 + (k1 - k0) / LANES * LANES;
            vf mx = {0};
            float top = 0.0f;
            int64_t k = k0;
            for (; k < kv; k += LANES) {
                const vf a = load(xm + k);
                mx = vmax(mx, vmax(a, (vf){0} - a));
            }
            top = hmax(mx);
            for (; k < k1; k++) top = fabsf(xm[k]) > top ? fabsf(xm[k]) : top;
            const float inv = top > 0.0f ? 127.0f / top : 0.0f;
            int32_t sum = 0;
            k = k0;
            for (; k < kv; k += LANES) {
                const vi iv = round_lanes(load(xm + k) * inv);
                for (int i = 0; i < LANES; i++) {
                    qm[k + i] = (int8_t)iv[i];
                    sum += iv[i];
                }
            }
            for (; k < k1; k++) {
                const int32_t v = (int32_t)lrintf(xm[k] * inv);
                qm[k] = (int8_t)v;
                sum += v;
            }
            r->scale[m * r->nb + b] = top / 127.0f;
            r->sum[m * r->nb + b] = sum;
        }
        memset(qm + K, 0, (size_t)(r->stride - K));
    }
}

/* ---- one k-step of a tile: 16 (or 8) outputs x 4 k, per instruction set ---------------------- */

static inline int32_t x4_at(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if Q_ISA == 3
typedef __m512i qv; /* 16 int32 */
#define QL 16
static inline qv qv_zero(void) { return _mm512_setzero_si512(); }
static inline qv qv_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline qv q8_dot(qv acc, qv w, int32_t x4) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x4)); }
static inline qv q4_dot(qv acc, qv w, int32_t x4) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x4)); }
static inline qv q4_pair(qv s, qv lo, qv hi, int32_t xl, int32_t xh) {
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s, lo, _mm512_set1_epi32(xl)), hi, _mm512_set1_epi32(xh));
}
static inline qv q4_widen(qv d, qv s) { return _mm512_add_epi32(d, s); }
#define Q4_SPAN (1 << 30) /* int32 sums: a whole group */
static inline qv q4_low(qv w) { return _mm512_and_si512(w, _mm512_set1_epi8(15)); }
static inline qv q4_high(qv w) { return _mm512_and_si512(_mm512_srli_epi16(w, 4), _mm512_set1_epi8(15)); }
static inline vf qv_float(qv acc, int32_t minus) { return (vf)_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(minus))); }
#define Q8_OFFSET 128 /* the block integers carry the weights' +128 */
#elif Q_ISA == 2 || Q_ISA == 1
typedef __m256i qv; /* 8 int32 */
#define QL 8
static inline qv qv_zero(void) { return _mm256_setzero_si256(); }
static inline qv qv_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }
#if Q_ISA == 2
static inline qv q8_dot(qv acc, qv w, int32_t x4) { return _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(x4)); }
static inline qv q4_dot(qv acc, qv w, int32_t x4) { return _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(x4)); }
static inline qv q4_pair(qv s, qv lo, qv hi, int32_t xl, int32_t xh) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(s, lo, _mm256_set1_epi32(xl)), hi, _mm256_set1_epi32(xh));
}
static inline qv q4_widen(qv d, qv s) { return _mm256_add_epi32(d, s); }
#define Q4_SPAN (1 << 30)
#define Q8_OFFSET 128
#else
/* (q + 128) * x pair sums overflow int16: fold the sign instead. q = w ^ 0x80 (the signed byte),
 * |q| * (x * sign(q)): pairs of at most 2 * 127 * 127. Gives the sum without the offset. */
static inline qv q8_dot(qv acc, qv w, int32_t x4) {
    const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(_mm256_set1_epi32(x4), q));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
/* nibbles are at most 15: pair sums of at most 2 * 15 * 127 = 3810, so a k-step's two (low and high
 * nibbles) add at most 7620 to an int16 and Q4_SPAN = 4 k-steps stay below 2^15; q4_widen adds the
 * int16 pairs into the int32 sums (one vpmaddwd per 4 k-steps instead of one per vpmaddubsw). */
static inline qv q4_dot(qv acc, qv w, int32_t x4) {
    const __m256i p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(x4));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
static inline qv q4_pair(qv s, qv lo, qv hi, int32_t xl, int32_t xh) {
    const __m256i a = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)), b = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh));
    return _mm256_add_epi16(s, _mm256_add_epi16(a, b));
}
static inline qv q4_widen(qv d, qv s) { return _mm256_add_epi32(d, _mm256_madd_epi16(s, _mm256_set1_epi16(1))); }
#define Q4_SPAN 4
/* per k-step: the weights' signed bytes once (shared by the rows), each row's |x| and x once (shared
 * by the vectors), then per pair |x| * (q * sign(x)) = q * x: sign, maddubs, madd, add */
typedef struct {
    __m256i x, ax;
} qx;
static inline qv q8_weights(qv w) { return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)); }
static inline qx q8_x(int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4);
    return (qx){x, _mm256_abs_epi8(x)};
}
static inline qv q8_dotx(qv acc, qv q, qx x) {
    const __m256i p = _mm256_maddubs_epi16(x.ax, _mm256_sign_epi8(q, x.x));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
#define Q8_OFFSET 0
#endif
static inline qv q4_low(qv w) { return _mm256_and_si256(w, _mm256_set1_epi8(15)); }
static inline qv q4_high(qv w) { return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(15)); }
static inline vf qv_float(qv acc, int32_t minus) { return (vf)_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, _mm256_set1_epi32(minus))); }
#else
/* Portable C: 8 outputs a vector, the products summed in plain int32 arithmetic. */
#define QL 8
typedef struct {
    int32_t v[8];
} qv;
typedef struct {
    uint8_t b[32];
} qv_bytes;
static inline qv qv_zero(void) {
    qv z;
    memset(&z, 0, sizeof z);
    return z;
}
/* a qv holds 32 raw bytes until a dot consumes them; the union-free copy keeps aliasing rules */
static inline qv qv_load(const uint8_t *p) {
    qv r;
    memcpy(&r, p, 32);
    return r;
}
static inline qv q_dot_bytes(qv acc, qv w, int32_t x4) {
    uint8_t wb[32];
    int8_t xb[4];
    memcpy(wb, &w, 32);
    memcpy(xb, &x4, 4);
    for (int i = 0; i < 8; i++)
        acc.v[i] += wb[4 * i] * xb[0] + wb[4 * i + 1] * xb[1] + wb[4 * i + 2] * xb[2] + wb[4 * i + 3] * xb[3];
    return acc;
}
static inline qv q8_dot(qv acc, qv w, int32_t x4) { return q_dot_bytes(acc, w, x4); }
static inline qv q4_dot(qv acc, qv w, int32_t x4) { return q_dot_bytes(acc, w, x4); }
static inline qv q4_nibbles(qv w, int shift) {
    uint8_t wb[32];
    memcpy(wb, &w, 32);
    for (int i = 0; i < 32; i++) wb[i] = (uint8_t)((wb[i] >> shift) & 15);
    memcpy(&w, wb, 32);
    return w;
}
static inline qv q4_pair(qv s, qv lo, qv hi, int32_t xl, int32_t xh) { return q_dot_bytes(q_dot_bytes(s, lo, xl), hi, xh); }
static inline qv q4_widen(qv d, qv s) {
    for (int i = 0; i < 8; i++) d.v[i] += s.v[i];
    return d;
}
#define Q4_SPAN (1 << 30)
static inline qv q4_low(qv w) { return q4_nibbles(w, 0); }
static inline qv q4_high(qv w) { return q4_nibbles(w, 4); }
static inline vf qv_float(qv acc, int32_t minus) {
    vf f;
    for (int i = 0; i < 8; i++) f[i] = (float)(acc.v[i] - minus);
    return f;
}
#define Q8_OFFSET 128
#endif

#if QL != LANES
#error "quant.h: the int32 vectors and simd.h's float vectors must have the same width"
#endif

#if Q_ISA != 1 /* one instruction a product: the raw weights, the broadcast x */
typedef int32_t qx;
static inline qv q8_weights(qv w) { return w; }
static inline qx q8_x(int32_t x4) { return x4; }
static inline qv q8_dotx(qv acc, qv w, qx x4) { return q8_dot(acc, w, x4); }
#endif

/* vectors per tile k-step, and per pass of a register tile of several rows (ymm: two passes of a
 * tile's halves); a one-row tile passes whole k-steps (Q1PV vectors: its registers allow it) */
#define QTV (QNB / QL)
#if QL == 16
#define QPV 4
#define Q8_MR 6
#define Q4_MR 4
#else
#define QPV 4
#define Q8_MR 2
#define Q4_MR 2
#endif
#define Q1PV QTV

/* ---- register tiles ------------------------------------------------------------------------- */

/* acc [MR][QNB] (vectors v0 .. v0 + PV of it) += the tile's products with rows x (a QRows, rows
 * m0 ..) for the int8 tile wp ([ceil(K / 4)][QNB][4] bytes). */
#define DEFINE_Q8_TILE(MR, PV)                                                                           \
    static inline void q8_tile_##MR(const uint8_t *wp, const QRows *x, int64_t m0, int v0, float *acc,   \
                                    const char *pf, int64_t npf) {                                       \
        const int64_t steps = (x->k + 3) / 4, per = Q8_BLOCK / 4;                                        \
        for (int64_t b = 0; b < x->nb; b++) {                                                            \
            qv d[MR][PV];                                                                                \
            _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++)                                         \
                _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) d[m][v] = qv_zero();                \
            const int64_t s1 = (b + 1) * per < steps ? (b + 1) * per : steps;                            \
            for (int64_t s = b * per; s < s1; s++) {                                                     \
                const uint8_t *ws = wp + s * QNB * 4 + v0 * QL * 4;                                      \
                if (s < npf) __builtin_prefetch(pf + s * 64, 0, 2);                                      \
                qv w[PV];                                                                                \
                _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) w[v] = q8_weights(qv_load(ws + v * QL * 4)); \
                _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++) {                                   \
                    const qx xm = q8_x(x4_at(x->q + (m0 + m) * x->stride + 4 * s));                      \
                    _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) d[m][v] = q8_dotx(d[m][v], w[v], xm); \
                }                                                                                        \
            }                                                                                            \
            _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++) {                                       \
                const int64_t at = (m0 + m) * x->nb + b;                                                 \
                const float sx = x->scale[at];                                                           \
                const int32_t minus = Q8_OFFSET * x->sum[at];                                            \
                _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) {                                   \
                    float *a = acc + m * QNB + (v0 + v) * QL;                                            \
                    store(a, qv_float(d[m][v], minus) * sx + load(a));                                   \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
    }

/* int4: the same over the tile wp ([K / 8][QNB][4] bytes) in groups of x->block k (the weights'
 * group size), with the group scales sw ([K / G][QNB], fp32, or fp16 with half). */
#define DEFINE_Q4_TILE(MR, PV)                                                                           \
    static inline void q4_tile_##MR(const uint8_t *wp, const void *sw, int half, const QRows *x,         \
                                    int64_t m0, int v0, float *acc, const char *pf, int64_t npf) {       \
        const int64_t per = x->block / 8;                                                                \
        for (int64_t g = 0; g < x->nb; g++) {                                                            \
            qv d[MR][PV];                                                                                \
            _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++)                                         \
                _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) d[m][v] = qv_zero();                \
            for (int64_t s0 = g * per; s0 < (g + 1) * per; s0 += Q4_SPAN) { /* spans of short sums */    \
                const int64_t s1 = s0 + Q4_SPAN < (g + 1) * per ? s0 + Q4_SPAN : (g + 1) * per;          \
                qv h[MR][PV];                                                                            \
                _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++)                                     \
                    _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) h[m][v] = qv_zero();            \
                for (int64_t s = s0; s < s1; s++) {                                                      \
                    const uint8_t *ws = wp + s * QNB * 4 + v0 * QL * 4;                                  \
                    if (s < npf) __builtin_prefetch(pf + s * 64, 0, 2);                                  \
                    _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) {                               \
                        const qv raw = qv_load(ws + v * QL * 4), lo = q4_low(raw), hi = q4_high(raw);    \
                        _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++) {                           \
                            const int8_t *xm = x->q + (m0 + m) * x->stride + 8 * s;                      \
                            h[m][v] = q4_pair(h[m][v], lo, hi, x4_at(xm), x4_at(xm + 4));                \
                        }                                                                                \
                    }                                                                                    \
                }                                                                                        \
                _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++)                                     \
                    _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) d[m][v] = q4_widen(d[m][v], h[m][v]); \
            }                                                                                            \
            vf scale[PV];                                                                                \
            _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) {                                       \
                const int64_t at = g * QNB + (v0 + v) * QL;                                              \
                scale[v] = half ? load_h((const uint16_t *)sw + at) : load((const float *)sw + at);      \
            }                                                                                            \
            _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++) {                                       \
                const int64_t at = (m0 + m) * x->nb + g;                                                 \
                const float sx = x->scale[at];                                                           \
                const int32_t minus = 8 * x->sum[at];                                                    \
                _Pragma("GCC unroll 8") for (int v = 0; v < PV; v++) {                                   \
                    float *a = acc + m * QNB + (v0 + v) * QL;                                            \
                    store(a, qv_float(d[m][v], minus) * (scale[v] * sx) + load(a));                      \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
    }

/* One row takes a whole tile k-step a pass (Q1PV vectors): the weights stream in order, each line once,
 * where two passes over half k-steps would each touch every other line (a decode step's weights come
 * from memory: 1.1-1.3x on AVX2 at one row). */
DEFINE_Q8_TILE(1, Q1PV)
DEFINE_Q8_TILE(2, QPV)
#if Q8_MR > 2
DEFINE_Q8_TILE(3, QPV)
DEFINE_Q8_TILE(4, QPV)
DEFINE_Q8_TILE(5, QPV)
DEFINE_Q8_TILE(6, QPV)
#endif
DEFINE_Q4_TILE(1, Q1PV)
DEFINE_Q4_TILE(2, QPV)
#if Q4_MR > 2
DEFINE_Q4_TILE(3, QPV)
DEFINE_Q4_TILE(4, QPV)
#endif

/* A quantized matrix as packed (bits 8 or 4; group: int4's group size; half: int4 scales in fp16). */
typedef struct {
    const uint8_t *w;
    const void *scales;
    int64_t bits, group, half_scales;
} QMatrix;

/* The activation block a matrix's rows are quantized with. */
static inline int64_t qmatrix_block(const QMatrix *w) { return w->bits == 8 ? Q8_BLOCK : w->group; }

/* y[:, lo - col0 : hi - col0] <- x (rows quantized for w) . weight rows [lo, hi)^T (+ bias[lo:hi]), y's
 * row stride ys; tiles that [lo, hi) cuts are computed whole and stored in part. Each block of rows
 * prefetches its share of the next tile into L2 while it computes (as gemm.h). */
static void qmatrix_rows(const QMatrix *w, const float *bias, const QRows *x, float *y, int64_t ys, int64_t lo,
                         int64_t hi, int64_t col0) {
    float acc[Q8_MR * QNB] __attribute__((aligned(64)));
    const int64_t K = x->k, M = x->rows, mr = w->bits == 8 ? Q8_MR : Q4_MR;
    const int64_t tile_bytes = w->bits == 8 ? (K + 3) / 4 * QNB * 4 : K / 8 * QNB * 4;
    const int64_t steps = w->bits == 8 ? (K + 3) / 4 : K / 8;
    const int64_t blocks = (M + mr - 1) / mr, lines = tile_bytes / 64, share = (lines + blocks - 1) / blocks;
    for (int64_t t = lo / QNB; t * QNB < hi; t++) {
        const uint8_t *wp = w->w + t * tile_bytes;
        const int64_t a = t * QNB < lo ? lo : t * QNB, b = (t + 1) * QNB > hi ? hi : (t + 1) * QNB;
        for (int64_t m0 = 0; m0 < M; m0 += mr) {
            const int64_t rows = M - m0 < mr ? M - m0 : mr, first = m0 / mr * share;
            int64_t npf = b >= hi || first >= lines ? 0 : share < lines - first ? share : lines - first;
            if (npf > steps) npf = steps;
            const char *pf = (const char *)(wp + tile_bytes) + first * 64;
            memset(acc, 0, sizeof(float) * (size_t)(rows * QNB));
            const int pv = rows == 1 ? Q1PV : QPV;
            for (int v0 = 0; v0 < QTV; v0 += pv) {
                const int64_t n = npf * pv / QTV; /* each pass its part of the lines */
                const char *p = pf + (int64_t)v0 / pv * n * 64;
                if (w->bits == 8) {
                    switch (rows) {
                        case 1: q8_tile_1(wp, x, m0, v0, acc, p, n); break;
#if Q8_MR > 2
                        case 2: q8_tile_2(wp, x, m0, v0, acc, p, n); break;
                        case 3: q8_tile_3(wp, x, m0, v0, acc, p, n); break;
                        case 4: q8_tile_4(wp, x, m0, v0, acc, p, n); break;
                        case 5: q8_tile_5(wp, x, m0, v0, acc, p, n); break;
                        default: q8_tile_6(wp, x, m0, v0, acc, p, n); break;
#else
                        default: q8_tile_2(wp, x, m0, v0, acc, p, n); break;
#endif
                    }
                } else {
                    const void *sw = w->half_scales ? (const void *)((const uint16_t *)w->scales + t * (K / w->group) * QNB)
                                                    : (const void *)((const float *)w->scales + t * (K / w->group) * QNB);
                    switch (rows) {
                        case 1: q4_tile_1(wp, sw, (int)w->half_scales, x, m0, v0, acc, p, n); break;
#if Q4_MR > 2
                        case 2: q4_tile_2(wp, sw, (int)w->half_scales, x, m0, v0, acc, p, n); break;
                        case 3: q4_tile_3(wp, sw, (int)w->half_scales, x, m0, v0, acc, p, n); break;
                        default: q4_tile_4(wp, sw, (int)w->half_scales, x, m0, v0, acc, p, n); break;
#else
                        default: q4_tile_2(wp, sw, (int)w->half_scales, x, m0, v0, acc, p, n); break;
#endif
                    }
                }
            }
            for (int64_t m = 0; m < rows; m++) {
                float *ym = y + (m0 + m) * ys + (a - col0);
                const float *am = acc + m * QNB + (a - t * QNB);
                const float *sw = w->bits == 8 ? (const float *)w->scales + a : 0;
                for (int64_t n = 0; n < b - a; n++) { /* one rounding: fma, or the product, or the sum */
                    if (sw)
                        ym[n] = bias ? fmaf(am[n], sw[n], bias[a + n]) : am[n] * sw[n];
                    else
                        ym[n] = bias ? am[n] + bias[a + n] : am[n];
                }
            }
        }
    }
}

#endif
