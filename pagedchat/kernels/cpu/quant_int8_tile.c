/* Products on GGML blocks with 8-bit activations (quant_int8.h) for more than
 * INT8_ROWS_MAX rows: prompts, and decode steps of several sequences.
 *
 * Threads take runs of groups of NCOLS output columns, as in quant.c. A thread unpacks
 * WIDE groups at a time into byte tiles, once per call, and multiplies them with every row
 * of x, MR rows at a time:
 * - a tile holds a group's integers k-major, the four values of a column for k = 4 s ..
 *   4 s + 3 in one 32-bit lane: tile[(4 s * NCOLS) + 4 column + k % 4]; beside it each run's
 *   scale and offset per column (a run: the values that share them, 32, or 16 in Q6_K);
 * - each step of four values broadcasts them from a row of x and multiplies them with the
 *   NCOLS columns at once: byte products summed in pairs to 16 bits, the sums of as many
 *   steps as cannot overflow added in 16 bits, then widened to 32 in pairs (with VNNI,
 *   AVX512-VNNI's or AVX-VNNI's, four products summed into 32 bits in one instruction). The
 *   integer sum of a run is exact; it is then scaled in float.
 * The byte products take one unsigned operand. The weights' integers are unsigned but
 * Q8_0's, whose signs move onto x (|w| times x with w's sign); with VNNI, Q8_0's products
 * take x + 128 instead (x's bytes taken up once per call), and each run's sum starts at
 * -128 times the sum of its weights.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_formats.h"
#include "quant_int8.h"
#include "vector.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512BW__)
#define LANES 16  /* 32-bit lanes of a vector: the columns it holds */
#define NV 2      /* vectors of columns in a group */
#define WIDE 4    /* groups unpacked together */
typedef __m512i ivec;
typedef __m512 fvec;
#define i_load(p) _mm512_loadu_si512((const void *)(p))
#define i_zero() _mm512_setzero_si512()
#define i_set1(v) _mm512_set1_epi32(v)
#if defined(__AVX512VNNI__)
#define i_dot(sum, u, s) _mm512_dpbusd_epi32(sum, u, s)
#define i_widen(v) (v)
#define SHIFTED_X 1  /* Q8_0 takes x + 128 */
#else
#define i_dot(sum, u, s) _mm512_add_epi16(sum, _mm512_maddubs_epi16(u, s))
#define i_widen(v) _mm512_madd_epi16(v, _mm512_set1_epi16(1))
#endif
#define i_add32(a, b) _mm512_add_epi32(a, b)
#define i_abs8(v) _mm512_abs_epi8(v)
#define i_signed(x, w) _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x)
#define f_zero() _mm512_setzero_ps()
#define f_load(p) _mm512_loadu_ps(p)
#define f_store(p, v) _mm512_storeu_ps(p, v)
#define f_set1(v) _mm512_set1_ps(v)
#define f_cvt(v) _mm512_cvtepi32_ps(v)
#define f_mul(a, b) _mm512_mul_ps(a, b)
#define f_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#elif defined(__AVX2__)
#define LANES 8
#define NV 1
#define WIDE 8
typedef __m256i ivec;
typedef __m256 fvec;
#define i_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define i_zero() _mm256_setzero_si256()
#define i_set1(v) _mm256_set1_epi32(v)
#if defined(DPBUSD256)  /* AVX-VNNI */
#define i_dot(sum, u, s) DPBUSD256(sum, u, s)
#define i_widen(v) (v)
#define SHIFTED_X 1
#else
#define i_dot(sum, u, s) _mm256_add_epi16(sum, _mm256_maddubs_epi16(u, s))
#define i_widen(v) _mm256_madd_epi16(v, _mm256_set1_epi16(1))
#endif
#define i_add32(a, b) _mm256_add_epi32(a, b)
#define i_abs8(v) _mm256_abs_epi8(v)
#define i_signed(x, w) _mm256_sign_epi8(x, w)
#define f_zero() _mm256_setzero_ps()
#define f_load(p) _mm256_loadu_ps(p)
#define f_store(p, v) _mm256_storeu_ps(p, v)
#define f_set1(v) _mm256_set1_ps(v)
#define f_cvt(v) _mm256_cvtepi32_ps(v)
#define f_mul(a, b) _mm256_mul_ps(a, b)
#define f_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#else
#define LANES 8
#define NV 1
#define WIDE 8
#endif
#define NCOLS (NV * LANES)  /* output columns in a group */
/* rows of x multiplied at a time: with VNNI a run's sums take one register per row and
 * vector of columns, and AVX-512's 32 registers hold six rows' (and their float sums) */
