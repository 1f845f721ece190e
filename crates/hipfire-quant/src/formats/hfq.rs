//! HFQ4G256, hipfire's own 4-bit format: one f32 scale and one f32 zero per 256 weights.
//!
//! Value = scale·q + zero with q in 0..=15. Byte i of the nibbles holds element 2i in its low
//! nibble and element 2i + 1 in its high nibble. 4.25 bits per weight.

use super::{arr, BlockFormat};
use crate::Format;
use std::mem::size_of;

/// Elements per HFQ4G256 group.
pub const HFQ_GROUP: usize = 256;
/// Largest 4-bit code.
const HFQ_QMAX: f32 = 15.0;

/// HFQ4G256 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockHfq4G256 {
    /// f32 scale, little-endian.
    pub scale: [u8; 4],
    /// f32 zero point (the group minimum), little-endian.
    pub zero: [u8; 4],
    /// Nibbles, low = even element.
    pub qs: [u8; HFQ_GROUP / 2],
}
const _: () =
    assert!(size_of::<BlockHfq4G256>() == 136 && std::mem::align_of::<BlockHfq4G256>() == 1);

impl BlockHfq4G256 {
    /// Read a block from its 136 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockHfq4G256 {
            scale: arr(b),
            zero: arr(&b[4..]),
            qs: arr(&b[8..]),
        }
    }
    /// Scale and zero as f32.
    pub fn scale_zero(&self) -> (f32, f32) {
        (
            f32::from_le_bytes(self.scale),
            f32::from_le_bytes(self.zero),
        )
    }
    /// Code of element `i`.
    #[inline]
    pub fn q(&self, i: usize) -> u8 {
        (self.qs[i / 2] >> (4 * (i % 2))) & 0x0F
    }
}

/// HFQ4G256 marker type.
pub struct Hfq4G256;

impl BlockFormat for Hfq4G256 {
    const FORMAT: Format = Format::Hfq4G256;
    const BLOCK_ELEMS: usize = HFQ_GROUP;
    const BLOCK_BYTES: usize = size_of::<BlockHfq4G256>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockHfq4G256::read(block);
        let (s, z) = b.scale_zero();
        for (i, o) in out.iter_mut().enumerate().take(HFQ_GROUP) {
            *o = s * f32::from(b.q(i)) + z;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockHfq4G256::read(block);
        let (s, z) = b.scale_zero();
        for (i, o) in out.iter_mut().enumerate().take(HFQ_GROUP) {
            *o = f64::from(s) * f64::from(b.q(i)) + f64::from(z);
        }
    }
    /// Min/max affine quantisation: zero = min, scale = (max − min)/15, q = round((x − zero)/scale).
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in &src[..HFQ_GROUP] {
            min = min.min(v);
            max = max.max(v);
        }
        let scale = (max - min) / HFQ_QMAX;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        out[..4].copy_from_slice(&scale.to_le_bytes());
        out[4..8].copy_from_slice(&min.to_le_bytes());
        for i in 0..HFQ_GROUP / 2 {
            let q = |v: f32| ((v - min) * inv).round().clamp(0.0, HFQ_QMAX) as u8;
            out[8 + i] = q(src[2 * i]) | (q(src[2 * i + 1]) << 4);
        }
    }
}
