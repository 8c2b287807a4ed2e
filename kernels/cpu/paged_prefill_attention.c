/* Paged prefill attention on the CPU: a chunk of new query tokens per sequence, causal, over the
 * sequence's blocks of the KV cache (its earlier context and the chunk's own keys, already stored).
 *
 * Work is split into (sequence, KV head) items. Each item first copies its keys into a scratch
 * buffer transposed to LANES keys per vector (Kt[chunk][d][key]); then tiles of TILE query vectors
 * (tokens x the group's heads, pre-scaled) run over the chunks: the tile's TILE x LANES scores are
 * register accumulators fed by one broadcast per (row, d) and one Kt load per d (an outer-product
 * matmul, no horizontal sums), then an online softmax per row, then P x V with V read straight from
 * the cache in row subtiles whose outputs fit in registers. Also writes each row's log-sum-exp so a
 * caller can merge a result over other keys (cascade attention over a shared prefix).
 * Layouts (fp32): q [T, Hq, D] (token stride q_stride, heads contiguous), k/v cache [blocks, bs,
 * Hkv, D] contiguous, cu_seqlens int32 [B + 1], context_lens int32 [B] (keys in cache after the
 * chunk), block_tables int32 [B, bt_stride], out [T, Hq, D] contiguous, lse [T, Hq] or null.
 * Query i of sequence b sits at position context_lens[b] - q_len + i and sees keys from
 * start_block * bs up to its position; each must see at least one. window > 0: only its last
 * `window` positions (blocks wholly before the chunk's first window are never read); softcap > 0:
 * scores s -> softcap * tanh(s / softcap).
 * Built by kernels/cpu/build.py with -O3 -march=native.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "softmax.h"
#include "threads.h"

#define MAX_HEADS 128
#define MAX_DIM 256
#define TILE 12 /* query vectors per tile: TILE score vectors stay in registers (AVX2 has 16) */
#define TILE_UP ((TILE + LANES - 1) / LANES * LANES) /* TILE rounded up to whole vectors */

typedef struct {
    const float *q, *k_cache, *v_cache;
    const int32_t *cu_seqlens, *context_lens, *block_tables;
    int64_t batch, q_stride, num_heads, num_kv_heads, head_dim, block_size, bt_stride, start_block;
    float scale;
    float *out, *lse;
    int64_t first, step; /* items (b, g) = divmod(i, num_kv_heads) for i = first, first + step, ... */
    int failed;          /* set when the scratch buffer could not be allocated */
    int64_t window;      /* 0: whole context */
    float softcap;       /* 0: off */
} Job;

/* One item's keys, transposed, and where each chunk's values start. */
typedef struct {
    float *kt;            /* [chunks][head_dim][LANES]; lanes past a chunk's keys are 0 */
    const float **v;      /* [chunks]: the chunk's first value row for this KV head */
    int64_t *start, *len; /* [chunks]: first key position and number of keys */
    int64_t chunks, ts;   /* ts: floats between a block's rows */
} Keys;

/* One query tile: rows r = (token, head of the group), TILE of them (unused rows see no keys). */
typedef struct {
    float q[TILE * MAX_DIM], o[TILE * MAX_DIM], p[TILE * LANES];
    float m[TILE_UP], l[TILE_UP], correction[TILE_UP]; /* rows past TILE: padding */
    int64_t limit[TILE]; /* keys positions < limit are visible to the row (0: unused row) */
    int64_t floor[TILE]; /* ... and >= floor (its window's first key; 0 without a window) */
    int64_t seen_by_all; /* keys positions < this are visible to every used row */
    int64_t floor_max;   /* ... and >= this */
    float softcap;
} Tile;

/* The online-softmax update of rows r0 .. r0 + LANES - 1 for a chunk every one of them sees whole:
 * the rows' maxima and sums come out of one transposed reduction each, the corrections out of one
 * vector exp. Rows past TILE are padding (copies of row r0, results unused). */
