// Batched-step kernels (prefill of n_tok > 1 tokens of one sequence): RoPE and bias add over token
// rows, and causal attention of the chunk's queries over the f16 KV cache. The projections of a
// batched step are GEMMs (cuBLAS over f16 rows from kernels/dequant.cu); RMSNorm, SwiGLU and the
// cache store reuse decode.cu's kernels, which already take rows or flat lengths.
//
// Layouts are row-major by token, as the GEMMs write them: q and out are [n_tok][n_head][head_dim]
// f32; the caches are [n_pos_max][n_kv_head][head_dim] f16 (row p written at position p), and the
// chunk's own k and v are already stored (rows pos0 .. pos0 + n_tok - 1) when attention runs.

#include "platform.cuh"

#include "f16.cuh"
#include "kv_q8.cuh"

// Two adjacent values of one cache row as an f16 pair (one 4-byte word of a staged row), at value
// offset `off` (even) of the cache: the f16 cache's word as stored; the q8_0 cache's two quants
// times their run's scale, rounded to f16 (kv_q8.cuh: quants [cap][n], then scales [cap][n / 32],
// `scales` = cap * n), as the CPU engine's q8_0 cache stages them for its f16 kernels.
__device__ __forceinline__ unsigned int hf_kv_word(const void* c, size_t off, size_t /*scales*/,
                                                   const HfKvF16* /*type*/) {
    return *(const unsigned int*)((const hf_u16*)c + off);
}
__device__ __forceinline__ unsigned int hf_kv_word(const void* c, size_t off, size_t scales,
                                                   const HfKvQ8* /*type*/) {
    const signed char* q = (const signed char*)c;
    const unsigned short pair = *(const unsigned short*)(q + off);
    const float d = hf_h2f(((const hf_u16*)(q + scales))[off / HF_Q8_BLOCK]);
    const float x0 = (float)(signed char)(pair & 0xffu) * d;
    const float x1 = (float)(signed char)(pair >> 8) * d;
    return (unsigned int)hf_f2h(x0) | ((unsigned int)hf_f2h(x1) << 16);
}

// Rotary embedding in place over x[n_tok][n_heads][head_dim]; token t is at position pos0 + t.
// Same arithmetic as decode.cu's rope_f32 (angles pos * inv_freq[i] in f32, cos/sin × mscale), so a
// chunk's rows rotate bit for bit as the per-token kernel would. One block per (token, head):
// blockIdx.x = t * n_heads + h.
extern "C" __global__ void rope_rows_f32(float* __restrict__ x, int n_heads, int head_dim,
                                         int rope_dim, int pos0, const float* __restrict__ inv_freq,
                                         int neox, float mscale) {
    const int t = blockIdx.x / n_heads;
    const int pos = pos0 + t;
    const int half = rope_dim / 2;
    float* xh = x + (size_t)blockIdx.x * head_dim;
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

// y[r][i] += b[i] for r < rows, i < n (a projection's bias over every token row).
extern "C" __global__ void add_rows_f32(float* __restrict__ y, const float* __restrict__ b, int n,
                                        int rows) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * rows) y[i] += b[i % n];
}

// ---- Causal attention of a chunk over the f16 cache ----
//
// One block per (tile of QT queries, query head): blockIdx.x = head * n_tiles + tile. Four warps;
// warp w owns queries w*QW .. w*QW + QW - 1 of the tile (QW = QT / 4). The keys 0 ..
// pos0 + last query are walked in tiles of 32 staged in shared memory (f16, rows padded by one
// 4-byte word so the 32 lanes reading 32 rows at one column hit 32 banks): lane j scores key j
// against the warp's queries, the warp keeps a running max and sum per query (online softmax), and
// each lane accumulates DMAX/32 output dims (d = lane + 32 i). Products and sums in f32, as the
// decode kernel. head_dim must be even and at most DMAX (the host checks). `scale` multiplies the
// scores (1/sqrt(head_dim), or the architecture's); `window` > 0 limits each query at p to keys
// p - window + 1 ..= p (sliding-window layers), 0 means causal over the whole cache.
#define HF_PF_KT 32     // keys per tile: one per lane
#define HF_PF_WARPS 4   // warps per block; the host launches HF_PF_WARPS * HF_WARP threads

