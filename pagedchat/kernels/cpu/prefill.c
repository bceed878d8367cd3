/* Paged attention for prompt chunks on the CPU: query tiles against key tiles, read
 * through the block table.
 *
 * A chunk of new queries attends causally to its sequence's cached prefix and to itself.
 * Row by row (attention.c) each query row reads the whole context again; here a work
 * item is MAX_ROWS query rows (a few positions times the query heads that share one KV
 * head), and each 16-key tile of K and V serves all of them. The scores are a small
 * matrix product: K, transposed once per call, gives one 16-key vector per dimension, and
 * each row takes one fused multiply-add per dimension, its vector in a register. Each
 * row's scores (the item's keys, in L2) then get their softmax, and the weighted sum of V
 * is another small product: V, gathered into token order once per call (rather than read
 * through the block table for every 16 dimensions), is read a key at a time for as many
 * rows as keep all their output vectors in registers. It needs no mask. Float32 or
 * bfloat16 (computed in float32), head sizes that are multiples of 16 up to MAX_HEAD_DIM
 * and groups of up to MAX_ROWS query heads only; attention.py sends the rest to SDPA. The
 * torch reference kernel is the definition; the tests compare the two.
 * Layout (the KV cache layout stated in kernels/reference.py):
 * caches [num_blocks, block_size, num_kv_heads, head_dim], or int8
 * rows with their scales (kv8.h), de-quantized as they are gathered.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "kv8.h"
#include "vector.h"

/* Query rows (positions x heads of one KV group) per item: their score vectors, one
 * register each, stay in registers while K's tile streams past. */
#if VF_REGISTERS >= 32
#define MAX_ROWS 24
#else
#define MAX_ROWS 8
#endif
/* The weighted sum of V keeps SUM_VECTORS output vectors in registers at once (its
 * accumulators), at most SUM_SLICE of them from one row; AVX2's own loops (below) count
 * its 16 registers of 8 floats instead. */
#if VF_REGISTERS >= 32
#define SUM_VECTORS MAX_ROWS
#define SUM_SLICE 4
/* its passes unrolled, so that each pass's rows and columns are literals and its
 * accumulators registers (else GCC keeps them in memory) */
#define PASSES_UNROLLED UNROLLED
#else
#define SUM_VECTORS 6
#define SUM_SLICE 2
#define PASSES_UNROLLED
#endif
#if defined(VF_AVX2)
#define SCORE_ROWS 4
#define SUM_ROWS 4
#define SUM_WIDTH 2
#endif
#define KEY_TILE 16
#define MAX_HEAD_DIM 256
/* Loops over the rows are unrolled, so that each row's vector is a register of its own
 * (rolled, GCC kept them in memory: a load and a store around every multiply-add). */
#define UNROLLED _Pragma("GCC unroll 24")

/* The arguments of paged_prefill_f32 / _bf16 (query, caches and out of that type). */
#define PREFILL_ARGS                                                                       \
    const void *query, const void *k_cache, const void *v_cache, void *out,               \
    const int32_t *block_tables, const int32_t *context_lens, const int32_t *query_start, \
    const int32_t *seqs, int num_seqs, int max_blocks, int num_heads, int num_kv_heads,   \
    int head_dim, int block_size, float scale, int window, int num_threads

typedef struct {
    const void *query;  /* float or bf16_t: see the bf16 flag below */
    void *out;
    const float *keys_t;  /* each listed sequence's K, transposed: see gather_kv */
    const float *values;  /* and its V, in token order: see gather_kv */
    const int64_t *keys_at;  /* where each listed sequence's starts in both */
    const int32_t *block_tables, *context_lens, *query_start;
    int max_blocks, num_heads, num_kv_heads, block_size, group;
    int window;  /* a query at position p reads keys p - window + 1 .. p; 0: from key 0 */
    float scale;
} Prefill;

static inline int64_t padded(int n) { return (n + KEY_TILE - 1) / KEY_TILE * KEY_TILE; }

