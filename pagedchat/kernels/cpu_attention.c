/* Paged attention for the CPU: reads K/V straight through the block table.
 *
 * One work item is one query row and one KV head (all the query heads of that
 * group share the K/V reads). Scores for the row's whole context go to a scratch
 * buffer, then softmax and the weighted sum of V: K and V are each read once.
 * Layout (DESIGN.md): caches [num_blocks, block_size, num_kv_heads, head_dim].
 * Built by pagedchat/kernels/cpu.py with the machine's C compiler; torch's reference
 * kernel is the definition of what is right and the tests compare the two.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_GROUP 16
#define MAX_DIM 256

typedef uint16_t bf16_t;

static inline float bf16_load(const bf16_t *p, int64_t i) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)p[i]) << 16;
    return v.f;
}

static inline bf16_t bf16_round(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    return (bf16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

#define F32_LOAD(p, i) ((p)[i])
#define F32_STORE(x) (x)
#define BF16_LOAD(p, i) bf16_load((p), (i))
#define BF16_STORE(x) bf16_round(x)

#define DEFINE_PAGED_ATTENTION(NAME, T, LOAD, STORE)                                        \
int NAME(const T *query, const T *k_cache, const T *v_cache, T *out,                        \
         const int32_t *block_tables, const int32_t *context_lens,                          \
         const int32_t *query_start, const int32_t *rows, const int32_t *row_seqs,          \
         int num_rows, int max_blocks, int num_heads, int num_kv_heads, int head_dim,       \
         int block_size, float scale) {                                                     \
    const int group = num_heads / num_kv_heads;                                             \
    if (group > MAX_GROUP || head_dim > MAX_DIM) return 1;                                  \
    const int64_t token_stride = (int64_t)num_kv_heads * head_dim;                          \
    int failed = 0;                                                                         \
    _Pragma("omp parallel for schedule(dynamic, 1)")                                        \
    for (int64_t item = 0; item < (int64_t)num_rows * num_kv_heads; item++) {               \
        const int row = rows[item / num_kv_heads];                                          \
        const int kv_head = (int)(item % num_kv_heads);                                     \
        const int seq = row_seqs[item / num_kv_heads];                                      \
        const int q_len = query_start[seq + 1] - query_start[seq];                          \
        const int n = context_lens[seq] - q_len + (row - query_start[seq]) + 1;             \
        const int32_t *table = block_tables + (int64_t)seq * max_blocks;                    \
        float q[MAX_GROUP][MAX_DIM];                                                        \
        float acc[MAX_GROUP][MAX_DIM];                                                      \
        float total[MAX_GROUP];                                                             \
        float *scores = malloc(sizeof(float) * (size_t)group * (size_t)n);                  \
        if (scores == NULL) { failed = 1; continue; }                                       \
        for (int g = 0; g < group; g++) {                                                   \
            const int64_t base = ((int64_t)row * num_heads + kv_head * group + g) * head_dim; \
            for (int d = 0; d < head_dim; d++) {                                            \
                q[g][d] = LOAD(query, base + d) * scale;                                    \
                acc[g][d] = 0.0f;                                                           \
            }                                                                               \
        }                                                                                   \
        for (int start = 0; start < n; start += block_size) {                               \
            const int64_t block = table[start / block_size];                                \
            const int count = n - start < block_size ? n - start : block_size;              \
            const T *k = k_cache + (block * block_size * num_kv_heads + kv_head) * head_dim; \
            for (int t = 0; t < count; t++, k += token_stride) {                            \
                for (int g = 0; g < group; g++) {                                           \
                    float dot = 0.0f;                                                       \
                    _Pragma("omp simd reduction(+:dot)")                                    \
                    for (int d = 0; d < head_dim; d++) dot += q[g][d] * LOAD(k, d);         \
                    scores[(int64_t)g * n + start + t] = dot;                               \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        for (int g = 0; g < group; g++) {                                                   \
            float *s = scores + (int64_t)g * n;                                             \
            float peak = s[0];                                                              \
            for (int t = 1; t < n; t++) peak = s[t] > peak ? s[t] : peak;                   \
            float sum = 0.0f;                                                               \
            _Pragma("omp simd reduction(+:sum)")                                            \
            for (int t = 0; t < n; t++) { s[t] = expf(s[t] - peak); sum += s[t]; }          \
            total[g] = sum;                                                                 \
        }                                                                                   \
        for (int start = 0; start < n; start += block_size) {                               \
            const int64_t block = table[start / block_size];                                \
            const int count = n - start < block_size ? n - start : block_size;              \
            const T *v = v_cache + (block * block_size * num_kv_heads + kv_head) * head_dim; \
            for (int t = 0; t < count; t++, v += token_stride) {                            \
                for (int g = 0; g < group; g++) {                                           \
                    const float p = scores[(int64_t)g * n + start + t];                     \
                    _Pragma("omp simd")                                                     \
                    for (int d = 0; d < head_dim; d++) acc[g][d] += p * LOAD(v, d);         \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        for (int g = 0; g < group; g++) {                                                   \
            const int64_t base = ((int64_t)row * num_heads + kv_head * group + g) * head_dim; \
            const float inv = 1.0f / total[g];                                              \
            for (int d = 0; d < head_dim; d++) out[base + d] = STORE(acc[g][d] * inv);      \
        }                                                                                   \
        free(scores);                                                                       \
    }                                                                                       \
    return failed ? 2 : 0;                                                                  \
}

DEFINE_PAGED_ATTENTION(paged_attention_f32, float, F32_LOAD, F32_STORE)
DEFINE_PAGED_ATTENTION(paged_attention_bf16, bf16_t, BF16_LOAD, BF16_STORE)
