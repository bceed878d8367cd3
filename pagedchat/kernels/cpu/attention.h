/* The row-by-row paged attention (attention.c), written once for every cache type: its
 * walk over a work item's tiles, through the block table, with the tile functions of
 * the cache type (float32, bfloat16: attention.c; int8 rows with scales: attention_kv8.c).
 * Offsets into the caches are in bytes, a KV head HEAD_BYTES(head_dim) of them. */
#ifndef PAGEDCHAT_CPU_ATTENTION_H
#define PAGEDCHAT_CPU_ATTENTION_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "vector.h"

#define TILE 16

/* Element i of a query row as float32, and an output element rounded, per type. */
#define F32_LOAD(p, i) ((p)[i])
#define F32_STORE(x) (x)
#define BF16_LOAD(p, i) bf16_load((p), (i))
#define BF16_STORE(x) bf16_round(x)

/* Where tokens [start, start + 16) of a sequence (fewer at its end) keep their rows,
 * found through the block table; cache points at this item's first KV head of slot 0.
 * Returns the count. */
static inline int tile_rows(const char *cache, int64_t token_bytes, const int32_t *table,
                            int block_size, int start, int n, const char *rows[TILE]) {
    const int count = n - start < TILE ? n - start : TILE;
    int block = start / block_size, offset = start % block_size;
    for (int t = 0; t < count; t++) {
        rows[t] = cache + ((int64_t)table[block] * block_size + offset) * token_bytes;
        if (++offset == block_size) { offset = 0; block++; }
    }
    return count;
}

/* How many tiles ahead an item asks for its own rows: the blocks of a sequence are
 * scattered, so the hardware prefetcher cannot see them coming; how far ahead matters
 * little, that it is done at all matters. */
#define PREFETCH_TILES 2

/* Tile j of an item's walk over tokens [lo, lo + n) (its K tiles 0..tiles-1, then its V
 * tiles): find its rows, keep them in the item's ring of tiles (used PREFETCH_TILES tiles
 * later) and prefetch them. Returns the count. */
static inline int prefetch_tile(int j, int tiles, const char *k_first, const char *v_first,
                                int64_t token_bytes, const int32_t *table, int block_size,
                                int lo, int n, int row_bytes, const char *rows[TILE]) {
    if (j >= 2 * tiles) return 0;
    const int count = tile_rows(j < tiles ? k_first : v_first, token_bytes, table, block_size,
                                lo + (j % tiles) * TILE, lo + n, rows);
    for (int t = 0; t < count; t++)
        for (int b = 0; b < row_bytes; b += 64) __builtin_prefetch(rows[t] + b, 0, 1);
    return count;
}

/* A KV head's query heads (its group, in chunks of up to SHARED_HEADS) take each tile
 * together: every K and V vector is loaded, and widened from bfloat16, once for all of
 * them, and their accumulators are independent chains. One head at a time, the loads and
 * the FMA chain of a lone accumulator set the pace, not memory. Each head's arithmetic is
 * the same, in the same order, as on its own. */
/* EXPR evaluated with S, a literal from 1 to SHARED_HEADS, equal to `shared`: the tile
 * functions inline with their loops over heads unrolled and their accumulators in
 * registers (four heads' where there are 32 vector registers, two where there are 16). */
#if VF_REGISTERS >= 32
#define SHARED_HEADS 4
#define SHARED_CALL(EXPR)                                                                   \
    switch (shared) {                                                                       \
        case 1: { enum { S = 1 }; EXPR; break; }                                            \
        case 2: { enum { S = 2 }; EXPR; break; }                                            \
        case 3: { enum { S = 3 }; EXPR; break; }                                            \
        default: { enum { S = 4 }; EXPR; break; }                                           \
    }
#else
#define SHARED_HEADS 2
#define SHARED_CALL(EXPR)                                                                   \
    switch (shared) {                                                                       \
        case 1: { enum { S = 1 }; EXPR; break; }                                            \
        default: { enum { S = 2 }; EXPR; break; }                                           \
    }
#endif

/* acc_g[0:head_dim] += sum over up to 16 tokens of p_g[t] * v[t] for `shared` heads: V
 * rows rows[t] + head (in bytes) of element type T, each times SCALE(its head, head_dim),
 * head g's weights at p + g * n and sums at acc + g * head_dim. Up to four 16-lane
 * accumulators a head stay in registers across the tokens. */
