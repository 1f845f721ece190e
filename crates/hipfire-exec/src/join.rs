//! Join strategies: how a split step's two arms are started and brought back together.
//!
//! Chosen by value ([`JoinKind`], from config or a CLI flag) so runs can A/B them. Each is a
//! [`JoinStrategy`]; the planner calls [`JoinStrategy::run_split`] with the step and the cut.
//!
//! - `ordering` (the reference system's): activation to the host → GPU arm started → CPU arm →
//!   the join is the wait for the GPU arm (on a device: the blocking copy of the CPU rows on the
//!   same stream, ordered after the GPU arm).
//! - `two-stream`: the CPU rows go up on a copy stream and the compute stream waits on its
//!   event; the host never waits for the GPU arm.
//! - `flags`: no host synchronisation at all; the device publishes `x` and a sequence word in
//!   host-mapped memory and waits for the workers' done word.
//!
//! With host-resident operands (the steps this crate runs today, see [`crate::step::Step`])
//! there is nothing to copy: both arms write the caller's output directly, and every strategy
//! must wait for the GPU arm before the step returns. `two-stream` and `flags` only differ
//! from `ordering` once x/y live on the device, which needs a device-operand GPU engine; until
//! one exists the planner refuses to start with them ([`JoinKind::needs_device_operands`]).
//! All three exist with device operands in [`crate::offload`] (the path the GPU decoder uses):
//! `flags` there is [`crate::flags`] (mailbox, workers spinning on the device's sequence word)
//! plus `kernels/flags.cu`.

use crate::error::ExecError;
use crate::gpu::GpuHandle;
use crate::kernel::ActivationBuf;
use crate::pool::CpuPool;
use crate::share::ArmTime;
use crate::step::Step;
use std::time::Instant;

/// Which join strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum JoinKind {
    /// Stream-ordered blocking copy is the join (reference system).
    Ordering,
    /// Copy stream + event wait; the host never waits for the GPU arm.
    TwoStream,
    /// Host-mapped sequence/done words; no host synchronisation.
    Flags,
}

impl JoinKind {
    /// Parse `ordering` | `two-stream` | `flags`.
    pub fn parse(s: &str) -> Result<JoinKind, ExecError> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "ordering" => Ok(JoinKind::Ordering),
            "two-stream" => Ok(JoinKind::TwoStream),
            "flags" => Ok(JoinKind::Flags),
            other => Err(ExecError::Invalid {
                what: "join strategy",
                value: other.to_string(),
                rule: "one of ordering, two-stream, flags",
            }),
        }
    }

    /// Name as written in config.
    pub fn name(self) -> &'static str {
        match self {
            JoinKind::Ordering => "ordering",
            JoinKind::TwoStream => "two-stream",
            JoinKind::Flags => "flags",
        }
    }

    /// True iff the strategy only exists for device-resident operands.
    pub fn needs_device_operands(self) -> bool {
        !matches!(self, JoinKind::Ordering)
    }

    /// The strategy object.
    pub fn strategy(self) -> Result<Box<dyn JoinStrategy>, ExecError> {
        match self {
            JoinKind::Ordering => Ok(Box::new(OrderingJoin)),
            JoinKind::TwoStream | JoinKind::Flags => Err(ExecError::Invalid {
                what: "join strategy",
                value: self.name().to_string(),
                rule: "needs a device-operand GPU engine (not built yet); use ordering",
            }),
        }
    }
}

/// The measured pieces of one split step.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SplitTimes {
    /// Activation to the host and prepared for the CPU row dot (ns).
    pub d2h_ns: f64,
    /// CPU arm multiply (ns).
    pub cpu_ns: f64,
    /// The GPU arm's own time.
    pub gpu: ArmTime,
    /// Host time from the end of the CPU arm to the step's end: the join's cost (ns).
    pub join_ns: f64,
    /// Whole step wall (ns).
    pub wall_ns: f64,
}

/// A way to run both arms of a split step.
pub trait JoinStrategy: Send + Sync + std::fmt::Debug {
    /// Which one.
    fn kind(&self) -> JoinKind;

    /// GPU rows `[0, g)`, CPU rows `[g, m)` of `step`; returns when the output is complete.
    fn run_split(
        &self,
        gpu: &GpuHandle,
        pool: &CpuPool,
        step: &mut Step<'_>,
        g: usize,
    ) -> Result<SplitTimes, ExecError>;
}

/// The reference system's strategy (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct OrderingJoin;

impl JoinStrategy for OrderingJoin {
    fn kind(&self) -> JoinKind {
        JoinKind::Ordering
    }

    fn run_split(
        &self,
        gpu: &GpuHandle,
        pool: &CpuPool,
        step: &mut Step<'_>,
        g: usize,
    ) -> Result<SplitTimes, ExecError> {
        let form = step.form();
        let (w, x, y, accumulate) = step.operands();
        let w = *w;
        let m = w.m;
        if y.len() < m || g == 0 || g >= m {
            return Err(ExecError::Shape {
                what: "split output",
                need: m,
                got: y.len(),
            });
        }
        let t0 = Instant::now();
        // Everything blocking on the host side first (the activation), before the GPU arm runs.
        let act = ActivationBuf::prepare(w.format, x)?;
        let t_prep = Instant::now();
        let (gpu_y, cpu_y) = y[..m].split_at_mut(g);
        let mut t_cpu_end = t_prep;
        let (cpu, arm) = gpu.run_rows_while(&w, x, 0..g, gpu_y, form, || {
            let r = pool.gemv_prepared(w.format, w.host, w.k, &act, g, cpu_y, accumulate);
            t_cpu_end = Instant::now();
            r
        });
        let t_end = Instant::now();
        cpu?;
        let gpu_time = arm?;
        Ok(SplitTimes {
            d2h_ns: (t_prep - t0).as_nanos() as f64,
            cpu_ns: (t_cpu_end - t_prep).as_nanos() as f64,
            gpu: gpu_time,
            join_ns: (t_end - t_cpu_end).as_nanos() as f64,
            wall_ns: (t_end - t0).as_nanos() as f64,
        })
    }
}
