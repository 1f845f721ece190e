//! ggml's legacy 32-element formats: Q8_0, Q4_0, Q4_1.
//!
//! Layouts and quantisers follow `ggml/src/ggml-common.h` and `ggml/src/ggml-quants.c`
//! (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`) at
//! <https://github.com/ggml-org/llama.cpp/blob/b6000/ggml/src/ggml-quants.c>.

use super::{arr, f16_to_f32, f32_to_f16, BlockFormat};
use crate::Format;
use std::mem::size_of;

/// Elements per legacy block (ggml `QK8_0`, `QK4_0`, `QK4_1`).
pub const QK: usize = 32;
/// Offset of Q4_0's unsigned nibbles: value = d·(q − 8).
pub const Q4_0_OFFSET: i32 = 8;

/// Q8_0 block: 8.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Signed quants; value = d·q.
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34 && std::mem::align_of::<BlockQ8_0>() == 1);

/// Q4_0 block: 4.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Byte j: element j in the low nibble, element j + 16 in the high nibble.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18 && std::mem::align_of::<BlockQ4_0>() == 1);

/// Q4_1 block: 5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum, f16 little-endian; value = d·q + m.
    pub m: [u8; 2],
    /// Same nibble order as Q4_0.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20 && std::mem::align_of::<BlockQ4_1>() == 1);

impl BlockQ8_0 {
    /// Read a block from its 34 bytes.
    pub fn read(b: &[u8]) -> Self {
        let qs: [u8; QK] = arr(&b[2..]);
        BlockQ8_0 {
            d: arr(b),
            qs: qs.map(|v| v as i8),
        }
    }
}
impl BlockQ4_0 {
    /// Read a block from its 18 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ4_0 {
            d: arr(b),
            qs: arr(&b[2..]),
        }
    }
}
impl BlockQ4_1 {
    /// Read a block from its 20 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ4_1 {
            d: arr(b),
            m: arr(&b[2..]),
            qs: arr(&b[4..]),
        }
    }
}

/// Unsigned nibble of element `i` (0..32) in the legacy order.
#[inline]
pub fn nibble(qs: &[u8; QK / 2], i: usize) -> u8 {
    if i < QK / 2 {
        qs[i] & 0x0F
    } else {
        qs[i - QK / 2] >> 4
    }
}

/// Q8_0 marker type.
pub struct Q8_0;
/// Q4_0 marker type.
pub struct Q4_0;
/// Q4_1 marker type.
pub struct Q4_1;

/// Largest |q| of Q8_0 (ggml divides amax by `(1 << 7) - 1`).
const Q8_MAX: f32 = 127.0;
/// Q4_0 maps the signed extreme to −8 (`d = max / -8`).
const Q4_0_DIV: f32 = -8.0;
/// Q4_1 spans `(1 << 4) - 1` steps between min and max.
const Q4_1_STEPS: f32 = 15.0;

impl BlockFormat for Q8_0 {
    const FORMAT: Format = Format::Q8_0;
    const BLOCK_ELEMS: usize = QK;
    const BLOCK_BYTES: usize = size_of::<BlockQ8_0>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ8_0::read(block);
        let d = f16_to_f32(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ8_0::read(block);
        let d = f64::from(f16_to_f32(b.d));
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = f64::from(q) * d;
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        let amax = src.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / Q8_MAX;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&f32_to_f16(d));
        for (o, &v) in out[2..2 + QK].iter_mut().zip(src) {
            // roundf: half away from zero, as ggml and gguf-py's np_roundf.
            *o = ((v * id).round() as i8) as u8;
        }
    }
}

impl BlockFormat for Q4_0 {
    const FORMAT: Format = Format::Q4_0;
    const BLOCK_ELEMS: usize = QK;
    const BLOCK_BYTES: usize = size_of::<BlockQ4_0>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ4_0::read(block);
        let d = f16_to_f32(b.d);
        for (i, o) in out.iter_mut().enumerate().take(QK) {
            *o = d * (i32::from(nibble(&b.qs, i)) - Q4_0_OFFSET) as f32;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ4_0::read(block);
        let d = f64::from(f16_to_f32(b.d));
        for (i, o) in out.iter_mut().enumerate().take(QK) {
            *o = d * f64::from(i32::from(nibble(&b.qs, i)) - Q4_0_OFFSET);
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        // The signed value of largest magnitude, first one on ties (ggml's strict `<`).
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in &src[..QK] {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / Q4_0_DIV;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&f32_to_f16(d));
        for j in 0..QK / 2 {
            // ggml: MIN(15, (int8_t)(x*id + 8.5f)); the cast truncates toward zero.
            let q0 = ((src[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((src[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            out[2 + j] = q0 | (q1 << 4);
        }
    }
}

impl BlockFormat for Q4_1 {
    const FORMAT: Format = Format::Q4_1;
    const BLOCK_ELEMS: usize = QK;
    const BLOCK_BYTES: usize = size_of::<BlockQ4_1>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ4_1::read(block);
        let d = f16_to_f32(b.d);
        let m = f16_to_f32(b.m);
        for (i, o) in out.iter_mut().enumerate().take(QK) {
            *o = d * f32::from(nibble(&b.qs, i)) + m;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ4_1::read(block);
        let d = f64::from(f16_to_f32(b.d));
        let m = f64::from(f16_to_f32(b.m));
        for (i, o) in out.iter_mut().enumerate().take(QK) {
            *o = d * f64::from(nibble(&b.qs, i)) + m;
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in &src[..QK] {
            min = min.min(v);
            max = max.max(v);
        }
        let d = (max - min) / Q4_1_STEPS;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&f32_to_f16(d));
        out[2..4].copy_from_slice(&f32_to_f16(min));
        for j in 0..QK / 2 {
            let q0 = (((src[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((src[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            out[4 + j] = q0 | (q1 << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_nibble_order_is_ggml_order() {
        // Element j in the low nibble of byte j, element j + 16 in its high nibble.
        let src: Vec<f32> = (0..QK).map(|i| i as f32 - 8.0).collect();
        let mut out = [0u8; 18];
        Q4_0::quantize_block(&src, &mut out);
        let b = BlockQ4_0::read(&out);
        // d = max / −8 with max = 23 (i = 31); every value lands within one step.
        let d = f16_to_f32(b.d);
        for (i, &x) in src.iter().enumerate() {
            let v = d * (i32::from(nibble(&b.qs, i)) - Q4_0_OFFSET) as f32;
            assert!((v - x).abs() <= d.abs() * 1.01, "element {i}: {v} vs {x}");
        }
        assert_eq!(out[2] & 0x0F, nibble(&b.qs, 0));
        assert_eq!(out[2] >> 4, nibble(&b.qs, 16));
    }
}
