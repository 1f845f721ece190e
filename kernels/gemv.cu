// gemv.cu — one templated GEMV for every weight format, plain (y = W x) and residual (y += W x).
//
// Structure follows ggml-cuda's mmvq (https://github.com/ggml-org/llama.cpp/blob/b4600/ggml/src/ggml-cuda/mmvq.cu
// and vecdotq.cuh): a per-format traits struct supplies the block geometry and a vector dot against an
// activation quantised to int8 per 32 elements (dp4a), and a single kernel template does the rest.
// Unlike mmvq, weights are staged through shared memory with loads as wide as the row alignment allows
// (16 bytes on every real shape), whatever the block size: blocks of 18/34/210 bytes straddle 16-byte
// boundaries, and host-mapped reads over PCIe only reach the link rate with large coalesced requests.
//
// Row-range contract: the kernel multiplies rows [0, nrows) of the matrix starting at W (row i at
// W + i*row_bytes) and writes y[i] for exactly those rows. The host launches a row range [a, b) by
// passing W + a*row_bytes, y + a and nrows = b - a.
//
// CUDA/HIP common subset: no cp.async, no inline PTX outside the HF_CUDA guards.
#include "blocks.cuh"

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC_RTC__)
#define HF_HIP 1
#define HF_DP4A(a, b, c) __builtin_amdgcn_sdot4((a), (b), (c), false)

#else
#define HF_CUDA 1
#define HF_DP4A(a, b, c) __dp4a((a), (b), (c))
#endif

#ifndef HF_WARPS
#define HF_WARPS 4 // warps per block; each warp owns HF_ROWS rows
#endif
#ifndef HF_ROWS
#define HF_ROWS 2 // rows per warp: the activation is loaded once per unit and reused for each row
#endif
#define HF_WARP 32

typedef unsigned int hf_u32;
typedef unsigned long long hf_u64;

__device__ __forceinline__ void hf_syncwarp() {
#ifdef HF_CUDA
    __syncwarp();
#else
    // AMD wavefronts execute in lock-step; a compiler barrier is enough for LDS ordering within one.
    __builtin_amdgcn_wave_barrier();
#endif
}

__device__ __forceinline__ float hf_warp_sum(float v) {
#pragma unroll
    for (int o = HF_WARP / 2; o > 0; o >>= 1) {
#ifdef HF_CUDA
        v += __shfl_xor_sync(0xffffffffu, v, o);
#else
        v += __shfl_xor(v, o);
#endif
    }
    return v;
}

__device__ __forceinline__ float hf_warp_max(float v) {
#pragma unroll
    for (int o = HF_WARP / 2; o > 0; o >>= 1) {
#ifdef HF_CUDA
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#else
        v = fmaxf(v, __shfl_xor(v, o));
#endif
    }
    return v;
}

__device__ __forceinline__ float hf_h2f(hf_u16 h) {
#ifdef HF_CUDA
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return (float)__builtin_bit_cast(_Float16, h);
#endif
}

__device__ __forceinline__ float hf_bf2f(hf_u16 h) { return __int_as_float(((hf_u32)h) << 16); }

__device__ __forceinline__ hf_u16 hf_ld16(const hf_u8* p) { return *(const hf_u16*)p; }
__device__ __forceinline__ float hf_ldf(const hf_u8* p) { return *(const float*)p; }
// N consecutive 32-bit words from a 2-byte aligned shared-memory pointer: N+1 aligned loads and a
// funnel shift (a shift of 0 when p is 4-byte aligned), instead of 2N 16-bit loads.
template <int N>
__device__ __forceinline__ void hf_ints_b2(const hf_u8* p, int (&out)[N]) {
    const hf_u64 addr = (hf_u64)p;
    const int* a = (const int*)(addr & ~(hf_u64)3);
    const unsigned sh = (unsigned)(addr & 2) * 8;
    int w[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) w[i] = a[i];
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = (int)__funnelshift_r((unsigned)w[i], (unsigned)w[i + 1], sh);
}
// i-th 32-bit word of a 4-byte aligned pointer.
__device__ __forceinline__ int hf_int_b4(const hf_u8* p, int i) { return ((const int*)p)[i]; }

