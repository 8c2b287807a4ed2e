/* Matrix products for decode steps of many rows: y = x W^T (+ bias) over a weight packed at bind time
 * (fp32, or fp16: gemm_packed_h), for any number of rows M. Included by decode_stack.c; kernels/cpu/build.py keys its cache on it.
 *
 * Why a packed copy. Past a few rows a decode step's matmuls are compute-bound, and on a core that
 * retires two 512-bit FMAs a cycle the unpacked nn.Linear layout [N, K] (K contiguous) leaves two poor
 * choices: dot products over K in the lanes (gemv.h: every tile ends in a horizontal reduction, ~3
 * shuffle-port uops per output, a fifth of the FMAs at K = 256) or one broadcast weight per FMA (a
 * broadcast load per FMA: the load ports, not the FMA units, set the rate). Packed as
 * [ceil(N / GEMM_NB)][K][GEMM_NB] (GEMM_NB consecutive weight rows interleaved by k, zeros past N), a
 * register tile holds GEMM_V vectors of outputs (GEMM_NB columns) for GEMM_MR rows of x: per k, GEMM_V
 * vector loads, GEMM_MR broadcasts of x[m, k] and GEMM_V * GEMM_MR FMAs, and the outputs are stored
 * straight into y's rows. torch's sgemm packs its operands on every call instead, a cost decode's
 * small row counts do not amortize (bench/cpu_wide_decode.py prints the stack's FLOP rate beside
 * F.linear's on the same matrices).
 *
 * Summation order: every output is one FMA chain over k = 0 .. K - 1 in order from 0, then the bias:
 * the same floats whatever the tile, block, row count or thread an output falls in.
 */
#ifndef FREIGHT_GEMM_H
#define FREIGHT_GEMM_H

#include <stdint.h>

#include "simd.h"

#if LANES == 16
#define GEMM_V 4 /* 24 accumulators of 32 zmm registers */
#else
#define GEMM_V 2 /* 12 accumulators of 16 ymm registers */
#endif
#define GEMM_NB (GEMM_V * LANES) /* weight rows per packed tile */
#define GEMM_MR 6                /* rows of x per register tile */

/* out [mr, GEMM_NB] <- x rows [0, MR) (row stride xs) . the packed tile wp [K, GEMM_NB]; meanwhile the
 * first npf 64-byte lines from pf are prefetched into L2, one per k. SFX: "" for fp32 weights, _h for
 * fp16 ones (raw half bits, widened exactly on load: the same floats from half the bytes). */
#define DEFINE_GEMM_TILE(MR, SFX, WT, LOADW)                                                            \
    static inline void gemm_tile##SFX##_##MR(const WT *wp, const char *pf, int64_t npf, int64_t K,       \
                                             const float *x, int64_t xs, float *out) {                  \
        vf acc[MR][GEMM_V];                                                                            \
        _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++)                                          \
            _Pragma("GCC unroll 4") for (int v = 0; v < GEMM_V; v++) acc[m][v] = (vf){0};             \
        for (int64_t k = 0; k < K; k++) {                                                              \
            vf wv[GEMM_V];                                                                             \
            if (k < npf) __builtin_prefetch(pf + k * 64, 0, 2);                                        \
            _Pragma("GCC unroll 4") for (int v = 0; v < GEMM_V; v++) wv[v] = LOADW(wp + k * GEMM_NB + v * LANES); \
            _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++) {                                    \
                const vf xm = splat(x[m * xs + k]);                                                    \
                _Pragma("GCC unroll 4") for (int v = 0; v < GEMM_V; v++) acc[m][v] = vfma(wv[v], xm, acc[m][v]); \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++)                                          \
            _Pragma("GCC unroll 4") for (int v = 0; v < GEMM_V; v++) store(out + m * GEMM_NB + v * LANES, acc[m][v]); \
    }

