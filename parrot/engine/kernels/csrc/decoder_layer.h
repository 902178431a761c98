/* One decoder layer of a step in one call, written once for both libraries (parrot_decoder_layer,
 * bf16; parrot_decoder_layer_f32, float32): the layer of parrot.engine.model.llama.DecoderLayer
 * composed from the library's kernels in the order of the per-op native path, with its rounding
 * points, so its outputs are that path's bits: QKV linear, RoPE on the q and k heads in place, the
 * rows' new K and V written to their cache slots, attention, O linear, residual add + the
 * post-attention RMSNorm, gate/up linear, SiLU*up, down linear, residual add + the next norm. One
 * ctypes call per layer: Python marshals once, and the GIL is released throughout.
 *
 * The including library defines act_t and the elementwise steps (elementwise.h) before it, and two
 * hooks after it:
 *   layer_linear(layer, which, x, ldx, y, M, N, K, threads)  y[M, N] = x[M, K] @ W^T (+ bias) for
 *       linear `which` (LINEAR_*) of its layer descriptor `layer`;
 *   layer_attention(step, qkv, ldq, kc, vc, attn, scale, threads)  the rows' attention over this
 *       layer's cache (their K and V written), from the step descriptor's slots ST_ATTENTION ..;
 *       returns the work items that could not allocate (0 on success).
 * The libraries' layer descriptors differ (their weights' formats); the step descriptor starts
 * with the slots below (kernels/fused_step.py fills them). */
#ifndef PARROT_DECODER_LAYER_H
#define PARROT_DECODER_LAYER_H
#include <stdint.h>
#include <string.h>

#define PTR(type, v) ((type)(intptr_t)(v))

/* The step descriptor (int64): the rows' shapes, cache slots and rotary tables, then (from
 * ST_ATTENTION) the library's attention slots. */
enum {
    ST_ROWS, ST_HIDDEN, ST_HQ, ST_HKV, ST_HEAD_DIM, ST_INTER, ST_SLOTS, ST_POSITIONS, ST_COS, ST_SIN, ST_K_CACHE,
    ST_V_CACHE, ST_LAYER_STRIDE, ST_BLOCK_SIZE, ST_SCRATCH, ST_THREADS, ST_ATTENTION
};
enum { LINEAR_QKV, LINEAR_O, LINEAR_GATE_UP, LINEAR_DOWN };

/* The library's hooks (defined after this file). */
static void layer_linear(const int64_t* layer, int which, const act_t* x, int64_t ldx, act_t* y, int64_t M,
                         int64_t N, int64_t K, int threads);
static int64_t layer_attention(const int64_t* step, const act_t* qkv, int64_t ldq, act_t* kc, act_t* vc,
                               act_t* attn, float scale, int threads);

/* x, h: the residual stream and input_norm(x), [N, hidden]; post_norm: this layer's
 * post-attention norm weight; next_norm: the next layer's input norm (or the final norm) weight.
 * Writes the new residual to x_out and next_norm of it to h_out. The step's scratch holds N rows
 * of qkv, attention, residual, normed, gate/up, act and delta, in that order. Returns the
 * attention work items that could not allocate (0 on success; the caller raises). */
static inline int64_t decoder_layer(const int64_t* layer, const int64_t* step, int64_t layer_idx, const act_t* x,
                                    const act_t* h, const act_t* post_norm, const act_t* next_norm, act_t* x_out,
                                    act_t* h_out, float post_eps, float next_eps, float scale) {
    const int64_t N = step[ST_ROWS], Dm = step[ST_HIDDEN], Hq = step[ST_HQ], Hkv = step[ST_HKV];
    const int64_t D = step[ST_HEAD_DIM], I = step[ST_INTER];
    const int threads = (int)step[ST_THREADS];
    const int64_t q_dim = Hq * D, kv_dim = Hkv * D, W = q_dim + 2 * kv_dim;
    act_t* qkv = PTR(act_t*, step[ST_SCRATCH]);
    act_t* attn = qkv + N * W;
    act_t* resid = attn + N * q_dim;
    act_t* normed = resid + N * Dm;
    act_t* gate_up = normed + N * Dm;
    act_t* act = gate_up + N * 2 * I;
    act_t* delta = act + N * I;
    layer_linear(layer, LINEAR_QKV, h, Dm, qkv, N, W, Dm, threads);
    rope_rows(qkv, W, N, Hq + Hkv, D, PTR(const float*, step[ST_COS]), PTR(const float*, step[ST_SIN]),
              PTR(const int64_t*, step[ST_POSITIONS]), threads);
    act_t* kc = PTR(act_t*, step[ST_K_CACHE]) + layer_idx * step[ST_LAYER_STRIDE];
    act_t* vc = PTR(act_t*, step[ST_V_CACHE]) + layer_idx * step[ST_LAYER_STRIDE];
    const int64_t* slots = PTR(const int64_t*, step[ST_SLOTS]);
    for (int64_t n = 0; n < N; n++) { /* the cache write: the rows' K and V to their flat slots */
        memcpy(kc + slots[n] * kv_dim, qkv + n * W + q_dim, (size_t)kv_dim * sizeof(act_t));
        memcpy(vc + slots[n] * kv_dim, qkv + n * W + q_dim + kv_dim, (size_t)kv_dim * sizeof(act_t));
    }
    const int64_t failed = layer_attention(step, qkv, W, kc, vc, attn, scale, threads);
    if (failed) return failed;
    layer_linear(layer, LINEAR_O, attn, q_dim, delta, N, Dm, q_dim, threads);
    rmsnorm_rows(x, delta, resid, post_norm, normed, N, Dm, post_eps, threads);
    layer_linear(layer, LINEAR_GATE_UP, normed, Dm, gate_up, N, 2 * I, Dm, threads);
    silu_mul_rows(gate_up, act, N, I, threads);
    layer_linear(layer, LINEAR_DOWN, act, I, delta, N, Dm, I, threads);
    rmsnorm_rows(resid, delta, x_out, next_norm, h_out, N, Dm, next_eps, threads);
    return 0;
}

#endif
