//! The planner's `hipfire::cpu_exec` trace (`HIPFIRE_CPU_EXEC_TRACE=1` enables it at debug):
//! per-shape running totals, one line at every power-of-two call count, and the GPU-idle
//! window of whole-CPU steps.

use std::collections::HashMap;
use std::time::Instant;

use hipfire_quant::Format;

use crate::offload::{share_form, OffloadMode, PlannerCore};
use crate::share::ShapeKey;

/// Trace target for spilled-step lines (`HIPFIRE_CPU_EXEC_TRACE=1` enables it at debug).
pub const TRACE_TARGET: &str = "hipfire::cpu_exec";

/// Running totals for one shape's trace line.
#[derive(Debug, Default, Clone)]
pub(crate) struct ShapeStats {
    pub(crate) calls: u64,
    split: u64,
    pub(crate) d2h_ns: f64,
    pub(crate) cpu_ns: f64,
    pub(crate) gpu_ns: f64,
    join_ns: f64,
    wall_ns: f64,
    refusal: Option<String>,
}

/// Running totals per shape and the `cpu exec: idle` window.
pub(crate) struct Trace {
    pub(crate) stats: HashMap<(Format, usize, usize, bool), ShapeStats>,
    /// `cpu exec: idle` window: steps, wall and CPU time since the window opened.
    pub(crate) window_start: Instant,
    pub(crate) window_steps: u64,
    pub(crate) window_cpu_ns: f64,
    pub(crate) window_split_steps: u64,
    pub(crate) total_steps: u64,
}

impl Trace {
    pub(crate) fn new() -> Trace {
        Trace {
            stats: HashMap::new(),
            window_start: Instant::now(),
            window_steps: 0,
            window_cpu_ns: 0.0,
            window_split_steps: 0,
            total_steps: 0,
        }
    }
}

impl PlannerCore {
    /// Add one step to its shape's totals; trace the shape at power-of-two call counts.
    #[allow(clippy::too_many_arguments)] // one trace record's fields
    pub(crate) fn note(
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
        let s = self.trace.stats.entry(key).or_default();
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
                cols: 1,
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

    /// Trace the GPU-idle window and open a new one.
    pub(crate) fn trace_idle(&mut self) {
        let wall = self.trace.window_start.elapsed().as_nanos() as f64;
        // Only whole-CPU steps leave the GPU idle; a window of split steps alone has nothing
        // to report.
        if wall > 0.0
            && self.trace.window_cpu_ns > 0.0
            && tracing::enabled!(target: TRACE_TARGET, tracing::Level::DEBUG)
        {
            tracing::debug!(
                target: TRACE_TARGET,
                window_steps = self.trace.window_steps,
                wall_ms = wall / 1e6,
                cpu_ms = self.trace.window_cpu_ns / 1e6,
                gpu_idle_pct = 100.0 * self.trace.window_cpu_ns / wall,
                split_steps_excluded = self.trace.window_split_steps,
                "cpu exec: idle (GPU-idle lower bound over the window; split steps are not counted as idle)"
            );
        }
        self.trace.window_start = Instant::now();
        self.trace.window_steps = 0;
        self.trace.window_cpu_ns = 0.0;
        self.trace.window_split_steps = 0;
    }
}

fn step_bytes(format: Format, m: usize, k: usize) -> usize {
    format.row_bytes(k).map_or(0, |rb| rb * m)
}
