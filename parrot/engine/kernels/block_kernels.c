/* Parrot's float32 kernels (x86: AVX2 + FMA): linears over block-encoded weights, then (below)
 * decode and prefill attention over a float32 paged KV cache and the decoder's elementwise steps.
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
 * Built at first use by parrot/engine/kernels/library.py (gcc -O3 -fopenmp -mavx2 -mfma
 * -ffp-contract=off: a product and a sum written apart stay two roundings, as in the reference).
 *
 * One source with cpu_kernels.c (the bf16 library) where the algorithm is the same: csrc/ holds
 * e^x, the elementwise steps, the cascade's driver and merge and the decoder layer's sequence,
 * compiled here over csrc/vec_avx2.h and float32 activations (act_t below). The linears over
 * blocks and the attention tiles are this library's own arithmetic (see cpu_kernels.c).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "csrc/vec_avx2.h"
#include "csrc/exp.h"

/* This library's activations for the shared kernels (csrc/elementwise.h, cascade.h,
 * decoder_layer.h): float32, 8 to a vector, no rounding between the ops. */
typedef float act_t;
#define act_load _mm256_loadu_ps
#define act_store _mm256_storeu_ps
#define act_round(v) (v)

#define QK 32      /* weights per block */

/* One Q4_1 block (16 bytes: byte j holds q[j] in its low nibble and q[j + 16] in its high one,
 * then d and m as float32) as four vectors of float32 weights. */
static inline void q4_1_block(const uint8_t* qs, const float* dm, __m256* w) {
    const __m128i raw = _mm_loadu_si128((const __m128i*)qs);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m256 d = _mm256_set1_ps(dm[0]), m = _mm256_set1_ps(dm[1]);
    /* d * q is exact in float32, so one fused multiply-add rounds exactly as d * q + m does */
    w[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m);
    w[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m);
    w[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m);
    w[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m);
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

/* ---- Decode attention over a float32 paged KV cache ------------------------------------------
 * One kernel for both decode paths of the float32 engine: per context (each row's whole KV is one
 * piece) and the shared-prefix cascade (each shared prefix one piece read once for all the rows
 * sharing it, then each row's tail). K and V are read in place through block ids: no gather copy,
 * no padded mask. A work item is one piece and one KV head: for every tile of FT keys, the tile is
 * read from memory once and every query of the piece (its rows' G heads) takes its scores, an
 * online-softmax update (running max m and sum l, fp32) and the weighted V while the tile is in
 * cache; it leaves each query's partial (m, l, unnormalized output) in its slot. The driver and the
 * second pass, which merges each row's partials by log-sum-exp (one slot: out = o / l), are
 * csrc/cascade.h, shared with cpu_kernels.c, whose work item is its own arithmetic (three passes
 * over 16-key score vectors, bf16 dot products). A query's arithmetic depends
 * only on its keys and the piece's tile grid, never on the other rows: per-context decode gives a
 * row the same bits in any batch. A NaN score makes the row NaN, as in SDPA. */
#define FT 32 /* keys per tile */
#define MAX_HEAD_DIM 256

/* Eight horizontal sums at once: lane j holds the sum of a[j]. */
static inline __m256 reduce8(const __m256 a[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* One query against the tile's n keys (krow padded to a multiple of 8 with valid rows): its scaled
 * scores in s[0:n], keys past n at -inf; returns their max (NaN scores do not count). */
static inline __attribute__((always_inline)) float tile_scores(const float* qr, const float* const* krow, int64_t n,
                                                               float scale, float* s, const int64_t D) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t c = 0; c < D; c += 8) {
            const __m256 qv = _mm256_loadu_ps(qr + c);
            for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(krow[i0 + j] + c), acc[j]);
        }
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i0)), lane));
        const __m256 sv = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale)), live);
        _mm256_storeu_ps(s + i0, sv);
        vmax = _mm256_max_ps(sv, vmax); /* NaN in sv: vmax (the second operand) */
    }
    return hmax8(vmax);
}

/* One query's online-softmax step (decode and prefill alike) over a tile whose scores s[0:len]
 * (len rounded up to 8 lanes; masked keys -inf) have the max mt: s becomes e^(s - m_new) (0 where
 * masked), m and l are updated, and the factor for the running output, e^(m_old - m_new), is
 * returned. */
