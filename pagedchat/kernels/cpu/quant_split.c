/* One row of x times Q4_K or Q6_K weights (a decode step) in integer products, on AVX2 and
 * AVX-512, and Q4_0, Q5_0 and Q8_0 on AVX2 and Q8_0 on AVX-512 where VNNI is (their x split
 * per block of 32: see columns_split32): decoding each weight to float32 leaves those
 * products bound by instructions, far from the memory's speed. x is split, per group of
 * 256 values, into three rounded terms
 *     x ~ s (a + b / 128 + c / 128^2),  a = round(x / s),  b, c the rounded rests,
 * with s a power of two and |a| <= 127 (|b|, |c| <= 64), so that each value is off by at
 * most 2^-21 of the group's largest: float32's reach, where llama.cpp's 8-bit activations
 * keep 8 bits. A run's weights are scale * q + offset for small unsigned integers q, so a
 * block's sum is
 *     d s / 128^2 sum_j sc_j (128 (128 (q . a)_j + (q . b)_j) + (q . c)_j) + sum_j offset_j X_j,
 * its dot products exact in integers (byte products summed in pairs, times the run's integer
 * scale sc_j), X_j the run's float sum of x, and every scale a power of two, so that a unit
 * row of x still picks each weight bit for bit. tests/kernels/test_quant.py holds the
 * products to that bound. On AVX-512 the run's scale is applied in float32 instead, to the
 * three terms' integer sums combined, so that a term costs one VNNI instruction per 64
 * weights rather than two. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ggml_formats.h"
#include "vector.h"

#if defined(__AVX2__)
#include <immintrin.h>

/* Values per group that share one split scale, the ratio of a term's scale to the next's,
 * and the number of terms. */
#define SPLIT_GROUP 256
#define SPLIT_RATIO 128.0f
#define SPLIT_TERMS 3

typedef struct {
    const int8_t *term[SPLIT_TERMS];  /* k_dim each */
    const float *scale;    /* per group: the last term's scale, s / 128^2 */
    const float *offsets;  /* 16 per block of 256: what a block's offsets multiply (below) */
} SplitX;

