//! The planner actor: receives steps, decides where each runs, runs it, learns from it.
//!
//! Per step: resident weights go to the GPU; spilled ones follow the mode — `pcie` to the GPU,
//! `cpu` whole to the CPU pool, `passback` through the refusal rules, the share scheduler and
//! the row cut to both engines via the join strategy, whose arm times feed the scheduler back.
//! A refused passback step runs whole on the CPU and the trace names the rule.
//!
//! [`Planner`] (task) owns the scheduler, the trace and handles to the engines; [`PlannerHandle`]
//! (cloneable) sends a step and blocks until it is done. The step borrows the caller's data:
//! like the pool, the handle erases the borrow's lifetime for the trip and does not return
//! before the planner has answered or dropped the message.

use crate::error::ExecError;
use crate::gpu::GpuHandle;
use crate::join::{JoinKind, JoinStrategy, SplitTimes};
use crate::kernel::ActivationBuf;
use crate::pool::CpuPool;
use crate::refusal::{Refusal, SplitCheck};
use crate::share::{
    plan_rows, ArmSample, ArmTime, Form, ShapeKey, ShapeSnapshot, ShareController, ShareSetting,
    CPU_ENGINE,
};
use crate::step::{OffloadExec, Residency, Step};
use crate::trace::{Trace, TraceKey, TRACE_TARGET};
use crossbeam_channel::{bounded, Receiver, Sender};
use hipfire_quant::{Format, SimdTier};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Repetitions per engine of the seeding probe; the median is used (reference system: 3).
pub const PROBE_REPS: usize = 3;

/// Index of the (single, today) GPU among the scheduler's engines.
const GPU_ENGINE: usize = 1;

/// How the planner runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannerConfig {
    /// `memory.offload_exec`.
    pub mode: OffloadExec,
    /// `memory.offload_passback_share`.
    pub share: ShareSetting,
    /// Join strategy for split steps.
    pub join: JoinKind,
    /// Produce the `hipfire::cpu_exec` trace.
    pub trace: bool,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            mode: OffloadExec::Cpu,
            share: ShareSetting::Auto,
            join: JoinKind::Ordering,
            trace: crate::trace::trace_from_env(),
        }
    }
}

/// Where a step ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Route {
    /// Whole on the GPU (resident weight, or `pcie`).
    Gpu,
    /// Whole on the CPU pool (`cpu`, share 0, or a refusal).
    Cpu,
    /// GPU rows `[0, g)`, CPU rows `[g, m)`.
    Split {
        /// First CPU row.
        g: usize,
    },
}

/// What happened to one step.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// Where it ran.
    pub route: Route,
    /// Why a passback step did not split (`None` when it did, or in other modes).
    pub refusal: Option<Refusal>,
    /// Split times (split steps only).
    pub split: Option<SplitTimes>,
    /// Wall time of the step inside the planner (ns).
    pub wall_ns: f64,
    /// Trace lines this step produced (empty unless the trace is on).
    pub trace: Vec<String>,
}

