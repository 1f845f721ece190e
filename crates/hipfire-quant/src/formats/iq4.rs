//! ggml's non-linear 4-bit formats: IQ4_NL (blocks of 32, one f16 scale) and IQ4_XS
//! (super-blocks of 256 with eight 6-bit sub-scales), both decoding a nibble through the
//! 16-entry table [`IQ4NL_VALUES`].
//!
//! Layouts follow `ggml/src/ggml-common.h` and gguf-py's `quants.py` (nibbles in Q4_0's
//! order per 32 elements); the quantisers are ggml's reference `quantize_row_iq4_nl_impl`
//! without importance weights, as `quantize_iq4_nl` / `quantize_iq4_xs` call it, from
//! <https://github.com/ggml-org/llama.cpp/blob/b6000/ggml/src/ggml-quants.c>. gguf-py has no
//! quantiser for them, so only dequantisation is cross-checked value for value
//! (`scripts/gguf_crosscheck.py`).

use super::{arr, f16_to_f32, f32_to_f16, nearest_int, BlockFormat};
use crate::formats::kquant::QK_K;
use crate::formats::legacy::{nibble, QK};
use crate::Format;
use std::mem::size_of;

/// ggml's `kvalues_iq4nl`: the value of each 4-bit code (before the scale).
pub const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// IQ4_XS's 6-bit sub-block scales are stored with this offset: scale = code − 32.
pub const IQ4XS_SCALE_OFFSET: i32 = 32;
/// Sub-blocks of 32 per IQ4_XS super-block.
pub const IQ4XS_SUBS: usize = QK_K / QK;
/// ggml's `GROUP_MAX_EPS`: below this amax a block quantises to zeros.
const GROUP_MAX_EPS: f32 = 1e-15;
/// Trial scales either side of the first guess (`ntry = 7` in both callers).
const NTRY: i32 = 7;

/// IQ4_NL block: 4.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIq4Nl {
    /// Scale, f16.
    pub d: [u8; 2],
    /// Codes in Q4_0's nibble order.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockIq4Nl>() == 18 && std::mem::align_of::<BlockIq4Nl>() == 1);

/// IQ4_XS super-block: 4.25 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIq4Xs {
    /// Super-block scale, f16.
    pub d: [u8; 2],
    /// Top two bits of sub-block ib's scale code at bits 2·ib (little-endian u16).
    pub scales_h: [u8; 2],
    /// Low four bits of sub-block ib's scale code in nibble ib % 2 of byte ib / 2.
    pub scales_l: [u8; QK_K / 64],
    /// Per sub-block of 32, 16 bytes in Q4_0's nibble order.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIq4Xs>() == 136 && std::mem::align_of::<BlockIq4Xs>() == 1);

impl BlockIq4Nl {
    /// Read a block from its 18 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockIq4Nl {
            d: arr(b),
            qs: arr(&b[2..]),
        }
    }
    /// The 32 decoded table values in element order.
    pub fn values(&self) -> [i8; QK] {
        std::array::from_fn(|i| IQ4NL_VALUES[usize::from(nibble(&self.qs, i))])
    }
}

impl BlockIq4Xs {
    /// Read a block from its 136 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockIq4Xs {
            d: arr(b),
            scales_h: arr(&b[2..]),
            scales_l: arr(&b[4..]),
            qs: arr(&b[8..]),
        }
    }
    /// The eight 6-bit scale codes (scale = code − 32).
    pub fn scale_codes(&self) -> [u8; IQ4XS_SUBS] {
        let h = u16::from_le_bytes(self.scales_h);
        std::array::from_fn(|ib| {
            let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
            let high = ((h >> (2 * ib)) & 3) as u8;
            low | (high << 4)
        })
    }
    /// The 256 decoded table values in element order.
    pub fn values(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let qs: [u8; QK / 2] = arr(&self.qs[16 * (e / QK)..]);
            IQ4NL_VALUES[usize::from(nibble(&qs, e % QK))]
        })
    }
}

/// IQ4_NL marker type.
pub struct Iq4Nl;
/// IQ4_XS marker type.
pub struct Iq4Xs;

impl BlockFormat for Iq4Nl {
    const FORMAT: Format = Format::Iq4Nl;
    const BLOCK_ELEMS: usize = QK;
    const BLOCK_BYTES: usize = size_of::<BlockIq4Nl>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockIq4Nl::read(block);
        let d = f16_to_f32(b.d);
        for (o, &v) in out.iter_mut().zip(&b.values()) {
            *o = d * f32::from(v);
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockIq4Nl::read(block);
        let d = f64::from(f16_to_f32(b.d));
        for (o, &v) in out.iter_mut().zip(&b.values()) {
            *o = d * f64::from(v);
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        let mut l = [0u8; QK];
        let d = iq4_search(&src[..QK], &mut l);
        // One block per "super-block": ggml stores the searched scale and recomputes every
        // index against it.
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (li, &v) in l.iter_mut().zip(src) {
            *li = best_index(id * v);
        }
        out[..2].copy_from_slice(&f32_to_f16(d));
        out[2..2 + QK / 2].copy_from_slice(&pack_nibbles(&l));
    }
}

impl BlockFormat for Iq4Xs {
    const FORMAT: Format = Format::Iq4Xs;
    const BLOCK_ELEMS: usize = QK_K;
    const BLOCK_BYTES: usize = size_of::<BlockIq4Xs>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockIq4Xs::read(block);
        let d = f16_to_f32(b.d);
        let (sc, v) = (b.scale_codes(), b.values());
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            // gguf-py / ggml order: (d·scale)·value.
            let dl = d * (i32::from(sc[i / QK]) - IQ4XS_SCALE_OFFSET) as f32;
            *o = dl * f32::from(v[i]);
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockIq4Xs::read(block);
        let d = f64::from(f16_to_f32(b.d));
        let (sc, v) = (b.scale_codes(), b.values());
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let s = f64::from(i32::from(sc[i / QK]) - IQ4XS_SCALE_OFFSET);
            *o = d * s * f64::from(v[i]);
        }
    }
    fn quantize_block(src: &[f32], out: &mut [u8]) {
        quantize_iq4xs(src, out);
    }
}

