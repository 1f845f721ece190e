//! OCP microscaling FP4 (MXFP4, GGML type 39, the format of gpt-oss's MoE experts): blocks
//! of 32 E2M1 codes under one E8M0 (power-of-two) scale.
//!
//! Layout, decoding and quantiser follow ggml (`ggml-common.h` `block_mxfp4` /
//! `kvalues_mxfp4`, `ggml-impl.h` `ggml_e8m0_to_fp32_half`, `ggml-quants.c`
//! `dequantize_row_mxfp4` / `quantize_row_mxfp4_ref`) and gguf-py's `quants.MXFP4`, which
//! `scripts/gguf_crosscheck.py` compares byte for byte. Like ggml, the E2M1 values are stored
//! doubled (integers, so the row dots can multiply them as bytes) and the scale halved:
//! value = [`MXFP4_VALUES`]\[q\] · 2^(e − 128).

use super::{arr, BlockFormat};
use crate::formats::legacy::{nibble, QK};
use crate::Format;
use std::mem::size_of;

/// ggml's `kvalues_mxfp4`: twice the E2M1 value of each 4-bit code (bit 3 the sign, bits 0–2
/// the magnitude 0, 0.5, 1, 1.5, 2, 3, 4, 6), so every entry is an integer.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
/// The largest |[`MXFP4_VALUES`]| entry: value + this is unsigned (0..=24), the operand
/// `vpmaddubsw` / `vpdpbusd` want, at a tenth of the +128 sign bias the IQ4 dots use, which
/// keeps the integer lanes (and so the f32 rounding of their scaled sum) near the products'
/// own size.
pub const MXFP4_BIAS: i8 = 12;
const _: () = {
    let mut i = 0;
    while i < MXFP4_VALUES.len() {
        assert!(MXFP4_VALUES[i] >= -MXFP4_BIAS && MXFP4_VALUES[i] <= MXFP4_BIAS);
        i += 1;
    }
};

/// Bits of an f32's mantissa: an exponent field goes in above them.
pub(crate) const E8M0_MANTISSA_BITS: i32 = 23;
/// f32 bits of 2^−128, the scale of e = 0: below the smallest normal (2^−126), so it is the
/// subnormal with mantissa bit 21 set (2^−149 · 2^21), and e = 1 is that shifted once.
const E8M0_HALF_SUBNORMAL: u32 = 0x0020_0000;
/// The first e whose 2^(e − 128) is a normal f32 (exponent field e − 1 ≥ 1).
pub(crate) const E8M0_FIRST_NORMAL: u8 = 2;
/// E8M0 exponent bias (127) plus one, for the doubled table: the scale is 2^(e − 128).
const E8M0_HALF_BIAS: i32 = 128;
/// The quantiser's scale exponent sits this far below amax's: amax / 2^(⌊log2 amax⌋ − 2) is in
/// [4, 8), so with the halved scale the largest code's doubled value 12 covers it (ggml).
const QUANT_EXP_SHIFT: f32 = 2.0;
/// E8M0's exponent bias.
const E8M0_BIAS: f32 = 127.0;

/// ggml's `ggml_e8m0_to_fp32_half` as f32 bits: 2^(e − 128) for every byte. e = 0 and 1 are
/// subnormal f32s; e = 255 (E8M0's NaN) is decoded as 2^127 like ggml and gguf-py do (ggml's
/// row validation rejects it, the decoders do not look).
#[inline(always)]
pub const fn e8m0_half_bits(e: u8) -> u32 {
    if e < E8M0_FIRST_NORMAL {
        E8M0_HALF_SUBNORMAL << e
    } else {
        (e as u32 - 1) << E8M0_MANTISSA_BITS
    }
}

/// [`e8m0_half_bits`] as an f32.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(e8m0_half_bits(e))
}

/// MXFP4 block: 4.25 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockMxfp4 {
    /// E8M0 scale exponent: the block's values are multiplied by 2^(e − 128).
    pub e: u8,
    /// Codes in Q4_0's nibble order (low nibble of byte j = element j, high = element j + 16).
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMxfp4>() == 17 && std::mem::align_of::<BlockMxfp4>() == 1);

