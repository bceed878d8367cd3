/* A small decode batch through every decoder layer in one call (float32 or bfloat16).
 *
 * A Llama-family layer is nine kernels: the two norms, four products, rotary-and-store,
 * attention and SiLU-and-multiply. Qwen 3 adds the per-head norms of Q and K; Gemma 3 those
 * and a norm after attention and after the MLP, takes GELU(tanh) for SiLU, and its local
 * layers read their window (their group's) with a rope table of their own. Called one by
 * one from Python, each kernel call pays for its dispatch, a large share of a
 * single-stream step once the products read the weights at the memory's speed. Here the
 * same kernels, with the same arguments, run back to back in C, so the result is bit for
 * bit the one the calls from Python give (the tests compare the two). The caller
 * (decoder.py) sends a step here only when every product is the blocked one or a
 * quantized one and every query row goes to the row-by-row attention.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "ggml_formats.h"

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

/* One layer's weights and KV caches (blocks of block_size tokens). Norms, caches and a
 * blocked product's bias are of the step's element type; a quantized product's bias is
 * float32, as quantized_linear passes it. post_norm is the norm that adds the residual before the
 * MLP. Norms a layer may lack (NULL): q_norm and k_norm over each head (Qwen 3, Gemma 3),
 * attention_out_norm on attention's output and mlp_out_norm on the MLP's (Gemma 3).
 * rope and group: the layer's entries in the step's rope tables and attention groups.
 * Mirrors _DecoderLayer in decoder.py. */
typedef struct {
    const void *input_norm, *post_norm, *qkv_bias;
    Product qkv, o, gate_up, down;
    void *k_cache, *v_cache;
    const void *q_norm, *k_norm, *attention_out_norm, *mlp_out_norm;
    int block_size, rope, group;
} DecoderLayer;

/* One rope table's rows for the step's tokens: [rows, head_dim] each. */
typedef struct {
    const void *cos, *sin;
} RopeRows;

/* The metadata of the layers of one group (see kv_groups.py): where their K/V are stored
 * and which cached tokens each query row reads. Mirrors _AttentionGroup in decoder.py. */
typedef struct {
    const int64_t *slots;
    const int32_t *block_tables, *context_lens, *query_start, *row_ids, *row_seqs;
    int attention_rows, max_blocks;
    int window;  /* the group's sliding window, 0: none (see paged_attention in attention.h) */
} AttentionGroup;

/* The step: shapes, the rope tables and attention groups the layers name, scratch buffers
 * sized for its rows (of the element type), and `bounds`, num_threads + 1 fractions that
 * split the quantized products' columns among the threads (see thread_run in ggml_formats.h),
 * which the decoder adjusts after each call (rebalance in kernels.h). gelu: the MLP's
 * activation is GELU(tanh), else SiLU. Mirrors _DecoderStep in decoder.py. */
typedef struct {
    int rows, hidden, heads, kv_heads, head_dim, intermediate;
    int num_threads, gelu;
    /* where the caches hold int8 rows with their scales (kv8.h), their attention:
     * paged_attention_kv8_part_S of attention_kv8.c, a library of its own; else NULL */
    const void *kv8_attention;
    float eps, scale;
    const RopeRows *ropes;
    const AttentionGroup *groups;
    void *h, *qkv, *q, *attention, *gate_up, *act;
    float *wide;  /* bfloat16 steps on quantized products: x widened, [rows, widest input] */
    float *bounds;
} DecoderStep;

/* What the decoder returns besides 0. */
enum { ATTENTION_NO_MEMORY = 2, PRODUCT_NO_MEMORY = 3, PRODUCT_UNKNOWN_TYPE = 4 };

/* x as a quantized product reads it, float32: as it is, or (bfloat16) widened into wide,
 * each thread of the team its run of the elements, then the barrier after which every
 * thread reads all of them. */
static inline const float *widened_f32(const float *x, float *wide, int64_t n, int t,
                                       int team) {
    (void)wide, (void)n, (void)t, (void)team;
    return x;
}

static inline const float *widened_bf16(const bf16_t *x, float *wide, int64_t n, int t,
                                        int team) {
    for (int64_t i = n * t / team; i < n * (t + 1) / team; i++) wide[i] = bf16_load(x, i);
    _Pragma("omp barrier")
    return wide;
}

/* Thread t of the team's share of out = x W^T (+ bias): [rows, n_dim] from [rows, k_dim],
 * each quantized segment writing its columns of out in turn, as quantized_linear does.
 * Every thread of the team calls it (the bfloat16 widening waits for them all). Returns 0
 * or a decoder status. */
