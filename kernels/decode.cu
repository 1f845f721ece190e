// Decode-step kernels for the llama family (batch 1): RMSNorm, RoPE, grouped-query attention over an
// f16 or q8_0 KV cache, the cache stores, SwiGLU, bias add. CUDA/HIP common subset: no cooperative
// groups, no warp-size assumptions beyond 32 (HIP wave64 builds set HF_WARP to 64), no inline PTX
// outside the HF_CUDA guards.
//
// The cache is f16 like the CPU decoder's (llama.cpp's default cache type): this step's k and v are
// computed in f32 (projection, bias, k-norm, RoPE) and rounded once, to nearest with ties to even,
// when stored, which is half::f16::from_f32's rule, so on finite values both engines cache the same bits.
//
// Everything but attention is bandwidth-trivial next to the projections (a 4096-wide vector per
// call), so those kernels favour simplicity: one block per vector or per head, shared-memory
// reductions. Attention reads the whole KV cache every step (512 MiB a token for Llama-3-8B at
// depth 4096), so it is split over the KV range to use the whole chip (see below).

#include "platform.cuh"

// NVRTC compiles without the host headers (math.h / math_constants.h) that define INFINITY;
// measured on the H200 box: "identifier INFINITY is undefined" at the two uses below.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// An f16 cache element is handled as its bit pattern, as gemv.cu handles f16 scales (f16.cuh).
#include "f16.cuh"
// The q8_0 cache's store and the two caches' loads for attention.
#include "kv_q8.cuh"

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
// One head's rotation (xh: head_dim floats) at `pos`, threads tid, tid + step, ... over the pairs.
__device__ __forceinline__ void hf_rope_head(float* __restrict__ xh, int rope_dim, int pos,
                                             const float* __restrict__ inv_freq, int neox, float mscale,
                                             int tid, int step) {
    const int half = rope_dim / 2;
    for (int i = tid; i < half; i += step) {
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
extern "C" __global__ void rope_f32(float* __restrict__ x, int head_dim, int rope_dim, int pos,
                                    const float* __restrict__ inv_freq, int neox, float mscale) {
    hf_rope_head(x + (size_t)blockIdx.x * head_dim, rope_dim, pos, inv_freq, neox, mscale, threadIdx.x,
                 blockDim.x);
}
// The slots form (a batched decode step): rows of n_heads heads, row y at position pos[y]; block
// y * n_heads + h rotates head h of row y exactly as rope_f32 does.
extern "C" __global__ void rope_slots_f32(float* __restrict__ x, int n_heads, int head_dim, int rope_dim,
                                          const int* __restrict__ pos, const float* __restrict__ inv_freq,
                                          int neox, float mscale) {
    const int y = blockIdx.x / n_heads;
    hf_rope_head(x + (size_t)blockIdx.x * head_dim, rope_dim, pos[y], inv_freq, neox, mscale, threadIdx.x,
                 blockDim.x);
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

// The slots form: row y's k and v (n floats each, rows n apart) into its cache rows at pos[y]
// (kbase[y] / vbase[y]: the slot's f16 caches, rows n apart); blocks_per_row blocks a row.
extern "C" __global__ void kv_store_slots_f16(const float* __restrict__ k, const float* __restrict__ v,
                                              const unsigned long long* __restrict__ kbase,
                                              const unsigned long long* __restrict__ vbase,
                                              const int* __restrict__ pos, int n, int blocks_per_row) {
    const int y = blockIdx.x / blocks_per_row;
    const int i = (blockIdx.x % blocks_per_row) * blockDim.x + threadIdx.x;
    if (i < n) {
        const size_t at = (size_t)pos[y] * n + i;
        ((hf_u16*)kbase[y])[at] = hf_f2h(k[(size_t)y * n + i]);
        ((hf_u16*)vbase[y])[at] = hf_f2h(v[(size_t)y * n + i]);
    }
}

// The q8_0 cache's store (kv_q8.cuh): this position's k and v (f32, n floats each, n a multiple
// of 32) as q8_0 runs, quants at kq / vq, the runs' scales at ks / vs. The host launches blocks of
// a multiple of 32 threads, so each run is one aligned group of 32 lanes.
extern "C" __global__ void kv_store_q8(const float* __restrict__ k, const float* __restrict__ v,
                                       signed char* __restrict__ kq, hf_u16* __restrict__ ks,
                                       signed char* __restrict__ vq, hf_u16* __restrict__ vs, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool on = i < n;
    const float kx = on ? k[i] : 0.0f, vx = on ? v[i] : 0.0f;
    hf_q8_quantize(kx, on, kq + i, ks + i / HF_Q8_BLOCK);
    hf_q8_quantize(vx, on, vq + i, vs + i / HF_Q8_BLOCK);
}

// The slots form of kv_store_q8: row y's k and v (n floats each, rows n apart) into the q8_0
// caches kbase[y] / vbase[y] (each `cap` positions: quants, then scales) at pos[y];
// blocks_per_row blocks a row.
extern "C" __global__ void kv_store_slots_q8(const float* __restrict__ k, const float* __restrict__ v,
                                             const unsigned long long* __restrict__ kbase,
                                             const unsigned long long* __restrict__ vbase,
                                             const int* __restrict__ pos, int n, int blocks_per_row,
                                             int cap) {
    const int y = blockIdx.x / blocks_per_row;
    const int i = (blockIdx.x % blocks_per_row) * blockDim.x + threadIdx.x;
    const bool on = i < n;
    const size_t at = (size_t)pos[y] * n + i;
    const float kx = on ? k[(size_t)y * n + i] : 0.0f, vx = on ? v[(size_t)y * n + i] : 0.0f;
    signed char* kq = (signed char*)kbase[y];
    signed char* vq = (signed char*)vbase[y];
    const size_t scales = (size_t)cap * n;
    hf_q8_quantize(kx, on, kq + at, (hf_u16*)(kq + scales) + at / HF_Q8_BLOCK);
    hf_q8_quantize(vx, on, vq + at, (hf_u16*)(vq + scales) + at / HF_Q8_BLOCK);
}

// ---- Decode attention, split over the KV range ("flash-decoding") ----
//
// One query token over the f16 or q8_0 cache. q: [n_head][head_dim] (f32); caches: [n_pos_max]
// [n_kv_head][head_dim] values (row `p` written at position p; f16, or q8_0 quants then scales as
// kv_q8.cuh lays them out); out: [n_head][head_dim] (f32).
//
// attention_split_f16kv_g{1,2,4,8}: one block per (group of up to `heads_per_block` query heads
// of one kv head, chunk of positions); blockIdx.x = (head_group * n_kv_head + kv_head) * n_chunks
// + chunk. Every K and V row of the chunk is read once for all the block's query heads (the GQA
// group), one 16-byte load per lane. With one chunk the block writes the normalised output;
// otherwise it writes the chunk's partial (m, l, acc[head_dim], acc unnormalised) to
// part[head][chunk][2 + head_dim] and attention_combine_f32 merges them. The suffix is the most
// heads a block serves (their q slices and accumulators are registers, so a smaller group uses
// fewer); the host launches the smallest instance >= heads_per_block.
//
// Each warp walks its own rows of the chunk with its own running max and sum (online softmax)
// in registers, with no barrier until the chunk is done: warps wait on their loads
// independently, so one warp's dots and exps run while another's rows are in flight. A row of
// head_dim f16 is `lanes_per_row` lanes of 8 values (the host passes the power of two >=
// head_dim / 8, <= HF_WARP; lanes past head_dim load nothing), so a warp holds HF_WARP /
// lanes_per_row rows per load and HF_ATTN_UNROLL loads per tile; warp w's rows are interleaved
// with the others' (row groups w, w + n_warps, ...), so a block's tile is a run of
// consecutive rows. Each lane loads the next tile's K while it finishes this tile's softmax and
// V, and the next tile's V after this tile's V. At the end the warps' (m, l, acc) merge through
// shared memory in a fixed order (the result does not depend on scheduling). Products and sums
// are f32. head_dim must be a multiple of 8 (the 16-byte loads stay aligned).

// Loads each lane holds per tile (K and V, 16 bytes each).
#ifndef HF_ATTN_UNROLL
#define HF_ATTN_UNROLL 4
#endif
// Threads of the split kernel (4 warps on CUDA); the host launches exactly this many.
#define HF_ATTN_THREADS 128
// Blocks per multiprocessor the split kernel's registers must allow (__launch_bounds__): 4
// caps a thread at 128 registers, which the planner's one wave of 4 blocks an SM assumes
// (gpu_attention.rs ATTN_BLOCKS_PER_SM); without the cap the 2- and 4-head instances took more
// and ran 3 blocks an SM, 1.4x slower at depth 16384 on the H200.
#ifndef HF_ATTN_MINB
#define HF_ATTN_MINB 4
#endif
// Most chunks attention_combine_f32 merges (its weights sit in a static shared array).
#define HF_ATTN_MAX_CHUNKS 256
// Most query heads a block serves (the largest instance below).
#define HF_ATTN_MAX_G 8

// [ng][head_dim] scaled q; then [n_warps][ng][head_dim] the warps' accumulators and
// [n_warps][ng][2] their (m, l).
extern __shared__ __align__(16) float hf_attn_smem[];

// KV: the cache's loads (HfKvF16 or HfKvQ8, kv_q8.cuh; `cap` is the q8_0 cache's positions,
// unused by f16).
template <int GM, class KV>
__device__ __forceinline__ void hf_attn_split(const float* __restrict__ q, const void* kc,
                                              const void* vc, int cap,
                                              float* __restrict__ out, float* __restrict__ part,
                                              int n_head, int n_kv_head, int head_dim, int n_pos,
                                              int chunk_len, int n_chunks, int lanes_per_row,
                                              int heads_per_block, float scale, int first, int bid) {
    constexpr int U = HF_ATTN_UNROLL;  // loads each lane holds per tile
    const int D = head_dim;
    const int chunk = bid % n_chunks;
    const int rest = bid / n_chunks;
    const int kvh = rest % n_kv_head, hgroup = rest / n_kv_head;
    const int group = n_head / n_kv_head;
    const int g0 = hgroup * heads_per_block;
    const int ng = min(heads_per_block, group - g0);
    const int h0 = kvh * group + g0;
    const int lpr = lanes_per_row;
    const int lane = threadIdx.x % HF_WARP, warp = threadIdx.x / HF_WARP;
    const int n_warps = blockDim.x / HF_WARP;
    const int lr = lane % lpr;
    const int rpw = HF_WARP / lpr;  // rows a warp holds per load
    const int wrow = warp * rpw + lane / lpr;
    const int wstep = n_warps * rpw;  // rows between one lane's successive loads
    const int tile = wstep * U;
    const bool dim_on = lr * 8 < D;
    float* qs = hf_attn_smem;
    for (int i = threadIdx.x; i < ng * D; i += blockDim.x) qs[i] = q[(size_t)h0 * D + i] * scale;
    const size_t stride = (size_t)n_kv_head * D;
    const KV kx(kc, cap, stride, (size_t)kvh * D + lr * 8);
    const KV vx(vc, cap, stride, (size_t)kvh * D + lr * 8);
    // Positions [first, n_pos): a sliding-window layer (Gemma 3's local layers) starts past 0.
    const int p_begin = first + chunk * chunk_len;
    const int p_end = min(n_pos, p_begin + chunk_len);
    typename KV::Raw kr[U], vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int r = p_begin + u * wstep + wrow;
        const bool ok = dim_on && r < p_end;
        kr[u] = ok ? kx.load(r, stride) : KV::zero();
        vr[u] = ok ? vx.load(r, stride) : KV::zero();
    }
    __syncthreads();  // qs written
    float qr[GM][8], acc[GM][8], m_run[GM], l_run[GM];
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m_run[g] = HF_NEG_INF;
        l_run[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            qr[g][i] = (g < ng && dim_on) ? qs[g * D + lr * 8 + i] : 0.0f;
            acc[g][i] = 0.0f;
        }
    }
    for (int t0 = p_begin; t0 < p_end; t0 += tile) {
        // Scores of this lane's rows of the tile, every head of the block (-inf past the end).
        float e[GM][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float k[8];
            KV::unpack(kr[u], k);
            const float kd = KV::scale(kr[u]);
            const bool on = t0 + u * wstep + wrow < p_end;
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) s += qr[g][i] * k[i];
                s *= kd;  // this lane's 8 values share one scale (1 for f16)
                // Unrolled to the widest row with a uniform guard, so the heads' and rows'
                // shuffle chains interleave instead of running one after another.
#pragma unroll
                for (int o = HF_WARP / 2; o > 0; o >>= 1)
                    if (o < lpr) s += __shfl_xor_sync(0xffffffffu, s, o);
                e[g][u] = on ? s : HF_NEG_INF;
            }
        }
        // The next tile's K, in flight through this tile's softmax and V.
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int r = t0 + tile + u * wstep + wrow;
            const bool ok = dim_on && r < p_end;
            kr[u] = ok ? kx.load(r, stride) : KV::zero();
        }
        // Softmax against the warp's running max: the max and sum over the warp's rows of the
        // tile (this lane's, then across its row groups), then the weights in place of the scores.
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            float mx = e[g][0];
#pragma unroll
            for (int u = 1; u < U; ++u) mx = fmaxf(mx, e[g][u]);
            for (int o = lpr; o < HF_WARP; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = fmaxf(m_run[g], mx);
            // No row of the warp yet (its rows start past the end): nothing to fold in.
            const float cf = m_new == HF_NEG_INF ? 1.0f : __expf(m_run[g] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float w = m_new == HF_NEG_INF ? 0.0f : __expf(e[g][u] - m_new);
                e[g][u] = w;
                sum += w;
            }
            for (int o = lpr; o < HF_WARP; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            l_run[g] = l_run[g] * cf + sum;
            m_run[g] = m_new;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= cf;
        }
        // V: this lane's rows, weighted.
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float v[8];
            KV::unpack(vr[u], v);
            const float vd = KV::scale(vr[u]);
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                const float w = e[g][u] * vd;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] += w * v[i];
            }
        }
        // The next tile's V.
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int r = t0 + tile + u * wstep + wrow;
            const bool ok = dim_on && r < p_end;
            vr[u] = ok ? vx.load(r, stride) : KV::zero();
        }
    }
    // Sum the row groups of each warp (lanes lr, lr + lpr, ... hold the same dims under the same
    // running max), then merge the warps through shared memory.
