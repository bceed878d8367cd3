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
 *
 * On AVX2, one row of x times Q4_1 with exact offsets (EXACT_OFFSETS) is factored instead
 * (tile_factored): a block's sum is d * (x . q) + m * sum(x). Each weight d * q + m is then
 * exact as a real number, so the weights are still the reference's; only the rounding of
 * the sums differs, as any order of adding them does. It spares a multiply-add per weight,
 * on the pipes that AVX2's decoding of the weights keeps busy. (One row of Q4_0, Q5_0 and
 * Q8_0 goes to quant_split.c.)
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "ggml_formats.h"
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

/* head_of for the tiles below: the K formats' scales and offsets widened and stored eight
 * at a time, which GCC's -O3 would otherwise assemble lane by lane while the tile waits. */
static inline __attribute__((always_inline)) void tile_head(int type, const uint8_t *b,
                                                            Head *h) {
#if defined(__AVX2__)
    if (type == Q6_K) {
        const __m256 d = _mm256_set1_ps(half_to_float(b + 208));
        for (int half = 0; half < 2; half++) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(b + 192 + 8 * half));
            const __m256 scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
            _mm256_storeu_ps(h->scale + 8 * half, scale);
            _mm256_storeu_ps(h->offset + 8 * half,
                             _mm256_mul_ps(_mm256_set1_ps(-32.0f), scale));
        }
        return;
    }
    if (type >= Q4_K) {
        uint64_t sc, mn;
        k_fields(b, &sc, &mn);
        const __m256 d = _mm256_set1_ps(half_to_float(b));
        const __m256 dmin = _mm256_set1_ps(half_to_float(b + 2));
        const __m256 scales =
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
        const __m256 mins =
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
        _mm256_storeu_ps(h->scale, _mm256_mul_ps(d, scales));
        /* -(dmin * m), as head_of: the product's sign flipped, which is exact */
        _mm256_storeu_ps(h->offset, _mm256_xor_ps(_mm256_mul_ps(dmin, mins),
                                                  _mm256_set1_ps(-0.0f)));
        return;
    }
#endif
    head_of(type, b, h);
}

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

/* Tiles of output columns whose sums (one vector per row and column) stay in registers.
 * On AVX2, more than one row goes to tile8, whose sums are 8 lanes each. */
#if defined(VF_AVX512)
#define ACCUMULATORS 16
#else
#define ACCUMULATORS 4
#endif
#if defined(VF_AVX2)
#define ACCUMULATORS8 8
/* One row: Q8_0 one column at a time, its weights read as one stream (see COLS8_FOR in
 * quant_int8.c); the other formats four, over which tile_factored shares x and the scales. */
#define ROW_COLS(type) ((type) == Q8_0 ? 1 : ACCUMULATORS)
#define COLS_FOR(type, rows) ((rows) == 1 ? ROW_COLS(type) : ACCUMULATORS8 / (rows) < 1 \
                              ? 1 : ACCUMULATORS8 / (rows))
#else
#define COLS_FOR(type, rows) (ACCUMULATORS / (rows) < 1 ? 1 \
                        : ACCUMULATORS / (rows) > TILE_COLS_MAX ? TILE_COLS_MAX : ACCUMULATORS / (rows))
