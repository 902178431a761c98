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
 * y[M, N] = x[M, K] @ w[N, K]^T (+ bias). Threads split the output columns in tiles of 4. Up to 4
 * rows, each block is rebuilt in registers and multiplied at once; beyond, a tile's weights are
 * rebuilt once into a buffer and rows run against it 3 rows x 2 columns at a time. Each output is
 * summed over K in one fixed order whatever M is and wherever its row sits in the batch (see
 * DEFINE_TILE): the kernels are row-invariant by construction.
 *
 * Built at first use by parrot/engine/kernels/library.py (gcc -O3 -fopenmp -mavx2 -mfma).
 */
#include <immintrin.h>
#include <stdint.h>

#define QK 32      /* weights per block */

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

#define TC 4       /* output columns per tile: their weights are rebuilt once into a buffer */
#define TR 3       /* input rows per pass over the buffer, 2 columns at a time: 12 accumulators */
#define DIRECT_ROWS 4  /* up to this many rows, no buffer: blocks are rebuilt in registers */
#define MAXK 8192  /* the buffer's columns (K beyond: the caller takes torch's path) */

/* The tile's weights, rebuilt into buf[c * K + k] (float32, exactly the dequantized values). */
#define DEFINE_REBUILD(NAME, QTYPE, QBYTES, SCALES, BLOCK)                                          \
    static inline void NAME(const QTYPE* qs, const float* sc, int64_t nb, int cols, float* buf) {   \
        for (int c = 0; c < cols; c++)                                                              \
            for (int64_t b = 0; b < nb; b++) {                                                      \
                __m256 w[4];                                                                        \
                BLOCK(qs + (c * nb + b) * (QBYTES), sc + (c * nb + b) * (SCALES), w);               \
                float* o = buf + c * nb * QK + b * QK;                                              \
                _mm256_storeu_ps(o, w[0]);                                                          \
                _mm256_storeu_ps(o + 8, w[1]);                                                      \
                _mm256_storeu_ps(o + 16, w[2]);                                                     \
                _mm256_storeu_ps(o + 24, w[3]);                                                     \
            }                                                                                       \
    }

DEFINE_REBUILD(rebuild_q4_1, uint8_t, 16, 2, q4_1_block)
DEFINE_REBUILD(rebuild_q8_0, int8_t, 32, 1, q8_0_block)

/* y[r][c] = sum_k x[r][k] * buf[c][k] for R rows and C columns (constants in each copy). The
 * order of every output's sum, here and in the direct kernels below: two 8-lane accumulators, the
 * first over K's even 8-wide chunks in order, the second over its odd ones, then one reduction of
 * their sum. It is the same for any R, C and tile position: rows do not see each other. */
#define DEFINE_TILE(R, C)                                                                           \
    static inline void tile_##R##_##C(const float* x, int64_t ldx, const float* buf, int64_t K,     \
                                      float* y, int64_t ldy) {                                      \
        __m256 a0[R][C], a1[R][C];                                                                  \
        for (int r = 0; r < R; r++)                                                                 \
            for (int c = 0; c < C; c++) a0[r][c] = a1[r][c] = _mm256_setzero_ps();                  \
        for (int64_t k = 0; k < K; k += 16) {                                                       \
            __m256 xv[R];                                                                           \
            for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + k);                   \
            for (int c = 0; c < C; c++) {                                                           \
                const __m256 wv = _mm256_loadu_ps(buf + c * K + k);                                 \
                for (int r = 0; r < R; r++) a0[r][c] = _mm256_fmadd_ps(wv, xv[r], a0[r][c]);        \
            }                                                                                       \
            for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + k + 8);               \
            for (int c = 0; c < C; c++) {                                                           \
                const __m256 wv = _mm256_loadu_ps(buf + c * K + k + 8);                             \
                for (int r = 0; r < R; r++) a1[r][c] = _mm256_fmadd_ps(wv, xv[r], a1[r][c]);        \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < R; r++)                                                                 \
            for (int c = 0; c < C; c++) y[r * ldy + c] = hsum8(_mm256_add_ps(a0[r][c], a1[r][c]));  \
    }

DEFINE_TILE(1, 1) DEFINE_TILE(2, 1) DEFINE_TILE(3, 1)
DEFINE_TILE(1, 2) DEFINE_TILE(2, 2) DEFINE_TILE(3, 2)

static inline void tiles(const float* x, int64_t ldx, int64_t M, const float* buf, int64_t K, int cols,
                         float* y, int64_t ldy) {
    for (int64_t r0 = 0; r0 < M; r0 += TR) {
        const int64_t rows = M - r0 < TR ? M - r0 : TR;
        const float* xr = x + r0 * ldx;
        float* yr = y + r0 * ldy;
        int c = 0;
        for (; c + 2 <= cols; c += 2) {
            if (rows == 3) tile_3_2(xr, ldx, buf + c * K, K, yr + c, ldy);
            else if (rows == 2) tile_2_2(xr, ldx, buf + c * K, K, yr + c, ldy);
            else tile_1_2(xr, ldx, buf + c * K, K, yr + c, ldy);
        }
        for (; c < cols; c++) {
            if (rows == 3) tile_3_1(xr, ldx, buf + c * K, K, yr + c, ldy);
            else if (rows == 2) tile_2_1(xr, ldx, buf + c * K, K, yr + c, ldy);
            else tile_1_1(xr, ldx, buf + c * K, K, yr + c, ldy);
        }
    }
}

