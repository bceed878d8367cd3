/* The kernels the decoder (decoder.c) calls, declared once; the files that
 * define them include this too, so a changed signature fails to compile. */
#ifndef PAGEDCHAT_CPU_KERNELS_H
#define PAGEDCHAT_CPU_KERNELS_H

#include <stdint.h>

#include "vector.h"

/* Per element type T (float: _f32, bf16_t: _bf16). Each NAME_part is thread t's share of
 * NAME, for a caller already running a team of `count` threads: the same arithmetic,
 * split as NAME splits it. */
#define DECLARE_LAYER_KERNELS(T, S)                                                        \
    void rms_norm_##S(const T *x, const T *residual, const T *weight, T *out, T *sum_out,  \
                      int rows, int dim, float eps, int num_threads);                      \
    void rms_norm_##S##_part(const T *x, const T *residual, const T *weight, T *out,       \
                             T *sum_out, int rows, int dim, float eps, int t, int count);  \
    void rotary_store_##S(const T *qkv, int64_t row_stride, const T *cos, const T *sin,    \
                          const int64_t *slots, T *q_out, T *k_cache, T *v_cache,          \
                          int tokens, int heads, int kv_heads, int head_dim,               \
                          int num_threads);                                                \
    void rotary_store_##S##_part(const T *qkv, int64_t row_stride, const T *cos,           \
                                 const T *sin, const int64_t *slots, T *q_out, T *k_cache, \
                                 T *v_cache, int tokens, int heads, int kv_heads,          \
                                 int head_dim, int t, int count);                          \
    void silu_mul_##S(const T *gate_up, T *out, int rows, int width, int num_threads);     \
    void silu_mul_##S##_part(const T *gate_up, T *out, int rows, int width, int t,         \
                             int count);                                                   \
    void gelu_tanh_mul_##S(const T *gate_up, T *out, int rows, int width,                  \
                           int num_threads);                                               \
    void gelu_tanh_mul_##S##_part(const T *gate_up, T *out, int rows, int width, int t,    \
                                  int count);                                              \
    int paged_attention_##S(const T *query, const T *k_cache, const T *v_cache, T *out,    \
                            const int32_t *block_tables, const int32_t *context_lens,      \
                            const int32_t *query_start, const int32_t *rows,               \
                            const int32_t *row_seqs, int num_rows, int max_blocks,         \
                            int num_heads, int num_kv_heads, int head_dim, int block_size, \
                            float scale, int window, int num_threads);                     \
    int paged_attention_##S##_part(const T *query, const T *k_cache, const T *v_cache,     \
                                   T *out, const int32_t *block_tables,                    \
                                   const int32_t *context_lens, const int32_t *query_start,\
                                   const int32_t *rows, const int32_t *row_seqs,           \
                                   int num_rows, int max_blocks, int num_heads,            \
                                   int num_kv_heads, int head_dim, int block_size,         \
                                   float scale, int window, int t, int count);             \
    void linear_blocked_##S(const T *x, const T *w, const T *bias, T *out, int rows,       \
                            int k_dim, int k_padded, int n_dim, int num_threads);          \
    void linear_blocked_##S##_part(const T *x, const T *w, const T *bias, T *out,          \
                                   int rows, int k_dim, int k_padded, int n_dim, int t,    \
                                   int count);                                             \
    int quant_linear_##S(const T *x, const uint8_t *w, int type, const float *bias,        \
                         T *out, int rows, int k_dim, int n_dim, int64_t out_stride,       \
                         int num_threads, float *bounds);

DECLARE_LAYER_KERNELS(float, f32)
DECLARE_LAYER_KERNELS(bf16_t, bf16)

/* The same store and attention over int8 KV caches (kv8.h), queries and outputs of T. The
 * attention is attention_kv8.c's, built into a library of its own (build.APART): decoder.c
 * calls it through a pointer of type Kv8Attention_S. */
#define DECLARE_KV8_KERNELS(T, S)                                                          \
    void rotary_store_kv8_##S##_part(const T *qkv, int64_t row_stride, const T *cos,       \
                                     const T *sin, const int64_t *slots, T *q_out,         \
                                     int8_t *k_cache, int8_t *v_cache, int tokens,         \
                                     int heads, int kv_heads, int head_dim, int t,         \
                                     int count);                                           \
    int paged_attention_kv8_part_##S(const T *query, const int8_t *k_cache,                \
                                     const int8_t *v_cache, T *out,                        \
                                     const int32_t *block_tables,                          \
                                     const int32_t *context_lens,                          \
                                     const int32_t *query_start, const int32_t *rows,      \
                                     const int32_t *row_seqs, int num_rows,                \
                                     int max_blocks, int num_heads, int num_kv_heads,      \
                                     int head_dim, int block_size, float scale,            \
                                     int window, int t, int count);                        \
    typedef __typeof__(paged_attention_kv8_part_##S) *Kv8Attention_##S;

DECLARE_KV8_KERNELS(float, f32)
DECLARE_KV8_KERNELS(bf16_t, bf16)

/* Thread t of a team of `threads`: its share of a product on GGML blocks (quant.c), float32
 * x, out float32 or (out_bf16) bfloat16; equal shares of the output columns where bounds is
 * NULL, else as thread_run (ggml_formats.h) reads bounds. Returns 0, 1 for an unknown type, 2 when
 * out of memory. */
int quant_product_part(const float *x, const uint8_t *w, int type, const float *bias,
                       void *out, int out_bf16, int rows, int k_dim, int n_dim,
                       int64_t out_stride, int t, int threads, const float *bounds);

/* bounds (team + 1 fractions, see thread_run) for the next product, from each thread's
 * seconds in this one (busy): each thread's share of the columns in proportion to the
 * speed it showed (its share over its time), halfway from the old share, as one call's
 * times are noisy; at least half an equal share, so that a thread slowed down for a while
 * gets its work back. Two vCPUs of a virtual machine can differ in speed for minutes on
 * end, and with equal shares the faster would wait for the slower after every product.
 * Which thread multiplies a column does not change its sum. */
void rebalance(float *bounds, const double *busy, int team);

#endif