/// A step with its borrow erased for the trip to the planner.
struct StepPtr(*mut Step<'static>);

// SAFETY: the planner only dereferences it while the sender is blocked in `PlannerHandle::run`
// waiting for the reply (or for the message to be dropped); `Step` holds plain slices.
unsafe impl Send for StepPtr {}

enum PlannerMsg {
    Run {
        step: StepPtr,
        respond_to: Sender<Result<StepReport, ExecError>>,
    },
    Snapshot {
        key: ShapeKey,
        respond_to: Sender<Option<ShapeSnapshot>>,
    },
}

/// The planner task.
pub struct Planner {
    config: PlannerConfig,
    pool: CpuPool,
    gpu: Option<GpuHandle>,
    join: Box<dyn JoinStrategy>,
    ctl: ShareController,
    trace: Trace,
    /// `has_kernel` answers, cached (they do not change for an engine's lifetime).
    kernels: HashMap<(Format, Form), bool>,
    rx: Receiver<PlannerMsg>,
}

impl Planner {
    fn run(mut self) {
        while let Ok(msg) = self.rx.recv() {
            match msg {
                PlannerMsg::Run { step, respond_to } => {
                    // SAFETY: see `StepPtr`: the sender is blocked until we reply or drop this.
                    let step: &mut Step<'_> = unsafe { &mut *step.0 };
                    let result = catch_unwind(AssertUnwindSafe(|| self.execute(step)))
                        .unwrap_or_else(|p| {
                            Err(ExecError::Panicked {
                                actor: "planner",
                                message: crate::gpu::panic_text(p.as_ref()),
                            })
                        });
                    let _ = respond_to.send(result);
                }
                PlannerMsg::Snapshot { key, respond_to } => {
                    let _ = respond_to.send(self.ctl.snapshot(&key));
                }
            }
        }
    }

    fn gpu(&self) -> Result<&GpuHandle, ExecError> {
        self.gpu.as_ref().ok_or(ExecError::Gpu(
            "this step needs a GPU engine and none is attached".into(),
        ))
    }

    fn has_kernel(&mut self, format: Format, form: Form) -> Result<bool, ExecError> {
        if let Some(v) = self.kernels.get(&(format, form)) {
            return Ok(*v);
        }
        let v = self.gpu()?.has_kernel(format, form)?;
        self.kernels.insert((format, form), v);
        Ok(v)
    }

    fn execute(&mut self, step: &mut Step<'_>) -> Result<StepReport, ExecError> {
        let t0 = Instant::now();
        let w = *step.weight();
        let form = step.form();
        // Validate the operands once, before any engine touches them.
        let (x_len, out_len) = match step {
            Step::Gemv { x, y, .. } => (x.len(), y.len()),
            Step::GemvResidual { x, residual, .. } => (x.len(), residual.len()),
        };
        if x_len != w.k {
            return Err(ExecError::Shape {
                what: "x",
                need: w.k,
                got: x_len,
            });
        }
        if out_len < w.m {
            return Err(ExecError::Shape {
                what: "output",
                need: w.m,
                got: out_len,
            });
        }
        let tkey = TraceKey {
            format: w.format,
            m: w.m,
            k: w.k,
            form,
        };
        if w.residency == Residency::Resident || self.config.mode == OffloadExec::Pcie {
            self.whole_gpu(step)?;
            return Ok(StepReport {
                route: Route::Gpu,
                refusal: None,
                split: None,
                wall_ns: ns_since(t0),
                trace: Vec::new(),
            });
        }
        if self.config.mode == OffloadExec::Cpu || matches!(self.ctl.setting(), ShareSetting::Off) {
            return self.whole_cpu(step, t0, tkey, None);
        }
        // Passback.
        let check = SplitCheck {
            format: w.format,
            k: w.k,
            m: w.m,
            row_stride: w.row_stride,
            weight_len: w.host.len(),
            out_dtype: step.out_dtype(),
            out_len: step_out_len(step),
            residual: form == Form::Residual,
            cpu_simd: w.format.has_cpu_simd() && hipfire_quant::simd_tier() != SimdTier::Scalar,
            gpu_kernel: self.has_kernel(w.format, Form::Plain)?,
            gpu_residual_kernel: self.has_kernel(w.format, Form::Residual)?,
        };
        let row_bytes = match check.check() {
            Ok(rb) => rb,
            Err(refusal) => return self.whole_cpu(step, t0, tkey, Some(refusal)),
        };
        let key = ShapeKey {
            format: w.format,
            k: w.k,
            form,
        };
        if self.ctl.needs_probe(&key) {
            let probe = self.probe(step, row_bytes);
            self.ctl.seed(key, probe.as_deref());
        }
        let share = self.ctl.gpu_share(&key);
        let Some(g) = plan_rows(w.m, row_bytes, share) else {
            return self.whole_cpu(step, t0, tkey, None);
        };
        let gpu = self.gpu()?.clone();
        let times = self.join.run_split(&gpu, &self.pool, step, g)?;
        self.ctl.observe(
            key,
            &[
                ArmSample {
                    engine: CPU_ENGINE,
                    bytes: ((w.m - g) * row_bytes) as u64,
                    time: ArmTime::Exact { ns: times.cpu_ns },
                },
                ArmSample {
                    engine: GPU_ENGINE,
                    bytes: (g * row_bytes) as u64,
                    time: times.gpu,
                },
            ],
        );
        let snap = self.ctl.snapshot(&key);
        let trace = self.trace.split(tkey, g, row_bytes, &times, snap.as_ref());
        emit(&trace, &tkey, g, &times, snap.as_ref());
        Ok(StepReport {
            route: Route::Split { g },
            refusal: None,
            split: Some(times),
            wall_ns: ns_since(t0),
            trace,
        })
    }

    /// Both engines alone over the step's own weight, `PROBE_REPS` times each, into scratch
    /// outputs (a residual probe accumulates into scratch, never into the step's output).
    /// `None` (a failed probe) if either engine fails or the GPU cannot time its arm exactly.
    fn probe(&mut self, step: &mut Step<'_>, row_bytes: usize) -> Option<Vec<ArmSample>> {
        let form = step.form();
        let (w, x, _, accumulate) = step.operands();
        let w = *w;
        let gpu = self.gpu.as_ref()?;
        let bytes = (w.m * row_bytes) as u64;
        let mut scratch = vec![0.0f32; w.m];
        let mut cpu = Vec::with_capacity(PROBE_REPS);
        let mut gpu_t = Vec::with_capacity(PROBE_REPS);
        for _ in 0..PROBE_REPS {
            let act = ActivationBuf::prepare(w.format, x).ok()?;
            let t_mul = Instant::now();
            self.pool
                .gemv_prepared(w.format, w.host, w.k, &act, 0, &mut scratch, accumulate)
                .ok()?;
            cpu.push(ns_since(t_mul));
            match gpu.run_rows(&w, x, 0..w.m, &mut scratch, form) {
                Ok(ArmTime::Exact { ns }) => gpu_t.push(ns),
                _ => return None,
            }
        }
        Some(vec![
            ArmSample {
                engine: CPU_ENGINE,
                bytes,
                time: ArmTime::Exact {
                    ns: median(&mut cpu),
                },
            },
            ArmSample {
                engine: GPU_ENGINE,
                bytes,
                time: ArmTime::Exact {
                    ns: median(&mut gpu_t),
                },
            },
        ])
    }

    fn whole_gpu(&mut self, step: &mut Step<'_>) -> Result<(), ExecError> {
        let form = step.form();
        let (w, x, y, _) = step.operands();
        let w = *w;
        if y.len() < w.m {
            return Err(ExecError::Shape {
                what: "output",
                need: w.m,
                got: y.len(),
            });
        }
        self.gpu()?.run_rows(&w, x, 0..w.m, &mut y[..w.m], form)?;
        Ok(())
    }

    fn whole_cpu(
        &mut self,
        step: &mut Step<'_>,
        t0: Instant,
        tkey: TraceKey,
        why: Option<Refusal>,
    ) -> Result<StepReport, ExecError> {
        let (w, x, y, accumulate) = step.operands();
        let w = *w;
        if y.len() < w.m {
            return Err(ExecError::Shape {
                what: "output",
                need: w.m,
                got: y.len(),
            });
        }
        if x.len() != w.k {
            return Err(ExecError::Shape {
                what: "x",
                need: w.k,
                got: x.len(),
            });
        }
        let t_prep = Instant::now();
        let act = ActivationBuf::prepare(w.format, x)?;
        let t_mul = Instant::now();
        self.pool.gemv_strided(
            w.format,
            w.host,
            w.k,
            w.row_stride,
            &act,
            0,
            &mut y[..w.m],
            accumulate,
        )?;
        let cpu_ns = ns_since(t_mul);
        let d2h_ns = (t_mul - t_prep).as_nanos() as f64;
        let trace = self.trace.whole_cpu(tkey, d2h_ns, cpu_ns, why.as_ref());
        for line in &trace {
            tracing::info!(target: TRACE_TARGET, format = %tkey.format, k = tkey.k, m = tkey.m, cpu_us = cpu_ns / 1e3, "{line}");
        }
        Ok(StepReport {
            route: Route::Cpu,
            refusal: why,
            split: None,
            wall_ns: ns_since(t0),
            trace,
        })
    }
}

fn emit(lines: &[String], key: &TraceKey, g: usize, t: &SplitTimes, st: Option<&ShapeSnapshot>) {
    let gpu_us = match t.gpu {
        ArmTime::Exact { ns } | ArmTime::FinishedBy { ns } => ns / 1e3,
    };
    let state = st.map(|s| format!("{:?}", s.phase)).unwrap_or_default();
    for line in lines {
        tracing::info!(target: TRACE_TARGET, format = %key.format, k = key.k, g, m = key.m, gpu_us, cpu_us = t.cpu_ns / 1e3, state = %state, "{line}");
    }
}

fn step_out_len(step: &Step<'_>) -> usize {
    match step {
        Step::Gemv { y, .. } => y.len(),
        Step::GemvResidual { residual, .. } => residual.len(),
    }
}

fn ns_since(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Joins the planner thread when the last handle goes.
struct PlannerInner {
    tx: Option<Sender<PlannerMsg>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for PlannerInner {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Cloneable handle to the planner: `run(step)` is the executor's one entry point.
#[derive(Clone)]
pub struct PlannerHandle {
    inner: Arc<PlannerInner>,
}

impl std::fmt::Debug for PlannerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannerHandle").finish_non_exhaustive()
    }
}

impl PlannerHandle {
    /// Start the planner over `pool` and, if any, a GPU engine. `pcie` and `passback` need a
    /// GPU; `two-stream` and `flags` need a device-operand engine (refused for now, see
    /// [`crate::join`]).
    pub fn spawn(
        config: PlannerConfig,
        pool: CpuPool,
        gpu: Option<GpuHandle>,
    ) -> Result<PlannerHandle, ExecError> {
        if gpu.is_none() && config.mode != OffloadExec::Cpu {
            return Err(ExecError::Invalid {
                what: "memory.offload_exec",
                value: config.mode.name().to_string(),
                rule: "pcie and passback need a GPU engine; use cpu",
            });
        }
        let join = config.join.strategy()?;
        let n_gpus = usize::from(gpu.is_some());
        let (tx, rx) = bounded(1);
        let planner = Planner {
            config,
            pool,
            gpu,
            join,
            ctl: ShareController::new(config.share, n_gpus),
            trace: Trace::new(config.trace),
            kernels: HashMap::new(),
            rx,
        };
        let thread = std::thread::Builder::new()
            .name("hipfire-planner".into())
            .spawn(move || planner.run())
            .map_err(|source| ExecError::Spawn {
                worker: usize::MAX,
                source,
            })?;
        Ok(PlannerHandle {
            inner: Arc::new(PlannerInner {
                tx: Some(tx),
                thread: Some(thread),
            }),
        })
    }

    /// Run one step to completion (its output is written when this returns `Ok`).
    pub fn run(&self, mut step: Step<'_>) -> Result<StepReport, ExecError> {
        let ptr: *mut Step<'_> = &mut step;
        // SAFETY: lifetime-only cast of a thin pointer. We block below until the planner replies
        // (it has finished with the step) or the reply channel reports the planner gone (it
        // dropped the message, and the pointer, while unwinding), so `step` outlives every use.
        let ptr = ptr.cast::<Step<'static>>();
        let (tx, rx) = bounded(1);
        let sender = self
            .inner
            .tx
            .as_ref()
            .ok_or(ExecError::ActorStopped { actor: "planner" })?;
        sender
            .send(PlannerMsg::Run {
                step: StepPtr(ptr),
                respond_to: tx,
            })
            .map_err(|_| ExecError::ActorStopped { actor: "planner" })?;
        rx.recv()
            .unwrap_or(Err(ExecError::ActorStopped { actor: "planner" }))
    }

    /// The scheduler's state for `key` (for traces and tests).
    pub fn snapshot(&self, key: ShapeKey) -> Result<Option<ShapeSnapshot>, ExecError> {
        let (tx, rx) = bounded(1);
        let sender = self
            .inner
            .tx
            .as_ref()
            .ok_or(ExecError::ActorStopped { actor: "planner" })?;
        sender
            .send(PlannerMsg::Snapshot {
                key,
                respond_to: tx,
            })
            .map_err(|_| ExecError::ActorStopped { actor: "planner" })?;
        rx.recv()
            .map_err(|_| ExecError::ActorStopped { actor: "planner" })
    }
}
