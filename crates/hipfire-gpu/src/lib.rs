//! hipfire-gpu: the GPU engine — device, streams, events, device and host-mapped buffers, a kernel
//! registry that compiles `kernels/*.cu` at run time, and row-range GEMV launches.
//!
//! # Layout
//! - [`backend`] — the [`Backend`] trait: the raw surface a GPU runtime provides (object-safe,
//!   integer handles, every call returns `Result`). `cuda` implements it over cudarc (default
//!   feature `cuda`); `hip` over runtime-loaded HIP (feature `hip`, compiled but **untested on AMD
//!   hardware**).
//! - [`context`] — the owned safe types over any backend: [`Context`], [`Stream`], [`Event`],
//!   [`DeviceBuffer`], [`HostMappedBuffer`], [`Module`], and [`Graph`] (a stream's work captured
//!   by [`Stream::begin_capture`] / [`Stream::end_capture`] and replayed by one launch; CUDA
//!   only, other backends answer [`GpuError::NoGraphs`]). Each holds an `Arc<Context>`.
//! - [`registry`] — [`KernelRegistry`]: NVRTC/hiprtc compile for the device's own architecture,
//!   disk cache keyed by a hash of source, architecture and options, compile-once under concurrency.
//! - [`gemv`] — [`WeightRef`], [`RowRange`], [`GemvForm`], [`Activation`], [`GemvKernels`] and the
//!   [`ReadKernel`] used as the bandwidth ceiling in benchmarks; Q4_K/Q6_K weights resident in
//!   device memory take a variant that stages the activation in shared memory
//!   (`GemvConfig::device`, for row ranges of `gemv::DEV_MIN_ROWS` rows or more). Batched decode
//!   multiplies several activation columns at once ([`Activation::with_columns`],
//!   [`GemvKernels::gemv_cols`]): each weight tile is read once for up to [`GEMV_MAX_COLS`]
//!   columns, and each column gets the bits `gemv` gives it alone.
//! - [`gemm`] — [`gemm_f16`]: the dense f16 × f16 → f32 GEMM of batched steps (prefill) on the
//!   vendor BLAS (cuBLAS `GemmEx`, tensor cores), behind [`Backend::gemm_f16`]; backends without
//!   one answer [`GpuError::NoBlas`] and callers fall back to per-token GEMVs.
//! - [`dequant`] — [`DequantKernels`]: the batched prefill's f16 GEMM operands
//!   (`kernels/dequant.cu`): a row range of a weight in any GEMV format to row-major f16 (the
//!   CPU dequantiser's f32 rounded to nearest even, bit for bit), and activations f32 → f16.
//! - [`flags`] — [`FlagsKernels`]: the device half of the `flags` join (`kernels/flags.cu`):
//!   the publish of x into the host-mapped mailbox (fenced, or tagged with the step) and the
//!   wait-fold that polls the CPU's done words and folds its rows into one or more outputs.
//!   The mailbox layout is `hipfire_exec::flags`'s.
//! - [`launch`] — [`LaunchArgs`]: a kernel's parameters typed one by one
//!   (`LaunchArgs::new().ptr(x).i32(n).f32(eps)`), held on the stack, handed to a launch as the
//!   pointer array it needs.
//!
//! # The one design decision
//! A row range is a pointer offset: every kernel reads row `i` at `W + i·row_bytes` and writes
//! `y[i]`, so launching rows `[a, b)` moves the weight base by `a·row_bytes` and the output base by
//! `a`. The GPU arm of a split GEMV is therefore bit-identical to the same rows of a whole-matrix
//! launch (the tests check it), and host-mapped and device-resident weights run the same kernel.
//!
//! Errors are one enum, [`GpuError`], so the executor can tell "no GPU" from a driver fault from a
//! bad launch; driver failures name the call (`GpuError::Driver { call, source }`).
//!
//! # Using it
//! ```no_run
//! # fn main() -> Result<(), hipfire_gpu::GpuError> {
//! use hipfire_gpu::*;
//! use hipfire_quant::Format;
//! let ctx = Context::new(0)?; // Err(GpuError::NoGpu { .. }) without a GPU, never a panic
//! let stream = ctx.new_stream()?;
//! let kernels = GemvKernels::new(&KernelRegistry::new(&ctx))?; // NVRTC once, then the disk cache
//! let (m, k) = (4096, 4096);
//! let w_host = ctx.alloc_host_mapped(m * Format::Q4K.row_bytes(k)?)?; // spilled weights
//! let w = WeightRef::new(&w_host, 0, Format::Q4K, m, k)?;
//! let x: DeviceBuffer<f32> = ctx.alloc(k)?;
//! let mut y: DeviceBuffer<f32> = ctx.alloc(m)?;
//! let mut act = Activation::new(&ctx, k)?;
//! kernels.prepare(&stream, &x, &mut act)?; // once per GEMV
//! kernels.gemv(&stream, &w, &act, &mut y, RowRange::new(0, 1024), GemvForm::Plain)?; // GPU arm rows
//! stream.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! # Tests and benches
//! `cargo test -p hipfire-gpu` runs everywhere and reports the GPU tier (`tests/gpu_gemv.rs`,
//! `tests/gpu_dequant.rs`, ...) as ignored; `cargo test -p hipfire-gpu -- --include-ignored`
//! runs it too, and fails where no GPU is usable. `tests/dequant_host.rs` compiles
//! `kernels/dequant.cu` for the host with g++ and runs its kernels thread by thread against the
//! CPU dequantiser, and `tests/gemv_host.rs` does the same for `kernels/gemv.cu` (thread blocks
//! as fibers: the multi-column GEMV against the general kernel column by column) (both skipped
//! without g++). On the GPU box: `scripts/device-check.sh build` here, then
//! `scripts/device-check.sh run` there (every test, the ignored ones included, and
//! `examples/gpu_bench.rs` for the GEMV and the dequantiser; logs under `$OUT`). Measured
//! figures: docs/perf-checkpoints/2026-11-29-gpu-gemv.
#![deny(missing_docs)]

