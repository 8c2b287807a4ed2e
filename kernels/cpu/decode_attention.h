/* The core of freight's paged decode attention on the CPU: one query token per sequence over its
 * blocks of the KV cache, read straight from the cache through the block table, an online softmax
 * per query head. Included by paged_decode_attention.c (the kernel on its own) and decode_stack.c
 * (inside a whole decoder layer); kernels/cpu/build.py keys its cache on this file too.
 * Layouts (fp32, contiguous): q [B, Hq, D] (row stride q_stride), k/v cache [blocks, bs, Hkv, D],
 * block_tables int32 [B, bt_stride], context_lens int32 [B]; out [B, Hq, D] contiguous, lse [B, Hq].
 * window > 0: only keys ctx - window .. ctx - 1 are read (sliding window; blocks before it are never
 * touched, not even prefetched); softcap > 0: scores s -> softcap * tanh(s / softcap).
 */
#ifndef FREIGHT_DECODE_ATTENTION_H
#define FREIGHT_DECODE_ATTENTION_H

#include <math.h>
#include <stdint.h>

#include "simd.h"
#include "softmax.h"

#define MAX_HEADS 128
#define MAX_DIM 256

typedef struct {
    const float *q, *k_cache, *v_cache;
    const int32_t *block_tables, *context_lens;
    int64_t batch, q_stride, num_heads, num_kv_heads, head_dim, block_size, bt_stride, start_block;
    float scale;
    float *out, *lse;
    int64_t first, step; /* sequences first, first + step, ... */
    int64_t window;      /* 0: whole context (members after `step` default to 0 in brace initializers) */
    float softcap;       /* 0: off */
} DecodeJob;

/* Up to LANES keys (rows ts floats apart from kb) for NQ query heads that share them (a GQA group,
 * heads side by side in q, pre-scaled): each key row is loaded once for all NQ heads, and a head's
 * dot products are reduced together into one vector of scores (two keys at a time as they are
 * computed, then transpose_sum) instead of one horizontal sum per key. Then an online-softmax update
 * of each head's running max m, sum l and output accumulator acc_out (head_dim = NV * LANES floats
 * per head). Keys past n read row 0 (always valid memory) and are masked out. Meanwhile `lines`
 * cache lines of the next block's K (from pk) and V (from pv) are prefetched, spread over the keys:
 * issued all at once they stall the core on its few line-fill buffers. */
#define DEFINE_ATTEND_KEYS(NV, NQ)                                                                    \
    static void attend_keys_##NV##_##NQ(const float *q, const float *kb, const float *vb, int64_t n,   \
                                        int64_t ts, float *m, float *l, float *acc_out, const char *pk, \
                                        const char *pv, int64_t lines, float softcap) {                \
        const int64_t d = NV * LANES;                                                                 \
        vf pairs[NQ][LANES / 2];                                                                      \
        for (int t = 0; t < LANES; t += 2) {                                                          \
            for (int64_t u = t * lines / LANES; u < (t + 2) * lines / LANES; u++) {                   \
                __builtin_prefetch(pk + u * 64, 0, 2);                                                \
                __builtin_prefetch(pv + u * 64, 0, 2);                                                \
            }                                                                                         \
            const float *k0 = kb + (t < n ? t : 0) * ts, *k1 = kb + (t + 1 < n ? t + 1 : 0) * ts;     \
            vf x0[NQ], x1[NQ];                                                                        \
            for (int h = 0; h < NQ; h++) {                                                            \
                x0[h] = load(q + h * d) * load(k0);                                                   \
                x1[h] = load(q + h * d) * load(k1);                                                   \
            }                                                                                         \
            for (int i = 1; i < NV; i++) {                                                            \
                const vf a = load(k0 + i * LANES), b = load(k1 + i * LANES);                          \
                for (int h = 0; h < NQ; h++) {                                                        \
                    x0[h] += load(q + h * d + i * LANES) * a;                                         \
                    x1[h] += load(q + h * d + i * LANES) * b;                                         \
                }                                                                                     \
            }                                                                                         \
            for (int h = 0; h < NQ; h++) pairs[h][t / 2] = pair_sum(x0[h], x1[h]);                    \
        }                                                                                             \
        float p[NQ][LANES], correction[NQ];                                                           \
        for (int h = 0; h < NQ; h++) {                                                                \
            vf s = transpose_sum(pairs[h], LANES / 2);                                                \
            if (softcap > 0.0f) s = soft_cap(s, softcap);                                             \
            correction[h] = softmax_update(s, n, m + h, l + h, p[h]);                                 \
        }                                                                                             \
        vf acc[NQ][NV];                                                                               \
        for (int h = 0; h < NQ; h++)                                                                  \
            for (int i = 0; i < NV; i++) acc[h][i] = load(acc_out + h * d + i * LANES) * correction[h]; \
        for (int64_t t = 0; t < n; t++) {                                                             \
            const float *vt = vb + t * ts;                                                            \
            for (int i = 0; i < NV; i++) {                                                            \
                const vf vv = load(vt + i * LANES);                                                   \
                for (int h = 0; h < NQ; h++) acc[h][i] += p[h][t] * vv;                               \
            }                                                                                         \
        }                                                                                             \
        for (int h = 0; h < NQ; h++)                                                                  \
            for (int i = 0; i < NV; i++) store(acc_out + h * d + i * LANES, acc[h][i]);               \
    }

