//! One decode step over several sequence slots: the forward over B tokens from B sequences.
//!
//! Every projection multiplies the B activation columns in one pass over its weight: a resident
//! weight through the multi-column GEMV (`GemvKernels::gemv_cols`), a spilled one as one batched
//! split step of the offload executor (`OffloadExecutor::run_cols`: the GPU's rows cross PCIe
//! once for all B columns, the CPU's rows leave DRAM once). What is per sequence — RoPE at its
//! own position, the KV store into its own cache, the split-KV attention over its own depth —
//! is one launch per operation over every row (the kernels' slots forms), reading each row's
//! position and cache from tables uploaded once per step.

use hipfire_exec::SpilledBatch;
use hipfire_gpu::{
    Activation, Context, DeviceBuffer, DeviceMemory, GemvForm, GpuError, HostMappedBuffer,
    LaunchArgs, RowRange, WeightRef,
};
use std::sync::Arc;

use super::decode_graph::{DecodeGraphs, GraphKey};
use super::{at_step, ActSlot, DeviceView, GpuDecoder, GpuWeight, LayerRows, StepRows};
use crate::attention::CacheType;
use crate::config::ModelConfig;
use crate::gpu_attention::{SlotTables, SplitPlan, SLOT_MAX_CHUNKS};
use crate::ModelError;

/// Most sequence slots one decoder holds: a server's `--parallel` cap. Each slot costs a KV
/// cache of the context length; 256 is far past where a batched step over one GPU stops
/// gaining (each step's weights are read once; attention and the CPU arm grow per sequence).
pub const MAX_SLOTS: usize = 256;

/// The device activations of a step of `rows` tokens (row-major), their quantised forms for the
/// GEMV, and the pinned staging of the embedding rows up and the logits down: one row for a
/// decode step ([`super::Scratch`]), one per sequence for a batched one ([`DecodeBatch`]).
pub(super) struct StepActs {
    pub(super) x: DeviceBuffer<f32>,
    pub(super) xn: DeviceBuffer<f32>,
    pub(super) q: DeviceBuffer<f32>,
    /// k and v in f32 (projection, bias, k-norm and RoPE act here) before `kv_store_f16`
    /// rounds them into the cache.
    pub(super) k: DeviceBuffer<f32>,
    pub(super) v: DeviceBuffer<f32>,
    pub(super) att: DeviceBuffer<f32>,
    pub(super) gate: DeviceBuffer<f32>,
    pub(super) up: DeviceBuffer<f32>,
    pub(super) logits: DeviceBuffer<f32>,
    pub(super) act_model: Activation,
    pub(super) act_q: Activation,
    pub(super) act_ff: Activation,
    /// A hybrid model's DeltaNet output (`value_dim`), the input of `ssm_out`.
    pub(super) act_value: Option<Activation>,
    /// The shared expert's hidden (`n_ff_shared` wide), for a model with one.
    pub(super) act_shared: Option<Activation>,
    pub(super) stage_x: HostMappedBuffer,
    pub(super) stage_logits: HostMappedBuffer,
}

impl StepActs {
    /// For steps of up to `rows` tokens of model `c`.
    pub(super) fn new(
        ctx: &Arc<Context>,
        c: &ModelConfig,
        rows: usize,
    ) -> Result<StepActs, ModelError> {
        let (d, qd, kvd) = (c.d_model, c.q_dim(), c.kv_dim());
        Ok(StepActs {
            x: ctx.alloc(rows * d)?,
            xn: ctx.alloc(rows * d)?,
            q: ctx.alloc(rows * qd)?,
            k: ctx.alloc(rows * kvd)?,
            v: ctx.alloc(rows * kvd)?,
            att: ctx.alloc(rows * qd)?,
            gate: ctx.alloc(rows * c.n_ff)?,
            up: ctx.alloc(rows * c.n_ff)?,
            logits: ctx.alloc(rows * c.vocab)?,
            act_model: Activation::with_columns(ctx, d, rows)?,
            act_q: Activation::with_columns(ctx, qd, rows)?,
            act_ff: Activation::with_columns(ctx, c.n_ff, rows)?,
            act_value: match &c.delta_net {
                Some(dn) => Some(Activation::with_columns(ctx, dn.value_dim(), rows)?),
                None => None,
            },
            act_shared: match shared_width(c) {
                0 => None,
                sf => Some(Activation::with_columns(ctx, sf, rows)?),
            },
            stage_x: ctx.alloc_pinned_host(rows * d * 4)?,
            stage_logits: ctx.alloc_pinned_host(rows * c.vocab * 4)?,
        })
    }