// Activation arguments: the int8 form (quantised formats) and the f32 original (float formats).
struct XArgs {
    const signed char* qs; // k int8 values, HF_QX_BLOCK per block
    const float2* ds;      // per block of 32: (d, d * sum(qs))
    const float* xf;       // k floats
};

// 8 int8 activations x 4 = 32 elements of one activation block, plus its (d, s).
struct XBlock {
    int q[8];
    float d, s;
};
__device__ __forceinline__ void hf_load_xblock(XBlock& xb, const XArgs& xa, int xblock) {
    const int4* p = (const int4*)(xa.qs + (size_t)xblock * HF_QX_BLOCK);
    int4 a = p[0], b = p[1];
    xb.q[0] = a.x; xb.q[1] = a.y; xb.q[2] = a.z; xb.q[3] = a.w;
    xb.q[4] = b.x; xb.q[5] = b.y; xb.q[6] = b.z; xb.q[7] = b.w;
    float2 ds = xa.ds[xblock];
    xb.d = ds.x;
    xb.s = ds.y;
}

// ---------------------------------------------------------------------------------------------
// Format traits. BYTES/ELEMS: one block. CB: blocks per shared-memory tile (CB*BYTES is a multiple of
// 16 so every tile starts 16-byte aligned, and is ~1 KiB). UNITS: work units per block (one lane does
// one unit at a time). X: activation a unit needs (loaded once, reused for HF_ROWS rows).
// ---------------------------------------------------------------------------------------------

struct TQ8_0 {
    static constexpr bool QX = true;
    static constexpr int BYTES = 34, ELEMS = 32, CB = 32, UNITS = 1;
    typedef XBlock X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int) {
        hf_load_xblock(x, xa, gblock);
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        int q[8];
        hf_ints_b2<8>(blk + 2, q);
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) sum = HF_DP4A(q[i], x.q[i], sum);
        return d * x.d * (float)sum;
    }
};

struct TQ4_0 {
    static constexpr bool QX = true;
    static constexpr int BYTES = 18, ELEMS = 32, CB = 64, UNITS = 1;
    typedef XBlock X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int) {
        hf_load_xblock(x, xa, gblock);
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        int q[4];
        hf_ints_b2<4>(blk + 2, q);
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = q[i];
            sum = HF_DP4A(v & 0x0F0F0F0F, x.q[i], sum);
            sum = HF_DP4A((v >> 4) & 0x0F0F0F0F, x.q[i + 4], sum);
        }
        // sum((q-8) * dx * qx) = dx * sum(q*qx) - 8 * s
        return d * (x.d * (float)sum - 8.0f * x.s);
    }
};

struct TQ4_1 {
    static constexpr bool QX = true;
    static constexpr int BYTES = 20, ELEMS = 32, CB = 48, UNITS = 1;
    typedef XBlock X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int) {
        hf_load_xblock(x, xa, gblock);
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        const float m = hf_h2f(hf_ld16(blk + 2));
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = hf_int_b4(blk + 4, i);
            sum = HF_DP4A(v & 0x0F0F0F0F, x.q[i], sum);
            sum = HF_DP4A((v >> 4) & 0x0F0F0F0F, x.q[i + 4], sum);
        }
        return d * x.d * (float)sum + m * x.s;
    }
};

