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

#include "f16.cuh"

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

// A 16-byte weight load of the device-resident kernels: weights are read once, so on CUDA they are
// loaded "streaming" (evict-first), which keeps the activation resident in L1/L2 around them.
__device__ __forceinline__ int4 hf_ldw16(const hf_u8* p) {
#ifdef HF_CUDA
    return __ldcs((const int4*)p);
#else
    return *(const int4*)p;
#endif
}

// Activation arguments: the int8 form (quantised formats) and the f32 original (float formats).
struct XArgs {
    const signed char* qs; // k int8 values, HF_QX_BLOCK per block
    const float2* ds;      // per block of 32: (d, d * sum(qs))
    const float* xf;       // k floats
};
__device__ __forceinline__ XArgs hf_xargs(const signed char* qs, const float2* ds, const float* xf) {
    XArgs xa;
    xa.qs = qs;
    xa.ds = ds;
    xa.xf = xf;
    return xa;
}

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

// The parts shared by the formats whose work unit is one 32-element activation block: unit u of
// weight block gblock multiplies activation block gblock * UNITS + u.
template <int UNITS_>
struct HfXBlockUnits {
    static constexpr bool QX = true;
    static constexpr int UNITS = UNITS_;
    typedef XBlock X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int u) {
        hf_load_xblock(x, xa, gblock * UNITS_ + u);
    }
};

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

// Bits 0..3 of v as bit 4 of bytes 0..3: the fifth bits of four 5-bit codes (Q5_0 / Q5_1), ready
// to OR onto their low nibbles (ggml vec_dot_q5_0_q8_1's shifts).
__device__ __forceinline__ int hf_bits_to_b4(hf_u32 v) {
    return (int)(((v << 4) & 0x10u) | ((v << 11) & 0x1000u) | ((v << 18) & 0x100000u) | ((v << 25) & 0x10000000u));
}

// Q5_0 / Q5_1 integer dot of one 32-element block: low nibbles of qs[j] with fifth bit j of qh are
// elements j, high nibbles with bit j+16 are elements j+16 (the Q4_0 nibble order of x.q).
__device__ __forceinline__ int hf_q5_dot(const int (&q)[4], hf_u32 qh, const XBlock& x) {
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int lo = (q[i] & 0x0F0F0F0F) | hf_bits_to_b4(qh >> (4 * i));
        const int hi = ((q[i] >> 4) & 0x0F0F0F0F) | hf_bits_to_b4(qh >> (4 * i + 16));
        sum = HF_DP4A(lo, x.q[i], sum);
        sum = HF_DP4A(hi, x.q[i + 4], sum);
    }
    return sum;
}

struct TQ5_0 : HfXBlockUnits<1> {
    static constexpr int BYTES = 22, ELEMS = 32, CB = 48; // 48 x 22 = 66 x 16 bytes
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        int qh[1], q[4];
        hf_ints_b2<1>(blk + HF_Q5_0_QH, qh);
        hf_ints_b2<4>(blk + HF_Q5_0_QS, q);
        const int sum = hf_q5_dot(q, (hf_u32)qh[0], x);
        // sum((q-16) * dx * qx) = dx * sum(q*qx) - 16 * s
        return d * (x.d * (float)sum - 16.0f * x.s);
    }
};

struct TQ5_1 : HfXBlockUnits<1> {
    static constexpr int BYTES = 24, ELEMS = 32, CB = 48; // 8-byte aligned blocks
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        const float m = hf_h2f(hf_ld16(blk + 2));
        int q[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = hf_int_b4(blk + HF_Q5_1_QS, i);
        const int sum = hf_q5_dot(q, (hf_u32)hf_int_b4(blk + HF_Q5_1_QH, 0), x);
        // The min term against the quantised activation's sum (ggml's q8_1 s), as Q4_1.
        return d * x.d * (float)sum + m * x.s;
    }
};

// Four 4-bit codes (one per byte, each 0..15) to their int8 grid values at once, from registers:
// __byte_perm picks grid[c & 7] out of words 0-1 and grid[8 + (c & 7)] out of words 2-3, and bit 3
// of each code chooses between the two.
__device__ __forceinline__ int hf_iq4nl_lookup(hf_u32 c) {
    const hf_u32 lo3 = c & 0x07070707u;
    const hf_u32 t = lo3 | (lo3 >> 4);                      // codes 0,1 in bits 0-7; codes 2,3 in bits 16-23
    const hf_u32 sel = (t & 0xFFu) | ((t >> 8) & 0xFF00u);   // selector nibble n = low 3 bits of code n
    const hf_u32 a = __byte_perm(HF_IQ4NL_W0, HF_IQ4NL_W1, sel);
    const hf_u32 b = __byte_perm(HF_IQ4NL_W2, HF_IQ4NL_W3, sel);
    const hf_u32 hi = ((c >> 3) & 0x01010101u) * 0xFFu; // 0xFF in the bytes whose code has bit 3
    return (int)(a ^ ((a ^ b) & hi));
}

// Integer dot of 32 IQ4 codes (16 bytes: low nibbles elements 0-15, high nibbles 16-31) with x.
__device__ __forceinline__ int hf_iq4_dot(const int (&q)[4], const XBlock& x) {
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        sum = HF_DP4A(hf_iq4nl_lookup((hf_u32)q[i] & 0x0F0F0F0Fu), x.q[i], sum);
        sum = HF_DP4A(hf_iq4nl_lookup(((hf_u32)q[i] >> 4) & 0x0F0F0F0Fu), x.q[i + 4], sum);
    }
    return sum;
}

struct TIq4Nl : HfXBlockUnits<1> {
    static constexpr int BYTES = 18, ELEMS = 32, CB = 64;
    static __device__ __forceinline__ float dot(const hf_u8* blk, int, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        int q[4];
        hf_ints_b2<4>(blk + 2, q);
        return d * x.d * (float)hf_iq4_dot(q, x);
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
        D w;
        unpack(w, blk, g);
        return dot_d(w, g, x);
    }
    // dot is unpack (the weight side: the scales as floats, the nibbles masked) then dot_d, so the
    // multi-column kernel, which unpacks once for all its columns, rounds exactly as dot.
    struct D { float d, dmin, sc0, m0, sc1, m1; int lo[8], hi[8]; };
    static __device__ __forceinline__ void unpack(D& w, const hf_u8* blk, int g) {
        w.d = hf_h2f(hf_ld16(blk));
        w.dmin = hf_h2f(hf_ld16(blk + 2));
        int sc0, m0, sc1, m1;
        hf_scale_min_k4_pair(g, blk + HF_Q4K_SCALES, sc0, m0, sc1, m1);
        w.sc0 = (float)sc0; w.m0 = (float)m0; w.sc1 = (float)sc1; w.m1 = (float)m1;
        const int4* qp = (const int4*)(blk + HF_Q4K_QS + 32 * g);
        nibbles(w, qp[0], qp[1]);
    }
    static __device__ __forceinline__ void nibbles(D& w, const int4 v0, const int4 v1) {
        const int v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            w.lo[i] = v[i] & 0x0F0F0F0F;
            w.hi[i] = (v[i] >> 4) & 0x0F0F0F0F;
        }
    }
    static __device__ __forceinline__ float dot_d(const D& w, int, const X& x) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s0 = HF_DP4A(w.lo[i], x.a.q[i], s0);
            s1 = HF_DP4A(w.hi[i], x.b.q[i], s1);
        }
        return w.d * (w.sc0 * x.a.d * (float)s0 + w.sc1 * x.b.d * (float)s1) -
               w.dmin * (w.m0 * x.a.s + w.m1 * x.b.s);
    }
    // The unit's dot from scales and nibbles already in registers (the device-resident kernel):
    // through dot_d, so it rounds exactly as dot (host-mapped and HBM results stay bit-equal).
    static __device__ __forceinline__ float combine(float d, float dmin, int sc0, int m0, int sc1, int m1,
                                                    const int4 v0, const int4 v1, const X& x) {
        D w;
        w.d = d; w.dmin = dmin;
        w.sc0 = (float)sc0; w.m0 = (float)m0; w.sc1 = (float)sc1; w.m1 = (float)m1;
        nibbles(w, v0, v1);
        return dot_d(w, 0, x);
    }

    // ---- device-resident kernel (hf_gemv_dev_direct): weights straight from global into registers ----
    // One unit's bytes: the 16-byte head (d, dmin, 12 scale bytes) and the unit's 32 bytes of nibbles.
    // Every block is 144 = 9 x 16 bytes, so with a 16-byte aligned row all three loads are aligned.
    struct WR { int4 h, a, b; };
    static __device__ __forceinline__ void load_w(WR& w, const hf_u8* blk, int g) {
        w.h = hf_ldw16(blk);
        w.a = hf_ldw16(blk + HF_Q4K_QS + 32 * g);
        w.b = hf_ldw16(blk + HF_Q4K_QS + 32 * g + 16);
    }
    static __device__ __forceinline__ float dot_w(const WR& w, int g, const X& x) {
        const hf_u32 dd = (hf_u32)w.h.x;
        const float d = hf_h2f((hf_u16)(dd & 0xFFFFu));
        const float dmin = hf_h2f((hf_u16)(dd >> 16));
        // Scale bytes jj = 2(g&1) and jj+1 of the three scale words: q[jj], q[jj+4], q[jj+8]
        // (hf_scale_min_k4_pair with the bytes taken from registers instead of memory).
        const unsigned sh = 16u * (unsigned)(g & 1);
        const int a = (int)(((hf_u32)w.h.y >> sh) & 0xFFFFu);
        const int b = (int)(((hf_u32)w.h.z >> sh) & 0xFFFFu);
        const int c = (int)(((hf_u32)w.h.w >> sh) & 0xFFFFu);
        const bool lo = g < 2;
        const int sc0 = lo ? (a & 63) : ((c & 0xF) | (((a >> 6) & 3) << 4));
        const int m0 = lo ? (b & 63) : (((c >> 4) & 0xF) | (((b >> 6) & 3) << 4));
        const int sc1 = lo ? ((a >> 8) & 63) : (((c >> 8) & 0xF) | (((a >> 14) & 3) << 4));
        const int m1 = lo ? ((b >> 8) & 63) : (((c >> 12) & 0xF) | (((b >> 14) & 3) << 4));
        return combine(d, dmin, sc0, m0, sc1, m1, w.a, w.b, x);
    }
    // The unit's activation from the block's shared-memory copy (hf_stage_x): 16-byte units 4 at once,
    // placed by swz so that the 8 lanes of each quarter-warp hit distinct banks.
    static __device__ __forceinline__ int swz(int c) { return c ^ ((c >> 3) & 3); }
    static __device__ __forceinline__ void load_xs(X& x, const int4* xq, const float2* xd, int gblock, int g) {
        const int c = gblock * 16 + 4 * g; // xblock 8*gblock + 2g starts at byte 32 * that = 16 * c
        const int4 q0 = xq[swz(c)], q1 = xq[swz(c + 1)], q2 = xq[swz(c + 2)], q3 = xq[swz(c + 3)];
        x.a.q[0] = q0.x; x.a.q[1] = q0.y; x.a.q[2] = q0.z; x.a.q[3] = q0.w;
        x.a.q[4] = q1.x; x.a.q[5] = q1.y; x.a.q[6] = q1.z; x.a.q[7] = q1.w;
        x.b.q[0] = q2.x; x.b.q[1] = q2.y; x.b.q[2] = q2.z; x.b.q[3] = q2.w;
        x.b.q[4] = q3.x; x.b.q[5] = q3.y; x.b.q[6] = q3.z; x.b.q[7] = q3.w;
        const float4 ds = *(const float4*)(xd + gblock * 8 + 2 * g);
        x.a.d = ds.x;
        x.a.s = ds.y;
        x.b.d = ds.z;
        x.b.s = ds.w;
    }
};