    /// Device bytes [`StepActs::new`] allocates for `rows` (for the placement budget).
    pub(super) fn vram_bytes(c: &ModelConfig, rows: usize) -> u64 {
        let f32s = rows * (3 * c.d_model + 3 * c.q_dim() + 2 * c.kv_dim() + 2 * c.n_ff + c.vocab);
        // Activations: an f32 copy and int8 values per element, a (d, s) f32 pair per 32.
        let value = c.delta_net.as_ref().map_or(0, |dn| dn.value_dim());
        let elems = rows * (c.d_model + c.q_dim() + c.n_ff + value + shared_width(c));
        let act = elems * (4 + 1) + elems.div_ceil(32) * 8;
        (f32s * 4 + act) as u64
    }

    pub(super) fn act(&self, slot: ActSlot) -> Result<&Activation, ModelError> {
        match slot {
            ActSlot::Model => Ok(&self.act_model),
            ActSlot::Q => Ok(&self.act_q),
            ActSlot::Ff => Ok(&self.act_ff),
            ActSlot::Value => self.act_value.as_ref().ok_or_else(no_value_act),
            ActSlot::Shared => self.act_shared.as_ref().ok_or_else(no_shared),
        }
    }

    pub(super) fn act_mut(&mut self, slot: ActSlot) -> Result<&mut Activation, ModelError> {
        match slot {
            ActSlot::Model => Ok(&mut self.act_model),
            ActSlot::Q => Ok(&mut self.act_q),
            ActSlot::Ff => Ok(&mut self.act_ff),
            ActSlot::Value => self.act_value.as_mut().ok_or_else(no_value_act),
            ActSlot::Shared => self.act_shared.as_mut().ok_or_else(no_shared),
        }
    }
}

/// Width of the model's shared expert, 0 where it has none.
fn shared_width(c: &ModelConfig) -> usize {
    c.moe.as_ref().and_then(|m| m.n_ff_shared).unwrap_or(0)
}

/// A projection of the shared expert's hidden in a model without one (a broken invariant).
fn no_shared() -> ModelError {
    ModelError::Backend {
        backend: "gpu",
        message: "a shared-expert projection in a model without a shared expert".into(),
    }
}

/// The activations of a batched decode step: `rows` tokens (one per slot).
pub(crate) struct DecodeBatch {
    rows: usize,
    a: StepActs,
    /// The step's logits on the host, `rows × vocab` in feed order.
    host_logits: Vec<f32>,
    /// Per layer, each row's K then V cache address: `[layer][k | v][row]`; for a DeltaNet
    /// layer the first half holds each row's recurrent state address (the second is unused).
    pub(super) caches: DeviceBuffer<u64>,
    /// Each row's position, then its depth (position + 1), then per layer its first attended
    /// position: `[pos | npos | first(layer 0) | first(layer 1) ..][row]`.
    places: DeviceBuffer<i32>,
    /// Pinned staging of `caches` and `places`, written by the host at the start of a step.
    stage_caches: HostMappedBuffer,
    stage_places: HostMappedBuffer,
    /// Attention's chunk partials for every row: `rows × n_head × SLOT_MAX_CHUNKS` rows of
    /// `head_dim + 2`.
    part: DeviceBuffer<f32>,
}

impl DecodeBatch {
    /// Scratch for steps of up to `rows` sequences of model `c`.
    pub(crate) fn new(
        ctx: &Arc<Context>,
        c: &ModelConfig,
        rows: usize,
    ) -> Result<DecodeBatch, ModelError> {
        let (nc, np) = Self::table_lens(c, rows);
        Ok(DecodeBatch {
            rows,
            a: StepActs::new(ctx, c, rows)?,
            host_logits: vec![0.0; rows * c.vocab],
            caches: ctx.alloc(nc)?,
            places: ctx.alloc(np)?,
            stage_caches: ctx.alloc_pinned_host(nc * 8)?,
            stage_places: ctx.alloc_pinned_host(np * 4)?,
            part: ctx.alloc(Self::part_len(c, rows))?,
        })
    }

