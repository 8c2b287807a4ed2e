/* A decode step's whole stack of decoder layers in one call.
 *
 * At batch 1 a layer is ~10 small ops between its four matrix-vector products; run one by one from
 * Python each costs dispatch and an activation-sized temporary, which at batch 1 rival the matmuls
 * (bench/step_overhead.py --batch1-medium). Here every layer runs in C on buffers that stay in L1/L2: RMSNorm (with the
 * residual add), the qkv GEMV (+ bias), per-head q/k RMSNorm (Qwen3), rotary, the K/V store, decode
 * attention over the paged cache, o_proj, RMSNorm, gate_up with SiLU * up, down; then the final norm,
 * and with an lm_head bound (quantized, or packed for gemm.h; decode_stack_logits_f32) the logits, split
 * over the team.
 * Only the weights stream from memory. The pieces are the same code as the one-op kernels
 * (layer_rows.h, decode_attention.h, gemv.h), so each layer computes what the op-by-op path computes,
 * except for the matmuls' summation order (gemv.h against torch's GEMM).
 *
 * Matmuls (stack_step.h's `linear`, beside the types): a quantized matrix (int8 or int4, bound packed
 * for quant.h) multiplies in integers at every row count, its input rows quantized to int8 per block
 * by each thread into its own buffer (quant.h's qmatrix_rows: the products of quant_matmul.c's one
 * Linear, the same floats). Other matrices: GEMVs (gemv.h) up to STACK_GEMV_ROWS rows;
 * beyond, the caller's sgemm (torch's BLAS: the same GEMM as F.linear) on one thread, the elementwise
 * layers and attention still in this call. A model bound with packed copies of its matrices (gemm.h)
 * multiplies steps of STACK_PACKED_ROWS rows or more (every step) with those instead: register tiles
 * that need no per-call packing (bench/cpu_wide_decode.py: the stack against F.linear's sgemm at
 * 1-64 rows); with fp16 matrices, from fp16 packed copies (the same floats as their fp32 copies').
 *
 * LoRA adapters (decode_stack_lora_f32; stack_lora.h): each row may name an adapter slot, whose low-rank
 * products each wrapped projection adds to the row after its base product, as the op-by-op path's
 * LoRA wrapper does (other summation order), without another barrier.
 *
 * Threads (up to STACK_GEMV_ROWS rows): a team of num_threads pthreads for the whole call. Each
 * matrix's output rows are split between them (a quantized one's at its 64-row tiles; gate_up by
 * intermediate columns, so each thread also applies SiLU * up to its own); the norms' inputs are
 * small, so every thread computes them into private buffers (the residual too: every thread holds
 * the same copy) instead of waiting for one; attention rows go round-robin. Five barriers a layer. Results are the same floats whatever the number of threads.
 *
 * Layouts (fp32): x [rows, hidden] (the embeddings), out [rows, hidden] (the final norm's output),
 * weights as nn.Linear [out, in] contiguous, caches [blocks, block_size, Hkv, D] contiguous,
 * block_tables int32 [rows, bt_stride], context_lens int32 [rows], positions / slots int64 [rows].
 * Built by kernels/cpu/build.py with -O3 -march=native.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_attention.h"
#include "gemm.h"
#include "gemv.h"
#include "layer_rows.h"
#include "stack_lora.h"
#include "stack_step.h"
#include "threads.h"

static void sync_team(Step *s) {
    if (s->num_threads > 1) pthread_barrier_wait(&s->barrier);
}

/* Where thread i's part of n items starts: parts cut at multiples of `unit` (a quantized matrix's tile
 * of QNB rows, which quant.h computes whole; 1 for an fp32 one), so threads [i, i + 1) hold [at(i),
 * at(i + 1)). */
static inline int64_t slice_at(int64_t n, const QMatrix *q, const Step *s, int64_t i) {
    const int64_t unit = q->w ? QNB : 1, units = (n + unit - 1) / unit, at = units * i / s->num_threads * unit;
    return at < n ? at : n;
}

/* Thread tid's output columns of y [rows, n] <- x [rows, K] (contiguous rows) . W^T (+ bias), W an [n, K]
 * matrix given as `linear` takes it, then the rows' adapters of it (lora 0: none; stack_lora.h). */