#define DEFINE_VALUE_TILE(NAME, T, LOAD16, SCALE)                                           \
static inline __attribute__((always_inline)) void NAME(                                     \
        const float *p, const char *const rows[TILE], int64_t head, int count,              \
        int head_dim, float *acc, int64_t n, const int shared) {                            \
    for (int d = 0; d < head_dim; d += 64) {                                                \
        const int chunks = head_dim - d >= 64 ? 4 : (head_dim - d) / 16;                    \
        vf a[SHARED_HEADS][4];                                                              \
        for (int g = 0; g < shared; g++)                                                    \
            for (int c = 0; c < 4; c++)                                                     \
                a[g][c] = c < chunks ? vf_load(acc + g * head_dim + d + 16 * c) : vf_zero(); \
        for (int t = 0; t < count; t++) {                                                   \
            const T *first = (const T *)(rows[t] + head);                                   \
            const float row_scale = SCALE(first, head_dim);                                 \
            const T *row = first + d;                                                       \
            vf value[4];                                                                    \
            for (int c = 0; c < 4; c++)                                                     \
                value[c] = c < chunks ? LOAD16(row + 16 * c) : vf_zero();                   \
            for (int g = 0; g < shared; g++) {                                              \
                const vf weight = vf_set1(p[g * n + t] * row_scale);                        \
                for (int c = 0; c < 4; c++)                                                 \
                    if (c < chunks) a[g][c] = vf_fmadd(weight, value[c], a[g][c]);          \
            }                                                                               \
        }                                                                                   \
        for (int g = 0; g < shared; g++)                                                    \
            for (int c = 0; c < chunks; c++)                                                \
                vf_store(acc + g * head_dim + d + 16 * c, a[g][c]);                         \
    }                                                                                       \
}
/* s[0:n] <- softmax(s[0:n]), in place. */
static inline void softmax_row(float *s, int n) {
    vf peak = vf_set1(-INFINITY);
    for (int t = 0; t < n; t += 16) {
        const vmask m = tail_mask(n - t);
        peak = vf_blend(m, peak, vf_max(peak, vf_load_mask(s + t, m)));
    }
    const vf top = vf_set1(vf_reduce_max(peak));
    vf sum = vf_zero();
    for (int t = 0; t < n; t += 16) {
        const vmask m = tail_mask(n - t);
        const vf e = vf_exp(vf_sub(vf_load_mask(s + t, m), top));
        vf_store_mask(s + t, m, e);
        sum = vf_add(sum, vf_keep(m, e));
    }
    const vf inv = vf_set1(1.0f / vf_reduce_add(sum));
    for (int t = 0; t < n; t += 16) {
        const vmask m = tail_mask(n - t);
        vf_store_mask(s + t, m, vf_mul(vf_load_mask(s + t, m), inv));
    }
}

/* Shapes and step metadata shared by every work item of one call. */
typedef struct {
    const int32_t *block_tables, *context_lens, *query_start, *rows, *row_seqs;
    const int *run_starts;
    int max_blocks, num_heads, num_kv_heads, block_size;
    int split, qsplit;  /* items per run; slices of a KV head's query heads (see the part) */
    int window;  /* a query at position p reads keys p - window + 1 .. p; 0: from key 0 */
    int64_t num_items;
    float scale;
} Batch;

/* The most query rows of one sequence a work item takes together (a short chunk's, or a
 * speculative step's drafted rows): each K and V row is read once for all of them. */
#define RUN_MAX 8

/* Cuts the rows into runs of consecutive query rows of one sequence, RUN_MAX at most:
 * run r is rows[starts[r]] to rows[starts[r + 1] - 1]. Returns the count. */
static inline int row_runs(const int32_t *rows, const int32_t *row_seqs, int num_rows,
                           int *starts) {
    int runs = 0;
    for (int i = 0; i < num_rows; i++)
        if (i == 0 || row_seqs[i] != row_seqs[i - 1] || rows[i] != rows[i - 1] + 1
            || i - starts[runs - 1] == RUN_MAX)
            starts[runs++] = i;
    starts[runs] = num_rows;
    return runs;
}

/* What work item `item` reads: its sequence's block table, returned, its run of query rows
 * (*m of them from rows[*first]), the tokens its walk reads (*n from token *lo: the run's
 * first row's window to its last row; row i of the run attends to tokens up to
 * *lo + *n - (*m - 1 - i), exclusive), its first KV head (*kv_first) and the query heads it
 * takes of each KV head's group (*g_count from the group's *g_first). */
