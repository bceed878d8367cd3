/* 8-bit activations, llama.cpp's way: what the products on them share (quant_int8.c for a
 * few rows, quant_int8_tile.c for many). Each run of 32 values of a row of x is rounded to
 * integers q_x in [-127, 127] times one scale, d = max|x| / 127. Each run of 32 weights is
 * scale * q_w + offset for its integers q_w (per 16 weights in Q6_K), so its product with
 * the rounded x is
 *     scale * d * (q_w . q_x) + offset * d * sum(q_x),
 * and q_w . q_x is summed exactly in integers. The result is the product of the weights,
 * taken as reals, with x so rounded: not the exact product, so its agreement with
 * transformers is measured (`bench quality`), never assumed. The torch reference
 * (kernels/quant.py) computes the same thing. */
#ifndef PAGEDCHAT_CPU_QUANT_INT8_H
#define PAGEDCHAT_CPU_QUANT_INT8_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_formats.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* VNNI's 256-bit sums of four byte products (unsigned by signed) into 32-bit lanes, in the
 * AVX-512 or the AVX-VNNI encoding, where the CPU has either. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD256(sum, u, s) _mm256_dpbusd_epi32(sum, u, s)
#elif defined(__AVXVNNI__)
#define DPBUSD256(sum, u, s) _mm256_dpbusd_avx_epi32(sum, u, s)
#endif

/* x rounded: q [rows, k_dim]; per run of 32, scale[rows, k_dim / 32] and the run's
 * d * sum(q) in run_sums; per 16, d * sum(q) in half_sums [rows, k_dim / 16]. */
typedef struct {
    int8_t *q;
    float *scale, *run_sums, *half_sums;
} X8;

/* 1 / d, or 0 for d = 0, where d is the value stored: -ffast-math would otherwise fold
 * 1 / (max|x| * (1 / 127)) into 127 / max|x|, which rounds differently and, at a tie, gives
 * another q than the torch reference's. */
static inline float reciprocal(float d) {
    volatile float stored = d;
    return d > 0.0f ? 1.0f / stored : 0.0f;
}

/* Run v of 32 values rounded as every path (and the torch reference) rounds it:
 * d = max|v| * (1 / 127), then q = v * (1 / d) rounded to the nearest integer, ties to
 * even (the vector conversion's rounding). Returns d; sums[h] = the sum of q over half h. */