static void softmax_rows(Tile *t, const vf *s, int r0) {
    vf x[LANES], e[LANES];
    for (int r = 0; r < LANES; r++) x[r] = s[r0 + r < TILE ? r0 + r : r0];
    const vf m_old = load(t->m + r0), m_new = vmax(m_old, transpose_max(x));
    const vf correction = exp_nonpositive(m_old - m_new); /* ~0 on the first keys: m is -inf */
    for (int r = 0; r < LANES; r++) {
        e[r] = exp_nonpositive(s[r0 + r < TILE ? r0 + r : r0] - m_new[r]);
        if (r0 + r < TILE) store(t->p + (r0 + r) * LANES, e[r]);
    }
    store(t->l + r0, load(t->l + r0) * correction + transpose_sum(e, LANES));
    store(t->m + r0, m_new);
    store(t->correction + r0, correction);
}

/* Scores of every row against chunk c, then the online-softmax update of each row's m, l and
 * correction, leaving the chunk's probabilities in t->p. Returns 0 when no row sees this chunk. */
static int tile_scores(Tile *t, const Keys *keys, int64_t c, int64_t d) {
    vf s[TILE];
    for (int r = 0; r < TILE; r++) s[r] = (vf){0};
    const float *kt = keys->kt + c * d * LANES;
    for (int64_t i = 0; i < d; i++) {
        const vf k = load(kt + i * LANES);
        for (int r = 0; r < TILE; r++) s[r] += t->q[r * MAX_DIM + i] * k;
    }
    if (t->softcap > 0.0f)
        for (int r = 0; r < TILE; r++) s[r] = soft_cap(s[r], t->softcap);
    const int64_t start = keys->start[c], len = keys->len[c];
    if (len == LANES && start + len <= t->seen_by_all && start >= t->floor_max) { /* the common case: no row is cut */
        for (int r0 = 0; r0 < TILE; r0 += LANES) softmax_rows(t, s, r0);
        return 1;
    }
    int any = 0;
    for (int r = 0; r < TILE; r++) {
        const int64_t n = t->limit[r] - start < len ? t->limit[r] - start : len;
        const int64_t lo = t->floor[r] > start ? t->floor[r] - start : 0;
        if (n <= lo) { /* the row sees none of these keys (or is unused) */
            t->correction[r] = 1.0f;
            store(t->p + r * LANES, (vf){0});
            continue;
        }
        any = 1;
        t->correction[r] = lo ? softmax_update_range(s[r], lo, n, t->m + r, t->l + r, t->p + r * LANES)
                              : softmax_update(s[r], n, t->m + r, t->l + r, t->p + r * LANES);
    }
    return any;
}

/* o[r] = o[r] * correction[r] + p[r] x V(chunk c), PR rows at a time with their outputs in registers
 * (head_dim = NV * LANES). */
#define DEFINE_TILE_VALUES(NV, PR)                                                                   \
    static void tile_values_##NV(Tile *t, const Keys *keys, int64_t c) {                              \
        const float *v0 = keys->v[c];                                                                 \
        const int64_t n = keys->len[c], ts = keys->ts;                                                \
        for (int r0 = 0; r0 < TILE; r0 += PR) {                                                       \
            vf o[PR][NV];                                                                             \
            for (int r = 0; r < PR; r++)                                                              \
                for (int i = 0; i < NV; i++)                                                          \
                    o[r][i] = load(t->o + (r0 + r) * MAX_DIM + i * LANES) * t->correction[r0 + r];    \
            for (int64_t k = 0; k < n; k++) {                                                         \
                const float *vk = v0 + k * ts;                                                        \
                for (int i = 0; i < NV; i++) {                                                        \
                    const vf v = load(vk + i * LANES);                                                \
                    for (int r = 0; r < PR; r++) o[r][i] += t->p[(r0 + r) * LANES + k] * v;           \
                }                                                                                     \
            }                                                                                         \
            for (int r = 0; r < PR; r++)                                                              \
                for (int i = 0; i < NV; i++) store(t->o + (r0 + r) * MAX_DIM + i * LANES, o[r][i]);   \
        }                                                                                             \
    }