/* A group's terms: 16 lanes (8 on AVX2) of x at a time, rounded as nearbyintf rounds. */
#if defined(__AVX512BW__)
#define SPLIT_LANES 16
static inline void split_lanes(const float *x, float s, float inverse,
                               int8_t *term[SPLIT_TERMS], int at) {
    __m512 rest = _mm512_loadu_ps(x);
    float unit = s, per_unit = inverse;
    for (int t = 0; t < SPLIT_TERMS; t++) {
        const __m512 whole = _mm512_min_ps(_mm512_set1_ps(127.0f), _mm512_max_ps(
            _mm512_set1_ps(-127.0f), _mm512_roundscale_ps(
                _mm512_mul_ps(rest, _mm512_set1_ps(per_unit)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        _mm_storeu_si128((__m128i *)(term[t] + at),
                         _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(whole)));
        rest = _mm512_fnmadd_ps(whole, _mm512_set1_ps(unit), rest);
        unit *= 1.0f / SPLIT_RATIO;
        per_unit *= SPLIT_RATIO;
    }
}
#else
#define SPLIT_LANES 8
static inline void split_lanes(const float *x, float s, float inverse,
                               int8_t *term[SPLIT_TERMS], int at) {
    __m256 rest = _mm256_loadu_ps(x);
    float unit = s, per_unit = inverse;
    for (int t = 0; t < SPLIT_TERMS; t++) {
        const __m256 whole = _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(
            _mm256_set1_ps(-127.0f), _mm256_round_ps(
                _mm256_mul_ps(rest, _mm256_set1_ps(per_unit)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        const __m256i ints = _mm256_cvtps_epi32(whole);
        const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(ints),
                                              _mm256_extracti128_si256(ints, 1));
        _mm_storel_epi64((__m128i *)(term[t] + at), _mm_packs_epi16(words, words));
        rest = _mm256_fnmadd_ps(whole, _mm256_set1_ps(unit), rest);
        unit *= 1.0f / SPLIT_RATIO;
        per_unit *= SPLIT_RATIO;
    }
}
#endif

/* A group's scale s: a power of two with max|x| <= 127 s (at most twice the least), so that
 * every scale is exact; 1 / s in *inverse (both 0 for a group of zeros). */
static inline float split_scale(float amax, float *inverse) {
    int e = 0;
    frexpf(amax * (1.0f / 127.0f), &e);
    *inverse = amax > 0.0f ? ldexpf(1.0f, -e) : 0.0f;
    return amax > 0.0f ? ldexpf(1.0f, e) : 0.0f;
}

/* x's split terms (see the top of the file) and, per block of 256, the 16 values its
 * offsets multiply: Q4_K: 0 (8 lanes), then -X_j for its 8 runs of 32; Q6_K: -32 X_j for
 * its 16 runs of 16 (X_j: the run's float sum of x). Where `interleaved`, the second and
 * third runs of 32 of every 128 values trade places (the order of Q4_K's nibbles in 64
 * bytes). */
static void split_x(const float *x, int k_dim, int type, int interleaved,
                    int8_t *term[SPLIT_TERMS], float *scale, float *offsets) {
    for (int g = 0; g < k_dim; g += SPLIT_GROUP) {
        vf most = vf_zero();
        for (int i = 0; i < SPLIT_GROUP; i += 16) {
            const vf v = vf_load(x + g + i);
            most = vf_max(most, vf_max(v, vf_sub(vf_zero(), v)));
        }
        float inverse;
        const float s = split_scale(vf_reduce_max(most), &inverse);
        for (int i = 0; i < SPLIT_GROUP; i += SPLIT_LANES) {
            const int of_128 = i / 32 % 4;
            const int swapped = interleaved && (of_128 == 1 || of_128 == 2);
            const int at = g + i - 32 * of_128 + 32 * (swapped ? 3 - of_128 : of_128);
            split_lanes(x + g + i, s, inverse, term, at);
        }
        float last = s;
        for (int t = 1; t < SPLIT_TERMS; t++) last *= 1.0f / SPLIT_RATIO;
        scale[g / SPLIT_GROUP] = last;
        vf runs[16];
        for (int i = 0; i < 16; i++) runs[i] = vf_load(x + g + 16 * i);
        float sum16[16], *out = offsets + g / 16;
        vf_store(sum16, vf_sums16(runs));
        for (int j = 0; j < 16; j++)
            out[j] = type == Q6_K ? -32.0f * sum16[j]
                     : j < 8 ? 0.0f : -(sum16[2 * (j - 8)] + sum16[2 * (j - 8) + 1]);
    }
}

/* The block's scale d (both formats keep it as float16). */
static inline float k_scale(int type, const uint8_t *b) {
    return half_to_float(type == Q4_K ? b : b + 208);
}

#if defined(__AVX512BW__)
/* A Q6_K half-block's 128 integers q, unsigned (values 128 h to 128 h + 127, their ql
 * and qh at ql and qh): out[0]: values 0-63 (low nibbles of ql, high pairs 0 and 1 of qh),
 * out[1]: 64-127 (high nibbles, pairs 2 and 3). Each pair is moved to bits 4-5 by a 16-bit
 * shift, whose bits carried across a byte the masks drop. */
static inline void q6_half_bytes(const uint8_t *ql, const uint8_t *qh, __m512i out[2]) {
    const __m512i low = _mm512_loadu_si512(ql);
    const __m512i high = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i nibble = _mm512_set1_epi8(0x0F), pair = _mm512_set1_epi8(0x30);
    const __m512i up = _mm512_sllv_epi16(high, _mm512_setr_epi64(
        0x0004000400040004, 0x0004000400040004, 0x0004000400040004, 0x0004000400040004,
        0x0002000200020002, 0x0002000200020002, 0x0002000200020002, 0x0002000200020002));
    const __m512i down = _mm512_srlv_epi16(high, _mm512_setr_epi64(
        0, 0, 0, 0, 0x0002000200020002, 0x0002000200020002, 0x0002000200020002,
        0x0002000200020002));
    /* (a & b) | c */
    out[0] = _mm512_ternarylogic_epi32(low, nibble, _mm512_and_si512(up, pair), 0xEA);
    out[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(low, 4), nibble,
                                       _mm512_and_si512(down, pair), 0xEA);
}

/* acc + the sums of four byte products (unsigned q times signed x) per 32-bit lane, and acc +
 * the byte products summed in pairs times the words sc: VNNI's one instruction each where
 * the CPU has it. */
static inline __m512i dot4(__m512i acc, __m512i q, __m512i x) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, q, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(q, x),
                                                   _mm512_set1_epi16(1)));
#endif
}

static inline __m512i dot_scaled(__m512i acc, __m512i q, __m512i x, __m512i sc) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, x), sc);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(q, x), sc));
#endif
}