#if defined(__AVX512VNNI__)
#define MR 6
#else
#define MR 4
#endif

/* The values that share a scale and an offset. */
static inline int run_length(int type) { return type == Q6_K ? 16 : 32; }

/* Steps of four values summed before they are widened (i_dot: sum += the byte products of
 * u and s): every step of a run where they are summed in 32 bits; else as many as cannot
 * overflow 16 bits, where a pair of products is at most 2 * 127 * the largest integer (15,
 * 31, 63, or 127 for Q8_0's magnitudes). */
static inline int depth(int type) {
#if defined(SHIFTED_X)
    return run_length(type) / 4;
#endif
    switch (type) {
        case Q4_0: case Q4_1: case Q4_K: return 8;
        case Q5_0: case Q5_1: case Q5_K: return 4;
        case Q6_K: return 2;
        default: return 1;
    }
}

/* One group's tile: integers [k_dim / 4][NCOLS][4], per run scale, offset and start
 * [runs][NCOLS] (Q8_0 has no offset). */
typedef struct {
    int8_t *q;
    float *scale, *offset;
    int32_t *start;  /* per run and column, where its integer sum starts (SHIFTED_X) */
} Tile;

#if defined(__AVX2__)
/* v[c] = the eight 32-bit words of column c -> v[i] = word i of the eight columns */
static inline void transpose8(__m256i v[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}
#endif

/* Columns [first, first + count) of W into tile (a short group repeats its last column). */
static inline __attribute__((always_inline)) void
pack_tile(int type, const uint8_t *w, int64_t row_bytes, int first, int count, int k_dim,
          const Tile *tile) {
    const int values = block_values(type), bytes = block_bytes(type), run = run_length(type);
    const uint8_t *col[NCOLS];
    for (int c = 0; c < NCOLS; c++) col[c] = w + (int64_t)(first + (c < count ? c : count - 1)) * row_bytes;
    for (int c = 0; c < NCOLS; c++)
        for (int k = 0, at = 0; k < k_dim; k += values, at += bytes) {
            Head head;
            head_of(type, col[c] + at, &head);
            for (int s = 0; s < values / run; s++) {
                const int64_t to = (int64_t)(k / run + s) * NCOLS + c;
                tile->scale[to] = head.scale[type >= Q4_K ? s : 0];
                if (type != Q8_0) tile->offset[to] = head.offset[type >= Q4_K ? s : 0];
            }
        }
    for (int k = 0, at = 0; k < k_dim; k += values, at += bytes)
        for (int s = 0; s < values / 32; s++) {
            int8_t *to = tile->q + (int64_t)(k + 32 * s) * NCOLS;  /* step (k + 32 s) / 4 */
#if defined(__AVX2__)
            for (int c0 = 0; c0 < NCOLS; c0 += 8) {
                __m256i words[8];
                for (int c = 0; c < 8; c++) words[c] = run_bytes(type, col[c0 + c] + at, s);
                transpose8(words);
                for (int i = 0; i < 8; i++)
                    _mm256_storeu_si256((__m256i *)(to + 4 * (i * NCOLS + c0)), words[i]);
#if defined(SHIFTED_X)
                if (type == Q8_0) {  /* -128 * each column's sum of the run's weights */
                    __m256i sum = _mm256_setzero_si256();
                    for (int i = 0; i < 8; i++)
                        sum = DPBUSD256(sum, _mm256_set1_epi8(1), words[i]);
                    _mm256_storeu_si256((__m256i *)(tile->start + (int64_t)(k / 32 + s) * NCOLS + c0),
                                        _mm256_sub_epi32(_mm256_setzero_si256(),
                                                         _mm256_slli_epi32(sum, 7)));
                }
#endif
            }
#else
            for (int c = 0; c < NCOLS; c++) {
                int8_t q[32];
                run_integers(type, col[c] + at, s, q);
                for (int i = 0; i < 8; i++) memcpy(to + 4 * (i * NCOLS + c), q + 4 * i, 4);
            }
#endif
        }
}

/* sums[r][c] = row (row0 + r) of x . the tile's column c, for `rows` (<= MR) rows. */
static inline __attribute__((always_inline)) void
tile_sums(int type, int rows, const X8 *x, int row0, int k_dim, const Tile *tile,
          float sums[MR][NCOLS]) {
    const int run = run_length(type), runs32 = k_dim / 32;
    const int8_t *xq[MR];
    for (int r = 0; r < rows; r++) xq[r] = x->q + (int64_t)(row0 + r) * k_dim;
    /* the offset's product with x: d * sum(q) over the run */
    const float *x_sums = run == 32 ? x->run_sums : x->half_sums;
    const int x_sums_per_row = k_dim / run;
#if defined(__AVX2__)
    const int depth_of = depth(type), per_run = run / 4;
    fvec acc[MR][NV];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = f_zero();
    for (int j = 0; j < k_dim / run; j++) {
        ivec sum32[MR][NV];
        for (int c = 0; c < per_run; c += depth_of) {
            ivec sum16[MR][NV];  /* 16-bit sums, or 32-bit with VNNI */
            for (int r = 0; r < rows; r++)
                for (int v = 0; v < NV; v++) {
#if defined(SHIFTED_X)
                    if (type == Q8_0) {
                        sum16[r][v] = i_load(tile->start + (int64_t)j * NCOLS + v * LANES);
                        continue;
                    }
#endif
                    sum16[r][v] = i_zero();
                }
            for (int step = j * per_run + c; step < j * per_run + c + depth_of; step++) {
                ivec wv[NV];
                for (int v = 0; v < NV; v++)
                    wv[v] = i_load(tile->q + 4 * ((int64_t)step * NCOLS + v * LANES));
#if !defined(SHIFTED_X)
                ivec magnitude[NV];
                for (int v = 0; type == Q8_0 && v < NV; v++) magnitude[v] = i_abs8(wv[v]);
#endif
                for (int r = 0; r < rows; r++) {
                    int32_t four;
                    memcpy(&four, xq[r] + 4 * step, 4);
                    const ivec xv = i_set1(four);
#if defined(SHIFTED_X)
                    for (int v = 0; v < NV; v++)  /* Q8_0: x was taken 128 up (below) */
                        sum16[r][v] = type == Q8_0 ? i_dot(sum16[r][v], xv, wv[v])
                                                   : i_dot(sum16[r][v], wv[v], xv);
#else
                    for (int v = 0; v < NV; v++)
                        sum16[r][v] = type == Q8_0 ? i_dot(sum16[r][v], magnitude[v], i_signed(xv, wv[v]))
                                                   : i_dot(sum16[r][v], wv[v], xv);
#endif
                }
            }
            for (int r = 0; r < rows; r++)
                for (int v = 0; v < NV; v++)
                    sum32[r][v] = c == 0 ? i_widen(sum16[r][v])
                                         : i_add32(sum32[r][v], i_widen(sum16[r][v]));
        }
        fvec scale[NV], offset[NV];
        for (int v = 0; v < NV; v++) {
            scale[v] = f_load(tile->scale + (int64_t)j * NCOLS + v * LANES);
            if (type != Q8_0) offset[v] = f_load(tile->offset + (int64_t)j * NCOLS + v * LANES);
        }
        for (int r = 0; r < rows; r++) {
            const fvec d = f_set1(x->scale[(int64_t)(row0 + r) * runs32 + j * run / 32]);
            const fvec x_sum = f_set1(x_sums[(int64_t)(row0 + r) * x_sums_per_row + j]);
            for (int v = 0; v < NV; v++) {
                acc[r][v] = f_fma(f_cvt(sum32[r][v]), f_mul(scale[v], d), acc[r][v]);
                if (type != Q8_0) acc[r][v] = f_fma(offset[v], x_sum, acc[r][v]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < NV; v++) f_store(sums[r] + v * LANES, acc[r][v]);
#else
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < NCOLS; c++) sums[r][c] = 0.0f;
    for (int j = 0; j < k_dim / run; j++)
        for (int r = 0; r < rows; r++) {
            const float d = x->scale[(int64_t)(row0 + r) * runs32 + j * run / 32];
            const float x_sum = x_sums[(int64_t)(row0 + r) * x_sums_per_row + j];
            for (int c = 0; c < NCOLS; c++) {
                int sum = 0;
                for (int k = j * run; k < (j + 1) * run; k++) {
                    const int8_t q = tile->q[(int64_t)k / 4 * 4 * NCOLS + 4 * c + k % 4];
                    sum += (type == Q8_0 ? q : (uint8_t)q) * xq[r][k];
                }
                const int64_t at = (int64_t)j * NCOLS + c;
                sums[r][c] += (float)sum * (tile->scale[at] * d);
                if (type != Q8_0) sums[r][c] += tile->offset[at] * x_sum;
            }
        }
#endif
}

#define ROWS_CASE(TYPE, ROWS) \
    case ROWS: tile_sums(TYPE, ROWS, x, row0, k_dim, tile, sums); break;
#if MR == 6
#define ROWS_PAST_4(TYPE) ROWS_CASE(TYPE, 5) ROWS_CASE(TYPE, 6)
#else
#define ROWS_PAST_4(TYPE)
#endif
/* tile_sums with the format and the row count as constants: a function per format. */
#define FORMAT_TILE_SUMS(TYPE)                                                             \
    static __attribute__((noinline)) void tile_sums_##TYPE(                                \
            int rows, const X8 *x, int row0, int k_dim, const Tile *tile,                  \
            float sums[MR][NCOLS]) {                                                       \
        switch (rows) { ROWS_CASE(TYPE, 1) ROWS_CASE(TYPE, 2) ROWS_CASE(TYPE, 3)           \
                        ROWS_CASE(TYPE, 4) ROWS_PAST_4(TYPE) }                             \
    }
QUANT_FORMATS(FORMAT_TILE_SUMS)
#define TILE_SUMS_CASE(TYPE) case TYPE: tile_sums_##TYPE(rows, x, row0, k_dim, tile, sums); break;

static void tile_sums_of(int type, int rows, const X8 *x, int row0, int k_dim,
                         const Tile *tile, float sums[MR][NCOLS]) {
    switch (type) { QUANT_FORMATS(TILE_SUMS_CASE) }
}

#define PACK_CASE(TYPE) \
    case TYPE: pack_tile(TYPE, w, row_bytes, first, count, k_dim, tile); break;

/* pack_tile with the format as a constant. */
static void pack_tile_of(int type, const uint8_t *w, int64_t row_bytes, int first, int count,
                         int k_dim, const Tile *tile) {
    switch (type) { QUANT_FORMATS(PACK_CASE) }
}

int quant8_tile_part(const float *x, const uint8_t *w, int type, const float *bias,
                     void *out, int out_bf16, int rows, int k_dim, int n_dim,
                     int64_t out_stride, int t, int threads, const float *bounds) {
    Format f;
    if (!format_of(type, &f)) return 1;
    const int groups = (n_dim + NCOLS - 1) / NCOLS;
    int g, end;
    thread_run(groups, t, threads, bounds, &g, &end);
    if (g == end) return 0;
    const size_t q_bytes = (size_t)k_dim * NCOLS;
    const size_t scales = (size_t)(k_dim / run_length(type)) * NCOLS;
    const size_t tile_bytes = (q_bytes + 3 * sizeof(float) * scales + 63) / 64 * 64;
    uint8_t *memory = aligned_alloc(64, WIDE * tile_bytes);
    X8 x8;
    if (memory == NULL || !round_rows(x, rows, k_dim, &x8)) {
        free(memory);
        return 2;
    }
#if defined(SHIFTED_X)
    if (type == Q8_0)  /* its products take x + 128, unsigned: once here, not per step */
        for (int64_t i = 0; i < (int64_t)rows * k_dim; i++) x8.q[i] ^= (int8_t)0x80;
#endif
    Tile tiles[WIDE];
    for (int i = 0; i < WIDE; i++) {
        tiles[i].q = (int8_t *)(memory + i * tile_bytes);
        tiles[i].scale = (float *)(memory + i * tile_bytes + q_bytes);
        tiles[i].offset = tiles[i].scale + scales;
        tiles[i].start = (int32_t *)(tiles[i].offset + scales);
    }
    const int64_t row_bytes = (int64_t)k_dim / f.block_size * f.type_size;
    for (; g < end; g += WIDE) {
        const int wide = end - g < WIDE ? end - g : WIDE;
        for (int i = 0; i < wide; i++) {
            const int first = (g + i) * NCOLS;
            pack_tile_of(type, w, row_bytes, first, n_dim - first < NCOLS ? n_dim - first : NCOLS,
                         k_dim, &tiles[i]);
        }
        for (int row0 = 0; row0 < rows; row0 += MR) {
            const int chunk = rows - row0 < MR ? rows - row0 : MR;
            for (int i = 0; i < wide; i++) {
                const int first = (g + i) * NCOLS;
                const int count = n_dim - first < NCOLS ? n_dim - first : NCOLS;
                float sums[MR][NCOLS];
                tile_sums_of(type, chunk, &x8, row0, k_dim, &tiles[i], sums);
                for (int r = 0; r < chunk; r++) {
                    const int64_t at = (int64_t)(row0 + r) * out_stride + first;
                    for (int c = 0; c < count; c++) {
                        const float y = sums[r][c] + (bias ? bias[first + c] : 0.0f);
                        if (out_bf16) ((bf16_t *)out)[at + c] = bf16_round(y);
                        else ((float *)out)[at + c] = y;
                    }
                }
            }
        }
    }
    free(x8.scale);
    free(memory);
    return 0;
}
