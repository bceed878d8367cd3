/* The small operations between a decoder layer's matrix products, one pass each.
 *
 * In torch each is five to eight separate operations (RMSNorm: pow, mean, add, rsqrt, two
 * multiplies, plus the residual add; rotary: two multiplies, a negation, a concatenation
 * and an add; SiLU- or GELU-and-multiply: two), and at one decoding sequence those calls, not the
 * arithmetic, are the cost.
 * The rotary pass also writes the step's keys and values into their cache slots.
 * Each comes in float32 and bfloat16 (the arithmetic in float32 either way; bfloat16
 * results are rounded where torch's bfloat16 operations round: the residual sum, the
 * normalised rows before the weight, each output).
 * The torch versions in reference.py are the definition; the tests compare the two.
 * Rows are split across threads only when there are enough of them to pay for it.
 * Each kernel is also given as NAME_part, one thread's share for a caller that already runs
 * a team of threads (the decoder stack, which opens one parallel region for all its layers).
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "kv8.h"
#include "vector.h"

/* Below this many elements a call stays on the calling thread. */
#define PARALLEL_MIN_ELEMENTS (1 << 15)

static int threads_for(int64_t elements, int num_threads) {
    return elements >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
}

/* Thread t of a team of `count`: its run [*first, *end) of n rows, the rows split between
 * as many of the team as threads_for gives (the rest get none). */
static inline void rows_of(int n, int64_t elements, int t, int count, int *first, int *end) {
    const int active = threads_for(elements, count);
    *first = t < active ? (int)((int64_t)n * t / active) : n;
    *end = t < active ? (int)((int64_t)n * (t + 1) / active) : n;
}

/* NAME(args, num_threads): NAME_part(args, t, count) on a team of threads_for(ELEMENTS). */
#define TEAM_CALL(NAME, ELEMENTS, ...)                                                     \
    const int team = threads_for((ELEMENTS), num_threads);                                 \
    _Pragma("omp parallel num_threads(team)")                                              \
    NAME##_part(__VA_ARGS__, omp_get_thread_num(), omp_get_num_threads())

/* Per element type P (F32, BF16; the kernels below take P and paste these names): a masked
 * load of 16 lanes as float32, a masked store (rounding), and the rounding a store would
 * do. */
#define F32_LOAD16(p, m) vf_load_mask((p), (m))
#define F32_STORE16(p, m, v) vf_store_mask((p), (m), (v))
#define F32_ROUND16(v) (v)
#define BF16_LOAD16(p, m) vf_load_bf16((p), (m))
#define BF16_STORE16(p, m, v) vf_store_bf16((p), (m), (v))
#define BF16_ROUND16(v) vf_round_bf16(v)

/* silu(g) for 16 lanes. e^-g kept finite: -ffast-math divides by way of a reciprocal,
 * which turns g / (1 + inf) into NaN; silu(g) for g < -80 is then ~1e-33 instead of -0. */
static inline vf silu16(vf g) {
    const vf e = vf_exp(vf_min(vf_sub(vf_zero(), g), vf_set1(80.0f)));
    return vf_div(g, vf_add(vf_set1(1.0f), e));
}

/* tanh-approximated GELU of 16 lanes, g (1 + tanh(u)) / 2 with u = sqrt(2 / pi) (g + 0.044715
 * g^3), written as g / (1 + e^-2u) (the same function: (1 + tanh(u)) / 2 = sigmoid(2u)),
 * e^-2u kept finite as in silu16. */
static inline vf gelu_tanh16(vf g) {
    const vf inner = vf_fmadd(vf_mul(vf_set1(0.044715f), vf_mul(g, g)), g, g);
    const vf minus_2u = vf_mul(vf_set1(-1.5957691216057308f), inner);
    const vf e = vf_exp(vf_min(minus_2u, vf_set1(80.0f)));
    return vf_div(g, vf_add(vf_set1(1.0f), e));
}

