/* GGML's block formats, shared by the products on them: quant.c (decoding, dispatch) and
 * quant_panels.c (a decoded tile, many rows), quant_rows.c (decoding in registers, for a few
 * rows), quant_int8.c and quant_int8_tile.c (8-bit activations, for a few rows and for many). */
#ifndef PAGEDCHAT_CPU_GGML_FORMATS_H
#define PAGEDCHAT_CPU_GGML_FORMATS_H

#include <stdint.h>
#include <string.h>

#include "vector.h"

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* GGML's type numbers, as in quant.py's FORMATS */
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

static inline float half_to_float(const uint8_t *p) {
#if defined(__F16C__)
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));  /* exact, as the branches below */
#endif
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    union { uint32_t u; float f; } v;
    if (exponent == 0) {  /* zero or subnormal: mantissa * 2^-24, exact */
        v.f = (float)mantissa * 0x1p-24f;
        v.u |= sign;
    } else if (exponent == 0x1F) {
        v.u = sign | 0x7F800000u | mantissa << 13;
    } else {
        v.u = sign | (exponent + 112) << 23 | mantissa << 13;
    }
    return v.f;
}

/* A Q4_K / Q5_K block's eight 6-bit scales and minimums, a byte each in sc and mn (scale j
 * in bits 8 j to 8 j + 7), unpacked in whole words so that they reach vector registers
 * without byte stores. */
static inline void k_fields(const uint8_t *b, uint64_t *sc, uint64_t *mn) {
    uint32_t s0, s1, s2;
    memcpy(&s0, b + 4, 4);
    memcpy(&s1, b + 8, 4);
    memcpy(&s2, b + 12, 4);
    const uint32_t sc_hi = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
    const uint32_t mn_hi = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    *sc = (uint64_t)(s0 & 0x3F3F3F3Fu) | (uint64_t)sc_hi << 32;
    *mn = (uint64_t)(s1 & 0x3F3F3F3Fu) | (uint64_t)mn_hi << 32;
}

/* Values and bytes per block (constants where the type is one). */
static inline int block_values(int type) { return type >= Q4_K ? 256 : 32; }

static inline int block_bytes(int type) {
    switch (type) {
        case Q4_0: return 18;
        case Q4_1: return 20;
        case Q5_0: return 22;
        case Q5_1: return 24;
        case Q8_0: return 34;
        case Q4_K: return 144;
        case Q5_K: return 176;
        default: return 210;
    }
}

typedef struct {
    int type, block_size, type_size;
} Format;

/* The format of GGML type `type`; 0 where it is not one of these. */
static inline int format_of(int type, Format *f) {
    switch (type) {
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: case Q4_K: case Q5_K: case Q6_K:
            *f = (Format){type, block_values(type), block_bytes(type)};
            return 1;
        default: return 0;
    }
}

/* A block's scales and offsets: weight = scale[i] * q + offset[i] for the integer q, one
 * pair per block (i = 0), per run of 32 (Q4_K, Q5_K) or per run of 16 (Q6_K). */
typedef struct {
    float scale[16], offset[16];
} Head;

static inline __attribute__((always_inline)) void head_of(int type, const uint8_t *b,
                                                          Head *h) {
    switch (type) {
        case Q4_0: case Q5_0: case Q8_0: {
            const float d = half_to_float(b);
            h->scale[0] = d;
            h->offset[0] = type == Q4_0 ? -8.0f * d : type == Q5_0 ? -16.0f * d : 0.0f;
            break;
        }
        case Q4_1: case Q5_1:
            h->scale[0] = half_to_float(b);
            h->offset[0] = half_to_float(b + 2);
            break;
        case Q4_K: case Q5_K: {
            const float d = half_to_float(b), dmin = half_to_float(b + 2);
            uint64_t sc, mn;
            k_fields(b, &sc, &mn);
            for (int i = 0; i < 8; i++) {
                h->scale[i] = d * (float)(uint8_t)(sc >> 8 * i);
                h->offset[i] = -(dmin * (float)(uint8_t)(mn >> 8 * i));
            }
            break;
        }
        default: {
            const float d = half_to_float(b + 208);
            for (int i = 0; i < 16; i++) {
                h->scale[i] = d * (float)(int8_t)b[192 + i];
                h->offset[i] = -32.0f * h->scale[i];
            }
        }
    }
}

/* The most rows of x quant_rows_part takes (quant.c's product sends it those). */
#define QUANT_ROWS_MAX 8

