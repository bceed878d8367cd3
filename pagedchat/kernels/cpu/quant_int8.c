/* Products on GGML blocks with 8-bit activations (quant_int8.h) for a few rows (at most
 * INT8_ROWS_MAX, a decode step), where the products wait on decoding the weights and the
 * integer sums save most of that: on AVX2, 32 byte products in two instructions, where the
 * exact path decodes, converts and multiplies each weight in float. Threads take runs of
 * tiles of output columns, as in quant_rows.c; each thread rounds all of x itself (a small
 * cost next to reading the weights). More rows go to quant_int8_tile.c.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_formats.h"
#include "quant_int8.h"
#include "vector.h"

#if defined(__AVX2__)
/* Eight int32 sums of four byte products each: lanes 0-3 the run's first 16 weights. Q8_0's
 * signed weights multiply as |w| times x with w's sign. */
static inline __m256i run_dot(int type, __m256i w, __m256i x) {
    const __m256i u = type == Q8_0 ? _mm256_sign_epi8(w, w) : w;
    const __m256i s = type == Q8_0 ? _mm256_sign_epi8(x, w) : x;
#if defined(DPBUSD256)
    return DPBUSD256(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

#endif

/* Tiles of output columns whose sums stay in registers (one 8-lane vector per row and
 * column on AVX2: 8 of the 16 registers). One row (a decode step) takes one column at a time
 * in the K formats and Q8_0: the weights are then read as one stream, which the hardware's
 * prefetcher follows, where a tile's columns interleave streams too short for it. The other
 * formats of one scale per 32 weights share each run's x and scales over four columns,
 * whose work the streams' loss does not outweigh. */
#define COLS8_FOR(type, rows) \
    ((rows) > 1 ? 8 / (rows) : (type) >= Q4_K || (type) == Q8_0 ? 1 : 4)

/* Partial sums per row and column: at least four chains of multiply-adds in flight, so that
 * a narrow tile waits on no adder's latency; run j goes to part j % PARTS8. */
#define PARTS8(rows, cols) ((rows) * (cols) >= 4 ? 1 : 4 / ((rows) * (cols)))

#if defined(__AVX2__)
/* tile8 for the formats of one scale per block of 32 (Q4_0 to Q8_0), on AVX2: the tile's
 * float16 scales (and minimums) are widened together, multiplied by each row's d in one
 * instruction, and the offsets' products summed for all columns at once: column c's in
 * lane 2 c where the offset is a multiple of the scale (Q4_0, Q5_0), in lane 2 c + 1 where
 * it is a stored minimum (Q4_1, Q5_1). */
static inline __attribute__((always_inline)) void
tile8_blocks32(int type, int rows, int cols, const X8 *x, int k_dim,
               const uint8_t *const col[], int64_t ahead,
               float sums[QUANT_ROWS_MAX][TILE_COLS_MAX]) {
    const int bytes = block_bytes(type), runs = k_dim / 32;
    const int with_min = type == Q4_1 || type == Q5_1;
    const int parts = PARTS8(rows, cols);
    __m256 acc[QUANT_ROWS_MAX][TILE_COLS_MAX][4], offsets[QUANT_ROWS_MAX][2];
    for (int r = 0; r < rows; r++) {
        offsets[r][0] = offsets[r][1] = _mm256_setzero_ps();
        for (int c = 0; c < cols; c++)
            for (int p = 0; p < parts; p++) acc[r][c][p] = _mm256_setzero_ps();
    }
    const float factor = type == Q4_0 ? -8.0f : type == Q5_0 ? -16.0f : 1.0f;
    for (int run = 0, at = 0; run < runs; run++, at += bytes) {
        prefetch_tile_ahead(col, cols, at, ahead);
        /* each column's first four bytes: its scale and (Q4_1, Q5_1) its minimum, as
         * float16, widened; column c's scale in lane 2 c (of the pair) */
        __m256 scales[2];
        for (int half = 0; half < (cols + 3) / 4; half++)
            scales[half] = tile_heads4(col, cols, at, half);
        /* scale * d: kept in registers where there are 32 of them (AVX-512), else stored,
         * so that each column's is a broadcast load rather than a shuffle */
#if defined(__AVX512F__)
        __m256 by[QUANT_ROWS_MAX][2];
#define SCALE_BY(r, c) _mm256_permutevar8x32_ps(by[r][(c) / 4], _mm256_set1_epi32(2 * ((c) % 4)))
#define SET_BY(r, half, v) (by[r][half] = (v))
#else
        float by[QUANT_ROWS_MAX][2 * TILE_COLS_MAX];
#define SCALE_BY(r, c) _mm256_broadcast_ss(&by[r][2 * (c)])
#define SET_BY(r, half, v) _mm256_storeu_ps(by[r] + 8 * (half), (v))
#endif
        __m256i xv[QUANT_ROWS_MAX];
        for (int r = 0; r < rows; r++) {
            const int64_t at_x = (int64_t)r * runs + run;
            const __m256 d = _mm256_set1_ps(x->scale[at_x]);
            const __m256 sum = _mm256_set1_ps(x->run_sums[at_x] * factor);
            for (int half = 0; half < (cols + 3) / 4; half++) {
                SET_BY(r, half, _mm256_mul_ps(scales[half], d));
                if (type != Q8_0)
                    offsets[r][half] = _mm256_fmadd_ps(scales[half], sum, offsets[r][half]);
            }
            xv[r] = _mm256_loadu_si256((const __m256i *)(x->q + (int64_t)r * k_dim + 32 * run));
        }
        for (int c = 0; c < cols; c++) {
            const __m256i w = run_bytes(type, col[c] + at, 0);
            for (int r = 0; r < rows; r++)
                acc[r][c][run % parts] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(run_dot(type, w, xv[r])), SCALE_BY(r, c),
                    acc[r][c][run % parts]);
        }
    }
#undef SCALE_BY
#undef SET_BY
    for (int r = 0; r < rows; r++) {
        float lanes[2 * TILE_COLS_MAX];
        _mm256_storeu_ps(lanes, offsets[r][0]);
        _mm256_storeu_ps(lanes + 8, offsets[r][1]);
        for (int c = 0; c < cols; c++)
            sums[r][c] = sum8(part_sum(acc[r][c], parts))
                         + (type == Q8_0 ? 0.0f : lanes[2 * c + with_min]);
    }
}
#endif

#if defined(__AVX2__)
/* The lanes (i, i, i, i, i + 1, i + 1, i + 1, i + 1) of v. */
static inline __m256 lane_pair(__m256 v, int i) {
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1));
}

