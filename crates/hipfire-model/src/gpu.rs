//! GPU decode: the whole step on the device, every projection through the offload executor.
//!
//! The activation never leaves the GPU except where a spilled projection needs the CPU: the
//! embedding row is dequantised on the host (one `d_model` row per token) and uploaded, norms,
//! RoPE, attention over a device KV cache (f16, as on the CPU path) and SwiGLU run as kernels
//! from `kernels/decode.cu`, resident weights live in device memory, and weights beyond
//! `memory.gpu_layer_budget` live in pinned host-mapped memory where both the GPU (over PCIe)
//! and the CPU pool can read them. Each projection over a spilled weight is handed to
//! [`hipfire_exec::offload::OffloadExecutor`], which runs it as `pcie`, `cpu` or `passback`
//! (split by rows, both engines at once).
//!
//! Layer placement follows llama.cpp's convention: the *first* `n_layer − budget` blocks spill,
//! the last `budget` stay resident; embeddings, output norm and head are always resident.

use std::sync::Arc;
use std::time::Instant;

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::{OffloadExecutor, OffloadMode, SpilledStep};
use hipfire_exec::CpuPool;
use hipfire_gpu::backend::LaunchDims;
use hipfire_gpu::{
    Context, DeviceBuffer, DeviceMemory, ExpertSet, Function, GemvForm, GemvKernels, GpuError,
    HostMappedBuffer, KernelRegistry, KernelSource, LaunchArgs, RowRange, Stream, WeightLocation,
    WeightRef,
};
use hipfire_quant::Format;

use crate::attention::CacheType;
use crate::block::{self, LayerTensors};
use crate::gpu_attention::{AttnShape, SplitKvAttention};
use crate::gpu_batch::{
    batch_head_dim_supported, BatchScratch, BatchWidths, PrefillKernels, PREFILL_SOURCE,
};
use crate::model::Decoder;
use crate::model::GenerationStats;
use crate::sampling::SamplingParams;
use crate::{Model, ModelError, Weight};

mod block_ops;
mod decode_batch;
mod decode_graph;
mod delta_net;
mod moe;
mod placement;
mod short_runs;
mod snapshot;
use block_ops::GpuStep;
pub use decode_batch::MAX_SLOTS;
use decode_batch::{DecodeBatch, StepActs};
use decode_graph::DecodeGraphs;
pub use decode_graph::DISABLE_GRAPHS_ENV;
pub use delta_net::{
    unsupported_shape as unsupported_delta_net_shape, DELTA_NET_KERNEL_NAMES, DELTA_NET_SOURCE,
};
use delta_net::{Hybrid, HybridKernels, HybridScratch};
use hipfire_gpu::dequant::DequantKernels;
use hipfire_gpu::{gemm_available, gemm_f16, GemmShape};
pub use moe::{route_shared_bytes, Gating, MOE_KERNEL_NAMES, MOE_SOURCE};
use moe::{GpuMoe, LayerExperts, MoeKernels, MoeScratch};
pub use placement::HostExperts;
use placement::{gib, ExpertPlacement, LayerPlacement, VramBudget};
use short_runs::{ShortRunChooser, StepForm};
pub use snapshot::GpuSnapshot;

/// `kernels/decode.cu`: RMSNorm, RoPE, the f16 and q8_0 KV stores, attention, SwiGLU, add.
pub const DECODE_SOURCE: KernelSource = KernelSource {
    name: "decode.cu",
    source: include_str!("../../../kernels/decode.cu"),
    headers: &[
        ("platform.cuh", hipfire_gpu::PLATFORM_CUH),
        ("f16.cuh", hipfire_gpu::F16_CUH),
        ("kv_q8.cuh", crate::gpu_kv::KV_Q8_CUH),
    ],
};

/// The kernels [`GpuDecoder`] launches from [`DECODE_SOURCE`], in [`DecodeKernels`] field order
/// (attention's are [`crate::gpu_attention::ATTENTION_KERNEL_NAMES`]).
const DECODE_KERNEL_NAMES: [&str; 12] = [
    "rms_norm_f32",
    "rope_f32",
    "kv_store_f16",
    "swiglu_f32",
    "add_f32",
    "geglu_f32",
    "rms_norm_add_f32",
    "softcap_f32",
    "rope_slots_f32",
    "kv_store_slots_f16",
    "kv_store_q8",
    "kv_store_slots_q8",
];

/// Threads per block of the small decode kernels: one block covers a 4096-wide row in 4 strides,
/// and 256 threads = 8 warps keeps the two-level reductions in `decode.cu` to one shuffle round.
const DECODE_THREADS: u32 = 256;
/// Device memory `auto` leaves free after placing layers: room for allocations made later (the
/// CUDA context's own growth, module loads, scratch) and for other users of the card. A chosen
/// margin, not yet measured against what hipfire itself allocates after placement.
const VRAM_MARGIN_BYTES: u64 = 2 << 30;

/// How to place and run the model on the GPU.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// Device ordinal.
    pub ordinal: usize,
    /// Repeating layers kept in VRAM; `None` = as many as fit (`auto`).
    pub gpu_layer_budget: Option<usize>,
    /// How spilled projections run.
    pub mode: OffloadMode,
    /// RAM that pinning spilled layers must leave available (`memory.ram_margin_mib`): pinned
    /// pages cannot be reclaimed, so a load that would eat into it is refused up front.
    pub ram_margin_bytes: u64,
    /// The `flags` join's knobs (`memory.flags_x_publish`; the rest stay at their measured
    /// defaults).
    pub flags: FlagsTuning,
    /// Tokens per batched prefill step (`model.ubatch`): the prompt runs through the layers in
    /// micro-batches of this many, each projection a GEMM; 1 feeds it token by token (GEMV).
    pub ubatch: usize,
    /// Layers whose routed experts stay in pinned host memory whatever VRAM is free
    /// (`--cpu-moe`, `--n-cpu-moe N`); the others' are resident while VRAM allows.
    pub host_experts: HostExperts,
}

/// Default of [`GpuOptions::ubatch`] (and of `model.ubatch`). Measured on the H200 box with the
/// synthetic Llama-3-8B Q4_K (docs/perf-checkpoints/2026-12-01-gpu-prefill-h200): pp2048 at
/// 256 / 512 / 1024 tokens per micro-batch ran 8225 / 10213 / 12479 tok/s all resident and
/// 7964 / 9983 / 12232 with 16 layers spilled, pp512 the same at 512 and 1024 (each weight is
/// expanded to f16 once per micro-batch, so fewer, larger ones amortise it). The scratch it sizes
/// is ~0.6 GiB for that model.
pub const DEFAULT_UBATCH: usize = 1024;

/// Most tokens of a step whose projections may run through the multi-column GEMV (each weight
/// read once for all of them, spilled rows split with the CPU pool as a batched decode step's
/// are) instead of the GEMM (each weight expanded to f16 first, spilled layers staged whole): the
/// kernel's widest launch. Within it the decoder's measured step times choose
/// ([`short_runs`]). A GEMM step expands every weight whatever the token count (2 tokens
/// ran 156 tok/s through it against 276 token by token,
/// docs/perf-checkpoints/2026-12-01-gpu-prefill-h200).
pub const SHORT_RUN_MAX_TOKENS: usize = hipfire_gpu::gemv::GEMV_MAX_COLS;

/// Default of [`GpuOptions::ram_margin_bytes`] (and of `memory.ram_margin_mib`): 4 GiB for the
/// OS, the mapped GGUF's hot pages and the process itself — the reference system refused loads
/// whose pinned bytes + 4 GiB exceeded MemAvailable after 2.5 GB of pinning stalled a 28 GB host.
pub const DEFAULT_RAM_MARGIN_BYTES: u64 = 4 << 30;

/// The step of a GPU error raised where no step is named yet; [`at_step`] replaces it.
const UNNAMED_GPU_STEP: &str = "running on the GPU";

/// Errors of the GPU path are GPU errors with the call named (and, through `at_step`, the
/// step), or model errors.
impl From<GpuError> for ModelError {
    fn from(e: GpuError) -> ModelError {
        ModelError::Gpu {
            step: UNNAMED_GPU_STEP.into(),
            source: Box::new(e),
        }
    }
}

/// Why the GPU engine cannot run a model of configuration `c` (`None`: it can): layers only the
/// CPU engine runs, or DeltaNet shapes beyond the GPU's kernels. [`GpuDecoder::new`] refuses such
/// a model with this reason; `--device auto` runs it on the CPU instead.
pub fn refusal(c: &crate::ModelConfig) -> Option<String> {
    if let Some(what) = c.cpu_only_layers() {
        return Some(format!("the GPU engine does not run {what} yet"));
    }
    let dn = c.delta_net.as_ref()?;
    delta_net::unsupported_shape(dn).map(|why| format!("the GPU engine does not run {why}"))
}

/// Names the step of a GPU failure (a [`ModelError::Gpu`] without one, or a GPU error from the
/// executor), so the message says what was being done: which weight, which position.
fn at_step(e: ModelError, step: impl FnOnce() -> String) -> ModelError {
    match e {
        ModelError::Gpu { step: s, source } if s == UNNAMED_GPU_STEP => ModelError::Gpu {
            step: step(),
            source,
        },
        ModelError::Exec(hipfire_exec::ExecError::Device(source)) => ModelError::Gpu {
            step: step(),
            source: Box::new(source),
        },
        other => other,
    }
}

/// A device address range that kernels may read or write: a sub-slice of a [`DeviceBuffer`].
#[derive(Debug)]
struct DeviceView<'a> {
    ptr: u64,
    bytes: usize,
    ctx: &'a Arc<Context>,
}

impl DeviceMemory for DeviceView<'_> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.bytes
    }
    fn context(&self) -> &Arc<Context> {
        self.ctx
    }
}

/// Where one weight's bytes live on the GPU side.
#[derive(Debug)]
enum GpuWeight {
    Device(DeviceBuffer<u8>),
    /// Shared with the offload executor's CPU arms, which may outlive the call that queued them.
    Host(Arc<HostMappedBuffer>),
}

