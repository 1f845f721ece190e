// dequant_host.cpp — kernels/dequant.cu compiled for the host, its kernels run thread by thread, so
// the dequantiser's layouts, arithmetic and launch geometry are checked on a machine without a GPU
// (tests/dequant_host.rs drives it and compares with hipfire-quant's CPU dequantiser).
//
// dequant.cu is included as it is, on its HIP path (plain f32 arithmetic, contraction off: build
// with -ffp-contract=off; f16 conversions through _Float16, which rounds to nearest even); each
// launch loops over every (blockIdx.x, threadIdx.x) of the grid the host code computes.
//
// Usage:
//   dequant_host dequant FORMAT ROW_BYTES K START ROWS OUT_STRIDE WEIGHTS.bin OUT.bin
//     OUT.bin holds (ROWS - 1) * OUT_STRIDE + 3 * K u16: the launch's output (row r at
//     r * OUT_STRIDE), then 2 * K values past it, all pre-filled with the poison 0x7E01 (an f16
//     NaN) so unwritten or overwritten values show.
//   dequant_host convert N X.bin OUT.bin
//     OUT.bin holds N + 8 u16 (8 of poison past the end); x is read from a 16-byte aligned copy
//     when N is even, and from one 4 bytes off 16-byte alignment when N is odd (the scalar path).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#define __HIP_PLATFORM_AMD__ 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
struct D3 { unsigned x, y, z; };
static D3 threadIdx, blockIdx;
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
#include "dequant.cu"

static const unsigned short kPoison = 0x7E01;
// Largest input the check reads (its shapes use a few MiB).
static const size_t kMaxBytes = 256u << 20;

typedef void (*DequantFn)(const hf_u8*, hf_u64, int, int, hf_u16*, hf_u64);
struct Entry { const char* name; DequantFn f; };
static const Entry kEntries[] = {
    {"f32", dequant_f32},       {"f16", dequant_f16},       {"bf16", dequant_bf16},
    {"q8_0", dequant_q8_0},     {"q4_0", dequant_q4_0},     {"q4_1", dequant_q4_1},
    {"q4_k", dequant_q4_k},     {"q6_k", dequant_q6_k},     {"hfq4g256", dequant_hfq4g256},
    {"q5_0", dequant_q5_0},     {"q5_1", dequant_q5_1},     {"q5_k", dequant_q5_k},
    {"q3_k", dequant_q3_k},     {"q2_k", dequant_q2_k},     {"iq4_nl", dequant_iq4_nl},
    {"iq4_xs", dequant_iq4_xs},
};

static std::vector<unsigned char> read_file(const char* path) {
    std::vector<unsigned char> v;
    FILE* f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        v.insert(v.end(), buf, buf + n);
        if (v.size() > kMaxBytes) { fprintf(stderr, "%s: too large\n", path); exit(2); }
    }
    fclose(f);
    return v;
}

static void write_file(const char* path, const void* p, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

// A 16-byte aligned copy of `src` placed `skew` bytes past an aligned address.
static unsigned char* aligned_copy(const std::vector<unsigned char>& src, size_t skew, void** base) {
    *base = aligned_alloc(16, (src.size() + skew + 16 + 15) / 16 * 16);
    unsigned char* p = (unsigned char*)*base + skew;
    if (!src.empty()) memcpy(p, src.data(), src.size());
    return p;
}

int main(int argc, char** argv) {
    if (argc == 10 && std::string(argv[1]) == "dequant") {
        const char* fmt = argv[2];
        const hf_u64 row_bytes = strtoull(argv[3], nullptr, 10);
        const int k = atoi(argv[4]), start = atoi(argv[5]), rows = atoi(argv[6]);
        const hf_u64 stride = strtoull(argv[7], nullptr, 10);
        DequantFn f = nullptr;
        for (const Entry& e : kEntries)
            if (std::string(e.name) == fmt) f = e.f;
        if (!f || k <= 0 || k % HF_DQ_CHUNK != 0 || rows <= 0 || start < 0 || stride < (hf_u64)k ||
            stride % HF_DQ_CHUNK != 0) {
            fprintf(stderr, "bad arguments\n");
            return 2;
        }
        std::vector<unsigned char> w = read_file(argv[8]);
        if ((hf_u64)(start + rows) * row_bytes > w.size()) { fprintf(stderr, "weights too short\n"); return 2; }
        void* wbase;
        const unsigned char* wp = aligned_copy(w, 0, &wbase);
        std::vector<hf_u16> out((size_t)(rows - 1) * stride + 3 * (size_t)k, kPoison);
        // The host launch (crates/hipfire-gpu/src/dequant.rs): base moved to the first row.
        const unsigned cpr = k / HF_DQ_CHUNK, bpr = (cpr + HF_DQ_THREADS - 1) / HF_DQ_THREADS;
        const unsigned grid = bpr * (unsigned)rows;
        for (unsigned b = 0; b < grid; ++b)
            for (unsigned t = 0; t < HF_DQ_THREADS; ++t) {
                blockIdx.x = b;
                threadIdx.x = t;
                f(wp + (hf_u64)start * row_bytes, row_bytes, k, rows, out.data(), stride);
            }
        write_file(argv[9], out.data(), out.size() * 2);
        free(wbase);
        return 0;
    }
    if (argc == 5 && std::string(argv[1]) == "convert") {
        const hf_u64 n = strtoull(argv[2], nullptr, 10);
        std::vector<unsigned char> x = read_file(argv[3]);
        if (x.size() < n * 4) { fprintf(stderr, "x too short\n"); return 2; }
        void* xbase;
        const float* xp = (const float*)aligned_copy(x, n % 2 ? 4 : 0, &xbase);
        std::vector<hf_u16> y(n + 8, kPoison);
        const hf_u64 grid = (n + HF_DQ_CHUNK * HF_DQ_THREADS - 1) / (HF_DQ_CHUNK * HF_DQ_THREADS);
        for (hf_u64 b = 0; b < grid; ++b)
            for (unsigned t = 0; t < HF_DQ_THREADS; ++t) {
                blockIdx.x = (unsigned)b;
                threadIdx.x = t;
                convert_f32_to_f16(xp, y.data(), n);
            }
        write_file(argv[4], y.data(), y.size() * 2);
        free(xbase);
        return 0;
    }
    fprintf(stderr, "usage: see the file header\n");
    return 2;
}
