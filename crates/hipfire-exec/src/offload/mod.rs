//! The planner: spilled steps over device-resident activations, as `pcie`, `cpu` and
//! `passback`.
//!
//! The decode step keeps its activations on the GPU. A projection over a weight in pinned
//! host-mapped memory comes here as a [`SpilledStep`] and runs in the configured
//! [`OffloadMode`]:
//! - `pcie`: the GPU kernel reads the weight over the link (no host involvement);
//! - `cpu`: D2H of `x` (and of `y` for the residual form), the pinned pool multiplies all rows,
//!   H2D of `y`;
//! - `passback`: rows `[0, g)` on the GPU while the pool computes `[g, m)`, `g` from the
//!   [`ShareController`]; the CPU rows rejoin the GPU's under the mode's [`JoinStrategy`],
//!   whose `crate::join::Join` runs the split.
//!
//! The planner ([`OffloadExecutor`]) owns the share controller, the refusals, the trace
//! (`trace`), the arm timer (`arm_timer`), the join and the engines (the GPU arm is queued
//! on the caller's stream: the thread that owns the stream drives it, since an actor hop per
//! step would cost a wake-up; the CPU arm goes to the pinned pool's workers). It only sequences
//! engines and feeds timings to the controller; the controller decides (engines execute, the
//! scheduler schedules). Projections over one activation may run as one split (`fusion`).

mod arm_timer;
mod batch;
mod fusion;
mod trace;

use std::sync::Arc;
use std::time::Instant;

use crate::engine::GpuEngine;
use hipfire_gpu::{
    Activation, Context, DeviceMemory, Event, GemvForm, GpuError, HostMappedBuffer, RowRange,
    Stream, WeightRef,
};
use hipfire_quant::Format;

use crate::flags::{FlagsTuning, WeightBytes};
use crate::join::{DeviceArgs, Join, SplitPlan};
use crate::refusal::{OutDtype, Refusal, SplitCheck};
use crate::share::{
    cut_rows, ArmSample, ArmTime, Form, ShapeKey, ShareController, ShareSetting, CPU_ENGINE,
};
use crate::{CpuPool, ExecError};

pub use crate::join::JoinStrategy;
pub use arm_timer::ArmAccount;
pub(crate) use arm_timer::{ArmTimer, PendingSplit};
pub use batch::SpilledBatch;
use trace::Trace;
pub use trace::TRACE_TARGET;

/// Probe repetitions per engine when seeding a shape; the median is used. Three is the
/// reference system's choice (its probe medians were stable to ±3 % at 3 reps).
pub(crate) const PROBE_REPS: usize = 3;

/// Spin window of the CPU workers on the offload path. Spilled projections arrive every
/// ~100–600 µs during decode (one Llama-3-8B layer = 7 steps in 1.6–1.9 ms on the H200 box,
/// `examples/single_layer`), so workers that block after the pool's default 50 µs pay a wake-up
/// on nearly every step; on that box's VM an `auto` controller fed such arm times believed the
/// CPU ran at 2 GB/s. Spinning through the gaps costs nothing the workers would otherwise do.
pub const OFFLOAD_SPIN: std::time::Duration = std::time::Duration::from_millis(2);

/// The CPU pool for the offload path: `threads` workers (0: one per physical core, less one
/// core left to the thread that drives the GPU — it launches kernels and waits on copies while
/// the workers spin), each spinning [`OFFLOAD_SPIN`] before blocking.
pub fn offload_pool(threads: usize) -> Result<CpuPool, ExecError> {
    let threads = match threads {
        0 => crate::topology::default_threads().saturating_sub(1).max(1),
        n => n,
    };
    CpuPool::with_config(crate::PoolConfig {
        threads,
        spin: OFFLOAD_SPIN,
        ..crate::PoolConfig::default()
    })
}

/// `memory.offload_exec` for spilled weights.
#[derive(Debug, Clone, PartialEq)]
pub enum OffloadMode {
    /// The GPU reads the host-mapped weight over the link.
    Pcie,
    /// The CPU pool runs the whole spilled step.
    Cpu,
    /// Rows split between the GPU and the CPU pool.
    Passback {
        /// `memory.offload_passback_share`.
        share: ShareSetting,
        /// `memory.join_strategy`.
        strategy: JoinStrategy,
    },
}

impl OffloadMode {
    /// Config spelling of the mode.
    pub fn name(&self) -> &'static str {
        match self {
            OffloadMode::Pcie => "pcie",
            OffloadMode::Cpu => "cpu",
            OffloadMode::Passback { .. } => "passback",
        }
    }
}

