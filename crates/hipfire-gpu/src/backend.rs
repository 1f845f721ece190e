//! The backend surface: what a GPU runtime must provide for hipfire.
//!
//! This is the "thin layer where every call returns `Result`" of cudarc's three-layer design, in
//! object-safe form: raw handles are plain integers, so one set of owned safe types ([`crate::Context`],
//! [`crate::Stream`], [`crate::Event`], [`crate::DeviceBuffer`], [`crate::HostMappedBuffer`],
//! [`crate::Module`]) sits over `Arc<dyn Backend>` for CUDA and HIP alike. Calls that could touch
//! memory the caller must keep alive are `unsafe fn`, each with its duty in `# Safety`.

use crate::GpuError;
use std::ffi::c_void;

/// A stream handle (`CUstream` / `hipStream_t` as an integer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStream(pub u64);
/// An event handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent(pub u64);
/// A loaded module handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawModule(pub u64);
/// A kernel function handle inside a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFunction(pub u64);
/// An instantiated graph handle (`CUgraphExec` / `hipGraphExec_t`): captured stream work,
/// replayed by one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawGraph(pub u64);

/// Static facts about the device a backend drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Marketing name.
    pub name: String,
    /// Compiler target (`sm_90`, `gfx90a`): kernels are compiled for exactly this.
    pub arch: String,
    /// Streaming multiprocessors / compute units (sizes persistent grids).
    pub multiprocessors: u32,
    /// Device memory in bytes.
    pub total_mem: u64,
}

/// Launch geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x.
    pub grid: u32,
    /// Threads per block in x.
    pub block: u32,
    /// Dynamic shared memory bytes.
    pub shared_bytes: u32,
}

/// One dense GEMM of a batched step, row-major as the model holds its tensors:
/// `y[t][r] (+)= Σ_i w[r][i] · x[t][i]` for `t < n`, `r < m`, `i < k`, with `w` (`[m][k]`) and `x`
/// (`[n][k]`) f16 and `y` (`[n][ldy]`, `ldy ≥ m`) f32; products accumulate in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmF16 {
    /// Output columns (the weight's rows).
    pub m: usize,
    /// Tokens (rows of `x` and `y`).
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// Device address of `w`.
    pub w: u64,
    /// Device address of `x`.
    pub x: u64,
    /// Device address of `y`.
    pub y: u64,
    /// Elements between consecutive rows of `y`.
    pub ldy: usize,
    /// `y += …` instead of `y = …`.
    pub accumulate: bool,
}

