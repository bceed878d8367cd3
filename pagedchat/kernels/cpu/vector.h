/* Helpers shared by the CPU kernels: bfloat16 as 16-bit patterns, and `vf`, a vector of
 * 16 float32 lanes with the few operations the kernels use.
 *
 * The kernels are written once against vf and built once per instruction-set level
 * (build.py picks the best one the CPU runs): AVX-512 (one register per vf), AVX2 with FMA
 * (two 8-lane registers) and portable C (16 floats in a loop the compiler vectorises as
 * it can: SSE2 on x86-64, NEON on ARM). bfloat16 is widened and rounded with integer
 * arithmetic on every level; AVX512-BF16 instructions are used only where the kernels
 * say so, under __AVX512BF16__.
 */
#ifndef PAGEDCHAT_CPU_VECTOR_H
#define PAGEDCHAT_CPU_VECTOR_H

#include <stdint.h>
#include <string.h>

typedef uint16_t bf16_t;

static inline float bf16_load(const bf16_t *p, int64_t i) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)p[i]) << 16;
    return v.f;
}

/* Round to nearest even, as torch's float -> bfloat16 conversion (NaN aside). */
static inline bf16_t bf16_round(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    return (bf16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

/* A set of the 16 lanes, bit i for lane i. */
typedef uint16_t vmask;

/* Lanes [0, n) of 16, for the tail of a row (none for n <= 0, all for n >= 16). */
static inline vmask tail_mask(int n) {
    return n >= 16 ? (vmask)0xFFFF : n <= 0 ? (vmask)0 : (vmask)((1u << n) - 1u);
}

#if defined(__AVX2__)
#include <immintrin.h>

/* The sum of v's 8 lanes: the halves added, then pairs, then the last two. */
static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* parts[0] + ... + parts[count - 1]: a sum kept in partial sums, so that several chains of
 * multiply-adds are in flight. */
static inline __m256 part_sum(const __m256 *parts, int count) {
    __m256 sum = parts[0];
    for (int p = 1; p < count; p++) sum = _mm256_add_ps(sum, parts[p]);
    return sum;
}
#endif

#define VF_LANES 16

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) \
    && defined(__AVX512DQ__)
#include <immintrin.h>
#define VF_ISA "avx512"
#define VF_AVX512 1
/* vf registers the kernels may keep live at once (sizes their register tiles). */
#define VF_REGISTERS 32

typedef __m512 vf;

static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vf_load_mask(const float *p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline void vf_store_mask(float *p, vmask m, vf v) { _mm512_mask_storeu_ps(p, m, v); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
/* a b + c and c - a b, one rounding */
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline float vf_reduce_add(vf v) { return _mm512_reduce_add_ps(v); }
static inline float vf_reduce_max(vf v) { return _mm512_reduce_max_ps(v); }
/* lanes of b where m is set, of a elsewhere */
static inline vf vf_blend(vmask m, vf a, vf b) { return _mm512_mask_mov_ps(a, m, b); }
static inline vmask vf_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
static inline vf vf_round(vf v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* y 2^n for integral n in [-150, 128] */
static inline vf vf_scale2(vf y, vf n) { return _mm512_scalef_ps(y, n); }

static inline vf vf_load_bf16(const bf16_t *p, vmask m) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* 16 int8 values as float32 (exactly). */
static inline vf vf_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 float32 lanes rounded to nearest even, as torch rounds to bfloat16: one instruction
 * with AVX512-BF16 (vcvtneps2bf16, the same bits for every finite float32 but the
 * subnormals below 2^-126, which it reads as zero), else integer arithmetic on the bits. */
static inline __m256i vf_bf16_bits(vf v) {
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16));
#endif
}

static inline void vf_store_bf16(bf16_t *p, vmask m, vf v) {
    _mm256_mask_storeu_epi16(p, m, vf_bf16_bits(v));
}

static inline vf vf_round_bf16(vf v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(vf_bf16_bits(v)), 16));
}

/* 16 pairs of bfloat16 (32 values from p) widened: the first of each pair to *even, the
 * second to *odd. */
static inline void vf_load_bf16_pairs(const bf16_t *p, vf *even, vf *odd) {
    const __m512i w = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(-65536)));
}