impl GpuWeight {
    fn weight_ref(&self, w: &Weight) -> Result<WeightRef<'_>, GpuError> {
        match self {
            GpuWeight::Device(b) => WeightRef::new(b, 0, w.format, w.m, w.k),
            GpuWeight::Host(b) => WeightRef::new(b.as_ref(), 0, w.format, w.m, w.k),
        }
    }
}

struct GpuLayer {
    /// The block's tensors ([`Model`]'s table): projection ids, norms and biases in VRAM.
    t: LayerTensors<usize, DeviceBuffer<f32>>,
    /// Per sequence slot, `ctx_len` positions in the decoder's [`crate::gpu_kv::GpuKvLayout`];
    /// none for a DeltaNet layer.
    k_cache: Vec<DeviceBuffer<u8>>,
    v_cache: Vec<DeviceBuffer<u8>>,
    /// Per sequence slot, a DeltaNet layer's recurrent state (`gpu/delta_net.rs`); none for an
    /// attention layer.
    rec: Vec<DeviceBuffer<f32>>,
    /// Positions a sliding-window (local) layer's query sees; `None` for a global layer.
    window: Option<usize>,
    /// The routed experts' tables (`None` for a dense FFN).
    experts: Option<LayerExperts>,
}

struct DecodeKernels {
    rms_norm: Function,
    rope: Function,
    kv_store: Function,
    swiglu: Function,
    add: Function,
    /// Gemma's gated FFN (tanh GELU) in place of SwiGLU.
    geglu: Function,
    /// Gemma's post-norm: `y += rms_norm(x) · w`, per row.
    rms_norm_add: Function,
    /// Gemma's final-logit soft-cap.
    softcap: Function,
    /// RoPE and the KV store of a batched decode step: one row per sequence, each at its own
    /// position and into its own cache.
    rope_slots: Function,
    kv_store_slots: Function,
    /// The q8_0 cache's stores (one position's run, and the slots form).
    kv_store_q8: Function,
    kv_store_slots_q8: Function,
}

/// What a decode step needs beyond its activations: the RoPE tables.
struct Scratch {
    /// One token's activations.
    a: StepActs,
    /// RoPE's per-pair frequencies ([`crate::rope::Rope::inv_freq`]).
    inv_freq: DeviceBuffer<f32>,
    /// RoPE's cos/sin magnitude ([`crate::rope::Rope::mscale`]; YaRN's `1 + 0.1 ln s`).
    rope_mscale: f32,
    /// Sliding-window layers' frequencies and magnitude, when the model has such layers.
    rope_local: Option<(DeviceBuffer<f32>, f32)>,
}

/// A model placed on the GPU with one decode session (KV cache) of its own.
pub struct GpuDecoder<'m> {
    model: &'m Model,
    ctx: Arc<Context>,
    stream: Stream,
    gemv: GemvKernels,
    k: DecodeKernels,
    attention: SplitKvAttention,
    weights: Vec<Option<GpuWeight>>,
    layers: Vec<GpuLayer>,
    head: usize,
    token_embd: usize,
    output_norm: DeviceBuffer<f32>,
    s: Scratch,
    offload: OffloadExecutor,
    /// Batched-prefill kernels and scratch; `None` runs prompts token by token (no GEMM library,
    /// a head the chunk attention does not cover, or `ubatch` 1).
    batch: Option<Batch>,
    /// The routed FFN's kernels and scratch (`None` for a dense model).
    moe: Option<GpuMoe>,
    logits: Vec<f32>,
    /// Logits of each segment of the last [`GpuDecoder::forward_segments`], `segs × vocab`.
    seg_logits: Vec<f32>,
    /// Positions each sequence slot holds; `slot` is the one `prefill`/`step` feed.
    slot_pos: Vec<usize>,
    slot: usize,
    /// Scratch of a batched decode step over several slots, of one slot's replayed steps and of
    /// short prompt runs' multi-column GEMV (`None` with one slot, graphs off and no batched
    /// prefill).
    decode_batch: Option<DecodeBatch>,
    /// Steps run so far, by form.
    step_counts: StepCounts,
    /// Measured step times by form, which choose a short run's ([`SHORT_RUN_MAX_TOKENS`]).
    short_runs: ShortRunChooser,
    /// Captured decode steps (`None`: each kernel launched; always so with spilled layers,
    /// whose steps need the host between kernels).
    graphs: Option<DecodeGraphs>,
    /// A hybrid model's kernels and scratch (`None` for the other architectures).
    hybrid: Option<Hybrid>,
    /// Per slot, whether a failed step left its recurrent states half-advanced
    /// ([`GpuDecoder::states_begin`]).
    rec_lost: Vec<bool>,
    /// Snapshot bookkeeping ([`GpuSnapshot`]).
    snaps: snapshot::SnapshotLog,
    ctx_len: usize,
    summary: String,
}

/// Steps a decoder ran, by the form of their projections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounts {
    /// One token: the GEMV (or a replayed graph).
    pub single: u64,
    /// 2 to [`SHORT_RUN_MAX_TOKENS`] tokens: the multi-column GEMV.
    pub cols: u64,
    /// More (or a decoder without the multi-column scratch): the GEMM.
    pub gemm: u64,
}

impl StepCounts {
    fn count(&mut self, tokens: usize, cols: bool) {
        match (tokens, cols) {
            (1, _) => self.single += 1,
            (_, true) => self.cols += 1,
            _ => self.gemm += 1,
        }
    }
}

/// What a batched step needs beyond the decode step's kernels.
struct Batch {
    kernels: PrefillKernels,
    dequant: DequantKernels,
    scratch: BatchScratch,
}

impl std::fmt::Debug for GpuDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoder")
            .field("summary", &self.summary)
            .field("slot_pos", &self.slot_pos)
            .finish()
    }
}

fn upload_f32(
    ctx: &Arc<Context>,
    stream: &Stream,
    v: &[f32],
) -> Result<DeviceBuffer<f32>, GpuError> {
    let mut b = ctx.alloc::<f32>(v.len())?;
    b.upload(stream, v)?;
    Ok(b)
}

fn read_vector(model: &Model, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
    let Some(t) = model.gguf().index().tensor(name) else {
        return Ok(None);
    };
    let fmt = Format::from_ggml_type(t.ggml_type.0)
        .map_err(|_| ModelError::Unsupported(format!("tensor {name} has type {}", t.ggml_type)))?;
    if t.n_elements() != n as u64 {
        return Err(ModelError::Shape {
            name: name.into(),
            want: vec![n as u64],
            got: t.dims.clone(),
        });
    }
    let mut v = vec![0f32; n];
    crate::ops::dequantize_row(fmt, model.gguf().tensor_data(t), &mut v)?;
    Ok(Some(v))
}

/// The tables of one layer's routed experts `m` (each placed already, in VRAM or pinned host
/// memory), for the ids GEMV.
fn expert_tables(
    model: &Model,
    ctx: &Arc<Context>,
    stream: &Stream,
    weights: &[Option<GpuWeight>],
    m: &block::MoeTensors<usize, Vec<f32>>,
) -> Result<LayerExperts, ModelError> {
    let set = |ids: &[usize]| -> Result<ExpertSet, ModelError> {
        let mut refs = Vec::with_capacity(ids.len());
        for &id in ids {
            let w = &model.weights()[id];
            let gw = weights[id]
                .as_ref()
                .ok_or_else(|| ModelError::Unsupported(format!("weight {} not placed", w.name)))?;
            refs.push(gw.weight_ref(w)?);
        }
        // SAFETY: each expert's buffer is owned by the decoder's `weights` table for the
        // decoder's whole life, and the tables are read only by launches the decoder queues
        // while it lives (each step synchronises its stream before returning).
        Ok(unsafe { ExpertSet::new(ctx, stream, &refs)? })
    };
    Ok(LayerExperts {
        router: m.router,
        gate: set(&m.gate)?,
        up: set(&m.up)?,
        down: set(&m.down)?,
    })
}

fn weight_id(model: &Model, name: &str) -> Result<usize, ModelError> {
    model
        .weights()
        .iter()
        .position(|w| w.name == name)
        .ok_or_else(|| ModelError::Unsupported(format!("missing weight {name}")))
}

