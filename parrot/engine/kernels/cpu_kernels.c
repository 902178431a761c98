/* Parrot's native CPU kernels for the bf16 decoder (x86: AVX512-BF16, AMX-BF16).
 *
 * 1. parrot_linear_bf16: y[M, N] = x[M, K] @ w[N, K]^T for M <= 4. Decode steps with few sequences
 *    are matrix-vector products: they read every weight once and do almost no arithmetic, so their
 *    speed is memory bandwidth. oneDNN's bf16 path reaches ~8 GB/s there on this class of machine;
 *    this kernel streams each weight row once for all rows (vdpbf16ps, fp32 accumulation, software
 *    prefetch) and reaches ~15 GB/s.
 * 2. parrot_linear_amx: any number of rows over weights prepacked into AMX tiles, each row summed
 *    in one fixed order (5..128 rows, and every row count in the batch-invariant mode);
 *    parrot_linear_vnni: the same without AMX (the batch-invariant mode's kernel there).
 * 3. parrot_paged_decode: one query token per sequence over its paged KV, read in place;
 *    parrot_cascade_decode: the same with shared prefixes read once for all the rows sharing them;
 *    parrot_paged_prefill: the causal attention of a prefill chunk (flash-style, 2.4-3.7x the speed
 *    of torch's CPU SDPA on AVX512-BF16 without AMX). Where AMX runs, paged decode and prefill
 *    attend on AMX tiles (1.4-1.9x SDPA's prefill on a Xeon with AMX; decode 1.02-1.11x the
 *    AVX512 kernel), with one per-row arithmetic of their own (parrot_attention_amx).
 * 4. parrot_argmax_logsumexp: greedy choice and log-normalizer of bf16 logits.
 * 5. parrot_rmsnorm (with the residual add), parrot_rope, parrot_silu_mul: the per-layer
 *    elementwise steps, rounding where the torch reference rounds.
 *
 * Built at first use by parrot/engine/kernels/library.py (gcc -O3 -fopenmp); it links the OpenMP
 * runtime torch already loaded, and takes its thread count from torch.
 *
 * One source with block_kernels.c (the float32 library, AVX2) where the algorithm is the same:
 * csrc/ holds e^x, the elementwise steps, the cascade's driver and merge and the decoder
 * layer's sequence (parrot_decoder_layer), written over vector operations (csrc/vec_avx512.h here)
 * and this library's bf16 activations (act_t below). Written here alone, because the arithmetic
 * differs and tests pin each library's bits: the linears (vdpbf16ps dot products over bf16 weights,
 * VNNI-packed or AMX tiles; the float32 library rebuilds GGUF blocks), the attention tiles (bf16
 * pair dot products over 64-key tiles with bf16 weights, and the AMX tiles; float32: FMAs over
 * 32-key tiles) and their horizontal sums (reduce16's transposing tree against hadd's).
 */
#include <immintrin.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "csrc/vec_avx512.h"
#include "csrc/exp.h"

#define ROWS 4          /* weight rows per block: one pass over them serves every input row */
#define PREFETCH 256    /* elements ahead of the loads */

static inline float bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, like torch */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __m512 load_bf16x16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

static inline __m512 round_bf16(__m512 v) { /* fp32 -> nearest bf16 -> fp32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

static inline void store_bf16x16(uint16_t* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }

/* This library's activations for the shared kernels (csrc/elementwise.h, cascade.h,
 * decoder_layer.h): bf16, 16 to a vector, rounded to nearest even where stored. */
typedef uint16_t act_t;
#define act_load load_bf16x16
#define act_store store_bf16x16
#define act_round round_bf16

#define DEFINE_BLOCK(MM)                                                                             \
    static inline void block_##MM(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K,      \
                                  const uint16_t* bias, uint16_t* y, int64_t ldy, int64_t n0) {      \
        __m512 acc[MM][ROWS];                                                                        \
        for (int i = 0; i < MM; i++)                                                                 \
            for (int j = 0; j < ROWS; j++) acc[i][j] = _mm512_setzero_ps();                          \
        int64_t k = 0;                                                                               \
        for (; k + 32 <= K; k += 32) {                                                               \
            __m512bh wv[ROWS];                                                                       \
            for (int j = 0; j < ROWS; j++) {                                                         \
                const uint16_t* row = w + (n0 + j) * K + k;                                          \
                _mm_prefetch((const char*)(row + PREFETCH), _MM_HINT_T0);                            \
                wv[j] = (__m512bh)_mm512_loadu_si512(row);                                           \
            }                                                                                        \
            for (int i = 0; i < MM; i++) {                                                           \
                __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * ldx + k);                         \
                for (int j = 0; j < ROWS; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);   \
            }                                                                                        \
        }                                                                                            \
        if (k < K) {                                                                                 \
            __mmask32 m = (__mmask32)((1ull << (K - k)) - 1);                                        \
            __m512bh wv[ROWS];                                                                       \
            for (int j = 0; j < ROWS; j++)                                                           \
                wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + (n0 + j) * K + k);                 \
            for (int i = 0; i < MM; i++) {                                                           \
                __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x + i * ldx + k);                \
                for (int j = 0; j < ROWS; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);   \
            }                                                                                        \
        }                                                                                            \
        for (int i = 0; i < MM; i++)                                                                 \
            for (int j = 0; j < ROWS; j++) {                                                         \
                float s = _mm512_reduce_add_ps(acc[i][j]);                                           \
                if (bias) s += bf16_to_f32(bias[n0 + j]);                                            \
                y[i * ldy + n0 + j] = f32_to_bf16(s);                                                \
            }                                                                                        \
    }

DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)

/* Weight rows left over when N is not a multiple of ROWS. */
static void one_column(const uint16_t* x, int64_t ldx, int64_t M, const uint16_t* w, int64_t K,
                       const uint16_t* bias, uint16_t* y, int64_t n, int64_t N) {
    for (int64_t i = 0; i < M; i++) {
        float s = 0.f;
        for (int64_t k = 0; k < K; k++) s += bf16_to_f32(x[i * ldx + k]) * bf16_to_f32(w[n * K + k]);
        if (bias) s += bf16_to_f32(bias[n]);
        y[i * N + n] = f32_to_bf16(s);
    }
}

/* x: M rows with stride ldx (elements); w: [N, K] contiguous; bias: [N] or NULL; y: [M, N]. */
void parrot_linear_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, const uint16_t* bias,
                        uint16_t* y, int64_t M, int64_t N, int64_t K, int num_threads) {
    int64_t num_blocks = N / ROWS;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t b = 0; b < num_blocks; b++) {
        int64_t n0 = b * ROWS, m0 = 0;
        for (; m0 + 4 <= M; m0 += 4) block_4(x + m0 * ldx, ldx, w, K, bias, y + m0 * N, N, n0);
        switch (M - m0) {
            case 3: block_3(x + m0 * ldx, ldx, w, K, bias, y + m0 * N, N, n0); break;
            case 2: block_2(x + m0 * ldx, ldx, w, K, bias, y + m0 * N, N, n0); break;
            case 1: block_1(x + m0 * ldx, ldx, w, K, bias, y + m0 * N, N, n0); break;
            default: break;
        }
    }
    for (int64_t n = num_blocks * ROWS; n < N; n++) one_column(x, ldx, M, w, K, bias, y, n, N);
}

/* ---- Row-invariant linear: one kernel for every row count (the batch-invariant mode) --------
 * Weights prepacked once (kernels.pack_vnni) as [N/16, K/2, 16, 2]: for each block of 16 output
 * columns, each input feature pair holds the 16 columns' pairs in one 64-byte vector. Output
 * (i, n) is one fp32 lane that adds x[i, 2p] w[n, 2p] + x[i, 2p+1] w[n, 2p+1] for p = 0, 1, ...
 * in order (vdpbf16ps), then the bias, then one rounding: an order fixed per row, whatever the
 * number of rows, the register block the row lands in, or the thread that runs it. Blocks of
 * up to 6 rows x 64 columns reuse each weight vector for 6 rows and each x pair for 4 vectors. */
#define VNNI_ROWS 6
#define VNNI_COLS 4 /* 16-column blocks per register block */

static inline __attribute__((always_inline)) void vnni_block(const uint16_t* x, int64_t ldx, const uint16_t* wp,
                                                             int64_t K2, const uint16_t* bias, uint16_t* y,
                                                             int64_t ldy, int64_t nb0, const int MM, const int NB) {
    __m512 acc[VNNI_ROWS][VNNI_COLS];
    for (int i = 0; i < MM; i++)
        for (int j = 0; j < NB; j++) acc[i][j] = _mm512_setzero_ps();
    const uint16_t* w0 = wp + nb0 * K2 * 32;
    for (int64_t p = 0; p < K2; p++) {
        __m512bh wv[VNNI_COLS];
        for (int j = 0; j < NB; j++) wv[j] = (__m512bh)_mm512_loadu_si512(w0 + (j * K2 + p) * 32);
        for (int i = 0; i < MM; i++) {
            int32_t pair;
            memcpy(&pair, x + i * ldx + 2 * p, 4);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            for (int j = 0; j < NB; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
        }
    }
    for (int j = 0; j < NB; j++) {
        const __m256i braw = bias ? _mm256_loadu_si256((const __m256i*)(bias + (nb0 + j) * 16)) : _mm256_setzero_si256();
        const __m512 b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(braw), 16));
        for (int i = 0; i < MM; i++)
            _mm256_storeu_si256((__m256i*)(y + i * ldy + (nb0 + j) * 16),
                                (__m256i)_mm512_cvtneps_pbh(bias ? _mm512_add_ps(acc[i][j], b) : acc[i][j]));
    }
}

#define VNNI_CASE(MM)                                                              \
    case MM:                                                                       \
        if (nb == VNNI_COLS) vnni_block(xm, ldx, wp, K2, bias, ym, N, nb0, MM, VNNI_COLS); \
        else vnni_block(xm, ldx, wp, K2, bias, ym, N, nb0, MM, 1);                 \
        break;

