//! The dense GEMM of batched steps (prefill): f16 weights × f16 activations into f32, on the vendor
//! BLAS (cuBLAS's tensor-core `GemmEx` on CUDA).
//!
//! A quantised weight is first expanded to f16 rows by the dequantisation kernels (one layer's
//! matrix at a time, into a scratch the caller owns), as llama.cpp's cuBLAS path does for batches;
//! the GEMM reads that scratch. Row-major throughout: the model's `[rows][k]` weights and
//! `[tokens][width]` activations are used as they lie.

use crate::backend::GemmF16;
use crate::context::{DeviceMemory, Stream};
use crate::GpuError;

/// Bytes of an f16 element.
const F16_BYTES: usize = 2;
/// Bytes of an f32 element.
const F32_BYTES: usize = 4;

/// Shape of one GEMM: `y[t][r] (+)= w[r]·x[t]` for `t < n` tokens and `r < m` rows over `k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of the weight (output width).
    pub m: usize,
    /// Tokens.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// Elements between rows of `y` (≥ `m`; larger when `y` is a column slice of a wider row).
    pub ldy: usize,
}

/// Queues `y (+)= w · xᵀ` on `stream`: `w` f16 `[m][k]`, `x` f16 `[n][k]`, `y` f32 `[n][ldy]`.
/// Checks every extent and the context before the backend sees an address.
pub fn gemm_f16<W, X, Y>(
    stream: &Stream,
    w: &W,
    x: &X,
    y: &mut Y,
    shape: GemmShape,
    accumulate: bool,
) -> Result<(), GpuError>
where
    W: DeviceMemory + ?Sized,
    X: DeviceMemory + ?Sized,
    Y: DeviceMemory + ?Sized,
{
    let GemmShape { m, n, k, ldy } = shape;
    if m == 0 || n == 0 || k == 0 {
        return Err(GpuError::Invalid {
            what: "GEMM shape",
            rule: "m, n and k must be positive",
        });
    }
    if ldy < m {
        return Err(GpuError::Invalid {
            what: "GEMM ldy",
            rule: "must be at least m",
        });
    }
    let ctx = stream.context();
    ctx.check_same(w.context(), "GEMM weight")?;
    ctx.check_same(x.context(), "GEMM activation")?;
    ctx.check_same(y.context(), "GEMM output")?;
    let need = |what: &'static str, need: Option<usize>, got: usize| match need {
        Some(n) if n <= got => Ok(()),
        Some(n) => Err(GpuError::BufferTooSmall { what, need: n, got }),
        None => Err(GpuError::Invalid {
            what,
            rule: "extent overflows usize",
        }),
    };
    let elems = |a: usize, b: usize, bytes: usize| a.checked_mul(b)?.checked_mul(bytes);
    need("GEMM weight (f16)", elems(m, k, F16_BYTES), w.byte_len())?;
    need(
        "GEMM activation (f16)",
        elems(n, k, F16_BYTES),
        x.byte_len(),
    )?;
    // The last row of y needs only m elements.
    let y_need = (n - 1)
        .checked_mul(ldy)
        .and_then(|e| e.checked_add(m))
        .and_then(|e| e.checked_mul(F32_BYTES));
    need("GEMM output (f32)", y_need, y.byte_len())?;
    let g = GemmF16 {
        m,
        n,
        k,
        w: w.device_ptr(),
        x: x.device_ptr(),
        y: y.device_ptr(),
        ldy,
        accumulate,
    };
    // SAFETY: the three extents were checked against the buffers above, all on this stream's
    // context; the caller keeps the buffers alive until the stream passes the GEMM (as for every
    // queued launch in this crate).
    unsafe { ctx.backend().gemm_f16(stream.raw(), &g) }
}

/// Whether this context can run [`gemm_f16`] (its BLAS library loads).
pub fn gemm_available(stream: &Stream) -> bool {
    stream.context().backend().has_gemm()
}
