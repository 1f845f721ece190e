//! hipfire-exec: the dual-engine executor.
//!
//! # Layout
//! - [`pool`] — the CPU engine: pinned worker actors ([`CpuPool`] handle, `CpuWorker` task)
//!   that multiply row ranges of any format through hipfire-quant's row dot.
//! - [`bench`] — CPU GEMV and plain-read bandwidth on the same pinned workers (serde results
//!   for `hipfire offload-bench` and the criterion bench).
//! - [`share`] — the share scheduler: a pure state machine (no threads, no clocks) fed arm
//!   timings, and the row cut [`share::plan_rows`].
//! - [`refusal`] — the rules that keep a step off the split (it then runs whole on the CPU).
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
mod kernel;
pub mod pool;
pub mod refusal;
pub mod share;
pub mod topology;

pub use error::ExecError;
pub use kernel::ActivationBuf;
pub use pool::{CpuPool, PoolConfig};
