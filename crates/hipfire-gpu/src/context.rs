//! Owned safe types over a [`Backend`]: context, streams, events, device and host-mapped buffers,
//! modules. Each object holds an `Arc<Context>`, so the context (and the driver state behind it)
//! outlives everything made from it, as cudarc's `CudaContext` does.
//!
//! Asynchrony: copies and launches are queued on a stream and run later. Freeing device or pinned
//! memory (`Drop`) is synchronous in both CUDA (`cuMemFree`, `cuMemFreeHost`) and HIP, so dropping a
//! buffer while work using it is queued does not free memory under the GPU; reading a buffer's host
//! side before the stream has passed the copy that fills it gives stale bytes, which is why every
//! `*_async` call documents that the caller synchronises (an [`Event`] or [`Stream::synchronize`])
//! before looking at the result.

use crate::backend::{Backend, DeviceInfo, RawEvent, RawFunction, RawGraph, RawModule, RawStream};
use crate::GpuError;
use std::marker::PhantomData;
use std::sync::Arc;

/// Which runtime drives the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// NVIDIA CUDA through cudarc (default feature `cuda`).
    Cuda,
    /// AMD HIP through runtime-loaded libamdhip64 (feature `hip`; untested on AMD hardware).
    Hip,
}

/// A device opened for work. Create with [`Context::new`]; share as `Arc<Context>`.
#[derive(Debug)]
pub struct Context {
    /// The backend that owns the driver context.
    backend: Box<dyn Backend>,
}

impl Context {
    /// Opens CUDA device `ordinal`. Returns [`GpuError::NoGpu`] (never panics) when the driver
    /// library is missing or there is no such device.
    pub fn new(ordinal: usize) -> Result<Arc<Context>, GpuError> {
        Context::with_backend(BackendKind::Cuda, ordinal)
    }

    /// Opens device `ordinal` of the given backend.
    pub fn with_backend(kind: BackendKind, ordinal: usize) -> Result<Arc<Context>, GpuError> {
        let backend: Box<dyn Backend> = match kind {
            BackendKind::Cuda => open_cuda(ordinal)?,
            BackendKind::Hip => open_hip(ordinal)?,
        };
        tracing::debug!(backend = backend.name(), device = %backend.info().name, arch = %backend.info().arch, "GPU context opened");
        Ok(Arc::new(Context { backend }))
    }

    /// Facts about the device.
    pub fn info(&self) -> &DeviceInfo {
        self.backend.info()
    }

    /// The backend (for the raw layer: kernel registry, launches).
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// A new non-blocking stream.
    pub fn new_stream(self: &Arc<Self>) -> Result<Stream, GpuError> {
        Ok(Stream {
            raw: self.backend.stream_create()?,
            ctx: self.clone(),
        })
    }

    /// A new timing event.
    pub fn new_event(self: &Arc<Self>) -> Result<Event, GpuError> {
        Ok(Event {
            raw: self.backend.event_create()?,
            ctx: self.clone(),
        })
    }

