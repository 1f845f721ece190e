//! The CPU half of the `flags` join: a host-visible mailbox and a pool job that waits on it.
//!
//! No host synchronisation per step: the device writes the activation into the mailbox, then
//! (after `__threadfence_system()`) the sequence word; the pool's workers, handed the job before
//! the device gets there, spin on that word, multiply their rows, write them into the mailbox
//! and publish their done words; on the device each block of the fold spins on the done word
//! of the rows it folds and copies (or adds) them into the output. This module is the host side
//! and the layout; the device kernels are `kernels/flags.cu` (launched by `hipfire_gpu::FlagsKernels`,
//! driven from [`crate::offload`]). In CPU-only tests, test-only stand-ins of the mailbox play
//! the device.
//!
//! # Layout (offsets in bytes; mirror them in the kernels)
//! | offset | what |
//! |---|---|
//! | [`SEQ_OFFSET`] | `u32` step number, written by the device after `x` |
//! | [`FAULT_OFFSET`] | `u32` step number of the last step the device's wait timed out or saw a failed arm |
//! | [`DONE_OFFSET`] | `u32` step number, written by the arm's last worker after every row (own cache line) |
//! | [`FOLD_WAIT_OFFSET`] | `u64` nanoseconds the device's folds have waited for done, summed (diagnostic, own line) |
//! | [`PART_DONE_OFFSET`] | [`MAX_DONE_PARTS`] lines: worker `p`'s `u32` done word at `PART_DONE_OFFSET + 64 p`, written after its rows |
//! | [`X_OFFSET`] | `k` f32: the activation; or, under [`FlagsTuning::tagged_x`], `k` 8-byte words, each an f32's bits with the step in the upper half (8 k bytes are kept for it) |
//! | [`Mailbox::y_offset`] | `rows` f32: `W[g + i] · x` for the CPU rows, always plain |
//!
//! A done word holds the step it finished, with [`DONE_FAILED`] set when the arm (or that
//! worker) failed; step numbers stay below that bit ([`next_step`]).
//!
//! The CPU rows are always the plain product; the device fold adds them for the residual form,
//! so the residual never crosses the link.

use crate::error::ExecError;
use crate::kernel::{gemv_rows, ActivationBuf};
use crate::pool::{partition, CpuPool, PoolJob, WORKER_ROW_ALIGN};
use crossbeam_utils::CachePadded;
use hipfire_quant::{Format, SharedActivation};
use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Offset of the device's sequence word.
pub const SEQ_OFFSET: usize = 0;
/// Offset of the CPU's done word for the whole arm: its own 64-byte line, so the device's
/// polling of it does not share a line with the word it writes.
pub const DONE_OFFSET: usize = 64;
/// Offset of the device's fault word (in the device's line: only the device writes it).
pub const FAULT_OFFSET: usize = 32;
/// Offset of the device's running total of fold waits: its own line, so that counting does not
/// touch the line the workers spin on.
pub const FOLD_WAIT_OFFSET: usize = 128;
/// Offset of the first worker's done word; each worker's is on its own line.
pub const PART_DONE_OFFSET: usize = 192;
/// Workers' done words a mailbox holds: a flags arm is cut into at most this many parts.
pub const MAX_DONE_PARTS: usize = hipfire_gpu::FOLD_MAX_PARTS;
/// Offset of the activation.
pub const X_OFFSET: usize = PART_DONE_OFFSET + MAX_DONE_PARTS * MAILBOX_ALIGN;
/// Bytes per element of the x area: room for the tagged form ([`FlagsTuning::tagged_x`]).
pub const TAGGED_X_BYTES: usize = 8;
/// Alignment of the mailbox and of its areas (a cache line).
pub const MAILBOX_ALIGN: usize = 64;
/// Set in a done word when the step failed (its rows unspecified): the device's fold then
/// marks the fault word instead of folding. `HF_DONE_FAILED` in kernels/flags.cu.
pub const DONE_FAILED: u32 = 0x8000_0000;

/// The step number after `step`: never 0 (the mailbox starts zeroed) and always below
/// [`DONE_FAILED`].
pub fn next_step(step: u32) -> u32 {
    let next = step.wrapping_add(1);
    if next == 0 || next >= DONE_FAILED {
        1
    } else {
        next
    }
}

/// The flags arm's host-side tuning (`single_layer --flags-variants`); the default is what
/// measured best on the H200 box (docs/perf-checkpoints/2026-11-29-done-words-dram-layers-h200,
/// -layer-targets-rounds-h200 and 2026-11-30-cpu-idle-chunks-h200). The alternatives that lost
/// their A/B were deleted with their code; their figures stay in those records and in
/// docs/design.md's table of alternatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagsTuning {
    /// While a worker waits for x (and for the shared activation), it prefetches up to this
    /// many bytes of the start of its weight rows into its L2 (x86-64; 0: off), so that the
    /// time between steps, when the memory system is idle, does part of the arm's reading
    /// ([`DEFAULT_WAIT_PREFETCH_BYTES`]).
    pub prefetch_bytes: usize,
    /// The CPU rows are cut into about this many chunks per worker (at most
    /// [`MAX_DONE_PARTS`] in all), each with its own done word: every worker starts on its own
    /// chunk (the one it prefetches while waiting), then takes the rest off a counter, so that
    /// a worker slowed by its core (a VM's vCPUs are not equal) hands its share to the others
    /// instead of holding the step ([`DEFAULT_CHUNKS_PER_WORKER`]; 0 counts as 1).
    pub chunks_per_worker: u8,
    /// For formats whose workers prepare x together ([`FlagsTuning::x_is_shared`]), the device
    /// stores each element as one 8-byte word with the step beside it
    /// (`FlagsKernels::publish_tagged`): no system fence and no sequence word behind x; the
    /// workers poll element 0 and check every element's step as they read it. Off
    /// (`memory.flags_x_publish = fenced`) for a platform where an aligned 8-byte device store
    /// is not known to reach host memory whole: x then goes down plain, behind a fence and the
    /// sequence word.
    pub tagged_x: bool,
    /// Blocks of the tagged publish at most ([`DEFAULT_PUBLISH_BLOCKS`]); it uses one per 1024
    /// elements of x up to this. One block writes x over the link at a few GB/s (the publish
    /// took 6.1 µs a step for 16–56 KiB of x on the H200, the 2026-11-30 cpu-idle record), and
    /// the GPU arm starts after it. Still under measurement, so only in builds with the
    /// `experiments` feature; the product publishes with [`DEFAULT_PUBLISH_BLOCKS`].
    #[cfg(feature = "experiments")]
    pub publish_blocks: u32,
}

/// The tagged publish runs as one block by default ([`FlagsTuning::tagged_publish_blocks`]). On
/// the H200, 16 blocks ran the layer at 1.018× with a host sync around every layer (95 %
/// interval 1.003–1.030, 15 interleaved rounds) but 0.998× at 8 layers per timed rep, where that
/// call's rounds spread 0.78–1.45 (docs/perf-checkpoints/2026-11-30-share-intervals-h200 record
/// 08): one block until the chained case, decode's, confirms the gain.
pub const DEFAULT_PUBLISH_BLOCKS: u32 = 1;

/// x travels tagged by default ([`FlagsTuning::tagged_x`]): on the H200 box the device's
/// publish went from 7.4 to 6.1 µs a step, the layer ran 1.010× as fast (median of 15
/// interleaved rounds), and with it the layer met every target at 8 layers per timed rep
/// (docs/perf-checkpoints/2026-11-30-cpu-idle-chunks-h200, record 05).
pub const DEFAULT_TAGGED_X: bool = true;

/// Chunks per worker by default ([`FlagsTuning::chunks_per_worker`]): 4 (60 chunks for 15
/// workers, within the fold's 64 done words). On the H200 box, one part per worker ran at
/// 0.955× of it and 8 chunks at 1.005× (record 04); in an earlier A/B 4 chunks ran 1.008× and 2
/// chunks 0.994× of one part per worker (record 02); medians of 15 interleaved rounds,
/// docs/perf-checkpoints/2026-11-30-cpu-idle-chunks-h200.
pub const DEFAULT_CHUNKS_PER_WORKER: u8 = 4;

/// Bytes of its weight rows a worker prefetches while it waits for x and for the shared
/// activation ([`FlagsTuning::prefetch_bytes`]): 64 KiB, about what fifteen workers can read in
/// the ~13 µs between steps at the box's ~70 GB/s, and a thirtieth of a core's 2 MiB L2. On the
/// H200 box the layer ran 1.035× as fast as with none (16 KiB 1.024×, 256 KiB 1.028×; medians
/// of 13 interleaved rounds, docs/perf-checkpoints/2026-11-30-cpu-idle-chunks-h200, record 01), and
/// none ran at 0.970× of it in record 02; 128 KiB read 0.956–1.016× of it over four A/Bs
/// (records 02–05), so it stays at 64.
pub const DEFAULT_WAIT_PREFETCH_BYTES: usize = 64 << 10;

