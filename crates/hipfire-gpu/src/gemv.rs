//! Row-range GEMV launches, the activation quantiser and the read-bandwidth kernel.
//!
//! The host side owns geometry and preconditions (as ggml's `mul_mat_vec_q_cuda` does): it checks
//! the row range, the weight's byte length, the output's length and the alignment, picks the widest
//! load the row stride and base allow, and launches. A row range `[a, b)` is a launch over the
//! matrix that starts at row `a`: the weight base moves by `a * row_bytes` and the output base by
//! `a`, and the kernel writes exactly `b - a` outputs.

use crate::backend::LaunchDims;
use crate::context::{Context, DeviceBuffer, DeviceMemory, Function, Stream};
use crate::launch::LaunchArgs;
use crate::registry::{KernelRegistry, GEMV_SOURCE, READ_SOURCE};
use crate::GpuError;
use hipfire_quant::Format;
use std::collections::HashMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

mod ids;
pub use ids::{ExpertSet, IdsInput, IdsShape};

/// Elements per activation block of the int8 form (kernels/blocks.cuh `HF_QX_BLOCK`, ggml's QK8_1).
pub const QX_BLOCK: usize = 32;
/// Elements per "block" of the float formats in the kernel (two 16-byte f32 loads of x per unit).
pub const FLOAT_KERNEL_BLOCK: usize = 8;
/// Most activation columns one multi-column GEMV launch multiplies (the kernel's register budget:
/// kernels/gemv.cu `HF_MAX_COLS`, passed to the compiler from here); more columns are launched in
/// groups of this many, each re-reading the weight. Sixteen, not eight: with groups of 8 a
/// 16-sequence decode step read every host-mapped weight twice and its GPU arm ran at half the
/// rate (22–25 against 43–48 GB/s at 8 columns on the H200 box, `hipfire bench --batch`,
/// docs/perf-checkpoints/2026-12-01-serve-gpu-h200). 16 columns of HF_ROWS = 2 row accumulators
/// are 32 registers per lane.
pub const GEMV_MAX_COLS: usize = 16;
/// Threads per block of the quantiser (8 warps; kernels/gemv.cu `__launch_bounds__(256)`).
const QUANTIZE_THREADS: u32 = 256;
/// Threads per block of the read kernel (kernels/read.cu `__launch_bounds__(256)`).
const READ_THREADS: u32 = 256;
/// Read-kernel blocks per multiprocessor: 8 × 256 threads = 2048, a full SM on sm_90.
const READ_BLOCKS_PER_SM: u32 = 8;
/// Threads per warp (NVIDIA; the HIP build targets wave32-compatible launch shapes too).
const WARP: u32 = 32;
/// Load widths the GEMV is instantiated for, widest first (kernels/gemv.cu `HF_GEMV_INSTANCES`).
const LOAD_WIDTHS: [usize; 3] = [16, 4, 2];
/// Formats with a device-resident kernel (kernels/gemv.cu `HF_GEMV_DEV_ENTRY`).
const DEVICE_FORMATS: [Format; 2] = [Format::Q4K, Format::Q6K];
/// Shared bytes per 256-element block of the activation staged by the device-resident kernel
/// (kernels/gemv.cu `HF_DEV_XBYTES`: 256 int8 + 8 × (d, s)).
const DEV_X_BYTES_PER_BLOCK: usize = 320;
/// Shared bytes of one Q6_K row tile in the device-resident kernel (8 blocks of 210 bytes + 16 pad:
/// kernels/gemv.cu `hf_gemv_dev_tiled`, `STRIDE`).
const DEV_Q6K_TILE_BYTES: usize = 8 * 210 + 16;
/// Rows one block of the tensor-core multi-column kernel computes (kernels/gemv.cu
/// `HF_MMA_ROWS`: the 16 rows of an `mma.m16n8k32` A tile).
const MMA_ROWS: u32 = 16;
/// Warps per block of the tensor-core multi-column kernel (kernels/gemv.cu `HF_MMA_WARPS`): they
/// split the row's blocks and are summed at the end.
const MMA_WARPS: u32 = 8;
/// Columns of the two tensor-core kernels of each format (one and two 8-column n-tiles:
/// `gemv_<fmt>_<form>_mma<8|16>`).
const MMA_COLS: [usize; 2] = [8, 16];
/// Formats with tensor-core multi-column kernels (kernels/gemv.cu `HF_GEMV_MMA_ENTRY`).
const MMA_FORMATS: [Format; 2] = [Format::Q4K, Format::Q6K];
/// Fewest columns from which the tensor-core kernels beat the dp4a multi-column kernel, measured
/// with `gpu_bench --cols N` (HBM, H200 box, docs/perf-checkpoints/2026-12-02-tensor-core-cols-serve-h200):
/// Q4_K from 2 (4096×4096: 1134 against 842 GB/s), Q6_K from 4 (4096×4096 at 4: 1107 against
/// 859; at 2 the dp4a kernel, which unpacks Q6_K once for all columns, won on two of the three
/// large shapes, at 3 they were level).
const MMA_MIN_COLS_Q4K: usize = 2;
const MMA_MIN_COLS_Q6K: usize = 4;
/// Below this many rows a tensor-core launch has fewer 16-row blocks than the H200 has SMs (132)
/// and takes over from 8 columns ([`MMA_MIN_COLS_FEW_ROWS`]): at 1024 rows Q4_K ran 323 against
/// 416 GB/s at 2 columns and 313 against 234 at 8, Q6_K 357 against 413 at 4 and 350 against
/// 299 at 8 (same record).
const MMA_FULL_ROWS: i32 = 2048;
const MMA_MIN_COLS_FEW_ROWS: usize = 8;
/// Dynamic shared memory a launch may use without opting in (48 KiB on CUDA; AMD LDS is 64 KiB).
const MAX_DYNAMIC_SHARED: usize = 48 << 10;
/// Thread blocks per multiprocessor the device-resident launch aims for before it shrinks blocks
/// (two full blocks of the default shape are resident per SM).
const DEV_BLOCKS_PER_SM: u32 = 2;