pub mod backend;
pub mod context;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dequant;
mod error;
pub mod flags;
pub mod gemm;
pub mod gemv;
#[cfg(feature = "hip")]
pub mod hip;
pub mod launch;
pub mod registry;

pub use backend::{Backend, DeviceInfo, GemmF16, LaunchDims};
pub use context::{
    BackendKind, Context, DeviceBuffer, DeviceElem, DeviceMemory, Event, Function, Graph,
    HostMappedBuffer, Module, Stream,
};
pub use dequant::{DequantKernels, DEQUANT_CHUNK, DEQUANT_THREADS};
pub use error::{mem_available_bytes, DriverCode, GpuError, TEST_MAX_ALLOC_ENV};
pub use flags::{
    DoneWords, FlagsKernels, FoldTarget, MailboxOffsets, FOLD_MAX_PARTS, FOLD_MAX_TARGETS,
};
pub use gemm::{gemm_available, gemm_f16, GemmShape};
pub use gemv::{
    Activation, ExpertSet, GemvConfig, GemvForm, GemvKernels, IdsInput, IdsShape, ReadKernel,
    RowRange, WeightLocation, WeightRef, GEMV_MAX_COLS, QX_BLOCK,
};
pub use launch::{LaunchArgs, MAX_LAUNCH_PARAMS};
pub use registry::{
    KernelRegistry, KernelSource, DEQUANT_SOURCE, F16_CUH, FLAGS_SOURCE, GEMV_SOURCE,
    KERNEL_CACHE_ENV, PLATFORM_CUH, READ_SOURCE,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parses_mem_available() {
        let text =
            "MemTotal:       131072 kB\nMemFree:          1000 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(error::parse_mem_available(text), Some(2048 * 1024));
        assert_eq!(error::parse_mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn row_range_len() {
        assert_eq!(RowRange::new(3, 10).len(), 7);
        assert!(RowRange::new(5, 5).is_empty());
        assert!(RowRange::new(6, 5).is_empty());
        assert_eq!(RowRange::all(9), RowRange::new(0, 9));
    }
}
