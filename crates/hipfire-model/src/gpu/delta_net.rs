//! The hybrid models' layers on the GPU (Qwen3.5, Qwen3-Next): the Gated DeltaNet between its
//! projections and the gated attention's query/gate split and output gate, kernels in
//! `kernels/delta_net.cu`.
//!
//! The projections (`attn_qkv` / `ssm_in`, `attn_gate`, `ssm_beta` / `ssm_alpha` / `ssm_ba`,
//! `ssm_out`, the gated `attn_q`) are ordinary weights through [`GpuDecoder::project_any`], so a
//! spilled layer's split between the GPU and the CPU pool is the planner's as for any other
//! projection. What is per sequence is its recurrent state: per DeltaNet layer and sequence slot
//! one f32 buffer in VRAM (the conv window, then each value head's `head_dim × head_dim` matrix, as
//! [`crate::delta_net::DeltaNetState`] lays them out), updated in place by the kernels — so a step
//! is a chain of launches on the stream with no host step in it, which a CUDA graph captures. A
//! sequence at position 0 has the empty state: the decoder zeroes a slot's states when a step
//! starts it from position 0, so a reset needs no device call.
//!
//! Unlike a KV cache a recurrent state cannot be truncated back: a step that fails after its
//! first DeltaNet layer leaves its slots' states half-advanced, so the decoder marks them lost
//! ([`GpuDecoder::rec_lost`]) and refuses to continue them until they restart from position 0
//! (or a snapshot is restored).

use hipfire_gpu::{
    Context, DeviceBuffer, DeviceMemory, Function, KernelSource, LaunchArgs, Module,
};
use std::sync::Arc;

use super::{ActSlot, GpuDecoder, LayerRows, StepRows};
use crate::block::{Attention, DeltaNet, Pair};
use crate::config::{Arch, DeltaNetConfig, ModelConfig};
use crate::ModelError;
use hipfire_gpu::GemvForm;

/// `kernels/delta_net.cu`: the DeltaNet's conv, delta rule, gated norm and splits; the gated
/// attention's query split and output gate.
pub const DELTA_NET_SOURCE: KernelSource = KernelSource {
    name: "delta_net.cu",
    source: include_str!("../../../../kernels/delta_net.cu"),
    headers: &[("platform.cuh", hipfire_gpu::PLATFORM_CUH)],
};

/// The kernels of [`DELTA_NET_SOURCE`], in [`HybridKernels`] field order.
pub const DELTA_NET_KERNEL_NAMES: [&str; 7] = [
    "dn_conv_silu_f32",
    "dn_rule_f32",
    "dn_gated_norm_f32",
    "dn_split_qkvz_f32",
    "dn_split_ba_f32",
    "ga_split_q_f32",
    "ga_gate_f32",
];

/// Most conv taps `dn_conv_silu_f32` keeps in registers (`DN_MAX_TAPS` in the kernel); Qwen3.5
/// and Qwen3-Next use 4.
pub const DN_MAX_TAPS: usize = 8;
/// Warps (rows of a head's state, or heads of the gated norm) per block (`DN_RULE_WARPS`).
pub const DN_RULE_WARPS: u32 = 4;
/// The state's head width must be a multiple of this: whole lanes of a 64-wide wave (HIP) or
/// two 32-wide warps, and whole blocks of [`DN_RULE_WARPS`] rows.
pub const DN_HEAD_DIM_MULTIPLE: usize = 64;
/// Widest state head: `DN_MAX_KEYS_PER_LANE` (8) keys in each of 32 lanes.
pub const DN_MAX_HEAD_DIM: usize = 256;
/// Lanes of a warp (`HF_WARP`): the model's kernels assume 32-wide warps, as hipfire-gpu's
/// `hip.rs` says of them all (wave64 devices need a port of the warp reductions).
const WARP_THREADS: u32 = 32;
/// Threads per block of the element-wise kernels (the conv's channels, the splits).
const DN_THREADS: u32 = 256;

/// Why the GPU's DeltaNet kernels cannot run `dn`'s shapes, `None` when they can.
pub fn unsupported_shape(dn: &DeltaNetConfig) -> Option<String> {
    if dn.conv_kernel > DN_MAX_TAPS {
        return Some(format!(
            "a DeltaNet conv of {} taps (the GPU kernel keeps at most {DN_MAX_TAPS})",
            dn.conv_kernel
        ));
    }
    if dn.head_dim % DN_HEAD_DIM_MULTIPLE != 0 || dn.head_dim > DN_MAX_HEAD_DIM {
        return Some(format!(
            "DeltaNet heads of {} (the GPU kernel takes multiples of {DN_HEAD_DIM_MULTIPLE} up to \
             {DN_MAX_HEAD_DIM})",
            dn.head_dim
        ));
    }
    None
}

