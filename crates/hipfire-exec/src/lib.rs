//! hipfire-exec: the dual-engine executor.
//!
//! # Layout
//! The decode path (what `hipfire run` uses on a GPU), in the order a spilled step meets it:
//! - [`offload`] — the planner, `OffloadExecutor`: routes each spilled step (its activation and
//!   output on the device) as `pcie`, `cpu` or `passback` (rows split between the engines),
//!   refuses ([`refusal`]), probes and asks [`share`] for the cut, hands the split to the join,
//!   and feeds the arm timings back. Its files: `offload/mod.rs` (routing, probe, whole-CPU
//!   steps), `arm_timer.rs` (the event ring and pending splits, [`offload::ArmAccount`]),
//!   `fusion.rs` (q/k/v and gate/up as one split, `run_shared`), `trace.rs` (the
//!   `hipfire::cpu_exec` trace).
//! - [`join`] — [`join::JoinStrategy`] and the joins behind one trait, a file each: `ordering`
//!   and `two-stream` (host-staged CPU arm on the calling thread) and `flags` (the default: no
//!   host synchronisation inside the step; its device half is `kernels/flags.cu`, launched by
//!   `hipfire_gpu::FlagsKernels`).
//! - [`flags`] — the host half of the `flags` join: the mailbox layout and memory, the pool job
//!   whose workers wait on the device's words, prepare x (alone or together), multiply their
//!   chunks and publish per-chunk done words, and the join's knobs ([`flags::FlagsTuning`]).
//! - [`engine`] — the GPU engine, [`GpuEngine`]: queue one projection's row range (one or
//!   several activation columns) on a stream; hipfire-gpu's `GemvKernels` implements it on CUDA
//!   and HIP alike.
//! - [`pool`] — the CPU engine: pinned worker actors ([`CpuPool`] handle, `CpuWorker` task) that
//!   multiply row ranges of any format through hipfire-quant's row dot; also the CPU decode's
//!   batched (`gemv_batch`) and multi-token (`gemv_tokens`) calls.
//! - [`share`] — the share scheduler: a pure state machine (no threads, no clocks) fed arm
//!   timings, and the N-way row cut [`share::cut_rows`].
//! - [`refusal`] — the rules that keep a step off the split (it then runs whole on the CPU).
//! - [`topology`] — one logical CPU per physical core.
//! - [`bench`](mod@bench) — CPU GEMV and plain-read bandwidth on the same pinned workers
//!   (serde results for `hipfire offload-bench` and the criterion bench).
//!
//! # The one design decision
//! Engines only execute; they never schedule. The planner (`OffloadExecutor`) asks the
//! scheduler for a share, cuts rows, hands each engine its range through the join, and feeds
//! the measured times back. So the scheduler is testable with a simulated host, and an engine
//! or a join can be swapped without touching the policy. A split has two arms, one GPU (one
//! device) and the CPU: more GPUs would need a planner that cuts rows more ways, which this one
//! does not. On the decode path the thread that owns the CUDA stream enqueues the GPU arm itself
//! (an actor hop per step would cost a thread wake-up); see docs/design.md.
//!
//! # Features
//! - `experiments`: knobs still under measurement (`FlagsTuning::publish_blocks`), off in the
//!   product, whose path then runs the measured default with no runtime branch.
//!
//! # Errors
//! One crate error, [`ExecError`]: callers treat every executor failure alike (stop the step,
//! report), so one enum with the offending values is enough; worker panics are caught and
//! returned as [`ExecError::WorkerPanicked`], never hung on.
#![deny(missing_docs)]

pub mod bench;
pub mod engine;
pub mod error;
pub mod flags;
pub mod join;
mod kernel;
pub mod offload;
pub mod pool;
pub mod refusal;
pub mod share;
pub mod topology;

pub use engine::GpuEngine;
pub use error::ExecError;
pub use join::JoinStrategy;
pub use kernel::ActivationBuf;
pub use offload::{OffloadExecutor, OffloadMode, SpilledBatch, SpilledStep};
pub use pool::{CpuPool, GemvSegment, PoolConfig};
pub use refusal::Refusal;
pub use share::{ShareController, ShareSetting};