/* out = weight * ROUND(h / sqrt(mean(h^2) + eps)) with h = x (or ROUND(x + residual), also
 * written to sum_out). x, residual, out, sum_out: [rows, dim] contiguous; weight: [dim]. */
#define RMS_NORM_ROW(T, P)                                                                 \
    vf squares = vf_zero();                                                                \
    for (int i = 0; i < dim; i += 16) {                                                    \
        const vmask m = tail_mask(dim - i);                                                \
        vf v = P##_LOAD16(xr + i, m);                                                      \
        if (residual != NULL) {                                                            \
            v = P##_ROUND16(vf_add(v, P##_LOAD16(residual + base + i, m)));                \
            P##_STORE16(sum_out + base + i, m, v);                                         \
        }                                                                                  \
        squares = vf_fmadd(v, v, squares);                                                 \
    }                                                                                      \
    const T *h = residual != NULL ? sum_out + base : xr;                                   \
    const vf inverse = vf_set1(1.0f / sqrtf(vf_reduce_add(squares) / (float)dim + eps));   \
    for (int i = 0; i < dim; i += 16) {                                                    \
        const vmask m = tail_mask(dim - i);                                                \
        const vf normed = P##_ROUND16(vf_mul(P##_LOAD16(h + i, m), inverse));              \
        P##_STORE16(out + base + i, m, vf_mul(P##_LOAD16(weight + i, m), normed));         \
    }

#define DEFINE_RMS_NORM(NAME, T, P)                                                        \
void NAME##_part(const T *x, const T *residual, const T *weight, T *out, T *sum_out,       \
                 int rows, int dim, float eps, int t, int count) {                         \
    int first, end;                                                                        \
    rows_of(rows, (int64_t)rows * dim, t, count, &first, &end);                            \
    for (int r = first; r < end; r++) {                                                    \
        const int64_t base = (int64_t)r * dim;                                             \
        const T *xr = x + base;                                                            \
        RMS_NORM_ROW(T, P)                                                                 \
    }                                                                                      \
}                                                                                          \
                                                                                           \
void NAME(const T *x, const T *residual, const T *weight, T *out, T *sum_out, int rows,    \
          int dim, float eps, int num_threads) {                                           \
    TEAM_CALL(NAME, (int64_t)rows * dim, x, residual, weight, out, sum_out, rows, dim, eps); \
}

/* Rotate-half rotary embedding of one head: out[i] = x[i] cos[i] - x[i + half] sin[i],
 * out[i + half] = x[i + half] cos[i + half] + x[i] sin[i + half]. */