    /// Allocates `len` elements of device memory (contents unspecified until written). Failure
    /// is [`GpuError::DeviceAlloc`] with the bytes requested and the device's free bytes.
    pub fn alloc<T: DeviceElem>(self: &Arc<Self>, len: usize) -> Result<DeviceBuffer<T>, GpuError> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(GpuError::BufferTooSmall {
                what: "allocation size overflows",
                need: usize::MAX,
                got: len,
            })?;
        if crate::error::test_max_alloc().is_some_and(|max| bytes as u64 > max) {
            let (free, total) = self.backend.mem_info().ok().unzip();
            return Err(crate::error::test_alloc_refusal(bytes, free, total));
        }
        Ok(DeviceBuffer {
            ptr: self.backend.mem_alloc(bytes)?,
            len,
            ctx: self.clone(),
            _t: PhantomData,
        })
    }

    /// Allocates `bytes` of pinned host memory mapped into the device (DEVICEMAP | PORTABLE, not
    /// write-combined), zero-filled. Failure is [`GpuError::HostAlloc`] with the bytes requested and
    /// the host's `MemAvailable`.
    pub fn alloc_host_mapped(self: &Arc<Self>, bytes: usize) -> Result<HostMappedBuffer, GpuError> {
        let (host, dev) = self.backend.host_alloc_mapped(bytes)?;
        // SAFETY: `host` points at `bytes` (at least 1) freshly allocated bytes that nothing else uses.
        unsafe { std::ptr::write_bytes(host, 0, bytes) };
        Ok(HostMappedBuffer {
            host,
            dev,
            len: bytes,
            ctx: self.clone(),
        })
    }

    /// Pinned host memory for staging async copies. Same allocation as
    /// [`Context::alloc_host_mapped`] (pinned memory is mapped anyway under unified addressing).
    pub fn alloc_pinned_host(self: &Arc<Self>, bytes: usize) -> Result<HostMappedBuffer, GpuError> {
        self.alloc_host_mapped(bytes)
    }

    /// Blocks until all work queued on the device by this context is done.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.backend.synchronize()
    }

    /// `(free, total)` device memory in bytes right now (other processes' allocations included).
    pub fn mem_info(&self) -> Result<(u64, u64), GpuError> {
        self.backend.mem_info()
    }

    /// Loads a compiled module image.
    pub fn load_module(self: &Arc<Self>, image: &[u8]) -> Result<Arc<Module>, GpuError> {
        Ok(Arc::new(Module {
            raw: self.backend.module_load(image)?,
            ctx: self.clone(),
        }))
    }

    fn same(&self, other: &Arc<Context>) -> bool {
        std::ptr::eq(self, Arc::as_ptr(other))
    }

    pub(crate) fn check_same(
        &self,
        other: &Arc<Context>,
        what: &'static str,
    ) -> Result<(), GpuError> {
        if self.same(other) {
            Ok(())
        } else {
            Err(GpuError::WrongContext { what })
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Box<dyn Backend>, GpuError> {
    Ok(Box::new(crate::cuda::CudaBackend::new(ordinal)?))
}
#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Box<dyn Backend>, GpuError> {
    Err(GpuError::BackendNotBuilt { backend: "cuda" })
}
#[cfg(feature = "hip")]
fn open_hip(ordinal: usize) -> Result<Box<dyn Backend>, GpuError> {
    Ok(Box::new(crate::hip::HipBackend::new(ordinal)?))
}
#[cfg(not(feature = "hip"))]
fn open_hip(_ordinal: usize) -> Result<Box<dyn Backend>, GpuError> {
    Err(GpuError::BackendNotBuilt { backend: "hip" })
}

/// Memory the device can address: a [`DeviceBuffer`] or a [`HostMappedBuffer`].
pub trait DeviceMemory {
    /// Device address of the first byte.
    fn device_ptr(&self) -> u64;
    /// Length in bytes.
    fn byte_len(&self) -> usize;
    /// The context that owns it.
    fn context(&self) -> &Arc<Context>;
    /// Where the bytes live (device memory unless overridden).
    fn location(&self) -> crate::WeightLocation {
        crate::WeightLocation::Device
    }
}

/// Element types a [`DeviceBuffer`] may hold: plain data, valid for any bit pattern.
pub trait DeviceElem: Copy + Send + Sync + 'static + private::Sealed {}
mod private {
    pub trait Sealed {}
}
macro_rules! elem {
    ($($t:ty),*) => { $(impl private::Sealed for $t {} impl DeviceElem for $t {})* };
}
elem!(u8, i8, u16, u32, i32, u64, f32, f64);

/// A stream: an ordered queue of device work.
#[derive(Debug)]
pub struct Stream {
    raw: RawStream,
    ctx: Arc<Context>,
}

impl Stream {
    /// The raw handle (for backends' raw calls).
    pub fn raw(&self) -> RawStream {
        self.raw
    }
    /// The owning context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
    /// Blocks until every queued operation on this stream is done (and reports its errors).
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.ctx.backend.stream_synchronize(self.raw)
    }
    /// Makes later work on this stream wait for `event` (a cross-stream join without the host).
    pub fn wait_event(&self, event: &Event) -> Result<(), GpuError> {
        self.ctx.check_same(&event.ctx, "event")?;
        self.ctx.backend.stream_wait_event(self.raw, event.raw)
    }
    /// Records `event` at this point of the stream.
    pub fn record(&self, event: &Event) -> Result<(), GpuError> {
        event.record(self)
    }

    /// Queues a copy of `bytes` from pinned `src[src_off..]` to `dst[dst_off..]`. The caller must not
    /// write `src` until the copy is done (synchronise on an event recorded after it).
    pub fn memcpy_htod_async<D: DeviceMemory + ?Sized>(
        &self,
        dst: &mut D,
        dst_off: usize,
        src: &HostMappedBuffer,
        src_off: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(dst.context(), "destination")?;
        self.ctx.check_same(&src.ctx, "source")?;
        check_span("copy destination", dst_off, bytes, dst.byte_len())?;
        check_span("copy source", src_off, bytes, src.len)?;
        // SAFETY: both spans were checked in bounds; both allocations are owned by live objects whose
        // Drop frees synchronously (module docs), so they stay allocated until the copy completes.
        unsafe {
            self.ctx.backend.memcpy_htod_async(
                dst.device_ptr() + dst_off as u64,
                src.host.add(src_off),
                bytes,
                self.raw,
            )
        }
    }

    /// Queues a copy of `bytes` from `src[src_off..]` to pinned `dst[dst_off..]`. Read `dst` only
    /// after synchronising on this stream or an event recorded after the copy.
    pub fn memcpy_dtoh_async<S: DeviceMemory + ?Sized>(
        &self,
        dst: &mut HostMappedBuffer,
        dst_off: usize,
        src: &S,
        src_off: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(src.context(), "source")?;
        self.ctx.check_same(&dst.ctx, "destination")?;
        check_span("copy source", src_off, bytes, src.byte_len())?;
        check_span("copy destination", dst_off, bytes, dst.len)?;
        // SAFETY: spans checked; allocations live until the copy completes (see above).
        unsafe {
            self.ctx.backend.memcpy_dtoh_async(
                dst.host.add(dst_off),
                src.device_ptr() + src_off as u64,
                bytes,
                self.raw,
            )
        }
    }

    /// Queues a fill of `dst` (whole buffer) with the 32-bit pattern `value` (tests poison with NaN).
    pub fn fill_u32_async<D: DeviceMemory + ?Sized>(
        &self,
        dst: &mut D,
        value: u32,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(dst.context(), "destination")?;
        // SAFETY: fills whole 32-bit words inside the allocation, which stays live (module docs).
        unsafe {
            self.ctx
                .backend
                .memset_d32_async(dst.device_ptr(), value, dst.byte_len() / 4, self.raw)
        }
    }
}