/// Fewest columns of a launch over `nrows` rows of `format` that take the tensor-core kernel.
fn mma_min_cols(format: Format, nrows: i32) -> usize {
    let by_format = if format == Format::Q4K {
        MMA_MIN_COLS_Q4K
    } else {
        MMA_MIN_COLS_Q6K
    };
    if nrows < MMA_FULL_ROWS {
        by_format.max(MMA_MIN_COLS_FEW_ROWS)
    } else {
        by_format
    }
}

/// Where a weight's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightLocation {
    /// Device memory (HBM).
    Device,
    /// Pinned host memory mapped into the device (read over PCIe, "zero-copy").
    HostMapped,
}

/// `y = W x` or `y += W x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemvForm {
    /// `y[r] = W[r] · x`.
    Plain,
    /// `y[r] += W[r] · x`.
    Residual,
}

impl GemvForm {
    fn name(self) -> &'static str {
        match self {
            GemvForm::Plain => "plain",
            GemvForm::Residual => "residual",
        }
    }
}

/// Output rows `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowRange {
    /// First row.
    pub start: usize,
    /// One past the last row.
    pub end: usize,
}

impl RowRange {
    /// `[start, end)`.
    pub fn new(start: usize, end: usize) -> RowRange {
        RowRange { start, end }
    }
    /// `[0, m)`.
    pub fn all(m: usize) -> RowRange {
        RowRange { start: 0, end: m }
    }
    /// Rows in the range (0 when `end <= start`).
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }
    /// True if and only if the range holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A weight matrix the GPU can read: `m` rows of `k` elements in `format`, rows `row_bytes` apart
/// with no padding, in device or host-mapped memory. Borrows the memory it points into.
#[derive(Debug, Clone)]
pub struct WeightRef<'a> {
    ptr: u64,
    len: usize,
    format: Format,
    m: usize,
    k: usize,
    row_bytes: usize,
    location: WeightLocation,
    ctx: Arc<Context>,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> WeightRef<'a> {
    /// Views `mem[offset..]` as an `m × k` matrix. Errors if `k` is not a block multiple or the
    /// memory holds fewer than `m * row_bytes` bytes after `offset`.
    pub fn new<M: DeviceMemory + ?Sized>(
        mem: &'a M,
        offset: usize,
        format: Format,
        m: usize,
        k: usize,
    ) -> Result<WeightRef<'a>, GpuError> {
        let row_bytes = format.row_bytes(k)?;
        let need = m
            .checked_mul(row_bytes)
            .and_then(|b| b.checked_add(offset))
            .unwrap_or(usize::MAX);
        if need > mem.byte_len() {
            return Err(GpuError::BufferTooSmall {
                what: "weight",
                need,
                got: mem.byte_len(),
            });
        }
        Ok(WeightRef {
            ptr: mem.device_ptr() + offset as u64,
            len: m * row_bytes,
            format,
            m,
            k,
            row_bytes,
            location: mem.location(),
            ctx: mem.context().clone(),
            _borrow: PhantomData,
        })
    }

    /// Builds a view from a raw device address.
    ///
    /// # Safety
    /// `ptr..ptr + m * format.row_bytes(k)` is device-addressable memory of `ctx` that stays
    /// allocated for as long as any launch using this view can run.
    pub unsafe fn from_raw(
        ctx: &Arc<Context>,
        ptr: u64,
        format: Format,
        m: usize,
        k: usize,
        location: WeightLocation,
    ) -> Result<WeightRef<'static>, GpuError> {
        let row_bytes = format.row_bytes(k)?;
        Ok(WeightRef {
            ptr,
            len: m * row_bytes,
            format,
            m,
            k,
            row_bytes,
            location,
            ctx: ctx.clone(),
            _borrow: PhantomData,
        })
    }

    /// Format.
    pub fn format(&self) -> Format {
        self.format
    }
    /// Rows.
    pub fn m(&self) -> usize {
        self.m
    }
    /// Columns.
    pub fn k(&self) -> usize {
        self.k
    }
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    /// Bytes of the whole matrix.
    pub fn byte_len(&self) -> usize {
        self.len
    }
    /// Where the bytes live.
    pub fn location(&self) -> WeightLocation {
        self.location
    }
    /// Device address of row 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// The context whose memory the weight is in.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

/// The activation `x` in the forms the kernels read: f32 (float formats) and int8 per 32 elements
/// with `(d, d·Σq)` (quantised formats, ggml's q8_1). Prepared once per GEMV with
/// [`GemvKernels::prepare`], shared by every row-range launch of that GEMV. It may hold several
/// columns (one per sequence of a batched step, [`Activation::with_columns`]): column c at offset
/// `c*k` in every array (`c*k/32` pairs of `(d, s)`).
#[derive(Debug)]
pub struct Activation {
    k: usize,
    cols: usize,
    xf: DeviceBuffer<f32>,
    qs: DeviceBuffer<i8>,
    ds: DeviceBuffer<f32>,
}

