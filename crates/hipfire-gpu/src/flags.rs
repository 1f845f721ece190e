//! Launchers of the device half of the `flags` join (`kernels/flags.cu`).
//!
//! The mailbox is pinned host-mapped memory whose layout the executor owns
//! (`hipfire_exec::flags`); it reaches these launchers as a [`MailboxOffsets`]. Both kernels run
//! on the caller's stream: [`FlagsKernels::publish`] (one block) before the GPU arm (x down,
//! then the sequence word), [`FlagsKernels::wait_fold`] / [`FlagsKernels::wait_fold_targets`]
//! after it (a grid whose blocks each wait for the CPU's done word, then fold the CPU rows of
//! one or more outputs into them).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::LaunchDims;
use crate::context::{Context, DeviceMemory, Function, HostMappedBuffer, Stream};
use crate::gemv::{GemvForm, RowRange};
use crate::registry::{KernelRegistry, FLAGS_SOURCE};
use crate::GpuError;

/// Threads of the publish kernel's one block (`HF_FLAGS_THREADS` in kernels/flags.cu).
const FLAGS_THREADS: u32 = 1024;

/// Byte offsets of a mailbox's words and areas (all 4-byte aligned, `x` and `y` 16-byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxOffsets {
    /// The device's sequence word.
    pub seq: usize,
    /// The CPU's done word.
    pub done: usize,
    /// The CPU's error word.
    pub error: usize,
    /// The device's fault word (written when the wait timed out or the CPU arm failed).
    pub fault: usize,
    /// The device's `u64` total of nanoseconds its folds waited for done (8-aligned); `None`:
    /// the folds do not count (the count is a PCIe read and write on the fold's path).
    pub fold_wait: Option<usize>,
    /// The activation (`k` f32).
    pub x: usize,
    /// The CPU rows (f32).
    pub y: usize,
}

/// The two flags kernels, loaded for one context.
#[derive(Debug)]
pub struct FlagsKernels {
    ctx: Arc<Context>,
    publish: Function,
    wait_fold: Function,
}

fn offset_u32(what: &'static str, v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::BufferTooSmall {
        what,
        need: v,
        got: u32::MAX as usize,
    })
}

fn check_fits(what: &'static str, need: usize, got: usize) -> Result<(), GpuError> {
    if need > got {
        return Err(GpuError::BufferTooSmall { what, need, got });
    }
    Ok(())
}

impl FlagsKernels {
    /// Compiles (or loads from the cache) `kernels/flags.cu`.
    pub fn new(registry: &KernelRegistry) -> Result<FlagsKernels, GpuError> {
        let module = registry.module(&FLAGS_SOURCE, &[])?;
        Ok(FlagsKernels {
            ctx: registry.context().clone(),
            publish: module.function("flags_publish")?,
            wait_fold: module.function("flags_wait_fold")?,
        })
    }