/* A Q4_K block's 64 integers of part `part`: the low nibbles of 64 bytes of qs (runs 4 h and
 * 4 h + 2, h = part / 2) or their high nibbles (runs 4 h + 1 and 4 h + 3), in the order
 * split_x lays x out for them. */
static inline __m512i q4k_part(const uint8_t *b, int part) {
    const __m512i v = _mm512_loadu_si512(b + 16 + 64 * (part / 2));
    return _mm512_and_si512(part % 2 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0F));
}

/* For the 64 values of part `part` of a block: Q4_K, the index of each 16-bit lane's run
 * (a lane holds a pair of byte products) among the block's 8; Q6_K, of each 32-bit lane's
 * (four byte products) among its 16. */
static inline __m512i k_run_index(int type, int part) {
    if (type == Q4_K) {
        const short r = (short)(4 * (part / 2) + part % 2);
        return _mm512_inserti64x4(_mm512_set1_epi16(r), _mm256_set1_epi16((short)(r + 2)), 1);
    }
    const int r = 4 * part;
    return _mm512_setr_epi32(r, r, r, r, r + 1, r + 1, r + 1, r + 1, r + 2, r + 2, r + 2,
                             r + 2, r + 3, r + 3, r + 3, r + 3);
}

/* Q4_K: *offset, the factors of its offset values (see split_x: lanes 8-15 dmin mn_j), and
 * *words, its integer scales as 16-bit lanes. Q6_K: *offset, d sc_j, and *dot, d sc_j s
 * (s: the group's last-term scale). Every product exact (a float16 times a 6- or 8-bit
 * integer, times a power of two). */
static inline void k_block_scales(int type, const uint8_t *b, __m512 s, __m512 *offset,
                                  __m512 *dot, __m512i *words) {
    if (type == Q4_K) {
        uint64_t sc, mn;
        k_fields(b, &sc, &mn);
        *words = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((int64_t)sc)));
        *offset = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_set_epi64x((long long)mn, 0))),
            _mm512_set1_ps(half_to_float(b + 2)));
        return;
    }
    *offset = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192)))),
        _mm512_set1_ps(half_to_float(b + 208)));
    *dot = _mm512_mul_ps(*offset, s);
}

/* x . the column at col; the offsets' terms come from the sums of x, 16 lanes per block.
 * Q4_K: each term's byte products summed in pairs times the run's integer scale, the three
 * terms' sums combined per block. Q6_K, whose 6-bit integers take more instructions to
 * unpack: per part of 64 values, a lane's three terms' byte products, each four summed in
 * integers, combined exactly as 128 (128 (q . a) + (q . b)) + (q . c) (below 2^30), then
 * turned to float32 and multiplied by the lane's run's scale, so that a term costs one VNNI
 * instruction per 64 weights. */
