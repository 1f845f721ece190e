//! Batched spilled steps: projections over `cols` activation columns (the `cols` sequences of
//! a batched decode step), each weight row read once for all of them by whichever engine owns
//! it.
//!
//! This is where batching pays under a spill: a step over B sequences costs the host about the
//! bytes of one step — the GPU's rows cross PCIe once for B columns (`gemv_cols`) and the
//! CPU's rows leave DRAM once for B columns ([`crate::CpuPool::gemv_tokens`]) — so aggregate
//! decode rises with B until the arms turn compute-bound.
//!
//! The projections that read one activation (a layer's q/k/v, or gate/up) run as one split:
//! x comes down once, the CPU prepares it once and runs all their CPU rows in one pool job,
//! and the GPU arms of all of them are queued together. A batched split joins in its own way,
//! whatever `memory.join_strategy` says (the `flags` mailbox holds one column):
//! 1. x (and, residual, each column's CPU rows of y) down, an event after it;
//! 2. the GPU arms queued at once, so they start as soon as x is down;
//! 3. the host waits for that event alone, then runs the CPU arm;
//! 4. the CPU rows go up on the stream, and the host returns without waiting: it queues what
//!    follows (the kernels up to the next spilled projection and that one's x) while the GPU
//!    runs the rest of this one. The staging is safe to reuse because every writer of it first
//!    waits for a point the stream reaches after the previous rows went up (the next split's
//!    x event, or a stream synchronisation).
//!
//! Shares are the controller's for `ShapeKey::cols` (B rounded up to a power of two,
//! [`share_cols`]), probed and refined apart from decode's, because the CPU arm's cost per
//! byte grows with the columns while the GPU arm's host read does not.

use std::time::Instant;

use crate::engine::GpuEngine;
use hipfire_gpu::{Activation, DeviceMemory, GemvForm, RowRange, Stream, WeightRef};

use crate::offload::{
    f32s, f32s_mut, gpu_err, share_form, OffloadExecutor, PendingSplit, PlannerCore, SpilledStep,
    PROBE_REPS,
};
use crate::pool::GemvSegment;
use crate::share::{cut_rows, ArmSample, ArmTime, ShapeKey, CPU_ENGINE};
use crate::ExecError;

/// The controller's column count for a step of `cols` columns: the next power of two, so a
/// running batch whose size drifts (requests joining and leaving) probes at most one shape per
/// octave instead of one per size; the online refinement then tracks the sizes in between.
pub fn share_cols(cols: usize) -> usize {
    cols.max(1).next_power_of_two()
}

/// One projection over a spilled weight for `cols` activation columns, on the device.
pub struct SpilledBatch<'a> {
    /// The weight as the GPU sees it (host-mapped).
    pub weight: &'a WeightRef<'a>,
    /// The same bytes as the CPU sees them.
    pub host: std::sync::Arc<dyn crate::flags::WeightBytes>,
    /// `cols × k` f32, column `c` at `c·k` (what `act` was prepared from).
    pub x: &'a dyn DeviceMemory,
    /// `cols × m` f32, column `c` at `c·m`: written (plain) or accumulated into (residual).
    pub y: &'a mut dyn DeviceMemory,
    /// Plain or residual.
    pub form: GemvForm,
    /// Activation columns (≥ 1).
    pub cols: usize,
}

impl OffloadExecutor {
    /// Make room in the CPU arm's staging for batched steps of up to `cols` columns.
    pub fn reserve_columns(&mut self, cols: usize) -> Result<(), ExecError> {
        let c = &mut self.core;
        if cols <= c.max_cols {
            return Ok(());
        }
        c.x_host = c
            .ctx
            .alloc_pinned_host(c.max_k * cols * 4)
            .map_err(gpu_err)?;
        c.y_host = c
            .ctx
            .alloc_pinned_host(c.max_m * cols * 4)
            .map_err(gpu_err)?;
        c.max_cols = cols;
        Ok(())
    }