impl Stream {
    /// Starts recording the work this thread queues on this stream into a graph instead of
    /// running it; [`Stream::end_capture`] must follow on the same thread, also when queueing
    /// fails (the stream is unusable until then). Nothing may synchronise this stream or
    /// allocate in between. [`GpuError::NoGraphs`] where the backend has no graphs.
    pub fn begin_capture(&self) -> Result<(), GpuError> {
        self.ctx.backend.stream_begin_capture(self.raw)
    }

    /// Ends the capture begun by [`Stream::begin_capture`] and instantiates it; an error if any
    /// queued call failed or could not be captured.
    pub fn end_capture(&self) -> Result<Graph, GpuError> {
        let raw = self.ctx.backend.stream_end_capture(self.raw)?;
        Ok(Graph {
            raw,
            ctx: self.ctx.clone(),
        })
    }
}

/// Work captured from a stream ([`Stream::begin_capture`] .. [`Stream::end_capture`]), replayed
/// by one launch: the kernels, copies and their arguments as they were at capture, so a replay
/// costs one submission instead of one per kernel.
#[derive(Debug)]
pub struct Graph {
    raw: RawGraph,
    ctx: Arc<Context>,
}

impl Graph {
    /// Queues one replay on `stream`.
    ///
    /// # Safety
    /// Every buffer the captured work touched is still allocated (not dropped and replaced), and
    /// stays so until the replay completes; host memory it copies from or to is pinned memory
    /// still owned. What the buffers hold may change between replays: that is how a replay is
    /// given new inputs.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<(), GpuError> {
        self.ctx.check_same(&stream.ctx, "stream")?;
        // SAFETY: the caller's duty (above).
        unsafe { self.ctx.backend.graph_launch(self.raw, stream.raw) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.backend.graph_destroy(self.raw) {
            tracing::warn!(cause = %e, "graph destroy failed");
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.backend.stream_destroy(self.raw) {
            tracing::warn!(cause = %e, "stream destroy failed");
        }
    }
}

fn check_span(what: &'static str, off: usize, bytes: usize, len: usize) -> Result<(), GpuError> {
    match off.checked_add(bytes) {
        Some(end) if end <= len => Ok(()),
        _ => Err(GpuError::BufferTooSmall {
            what,
            need: off.saturating_add(bytes),
            got: len,
        }),
    }
}

/// A device event: a point in a stream to wait for or time against.
#[derive(Debug)]
pub struct Event {
    raw: RawEvent,
    ctx: Arc<Context>,
}

impl Event {
    /// Records this event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<(), GpuError> {
        self.ctx.check_same(&stream.ctx, "stream")?;
        self.ctx.backend.event_record(self.raw, stream.raw)
    }
    /// Blocks until the recorded work is done.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.ctx.backend.event_synchronize(self.raw)
    }
    /// Whether the recorded work is done (never blocks).
    pub fn query(&self) -> Result<bool, GpuError> {
        self.ctx.backend.event_query(self.raw)
    }

    /// Milliseconds from this (completed) event to `end` (completed).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, GpuError> {
        self.ctx.check_same(&end.ctx, "event")?;
        self.ctx.backend.event_elapsed_ms(self.raw, end.raw)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.backend.event_destroy(self.raw) {
            tracing::warn!(cause = %e, "event destroy failed");
        }
    }
}

/// Device memory holding `len` values of `T`.
#[derive(Debug)]
pub struct DeviceBuffer<T: DeviceElem> {
    ptr: u64,
    len: usize,
    ctx: Arc<Context>,
    _t: PhantomData<T>,
}