static void project_slice(const Step *s, int64_t tid, const float *w, const float *packed, const QMatrix *q,
                          const LoraMatrix *lora, const float *bias, const float *x, int64_t K, float *y, int64_t n) {
    const QRows qx = quantize_input(s, tid, q, x, K, K);
    const int64_t lo = slice_at(n, q, s, tid), hi = slice_at(n, q, s, tid + 1);
    linear(s, w, packed, q, &qx, 0, bias, K, x, K, y, n, lo, hi);
    if (lora) lora_add(s, tid, lora, x, K, K, lo, hi, y + lo, n);
}

static void *run_member(void *arg) {
    const Member *me = (const Member *)arg;
    Step *s = me->step;
    const StackModel *mdl = s->model;
    const int64_t tid = me->tid, n = s->num_threads, M = s->rows, H = mdl->hidden, D = mdl->head_dim;
    const int64_t hq = mdl->num_heads, hkv = mdl->num_kv_heads, I = mdl->intermediate;
    const int64_t qd = hq * D, nqkv = qd + 2 * hkv * D;
    const float eps = mdl->eps;
    float *h = s->private + tid * s->private_stride, *res = h + M * H;
    for (int64_t l = 0; l < mdl->num_layers; l++) {
        const StackLayer *L = mdl->layers + l;
        const LoraLayer *ad = lora_layer(s, l); /* the rows' adapters (stack_lora.h), or 0 */
        for (int64_t m = 0; m < M; m++) { /* residual add + input norm (layer 0: the residual is x) */
            if (l == 0) {
                memcpy(res + m * H, s->x + m * H, H * sizeof(float));
                rms_norm_row(s->x + m * H, 0, L->input_norm, H, eps, h + m * H, 0);
            } else {
                rms_norm_row(s->down + m * H, res + m * H, L->input_norm, H, eps, h + m * H, res + m * H);
            }
        }
        project_slice(s, tid, L->qkv, L->qkv_packed, &L->qkv_q, ad ? &ad->qkv : 0, L->qkv_bias, h, H, s->qkv, nqkv);
        sync_team(s);
        const int64_t kv_row = hkv * D;
        for (int64_t m = tid; m < M; m += n) { /* this thread's rows: q/k norm, rotary, K/V store */
            float *q = s->qkv + m * nqkv, *k = q + qd;
            if (L->q_norm)
                for (int64_t i = 0; i < hq; i++) rms_norm_row(q + i * D, 0, L->q_norm, D, eps, q + i * D, 0);
            if (L->k_norm)
                for (int64_t i = 0; i < hkv; i++) rms_norm_row(k + i * D, 0, L->k_norm, D, eps, k + i * D, 0);
            const float *cs = mdl->cos_sin + s->positions[m] * D;
            rotate_heads(q, hq, D, cs);
            rotate_heads(k, hkv, D, cs);
            const int64_t slot = s->slots[m];
            if (slot >= 0) store_kv_row(k, k + kv_row, kv_row, L->k_cache + slot * kv_row, L->v_cache + slot * kv_row);
        }
        /* rows of one sequence (speculation's verify rows) read each other's K/V: all stored first */
        if (s->rows_share) sync_team(s);
        const DecodeJob job = {s->qkv, L->k_cache, L->v_cache, s->tables, s->lens, M, nqkv, hq, hkv, D,
                               mdl->block_size, s->bt_stride, 0, mdl->scale, s->attn, 0, tid, n, L->window, 0.0f};
        decode_job_run((void *)&job); /* rows tid, tid + n, ...: each row reads only its own sequence */
        sync_team(s);
        project_slice(s, tid, L->o_proj, L->o_proj_packed, &L->o_proj_q, ad ? &ad->o_proj : 0, 0, s->attn, qd, s->o, H);
        sync_team(s);
        for (int64_t m = 0; m < M; m++)
            rms_norm_row(s->o + m * H, res + m * H, L->post_norm, H, eps, h + m * H, res + m * H);
        /* gate rows [a, b) and the matching up rows I + [a, b): SiLU * up of this thread's columns */
        const int64_t a = slice_at(I, &L->gate_up_q, s, tid), b = slice_at(I, &L->gate_up_q, s, tid + 1), w = b - a;
        float *gu = s->act + M * I; /* scratch after act: [rows, 2 * (b - a)] for this thread's slice */
        gu += M * 2 * a;
        const QMatrix *gq = &L->gate_up_q;
        const QRows gx = quantize_input(s, tid, gq, h, H, H); /* once for both halves */
        linear(s, L->gate_up, L->gate_up_packed, gq, &gx, a * H, 0, H, h, H, gu, 2 * w, 0, w);
        linear(s, L->gate_up, L->gate_up_packed, gq, &gx, (I + a) * H, 0, H, h, H, gu + w, 2 * w, 0, w);
        if (ad && w > 0) { /* gate columns [a, b) and up columns I + [a, b), shrunk once for both */
            const float *lh = lora_shrink(s, tid, &ad->gate_up, h, H, H);
            lora_expand(s, &ad->gate_up, lh, a, b, gu, 2 * w);
            lora_expand(s, &ad->gate_up, lh, I + a, I + b, gu + w, 2 * w);
        }
        for (int64_t m = 0; m < M; m++) silu_mul_row(gu + m * 2 * w, gu + m * 2 * w + w, w, s->act + m * I + a);
        sync_team(s);
        project_slice(s, tid, L->down, L->down_packed, &L->down_q, ad ? &ad->down : 0, 0, s->act, I, s->down, H);
        sync_team(s);
    }
    if (tid != 0 && !s->logits) return 0;
    /* the final norm; with the head every thread norms its own copy (its residual is the same floats),
     * so the head's slices start without a barrier */
    float *normed = tid == 0 ? s->out : h;
    for (int64_t m = 0; m < M; m++)
        rms_norm_row(s->down + m * H, res + m * H, mdl->final_norm, H, eps, normed + m * H, res + m * H);
    if (s->logits) {
        const QMatrix *hq = &mdl->head;
        const int64_t V = mdl->vocab, lo = slice_at(V, hq, s, tid), hi = slice_at(V, hq, s, tid + 1);
        if (hq->w) {
            const QRows nx = quantize_input(s, tid, hq, normed, H, H);
            linear(s, 0, 0, hq, &nx, 0, mdl->head_bias, H, normed, H, s->logits, V, lo, hi);
        } else if (hi > lo && mdl->head_half) { /* its own dtype, whatever the layers' half_weights */
            gemm_packed_h((const uint16_t *)mdl->head_packed, mdl->head_bias, H, normed, H, M, s->logits, V, lo, hi, 0);
        } else if (hi > lo) {
            gemm_packed((const float *)mdl->head_packed, mdl->head_bias, H, normed, H, M, s->logits, V, lo, hi, 0);
        }
    }
    return 0;
}

