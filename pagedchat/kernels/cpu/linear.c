/* y = x W^T (+ b) for a few rows of x: the linear layers of a small decode batch, on a
 * plain weight (the tied head) or on one packed by oneDNN (the layers; further down).
 *
 * With a few rows (2 to 16 are sent here) a step is bound by reading W once from memory,
 * as with one row; but the BLAS torch uses packs W for a general matrix product and, at
 * these sizes, takes longer than for one row. Here each pair of W's rows is read from memory once, prefetched ahead, and multiplied into every
 * row of x (eight at a time, from the cache). The torch reference is F.linear; the tests
 * compare the two.
 */
#include <omp.h>
#include <stdint.h>

#include "kernels.h"
#include "vector.h"

#define MAX_ROWS 8        /* rows of x per pass over a pair of W's rows (registers) */
#define PREFETCH_ROWS 4   /* how far ahead W is prefetched: two pairs */

/* sums[m][j] = x[m] . w[j] for j in {0, 1}: w's two rows are read once for all rows of
 * x. Inlined per row count, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void
two_columns(const float *x, const float *w0, const float *w1, int rows, int k_dim,
            float sums[MAX_ROWS][2]) {
    vf acc0[MAX_ROWS], acc1[MAX_ROWS];
    for (int m = 0; m < rows; m++) acc0[m] = acc1[m] = vf_zero();
    for (int k = 0; k < k_dim; k += 16) {
        const vmask mask = tail_mask(k_dim - k);
        /* the hardware prefetcher alone left these loads waiting on memory; into every
         * cache level, as in prefetch_block_row */
        __builtin_prefetch(w0 + PREFETCH_ROWS * k_dim + k, 0, 3);
        __builtin_prefetch(w1 + PREFETCH_ROWS * k_dim + k, 0, 3);
        const vf a = vf_load_mask(w0 + k, mask);
        const vf b = vf_load_mask(w1 + k, mask);
        for (int m = 0; m < rows; m++) {
            const vf v = vf_load_mask(x + (int64_t)m * k_dim + k, mask);
            acc0[m] = vf_fmadd(a, v, acc0[m]);
            acc1[m] = vf_fmadd(b, v, acc1[m]);
        }
    }
    for (int m = 0; m < rows; m++) {
        sums[m][0] = vf_reduce_add(acc0[m]);
        sums[m][1] = vf_reduce_add(acc1[m]);
    }
}

#define TWO_COLUMNS(ROWS) two_columns(x + (int64_t)first * k_dim, w0, w1, ROWS, k_dim, sums)

/* x: [rows, k_dim], w: [n_dim, k_dim], bias: [n_dim] or NULL, out: [rows, n_dim];
 * all contiguous. */
void linear_f32(const float *x, const float *w, const float *bias, float *out, int rows,
                int k_dim, int n_dim, int num_threads) {
    const int pairs = (n_dim + 1) / 2;
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int p = 0; p < pairs; p++) {
        const int n = 2 * p;
        const int second = n + 1 < n_dim;  /* an odd last row is paired with itself */
        const float *w0 = w + (int64_t)n * k_dim;
        const float *w1 = second ? w0 + k_dim : w0;
        for (int first = 0; first < rows; first += MAX_ROWS) {
            const int chunk = rows - first < MAX_ROWS ? rows - first : MAX_ROWS;
            float sums[MAX_ROWS][2];
            switch (chunk) {
                case 1: TWO_COLUMNS(1); break;
                case 2: TWO_COLUMNS(2); break;
                case 3: TWO_COLUMNS(3); break;
                case 4: TWO_COLUMNS(4); break;
                case 5: TWO_COLUMNS(5); break;
                case 6: TWO_COLUMNS(6); break;
                case 7: TWO_COLUMNS(7); break;
                default: TWO_COLUMNS(8); break;
            }
            for (int m = 0; m < chunk; m++) {
                float *y = out + (int64_t)(first + m) * n_dim + n;
                y[0] = sums[m][0] + (bias ? bias[n] : 0.0f);
                if (second) y[1] = sums[m][1] + (bias ? bias[n + 1] : 0.0f);
            }
        }
    }
}

