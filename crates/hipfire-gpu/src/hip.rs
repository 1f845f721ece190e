//! HIP backend (feature `hip`): the same [`Backend`] surface over AMD's HIP runtime and hiprtc,
//! loaded at run time with `libloading`, so the crate builds without ROCm installed.
//!
//! **Untested on AMD hardware.** It compiles (`cargo check -p hipfire-gpu --features hip`) and
//! follows the HIP runtime API as documented, but no part of it has run on a GPU: treat any result
//! from it as unverified until the GPU test tier has passed on an AMD device. Known gaps: the
//! kernels assume 32-wide warps (wave64 devices need a port of the warp reductions), the target
//! architecture comes from `HIPFIRE_HIP_ARCH` (e.g. `gfx90a`) or else `gfx{major}{minor}0` from
//! `hipDeviceComputeCapability`, and the compute-unit count from `HIPFIRE_HIP_CUS` (else
//! [`DEFAULT_CUS`]), because `hipDeviceGetAttribute`'s enum values differ between ROCm releases.

use crate::backend::{
    Backend, DeviceInfo, LaunchDims, RawEvent, RawFunction, RawModule, RawStream,
};
use crate::error::{mem_available_bytes, DriverCode, GpuError};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

/// Compute units assumed when `HIPFIRE_HIP_CUS` is unset (an MI210 has 104; only the read
/// kernel's grid size depends on it).
pub const DEFAULT_CUS: u32 = 104;
/// `hipHostMallocPortable | hipHostMallocMapped` (hip_runtime_api.h; same bits as CUDA's).
const HOST_MALLOC_PORTABLE_MAPPED: c_uint = 0x1 | 0x2;
/// `hipStreamNonBlocking`.
const STREAM_NON_BLOCKING: c_uint = 0x1;

type E = c_int;
/// `hipErrorNotReady`: an event or stream query's "not yet".
const HIP_ERROR_NOT_READY: E = 600;
type Ptr = *mut c_void;

/// Function pointers resolved from libamdhip64 and libhiprtc.
struct Api {
    get_error_name: unsafe extern "C" fn(E) -> *const c_char,
    get_error_string: unsafe extern "C" fn(E) -> *const c_char,
    init: unsafe extern "C" fn(c_uint) -> E,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> E,
    set_device: unsafe extern "C" fn(c_int) -> E,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> E,
    device_compute_capability: unsafe extern "C" fn(*mut c_int, *mut c_int, c_int) -> E,
    device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> E,
    device_synchronize: unsafe extern "C" fn() -> E,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> E,
    stream_create_with_flags: unsafe extern "C" fn(*mut Ptr, c_uint) -> E,
    stream_destroy: unsafe extern "C" fn(Ptr) -> E,
    stream_synchronize: unsafe extern "C" fn(Ptr) -> E,
    stream_wait_event: unsafe extern "C" fn(Ptr, Ptr, c_uint) -> E,
    event_create: unsafe extern "C" fn(*mut Ptr) -> E,
    event_destroy: unsafe extern "C" fn(Ptr) -> E,
    event_record: unsafe extern "C" fn(Ptr, Ptr) -> E,
    event_synchronize: unsafe extern "C" fn(Ptr) -> E,
    event_query: unsafe extern "C" fn(Ptr) -> E,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, Ptr, Ptr) -> E,
    malloc: unsafe extern "C" fn(*mut Ptr, usize) -> E,
    free: unsafe extern "C" fn(Ptr) -> E,
    host_malloc: unsafe extern "C" fn(*mut Ptr, usize, c_uint) -> E,
    host_free: unsafe extern "C" fn(Ptr) -> E,
    host_get_device_pointer: unsafe extern "C" fn(*mut Ptr, Ptr, c_uint) -> E,
    memcpy_htod_async: unsafe extern "C" fn(Ptr, *const c_void, usize, Ptr) -> E,
    memcpy_dtoh_async: unsafe extern "C" fn(Ptr, Ptr, usize, Ptr) -> E,
    memset_d32_async: unsafe extern "C" fn(Ptr, c_int, usize, Ptr) -> E,
    module_load_data: unsafe extern "C" fn(*mut Ptr, *const c_void) -> E,
    module_unload: unsafe extern "C" fn(Ptr) -> E,
    module_get_function: unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> E,
    #[allow(clippy::type_complexity)]
    module_launch_kernel: unsafe extern "C" fn(
        Ptr,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Ptr,
        *mut Ptr,
        *mut Ptr,
    ) -> E,
    rtc_create_program: unsafe extern "C" fn(
        *mut Ptr,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> E,
    rtc_compile_program: unsafe extern "C" fn(Ptr, c_int, *const *const c_char) -> E,
    rtc_get_program_log_size: unsafe extern "C" fn(Ptr, *mut usize) -> E,
    rtc_get_program_log: unsafe extern "C" fn(Ptr, *mut c_char) -> E,
    rtc_get_code_size: unsafe extern "C" fn(Ptr, *mut usize) -> E,
    rtc_get_code: unsafe extern "C" fn(Ptr, *mut c_char) -> E,
    rtc_destroy_program: unsafe extern "C" fn(*mut Ptr) -> E,
    rtc_get_error_string: unsafe extern "C" fn(E) -> *const c_char,
    /// Keeps the libraries mapped while the pointers above are in use.
    _libs: (Library, Library),
}

