// moe.cu — the routed FFN's small kernels: each row's routing (gating, top-k, renormalisation)
// from its router logits, the shared expert's scalar gate, and the weighted sum of the selected
// experts' outputs into the residual stream. The experts' projections themselves are the GEMV's
// ids form (gemv.cu `gemv_<fmt>_plain_v<w>_ids`).
//
// Everything stays on the device (ids and weights are device scratch the ids GEMV reads), so a
// layer's MoE needs no host round trip and a decode step containing it can be captured in a graph.
// The routing follows the CPU engine (crates/hipfire-model/src/moe.rs `Routes::from_logits_biased`):
// scores by the gating (softmax over every expert, or a sigmoid per expert), the n_used best in
// descending score with ties to the lower expert index — scored with a per-expert selection bias
// added where the layer has one (GLM-4.5's exp_probs_b), weighted by the unbiased scores — the
// weights divided by their sum (clamped below, as llama.cpp) where norm_topk says, then multiplied by
// the model's weights scale. The sum into the residual takes each row's experts in
// ascending id, as the CPU engine does, so a token's result does not depend on the other rows.
// llama.cpp's fused equivalent is ggml-cuda `topk-moe.cu`.
//
// CUDA/HIP common subset: warp shuffles behind the HF_CUDA / HF_HIP guards, no inline PTX.

#include "platform.cuh"

typedef unsigned long long hf_u64;

// Gating rules (crates/hipfire-model/src/gpu/moe.rs `Gating`, passed as an int so a rule is a new
// case here and a new variant there). Softmax: p = softmax(logits) over every expert. Sigmoid:
// p = sigmoid(logit) per expert. Either way the top k by p (+ bias), weights p.
#define HF_GATING_SOFTMAX 0
#define HF_GATING_SIGMOID 1

// The floor of the chosen weights' sum before renormalising (crates/hipfire-model/src/moe.rs
// MIN_WEIGHT_SUM, llama.cpp build_moe_ffn's clamp to 6.103515625e-5, the smallest normal f16):
// sigmoid scores that underflow to 0 give zero weights, not NaN.
#define HF_MOE_MIN_WEIGHT_SUM 6.103515625e-5f

__device__ __forceinline__ float hf_shfl_xor_f(float v, int o) {
#ifdef HF_CUDA
    return __shfl_xor_sync(0xffffffffu, v, o);
#else
    return __shfl_xor(v, o);
#endif
}

__device__ __forceinline__ int hf_shfl_xor_i(int v, int o) {
#ifdef HF_CUDA
    return __shfl_xor_sync(0xffffffffu, v, o);
#else
    return __shfl_xor(v, o);
#endif
}

// The routing's lanes exchange values through shared memory between rounds.
__device__ __forceinline__ void hf_moe_syncwarp() {
#ifdef HF_CUDA
    __syncwarp();
#else
    __builtin_amdgcn_wave_barrier();
#endif
}

__device__ __forceinline__ float hf_moe_warp_sum(float v) {
    for (int o = HF_WARP / 2; o > 0; o >>= 1) v += hf_shfl_xor_f(v, o);
    return v;
}

__device__ __forceinline__ float hf_moe_warp_max(float v) {
    for (int o = HF_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, hf_shfl_xor_f(v, o));
    return v;
}

// Whether candidate (v, e) ranks before (bv, be): higher value first, equal values by lower index,
// a missing candidate (index < 0) last. NaN values were mapped to -inf before, so the order is total.
__device__ __forceinline__ bool hf_ranks_before(float v, int e, float bv, int be) {
    if (e < 0) return false;
    if (be < 0) return true;
    return v > bv || (v == bv && e < be);
}