impl Activation {
    /// Device storage for an activation of `k` elements (`k` a multiple of 32): one column.
    pub fn new(ctx: &Arc<Context>, k: usize) -> Result<Activation, GpuError> {
        Activation::with_columns(ctx, k, 1)
    }
    /// Device storage for up to `cols` activation columns of `k` elements each (column c at
    /// offset c*k in every array). Errors if `k` is not a positive multiple of 32, `cols == 0`,
    /// or `cols * k` exceeds the quantiser's i32 index.
    pub fn with_columns(ctx: &Arc<Context>, k: usize, cols: usize) -> Result<Activation, GpuError> {
        if k == 0 || k % QX_BLOCK != 0 {
            return Err(GpuError::Unsupported {
                format: Format::F32,
                why: format!("activation length {k} is not a positive multiple of {QX_BLOCK}"),
            });
        }
        let n = activation_values(k, cols)?;
        Ok(Activation {
            k,
            cols,
            xf: ctx.alloc(n)?,
            qs: ctx.alloc(n)?,
            ds: ctx.alloc(2 * (n / QX_BLOCK))?,
        })
    }
    /// Elements per column.
    pub fn k(&self) -> usize {
        self.k
    }
    /// Columns this activation holds room for (1 for [`Activation::new`]).
    pub fn columns(&self) -> usize {
        self.cols
    }
    /// The int8 values (for tests and the CPU-side error bound): `columns() * k` values, column
    /// c at `c * k`.
    pub fn quantized(&self) -> &DeviceBuffer<i8> {
        &self.qs
    }
    /// `(d, d·Σq)` pairs, one per block of 32: `2 * columns() * k / 32` floats, column c at
    /// `2 * c * k / 32`.
    pub fn scales(&self) -> &DeviceBuffer<f32> {
        &self.ds
    }
}

/// Values `cols` columns of `k` hold, when at least one column and within the quantiser's i32
/// index (`k` a positive multiple of 32, checked by the caller).
fn activation_values(k: usize, cols: usize) -> Result<usize, GpuError> {
    if cols == 0 {
        return Err(GpuError::Invalid {
            what: "activation columns",
            rule: "an activation holds at least one column",
        });
    }
    k.checked_mul(cols)
        .filter(|&n| i32::try_from(n).is_ok())
        .ok_or(GpuError::Invalid {
            what: "activation columns",
            rule: "columns * k must fit the quantiser's i32 index",
        })
}

/// `cols` is a column count a launch over an activation of `have` columns may use: 1..=have.
fn check_columns(cols: usize, have: usize) -> Result<(), GpuError> {
    if cols == 0 {
        return Err(GpuError::Invalid {
            what: "cols",
            rule: "a multi-column launch needs at least one column",
        });
    }
    if cols > have {
        return Err(GpuError::Invalid {
            what: "cols",
            rule: "more columns than the activation holds (Activation::columns)",
        });
    }
    Ok(())
}

/// The f32 values a multi-column output of `cols` columns `ldy` apart must hold for a weight of
/// `m` rows, `(cols - 1) * ldy + m`, when `ldy >= m` and it fits in memory.
fn cols_y_floats(cols: usize, ldy: usize, m: usize) -> Result<usize, GpuError> {
    if ldy < m {
        return Err(GpuError::Invalid {
            what: "ldy",
            rule: "the output's column stride is at least the weight's rows",
        });
    }
    cols.saturating_sub(1)
        .checked_mul(ldy)
        .and_then(|v| v.checked_add(m))
        .filter(|v| v.checked_mul(4).is_some())
        .ok_or(GpuError::Invalid {
            what: "ldy",
            rule: "(cols - 1) * ldy + m f32 values must fit in memory",
        })
}

/// What [`GemvKernels::plan`] checked and worked out for one GEMV launch.
struct GemvPlan {
    /// Device address of the range's first row.
    base: u64,
    /// Load width in bytes (divides base and row stride).
    width: usize,
    /// Rows in the range.
    nrows: i32,
    /// Kernel blocks per row (`k / elems`).
    nblocks: i32,
}

/// Shape of the device-resident (HBM) kernel for Q4_K and Q6_K (kernels/gemv.cu `hf_gemv_dev_*`,
/// `HF_DEV_WARPS`, `HF_DEV_ROWS`, `HF_DEV_XREG`). It is used for weights in device memory whose rows
/// allow 16-byte loads, when the general shape has no k-split (its rows are then bit-identical to
/// the general kernel's, so host-mapped and device results stay equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceGemv {
    /// Most warps per thread block (fewer when there are few rows).
    pub warps: u32,
    /// Rows per warp.
    pub rows_per_warp: u32,
    /// The activation staged once per block in shared memory (else read from global memory one
    /// tile ahead, `HF_DEV_XREG`).
    pub x_in_shared: bool,
    /// Row ranges shorter than this take the general kernel instead (0: never).
    pub min_rows: u32,
}

/// Below this many rows the device-resident K-quant kernel loses to the general one: at m = 1024
/// (k = 4096) the general kernel read at 0.97 × HBM for Q4_K and Q6_K, `dev4x2s` at 0.85 / 0.76,
/// while from m = 4096 up `dev4x2s` won on every 8B shape (0.74–0.83 against 0.67–0.79;
/// docs/perf-checkpoints/2026-11-29-joins-vs-llamacpp-h200, kq_bench).
pub const DEV_MIN_ROWS: u32 = 2048;

impl DeviceGemv {
    /// `dev8x2s` (s: x in shared memory, r: x in registers).
    pub fn label(&self) -> String {
        let x = if self.x_in_shared { 's' } else { 'r' };
        format!("dev{}x{}{x}", self.warps, self.rows_per_warp)
    }
}

impl Default for DeviceGemv {
    /// 4 warps × 2 rows, x staged in shared memory, from [`DEV_MIN_ROWS`] rows: the best of five
    /// shapes compared on the H200 (docs/perf-checkpoints/2026-11-29-joins-vs-llamacpp-h200, kq_bench).
    fn default() -> Self {
        DeviceGemv {
            warps: 4,
            rows_per_warp: 2,
            x_in_shared: true,
            min_rows: DEV_MIN_ROWS,
        }
    }
}

/// Kernel-shape choices compiled into the GEMV module (kernels/gemv.cu `HF_WARPS`, `HF_ROWS`,
/// `HF_KSPLIT`, `HF_MINB`, and the device-resident kernel's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvConfig {
    /// Warps per thread block.
    pub warps: u32,
    /// Rows per warp group (the activation unit is loaded once and reused for each).
    pub rows_per_warp: u32,
    /// Warps that share one group of rows, splitting its tiles (divides `warps`).
    pub ksplit: u32,
    /// Minimum resident blocks per SM asked of the register allocator (`__launch_bounds__`).
    pub min_blocks: u32,
    /// The device-resident Q4_K/Q6_K kernel; `None`: device weights use the general kernel too.
    pub device: Option<DeviceGemv>,
    /// Multi-column launches over device-resident Q4_K and Q6_K weights on the tensor cores
    /// (CUDA, sm_80 and later; kernels/gemv.cu `gemv_<fmt>_<form>_mma<8|16>`) instead of the
    /// dp4a kernel, whose columns are bit-identical to one-column launches; these are within
    /// float rounding of them.
    pub tensor_cores: bool,
}