// Scales and mins of Q4_K sub-blocks 2g and 2g+1 from the 12 packed bytes (ggml get_scale_min_k4,
// computed for both halves without a branch: lanes of one warp take different g, and the two-path
// form of ggml's helper would run both paths one after the other).
__device__ __forceinline__ void hf_scale_min_k4_pair(int g, const hf_u8* q, int& sc0, int& m0, int& sc1, int& m1) {
    const int j0 = 2 * g, j1 = 2 * g + 1;
    // j < 4: sc = q[j] & 63, m = q[j+4] & 63
    // j >= 4: sc = (q[j+4] & 0xF) | ((q[j-4] >> 6) << 4), m = (q[j+4] >> 4) | ((q[j] >> 6) << 4)
    const bool lo = g < 2;
    const int a0 = q[j0], a1 = q[j1];
    const int b0 = q[j0 + 4 < 12 ? j0 + 4 : 0], b1 = q[j1 + 4 < 12 ? j1 + 4 : 0];
    const int c0 = q[j0 >= 4 ? j0 - 4 : 0], c1 = q[j1 >= 4 ? j1 - 4 : 0];
    sc0 = lo ? (a0 & 63) : ((b0 & 0xF) | ((c0 >> 6) << 4));
    m0 = lo ? (b0 & 63) : ((b0 >> 4) | ((a0 >> 6) << 4));
    sc1 = lo ? (a1 & 63) : ((b1 & 0xF) | ((c1 >> 6) << 4));
    m1 = lo ? (b1 & 63) : ((b1 >> 4) | ((a1 >> 6) << 4));
}

// Q4_K unit g (0..3): 64 elements, sub-blocks 2g (low nibbles of qs[32g..32g+32]) and 2g+1 (high).
struct TQ4K {
    static constexpr bool QX = true;
    static constexpr int BYTES = 144, ELEMS = 256, CB = 8, UNITS = 4;
    struct X { XBlock a, b; };
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int g) {
        hf_load_xblock(x.a, xa, gblock * 8 + 2 * g);
        hf_load_xblock(x.b, xa, gblock * 8 + 2 * g + 1);
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int g, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        const float dmin = hf_h2f(hf_ld16(blk + 2));
        int sc0, m0, sc1, m1;
        hf_scale_min_k4_pair(g, blk + HF_Q4K_SCALES, sc0, m0, sc1, m1);
        const int4* qp = (const int4*)(blk + HF_Q4K_QS + 32 * g);
        const int4 v0 = qp[0], v1 = qp[1];
        const int v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s0 = HF_DP4A(v[i] & 0x0F0F0F0F, x.a.q[i], s0);
            s1 = HF_DP4A((v[i] >> 4) & 0x0F0F0F0F, x.b.q[i], s1);
        }
        return d * ((float)sc0 * x.a.d * (float)s0 + (float)sc1 * x.b.d * (float)s1) -
               dmin * ((float)m0 * x.a.s + (float)m1 * x.b.s);
    }
};

