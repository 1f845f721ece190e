// gemv_host.cpp — kernels/gemv.cu compiled for the host, its general and multi-column GEMV kernels
// and the activation quantiser run on emulated thread blocks, so the multi-column kernel's
// indexing, k-split reduction and column grouping are checked on a machine without a GPU
// (tests/gemv_host.rs drives it: every column of the multi-column kernel against the general
// kernel on that column, bit for bit, and against the f64 reference).
//
// gemv.cu is included on its HIP path (plain f32 arithmetic; build with -ffp-contract=off), from a
// copy whose one dynamic shared-memory declaration (`extern __shared__`, the device-resident
// kernels') has lost its `__shared__`, since here `__shared__` means `static`. A launch runs its
// blocks one after the other; a block's threads are fibers on one OS thread, switched only at the
// barriers (__syncthreads, the warp barrier, both halves of a shuffle), so warp-level code runs as
// on a GPU in lock-step, deterministically. A fiber is entered the first time with setcontext (its
// own stack, from makecontext) and afterwards switched with _setjmp/_longjmp, which do not save
// and restore the signal mask (with swapcontext's system calls at every switch the whole check,
// g++ builds included, took 83 s instead of 40 s on the 2-core CI box, 2026-12-01).
//
// Usage:
//   gemv_host FORMAT WIDTH FORM K ELEMS ROW_BYTES M START END NCOLS LDY W.bin X.bin Y0.bin OUT
//     Rows [START, END) with WIDTH-byte loads, ELEMS elements per kernel block (8 for the float
//     formats); W.bin: M rows of ROW_BYTES; X.bin: NCOLS columns of K f32; Y0.bin: (NCOLS-1)*LDY + M f32,
//     the outputs' starting values (poison and, for the residual form, the values added to).
//     Writes OUT.single (each column through the general kernel alone), OUT.cols (all columns
//     through the multi-column kernel, groups of HF_MAX_COLS as gemv_cols launches them) and
//     OUT.act (the prepared activation: NCOLS*K int8, then NCOLS*K/32 (d, s) pairs).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <csetjmp>
#include <ucontext.h>
#include <vector>

#define __HIP_PLATFORM_AMD__ 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
struct uint4 { unsigned x, y, z, w; };
struct int4 { int x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct D3 { unsigned x, y, z; };
static D3 threadIdx, blockIdx, blockDim;
using std::min;
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
    const uint64_t v = ((uint64_t)hi << 32) | lo;
    return (unsigned)(v >> (sh & 31));
}
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
static inline int __builtin_amdgcn_sdot4(int a, int b, int c, bool) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}

// ---- fibers: one per thread of the running block ----
static const int kMaxThreads = 1024;
static const size_t kStack = 256 << 10;
struct Fiber {
    ucontext_t ctx;   // the first entry
    jmp_buf jb;       // where it resumes after a barrier
    bool started;
    bool done;
    int group;        // barrier waited on (-1: runnable)
    unsigned gen;     // that barrier's generation when the fiber arrived
};
static Fiber g_fibers[kMaxThreads];
static std::vector<char> g_stacks;
static jmp_buf g_sched;
static int g_cur, g_nthreads;
// Barriers: group w < 32 is warp w, group 32 the block.
static int g_arrived[33];
static unsigned g_gen[33];
static void (*g_body)();

static void barrier(int group, int n) {
    Fiber& f = g_fibers[g_cur];
    if (++g_arrived[group] == n) {
        g_arrived[group] = 0;
        ++g_gen[group];
        return;
    }
    f.group = group;
    f.gen = g_gen[group];
    if (!_setjmp(f.jb)) _longjmp(g_sched, 1);
}
static void warp_barrier() { barrier(threadIdx.x / 32, 32); }
static void __syncthreads() { barrier(32, (int)blockDim.x); }
static void __builtin_amdgcn_wave_barrier() { warp_barrier(); }
static float g_shfl[kMaxThreads];
static float __shfl_xor(float v, int o) {
    const int t = (int)threadIdx.x;
    g_shfl[t] = v;
    warp_barrier();
    const float r = g_shfl[(t & ~31) | ((t & 31) ^ o)];
    warp_barrier();
    return r;
}

static void fiber_main() {
    g_body();
    g_fibers[g_cur].done = true;
    _longjmp(g_sched, 1);
}