#endif

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
 * from each column's (the next tile's) are prefetched, a line per block read (see
 * prefetch_tile_ahead), every line of a K-format block. */
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
        if (type >= Q4_K) prefetch_lines_ahead(col, cols, at, bytes, ahead);
        else prefetch_tile_ahead(col, cols, at, ahead);
        Head head[TILE_COLS_MAX];
        const float *scale[TILE_COLS_MAX], *offset[TILE_COLS_MAX];
        if (type >= Q4_K) {
            for (int c = 0; c < cols; c++) {
                tile_head(type, col[c] + at, &head[c]);
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

#if defined(VF_AVX2)
/* Weights 8 p to 8 p + 7 (p < 4) of run s of block b, as run_of gives them (the same
 * operations on 8 lanes), where the run's scale and offset are d and m; Q5_K and Q6_K go
 * through run_bytes instead. */
static inline __attribute__((always_inline)) __m256 piece_of(int type, const uint8_t *b,
                                                              __m256 d, __m256 m, int s,
                                                              int p) {
    switch (type) {
        case Q4_0: case Q4_1:
            return _mm256_fmadd_ps(d, field8(b + (type == Q4_0 ? 2 : 4) + 8 * (p % 2),
                                             4 * (p / 2), 15), m);
        case Q5_0: case Q5_1: {
            const uint8_t *qh = b + (type == Q5_0 ? 2 : 4);
            uint32_t high;
            memcpy(&high, qh, 4);
            const __m256 fifth = _mm256_and_ps(
                _mm256_castsi256_ps(avx2_lanes(high >> 8 * p & 0xFF)), _mm256_set1_ps(16.0f));
            return _mm256_fmadd_ps(
                d, _mm256_add_ps(field8(qh + 4 + 8 * (p % 2), 4 * (p / 2), 15), fifth), m);
        }
        case Q8_0:
            return _mm256_mul_ps(d, signed8(b + 2 + 8 * p));
        case Q4_K:
            return _mm256_fmadd_ps(d, field8(b + 16 + 32 * (s / 2) + 8 * p, 4 * (s % 2), 15), m);
        default:  /* Q5_K and Q6_K: their bytes joined first (run_bytes) */
            return _mm256_setzero_ps();
    }
}

/* Q5_K's and Q6_K's 32 integers q of run s of block b as unsigned bytes, the low nibble and
 * the high bits joined 32 at a time (piece_of would join them 8 at a time, in floats). */
static inline __m256i run_bytes(int type, const uint8_t *b, int s) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    if (type == Q5_K) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * (s / 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        const __m256i low = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(qs, 4) : qs, nibble);
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(1));
        return _mm256_or_si256(low, _mm256_slli_epi16(bit, 4));
    }
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * (s / 4) + 32 * (s % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * (s / 4)));
    const __m256i low = _mm256_and_si256(s % 4 / 2 ? _mm256_srli_epi16(ql, 4) : ql, nibble);
    const __m256i pair = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * (s % 4)),
                                          _mm256_set1_epi8(3));
    return _mm256_or_si256(low, _mm256_slli_epi16(pair, 4));
}

/* Bytes 8 p to 8 p + 7 of q as float32. */
static inline __m256 piece_floats(__m256i q, int p) {
    const __m128i half = p < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p % 2 ? _mm_srli_si128(half, 8) : half));
}

/* tile for 2 to QUANT_ROWS_MAX rows on AVX2: each 8 weights decoded once into one register
 * and multiplied into every row's sum, x read from memory by the multiply-adds, so that the
 * sums (8 lanes per row and column) and the weights fit AVX2's 16 registers. */
static inline __attribute__((always_inline)) void
tile8(int type, int rows, int cols, const float *x, int k_dim, const uint8_t *const col[],
      int64_t ahead, float sums[QUANT_ROWS_MAX][TILE_COLS_MAX]) {
    __m256 acc[QUANT_ROWS_MAX][TILE_COLS_MAX];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c] = _mm256_setzero_ps();
    const int values = block_values(type), bytes = block_bytes(type);
    for (int k = 0, at = 0; k < k_dim; k += values, at += bytes) {
        if (type >= Q4_K) prefetch_lines_ahead(col, cols, at, bytes, ahead);
        else prefetch_tile_ahead(col, cols, at, ahead);
        Head head[TILE_COLS_MAX];
        for (int c = 0; c < cols; c++) tile_head(type, col[c] + at, &head[c]);
        for (int s = 0; s < values / 32; s++)
            for (int c = 0; c < cols; c++) {
                const __m256i q = type >= Q5_K ? run_bytes(type, col[c] + at, s)
                                               : _mm256_setzero_si256();
                for (int p = 0; p < 4; p++) {
                    const int h = type == Q6_K ? 2 * s + p / 2 : type >= Q4_K ? s : 0;
                    const __m256 d = _mm256_set1_ps(head[c].scale[h]);
                    const __m256 m = _mm256_set1_ps(head[c].offset[h]);
                    const __m256 w = type >= Q5_K
                        ? _mm256_fmadd_ps(d, piece_floats(q, p), m)
                        : piece_of(type, col[c] + at, d, m, s, p);
                    for (int r = 0; r < rows; r++)
                        acc[r][c] = _mm256_fmadd_ps(
                            _mm256_loadu_ps(x + (int64_t)r * k_dim + k + 32 * s + 8 * p), w,
                            acc[r][c]);
                }
            }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) sums[r][c] = sum8(acc[r][c]);
}
#endif

#if defined(VF_AVX512)
/* Whether tile_one takes this format (AVX-512, one row of x; one row of Q4_K and Q6_K goes
 * to quant_split.c). */
#define ONE_ROW(type, rows) ((rows) == 1 && (type) == Q5_0)

/* sums[0][c] = x . column c for the `cols` columns at col[c], one row of x, AVX-512, in
 * Q5_0, factored: d (x . (q - 16)), the integers q - 16 looked up (q < 16 in one table,
 * q >= 16, the fifth bit set, in the other), every line of the next tiles prefetched. */
