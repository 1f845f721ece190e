//! The GPU side of batched steps (prefill of more than one token at once): scratch sized for a
//! micro-batch, the kernels of `kernels/prefill.cu`, and the streaming of spilled weights into
//! VRAM for their GEMMs.
//!
//! A batched projection is a GEMM: the weight's rows are expanded to f16 in a VRAM scratch
//! (`kernels/dequant.cu`) and multiplied with the f16 activation rows by cuBLAS. A resident weight
//! is expanded straight from HBM. A spilled weight is first copied from its pinned host pages into
//! one of two VRAM staging buffers on a copy stream of its own — the copy of the next spilled
//! weight runs while this one is expanded and multiplied — so a prefill over spilled layers moves
//! each spilled byte over PCIe once per micro-batch at the DMA engine's rate and keeps the SMs for
//! the GEMM. (Decode, one token, keeps the GEMV path and the offload executor.)

use hipfire_gpu::backend::LaunchDims;
use hipfire_gpu::{
    Context, DeviceBuffer, Event, Function, GpuError, HostMappedBuffer, LaunchArgs, Module, Stream,
};
use std::sync::Arc;

use crate::attention::CacheType;
use crate::gpu_kv::GpuKvLayout;
use crate::ModelError;

/// `kernels/prefill.cu`: RoPE and bias add over token rows, causal chunk attention.
pub const PREFILL_SOURCE: hipfire_gpu::KernelSource = hipfire_gpu::KernelSource {
    name: "prefill.cu",
    source: include_str!("../../../kernels/prefill.cu"),
    headers: &[
        ("platform.cuh", hipfire_gpu::PLATFORM_CUH),
        ("f16.cuh", hipfire_gpu::F16_CUH),
        ("kv_q8.cuh", crate::gpu_kv::KV_Q8_CUH),
    ],
};

/// The kernels `PrefillKernels` looks up, in field order.
pub const PREFILL_KERNEL_NAMES: [&str; 6] = [
    "rope_rows_f32",
    "add_rows_f32",
    "attention_prefill_f16kv_d128",
    "attention_prefill_f16kv_d256",
    "attention_prefill_q8kv_d128",
    "attention_prefill_q8kv_d256",
];

/// Threads of the chunk-attention kernel (kernels/prefill.cu `HF_PF_WARPS` × 32).
const ATTN_THREADS: u32 = 128;
/// Query tiles of the two attention instances (kernels/prefill.cu `HF_PF_ENTRY`).
const ATTN_QT_D128: usize = 16;
const ATTN_QT_D256: usize = 8;
/// Widest head the chunk attention serves (its largest instance).
pub const MAX_BATCH_HEAD_DIM: usize = 256;
/// Threads of the elementwise row kernels.
const ROW_THREADS: u32 = 256;
/// Threads of the per-(token, head) RoPE blocks (a 128-wide head rotates 64 pairs).
const ROPE_THREADS: u32 = 64;
/// Staging buffers of the spilled-layer stream (each holds one whole layer): the copy of the next
/// layer overlaps this one's GEMMs; the first H200 run of batched prefill
/// (docs/perf-checkpoints/2026-12-01-gpu-prefill-h200) measured the copy of a spilled 8B layer at
/// ~2 ms and its GEMMs for 512 tokens at ~1 ms, so one layer of look-ahead keeps the copy engine
/// busy.
const SPILL_BUFFERS: usize = 2;

/// The `kernels/prefill.cu` entry points.
#[derive(Debug)]
pub(crate) struct PrefillKernels {
    rope_rows: Function,
    add_rows: Function,
    attn_d128: Function,
    attn_d256: Function,
    /// The two instances over the q8_0 cache.
    attn_q8_d128: Function,
    attn_q8_d256: Function,
}

impl PrefillKernels {
    pub(crate) fn new(module: &Arc<Module>) -> Result<PrefillKernels, GpuError> {
        let [rope_rows, add_rows, attn_d128, attn_d256, attn_q8_d128, attn_q8_d256] =
            PREFILL_KERNEL_NAMES.map(|n| module.function(n));
        Ok(PrefillKernels {
            rope_rows: rope_rows?,
            add_rows: add_rows?,
            attn_d128: attn_d128?,
            attn_d256: attn_d256?,
            attn_q8_d128: attn_q8_d128?,
            attn_q8_d256: attn_q8_d256?,
        })
    }
}

