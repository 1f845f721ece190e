// dequant.cu — weight rows of every GEMV format to row-major f16, and activations f32 -> f16, for the
// batched prefill's f16 GEMM (the GEMM multiplies these rows; it has no per-format code of its own).
//
// Each value is computed in f32 exactly as the CPU dequantiser does it (crates/hipfire-quant/src/
// formats/*.rs `dequantize_block`: same formula, same operation order, no contraction into FMA),
// then rounded to f16 to nearest, ties to even (values beyond f16's range become +-inf). So the
// output is bit-identical to `half::f16::from_f32(dequantize_row(..)[i])`.
//
// Row contract: `dequant_<format>(W, row_bytes, k, rows, out, out_row_stride)` writes rows [0, rows)
// of the matrix starting at W (row r at W + r*row_bytes) as k f16 bit patterns at out + r*out_row_stride.
// The host launches a row range [a, b) by passing W + a*row_bytes and rows = b - a.
//
// Work split: one thread makes 8 consecutive outputs of one row (one 16-byte store), so a warp writes
// 512 contiguous bytes; thread blocks never straddle rows (a row takes ceil(k/8 / 256) blocks), so
// the row and chunk come from one 32-bit division of blockIdx.x. Weight bytes are read with 16-bit
// loads (32-bit for the formats with f32 fields), which every block layout's field offsets allow
// when the row base and row_bytes are 2- (4-) byte aligned; the host checks that.
//
// Launch (host, crates/hipfire-gpu/src/dequant.rs): block = HF_DQ_THREADS, grid = rows *
// ceil(k / 8 / HF_DQ_THREADS); k % 8 == 0, out and out_row_stride * 2 16-byte aligned.
// CUDA/HIP common subset; the arithmetic helpers below pin the rounding on both.
#include "platform.cuh"
#include "blocks.cuh"

#ifdef HF_HIP
// hipcc contracts a*b+c into an FMA by default; the CPU dequantiser rounds the product first.
#pragma clang fp contract(off)
#define HF_MUL(a, b) ((a) * (b))
#define HF_ADD(a, b) ((a) + (b))
#define HF_SUB(a, b) ((a) - (b))
#else
// The _rn intrinsics are never contracted into an FMA (NVRTC contracts plain a*b+c by default).
#define HF_MUL(a, b) __fmul_rn((a), (b))
#define HF_ADD(a, b) __fadd_rn((a), (b))
#define HF_SUB(a, b) __fsub_rn((a), (b))
#endif

#include "f16.cuh"

#define HF_DQ_THREADS 256 // threads per block (8 warps); the host's DEQUANT_THREADS
#define HF_DQ_CHUNK 8     // outputs per thread: one 16-byte store of f16

typedef unsigned int hf_u32;
typedef unsigned long long hf_u64;

__device__ __forceinline__ hf_u16 hf_dq_ld16(const hf_u8* p) { return *(const hf_u16*)p; }
__device__ __forceinline__ float hf_dq_h(const hf_u8* p) { return hf_h2f(hf_dq_ld16(p)); }
// 4 bytes from a 2-byte aligned address, byte i in bits 8i..8i+7.
__device__ __forceinline__ hf_u32 hf_dq_ld4(const hf_u8* p) {
    const hf_u16* q = (const hf_u16*)p;
    return (hf_u32)q[0] | ((hf_u32)q[1] << 16);
}
// 8 bytes from a 2-byte aligned address (four 16-bit loads), as two 32-bit words.
struct hf_dq_b8 { hf_u32 w[2]; };
__device__ __forceinline__ hf_dq_b8 hf_dq_ld8(const hf_u8* p) {
    hf_dq_b8 q;
    q.w[0] = hf_dq_ld4(p);
    q.w[1] = hf_dq_ld4(p + 4);
    return q;
}
// Bits [sh, sh + width) of byte i of q, where mask = 2^width - 1 (i is a constant after unrolling,
// so the word is a register, not an indexed array).
__device__ __forceinline__ hf_u32 hf_dq_bits(const hf_dq_b8& q, int i, int sh, hf_u32 mask) {
    return (q.w[i >> 2] >> (8 * (i & 3) + sh)) & mask;
}

