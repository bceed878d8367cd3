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
 * small for a panel, in passes) go to quant_rows.c, which decodes in registers. For more,
 * threads take runs of groups of NC output columns: a thread decodes WIDE groups at a time
 * into a float32 scratch and multiplies them with every row of x, packed k-major in panels
 * of XR rows, the sums in registers: the weights are read from memory once and decoded once
 * per call, whatever the row count. One path per instruction set, picked by the compiler's
 * macros: AVX-512, AVX2 with FMA, else plain C.
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

/* One row of k_dim values, the format picked once per row so each block's decoding is
 * inlined into its loop. */
#define DECODE_LOOP(DECODE)                                                                \
    for (int k = 0, at = 0; k < k_dim; k += f->block_size, at += f->type_size)             \
        DECODE(row + at, out + k);                                                         \
    break;

static void decode_row(const Format *f, const uint8_t *row, int k_dim, float *out) {
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

/* ---- the many-rows product ----
 * NC output columns are decoded at a time into a row-major tile. Rows of x go in panels of
 * XR rows (NV vectors): a full panel is packed k-major (xp[k * XR + r]) and each step of
 * k loads its NV vectors and broadcasts one weight of each of the NC columns, NV * NC sums
 * (each a vector over rows) in registers. A panel of fewer than PANEL_MIN rows (a
 * remainder, or a small batch) would waste lanes that way, so it takes dot products
 * instead: MR rows by NCI columns at a time, vectors along k, summed across lanes at the
 * end. */
#if defined(__AVX512F__)
#define NC 8
#define NV 3
#define NCI 4
#define MR 6
#define VW 16
typedef __m512 vec;
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vset1(x) _mm512_set1_ps(x)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#define NC 6
#define NV 2
#define NCI 3
#define MR 3
#define VW 8
typedef __m256 vec;
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vset1(x) _mm256_set1_ps(x)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(vec v) { return sum8(v); }
#else
#define NC 4
#define NV 2
#define NCI 4
#define MR 2
#define VW 8
typedef struct { float v[VW]; } vec;
static inline vec vzero(void) { vec r; for (int i = 0; i < VW; i++) r.v[i] = 0.0f; return r; }
static inline vec vload(const float *p) { vec r; memcpy(r.v, p, sizeof r.v); return r; }
static inline void vstore(float *p, vec v) { memcpy(p, v.v, sizeof v.v); }
static inline vec vset1(float x) { vec r; for (int i = 0; i < VW; i++) r.v[i] = x; return r; }
static inline vec vfma(vec a, vec b, vec c) {
    for (int i = 0; i < VW; i++) c.v[i] += a.v[i] * b.v[i];
    return c;
}
static inline float vsum(vec v) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v.v[i];
    return s;
}
#endif
#define XR (NV * VW)  /* rows of x in a packed panel */
/* the fewest rows a packed panel takes: below it the padding costs more than the dot
 * products' extra loads */
#define PANEL_MIN (XR * 5 / 8 + 1)
/* groups of NC columns decoded together: each panel of x, read once from the outer caches,
 * serves all of them from the inner ones */
#define WIDE 8
/* Where k_dim exceeds K_CHUNK and x has at least CHUNKED_PANELS full panels, k is taken in
 * steps of at most K_CHUNK: a step of x's panels stays in the outer cache and of the decoded
 * tile in the inner ones while every panel and group multiply them, where a whole panel
 * and tile would overflow them (partial sums kept in memory between steps). */
#define K_CHUNK 1024
#define CHUNKED_PANELS 8

/* Rows [0, XR) of x (stride k_dim; `count` of them, the rest zero) into a k-major panel. */
static void pack_panel(const float *x, int count, int k_dim, float *panel) {
    for (int k0 = 0; k0 < k_dim; k0 += 16)  /* 16 values of each row: one cache line */
        for (int r = 0; r < XR; r++)
            for (int k = k0; k < k0 + 16; k++)
                panel[(int64_t)k * XR + r] = r < count ? x[(int64_t)r * k_dim + k] : 0.0f;
}

/* sums[c][r] = panel row r . tile column c, for XR rows and NC columns of k_dim values
 * (or sums + that, where `add`). */
static void panel_tile(const float *panel, const float *tile, int k_dim, int add,
                       float sums[NC][XR]) {
    vec acc[NV][NC];
    for (int v = 0; v < NV; v++)
        for (int c = 0; c < NC; c++) acc[v][c] = add ? vload(sums[c] + v * VW) : vzero();
    for (int k = 0; k < k_dim; k++) {
        vec xv[NV];
        for (int v = 0; v < NV; v++) xv[v] = vload(panel + (int64_t)k * XR + v * VW);
        for (int c = 0; c < NC; c++) {
            const vec wv = vset1(tile[(int64_t)c * k_dim + k]);
            for (int v = 0; v < NV; v++) acc[v][c] = vfma(xv[v], wv, acc[v][c]);
        }
    }
    for (int v = 0; v < NV; v++)
        for (int c = 0; c < NC; c++) vstore(sums[c] + v * VW, acc[v][c]);
}

