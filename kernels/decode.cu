// Decode-step kernels for the llama family (batch 1): RMSNorm, RoPE, grouped-query attention over an
// f16 KV cache, the f32 -> f16 cache store, SwiGLU, bias add. CUDA/HIP common subset: no cooperative
// groups, no warp-size assumptions beyond 32 (HIP wave64 builds set HF_WARP to 64), no inline PTX
// outside the HF_CUDA guards.
//
// The cache is f16 like the CPU decoder's (llama.cpp's default cache type): this step's k and v are
// computed in f32 (projection, bias, k-norm, RoPE) and rounded once, to nearest with ties to even,
// when stored, which is half::f16::from_f32's rule, so on finite values both engines cache the same bits.
//
// Everything here is bandwidth-trivial next to the projections (a 4096-wide vector per call), so the
// kernels favour simplicity: one block per vector or per head, shared-memory reductions.

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC_RTC__)
#define HF_HIP 1
#else
#define HF_CUDA 1
#endif

#ifndef HF_WARP
#define HF_WARP 32
#endif

// NVRTC has no <math.h>: -inf as a bit pattern.
#define HF_NEG_INF __int_as_float(0xff800000)

// NVRTC compiles without the host headers (math.h / math_constants.h) that define INFINITY;
// measured on the H200 box: "identifier INFINITY is undefined" at the two uses below.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// An f16 cache element is handled as its bit pattern, as gemv.cu handles f16 scales (f16.cuh).
#include "f16.cuh"

// Block-wide sum; `scratch` holds one float per warp. Every thread gets the total.
__device__ __forceinline__ float hf_block_sum(float v, float* scratch) {
    for (int o = HF_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x % HF_WARP, warp = threadIdx.x / HF_WARP;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + HF_WARP - 1) / HF_WARP;
    float t = (threadIdx.x < n_warps) ? scratch[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = HF_WARP / 2; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (threadIdx.x == 0) scratch[0] = t;
    __syncthreads();
    return scratch[0];
}

__device__ __forceinline__ float hf_block_max(float v, float* scratch) {
    for (int o = HF_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x % HF_WARP, warp = threadIdx.x / HF_WARP;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + HF_WARP - 1) / HF_WARP;
    float t = (threadIdx.x < n_warps) ? scratch[threadIdx.x] : HF_NEG_INF;
    if (warp == 0)
        for (int o = HF_WARP / 2; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
    if (threadIdx.x == 0) scratch[0] = t;
    __syncthreads();
    return scratch[0];
}

// y[r*n + i] = x[r*n + i] * w[i] / rms(x[r*n ..]); one block per row `r` (rows > 1 for per-head q/k-norm).
extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, int n, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = hf_block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// Rotary embedding in place over `n_heads` heads of `head_dim` at position `pos`; the first
// `rope_dim` dims of each head rotate with angles pos * inv_freq[i] and cos/sin scaled by `mscale`
// (both precomputed on the host in f64 by hipfire-model's rope.rs, so llama-3.1 frequency factors,
// linear and YaRN scaling apply without a second kernel; mscale is YaRN's 1 + 0.1 ln s, else 1).
// neox = 0: pairs (2i, 2i+1) (llama.cpp LLAMA_ROPE_TYPE_NORM); neox = 1: pairs (i, i + rope_dim/2) (NEOX).
extern "C" __global__ void rope_f32(float* __restrict__ x, int head_dim, int rope_dim, int pos,
                                    const float* __restrict__ inv_freq, int neox, float mscale) {
    const int h = blockIdx.x;
    const int half = rope_dim / 2;
    float* xh = x + (size_t)h * head_dim;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf((float)pos * inv_freq[i], &s, &c);
        s *= mscale;
        c *= mscale;
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float x0 = xh[a], x1 = xh[b];
        xh[a] = x0 * c - x1 * s;
        xh[b] = x0 * s + x1 * c;
    }
}

// Stores this position's k and v (f32, n floats each) into their cache rows as f16.
extern "C" __global__ void kv_store_f16(const float* __restrict__ k, const float* __restrict__ v,
                                        hf_u16* __restrict__ kslot, hf_u16* __restrict__ vslot, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        kslot[i] = hf_f2h(k[i]);
        vslot[i] = hf_f2h(v[i]);
    }
}

// Decode attention for one query token over the f16 cache. q: [n_head][head_dim] (f32); caches:
// [n_pos_max][n_kv_head][head_dim] f16 (row `p` written at position p); out: [n_head][head_dim] (f32).
// One block per query head; scores for all n_pos positions live in dynamic shared memory (n_pos
// floats); products and sums are f32.
extern "C" __global__ void attention_f16kv(const float* __restrict__ q, const hf_u16* __restrict__ kc,
                                           const hf_u16* __restrict__ vc, float* __restrict__ out,
                                           int n_head, int n_kv_head, int head_dim, int n_pos,
                                           float scale) {
    extern __shared__ float scores[];
    __shared__ float scratch[32];
    const int h = blockIdx.x;
    const int kvh = h / (n_head / n_kv_head);
    const size_t stride = (size_t)n_kv_head * head_dim;
    const float* qh = q + (size_t)h * head_dim;
    const int lane = threadIdx.x % HF_WARP, warp = threadIdx.x / HF_WARP;
    const int n_warps = blockDim.x / HF_WARP;
    // One warp per position: lanes split the head dimension.
    for (int p = warp; p < n_pos; p += n_warps) {
        const hf_u16* kp = kc + p * stride + (size_t)kvh * head_dim;
        float s = 0.0f;
        for (int i = lane; i < head_dim; i += HF_WARP) s += qh[i] * hf_h2f(kp[i]);
        for (int o = HF_WARP / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) scores[p] = s * scale;
    }
    __syncthreads();
    float m = HF_NEG_INF;
    for (int p = threadIdx.x; p < n_pos; p += blockDim.x) m = fmaxf(m, scores[p]);
    m = hf_block_max(m, scratch);
    float sum = 0.0f;
    for (int p = threadIdx.x; p < n_pos; p += blockDim.x) {
        const float e = __expf(scores[p] - m);
        scores[p] = e;
        sum += e;
    }
    sum = hf_block_sum(sum, scratch);
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float acc = 0.0f;
        const hf_u16* vp = vc + (size_t)kvh * head_dim + i;
        for (int p = 0; p < n_pos; ++p) acc += scores[p] * hf_h2f(vp[p * stride]);
        out[(size_t)h * head_dim + i] = acc * inv;
    }
}

// out[i] = silu(gate[i]) * up[i]
extern "C" __global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        out[i] = g / (1.0f + __expf(-g)) * up[i];
    }
}

// y[i] += b[i]
extern "C" __global__ void add_f32(float* __restrict__ y, const float* __restrict__ b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i];
}