#pragma unroll
    for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i)
            for (int o = lpr; o < HF_WARP; o <<= 1) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], o);
    float* red = hf_attn_smem + ng * D;       // [n_warps][ng][head_dim]
    float* ml = red + n_warps * ng * D;       // [n_warps][ng][2]
    if (lane < lpr && dim_on) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            if (g < ng) {
                float* d = red + ((size_t)warp * ng + g) * D + lr * 8;
#pragma unroll
                for (int i = 0; i < 8; ++i) d[i] = acc[g][i];
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            if (g < ng) {
                ml[(warp * ng + g) * 2] = m_run[g];
                ml[(warp * ng + g) * 2 + 1] = l_run[g];
            }
        }
    }
    __syncthreads();
    const size_t row = (size_t)D + 2;
    for (int i = threadIdx.x; i < ng * D; i += blockDim.x) {
        const int g = i / D;
        float mx = HF_NEG_INF;
        for (int w = 0; w < n_warps; ++w) mx = fmaxf(mx, ml[(w * ng + g) * 2]);
        float a = 0.0f, l = 0.0f;
        for (int w = 0; w < n_warps; ++w) {
            const float mw = ml[(w * ng + g) * 2];
            if (mw == HF_NEG_INF) continue;  // a warp with no row in the chunk
            const float f = __expf(mw - mx);
            a += red[(size_t)(w * ng + g) * D + (i - g * D)] * f;
            l += ml[(w * ng + g) * 2 + 1] * f;
        }
        if (n_chunks == 1) {
            out[(size_t)h0 * D + i] = a / l;
        } else {
            float* pp = part + ((size_t)(h0 + g) * n_chunks + chunk) * row;
            pp[2 + (i - g * D)] = a;
            if (i == g * D) {
                pp[0] = mx;
                pp[1] = l;
            }
        }
    }
}

