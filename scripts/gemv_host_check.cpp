// gemv_host_check.cpp — kernels/gemv.cu's per-format dot() compiled for the host, so a kernel's
// arithmetic can be checked on a machine without a GPU (scripts/gemv_host_check.py drives it).
//
// gemv.cu is included as it is, on its HIP path, with the device builtins it uses emulated here as
// the CUDA/HIP documentation defines them (dp4a, funnel shift, byte permute); the kernels
// themselves are compiled but never launched. For each row, every (block, unit) of the format's
// traits struct is multiplied exactly as hf_gemv does it, after the activation is quantised as
// quantize_x_q8 does; the sum is accumulated in f64 so only the dot's own rounding remains.
//
// Usage: gemv_host_check FORMAT M K WEIGHTS.bin X.bin OUT.bin
//   OUT.bin: M f64 row dots, then K f64 values of the quantised activation (d * q).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <string>
#include <algorithm>
#define __HIP_PLATFORM_AMD__ 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
struct int4 { int x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct D3 { unsigned x, y, z; };
static D3 threadIdx, blockIdx, blockDim;
static inline void __syncthreads() {}
#define __builtin_amdgcn_wave_barrier()
static inline float __shfl_xor(float v, int) { return v; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int host_dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
#define __builtin_amdgcn_sdot4(a, b, c, cl) host_dp4a((a), (b), (c))
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
    return (unsigned)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
#include "gemv.cu"
hf_u8 hf_dev_smem[1 << 16];
// Largest weight file the check reads (the driver's shapes use under 1 MiB).
static const size_t kMaxWeightBytes = 64u << 20;

template <class T>
static double row_dot(const hf_u8* row, int nblocks, const XArgs& xa) {
    double acc = 0;
    for (int b = 0; b < nblocks; ++b)
        for (int u = 0; u < T::UNITS; ++u) {
            typename T::X x;
            T::load_x(x, xa, b, u);
            acc += T::dot(row + (size_t)b * T::BYTES, u, x);
        }
    return acc;
}

int main(int argc, char** argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s FORMAT M K WEIGHTS.bin X.bin OUT.bin\n", argv[0]);
        return 2;
    }
    const char* fmt = argv[1];
    int m = atoi(argv[2]), k = atoi(argv[3]);
    FILE* f = fopen(argv[4], "rb");
    // The weights start 64 bytes into a 16-aligned buffer (as a tile does) with slack after them:
    // hf_ints_b2 reads one aligned word past a block, as on the device (HF_TILE_PAD).
    std::vector<uint8_t> w(kMaxWeightBytes + 128);
    if (!f) return 2;
    const size_t nw = fread(w.data() + 64, 1, kMaxWeightBytes, f);
    fclose(f);
    std::vector<float> x(k);
    f = fopen(argv[5], "rb");
    if (!f) return 2;
    if (fread(x.data(), 4, k, f) != (size_t)k) return 2;
    fclose(f);
    // quantize_x_q8 on the host
    std::vector<signed char> qs(k + 64);
    std::vector<float2> ds(k / 32 + 4);
    std::vector<double> xhat(k);
    for (int b = 0; b < k / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, fabsf(x[32 * b + j]));
        float d = amax / 127.0f, sum = 0;
        for (int j = 0; j < 32; ++j) {
            float q = amax == 0.0f ? 0.0f : rintf(x[32 * b + j] / d);
            qs[32 * b + j] = (signed char)q;
            sum += q;
            xhat[32 * b + j] = (double)d * q;
        }
        ds[b] = make_float2(d, d * sum);
    }
    XArgs xa;
    // 16-byte aligned activation copies, as the device allocation is
    signed char* qa = (signed char*)aligned_alloc(16, k + 64);
    memcpy(qa, qs.data(), k);
    float2* da = (float2*)aligned_alloc(16, sizeof(float2) * (k / 32 + 4));
    memcpy(da, ds.data(), sizeof(float2) * (k / 32));
    xa.qs = qa; xa.ds = da; xa.xf = x.data();
    const std::string s(fmt);
    bool known = false;
    FILE* o = fopen(argv[6], "wb");
    for (int r = 0; r < m; ++r) {
        double y = 0;
        const hf_u8* base = w.data() + 64;
#define ROW(NAME, T)                                                                               \
    if (s == NAME) {                                                                               \
        const size_t rb = (size_t)(k / T::ELEMS) * T::BYTES;                                       \
        if (rb * m > nw) return 3;                                                                 \
        y = row_dot<T>(base + r * rb, k / T::ELEMS, xa);                                           \
        known = true;                                                                              \
    }
        ROW("q8_0", TQ8_0) ROW("q4_0", TQ4_0) ROW("q4_1", TQ4_1) ROW("q4_k", TQ4K) ROW("q6_k", TQ6K)
        ROW("q5_0", TQ5_0) ROW("q5_1", TQ5_1) ROW("q5_k", TQ5K) ROW("iq4_nl", TIq4Nl) ROW("iq4_xs", TIq4Xs) ROW("q3_k", TQ3K) ROW("q2_k", TQ2K)
        if (!known) return 4;
        fwrite(&y, 8, 1, o);
    }
    fwrite(xhat.data(), 8, k, o);
    fclose(o);
    return 0;
}