/// Whether the chunk attention covers a head of `head_dim` (even, for its 4-byte loads, and no
/// wider than its largest instance).
pub(crate) fn batch_head_dim_supported(head_dim: usize) -> bool {
    head_dim > 0 && head_dim % 2 == 0 && head_dim <= MAX_BATCH_HEAD_DIM
}

fn launch(
    ctx: &Arc<Context>,
    stream: &Stream,
    f: &Function,
    grid: usize,
    block: u32,
    mut args: LaunchArgs,
) -> Result<(), GpuError> {
    let grid = u32::try_from(grid).map_err(|_| GpuError::Invalid {
        what: "batched-step grid",
        rule: "must fit 32 bits",
    })?;
    let dims = LaunchDims {
        grid,
        block,
        shared_bytes: 0,
    };
    let params = args.params()?;
    // SAFETY: each caller passes parameters matching the kernel's signature in
    // kernels/prefill.cu (typed one by one in `args`, whose slots outlive the launch), over
    // device buffers sized for the micro-batch by `BatchScratch::new` (checked there against the
    // model's widths) and owned by the decoder until it synchronises.
    unsafe { ctx.backend().launch(f.raw(), dims, stream.raw(), params) }
}

impl PrefillKernels {
    /// RoPE in place over `x[n_tok][n_heads][head_dim]`, token `t` at position `pos0 + t`.
    #[allow(clippy::too_many_arguments)] // RoPE's operands
    pub(crate) fn rope_rows(
        &self,
        ctx: &Arc<Context>,
        stream: &Stream,
        x: u64,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        pos0: usize,
        inv_freq: &DeviceBuffer<f32>,
        neox: bool,
        mscale: f32,
    ) -> Result<(), GpuError> {
        let pos = i32::try_from(pos0).map_err(|_| GpuError::Invalid {
            what: "RoPE position",
            rule: "must fit 32 bits",
        })?;
        let args = LaunchArgs::new()
            .ptr(x)
            .i32(n_heads as i32)
            .i32(head_dim as i32)
            .i32(rope_dim as i32)
            .i32(pos)
            .buf(inv_freq)
            .i32(i32::from(neox))
            .f32(mscale);
        launch(
            ctx,
            stream,
            &self.rope_rows,
            n_tok * n_heads,
            ROPE_THREADS,
            args,
        )
    }

    /// `y[r][i] += b[i]` over `rows` rows of `len` (`b` holds `len` values).
    pub(crate) fn add_rows(
        &self,
        ctx: &Arc<Context>,
        stream: &Stream,
        y: u64,
        (b, len): (u64, usize),
        rows: usize,
    ) -> Result<(), GpuError> {
        let total = len * rows;
        let args = LaunchArgs::new()
            .ptr(y)
            .ptr(b)
            .i32(len as i32)
            .i32(rows as i32);
        launch(
            ctx,
            stream,
            &self.add_rows,
            total.div_ceil(ROW_THREADS as usize),
            ROW_THREADS,
            args,
        )
    }