static inline __attribute__((always_inline)) float
column_split(int type, const SplitX *x, int k_dim, const uint8_t *col, int64_t ahead) {
    const int bytes = block_bytes(type);
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0, at = 0; k < k_dim; k += 256, at += bytes) {
        const uint8_t *b = col + at;
        prefetch_lines_ahead(&col, 1, at, bytes, ahead);
        const __m512 s = _mm512_set1_ps(x->scale[k / 256]);
        __m512 offset, dot_scale;
        __m512i words, q6[2], dot[SPLIT_TERMS];
        k_block_scales(type, b, s, &offset, &dot_scale, &words);
        acc = _mm512_fmadd_ps(offset, _mm512_loadu_ps(x->offsets + k / 16), acc);
        for (int t = 0; t < SPLIT_TERMS; t++) dot[t] = _mm512_setzero_si512();
        for (int part = 0; part < 4; part++) {
            __m512i xt[SPLIT_TERMS];
            for (int t = 0; t < SPLIT_TERMS; t++)
                xt[t] = _mm512_loadu_si512(x->term[t] + k + 64 * part);
            const __m512i index = k_run_index(type, part);
            if (type == Q4_K) {
                const __m512i q = q4k_part(b, part);
                const __m512i sc = _mm512_permutexvar_epi16(index, words);
                for (int t = 0; t < SPLIT_TERMS; t++) dot[t] = dot_scaled(dot[t], q, xt[t], sc);
                continue;
            }
            if (part % 2 == 0)  /* the half's 128 integers */
                q6_half_bytes(b + 32 * part, b + 128 + 16 * part, q6);
            __m512i combined = dot4(_mm512_setzero_si512(), q6[part % 2], xt[0]);
            for (int t = 1; t < SPLIT_TERMS; t++)
                combined = dot4(_mm512_slli_epi32(combined, 7), q6[part % 2], xt[t]);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(combined),
                                  _mm512_permutexvar_ps(index, dot_scale), acc);
        }
        if (type == Q6_K) continue;
        __m512 dots = _mm512_cvtepi32_ps(dot[0]);
        for (int t = 1; t < SPLIT_TERMS; t++)
            dots = _mm512_fmadd_ps(dots, _mm512_set1_ps(SPLIT_RATIO), _mm512_cvtepi32_ps(dot[t]));
        acc = _mm512_fmadd_ps(dots, _mm512_set1_ps(k_scale(Q4_K, b) * x->scale[k / 256]), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
#else
/* sum_j offset_j X_j of a block (see split_x for `offsets`: Q4_K: -dmin mn_j times -X_j in
 * lanes 8-15; Q6_K: d sc_j times -32 X_j), mn its minimums as k_fields gives them, as 8
 * lanes to add up. */
static inline __m256 k_offsets(int type, const uint8_t *b, uint64_t mn, const float *offsets) {
    if (type == Q4_K) {
        const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)mn)));
        return _mm256_mul_ps(_mm256_mul_ps(m, _mm256_set1_ps(half_to_float(b + 2))),
                             _mm256_loadu_ps(offsets + 8));
    }
    const __m256 d = _mm256_set1_ps(half_to_float(b + 208));
    const __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
    const __m256 lo = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d),
                                    _mm256_loadu_ps(offsets));
    return _mm256_fmadd_ps(
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc))), d),
        _mm256_loadu_ps(offsets + 8), lo);
}

/* acc += (q . x) in pairs times the run's scale sc: AVX-VNNI's one instruction for the
 * multiply-add of the pairs where the CPU has it. */
static inline __m256i dot_scaled(__m256i acc, __m256i q, __m256i x, __m256i sc) {
#if defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, _mm256_maddubs_epi16(q, x), sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), sc));
#endif
}

/* 32 unsigned integers of the block at b, values 32 piece to 32 piece + 31. */
static inline __m256i k_piece(int type, const uint8_t *b, int piece) {
    if (type == Q4_K) {  /* run `piece`: the low nibbles of its pair's bytes, or the high */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (piece / 2)));
        return _mm256_and_si256(piece % 2 ? _mm256_srli_epi16(v, 4) : v,
                                _mm256_set1_epi8(0x0F));
    }
    /* Q6_K: values 128 h + 32 i: low or high nibbles of ql, two bits of qh */
    const int h = piece / 4, i = piece % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (i % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    const __m256i low = _mm256_and_si256(i < 2 ? ql : _mm256_srli_epi16(ql, 4),
                                         _mm256_set1_epi8(0x0F));
    /* qh's bits 2 i and 2 i + 1 moved to bits 4 and 5 (what crosses between bytes is masked) */
    const __m256i high = _mm256_and_si256(i == 3 ? _mm256_srli_epi16(qh, 2)
                                          : _mm256_slli_epi16(qh, 4 - 2 * i),
                                          _mm256_set1_epi8(0x30));
    return _mm256_or_si256(low, high);
}

