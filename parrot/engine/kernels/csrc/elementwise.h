/* The decoder's elementwise steps, written once for both libraries: RMSNorm (with the residual
 * add), RoPE and SiLU*up over rows of activations. The including library defines, besides its
 * vector operations (vec_*.h, exp.h):
 *   act_t             the activations' element type (bf16 bits as uint16_t, or float);
 *   act_load(p)       VF_LANES activations as fp32 lanes;
 *   act_store(p, v)   fp32 lanes stored as activations (rounded to nearest even for bf16);
 *   act_round(v)      fp32 lanes rounded to the activations' precision and back (the identity for
 *                     float).
 * Each step rounds where the torch reference rounds (parrot.engine.model: for bf16, after every
 * op the reference runs in bf16; float32 has no rounding points between the ops, so each step is
 * one pass over its rows where torch makes several). Rows go to threads whole: a row's bits do not
 * depend on the other rows. */
#ifndef PARROT_ELEMENTWISE_H
#define PARROT_ELEMENTWISE_H
#include <math.h>
#include <stdint.h>

/* out = w * act(r * rsqrt(mean(r^2) + eps)), r = x (+ delta, rounded and written to resid).
 * D % VF_LANES == 0. For bf16, matches: h = r.float(); h * rsqrt(h.pow(2).mean(-1) + eps); w * h.to(bf16). */
static inline void rmsnorm_rows(const act_t* x, const act_t* delta, act_t* resid, const act_t* w, act_t* out,
                                int64_t N, int64_t D, float eps, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (N > 8)
    for (int64_t n = 0; n < N; n++) {
        const act_t* xr = x + n * D;
        vf ss = vf_zero();
        for (int64_t d = 0; d < D; d += VF_LANES) {
            vf v = act_load(xr + d);
            if (delta) {
                v = act_round(vf_add(v, act_load(delta + n * D + d)));
                act_store(resid + n * D + d, v);
            }
            ss = vf_fmadd(v, v, ss);
        }
        const act_t* r = delta ? resid + n * D : xr;
        const float inv_rms = 1.0f / sqrtf(vf_hsum(ss) / (float)D + eps);
        const vf inv = vf_set1(inv_rms);
        for (int64_t d = 0; d < D; d += VF_LANES) {
            const vf h = act_round(vf_mul(act_load(r + d), inv));
            act_store(out + n * D + d, vf_mul(act_load(w + d), h));
        }
    }
}

/* In place on x [N, H, D] (rows x_stride apart): x = act(x * c) + act(rotate_half(x) * s), rounded,
 * with c, s the fp32 tables' rows at each row's position, rounded to the activations' precision
 * (as torch does). D % (2 * VF_LANES) == 0. */
static inline void rope_rows(act_t* x, int64_t x_stride, int64_t N, int64_t H, int64_t D, const float* cos_table,
                             const float* sin_table, const int64_t* positions, int num_threads) {
    const int64_t half = D / 2;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (N > 8)
    for (int64_t n = 0; n < N; n++) {
        const float* ct = cos_table + positions[n] * D;
        const float* st = sin_table + positions[n] * D;
        for (int64_t h = 0; h < H; h++) {
            act_t* xh = x + n * x_stride + h * D;
            for (int64_t d = 0; d < half; d += VF_LANES) {
                const vf lo = act_load(xh + d), hi = act_load(xh + half + d);
                const vf c0 = act_round(vf_loadu(ct + d)), s0 = act_round(vf_loadu(st + d));
                const vf c1 = act_round(vf_loadu(ct + half + d)), s1 = act_round(vf_loadu(st + half + d));
                /* first half: lo * c0 + (-hi) * s0; second half: hi * c1 + lo * s1 */
                const vf a = vf_add(act_round(vf_mul(lo, c0)), act_round(vf_mul(vf_sub(vf_zero(), hi), s0)));
                const vf b = vf_add(act_round(vf_mul(hi, c1)), act_round(vf_mul(lo, s1)));
                act_store(xh + d, a);
                act_store(xh + half + d, b);
            }
        }
    }
}

/* out [N, I] = act(silu(g)) * u = act(g / (1 + e^-g)) * u, rounded, where gu [N, 2I] = [g | u].
 * I % VF_LANES == 0. */
static inline void silu_mul_rows(const act_t* gu, act_t* out, int64_t N, int64_t I, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (N > 8)
    for (int64_t n = 0; n < N; n++) {
        const act_t* g = gu + n * 2 * I;
        const act_t* u = g + I;
        for (int64_t i = 0; i < I; i += VF_LANES) {
            const vf gv = act_load(g + i);
            const vf e = vf_exp(vf_sub(vf_zero(), gv));
            const vf s = act_round(vf_div(gv, vf_add(vf_set1(1.0f), e)));
            act_store(out + n * I + i, vf_mul(s, act_load(u + i)));
        }
    }
}

#endif