    /// Causal attention of `n_tok` queries at positions `pos0 ..` over the caches (which already
    /// hold the chunk's own rows, in `cache_type`'s [`crate::gpu_kv`] layout): `out[t][h] =
    /// softmax(scale · q[t][h] · K[lo ..= pos0 + t]ᵀ) V`, `lo` = 0, or `pos0 + t + 1 − window`
    /// for a sliding-window layer.
    #[allow(clippy::too_many_arguments)] // the attention's operands
    pub(crate) fn attention(
        &self,
        ctx: &Arc<Context>,
        stream: &Stream,
        q: u64,
        (k_cache, v_cache, cache_type): (&DeviceBuffer<u8>, &DeviceBuffer<u8>, CacheType),
        out: u64,
        shape: (usize, usize, usize),
        (pos0, n_tok): (usize, usize),
        (scale, window): (f32, Option<usize>),
    ) -> Result<(), GpuError> {
        let (n_head, n_kv_head, head_dim) = shape;
        let window = i32::try_from(window.unwrap_or(0)).map_err(|_| GpuError::Invalid {
            what: "sliding window",
            rule: "must fit 32 bits",
        })?;
        if !batch_head_dim_supported(head_dim) || n_kv_head == 0 || n_head % n_kv_head != 0 {
            return Err(GpuError::Invalid {
                what: "chunk attention shape",
                rule: "head_dim must be even and at most 256, n_head a multiple of n_kv_head",
            });
        }
        let layout = GpuKvLayout {
            cache_type,
            kv_dim: n_kv_head * head_dim,
        };
        if cache_type == CacheType::Q8_0 && head_dim % crate::kv_q8::Q8_BLOCK != 0 {
            return Err(GpuError::Invalid {
                what: "chunk attention over a q8_0 cache",
                rule: "head_dim must be a multiple of 32",
            });
        }
        let cap = layout.capacity(k_cache.len().min(v_cache.len()));
        if cap < pos0 + n_tok {
            return Err(GpuError::BufferTooSmall {
                what: "KV cache for the chunk",
                need: layout.position_bytes() * (pos0 + n_tok),
                got: k_cache.len().min(v_cache.len()),
            });
        }
        // The kernels index the cache with 32-bit ints.
        if i32::try_from(cap * layout.kv_dim).is_err() {
            return Err(GpuError::Invalid {
                what: "KV cache",
                rule: "its values must fit 32 bits",
            });
        }
        let (f, qt) = match (cache_type, head_dim <= 128) {
            (CacheType::F16, true) => (&self.attn_d128, ATTN_QT_D128),
            (CacheType::F16, false) => (&self.attn_d256, ATTN_QT_D256),
            (CacheType::Q8_0, true) => (&self.attn_q8_d128, ATTN_QT_D128),
            (CacheType::Q8_0, false) => (&self.attn_q8_d256, ATTN_QT_D256),
        };
        let grid = n_tok.div_ceil(qt) * n_head;
        let mut args = LaunchArgs::new()
            .ptr(q)
            .buf(k_cache)
            .buf(v_cache)
            .ptr(out)
            .i32(n_head as i32)
            .i32(n_kv_head as i32)
            .i32(head_dim as i32)
            .i32(pos0 as i32)
            .i32(n_tok as i32)
            .f32(scale)
            .i32(window);
        if cache_type == CacheType::Q8_0 {
            // cap × kv_dim fits 32 bits (checked above), so cap does.
            args = args.i32(cap as i32);
        }
        launch(ctx, stream, f, grid, ATTN_THREADS, args)
    }
}

/// Widths of the model that size the batch scratch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchWidths {
    pub d_model: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub n_ff: usize,
    /// Widest reduction length of a layer projection.
    pub max_k: usize,
    /// Most elements of one layer projection (`m × k`), the f16 expansion's size.
    pub max_weight_elems: usize,
    /// Most staged bytes of one spilled layer (0 when nothing spills).
    pub max_spilled_bytes: usize,
}

/// Micro-batches a batched step runs layer-major: each spilled layer crosses PCIe once per step,
/// so a step of 4 × 512 tokens copies an 8B layer (~112 MiB) once where a step per micro-batch
/// would copy it 4 times; the residual stream of the step's tokens stays in VRAM meanwhile
/// (4 × 512 × 4096 × 4 B = 32 MiB for Llama-3-8B).
pub(crate) const UBATCHES_PER_STEP: usize = 4;

/// Device scratch of a batched step: the residual stream of its `UBATCHES_PER_STEP × rows`
/// tokens, and the other activations of one micro-batch of `rows` tokens.
pub(crate) struct BatchScratch {
    /// Tokens per micro-batch.
    pub rows: usize,
    /// Tokens per step (the residual stream's rows).
    pub step_rows: usize,
    pub x: DeviceBuffer<f32>,
    pub xn: DeviceBuffer<f32>,
    pub q: DeviceBuffer<f32>,
    pub k: DeviceBuffer<f32>,
    pub v: DeviceBuffer<f32>,
    pub att: DeviceBuffer<f32>,
    pub gate: DeviceBuffer<f32>,
    pub up: DeviceBuffer<f32>,
    /// The f16 activation rows of the projection being run.
    pub x16: DeviceBuffer<u16>,
    /// The f16 expansion of the weight being multiplied.
    pub w16: DeviceBuffer<u16>,
    /// Pinned staging of the micro-batch's embedding rows.
    pub stage_x: HostMappedBuffer,
    /// The spilled-weight stream, when layers spill.
    pub spill: Option<SpillStream>,
}

