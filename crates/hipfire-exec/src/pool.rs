//! The CPU engine: a pool of pinned worker threads that multiply row ranges.
//!
//! Actor split (Ryhl): [`CpuWorker`] is the task — it owns its receiver and its loop, runs on
//! its own pinned thread and only executes; [`CpuPool`] is the cloneable handle — it owns the
//! senders, cuts a row range into one contiguous slice per worker, sends, and waits for every
//! reply. When the last handle is dropped the senders go, each worker's loop ends, and the
//! drop guard joins the threads.
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

use crate::error::ExecError;
use crate::kernel::{gemv_rows, ActivationBuf};
use crate::topology;
use core_affinity::CoreId;
use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};
use hipfire_quant::Format;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins (polling its channel) before it blocks.
///
/// Value: chosen, not yet measured on the target box. Consecutive spilled GEMVs of one layer
/// arrive within ~100 µs of each other (reference system, per split step: d2h 30–80 µs, join
/// 30–50 µs), while a futex wake-up of a blocked thread costs tens of µs; 50 µs of spinning keeps
/// workers awake through those gaps and bounds the wasted core time between tokens.
pub const SPIN_WINDOW: Duration = Duration::from_micros(50);

/// Polls between two clock reads while spinning (a clock read costs ~20 ns; a `pause` ~10–40).
const SPIN_POLLS_PER_CLOCK_READ: u32 = 64;

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

/// Work a pool runs: called once per worker with that worker's disjoint row range.
///
/// Returns a value the pool XOR-folds over workers (the bandwidth probe's checksum; 0 for GEMV).
pub(crate) trait PoolJob: Sync {
    /// Run rows `rows` (absolute row indices).
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError>;
}