/* The same product on a weight packed by oneDNN (pack_linear), in blocks of 64 output
 * columns: float32 as [k_padded][64] per block, the 64 columns of one input index side
 * by side; bfloat16 as [k_padded / 2][64][2], each column's pair of input indices side by
 * side (the operand order of vdpbf16ps). The layout is oneDNN's choice, not ours: linear.py
 * checks it for each shape and type, by a product against F.linear, before sending a
 * weight here.
 *
 * Read that way a matrix-vector product is a plain stream: each input index broadcast
 * times 256 contiguous bytes, no horizontal sums, so that at one row it reads the weights
 * about as fast as a read-only loop, and the call skips oneDNN's dispatch. Threads take
 * equal runs of 16-column vectors rather than whole blocks, so that an output width that
 * is not a multiple of 64 times the threads still splits evenly. */
#define BLOCK_COLUMNS 64
#define BLOCK_VECTORS (BLOCK_COLUMNS / 16)
/* Rows of x per pass over a block: ROW_GROUP x 4 accumulators (and as many partial sums)
 * in registers, fewer rows where there are fewer registers. */
#if VF_REGISTERS >= 32
#define ROW_GROUP 6
#define BLOCK_CASES(BF16) BLOCK_CASE(1, BF16) BLOCK_CASE(2, BF16) BLOCK_CASE(3, BF16) \
                          BLOCK_CASE(4, BF16) BLOCK_CASE(5, BF16) BLOCK_CASE(6, BF16)
#else
#define ROW_GROUP 2
#define BLOCK_CASES(BF16) BLOCK_CASE(1, BF16) BLOCK_CASE(2, BF16)
#endif
#define BLOCK_ROW_BYTES 256 /* 64 columns of one float32 index or one bfloat16 pair */
#define BLOCK_PREFETCH 48   /* rows ahead, see prefetch_block_row */
/* In float32 each column sums runs of this many products, then the runs: one chain of
 * k_dim roundings drifts past the tests' tolerance against F.linear on long inputs.
 * bfloat16 sums one chain: its output is rounded to bfloat16, far coarser than the
 * chain's error, and the runs' second set of accumulators would not fit the registers. */
#define BLOCK_RUN 64

/* Prefetch one row of a block BLOCK_PREFETCH rows on, into every cache level (prefetcht0
 * on x86): the next step reads the same weights, and what of them the last-level cache
 * keeps is not read from memory again. A non-temporal prefetch keeps nothing, and on
 * Intel a line it fetched can leave the first level before its load comes, which then
 * reads it from memory a second time. */
static inline __attribute__((always_inline)) void prefetch_block_row(const void *row,
                                                                     int vecs) {
    for (int v = 0; v < vecs; v++)
        __builtin_prefetch((const char *)row + BLOCK_PREFETCH * BLOCK_ROW_BYTES + 64 * v, 0, 3);
}

/* out[m][0, 16 * vecs) = x[m] . columns of w for `rows` rows of x, w pointing at the first
 * of these columns in a block; float32 or (bf16 = 1) bfloat16 x, w, bias and out.
 * Inlined with literal rows, vecs and bf16. */
