//! The GEMV with expert ids: the routed experts of a Mixture-of-Experts layer, ggml-cuda's
//! `mul_mat_vec_q` with ids (kernels/gemv.cu `gemv_<fmt>_plain_v<width>_ids`).
//!
//! A layer's experts of one projection (gate, up or down) are an [`ExpertSet`]: a device table of
//! their base addresses, each in VRAM or in pinned host-mapped memory (the kernel reads either,
//! the latter over PCIe), so experts can be placed one by one. One launch multiplies every
//! `(token row, slot)` pair of a step by the expert the routing chose for it, the ids read on the
//! device: no host round trip, so a decode step with it can be captured in a graph.

use super::{
    Activation, GemvKernels, GpuError, LaunchArgs, LaunchDims, Stream, WeightLocation, WeightRef,
    LOAD_WIDTHS,
};
use crate::context::{Context, DeviceBuffer, DeviceMemory};
use hipfire_quant::Format;
use std::sync::Arc;

/// Most thread blocks one launch's 1-D grid holds (CUDA's x extent, 2^31 − 1): a launch covers
/// row blocks × pairs, so more pairs than fit are launched in chunks.
const MAX_GRID_BLOCKS: usize = i32::MAX as usize;

/// One projection's experts of one layer: `len()` matrices of the same format and shape, their
/// base addresses in a device table the ids GEMV indexes by expert id.
#[derive(Debug)]
pub struct ExpertSet {
    table: DeviceBuffer<u64>,
    format: Format,
    m: usize,
    k: usize,
    row_bytes: usize,
    /// The widest load every expert's base and the row stride allow.
    width: usize,
    /// Experts whose bytes are in pinned host memory (the rest are in VRAM).
    host_mapped: usize,
}

impl ExpertSet {
    /// The table of `experts` (at least one; the same format, `m` and `k` each, of `ctx`),
    /// uploaded through `stream`.
    ///
    /// # Safety
    /// The memory each of `experts` views stays allocated for as long as any launch using this
    /// set can run (the table keeps raw addresses, not borrows).
    pub unsafe fn new(
        ctx: &Arc<Context>,
        stream: &Stream,
        experts: &[WeightRef<'_>],
    ) -> Result<ExpertSet, GpuError> {
        let Some(first) = experts.first() else {
            return Err(GpuError::Invalid {
                what: "experts",
                rule: "an expert set holds at least one expert",
            });
        };
        let (format, m, k, row_bytes) = (first.format, first.m, first.k, first.row_bytes);
        if i32::try_from(experts.len()).is_err() {
            return Err(GpuError::Invalid {
                what: "experts",
                rule: "the expert count must fit the kernel's i32",
            });
        }
        let mut bases = Vec::with_capacity(experts.len());
        let mut host_mapped = 0;
        for w in experts {
            ctx.check_same(&w.ctx, "expert")?;
            if (w.format, w.m, w.k) != (format, m, k) {
                return Err(GpuError::Invalid {
                    what: "experts",
                    rule: "every expert of a set has one format and shape",
                });
            }
            host_mapped += usize::from(w.location == WeightLocation::HostMapped);
            bases.push(w.ptr);
        }
        let Some(width) = LOAD_WIDTHS
            .into_iter()
            .find(|&v| row_bytes % v == 0 && bases.iter().all(|&b| b % v as u64 == 0))
        else {
            return Err(GpuError::Misaligned {
                what: "expert rows (bases and row stride)",
                align: 2,
            });
        };
        let mut table = ctx.alloc::<u64>(bases.len())?;
        table.upload(stream, &bases)?;
        Ok(ExpertSet {
            table,
            format,
            m,
            k,
            row_bytes,
            width,
            host_mapped,
        })
    }

    /// Experts in the set.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Always false: a set holds at least one expert.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Rows of each expert's matrix.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Columns of each expert's matrix.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The experts' format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Experts whose bytes are in pinned host memory.
    pub fn host_mapped(&self) -> usize {
        self.host_mapped
    }
}

/// Which activation column a pair `(row, slot)` of an ids GEMV multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdsInput {
    /// Column `row`: every slot of a token reads the token's input (gate and up).
    TokenRow,
    /// Column `row · n_used + slot`: each pair reads its own (down, over the activated hidden).
    Pair,
}

/// The shape of one ids GEMV: `pairs` pairs `(row, slot)`, `n_used` slots a row, the expert of
/// pair `p` at `ids[p]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdsShape {
    /// Pairs to multiply: rows × `n_used`.
    pub pairs: usize,
    /// Slots (experts used) per token row.
    pub n_used: usize,
    /// Where each pair's activation column is.
    pub input: IdsInput,
}