/* Floats between two dimensions of the transposed keys (and two rows of scores): the keys
 * rounded up to an odd number of tiles, so that the 64-byte lines of one tile's rows fall
 * in different L1 sets (at a stride of 1,024 keys they all fell in one: half the speed). */
static inline int64_t key_width(int context) {
    const int64_t tiles = padded(context) / KEY_TILE;
    return (tiles | 1) * KEY_TILE;
}

/* The slot of token `token` of a sequence, through its block table. */
static inline int64_t slot_of(const int32_t *table, int block_size, int token) {
    return (int64_t)table[token / block_size] * block_size + token % block_size;
}

/* Element i of a float32 or (bf16 set) bfloat16 array, as float32; 16 stored.
 * bf16 is a literal wherever these are inlined, so each build keeps one branch. */
static inline __attribute__((always_inline)) float load_at(const void *p, int64_t i,
                                                           const int bf16) {
    return bf16 ? bf16_load((const bf16_t *)p, i) : ((const float *)p)[i];
}

static inline __attribute__((always_inline)) void store16_at(void *p, int64_t i, vf v,
                                                             const int bf16) {
    if (bf16)
        vf_store_bf16((bf16_t *)p + i, 0xFFFF, v);
    else
        vf_store((float *)p + i, v);
}

/* Element d of the KV head at byte `at` of a cache as float32: of the query's type (bf16 as
 * in load_at), or (kv8) an int8 row's value times its scale. */
static inline __attribute__((always_inline)) float kv_at(const void *cache, int64_t at,
                                                         int d, int head_dim, const int bf16,
                                                         const int kv8) {
    const char *head = (const char *)cache + at;
    if (kv8) return (float)((const int8_t *)head)[d] * kv8_scale((const int8_t *)head, head_dim);
    return load_at(head, d, bf16);
}

/* keys_t[kv][d][t] = K of token t, head kv, dimension d, and values[kv][t][d] = V of it
 * (as float32, de-quantized from an int8 cache), for from <= t < context (zeros from the
 * tile of `from` up to it and from context up to key_width; tiles before it are never
 * read), read once per call through the block table: the items then read both
 * contiguously, with no slot arithmetic. The table's entries before `from` (the chunk's
 * first window) may be holes. */
static inline __attribute__((always_inline)) void gather_kv(
        const void *k_cache, const void *v_cache, const int32_t *table, int block_size,
        int from, int context, int num_kv_heads, int head_dim, float *keys_t, float *values,
        const int bf16, const int kv8) {
    const int64_t width = key_width(context);
    const int64_t head_bytes = kv8 ? kv8_head_bytes(head_dim)
                                   : (int64_t)head_dim * (bf16 ? 2 : 4);
    for (int t = from / KEY_TILE * KEY_TILE; t < width; t++) {
        const int64_t k = t >= from && t < context
            ? slot_of(table, block_size, t) * num_kv_heads * head_bytes : -1;
        for (int kv = 0; kv < num_kv_heads; kv++)
            for (int d = 0; d < head_dim; d++) {
                const int64_t at = k + kv * head_bytes;
                keys_t[((int64_t)kv * head_dim + d) * width + t] =
                    k >= 0 ? kv_at(k_cache, at, d, head_dim, bf16, kv8) : 0.0f;
                values[((int64_t)kv * width + t) * head_dim + d] =
                    k >= 0 ? kv_at(v_cache, at, d, head_dim, bf16, kv8) : 0.0f;
            }
    }
}

/* Which of the 16 keys from `start` the query at `position` sees: up to its own, and within
 * its window (window > 0). */
static inline vmask seen_keys(int position, int start, int window) {
    const vmask causal = tail_mask(position - start + 1);
    return window > 0 ? causal & (vmask)~tail_mask(position - window + 1 - start) : causal;
}

