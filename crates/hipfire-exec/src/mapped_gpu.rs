//! A real GPU behind [`GpuEngine`] for host-operand steps, over hipfire-gpu.
//!
//! The planner's steps keep `x` and `y` in host memory; this engine stages them through small
//! pinned host-mapped buffers the kernels read and write directly (`k` and `m` floats: tens of
//! KiB over the link against the MiBs of weight each arm reads), launches the format's
//! row-range GEMV over the spilled weight's own host-mapped bytes, and times the arm with an
//! event pair. Weights are registered once ([`MappedGpuEngine::add_weight`]); a step names one
//! by [`GpuWeightId`] and must pass the *same* bytes as its host view, which is checked, so the
//! two arms can never read different matrices.
//!
//! Device-resident activations (the decode path) are the [`crate::offload`] executor's job.
//! This engine exists so the actor path (planner, GPU actor, pool, scheduler, trace) runs on
//! the device unchanged; its GPU tier test is `tests/planner_gpu.rs`.

use crate::error::ExecError;
use crate::gpu::GpuEngine;
use crate::share::{ArmTime, Form};
use crate::step::{GpuWeightId, WeightView};
use hipfire_gpu::{
    Activation, Context, Event, GemvForm, GemvKernels, GpuError, HostMappedBuffer, KernelRegistry,
    RowRange, Stream, WeightRef,
};
use hipfire_quant::Format;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

fn gpu_err(e: GpuError) -> ExecError {
    ExecError::Device(e)
}

/// Bytes of one f32.
const F32_BYTES: usize = 4;

/// See the module docs.
pub struct MappedGpuEngine {
    ctx: Arc<Context>,
    stream: Stream,
    kernels: GemvKernels,
    /// Prepared activation per `k` (allocated on first use of a width).
    acts: HashMap<usize, Activation>,
    /// Pinned, device-mapped staging for `x` (`max_k` floats).
    x_map: HostMappedBuffer,
    /// Pinned, device-mapped staging for the output (`max_m` floats, indexed by absolute row).
    y_map: HostMappedBuffer,
    start: Event,
    end: Event,
    weights: HashMap<GpuWeightId, Arc<HostMappedBuffer>>,
    next_id: u64,
}

impl std::fmt::Debug for MappedGpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedGpuEngine")
            .field("weights", &self.weights.len())
            .finish_non_exhaustive()
    }
}

impl MappedGpuEngine {
    /// An engine on `ctx` for rows up to `max_k` elements and outputs up to `max_m` rows;
    /// compiles (or loads from the kernel cache) the GEMV module.
    pub fn new(
        ctx: &Arc<Context>,
        max_k: usize,
        max_m: usize,
    ) -> Result<MappedGpuEngine, ExecError> {
        let registry = KernelRegistry::new(ctx);
        let kernels = GemvKernels::new(&registry).map_err(gpu_err)?;
        Ok(MappedGpuEngine {
            ctx: ctx.clone(),
            stream: ctx.new_stream().map_err(gpu_err)?,
            kernels,
            acts: HashMap::new(),
            x_map: ctx
                .alloc_host_mapped(max_k.max(1) * F32_BYTES)
                .map_err(gpu_err)?,
            y_map: ctx
                .alloc_host_mapped(max_m.max(1) * F32_BYTES)
                .map_err(gpu_err)?,
            start: ctx.new_event().map_err(gpu_err)?,
            end: ctx.new_event().map_err(gpu_err)?,
            weights: HashMap::new(),
            next_id: 0,
        })
    }

    /// Register a spilled weight's pinned buffer; pass the returned id as `WeightView::gpu` and
    /// `buf.as_slice()` (a clone of the same `Arc`) as `WeightView::host`.
    pub fn add_weight(&mut self, buf: Arc<HostMappedBuffer>) -> GpuWeightId {
        let id = GpuWeightId(self.next_id);
        self.next_id += 1;
        self.weights.insert(id, buf);
        id
    }
}