/* y[M, N] = x[M, K] @ w^T (+ bias [N]); wp = pack_vnni(w); N % 16 == 0, K % 2 == 0. */
void parrot_linear_vnni(const uint16_t* x, int64_t ldx, const uint16_t* wp, const uint16_t* bias, uint16_t* y,
                        int64_t M, int64_t N, int64_t K, int num_threads) {
    const int64_t K2 = K / 2, blocks16 = N / 16, groups = (blocks16 + VNNI_COLS - 1) / VNNI_COLS;
    /* Work item: (column group, 48-row panel); a group is 4 column blocks, or single leftovers. */
    const int64_t panel = 8 * VNNI_ROWS, panels = (M + panel - 1) / panel;
#pragma omp parallel for num_threads(num_threads) schedule(static) collapse(2)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t pm = 0; pm < panels; pm++) {
            const int64_t first = g * VNNI_COLS, end = first + VNNI_COLS < blocks16 ? first + VNNI_COLS : blocks16;
            const int64_t m_end = (pm + 1) * panel < M ? (pm + 1) * panel : M;
            for (int64_t nb0 = first; nb0 < end;) {
                const int64_t nb = end - nb0 == VNNI_COLS ? VNNI_COLS : 1;
                for (int64_t m0 = pm * panel; m0 < m_end; m0 += VNNI_ROWS) {
                    const uint16_t* xm = x + m0 * ldx;
                    uint16_t* ym = y + m0 * N;
                    switch (m_end - m0 < VNNI_ROWS ? m_end - m0 : VNNI_ROWS) {
                        VNNI_CASE(1)
                        VNNI_CASE(2)
                        VNNI_CASE(3)
                        VNNI_CASE(4)
                        VNNI_CASE(5)
                        VNNI_CASE(6)
                        default: break;
                    }
                }
                nb0 += nb;
            }
        }
}

/* ---- AMX: any number of rows --------------------------------------------------------------
 * Weights are prepacked once (see kernels.pack_amx) into 1 KB tiles: for each block of 16 output
 * columns and each block of 32 input features, 16 rows of 16 (column, feature-pair) bf16 pairs,
 * the VNNI layout tdpbf16ps reads. A work item is (panel of AMX_PANEL rows, block of 32 output
 * columns), panel-major, so a thread's items reuse one panel of x from L2 while the weights stream;
 * within an item, pairs of 16-row blocks against the two column tiles (a 32 x 32 block per pass
 * over K). Each output (i, n) is one fp32 lane of one C tile, accumulated over K in 32-feature
 * steps in order, then the bias, then one rounding: its bits depend on row i of x and column n of
 * w alone, whatever M, the panel, the tile its row lands in or the thread (the batch-invariant
 * mode runs every row count here where AMX runs). Nothing is copied or padded: fewer than 16 rows
 * configure shorter tiles; otherwise a partial last block is the window of the last 16 rows,
 * which recomputes rows the previous block holds (the same bits) and stores only the new ones. */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_PANEL 128 /* rows of x per work item (8 blocks: 147 KB of x at K = 576) */

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int amx_granted = 0;   /* the OS granted this process the tile state (parrot_amx_init) */
static int amx_attention = 0; /* the paged decode and prefill kernels attend on AMX (see below) */

/* Ask the kernel for the AMX tile state (once per process; the caller checked the CPU flags); 1 on
 * success, and then attention runs on AMX too. */
int parrot_amx_init(void) {
    amx_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    amx_attention = amx_granted;
    return amx_granted;
}

/* Attention on AMX (on > 0, where granted) or on AVX512-BF16 (on == 0); on < 0 only asks. Returns
 * whether it runs on AMX now. The two round differently: an engine keeps one for its life (the
 * benchmarks and tests switch between engines' steps, never inside one). */
int parrot_attention_amx(int on) {
    if (on >= 0) amx_attention = on && amx_granted;
    return amx_attention;
}

/* Tiles 0-3: C (rows x 16 fp32); 4, 5: x (rows x 32 bf16); 6, 7: w (16 feature pairs x 32 bf16). */
static void amx_configure(int64_t rows) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t < 6 ? (uint8_t)rows : 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

static void store_tile_rows(const float* c, int64_t skip, int64_t rows, const uint16_t* bias, uint16_t* y,
                            int64_t ldy, int64_t n0) {
    __m512 b = _mm512_setzero_ps();
    if (bias) b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(bias + n0))), 16));
    for (int64_t i = skip; i < rows; i++) {
        __m512 v = _mm512_add_ps(_mm512_load_ps(c + i * 16), b);
        _mm256_storeu_si256((__m256i*)(y + i * ldy + n0), (__m256i)_mm512_cvtneps_pbh(v)); /* round to nearest even */
    }
}

/* y[M, N] = x[M, K] @ w^T (+ bias); wp: packed weights; N % 32 == 0, K % 32 == 0; any M >= 0. */
void parrot_linear_amx(const uint16_t* x, int64_t ldx, const uint16_t* wp, const uint16_t* bias, uint16_t* y,
                      int64_t M, int64_t N, int64_t K, int num_threads) {
    const int64_t kblocks = K / 32, nblocks = N / 32, tile = 512; /* bf16 per 1 KB tile */
    if (M <= 0 || N <= 0) return;
    const int64_t rows = M < 16 ? M : 16, mblocks = (M + 15) / 16;
    const int64_t panel_blocks = AMX_PANEL / 16, panels = (mblocks + panel_blocks - 1) / panel_blocks;
    const int64_t items = panels * nblocks;
    const int threads = items < num_threads ? (int)items : num_threads;
#pragma omp parallel num_threads(threads)
    {
        amx_configure(rows);
        float c[4][256] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; item++) {
            const int64_t pn = item / nblocks, nb = item % nblocks;
            const int64_t mb_end = (pn + 1) * panel_blocks < mblocks ? (pn + 1) * panel_blocks : mblocks;
            const uint16_t* b0 = wp + (2 * nb) * kblocks * tile;
            const uint16_t* b1 = b0 + kblocks * tile;
            for (int64_t mb = pn * panel_blocks; mb < mb_end; mb += 2) {
                const int two = mb + 1 < mb_end;
                /* The block's first row: a partial last block is the window of the last 16 rows. */
                const int64_t m0 = mb * 16 + rows <= M ? mb * 16 : M - rows;
                const int64_t m1 = (mb + 1) * 16 + rows <= M ? (mb + 1) * 16 : M - rows;
                const uint16_t* a0 = x + m0 * ldx;
                const uint16_t* a1 = x + m1 * ldx;
                _tile_zero(0);
                _tile_zero(1);
                if (two) {
                    _tile_zero(2);
                    _tile_zero(3);
                }
                for (int64_t kb = 0; kb < kblocks; kb++) {
                    _tile_loadd(4, a0 + kb * 32, ldx * 2);
                    _tile_loadd(6, b0 + kb * tile, 64);
                    _tile_loadd(7, b1 + kb * tile, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    if (two) {
                        _tile_loadd(5, a1 + kb * 32, ldx * 2);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
                _tile_stored(0, c[0], 64);
                _tile_stored(1, c[1], 64);
                store_tile_rows(c[0], mb * 16 - m0, rows, bias, y + m0 * N, N, nb * 32);
                store_tile_rows(c[1], mb * 16 - m0, rows, bias, y + m0 * N, N, nb * 32 + 16);
                if (two) {
                    _tile_stored(2, c[2], 64);
                    _tile_stored(3, c[3], 64);
                    store_tile_rows(c[2], (mb + 1) * 16 - m1, rows, bias, y + m1 * N, N, nb * 32);
                    store_tile_rows(c[3], (mb + 1) * 16 - m1, rows, bias, y + m1 * N, N, nb * 32 + 16);
                }
            }
        }
        _tile_release();
    }
}

/* ---- Attention over the paged KV cache: shared helpers ---------------------------------------
 * Every kernel below reads K/V in place from the paged cache through block tables (no gather
 * copy); scores and softmax in fp32. */
#define MAX_GROUP 16
#define MAX_HEAD_DIM 256

/* Sixteen horizontal sums at once: the tree leaves the sum of v[j] in lane REDUCE_ORDER[j]. That
 * map is a 4x4 transpose, its own inverse, so a caller that puts token i's products at
 * v[REDUCE_ORDER[i]] gets token i's sum in lane i. 15 adds and 30 shuffles for 16 sums, against
 * 16 separate reductions of ~8 dependent steps each. */
static const int64_t REDUCE_ORDER[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

static inline __m512 reduce16(const __m512 v[16]) {
    __m512 b[8], c[4], d[2];
    for (int j = 0; j < 8; j++) /* 256-bit halves: [v2j partials | v2j+1 partials] */
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
    for (int j = 0; j < 4; j++) /* 128-bit lanes: one vector's 4 partials each */
        c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; j++) /* pairs of floats */
        d[j] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(c[2 * j]), _mm512_castps_pd(c[2 * j + 1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(c[2 * j]), _mm512_castps_pd(c[2 * j + 1]))));
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

/* The cache rows of the next n (<= 64) tokens of one KV head, walking a block table without
 * divisions: (*blk, *off) is the next token's table index and slot, advanced past the n tokens. */
static inline void next_rows(const uint16_t* cache, const int64_t* table, int64_t* blk, int64_t* off, int64_t n,
                             int64_t bs, int64_t row, int64_t head_offset, const uint16_t** out) {
    for (int64_t i = 0; i < n; i++) {
        out[i] = cache + (table[*blk] * bs + *off) * row + head_offset;
        if (++*off == bs) *off = 0, ++*blk;
    }
}

static inline __mmask16 live_lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* s[0:L] = e^(s - m) in place (the padding lanes up to a multiple of 16 become 0); returns the sum. */
static inline float exp_sum(float* s, int64_t L, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < L; t += 16) {
        __m512 e = _mm512_maskz_mov_ps(live_lanes(L - t), vf_exp(_mm512_sub_ps(_mm512_load_ps(s + t), vm)));
        _mm512_store_ps(s + t, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* One query's scaled scores against up to 16 K rows (lane i: token i), stored at `dst`; folds the
 * live lanes into the running max and NaN mask (a NaN score makes the row NaN, as in SDPA). */
static inline __attribute__((always_inline)) void score16(const __m512bh* qv, const uint16_t* const* krow, int64_t n,
                                                          float scale, const int64_t D, float* dst, __m512* vmax,
                                                          __mmask16* nan) {
    __m512 dots[16];
    for (int64_t j = 0; j < 16; j++) {
        const int64_t i = REDUCE_ORDER[j]; /* dots[j] holds token i: see reduce16 */
        __m512 acc = _mm512_setzero_ps();
        if (i < n)
            for (int64_t c = 0; c < D / 32; c++)
                acc = _mm512_dpbf16_ps(acc, qv[c], (__m512bh)_mm512_loadu_si512(krow[i] + c * 32));
        dots[j] = acc;
    }
    const __m512 sv = _mm512_mul_ps(reduce16(dots), _mm512_set1_ps(scale));
    const __mmask16 live = live_lanes(n);
    _mm512_store_ps(dst, sv);
    *nan |= _mm512_mask_cmp_ps_mask(live, sv, sv, _CMP_UNORD_Q);
    *vmax = _mm512_mask_max_ps(*vmax, live, *vmax, sv);
}

/* CALL(G, D) with the head shape a compile-time constant for the common models (SmolLM2 3 x 64;
 * LLaMA-2/Vicuna 1 x 128; LLaMA-3/Mistral 4 x 128; 1 x 64), so loops unroll and accumulators stay
 * in registers; any other shape runs the same code with runtime bounds. */
#define WITH_HEAD_SHAPE(G, D, CALL)                                                                      \
    ((G) == 3 && (D) == 64    ? CALL(3, 64)                                                              \
     : (G) == 1 && (D) == 128 ? CALL(1, 128)                                                             \
     : (G) == 4 && (D) == 128 ? CALL(4, 128)                                                             \
     : (G) == 1 && (D) == 64  ? CALL(1, 64)                                                              \
                              : CALL(G, D))

/* ---- Paged attention in key tiles: decode and prefill rows alike ------------------------------
 * A row (one query head of one token at position `last`) attends to keys 0 .. last of its
 * sequence, read from the paged cache. Keys go in tiles of PA_KT tokens aligned to absolute
 * positions (0, 64, ...); per tile, each row's scores (vdpbf16ps, fp32), an online softmax (running
 * max and sum, fp32; the weights e^(s - m) rounded to bf16 as torch's bf16 flash path does) and the
 * weighted V (vdpbf16ps). A tile of K and V is first repacked for one KV head into the
 * pair-interleaved layouts vdpbf16ps reads (K: per 16 keys and pair of dims, the 16 keys' pairs in
 * lanes; V: per pair of keys, each dim's two values side by side), keys past the valid ones zero.
 * Every step of a row's arithmetic depends only on its query, its keys and the tile grid: not on
 * the rows beside it (a decode row's G heads, a prefill chunk's tokens) and not on where a chunk
 * began (masked keys add exact zeros). So a token's attention has the same bits as a decode row,
 * in a prefill chunk of any size, in any batch: what the batch-invariant mode needs, at 1.2-1.9x
 * the speed of per-row dot products for prefill (keys shared by all the rows of a block). */
#define PA_KT 64 /* keys per tile: 4 score vectors */
#define PA_QB 32 /* prefill: query tokens per work item */
#define PA_RB 6  /* rows per register block of the score tile */

/* 16 vectors of 16 dwords transposed in place (r[i] lane j <-> r[j] lane i). */
static inline __attribute__((always_inline)) void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2)
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    for (int i = 0; i < 16; i += 4) { /* r[4g + k] lane L: column 4L + k of rows 4g .. 4g+3 */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]), r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]), r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int k = 0; k < 4; k++) { /* a 4 x 4 transpose of 128-bit lanes */
        const __m512i u0 = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x44), u1 = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xEE);
        const __m512i u2 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x44);
        const __m512i u3 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xEE);
        t[k] = _mm512_shuffle_i32x4(u0, u2, 0x88), t[4 + k] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        t[8 + k] = _mm512_shuffle_i32x4(u1, u3, 0x88), t[12 + k] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* 16 dot products scaled, the lanes past the first n (the row's visible keys) -inf. */
static inline __m512 masked_scores(__m512 dots, int64_t n, float scale) {
    return _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), n <= 0 ? 0 : live_lanes(n), dots, _mm512_set1_ps(scale));
}

