/* Products and embedding lookups on weights kept in GGML's block formats (see quant.py):
 * y = x W^T (+ b) where W's rows are decoded from their blocks as the product reads them.
 *
 * Every weight decodes to exactly the float32 the torch reference (quant.py, itself equal
 * to gguf-py) gives: a scale times the integer, rounded, then the offset added, rounded.
 * That is two operations, never one fused multiply-add, so this file must not let the
 * compiler contract them (the pragma below; cpu.py builds with -ffast-math). The sums of
 * the products may be in any order, as in every other product of this backend.
 *
 * A few rows of x (at most FEW_ROWS, below: a decode step; in the K formats any count too
 * small for a panel, in passes) go to quant_rows.c, which decodes in registers; more go to
 * quant_panels.c, which decodes rows of W here (decode_row) into a float32 scratch.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ggml_formats.h"
#include "vector.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
#include <immintrin.h>
#endif

/* out[j] = d * q[j] (+ m where has_offset) for n integers, n a multiple of 16; the
 * product rounded before the sum, as the reference computes it. */
static inline void scale_values(const int8_t *q, int n, float d, float m, int has_offset,
                                float *out) {
#if defined(__AVX512F__)
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
    for (int j = 0; j < n; j += 16) {
        const __m512 qf = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + j))));
        __m512 y = _mm512_mul_ps(dv, qf);
        if (has_offset) y = _mm512_add_ps(y, mv);
        _mm512_storeu_ps(out + j, y);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    for (int j = 0; j < n; j += 8) {
        const __m256 qf = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + j))));
        __m256 y = _mm256_mul_ps(dv, qf);
        if (has_offset) y = _mm256_add_ps(y, mv);
        _mm256_storeu_ps(out + j, y);
    }
#else
    for (int j = 0; j < n; j++) {
        float y = d * (float)q[j];
        if (has_offset) y = y + m;
        out[j] = y;
    }
#endif
}

/* out[j] = d * (((bytes[j] >> shift) & mask | high_j << 4) - sub) (+ m where has_offset)
 * for j < n, n a multiple of 16, where high_j is ((high[j] >> high_shift) & high_mask),
 * or 0 without `high`: the runs of the 4-bit formats, of the 5-bit ones (one high bit) and
 * of Q6_K (two), unpacked in registers. */
static inline void scale_fields(const uint8_t *bytes, int shift, int mask,
                                const uint8_t *high, int high_shift, int high_mask, int sub,
                                int n, float d, float m, int has_offset, float *out) {
#if defined(__AVX512F__)
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
    for (int j = 0; j < n; j += 16) {
        __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(bytes + j)));
        q = _mm512_and_si512(_mm512_srli_epi32(q, shift), _mm512_set1_epi32(mask));
        if (high) {
            __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(high + j)));
            h = _mm512_and_si512(_mm512_srli_epi32(h, high_shift), _mm512_set1_epi32(high_mask));
            q = _mm512_or_si512(q, _mm512_slli_epi32(h, 4));
        }
        q = _mm512_sub_epi32(q, _mm512_set1_epi32(sub));
        __m512 y = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(q));
        if (has_offset) y = _mm512_add_ps(y, mv);
        _mm512_storeu_ps(out + j, y);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    for (int j = 0; j < n; j += 8) {
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bytes + j)));
        q = _mm256_and_si256(_mm256_srli_epi32(q, shift), _mm256_set1_epi32(mask));
        if (high) {
            __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(high + j)));
            h = _mm256_and_si256(_mm256_srli_epi32(h, high_shift), _mm256_set1_epi32(high_mask));
            q = _mm256_or_si256(q, _mm256_slli_epi32(h, 4));
        }
        q = _mm256_sub_epi32(q, _mm256_set1_epi32(sub));
        __m256 y = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(q));
        if (has_offset) y = _mm256_add_ps(y, mv);
        _mm256_storeu_ps(out + j, y);
    }
#else
    for (int j = 0; j < n; j++) {
        int q = (bytes[j] >> shift) & mask;
        if (high) q |= ((high[j] >> high_shift) & high_mask) << 4;
        float y = d * (float)(q - sub);
        if (has_offset) y = y + m;
        out[j] = y;
    }
#endif
}