fn open_first(names: &[&str]) -> Result<Library, GpuError> {
    let mut last = String::new();
    for n in names {
        // SAFETY: loading a vendor runtime library runs its initialisers, which is what using the
        // runtime requires anyway; nothing else is executed here.
        match unsafe { Library::new(n) } {
            Ok(l) => return Ok(l),
            Err(e) => last = e.to_string(),
        }
    }
    Err(GpuError::NoGpu {
        reason: format!("none of {names:?} could be loaded ({last})"),
    })
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is a C function whose signature (the field's type, which this
        // expression is inferred to) is taken from hip_runtime_api.h / hiprtc.h; the library
        // outlives the copied pointer (kept in `_libs`).
        let s =
            unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| GpuError::NoGpu {
                reason: format!("HIP symbol {} missing: {e}", $name),
            })?;
        *s
    }};
}

impl Api {
    fn load() -> Result<Api, GpuError> {
        let hip = open_first(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])?;
        let rtc = open_first(&["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"])?;
        Ok(Api {
            get_error_name: sym!(hip, "hipGetErrorName"),
            get_error_string: sym!(hip, "hipGetErrorString"),
            init: sym!(hip, "hipInit"),
            get_device_count: sym!(hip, "hipGetDeviceCount"),
            set_device: sym!(hip, "hipSetDevice"),
            device_get_name: sym!(hip, "hipDeviceGetName"),
            device_compute_capability: sym!(hip, "hipDeviceComputeCapability"),
            device_total_mem: sym!(hip, "hipDeviceTotalMem"),
            device_synchronize: sym!(hip, "hipDeviceSynchronize"),
            mem_get_info: sym!(hip, "hipMemGetInfo"),
            stream_create_with_flags: sym!(hip, "hipStreamCreateWithFlags"),
            stream_destroy: sym!(hip, "hipStreamDestroy"),
            stream_synchronize: sym!(hip, "hipStreamSynchronize"),
            stream_wait_event: sym!(hip, "hipStreamWaitEvent"),
            event_create: sym!(hip, "hipEventCreate"),
            event_destroy: sym!(hip, "hipEventDestroy"),
            event_record: sym!(hip, "hipEventRecord"),
            event_synchronize: sym!(hip, "hipEventSynchronize"),
            event_query: sym!(hip, "hipEventQuery"),
            event_elapsed_time: sym!(hip, "hipEventElapsedTime"),
            malloc: sym!(hip, "hipMalloc"),
            free: sym!(hip, "hipFree"),
            host_malloc: sym!(hip, "hipHostMalloc"),
            host_free: sym!(hip, "hipHostFree"),
            host_get_device_pointer: sym!(hip, "hipHostGetDevicePointer"),
            memcpy_htod_async: sym!(hip, "hipMemcpyHtoDAsync"),
            memcpy_dtoh_async: sym!(hip, "hipMemcpyDtoHAsync"),
            memset_d32_async: sym!(hip, "hipMemsetD32Async"),
            module_load_data: sym!(hip, "hipModuleLoadData"),
            module_unload: sym!(hip, "hipModuleUnload"),
            module_get_function: sym!(hip, "hipModuleGetFunction"),
            module_launch_kernel: sym!(hip, "hipModuleLaunchKernel"),
            rtc_create_program: sym!(rtc, "hiprtcCreateProgram"),
            rtc_compile_program: sym!(rtc, "hiprtcCompileProgram"),
            rtc_get_program_log_size: sym!(rtc, "hiprtcGetProgramLogSize"),
            rtc_get_program_log: sym!(rtc, "hiprtcGetProgramLog"),
            rtc_get_code_size: sym!(rtc, "hiprtcGetCodeSize"),
            rtc_get_code: sym!(rtc, "hiprtcGetCode"),
            rtc_destroy_program: sym!(rtc, "hiprtcDestroyProgram"),
            rtc_get_error_string: sym!(rtc, "hiprtcGetErrorString"),
            _libs: (hip, rtc),
        })
    }

    fn ck(&self, call: &'static str, rc: E) -> Result<(), GpuError> {
        if rc == 0 {
            return Ok(());
        }
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: HIP returns static NUL-terminated strings for any code.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: plain lookups of static strings.
        let (name, message) = unsafe {
            (
                text((self.get_error_name)(rc)),
                text((self.get_error_string)(rc)),
            )
        };
        Err(GpuError::Driver {
            call,
            source: DriverCode {
                backend: "hip",
                code: rc as i64,
                name,
                message,
            },
        })
    }

    fn rtc_err(&self, call: &'static str, rc: E) -> GpuError {
        // SAFETY: static string for any code.
        let p = unsafe { (self.rtc_get_error_string)(rc) };
        let message = if p.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        GpuError::Driver {
            call,
            source: DriverCode {
                backend: "hiprtc",
                code: rc as i64,
                name: String::new(),
                message,
            },
        }
    }
}

