/* y = x W^T (+ b) for a few rows of x: the linear layers of a small decode batch.
 *
 * With a few rows (2 to 16 are sent here) a step is bound by reading W once from memory,
 * as with one row; but the BLAS torch uses packs W for a general matrix product and, at
 * these sizes, takes 1.1 to 2.3 times as long as for one row (measured on this model's
 * shapes). Here each
 * pair of W's rows is read from memory once, prefetched ahead, and multiplied into every
 * row of x (eight at a time, from the cache). The torch reference is F.linear; the tests
 * compare the two.
 */
#include <omp.h>
#include <stdint.h>

#include "cpu_vector.h"

#define MAX_ROWS 8        /* rows of x per pass over a pair of W's rows (registers) */
#define PREFETCH_ROWS 4   /* how far ahead W is prefetched: two pairs */

/* sums[m][j] = x[m] . w[j] for j in {0, 1}: w's two rows are read once for all rows of
 * x. Inlined per row count, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void
two_columns(const float *x, const float *w0, const float *w1, int rows, int k_dim,
            float sums[MAX_ROWS][2]) {
#if defined(HAVE_AVX512)
    __m512 acc0[MAX_ROWS], acc1[MAX_ROWS];
    for (int m = 0; m < rows; m++) acc0[m] = acc1[m] = _mm512_setzero_ps();
    for (int k = 0; k < k_dim; k += 16) {
        const __mmask16 mask = tail_mask(k_dim - k);
        /* the hardware prefetcher alone left these loads waiting on memory */
        _mm_prefetch((const char *)(w0 + PREFETCH_ROWS * k_dim + k), _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + PREFETCH_ROWS * k_dim + k), _MM_HINT_T0);
        const __m512 a = _mm512_maskz_loadu_ps(mask, w0 + k);
        const __m512 b = _mm512_maskz_loadu_ps(mask, w1 + k);
        for (int m = 0; m < rows; m++) {
            const __m512 v = _mm512_maskz_loadu_ps(mask, x + (int64_t)m * k_dim + k);
            acc0[m] = _mm512_fmadd_ps(a, v, acc0[m]);
            acc1[m] = _mm512_fmadd_ps(b, v, acc1[m]);
        }
    }
    for (int m = 0; m < rows; m++) {
        sums[m][0] = _mm512_reduce_add_ps(acc0[m]);
        sums[m][1] = _mm512_reduce_add_ps(acc1[m]);
    }
#else
    for (int m = 0; m < rows; m++) {
        float s0 = 0.0f, s1 = 0.0f;
        for (int k = 0; k < k_dim; k++) {
            s0 += x[(int64_t)m * k_dim + k] * w0[k];
            s1 += x[(int64_t)m * k_dim + k] * w1[k];
        }
        sums[m][0] = s0;
        sums[m][1] = s1;
    }
#endif
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

/* Whether linear_f32 was built with its vector path: without it torch's BLAS is faster. */
int linear_f32_vectorised(void) {
#if defined(HAVE_AVX512)
    return 1;
#else
    return 0;
#endif
}