impl<T: DeviceElem> DeviceBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if and only if the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Copies `src` into the start of the buffer through `stream` and waits for it.
    pub fn upload(&mut self, stream: &Stream, src: &[T]) -> Result<(), GpuError> {
        self.ctx.check_same(&stream.ctx, "stream")?;
        let bytes = std::mem::size_of_val(src);
        check_span("upload destination", 0, bytes, self.byte_len())?;
        // SAFETY: in bounds; `src` is borrowed until the synchronize below returns.
        unsafe {
            self.ctx
                .backend
                .memcpy_htod_async(self.ptr, src.as_ptr().cast(), bytes, stream.raw)?
        };
        stream.synchronize()
    }
    /// Copies the start of the buffer into `dst` through `stream` and waits for it.
    pub fn download(&self, stream: &Stream, dst: &mut [T]) -> Result<(), GpuError> {
        self.ctx.check_same(&stream.ctx, "stream")?;
        let bytes = std::mem::size_of_val(dst);
        check_span("download source", 0, bytes, self.byte_len())?;
        // SAFETY: in bounds; `dst` is borrowed mutably until the synchronize below returns, and `T`
        // accepts any bit pattern (DeviceElem).
        unsafe {
            self.ctx.backend.memcpy_dtoh_async(
                dst.as_mut_ptr().cast(),
                self.ptr,
                bytes,
                stream.raw,
            )?
        };
        stream.synchronize()
    }
}

impl<T: DeviceElem> DeviceMemory for DeviceBuffer<T> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl<T: DeviceElem> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from mem_alloc of this context and is freed once, here.
        if let Err(e) = unsafe { self.ctx.backend.mem_free(self.ptr) } {
            tracing::warn!(cause = %e, "device free failed");
        }
    }
}

/// Pinned host memory mapped into the device: the CPU sees `&[u8]`, kernels see [`DeviceMemory::device_ptr`].
#[derive(Debug)]
pub struct HostMappedBuffer {
    host: *mut u8,
    dev: u64,
    len: usize,
    ctx: Arc<Context>,
}

// SAFETY: the buffer owns its allocation exclusively; `&mut` access goes through `&mut self`, so the
// usual aliasing rules hold for the CPU side. The device side is reached only through queued work,
// whose ordering against CPU access is the caller's to arrange (module docs).
unsafe impl Send for HostMappedBuffer {}
// SAFETY: shared access hands out only `&[u8]`.
unsafe impl Sync for HostMappedBuffer {}

impl HostMappedBuffer {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if and only if the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The CPU view.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `host` points at `len` initialised (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }
    /// The mutable CPU view.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }
    /// The host address (for the executor's raw use, e.g. spinning on a flag word).
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }
}

impl DeviceMemory for HostMappedBuffer {
    fn device_ptr(&self) -> u64 {
        self.dev
    }
    fn location(&self) -> crate::WeightLocation {
        crate::WeightLocation::HostMapped
    }
    fn byte_len(&self) -> usize {
        self.len
    }
    fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for HostMappedBuffer {
    fn drop(&mut self) {
        // SAFETY: `host` came from host_alloc_mapped of this context and is freed once, here.
        if let Err(e) = unsafe { self.ctx.backend.host_free(self.host) } {
            tracing::warn!(cause = %e, "pinned host free failed");
        }
    }
}

/// A loaded kernel module.
#[derive(Debug)]
pub struct Module {
    raw: RawModule,
    ctx: Arc<Context>,
}

impl Module {
    /// Looks up a kernel by its `extern "C"` name.
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function, GpuError> {
        Ok(Function {
            raw: self.ctx.backend.module_function(self.raw, name)?,
            module: self.clone(),
        })
    }
    /// The owning context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Every `Function` holds an `Arc<Module>`, so no handle of this module survives it; work
        // already queued may still run its code, so wait for the device before unloading. Modules
        // are dropped rarely (shutdown), so the device-wide wait costs nothing on the hot path.
        if let Err(e) = self.ctx.backend.synchronize() {
            tracing::warn!(cause = %e, "synchronize before module unload failed");
        }
        // SAFETY: no `Function` of this module exists (see above) and no queued work remains.
        if let Err(e) = unsafe { self.ctx.backend.module_unload(self.raw) } {
            tracing::warn!(cause = %e, "module unload failed");
        }
    }
}

/// A kernel in a loaded module (keeps the module loaded).
#[derive(Debug, Clone)]
pub struct Function {
    raw: RawFunction,
    module: Arc<Module>,
}

impl Function {
    /// The raw handle.
    pub fn raw(&self) -> RawFunction {
        self.raw
    }
    /// The owning context.
    pub fn context(&self) -> &Arc<Context> {
        &self.module.ctx
    }
}
