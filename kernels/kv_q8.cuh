// kv_q8.cuh — the GPU's q8_0 K/V cache (model.cache_type = q8_0): the store that quantises a
// position's k and v, and the loads the attention kernels read it with. Include after f16.cuh.
//
// Layout: one layer's K (or V) cache of `cap` positions, `n` = n_kv_head * head_dim values each,
// is one buffer holding [cap][n] int8 quants, then [cap][n / 32] f16 scales: value i of position p
// is quant[p * n + i] * scale[(p * n + i) / 32]. Quants and scales sit apart (not ggml's
// interleaved 34-byte blocks) so that a lane's 8 quants are one aligned 8-byte load whatever the
// row width; the bytes are ggml's (34 per 32 values), which the VRAM budget counts.
//
// Each run of 32 values is quantised as ggml's q8_0 and the CPU engine's cache
// (crates/hipfire-model/src/kv_q8.rs): d = max|x| / 127, q = round(x / d) (half away from zero)
// computed as x * (1 / d) in f32, d stored as f16 (round to nearest, ties to even). The host
// requires head_dim to be a multiple of 32, so a run never crosses a head.
#pragma once

// Values per q8_0 block (ggml's QK8_0).
#define HF_Q8_BLOCK 32

// Quantises one value of a run of 32: the 32 lanes of an aligned group of a warp hold the run
// (lane % 32 = index in the run; `x` is 0 on a lane past the data, which then writes nothing). All
// lanes of the warp call it (the shuffles name the whole warp). The run's first lane writes the
// scale.
__device__ __forceinline__ void hf_q8_quantize(float x, bool on, signed char* q, hf_u16* scale) {
    float amax = fabsf(x);
    for (int o = HF_Q8_BLOCK / 2; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    if (on) {
        *q = (signed char)fminf(fmaxf(roundf(x * inv), -127.0f), 127.0f);
        if ((threadIdx.x % HF_Q8_BLOCK) == 0) *scale = hf_f2h(d);
    }
}

// The caches' loads for the attention kernels: 8 values of one row per lane, as `unpack` (the
// values over their common scale) times `scale` (1 for f16), so the kernels multiply by a q8_0
// run's scale once per row — on a lane's partial dot for K, on the softmax weight for V — and not
// per value.

// The f16 cache: one 16-byte load.
struct HfKvF16 {
    typedef uint4 Raw;
    const hf_u16* base;  // this lane's first value in position 0
    // `cache`: the layer's cache; `off`: the lane's first value within a position's row.
    __device__ __forceinline__ HfKvF16(const void* cache, int /*cap*/, size_t /*stride*/, size_t off)
        : base((const hf_u16*)cache + off) {}
    __device__ __forceinline__ Raw load(int row, size_t stride) const {
        return *(const uint4*)(base + (size_t)row * stride);
    }
    __device__ __forceinline__ static Raw zero() { return make_uint4(0u, 0u, 0u, 0u); }
    __device__ __forceinline__ static float scale(Raw) { return 1.0f; }
    __device__ __forceinline__ static void unpack(Raw r, float* f) {
        const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            f[2 * j] = hf_h2f((hf_u16)(w[j] & 0xffffu));
            f[2 * j + 1] = hf_h2f((hf_u16)(w[j] >> 16));
        }
    }
};

// The q8_0 cache's loads: 8 quants of one row per lane (one 8-byte load) and their run's scale (8
// values never straddle a run: the lane's offset is a multiple of 8 and runs are 32 long).
struct HfKvQ8 {
    struct Raw {
        uint2 q;
        unsigned int d;  // the f16 scale's bits, widened when unpacked
    };
    const signed char* quant;  // this lane's first quant in position 0
    const hf_u16* scales;      // its run's scale in position 0
    __device__ __forceinline__ HfKvQ8(const void* cache, int cap, size_t stride, size_t off)
        : quant((const signed char*)cache + off),
          scales((const hf_u16*)((const signed char*)cache + (size_t)cap * stride) + off / HF_Q8_BLOCK) {}
    __device__ __forceinline__ Raw load(int row, size_t stride) const {
        Raw r;
        r.q = *(const uint2*)(quant + (size_t)row * stride);
        r.d = scales[(size_t)row * (stride / HF_Q8_BLOCK)];
        return r;
    }
    __device__ __forceinline__ static Raw zero() {
        Raw r;
        r.q = make_uint2(0u, 0u);
        r.d = 0u;
        return r;
    }
    __device__ __forceinline__ static float scale(Raw r) { return hf_h2f((hf_u16)r.d); }
    // The 8 quants as f32 (exact); the value is quant × scale(r).
    __device__ __forceinline__ static void unpack(Raw r, float* f) {
        const unsigned int w[2] = {r.q.x, r.q.y};
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int b = 0; b < 4; ++b) f[4 * j + b] = (float)(signed char)(w[j] >> (8 * b));
    }
};