#define HF_ATTN_SPLIT_ENTRY(NAME, GM, KV, KT, CAP_PARAM, CAP)                                   \
    extern "C" __global__ void __launch_bounds__(HF_ATTN_THREADS, HF_ATTN_MINB)                    \
        NAME(const float* __restrict__ q, const KT* __restrict__ kc, const KT* __restrict__ vc,    \
             float* __restrict__ out, float* __restrict__ part, int n_head, int n_kv_head,         \
             int head_dim, int n_pos, int chunk_len, int n_chunks, int lanes_per_row,              \
             int heads_per_block, float scale, int first CAP_PARAM) {                              \
        hf_attn_split<GM, KV>(q, kc, vc, CAP, out, part, n_head, n_kv_head, head_dim, n_pos,      \
                              chunk_len, n_chunks, lanes_per_row, heads_per_block, scale, first,   \
                              blockIdx.x);                                                         \
    }
// The f16 entries take no capacity; the q8_0 ones take the cache's positions last.
#define HF_NO_CAP
#define HF_CAP_PARAM , int cap
HF_ATTN_SPLIT_ENTRY(attention_split_f16kv_g1, 1, HfKvF16, hf_u16, HF_NO_CAP, 0)
HF_ATTN_SPLIT_ENTRY(attention_split_f16kv_g2, 2, HfKvF16, hf_u16, HF_NO_CAP, 0)
HF_ATTN_SPLIT_ENTRY(attention_split_f16kv_g4, 4, HfKvF16, hf_u16, HF_NO_CAP, 0)
HF_ATTN_SPLIT_ENTRY(attention_split_f16kv_g8, 8, HfKvF16, hf_u16, HF_NO_CAP, 0)
// The q8_0 cache keeps HF_ATTN_UNROLL loads a tile: twice as many (the same bytes in flight as
// f16's) spilled registers in the 1- and 2-head instances and took 16.1 / 21.5 / 49.4 us at depth
// 1024 / 4096 / 16384 on the H200 against 13.5 / 20.9 / 49.2 us
// (docs/perf-checkpoints/2026-12-01-gpu-kv-q8-h200, attention timing).
HF_ATTN_SPLIT_ENTRY(attention_split_q8kv_g1, 1, HfKvQ8, signed char, HF_CAP_PARAM, cap)
HF_ATTN_SPLIT_ENTRY(attention_split_q8kv_g2, 2, HfKvQ8, signed char, HF_CAP_PARAM, cap)
HF_ATTN_SPLIT_ENTRY(attention_split_q8kv_g4, 4, HfKvQ8, signed char, HF_CAP_PARAM, cap)
HF_ATTN_SPLIT_ENTRY(attention_split_q8kv_g8, 8, HfKvQ8, signed char, HF_CAP_PARAM, cap)