// The exact f32 of u - off, for integers 0 <= u, off < 2^22: u in the mantissa of 2^23, then one
// exact subtraction. A logic op and an add, where a conversion instruction would run at a
// quarter of the rate (every output here needs one; the results are the same numbers).
__device__ __forceinline__ float hf_dq_i2f(hf_u32 u, int off) {
    return HF_SUB(__int_as_float((int)(0x4B000000u | u)), 8388608.0f + (float)off);
}

// The IQ4_NL grid value of a 4-bit code plus 128 (so 1..241, for hf_dq_i2f), from registers: no
// table in local or constant memory, where lanes reading different entries would serialise.
__device__ __forceinline__ hf_u32 hf_dq_iq4nl_b128(hf_u32 c) {
    const hf_u32 lo = (c & 4) ? HF_IQ4NL_W1 : HF_IQ4NL_W0;
    const hf_u32 hi = (c & 4) ? HF_IQ4NL_W3 : HF_IQ4NL_W2;
    const hf_u32 w = (c & 8) ? hi : lo;
    return ((w >> (8 * (c & 3))) & 0xFF) ^ 0x80; // two's complement byte -> byte + 128
}

// Two f32 to f16 bits packed low | high << 16, each rounded to nearest even.
__device__ __forceinline__ hf_u32 hf_dq_f2h2(float lo, float hi) {
#if defined(HF_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    hf_u32 r;
    // One instruction for both (sm_80+): a goes to the upper half, b to the lower.
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (hf_u32)hf_f2h(lo) | ((hf_u32)hf_f2h(hi) << 16);
#endif
}

// 8 f32 values to the 16 bytes of f16 one thread stores.
__device__ __forceinline__ void hf_dq_pack(const float (&v)[HF_DQ_CHUNK], hf_u32 (&o)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = hf_dq_f2h2(v[2 * i], v[2 * i + 1]);
}

// ---------------------------------------------------------------------------------------------
// Format traits: BYTES / ELEMS of one block (the float formats: 8 elements per "block"), and
// chunk(blk, c, o): elements 8c .. 8c+7 of the block at blk as f16 bits, packed two per word.
// Formulas cite the CPU dequantiser they copy (crates/hipfire-quant/src/formats/).
// ---------------------------------------------------------------------------------------------

// float.rs F32: the value itself.
struct DF32 {
    static constexpr int BYTES = 32, ELEMS = 8;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int, hf_u32 (&o)[4]) {
        const float* p = (const float*)b;
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = p[i];
        hf_dq_pack(v, o);
    }
};

// float.rs F16: f16 -> f32 -> f16 is the identity (for every non-NaN value), so the bits are copied.
struct DF16 {
    static constexpr int BYTES = 16, ELEMS = 8;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int, hf_u32 (&o)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = hf_dq_ld4(b + 4 * i);
    }
};

// float.rs BF16: the f32 with the bf16 bits on top (exact), then rounded to f16.
struct DBF16 {
    static constexpr int BYTES = 16, ELEMS = 8;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int, hf_u32 (&o)[4]) {
        const hf_u16* p = (const hf_u16*)b;
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = __int_as_float((int)((hf_u32)p[i] << 16));
        hf_dq_pack(v, o);
    }
};

// legacy.rs Q8_0: f32(q) * d.
struct DQ8_0 {
    static constexpr int BYTES = 34, ELEMS = 32;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const float d = hf_dq_h(b);
        const hf_dq_b8 q = hf_dq_ld8(b + 2 + 8 * c);
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = HF_MUL(hf_dq_i2f(hf_dq_bits(q, i, 0, 0xFF) ^ 0x80, 128), d);
        hf_dq_pack(v, o);
    }
};