impl GemvConfig {
    /// Rows one thread block computes.
    pub fn rows_per_block(&self) -> u32 {
        self.rows_per_warp * (self.warps / self.ksplit.max(1))
    }
    /// `WxRxKxB:devWxR{s|r}` (or `WxRxKxB:nodev`), `:notc` appended without the tensor-core
    /// kernels, as on the bench's command line.
    pub fn label(&self) -> String {
        let dev = self.device.map_or("nodev".to_string(), |d| d.label());
        let tc = if self.tensor_cores { "" } else { ":notc" };
        format!(
            "{}x{}x{}x{}:{dev}{tc}",
            self.warps, self.rows_per_warp, self.ksplit, self.min_blocks
        )
    }
}

impl Default for GemvConfig {
    /// 4 warps x 2 rows, no k-split: the best of the shapes compared on the H200
    /// (docs/perf-checkpoints/2026-11-29-gpu-gemv: k-split and 8-warp or 1- and 4-row shapes were
    /// equal or slower for every format); the device-resident Q4_K/Q6_K kernel at its default.
    fn default() -> Self {
        GemvConfig {
            warps: 4,
            rows_per_warp: 2,
            ksplit: 1,
            min_blocks: 1,
            device: Some(DeviceGemv::default()),
            tensor_cores: true,
        }
    }
}

/// The GEMV kernels of every format, loaded for one context.
#[derive(Debug)]
pub struct GemvKernels {
    ctx: Arc<Context>,
    config: GemvConfig,
    gemv: HashMap<(Format, GemvForm, usize), Function>,
    /// The multi-column kernels (`gemv_<fmt>_<form>_v<width>_cols`).
    cols: HashMap<(Format, GemvForm, usize), Function>,
    /// The expert-ids kernels by format and load width (`gemv_<fmt>_plain_v<width>_ids`, [`ids`]).
    ids: HashMap<(Format, usize), Function>,
    /// The device-resident kernels (empty when the config has none or a k-split).
    dev: HashMap<(Format, GemvForm), Function>,
    /// The tensor-core multi-column kernels by format, form and column capacity (empty where the
    /// config turns them off or the module has none: HIP, CUDA before sm_80).
    mma: HashMap<(Format, GemvForm, usize), Function>,
    quantize: Function,
}

impl GemvKernels {
    /// Compiles (or loads from cache) and loads the GEMV module with the default shape.
    pub fn new(registry: &KernelRegistry) -> Result<GemvKernels, GpuError> {
        GemvKernels::with_config(registry, GemvConfig::default())
    }

    /// As [`GemvKernels::new`] with a chosen kernel shape (benchmarks compare shapes).
    pub fn with_config(
        registry: &KernelRegistry,
        config: GemvConfig,
    ) -> Result<GemvKernels, GpuError> {
        GemvKernels::with_options(registry, config, &[])
    }

