/* Products on GGML blocks for a few rows of x (a decode step): each run of 32 weights is
 * decoded in registers and multiplied into the sums at once, with no scratch tile, for
 * several columns of W at a time, so that x's vectors, loaded once per run, serve them all.
 *
 * Every weight is exactly the float32 the reference (quant.py) gives. Where the reference
 * multiplies a scale by an integer and then adds an offset, that product is exact in
 * float32 (a float16's 11-bit significand, or a K-format's scale of at most 18 bits, times
 * an integer of at most 8 bits), so one fused multiply-add, rounding once, rounds the same
 * sum the reference's addition rounds. A weight of zero may be +0 where the reference's is
 * -0, which no sum begun at +0 can tell. The sums of the products are in another order
 * than quant.c's.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"
#include "vector.h"

/* 16 lanes from 16 bytes at p: ((p[i] >> shift) & mask) as float32; the signed bytes as
 * float32; and 16 where bit i of `bits` is set, else 0 (the fifth bit of Q5_0 / Q5_1). */
#if defined(VF_AVX512)
static inline __m512i widen16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline vf field16(const uint8_t *p, int shift, int mask) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(widen16(p), shift),
                                               _mm512_set1_epi32(mask)));
}
static inline vf signed16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline vf sixteens(uint32_t bits) {
    return _mm512_maskz_mov_ps((__mmask16)bits, _mm512_set1_ps(16.0f));
}
#elif defined(VF_AVX2)
static inline __m256 field8(const uint8_t *p, int shift, int mask) {
    __m256i b = _mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)),
                                  shift);
    /* where the shift leaves no bits above the mask (a high nibble), the mask is skipped */
    if ((0xFF >> shift) & ~mask) b = _mm256_and_si256(b, _mm256_set1_epi32(mask));
    return _mm256_cvtepi32_ps(b);
}
static inline vf field16(const uint8_t *p, int shift, int mask) {
    return (vf){field8(p, shift, mask), field8(p + 8, shift, mask)};
}
static inline __m256 signed8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf signed16(const uint8_t *p) { return (vf){signed8(p), signed8(p + 8)}; }
static inline vf sixteens(uint32_t bits) {
    const __m256 s = _mm256_set1_ps(16.0f);
    return (vf){_mm256_and_ps(_mm256_castsi256_ps(avx2_lanes(bits & 0xFF)), s),
                _mm256_and_ps(_mm256_castsi256_ps(avx2_lanes(bits >> 8 & 0xFF)), s)};
}
#else
static inline vf field16(const uint8_t *p, int shift, int mask) {
    vf r;
    for (int i = 0; i < 16; i++) r.f[i] = (float)((p[i] >> shift) & mask);
    return r;
}
static inline vf signed16(const uint8_t *p) {
    vf r;
    for (int i = 0; i < 16; i++) r.f[i] = (float)(int8_t)p[i];
    return r;
}
static inline vf sixteens(uint32_t bits) {
    vf r;
    for (int i = 0; i < 16; i++) r.f[i] = bits >> i & 1 ? 16.0f : 0.0f;
    return r;
}
#endif

/* The 32 weights of run s of block b (w[0]: its first 16, w[1]: the rest), given the
 * block's scales and offsets (laid out as in Head). */