/// One projection over a spilled weight, with its activation and output on the device.
pub struct SpilledStep<'a> {
    /// The weight as the GPU sees it (host-mapped).
    pub weight: &'a WeightRef<'a>,
    /// The same bytes as the CPU sees them, shared: under `flags` the CPU arm outlives the
    /// call that queued it.
    pub host: Arc<dyn WeightBytes>,
    /// The f32 activation (`k` values) the GPU `Activation` was prepared from.
    pub x: &'a dyn DeviceMemory,
    /// The output (`m` values): written (plain) or accumulated into (residual).
    pub y: &'a mut dyn DeviceMemory,
    /// Plain or residual.
    pub form: GemvForm,
}

/// Runs spilled steps in one mode (the planner): owns the share state, the staging buffers,
/// the arm timer, the trace and, under `passback`, the join.
pub struct OffloadExecutor {
    core: PlannerCore,
    /// The join of the `passback` mode (`None` under `pcie` and `cpu`). After `core` so that
    /// it is freed after the pool's handle.
    join: Option<Box<dyn Join>>,
}

/// Everything of the planner but its join: what a [`Join`] may use while it runs a split.
pub(crate) struct PlannerCore {
    pub(crate) ctx: Arc<Context>,
    pub(crate) pool: CpuPool,
    pub(crate) mode: OffloadMode,
    pub(crate) controller: ShareController,
    /// Pinned staging of x and y for the CPU arms that run on the calling thread.
    pub(crate) x_host: HostMappedBuffer,
    pub(crate) y_host: HostMappedBuffer,
    /// What the staging holds: activations of `max_k`, outputs of `max_m`, for `max_cols`
    /// columns ([`OffloadExecutor::reserve_columns`]).
    pub(crate) max_k: usize,
    pub(crate) max_m: usize,
    pub(crate) max_cols: usize,
    pub(crate) probe_start: Event,
    pub(crate) probe_end: Event,
    /// Recorded after a batched split's inputs are queued down: the one point its host waits
    /// for (`offload/batch.rs`).
    pub(crate) cols_ready: Event,
    pub(crate) timer: ArmTimer,
    pub(crate) trace: Trace,
}

impl std::fmt::Debug for OffloadExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadExecutor")
            .field("mode", &self.core.mode)
            .finish()
    }
}

impl Drop for OffloadExecutor {
    fn drop(&mut self) {
        if let Some(join) = &mut self.join {
            join.before_drop(&mut self.core);
        }
        // A batched split returns with its CPU rows still queued up from the pinned staging
        // (`offload/batch.rs`); a step that failed after queuing some leaves them there. Freeing
        // pinned memory under a pending copy is undefined, so let the device finish first.
        if let Err(e) = self.core.ctx.synchronize() {
            tracing::warn!(cause = %e, "synchronise before freeing the offload staging");
        }
    }
}

pub(crate) fn gpu_err(e: GpuError) -> ExecError {
    ExecError::Device(e)
}

pub(crate) fn f32s(buf: &HostMappedBuffer, n: usize) -> &[f32] {
    let bytes = &buf.as_slice()[..n * 4];
    // SAFETY: pinned allocations are page-aligned (so 4-aligned) and every bit pattern is a
    // valid f32; the length is n*4 bytes, checked by the slice above.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), n) }
}

pub(crate) fn f32s_mut(buf: &mut HostMappedBuffer, n: usize) -> &mut [f32] {
    let bytes = &mut buf.as_mut_slice()[..n * 4];
    // SAFETY: as in `f32s`, with the unique borrow of `buf`.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<f32>(), n) }
}

/// The controller's form of a step (`residual`: `y += W x`).
pub(crate) fn share_form(residual: bool) -> Form {
    if residual {
        Form::Residual
    } else {
        Form::Plain
    }
}

/// `op` queued on `stream` between `start` and `end`, waited for; the device's time for it, ns.
pub(crate) fn event_timed_ns(
    stream: &Stream,
    start: &Event,
    end: &Event,
    op: impl FnOnce() -> Result<(), GpuError>,
) -> Result<f64, ExecError> {
    start.record(stream).map_err(gpu_err)?;
    op().map_err(gpu_err)?;
    end.record(stream).map_err(gpu_err)?;
    end.synchronize().map_err(gpu_err)?;
    Ok(f64::from(start.elapsed_ms(end).map_err(gpu_err)?) * 1e6)
}

