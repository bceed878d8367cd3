/* 8-bit KV rows (kernels/kv_int8.py): each token's head is head_dim int8 values, then the
 * float16 scale that de-quantizes them (value = q * scale). The kernels that store keys
 * and values quantize here; the attention kernels read the values and scales in their
 * loops and multiply in registers. */
#ifndef PAGEDCHAT_CPU_KV8_H
#define PAGEDCHAT_CPU_KV8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KV8_SCALE_BYTES 2

/* Bytes of one head of one token in an int8 cache. */
static inline int64_t kv8_head_bytes(int head_dim) { return head_dim + KV8_SCALE_BYTES; }

/* The scale of an int8 head (head: its first value). */
static inline float kv8_scale(const int8_t *head, int head_dim) {
    _Float16 scale;
    memcpy(&scale, head + head_dim, sizeof scale);
    return (float)scale;
}

/* x[0:head_dim] as an int8 head at dst: kv_int8.quantize's float32 steps in its order
 * (the largest magnitude times 1/127, rounded to float16, its reciprocal, each value times
 * that rounded half to even and clamped), so the bytes are the reference's. */
static inline void kv8_quantize(const float *x, int8_t *dst, int head_dim) {
    float peak = 0.0f;
    for (int d = 0; d < head_dim; d++) {
        const float a = fabsf(x[d]);
        peak = a > peak ? a : peak;
    }
    const _Float16 scale = (_Float16)(peak * (1.0f / 127.0f));
    const float wide = (float)scale;
    const float inverse = wide > 0.0f ? 1.0f / wide : 0.0f;
    for (int d = 0; d < head_dim; d++) {
        const float q = nearbyintf(x[d] * inverse);
        dst[d] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
    }
    memcpy(dst + head_dim, &scale, sizeof scale);
}

#endif