/* Threads 1..n-1 wait here until the team's size is known (all of them started, or fewer if a
 * pthread_create failed), so the barrier counts exactly the members that run. */
static void *start_member(void *arg) {
    Member *me = (Member *)arg;
    Step *s = me->step;
    pthread_mutex_lock(&s->start_lock);
    while (!s->started) pthread_cond_wait(&s->start_cond, &s->start_lock);
    const int joins = me->tid < s->num_threads;
    pthread_mutex_unlock(&s->start_lock);
    return joins ? run_member(arg) : 0;
}

static void run_team(Step *s, Member *members, int64_t n) {
    pthread_t ids[MAX_THREADS];
    int64_t started = 1;
    if (n > 1) {
        pthread_mutex_init(&s->start_lock, 0);
        pthread_cond_init(&s->start_cond, 0);
        for (; started < n; started++)
            if (pthread_create(&ids[started], 0, start_member, &members[started]) != 0) break;
    }
    s->num_threads = started;
    const int barrier = started > 1 && pthread_barrier_init(&s->barrier, 0, (unsigned)started) == 0;
    if (started > 1 && !barrier) s->num_threads = 1; /* no barrier: the caller's thread does it all */
    if (n > 1) {
        pthread_mutex_lock(&s->start_lock);
        s->started = 1;
        pthread_cond_broadcast(&s->start_cond);
        pthread_mutex_unlock(&s->start_lock);
    }
    run_member(&members[0]);
    for (int64_t i = 1; i < started; i++) pthread_join(ids[i], 0);
    if (barrier) pthread_barrier_destroy(&s->barrier);
    if (n > 1) {
        pthread_cond_destroy(&s->start_cond);
        pthread_mutex_destroy(&s->start_lock);
    }
}

/* 1 when a model of these sizes fits the stack (the attention kernel's head sizes, even head_dim),
 * else 0 (the caller then runs the layers op by op). */
