//! Activation preparation under `flags`: the workers of a step prepare its q8_K activation
//! together ([`FlagsTuning::x_is_shared`]), each taking 256-element blocks off a counter, from
//! a plain x behind the sequence word or a tagged x whose elements carry the step.

use crate::error::ExecError;
use crate::flags::job::{FlagsJob, WeightPrefetch};
use crate::flags::mailbox::wait_word;
#[cfg(doc)]
use crate::flags::FlagsTuning;
use crate::kernel::ActivationBuf;
use crossbeam_utils::CachePadded;
use hipfire_quant::{Format, SharedActivation};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// x prepared by the workers together ([`FlagsTuning::x_is_shared`]).
pub(crate) struct SharedX {
    act: SharedActivation,
    /// The next block to take (its own cache line, as is `done`: every worker updates both).
    next: CachePadded<AtomicU32>,
    /// Blocks prepared (or given up on): the activation is read once it reaches all of them.
    done: CachePadded<AtomicU32>,
    /// A block could not be prepared (a non-finite x).
    failed: AtomicBool,
}

impl SharedX {
    pub(crate) fn new(format: Format, k: usize) -> Result<SharedX, ExecError> {
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
    pub(crate) fn prepare(
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
pub(crate) enum XSource<'a> {
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