/* Scores of the rows of an item against the 16 keys of the tile at `start`: row r (at
 * position first + r / group, past `seen_from` = the cached prefix plus first) sees keys up
 * to its own position (and within its window), the rest get -3e38 (finite: -ffast-math
 * assumes no infinities), so that their weight is 0. Each row's scores go to
 * scores + r * width + start. */
static inline __attribute__((always_inline)) void tile_scores(
        float q[][MAX_HEAD_DIM], const float *keys_t, int64_t width, int start,
        int seen_from, int group, int window, const int rows, const int head_dim,
        float *scores) {
#if defined(VF_AVX2)
    /* SCORE_ROWS rows a pass: their 16 scores take 8 of the 16 registers, the tile's keys
     * for one dimension 2 and a broadcast query value 1 (a vf per row spilled) */
    UNROLLED
    for (int r0 = 0; r0 < rows; r0 += SCORE_ROWS) {
        const int n = rows - r0 < SCORE_ROWS ? rows - r0 : SCORE_ROWS;
        __m256 lo[SCORE_ROWS], hi[SCORE_ROWS];
        UNROLLED
        for (int r = 0; r < n; r++) lo[r] = hi[r] = _mm256_setzero_ps();
        for (int d = 0; d < head_dim; d++) {
            const float *k = keys_t + (int64_t)d * width + start;
            const __m256 k_lo = _mm256_loadu_ps(k), k_hi = _mm256_loadu_ps(k + 8);
            UNROLLED
            for (int r = 0; r < n; r++) {
                const __m256 x = _mm256_broadcast_ss(&q[r0 + r][d]);
                lo[r] = _mm256_fmadd_ps(x, k_lo, lo[r]);
                hi[r] = _mm256_fmadd_ps(x, k_hi, hi[r]);
            }
        }
        for (int r = 0; r < n; r++) {
            const vmask seen = seen_keys(seen_from + (r0 + r) / group, start, window);
            vf_store(scores + (r0 + r) * width + start,
                     vf_blend(seen, vf_set1(-3.0e38f), (vf){lo[r], hi[r]}));
        }
    }
#else
    vf s[MAX_ROWS];
    UNROLLED
    for (int r = 0; r < rows; r++) s[r] = vf_zero();
    for (int d = 0; d < head_dim; d++) {
        const vf k = vf_load(keys_t + (int64_t)d * width + start);
        UNROLLED
        for (int r = 0; r < rows; r++) s[r] = vf_fmadd(vf_set1(q[r][d]), k, s[r]);
    }
    for (int r = 0; r < rows; r++) {
        const vmask seen = seen_keys(seen_from + r / group, start, window);
        vf_store(scores + r * width + start, vf_blend(seen, vf_set1(-3.0e38f), s[r]));
    }
#endif
}

/* out = probs V for the item's first `valid` rows (their probabilities in scores, a row
 * every `width` floats, over keys `from` to `keys`): a slice of each row's output for a
 * few rows at a time, the slices' accumulators in registers, each key's V slice loaded
 * once for those rows. A head wider than a slice takes several. */