static inline float softmax_step(float* s, int64_t len, float mt, float* m, float* l) {
    const float mn = mt > *m ? mt : *m;
    const float alpha = mn == -INFINITY ? 1.0f : expf(*m - mn);
    const __m256 vm = _mm256_set1_ps(mn);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < len; j += 8) { /* masked lanes: e^(-inf) = 0 */
        const __m256 e = vf_exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    *l = *l * alpha + hsum8(sum);
    *m = mn;
    return alpha;
}

/* One query's online-softmax step over a tile: m, l and o[0:D] updated in place. */
static inline __attribute__((always_inline)) void tile_update(const float* qr, const float* const* krow,
                                                              const float* const* vrow, int64_t n, float scale,
                                                              float* m, float* l, float* o, const int64_t D) {
    _Alignas(32) float s[FT];
    const float alpha = softmax_step(s, n, tile_scores(qr, krow, n, scale, s, D), m, l);
    const __m256 va = _mm256_set1_ps(alpha);
    for (int64_t c0 = 0; c0 < D; c0 += 64) { /* 8 accumulators: 64 dims at a time */
        const int64_t cw = D - c0 < 64 ? D - c0 : 64;
        __m256 acc[8];
        for (int64_t k = 0; k < cw / 8; k++) acc[k] = _mm256_mul_ps(_mm256_loadu_ps(o + c0 + 8 * k), va);
        for (int64_t i = 0; i < n; i++) {
            const __m256 w = _mm256_set1_ps(s[i]);
            for (int64_t k = 0; k < cw / 8; k++) acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vrow[i] + c0 + 8 * k), acc[k]);
        }
        for (int64_t k = 0; k < cw / 8; k++) _mm256_storeu_ps(o + c0 + 8 * k, acc[k]);
    }
}

/* Piece work item: L tokens through `blocks`, read by R rows (`rows`), KV head h; slot r * Hq + hq
 * of pm / pl / pacc (pacc: D floats a slot) holds row r's partial for query head hq. */
static inline __attribute__((always_inline)) void piece_f32(const float* q, int64_t q_stride, const float* kc,
                                                            const float* vc, const int64_t* blocks, int64_t L,
                                                            const int64_t* rows, int64_t R, float* pm, float* pl,
                                                            float* pacc, int64_t h, int64_t Hkv, int64_t bs,
                                                            float scale, const int64_t G, const int64_t D) {
    const int64_t Hq = Hkv * G, row = Hkv * D;
    for (int64_t r = 0; r < R; r++)
        for (int64_t g = 0; g < G; g++) {
            const int64_t slot = r * Hq + h * G + g;
            pm[slot] = -INFINITY, pl[slot] = 0.0f;
            for (int64_t c = 0; c < D; c++) pacc[slot * D + c] = 0.0f;
        }
    /* Each tile's rows are found (and prefetched into L2) one tile ahead: the queries of this tile
     * then read K and V from cache, not memory. */
    int64_t blk = 0, off = 0, cur = 0;
    int64_t at[2][FT];
    const int64_t first_n = L < FT ? L : FT;
    for (int64_t i = 0; i < first_n; i++) {
        at[0][i] = (blocks[blk] * bs + off) * row + h * D;
        if (++off == bs) off = 0, ++blk;
    }
    for (int64_t t0 = 0; t0 < L; t0 += FT) {
        const int64_t n = L - t0 < FT ? L - t0 : FT, after = L - t0 - n < FT ? L - t0 - n : FT;
        for (int64_t i = 0; i < after; i++) {
            const int64_t a = (blocks[blk] * bs + off) * row + h * D;
            at[cur ^ 1][i] = a;
            if (++off == bs) off = 0, ++blk;
            for (int64_t c = 0; c < D; c += 16) {
                _mm_prefetch((const char*)(kc + a + c), _MM_HINT_T1);
                _mm_prefetch((const char*)(vc + a + c), _MM_HINT_T1);
            }
        }
        const float *krow[FT], *vrow[FT];
        for (int64_t i = 0; i < n; i++) krow[i] = kc + at[cur][i], vrow[i] = vc + at[cur][i];
        cur ^= 1;
        for (int64_t i = n; i < (n + 7) / 8 * 8; i++) krow[i] = krow[0]; /* read, then masked */
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t slot = r * Hq + h * G + g;
                const float* qr = q + rows[r] * q_stride + (h * G + g) * D;
                tile_update(qr, krow, vrow, n, scale, pm + slot, pl + slot, pacc + slot * D, D);
            }
    }
}

/* One work item of cascade_decode (csrc/cascade.h), the head shape a constant where it is common;
 * it allocates nothing, so it never fails. */