/// One HIP device. See the module docs: untested on AMD hardware.
pub struct HipBackend {
    api: Api,
    ordinal: c_int,
    info: DeviceInfo,
}

impl std::fmt::Debug for HipBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipBackend")
            .field("ordinal", &self.ordinal)
            .field("info", &self.info)
            .finish()
    }
}

// SAFETY: the HIP runtime is thread-safe; the struct holds only immutable function pointers and the
// libraries they point into, and every call first selects this device on the calling thread.
unsafe impl Send for HipBackend {}
// SAFETY: as above.
unsafe impl Sync for HipBackend {}

impl HipBackend {
    /// Opens HIP device `ordinal`; `NoGpu` when the runtime is missing or there is no such device.
    pub fn new(ordinal: usize) -> Result<HipBackend, GpuError> {
        let api = Api::load()?;
        // SAFETY: hipInit takes flags 0.
        if let Err(e) = api.ck("hipInit", unsafe { (api.init)(0) }) {
            return Err(GpuError::NoGpu {
                reason: e.to_string(),
            });
        }
        let mut count: c_int = 0;
        // SAFETY: valid out-pointer.
        api.ck("hipGetDeviceCount", unsafe {
            (api.get_device_count)(&mut count)
        })?;
        if count <= 0 || ordinal >= count as usize {
            return Err(GpuError::NoGpu {
                reason: format!("device {ordinal} requested, {count} HIP device(s) present"),
            });
        }
        let dev = ordinal as c_int;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 chars, as passed.
        api.ck("hipDeviceGetName", unsafe {
            (api.device_get_name)(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        // SAFETY: HIP NUL-terminates within the given length.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        api.ck("hipDeviceComputeCapability", unsafe {
            (api.device_compute_capability)(&mut major, &mut minor, dev)
        })?;
        let mut total = 0usize;
        // SAFETY: valid out-pointer.
        api.ck("hipDeviceTotalMem", unsafe {
            (api.device_total_mem)(&mut total, dev)
        })?;
        let arch =
            std::env::var("HIPFIRE_HIP_ARCH").unwrap_or_else(|_| format!("gfx{major}{minor}0"));
        let multiprocessors = std::env::var("HIPFIRE_HIP_CUS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_CUS);
        let info = DeviceInfo {
            name,
            arch,
            multiprocessors,
            total_mem: total as u64,
        };
        Ok(HipBackend {
            api,
            ordinal: dev,
            info,
        })
    }

    fn bind(&self) -> Result<(), GpuError> {
        // SAFETY: the ordinal was validated in `new`.
        self.api.ck("hipSetDevice", unsafe {
            (self.api.set_device)(self.ordinal)
        })
    }
}

fn p(v: u64) -> Ptr {
    v as usize as Ptr
}

impl Backend for HipBackend {
    fn name(&self) -> &'static str {
        "hip"
    }
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: no arguments.
        self.api.ck("hipDeviceSynchronize", unsafe {
            (self.api.device_synchronize)()
        })
    }
    fn mem_info(&self) -> Result<(u64, u64), GpuError> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two valid out-pointers to locals.
        self.api.ck("hipMemGetInfo", unsafe {
            (self.api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }
    fn stream_create(&self) -> Result<RawStream, GpuError> {
        self.bind()?;
        let mut s: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.api.ck("hipStreamCreateWithFlags", unsafe {
            (self.api.stream_create_with_flags)(&mut s, STREAM_NON_BLOCKING)
        })?;
        Ok(RawStream(s as usize as u64))
    }
    fn stream_destroy(&self, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: a live stream owned by the caller, destroyed once.
        self.api.ck("hipStreamDestroy", unsafe {
            (self.api.stream_destroy)(p(s.0))
        })
    }
    fn stream_synchronize(&self, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: a live stream.
        self.api.ck("hipStreamSynchronize", unsafe {
            (self.api.stream_synchronize)(p(s.0))
        })
    }
    fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: live handles; flags must be 0.
        self.api.ck("hipStreamWaitEvent", unsafe {
            (self.api.stream_wait_event)(p(s.0), p(e.0), 0)
        })
    }
    fn event_create(&self) -> Result<RawEvent, GpuError> {
        self.bind()?;
        let mut e: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.api
            .ck("hipEventCreate", unsafe { (self.api.event_create)(&mut e) })?;
        Ok(RawEvent(e as usize as u64))
    }
    fn event_destroy(&self, e: RawEvent) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: a live event owned by the caller, destroyed once.
        self.api.ck("hipEventDestroy", unsafe {
            (self.api.event_destroy)(p(e.0))
        })
    }
    fn event_record(&self, e: RawEvent, s: RawStream) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: live handles.
        self.api.ck("hipEventRecord", unsafe {
            (self.api.event_record)(p(e.0), p(s.0))
        })
    }
    fn event_synchronize(&self, e: RawEvent) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: a live event.
        self.api.ck("hipEventSynchronize", unsafe {
            (self.api.event_synchronize)(p(e.0))
        })
    }
    fn event_query(&self, e: RawEvent) -> Result<bool, GpuError> {
        self.bind()?;
        // SAFETY: a live event.
        let rc = unsafe { (self.api.event_query)(p(e.0)) };
        if rc == HIP_ERROR_NOT_READY {
            return Ok(false);
        }
        self.api.ck("hipEventQuery", rc).map(|()| true)
    }
    fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32, GpuError> {
        self.bind()?;
        let mut ms = 0f32;
        // SAFETY: live events, valid out-pointer.
        self.api.ck("hipEventElapsedTime", unsafe {
            (self.api.event_elapsed_time)(&mut ms, p(start.0), p(end.0))
        })?;
        Ok(ms)
    }
    fn mem_alloc(&self, bytes: usize) -> Result<u64, GpuError> {
        self.bind()?;
        let mut d: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.api.malloc)(&mut d, bytes.max(1)) };
        match self.api.ck("hipMalloc", rc) {
            Ok(()) => Ok(d as usize as u64),
            Err(GpuError::Driver { source, .. }) => {
                let (free, total) = self.mem_info().ok().unzip();
                Err(GpuError::DeviceAlloc {
                    requested: bytes,
                    free,
                    total,
                    driver: source,
                })
            }
            Err(e) => Err(e),
        }
    }
    unsafe fn mem_free(&self, ptr: u64) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        self.api.ck("hipFree", unsafe { (self.api.free)(p(ptr)) })
    }
    fn host_alloc_mapped(&self, bytes: usize) -> Result<(*mut u8, u64), GpuError> {
        self.bind()?;
        let mut h: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer; portable + mapped, not write-combined.
        let rc =
            unsafe { (self.api.host_malloc)(&mut h, bytes.max(1), HOST_MALLOC_PORTABLE_MAPPED) };
        if let Err(GpuError::Driver { source, .. }) = self.api.ck("hipHostMalloc", rc) {
            return Err(GpuError::HostAlloc {
                requested: bytes,
                mem_available: mem_available_bytes(),
                source,
            });
        }
        let mut d: Ptr = std::ptr::null_mut();
        // SAFETY: `h` is a live mapped allocation; flags must be 0.
        if let Err(e) = self.api.ck("hipHostGetDevicePointer", unsafe {
            (self.api.host_get_device_pointer)(&mut d, h, 0)
        }) {
            // SAFETY: `h` came from hipHostMalloc above and is not used again.
            let _ = unsafe { (self.api.host_free)(h) };
            return Err(e);
        }
        Ok((h.cast(), d as usize as u64))
    }
    unsafe fn host_free(&self, ptr: *mut u8) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        self.api
            .ck("hipHostFree", unsafe { (self.api.host_free)(ptr.cast()) })
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
        self.api.ck("hipMemcpyHtoDAsync", unsafe {
            (self.api.memcpy_htod_async)(p(dst), src.cast(), bytes, p(s.0))
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
        self.api.ck("hipMemcpyDtoHAsync", unsafe {
            (self.api.memcpy_dtoh_async)(dst.cast(), p(src), bytes, p(s.0))
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
        self.api.ck("hipMemsetD32Async", unsafe {
            (self.api.memset_d32_async)(p(dst), value as c_int, count, p(s.0))
        })
    }
    fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<Vec<u8>, GpuError> {
        let bad = |what: &str| GpuError::Compile {
            module: name.into(),
            arch: self.info.arch.clone(),
            log: format!("{what} contains a NUL byte"),
        };
        let src = CString::new(source).map_err(|_| bad("source"))?;
        let cname = CString::new(name).map_err(|_| bad("name"))?;
        let hs: Vec<CString> = headers
            .iter()
            .map(|(_, t)| CString::new(*t).map_err(|_| bad("header")))
            .collect::<Result<_, _>>()?;
        let hn: Vec<CString> = headers
            .iter()
            .map(|(n, _)| CString::new(*n).map_err(|_| bad("header name")))
            .collect::<Result<_, _>>()?;
        let mut opts =
            vec![CString::new(format!("--offload-arch={}", self.info.arch))
                .map_err(|_| bad("arch"))?];
        for o in options {
            opts.push(CString::new(o.as_str()).map_err(|_| bad("option"))?);
        }
        let hs_p: Vec<*const c_char> = hs.iter().map(|c| c.as_ptr()).collect();
        let hn_p: Vec<*const c_char> = hn.iter().map(|c| c.as_ptr()).collect();
        let o_p: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        let mut prog: Ptr = std::ptr::null_mut();
        // SAFETY: all strings are live and NUL-terminated; counts match the arrays.
        let rc = unsafe {
            (self.api.rtc_create_program)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                hs_p.len() as c_int,
                hs_p.as_ptr(),
                hn_p.as_ptr(),
            )
        };
        if rc != 0 {
            return Err(self.api.rtc_err("hiprtcCreateProgram", rc));
        }
        // SAFETY: `prog` is live until destroyed at the end.
        let out = unsafe {
            let rc = (self.api.rtc_compile_program)(prog, o_p.len() as c_int, o_p.as_ptr());
            let mut n = 0usize;
            let log = if (self.api.rtc_get_program_log_size)(prog, &mut n) == 0 && n > 1 {
                let mut b = vec![0u8; n];
                let _ = (self.api.rtc_get_program_log)(prog, b.as_mut_ptr().cast());
                String::from_utf8_lossy(&b[..n - 1]).into_owned()
            } else {
                String::new()
            };
            if rc != 0 {
                Err(GpuError::Compile {
                    module: name.into(),
                    arch: self.info.arch.clone(),
                    log,
                })
            } else {
                let mut size = 0usize;
                let rc = (self.api.rtc_get_code_size)(prog, &mut size);
                if rc != 0 {
                    Err(self.api.rtc_err("hiprtcGetCodeSize", rc))
                } else {
                    let mut code = vec![0u8; size];
                    let rc = (self.api.rtc_get_code)(prog, code.as_mut_ptr().cast());
                    if rc != 0 {
                        Err(self.api.rtc_err("hiprtcGetCode", rc))
                    } else {
                        Ok(code)
                    }
                }
            }
        };
        // SAFETY: destroyed exactly once.
        let _ = unsafe { (self.api.rtc_destroy_program)(&mut prog) };
        out
    }
    fn module_load(&self, image: &[u8]) -> Result<RawModule, GpuError> {
        self.bind()?;
        let mut m: Ptr = std::ptr::null_mut();
        // SAFETY: `image` is a code object from hiprtc (or the cache holding exactly those bytes).
        self.api.ck("hipModuleLoadData", unsafe {
            (self.api.module_load_data)(&mut m, image.as_ptr().cast())
        })?;
        Ok(RawModule(m as usize as u64))
    }
    unsafe fn module_unload(&self, m: RawModule) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's duty (see the trait).
        self.api.ck("hipModuleUnload", unsafe {
            (self.api.module_unload)(p(m.0))
        })
    }
    fn module_function(&self, m: RawModule, name: &str) -> Result<RawFunction, GpuError> {
        self.bind()?;
        let cname = CString::new(name).map_err(|_| GpuError::Compile {
            module: name.into(),
            arch: self.info.arch.clone(),
            log: "NUL in kernel name".into(),
        })?;
        let mut f: Ptr = std::ptr::null_mut();
        // SAFETY: live module, NUL-terminated name.
        self.api.ck("hipModuleGetFunction", unsafe {
            (self.api.module_get_function)(&mut f, p(m.0), cname.as_ptr())
        })?;
        Ok(RawFunction(f as usize as u64))
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
        self.api.ck("hipModuleLaunchKernel", unsafe {
            (self.api.module_launch_kernel)(
                p(f.0),
                dims.grid,
                1,
                1,
                dims.block,
                1,
                1,
                dims.shared_bytes,
                p(s.0),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
