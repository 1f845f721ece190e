//! The CPU engine: a pool of pinned worker threads that multiply row ranges.
//!
//! Actor split (Ryhl): [`CpuWorker`] is the task — it owns its receiver and its loop, runs on
//! its own pinned thread and only executes; [`CpuPool`] is the cloneable handle — it owns the
//! senders, cuts a row range into one contiguous slice per worker (decode's GEMVs) or lets the
//! workers claim chunks of it off a shared cursor (prompt GEMMs, `parallel_for`), sends, and
//! waits for every reply. When the last handle is dropped the senders go, each worker's loop
//! ends, and the drop guard joins the threads.
//!
//! Why not rayon: a decode step is a few hundred microseconds of GEMV; rayon's work stealing
//! and its wake-up of sleeping workers cost tens of microseconds and move rows between cores
//! (and caches) from call to call. Here each worker keeps the same slice of every matrix, spins
//! for [`SPIN_WINDOW`] after finishing so the next step finds it awake, then blocks.
//!
//! Borrowed data across threads: a call hands workers a raw pointer to a job that borrows the
//! caller's weight, activation and output, and then blocks until every worker that received the
//! pointer has answered (or died, dropping the message). That blocking wait is what makes the
//! erased lifetime sound; see the SAFETY comments in `CpuPool::run_job`.
//!
//! Files: `actor` (the worker task and its messages), `jobs` (the GEMV jobs and their
//! calls); here the handle, the row cut and the dispatch.

mod actor;
mod jobs;

pub use actor::CpuWorker;
pub(crate) use actor::PoolJob;
pub use jobs::{GemvSegment, TOKEN_TILE_BYTES};

use crate::error::ExecError;
use crate::topology;
use actor::{panic_message, recv_spinning, JobPtr, Reply, WorkerMsg};
use crossbeam_channel::{bounded, Receiver, Sender};
use crossbeam_utils::CachePadded;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long an idle worker spins (polling its channel) before it blocks.
///
/// Value: chosen, not yet measured on the target box. Consecutive spilled GEMVs of one layer
/// arrive within ~100 µs of each other (reference system, per split step: d2h 30–80 µs, join
/// 30–50 µs), while a futex wake-up of a blocked thread costs tens of µs; 50 µs of spinning keeps
/// workers awake through those gaps and bounds the wasted core time between tokens.
pub const SPIN_WINDOW: Duration = Duration::from_micros(50);

/// A guided claim ([`CpuPool::run_job_claimed`]) takes 1/(`GUIDED_SHARE` × threads) of the
/// rows left: the first chunks are half a thread's fair share, and the sizes halve towards the
/// end, so the thread that finishes last waits for little. A prompt chunk's attention items
/// grow with their query's position, and one contiguous part per thread had left the thread
/// with the last queries about twice the average work (512 tokens, 16 threads). The classic
/// guided schedule takes 1/threads; half that keeps a slowed thread's first chunk from being
/// an eighth of the call at 16 threads. Chosen, not tuned.
pub const GUIDED_SHARE: usize = 2;

/// Row alignment of each worker's slice of the output: 16 f32 = one 64-byte cache line, so two
/// workers never write the same line (no false sharing). Cut points are multiples of this
/// *absolute* row index, so they stay aligned when a CPU arm starts at row `g`.
pub const WORKER_ROW_ALIGN: usize = 16;

/// How to build a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Worker threads; 0 means one per physical core ([`topology::default_threads`]).
    pub threads: usize,
    /// Pin worker `i` to the `i`-th physical core (wrapping when `threads` exceeds them).
    pub pin: bool,
    /// Spin window of an idle worker before it blocks.
    pub spin: Duration,
    /// The calling thread computes one part of every synchronous job itself: `threads` counts
    /// it, so `threads − 1` workers are spawned (pinned from the second physical core on) and
    /// a one-thread pool runs everything inline with no dispatch at all. For callers that have
    /// nothing else to do while a job runs (CPU decode); not for the GPU-driving thread.
    pub caller_computes: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            threads: 0,
            pin: true,
            spin: SPIN_WINDOW,
            caller_computes: false,
        }
    }
}

