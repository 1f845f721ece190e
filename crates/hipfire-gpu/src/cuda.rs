//! CUDA backend over cudarc's raw (`sys`) and thin (`result`) driver layers, NVRTC for kernels.
//!
//! cudarc is built with `dynamic-loading`: libcuda and libnvrtc are opened at run time, so this
//! builds without a CUDA toolkit. Its loader panics when the library is absent, so
//! [`CudaBackend::new`] probes `is_culib_present()` first and answers [`GpuError::NoGpu`].

use crate::backend::{
    Backend, DeviceInfo, GemmF16, LaunchDims, RawEvent, RawFunction, RawGraph, RawModule, RawStream,
};
use crate::error::{mem_available_bytes, DriverCode, GpuError};
use cudarc::cublas::sys as cublas;
use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc;
use std::ffi::{c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

/// Converts a cudarc error into ours, keeping the driver's name and text for the code.
fn code(e: DriverError) -> DriverCode {
    DriverCode {
        backend: "cuda",
        code: e.0 as i64,
        name: e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        message: e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// Attaches the failing call's name to a driver result.
fn ck<T>(call: &'static str, r: Result<T, DriverError>) -> Result<T, GpuError> {
    r.map_err(|e| GpuError::Driver {
        call,
        source: code(e),
    })
}

/// Same for a bare `CUresult`.
fn ckr(call: &'static str, r: sys::CUresult) -> Result<(), GpuError> {
    ck(call, r.result())
}

/// One CUDA device's primary context.
#[derive(Debug)]
pub struct CudaBackend {
    /// Device ordinal, kept to release the primary context in `Drop`.
    device: sys::CUdevice,
    /// The primary context (shared with any other library in the process that uses it).
    ctx: sys::CUcontext,
    /// Facts read once at start.
    info: DeviceInfo,
    /// The cuBLAS handle, made on the first GEMM (libcublas is opened only by a batched step),
    /// or why it could not be. A handle is not safe for concurrent calls, hence the mutex.
    blas: OnceLock<Result<Mutex<BlasHandle>, String>>,
}

/// A cuBLAS handle on this backend's context.
#[derive(Debug)]
struct BlasHandle(cublas::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread, one at a time (the mutex above).
unsafe impl Send for BlasHandle {}

/// Converts a cuBLAS status to our error.
fn blas_ck(call: &'static str, r: cublas::cublasStatus_t) -> Result<(), GpuError> {
    if r == cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    Err(GpuError::Driver {
        call,
        source: DriverCode {
            backend: "cublas",
            code: r as i64,
            name: format!("{r:?}"),
            message: String::new(),
        },
    })
}

// SAFETY: a CUDA context handle may be used from any thread once made current there, which every
// method does first (`bind`); the handle itself is an immutable pointer after construction.
unsafe impl Send for CudaBackend {}
// SAFETY: as above; the driver API is thread-safe for concurrent calls on one context.
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    /// Opens device `ordinal`. `NoGpu` when libcuda is missing, fails to initialise, or the ordinal
    /// is not a device.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        // SAFETY: only tries to dlopen the library names; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoGpu {
                reason: "libcuda (the NVIDIA driver library) is not installed".into(),
            });
        }
        cu::init().map_err(|e| GpuError::NoGpu {
            reason: format!("cuInit failed: {}", code(e)),
        })?;
        let count = ck("cuDeviceGetCount", cu::device::get_count())?;
        if count <= 0 || ordinal >= count as usize {
            return Err(GpuError::NoGpu {
                reason: format!("device {ordinal} requested, {count} CUDA device(s) present"),
            });
        }
        let device = ck("cuDeviceGet", cu::device::get(ordinal as i32))?;
        // SAFETY: `device` came from cuDeviceGet.
        let ctx = unsafe { ck("cuDevicePrimaryCtxRetain", cu::primary_ctx::retain(device))? };
        // SAFETY: `ctx` was just retained.
        unsafe { ck("cuCtxSetCurrent", cu::ctx::set_current(ctx))? };
        let attr = |a| {
            // SAFETY: `device` came from cuDeviceGet.
            ck("cuDeviceGetAttribute", unsafe {
                cu::device::get_attribute(device, a)
            })
        };
        use sys::CUdevice_attribute as A;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let name = ck("cuDeviceGetName", cu::device::get_name(device))?;
        // SAFETY: `device` came from cuDeviceGet.
        let total_mem = ck("cuDeviceTotalMem", unsafe { cu::device::total_mem(device) })? as u64;
        let info = DeviceInfo {
            name,
            arch: format!("sm_{major}{minor}"),
            multiprocessors: sms.max(1) as u32,
            total_mem,
        };
        Ok(CudaBackend {
            device,
            ctx,
            info,
            blas: OnceLock::new(),
        })
    }

    /// Makes this context current on the calling thread (cheap when it already is).
    fn bind(&self) -> Result<(), GpuError> {
        let cur = ck("cuCtxGetCurrent", cu::ctx::get_current())?;
        if cur != Some(self.ctx) {
            // SAFETY: `self.ctx` is retained until `Drop`.
            unsafe { ck("cuCtxSetCurrent", cu::ctx::set_current(self.ctx))? };
        }
        Ok(())
    }
}