/* tile8 for the K formats (Q4_K, Q5_K, Q6_K) on AVX2. Per block of 256 and column: the
 * scales (and minimums) are widened to float together and multiplied by the eight runs' x
 * scales in one instruction; each run's factor is a lane permute of that product; the
 * offsets' products (minimum, or -32 scale, times the run's or half-run's x sum) are added
 * in vector form to the same accumulator, since only its lanes' sum is read. */
static inline __attribute__((always_inline)) void
tile8_k(int type, int rows, int cols, const X8 *x, int k_dim, const uint8_t *const col[],
        int64_t ahead, float sums[QUANT_ROWS_MAX][TILE_COLS_MAX]) {
    const int bytes = block_bytes(type), runs = k_dim / 32, parts = PARTS8(rows, cols);
    __m256 acc[QUANT_ROWS_MAX][TILE_COLS_MAX][4];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            for (int p = 0; p < parts; p++) acc[r][c][p] = _mm256_setzero_ps();
    for (int k = 0, at = 0; k < k_dim; k += 256, at += bytes) {
        prefetch_lines_ahead(col, cols, at, bytes, ahead);
        const int run = k / 32;
        for (int c = 0; c < cols; c++) {
            const uint8_t *b = col[c] + at;
            __m256 scale[2], offset[2];
            if (type == Q6_K) {
                const __m256 d = _mm256_set1_ps(half_to_float(b + 208));
                const __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
                for (int h = 0; h < 2; h++) {
                    scale[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                        h ? _mm_srli_si128(sc, 8) : sc)));
                    offset[h] = _mm256_mul_ps(scale[h], _mm256_set1_ps(-32.0f));
                }
            } else {
                uint64_t sc, mn;
                k_fields(b, &sc, &mn);
                scale[0] = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b)), _mm256_cvtepi32_ps(
                    _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)sc))));
                offset[0] = _mm256_mul_ps(_mm256_set1_ps(-half_to_float(b + 2)),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)mn))));
            }
            __m256 by[QUANT_ROWS_MAX][2];
            for (int r = 0; r < rows; r++) {
                const int64_t at_x = (int64_t)r * runs + run;
                const __m256 d = _mm256_loadu_ps(x->scale + at_x);
                if (type == Q6_K) {
                    acc[r][c][0] = _mm256_fmadd_ps(
                        offset[0], _mm256_loadu_ps(x->half_sums + 2 * at_x), acc[r][c][0]);
                    acc[r][c][parts - 1] = _mm256_fmadd_ps(
                        offset[1], _mm256_loadu_ps(x->half_sums + 2 * at_x + 8),
                        acc[r][c][parts - 1]);
                    /* lanes 2 j, 2 j + 1: half-runs j's scales times run j's d, runs 0-3, 4-7 */
                    by[r][0] = _mm256_mul_ps(scale[0], _mm256_permutevar8x32_ps(
                        d, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
                    by[r][1] = _mm256_mul_ps(scale[1], _mm256_permutevar8x32_ps(
                        d, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
                } else {
                    acc[r][c][0] = _mm256_fmadd_ps(offset[0], _mm256_loadu_ps(x->run_sums + at_x),
                                                   acc[r][c][0]);
                    by[r][0] = _mm256_mul_ps(scale[0], d);
                }
            }
            for (int s = 0; s < 8; s++) {
                const __m256i w = run_bytes(type, b, s);
                for (int r = 0; r < rows; r++) {
                    const __m256i xv = _mm256_loadu_si256(
                        (const __m256i *)(x->q + (int64_t)r * k_dim + 32 * (run + s)));
                    const __m256 factor = type == Q6_K
                        ? lane_pair(by[r][s / 4], 2 * (s % 4))
                        : _mm256_permutevar8x32_ps(by[r][0], _mm256_set1_epi32(s));
                    acc[r][c][s % parts] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(run_dot(type, w, xv)), factor, acc[r][c][s % parts]);
                }
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) sums[r][c] = sum8(part_sum(acc[r][c], parts));
}
#endif

/* sums[r][c] = x8 row r . column c for `rows` (<= QUANT_ROWS_MAX) rows and `cols` columns
 * whose blocks start at col[c]; `ahead` as in quant_rows.c's tile. */
static inline __attribute__((always_inline)) void
tile8(int type, int rows, int cols, const X8 *x, int k_dim,
      const uint8_t *const col[], int64_t ahead, float sums[QUANT_ROWS_MAX][TILE_COLS_MAX]) {
#if defined(__AVX2__)
    if (type < Q4_K)
        tile8_blocks32(type, rows, cols, x, k_dim, col, ahead, sums);
    else
        tile8_k(type, rows, cols, x, k_dim, col, ahead, sums);
#else
    const int values = block_values(type), bytes = block_bytes(type);
    const int per16 = type == Q6_K, runs = k_dim / 32;
    float acc[QUANT_ROWS_MAX][TILE_COLS_MAX] = {{0}};
    float offsets[QUANT_ROWS_MAX][TILE_COLS_MAX] = {{0}};
    for (int k = 0, at = 0; k < k_dim; k += values, at += bytes) {
        prefetch_tile_ahead(col, cols, at, ahead);
        Head head[TILE_COLS_MAX];
        for (int c = 0; c < cols; c++) head_of(type, col[c] + at, &head[c]);
        for (int s = 0; s < values / 32; s++) {
            const int run = k / 32 + s, pair = type >= Q4_K ? s : 0;
            const int8_t *xq[QUANT_ROWS_MAX];
            float d[QUANT_ROWS_MAX];
            for (int r = 0; r < rows; r++) {
                xq[r] = x->q + (int64_t)r * k_dim + 32 * run;
                d[r] = x->scale[(int64_t)r * runs + run];
            }
            for (int c = 0; c < cols; c++) {
                const float *scale = head[c].scale, *offset = head[c].offset;
                int8_t wq[32];
                run_integers(type, col[c] + at, s, wq);
                for (int r = 0; r < rows; r++)
                    for (int half = 0; half < 2; half++) {
                        int sum = 0;
                        for (int i = 16 * half; i < 16 * half + 16; i++)
                            sum += (type == Q8_0 ? wq[i] : (uint8_t)wq[i]) * xq[r][i];
                        acc[r][c] += (float)sum * (scale[per16 ? 2 * s + half : pair] * d[r]);
                    }
                if (type == Q8_0) continue;
                for (int r = 0; r < rows; r++) {
                    const int64_t first = (int64_t)r * runs + run;
                    offsets[r][c] += per16
                        ? offset[2 * s] * x->half_sums[2 * first]
                              + offset[2 * s + 1] * x->half_sums[2 * first + 1]
                        : offset[pair] * x->run_sums[first];
                }
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) sums[r][c] = acc[r][c] + offsets[r][c];
#endif
}

/* Output columns [first, end) for every row of x8. */
static inline __attribute__((always_inline)) void
columns8(int type, int rows, const X8 *x, const uint8_t *w, int64_t row_bytes,
         const float *bias, void *out, int out_bf16, int k_dim, int64_t out_stride, int first,
         int end) {
    const int cols = COLS8_FOR(type, rows);
    for (int n = first; n < end; n += cols) {
        const int count = end - n < cols ? end - n : cols;
        const uint8_t *col[TILE_COLS_MAX];
        tile_columns(w, row_bytes, n, count, cols, col);
        float sums[QUANT_ROWS_MAX][TILE_COLS_MAX];
        tile8(type, rows, cols, x, k_dim, col, prefetch_distance(cols * row_bytes), sums);
        store_tile(rows, count, sums, bias, n, out, out_bf16, out_stride);
    }
}

/* at most INT8_ROWS_MAX (4) rows */
#define COLUMNS8_FUNCTION(TYPE, ROWS)                                                      \
    static __attribute__((noinline)) void columns8_##TYPE##_##ROWS(                        \
            const X8 *x, const uint8_t *w, int64_t row_bytes, const float *bias, void *out, \
            int out_bf16, int k_dim, int64_t out_stride, int first, int end) {             \
        columns8(TYPE, ROWS, x, w, row_bytes, bias, out, out_bf16, k_dim, out_stride,      \
                 first, end);                                                              \
    }
#define FORMAT_FUNCTIONS(TYPE) QUANT_ROWS_TO_4(COLUMNS8_FUNCTION, TYPE)
QUANT_FORMATS(FORMAT_FUNCTIONS)
#define COLUMNS8_CASE(TYPE, ROWS)                                                          \
    case ROWS: columns8_##TYPE##_##ROWS(x, w, row_bytes, bias, out, out_bf16, k_dim,       \
                                        out_stride, first, end); break;
#define FORMAT_CASE(TYPE)                                                                  \
    case TYPE: switch (rows) { QUANT_ROWS_TO_4(COLUMNS8_CASE, TYPE) } break;

static void columns8_of(int type, int rows, const X8 *x, const uint8_t *w, int64_t row_bytes,
                        const float *bias, void *out, int out_bf16, int k_dim,
                        int64_t out_stride, int first, int end) {
    switch (type) { QUANT_FORMATS(FORMAT_CASE) }
}

int quant8_rows_part(const float *x, const uint8_t *w, int type, const float *bias,
                     void *out, int out_bf16, int rows, int k_dim, int n_dim,
                     int64_t out_stride, int t, int threads, const float *bounds) {
    Format f;
    if (!format_of(type, &f)) return 1;
    const int cols = COLS8_FOR(type, rows), tiles = (n_dim + cols - 1) / cols;
    int first, end;
    thread_run(tiles, t, threads, bounds, &first, &end);
    first *= cols;
    end = end * cols < n_dim ? end * cols : n_dim;
    if (first >= end) return 0;
    X8 x8;
    if (!round_rows(x, rows, k_dim, &x8)) return 2;
    columns8_of(type, rows, &x8, w, (int64_t)k_dim / f.block_size * f.type_size, bias, out,
                out_bf16, k_dim, out_stride, first, end);
    free(x8.scale);
    return 0;
}