/// `bytes[..4n]` as f32s.
fn as_f32(buf: &HostMappedBuffer) -> &[f32] {
    let bytes = buf.as_slice();
    // SAFETY: pinned allocations are page-aligned (so 4-aligned); every bit pattern is an f32;
    // the length is rounded down to whole floats.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), bytes.len() / F32_BYTES) }
}

/// Mutable [`as_f32`].
fn as_f32_mut(buf: &mut HostMappedBuffer) -> &mut [f32] {
    let bytes = buf.as_mut_slice();
    // SAFETY: as in `as_f32`, with the unique borrow of `buf`.
    unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<f32>(), bytes.len() / F32_BYTES)
    }
}

impl GpuEngine for MappedGpuEngine {
    fn label(&self) -> String {
        format!("{} (host-mapped operands)", self.ctx.info().name)
    }

    fn has_kernel(&self, format: Format, _form: Form) -> bool {
        // GemvKernels loads the plain and residual kernel of every format it knows.
        format.has_gpu_kernel()
    }

    fn gemv_rows(
        &mut self,
        w: &WeightView<'_>,
        x: &[f32],
        rows: Range<usize>,
        y_rows: &mut [f32],
        form: Form,
    ) -> Result<ArmTime, ExecError> {
        let id = w.gpu.ok_or(ExecError::Gpu(
            "weight has no GPU id (MappedGpuEngine::add_weight)".into(),
        ))?;
        let buf = self
            .weights
            .get(&id)
            .ok_or(ExecError::Gpu(format!("unknown GPU weight {id:?}")))?;
        if buf.as_slice().as_ptr() != w.host.as_ptr() {
            return Err(ExecError::Gpu(format!(
                "GPU weight {id:?} is not the step's host bytes"
            )));
        }
        if y_rows.len() != rows.len() || rows.end > w.m {
            return Err(ExecError::Shape {
                what: "gpu arm rows",
                need: rows.len(),
                got: y_rows.len(),
            });
        }
        let x_cap = self.x_map.len() / F32_BYTES;
        let y_cap = self.y_map.len() / F32_BYTES;
        if x.len() != w.k || w.k > x_cap {
            return Err(ExecError::Shape {
                what: "x (engine max_k)",
                need: w.k,
                got: x.len().min(x_cap),
            });
        }
        if w.m > y_cap {
            return Err(ExecError::Shape {
                what: "output rows (engine max_m)",
                need: w.m,
                got: y_cap,
            });
        }
        let wref = WeightRef::new(&**buf, 0, w.format, w.m, w.k).map_err(gpu_err)?;
        // The previous call synchronised the stream, so nothing on the device reads the staging
        // buffers while the CPU writes them here.
        as_f32_mut(&mut self.x_map)[..w.k].copy_from_slice(x);
        let gform = match form {
            Form::Plain => GemvForm::Plain,
            Form::Residual => {
                as_f32_mut(&mut self.y_map)[rows.clone()].copy_from_slice(y_rows);
                GemvForm::Residual
            }
        };
        if !self.acts.contains_key(&w.k) {
            self.acts
                .insert(w.k, Activation::new(&self.ctx, w.k).map_err(gpu_err)?);
        }
        let act = self
            .acts
            .get_mut(&w.k)
            .ok_or(ExecError::Gpu("activation cache".into()))?;
        self.kernels
            .prepare(&self.stream, &self.x_map, act)
            .map_err(gpu_err)?;
        self.start.record(&self.stream).map_err(gpu_err)?;
        self.kernels
            .gemv(
                &self.stream,
                &wref,
                act,
                &mut self.y_map,
                RowRange::new(rows.start, rows.end),
                gform,
            )
            .map_err(gpu_err)?;
        self.end.record(&self.stream).map_err(gpu_err)?;
        self.stream.synchronize().map_err(gpu_err)?;
        let ms = self.start.elapsed_ms(&self.end).map_err(gpu_err)?;
        y_rows.copy_from_slice(&as_f32(&self.y_map)[rows]);
        Ok(ArmTime::Exact {
            ns: f64::from(ms) * 1e6,
        })
    }
}
