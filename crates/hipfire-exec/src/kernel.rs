//! The one place this crate names the CPU row dot (hipfire-quant's contract), so a change of
//! that contract touches one file.

pub use hipfire_quant::{gemv_rows, ActivationBuf};

/// Test helpers.
#[cfg(test)]
pub(crate) mod test_support {
    use hipfire_quant::Format;

    /// Bytes of `row` in `fmt` (hipfire-quant's quantiser; f32 rows as raw bytes).
    pub(crate) fn encode_row(fmt: Format, row: &[f32]) -> Vec<u8> {
        hipfire_quant::quantize_row(fmt, row).expect("test rows are finite and k-aligned")
    }
}