// The 8 nibbles of chunk c (0..3) of a legacy 32-element block whose 16 code bytes start at qs:
// elements 0..15 are the low nibbles of qs[0..16], elements 16..31 the high nibbles.
__device__ __forceinline__ void hf_dq_legacy_nibbles(const hf_u8* qs, int c, hf_u32 (&n)[HF_DQ_CHUNK]) {
    const hf_dq_b8 q = hf_dq_ld8(qs + 8 * (c & 1));
    const int sh = 4 * (c >> 1);
#pragma unroll
    for (int i = 0; i < HF_DQ_CHUNK; ++i) n[i] = hf_dq_bits(q, i, sh, 15);
}

// The 5-bit codes of chunk c of a Q5_0 / Q5_1 block: the legacy nibbles with bit e of the
// little-endian u32 qh as bit 4 of element e (legacy.rs codes5).
__device__ __forceinline__ void hf_dq_codes5(const hf_u8* qh, const hf_u8* qs, int c, hf_u32 (&n)[HF_DQ_CHUNK]) {
    const hf_u32 hb = hf_dq_ld4(qh) >> (8 * c);
    hf_dq_legacy_nibbles(qs, c, n);
#pragma unroll
    for (int i = 0; i < HF_DQ_CHUNK; ++i) n[i] |= ((hb >> i) & 1) << 4;
}

// legacy.rs Q4_0, Q4_1, Q5_0, Q5_1: f16 d at 0, the 16 code bytes at QS, and for the 5-bit formats
// the fifth bits at QH (QH < 0: none). Without a min: d * f32(code - OFF); with the f16 min m at 2:
// d * f32(code) + m.
template <int BYTES_, int QS, int QH, int OFF, bool MIN>
struct DLegacy {
    static constexpr int BYTES = BYTES_, ELEMS = 32;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const float d = hf_dq_h(b);
        hf_u32 n[HF_DQ_CHUNK];
        if (QH < 0) hf_dq_legacy_nibbles(b + QS, c, n);
        else hf_dq_codes5(b + QH, b + QS, c, n);
        float v[HF_DQ_CHUNK];
        if (MIN) {
            const float m = hf_dq_h(b + 2);
#pragma unroll
            for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = HF_ADD(HF_MUL(d, hf_dq_i2f(n[i], 0)), m);
        } else {
#pragma unroll
            for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = HF_MUL(d, hf_dq_i2f(n[i], OFF));
        }
        hf_dq_pack(v, o);
    }
};
typedef DLegacy<18, 2, -1, 8, false> DQ4_0;
typedef DLegacy<20, 4, -1, 0, true> DQ4_1;
typedef DLegacy<22, HF_Q5_0_QS, HF_Q5_0_QH, 16, false> DQ5_0;
typedef DLegacy<24, HF_Q5_1_QS, HF_Q5_1_QH, 0, true> DQ5_1;

// iq4.rs IQ4_NL: d * f32(grid[q]).
struct DIq4Nl {
    static constexpr int BYTES = 18, ELEMS = 32;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const float d = hf_dq_h(b);
        hf_u32 n[HF_DQ_CHUNK];
        hf_dq_legacy_nibbles(b + 2, c, n);
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = HF_MUL(d, hf_dq_i2f(hf_dq_iq4nl_b128(n[i]), 128));
        hf_dq_pack(v, o);
    }
};

// kquant.rs q4k_scale_min (ggml get_scale_min_k4) of sub-block j (0..7), without a branch: lanes
// of one warp take different j.
__device__ __forceinline__ void hf_dq_scale_min_k4(int j, const hf_u8* q, int& sc, int& m) {
    const int a = q[j], b = q[j + 4], c = q[j >= 4 ? j - 4 : 0];
    sc = j < 4 ? (a & 63) : ((b & 0xF) | ((c >> 6) << 4));
    m = j < 4 ? (b & 63) : ((b >> 4) | ((a >> 6) << 4));
}