// The slots form (a batched decode step): one query row per sequence, each over its own caches
// (kcs[y], vcs[y]) and depth (positions firsts[y] .. npos[y]), with one chunk count for all rows:
// blocks y * per_row .. (y + 1) * per_row - 1 are row y's, as attention_split_f16kv_g* lays them
// out. Each row cuts its own span into the n_chunks chunks (read from the tables, not baked into
// the launch, so one captured graph serves every depth of its chunk count); a chunk past a row's
// span holds no positions and writes the empty partial (m = -inf, l = 0), which
// attention_combine_f32 weighs by 0. Row y's q and out rows are at y * n_head * head_dim,
// its partials at y * n_head * n_chunks * (head_dim + 2): attention_combine_f32 over
// rows * n_head blocks merges them all.
#define HF_ATTN_SLOTS_ENTRY(NAME, GM, KV, CAP_PARAM, CAP)                                      \
    extern "C" __global__ void __launch_bounds__(HF_ATTN_THREADS, HF_ATTN_MINB)                    \
        NAME(const float* __restrict__ q, const unsigned long long* __restrict__ kcs,             \
             const unsigned long long* __restrict__ vcs, const int* __restrict__ npos,            \
             const int* __restrict__ firsts, float* __restrict__ out, float* __restrict__ part,   \
             int n_head, int n_kv_head, int head_dim, int n_chunks, int lanes_per_row,             \
             int heads_per_block, float scale, int per_row CAP_PARAM) {                            \
        const int y = blockIdx.x / per_row;                                                        \
        const size_t qd = (size_t)n_head * head_dim;                                               \
        const int chunk_len = max(1, (npos[y] - firsts[y] + n_chunks - 1) / n_chunks);             \
        hf_attn_split<GM, KV>(q + y * qd, (const void*)kcs[y], (const void*)vcs[y], CAP,          \
                              out + y * qd,                                                        \
                              part + (size_t)y * n_head * n_chunks * (head_dim + 2), n_head,       \
                              n_kv_head, head_dim, npos[y], chunk_len, n_chunks, lanes_per_row,    \
                              heads_per_block, scale, firsts[y], blockIdx.x % per_row);            \
    }