/// The launched kernels of [`DELTA_NET_SOURCE`].
pub(super) struct HybridKernels {
    conv: Function,
    rule: Function,
    gated_norm: Function,
    split_qkvz: Function,
    split_ba: Function,
    split_q: Function,
    gate: Function,
}

impl HybridKernels {
    pub(super) fn new(module: &Arc<Module>) -> Result<HybridKernels, ModelError> {
        let [conv, rule, gated_norm, split_qkvz, split_ba, split_q, gate] =
            DELTA_NET_KERNEL_NAMES.map(|n| module.function(n));
        Ok(HybridKernels {
            conv: conv?,
            rule: rule?,
            gated_norm: gated_norm?,
            split_qkvz: split_qkvz?,
            split_ba: split_ba?,
            split_q: split_q?,
            gate: gate?,
        })
    }
}

/// Device scratch of the hybrid layers for steps of up to `rows` rows (one step runs at a time
/// on the decoder's stream, so every step form shares it): the DeltaNet's projections, conv
/// output and heads' output, the fused projections' products, the gated attention's `[q, g]`.
pub(super) struct HybridScratch {
    rows: usize,
    /// The conv's input, then (in place) its output: `rows × conv_dim`.
    qkv: DeviceBuffer<f32>,
    /// The output gate `z`: `rows × value_dim`.
    z: DeviceBuffer<f32>,
    /// β's logits and α: `rows × n_v_heads` each.
    beta: DeviceBuffer<f32>,
    alpha: DeviceBuffer<f32>,
    /// The heads' output, then the gated norm's: `rows × value_dim`.
    o: DeviceBuffer<f32>,
    /// qwen3next's fused `ssm_in` product (`rows × (conv_dim + value_dim)`) and `ssm_ba` product
    /// (`rows × 2·n_v_heads`); one element each for the other architectures.
    fused_qkvz: DeviceBuffer<f32>,
    fused_ba: DeviceBuffer<f32>,
    /// The gated attention's query projection, `[q_h, g_h]` per head: `rows × 2·q_dim`.
    qg: DeviceBuffer<f32>,
}

/// f32 values of each buffer of [`HybridScratch`] for `rows` rows, in field order.
fn scratch_lens(c: &ModelConfig, dn: &DeltaNetConfig, rows: usize) -> [usize; 8] {
    let (cd, vd, hv) = (dn.conv_dim(), dn.value_dim(), dn.n_v_heads);
    let fused = c.arch == Arch::Qwen3Next;
    [
        rows * cd,
        rows * vd,
        rows * hv,
        rows * hv,
        rows * vd,
        if fused { rows * (cd + vd) } else { 1 },
        if fused { rows * 2 * hv } else { 1 },
        rows * 2 * c.q_dim(),
    ]
}

impl HybridScratch {
    pub(super) fn new(
        ctx: &Arc<Context>,
        c: &ModelConfig,
        dn: &DeltaNetConfig,
        rows: usize,
    ) -> Result<HybridScratch, ModelError> {
        let [qkv, z, beta, alpha, o, fq, fba, qg] = scratch_lens(c, dn, rows);
        Ok(HybridScratch {
            rows,
            qkv: ctx.alloc(qkv)?,
            z: ctx.alloc(z)?,
            beta: ctx.alloc(beta)?,
            alpha: ctx.alloc(alpha)?,
            o: ctx.alloc(o)?,
            fused_qkvz: ctx.alloc(fq)?,
            fused_ba: ctx.alloc(fba)?,
            qg: ctx.alloc(qg)?,
        })
    }

    /// Device bytes [`HybridScratch::new`] allocates (for the placement budget).
    pub(super) fn vram_bytes(c: &ModelConfig, dn: &DeltaNetConfig, rows: usize) -> u64 {
        scratch_lens(c, dn, rows).iter().sum::<usize>() as u64 * 4
    }
}

/// What the GPU needs for a hybrid model's layers.
pub(super) struct Hybrid {
    pub(super) k: HybridKernels,
    pub(super) scratch: HybridScratch,
}

/// Where the rows of a step find their sequences' states: `(state0, states table, sequences,
/// tokens a sequence)` as the kernels take them.
type StateRows = (u64, u64, usize, usize);