/// One GPU runtime bound to one device. Implemented by the CUDA backend (cudarc) and, behind the
/// `hip` feature, by a runtime-loaded HIP backend. Every method makes the backend's context current
/// on the calling thread first, so any thread may call it.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// "cuda" or "hip".
    fn name(&self) -> &'static str;
    /// Facts about the device.
    fn info(&self) -> &DeviceInfo;

    /// Blocks until all work queued on the device by this context is done.
    fn synchronize(&self) -> Result<(), GpuError>;
    /// `(free, total)` device memory in bytes, as the driver sees it now (other processes'
    /// allocations included).
    fn mem_info(&self) -> Result<(u64, u64), GpuError>;
    /// Creates a non-blocking stream.
    fn stream_create(&self) -> Result<RawStream, GpuError>;
    /// Destroys a stream (pending work still completes).
    fn stream_destroy(&self, s: RawStream) -> Result<(), GpuError>;
    /// Blocks until all work on `s` is done.
    fn stream_synchronize(&self, s: RawStream) -> Result<(), GpuError>;
    /// Makes future work on `s` wait until `e` has completed.
    fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<(), GpuError>;

    /// Creates a timing-capable event.
    fn event_create(&self) -> Result<RawEvent, GpuError>;
    /// Destroys an event.
    fn event_destroy(&self, e: RawEvent) -> Result<(), GpuError>;
    /// Records `e` on `s`.
    fn event_record(&self, e: RawEvent, s: RawStream) -> Result<(), GpuError>;
    /// Blocks until `e` has completed.
    fn event_synchronize(&self, e: RawEvent) -> Result<(), GpuError>;
    /// Whether `e` has completed (never blocks).
    fn event_query(&self, e: RawEvent) -> Result<bool, GpuError>;
    /// Milliseconds between two completed events.
    fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32, GpuError>;

    /// Allocates `bytes` of device memory; returns its device address.
    fn mem_alloc(&self, bytes: usize) -> Result<u64, GpuError>;
    /// Frees device memory.
    ///
    /// # Safety
    /// `ptr` came from [`Backend::mem_alloc`] of this backend, is freed once, and no queued work uses it.
    unsafe fn mem_free(&self, ptr: u64) -> Result<(), GpuError>;
    /// Allocates pinned host memory mapped into the device's address space (portable, not
    /// write-combined: the CPU reads it too). Returns the host pointer and the device address.
    fn host_alloc_mapped(&self, bytes: usize) -> Result<(*mut u8, u64), GpuError>;
    /// Frees memory from [`Backend::host_alloc_mapped`].
    ///
    /// # Safety
    /// `ptr` came from `host_alloc_mapped` of this backend, is freed once, and nothing uses it.
    unsafe fn host_free(&self, ptr: *mut u8) -> Result<(), GpuError>;

    /// Queues a host → device copy.
    ///
    /// # Safety
    /// `src..src+bytes` stays valid and unchanged and `dst..dst+bytes` is device-accessible memory
    /// until the copy completes on `s`.
    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        bytes: usize,
        s: RawStream,
    ) -> Result<(), GpuError>;
    /// Queues a device → host copy.
    ///
    /// # Safety
    /// `dst..dst+bytes` stays valid and is not otherwise accessed, and `src..src+bytes` stays
    /// allocated, until the copy completes on `s`.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        bytes: usize,
        s: RawStream,
    ) -> Result<(), GpuError>;
    /// Queues a fill of `count` 32-bit words at `dst` with `value`.
    ///
    /// # Safety
    /// `dst..dst+4*count` is device-accessible memory that stays allocated until the fill completes.
    unsafe fn memset_d32_async(
        &self,
        dst: u64,
        value: u32,
        count: usize,
        s: RawStream,
    ) -> Result<(), GpuError>;

    /// Compiles one source (with its headers as `(name, text)`) to a loadable image for this device.
    fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<Vec<u8>, GpuError>;
    /// Loads an image from [`Backend::compile`].
    fn module_load(&self, image: &[u8]) -> Result<RawModule, GpuError>;
    /// Unloads a module.
    ///
    /// # Safety
    /// No queued or future launch uses a function of `m`.
    unsafe fn module_unload(&self, m: RawModule) -> Result<(), GpuError>;
    /// Looks a kernel up by its `extern "C"` name.
    fn module_function(&self, m: RawModule, name: &str) -> Result<RawFunction, GpuError>;

    /// Queues a kernel launch. The one `unsafe` launch of the backend.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each pointing at a value of exactly the
    /// kernel's parameter type; every device address among them is valid for everything the kernel
    /// reads or writes with these dims, and stays so until the launch completes on `s`.
    unsafe fn launch(
        &self,
        f: RawFunction,
        dims: LaunchDims,
        s: RawStream,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError>;

    /// Whether stream capture and graph replay ([`Backend::stream_begin_capture`] and the rest)
    /// are bound here.
    fn has_graphs(&self) -> bool {
        false
    }

    /// Starts capturing the work this thread queues on `s` into a graph instead of running it
    /// (other threads' calls are not affected). Backends without graphs answer
    /// [`GpuError::NoGraphs`].
    fn stream_begin_capture(&self, s: RawStream) -> Result<(), GpuError> {
        let _ = s;
        Err(GpuError::NoGraphs {
            backend: self.name(),
        })
    }

    /// Ends the capture begun on `s` (always, also when it fails) and instantiates what it
    /// recorded. Fails if any captured call failed or was not capturable.
    fn stream_end_capture(&self, s: RawStream) -> Result<RawGraph, GpuError> {
        let _ = s;
        Err(GpuError::NoGraphs {
            backend: self.name(),
        })
    }

    /// Queues one replay of `g` on `s`.
    ///
    /// # Safety
    /// Every address the captured work reads or writes is still valid, with the sizes it had at
    /// capture, and stays so until the replay completes on `s`.
    unsafe fn graph_launch(&self, g: RawGraph, s: RawStream) -> Result<(), GpuError> {
        let _ = (g, s);
        Err(GpuError::NoGraphs {
            backend: self.name(),
        })
    }

    /// Frees `g` (owned by the caller's [`crate::Graph`], destroyed once).
    fn graph_destroy(&self, g: RawGraph) -> Result<(), GpuError> {
        let _ = g;
        Err(GpuError::NoGraphs {
            backend: self.name(),
        })
    }

    /// Whether [`Backend::gemm_f16`] can run here (its library is present); asked once by callers
    /// that pick between a GEMM and a per-token fallback.
    fn has_gemm(&self) -> bool {
        false
    }

    /// Queues one [`GemmF16`] on `s` (vendor BLAS: cuBLAS on CUDA). Backends without one answer
    /// [`GpuError::NoBlas`].
    ///
    /// # Safety
    /// `g`'s three addresses are valid device memory for the extents it states (checked by the
    /// safe wrapper [`crate::gemm_f16`]) and stay so until the GEMM completes on `s`.
    unsafe fn gemm_f16(&self, s: RawStream, g: &GemmF16) -> Result<(), GpuError> {
        let _ = (s, g);
        Err(GpuError::NoBlas {
            backend: self.name(),
            why: "this backend has no vendor BLAS binding".into(),
        })
    }
}