/// A job pointer with its borrow lifetime erased, so it can cross the channel.
struct JobPtr(*const (dyn PoolJob + 'static));

// SAFETY: `PoolJob: Sync`, so sharing `&dyn PoolJob` between threads is sound; the pointer is
// only dereferenced while the caller of `run_job` is blocked waiting (see `run_job`).
unsafe impl Send for JobPtr {}

/// One request to a worker.
enum WorkerMsg {
    /// Run `job` over `rows` and answer on `respond_to`.
    Run {
        /// The job (borrowed from the blocked caller).
        job: JobPtr,
        /// This worker's rows.
        rows: Range<usize>,
        /// Reply slot; shared by the workers of one call, sized so sends never block.
        respond_to: Sender<Reply>,
    },
    /// Run an owned job (submitted without blocking the caller; see `CpuPool::submit_owned`).
    RunOwned {
        /// The job, kept alive by this message.
        job: Arc<dyn PoolJob + Send + Sync>,
        /// This worker's rows.
        rows: Range<usize>,
        /// Reply slot, as for `Run`.
        respond_to: Sender<Reply>,
    },
}

/// A worker's answer.
struct Reply {
    /// Which worker answered (for the error).
    worker: usize,
    /// The job's result, or the caught panic as `WorkerPanicked`.
    result: Result<u64, ExecError>,
}

/// The worker task: owns its receiver and loop; runs on its own (pinned) thread.
pub struct CpuWorker {
    /// Index in the pool (names the worker in errors).
    index: usize,
    /// Requests; the loop ends when every sender (every pool handle) is gone.
    rx: Receiver<WorkerMsg>,
    /// Core to pin to, if pinning.
    core: Option<CoreId>,
    /// Spin window before blocking.
    spin: Duration,
    /// Live-worker count, decremented when the loop exits (lets tests see that drop joined).
    live: Arc<std::sync::atomic::AtomicUsize>,
}

impl CpuWorker {
    /// The loop: pin, then execute requests until the channel closes.
    fn run(self) {
        if let Some(core) = self.core {
            if !core_affinity::set_for_current(core) {
                tracing::warn!(target: "hipfire::cpu_exec", worker = self.index, core = core.id,
                    "could not pin cpu worker; running unpinned");
            }
        }
        while let Some(msg) = self.next_msg() {
            match msg {
                WorkerMsg::Run {
                    job,
                    rows,
                    respond_to,
                } => {
                    // SAFETY: the caller of `run_job` blocks until this reply is sent or this
                    // message is dropped, so the job it points to is alive here.
                    let job: &dyn PoolJob = unsafe { &*job.0 };
                    self.execute(job, rows, &respond_to);
                }
                WorkerMsg::RunOwned {
                    job,
                    rows,
                    respond_to,
                } => self.execute(&*job, rows, &respond_to),
            }
        }
        self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Run one job, catching a panic as `WorkerPanicked`, and reply.
    fn execute(&self, job: &dyn PoolJob, rows: Range<usize>, respond_to: &Sender<Reply>) {
        let result = match catch_unwind(AssertUnwindSafe(|| job.run(rows))) {
            Ok(r) => r,
            Err(payload) => Err(ExecError::WorkerPanicked {
                worker: self.index,
                message: panic_message(payload.as_ref()),
            }),
        };
        // The caller may have gone only if it is itself unwinding; nothing to do then.
        let _ = respond_to.send(Reply {
            worker: self.index,
            result,
        });
    }

    /// Next request: spin for the window, then block. `None` when all senders are gone.
    fn next_msg(&self) -> Option<WorkerMsg> {
        let deadline = Instant::now() + self.spin;
        loop {
            for _ in 0..SPIN_POLLS_PER_CLOCK_READ {
                match self.rx.try_recv() {
                    Ok(m) => return Some(m),
                    Err(TryRecvError::Disconnected) => return None,
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
            if Instant::now() >= deadline {
                return self.rx.recv().ok();
            }
            // Give the core away if anything else is runnable on it — typically the caller,
            // woken by our reply, when workers occupy every core. Measured on the 2-core CI box
            // under load (loadavg ~7, `cpu_gemv_bench` dispatch line): without the yield a warm
            // empty call on 2 workers took 67 µs (the caller waited out a worker's spin
            // window), with it 7.7 µs; on 1 worker it costs 0.6 → 7.5 µs there. A syscall per
            // `SPIN_POLLS_PER_CLOCK_READ` polls when the core is otherwise idle.
            std::thread::yield_now();
        }
    }
}

/// Text of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
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

    /// `y = W·x` (or `y += W·x` with `accumulate`) over all `m = y.len()` rows of `w`, split
    /// across the workers; the activation is prepared once.
    ///
    /// `w.len()` must equal `m × fmt.row_bytes(k)` and `x.len()` must equal `k`.
    pub fn gemv(
        &self,
        fmt: Format,
        w: &[u8],
        k: usize,
        x: &[f32],
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ExecError> {
        check_x_len(k, x)?;
        let row_bytes = fmt.row_bytes(k)?;
        let need = y.len() * row_bytes;
        if w.len() != need {
            return Err(ExecError::Shape {
                what: "weight bytes (m × row_bytes)",
                need,
                got: w.len(),
            });
        }
        if y.is_empty() {
            return Ok(());
        }
        let act = ActivationBuf::prepare(fmt, x)?;
        self.gemv_prepared(fmt, w, k, &act, 0, y, accumulate)
    }

    /// Rows `[row0, row0 + y.len())` of the matrix `w` (all of its rows, `w.len()` a whole number
    /// of rows covering at least `row0 + y.len()`): `y[i] (+)= W[row0 + i]·x`, with `act`
    /// already prepared for `fmt`. This is the passback CPU arm: `row0 = g`, `y = &mut out[g..m]`.
    ///
    /// Worker cut points are multiples of [`WORKER_ROW_ALIGN`] in absolute rows.
    #[allow(clippy::too_many_arguments)] // the GEMV's own operands; a struct would only rename them
    pub fn gemv_prepared(
        &self,
        fmt: Format,
        w: &[u8],
        k: usize,
        act: &ActivationBuf,
        row0: usize,
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ExecError> {
        let row_bytes = fmt.row_bytes(k)?;
        self.gemv_strided(fmt, w, k, row_bytes, act, row0, y, accumulate)
    }

    /// As [`CpuPool::gemv_prepared`] for rows `stride` bytes apart (`stride >= row_bytes`;
    /// padded rows, which the split refuses but the CPU still runs whole).
    #[allow(clippy::too_many_arguments)] // as gemv_prepared, plus the stride
    pub fn gemv_strided(
        &self,
        fmt: Format,
        w: &[u8],
        k: usize,
        stride: usize,
        act: &ActivationBuf,
        row0: usize,
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ExecError> {
        let row_bytes = fmt.row_bytes(k)?;
        if stride < row_bytes {
            return Err(ExecError::Shape {
                what: "row stride (bytes)",
                need: row_bytes,
                got: stride,
            });
        }
        if y.is_empty() {
            return Ok(());
        }
        let end = row0 + y.len();
        let need = (end - 1) * stride + row_bytes;
        if w.len() < need {
            return Err(ExecError::Shape {
                what: "weight bytes (rows × row_bytes)",
                need,
                got: w.len(),
            });
        }
        let job = GemvJob {
            fmt,
            k,
            row_bytes,
            stride,
            w,
            act,
            row0,
            y: y.as_mut_ptr(),
            y_len: y.len(),
            accumulate,
        };
        self.run_job(&job, row0..end).map(|_| ())
    }

    /// Several matrices of one format over the same `x` in one dispatch: `segs[i].y (+)=
    /// segs[i].w · x` for every segment, the rows of all segments cut among the workers as one
    /// row space. The activation is prepared once. Each row's result is bit-identical to
    /// [`CpuPool::gemv`] on its own matrix (same prepared activation, same row dot); what is
    /// saved is one dispatch and one activation preparation per extra matrix — q/k/v and
    /// gate/up of a decode step.
    ///
    /// It is [`CpuPool::gemv_tokens`] with one token, kept as its own job: routing it through
    /// the token job (with a one-token path inside) measured 297 against 302 tok/s of SmolLM2
    /// decode on the 2-core VM (mean of 18 rounds each, alternating builds, 2026-11-29).
    pub fn gemv_batch(
        &self,
        fmt: Format,
        k: usize,
        x: &[f32],
        segs: &mut [GemvSegment<'_>],
    ) -> Result<(), ExecError> {
        check_x_len(k, x)?;
        let row_bytes = fmt.row_bytes(k)?;
        let mut parts = Vec::with_capacity(segs.len());
        let mut start = 0usize;
        for s in segs.iter_mut() {
            let need = s.y.len() * row_bytes;
            if s.w.len() != need {
                return Err(ExecError::Shape {
                    what: "weight bytes (m × row_bytes)",
                    need,
                    got: s.w.len(),
                });
            }
            parts.push(BatchPart {
                start,
                w: s.w,
                y: s.y.as_mut_ptr(),
                y_len: s.y.len(),
                accumulate: s.accumulate,
            });
            start += s.y.len();
        }
        if start == 0 {
            return Ok(());
        }
        let act = ActivationBuf::prepare(fmt, x)?;
        let job = BatchGemvJob {
            fmt,
            k,
            row_bytes,
            act: &act,
            parts,
        };
        self.run_job(&job, 0..start).map(|_| ())
    }

    /// Several matrices of one format over `T` activation vectors (prompt tokens) in one
    /// dispatch: for every token `t` and segment `s`, `s.y[t·m..(t+1)·m] (+)= s.w · xs[t·k..(t+1)·k]`
    /// (`m = s.w` rows; `xs` is `T × k` and each `y` is `T × m`, token-major). One activation is
    /// prepared per token; inside its row range each worker walks the rows in tiles of about
    /// [`TOKEN_TILE_BYTES`] of weight, running every token over a tile before moving on, so
    /// each weight byte is read from memory once per call instead of once per token.
    ///
    /// Every output row is bit-identical to [`CpuPool::gemv`] of that token on that matrix (same
    /// prepared activation, same row dot, same accumulate).
    pub fn gemv_tokens(
        &self,
        fmt: Format,
        k: usize,
        xs: &[f32],
        segs: &mut [GemvSegment<'_>],
    ) -> Result<(), ExecError> {
        if k == 0 {
            return Err(ExecError::Shape {
                what: "k (row length)",
                need: 1,
                got: 0,
            });
        }
        if xs.len() % k != 0 {
            return Err(ExecError::Shape {
                what: "xs (tokens × k)",
                need: xs.len().div_ceil(k) * k,
                got: xs.len(),
            });
        }
        let tokens = xs.len() / k;
        let row_bytes = fmt.row_bytes(k)?;
        let mut parts = Vec::with_capacity(segs.len());
        let mut start = 0usize;
        for s in segs.iter_mut() {
            let m = s.w.len() / row_bytes;
            if s.w.len() % row_bytes != 0 || s.y.len() != tokens * m {
                return Err(ExecError::Shape {
                    what: "segment output (tokens × m, m = weight bytes / row_bytes)",
                    need: tokens * m,
                    got: s.y.len(),
                });
            }
            parts.push(TokenPart {
                start,
                m,
                w: s.w,
                y: s.y.as_mut_ptr(),
                accumulate: s.accumulate,
            });
            start += m;
        }
        if start == 0 || tokens == 0 {
            return Ok(());
        }
        let acts = xs
            .chunks_exact(k)
            .map(|x| ActivationBuf::prepare(fmt, x))
            .collect::<Result<Vec<_>, _>>()?;
        let job = TokenGemvJob {
            fmt,
            k,
            row_bytes,
            tile_rows: (TOKEN_TILE_BYTES / row_bytes).max(1),
            acts: &acts,
            parts,
        };
        self.run_job(&job, 0..start).map(|_| ())
    }

    /// Run `f` over `0..n` cut into one contiguous part per computing thread (no alignment:
    /// for per-head or per-item work that is not a GEMV, such as attention). Waits for every
    /// part; an error only when the pool itself failed (a part that panicked, a stopped worker).
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
        self.run_job_aligned(&ForJob(f), 0..n, 1).map(|_| ())
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

    /// [`CpuPool::run_job`] with cut points at multiples of `align`.
    fn run_job_aligned(
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
        let short: *const (dyn PoolJob + '_) = job;
        // SAFETY: only the lifetime bound changes (same fat-pointer layout). The pointer is
        // dereferenced by workers strictly before they send their reply or drop the message,
        // and this function does not return until it has received one reply per message sent
        // or seen every reply sender dropped (a worker that died dropped its message, and the
        // pointer with it). So `job` outlives every use.
        let erased: *const (dyn PoolJob + 'static) = unsafe { std::mem::transmute(short) };
        let mut sent = 0usize;
        let mut first_err: Option<ExecError> = None;
        for (worker, part) in parts.into_iter().enumerate() {
            let msg = WorkerMsg::Run {
                job: JobPtr(erased),
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

/// GEMV over a row range, writing into the caller's output through a raw pointer.
struct GemvJob<'a> {
    fmt: Format,
    k: usize,
    row_bytes: usize,
    /// Bytes between row starts (`row_bytes` when packed).
    stride: usize,
    /// The whole weight (row `r` starts at `r × stride`).
    w: &'a [u8],
    act: &'a ActivationBuf,
    /// Absolute row of `y[0]`.
    row0: usize,
    /// `y.as_mut_ptr()` of the caller's `&mut [f32]`, exclusively borrowed for the call.
    y: *mut f32,
    y_len: usize,
    accumulate: bool,
}

// SAFETY: workers only write through `y` into the disjoint ranges `partition` hands them, and
// only read `w`/`act` (shared borrows); the caller's `&mut` borrow of `y` lasts the whole call.
unsafe impl Sync for GemvJob<'_> {}

impl PoolJob for GemvJob<'_> {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        debug_assert!(rows.start >= self.row0 && rows.end - self.row0 <= self.y_len);
        let local = rows.start - self.row0;
        // SAFETY: `rows` is inside `[row0, row0 + y_len)` (partition of exactly that range) and
        // disjoint from every other worker's rows of this call; the pointer comes from a live
        // `&mut [f32]` of length `y_len` held by the blocked caller.
        let y = unsafe { std::slice::from_raw_parts_mut(self.y.add(local), rows.len()) };
        if self.stride == self.row_bytes {
            let w = &self.w[rows.start * self.row_bytes..rows.end * self.row_bytes];
            gemv_rows(self.fmt, w, self.k, self.act, y, self.accumulate)?;
        } else {
            // Padded rows: one row at a time (the same row dot, so the same bits per row).
            for (i, yi) in y.chunks_mut(1).enumerate() {
                let start = (rows.start + i) * self.stride;
                gemv_rows(
                    self.fmt,
                    &self.w[start..start + self.row_bytes],
                    self.k,
                    self.act,
                    yi,
                    self.accumulate,
                )?;
            }
        }
        Ok(0)
    }
}

/// A reply, polled for up to `spin` before blocking: a caller that parks while its workers
/// compute pays a futex wake-up when the last reply lands, on every dispatch.
fn recv_spinning(
    rx: &crossbeam_channel::Receiver<Reply>,
    spin: Duration,
) -> Result<Reply, crossbeam_channel::RecvError> {
    if spin.is_zero() {
        return rx.recv();
    }
    let t0 = Instant::now();
    loop {
        for _ in 0..SPIN_POLLS_PER_CLOCK_READ {
            match rx.try_recv() {
                Ok(r) => return Ok(r),
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    return Err(crossbeam_channel::RecvError)
                }
                Err(crossbeam_channel::TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
        if t0.elapsed() >= spin {
            return rx.recv();
        }
    }
}

fn check_x_len(k: usize, x: &[f32]) -> Result<(), ExecError> {
    if x.len() != k {
        return Err(ExecError::Shape {
            what: "x",
            need: k,
            got: x.len(),
        });
    }
    Ok(())
}

/// One matrix of [`CpuPool::gemv_batch`] (`y (+)= w · x`, `w` holding `y.len()` rows) or of
/// [`CpuPool::gemv_tokens`] (`y[t·m..(t+1)·m] (+)= w · x_t` for every token `t`, `w` holding
/// `m = y.len() / tokens` rows).
pub struct GemvSegment<'a> {
    /// The matrix (whole rows of the call's format and `k`).
    pub w: &'a [u8],
    /// Its output: `m` values, or `tokens × m` token-major for `gemv_tokens`.
    pub y: &'a mut [f32],
    /// Add into `y` instead of overwriting it.
    pub accumulate: bool,
}

/// A segment of a batched job: rows `[start, start + y_len)` of the batch's row space.
struct BatchPart<'a> {
    start: usize,
    w: &'a [u8],
    /// `y.as_mut_ptr()` of the segment's `&mut [f32]`, exclusively borrowed for the call.
    y: *mut f32,
    y_len: usize,
    accumulate: bool,
}

struct BatchGemvJob<'a> {
    fmt: Format,
    k: usize,
    row_bytes: usize,
    act: &'a ActivationBuf,
    parts: Vec<BatchPart<'a>>,
}

// SAFETY: workers write only the rows of each segment's `y` that fall in their own disjoint range
// of the batch's row space (`partition`), and only read `w`/`act`; the caller's `&mut` borrows of
// every `y` last the whole call.
unsafe impl Sync for BatchGemvJob<'_> {}

impl PoolJob for BatchGemvJob<'_> {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        for p in &self.parts {
            let lo = rows.start.max(p.start);
            let hi = rows.end.min(p.start + p.y_len);
            if lo >= hi {
                continue;
            }
            let (a, b) = (lo - p.start, hi - p.start);
            // SAFETY: `a..b` lies inside the segment (`lo`/`hi` clamped to it) and inside this
            // worker's disjoint range; the pointer comes from a live `&mut [f32]` of length
            // `y_len` held by the blocked caller.
            let y = unsafe { std::slice::from_raw_parts_mut(p.y.add(a), b - a) };
            let w = &p.w[a * self.row_bytes..b * self.row_bytes];
            gemv_rows(self.fmt, w, self.k, self.act, y, p.accumulate)?;
        }
        Ok(0)
    }
}

/// Weight bytes per row tile of [`CpuPool::gemv_tokens`]: every token runs over one tile before
/// the next, so the tile should stay in L1 (32–48 KiB per core on current x86) next to the
/// tokens' prepared activations (T × ~1.1·k bytes for the q8 formats, from L2). Measured on the
/// 2-core VM (SmolLM2 Q4_1, 128-token prefill, 2026-11-29): 4 KiB 492–506, 16 KiB 518–520,
/// 64 KiB 499–526 tok/s — flat within noise, the row dots being compute-bound once each tile is
/// reused by 32 tokens.
pub const TOKEN_TILE_BYTES: usize = 16 * 1024;

/// A segment of a multi-token job: rows `[start, start + m)` of the job's row space.
struct TokenPart<'a> {
    start: usize,
    /// Rows of this segment (its output holds `tokens × m`).
    m: usize,
    w: &'a [u8],
    /// `y.as_mut_ptr()` of the segment's `&mut [f32]` (`tokens × m`), exclusively borrowed for
    /// the call.
    y: *mut f32,
    accumulate: bool,
}

/// Tokens one [`TokenGemvJob`] tile hands to `gemv_rows_multi` at once: the multi-activation
/// kernels' register group (eight), so each weight block of a tile is unpacked once per eight
/// tokens instead of once per token.
const TOKEN_GROUP: usize = 8;

struct TokenGemvJob<'a> {
    fmt: Format,
    k: usize,
    row_bytes: usize,
    /// Rows per tile (≥ 1).
    tile_rows: usize,
    /// One prepared activation per token.
    acts: &'a [ActivationBuf],
    parts: Vec<TokenPart<'a>>,
}

// SAFETY: a worker writes, for every token, only the rows of each segment that fall in its own
// disjoint range of the job's row space (`partition`), and only reads `w`/`acts`; the caller's
// `&mut` borrows of every `y` last the whole call.
unsafe impl Sync for TokenGemvJob<'_> {}

impl PoolJob for TokenGemvJob<'_> {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        for p in &self.parts {
            let lo = rows.start.max(p.start);
            let hi = rows.end.min(p.start + p.m);
            let mut a = lo.saturating_sub(p.start);
            let b = hi.saturating_sub(p.start);
            while a < b {
                let e = (a + self.tile_rows).min(b);
                let w = &p.w[a * self.row_bytes..e * self.row_bytes];
                for (g, group) in self.acts.chunks(TOKEN_GROUP).enumerate() {
                    let t0 = g * TOKEN_GROUP;
                    let refs: [&ActivationBuf; TOKEN_GROUP] =
                        std::array::from_fn(|i| &group[i.min(group.len() - 1)]);
                    let mut ys: [&mut [f32]; TOKEN_GROUP] = std::array::from_fn(|i| {
                        if i >= group.len() {
                            return &mut [][..];
                        }
                        // SAFETY: rows `a..e` lie inside the segment (`lo`/`hi` clamped to it)
                        // and inside this worker's disjoint range, so `t·m + a .. t·m + e`
                        // (t = t0 + i < tokens) is inside the `tokens × m` output and written by
                        // no other worker, nor aliased by another `ys[i]` (distinct t); the
                        // pointer comes from a live `&mut [f32]` of that length held by the
                        // blocked caller.
                        unsafe {
                            std::slice::from_raw_parts_mut(p.y.add((t0 + i) * p.m + a), e - a)
                        }
                    });
                    let n = group.len();
                    hipfire_quant::gemv_rows_multi(
                        self.fmt,
                        w,
                        self.k,
                        &refs[..n],
                        &mut ys[..n],
                        p.accumulate,
                    )?;
                }
                a = e;
            }
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn gemv_batch_is_bit_identical_to_separate_gemvs() {
        let mut rng = ChaCha8Rng::seed_from_u64(0xBA7C);
        let pool = CpuPool::new(3).expect("pool");
        for fmt in [Format::Q4K, Format::Q4_1, Format::Q8_0, Format::F32] {
            let k = 512;
            let rb = fmt.row_bytes(k).expect("rb");
            // Odd heights so worker cuts fall inside segments and across their boundaries.
            let ms = [37usize, 5, 90];
            let ws: Vec<Vec<u8>> = ms
                .iter()
                .map(|&m| {
                    let mut w = Vec::with_capacity(m * rb);
                    for _ in 0..m {
                        let row: Vec<f32> =
                            (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                        w.extend(hipfire_quant::quantize_row(fmt, &row).expect("quantise"));
                    }
                    w
                })
                .collect();
            let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let base: Vec<Vec<f32>> = ms
                .iter()
                .map(|&m| (0..m).map(|_| rng.random_range(-1.0f32..1.0)).collect())
                .collect();
            for accumulate in [false, true] {
                let mut want = Vec::new();
                for (w, b) in ws.iter().zip(&base) {
                    let mut y = if accumulate {
                        b.clone()
                    } else {
                        vec![f32::NAN; b.len()]
                    };
                    pool.gemv(fmt, w, k, &x, &mut y, accumulate).expect("gemv");
                    want.push(y);
                }
                let mut got: Vec<Vec<f32>> = base
                    .iter()
                    .map(|b| {
                        if accumulate {
                            b.clone()
                        } else {
                            vec![f32::NAN; b.len()]
                        }
                    })
                    .collect();
                let mut segs: Vec<GemvSegment<'_>> = ws
                    .iter()
                    .zip(got.iter_mut())
                    .map(|(w, y)| GemvSegment { w, y, accumulate })
                    .collect();
                pool.gemv_batch(fmt, k, &x, &mut segs).expect("batch");
                for (g, w) in got.iter().zip(&want) {
                    assert!(g.iter().all(|v| v.is_finite()), "{fmt}: unwritten rows");
                    assert_eq!(
                        g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{fmt} accumulate={accumulate}"
                    );
                }
            }
        }
        // A segment whose bytes do not match its rows is refused.
        let mut y = vec![0.0f32; 4];
        let mut segs = [GemvSegment {
            w: &[0u8; 3],
            y: &mut y,
            accumulate: false,
        }];
        assert!(pool
            .gemv_batch(Format::F32, 4, &[1.0; 4], &mut segs)
            .is_err());
    }

    #[test]
    fn gemv_tokens_is_bit_identical_to_per_token_gemv() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x70C5);
        for pool in [
            CpuPool::new(3).expect("pool"),
            caller_pool(2),
            caller_pool(1),
        ] {
            for fmt in [Format::Q4K, Format::Q4_1, Format::Q8_0, Format::F32] {
                let k = 512;
                // Odd heights: worker cuts and tiles fall inside segments and across them.
                let ms = [37usize, 5, 301];
                let ws: Vec<Vec<u8>> = ms
                    .iter()
                    .map(|&m| random_weight(fmt, k, m, &mut rng))
                    .collect();
                for tokens in [1usize, 3, 7] {
                    let xs: Vec<f32> = (0..tokens * k)
                        .map(|_| rng.random_range(-1.0f32..1.0))
                        .collect();
                    for accumulate in [false, true] {
                        let base: Vec<Vec<f32>> = ms
                            .iter()
                            .map(|&m| {
                                (0..tokens * m)
                                    .map(|_| {
                                        if accumulate {
                                            rng.random_range(-1.0f32..1.0)
                                        } else {
                                            f32::NAN
                                        }
                                    })
                                    .collect()
                            })
                            .collect();
                        let mut want = base.clone();
                        for ((w, y), &m) in ws.iter().zip(want.iter_mut()).zip(&ms) {
                            for (x, yt) in xs.chunks_exact(k).zip(y.chunks_exact_mut(m)) {
                                pool.gemv(fmt, w, k, x, yt, accumulate).expect("gemv");
                            }
                        }
                        let mut got = base.clone();
                        let mut segs: Vec<GemvSegment<'_>> = ws
                            .iter()
                            .zip(got.iter_mut())
                            .map(|(w, y)| GemvSegment { w, y, accumulate })
                            .collect();
                        pool.gemv_tokens(fmt, k, &xs, &mut segs).expect("tokens");
                        for (g, w) in got.iter().zip(&want) {
                            assert!(g.iter().all(|v| v.is_finite()), "{fmt}: unwritten rows");
                            assert_eq!(
                                bits(g),
                                bits(w),
                                "{fmt} tokens={tokens} accumulate={accumulate}"
                            );
                        }
                    }
                }
            }
        }
        // Shapes are checked: ragged xs, wrong output length, zero k.
        let pool = CpuPool::new(2).expect("pool");
        let w = vec![0u8; 4 * 4 * 3];
        let mut y = vec![0.0f32; 3 * 2];
        let mut segs = [GemvSegment {
            w: &w,
            y: &mut y,
            accumulate: false,
        }];
        assert!(matches!(
            pool.gemv_tokens(Format::F32, 4, &[1.0; 7], &mut segs),
            Err(ExecError::Shape { .. })
        ));
        assert!(matches!(
            pool.gemv_tokens(Format::F32, 4, &[1.0; 12], &mut segs),
            Err(ExecError::Shape { .. })
        ));
        assert!(matches!(
            pool.gemv_tokens(Format::F32, 0, &[], &mut segs),
            Err(ExecError::Shape { .. })
        ));
        pool.gemv_tokens(Format::F32, 4, &[1.0; 8], &mut segs)
            .expect("2 tokens × 3 rows");
    }

    /// Formats the pool is checked on: all of them (each has a CPU row dot).
    fn test_formats() -> Vec<Format> {
        Format::ALL.to_vec()
    }

    /// Seeded random weight of `m` rows in `fmt` (random f32 rows quantised, or raw f32 bytes).
    fn random_weight(fmt: Format, k: usize, m: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let rb = fmt.row_bytes(k).expect("k fits");
        let mut w = Vec::with_capacity(m * rb);
        for _ in 0..m {
            let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            w.extend(crate::kernel::test_support::encode_row(fmt, &row));
        }
        w
    }

    #[test]
    fn pool_matches_single_thread_bit_exact() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0001);
        let k = 256;
        let formats = test_formats();
        assert!(!formats.is_empty());
        for fmt in formats {
            for m in [1usize, 17, 4097] {
                let w = random_weight(fmt, k, m, &mut rng);
                let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let act = ActivationBuf::prepare(fmt, &x).expect("prepare");
                let mut want = vec![f32::NAN; m];
                gemv_rows(fmt, &w, k, &act, &mut want, false).expect("reference");
                let base: Vec<f32> = (0..m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let mut want_acc = base.clone();
                gemv_rows(fmt, &w, k, &act, &mut want_acc, true).expect("reference acc");
                for threads in 1..=4 {
                    let pool = CpuPool::with_config(PoolConfig {
                        threads,
                        ..PoolConfig::default()
                    })
                    .expect("pool");
                    // Poison: a row the pool never writes stays NaN and fails the comparison.
                    let mut y = vec![f32::NAN; m];
                    pool.gemv(fmt, &w, k, &x, &mut y, false).expect("gemv");
                    assert_eq!(bits(&y), bits(&want), "{fmt} m={m} threads={threads}");
                    let mut y = base.clone();
                    pool.gemv(fmt, &w, k, &x, &mut y, true).expect("gemv acc");
                    assert_eq!(
                        bits(&y),
                        bits(&want_acc),
                        "{fmt} m={m} threads={threads} residual"
                    );
                    // Passback CPU arm: rows [g, m) into a slice, rows below g untouched.
                    let g = m / 3 / 16 * 16;
                    let mut out = vec![f32::NAN; m];
                    out[..g].fill(7.0);
                    pool.gemv_prepared(fmt, &w, k, &act, g, &mut out[g..], false)
                        .expect("arm");
                    assert!(out[..g].iter().all(|v| *v == 7.0));
                    assert_eq!(
                        bits(&out[g..]),
                        bits(&want[g..]),
                        "{fmt} m={m} threads={threads} arm g={g}"
                    );
                }
            }
        }
    }

    #[test]
    fn pool_matches_f64_reference() {
        // Independent check of the whole path on f32 weights (exactly representable).
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0002);
        let (k, m) = (64usize, 33usize);
        let wf: Vec<f32> = (0..k * m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let w: Vec<u8> = wf.iter().flat_map(|v| v.to_le_bytes()).collect();
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let pool = CpuPool::new(3).expect("pool");
        let mut y = vec![f32::NAN; m];
        pool.gemv(Format::F32, &w, k, &x, &mut y, false)
            .expect("gemv");
        for (r, yv) in y.iter().enumerate() {
            let want: f64 = (0..k)
                .map(|c| f64::from(wf[r * k + c]) * f64::from(x[c]))
                .sum();
            // f32 accumulation of 64 products of magnitude <= 1: error well under 64 * 2^-24 * 64.
            assert!(
                (f64::from(*yv) - want).abs() < 1e-4,
                "row {r}: {yv} vs {want}"
            );
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    #[test]
    fn padded_rows_match_packed() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0003);
        let (fmt, k, m, pad) = (Format::Q4_0, 256usize, 37usize, 48usize);
        let rb = fmt.row_bytes(k).expect("k");
        let packed = random_weight(fmt, k, m, &mut rng);
        let mut padded = vec![0xAAu8; m * (rb + pad)];
        for r in 0..m {
            padded[r * (rb + pad)..r * (rb + pad) + rb]
                .copy_from_slice(&packed[r * rb..(r + 1) * rb]);
        }
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let act = ActivationBuf::prepare(fmt, &x).expect("prepare");
        let pool = CpuPool::new(3).expect("pool");
        let mut want = vec![f32::NAN; m];
        pool.gemv(fmt, &packed, k, &x, &mut want, false)
            .expect("packed");
        let mut got = vec![f32::NAN; m];
        pool.gemv_strided(fmt, &padded, k, rb + pad, &act, 0, &mut got, false)
            .expect("padded");
        assert_eq!(bits(&got), bits(&want));
        assert!(pool
            .gemv_strided(fmt, &padded, k, rb - 1, &act, 0, &mut got, false)
            .is_err());
    }

    #[test]
    fn shape_errors_are_typed() {
        let pool = CpuPool::new(2).expect("pool");
        let k = 32;
        let w = vec![0u8; 4 * k * 3];
        let mut y = vec![0.0f32; 4];
        assert!(matches!(
            pool.gemv(Format::F32, &w, k, &[1.0; 31], &mut y, false),
            Err(ExecError::Shape { what: "x", .. })
        ));
        assert!(matches!(
            pool.gemv(Format::F32, &w, k, &[1.0; 32], &mut y, false),
            Err(ExecError::Shape { .. })
        ));
        assert!(matches!(
            pool.gemv(Format::Q8_0, &w, 33, &[1.0; 33], &mut y, false),
            Err(ExecError::Quant(_))
        ));
        let act = ActivationBuf::prepare(Format::F32, &[1.0; 32]).expect("prepare");
        assert!(matches!(
            pool.gemv_prepared(Format::F32, &w, k, &act, 2, &mut y, false),
            Err(ExecError::Shape { .. })
        ));
        // Empty output is a no-op, not an error.
        pool.gemv(Format::F32, &[], k, &[1.0; 32], &mut [], false)
            .expect("empty");
    }

    /// Test-only fault: panics in the worker that gets row `panic_row`.
    struct PanicJob {
        panic_row: usize,
        ran: AtomicUsize,
    }

    impl PoolJob for PanicJob {
        fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
            self.ran.fetch_add(1, Ordering::SeqCst);
            if rows.contains(&self.panic_row) {
                panic!("injected fault at rows {rows:?}");
            }
            Ok(rows.start as u64)
        }
    }

    fn caller_pool(threads: usize) -> CpuPool {
        CpuPool::with_config(PoolConfig {
            threads,
            caller_computes: true,
            ..PoolConfig::default()
        })
        .expect("pool")
    }

    #[test]
    fn computing_caller_gives_the_same_bits_with_one_worker_fewer() {
        let mut rng = ChaCha8Rng::seed_from_u64(0xCA11);
        let reference = CpuPool::new(2).expect("pool");
        for threads in [1usize, 2, 3] {
            let pool = caller_pool(threads);
            assert_eq!(pool.threads(), threads - 1);
            assert_eq!(pool.compute_threads(), threads);
            for fmt in [Format::Q4K, Format::Q8_0, Format::Q4_1] {
                let (k, m) = (256usize, 77usize);
                let mut w = Vec::new();
                for _ in 0..m {
                    let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                    w.extend(hipfire_quant::quantize_row(fmt, &row).expect("quantise"));
                }
                let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let mut want = vec![f32::NAN; m];
                reference
                    .gemv(fmt, &w, k, &x, &mut want, false)
                    .expect("gemv");
                let mut got = vec![f32::NAN; m];
                pool.gemv(fmt, &w, k, &x, &mut got, false).expect("gemv");
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{fmt} threads={threads}"
                );
            }
        }
    }

    #[test]
    fn a_panic_in_the_callers_part_is_an_error_after_the_workers_finish() {
        let pool = caller_pool(3);
        let job = PanicJob {
            panic_row: 0,
            ran: AtomicUsize::new(0),
        };
        let err = pool.run_job(&job, 0..64).expect_err("panic must surface");
        assert!(
            matches!(&err, ExecError::WorkerPanicked { worker, .. } if *worker == usize::MAX),
            "{err}"
        );
        assert_eq!(
            job.ran.load(Ordering::SeqCst),
            3,
            "caller and both workers ran"
        );
        let ok = PanicJob {
            panic_row: usize::MAX,
            ran: AtomicUsize::new(0),
        };
        pool.run_job(&ok, 0..64).expect("pool still works");
    }

    #[test]
    fn worker_panic_is_an_error_and_pool_survives() {
        let pool = CpuPool::new(4).expect("pool");
        let job = PanicJob {
            panic_row: 40,
            ran: AtomicUsize::new(0),
        };
        let err = pool.run_job(&job, 0..64).expect_err("panic must surface");
        match err {
            ExecError::WorkerPanicked { worker, message } => {
                assert_eq!(worker, 2);
                assert!(message.contains("injected fault"), "{message}");
            }
            other => panic!("wrong error {other}"),
        }
        // Every worker that got rows ran (the call waited for all of them).
        assert_eq!(job.ran.load(Ordering::SeqCst), 4);
        // The pool still works afterwards.
        let ok = PanicJob {
            panic_row: usize::MAX,
            ran: AtomicUsize::new(0),
        };
        assert_eq!(pool.run_job(&ok, 0..64).expect("ok"), 16 ^ 32 ^ 48);
    }

    #[test]
    fn drop_joins_workers() {
        let pool = CpuPool::new(3).expect("pool");
        let clone = pool.clone();
        let live = pool.live_counter();
        assert_eq!(live.load(Ordering::SeqCst), 3);
        drop(pool);
        // A clone keeps the pool running.
        let ok = PanicJob {
            panic_row: usize::MAX,
            ran: AtomicUsize::new(0),
        };
        clone.run_job(&ok, 0..48).expect("clone still runs");
        drop(clone);
        // Drop of the last handle returned only after every thread exited its loop.
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn concurrent_callers_on_clones() {
        let pool = CpuPool::new(2).expect("pool");
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let p = pool.clone();
                s.spawn(move || {
                    for _ in 0..50 {
                        let job = PanicJob {
                            panic_row: usize::MAX,
                            ran: AtomicUsize::new(0),
                        };
                        assert_eq!(p.run_job(&job, 0..32).expect("run"), 16, "caller {t}");
                    }
                });
            }
        });
    }

    #[test]
    fn default_pool_uses_physical_cores() {
        let pool = CpuPool::new(0).expect("pool");
        assert_eq!(pool.threads(), topology::default_threads());
        assert_eq!(pool.cores().len(), pool.threads());
    }

    #[test]
    fn partition_covers_and_aligns() {
        for (start, end) in [
            (0usize, 1usize),
            (0, 17),
            (0, 4097),
            (16, 33),
            (5, 4096),
            (3, 7),
            (100, 12288),
        ] {
            for parts in 1..=9 {
                let p = partition(start..end, parts, 16);
                assert!(!p.is_empty() && p.len() <= parts);
                assert_eq!(p[0].start, start);
                assert_eq!(p.last().map(|r| r.end), Some(end));
                for w in p.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert_eq!(w[0].end % 16, 0, "cut {} not aligned", w[0].end);
                }
                assert!(p.iter().all(|r| !r.is_empty()));
            }
        }
        // Even spread: 4096 rows over 4 parts = 1024 each.
        assert_eq!(
            partition(0..4096, 4, 16),
            vec![0..1024, 1024..2048, 2048..3072, 3072..4096]
        );
        assert!(partition(5..5, 3, 16).is_empty());
    }
}