static int64_t cascade_piece(const float* q, int64_t q_stride, const float* kc, const float* vc, const int64_t* blocks,
                             int64_t L, const int64_t* rows, int64_t R, float* pm, float* pl, float* pacc, int64_t h,
                             int64_t Hkv, int64_t bs, float scale, int64_t G, int64_t D) {
#define PIECE_F32(GG, DD) piece_f32(q, q_stride, kc, vc, blocks, L, rows, R, pm, pl, pacc, h, Hkv, bs, scale, GG, DD)
    if (G == 3 && D == 64) PIECE_F32(3, 64);
    else if (G == 1 && D == 64) PIECE_F32(1, 64);
    else if (D == 128) PIECE_F32(G, 128);
    else PIECE_F32(G, D);
#undef PIECE_F32
    return 0;
}

/* A partial's weight in the merge: a piece whose keys all scored -inf adds nothing; a NaN score
 * travels in its partial's l and sums, so it makes the row NaN. */
static inline float merge_weight(float ms, float m, int any_nan) {
    (void)any_nan;
    return ms == -INFINITY ? 0.0f : expf(ms - m);
}

#include "csrc/cascade.h"

/* The pieces, rows and slots of parrot_cascade_decode (cpu_kernels.c, csrc/cascade.h) over float32
 * q [B, Hq, D] (rows q_stride apart), caches [blocks, bs, Hkv, D] and out [B, Hq * D]. D % 8 == 0,
 * D <= 256. Returns 0, or the work items when the partials could not be allocated (the caller raises). */
int64_t parrot_cascade_decode_f32(const float* q, int64_t q_stride, const float* kc, const float* vc, int64_t P,
                                  const int64_t* block_ptr, const int64_t* piece_blocks, const int64_t* piece_len,
                                  const int64_t* row_ptr, const int64_t* piece_rows, const int64_t* slot_ptr,
                                  const int64_t* row_slots, float* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t D,
                                  int64_t bs, float scale, int num_threads) {
    return cascade_decode(q, q_stride, kc, vc, P, block_ptr, piece_blocks, piece_len, row_ptr, piece_rows, slot_ptr,
                          row_slots, out, B, Hq, Hkv, D, bs, scale, num_threads);
}

/* ---- Causal prefill attention over a float32 paged KV cache ----------------------------------
 * One chunk of T new tokens (positions S - T .. S - 1, their K/V already in the cache) attends to
 * its sequence's keys, causally. First every (KV head, 32-key tile) is packed once for the whole
 * chunk: K transposed ([D][32], so a query's 32 scores are 4 vector FMAs a dimension) and V as
 * rows; then a work item is one KV head and a block of query tokens (their G heads each, token-
 * major), which walks the tiles its last token sees: 4 query rows at a time take their 32 scores
 * (4 rows x 16 keys of accumulators), the causal mask, an online-softmax step (running max m and
 * sum l, fp32) and the weighted V (4 rows x 16 dims of accumulators), then out = o / l. A tile a row
 * cannot see is never computed for it. The tiles start at key 0 whatever the chunk, and a row's
 * sums run in one order whichever register block it lands in (a key past its reach adds 0 * v), so
 * its bits depend only on its query and its sequence's keys: not on the chunking, nor on the other
 * sequences of the step. A NaN score makes its row NaN. */
#define PF_KT 32 /* keys per tile */
#define PF_RB 4  /* query rows per register block */
#define PF_QB 16 /* query tokens per work item (fewer when the chunk is short: see below) */

/* s[r][0:32] = scale * (q_r . k_j) for R rows against a packed tile kt [D][32]. */
static inline __attribute__((always_inline)) void prefill_scores(const float* const* qr, const int R, const float* kt,
                                                                 float scale, float* s, const int64_t D) {
    for (int jb = 0; jb < PF_KT; jb += 16) {
        __m256 acc[PF_RB][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            const __m256 k0 = _mm256_load_ps(kt + d * PF_KT + jb), k1 = _mm256_load_ps(kt + d * PF_KT + jb + 8);
            for (int r = 0; r < R; r++) {
                const __m256 b = _mm256_broadcast_ss(qr[r] + d);
                acc[r][0] = _mm256_fmadd_ps(b, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(b, k1, acc[r][1]);
            }
        }
        const __m256 vs = _mm256_set1_ps(scale);
        for (int r = 0; r < R; r++) {
            _mm256_store_ps(s + r * PF_KT + jb, _mm256_mul_ps(acc[r][0], vs));
            _mm256_store_ps(s + r * PF_KT + jb + 8, _mm256_mul_ps(acc[r][1], vs));
        }
    }
}

/* One row's online-softmax step over its scores s[0:32], of which the first `vis` are visible:
 * s becomes e^(s - m_new) (0 where masked); m and l updated; returns the factor for o. */
static inline float prefill_softmax(float* s, int64_t vis, float* m, float* l) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < PF_KT; j += 8) {
        const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(vis - j)), lane));
        const __m256 sv = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_load_ps(s + j), live);
        _mm256_store_ps(s + j, sv);
        vmax = _mm256_max_ps(sv, vmax); /* NaN in sv: vmax (the second operand) */
    }
    return softmax_step(s, PF_KT, hmax8(vmax), m, l);
}