impl BatchScratch {
    /// Bytes [`BatchScratch::new`] allocates in VRAM for `rows` tokens (for the placement budget).
    pub(crate) fn vram_bytes(w: &BatchWidths, rows: usize) -> u64 {
        let f32s = rows * UBATCHES_PER_STEP * w.d_model
            + rows * (w.d_model + 2 * w.q_dim + 2 * w.kv_dim + 2 * w.n_ff);
        let f16s = rows * w.max_k + w.max_weight_elems;
        (f32s * 4 + f16s * 2 + SPILL_BUFFERS * w.max_spilled_bytes) as u64
    }

    pub(crate) fn new(
        ctx: &Arc<Context>,
        w: &BatchWidths,
        rows: usize,
    ) -> Result<BatchScratch, GpuError> {
        let spill = if w.max_spilled_bytes > 0 {
            Some(SpillStream::new(ctx, w.max_spilled_bytes)?)
        } else {
            None
        };
        let step_rows = rows * UBATCHES_PER_STEP;
        Ok(BatchScratch {
            rows,
            step_rows,
            x: ctx.alloc(step_rows * w.d_model)?,
            xn: ctx.alloc(rows * w.d_model)?,
            q: ctx.alloc(rows * w.q_dim)?,
            k: ctx.alloc(rows * w.kv_dim)?,
            v: ctx.alloc(rows * w.kv_dim)?,
            att: ctx.alloc(rows * w.q_dim)?,
            gate: ctx.alloc(rows * w.n_ff)?,
            up: ctx.alloc(rows * w.n_ff)?,
            x16: ctx.alloc(rows * w.max_k)?,
            w16: ctx.alloc(w.max_weight_elems)?,
            stage_x: ctx.alloc_pinned_host(step_rows * w.d_model * 4)?,
            spill,
        })
    }
}

/// Byte alignment of each weight inside a staged layer (cudaMalloc's own granularity, so a staged
/// weight is aligned as a resident one).
const STAGE_ALIGN: usize = 256;

/// One spilled layer as the copy stream moves it: its weights' host pages and their offsets in a
/// staging buffer.
pub(crate) struct StagedLayer {
    /// Layer index.
    pub layer: usize,
    /// `(weight id, host bytes, offset in the staging buffer)`.
    pub weights: Vec<(usize, Arc<HostMappedBuffer>, usize)>,
}

/// Offset of each of `sizes` in a staged layer (back to back at [`STAGE_ALIGN`]) and the layer's
/// staged bytes.
fn stage_layout(sizes: impl IntoIterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut off = 0usize;
    let offsets = sizes
        .into_iter()
        .map(|len| {
            let at = off;
            off = (off + len).next_multiple_of(STAGE_ALIGN);
            at
        })
        .collect();
    (offsets, off)
}

/// VRAM one staging buffer needs for a layer of weights of `sizes` bytes (the placement budget
/// counts it before the host copies exist).
pub(crate) fn staged_layer_bytes(sizes: impl IntoIterator<Item = usize>) -> usize {
    stage_layout(sizes).1
}

impl StagedLayer {
    /// Lays `weights` out back to back at [`STAGE_ALIGN`].
    pub(crate) fn new(layer: usize, weights: Vec<(usize, Arc<HostMappedBuffer>)>) -> Self {
        let (offsets, _) = stage_layout(weights.iter().map(|(_, h)| h.len()));
        let weights = weights
            .into_iter()
            .zip(offsets)
            .map(|((id, h), at)| (id, h, at))
            .collect();
        StagedLayer { layer, weights }
    }
}

/// Spilled layers copied into VRAM ahead of their GEMMs, in layer order, on a copy stream of
/// their own.
///
/// A batched step runs layer-major over its micro-batches, so each spilled layer is copied once
/// per step — not once per micro-batch — and every micro-batch's GEMMs read the staged copy.
/// Staging buffer `j` takes every [`SPILL_BUFFERS`]-th layer: the copy into it waits on `free[j]`,
/// recorded on the compute stream after the last read of the layer it held; the compute stream
/// waits on `copied[j]` before the layer's first GEMM. Asking for layer `l`
/// ([`SpillStream::fetch_layer`]) queues the copy of the next one, so copies run back to back
/// while the compute stream works.
pub(crate) struct SpillStream {
    copy: Stream,
    staging: Vec<DeviceBuffer<u8>>,
    copied: Vec<Event>,
    free: Vec<Event>,
    /// Spilled layers in order of use by one step.
    order: Vec<StagedLayer>,
    /// Position in `order` of the next layer the step will ask for.
    next_use: usize,
    /// The layer fetched and not yet released.
    current: Option<usize>,
    /// Copies queued so far in this step.
    issued: usize,
    /// The first [`SPILL_BUFFERS`] layers' copies are already queued for the next step
    /// ([`SpillStream::prestage`]).
    prestaged: bool,
}