/* 16 vectors -> one vector of their 16 horizontal sums. */
static inline vf vf_sums16(const vf p[16]) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * i], p[2 * i + 1]),
                             _mm512_unpackhi_ps(p[2 * i], p[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VF_ISA "avx2"
#define VF_AVX2 1
#define VF_REGISTERS 8

typedef struct { __m256 lo, hi; } vf;

/* The 8 lanes of a __m256 selected by the low 8 bits of m, as all-ones lanes. */
static inline __m256i avx2_lanes(unsigned m) {
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bits), bits);
}

#define VF_BOTH(EXPR_LO, EXPR_HI) return (vf){EXPR_LO, EXPR_HI}
static inline vf vf_zero(void) { VF_BOTH(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline vf vf_set1(float x) { VF_BOTH(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
static inline vf vf_load(const float *p) { VF_BOTH(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
/* A partial load copies its lanes one by one rather than use vmaskmovps: emulators of x86
 * (qemu's user mode among them) read the whole vector and fault where the masked-off lanes
 * cross into an unmapped page, which real CPUs never do. */
static inline vf vf_load_mask(const float *p, vmask m) {
    if (m == 0xFFFF) return vf_load(p);
    float part[16] = {0};
    for (int i = 0; i < 16; i++)
        if (m >> i & 1) part[i] = p[i];
    return vf_load(part);
}
static inline void vf_store(float *p, vf v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
static inline void vf_store_mask(float *p, vmask m, vf v) {
    if (m == 0xFFFF) {
        vf_store(p, v);
        return;
    }
    _mm256_maskstore_ps(p, avx2_lanes(m), v.lo);
    _mm256_maskstore_ps(p + 8, avx2_lanes(m >> 8), v.hi);
}
#define VF_BINARY(NAME, OP) \
    static inline vf NAME(vf a, vf b) { VF_BOTH(OP(a.lo, b.lo), OP(a.hi, b.hi)); }
VF_BINARY(vf_add, _mm256_add_ps)
VF_BINARY(vf_sub, _mm256_sub_ps)
VF_BINARY(vf_mul, _mm256_mul_ps)
VF_BINARY(vf_div, _mm256_div_ps)
VF_BINARY(vf_max, _mm256_max_ps)
VF_BINARY(vf_min, _mm256_min_ps)
static inline vf vf_fmadd(vf a, vf b, vf c) {
    VF_BOTH(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
static inline vf vf_fnmadd(vf a, vf b, vf c) {
    VF_BOTH(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi));
}
static inline float vf_reduce_add(vf v) { return sum8(_mm256_add_ps(v.lo, v.hi)); }
static inline float vf_reduce_max(vf v) {
    const __m256 s8 = _mm256_max_ps(v.lo, v.hi);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}
static inline vf vf_blend(vmask m, vf a, vf b) {
    VF_BOTH(_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(avx2_lanes(m))),
            _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(avx2_lanes(m >> 8))));
}
static inline vmask vf_gt(vf a, vf b) {
    return (vmask)(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ))
                   | _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)) << 8);
}
#define AVX2_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline vf vf_round(vf v) {
    VF_BOTH(_mm256_round_ps(v.lo, AVX2_NEAREST), _mm256_round_ps(v.hi, AVX2_NEAREST));
}
/* y 2^n in two exact steps of 2^(n/2) each, so that both factors stay normal floats for n
 * in [-150, 128]: the one rounding is the last multiply's, as scalef's. */
static inline __m256 avx2_scale2(__m256 y, __m256 n) {
    const __m256i whole = _mm256_cvtps_epi32(n);
    const __m256i first = _mm256_srai_epi32(whole, 1);
    const __m256i second = _mm256_sub_epi32(whole, first);
    const __m256i bias = _mm256_set1_epi32(127);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(first, bias), 23)));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(second, bias), 23)));
}
static inline vf vf_scale2(vf y, vf n) { VF_BOTH(avx2_scale2(y.lo, n.lo), avx2_scale2(y.hi, n.hi)); }