/// Folders a CUDA toolkit keeps its libraries in, searched (after the loader's own path) for
/// libraries cudarc opens by name: `$CUDA_HOME` / `$CUDA_PATH`, then the default install.
fn cuda_lib_dirs() -> Vec<std::path::PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            let root = std::path::PathBuf::from(root);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("targets/x86_64-linux/lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    dirs
}

/// Makes `sonames` loadable by name (how cudarc opens them) when the loader's path lacks them but
/// a CUDA folder holds them: each is opened by its full path, in order (dependencies first), and
/// kept open for the life of the process, so a later `dlopen` of the bare name finds it loaded.
/// Returns whether the last one is loadable.
fn preload_cuda_libs(sonames: &[&str]) -> bool {
    // SAFETY: opening a shared library runs its initialisers; these are NVIDIA's CUDA libraries,
    // the same cudarc itself opens.
    let by_name = |n: &str| unsafe { libloading::Library::new(n) }.is_ok();
    if sonames.last().is_some_and(|n| by_name(n)) {
        return true;
    }
    for dir in cuda_lib_dirs() {
        let all = sonames.iter().all(|n| {
            let path = dir.join(n);
            // SAFETY: as above.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    // Kept loaded for the process: cudarc's own handle refers to it by name.
                    std::mem::forget(lib);
                    true
                }
                Err(_) => false,
            }
        });
        if all {
            tracing::debug!(dir = %dir.display(), "CUDA libraries loaded from the toolkit folder");
            return true;
        }
    }
    false
}

/// The cuBLAS libraries, dependency first, as CUDA 13 names them.
const CUBLAS_SONAMES: [&str; 2] = ["libcublasLt.so.13", "libcublas.so.13"];

