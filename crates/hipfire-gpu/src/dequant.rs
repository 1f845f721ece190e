//! The operands of the batched prefill's f16 GEMM: weight rows of every GEMV format dequantised
//! to row-major f16, and the activation converted from f32 to f16 (`kernels/dequant.cu`).
//!
//! Each weight value is the CPU dequantiser's f32 ([`hipfire_quant::dequantize_row`]: same
//! formula, same operation order, no FMA contraction) rounded to f16 to nearest, ties to even, so
//! the output is bit-identical to `half::f16::from_f32` of the CPU's value; values beyond f16's
//! range (possible only for F32 and BF16 weights) become ±inf, as `__float2half_rn` makes them.
//!
//! As with the GEMV, a row range is a pointer offset: rows `[a, b)` start at `W + a·row_bytes`,
//! and the kernel writes `b − a` rows of `k` f16 values at the start of the output, so a caller can
//! dequantise a slice of a matrix into a scratch buffer sized for the slice. The host side owns
//! the preconditions (range within `m`, output size and alignment, the weight's alignment) and
//! reports them as [`GpuError`]s; the kernel only reads a device address, so weights in device
//! memory and in host-mapped (pinned) memory are both read in place.

use crate::backend::LaunchDims;
use crate::context::{Context, DeviceMemory, Function, Stream};
use crate::gemv::{RowRange, WeightRef};
use crate::registry::{KernelRegistry, DEQUANT_SOURCE};
use crate::GpuError;
use hipfire_quant::Format;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// Threads per block of both kernels (kernels/dequant.cu `HF_DQ_THREADS`, 8 warps).
pub const DEQUANT_THREADS: u32 = 256;
/// Outputs each thread makes: one 16-byte store of f16 (kernels/dequant.cu `HF_DQ_CHUNK`). `k`
/// must be a multiple of it (every block format's block is; F32/F16/BF16 rows are checked).
pub const DEQUANT_CHUNK: usize = 8;
/// Bytes of one f16 value.
const F16_BYTES: usize = 2;
/// Bytes of one f32 value.
const F32_BYTES: usize = 4;
/// The dequantiser's 16-byte stores need a 16-byte aligned output (device allocations are).
const OUT_ALIGN: usize = 16;
/// Largest grid the launches use: CUDA's limit on `gridDim.x` is 2^31 − 1.
const MAX_GRID: u64 = i32::MAX as u64;

/// The kernel name for `format` (`dequant_<format name>`).
pub fn dequant_kernel_name(format: Format) -> String {
    format!("dequant_{}", format.name())
}

/// Alignment the dequantiser needs of a weight's row base and row stride: its f32 fields (F32,
/// HFQ4G256) are read with 32-bit loads, every other field with 16-bit loads.
pub const fn weight_align(format: Format) -> usize {
    match format {
        Format::F32 | Format::Hfq4G256 => 4,
        _ => 2,
    }
}

/// Bytes of the f16 output of `rows` rows of `k` values, `None` on overflow.
pub fn dequant_out_bytes(rows: usize, k: usize) -> Option<usize> {
    rows.checked_mul(k)?.checked_mul(F16_BYTES)
}

/// Bytes spanned by `rows` rows of `k` f16 values `stride` values apart, `None` on overflow.
fn strided_out_bytes(rows: usize, k: usize, stride: usize) -> Option<usize> {
    let last = rows.checked_sub(1)?.checked_mul(stride)?;
    last.checked_add(k)?.checked_mul(F16_BYTES)
}

/// The dequantise and convert kernels, loaded for one context.
#[derive(Debug)]
pub struct DequantKernels {
    ctx: Arc<Context>,
    dequant: HashMap<Format, Function>,
    convert: Function,
}

