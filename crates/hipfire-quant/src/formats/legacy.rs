//! ggml's legacy 32-element formats: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.
//!
//! Layouts and quantisers follow `ggml/src/ggml-common.h` and `ggml/src/ggml-quants.c`
//! (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`,
//! `quantize_row_q5_0_ref`, `quantize_row_q5_1_ref`; gguf-py's numpy quantisers are the same
//! functions, and `scripts/gguf_crosscheck.py` checks them byte for byte) at
//! <https://github.com/ggml-org/llama.cpp/blob/b6000/ggml/src/ggml-quants.c>.

use super::{arr, f16_to_f32, f32_to_f16, BlockFormat};
use crate::Format;
use std::mem::size_of;

/// Elements per legacy block (ggml `QK8_0`, `QK4_0`, `QK4_1`).
pub const QK: usize = 32;
/// Offset of Q4_0's unsigned nibbles: value = d·(q − 8).
pub const Q4_0_OFFSET: i32 = 8;
/// Offset of Q5_0's unsigned 5-bit codes: value = d·(q − 16).
pub const Q5_0_OFFSET: i32 = 16;

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

/// Q5_0 block: 5.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Bit j (of this little-endian u32) is bit 4 of element j's code.
    pub qh: [u8; 4],
    /// Low 4 bits of the codes, in Q4_0's nibble order.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22 && std::mem::align_of::<BlockQ5_0>() == 1);

/// Q5_1 block: 6 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum, f16 little-endian; value = d·q + m.
    pub m: [u8; 2],
    /// Bit j (of this little-endian u32) is bit 4 of element j's code.
    pub qh: [u8; 4],
    /// Low 4 bits of the codes, in Q4_0's nibble order.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24 && std::mem::align_of::<BlockQ5_1>() == 1);

impl BlockQ5_0 {
    /// Read a block from its 22 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ5_0 {
            d: arr(b),
            qh: arr(&b[2..]),
            qs: arr(&b[6..]),
        }
    }
    /// The 32 unsigned 5-bit codes (0..=31) in element order.
    pub fn codes(&self) -> [u8; QK] {
        codes5(&self.qs, self.qh)
    }
}

impl BlockQ5_1 {
    /// Read a block from its 24 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ5_1 {
            d: arr(b),
            m: arr(&b[2..]),
            qh: arr(&b[4..]),
            qs: arr(&b[8..]),
        }
    }
    /// The 32 unsigned 5-bit codes (0..=31) in element order.
    pub fn codes(&self) -> [u8; QK] {
        codes5(&self.qs, self.qh)
    }
}

/// 5-bit codes from Q4_0-ordered nibbles plus one high bit per element (bit j of `qh`).
fn codes5(qs: &[u8; QK / 2], qh: [u8; 4]) -> [u8; QK] {
    let h = u32::from_le_bytes(qh);
    std::array::from_fn(|i| nibble(qs, i) | ((((h >> i) & 1) as u8) << 4))
}

/// Pack 32 five-bit codes into Q5's (qh, qs).
fn pack5(codes: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        let (c0, c1) = (codes[j], codes[j + QK / 2]);
        qs[j] = (c0 & 0x0F) | ((c1 & 0x0F) << 4);
        qh |= u32::from(c0 >> 4) << j;
        qh |= u32::from(c1 >> 4) << (j + QK / 2);
    }
    (qh.to_le_bytes(), qs)
}

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
/// Q5_0 marker type.
pub struct Q5_0;
/// Q5_1 marker type.
pub struct Q5_1;

/// Largest |q| of Q8_0 (ggml divides amax by `(1 << 7) - 1`).
const Q8_MAX: f32 = 127.0;
/// Q4_0 maps the signed extreme to −8 (`d = max / -8`).
const Q4_0_DIV: f32 = -8.0;
/// Q4_1 spans `(1 << 4) - 1` steps between min and max.
const Q4_1_STEPS: f32 = 15.0;
/// Q5_0 maps the signed extreme to −16 (`d = max / -16`).
const Q5_0_DIV: f32 = -16.0;
/// Q5_1 spans `(1 << 5) - 1` steps between min and max.
const Q5_1_STEPS: f32 = 31.0;
/// Largest 5-bit code.
const Q5_MAX_CODE: i8 = 31;

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

impl BlockFormat for Q5_0 {
    const FORMAT: Format = Format::Q5_0;
    const BLOCK_ELEMS: usize = QK;
    const BLOCK_BYTES: usize = size_of::<BlockQ5_0>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ5_0::read(block);
        let d = f16_to_f32(b.d);
        for (o, &c) in out.iter_mut().zip(&b.codes()) {
            *o = d * (i32::from(c) - Q5_0_OFFSET) as f32;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ5_0::read(block);
        let d = f64::from(f16_to_f32(b.d));
        for (o, &c) in out.iter_mut().zip(&b.codes()) {
            *o = d * f64::from(i32::from(c) - Q5_0_OFFSET);
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        // Q4_0's rule with 5 bits: the signed extreme (first on ties) maps to −16.
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in &src[..QK] {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / Q5_0_DIV;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml: MIN(31, (int8_t)(x*id + 16.5f)); the cast truncates toward zero.
        let codes: [u8; QK] =
            std::array::from_fn(|i| ((src[i] * id + 16.5) as i8).min(Q5_MAX_CODE) as u8);
        let (qh, qs) = pack5(&codes);
        out[..2].copy_from_slice(&f32_to_f16(d));
        out[2..6].copy_from_slice(&qh);
        out[6..6 + QK / 2].copy_from_slice(&qs);
    }
}

impl BlockFormat for Q5_1 {
    const FORMAT: Format = Format::Q5_1;
    const BLOCK_ELEMS: usize = QK;
    const BLOCK_BYTES: usize = size_of::<BlockQ5_1>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ5_1::read(block);
        let d = f16_to_f32(b.d);
        let m = f16_to_f32(b.m);
        for (o, &c) in out.iter_mut().zip(&b.codes()) {
            *o = d * f32::from(c) + m;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ5_1::read(block);
        let d = f64::from(f16_to_f32(b.d));
        let m = f64::from(f16_to_f32(b.m));
        for (o, &c) in out.iter_mut().zip(&b.codes()) {
            *o = d * f64::from(c) + m;
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in &src[..QK] {
            min = min.min(v);
            max = max.max(v);
        }
        let d = (max - min) / Q5_1_STEPS;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml: (uint8_t)(x0 + 0.5f), which gguf-py clips to 31 (reached only by rounding).
        let codes: [u8; QK] =
            std::array::from_fn(|i| (((src[i] - min) * id + 0.5) as i8).min(Q5_MAX_CODE) as u8);
        let (qh, qs) = pack5(&codes);
        out[..2].copy_from_slice(&f32_to_f16(d));
        out[2..4].copy_from_slice(&f32_to_f16(min));
        out[4..8].copy_from_slice(&qh);
        out[8..8 + QK / 2].copy_from_slice(&qs);
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

    #[test]
    fn q5_codes_round_trip_through_the_packing() {
        // Every code 0..31 at every position (shifted per trial), packed and read back.
        for shift in 0..QK {
            let codes: [u8; QK] = std::array::from_fn(|i| ((i + shift) % QK) as u8);
            let (qh, qs) = pack5(&codes);
            assert_eq!(codes5(&qs, qh), codes, "shift {shift}");
            // Element j's high bit is bit j of the little-endian u32.
            let h = u32::from_le_bytes(qh);
            for (j, &c) in codes.iter().enumerate() {
                assert_eq!((h >> j) & 1, u32::from(c >> 4));
            }
        }
    }
}
