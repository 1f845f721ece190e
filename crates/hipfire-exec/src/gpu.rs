//! The GPU side of the executor: an engine trait, its actor, and a CPU-backed stand-in.
//!
//! [`GpuEngine`] is what the planner needs from a GPU: which kernels exist, and "multiply rows
//! `[a, b)` of this weight into these output rows, and tell me how long the device took". The
//! [`GpuActor`] owns one engine on its own thread (a GPU context is bound to the thread that
//! drives it); [`GpuHandle`] is the cloneable sender. Keeping the engine behind a trait object
//! is what lets the `cpu` mode and the planner's tests run in CI without a GPU, and lets the
//! passback split be exercised against `SimulatedGpu` (a second CPU engine that follows the
//! same contract).

use crate::error::ExecError;
use crate::share::{ArmTime, Form};
use crate::step::WeightView;
use crossbeam_channel::{bounded, Receiver, Sender};
use hipfire_quant::Format;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
#[cfg(any(test, feature = "testing"))]
use std::time::{Duration, Instant};

/// A GPU engine as the planner sees it. Implementations own their device state.
pub trait GpuEngine: Send + 'static {
    /// One line naming the engine (device, backend) for traces.
    fn label(&self) -> String;

    /// True iff the engine has a GEMV kernel for `format` in `form` (residual kernels are
    /// separate; a missing one makes the refusal rules keep residual steps off the split).
    fn has_kernel(&self, format: Format, form: Form) -> bool;

    /// `y_rows[i] (=|+=) W[rows.start + i] · x` for the rows in `rows` (`y_rows.len() ==
    /// rows.len()`), returning the arm's own duration as the device measured it (events), or a
    /// bound if it cannot time it. Must not return before `y_rows` holds the result.
    fn gemv_rows(
        &mut self,
        w: &WeightView<'_>,
        x: &[f32],
        rows: Range<usize>,
        y_rows: &mut [f32],
        form: Form,
    ) -> Result<ArmTime, ExecError>;
}

/// A GPU arm borrowed from the blocked planner (see [`GpuHandle::run_rows_while`]).
struct GpuJob<'a> {
    w: WeightView<'a>,
    x: &'a [f32],
    rows: Range<usize>,
    y: *mut f32,
    y_len: usize,
    form: Form,
}

/// A [`GpuJob`] with its lifetime erased so it can cross the channel.
struct GpuJobPtr(*const GpuJob<'static>);

// SAFETY: the pointee is only touched by the actor while the sender is blocked in
// `run_rows_while` (it waits for the reply, or for the actor to drop the message, before it
// returns — see `ReplyGuard`); the job's slices are shared reads except `y`, which the planner
// does not touch until the reply arrives.
unsafe impl Send for GpuJobPtr {}

/// Requests to the GPU actor.
enum GpuMsg {
    /// Run one arm and reply with its time.
    RunRows {
        job: GpuJobPtr,
        respond_to: Sender<Result<ArmTime, ExecError>>,
    },
    /// Report kernel availability.
    HasKernel {
        format: Format,
        form: Form,
        respond_to: Sender<bool>,
    },
}

/// The GPU actor task: owns the engine and its loop.
pub struct GpuActor {
    engine: Box<dyn GpuEngine>,
    rx: Receiver<GpuMsg>,
}

impl GpuActor {
    fn run(mut self) {
        while let Ok(msg) = self.rx.recv() {
            match msg {
                GpuMsg::RunRows { job, respond_to } => {
                    // SAFETY: see `GpuJobPtr`: the sender is blocked until we reply or drop this.
                    let job: &GpuJob<'_> = unsafe { &*job.0 };
                    let engine = &mut self.engine;
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        // SAFETY: `y`/`y_len` come from a live `&mut [f32]` the planner lent to
                        // this arm alone (the CPU arm writes a disjoint slice).
                        let y = unsafe { std::slice::from_raw_parts_mut(job.y, job.y_len) };
                        engine.gemv_rows(&job.w, job.x, job.rows.clone(), y, job.form)
                    }))
                    .unwrap_or_else(|p| {
                        Err(ExecError::Panicked {
                            actor: "gpu",
                            message: panic_text(p.as_ref()),
                        })
                    });
                    // The planner waits for this; it is gone only if it is unwinding itself.
                    let _ = respond_to.send(result);
                }
                GpuMsg::HasKernel {
                    format,
                    form,
                    respond_to,
                } => {
                    let _ = respond_to.send(self.engine.has_kernel(format, form));
                }
            }
        }
    }
}

