//! The `hipfire::cpu_exec` trace (`HIPFIRE_CPU_EXEC_TRACE=1`).
//!
//! One line per distinct shape `(format, m, k, form)` at its 1st call and every power-of-two
//! call count after (so a long run prints O(log n) lines), with that shape's own means; and a
//! GPU-idle window line whenever the total count of host-executed steps reaches a power of two.
//! Windows, not cumulative totals, because a benchmark decodes several times per process; quote
//! the last window. The `calls=1` line is the cold first touch (page faults, probe).
//!
//! [`Trace`] only builds the lines (so tests read them); the planner emits each as one
//! structured `tracing` event on [`TRACE_TARGET`].

use crate::join::SplitTimes;
use crate::refusal::Refusal;
use crate::share::{Form, ShapeSnapshot};
use hipfire_quant::Format;
use std::collections::HashMap;
use std::time::Instant;

/// Environment variable that turns the trace on (`1`).
pub const TRACE_ENV: &str = "HIPFIRE_CPU_EXEC_TRACE";

/// The `tracing` target of every line.
pub const TRACE_TARGET: &str = "hipfire::cpu_exec";

/// True iff [`TRACE_ENV`] is set to `1`.
pub fn trace_from_env() -> bool {
    std::env::var(TRACE_ENV)
        .map(|v| v.trim() == "1")
        .unwrap_or(false)
}

/// A shape as the trace groups it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceKey {
    /// Format.
    pub format: Format,
    /// Rows.
    pub m: usize,
    /// Row length.
    pub k: usize,
    /// Plain or residual.
    pub form: Form,
}

/// Running sums of one shape.
#[derive(Debug, Default, Clone)]
struct ShapeSums {
    calls: u64,
    d2h_ns: f64,
    cpu_ns: f64,
    gpu_ns: f64,
    join_ns: f64,
    cpu_bytes: f64,
    gpu_bytes: f64,
}

/// One GPU-idle window.
#[derive(Debug, Clone)]
struct Window {
    start: Instant,
    steps: u64,
    cpu_ns: f64,
    split_steps: u64,
    split_gpu_rows: u64,
    split_ns: f64,
}

impl Window {
    fn new() -> Window {
        Window {
            start: Instant::now(),
            steps: 0,
            cpu_ns: 0.0,
            split_steps: 0,
            split_gpu_rows: 0,
            split_ns: 0.0,
        }
    }
}

/// Trace state kept by the planner.
#[derive(Debug)]
pub struct Trace {
    enabled: bool,
    shapes: HashMap<TraceKey, ShapeSums>,
    host_steps: u64,
    split_steps: u64,
    window: Window,
}