/* x . the column at col: per run of 32 values, each term's byte products summed in pairs
 * times the run's scale, the three terms' sums combined per block. */
static inline __attribute__((always_inline)) float
column_split(int type, const SplitX *x, int k_dim, const uint8_t *col, int64_t ahead) {
    const int bytes = block_bytes(type);
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0, at = 0; k < k_dim; k += 256, at += bytes) {
        const uint8_t *b = col + at;
        prefetch_lines_ahead(&col, 1, at, bytes, ahead);
        /* the block's integer scales as 16-bit words: Q4_K's 8 run scales in both halves, or
         * Q6_K's 16, its even runs' in the low 128 bits and its odd runs' in the high */
        uint64_t sc = 0, mn = 0;
        __m256i words;
        if (type == Q4_K) {
            k_fields(b, &sc, &mn);
            words = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((int64_t)sc)));
        } else {
            words = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                _mm_loadu_si128((const __m128i *)(b + 192)),
                _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
        }
        __m256i dot[SPLIT_TERMS];
        for (int t = 0; t < SPLIT_TERMS; t++) dot[t] = _mm256_setzero_si256();
        acc = _mm256_add_ps(acc, k_offsets(type, b, mn, x->offsets + k / 16));
        for (int piece = 0; piece < 8; piece++) {
            const __m256i q = k_piece(type, b, piece);
            /* word `piece` of each half: Q4_K's run scale, or Q6_K's two runs' (2 piece in the
             * low 128 bits, 2 piece + 1 in the high) */
            const __m256i sc =
                _mm256_shuffle_epi8(words, _mm256_set1_epi16((short)(0x0100 + 0x0202 * piece)));
            for (int t = 0; t < SPLIT_TERMS; t++)
                dot[t] = dot_scaled(dot[t], q, _mm256_loadu_si256(
                    (const __m256i *)(x->term[t] + k + 32 * piece)), sc);
            /* each term's sum kept as one running register: left free, the compiler sums
             * the 24 products as a tree whose partial sums spill to the stack */
            __asm__("" : "+x"(dot[0]), "+x"(dot[1]), "+x"(dot[2]));
        }
        __m256 dots = _mm256_cvtepi32_ps(dot[0]);
        for (int t = 1; t < SPLIT_TERMS; t++)
            dots = _mm256_fmadd_ps(dots, _mm256_set1_ps(SPLIT_RATIO), _mm256_cvtepi32_ps(dot[t]));
        acc = _mm256_fmadd_ps(dots, _mm256_set1_ps(k_scale(type, b) * x->scale[k / 256]), acc);
    }
    return sum8(acc);
}

#endif

/* 128 (128 (q . a) + (q . b)) + (q . c) per 32-bit lane (four byte products each), exact in
 * integers (below 2^31 for bytes q up to 255, as |a| <= 127 and |b|, |c| <= 64): VNNI's
 * four-product sums shifted between the terms, or each term's byte products summed in pairs
 * times its factor. */
static inline __m256i terms_dot(__m256i q, __m256i ta, __m256i tb, __m256i tc) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    __m256i sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, ta);
    sum = _mm256_dpbusd_epi32(_mm256_slli_epi32(sum, 7), q, tb);
    return _mm256_dpbusd_epi32(_mm256_slli_epi32(sum, 7), q, tc);
#elif defined(__AVXVNNI__)
    __m256i sum = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q, ta);
    sum = _mm256_dpbusd_avx_epi32(_mm256_slli_epi32(sum, 7), q, tb);
    return _mm256_dpbusd_avx_epi32(_mm256_slli_epi32(sum, 7), q, tc);
#else
    return _mm256_add_epi32(
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(q, ta), _mm256_set1_epi16(128 * 128)),
            _mm256_madd_epi16(_mm256_maddubs_epi16(q, tb), _mm256_set1_epi16(128))),
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, tc), _mm256_set1_epi16(1)));
#endif
}

/* Q8_0's offset in units of d: with VNNI its signed bytes are taken 128 up (VNNI multiplies
 * unsigned bytes by signed ones); without, that would overflow maddubs' pairs (2 * 255 *
 * 127), so its bytes w are multiplied as |w| (at most 128) by each term with w's sign, the
 * pairs below 2^15, and its weights have no offset. */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define Q8_0_TAKEN_UP 1
