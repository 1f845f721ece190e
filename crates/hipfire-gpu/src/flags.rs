//! Launchers of the device half of the `flags` join (`kernels/flags.cu`).
//!
//! The mailbox is pinned host-mapped memory whose layout the executor owns
//! (`hipfire_exec::flags`); it reaches these launchers as a [`MailboxOffsets`]. Both kernels run
//! as one block on the caller's stream: [`FlagsKernels::publish`] before the GPU arm (x down,
//! then the sequence word), [`FlagsKernels::wait_fold`] after it (spin on the CPU's done word,
//! then fold the CPU rows into `y`).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::LaunchDims;
use crate::context::{Context, DeviceMemory, Function, HostMappedBuffer, Stream};
use crate::gemv::{GemvForm, RowRange};
use crate::registry::{KernelRegistry, FLAGS_SOURCE};
use crate::GpuError;

/// Threads of the one block of each flags kernel (`HF_FLAGS_THREADS` in kernels/flags.cu).
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
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(y.context(), "y")?;
        self.check_mailbox(mailbox, at)?;
        if rows.is_empty() {
            return Ok(());
        }
        check_fits("y", rows.end * 4, y.byte_len())?;
        check_fits("mailbox y area", at.y + rows.len() * 4, mailbox.byte_len())?;
        let mut pmb = mailbox.device_ptr();
        let mut done = offset_u32("mailbox done offset", at.done)?;
        let mut err = offset_u32("mailbox error offset", at.error)?;
        let mut fault = offset_u32("mailbox fault offset", at.fault)?;
        let mut yo = offset_u32("mailbox y offset", at.y)?;
        let mut st = step;
        let mut py = y.device_ptr() + (rows.start * 4) as u64;
        let mut n = i32::try_from(rows.len()).map_err(|_| GpuError::BufferTooSmall {
            what: "rows",
            need: rows.len(),
            got: i32::MAX as usize,
        })?;
        let mut residual = i32::from(matches!(form, GemvForm::Residual));
        let mut tmo = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut params: [*mut c_void; 10] = [
            (&mut pmb as *mut u64).cast(),
            (&mut done as *mut u32).cast(),
            (&mut err as *mut u32).cast(),
            (&mut fault as *mut u32).cast(),
            (&mut yo as *mut u32).cast(),
            (&mut st as *mut u32).cast(),
            (&mut py as *mut u64).cast(),
            (&mut n as *mut i32).cast(),
            (&mut residual as *mut i32).cast(),
            (&mut tmo as *mut u64).cast(),
        ];
        // SAFETY: kernel `flags_wait_fold(u8* mb, u32 done_off, u32 err_off, u32 fault_off,
        // u32 y_off, u32 step, float* y, int rows, int residual, u64 timeout_ns)`: ten parameters
        // of these types. It reads the done/error words and mb[y_off..y_off + 4*rows], writes the
        // fault word and y[rows.start..rows.end] (all in bounds, checked above). The spin ends by
        // itself after `timeout`. Buffers are owned by borrowed live objects whose Drop frees
        // synchronously.
        unsafe { self.launch_one_block(&self.wait_fold, stream, &mut params) }
    }
}