    /// Rows (columns of the GEMV) it holds.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Entries of the `caches` and `places` tables.
    fn table_lens(c: &ModelConfig, rows: usize) -> (usize, usize) {
        (2 * c.n_layer * rows, (2 + c.n_layer) * rows)
    }

    /// f32 values of the attention partials' scratch.
    fn part_len(c: &ModelConfig, rows: usize) -> usize {
        rows * c.n_head * SLOT_MAX_CHUNKS * (c.head_dim + 2)
    }

    /// Device bytes it holds (for the placement budget).
    pub(crate) fn vram_bytes(c: &ModelConfig, rows: usize) -> u64 {
        let (nc, np) = Self::table_lens(c, rows);
        StepActs::vram_bytes(c, rows) + (nc * 8 + np * 4 + Self::part_len(c, rows) * 4) as u64
    }
}

impl<'m> GpuDecoder<'m> {
    /// One decode step over `feeds` — `(slot, token)`, each slot at most once — as one forward
    /// over their tokens: each weight is read once for all of them. Returns the next-token
    /// logits, `feeds.len() × vocab` in feed order. On error no slot has advanced.
    pub fn decode_slots(&mut self, feeds: &[(usize, u32)]) -> Result<&[f32], ModelError> {
        let c = self.model.config().clone();
        let b = feeds.len();
        let rows = self.decode_batch.as_ref().map_or(1, |db| db.rows);
        if b == 0 || b > rows {
            return Err(ModelError::InvalidOption(format!(
                "a batched decode step of {b} sequences (1 to {rows})"
            )));
        }
        let mut seen = vec![false; self.slot_pos.len()];
        for &(slot, token) in feeds {
            match seen.get_mut(slot) {
                Some(s @ false) => *s = true,
                _ => {
                    return Err(ModelError::InvalidOption(format!(
                        "decode feed for slot {slot} of {} (absent or twice)",
                        self.slot_pos.len()
                    )))
                }
            }
            if token as usize >= c.vocab {
                return Err(ModelError::BadToken {
                    id: token,
                    vocab: c.vocab,
                });
            }
            if self.slot_pos[slot] + 1 > self.ctx_len {
                return Err(ModelError::ContextFull {
                    need: self.slot_pos[slot] + 1,
                    ctx: self.ctx_len,
                });
            }
        }
        if b == 1 && self.graphs.is_none() {
            let (slot, token) = feeds[0];
            let keep = self.slot;
            self.slot = slot;
            let r = self.forward_at_step(&[token], "decoding");
            self.slot = keep;
            r?;
            return Ok(&self.logits);
        }
        self.batch_forward(feeds, &c).map_err(|e| {
            at_step(e, || match feeds {
                [(slot, token)] => format!(
                    "decoding position {} of slot {slot} (token {token})",
                    self.slot_pos[*slot]
                ),
                _ => format!(
                    "decoding {b} sequences in one batched step (slots {:?})",
                    feeds.iter().map(|f| f.0).collect::<Vec<_>>()
                ),
            })
        })?;
        for &(slot, _) in feeds {
            self.slot_pos[slot] += 1;
        }
        if b == 1 {
            return Ok(&self.logits);
        }
        let n = b * c.vocab;
        Ok(self
            .decode_batch
            .as_ref()
            .map_or(&[][..], |db| &db.host_logits[..n]))
    }

    /// One token of the selected slot as a one-row batched step, so that it can be replayed
    /// from a captured graph (with graphs on).
    pub(super) fn replayed_step(&mut self, token: u32) -> Result<(), ModelError> {
        let c = self.model.config().clone();
        if token as usize >= c.vocab {
            return Err(ModelError::BadToken {
                id: token,
                vocab: c.vocab,
            });
        }
        let slot = self.slot;
        if self.slot_pos[slot] + 1 > self.ctx_len {
            return Err(ModelError::ContextFull {
                need: self.slot_pos[slot] + 1,
                ctx: self.ctx_len,
            });
        }
        self.batch_forward(&[(slot, token)], &c)?;
        self.slot_pos[slot] += 1;
        Ok(())
    }

