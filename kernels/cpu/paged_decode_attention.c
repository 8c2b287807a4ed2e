/* Paged decode attention on the CPU: one query token per sequence over its blocks of the KV cache.
 *
 * Reads each sequence's keys and values once, straight from the cache through its block table (no
 * gathered copy), with an online softmax per query head; also writes each head's log-sum-exp so a
 * caller can merge a result over other keys (cascade attention over a shared prefix).
 * Layouts (fp32, contiguous): q [B, Hq, D] (row stride q_stride), k/v cache [blocks, bs, Hkv, D],
 * block_tables int32 [B, bt_stride], context_lens int32 [B]. Keys from block `start_block` of each
 * sequence up to context_lens[b] - 1 are attended; each sequence must have at least one.
 * Built by kernels/cpu/build.py with -O3 -march=native; the loops are written so the compiler
 * vectorizes them along the head dimension.
 */
#include <math.h>
#include <stdint.h>

#include "simd.h"
#include "threads.h"

#define MAX_BLOCK 64
#define MAX_HEADS 128
#define MAX_DIM 256

typedef struct {
    const float *q, *k_cache, *v_cache;
    const int32_t *block_tables, *context_lens;
    int64_t batch, q_stride, num_heads, num_kv_heads, head_dim, block_size, bt_stride, start_block;
    float scale;
    float *out, *lse;
    int64_t first, step; /* sequences first, first + step, ... */
} Job;

/* One block's n keys for one query head (head_dim = NV * LANES): q (pre-scaled) and the block's
 * running max m, sum l and output accumulator acc (in registers for the block) are updated with an
 * online softmax; four keys' dot products run interleaved. ts: floats between a block's key rows. */
#define DEFINE_ATTEND_BLOCK(NV)                                                                       \
    static void attend_block_##NV(const float *q, const float *kb, const float *vb, int64_t n,         \
                                  int64_t ts, float *m, float *l, float *acc_out) {                    \
        vf qv[NV], acc[NV];                                                                           \
        float s[MAX_BLOCK + LANES];                                                                     \
        for (int i = 0; i < NV; i++) qv[i] = load(q + i * LANES);                                     \
        int64_t t = 0;                                                                                \
        for (; t + 4 <= n; t += 4) {                                                                  \
            const float *k0 = kb + t * ts, *k1 = k0 + ts, *k2 = k1 + ts, *k3 = k2 + ts;               \
            vf a0 = qv[0] * load(k0), a1 = qv[0] * load(k1), a2 = qv[0] * load(k2),                   \
               a3 = qv[0] * load(k3);                                                                 \
            for (int i = 1; i < NV; i++) {                                                            \
                a0 += qv[i] * load(k0 + i * LANES);                                                   \
                a1 += qv[i] * load(k1 + i * LANES);                                                   \
                a2 += qv[i] * load(k2 + i * LANES);                                                   \
                a3 += qv[i] * load(k3 + i * LANES);                                                   \
            }                                                                                         \
            s[t] = hsum(a0), s[t + 1] = hsum(a1), s[t + 2] = hsum(a2), s[t + 3] = hsum(a3);           \
        }                                                                                             \
        for (; t < n; t++) {                                                                          \
            const float *kt = kb + t * ts;                                                            \
            vf a = qv[0] * load(kt);                                                                  \
            for (int i = 1; i < NV; i++) a += qv[i] * load(kt + i * LANES);                           \
            s[t] = hsum(a);                                                                           \
        }                                                                                             \
        float mx = *m;                                                                                \
        for (t = 0; t < n; t++) mx = s[t] > mx ? s[t] : mx;                                           \
        const float correction = exp_nonpositive1(*m - mx); /* ~0 on the first block: m is -inf */   \
        for (t = 0; t < n; t += LANES) store(s + t, exp_nonpositive(load(s + t) - mx));               \
        float sum = 0.0f;                                                                             \
        for (t = 0; t < n; t++) sum += s[t];                                                          \
        for (int i = 0; i < NV; i++) acc[i] = load(acc_out + i * LANES) * correction;                 \
        for (t = 0; t < n; t++) {                                                                     \
            const float *vt = vb + t * ts;                                                            \
            for (int i = 0; i < NV; i++) acc[i] += s[t] * load(vt + i * LANES);                       \
        }                                                                                             \
        for (int i = 0; i < NV; i++) store(acc_out + i * LANES, acc[i]);                              \
        *l = *l * correction + sum;                                                                   \
        *m = mx;                                                                                      \
    }