static inline __m256 avx2_widen_bf16(__m128i bits) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
static inline vf vf_load_bf16(const bf16_t *p, vmask m) {
    bf16_t part[16] = {0};
    if (m != 0xFFFF) {
        for (int i = 0; i < 16; i++)
            if (m >> i & 1) part[i] = p[i];
        p = part;
    }
    VF_BOTH(avx2_widen_bf16(_mm_loadu_si128((const __m128i *)p)),
            avx2_widen_bf16(_mm_loadu_si128((const __m128i *)(p + 8))));
}
static inline __m256 avx2_widen_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf vf_load_i8(const int8_t *p) { VF_BOTH(avx2_widen_i8(p), avx2_widen_i8(p + 8)); }
static inline __m256i avx2_round_bits(__m256 v) {  /* bfloat16 bits in the low halves */
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(
        _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
}
static inline void vf_store_bf16(bf16_t *p, vmask m, vf v) {
    /* packus interleaves 128-bit lanes: the permute puts the 16 results back in order */
    const __m256i packed = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(avx2_round_bits(v.lo), avx2_round_bits(v.hi)), 0xD8);
    if (m == 0xFFFF) {
        _mm256_storeu_si256((__m256i *)p, packed);
        return;
    }
    bf16_t part[16];
    _mm256_storeu_si256((__m256i *)part, packed);
    for (int i = 0; i < 16; i++)
        if (m >> i & 1) p[i] = part[i];
}
static inline vf vf_round_bf16(vf v) {
    VF_BOTH(_mm256_castsi256_ps(_mm256_slli_epi32(avx2_round_bits(v.lo), 16)),
            _mm256_castsi256_ps(_mm256_slli_epi32(avx2_round_bits(v.hi), 16)));
}
static inline void vf_load_bf16_pairs(const bf16_t *p, vf *even, vf *odd) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)p);
    const __m256i hi = _mm256_loadu_si256((const __m256i *)(p + 16));
    const __m256i top = _mm256_set1_epi32(-65536);
    *even = (vf){_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
                 _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
    *odd = (vf){_mm256_castsi256_ps(_mm256_and_si256(lo, top)),
                _mm256_castsi256_ps(_mm256_and_si256(hi, top))};
}
/* 8 vectors -> their 8 horizontal sums */
static inline __m256 avx2_sums8(const __m256 s[8]) {
    const __m256 b0 = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
    const __m256 b1 = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20),
                         _mm256_permute2f128_ps(b0, b1, 0x31));
}
static inline vf vf_sums16(const vf p[16]) {
    __m256 s[16];
    for (int i = 0; i < 16; i++) s[i] = _mm256_add_ps(p[i].lo, p[i].hi);
    VF_BOTH(avx2_sums8(s), avx2_sums8(s + 8));
}
#undef VF_BINARY

#else
#define VF_ISA "portable"
#define VF_PORTABLE 1
#define VF_REGISTERS 8

typedef struct { float f[16]; } vf;

#define VF_MAP(EXPR) \
    vf r;            \
    for (int i = 0; i < 16; i++) r.f[i] = (EXPR); \
    return r