impl SpillStream {
    fn new(ctx: &Arc<Context>, max_layer_bytes: usize) -> Result<SpillStream, GpuError> {
        let mut staging = Vec::with_capacity(SPILL_BUFFERS);
        let mut copied = Vec::with_capacity(SPILL_BUFFERS);
        let mut free = Vec::with_capacity(SPILL_BUFFERS);
        for _ in 0..SPILL_BUFFERS {
            staging.push(ctx.alloc::<u8>(max_layer_bytes)?);
            copied.push(ctx.new_event()?);
            free.push(ctx.new_event()?);
        }
        Ok(SpillStream {
            copy: ctx.new_stream()?,
            staging,
            copied,
            free,
            order: Vec::new(),
            next_use: 0,
            current: None,
            issued: 0,
            prestaged: false,
        })
    }

    /// Sets the layers and their order of use (once, after placement).
    pub(crate) fn set_order(&mut self, order: Vec<StagedLayer>) {
        self.order = order;
    }

    /// Starts a step: the first layer asked for is `order[0]` again.
    pub(crate) fn begin(&mut self) {
        self.next_use = 0;
        self.current = None;
        if !std::mem::take(&mut self.prestaged) {
            self.issued = 0;
        }
    }

    /// Queues the copies of the first [`SPILL_BUFFERS`] spilled layers for the next step, once
    /// this step's last read of their buffers is queued on `compute`: the copy engine is idle
    /// between batched steps (decode reads spilled weights in place), so the next prompt finds
    /// its first layers already in VRAM instead of waiting on their copies before any compute.
    pub(crate) fn prestage(&mut self) -> Result<(), GpuError> {
        if self.current.is_some() || self.order.is_empty() {
            return Ok(());
        }
        self.next_use = 0;
        self.issued = 0;
        self.queue_copies(SPILL_BUFFERS)?;
        self.prestaged = true;
        Ok(())
    }

    fn queue_copies(&mut self, through: usize) -> Result<(), GpuError> {
        while self.issued < through.min(self.order.len()) {
            let j = self.issued % SPILL_BUFFERS;
            self.copy.wait_event(&self.free[j])?;
            for (_, host, off) in &self.order[self.issued].weights {
                self.copy
                    .memcpy_htod_async(&mut self.staging[j], *off, host, 0, host.len())?;
            }
            self.copy.record(&self.copied[j])?;
            self.issued += 1;
        }
        Ok(())
    }

    /// Makes layer `layer`'s staged copy current (the compute stream waits on its copy) when it
    /// is the spilled layer expected next; returns whether it is. Pair with
    /// [`SpillStream::release_layer`] after the layer's last GEMM is queued.
    pub(crate) fn fetch_layer(&mut self, compute: &Stream, layer: usize) -> Result<bool, GpuError> {
        if self.order.get(self.next_use).map(|o| o.layer) != Some(layer) {
            return Ok(false);
        }
        let p = self.next_use;
        self.queue_copies(p + SPILL_BUFFERS)?;
        compute.wait_event(&self.copied[p % SPILL_BUFFERS])?;
        self.current = Some(p);
        Ok(true)
    }

    /// The staged bytes of weight `id` in the current layer: its buffer and byte offset.
    pub(crate) fn staged(&self, id: usize) -> Option<(&DeviceBuffer<u8>, usize)> {
        let p = self.current?;
        let (_, _, off) = self.order[p].weights.iter().find(|w| w.0 == id)?;
        Some((&self.staging[p % SPILL_BUFFERS], *off))
    }

    /// Marks the current layer as read (on `compute`) and queues the next copy into its buffer.
    pub(crate) fn release_layer(&mut self, compute: &Stream) -> Result<(), GpuError> {
        let Some(p) = self.current.take() else {
            return Ok(());
        };
        compute.record(&self.free[p % SPILL_BUFFERS])?;
        self.next_use = p + 1;
        self.queue_copies(self.next_use + SPILL_BUFFERS)
    }

