//! The GPU engine's routed FFN ([`crate::block::BlockOps::moe`]): routing, the selected experts'
//! projections and their weighted sum, all queued on the decoder's stream with no host read, so a
//! step holding it can be captured in a CUDA graph and every [`LayerRows`] form (one token, a
//! prompt's rows, a batched decode step's slots) takes the same path.
//!
//! Per layer and step of `m` rows (`k` experts a token, `ff` wide):
//! 1. the router's logits through the multi-column GEMV, wherever the router lives (its int8
//!    activation and summation order do not depend on the step's form or offload mode, so a token
//!    routes the same in a prompt, a decode step and a batched step);
//! 2. `moe_route_f32` (kernels/moe.cu): the CPU engine's gating (softmax or sigmoid), top-k by
//!    the scores plus any selection bias, renormalisation (clamped sum) and weights scale
//!    ([`crate::moe::Routes::from_logits_biased`]), ids and weights into device scratch;
//! 3. gate and up of every `(row, slot)` pair through the GEMV's ids form (each pair's expert
//!    read from a per-layer table of base addresses, in VRAM or host-mapped), SwiGLU over the
//!    `m·k` pairs, then down with ids over each pair's own activated hidden;
//! 4. the shared expert, where there is one, through the decoder's ordinary projections (planned
//!    and split like any layer weight) and its sigmoid gate (1 where the file has none: GLM-4.5);
//! 5. `moe_combine_f32`: each row's experts in ascending id, weighted, plus the gated shared
//!    expert, added into the residual stream — the CPU engine's order.
//!
//! Every pair is its own GEMV (m·k launches' worth of weight reads for a prompt: correct first;
//! grouping a prompt's rows by expert, as ggml-cuda's `mmid.cu` does, is an open step).

use std::sync::Arc;

use hipfire_gpu::{
    Activation, Context, DeviceBuffer, DeviceMemory, ExpertSet, Function, GemvForm, IdsInput,
    IdsShape, KernelSource, LaunchArgs, LaunchDims, Module, RowRange,
};

use super::{launch_on, ActSlot, DeviceView, GpuDecoder, LayerRows, StepRows, DECODE_THREADS};
use crate::block::{MoeTensors, SharedExpert};
use crate::config::ModelConfig;
use crate::ModelError;

/// `kernels/moe.cu`: routing, the shared expert's gate, the weighted sum into the residual.
pub const MOE_SOURCE: KernelSource = KernelSource {
    name: "moe.cu",
    source: include_str!("../../../../kernels/moe.cu"),
    headers: &[("platform.cuh", hipfire_gpu::PLATFORM_CUH)],
};

/// The kernels [`MoeKernels`] loads from [`MOE_SOURCE`], in field order.
pub const MOE_KERNEL_NAMES: [&str; 3] = ["moe_route_f32", "moe_shared_gate_f32", "moe_combine_f32"];

/// Threads of the routing and shared-gate kernels: one warp a row (kernels/moe.cu
/// `__launch_bounds__(HF_WARP)`).
const ROUTE_THREADS: u32 = 32;

/// A routing rule, passed to `moe_route_f32` as its `gating` int (kernels/moe.cu
/// `HF_GATING_*`): a new rule is a variant here and a case there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Gating {
    /// Softmax over every expert, the top k by probability (`HF_GATING_SOFTMAX`).
    Softmax = 0,
    /// A sigmoid per expert, the top k by score plus any selection bias (`HF_GATING_SIGMOID`:
    /// GLM-4.5).
    Sigmoid = 1,
}

impl Gating {
    /// The kernel's rule for a model's gating; gpt-oss's softmax over the top k logits has
    /// none yet (`ModelConfig::cpu_only_layers` refuses it before this is asked).
    pub fn for_config(g: crate::config::Gating) -> Result<Gating, ModelError> {
        match g {
            crate::config::Gating::Softmax => Ok(Gating::Softmax),
            crate::config::Gating::Sigmoid => Ok(Gating::Sigmoid),
            crate::config::Gating::SoftmaxTopK => Err(ModelError::Unsupported(
                "the GPU engine does not route by a softmax over the top-k logits".into(),
            )),
        }
    }
}

