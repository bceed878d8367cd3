/* The product of many rows of x on GGML blocks (quant.c hands over every call of more rows
 * than its few-row products take): threads take runs of groups of NC output columns; a
 * thread decodes WIDE groups at a time into a float32 scratch (decode_row, quant.c) and
 * multiplies them with every row of x, packed k-major in panels of XR rows, the sums in
 * registers: the weights are read from memory once and decoded once per call, whatever
 * the row count. One path per instruction set, picked by the compiler's macros: AVX-512,
 * AVX2 with FMA, else plain C. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_formats.h"
#include "vector.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* NC output columns are decoded at a time into a row-major tile. Rows of x go in panels of
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

/* See ggml_formats.h. */
int panel_rows_min(void) { return PANEL_MIN; }

/* See ggml_formats.h. */
int panel_product_part(const float *x, const uint8_t *w, const Format *f, const float *bias,
                       void *out, int out_bf16, int rows, int k_dim, int n_dim,
                       int64_t out_stride, int t, int threads, const float *bounds) {
    int g, end;
    thread_run((n_dim + NC - 1) / NC, t, threads, bounds, &g, &end);
    if (g == end) return 0;
    const int full = rows / XR * XR;
    if (k_dim <= K_CHUNK || full < CHUNKED_PANELS * XR)
        return product_rows(x, w, f, bias, out, out_bf16, rows, k_dim, n_dim, out_stride,
                            g, end, k_dim);
    const int steps = (k_dim + K_CHUNK - 1) / K_CHUNK;
    const int step = (k_dim / steps + f->block_size - 1) / f->block_size * f->block_size;
    const int status = product_rows(x, w, f, bias, out, out_bf16, full, k_dim, n_dim,
                                    out_stride, g, end, step);
    if (status != 0 || full == rows) return status;
    return product_rows(x + (int64_t)full * k_dim, w, f, bias,
                        out_at(out, out_bf16, (int64_t)full * out_stride), out_bf16,
                        rows - full, k_dim, n_dim, out_stride, g, end, k_dim);
}