/* V rows a, b (32 dims from `d`) interleaved per dim: the two vectors vdpbf16ps reads for dims
 * d .. d+15 and d+16 .. d+31 (b may be NULL: a zero row). */
static inline __attribute__((always_inline)) void interleave_v(const uint16_t* a, const uint16_t* b, __m512i* out) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i va = a ? _mm512_loadu_si512(a) : _mm512_setzero_si512();
    const __m512i vb = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
    out[0] = _mm512_permutex2var_epi16(va, lo, vb);
    out[1] = _mm512_permutex2var_epi16(va, _mm512_add_epi16(lo, _mm512_set1_epi16(16)), vb);
}

/* One tile of KV head h: keys t0 .. t0+63 of a sequence (block table `table`), the first n valid
 * (the rest zero), into kp [4 groups of 16 keys][D/2 pairs][16 keys][2] (kp NULL: V only) and vp
 * [32 key pairs][D][2]. */
static inline __attribute__((always_inline)) void pack_tile(const uint16_t* kc, const uint16_t* vc,
                                                            const int64_t* table, int64_t t0, int64_t n, int64_t bs,
                                                            int64_t row, int64_t h, uint16_t* kp, uint16_t* vp,
                                                            const int64_t D) {
    const uint16_t* krow[PA_KT];
    const uint16_t* vrow[PA_KT];
    int64_t blk = t0 / bs, off = t0 % bs;
    next_rows(kc, table, &blk, &off, kp != NULL ? n : 0, bs, row, h * D, krow);
    blk = t0 / bs, off = t0 % bs;
    next_rows(vc, table, &blk, &off, n, bs, row, h * D, vrow);
    for (int64_t j = 0; j < 4 && kp != NULL; j++)
        for (int64_t c = 0; c < D / 32; c++) { /* pairs 16c .. 16c+15 of keys 16j .. 16j+15 */
            __m512i r[16];
            for (int64_t i = 0; i < 16; i++)
                r[i] = 16 * j + i < n ? _mm512_loadu_si512(krow[16 * j + i] + 32 * c) : _mm512_setzero_si512();
            transpose16(r);
            for (int64_t p = 0; p < 16; p++) _mm512_storeu_si512(kp + (j * (D / 2) + 16 * c + p) * 32, r[p]);
        }
    for (int64_t k = 0; k < PA_KT; k += 2) /* keys k, k+1 interleaved per dim */
        for (int64_t c = 0; c < D / 32; c++) {
            __m512i v[2];
            interleave_v(k < n ? vrow[k] + 32 * c : NULL, k + 1 < n ? vrow[k + 1] + 32 * c : NULL, v);
            _mm512_storeu_si512(vp + (k / 2 * D + 32 * c) * 2, v[0]);
            _mm512_storeu_si512(vp + (k / 2 * D + 32 * c + 16) * 2, v[1]);
        }
}

/* Scores of NR <= PA_RB rows against one packed K tile: s[r][0:64], scaled; keys past a row's
 * last visible one are -inf. vis[r]: the row's visible keys in this tile (<= 0: none). */
static inline __attribute__((always_inline)) void score_tile(const uint16_t* const* qrow, const int64_t* vis,
                                                             const uint16_t* kp, float scale, float* s,
                                                             const int64_t NR, const int64_t D) {
    __m512 acc[PA_RB][4];
    for (int64_t r = 0; r < NR; r++)
        for (int64_t j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < D / 2; p++) {
        __m512bh kv[4];
        for (int64_t j = 0; j < 4; j++) kv[j] = (__m512bh)_mm512_loadu_si512(kp + (j * (D / 2) + p) * 32);
        for (int64_t r = 0; r < NR; r++) {
            const __m512bh qb = (__m512bh)_mm512_set1_epi32(*(const int32_t*)(qrow[r] + 2 * p));
            for (int64_t j = 0; j < 4; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], kv[j], qb);
        }
    }
    for (int64_t r = 0; r < NR; r++)
        for (int64_t j = 0; j < 4; j++) _mm512_storeu_ps(s + r * PA_KT + 16 * j, masked_scores(acc[r][j], vis[r] - 16 * j, scale));
}

/* o[r] = o[r] * alpha[r] + sum over the tile's keys of w[r][k] v[k], for NR rows. */
static inline __attribute__((always_inline)) void weighted_v(float* o, const float* alpha, const uint16_t* w,
                                                             const uint16_t* vp, const int64_t NR, const int64_t D) {
    __m512 acc[PA_RB][MAX_HEAD_DIM / 16];
    for (int64_t r = 0; r < NR; r++)
        for (int64_t c = 0; c < D / 16; c++)
            acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * D + c * 16), _mm512_set1_ps(alpha[r]));
    for (int64_t k = 0; k < PA_KT / 2; k++)
        for (int64_t r = 0; r < NR; r++) {
            const __m512bh wb = (__m512bh)_mm512_set1_epi32(*(const int32_t*)(w + r * PA_KT + 2 * k));
            for (int64_t c = 0; c < D / 16; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)_mm512_loadu_si512(vp + (k * D + c * 16) * 2), wb);
        }
    for (int64_t r = 0; r < NR; r++)
        for (int64_t c = 0; c < D / 16; c++) _mm512_storeu_ps(o + r * D + c * 16, acc[r][c]);
}

/* The running state of NR rows: max m, sum l, the last tile's rescale alpha, NaN seen, output o [NR][D]. */
typedef struct {
    float *m, *l, *alpha, *o, *s;
    uint16_t* w;
    int* nan;
} RowState;

/* The online softmax of one tile for NR rows whose scores are in st.s: new max, the rescale
 * factor alpha, the weights e^(s - m) (bf16, masked keys exactly 0) in st.w, the running sum. */
static inline void softmax_tile(RowState st, int64_t NR) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t r = 0; r < NR; r++) {
        const float* sr = st.s + r * PA_KT;
        __m512 mx = ninf;
        __mmask16 nan = 0;
        for (int64_t j = 0; j < 4; j++) {
            const __m512 v = _mm512_loadu_ps(sr + 16 * j);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            mx = _mm512_max_ps(mx, v);
        }
        st.nan[r] |= nan != 0;
        const float mt = _mm512_reduce_max_ps(mx), mn = mt > st.m[r] ? mt : st.m[r];
        st.alpha[r] = mn == -INFINITY ? 1.0f : _mm512_cvtss_f32(vf_exp(_mm512_set1_ps(st.m[r] - mn)));
        st.m[r] = mn;
        const __m512 vm = _mm512_set1_ps(mn);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < 4; j++) {
            const __m512 v = _mm512_loadu_ps(sr + 16 * j);
            const __mmask16 live = _mm512_cmp_ps_mask(v, ninf, _CMP_NEQ_UQ);
            const __m512 e = _mm512_maskz_mov_ps(live, vf_exp(_mm512_sub_ps(v, vm)));
            _mm256_storeu_si256((__m256i*)(st.w + r * PA_KT + 16 * j), (__m256i)_mm512_cvtneps_pbh(e));
            sum = _mm512_add_ps(sum, e);
        }
        st.l[r] = st.l[r] * st.alpha[r] + _mm512_reduce_add_ps(sum);
    }
}

