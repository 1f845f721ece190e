//! The one place this crate calls the CPU row dot.
//!
//! TEMPORARY shim: hipfire-quant's `ActivationBuf` / `gemv_rows` (the contract in its
//! `lib.rs`) have not landed yet. Until they do, this module implements the same signatures
//! for `Format::F32` only (every other format returns `QuantError::UnknownGgmlType`), so the
//! pool, the planner and their tests compile and run. When the functions land this module
//! becomes two `pub use` lines.

use hipfire_quant::{Format, QuantError};

/// The activation prepared once per GEMV (shim: the f32 vector itself).
#[derive(Debug, Clone)]
pub struct ActivationBuf {
    fmt: Format,
    x: Vec<f32>,
}

impl ActivationBuf {
    /// Prepare `x` for `fmt`'s row dot.
    pub fn prepare(fmt: Format, x: &[f32]) -> Result<ActivationBuf, QuantError> {
        fmt.row_bytes(x.len())?;
        Ok(ActivationBuf { fmt, x: x.to_vec() })
    }
}

/// `y[i] (+)= row_i · x` over contiguous rows of `w_rows`.
pub fn gemv_rows(
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    act: &ActivationBuf,
    y: &mut [f32],
    accumulate: bool,
) -> Result<(), QuantError> {
    if fmt != Format::F32 || act.fmt != fmt {
        return Err(QuantError::UnknownGgmlType(u32::MAX));
    }
    let rb = fmt.row_bytes(k)?;
    if w_rows.len() < y.len() * rb {
        return Err(QuantError::ShortBuffer {
            what: "w_rows",
            need: y.len() * rb,
            got: w_rows.len(),
        });
    }
    for (i, yi) in y.iter_mut().enumerate() {
        let row = &w_rows[i * rb..(i + 1) * rb];
        let mut acc = 0f32;
        for (c, xv) in row.chunks_exact(4).zip(&act.x) {
            acc += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * xv;
        }
        if accumulate {
            *yi += acc;
        } else {
            *yi = acc;
        }
    }
    Ok(())
}

/// Whether `fmt` has a vectorised CPU row dot (shim: unknown until hipfire-quant lands, so no).
#[allow(dead_code)] // used by the refusal rules once they are wired
pub fn has_cpu_simd(_fmt: Format) -> bool {
    false
}

/// Test helpers: encode a row of f32 in a format (shim: F32 only).
#[cfg(test)]
pub(crate) mod test_support {
    use hipfire_quant::Format;

    /// Bytes of `row` in `fmt`.
    pub(crate) fn encode_row(fmt: Format, row: &[f32]) -> Vec<u8> {
        assert_eq!(fmt, Format::F32, "shim encodes f32 only");
        row.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}