    /// Waits for every queued copy: after a step that stopped early (an error), so no copy
    /// still writes a buffer the next step reuses.
    pub(crate) fn drain(&self) -> Result<(), ModelError> {
        self.copy.synchronize().map_err(Into::into)
    }
}

impl Drop for SpillStream {
    /// A pre-staged copy may still be writing a staging buffer when the decoder goes away: wait
    /// for it before the buffers are freed.
    fn drop(&mut self) {
        if let Err(e) = self.copy.synchronize() {
            tracing::warn!(target: "hipfire::model", cause = %e, "draining the spilled-layer copies failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hipfire_gpu::DeviceMemory;
    use hipfire_gpu::KernelRegistry;
    use rand::{Rng, SeedableRng};

    /// NVRTC compiles kernels/prefill.cu for sm_90 (no GPU needed) and the image has every entry
    /// point [`PrefillKernels`] looks up; skips, saying so, where libnvrtc is absent.
    #[test]
    fn prefill_kernels_compile_for_sm90_with_nvrtc() {
        let src = &PREFILL_SOURCE;
        match hipfire_gpu::cuda::nvrtc_compile(src.name, src.source, src.headers, "sm_90", &[]) {
            Ok(image) => {
                for name in PREFILL_KERNEL_NAMES {
                    assert!(
                        image.windows(name.len()).any(|w| w == name.as_bytes()),
                        "{name} missing from the image"
                    );
                }
            }
            Err(GpuError::NoGpu { reason }) => {
                // CI installs NVRTC and sets this, so a lost library fails instead of skipping.
                assert!(
                    std::env::var("HIPFIRE_REQUIRE_NVRTC").as_deref() != Ok("1"),
                    "HIPFIRE_REQUIRE_NVRTC=1 but {reason}"
                );
                eprintln!("skipped: {reason}");
            }
            Err(e) => panic!("prefill.cu does not compile: {e}"),
        }
    }

    /// GPU tier: the chunk attention against an f64 softmax over the same cache values — f16,
    /// and q8_0 (the values it stages: each quant times its run's scale, rounded to f16) — for
    /// GQA and plain heads, widths 64, 80 (f16 only: q8_0 needs multiples of 32), 128 and 256,
    /// chunks that start at position 0 and deeper, and a query count that leaves a partial tile;
    /// unwritten outputs keep their poison.
    #[test]
    #[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
    fn chunk_attention_matches_f64() {
        let ctx = Context::new(0).unwrap_or_else(|e| panic!("GPU tier: no usable GPU: {e}"));
        let stream = ctx.new_stream().expect("stream");
        let reg = KernelRegistry::new(&ctx);
        let module = reg.module(&PREFILL_SOURCE, &[]).expect("compile");
        let k = PrefillKernels::new(&module).expect("kernels");
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let poison = f32::from_bits(0x7FC0_0002);
        // (n_head, n_kv_head, head_dim, pos0, n_tok)
        // (n_head, n_kv_head, head_dim, pos0, n_tok, sliding window)
        for (case, cache_type) in [
            (8usize, 2usize, 128usize, 37usize, 45usize, None),
            (4, 4, 64, 0, 16, None),
            (6, 3, 80, 5, 33, None),
            (4, 1, 256, 100, 9, None),
            (32, 8, 128, 600, 70, None),
            // Windows shorter than the chunk, than the cache, and not a tile multiple.
            (4, 1, 256, 0, 70, Some(24usize)),
            (8, 2, 128, 90, 40, Some(50)),
            (4, 2, 64, 300, 17, Some(512)),
        ]
        .iter()
        .flat_map(|c| [(c, CacheType::F16), (c, CacheType::Q8_0)])
        .filter(|&(c, t)| t == CacheType::F16 || c.2 % crate::kv_q8::Q8_BLOCK == 0)
        {
            let &(nh, nkv, d, pos0, nt, window) = case;
            let total = pos0 + nt;
            let kvw = nkv * d;
            let layout = GpuKvLayout {
                cache_type,
                kv_dim: kvw,
            };
            // The cache bytes as the device holds them, and the f16 values the kernel stages.
            let cache = |r: &mut rand_chacha::ChaCha8Rng| -> (Vec<u8>, Vec<u16>) {
                let vals: Vec<f32> = (0..total * kvw)
                    .map(|_| r.random_range(-2.0f32..2.0))
                    .collect();
                match cache_type {
                    CacheType::F16 => {
                        let h: Vec<u16> = vals
                            .iter()
                            .map(|&v| half::f16::from_f32(v).to_bits())
                            .collect();
                        (h.iter().flat_map(|b| b.to_le_bytes()).collect(), h)
                    }
                    CacheType::Q8_0 => {
                        let img = layout.q8_image(&vals, total).expect("q8 layout");
                        let s0 = total * kvw;
                        let h = (0..total * kvw)
                            .map(|i| {
                                let sc = half::f16::from_bits(u16::from_le_bytes([
                                    img[s0 + 2 * (i / 32)],
                                    img[s0 + 2 * (i / 32) + 1],
                                ]));
                                half::f16::from_f32(f32::from(img[i] as i8) * sc.to_f32()).to_bits()
                            })
                            .collect();
                        (img, h)
                    }
                }
            };
            let ((kbytes, kc), (vbytes, vc)) = (cache(&mut r), cache(&mut r));
            let q: Vec<f32> = (0..nt * nh * d)
                .map(|_| r.random_range(-2.0f32..2.0))
                .collect();
            // One spare row past the chunk in each buffer stays poison.
            let mut dk: DeviceBuffer<u8> = ctx.alloc(kbytes.len()).expect("alloc");
            let mut dv: DeviceBuffer<u8> = ctx.alloc(vbytes.len()).expect("alloc");
            let mut dq: DeviceBuffer<f32> = ctx.alloc(q.len()).expect("alloc");
            let mut dout: DeviceBuffer<f32> = ctx.alloc(q.len() + nh * d).expect("alloc");
            dk.upload(&stream, &kbytes).expect("up");
            dv.upload(&stream, &vbytes).expect("up");
            dq.upload(&stream, &q).expect("up");
            dout.upload(&stream, &vec![poison; q.len() + nh * d])
                .expect("up");
            k.attention(
                &ctx,
                &stream,
                dq.device_ptr(),
                (&dk, &dv, cache_type),
                dout.device_ptr(),
                (nh, nkv, d),
                (pos0, nt),
                (1.0 / (d as f32).sqrt(), window),
            )
            .expect("launch");
            let mut got = vec![0f32; q.len() + nh * d];
            dout.download(&stream, &mut got).expect("down");
            stream.synchronize().expect("sync");
            let h2f = |b: u16| f64::from(half::f16::from_bits(b).to_f32());
            let mut worst = 0f64;
            for t in 0..nt {
                for h in 0..nh {
                    let kvh = h / (nh / nkv);
                    let n_keys = pos0 + t + 1;
                    let lo = window.map_or(0, |w| n_keys.saturating_sub(w));
                    let qrow = &q[(t * nh + h) * d..(t * nh + h + 1) * d];
                    let scores: Vec<f64> = (lo..n_keys)
                        .map(|p| {
                            let kr = &kc[p * kvw + kvh * d..p * kvw + kvh * d + d];
                            qrow.iter()
                                .zip(kr)
                                .map(|(a, b)| f64::from(*a) * h2f(*b))
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for i in 0..d {
                        let want: f64 = (lo..n_keys)
                            .map(|p| e[p - lo] * h2f(vc[p * kvw + kvh * d + i]))
                            .sum::<f64>()
                            / sum;
                        let g = f64::from(got[(t * nh + h) * d + i]);
                        let err = (g - want).abs();
                        assert!(
                            err < 2e-3,
                            "{} shape {:?}: out[{t}][{h}][{i}] = {g}, want {want}",
                            cache_type.name(),
                            (nh, nkv, d, pos0, nt, window)
                        );
                        worst = worst.max(err);
                    }
                }
            }
            assert!(
                got[q.len()..]
                    .iter()
                    .all(|v| v.to_bits() == poison.to_bits()),
                "written past the chunk"
            );
            eprintln!(
                "chunk attention, {} cache, {:?}: max |gpu - f64| = {worst:.2e}",
                cache_type.name(),
                (nh, nkv, d, pos0, nt, window)
            );
        }
    }
}
