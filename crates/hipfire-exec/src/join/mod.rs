//! Join strategies: how the CPU rows of a split step rejoin the GPU's, over device operands.
//!
//! The planner ([`crate::offload::OffloadExecutor`]) routes a spilled step, asks the share
//! controller for the cut and hands the step to its `Join`; the join sequences the two
//! engines and the copies, and leaves the step's arm timings with the arm timer. Choosing a
//! strategy is constructing another `Join` (`build`); a fourth strategy is one new file
//! here plus its [`JoinStrategy`] spelling.
//!
//! - [`ordering`]: blocking D2H of x, GPU arm async, CPU arm, the H2D of the CPU rows on the
//!   same stream and a host wait (the reference system's join).
//! - [`two_stream`]: as `ordering`, but the CPU rows go up on a copy stream the compute stream
//!   waits on: the host never waits for the GPU arm.
//! - [`flags`]: no host synchronisation inside the step: x and the CPU rows pass through a
//!   host-mapped mailbox guarded by words the device writes and polls (the host half is
//!   [`crate::flags`], the device half `kernels/flags.cu`). It also fuses the projections that
//!   share an activation into one split (`Join::fused_cpu_rows`).

pub mod flags;
pub mod ordering;
pub mod two_stream;

use std::sync::Arc;
use std::time::Instant;

use crate::engine::GpuEngine;
use hipfire_gpu::{Activation, Context, RowRange, Stream};
use hipfire_quant::{ActivationBuf, Format};

use crate::flags::FlagsTuning;
use crate::offload::{f32s, f32s_mut, gpu_err, ArmAccount, PendingSplit, PlannerCore, SpilledStep};
use crate::share::{ArmSample, ArmTime, ShapeKey, CPU_ENGINE};
use crate::ExecError;

/// How the CPU rows of a split step rejoin the GPU's (`memory.join_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinStrategy {
    /// Blocking D2H of x, GPU arm async, CPU arm, then the H2D of the CPU rows on the same
    /// stream followed by a host wait (the reference system's join).
    Ordering,
    /// CPU rows go up on a copy stream; the compute stream waits on the copy's event; the host
    /// never waits for the GPU arm.
    TwoStream,
    /// x and the CPU rows pass through a host-mapped mailbox guarded by sequence words that
    /// the device writes and polls: no host synchronisation inside the step.
    Flags,
}

impl JoinStrategy {
    /// Parse `ordering` / `two-stream` / `flags`.
    pub fn parse(s: &str) -> Result<JoinStrategy, ExecError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ordering" => Ok(JoinStrategy::Ordering),
            "two-stream" | "two_stream" | "twostream" => Ok(JoinStrategy::TwoStream),
            "flags" => Ok(JoinStrategy::Flags),
            _ => Err(ExecError::Invalid {
                what: "memory.join_strategy",
                value: s.into(),
                rule: "ordering, two-stream or flags",
            }),
        }
    }

    /// Config spelling.
    pub fn name(self) -> &'static str {
        match self {
            JoinStrategy::Ordering => "ordering",
            JoinStrategy::TwoStream => "two-stream",
            JoinStrategy::Flags => "flags",
        }
    }

    /// Every strategy, in the order benches compare them.
    pub const ALL: [JoinStrategy; 3] = [
        JoinStrategy::Ordering,
        JoinStrategy::TwoStream,
        JoinStrategy::Flags,
    ];
}

/// The join for `strategy`, with what it owns on the device allocated for activations up to
/// `max_k` elements and calls that write up to `max_m` output rows.
pub(crate) fn build(
    strategy: JoinStrategy,
    ctx: &Arc<Context>,
    max_k: usize,
    max_m: usize,
) -> Result<Box<dyn Join>, ExecError> {
    Ok(match strategy {
        JoinStrategy::Ordering => Box::new(ordering::OrderingJoin),
        JoinStrategy::TwoStream => Box::new(two_stream::TwoStreamJoin::new(ctx)?),
        JoinStrategy::Flags => Box::new(flags::FlagsJoin::new(ctx, max_k, max_m)?),
    })
}

/// The planner's cut of one split step (or of a fused group of steps over one activation).
pub(crate) struct SplitPlan {
    /// The controller's key the arms' sample goes to.
    pub(crate) key: ShapeKey,
    /// The trace's key (format, summed rows, k, residual).
    pub(crate) stat_key: (Format, usize, usize, bool),
    /// Per output: (first CPU row `g`, row bytes); the GPU takes `[0, g)`.
    pub(crate) cuts: Vec<(usize, usize)>,
}

/// What the step's operands were prepared on: the stream the decode runs on, its GEMV kernels
/// and the device activation the GPU arm reads.
#[derive(Clone, Copy)]
pub(crate) struct DeviceArgs<'a> {
    pub(crate) stream: &'a Stream,
    pub(crate) kernels: &'a dyn GpuEngine,
    pub(crate) act: &'a Activation,
}

/// The host-side pieces of one split step, for the trace line (ns; see
/// [`crate::offload`]'s trace fields).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SplitTimes {
    pub(crate) d2h: f64,
    pub(crate) cpu: f64,
    pub(crate) join: f64,
}

