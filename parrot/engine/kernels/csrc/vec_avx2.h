/* The vector operations of vec_avx512.h for AVX2 + FMA: vf is 8 fp32 lanes. */
#ifndef PARROT_VEC_AVX2_H
#define PARROT_VEC_AVX2_H
#include <immintrin.h>

typedef __m256 vf;
#define VF_LANES 8
#define vf_set1 _mm256_set1_ps
#define vf_zero _mm256_setzero_ps
#define vf_loadu _mm256_loadu_ps
#define vf_storeu _mm256_storeu_ps
#define vf_add _mm256_add_ps
#define vf_sub _mm256_sub_ps
#define vf_mul _mm256_mul_ps
#define vf_div _mm256_div_ps
#define vf_min _mm256_min_ps
#define vf_max _mm256_max_ps
#define vf_fmadd _mm256_fmadd_ps
#define vf_fnmadd _mm256_fnmadd_ps
#define vf_round_int(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* The sum of the 8 lanes: halves folded, 8 -> 4 lanes, then (0 + 2) + (1 + 3) (the tree of
 * _mm512_reduce_add_ps below its first fold). */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define vf_hsum hsum8

/* The max of the 8 lanes, folded as hsum8 (callers keep NaN out of v). */
static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* e^x (exp.h): x clamped from below at VF_EXP_LO, then p * 2^n built in the exponent bits, which
 * reach only the normal range: exactly 0 where x < VF_EXP_LO (a NaN compares false: it stays NaN). */
#define VF_EXP_LO -87.3f
static inline __m256 vf_exp_scale(__m256 p, __m256 n, __m256 x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(VF_EXP_LO), _CMP_LT_OQ);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

#endif