// One warp per row: logits[row * n_expert ..] -> ids[row * n_used ..] (int32, descending
// selection score) and weights[row * n_used ..]. bias: n_expert selection biases, or 0 for none;
// scale: the factor on the final weights (1 is exact). Dynamic shared memory: 2 * n_expert floats
// (the scores, the selection scores) + n_expert bytes (taken marks). 1 <= n_used <= n_expert (the
// host checks).
extern "C" __global__ void __launch_bounds__(HF_WARP)
    moe_route_f32(const float* __restrict__ logits, int n_expert, int n_used, int gating, int norm_topk,
                  const float* __restrict__ bias, float scale, int* __restrict__ ids,
                  float* __restrict__ weights) {
    extern __shared__ float moe_p[];
    float* moe_s = moe_p + n_expert;
    unsigned char* taken = (unsigned char*)(moe_s + n_expert);
    const int row = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (hf_u64)row * n_expert;
    switch (gating) {
    case HF_GATING_SIGMOID:
        // As moe.rs `sigmoid`: 1 / (1 + exp(-x)).
        for (int e = lane; e < n_expert; e += HF_WARP) moe_p[e] = 1.0f / (1.0f + expf(-l[e]));
        break;
    case HF_GATING_SOFTMAX:
    default: {
        // As ops::softmax: exp(x - max), then times 1 / sum.
        float mx = HF_NEG_INF;
        for (int e = lane; e < n_expert; e += HF_WARP) mx = fmaxf(mx, l[e]);
        mx = hf_moe_warp_max(mx);
        float sum = 0.0f;
        for (int e = lane; e < n_expert; e += HF_WARP) {
            const float p = expf(l[e] - mx);
            moe_p[e] = p;
            sum += p;
        }
        sum = hf_moe_warp_sum(sum);
        const float inv = 1.0f / sum;
        for (int e = lane; e < n_expert; e += HF_WARP) moe_p[e] *= inv;
        break;
    }
    }
    for (int e = lane; e < n_expert; e += HF_WARP) {
        const float s = bias != 0 ? moe_p[e] + bias[e] : moe_p[e];
        // A NaN (a broken model) ranks last, so every row still gets n_used distinct ids.
        moe_s[e] = s != s ? HF_NEG_INF : s;
        taken[e] = 0;
    }
    hf_moe_syncwarp();
    int* row_ids = ids + (hf_u64)row * n_used;
    float* row_w = weights + (hf_u64)row * n_used;
    for (int j = 0; j < n_used; ++j) {
        float bv = HF_NEG_INF;
        int be = -1;
        for (int e = lane; e < n_expert; e += HF_WARP) {
            if (!taken[e] && hf_ranks_before(moe_s[e], e, bv, be)) {
                bv = moe_s[e];
                be = e;
            }
        }
        for (int o = HF_WARP / 2; o > 0; o >>= 1) {
            const float ov = hf_shfl_xor_f(bv, o);
            const int oe = hf_shfl_xor_i(be, o);
            if (hf_ranks_before(ov, oe, bv, be)) {
                bv = ov;
                be = oe;
            }
        }
        // Every lane holds the same winner now; n_used <= n_expert, so it exists.
        if (lane == 0) {
            taken[be] = 1;
            row_ids[j] = be;
            row_w[j] = moe_p[be];
        }
        hf_moe_syncwarp();
    }
    if (lane == 0) {
        if (norm_topk) {
            // In choice order, as the CPU sums them.
            float s = 0.0f;
            for (int j = 0; j < n_used; ++j) s += row_w[j];
            s = fmaxf(s, HF_MOE_MIN_WEIGHT_SUM);
            for (int j = 0; j < n_used; ++j) row_w[j] /= s;
        }
        for (int j = 0; j < n_used; ++j) row_w[j] *= scale;
    }
}

// One warp per row: scale[row] = sigmoid(w . xn[row]) (the shared expert's gate), or 1 where the
// file has no gate (w == 0).
extern "C" __global__ void __launch_bounds__(HF_WARP)
    moe_shared_gate_f32(const float* __restrict__ xn, const float* __restrict__ w, int d,
                        float* __restrict__ scale) {
    const int row = blockIdx.x, lane = threadIdx.x;
    if (w == 0) {
        if (lane == 0) scale[row] = 1.0f;
        return;
    }
    const float* x = xn + (hf_u64)row * d;
    float s = 0.0f;
    for (int i = lane; i < d; i += HF_WARP) s += w[i] * x[i];
    s = hf_moe_warp_sum(s);
    if (lane == 0) scale[row] = 1.0f / (1.0f + expf(-s));
}

// x[row][i] += (sum over the row's n_used experts in ascending id of weight * down[pair][i])
//              + scale[row] * shared[row][i]   (the shared term only where shared != 0)
// with pair = row * n_used + slot and down rows d floats apart. Grid: rows * dchunks blocks (the
// launch API is 1-D), block b covering elements [(b % dchunks) * blockDim.x, ..) of row b / dchunks.
// Dynamic shared memory: n_used ints (the row's slots in ascending expert id).
extern "C" __global__ void moe_combine_f32(const float* __restrict__ down, const int* __restrict__ ids,
                                           const float* __restrict__ weights, int n_used, int d, int dchunks,
                                           const float* __restrict__ shared, const float* __restrict__ scale,
                                           float* __restrict__ x) {
    extern __shared__ int moe_order[];
    const int row = blockIdx.x / dchunks;
    const int* row_ids = ids + (hf_u64)row * n_used;
    if (threadIdx.x == 0) {
        // Insertion sort of the slots by expert id (n_used is small: 2 to 10 in published models).
        for (int s = 0; s < n_used; ++s) {
            int j = s;
            while (j > 0 && row_ids[moe_order[j - 1]] > row_ids[s]) {
                moe_order[j] = moe_order[j - 1];
                --j;
            }
            moe_order[j] = s;
        }
    }
    __syncthreads();
    const int i = (blockIdx.x % dchunks) * blockDim.x + threadIdx.x;
    if (i >= d) return;
    float acc = 0.0f;
    for (int j = 0; j < n_used; ++j) {
        const int s = moe_order[j];
        const hf_u64 pair = (hf_u64)row * n_used + s;
        acc += weights[pair] * down[pair * d + i];
    }
    if (shared != 0) acc += scale[row] * shared[(hf_u64)row * d + i];
    x[(hf_u64)row * d + i] += acc;
}