// Q6_K unit u (0..3): half h = u>>1 (128 elements), is = u&1: the 16 positions l in [16is, 16is+16)
// of each of the half's four 32-element segments t (elements 128h + 32t + l), scale sc[8h + is + 2t].
struct TQ6K {
    static constexpr bool QX = true;
    static constexpr int BYTES = 210, ELEMS = 256, CB = 8, UNITS = 4;
    struct X { int q[4][4]; float d[4]; };
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int u) {
        const int h = u >> 1, is = u & 1;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int xb = gblock * 8 + 4 * h + t;
            const int4 p = *(const int4*)(xa.qs + (size_t)xb * HF_QX_BLOCK + 16 * is);
            x.q[t][0] = p.x; x.q[t][1] = p.y; x.q[t][2] = p.z; x.q[t][3] = p.w;
            x.d[t] = xa.ds[xb].x;
        }
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int u, const X& x) {
        const int h = u >> 1, is = u & 1;
        const hf_u8* ql = blk + 64 * h + 16 * is;
        const hf_u8* qh = blk + HF_Q6K_QH + 32 * h + 16 * is;
        const signed char* sc = (const signed char*)(blk + HF_Q6K_SC + 8 * h + is);
        const float d = hf_h2f(hf_ld16(blk + HF_Q6K_D));
        int dt[4] = {0, 0, 0, 0};
        int qa[4], qb[4], qhh[4];
        hf_ints_b2<4>(ql, qa);
        hf_ints_b2<4>(ql + 32, qb);
        hf_ints_b2<4>(qh, qhh);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int a = qa[i], b = qb[i], hh = qhh[i];
            const int q0 = (a & 0x0F0F0F0F) | ((hh << 4) & 0x30303030);
            const int q1 = (b & 0x0F0F0F0F) | ((hh << 2) & 0x30303030);
            const int q2 = ((a >> 4) & 0x0F0F0F0F) | (hh & 0x30303030);
            const int q3 = ((b >> 4) & 0x0F0F0F0F) | ((hh >> 2) & 0x30303030);
            // q - 32 in every byte at once: each byte is < 64, so q + 0x60 stays below 0x100 (no carry
            // between bytes) and flipping bit 7 turns the biased value into the signed q - 32.
            dt[0] = HF_DP4A((q0 + 0x60606060) ^ (int)0x80808080, x.q[0][i], dt[0]);
            dt[1] = HF_DP4A((q1 + 0x60606060) ^ (int)0x80808080, x.q[1][i], dt[1]);
            dt[2] = HF_DP4A((q2 + 0x60606060) ^ (int)0x80808080, x.q[2][i], dt[2]);
            dt[3] = HF_DP4A((q3 + 0x60606060) ^ (int)0x80808080, x.q[3][i], dt[3]);
        }
        float acc = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; ++t) acc += (float)sc[2 * t] * x.d[t] * (float)dt[t];
        return d * acc;
    }
};

// HFQ4G256 unit u (0..7): 32 elements, qs bytes [16u, 16u+16).
struct THfq4 {
    static constexpr bool QX = true;
    static constexpr int BYTES = 136, ELEMS = 256, CB = 8, UNITS = 8;
    typedef XBlock X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int u) {
        hf_load_xblock(x, xa, gblock * 8 + u);
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int u, const X& x) {
        const float scale = hf_ldf(blk), zero = hf_ldf(blk + 4);
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int w = hf_int_b4(blk + HF_HFQ_QS + 16 * u, i); // elements 8i..8i+7
            const int lo = w & 0x0F0F0F0F, hi = (w >> 4) & 0x0F0F0F0F;
            sum = HF_DP4A((int)__byte_perm(lo, hi, 0x5140), x.q[2 * i], sum);
            sum = HF_DP4A((int)__byte_perm(lo, hi, 0x7362), x.q[2 * i + 1], sum);
        }
        return scale * x.d * (float)sum + zero * x.s;
    }
};

// Float formats: a "block" is 8 elements (so k must be a multiple of 8; the host checks).
struct XF8 { float v[8]; };
__device__ __forceinline__ void hf_load_xf8(XF8& x, const XArgs& xa, int gblock) {
    const float4* p = (const float4*)(xa.xf + (size_t)gblock * 8);
    const float4 a = p[0], b = p[1];
    x.v[0] = a.x; x.v[1] = a.y; x.v[2] = a.z; x.v[3] = a.w;
    x.v[4] = b.x; x.v[5] = b.y; x.v[6] = b.z; x.v[7] = b.w;
}

struct TF32 {
    static constexpr bool QX = false;
    static constexpr int BYTES = 32, ELEMS = 8, CB = 32, UNITS = 1;
    typedef XF8 X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int) { hf_load_xf8(x, xa, gblock); }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const float4 a = ((const float4*)blk)[0], b = ((const float4*)blk)[1];
        float s = a.x * x.v[0];
        s = fmaf(a.y, x.v[1], s); s = fmaf(a.z, x.v[2], s); s = fmaf(a.w, x.v[3], s);
        s = fmaf(b.x, x.v[4], s); s = fmaf(b.y, x.v[5], s); s = fmaf(b.z, x.v[6], s); s = fmaf(b.w, x.v[7], s);
        return s;
    }
};