HF_ATTN_SLOTS_ENTRY(attention_slots_f16kv_g1, 1, HfKvF16, HF_NO_CAP, 0)
HF_ATTN_SLOTS_ENTRY(attention_slots_f16kv_g2, 2, HfKvF16, HF_NO_CAP, 0)
HF_ATTN_SLOTS_ENTRY(attention_slots_f16kv_g4, 4, HfKvF16, HF_NO_CAP, 0)
HF_ATTN_SLOTS_ENTRY(attention_slots_f16kv_g8, 8, HfKvF16, HF_NO_CAP, 0)
HF_ATTN_SLOTS_ENTRY(attention_slots_q8kv_g1, 1, HfKvQ8, HF_CAP_PARAM, cap)
HF_ATTN_SLOTS_ENTRY(attention_slots_q8kv_g2, 2, HfKvQ8, HF_CAP_PARAM, cap)
HF_ATTN_SLOTS_ENTRY(attention_slots_q8kv_g4, 4, HfKvQ8, HF_CAP_PARAM, cap)
HF_ATTN_SLOTS_ENTRY(attention_slots_q8kv_g8, 8, HfKvQ8, HF_CAP_PARAM, cap)

// Merges the n_chunks partials of each head (one block per head): weights exp(m_c - M) / L with
// M = max m_c and L = sum l_c exp(m_c - M), then out = sum_c weight_c * acc_c.
extern "C" __global__ void attention_combine_f32(const float* __restrict__ part,
                                                 float* __restrict__ out, int head_dim,
                                                 int n_chunks) {
    __shared__ float scratch[32];
    __shared__ float wts[HF_ATTN_MAX_CHUNKS];
    const int h = blockIdx.x;
    const size_t row = (size_t)head_dim + 2;
    const float* ph = part + (size_t)h * n_chunks * row;
    float m = HF_NEG_INF;
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) m = fmaxf(m, ph[c * row]);
    m = hf_block_max(m, scratch);
    float l = 0.0f;
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) {
        const float w = __expf(ph[c * row] - m);
        wts[c] = w;
        l += ph[c * row + 1] * w;
    }
    l = hf_block_sum(l, scratch);
    const float inv = 1.0f / l;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int c = 0; c < n_chunks; ++c) a += wts[c] * ph[c * row + 2 + d];
        out[(size_t)h * head_dim + d] = a * inv;
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