/* One packed tile (prefill) for all NR rows: scores, the online softmax, the weighted V. */
static inline __attribute__((always_inline)) void attend_tile(const uint16_t* const* qrow, const int64_t* last,
                                                              int64_t NR, int64_t t0, const uint16_t* kp,
                                                              const uint16_t* vp, float scale, RowState st,
                                                              const int64_t D) {
    const int64_t RB = D <= 64 ? PA_RB : D <= 128 ? 3 : 1; /* rows per register block of weighted_v */
    for (int64_t r0 = 0; r0 < NR; r0 += PA_RB) {
        int64_t vis[PA_RB];
        const int64_t nr = NR - r0 < PA_RB ? NR - r0 : PA_RB;
        for (int64_t r = 0; r < nr; r++) vis[r] = last[r0 + r] + 1 - t0;
        float* s = st.s + r0 * PA_KT;
        switch (nr) { /* a constant row count: the accumulators stay in registers */
        case 6: score_tile(qrow + r0, vis, kp, scale, s, 6, D); break;
        case 5: score_tile(qrow + r0, vis, kp, scale, s, 5, D); break;
        case 4: score_tile(qrow + r0, vis, kp, scale, s, 4, D); break;
        case 3: score_tile(qrow + r0, vis, kp, scale, s, 3, D); break;
        case 2: score_tile(qrow + r0, vis, kp, scale, s, 2, D); break;
        default: score_tile(qrow + r0, vis, kp, scale, s, 1, D);
        }
    }
    softmax_tile(st, NR);
    for (int64_t r0 = 0; r0 < NR; r0 += RB) {
        const int64_t nr = NR - r0 < RB ? NR - r0 : RB;
        float* o = st.o + r0 * D;
        if (nr == RB) weighted_v(o, st.alpha + r0, st.w + r0 * PA_KT, vp, RB, D); /* unrolled */
        else for (int64_t r = 0; r < nr; r++) weighted_v(o + r * D, st.alpha + r0 + r, st.w + (r0 + r) * PA_KT, vp, 1, D);
    }
}

/* One tile read in place (decode): the G rows of one token share every key, all n valid, so no
 * packed copy: each 16 keys' pairs are transposed in registers and used at once, and V rows are
 * interleaved as they are read. Per accumulator the operations and their order are attend_tile's
 * (so are the bits); keys past n contribute nothing there (zero weights on zero rows) and are
 * skipped here. */
static inline __attribute__((always_inline)) void attend_tile_direct(const uint16_t* const* qrow,
                                                                     const uint16_t* const* krow,
                                                                     const uint16_t* const* vrow, int64_t n,
                                                                     float scale, RowState st, const int64_t G,
                                                                     const int64_t D) {
    for (int64_t j = 0; j < 4; j++) {
        __m512 acc[MAX_GROUP];
        for (int64_t g = 0; g < G; g++) acc[g] = _mm512_setzero_ps();
        for (int64_t c = 0; c < D / 32 && 16 * j < n; c++) { /* pairs 16c .. 16c+15 of keys 16j .. */
            __m512i r[16];
            for (int64_t i = 0; i < 16; i++)
                r[i] = 16 * j + i < n ? _mm512_loadu_si512(krow[16 * j + i] + 32 * c) : _mm512_setzero_si512();
            transpose16(r);
            for (int64_t p = 0; p < 16; p++)
                for (int64_t g = 0; g < G; g++) {
                    const __m512bh qb = (__m512bh)_mm512_set1_epi32(*(const int32_t*)(qrow[g] + 2 * (16 * c + p)));
                    acc[g] = _mm512_dpbf16_ps(acc[g], (__m512bh)r[p], qb);
                }
        }
        for (int64_t g = 0; g < G; g++) _mm512_storeu_ps(st.s + g * PA_KT + 16 * j, masked_scores(acc[g], n - 16 * j, scale));
    }
    softmax_tile(st, G);
    const int64_t RB = D <= 64 ? PA_RB : D <= 128 ? 3 : 1;
    for (int64_t g0 = 0; g0 < G; g0 += RB) {
        const int64_t nr = G - g0 < RB ? G - g0 : RB;
        __m512 acc[PA_RB][MAX_HEAD_DIM / 16];
        for (int64_t r = 0; r < nr; r++)
            for (int64_t c = 0; c < D / 16; c++)
                acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(st.o + (g0 + r) * D + c * 16), _mm512_set1_ps(st.alpha[g0 + r]));
        for (int64_t k = 0; 2 * k < n; k++) {
            __m512i v[MAX_HEAD_DIM / 16];
            for (int64_t c = 0; c < D / 32; c++)
                interleave_v(vrow[2 * k] + 32 * c, 2 * k + 1 < n ? vrow[2 * k + 1] + 32 * c : NULL, v + 2 * c);
            for (int64_t r = 0; r < nr; r++) {
                const __m512bh wb = (__m512bh)_mm512_set1_epi32(*(const int32_t*)(st.w + (g0 + r) * PA_KT + 2 * k));
                for (int64_t c = 0; c < D / 16; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)v[c], wb);
            }
        }
        for (int64_t r = 0; r < nr; r++)
            for (int64_t c = 0; c < D / 16; c++) _mm512_storeu_ps(st.o + (g0 + r) * D + c * 16, acc[r][c]);
    }
}

/* ---- The same tiles on AMX ---------------------------------------------------------------------
 * Where AMX runs (parrot_attention_amx), a prefill chunk attends in blocks of 16 rows with the rows
 * in vector lanes: scores come out of tdpbf16ps transposed (S^T = K Q^T: a key per tile row, K
 * packed per tile as plain rows), so the online softmax of 16 rows is
 * plain vector arithmetic over 64 key vectors (no horizontal reductions, one e^x for the 16 rows'
 * rescale), and the output is kept transposed too (O^T += V^T W^T, V packed per tile as dims x
 * keys). Per tile and row: the scores summed over D in 32-dim steps, scaled, keys past the row's
 * last -inf; the running max, the rescale e^(m - m'), the weights e^(s - m') (rounded to bf16 for
 * the V sum) and the running sum, in fp32, in one order; O^T * rescale, then the weighted V added in
 * two 32-key steps. A row's arithmetic depends on its query, its keys and the tile grid only (the
 * lanes never mix; masked keys add exact zeros; padding rows are never read back). Decode rows take
 * attend_rows_amx below: the same operations lane for lane with the rows as tile rows, so a decode
 * row and the same token in a prefill chunk of any size have the same bits, as on the AVX512 path,
 * which rounds differently (one engine, one path). */
typedef struct {
    uint16_t* qt;  /* the rows' queries as tdpbf16ps's second operand: [D/32][16 dim pairs][16 rows][2] */
    float* ot;     /* the output, transposed: [D][16 rows] */
    float* m;      /* [16] running max */
    float* l;      /* [16] running sum */
    int32_t* last; /* [16] each row's last visible key (-1: a padding row) */
    __mmask16* nan;
} AmxBlock;

/* nr <= 16 query rows of D dims as tdpbf16ps's second operand, row i in lane i (the rest zero):
 * qt [D/32][16 dim pairs][16 lanes][2]. */
static inline void pack_q_lanes(const uint16_t* const* qrow, int64_t nr, uint16_t* qt, const int64_t D) {
    for (int64_t c = 0; c < D / 32; c++) {
        __m512i r[16];
        for (int64_t i = 0; i < 16; i++) r[i] = i < nr ? _mm512_loadu_si512(qrow[i] + 32 * c) : _mm512_setzero_si512();
        transpose16(r);
        for (int64_t p = 0; p < 16; p++) _mm512_store_si512(qt + (c * 16 + p) * 32, r[p]);
    }
}

/* A block's rows (nr <= 16 query rows of D dims) into qt; the state reset. */
static inline void amx_block_start(AmxBlock b, const uint16_t* const* qrow, const int64_t* last, int64_t nr,
                                   const int64_t D) {
    pack_q_lanes(qrow, nr, b.qt, D);
    for (int64_t i = 0; i < 16; i++) b.last[i] = i < nr ? (int32_t)last[i] : -1;
    _mm512_store_ps(b.m, _mm512_set1_ps(-INFINITY));
    _mm512_store_ps(b.l, _mm512_setzero_ps());
    memset(b.ot, 0, (size_t)(D * 16 * 4));
    *b.nan = 0;
}

/* The block's rows o / l, rounded to bf16, at dst[r] for r < nr (NaN where a score was). */
static inline void amx_block_finish(AmxBlock b, uint16_t* const* dst, int64_t nr, const int64_t D) {
    float inv[16];
    for (int64_t i = 0; i < 16; i++) inv[i] = (*b.nan >> i) & 1 ? NAN : 1.0f / b.l[i];
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
        __m512i r[16];
        for (int64_t i = 0; i < 16; i++) r[i] = _mm512_load_si512(b.ot + (d0 + i) * 16);
        transpose16(r);
        for (int64_t i = 0; i < nr; i++)
            _mm256_storeu_si256((__m256i*)(dst[i] + d0),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_castsi512_ps(r[i]), _mm512_set1_ps(inv[i]))));
    }
}

#define AMX_PV(T, A)                                                           \
    if (nt > T) {                                                              \
        _tile_loadd(A, vt + (d0 + 16 * T) * PA_KT + 32 * kb, PA_KT * 2);       \
        _tile_dpbf16ps(T, A, 6);                                               \
    }

/* The scores of one tile, transposed: st [64 keys][16 lanes] = K Q^T over D in 32-dim steps, in
 * that order, for the first `groups` groups of 16 keys (kg[j]: their K rows, kstride apart; later
 * groups are zero); qt from pack_q_lanes. The one place both AMX paths make scores. */
static inline __attribute__((always_inline)) void amx_scores(const uint16_t* qt, const uint16_t* const* kg,
                                                             int64_t kstride, int64_t groups, float* st,
                                                             const int64_t D) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < D / 32; c++) { /* tiles 0-3 keys 16j ..; 4/5 K; 6 Q^T */
        _tile_loadd(6, qt + c * 16 * 32, 64);
        _tile_loadd(4, kg[0] + 32 * c, kstride * 2);
        _tile_dpbf16ps(0, 4, 6);
        if (groups > 1) {
            _tile_loadd(5, kg[1] + 32 * c, kstride * 2);
            _tile_dpbf16ps(1, 5, 6);
        }
        if (groups > 2) {
            _tile_loadd(4, kg[2] + 32 * c, kstride * 2);
            _tile_dpbf16ps(2, 4, 6);
        }
        if (groups > 3) {
            _tile_loadd(5, kg[3] + 32 * c, kstride * 2);
            _tile_dpbf16ps(3, 5, 6);
        }
    }
    _tile_stored(0, st, 64);
    _tile_stored(1, st + 256, 64);
    _tile_stored(2, st + 512, 64);
    _tile_stored(3, st + 768, 64);
}

