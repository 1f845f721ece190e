//! Spilled steps over device-resident activations: `pcie`, `cpu` and `passback`.
//!
//! The decode step keeps its activations on the GPU. A projection over a weight in pinned
//! host-mapped memory comes here as a [`SpilledStep`] and runs in the configured
//! [`OffloadMode`]:
//! - `pcie`: the GPU kernel reads the weight over the link (no host involvement);
//! - `cpu`: D2H of `x` (and of `y` for the residual form), the pinned pool multiplies all rows,
//!   H2D of `y`;
//! - `passback`: rows `[0, g)` on the GPU while the pool computes `[g, m)`, `g` from the
//!   [`ShareController`]; the CPU rows go up and join under the chosen [`JoinStrategy`].
//!
//! The executor only sequences engines and feeds timings to the controller; the controller
//! decides (engines execute, the scheduler schedules).
//!
//! GPU arm timings come from an event pair around the arm, one pair per split step from a small
//! ring; a pair is read once it has completed (after the next blocking D2H under `ordering` and
//! `two-stream`; by a non-blocking query under `flags`, whose steps never wait for the stream),
//! so reading them never adds a host wait except when the ring is full.
//!
//! Under `flags` (the device half is `kernels/flags.cu`, the host half [`crate::flags`]) a split
//! step queues publish → GPU arm → wait-fold on the stream and hands the CPU arm to the pool's
//! workers, which spin on the mailbox's sequence word; the host waits for neither and runs
//! ahead, so each step's engines start as soon as the previous one's rows are folded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use hipfire_gpu::{
    Activation, Context, DeviceMemory, DoneWords, Event, FlagsKernels, FoldTarget, GemvForm,
    GemvKernels, GpuError, HostMappedBuffer, KernelRegistry, RowRange, Stream, WeightRef,
    FOLD_MAX_TARGETS,
};
use hipfire_quant::{ActivationBuf, Format};

use crate::flags::{
    next_step, ArmRows, FlagsArm, FlagsTicket, FlagsTuning, Mailbox, MailboxMemory, WeightBytes,
    DEFAULT_FLAGS_TIMEOUT,
};
use crate::refusal::{OutDtype, Refusal, SplitCheck};
use crate::share::{
    cut_rows, ArmSample, ArmTime, Form, ShapeKey, ShareController, ShareSetting, CPU_ENGINE,
};
use crate::{CpuPool, ExecError};

/// Trace target for spilled-step lines (`HIPFIRE_CPU_EXEC_TRACE=1` enables it at debug).
pub const TRACE_TARGET: &str = "hipfire::cpu_exec";

/// Probe repetitions per engine when seeding a shape; the median is used. Three is the
/// reference system's choice (its probe medians were stable to ±3 % at 3 reps).
const PROBE_REPS: usize = 3;

/// GPU arm event pairs in flight before the oldest must be waited for. Under `flags` a pair is
/// read when a later step finds it complete; eight covers a whole layer's seven projections.
const ARM_EVENT_RING: usize = 8;

/// How long the device's wait-fold spins on the CPU's done word before it records a fault
/// instead of hanging the stream: twice the workers' own wait for the device, so a slow device
/// is reported by the workers first.
const FLAGS_DEVICE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

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

/// How the CPU rows of a split step rejoin the GPU's.
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
    /// Parse `ordering` / `two-stream`.
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

/// Running totals for one shape's trace line.
#[derive(Debug, Default, Clone)]
struct ShapeStats {
    calls: u64,
    split: u64,
    d2h_ns: f64,
    cpu_ns: f64,
    gpu_ns: f64,
    join_ns: f64,
    wall_ns: f64,
    refusal: Option<String>,
}

/// Steps that ran on the CPU (whole or as an arm) and the time of their longer arm, summed:
/// the part of a spilled step's wall that is not synchronisation. `1 − arm_ns / wall` over a
/// timed run is the per-step sync overhead (issue 4's figure).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ArmAccount {
    /// Steps counted (split steps once both arms are timed, and whole-CPU steps).
    pub steps: u64,
    /// Σ over those steps of max(CPU arm, GPU arm) in nanoseconds (the CPU multiply alone for
    /// whole-CPU steps).
    pub arm_ns: f64,
    /// `flags` only, where the sync time goes. Σ over split steps of the workers' start skew
    /// (last − first to see the sequence word), ns.
    pub worker_skew_ns: f64,
    /// Σ over split steps of the gap from the previous step's last worker finishing to this
    /// step's first worker seeing its x (fold, kernels between, publish), ns; steps with
    /// another kind of step in between are not counted.
    pub turnaround_ns: f64,
    /// Split steps counted in `turnaround_ns`.
    pub turnarounds: u64,
    /// Σ over flags steps of the device's publish (event before it to the GPU arm's start), ns.
    pub publish_ns: f64,
    /// Σ over flags steps of the wait-fold (GPU arm's end to after the fold: includes waiting
    /// for a slower CPU arm), ns.
    pub fold_ns: f64,
    /// Σ over consecutive flags steps of the device's gap from one fold's end to the next
    /// publish (launches, kernels between steps), ns.
    pub device_gap_ns: f64,
    /// Of `fold_ns`, the time the folds spent waiting for the CPU's done word (the device's
    /// own count), ns; the rest is the fold's work and the launch.
    pub fold_wait_ns: f64,
    /// Σ over split steps of the longest activation preparation of a worker (part of the CPU
    /// arm: every worker quantises x itself), ns.
    pub prepare_ns: f64,
    /// Σ over flags steps of the weight bytes the workers prefetched while they waited.
    pub prefetched_bytes: f64,
}