static inline __attribute__((always_inline)) void
block_columns(const void *x, const void *w, const void *bias, void *out, int rows, int vecs,
              int bf16, int k_dim, int n_dim, int n_left) {
    vf acc[ROW_GROUP][BLOCK_VECTORS], part[ROW_GROUP][BLOCK_VECTORS];
    for (int m = 0; m < rows; m++)
        for (int v = 0; v < vecs; v++) acc[m][v] = vf_zero();
    const int run = bf16 ? k_dim : BLOCK_RUN;
    for (int k0 = 0; k0 < k_dim; k0 += run) {
        const int k_end = k0 + run < k_dim ? k0 + run : k_dim;
        for (int m = 0; m < rows; m++)
            for (int v = 0; v < vecs; v++) part[m][v] = vf_zero();
        for (int k = k0; k < k_end; k += bf16 ? 2 : 1) {
            /* row k of float32, the pair (k, k + 1) of bfloat16 */
            const char *row = (const char *)w + (int64_t)(bf16 ? k / 2 : k) * BLOCK_ROW_BYTES;
            prefetch_block_row(row, vecs);
            if (bf16) {
                const int second = k + 1 < k_dim;
#if defined(VF_AVX512) && defined(__AVX512BF16__)
                /* vdpbf16ps: both products of a pair, exact, summed in float32 */
                __m512i wv[BLOCK_VECTORS];
                for (int v = 0; v < vecs; v++) wv[v] = _mm512_loadu_si512(row + 64 * v);
                for (int m = 0; m < rows; m++) {
                    const bf16_t *xm = (const bf16_t *)x + (int64_t)m * k_dim + k;
                    const uint32_t x1 = second ? xm[1] : 0;
                    const __m512bh xp = (__m512bh)_mm512_set1_epi32((int)(xm[0] | x1 << 16));
                    for (int v = 0; v < vecs; v++)
                        part[m][v] = _mm512_dpbf16_ps(part[m][v], xp, (__m512bh)wv[v]);
                }
#else
                /* the odd index first, in vdpbf16ps's order */
                vf even[BLOCK_VECTORS], odd[BLOCK_VECTORS];
                for (int v = 0; v < vecs; v++)
                    vf_load_bf16_pairs((const bf16_t *)row + 32 * v, &even[v], &odd[v]);
                for (int m = 0; m < rows; m++) {
                    const bf16_t *xm = (const bf16_t *)x + (int64_t)m * k_dim + k;
                    const vf x0 = vf_set1(bf16_load(xm, 0));
                    const vf x1 = vf_set1(second ? bf16_load(xm, 1) : 0.0f);
                    for (int v = 0; v < vecs; v++)
                        part[m][v] = vf_fmadd(x0, even[v], vf_fmadd(x1, odd[v], part[m][v]));
                }
#endif
            } else {
                vf wv[BLOCK_VECTORS];
                for (int v = 0; v < vecs; v++) wv[v] = vf_load((const float *)row + 16 * v);
                for (int m = 0; m < rows; m++) {
                    const vf xv = vf_set1(((const float *)x)[(int64_t)m * k_dim + k]);
                    for (int v = 0; v < vecs; v++) part[m][v] = vf_fmadd(xv, wv[v], part[m][v]);
                }
            }
        }
        for (int m = 0; m < rows; m++)
            for (int v = 0; v < vecs; v++) acc[m][v] = vf_add(acc[m][v], part[m][v]);
    }
    for (int v = 0; v < vecs; v++) {
        const vmask mask = tail_mask(n_left - 16 * v);
        vf b = vf_zero();
        if (bias != NULL)
            b = bf16 ? vf_load_bf16((const bf16_t *)bias + 16 * v, mask)
                     : vf_load_mask((const float *)bias + 16 * v, mask);
        for (int m = 0; m < rows; m++) {
            const vf y = vf_add(acc[m][v], b);
            const int64_t at = (int64_t)m * n_dim + 16 * v;
            if (bf16)
                vf_store_bf16((bf16_t *)out + at, mask, y);
            else
                vf_store_mask((float *)out + at, mask, y);
        }
    }
}

#define BLOCK_CASE(ROWS, BF16)                                                             \
    case ROWS:                                                                             \
        switch (vecs) {                                                                    \
            case 1: block_columns(xs, ws, bs, ys, ROWS, 1, BF16, k_dim, n_dim, n_left); break; \
            case 2: block_columns(xs, ws, bs, ys, ROWS, 2, BF16, k_dim, n_dim, n_left); break; \
            case 3: block_columns(xs, ws, bs, ys, ROWS, 3, BF16, k_dim, n_dim, n_left); break; \
            default: block_columns(xs, ws, bs, ys, ROWS, 4, BF16, k_dim, n_dim, n_left); break; \
        }                                                                                  \
        break;

