/* A small decode batch through every decoder layer in one call (float32 or bfloat16).
 *
 * A layer is nine kernels: the two norms, four products, rotary-and-store, attention and
 * SiLU-and-multiply. Called one by one from Python, each call pays for its dispatch, a
 * large share of a single-stream step once the products read the weights at the memory's
 * speed. Here the same kernels, with the same arguments, run
 * back to back in C, so the result is bit for bit the one the calls from Python give
 * (the tests compare the two). The caller (decoder.py) sends a step here only when every
 * product can be the blocked one and every query row goes to the row-by-row attention.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* One layer's weights (products in oneDNN's blocked layout, with their padded input
 * widths) and KV caches, all of the step's element type. Mirrors _DecoderLayer in decoder.py. */
typedef struct {
    const void *input_norm, *post_norm;
    const void *qkv, *qkv_bias, *o, *gate_up, *down;
    int qkv_padded, o_padded, gate_up_padded, down_padded;
    void *k_cache, *v_cache;
} DecoderLayer;

/* The step: shapes, the attention metadata shared by every layer, scratch buffers sized
 * for its rows (of the element type). Mirrors _DecoderStep in decoder.py. */
typedef struct {
    int rows, hidden, heads, kv_heads, head_dim, intermediate, block_size, max_blocks;
    int attention_rows, num_threads;
    float eps, scale;
    const void *cos, *sin;
    const int64_t *slots;
    const int32_t *block_tables, *context_lens, *query_start, *row_ids, *row_seqs;
    void *h, *qkv, *q, *attention, *gate_up, *act;
} DecoderStep;

/* x: [rows, hidden], the embeddings in, the last layer's MLP output out; residual:
 * [rows, hidden], the residual stream still to be added to x. Returns 0, or 2 where the
 * attention could not allocate its buffer. */
#define DEFINE_DECODER(NAME, T, S)                                                         \
int NAME(const DecoderLayer *layers, int count, const DecoderStep *s, T *x, T *residual) { \
    const int rows = s->rows, hidden = s->hidden, threads = s->num_threads;                \
    const int q_size = s->heads * s->head_dim;                                             \
    const int qkv_width = q_size + 2 * s->kv_heads * s->head_dim;                          \
    T *h = s->h, *qkv = s->qkv, *q = s->q, *attention = s->attention;                      \
    T *gate_up = s->gate_up, *act = s->act;                                                \
    for (int i = 0; i < count; i++) {                                                      \
        const DecoderLayer *l = &layers[i];                                                \
        T *k_cache = l->k_cache, *v_cache = l->v_cache;                                    \
        if (i == 0) {  /* no residual yet: the stream starts as the embeddings */          \
            rms_norm_##S(x, NULL, l->input_norm, h, NULL, rows, hidden, s->eps, threads);  \
            memcpy(residual, x, sizeof(T) * (size_t)rows * hidden);                        \
        } else {                                                                           \
            rms_norm_##S(x, residual, l->input_norm, h, residual, rows, hidden, s->eps,    \
                         threads);                                                         \
        }                                                                                  \
        linear_blocked_##S(h, l->qkv, l->qkv_bias, qkv, rows, hidden, l->qkv_padded,       \
                           qkv_width, threads);                                            \
        rotary_store_##S(qkv, qkv_width, s->cos, s->sin, s->slots, q, k_cache, v_cache,    \
                         rows, s->heads, s->kv_heads, s->head_dim, threads);               \
        const int status = paged_attention_##S(                                            \
            q, k_cache, v_cache, attention, s->block_tables, s->context_lens,              \
            s->query_start, s->row_ids, s->row_seqs, s->attention_rows, s->max_blocks,     \
            s->heads, s->kv_heads, s->head_dim, s->block_size, s->scale, threads);         \
        if (status != 0) return status;                                                    \
        linear_blocked_##S(attention, l->o, NULL, x, rows, q_size, l->o_padded, hidden,    \
                           threads);                                                       \
        rms_norm_##S(x, residual, l->post_norm, h, residual, rows, hidden, s->eps,         \
                     threads);                                                             \
        linear_blocked_##S(h, l->gate_up, NULL, gate_up, rows, hidden, l->gate_up_padded,  \
                           2 * s->intermediate, threads);                                  \
        silu_mul_##S(gate_up, act, rows, s->intermediate, threads);                        \
        linear_blocked_##S(act, l->down, NULL, x, rows, s->intermediate, l->down_padded,   \
                           hidden, threads);                                               \
    }                                                                                      \
    return 0;                                                                              \
}

DEFINE_DECODER(decoder_layers_f32, float, f32)
DEFINE_DECODER(decoder_layers_bf16, bf16_t, bf16)

/* The instruction-set level this library was built for (build.py names it). */
const char *kernels_isa(void) { return VF_ISA; }