impl std::ops::AddAssign for ArmAccount {
    /// Sum two accounts (consecutive runs: their turnarounds stay counted apart).
    fn add_assign(&mut self, o: ArmAccount) {
        self.steps += o.steps;
        self.arm_ns += o.arm_ns;
        self.worker_skew_ns += o.worker_skew_ns;
        self.turnaround_ns += o.turnaround_ns;
        self.turnarounds += o.turnarounds;
        self.publish_ns += o.publish_ns;
        self.fold_ns += o.fold_ns;
        self.device_gap_ns += o.device_gap_ns;
        self.fold_wait_ns += o.fold_wait_ns;
        self.prepare_ns += o.prepare_ns;
        self.prefetched_bytes += o.prefetched_bytes;
    }
}

/// A split step whose arm timings are read once it has completed: the GPU arm's event pair
/// (ring slot `slot`) and, under `flags`, the CPU arm's ticket (its time is known only then).
struct PendingSplit {
    slot: usize,
    key: ShapeKey,
    stat_key: (Format, usize, usize, bool),
    gpu_bytes: u64,
    cpu: ArmSample,
    cpu_ticket: Option<FlagsTicket>,
    /// Whether the step recorded its timeline events ([`OffloadExecutor::set_timeline`]).
    timeline: bool,
}

/// Runs spilled steps in one mode; owns the pinned staging buffers and the share state.
pub struct OffloadExecutor {
    ctx: Arc<Context>,
    pool: CpuPool,
    mode: OffloadMode,
    controller: ShareController,
    x_host: HostMappedBuffer,
    y_host: HostMappedBuffer,
    copy_stream: Stream,
    /// Event pairs around GPU arms ([`ARM_EVENT_RING`]), used round-robin.
    arm_events: Vec<(Event, Event)>,
    /// Under `flags`, per ring slot: before the publish and after the wait-fold, so the
    /// account can say where the device's time between two GPU arms goes.
    step_events: Vec<(Event, Event)>,
    /// The previous flags step's after-fold event slot, while its successor is unresolved.
    last_fold_slot: Option<usize>,
    /// The flags arm's host-side knobs.
    flags_tuning: FlagsTuning,
    /// Record the flags timeline (events around each step, the device's fold-wait count):
    /// off by default, since it costs each step a little (8B decode on the H200, 16 layers
    /// spilled, three alternating runs: 42.1-42.2 tok/s at the commit before it, 39.2-42.8
    /// with it always on).
    timeline: bool,
    next_slot: usize,
    probe_start: Event,
    probe_end: Event,
    copy_done: Event,
    pending: std::collections::VecDeque<PendingSplit>,
    flags: Option<FlagsState>,
    arm_account: ArmAccount,
    /// When the last resolved flags step's CPU arm finished ([`crate::flags::flags_clock_ns`]).
    last_flags_done: Option<u64>,
    stats: HashMap<(Format, usize, usize, bool), ShapeStats>,
    /// `cpu exec: idle` window: steps, wall and CPU time since the window opened.
    window_start: Instant,
    window_steps: u64,
    window_cpu_ns: f64,
    window_split_steps: u64,
    total_steps: u64,
}

/// The `flags` join's device kernels and mailbox.
struct FlagsState {
    kernels: FlagsKernels,
    mem: Arc<HostMappedBuffer>,
    mailbox: Mailbox,
    /// Last step number published (never 0: the mailbox starts zeroed).
    step: u32,
    /// The device's fold-wait total at the last account.
    fold_wait_taken: u64,
}

// SAFETY: a pinned, page-aligned allocation owned by the Arc'd buffer, valid until it drops.
unsafe impl MailboxMemory for Arc<HostMappedBuffer> {
    fn base(&self) -> *mut u8 {
        self.host_ptr()
    }
    fn len(&self) -> usize {
        HostMappedBuffer::len(self)
    }
}

impl std::fmt::Debug for OffloadExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadExecutor")
            .field("mode", &self.mode)
            .finish()
    }
}

impl Drop for OffloadExecutor {
    fn drop(&mut self) {
        // A wait-fold may still be reading the mailbox; freeing pinned memory under a running
        // kernel is undefined, so let the device finish first.
        if self.flags.is_some() {
            if let Err(e) = self.ctx.synchronize() {
                tracing::warn!(cause = %e, "synchronise before freeing the flags mailbox");
            }
            // The device side has run, so every queued CPU arm has finished or timed out;
            // collect the workers (cancelling any still waiting after a device fault).
            for p in self.pending.drain(..) {
                if let Some(t) = p.cpu_ticket {
                    t.cancel();
                }
            }
        }
    }
}

