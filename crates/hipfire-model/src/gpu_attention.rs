//! Decode attention on the GPU, split over the KV range ("flash-decoding").
//!
//! `attention_split_f16kv` (kernels/decode.cu) runs one block per (group of up to
//! [`ATTN_HEADS_PER_BLOCK`] query heads of one kv head, chunk of positions): each K/V row of the
//! chunk is read once for the block's heads, with 16-byte loads, and each warp folds its rows
//! with an online softmax of its own.
//! With one chunk it writes the output; with several it writes each chunk's (max, sum,
//! unnormalised accumulator) and `attention_combine_f32` merges them. [`SplitPlan::for_depth`]
//! chooses the chunks from the depth so the grid fills the device at depth and stays one pass
//! (one launch) at a tiny depth.
//!
//! Both cache types have their instances: f16 and q8_0 ([`crate::gpu_kv`]: int8 quants, then
//! the runs' f16 scales, which the q8_0 kernels find from the capacity they are passed).

use std::sync::Arc;

use hipfire_gpu::backend::LaunchDims;
use hipfire_gpu::{Context, DeviceBuffer, DeviceMemory, Function, LaunchArgs, Module, Stream};

use crate::attention::CacheType;
use crate::gpu_kv::GpuKvLayout;
use crate::ModelError;

/// Names of the kernels in `kernels/decode.cu` over the f16 cache: the split kernel's instances
/// for at most 1, 2, 4 and 8 query heads a block, the combine, then the slots form's instances.
pub const ATTENTION_KERNEL_NAMES: [&str; 9] = [
    "attention_split_f16kv_g1",
    "attention_split_f16kv_g2",
    "attention_split_f16kv_g4",
    "attention_split_f16kv_g8",
    "attention_combine_f32",
    "attention_slots_f16kv_g1",
    "attention_slots_f16kv_g2",
    "attention_slots_f16kv_g4",
    "attention_slots_f16kv_g8",
];
/// [`ATTENTION_KERNEL_NAMES`] over the q8_0 cache (the combine is shared).
pub const ATTENTION_Q8_KERNEL_NAMES: [&str; 9] = [
    "attention_split_q8kv_g1",
    "attention_split_q8kv_g2",
    "attention_split_q8kv_g4",
    "attention_split_q8kv_g8",
    "attention_combine_f32",
    "attention_slots_q8kv_g1",
    "attention_slots_q8kv_g2",
    "attention_slots_q8kv_g4",
    "attention_slots_q8kv_g8",
];

/// The attention kernels' names for caches of `cache` type.
pub fn attention_kernel_names(cache: CacheType) -> [&'static str; 9] {
    match cache {
        CacheType::F16 => ATTENTION_KERNEL_NAMES,
        CacheType::Q8_0 => ATTENTION_Q8_KERNEL_NAMES,
    }
}
/// Most chunks a row of a slots launch ([`SplitKvAttention::launch_slots`]) is cut into: with
/// several rows the grid fills the device with fewer chunks each, and the partials' scratch is
/// `rows × n_head × SLOT_MAX_CHUNKS` rows.
pub const SLOT_MAX_CHUNKS: usize = 64;
/// Most query heads a block of the split kernel serves (`HF_ATTN_MAX_G` in decode.cu): their
/// accumulators are registers, 8 floats per head per lane. A larger group takes several blocks.
pub const ATTN_MAX_GROUP: usize = 8;
/// Threads per block of the split kernel (`HF_ATTN_THREADS`).
const ATTN_THREADS: u32 = 128;
/// Threads per block of the combine kernel: one pass over a 128-wide head.
const COMBINE_THREADS: u32 = 128;
/// Most chunks the combine kernel merges (`HF_ATTN_MAX_CHUNKS`, a static shared array there).
pub const ATTN_MAX_CHUNKS: usize = 256;
/// Largest head width: 8 values a lane and at most 32 lanes a row (the narrowest warp).
pub const ATTN_MAX_HEAD_DIM: usize = 256;
/// The narrowest warp (CUDA's 32; HIP's wave64 has half as many warps a block): bounds the
/// per-warp sums the split kernel keeps in shared memory.
const MIN_WARP: usize = 32;
/// f16 values per 16-byte load: head_dim must be a multiple of it.
const VEC: usize = 8;