impl Default for FlagsTuning {
    fn default() -> Self {
        FlagsTuning {
            prefetch_bytes: DEFAULT_WAIT_PREFETCH_BYTES,
            chunks_per_worker: DEFAULT_CHUNKS_PER_WORKER,
            tagged_x: DEFAULT_TAGGED_X,
            #[cfg(feature = "experiments")]
            publish_blocks: DEFAULT_PUBLISH_BLOCKS,
        }
    }
}

impl FlagsTuning {
    /// Whether x travels tagged ([`FlagsTuning::tagged_x`]) for `format` under these knobs.
    pub fn x_is_tagged(&self, format: Format) -> bool {
        self.tagged_x && self.x_is_shared(format)
    }

    /// Whether the workers prepare x together for `format` (its CPU activation is q8_K:
    /// Q4_K, Q6_K): each takes 256-element blocks off a counter, and all read the one result.
    /// On the H200 box this cut the workers' preparation from 3.5 to 1.7 % of the layer's wall,
    /// and the layer ran 1.011× as fast as each worker preparing all of x itself (median of 9
    /// interleaved rounds, twice: docs/perf-checkpoints/2026-11-29-layer-targets-rounds-h200).
    /// Other formats: each worker prepares x itself.
    pub fn x_is_shared(&self, format: Format) -> bool {
        SharedActivation::supports(format)
    }

    /// Blocks of the tagged publish at most: [`DEFAULT_PUBLISH_BLOCKS`], or under the
    /// `experiments` feature the tuning's `publish_blocks`.
    pub fn tagged_publish_blocks(&self) -> u32 {
        #[cfg(feature = "experiments")]
        {
            self.publish_blocks
        }
        #[cfg(not(feature = "experiments"))]
        {
            DEFAULT_PUBLISH_BLOCKS
        }
    }
}

/// Default wait for the device's sequence word before a worker gives up (so a device fault
/// becomes an error, never a hung pool). A decode step is well under 100 ms even for the
/// largest spilled layer; one second is far outside normal operation.
pub const DEFAULT_FLAGS_TIMEOUT: Duration = Duration::from_secs(1);

/// Polls of a word between reads of the clock and of the cancel flag: enough that the clock
/// (a vDSO call) is a small part of the loop, few enough that cancellation and the timeout are
/// seen within microseconds. Chosen, not tuned.
const WAIT_POLLS_PER_CHECK: usize = 32;

/// How long a waiting worker spins before it yields its core between checks: past the
/// handshake's 3.5–4.4 µs on the H200 box, and short enough that an oversubscribed core is not
/// held from the thread that would publish.
const WAIT_SPIN_BEFORE_YIELD: Duration = Duration::from_micros(20);

/// Memory a mailbox lives in.
///
/// # Safety
/// `base()` must point to `len()` bytes that stay valid, writable and not moved for as long as
/// the value lives, aligned to [`MAILBOX_ALIGN`]; only the mailbox protocol may access them.
pub unsafe trait MailboxMemory: Send + Sync {
    /// Start of the memory.
    fn base(&self) -> *mut u8;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// True iff `len() == 0`.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a pinned, page-aligned allocation owned by the buffer, valid until it drops.
unsafe impl MailboxMemory for hipfire_gpu::HostMappedBuffer {
    fn base(&self) -> *mut u8 {
        self.host_ptr()
    }
    fn len(&self) -> usize {
        hipfire_gpu::HostMappedBuffer::len(self)
    }
}

/// One cache line (for [`HostMailboxMemory`]'s alignment).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; MAILBOX_ALIGN]);

/// Plain host memory for a mailbox (CPU-only runs and tests).
pub struct HostMailboxMemory {
    lines: Box<[std::cell::UnsafeCell<Line>]>,
}

impl HostMailboxMemory {
    /// At least `bytes` zeroed bytes.
    pub fn new(bytes: usize) -> HostMailboxMemory {
        let n = bytes.div_ceil(MAILBOX_ALIGN).max(1);
        HostMailboxMemory {
            lines: (0..n)
                .map(|_| std::cell::UnsafeCell::new(Line([0; MAILBOX_ALIGN])))
                .collect(),
        }
    }
}

// SAFETY: the memory is only reached through raw pointers under the mailbox protocol (atomics
// for the words, disjoint row ranges for the data).
unsafe impl Sync for HostMailboxMemory {}

// SAFETY: owned, 64-byte aligned (`Line`), never moved (boxed slice), valid until drop.
unsafe impl MailboxMemory for HostMailboxMemory {
    fn base(&self) -> *mut u8 {
        self.lines.as_ptr() as *mut u8
    }
    fn len(&self) -> usize {
        self.lines.len() * MAILBOX_ALIGN
    }
}

/// A mailbox for activations of `k` values and `rows` CPU rows.
#[derive(Clone)]
pub struct Mailbox {
    mem: Arc<dyn MailboxMemory>,
    k: usize,
    rows: usize,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("k", &self.k)
            .field("rows", &self.rows)
            .finish()
    }
}

impl Mailbox {
    /// Bytes a mailbox for `k` and `rows` needs.
    pub fn bytes_needed(k: usize, rows: usize) -> usize {
        Mailbox::y_offset_for(k) + rows * 4
    }

    fn y_offset_for(k: usize) -> usize {
        (X_OFFSET + k * TAGGED_X_BYTES).div_ceil(MAILBOX_ALIGN) * MAILBOX_ALIGN
    }

    /// A mailbox over `mem`; errors if it is too small or misaligned.
    pub fn new(mem: Arc<dyn MailboxMemory>, k: usize, rows: usize) -> Result<Mailbox, ExecError> {
        let need = Mailbox::bytes_needed(k, rows);
        if mem.len() < need {
            return Err(ExecError::Shape {
                what: "mailbox bytes",
                need,
                got: mem.len(),
            });
        }
        if mem.base() as usize % MAILBOX_ALIGN != 0 {
            return Err(ExecError::Invalid {
                what: "mailbox memory",
                value: format!("{:p}", mem.base()),
                rule: "64-byte aligned",
            });
        }
        Ok(Mailbox { mem, k, rows })
    }

    /// Byte offset of the CPU rows.
    pub fn y_offset(&self) -> usize {
        Mailbox::y_offset_for(self.k)
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offset + 4 <= len (checked in `new`: every word lies below X_OFFSET), the base
        // is 64-aligned so the word is 4-aligned, and the memory outlives `self` (Arc).
        unsafe { &*(self.mem.base().add(offset) as *const AtomicU32) }
    }

    /// The device's sequence word.
    pub fn seq(&self) -> &AtomicU32 {
        self.word(SEQ_OFFSET)
    }

    /// The CPU's done word for the whole arm.
    pub fn done(&self) -> &AtomicU32 {
        self.word(DONE_OFFSET)
    }

    /// Worker `part`'s done word (`part < MAX_DONE_PARTS`).
    pub fn part_done(&self, part: usize) -> &AtomicU32 {
        debug_assert!(part < MAX_DONE_PARTS);
        self.word(PART_DONE_OFFSET + part.min(MAX_DONE_PARTS - 1) * MAILBOX_ALIGN)
    }

    /// The device's fault word.
    pub fn fault(&self) -> &AtomicU32 {
        self.word(FAULT_OFFSET)
    }

    /// Nanoseconds the device's wait-folds have spent waiting for done, summed since the
    /// mailbox was made (the device adds to it; read it once the stream has drained).
    pub fn fold_wait_ns(&self) -> u64 {
        // SAFETY: 8-aligned and in bounds (below X_OFFSET, base 64-aligned, `new`); only the
        // device writes it, with plain stores ordered by the stream.
        unsafe { std::ptr::read_volatile(self.mem.base().add(FOLD_WAIT_OFFSET) as *const u64) }
    }

    /// Activation length this mailbox was laid out for.
    pub fn k(&self) -> usize {
        self.k
    }

    /// CPU rows this mailbox holds at most.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The layout, for the device kernels.
    pub fn offsets(&self) -> hipfire_gpu::MailboxOffsets {
        hipfire_gpu::MailboxOffsets {
            seq: SEQ_OFFSET,
            done: DONE_OFFSET,
            part_done: PART_DONE_OFFSET,
            part_done_stride: MAILBOX_ALIGN,
            part_done_count: MAX_DONE_PARTS,
            fault: FAULT_OFFSET,
            fold_wait: Some(FOLD_WAIT_OFFSET),
            x: X_OFFSET,
            y: self.y_offset(),
        }
    }

    /// Stand-in for the device in CPU-only tests: write `x`, then publish `step` (release).
    #[cfg(test)]
    pub(crate) fn device_publish(&self, x: &[f32], step: u32) -> Result<(), ExecError> {
        if x.len() > self.k {
            return Err(ExecError::Shape {
                what: "x",
                need: self.k,
                got: x.len(),
            });
        }
        // SAFETY: the x area is in bounds (`new`); the protocol gives the device sole access to
        // it until `seq` says `step` (workers read it only after seeing that value).
        let dst = unsafe {
            std::slice::from_raw_parts_mut(self.mem.base().add(X_OFFSET) as *mut f32, x.len())
        };
        dst.copy_from_slice(x);
        self.seq().store(step, Ordering::Release);
        Ok(())
    }