/* One tile of keys t0 .. t0+63 for a block: kg[j], the 16 K rows of keys 16j .. 16j+15, kstride
 * apart (keys past the sequence zero rows); vt: the tile's V as [D][64 keys]. */
static inline __attribute__((always_inline)) void attend_block_amx(AmxBlock b, const uint16_t* const* kg,
                                                                   int64_t kstride, int64_t t0, const uint16_t* vt,
                                                                   float scale, const int64_t D) {
    _Alignas(64) float st[PA_KT * 16];
    _Alignas(64) uint16_t wt[PA_KT * 16]; /* [32 key pairs][16 rows][2]: the weights as the second operand */
    amx_scores(b.qt, kg, kstride, 4, st, D);
    const __m512i lastv = _mm512_load_si512(b.last);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    __m512 mx = ninf;
    __mmask16 nan = 0;
    for (int64_t k = 0; k < PA_KT; k++) {
        const __mmask16 vis = _mm512_cmpge_epi32_mask(lastv, _mm512_set1_epi32((int32_t)(t0 + k)));
        const __m512 sv = _mm512_mask_mul_ps(ninf, vis, _mm512_load_ps(st + 16 * k), vscale);
        _mm512_store_ps(st + 16 * k, sv);
        nan |= _mm512_mask_cmp_ps_mask(vis, sv, sv, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, sv);
    }
    *b.nan |= nan;
    const __m512 m = _mm512_load_ps(b.m), mn = _mm512_max_ps(m, mx);
    const __m512 alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), _mm512_cmp_ps_mask(mn, ninf, _CMP_NEQ_UQ),
                                            vf_exp(_mm512_sub_ps(m, mn)));
    _mm512_store_ps(b.m, mn);
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 acc[16]; /* the sum's order (attend_rows_amx's too): acc[i] = keys i, 16+i, 32+i, 48+i; then a tree */
    for (int64_t k = 0; k < PA_KT; k += 2) {
        const __m512 s0 = _mm512_load_ps(st + 16 * k), s1 = _mm512_load_ps(st + 16 * (k + 1));
        const __m512 e0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s0, ninf, _CMP_NEQ_UQ), vf_exp(_mm512_sub_ps(s0, mn)));
        const __m512 e1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s1, ninf, _CMP_NEQ_UQ), vf_exp(_mm512_sub_ps(s1, mn)));
        acc[k % 16] = k < 16 ? e0 : _mm512_add_ps(acc[k % 16], e0);
        acc[k % 16 + 1] = k < 16 ? e1 : _mm512_add_ps(acc[k % 16 + 1], e1);
        _mm512_store_si512(wt + k * 16, _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(e1, e0)));
    }
    for (int64_t w = 8; w >= 1; w /= 2)
        for (int64_t i = 0; i < w; i++) acc[i] = _mm512_add_ps(acc[i], acc[i + w]);
    _mm512_store_ps(b.l, _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(b.l), alpha), acc[0]));
    if (_mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ))
        for (int64_t d = 0; d < D; d++) _mm512_store_ps(b.ot + 16 * d, _mm512_mul_ps(_mm512_load_ps(b.ot + 16 * d), alpha));
    for (int64_t d0 = 0; d0 < D; d0 += 64) { /* O^T: tiles 0-3 dims d0 + 16t .., 16 rows; 4/5 V^T; 6 W^T */
        const int64_t nt = (D - d0) / 16 < 4 ? (D - d0) / 16 : 4;
        _tile_loadd(0, b.ot + d0 * 16, 64);
        if (nt > 1) _tile_loadd(1, b.ot + (d0 + 16) * 16, 64);
        if (nt > 2) _tile_loadd(2, b.ot + (d0 + 32) * 16, 64);
        if (nt > 3) _tile_loadd(3, b.ot + (d0 + 48) * 16, 64);
        for (int64_t kb = 0; kb < 2; kb++) {
            _tile_loadd(6, wt + kb * 16 * 32, 64);
            AMX_PV(0, 4)
            AMX_PV(1, 5)
            AMX_PV(2, 4)
            AMX_PV(3, 5)
        }
        _tile_stored(0, b.ot + d0 * 16, 64);
        if (nt > 1) _tile_stored(1, b.ot + (d0 + 16) * 16, 64);
        if (nt > 2) _tile_stored(2, b.ot + (d0 + 32) * 16, 64);
        if (nt > 3) _tile_stored(3, b.ot + (d0 + 48) * 16, 64);
    }
}

/* The same arithmetic for a decode work item (a token's G query heads share every key): the scores
 * as attend_block_amx makes them (S^T = K Q^T, K rows read in place or copied, the G rows in lanes
 * of qt), then each row's 64 scores gathered into key vectors, so its max, rescale, weights and sum
 * cost G rows, not 16, lane for lane the operations of attend_block_amx (its sum's order: keys i,
 * 16+i, 32+i, 48+i, then the tree over i); the weighted V as O += W V over the AVX512 path's
 * interleaved V (pack_tile; tdpbf16ps sums a pair alike whichever operand holds which value).
 * kg[j]: K rows of keys 16j .. (used while 16j < n), kstride apart; w [16][64] (rows past G zero),
 * o [16][D] (rows past G unused). */
static inline __attribute__((always_inline)) void attend_rows_amx(const uint16_t* qt, const uint16_t* const* kg,
                                                                  int64_t kstride, int64_t G, int64_t n,
                                                                  const uint16_t* vp, float scale, float* o,
                                                                  uint16_t* w, float* m, float* l, int* nan,
                                                                  const int64_t D) {
    _Alignas(64) float st[PA_KT * 16];
    amx_scores(qt, kg, kstride, (n + 15) / 16, st, D);
    const __m512i column = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t g = 0; g < G; g++) {
        __m512 sv[4], mx = ninf;
        __mmask16 bad = 0;
        for (int64_t j = 0; j < 4; j++) {
            sv[j] = masked_scores(_mm512_i32gather_ps(column, st + 256 * j + g, 4), n - 16 * j, scale);
            bad |= _mm512_mask_cmp_ps_mask(n > 16 * j ? live_lanes(n - 16 * j) : 0, sv[j], sv[j], _CMP_UNORD_Q);
            mx = _mm512_max_ps(mx, sv[j]);
        }
        nan[g] |= bad != 0;
        const __m512 mn = _mm512_max_ps(_mm512_set1_ps(m[g]), _mm512_set1_ps(_mm512_reduce_max_ps(mx)));
        const __m512 alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), _mm512_cmp_ps_mask(mn, ninf, _CMP_NEQ_UQ),
                                                vf_exp(_mm512_sub_ps(_mm512_set1_ps(m[g]), mn)));
        m[g] = _mm512_cvtss_f32(mn);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t j = 0; j < 4; j++) {
            const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(sv[j], ninf, _CMP_NEQ_UQ), vf_exp(_mm512_sub_ps(sv[j], mn)));
            acc = j == 0 ? e : _mm512_add_ps(acc, e);
            _mm256_store_si256((__m256i*)(w + g * PA_KT + 16 * j), (__m256i)_mm512_cvtneps_pbh(e));
        }
        __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
        __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
        __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
        __m128 h1 = _mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1));
        const float a = _mm512_cvtss_f32(alpha);
        l[g] = l[g] * a + _mm_cvtss_f32(h1);
        if (a != 1.0f)
            for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(o + g * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + g * D + d), alpha));
    }
    for (int64_t d0 = 0; d0 < D; d0 += 64) { /* O: tiles 0-3 dims d0 + 16t ..; 4 W; 6/7 V */
        const int64_t nt = (D - d0) / 16 < 4 ? (D - d0) / 16 : 4;
        _tile_loadd(0, o + d0, D * 4);
        if (nt > 1) _tile_loadd(1, o + d0 + 16, D * 4);
        if (nt > 2) _tile_loadd(2, o + d0 + 32, D * 4);
        if (nt > 3) _tile_loadd(3, o + d0 + 48, D * 4);
        for (int64_t kb = 0; kb < 2 && 32 * kb < n; kb++) {
            _tile_loadd(4, w + 32 * kb, PA_KT * 2);
            const uint16_t* v = vp + (16 * kb * D + d0) * 2;
            _tile_loadd(6, v, D * 4);
            _tile_dpbf16ps(0, 4, 6);
            if (nt > 1) {
                _tile_loadd(7, v + 32, D * 4);
                _tile_dpbf16ps(1, 4, 7);
            }
            if (nt > 2) {
                _tile_loadd(6, v + 64, D * 4);
                _tile_dpbf16ps(2, 4, 6);
            }
            if (nt > 3) {
                _tile_loadd(7, v + 96, D * 4);
                _tile_dpbf16ps(3, 4, 7);
            }
        }
        _tile_stored(0, o + d0, D * 4);
        if (nt > 1) _tile_stored(1, o + d0 + 16, D * 4);
        if (nt > 2) _tile_stored(2, o + d0 + 32, D * 4);
        if (nt > 3) _tile_stored(3, o + d0 + 48, D * 4);
    }
}

/* Keys t0 .. t0+63 of KV head h as plain rows kn [64][D] (the first n valid, the rest zero). */
static inline void copy_k_rows(const uint16_t* kc, const int64_t* table, int64_t t0, int64_t n, int64_t bs,
                               int64_t row, int64_t h, uint16_t* kn, const int64_t D) {
    const uint16_t* krow[PA_KT];
    int64_t blk = t0 / bs, off = t0 % bs;
    next_rows(kc, table, &blk, &off, n, bs, row, h * D, krow);
    for (int64_t i = 0; i < PA_KT; i++) {
        if (i < n) memcpy(kn + i * D, krow[i], (size_t)D * 2);
        else memset(kn + i * D, 0, (size_t)D * 2);
    }
}

/* One tile of KV head h for AMX: keys t0 .. t0+63 (the first n valid, the rest zero) as K rows
 * kn [64][D] and V transposed, vt [D][64]. */
