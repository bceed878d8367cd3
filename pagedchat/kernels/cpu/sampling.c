/* What sampling needs from every row of logits (float32 or bfloat16), in one read of the
 * row: its largest value, the first index holding it (torch's argmax), and
 * log(sum(exp(row))) for the chosen token's log-probability. torch takes a pass for max
 * and two more for logsumexp, each over the whole [rows, vocab] matrix: here each row is read from memory once and its second pass comes from the
 * cache.
 * Built with attention.c by pagedchat/kernels/cpu; the torch reference
 * (reference.max_logsumexp) is the definition, and the tests compare the two.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "vector.h"

/* 16 logits from lane t on (lanes past the mask 0): float32 as they are, bfloat16 widened
 * exactly. */
static inline vf load16_logits(const void *x, int bf16, int64_t t, vmask m) {
    return bf16 ? vf_load_bf16((const bf16_t *)x + t, m) : vf_load_mask((const float *)x + t, m);
}

static inline float load_logit(const void *x, int bf16, int64_t t) {
    return bf16 ? bf16_load((const bf16_t *)x, t) : ((const float *)x)[t];
}

/* Inlined with a literal bf16, so each type gets its own loop. Each lane keeps its largest
 * value and the first position holding it, the position as a float32 (exact: sampling.py sends
 * rows of fewer than 2^24 logits only). */
static inline __attribute__((always_inline)) void
row_max_logsumexp(const void *x, int bf16, int n, float *top, int64_t *index, float *lse) {
    static const float first_positions[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                              14, 15};
    float peak = -INFINITY;
    int64_t at = 0;
    vf lane_peak = vf_set1(-INFINITY), lane_at = vf_zero();
    vf position = vf_load(first_positions);
    const vf step = vf_set1(16.0f);
    int t = 0;
    for (; t + 16 <= n; t += 16) {
        const vf v = load16_logits(x, bf16, t, 0xFFFF);
        /* strictly greater: each lane keeps the first index of its own maximum */
        const vmask better = vf_gt(v, lane_peak);
        lane_peak = vf_blend(better, lane_peak, v);
        lane_at = vf_blend(better, lane_at, position);
        position = vf_add(position, step);
    }
    float peaks[16], ats[16];
    vf_store(peaks, lane_peak);
    vf_store(ats, lane_at);
    for (int lane = 0; lane < 16; lane++)
        if (peaks[lane] > peak || (peaks[lane] == peak && (int64_t)ats[lane] < at)) {
            peak = peaks[lane];
            at = (int64_t)ats[lane];
        }
    for (; t < n; t++) {
        const float v = load_logit(x, bf16, t);
        if (v > peak) { peak = v; at = t; }
    }
    const vf shift = vf_set1(peak);
    vf sum = vf_zero();
    for (int s = 0; s < n; s += 16) {
        const vmask m = tail_mask(n - s);
        sum = vf_add(sum, vf_keep(m, vf_exp(vf_sub(load16_logits(x, bf16, s, m), shift))));
    }
    *top = peak;
    *index = at;
    *lse = peak + logf(vf_reduce_add(sum));
}

/* logits: [rows, vocab] of type T, rows row_stride elements apart; top and lse float32.
 * bfloat16 logits (the head's own output in a bfloat16 model) are read as they are, rather
 * than widened to float32 first by torch, a pass over the whole matrix. */
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

/* The screen of a greedy head (engine/layers/greedy_head.py): row r of `approx` holds
 * logits known to within norms[j] * slack[r] each. Every j whose interval reaches (or
 * touches) the highest lower end of the row, lowest = max_j (approx_j - norms_j * slack),
 * is a candidate; the row's true maximum is always one. The two passes' float32 rounding
 * is covered by lowering `lowest` by 2^-20 of the largest |approx_j| + norms_j * slack.
 * Writes the first `capacity` candidates of row r, in increasing j, to
 * found[r * capacity ...] and their number (which may exceed capacity) to counts[r]. */
static inline void keep_candidate(int j, int32_t *found, int capacity, int32_t *count) {
    if (*count < capacity) found[*count] = j;
    (*count)++;
}

/* Pass one reads the row once: its lowest bar and, per chunk of 256, the highest upper end;
 * pass two scans only the chunks whose highest upper end reaches the bar. Both compute an
 * upper end with the same fused multiply-add, so a chunk's highest is exactly one of its. */
enum { SCREEN_CHUNK = 256 };

static void screen_row(const float *a, int n, const float *norms, float s, float *chunk_top,
                       int32_t *found, int capacity, int32_t *count) {
    const vf slack = vf_set1(s), zero = vf_zero();
    vf low = vf_set1(-INFINITY), size = zero;
    const int whole = n / SCREEN_CHUNK * SCREEN_CHUNK;
    for (int c = 0; c < whole; c += SCREEN_CHUNK) {
        vf high = vf_set1(-INFINITY);
        for (int t = c; t < c + SCREEN_CHUNK; t += 16) {
            const vf v = vf_load(a + t), norm = vf_load(norms + t);
            low = vf_max(low, vf_fnmadd(norm, slack, v));
            high = vf_max(high, vf_fmadd(norm, slack, v));
            size = vf_max(size, vf_add(vf_max(v, vf_sub(zero, v)), vf_mul(norm, slack)));
        }
        chunk_top[c / SCREEN_CHUNK] = vf_reduce_max(high);
    }
    float lowest = vf_reduce_max(low), largest = vf_reduce_max(size);
    for (int j = whole; j < n; j++) {
        lowest = fmaxf(lowest, fmaf(-norms[j], s, a[j]));
        largest = fmaxf(largest, fabsf(a[j]) + norms[j] * s);
    }
    const float threshold = lowest - 0x1p-20f * largest;
    const vf bar = vf_set1(threshold);
    *count = 0;
    for (int c = 0; c < whole; c += SCREEN_CHUNK) {
        /* not below the bar: a row whose only values equal it keeps them */
        if (threshold > chunk_top[c / SCREEN_CHUNK]) continue;
        for (int t = c; t < c + SCREEN_CHUNK; t += 16) {
            vmask reach = (vmask)~vf_gt(bar, vf_fmadd(vf_load(norms + t), slack,
                                                      vf_load(a + t)));
            for (; reach; reach &= (vmask)(reach - 1))
                keep_candidate(t + __builtin_ctz(reach), found, capacity, count);
        }
    }
    for (int j = whole; j < n; j++)
        if (!(threshold > fmaf(norms[j], s, a[j]))) keep_candidate(j, found, capacity, count);
}

/* scratch: num_threads * (vocab / 256 + 1) floats, a row of chunk maxima per thread */
void screen_rows(const float *approx, int rows, int vocab, int64_t row_stride,
                 const float *norms, const float *slack, int32_t *found, int capacity,
                 int32_t *counts, float *scratch, int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(rows > 1 ? num_threads : 1)
    for (int r = 0; r < rows; r++)
        screen_row(approx + (int64_t)r * row_stride, vocab, norms, slack[r],
                   scratch + (int64_t)omp_get_thread_num() * (vocab / SCREEN_CHUNK + 1),
                   found + (int64_t)r * capacity, capacity, counts + r);
}