impl<'m> GpuDecoder<'m> {
    /// Place `model` on GPU `opts.ordinal`: resident layers in VRAM, spilled ones in pinned
    /// host-mapped memory, spilled projections run by `opts.mode` on `pool` and the GPU.
    pub fn new(
        model: &'m Model,
        pool: CpuPool,
        opts: &GpuOptions,
    ) -> Result<GpuDecoder<'m>, ModelError> {
        GpuDecoder::with_slots(model, pool, opts, 1)
    }

    /// As [`GpuDecoder::new`] with `slots` sequences, each with a KV cache of its own (counted in
    /// the placement budget), for [`GpuDecoder::decode_slots`]: one batched decode step over
    /// many sequences (a server's running batch).
    pub fn with_slots(
        model: &'m Model,
        pool: CpuPool,
        opts: &GpuOptions,
        slots: usize,
    ) -> Result<GpuDecoder<'m>, ModelError> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(ModelError::InvalidOption(format!(
                "{slots} sequence slots (1 to {MAX_SLOTS})"
            )));
        }
        if let Some(why) = refusal(model.config()) {
            return Err(ModelError::Unsupported(format!(
                "{}: {why}; run it on the CPU (--device cpu)",
                model.config().arch.name()
            )));
        }
        let c = model.config().clone();
        let ctx = Context::new(opts.ordinal)?;
        let stream = ctx.new_stream()?;
        let registry = KernelRegistry::new(&ctx);
        let gemv = GemvKernels::new(&registry)?;
        let module = registry.module(&DECODE_SOURCE, &[])?;
        let [rms_norm, rope, kv_store, swiglu, add, geglu, rms_norm_add, softcap, rope_slots, kv_store_slots, kv_store_q8, kv_store_slots_q8] =
            DECODE_KERNEL_NAMES.map(|n| module.function(n));
        let k = DecodeKernels {
            rms_norm: rms_norm?,
            rope: rope?,
            kv_store: kv_store?,
            swiglu: swiglu?,
            add: add?,
            geglu: geglu?,
            rms_norm_add: rms_norm_add?,
            rope_slots: rope_slots?,
            kv_store_slots: kv_store_slots?,
            kv_store_q8: kv_store_q8?,
            kv_store_slots_q8: kv_store_slots_q8?,
            softcap: softcap?,
        };
        // The model refused a q8_0 cache for a head_dim that is not a multiple of 32 at load.
        let mut attention = SplitKvAttention::for_cache(
            &module,
            AttnShape {
                n_head: c.n_head,
                n_kv_head: c.n_head_kv,
                head_dim: c.head_dim,
            },
            model.cache_type(),
            1,
        )?;
        attention.set_scale(c.attn_scale);
        let ctx_len = model.ctx_len();

        // Budget: bytes of one layer's projections but its routed experts, of one routed expert
        // per layer (placed apart: `ExpertPlacement`), and of what stays resident regardless.
        let host_layers = opts.host_experts.host_layers(c.n_layer, c.moe.is_some())?;
        let mut layer_bytes = vec![0u64; c.n_layer];
        let mut expert_bytes = vec![0u64; c.n_layer];
        for i in 0..c.n_layer {
            let t = model.layer_tensors(i);
            for id in t.layer_projections() {
                layer_bytes[i] += model.weights()[id].n_bytes as u64;
            }
            if let Some(m) = t.ffn.moe() {
                for id in m.expert(0) {
                    expert_bytes[i] += model.weights()[id].n_bytes as u64;
                }
            }
        }
        // The kernels index a cache with 32-bit ints (row × kv_dim).
        if i32::try_from(ctx_len * c.kv_dim()).is_err() {
            return Err(ModelError::ContextSize {
                requested: ctx_len,
                trained: c.ctx_len,
                arch: c.arch.name(),
                cap: i32::MAX as usize / c.kv_dim(),
            });
        }
        // The KV caches of every slot, and a batched (or replayed) decode step's activations
        // beside them.
        let want_graphs = decode_graph::graphs_enabled();
        // Batched prefill: GEMMs through the vendor BLAS, so only where it loads; its scratch is
        // counted in the placement budget like the KV cache.
        let ubatch = opts.ubatch.clamp(1, ctx_len.max(1));
        let batch_off = if ubatch < 2 {
            Some("model.ubatch is 1".to_string())
        } else if !batch_head_dim_supported(c.head_dim) {
            Some(format!(
                "head_dim {} is outside the chunk attention's even widths up to {}",
                c.head_dim,
                crate::gpu_batch::MAX_BATCH_HEAD_DIM
            ))
        } else if !gemm_available(&stream) {
            Some(format!(
                "no GEMM library on {} (cuBLAS not found)",
                ctx.backend().name()
            ))
        } else {
            // The GEMM step expands every weight on the device; a format without a GPU kernel
            // stays with the CPU engine, which the GEMV path's planner runs it on.
            model
                .weights()
                .iter()
                .find(|w| !w.format.has_gpu_kernel())
                .map(|w| format!("{} weights have no GPU dequantiser", w.format.name()))
        };
        // Rows of the multi-column scratch: one per slot, and with batched prefill at least a
        // short run's (SHORT_RUN_MAX_TOKENS); none for one slot without either.
        let cols_rows = |graphs: bool| match (&batch_off, slots > 1 || graphs) {
            (None, _) => Some(slots.max(SHORT_RUN_MAX_TOKENS)),
            (Some(_), true) => Some(slots),
            (Some(_), false) => None,
        };
        // A hybrid model's scratch serves every step form: as many rows as the widest (a
        // micro-batch, a batched decode step or a short run, one token).
        let hybrid_rows = [
            1,
            cols_rows(want_graphs).unwrap_or(1),
            if batch_off.is_none() { ubatch } else { 1 },
        ]
        .into_iter()
        .max()
        .unwrap_or(1);
        let hybrid_bytes = c
            .delta_net
            .as_ref()
            .map_or(0, |dn| HybridScratch::vram_bytes(&c, dn, hybrid_rows));
        // Rows of one layer call: a micro-batch, a short run or a batched decode step.
        let moe_rows = cols_rows(want_graphs)
            .unwrap_or(1)
            .max(if batch_off.is_none() { ubatch } else { 1 });
        // `kv_cache_bytes` counts the attention layers' caches and the DeltaNet layers'
        // recurrent states of one sequence.
        let kv = model.kv_cache_bytes() * slots as u64
            + cols_rows(want_graphs).map_or(0, |rows| DecodeBatch::vram_bytes(&c, rows))
            + hybrid_bytes
            + MoeScratch::vram_bytes(&c, moe_rows);
        let mut widths = BatchWidths {
            d_model: c.d_model,
            q_dim: c.q_dim(),
            kv_dim: c.kv_dim(),
            n_ff: c.n_ff,
            max_k: 0,
            max_weight_elems: 0,
            max_spilled_bytes: 0,
        };
        // A spilled layer is staged whole (`gpu_batch::staged_layer_bytes`).
        let mut max_proj_bytes = 0usize;
        for i in 0..c.n_layer {
            let mut sizes = Vec::with_capacity(7);
            for id in model.layer_tensors(i).layer_projections() {
                let w = &model.weights()[id];
                widths.max_k = widths.max_k.max(w.k);
                widths.max_weight_elems = widths.max_weight_elems.max(w.m * w.k);
                sizes.push(w.n_bytes);
            }
            max_proj_bytes = max_proj_bytes.max(crate::gpu_batch::staged_layer_bytes(sizes));
        }
        let batch_bytes = |spill: bool| -> u64 {
            if batch_off.is_some() {
                return 0;
            }
            let w = BatchWidths {
                max_spilled_bytes: if spill { max_proj_bytes } else { 0 },
                ..widths
            };
            BatchScratch::vram_bytes(&w, ubatch)
        };
        let fixed: u64 = model
            .weights()
            .iter()
            .filter(|w| !w.name.starts_with("blk."))
            .map(|w| w.n_bytes as u64)
            .sum();
        // Free memory now, not the card's total: another process may hold some of it.
        let (free_now, _) = ctx.mem_info()?;
        let vram = VramBudget {
            free: free_now,
            kv,
            fixed,
            scratch_spilled: batch_bytes(true),
            scratch_resident: batch_bytes(false),
            auto_margin: VRAM_MARGIN_BYTES,
            ctx_len,
            ubatch,
        };
        let placement = LayerPlacement::new(layer_bytes, opts.gpu_layer_budget, &vram)?;
        let n_spilled = placement.spilled();
        // The experts get what the layers left, less the margin `auto` keeps.
        let scratch = match n_spilled {
            0 => vram.scratch_resident,
            _ => vram.scratch_spilled,
        };
        let room = free_now
            .saturating_sub(VRAM_MARGIN_BYTES + fixed + kv + scratch + placement.resident_bytes());
        let n_expert = c.moe.as_ref().map_or(0, |m| m.n_expert);
        let experts = ExpertPlacement::new(expert_bytes, n_expert, host_layers, n_spilled, room);
        placement.check_pinned_ram(
            hipfire_gpu::mem_available_bytes(),
            opts.ram_margin_bytes,
            experts.host_bytes(),
        )?;

        let mut weights: Vec<Option<GpuWeight>> =
            (0..model.weights().len()).map(|_| None).collect();
        let place =
            |weights: &mut [Option<GpuWeight>], id: usize, host: bool| -> Result<(), ModelError> {
                if weights[id].is_some() {
                    return Ok(());
                }
                let w = &model.weights()[id];
                let bytes = model.weight_bytes(w);
                let placed = (|| -> Result<GpuWeight, GpuError> {
                    Ok(if host {
                        let mut b = ctx.alloc_host_mapped(bytes.len())?;
                        b.as_mut_slice().copy_from_slice(bytes);
                        GpuWeight::Host(Arc::new(b))
                    } else {
                        let mut b = ctx.alloc::<u8>(bytes.len())?;
                        b.upload(&stream, bytes)?;
                        GpuWeight::Device(b)
                    })
                })()
                .map_err(|e| {
                    at_step(e.into(), || {
                        format!(
                            "placing weight {} ({} bytes, {})",
                            w.name,
                            bytes.len(),
                            if host { "pinned host memory" } else { "VRAM" }
                        )
                    })
                })?;
                weights[id] = Some(placed);
                Ok(())
            };
        let mut layers = Vec::with_capacity(c.n_layer);
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let kv_layout = attention.layout();
        for i in 0..c.n_layer {
            let spilled = placement.is_spilled(i);
            let host = model.layer_tensors(i);
            for id in host.layer_projections() {
                place(&mut weights, id, spilled)?;
            }
            if let Some(m) = host.ffn.moe() {
                for e in 0..m.gate.len() {
                    for id in m.expert(e) {
                        place(&mut weights, id, !experts.is_resident(i, e))?;
                    }
                }
            }
            // Rounded up to whole 32-bit words so the zero fill covers every byte.
            let cache_len = kv_layout.alloc_bytes(ctx_len);
            let kv_step = || format!("allocating layer {i}'s KV cache ({ctx_len} positions)");
            let recurrent = c.delta_net.as_ref().filter(|dn| dn.is_recurrent(i));
            let mut k_cache = Vec::with_capacity(slots);
            let mut v_cache = Vec::with_capacity(slots);
            let mut rec = Vec::new();
            if let Some(dn) = recurrent {
                let rec_step = || format!("allocating layer {i}'s recurrent state");
                for _ in 0..slots {
                    // Zeroed again whenever a step starts the slot from position 0.
                    let mut b = ctx
                        .alloc::<f32>(dn.state_values())
                        .map_err(|e| at_step(e.into(), rec_step))?;
                    stream
                        .fill_u32_async(&mut b, 0)
                        .map_err(|e| at_step(e.into(), rec_step))?;
                    rec.push(b);
                }
            }
            let cache_slots = if recurrent.is_some() { 0 } else { slots };
            for _ in 0..cache_slots {
                for cache in [&mut k_cache, &mut v_cache] {
                    let mut b = ctx
                        .alloc::<u8>(cache_len)
                        .map_err(|e| at_step(e.into(), kv_step))?;
                    stream
                        .fill_u32_async(&mut b, 0)
                        .map_err(|e| at_step(e.into(), kv_step))?;
                    cache.push(b);
                }
            }
            let layer_experts = match host.ffn.moe() {
                Some(m) => Some(expert_tables(model, &ctx, &stream, &weights, m)?),
                None => None,
            };
            layers.push(GpuLayer {
                t: host.map_vectors(|v| upload_f32(&ctx, &stream, v))?,
                k_cache,
                v_cache,
                rec,
                window: c.layer_window(i),
                experts: layer_experts,
            });
        }
        let head = match model
            .weights()
            .iter()
            .position(|w| w.name == "output.weight")
        {
            Some(id) => id,
            None => weight_id(model, "token_embd.weight")?,
        };
        place(&mut weights, head, false)?;
        let token_embd = weight_id(model, "token_embd.weight")?;
        let output_norm = upload_f32(&ctx, &stream, model.output_norm())?;

        let factors = read_vector(model, "rope_freqs.weight", c.rope_dim / 2)?;
        // The frequencies and magnitude come from the CPU engine's own table (one place for
        // scaling); the kernel takes them in f32.
        let rope = crate::rope::Rope::new(
            c.rope_dim,
            c.rope_theta,
            c.rope_neox,
            &c.rope_scaling,
            factors.as_deref(),
        );
        let inv_freq: Vec<f32> = rope.inv_freq().iter().map(|&f| f as f32).collect();
        let rope_mscale = rope.mscale() as f32;
        // Sliding-window layers' own RoPE (their base, no context scaling), as the CPU path's
        // `Model::layer_rope`.
        let rope_local = c.sliding_window.as_ref().map(|sw| {
            crate::rope::Rope::new(
                c.rope_dim,
                sw.rope_theta,
                c.rope_neox,
                &sw.rope_scaling(&c.rope_scaling, c.ctx_len),
                factors.as_deref(),
            )
        });
        let s = Scratch {
            a: StepActs::new(&ctx, &c, 1)?,
            inv_freq: upload_f32(&ctx, &stream, &inv_freq)?,
            rope_mscale,
            rope_local: match &rope_local {
                Some(r) => {
                    let f: Vec<f32> = r.inv_freq().iter().map(|&f| f as f32).collect();
                    Some((upload_f32(&ctx, &stream, &f)?, r.mscale() as f32))
                }
                None => None,
            },
        };
        stream.synchronize()?;
        // The widest call: gate + up, or q + k + v, go to the executor together; a hybrid's
        // gated query is two heads' widths a head, its DeltaNet input projections go together
        // and its output projection reads value_dim; the shared expert's projections go to the
        // executor too (the routed ones never do).
        let (dn_k, dn_m) = c.delta_net.as_ref().map_or((0, 0), |dn| {
            (
                dn.value_dim(),
                dn.conv_dim() + dn.value_dim() + 2 * dn.n_v_heads,
            )
        });
        let sf = c.moe.as_ref().and_then(|m| m.n_ff_shared).unwrap_or(0);
        let gated_q = if c.arch.hybrid() { qd } else { 0 };
        let max_k = c.d_model.max(c.n_ff).max(qd).max(dn_k).max(sf);
        let max_m = c
            .d_model
            .max(2 * c.n_ff)
            .max(qd + gated_q + 2 * kvd)
            .max(dn_m)
            .max(2 * sf);
        let mut offload = OffloadExecutor::new(&ctx, pool, opts.mode.clone(), max_k, max_m)?;
        offload.set_flags_tuning(opts.flags);
        // Replayed steps run the batched step's form (positions and caches read from device
        // tables), so one slot gets that scratch too when they are on.
        let graphs = (want_graphs && n_spilled == 0 && ctx.backend().has_graphs())
            .then(DecodeGraphs::default);
        let decode_batch = match cols_rows(graphs.is_some()) {
            Some(rows) => {
                offload.reserve_columns(rows)?;
                Some(DecodeBatch::new(&ctx, &c, rows).map_err(|e| {
                    at_step(e, || {
                        format!("allocating the multi-column scratch for {rows} rows")
                    })
                })?)
            }
            None => None,
        };
        let batch = match &batch_off {
            Some(why) => {
                tracing::info!(target: "hipfire::model", reason = %why, "prefill runs token by token");
                None
            }
            None => {
                let pmod = registry.module(&PREFILL_SOURCE, &[])?;
                widths.max_spilled_bytes = if n_spilled > 0 { max_proj_bytes } else { 0 };
                let mut scratch = BatchScratch::new(&ctx, &widths, ubatch).map_err(|e| {
                    at_step(e.into(), || {
                        format!("allocating the prefill scratch for {ubatch} tokens")
                    })
                })?;
                if let Some(spill) = scratch.spill.as_mut() {
                    let mut order = Vec::new();
                    for (li, l) in layers[..n_spilled].iter().enumerate() {
                        let mut ws = Vec::new();
                        // The routed experts are read where they are by the ids GEMV, never staged.
                        for id in l.t.layer_projections() {
                            if let Some(GpuWeight::Host(h)) = &weights[id] {
                                ws.push((id, h.clone()));
                            }
                        }
                        order.push(crate::gpu_batch::StagedLayer::new(li, ws));
                    }
                    spill.set_order(order);
                    // The first prompt's first spilled layers copy while the caller gets ready.
                    spill.prestage()?;
                }
                Some(Batch {
                    kernels: PrefillKernels::new(&pmod)?,
                    dequant: DequantKernels::new(&registry)?,
                    scratch,
                })
            }
        };
        let prefill_text = match &batch_off {
            None => format!(
                "prefill batched ({ubatch}-token GEMM micro-batches, {} per step; runs of 2–{} tokens through the multi-column GEMV)",
                crate::gpu_batch::UBATCHES_PER_STEP,
                SHORT_RUN_MAX_TOKENS.min(ubatch.max(2))
            ),
            Some(why) => format!("prefill token by token ({why})"),
        };
        let hybrid = match &c.delta_net {
            Some(dn) => {
                let module = registry.module(&DELTA_NET_SOURCE, &[])?;
                let scratch = HybridScratch::new(&ctx, &c, dn, hybrid_rows).map_err(|e| {
                    at_step(e, || {
                        format!("allocating the DeltaNet scratch for {hybrid_rows} rows")
                    })
                })?;
                Some(Hybrid {
                    k: HybridKernels::new(&module)?,
                    scratch,
                })
            }
            None => None,
        };
        let resident_gib = gib(placement.resident_bytes());
        let graph_text = if graphs.is_some() {
            "; decode steps replayed from CUDA graphs"
        } else {
            ""
        };
        let kv_text = if slots > 1 {
            format!(
                "{}, ctx {ctx_len} × {slots} sequence slots, batched decode",
                kv_layout.cache_type.name()
            )
        } else {
            format!("{}, ctx {ctx_len}", kv_layout.cache_type.name())
        };
        let moe = match &c.moe {
            Some(mc) => Some(GpuMoe {
                k: MoeKernels::new(&registry.module(&MOE_SOURCE, &[])?)?,
                scratch: MoeScratch::new(&ctx, &c, moe_rows).map_err(|e| {
                    at_step(e, || {
                        format!("allocating the routed-expert scratch for {moe_rows} rows")
                    })
                })?,
                gating: Gating::for_config(mc.gating)?,
            }),
            None => None,
        };
        let experts_text = experts.summary();
        let rec_text = match &c.delta_net {
            Some(_) => format!(
                ", {} DeltaNet layers' recurrent state ({:.1} MiB a sequence)",
                c.n_layer - c.n_attention_layers(),
                c.recurrent_bytes_per_sequence() as f64 / f64::from(1u32 << 20)
            ),
            None => String::new(),
        };
        let summary = format!(
            "{} on {} ({}): {} of {} layers resident ({:.2} GiB VRAM), {} spilled to pinned host memory ({:.2} GiB, offload_exec={}){experts_text}; embeddings, head, KV cache ({kv_text}{rec_text}, {:.2} GiB) and attention on the GPU; {prefill_text}{graph_text}",
            c.arch.name(),
            ctx.info().name,
            ctx.info().arch,
            placement.resident(),
            c.n_layer,
            resident_gib,
            n_spilled,
            gib(placement.spilled_bytes()),
            offload.describe(),
            gib(kv),
        );
        tracing::info!(target: "hipfire::model", summary = %summary, "model placed");
        let vocab = c.vocab;
        Ok(GpuDecoder {
            model,
            ctx,
            stream,
            gemv,
            k,
            attention,
            weights,
            layers,
            head,
            token_embd,
            output_norm,
            s,
            offload,
            batch,
            moe,
            logits: vec![0.0; vocab],
            seg_logits: vec![0.0; vocab],
            slot_pos: vec![0; slots],
            slot: 0,
            decode_batch,
            step_counts: StepCounts::default(),
            short_runs: ShortRunChooser::default(),
            graphs,
            hybrid,
            rec_lost: vec![false; slots],
            snaps: snapshot::SnapshotLog::new(slots),
            ctx_len,
            summary,
        })
    }

    /// Steps run so far, by form (how a prompt's runs were routed).
    pub fn step_counts(&self) -> StepCounts {
        self.step_counts
    }

    /// One line: what was placed where.
    pub fn placement_summary(&self) -> &str {
        &self.summary
    }

    /// The offload executor (trace and share state).
    pub fn offload(&self) -> &OffloadExecutor {
        &self.offload
    }

    /// Positions filled so far (in the selected slot).
    pub fn position(&self) -> usize {
        self.pos()
    }

    /// Forget the conversation (of the selected slot); a hybrid model's recurrent states are
    /// zeroed when the next step starts the slot from position 0.
    pub fn reset(&mut self) {
        self.slot_pos[self.slot] = 0;
        self.snaps.rewound(self.slot, 0);
    }

    fn pos(&self) -> usize {
        self.slot_pos[self.slot]
    }

    /// Sequence slots (each with its own KV cache).
    pub fn slots(&self) -> usize {
        self.slot_pos.len()
    }

    /// Make `slot` the one [`GpuDecoder::prefill`], [`GpuDecoder::step`],
    /// [`GpuDecoder::position`] and [`GpuDecoder::reset`] act on.
    pub fn select_slot(&mut self, slot: usize) -> Result<(), ModelError> {
        if slot >= self.slot_pos.len() {
            return Err(ModelError::InvalidOption(format!(
                "slot {slot} of {}",
                self.slot_pos.len()
            )));
        }
        self.slot = slot;
        Ok(())
    }

    /// Positions slot `slot` holds (0 for a slot that does not exist).
    pub fn slot_position(&self, slot: usize) -> usize {
        self.slot_pos.get(slot).copied().unwrap_or(0)
    }

    /// Forget every position of `slot` from `pos` on (no-op past its end): what a failed step
    /// wrote there is never read.
    ///
    /// A hybrid model's recurrent state cannot go back: truncating below the slot's position
    /// to anything but 0 leaves the slot refused until it is reset or a snapshot restored.
    pub fn truncate_slot(&mut self, slot: usize, pos: usize) {
        if let Some(p) = self.slot_pos.get_mut(slot) {
            if pos < *p {
                *p = pos;
                self.snaps.rewound(slot, pos);
                if self.hybrid.is_some() && pos > 0 {
                    self.rec_lost[slot] = true;
                }
            }
        }
    }

    /// The model this decoder runs.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Logits of the last position fed.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Feed `tokens`; returns the logits after the last one. With batched prefill on, the
    /// tokens go through the layers in steps of up to `UBATCHES_PER_STEP` micro-batches of
    /// `ubatch` tokens (GEMMs), layer-major within a step; otherwise one by one.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        if self.pos() + tokens.len() > self.ctx_len {
            return Err(ModelError::ContextFull {
                need: self.pos() + tokens.len(),
                ctx: self.ctx_len,
            });
        }
        let step = self.batch.as_ref().map_or(1, |b| b.scratch.step_rows);
        for chunk in tokens.chunks(step) {
            self.forward_at_step(chunk, "prefilling")?;
        }
        Ok(&self.logits)
    }

    /// Feed one token; returns the next-token logits.
    pub fn step(&mut self, token: u32) -> Result<&[f32], ModelError> {
        self.forward_at_step(&[token], "decoding")?;
        Ok(&self.logits)
    }

    /// [`GpuDecoder::forward`] with a GPU failure naming the phase, positions and tokens.
    fn forward_at_step(&mut self, tokens: &[u32], phase: &str) -> Result<(), ModelError> {
        let pos = self.pos();
        let r = self.forward(tokens);
        if r.is_err() {
            if let Some(spill) = self.batch.as_ref().and_then(|b| b.scratch.spill.as_ref()) {
                // Best effort: the step already failed; a second failure would hide the first.
                let _ = spill.drain();
            }
        }
        r.map_err(|e| {
            at_step(e, || match tokens {
                [t] => format!("{phase} position {pos} (token {t})"),
                _ => format!(
                    "{phase} positions {pos}..{} ({} tokens in one batched step)",
                    pos + tokens.len(),
                    tokens.len()
                ),
            })
        })
    }

    /// As [`crate::Session::generate`], on the GPU.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &SamplingParams,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<GenerationStats, ModelError> {
        crate::model::generate(self, prompt, params, on_token)
    }

    fn launch(
        &self,
        f: &Function,
        grid: u32,
        block: u32,
        shared: u32,
        args: LaunchArgs,
    ) -> Result<(), GpuError> {
        let dims = LaunchDims {
            grid,
            block,
            shared_bytes: shared,
        };
        launch_on(&self.ctx, &self.stream, f, dims, args)
    }

    /// An elementwise kernel over `n` items: one thread each, [`DECODE_THREADS`] per block.
    fn launch_1d(&self, f: &Function, n: usize, args: LaunchArgs) -> Result<(), GpuError> {
        self.launch(
            f,
            (n as u32).div_ceil(DECODE_THREADS),
            DECODE_THREADS,
            0,
            args,
        )
    }

    fn rms_norm(&self, x: u64, w: u64, y: u64, rows: usize, n: usize) -> Result<(), GpuError> {
        let args = LaunchArgs::new()
            .ptr(x)
            .ptr(w)
            .ptr(y)
            .i32(n as i32)
            .f32(self.model.config().rms_eps);
        self.launch(&self.k.rms_norm, rows as u32, DECODE_THREADS, 0, args)
    }

    /// The RoPE table (frequencies, magnitude) of layer `li`: a sliding-window layer's own when
    /// the model has one.
    fn rope_table(&self, li: usize) -> (&DeviceBuffer<f32>, f32) {
        match (&self.s.rope_local, self.layers[li].window) {
            (Some((f, m)), Some(_)) => (f, *m),
            _ => (&self.s.inv_freq, self.s.rope_mscale),
        }
    }

    fn rope(&self, li: usize, x: u64, n_heads: usize, pos: usize) -> Result<(), GpuError> {
        let c = self.model.config();
        let (freq, mscale) = self.rope_table(li);
        let args = LaunchArgs::new()
            .ptr(x)
            .i32(c.head_dim as i32)
            .i32(c.rope_dim as i32)
            .i32(pos as i32)
            .buf(freq)
            .i32(i32::from(c.rope_neox))
            .f32(mscale);
        self.launch(&self.k.rope, n_heads as u32, 64, 0, args)
    }

    /// Stores `m` positions' k and v rows (f32 at `k`, `v`, `kv_dim` each) into layer `li`'s
    /// caches of the current slot from position `pos`: rounded to f16, or quantised to q8_0
    /// (quants and the runs' scales, [`crate::gpu_kv`]).
    fn kv_store(&self, li: usize, k: u64, v: u64, pos: usize, m: usize) -> Result<(), GpuError> {
        let l = &self.layers[li];
        let (kc, vc) = (&l.k_cache[self.slot], &l.v_cache[self.slot]);
        let layout = self.attention.layout();
        let (at, scale_at) = layout.position_offsets(layout.capacity(kc.len()), pos);
        let (kp, vp) = (kc.device_ptr(), vc.device_ptr());
        let n = m * layout.kv_dim;
        let args = LaunchArgs::new().ptr(k).ptr(v).ptr(kp + at as u64);
        match layout.cache_type {
            CacheType::F16 => {
                let args = args.ptr(vp + at as u64).i32(n as i32);
                self.launch_1d(&self.k.kv_store, n, args)
            }
            CacheType::Q8_0 => {
                let args = args
                    .ptr(kp + scale_at as u64)
                    .ptr(vp + at as u64)
                    .ptr(vp + scale_at as u64)
                    .i32(n as i32);
                // DECODE_THREADS is a multiple of 32, so each run of 32 is one aligned lane group.
                self.launch_1d(&self.k.kv_store_q8, n, args)
            }
        }
    }

    /// `y += b` over one row of `len` values.
    fn add(&self, y: u64, b: u64, len: usize) -> Result<(), GpuError> {
        let args = LaunchArgs::new().ptr(y).ptr(b).i32(len as i32);
        self.launch_1d(&self.k.add, len, args)
    }

    /// `y (+)= W·act` for weight `id`: resident weights on the GPU, spilled ones through the
    /// offload executor. `x` is the f32 activation `act` was prepared from (the CPU arm reads it).
    #[allow(clippy::too_many_arguments)] // the GEMV's operands
    fn project(
        &mut self,
        id: usize,
        x: u64,
        which_act: ActSlot,
        y: u64,
        y_len: usize,
        form: GemvForm,
    ) -> Result<(), ModelError> {
        let w = &self.model.weights()[id];
        let gw = self.weights[id]
            .as_ref()
            .ok_or_else(|| ModelError::Unsupported(format!("weight {} not placed", w.name)))?;
        let wr = gw.weight_ref(w)?;
        let act = self.s.a.act(which_act)?;
        let mut yv = DeviceView {
            ptr: y,
            bytes: y_len * 4,
            ctx: &self.ctx,
        };
        match (wr.location(), gw) {
            (WeightLocation::HostMapped, GpuWeight::Host(host)) => {
                let xv = DeviceView {
                    ptr: x,
                    bytes: w.k * 4,
                    ctx: &self.ctx,
                };
                let step = SpilledStep {
                    weight: &wr,
                    host: host.clone(),
                    x: &xv,
                    y: &mut yv,
                    form,
                };
                self.offload.run(&self.stream, &self.gemv, act, step)?;
            }
            _ => self
                .gemv
                .gemv(&self.stream, &wr, act, &mut yv, RowRange::all(w.m), form)?,
        }
        Ok(())
    }

    /// Plain projections `(weight id, y, y_len)` of one activation (q/k/v, gate/up): when all
    /// of them are spilled they go to the offload executor together (under `flags` one split
    /// step for all), otherwise each through [`GpuDecoder::project`].
    fn project_shared(
        &mut self,
        outs: &[(usize, u64, usize)],
        x: u64,
        which_act: ActSlot,
    ) -> Result<(), ModelError> {
        let all_spilled = outs.iter().all(|&(id, _, _)| {
            matches!(self.weights[id], Some(GpuWeight::Host(_)))
                && self.model.weights()[id].k == self.model.weights()[outs[0].0].k
        });
        if !all_spilled || outs.len() < 2 {
            for &(id, y, len) in outs {
                self.project(id, x, which_act, y, len, GemvForm::Plain)?;
            }
            return Ok(());
        }
        let ws = self.model.weights();
        let mut refs = Vec::with_capacity(outs.len());
        let mut hosts = Vec::with_capacity(outs.len());
        for &(id, _, _) in outs {
            let w = &ws[id];
            let Some(GpuWeight::Host(host)) = &self.weights[id] else {
                return Err(ModelError::Unsupported(format!(
                    "weight {} not placed",
                    w.name
                )));
            };
            refs.push(WeightRef::new(host.as_ref(), 0, w.format, w.m, w.k)?);
            hosts.push(host.clone());
        }
        let k = ws[outs[0].0].k;
        let xv = DeviceView {
            ptr: x,
            bytes: k * 4,
            ctx: &self.ctx,
        };
        let mut ys: Vec<DeviceView<'_>> = outs
            .iter()
            .map(|&(_, y, len)| DeviceView {
                ptr: y,
                bytes: len * 4,
                ctx: &self.ctx,
            })
            .collect();
        let mut steps: Vec<SpilledStep<'_>> = refs
            .iter()
            .zip(hosts)
            .zip(ys.iter_mut())
            .map(|((wr, host), yv)| SpilledStep {
                weight: wr,
                host,
                x: &xv,
                y: yv,
                form: GemvForm::Plain,
            })
            .collect();
        let act = self.s.a.act(which_act)?;
        self.offload
            .run_shared(&self.stream, &self.gemv, act, &mut steps)?;
        Ok(())
    }

    fn prepare(&mut self, slot: ActSlot, x: u64, k: usize) -> Result<(), ModelError> {
        let xv = DeviceView {
            ptr: x,
            bytes: k * 4,
            ctx: &self.ctx,
        };
        let act = self.s.a.act_mut(slot)?;
        Ok(self.gemv.prepare(&self.stream, &xv, act)?)
    }

    /// Device addresses of the activations of a step of `n` tokens: the decode scratch for one
    /// token, the batch scratch for more.
    fn rows(&self, n: usize) -> Result<StepRows, ModelError> {
        match (&self.batch, n) {
            (_, 1) => Ok(StepRows {
                x: self.s.a.x.device_ptr(),
                xn: self.s.a.xn.device_ptr(),
                q: self.s.a.q.device_ptr(),
                k: self.s.a.k.device_ptr(),
                v: self.s.a.v.device_ptr(),
                att: self.s.a.att.device_ptr(),
                gate: self.s.a.gate.device_ptr(),
                up: self.s.a.up.device_ptr(),
            }),
            (Some(b), n) if n <= b.scratch.step_rows => {
                let b = &b.scratch;
                Ok(StepRows {
                    x: b.x.device_ptr(),
                    xn: b.xn.device_ptr(),
                    q: b.q.device_ptr(),
                    k: b.k.device_ptr(),
                    v: b.v.device_ptr(),
                    att: b.att.device_ptr(),
                    gate: b.gate.device_ptr(),
                    up: b.up.device_ptr(),
                })
            }
            _ => Err(ModelError::Backend {
                backend: "gpu",
                message: format!(
                    "a step of {n} tokens exceeds the batch scratch ({} tokens)",
                    self.batch.as_ref().map_or(1, |b| b.scratch.step_rows)
                ),
            }),
        }
    }

    /// Uploads the embedding rows of `tokens` (dequantised on the host from the mapped file) to
    /// `x`, through the pinned staging of the step's scratch.
    fn embed(&mut self, tokens: &[u32], x: u64) -> Result<(), ModelError> {
        let d = self.model.config().d_model;
        let emb = &self.model.weights()[self.token_embd];
        let rb = emb.format.row_bytes(emb.k)?;
        let table = self.model.weight_bytes(emb);
        let stage = match (&mut self.batch, tokens.len()) {
            (_, 1) => &mut self.s.a.stage_x,
            (Some(b), _) => &mut b.scratch.stage_x,
            (None, n) => {
                return Err(ModelError::Backend {
                    backend: "gpu",
                    message: format!("{n} embedding rows without a batch scratch"),
                })
            }
        };
        let mut xrow = vec![0f32; d];
        // The previous step synchronised the stream, so the staging buffer is free to overwrite.
        for (i, &t) in tokens.iter().enumerate() {
            let row = &table[t as usize * rb..(t as usize + 1) * rb];
            crate::ops::dequantize_row(emb.format, row, &mut xrow)?;
            // Gemma's √d_model, in f32 as the CPU path (`Model::embed`) and llama.cpp apply it.
            let scale = self.model.config().embd_scale;
            if scale != 1.0 {
                xrow.iter_mut().for_each(|v| *v *= scale);
            }
            let dst = &mut stage.as_mut_slice()[i * d * 4..(i + 1) * d * 4];
            for (b, v) in dst.chunks_exact_mut(4).zip(&xrow) {
                b.copy_from_slice(&v.to_ne_bytes());
            }
        }
        let mut xv = DeviceView {
            ptr: x,
            bytes: tokens.len() * d * 4,
            ctx: &self.ctx,
        };
        self.stream
            .memcpy_htod_async(&mut xv, 0, stage, 0, tokens.len() * d * 4)?;
        Ok(())
    }

    /// Projections `(weight id, y, y_len)` of one activation `x` (`n` rows of `k`): for one token
    /// the activation is quantised for the GEMV and the outputs go through
    /// [`GpuDecoder::project_shared`] (or [`GpuDecoder::project`] for one output, in `form`);
    /// for more, each output is a GEMM ([`GpuDecoder::project_batch`]).
    fn project_rows(
        &mut self,
        outs: &[(usize, u64, usize)],
        x: u64,
        (k, n, batched): (usize, usize, bool),
        slot: ActSlot,
        form: GemvForm,
    ) -> Result<(), ModelError> {
        if batched {
            return self.project_batch(outs, x, (k, n), form);
        }
        self.prepare(slot, x, k)?;
        match outs {
            [(id, y, len)] => self.project(*id, x, slot, *y, *len, form),
            _ => self.project_shared(outs, x, slot),
        }
    }

    /// The batched form of [`GpuDecoder::project_rows`]: `x`'s `n` rows are rounded to f16 once;
    /// each weight is expanded to f16 rows (from HBM, or from its VRAM copy made by the spilled
    /// stream) and multiplied by cuBLAS into `y` (`n` rows of `y_len`; added to under
    /// `Residual`).
    fn project_batch(
        &mut self,
        outs: &[(usize, u64, usize)],
        x: u64,
        (k, n): (usize, usize),
        form: GemvForm,
    ) -> Result<(), ModelError> {
        let Some(b) = self.batch.as_mut() else {
            return Err(ModelError::Backend {
                backend: "gpu",
                message: "a batched projection without a batch scratch".into(),
            });
        };
        let xv = DeviceView {
            ptr: x,
            bytes: n * k * 4,
            ctx: &self.ctx,
        };
        b.dequant
            .convert_f32_to_f16(&self.stream, &xv, &mut b.scratch.x16, n * k)?;
        for &(id, y, len) in outs {
            let w = &self.model.weights()[id];
            if w.k != k || w.m != len {
                return Err(ModelError::Backend {
                    backend: "gpu",
                    message: format!(
                        "weight {} is {}×{}, the batched step gave {len}×{k}",
                        w.name, w.m, w.k
                    ),
                });
            }
            let all = RowRange::all(w.m);
            match &self.weights[id] {
                Some(GpuWeight::Device(buf)) => {
                    let wr = WeightRef::new(buf, 0, w.format, w.m, w.k)?;
                    b.dequant
                        .dequant_rows(&self.stream, &wr, all, &mut b.scratch.w16)?;
                }
                Some(GpuWeight::Host(host)) => {
                    let staged = b.scratch.spill.as_ref().and_then(|sp| sp.staged(id));
                    let wr = match staged {
                        Some((buf, off)) => WeightRef::new(buf, off, w.format, w.m, w.k)?,
                        // Not staged (a layer out of the announced order): read the pinned
                        // pages over PCIe.
                        None => WeightRef::new(host.as_ref(), 0, w.format, w.m, w.k)?,
                    };
                    b.dequant
                        .dequant_rows(&self.stream, &wr, all, &mut b.scratch.w16)?;
                }
                None => {
                    return Err(ModelError::Unsupported(format!(
                        "weight {} not placed",
                        w.name
                    )))
                }
            }
            let mut yv = DeviceView {
                ptr: y,
                bytes: n * len * 4,
                ctx: &self.ctx,
            };
            gemm_f16(
                &self.stream,
                &b.scratch.w16,
                &b.scratch.x16,
                &mut yv,
                GemmShape {
                    m: len,
                    n,
                    k,
                    ldy: len,
                },
                form == GemvForm::Residual,
            )?;
        }
        Ok(())
    }

    /// `y += b` (`len` values) over the rows `rows` describes: one launch over a run, one per
    /// row of a batched decode step.
    fn add_bias(
        &self,
        y: u64,
        (b, len): (u64, usize),
        rows: LayerRows<'_>,
    ) -> Result<(), ModelError> {
        match (&self.batch, rows) {
            (_, LayerRows::Run { batched: false, .. }) => self.add(y, b, len)?,
            (Some(bt), LayerRows::Run { m, .. }) => {
                bt.kernels
                    .add_rows(&self.ctx, &self.stream, y, (b, len), m)?
            }
            (None, LayerRows::Run { .. }) => unreachable_batch()?,
            (_, LayerRows::Slots(feeds)) => {
                for i in 0..feeds.len() {
                    self.add(y + (i * len * 4) as u64, b, len)?;
                }
            }
        }
        Ok(())
    }

    /// RoPE over `n` rows of `n_heads` heads at positions `pos ..` (decode: `self.pos`).
    fn rope_rows(
        &self,
        li: usize,
        x: u64,
        n_heads: usize,
        (n, pos, batched): (usize, usize, bool),
    ) -> Result<(), ModelError> {
        let c = self.model.config();
        let (freq, mscale) = self.rope_table(li);
        match (&self.batch, batched) {
            (_, false) => self.rope(li, x, n_heads, pos)?,
            (Some(bt), true) => bt.kernels.rope_rows(
                &self.ctx,
                &self.stream,
                x,
                n,
                n_heads,
                c.head_dim,
                c.rope_dim,
                pos,
                freq,
                c.rope_neox,
                mscale,
            )?,
            (None, true) => unreachable_batch()?,
        }
        Ok(())
    }

    /// Attention of layer `li` for `n` queries at positions `pos ..` (their k and v already in
    /// the cache): the split-KV decode kernel for decode, the causal chunk kernel in a batch.
    fn attend(
        &mut self,
        li: usize,
        r: &StepRows,
        (n, pos, batched): (usize, usize, bool),
    ) -> Result<(), ModelError> {
        let c = self.model.config();
        let l = &self.layers[li];
        match (&self.batch, batched) {
            (_, false) => {
                let n_pos = self.pos() + 1;
                let (kc, vc) = (&l.k_cache[self.slot], &l.v_cache[self.slot]);
                match l.window {
                    // A sliding-window layer past its window: positions n_pos − window ..
                    Some(w) if n_pos > w => self.attention.launch_from(
                        &self.stream,
                        &self.s.a.q,
                        kc,
                        vc,
                        &mut self.s.a.att,
                        n_pos - w,
                        n_pos,
                    )?,
                    _ => self.attention.launch(
                        &self.stream,
                        &self.s.a.q,
                        kc,
                        vc,
                        &mut self.s.a.att,
                        n_pos,
                    )?,
                }
            }
            (Some(bt), true) => bt.kernels.attention(
                &self.ctx,
                &self.stream,
                r.q,
                (
                    &l.k_cache[self.slot],
                    &l.v_cache[self.slot],
                    self.attention.layout().cache_type,
                ),
                r.att,
                (c.n_head, c.n_head_kv, c.head_dim),
                (pos, n),
                (c.attn_scale, l.window),
            )?,
            (None, true) => unreachable_batch()?,
        }
        Ok(())
    }

    /// Layer `li` over the rows `rows` describes, whose residual rows start at `x`; the other
    /// activations are `r`'s (the decode scratch, one micro-batch's, or a batched decode step's).
    /// The block is [`block::layer`]'s; each operation asks `rows` for its form — a run of one
    /// sequence's positions (the GEMV or GEMM, split-KV or chunk attention) or one token of each
    /// of several sequences (the multi-column GEMV, the slots forms of RoPE, the KV store and
    /// attention).
    fn layer(
        &mut self,
        li: usize,
        r: &StepRows,
        x: u64,
        rows: LayerRows<'_>,
    ) -> Result<(), ModelError> {
        let t = self.layers[li]
            .t
            .map_vectors(|b| Ok::<_, std::convert::Infallible>(b.device_ptr()));
        let Ok(t) = t;
        let c = self.model.config();
        block::layer(
            &mut GpuStep {
                dec: self,
                li,
                r,
                x,
                rows,
            },
            c,
            li,
            &t,
        )
    }

    /// Projections of activation `x` (rows of `k`) in the form `rows` asks for: a run's GEMV or
    /// GEMM ([`GpuDecoder::project_rows`]), or several sequences' multi-column GEMV
    /// ([`GpuDecoder::project_cols`]).
    fn project_any(
        &mut self,
        outs: &[(usize, u64, usize)],
        x: u64,
        k: usize,
        rows: LayerRows<'_>,
        slot: ActSlot,
        form: GemvForm,
    ) -> Result<(), ModelError> {
        match rows {
            LayerRows::Run { m, cols: true, .. } => self.project_cols(outs, x, (k, m), slot, form),
            LayerRows::Run { m, batched, .. } => {
                self.project_rows(outs, x, (k, m, batched), slot, form)
            }
            LayerRows::Slots(feeds) => self.project_cols(outs, x, (k, feeds.len()), slot, form),
        }
    }

    /// One step over `tokens` of the selected slot: [`GpuDecoder::forward_segments`] with one
    /// segment, its logits left in `self.logits`.
    fn forward(&mut self, tokens: &[u32]) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Ok(());
        }
        if let ([t], Some(_)) = (tokens, &self.graphs) {
            return self.replayed_step(*t);
        }
        self.forward_segments(&[(self.slot, tokens)])?;
        let vocab = self.model.config().vocab;
        self.logits.copy_from_slice(&self.seg_logits[..vocab]);
        Ok(())
    }

    /// One step over `segs` — `(slot, tokens)`, each slot at most once; one token in all for
    /// decode, up to `UBATCHES_PER_STEP` micro-batches in all for prefill — then the logits
    /// after each segment's last token into `self.seg_logits` (`segs.len() × vocab`). A batched
    /// step runs layer-major — layer `l` over each segment's micro-batches in order, then layer
    /// `l + 1` — so a spilled layer is staged in VRAM once per step for every sequence in it,
    /// and causality holds (micro-batch `u` of layer `l` reads the cache rows its predecessors
    /// wrote at layer `l`). Each operation picks its one-token (GEMV, split-KV attention) or
    /// batched (GEMM, chunk attention) form; the sequence is the same. On error no slot has
    /// advanced.
    fn forward_segments(&mut self, segs: &[(usize, &[u32])]) -> Result<(), ModelError> {
        let c = self.model.config().clone();
        let n: usize = segs.iter().map(|s| s.1.len()).sum();
        if n == 0 || segs.iter().any(|s| s.1.is_empty()) {
            return Err(ModelError::InvalidOption(
                "a forward step with an empty segment".into(),
            ));
        }
        let mut seen = vec![false; self.slot_pos.len()];
        for &(slot, tokens) in segs {
            match seen.get_mut(slot) {
                Some(x @ false) => *x = true,
                _ => {
                    return Err(ModelError::InvalidOption(format!(
                        "segment for slot {slot} of {} (absent or twice)",
                        self.slot_pos.len()
                    )))
                }
            }
            if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::BadToken {
                    id: bad,
                    vocab: c.vocab,
                });
            }
            if self.slot_pos[slot] + tokens.len() > self.ctx_len {
                return Err(ModelError::ContextFull {
                    need: self.slot_pos[slot] + tokens.len(),
                    ctx: self.ctx_len,
                });
            }
        }
        let r = self.rows(n)?;
        let batched = n > 1;
        let started = Instant::now();
        let slots: Vec<usize> = segs.iter().map(|s| s.0).collect();
        self.states_begin(&slots)?;
        // A short run's projections through the multi-column GEMV (within its reach, and unless
        // the measured step times say the GEMM is faster at this length: `short_runs`).
        let cols = batched
            && self.batch.is_some()
            && self
                .decode_batch
                .as_ref()
                .is_some_and(|db| n <= db.rows().min(SHORT_RUN_MAX_TOKENS))
            && self.short_runs.take_cols(n);
        self.step_counts.count(n, cols);
        let ubatch = match (&self.batch, batched) {
            (Some(b), true) => b.scratch.rows,
            _ => 1,
        };
        if let Some(spill) = self.batch.as_mut().and_then(|b| b.scratch.spill.as_mut()) {
            spill.begin();
        }
        let all: Vec<u32> = segs.iter().flat_map(|s| s.1.iter().copied()).collect();
        self.embed(&all, r.x)?;
        let d = c.d_model;
        let keep = self.slot;
        for li in 0..self.layers.len() {
            let staged = match self.batch.as_mut().and_then(|b| b.scratch.spill.as_mut()) {
                Some(spill) if batched && !cols => spill.fetch_layer(&self.stream, li)?,
                _ => false,
            };
            let mut row0 = 0usize;
            for &(slot, tokens) in segs {
                self.slot = slot;
                let pos = self.slot_pos[slot];
                for c0 in (0..tokens.len()).step_by(ubatch) {
                    let m = ubatch.min(tokens.len() - c0);
                    let x = r.x + ((row0 + c0) * d * 4) as u64;
                    let done = self.layer(
                        li,
                        &r,
                        x,
                        LayerRows::Run {
                            m,
                            pos: pos + c0,
                            batched,
                            cols,
                        },
                    );
                    if done.is_err() {
                        self.slot = keep;
                    }
                    done?;
                }
                row0 += tokens.len();
            }
            self.slot = keep;
            if staged {
                if let Some(spill) = self.batch.as_mut().and_then(|b| b.scratch.spill.as_mut()) {
                    spill.release_layer(&self.stream)?;
                }
            }
        }
        if batched && !cols {
            if let Some(spill) = self.batch.as_mut().and_then(|b| b.scratch.spill.as_mut()) {
                spill.prestage()?;
            }
        }
        // Logits of each segment's last token, through the decode scratch and the head's GEMV.
        self.seg_logits.resize(segs.len() * c.vocab, 0.0);
        let mut row_end = 0usize;
        for (si, &(_, tokens)) in segs.iter().enumerate() {
            row_end += tokens.len();
            let x_last = r.x + ((row_end - 1) * d * 4) as u64;
            let xn = self.s.a.xn.device_ptr();
            self.rms_norm(x_last, self.output_norm.device_ptr(), xn, 1, d)?;
            self.prepare(ActSlot::Model, xn, d)?;
            let logits = self.s.a.logits.device_ptr();
            self.project(
                self.head,
                xn,
                ActSlot::Model,
                logits,
                c.vocab,
                GemvForm::Plain,
            )?;
            if let Some(cap) = c.final_logit_softcap {
                let args = LaunchArgs::new().ptr(logits).f32(cap).i32(c.vocab as i32);
                self.launch_1d(&self.k.softcap, c.vocab, args)?;
            }
            self.stream.memcpy_dtoh_async(
                &mut self.s.a.stage_logits,
                0,
                &self.s.a.logits,
                0,
                c.vocab * 4,
            )?;
            self.stream.synchronize()?;
            let dst = &mut self.seg_logits[si * c.vocab..(si + 1) * c.vocab];
            for (l, b) in dst
                .iter_mut()
                .zip(self.s.a.stage_logits.as_slice().chunks_exact(4))
            {
                *l = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        for &(slot, tokens) in segs {
            self.slot_pos[slot] += tokens.len();
        }
        self.states_done(&slots);
        if batched && self.batch.is_some() {
            let form = if cols { StepForm::Cols } else { StepForm::Gemm };
            let seconds = started.elapsed().as_secs_f64();
            self.short_runs.observe(form, n, seconds);
            let (cols_s, gemm_s) = self.short_runs.predictions(n);
            tracing::debug!(
                target: "hipfire::prefill",
                tokens = n,
                ?form,
                seconds,
                ?cols_s,
                ?gemm_s,
                "gpu prompt step (the fitted step times of both forms at this length after it)"
            );
        }
        Ok(())
    }

    /// Prefill several sequences in one batched step: `(slot, prompt chunk)` each, every slot at
    /// most once, `Σ len ≤` [`GpuDecoder::step_tokens`]. Every layer (a spilled one staged in
    /// VRAM once for all of them) runs over each sequence's rows in turn. Returns the logits
    /// after each segment's last token, `segs.len() × vocab` in order.
    pub fn prefill_slots(&mut self, segs: &[(usize, &[u32])]) -> Result<&[f32], ModelError> {
        let n: usize = segs.iter().map(|s| s.1.len()).sum();
        let cap = self.step_tokens();
        if n > cap {
            return Err(ModelError::InvalidOption(format!(
                "a prefill step of {n} tokens (at most {cap})"
            )));
        }
        let pos: Vec<usize> = segs.iter().map(|s| self.slot_position(s.0)).collect();
        let first = segs.first().map_or(0, |s| s.0);
        let r = if n == 1 {
            // One token in all: the decode path (its scratch).
            let keep = self.slot;
            self.slot = first;
            let r = self.forward_segments(segs);
            self.slot = keep;
            r
        } else {
            self.forward_segments(segs)
        };
        r.map_err(|e| {
            if let Some(spill) = self.batch.as_ref().and_then(|b| b.scratch.spill.as_ref()) {
                // Best effort: the step already failed; a second failure would hide the first.
                let _ = spill.drain();
            }
            at_step(e, || {
                format!(
                    "prefilling {} sequences ({n} tokens in one batched step; slots at {:?})",
                    segs.len(),
                    segs.iter().map(|s| s.0).zip(pos).collect::<Vec<_>>()
                )
            })
        })?;
        Ok(&self.seg_logits[..segs.len() * self.model.config().vocab])
    }

    /// Most tokens one batched step holds (all sequences together): `UBATCHES_PER_STEP`
    /// micro-batches of `model.ubatch`, or 1 without batched prefill.
    pub fn step_tokens(&self) -> usize {
        self.batch.as_ref().map_or(1, |b| b.scratch.step_rows)
    }
}