/* One block of each format to float32 (32 values, 256 for the K formats). */
static inline void decode_q4_0(const uint8_t *b, float *out) {
    const float d = half_to_float(b);
    scale_fields(b + 2, 0, 15, NULL, 0, 0, 8, 16, d, 0.0f, 0, out);
    scale_fields(b + 2, 4, 15, NULL, 0, 0, 8, 16, d, 0.0f, 0, out + 16);
}

static inline void decode_q4_1(const uint8_t *b, float *out) {
    const float d = half_to_float(b), m = half_to_float(b + 2);
    scale_fields(b + 4, 0, 15, NULL, 0, 0, 0, 16, d, m, 1, out);
    scale_fields(b + 4, 4, 15, NULL, 0, 0, 0, 16, d, m, 1, out + 16);
}

/* Q5_0 (offset 0: d, qh, qs) and Q5_1 (d, m, qh, qs): the fifth bit of value j is bit j
 * of qh, spread to a byte per value first. */
static inline void decode_q5(const uint8_t *b, float *out, int with_min) {
    const uint8_t *qh = b + (with_min ? 4 : 2);
    const uint32_t high = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16
                          | (uint32_t)qh[3] << 24;
    uint8_t fifth[32];
    for (int j = 0; j < 32; j++) fifth[j] = (uint8_t)(high >> j & 1);
    const float d = half_to_float(b), m = with_min ? half_to_float(b + 2) : 0.0f;
    const int sub = with_min ? 0 : 16;
    scale_fields(qh + 4, 0, 15, fifth, 0, 1, sub, 16, d, m, with_min, out);
    scale_fields(qh + 4, 4, 15, fifth + 16, 0, 1, sub, 16, d, m, with_min, out + 16);
}

static inline void decode_q5_0(const uint8_t *b, float *out) { decode_q5(b, out, 0); }
static inline void decode_q5_1(const uint8_t *b, float *out) { decode_q5(b, out, 1); }

static inline void decode_q8_0(const uint8_t *b, float *out) {
    int8_t q[32];
    memcpy(q, b + 2, 32);
    scale_values(q, 32, half_to_float(b), 0.0f, 0, out);
}

/* Q4_K (d, dmin, scales, qs) and Q5_K (d, dmin, scales, qh, qs): eight runs of 32, each
 * (d * scale) * q - (dmin * min). */
static inline void decode_k(const uint8_t *b, float *out, int five) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    uint64_t sc, mn;
    k_fields(b, &sc, &mn);
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int i = 0; i < 8; i++)  /* run i: nibble i % 2 of qs[32 (i / 2) + j], bit i of qh[j] */
        scale_fields(qs + 32 * (i / 2), 4 * (i % 2), 15, five ? qh : NULL, i, 1, 0, 32,
                     d * (float)(uint8_t)(sc >> 8 * i), -(dmin * (float)(uint8_t)(mn >> 8 * i)), 1,
                     out + 32 * i);
}

static inline void decode_q4_k(const uint8_t *b, float *out) { decode_k(b, out, 0); }
static inline void decode_q5_k(const uint8_t *b, float *out) { decode_k(b, out, 1); }

/* Q6_K (ql, qh, scales, d): value v = 128 h + r takes its low four bits from
 * ql[64 h + r % 64] (nibble r / 64), its high two from qh[32 h + r % 32] (pair r / 32),
 * less 32, times d * scales[v / 16]. */
static inline void decode_q6_k(const uint8_t *b, float *out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    const float d = half_to_float(b + 208);
    for (int v = 0; v < 256; v += 16) {
        const int h = v / 128, r = v % 128;
        scale_fields(ql + 64 * h + r % 64, 4 * (r / 64), 15, qh + 32 * h + r % 32,
                     2 * (r / 32), 3, 32, 16, d * (float)scales[v / 16], 0.0f, 0, out + v);
    }
}

/* See ggml_formats.h: the format picked once per row so each block's decoding is inlined
 * into its loop. */
#define DECODE_LOOP(DECODE)                                                                \
    for (int k = 0, at = 0; k < k_dim; k += f->block_size, at += f->type_size)             \
        DECODE(row + at, out + k);                                                         \
    break;