template <bool BF>
struct THalf {
    static constexpr bool QX = false;
    static constexpr int BYTES = 16, ELEMS = 8, CB = 64, UNITS = 1;
    typedef XF8 X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int) { hf_load_xf8(x, xa, gblock); }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const uint4 w = *(const uint4*)blk;
        const hf_u32 ws[4] = {w.x, w.y, w.z, w.w};
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const hf_u16 lo = (hf_u16)(ws[i] & 0xFFFF), hi = (hf_u16)(ws[i] >> 16);
            const float flo = BF ? hf_bf2f(lo) : hf_h2f(lo);
            const float fhi = BF ? hf_bf2f(hi) : hf_h2f(hi);
            s = fmaf(flo, x.v[2 * i], s);
            s = fmaf(fhi, x.v[2 * i + 1], s);
        }
        return s;
    }
};

// ---------------------------------------------------------------------------------------------
// The GEMV. A block of HF_WARPS warps owns HF_ROWS * HF_WARPS / HF_KSPLIT rows: each group of HF_KSPLIT
// warps shares HF_ROWS rows and splits their tiles round-robin (more independent loads per row when
// m is small), then the group's partial sums meet in shared memory. Per tile of CB blocks, every
// lane holds its share of the rows' bytes in registers as LoadT loads; the next tile's loads are
// issued before the current tile is computed (software pipelining), so each warp keeps two tiles of
// bytes in flight. Rows past nrows are clamped to the last row for loading (valid memory, no
// divergence) and never written. The summation order depends only on the compiled shape, never on
// the row range, so any row range is bit-identical to the same rows of a whole launch.
// ---------------------------------------------------------------------------------------------
#ifndef HF_KSPLIT
#define HF_KSPLIT 1
#endif
#ifndef HF_MINB
#define HF_MINB 1 // minimum resident blocks per SM requested from the register allocator
#endif
static_assert(HF_WARPS % HF_KSPLIT == 0, "HF_KSPLIT must divide HF_WARPS");

#define HF_TILE_PAD 16 // keeps each tile row 16-byte aligned