#define ONE_SCALE_OFFSET(type) ((type) == Q4_0 ? -8.0f : (type) == Q5_0 ? -16.0f : -128.0f)
#else
#define Q8_0_TAKEN_UP 0
#define ONE_SCALE_OFFSET(type) ((type) == Q4_0 ? -8.0f : (type) == Q5_0 ? -16.0f : 0.0f)
#endif

/* terms_dot of the block at b in Q4_0, Q5_0 or Q8_0 and the terms at ta, tb, tc: its
 * weights are d q + m, m = ONE_SCALE_OFFSET d, q its 32 unsigned integers (Q8_0: see
 * above). */
static inline __m256i block_terms_dot(int type, const uint8_t *b, const int8_t *ta,
                                      const int8_t *tb, const int8_t *tc) {
    __m256i a = _mm256_loadu_si256((const __m256i *)ta),
            bb = _mm256_loadu_si256((const __m256i *)tb),
            c = _mm256_loadu_si256((const __m256i *)tc);
    if (type != Q8_0) return terms_dot(block32_bytes(type, b), a, bb, c);
    const __m256i w = _mm256_loadu_si256((const __m256i *)(b + 2));
    if (Q8_0_TAKEN_UP)
        return terms_dot(_mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)), a, bb, c);
    a = _mm256_sign_epi8(a, w), bb = _mm256_sign_epi8(bb, w), c = _mm256_sign_epi8(c, w);
    return terms_dot(_mm256_sign_epi8(w, w), a, bb, c);
}

/* sums[c] = x . column c for the `cols` (at most 4) columns at col[c], in Q4_0, Q5_0 or Q8_0
 * with x split per block of 32 (x->offsets: each block's float sum of x): a block's sum is
 * d s (128 (128 (q . a) + (q . b)) + (q . c)) + m X, every product of scales exact, so that
 * a unit row of x picks each weight d q + m bit for bit. The columns'
 * scales d are widened together (column c's in lane 2 c), their products d s left in memory
 * for each column's broadcast to be a load, and the offsets' terms d X summed in one
 * register. */
static inline __attribute__((always_inline)) void
columns_split32(int type, int cols, const SplitX *x, int k_dim, const uint8_t *const col[],
                int64_t ahead, float sums[TILE_COLS_MAX]) {
    const int bytes = block_bytes(type);
    /* lanes 2 c + 1 hold two bytes of weights: masked out */
    const __m256 scales_only = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, -1, 0, -1, 0, -1, 0));
    __m256 acc[4], offsets = _mm256_setzero_ps();
    for (int c = 0; c < cols; c++) acc[c] = _mm256_setzero_ps();
    for (int k = 0, at = 0; k < k_dim; k += 32, at += bytes) {
        prefetch_tile_ahead(col, cols, at, ahead);
        const __m256 d = _mm256_and_ps(tile_heads4(col, cols, at, 0), scales_only);
        offsets = _mm256_fmadd_ps(d, _mm256_broadcast_ss(x->offsets + k / 32), offsets);
        float ds[8] __attribute__((aligned(32)));
        _mm256_store_ps(ds, _mm256_mul_ps(d, _mm256_broadcast_ss(x->scale + k / 32)));
        for (int c = 0; c < cols; c++) {
            const __m256i dots = block_terms_dot(type, col[c] + at, x->term[0] + k,
                                                 x->term[1] + k, x->term[2] + k);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_broadcast_ss(ds + 2 * c),
                                     acc[c]);
        }
    }
    float offset[8];
    _mm256_storeu_ps(offset, offsets);
    for (int c = 0; c < cols; c++)
        sums[c] = sum8(acc[c]) + ONE_SCALE_OFFSET(type) * offset[2 * c];
}

/* x's terms per block of 32, each block's last-term scale s / 128^2 in scale[b] and its
 * float sum of x in sums[b]. */