/* The most output columns a tile of the few-row products (quant_rows.c, quant_int8.c)
 * takes at once. */
#define TILE_COLS_MAX 8

/* The columns of the tile of `cols` output columns at n, `count` of them real: a short last
 * tile repeats its last column. */
static inline void tile_columns(const uint8_t *w, int64_t row_bytes, int n, int count,
                                int cols, const uint8_t *col[TILE_COLS_MAX]) {
    for (int c = 0; c < cols; c++)
        col[c] = w + (int64_t)(n + (c < count ? c : count - 1)) * row_bytes;
}

#if defined(__F16C__)
/* The first four bytes of the blocks at `at` of columns 4 half to 4 half + 3 of a tile of
 * `cols` (the first again past the last), as two float16 values each, widened exactly:
 * column 4 half + c's in lanes 2 c and 2 c + 1. The bytes are gathered in registers: stores
 * of two bytes each, read back by one wide load, would hold that load until they retire. */
static inline __m256 tile_heads4(const uint8_t *const col[], int cols, int at, int half) {
    int32_t heads[4];
    for (int c = 0; c < 4; c++)
        memcpy(&heads[c], col[4 * half + (4 * half + c < cols ? c : 0)] + at, 4);
    return _mm256_cvtph_ps(_mm_setr_epi32(heads[0], heads[1], heads[2], heads[3]));
}
#endif

/* The two float16 values that open each of a tile's blocks at `at`, as float32, exactly (as
 * half_to_float): a block's scale, then its minimum in Q4_1 and Q5_1 (in the other formats
 * of one scale per block the second is two bytes of weights, which go unused), column c's
 * at out[2 c] and out[2 c + 1]. */
static inline void tile_heads(const uint8_t *const col[], int cols, int at,
                              float out[2 * TILE_COLS_MAX]) {
#if defined(__F16C__)
    for (int half = 0; half < (cols + 3) / 4; half++)
        _mm256_storeu_ps(out + 8 * half, tile_heads4(col, cols, at, half));
#else
    for (int c = 0; c < cols; c++) {
        out[2 * c] = half_to_float(col[c] + at);
        out[2 * c + 1] = half_to_float(col[c] + at + 2);
    }
#endif
}

/* Block `at` of each column of a tile further on (`ahead` bytes on from col[c]: see
 * prefetch_distance), prefetched into the second cache level (prefetcht1): a tile's columns
 * are streams too many for the hardware's prefetcher to follow, and a prefetch into the
 * first level holds one of that level's few miss buffers until its line comes, so that
 * those buffers, not the memory, set the rate. */
static inline void prefetch_tile_ahead(const uint8_t *const col[], int cols, int at,
                                       int64_t ahead) {
    for (int c = 0; c < cols; c++) __builtin_prefetch(col[c] + at + ahead, 0, 2);
}

/* How far ahead a few-row product's tiles of `tile_bytes` bytes (their columns' rows, which
 * lie one after the other) are prefetched: whole tiles, the nearest count to 4 KiB, at
 * least one. A narrow tile's next one comes too soon for memory to deliver it. */
static inline int64_t prefetch_distance(int64_t tile_bytes) {
    const int64_t tiles = (4096 + tile_bytes / 2) / tile_bytes;
    return tile_bytes * (tiles < 1 ? 1 : tiles);
}

/* A tile's sums (+ bias) into columns [n, n + count) of out's rows: float32, or bfloat16
 * where out_bf16. */
static inline void store_tile(int rows, int count, float sums[QUANT_ROWS_MAX][TILE_COLS_MAX],
                              const float *bias, int n, void *out, int out_bf16,
                              int64_t out_stride) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < count; c++) {
            const float y = sums[r][c] + (bias ? bias[n + c] : 0.0f);
            const int64_t at = (int64_t)r * out_stride + n + c;
            if (out_bf16) ((bf16_t *)out)[at] = bf16_round(y);
            else ((float *)out)[at] = y;
        }
}

/* Every cache line of the blocks at `at` of the tile's columns, `ahead` bytes on (see
 * prefetch_tile_ahead): a K-format block spans three or four lines. */
static inline void prefetch_lines_ahead(const uint8_t *const col[], int cols, int at,
                                        int bytes, int64_t ahead) {
    for (int c = 0; c < cols; c++)
        for (int line = 0; line < bytes; line += 64)
            __builtin_prefetch(col[c] + at + ahead + line, 0, 2);
}