/// Fewest positions a chunk is cut to. Below it a block's fixed cost (loading q, the final
/// cross-warp sum, the partial's write and the combine) outweighs the rows it reads: on the H200
/// at depth 1024 chunks of 32 took 16.5 µs, of 8 34 µs, of 4 61 µs
/// (docs/perf-checkpoints/2026-12-01-decode-attention-h200, run2). Depth below twice this stays
/// one chunk, hence one launch.
pub const ATTN_MIN_CHUNK_POS: usize = 32;
/// Blocks per multiprocessor the split aims for once the depth allows: the kernel is built for 4
/// blocks of 128 threads an SM (`HF_ATTN_MINB`, at most 128 registers a thread), so that many
/// chunks fill the device in one wave and more only add partials and a second wave. On the H200
/// (132 SMs) at Llama-3-8B's shape with 2 heads a block that is 33 chunks: 19.9 µs at depth
/// 4096 and 44.8 µs at 16384, where 66 chunks took 26.2 / 59.9 µs
/// (docs/perf-checkpoints/2026-12-01-decode-graphs-h200, attention variants).
pub const ATTN_BLOCKS_PER_SM: usize = 4;
/// Query heads a block serves when the GQA group has more: each K/V row is then read by
/// `group / 2` blocks (the others from L2) in exchange for half the registers a thread and twice
/// the blocks. On the H200 at Llama-3-8B's shape (groups of 4), 2 heads × 33 chunks took 13.3 /
/// 19.9 / 44.8 µs at depth 1024 / 4096 / 16384 against 15.8 / 24.3 / 47.4 for the whole group ×
/// 66 chunks (same record).
pub const ATTN_HEADS_PER_BLOCK: usize = 2;

/// Shape of one layer's attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (`n_head` is a multiple).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl AttnShape {
    /// Query heads per kv head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_kv_head
    }

    /// Blocks per chunk: kv heads × head groups of `heads_per_block`.
    fn blocks_per_chunk(&self, heads_per_block: usize) -> usize {
        self.n_kv_head * self.group().div_ceil(heads_per_block.max(1))
    }

    /// Refuses shapes the kernel cannot run, with the reason.
    pub fn check(&self) -> Result<(), ModelError> {
        if self.n_head == 0 || self.n_kv_head == 0 || self.n_head % self.n_kv_head != 0 {
            return Err(ModelError::Unsupported(format!(
                "GPU attention: {} query heads are not a multiple of {} kv heads",
                self.n_head, self.n_kv_head
            )));
        }
        if self.head_dim == 0 || self.head_dim % VEC != 0 || self.head_dim > ATTN_MAX_HEAD_DIM {
            return Err(ModelError::Unsupported(format!(
                "GPU attention needs head_dim a multiple of {VEC} in [{VEC}, {ATTN_MAX_HEAD_DIM}], got {}",
                self.head_dim
            )));
        }
        Ok(())
    }

    /// Lanes that cover one row: the power of two ≥ head_dim / 8 (lanes past the row idle).
    fn lanes_per_row(&self) -> usize {
        (self.head_dim / VEC).next_power_of_two()
    }

    /// Dynamic shared memory of the split kernel: scaled q, then one accumulator and one
    /// (max, sum) per warp per head for the merge of the warps at the end.
    fn split_shared_bytes(&self, heads_per_block: usize) -> usize {
        let warps = ATTN_THREADS as usize / MIN_WARP;
        let floats = heads_per_block * self.head_dim * (1 + warps) + warps * heads_per_block * 2;
        floats * std::mem::size_of::<f32>()
    }
}

/// How one attention call is cut: `n_chunks` chunks of `chunk_len` positions (the last may be
/// shorter, none is empty), each block serving `heads_per_block` query heads of one kv head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    /// Positions per chunk.
    pub chunk_len: usize,
    /// Chunks (1 = one launch, no combine).
    pub n_chunks: usize,
    /// Query heads per block, in `[1, min(group, ATTN_MAX_GROUP)]`: fewer than the group re-read
    /// the group's K/V rows (from L2) in exchange for more blocks at a shallow depth.
    pub heads_per_block: usize,
}

