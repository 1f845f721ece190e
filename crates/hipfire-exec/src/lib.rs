//! hipfire-exec: the dual-engine executor.
//!
//! # Layout
//! - [`pool`] — the CPU engine: pinned worker actors ([`CpuPool`] handle, `CpuWorker` task)
//!   that multiply row ranges of any format through hipfire-quant's row dot.
//! - [`bench`](mod@bench) — CPU GEMV and plain-read bandwidth on the same pinned workers
//!   (serde results for `hipfire offload-bench` and the criterion bench).
//! - [`share`] — the share scheduler: a pure state machine (no threads, no clocks) fed arm
//!   timings, and the row cut [`share::plan_rows`].
//! - [`refusal`] — the rules that keep a step off the split (it then runs whole on the CPU).
//! - [`step`] — what the model hands over: `Step::Gemv` / `Step::GemvResidual`, the
//!   `OffloadExec` mode, weight residency.
//! - [`gpu`] — the `GpuEngine` trait, its actor (`GpuActor` / `GpuHandle`) and a CPU-backed
//!   `SimulatedGpu` stand-in.
//! - [`join`] — join strategies behind a trait, selected by `JoinKind`.
//! - [`flags`] — the CPU half of the `flags` join: host-visible mailbox layout and a pool job
//!   that waits on the device's sequence word (device kernels not written yet).
//! - [`planner`] — the planner actor (`Planner` / `PlannerHandle`): route, refuse, schedule,
//!   cut, run, feed back, trace.
//! - [`trace`] — the `hipfire::cpu_exec` trace lines.
//! - [`mapped_gpu`] — `MappedGpuEngine`: a real GPU (hipfire-gpu) behind `GpuEngine` for
//!   host-operand steps, so the actor path runs on the device unchanged.
//! - [`offload`] — spilled steps whose activation and output live on the device (the decode
//!   path's executor over hipfire-gpu: pcie / cpu / passback with ordering and two-stream joins),
//!   built on the same pool, scheduler and refusal rules.
//! - [`topology`] — one logical CPU per physical core.
//!
//! # The one design decision
//! Engines only execute; they never schedule. The planner asks the scheduler for a share,
//! cuts rows, sends each engine its range, and feeds the measured times back. So the
//! scheduler is testable with a simulated host, and an engine can be swapped (or a second GPU
//! added) without touching the policy.
//!
//! # Errors
//! One crate error, [`ExecError`]: callers treat every executor failure alike (stop the step,
//! report), so one enum with the offending values is enough; worker panics are caught and
//! returned as [`ExecError::WorkerPanicked`], never hung on.
#![deny(missing_docs)]

pub mod bench;
pub mod error;
pub mod flags;
pub mod gpu;
pub mod join;
mod kernel;
pub mod mapped_gpu;
pub mod offload;
pub mod planner;
pub mod pool;
pub mod refusal;
pub mod share;
pub mod step;
pub mod topology;
pub mod trace;

pub use error::ExecError;
pub use gpu::{GpuEngine, GpuHandle, SimulatedGpu};
pub use join::{JoinKind, JoinStrategy};
pub use kernel::ActivationBuf;
pub use planner::{PlannerConfig, PlannerHandle, Route, StepReport};
pub use pool::{CpuPool, GemvSegment, PoolConfig};
pub use refusal::Refusal;
pub use share::{ShareController, ShareSetting};
pub use step::{OffloadExec, Residency, Step, WeightView};