static inline __attribute__((always_inline)) void weighted_sum(
        const Prefill *p, const float *values, const float *scores, int64_t width, int from,
        int keys, int q_start, int first, int kv, const int rows, int valid,
        const int head_dim, const int bf16) {
    const int group = p->group;
#if defined(VF_AVX2)
    /* SUM_ROWS rows by SUM_WIDTH registers of 8 dimensions (an even number): their sums
     * take 8 of the 16 registers, the weights' broadcasts and V's loads the rest */
    const int lanes = head_dim / 8;
    for (int c0 = 0; c0 < lanes; c0 += SUM_WIDTH) {
        const int cols = lanes - c0 < SUM_WIDTH ? lanes - c0 : SUM_WIDTH;  /* even */
        UNROLLED
        for (int r0 = 0; r0 < rows; r0 += SUM_ROWS) {
            const int n = rows - r0 < SUM_ROWS ? rows - r0 : SUM_ROWS;
            if (r0 >= valid) break;
            __m256 a[SUM_ROWS][SUM_WIDTH];
            UNROLLED
            for (int r = 0; r < n; r++) {
                UNROLLED
                for (int c = 0; c < cols; c++) a[r][c] = _mm256_setzero_ps();
            }
            for (int t = from; t < keys; t++) {
                const float *v = values + (int64_t)t * head_dim + 8 * c0;
                UNROLLED
                for (int r = 0; r < n; r++) {
                    const __m256 weight = _mm256_broadcast_ss(scores + (r0 + r) * width + t);
                    UNROLLED
                    for (int c = 0; c < cols; c++)
                        a[r][c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + 8 * c), a[r][c]);
                }
            }
            for (int r = 0; r < n && r0 + r < valid; r++) {
                const int position = first + (r0 + r) / group;
                const int head = kv * group + (r0 + r) % group;
                const int64_t at = ((int64_t)(q_start + position) * p->num_heads + head)
                                   * head_dim + 8 * c0;
                for (int c = 0; c < cols; c += 2)
                    store16_at(p->out, at + 8 * c, (vf){a[r][c], a[r][c + 1]}, bf16);
            }
        }
    }
#else
    const int chunks = head_dim / 16;
    const int slice = chunks < SUM_SLICE ? chunks : SUM_SLICE;
    const int per_pass = SUM_VECTORS / slice;
    PASSES_UNROLLED
    for (int c0 = 0; c0 < chunks; c0 += slice) {
        const int cols = chunks - c0 < slice ? chunks - c0 : slice;  /* this slice's */
        PASSES_UNROLLED
        for (int r0 = 0; r0 < rows; r0 += per_pass) {
            if (r0 >= valid) break;
            const int n = rows - r0 < per_pass ? rows - r0 : per_pass;
            vf a[SUM_VECTORS];
            UNROLLED
            for (int j = 0; j < n * cols; j++) a[j] = vf_zero();
            for (int t = from; t < keys; t++) {
                const float *v = values + (int64_t)t * head_dim + 16 * c0;
                UNROLLED
                for (int r = 0; r < n; r++) {
                    const vf weight = vf_set1(scores[(r0 + r) * width + t]);
                    UNROLLED
                    for (int c = 0; c < cols; c++)
                        a[r * cols + c] = vf_fmadd(weight, vf_load(v + 16 * c), a[r * cols + c]);
                }
            }
            for (int r = 0; r < n && r0 + r < valid; r++) {
                const int position = first + (r0 + r) / group;
                const int head = kv * group + (r0 + r) % group;
                for (int c = 0; c < cols; c++)
                    store16_at(p->out, ((int64_t)(q_start + position) * p->num_heads + head)
                               * head_dim + 16 * (c0 + c), a[r * cols + c], bf16);
            }
        }
    }
#endif
}

/* One item: query positions [first, first + valid / group) of listed sequence i, KV head
 * kv, computed as `rows` rows (valid <= rows; the rest zero queries, their results
 * dropped). Scores for every key the item sees go to `scores` ([rows][width] floats), then
 * each row's softmax, then the weighted sum of V. Always inlined where rows and head_dim
 * are literals, so that the per-row vectors live in registers. */
