// f16.cuh — f16 values handled as their bit patterns: the GEMV's f16 scales and weights, the
// decoder's f16 KV cache. No half-type header is needed, and these two conversions are the only
// arithmetic on them. Include after HF_CUDA / HF_HIP are defined (platform.cuh, or gemv.cu itself).
#pragma once

typedef unsigned short hf_u16;

// f16 bits -> f32 (exact).
__device__ __forceinline__ float hf_h2f(hf_u16 h) {
#ifdef HF_CUDA
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return (float)__builtin_bit_cast(_Float16, h);
#endif
}

// f32 -> f16 bits, round to nearest with ties to even (`.rn`; the C conversion on HIP rounds the
// same way); out-of-range values become +-inf, as half::f16::from_f32 makes them.
__device__ __forceinline__ hf_u16 hf_f2h(float f) {
#ifdef HF_CUDA
    hf_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return __builtin_bit_cast(hf_u16, (_Float16)f);
#endif
}