    /// # Safety
    /// `params` match `f`'s signature and every pointer in them stays valid until the launch
    /// completes on `stream`.
    unsafe fn launch_one_block(
        &self,
        f: &Function,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        let dims = LaunchDims {
            grid: 1,
            block: FLAGS_THREADS,
            shared_bytes: 0,
        };
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.ctx
                .backend()
                .launch(f.raw(), dims, stream.raw(), params)
        }
    }

    fn check_mailbox(&self, mb: &HostMappedBuffer, at: &MailboxOffsets) -> Result<(), GpuError> {
        self.ctx.check_same(mb.context(), "mailbox")?;
        for (what, off) in [
            ("mailbox seq word", at.seq),
            ("mailbox done word", at.done),
            ("mailbox error word", at.error),
            ("mailbox fault word", at.fault),
        ] {
            if off % 4 != 0 {
                return Err(GpuError::Misaligned { what, align: 4 });
            }
            check_fits(what, off + 4, mb.byte_len())?;
        }
        if let Some(off) = at.fold_wait {
            if off % 8 != 0 {
                return Err(GpuError::Misaligned {
                    what: "mailbox fold-wait total",
                    align: 8,
                });
            }
            check_fits("mailbox fold-wait total", off + 8, mb.byte_len())?;
        }
        for (what, off) in [("mailbox x", at.x), ("mailbox y", at.y)] {
            if off % 16 != 0 {
                return Err(GpuError::Misaligned { what, align: 16 });
            }
        }
        Ok(())
    }

    /// Queues: copy `x[0..k]` into the mailbox, fence, then `seq = step`.
    pub fn publish<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        k: usize,
        mailbox: &HostMappedBuffer,
        at: &MailboxOffsets,
        step: u32,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(x.context(), "x")?;
        self.check_mailbox(mailbox, at)?;
        check_fits("x", k * 4, x.byte_len())?;
        check_fits("mailbox x area", at.x + k * 4, mailbox.byte_len())?;
        let mut px = x.device_ptr();
        if px % 4 != 0 {
            return Err(GpuError::Misaligned {
                what: "x",
                align: 4,
            });
        }
        let mut pk = i32::try_from(k).map_err(|_| GpuError::BufferTooSmall {
            what: "k",
            need: k,
            got: i32::MAX as usize,
        })?;
        let mut vec4 = i32::from(px % 16 == 0 && k % 4 == 0);
        let mut pmb = mailbox.device_ptr();
        let mut xo = offset_u32("mailbox x offset", at.x)?;
        let mut so = offset_u32("mailbox seq offset", at.seq)?;
        let mut st = step;
        let mut params: [*mut c_void; 7] = [
            (&mut px as *mut u64).cast(),
            (&mut pk as *mut i32).cast(),
            (&mut vec4 as *mut i32).cast(),
            (&mut pmb as *mut u64).cast(),
            (&mut xo as *mut u32).cast(),
            (&mut so as *mut u32).cast(),
            (&mut st as *mut u32).cast(),
        ];
        // SAFETY: kernel `flags_publish(const float* x, int k, int vec4, u8* mb, u32 x_off,
        // u32 seq_off, u32 step)`: seven parameters of these types. It reads x[0..k] (k*4 bytes
        // present, checked; 16-byte loads only when vec4 says x is 16-aligned and k % 4 == 0) and
        // writes mb[x_off..x_off + 4k] and the seq word (in bounds and aligned, checked). Both
        // buffers are owned by borrowed live objects whose Drop frees synchronously.
        unsafe { self.launch_one_block(&self.publish, stream, &mut params) }
    }

    /// Queues: wait until the mailbox's done word says `step` (or `timeout` passes: then the
    /// fault word is set to `step` and `y` is left alone), then write (plain) or add (residual)
    /// the mailbox's CPU rows into `y[rows]`.
    #[allow(clippy::too_many_arguments)] // one launch's operands
    pub fn wait_fold<Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        mailbox: &HostMappedBuffer,
        at: &MailboxOffsets,
        step: u32,
        y: &mut Y,
        rows: RowRange,
        form: GemvForm,
        timeout: Duration,
    ) -> Result<(), GpuError> {
        let target = FoldTarget::new(&self.ctx, y, rows)?;
        self.wait_fold_targets(stream, mailbox, at, step, &[target], form, timeout)
    }

    /// [`FlagsKernels::wait_fold`] for several outputs whose CPU rows follow one another in the
    /// mailbox (one step's q/k/v or gate/up): one wait, one launch. At most
    /// [`FOLD_MAX_TARGETS`] outputs, each borrowed from its buffer ([`FoldTarget::new`]).
    #[allow(clippy::too_many_arguments)] // one launch's operands
    pub fn wait_fold_targets(
        &self,
        stream: &Stream,
        mailbox: &HostMappedBuffer,
        at: &MailboxOffsets,
        step: u32,
        targets: &[FoldTarget<'_>],
        form: GemvForm,
        timeout: Duration,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.check_mailbox(mailbox, at)?;
        if targets.len() > FOLD_MAX_TARGETS {
            return Err(GpuError::BufferTooSmall {
                what: "fold targets",
                need: targets.len(),
                got: FOLD_MAX_TARGETS,
            });
        }
        let total: usize = targets.iter().map(|t| t.rows).sum();
        if total == 0 {
            return Ok(());
        }
        check_fits("mailbox y area", at.y + total * 4, mailbox.byte_len())?;
        let rows_i32 = |n: usize| {
            i32::try_from(n).map_err(|_| GpuError::BufferTooSmall {
                what: "rows",
                need: n,
                got: i32::MAX as usize,
            })
        };
        rows_i32(total)?;
        let mut segs = FoldSegments {
            y: [0; FOLD_MAX_TARGETS],
            rows: [0; FOLD_MAX_TARGETS],
        };
        for (i, t) in targets.iter().enumerate() {
            segs.y[i] = t.y;
            segs.rows[i] = rows_i32(t.rows)?;
        }
        let mut nsegs = targets.len() as i32;
        let mut pmb = mailbox.device_ptr();
        let mut done = offset_u32("mailbox done offset", at.done)?;
        let mut err = offset_u32("mailbox error offset", at.error)?;
        let mut fault = offset_u32("mailbox fault offset", at.fault)?;
        let mut count_wait = i32::from(at.fold_wait.is_some());
        let mut wait_total = offset_u32("mailbox fold-wait offset", at.fold_wait.unwrap_or(0))?;
        let mut yo = offset_u32("mailbox y offset", at.y)?;
        let mut st = step;
        let mut residual = i32::from(matches!(form, GemvForm::Residual));
        let mut tmo = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut params: [*mut c_void; 12] = [
            (&mut pmb as *mut u64).cast(),
            (&mut done as *mut u32).cast(),
            (&mut err as *mut u32).cast(),
            (&mut fault as *mut u32).cast(),
            (&mut count_wait as *mut i32).cast(),
            (&mut wait_total as *mut u32).cast(),
            (&mut yo as *mut u32).cast(),
            (&mut st as *mut u32).cast(),
            (&mut segs as *mut FoldSegments).cast(),
            (&mut nsegs as *mut i32).cast(),
            (&mut residual as *mut i32).cast(),
            (&mut tmo as *mut u64).cast(),
        ];
        let grid = total
            .div_ceil(FOLD_THREADS as usize * FOLD_ROWS_PER_THREAD)
            .clamp(1, FOLD_MAX_BLOCKS) as u32;
        let dims = LaunchDims {
            grid,
            block: FOLD_THREADS,
            shared_bytes: 0,
        };
        // SAFETY: kernel `flags_wait_fold(u8* mb, u32 done_off, u32 err_off, u32 fault_off,
        // int count_wait, u32 wait_off, u32 y_off, u32 step, hf_fold_segs segs, int nsegs,
        // int residual, u64 timeout_ns)`: twelve parameters of these types (`FoldSegments` is
        // `hf_fold_segs`'s layout). It reads the done/error words and mb[y_off..y_off + 4*total]
        // (in bounds, checked above), writes the fault word, the fold-wait total (only when
        // counted; in bounds, checked) and, per target, `rows` floats from its `y` (bounds
        // checked by `FoldTarget::new`; the buffer is borrowed by the target for this call and
        // its Drop frees synchronously). The spin ends by itself after `timeout`.
        unsafe {
            self.ctx
                .backend()
                .launch(self.wait_fold.raw(), dims, stream.raw(), &mut params)
        }
    }
}