#define DEFINE_PRODUCT(T, S)                                                               \
static int product_##S(const Product *p, const T *x, float *wide, const void *bias,        \
                       T *out, int rows, int k_dim, int n_dim, int t, int team,            \
                       const float *bounds) {                                              \
    if (p->segments == NULL) {                                                             \
        linear_blocked_##S##_part(x, p->blocked, bias, out, rows, k_dim, p->padded, n_dim, \
                                  t, team);                                                \
        return 0;                                                                          \
    }                                                                                      \
    const float *xf = widened_##S(x, wide, (int64_t)rows * k_dim, t, team);                \
    const float *b = bias;                                                                 \
    for (int i = 0, first = 0; i < p->count; first += p->segments[i].rows, i++) {          \
        const QuantSegment *seg = &p->segments[i];                                         \
        if (quant_product_part(xf, seg->data, seg->type, b == NULL ? NULL : b + first,     \
                               out + first, sizeof(T) == sizeof(bf16_t), rows, k_dim,     \
                               seg->rows, n_dim, t, team, bounds))                         \
            return PRODUCT_NO_MEMORY;                                                      \
    }                                                                                      \
    return 0;                                                                              \
}

DEFINE_PRODUCT(float, f32)
DEFINE_PRODUCT(bf16_t, bf16)

/* Whether every quantized segment of every layer is in a format whose products were handed
 * over (checked before the team starts, as a product would refuse it). */
static int known_formats(const DecoderLayer *layers, int count) {
    for (int i = 0; i < count; i++) {
        const Product *products[] = {&layers[i].qkv, &layers[i].o, &layers[i].gate_up,
                                     &layers[i].down};
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < products[j]->count; k++)
                if (products_of(products[j]->segments[k].type) == NULL) return 0;
    }
    return 1;
}

/* Thread t of the team's share of the per-head norms of Q and K, in place in the qkv rows
 * ([rows, width]): each head normed as rms_norm over [tokens * heads, head_dim] norms it
 * (a row's result does not depend on which thread takes it). */
#define DEFINE_QK_NORM(T, S)                                                               \
static void qk_norm_##S(T *qkv, const T *q_norm, const T *k_norm, int rows, int width,    \
                        int heads, int kv_heads, int head_dim, float eps, int t,           \
                        int team) {                                                        \
    for (int r = rows * t / team; r < rows * (t + 1) / team; r++) {                       \
        T *q = qkv + (int64_t)r * width, *k = q + (int64_t)heads * head_dim;               \
        rms_norm_##S##_part(q, NULL, q_norm, q, NULL, heads, head_dim, eps, 0, 1);         \
        rms_norm_##S##_part(k, NULL, k_norm, k, NULL, kv_heads, head_dim, eps, 0, 1);      \
    }                                                                                      \
}

DEFINE_QK_NORM(float, f32)
DEFINE_QK_NORM(bf16_t, bf16)

/* x: [rows, hidden], the embeddings in, the last layer's MLP output (normed where it has
 * mlp_out_norm) out; residual:
 * [rows, hidden], the residual stream still to be added to x. Returns 0, or one of the
 * statuses above.
 *
 * One team of threads runs every layer: each kernel is called as its _part (the thread's
 * share, split as the kernel's own call splits it, a quantized product's columns as
 * s->bounds splits them), and the team meets at a barrier
 * wherever the next kernel reads what others wrote. That spares a parallel region per
 * kernel. A failure (out of memory) is kept and the team goes on to the end, so that every
 * thread meets every barrier; the results are then discarded. */
#define STEP_THEN(CALL, AFTER)                                                             \
    do {                                                                                   \
        const int code = (CALL);                                                           \
        AFTER;                                                                             \
        if (status == 0) status = code;                                                    \
        _Pragma("omp barrier")                                                             \
    } while (0)
#define STEP(CALL) STEP_THEN(CALL, (void)0)
/* a product's step, its time before the barrier added to the thread's `busy` */
#define PRODUCT_STEP(CALL)                                                                 \
    do {                                                                                   \
        const double start = omp_get_wtime();                                              \
        STEP_THEN(CALL, busy += omp_get_wtime() - start);                                  \
    } while (0)

/* The arguments of rotary-and-store and of attention in a layer of DEFINE_DECODER, the same
 * for float caches and int8 ones (s->kv8_attention). */
#define ROTARY_ARGS                                                                        \
    qkv, qkv_width, rope->cos, rope->sin, g->slots, q, k_cache, v_cache, rows, s->heads,  \
    s->kv_heads, s->head_dim, t, team
#define ATTENTION_ARGS                                                                     \
    q, k_cache, v_cache, attention, g->block_tables, g->context_lens, g->query_start,     \
    g->row_ids, g->row_seqs, g->attention_rows, g->max_blocks, s->heads, s->kv_heads,     \
    s->head_dim, l->block_size, s->scale, g->window, t, team