static inline __attribute__((always_inline)) void pack_tile_amx(const uint16_t* kc, const uint16_t* vc,
                                                                const int64_t* table, int64_t t0, int64_t n,
                                                                int64_t bs, int64_t row, int64_t h, uint16_t* kn,
                                                                uint16_t* vt, const int64_t D) {
    const uint16_t* vrow[PA_KT];
    copy_k_rows(kc, table, t0, n, bs, row, h, kn, D);
    int64_t blk = t0 / bs, off = t0 % bs;
    next_rows(vc, table, &blk, &off, n, bs, row, h * D, vrow);
    for (int64_t half = 0; half < 2; half++) /* keys 32 half .. 32 half + 31 */
        for (int64_t c = 0; c < D / 32; c++) {
            __m512i lo[16], hi[16];
            for (int64_t i = 0; i < 16; i++) {
                const int64_t k = 32 * half + 2 * i;
                __m512i v[2];
                interleave_v(k < n ? vrow[k] + 32 * c : NULL, k + 1 < n ? vrow[k + 1] + 32 * c : NULL, v);
                lo[i] = v[0], hi[i] = v[1];
            }
            transpose16(lo);
            transpose16(hi);
            for (int64_t j = 0; j < 16; j++) {
                _mm512_storeu_si512(vt + (32 * c + j) * PA_KT + 32 * half, lo[j]);
                _mm512_storeu_si512(vt + (32 * c + 16 + j) * PA_KT + 32 * half, hi[j]);
            }
        }
}

static inline void start_rows(RowState st, int64_t NR, int64_t D) {
    for (int64_t r = 0; r < NR; r++) st.m[r] = -INFINITY, st.l[r] = 0.0f, st.nan[r] = 0;
    memset(st.o, 0, (size_t)(NR * D * 4));
}

/* Row r's output o / l, rounded to bf16, at dst[r] (NaN where a score was). */
static inline void finish_rows(RowState st, int64_t NR, uint16_t* const* dst, int64_t D) {
    for (int64_t r = 0; r < NR; r++) {
        const __m512 inv = _mm512_set1_ps(st.nan[r] ? NAN : 1.0f / st.l[r]);
        for (int64_t c = 0; c < D / 16; c++)
            _mm256_storeu_si256((__m256i*)(dst[r] + c * 16),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(st.o + r * D + c * 16), inv)));
    }
}

/* One decode work item (sequence b, KV head h): its G query heads are the rows; each tile is read
 * in place once for all G. */
static inline __attribute__((always_inline)) void decode_task(
    const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc, const int64_t* tables,
    int64_t max_blocks, const int64_t* lens, uint16_t* out, int64_t task, int64_t Hkv, int64_t bs, float scale,
    const int64_t G, const int64_t D) {
    const int64_t b = task / Hkv, h = task % Hkv, L = lens[b], Hq = Hkv * G, row = Hkv * D;
    const int64_t* table = tables + b * max_blocks;
    _Alignas(64) uint16_t w[MAX_GROUP * PA_KT];
    _Alignas(64) float s[MAX_GROUP * PA_KT], o[MAX_GROUP * MAX_HEAD_DIM];
    float m[MAX_GROUP], l[MAX_GROUP], alpha[MAX_GROUP];
    int nan[MAX_GROUP];
    const RowState st = {m, l, alpha, o, s, w, nan};
    const uint16_t* qrow[MAX_GROUP];
    uint16_t* dst[MAX_GROUP];
    for (int64_t g = 0; g < G; g++) qrow[g] = q + b * q_stride + (h * G + g) * D, dst[g] = out + b * Hq * D + (h * G + g) * D;
    start_rows(st, G, D);
    /* Software prefetch into L2 (decode reads the KV from memory, each byte once): this tile's V
     * rows while its scores are computed, the next tile's K rows while this tile is attended.
     * Into L1 instead, the prefetches saturate its miss buffers: 1.5-1.7x slower over 30 layers. */
    const uint16_t* krows[2][PA_KT];
    int64_t kblk = 0, koff = 0, vblk = 0, voff = 0, cur = 0;
    next_rows(kc, table, &kblk, &koff, L < PA_KT ? L : PA_KT, bs, row, h * D, krows[0]);
    for (int64_t t0 = 0; t0 < L; t0 += PA_KT) {
        const int64_t n = L - t0 < PA_KT ? L - t0 : PA_KT, after = L - t0 - n < PA_KT ? L - t0 - n : PA_KT;
        const uint16_t* const* krow = krows[cur];
        const uint16_t* vrow[PA_KT];
        next_rows(vc, table, &vblk, &voff, n, bs, row, h * D, vrow);
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < D * 2; c += 64) _mm_prefetch((const char*)vrow[i] + c, _MM_HINT_T1);
        cur ^= 1;
        next_rows(kc, table, &kblk, &koff, after, bs, row, h * D, krows[cur]);
        for (int64_t i = 0; i < after; i++)
            for (int64_t c = 0; c < D * 2; c += 64) _mm_prefetch((const char*)krows[cur][i] + c, _MM_HINT_T1);
        attend_tile_direct(qrow, krow, vrow, n, scale, st, G, D);
    }
    finish_rows(st, G, dst, D);
}

/* Software prefetch into L2 of the rows of keys t .. t+n-1 (n <= 64) of one head of `cache`. */
static inline void prefetch_rows(const uint16_t* cache, const int64_t* table, int64_t t, int64_t n, int64_t bs,
                                 int64_t row, int64_t head_offset, const int64_t D) {
    if (n <= 0) return;
    const uint16_t* rows[PA_KT];
    int64_t blk = t / bs, off = t % bs;
    next_rows(cache, table, &blk, &off, n, bs, row, head_offset, rows);
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < D * 2; c += 64) _mm_prefetch((const char*)rows[i] + c, _MM_HINT_T1);
}

/* One decode work item on AMX: its G rows in the lanes of Q^T; per tile, K read in place where 16
 * keys share a cache block (bs % 16 == 0; else copied), V interleaved (pack_tile), the next tile's K
 * and V rows prefetched into L2 meanwhile. */
static inline __attribute__((always_inline)) void decode_task_amx(
    const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc, const int64_t* tables,
    int64_t max_blocks, const int64_t* lens, uint16_t* out, int64_t task, int64_t Hkv, int64_t bs, float scale,
    const int64_t G, const int64_t D) {
    const int64_t b = task / Hkv, h = task % Hkv, L = lens[b], Hq = Hkv * G, row = Hkv * D;
    const int64_t* table = tables + b * max_blocks;
    _Alignas(64) uint16_t qt[16 * MAX_HEAD_DIM];
    _Alignas(64) uint16_t kn[PA_KT * MAX_HEAD_DIM];
    _Alignas(64) uint16_t vp[PA_KT * MAX_HEAD_DIM];
    _Alignas(64) uint16_t w[16 * PA_KT];
    _Alignas(64) float o[16 * MAX_HEAD_DIM];
    float m[MAX_GROUP], l[MAX_GROUP];
    int nan[MAX_GROUP];
    const RowState st = {m, l, NULL, o, NULL, NULL, nan}; /* (start_rows and finish_rows read these) */
    const uint16_t* qrow[MAX_GROUP];
    uint16_t* dst[MAX_GROUP];
    for (int64_t g = 0; g < G; g++) qrow[g] = q + b * q_stride + (h * G + g) * D, dst[g] = out + b * Hq * D + (h * G + g) * D;
    pack_q_lanes(qrow, G, qt, D);
    memset(w, 0, sizeof w);
    memset(o, 0, (size_t)(16 * D * 4));
    start_rows(st, G, D);
    const int in_place = bs % 16 == 0;
    for (int64_t t0 = 0; t0 < L; t0 += PA_KT) {
        const int64_t n = L - t0 < PA_KT ? L - t0 : PA_KT, after = L - t0 - n < PA_KT ? L - t0 - n : PA_KT;
        prefetch_rows(kc, table, t0 + n, after, bs, row, h * D, D);
        prefetch_rows(vc, table, t0 + n, after, bs, row, h * D, D);
        pack_tile(kc, vc, table, t0, n, bs, row, h, NULL, vp, D);
        const uint16_t* kg[4];
        if (!in_place) copy_k_rows(kc, table, t0, n, bs, row, h, kn, D);
        for (int64_t j = 0; j < 4; j++) {
            const int64_t t = t0 + 16 * j; /* keys t .. t+15 lie in one cache block when bs % 16 == 0 */
            kg[j] = !in_place ? kn + 16 * j * D : 16 * j < n ? kc + (table[t / bs] * bs + t % bs) * row + h * D : NULL;
        }
        attend_rows_amx(qt, kg, in_place ? row : D, G, n, vp, scale, o, w, m, l, nan, D);
    }
    finish_rows(st, G, dst, D);
}

/* q: [B, Hq, D] rows q_stride apart; kc/vc: one layer's cache [blocks, bs, Hkv, D]; tables:
 * [B, max_blocks]; lens: [B] (>= 1); out: [B, Hq * D]. D % 32 == 0, D <= 256, Hq / Hkv <= 16.
 * Returns 0 (work items that could not allocate: none allocate). */
int64_t parrot_paged_decode(const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc,
                            const int64_t* tables, int64_t max_blocks, const int64_t* lens, uint16_t* out, int64_t B,
                            int64_t Hq, int64_t Hkv, int64_t D, int64_t bs, float scale, int num_threads) {
    const int64_t G = Hq / Hkv;
    const int amx = amx_attention;
#pragma omp parallel num_threads(num_threads)
    {
        if (amx) amx_configure(16);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * Hkv; task++) {
#define DECODE_TASK(GG, DD) decode_task(q, q_stride, kc, vc, tables, max_blocks, lens, out, task, Hkv, bs, scale, GG, DD)
#define DECODE_TASK_AMX(GG, DD) \
    decode_task_amx(q, q_stride, kc, vc, tables, max_blocks, lens, out, task, Hkv, bs, scale, GG, DD)
            if (amx) WITH_HEAD_SHAPE(G, D, DECODE_TASK_AMX);
            else WITH_HEAD_SHAPE(G, D, DECODE_TASK);
#undef DECODE_TASK
#undef DECODE_TASK_AMX
        }
        if (amx) _tile_release();
    }
    return 0;
}

/* One prefill work item: KV head h, query tokens [i0, i1) of T at positions S-T .. S-1, over
 * tiles packed beforehand; 1 if its buffers could not be allocated. */