/// Outputs one fold launch can write ([`FlagsKernels::wait_fold_targets`]; `HF_FOLD_SEGS` in
/// kernels/flags.cu): q/k/v is the most one step shares an activation among.
pub const FOLD_MAX_TARGETS: usize = 4;

/// Threads per fold block (`HF_FOLD_THREADS` in kernels/flags.cu).
const FOLD_THREADS: u32 = 256;
/// Rows per fold thread the grid is sized for: each row is a PCIe load, so the fold's time is
/// about this many round trips once every load is in flight. Chosen, not tuned: with it the
/// fold's own work was ~12 µs per step on the H200 (session-3 checkpoint).
const FOLD_ROWS_PER_THREAD: usize = 2;
/// Blocks a fold launch may use (each one's first thread polls the done word): enough for
/// two rows per thread up to 32 k CPU rows (gate + up of a 14336-wide FFN at share 0.3 is
/// ~20 k). Chosen, not tuned.
const FOLD_MAX_BLOCKS: usize = 64;

/// `hf_fold_segs` of kernels/flags.cu, passed by value.
#[repr(C)]
struct FoldSegments {
    y: [u64; FOLD_MAX_TARGETS],
    rows: [i32; FOLD_MAX_TARGETS],
}

/// One output of a fold: `rows` floats at device address `y`, borrowed from its buffer for `'a`
/// (device memory frees synchronously on drop, so a buffer that outlives the queueing call
/// outlives the launch).
#[derive(Debug)]
pub struct FoldTarget<'a> {
    y: u64,
    rows: usize,
    _y: std::marker::PhantomData<&'a mut ()>,
}

impl<'a> FoldTarget<'a> {
    /// Rows `rows` of `y` (bounds and context checked).
    pub fn new<Y: DeviceMemory + ?Sized>(
        ctx: &Arc<Context>,
        y: &'a mut Y,
        rows: RowRange,
    ) -> Result<FoldTarget<'a>, GpuError> {
        ctx.check_same(y.context(), "y")?;
        check_fits("y", rows.end * 4, y.byte_len())?;
        Ok(FoldTarget {
            y: y.device_ptr() + (rows.start * 4) as u64,
            rows: rows.len(),
            _y: std::marker::PhantomData,
        })
    }
}
