/* e^x in fp32, ~1 ulp (the Cephes polynomial), for the including library's vector width (vf_* of
 * vec_avx512.h or vec_avx2.h): x clamped to [VF_EXP_LO, 88.38] (this operand order keeps NaN: min
 * and max return their second operand when one is NaN), n = round(x / ln 2), r = x - n ln 2 in two
 * steps, e^r by a degree-7 polynomial, then p * 2^n (vf_exp_scale). */
#ifndef PARROT_EXP_H
#define PARROT_EXP_H

static inline vf vf_exp(vf x) {
    const vf in = x;
    x = vf_max(vf_set1(VF_EXP_LO), vf_min(vf_set1(88.3762626647949f), x));
    const vf n = vf_round_int(vf_mul(x, vf_set1(1.44269504088896341f)));
    vf r = vf_fnmadd(n, vf_set1(0.693359375f), x);
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500E-4f);
    p = vf_fmadd(p, r, vf_set1(1.3981999507E-3f));
    p = vf_fmadd(p, r, vf_set1(8.3334519073E-3f));
    p = vf_fmadd(p, r, vf_set1(4.1665795894E-2f));
    p = vf_fmadd(p, r, vf_set1(1.6666665459E-1f));
    p = vf_fmadd(p, r, vf_set1(5.0000001201E-1f));
    p = vf_fmadd(vf_mul(p, r), r, vf_add(r, vf_set1(1.0f)));
    return vf_exp_scale(p, n, in);
}

#endif