/// Launches `f` (a kernel of kernels/decode.cu or kernels/moe.cu) on `stream` over `dims`.
fn launch_on(
    ctx: &Context,
    stream: &Stream,
    f: &Function,
    dims: LaunchDims,
    mut args: LaunchArgs,
) -> Result<(), GpuError> {
    let params = args.params()?;
    // SAFETY: every caller passes parameters matching the kernel's signature in
    // kernels/decode.cu or kernels/moe.cu (typed one by one in `args`, whose slots outlive the
    // launch), over device buffers owned by the decoder (alive for the launch, freed only by
    // Drop after the stream is synchronised), with extents checked at allocation and the
    // launch's grid within the rows those buffers hold.
    unsafe { ctx.backend().launch(f.raw(), dims, stream.raw(), params) }
}

/// The rows a layer runs over ([`GpuDecoder::layer`]).
#[derive(Debug, Clone, Copy)]
enum LayerRows<'f> {
    /// `m` tokens of the selected slot at positions `pos ..`; `batched`: the batched forms
    /// (chunk attention; GEMM projections unless `cols`: the multi-column GEMV's).
    Run {
        m: usize,
        pos: usize,
        batched: bool,
        cols: bool,
    },
    /// One token of each `(slot, token)` feed, each at its slot's position.
    Slots(&'f [(usize, u32)]),
}