/* F(TYPE) for every format the products take; F(TYPE, ROWS) for `rows` from 1 to 4, or 8.
 * The few-row products (quant_rows.c, quant_int8.c) have a function per format and row
 * count, both constants that fold into the tile's loops, called from a switch on both: one
 * function holding every case's inlined tiles takes GCC several times as long to compile,
 * as its passes grow faster than a function's size. They (with quant_split.c, and
 * quant_int8_tile.c) are built one format to a library, as a model first needs the format
 * (the 8-bit ones apart): build.py defines QUANT_FORMATS as that format alone and hands the
 * library's functions to quant.c (set_products), so that a first start compiles only what
 * its model multiplies. */
#ifndef QUANT_FORMATS
#define QUANT_FORMATS(F) F(Q4_0) F(Q4_1) F(Q5_0) F(Q5_1) F(Q8_0) F(Q4_K) F(Q5_K) F(Q6_K)
#endif
#define QUANT_ROWS_TO_4(F, TYPE) F(TYPE, 1) F(TYPE, 2) F(TYPE, 3) F(TYPE, 4)
#define QUANT_ROWS_TO_8(F, TYPE)                                                           \
    QUANT_ROWS_TO_4(F, TYPE) F(TYPE, 5) F(TYPE, 6) F(TYPE, 7) F(TYPE, 8)

/* A flag on a type number: x is rounded to 8-bit integers per run of 32 and multiplied in
 * integers (quant_int8.h), at any row count. */
#define INT8_ACTIVATIONS 0x100
/* A flag on a Q4_1 type number: the loader found every block's d * q + m exact in float32
 * (kernels/quant.py, Segment.exact_offsets), so a product may take a block's sum as
 * d * (x . q) + m * sum(x) and multiply by the very weights the reference gives. */
#define EXACT_OFFSETS 0x200
#define TYPE_FLAGS (INT8_ACTIVATIONS | EXACT_OFFSETS)

/* Thread t's run [*first, *end) of `count` items split among a team of `team`: equal runs
 * where bounds is NULL, else the run between the fractions bounds[t] and bounds[t + 1]
 * (0 = bounds[0] <= bounds[1] <= ... <= bounds[team] = 1), rounded the same way for the
 * thread whose run ends there and the one whose run starts there. */
static inline void thread_run(int count, int t, int team, const float *bounds, int *first,
                              int *end) {
    if (bounds == NULL) {
        *first = (int)((int64_t)count * t / team);
        *end = (int)((int64_t)count * (t + 1) / team);
        return;
    }
    *first = t == 0 ? 0 : (int)(count * (double)bounds[t] + 0.5);
    *end = t == team - 1 ? count : (int)(count * (double)bounds[t + 1] + 0.5);
}

/* Thread t of a team of `count`: its run (see thread_run for bounds) of the tiles of output
 * columns of out[m][n] (row stride out_stride; float32, or bfloat16 where out_bf16) =
 * x[m] . W[n] (+ bias[n]) for rows <= QUANT_ROWS_MAX rows of x (float32 [rows, k_dim]) and
 * W's n_dim rows of format f; exact_offsets as the EXACT_OFFSETS flag says. */
typedef void RowsProduct(const float *x, const uint8_t *w, const Format *f, int exact_offsets,
                         const float *bias, void *out, int out_bf16, int rows, int k_dim,
                         int n_dim, int64_t out_stride, int t, int count, const float *bounds);
RowsProduct quant_rows_part;