static inline __attribute__((always_inline)) void run_of(int type, const uint8_t *b,
                                                         const float *scale,
                                                         const float *offset, int s,
                                                         vf w[2]) {
    switch (type) {
        case Q4_0: case Q4_1: {
            const uint8_t *qs = b + (type == Q4_0 ? 2 : 4);
#if defined(VF_AVX512)
            /* sixteen values a nibble can take, then one lookup per 16 weights */
            const vf table = vf_fmadd(vf_set1(scale[0]), _mm512_setr_ps(
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), vf_set1(offset[0]));
            const __m512i q = widen16(qs);
            w[0] = _mm512_permutexvar_ps(q, table);
            w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
#else
            const vf d = vf_set1(scale[0]), m = vf_set1(offset[0]);
            w[0] = vf_fmadd(d, field16(qs, 0, 15), m);
            w[1] = vf_fmadd(d, field16(qs, 4, 15), m);
#endif
            break;
        }
        case Q5_0: case Q5_1: {
            const uint8_t *qh = b + (type == Q5_0 ? 2 : 4), *qs = qh + 4;
            const uint32_t high = (uint32_t)qh[0] | (uint32_t)qh[1] << 8
                                  | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
            const vf d = vf_set1(scale[0]), m = vf_set1(offset[0]);
            w[0] = vf_fmadd(d, vf_add(field16(qs, 0, 15), sixteens(high & 0xFFFF)), m);
            w[1] = vf_fmadd(d, vf_add(field16(qs, 4, 15), sixteens(high >> 16)), m);
            break;
        }
        case Q8_0: {
            const vf d = vf_set1(scale[0]);
            w[0] = vf_mul(d, signed16(b + 2));
            w[1] = vf_mul(d, signed16(b + 18));
            break;
        }
        case Q4_K: {
            const uint8_t *qs = b + 16 + 32 * (s / 2);
#if defined(VF_AVX512)
            const vf table = vf_fmadd(vf_set1(scale[s]), _mm512_setr_ps(
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), vf_set1(offset[s]));
            w[0] = _mm512_permutexvar_ps(_mm512_srli_epi32(widen16(qs), 4 * (s % 2)), table);
            w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(widen16(qs + 16), 4 * (s % 2)),
                                         table);
#else
            const vf d = vf_set1(scale[s]), m = vf_set1(offset[s]);
            w[0] = vf_fmadd(d, field16(qs, 4 * (s % 2), 15), m);
            w[1] = vf_fmadd(d, field16(qs + 16, 4 * (s % 2), 15), m);
#endif
            break;
        }
        case Q5_K: {
            const uint8_t *qs = b + 48 + 32 * (s / 2), *qh = b + 16;
            const vf d = vf_set1(scale[s]), m = vf_set1(offset[s]), sixteen = vf_set1(16);
            for (int half = 0; half < 2; half++)
                w[half] = vf_fmadd(d, vf_fmadd(field16(qh + 16 * half, s, 1), sixteen,
                                               field16(qs + 16 * half, 4 * (s % 2), 15)), m);
            break;
        }
        default: {  /* Q6_K: see decode_q6_k in quant.c for where each value's bits lie */
            const uint8_t *ql = b + 64 * (s / 4) + 32 * (s % 2), *qh = b + 128 + 32 * (s / 4);
            const vf sixteen = vf_set1(16);
            for (int half = 0; half < 2; half++) {
                const vf q = vf_fmadd(field16(qh + 16 * half, 2 * (s % 4), 3), sixteen,
                                      field16(ql + 16 * half, 4 * (s % 4 / 2), 15));
                w[half] = vf_fmadd(vf_set1(scale[2 * s + half]), q,
                                   vf_set1(offset[2 * s + half]));
            }
        }
    }
}

/* Tiles of output columns whose sums (one vector per row and column) stay in registers. */
#if defined(VF_AVX512)
#define ACCUMULATORS 16
#else
#define ACCUMULATORS 4
#endif
#define COLS_FOR(rows) (ACCUMULATORS / (rows) < 1 ? 1 \
                        : ACCUMULATORS / (rows) > TILE_COLS_MAX ? TILE_COLS_MAX : ACCUMULATORS / (rows))

/* The scales and offsets of the blocks at col[c] + at for `cols` columns, in the formats
 * of one scale per block (Q4_0 to Q8_0): column c's scale at scales[2 c], offsets[c]
 * pointing at its offset (in scales or products). Their float16 values are widened
 * together (tile_heads) to the values head_of gives; and they are left in memory, so that
 * each of their broadcasts is a load rather than a shuffle on the port that decoding the
 * weights keeps busy. */
static inline __attribute__((always_inline)) void
block_scales(int type, int cols, const uint8_t *const col[], int at,
             float scales[2 * TILE_COLS_MAX], const float *offsets[TILE_COLS_MAX],
             float products[2 * TILE_COLS_MAX]) {
    const int with_min = type == Q4_1 || type == Q5_1;
    tile_heads(col, cols, at, scales);
    const float factor = type == Q4_0 ? -8.0f : type == Q5_0 ? -16.0f : 0.0f;
    for (int i = 0; i < 2 * cols; i++) products[i] = factor * scales[i];
    for (int c = 0; c < cols; c++) offsets[c] = with_min ? &scales[2 * c + 1] : &products[2 * c];
    __asm__("" : "+m"(*(float(*)[2 * TILE_COLS_MAX])scales),
                 "+m"(*(float(*)[2 * TILE_COLS_MAX])products));
}

