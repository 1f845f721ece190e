//! The worker actor: [`CpuWorker`] owns its request channel and its loop, runs on its own
//! pinned thread and only executes; it spins for the pool's window after each request so the
//! next step finds it awake, then blocks. Also the one place this crate erases a borrow's
//! lifetime ([`JobPtr::erase`]), for the jobs a blocked caller lends the workers.

use crate::error::ExecError;
use core_affinity::CoreId;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Polls between two clock reads while spinning (a clock read costs ~20 ns; a `pause` ~10–40).
const SPIN_POLLS_PER_CLOCK_READ: u32 = 64;

/// Work a pool runs: called once per worker with that worker's disjoint row range.
///
/// Returns a value the pool XOR-folds over workers (the bandwidth probe's checksum; 0 for GEMV).
pub(crate) trait PoolJob: Sync {
    /// Run rows `rows` (absolute row indices).
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError>;
}

/// A job pointer with its borrow lifetime erased, so it can cross the channel: the crate's one
/// lifetime-erasure primitive.
#[derive(Clone, Copy)]
pub(crate) struct JobPtr(*const (dyn PoolJob + 'static));

// SAFETY: `PoolJob: Sync`, so sharing `&dyn PoolJob` between threads is sound; the pointer is
// only dereferenced while the caller of `run_job` is blocked waiting (see `run_job`).
unsafe impl Send for JobPtr {}

impl JobPtr {
    /// `job` with its lifetime erased.
    ///
    /// # Safety
    /// The caller must not let `job`'s borrow end (return, unwind past it) before every worker
    /// it sends the pointer to has replied or dropped the message: a worker dereferences it
    /// strictly before either.
    pub(crate) unsafe fn erase(job: &(dyn PoolJob + '_)) -> JobPtr {
        let short: *const (dyn PoolJob + '_) = job;
        // SAFETY: only the lifetime bound changes (same fat-pointer layout); the caller's
        // contract keeps the job alive for every use.
        JobPtr(unsafe {
            std::mem::transmute::<*const (dyn PoolJob + '_), *const (dyn PoolJob + 'static)>(short)
        })
    }
}

/// One request to a worker.
pub(crate) enum WorkerMsg {
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
pub(crate) struct Reply {
    /// Which worker answered (for the error).
    pub(crate) worker: usize,
    /// The job's result, or the caught panic as `WorkerPanicked`.
    pub(crate) result: Result<u64, ExecError>,
}

/// The worker task: owns its receiver and loop; runs on its own (pinned) thread.
pub struct CpuWorker {
    /// Index in the pool (names the worker in errors).
    pub(crate) index: usize,
    /// Requests; the loop ends when every sender (every pool handle) is gone.
    pub(crate) rx: Receiver<WorkerMsg>,
    /// Core to pin to, if pinning.
    pub(crate) core: Option<CoreId>,
    /// Spin window before blocking.
    pub(crate) spin: Duration,
    /// Live-worker count, decremented when the loop exits (lets tests see that drop joined).
    pub(crate) live: Arc<std::sync::atomic::AtomicUsize>,
}

impl CpuWorker {
    /// The loop: pin, then execute requests until the channel closes.
    pub(crate) fn run(self) {
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
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// A reply, polled for up to `spin` before blocking: a caller that parks while its workers
/// compute pays a futex wake-up when the last reply lands, on every dispatch.
pub(crate) fn recv_spinning(
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