/// Text of a panic payload.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Joins the actor thread when the last handle goes.
struct GpuInner {
    tx: Option<Sender<GpuMsg>>,
    thread: Option<JoinHandle<()>>,
    label: String,
}

impl Drop for GpuInner {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Cloneable handle to the GPU actor.
#[derive(Clone)]
pub struct GpuHandle {
    inner: Arc<GpuInner>,
}

impl std::fmt::Debug for GpuHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuHandle")
            .field("engine", &self.inner.label)
            .finish()
    }
}

/// Waits for the actor's reply on drop, so the borrowed job outlives the actor's use of it
/// even if the overlapped work unwinds. Private: callers cannot leak it.
struct ReplyGuard {
    rx: Option<Receiver<Result<ArmTime, ExecError>>>,
}

impl ReplyGuard {
    fn wait(&mut self) -> Result<ArmTime, ExecError> {
        match self.rx.take() {
            Some(rx) => rx
                .recv()
                .unwrap_or(Err(ExecError::ActorStopped { actor: "gpu" })),
            None => Err(ExecError::ActorStopped { actor: "gpu" }),
        }
    }
}

impl Drop for ReplyGuard {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            let _ = rx.recv();
        }
    }
}

impl GpuHandle {
    /// Start the actor thread that owns `engine`.
    pub fn spawn(engine: Box<dyn GpuEngine>) -> Result<GpuHandle, ExecError> {
        let label = engine.label();
        // bounded(1): the planner has at most one arm in flight per step.
        let (tx, rx) = bounded(1);
        let actor = GpuActor { engine, rx };
        let thread = std::thread::Builder::new()
            .name("hipfire-gpu".into())
            .spawn(move || actor.run())
            .map_err(|source| ExecError::Spawn {
                worker: usize::MAX,
                source,
            })?;
        Ok(GpuHandle {
            inner: Arc::new(GpuInner {
                tx: Some(tx),
                thread: Some(thread),
                label,
            }),
        })
    }

    /// The engine's label.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    fn sender(&self) -> Result<&Sender<GpuMsg>, ExecError> {
        self.inner
            .tx
            .as_ref()
            .ok_or(ExecError::ActorStopped { actor: "gpu" })
    }

    /// Whether the engine has a kernel for `format` in `form`.
    pub fn has_kernel(&self, format: Format, form: Form) -> Result<bool, ExecError> {
        let (tx, rx) = bounded(1);
        self.sender()?
            .send(GpuMsg::HasKernel {
                format,
                form,
                respond_to: tx,
            })
            .map_err(|_| ExecError::ActorStopped { actor: "gpu" })?;
        rx.recv()
            .map_err(|_| ExecError::ActorStopped { actor: "gpu" })
    }

    /// Run rows `rows` of `w·x` into `y_rows` on the GPU, blocking.
    pub fn run_rows(
        &self,
        w: &WeightView<'_>,
        x: &[f32],
        rows: Range<usize>,
        y_rows: &mut [f32],
        form: Form,
    ) -> Result<ArmTime, ExecError> {
        self.run_rows_while(w, x, rows, y_rows, form, || ()).1
    }

    /// Start the GPU arm, run `overlap` on this thread meanwhile, then wait for the arm.
    /// Returns `overlap`'s value and the arm's result; the arm is always waited for.
    pub fn run_rows_while<R>(
        &self,
        w: &WeightView<'_>,
        x: &[f32],
        rows: Range<usize>,
        y_rows: &mut [f32],
        form: Form,
        overlap: impl FnOnce() -> R,
    ) -> (R, Result<ArmTime, ExecError>) {
        if y_rows.len() != rows.len() {
            let e = ExecError::Shape {
                what: "gpu arm output rows",
                need: rows.len(),
                got: y_rows.len(),
            };
            return (overlap(), Err(e));
        }
        let job = GpuJob {
            w: *w,
            x,
            rows,
            y: y_rows.as_mut_ptr(),
            y_len: y_rows.len(),
            form,
        };
        let short: *const GpuJob<'_> = &job;
        // SAFETY: lifetime-only cast of a thin pointer; the guard below keeps this frame (and
        // `job`, `x`, `w`, `y_rows`) alive until the actor has replied or dropped the message.
        let erased = short.cast::<GpuJob<'static>>();
        let (tx, rx) = bounded(1);
        let sent = match self.sender() {
            Ok(s) => s
                .send(GpuMsg::RunRows {
                    job: GpuJobPtr(erased),
                    respond_to: tx,
                })
                .is_ok(),
            Err(_) => false,
        };
        if !sent {
            return (overlap(), Err(ExecError::ActorStopped { actor: "gpu" }));
        }
        let mut guard = ReplyGuard { rx: Some(rx) };
        let r = overlap();
        let arm = guard.wait();
        (r, arm)
    }
}