static inline __attribute__((always_inline)) void prefill_item(
        const Prefill *p, int i, int seq, int kv, int first, const int rows, int valid,
        const int head_dim, float *scores, const int bf16) {
    const int group = p->group;
    const int q_start = p->query_start[seq];
    const int q_len = p->query_start[seq + 1] - q_start;
    const int context = p->context_lens[seq];
    const int prefix = context - q_len;  /* cached tokens before the chunk */
    const int64_t width = key_width(context);
    const float *keys_t = p->keys_t + p->keys_at[i] + (int64_t)kv * head_dim * width;
    const float *values = p->values + p->keys_at[i] + (int64_t)kv * width * head_dim;
    const int keys = prefix + first + valid / group;  /* keys any row of the item sees */
    /* the tile of the first key its first row's window sees */
    const int lowest = p->window > 0 && prefix + first >= p->window
        ? (prefix + first - p->window + 1) / KEY_TILE * KEY_TILE : 0;
    float q[MAX_ROWS][MAX_HEAD_DIM] __attribute__((aligned(64)));
    for (int r = 0; r < rows; r++) {
        const int position = first + r / group, head = kv * group + r % group;
        const int64_t src = ((int64_t)(q_start + position) * p->num_heads + head) * head_dim;
        for (int d = 0; d < head_dim; d++)
            q[r][d] = r < valid ? load_at(p->query, src + d, bf16) * p->scale : 0.0f;
    }
    for (int start = lowest; start < keys; start += KEY_TILE)
        tile_scores(q, keys_t, width, start, prefix + first, group, p->window, rows, head_dim,
                    scores);
    const int64_t span = padded(keys);
    for (int r = 0; r < valid; r++) {  /* softmax over the row's keys */
        float *row = scores + r * width;
        vf peak = vf_set1(-3.0e38f);
        for (int t = lowest; t < span; t += 16) peak = vf_max(peak, vf_load(row + t));
        const vf top = vf_set1(vf_reduce_max(peak));
        vf sum = vf_zero();
        for (int t = lowest; t < span; t += 16) {
            const vf e = vf_exp(vf_sub(vf_load(row + t), top));
            vf_store(row + t, e);
            sum = vf_add(sum, e);
        }
        const vf inverse = vf_set1(1.0f / vf_reduce_add(sum));
        for (int t = lowest; t < span; t += 16)
            vf_store(row + t, vf_mul(vf_load(row + t), inverse));
    }
    weighted_sum(p, values, scores, width, lowest, keys, q_start, first, kv, rows, valid,
                 head_dim, bf16);
}

/* head_dim as a literal where it is a common size, and `rows` computed as a literal
 * number, so that each row's vectors are registers of their own: the whole positions that
 * fit where three query heads share a KV head (SmolLM2) and MAX_ROWS is not a multiple of
 * three, else MAX_ROWS (a group of 7 heads, or an item at the chunk's end, computes some
 * rows for nothing) */
static inline __attribute__((always_inline)) void prefill_rows(
        const Prefill *p, int i, int seq, int kv, int first, int rows, const int head_dim,
        float *scores, const int bf16) {
#if MAX_ROWS % 3
    if (rows == MAX_ROWS / 3 * 3) {
        prefill_item(p, i, seq, kv, first, MAX_ROWS / 3 * 3, rows, head_dim, scores, bf16);
        return;
    }
#endif
    prefill_item(p, i, seq, kv, first, MAX_ROWS, rows, head_dim, scores, bf16);
}

/* query, out: [tokens, num_heads, head_dim]; seqs: the sequences whose chunks are done
 * here (others are left alone). Returns 0; 1 for shapes it does not take (nothing is
 * written), 2 when out of memory. */