static inline __attribute__((always_inline)) int64_t prefill_task(
    const uint16_t* q, int64_t q_stride, const uint16_t* kpack, const uint16_t* vpack, int64_t T, int64_t S,
    uint16_t* out, int64_t h, int64_t i0, int64_t i1, int64_t Hkv, float scale, const int64_t G, const int64_t D) {
    const int64_t Hq = Hkv * G, past = S - T, NR = (i1 - i0) * G, tiles = (past + i1 + PA_KT - 1) / PA_KT;
    float* f = aligned_alloc(64, (size_t)(NR * (PA_KT + D + 3) * 4 + 64));
    uint16_t* w = aligned_alloc(64, (size_t)(NR * PA_KT * 2));
    int* nan = malloc((size_t)(NR * sizeof(int)));
    if (f == NULL || w == NULL || nan == NULL) {
        free(f), free(w), free(nan);
        return 1;
    }
    const RowState st = {f + NR * (PA_KT + D), f + NR * (PA_KT + D + 1), f + NR * (PA_KT + D + 2), f + NR * PA_KT,
                         f, w, nan};
    const uint16_t* qrow[PA_QB * MAX_GROUP];
    uint16_t* dst[PA_QB * MAX_GROUP];
    int64_t last[PA_QB * MAX_GROUP];
    for (int64_t r = 0; r < NR; r++) { /* rows token-major: token i0 + r / G, query head h * G + r % G */
        const int64_t i = i0 + r / G, g = r % G;
        qrow[r] = q + i * q_stride + (h * G + g) * D, dst[r] = out + i * Hq * D + (h * G + g) * D, last[r] = past + i;
    }
    start_rows(st, NR, D);
    for (int64_t t = 0; t < tiles; t++)
        attend_tile(qrow, last, NR, t * PA_KT, kpack + t * PA_KT * D, vpack + t * PA_KT * D, scale, st, D);
    finish_rows(st, NR, dst, D);
    free(f), free(w), free(nan);
    return 0;
}

/* The same work item on AMX: blocks of 16 rows, tile by tile (a block skips the tiles past all its
 * rows' last keys: the same bits, nothing it would add is nonzero); tiles packed by pack_tile_amx. */
static inline __attribute__((always_inline)) int64_t prefill_task_amx(
    const uint16_t* q, int64_t q_stride, const uint16_t* kpack, const uint16_t* vpack, int64_t T, int64_t S,
    uint16_t* out, int64_t h, int64_t i0, int64_t i1, int64_t Hkv, float scale, const int64_t G, const int64_t D) {
    const int64_t Hq = Hkv * G, past = S - T, NR = (i1 - i0) * G, tiles = (past + i1 + PA_KT - 1) / PA_KT;
    const int64_t NB = (NR + 15) / 16, per_block = D * 16 * 2 + D * 16 * 4 + 64 * 4; /* bytes: qt, ot, m l last nan */
    uint8_t* mem = aligned_alloc(64, (size_t)(NB * per_block));
    if (mem == NULL) return 1;
    AmxBlock blocks[(PA_QB * MAX_GROUP + 15) / 16];
    const uint16_t* qrow[PA_QB * MAX_GROUP];
    uint16_t* dst[PA_QB * MAX_GROUP];
    int64_t last[PA_QB * MAX_GROUP];
    for (int64_t r = 0; r < NR; r++) {
        const int64_t i = i0 + r / G, g = r % G;
        qrow[r] = q + i * q_stride + (h * G + g) * D, dst[r] = out + i * Hq * D + (h * G + g) * D, last[r] = past + i;
    }
    for (int64_t bi = 0; bi < NB; bi++) {
        uint8_t* p = mem + bi * per_block;
        blocks[bi] = (AmxBlock){(uint16_t*)p, (float*)(p + D * 32), (float*)(p + D * 96), (float*)(p + D * 96 + 64),
                                (int32_t*)(p + D * 96 + 128), (__mmask16*)(p + D * 96 + 192)};
        const int64_t nr = NR - 16 * bi < 16 ? NR - 16 * bi : 16;
        amx_block_start(blocks[bi], qrow + 16 * bi, last + 16 * bi, nr, D);
    }
    for (int64_t t = 0; t < tiles; t++) {
        const uint16_t* kn = kpack + t * PA_KT * D;
        const uint16_t* kg[4] = {kn, kn + 16 * D, kn + 32 * D, kn + 48 * D};
        for (int64_t bi = 0; bi < NB; bi++) {
            const int64_t r_last = 16 * bi + 15 < NR ? 16 * bi + 15 : NR - 1; /* rows are token-major: the latest */
            if (last[r_last] < t * PA_KT) continue;
            attend_block_amx(blocks[bi], kg, D, t * PA_KT, vpack + t * PA_KT * D, scale, D);
        }
    }
    for (int64_t bi = 0; bi < NB; bi++) {
        const int64_t nr = NR - 16 * bi < 16 ? NR - 16 * bi : 16;
        amx_block_finish(blocks[bi], dst + 16 * bi, nr, D);
    }
    free(mem);
    return 0;
}

/* q: [T, Hq, D] rows q_stride apart (a prefill chunk's queries); kc/vc: one layer's cache [blocks,
 * bs, Hkv, D] holding the sequence's S tokens (the chunk's included) through `table`; out:
 * [T, Hq * D]; kpack/vpack: scratch of Hkv * ceil(S / 64) * 64 * D values each. D % 32 == 0,
 * D <= 256, Hq / Hkv <= 16, 1 <= T <= S. Returns the work items that could not allocate. */
int64_t parrot_paged_prefill(const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc,
                             const int64_t* table, int64_t T, int64_t S, uint16_t* out, uint16_t* kpack,
                             uint16_t* vpack, int64_t Hq, int64_t Hkv, int64_t D, int64_t bs, float scale,
                             int num_threads) {
    const int64_t G = Hq / Hkv, tiles = (S + PA_KT - 1) / PA_KT, per_head = tiles * PA_KT * D;
    const int64_t qblocks = (T + PA_QB - 1) / PA_QB;
    int64_t failed = 0;
    const int amx = amx_attention;
#pragma omp parallel num_threads(num_threads)
    {
        if (amx) amx_configure(16);
#pragma omp for schedule(static)
        for (int64_t ht = 0; ht < Hkv * tiles; ht++) { /* every tile packed once, for all query blocks */
            const int64_t h = ht / tiles, t0 = ht % tiles * PA_KT, n = S - t0 < PA_KT ? S - t0 : PA_KT;
            uint16_t *kp = kpack + h * per_head + t0 * D, *vp = vpack + h * per_head + t0 * D;
#define PACK(GG, DD) pack_tile(kc, vc, table, t0, n, bs, Hkv * D, h, kp, vp, DD)
#define PACK_AMX(GG, DD) pack_tile_amx(kc, vc, table, t0, n, bs, Hkv * D, h, kp, vp, DD)
            if (amx) WITH_HEAD_SHAPE(G, D, PACK_AMX);
            else WITH_HEAD_SHAPE(G, D, PACK);
#undef PACK
#undef PACK_AMX
        }
#pragma omp for schedule(dynamic, 1) reduction(+ : failed)
        for (int64_t task = 0; task < Hkv * qblocks; task++) {
            const int64_t b = qblocks - 1 - task / Hkv, h = task % Hkv; /* the most keys first */
            const int64_t i0 = b * PA_QB, i1 = i0 + PA_QB < T ? i0 + PA_QB : T;
#define PREFILL_TASK(GG, DD) \
    prefill_task(q, q_stride, kpack + h * per_head, vpack + h * per_head, T, S, out, h, i0, i1, Hkv, scale, GG, DD)
#define PREFILL_TASK_AMX(GG, DD) \
    prefill_task_amx(q, q_stride, kpack + h * per_head, vpack + h * per_head, T, S, out, h, i0, i1, Hkv, scale, GG, DD)
            if (amx) failed += WITH_HEAD_SHAPE(G, D, PREFILL_TASK_AMX);
            else failed += WITH_HEAD_SHAPE(G, D, PREFILL_TASK);
#undef PREFILL_TASK
#undef PREFILL_TASK_AMX
        }
        if (amx) _tile_release();
    }
    return failed;
}

/* ---- Shared-prefix (cascade) decode attention ------------------------------------------------
 * The driver and the merge of partials are csrc/cascade.h (shared with block_kernels.c). A work
 * item here reads the piece's K/V rows once for its R rows x G query heads in three passes: every
 * score (16 tokens per score vector, as above), then e^(s - m) and its sum, then the weighted V
 * (a V tile at a time). block_kernels.c's work item is an online softmax over 32-key tiles instead:
 * its own arithmetic, pinned by its own tests. */
#define V_TILE 64 /* tokens whose V rows stay in L1 while every row of the piece reads them */

static inline __attribute__((always_inline)) int64_t piece_task(
    const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc, const int64_t* blocks, int64_t L,
    const int64_t* rows, int64_t R, float* pm, float* pl, float* pacc, int64_t h, int64_t Hkv, int64_t bs,
    float scale, const int64_t G, const int64_t D) {
    const int64_t Hq = Hkv * G, row = Hkv * D, padded = (L + 15) / 16 * 16, QN = R * G;
    float* scores = aligned_alloc(64, (size_t)(QN * padded * 4));
    __m512* vmax = aligned_alloc(64, (size_t)(QN * 64));
    __mmask16* nan = malloc((size_t)(QN * sizeof(__mmask16)));
    if (scores == NULL || vmax == NULL || nan == NULL) {
        free(scores), free(vmax), free(nan);
        return 1;
    }
    for (int64_t i = 0; i < QN; i++) vmax[i] = _mm512_set1_ps(-INFINITY), nan[i] = 0;
    int64_t blk = 0, off = 0;
    for (int64_t t0 = 0; t0 < L; t0 += 16) { /* pass 1: scores */
        const int64_t n = L - t0 < 16 ? L - t0 : 16;
        const uint16_t* krow[16];
        next_rows(kc, blocks, &blk, &off, n, bs, row, h * D, krow);
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < G; g++) {
                const uint16_t* qr = q + rows[r] * q_stride + (h * G + g) * D;
                __m512bh qv[MAX_HEAD_DIM / 32];
                for (int64_t c = 0; c < D / 32; c++) qv[c] = (__m512bh)_mm512_loadu_si512(qr + c * 32);
                const int64_t qi = r * G + g;
                score16(qv, krow, n, scale, D, scores + qi * padded + t0, &vmax[qi], &nan[qi]);
            }
    }
    for (int64_t qi = 0; qi < QN; qi++) { /* pass 2: e^(s - m) and its sum */
        const float m = nan[qi] ? NAN : _mm512_reduce_max_ps(vmax[qi]);
        const int64_t slot = (qi / G) * Hq + h * G + qi % G;
        pm[slot] = m;
        pl[slot] = exp_sum(scores + qi * padded, L, m);
    }
    blk = off = 0;
    for (int64_t t0 = 0; t0 < L; t0 += V_TILE) { /* pass 3: e^(s - m)-weighted V, a tile at a time */
        const int64_t n = L - t0 < V_TILE ? L - t0 : V_TILE;
        const uint16_t* vrow[V_TILE];
        next_rows(vc, blocks, &blk, &off, n, bs, row, h * D, vrow);
        for (int64_t r = 0; r < R; r++) {
            __m512 acc[MAX_GROUP][MAX_HEAD_DIM / 16];
            float* pa = pacc + (r * Hq + h * G) * D; /* this row's G heads, contiguous */
            for (int64_t g = 0; g < G; g++)
                for (int64_t c = 0; c < D / 16; c++)
                    acc[g][c] = t0 ? _mm512_loadu_ps(pa + g * D + c * 16) : _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < D / 16; c++) {
                    __m512 vv = load_bf16x16(vrow[i] + c * 16);
                    for (int64_t g = 0; g < G; g++)
                        acc[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(scores[(r * G + g) * padded + t0 + i]), vv,
                                                    acc[g][c]);
                }
            for (int64_t g = 0; g < G; g++)
                for (int64_t c = 0; c < D / 16; c++) _mm512_storeu_ps(pa + g * D + c * 16, acc[g][c]);
        }
    }
    free(scores), free(vmax), free(nan);
    return 0;
}