impl CudaBackend {
    /// The cuBLAS handle, created on first use (with this context current).
    fn blas(&self) -> Result<&Mutex<BlasHandle>, GpuError> {
        let made = self.blas.get_or_init(|| {
            // SAFETY: only tries to dlopen the library names; no symbol is called.
            if !preload_cuda_libs(&CUBLAS_SONAMES) || !unsafe { cublas::is_culib_present() } {
                return Err(format!(
                    "libcublas.so.13 was found neither on the library path nor in {}",
                    cuda_lib_dirs()
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            self.bind().map_err(|e| e.to_string())?;
            let mut h: cublas::cublasHandle_t = std::ptr::null_mut();
            // SAFETY: `h` is a valid out-pointer; the context is current.
            blas_ck("cublasCreate_v2", unsafe {
                cublas::cublasCreate_v2(&mut h)
            })
            .map_err(|e| e.to_string())?;
            Ok(Mutex::new(BlasHandle(h)))
        });
        made.as_ref().map_err(|why| GpuError::NoBlas {
            backend: "cuda",
            why: why.clone(),
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Some(Ok(h)) = self.blas.take() {
            let h = h.into_inner().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the handle was made by cublasCreate on this context, which is still alive.
            if let Err(e) = blas_ck("cublasDestroy_v2", unsafe { cublas::cublasDestroy_v2(h.0) }) {
                tracing::warn!(cause = %e, "cublasDestroy failed");
            }
        }
        // SAFETY: balances the retain in `new`; every object holding this backend (streams, buffers,
        // modules) holds an `Arc` to it, so none outlives it.
        if let Err(e) = unsafe { cu::primary_ctx::release(self.device) } {
            tracing::warn!(cause = %code(e), "cuDevicePrimaryCtxRelease failed");
        }
    }
}

fn nvrtc_err(call: &'static str, r: nvrtc::nvrtcResult) -> GpuError {
    // SAFETY: nvrtcGetErrorString returns a static C string for any code.
    let msg = unsafe { CStr::from_ptr(nvrtc::nvrtcGetErrorString(r)) }
        .to_string_lossy()
        .into_owned();
    GpuError::Driver {
        call,
        source: DriverCode {
            backend: "nvrtc",
            code: r as i64,
            name: format!("{r:?}"),
            message: msg,
        },
    }
}

fn nck(call: &'static str, r: nvrtc::nvrtcResult) -> Result<(), GpuError> {
    if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(nvrtc_err(call, r))
    }
}

/// Compiles with NVRTC to a CUBIN for `arch` (e.g. `sm_90`). Needs only libnvrtc, no device, so
/// kernels can be checked on a machine without a GPU.
pub fn nvrtc_compile(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
    options: &[String],
) -> Result<Vec<u8>, GpuError> {
    // SAFETY: only tries to dlopen the library names.
    if !unsafe { nvrtc::is_culib_present() } {
        return Err(GpuError::NoGpu {
            reason: "libnvrtc (the CUDA run-time compiler) is not installed".into(),
        });
    }
    let cstr = |s: &str, what: &str| {
        CString::new(s).map_err(|_| GpuError::Compile {
            module: name.into(),
            arch: arch.into(),
            log: format!("{what} contains a NUL byte"),
        })
    };
    let src = cstr(source, "source")?;
    let cname = cstr(name, "name")?;
    let hsrc: Vec<CString> = headers
        .iter()
        .map(|(_, t)| cstr(t, "header"))
        .collect::<Result<_, _>>()?;
    let hname: Vec<CString> = headers
        .iter()
        .map(|(n, _)| cstr(n, "header name"))
        .collect::<Result<_, _>>()?;
    let hsrc_p: Vec<*const std::ffi::c_char> = hsrc.iter().map(|c| c.as_ptr()).collect();
    let hname_p: Vec<*const std::ffi::c_char> = hname.iter().map(|c| c.as_ptr()).collect();
    let mut opts: Vec<CString> = vec![cstr(&format!("--gpu-architecture={arch}"), "option")?];
    for o in options {
        opts.push(cstr(o, "option")?);
    }
    let opts_p: Vec<*const std::ffi::c_char> = opts.iter().map(|c| c.as_ptr()).collect();
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string owned above, counts match the arrays.
    unsafe {
        nck(
            "nvrtcCreateProgram",
            nvrtc::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                hsrc_p.len() as i32,
                hsrc_p.as_ptr(),
                hname_p.as_ptr(),
            ),
        )?;
    }
    // SAFETY: `prog` was created above and is destroyed once at the end of this block.
    let out = unsafe {
        let rc = nvrtc::nvrtcCompileProgram(prog, opts_p.len() as i32, opts_p.as_ptr());
        let mut log_len = 0usize;
        let log = if nvrtc::nvrtcGetProgramLogSize(prog, &mut log_len)
            == nvrtc::nvrtcResult::NVRTC_SUCCESS
            && log_len > 1
        {
            let mut buf = vec![0u8; log_len];
            let _ = nvrtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast());
            String::from_utf8_lossy(&buf[..log_len - 1]).into_owned()
        } else {
            String::new()
        };
        if rc != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            Err(GpuError::Compile {
                module: name.into(),
                arch: arch.into(),
                log: format!("{rc:?}\n{log}"),
            })
        } else {
            let mut n = 0usize;
            match nck("nvrtcGetCUBINSize", nvrtc::nvrtcGetCUBINSize(prog, &mut n)) {
                Err(e) => Err(e),
                Ok(()) => {
                    let mut bin = vec![0u8; n];
                    nck(
                        "nvrtcGetCUBIN",
                        nvrtc::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast()),
                    )
                    .map(|()| bin)
                }
            }
        }
    };
    // SAFETY: `prog` is live and destroyed exactly once.
    let _ = unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    out
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        ck("cuCtxSynchronize", cu::ctx::synchronize())
    }
    fn mem_info(&self) -> Result<(u64, u64), GpuError> {
        self.bind()?;
        let (free, total) = ck("cuMemGetInfo", cu::mem_get_info())?;
        Ok((free as u64, total as u64))
    }
    fn stream_create(&self) -> Result<RawStream, GpuError> {
        self.bind()?;
        let s = ck(
            "cuStreamCreate",
            cu::stream::create(cu::stream::StreamKind::NonBlocking),
        )?;
        Ok(RawStream(s as u64))
    }
    fn stream_destroy(&self, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: `s` is a stream of this context owned by the caller's `Stream`, destroyed once.
        ck("cuStreamDestroy", unsafe {
            cu::stream::destroy(s.0 as sys::CUstream)
        })
    }
    fn stream_synchronize(&self, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: `s` is a live stream of this context.
        ck("cuStreamSynchronize", unsafe {
            cu::stream::synchronize(s.0 as sys::CUstream)
        })
    }
    fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: both handles are live objects of this context.
        ck("cuStreamWaitEvent", unsafe {
            cu::stream::wait_event(
                s.0 as sys::CUstream,
                e.0 as sys::CUevent,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    }

    fn event_create(&self) -> Result<RawEvent, GpuError> {
        self.bind()?;
        let e = ck(
            "cuEventCreate",
            cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )?;
        Ok(RawEvent(e as u64))
    }
    fn event_destroy(&self, e: RawEvent) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: `e` is owned by the caller's `Event` and destroyed once.
        ck("cuEventDestroy", unsafe {
            cu::event::destroy(e.0 as sys::CUevent)
        })
    }
    fn event_record(&self, e: RawEvent, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: live handles of this context.
        ck("cuEventRecord", unsafe {
            cu::event::record(e.0 as sys::CUevent, s.0 as sys::CUstream)
        })
    }
    fn event_synchronize(&self, e: RawEvent) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: live handle of this context.
        ck("cuEventSynchronize", unsafe {
            cu::event::synchronize(e.0 as sys::CUevent)
        })
    }
    fn event_query(&self, e: RawEvent) -> Result<bool, GpuError> {
        self.bind()?;
        // SAFETY: live handle of this context.
        match unsafe { cu::event::query(e.0 as sys::CUevent) } {
            Ok(()) => Ok(true),
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => ck("cuEventQuery", Err(e)),
        }
    }
    fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32, GpuError> {
        self.bind()?;
        // SAFETY: live handles of this context.
        ck("cuEventElapsedTime", unsafe {
            cu::event::elapsed(start.0 as sys::CUevent, end.0 as sys::CUevent)
        })
    }

    fn mem_alloc(&self, bytes: usize) -> Result<u64, GpuError> {
        self.bind()?;
        // SAFETY: plain allocation; the memory is uninitialised and only ever used as bytes.
        unsafe { cu::malloc_sync(bytes.max(1)) }.map_err(|e| {
            let info = cu::mem_get_info().ok();
            GpuError::DeviceAlloc {
                requested: bytes,
                free: info.map(|(f, _)| f as u64),
                total: info.map(|(_, t)| t as u64),
                driver: code(e),
            }
        })
    }
    unsafe fn mem_free(&self, ptr: u64) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ck("cuMemFree", unsafe { cu::free_sync(ptr) })
    }
    fn host_alloc_mapped(&self, bytes: usize) -> Result<(*mut u8, u64), GpuError> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: plain allocation; the bytes are zeroed by the caller before any read.
        let host =
            unsafe { cu::malloc_host(bytes.max(1), flags) }.map_err(|e| GpuError::HostAlloc {
                requested: bytes,
                mem_available: mem_available_bytes(),
                source: code(e),
            })?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a live DEVICEMAP allocation; `dptr` is a valid out-pointer.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) };
        if let Err(e) = ckr("cuMemHostGetDevicePointer", r) {
            // SAFETY: `host` came from malloc_host above and is not used again.
            let _ = unsafe { cu::free_host(host) };
            return Err(e);
        }
        Ok((host.cast(), dptr))
    }
    unsafe fn host_free(&self, ptr: *mut u8) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ck("cuMemFreeHost", unsafe { cu::free_host(ptr.cast()) })
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        bytes: usize,
        s: RawStream,
    ) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ckr("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, s.0 as sys::CUstream)
        })
    }
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        bytes: usize,
        s: RawStream,
    ) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ckr("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, s.0 as sys::CUstream)
        })
    }
    unsafe fn memset_d32_async(
        &self,
        dst: u64,
        value: u32,
        count: usize,
        s: RawStream,
    ) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ckr("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(dst, value, count, s.0 as sys::CUstream)
        })
    }

    fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<Vec<u8>, GpuError> {
        nvrtc_compile(name, source, headers, &self.info.arch, options)
    }
    fn module_load(&self, image: &[u8]) -> Result<RawModule, GpuError> {
        self.bind()?;
        // SAFETY: `image` is a CUBIN from NVRTC (or the cache, which stores exactly those bytes);
        // the driver validates the image and copies it.
        let m = ck("cuModuleLoadData", unsafe {
            cu::module::load_data(image.as_ptr().cast())
        })?;
        Ok(RawModule(m as u64))
    }
    unsafe fn module_unload(&self, m: RawModule) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ck("cuModuleUnload", unsafe {
            cu::module::unload(m.0 as sys::CUmodule)
        })
    }
    fn module_function(&self, m: RawModule, name: &str) -> Result<RawFunction, GpuError> {
        self.bind()?;
        let cname = CString::new(name).map_err(|_| GpuError::Driver {
            call: "cuModuleGetFunction",
            source: DriverCode {
                backend: "cuda",
                code: -1,
                name: "NUL in name".into(),
                message: name.into(),
            },
        })?;
        // SAFETY: `m` is a live module of this context.
        let f = ck("cuModuleGetFunction", unsafe {
            cu::module::get_function(m.0 as sys::CUmodule, cname)
        })?;
        Ok(RawFunction(f as u64))
    }

    unsafe fn launch(
        &self,
        f: RawFunction,
        dims: LaunchDims,
        s: RawStream,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ck("cuLaunchKernel", unsafe {
            cu::launch_kernel(
                f.0 as sys::CUfunction,
                (dims.grid, 1, 1),
                (dims.block, 1, 1),
                dims.shared_bytes,
                s.0 as sys::CUstream,
                params,
            )
        })
    }

    fn has_graphs(&self) -> bool {
        true
    }

    fn stream_begin_capture(&self, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // Thread-local mode: only this thread's unsafe calls (a synchronize, an allocation)
        // invalidate the capture; the CPU pool's threads make no CUDA calls, and other streams'
        // users are not affected.
        // SAFETY: `s` is a live stream of this context.
        ckr("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                s.0 as sys::CUstream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    fn stream_end_capture(&self, s: RawStream) -> Result<RawGraph, GpuError> {
        self.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: `s` is a live stream of this context; `graph` receives the captured graph (null
        // when the capture was invalidated, which the call then reports).
        ckr("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(s.0 as sys::CUstream, &mut graph)
        })?;
        if graph.is_null() {
            return Err(GpuError::Invalid {
                what: "stream capture",
                rule: "ended with no graph (nothing was captured)",
            });
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` was just made by the capture; the executable graph is independent of
        // it, so it is destroyed right after, whatever the instantiation returned.
        let made = ckr("cuGraphInstantiate", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        });
        // SAFETY: `graph` is ours and destroyed once.
        let freed = ckr("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph) });
        made?;
        freed?;
        Ok(RawGraph(exec as u64))
    }

    unsafe fn graph_launch(&self, g: RawGraph, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        ckr("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(g.0 as sys::CUgraphExec, s.0 as sys::CUstream)
        })
    }

    fn graph_destroy(&self, g: RawGraph) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: `g` is owned by the caller's `Graph` and destroyed once.
        ckr("cuGraphExecDestroy", unsafe {
            sys::cuGraphExecDestroy(g.0 as sys::CUgraphExec)
        })
    }

    fn has_gemm(&self) -> bool {
        self.blas().is_ok()
    }

    unsafe fn gemm_f16(&self, s: RawStream, g: &GemmF16) -> Result<(), GpuError> {
        let int = |v: usize, what: &'static str| {
            i32::try_from(v).map_err(|_| GpuError::Invalid {
                what,
                rule: "must fit cuBLAS's 32-bit dimensions",
            })
        };
        let (m, n, k, ldy) = (
            int(g.m, "GEMM m")?,
            int(g.n, "GEMM n")?,
            int(g.k, "GEMM k")?,
            int(g.ldy, "GEMM ldy")?,
        );
        let blas = self.blas()?;
        let h = blas.lock().unwrap_or_else(|p| p.into_inner());
        self.bind()?;
        let alpha = 1.0f32;
        let beta = if g.accumulate { 1.0f32 } else { 0.0f32 };
        use cublas::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        use cublas::cudaDataType_t::{CUDA_R_16F, CUDA_R_32F};
        // Column-major view: y (n × ldy row-major) is C = m × n with ldc = ldy; w (m × k
        // row-major) is a k × m column-major matrix used transposed; x (n × k row-major) is
        // k × n column-major.
        // SAFETY: the handle is ours and locked; the addresses are the caller's duty (trait doc);
        // alpha/beta live across the call (host pointer mode, read before return).
        unsafe {
            blas_ck(
                "cublasSetStream_v2",
                cublas::cublasSetStream_v2(h.0, s.0 as cublas::cudaStream_t),
            )?;
            blas_ck(
                "cublasGemmEx",
                cublas::cublasGemmEx(
                    h.0,
                    CUBLAS_OP_T,
                    CUBLAS_OP_N,
                    m,
                    n,
                    k,
                    (&alpha as *const f32).cast(),
                    g.w as *const c_void,
                    CUDA_R_16F,
                    k,
                    g.x as *const c_void,
                    CUDA_R_16F,
                    k,
                    (&beta as *const f32).cast(),
                    g.y as *mut c_void,
                    CUDA_R_32F,
                    ldy,
                    cublas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{DEQUANT_SOURCE, FLAGS_SOURCE, GEMV_SOURCE, READ_SOURCE};

    /// Compiles every kernel source (gemv, read, flags, dequant) for sm_90 wherever libnvrtc is installed (no GPU needed) and
    /// checks each kernel the launchers look up is in the image. Skips, saying so, without NVRTC.
    #[test]
    fn kernels_compile_for_sm90_with_nvrtc() {
        // SAFETY: only tries to dlopen the library names.
        if !unsafe { nvrtc::is_culib_present() } {
            // CI installs NVRTC and sets this, so a lost library fails instead of skipping.
            assert!(
                std::env::var("HIPFIRE_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "HIPFIRE_REQUIRE_NVRTC=1 but libnvrtc was not found"
            );
            println!("skipped: libnvrtc not found");
            return;
        }
        for src in [GEMV_SOURCE, READ_SOURCE, FLAGS_SOURCE, DEQUANT_SOURCE] {
            let image = nvrtc_compile(src.name, src.source, src.headers, "sm_90", &[])
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                image.starts_with(b"\x7fELF"),
                "{}: CUBIN is an ELF image",
                src.name
            );
            let names: Vec<String> = if src.name == "read.cu" {
                vec!["read_sum".into()]
            } else if src.name == "flags.cu" {
                vec![
                    "flags_publish".into(),
                    "flags_publish_tagged".into(),
                    "flags_wait_fold".into(),
                ]
            } else if src.name == "dequant.cu" {
                hipfire_quant::Format::ALL
                    .into_iter()
                    .filter(|f| f.has_gpu_kernel())
                    .map(crate::dequant::dequant_kernel_name)
                    .chain(["convert_f32_to_f16".to_string()])
                    .collect()
            } else {
                let mut v = vec!["quantize_x_q8".to_string()];
                for f in hipfire_quant::Format::ALL
                    .into_iter()
                    .filter(|f| f.has_gpu_kernel())
                {
                    for form in ["plain", "residual"] {
                        for w in [16, 4, 2] {
                            v.push(format!("gemv_{}_{form}_v{w}", f.name()));
                            v.push(format!("gemv_{}_{form}_v{w}_cols", f.name()));
                        }
                    }
                    for w in [16, 4, 2] {
                        v.push(format!("gemv_{}_plain_v{w}_ids", f.name()));
                    }
                }
                v
            };
            for n in names {
                let needle = format!("{n}\0");
                assert!(
                    image.windows(needle.len()).any(|w| w == needle.as_bytes()),
                    "{}: kernel {n} missing",
                    src.name
                );
            }
        }
        let e = nvrtc_compile(
            "bad.cu",
            "extern \"C\" __global__ void f() { undefined_thing(); }",
            &[],
            "sm_90",
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(&e, GpuError::Compile { log, .. } if log.contains("undefined_thing")),
            "{e}"
        );
    }
}