void decode_row(const Format *f, const uint8_t *row, int k_dim, float *out) {
    switch (f->type) {
        case Q4_0: DECODE_LOOP(decode_q4_0)
        case Q4_1: DECODE_LOOP(decode_q4_1)
        case Q5_0: DECODE_LOOP(decode_q5_0)
        case Q5_1: DECODE_LOOP(decode_q5_1)
        case Q8_0: DECODE_LOOP(decode_q8_0)
        case Q4_K: DECODE_LOOP(decode_q4_k)
        case Q5_K: DECODE_LOOP(decode_q5_k)
        default: DECODE_LOOP(decode_q6_k)
    }
}

/* The most rows the exact products send to quant_rows.c, whose tiles keep every row's sums
 * in registers (on AVX2 tile8's): up to QUANT_ROWS_MAX on AVX2 and AVX-512, 4 on the
 * portable level. */
#if defined(VF_AVX2) || defined(VF_AVX512)
#define FEW_ROWS QUANT_ROWS_MAX
/* Rows too few for a panel (panel_rows_min) would take dot products; in the K formats the
 * few-row tiles are faster, even taken in several passes. */
#define IN_PASSES(type, rows) ((type) >= Q4_K && (rows) < panel_rows_min())
#else
#define FEW_ROWS 4
#define IN_PASSES(type, rows) 0
#endif

/* Each format's few-row products, by type number, as build.py hands them over. */
static Products format_products[32];

/* Hands over the few-row products of `type` (from a library of that format alone, see
 * QUANT_FORMATS): where flagged INT8_ACTIVATIONS, quant8_rows_part and quant8_tile_part, else
 * quant_rows_part (second NULL). Returns 0, or 1 for a type the products do not know. */
int set_products(int type, void *first, void *second) {
    Format f;
    const int base = type & ~TYPE_FLAGS;
    if (base < 0 || base >= 32 || !format_of(base, &f)) return 1;
    Products *p = &format_products[base];
    if (!(type & INT8_ACTIVATIONS)) {
        p->rows = (RowsProduct *)first;
        return 0;
    }
    p->tile8 = (Int8Product *)second;
    p->rows8 = (Int8Product *)first;  /* after tile8: products_of looks at rows8 */
    return 0;
}

const Products *products_of(int type) {
    const int base = type & ~TYPE_FLAGS;
    if (base < 0 || base >= 32) return NULL;
    const Products *p = &format_products[base];
    const int handed = (type & INT8_ACTIVATIONS) ? p->rows8 != NULL : p->rows != NULL;
    return handed ? p : NULL;
}

/* Thread t of a team of `threads`: its share of out[m][n] (row stride out_stride; float32, or
 * bfloat16 where out_bf16) = x[m] . W[n] (+ bias[n]) for W's n_dim rows of `type` blocks;
 * x float32 [rows, k_dim]. Returns 0, 1 for an unknown type, 2 when out of memory.
 * A type flagged INT8_ACTIVATIONS goes to quant_int8.c (a few rows) or
 * quant_int8_tile.c. A type whose products were not handed over (set_products) is unknown. */
int quant_product_part(const float *x, const uint8_t *w, int type, const float *bias,
                       void *out, int out_bf16, int rows, int k_dim, int n_dim,
                       int64_t out_stride, int t, int threads, const float *bounds) {
    const Products *products = products_of(type);
    if (products == NULL) return 1;
    const int exact_offsets = (type & EXACT_OFFSETS) != 0;
    type &= ~EXACT_OFFSETS;
    if (type & INT8_ACTIVATIONS)
        return (rows <= INT8_ROWS_MAX ? products->rows8 : products->tile8)(
            x, w, type & ~INT8_ACTIVATIONS, bias, out, out_bf16, rows, k_dim, n_dim,
            out_stride, t, threads, bounds);
    Format f;
    if (!format_of(type, &f)) return 1;
    if (rows <= FEW_ROWS || IN_PASSES(f.type, rows)) {
        /* passes of at most FEW_ROWS rows, as even as the count allows */
        const int passes = (rows + FEW_ROWS - 1) / FEW_ROWS;
        for (int p = 0, m = 0, count; p < passes; p++, m += count) {
            count = (rows - m) / (passes - p);
            products->rows(x + (int64_t)m * k_dim, w, &f, exact_offsets, bias,
                           out_at(out, out_bf16, (int64_t)m * out_stride), out_bf16, count,
                           k_dim, n_dim, out_stride, t, threads, bounds);
        }
        return 0;
    }
    return panel_product_part(x, w, &f, bias, out, out_bf16, rows, k_dim, n_dim, out_stride, t,
                              threads, bounds);
}