fn is_pow2_point(n: u64) -> bool {
    n.is_power_of_two()
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

impl Trace {
    /// A trace; `enabled == false` makes every call a no-op returning no lines.
    pub fn new(enabled: bool) -> Trace {
        Trace {
            enabled,
            shapes: HashMap::new(),
            host_steps: 0,
            split_steps: 0,
            window: Window::new(),
        }
    }

    /// Whether lines are produced.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A step that ran whole on the CPU (`why`: the refusal, or `None` for `cpu` mode).
    pub fn whole_cpu(
        &mut self,
        key: TraceKey,
        d2h_ns: f64,
        cpu_ns: f64,
        why: Option<&Refusal>,
    ) -> Vec<String> {
        if !self.enabled {
            return Vec::new();
        }
        let s = self.shapes.entry(key).or_default();
        s.calls += 1;
        s.d2h_ns += d2h_ns;
        s.cpu_ns += cpu_ns;
        let calls = s.calls;
        let n = calls as f64;
        let mut lines = Vec::new();
        if is_pow2_point(calls) {
            let reason = why.map(|r| format!(" refused: {r} |")).unwrap_or_default();
            lines.push(format!(
                "cpu exec: step gemv m={} k={} quant={} residual={} |{} {} calls | {} steps on CPU, {} split | mean per step: d2h={:.3}ms gemv={:.3}ms",
                key.m,
                key.k,
                key.format,
                key.form == Form::Residual,
                reason,
                calls,
                self.host_steps + 1 - self.split_steps,
                self.split_steps,
                ms(s.d2h_ns / n),
                ms(s.cpu_ns / n),
            ));
        }
        self.window.cpu_ns += d2h_ns + cpu_ns;
        lines.extend(self.count_step());
        lines
    }

    /// A split step: GPU rows `[0, g)` of `m`, with its times and the scheduler state.
    pub fn split(
        &mut self,
        key: TraceKey,
        g: usize,
        row_bytes: usize,
        t: &SplitTimes,
        state: Option<&ShapeSnapshot>,
    ) -> Vec<String> {
        if !self.enabled {
            return Vec::new();
        }
        self.split_steps += 1;
        let gpu_ns = match t.gpu {
            crate::share::ArmTime::Exact { ns } | crate::share::ArmTime::FinishedBy { ns } => ns,
        };
        let s = self.shapes.entry(key).or_default();
        s.calls += 1;
        s.d2h_ns += t.d2h_ns;
        s.cpu_ns += t.cpu_ns;
        s.gpu_ns += gpu_ns;
        s.join_ns += t.join_ns;
        s.cpu_bytes += ((key.m - g) * row_bytes) as f64;
        s.gpu_bytes += (g * row_bytes) as f64;
        let calls = s.calls;
        let n = calls as f64;
        let mut lines = Vec::new();
        if is_pow2_point(calls) {
            let st = state
                .map(|st| {
                    format!(
                        " ({:?}, seed {:?}, target={:.3}, {} windows, {} reopens, {} re-centred)",
                        st.phase, st.seed, st.target, st.windows, st.reopens, st.refines
                    )
                    .to_lowercase()
                })
                .unwrap_or_default();
            lines.push(format!(
                "split: step gemv m={} k={} quant={} residual={} gpu_rows={}/{} share={:.3}{} | {} calls | {} steps on host ({} split) | mean per split step: d2h={:.3}ms cpu={:.3}ms gpu={:.3}ms join={:.3}ms | cpu={:.1}GB/s gpu={:.1}GB/s",
                key.m,
                key.k,
                key.format,
                key.form == Form::Residual,
                g,
                key.m,
                g as f64 / key.m as f64,
                st,
                calls,
                self.host_steps + 1,
                self.split_steps,
                ms(s.d2h_ns / n),
                ms(s.cpu_ns / n),
                ms(s.gpu_ns / n),
                ms(s.join_ns / n),
                s.cpu_bytes / s.cpu_ns.max(1.0),
                s.gpu_bytes / s.gpu_ns.max(1.0),
            ));
        }
        self.window.split_steps += 1;
        self.window.split_gpu_rows += g as u64;
        self.window.split_ns += t.wall_ns;
        lines.extend(self.count_step());
        lines
    }

    /// Count a host-executed step; at a power of two, close the idle window.
    fn count_step(&mut self) -> Vec<String> {
        self.host_steps += 1;
        self.window.steps += 1;
        if !is_pow2_point(self.host_steps) {
            return Vec::new();
        }
        let w = std::mem::replace(&mut self.window, Window::new());
        let wall_ns = w.start.elapsed().as_nanos() as f64;
        let cpu_steps = w.steps - w.split_steps;
        let idle = if wall_ns > 0.0 {
            100.0 * w.cpu_ns / wall_ns
        } else {
            0.0
        };
        let mut line = format!(
            "cpu exec: idle {:.1}% — window ending at step {} covers {} steps: {:.3}ms wall, {:.3}ms on CPU ({:.0}us CPU/step) — GPU-idle lower bound",
            idle.min(100.0),
            self.host_steps,
            w.steps,
            ms(wall_ns),
            ms(w.cpu_ns),
            if cpu_steps > 0 { w.cpu_ns / cpu_steps as f64 / 1e3 } else { 0.0 },
        );
        if w.split_steps > 0 {
            line.push_str(&format!(
                "; {} split steps ({} rows on GPU, {:.3}ms split wall) not counted as CPU-idle",
                w.split_steps,
                w.split_gpu_rows,
                ms(w.split_ns)
            ));
        }
        vec![line]
    }
}