DEFINE_ATTEND_BLOCK(1)
DEFINE_ATTEND_BLOCK(2)
DEFINE_ATTEND_BLOCK(4)
DEFINE_ATTEND_BLOCK(8)
DEFINE_ATTEND_BLOCK(16)
DEFINE_ATTEND_BLOCK(32) /* head_dim 256 with 8 lanes (AVX2) */

typedef void (*AttendBlock)(const float *, const float *, const float *, int64_t, int64_t, float *, float *, float *);

static AttendBlock block_kernel(int64_t head_dim) {
    if (head_dim % LANES) return 0;
    switch (head_dim / LANES) {
        case 1: return attend_block_1;
        case 2: return attend_block_2;
        case 4: return attend_block_4;
        case 8: return attend_block_8;
        case 16: return attend_block_16;
        case 32: return attend_block_32;
        default: return 0;
    }
}

/* One sequence: block by block (each block's K and V rows are read once, for every head, while the
 * next block is prefetched), heads inside; per-head state lives in small arrays that stay in L1
 * (at most MAX_HEADS x MAX_DIM floats, checked by paged_decode_attention_supports). */
static void attend_sequence(const Job *job, int64_t b) {
    const int64_t hq = job->num_heads, hkv = job->num_kv_heads, d = job->head_dim, bs = job->block_size;
    const int64_t group = hq / hkv, ts = hkv * d, ctx = job->context_lens[b];
    const int32_t *table = job->block_tables + b * job->bt_stride;
    const AttendBlock attend = block_kernel(d);
    float q[hq * d], acc[hq * d], m[hq], l[hq]; /* sized to the model: a few KB of stack */
    const float *qb = job->q + b * job->q_stride;
    for (int64_t i = 0; i < hq * d; i++) {
        q[i] = qb[i] * job->scale;
        acc[i] = 0.0f;
    }
    for (int64_t h = 0; h < hq; h++) m[h] = -INFINITY, l[h] = 0.0f;
    const int64_t num_blocks = (ctx + bs - 1) / bs, block_floats = bs * ts;
    for (int64_t j = job->start_block; j < num_blocks; j++) {
        const int64_t n = (j + 1) * bs <= ctx ? bs : ctx - j * bs;
        const float *kb = job->k_cache + (int64_t)table[j] * block_floats;
        const float *vb = job->v_cache + (int64_t)table[j] * block_floats;
        if (j + 1 < num_blocks) { /* blocks are scattered in the cache: fetch the next one early */
            const float *kn = job->k_cache + (int64_t)table[j + 1] * block_floats;
            const float *vn = job->v_cache + (int64_t)table[j + 1] * block_floats;
            for (int64_t i = 0; i < block_floats; i += 16) {
                __builtin_prefetch(kn + i, 0, 2);
                __builtin_prefetch(vn + i, 0, 2);
            }
        }
        for (int64_t h = 0; h < hq; h++) {
            const int64_t off = (h / group) * d;
            attend(q + h * d, kb + off, vb + off, n, ts, m + h, l + h, acc + h * d);
        }
    }
    float *o = job->out + b * hq * d;
    for (int64_t h = 0; h < hq; h++) {
        const float inv = 1.0f / l[h];
        for (int64_t i = 0; i < d; i++) o[h * d + i] = acc[h * d + i] * inv;
        if (job->lse) job->lse[b * hq + h] = m[h] + logf(l[h]);
    }
}

static void *run_job(void *arg) {
    const Job *job = (const Job *)arg;
    for (int64_t b = job->first; b < job->batch; b += job->step) attend_sequence(job, b);
    return 0;
}

/* 1 when these sizes fit the compiled kernels, else 0 (the caller then uses the torch path). */
int paged_decode_attention_supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size) {
    return block_kernel(head_dim) && num_heads <= MAX_HEADS && head_dim <= MAX_DIM && block_size <= MAX_BLOCK &&
           num_kv_heads > 0 && num_heads % num_kv_heads == 0;
}

/* Returns 0, or -1 when the sizes do not fit (see paged_decode_attention_supports). */
int paged_decode_attention_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *context_lens,
                               int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               int64_t block_size, int64_t start_block, float scale, float *out, float *lse,
                               int64_t num_threads) {
    if (!paged_decode_attention_supports(num_heads, num_kv_heads, head_dim, block_size)) return -1;
    num_threads = threads_for(batch, 1, num_threads); /* a thread per sequence at most */
    Job jobs[MAX_THREADS];
    for (int64_t i = 0; i < num_threads; i++) {
        jobs[i] = (Job){q, k_cache, v_cache, block_tables, context_lens, batch, q_stride, num_heads,
                        num_kv_heads, head_dim, block_size, bt_stride, start_block, scale, out, lse,
                        i, num_threads};
    }
    run_tasks(run_job, jobs, sizeof(Job), num_threads);
    return 0;
}