// ---- Gemma 3 (not launched yet: the GPU decoder refuses gemma3; see ModelConfig::gpu_unsupported).

// GELU, tanh approximation, as hipfire-model's ops::gelu_tanh (HF gelu_pytorch_tanh): the CPU path
// computes it in f32 with libm's tanhf; tanhf here, so the two agree to a few ulp.
#define HF_GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define HF_GELU_COEF_A 0.044715f

// out[i] = gelu_tanh(gate[i]) * up[i] (GeGLU) over n = rows * n_ff elements (rows-aware by being
// elementwise: a batch of rows is one contiguous n).
extern "C" __global__ void geglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                     float* __restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        const float t = tanhf(HF_GELU_SQRT_2_OVER_PI * g * (1.0f + HF_GELU_COEF_A * g * g));
        out[i] = 0.5f * g * (1.0f + t) * up[i];
    }
}

// x[i] *= s over n elements: Gemma's embedding scale sqrt(d_model) (in f32, as llama.cpp's ggml_scale).
extern "C" __global__ void scale_f32(float* __restrict__ x, float s, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

// Gemma's post-norm and residual add: y[r*n + i] += x[r*n + i] * w[i] / rms(x[r*n ..]); one block
// per row r (post_attention_norm / post_ffw_norm of the block output x into the residual y).
extern "C" __global__ void rms_norm_add_f32(const float* __restrict__ x, const float* __restrict__ w,
                                            float* __restrict__ y, int n, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = hf_block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] += xr[i] * inv * w[i];
}

// Final logit soft-capping x = cap * tanh(x / cap) over n elements (gemma3.final_logit_softcapping).
extern "C" __global__ void softcap_f32(float* __restrict__ x, float cap, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] * (1.0f / cap)) * cap;
}