/// Dynamic shared memory of `moe_route_f32` over `n_expert` experts: the scores and the
/// selection scores (f32 each) and a taken mark (a byte) per expert, rounded to 4 bytes.
pub fn route_shared_bytes(n_expert: usize) -> u32 {
    (n_expert * 9).next_multiple_of(4) as u32
}

/// The routed FFN's kernels.
pub(super) struct MoeKernels {
    route: Function,
    shared_gate: Function,
    combine: Function,
}

impl MoeKernels {
    pub(super) fn new(module: &Arc<Module>) -> Result<MoeKernels, ModelError> {
        let [route, shared_gate, combine] = MOE_KERNEL_NAMES.map(|n| module.function(n));
        Ok(MoeKernels {
            route: route?,
            shared_gate: shared_gate?,
            combine: combine?,
        })
    }
}

/// One layer's routed experts on the GPU: a table of base addresses per projection, which the
/// ids GEMV indexes by expert id, and the router's weight id.
pub(super) struct LayerExperts {
    pub(super) router: usize,
    pub(super) gate: ExpertSet,
    pub(super) up: ExpertSet,
    pub(super) down: ExpertSet,
}

/// The shared expert's scratch.
struct SharedScratch {
    /// `rows × ff_shared`: gate (then the activated hidden) and up.
    gate: DeviceBuffer<f32>,
    up: DeviceBuffer<f32>,
    /// `rows × d_model`: its down projection.
    out: DeviceBuffer<f32>,
    /// `rows`: its sigmoid gate.
    scale: DeviceBuffer<f32>,
}

/// The routed FFN's device scratch for layer calls of up to `rows` rows.
pub(super) struct MoeScratch {
    rows: usize,
    /// `rows × n_expert` router logits.
    logits: DeviceBuffer<f32>,
    /// `rows × k` chosen experts (i32) and their weights, in descending probability.
    ids: DeviceBuffer<i32>,
    weights: DeviceBuffer<f32>,
    /// The rows' normalised input quantised once for the router, gate and up (`rows` columns).
    act_x: Activation,
    /// The pairs' activated hidden quantised for down (`rows · k` columns).
    act_h: Activation,
    /// `rows · k × ff`: each pair's gate (then activated hidden) and up.
    gate: DeviceBuffer<f32>,
    up: DeviceBuffer<f32>,
    /// `rows · k × d_model`: each pair's down output.
    down: DeviceBuffer<f32>,
    shared: Option<SharedScratch>,
}

/// The shapes the scratch is sized by: `(n_expert, k, ff, shared ff)`, or an error for a model
/// without experts.
fn shape(c: &ModelConfig) -> Result<(usize, usize, usize, Option<usize>), ModelError> {
    let m = c.moe.as_ref().ok_or_else(|| {
        ModelError::Unsupported("a routed FFN in a model without expert metadata".into())
    })?;
    Ok((m.n_expert, m.n_expert_used, m.n_ff_exp, m.n_ff_shared))
}

impl MoeScratch {
    /// Scratch for layer calls of up to `rows` rows of model `c` (which has experts). The sizes
    /// come from the file's bounded keys (config.rs); the element counts the kernels index with
    /// i32 are checked here.
    pub(super) fn new(
        ctx: &Arc<Context>,
        c: &ModelConfig,
        rows: usize,
    ) -> Result<MoeScratch, ModelError> {
        let (e, k, ff, sf) = shape(c)?;
        let d = c.d_model;
        let pairs = rows * k;
        let widest = [pairs * ff, pairs * d, rows * e, rows * sf.unwrap_or(0)];
        if widest.iter().any(|&n| i32::try_from(n).is_err()) {
            return Err(ModelError::InvalidOption(format!(
                "routed-expert scratch for {rows} rows × {k} experts of {ff} (d_model {d}) \
                 exceeds the kernels' i32 indices; lower model.ubatch"
            )));
        }
        let shared = match sf {
            Some(sf) => Some(SharedScratch {
                gate: ctx.alloc(rows * sf)?,
                up: ctx.alloc(rows * sf)?,
                out: ctx.alloc(rows * d)?,
                scale: ctx.alloc(rows)?,
            }),
            None => None,
        };
        Ok(MoeScratch {
            rows,
            logits: ctx.alloc(rows * e)?,
            ids: ctx.alloc(pairs)?,
            weights: ctx.alloc(pairs)?,
            act_x: Activation::with_columns(ctx, d, rows)?,
            act_h: Activation::with_columns(ctx, ff, pairs)?,
            gate: ctx.alloc(pairs * ff)?,
            up: ctx.alloc(pairs * ff)?,
            down: ctx.alloc(pairs * d)?,
            shared,
        })
    }