// kquant.rs dequant_k_asym (Q4_K, Q5_K): (d * sc) * f32(q) - (dmin * m) per sub-block of 32. Chunk
// c (0..31) lies in sub-block j = c / 4 at offset l0 = 8 (c % 4); its low 4 bits are nibble j % 2 of
// qs[32 (j / 2) + l0 ..]; Q5_K's fifth bit is bit j of qh[l0 ..].
template <bool Q5>
struct DQK {
    static constexpr int BYTES = Q5 ? 176 : 144, ELEMS = 256;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const int j = c >> 2, l0 = 8 * (c & 3);
        int sc, m;
        hf_dq_scale_min_k4(j, b + HF_Q4K_SCALES, sc, m);
        const float ds = HF_MUL(hf_dq_h(b), (float)sc);
        const float dm = HF_MUL(hf_dq_h(b + 2), (float)m);
        const hf_dq_b8 q = hf_dq_ld8(b + (Q5 ? HF_Q5K_QS : HF_Q4K_QS) + 32 * (j >> 1) + l0);
        hf_dq_b8 qh;
        if (Q5) qh = hf_dq_ld8(b + HF_Q5K_QH + l0);
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) {
            hf_u32 code = hf_dq_bits(q, i, 4 * (j & 1), 15);
            if (Q5) code |= hf_dq_bits(qh, i, j, 1) << 4;
            v[i] = HF_SUB(HF_MUL(ds, hf_dq_i2f(code, 0)), dm);
        }
        hf_dq_pack(v, o);
    }
};

// kquant.rs Q6_K: (d * sc) * f32(q - 32), sc the int8 scale of each 16. Element e = 128 n + 32 s + l
// (chunk c: n = c / 16, s = (c / 4) % 4, l from 8 (c % 4)): low 4 bits are nibble s / 2 of
// ql[64 n + 32 (s % 2) + l], high 2 bits are bits 2s, 2s+1 of qh[32 n + l].
struct DQ6K {
    static constexpr int BYTES = 210, ELEMS = 256;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const int n = c >> 4, s = (c >> 2) & 3, l0 = 8 * (c & 3);
        const float ds = HF_MUL(hf_dq_h(b + HF_Q6K_D), (float)(signed char)b[HF_Q6K_SC + (c >> 1)]);
        const hf_dq_b8 ql = hf_dq_ld8(b + 64 * n + 32 * (s & 1) + l0);
        const hf_dq_b8 qh = hf_dq_ld8(b + HF_Q6K_QH + 32 * n + l0);
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) {
            const hf_u32 code = hf_dq_bits(ql, i, 4 * (s >> 1), 15) | (hf_dq_bits(qh, i, 2 * s, 3) << 4);
            v[i] = HF_MUL(ds, hf_dq_i2f(code, 32));
        }
        hf_dq_pack(v, o);
    }
};

// The 2-bit planes of Q3_K / Q2_K (kquant_low.rs planes2): element e = 128 h + 32 s + l has bits
// 2s, 2s+1 of qs[32 h + l]. Chunk c: h = c / 16, s = (c / 4) % 4, l from 8 (c % 4).
__device__ __forceinline__ void hf_dq_planes2(const hf_u8* qs, int c, hf_u32 (&n)[HF_DQ_CHUNK]) {
    const hf_dq_b8 q = hf_dq_ld8(qs + 32 * (c >> 4) + 8 * (c & 3));
    const int sh = 2 * ((c >> 2) & 3);
#pragma unroll
    for (int i = 0; i < HF_DQ_CHUNK; ++i) n[i] = hf_dq_bits(q, i, sh, 3);
}