    /// As [`GemvKernels::with_config`] plus extra compiler options (`-DNAME` experiments in benches).
    pub fn with_options(
        registry: &KernelRegistry,
        config: GemvConfig,
        extra: &[String],
    ) -> Result<GemvKernels, GpuError> {
        if config.warps == 0
            || config.rows_per_warp == 0
            || config.ksplit == 0
            || config.warps % config.ksplit != 0
            || config
                .device
                .is_some_and(|d| d.warps == 0 || d.rows_per_warp == 0 || d.warps > 32)
        {
            return Err(GpuError::Unsupported {
                format: Format::F32,
                why: format!(
                    "GEMV shape {} (ksplit must divide warps, all > 0, device warps <= 32)",
                    config.label()
                ),
            });
        }
        let mut options = vec![
            format!("-DHF_WARPS={}", config.warps),
            format!("-DHF_ROWS={}", config.rows_per_warp),
            format!("-DHF_KSPLIT={}", config.ksplit),
            format!("-DHF_MINB={}", config.min_blocks),
            format!("-DHF_MAX_COLS={GEMV_MAX_COLS}"),
        ];
        if let Some(d) = config.device {
            options.push(format!("-DHF_DEV_WARPS={}", d.warps));
            options.push(format!("-DHF_DEV_ROWS={}", d.rows_per_warp));
            if !d.x_in_shared {
                options.push("-DHF_DEV_XREG".to_string());
            }
        }
        options.extend(extra.iter().cloned());
        let module = registry.module(&GEMV_SOURCE, &options)?;
        let mut gemv = HashMap::new();
        let mut cols = HashMap::new();
        let mut ids = HashMap::new();
        for format in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
            for width in LOAD_WIDTHS {
                let name = format!("gemv_{}_plain_v{width}_ids", format.name());
                ids.insert((format, width), module.function(&name)?);
            }
            for form in [GemvForm::Plain, GemvForm::Residual] {
                for width in LOAD_WIDTHS {
                    let name = format!("gemv_{}_{}_v{width}", format.name(), form.name());
                    gemv.insert((format, form, width), module.function(&name)?);
                    let name = format!("{name}_cols");
                    cols.insert((format, form, width), module.function(&name)?);
                }
            }
        }
        let mut dev = HashMap::new();
        if config.device.is_some() && config.ksplit == 1 {
            for format in DEVICE_FORMATS {
                for form in [GemvForm::Plain, GemvForm::Residual] {
                    let name = format!("gemv_{}_{}_dev", format.name(), form.name());
                    dev.insert((format, form), module.function(&name)?);
                }
            }
        }
        let mut mma = HashMap::new();
        if config.tensor_cores {
            for format in MMA_FORMATS {
                for form in [GemvForm::Plain, GemvForm::Residual] {
                    for n in MMA_COLS {
                        // Compiled only for CUDA sm_80+ (kernels/gemv.cu guards them): elsewhere
                        // the multi-column launches keep the dp4a kernel.
                        let name = format!("gemv_{}_{}_mma{n}", format.name(), form.name());
                        if let Ok(f) = module.function(&name) {
                            mma.insert((format, form, n), f);
                        }
                    }
                }
            }
        }
        let quantize = module.function("quantize_x_q8")?;
        Ok(GemvKernels {
            ctx: registry.context().clone(),
            config,
            gemv,
            cols,
            ids,
            dev,
            mma,
            quantize,
        })
    }

    /// The shape compiled in.
    pub fn config(&self) -> GemvConfig {
        self.config
    }

    /// Whether multi-column launches over device-resident weights of `format` run on the tensor
    /// cores (a format that has them, the config asks for it and the device has the kernels).
    pub fn has_tensor_core_kernels(&self, format: Format) -> bool {
        MMA_COLS.into_iter().all(|n| {
            [GemvForm::Plain, GemvForm::Residual]
                .into_iter()
                .all(|form| self.mma.contains_key(&(format, form, n)))
        })
    }

    /// Queues the preparation of `act` from `x` (`act.k()` f32 values at the start of `x`): its
    /// column 0.
    pub fn prepare<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        act: &mut Activation,
    ) -> Result<(), GpuError> {
        self.quantize(stream, x, act, 1)
    }

    /// Queues the preparation of the first `cols` columns of `act` from `x` (`cols * act.k()`
    /// f32, column-major: column c is `x[c*k..(c+1)*k]`). Errors if `cols == 0` or
    /// `cols > act.columns()` or `x` is too small.
    pub fn prepare_cols<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        act: &mut Activation,
        cols: usize,
    ) -> Result<(), GpuError> {
        check_columns(cols, act.cols)?;
        self.quantize(stream, x, act, cols)
    }

    /// The quantiser over columns `0..cols` of `act` (`cols <= act.columns()`, checked by callers).
    fn quantize<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        act: &mut Activation,
        cols: usize,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(x.context(), "x")?;
        // cols * k fits in i32 (Activation::with_columns checked it for act.cols >= cols).
        let n = act.k * cols;
        let need = n * 4;
        if x.byte_len() < need {
            return Err(GpuError::BufferTooSmall {
                what: "x",
                need,
                got: x.byte_len(),
            });
        }
        if x.device_ptr() % 4 != 0 {
            return Err(GpuError::Misaligned {
                what: "x",
                align: 4,
            });
        }
        let mut px = x.device_ptr();
        let mut k = n as i32;
        let mut pq = act.qs.device_ptr();
        let mut pd = act.ds.device_ptr();
        let mut pf = act.xf.device_ptr();
        let mut params: [*mut c_void; 5] = [
            (&mut px as *mut u64).cast(),
            (&mut k as *mut i32).cast(),
            (&mut pq as *mut u64).cast(),
            (&mut pd as *mut u64).cast(),
            (&mut pf as *mut u64).cast(),
        ];
        let dims = LaunchDims {
            grid: (n as u32).div_ceil(QUANTIZE_THREADS),
            block: QUANTIZE_THREADS,
            shared_bytes: 0,
        };
        // SAFETY: kernel `quantize_x_q8(const float* x, int k, signed char* qs, float2* ds, float* xf)`:
        // five parameters of exactly these types, launched over n = cols * act.k values (k a
        // multiple of 32, so every warp's 32 values are one block of one column and column c's
        // blocks land at ds + c * k/32: the layout the multi-column GEMV reads). x holds n floats
        // (checked), qs n bytes, ds 2n/32 floats and xf n floats (allocated by
        // Activation::with_columns for act.cols >= cols columns); threads past n write nothing;
        // all buffers are owned by borrowed live objects whose Drop frees synchronously.
        unsafe {
            self.ctx
                .backend()
                .launch(self.quantize.raw(), dims, stream.raw(), &mut params)
        }
    }

    /// The checks every GEMV launch makes (contexts, row range, activation length, `y` of at
    /// least `y_floats` values and 4-byte aligned, the kernel's block multiple, i32 bounds, a
    /// load width that divides the rows' base and stride) and the launch geometry they give.
    fn plan<Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &Y,
        rows: RowRange,
        y_floats: usize,
    ) -> Result<GemvPlan, GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(&w.ctx, "weight")?;
        self.ctx.check_same(y.context(), "y")?;
        if rows.is_empty() || rows.end > w.m {
            return Err(GpuError::BadRowRange {
                start: rows.start,
                end: rows.end,
                m: w.m,
            });
        }
        if act.k != w.k {
            return Err(GpuError::ActivationMismatch {
                need: w.k,
                got: act.k,
            });
        }
        let y_need = y_floats.saturating_mul(4);
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
        let float = matches!(w.format, Format::F32 | Format::F16 | Format::BF16);
        let elems = if float {
            FLOAT_KERNEL_BLOCK
        } else {
            w.format.block_elems()
        };
        if w.k % elems != 0 {
            return Err(GpuError::Unsupported {
                format: w.format,
                why: format!("k = {} is not a multiple of {elems}", w.k),
            });
        }
        let (Ok(nrows), Ok(nblocks)) = (i32::try_from(rows.len()), i32::try_from(w.k / elems))
        else {
            return Err(GpuError::Unsupported {
                format: w.format,
                why: "more than 2^31 rows or blocks".into(),
            });
        };
        let base = w.ptr + (rows.start * w.row_bytes) as u64;
        let Some(width) = LOAD_WIDTHS
            .into_iter()
            .find(|&v| w.row_bytes % v == 0 && base % v as u64 == 0)
        else {
            return Err(GpuError::Misaligned {
                what: "weight rows (base and row stride)",
                align: 2,
            });
        };
        Ok(GemvPlan {
            base,
            width,
            nrows,
            nblocks,
        })
    }

    /// The general kernel's launch shape for `nrows` rows.
    fn general_dims(&self, nrows: i32) -> LaunchDims {
        LaunchDims {
            grid: (nrows as u32).div_ceil(self.config.rows_per_block()),
            block: self.config.warps * WARP,
            shared_bytes: 0,
        }
    }

    /// Queues `y[r] = W[r]·x` (plain) or `y[r] += W[r]·x` (residual) for `r` in `rows` only. `y`
    /// holds at least `w.m()` f32 values (indexed by absolute row); `x` is `act` from
    /// [`GemvKernels::prepare`] on the same stream (or one ordered before it).
    pub fn gemv<Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut Y,
        rows: RowRange,
        form: GemvForm,
    ) -> Result<(), GpuError> {
        let p = self.plan(stream, w, act, y, rows, w.m)?;
        let (f, dims) =
            match self.device_launch(w, form, p.width, p.nrows as u32, p.nblocks as usize) {
                Some(dev) => dev,
                None => {
                    let Some(f) = self.gemv.get(&(w.format, form, p.width)) else {
                        return Err(GpuError::Unsupported {
                            format: w.format,
                            why: "no GPU kernel".into(),
                        });
                    };
                    (f, self.general_dims(p.nrows))
                }
            };
        let mut pw = p.base;
        let mut prb = w.row_bytes as u64;
        let mut pq = act.qs.device_ptr();
        let mut pd = act.ds.device_ptr();
        let mut pf = act.xf.device_ptr();
        let mut py = y.device_ptr() + (rows.start * 4) as u64;
        let mut pn = p.nrows;
        let mut pb = p.nblocks;
        let mut params: [*mut c_void; 8] = [
            (&mut pw as *mut u64).cast(),
            (&mut prb as *mut u64).cast(),
            (&mut pq as *mut u64).cast(),
            (&mut pd as *mut u64).cast(),
            (&mut pf as *mut u64).cast(),
            (&mut py as *mut u64).cast(),
            (&mut pn as *mut i32).cast(),
            (&mut pb as *mut i32).cast(),
        ];
        // SAFETY: kernel `gemv_<fmt>_<form>_v<width>` or `gemv_<fmt>_<form>_dev` (width 16)
        // `(const u8* W, u64 row_bytes, const i8* qs, const float2* ds, const float* xf, float* y,
        // int nrows, int nblocks)`: eight parameters of these types. The `_dev` kernels index
        // shared memory below `shared_bytes`, sized by `device_launch` for this nblocks and block
        // (at most 48 KiB). The kernel reads rows [0, nrows) at W + i*row_bytes, i.e. bytes
        // [start*row_bytes, end*row_bytes) of the weight (end <= m and m*row_bytes bytes present,
        // checked in WeightRef::new); loads are `width` bytes wide and `width` divides both base and
        // row_bytes (checked in `plan`); it reads k = nblocks*elems activation values of column 0
        // (act.k == w.k, checked) and writes y[start..end] (y holds m floats, checked). All memory
        // is owned by borrowed live objects whose Drop frees synchronously.
        unsafe {
            self.ctx
                .backend()
                .launch(f.raw(), dims, stream.raw(), &mut params)
        }
    }

    /// Queues `y[c*ldy + r] = W[r]·x_c` (plain) or `+=` (residual) for `r` in `rows` and `c` in
    /// `0..cols`, reading each weight row once per group of [`GEMV_MAX_COLS`] columns. `y` holds
    /// at least `(cols-1)*ldy + w.m()` f32 (`ldy >= w.m()`); `act` was prepared by
    /// [`GemvKernels::prepare_cols`] with at least `cols` columns. `cols > GEMV_MAX_COLS` runs in
    /// groups; `cols == 1` is [`GemvKernels::gemv`] (the same kernels, so the same bits), and
    /// every other column count gives each column the bits `gemv` gives it alone (the
    /// multi-column kernel sums as the general kernel does, which the device-resident one
    /// matches) — except device-resident Q4_K and Q6_K rows with the tensor-core kernels
    /// ([`GemvConfig::tensor_cores`]), within float rounding of them.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_cols<Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut Y,
        ldy: usize,
        rows: RowRange,
        form: GemvForm,
        cols: usize,
    ) -> Result<(), GpuError> {
        check_columns(cols, act.cols)?;
        let y_floats = cols_y_floats(cols, ldy, w.m)?;
        if cols == 1 {
            return self.gemv(stream, w, act, y, rows, form);
        }
        let p = self.plan(stream, w, act, y, rows, y_floats)?;
        // Q4_K's kernel loads 16-byte block heads; Q6_K's (210-byte blocks) reads 2-byte aligned.
        let aligned = w.format != Format::Q4K || p.width == 16;
        if w.location == WeightLocation::Device
            && aligned
            && self.has_tensor_core_kernels(w.format)
            && cols.min(GEMV_MAX_COLS) >= mma_min_cols(w.format, p.nrows)
        {
            return self.gemv_cols_mma(stream, &p, w, act, y, ldy, rows, form, cols);
        }
        let Some(f) = self.cols.get(&(w.format, form, p.width)) else {
            return Err(GpuError::Unsupported {
                format: w.format,
                why: "no GPU kernel".into(),
            });
        };
        let dims = self.general_dims(p.nrows);
        for c0 in (0..cols).step_by(GEMV_MAX_COLS) {
            let ncols = (cols - c0).min(GEMV_MAX_COLS);
            let x_off = (c0 * act.k) as u64;
            let mut args = LaunchArgs::new()
                .ptr(p.base)
                .u64(w.row_bytes as u64)
                .ptr(act.qs.device_ptr() + x_off)
                .ptr(act.ds.device_ptr() + x_off / QX_BLOCK as u64 * 8)
                .ptr(act.xf.device_ptr() + x_off * 4)
                .u64(act.k as u64)
                .ptr(y.device_ptr() + ((c0 * ldy + rows.start) * 4) as u64)
                .u64(ldy as u64)
                .i32(p.nrows)
                .i32(p.nblocks)
                .i32(ncols as i32);
            let params = args.params()?;
            // SAFETY: kernel `gemv_<fmt>_<form>_v<width>_cols(const u8* W, u64 row_bytes,
            // const i8* qs, const float2* ds, const float* xf, u64 xstride, float* y, u64 ldy,
            // int nrows, int nblocks, int ncols)`: eleven parameters of these types, in order. It
            // reads rows [0, nrows) at W + i*row_bytes, i.e. bytes [start*row_bytes,
            // end*row_bytes) of the weight (end <= m, m*row_bytes bytes present: WeightRef::new),
            // with `width`-byte loads, `width` dividing base and row_bytes (checked in `plan`). It
            // reads activation columns c0..c0+ncols: k int8 and f32 and k/32 float2 each at
            // qs/xf + c*k and ds + c*k/32 (c0 + ncols <= cols <= act.cols, checked; the buffers
            // hold act.cols columns). It writes y[(c0+c)*ldy + start .. (c0+c)*ldy + end) for
            // c < ncols: at most (cols-1)*ldy + m floats, which y holds (checked in `plan`). All
            // memory is owned by borrowed live objects whose Drop frees synchronously.
            unsafe {
                self.ctx
                    .backend()
                    .launch(f.raw(), dims, stream.raw(), params)?;
            }
        }
        Ok(())
    }

    /// [`GemvKernels::gemv_cols`] on the tensor cores: device-resident Q4_K rows with 16-byte
    /// alignment or Q6_K rows (checked by the caller), `cols` ≥ 2, in groups of
    /// [`GEMV_MAX_COLS`] columns.
    #[allow(clippy::too_many_arguments)]
    fn gemv_cols_mma<Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        p: &GemvPlan,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut Y,
        ldy: usize,
        rows: RowRange,
        form: GemvForm,
        cols: usize,
    ) -> Result<(), GpuError> {
        let dims = LaunchDims {
            grid: (p.nrows as u32).div_ceil(MMA_ROWS),
            block: MMA_WARPS * WARP,
            shared_bytes: 0,
        };
        for c0 in (0..cols).step_by(GEMV_MAX_COLS) {
            let ncols = (cols - c0).min(GEMV_MAX_COLS);
            let Some(f) = MMA_COLS
                .into_iter()
                .find(|&n| ncols <= n)
                .and_then(|n| self.mma.get(&(w.format, form, n)))
            else {
                return Err(GpuError::Unsupported {
                    format: w.format,
                    why: format!("no tensor-core kernel for {ncols} columns"),
                });
            };
            let x_off = (c0 * act.k) as u64;
            let mut args = LaunchArgs::new()
                .ptr(p.base)
                .u64(w.row_bytes as u64)
                .ptr(act.qs.device_ptr() + x_off)
                .ptr(act.ds.device_ptr() + x_off / QX_BLOCK as u64 * 8)
                .u64(act.k as u64)
                .ptr(y.device_ptr() + ((c0 * ldy + rows.start) * 4) as u64)
                .u64(ldy as u64)
                .i32(p.nrows)
                .i32(p.nblocks)
                .i32(ncols as i32);
            let params = args.params()?;
            // SAFETY: kernel `gemv_<q4_k|q6_k>_<form>_mma<8|16>(const u8* W, u64 row_bytes, const
            // i8* qs, const float2* ds, u64 xstride, float* y, u64 ldy, int nrows, int nblocks,
            // int ncols)`: ten parameters of these types, in order, ncols within the kernel's 8
            // or 16. It reads rows [0, nrows) of the format's blocks at W + i*row_bytes (Q4_K:
            // 16-byte loads of each 144-byte block's head and 8-byte loads of its quants, base and
            // row_bytes 16-byte aligned, `plan` chose width 16; Q6_K: 2-byte and aligned 4-byte
            // loads within each 210-byte block), bytes [start*row_bytes, end*row_bytes) of the
            // weight (end <= m: WeightRef::new and `plan`). It reads activation columns
            // c0..c0+ncols (k int8 and k/32 float2 each at qs + c*k and ds + c*k/32, c0 + ncols <=
            // cols <= act.cols, checked) and writes y[(c0+c)*ldy + start .. (c0+c)*ldy + end) for
            // c < ncols, within the (cols-1)*ldy + m floats `plan` checked y holds. All memory is
            // owned by borrowed live objects whose Drop frees synchronously.
            unsafe {
                self.ctx
                    .backend()
                    .launch(f.raw(), dims, stream.raw(), params)?;
            }
        }
        Ok(())
    }

    /// The device-resident kernel and its launch shape for this GEMV, when it applies: weights in
    /// device memory, a format that has one, 16-byte loads, and its shared memory within 48 KiB.
    /// Blocks shrink (fewer warps) when there are few rows, so that the grid still covers the GPU.
    fn device_launch(
        &self,
        w: &WeightRef<'_>,
        form: GemvForm,
        width: usize,
        nrows: u32,
        nblocks: usize,
    ) -> Option<(&Function, LaunchDims)> {
        let d = self.config.device?;
        if w.location != WeightLocation::Device || width != 16 || nrows < d.min_rows {
            return None;
        }
        let f = self.dev.get(&(w.format, form))?;
        let x_bytes = if d.x_in_shared {
            nblocks * DEV_X_BYTES_PER_BLOCK
        } else {
            0
        };
        let per_warp = if w.format == Format::Q6K {
            d.rows_per_warp as usize * DEV_Q6K_TILE_BYTES
        } else {
            0
        };
        let sms = self.ctx.info().multiprocessors.max(1);
        let mut warps = nrows
            .div_ceil(d.rows_per_warp * DEV_BLOCKS_PER_SM * sms)
            .clamp(1, d.warps);
        while x_bytes + warps as usize * per_warp > MAX_DYNAMIC_SHARED {
            warps -= 1;
            if warps == 0 {
                return None;
            }
        }
        let dims = LaunchDims {
            grid: nrows.div_ceil(warps * d.rows_per_warp),
            block: warps * WARP,
            shared_bytes: (x_bytes + warps as usize * per_warp) as u32,
        };
        Some((f, dims))
    }
}