/* x: [rows, k_dim], bias: [n_dim] or NULL, out: [rows, n_dim], contiguous, of type T; w:
 * blocked as above with k_padded >= k_dim. */
#define DEFINE_LINEAR_BLOCKED(NAME, T, BF16)                                               \
void NAME##_part(const T *x, const T *w, const T *bias, T *out, int rows, int k_dim,      \
                 int k_padded, int n_dim, int t, int threads) {                            \
    const int vectors = (n_dim + 15) / 16;                                                 \
    const int end = (int)((int64_t)vectors * (t + 1) / threads);                           \
    for (int first = (int)((int64_t)vectors * t / threads); first < end;) {                \
        const int block = first / BLOCK_VECTORS, offset = first % BLOCK_VECTORS;          \
        const int vecs = BLOCK_VECTORS - offset < end - first ? BLOCK_VECTORS - offset     \
                                                              : end - first;               \
        const int column = 16 * first, n_left = n_dim - column;                            \
        const T *ws = w + (int64_t)block * k_padded * BLOCK_COLUMNS                        \
                      + (BF16 ? 32 : 16) * offset;                                         \
        const T *bs = bias != NULL ? bias + column : NULL;                                 \
        for (int m = 0; m < rows; m += ROW_GROUP) {                                        \
            const T *xs = x + (int64_t)m * k_dim;                                          \
            T *ys = out + (int64_t)m * n_dim + column;                                     \
            switch (rows - m < ROW_GROUP ? rows - m : ROW_GROUP) {                         \
                BLOCK_CASES(BF16)                                                          \
            }                                                                              \
        }                                                                                  \
        first += vecs;                                                                     \
    }                                                                                      \
}                                                                                          \
                                                                                           \
void NAME(const T *x, const T *w, const T *bias, T *out, int rows, int k_dim,             \
          int k_padded, int n_dim, int num_threads) {                                      \
    _Pragma("omp parallel num_threads(num_threads)")                                       \
    NAME##_part(x, w, bias, out, rows, k_dim, k_padded, n_dim, omp_get_thread_num(),       \
                omp_get_num_threads());                                                    \
}
DEFINE_LINEAR_BLOCKED(linear_blocked_f32, float, 0)
DEFINE_LINEAR_BLOCKED(linear_blocked_bf16, bf16_t, 1)

/* out[i] = row ids[i] of a weight packed as above: the embedding of a model whose head is
 * tied to it, so that the one copy of the vocabulary's rows is in the layout the head's
 * product reads. Row r lies in block r / 64, column r % 64: one value per 256-byte row of
 * the block (float32) or per pair of them (bfloat16), a strided gather that a step's few
 * hundred tokens (1,024 in a prompt chunk) make cheap beside its products. */
#define DEFINE_EMBEDDING_BLOCKED(NAME, T, BF16)                                            \
void NAME(const int64_t *ids, const T *w, T *out, int count, int k_dim, int k_padded,      \
          int num_threads) {                                                               \
    _Pragma("omp parallel for schedule(static) num_threads(num_threads) if (count > 16)") \
    for (int i = 0; i < count; i++) {                                                      \
        const int64_t id = ids[i];                                                         \
        const T *block = w + id / BLOCK_COLUMNS * k_padded * BLOCK_COLUMNS;                \
        const int column = (int)(id % BLOCK_COLUMNS);                                      \
        T *row = out + (int64_t)i * k_dim;                                                 \
        for (int k = 0; k < k_dim; k++)                                                    \
            row[k] = BF16 ? block[(k / 2) * 2 * BLOCK_COLUMNS + 2 * column + k % 2]        \
                          : block[k * BLOCK_COLUMNS + column];                             \
    }                                                                                      \
}

DEFINE_EMBEDDING_BLOCKED(embedding_blocked_f32, float, 0)
DEFINE_EMBEDDING_BLOCKED(embedding_blocked_bf16, bf16_t, 1)
