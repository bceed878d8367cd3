/* Helpers shared by the CPU kernels: bfloat16 as 16-bit patterns, and AVX-512 vectors. */
#ifndef PAGEDCHAT_CPU_VECTOR_H
#define PAGEDCHAT_CPU_VECTOR_H

#include <stdint.h>

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

#if defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_AVX512 1

/* Lanes [0, n) of 16, for the tail of a row. */
static inline __mmask16 tail_mask(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, a degree-7 polynomial for e^r
 * (Cephes' coefficients, about 1 ulp), then scalef for the 2^n (underflows to 0 cleanly).
 * glibc's scalar expf was a third of the kernel's time. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

/* 16 bfloat16 values (lanes past the mask 0) widened to float32. */
static inline __m512 load16_bf16(const bf16_t *p, __mmask16 m) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* 16 float32 lanes rounded to nearest even, as torch rounds to bfloat16: one instruction
 * with AVX512-BF16 (vcvtneps2bf16, the same bits for every finite float32 but the
 * subnormals below 2^-126, which it reads as zero), else integer arithmetic on the bits. */
static inline __m256i bf16_bits16(__m512 v) {
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16));
#endif
}

/* 16 float32 lanes rounded to bfloat16, widened back. */
static inline __m512 round16_bf16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits16(v)), 16));
}

static inline void store16_bf16(bf16_t *p, __mmask16 m, __m512 v) {
    _mm256_mask_storeu_epi16(p, m, bf16_bits16(v));
}

#endif
#endif