// Q5_K unit g (0..3): Q4_K's unit g (same scales, same nibbles at HF_Q5K_QS) with the fifth bits:
// bit 2g of qh[l] for element l of sub-block 2g, bit 2g+1 for element l of sub-block 2g+1.
struct TQ5K {
    static constexpr bool QX = true;
    static constexpr int BYTES = 176, ELEMS = 256, CB = 8, UNITS = 4; // 176 = 11 x 16: aligned blocks
    typedef TQ4K::X X;
    static __device__ __forceinline__ void load_x(X& x, const XArgs& xa, int gblock, int g) {
        TQ4K::load_x(x, xa, gblock, g);
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int g, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        const float dmin = hf_h2f(hf_ld16(blk + 2));
        int sc0, m0, sc1, m1;
        hf_scale_min_k4_pair(g, blk + HF_Q4K_SCALES, sc0, m0, sc1, m1);
        const int4* qp = (const int4*)(blk + HF_Q5K_QS + 32 * g);
        const int4* hp = (const int4*)(blk + HF_Q5K_QH);
        const int4 v0 = qp[0], v1 = qp[1], h0 = hp[0], h1 = hp[1];
        const int v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const int h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const unsigned sa = 2u * (unsigned)g, sb = sa + 1u;
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const hf_u32 hh = (hf_u32)h[i];
            const int lo = (v[i] & 0x0F0F0F0F) | (int)(((hh >> sa) & 0x01010101u) << 4);
            const int hi = ((v[i] >> 4) & 0x0F0F0F0F) | (int)(((hh >> sb) & 0x01010101u) << 4);
            s0 = HF_DP4A(lo, x.a.q[i], s0);
            s1 = HF_DP4A(hi, x.b.q[i], s1);
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
        D w;
        unpack(w, blk, u);
        return dot_d(w, u, x);
    }
    // dot is unpack (the weight side: the 6-bit quants as signed bytes, the scales as floats) then
    // dot_d, so the multi-column kernel, which unpacks once for all its columns, rounds as dot.
    struct D { float d, sc[4]; int q[4][4]; };
    static __device__ __forceinline__ void unpack(D& w, const hf_u8* blk, int u) {
        const int h = u >> 1, is = u & 1;
        const hf_u8* ql = blk + 64 * h + 16 * is;
        const hf_u8* qh = blk + HF_Q6K_QH + 32 * h + 16 * is;
        const signed char* sc = (const signed char*)(blk + HF_Q6K_SC + 8 * h + is);
        w.d = hf_h2f(hf_ld16(blk + HF_Q6K_D));
#pragma unroll
        for (int t = 0; t < 4; ++t) w.sc[t] = (float)sc[2 * t];
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
            w.q[0][i] = (q0 + 0x60606060) ^ (int)0x80808080; // as dot: q - 32 in every byte
            w.q[1][i] = (q1 + 0x60606060) ^ (int)0x80808080;
            w.q[2][i] = (q2 + 0x60606060) ^ (int)0x80808080;
            w.q[3][i] = (q3 + 0x60606060) ^ (int)0x80808080;
        }
    }
    static __device__ __forceinline__ float dot_d(const D& w, int, const X& x) {
        int dt[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int t = 0; t < 4; ++t) dt[t] = HF_DP4A(w.q[t][i], x.q[t][i], dt[t]);
        }
        float acc = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; ++t) acc += w.sc[t] * x.d[t] * (float)dt[t];
        return w.d * acc;
    }
    // Device-resident kernel (hf_gemv_dev_tiled): the unit's activation from the block's shared copy.
    // Lane L reads 16-byte unit 16b + 8h + 2t + is; swz spreads a quarter-warp over distinct banks.
    static __device__ __forceinline__ int swz(int c) { return c ^ (((c >> 3) & 3) << 1); }
    static __device__ __forceinline__ void load_xs(X& x, const int4* xq, const float2* xd, int gblock, int u) {
        const int h = u >> 1, is = u & 1;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int4 p = xq[swz(2 * (gblock * 8 + 4 * h + t) + is)];
            x.q[t][0] = p.x; x.q[t][1] = p.y; x.q[t][2] = p.z; x.q[t][3] = p.w;
        }
        // (d, s) of the four xblocks as two 16-byte reads (conflict-free; lanes of one half share them).
        const float4 d01 = *(const float4*)(xd + gblock * 8 + 4 * h);
        const float4 d23 = *(const float4*)(xd + gblock * 8 + 4 * h + 2);
        x.d[0] = d01.x;
        x.d[1] = d01.z;
        x.d[2] = d23.x;
        x.d[3] = d23.z;
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

