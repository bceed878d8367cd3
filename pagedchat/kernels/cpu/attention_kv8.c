/* Paged attention over int8 KV caches (kv8.h): the row-by-row kernel of attention.h with
 * tiles that widen each token's 8-bit K and V rows to float32 in registers and apply
 * their scales there, K's to the token's score (q . k_q) * s, V's to its weight p * s.
 * Queries and outputs are float32 or bfloat16, as the model runs. */
#include <stdint.h>

#include "attention.h"
#include "kernels.h"
#include "kv8.h"
#include "vector.h"

#define KV8_LOAD(p, i) ((float)(p)[i])

/* Scores of `shared` heads against up to 16 tokens (as score_tile in attention.c, the keys
 * int8 rows at rows[t] + head bytes): each token's dot product with the scaled queries,
 * then times its key's scale. */
static inline __attribute__((always_inline)) void score_tile_kv8(
        const float *q, const void *raw, float scale, const char *const rows[TILE],
        int64_t head, int count, int head_dim, float *scores, int64_t n, const int shared) {
    vf partial[SHARED_HEADS][16];
    float key_scales[16];
    (void)raw, (void)scale;
    for (int t = 0; t < 16; t++) {
        vf dot[SHARED_HEADS];
        for (int g = 0; g < shared; g++) dot[g] = vf_zero();
        key_scales[t] = 0.0f;
        if (t < count) {
            const int8_t *k = (const int8_t *)(rows[t] + head);
            for (int d = 0; d < head_dim; d += 16) {
                const vf key = vf_load_i8(k + d);
                for (int g = 0; g < shared; g++)
                    dot[g] = vf_fmadd(vf_load(q + g * head_dim + d), key, dot[g]);
            }
            key_scales[t] = kv8_scale(k, head_dim);
        }
        for (int g = 0; g < shared; g++) partial[g][t] = dot[g];
    }
    const vmask mask = tail_mask(count);
    const vf scales = vf_load(key_scales);
    for (int g = 0; g < shared; g++)
        vf_store_mask(scores + g * n, mask, vf_mul(vf_sums16(partial[g]), scales));
}

DEFINE_VALUE_TILE(value_tile_kv8, int8_t, vf_load_i8, kv8_scale)

/* Built into a library of its own (build.APART), whose team shares decoder.c calls through
 * DecoderStep.kv8_attention: they are named as build.py's lookup of a kernel per type names
 * them (paged_attention_kv8_part_f32). */
DEFINE_PAGED_ATTENTION(paged_attention_kv8_f32, paged_attention_kv8_part_f32, float, int8_t,
                       kv8_head_bytes, F32_LOAD, F32_STORE, KV8_LOAD, kv8_scale, score_tile_kv8,
                       value_tile_kv8)
DEFINE_PAGED_ATTENTION(paged_attention_kv8_bf16, paged_attention_kv8_part_bf16, bf16_t, int8_t,
                       kv8_head_bytes, BF16_LOAD, BF16_STORE, KV8_LOAD, kv8_scale,
                       score_tile_kv8, value_tile_kv8)