impl SplitPlan {
    /// The plan for `n_pos` positions (≥ 1) on a device of `multiprocessors`: as many chunks as
    /// fill [`ATTN_BLOCKS_PER_SM`] blocks per SM, none shorter than [`ATTN_MIN_CHUNK_POS`], at
    /// most [`ATTN_MAX_CHUNKS`]; up to [`ATTN_HEADS_PER_BLOCK`] query heads of the GQA group in
    /// each block, unless that leaves fewer blocks than multiprocessors, when the heads are
    /// halved until it does not (a shallow depth's rows are few, so reading them twice costs
    /// less than idle SMs).
    pub fn for_depth(shape: &AttnShape, n_pos: usize, multiprocessors: usize) -> SplitPlan {
        let target = max_chunks(shape, multiprocessors);
        let mut plan =
            SplitPlan::with_chunks(shape, n_pos, (n_pos / ATTN_MIN_CHUNK_POS).min(target));
        while plan.heads_per_block > 1
            && plan.n_chunks * shape.blocks_per_chunk(plan.heads_per_block) < multiprocessors
        {
            plan.heads_per_block = plan.heads_per_block.div_ceil(2);
        }
        plan
    }

    /// `n_pos` positions (≥ 1) in about `want` chunks (clamped to `[1, ATTN_MAX_CHUNKS]`),
    /// rounded so that no chunk is empty, with up to [`ATTN_HEADS_PER_BLOCK`] heads a block.
    pub fn with_chunks(shape: &AttnShape, n_pos: usize, want: usize) -> SplitPlan {
        let n_pos = n_pos.max(1);
        let want = want.clamp(1, ATTN_MAX_CHUNKS.min(n_pos));
        let chunk_len = n_pos.div_ceil(want);
        SplitPlan {
            chunk_len,
            n_chunks: n_pos.div_ceil(chunk_len),
            heads_per_block: shape.group().clamp(1, ATTN_HEADS_PER_BLOCK),
        }
    }

    /// This plan with `heads_per_block` query heads a block (clamped to the valid range).
    pub fn with_heads_per_block(self, shape: &AttnShape, heads_per_block: usize) -> SplitPlan {
        SplitPlan {
            heads_per_block: heads_per_block.clamp(1, shape.group().clamp(1, ATTN_MAX_GROUP)),
            ..self
        }
    }
}

/// Most chunks [`SplitPlan::for_depth`] gives this shape on this device (sizes the scratch).
fn max_chunks(shape: &AttnShape, multiprocessors: usize) -> usize {
    (multiprocessors.max(1) * ATTN_BLOCKS_PER_SM)
        .div_ceil(shape.blocks_per_chunk(shape.group().min(ATTN_HEADS_PER_BLOCK)))
        .clamp(1, ATTN_MAX_CHUNKS)
}

/// Chunks a row below which [`graph_chunk_step`] keeps powers of two; above, multiples of it.
const CHUNK_STEP: usize = 8;

/// `want` chunks (≥ 0) rounded down to a power of two up to `CHUNK_STEP`, to a multiple of it
/// beyond: about a dozen chunk counts, hence captured decode graphs, from depth 32 to the
/// saturated plan (33 chunks for Llama-3-8B on 132 SMs). Each chunk is then less than twice as
/// long as the unrounded plan's, and under 1.5× from 16 chunks on.
pub fn graph_chunk_step(want: usize) -> usize {
    match want {
        0 | 1 => 1,
        w if w < CHUNK_STEP => 1 << w.ilog2(),
        w => w / CHUNK_STEP * CHUNK_STEP,
    }
}

/// Index into [`ATTENTION_KERNEL_NAMES`] of the smallest split instance for `heads_per_block`.
fn instance(heads_per_block: usize) -> usize {
    match heads_per_block {
        0 | 1 => 0,
        2 => 1,
        3 | 4 => 2,
        _ => 3,
    }
}

/// Device addresses of a slots launch's per-row tables (`rows` entries each): the caches
/// (`u64` device pointers) and the attended positions `firsts[y] .. npos[y]` (`i32`).
#[derive(Debug, Clone, Copy)]
pub struct SlotTables {
    /// Each row's K cache.
    pub kcs: u64,
    /// Each row's V cache.
    pub vcs: u64,
    /// Each row's depth: it attends positions below it.
    pub npos: u64,
    /// Each row's first attended position (0, or past a sliding window).
    pub firsts: u64,
    /// Positions every row's caches hold (the q8_0 kernels find the scales from it; every
    /// slot's cache has the same).
    pub capacity: usize,
}

/// The kernels (split, combine, and the split's slots form) and the chunk partials' scratch for
/// one attention shape.
#[derive(Debug)]
pub struct SplitKvAttention {
    ctx: Arc<Context>,
    /// The split kernel's instances for at most 1, 2, 4 and 8 heads a block.
    split: [Function; 4],
    /// Their slots form (one query row per sequence, each over its own caches and depth).
    slots: [Function; 4],
    combine: Function,
    shape: AttnShape,
    /// How the caches it reads are laid out.
    layout: GpuKvLayout,
    /// `[n_head][max_chunks][2 + head_dim]` f32: m, l, acc.
    part: DeviceBuffer<f32>,
    max_chunks: usize,
    /// Factor on the scores.
    scale: f32,
}