// IQ4_XS unit u (0..7): sub-block u, 32 elements: qs bytes [16u, 16u+16) as IQ4_NL's nibbles, scale
// d * (ls - 32) with ls = 4 bits of scales_l[u/2] and 2 bits of scales_h.
struct TIq4Xs : HfXBlockUnits<8> {
    static constexpr int BYTES = 136, ELEMS = 256, CB = 8; // 8-byte aligned blocks
    static __device__ __forceinline__ float dot(const hf_u8* blk, int u, const X& x) {
        const float d = hf_h2f(hf_ld16(blk));
        const int sh = hf_ld16(blk + 2);
        const int sl = blk[HF_IQ4XS_SL + (u >> 1)];
        const int ls = ((sl >> (4 * (u & 1))) & 0xF) | (((sh >> (2 * u)) & 3) << 4);
        int q[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = hf_int_b4(blk + HF_IQ4XS_QS + 16 * u, i);
        return d * (float)(ls - HF_IQ4XS_SCALE_OFFSET) * x.d * (float)hf_iq4_dot(q, x);
    }
};

// Q3_K unit t (0..7): elements 128n + 32j + l, l in [0, 32), with n = t/4, j = t%4 (one activation
// block): 2 bits at 2j of qs[32n + l], the third bit t of hmask[l]; scales 2t (l < 16) and 2t+1.
struct TQ3K : HfXBlockUnits<8> {
    static constexpr int BYTES = 110, ELEMS = 256, CB = 8; // 8 x 110 = 55 x 16 bytes
    // 6-bit scale s (0..15): low 4 bits from the nibbles of bytes 0-7, high 2 bits from bytes 8-11
    // (ggml dequantize_row_q3_K's kmask unpacking, one scale at a time).
    static __device__ __forceinline__ int scale(const hf_u8* sc, int s) {
        const int lo = (sc[s & 7] >> (4 * (s >> 3))) & 0xF;
        const int hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
        return (lo | (hi << 4)) - HF_Q3K_SCALE_OFFSET;
    }
    static __device__ __forceinline__ float dot(const hf_u8* blk, int t, const X& x) {
        const int n = t >> 2, j = t & 3;
        const float d = hf_h2f(hf_ld16(blk + HF_Q3K_D));
        int q[8], hm[8];
        hf_ints_b2<8>(blk + HF_Q3K_QS + 32 * n, q);
        hf_ints_b2<8>(blk, hm);
        int s[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const hf_u32 v = (((hf_u32)q[i] >> (2 * j)) & 0x03030303u) | ((((hf_u32)hm[i] >> t) & 0x01010101u) << 2);
            // v - 4 in every byte at once (v <= 7: v + 0x7C stays below 0x100, and flipping bit 7
            // turns the biased value into the signed v - 4), as Q6_K's q - 32.
            s[i >> 2] = HF_DP4A((int)((v + 0x7C7C7C7Cu) ^ 0x80808080u), x.q[i], s[i >> 2]);
        }
        const hf_u8* sc = blk + HF_Q3K_SC;
        return d * x.d * (float)(scale(sc, 2 * t) * s[0] + scale(sc, 2 * t + 1) * s[1]);
    }
};

// Q2_K unit t (0..7): the elements of Q3_K's unit t (2 bits at 2j of qs[32n + l]), scale/min bytes
// 2t (l < 16) and 2t+1. The min term is taken against the quantised activation's sum per 16
// elements (ggml vec_dot_q2_K_q8_1), so its rounding cancels against the dot term's.
struct TQ2K : HfXBlockUnits<8> {
    static constexpr int BYTES = 84, ELEMS = 256, CB = 8; // 4-byte aligned blocks
    static __device__ __forceinline__ float dot(const hf_u8* blk, int t, const X& x) {
        const int n = t >> 2, j = t & 3;
        const float d = hf_h2f(hf_ld16(blk + HF_Q2K_D));
        const float dmin = hf_h2f(hf_ld16(blk + HF_Q2K_D + 2));
        int s[2] = {0, 0}, sx[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int v = (int)(((hf_u32)hf_int_b4(blk + HF_Q2K_QS + 32 * n, i) >> (2 * j)) & 0x03030303u);
            s[i >> 2] = HF_DP4A(v, x.q[i], s[i >> 2]);
            sx[i >> 2] = HF_DP4A(0x01010101, x.q[i], sx[i >> 2]);
        }
        const int c0 = blk[2 * t], c1 = blk[2 * t + 1];
        return x.d * (d * (float)((c0 & 0xF) * s[0] + (c1 & 0xF) * s[1]) -
                      dmin * (float)((c0 >> 4) * sx[0] + (c1 >> 4) * sx[1]));
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

// A warp's place in the block: its group of HF_KSPLIT warps owns HF_ROWS rows from row0 and the
// warp takes the group's tiles kpart, kpart + HF_KSPLIT, ...; the rows' pointers are clamped to the
// last row (valid memory, no divergence; rows past nrows are never written). rblock is the block's
// index among the row blocks (blockIdx.x, except where the grid also spans expert pairs).
struct HfGroup {
    int warp, lane, kpart, row0;
    const hf_u8* rowp[HF_ROWS];
};
__device__ __forceinline__ HfGroup hf_group(const hf_u8* W, hf_u64 row_bytes, int nrows, int rblock) {
    constexpr int GROUPS = HF_WARPS / HF_KSPLIT;
    HfGroup g;
    g.warp = threadIdx.x / HF_WARP;
    g.lane = threadIdx.x % HF_WARP;
    g.kpart = g.warp % HF_KSPLIT;
    g.row0 = (rblock * GROUPS + g.warp / HF_KSPLIT) * HF_ROWS;
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) g.rowp[r] = W + (hf_u64)min(g.row0 + r, nrows - 1) * row_bytes;
    return g;
}

// Issues the loads of the tile starting at block b0 into buf: nunits LoadT words per row, lane L
// taking words L, L + 32, ... (nunits is exact: the host checks that LoadT divides base and stride).
template <class T, typename LoadT, int PER_LANE>
__device__ __forceinline__ void hf_issue_tile(LoadT (&buf)[HF_ROWS][PER_LANE], const hf_u8* const (&rowp)[HF_ROWS],
                                              int b0, int nblocks, int lane) {
    const int nunits = min(T::CB, nblocks - b0) * T::BYTES / (int)sizeof(LoadT);
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) {
        const LoadT* src = (const LoadT*)(rowp[r] + (hf_u64)b0 * T::BYTES);
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const int u = lane + HF_WARP * i;
            if (u < nunits) buf[r][i] = src[u];
        }
    }
}

// Stores the tile hf_issue_tile loaded (nunits LoadT words per row) into the warp's shared rows.
template <typename LoadT, int PER_LANE, int STRIDE>
__device__ __forceinline__ void hf_store_tile(hf_u8 (&rows)[HF_ROWS][STRIDE], const LoadT (&buf)[HF_ROWS][PER_LANE],
                                              int nunits, int lane) {
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) {
        LoadT* dst = (LoadT*)rows[r];
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const int u = lane + HF_WARP * i;
            if (u < nunits) dst[u] = buf[r][i];
        }
    }
}

template <class T, typename LoadT, bool RESIDUAL>
__device__ __forceinline__ void hf_gemv(const hf_u8* __restrict__ W, hf_u64 row_bytes, XArgs xa,
                                        float* __restrict__ y, int nrows, int nblocks, int rblock) {
    constexpr int TILE = T::CB * T::BYTES;
    static_assert(TILE % 16 == 0, "tile must keep 16-byte alignment");
    constexpr int MAXU = TILE / (int)sizeof(LoadT);
    constexpr int PER_LANE = (MAXU + HF_WARP - 1) / HF_WARP;
    // +HF_TILE_PAD (quantised formats): hf_ints_b2 reads one aligned word past a block's last byte
    // (unused when the block is 4-byte aligned), which for the tile's last block lies past TILE.
    __shared__ __align__(16) hf_u8 smem[HF_WARPS][HF_ROWS][TILE + (T::QX ? HF_TILE_PAD : 0)];
    __shared__ float partial[HF_WARPS][HF_ROWS];

    const HfGroup gr = hf_group(W, row_bytes, nrows, rblock);
    const int warp = gr.warp, lane = gr.lane, kpart = gr.kpart, row0 = gr.row0;
    const hf_u8* const(&rowp)[HF_ROWS] = gr.rowp;

    float acc[HF_ROWS];
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) acc[r] = 0.0f;

    LoadT buf[HF_ROWS][PER_LANE];
    auto issue = [&](int b0) { hf_issue_tile<T>(buf, rowp, b0, nblocks, lane); };
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
            hf_store_tile(smem[warp], buf, nunits, lane);
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
            hf_store_tile(smem[warp], buf, nunits, lane);
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
#define HF_GEMV_ENTRY(NAME, T, LT, LW, FORM, RES)                                                       \
    extern "C" __global__ void __launch_bounds__(HF_WARPS * HF_WARP, HF_MINB)                           \
        gemv_##NAME##_##FORM##_v##LW(const hf_u8* __restrict__ W, hf_u64 row_bytes,                     \
                                     const signed char* qs, const float2* ds, const float* xf,          \
                                     float* __restrict__ y, int nrows, int nblocks) {                   \
        hf_gemv<T, LT, RES>(W, row_bytes, hf_xargs(qs, ds, xf), y, nrows, nblocks, blockIdx.x);         \
    }
// The 3 load widths x 2 forms of one format, each an ENTRY(NAME, T, LoadT, width, form, residual).
#define HF_GEMV_INSTANCES(ENTRY, NAME, T)                                                               \
    ENTRY(NAME, T, uint4, 16, plain, false)                                                             \
    ENTRY(NAME, T, hf_u32, 4, plain, false)                                                             \
    ENTRY(NAME, T, hf_u16, 2, plain, false)                                                             \
    ENTRY(NAME, T, uint4, 16, residual, true)                                                           \
    ENTRY(NAME, T, hf_u32, 4, residual, true)                                                           \
    ENTRY(NAME, T, hf_u16, 2, residual, true)