    /// Device bytes [`MoeScratch::new`] allocates (for the placement budget); 0 for a dense
    /// model.
    pub(super) fn vram_bytes(c: &ModelConfig, rows: usize) -> u64 {
        let Ok((e, k, ff, sf)) = shape(c) else {
            return 0;
        };
        let d = c.d_model;
        let pairs = rows * k;
        let sf = sf.unwrap_or(0);
        let f32s = rows * e + 2 * pairs + 2 * pairs * ff + pairs * d;
        let shared = if sf > 0 { rows * (2 * sf + d + 1) } else { 0 };
        // Activations: an f32 copy and an int8 value per element, a (d, s) f32 pair per 32.
        let elems = rows * d + pairs * ff;
        let act = elems * (4 + 1) + elems.div_ceil(32) * 8;
        ((f32s + shared) * 4 + act) as u64
    }
}

/// What the decoder holds for its routed layers: the kernels and the scratch (the experts'
/// tables live with each layer).
pub(super) struct GpuMoe {
    pub(super) k: MoeKernels,
    pub(super) scratch: MoeScratch,
    pub(super) gating: Gating,
}

/// A device address range of `n` f32 values at `ptr`.
fn f32_view(ctx: &Arc<Context>, ptr: u64, n: usize) -> DeviceView<'_> {
    DeviceView {
        ptr,
        bytes: n * 4,
        ctx,
    }
}