#define DEFINE_DECODER(NAME, T, S)                                                         \
int NAME(const DecoderLayer *layers, int count, const DecoderStep *s, T *x, T *residual) { \
    if (!known_formats(layers, count)) return PRODUCT_UNKNOWN_TYPE;                        \
    const int rows = s->rows, hidden = s->hidden;                                          \
    const int q_size = s->heads * s->head_dim;                                             \
    const int qkv_width = q_size + 2 * s->kv_heads * s->head_dim;                          \
    T *h = s->h, *qkv = s->qkv, *q = s->q, *attention = s->attention;                      \
    T *gate_up = s->gate_up, *act = s->act;                                                \
    float *wide = s->wide;                                                                 \
    int failed = 0, team_size = 0;                                                         \
    double busy_of[s->num_threads];  /* each thread's seconds in the products */           \
    _Pragma("omp parallel num_threads(s->num_threads)")                                    \
    {                                                                                      \
        const int t = omp_get_thread_num(), team = omp_get_num_threads();                  \
        const float *bounds = team == s->num_threads ? s->bounds : NULL;                   \
        double busy = 0.0;                                                                 \
        int status = 0;                                                                    \
        for (int i = 0; i < count; i++) {                                                  \
            const DecoderLayer *l = &layers[i];                                            \
            const RopeRows *rope = &s->ropes[l->rope];                                     \
            const AttentionGroup *g = &s->groups[l->group];                                \
            void *k_cache = l->k_cache, *v_cache = l->v_cache;                             \
            /* no residual before layer 0: the stream starts as the embeddings */          \
            if (i == 0 && t == 0) memcpy(residual, x, sizeof(T) * (size_t)rows * hidden);  \
            STEP((rms_norm_##S##_part(x, i == 0 ? NULL : residual, l->input_norm, h,       \
                                      i == 0 ? NULL : residual, rows, hidden, s->eps, t,   \
                                      team), 0));                                          \
            PRODUCT_STEP(product_##S(&l->qkv, h, wide, l->qkv_bias, qkv, rows, hidden,    \
                                     qkv_width, t, team, bounds));                         \
            if (l->q_norm != NULL)                                                         \
                STEP((qk_norm_##S(qkv, l->q_norm, l->k_norm, rows, qkv_width, s->heads,    \
                                  s->kv_heads, s->head_dim, s->eps, t, team), 0));         \
            STEP((s->kv8_attention ? rotary_store_kv8_##S##_part(ROTARY_ARGS)              \
                                   : rotary_store_##S##_part(ROTARY_ARGS), 0));            \
            STEP((s->kv8_attention                                                         \
                      ? ((Kv8Attention_##S)s->kv8_attention)(ATTENTION_ARGS)               \
                      : paged_attention_##S##_part(ATTENTION_ARGS))                        \
                 ? ATTENTION_NO_MEMORY : 0);                                               \
            PRODUCT_STEP(product_##S(&l->o, attention, wide, NULL, x, rows, q_size, hidden, \
                                     t, team, bounds));                                    \
            if (l->attention_out_norm != NULL)  /* in place: each row read, then written */ \
                STEP((rms_norm_##S##_part(x, NULL, l->attention_out_norm, x, NULL, rows,   \
                                          hidden, s->eps, t, team), 0));                   \
            STEP((rms_norm_##S##_part(x, residual, l->post_norm, h, residual, rows, hidden, \
                                      s->eps, t, team), 0));                               \
            PRODUCT_STEP(product_##S(&l->gate_up, h, wide, NULL, gate_up, rows, hidden,    \
                                     2 * s->intermediate, t, team, bounds));               \
            STEP((s->gelu ? gelu_tanh_mul_##S##_part(gate_up, act, rows, s->intermediate,  \
                                                     t, team)                              \
                          : silu_mul_##S##_part(gate_up, act, rows, s->intermediate, t,    \
                                                team), 0));                                \
            PRODUCT_STEP(product_##S(&l->down, act, wide, NULL, x, rows, s->intermediate,  \
                                     hidden, t, team, bounds));                            \
            if (l->mlp_out_norm != NULL)                                                   \
                STEP((rms_norm_##S##_part(x, NULL, l->mlp_out_norm, x, NULL, rows, hidden, \
                                          s->eps, t, team), 0));                           \
        }                                                                                  \
        if (status != 0) {                                                                 \
            _Pragma("omp atomic write")                                                    \
            failed = status;                                                               \
        }                                                                                  \
        busy_of[t] = busy;                                                                 \
        if (t == 0) team_size = team;                                                      \
    }                                                                                      \
    if (s->bounds != NULL && team_size == s->num_threads && failed == 0)                   \
        rebalance(s->bounds, busy_of, team_size);                                          \
    return failed;                                                                         \
}

DEFINE_DECODER(decoder_layers_f32, float, f32)
DEFINE_DECODER(decoder_layers_bf16, bf16_t, bf16)

/* The instruction-set level this library was built for (build.py names it). */
const char *kernels_isa(void) { return VF_ISA; }