/* Rows per subtile: NV * PR output vectors in registers, TILE a multiple of PR. */
DEFINE_TILE_VALUES(1, 12)
DEFINE_TILE_VALUES(2, 6)
DEFINE_TILE_VALUES(4, 6)
DEFINE_TILE_VALUES(8, 3)
DEFINE_TILE_VALUES(16, 1)
DEFINE_TILE_VALUES(32, 1)

typedef void (*TileValues)(Tile *, const Keys *, int64_t);

static TileValues values_kernel(int64_t head_dim) {
    if (head_dim % LANES) return 0;
    switch (head_dim / LANES) {
        case 1: return tile_values_1;
        case 2: return tile_values_2;
        case 4: return tile_values_4;
        case 8: return tile_values_8;
        case 16: return tile_values_16;
        case 32: return tile_values_32;
        default: return 0;
    }
}

/* Item (b, g): every query tile of sequence b's chunk for the query heads of KV head g. */
static int attend_item(const Job *job, int64_t b, int64_t g, Tile *t) {
    const int64_t hq = job->num_heads, hkv = job->num_kv_heads, d = job->head_dim, bs = job->block_size;
    const int64_t group = hq / hkv, ts = hkv * d, ctx = job->context_lens[b];
    const int64_t q0 = job->cu_seqlens[b], q_len = job->cu_seqlens[b + 1] - q0, first_pos = ctx - q_len;
    if (q_len <= 0) return 0;
    const int32_t *table = job->block_tables + b * job->bt_stride;
    const int64_t num_blocks = (ctx + bs - 1) / bs, per_block = (bs + LANES - 1) / LANES;
    /* the first block any query of the chunk sees: start_block, or its first window's */
    const int64_t lo_key = job->window > 0 && first_pos - job->window + 1 > 0 ? first_pos - job->window + 1 : 0;
    const int64_t first_block = lo_key / bs > job->start_block ? lo_key / bs : job->start_block;
    const int64_t max_chunks = (num_blocks - first_block) * per_block;
    if (max_chunks <= 0) return 0;
    char *mem = malloc(max_chunks * (d * LANES * sizeof(float) + sizeof(float *) + 2 * sizeof(int64_t)));
    if (!mem) return -1;
    Keys keys = {(float *)mem, 0, 0, 0, 0, ts};
    keys.v = (const float **)(mem + max_chunks * d * LANES * sizeof(float));
    keys.start = (int64_t *)(keys.v + max_chunks);
    keys.len = keys.start + max_chunks;
    for (int64_t j = first_block; j < num_blocks; j++) {
        const int64_t n = (j + 1) * bs <= ctx ? bs : ctx - j * bs;
        const float *kb = job->k_cache + (int64_t)table[j] * bs * ts + g * d;
        const float *vb = job->v_cache + (int64_t)table[j] * bs * ts + g * d;
        for (int64_t k0 = 0; k0 < n; k0 += LANES) {
            const int64_t c = keys.chunks++, len = n - k0 < LANES ? n - k0 : LANES;
            float *kt = keys.kt + c * d * LANES;
            memset(kt, 0, d * LANES * sizeof(float));
            for (int64_t k = 0; k < len; k++)
                for (int64_t i = 0; i < d; i++) kt[i * LANES + k] = kb[(k0 + k) * ts + i];
            keys.v[c] = vb + k0 * ts, keys.start[c] = j * bs + k0, keys.len[c] = len;
        }
    }
    const TileValues values = values_kernel(d);
    const int64_t tokens_per_tile = TILE / group;
    for (int64_t i0 = 0; i0 < q_len; i0 += tokens_per_tile) {
        const int64_t i1 = i0 + tokens_per_tile < q_len ? i0 + tokens_per_tile : q_len;
        for (int r = TILE; r < TILE_UP; r++) t->m[r] = 0.0f, t->l[r] = 0.0f;
        t->seen_by_all = first_pos + i0 + 1;
        t->floor_max = 0;
        t->softcap = job->softcap;
        for (int r = 0; r < TILE; r++) {
            const int64_t i = i0 + r / group, h = g * group + r % group;
            const int used = r < (i1 - i0) * group;
            t->limit[r] = used ? first_pos + i + 1 : 0;
            t->floor[r] = used && job->window > 0 && first_pos + i + 1 > job->window ? first_pos + i + 1 - job->window : 0;
            if (t->floor[r] > t->floor_max) t->floor_max = t->floor[r];
            t->m[r] = -INFINITY, t->l[r] = 0.0f;
            const float *src = job->q + (q0 + i) * job->q_stride + h * d;
            for (int64_t x = 0; x < d; x++) t->q[r * MAX_DIM + x] = used ? src[x] * job->scale : 0.0f;
            memset(t->o + r * MAX_DIM, 0, d * sizeof(float));
        }
        const int64_t last = t->limit[(i1 - i0) * group - 1]; /* the tile's last row sees the most */
        for (int64_t c = 0; c < keys.chunks && keys.start[c] < last; c++)
            if (keys.start[c] + keys.len[c] > t->floor[0] && tile_scores(t, &keys, c, d)) values(t, &keys, c);
        for (int r = 0; r < (i1 - i0) * group; r++) {
            const int64_t row = (q0 + i0 + r / group) * hq + g * group + r % group;
            const float inv = 1.0f / t->l[r];
            for (int64_t x = 0; x < d; x++) job->out[row * d + x] = t->o[r * MAX_DIM + x] * inv;
            if (job->lse) job->lse[row] = t->m[r] + logf(t->l[r]);
        }
    }
    free(mem);
    return 0;
}