    /// The x area as tagged words ([`FlagsTuning::tagged_x`]).
    fn x_tagged(&self) -> &[AtomicU64] {
        // SAFETY: in bounds (`new`: the x area holds k 8-byte words), 8-aligned (base 64-aligned,
        // X_OFFSET a multiple of 64); AtomicU64 has u64's layout and every bit pattern is valid.
        unsafe {
            std::slice::from_raw_parts(self.mem.base().add(X_OFFSET) as *const AtomicU64, self.k)
        }
    }

    /// Stand-in for the device's tagged publish (`FlagsKernels::publish_tagged`) in CPU-only
    /// tests: store each element with `step` in its upper half (release), no sequence word;
    /// element 0 first, then the rest after a 2 ms pause (`TAGGED_STAND_IN_PAUSE`), so that
    /// readers meet elements not yet written.
    #[cfg(test)]
    pub(crate) fn device_publish_tagged(&self, x: &[f32], step: u32) -> Result<(), ExecError> {
        if x.len() > self.k {
            return Err(ExecError::Shape {
                what: "x",
                need: self.k,
                got: x.len(),
            });
        }
        let words = self.x_tagged();
        for (i, (w, v)) in words.iter().zip(x).enumerate() {
            w.store(tagged(*v, step), Ordering::Release);
            if i == 0 {
                // The workers start on element 0: let them meet the rest still unwritten.
                std::thread::sleep(TAGGED_STAND_IN_PAUSE);
            }
        }
        Ok(())
    }

    /// Stand-in for the device in CPU-only tests: wait until done says `step`, then return the
    /// CPU rows.
    #[cfg(test)]
    pub(crate) fn device_wait_done(
        &self,
        step: u32,
        timeout: Duration,
    ) -> Result<Vec<f32>, ExecError> {
        let seen = wait_word(
            || self.done().load(Ordering::Acquire),
            |v| v & !DONE_FAILED == step,
            timeout,
            "flags done word",
            None,
            || false,
        )?;
        if seen & DONE_FAILED != 0 {
            return Err(ExecError::FlagsFault { step });
        }
        // SAFETY: in bounds (`new`); after done == step (acquire) no worker writes the rows.
        let rows = unsafe {
            std::slice::from_raw_parts(
                self.mem.base().add(self.y_offset()) as *const f32,
                self.rows,
            )
        };
        Ok(rows.to_vec())
    }
}

/// How long `Mailbox::device_publish_tagged` leaves x with only element 0 written: long
/// against a worker's wake-up, short for a test.
#[cfg(test)]
const TAGGED_STAND_IN_PAUSE: Duration = Duration::from_millis(2);

/// One element of a tagged x: its f32 bits, `step` in the upper half.
#[cfg(test)]
fn tagged(v: f32, step: u32) -> u64 {
    (u64::from(step) << 32) | u64::from(v.to_bits())
}

/// Spin (yielding) until `load` (an acquire load of a word) gives a value `want` accepts
/// (returned), or time out, or `cancel` is raised. `idle` runs between batches of polls and
/// says whether it did work (the weight prefetch): while it does, each batch is one poll
/// without a pause, so that the work goes at the memory system's pace rather than at one batch
/// per [`WAIT_POLLS_PER_CHECK`] paused polls (~1 µs on a recent Xeon, where a pause is ~140
/// cycles: 512 bytes per µs, a twentieth of a core's share of the box's bandwidth).
fn wait_word(
    load: impl Fn() -> u32,
    want: impl Fn(u32) -> bool,
    timeout: Duration,
    what: &'static str,
    cancel: Option<&AtomicBool>,
    mut idle: impl FnMut() -> bool,
) -> Result<u32, ExecError> {
    let t0 = Instant::now();
    // When the spinning without work began (the yield below counts from there).
    let mut idle_since: Option<Instant> = None;
    let mut busy_batches = 0usize;
    loop {
        let busy = idle();
        if busy {
            let v = load();
            if want(v) {
                return Ok(v);
            }
            busy_batches += 1;
            if busy_batches % WAIT_POLLS_PER_CHECK != 0 {
                continue;
            }
        } else {
            for _ in 0..WAIT_POLLS_PER_CHECK {
                let v = load();
                if want(v) {
                    return Ok(v);
                }
                std::hint::spin_loop();
            }
        }
        if cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(ExecError::Invalid {
                what,
                value: "the awaited step".into(),
                rule: "cancelled: the device side of the step was never queued",
            });
        }
        let now = Instant::now();
        if now.duration_since(t0) >= timeout {
            return Err(ExecError::Timeout {
                what,
                after: timeout,
            });
        }
        // Keep the core while the device is about to publish (a yield is a syscall, a good
        // part of the ~4 µs handshake); give it away once the wait is long, which is when a
        // core is oversubscribed (the 2-core CI runner) or the device is busy elsewhere.
        if busy {
            idle_since = None;
        } else if now.duration_since(*idle_since.get_or_insert(now)) >= WAIT_SPIN_BEFORE_YIELD {
            std::thread::yield_now();
        }
    }
}

/// Bytes of a weight a flags job owns a share of.
pub trait WeightBytes: Send + Sync {
    /// The bytes (rows `row_bytes` apart).
    fn bytes(&self) -> &[u8];
}

impl WeightBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl WeightBytes for hipfire_gpu::HostMappedBuffer {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Rows `[g, g + rows)` of one weight: the CPU's part of one output of a flags step.
#[derive(Clone)]
pub struct ArmRows {
    /// The whole weight.
    pub weight: Arc<dyn WeightBytes>,
    /// First CPU row (the GPU computes `[0, g)`).
    pub g: usize,
    /// CPU rows.
    pub rows: usize,
}

/// One step's CPU arm under the flags join: the CPU rows of one or more outputs that share the
/// step's activation (q/k/v, gate/up), written one after another into the mailbox.
pub struct FlagsArm {
    /// Weight format (every part's).
    pub format: Format,
    /// Row length.
    pub k: usize,
    /// The outputs' CPU rows, in mailbox order; their total is at most the mailbox's rows.
    pub parts: Vec<ArmRows>,
    /// The mailbox.
    pub mailbox: Mailbox,
    /// Step number the device will publish.
    pub step: u32,
    /// Give up waiting for the device after this long.
    pub timeout: Duration,
    /// How done is signalled and the rows written.
    pub tuning: FlagsTuning,
}

/// What a flags arm measured.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct FlagsReport {
    /// Longest a worker waited for the sequence word (ns).
    pub wait_ns: f64,
    /// Longest a worker spent multiplying after it (ns), its activation preparation included.
    pub cpu_ns: f64,
    /// Longest a worker spent preparing the activation (ns; part of `cpu_ns`).
    pub prepare_ns: f64,
    /// When the first and the last worker saw the sequence word, and when the last one
    /// finished (ns on [`flags_clock_ns`]'s clock): the arm's span is `done − first_seen`, and
    /// `first_seen` of a step minus `done` of the one before is the device's turnaround
    /// (fold, kernels between, publish).
    pub first_seen_ns: u64,
    /// See `first_seen_ns`.
    pub last_seen_ns: u64,
    /// See `first_seen_ns`.
    pub done_ns: u64,
    /// Bytes of weight rows the workers prefetched while they waited (for x and for the
    /// shared activation), summed over the workers ([`FlagsTuning::prefetch_bytes`] each at
    /// most): how much of the budget the wait had time for.
    pub prefetched_bytes: u64,
}

/// Nanoseconds since the first call in this process: the clock of [`FlagsReport`]'s instants.
pub fn flags_clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// x prepared by the workers together ([`FlagsTuning::x_is_shared`]).
struct SharedX {
    act: SharedActivation,
    /// The next block to take (its own cache line, as is `done`: every worker updates both).
    next: CachePadded<AtomicU32>,
    /// Blocks prepared (or given up on): the activation is read once it reaches all of them.
    done: CachePadded<AtomicU32>,
    /// A block could not be prepared (a non-finite x).
    failed: AtomicBool,
}

impl SharedX {
    fn new(format: Format, k: usize) -> Result<SharedX, ExecError> {
        let act = SharedActivation::new(format, k)?;
        if u32::try_from(act.blocks()).is_err() {
            return Err(ExecError::Shape {
                what: "activation blocks",
                need: act.blocks(),
                got: u32::MAX as usize,
            });
        }
        Ok(SharedX {
            act,
            next: CachePadded::new(AtomicU32::new(0)),
            done: CachePadded::new(AtomicU32::new(0)),
            failed: AtomicBool::new(false),
        })
    }

    /// Block `b` of the activation from `x` (read, and waited for when tagged).
    ///
    /// # Safety
    /// As [`SharedActivation::prepare_block`] for block `b`: no other thread prepares it at the
    /// same time or later, and no thread holds the activation meanwhile.
    unsafe fn prepare_block(
        &self,
        x: &XSource<'_>,
        b: usize,
        job: &FlagsJob,
    ) -> Result<(), ExecError> {
        let mut vals = [0.0f32; Q8K_BLOCK];
        let v = x.block(b, &mut vals, job)?;
        // SAFETY: the caller's contract.
        Ok(unsafe { self.act.prepare_block(b, v) }?)
    }

