/* Paged attention for the CPU: reads K/V straight through the block table.
 *
 * A work item is a run of consecutive query rows of one sequence (a decode's one row, a
 * short chunk's or a speculative step's few) and a range of KV heads: all of them when
 * there are enough runs to keep every thread busy (so each token's K/V row is read once,
 * contiguously), one when there are few (a lone long decode). The run's rows take each
 * K and V tile together, as a KV head's query heads do, so a run of rows reads its
 * context once, not once a row. Scores for the whole context go to a scratch buffer,
 * then softmax, then the weighted sum of V: K and V are each read once. Both passes go 16 tokens at a time through row
 * pointers looked up in the block table, so a tile may span blocks and the block size
 * (1, 8, 16...) does not change the arithmetic's shape or speed.
 *
 * A decode step reads every sequence's K/V from memory, in scattered blocks, and that sets
 * its pace: items go to threads round-robin, and while a thread computes one item it
 * prefetches the rows of its next one (besides its own tiles a little ahead), so that
 * memory stays busy through the arithmetic. It runs on num_threads threads, torch's own intra-op count, so one
 * setting governs both (tensor-parallel workers each take their share of the cores).
 * Layout (the KV cache layout stated in kernels/reference.py):
 * caches [num_blocks, block_size, num_kv_heads, head_dim].
 * Built by pagedchat/kernels/cpu with the machine's C compiler; torch's reference
 * kernel is the definition of what is right and the tests compare the two.
 */
#include <stdint.h>

#include "attention.h"
#include "kernels.h"
#include "vector.h"


/* a float cache's elements need no scale */
#define NO_SCALE(head, head_dim) 1.0f

static inline vf load16_f32(const float *p) { return vf_load(p); }

static inline vf load16_bf16_all(const bf16_t *p) { return vf_load_bf16(p, 0xFFFF); }

/* How a score tile reads K: float32 rows, bfloat16 rows widened to float32, or (AVX-512
 * builds with AVX512-BF16) bfloat16 rows multiplied by vdpbf16ps with the raw query, 32
 * lanes at a time (exact products, float32 sums, no widening), the scale then going on
 * the sums as the reference computes them, (q . k) * scale. */
enum { KEYS_F32, KEYS_BF16, KEYS_BF16_DOT };

/* Scores of `shared` heads against up to 16 tokens: K rows rows[t] + head (in bytes);
 * head g's query at q + g * head_dim (scaled, float32) and raw + g * head_dim (unscaled,
 * the cache's type), its scores at scores + g * n. Inlined where keys and shared are
 * literals, so each instance keeps one branch. */
static inline __attribute__((always_inline)) void score_tile(
        const float *q, const void *raw, float scale, const char *const rows[TILE],
        int64_t head, int count, int head_dim, float *scores, int64_t n, const int shared,
        const int keys) {
    vf partial[SHARED_HEADS][16];
    (void)raw;
    for (int t = 0; t < 16; t++) {
        vf dot[SHARED_HEADS];
        for (int g = 0; g < shared; g++) dot[g] = vf_zero();
        if (t < count && keys == KEYS_F32) {
            const float *k = (const float *)(rows[t] + head);
            for (int d = 0; d < head_dim; d += 16)
                for (int g = 0; g < shared; g++)
                    dot[g] = vf_fmadd(vf_load(q + g * head_dim + d), vf_load(k + d), dot[g]);
        } else if (t < count && keys == KEYS_BF16) {
            const bf16_t *k = (const bf16_t *)(rows[t] + head);
            for (int d = 0; d < head_dim; d += 16) {
                const vf key = vf_load_bf16(k + d, 0xFFFF);
                for (int g = 0; g < shared; g++)
                    dot[g] = vf_fmadd(vf_load(q + g * head_dim + d), key, dot[g]);
            }
        }
#if defined(VF_AVX512) && defined(__AVX512BF16__)
        else if (t < count && keys == KEYS_BF16_DOT) {
            const bf16_t *k = (const bf16_t *)(rows[t] + head);
            for (int d = 0; d < head_dim; d += 32) {
                const __m512bh key = (__m512bh)_mm512_loadu_si512(k + d);
                for (int g = 0; g < shared; g++)
                    dot[g] = _mm512_dpbf16_ps(dot[g], (__m512bh)_mm512_loadu_si512(
                                                  (const bf16_t *)raw + g * head_dim + d), key);
            }
        }
#endif
        for (int g = 0; g < shared; g++) partial[g][t] = dot[g];
    }
    const vmask mask = tail_mask(count);
    for (int g = 0; g < shared; g++) {
        const vf sums = vf_sums16(partial[g]);
        vf_store_mask(scores + g * n, mask, keys == KEYS_BF16_DOT
                      ? vf_mul(sums, vf_set1(scale)) : sums);
    }
}

static inline __attribute__((always_inline)) void score_tile_f32(
        const float *q, const float *raw, float scale, const char *const rows[TILE],
        int64_t head, int count, int head_dim, float *scores, int64_t n, const int shared) {
    score_tile(q, raw, scale, rows, head, count, head_dim, scores, n, shared, KEYS_F32);
}

static inline __attribute__((always_inline)) void score_tile_bf16(
        const float *q, const bf16_t *raw, float scale, const char *const rows[TILE],
        int64_t head, int count, int head_dim, float *scores, int64_t n, const int shared) {
#if defined(VF_AVX512) && defined(__AVX512BF16__)
    if (head_dim % 32 == 0) {
        score_tile(q, raw, scale, rows, head, count, head_dim, scores, n, shared,
                   KEYS_BF16_DOT);
        return;
    }
#endif
    score_tile(q, raw, scale, rows, head, count, head_dim, scores, n, shared, KEYS_BF16);
}

DEFINE_VALUE_TILE(value_tile_f32, float, load16_f32, NO_SCALE)
DEFINE_VALUE_TILE(value_tile_bf16, bf16_t, load16_bf16_all, NO_SCALE)

#define F32_HEAD_BYTES(head_dim) ((int64_t)(head_dim) * (int64_t)sizeof(float))
#define BF16_HEAD_BYTES(head_dim) ((int64_t)(head_dim) * (int64_t)sizeof(bf16_t))

DEFINE_PAGED_ATTENTION(paged_attention_f32, paged_attention_f32_part, float, float,
                       F32_HEAD_BYTES, F32_LOAD, F32_STORE, F32_LOAD, NO_SCALE, score_tile_f32,
                       value_tile_f32)
DEFINE_PAGED_ATTENTION(paged_attention_bf16, paged_attention_bf16_part, bf16_t, bf16_t,
                       BF16_HEAD_BYTES, BF16_LOAD, BF16_STORE, BF16_LOAD, NO_SCALE,
                       score_tile_bf16, value_tile_bf16)