// Every format with a GPU kernel, as X(name, traits) (Format::has_gpu_kernel on the host).
#define HF_GEMV_FORMATS(X)                                                                              \
    X(f32, TF32)                                                                                        \
    X(f16, THalf<false>)                                                                                \
    X(bf16, THalf<true>)                                                                                \
    X(q8_0, TQ8_0)                                                                                      \
    X(q4_0, TQ4_0)                                                                                      \
    X(q4_1, TQ4_1)                                                                                      \
    X(q4_k, TQ4K)                                                                                       \
    X(q6_k, TQ6K)                                                                                       \
    X(hfq4g256, THfq4)                                                                                  \
    X(q5_0, TQ5_0)                                                                                      \
    X(q5_1, TQ5_1)                                                                                      \
    X(q5_k, TQ5K)                                                                                       \
    X(iq4_nl, TIq4Nl)                                                                                   \
    X(iq4_xs, TIq4Xs)                                                                                   \
    X(q3_k, TQ3K)                                                                                       \
    X(q2_k, TQ2K)
#define HF_GEMV_FORMAT(NAME, T) HF_GEMV_INSTANCES(HF_GEMV_ENTRY, NAME, T)
HF_GEMV_FORMATS(HF_GEMV_FORMAT)

// ---------------------------------------------------------------------------------------------
// GEMV with expert ids (the routed experts of a MoE layer; ggml-cuda's mul_mat_vec_q with ids,
// https://github.com/ggml-org/llama.cpp/blob/b4600/ggml/src/ggml-cuda/mmvq.cu): the 1-D grid spans
// row blocks x pairs (the launch API is 1-D): block b handles row block b % rblocks of the (token
// row, slot) pair pair0 + b / rblocks = row * n_used + slot. Its weight is the expert
// experts[ids[pair]] (a table of base addresses, each in device or host-mapped memory: the kernel
// reads either), its activation column is the row's (col_per_pair 0: the gate and up projections of
// the token's normalised input) or the pair's own (col_per_pair 1: the down projection of the pair's
// activated hidden), and its output is y + pair * ldy. Everything else is hf_gemv's, so each pair's
// rows are bit-identical to a plain launch of that expert's matrix on that column. An id outside
// [0, n_experts) is clamped (the routing kernel never writes one; the clamp keeps every read inside
// the table).
// ---------------------------------------------------------------------------------------------
#define HF_GEMV_IDS_ENTRY(NAME, T, LT, LW, FORM, RES)                                                   \
    extern "C" __global__ void __launch_bounds__(HF_WARPS * HF_WARP, HF_MINB)                           \
        gemv_##NAME##_##FORM##_v##LW##_ids(const hf_u64* __restrict__ experts, int n_experts,          \
                                           const int* __restrict__ ids, int n_used, int col_per_pair,  \
                                           int pair0, int rblocks, hf_u64 row_bytes,                   \
                                           const signed char* qs, const float2* ds, const float* xf,   \
                                           hf_u64 xstride, float* __restrict__ y, hf_u64 ldy,          \
                                           int nrows, int nblocks) {                                   \
        const int pair = pair0 + (int)(blockIdx.x / rblocks);                                           \
        const int id = ids[pair];                                                                       \
        const int e = id < 0 ? 0 : (id >= n_experts ? n_experts - 1 : id); /* g++ host harness: no min */ \
        const hf_u64 col = col_per_pair ? (hf_u64)pair : (hf_u64)(pair / n_used);                       \
        const hf_u64 xo = col * xstride;                                                                \
        hf_gemv<T, LT, RES>((const hf_u8*)experts[e], row_bytes,                                        \
                            hf_xargs(qs + xo, ds + xo / HF_QX_BLOCK, xf + xo), y + (hf_u64)pair * ldy,  \
                            nrows, nblocks, (int)(blockIdx.x % rblocks));                               \
    }
// The 3 load widths of the plain form (the experts' outputs are summed by moe.cu, never added in
// place).
#define HF_GEMV_IDS_FORMAT(NAME, T)                                                                     \
    HF_GEMV_IDS_ENTRY(NAME, T, uint4, 16, plain, false)                                                 \
    HF_GEMV_IDS_ENTRY(NAME, T, hf_u32, 4, plain, false)                                                 \
    HF_GEMV_IDS_ENTRY(NAME, T, hf_u16, 2, plain, false)
HF_GEMV_FORMATS(HF_GEMV_IDS_FORMAT)

// ---------------------------------------------------------------------------------------------
// Multi-column GEMV (batched decode): y_c = W x_c (or y_c += W x_c) for ncols <= HF_MAX_COLS
// activation columns at once, so each weight tile crosses the bus ONCE for all columns (host-mapped
// weights are read over PCIe; a per-column launch would read them ncols times).
//
// Everything about the weights is hf_gemv's: the same groups, k-split, LoadT tiles staged through
// the warp's shared rows, one tile in flight while the previous is computed. Per unit, each column's
// activation is loaded and dotted against the HF_ROWS staged rows. Column c of the activation is at
// qs/xf + c * xstride elements and ds + c * xstride / 32 pairs (quantize_x_q8 over ncols * k values
// writes exactly that: k is a multiple of 32); y_c is y + c * ldy.
//
// Bit-equality with hf_gemv: for every (row, column) lane L sums the same units (u = L, L + 32, ...
// of each tile, tiles in the same order) with the same dot code into its own accumulator, and the
// warp sum and the k-split reduction are the same, so each column is bit-identical to hf_gemv on that
// column alone (and so to the device-resident kernel, which is bit-identical to hf_gemv).
// (tests/gemv_host.rs checks it on the host for every format, tests/gpu_gemv.rs on the device.)
//
// Registers: acc holds HF_ROWS x HF_MAX_COLS floats. Unlike hf_gemv, the quantised formats do not
// request the unit's activation before the weight wait (xs[UPL] held across it): that would hold
// HF_MAX_COLS activations of up to 20 registers each. Each column's x is loaded inside the column
// loop, one column ahead of its dots (two activations live), and the weight tile's latency is
// covered by the tile in flight.
// ---------------------------------------------------------------------------------------------
#ifndef HF_MAX_COLS
#define HF_MAX_COLS 8 // the host passes GEMV_MAX_COLS; this default serves standalone compiles
#endif

// Rotates each row's column accumulators down by one: after c rotations acc[r][0] holds column c's,
// after HF_MAX_COLS rotations every column is back in place. The column loop stays rolled (one copy
// of the dot code instead of HF_MAX_COLS; NVRTC for sm_90, the whole module, on the shared 2-core
// CI box, 2026-12-01: 17 s without the multi-column kernels, 46 s with them, 79 s with the column
// loop unrolled) while the accumulators stay in registers (a rolled loop indexing acc[r][c] would
// put them in local memory); the price is HF_ROWS * HF_MAX_COLS moves per column, and the weight
// side of each dot (scales, nibble unpacking) is redone per column instead of shared. Formats that
// split their dot (HfColsUnit<T, true>) unroll their column loop instead.
__device__ __forceinline__ void hf_rotate_cols(float (&acc)[HF_ROWS][HF_MAX_COLS]) {
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) {
        const float first = acc[r][0];
#pragma unroll
        for (int c = 0; c + 1 < HF_MAX_COLS; ++c) acc[r][c] = acc[r][c + 1];
        acc[r][HF_MAX_COLS - 1] = first;
    }
}

// The activation arguments of column c.
__device__ __forceinline__ XArgs hf_xcol(const XArgs& xa, hf_u64 xstride, int c) {
    XArgs o;
    o.qs = xa.qs + (hf_u64)c * xstride;
    o.ds = xa.ds + (hf_u64)c * (xstride / HF_QX_BLOCK);
    o.xf = xa.xf + (hf_u64)c * xstride;
    return o;
}

// The end of both multi-column kernels: each (row, column) accumulator summed over the warp, then
// over the k-split group through `partial`, and stored (added in the residual form) by lane 0.
template <bool RESIDUAL>
__device__ __forceinline__ void hf_cols_finish(float (&acc)[HF_ROWS][HF_MAX_COLS],
                                               float (&partial)[HF_WARPS][HF_ROWS][HF_MAX_COLS], const HfGroup& gr,
                                               float* __restrict__ y, hf_u64 ldy, int nrows, int ncols) {
    const int warp = gr.warp, lane = gr.lane, kpart = gr.kpart, row0 = gr.row0;
#pragma unroll
    for (int c = 0; c < HF_MAX_COLS; ++c) {
        if (c < ncols) { // ncols is uniform: every lane takes part in the shuffles
#pragma unroll
            for (int r = 0; r < HF_ROWS; ++r) acc[r][c] = hf_warp_sum(acc[r][c]);
        }
    }
    if (HF_KSPLIT > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < HF_ROWS; ++r) {
#pragma unroll
                for (int c = 0; c < HF_MAX_COLS; ++c) partial[warp][r][c] = acc[r][c];
            }
        }
        __syncthreads();
        if (kpart != 0) return;