/* sums[r][c] = x[r] . column c, for `cols` columns whose blocks start at col[c]. Inlined
 * per format and row count, so that both fold into the loops. The blocks `ahead` bytes on
 * from each column's (the next tile's) are prefetched, a block per block read (see
 * prefetch_next_tile). */
static inline __attribute__((always_inline)) void
tile(int type, int rows, int cols, const float *x, int k_dim, const uint8_t *const col[],
     int64_t ahead, float sums[QUANT_ROWS_MAX][TILE_COLS_MAX]) {
    vf acc[QUANT_ROWS_MAX][TILE_COLS_MAX];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c] = vf_zero();
    const int values = block_values(type), bytes = block_bytes(type);
    /* the one-scale formats' scales are widened a block ahead, into the other of two
     * buffers, so that their stores are done by the time the broadcasts load them */
    float scales[2][2 * TILE_COLS_MAX], products[2][2 * TILE_COLS_MAX];
    const float *offsets[2][TILE_COLS_MAX];
    if (type < Q4_K) block_scales(type, cols, col, 0, scales[0], offsets[0], products[0]);
    for (int k = 0, at = 0, i = 0; k < k_dim; k += values, at += bytes, i ^= 1) {
        prefetch_next_tile(col, cols, at, ahead);
        Head head[TILE_COLS_MAX];
        const float *scale[TILE_COLS_MAX], *offset[TILE_COLS_MAX];
        if (type >= Q4_K) {
            for (int c = 0; c < cols; c++) {
                head_of(type, col[c] + at, &head[c]);
                scale[c] = head[c].scale;
                offset[c] = head[c].offset;
            }
        } else {
            if (k + values < k_dim)
                block_scales(type, cols, col, at + bytes, scales[i ^ 1], offsets[i ^ 1],
                             products[i ^ 1]);
            for (int c = 0; c < cols; c++) {
                scale[c] = &scales[i][2 * c];
                offset[c] = offsets[i][c];
            }
        }
        for (int s = 0; s < values / 32; s++) {
            vf xv[QUANT_ROWS_MAX][2];
            for (int r = 0; r < rows; r++) {
                xv[r][0] = vf_load(x + (int64_t)r * k_dim + k + 32 * s);
                xv[r][1] = vf_load(x + (int64_t)r * k_dim + k + 32 * s + 16);
            }
            for (int c = 0; c < cols; c++) {
                vf w[2];
                run_of(type, col[c] + at, scale[c], offset[c], s, w);
                for (int r = 0; r < rows; r++)
                    acc[r][c] = vf_fmadd(xv[r][1], w[1], vf_fmadd(xv[r][0], w[0], acc[r][c]));
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) sums[r][c] = vf_reduce_add(acc[r][c]);
}

/* Output columns [first, end) for every row of x. */
static inline __attribute__((always_inline)) void
columns(int type, int rows, const float *x, const uint8_t *w, int64_t row_bytes,
        const float *bias, void *out, int out_bf16, int k_dim, int64_t out_stride, int first,
        int end) {
    const int cols = COLS_FOR(rows);
    for (int n = first; n < end; n += cols) {
        const int count = end - n < cols ? end - n : cols;
        const uint8_t *col[TILE_COLS_MAX];
        tile_columns(w, row_bytes, n, count, cols, col);
        float sums[QUANT_ROWS_MAX][TILE_COLS_MAX];
        tile(type, rows, cols, x, k_dim, col, cols * row_bytes, sums);
        store_tile(rows, count, sums, bias, n, out, out_bf16, out_stride);
    }
}

static void columns_of(int type, int rows, const float *x, const uint8_t *w,
                       int64_t row_bytes, const float *bias, void *out, int out_bf16,
                       int k_dim, int64_t out_stride, int first, int end) {
    switch (type) {
        QUANT_TYPE_CASES(columns)
    }
}

void quant_rows_part(const float *x, const uint8_t *w, const Format *f, const float *bias,
                     void *out, int out_bf16, int rows, int k_dim, int n_dim,
                     int64_t out_stride, int t, int count, const float *bounds) {
    const int64_t row_bytes = (int64_t)k_dim / f->block_size * f->type_size;
    const int cols = COLS_FOR(rows), tiles = (n_dim + cols - 1) / cols;
    int first, end;
    thread_run(tiles, t, count, bounds, &first, &end);
    columns_of(f->type, rows, x, w, row_bytes, bias, out, out_bf16, k_dim, out_stride,
               first * cols, end * cols < n_dim ? end * cols : n_dim);
}