/* See kernels.h. */
void rebalance(float *bounds, const double *busy, int team) {
    double speed[team], total = 0.0;
    for (int t = 0; t < team; t++) {
        if (!(busy[t] > 0.0)) return;
        speed[t] = (bounds[t + 1] - bounds[t]) / busy[t];
        total += speed[t];
    }
    double share[team], sum = 0.0;
    for (int t = 0; t < team; t++) {
        share[t] = 0.5 * (bounds[t + 1] - bounds[t]) + 0.5 * speed[t] / total;
        if (share[t] < 0.5 / team) share[t] = 0.5 / team;
        sum += share[t];
    }
    for (int t = 0; t < team - 1; t++) bounds[t + 1] = (float)(bounds[t] + share[t] / sum);
    bounds[team] = 1.0f;
}

/* The whole product (see quant_product_part) on num_threads threads, its columns split as
 * bounds (num_threads + 1 fractions) has it, which it then rebalances; equally where bounds
 * is NULL. */
static int product(const float *x, const uint8_t *w, int type, const float *bias, void *out,
                   int out_bf16, int rows, int k_dim, int n_dim, int64_t out_stride,
                   int num_threads, float *bounds) {
    Format f;
    if (!format_of(type & ~TYPE_FLAGS, &f)) return 1;
    if (num_threads < 2) bounds = NULL;
    int status = 0, team_size = 0;
    double busy[num_threads];  /* each thread's seconds in its share */
    #pragma omp parallel num_threads(num_threads) reduction(| : status)
    {
        const int t = omp_get_thread_num(), team = omp_get_num_threads();
        const double start = omp_get_wtime();
        status |= quant_product_part(x, w, type, bias, out, out_bf16, rows, k_dim, n_dim,
                                     out_stride, t, team, team == num_threads ? bounds : NULL);
        busy[t] = omp_get_wtime() - start;
        if (t == 0) team_size = team;
    }
    if (bounds != NULL && team_size == num_threads && status == 0)
        rebalance(bounds, busy, num_threads);
    return status;
}

/* x, bias and out float32; see product. */
int quant_linear_f32(const float *x, const uint8_t *w, int type, const float *bias,
                     float *out, int rows, int k_dim, int n_dim, int64_t out_stride,
                     int num_threads, float *bounds) {
    return product(x, w, type, bias, out, 0, rows, k_dim, n_dim, out_stride, num_threads,
                   bounds);
}

/* x and out bfloat16, bias float32 (widened once by the caller); x is widened to float32
 * once, before the product. */
int quant_linear_bf16(const bf16_t *x, const uint8_t *w, int type, const float *bias,
                      bf16_t *out, int rows, int k_dim, int n_dim, int64_t out_stride,
                      int num_threads, float *bounds) {
    float *wide = malloc(sizeof(float) * (size_t)rows * k_dim);
    if (wide == NULL) return 2;
    for (int64_t i = 0; i < (int64_t)rows * k_dim; i++) wide[i] = bf16_load(x, i);
    const int status = product(wide, w, type, bias, out, 1, rows, k_dim, n_dim, out_stride,
                               num_threads, bounds);
    free(wide);
    return status;
}

/* out[i] = row ids[i] of W decoded (float32 [count, k_dim], or bfloat16 where out_bf16);
 * ids already checked. Returns 0, or 1 for an unknown type. */
int quant_embedding(const int64_t *ids, const uint8_t *w, int type, void *out, int out_bf16,
                    int count, int k_dim, int num_threads) {
    Format f;
    if (!format_of(type, &f)) return 1;
    const int64_t row_bytes = (int64_t)k_dim / f.block_size * f.type_size;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (count > 16)
    for (int i = 0; i < count; i++) {
        const uint8_t *row = w + ids[i] * row_bytes;
        if (!out_bf16) {
            decode_row(&f, row, k_dim, (float *)out + (int64_t)i * k_dim);
            continue;
        }
        float block[256];
        for (int k = 0, at = 0; k < k_dim; k += f.block_size, at += f.type_size) {
            decode_row(&f, row + at, f.block_size, block);
            for (int j = 0; j < f.block_size; j++)
                ((bf16_t *)out)[(int64_t)i * k_dim + k + j] = bf16_round(block[j]);
        }
    }
    return 0;
}