#pragma unroll
        for (int r = 0; r < HF_ROWS; ++r) {
#pragma unroll
            for (int c = 0; c < HF_MAX_COLS; ++c) {
                float s = 0.0f;
#pragma unroll
                for (int p = 0; p < HF_KSPLIT; ++p) s += partial[warp + p][r][c];
                acc[r][c] = s;
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int c = 0; c < HF_MAX_COLS; ++c) {
            float* yc = y + (hf_u64)c * ldy;
#pragma unroll
            for (int r = 0; r < HF_ROWS; ++r) {
                const int row = row0 + r;
                if (c < ncols && row < nrows) yc[row] = RESIDUAL ? yc[row] + acc[r][c] : acc[r][c];
            }
        }
    }
}

// Whether format traits T split their dot into a weight side and an activation side (T::D,
// T::unpack, T::dot_d): those formats take hf_gemv_cols_shared.
template <class T>
struct hf_has_unpack {
    template <class U>
    static __device__ char probe(typename U::D*);
    template <class U>
    static __device__ long probe(...);
    static constexpr bool value = sizeof(probe<T>(nullptr)) == 1;
};

// One unit (sub) of block gblock of every row (blk[r]: the row's block in shared memory) dotted
// with the first ncols columns into acc. The general form redoes the weight side of each dot per
// column and keeps the column loop rolled, rotating the accumulators (hf_rotate_cols).
template <class T, bool SHARED = hf_has_unpack<T>::value>
struct HfColsUnit {
    static __device__ __forceinline__ void run(float (&acc)[HF_ROWS][HF_MAX_COLS], const hf_u8* const (&blk)[HF_ROWS],
                                               const XArgs& xa, hf_u64 xstride, int gblock, int sub, int ncols) {
        typename T::X xc, xn;
        T::load_x(xc, xa, gblock, sub); // column 0 (ncols >= 1)
#pragma unroll 1
        for (int c = 0; c < HF_MAX_COLS; ++c) {
            if (c < ncols) {
                if (c + 1 < ncols) T::load_x(xn, hf_xcol(xa, xstride, c + 1), gblock, sub);
#pragma unroll
                for (int r = 0; r < HF_ROWS; ++r) acc[r][0] += T::dot(blk[r], sub, xc);
                xc = xn;
            }
            hf_rotate_cols(acc);
        }
    }
};
// Formats that split their dot (T::D, T::unpack, T::dot_d: Q4_K, Q6_K): each row's scales and
// quants are unpacked once and dotted with every column, the column loop unrolled so the
// accumulators stay in registers unrotated. acc[r][c] gets the same dot values in the same order
// as the general form (dot_d rounds as dot), so the columns stay bit-identical to hf_gemv. Measured
// on the H200 (2026-12-01 record serve-gpu-h200): the general form ran 8 resident columns at 509
// tok/s against 284 for one, re-decoding each weight block per column.
template <class T>
struct HfColsUnit<T, true> {
    static __device__ __forceinline__ void run(float (&acc)[HF_ROWS][HF_MAX_COLS], const hf_u8* const (&blk)[HF_ROWS],
                                               const XArgs& xa, hf_u64 xstride, int gblock, int sub, int ncols) {
        typename T::D w[HF_ROWS];
#pragma unroll
        for (int r = 0; r < HF_ROWS; ++r) T::unpack(w[r], blk[r], sub);
#pragma unroll
        for (int c = 0; c < HF_MAX_COLS; ++c) {
            if (c < ncols) {
                typename T::X x;
                T::load_x(x, hf_xcol(xa, xstride, c), gblock, sub);
#pragma unroll
                for (int r = 0; r < HF_ROWS; ++r) acc[r][c] += T::dot_d(w[r], sub, x);
            }
        }
    }
};

template <class T, typename LoadT, bool RESIDUAL>
__device__ __forceinline__ void hf_gemv_cols(const hf_u8* __restrict__ W, hf_u64 row_bytes, XArgs xa,
                                             hf_u64 xstride, float* __restrict__ y, hf_u64 ldy, int nrows,
                                             int nblocks, int ncols) {
    constexpr int TILE = T::CB * T::BYTES;
    static_assert(TILE % 16 == 0, "tile must keep 16-byte alignment");
    constexpr int PER_LANE = (TILE / (int)sizeof(LoadT) + HF_WARP - 1) / HF_WARP;
    constexpr int UPL = (T::CB * T::UNITS + HF_WARP - 1) / HF_WARP; // units of one tile per lane
    __shared__ __align__(16) hf_u8 smem[HF_WARPS][HF_ROWS][TILE + (T::QX ? HF_TILE_PAD : 0)];
    __shared__ float partial[HF_WARPS][HF_ROWS][HF_MAX_COLS];

    const HfGroup gr = hf_group(W, row_bytes, nrows, blockIdx.x);
    const int warp = gr.warp, lane = gr.lane, kpart = gr.kpart;
    const hf_u8* const(&rowp)[HF_ROWS] = gr.rowp;
    float acc[HF_ROWS][HF_MAX_COLS];
#pragma unroll
    for (int r = 0; r < HF_ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < HF_MAX_COLS; ++c) acc[r][c] = 0.0f;
    }

    LoadT buf[HF_ROWS][PER_LANE];
    const int step = T::CB * HF_KSPLIT;
    int b0 = kpart * T::CB;
    if (b0 < nblocks) hf_issue_tile<T>(buf, rowp, b0, nblocks, lane);
    for (; b0 < nblocks; b0 += step) {
        const int nb = min(T::CB, nblocks - b0);
        hf_store_tile(smem[warp], buf, nb * T::BYTES / (int)sizeof(LoadT), lane);
        hf_syncwarp();
        if (b0 + step < nblocks) hf_issue_tile<T>(buf, rowp, b0 + step, nblocks, lane); // in flight meanwhile
#pragma unroll
        for (int i = 0; i < UPL; ++i) {
            const int u = lane + HF_WARP * i;
            if (u < nb * T::UNITS) {
                const int bi = u / T::UNITS;
                const hf_u8* blk[HF_ROWS];
#pragma unroll
                for (int r = 0; r < HF_ROWS; ++r) blk[r] = smem[warp][r] + bi * T::BYTES;
                HfColsUnit<T>::run(acc, blk, xa, xstride, b0 + bi, u % T::UNITS, ncols);
            }
        }
        hf_syncwarp();
    }
    hf_cols_finish<RESIDUAL>(acc, partial, gr, y, ldy, nrows, ncols);
}

// Exported entry points: gemv_<format>_<plain|residual>_v<load bytes>_cols. nblocks = k / T::ELEMS,
// xstride = k (activation elements between columns), ldy = output floats between columns,
// 1 <= ncols <= HF_MAX_COLS.
#define HF_GEMV_COLS_ENTRY(NAME, T, LT, LW, FORM, RES)                                                  \
    extern "C" __global__ void __launch_bounds__(HF_WARPS * HF_WARP, HF_MINB)                           \
        gemv_##NAME##_##FORM##_v##LW##_cols(const hf_u8* __restrict__ W, hf_u64 row_bytes,              \
                                            const signed char* qs, const float2* ds, const float* xf,   \
                                            hf_u64 xstride, float* __restrict__ y, hf_u64 ldy,          \
                                            int nrows, int nblocks, int ncols) {                        \
        hf_gemv_cols<T, LT, RES>(W, row_bytes, hf_xargs(qs, ds, xf), xstride, y, ldy, nrows, nblocks,   \
                                 ncols);                                                                \
    }
#define HF_GEMV_COLS_FORMAT(NAME, T) HF_GEMV_INSTANCES(HF_GEMV_COLS_ENTRY, NAME, T)
HF_GEMV_FORMATS(HF_GEMV_COLS_FORMAT)