impl GpuDecoder<'_> {
    /// `X += moe(Xn)` for the rows `rows` describes of layer `li` (residual rows at `x`, the
    /// other activations `r`'s): see the module documentation.
    pub(super) fn moe_rows(
        &mut self,
        li: usize,
        r: &StepRows,
        x: u64,
        rows: LayerRows<'_>,
        t: &MoeTensors<usize, u64>,
    ) -> Result<(), ModelError> {
        let (_, k, _, sf) = shape(self.model.config())?;
        // `GpuDecoder::with_slots` refuses gpt-oss (`ModelConfig::cpu_only_layers`) first; a
        // file of another architecture carrying its biases is refused here rather than run
        // without them.
        if t.router_bias.is_some() || t.biases.is_some() {
            return Err(ModelError::Unsupported(format!(
                "layer {li}: the GPU engine does not run biased routers or experts"
            )));
        }
        let m = rows.len();
        self.routed_experts(li, r.xn, m, t.selection_bias)?;
        let shared = match (&t.shared, sf) {
            (Some(sh), Some(sf)) => Some(self.shared_expert(sh, r.xn, rows, sf)?),
            (None, _) => None,
            (Some(_), None) => {
                return Err(ModelError::Unsupported(format!(
                    "layer {li}: a shared expert in a model without its width"
                )))
            }
        };
        // Σ weight · down in ascending expert id (+ the gated shared expert) into x.
        let d = self.model.config().d_model;
        let dchunks = (d as u32).div_ceil(DECODE_THREADS);
        let (sh_out, sh_scale) = shared.unwrap_or((0, 0));
        let moe = self.moe.as_ref().ok_or_else(no_moe)?;
        let s = &moe.scratch;
        let args = LaunchArgs::new()
            .buf(&s.down)
            .buf(&s.ids)
            .buf(&s.weights)
            .i32(k as i32)
            .i32(d as i32)
            .i32(dchunks as i32)
            .ptr(sh_out)
            .ptr(sh_scale)
            .ptr(x);
        let dims = LaunchDims {
            grid: m as u32 * dchunks,
            block: DECODE_THREADS,
            // The row's slots in ascending expert id.
            shared_bytes: (k * 4) as u32,
        };
        Ok(launch_on(
            &self.ctx,
            &self.stream,
            &moe.k.combine,
            dims,
            args,
        )?)
    }

    /// Steps 1–3 of the module documentation over the `m` rows of `xn`: the router, the routing,
    /// and the chosen experts' gate, up, SwiGLU and down, into the scratch's `down` (a row per
    /// pair). `selection_bias`: the layer's per-expert bias on the scores experts are chosen by.
    fn routed_experts(
        &mut self,
        li: usize,
        xn: u64,
        m: usize,
        selection_bias: Option<u64>,
    ) -> Result<(), ModelError> {
        let c = self.model.config();
        let (e, k, ff, _) = shape(c)?;
        let d = c.d_model;
        let (norm, scale) = c
            .moe
            .as_ref()
            .map_or((false, 1.0), |mc| (mc.norm_topk, mc.weights_scale));
        let pairs = m * k;
        let GpuDecoder {
            ref mut moe,
            ref layers,
            ref stream,
            ref gemv,
            ref ctx,
            ref weights,
            model,
            k: ref dk,
            ..
        } = *self;
        let moe = moe.as_mut().ok_or_else(no_moe)?;
        let Some(experts) = layers[li].experts.as_ref() else {
            return Err(ModelError::Unsupported(format!(
                "layer {li} has a routed FFN but no expert tables on the GPU"
            )));
        };
        let s = &mut moe.scratch;
        if m > s.rows {
            return Err(ModelError::Backend {
                backend: "gpu",
                message: format!(
                    "a routed FFN over {m} rows exceeds its scratch ({} rows)",
                    s.rows
                ),
            });
        }
        // The router over every row's xn, through the multi-column GEMV.
        gemv.prepare_cols(stream, &f32_view(ctx, xn, m * d), &mut s.act_x, m)?;
        let router_id = experts.router;
        let rw = &model.weights()[router_id];
        let router = weights[router_id]
            .as_ref()
            .ok_or_else(|| ModelError::Unsupported(format!("weight {} not placed", rw.name)))?
            .weight_ref(rw)?;
        gemv.gemv_cols(
            stream,
            &router,
            &s.act_x,
            &mut s.logits,
            e,
            RowRange::all(e),
            GemvForm::Plain,
            m,
        )?;
        // Routing: one warp a row, its scores, selection scores and taken marks in shared
        // memory.
        let args = LaunchArgs::new()
            .buf(&s.logits)
            .i32(e as i32)
            .i32(k as i32)
            .i32(moe.gating as i32)
            .i32(i32::from(norm))
            .ptr(selection_bias.unwrap_or(0))
            .f32(scale)
            .buf(&s.ids)
            .buf(&s.weights);
        let dims = LaunchDims {
            grid: m as u32,
            block: ROUTE_THREADS,
            shared_bytes: route_shared_bytes(e),
        };
        launch_on(ctx, stream, &moe.k.route, dims, args)?;
        // Gate and up over each token's row, SwiGLU, down over each pair's own hidden.
        let by_row = IdsShape {
            pairs,
            n_used: k,
            input: IdsInput::TokenRow,
        };
        gemv.gemv_ids(
            stream,
            &experts.gate,
            &s.ids,
            by_row,
            &s.act_x,
            &mut s.gate,
            ff,
        )?;
        gemv.gemv_ids(stream, &experts.up, &s.ids, by_row, &s.act_x, &mut s.up, ff)?;
        let n = pairs * ff;
        let args = LaunchArgs::new()
            .buf(&s.gate)
            .buf(&s.up)
            .buf(&s.gate)
            .i32(n as i32);
        launch_on(ctx, stream, &dk.swiglu, elementwise(n), args)?;
        let hidden = f32_view(ctx, s.gate.device_ptr(), n);
        gemv.prepare_cols(stream, &hidden, &mut s.act_h, pairs)?;
        let by_pair = IdsShape {
            input: IdsInput::Pair,
            ..by_row
        };
        gemv.gemv_ids(
            stream,
            &experts.down,
            &s.ids,
            by_pair,
            &s.act_h,
            &mut s.down,
            d,
        )?;
        Ok(())
    }

    /// The shared expert over `rows` (input `xn`, `sf` wide) through the ordinary projections
    /// (planned and split like any layer weight), and its sigmoid gate: the device addresses of
    /// its output (`rows × d_model`) and gate (`rows`).
    fn shared_expert(
        &mut self,
        sh: &SharedExpert<usize, u64>,
        xn: u64,
        rows: LayerRows<'_>,
        sf: usize,
    ) -> Result<(u64, u64), ModelError> {
        let (d, m) = (self.model.config().d_model, rows.len());
        let ss = self
            .moe
            .as_ref()
            .and_then(|moe| moe.scratch.shared.as_ref())
            .ok_or_else(no_moe)?;
        let (g, u, out, scale) = (
            ss.gate.device_ptr(),
            ss.up.device_ptr(),
            ss.out.device_ptr(),
            ss.scale.device_ptr(),
        );
        let plain = GemvForm::Plain;
        self.project_any(
            &[(sh.gate, g, sf), (sh.up, u, sf)],
            xn,
            d,
            rows,
            ActSlot::Model,
            plain,
        )?;
        let n = m * sf;
        let args = LaunchArgs::new().ptr(g).ptr(u).ptr(g).i32(n as i32);
        self.launch_1d(&self.k.swiglu, n, args)?;
        self.project_any(&[(sh.down, out, d)], g, sf, rows, ActSlot::Shared, plain)?;
        let args = LaunchArgs::new()
            .ptr(xn)
            .ptr(sh.gate_inp.unwrap_or(0))
            .i32(d as i32)
            .ptr(scale);
        let moe = self.moe.as_ref().ok_or_else(no_moe)?;
        let dims = LaunchDims {
            grid: m as u32,
            block: ROUTE_THREADS,
            shared_bytes: 0,
        };
        launch_on(&self.ctx, &self.stream, &moe.k.shared_gate, dims, args)?;
        Ok((out, scale))
    }
}

