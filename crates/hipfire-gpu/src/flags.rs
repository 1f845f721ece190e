//! Launchers of the device half of the `flags` join (`kernels/flags.cu`).
//!
//! The mailbox is pinned host-mapped memory whose layout the executor owns
//! (`hipfire_exec::flags`); it reaches these launchers as a [`MailboxOffsets`]. The kernels run
//! on the caller's stream: before the GPU arm a publish of x — [`FlagsKernels::publish_tagged`]
//! (the default for Q4_K/Q6_K: each element stored with the step beside it, no fence, no
//! sequence word) or [`FlagsKernels::publish`] (one block: x down, a fence, then the sequence
//! word); after it
//! [`FlagsKernels::wait_fold`] / [`FlagsKernels::wait_fold_targets`] (a grid whose blocks each
//! wait for the done word of the CPU rows they fold — one per chunk or worker, or one for the
//! whole arm — then fold those rows of one or more outputs).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::LaunchDims;
use crate::context::{Context, DeviceBuffer, DeviceMemory, Function, HostMappedBuffer, Stream};
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
    /// The CPU's done word for the whole arm (written by its last worker).
    pub done: usize,
    /// The first worker's done word ([`DoneWords::PerPart`]); worker `p`'s is
    /// `part_done + p * part_done_stride`.
    pub part_done: usize,
    /// Bytes between the workers' done words (a cache line each).
    pub part_done_stride: usize,
    /// Done words the mailbox holds from `part_done` on.
    pub part_done_count: usize,
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

/// Which done word covers which of a fold's CPU rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneWords<'a> {
    /// One word ([`MailboxOffsets::done`]) for the whole arm: the fold starts when the last
    /// worker is done.
    Whole,
    /// One word per worker: part `p` is rows `[cuts[p], cuts[p + 1])` of the fold's
    /// concatenated rows (`cuts` rises from 0 to their total), its word
    /// `MailboxOffsets::part_done + p * part_done_stride`; each part is folded as soon as its
    /// worker is done.
    PerPart(&'a [usize]),
}

/// The two flags kernels, loaded for one context.
#[derive(Debug)]
pub struct FlagsKernels {
    ctx: Arc<Context>,
    publish: Function,
    publish_tagged: Function,
    wait_fold: Function,
    /// The fold's fold-wait count between its parts: {longest wait, arrivals}, zero between
    /// folds. One stream's folds at a time (they run in order).
    wait_scratch: DeviceBuffer<u64>,
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
        let ctx = registry.context().clone();
        let mut wait_scratch = ctx.alloc::<u64>(2)?;
        let stream = ctx.new_stream()?;
        wait_scratch.upload(&stream, &[0, 0])?;
        stream.synchronize()?;
        Ok(FlagsKernels {
            publish: module.function("flags_publish")?,
            publish_tagged: module.function("flags_publish_tagged")?,
            wait_fold: module.function("flags_wait_fold")?,
            wait_scratch,
            ctx,
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
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_blocks(f, 1, FLAGS_THREADS, stream, params) }
    }