fn gpu_err(e: GpuError) -> ExecError {
    ExecError::Device(e)
}

fn f32s(buf: &HostMappedBuffer, n: usize) -> &[f32] {
    let bytes = &buf.as_slice()[..n * 4];
    // SAFETY: pinned allocations are page-aligned (so 4-aligned) and every bit pattern is a
    // valid f32; the length is n*4 bytes, checked by the slice above.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), n) }
}

fn f32s_mut(buf: &mut HostMappedBuffer, n: usize) -> &mut [f32] {
    let bytes = &mut buf.as_mut_slice()[..n * 4];
    // SAFETY: as in `f32s`, with the unique borrow of `buf`.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<f32>(), n) }
}

/// The controller's form of a step (`residual`: `y += W x`).
fn share_form(residual: bool) -> Form {
    if residual {
        Form::Residual
    } else {
        Form::Plain
    }
}

/// `op` queued on `stream` between `start` and `end`, waited for; the device's time for it, ns.
fn event_timed_ns(
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

fn median(v: &mut [f64]) -> f64 {
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
        let setting = match &mode {
            OffloadMode::Passback { share, .. } => *share,
            _ => ShareSetting::Off,
        };
        let flags = match &mode {
            OffloadMode::Passback {
                strategy: JoinStrategy::Flags,
                ..
            } => {
                let kernels = FlagsKernels::new(&KernelRegistry::new(ctx)).map_err(gpu_err)?;
                let mem = Arc::new(
                    ctx.alloc_host_mapped(Mailbox::bytes_needed(max_k, max_m))
                        .map_err(gpu_err)?,
                );
                let mailbox = Mailbox::new(Arc::new(mem.clone()), max_k, max_m)?;
                Some(FlagsState {
                    kernels,
                    mem,
                    mailbox,
                    step: 0,
                    fold_wait_taken: 0,
                })
            }
            _ => None,
        };
        let mut arm_events = Vec::with_capacity(ARM_EVENT_RING);
        for _ in 0..ARM_EVENT_RING {
            arm_events.push((
                ctx.new_event().map_err(gpu_err)?,
                ctx.new_event().map_err(gpu_err)?,
            ));
        }
        let mut step_events = Vec::new();
        if flags.is_some() {
            for _ in 0..ARM_EVENT_RING {
                step_events.push((
                    ctx.new_event().map_err(gpu_err)?,
                    ctx.new_event().map_err(gpu_err)?,
                ));
            }
        }
        Ok(OffloadExecutor {
            ctx: ctx.clone(),
            pool,
            controller: ShareController::new(setting, 1),
            x_host: ctx.alloc_pinned_host(max_k * 4).map_err(gpu_err)?,
            y_host: ctx.alloc_pinned_host(max_m * 4).map_err(gpu_err)?,
            copy_stream: ctx.new_stream().map_err(gpu_err)?,
            arm_events,
            step_events,
            last_fold_slot: None,
            timeline: false,
            flags_tuning: FlagsTuning::default(),
            next_slot: 0,
            probe_start: ctx.new_event().map_err(gpu_err)?,
            probe_end: ctx.new_event().map_err(gpu_err)?,
            copy_done: ctx.new_event().map_err(gpu_err)?,
            pending: std::collections::VecDeque::new(),
            flags,
            arm_account: ArmAccount::default(),
            last_flags_done: None,
            stats: HashMap::new(),
            window_start: Instant::now(),
            window_steps: 0,
            window_cpu_ns: 0.0,
            window_split_steps: 0,
            total_steps: 0,
            mode,
        })
    }

    /// Mode and, for passback, share setting and join strategy.
    pub fn describe(&self) -> String {
        match &self.mode {
            OffloadMode::Passback { share, strategy } => {
                let s = match share {
                    ShareSetting::Auto => "auto".to_string(),
                    ShareSetting::Off => "0".to_string(),
                    ShareSetting::Pinned(x) => format!("{x}"),
                };
                format!(
                    "passback, share {s}, join {}, {} cpu workers",
                    strategy.name(),
                    self.pool.threads()
                )
            }
            OffloadMode::Cpu => format!("cpu, {} cpu workers", self.pool.threads()),
            OffloadMode::Pcie => "pcie".into(),
        }
    }

    /// Record where a flags step's time goes (the account's publish, fold, fold-wait and gap
    /// fields; they stay zero otherwise). For benchmarks: it adds two events per step and a
    /// PCIe read-modify-write to each fold.
    pub fn set_timeline(&mut self, on: bool) {
        self.timeline = on;
    }

    /// The flags arm's host-side knobs (for A/B runs; the default is the measured best).
    pub fn set_flags_tuning(&mut self, tuning: FlagsTuning) {
        self.flags_tuning = tuning;
    }

    /// The controller's key for a step of weight `format`, row length `k` and `form`: every
    /// height of one `(format, k, form)` shares an estimate, a fused step's too.
    pub fn shape_key(&self, format: Format, k: usize, form: Form) -> ShapeKey {
        ShapeKey { format, k, form }
    }

    /// The controller (GPU share per shape) for reports.
    pub fn controller(&self) -> &ShareController {
        &self.controller
    }

    /// The arm time accumulated since the last call (waiting for pending GPU arms first, so
    /// call it after the stream has drained), and start a new account; no turnaround spans
    /// two accounts (take one per timed run so the gaps between runs are not counted).
    pub fn take_arm_account(&mut self) -> Result<ArmAccount, ExecError> {
        self.resolve_pending(true)?;
        self.last_flags_done = None;
        self.last_fold_slot = None;
        if let Some(fl) = &mut self.flags {
            // Every fold queued so far has run (the pending steps' events were waited for).
            let total = fl.mailbox.fold_wait_ns();
            self.arm_account.fold_wait_ns = total.saturating_sub(fl.fold_wait_taken) as f64;
            fl.fold_wait_taken = total;
        }
        Ok(std::mem::take(&mut self.arm_account))
    }

    /// Queue or run one spilled step on `stream`. `act` was prepared from `step.x` on `stream`.
    pub fn run(
        &mut self,
        stream: &Stream,
        kernels: &GemvKernels,
        act: &Activation,
        step: SpilledStep<'_>,
    ) -> Result<(), ExecError> {
        let w = step.weight;
        let t0 = Instant::now();
        self.total_steps += 1;
        self.window_steps += 1;
        let key = (
            w.format(),
            w.m(),
            w.k(),
            matches!(step.form, GemvForm::Residual),
        );
        match self.mode.clone() {
            OffloadMode::Pcie => {
                kernels
                    .gemv(stream, w, act, step.y, RowRange::all(w.m()), step.form)
                    .map_err(gpu_err)?;
                self.stats.entry(key).or_default().calls += 1;
                return Ok(());
            }
            OffloadMode::Cpu => {
                let (d2h, cpu, up) = self.run_cpu_whole(stream, step)?;
                self.note(key, d2h, cpu, 0.0, up, t0, None, false);
            }
            OffloadMode::Passback { strategy, .. } => {
                self.run_passback(stream, kernels, act, step, strategy, t0)?
            }
        }
        if self.total_steps.is_power_of_two() {
            self.trace_idle();
        }
        Ok(())
    }

    /// CPU path for the whole matrix: returns (d2h, multiply, h2d) ns.
    fn run_cpu_whole(
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
        self.arm_account.steps += 1;
        self.arm_account.arm_ns += cpu;
        self.last_flags_done = None;
        self.last_fold_slot = None;
        let t = Instant::now();
        stream
            .memcpy_htod_async(step.y, 0, &self.y_host, 0, m * 4)
            .map_err(gpu_err)?;
        let up = t.elapsed().as_nanos() as f64;
        self.window_cpu_ns += d2h + cpu;
        Ok((d2h, cpu, up))
    }

    /// The CPU arm's inputs, blocking: D2H of `x` and, for the residual form, of `y[row0..m]`
    /// into the staging buffers; then the previous split's GPU timing is read (the stream has
    /// drained past it). Returns the nanoseconds it took.
    fn fetch_cpu_inputs(
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

    fn split_check(&self, step: &SpilledStep<'_>) -> Result<usize, Refusal> {
        let w = step.weight;
        SplitCheck {
            format: w.format(),
            k: w.k(),
            m: w.m(),
            row_stride: w.row_bytes(),
            weight_len: step.host.bytes().len(),
            out_dtype: OutDtype::F32,
            out_len: step.y.byte_len() / 4,
            residual: matches!(step.form, GemvForm::Residual),
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
        kernels: &GemvKernels,
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
                kernels.gemv(
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
        let bytes = step.host.bytes().len() as u64;
        Ok(vec![
            ArmSample {
                engine: CPU_ENGINE,
                bytes,
                time: ArmTime::Exact {
                    ns: median(&mut cpu),
                },
            },
            ArmSample {
                engine: 1,
                bytes,
                time: ArmTime::Exact {
                    ns: median(&mut gpu),
                },
            },
        ])
    }

    /// Reads completed split steps, oldest first, and feeds both arms of each to the
    /// controller. `block`: wait for every pending step (callers that just drained the stream
    /// pay nothing for it); otherwise stop at the first one still running.
    fn resolve_pending(&mut self, block: bool) -> Result<(), ExecError> {
        while self.resolve_oldest(block)? {}
        Ok(())
    }

    /// Resolve the oldest pending step, waiting for it if `block`; whether there was one that
    /// could be resolved. A CPU arm's error (a worker failed or timed out) is returned here.
    fn resolve_oldest(&mut self, block: bool) -> Result<bool, ExecError> {
        let Some(p) = self.pending.front() else {
            return Ok(false);
        };
        let (start, end) = &self.arm_events[p.slot];
        if block {
            end.synchronize().map_err(gpu_err)?;
        } else if !end.query().map_err(gpu_err)?
            || p.cpu_ticket.as_ref().is_some_and(|t| !t.is_finished())
            || match self.step_events.get(p.slot).filter(|_| p.timeline) {
                Some((_, post)) => !post.query().map_err(gpu_err)?,
                None => false,
            }
        {
            return Ok(false);
        }
        let ns = f64::from(start.elapsed_ms(end).map_err(gpu_err)?) * 1e6;
        let Some(mut p) = self.pending.pop_front() else {
            return Ok(false);
        };
        if let Some(ticket) = p.cpu_ticket.take() {
            let rep = ticket.wait()?;
            p.cpu.time = ArmTime::Exact { ns: rep.cpu_ns };
            if rep.first_seen_ns != u64::MAX {
                let a = &mut self.arm_account;
                a.worker_skew_ns += rep.last_seen_ns.saturating_sub(rep.first_seen_ns) as f64;
                a.prepare_ns += rep.prepare_ns;
                a.prefetched_bytes += rep.prefetched_bytes as f64;
                if let Some(prev_done) = self.last_flags_done.filter(|&d| d < rep.first_seen_ns) {
                    a.turnaround_ns += (rep.first_seen_ns - prev_done) as f64;
                    a.turnarounds += 1;
                }
                self.last_flags_done = Some(rep.done_ns);
            }
            if let Some((pre, post)) = self.step_events.get(p.slot).filter(|_| p.timeline) {
                post.synchronize().map_err(gpu_err)?;
                let ms = |a: &Event, b: &Event| a.elapsed_ms(b).map(|v| f64::from(v) * 1e6);
                let (gpu_start, gpu_end) = &self.arm_events[p.slot];
                let a = &mut self.arm_account;
                a.publish_ns += ms(pre, gpu_start).map_err(gpu_err)?;
                a.fold_ns += ms(gpu_end, post).map_err(gpu_err)?;
                if let Some(prev) = self.last_fold_slot {
                    a.device_gap_ns += ms(&self.step_events[prev].1, pre).map_err(gpu_err)?;
                }
                self.last_fold_slot = Some(p.slot);
            }
            let s = self.stats.entry(p.stat_key).or_default();
            s.d2h_ns += rep.wait_ns;
            s.cpu_ns += rep.cpu_ns;
        }
        let gpu = ArmSample {
            engine: 1,
            bytes: p.gpu_bytes,
            time: ArmTime::Exact { ns },
        };
        let cpu_ns = match p.cpu.time {
            ArmTime::Exact { ns } | ArmTime::FinishedBy { ns } => ns,
        };
        self.arm_account.steps += 1;
        self.arm_account.arm_ns += cpu_ns.max(ns);
        self.controller.observe(p.key, &[p.cpu, gpu]);
        self.stats.entry(p.stat_key).or_default().gpu_ns += ns;
        Ok(true)
    }

    /// The next free event pair of the ring (waiting for the oldest pending step if none is).
    fn take_slot(&mut self) -> Result<usize, ExecError> {
        if self.pending.len() >= ARM_EVENT_RING {
            self.resolve_oldest(true)?;
        }
        self.resolve_pending(false)?;
        let slot = self.next_slot;
        self.next_slot = (self.next_slot + 1) % ARM_EVENT_RING;
        // That slot's after-fold event is about to be recorded again: no gap from it.
        if self.last_fold_slot == Some(slot) {
            self.last_fold_slot = None;
        }
        Ok(slot)
    }

    fn run_passback(
        &mut self,
        stream: &Stream,
        kernels: &GemvKernels,
        act: &Activation,
        step: SpilledStep<'_>,
        strategy: JoinStrategy,
        t0: Instant,
    ) -> Result<(), ExecError> {
        let w = step.weight;
        let (m, k) = (w.m(), w.k());
        let residual = matches!(step.form, GemvForm::Residual);
        let stat_key = (w.format(), m, k, residual);
        let form = share_form(residual);
        let key = self.shape_key(w.format(), k, form);
        let row_bytes = match self.split_check(&step) {
            Ok(rb) => rb,
            Err(rule) => {
                let (d2h, cpu, up) = self.run_cpu_whole(stream, step)?;
                self.note(
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
        if self.controller.needs_probe(&key) {
            self.resolve_pending(true)?;
            // A failed probe degrades to the controller's default share, never fails the step.
            let probe = self.probe(stream, kernels, act, &step);
            if let Err(e) = &probe {
                tracing::warn!(target: TRACE_TARGET, cause = %e, "probe failed; default share");
            }
            self.controller
                .seed(key, probe.as_ref().ok().map(Vec::as_slice));
        }
        let shares = self.controller.shares(&key);
        let Some(cut) = cut_rows(m, row_bytes, &shares) else {
            // Share 0 (or too small to split): byte-identical to `cpu` mode.
            let (d2h, cpu, up) = self.run_cpu_whole(stream, step)?;
            self.note(stat_key, d2h, cpu, 0.0, up, t0, None, false);
            return Ok(());
        };
        let g = cut[1].end;
        let cpu_rows = cut[CPU_ENGINE].clone();
        if strategy == JoinStrategy::Flags {
            let split = FlagsSplit {
                key,
                stat_key,
                cuts: vec![(g, row_bytes)],
            };
            let mut step = step;
            return self.run_flags_split(
                stream,
                kernels,
                act,
                std::slice::from_mut(&mut step),
                split,
                t0,
            );
        }

        // 1. x (and the CPU rows of the residual) down, blocking: the CPU arm needs them now.
        let d2h = self.fetch_cpu_inputs(stream, &step, g)?;

        // 2. GPU arm, asynchronous, between an event pair.
        let slot = self.take_slot()?;
        let (gpu_start, gpu_end) = &self.arm_events[slot];
        gpu_start.record(stream).map_err(gpu_err)?;
        kernels
            .gemv(stream, w, act, step.y, RowRange::new(0, g), step.form)
            .map_err(gpu_err)?;
        gpu_end.record(stream).map_err(gpu_err)?;

        // 3. CPU arm over rows [g, m) while the kernel runs.
        let t = Instant::now();
        let cpu_act = ActivationBuf::prepare(w.format(), f32s(&self.x_host, k))?;
        let y_cpu = &mut f32s_mut(&mut self.y_host, m)[g..m];
        self.pool.gemv_prepared(
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
        match strategy {
            JoinStrategy::Ordering => {
                stream
                    .memcpy_htod_async(step.y, g * 4, &self.y_host, g * 4, (m - g) * 4)
                    .map_err(gpu_err)?;
                stream.synchronize().map_err(gpu_err)?;
            }
            JoinStrategy::TwoStream | JoinStrategy::Flags => {
                self.copy_stream
                    .memcpy_htod_async(step.y, g * 4, &self.y_host, g * 4, (m - g) * 4)
                    .map_err(gpu_err)?;
                self.copy_done.record(&self.copy_stream).map_err(gpu_err)?;
                stream.wait_event(&self.copy_done).map_err(gpu_err)?;
            }
        }
        let join = t.elapsed().as_nanos() as f64;
        self.pending.push_back(PendingSplit {
            slot,
            key,
            stat_key,
            gpu_bytes: (g * row_bytes) as u64,
            cpu: ArmSample {
                engine: CPU_ENGINE,
                bytes: (cpu_rows.len() * row_bytes) as u64,
                time: ArmTime::Exact { ns: cpu },
            },
            cpu_ticket: None,
            timeline: false,
        });
        if strategy == JoinStrategy::Ordering {
            self.resolve_pending(true)?;
        }
        self.window_split_steps += 1;
        self.note(stat_key, d2h, cpu, join, 0.0, t0, None, true);
        Ok(())
    }

    /// A split step under `flags`, queued without waiting for either engine: the pool's
    /// workers get the CPU arm (they spin on the mailbox's sequence word), the stream gets
    /// publish → GPU arm (between an event pair) → wait-fold, and the call returns. The host
    /// runs ahead and queues what follows (later steps and the kernels between them), so
    /// neither its launches nor a wake-up sit between one step's done word and the next
    /// step's publish; the arms' times are read when a later call finds the step complete.
    /// Trace fields: "d2h" is the workers' wait for the published x, "join" the host's time
    /// to queue the step (its "wall" is that too: the step's own wall is not seen here).
    fn run_flags_split(
        &mut self,
        stream: &Stream,
        kernels: &GemvKernels,
        act: &Activation,
        steps: &mut [SpilledStep<'_>],
        split: FlagsSplit,
        t0: Instant,
    ) -> Result<(), ExecError> {
        let (format, k) = (steps[0].weight.format(), steps[0].weight.k());
        let slot = self.take_slot()?;
        let fl = self.flags.as_mut().ok_or(ExecError::Invalid {
            what: "memory.join_strategy",
            value: "flags".into(),
            rule: "the executor was built for another strategy",
        })?;
        // A wait that timed out on the device at an earlier step left its rows unfolded.
        let fault = fl
            .mailbox
            .fault()
            .load(std::sync::atomic::Ordering::Acquire);
        if fault != 0 {
            return Err(ExecError::FlagsFault { step: fault });
        }
        fl.step = next_step(fl.step);
        let seq = fl.step;
        let mut offsets = fl.mailbox.offsets();
        if !self.timeline {
            offsets.fold_wait = None;
        }
        let parts = steps
            .iter()
            .zip(&split.cuts)
            .map(|(st, &(g, _))| ArmRows {
                weight: st.host.clone(),
                g,
                rows: st.weight.m() - g,
            })
            .collect();
        let ticket = self.pool.submit_flags(FlagsArm {
            format,
            k,
            parts,
            mailbox: fl.mailbox.clone(),
            step: seq,
            timeout: DEFAULT_FLAGS_TIMEOUT,
            tuning: self.flags_tuning,
        })?;
        let tuning = self.flags_tuning;
        let (flags_kernels, mem) = (&fl.kernels, &fl.mem);
        let (gpu_start, gpu_end) = &self.arm_events[slot];
        let ctx = &self.ctx;
        let (x, form) = (steps[0].x, steps[0].form);
        let timeline = self.step_events.get(slot).filter(|_| self.timeline);
        let queued = (|| -> Result<(), GpuError> {
            if let Some((pre_publish, _)) = timeline {
                pre_publish.record(stream)?;
            }
            // The GPU arm's time, which the controller balances against the CPU arm's, starts
            // before the publish: with tagged x the workers start while the publish still
            // runs, so the publish is part of what the CPU's arm overlaps (the timeline's
            // publish figure reads ~0 then). Timed from after it, the controller balanced the
            // arms' durations from different origins and every flags `auto` of the per-shape
            // table sat above the best pinned share; from before it, auto against the sweep's
            // best pinned shares rose on all six projections (15 interleaved rounds each,
            // docs/perf-checkpoints/2026-11-30-auto-per-shape-h200 record 03), and the old
            // timing then ran the layer at 0.984× (record 05).
            gpu_start.record(stream)?;
            if tuning.x_is_tagged(format) {
                flags_kernels.publish_tagged(
                    stream,
                    x,
                    k,
                    mem,
                    &offsets,
                    seq,
                    tuning.tagged_publish_blocks(),
                )?;
            } else {
                flags_kernels.publish(stream, x, k, mem, &offsets, seq)?;
            }
            for (st, &(g, _)) in steps.iter_mut().zip(&split.cuts) {
                let w = st.weight;
                kernels.gemv(stream, w, act, &mut *st.y, RowRange::new(0, g), st.form)?;
            }
            gpu_end.record(stream)?;
            let targets = steps
                .iter_mut()
                .zip(&split.cuts)
                .map(|(st, &(g, _))| {
                    FoldTarget::new(ctx, &mut *st.y, RowRange::new(g, st.weight.m()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            flags_kernels.wait_fold_targets(
                stream,
                mem,
                &offsets,
                seq,
                &targets,
                DoneWords::PerPart(ticket.cuts()),
                form,
                FLAGS_DEVICE_TIMEOUT,
            )?;
            if let Some((_, post_fold)) = timeline {
                post_fold.record(stream)?;
            }
            Ok(())
        })();
        if let Err(e) = queued {
            // Workers waiting for a publish that may never come stop now.
            ticket.cancel();
            return Err(gpu_err(e));
        }
        let (mut gpu_bytes, mut cpu_bytes) = (0u64, 0u64);
        for (st, &(g, rb)) in steps.iter().zip(&split.cuts) {
            gpu_bytes += (g * rb) as u64;
            cpu_bytes += ((st.weight.m() - g) * rb) as u64;
        }
        self.pending.push_back(PendingSplit {
            slot,
            key: split.key,
            stat_key: split.stat_key,
            gpu_bytes,
            cpu: ArmSample {
                engine: CPU_ENGINE,
                bytes: cpu_bytes,
                // Filled in from the ticket when the step is resolved.
                time: ArmTime::Exact { ns: 0.0 },
            },
            cpu_ticket: Some(ticket),
            timeline: self.timeline,
        });
        self.window_split_steps += 1;
        let queue = t0.elapsed().as_nanos() as f64;
        self.note(split.stat_key, 0.0, 0.0, queue, 0.0, t0, None, true);
        Ok(())
    }

    /// Several spilled steps over one activation (a layer's q/k/v, or gate/up), queued on
    /// `stream` in order. Under `flags`, when every step can be split and they share format,
    /// `k` and form, they run as one split step: one publish of x, one CPU arm over all their
    /// CPU rows, the GPU rows of each, one wait-fold into every output; the controller sees
    /// one sample of the summed bytes, under the steps' shared shape key. Otherwise (other
    /// strategies and modes, a step to refuse or probe, CPU rows past the mailbox) each step
    /// runs as [`OffloadExecutor::run`] would run it.
    pub fn run_shared(
        &mut self,
        stream: &Stream,
        kernels: &GemvKernels,
        act: &Activation,
        steps: &mut [SpilledStep<'_>],
    ) -> Result<(), ExecError> {
        let t0 = Instant::now();
        if let Some(split) = self.shared_flags_split(steps) {
            self.total_steps += steps.len() as u64;
            self.window_steps += steps.len() as u64;
            self.run_flags_split(stream, kernels, act, steps, split, t0)?;
            if self.total_steps.is_power_of_two() {
                self.trace_idle();
            }
            return Ok(());
        }
        for st in steps.iter_mut() {
            let step = SpilledStep {
                weight: st.weight,
                host: st.host.clone(),
                x: st.x,
                y: &mut *st.y,
                form: st.form,
            };
            self.run(stream, kernels, act, step)?;
        }
        Ok(())
    }

    /// The fused split of `steps` under `flags`, if they qualify (see
    /// [`OffloadExecutor::run_shared`]).
    fn shared_flags_split(&mut self, steps: &[SpilledStep<'_>]) -> Option<FlagsSplit> {
        let OffloadMode::Passback {
            strategy: JoinStrategy::Flags,
            ..
        } = self.mode
        else {
            return None;
        };
        let first = steps.first()?;
        let (format, k, form) = (first.weight.format(), first.weight.k(), first.form);
        if steps.len() > FOLD_MAX_TARGETS
            || steps.iter().any(|st| {
                st.weight.format() != format
                    || st.weight.k() != k
                    || st.form != form
                    || st.x.device_ptr() != first.x.device_ptr()
            })
        {
            return None;
        }
        let residual = matches!(form, GemvForm::Residual);
        let form = share_form(residual);
        let m_total = steps.iter().map(|st| st.weight.m()).sum();
        let key = self.shape_key(format, k, form);
        if self.controller.needs_probe(&key) {
            return None;
        }
        let shares = self.controller.shares(&key);
        let mut cuts = Vec::with_capacity(steps.len());
        for st in steps {
            let row_bytes = self.split_check(st).ok()?;
            let cut = cut_rows(st.weight.m(), row_bytes, &shares)?;
            cuts.push((cut[1].end, row_bytes));
        }
        let cpu_rows: usize = steps
            .iter()
            .zip(&cuts)
            .map(|(st, &(g, _))| st.weight.m() - g)
            .sum();
        if cpu_rows > self.flags.as_ref()?.mailbox.rows() {
            return None;
        }
        Some(FlagsSplit {
            key,
            stat_key: (format, m_total, k, residual),
            cuts,
        })
    }

    #[allow(clippy::too_many_arguments)] // one trace record's fields
    fn note(
        &mut self,
        key: (Format, usize, usize, bool),
        d2h: f64,
        cpu: f64,
        join: f64,
        up: f64,
        t0: Instant,
        refusal: Option<String>,
        split: bool,
    ) {
        let s = self.stats.entry(key).or_default();
        s.calls += 1;
        s.d2h_ns += d2h;
        s.cpu_ns += cpu;
        s.join_ns += join + up;
        s.wall_ns += t0.elapsed().as_nanos() as f64;
        if split {
            s.split += 1;
        }
        if refusal.is_some() {
            s.refusal = refusal;
        }
        if s.calls.is_power_of_two()
            && tracing::enabled!(target: TRACE_TARGET, tracing::Level::DEBUG)
        {
            let (format, m, k, residual) = key;
            let n = s.calls as f64;
            let fkey = ShapeKey {
                format,
                k,
                form: share_form(residual),
            };
            let snap = self.controller.snapshot(&fkey);
            let share = self.controller.gpu_share(&fkey);
            let bytes = step_bytes(format, m, k);
            let cpu_gbs =
                bytes as f64 * (1.0 - if s.split > 0 { share } else { 0.0 }) / (s.cpu_ns / n);
            let join = match &self.mode {
                OffloadMode::Passback { strategy, .. } => strategy.name(),
                m => m.name(),
            };
            tracing::debug!(
                target: TRACE_TARGET,
                format = %format, m, k, residual, join, calls = s.calls, split_steps = s.split,
                share, state = ?snap,
                mean_d2h_us = s.d2h_ns / n / 1e3, mean_multiply_us = s.cpu_ns / n / 1e3,
                mean_join_us = s.join_ns / n / 1e3,
                mean_gpu_arm_us = if s.split > 0 { s.gpu_ns / s.split as f64 / 1e3 } else { 0.0 },
                mean_wall_us = s.wall_ns / n / 1e3,
                cpu_gb_s = cpu_gbs, refusal = s.refusal.as_deref().unwrap_or("none"),
                "split: step gemv"
            );
        }
    }

    fn trace_idle(&mut self) {
        let wall = self.window_start.elapsed().as_nanos() as f64;
        // Only whole-CPU steps leave the GPU idle; a window of split steps alone has nothing
        // to report.
        if wall > 0.0
            && self.window_cpu_ns > 0.0
            && tracing::enabled!(target: TRACE_TARGET, tracing::Level::DEBUG)
        {
            tracing::debug!(
                target: TRACE_TARGET,
                window_steps = self.window_steps,
                wall_ms = wall / 1e6,
                cpu_ms = self.window_cpu_ns / 1e6,
                gpu_idle_pct = 100.0 * self.window_cpu_ns / wall,
                split_steps_excluded = self.window_split_steps,
                "cpu exec: idle (GPU-idle lower bound over the window; split steps are not counted as idle)"
            );
        }
        self.window_start = Instant::now();
        self.window_steps = 0;
        self.window_cpu_ns = 0.0;
        self.window_split_steps = 0;
    }
}

/// What a split step under `flags` needs from the common passback path.
struct FlagsSplit {
    key: ShapeKey,
    stat_key: (Format, usize, usize, bool),
    /// Per output: (first CPU row `g`, row bytes).
    cuts: Vec<(usize, usize)>,
}

fn step_bytes(format: Format, m: usize, k: usize) -> usize {
    format.row_bytes(k).map_or(0, |rb| rb * m)
}