impl DequantKernels {
    /// Compiles (or loads from the cache) and loads `kernels/dequant.cu`: one kernel per format
    /// the GEMV supports ([`Format::has_gpu_kernel`]) and the f32 → f16 conversion.
    pub fn new(registry: &KernelRegistry) -> Result<DequantKernels, GpuError> {
        let module = registry.module(&DEQUANT_SOURCE, &[])?;
        let mut dequant = HashMap::new();
        for format in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
            dequant.insert(format, module.function(&dequant_kernel_name(format))?);
        }
        Ok(DequantKernels {
            ctx: registry.context().clone(),
            dequant,
            convert: module.function("convert_f32_to_f16")?,
        })
    }

    /// Queues the dequantisation of rows `[rows.start, rows.end)` of `w` into `out` as row-major
    /// f16 bit patterns: row `rows.start + r` at `out[r·k .. (r+1)·k]` (`k = w.k()`), so `out`
    /// holds at least `rows.len() · k · 2` bytes and nothing past that is written.
    ///
    /// Errors: a range that is empty or ends past `w.m()` ([`GpuError::BadRowRange`]); `out` too
    /// small ([`GpuError::BufferTooSmall`]); `out` not 16-byte aligned, or the weight's row base
    /// or row stride not aligned as [`weight_align`] says ([`GpuError::Misaligned`]); a float
    /// format with `k` not a multiple of [`DEQUANT_CHUNK`], a format without a kernel or a shape
    /// past the launch limits ([`GpuError::Unsupported`]); objects of another context.
    pub fn dequant_rows<O: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        rows: RowRange,
        out: &mut O,
    ) -> Result<(), GpuError> {
        self.dequant_rows_strided(stream, w, rows, out, w.k())
    }

    /// As [`DequantKernels::dequant_rows`], with row `rows.start + r` at
    /// `out[r·out_row_stride ..][..k]` (f16 values), e.g. into a wider matrix or one with padded
    /// rows; the values between rows are not written. `out` holds at least
    /// `((rows.len() − 1)·out_row_stride + k)·2` bytes.
    ///
    /// Errors: as `dequant_rows`, and `out_row_stride < k` ([`GpuError::Invalid`]) or not a
    /// multiple of 8 values (16 bytes, [`GpuError::Misaligned`]).
    pub fn dequant_rows_strided<O: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        rows: RowRange,
        out: &mut O,
        out_row_stride: usize,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(w.context(), "weight")?;
        self.ctx.check_same(out.context(), "out")?;
        let format = w.format();
        if rows.is_empty() || rows.end > w.m() {
            return Err(GpuError::BadRowRange {
                start: rows.start,
                end: rows.end,
                m: w.m(),
            });
        }
        let k = w.k();
        if k % DEQUANT_CHUNK != 0 {
            return Err(GpuError::Unsupported {
                format,
                why: format!("k = {k} is not a multiple of {DEQUANT_CHUNK}"),
            });
        }
        let Some(f) = self.dequant.get(&format) else {
            return Err(GpuError::Unsupported {
                format,
                why: "no dequantise kernel".into(),
            });
        };
        if out_row_stride < k {
            return Err(GpuError::Invalid {
                what: "out_row_stride",
                rule: "at least k (rows must not overlap)",
            });
        }
        if out_row_stride % DEQUANT_CHUNK != 0 {
            return Err(GpuError::Misaligned {
                what: "out row stride",
                align: OUT_ALIGN,
            });
        }
        let need = strided_out_bytes(rows.len(), k, out_row_stride).unwrap_or(usize::MAX);
        if out.byte_len() < need {
            return Err(GpuError::BufferTooSmall {
                what: "dequantised rows",
                need,
                got: out.byte_len(),
            });
        }
        if out.device_ptr() % OUT_ALIGN as u64 != 0 {
            return Err(GpuError::Misaligned {
                what: "dequantised rows",
                align: OUT_ALIGN,
            });
        }
        let align = weight_align(format);
        // rows.start < m, and m * row_bytes bytes exist (WeightRef), so this cannot overflow.
        let base = w.device_ptr() + (rows.start * w.row_bytes()) as u64;
        if base % align as u64 != 0 || w.row_bytes() % align != 0 {
            return Err(GpuError::Misaligned {
                what: "weight rows (base and row stride)",
                align,
            });
        }
        let chunks_per_row = (k / DEQUANT_CHUNK) as u64;
        let blocks_per_row = chunks_per_row.div_ceil(u64::from(DEQUANT_THREADS));
        let grid = blocks_per_row.saturating_mul(rows.len() as u64);
        let (Ok(pk), Ok(prows), true) = (
            i32::try_from(k),
            i32::try_from(rows.len()),
            grid <= MAX_GRID,
        ) else {
            return Err(GpuError::Unsupported {
                format,
                why: format!(
                    "{} rows of k = {k} exceed the launch limits (k and rows < 2^31, 2^31 − 1 blocks)",
                    rows.len()
                ),
            });
        };
        let mut pw = base;
        let mut prb = w.row_bytes() as u64;
        let mut pk = pk;
        let mut prows = prows;
        let mut pout = out.device_ptr();
        let mut pstride = out_row_stride as u64;
        let mut params: [*mut c_void; 6] = [
            (&mut pw as *mut u64).cast(),
            (&mut prb as *mut u64).cast(),
            (&mut pk as *mut i32).cast(),
            (&mut prows as *mut i32).cast(),
            (&mut pout as *mut u64).cast(),
            (&mut pstride as *mut u64).cast(),
        ];
        // SAFETY: kernel `dequant_<fmt>(const u8* W, u64 row_bytes, int k, int rows, u16* out,
        // u64 out_row_stride)`: six parameters of exactly these types. It reads rows [0, rows) at
        // W + r*row_bytes, i.e. bytes [start*row_bytes, end*row_bytes) of the weight (end <= m and
        // m*row_bytes bytes present, checked by WeightRef), with loads of at most `align` bytes at
        // offsets that are multiples of it inside each block (base and row_bytes aligned, checked);
        // it writes k f16 values at out + r*out_row_stride for each r < rows (out holds
        // ((rows-1)*stride + k)*2 bytes, is 16-byte aligned, k and stride multiples of 8: checked),
        // threads past the shape write nothing. All memory is owned by borrowed live objects whose
        // Drop frees synchronously.
        unsafe { self.launch(f, grid, stream, &mut params) }
    }

    /// Queues `y[i] = f16(x[i])` for `i < n` (f16 bit patterns, round to nearest even, values
    /// beyond f16's range to ±inf). `n == 0` queues nothing.
    ///
    /// Errors: `x` shorter than `n` f32 values or `y` than `n` f16 values
    /// ([`GpuError::BufferTooSmall`]); `x` not 4- or `y` not 2-byte aligned
    /// ([`GpuError::Misaligned`]; 16-byte aligned pointers take the vector path); `n` past the
    /// launch limit ([`GpuError::Invalid`]); objects of another context.
    pub fn convert_f32_to_f16<X: DeviceMemory + ?Sized, Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        y: &mut Y,
        n: usize,
    ) -> Result<(), GpuError> {
        self.ctx.check_same(stream.context(), "stream")?;
        self.ctx.check_same(x.context(), "x")?;
        self.ctx.check_same(y.context(), "y")?;
        for (what, mem_len, elem) in [
            ("x", x.byte_len(), F32_BYTES),
            ("y", y.byte_len(), F16_BYTES),
        ] {
            let need = n.saturating_mul(elem);
            if mem_len < need {
                return Err(GpuError::BufferTooSmall {
                    what,
                    need,
                    got: mem_len,
                });
            }
        }
        for (what, ptr, align) in [
            ("x", x.device_ptr(), F32_BYTES),
            ("y", y.device_ptr(), F16_BYTES),
        ] {
            if ptr % align as u64 != 0 {
                return Err(GpuError::Misaligned { what, align });
            }
        }
        if n == 0 {
            return Ok(());
        }
        let grid = (n as u64)
            .div_ceil(DEQUANT_CHUNK as u64)
            .div_ceil(u64::from(DEQUANT_THREADS));
        if grid > MAX_GRID {
            return Err(GpuError::Invalid {
                what: "n",
                rule: "at most (2^31 - 1) * 2048 values per conversion",
            });
        }
        let mut px = x.device_ptr();
        let mut py = y.device_ptr();
        let mut pn = n as u64;
        let mut params: [*mut c_void; 3] = [
            (&mut px as *mut u64).cast(),
            (&mut py as *mut u64).cast(),
            (&mut pn as *mut u64).cast(),
        ];
        // SAFETY: kernel `convert_f32_to_f16(const float* x, u16* y, u64 n)`: three parameters of
        // these types. It reads x[0..n] and writes y[0..n] (both hold n values, checked), with
        // 16-byte accesses only where both pointers are 16-byte aligned and elementwise (4- and
        // 2-byte aligned, checked) otherwise; threads past n do nothing. Both buffers are owned by
        // borrowed live objects whose Drop frees synchronously.
        unsafe { self.launch(&self.convert, grid, stream, &mut params) }
    }

    /// Launches `f` over `grid` blocks of [`DEQUANT_THREADS`] threads (`grid <= MAX_GRID`).
    ///
    /// # Safety
    /// `params` are the kernel's parameters (one pointer to a value of each parameter's exact
    /// type), and every address among them is valid for what the kernel reads and writes with
    /// this grid until the launch has run on `stream`.
    unsafe fn launch(
        &self,
        f: &Function,
        grid: u64,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        debug_assert!(grid <= MAX_GRID);
        let dims = LaunchDims {
            grid: grid as u32,
            block: DEQUANT_THREADS,
            shared_bytes: 0,
        };
        // SAFETY: the caller's duty (above).
        unsafe {
            self.ctx
                .backend()
                .launch(f.raw(), dims, stream.raw(), params)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_format_fits_the_dequantiser_geometry() {
        for f in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
            let block = f.block_elems();
            // A block format's block is whole 8-output chunks; float formats are checked per k.
            assert!(
                block == 1 || block % DEQUANT_CHUNK == 0,
                "{f}: block of {block}"
            );
            // Block bytes keep the loads aligned from one block to the next.
            assert!(
                f.block_bytes() % weight_align(f) == 0 || block == 1,
                "{f}: {} bytes per block, {} alignment",
                f.block_bytes(),
                weight_align(f)
            );
            assert_eq!(dequant_kernel_name(f), format!("dequant_{}", f.name()));
        }
        assert_eq!(dequant_out_bytes(3, 8), Some(48));
        assert_eq!(dequant_out_bytes(usize::MAX, 2), None);
        // Three rows of 8 values 24 apart: two strides and one row.
        assert_eq!(strided_out_bytes(3, 8, 24), Some((2 * 24 + 8) * 2));
        assert_eq!(strided_out_bytes(1, 8, 1 << 40), Some(16));
        assert_eq!(strided_out_bytes(0, 8, 8), None);
    }
}