static inline vf vf_zero(void) { VF_MAP(0.0f); }
static inline vf vf_set1(float x) { VF_MAP(x); }
static inline vf vf_load(const float *p) { VF_MAP(p[i]); }
static inline vf vf_load_mask(const float *p, vmask m) { VF_MAP(m >> i & 1 ? p[i] : 0.0f); }
static inline void vf_store(float *p, vf v) { memcpy(p, v.f, sizeof v.f); }
static inline void vf_store_mask(float *p, vmask m, vf v) {
    for (int i = 0; i < 16; i++)
        if (m >> i & 1) p[i] = v.f[i];
}
static inline vf vf_add(vf a, vf b) { VF_MAP(a.f[i] + b.f[i]); }
static inline vf vf_sub(vf a, vf b) { VF_MAP(a.f[i] - b.f[i]); }
static inline vf vf_mul(vf a, vf b) { VF_MAP(a.f[i] * b.f[i]); }
static inline vf vf_div(vf a, vf b) { VF_MAP(a.f[i] / b.f[i]); }
static inline vf vf_max(vf a, vf b) { VF_MAP(a.f[i] > b.f[i] ? a.f[i] : b.f[i]); }
static inline vf vf_min(vf a, vf b) { VF_MAP(a.f[i] < b.f[i] ? a.f[i] : b.f[i]); }
static inline vf vf_fmadd(vf a, vf b, vf c) { VF_MAP(a.f[i] * b.f[i] + c.f[i]); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { VF_MAP(c.f[i] - a.f[i] * b.f[i]); }
static inline float vf_reduce_add(vf v) {
    float s = 0.0f;
    for (int i = 0; i < 16; i++) s += v.f[i];
    return s;
}
static inline float vf_reduce_max(vf v) {
    float s = v.f[0];
    for (int i = 1; i < 16; i++) s = v.f[i] > s ? v.f[i] : s;
    return s;
}
static inline vf vf_blend(vmask m, vf a, vf b) { VF_MAP(m >> i & 1 ? b.f[i] : a.f[i]); }
static inline vmask vf_gt(vf a, vf b) {
    unsigned m = 0;
    for (int i = 0; i < 16; i++) m |= (unsigned)(a.f[i] > b.f[i]) << i;
    return (vmask)m;
}
/* to a nearest integer (ties away from zero: the range reduction takes any) */
static inline vf vf_round(vf v) { VF_MAP((float)(int)(v.f[i] + (v.f[i] < 0 ? -0.5f : 0.5f))); }
/* y 2^n, in two steps that keep both factors normal floats for n in [-150, 128] */
static inline float scale2(float y, int n) {
    union { uint32_t u; float f; } a, b;
    a.u = (uint32_t)((n >> 1) + 127) << 23;
    b.u = (uint32_t)(n - (n >> 1) + 127) << 23;
    return y * a.f * b.f;
}
static inline vf vf_scale2(vf y, vf n) { VF_MAP(scale2(y.f[i], (int)n.f[i])); }
static inline vf vf_load_bf16(const bf16_t *p, vmask m) {
    VF_MAP(m >> i & 1 ? bf16_load(p, i) : 0.0f);
}
static inline vf vf_load_i8(const int8_t *p) { VF_MAP((float)p[i]); }
static inline void vf_store_bf16(bf16_t *p, vmask m, vf v) {
    for (int i = 0; i < 16; i++)
        if (m >> i & 1) p[i] = bf16_round(v.f[i]);
}
static inline vf vf_round_bf16(vf v) {
    VF_MAP(bf16_load((const bf16_t[]){bf16_round(v.f[i])}, 0));
}
static inline void vf_load_bf16_pairs(const bf16_t *p, vf *even, vf *odd) {
    for (int i = 0; i < 16; i++) {
        even->f[i] = bf16_load(p, 2 * i);
        odd->f[i] = bf16_load(p, 2 * i + 1);
    }
}
static inline vf vf_sums16(const vf p[16]) { VF_MAP(vf_reduce_add(p[i])); }
#undef VF_MAP
#endif

/* lanes of v where m is set, 0 elsewhere */
static inline vf vf_keep(vmask m, vf v) { return vf_blend(m, vf_zero(), v); }

/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, a degree-7 polynomial for e^r
 * (Cephes' coefficients, about 1 ulp), then 2^n exactly (underflows to 0 cleanly).
 * glibc's scalar expf was a third of the attention kernel's time. */
static inline vf vf_exp(vf x) {
    x = vf_max(x, vf_set1(-104.0f));
    const vf n = vf_round(vf_mul(x, vf_set1(1.44269504088896341f)));
    vf r = vf_fnmadd(n, vf_set1(0.693359375f), x);
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    vf y = vf_set1(1.9875691500e-4f);
    y = vf_fmadd(y, r, vf_set1(1.3981999507e-3f));
    y = vf_fmadd(y, r, vf_set1(8.3334519073e-3f));
    y = vf_fmadd(y, r, vf_set1(4.1665795894e-2f));
    y = vf_fmadd(y, r, vf_set1(1.6666665459e-1f));
    y = vf_fmadd(y, r, vf_set1(5.0000001201e-1f));
    y = vf_fmadd(y, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    return vf_scale2(y, n);
}

#endif
