/* Paged decode attention on the CPU: one query token per sequence over its blocks of the KV cache.
 *
 * Reads each sequence's keys and values once, straight from the cache through its block table (no
 * gathered copy), with an online softmax per query head; also writes each head's log-sum-exp so a
 * caller can merge a result over other keys (cascade attention over a shared prefix).
 * Layouts (fp32, contiguous): q [B, Hq, D] (row stride q_stride), k/v cache [blocks, bs, Hkv, D],
 * block_tables int32 [B, bt_stride], context_lens int32 [B]. Keys from block `start_block` of each
 * sequence up to context_lens[b] - 1 are attended (the last `window` of them when window > 0; scores
 * soft-capped when softcap > 0); each sequence must have at least one.
 * Built by kernels/cpu/build.py with -O3 -march=native; the arithmetic is on GCC vector types
 * (simd.h), a vector of keys or of head-dimension floats at a time.
 */
#include <stdint.h>

#include "decode_attention.h"
#include "threads.h"

/* 1 when these sizes fit the compiled kernels, else 0 (the caller then uses the torch path). */
int paged_decode_attention_supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size) {
    return decode_attention_fits(num_heads, num_kv_heads, head_dim, block_size);
}

/* Returns 0, or -1 when the sizes do not fit (see paged_decode_attention_supports). */
int paged_decode_attention_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *context_lens,
                               int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               int64_t block_size, int64_t start_block, float scale, float *out, float *lse,
                               int64_t num_threads, int64_t window, float softcap) {
    if (!paged_decode_attention_supports(num_heads, num_kv_heads, head_dim, block_size)) return -1;
    num_threads = threads_for(batch, 1, num_threads); /* a thread per sequence at most */
    DecodeJob jobs[MAX_THREADS];
    for (int64_t i = 0; i < num_threads; i++) {
        jobs[i] = (DecodeJob){q, k_cache, v_cache, block_tables, context_lens, batch, q_stride, num_heads,
                        num_kv_heads, head_dim, block_size, bt_stride, start_block, scale, out, lse,
                        i, num_threads, window, softcap};
    }
    run_tasks(decode_job_run, jobs, sizeof(DecodeJob), num_threads);
    return 0;
}