    /// Take blocks of x off the counter until none is left, then wait until every block is
    /// prepared: the activation every worker multiplies by.
    /// The worker's weight prefetch goes on while it waits for the others.
    fn prepare(
        &self,
        x: &XSource<'_>,
        job: &FlagsJob,
        prefetch: &mut WeightPrefetch<'_>,
    ) -> Result<&ActivationBuf, ExecError> {
        let blocks = self.act.blocks() as u32;
        let mut err = None;
        loop {
            let b = self.next.fetch_add(1, Ordering::Relaxed);
            if b >= blocks {
                break;
            }
            let b = b as usize;
            // SAFETY: the counter hands block b to this worker alone, once; no worker reads
            // the activation before `done` counts every block (below, acquire).
            if let Err(e) = unsafe { self.prepare_block(x, b, job) } {
                self.failed.store(true, Ordering::Relaxed);
                err = Some(e);
            }
            // Counted even when it failed, so that the others stop waiting.
            self.done.fetch_add(1, Ordering::Release);
        }
        if let Some(e) = err {
            return Err(e);
        }
        wait_word(
            || self.done.load(Ordering::Acquire),
            |v| v >= blocks,
            job.timeout,
            "flags shared activation",
            Some(&job.cancelled),
            || prefetch.advance(),
        )?;
        if self.failed.load(Ordering::Relaxed) {
            return Err(ExecError::Invalid {
                what: "activation",
                value: "a non-finite value".into(),
                rule: "every value finite (another worker found one)",
            });
        }
        // SAFETY: every block is prepared, ordered before this point (`done` released per
        // block, acquired in `wait_word`), and the counter never hands out a block again.
        Ok(unsafe { self.act.activation() })
    }
}

/// Elements per block of x prepared together (q8_K's super-block).
const Q8K_BLOCK: usize = hipfire_quant::Q8K_BLOCK;

/// Where the workers read x from when they prepare it together.
enum XSource<'a> {
    /// Plain f32 after the sequence word said the step.
    Plain(&'a [f32]),
    /// Tagged words ([`FlagsTuning::tagged_x`]): each element is the step's once its upper
    /// half says so.
    Tagged(&'a [AtomicU64]),
}

impl XSource<'_> {
    /// Block `b`'s [`Q8K_BLOCK`] values: a slice of a plain x, or gathered into `buf` from a
    /// tagged one, waiting (with the job's timeout and cancel) for any element not yet there.
    fn block<'b>(
        &'b self,
        b: usize,
        buf: &'b mut [f32; Q8K_BLOCK],
        job: &FlagsJob,
    ) -> Result<&'b [f32], ExecError> {
        let range = b * Q8K_BLOCK..(b + 1) * Q8K_BLOCK;
        let short = |got| ExecError::Shape {
            what: "activation block",
            need: range.end,
            got,
        };
        match self {
            XSource::Plain(x) => x.get(range.clone()).ok_or(short(x.len())),
            XSource::Tagged(words) => {
                let words = words.get(range.clone()).ok_or(short(words.len()))?;
                for (out, w) in buf.iter_mut().zip(words) {
                    let mut v = w.load(Ordering::Acquire);
                    if (v >> 32) as u32 != job.step {
                        wait_word(
                            || (w.load(Ordering::Acquire) >> 32) as u32,
                            |t| t == job.step,
                            job.timeout,
                            "flags tagged activation",
                            Some(&job.cancelled),
                            || false,
                        )?;
                        // The device writes each element once per step: it is the step's now.
                        v = w.load(Ordering::Acquire);
                    }
                    *out = f32::from_bits(v as u32);
                }
                Ok(&buf[..])
            }
        }
    }
}

/// The job the workers share.
struct FlagsJob {
    format: Format,
    k: usize,
    parts: Vec<ArmRows>,
    /// Total CPU rows (the parts' rows, concatenated: the workers' row space).
    rows_n: usize,
    mailbox: Mailbox,
    step: u32,
    timeout: Duration,
    /// Raised when the device side was never queued: waiting workers give up at once.
    cancelled: AtomicBool,
    row_bytes: usize,
    tuning: FlagsTuning,
    /// x prepared together, when the tuning says so.
    shared_x: Option<SharedX>,
    /// The parts of `[0, rows_n)` as cut points (part `p` is `cuts[p]..cuts[p + 1]`), each with
    /// its own done word: the chunks of [`FlagsTuning::chunks_per_worker`] (worker `w` starts
    /// on chunk `w`).
    cuts: Vec<usize>,
    /// The next chunk to take (starts at the number of workers).
    next_chunk: CachePadded<AtomicUsize>,
    /// Workers still to finish; the last one publishes done.
    /// (On its own cache line, like `failed` and each worker's stats: the fields above are
    /// read by every worker throughout the arm, and a store to a line they share would take
    /// it from all of them.)
    remaining: CachePadded<AtomicUsize>,
    /// Raised by a worker that failed: done then says so.
    failed: CachePadded<AtomicBool>,
    /// What each part's worker measured (one slot per part, and a last one for a worker whose
    /// rows are not one of the parts), collected by the ticket once the arm is over.
    stats: Vec<CachePadded<WorkerStats>>,
}

/// What one worker measured of its part (ns). Each on its own cache line: the workers record
/// these right after they see x, all at once, and fifteen read-modify-writes of one shared
/// line there queue behind each other for the line.
#[derive(Debug)]
struct WorkerStats {
    /// Wait for the sequence word.
    wait_ns: AtomicU64,
    /// Preparation of x and the multiply.
    cpu_ns: AtomicU64,
    /// Preparation of x alone.
    prepare_ns: AtomicU64,
    /// When it saw the sequence word and when it was done ([`flags_clock_ns`]; `u64::MAX`
    /// and 0 until then).
    seen: AtomicU64,
    done_at: AtomicU64,
    /// Bytes of weight rows prefetched while waiting.
    prefetched: AtomicU64,
}

impl Default for WorkerStats {
    fn default() -> Self {
        WorkerStats {
            wait_ns: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            prepare_ns: AtomicU64::new(0),
            seen: AtomicU64::new(u64::MAX),
            done_at: AtomicU64::new(0),
            prefetched: AtomicU64::new(0),
        }
    }
}

impl FlagsJob {
    /// This worker's arm: `rows` of the concatenated row space, which is part `part` of the cut,
    /// then chunks off the counter until none is left, publishing
    /// each one's done word as it finishes. `holding` names the part whose done word is still
    /// this worker's to publish (its first part until published, then the chunk it is on):
    /// the caller publishes it, failed or not, whatever way this returns.
    fn rows(
        &self,
        rows: Range<usize>,
        part: Option<usize>,
        holding: &Cell<Option<usize>>,
    ) -> Result<(), ExecError> {
        let mb = &self.mailbox;
        let t_wait = Instant::now();
        let mut prefetch = WeightPrefetch::new(self, &rows);
        let tagged = self.tuning.x_is_tagged(self.format);
        wait_word(
            || {
                if tagged {
                    // The first element's step stands for the sequence word.
                    mb.x_tagged()
                        .first()
                        .map_or(0, |w| (w.load(Ordering::Acquire) >> 32) as u32)
                } else {
                    mb.seq().load(Ordering::Acquire)
                }
            },
            |v| v == self.step,
            self.timeout,
            "flags sequence word",
            Some(&self.cancelled),
            || prefetch.advance(),
        )?;
        let waited = t_wait.elapsed();
        let seen = flags_clock_ns();
        // Uncontended: this worker's own line (the fallback slot is shared, hence min/max).
        let last = self.stats.len().saturating_sub(1);
        let stats =
            self.stats
                .get(part.map_or(last, |p| p.min(last)))
                .ok_or(ExecError::Invalid {
                    what: "flags job",
                    value: "no stats slots".into(),
                    rule: "submitted through CpuPool::submit_flags",
                })?;
        stats.seen.fetch_min(seen, Ordering::Relaxed);
        stats
            .wait_ns
            .fetch_max(waited.as_nanos() as u64, Ordering::Relaxed);
        let t = Instant::now();
        // Plain x, read only when x is not tagged (a tagged area may still be being written
        // when element 0 is seen).
        // SAFETY: in bounds (`Mailbox::new`); after seq == step (acquire, in `wait_word`) the
        // device does not write x until it sees done.
        let plain_x = || unsafe {
            std::slice::from_raw_parts(mb.mem.base().add(X_OFFSET) as *const f32, self.k)
        };
        let owned;
        let act = if let Some(shared) = &self.shared_x {
            let src = if tagged {
                XSource::Tagged(mb.x_tagged())
            } else {
                XSource::Plain(plain_x())
            };
            shared.prepare(&src, self, &mut prefetch)?
        } else {
            owned = ActivationBuf::prepare(self.format, plain_x())?;
            &owned
        };
        stats
            .prepare_ns
            .fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats
            .prefetched
            .fetch_add(prefetch.issued() as u64, Ordering::Relaxed);
        self.write_rows(&rows, act)?;
        if let Some(p) = part {
            self.part_done(p, false);
        }
        holding.set(None);
        loop {
            let c = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            let Some(chunk) = self.cuts.get(c..c + 2).map(|w| w[0]..w[1]) else {
                break;
            };
            holding.set(Some(c));
            self.write_rows(&chunk, act)?;
            self.part_done(c, false);
            holding.set(None);
        }
        stats
            .cpu_ns
            .fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.done_at.fetch_max(flags_clock_ns(), Ordering::Relaxed);
        Ok(())
    }
}