impl SplitKvAttention {
    /// The kernels from `module` (compiled from `kernels/decode.cu`) for `shape` over f16
    /// caches, with scratch for as many chunks as [`SplitPlan::for_depth`] gives on this device,
    /// or as [`SplitKvAttention::launch_with`] may be asked for: at least `min_chunks`.
    pub fn new(
        module: &Arc<Module>,
        shape: AttnShape,
        min_chunks: usize,
    ) -> Result<SplitKvAttention, ModelError> {
        SplitKvAttention::for_cache(module, shape, CacheType::F16, min_chunks)
    }

    /// As [`SplitKvAttention::new`] over caches of `cache` type ([`crate::gpu_kv`]); q8_0 needs
    /// head_dim a multiple of 32.
    pub fn for_cache(
        module: &Arc<Module>,
        shape: AttnShape,
        cache: CacheType,
        min_chunks: usize,
    ) -> Result<SplitKvAttention, ModelError> {
        shape.check()?;
        if cache == CacheType::Q8_0 && shape.head_dim % crate::kv_q8::Q8_BLOCK != 0 {
            return Err(ModelError::Unsupported(format!(
                "GPU attention over a q8_0 cache needs head_dim a multiple of {}, got {}",
                crate::kv_q8::Q8_BLOCK,
                shape.head_dim
            )));
        }
        let ctx = module.context().clone();
        let sms = ctx.info().multiprocessors as usize;
        let max_chunks = max_chunks(&shape, sms).max(min_chunks.min(ATTN_MAX_CHUNKS));
        let part = ctx.alloc::<f32>(shape.n_head * max_chunks * (shape.head_dim + 2))?;
        let names = attention_kernel_names(cache);
        let f = |i: usize| module.function(names[i]);
        Ok(SplitKvAttention {
            split: [f(0)?, f(1)?, f(2)?, f(3)?],
            combine: f(4)?,
            slots: [f(5)?, f(6)?, f(7)?, f(8)?],
            ctx,
            shape,
            layout: GpuKvLayout {
                cache_type: cache,
                kv_dim: shape.n_kv_head * shape.head_dim,
            },
            part,
            max_chunks,
            scale: 1.0 / (shape.head_dim as f32).sqrt(),
        })
    }

    /// Sets the factor on the scores (default `1/√head_dim`; the model's `attn_scale`).
    pub fn set_scale(&mut self, scale: f32) {
        self.scale = scale;
    }

    /// The shape this was built for.
    pub fn shape(&self) -> AttnShape {
        self.shape
    }

    /// The cache layout this reads.
    pub fn layout(&self) -> GpuKvLayout {
        self.layout
    }

    /// The plan [`SplitKvAttention::launch`] uses at `n_pos`.
    pub fn plan(&self, n_pos: usize) -> SplitPlan {
        SplitPlan::for_depth(&self.shape, n_pos, self.ctx.info().multiprocessors as usize)
    }

    /// Bytes of device scratch (the chunk partials).
    pub fn scratch_bytes(&self) -> usize {
        self.part.len() * std::mem::size_of::<f32>()
    }

