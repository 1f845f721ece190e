//! Float formats: F32, F16 (IEEE half), BF16. One element per "block".

use super::{arr, BlockFormat};
use crate::Format;

/// 32-bit float, little-endian.
pub struct F32;
/// IEEE binary16, little-endian.
pub struct F16;
/// bfloat16 (the top 16 bits of an f32), little-endian.
pub struct BF16;

impl BlockFormat for F32 {
    const FORMAT: Format = Format::F32;
    const BLOCK_ELEMS: usize = 1;
    const BLOCK_BYTES: usize = 4;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = f32::from_le_bytes(arr(block));
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        out[0] = f64::from(f32::from_le_bytes(arr(block)));
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        out[..4].copy_from_slice(&src[0].to_le_bytes());
    }
}

impl BlockFormat for F16 {
    const FORMAT: Format = Format::F16;
    const BLOCK_ELEMS: usize = 1;
    const BLOCK_BYTES: usize = 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = super::f16_to_f32(arr(block));
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        out[0] = half::f16::from_bits(u16::from_le_bytes(arr(block))).to_f64();
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        out[..2].copy_from_slice(&super::f32_to_f16(src[0]));
    }
}

/// bf16 bits → f32 (exact: bf16 is an f32 with the low 16 mantissa bits cut).
#[inline]
pub(crate) fn bf16_to_f32(bits: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(bits)) << 16)
}

impl BlockFormat for BF16 {
    const FORMAT: Format = Format::BF16;
    const BLOCK_ELEMS: usize = 1;
    const BLOCK_BYTES: usize = 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = bf16_to_f32(arr(block));
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        out[0] = f64::from(bf16_to_f32(arr(block)));
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        // half's from_f32 rounds to nearest even, like ggml's GGML_FP32_TO_BF16 and gguf-py.
        out[..2].copy_from_slice(&half::bf16::from_f32(src[0]).to_bits().to_le_bytes());
    }
}