impl GpuDecoder<'_> {
    fn hybrid(&self) -> Result<(&Hybrid, &DeltaNetConfig), ModelError> {
        let dn = self.model.config().delta_net.as_ref();
        match (&self.hybrid, dn) {
            (Some(h), Some(dn)) => Ok((h, dn)),
            _ => Err(ModelError::Backend {
                backend: "gpu",
                message: "a hybrid layer on a decoder built without its kernels".into(),
            }),
        }
    }

    /// The hybrid scratch for a step of `n` rows, or an error when it holds fewer.
    fn hybrid_rows(&self, n: usize) -> Result<(&Hybrid, &DeltaNetConfig), ModelError> {
        let (h, dn) = self.hybrid()?;
        if n > h.scratch.rows {
            return Err(ModelError::Backend {
                backend: "gpu",
                message: format!(
                    "a hybrid layer over {n} rows exceeds its scratch ({} rows)",
                    h.scratch.rows
                ),
            });
        }
        Ok((h, dn))
    }

    /// Layer `li`'s states for `rows`: a run's slot by address, a batched step's rows through the
    /// slot table's first half of the layer (`stage_slot_tables` writes a DeltaNet layer's state
    /// addresses there, where an attention layer has its K caches).
    fn state_rows(&self, li: usize, rows: LayerRows<'_>) -> Result<StateRows, ModelError> {
        match rows {
            LayerRows::Run { m, .. } => {
                let st = self.layers[li]
                    .rec
                    .get(self.slot)
                    .ok_or_else(|| no_state(li))?;
                Ok((st.device_ptr(), 0, 1, m))
            }
            LayerRows::Slots(feeds) => {
                let db = self.decode_batch.as_ref().ok_or_else(no_state_table)?;
                let table = db.caches.device_ptr() + (8 * 2 * li * db.rows()) as u64;
                Ok((0, table, feeds.len(), 1))
            }
        }
    }

    /// `X += out · gated_norm(delta_rule(conv(qkv · Xn)))` over `rows` (the residual rows at `x`,
    /// the normalised input at `r.xn`): [`crate::block::BlockOps::delta_net`] on the GPU.
    pub(super) fn delta_net_rows(
        &mut self,
        li: usize,
        t: &DeltaNet<usize, u64>,
        r: &StepRows,
        x: u64,
        rows: LayerRows<'_>,
    ) -> Result<(), ModelError> {
        let c = self.model.config();
        let n = rows.len();
        let (h, dn) = self.hybrid_rows(n)?;
        let dn = dn.clone();
        let (cd, vd, hv, hd) = (dn.conv_dim(), dn.value_dim(), dn.n_v_heads, dn.head_dim);
        let s = &h.scratch;
        let (qkv, z, beta, alpha, o) = (
            s.qkv.device_ptr(),
            s.z.device_ptr(),
            s.beta.device_ptr(),
            s.alpha.device_ptr(),
            s.o.device_ptr(),
        );
        let (fq, fba) = (s.fused_qkvz.device_ptr(), s.fused_ba.device_ptr());
        let mut outs = Vec::with_capacity(4);
        match t.qkvz {
            Pair::Split(wqkv, wz) => outs.extend([(wqkv, qkv, cd), (wz, z, vd)]),
            Pair::Fused(w) => outs.push((w, fq, cd + vd)),
        }
        match t.ba {
            Pair::Split(wb, wa) => outs.extend([(wb, beta, hv), (wa, alpha, hv)]),
            Pair::Fused(w) => outs.push((w, fba, 2 * hv)),
        }
        let d = c.d_model;
        self.project_any(&outs, r.xn, d, rows, ActSlot::Model, GemvForm::Plain)?;
        let (h, _) = self.hybrid()?;
        if let Pair::Fused(_) = t.qkvz {
            let len = n * (cd + vd);
            let args = LaunchArgs::new()
                .ptr(fq)
                .ptr(qkv)
                .ptr(z)
                .i32(dn.n_k_heads as i32)
                .i32(hd as i32)
                .i32((vd / dn.n_k_heads) as i32)
                .i32(len as i32);
            self.launch(&h.k.split_qkvz, grid(len), DN_THREADS, 0, args)?;
        }
        if let Pair::Fused(_) = t.ba {
            let len = n * 2 * hv;
            let args = LaunchArgs::new()
                .ptr(fba)
                .ptr(beta)
                .ptr(alpha)
                .i32(hv as i32)
                .i32((hv / dn.n_k_heads) as i32)
                .i32(len as i32);
            self.launch(&h.k.split_ba, grid(len), DN_THREADS, 0, args)?;
        }
        let (state0, states, n_seq, per_seq) = self.state_rows(li, rows)?;
        let window = (dn.conv_kernel - 1) * cd;
        let args = LaunchArgs::new()
            .ptr(qkv)
            .ptr(t.conv)
            .u64(state0)
            .ptr(states)
            .i32(cd as i32)
            .i32(dn.conv_kernel as i32)
            .i32(per_seq as i32)
            .i32(grid(cd) as i32);
        let blocks = grid(cd) * n_seq as u32;
        self.launch(&h.k.conv, blocks, DN_THREADS, 0, args)?;
        let grouped = matches!(dn.key_share, crate::config::KeyHeadShare::Grouped);
        let args = LaunchArgs::new()
            .ptr(qkv)
            .ptr(beta)
            .ptr(alpha)
            .ptr(t.dt_bias)
            .ptr(t.a)
            .ptr(o)
            .u64(state0)
            .ptr(states)
            .i32(dn.n_k_heads as i32)
            .i32(hv as i32)
            .i32(hd as i32)
            .i32(i32::from(grouped))
            .i32(window as i32)
            .i32(per_seq as i32)
            .f32(c.rms_eps);
        // head_dim is a multiple of DN_HEAD_DIM_MULTIPLE (checked at load), so of DN_RULE_WARPS.
        let per_seq_blocks = (hv * hd) as u32 / DN_RULE_WARPS;
        let args = args.i32(per_seq_blocks as i32);
        let threads = DN_RULE_WARPS * WARP_THREADS;
        self.launch(&h.k.rule, per_seq_blocks * n_seq as u32, threads, 0, args)?;
        let heads = n * hv;
        let args = LaunchArgs::new()
            .ptr(o)
            .ptr(t.norm)
            .ptr(z)
            .i32(hd as i32)
            .i32(heads as i32)
            .f32(c.rms_eps);
        let blocks = (heads as u32).div_ceil(DN_RULE_WARPS);
        self.launch(&h.k.gated_norm, blocks, threads, 0, args)?;
        self.project_any(
            &[(t.out, x, d)],
            o,
            vd,
            rows,
            ActSlot::Value,
            GemvForm::Residual,
        )
    }

    /// The gated attention's parts around [`crate::block::BlockOps::attention`]: `[q, g] · Xn`
    /// into the scratch and `Q`, `K`, `V`; after the attention, `Att *= sigmoid(g)`.
    pub(super) fn gated_query(
        &mut self,
        a: &Attention<usize, u64>,
        r: &StepRows,
        rows: LayerRows<'_>,
    ) -> Result<(), ModelError> {
        let c = self.model.config();
        let (n, qd, kvd, hd) = (rows.len(), c.q_dim(), c.kv_dim(), c.head_dim);
        let qg = self.hybrid_rows(n)?.0.scratch.qg.device_ptr();
        let outs = [(a.wq, qg, 2 * qd), (a.wk, r.k, kvd), (a.wv, r.v, kvd)];
        self.project_any(
            &outs,
            r.xn,
            c.d_model,
            rows,
            ActSlot::Model,
            GemvForm::Plain,
        )?;
        let len = n * qd;
        let args = LaunchArgs::new()
            .ptr(qg)
            .ptr(r.q)
            .i32(hd as i32)
            .i32(qd as i32)
            .i32(len as i32);
        let (h, _) = self.hybrid()?;
        Ok(self.launch(&h.k.split_q, grid(len), DN_THREADS, 0, args)?)
    }

    /// `Att *= sigmoid(g)` per head, `g` the second half of each head's `[q_h, g_h]`.
    pub(super) fn gate_attention(&mut self, r: &StepRows, n: usize) -> Result<(), ModelError> {
        let c = self.model.config();
        let (qd, hd) = (c.q_dim(), c.head_dim);
        let (h, _) = self.hybrid_rows(n)?;
        let len = n * qd;
        let args = LaunchArgs::new()
            .ptr(r.att)
            .ptr(h.scratch.qg.device_ptr())
            .i32(hd as i32)
            .i32(qd as i32)
            .i32(len as i32);
        Ok(self.launch(&h.k.gate, grid(len), DN_THREADS, 0, args)?)
    }

    /// Queues zeros over every DeltaNet state of `slot` (a sequence starting at position 0).
    pub(super) fn zero_states(&mut self, slot: usize) -> Result<(), ModelError> {
        for l in &mut self.layers {
            if let Some(st) = l.rec.get_mut(slot) {
                self.stream.fill_u32_async(st, 0)?;
            }
        }
        Ok(())
    }

    /// Before a step over `slots`: refuses a slot whose state a failed step lost, zeroes the
    /// states of those starting at position 0, and marks them all lost until the step succeeds
    /// ([`GpuDecoder::states_done`]).
    pub(super) fn states_begin(&mut self, slots: &[usize]) -> Result<(), ModelError> {
        if self.hybrid.is_none() {
            return Ok(());
        }
        for &slot in slots {
            if self.rec_lost[slot] && self.slot_pos[slot] > 0 {
                return Err(super::snapshot::lost(slot, self.slot_pos[slot]));
            }
        }
        for &slot in slots {
            if self.slot_pos[slot] == 0 {
                self.zero_states(slot)?;
            }
            self.rec_lost[slot] = true;
        }
        Ok(())
    }

    /// After a step over `slots` succeeded: their states are whole again.
    pub(super) fn states_done(&mut self, slots: &[usize]) {
        for &slot in slots {
            if let Some(l) = self.rec_lost.get_mut(slot) {
                *l = false;
            }
        }
    }
}