static void split_x32(const float *x, int k_dim, int8_t *term[SPLIT_TERMS], float *scale,
                      float *sums) {
    for (int g = 0; g < k_dim; g += 32) {
        const vf v0 = vf_load(x + g), v1 = vf_load(x + g + 16);
        float inverse;
        const float s = split_scale(vf_reduce_max(vf_max(vf_max(v0, vf_sub(vf_zero(), v0)),
                                                         vf_max(v1, vf_sub(vf_zero(), v1)))),
                                    &inverse);
        for (int i = 0; i < 32; i += SPLIT_LANES) split_lanes(x + g + i, s, inverse, term, g + i);
        scale[g / 32] = s * (1.0f / (SPLIT_RATIO * SPLIT_RATIO));
        sums[g / 32] = vf_reduce_add(vf_add(v0, v1));
    }
}

/* Columns [first, end) in tiles of SPLIT_COLS: Q4_0's and Q5_0's four, which x's terms,
 * loaded once per block, serve together; the K formats' and Q8_0's longer ones one at a
 * time, each one's weights read as one stream, which the hardware's prefetcher follows (see
 * COLS8_FOR in quant_int8.c). */
#define SPLIT_COLS(type) ((type) == Q4_0 || (type) == Q5_0 ? 4 : 1)
static inline __attribute__((always_inline)) void
split_columns_of(int type, const SplitX *x, const uint8_t *w, int64_t row_bytes,
                 const float *bias, void *out, int out_bf16, int k_dim, int first, int end) {
    const int cols = SPLIT_COLS(type);
    const int64_t ahead = prefetch_distance(cols * row_bytes);
    for (int n = first; n < end; n += cols) {
        const int count = end - n < cols ? end - n : cols;
        const uint8_t *col[TILE_COLS_MAX];
        tile_columns(w, row_bytes, n, count, cols, col);
        float sums[QUANT_ROWS_MAX][TILE_COLS_MAX];
        if (type >= Q4_K) sums[0][0] = column_split(type, x, k_dim, col[0], ahead);
        else columns_split32(type, cols, x, k_dim, col, ahead, sums[0]);
        store_tile(1, count, sums, bias, n, out, out_bf16, 0);
    }
}

void split_row_columns(int type, int rows, const float *x, const uint8_t *w,
                       int64_t row_bytes, const float *bias, void *out, int out_bf16,
                       int64_t out_stride, int k_dim, int first, int end) {
    if (first >= end) return;
    int8_t bytes[rows][SPLIT_TERMS][k_dim];
    float scale[rows][k_dim / 32], offsets[rows][k_dim / 16];
    SplitX split[rows];
#if defined(__AVX512BW__)
    const int interleaved = type == Q4_K;
#else
    const int interleaved = 0;
#endif
    for (int r = 0; r < rows; r++) {
        int8_t *term[SPLIT_TERMS];
        for (int t = 0; t < SPLIT_TERMS; t++) split[r].term[t] = term[t] = bytes[r][t];
        split[r].scale = scale[r];
        split[r].offsets = offsets[r];
        if (type < Q4_K) split_x32(x + (int64_t)r * k_dim, k_dim, term, scale[r], offsets[r]);
        else split_x(x + (int64_t)r * k_dim, k_dim, type, interleaved, term, scale[r],
                     offsets[r]);
    }
    /* more rows than one go over the columns in runs of about 256 KiB of weights, so that
     * the rows after the first read them from the cache rather than from memory */
    const int run = rows > 1 ? (int)((256 << 10) / row_bytes) + 1 : end - first;
    for (int n = first; n < end; n += run) {
        const int stop = n + run < end ? n + run : end;
        for (int r = 0; r < rows; r++) {
            void *row_out = (char *)out + r * out_stride * (out_bf16 ? 2 : 4);
            /* each format's loops with its type a constant, for the formats built */
#define SPLIT_CASE(TYPE)                                                                   \
            case TYPE:                                                                     \
                if (TYPE == Q4_0 || TYPE == Q5_0 || TYPE == Q8_0 || TYPE == Q4_K           \
                    || TYPE == Q6_K)                                                       \
                    split_columns_of(TYPE, &split[r], w, row_bytes, bias, row_out,         \
                                     out_bf16, k_dim, n, stop);                            \
                break;
            switch (type) { QUANT_FORMATS(SPLIT_CASE) }
#undef SPLIT_CASE
        }
    }
}
#endif