/* sums[m][c] = x[m] . w[c] for `rows` rows of x (stride k_dim) and NCI rows of w. Inlined
 * per row count so the sums stay in registers. */
static inline __attribute__((always_inline)) void
dot_tile(const float *x, const float *w, int rows, int k_dim, float sums[MR][NCI]) {
    vec acc[MR][NCI];
    for (int m = 0; m < rows; m++)
        for (int c = 0; c < NCI; c++) acc[m][c] = vzero();
    for (int k = 0; k < k_dim; k += VW) {
        vec wv[NCI];
        for (int c = 0; c < NCI; c++) wv[c] = vload(w + (int64_t)c * k_dim + k);
        for (int m = 0; m < rows; m++) {
            const vec xv = vload(x + (int64_t)m * k_dim + k);
            for (int c = 0; c < NCI; c++) acc[m][c] = vfma(xv, wv[c], acc[m][c]);
        }
    }
    for (int m = 0; m < rows; m++)
        for (int c = 0; c < NCI; c++) sums[m][c] = vsum(acc[m][c]);
}

static void dot_rows(const float *x, const float *w, int rows, int k_dim, float sums[MR][NCI]) {
    switch (rows) {
#if MR >= 6
        case 6: dot_tile(x, w, 6, k_dim, sums); break;
        case 5: dot_tile(x, w, 5, k_dim, sums); break;
        case 4: dot_tile(x, w, 4, k_dim, sums); break;
#endif
#if MR >= 3
        case 3: dot_tile(x, w, 3, k_dim, sums); break;
#endif
        case 2: dot_tile(x, w, 2, k_dim, sums); break;
        default: dot_tile(x, w, 1, k_dim, sums); break;
    }
}

/* out[r][n0 + c] = sums at (r, c) + bias[n0 + c], for rows [0, rows) and columns
 * [0, cols); sums[r * r_step + c * c_step]. */
static inline __attribute__((always_inline)) void
put(const float *sums, int r_step, int c_step, const float *bias, void *out, int out_bf16,
    int rows, int n0, int cols, int64_t out_stride) {
    float add[NC] = {0};
    if (bias) memcpy(add, bias + n0, sizeof(float) * cols);
    for (int r = 0; r < rows; r++) {
        const int64_t at = (int64_t)r * out_stride + n0;
        if (out_bf16)
            for (int c = 0; c < cols; c++)
                ((bf16_t *)out)[at + c] = bf16_round(sums[r * r_step + c * c_step] + add[c]);
        else
            for (int c = 0; c < cols; c++)
                ((float *)out)[at + c] = sums[r * r_step + c * c_step] + add[c];
    }
}

/* The output `at` elements on (float32, or bfloat16 where out_bf16). */
static inline void *out_at(void *out, int out_bf16, int64_t at) {
    return out_bf16 ? (void *)((bf16_t *)out + at) : (void *)((float *)out + at);
}

/* out rows [0, count) x columns [n0, n0 + cols) (+ bias) = x rows [0, count) . the tile's
 * columns, for fewer rows than a panel takes: dot products of MR rows by NCI columns. */
static void dot_product(const float *x, const float *tile, const float *bias, void *out,
                        int out_bf16, int count, int k_dim, int n0, int cols,
                        int64_t out_stride) {
    for (int m = 0; m < count; m += MR) {
        const int chunk = count - m < MR ? count - m : MR;
        for (int c0 = 0; c0 < cols; c0 += NCI) {
            float sums[MR][NCI];
            dot_rows(x + (int64_t)m * k_dim, tile + (int64_t)c0 * k_dim, chunk, k_dim, sums);
            put(&sums[0][0], NCI, 1, bias, out_at(out, out_bf16, (int64_t)m * out_stride),
                out_bf16, chunk, n0 + c0, cols - c0 < NCI ? cols - c0 : NCI, out_stride);
        }
    }
}

/* The most rows the exact products send to quant_rows.c, whose tiles keep every row's sums
 * in registers (on AVX2 tile8's): up to QUANT_ROWS_MAX on AVX2 and AVX-512, 4 on the
 * portable level. */
#if defined(VF_AVX2) || defined(VF_AVX512)
#define FEW_ROWS QUANT_ROWS_MAX
/* Rows too few for a panel (PANEL_MIN) would take dot products; in the K formats the
 * few-row tiles are faster, even taken in several passes. */