/// Blocks of [`DN_THREADS`] over `n` items.
fn grid(n: usize) -> u32 {
    (n as u32).div_ceil(DN_THREADS)
}

fn no_state(li: usize) -> ModelError {
    ModelError::Backend {
        backend: "gpu",
        message: format!("layer {li} is a DeltaNet layer without a recurrent state in VRAM"),
    }
}

fn no_state_table() -> ModelError {
    ModelError::Backend {
        backend: "gpu",
        message: "a batched DeltaNet step on a decoder without slot tables".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyHeadShare;

    fn dn(conv_kernel: usize, head_dim: usize) -> DeltaNetConfig {
        DeltaNetConfig {
            conv_kernel,
            n_k_heads: 16,
            n_v_heads: 32,
            key_share: KeyHeadShare::Tiled,
            head_dim,
            recurrent: vec![true, true, true, false],
        }
    }

    /// Every kernel of `delta_net.cu` compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    fn delta_net_kernels_compile_for_sm90_with_nvrtc() {
        crate::gpu::tests::assert_kernels_compile(&DELTA_NET_SOURCE, DELTA_NET_KERNEL_NAMES);
    }

    #[test]
    fn the_kernels_take_the_published_shapes_and_refuse_what_they_cannot_hold() {
        assert_eq!(unsupported_shape(&dn(4, 128)), None);
        assert_eq!(unsupported_shape(&dn(4, 64)), None);
        assert_eq!(unsupported_shape(&dn(DN_MAX_TAPS, DN_MAX_HEAD_DIM)), None);
        let m = unsupported_shape(&dn(DN_MAX_TAPS + 1, 128)).expect("refused");
        assert!(m.contains("9 taps"), "{m}");
        for hd in [96, 32, DN_MAX_HEAD_DIM + DN_HEAD_DIM_MULTIPLE] {
            let m = unsupported_shape(&dn(4, hd)).expect("refused");
            assert!(m.contains(&format!("heads of {hd}")), "{m}");
        }
    }

    /// The scratch's bytes are its buffers' (the budget counts what is allocated): the fused
    /// products only for qwen3next; they grow with the rows.
    #[test]
    fn the_scratch_budget_is_its_buffers() {
        for (arch, fused) in [(Arch::Qwen35, false), (Arch::Qwen3Next, true)] {
            let path = std::env::temp_dir().join(format!(
                "hipfire-dn-scratch-{}-{}.gguf",
                std::process::id(),
                arch.name()
            ));
            let spec = crate::synth::SynthSpec::tiny(arch);
            crate::synth::write_synthetic(&path, &spec, hipfire_quant::Format::F32, 7, None)
                .expect("synth");
            let model = crate::Model::load(&path, &crate::LoadOptions::default()).expect("load");
            let _ = std::fs::remove_file(&path);
            let c = model.config();
            let d = c.delta_net.as_ref().expect("hybrid");
            let rows = 3;
            let (cd, vd, hv) = (d.conv_dim(), d.value_dim(), d.n_v_heads);
            let fused_vals = match fused {
                true => rows * (cd + vd) + rows * 2 * hv,
                false => 2,
            };
            let want = 4 * (rows * (cd + 2 * vd + 2 * hv + 2 * c.q_dim()) + fused_vals);
            assert_eq!(HybridScratch::vram_bytes(c, d, rows), want as u64);
            assert!(HybridScratch::vram_bytes(c, d, 2 * rows) > want as u64);
        }
    }
}
