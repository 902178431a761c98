/* The vector operations the shared kernels are written in (exp.h, elementwise.h, cascade.h), for
 * AVX512F: vf is 16 fp32 lanes. vec_avx2.h defines the same names for AVX2 + FMA (8 lanes). A
 * library includes one of the two, then the shared code, which so compiles to that instruction set
 * with the operations, and their order, that it spells out. */
#ifndef PARROT_VEC_AVX512_H
#define PARROT_VEC_AVX512_H
#include <immintrin.h>

typedef __m512 vf;
#define VF_LANES 16
#define vf_set1 _mm512_set1_ps
#define vf_zero _mm512_setzero_ps
#define vf_loadu _mm512_loadu_ps
#define vf_storeu _mm512_storeu_ps
#define vf_add _mm512_add_ps
#define vf_sub _mm512_sub_ps
#define vf_mul _mm512_mul_ps
#define vf_div _mm512_div_ps
#define vf_min _mm512_min_ps
#define vf_max _mm512_max_ps
#define vf_fmadd _mm512_fmadd_ps
#define vf_fnmadd _mm512_fnmadd_ps
#define vf_round_int(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vf_hsum _mm512_reduce_add_ps /* halves folded: 16 -> 8 -> 4 lanes, then (0 + 2) + (1 + 3) */

/* e^x (exp.h): x clamped from below at VF_EXP_LO, then p * 2^n by scalef, which reaches into the
 * subnormals. */
#define VF_EXP_LO -103.0f
#define vf_exp_scale(p, n, x) ((void)(x), _mm512_scalef_ps((p), (n)))

#endif