/* o[r] = o[r] * alpha[r] + sum_j p[r][j] * v_j over the tile's first n keys, R rows. */
static inline __attribute__((always_inline)) void prefill_pv(float* const* o, const int R, const float* alpha,
                                                             const float* p, const float* vt, int64_t n,
                                                             const int64_t D) {
    for (int64_t c = 0; c < D; c += 16) {
        __m256 acc[PF_RB][2];
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_set1_ps(alpha[r]);
            acc[r][0] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + c), a);
            acc[r][1] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + c + 8), a);
        }
        for (int64_t j = 0; j < n; j++) {
            const __m256 v0 = _mm256_load_ps(vt + j * D + c), v1 = _mm256_load_ps(vt + j * D + c + 8);
            for (int r = 0; r < R; r++) {
                const __m256 w = _mm256_broadcast_ss(p + r * PF_KT + j);
                acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
            }
        }
        for (int r = 0; r < R; r++) _mm256_storeu_ps(o[r] + c, acc[r][0]), _mm256_storeu_ps(o[r] + c + 8, acc[r][1]);
    }
}

/* R rows (from row r0 of the work item) through one tile starting at key t0 of n keys. */
static inline __attribute__((always_inline)) void prefill_rows(const float* const* qr, float* const* o, const int R,
                                                               const int64_t* last, int64_t t0, int64_t n,
                                                               const float* kt, const float* vt, float scale,
                                                               float* s, float* m, float* l, const int64_t D) {
    float alpha[PF_RB];
    int64_t reach = 0; /* keys of the tile the block's rows see, at most */
    prefill_scores(qr, R, kt, scale, s, D);
    for (int r = 0; r < R; r++) {
        const int64_t vis = last[r] - t0 + 1 < n ? last[r] - t0 + 1 : n;
        alpha[r] = prefill_softmax(s + r * PF_KT, vis, m + r, l + r);
        if (vis > reach) reach = vis;
    }
    prefill_pv(o, R, alpha, s, vt, reach, D);
}

/* One work item: KV head h, query tokens [i0, i1) of the chunk; 1 if its buffers could not be
 * allocated. kpack / vpack: this head's packed tiles. */
static inline __attribute__((always_inline)) int64_t prefill_f32_task(
    const float* q, int64_t q_stride, const float* kpack, const float* vpack, int64_t T, int64_t S, float* out,
    int64_t h, int64_t i0, int64_t i1, int64_t Hkv, float scale, const int64_t G, const int64_t D) {
    const int64_t Hq = Hkv * G, past = S - T, NR = (i1 - i0) * G, tiles = (past + i1 + PF_KT - 1) / PF_KT;
    float* f = aligned_alloc(32, (size_t)((NR * (D + 2) + PF_RB * PF_KT) * 4 + 32) / 32 * 32);
    if (f == NULL) return 1;
    float *o = f, *m = f + NR * D, *l = m + NR, *s = (float*)(((uintptr_t)(l + NR) + 31) / 32 * 32);
    for (int64_t r = 0; r < NR; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t i = 0; i < NR * D; i++) o[i] = 0.0f;
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t t0 = t * PF_KT, n = S - t0 < PF_KT ? S - t0 : PF_KT;
        const float *kt = kpack + t0 * D, *vt = vpack + t0 * D;
        const int64_t first = t0 > past + i0 ? (t0 - past - i0) * G : 0; /* rows before see no key here */
        for (int64_t r0 = first; r0 < NR; r0 += PF_RB) {
            const int R = NR - r0 < PF_RB ? (int)(NR - r0) : PF_RB;
            const float* qr[PF_RB];
            float* orow[PF_RB];
            int64_t last[PF_RB];
            for (int r = 0; r < R; r++) {
                const int64_t row = r0 + r, i = i0 + row / G;
                qr[r] = q + i * q_stride + (h * G + row % G) * D, orow[r] = o + row * D, last[r] = past + i;
            }
            if (R == PF_RB) prefill_rows(qr, orow, PF_RB, last, t0, n, kt, vt, scale, s, m + r0, l + r0, D);
            else
                for (int r = 0; r < R; r++)
                    prefill_rows(qr + r, orow + r, 1, last + r, t0, n, kt, vt, scale, s, m + r0 + r, l + r0 + r, D);
        }
    }
    for (int64_t row = 0; row < NR; row++) {
        const int64_t i = i0 + row / G;
        float* dst = out + i * Hq * D + (h * G + row % G) * D;
        const __m256 inv = _mm256_set1_ps(1.0f / l[row]);
        for (int64_t c = 0; c < D; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(o + row * D + c), inv));
    }
    free(f);
    return 0;
}