static inline float round_run(const float *v, int8_t q[32], int sums[2]) {
#if defined(__AVX2__)
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 part[4];
    for (int i = 0; i < 4; i++) part[i] = _mm256_loadu_ps(v + 8 * i);
    __m256 most = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(part[0], magnitude),
                                              _mm256_and_ps(part[1], magnitude)),
                                _mm256_max_ps(_mm256_and_ps(part[2], magnitude),
                                              _mm256_and_ps(part[3], magnitude)));
    __m128 four = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
    four = _mm_max_ps(four, _mm_movehl_ps(four, four));
    const float amax = _mm_cvtss_f32(_mm_max_ss(four, _mm_movehdup_ps(four)));
    const float d = amax * (1.0f / 127.0f), inverse = reciprocal(d);
    __m256i whole[4];
    for (int i = 0; i < 4; i++)
        whole[i] = _mm256_cvtps_epi32(_mm256_mul_ps(part[i], _mm256_set1_ps(inverse)));
    /* the packs interleave 128-bit lanes: words (4 values) come out as 0 2 4 6 1 3 5 7 */
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(whole[0], whole[1]),
                                             _mm256_packs_epi32(whole[2], whole[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(
        bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    for (int h = 0; h < 2; h++) {
        const __m256i pair = _mm256_add_epi32(whole[2 * h], whole[2 * h + 1]);
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(pair), _mm256_extracti128_si256(pair, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        sums[h] = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
    }
    return d;
#else
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float d = amax * (1.0f / 127.0f), inverse = reciprocal(d);
    sums[0] = sums[1] = 0;
    for (int i = 0; i < 32; i++) {
        const int r = (int)nearbyintf(v[i] * inverse);
        q[i] = (int8_t)r;
        sums[i / 16] += r;
    }
    return d;
#endif
}

static inline void round_row(const float *x, int k_dim, int8_t *q, float *scale,
                             float *run_sums, float *half_sums) {
    for (int j = 0; j < k_dim / 32; j++) {
        int sums[2];
        const float d = round_run(x + 32 * j, q + 32 * j, sums);
        scale[j] = d;
        half_sums[2 * j] = d * (float)sums[0];
        half_sums[2 * j + 1] = d * (float)sums[1];
        run_sums[j] = d * (float)(sums[0] + sums[1]);
    }
}

/* x's rows rounded into one allocation (free x8->scale); 0 when out of memory. */
static inline int round_rows(const float *x, int rows, int k_dim, X8 *x8) {
    const int64_t runs = (int64_t)rows * (k_dim / 32);
    void *memory = malloc((size_t)rows * k_dim + sizeof(float) * 4 * (size_t)runs);
    if (memory == NULL) return 0;
    x8->scale = memory;
    x8->run_sums = x8->scale + runs;
    x8->half_sums = x8->run_sums + runs;
    x8->q = (int8_t *)(x8->half_sums + 2 * runs);
    for (int r = 0; r < rows; r++)
        round_row(x + (int64_t)r * k_dim, k_dim, x8->q + (int64_t)r * k_dim,
                  x8->scale + (int64_t)r * (k_dim / 32), x8->run_sums + (int64_t)r * (k_dim / 32),
                  x8->half_sums + (int64_t)r * (k_dim / 16));
    return 1;
}

/* The integers of run s of block b, as bytes: unsigned, except Q8_0's (signed). The layouts
 * are those of run_of in quant_rows.c. */
#if defined(__AVX2__)
static inline __m256i low_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }

static inline __attribute__((always_inline)) __m256i run_bytes(int type, const uint8_t *b,
                                                               int s) {
    switch (type) {
        case Q4_0: case Q4_1: case Q5_0: case Q5_1:
            return block32_bytes(type, b);
        case Q8_0:
            return _mm256_loadu_si256((const __m256i *)(b + 2));
        case Q4_K: case Q5_K: {
            const int five = type == Q5_K;
            const __m256i packed = _mm256_loadu_si256(
                (const __m256i *)(b + (five ? 48 : 16) + 32 * (s / 2)));
            const __m256i q = low_nibbles(s % 2 ? _mm256_srli_epi16(packed, 4) : packed);
            if (!five) return q;
            const __m256i high = _mm256_and_si256(
                _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(b + 16)),
                                 _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
            return _mm256_or_si256(q, _mm256_slli_epi16(high, 4));
        }
        default: {  /* Q6_K */
            const __m256i low = _mm256_loadu_si256(
                (const __m256i *)(b + 64 * (s / 4) + 32 * (s % 2)));
            const __m256i high = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * (s / 4)));
            const __m256i nibble = low_nibbles(
                _mm256_srl_epi16(low, _mm_cvtsi32_si128(4 * (s % 4 / 2))));
            const __m256i two = _mm256_and_si256(
                _mm256_srl_epi16(high, _mm_cvtsi32_si128(2 * (s % 4))), _mm256_set1_epi8(3));
            return _mm256_or_si256(nibble, _mm256_slli_epi16(two, 4));
        }
    }
}

#else
static inline void run_integers(int type, const uint8_t *b, int s, int8_t q[32]) {
    switch (type) {
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: {
            const int head = type == Q4_0 ? 2 : type == Q4_1 ? 4 : type == Q5_0 ? 6 : 8;
            uint32_t high = 0;
            if (type >= Q5_0) memcpy(&high, b + head - 4, 4);
            for (int i = 0; i < 16; i++) {
                q[i] = (int8_t)((b[head + i] & 15) | (high >> i & 1) << 4);
                q[i + 16] = (int8_t)((b[head + i] >> 4) | (high >> (i + 16) & 1) << 4);
            }
            break;
        }
        case Q8_0:
            memcpy(q, b + 2, 32);
            break;
        case Q4_K: case Q5_K: {
            const int five = type == Q5_K;
            const uint8_t *qs = b + (five ? 48 : 16) + 32 * (s / 2);
            for (int i = 0; i < 32; i++)
                q[i] = (int8_t)((qs[i] >> 4 * (s % 2) & 15) | (five ? (b[16 + i] >> s & 1) << 4 : 0));
            break;
        }
        default: {
            const uint8_t *low = b + 64 * (s / 4) + 32 * (s % 2), *high = b + 128 + 32 * (s / 4);
            for (int i = 0; i < 32; i++)
                q[i] = (int8_t)((low[i] >> 4 * (s % 4 / 2) & 15) | (high[i] >> 2 * (s % 4) & 3) << 4);
        }
    }
}
#endif

#endif