// ---------------------------------------------------------------------------------------------
// Device-resident (HBM) GEMV for Q4_K and Q6_K: gemv_<q4_k|q6_k>_<plain|residual>_dev. The launcher
// uses it for weights in device memory with 16-byte aligned rows when the general kernel's shape has
// no k-split; host-mapped weights keep the general kernel (its 16-byte staging is what PCIe needs).
//
// What differs from hf_gemv: the exposed cost there is the latency of the activation loads (one
// L1/L2 round trip per tile, after the weights of that tile have arrived). Here each block copies the
// whole quantised activation (k int8 + k/32 (d, s) pairs: 1.25 k bytes) into shared memory once,
// after issuing its first weight loads so the copy overlaps them, and every tile reads x from shared
// memory (swizzled: conflict-free 16-byte reads). With HF_DEV_XREG instead, x comes from global
// memory but is requested one tile ahead together with that tile's weights. Q4_K reads its weights
// straight into registers (144-byte blocks keep 16-byte alignment); Q6_K (210-byte blocks) keeps the
// per-warp shared-memory tile of hf_gemv. Weight loads are streaming (hf_ldw16).
//
// Bit-equality with hf_gemv (HF_KSPLIT 1): lane L sums, in tile order, the same units (block
// 8t + L/4, unit L%4) with the same dot code, and the warp sum is the same butterfly, so every row
// is bit-identical to the general kernel's whatever the block shape or the memory.
//
// Launch: blockDim.x = 32 * (1..HF_DEV_WARPS) (the host picks fewer warps for few rows), HF_DEV_ROWS
// rows per warp, dynamic shared memory = (HF_DEV_XREG ? 0 : 320 * nblocks) + (Q6_K: warps *
// HF_DEV_ROWS * (8 * 210 + 16)).
// ---------------------------------------------------------------------------------------------
#ifndef HF_DEV_WARPS
#define HF_DEV_WARPS 8
#endif
#ifndef HF_DEV_ROWS
#define HF_DEV_ROWS 2
#endif
#ifndef HF_DEV_MINB
#define HF_DEV_MINB ((16 + HF_DEV_WARPS - 1) / HF_DEV_WARPS) // >= 16 resident warps per SM
#endif
#define HF_DEV_XBYTES 320 // shared bytes of staged activation per 256-element block: 256 int8 + 8 float2

extern __shared__ __align__(16) hf_u8 hf_dev_smem[];

// Copies the activation of nblocks K-blocks into shared memory: qs as 16-byte units placed by T::swz,
// then the (d, s) pairs. Loads are batched ahead of the stores so a thread has several in flight.
template <class T>
__device__ __forceinline__ void hf_stage_x(int4* xq, float2* xd, const XArgs& xa, int nblocks) {
    constexpr int BATCH = 8;
    const int nq = nblocks * 16, nd = nblocks * 4, n = nq + nd;
    const int4* gq = (const int4*)xa.qs;
    const int4* gd = (const int4*)xa.ds;
    int4* sd = (int4*)xd;
    for (int base = threadIdx.x; base < n; base += BATCH * (int)blockDim.x) {
        int4 v[BATCH];
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            const int c = base + i * (int)blockDim.x;
            if (c < nq) v[i] = gq[c];
            else if (c < n) v[i] = gd[c - nq];
        }
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            const int c = base + i * (int)blockDim.x;
            if (c < nq) xq[T::swz(c)] = v[i];
            else if (c < n) sd[c - nq] = v[i];
        }
    }
}

// The warp's R row sums, reduced across lanes and written (plain) or added (residual) by lane 0.
template <int R, bool RESIDUAL>
__device__ __forceinline__ void hf_dev_store_rows(float (&acc)[R], float* __restrict__ y, int row0,
                                                  int nrows, int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = hf_warp_sum(acc[r]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = row0 + r;
            if (row < nrows) y[row] = RESIDUAL ? y[row] + acc[r] : acc[r];
        }
    }
}

// Q4_K: lane L owns unit L%4 of block 8t + L/4 in tile t; weights go global -> registers, one tile
// ahead.
template <class T, bool RESIDUAL>
__device__ __forceinline__ void hf_gemv_dev_direct(const hf_u8* __restrict__ W, hf_u64 row_bytes, XArgs xa,
                                                   float* __restrict__ y, int nrows, int nblocks) {
    static_assert(T::CB * T::UNITS == HF_WARP, "one unit per lane per tile");
    constexpr int R = HF_DEV_ROWS;
    const int nwarps = (int)blockDim.x / HF_WARP;
    const int warp = threadIdx.x / HF_WARP, lane = threadIdx.x % HF_WARP;
    const int row0 = (blockIdx.x * nwarps + warp) * R;
    const bool active = row0 < nrows; // warp-uniform
    const int sub = lane % T::UNITS;
    const hf_u8* rowp[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rowp[r] = W + (hf_u64)min(row0 + r, nrows - 1) * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;

    typename T::WR cur[R], nxt[R];
    typename T::X xc;
    int b = lane / T::UNITS; // this lane's block in the current tile
    if (active && b < nblocks) {
#pragma unroll
        for (int r = 0; r < R; ++r) T::load_w(cur[r], rowp[r] + (hf_u64)b * T::BYTES, sub);
    }
#ifdef HF_DEV_XREG
    typename T::X xn;
    if (active && b < nblocks) T::load_x(xc, xa, b, sub);
#else
    int4* xq = (int4*)hf_dev_smem;
    float2* xd = (float2*)(hf_dev_smem + (size_t)nblocks * 256);
    hf_stage_x<T>(xq, xd, xa, nblocks);
    __syncthreads();
#endif
    if (!active) return;
    for (; b - lane / T::UNITS < nblocks; b += T::CB) {
        const int bn = b + T::CB;
        if (bn < nblocks) { // next tile in flight while this one is computed
#pragma unroll
            for (int r = 0; r < R; ++r) T::load_w(nxt[r], rowp[r] + (hf_u64)bn * T::BYTES, sub);
#ifdef HF_DEV_XREG
            T::load_x(xn, xa, bn, sub);
#endif
        }
        if (b < nblocks) {
#ifndef HF_DEV_XREG
            T::load_xs(xc, xq, xd, b, sub);
#endif
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] += T::dot_w(cur[r], sub, xc);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) cur[r] = nxt[r];
#ifdef HF_DEV_XREG
        xc = xn;
#endif
    }
    hf_dev_store_rows<R, RESIDUAL>(acc, y, row0, nrows, lane);
}

// Q6_K: hf_gemv's per-warp shared-memory tile for the weights (16-byte coalesced loads of 8 blocks,
// one tile ahead), the activation from the block's shared copy (or HF_DEV_XREG: one tile ahead).
template <class T, bool RESIDUAL>
__device__ __forceinline__ void hf_gemv_dev_tiled(const hf_u8* __restrict__ W, hf_u64 row_bytes, XArgs xa,
                                                  float* __restrict__ y, int nrows, int nblocks) {
    static_assert(T::CB * T::UNITS == HF_WARP, "one unit per lane per tile");
    constexpr int R = HF_DEV_ROWS;
    constexpr int TILE = T::CB * T::BYTES;
    static_assert(TILE % 16 == 0, "tile must keep 16-byte alignment");
    constexpr int STRIDE = TILE + HF_TILE_PAD;
    constexpr int PER_LANE = (TILE / 16 + HF_WARP - 1) / HF_WARP;
    const int nwarps = (int)blockDim.x / HF_WARP;
    const int warp = threadIdx.x / HF_WARP, lane = threadIdx.x % HF_WARP;
    const int row0 = (blockIdx.x * nwarps + warp) * R;
    const bool active = row0 < nrows;
    const int bl = lane / T::UNITS, sub = lane % T::UNITS;
    const hf_u8* rowp[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rowp[r] = W + (hf_u64)min(row0 + r, nrows - 1) * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#ifdef HF_DEV_XREG
    hf_u8* tiles = hf_dev_smem;
#else
    int4* xq = (int4*)hf_dev_smem;
    float2* xd = (float2*)(hf_dev_smem + (size_t)nblocks * 256);
    hf_u8* tiles = hf_dev_smem + (size_t)nblocks * HF_DEV_XBYTES;
#endif
    hf_u8* mytile = tiles + (size_t)warp * R * STRIDE;

    uint4 buf[R][PER_LANE];
    auto issue = [&](int b0) {
        const int nunits = min(T::CB, nblocks - b0) * T::BYTES / 16; // exact: 16-byte rows
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const hf_u8* src = rowp[r] + (hf_u64)b0 * T::BYTES;
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const int u = lane + HF_WARP * i;
                if (u < nunits) {
                    const int4 v = hf_ldw16(src + 16 * u);
                    buf[r][i] = make_uint4((unsigned)v.x, (unsigned)v.y, (unsigned)v.z, (unsigned)v.w);
                }
            }
        }
    };
    typename T::X xc;
    if (active) issue(0);
#ifdef HF_DEV_XREG
    typename T::X xn;
    if (active && bl < nblocks) T::load_x(xc, xa, bl, sub);
#else
    hf_stage_x<T>(xq, xd, xa, nblocks);
    __syncthreads();
#endif
    if (!active) return;
    for (int b0 = 0; b0 < nblocks; b0 += T::CB) {
        const int nunits = min(T::CB, nblocks - b0) * T::BYTES / 16;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            uint4* dst = (uint4*)(mytile + r * STRIDE);
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const int u = lane + HF_WARP * i;
                if (u < nunits) dst[u] = buf[r][i];
            }
        }
        hf_syncwarp();
        if (b0 + T::CB < nblocks) {
            issue(b0 + T::CB); // in flight while this tile is computed
#ifdef HF_DEV_XREG
            if (b0 + T::CB + bl < nblocks) T::load_x(xn, xa, b0 + T::CB + bl, sub);
#endif
        }
        if (b0 + bl < nblocks) {
#ifndef HF_DEV_XREG
            T::load_xs(xc, xq, xd, b0 + bl, sub);
#endif
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] += T::dot(mytile + r * STRIDE + bl * T::BYTES, sub, xc);
        }
