/* What sampling needs from every row of logits (float32 or bfloat16), in one read of the
 * row: its largest value, the first index holding it (torch's argmax), and
 * log(sum(exp(row))) for the chosen token's log-probability. torch takes a pass for max
 * and two more for logsumexp, each over the whole [rows, vocab] matrix (50 MB at 256 rows
 * of 49,152): here each row is read from memory once and its second pass comes from the
 * cache.
 * Built with cpu_attention.c by pagedchat/kernels/cpu.py; the torch reference
 * (reference.max_logsumexp) is the definition, and the tests compare the two.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "cpu_vector.h"

/* 16 logits from lane t on (lanes past the mask -inf in the first pass, 0 in the exp
 * sum's masked add): float32 as they are, bfloat16 widened exactly. */
#if defined(HAVE_AVX512)
static inline __m512 load16_logits(const void *x, int bf16, int64_t t, __mmask16 m) {
    return bf16 ? load16_bf16((const bf16_t *)x + t, m)
                : _mm512_maskz_loadu_ps(m, (const float *)x + t);
}
#endif

static inline float load_logit(const void *x, int bf16, int64_t t) {
    return bf16 ? bf16_load((const bf16_t *)x, t) : ((const float *)x)[t];
}

/* Inlined with a literal bf16, so each type gets its own loop. */
static inline __attribute__((always_inline)) void
row_max_logsumexp(const void *x, int bf16, int n, float *top, int64_t *index, float *lse) {
    float peak = -INFINITY;
    int64_t at = 0;
#if defined(HAVE_AVX512)
    __m512 lane_peak = _mm512_set1_ps(-INFINITY);
    __m512i lane_at = _mm512_setzero_si512();
    const __m512i step = _mm512_set1_epi32(16);
    __m512i position = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int t = 0;
    for (; t + 16 <= n; t += 16) {
        const __m512 v = load16_logits(x, bf16, t, 0xFFFF);
        /* strictly greater: each lane keeps the first index of its own maximum */
        const __mmask16 better = _mm512_cmp_ps_mask(v, lane_peak, _CMP_GT_OQ);
        lane_peak = _mm512_mask_mov_ps(lane_peak, better, v);
        lane_at = _mm512_mask_mov_epi32(lane_at, better, position);
        position = _mm512_add_epi32(position, step);
    }
    float peaks[16];
    int32_t ats[16];
    _mm512_storeu_ps(peaks, lane_peak);
    _mm512_storeu_si512(ats, lane_at);
    for (int lane = 0; lane < 16; lane++)
        if (peaks[lane] > peak || (peaks[lane] == peak && ats[lane] < at)) {
            peak = peaks[lane];
            at = ats[lane];
        }
    for (; t < n; t++) {
        const float v = load_logit(x, bf16, t);
        if (v > peak) { peak = v; at = t; }
    }
    const __m512 shift = _mm512_set1_ps(peak);
    __m512 sum = _mm512_setzero_ps();
    for (int s = 0; s < n; s += 16) {
        const __mmask16 m = tail_mask(n - s);
        const __m512 e = exp16(_mm512_sub_ps(load16_logits(x, bf16, s, m), shift));
        sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    const float total = _mm512_reduce_add_ps(sum);
#else
    for (int t = 0; t < n; t++) {
        const float v = load_logit(x, bf16, t);
        if (v > peak) { peak = v; at = t; }
    }
    float total = 0.0f;
    for (int t = 0; t < n; t++) total += expf(load_logit(x, bf16, t) - peak);
#endif
    *top = peak;
    *index = at;
    *lse = peak + logf(total);
}

/* logits: [rows, vocab] of type T, rows row_stride elements apart; top and lse float32.
 * bfloat16 logits (the head's own output in a bfloat16 model) are read as they are: torch
 * took 10 ms to widen 256 x 49,152 of them to float32 first, a tenth of a decode step. */
#define DEFINE_MAX_LOGSUMEXP(NAME, T, BF16)                                                \
void NAME(const T *logits, int rows, int vocab, int64_t row_stride, float *top,          \
          int64_t *index, float *lse, int num_threads) {                                   \
    _Pragma("omp parallel for schedule(static) num_threads(rows > 1 ? num_threads : 1)")  \
    for (int r = 0; r < rows; r++)                                                         \
        row_max_logsumexp(logits + (int64_t)r * row_stride, BF16, vocab, top + r,          \
                          index + r, lse + r);                                             \
}

DEFINE_MAX_LOGSUMEXP(max_logsumexp_f32, float, 0)
DEFINE_MAX_LOGSUMEXP(max_logsumexp_bf16, bf16_t, 1)
