/* A draft model's whole greedy proposal in one call: the catch-up forward and every drafting step
 * (worker/engine/speculation/draft_stack.py, DraftStack.propose). Included by decode_stack.c, whose
 * decode_stack_f32 runs each forward.
 *
 * From Python each of a proposal's K forwards pays glue on top of its C work (slots and context
 * lengths in numpy, tensor wrapping, the embedding lookup, the lm_head call, the argmax), which on a
 * small draft is a large share of proposing. Here the glue is a few loops:
 * 1. the catch-up: `rows` decode-shaped rows (each sequence's tokens the draft has not computed, its
 *    newest last; rows of one sequence read each other's K/V as the target's verify rows do);
 * 2. each sequence's first token: the lm_head over its last catch-up row, the argmax and its softmax
 *    probability (top1_row);
 * 3. while a sequence wants more (ks) and its early stop says go on, one decode row per sequence:
 *    the embedding of its latest token at the next position, the same lm_head and argmax.
 * The early stop is the speculator's (Speculator._go_on): sequence s drafts token j + 1 while
 * prod(chance[bucket(p_i)], i <= j) * overall * value[s] > per_token, in doubles, in that order, so
 * it decides as the Python rule does. Same floats as DraftStack's step-by-step path (the same
 * kernels; the lm_head by gemm.h over its packed copy where it has one, else by gemv.h in passes of
 * GEMV_MAX_ROWS rows). A frequent-token head (head_ids: FR-Spec) holds only some tokens' rows: the
 * draft proposes among them, each forward reading a fraction of the head's bytes.
 */
#ifndef FREIGHT_DRAFT_CHAIN_H
#define FREIGHT_DRAFT_CHAIN_H

typedef struct {
    const float *embed;       /* [vocab, hidden] fp32 */
    const void *head;         /* the lm_head's rows [rows, hidden]: fp32, or raw fp16 bits with head_half; 0 with packed */
    const void *packed;       /* the rows packed for gemm.h (fp16 with head_half), or 0: GEMVs over head */
    const int64_t *head_ids;  /* the token of each head row (a frequent-token head), or 0: rows = vocab */
    int64_t vocab, rows, head_half;
    int64_t early_stop;           /* 0: every sequence drafts its ks tokens */
    const double *edges, *chance; /* the early stop's buckets: num_edges edges, num_edges + 1 chances */
    int64_t num_edges;
    double overall, per_token;
} DraftHead;

static double draft_chance(const DraftHead *hd, float p) {
    int64_t b = 0;
    while (b < hd->num_edges && hd->edges[b] <= (double)p) b++; /* bisect_right */
    return hd->chance[b];
}

/* hs [n, hidden] -> logits [n, rows] -> each row's argmax token (head_ids mapped) and its probability
 * (a softmax over the head's rows). */
static void draft_top1(const DraftHead *hd, int64_t H, const float *hs, int64_t n, float *logits, int64_t *tok,
                       float *prob) {
    const int64_t R = hd->rows;
    if (hd->packed && hd->head_half)
        gemm_packed_h((const uint16_t *)hd->packed, 0, H, hs, H, n, logits, R, 0, R, 0);
    else if (hd->packed)
        gemm_packed((const float *)hd->packed, 0, H, hs, H, n, logits, R, 0, R, 0);
    for (int64_t r = 0; r < n && !hd->packed; r += GEMV_MAX_ROWS) {
        const int64_t m = n - r < GEMV_MAX_ROWS ? n - r : GEMV_MAX_ROWS;
        if (hd->head_half)
            gemv_rows_h((const uint16_t *)hd->head, 0, H, hs + r * H, H, m, logits + r * R, R, 0, R);
        else
            gemv_rows((const float *)hd->head, 0, H, hs + r * H, H, m, logits + r * R, R, 0, R);
    }
    for (int64_t r = 0; r < n; r++) {
        top1_row(logits + r * R, R, tok + r, prob + r);
        if (hd->head_ids) tok[r] = hd->head_ids[tok[r]];
    }
}

/* One forward of n decode-shaped rows (ids at positions, each row's block table at tables + r *
 * bt_stride) into hid [n, hidden]; x, slots, lens: scratch of n rows. */