    fn batch_rows(&self) -> Result<StepRows, ModelError> {
        let db = self.decode_batch.as_ref().ok_or_else(no_batch)?;
        let a = &db.a;
        Ok(StepRows {
            x: a.x.device_ptr(),
            xn: a.xn.device_ptr(),
            q: a.q.device_ptr(),
            k: a.k.device_ptr(),
            v: a.v.device_ptr(),
            att: a.att.device_ptr(),
            gate: a.gate.device_ptr(),
            up: a.up.device_ptr(),
        })
    }

    /// One batched decode step over `feeds`: the host stages the tokens' embedding rows and
    /// the slot tables, then the step's work is queued — replayed from its captured graph where
    /// [`GpuDecoder::graphs`] holds one, captured first where it is on, launched kernel by
    /// kernel otherwise — and the logits come back: into `self.logits` for one row, the
    /// batch's `host_logits` for more.
    pub(super) fn batch_forward(
        &mut self,
        feeds: &[(usize, u32)],
        c: &ModelConfig,
    ) -> Result<(), ModelError> {
        let b = feeds.len();
        let tokens: Vec<u32> = feeds.iter().map(|f| f.1).collect();
        let slots: Vec<usize> = feeds.iter().map(|f| f.0).collect();
        self.stage_embeddings(&tokens)?;
        self.stage_slot_tables(feeds)?;
        // Outside the captured part: the zero fill of a slot starting at position 0.
        self.states_begin(&slots)?;
        self.run_batch_step(feeds)?;
        self.stream.synchronize()?;
        self.states_done(&slots);
        let n = b * c.vocab;
        let db = self.decode_batch.as_mut().ok_or_else(no_batch)?;
        let dst = if b == 1 {
            &mut self.logits[..]
        } else {
            &mut db.host_logits[..n]
        };
        for (l, bytes) in dst
            .iter_mut()
            .zip(db.a.stage_logits.as_slice().chunks_exact(4))
        {
            *l = f32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        Ok(())
    }

    /// Queues the device part of a batched decode step (after the host staged its inputs): a
    /// replay of the captured graph for its key, else a capture and its replay, else (graphs
    /// off, or a capture that failed, which turns them off for good) each kernel.
    fn run_batch_step(&mut self, feeds: &[(usize, u32)]) -> Result<(), ModelError> {
        let key = GraphKey::new(feeds.len(), &self.slots_plan(feeds));
        let Some(graphs) = self.graphs.as_mut() else {
            return self.enqueue_batch_step(feeds);
        };
        if let Some(g) = graphs.get(&key) {
            // SAFETY: the graph was captured from this decoder's step with this key: it touches
            // the weights, caches, scratch, tables and pinned staging this decoder owns and
            // never reallocates (all live as long as `self`), and reads what changes between
            // steps from them, just staged.
            return unsafe { g.launch(&self.stream) }.map_err(Into::into);
        }
        let captured = self
            .stream
            .begin_capture()
            .map_err(ModelError::from)
            .and_then(|()| {
                let queued = self.enqueue_batch_step(feeds);
                let graph = self.stream.end_capture();
                queued?;
                Ok(graph?)
            });
        match captured {
            Ok(graph) => {
                let graphs = self.graphs.get_or_insert_with(DecodeGraphs::default);
                tracing::debug!(target: "hipfire::model", ?key, captures = graphs.captures() + 1, "decode step captured");
                let g = graphs.insert(key, graph);
                // SAFETY: as for a cached graph above: just captured from this decoder's step.
                unsafe { g.launch(&self.stream) }.map_err(Into::into)
            }
            Err(e) => {
                if matches!(&e, ModelError::Gpu { source, .. } if matches!(**source, GpuError::NoGraphs { .. }))
                {
                    tracing::debug!(target: "hipfire::model", cause = %e, "decode steps launch kernel by kernel");
                } else {
                    tracing::warn!(target: "hipfire::model", cause = %e, "capturing a decode step failed; decode steps launch kernel by kernel from now on");
                }
                self.graphs = None;
                self.enqueue_batch_step(feeds)
            }
        }
    }

    /// The device work of a batched decode step, queued on the stream with no host step in it
    /// (so that it can be captured): the staged embeddings and tables copied up, every layer,
    /// the head, the logits copied down to pinned staging.
    fn enqueue_batch_step(&mut self, feeds: &[(usize, u32)]) -> Result<(), ModelError> {
        let c = self.model.config().clone();
        let b = feeds.len();
        let r = self.batch_rows()?;
        self.enqueue_staged(b, r.x)?;
        for li in 0..self.layers.len() {
            self.layer(li, &r, r.x, LayerRows::Slots(feeds))?;
        }
        self.rms_norm(r.x, self.output_norm.device_ptr(), r.xn, b, c.d_model)?;
        let db = self.decode_batch.as_ref().ok_or_else(no_batch)?;
        let logits = db.a.logits.device_ptr();
        self.project_cols(
            &[(self.head, logits, c.vocab)],
            r.xn,
            (c.d_model, b),
            ActSlot::Model,
            GemvForm::Plain,
        )?;
        if let Some(cap) = c.final_logit_softcap {
            let n = b * c.vocab;
            let args = LaunchArgs::new().ptr(logits).f32(cap).i32(n as i32);
            self.launch_1d(&self.k.softcap, n, args)?;
        }
        let db = self.decode_batch.as_mut().ok_or_else(no_batch)?;
        let n = b * c.vocab;
        self.stream
            .memcpy_dtoh_async(&mut db.a.stage_logits, 0, &db.a.logits, 0, n * 4)?;
        Ok(())
    }

    /// The attention plan of a batched step over `feeds` (from the deepest row).
    fn slots_plan(&self, feeds: &[(usize, u32)]) -> SplitPlan {
        let max_pos = feeds
            .iter()
            .map(|&(slot, _)| self.slot_pos[slot] + 1)
            .max()
            .unwrap_or(1);
        self.attention.plan_slots(max_pos, feeds.len())
    }

    /// Writes the slot tables of `feeds` into their pinned staging: each row's caches per layer,
    /// its position and depth, and per layer its first attended position.
    fn stage_slot_tables(&mut self, feeds: &[(usize, u32)]) -> Result<(), ModelError> {
        let db = self.decode_batch.as_mut().ok_or_else(no_batch)?;
        let rows = db.rows;
        let caches = db.stage_caches.as_mut_slice();
        for (li, l) in self.layers.iter().enumerate() {
            for (i, &(slot, _)) in feeds.iter().enumerate() {
                let at = |half: usize| 8 * ((2 * li + half) * rows + i);
                let (kp, vp) = match (l.rec.get(slot), l.k_cache.get(slot), l.v_cache.get(slot)) {
                    (Some(st), _, _) => (st.device_ptr(), 0),
                    (None, Some(kc), Some(vc)) => (kc.device_ptr(), vc.device_ptr()),
                    _ => {
                        return Err(ModelError::Backend {
                            backend: "gpu",
                            message: format!("layer {li} holds no state for slot {slot}"),
                        })
                    }
                };
                caches[at(0)..at(0) + 8].copy_from_slice(&kp.to_ne_bytes());
                caches[at(1)..at(1) + 8].copy_from_slice(&vp.to_ne_bytes());
            }
        }
        let places = db.stage_places.as_mut_slice();
        let mut put = |entry: usize, v: usize| {
            // Positions are below the context length, which fits an i32 (checked at load).
            places[4 * entry..4 * entry + 4].copy_from_slice(&(v as i32).to_ne_bytes());
        };
        for (i, &(slot, _)) in feeds.iter().enumerate() {
            let pos = self.slot_pos[slot];
            put(i, pos);
            put(rows + i, pos + 1);
            for (li, l) in self.layers.iter().enumerate() {
                // A sliding-window layer past its window attends its last `w` positions.
                let first = l.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                put((2 + li) * rows + i, first);
            }
        }
        Ok(())
    }

    /// Queues the copies of the staged embeddings (`b` rows, into `x`) and slot tables.
    fn enqueue_staged(&mut self, b: usize, x: u64) -> Result<(), ModelError> {
        let d = self.model.config().d_model;
        let db = self.decode_batch.as_mut().ok_or_else(no_batch)?;
        let mut xv = DeviceView {
            ptr: x,
            bytes: b * d * 4,
            ctx: &self.ctx,
        };
        self.stream
            .memcpy_htod_async(&mut xv, 0, &db.a.stage_x, 0, b * d * 4)?;
        let (nc, np) = (db.caches.len(), db.places.len());
        self.stream
            .memcpy_htod_async(&mut db.caches, 0, &db.stage_caches, 0, nc * 8)?;
        self.stream
            .memcpy_htod_async(&mut db.places, 0, &db.stage_places, 0, np * 4)?;
        Ok(())
    }

    /// What is per sequence in a batched decode step of `b` rows, layer `li`: RoPE of each row's
    /// q and k at its position, its k and v into its cache, its attention over its depth; one
    /// launch each over every row, from the tables [`GpuDecoder::stage_slot_tables`] staged and
    /// the step copied up first.
    pub(super) fn slots_rows(
        &mut self,
        li: usize,
        r: &StepRows,
        feeds: &[(usize, u32)],
    ) -> Result<(), ModelError> {
        let c = self.model.config();
        let (n_head, n_kv_head, hd, kvd) = (c.n_head, c.n_head_kv, c.head_dim, c.kv_dim());
        let (rope_dim, neox) = (c.rope_dim, c.rope_neox);
        let b = feeds.len();
        let db = self.decode_batch.as_ref().ok_or_else(no_batch)?;
        let rows = db.rows;
        // `places` starts with each row's position.
        let (caches, places) = (db.caches.device_ptr(), db.places.device_ptr());
        let (freq, mscale) = self.rope_table(li);
        for (x, heads) in [(r.q, n_head), (r.k, n_kv_head)] {
            let args = LaunchArgs::new()
                .ptr(x)
                .i32(heads as i32)
                .i32(hd as i32)
                .i32(rope_dim as i32)
                .ptr(places)
                .buf(freq)
                .i32(i32::from(neox))
                .f32(mscale);
            self.launch(&self.k.rope_slots, (b * heads) as u32, 64, 0, args)?;
        }
        let kbase = caches + (8 * 2 * li * rows) as u64;
        let vbase = caches + (8 * (2 * li + 1) * rows) as u64;
        let per_row = (kvd as u32).div_ceil(super::DECODE_THREADS);
        // Every slot's caches are one length (ctx_len positions): the capacity from it, as the
        // store and the one-sequence attention derive theirs; the q8_0 kernels find the scales
        // past it.
        let layout = self.attention.layout();
        let capacity = self.layers[li]
            .k_cache
            .first()
            .map_or(0, |kc| layout.capacity(kc.len()));
        let mut args = LaunchArgs::new()
            .ptr(r.k)
            .ptr(r.v)
            .ptr(kbase)
            .ptr(vbase)
            .ptr(places)
            .i32(kvd as i32)
            .i32(per_row as i32);
        let store = match layout.cache_type {
            CacheType::F16 => &self.k.kv_store_slots,
            CacheType::Q8_0 => {
                // ctx_len × kv_dim fits an i32 (checked at creation), so ctx_len does.
                args = args.i32(capacity as i32);
                // DECODE_THREADS is a multiple of 32: each run of 32 is one aligned lane group.
                &self.k.kv_store_slots_q8
            }
        };
        self.launch(store, b as u32 * per_row, super::DECODE_THREADS, 0, args)?;
        let plan = self.slots_plan(feeds);
        let tables = SlotTables {
            kcs: kbase,
            vcs: vbase,
            npos: places + (4 * rows) as u64,
            firsts: places + (4 * (2 + li) * rows) as u64,
            capacity,
        };
        // SAFETY: q and att hold `rows ≥ b` rows of n_head × head_dim f32 (StepActs); the tables
        // were staged by `stage_slot_tables` for these feeds and copied up earlier on this stream
        // (`enqueue_staged`): each row's caches hold ctx_len ≥ npos rows of this shape
        // (decode_slots refused a full slot) and firsts < npos; the kernel cuts each row's span
        // into the plan's chunks.
        unsafe {
            self.attention
                .launch_slots(&self.stream, (r.q, r.att), &tables, &db.part, b, plan)
        }
    }

    /// The embedding rows of `tokens` into `x` through the batch's pinned staging.
    /// Writes the embedding rows of `tokens` (dequantised on the host from the mapped file) into
    /// the batch's pinned staging.
    fn stage_embeddings(&mut self, tokens: &[u32]) -> Result<(), ModelError> {
        let d = self.model.config().d_model;
        let emb = &self.model.weights()[self.token_embd];
        let rb = emb.format.row_bytes(emb.k)?;
        let table = self.model.weight_bytes(emb);
        let scale = self.model.config().embd_scale;
        let db = self.decode_batch.as_mut().ok_or_else(no_batch)?;
        let mut row = vec![0f32; d];
        for (i, &t) in tokens.iter().enumerate() {
            crate::ops::dequantize_row(
                emb.format,
                &table[t as usize * rb..(t as usize + 1) * rb],
                &mut row,
            )?;
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
            let dst = &mut db.a.stage_x.as_mut_slice()[i * d * 4..(i + 1) * d * 4];
            for (o, v) in dst.chunks_exact_mut(4).zip(&row) {
                o.copy_from_slice(&v.to_ne_bytes());
            }
        }
        Ok(())
    }

    /// `y (+)= W·x` over the batch's `b` columns (`x`: `b × k`, each `y`: `b × len`) for every
    /// `(weight id, y, len)`: the activation is prepared once, each weight read once.
    pub(super) fn project_cols(
        &mut self,
        outs: &[(usize, u64, usize)],
        x: u64,
        (k, b): (usize, usize),
        slot: ActSlot,
        form: GemvForm,
    ) -> Result<(), ModelError> {
        let xv = DeviceView {
            ptr: x,
            bytes: b * k * 4,
            ctx: &self.ctx,
        };
        {
            let db = self.decode_batch.as_mut().ok_or_else(no_batch)?;
            let act = db.a.act_mut(slot)?;
            self.gemv.prepare_cols(&self.stream, &xv, act, b)?;
        }
        let db = self.decode_batch.as_ref().ok_or_else(no_batch)?;
        let act = db.a.act(slot)?;
        // Resident weights go through the multi-column GEMV one by one; the spilled ones are
        // handed to the executor together, so that those over this x run as one split.
        let mut spilled = Vec::new();
        for &(id, y, len) in outs {
            let w = &self.model.weights()[id];
            let mut yv = DeviceView {
                ptr: y,
                bytes: b * len * 4,
                ctx: &self.ctx,
            };
            match &self.weights[id] {
                Some(GpuWeight::Device(buf)) => {
                    let wr = WeightRef::new(buf, 0, w.format, w.m, w.k)?;
                    self.gemv.gemv_cols(
                        &self.stream,
                        &wr,
                        act,
                        &mut yv,
                        len,
                        RowRange::all(w.m),
                        form,
                        b,
                    )?;
                }
                Some(GpuWeight::Host(host)) => {
                    let wr = WeightRef::new(host.as_ref(), 0, w.format, w.m, w.k)?;
                    spilled.push((wr, host, yv));
                }
                None => {
                    return Err(ModelError::Unsupported(format!(
                        "weight {} not placed",
                        w.name
                    )))
                }
            }
        }
        if spilled.is_empty() {
            return Ok(());
        }
        let mut steps: Vec<SpilledBatch<'_>> = spilled
            .iter_mut()
            .map(|(wr, host, yv)| SpilledBatch {
                weight: wr,
                host: (*host).clone(),
                x: &xv,
                y: yv,
                form,
                cols: b,
            })
            .collect();
        self.offload
            .run_cols_shared(&self.stream, &self.gemv, act, &mut steps)?;
        Ok(())
    }
}

/// The error of a DeltaNet output projection on a model without DeltaNet layers (a broken
/// invariant: only a hybrid model's layers project from it).
fn no_value_act() -> ModelError {
    ModelError::Backend {
        backend: "gpu",
        message: "a DeltaNet output projection on a decoder without its activation".into(),
    }
}

fn no_batch() -> ModelError {
    ModelError::Backend {
        backend: "gpu",
        message: "a batched decode step on a decoder built with one slot".into(),
    }
}