static inline const int32_t *item_walk(const Batch *b, int64_t item, int *first, int *m,
                                       int *lo, int *n, int *kv_first, int *g_first,
                                       int *g_count) {
    const int run = (int)(item / b->split);
    *first = b->run_starts[run];
    *m = b->run_starts[run + 1] - *first;
    const int row = b->rows[*first + *m - 1], seq = b->row_seqs[*first];
    const int q_len = b->query_start[seq + 1] - b->query_start[seq];
    const int end = b->context_lens[seq] - q_len + (row - b->query_start[seq]) + 1;
    *lo = b->window > 0 && end - (*m - 1) > b->window ? end - (*m - 1) - b->window : 0;
    *n = end - *lo;
    const int part = (int)(item % b->split), group = b->num_heads / b->num_kv_heads;
    *kv_first = part / b->qsplit * (b->num_kv_heads * b->qsplit / b->split);
    *g_first = part % b->qsplit * group / b->qsplit;
    *g_count = (part % b->qsplit + 1) * group / b->qsplit - *g_first;
    return b->block_tables + (int64_t)seq * b->max_blocks;
}

/* Prefetch the K and V rows of tokens [from, to) of a walk (bytes_per_row from each row,
 * k_first and v_first at its first KV head of slot 0) into L2. */
static inline void prefetch_tokens(const char *k_first, const char *v_first,
                                   int64_t token_bytes, const int32_t *table, int block_size,
                                   int from, int to, int row_bytes) {
    for (int t = from; t < to; t++) {
        const int64_t at = ((int64_t)table[t / block_size] * block_size + t % block_size)
                           * token_bytes;
        for (int b = 0; b < row_bytes; b += 64) {
            __builtin_prefetch(k_first + at + b, 0, 1);
            __builtin_prefetch(v_first + at + b, 0, 1);
        }
    }
}

/* NAME: the kernel (a parallel region); PART: thread t's share of it, for a caller's team.
 * NAME##_item, one work item, is always inlined where head_dim is a literal (64, 128), so
 * its loops over head_dim unroll into straight-line vector code; other sizes take the
 * general path. T: the query's and output's element type; C: the caches', whose KV heads
 * are HEAD_BYTES(head_dim) bytes apart, element d of one read as KV_LOAD(head, d) times
 * KV_SCALE(head, head_dim) (the scalar path's; the tile functions do the same). */
#define DEFINE_PAGED_ATTENTION(NAME, PART, T, C, HEAD_BYTES, LOAD, STORE, KV_LOAD,        \
                               KV_SCALE, SCORE_TILE, VALUE_TILE)                            \