int decode_stack_supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size) {
    return decode_attention_fits(num_heads, num_kv_heads, head_dim, block_size) && head_dim % 2 == 0;
}

/* Rows a call takes: STACK_GEMV_ROWS on GEMVs alone, more with an sgemm or packed matrices (on one
 * thread). */
int decode_stack_max_rows(int with_sgemm) { return with_sgemm ? STACK_MAX_ROWS : STACK_GEMV_ROWS; }

/* Weight rows per packed tile: a matrix [N, K] is packed as [ceil(N / this)][K][this] (gemm.h). */
int decode_stack_pack_width(void) { return GEMM_NB; }

/* Rows from which a step multiplies with the packed matrices, where bound. */
int decode_stack_packed_rows(void) { return STACK_PACKED_ROWS; }

/* out [rows, hidden] <- the final-normed hidden states of the decoder stack over x [rows, hidden];
 * each layer's K/V of the rows stored at slots (-1: not stored). With more than STACK_GEMV_ROWS rows
 * the matmuls are the packed matrices' or else sgemm's (one of them required then) and the call runs
 * on one thread (sgemm may thread itself).
 * Returns 0; -1 (nothing done) when rows is outside 1..decode_stack_max_rows, the sizes do not fit
 * or a position or slot is out of range; -2 when out of memory. */
static int run_stack(const StackModel *model, const StackLora *lora, const int32_t *lora_slots, Sgemm sgemm,
                     const float *x, int64_t rows, const int64_t *positions, const int64_t *slots,
                     const int32_t *block_tables, int64_t bt_stride, const int32_t *context_lens, float *out,
                     float *logits, int64_t num_threads) {
    const StackModel *m = model;
    if (model->half_weights) sgemm = 0; /* fp16 weights: GEMVs or packed tiles only */
    if (rows < 1 || rows > decode_stack_max_rows(sgemm != 0 || m->packed) ||
        !decode_stack_supports(m->num_heads, m->num_kv_heads, m->head_dim, m->block_size))
        return -1;
    for (int64_t r = 0; r < rows; r++)
        if (positions[r] < 0 || positions[r] >= m->max_positions || slots[r] < -1 || slots[r] >= m->num_slots ||
            context_lens[r] < 1 || (lora && (lora_slots[r] < -1 || lora_slots[r] >= lora->num_slots)))
            return -1;
    /* a thread per ~1 MB of the largest weight, at most */
    const int64_t mlp = 2 * m->intermediate * m->hidden, head = logits ? m->vocab * m->hidden : 0;
    const int64_t biggest = mlp > head ? mlp : head;
    num_threads = rows > STACK_GEMV_ROWS ? 1 : threads_for(biggest, 1 << 18, num_threads);
    const int64_t H = m->hidden, I = m->intermediate, qd = m->num_heads * m->head_dim;
    const int64_t nqkv = qd + 2 * m->num_kv_heads * m->head_dim;
    /* Every part of the scratch starts on a 64-byte line (and so does each of its rows where the row
     * length is a multiple of 16 floats, as in every model we know): a GEMV reads each x row once
     * per weight vector, and an x vector that straddles two lines costs two loads every time (malloc
     * aligns to 16 bytes only). */
    const int64_t q_part = ALIGN16(rows * nqkv), attn_part = ALIGN16(rows * qd), o_part = ALIGN16(rows * H);
    const int64_t act_part = ALIGN16(rows * 3 * I), down_part = ALIGN16(rows * H);
    /* the rows with an adapter as runs of one slot, and each thread's shrunk rows (stack_lora.h) */
    LoraRun *runs = lora ? (LoraRun *)malloc((size_t)rows * sizeof(LoraRun)) : 0;
    int64_t num_runs = 0;
    for (int64_t r = 0; runs && r < rows;) {
        int64_t n = 1;
        while (r + n < rows && lora_slots[r + n] == lora_slots[r] && n < GEMV_MAX_ROWS) n++;
        if (lora_slots[r] >= 0) runs[num_runs++] = (LoraRun){r, n, lora_slots[r]};
        r += n;
    }
    const int64_t lora_part = num_runs ? ALIGN16(rows * LORA_MAX_SLICES * lora->rank) : 0;
    const int64_t floats = q_part + attn_part + o_part + act_part + down_part +
                           num_threads * (ALIGN16(2 * rows * H) + lora_part);
    float *buf = (float *)aligned_alloc(64, (size_t)floats * sizeof(float)); /* floats: a multiple of 16 */
    /* each thread's QRows: the widest input (hidden, the attention output or the intermediate) at the
     * smallest block of the quantized matrices */
    const int64_t widest = H > qd ? (H > I ? H : I) : (qd > I ? qd : I);
    const int64_t q_stride = m->q_block ? (qrows_bytes(rows, widest, m->q_block) + 63) / 64 * 64 : 0;
    char *qbuf = q_stride ? (char *)aligned_alloc(64, (size_t)(num_threads * q_stride)) : 0;
    if (!buf || (q_stride && !qbuf) || (lora && !runs)) {
        free(buf);
        free(qbuf);
        free(runs);
        return -2;
    }
    int rows_share = 0;
    for (int64_t r = 1; num_threads > 1 && r < rows && !rows_share; r++) /* only a team needs to know */
        for (int64_t p = 0; p < r && !rows_share; p++) rows_share = block_tables[r * bt_stride] == block_tables[p * bt_stride];
    Step s = {sgemm, m, x, positions, slots, block_tables, context_lens, rows, bt_stride, num_threads, rows_share, out, logits};
    s.qkv = buf;
    s.attn = s.qkv + q_part;
    s.o = s.attn + attn_part;
    s.act = s.o + o_part; /* then the gate_up scratch [rows, 2 * I] */
    s.down = s.act + act_part;
    s.private = s.down + down_part;
    s.private_stride = ALIGN16(2 * rows * H);
    s.qrows = qbuf;
    s.qrows_stride = q_stride;
    s.lora = lora;
    s.lora_runs = runs;
    s.lora_num_runs = num_runs;
    s.lora_h = s.private + num_threads * s.private_stride;
    s.lora_h_stride = lora_part;
    Member members[MAX_THREADS];
    for (int64_t i = 0; i < num_threads; i++) members[i] = (Member){&s, i};
    run_team(&s, members, num_threads);
    free(buf);
    free(qbuf);
    free(runs);
    return 0;
}