// KV: the cache type (HfKvF16 or HfKvQ8, kv_q8.cuh), whose rows are staged as f16; `cap`: the
// q8_0 cache's positions (unused by f16).
template <int DMAX, int QT, class KV>
__device__ __forceinline__ void hf_attn_prefill(const float* __restrict__ q, const void* kc,
                                                const void* vc, int cap,
                                                float* __restrict__ out, int n_head, int n_kv_head,
                                                int D, int pos0, int n_tok, float scale,
                                                int window) {
    constexpr int QW = QT / HF_PF_WARPS;
    constexpr int DL = DMAX / HF_WARP;
    constexpr int KROW = DMAX + 2; // halves per staged row: DMAX/2 + 1 words
    __shared__ float qs[QT][DMAX];
    __shared__ __align__(4) hf_u16 ks[HF_PF_KT][KROW];
    __shared__ __align__(4) hf_u16 vs[HF_PF_KT][KROW];
    __shared__ float ps[QT][HF_PF_KT];

    const int n_tiles = (n_tok + QT - 1) / QT;
    const int h = blockIdx.x / n_tiles;
    const int tile = blockIdx.x % n_tiles;
    const int kvh = h / (n_head / n_kv_head);
    const int t0 = tile * QT;
    const int lane = threadIdx.x % HF_WARP, warp = threadIdx.x / HF_WARP;
    const size_t qstride = (size_t)n_head * D;
    const size_t kvstride = (size_t)n_kv_head * D;
    const size_t scales = (size_t)cap * kvstride;  // the q8_0 cache's scale region

    for (int i = threadIdx.x; i < QT * D; i += blockDim.x) {
        const int qi = i / D, d = i % D;
        const int t = t0 + qi;
        qs[qi][d] = t < n_tok ? q[(size_t)t * qstride + (size_t)h * D + d] * scale : 0.0f;
    }
    float m_run[QW], l_run[QW], acc[QW][DL];
#pragma unroll
    for (int a = 0; a < QW; ++a) {
        m_run[a] = HF_NEG_INF;
        l_run[a] = 0.0f;
#pragma unroll
        for (int i = 0; i < DL; ++i) acc[a][i] = 0.0f;
    }
    // Keys this block needs: through the position of its last real query.
    const int last_t = min(t0 + QT, n_tok) - 1;
    const int kv_end = pos0 + last_t + 1;
    const int words = D / 2; // 4-byte words per staged row
    // A sliding window (window > 0) hides keys more than window - 1 positions back: the block's
    // first query sees nothing before pos0 + t0 + 1 - window, so tiles before it are skipped.
    const int kv_begin = window > 0 ? max(0, pos0 + t0 + 1 - window) / HF_PF_KT * HF_PF_KT : 0;
    for (int kb = kv_begin; kb < kv_end; kb += HF_PF_KT) {
        __syncthreads(); // the previous tile's reads of ks/vs/ps are done
        for (int i = threadIdx.x; i < HF_PF_KT * words; i += blockDim.x) {
            const int r = i / words, w = i % words;
            const int p = kb + r;
            unsigned int kw = 0u, vw = 0u;
            if (p < kv_end) {
                const size_t off = (size_t)p * kvstride + (size_t)kvh * D + 2 * w;
                kw = hf_kv_word(kc, off, scales, (const KV*)0);
                vw = hf_kv_word(vc, off, scales, (const KV*)0);
            }
            *(unsigned int*)(&ks[r][2 * w]) = kw;
            *(unsigned int*)(&vs[r][2 * w]) = vw;
        }
        __syncthreads();
        // Scores: lane `lane` takes key kb + lane against each of the warp's queries.
        float s[QW];
#pragma unroll
        for (int a = 0; a < QW; ++a) s[a] = 0.0f;
        for (int w = 0; w < words; ++w) {
            const unsigned int kw = *(const unsigned int*)(&ks[lane][2 * w]);
            const float k0 = hf_h2f((hf_u16)(kw & 0xffffu));
            const float k1 = hf_h2f((hf_u16)(kw >> 16));
#pragma unroll
            for (int a = 0; a < QW; ++a) {
                const float2 qq = *(const float2*)(&qs[warp * QW + a][2 * w]);
                s[a] += qq.x * k0 + qq.y * k1;
            }
        }
        const int p = kb + lane;
#pragma unroll
        for (int a = 0; a < QW; ++a) {
            const int t = t0 + warp * QW + a;
            // A padding query (t >= n_tok) keeps finite scores and is never written.
            const bool visible = t >= n_tok ||
                                 (p <= pos0 + t && (window <= 0 || pos0 + t - p < window));
            float sa = visible ? s[a] : HF_NEG_INF;
            float mx = sa;
            for (int o = HF_WARP / 2; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = fmaxf(m_run[a], mx);
            // A tile wholly outside a query's window (m_new still -inf) adds nothing.
            const bool none = m_new == HF_NEG_INF;
            const float pr = none ? 0.0f : __expf(sa - m_new);
            float sum = pr;
            for (int o = HF_WARP / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            const float corr = none ? 1.0f : __expf(m_run[a] - m_new);
            l_run[a] = l_run[a] * corr + sum;
            m_run[a] = m_new;
#pragma unroll
            for (int i = 0; i < DL; ++i) acc[a][i] *= corr;
            ps[warp * QW + a][lane] = pr;
        }
        __syncwarp();
        const int kn = min(HF_PF_KT, kv_end - kb);
        for (int j = 0; j < kn; ++j) {
            float v[DL];
#pragma unroll
            for (int i = 0; i < DL; ++i) {
                const int d = lane + HF_WARP * i;
                v[i] = d < D ? hf_h2f(vs[j][d]) : 0.0f;
            }
#pragma unroll
            for (int a = 0; a < QW; ++a) {
                const float pj = ps[warp * QW + a][j];
#pragma unroll
                for (int i = 0; i < DL; ++i) acc[a][i] += pj * v[i];
            }
        }
    }
#pragma unroll
    for (int a = 0; a < QW; ++a) {
        const int t = t0 + warp * QW + a;
        if (t >= n_tok) continue;
        const float inv = 1.0f / l_run[a];
        float* o = out + (size_t)t * qstride + (size_t)h * D;
#pragma unroll
        for (int i = 0; i < DL; ++i) {
            const int d = lane + HF_WARP * i;
            if (d < D) o[d] = acc[a][i] * inv;
        }
    }
}

// Instances by the widest head they serve; the query tile shrinks for 256-wide heads so the
// staged tiles fit the 48 KiB of static shared memory (8 + 2 × 16.1 + 1 KiB).
#define HF_PF_ENTRY(NAME, DMAX, QT, KV, KT, CAP_PARAM, CAP)                                    \
    extern "C" __global__ void __launch_bounds__(HF_PF_WARPS * HF_WARP)                            \
        NAME(const float* __restrict__ q, const KT* __restrict__ kc, const KT* __restrict__ vc,    \
             float* __restrict__ out, int n_head, int n_kv_head, int head_dim, int pos0,           \
             int n_tok, float scale, int window CAP_PARAM) {                                       \
        hf_attn_prefill<DMAX, QT, KV>(q, kc, vc, CAP, out, n_head, n_kv_head, head_dim, pos0,     \
                                      n_tok, scale, window);                                       \
    }
// The f16 entries take no capacity; the q8_0 ones take the cache's positions last.
#define HF_NO_CAP
#define HF_CAP_PARAM , int cap
HF_PF_ENTRY(attention_prefill_f16kv_d128, 128, 16, HfKvF16, hf_u16, HF_NO_CAP, 0)
HF_PF_ENTRY(attention_prefill_f16kv_d256, 256, 8, HfKvF16, hf_u16, HF_NO_CAP, 0)
HF_PF_ENTRY(attention_prefill_q8kv_d128, 128, 16, HfKvQ8, signed char, HF_CAP_PARAM, cap)
HF_PF_ENTRY(attention_prefill_q8kv_d256, 256, 8, HfKvQ8, signed char, HF_CAP_PARAM, cap)