static inline __attribute__((always_inline)) int NAME##_item(                               \
        const Batch *b, const T *query, const C *k_cache, const C *v_cache, T *out,         \
        int64_t item, int stride, const int head_dim) {                                     \
    const int split = b->split, num_kv_heads = b->num_kv_heads;                             \
    const int num_heads = b->num_heads, block_size = b->block_size;                         \
    const float scale = b->scale;                                                           \
    const int group = num_heads / num_kv_heads;                                             \
    const int heads_per_item = num_kv_heads * b->qsplit / split;                            \
    const int64_t head_bytes = HEAD_BYTES(head_dim);                                        \
    const int vector_path = head_dim % 16 == 0;                                            \
    int first, m, lo, n, kv_first, g0, sub, unused;                                         \
    const int32_t *table = item_walk(b, item, &first, &m, &lo, &n, &kv_first, &g0, &sub);   \
    /* the thread's next item (items go round-robin): its rows are prefetched, a slice per  \
     * tile of this walk, so that memory keeps streaming while this item computes */        \
    int next_first, next_m, next_lo = 0, next_n = 0, next_kv = 0;                           \
    const int32_t *next_table = item + stride < b->num_items                                \
        ? item_walk(b, item + stride, &next_first, &next_m, &next_lo, &next_n, &next_kv,    \
                    &unused, &unused)                                                       \
        : NULL;                                                                             \
    const int head0 = kv_first * group + g0;                                                \
    /* one "head" per query head taken and row of the run: (KV head j, row i, query head   \
     * g0 + g of j's group) at (j * m + i) * sub + g, so that a KV head's are consecutive  \
     * and take its tiles together, as a group's query heads do */                          \
    const int members = m * sub;                                                            \
    const int heads = heads_per_item * members;                                             \
    const int64_t width = (int64_t)heads * head_dim;                                        \
    float *q = malloc(sizeof(float) * (size_t)(2 * width + (int64_t)heads * n)              \
                      + sizeof(T) * (size_t)width);                                         \
    if (q == NULL) return 1;                                                                \
    float *acc = q + width;                                                                 \
    float *scores = acc + width;                                                            \
    T *raw = (T *)(scores + (int64_t)heads * n); /* the query as given, for the bf16 dot */ \
    const int row0 = b->rows[first];                                                        \
    for (int h = 0; h < heads; h++) {                                                       \
        const int j = h / members, i = h % members / sub, g = h % sub;                      \
        const T *q_row = query + ((int64_t)(row0 + i) * num_heads + head0 + j * group + g)  \
                                 * head_dim;                                                \
        for (int d = 0; d < head_dim; d++) {                                                \
            raw[(int64_t)h * head_dim + d] = q_row[d];                                      \
            q[(int64_t)h * head_dim + d] = LOAD(q_row, d) * scale;                          \
            acc[(int64_t)h * head_dim + d] = 0.0f;                                          \
        }                                                                                   \
    }                                                                                       \
    const int64_t token_bytes = num_kv_heads * head_bytes;                                  \
    const int row_bytes = heads_per_item * (int)head_bytes;                                 \
    /* ring[j % RING]: tile j's rows, found when it was prefetched */                       \
    enum { RING = PREFETCH_TILES + 1 };                                                     \
    const char *ring[RING][TILE];                                                           \
    int counts[RING];                                                                       \
    const char *k_first = (const char *)k_cache + kv_first * head_bytes;              \
    const char *v_first = (const char *)v_cache + kv_first * head_bytes;              \
    const int tiles = (n + TILE - 1) / TILE;                                                \
    for (int j = 0; j < PREFETCH_TILES; j++)                                                \
        counts[j % RING] = prefetch_tile(j, tiles, k_first, v_first, token_bytes, table,     \
                                         block_size, lo, n, row_bytes, ring[j % RING]);     \
    /* one walk: tiles 0..tiles-1 score K, the softmax, tiles..2 tiles-1 sum V */           \
    const char *next_k = (const char *)k_cache + next_kv * head_bytes;                 \
    const char *next_v = (const char *)v_cache + next_kv * head_bytes;                 \
    for (int j = 0; j < 2 * tiles; j++) {                                                   \
        if (next_table != NULL)                                                             \
            prefetch_tokens(next_k, next_v, token_bytes, next_table, block_size,            \
                            next_lo + (int)((int64_t)j * next_n / (2 * tiles)),             \
                            next_lo + (int)((int64_t)(j + 1) * next_n / (2 * tiles)),       \
                            row_bytes);                                                     \
        const int ahead = (j + PREFETCH_TILES) % RING;                                      \
        counts[ahead] = prefetch_tile(j + PREFETCH_TILES, tiles, k_first, v_first,          \
                                      token_bytes, table, block_size, lo, n, row_bytes,     \
                                      ring[ahead]);                                         \
        const char *const *rows = ring[j % RING];                                           \
        const int count = counts[j % RING];                                                 \
        const int start = (j % tiles) * TILE;                                               \
        if (j == tiles)                                                                     \
            for (int h = 0; h < heads; h++) {                                               \
                /* a run's earlier rows see fewer tokens, its later rows' windows begin     \
                 * later: weight 0 outside [from, seen) */                                  \
                const int seen = n - (m - 1 - h % members / sub);                           \
                const int from = b->window > 0 && seen > b->window ? seen - b->window : 0;  \
                float *sh = scores + (int64_t)h * n;                                        \
                softmax_row(sh + from, seen - from);                                        \
                for (int t = 0; t < from; t++) sh[t] = 0.0f;                                \
                for (int t = seen; t < n; t++) sh[t] = 0.0f;                                \
            }                                                                               \
        if (vector_path) {                                                                  \
            /* each KV head's group, SHARED_HEADS query heads at a time */                  \
            int shared = SHARED_HEADS;                                                      \
            for (int h = 0; h < heads; h += shared) {                                       \
                const int64_t head = (h / members) * head_bytes;                            \
                const int left = members - h % members;                                     \
                shared = left < SHARED_HEADS ? left : SHARED_HEADS;                         \
                float *sh = scores + (int64_t)h * n + start;                                \
                if (j < tiles) {                                                            \
                    const float *qh = q + (int64_t)h * head_dim;                            \
                    const T *rh = raw + (int64_t)h * head_dim;                              \
                    SHARED_CALL(SCORE_TILE(qh, rh, scale, rows, head, count, head_dim, sh,  \
                                           n, S));                                          \
                } else {                                                                    \
                    float *ah = acc + (int64_t)h * head_dim;                                \
                    SHARED_CALL(VALUE_TILE(sh, rows, head, count, head_dim, ah, n, S));     \
                }                                                                           \
            }                                                                               \
            continue;                                                                       \
        }                                                                                   \
        for (int h = 0; h < heads; h++) {                                                   \
            const int64_t head = (h / members) * head_bytes;                                \
            float *sh = scores + (int64_t)h * n + start;                                    \
            if (j < tiles) {                                                                \
                const float *qh = q + (int64_t)h * head_dim;                                \
                for (int t = 0; t < count; t++) {                                           \
                    const C *kh = (const C *)(rows[t] + head);                              \
                    float dot = 0.0f;                                                       \
                    _Pragma("omp simd reduction(+:dot)")                                    \
                    for (int d = 0; d < head_dim; d++) dot += qh[d] * KV_LOAD(kh, d);       \
                    sh[t] = dot * KV_SCALE(kh, head_dim);                                   \
                }                                                                           \
                continue;                                                                   \
            }                                                                               \
            float *ah = acc + (int64_t)h * head_dim;                                        \
            for (int t = 0; t < count; t++) {                                               \
                const C *vh = (const C *)(rows[t] + head);                                  \
                const float weight = sh[t] * KV_SCALE(vh, head_dim);                        \
                _Pragma("omp simd")                                                         \
                for (int d = 0; d < head_dim; d++) ah[d] += weight * KV_LOAD(vh, d);        \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    for (int h = 0; h < heads; h++) {                                                       \
        const int j = h / members, i = h % members / sub, g = h % sub;                      \
        T *out_row = out + ((int64_t)(row0 + i) * num_heads + head0 + j * group + g)        \
                           * head_dim;                                                      \
        for (int d = 0; d < head_dim; d++)                                                  \
            out_row[d] = STORE(acc[(int64_t)h * head_dim + d]);                             \
    }                                                                                       \
    free(q);                                                                                \
    return 0;                                                                               \
}                                                                                           \
                                                                                            \
/* Thread t of a team of `count`: its items (round-robin), 0 or 1 when out of memory. */   \
int PART(const T *query, const C *k_cache, const C *v_cache, T *out,                        \
                const int32_t *block_tables, const int32_t *context_lens,                   \
                const int32_t *query_start, const int32_t *rows, const int32_t *row_seqs,   \
                int num_rows, int max_blocks, int num_heads, int num_kv_heads, int head_dim, \
                int block_size, float scale, int window, int t, int count) {                \
    /* each sequence's consecutive rows as one item */                                      \
    int run_starts[num_rows + 1];                                                           \
    const int runs = row_runs(rows, row_seqs, num_rows, run_starts);                        \
    /* a lone long decode is split by KV head so that every thread has work, and where the \
     * runs' KV heads are fewer than the threads (Gemma 3 270M has one), each KV head's     \
     * query heads into slices too: an item then reads its KV head for its slice */         \
    const int group = num_heads / num_kv_heads, few = runs < 2 * count;                     \
    const int pairs = runs * num_kv_heads;                                                  \
    const int wanted = few && pairs < count ? (count + pairs - 1) / pairs : 1;              \
    const int qsplit = wanted < group ? wanted : group;                                     \
    const int split = few ? num_kv_heads * qsplit : 1;                                      \
    const Batch b = {block_tables, context_lens, query_start, rows, row_seqs, run_starts,   \
                     max_blocks, num_heads, num_kv_heads, block_size, split, qsplit,        \
                     window, (int64_t)runs * split, scale};                                 \
    int failed = 0;                                                                         \
    for (int64_t item = t; item < b.num_items; item += count) {                             \
        int bad;                                                                            \
        if (head_dim == 64)                                                                 \
            bad = NAME##_item(&b, query, k_cache, v_cache, out, item, count, 64);           \
        else if (head_dim == 128)                                                           \
            bad = NAME##_item(&b, query, k_cache, v_cache, out, item, count, 128);          \
        else                                                                                \
            bad = NAME##_item(&b, query, k_cache, v_cache, out, item, count, head_dim);     \
        if (bad) failed = 1;                                                                \
    }                                                                                       \
    return failed;                                                                          \
}                                                                                           \
                                                                                            \
int NAME(const T *query, const C *k_cache, const C *v_cache, T *out,                        \
         const int32_t *block_tables, const int32_t *context_lens,                          \
         const int32_t *query_start, const int32_t *rows, const int32_t *row_seqs,          \
         int num_rows, int max_blocks, int num_heads, int num_kv_heads, int head_dim,       \
         int block_size, float scale, int window, int num_threads) {                        \
    int failed = 0;                                                                         \
    _Pragma("omp parallel num_threads(num_threads) reduction(| : failed)")                  \
    failed |= PART(query, k_cache, v_cache, out, block_tables, context_lens,                \
                          query_start, rows, row_seqs, num_rows, max_blocks, num_heads,     \
                          num_kv_heads, head_dim, block_size, scale, window,                \
                          omp_get_thread_num(), omp_get_num_threads());                     \
    return failed ? 2 : 0;                                                                  \
}


#endif