/// ggml's `best_index_int8` over [`IQ4NL_VALUES`]: the index of the nearest value (the upper
/// one on ties), by bisection.
fn best_index(x: f32) -> u8 {
    let val = |i: usize| f32::from(IQ4NL_VALUES[i]);
    let n = IQ4NL_VALUES.len();
    if x <= val(0) {
        return 0;
    }
    if x >= val(n - 1) {
        return (n - 1) as u8;
    }
    let (mut ml, mut mu) = (0usize, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - val(mu - 1) < val(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// 32 codes into 16 bytes, Q4_0's nibble order.
fn pack_nibbles(l: &[u8]) -> [u8; QK / 2] {
    std::array::from_fn(|j| l[j] | (l[j + QK / 2] << 4))
}

/// The per-32 part of ggml's `quantize_row_iq4_nl_impl` (x²-weighted, ntry = 7): fills `l`
/// with the first guess's codes and returns the best scale of 2·ntry + 1 trials (0 for a
/// block below `GROUP_MAX_EPS`, `l` then untouched).
fn iq4_search(x: &[f32], l: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = f32::from(IQ4NL_VALUES[0]);
    let sums = |id: f32, l: Option<&mut [u8]>| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        let mut l = l;
        for (j, &xv) in x.iter().enumerate() {
            let idx = best_index(id * xv);
            if let Some(l) = l.as_deref_mut() {
                l[j] = idx;
            }
            let (w, q) = (xv * xv, f32::from(IQ4NL_VALUES[usize::from(idx)]));
            sumqx += w * q * xv;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let (sumqx, sumq2) = sums(1.0 / (-max / v0), Some(l));
    let mut d = sumqx / sumq2;
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let (sumqx, sumq2) = sums((itry as f32 + v0) / max, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Largest |sub-scale code − 32| maps the sub-block scale of largest magnitude to −32.
const IQ4XS_SCALE_DIV: f32 = -32.0;

/// ggml's `quantize_row_iq4_nl_impl(QK_K, 32, ..)` without importance weights (IQ4_XS).
fn quantize_iq4xs(x: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; IQ4XS_SUBS];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = iq4_search(&x[QK * ib..QK * (ib + 1)], &mut l[QK * ib..QK * (ib + 1)]);
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = *s;
        }
    }
    // ggml keeps the unrounded d for the sub-scales; only the stored copy is f16.
    let d = max_scale / IQ4XS_SCALE_DIV;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (mut scales_h, mut scales_l) = (0u16, [0u8; QK_K / 64]);
    for (ib, &s) in scales.iter().enumerate() {
        let code = nearest_int(id * s).clamp(-32, 31);
        let dl = d * code as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for (li, &v) in l[QK * ib..QK * (ib + 1)].iter_mut().zip(&x[QK * ib..]) {
            *li = best_index(idl * v);
        }
        let code = (code + IQ4XS_SCALE_OFFSET) as u8;
        scales_l[ib / 2] |= (code & 0x0F) << (4 * (ib % 2));
        scales_h |= u16::from(code >> 4) << (2 * ib);
    }
    out[..2].copy_from_slice(&f32_to_f16(d));
    out[2..4].copy_from_slice(&scales_h.to_le_bytes());
    out[4..8].copy_from_slice(&scales_l);
    for (ib, o) in out[8..8 + QK_K / 2].chunks_exact_mut(QK / 2).enumerate() {
        o.copy_from_slice(&pack_nibbles(&l[QK * ib..]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_is_the_nearest_value() {
        for i in -1300..=1300 {
            let x = i as f32 / 10.0;
            let got = f32::from(IQ4NL_VALUES[usize::from(best_index(x))]);
            let nearest = IQ4NL_VALUES
                .iter()
                .map(|&v| (f32::from(v) - x).abs())
                .fold(f32::MAX, f32::min);
            assert_eq!((got - x).abs(), nearest, "x = {x}");
        }
    }

    #[test]
    fn iq4xs_scale_codes_round_trip() {
        let mut out = [0u8; 136];
        // Sub-block ib's magnitude grows with ib, so the last has the largest scale.
        let x: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * (1 + i / 32) as f32)
            .collect();
        quantize_iq4xs(&x, &mut out);
        let codes = BlockIq4Xs::read(&out).scale_codes();
        // The largest |scale| maps to −32 (code 0); each sub-scale keeps its block's sign.
        assert_eq!(codes[IQ4XS_SUBS - 1], 0, "{codes:?}");
        let mut back = [0f32; QK_K];
        Iq4Xs::dequantize_block(&out, &mut back);
        for ib in 0..IQ4XS_SUBS {
            let r = QK * ib..QK * (ib + 1);
            let amax = x[r.clone()].iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in x[r.clone()].iter().zip(&back[r]) {
                // Half the table's widest gap (23/127) plus the 6-bit sub-scale rounding.
                assert!((a - b).abs() <= amax * 0.16, "sub-block {ib}: {a} vs {b}");
            }
        }
    }
}