#ifdef HF_DEV_XREG
        xc = xn;
#endif
        hf_syncwarp();
    }
    hf_dev_store_rows<R, RESIDUAL>(acc, y, row0, nrows, lane);
}

#define HF_GEMV_DEV_ENTRY(NAME, T, KIND, FORM, RES)                                                   \
    extern "C" __global__ void __launch_bounds__(HF_DEV_WARPS * HF_WARP, HF_DEV_MINB)                  \
        gemv_##NAME##_##FORM##_dev(const hf_u8* __restrict__ W, hf_u64 row_bytes,                      \
                                   const signed char* qs, const float2* ds, const float* xf,           \
                                   float* __restrict__ y, int nrows, int nblocks) {                    \
        hf_gemv_dev_##KIND<T, RES>(W, row_bytes, hf_xargs(qs, ds, xf), y, nrows, nblocks);             \
    }
HF_GEMV_DEV_ENTRY(q4_k, TQ4K, direct, plain, false)
HF_GEMV_DEV_ENTRY(q4_k, TQ4K, direct, residual, true)
HF_GEMV_DEV_ENTRY(q6_k, TQ6K, tiled, plain, false)
HF_GEMV_DEV_ENTRY(q6_k, TQ6K, tiled, residual, true)

// ---------------------------------------------------------------------------------------------
// Multi-column Q4_K GEMV on the tensor cores (CUDA sm_80 and later, device-resident weights):
// gemv_q4_k_<plain|residual>_mma<8|16>, for 2 to 8 (resp. 16) activation columns.
//
// Why: the multi-column kernels above redo each column's dot on the CUDA cores (dp4a), so 8
// resident columns cost ~3 × one column (748.6 against 283.4 tok/s over the 32 layers of the
// synthetic Llama-3-8B Q4_K, docs/perf-checkpoints/2026-12-01-multi-column-kernels-h200) where a
// weight read once should make them nearly free. Here the integer sums of a 32-element sub-block
// are one `mma.m16n8k32` (int8 × int8 → int32) for 16 rows × 8 columns, as ggml-cuda's MMQ does:
// the nibbles are the A operand as they are (0..15), the columns' int8 activations (the q8 form
// quantize_x_q8 writes) the B operand, and each int32 sum is scaled per (row, sub-block, column)
// exactly as dot_d scales it: d·sc·d_x·Σ(q·q_x) − dmin·m·(d_x·Σq_x).
//
// Shape: a block of HF_MMA_WARPS warps owns 16 rows; its warps split the row's 256-element blocks
// (warp w takes blocks w, w + HF_MMA_WARPS, ...) and are summed through shared memory at the end.
// Lane (g = lane / 4, t = lane % 4) holds the A fragment of rows g and g + 8 and the B fragment of
// column g of each n-tile. The mma's k order is a free choice as long as A and B agree: its k slots
// 4t..4t+3 carry the sub-block's elements 8t..8t+3 and slots 16+4t..16+4t+3 elements 8t+4..8t+7,
// so each lane reads 8 contiguous bytes of the weights (a row's 32-byte group is one sector across
// the lane's quad) and 8 of each activation column.
//
// Not bit-identical to the dp4a kernels (the per-sub-block int32 sums are the same, the float
// scaling and sums are ordered differently): tests/gpu_gemv.rs bounds it against them and against
// the f64 reference.
// ---------------------------------------------------------------------------------------------
#if defined(HF_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#ifndef HF_MMA_WARPS
#define HF_MMA_WARPS 8
#endif
#define HF_MMA_ROWS 16

// c = A · B over one k32 step (A 16 × 32 rows × k, B 32 × 8 k × columns, int8; c int32).
__device__ __forceinline__ void hf_mma_s8(int (&c)[4], const int (&a)[4], int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

// Sub-block j's 6-bit scale and min of a Q4_K block from its head's scale words (y: bytes 0..3,
// z: 4..7, w: 8..11): ggml's get_scale_min_k4 on registers.
__device__ __forceinline__ void hf_q4k_scale_min(const int4& h, int j, float& sc, float& m) {
    const int i = j & 3, sh = 8 * i;
    const int y = (int)(((hf_u32)h.y >> sh) & 0xFFu);
    const int z = (int)(((hf_u32)h.z >> sh) & 0xFFu);
    if (j < 4) {
        sc = (float)(y & 63);
        m = (float)(z & 63);
    } else {
        const int w = (int)(((hf_u32)h.w >> sh) & 0xFFu);
        sc = (float)((w & 0xF) | ((y >> 6) << 4));
        m = (float)((w >> 4) | ((z >> 6) << 4));
    }
}

// The end of the tensor-core kernels: each warp's C fragments (lane (g, t) holds rows g and g + 8,
// columns 2t and 2t + 1 of each n-tile) summed over the block's warps through shared memory, one
// (n-tile, element, lane) value per thread, and stored (added in the residual form).
template <int NT, bool RESIDUAL>
__device__ __forceinline__ void hf_mma_finish(float (&part)[HF_MMA_WARPS][NT * 4][HF_WARP], const float (&acc)[NT][4],
                                              float* __restrict__ y, hf_u64 ldy, int row0, int nrows, int ncols) {
    const int warp = threadIdx.x / HF_WARP, lane = threadIdx.x % HF_WARP;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) part[warp][nt * 4 + i][lane] = acc[nt][i];
    }
    __syncthreads();
    for (int v = threadIdx.x; v < NT * 4 * HF_WARP; v += HF_MMA_WARPS * HF_WARP) {
        const int e = v / HF_WARP, l = v % HF_WARP, nt = e / 4, i = e % 4;
        float s = 0.0f;
#pragma unroll
        for (int p = 0; p < HF_MMA_WARPS; ++p) s += part[p][e][l];
        const int row = row0 + (l >> 2) + (i >= 2 ? 8 : 0);
        const int col = nt * 8 + 2 * (l & 3) + (i & 1);
        if (row < nrows && col < ncols) {
            float* yc = y + (hf_u64)col * ldy + row;
            *yc = RESIDUAL ? *yc + s : s;
        }
    }
}

// NT n-tiles of 8 columns (ncols <= 8 * NT).
template <int NT, bool RESIDUAL>
__device__ __forceinline__ void hf_gemv_q4k_mma(const hf_u8* __restrict__ W, hf_u64 row_bytes,
                                                const signed char* __restrict__ qs, const float2* __restrict__ ds,
                                                hf_u64 xstride, float* __restrict__ y, hf_u64 ldy, int nrows,
                                                int nblocks, int ncols) {
    __shared__ float part[HF_MMA_WARPS][NT * 4][HF_WARP];
    const int warp = threadIdx.x / HF_WARP, lane = threadIdx.x % HF_WARP;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * HF_MMA_ROWS;
    // Rows past the end read the last row (their sums are never stored).
    const hf_u8* wa = W + (hf_u64)min(row0 + g, nrows - 1) * row_bytes;
    const hf_u8* wb = W + (hf_u64)min(row0 + g + 8, nrows - 1) * row_bytes;
    const hf_u64 xblocks = xstride / HF_QX_BLOCK;
    // Per n-tile: this lane's B column (nt*8 + g) and the activation scales of its C columns
    // (nt*8 + 2t, nt*8 + 2t + 1); columns past ncols read the last one and are never stored.
    const signed char* xcol[NT];
    const float2* dcol[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        xcol[nt] = qs + (hf_u64)min(nt * 8 + g, ncols - 1) * xstride + 8 * t;
        dcol[nt][0] = ds + (hf_u64)min(nt * 8 + 2 * t, ncols - 1) * xblocks;
        dcol[nt][1] = ds + (hf_u64)min(nt * 8 + 2 * t + 1, ncols - 1) * xblocks;
    }
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    for (int b = warp; b < nblocks; b += HF_MMA_WARPS) {
        const hf_u8* ba = wa + (hf_u64)b * 144;
        const hf_u8* bb = wb + (hf_u64)b * 144;
        const int4 ha = hf_ldw16(ba), hb = hf_ldw16(bb);
        uint2 qa[4], qb[4];
#pragma unroll
        for (int G = 0; G < 4; ++G) {
            qa[G] = __ldcs((const uint2*)(ba + HF_Q4K_QS + 32 * G + 8 * t));
            qb[G] = __ldcs((const uint2*)(bb + HF_Q4K_QS + 32 * G + 8 * t));
        }
        const float da = hf_h2f((hf_u16)((hf_u32)ha.x & 0xFFFFu)), mna = hf_h2f((hf_u16)((hf_u32)ha.x >> 16));
        const float db = hf_h2f((hf_u16)((hf_u32)hb.x & 0xFFFFu)), mnb = hf_h2f((hf_u16)((hf_u32)hb.x >> 16));
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int G = j >> 1, h = 4 * (j & 1);
            int a[4];
            a[0] = (int)((qa[G].x >> h) & 0x0F0F0F0Fu); // row g, elements 8t..8t+3
            a[1] = (int)((qb[G].x >> h) & 0x0F0F0F0Fu); // row g + 8
            a[2] = (int)((qa[G].y >> h) & 0x0F0F0F0Fu); // row g, elements 8t+4..8t+7
            a[3] = (int)((qb[G].y >> h) & 0x0F0F0F0Fu);
            float sca, ma, scb, mb;
            hf_q4k_scale_min(ha, j, sca, ma);
            hf_q4k_scale_min(hb, j, scb, mb);
            const float fa = da * sca, ga = mna * ma, fb = db * scb, gb = mnb * mb;
            const int xj = b * 8 + j;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int2 xv = *(const int2*)(xcol[nt] + (hf_u64)xj * HF_QX_BLOCK);
                int c[4];
                hf_mma_s8(c, a, xv.x, xv.y);
                const float2 x0 = dcol[nt][0][xj], x1 = dcol[nt][1][xj];
                acc[nt][0] += fa * x0.x * (float)c[0] - ga * x0.y;
                acc[nt][1] += fa * x1.x * (float)c[1] - ga * x1.y;
                acc[nt][2] += fb * x0.x * (float)c[2] - gb * x0.y;
                acc[nt][3] += fb * x1.x * (float)c[3] - gb * x1.y;
            }
        }
    }
    hf_mma_finish<NT, RESIDUAL>(part, acc, y, ldy, row0, nrows, ncols);
}