// kquant_low.rs Q3_K: (d * (scale - 32)) * f32(code - 4). code = planes | bit (e / 32) of
// hmask[e % 32] << 2; scale i (of each 16, i = c / 2) = low nibble from scales[i % 8] (low for
// i < 8, high otherwise) | bits 2 (i / 4) of scales[8 + i % 4] << 4 (q3k_scales).
struct DQ3K {
    static constexpr int BYTES = 110, ELEMS = 256;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const hf_u8* sp = b + HF_Q3K_SC;
        const int si = c >> 1;
        const int lo = si < 8 ? (sp[si] & 0xF) : (sp[si - 8] >> 4);
        const int hi = (sp[8 + (si & 3)] >> (2 * (si >> 2))) & 3;
        const float dl = HF_MUL(hf_dq_h(b + HF_Q3K_D), (float)((lo | (hi << 4)) - HF_Q3K_SCALE_OFFSET));
        hf_u32 n[HF_DQ_CHUNK];
        hf_dq_planes2(b + HF_Q3K_QS, c, n);
        const hf_dq_b8 hm = hf_dq_ld8(b + 8 * (c & 3));
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) {
            const hf_u32 code = n[i] | (hf_dq_bits(hm, i, c >> 2, 1) << 2);
            v[i] = HF_MUL(dl, hf_dq_i2f(code, 4));
        }
        hf_dq_pack(v, o);
    }
};

// kquant_low.rs Q2_K: (d * sc) * f32(q) - (dmin * m), scales[e / 16] = sc | m << 4.
struct DQ2K {
    static constexpr int BYTES = 84, ELEMS = 256;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const int sc = b[c >> 1];
        const float dl = HF_MUL(hf_dq_h(b + HF_Q2K_D), (float)(sc & 0xF));
        const float ml = HF_MUL(hf_dq_h(b + HF_Q2K_D + 2), (float)(sc >> 4));
        hf_u32 n[HF_DQ_CHUNK];
        hf_dq_planes2(b + HF_Q2K_QS, c, n);
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = HF_SUB(HF_MUL(dl, hf_dq_i2f(n[i], 0)), ml);
        hf_dq_pack(v, o);
    }
};

// iq4.rs IQ4_XS: (d * (scale - 32)) * f32(grid[q]). Sub-block ib = c / 4 of 32: 16 code bytes at
// qs + 16 ib in the legacy nibble order; scale = (scales_l[ib / 2] >> 4 (ib % 2)) & 15 |
// ((scales_h >> 2 ib) & 3) << 4.
struct DIq4Xs {
    static constexpr int BYTES = 136, ELEMS = 256;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const int ib = c >> 2;
        const int lo = (b[HF_IQ4XS_SL + (ib >> 1)] >> (4 * (ib & 1))) & 0xF;
        const int hi = (hf_dq_ld16(b + 2) >> (2 * ib)) & 3;
        const float dl = HF_MUL(hf_dq_h(b), (float)((lo | (hi << 4)) - HF_IQ4XS_SCALE_OFFSET));
        hf_u32 n[HF_DQ_CHUNK];
        hf_dq_legacy_nibbles(b + HF_IQ4XS_QS + 16 * ib, c & 3, n);
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = HF_MUL(dl, hf_dq_i2f(hf_dq_iq4nl_b128(n[i]), 128));
        hf_dq_pack(v, o);
    }
};

// hfq.rs HFQ4G256: scale * f32(q) + zero; byte j holds element 2j (low nibble) and 2j+1 (high).
// The f32 fields need a 4-byte aligned block (the host checks).
struct DHfq4 {
    static constexpr int BYTES = 136, ELEMS = 256;
    static __device__ __forceinline__ void chunk(const hf_u8* b, int c, hf_u32 (&o)[4]) {
        const float s = *(const float*)b, z = *(const float*)(b + 4);
        const hf_u32 q = *(const hf_u32*)(b + HF_HFQ_QS + 4 * c);
        float v[HF_DQ_CHUNK];
#pragma unroll
        for (int i = 0; i < HF_DQ_CHUNK; ++i) v[i] = HF_ADD(HF_MUL(s, hf_dq_i2f((q >> (4 * i)) & 15, 0)), z);
        hf_dq_pack(v, o);
    }
};

