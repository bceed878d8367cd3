/* The small operations between a decoder layer's matrix products, one pass each.
 *
 * In torch each is five to eight separate operations (RMSNorm: pow, mean, add, rsqrt, two
 * multiplies, plus the residual add; rotary: two multiplies, a negation, a concatenation
 * and an add; SiLU-and-multiply: two), and at one decoding sequence those calls, not the
 * arithmetic, are the cost: about a third of a single-stream step on this model.
 * The rotary pass also writes the step's keys and values into their cache slots.
 * The torch versions in reference.py are the definition; the tests compare the two.
 * Rows are split across threads only when there are enough of them to pay for it.
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_vector.h"

/* Below this many elements a call stays on the calling thread. */
#define PARALLEL_MIN_ELEMENTS (1 << 15)

static int threads_for(int64_t elements, int num_threads) {
    return elements >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
}

static float sum_of_squares(const float *x, int n) {
#if defined(HAVE_AVX512)
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float total = 0.0f;
    for (int i = 0; i < n; i++) total += x[i] * x[i];
    return total;
#endif
}

/* out = weight * (h / sqrt(mean(h^2) + eps)) with h = x (+ residual, then also written to
 * sum_out). x, residual, out, sum_out: [rows, dim] contiguous; weight: [dim]. */
void rms_norm_f32(const float *x, const float *residual, const float *weight, float *out,
                  float *sum_out, int rows, int dim, float eps, int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(threads_for((int64_t)rows * dim, num_threads))
    for (int r = 0; r < rows; r++) {
        const int64_t base = (int64_t)r * dim;
        const float *h = x + base;
        if (residual != NULL) {
            for (int i = 0; i < dim; i++) sum_out[base + i] = x[base + i] + residual[base + i];
            h = sum_out + base;
        }
        const float inverse = 1.0f / sqrtf(sum_of_squares(h, dim) / (float)dim + eps);
        for (int i = 0; i < dim; i++) out[base + i] = weight[i] * (h[i] * inverse);
    }
}

/* Rotate-half rotary embedding of one head: out[i] = x[i] cos[i] - x[i + half] sin[i],
 * out[i + half] = x[i + half] cos[i + half] + x[i] sin[i + half]. */
static void rotate(const float *restrict x, const float *restrict cos, const float *restrict sin,
                   float *restrict out, int head_dim) {
    const int half = head_dim / 2;
#if defined(HAVE_AVX512)
    for (int i = 0; i < half; i += 16) {
        const __mmask16 m = tail_mask(half - i);
        const __m512 lo = _mm512_maskz_loadu_ps(m, x + i);
        const __m512 hi = _mm512_maskz_loadu_ps(m, x + half + i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_sub_ps(
            _mm512_mul_ps(lo, _mm512_maskz_loadu_ps(m, cos + i)),
            _mm512_mul_ps(hi, _mm512_maskz_loadu_ps(m, sin + i))));
        _mm512_mask_storeu_ps(out + half + i, m, _mm512_add_ps(
            _mm512_mul_ps(hi, _mm512_maskz_loadu_ps(m, cos + half + i)),
            _mm512_mul_ps(lo, _mm512_maskz_loadu_ps(m, sin + half + i))));
    }
#else
    for (int i = 0; i < half; i++) {
        out[i] = x[i] * cos[i] - x[i + half] * sin[i];
        out[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
#endif
}

/* The step before attention, per token: rotate its query and key heads, write the rotated
 * keys and the values straight into the token's cache slot (slot -1: not stored), and the
 * rotated queries to q_out. qkv: [tokens, (heads + 2 kv_heads) head_dim], rows row_stride
 * floats apart; cos, sin: [tokens, head_dim]; q_out: [tokens, heads, head_dim];
 * caches: [slots, kv_heads, head_dim]. */
void rotary_store_f32(const float *qkv, int64_t row_stride, const float *cos, const float *sin,
                      const int64_t *slots, float *q_out, float *k_cache, float *v_cache,
                      int tokens, int heads, int kv_heads, int head_dim, int num_threads) {
    const int64_t kv_row = (int64_t)kv_heads * head_dim;
    #pragma omp parallel for schedule(static) num_threads(threads_for(row_stride * tokens, num_threads))
    for (int t = 0; t < tokens; t++) {
        const float *row = qkv + (int64_t)t * row_stride;
        const float *c = cos + (int64_t)t * head_dim;
        const float *s = sin + (int64_t)t * head_dim;
        for (int h = 0; h < heads; h++)
            rotate(row + (int64_t)h * head_dim, c, s,
                   q_out + ((int64_t)t * heads + h) * head_dim, head_dim);
        if (slots[t] < 0) continue;
        const float *keys = row + (int64_t)heads * head_dim;
        float *k_slot = k_cache + slots[t] * kv_row;
        for (int h = 0; h < kv_heads; h++)
            rotate(keys + (int64_t)h * head_dim, c, s, k_slot + (int64_t)h * head_dim, head_dim);
        const float *values = keys + kv_row;
        float *v_slot = v_cache + slots[t] * kv_row;
        for (int64_t i = 0; i < kv_row; i++) v_slot[i] = values[i];
    }
}

/* out = silu(gate) * up, gate and up the two halves of each row of gate_up
 * ([rows, 2 * width] contiguous); out: [rows, width]. */
void silu_mul_f32(const float *gate_up, float *out, int rows, int width, int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(threads_for((int64_t)rows * width, num_threads))
    for (int r = 0; r < rows; r++) {
        const float *gate = gate_up + (int64_t)r * 2 * width;
        const float *up = gate + width;
        float *o = out + (int64_t)r * width;
#if defined(HAVE_AVX512)
        const __m512 one = _mm512_set1_ps(1.0f);
        /* e^-g kept finite: -ffast-math divides by way of a reciprocal, which turns
         * g / (1 + inf) into NaN; silu(g) for g < -80 is then ~1e-33 instead of -0. */
        const __m512 most = _mm512_set1_ps(80.0f);
        for (int i = 0; i < width; i += 16) {
            const __mmask16 m = tail_mask(width - i);
            const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
            const __m512 e = exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), most));
            const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
        }
#else
        for (int i = 0; i < width; i++)
            o[i] = gate[i] / (1.0f + expf(fminf(-gate[i], 80.0f))) * up[i];
#endif
    }
}