template <class T, typename LoadT, bool RESIDUAL>
__device__ __forceinline__ void hf_gemv(const hf_u8* __restrict__ W, hf_u64 row_bytes, XArgs xa,
                                        float* __restrict__ y, int nrows, int nblocks) {
    constexpr int TILE = T::CB * T::BYTES;
    static_assert(TILE % 16 == 0, "tile must keep 16-byte alignment");
    constexpr int MAXU = TILE / (int)sizeof(LoadT);
    constexpr int PER_LANE = (MAXU + HF_WARP - 1) / HF_WARP;
    constexpr int GROUPS = HF_WARPS / HF_KSPLIT;
    // +HF_TILE_PAD (quantised formats): hf_ints_b2 reads one aligned word past a block's last byte
    // (unused when the block is 4-byte aligned), which for the tile's last block lies past TILE.
    __shared__ __align__(16) hf_u8 smem[HF_WARPS][HF_ROWS][TILE + (T::QX ? HF_TILE_PAD : 0)];
    __shared__ float partial[HF_WARPS][HF_ROWS];

    const int warp = threadIdx.x / HF_WARP, lane = threadIdx.x % HF_WARP;
    const int group = warp / HF_KSPLIT, kpart = warp % HF_KSPLIT;
    const int row0 = (blockIdx.x * GROUPS + group) * HF_ROWS;
    const hf_u8* rowp[HF_ROWS];
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) rowp[r] = W + (hf_u64)min(row0 + r, nrows - 1) * row_bytes;

    float acc[HF_ROWS];
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) acc[r] = 0.0f;

    LoadT buf[HF_ROWS][PER_LANE];
    // Issues the loads of the tile starting at block b0 into buf (nunits LoadT words per row).
    auto issue = [&](int b0) {
        const int nunits = min(T::CB, nblocks - b0) * T::BYTES / (int)sizeof(LoadT); // exact: host alignment check
#pragma unroll
        for (int r = 0; r < HF_ROWS; ++r) {
            const LoadT* src = (const LoadT*)(rowp[r] + (hf_u64)b0 * T::BYTES);
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const int u = lane + HF_WARP * i;
                if (u < nunits) buf[r][i] = src[u];
            }
        }
    };
    const int step = T::CB * HF_KSPLIT;
    int b0 = kpart * T::CB;
    if (b0 < nblocks) issue(b0);
    // Work units of one tile per lane (compile-time, so the activation array stays in registers).
    constexpr int UPL = (T::CB * T::UNITS + HF_WARP - 1) / HF_WARP;
    for (; b0 < nblocks; b0 += step) {
        const int nb = min(T::CB, nblocks - b0);
        const int nunits = nb * T::BYTES / (int)sizeof(LoadT);
        const int work = nb * T::UNITS;
        if (T::QX) {
            // The activation for this tile's units is requested first, so its latency overlaps the
            // wait for the weight loads below (measured: exposed x latency cost up to 25 % of HBM rate).
            typename T::X xs[UPL];
#pragma unroll
            for (int i = 0; i < UPL; ++i) {
                const int u = lane + HF_WARP * i;
                if (u < work) {
#if defined(HF_DIAG_NOX) || defined(HF_DIAG_NODOT)
                    // Diagnostic builds only (benchmarks): the activation from registers, not memory.
#pragma unroll
                    for (int w = 0; w < (int)(sizeof(xs[i]) / 4); ++w) ((int*)&xs[i])[w] = 0x01010101 * (lane + w);
#else
                    T::load_x(xs[i], xa, b0 + u / T::UNITS, u % T::UNITS);
#endif
                }
            }
#pragma unroll
            for (int r = 0; r < HF_ROWS; ++r) {
                LoadT* dst = (LoadT*)smem[warp][r];
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) {
                    const int u = lane + HF_WARP * i;
                    if (u < nunits) dst[u] = buf[r][i];
                }
            }
            hf_syncwarp();
            if (b0 + step < nblocks) issue(b0 + step); // in flight while this tile is computed
#pragma unroll
            for (int i = 0; i < UPL; ++i) {
                const int u = lane + HF_WARP * i;
                if (u < work) {
                    const int bi = u / T::UNITS, sub = u % T::UNITS;
#pragma unroll
                    for (int r = 0; r < HF_ROWS; ++r) {
#if defined(HF_DIAG_NODOT)
                        // Diagnostic build only: the memory path without the arithmetic.
                        acc[r] += (float)smem[warp][r][bi * T::BYTES + sub] + (float)((const int*)&xs[i])[0];
#else
                        acc[r] += T::dot(smem[warp][r] + bi * T::BYTES, sub, xs[i]);
#endif
                    }
                }
            }
        } else {
            // Float formats: x is read where it is used, one unit at a time (their x is 32 B of
            // f32 per unit; holding it across the weight wait measured slower on the H200).
#pragma unroll
            for (int r = 0; r < HF_ROWS; ++r) {
                LoadT* dst = (LoadT*)smem[warp][r];
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) {
                    const int u = lane + HF_WARP * i;
                    if (u < nunits) dst[u] = buf[r][i];
                }
            }
            hf_syncwarp();
            if (b0 + step < nblocks) issue(b0 + step); // in flight while this tile is computed
            for (int u = lane; u < work; u += HF_WARP) {
                const int bi = u / T::UNITS, sub = u % T::UNITS;
                typename T::X x;
                T::load_x(x, xa, b0 + bi, sub);
#pragma unroll
                for (int r = 0; r < HF_ROWS; ++r) acc[r] += T::dot(smem[warp][r] + bi * T::BYTES, sub, x);
            }
        }
        hf_syncwarp();
    }
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) acc[r] = hf_warp_sum(acc[r]);
    if (HF_KSPLIT > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < HF_ROWS; ++r) partial[warp][r] = acc[r];
        }
        __syncthreads();
        if (kpart != 0) return;