#define IN_PASSES(type, rows) ((type) >= Q4_K && (rows) < PANEL_MIN)
#else
#define FEW_ROWS 4
#define IN_PASSES(type, rows) 0
#endif

/* Rows [0, rows) of out (row stride out_stride), columns of the groups [g, end) of NC:
 * x . W^T (+ bias), k taken `step` values at a time (a multiple of the block size; below
 * k_dim only where every row is in a full panel). Returns 0, or 2 when out of memory. */
static int product_rows(const float *x, const uint8_t *w, const Format *f, const float *bias,
                        void *out, int out_bf16, int rows, int k_dim, int n_dim,
                        int64_t out_stride, int g, int end, int step) {
    const int64_t row_bytes = (int64_t)k_dim / f->block_size * f->type_size;
    /* x is packed once per call, each full panel's rows k-major */
    const int64_t packed = rows / XR * XR + (rows % XR >= PANEL_MIN ? XR : 0);
    const int64_t partials = step < k_dim ? packed * (end - g) * NC : 0;
    float *tile = aligned_alloc(
        64, sizeof(float) * ((int64_t)WIDE * NC * step + packed * k_dim + partials));
    if (tile == NULL) return 2;
    float *xp = tile + (int64_t)WIDE * NC * step, *partial = xp + packed * k_dim;
    for (int m = 0; m < packed; m += XR)
        pack_panel(x + (int64_t)m * k_dim, rows - m < XR ? rows - m : XR, k_dim,
                   xp + (int64_t)m * k_dim);
    for (int k0 = 0; k0 < k_dim; k0 += step) {
        const int len = k_dim - k0 < step ? k_dim - k0 : step, last = k0 + len == k_dim;
        const int64_t at_k = (int64_t)k0 / f->block_size * f->type_size;
        for (int gg = g; gg < end; gg += WIDE) {
            const int wide = end - gg < WIDE ? end - gg : WIDE;
            /* the last group's missing columns repeat its first */
            for (int c = 0; c < wide * NC; c++) {
                float *column = tile + (int64_t)c * len;
                if (gg * NC + c < n_dim)
                    decode_row(f, w + (gg * NC + c) * row_bytes + at_k, len, column);
                else
                    memcpy(column, tile + (int64_t)(c / NC * NC) * len, sizeof(float) * len);
            }
            for (int m = 0; m < rows; m += XR) {
                const int count = rows - m < XR ? rows - m : XR;
                void *out_rows = out_at(out, out_bf16, (int64_t)m * out_stride);
                for (int j = 0; j < wide; j++) {
                    const int first = (gg + j) * NC;
                    const int cols = n_dim - first < NC ? n_dim - first : NC;
                    const float *columns = tile + (int64_t)j * NC * len;
                    if (count < PANEL_MIN) {
                        dot_product(x + (int64_t)m * k_dim, columns, bias, out_rows, out_bf16,
                                    count, k_dim, first, cols, out_stride);
                        continue;
                    }
                    /* panel m / XR and group gg + j's partial sums, between steps */
                    float here[NC][XR], (*sums)[XR] = partials == 0 ? here : (float (*)[XR])(
                        partial + ((int64_t)m * (end - g) + (int64_t)(gg + j - g) * XR) * NC);
                    panel_tile(xp + (int64_t)m * k_dim + (int64_t)k0 * XR, columns, len, k0 > 0,
                               sums);
                    if (last) put(&sums[0][0], 1, XR, bias, out_rows, out_bf16, count, first,
                                  cols, out_stride);
                }
            }
        }
    }
    free(tile);
    return 0;
}

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
 * Threads take runs of groups of NC columns (equal, or as bounds has it: see thread_run);
 * each group is decoded once per call (per step of k) and multiplied with every panel of
 * x. A type flagged INT8_ACTIVATIONS goes to quant_int8.c (a few rows) or
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
    int g, end;
    thread_run((n_dim + NC - 1) / NC, t, threads, bounds, &g, &end);
    if (g == end) return 0;
    const int full = rows / XR * XR;
    if (k_dim <= K_CHUNK || full < CHUNKED_PANELS * XR)
        return product_rows(x, w, &f, bias, out, out_bf16, rows, k_dim, n_dim, out_stride,
                            g, end, k_dim);
    const int steps = (k_dim + K_CHUNK - 1) / K_CHUNK;
    const int step = (k_dim / steps + f.block_size - 1) / f.block_size * f.block_size;
    const int status = product_rows(x, w, &f, bias, out, out_bf16, full, k_dim, n_dim,
                                    out_stride, g, end, step);
    if (status != 0 || full == rows) return status;
    return product_rows(x + (int64_t)full * k_dim, w, &f, bias,
                        out_at(out, out_bf16, (int64_t)full * out_stride), out_bf16,
                        rows - full, k_dim, n_dim, out_stride, g, end, k_dim);
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