/// A GPU stand-in that runs on the CPU: the scalar reference row dot on the actor's thread,
/// optionally slowed to a given rate, timed with a clock (it has no events). It follows the
/// [`GpuEngine`] contract exactly, so the planner's split, joins and scheduler feedback run
/// end to end in CI; its numerics are the scalar path's, so like a real GPU it may differ from
/// the CPU pool by rounding. A test stand-in: only in builds with the `testing` feature (or
/// this crate's own unit tests).
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone)]
pub struct SimulatedGpu {
    /// Pretend link rate in bytes per ns (GB/s); `None` = as fast as the scalar dot goes.
    pub rate_gbps: Option<f64>,
    /// Formats with a residual kernel (to exercise the refusal rule).
    pub residual_kernels: Vec<Format>,
}

#[cfg(any(test, feature = "testing"))]
impl SimulatedGpu {
    /// Every format, both forms, no rate limit.
    pub fn new() -> SimulatedGpu {
        SimulatedGpu {
            rate_gbps: None,
            residual_kernels: Format::ALL.to_vec(),
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl Default for SimulatedGpu {
    fn default() -> Self {
        SimulatedGpu::new()
    }
}

#[cfg(any(test, feature = "testing"))]
impl GpuEngine for SimulatedGpu {
    fn label(&self) -> String {
        "simulated gpu (scalar cpu reference)".into()
    }

    fn has_kernel(&self, format: Format, form: Form) -> bool {
        match form {
            Form::Plain => true,
            Form::Residual => self.residual_kernels.contains(&format),
        }
    }

    fn gemv_rows(
        &mut self,
        w: &WeightView<'_>,
        x: &[f32],
        rows: Range<usize>,
        y_rows: &mut [f32],
        form: Form,
    ) -> Result<ArmTime, ExecError> {
        let t0 = Instant::now();
        let rb = w.format.row_bytes(w.k)?;
        let need = rows.end * w.row_stride;
        if w.row_stride != rb || w.host.len() < need || rows.len() != y_rows.len() {
            return Err(ExecError::Shape {
                what: "simulated gpu weight/rows",
                need,
                got: w.host.len(),
            });
        }
        let act = hipfire_quant::ActivationBuf::prepare(w.format, x)?;
        let bytes = &w.host[rows.start * rb..rows.end * rb];
        hipfire_quant::gemv_rows_scalar(
            w.format,
            bytes,
            w.k,
            &act,
            y_rows,
            form == Form::Residual,
        )?;
        if let Some(rate) = self.rate_gbps.filter(|r| *r > 0.0) {
            let want = Duration::from_nanos((bytes.len() as f64 / rate) as u64);
            let spent = t0.elapsed();
            if want > spent {
                std::thread::sleep(want - spent);
            }
        }
        Ok(ArmTime::Exact {
            ns: t0.elapsed().as_nanos() as f64,
        })
    }
}