#pragma unroll
        for (int r = 0; r < HF_ROWS; ++r) {
            float s = 0.0f;
#pragma unroll
            for (int p = 0; p < HF_KSPLIT; ++p) s += partial[warp + p][r];
            acc[r] = s;
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < HF_ROWS; ++r) {
            const int row = row0 + r;
            if (row < nrows) y[row] = RESIDUAL ? y[row] + acc[r] : acc[r];
        }
    }
}

// Exported entry points: gemv_<format>_<plain|residual>_v<load bytes>. nblocks = k / T::ELEMS.
#define HF_GEMV_ENTRY(NAME, T, LT, LW, FORM, RES)                                                     \
    extern "C" __global__ void __launch_bounds__(HF_WARPS * HF_WARP, HF_MINB)                          \
        gemv_##NAME##_##FORM##_v##LW(const hf_u8* __restrict__ W, hf_u64 row_bytes,                    \
                                     const signed char* qs, const float2* ds, const float* xf,         \
                                     float* __restrict__ y, int nrows, int nblocks) {                  \
        XArgs xa;                                                                                      \
        xa.qs = qs;                                                                                    \
        xa.ds = ds;                                                                                    \
        xa.xf = xf;                                                                                    \
        hf_gemv<T, LT, RES>(W, row_bytes, xa, y, nrows, nblocks);                                      \
    }
#define HF_GEMV_WIDTHS(NAME, T, FORM, RES)                                                            \
    HF_GEMV_ENTRY(NAME, T, uint4, 16, FORM, RES)                                                       \
    HF_GEMV_ENTRY(NAME, T, hf_u32, 4, FORM, RES)                                                       \
    HF_GEMV_ENTRY(NAME, T, hf_u16, 2, FORM, RES)
#define HF_GEMV_FORMAT(NAME, T)                                                                        \
    HF_GEMV_WIDTHS(NAME, T, plain, false)                                                              \
    HF_GEMV_WIDTHS(NAME, T, residual, true)

HF_GEMV_FORMAT(f32, TF32)
HF_GEMV_FORMAT(f16, THalf<false>)
HF_GEMV_FORMAT(bf16, THalf<true>)
HF_GEMV_FORMAT(q8_0, TQ8_0)
HF_GEMV_FORMAT(q4_0, TQ4_0)
HF_GEMV_FORMAT(q4_1, TQ4_1)
HF_GEMV_FORMAT(q4_k, TQ4K)
HF_GEMV_FORMAT(q6_k, TQ6K)
HF_GEMV_FORMAT(hfq4g256, THfq4)

// Prepare the activation: a copy of x for the float formats, and for the integer dots one warp per
// block of 32: d = max|x| / 127, q = round(x / d), s = d * sum(q) (ggml quantize_q8_1).
// Launch with k threads in total (k a multiple of 32).
extern "C" __global__ void __launch_bounds__(256)
    quantize_x_q8(const float* __restrict__ x, int k, signed char* __restrict__ qs, float2* __restrict__ ds,
                  float* __restrict__ xf) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x % HF_WARP;
    const float v = i < k ? x[i] : 0.0f;
    const float amax = hf_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float q = amax == 0.0f ? 0.0f : rintf(v / d);
    const float sum = hf_warp_sum(q);
    if (i < k) {
        qs[i] = (signed char)q;
        xf[i] = v;
    }
    if (lane == 0 && i < k) ds[i / HF_QX_BLOCK] = make_float2(d, d * sum);
}