#define ROTATE_HEAD(P)                                                                     \
    for (int i = 0; i < half; i += 16) {                                                   \
        const vmask m = tail_mask(half - i);                                               \
        const vf lo = P##_LOAD16(x + i, m), hi = P##_LOAD16(x + half + i, m);              \
        P##_STORE16(out + i, m, vf_sub(vf_mul(lo, P##_LOAD16(cos + i, m)),                 \
                                       vf_mul(hi, P##_LOAD16(sin + i, m))));               \
        P##_STORE16(out + half + i, m, vf_add(vf_mul(hi, P##_LOAD16(cos + half + i, m)),   \
                                              vf_mul(lo, P##_LOAD16(sin + half + i, m)))); \
    }

/* The step before attention, per token: rotate its query and key heads, write the rotated
 * keys and the values straight into the token's cache slot (slot -1: not stored), and the
 * rotated queries to q_out. qkv: [tokens, (heads + 2 kv_heads) head_dim], rows row_stride
 * elements apart; cos, sin: [tokens, head_dim]; q_out: [tokens, heads, head_dim];
 * caches: [slots, kv_heads, head_dim]. */
#define DEFINE_ROTARY_STORE(NAME, T, P)                                                    \
static void NAME##_head(const T *restrict x, const T *restrict cos, const T *restrict sin, \
                        T *restrict out, int head_dim) {                                   \
    const int half = head_dim / 2;                                                         \
    ROTATE_HEAD(P)                                                                         \
}                                                                                          \
                                                                                           \
void NAME##_part(const T *qkv, int64_t row_stride, const T *cos, const T *sin,             \
                 const int64_t *slots, T *q_out, T *k_cache, T *v_cache, int tokens,       \
                 int heads, int kv_heads, int head_dim, int thread, int count) {           \
    const int64_t kv_row = (int64_t)kv_heads * head_dim;                                   \
    int first, end;                                                                        \
    rows_of(tokens, row_stride * tokens, thread, count, &first, &end);                     \
    for (int t = first; t < end; t++) {                                                    \
        const T *row = qkv + (int64_t)t * row_stride;                                      \
        const T *c = cos + (int64_t)t * head_dim;                                          \
        const T *s = sin + (int64_t)t * head_dim;                                          \
        for (int h = 0; h < heads; h++)                                                    \
            NAME##_head(row + (int64_t)h * head_dim, c, s,                                 \
                        q_out + ((int64_t)t * heads + h) * head_dim, head_dim);            \
        if (slots[t] < 0) continue;                                                        \
        const T *keys = row + (int64_t)heads * head_dim;                                   \
        T *k_slot = k_cache + slots[t] * kv_row;                                           \
        for (int h = 0; h < kv_heads; h++)                                                 \
            NAME##_head(keys + (int64_t)h * head_dim, c, s, k_slot + (int64_t)h * head_dim, \
                        head_dim);                                                         \
        const T *values = keys + kv_row;                                                   \
        T *v_slot = v_cache + slots[t] * kv_row;                                           \
        for (int64_t i = 0; i < kv_row; i++) v_slot[i] = values[i];                        \
    }                                                                                      \
}                                                                                          \
                                                                                           \
void NAME(const T *qkv, int64_t row_stride, const T *cos, const T *sin,                    \
          const int64_t *slots, T *q_out, T *k_cache, T *v_cache, int tokens, int heads,   \
          int kv_heads, int head_dim, int num_threads) {                                   \
    TEAM_CALL(NAME, row_stride * tokens, qkv, row_stride, cos, sin, slots, q_out, k_cache, \
              v_cache, tokens, heads, kv_heads, head_dim);                                 \
}

/* NAME (rotary_store_kv8_S): rotary_store_S's rotation, with the keys and values stored as
 * int8 rows with their scales (kv8.h): each key head rotated into a row of T, as
 * rotary_store_S would store it, then quantized from that row. */
#define DEFINE_ROTARY_STORE_KV8(NAME, T, S, LOAD1)                                         \
void NAME##_part(const T *qkv, int64_t row_stride, const T *cos, const T *sin,             \
                 const int64_t *slots, T *q_out, int8_t *k_cache, int8_t *v_cache,         \
                 int tokens, int heads, int kv_heads, int head_dim, int thread, int count) { \
    const int64_t head_bytes = kv8_head_bytes(head_dim);                                   \
    const int64_t kv_row = kv_heads * head_bytes;                                          \
    T key[head_dim];                                                                       \
    float wide[head_dim];                                                                  \
    int first, end;                                                                        \
    rows_of(tokens, row_stride * tokens, thread, count, &first, &end);                     \
    for (int t = first; t < end; t++) {                                                    \
        const T *row = qkv + (int64_t)t * row_stride;                                      \
        const T *c = cos + (int64_t)t * head_dim;                                          \
        const T *s = sin + (int64_t)t * head_dim;                                          \
        for (int h = 0; h < heads; h++)                                                    \
            rotary_store_##S##_head(row + (int64_t)h * head_dim, c, s,                     \
                                    q_out + ((int64_t)t * heads + h) * head_dim, head_dim); \
        if (slots[t] < 0) continue;                                                        \
        const T *keys = row + (int64_t)heads * head_dim;                                   \
        const T *values = keys + (int64_t)kv_heads * head_dim;                             \
        for (int h = 0; h < kv_heads; h++) {                                               \
            rotary_store_##S##_head(keys + (int64_t)h * head_dim, c, s, key, head_dim);    \
            for (int d = 0; d < head_dim; d++) wide[d] = LOAD1(key, d);                    \
            kv8_quantize(wide, k_cache + slots[t] * kv_row + h * head_bytes, head_dim);    \
            for (int d = 0; d < head_dim; d++)                                             \
                wide[d] = LOAD1(values + (int64_t)h * head_dim, d);                        \
            kv8_quantize(wide, v_cache + slots[t] * kv_row + h * head_bytes, head_dim);    \
        }                                                                                  \
    }                                                                                      \
}                                                                                          \
                                                                                           \