impl GemvKernels {
    /// Queues `y[p·ldy + r] = E_{ids[p]}[r] · x_col(p)` for every pair `p < shape.pairs` and row
    /// `r < set.m()`, with `col(p)` per [`IdsShape::input`]. `ids` holds at least `pairs` i32
    /// expert ids (an id outside `0..set.len()` is clamped into it by the kernel); `act` was
    /// prepared with at least as many columns as the pairs read; `y` holds
    /// `(pairs − 1)·ldy + m` f32, `ldy ≥ m`. Each pair's rows are bit-identical to
    /// [`GemvKernels::gemv`] of that expert on that column (the same kernel body).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_ids<I: DeviceMemory + ?Sized, Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        set: &ExpertSet,
        ids: &I,
        shape: IdsShape,
        act: &Activation,
        y: &mut Y,
        ldy: usize,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(set.table.context(), "expert set")?;
        self.ctx.check_same(ids.context(), "ids")?;
        self.ctx.check_same(y.context(), "y")?;
        let IdsShape {
            pairs,
            n_used,
            input,
        } = shape;
        if pairs == 0 || n_used == 0 || pairs % n_used != 0 {
            return Err(GpuError::Invalid {
                what: "pairs",
                rule: "a positive multiple of the slots per row",
            });
        }
        let cols = match input {
            IdsInput::TokenRow => pairs / n_used,
            IdsInput::Pair => pairs,
        };
        super::check_columns(cols, act.cols)?;
        if act.k != set.k {
            return Err(GpuError::ActivationMismatch {
                need: set.k,
                got: act.k,
            });
        }
        let ids_need = pairs.saturating_mul(4);
        if ids.byte_len() < ids_need || ids.device_ptr() % 4 != 0 {
            return Err(GpuError::BufferTooSmall {
                what: "ids (4-byte aligned)",
                need: ids_need,
                got: ids.byte_len(),
            });
        }
        let y_need = super::cols_y_floats(pairs, ldy, set.m)?.saturating_mul(4);
        if y.byte_len() < y_need {
            return Err(GpuError::BufferTooSmall {
                what: "y",
                need: y_need,
                got: y.byte_len(),
            });
        }
        if y.device_ptr() % 4 != 0 {
            return Err(GpuError::Misaligned {
                what: "y",
                align: 4,
            });
        }
        let float = matches!(set.format, Format::F32 | Format::F16 | Format::BF16);
        let elems = if float {
            super::FLOAT_KERNEL_BLOCK
        } else {
            set.format.block_elems()
        };
        if set.k % elems != 0 {
            return Err(GpuError::Unsupported {
                format: set.format,
                why: format!("k = {} is not a multiple of {elems}", set.k),
            });
        }
        let (Ok(nrows), Ok(nblocks), Ok(n_used_i), Ok(_)) = (
            i32::try_from(set.m),
            i32::try_from(set.k / elems),
            i32::try_from(n_used),
            i32::try_from(pairs),
        ) else {
            return Err(GpuError::Unsupported {
                format: set.format,
                why: "more than 2^31 rows, blocks or pairs".into(),
            });
        };
        let Some(f) = self.ids.get(&(set.format, set.width)) else {
            return Err(GpuError::Unsupported {
                format: set.format,
                why: "no GPU kernel".into(),
            });
        };
        let rblocks = (nrows as u32).div_ceil(self.config.rows_per_block()) as usize;
        let per_launch = MAX_GRID_BLOCKS / rblocks.max(1);
        for pair0 in (0..pairs).step_by(per_launch) {
            let chunk = (pairs - pair0).min(per_launch);
            let dims = LaunchDims {
                // rblocks · chunk ≤ MAX_GRID_BLOCKS, which fits the u32.
                grid: (rblocks * chunk) as u32,
                block: self.config.warps * super::WARP,
                shared_bytes: 0,
            };
            let mut args = LaunchArgs::new()
                .ptr(set.table.device_ptr())
                .i32(set.len() as i32)
                .ptr(ids.device_ptr())
                .i32(n_used_i)
                .i32(i32::from(input == IdsInput::Pair))
                .i32(pair0 as i32)
                .i32(rblocks as i32)
                .u64(set.row_bytes as u64)
                .ptr(act.qs.device_ptr())
                .ptr(act.ds.device_ptr())
                .ptr(act.xf.device_ptr())
                .u64(act.k as u64)
                .ptr(y.device_ptr())
                .u64(ldy as u64)
                .i32(nrows)
                .i32(nblocks);
            let params = args.params()?;
            // SAFETY: kernel `gemv_<fmt>_plain_v<width>_ids(const u64* experts, int n_experts,
            // const int* ids, int n_used, int col_per_pair, int pair0, int rblocks, u64
            // row_bytes, const i8* qs, const float2* ds, const float* xf, u64 xstride, float* y,
            // u64 ldy, int nrows, int nblocks)`: sixteen parameters of these types, in order, over
            // rblocks · chunk blocks. Block b handles row block b % rblocks (rows past m are
            // never written) of pair p = pair0 + b / rblocks < pairs: it
            // reads ids[p] (ids holds pairs i32, checked), clamps it below set.len() (the table's
            // length), reads that expert's rows [0, m) with `width`-byte loads (`width` divides
            // every base and row_bytes: ExpertSet::new; each expert holds m·row_bytes bytes and
            // stays allocated while the set is used: ExpertSet::new's contract), activation
            // column p or p / n_used (< cols <= act.cols, checked) at k elements a column, and
            // writes y[p·ldy .. p·ldy + m) (y holds (pairs−1)·ldy + m floats, checked). All
            // other memory is owned by borrowed live objects whose Drop frees synchronously.
            unsafe {
                self.ctx
                    .backend()
                    .launch(f.raw(), dims, stream.raw(), params)?;
            }
        }
        Ok(())
    }
}