static inline __attribute__((always_inline)) int paged_prefill(
        const void *query, const void *k_cache, const void *v_cache, void *out,
        const int32_t *block_tables, const int32_t *context_lens, const int32_t *query_start,
        const int32_t *seqs, int num_seqs, int max_blocks, int num_heads, int num_kv_heads,
        int head_dim, int block_size, float scale, int window, int num_threads,
        const int bf16, const int kv8) {
    const int group = num_heads / num_kv_heads;
    if (head_dim % 16 != 0 || head_dim > MAX_HEAD_DIM || group > MAX_ROWS) return 1;
    const int positions = MAX_ROWS / group;  /* query positions per item */
    int64_t *first_item = malloc(sizeof(int64_t) * 2 * (size_t)(num_seqs + 1));
    if (first_item == NULL) return 2;
    int64_t *keys_at = first_item + num_seqs + 1;
    first_item[0] = keys_at[0] = 0;
    for (int i = 0; i < num_seqs; i++) {
        const int q_len = query_start[seqs[i] + 1] - query_start[seqs[i]];
        first_item[i + 1] = first_item[i]
                            + (int64_t)((q_len + positions - 1) / positions) * num_kv_heads;
        keys_at[i + 1] = keys_at[i]
                         + key_width(context_lens[seqs[i]]) * num_kv_heads * head_dim;
    }
    /* K transposed, then V, of every listed sequence */
    float *keys_t = aligned_alloc(64, sizeof(float) * (size_t)(2 * keys_at[num_seqs] + 16));
    if (keys_t == NULL) {
        free(first_item);
        return 2;
    }
    float *values = keys_t + keys_at[num_seqs];
    const Prefill p = {query, out, keys_t, values, keys_at, block_tables, context_lens,
                       query_start, max_blocks, num_heads, num_kv_heads, block_size, group,
                       window, scale};
    const int64_t items = first_item[num_seqs];
    int64_t widest = 0;
    for (int i = 0; i < num_seqs; i++)
        if (key_width(context_lens[seqs[i]]) > widest) widest = key_width(context_lens[seqs[i]]);
    int failed = 0;
    #pragma omp parallel num_threads(num_threads)
    {
        float *scores = aligned_alloc(64, sizeof(float) * MAX_ROWS * (size_t)widest);
        if (scores == NULL) failed = 1;
        #pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < num_seqs; i++) {
            const int seq = seqs[i], context = context_lens[seq];
            const int prefix = context - (query_start[seq + 1] - query_start[seq]);
            gather_kv(k_cache, v_cache, block_tables + (int64_t)seq * max_blocks, block_size,
                      window > 0 && prefix >= window ? prefix - window + 1 : 0, context,
                      num_kv_heads, head_dim, keys_t + keys_at[i], values + keys_at[i], bf16,
                      kv8);
        }
        /* the last tiles of a chunk see the most keys: hand them out first */
        #pragma omp for schedule(dynamic, 1)
        for (int64_t back = 0; back < items; back++) {
            const int64_t item = items - 1 - back;
            int i = 0;
            while (first_item[i + 1] <= item) i++;
            const int seq = seqs[i];
            const int64_t local = item - first_item[i];
            const int tile = (int)(local / num_kv_heads), kv = (int)(local % num_kv_heads);
            const int q_len = query_start[seq + 1] - query_start[seq];
            const int first = tile * positions;
            const int count = q_len - first < positions ? q_len - first : positions;
            if (scores == NULL) continue;
            if (head_dim == 64)
                prefill_rows(&p, i, seq, kv, first, count * group, 64, scores, bf16);
            else if (head_dim == 128)
                prefill_rows(&p, i, seq, kv, first, count * group, 128, scores, bf16);
            else if (head_dim == 256)
                prefill_rows(&p, i, seq, kv, first, count * group, 256, scores, bf16);
            else
                prefill_rows(&p, i, seq, kv, first, count * group, head_dim, scores, bf16);
        }
        free(scores);
    }
    free(keys_t);
    free(first_item);
    return failed ? 2 : 0;
}

#define PREFILL_CALL(BF16, KV8)                                                            \
    paged_prefill(query, k_cache, v_cache, out, block_tables, context_lens, query_start,  \
                  seqs, num_seqs, max_blocks, num_heads, num_kv_heads, head_dim,          \
                  block_size, scale, window, num_threads, BF16, KV8)

int paged_prefill_f32(PREFILL_ARGS) { return PREFILL_CALL(0, 0); }
int paged_prefill_bf16(PREFILL_ARGS) { return PREFILL_CALL(1, 0); }
/* the caches int8 rows with their scales (kv8.h) */
int paged_prefill_kv8_f32(PREFILL_ARGS) { return PREFILL_CALL(0, 1); }
int paged_prefill_kv8_bf16(PREFILL_ARGS) { return PREFILL_CALL(1, 1); }