impl FlagsJob {
    /// `rows` of the concatenated row space, multiplied into their slot of the mailbox.
    fn write_rows(&self, rows: &Range<usize>, act: &ActivationBuf) -> Result<(), ExecError> {
        let mb = &self.mailbox;
        // SAFETY: `rows` is one part of [0, rows_n) (partition; rows_n is at most the
        // mailbox's rows, checked at submit), so the slice is in bounds; each part is handed
        // to one worker once (its first part at submit, a chunk by the counter), which alone
        // writes it until its done word is published.
        let y = unsafe {
            std::slice::from_raw_parts_mut(
                (mb.mem.base().add(mb.y_offset()) as *mut f32).add(rows.start),
                rows.len(),
            )
        };
        self.multiply(rows, act, y)
    }

    /// Once a worker failed: the chunks nobody took yet are published as failed, so that the
    /// device's fold does not wait for them until its timeout.
    fn fail_untaken_chunks(&self) {
        loop {
            let c = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            if c + 1 >= self.cuts.len() {
                break;
            }
            self.part_done(c, true);
        }
    }
}

/// Cache lines a waiting worker prefetches between batches of polls
/// ([`FlagsTuning::prefetch_bytes`]): 512 bytes, a few of a core's fill buffers, so that a poll
/// batch still sees the sequence word within a fraction of a microsecond.
const PREFETCH_LINES_PER_BATCH: usize = 8;

/// The start of a worker's weight rows, pulled into its cache while it waits for x
/// ([`FlagsTuning::prefetch_bytes`]): the memory system is otherwise idle between steps.
struct WeightPrefetch<'a> {
    /// The worker's byte ranges of each part's weight, in the order it will read them.
    spans: Vec<&'a [u8]>,
    span: usize,
    off: usize,
    left: usize,
    /// Bytes issued so far.
    issued: usize,
}

impl<'a> WeightPrefetch<'a> {
    fn new(job: &'a FlagsJob, rows: &Range<usize>) -> WeightPrefetch<'a> {
        let mut spans = Vec::new();
        if job.tuning.prefetch_bytes > 0 {
            for (part, r, _) in job.overlaps(rows.clone()) {
                if let Some(b) = part
                    .weight
                    .bytes()
                    .get(r.start * job.row_bytes..r.end * job.row_bytes)
                {
                    spans.push(b);
                }
            }
        }
        WeightPrefetch {
            spans,
            span: 0,
            off: 0,
            left: job.tuning.prefetch_bytes,
            issued: 0,
        }
    }

    /// Bytes prefetched so far.
    fn issued(&self) -> usize {
        self.issued
    }

    /// Prefetch the next few lines, until the budget or the rows run out; whether any was
    /// left to prefetch.
    fn advance(&mut self) -> bool {
        for _ in 0..PREFETCH_LINES_PER_BATCH {
            let Some(span) = self.spans.get(self.span) else {
                return false;
            };
            if self.left == 0 {
                return false;
            }
            if self.off >= span.len() {
                self.span += 1;
                self.off = 0;
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the pointer is inside `span`; a prefetch never faults and SSE is part of
            // x86-64. T1: into L2 (and L3), where the multiply will find it.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(span.as_ptr().add(self.off) as *const i8);
            }
            self.off += MAILBOX_ALIGN;
            self.left = self.left.saturating_sub(MAILBOX_ALIGN);
            self.issued += MAILBOX_ALIGN;
        }
        true
    }
}

impl FlagsJob {
    /// This worker's rows of every part that overlaps them (`y` is their slot in the
    /// concatenated rows).
    fn multiply(
        &self,
        rows: &Range<usize>,
        act: &ActivationBuf,
        y: &mut [f32],
    ) -> Result<(), ExecError> {
        for (part, weight_rows, out) in self.overlaps(rows.clone()) {
            let w = &part.weight.bytes()
                [weight_rows.start * self.row_bytes..weight_rows.end * self.row_bytes];
            gemv_rows(self.format, w, self.k, act, &mut y[out], false)?;
        }
        Ok(())
    }

    /// The parts that overlap `rows` of the concatenated row space: each part, its weight rows
    /// in that overlap, and where they sit in `rows` (from 0).
    fn overlaps(
        &self,
        rows: Range<usize>,
    ) -> impl Iterator<Item = (&ArmRows, Range<usize>, Range<usize>)> + '_ {
        let mut base = 0;
        self.parts.iter().filter_map(move |part| {
            let (lo, hi) = (rows.start.max(base), rows.end.min(base + part.rows));
            let out = (lo < hi).then(|| {
                (
                    part,
                    part.g + lo - base..part.g + hi - base,
                    lo - rows.start..hi - rows.start,
                )
            });
            base += part.rows;
            out
        })
    }

    /// The part (worker) whose rows start at `start`.
    fn part_of(&self, start: usize) -> Option<usize> {
        self.cuts[..self.cuts.len().saturating_sub(1)]
            .binary_search(&start)
            .ok()
    }

    /// Part `part` is finished (`failed`: without its rows): publish its done word.
    fn part_done(&self, part: usize, failed: bool) {
        let v = if failed {
            self.step | DONE_FAILED
        } else {
            self.step
        };
        if failed {
            self.failed.store(true, Ordering::Release);
        }
        if part < MAX_DONE_PARTS {
            self.mailbox.part_done(part).store(v, Ordering::Release);
        }
    }
}

impl PoolJob for FlagsJob {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        let part = self.part_of(rows.start);
        // The part whose done word this worker still owes (see `rows`): published here, after
        // an error or a panic too, because the device's fold waits for every part.
        let holding = Cell::new(part);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.rows(rows, part, &holding)
        }));
        let failed = !matches!(r, Ok(Ok(())));
        if failed {
            self.fail_untaken_chunks();
        }
        if let Some(p) = holding.get() {
            self.part_done(p, failed);
        }
        if part.is_none() {
            // Not one of the parts the arm was cut into: nothing is published for it, so
            // the device's fold of the real parts times out rather than folding stale rows.
            self.failed.store(true, Ordering::Release);
        }
        // Always count down, so the device never waits on a worker that failed.
        self.count_down();
        match r {
            Ok(res) => res.map(|()| 0),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

/// A submitted flags arm; [`FlagsTicket::wait`] collects it.
pub struct FlagsTicket {
    pending: crate::pool::Pending,
    job: Arc<FlagsJob>,
}

impl FlagsTicket {
    /// The workers' parts of the arm's concatenated rows, as cut points from 0 to their
    /// total: the device's fold waits on part `p`'s done word for rows `cuts[p]..cuts[p + 1]`.
    pub fn cuts(&self) -> &[usize] {
        &self.job.cuts
    }

    /// Whether every part has finished (done is published); [`FlagsTicket::wait`] then
    /// returns at once.
    pub fn is_finished(&self) -> bool {
        self.job.remaining.load(Ordering::Acquire) == 0
    }

    /// Give up on the arm because its device side was never queued: workers still waiting for
    /// the sequence word stop at once (done is still published, with the error word), and this
    /// returns once every worker has let go of the job.
    pub fn cancel(self) {
        self.job.cancelled.store(true, Ordering::Release);
        let _ = self.pending.wait();
    }

    /// Block until every worker of the arm has finished; the arm's measurements or its error.
    pub fn wait(self) -> Result<FlagsReport, ExecError> {
        self.pending.wait()?;
        let stats = &self.job.stats;
        let max = |f: fn(&WorkerStats) -> &AtomicU64| {
            stats
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .max()
                .unwrap_or(0)
        };
        let seen = || {
            stats
                .iter()
                .map(|s| s.seen.load(Ordering::Relaxed))
                .filter(|&v| v != u64::MAX)
        };
        Ok(FlagsReport {
            wait_ns: max(|s| &s.wait_ns) as f64,
            cpu_ns: max(|s| &s.cpu_ns) as f64,
            prepare_ns: max(|s| &s.prepare_ns) as f64,
            first_seen_ns: seen().min().unwrap_or(u64::MAX),
            last_seen_ns: seen().max().unwrap_or(0),
            done_ns: max(|s| &s.done_at),
            prefetched_bytes: stats
                .iter()
                .map(|s| s.prefetched.load(Ordering::Relaxed))
                .sum(),
        })
    }
}

impl FlagsJob {
    /// One part finished (or was never taken): the last one publishes done.
    fn count_down(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let v = if self.failed.load(Ordering::Acquire) {
                self.step | DONE_FAILED
            } else {
                self.step
            };
            self.mailbox.done().store(v, Ordering::Release);
        }
    }
}