impl BlockMxfp4 {
    /// Read a block from its 17 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockMxfp4 {
            e: b.first().copied().unwrap_or(0),
            qs: arr(b.get(1..).unwrap_or(&[])),
        }
    }
    /// The 32 decoded (doubled) table values in element order.
    pub fn values(&self) -> [i8; QK] {
        std::array::from_fn(|i| MXFP4_VALUES[usize::from(nibble(&self.qs, i))])
    }
}

/// MXFP4 marker type.
pub struct Mxfp4;

impl BlockFormat for Mxfp4 {
    const FORMAT: Format = Format::Mxfp4;
    const BLOCK_ELEMS: usize = QK;
    const BLOCK_BYTES: usize = size_of::<BlockMxfp4>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockMxfp4::read(block);
        let d = e8m0_half(b.e);
        for (o, &v) in out.iter_mut().zip(&b.values()) {
            // ggml: x0*d (int8 promoted to float); exact, a power of two times a small integer.
            *o = f32::from(v) * d;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockMxfp4::read(block);
        // Exact in f64 for every e (no overflow at 12 · 2^127, unlike f32).
        let d = 2f64.powi(i32::from(b.e) - E8M0_HALF_BIAS);
        for (o, &v) in out.iter_mut().zip(&b.values()) {
            *o = d * f64::from(v);
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        let amax = src[..QK]
            .iter()
            .fold(0f32, |a, v| if a < v.abs() { v.abs() } else { a });
        // ggml: (uint8_t)(floorf(log2f(amax)) - 2 + 127). Below amax = 2^-125 the value is
        // negative and C's conversion undefined; `as` saturates it to 0, the smallest scale.
        let e = if amax > 0.0 {
            (amax.log2().floor() - QUANT_EXP_SHIFT + E8M0_BIAS) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let mut l = [0u8; QK];
        for (li, &v) in l.iter_mut().zip(src) {
            *li = best_index(v, d);
        }
        out[0] = e;
        for (j, o) in out[1..1 + QK / 2].iter_mut().enumerate() {
            *o = l[j] | (l[j + QK / 2] << 4);
        }
    }
}

/// ggml's `best_index_mxfp4`: the code whose value·d is nearest `x`, scanning codes in order
/// and keeping the first on ties (so +0 over −0, and the smaller code between two neighbours).
fn best_index(x: f32, d: f32) -> u8 {
    let err = |i: usize| (f32::from(MXFP4_VALUES[i]) * d - x).abs();
    let (mut best, mut best_err) = (0usize, err(0));
    for i in 1..MXFP4_VALUES.len() {
        let e = err(i);
        if e < best_err {
            best = i;
            best_err = e;
        }
    }
    best as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            let want = 2f64.powi(i32::from(e) - E8M0_HALF_BIAS);
            assert_eq!(f64::from(e8m0_half(e)), want, "e = {e}");
        }
    }

    #[test]
    fn block_round_trips_exact_grid_values() {
        // Values on the grid of one scale quantise to themselves.
        let e = 120u8;
        let d = e8m0_half(e);
        let src: [f32; QK] = std::array::from_fn(|i| f32::from(MXFP4_VALUES[i % 16]) * d);
        let mut out = [0u8; 17];
        // amax = 12·d = 1.5·2^(e − 125): ⌊log2⌋ − 2 + 127 = e.
        Mxfp4::quantize_block(&src, &mut out);
        assert_eq!(out[0], e);
        let mut back = [0f32; QK];
        Mxfp4::dequantize_block(&out, &mut back);
        assert_eq!(back, src);
    }

    #[test]
    fn best_index_is_the_nearest_value() {
        for i in -1300..=1300 {
            let x = i as f32 / 100.0;
            let got = f32::from(MXFP4_VALUES[usize::from(best_index(x, 1.0))]);
            let nearest = MXFP4_VALUES
                .iter()
                .map(|&v| (f32::from(v) - x).abs())
                .fold(f32::MAX, f32::min);
            assert_eq!((got - x).abs(), nearest, "x = {x}");
        }
    }
}