#define DEFINE_ATTEND(NV) DEFINE_ATTEND_KEYS(NV, 1) DEFINE_ATTEND_KEYS(NV, 2)
DEFINE_ATTEND(1)
DEFINE_ATTEND(2)
DEFINE_ATTEND(4)
DEFINE_ATTEND(8)
DEFINE_ATTEND(16)
DEFINE_ATTEND(32) /* head_dim 256 with 8 lanes (AVX2) */

typedef void (*AttendKeys)(const float *, const float *, const float *, int64_t, int64_t, float *, float *, float *,
                           const char *, const char *, int64_t, float);

/* The kernel for NQ (1 or 2) heads of head_dim floats, or 0 when head_dim does not fit. */
static AttendKeys keys_kernel(int64_t head_dim, int64_t nq) {
    if (head_dim % LANES) return 0;
#define PICK(NV) return nq == 2 ? attend_keys_##NV##_2 : attend_keys_##NV##_1
    switch (head_dim / LANES) {
        case 1: PICK(1);
        case 2: PICK(2);
        case 4: PICK(4);
        case 8: PICK(8);
        case 16: PICK(16);
        case 32: PICK(32);
        default: return 0;
    }
#undef PICK
}

#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 4
#endif
/* Walks the (sequence, block) pairs of a job in the order they are attended, PREFETCH_AHEAD blocks
 * ahead of the work: the block whose K and V are prefetched while the current block is attended, so
 * a sequence's first blocks are on their way while the previous sequence ends. */
typedef struct {
    int64_t b, j, end; /* sequence, its next block, its number of blocks */
} Cursor;

static int64_t blocks_of(const DecodeJob *job, int64_t b) { return (job->context_lens[b] + job->block_size - 1) / job->block_size; }

/* The first key sequence b reads (its window's start, or 0), and the first block it reads. */
static int64_t first_key(const DecodeJob *job, int64_t b) {
    const int64_t lo = job->window > 0 ? job->context_lens[b] - job->window : 0;
    return lo > 0 ? lo : 0;
}
static int64_t first_block(const DecodeJob *job, int64_t b) {
    const int64_t j = first_key(job, b) / job->block_size;
    return j > job->start_block ? j : job->start_block;
}

/* The next block to prefetch (its id, and *keys = its keys in use), or -1 past the job's last block. */
static int64_t cursor_next(const DecodeJob *job, Cursor *c, int64_t *keys) {
    while (c->j >= c->end) {
        c->b += job->step;
        if (c->b >= job->batch) return -1;
        c->j = first_block(job, c->b);
        c->end = blocks_of(job, c->b);
    }
    const int64_t left = job->context_lens[c->b] - c->j * job->block_size;
    *keys = left < job->block_size ? left : job->block_size;
    return job->block_tables[c->b * job->bt_stride + c->j++];
}

/* One sequence: block by block (each block's K and V rows are read once, for every head, while a
 * block further on is prefetched), LANES keys at a time, heads inside; per-head state lives in small
 * arrays that stay in L1 (at most MAX_HEADS x MAX_DIM floats, checked by paged_decode_attention_supports). */
