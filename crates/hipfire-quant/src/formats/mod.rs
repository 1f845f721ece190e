//! Block formats: exact byte layouts, reference dequantisers and quantisers.
//!
//! Each format is a zero-sized type implementing [`BlockFormat`], the way candle's `GgmlType`
//! describes a block: geometry as associated consts, per-block dequantise (f32 and f64) and
//! quantise. Block structs are `#[repr(C)]` with byte-array fields only (alignment 1, every
//! bit pattern valid), so a row of GGUF bytes maps onto them in place and the size asserts pin
//! the layout at compile time.

use crate::Format;

pub mod float;
pub mod hfq;
pub mod iq4;
pub mod kquant;
pub mod kquant_low;
pub mod legacy;
pub mod mxfp4;

/// One block format: geometry plus reference per-block conversions.
///
/// Callers pass exactly `BLOCK_BYTES` bytes and `BLOCK_ELEMS` values; the public
/// row functions in the crate root check lengths before calling these.
pub trait BlockFormat {
    /// The type-erased id.
    const FORMAT: Format;
    /// Elements per block.
    const BLOCK_ELEMS: usize;
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// Dequantise one block to f32 with the same operation order as ggml / gguf-py,
    /// so results agree bit for bit.
    fn dequantize_block(block: &[u8], out: &mut [f32]);
    /// Dequantise one block in f64 (the independent test reference).
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]);
    /// Quantise one block of finite values (ggml's `quantize_row_*_ref`).
    fn quantize_block(src: &[f32], out: &mut [u8]);
}

/// f16 bits → f32.
#[inline]
pub(crate) fn f16_to_f32(bits: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(bits)).to_f32()
}

/// f32 → f16 bits, round to nearest even (what ggml's `GGML_FP32_TO_FP16` and numpy do).
#[inline]
pub(crate) fn f32_to_f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// ggml's `nearest_int`: round half to even (valid for |v| < 2^22, which every caller keeps).
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// Copy a fixed-size array out of a slice of the right length.
///
/// Callers pass sub-slices whose length was checked by the row functions; a short slice is
/// a bug, so this pads with zeros under release rather than reading out of bounds.
#[inline]
pub(crate) fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    debug_assert!(b.len() >= N);
    let mut a = [0u8; N];
    let n = b.len().min(N);
    a[..n].copy_from_slice(&b[..n]);
    a
}