// Runs body over grid blocks of block threads.
static void launch(unsigned grid, unsigned block, void (*body)()) {
    if (block % 32 != 0 || block > kMaxThreads) { fprintf(stderr, "bad block %u\n", block); exit(2); }
    g_stacks.resize((size_t)block * kStack);
    g_body = body;
    g_nthreads = (int)block;
    for (unsigned b = 0; b < grid; ++b) {
        memset(g_arrived, 0, sizeof g_arrived);
        for (int t = 0; t < g_nthreads; ++t) {
            Fiber& f = g_fibers[t];
            f.done = false;
            f.started = false;
            f.group = -1;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = g_stacks.data() + (size_t)t * kStack;
            f.ctx.uc_stack.ss_size = kStack;
            f.ctx.uc_link = nullptr;
            makecontext(&f.ctx, fiber_main, 0);
        }
        for (;;) {
            bool all_done = true, ran = false;
            for (int t = 0; t < g_nthreads; ++t) {
                Fiber& f = g_fibers[t];
                if (f.done) continue;
                all_done = false;
                if (f.group >= 0 && g_gen[f.group] == f.gen) continue; // still waiting
                f.group = -1;
                g_cur = t;
                threadIdx = D3{(unsigned)t, 0, 0};
                blockIdx = D3{b, 0, 0};
                blockDim = D3{block, 1, 1};
                if (!_setjmp(g_sched)) {
                    if (f.started) _longjmp(f.jb, 1);
                    f.started = true;
                    setcontext(&f.ctx);
                }
                ran = true;
            }
            if (all_done) break;
            if (!ran) { fprintf(stderr, "deadlock in block %u\n", b); exit(3); }
        }
    }
}

#include "gemv.cu"
// The device-resident kernels' dynamic shared memory (declared by gemv.cu; unused here).
hf_u8 hf_dev_smem[48 << 10];

typedef void (*GemvFn)(const hf_u8*, hf_u64, const signed char*, const float2*, const float*, float*, int, int);
typedef void (*ColsFn)(const hf_u8*, hf_u64, const signed char*, const float2*, const float*, hf_u64, float*,
                       hf_u64, int, int, int);