static void *run_job(void *arg) {
    Job *job = (Job *)arg;
    Tile *tile = malloc(sizeof(Tile)); /* ~25 KB: off the stack of the runner's threads */
    if (!tile) {
        job->failed = 1;
        return 0;
    }
    const int64_t items = job->batch * job->num_kv_heads;
    for (int64_t i = job->first; i < items && !job->failed; i += job->step)
        if (attend_item(job, i / job->num_kv_heads, i % job->num_kv_heads, tile)) job->failed = 1;
    free(tile);
    return 0;
}

/* 1 when these sizes fit the compiled kernels, else 0 (the caller then uses the torch path). */
int paged_prefill_attention_supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size) {
    return values_kernel(head_dim) && num_heads <= MAX_HEADS && head_dim <= MAX_DIM && block_size > 0 &&
           num_kv_heads > 0 && num_heads % num_kv_heads == 0 && num_heads / num_kv_heads <= TILE;
}

/* Returns 0; -1 when the sizes do not fit (see paged_prefill_attention_supports); -2 when memory for
 * the scratch buffers could not be allocated. */
int paged_prefill_attention_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                                const int32_t *cu_seqlens, const int32_t *context_lens, const int32_t *block_tables,
                                int64_t bt_stride, int64_t batch, int64_t num_heads, int64_t num_kv_heads,
                                int64_t head_dim, int64_t block_size, int64_t start_block, float scale, float *out,
                                float *lse, int64_t num_threads, int64_t window, float softcap) {
    if (!paged_prefill_attention_supports(num_heads, num_kv_heads, head_dim, block_size)) return -1;
    num_threads = threads_for(batch * num_kv_heads, 1, num_threads); /* a thread per item at most */
    Job jobs[MAX_THREADS];
    for (int64_t i = 0; i < num_threads; i++) {
        jobs[i] = (Job){q, k_cache, v_cache, cu_seqlens, context_lens, block_tables, batch, q_stride, num_heads,
                        num_kv_heads, head_dim, block_size, bt_stride, start_block, scale, out, lse,
                        i, num_threads, 0, window, softcap};
    }
    run_tasks(run_job, jobs, sizeof(Job), num_threads);
    for (int64_t i = 0; i < num_threads; i++)
        if (jobs[i].failed) return -2;
    return 0;
}