impl CpuPool {
    fn submit_job(&self, job: FlagsJob) -> Result<FlagsTicket, ExecError> {
        // A mailbox laid out for a longer activation serves shorter ones (its y area sits past
        // the longest x).
        if job.k > job.mailbox.k {
            return Err(ExecError::Shape {
                what: "mailbox k",
                need: job.k,
                got: job.mailbox.k,
            });
        }
        if job.rows_n > job.mailbox.rows {
            return Err(ExecError::Shape {
                what: "mailbox rows",
                need: job.rows_n,
                got: job.mailbox.rows,
            });
        }
        for part in &job.parts {
            let need = (part.g + part.rows) * job.row_bytes;
            if part.weight.bytes().len() < need {
                return Err(ExecError::Shape {
                    what: "weight bytes",
                    need,
                    got: part.weight.bytes().len(),
                });
            }
        }
        let workers = self.threads().min(MAX_DONE_PARTS);
        let cut = partition(
            0..job.rows_n,
            (workers * usize::from(job.tuning.chunks_per_worker.max(1))).min(MAX_DONE_PARTS),
            WORKER_ROW_ALIGN,
        );
        let mut job = job;
        job.cuts = std::iter::once(0)
            .chain(cut.iter().map(|r| r.end))
            .collect();
        // Worker w starts on part w; under chunks the rest go to whoever asks first.
        let parts: Vec<Range<usize>> = cut.into_iter().take(workers).collect();
        job.next_chunk.store(parts.len(), Ordering::Relaxed);
        job.remaining.store(parts.len(), Ordering::Release);
        job.stats = (0..=parts.len()).map(|_| CachePadded::default()).collect();
        let job = Arc::new(job);
        if parts.is_empty() {
            job.mailbox.done().store(job.step, Ordering::Release);
        }
        let pending = self.submit_owned(job.clone(), parts)?;
        // Parts no worker took: count them down as failed, so done is still published.
        for &p in &pending.unsent {
            job.part_done(p, true);
            job.count_down();
        }
        Ok(FlagsTicket { pending, job })
    }

    /// Hand `arm` to the workers now; they wait for the device's sequence word, multiply, and
    /// publish done. Returns once every worker has the job queued (a worker queues one job
    /// behind the one it runs, so this blocks while the previous arm is still waiting to be
    /// taken). Pool work submitted later runs after the arm, so it waits for the device to
    /// publish this step: queue the device side before waiting on anything else.
    pub fn submit_flags(&self, arm: FlagsArm) -> Result<FlagsTicket, ExecError> {
        let row_bytes = arm.format.row_bytes(arm.k)?;
        let shared_x = if arm.tuning.x_is_shared(arm.format) {
            Some(SharedX::new(arm.format, arm.k)?)
        } else {
            None
        };
        self.submit_job(FlagsJob {
            format: arm.format,
            k: arm.k,
            rows_n: arm.parts.iter().map(|p| p.rows).sum(),
            parts: arm.parts,
            mailbox: arm.mailbox,
            step: arm.step,
            timeout: arm.timeout,
            cancelled: AtomicBool::new(false),
            row_bytes,
            tuning: arm.tuning,
            shared_x,
            cuts: Vec::new(),
            next_chunk: CachePadded::new(AtomicUsize::new(0)),
            remaining: CachePadded::new(AtomicUsize::new(0)),
            failed: CachePadded::new(AtomicBool::new(false)),
            stats: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn setup(fmt: Format, k: usize, m: usize, seed: u64) -> (Arc<Vec<u8>>, Vec<f32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut w = Vec::new();
        for _ in 0..m {
            let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            w.extend(hipfire_quant::quantize_row(fmt, &row).expect("quantise"));
        }
        (
            Arc::new(w),
            (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
        )
    }

    /// A mailbox in plain host memory for activations of `k` and `rows` CPU rows.
    fn host_mailbox(k: usize, rows: usize) -> Mailbox {
        let mem: Arc<dyn MailboxMemory> =
            Arc::new(HostMailboxMemory::new(Mailbox::bytes_needed(k, rows)));
        Mailbox::new(mem, k, rows).expect("mailbox")
    }

    /// A one-output arm: rows `[g, g + rows)` of `w` into `mailbox`, published as `step`, with the
    /// default timeout.
    fn one_part_arm(
        fmt: Format,
        k: usize,
        w: Arc<Vec<u8>>,
        g: usize,
        rows: usize,
        mailbox: Mailbox,
        step: u32,
    ) -> FlagsArm {
        FlagsArm {
            format: fmt,
            k,
            parts: vec![ArmRows { weight: w, g, rows }],
            mailbox,
            step,
            timeout: DEFAULT_FLAGS_TIMEOUT,
            tuning: FlagsTuning::default(),
        }
    }

    #[test]
    fn flags_arm_matches_pool_over_steps() {
        let (fmt, k, m, g) = (Format::Q4_0, 256usize, 200usize, 48usize);
        let (w, _) = setup(fmt, k, m, 1);
        let pool = CpuPool::new(3).expect("pool");
        let mb = host_mailbox(k, m - g);
        for step in 1..=5u32 {
            let x: Vec<f32> = setup(fmt, k, 1, 100 + u64::from(step)).1;
            let arm = one_part_arm(fmt, k, w.clone(), g, m - g, mb.clone(), step);
            // Submitted ahead of the device, as the host would a token ahead.
            let ticket = pool.submit_flags(arm).expect("submit");
            let device = {
                let mb = mb.clone();
                let x = x.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(2));
                    mb.device_publish(&x, step)?;
                    mb.device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)
                })
            };
            let got = device.join().expect("device thread").expect("device");
            let rep = ticket.wait().expect("arm");
            assert!(rep.wait_ns > 0.0);
            // The workers' own records, gathered: every one saw x, then finished.
            assert!(rep.first_seen_ns <= rep.last_seen_ns, "{rep:?}");
            assert!(
                rep.last_seen_ns <= rep.done_ns && rep.done_ns > 0,
                "{rep:?}"
            );
            assert!(
                rep.prepare_ns > 0.0 && rep.prepare_ns <= rep.cpu_ns,
                "{rep:?}"
            );
            let mut want = vec![f32::NAN; m];
            pool.gemv(fmt, &w, k, &x, &mut want, false).expect("pool");
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want[g..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "step {step}"
            );
        }
    }