struct Entry {
    const char* name;
    GemvFn gemv[2][3]; // [residual][16, 4, 2]
    ColsFn cols[2][3];
};
#define HF_HOST_ENTRY(NAME, T)                                                                                  \
    {#NAME,                                                                                                    \
     {{gemv_##NAME##_plain_v16, gemv_##NAME##_plain_v4, gemv_##NAME##_plain_v2},                                \
      {gemv_##NAME##_residual_v16, gemv_##NAME##_residual_v4, gemv_##NAME##_residual_v2}},                      \
     {{gemv_##NAME##_plain_v16_cols, gemv_##NAME##_plain_v4_cols, gemv_##NAME##_plain_v2_cols},                 \
      {gemv_##NAME##_residual_v16_cols, gemv_##NAME##_residual_v4_cols, gemv_##NAME##_residual_v2_cols}}},
static const Entry kEntries[] = {HF_GEMV_FORMATS(HF_HOST_ENTRY)};

// The launch's arguments, read by the fiber bodies.
static struct {
    const hf_u8* w;
    hf_u64 row_bytes, xstride, ldy;
    const float* x;
    signed char* qs;
    float2* ds;
    float* xf;
    float* y;
    int n, nrows, nblocks, ncols;
    GemvFn gemv;
    ColsFn cols;
} A;
static void quantize_body() { quantize_x_q8(A.x, A.n, A.qs, A.ds, A.xf); }
static void gemv_body() { A.gemv(A.w, A.row_bytes, A.qs, A.ds, A.xf, A.y, A.nrows, A.nblocks); }
static void cols_body() {
    A.cols(A.w, A.row_bytes, A.qs, A.ds, A.xf, A.xstride, A.y, A.ldy, A.nrows, A.nblocks, A.ncols);
}

static std::vector<unsigned char> read_file(const std::string& path) {
    std::vector<unsigned char> v;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) { perror(path.c_str()); exit(2); }
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    fclose(f);
    return v;
}
static void write_file(const std::string& path, const void* p, size_t n) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(path.c_str()); exit(2); }
    fclose(f);
}
template <class E>
static std::vector<E> as(const std::vector<unsigned char>& b) {
    std::vector<E> v(b.size() / sizeof(E));
    memcpy(v.data(), b.data(), v.size() * sizeof(E));
    return v;
}

int main(int argc, char** argv) {
    if (argc != 16) {
        fprintf(stderr, "usage: gemv_host FORMAT WIDTH FORM K ELEMS ROW_BYTES M START END NCOLS LDY W X Y0 OUT\n");
        return 2;
    }
    const std::string fmt = argv[1], form = argv[3];
    const int width = atoi(argv[2]), k = atoi(argv[4]), elems = atoi(argv[5]);
    const size_t row_bytes = strtoull(argv[6], nullptr, 10);
    const int m = atoi(argv[7]), start = atoi(argv[8]), end = atoi(argv[9]), ncols = atoi(argv[10]);
    const size_t ldy = strtoull(argv[11], nullptr, 10);
    const Entry* e = nullptr;
    for (const Entry& c : kEntries)
        if (fmt == c.name) e = &c;
    const int wi = width == 16 ? 0 : width == 4 ? 1 : width == 2 ? 2 : -1;
    if (!e || wi < 0 || (form != "plain" && form != "residual") || elems <= 0 || k % elems != 0 || k % 32 != 0 ||
        ncols < 1 || start < 0 || start >= end || end > m || ldy < (size_t)m) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    const int res = form == "residual";
    const std::vector<unsigned char> wb = read_file(argv[12]);
    const std::vector<float> x = as<float>(read_file(argv[13]));
    const std::vector<float> y0 = as<float>(read_file(argv[14]));
    const std::string out = argv[15];
    const size_t ny = (size_t)(ncols - 1) * ldy + m;
    if (wb.size() != (size_t)m * row_bytes || x.size() != (size_t)ncols * k || y0.size() != ny) {
        fprintf(stderr, "input sizes\n");
        return 2;
    }
    // 16-byte aligned copies (the device allocations are), with slack for the kernels' reads
    // one word past a block.
    std::vector<uint4> wbuf(wb.size() / 16 + 2), xfv((size_t)ncols * k / 4 + 1), qsv((size_t)ncols * k / 16 + 1),
        dsv((size_t)ncols * k / 32 / 2 + 1);
    memcpy(wbuf.data(), wb.data(), wb.size());
    A.x = x.data();
    A.n = ncols * k;
    A.qs = (signed char*)qsv.data();
    A.ds = (float2*)dsv.data();
    A.xf = (float*)xfv.data();
    launch((unsigned)((A.n + 255) / 256), 256, quantize_body);

    A.w = (const hf_u8*)wbuf.data() + (size_t)start * row_bytes;
    A.row_bytes = row_bytes;
    A.nrows = end - start;
    A.nblocks = k / elems;
    const int rows_per_block = HF_ROWS * (HF_WARPS / HF_KSPLIT);
    const unsigned grid = (unsigned)((A.nrows + rows_per_block - 1) / rows_per_block);
    const signed char* qs0 = A.qs;
    const float2* ds0 = A.ds;
    const float* xf0 = A.xf;

    std::vector<float> single = y0, cols = y0;
    A.gemv = e->gemv[res][wi];
    for (int c = 0; c < ncols; ++c) {
        A.qs = (signed char*)qs0 + (size_t)c * k;
        A.ds = (float2*)ds0 + (size_t)c * (k / 32);
        A.xf = (float*)xf0 + (size_t)c * k;
        A.y = single.data() + c * ldy + start;
        launch(grid, HF_WARPS * 32, gemv_body);
    }
    A.cols = e->cols[res][wi];
    A.xstride = (hf_u64)k;
    A.ldy = ldy;
    for (int c0 = 0; c0 < ncols; c0 += HF_MAX_COLS) {
        A.ncols = min(ncols - c0, HF_MAX_COLS);
        A.qs = (signed char*)qs0 + (size_t)c0 * k;
        A.ds = (float2*)ds0 + (size_t)c0 * (k / 32);
        A.xf = (float*)xf0 + (size_t)c0 * k;
        A.y = cols.data() + c0 * ldy + start;
        launch(grid, HF_WARPS * 32, cols_body);
    }
    write_file(out + ".single", single.data(), ny * 4);
    write_file(out + ".cols", cols.data(), ny * 4);
    std::vector<unsigned char> act((size_t)ncols * k + (size_t)ncols * k / 32 * 8);
    memcpy(act.data(), qs0, (size_t)ncols * k);
    memcpy(act.data() + (size_t)ncols * k, ds0, (size_t)ncols * k / 32 * 8);
    write_file(out + ".act", act.data(), act.size());
    return 0;
}