int decode_stack_f32(const StackModel *model, Sgemm sgemm, const float *x, int64_t rows, const int64_t *positions,
                     const int64_t *slots, const int32_t *block_tables, int64_t bt_stride, const int32_t *context_lens,
                     float *out, int64_t num_threads) {
    return run_stack(model, 0, 0, sgemm, x, rows, positions, slots, block_tables, bt_stride, context_lens, out, 0,
                     num_threads);
}

/* decode_stack_f32, then logits [rows, vocab] <- out . head^T (+ head_bias) through the model's head
 * in the same call: a quantized one's rows quantized per block like every quantized matrix's input
 * (quant_matmul.c's products of the head as one Linear, the same floats); a packed one's gemm.h tiles
 * (gemv.c's gemm_packed_f32 on the same copy, the same floats). -1 also when no head is bound. */
int decode_stack_logits_f32(const StackModel *model, Sgemm sgemm, const float *x, int64_t rows,
                            const int64_t *positions, const int64_t *slots, const int32_t *block_tables,
                            int64_t bt_stride, const int32_t *context_lens, float *out, float *logits,
                            int64_t num_threads) {
    if (!(model->head.w || model->head_packed) || !logits) return -1;
    return run_stack(model, 0, 0, sgemm, x, rows, positions, slots, block_tables, bt_stride, context_lens, out, logits,
                     num_threads);
}

/* decode_stack_f32 (logits 0) or decode_stack_logits_f32 with LoRA adapters: lora_slots int32 [rows],
 * each row's slot of `lora` (-1: no adapter), whose products each wrapped projection adds
 * (stack_lora.h). -1 also when a slot is out of range. */
int decode_stack_lora_f32(const StackModel *model, const StackLora *lora, const int32_t *lora_slots, Sgemm sgemm,
                          const float *x, int64_t rows, const int64_t *positions, const int64_t *slots,
                          const int32_t *block_tables, int64_t bt_stride, const int32_t *context_lens, float *out,
                          float *logits, int64_t num_threads) {
    if (logits && !(model->head.w || model->head_packed)) return -1;
    return run_stack(model, lora, lora_slots, sgemm, x, rows, positions, slots, block_tables, bt_stride, context_lens,
                     out, logits, num_threads);
}

/* A draft model's whole proposal on this stack (speculation's DraftStack.propose). */
#include "draft_chain.h"