/* The same sums for up to 4 rows without the buffer: each block of a column is rebuilt in registers
 * and multiplied at once (a decode step of a few sequences reads its weights straight from memory;
 * writing them to a buffer first would cost more than the multiply). */
#define DEFINE_DIRECT_R(NAME, R, QTYPE, QBYTES, SCALES, BLOCK)                                      \
    static inline void NAME##_##R(const float* x, int64_t ldx, const QTYPE* qs, const float* sc,    \
                                  int64_t nb, float* y, int64_t ldy) {                              \
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
        for (int r = 0; r < R; r++) y[r * ldy] = hsum8(_mm256_add_ps(a0[r], a1[r]));                \
    }

#define DEFINE_DIRECT(NAME, QTYPE, QBYTES, SCALES, BLOCK)                                           \
    DEFINE_DIRECT_R(NAME, 1, QTYPE, QBYTES, SCALES, BLOCK)                                          \
    DEFINE_DIRECT_R(NAME, 2, QTYPE, QBYTES, SCALES, BLOCK)                                          \
    DEFINE_DIRECT_R(NAME, 3, QTYPE, QBYTES, SCALES, BLOCK)                                          \
    DEFINE_DIRECT_R(NAME, 4, QTYPE, QBYTES, SCALES, BLOCK)                                          \
    static inline void NAME(const float* x, int64_t ldx, int64_t rows, const QTYPE* qs,            \
                            const float* sc, int64_t nb, int cols, float* y, int64_t ldy) {         \
        for (int c = 0; c < cols; c++) {                                                            \
            const QTYPE* qc = qs + c * nb * (QBYTES);                                               \
            const float* scc = sc + c * nb * (SCALES);                                              \
            switch (rows) {                                                                         \
                case 1: NAME##_1(x, ldx, qc, scc, nb, y + c, ldy); break;                           \
                case 2: NAME##_2(x, ldx, qc, scc, nb, y + c, ldy); break;                           \
                case 3: NAME##_3(x, ldx, qc, scc, nb, y + c, ldy); break;                           \
                default: NAME##_4(x, ldx, qc, scc, nb, y + c, ldy); break;                          \
            }                                                                                       \
        }                                                                                           \
    }

DEFINE_DIRECT(direct_q4_1, uint8_t, 16, 2, q4_1_block)
DEFINE_DIRECT(direct_q8_0, int8_t, 32, 1, q8_0_block)

/* The body of a linear over blocks: threads split the column tiles; up to DIRECT_ROWS rows a
 * tile's blocks are rebuilt in registers as they are multiplied, beyond that once into a
 * per-thread buffer that every row then runs against. */
#define LINEAR_BODY(REBUILD, DIRECT, QTYPE, QBYTES, SCALES)                                         \
    const int64_t nb = K / QK;                                                                      \
    const int64_t ntiles = (N + TC - 1) / TC;                                                       \
    _Pragma("omp parallel num_threads(threads)")                                                    \
    {                                                                                               \
        float buf[TC * MAXK] __attribute__((aligned(32)));                                          \
        _Pragma("omp for schedule(static)")                                                         \
        for (int64_t t = 0; t < ntiles; t++) {                                                      \
            const int64_t n0 = t * TC;                                                              \
            const int cols = (int)(N - n0 < TC ? N - n0 : TC);                                      \
            const QTYPE* qt = (const QTYPE*)qs + n0 * nb * (QBYTES);                                \
            const float* st = scales + n0 * nb * (SCALES);                                          \
            if (M <= DIRECT_ROWS) {                                                                 \
                DIRECT(x, ldx, M, qt, st, nb, cols, y + n0, N);                                     \
            } else {                                                                                \
                REBUILD(qt, st, nb, cols, buf);                                                     \
                tiles(x, ldx, M, buf, K, cols, y + n0, N);                                          \
            }                                                                                       \
            if (bias)                                                                               \
                for (int64_t r = 0; r < M; r++)                                                     \
                    for (int c = 0; c < cols; c++) y[r * N + n0 + c] += bias[n0 + c];               \
        }                                                                                           \
    }

/* Q4_1 weights: qs [N, K/32, 16] bytes, scales [N, K/32, 2] (d, m) float32. K % 32 == 0, K <= 8192. */
void parrot_linear_q4_1(const float* x, int64_t ldx, const uint8_t* qs, const float* scales, const float* bias,
                        float* y, int64_t M, int64_t N, int64_t K, int threads) {
    LINEAR_BODY(rebuild_q4_1, direct_q4_1, uint8_t, 16, 2)
}

/* Q8_0 weights: qs [N, K/32, 32] signed bytes, scales [N, K/32] (d) float32. K % 32 == 0, K <= 8192. */
void parrot_linear_q8_0(const float* x, int64_t ldx, const int8_t* qs, const float* scales, const float* bias,
                        float* y, int64_t M, int64_t N, int64_t K, int threads) {
    LINEAR_BODY(rebuild_q8_0, direct_q8_0, int8_t, 32, 1)
}