/// The read-bandwidth kernel: reads a buffer once with 16-byte loads (the ceiling GEMVs are measured against).
#[derive(Debug)]
pub struct ReadKernel {
    ctx: Arc<Context>,
    f: Function,
    sink: DeviceBuffer<u32>,
}

impl ReadKernel {
    /// Loads the read kernel.
    pub fn new(registry: &KernelRegistry) -> Result<ReadKernel, GpuError> {
        let module = registry.module(&READ_SOURCE, &[])?;
        let ctx = registry.context().clone();
        Ok(ReadKernel {
            f: module.function("read_sum")?,
            sink: ctx.alloc(1)?,
            ctx,
        })
    }

    /// Queues a read of `mem[offset..offset + bytes]` (16-byte aligned start; a tail of fewer
    /// than 16 bytes is not read).
    pub fn read_at<M: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        mem: &M,
        offset: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(mem.context(), "buffer")?;
        self.ctx.check_same(stream.context(), "stream")?;
        let end = offset.saturating_add(bytes);
        if end > mem.byte_len() {
            return Err(GpuError::BufferTooSmall {
                what: "read",
                need: end,
                got: mem.byte_len(),
            });
        }
        let base = mem.device_ptr() + offset as u64;
        if base % 16 != 0 {
            return Err(GpuError::Misaligned {
                what: "read buffer",
                align: 16,
            });
        }
        let grid = self.ctx.info().multiprocessors * READ_BLOCKS_PER_SM;
        // SAFETY: 16-aligned (checked) and `bytes` (rounded down to 16) lie inside `mem`
        // (checked), which the caller's borrow keeps allocated while the launch is queued.
        unsafe { self.launch(stream, base, (bytes / 16) as u64, grid) }
    }

    /// # Safety
    /// `[base, base + 16 n16)` is device-addressable memory of this context, 16-aligned, that
    /// stays allocated until the launch has run on `stream`.
    unsafe fn launch(
        &self,
        stream: &Stream,
        base: u64,
        n16: u64,
        grid: u32,
    ) -> Result<(), GpuError> {
        let mut p = base;
        let mut n16 = n16;
        let mut out = self.sink.device_ptr();
        let mut params: [*mut c_void; 3] = [
            (&mut p as *mut u64).cast(),
            (&mut n16 as *mut u64).cast(),
            (&mut out as *mut u64).cast(),
        ];
        let dims = LaunchDims {
            grid,
            block: READ_THREADS,
            shared_bytes: 0,
        };
        // SAFETY: kernel `read_sum(const uint4* p, u64 n16, unsigned* out)`: reads n16 16-byte
        // words from p (the caller's duty) and may write one u32 to the sink, owned by self.
        unsafe {
            self.ctx
                .backend()
                .launch(self.f.raw(), dims, stream.raw(), &mut params)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_cores_take_launches_from_the_measured_column_counts() {
        // Large matrices: Q4_K from 2 columns, Q6_K from 4; under 2048 rows both from 8.
        assert_eq!(mma_min_cols(Format::Q4K, 4096), 2);
        assert_eq!(mma_min_cols(Format::Q6K, 4096), 4);
        assert_eq!(mma_min_cols(Format::Q4K, MMA_FULL_ROWS), 2);
        assert_eq!(mma_min_cols(Format::Q4K, MMA_FULL_ROWS - 1), 8);
        assert_eq!(mma_min_cols(Format::Q6K, 1024), 8);
        // Every threshold is a column count one launch can carry.
        for rows in [1, 1024, 2048, 14336] {
            for f in MMA_FORMATS {
                assert!((2..=GEMV_MAX_COLS).contains(&mma_min_cols(f, rows)));
            }
        }
    }

    #[test]
    fn column_counts_outside_one_to_the_activations_are_refused() {
        assert!(matches!(
            check_columns(0, 4),
            Err(GpuError::Invalid { what: "cols", .. })
        ));
        assert!(matches!(
            check_columns(5, 4),
            Err(GpuError::Invalid { what: "cols", .. })
        ));
        for cols in 1..=4 {
            assert!(check_columns(cols, 4).is_ok(), "{cols} of 4");
        }
    }

    #[test]
    fn activation_columns_are_bounded_by_the_quantisers_index() {
        assert!(matches!(
            activation_values(256, 0),
            Err(GpuError::Invalid {
                what: "activation columns",
                ..
            })
        ));
        assert_eq!(activation_values(4096, 16).ok(), Some(65536));
        // The quantiser indexes cols * k values with an i32: the largest column count that fits.
        let k = 4096;
        let most = i32::MAX as usize / k;
        assert_eq!(activation_values(k, most).ok(), Some(most * k));
        assert!(activation_values(k, most + 1).is_err());
        assert!(activation_values(k, usize::MAX).is_err());
    }

    #[test]
    fn multi_column_output_size_is_the_last_columns_end() {
        assert_eq!(cols_y_floats(1, 1000, 1000).ok(), Some(1000));
        assert_eq!(cols_y_floats(3, 1013, 1000).ok(), Some(2 * 1013 + 1000));
        assert_eq!(cols_y_floats(16, 1000, 1000).ok(), Some(16 * 1000));
        assert!(matches!(
            cols_y_floats(2, 999, 1000),
            Err(GpuError::Invalid { what: "ldy", .. })
        ));
        assert!(cols_y_floats(3, usize::MAX / 2, 10).is_err());
        assert!(
            cols_y_floats(2, usize::MAX / 4, 10).is_err(),
            "bytes overflow"
        );
    }
}
