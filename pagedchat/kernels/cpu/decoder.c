/* A small decode batch through every decoder layer in one call (float32 or bfloat16).
 *
 * A layer is nine kernels: the two norms, four products, rotary-and-store, attention and
 * SiLU-and-multiply. Called one by one from Python, each call pays for its dispatch, a
 * large share of a single-stream step once the products read the weights at the memory's
 * speed. Here the same kernels, with the same arguments, run
 * back to back in C, so the result is bit for bit the one the calls from Python give
 * (the tests compare the two). The caller (decoder.py) sends a step here only when every
 * product is the blocked one or a quantized one and every query row goes to the row-by-row
 * attention.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Consecutive output rows of a quantized weight in one GGML format (quant.py's Segment). */
typedef struct {
    const uint8_t *data;
    int type, rows;
} QuantSegment;

/* One product's weight: oneDNN's blocked layout with its padded input width, or (where
 * segments is not NULL) GGML blocks in `count` row segments, as quantized_linear reads them. */
typedef struct {
    const void *blocked;
    int padded;
    const QuantSegment *segments;
    int count;
} Product;

/* One layer's weights and KV caches. Norms, caches and a blocked product's bias are of the
 * step's element type; a quantized product's bias is float32, as quantized_linear passes it.
 * Mirrors _DecoderLayer in decoder.py. */
typedef struct {
    const void *input_norm, *post_norm, *qkv_bias;
    Product qkv, o, gate_up, down;
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

/* What the decoder returns besides 0. */
enum { ATTENTION_NO_MEMORY = 2, PRODUCT_NO_MEMORY = 3, PRODUCT_UNKNOWN_TYPE = 4 };

/* out = x W^T (+ bias): [rows, n_dim] from [rows, k_dim], each quantized segment writing
 * its columns of out in turn, as quantized_linear does. Returns 0 or a decoder status. */
#define DEFINE_PRODUCT(T, S)                                                               \
static int product_##S(const Product *p, const T *x, const void *bias, T *out, int rows,   \
                       int k_dim, int n_dim, int threads) {                                \
    if (p->segments == NULL) {                                                             \
        linear_blocked_##S(x, p->blocked, bias, out, rows, k_dim, p->padded, n_dim,        \
                           threads);                                                       \
        return 0;                                                                          \
    }                                                                                      \
    const float *b = bias;                                                                 \
    for (int i = 0, first = 0; i < p->count; first += p->segments[i].rows, i++) {          \
        const QuantSegment *seg = &p->segments[i];                                         \
        const int status = quant_linear_##S(x, seg->data, seg->type,                       \
                                            b == NULL ? NULL : b + first, out + first,     \
                                            rows, k_dim, seg->rows, n_dim, threads);       \
        if (status == 2) return PRODUCT_NO_MEMORY;                                         \
        if (status != 0) return PRODUCT_UNKNOWN_TYPE;                                      \
    }                                                                                      \
    return 0;                                                                              \
}

DEFINE_PRODUCT(float, f32)
DEFINE_PRODUCT(bf16_t, bf16)

/* x: [rows, hidden], the embeddings in, the last layer's MLP output out; residual:
 * [rows, hidden], the residual stream still to be added to x. Returns 0, or one of the
 * statuses above. */
#define DEFINE_DECODER(NAME, T, S)                                                         \
int NAME(const DecoderLayer *layers, int count, const DecoderStep *s, T *x, T *residual) { \
    const int rows = s->rows, hidden = s->hidden, threads = s->num_threads;                \
    const int q_size = s->heads * s->head_dim;                                             \
    const int qkv_width = q_size + 2 * s->kv_heads * s->head_dim;                          \
    T *h = s->h, *qkv = s->qkv, *q = s->q, *attention = s->attention;                      \
    T *gate_up = s->gate_up, *act = s->act;                                                \
    int status = 0;                                                                        \
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
        if ((status = product_##S(&l->qkv, h, l->qkv_bias, qkv, rows, hidden, qkv_width,   \
                                  threads)))                                               \
            return status;                                                                 \
        rotary_store_##S(qkv, qkv_width, s->cos, s->sin, s->slots, q, k_cache, v_cache,    \
                         rows, s->heads, s->kv_heads, s->head_dim, threads);               \
        if ((status = paged_attention_##S(                                                 \
                 q, k_cache, v_cache, attention, s->block_tables, s->context_lens,         \
                 s->query_start, s->row_ids, s->row_seqs, s->attention_rows,               \
                 s->max_blocks, s->heads, s->kv_heads, s->head_dim, s->block_size,         \
                 s->scale, threads)))                                                      \
            return ATTENTION_NO_MEMORY;                                                    \
        if ((status = product_##S(&l->o, attention, NULL, x, rows, q_size, hidden,         \
                                  threads)))                                               \
            return status;                                                                 \
        rms_norm_##S(x, residual, l->post_norm, h, residual, rows, hidden, s->eps,         \
                     threads);                                                             \
        if ((status = product_##S(&l->gate_up, h, NULL, gate_up, rows, hidden,             \
                                  2 * s->intermediate, threads)))                          \
            return status;                                                                 \
        silu_mul_##S(gate_up, act, rows, s->intermediate, threads);                        \
        if ((status = product_##S(&l->down, act, NULL, x, rows, s->intermediate, hidden,   \
                                  threads)))                                               \
            return status;                                                                 \
    }                                                                                      \
    return 0;                                                                              \
}

DEFINE_DECODER(decoder_layers_f32, float, f32)
DEFINE_DECODER(decoder_layers_bf16, bf16_t, bf16)

/* The instruction-set level this library was built for (build.py names it). */
const char *kernels_isa(void) { return VF_ISA; }