static inline __attribute__((always_inline)) void
tile_one(int type, int cols, const float *x, int k_dim, const uint8_t *const col[],
         int64_t ahead, float sums[QUANT_ROWS_MAX][TILE_COLS_MAX]) {
    __m512 acc[TILE_COLS_MAX];
    for (int c = 0; c < cols; c++) acc[c] = _mm512_setzero_ps();
    const int bytes = block_bytes(type);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 below = _mm512_sub_ps(iota, _mm512_set1_ps(16.0f));
    for (int k = 0, at = 0; k < k_dim; k += 32, at += bytes) {
        prefetch_lines_ahead(col, cols, at, bytes, ahead);
        float d[2 * TILE_COLS_MAX];
        tile_heads(col, cols, at, d);
        const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        for (int c = 0; c < cols; c++) {
            const uint8_t *b = col[c] + at;
            uint32_t fifth;
            memcpy(&fifth, b + 2, 4);
            const __m512i q = widen16(b + 6), qh = _mm512_srli_epi32(q, 4);
            const __m512 v0 = _mm512_mask_permutexvar_ps(
                _mm512_permutexvar_ps(q, below), (__mmask16)fifth, q, iota);
            const __m512 v1 = _mm512_mask_permutexvar_ps(
                _mm512_permutexvar_ps(qh, below), (__mmask16)(fifth >> 16), qh, iota);
            acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(d[2 * c]),
                                     _mm512_fmadd_ps(x1, v1, _mm512_mul_ps(x0, v0)), acc[c]);
        }
    }
    for (int c = 0; c < cols; c++) sums[0][c] = _mm512_reduce_add_ps(acc[c]);
}
#else
#define ONE_ROW(type, rows) 0
#endif

#if defined(VF_AVX2)
#if ACCUMULATORS != 4
#error "tile_factored takes at most the four columns of a one-row tile"
#endif
/* Whether tile_factored takes this format (at one row). */
#define FACTORED(type, rows) ((rows) == 1 && (type) == Q4_1)

/* 8 weights' integers q as float32, from the low or high nibbles of 8 widened bytes. */
static inline __m256 low_nibbles(__m256i bytes) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
}
static inline __m256 high_nibbles(__m256i bytes) {
    return _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
}

/* sums[0][c] = x . column c for the `cols` (1 or 4) columns at col[c] in Q4_1, one row of
 * x; xsum[b]: the sum of x's 32 values under block b. Per block and column: p = x . q (8
 * lanes), then acc += d * p; the offsets' terms m * xsum[b] of all columns go into one
 * register (the heads' lanes 2 c + 1: m of column c) and are added at the end. */
static inline __attribute__((always_inline)) void
tile_factored(int cols, const float *x, const float *xsum, int k_dim,
              const uint8_t *const col[], int64_t ahead,
              float sums[QUANT_ROWS_MAX][TILE_COLS_MAX]) {
    /* column c's sum in parts acc[parts c ...]: block b adds to part b % parts, so that
     * one column still has four chains of multiply-adds in flight */
    const int parts = 4 / cols;
    __m256 acc[4], offsets = _mm256_setzero_ps();
    for (int c = 0; c < 4; c++) acc[c] = _mm256_setzero_ps();
    const int bytes = block_bytes(Q4_1);
    /* the heads widened a block ahead, into the other of two buffers (see tile) */
    float heads[2][8] __attribute__((aligned(32)));
    __m256 head = tile_heads4(col, cols, 0, 0);
    _mm256_store_ps(heads[0], head);
    for (int k = 0, at = 0, b = 0, i = 0; k < k_dim; k += 32, at += bytes, b++, i ^= 1) {
        prefetch_tile_ahead(col, cols, at, ahead);
        offsets = _mm256_fmadd_ps(head, _mm256_broadcast_ss(xsum + b), offsets);
        if (k + 32 < k_dim) {
            head = tile_heads4(col, cols, at + bytes, 0);
            _mm256_store_ps(heads[i ^ 1], head);
        }
        __asm__("" : "+m"(heads));
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8),
                     x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        for (int c = 0; c < cols; c++) {
            /* byte j: weight j in its low nibble, weight j + 16 in its high */
            const uint8_t *q = col[c] + at + 4;
            const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
            const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)));
            __m256 p = _mm256_mul_ps(x0, low_nibbles(b0));
            p = _mm256_fmadd_ps(x1, low_nibbles(b1), p);
            p = _mm256_fmadd_ps(x2, high_nibbles(b0), p);
            p = _mm256_fmadd_ps(x3, high_nibbles(b1), p);
            acc[parts * c + b % parts] = _mm256_fmadd_ps(_mm256_broadcast_ss(&heads[i][2 * c]),
                                                         p, acc[parts * c + b % parts]);
        }
    }
    float offset[8];
    _mm256_storeu_ps(offset, offsets);
    for (int c = 0; c < cols; c++)
        sums[0][c] = sum8(part_sum(&acc[parts * c], parts)) + offset[2 * c + 1];
}
#else
#define FACTORED(type, rows) 0
#endif