    /// Queue or run one spilled projection over `step.cols` columns on `stream`; `act` holds the
    /// columns prepared (`GemvKernels::prepare_cols`) from `step.x` on `stream`. One column is
    /// exactly [`OffloadExecutor::run`].
    pub fn run_cols(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        mut step: SpilledBatch<'_>,
    ) -> Result<(), ExecError> {
        self.run_cols_shared(stream, kernels, act, std::slice::from_mut(&mut step))
    }

    /// Several batched projections over one activation (a layer's q/k/v, or gate/up), queued
    /// on `stream` in order; `act` holds the columns of their shared x. When they share format,
    /// `k`, form, x and columns they run as one split (see the module's comment), the
    /// controller seeing one sample of the summed bytes under their shared shape key; otherwise
    /// each runs alone. One column is [`OffloadExecutor::run_shared`].
    pub fn run_cols_shared(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        steps: &mut [SpilledBatch<'_>],
    ) -> Result<(), ExecError> {
        let Some(first) = steps.first() else {
            return Ok(());
        };
        let (cols, x_ptr) = (first.cols, first.x.device_ptr());
        if steps.iter().all(|st| st.cols == 1) {
            let mut singles: Vec<SpilledStep<'_>> = steps
                .iter_mut()
                .map(|st| SpilledStep {
                    weight: st.weight,
                    host: st.host.clone(),
                    x: st.x,
                    y: &mut *st.y,
                    form: st.form,
                })
                .collect();
            return self.run_shared(stream, kernels, act, &mut singles);
        }
        for st in steps.iter() {
            self.core.check_cols(st)?;
        }
        let (format, k, form) = (first.weight.format(), first.weight.k(), first.form);
        let together = steps.iter().all(|st| {
            st.cols == cols
                && st.weight.format() == format
                && st.weight.k() == k
                && st.form == form
                && st.x.device_ptr() == x_ptr
        });
        if together {
            return self.run_cols_group(stream, kernels, act, steps);
        }
        for st in steps.iter_mut() {
            self.run_cols_group(stream, kernels, act, std::slice::from_mut(st))?;
        }
        Ok(())
    }

    /// One split (or one engine) over `steps`, which share format, `k`, form, x and columns
    /// (checked by the caller).
    fn run_cols_group(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        steps: &mut [SpilledBatch<'_>],
    ) -> Result<(), ExecError> {
        let t0 = Instant::now();
        let first = &steps[0];
        let (format, k, cols) = (first.weight.format(), first.weight.k(), first.cols);
        let residual = matches!(first.form, GemvForm::Residual);
        let m_total: usize = steps.iter().map(|st| st.weight.m()).sum();
        let n = steps.len() as u64;
        self.core.trace.total_steps += n;
        self.core.trace.window_steps += n;
        let stat_key = (format, m_total, k, residual);
        match self.core.mode.clone() {
            crate::offload::OffloadMode::Pcie => {
                for st in steps.iter_mut() {
                    let m = st.weight.m();
                    kernels
                        .enqueue_rows_cols(
                            stream,
                            st.weight,
                            act,
                            &mut *st.y,
                            m,
                            RowRange::all(m),
                            st.form,
                            cols,
                        )
                        .map_err(gpu_err)?;
                }
                self.core.trace.stats.entry(stat_key).or_default().calls += 1;
                return Ok(());
            }
            crate::offload::OffloadMode::Cpu => {
                let (d2h, cpu, up) = self.core.cpu_cols(stream, steps)?;
                self.core.note(stat_key, d2h, cpu, 0.0, up, t0, None, false);
                return Ok(());
            }
            crate::offload::OffloadMode::Passback { .. } => {}
        }
        let refusal = steps.iter().find_map(|st| {
            self.core
                .split_check_parts(st.weight, st.host.bytes().len(), st.weight.m(), residual)
                .err()
        });
        let key = ShapeKey {
            format,
            k,
            form: share_form(residual),
            cols: share_cols(cols),
        };
        if refusal.is_none() && self.core.controller.needs_probe(&key) {
            self.core.resolve_pending(true)?;
            let probe = self.core.probe_cols(stream, kernels, act, &steps[0]);
            self.core.seed_probed(key, probe);
        }
        let cuts: Option<Vec<usize>> = match &refusal {
            Some(_) => None,
            None => {
                let shares = self.core.controller.shares(&key);
                steps
                    .iter()
                    .map(|st| {
                        let w = st.weight;
                        cut_rows(w.m(), w.row_bytes(), &shares).map(|c| c[1].end)
                    })
                    .collect()
            }
        };
        let Some(gs) = cuts else {
            let (d2h, cpu, up) = self.core.cpu_cols(stream, steps)?;
            self.core.note(
                stat_key,
                d2h,
                cpu,
                0.0,
                up,
                t0,
                refusal.map(|r| r.to_string()),
                false,
            );
            return Ok(());
        };
        let (d2h, cpu, join) = self
            .core
            .split_cols(stream, kernels, act, steps, &gs, key, stat_key)?;
        self.core.trace.window_split_steps += 1;
        self.core
            .note(stat_key, d2h, cpu, join, 0.0, t0, None, true);
        Ok(())
    }
}

impl PlannerCore {
    /// A batched step's operands against its columns and the staging.
    fn check_cols(&self, step: &SpilledBatch<'_>) -> Result<(), ExecError> {
        let w = step.weight;
        let (m, k, cols) = (w.m(), w.k(), step.cols);
        if cols == 0 || cols > self.max_cols {
            return Err(ExecError::Shape {
                what: "batched step columns (reserve_columns first)",
                need: self.max_cols,
                got: cols,
            });
        }
        for (what, have, need) in [
            (
                "batched step x (cols × k f32)",
                step.x.byte_len(),
                cols * k * 4,
            ),
            (
                "batched step y (cols × m f32)",
                step.y.byte_len(),
                cols * m * 4,
            ),
            (
                "batched step weight bytes",
                step.host.bytes().len(),
                m * w.row_bytes(),
            ),
        ] {
            if have < need {
                return Err(ExecError::Shape {
                    what,
                    need,
                    got: have,
                });
            }
        }
        if k > self.max_k || m > self.max_m {
            return Err(ExecError::Shape {
                what: "batched step rows × k beyond the staging",
                need: self.max_m * self.max_k,
                got: m * k,
            });
        }
        Ok(())
    }

    /// Where each step's CPU rows sit in the packed staging (`cols × (m − g)` per step, one
    /// after another), in f32; errors if they do not fit.
    fn staging_offsets(
        &self,
        steps: &[SpilledBatch<'_>],
        gs: &[usize],
    ) -> Result<Vec<usize>, ExecError> {
        let mut offs = Vec::with_capacity(steps.len() + 1);
        let mut at = 0usize;
        for (st, &g) in steps.iter().zip(gs) {
            offs.push(at);
            at += st.cols * (st.weight.m() - g);
        }
        offs.push(at);
        let room = self.y_host.len() / 4;
        if at > room {
            return Err(ExecError::Shape {
                what: "batched CPU rows beyond the staging (rows × cols)",
                need: at,
                got: room,
            });
        }
        Ok(offs)
    }

    /// Every step wholly on the CPU: x (and, residual, y) down, the pool's multi-token GEMV into
    /// the staging, then up. Returns (d2h, multiply, h2d) ns.
    fn cpu_cols(
        &mut self,
        stream: &Stream,
        steps: &mut [SpilledBatch<'_>],
    ) -> Result<(f64, f64, f64), ExecError> {
        // The CPU's rows start at row 0 of every step.
        let gs = vec![0usize; steps.len()];
        let offs = self.staging_offsets(steps, &gs)?;
        let t = Instant::now();
        self.fetch_cols(stream, steps, &gs, &offs)?;
        self.await_cols()?;
        let d2h = t.elapsed().as_nanos() as f64;
        let cpu = self.multiply_cols(steps, &gs, &offs)?;
        let t = Instant::now();
        self.rows_up(stream, steps, &gs, &offs)?;
        self.timer.account.steps += 1;
        self.timer.account.arm_ns += cpu;
        self.timer.break_chain();
        self.trace.window_cpu_ns += d2h + cpu;
        Ok((d2h, cpu, t.elapsed().as_nanos() as f64))
    }

    /// Queue the CPU arm's inputs down, then the event [`PlannerCore::await_cols`] waits for:
    /// the columns of x and, residual, rows `[g, m)` of each column of each step's y (packed
    /// in the staging at `offs`).
    fn fetch_cols(
        &mut self,
        stream: &Stream,
        steps: &[SpilledBatch<'_>],
        gs: &[usize],
        offs: &[usize],
    ) -> Result<(), ExecError> {
        let first = &steps[0];
        let (k, cols) = (first.weight.k(), first.cols);
        stream
            .memcpy_dtoh_async(&mut self.x_host, 0, first.x, 0, cols * k * 4)
            .map_err(gpu_err)?;
        for ((st, &g), &off) in steps.iter().zip(gs).zip(offs) {
            if !matches!(st.form, GemvForm::Residual) {
                continue;
            }
            let (m, span) = (st.weight.m(), st.weight.m() - g);
            for c in 0..cols {
                stream
                    .memcpy_dtoh_async(
                        &mut self.y_host,
                        (off + c * span) * 4,
                        &*st.y,
                        (c * m + g) * 4,
                        span * 4,
                    )
                    .map_err(gpu_err)?;
            }
        }
        self.cols_ready.record(stream).map_err(gpu_err)?;
        Ok(())
    }

    /// Block until the inputs [`PlannerCore::fetch_cols`] queued are down; then read the
    /// timings of earlier splits (the stream has passed them).
    fn await_cols(&mut self) -> Result<(), ExecError> {
        self.cols_ready.synchronize().map_err(gpu_err)?;
        self.resolve_pending(true)
    }

    /// Rows `[g, m)` of every step's weight over every staged column into the packed staging;
    /// ns.
    fn multiply_cols(
        &mut self,
        steps: &[SpilledBatch<'_>],
        gs: &[usize],
        offs: &[usize],
    ) -> Result<f64, ExecError> {
        let first = &steps[0];
        let (format, k, cols) = (first.weight.format(), first.weight.k(), first.cols);
        let t = Instant::now();
        let total = offs.last().copied().unwrap_or(0);
        let mut rest = f32s_mut(&mut self.y_host, total);
        let mut segs = Vec::with_capacity(steps.len());
        for (i, (st, &g)) in steps.iter().zip(gs).enumerate() {
            let rb = st.weight.row_bytes();
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(offs[i + 1] - offs[i]);
            rest = tail;
            segs.push(GemvSegment {
                w: &st.host.bytes()[g * rb..st.weight.m() * rb],
                y: mine,
                accumulate: matches!(st.form, GemvForm::Residual),
            });
        }
        let xs = f32s(&self.x_host, cols * k);
        self.pool.gemv_tokens(format, k, xs, &mut segs)?;
        Ok(t.elapsed().as_nanos() as f64)
    }

    /// Queue the packed CPU rows `[g, m)` of every column of every step up into its y.
    fn rows_up(
        &mut self,
        stream: &Stream,
        steps: &mut [SpilledBatch<'_>],
        gs: &[usize],
        offs: &[usize],
    ) -> Result<(), ExecError> {
        for ((st, &g), &off) in steps.iter_mut().zip(gs).zip(offs) {
            let (m, cols) = (st.weight.m(), st.cols);
            let span = m - g;
            for c in 0..cols {
                stream
                    .memcpy_htod_async(
                        &mut *st.y,
                        (c * m + g) * 4,
                        &self.y_host,
                        (off + c * span) * 4,
                        span * 4,
                    )
                    .map_err(gpu_err)?;
            }
        }
        Ok(())
    }

    /// The split of `steps` at `gs`: x down, the GPU rows `[0, g)` of every step and column
    /// queued between an event pair, the CPU rows `[g, m)` once x is down, then the CPU rows
    /// queued up, without a host wait (see the module's comment); the arms' times go to the
    /// controller under `key`. Returns (d2h, cpu, join) ns.
    #[allow(clippy::too_many_arguments)] // the steps, their cuts and their two keys
    fn split_cols(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        steps: &mut [SpilledBatch<'_>],
        gs: &[usize],
        key: ShapeKey,
        stat_key: (hipfire_quant::Format, usize, usize, bool),
    ) -> Result<(f64, f64, f64), ExecError> {
        let offs = self.staging_offsets(steps, gs)?;
        let t = Instant::now();
        self.fetch_cols(stream, steps, gs, &offs)?;
        let slot = self.take_slot()?;
        let (gpu_start, gpu_end) = &self.timer.arm_events[slot];
        gpu_start.record(stream).map_err(gpu_err)?;
        let (mut gpu_bytes, mut cpu_bytes) = (0u64, 0u64);
        for (st, &g) in steps.iter_mut().zip(gs) {
            let (m, rb) = (st.weight.m(), st.weight.row_bytes());
            kernels
                .enqueue_rows_cols(
                    stream,
                    st.weight,
                    act,
                    &mut *st.y,
                    m,
                    RowRange::new(0, g),
                    st.form,
                    st.cols,
                )
                .map_err(gpu_err)?;
            gpu_bytes += (g * rb) as u64;
            cpu_bytes += ((m - g) * rb) as u64;
        }
        gpu_end.record(stream).map_err(gpu_err)?;
        self.await_cols()?;
        let d2h = t.elapsed().as_nanos() as f64;
        let cpu = self.multiply_cols(steps, gs, &offs)?;
        let t = Instant::now();
        self.rows_up(stream, steps, gs, &offs)?;
        self.timer.pending.push_back(PendingSplit {
            slot,
            key,
            stat_key,
            gpu_bytes,
            cpu: ArmSample {
                engine: CPU_ENGINE,
                bytes: cpu_bytes,
                time: ArmTime::Exact { ns: cpu },
            },
            cpu_ticket: None,
            timeline: false,
        });
        Ok((d2h, cpu, t.elapsed().as_nanos() as f64))
    }

    /// Both engines alone over the whole step (medians of [`PROBE_REPS`]), into scratch.
    fn probe_cols(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        step: &SpilledBatch<'_>,
    ) -> Result<Vec<ArmSample>, ExecError> {
        let w = step.weight;
        let (m, k, cols) = (w.m(), w.k(), step.cols);
        let mut scratch = self.ctx.alloc::<f32>(cols * m).map_err(gpu_err)?;
        let mut gpu = Vec::with_capacity(PROBE_REPS);
        for _ in 0..PROBE_REPS {
            gpu.push(crate::offload::event_timed_ns(
                stream,
                &self.probe_start,
                &self.probe_end,
                || {
                    kernels.enqueue_rows_cols(
                        stream,
                        w,
                        act,
                        &mut scratch,
                        m,
                        RowRange::all(m),
                        GemvForm::Plain,
                        cols,
                    )
                },
            )?);
        }
        stream
            .memcpy_dtoh_async(&mut self.x_host, 0, step.x, 0, cols * k * 4)
            .map_err(gpu_err)?;
        stream.synchronize().map_err(gpu_err)?;
        let xs: Vec<f32> = crate::offload::f32s(&self.x_host, cols * k).to_vec();
        let mut out = vec![0f32; cols * m];
        let mut cpu = Vec::with_capacity(PROBE_REPS);
        for _ in 0..PROBE_REPS {
            let t = Instant::now();
            let mut segs = [GemvSegment {
                w: &step.host.bytes()[..m * w.row_bytes()],
                y: &mut out,
                accumulate: false,
            }];
            self.pool.gemv_tokens(w.format(), k, &xs, &mut segs)?;
            cpu.push(t.elapsed().as_nanos() as f64);
        }
        Ok(crate::offload::probe_samples(
            (m * w.row_bytes()) as u64,
            &mut cpu,
            &mut gpu,
        ))
    }
}
