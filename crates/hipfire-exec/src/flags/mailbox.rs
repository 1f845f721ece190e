//! The mailbox: the layout of the host-mapped memory the device and the workers share (see
//! [`crate::flags`]'s table), the memory it lives in, its words, and the bounded spin-wait on
//! a word ([`wait_word`]) every waiter of the protocol uses. In CPU-only tests, test-only
//! stand-ins of the mailbox play the device.

use crate::error::ExecError;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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
/// Bytes per element of the x area: room for the tagged form (`FlagsTuning::tagged_x`).
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

// SAFETY: a pinned, page-aligned allocation owned by the Arc'd buffer, valid until it drops.
unsafe impl MailboxMemory for Arc<hipfire_gpu::HostMappedBuffer> {
    fn base(&self) -> *mut u8 {
        self.host_ptr()
    }
    fn len(&self) -> usize {
        hipfire_gpu::HostMappedBuffer::len(self)
    }
}

/// One cache line (for `HostMailboxMemory`'s alignment).
#[cfg(test)]
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; MAILBOX_ALIGN]);

/// Plain host memory for a mailbox: the CPU-only tests' stand-in for pinned memory.
#[cfg(test)]
pub(crate) struct HostMailboxMemory {
    lines: Box<[std::cell::UnsafeCell<Line>]>,
}

#[cfg(test)]
impl HostMailboxMemory {
    /// At least `bytes` zeroed bytes.
    pub(crate) fn new(bytes: usize) -> HostMailboxMemory {
        let n = bytes.div_ceil(MAILBOX_ALIGN).max(1);
        HostMailboxMemory {
            lines: (0..n)
                .map(|_| std::cell::UnsafeCell::new(Line([0; MAILBOX_ALIGN])))
                .collect(),
        }
    }
}

#[cfg(test)]
// SAFETY: the memory is only reached through raw pointers under the mailbox protocol (atomics
// for the words, disjoint row ranges for the data).
unsafe impl Sync for HostMailboxMemory {}

#[cfg(test)]
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
    pub(crate) mem: Arc<dyn MailboxMemory>,
    pub(crate) k: usize,
    pub(crate) rows: usize,
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

    pub(crate) fn y_offset_for(k: usize) -> usize {
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
    pub(crate) fn x_tagged(&self) -> &[AtomicU64] {
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
pub(crate) fn tagged(v: f32, step: u32) -> u64 {
    (u64::from(step) << 32) | u64::from(v.to_bits())
}

/// Spin (yielding) until `load` (an acquire load of a word) gives a value `want` accepts
/// (returned), or time out, or `cancel` is raised. `idle` runs between batches of polls and
/// says whether it did work (the weight prefetch): while it does, each batch is one poll
/// without a pause, so that the work goes at the memory system's pace rather than at one batch
/// per [`WAIT_POLLS_PER_CHECK`] paused polls (~1 µs on a recent Xeon, where a pause is ~140
/// cycles: 512 bytes per µs, a twentieth of a core's share of the box's bandwidth).
pub(crate) fn wait_word(
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
