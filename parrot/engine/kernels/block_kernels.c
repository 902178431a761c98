/* Parrot's float32 linear kernels over block-encoded weights (x86: AVX2 + FMA).
 *
 * A GGUF model's projections are 4-bit blocks (Q4_1: w = d * q + m per block of 32 weights, d and m
 * half floats, q in 0..15) and its embedding 8-bit blocks (Q8_0: w = d * q, q in -127..127). The
 * engine dequantizes them once to float32 and torch multiplies by the float32 weights: a decode step
 * then streams 4 bytes a weight, where the file holds 0.6 (Q4_1) or 1.06 (Q8_0). These kernels read
 * the blocks instead and rebuild each float32 weight in registers exactly as the dequantizer does
 * (d * q is exact in float32; + m rounds once, as numpy does), so they multiply by the very same
 * float32 weights with a sixth of the memory traffic.
 *
 * y[M, N] = x[M, K] @ w[N, K]^T (+ bias). Each output is summed over K in one fixed order whatever M
 * is and wherever its row sits in the batch (two 8-lane accumulators, blocks in order, the same
 * final reduction): the kernels are row-invariant by construction. Rows are taken 4 at a time, so a
 * block is rebuilt once for up to 4 rows; threads split the output columns.
 *
 * Built at first use by parrot/engine/kernels/library.py (gcc -O3 -fopenmp -mavx2 -mfma).
 */
#include <immintrin.h>
#include <stdint.h>

#define QK 32      /* weights per block */
#define MAXR 4     /* input rows per pass over a weight row */

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One Q4_1 block (16 bytes: byte j holds q[j] in its low nibble and q[j + 16] in its high one,
 * then d and m as float32) as four vectors of float32 weights. */
static inline void q4_1_block(const uint8_t* qs, const float* dm, __m256* w) {
    const __m128i raw = _mm_loadu_si128((const __m128i*)qs);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m256 d = _mm256_set1_ps(dm[0]), m = _mm256_set1_ps(dm[1]);
    w[0] = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo))), m);
    w[1] = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)))), m);
    w[2] = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi))), m);
    w[3] = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))), m);
}

/* One Q8_0 block (32 signed bytes, then d as float32). */
static inline void q8_0_block(const int8_t* qs, const float* d_, __m256* w) {
    const __m256 d = _mm256_set1_ps(d_[0]);
    for (int i = 0; i < 4; i++) {
        const __m128i raw = _mm_loadl_epi64((const __m128i*)(qs + 8 * i));
        w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)));
    }
}

/* out[r] = sum_k x[r][k] * w[n][k] for R (1..4) rows: the same operations per row for any R
 * (R is a constant in each copy, so the accumulators stay in registers). QBYTES/SCALES: bytes of
 * q and floats of scale per block; BLOCK: the decoder above. */
#define DEFINE_DOT(NAME, R, QTYPE, QBYTES, SCALES, BLOCK)                                           \
    static inline void NAME##_##R(const float* x, int64_t ldx, const QTYPE* qs, const float* sc,    \
                                  int64_t nb, float* out) {                                         \
        __m256 a0[R], a1[R];                                                                        \
        for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();                            \
        for (int64_t b = 0; b < nb; b++) {                                                          \
            __m256 w[4];                                                                            \
            _mm_prefetch((const char*)(qs + (b + 8) * (QBYTES)), _MM_HINT_T0);                      \
            BLOCK(qs + b * (QBYTES), sc + b * (SCALES), w);                                         \
            const float* xb = x + b * QK;                                                           \
            for (int r = 0; r < R; r++) {                                                           \
                const float* xr = xb + r * ldx;                                                     \
                a0[r] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), a0[r]);                          \
                a1[r] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), a1[r]);                      \
                a0[r] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), a0[r]);                     \
                a1[r] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), a1[r]);                     \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < R; r++) out[r] = hsum8(_mm256_add_ps(a0[r], a1[r]));                    \
    }

#define DEFINE_DOTS(NAME, QTYPE, QBYTES, SCALES, BLOCK)                                             \
    DEFINE_DOT(NAME, 1, QTYPE, QBYTES, SCALES, BLOCK)                                               \
    DEFINE_DOT(NAME, 2, QTYPE, QBYTES, SCALES, BLOCK)                                               \
    DEFINE_DOT(NAME, 3, QTYPE, QBYTES, SCALES, BLOCK)                                               \
    DEFINE_DOT(NAME, 4, QTYPE, QBYTES, SCALES, BLOCK)                                               \
    static inline void NAME(const float* x, int64_t ldx, int rows, const QTYPE* qs, const float* sc, \
                            int64_t nb, float* out) {                                               \
        switch (rows) {                                                                             \
            case 1: NAME##_1(x, ldx, qs, sc, nb, out); break;                                       \
            case 2: NAME##_2(x, ldx, qs, sc, nb, out); break;                                       \
            case 3: NAME##_3(x, ldx, qs, sc, nb, out); break;                                       \
            default: NAME##_4(x, ldx, qs, sc, nb, out); break;                                      \
        }                                                                                           \
    }

DEFINE_DOTS(dot_q4_1, uint8_t, 16, 2, q4_1_block)
DEFINE_DOTS(dot_q8_0, int8_t, 32, 1, q8_0_block)

/* The body of a linear over blocks: threads split the output columns, rows go 4 at a time. */
#define LINEAR_BODY(DOT, QTYPE, QBYTES, SCALES)                                                     \
    const int64_t nb = K / QK;                                                                      \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                               \
    for (int64_t n = 0; n < N; n++) {                                                               \
        const QTYPE* qn = (const QTYPE*)qs + n * nb * (QBYTES);                                     \
        const float* sn = scales + n * nb * (SCALES);                                               \
        for (int64_t r0 = 0; r0 < M; r0 += MAXR) {                                                  \
            const int rows = (int)(M - r0 < MAXR ? M - r0 : MAXR);                                  \
            float out[MAXR];                                                                        \
            DOT(x + r0 * ldx, ldx, rows, qn, sn, nb, out);                                          \
            for (int r = 0; r < rows; r++) y[(r0 + r) * N + n] = bias ? out[r] + bias[n] : out[r];  \
        }                                                                                           \
    }

/* Q4_1 weights: qs [N, K/32, 16] bytes, scales [N, K/32, 2] (d, m) float32. K % 32 == 0. */
void parrot_linear_q4_1(const float* x, int64_t ldx, const uint8_t* qs, const float* scales, const float* bias,
                        float* y, int64_t M, int64_t N, int64_t K, int threads) {
    LINEAR_BODY(dot_q4_1, uint8_t, 16, 2)
}

/* Q8_0 weights: qs [N, K/32, 32] signed bytes, scales [N, K/32] (d) float32. K % 32 == 0. */
void parrot_linear_q8_0(const float* x, int64_t ldx, const int8_t* qs, const float* scales, const float* bias,
                        float* y, int64_t M, int64_t N, int64_t K, int threads) {
    LINEAR_BODY(dot_q8_0, int8_t, 32, 1)
}