/// Owned by every handle clone; dropping the last one stops and joins the workers.
struct PoolInner {
    /// One request channel per worker (bounded(1): a worker holds at most one queued request
    /// per caller; replies go on a separate per-call channel, so the graph has no cycle).
    senders: Vec<Sender<WorkerMsg>>,
    /// Threads to join on drop.
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// Logical CPU each worker was asked to pin to (for reports).
    cores: Vec<Option<usize>>,
    /// Live-worker count (see [`CpuWorker::live`]).
    live: Arc<std::sync::atomic::AtomicUsize>,
    /// Spin window the workers use (reported by benches).
    spin: Duration,
    /// How long a caller polls for replies before it blocks: the workers' window when the pool
    /// leaves a physical core free for the caller, else zero (a spinning caller would take a
    /// worker's core: SmolLM2 decode on the 2-core VM fell from 254–262 to 71 tok/s with two
    /// workers and a spinning caller, and rose from 153–156 to 238–239 with one worker).
    caller_spin: Duration,
    /// The caller runs part 0 of every synchronous job (`PoolConfig::caller_computes`).
    caller_computes: bool,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Closing the channels ends each worker's `while let` loop.
        self.senders.clear();
        let handles = match self.handles.get_mut() {
            Ok(h) => std::mem::take(h),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        for h in handles {
            // A worker catches job panics itself; a join error would be a bug in the loop.
            let _ = h.join();
        }
    }
}

/// Handle to the CPU engine (cloneable; the pool stops when the last clone drops).
#[derive(Clone)]
pub struct CpuPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for CpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPool")
            .field("threads", &self.threads())
            .field("cores", &self.inner.cores)
            .finish()
    }
}

impl CpuPool {
    /// A pool of `threads` pinned workers; `threads == 0` means one per physical core.
    pub fn new(threads: usize) -> Result<CpuPool, ExecError> {
        CpuPool::with_config(PoolConfig {
            threads,
            ..PoolConfig::default()
        })
    }