    /// `out = softmax(q·Kᵀ / √head_dim) · V` over the first `n_pos` rows of the caches, queued on
    /// `stream`. `q` and `out` are `[n_head][head_dim]` f32; the caches hold `[rows][n_kv_head]
    /// [head_dim]` values in [`SplitKvAttention::layout`], at least `n_pos` rows.
    pub fn launch<Q: DeviceMemory + ?Sized, K: DeviceMemory + ?Sized, O: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        q: &Q,
        k_cache: &K,
        v_cache: &K,
        out: &mut O,
        n_pos: usize,
    ) -> Result<(), ModelError> {
        self.launch_with(stream, q, k_cache, v_cache, out, n_pos, self.plan(n_pos))
    }

    /// As [`SplitKvAttention::launch`] over positions `first .. n_pos` only (a sliding-window
    /// layer: `first = n_pos − window` once the cache is longer than the window).
    #[allow(clippy::too_many_arguments)] // the attention's operands
    pub fn launch_from<
        Q: DeviceMemory + ?Sized,
        K: DeviceMemory + ?Sized,
        O: DeviceMemory + ?Sized,
    >(
        &self,
        stream: &Stream,
        q: &Q,
        k_cache: &K,
        v_cache: &K,
        out: &mut O,
        first: usize,
        n_pos: usize,
    ) -> Result<(), ModelError> {
        let span = n_pos.saturating_sub(first);
        self.launch_span(
            stream,
            q,
            k_cache,
            v_cache,
            out,
            first,
            n_pos,
            self.plan(span),
        )
    }

    /// The plan of a slots launch over `rows` query rows, the deepest over `max_pos` positions:
    /// as [`SplitPlan::for_depth`] with the device's blocks shared among the rows (at most
    /// [`SLOT_MAX_CHUNKS`] chunks a row), the chunk count rounded down to one of a few steps
    /// ([`graph_chunk_step`]) so that a captured decode step (its launch dims baked in) serves a
    /// range of depths: the kernel cuts each row's own span into the plan's chunks.
    pub fn plan_slots(&self, max_pos: usize, rows: usize) -> SplitPlan {
        let s = &self.shape;
        let sms = self.ctx.info().multiprocessors as usize;
        let rows = rows.max(1);
        let target = max_chunks(s, sms).div_ceil(rows).min(SLOT_MAX_CHUNKS);
        let want = (max_pos / ATTN_MIN_CHUNK_POS).min(target);
        let want = if want < target {
            graph_chunk_step(want)
        } else {
            target
        };
        // Exactly `want` chunks (not `with_chunks`'s rounding to whole chunks of the deepest
        // row, which moves with the depth): the kernel sizes each row's chunks from its span.
        let n_chunks = want.clamp(1, max_pos.max(1));
        let mut plan = SplitPlan {
            chunk_len: max_pos.max(1).div_ceil(n_chunks),
            n_chunks,
            heads_per_block: s.group().clamp(1, ATTN_HEADS_PER_BLOCK),
        };
        while plan.heads_per_block > 1
            && rows * plan.n_chunks * s.blocks_per_chunk(plan.heads_per_block) < sms
        {
            plan.heads_per_block = plan.heads_per_block.div_ceil(2);
        }
        plan
    }

    /// The slots form of [`SplitKvAttention::launch`], for a batched decode step: query row y of
    /// `q` (rows `n_head × head_dim` f32 apart) attends over positions `firsts[y] .. npos[y]` of
    /// its own caches (`kcs[y]`, `vcs[y]`), into row y of `out`, for `rows` rows, with one `plan`
    /// covering the deepest row (from [`SplitKvAttention::plan_slots`]); `part` holds the
    /// partials, `rows × n_head × plan.n_chunks × (head_dim + 2)` f32.
    ///
    /// # Safety
    /// `q` and `out` are device addresses of `rows × n_head × head_dim` f32 each; `tables` are
    /// device addresses of `rows` entries each, written before this launch on `stream`: every
    /// `kcs[y]` / `vcs[y]` a cache of `tables.capacity ≥ npos[y]` rows of this shape in
    /// [`SplitKvAttention::layout`] and `0 ≤ firsts[y] < npos[y]` (each row's span is cut into `plan.n_chunks` chunks in the kernel; `chunk_len` is
    /// not used).
    pub unsafe fn launch_slots(
        &self,
        stream: &Stream,
        (q, out): (u64, u64),
        tables: &SlotTables,
        part: &DeviceBuffer<f32>,
        rows: usize,
        plan: SplitPlan,
    ) -> Result<(), ModelError> {
        let s = self.shape;
        let per_row = plan.n_chunks * s.blocks_per_chunk(plan.heads_per_block);
        let need = rows * s.n_head * plan.n_chunks * (s.head_dim + 2);
        if rows == 0
            || plan.n_chunks == 0
            || plan.n_chunks > SLOT_MAX_CHUNKS
            || plan.heads_per_block == 0
            || plan.heads_per_block > s.group().min(ATTN_MAX_GROUP)
            || part.len() < need
            || u32::try_from(rows * per_row).is_err()
            || i32::try_from(tables.capacity * self.layout.kv_dim).is_err()
        {
            return Err(ModelError::Backend {
                backend: "gpu",
                message: format!(
                    "slots attention over {rows} rows ({plan:?}): scratch {} of {need}",
                    part.len()
                ),
            });
        }
        let mut args = LaunchArgs::new()
            .ptr(q)
            .ptr(tables.kcs)
            .ptr(tables.vcs)
            .ptr(tables.npos)
            .ptr(tables.firsts)
            .ptr(out)
            .buf(part)
            .i32(s.n_head as i32)
            .i32(s.n_kv_head as i32)
            .i32(s.head_dim as i32)
            .i32(plan.n_chunks as i32)
            .i32(s.lanes_per_row() as i32)
            .i32(plan.heads_per_block as i32)
            .f32(self.scale)
            .i32(per_row as i32);
        if self.layout.cache_type == CacheType::Q8_0 {
            // Bounded with the cache's values above.
            args = args.i32(tables.capacity as i32);
        }
        let params = args.params()?;
        let dims = LaunchDims {
            grid: (rows * per_row) as u32,
            block: ATTN_THREADS,
            shared_bytes: s.split_shared_bytes(plan.heads_per_block) as u32,
        };
        // SAFETY: the parameters match `attention_slots_{f16,q8}kv_g*` (typed one by one in
        // `args`, the capacity last for q8_0);
        // the caller guarantees q, out and the tables (this function's contract); `part` was
        // checked to hold every row's partials.
        unsafe {
            self.ctx.backend().launch(
                self.slots[instance(plan.heads_per_block)].raw(),
                dims,
                stream.raw(),
                params,
            )?;
        }
        if plan.n_chunks == 1 {
            return Ok(());
        }
        // Row y's partials and outputs follow row y − 1's, so the combine over rows × n_head
        // "heads" merges every row.
        // SAFETY: the partials were just written (rows × n_head × n_chunks of `part`, checked
        // above); `out` holds rows × n_head rows (this function's contract).
        unsafe {
            self.launch_combine(
                stream,
                (part.device_ptr(), out),
                rows * s.n_head,
                plan.n_chunks,
            )
        }
    }

    /// `attention_combine_f32` over `heads` heads of `n_chunks` partials each: `part` (device
    /// address) holds `heads × n_chunks` rows of `head_dim + 2`, `out` receives `heads` rows.
    ///
    /// # Safety
    /// Both addresses are live device memory of those extents, the partials written before on
    /// `stream`.
    unsafe fn launch_combine(
        &self,
        stream: &Stream,
        (part, out): (u64, u64),
        heads: usize,
        n_chunks: usize,
    ) -> Result<(), ModelError> {
        let mut args = LaunchArgs::new()
            .ptr(part)
            .ptr(out)
            .i32(self.shape.head_dim as i32)
            .i32(n_chunks as i32);
        let params = args.params()?;
        let dims = LaunchDims {
            grid: heads as u32,
            block: COMBINE_THREADS,
            shared_bytes: 0,
        };
        // SAFETY: the parameters match `attention_combine_f32`; the extents are the caller's
        // contract.
        unsafe {
            self.ctx
                .backend()
                .launch(self.combine.raw(), dims, stream.raw(), params)?;
        }
        Ok(())
    }

    /// As [`SplitKvAttention::launch`] with a chosen plan (tests and the timing program).
    #[allow(clippy::too_many_arguments)] // the attention's operands
    pub fn launch_with<
        Q: DeviceMemory + ?Sized,
        K: DeviceMemory + ?Sized,
        O: DeviceMemory + ?Sized,
    >(
        &self,
        stream: &Stream,
        q: &Q,
        k_cache: &K,
        v_cache: &K,
        out: &mut O,
        n_pos: usize,
        plan: SplitPlan,
    ) -> Result<(), ModelError> {
        self.launch_span(stream, q, k_cache, v_cache, out, 0, n_pos, plan)
    }

    /// Positions `first .. n_pos` with a chosen plan over the `n_pos − first` of them.
    #[allow(clippy::too_many_arguments)] // the attention's operands
    fn launch_span<Q: DeviceMemory + ?Sized, K: DeviceMemory + ?Sized, O: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        q: &Q,
        k_cache: &K,
        v_cache: &K,
        out: &mut O,
        first: usize,
        n_pos: usize,
        plan: SplitPlan,
    ) -> Result<(), ModelError> {
        let s = self.shape;
        let qd = s.n_head * s.head_dim;
        let kv_rows = n_pos * s.n_kv_head * s.head_dim;
        let span = n_pos.saturating_sub(first);
        // Positions the caches hold (the q8_0 kernels' scales start past them).
        let cap = self
            .layout
            .capacity(k_cache.byte_len().min(v_cache.byte_len()));
        let covers = plan.n_chunks >= 1
            && plan.heads_per_block >= 1
            && plan.heads_per_block <= s.group().min(ATTN_MAX_GROUP)
            && plan.n_chunks <= self.max_chunks
            && plan.chunk_len * plan.n_chunks >= span
            && plan.chunk_len * (plan.n_chunks - 1) < span;
        if span == 0
            || !covers
            || q.byte_len() / 4 < qd
            || out.byte_len() / 4 < qd
            || cap < n_pos
            || i32::try_from(cap * self.layout.kv_dim).is_err()
        {
            return Err(ModelError::Backend {
                backend: "gpu",
                message: format!(
                "attention over {n_pos} positions ({plan:?}, scratch for {} chunks): q {} / out {} of {qd}, caches of {cap} positions ({} cache, {kv_rows} values)",
                self.max_chunks,
                q.byte_len() / 4,
                out.byte_len() / 4,
                self.layout.cache_type.name()
            ),
            });
        }
        let grid = plan.n_chunks * s.blocks_per_chunk(plan.heads_per_block);
        // Every count below is bounded by the cache length checked to fit an i32 above.
        let mut args = LaunchArgs::new()
            .buf(q)
            .buf(k_cache)
            .buf(v_cache)
            .buf(&*out)
            .buf(&self.part)
            .i32(s.n_head as i32)
            .i32(s.n_kv_head as i32)
            .i32(s.head_dim as i32)
            .i32(n_pos as i32)
            .i32(plan.chunk_len as i32)
            .i32(plan.n_chunks as i32)
            .i32(s.lanes_per_row() as i32)
            .i32(plan.heads_per_block as i32)
            .f32(self.scale)
            .i32(first as i32);
        if self.layout.cache_type == CacheType::Q8_0 {
            // Bounded with the cache's values above.
            args = args.i32(cap as i32);
        }
        let params = args.params()?;
        let dims = LaunchDims {
            grid: grid as u32,
            block: ATTN_THREADS,
            shared_bytes: s.split_shared_bytes(plan.heads_per_block) as u32,
        };
        // SAFETY: the parameters match the `attention_split_{f16,q8}kv_g*` signature (typed one
        // by one in `args`, whose slots outlive the launch; the capacity last for q8_0); every pointer is a live device buffer of
        // `self` or of the caller, borrowed for the call, whose lengths were checked above
        // against what the kernel reads (n_pos ≤ cap cache rows, and for q8_0 the scales of cap
        // rows past the quants, inside the buffer by `capacity`; n_head q rows) and writes (n_head out
        // rows, n_chunks ≤ max_chunks partials per head).
        unsafe {
            self.ctx.backend().launch(
                self.split[instance(plan.heads_per_block)].raw(),
                dims,
                stream.raw(),
                params,
            )?;
        }
        if plan.n_chunks == 1 {
            return Ok(());
        }
        // SAFETY: the split kernel just wrote n_head × n_chunks partials into the scratch
        // (n_chunks ≤ max_chunks, checked above); `out` holds n_head rows (checked above).
        unsafe {
            self.launch_combine(
                stream,
                (self.part.device_ptr(), out.device_ptr()),
                s.n_head,
                plan.n_chunks,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3_8B: AttnShape = AttnShape {
        n_head: 32,
        n_kv_head: 8,
        head_dim: 128,
    };
    /// The H200's multiprocessors.
    const H200_SMS: usize = 132;

    #[test]
    fn plans_cover_every_position_with_no_empty_chunk() {
        for shape in [
            LLAMA3_8B,
            AttnShape {
                n_head: 16,
                n_kv_head: 1,
                head_dim: 64,
            },
            AttnShape {
                n_head: 4,
                n_kv_head: 4,
                head_dim: 64,
            },
        ] {
            for sms in [1, 8, H200_SMS, 1000] {
                for n_pos in (1..300).chain([777, 1024, 4095, 4096, 16384, 131_072]) {
                    let p = SplitPlan::for_depth(&shape, n_pos, sms);
                    assert!(p.n_chunks >= 1 && p.n_chunks <= max_chunks(&shape, sms));
                    assert!(p.chunk_len * p.n_chunks >= n_pos, "{n_pos}: {p:?}");
                    assert!(p.chunk_len * (p.n_chunks - 1) < n_pos, "{n_pos}: {p:?}");
                    if p.n_chunks > 1 {
                        assert!(p.chunk_len >= ATTN_MIN_CHUNK_POS, "{n_pos}: {p:?}");
                    }
                    assert!(p.heads_per_block >= 1);
                    assert!(p.heads_per_block <= shape.group().min(ATTN_MAX_GROUP));
                }
            }
        }
    }

    #[test]
    fn tiny_depth_is_one_pass_and_depth_fills_the_h200() {
        for n_pos in [1, 16, 2 * ATTN_MIN_CHUNK_POS - 1] {
            assert_eq!(
                SplitPlan::for_depth(&LLAMA3_8B, n_pos, H200_SMS).n_chunks,
                1
            );
        }
        for n_pos in [1024, 4096, 16384] {
            let p = SplitPlan::for_depth(&LLAMA3_8B, n_pos, H200_SMS);
            // Two heads of the group of 4 a block: each K/V row read by two blocks.
            assert_eq!(p.heads_per_block, ATTN_HEADS_PER_BLOCK, "{n_pos}: {p:?}");
            assert!(
                p.n_chunks * LLAMA3_8B.blocks_per_chunk(p.heads_per_block) >= H200_SMS,
                "{n_pos}: {p:?}"
            );
        }
        // Depth 16: one chunk, one query head a block (32 blocks rather than 8).
        assert_eq!(
            SplitPlan::for_depth(&LLAMA3_8B, 16, H200_SMS),
            SplitPlan {
                chunk_len: 16,
                n_chunks: 1,
                heads_per_block: 1
            }
        );
    }

    #[test]
    fn graph_chunk_steps_are_few_and_within_half_of_the_want() {
        let mut seen = std::collections::BTreeSet::new();
        let mut last = 0;
        for want in 0..=SLOT_MAX_CHUNKS {
            let c = graph_chunk_step(want);
            assert!(c >= 1 && c <= want.max(1), "{want} -> {c}");
            assert!(2 * c > want, "{want} -> {c}: under half");
            assert!(c >= last, "not monotone at {want}");
            last = c;
            seen.insert(c);
        }
        // 1, 2, 4, then every multiple of 8 up to 64: one captured graph per value.
        assert_eq!(seen.len(), 3 + SLOT_MAX_CHUNKS / 8, "{seen:?}");
    }

    #[test]
    fn with_chunks_clamps() {
        let s = LLAMA3_8B;
        assert_eq!(
            SplitPlan::with_chunks(&s, 5, 100),
            SplitPlan {
                chunk_len: 1,
                n_chunks: 5,
                heads_per_block: ATTN_HEADS_PER_BLOCK
            }
        );
        assert_eq!(SplitPlan::with_chunks(&s, 1000, 0).n_chunks, 1);
        assert_eq!(
            SplitPlan::with_chunks(&s, 100_000, 10_000).n_chunks,
            ATTN_MAX_CHUNKS
        );
        // 10 positions in 4 chunks of 3: the last holds one.
        assert_eq!(
            SplitPlan::with_chunks(&s, 10, 4),
            SplitPlan {
                chunk_len: 3,
                n_chunks: 4,
                heads_per_block: ATTN_HEADS_PER_BLOCK
            }
        );
        let p = SplitPlan::with_chunks(&s, 10, 4);
        assert_eq!(p.with_heads_per_block(&s, 0).heads_per_block, 1);
        assert_eq!(p.with_heads_per_block(&s, 9).heads_per_block, 4);
        let mqa = AttnShape {
            n_head: 16,
            n_kv_head: 1,
            head_dim: 64,
        };
        assert_eq!(
            SplitPlan::with_chunks(&mqa, 10, 1).heads_per_block,
            ATTN_HEADS_PER_BLOCK
        );
        // A forced plan may still take the whole group, up to the largest instance.
        assert_eq!(
            SplitPlan::with_chunks(&mqa, 10, 1)
                .with_heads_per_block(&mqa, 16)
                .heads_per_block,
            ATTN_MAX_GROUP
        );
        assert_eq!([1, 2, 3, 4, 5, 8].map(instance), [0, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn unsupported_shapes_are_refused_with_the_rule() {
        for (n_head, n_kv_head, head_dim) in [(32, 6, 128), (8, 8, 100), (8, 8, 512), (0, 1, 64)] {
            let e = AttnShape {
                n_head,
                n_kv_head,
                head_dim,
            }
            .check()
            .expect_err("refused");
            assert!(matches!(e, ModelError::Unsupported(_)), "{e}");
        }
        assert!(LLAMA3_8B.check().is_ok());
        assert_eq!(LLAMA3_8B.lanes_per_row(), 16);
        assert_eq!(
            AttnShape {
                head_dim: 96,
                ..LLAMA3_8B
            }
            .lanes_per_row(),
            16
        );
    }
}