/// A probe's two samples: each engine alone over `bytes`, at the median of its times (ns).
pub(crate) fn probe_samples(bytes: u64, cpu: &mut [f64], gpu: &mut [f64]) -> Vec<ArmSample> {
    vec![
        ArmSample {
            engine: CPU_ENGINE,
            bytes,
            time: ArmTime::Exact { ns: median(cpu) },
        },
        ArmSample {
            engine: 1,
            bytes,
            time: ArmTime::Exact { ns: median(gpu) },
        },
    ]
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

impl OffloadExecutor {
    /// An executor for activations up to `max_k` elements and calls that write up to `max_m`
    /// output rows ([`OffloadExecutor::run_shared`] writes the sum of its steps' rows).
    pub fn new(
        ctx: &Arc<Context>,
        pool: CpuPool,
        mode: OffloadMode,
        max_k: usize,
        max_m: usize,
    ) -> Result<OffloadExecutor, ExecError> {
        let (setting, join) = match &mode {
            OffloadMode::Passback { share, strategy } => (
                *share,
                Some(crate::join::build(*strategy, ctx, max_k, max_m)?),
            ),
            _ => (ShareSetting::Off, None),
        };
        let step_events = join.as_ref().is_some_and(|j| j.step_events());
        Ok(OffloadExecutor {
            core: PlannerCore {
                ctx: ctx.clone(),
                pool,
                controller: ShareController::new(setting, 1),
                timer: ArmTimer::new(ctx, step_events)?,
                x_host: ctx.alloc_pinned_host(max_k * 4).map_err(gpu_err)?,
                y_host: ctx.alloc_pinned_host(max_m * 4).map_err(gpu_err)?,
                max_k,
                max_m,
                max_cols: 1,
                probe_start: ctx.new_event().map_err(gpu_err)?,
                probe_end: ctx.new_event().map_err(gpu_err)?,
                cols_ready: ctx.new_event().map_err(gpu_err)?,
                trace: Trace::new(),
                mode,
            },
            join,
        })
    }

    /// Mode and, for passback, share setting and join strategy.
    pub fn describe(&self) -> String {
        match &self.core.mode {
            OffloadMode::Passback { share, strategy } => {
                let s = match share {
                    ShareSetting::Auto => "auto".to_string(),
                    ShareSetting::Off => "0".to_string(),
                    ShareSetting::Pinned(x) => format!("{x}"),
                };
                format!(
                    "passback, share {s}, join {}, {} cpu workers",
                    strategy.name(),
                    self.core.pool.threads()
                )
            }
            OffloadMode::Cpu => format!("cpu, {} cpu workers", self.core.pool.threads()),
            OffloadMode::Pcie => "pcie".into(),
        }
    }

    /// Record where a flags step's time goes (the account's publish, fold, fold-wait and gap
    /// fields; they stay zero otherwise). For benchmarks: it adds two events per step and a
    /// PCIe read-modify-write to each fold.
    pub fn set_timeline(&mut self, on: bool) {
        if let Some(join) = &mut self.join {
            join.set_timeline(on);
        }
    }

    /// The flags arm's host-side knobs (for A/B runs; the default is the measured best).
    pub fn set_flags_tuning(&mut self, tuning: FlagsTuning) {
        if let Some(join) = &mut self.join {
            join.set_flags_tuning(tuning);
        }
    }

    /// The controller's key for a step of weight `format`, row length `k` and `form`: every
    /// height of one `(format, k, form)` shares an estimate, a fused step's too.
    pub fn shape_key(&self, format: Format, k: usize, form: Form) -> ShapeKey {
        ShapeKey {
            format,
            k,
            form,
            cols: 1,
        }
    }

    /// The controller (GPU share per shape) for reports.
    pub fn controller(&self) -> &ShareController {
        &self.core.controller
    }

    /// The arm time accumulated since the last call (waiting for pending GPU arms first, so
    /// call it after the stream has drained), and start a new account; no turnaround spans
    /// two accounts (take one per timed run so the gaps between runs are not counted).
    pub fn take_arm_account(&mut self) -> Result<ArmAccount, ExecError> {
        self.core.resolve_pending(true)?;
        self.core.timer.break_chain();
        if let Some(join) = &mut self.join {
            join.close_account(&mut self.core.timer.account);
        }
        Ok(std::mem::take(&mut self.core.timer.account))
    }

    /// Queue or run one spilled step on `stream`. `act` was prepared from `step.x` on `stream`.
    pub fn run(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        step: SpilledStep<'_>,
    ) -> Result<(), ExecError> {
        let w = step.weight;
        let t0 = Instant::now();
        self.core.trace.total_steps += 1;
        self.core.trace.window_steps += 1;
        let key = (
            w.format(),
            w.m(),
            w.k(),
            matches!(step.form, GemvForm::Residual),
        );
        match self.core.mode.clone() {
            OffloadMode::Pcie => {
                kernels
                    .enqueue_rows(stream, w, act, step.y, RowRange::all(w.m()), step.form)
                    .map_err(gpu_err)?;
                self.core.trace.stats.entry(key).or_default().calls += 1;
                return Ok(());
            }
            OffloadMode::Cpu => {
                let (d2h, cpu, up) = self.core.run_cpu_whole(stream, step)?;
                self.core.note(key, d2h, cpu, 0.0, up, t0, None, false);
            }
            OffloadMode::Passback { .. } => self.run_passback(stream, kernels, act, step, t0)?,
        }
        if self.core.trace.total_steps.is_power_of_two() {
            self.core.trace_idle();
        }
        Ok(())
    }

    fn run_passback(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        step: SpilledStep<'_>,
        t0: Instant,
    ) -> Result<(), ExecError> {
        let w = step.weight;
        let (m, k) = (w.m(), w.k());
        let residual = matches!(step.form, GemvForm::Residual);
        let stat_key = (w.format(), m, k, residual);
        let form = share_form(residual);
        let key = self.shape_key(w.format(), k, form);
        let row_bytes = match self.core.split_check(&step) {
            Ok(rb) => rb,
            Err(rule) => {
                let (d2h, cpu, up) = self.core.run_cpu_whole(stream, step)?;
                self.core.note(
                    stat_key,
                    d2h,
                    cpu,
                    0.0,
                    up,
                    t0,
                    Some(rule.to_string()),
                    false,
                );
                return Ok(());
            }
        };
        if self.core.controller.needs_probe(&key) {
            self.core.resolve_pending(true)?;
            let probe = self.core.probe(stream, kernels, act, &step);
            self.core.seed_probed(key, probe);
        }
        let shares = self.core.controller.shares(&key);
        let Some(cut) = cut_rows(m, row_bytes, &shares) else {
            // Share 0 (or too small to split): byte-identical to `cpu` mode.
            let (d2h, cpu, up) = self.core.run_cpu_whole(stream, step)?;
            self.core.note(stat_key, d2h, cpu, 0.0, up, t0, None, false);
            return Ok(());
        };
        let plan = SplitPlan {
            key,
            stat_key,
            cuts: vec![(cut[1].end, row_bytes)],
        };
        let dev = DeviceArgs {
            stream,
            kernels,
            act,
        };
        let mut step = step;
        self.run_join(dev, std::slice::from_mut(&mut step), plan, t0)
    }

    /// The join's split of `steps` under `plan`, then the split's trace line.
    fn run_join(
        &mut self,
        dev: DeviceArgs<'_>,
        steps: &mut [SpilledStep<'_>],
        plan: SplitPlan,
        t0: Instant,
    ) -> Result<(), ExecError> {
        let stat_key = plan.stat_key;
        let mode = &self.core.mode;
        let join = self.join.as_mut().ok_or_else(|| ExecError::Invalid {
            what: "memory.offload_exec",
            value: mode.name().into(),
            rule: "a split step needs the passback mode's join",
        })?;
        let times = join.run_split(&mut self.core, dev, steps, plan, t0)?;
        self.core.trace.window_split_steps += 1;
        self.core.note(
            stat_key, times.d2h, times.cpu, times.join, 0.0, t0, None, true,
        );
        Ok(())
    }
}

impl PlannerCore {
    /// CPU path for the whole matrix: returns (d2h, multiply, h2d) ns.
    pub(crate) fn run_cpu_whole(
        &mut self,
        stream: &Stream,
        step: SpilledStep<'_>,
    ) -> Result<(f64, f64, f64), ExecError> {
        let w = step.weight;
        let (m, k) = (w.m(), w.k());
        let residual = matches!(step.form, GemvForm::Residual);
        let d2h = self.fetch_cpu_inputs(stream, &step, 0)?;
        let t = Instant::now();
        let x: Vec<f32> = f32s(&self.x_host, k).to_vec();
        self.pool.gemv(
            w.format(),
            step.host.bytes(),
            k,
            &x,
            f32s_mut(&mut self.y_host, m),
            residual,
        )?;
        let cpu = t.elapsed().as_nanos() as f64;
        self.timer.account.steps += 1;
        self.timer.account.arm_ns += cpu;
        self.timer.break_chain();
        let t = Instant::now();
        stream
            .memcpy_htod_async(step.y, 0, &self.y_host, 0, m * 4)
            .map_err(gpu_err)?;
        let up = t.elapsed().as_nanos() as f64;
        self.trace.window_cpu_ns += d2h + cpu;
        Ok((d2h, cpu, up))
    }

    /// The CPU arm's inputs, blocking: D2H of `x` and, for the residual form, of `y[row0..m]`
    /// into the staging buffers; then the previous split's GPU timing is read (the stream has
    /// drained past it). Returns the nanoseconds it took.
    pub(crate) fn fetch_cpu_inputs(
        &mut self,
        stream: &Stream,
        step: &SpilledStep<'_>,
        row0: usize,
    ) -> Result<f64, ExecError> {
        let (m, k) = (step.weight.m(), step.weight.k());
        let t = Instant::now();
        stream
            .memcpy_dtoh_async(&mut self.x_host, 0, step.x, 0, k * 4)
            .map_err(gpu_err)?;
        if matches!(step.form, GemvForm::Residual) {
            stream
                .memcpy_dtoh_async(
                    &mut self.y_host,
                    row0 * 4,
                    &*step.y,
                    row0 * 4,
                    (m - row0) * 4,
                )
                .map_err(gpu_err)?;
        }
        stream.synchronize().map_err(gpu_err)?;
        self.resolve_pending(true)?;
        Ok(t.elapsed().as_nanos() as f64)
    }

    /// Seed `key`'s share from a probe: a failed probe degrades to the controller's default
    /// share (and says so), never fails the step.
    pub(crate) fn seed_probed(&mut self, key: ShapeKey, probe: Result<Vec<ArmSample>, ExecError>) {
        if let Err(e) = &probe {
            tracing::warn!(target: TRACE_TARGET, cause = %e, cols = key.cols, "probe failed; default share");
        }
        self.controller
            .seed(key, probe.as_ref().ok().map(Vec::as_slice));
    }

    pub(crate) fn split_check(&self, step: &SpilledStep<'_>) -> Result<usize, Refusal> {
        self.split_check_parts(
            step.weight,
            step.host.bytes().len(),
            step.y.byte_len() / 4,
            matches!(step.form, GemvForm::Residual),
        )
    }

    /// [`PlannerCore::split_check`] from the parts it reads: the weight, its host bytes' length,
    /// the output's length in f32 and the form.
    pub(crate) fn split_check_parts(
        &self,
        w: &WeightRef<'_>,
        weight_len: usize,
        out_len: usize,
        residual: bool,
    ) -> Result<usize, Refusal> {
        SplitCheck {
            format: w.format(),
            k: w.k(),
            m: w.m(),
            row_stride: w.row_bytes(),
            weight_len,
            out_dtype: OutDtype::F32,
            out_len,
            residual,
            cpu_simd: w.format().has_cpu_simd()
                && hipfire_quant::simd_tier() != hipfire_quant::SimdTier::Scalar,
            gpu_kernel: w.format().has_gpu_kernel(),
            gpu_residual_kernel: w.format().has_gpu_kernel(),
        }
        .check()
    }

    /// Time both engines alone over the step's own weight (medians of [`PROBE_REPS`]); the GPU
    /// with events. Scratch outputs only: the real `y` is untouched.
    fn probe(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        step: &SpilledStep<'_>,
    ) -> Result<Vec<ArmSample>, ExecError> {
        let w = step.weight;
        let (m, k) = (w.m(), w.k());
        let mut scratch = self.ctx.alloc::<f32>(m).map_err(gpu_err)?;
        let (start, end) = (&self.probe_start, &self.probe_end);
        let mut gpu = Vec::with_capacity(PROBE_REPS);
        for _ in 0..PROBE_REPS {
            gpu.push(event_timed_ns(stream, start, end, || {
                kernels.enqueue_rows(
                    stream,
                    w,
                    act,
                    &mut scratch,
                    RowRange::all(m),
                    GemvForm::Plain,
                )
            })?);
        }
        stream
            .memcpy_dtoh_async(&mut self.x_host, 0, step.x, 0, k * 4)
            .map_err(gpu_err)?;
        stream.synchronize().map_err(gpu_err)?;
        let x: Vec<f32> = f32s(&self.x_host, k).to_vec();
        let mut out = vec![0f32; m];
        let mut cpu = Vec::with_capacity(PROBE_REPS);
        for _ in 0..PROBE_REPS {
            let t = Instant::now();
            self.pool
                .gemv(w.format(), step.host.bytes(), k, &x, &mut out, false)?;
            cpu.push(t.elapsed().as_nanos() as f64);
        }
        Ok(probe_samples(
            step.host.bytes().len() as u64,
            &mut cpu,
            &mut gpu,
        ))
    }
}