impl LayerRows<'_> {
    /// Rows of the activations.
    fn len(&self) -> usize {
        match self {
            LayerRows::Run { m, .. } => *m,
            LayerRows::Slots(feeds) => feeds.len(),
        }
    }
}

/// Device addresses of one step's activations (see [`GpuDecoder::rows`]).
#[derive(Debug, Clone, Copy)]
struct StepRows {
    x: u64,
    xn: u64,
    q: u64,
    k: u64,
    v: u64,
    att: u64,
    gate: u64,
    up: u64,
}

/// The error of a batched operation reached without batch kernels ([`GpuDecoder::rows`] refuses
/// such a step first, so this marks a broken invariant rather than a user error).
fn unreachable_batch() -> Result<(), ModelError> {
    Err(ModelError::Backend {
        backend: "gpu",
        message: "a batched step without batch kernels".into(),
    })
}

/// Which quantised-activation buffer a projection's input is prepared in (each as wide as the
/// activations it serves).
#[derive(Debug, Clone, Copy)]
enum ActSlot {
    Model,
    Q,
    Ff,
    /// A hybrid model's DeltaNet output (`value_dim`).
    Value,
    /// The shared expert's activated hidden (its width may differ from `n_ff`).
    Shared,
}

impl Decoder for GpuDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        GpuDecoder::prefill(self, tokens)
    }
    fn step(&mut self, token: u32) -> Result<&[f32], ModelError> {
        GpuDecoder::step(self, token)
    }
    fn logits(&self) -> &[f32] {
        &self.logits
    }
    fn position(&self) -> usize {
        self.pos()
    }
    fn ctx_len(&self) -> usize {
        self.ctx_len
    }
    fn is_eog(&self, token: u32) -> bool {
        self.model.tokenizer().is_eog(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_attention::{ATTENTION_KERNEL_NAMES, ATTENTION_Q8_KERNEL_NAMES};

    #[test]
    fn gpu_failures_name_the_step_and_keep_the_gpu_error() {
        let call = || GpuError::Driver {
            call: "cuLaunchKernel",
            source: hipfire_gpu::DriverCode {
                backend: "cuda",
                code: 719,
                name: "CUDA_ERROR_LAUNCH_FAILED".into(),
                message: "unspecified launch failure".into(),
            },
        };
        let e = at_step(call().into(), || "decoding position 3 (token 7)".into());
        // An outer step does not overwrite the inner, more precise one.
        let e = at_step(e, || "loading".into());
        match &e {
            ModelError::Gpu { step, source } => {
                assert_eq!(step, "decoding position 3 (token 7)");
                assert!(
                    matches!(
                        **source,
                        GpuError::Driver {
                            call: "cuLaunchKernel",
                            ..
                        }
                    ),
                    "{source:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        let chain = format!(
            "{e}: {}",
            std::error::Error::source(&e).expect("the GPU error is the source")
        );
        assert!(
            chain.contains("decoding position 3")
                && chain.contains("cuLaunchKernel")
                && chain.contains("CUDA_ERROR_LAUNCH_FAILED"),
            "{chain}"
        );
        // A GPU error from the executor gets the step too, still typed.
        let e = at_step(
            ModelError::Exec(hipfire_exec::ExecError::Device(call())),
            || "decoding position 9 (token 1)".into(),
        );
        assert!(matches!(&e, ModelError::Gpu { step, .. } if step.contains("position 9")));
        // Other errors pass through untouched.
        let e = at_step(ModelError::BadToken { id: 5, vocab: 4 }, || "x".into());
        assert!(matches!(e, ModelError::BadToken { id: 5, vocab: 4 }));
    }

    /// Compiles `src` for sm_90 with NVRTC (no GPU needed) and checks that each of `names` is
    /// in the image. Skips, saying so, without libnvrtc, unless CI's `HIPFIRE_REQUIRE_NVRTC=1`
    /// says it must be there.
    pub(super) fn assert_kernels_compile<'n>(
        src: &KernelSource,
        names: impl IntoIterator<Item = &'n str>,
    ) {
        let image =
            match hipfire_gpu::cuda::nvrtc_compile(src.name, src.source, src.headers, "sm_90", &[])
            {
                Ok(image) => image,
                Err(GpuError::NoGpu { reason }) => {
                    assert!(
                        std::env::var("HIPFIRE_REQUIRE_NVRTC").as_deref() != Ok("1"),
                        "HIPFIRE_REQUIRE_NVRTC=1 but {reason}"
                    );
                    println!("skipped: {reason}");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
        for n in names {
            let needle = format!("{n}\0");
            assert!(
                image.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{}: kernel {n} missing",
                src.name
            );
        }
    }

    /// Every kernel [`GpuDecoder::new`] looks up in `decode.cu` compiles.
    #[test]
    fn decode_kernels_compile_for_sm90_with_nvrtc() {
        let names = DECODE_KERNEL_NAMES
            .into_iter()
            .chain(ATTENTION_KERNEL_NAMES)
            .chain(ATTENTION_Q8_KERNEL_NAMES);
        assert_kernels_compile(&DECODE_SOURCE, names);
    }

    /// The CPU cache rounds with `half::f16::from_f32`; `kv_store_f16` with `cvt.rn.f16.f32`
    /// (nearest, ties to even, overflow to inf). This pins the CPU half of that contract on the
    /// cases where rounding rules differ: exact ties both ways, the overflow edge, subnormals.
    #[test]
    fn cpu_cache_rounding_is_nearest_ties_to_even() {
        use half::f16;
        let cases: [(f32, u16); 6] = [
            // Halfway between 1.0 (even mantissa) and 1 + 2^-10: down to the even one.
            (1.0 + 2f32.powi(-11), 0x3c00),
            // Halfway between 1 + 2^-10 (odd) and 1 + 2^-9: up to the even one.
            (1.0 + 3.0 * 2f32.powi(-11), 0x3c02),
            // Just under the halfway point above f16::MAX (65504): stays finite.
            (65519.0, 0x7bff),
            // The halfway point 65520 ties away from the odd f16::MAX mantissa, to inf.
            (65520.0, 0x7c00),
            // Halfway between the two smallest subnormals (2^-24 odd, 2^-23 even): up.
            (1.5 * 2f32.powi(-24), 0x0002),
            // Negative values round by magnitude.
            (-(1.0 + 2f32.powi(-11)), 0xbc00),
        ];
        for (x, bits) in cases {
            assert_eq!(f16::from_f32(x).to_bits(), bits, "{x:e}");
        }
    }
}