/// One way to run both arms of a split step over device operands.
pub(crate) trait Join: Send {
    /// Run (or queue) the split of `steps` as `plan` cuts them: GPU rows `[0, g)` and CPU rows
    /// `[g, m)` of each. `steps` holds one step unless [`Join::fused_cpu_rows`] allowed a
    /// fused group. The arm timings go to `core`'s arm timer as a pending split.
    fn run_split(
        &mut self,
        core: &mut PlannerCore,
        dev: DeviceArgs<'_>,
        steps: &mut [SpilledStep<'_>],
        plan: SplitPlan,
        t0: Instant,
    ) -> Result<SplitTimes, ExecError>;

    /// CPU rows one fused split of several projections over one activation may hold; `None`:
    /// this join runs each projection as its own split.
    fn fused_cpu_rows(&self) -> Option<usize> {
        None
    }

    /// Whether the arm timer keeps a second event pair per slot for this join's timeline
    /// ([`crate::offload::OffloadExecutor::set_timeline`]).
    fn step_events(&self) -> bool {
        false
    }

    /// Record the timeline (see [`crate::offload::OffloadExecutor::set_timeline`]).
    fn set_timeline(&mut self, _on: bool) {}

    /// The flags arm's host-side knobs (other joins have none).
    fn set_flags_tuning(&mut self, _tuning: FlagsTuning) {}

    /// Fill in the account's join-specific fields once every pending step has resolved.
    fn close_account(&mut self, _account: &mut ArmAccount) {}

    /// Before the planner frees its memory: let the device and the workers let go of it.
    fn before_drop(&mut self, _core: &mut PlannerCore) {}
}

/// Steps 1–3 of a split whose CPU arm runs on the calling thread over host staging (`ordering`
/// and `two-stream`): x (and the CPU rows of a residual) down, blocking; the GPU arm queued
/// between its event pair; the CPU arm into the staging rows `[g, m)`. Then `rejoin` queues
/// the CPU rows' way back to the device (rows `[g, m)` of the staging), and the step is left
/// pending with the arm timer; returns the trace's times.
pub(crate) fn staged_split(
    core: &mut PlannerCore,
    dev: DeviceArgs<'_>,
    steps: &mut [SpilledStep<'_>],
    plan: &SplitPlan,
    rejoin: impl FnOnce(&mut PlannerCore, &mut SpilledStep<'_>, usize, usize) -> Result<(), ExecError>,
) -> Result<SplitTimes, ExecError> {
    // These joins never fuse ([`Join::fused_cpu_rows`]): one step per split.
    let [step] = steps else {
        return Err(ExecError::Shape {
            what: "split steps of a join that does not fuse",
            need: 1,
            got: steps.len(),
        });
    };
    let DeviceArgs {
        stream,
        kernels,
        act,
    } = dev;
    let w = step.weight;
    let (m, k) = (w.m(), w.k());
    let residual = plan.stat_key.3;
    let (g, row_bytes) = plan.cuts[0];

    // 1. x (and the CPU rows of the residual) down, blocking: the CPU arm needs them now.
    let d2h = core.fetch_cpu_inputs(stream, step, g)?;

    // 2. GPU arm, asynchronous, between an event pair.
    let slot = core.take_slot()?;
    let (gpu_start, gpu_end) = &core.timer.arm_events[slot];
    gpu_start.record(stream).map_err(gpu_err)?;
    kernels
        .enqueue_rows(stream, w, act, step.y, RowRange::new(0, g), step.form)
        .map_err(gpu_err)?;
    gpu_end.record(stream).map_err(gpu_err)?;

    // 3. CPU arm over rows [g, m) while the kernel runs.
    let t = Instant::now();
    let cpu_act = ActivationBuf::prepare(w.format(), f32s(&core.x_host, k))?;
    let y_cpu = &mut f32s_mut(&mut core.y_host, m)[g..m];
    core.pool.gemv_prepared(
        w.format(),
        step.host.bytes(),
        k,
        &cpu_act,
        g,
        y_cpu,
        residual,
    )?;
    let cpu = t.elapsed().as_nanos() as f64;

    // 4. Join.
    let t = Instant::now();
    rejoin(core, step, g, m)?;
    let join = t.elapsed().as_nanos() as f64;
    core.timer.pending.push_back(PendingSplit {
        slot,
        key: plan.key,
        stat_key: plan.stat_key,
        gpu_bytes: (g * row_bytes) as u64,
        cpu: ArmSample {
            engine: CPU_ENGINE,
            bytes: ((m - g) * row_bytes) as u64,
            time: ArmTime::Exact { ns: cpu },
        },
        cpu_ticket: None,
        timeline: false,
    });
    Ok(SplitTimes { d2h, cpu, join })
}

#[cfg(test)]
mod tests {
    use super::JoinStrategy;

    #[test]
    fn every_strategy_parses_from_its_config_spelling() {
        for s in JoinStrategy::ALL {
            assert_eq!(JoinStrategy::parse(s.name()).expect("own spelling"), s);
            assert_eq!(
                JoinStrategy::parse(&format!("  {}  ", s.name().to_ascii_uppercase()))
                    .expect("case and blanks"),
                s
            );
        }
        assert_eq!(
            JoinStrategy::parse("two_stream").expect("underscore"),
            JoinStrategy::TwoStream
        );
        let err = JoinStrategy::parse("barrier").expect_err("unknown");
        assert!(err.to_string().contains("barrier"), "{err}");
    }
}