/* q: [T, Hq, D] rows q_stride apart (a prefill chunk's queries); kc/vc: one layer's cache [blocks,
 * bs, Hkv, D] holding the sequence's S tokens (the chunk's included) through `table`; out:
 * [T, Hq * D]; kpack/vpack: scratch of Hkv * ceil(S / 64) * 64 * D floats each (the bf16 kernel's
 * sizes). D % 16 == 0, D <= 256, 1 <= T <= S. Returns the work items that could not allocate. */
int64_t parrot_paged_prefill_f32(const float* q, int64_t q_stride, const float* kc, const float* vc,
                                 const int64_t* table, int64_t T, int64_t S, float* out, float* kpack, float* vpack,
                                 int64_t Hq, int64_t Hkv, int64_t D, int64_t bs, float scale, int num_threads) {
    const int64_t G = Hq / Hkv, tiles = (S + PF_KT - 1) / PF_KT, per_head = (S + 63) / 64 * 64 * D;
    /* Query blocks of PF_QB tokens, smaller when that leaves fewer than 4 work items a thread. */
    int64_t qb = PF_QB;
    if (Hkv * ((T + qb - 1) / qb) < 4 * num_threads) qb = (T * Hkv + 4 * num_threads - 1) / (4 * num_threads);
    if (qb < 1) qb = 1;
    if (qb > PF_QB) qb = PF_QB;
    const int64_t qblocks = (T + qb - 1) / qb;
    int64_t failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t ht = 0; ht < Hkv * tiles; ht++) { /* every tile packed once, for all query blocks */
            const int64_t h = ht / tiles, t0 = ht % tiles * PF_KT, n = S - t0 < PF_KT ? S - t0 : PF_KT;
            float *kt = kpack + h * per_head + t0 * D, *vt = vpack + h * per_head + t0 * D;
            for (int64_t j = 0; j < PF_KT; j++) {
                if (j < n) {
                    const int64_t pos = t0 + j, at = (table[pos / bs] * bs + pos % bs) * Hkv * D + h * D;
                    for (int64_t d = 0; d < D; d++) kt[d * PF_KT + j] = kc[at + d], vt[j * D + d] = vc[at + d];
                } else
                    for (int64_t d = 0; d < D; d++) kt[d * PF_KT + j] = 0.0f, vt[j * D + d] = 0.0f;
            }
        }
#pragma omp for schedule(dynamic, 1) reduction(+ : failed)
        for (int64_t task = 0; task < Hkv * qblocks; task++) {
            const int64_t b = qblocks - 1 - task / Hkv, h = task % Hkv; /* the most keys first */
            const int64_t i0 = b * qb, i1 = i0 + qb < T ? i0 + qb : T;
            const float *kp = kpack + h * per_head, *vp = vpack + h * per_head;
            if (G == 3 && D == 64) failed += prefill_f32_task(q, q_stride, kp, vp, T, S, out, h, i0, i1, Hkv, scale, 3, 64);
            else if (D == 64) failed += prefill_f32_task(q, q_stride, kp, vp, T, S, out, h, i0, i1, Hkv, scale, G, 64);
            else if (D == 128) failed += prefill_f32_task(q, q_stride, kp, vp, T, S, out, h, i0, i1, Hkv, scale, G, 128);
            else failed += prefill_f32_task(q, q_stride, kp, vp, T, S, out, h, i0, i1, Hkv, scale, G, D);
        }
    }
    return failed;
}