/* One work item of cascade_decode (csrc/cascade.h), the head shape a constant where it is common. */
static int64_t cascade_piece(const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc,
                             const int64_t* blocks, int64_t L, const int64_t* rows, int64_t R, float* pm, float* pl,
                             float* pacc, int64_t h, int64_t Hkv, int64_t bs, float scale, int64_t G, int64_t D) {
#define PIECE_TASK(GG, DD) piece_task(q, q_stride, kc, vc, blocks, L, rows, R, pm, pl, pacc, h, Hkv, bs, scale, GG, DD)
    return WITH_HEAD_SHAPE(G, D, PIECE_TASK);
#undef PIECE_TASK
}

/* A partial's weight in the merge: a NaN score leaves a NaN max (piece_task), and any NaN max makes
 * the whole row NaN, as in SDPA. */
static inline float merge_weight(float ms, float m, int any_nan) { return any_nan ? NAN : expf(ms - m); }

#include "csrc/cascade.h"

/* The pieces, rows and slots of csrc/cascade.h; returns the work items that could not allocate
 * (the caller raises). */
int64_t parrot_cascade_decode(const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc,
                              int64_t P, const int64_t* block_ptr, const int64_t* piece_blocks,
                              const int64_t* piece_len, const int64_t* row_ptr, const int64_t* piece_rows,
                              const int64_t* slot_ptr, const int64_t* row_slots, uint16_t* out, int64_t B,
                              int64_t Hq, int64_t Hkv, int64_t D, int64_t bs, float scale, int num_threads) {
    return cascade_decode(q, q_stride, kc, vc, P, block_ptr, piece_blocks, piece_len, row_ptr, piece_rows, slot_ptr,
                          row_slots, out, B, Hq, Hkv, D, bs, scale, num_threads);
}

/* ---- Greedy choice and log-normalizer of bf16 logits ----------------------------------------
 * Per row of logits [B, V]: the first index of the maximum, and logsumexp in fp32 (so that
 * log p(token) = logit - lse). Replaces a float copy, an argmax and a logsumexp over [B, V]. */
void parrot_argmax_logsumexp(const uint16_t* logits, int64_t B, int64_t V, int64_t* argmax, float* lse,
                             int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        const uint16_t* row = logits + b * V;
        float best = -INFINITY;
        int64_t best_i = 0;
        int64_t v = 0;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (; v + 16 <= V; v += 16) vmax = _mm512_max_ps(vmax, load_bf16x16(row + v));
        best = _mm512_reduce_max_ps(vmax);
        for (int64_t t = v; t < V; t++) best = fmaxf(best, bf16_to_f32(row[t]));
        for (int64_t t = 0; t < V; t++) /* first index of the maximum (NaN rows keep index 0) */
            if (bf16_to_f32(row[t]) == best) {
                best_i = t;
                break;
            }
        if (!isfinite(best)) { /* all -inf (or NaN / +inf): no normalizer to speak of */
            argmax[b] = best_i;
            lse[b] = best;
            continue;
        }
        __m512 m = _mm512_set1_ps(best), sum = _mm512_setzero_ps();
        for (v = 0; v + 16 <= V; v += 16) sum = _mm512_add_ps(sum, vf_exp(_mm512_sub_ps(load_bf16x16(row + v), m)));
        float s = _mm512_reduce_add_ps(sum);
        for (int64_t t = v; t < V; t++) s += expf(bf16_to_f32(row[t]) - best);
        argmax[b] = best_i;
        lse[b] = best + logf(s);
    }
}

/* ---- The elementwise steps (csrc/elementwise.h), rounding where the torch reference (bf16) rounds */
#include "csrc/elementwise.h"

/* out = w * bf16(r * rsqrt(mean(r^2) + eps)), r = x (+ delta, rounded and written to resid). D % 16 == 0. */
void parrot_rmsnorm(const uint16_t* x, const uint16_t* delta, uint16_t* resid, const uint16_t* w, uint16_t* out,
                    int64_t N, int64_t D, float eps, int num_threads) {
    rmsnorm_rows(x, delta, resid, w, out, N, D, eps, num_threads);
}

/* In place on x [N, H, D] (rows x_stride apart): RoPE at each row's position. D % 32 == 0. */
void parrot_rope(uint16_t* x, int64_t x_stride, int64_t N, int64_t H, int64_t D, const float* cos_table,
                 const float* sin_table, const int64_t* positions, int num_threads) {
    rope_rows(x, x_stride, N, H, D, cos_table, sin_table, positions, num_threads);
}

/* out [N, I] = bf16(silu(g)) * u, rounded, where gu [N, 2I] = [g | u]. I % 16 == 0. */
void parrot_silu_mul(const uint16_t* gu, uint16_t* out, int64_t N, int64_t I, int num_threads) {
    silu_mul_rows(gu, out, N, I, num_threads);
}

/* ---- One decoder layer in one call (kernels/fused.py; the sequence is csrc/decoder_layer.h) ----
 * For a step whose rows attend through the paged kernels above (`NativeRows` of fused.py): decode
 * rows one by one (parrot_paged_decode), then prefill chunks (parrot_paged_prefill). The layer
 * descriptor (int64, LY_*: fused.py fills it) names the weights and the linear kernel. */
#include "csrc/decoder_layer.h"

enum { LY_QKV, LY_QKV_BIAS, LY_O, LY_GATE_UP, LY_DOWN, LY_POST_NORM, LY_LINEAR_KIND, LY_SIZE };
enum { LINEAR_VNNI, LINEAR_DOT, LINEAR_AMX }; /* weights packed by pack_vnni, the bf16 weights, or packed by pack_amx */
/* The step descriptor's attention slots, after the shared ones. */
enum { ST_TABLES = ST_ATTENTION, ST_MAX_BLOCKS, ST_LENS, ST_PER_ROW, ST_CHUNKS, ST_NUM_CHUNKS, ST_PACK, ST_SIZE };

static void layer_linear(const int64_t* layer, int which, const uint16_t* x, int64_t ldx, uint16_t* y, int64_t M,
                         int64_t N, int64_t K, int threads) {
    static const int weight_slot[] = {[LINEAR_QKV] = LY_QKV, [LINEAR_O] = LY_O, [LINEAR_GATE_UP] = LY_GATE_UP,
                                      [LINEAR_DOWN] = LY_DOWN};
    const uint16_t* w = PTR(const uint16_t*, layer[weight_slot[which]]);
    const uint16_t* bias = which == LINEAR_QKV ? PTR(const uint16_t*, layer[LY_QKV_BIAS]) : NULL;
    const int64_t kind = layer[LY_LINEAR_KIND];
    if (kind == LINEAR_AMX) parrot_linear_amx(x, ldx, w, bias, y, M, N, K, threads);
    else if (kind == LINEAR_VNNI) parrot_linear_vnni(x, ldx, w, bias, y, M, N, K, threads);
    else parrot_linear_bf16(x, ldx, w, bias, y, M, N, K, threads);
}

/* Rows [0, ST_PER_ROW) one by one, then each prefill chunk (first row, rows, tokens). */
static int64_t layer_attention(const int64_t* step, const uint16_t* qkv, int64_t W, uint16_t* kc, uint16_t* vc,
                               uint16_t* attn, float scale, int threads) {
    const int64_t Hq = step[ST_HQ], Hkv = step[ST_HKV], D = step[ST_HEAD_DIM], bs = step[ST_BLOCK_SIZE];
    const int64_t* tables = PTR(const int64_t*, step[ST_TABLES]);
    const int64_t max_blocks = step[ST_MAX_BLOCKS];
    int64_t failed = parrot_paged_decode(qkv, W, kc, vc, tables, max_blocks, PTR(const int64_t*, step[ST_LENS]), attn,
                                         step[ST_PER_ROW], Hq, Hkv, D, bs, scale, threads);
    const int64_t* chunks = PTR(const int64_t*, step[ST_CHUNKS]);
    uint16_t* kpack = PTR(uint16_t*, step[ST_PACK]);
    for (int64_t c = 0; c < step[ST_NUM_CHUNKS] && !failed; c++) {
        const int64_t first = chunks[3 * c], T = chunks[3 * c + 1], S = chunks[3 * c + 2];
        uint16_t* vpack = kpack + Hkv * ((S + PA_KT - 1) / PA_KT) * PA_KT * D;
        failed = parrot_paged_prefill(qkv + first * W, W, kc, vc, tables + first * max_blocks, T, S,
                                      attn + first * Hq * D, kpack, vpack, Hq, Hkv, D, bs, scale, threads);
    }
    return failed;
}

/* x, h: the residual stream and input_norm(x), [N, hidden]; next_norm: the next layer's input norm
 * (or the final norm) weight; writes the new residual to x_out and next_norm of it to h_out.
 * Returns the attention work items that could not allocate (0 on success; the caller raises). */
int64_t parrot_decoder_layer(const int64_t* layer, const int64_t* step, int64_t layer_idx, const uint16_t* x,
                             const uint16_t* h, const uint16_t* next_norm, uint16_t* x_out, uint16_t* h_out,
                             float post_eps, float next_eps, float scale) {
    return decoder_layer(layer, step, layer_idx, x, h, PTR(const uint16_t*, layer[LY_POST_NORM]), next_norm, x_out,
                         h_out, post_eps, next_eps, scale);
}
