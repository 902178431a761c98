/* Shared-prefix (cascade) decode attention, the part both libraries share: the step's decode rows
 * split their KV into pieces (a shared prefix attended once for all the rows that share it, each
 * row's private tail; per context, each row's whole KV is one piece). A work item is one piece and
 * one KV head; it leaves, per (row of the piece, query head), a partial softmax in a slot: max m,
 * sum l of e^(s - m) and the unnormalized sum of e^(s - m) v (fp32). A second pass merges each
 * row's partials by log-sum-exp, in the order of its slots, and writes out = o / l.
 *
 * The including library defines, besides act_t, act_store and its vector operations:
 *   cascade_piece(...)            one work item (below; how a piece attends is the library's own
 *                                 arithmetic), returning 1 where it could not allocate, else 0;
 *   merge_weight(ms, m, any_nan)  a partial's weight e^(ms - m) in the merge, where m is the row's
 *                                 max over its partials and any_nan whether one of them is NaN (the
 *                                 libraries mark a NaN row differently: see theirs). */
#ifndef PARROT_CASCADE_H
#define PARROT_CASCADE_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Pieces p = 0..P-1: tokens piece_len[p] through blocks piece_blocks[block_ptr[p] ..], read by rows
 * piece_rows[row_ptr[p] .. row_ptr[p + 1]); slot row_ptr[p] + i holds row i's partials. Row b's
 * slots: row_slots[slot_ptr[b] .. slot_ptr[b + 1]). q: [B, Hq, D] rows q_stride apart; kc/vc: one
 * layer's cache [blocks, bs, Hkv, D]; out: [B, Hq * D]. D <= MAX_HEAD_DIM. Returns the work items
 * that could not allocate (0 on success; the caller raises). */
static inline int64_t cascade_decode(const act_t* q, int64_t q_stride, const act_t* kc, const act_t* vc, int64_t P,
                                     const int64_t* block_ptr, const int64_t* piece_blocks, const int64_t* piece_len,
                                     const int64_t* row_ptr, const int64_t* piece_rows, const int64_t* slot_ptr,
                                     const int64_t* row_slots, act_t* out, int64_t B, int64_t Hq, int64_t Hkv,
                                     int64_t D, int64_t bs, float scale, int num_threads) {
    const int64_t G = Hq / Hkv, S = row_ptr[P];
    float* pm = malloc((size_t)(S * Hq * 4));
    float* pl = malloc((size_t)(S * Hq * 4));
    float* pacc = malloc((size_t)(S * Hq * D * 4));
    if (pm == NULL || pl == NULL || pacc == NULL) {
        free(pm), free(pl), free(pacc);
        return P * Hkv;
    }
    int64_t failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(dynamic, 1) reduction(+ : failed)
        for (int64_t task = 0; task < P * Hkv; task++) {
            const int64_t p = task / Hkv, h = task % Hkv, first = row_ptr[p];
            failed += cascade_piece(q, q_stride, kc, vc, piece_blocks + block_ptr[p], piece_len[p], piece_rows + first,
                                    row_ptr[p + 1] - first, pm + first * Hq, pl + first * Hq, pacc + first * Hq * D,
                                    h, Hkv, bs, scale, G, D);
        }
        if (failed == 0) {
#pragma omp for schedule(static)
            for (int64_t bh = 0; bh < B * Hq; bh++) { /* merge each row's partials, per query head */
                const int64_t b = bh / Hq, hq = bh % Hq;
                float m = -INFINITY;
                int any_nan = 0;
                for (int64_t k = slot_ptr[b]; k < slot_ptr[b + 1]; k++) {
                    const float ms = pm[row_slots[k] * Hq + hq];
                    any_nan |= isnan(ms);
                    if (ms > m) m = ms;
                }
                vf acc[MAX_HEAD_DIM / VF_LANES];
                for (int64_t c = 0; c < D / VF_LANES; c++) acc[c] = vf_zero();
                float l = 0.0f;
                for (int64_t k = slot_ptr[b]; k < slot_ptr[b + 1]; k++) {
                    const int64_t slot = row_slots[k] * Hq + hq;
                    const float w = merge_weight(pm[slot], m, any_nan);
                    l += w * pl[slot];
                    for (int64_t c = 0; c < D / VF_LANES; c++)
                        acc[c] = vf_fmadd(vf_set1(w), vf_loadu(pacc + slot * D + c * VF_LANES), acc[c]);
                }
                act_t* o = out + b * Hq * D + hq * D;
                const vf inv = vf_set1(1.0f / l);
                for (int64_t c = 0; c < D / VF_LANES; c++) act_store(o + c * VF_LANES, vf_mul(acc[c], inv));
            }
        }
    }
    free(pm), free(pl), free(pacc);
    return failed;
}

#endif
