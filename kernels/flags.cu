// flags.cu — the device half of the `flags` join: no host synchronisation inside a split step.
//
// A mailbox in pinned host-mapped memory carries x down and the CPU rows up, guarded by sequence
// words (layout and the host half: crates/hipfire-exec/src/flags.rs; the offsets arrive as
// parameters so the layout is stated once, in Rust). On the step's stream:
//   flags_publish   copies x into the mailbox, fences system-wide, then writes seq = step;
//   (GPU arm)       the row-range GEMV over rows [0, g), as in every other strategy;
//   flags_wait_fold one thread per block spins on the CPU's done word (a %globaltimer timeout turns
//                   a silent host into a fault word, never a hung GPU), then the grid copies
//                   (plain) or adds (residual) the CPU rows into y[g, m) of each output.
// A one-thread kernel spinning on a host-mapped word completes a host -> GPU -> host handshake in
// 3.5-4.4 us on the H200 box, against ~7 us for a blocking 16 KiB D2H and ~11 us for a blocking H2D.
//
// CUDA/HIP common subset; the system-scope atomics and the timer are spelled per platform.
typedef unsigned int hf_u32;
typedef unsigned long long hf_u64;

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC_RTC__)
#define HF_HIP 1
#else
#define HF_CUDA 1
#endif

#define HF_FLAGS_THREADS 1024 // publish: one block, x is 16-56 KiB and its stores are posted

__device__ __forceinline__ hf_u32 hf_load_acquire_sys(const hf_u32* p) {
#ifdef HF_CUDA
    hf_u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

// A poll of a word the host writes: a plain system-scope load, no ordering; the loop ends with one
// hf_fence_acquire_sys. An acquire load per poll (the earlier form) orders every poll against all
// later accesses, which is more than the loop needs. On the H200 box the two forms measured the
// same (docs/perf-checkpoints/2026-11-29-session3-h200, record 09).
__device__ __forceinline__ hf_u32 hf_load_relaxed_sys(const hf_u32* p) {
#ifdef HF_CUDA
    hf_u32 v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

// After a relaxed poll saw the value: what the host wrote before it is visible from here on.
__device__ __forceinline__ void hf_fence_acquire_sys() {
#ifdef HF_CUDA
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

__device__ __forceinline__ void hf_store_release_sys(hf_u32* p, hf_u32 v) {
#ifdef HF_CUDA
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

__device__ __forceinline__ hf_u64 hf_now_ns() {
#ifdef HF_CUDA
    hf_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return wall_clock64() * 10; // 100 MHz constant clock (untested on AMD hardware)
#endif
}

// A load that ignores any cached copy of a system-memory line: the CPU rewrites these rows
// every step.
__device__ __forceinline__ float hf_load_fresh(const float* p) {
#ifdef HF_CUDA
    return __ldcv(p);
#else
    return *(const volatile float*)p;
#endif
}

extern "C" __global__ void __launch_bounds__(HF_FLAGS_THREADS)
    flags_publish(const float* __restrict__ x, int k, int vec4, unsigned char* mb, hf_u32 x_off,
                  hf_u32 seq_off, hf_u32 step) {
    float* dst = (float*)(mb + x_off);
    if (vec4) {
        const float4* s4 = (const float4*)x;
        float4* d4 = (float4*)dst;
        for (int i = threadIdx.x; i < k / 4; i += blockDim.x) d4[i] = s4[i];
    } else {
        for (int i = threadIdx.x; i < k; i += blockDim.x) dst[i] = x[i];
    }
    // Every thread's x stores reach the host before any thread passes the barrier; thread 0's
    // release store of the sequence word follows them.
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) hf_store_release_sys((hf_u32*)(mb + seq_off), step);
}

// The fold's segments: the CPU rows of up to HF_FOLD_SEGS outputs that shared one x (q/k/v,
// gate/up), concatenated in the mailbox in this order. Mirrors `FoldSegments` in
// crates/hipfire-gpu/src/flags.rs (passed by value: 8-byte pointers, then 4-byte counts).
#define HF_FOLD_SEGS 4
struct hf_fold_segs {
    float* y[HF_FOLD_SEGS];
    int rows[HF_FOLD_SEGS];
};

// Threads per fold block; the launcher sizes the grid for about two rows per thread, because each
// row is a load over PCIe: one 1024-thread block (the earlier form) left ~10 such loads per thread
// in turn for a 10k-row fold. The fold's own work measured ~12 us per step on the H200 box with
// this grid (session-3 checkpoint, records 06 and 10: fold minus its wait); the old block was
// not timed.
#define HF_FOLD_THREADS 256

extern "C" __global__ void __launch_bounds__(HF_FOLD_THREADS)
    flags_wait_fold(unsigned char* mb, hf_u32 done_off, hf_u32 err_off, hf_u32 fault_off,
                    int count_wait, hf_u32 wait_off, hf_u32 y_off, hf_u32 step,
                    struct hf_fold_segs segs, int nsegs, int residual, hf_u64 timeout_ns) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        const hf_u32* done = (const hf_u32*)(mb + done_off);
        const hf_u64 t0 = hf_now_ns();
        int good = 1;
        while (hf_load_relaxed_sys(done) != step) {
            if (hf_now_ns() - t0 > timeout_ns) {
                good = 0;
                break;
            }
#if defined(HF_CUDA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700)
            // Block 0 answers at once; the others poll more gently, so that tens of pollers do
            // not keep the link busy while the CPU arm finishes.
            if (blockIdx.x != 0) __nanosleep(200);
#endif
        }
        hf_fence_acquire_sys();
        // A failed CPU arm still publishes done (so this never hangs) but marks the error word.
        if (good && hf_load_acquire_sys((const hf_u32*)(mb + err_off)) == step) good = 0;
        if (!good) hf_store_release_sys((hf_u32*)(mb + fault_off), step);
        // Diagnostic, when asked: block 0 adds how long it waited for the CPU (the host reads
        // the total after the stream drains; the stream orders these plain read-modify-writes).
        if (count_wait && blockIdx.x == 0) *(volatile hf_u64*)(mb + wait_off) += hf_now_ns() - t0;
        ok = good;
    }
    __syncthreads();
    if (!ok) return;
    const float* src = (const float*)(mb + y_off);
    int total = 0;
    for (int s = 0; s < nsegs; ++s) total += segs.rows[s];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int s = 0, base = 0;
        while (s + 1 < nsegs && i - base >= segs.rows[s]) base += segs.rows[s++];
        const float v = hf_load_fresh(src + i);
        float* y = segs.y[s] + (i - base);
        *y = residual ? *y + v : v;
    }
}