void NAME(const T *qkv, int64_t row_stride, const T *cos, const T *sin,                    \
          const int64_t *slots, T *q_out, int8_t *k_cache, int8_t *v_cache, int tokens,    \
          int heads, int kv_heads, int head_dim, int num_threads) {                        \
    TEAM_CALL(NAME, row_stride * tokens, qkv, row_stride, cos, sin, slots, q_out, k_cache, \
              v_cache, tokens, heads, kv_heads, head_dim);                                 \
}

#define F32_LOAD1(p, i) ((p)[i])
#define BF16_LOAD1(p, i) bf16_load((p), (i))

/* out = ACT(gate) * up (ACT: silu16 or gelu_tanh16), gate and up the two halves of each
 * row of gate_up ([rows, 2 * width] contiguous); out: [rows, width]. */
#define ACT_MUL_ROW(P, ACT)                                                                \
    for (int i = 0; i < width; i += 16) {                                                  \
        const vmask m = tail_mask(width - i);                                              \
        const vf act = ACT(P##_LOAD16(gate + i, m));                                       \
        P##_STORE16(o + i, m, vf_mul(P##_ROUND16(act), P##_LOAD16(up + i, m)));            \
    }

#define DEFINE_ACT_MUL(NAME, T, P, ACT)                                                    \
void NAME##_part(const T *gate_up, T *out, int rows, int width, int t, int count) {        \
    int first, end;                                                                        \
    rows_of(rows, (int64_t)rows * width, t, count, &first, &end);                          \
    for (int r = first; r < end; r++) {                                                    \
        const T *gate = gate_up + (int64_t)r * 2 * width;                                  \
        const T *up = gate + width;                                                        \
        T *o = out + (int64_t)r * width;                                                   \
        ACT_MUL_ROW(P, ACT)                                                                \
    }                                                                                      \
}                                                                                          \
                                                                                           \
void NAME(const T *gate_up, T *out, int rows, int width, int num_threads) {                \
    TEAM_CALL(NAME, (int64_t)rows * width, gate_up, out, rows, width);                     \
}

DEFINE_RMS_NORM(rms_norm_f32, float, F32)
DEFINE_ROTARY_STORE(rotary_store_f32, float, F32)
DEFINE_ACT_MUL(silu_mul_f32, float, F32, silu16)
DEFINE_ACT_MUL(gelu_tanh_mul_f32, float, F32, gelu_tanh16)
DEFINE_RMS_NORM(rms_norm_bf16, bf16_t, BF16)
DEFINE_ROTARY_STORE(rotary_store_bf16, bf16_t, BF16)
DEFINE_ACT_MUL(silu_mul_bf16, bf16_t, BF16, silu16)
DEFINE_ACT_MUL(gelu_tanh_mul_bf16, bf16_t, BF16, gelu_tanh16)
DEFINE_ROTARY_STORE_KV8(rotary_store_kv8_f32, float, f32, F32_LOAD1)
DEFINE_ROTARY_STORE_KV8(rotary_store_kv8_bf16, bf16_t, bf16, BF16_LOAD1)