#if defined(__AVX2__)
/* byte i: 16 where bit i of the 32 bits at p is set, else 0 (a fifth bit) */
static inline __m256i fifth_bit_bytes(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(  /* byte i holds byte i / 8 of the bits */
        _mm256_set1_epi32((int)bits),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

/* The 32 unsigned integers q of a Q4_0, Q4_1, Q5_0 or Q5_1 block at b, byte i weight i. */
static inline __m256i block32_bytes(int type, const uint8_t *b) {
    const int head = type == Q4_0 ? 2 : type == Q4_1 ? 4 : type == Q5_0 ? 6 : 8;
    /* the 16 bytes twice; the upper copy's high nibbles are weights 16..31 */
    const __m256i twice = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + head)));
    const __m256i q = _mm256_and_si256(
        _mm256_srlv_epi32(twice, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
    return type <= Q4_1 ? q : _mm256_or_si256(q, fifth_bit_bytes(b + head - 4));
}
#endif

/* Output columns [first, end) of out[m][n] = x[m] . W[n] (+ bias[n]) for `rows` rows of x
 * taken one at a time (one, or a few: SPLIT_ROWS_APART) and W in Q4_K or Q6_K, on AVX2 also
 * Q4_0, Q5_0 and Q8_0, on AVX-512 Q8_0 where VNNI is (row_bytes bytes a row), with x split
 * into three 8-bit terms (quant_split.c): where decode steps take them. */
void split_row_columns(int type, int rows, const float *x, const uint8_t *w,
                       int64_t row_bytes, const float *bias, void *out, int out_bf16,
                       int64_t out_stride, int k_dim, int first, int end);
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SPLIT_ROW(type, rows) ((rows) == 1 && ((type) == Q4_K || (type) == Q6_K \
                                               || (type) == Q8_0))
#elif defined(__AVX512BW__)
#define SPLIT_ROW(type, rows) ((rows) == 1 && ((type) == Q4_K || (type) == Q6_K))
#elif defined(__AVX2__)
#define SPLIT_ROW(type, rows) ((rows) == 1 && ((type) == Q4_K || (type) == Q6_K \
                                               || (type) == Q4_0 || (type) == Q5_0 \
                                               || (type) == Q8_0))
#else
#define SPLIT_ROW(type, rows) 0
#endif
/* A few rows of x that the one-row integer products take one at a time, over runs of
 * columns that stay in the cache for the rows after the first: up to APART_MAX(type) rows,
 * where that beats the register tiles, which decode each weight to float (0: never; on
 * AVX-512, Q4_K's tiles already keep pace). */
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define APART_MAX(type) ((type) == Q6_K ? 3 : 0)
#elif defined(__AVX512BW__)
#define APART_MAX(type) ((type) == Q6_K ? 2 : 0)
#elif defined(__AVX2__) && defined(__AVXVNNI__)
#define APART_MAX(type) ((type) == Q4_K ? 4 : (type) == Q6_K || (type) == Q5_0 ? 2 : 0)
#elif defined(__AVX2__)
#define APART_MAX(type) ((type) == Q4_K || (type) == Q6_K || (type) == Q5_0 ? 2 : 0)
#else
#define APART_MAX(type) 0
#endif
#define SPLIT_ROWS_APART(type, rows) ((rows) >= 2 && (rows) <= APART_MAX(type))

/* The most rows the 8-bit products take in registers (quant_int8.c); more go to byte tiles
 * (quant_int8_tile.c), which only more rows pay for packing. */
#define INT8_ROWS_MAX 4

/* quant_rows_part's contract, with x rounded to 8 bits (quant_int8.c); type without the
 * flag. Returns 0, 1 for an unknown type, 2 when out of memory. */
typedef int Int8Product(const float *x, const uint8_t *w, int type, const float *bias,
                        void *out, int out_bf16, int rows, int k_dim, int n_dim,
                        int64_t out_stride, int t, int threads, const float *bounds);
Int8Product quant8_rows_part;
/* The same for any row count, in byte tiles (quant_int8_tile.c): for more than
 * INT8_ROWS_MAX rows. */
Int8Product quant8_tile_part;

/* One format's few-row products, from the format's own library (see QUANT_FORMATS). */
typedef struct {
    RowsProduct *rows;
    Int8Product *rows8, *tile8;
} Products;
/* The products of `type`, or NULL until set_products (quant.c) has those its flags ask for
 * (INT8_ACTIVATIONS: rows8 and tile8, else rows). */
const Products *products_of(int type);

/* out[0, k_dim) = one row of W's blocks decoded to float32, k_dim a multiple of the
 * format's block size (quant.c). */
void decode_row(const Format *f, const uint8_t *row, int k_dim, float *out);

/* Thread t's share of a product (quant_product_part's contract, x float32) of more rows of
 * x than the few-row products take, decoding W's rows into a scratch (quant_panels.c);
 * rows at least panel_rows_min(), or any count in formats below Q4_K. */
int panel_product_part(const float *x, const uint8_t *w, const Format *f, const float *bias,
                       void *out, int out_bf16, int rows, int k_dim, int n_dim,
                       int64_t out_stride, int t, int threads, const float *bounds);
/* The fewest rows of x a packed panel takes: fewer take dot products. */
int panel_rows_min(void);

/* The output `at` elements on (float32, or bfloat16 where out_bf16). */
static inline void *out_at(void *out, int out_bf16, int64_t at) {
    return out_bf16 ? (void *)((bf16_t *)out + at) : (void *)((float *)out + at);
}

#endif