/* Output columns [first, end) for every row of x; factored (tile_factored) where xsum is
 * given. */
static inline __attribute__((always_inline)) void
columns(int type, int rows, const float *x, const uint8_t *w, int64_t row_bytes,
        const float *bias, void *out, int out_bf16, int k_dim, int64_t out_stride, int first,
        int end, const float *xsum) {
    const int cols = COLS_FOR(type, rows);
    const int64_t ahead = prefetch_distance(cols * row_bytes);
    for (int n = first; n < end; n += cols) {
        const int count = end - n < cols ? end - n : cols;
        const uint8_t *col[TILE_COLS_MAX];
        tile_columns(w, row_bytes, n, count, cols, col);
        float sums[QUANT_ROWS_MAX][TILE_COLS_MAX];
#if defined(VF_AVX2)
        if (FACTORED(type, rows) && xsum != NULL)
            tile_factored(cols, x, xsum, k_dim, col, ahead, sums);
        else if (rows > 1)
            tile8(type, rows, cols, x, k_dim, col, ahead, sums);
        else
#endif
#if defined(VF_AVX512)
        if (ONE_ROW(type, rows))
            tile_one(type, cols, x, k_dim, col, ahead, sums);
        else
#endif
            tile(type, rows, cols, x, k_dim, col, ahead, sums);
        store_tile(rows, count, sums, bias, n, out, out_bf16, out_stride);
    }
}

/* the row counts quant.c sends here: QUANT_ROWS_MAX where the tiles' sums fit the
 * registers (AVX2, AVX-512), else 4 */
#if defined(VF_AVX2) || defined(VF_AVX512)
#define ROW_COUNTS QUANT_ROWS_TO_8
#else
#define ROW_COUNTS QUANT_ROWS_TO_4
#endif
#define COLUMNS_FUNCTION(TYPE, ROWS)                                                       \
    static __attribute__((noinline)) void columns_##TYPE##_##ROWS(                         \
            const float *x, const uint8_t *w, int64_t row_bytes, const float *bias,        \
            void *out, int out_bf16, int k_dim, int64_t out_stride, int first, int end,    \
            const float *xsum) {                                                           \
        columns(TYPE, ROWS, x, w, row_bytes, bias, out, out_bf16, k_dim, out_stride, first, \
                end, xsum);                                                                \
    }
#define FORMAT_FUNCTIONS(TYPE) ROW_COUNTS(COLUMNS_FUNCTION, TYPE)
QUANT_FORMATS(FORMAT_FUNCTIONS)
#define COLUMNS_CASE(TYPE, ROWS)                                                           \
    case ROWS: columns_##TYPE##_##ROWS(x, w, row_bytes, bias, out, out_bf16, k_dim,        \
                                       out_stride, first, end, xsum); break;
#define FORMAT_CASE(TYPE) case TYPE: switch (rows) { ROW_COUNTS(COLUMNS_CASE, TYPE) } break;

static void columns_of(int type, int rows, const float *x, const uint8_t *w,
                       int64_t row_bytes, const float *bias, void *out, int out_bf16,
                       int k_dim, int64_t out_stride, int first, int end, const float *xsum) {
    switch (type) { QUANT_FORMATS(FORMAT_CASE) }
}

void quant_rows_part(const float *x, const uint8_t *w, const Format *f, int exact_offsets,
                     const float *bias, void *out, int out_bf16, int rows, int k_dim,
                     int n_dim, int64_t out_stride, int t, int count, const float *bounds) {
    const int64_t row_bytes = (int64_t)k_dim / f->block_size * f->type_size;
    const int apart = SPLIT_ROWS_APART(f->type, rows);
    const int cols = COLS_FOR(f->type, apart ? 1 : rows), tiles = (n_dim + cols - 1) / cols;
    int first, end;
    thread_run(tiles, t, count, bounds, &first, &end);
    if (SPLIT_ROW(f->type, rows) || apart) {
        split_row_columns(f->type, rows, x, w, row_bytes, bias, out, out_bf16, out_stride,
                          k_dim, first * cols, end * cols < n_dim ? end * cols : n_dim);
        return;
    }
    const int factored = FACTORED(f->type, rows) && exact_offsets;
    float xsum[factored ? k_dim / 32 : 1];
    if (factored)
        for (int b = 0; b < k_dim / 32; b++) {
            float sum = 0.0f;
            for (int i = 0; i < 32; i++) sum += x[32 * b + i];
            xsum[b] = sum;
        }
    columns_of(f->type, rows, x, w, row_bytes, bias, out, out_bf16, k_dim, out_stride,
               first * cols, end * cols < n_dim ? end * cols : n_dim, factored ? xsum : NULL);
}