#define DEFINE_GEMM_TILES(MR) DEFINE_GEMM_TILE(MR, , float, load) DEFINE_GEMM_TILE(MR, _h, uint16_t, load_h)
DEFINE_GEMM_TILES(1)
DEFINE_GEMM_TILES(2)
DEFINE_GEMM_TILES(3)
DEFINE_GEMM_TILES(4)
DEFINE_GEMM_TILES(5)
DEFINE_GEMM_TILES(6)

/* y[:, lo - col0 : hi - col0] <- x [M, K] (row stride xs) . packed weight rows [lo, hi)^T (+ bias[lo:hi]),
 * y's row stride ys; any M >= 1. Tiles that [lo, hi) cuts are computed whole and stored in part.
 * Each block of rows fetches its share of the next tile into L2, one line per k: its weights arrive
 * from L3 or memory while this tile computes; spread over the blocks, the fetch adds one load per k
 * to each, where the whole tile fetched by the first block would stall that block on four. Past K
 * lines a block, the rest is left to the hardware. */
#define DEFINE_GEMM_PACKED(SFX, WT)                                                                      \
    static void gemm_packed##SFX(const WT *packed, const float *bias, int64_t K, const float *x, int64_t xs, \
                                 int64_t M, float *y, int64_t ys, int64_t lo, int64_t hi, int64_t col0) { \
        float out[GEMM_MR * GEMM_NB] __attribute__((aligned(64)));                                      \
        const int64_t blocks = (M + GEMM_MR - 1) / GEMM_MR, lines = K * GEMM_NB * (int64_t)sizeof(WT) / 64; \
        const int64_t share = (lines + blocks - 1) / blocks;                                            \
        for (int64_t t = lo / GEMM_NB; t * GEMM_NB < hi; t++) { /* a tile over all rows: in L1/L2 */     \
            const WT *wp = packed + t * K * GEMM_NB;                                                    \
            const int64_t a = t * GEMM_NB < lo ? lo : t * GEMM_NB;                                      \
            const int64_t b = (t + 1) * GEMM_NB > hi ? hi : (t + 1) * GEMM_NB;                          \
            for (int64_t m0 = 0; m0 < M; m0 += GEMM_MR) {                                               \
                const int64_t mr = M - m0 < GEMM_MR ? M - m0 : GEMM_MR, first = m0 / GEMM_MR * share;   \
                const int64_t npf = b >= hi || first >= lines ? 0 : share < lines - first ? share : lines - first; \
                const char *pf = (const char *)(wp + K * GEMM_NB) + first * 64;                         \
                const float *xm = x + m0 * xs;                                                          \
                switch (mr) {                                                                           \
                    case 1: gemm_tile##SFX##_1(wp, pf, npf, K, xm, xs, out); break;                     \
                    case 2: gemm_tile##SFX##_2(wp, pf, npf, K, xm, xs, out); break;                     \
                    case 3: gemm_tile##SFX##_3(wp, pf, npf, K, xm, xs, out); break;                     \
                    case 4: gemm_tile##SFX##_4(wp, pf, npf, K, xm, xs, out); break;                     \
                    case 5: gemm_tile##SFX##_5(wp, pf, npf, K, xm, xs, out); break;                     \
                    default: gemm_tile##SFX##_6(wp, pf, npf, K, xm, xs, out); break;                    \
                }                                                                                       \
                for (int64_t m = 0; m < mr; m++) {                                                      \
                    float *ym = y + (m0 + m) * ys + (a - col0);                                         \
                    const float *om = out + m * GEMM_NB + (a - t * GEMM_NB);                            \
                    const float *bm = bias ? bias + a : 0;                                              \
                    for (int64_t n = 0; n < b - a; n++) ym[n] = bm ? om[n] + bm[n] : om[n];             \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }

DEFINE_GEMM_PACKED(, float)
DEFINE_GEMM_PACKED(_h, uint16_t)

#endif