static int draft_forward(const StackModel *m, const DraftHead *hd, int64_t n, const int64_t *ids,
                         const int64_t *positions, const int32_t *tables, int64_t bt_stride, float *x, int64_t *slots,
                         int32_t *lens, float *hid, int64_t num_threads) {
    const int64_t H = m->hidden, bs = m->block_size;
    for (int64_t r = 0; r < n; r++) {
        if (ids[r] < 0 || ids[r] >= hd->vocab || positions[r] < 0 || positions[r] / bs >= bt_stride) return -1;
        memcpy(x + r * H, hd->embed + ids[r] * H, H * sizeof(float));
        slots[r] = (int64_t)tables[r * bt_stride + positions[r] / bs] * bs + positions[r] % bs;
        lens[r] = (int32_t)(positions[r] + 1);
    }
    return decode_stack_f32(m, 0, x, n, positions, slots, tables, bt_stride, lens, hid, num_threads);
}

/* The proposal of `seqs` sequences: catch-up rows (ids, positions, tables [rows, bt_stride]), each
 * sequence's last catch-up row (last_rows, ascending), its most tokens (ks, >= 1) and its tokens'
 * value (values, for the early stop) -> tokens / probs [seqs, kmax] (kmax >= every ks), counts
 * [seqs]. Returns 0; -1 (nothing usable) for an id, position or table out of range or too many
 * rows for the stack; -2 when out of memory. */
int decode_stack_draft(const StackModel *model, const DraftHead *head, int64_t rows, const int64_t *ids,
                       const int64_t *positions, const int32_t *tables, int64_t bt_stride, int64_t seqs,
                       const int64_t *last_rows, const int64_t *ks, const double *values, int64_t kmax,
                       int64_t *tokens, float *probs, int64_t *counts, int64_t num_threads) {
    const int64_t H = model->hidden, V = head->vocab, most = rows > seqs ? rows : seqs;
    if (seqs < 1 || rows < seqs || kmax < 1) return -1;
    for (int64_t s = 0; s < seqs; s++) { /* every later forward's position and block known good now */
        if (last_rows[s] < 0 || last_rows[s] >= rows || (s && last_rows[s] <= last_rows[s - 1]) || ks[s] < 1 ||
            ks[s] > kmax)
            return -1;
        const int64_t last = positions[last_rows[s]] + ks[s] - 1; /* its last drafting forward's position */
        if (last >= model->max_positions || last / model->block_size >= bt_stride) return -1;
    }
    const int64_t part = ALIGN16(most * H); /* every part on a 64-byte line (see decode_stack_f32) */
    float *x = aligned_alloc(64, (size_t)(3 * part + ALIGN16(seqs * V)) * sizeof(float));
    int64_t *ints = malloc((size_t)(4 * seqs + most) * sizeof(int64_t));
    int32_t *i32 = malloc((size_t)(most + seqs * bt_stride) * sizeof(int32_t));
    float *prob = malloc((size_t)seqs * sizeof(float));
    double *run = malloc((size_t)seqs * sizeof(double)); /* each sequence's product of chances */
    int status = -2;
    if (!x || !ints || !i32 || !prob || !run) goto done;
    float *hid = x + part, *hs = hid + part, *logits = hs + part;
    int64_t *act = ints, *act_ids = act + seqs, *act_pos = act_ids + seqs, *tok = act_pos + seqs, *slots = tok + seqs;
    int32_t *lens = i32, *act_tables = i32 + most;
    status = draft_forward(model, head, rows, ids, positions, tables, bt_stride, x, slots, lens, hid, num_threads);
    if (status) goto done;
    for (int64_t s = 0; s < seqs; s++) memcpy(hs + s * H, hid + last_rows[s] * H, H * sizeof(float));
    int64_t n = seqs;
    for (int64_t s = 0; s < seqs; s++) act[s] = s;
    for (int64_t j = 0;; j++) { /* hs: the active sequences' hidden states -> their token j */
        draft_top1(head, H, hs, n, logits, tok, prob);
        int64_t kept = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t s = act[i];
            tokens[s * kmax + j] = tok[i];
            probs[s * kmax + j] = prob[i];
            counts[s] = j + 1;
            run[s] = (j ? run[s] : 1.0) * draft_chance(head, prob[i]);
            if (ks[s] > j + 1 && (!head->early_stop || run[s] * head->overall * values[s] > head->per_token)) {
                act[kept] = s;
                act_ids[kept] = tok[i];
                act_pos[kept] = positions[last_rows[s]] + j + 1;
                memcpy(act_tables + kept * bt_stride, tables + last_rows[s] * bt_stride, bt_stride * sizeof(int32_t));
                kept++;
            }
        }
        n = kept;
        if (!n) break;
        status = draft_forward(model, head, n, act_ids, act_pos, act_tables, bt_stride, x, slots, lens, hs, num_threads);
        if (status) break;
    }
done:
    free(x);
    free(ints);
    free(i32);
    free(prob);
    free(run);
    return status;
}

#endif