template <class T>
__device__ __forceinline__ void hf_dequant(const hf_u8* __restrict__ W, hf_u64 row_bytes, int k, int rows,
                                           hf_u16* __restrict__ out, hf_u64 out_row_stride) {
    static_assert(T::ELEMS % HF_DQ_CHUNK == 0, "a block is whole chunks");
    constexpr unsigned CPB = T::ELEMS / HF_DQ_CHUNK; // chunks per block
    const unsigned cpr = (unsigned)k / HF_DQ_CHUNK;  // chunks per row
    const unsigned bpr = (cpr + HF_DQ_THREADS - 1) / HF_DQ_THREADS;
    const unsigned row = blockIdx.x / bpr;
    const unsigned ch = (blockIdx.x - row * bpr) * HF_DQ_THREADS + threadIdx.x;
    if (row >= (unsigned)rows || ch >= cpr) return;
    hf_u32 w[4];
    T::chunk(W + (hf_u64)row * row_bytes + (hf_u64)(ch / CPB) * T::BYTES, (int)(ch % CPB), w);
    uint4 o;
    o.x = w[0];
    o.y = w[1];
    o.z = w[2];
    o.w = w[3];
    *(uint4*)(out + (hf_u64)row * out_row_stride + (hf_u64)ch * HF_DQ_CHUNK) = o;
}

// Exported entry points: dequant_<format> (the names of hipfire_quant::Format::name).
#define HF_DQ_ENTRY(NAME, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(HF_DQ_THREADS)                                        \
        dequant_##NAME(const hf_u8* __restrict__ W, hf_u64 row_bytes, int k, int rows,                 \
                       hf_u16* __restrict__ out, hf_u64 out_row_stride) {                              \
        hf_dequant<T>(W, row_bytes, k, rows, out, out_row_stride);                                     \
    }

HF_DQ_ENTRY(f32, DF32)
HF_DQ_ENTRY(f16, DF16)
HF_DQ_ENTRY(bf16, DBF16)
HF_DQ_ENTRY(q8_0, DQ8_0)
HF_DQ_ENTRY(q4_0, DQ4_0)
HF_DQ_ENTRY(q4_1, DQ4_1)
HF_DQ_ENTRY(q4_k, DQK<false>)
HF_DQ_ENTRY(q6_k, DQ6K)
HF_DQ_ENTRY(hfq4g256, DHfq4)
HF_DQ_ENTRY(q5_0, DQ5_0)
HF_DQ_ENTRY(q5_1, DQ5_1)
HF_DQ_ENTRY(q5_k, DQK<true>)
HF_DQ_ENTRY(q3_k, DQ3K)
HF_DQ_ENTRY(q2_k, DQ2K)
HF_DQ_ENTRY(iq4_nl, DIq4Nl)
HF_DQ_ENTRY(iq4_xs, DIq4Xs)

// y[i] = f16(x[i]) for i < n, round to nearest even, out-of-range to +-inf (as __float2half_rn and
// half::f16::from_f32). Thread t converts elements 8t .. 8t+7: two 16-byte loads and one 16-byte
// store when both pointers are 16-byte aligned and the chunk is whole, element by element otherwise.
// Launch: block = HF_DQ_THREADS, grid = ceil(n / 8 / HF_DQ_THREADS).
extern "C" __global__ void __launch_bounds__(HF_DQ_THREADS)
    convert_f32_to_f16(const float* __restrict__ x, hf_u16* __restrict__ y, hf_u64 n) {
    const hf_u64 i0 = ((hf_u64)blockIdx.x * HF_DQ_THREADS + threadIdx.x) * HF_DQ_CHUNK;
    if (i0 >= n) return;
    const bool vec = ((((hf_u64)x) | ((hf_u64)y)) & 15) == 0 && i0 + HF_DQ_CHUNK <= n;
    if (vec) {
        const float4 a = *(const float4*)(x + i0), b = *(const float4*)(x + i0 + 4);
        uint4 o;
        o.x = hf_dq_f2h2(a.x, a.y);
        o.y = hf_dq_f2h2(a.z, a.w);
        o.z = hf_dq_f2h2(b.x, b.y);
        o.w = hf_dq_f2h2(b.z, b.w);
        *(uint4*)(y + i0) = o;
    } else {
        for (hf_u64 i = i0; i < n && i < i0 + HF_DQ_CHUNK; ++i) y[i] = hf_f2h(x[i]);
    }
}
