// flags.cu — the device half of the `flags` join: no host synchronisation inside a split step.
//
// A mailbox in pinned host-mapped memory carries x down and the CPU rows up, guarded by sequence
// words (layout and the host half: crates/hipfire-exec/src/flags.rs; the offsets arrive as
// parameters so the layout is stated once, in Rust). On the step's stream:
//   flags_publish   copies x into the mailbox, fences system-wide, then writes seq = step
//                   (flags_publish_tagged: each element stored with the step beside it, no fence);
//   (GPU arm)       the row-range GEMV over rows [0, g), as in every other strategy;
//   flags_wait_fold one thread per block spins on the done word of the CPU rows it folds (one
//                   word per chunk of rows, or one for the whole arm; a %globaltimer timeout turns a
//                   silent host into a fault word, never a hung GPU), then its block copies
//                   (plain) or adds (residual) those rows into y[g, m) of each output.
// A one-thread kernel spinning on a host-mapped word completes a host -> GPU -> host handshake in
// 3.5-4.4 us on the H200 box, against ~7 us for a blocking 16 KiB D2H and ~11 us for a blocking H2D.
//
// CUDA/HIP common subset; the system-scope atomics and the timer are spelled per platform.
typedef unsigned int hf_u32;
typedef unsigned long long hf_u64;

#include "platform.cuh"

#define HF_FLAGS_THREADS 1024 // publish: one block, x is 16-56 KiB and its stores are posted

// A poll of a word the host writes: a plain system-scope load, no ordering; the loop ends with one
// hf_fence_acquire_sys. An acquire load per poll (the earlier form) orders every poll against all
// later accesses, which is more than the loop needs. On the H200 box the two forms measured the
// same (docs/perf-checkpoints/2026-11-29-flags-step-cost-h200, record 09).
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
    // Every thread's x stores reach the host before thread 0's release store of the sequence
    // word: each thread fences its own stores (the plain reading of the CUDA guide:
    // __threadfence_system orders the calling thread's writes), then the block meets.
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) hf_store_release_sys((hf_u32*)(mb + seq_off), step);
}

// flags_publish without a fence or a sequence word: each element of x goes down as one 8-byte
// store of {its f32 bits, step}, so that an element the CPU reads with the current step in its
// upper half is that step's value (an aligned 8-byte store reaches host memory whole; NCCL's LL
// protocol rests on the same). The workers poll element 0, then check every element's step as
// they read it. No __threadfence_system, which waits for the link's acknowledgements before the
// sequence word may go, and no second store behind it. Any number of blocks (grid-stride): the
// readers check every element, so the order in which elements land does not matter.
__device__ __forceinline__ void hf_store_volatile_u64(hf_u64* p, hf_u64 v) {
#ifdef HF_CUDA
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
    __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

extern "C" __global__ void __launch_bounds__(HF_FLAGS_THREADS)
    flags_publish_tagged(const float* __restrict__ x, int k, unsigned char* mb, hf_u32 x_off,
                         hf_u32 step) {
    hf_u64* dst = (hf_u64*)(mb + x_off);
    const hf_u64 tag = (hf_u64)step << 32;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x)
        hf_store_volatile_u64(dst + i, tag | (hf_u64)__float_as_uint(x[i]));
}

// The fold's segments: the CPU rows of up to HF_FOLD_SEGS outputs that shared one x (q/k/v,
// gate/up), concatenated in the mailbox in this order. Mirrors `FoldSegments` in
// crates/hipfire-gpu/src/flags.rs (passed by value: 8-byte pointers, then 4-byte counts).
#define HF_FOLD_SEGS 4
struct hf_fold_segs {
    float* y[HF_FOLD_SEGS];
    int rows[HF_FOLD_SEGS];
};

// Which done word covers which CPU rows: part p is rows [cut[p], cut[p + 1]) of the concatenated
// segments, and its done word sits at done_off + p * done_stride. One part (the whole range
// under the one done word the last worker writes) or one per worker, so that each worker's rows
// are folded as soon as that worker is done and only the last one's remain once the CPU arm
// ends. Mirrors `FoldParts` in crates/hipfire-gpu/src/flags.rs.
#define HF_FOLD_PARTS 64
struct hf_fold_parts {
    hf_u32 cut[HF_FOLD_PARTS + 1];
    int n;
};

// A done word says the step it finished; with this bit set, that the CPU arm failed for it
// (rows unspecified). Step numbers stay below it (DONE_FAILED in crates/hipfire-exec/src/flags.rs).
#define HF_DONE_FAILED 0x80000000u

// Threads per fold block; the launcher gives each part enough blocks for about two rows per
// thread, because each row is a load over PCIe.
#define HF_FOLD_THREADS 256

extern "C" __global__ void __launch_bounds__(HF_FOLD_THREADS)
    flags_wait_fold(unsigned char* mb, hf_u32 done_off, hf_u32 done_stride,
                    struct hf_fold_parts parts, int blocks_per_part, hf_u32 fault_off,
                    hf_u64* wait_scratch, hf_u32 wait_off, hf_u32 y_off, hf_u32 step,
                    struct hf_fold_segs segs, int nsegs, int residual, hf_u64 timeout_ns) {
    __shared__ int ok;
    const int part = blockIdx.x / blocks_per_part;
    const int sub = blockIdx.x % blocks_per_part;
    if (threadIdx.x == 0) {
        const hf_u32* done = (const hf_u32*)(mb + done_off + (hf_u64)part * done_stride);
        const hf_u64 t0 = hf_now_ns();
        int good = 1;
        hf_u32 v;
        while ((v = hf_load_relaxed_sys(done)) != step && v != (step | HF_DONE_FAILED)) {
            if (hf_now_ns() - t0 > timeout_ns) {
                good = 0;
                break;
            }
#if defined(HF_CUDA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700)
            // The first block of each part answers at once; the others poll more gently, so
            // that tens of pollers do not keep the link busy while the CPU arm finishes.
            if (sub != 0) __nanosleep(200);
#endif
        }
        hf_fence_acquire_sys();
        // A failed CPU arm still publishes done (so this never hangs), with the failure bit.
        if (v != step) good = 0;
        if (!good) hf_store_release_sys((hf_u32*)(mb + fault_off), step);
        // Diagnostic, when asked: the longest wait of any part, added to the mailbox's total by
        // the last part to arrive (wait_scratch: {longest wait, arrivals}, zero between folds;
        // the stream orders one fold after another).
        if (wait_scratch && sub == 0) {
            atomicMax(&wait_scratch[0], hf_now_ns() - t0);
            __threadfence();
            if (atomicAdd(&wait_scratch[1], 1ull) == (hf_u64)(parts.n - 1)) {
                __threadfence();
                *(volatile hf_u64*)(mb + wait_off) += atomicExch(&wait_scratch[0], 0ull);
                wait_scratch[1] = 0;
            }
        }
        ok = good;
    }
    __syncthreads();
    if (!ok) return;
    const float* src = (const float*)(mb + y_off);
    const int hi = (int)parts.cut[part + 1];
    for (int i = (int)parts.cut[part] + sub * blockDim.x + threadIdx.x; i < hi;
         i += blocks_per_part * blockDim.x) {
        int s = 0, base = 0;
        while (s + 1 < nsegs && i - base >= segs.rows[s]) base += segs.rows[s++];
        const float v = hf_load_fresh(src + i);
        float* y = segs.y[s] + (i - base);
        *y = residual ? *y + v : v;
    }
}