// c = A · B over one k16 step (A 16 × 16, B 16 × 8, int8; c int32): Q6_K's scales are per 16.
__device__ __forceinline__ void hf_mma_s8_k16(int (&c)[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}

// 4 bytes at a 2-byte aligned address (Q6_K blocks are 210 bytes): two aligned loads and a funnel
// shift. Used at offsets below the block's scales, so the second word stays inside the block.
__device__ __forceinline__ hf_u32 hf_ld32_b2(const hf_u8* p) {
    const hf_u64 a = (hf_u64)p;
    const hf_u32* w = (const hf_u32*)(a & ~(hf_u64)3);
    return __funnelshift_r(w[0], w[1], (hf_u32)(a & 2) * 8);
}

// The Q6_K form: per 16 elements one `mma.m16n8k16` (Q6_K scales each 16 elements), the weights
// rebuilt as signed int8 (ql nibble | qh pair << 4, minus 32) and scaled by d·sc·d_x as the dp4a dot
// scales them. Lane (g, t) holds elements 4t..4t+3 of each 16 (the natural k order of the k16 form)
// of rows g and g + 8, and of column g of each n-tile. Block layout (ggml block_q6_K): sub-block s of
// half n (elements 128n + 32s + l, l < 32) takes ql[64n + 32(s & 1) + l]'s nibble s >> 1, qh[32n + l]'s
// bits 2s..2s+1 and scale sc[8n + 2s + l / 16].
template <int NT, bool RESIDUAL>
__device__ __forceinline__ void hf_gemv_q6k_mma(const hf_u8* __restrict__ W, hf_u64 row_bytes,
                                                const signed char* __restrict__ qs, const float2* __restrict__ ds,
                                                hf_u64 xstride, float* __restrict__ y, hf_u64 ldy, int nrows,
                                                int nblocks, int ncols) {
    __shared__ float part[HF_MMA_WARPS][NT * 4][HF_WARP];
    const int warp = threadIdx.x / HF_WARP, lane = threadIdx.x % HF_WARP;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * HF_MMA_ROWS;
    const hf_u8* wa = W + (hf_u64)min(row0 + g, nrows - 1) * row_bytes;
    const hf_u8* wb = W + (hf_u64)min(row0 + g + 8, nrows - 1) * row_bytes;
    const hf_u64 xblocks = xstride / HF_QX_BLOCK;
    const signed char* xcol[NT];
    const float2* dcol[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        xcol[nt] = qs + (hf_u64)min(nt * 8 + g, ncols - 1) * xstride + 4 * t;
        dcol[nt][0] = ds + (hf_u64)min(nt * 8 + 2 * t, ncols - 1) * xblocks;
        dcol[nt][1] = ds + (hf_u64)min(nt * 8 + 2 * t + 1, ncols - 1) * xblocks;
    }
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    for (int b = warp; b < nblocks; b += HF_MMA_WARPS) {
        const hf_u8* ba = wa + (hf_u64)b * 210;
        const hf_u8* bb = wb + (hf_u64)b * 210;
        const float da = hf_h2f(hf_ld16(ba + HF_Q6K_D)), db = hf_h2f(hf_ld16(bb + HF_Q6K_D));
        const signed char* sa = (const signed char*)(ba + HF_Q6K_SC);
        const signed char* sb = (const signed char*)(bb + HF_Q6K_SC);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int off = 16 * h + 4 * t;
                const hf_u32 la0 = hf_ld32_b2(ba + 64 * n + off), la1 = hf_ld32_b2(ba + 64 * n + 32 + off);
                const hf_u32 lb0 = hf_ld32_b2(bb + 64 * n + off), lb1 = hf_ld32_b2(bb + 64 * n + 32 + off);
                const hf_u32 ha = hf_ld32_b2(ba + HF_Q6K_QH + 32 * n + off);
                const hf_u32 hb = hf_ld32_b2(bb + HF_Q6K_QH + 32 * n + off);
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const int nib = 4 * (s >> 1);
                    const hf_u32 qa = (((s & 1) ? la1 : la0) >> nib) & 0x0F0F0F0Fu;
                    const hf_u32 qb = (((s & 1) ? lb1 : lb0) >> nib) & 0x0F0F0F0Fu;
                    const int a0 = (int)__vsub4(qa | (((ha >> (2 * s)) & 0x03030303u) << 4), 0x20202020u);
                    const int a1 = (int)__vsub4(qb | (((hb >> (2 * s)) & 0x03030303u) << 4), 0x20202020u);
                    const int si = 8 * n + 2 * s + h;
                    const float fa = da * (float)sa[si], fb = db * (float)sb[si];
                    const int xj = b * 8 + 4 * n + s;
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const int xv = *(const int*)(xcol[nt] + (hf_u64)xj * HF_QX_BLOCK + 16 * h);
                        int c[4];
                        hf_mma_s8_k16(c, a0, a1, xv);
                        const float x0 = dcol[nt][0][xj].x, x1 = dcol[nt][1][xj].x;
                        acc[nt][0] += fa * x0 * (float)c[0];
                        acc[nt][1] += fa * x1 * (float)c[1];
                        acc[nt][2] += fb * x0 * (float)c[2];
                        acc[nt][3] += fb * x1 * (float)c[3];
                    }
                }
            }
        }
    }
    hf_mma_finish<NT, RESIDUAL>(part, acc, y, ldy, row0, nrows, ncols);
}

// Exported entry points: gemv_<q4_k|q6_k>_<plain|residual>_mma<COLS>; nblocks = k / 256,
// xstride = k, 1 <= ncols <= COLS; W and row_bytes 16-byte aligned for Q4_K, 2-byte for Q6_K.
#define HF_GEMV_MMA_ENTRY(NAME, FN, NT, COLS, FORM, RES)                                               \
    extern "C" __global__ void __launch_bounds__(HF_MMA_WARPS * HF_WARP)                               \
        gemv_##NAME##_##FORM##_mma##COLS(const hf_u8* __restrict__ W, hf_u64 row_bytes, const signed char* qs, \
                                         const float2* ds, hf_u64 xstride, float* __restrict__ y,      \
                                         hf_u64 ldy, int nrows, int nblocks, int ncols) {              \
        FN<NT, RES>(W, row_bytes, qs, ds, xstride, y, ldy, nrows, nblocks, ncols);                     \
    }
HF_GEMV_MMA_ENTRY(q4_k, hf_gemv_q4k_mma, 1, 8, plain, false)
HF_GEMV_MMA_ENTRY(q4_k, hf_gemv_q4k_mma, 1, 8, residual, true)
HF_GEMV_MMA_ENTRY(q4_k, hf_gemv_q4k_mma, 2, 16, plain, false)
HF_GEMV_MMA_ENTRY(q4_k, hf_gemv_q4k_mma, 2, 16, residual, true)
HF_GEMV_MMA_ENTRY(q6_k, hf_gemv_q6k_mma, 1, 8, plain, false)
HF_GEMV_MMA_ENTRY(q6_k, hf_gemv_q6k_mma, 1, 8, residual, true)
HF_GEMV_MMA_ENTRY(q6_k, hf_gemv_q6k_mma, 2, 16, plain, false)
HF_GEMV_MMA_ENTRY(q6_k, hf_gemv_q6k_mma, 2, 16, residual, true)
#endif // tensor-core kernels

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
