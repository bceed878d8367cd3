/* The float32 kernels the decoder (cpu_decoder.c) calls, declared once; the files that
 * define them include this too, so a changed signature fails to compile. */
#ifndef PAGEDCHAT_CPU_KERNELS_H
#define PAGEDCHAT_CPU_KERNELS_H

#include <stdint.h>

void rms_norm_f32(const float *x, const float *residual, const float *weight, float *out,
                  float *sum_out, int rows, int dim, float eps, int num_threads);
void rotary_store_f32(const float *qkv, int64_t row_stride, const float *cos,
                      const float *sin, const int64_t *slots, float *q_out, float *k_cache,
                      float *v_cache, int tokens, int heads, int kv_heads, int head_dim,
                      int num_threads);
void silu_mul_f32(const float *gate_up, float *out, int rows, int width, int num_threads);
int paged_attention_f32(const float *query, const float *k_cache, const float *v_cache,
                        float *out, const int32_t *block_tables, const int32_t *context_lens,
                        const int32_t *query_start, const int32_t *rows,
                        const int32_t *row_seqs, int num_rows, int max_blocks, int num_heads,
                        int num_kv_heads, int head_dim, int block_size, float scale,
                        int num_threads);
void linear_blocked_f32(const float *x, const float *w, const float *bias, float *out,
                        int rows, int k_dim, int k_padded, int n_dim, int num_threads);

#endif