/* ---- The elementwise steps of a float32 decoder layer (csrc/elementwise.h; ops.py) -------------- */
#include "csrc/elementwise.h"

/* out = w * (r * rsqrt(mean(r^2) + eps)), r = x (+ delta, written to resid). D % 8 == 0. */
void parrot_rmsnorm_f32(const float* x, const float* delta, float* resid, const float* w, float* out, int64_t N,
                        int64_t D, float eps, int num_threads) {
    rmsnorm_rows(x, delta, resid, w, out, N, D, eps, num_threads);
}

/* In place on x [N, H, D] (rows x_stride apart): x = x * c + rotate_half(x) * s with c, s the tables'
 * rows at each position: the reference's operations (two products, one sum: its bits). D % 16 == 0. */
void parrot_rope_f32(float* x, int64_t x_stride, int64_t N, int64_t H, int64_t D, const float* cos_table,
                     const float* sin_table, const int64_t* positions, int num_threads) {
    rope_rows(x, x_stride, N, H, D, cos_table, sin_table, positions, num_threads);
}

/* out [N, I] = silu(g) * u = g / (1 + e^-g) * u, where gu [N, 2I] = [g | u]. I % 8 == 0. */
void parrot_silu_mul_f32(const float* gu, float* out, int64_t N, int64_t I, int num_threads) {
    silu_mul_rows(gu, out, N, I, num_threads);
}

/* ---- A whole decoder layer of a decode step in one call (fused_f32.py; csrc/decoder_layer.h) ------
 * Attention on the cascade kernel over the step's pieces. Saves the ~10 Python and ctypes calls
 * and the tensor allocations per layer of the per-op path. The layer descriptor: int64 [17], per
 * linear (QKV, O, gate/up, down) its kind (0 Q4_1, 1 Q8_0), codes, scales and bias (or 0), then the
 * post-attention norm's weight. */
#include "csrc/decoder_layer.h"

enum { FL_LINEAR_SIZE = 4, FL_POST_NORM = 16 };
/* The step descriptor's attention slots, after the shared ones: the step's pieces (CascadePieces). */
enum { ST_PIECES = ST_ATTENTION, ST_BLOCK_PTR, ST_BLOCKS, ST_LENS, ST_ROW_PTR, ST_ROWS_OF_PIECES, ST_SLOT_PTR,
       ST_ROW_SLOTS };

static void layer_linear(const int64_t* layer, int which, const float* x, int64_t ldx, float* y, int64_t M, int64_t N,
                         int64_t K, int threads) {
    const int64_t* lin = layer + which * FL_LINEAR_SIZE;
    const float* bias = PTR(const float*, lin[3]);
    if (lin[0] == 0) parrot_linear_q4_1(x, ldx, PTR(const uint8_t*, lin[1]), PTR(const float*, lin[2]), bias, y, M, N, K, threads);
    else parrot_linear_q8_0(x, ldx, PTR(const int8_t*, lin[1]), PTR(const float*, lin[2]), bias, y, M, N, K, threads);
}

static int64_t layer_attention(const int64_t* step, const float* qkv, int64_t W, float* kc, float* vc, float* attn,
                               float scale, int threads) {
    return parrot_cascade_decode_f32(
        qkv, W, kc, vc, step[ST_PIECES], PTR(const int64_t*, step[ST_BLOCK_PTR]), PTR(const int64_t*, step[ST_BLOCKS]),
        PTR(const int64_t*, step[ST_LENS]), PTR(const int64_t*, step[ST_ROW_PTR]),
        PTR(const int64_t*, step[ST_ROWS_OF_PIECES]), PTR(const int64_t*, step[ST_SLOT_PTR]),
        PTR(const int64_t*, step[ST_ROW_SLOTS]), attn, step[ST_ROWS], step[ST_HQ], step[ST_HKV], step[ST_HEAD_DIM],
        step[ST_BLOCK_SIZE], scale, threads);
}

/* The bf16 layer's arguments (cpu_kernels.c) over float32 rows. Returns 0, or the attention's
 * failed work items (out of memory). */
int64_t parrot_decoder_layer_f32(const int64_t* layer, const int64_t* step, int64_t idx, const float* x,
                                 const float* h, const float* next_w, float* x_out, float* h_out, float eps1,
                                 float eps2, float scale) {
    return decoder_layer(layer, step, idx, x, h, PTR(const float*, layer[FL_POST_NORM]), next_w, x_out, h_out, eps1,
                         eps2, scale);
}