    /// # Safety
    /// As [`Self::launch_one_block`], and `f` covers its work with any `grid` of `block`s.
    unsafe fn launch_blocks(
        &self,
        f: &Function,
        grid: u32,
        block: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        let dims = LaunchDims {
            grid,
            block,
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
            ("mailbox first worker's done word", at.part_done),
            ("mailbox fault word", at.fault),
        ] {
            if off % 4 != 0 {
                return Err(GpuError::Misaligned { what, align: 4 });
            }
            check_fits(what, off + 4, mb.byte_len())?;
        }
        if at.part_done_stride % 4 != 0 {
            return Err(GpuError::Misaligned {
                what: "mailbox done-word stride",
                align: 4,
            });
        }
        check_fits(
            "mailbox workers' done words",
            at.part_done + at.part_done_count.saturating_sub(1) * at.part_done_stride + 4,
            mb.byte_len(),
        )?;
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

    /// The checks both publishes make of their operands; `x`'s device address (4-aligned) and
    /// `k` as the kernels take it.
    fn publish_operands<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        k: usize,
        mailbox: &HostMappedBuffer,
        at: &MailboxOffsets,
    ) -> Result<(u64, i32), GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(x.context(), "x")?;
        self.check_mailbox(mailbox, at)?;
        check_fits("x", k * 4, x.byte_len())?;
        let px = x.device_ptr();
        if px % 4 != 0 {
            return Err(GpuError::Misaligned {
                what: "x",
                align: 4,
            });
        }
        let pk = i32::try_from(k).map_err(|_| GpuError::BufferTooSmall {
            what: "k",
            need: k,
            got: i32::MAX as usize,
        })?;
        Ok((px, pk))
    }

    /// Queues: copy `x[0..k]` into the mailbox, fence (every thread its own stores,
    /// system-wide), then `seq = step`.
    pub fn publish<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        k: usize,
        mailbox: &HostMappedBuffer,
        at: &MailboxOffsets,
        step: u32,
    ) -> Result<(), GpuError> {
        let (mut px, mut pk) = self.publish_operands(stream, x, k, mailbox, at)?;
        check_fits("mailbox x area", at.x + k * 4, mailbox.byte_len())?;
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
        // u32 seq_off, u32 step)`: seven parameters of these types. It reads
        // x[0..k] (k*4 bytes present, checked; 16-byte loads only when vec4 says x is 16-aligned
        // and k % 4 == 0) and writes mb[x_off..x_off + 4k] and the seq word (in bounds and
        // aligned, checked). Both buffers are owned by borrowed live objects whose Drop frees
        // synchronously.
        unsafe { self.launch_one_block(&self.publish, stream, &mut params) }
    }

    /// Queues: store each `x[i]` into the mailbox as one 8-byte word, its f32 bits in the low
    /// half and `step` in the high half, at `at.x + 8 i` (8-aligned), with no fence and no
    /// sequence word: a reader takes an element once its high half says `step`. Up to
    /// `max_blocks` blocks of `FLAGS_THREADS` (1024) threads share the stores (at least one; no
    /// more than one element per thread needs).
    #[allow(clippy::too_many_arguments)]
    pub fn publish_tagged<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        k: usize,
        mailbox: &HostMappedBuffer,
        at: &MailboxOffsets,
        step: u32,
        max_blocks: u32,
    ) -> Result<(), GpuError> {
        let (mut px, mut pk) = self.publish_operands(stream, x, k, mailbox, at)?;
        if at.x % 8 != 0 {
            return Err(GpuError::Misaligned {
                what: "mailbox x area",
                align: 8,
            });
        }
        check_fits("mailbox tagged x area", at.x + k * 8, mailbox.byte_len())?;
        let mut pmb = mailbox.device_ptr();
        let mut xo = offset_u32("mailbox x offset", at.x)?;
        let mut st = step;
        let mut params: [*mut c_void; 5] = [
            (&mut px as *mut u64).cast(),
            (&mut pk as *mut i32).cast(),
            (&mut pmb as *mut u64).cast(),
            (&mut xo as *mut u32).cast(),
            (&mut st as *mut u32).cast(),
        ];
        let grid = (k.div_ceil(FLAGS_THREADS as usize) as u32).clamp(1, max_blocks.max(1));
        // SAFETY: kernel `flags_publish_tagged(const float* x, int k, u8* mb, u32 x_off, u32
        // step)`: five parameters of these types. It reads x[0..k] (k*4 bytes present, checked)
        // and writes the 8-aligned mb[x_off..x_off + 8k] (in bounds, checked), grid-stride, so
        // any grid covers it. Both buffers are owned by borrowed live objects whose Drop frees
        // synchronously.
        unsafe {
            self.launch_blocks(
                &self.publish_tagged,
                grid,
                FLAGS_THREADS,
                stream,
                &mut params,
            )
        }
    }

    /// Queues: wait until the mailbox's done word says `step` (or `timeout` passes, or it says
    /// the CPU arm failed: then the fault word is set to `step` and `y` is left alone), then
    /// write (plain) or add (residual) the mailbox's CPU rows into `y[rows]`.
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
        self.wait_fold_targets(
            stream,
            mailbox,
            at,
            step,
            &[target],
            DoneWords::Whole,
            form,
            timeout,
        )
    }

    /// [`FlagsKernels::wait_fold`] for several outputs whose CPU rows follow one another in the
    /// mailbox (one step's q/k/v or gate/up): one launch. At most [`FOLD_MAX_TARGETS`] outputs,
    /// each borrowed from its buffer ([`FoldTarget::new`]); `done` says which done word guards
    /// which rows. With `at.fold_wait`, the fold adds the longest of its parts' waits there.
    #[allow(clippy::too_many_arguments)] // one launch's operands
    pub fn wait_fold_targets(
        &self,
        stream: &Stream,
        mailbox: &HostMappedBuffer,
        at: &MailboxOffsets,
        step: u32,
        targets: &[FoldTarget<'_>],
        done: DoneWords<'_>,
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
        let mut parts = FoldParts {
            cut: [0; FOLD_MAX_PARTS + 1],
            n: 1,
        };
        let (done_off, stride) = match done {
            DoneWords::Whole => {
                parts.cut[1] = total as u32;
                (at.done, 0)
            }
            DoneWords::PerPart(cuts) => {
                let n = cuts.len().saturating_sub(1);
                if n == 0 || n > FOLD_MAX_PARTS.min(at.part_done_count) {
                    return Err(GpuError::BufferTooSmall {
                        what: "fold parts (workers' done words)",
                        need: n,
                        got: FOLD_MAX_PARTS.min(at.part_done_count),
                    });
                }
                if cuts[0] != 0 || cuts[n] != total || cuts.windows(2).any(|w| w[0] > w[1]) {
                    return Err(GpuError::Invalid {
                        what: "fold parts",
                        rule: "cut points rise from 0 to the fold's total rows",
                    });
                }
                for (c, &v) in parts.cut.iter_mut().zip(cuts) {
                    *c = v as u32; // below `total`, which fits an i32 (checked above)
                }
                parts.n = n as i32;
                (at.part_done, at.part_done_stride)
            }
        };
        let widest = (0..parts.n as usize)
            .map(|p| (parts.cut[p + 1] - parts.cut[p]) as usize)
            .max()
            .unwrap_or(0);
        let blocks_per_part = widest
            .div_ceil(FOLD_THREADS as usize * FOLD_ROWS_PER_THREAD)
            .clamp(1, (FOLD_MAX_BLOCKS / parts.n as usize).max(1));
        let grid = blocks_per_part * parts.n as usize;
        let mut blocks_per_part_i = blocks_per_part as i32;
        let mut nsegs = targets.len() as i32;
        let mut pmb = mailbox.device_ptr();
        let mut done_off = offset_u32("mailbox done offset", done_off)?;
        let mut stride = offset_u32("mailbox done stride", stride)?;
        let mut fault = offset_u32("mailbox fault offset", at.fault)?;
        let mut scratch = match at.fold_wait {
            Some(_) => self.wait_scratch.device_ptr(),
            None => 0,
        };
        let mut wait_total = offset_u32("mailbox fold-wait offset", at.fold_wait.unwrap_or(0))?;
        let mut yo = offset_u32("mailbox y offset", at.y)?;
        let mut st = step;
        let mut residual = i32::from(matches!(form, GemvForm::Residual));
        let mut tmo = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut params: [*mut c_void; 14] = [
            (&mut pmb as *mut u64).cast(),
            (&mut done_off as *mut u32).cast(),
            (&mut stride as *mut u32).cast(),
            (&mut parts as *mut FoldParts).cast(),
            (&mut blocks_per_part_i as *mut i32).cast(),
            (&mut fault as *mut u32).cast(),
            (&mut scratch as *mut u64).cast(),
            (&mut wait_total as *mut u32).cast(),
            (&mut yo as *mut u32).cast(),
            (&mut st as *mut u32).cast(),
            (&mut segs as *mut FoldSegments).cast(),
            (&mut nsegs as *mut i32).cast(),
            (&mut residual as *mut i32).cast(),
            (&mut tmo as *mut u64).cast(),
        ];
        // SAFETY: kernel `flags_wait_fold(u8* mb, u32 done_off, u32 done_stride,
        // hf_fold_parts parts, int blocks_per_part, u32 fault_off, u64* wait_scratch,
        // u32 wait_off, u32 y_off, u32 step, hf_fold_segs segs, int nsegs, int residual,
        // u64 timeout_ns)`: fourteen parameters of these types (`FoldParts` and `FoldSegments`
        // are `hf_fold_parts`' and `hf_fold_segs`' layouts). Block b reads done word b /
        // blocks_per_part (at most `part_done_count` words, in bounds, checked) and
        // mb[y_off..y_off + 4*total] (checked above), writes the fault word, the fold-wait total
        // and the kernels' own two-word scratch (only when counted; in bounds, checked) and, per
        // target, `rows` floats from its `y` (bounds checked by `FoldTarget::new`; the buffer is
        // borrowed by the target for this call and its Drop frees synchronously). The spin
        // ends by itself after `timeout`.
        unsafe {
            self.launch_blocks(
                &self.wait_fold,
                grid as u32,
                FOLD_THREADS,
                stream,
                &mut params,
            )
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
/// fold's own work was ~12 µs per step on the H200
/// (docs/perf-checkpoints/2026-11-29-flags-step-cost-h200).
const FOLD_ROWS_PER_THREAD: usize = 2;
/// Blocks a fold launch may use (each one's first thread polls a done word): enough for two
/// rows per thread up to 32 k CPU rows (gate + up of a 14336-wide FFN at share 0.3 is ~20 k),
/// and one per part at [`FOLD_MAX_PARTS`]. Chosen, not tuned.
const FOLD_MAX_BLOCKS: usize = 64;

/// Done words a fold can wait on (`HF_FOLD_PARTS` in kernels/flags.cu): one per CPU worker, up
/// to 64 workers.
pub const FOLD_MAX_PARTS: usize = 64;

/// `hf_fold_parts` of kernels/flags.cu, passed by value.
#[repr(C)]
struct FoldParts {
    cut: [u32; FOLD_MAX_PARTS + 1],
    n: i32,
}

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