static void attend_sequence(const DecodeJob *job, int64_t b, Cursor *ahead) {
    const int64_t hq = job->num_heads, hkv = job->num_kv_heads, d = job->head_dim, bs = job->block_size;
    const int64_t group = hq / hkv, ts = hkv * d, ctx = job->context_lens[b];
    const int64_t nq = group % 2 ? 1 : 2; /* heads per call: pairs of a GQA group share each K/V row */
    const int32_t *table = job->block_tables + b * job->bt_stride;
    const AttendKeys attend = keys_kernel(d, nq);
    float q[hq * d], acc[hq * d], m[hq], l[hq]; /* sized to the model: a few KB of stack */
    const float *qb = job->q + b * job->q_stride;
    for (int64_t i = 0; i < hq * d; i++) {
        q[i] = qb[i] * job->scale;
        acc[i] = 0.0f;
    }
    for (int64_t h = 0; h < hq; h++) m[h] = -INFINITY, l[h] = 0.0f;
    const int64_t num_blocks = (ctx + bs - 1) / bs, block_floats = bs * ts, lo = first_key(job, b);
    for (int64_t j = first_block(job, b); j < num_blocks; j++) {
        const int64_t n = (j + 1) * bs <= ctx ? bs : ctx - j * bs;
        const float *kb = job->k_cache + (int64_t)table[j] * block_floats;
        const float *vb = job->v_cache + (int64_t)table[j] * block_floats;
        /* A block ahead: its K and V rows in use, spread over this block's calls. */
        int64_t pkeys = 0;
        const int64_t pre = cursor_next(job, ahead, &pkeys);
        const char *kn = (const char *)(job->k_cache + (pre < 0 ? 0 : pre) * block_floats);
        const char *vn = (const char *)(job->v_cache + (pre < 0 ? 0 : pre) * block_floats);
        const int64_t calls = (n + LANES - 1) / LANES * (hq / nq);
        const int64_t lines = pre < 0 ? 0 : (pkeys * ts * 4 / 64 + calls) / calls;
        for (int64_t t = lo > j * bs ? lo - j * bs : 0, c = 0; t < n; t += LANES) { /* from the window's start */
            const int64_t keys = n - t < LANES ? n - t : LANES;
            for (int64_t h = 0; h < hq; h += nq, c++) {
                const int64_t off = t * ts + (h / group) * d;
                attend(q + h * d, kb + off, vb + off, keys, ts, m + h, l + h, acc + h * d, kn + c * lines * 64,
                       vn + c * lines * 64, lines, job->softcap);
            }
        }
    }
    float *o = job->out + b * hq * d;
    for (int64_t h = 0; h < hq; h++) {
        const float inv = 1.0f / l[h];
        for (int64_t i = 0; i < d; i++) o[h * d + i] = acc[h * d + i] * inv;
        if (job->lse) job->lse[b * hq + h] = m[h] + logf(l[h]);
    }
}

/* Attends sequences job->first, first + step, ... in turn. */
static void *decode_job_run(void *arg) {
    const DecodeJob *job = (const DecodeJob *)arg;
    if (job->first >= job->batch) return 0;
    Cursor ahead = {job->first, first_block(job, job->first), blocks_of(job, job->first)};
    const int64_t ts = job->num_kv_heads * job->head_dim, block_floats = job->block_size * ts;
    for (int i = 1; i < PREFETCH_AHEAD; i++) { /* the first blocks at once: nothing to spread them over */
        int64_t keys = 0;
        const int64_t pre = cursor_next(job, &ahead, &keys);
        if (pre < 0) break;
        const char *kn = (const char *)(job->k_cache + pre * block_floats);
        const char *vn = (const char *)(job->v_cache + pre * block_floats);
        for (int64_t u = 0; u < keys * ts * 4; u += 64) {
            __builtin_prefetch(kn + u, 0, 2);
            __builtin_prefetch(vn + u, 0, 2);
        }
    }
    for (int64_t b = job->first; b < job->batch; b += job->step) attend_sequence(job, b, &ahead);
    return 0;
}

/* 1 when these sizes fit the compiled kernels, else 0 (the caller then uses the torch path). */
static int decode_attention_fits(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size) {
    return keys_kernel(head_dim, 1) && num_heads <= MAX_HEADS && head_dim <= MAX_DIM && block_size > 0 &&
           num_kv_heads > 0 && num_heads % num_kv_heads == 0;
}

#endif