    #[test]
    fn silent_device_times_out_and_done_is_still_published() {
        let (fmt, k, m) = (Format::Q8_0, 64usize, 40usize);
        let (w, _) = setup(fmt, k, m, 2);
        let pool = CpuPool::new(2).expect("pool");
        let mb = host_mailbox(k, m);
        let arm = FlagsArm {
            timeout: Duration::from_millis(20),
            ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 7)
        };
        let err = pool
            .submit_flags(arm)
            .expect("submit")
            .wait()
            .expect_err("no device");
        assert!(matches!(err, ExecError::Timeout { .. }), "{err}");
        assert_eq!(mb.done().load(Ordering::Acquire), 7 | DONE_FAILED);
        assert_eq!(mb.part_done(0).load(Ordering::Acquire), 7 | DONE_FAILED);
        // The pool is usable afterwards.
        let mut y = vec![0.0; 4];
        pool.gemv(Format::F32, &[0u8; 4 * 4 * 4], 4, &[1.0; 4], &mut y, false)
            .expect("pool after timeout");
    }

    /// Several arms queued ahead of the device (as the executor queues a layer's steps), each
    /// a part of the weight with a mailbox laid out for a longer activation: every step's rows
    /// are the pool's, bit for bit.
    #[test]
    fn arms_queued_ahead_of_the_device_match_the_pool() {
        // Both publishes: the tagged x area keeps the last step's words, which the workers of
        // the next step must not take.
        for tagged_x in [true, false] {
            arms_queued_ahead(tagged_x);
        }
    }

    fn arms_queued_ahead(tagged_x: bool) {
        let (fmt, k, m, g) = (Format::Q4K, 512usize, 96usize, 32usize);
        let tuning = FlagsTuning {
            tagged_x,
            ..FlagsTuning::default()
        };
        let (w, _) = setup(fmt, k, m, 3);
        let pool = CpuPool::new(3).expect("pool");
        let mb = host_mailbox(3 * k, m);
        let arm = |step| FlagsArm {
            tuning,
            ..one_part_arm(fmt, k, w.clone(), g, m - g, mb.clone(), step)
        };
        let steps = 1..=4u32;
        let xs: Vec<Vec<f32>> = steps
            .clone()
            .map(|s| setup(fmt, k, 1, 300 + u64::from(s)).1)
            .collect();
        let tickets: Vec<FlagsTicket> = steps
            .clone()
            .map(|step| {
                // Each worker queues one job behind the one it runs, so a third submit would
                // block until the device publishes: submit two ahead, then play the device.
                pool.submit_flags(arm(step))
            })
            .take(2)
            .collect::<Result<_, _>>()
            .expect("submit");
        let device = {
            let (mb, xs) = (mb.clone(), xs.clone());
            std::thread::spawn(move || -> Result<Vec<Vec<f32>>, ExecError> {
                let mut out = Vec::new();
                for (i, x) in xs.iter().enumerate() {
                    let step = i as u32 + 1;
                    if tagged_x {
                        mb.device_publish_tagged(x, step)?;
                    } else {
                        mb.device_publish(x, step)?;
                    }
                    out.push(mb.device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)?);
                }
                Ok(out)
            })
        };
        let mut tickets = tickets;
        for step in 3..=4u32 {
            tickets.push(
                pool.submit_flags(arm(step))
                    .expect("submit behind a running arm"),
            );
        }
        let got = device.join().expect("device thread").expect("device");
        for (i, t) in tickets.into_iter().enumerate() {
            assert!(t.is_finished(), "done was published for step {}", i + 1);
            let rep = t.wait().expect("arm");
            assert!(rep.cpu_ns > 0.0);
            let mut want = vec![f32::NAN; m];
            pool.gemv(fmt, &w, k, &xs[i], &mut want, false)
                .expect("pool");
            assert_eq!(
                got[i][..m - g]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                want[g..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "step {}",
                i + 1
            );
        }
    }

    /// One arm over the CPU rows of three outputs (q/k/v-like: different heights, different
    /// cuts): the mailbox holds each output's rows after the previous one's, each bit-identical
    /// to the pool's GEMV of that weight.
    #[test]
    fn an_arm_over_several_outputs_writes_them_one_after_another() {
        let (fmt, k) = (Format::Q8_0, 256usize);
        let shapes = [(160usize, 48usize), (40, 16), (40, 0)];
        let ws: Vec<Arc<Vec<u8>>> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(m, _))| setup(fmt, k, m, 40 + i as u64).0)
            .collect();
        let x = setup(fmt, k, 1, 50).1;
        let total: usize = shapes.iter().map(|&(m, g)| m - g).sum();
        let pool = CpuPool::new(3).expect("pool");
        let mb = host_mailbox(k, total);
        let parts = ws
            .iter()
            .zip(&shapes)
            .map(|(w, &(m, g))| ArmRows {
                weight: w.clone(),
                g,
                rows: m - g,
            })
            .collect();
        let ticket = pool
            .submit_flags(FlagsArm {
                format: fmt,
                k,
                parts,
                mailbox: mb.clone(),
                step: 1,
                timeout: DEFAULT_FLAGS_TIMEOUT,
                tuning: FlagsTuning::default(),
            })
            .expect("submit");
        mb.device_publish(&x, 1).expect("publish");
        let got = mb.device_wait_done(1, DEFAULT_FLAGS_TIMEOUT).expect("done");
        ticket.wait().expect("arm");
        let mut want = Vec::new();
        for (w, &(m, g)) in ws.iter().zip(&shapes) {
            let mut y = vec![f32::NAN; m];
            pool.gemv(fmt, w, k, &x, &mut y, false).expect("pool");
            want.extend_from_slice(&y[g..]);
        }
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// Long activations, ragged ones and many workers: the rows are bit-identical to the
    /// pool's, which prepares x once for all workers.
    #[test]
    fn long_and_ragged_activations_match_the_pool() {
        // The last two: more workers than blocks of x, so that some workers of the shared
        // preparation take no block and only wait.
        // Tagged x where it applies (the shared q8_K preparations); Q4_0/Q8_0 fall back to the
        // sequence word.
        for (fmt, k, m, workers, tagged_x) in [
            (Format::Q4K, 14336usize, 64usize, 5usize, false),
            (Format::Q4K, 14336, 64, 5, true),
            (Format::Q4_0, 4096 + 96, 48, 4, true),
            (Format::Q8_0, 2048, 40, 15, false),
            (Format::Q4K, 512, 40, 6, false),
            (Format::Q6K, 768, 40, 6, true),
        ] {
            let (w, x) = setup(fmt, k, m, k as u64);
            let pool = CpuPool::new(workers).expect("pool");
            let mb = host_mailbox(k, m);
            let ticket = pool
                .submit_flags(FlagsArm {
                    tuning: FlagsTuning {
                        tagged_x,
                        ..FlagsTuning::default()
                    },
                    ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), 3)
                })
                .expect("submit");
            if tagged_x && fmt != Format::Q4_0 {
                mb.device_publish_tagged(&x, 3).expect("publish");
            } else {
                mb.device_publish(&x, 3).expect("publish");
            }
            let got = mb.device_wait_done(3, DEFAULT_FLAGS_TIMEOUT).expect("done");
            ticket.wait().expect("arm");
            let mut want = vec![f32::NAN; m];
            pool.gemv(fmt, &w, k, &x, &mut want, false).expect("pool");
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{fmt} k={k} workers={workers} tagged {tagged_x}"
            );
        }
    }

    /// A non-finite x fails every worker's preparation (its own, or the shared one's): nothing
    /// hangs, and the arm's done word and every worker's are still published, each with the
    /// failure bit.
    #[test]
    fn a_bad_piece_fails_the_step_without_hanging() {
        // Q8_0: each worker prepares x itself; Q4_K: the workers prepare it together.
        for fmt in [Format::Q8_0, Format::Q4K] {
            for (chunks_per_worker, tagged_x) in [(1, false), (4, false), (4, true)] {
                let (k, m) = (2048usize, 400usize);
                let (w, mut x) = setup(fmt, k, m, 8);
                x[1000] = f32::NAN;
                let pool = CpuPool::new(4).expect("pool");
                let mb = host_mailbox(k, m);
                let ticket = pool
                    .submit_flags(FlagsArm {
                        timeout: Duration::from_secs(30),
                        tuning: FlagsTuning {
                            chunks_per_worker,
                            tagged_x,
                            ..FlagsTuning::default()
                        },
                        ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 4)
                    })
                    .expect("submit");
                let parts = ticket.cuts().len() - 1;
                assert!(parts > 1, "the arm is cut among workers");
                let t = Instant::now();
                let tuning = FlagsTuning {
                    tagged_x,
                    ..FlagsTuning::default()
                };
                if tuning.x_is_tagged(fmt) {
                    mb.device_publish_tagged(&x, 4).expect("publish");
                } else {
                    mb.device_publish(&x, 4).expect("publish");
                }
                let err = ticket.wait().expect_err("NaN in x");
                assert!(t.elapsed() < Duration::from_secs(5), "{fmt}: workers hung");
                // Shared: the worker that met the NaN says so, the others that another did.
                assert!(
                    matches!(err, ExecError::Quant(_))
                        || (tuning.x_is_shared(fmt) && matches!(err, ExecError::Invalid { .. })),
                    "{fmt}: {err}"
                );
                assert_eq!(mb.done().load(Ordering::Acquire), 4 | DONE_FAILED);
                for p in 0..parts {
                    assert_eq!(
                        mb.part_done(p).load(Ordering::Acquire),
                        4 | DONE_FAILED,
                        "{fmt}: part {p}"
                    );
                }
            }
        }
    }

    /// A tagged x with one element never written for the step (a device that stopped midway):
    /// the workers give up at their timeout with an error, and done says the arm failed.
    #[test]
    fn a_tagged_element_that_never_comes_times_out() {
        let (fmt, k, m) = (Format::Q4K, 1024usize, 96usize);
        let (w, x) = setup(fmt, k, m, 17);
        let pool = CpuPool::new(3).expect("pool");
        let mb = host_mailbox(k, m);
        let ticket = pool
            .submit_flags(FlagsArm {
                timeout: Duration::from_millis(300),
                ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 6)
            })
            .expect("submit");
        assert!(FlagsTuning::default().x_is_tagged(fmt), "tagged by default");
        // Every element of step 6 but one; that one keeps an older step.
        for (i, (word, v)) in mb.x_tagged().iter().zip(&x).enumerate() {
            let step = if i == 700 { 5 } else { 6 };
            word.store(tagged(*v, step), Ordering::Release);
        }
        let t = Instant::now();
        let err = ticket.wait().expect_err("element 700 never came");
        assert!(
            matches!(err, ExecError::Timeout { .. } | ExecError::Invalid { .. }),
            "{err}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "gave up at the timeout"
        );
        assert_eq!(mb.done().load(Ordering::Acquire), 6 | DONE_FAILED);
    }

    /// A weight whose bytes vanish after `good` looks: the multiply of whatever chunk a worker
    /// is on then panics, mid-arm, while other workers may still be taking chunks.
    struct VanishingWeight {
        bytes: Arc<Vec<u8>>,
        looks: AtomicUsize,
        good: usize,
    }

    impl WeightBytes for VanishingWeight {
        fn bytes(&self) -> &[u8] {
            if self.looks.fetch_add(1, Ordering::Relaxed) < self.good {
                &self.bytes
            } else {
                &[]
            }
        }
    }

    /// A worker that fails partway through its chunks: the arm fails, every chunk still gets
    /// a done word (the ones nobody took are published as failed), and nothing waits for a
    /// timeout.
    #[test]
    fn a_worker_failing_mid_arm_publishes_every_chunk() {
        let (fmt, k, m, workers) = (Format::Q4_0, 256usize, 2048usize, 4usize);
        let (w, x) = setup(fmt, k, m, 33);
        let pool = CpuPool::new(workers).expect("pool");
        // Looks: 1 at submit, 1 per worker's prefetch, then one per chunk multiplied.
        for good in [1 + workers + 2, 1 + workers + 9] {
            let mb = host_mailbox(k, m);
            let weight = Arc::new(VanishingWeight {
                bytes: w.clone(),
                looks: AtomicUsize::new(0),
                good,
            });
            let ticket = pool
                .submit_flags(FlagsArm {
                    parts: vec![ArmRows {
                        weight,
                        g: 0,
                        rows: m,
                    }],
                    timeout: Duration::from_secs(30),
                    ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), 5)
                })
                .expect("submit");
            let chunks = ticket.cuts().len() - 1;
            assert_eq!(chunks, workers * usize::from(DEFAULT_CHUNKS_PER_WORKER));
            let t = Instant::now();
            mb.device_publish(&x, 5).expect("publish");
            assert!(ticket.wait().is_err(), "good {good}: the arm failed");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "good {good}: nothing hung"
            );
            assert_eq!(mb.done().load(Ordering::Acquire), 5 | DONE_FAILED);
            let words: Vec<u32> = (0..chunks)
                .map(|c| mb.part_done(c).load(Ordering::Acquire))
                .collect();
            assert!(
                words.iter().all(|&v| v == 5 || v == 5 | DONE_FAILED),
                "good {good}: every chunk published: {words:?}"
            );
            assert!(words.contains(&(5 | DONE_FAILED)), "good {good}: {words:?}");
        }
    }

    /// Workers that wait long for x prefetch exactly their budget each (their first chunks
    /// are longer than it), and nothing without one; the report sums what they issued.
    #[test]
    fn waiting_workers_prefetch_their_budget_and_no_more() {
        let (fmt, k, m, workers) = (Format::Q4K, 4096usize, 512usize, 4usize);
        let (w, x) = setup(fmt, k, m, 21);
        let pool = CpuPool::new(workers).expect("pool");
        for (step, budget) in [(1u32, 0usize), (2, 4096), (3, 64 << 10)] {
            let mb = host_mailbox(k, m);
            let ticket = pool
                .submit_flags(FlagsArm {
                    tuning: FlagsTuning {
                        prefetch_bytes: budget,
                        ..FlagsTuning::default()
                    },
                    ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), step)
                })
                .expect("submit");
            let first_chunk = (ticket.cuts()[1] - ticket.cuts()[0]) * fmt.row_bytes(k).expect("rb");
            assert!(first_chunk > budget, "each first chunk outlasts the budget");
            // Long against issuing 64 KiB of prefetches, even on two busy cores.
            std::thread::sleep(Duration::from_millis(50));
            mb.device_publish_tagged(&x, step).expect("publish");
            mb.device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)
                .expect("done");
            let rep = ticket.wait().expect("arm");
            assert_eq!(
                rep.prefetched_bytes,
                (workers * budget) as u64,
                "budget {budget}"
            );
        }
    }

    #[test]
    fn cancel_releases_waiting_workers() {
        let (fmt, k, m) = (Format::Q8_0, 64usize, 40usize);
        let (w, _) = setup(fmt, k, m, 4);
        let pool = CpuPool::new(2).expect("pool");
        let mb = host_mailbox(k, m);
        let ticket = pool
            .submit_flags(FlagsArm {
                // Long: the test fails by time if cancellation does not reach the workers.
                timeout: Duration::from_secs(30),
                ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 9)
            })
            .expect("submit");
        let t = Instant::now();
        ticket.cancel();
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "workers not cancelled"
        );
        assert_eq!(
            mb.done().load(Ordering::Acquire),
            9 | DONE_FAILED,
            "done still published, marked failed"
        );
        let mut y = vec![0.0; 4];
        pool.gemv(Format::F32, &[0u8; 4 * 4 * 4], 4, &[1.0; 4], &mut y, false)
            .expect("pool after a cancelled arm");
    }

    #[test]
    fn submit_refuses_more_rows_than_the_mailbox_holds() {
        let (fmt, k, m) = (Format::Q8_0, 64usize, 40usize);
        let (w, _) = setup(fmt, k, m, 5);
        let pool = CpuPool::new(2).expect("pool");
        let arm = |rows, mb| one_part_arm(fmt, k, w.clone(), 0, rows, mb, 1);
        let err = pool
            .submit_flags(arm(m, host_mailbox(k, 8)))
            .err()
            .expect("too many rows");
        assert!(matches!(err, ExecError::Shape { .. }), "{err}");
        let err = pool
            .submit_flags(arm(m + 1, host_mailbox(k, m + 1)))
            .err()
            .expect("rows past the weight");
        assert!(matches!(err, ExecError::Shape { .. }), "{err}");
    }

    /// Every tuning gives the pool's rows bit for bit; the chunks' done words say the step for
    /// exactly the arm's parts (cut points from 0 to the rows) and no other.
    #[test]
    fn every_tuning_matches_the_pool_and_publishes_its_done_words() {
        let (k, m) = (1024usize, 203usize);
        let pool = CpuPool::new(4).expect("pool");
        let mut step = 0;
        // Q4_K: x prepared together (tagged or behind the sequence word); Q8_0: by each worker.
        for fmt in [Format::Q4K, Format::Q8_0] {
            let (w, x) = setup(fmt, k, m, 11);
            let mut want = vec![f32::NAN; m];
            pool.gemv(fmt, &w, k, &x, &mut want, false).expect("pool");
            for chunks_per_worker in [1u8, 3, 4] {
                for prefetch_bytes in [0usize, 4096, 65536] {
                    for tagged_x in [false, true] {
                        // Every field but the `experiments` feature's, which needs the update.
                        #[allow(clippy::needless_update)]
                        let tuning = FlagsTuning {
                            prefetch_bytes,
                            chunks_per_worker,
                            tagged_x,
                            ..FlagsTuning::default()
                        };
                        step = next_step(step);
                        let mb = host_mailbox(k, m);
                        // Poisoned: a row left unwritten shows.
                        // SAFETY: the y area holds `m` floats (`host_mailbox`); no arm runs yet.
                        unsafe {
                            std::slice::from_raw_parts_mut(
                                mb.mem.base().add(mb.y_offset()) as *mut f32,
                                m,
                            )
                        }
                        .fill(f32::NAN);
                        let ticket = pool
                            .submit_flags(FlagsArm {
                                tuning,
                                ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), step)
                            })
                            .expect("submit");
                        let cuts = ticket.cuts().to_vec();
                        assert_eq!((cuts[0], *cuts.last().expect("cuts")), (0, m), "{tuning:?}");
                        assert!(cuts.windows(2).all(|c| c[0] < c[1]), "{cuts:?}");
                        // 203 rows are 12 whole lines of output: fewer chunks than asked, but
                        // at least one per worker.
                        let n = usize::from(chunks_per_worker);
                        assert!(
                            (4..=4 * n).contains(&(cuts.len() - 1)),
                            "{n} per worker: {cuts:?}"
                        );
                        if tuning.x_is_tagged(fmt) {
                            mb.device_publish_tagged(&x, step).expect("publish");
                        } else {
                            mb.device_publish(&x, step).expect("publish");
                        }
                        let got = mb
                            .device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)
                            .expect("done");
                        ticket.wait().expect("arm");
                        assert_eq!(
                            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{fmt} {tuning:?}"
                        );
                        for p in 0..MAX_DONE_PARTS {
                            let v = mb.part_done(p).load(Ordering::Acquire);
                            let expect = if p + 1 < cuts.len() { step } else { 0 };
                            assert_eq!(v, expect, "{fmt} {tuning:?} part {p}");
                        }
                    }
                }
            }
        }
    }

    /// Step numbers never reach the failure bit and never return to 0.
    #[test]
    fn step_numbers_wrap_below_the_failure_bit() {
        assert_eq!(next_step(0), 1);
        assert_eq!(next_step(41), 42);
        assert_eq!(next_step(DONE_FAILED - 2), DONE_FAILED - 1);
        assert_eq!(next_step(DONE_FAILED - 1), 1);
        assert_eq!(next_step(u32::MAX), 1);
    }

    #[test]
    fn mailbox_checks() {
        let small: Arc<dyn MailboxMemory> = Arc::new(HostMailboxMemory::new(64));
        assert!(Mailbox::new(small, 256, 10).is_err());
        assert_eq!(Mailbox::bytes_needed(4, 1) % 4, 0);
        assert_eq!(Mailbox::y_offset_for(4096) % MAILBOX_ALIGN, 0);
        assert!(Mailbox::y_offset_for(1) >= X_OFFSET + 4);
    }
}
