/* Vector helpers shared by the CPU kernels (cpu_attention.c, cpu_sampling.c). */
#ifndef PAGEDCHAT_CPU_VECTOR_H
#define PAGEDCHAT_CPU_VECTOR_H

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

#endif
#endif