/// One thread an item over `n` items, [`DECODE_THREADS`] a block.
fn elementwise(n: usize) -> LaunchDims {
    LaunchDims {
        grid: (n as u32).div_ceil(DECODE_THREADS),
        block: DECODE_THREADS,
        shared_bytes: 0,
    }
}

/// The error of a routed layer reached by a decoder built without MoE support (a broken
/// invariant: [`GpuDecoder::with_slots`] builds it for every model with experts).
fn no_moe() -> ModelError {
    ModelError::Backend {
        backend: "gpu",
        message: "a routed FFN on a decoder without routed-expert scratch".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel [`MoeKernels::new`] looks up in `moe.cu` compiles for sm_90 (NVRTC, no
    /// GPU needed; skipped without libnvrtc unless `HIPFIRE_REQUIRE_NVRTC=1`).
    #[test]
    fn moe_kernels_compile_for_sm90_with_nvrtc() {
        crate::gpu::tests::assert_kernels_compile(&MOE_SOURCE, MOE_KERNEL_NAMES);
    }

    /// The scratch's byte count is what `new` allocates, per element kind (the placement budget
    /// counts it before the allocation).
    #[test]
    fn scratch_bytes_count_every_buffer() {
        let spec = crate::synth::SynthSpec::preset("tiny-qwen2moe").expect("preset");
        let path =
            std::env::temp_dir().join(format!("hipfire-moe-scratch-{}.gguf", std::process::id()));
        crate::synth::write_synthetic(&path, &spec, hipfire_quant::Format::Q8_0, 1, None)
            .expect("synth");
        let model = crate::Model::load(&path, &crate::LoadOptions::default()).expect("load");
        let _ = std::fs::remove_file(&path);
        let c = model.config();
        let (rows, d) = (5, c.d_model);
        let (e, k, ff, sf) = shape(c).expect("routed");
        let sf = sf.expect("qwen2moe has a shared expert");
        let pairs = rows * k;
        let f32s = rows * e + 2 * pairs + 2 * pairs * ff + pairs * d + rows * (2 * sf + d + 1);
        let acts = [(d, rows), (ff, pairs)]
            .iter()
            .map(|&(w, n)| w * n * 5 + w * n / 32 * 8)
            .sum::<usize>();
        assert_eq!(MoeScratch::vram_bytes(c, rows), (f32s * 4 + acts) as u64);
    }
}