    /// A pool built from `config`.
    pub fn with_config(config: PoolConfig) -> Result<CpuPool, ExecError> {
        let cores = if config.pin {
            topology::physical_core_ids()
        } else {
            Vec::new()
        };
        let compute = if config.threads == 0 {
            cores.len().max(1)
        } else {
            config.threads
        };
        // With a computing caller, workers take the cores after the first (left to the caller).
        let (threads, first_core) = if config.caller_computes {
            (compute - 1, 1)
        } else {
            (compute, 0)
        };
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut senders = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads);
        let mut pinned = Vec::with_capacity(threads);
        for index in 0..threads {
            let (tx, rx) = bounded(1);
            let core = if cores.is_empty() {
                None
            } else {
                Some(cores[(index + first_core) % cores.len()])
            };
            pinned.push(core.map(|c| c.id));
            let worker = CpuWorker {
                index,
                rx,
                core,
                spin: config.spin,
                live: Arc::clone(&live),
            };
            live.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let spawned = std::thread::Builder::new()
                .name(format!("hipfire-cpu-{index}"))
                .spawn(move || worker.run());
            match spawned {
                Ok(h) => {
                    senders.push(tx);
                    handles.push(h);
                }
                Err(source) => {
                    live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    // Dropping the partial pool joins the workers already started.
                    drop(PoolInner {
                        senders,
                        handles: Mutex::new(handles),
                        cores: pinned,
                        live,
                        spin: config.spin,
                        caller_spin: Duration::ZERO,
                        caller_computes: false,
                    });
                    return Err(ExecError::Spawn {
                        worker: index,
                        source,
                    });
                }
            }
        }
        // A computing caller has a core of its own by construction.
        let caller_spin = if config.caller_computes || threads < topology::default_threads() {
            config.spin
        } else {
            Duration::ZERO
        };
        Ok(CpuPool {
            inner: Arc::new(PoolInner {
                senders,
                handles: Mutex::new(handles),
                cores: pinned,
                live,
                spin: config.spin,
                caller_spin,
                caller_computes: config.caller_computes,
            }),
        })
    }

    /// Threads that compute a synchronous job: the workers, plus the caller when it computes
    /// (`PoolConfig::caller_computes`).
    pub fn compute_threads(&self) -> usize {
        self.threads() + usize::from(self.inner.caller_computes)
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.inner.senders.len()
    }

    /// Logical CPU each worker was pinned to (`None`: unpinned), in worker order.
    pub fn cores(&self) -> &[Option<usize>] {
        &self.inner.cores
    }
    /// Run `f` over `0..n` in contiguous chunks that the computing threads claim, guided
    /// ([`CpuPool::run_job_claimed`]; no alignment: for per-head or per-item work that is not a
    /// GEMV, such as attention, whose items need not cost the same). Waits for every chunk; an
    /// error only when the pool itself failed (a chunk that panicked, a stopped worker).
    pub fn parallel_for(
        &self,
        n: usize,
        f: &(dyn Fn(Range<usize>) + Sync),
    ) -> Result<(), ExecError> {
        struct ForJob<'f>(&'f (dyn Fn(Range<usize>) + Sync));
        impl PoolJob for ForJob<'_> {
            fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
                (self.0)(rows);
                Ok(0)
            }
        }
        self.run_job_claimed(&ForJob(f), 0..n, 1, usize::MAX)
            .map(|_| ())
    }

    /// Send an owned job's `parts` (at most one per worker) without waiting; collect with
    /// [`Pending::wait`]. Parts that could not be sent are listed in [`Pending::unsent`].
    pub(crate) fn submit_owned(
        &self,
        job: Arc<dyn PoolJob + Send + Sync>,
        parts: Vec<Range<usize>>,
    ) -> Result<Pending, ExecError> {
        if parts.len() > self.threads() {
            return Err(ExecError::Shape {
                what: "job parts (one per worker)",
                need: self.threads(),
                got: parts.len(),
            });
        }
        let (tx, rx) = bounded::<Reply>(parts.len().max(1));
        let mut pending = Pending {
            rx,
            sent: 0,
            unsent: Vec::new(),
            first_err: None,
            spin: self.inner.caller_spin,
        };
        for (worker, rows) in parts.into_iter().enumerate() {
            let msg = WorkerMsg::RunOwned {
                job: Arc::clone(&job),
                rows,
                respond_to: tx.clone(),
            };
            match self.inner.senders[worker].send(msg) {
                Ok(()) => pending.sent += 1,
                Err(_) => {
                    pending.unsent.push(worker);
                    pending
                        .first_err
                        .get_or_insert(ExecError::PoolStopped { worker });
                }
            }
        }
        Ok(pending)
    }

    /// Cut `rows` into one aligned slice per worker, run `job` on each, wait for all replies.
    ///
    /// Returns the XOR of the workers' values, or the first error (after every reply is in).
    pub(crate) fn run_job(
        &self,
        job: &(dyn PoolJob + '_),
        rows: Range<usize>,
    ) -> Result<u64, ExecError> {
        self.run_job_aligned(job, rows, WORKER_ROW_ALIGN)
    }

    /// Run `job` over `rows` with the rows claimed, not cut: every computing thread takes
    /// chunks off a shared cursor until none is left, so a thread that is slowed (another
    /// process on its core, a slower cache) takes fewer chunks instead of holding the whole
    /// call. Chunks are guided: each takes about half of what is left divided among the
    /// threads, as a multiple of `unit` rows between `unit` and `max` (so early chunks are
    /// large — an AMX panel group shares its block of the tokens among more rows — and the
    /// last ones small, which evens out the finish). For jobs whose chunks cost far more than
    /// a claim (a compare-and-swap): the prompt GEMMs of [`CpuPool::gemv_tokens`], attention
    /// items. Chunks start at multiples of `unit` from `rows.start` and are disjoint, so each
    /// output row is computed exactly as a static cut would.
    ///
    /// Returns the XOR of every chunk's value, or the first error (the others stop claiming).
    pub(crate) fn run_job_claimed(
        &self,
        job: &(dyn PoolJob + '_),
        rows: Range<usize>,
        unit: usize,
        max: usize,
    ) -> Result<u64, ExecError> {
        if rows.is_empty() {
            return Ok(0);
        }
        let unit = unit.max(1);
        let chunks = rows.len().div_ceil(unit);
        let takers = self.compute_threads().min(chunks).max(1);
        let claimed = ClaimedRows {
            job,
            next: CachePadded::new(AtomicUsize::new(rows.start)),
            end: rows.end,
            unit,
            max: max.max(unit) / unit * unit,
            share: GUIDED_SHARE * takers,
        };
        // One part per taking thread; each part's own range only says that a thread takes part.
        self.run_job_aligned(&claimed, 0..takers, 1)
    }

    /// [`CpuPool::run_job`] with cut points at multiples of `align`.
    pub(crate) fn run_job_aligned(
        &self,
        job: &(dyn PoolJob + '_),
        rows: Range<usize>,
        align: usize,
    ) -> Result<u64, ExecError> {
        let mut parts = partition(rows, self.compute_threads(), align);
        if parts.is_empty() {
            return Ok(0);
        }
        let inline = if self.inner.caller_computes {
            Some(parts.remove(0))
        } else {
            None
        };
        let (tx, rx) = bounded::<Reply>(parts.len().max(1));
        // SAFETY: the pointer is dereferenced by workers strictly before they send their reply
        // or drop the message, and this function does not return until it has received one
        // reply per message sent or seen every reply sender dropped (a worker that died dropped
        // its message, and the pointer with it). So `job` outlives every use.
        let erased = unsafe { JobPtr::erase(job) };
        let mut sent = 0usize;
        let mut first_err: Option<ExecError> = None;
        for (worker, part) in parts.into_iter().enumerate() {
            let msg = WorkerMsg::Run {
                job: erased,
                rows: part,
                respond_to: tx.clone(),
            };
            match self.inner.senders[worker].send(msg) {
                Ok(()) => sent += 1,
                Err(_) => {
                    first_err.get_or_insert(ExecError::PoolStopped { worker });
                }
            }
        }
        // Our own sender must go so that `recv` reports disconnection if every worker died.
        drop(tx);
        let mut acc = 0u64;
        if let Some(rows) = inline {
            // The caller's own part, while the workers run theirs; a panic here becomes an error
            // only after every worker has replied (they still hold the job).
            match catch_unwind(AssertUnwindSafe(|| job.run(rows))) {
                Ok(Ok(v)) => acc ^= v,
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(payload) => {
                    first_err.get_or_insert(ExecError::WorkerPanicked {
                        worker: usize::MAX,
                        message: panic_message(payload.as_ref()),
                    });
                }
            }
        }
        for _ in 0..sent {
            match recv_spinning(&rx, self.inner.caller_spin) {
                Ok(Reply { result: Ok(v), .. }) => acc ^= v,
                Ok(Reply {
                    worker,
                    result: Err(e),
                }) => {
                    tracing::debug!(target: "hipfire::cpu_exec", worker, error = %e, "cpu worker failed");
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(ExecError::PoolStopped { worker: usize::MAX });
                    break;
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(acc),
        }
    }

    /// Worker threads whose loop is still running (equals [`CpuPool::threads`] while healthy).
    pub fn live_workers(&self) -> usize {
        self.inner.live.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The idle spin window the workers were built with.
    pub fn spin_window(&self) -> Duration {
        self.inner.spin
    }

    /// Live worker threads (test hook for the drop-joins contract).
    #[cfg(test)]
    fn live_counter(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        Arc::clone(&self.inner.live)
    }
}

/// Replies still to collect from an owned job.
pub(crate) struct Pending {
    rx: Receiver<Reply>,
    sent: usize,
    /// Parts no worker received (the pool was stopping).
    pub(crate) unsent: Vec<usize>,
    first_err: Option<ExecError>,
    /// The pool's caller spin (see `PoolInner::caller_spin`).
    spin: Duration,
}

impl Pending {
    /// Wait for every sent part; the first error, if any.
    pub(crate) fn wait(mut self) -> Result<(), ExecError> {
        for _ in 0..self.sent {
            match recv_spinning(&self.rx, self.spin) {
                Ok(Reply { result: Ok(_), .. }) => {}
                Ok(Reply { result: Err(e), .. }) => {
                    self.first_err.get_or_insert(e);
                }
                Err(_) => {
                    self.first_err
                        .get_or_insert(ExecError::PoolStopped { worker: usize::MAX });
                    break;
                }
            }
        }
        match self.first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// [`CpuPool::run_job_claimed`]'s job: the inner job over chunks taken off a shared cursor.
struct ClaimedRows<'j> {
    job: &'j (dyn PoolJob + 'j),
    /// The first row not yet claimed (`end` once nothing is left).
    next: CachePadded<AtomicUsize>,
    end: usize,
    /// Chunk sizes are multiples of `unit`, at most `max` (itself a multiple).
    unit: usize,
    max: usize,
    /// A chunk takes 1/`share` of the rows left (see [`GUIDED_SHARE`]).
    share: usize,
}

impl ClaimedRows<'_> {
    /// Claim the next chunk, or `None` when every row is taken.
    fn claim(&self) -> Option<Range<usize>> {
        let mut a = self.next.load(Ordering::Relaxed);
        loop {
            if a >= self.end {
                return None;
            }
            let left = self.end - a;
            let size = (left / self.share / self.unit * self.unit).clamp(self.unit, self.max);
            let b = (a + size).min(self.end);
            match self
                .next
                .compare_exchange_weak(a, b, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(a..b),
                Err(now) => a = now,
            }
        }
    }
}

impl PoolJob for ClaimedRows<'_> {
    fn run(&self, _taker: Range<usize>) -> Result<u64, ExecError> {
        let mut acc = 0u64;
        while let Some(rows) = self.claim() {
            match self.job.run(rows) {
                Ok(v) => acc ^= v,
                Err(e) => {
                    // The call fails anyway: the other threads stop at their next claim.
                    self.next.store(self.end, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(acc)
    }
}

/// Cut `rows` into at most `parts` contiguous, non-empty ranges whose interior cut points are
/// multiples of `align` (absolute), as even as that allows. Covers `rows` exactly, in order.
pub fn partition(rows: Range<usize>, parts: usize, align: usize) -> Vec<Range<usize>> {
    let (start, end) = (rows.start, rows.end);
    if start >= end || parts == 0 {
        return Vec::new();
    }
    let align = align.max(1);
    // Aligned units between the first aligned row after `start` and the last before `end`.
    let first_cut = start.div_ceil(align) * align;
    let last_cut = end / align * align;
    let units = if last_cut > first_cut {
        (last_cut - first_cut) / align
    } else {
        0
    };
    let mut out = Vec::with_capacity(parts);
    let mut lo = start;
    // The head (start..first_cut) and tail (last_cut..end) partial units ride with the first and
    // last parts; interior cuts spread the `units` whole units as evenly as integer steps allow.
    for i in 1..parts {
        let cut = first_cut + (units * i / parts) * align;
        let cut = cut.clamp(lo, end);
        if cut > lo {
            out.push(lo..cut);
            lo = cut;
        }
    }
    if lo < end {
        out.push(lo..end);
    }
    out
}

#[cfg(test)]
mod tests;
