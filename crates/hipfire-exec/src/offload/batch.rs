//! Batched spilled steps: one projection over `cols` activation columns (the `cols` sequences
//! of a batched decode step), each weight row read once for all of them by whichever engine
//! owns it.
//!
//! This is where batching pays under a spill: a step over B sequences costs the host about the
//! bytes of one step — the GPU's rows cross PCIe once for B columns (`gemv_cols`) and the
//! CPU's rows leave DRAM once for B columns ([`crate::CpuPool::gemv_tokens`]) — so aggregate
//! decode rises with B until the arms turn compute-bound.
//!
//! A batched split always joins as `ordering` does (x down blocking, GPU arm queued, CPU arm,
//! CPU rows up, host wait): the `flags` mailbox holds one column, and with B columns the
//! host-side join is a smaller part of a longer step. Its shares are the controller's for
//! `ShapeKey::cols` (B rounded up to a power of two, [`share_cols`]), probed and refined apart
//! from decode's, because the CPU arm's cost per byte grows with the columns while the GPU
//! arm's host read does not.

use std::time::Instant;

use hipfire_gpu::{Activation, DeviceMemory, GemvForm, GemvKernels, RowRange, Stream, WeightRef};

use crate::offload::{
    f32s_mut, gpu_err, share_form, OffloadExecutor, PendingSplit, PlannerCore, SpilledStep,
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
        kernels: &GemvKernels,
        act: &Activation,
        mut step: SpilledBatch<'_>,
    ) -> Result<(), ExecError> {
        if step.cols == 1 {
            return self.run(
                stream,
                kernels,
                act,
                SpilledStep {
                    weight: step.weight,
                    host: step.host,
                    x: step.x,
                    y: step.y,
                    form: step.form,
                },
            );
        }
        let w = step.weight;
        let (m, k, cols) = (w.m(), w.k(), step.cols);
        if cols == 0 || cols > self.core.max_cols {
            return Err(ExecError::Shape {
                what: "batched step columns (reserve_columns first)",
                need: self.core.max_cols,
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
        if k > self.core.max_k || m > self.core.max_m {
            return Err(ExecError::Shape {
                what: "batched step rows × k beyond the staging",
                need: self.core.max_m * self.core.max_k,
                got: m * k,
            });
        }
        let t0 = Instant::now();
        self.core.trace.total_steps += 1;
        self.core.trace.window_steps += 1;
        let residual = matches!(step.form, GemvForm::Residual);
        let stat_key = (w.format(), m, k, residual);
        match self.core.mode.clone() {
            crate::offload::OffloadMode::Pcie => {
                kernels
                    .gemv_cols(stream, w, act, step.y, m, RowRange::all(m), step.form, cols)
                    .map_err(gpu_err)?;
                self.core.trace.stats.entry(stat_key).or_default().calls += 1;
                return Ok(());
            }
            crate::offload::OffloadMode::Cpu => {
                let (d2h, cpu, up) = self.core.cpu_cols(stream, &mut step, 0)?;
                self.core.note(stat_key, d2h, cpu, 0.0, up, t0, None, false);
                return Ok(());
            }
            crate::offload::OffloadMode::Passback { .. } => {}
        }
        let refusal = self
            .core
            .split_check_parts(w, step.host.bytes().len(), m, residual)
            .err();
        let row_bytes = w.row_bytes();
        let key = ShapeKey {
            format: w.format(),
            k,
            form: share_form(residual),
            cols: share_cols(cols),
        };
        if refusal.is_none() && self.core.controller.needs_probe(&key) {
            self.core.resolve_pending(true)?;
            let probe = self.core.probe_cols(stream, kernels, act, &step);
            self.core.seed_probed(key, probe);
        }
        let cut = match &refusal {
            Some(_) => None,
            None => cut_rows(m, row_bytes, &self.core.controller.shares(&key)),
        };
        let Some(cut) = cut else {
            let (d2h, cpu, up) = self.core.cpu_cols(stream, &mut step, 0)?;
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
        let g = cut[1].end;
        let (d2h, cpu, join) = self
            .core
            .split_cols(stream, kernels, act, step, g, key, stat_key)?;
        self.core.trace.window_split_steps += 1;
        self.core
            .note(stat_key, d2h, cpu, join, 0.0, t0, None, true);
        Ok(())
    }
}

impl PlannerCore {
    /// The CPU rows `[g, m)` of every column: x (and, residual, those rows of y) down, the pool's
    /// multi-token GEMV over them into the staging (packed `cols × (m − g)`), then up. Returns
    /// (d2h, multiply, h2d) ns. With `g = 0` this is the whole step on the CPU.
    fn cpu_cols(
        &mut self,
        stream: &Stream,
        step: &mut SpilledBatch<'_>,
        g: usize,
    ) -> Result<(f64, f64, f64), ExecError> {
        let d2h = self.fetch_cols(stream, step, g)?;
        let cpu = self.multiply_cols(step, g)?;
        let t = Instant::now();
        self.rows_up(stream, step, g)?;
        stream.synchronize().map_err(gpu_err)?;
        self.timer.account.steps += 1;
        self.timer.account.arm_ns += cpu;
        self.timer.break_chain();
        self.trace.window_cpu_ns += d2h + cpu;
        Ok((d2h, cpu, t.elapsed().as_nanos() as f64))
    }

    /// The CPU arm's inputs, blocking: the `cols` columns of x and, residual, rows `[g, m)` of
    /// each column of y (packed in the staging); then pending GPU timings are read.
    fn fetch_cols(
        &mut self,
        stream: &Stream,
        step: &SpilledBatch<'_>,
        g: usize,
    ) -> Result<f64, ExecError> {
        let (m, k, cols) = (step.weight.m(), step.weight.k(), step.cols);
        let t = Instant::now();
        stream
            .memcpy_dtoh_async(&mut self.x_host, 0, step.x, 0, cols * k * 4)
            .map_err(gpu_err)?;
        if matches!(step.form, GemvForm::Residual) {
            let span = m - g;
            for c in 0..cols {
                stream
                    .memcpy_dtoh_async(
                        &mut self.y_host,
                        c * span * 4,
                        &*step.y,
                        (c * m + g) * 4,
                        span * 4,
                    )
                    .map_err(gpu_err)?;
            }
        }
        stream.synchronize().map_err(gpu_err)?;
        self.resolve_pending(true)?;
        Ok(t.elapsed().as_nanos() as f64)
    }

    /// Rows `[g, m)` of the weight over every staged column into the packed staging; ns.
    fn multiply_cols(&mut self, step: &SpilledBatch<'_>, g: usize) -> Result<f64, ExecError> {
        let w = step.weight;
        let (m, k, cols) = (w.m(), w.k(), step.cols);
        let rb = w.row_bytes();
        let t = Instant::now();
        let xs: Vec<f32> = crate::offload::f32s(&self.x_host, cols * k).to_vec();
        let mut segs = [GemvSegment {
            w: &step.host.bytes()[g * rb..m * rb],
            y: f32s_mut(&mut self.y_host, cols * (m - g)),
            accumulate: matches!(step.form, GemvForm::Residual),
        }];
        self.pool.gemv_tokens(w.format(), k, &xs, &mut segs)?;
        Ok(t.elapsed().as_nanos() as f64)
    }

    /// Queue the packed CPU rows `[g, m)` of every column up into y.
    fn rows_up(
        &mut self,
        stream: &Stream,
        step: &mut SpilledBatch<'_>,
        g: usize,
    ) -> Result<(), ExecError> {
        let (m, cols) = (step.weight.m(), step.cols);
        let span = m - g;
        for c in 0..cols {
            stream
                .memcpy_htod_async(
                    &mut *step.y,
                    (c * m + g) * 4,
                    &self.y_host,
                    c * span * 4,
                    span * 4,
                )
                .map_err(gpu_err)?;
        }
        Ok(())
    }

    /// GPU rows `[0, g)` of every column queued between an event pair, CPU rows `[g, m)`
    /// meanwhile, then the CPU rows up and a host wait; the arms' times go to the controller
    /// under `key`. Returns (d2h, cpu, join) ns.
    #[allow(clippy::too_many_arguments)] // the step, its cut and its two keys
    fn split_cols(
        &mut self,
        stream: &Stream,
        kernels: &GemvKernels,
        act: &Activation,
        mut step: SpilledBatch<'_>,
        g: usize,
        key: ShapeKey,
        stat_key: (hipfire_quant::Format, usize, usize, bool),
    ) -> Result<(f64, f64, f64), ExecError> {
        let w = step.weight;
        let (m, cols) = (w.m(), step.cols);
        let rb = w.row_bytes();
        let d2h = self.fetch_cols(stream, &step, g)?;
        let slot = self.take_slot()?;
        let (gpu_start, gpu_end) = &self.timer.arm_events[slot];
        gpu_start.record(stream).map_err(gpu_err)?;
        kernels
            .gemv_cols(
                stream,
                w,
                act,
                &mut *step.y,
                m,
                RowRange::new(0, g),
                step.form,
                cols,
            )
            .map_err(gpu_err)?;
        gpu_end.record(stream).map_err(gpu_err)?;
        let cpu = self.multiply_cols(&step, g)?;
        let t = Instant::now();
        self.rows_up(stream, &mut step, g)?;
        self.timer.pending.push_back(PendingSplit {
            slot,
            key,
            stat_key,
            gpu_bytes: (g * rb) as u64,
            cpu: ArmSample {
                engine: CPU_ENGINE,
                bytes: ((m - g) * rb) as u64,
                time: ArmTime::Exact { ns: cpu },
            },
            cpu_ticket: None,
            timeline: false,
        });
        stream.synchronize().map_err(gpu_err)?;
        self.resolve_pending(true)?;
        Ok((d2h, cpu, t.elapsed().as_nanos() as f64))
    }

    /// Both engines alone over the whole step (medians of [`PROBE_REPS`]), into scratch.
    fn probe_cols(
        &mut self,
        stream: &Stream,
        kernels: &GemvKernels,
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
                    kernels.gemv_cols(
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
