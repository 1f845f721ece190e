//! ggml's low-bit K-quant super-blocks of 256: Q3_K and Q2_K (what Q3_K_M / Q2_K files hold).
//!
//! Both have one scale per 16 elements and the same 2-bit plane layout: element
//! `128·h + 32·s + l` (h < 2, s < 4, l < 32) has its low two bits at bits `2s..2s+2` of
//! `qs[32·h + l]`. Layouts follow `ggml/src/ggml-common.h` and gguf-py's `quants.py`; the
//! quantisers are ggml's reference ones, `quantize_row_q3_K_ref` (with `make_q3_quants`) and
//! `quantize_row_q2_K_ref` (with `make_qkx2_quants`, absolute-deviation search), from
//! <https://github.com/ggml-org/llama.cpp/blob/b6000/ggml/src/ggml-quants.c>. gguf-py has no
//! quantiser for them, so only dequantisation is cross-checked value for value
//! (`scripts/gguf_crosscheck.py`).

use super::kquant::{make_qkx2_quants, KSearch, K_SCALE_SIZE, Q6K_SUB, QK_K};
use super::{arr, f16_to_f32, f32_to_f16, nearest_int, BlockFormat};
use crate::Format;
use std::mem::size_of;

/// Scales per super-block (one per 16 elements).
pub const K_GROUPS: usize = QK_K / Q6K_SUB;
/// Q3_K's 6-bit scales are stored with this offset: scale = code − 32.
pub const Q3K_SCALE_OFFSET: i32 = 32;
/// Q3_K's 3-bit codes are stored with this offset: value = d·scale·(code − 4).
pub const Q3K_OFFSET: i32 = 4;
/// ggml's `GROUP_MAX_EPS`: below this amax a group quantises to zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Q3_K super-block: 3.4375 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    /// Bit j of byte l: bit 2 of element 32·j + l.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the codes (see the module docs).
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales, packed (see [`q3k_scales`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Super-block scale, f16.
    pub d: [u8; 2],
}
const _: () = assert!(size_of::<BlockQ3K>() == 110 && std::mem::align_of::<BlockQ3K>() == 1);

/// Q2_K super-block: 2.625 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    /// Per 16 elements: low nibble scale, high nibble min.
    pub scales: [u8; K_GROUPS],
    /// The 2-bit codes (see the module docs).
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales, f16.
    pub d: [u8; 2],
    /// Super-block scale for the mins, f16.
    pub dmin: [u8; 2],
}
const _: () = assert!(size_of::<BlockQ2K>() == 84 && std::mem::align_of::<BlockQ2K>() == 1);

/// The low two bits of every element from the 2-bit planes, in element order.
fn planes2(qs: &[u8; QK_K / 4]) -> [u8; QK_K] {
    std::array::from_fn(|e| {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        (qs[32 * h + l] >> (2 * s)) & 3
    })
}

/// Pack 256 codes of 0..=3 into the 2-bit planes.
fn pack_planes2(l: &[u8; QK_K]) -> [u8; QK_K / 4] {
    std::array::from_fn(|i| {
        let (h, li) = (i / 32, i % 32);
        let j = 128 * h + li;
        l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6)
    })
}

impl BlockQ3K {
    /// Read a block from its 110 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ3K {
            hmask: arr(b),
            qs: arr(&b[32..]),
            scales: arr(&b[96..]),
            d: arr(&b[108..]),
        }
    }
    /// The 256 unsigned 3-bit codes (0..=7, value ∝ code − 4) in element order.
    pub fn codes(&self) -> [u8; QK_K] {
        let mut c = planes2(&self.qs);
        for (e, v) in c.iter_mut().enumerate() {
            *v |= ((self.hmask[e % 32] >> (e / 32)) & 1) << 2;
        }
        c
    }
}

/// Q3_K's sixteen 6-bit scale codes (0..=63, scale = code − 32): code i has its low nibble in
/// `scales[i % 8]` (low nibble for i < 8, high for i ≥ 8) and its top two bits at bits
/// `2·(i / 4)` of `scales[8 + i % 4]`.
pub fn q3k_scales(s: &[u8; K_SCALE_SIZE]) -> [u8; K_GROUPS] {
    std::array::from_fn(|i| {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        low | (high << 4)
    })
}

impl BlockQ2K {
    /// Read a block from its 84 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ2K {
            scales: arr(b),
            qs: arr(&b[16..]),
            d: arr(&b[80..]),
            dmin: arr(&b[82..]),
        }
    }
    /// The 256 unsigned 2-bit codes in element order.
    pub fn codes(&self) -> [u8; QK_K] {
        planes2(&self.qs)
    }
}

/// Q3_K marker type.
pub struct Q3K;
/// Q2_K marker type.
pub struct Q2K;

impl BlockFormat for Q3K {
    const FORMAT: Format = Format::Q3K;
    const BLOCK_ELEMS: usize = QK_K;
    const BLOCK_BYTES: usize = size_of::<BlockQ3K>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ3K::read(block);
        let d = f16_to_f32(b.d);
        let (sc, c) = (q3k_scales(&b.scales), b.codes());
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            // gguf-py / ggml order: (d·scale)·q.
            let dl = d * (i32::from(sc[i / Q6K_SUB]) - Q3K_SCALE_OFFSET) as f32;
            *o = dl * (i32::from(c[i]) - Q3K_OFFSET) as f32;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ3K::read(block);
        let d = f64::from(f16_to_f32(b.d));
        let (sc, c) = (q3k_scales(&b.scales), b.codes());
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let s = f64::from(i32::from(sc[i / Q6K_SUB]) - Q3K_SCALE_OFFSET);
            *o = d * s * f64::from(i32::from(c[i]) - Q3K_OFFSET);
        }
    }
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        quantize_q3k(x, out);
    }
}

impl BlockFormat for Q2K {
    const FORMAT: Format = Format::Q2K;
    const BLOCK_ELEMS: usize = QK_K;
    const BLOCK_BYTES: usize = size_of::<BlockQ2K>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ2K::read(block);
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let c = b.codes();
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let sc = b.scales[i / Q6K_SUB];
            // gguf-py / ggml order: (d·sc)·q − (dmin·m).
            let (dl, ml) = (d * f32::from(sc & 0x0F), dmin * f32::from(sc >> 4));
            *o = dl * f32::from(c[i]) - ml;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ2K::read(block);
        let (d, dmin) = (f64::from(f16_to_f32(b.d)), f64::from(f16_to_f32(b.dmin)));
        let c = b.codes();
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let sc = b.scales[i / Q6K_SUB];
            *o = d * f64::from(sc & 0x0F) * f64::from(c[i]) - dmin * f64::from(sc >> 4);
        }
    }
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        quantize_q2k(x, out);
    }
}

/// Q3_K's signed 3-bit quants span −4..=3 (`make_q3_quants(16, 4, ..)`).
const Q3K_NMAX: i32 = 4;
/// ggml maps the sub-block scale of largest magnitude to −32 (`iscale = -32.f/max_scale`).
const Q3K_SCALE_DIV: f32 = -32.0;
/// Refinement passes of `make_q3_quants`.
const Q3_TRIES: usize = 5;

/// ggml's `make_q3_quants` with `do_rmse`: symmetric quants in −nmax..nmax−1 (returned in
/// `l` as 0..2·nmax), the scale refined by coordinate descent on the x²-weighted error.
fn make_q3_quants(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let (w, qf) = (v * v, q as f32);
        sumlx += w * v * qf;
        suml2 += w * qf * qf;
    }
    for _ in 0..Q3_TRIES {
        let mut changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*li);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*li) {
                    let nf = new_l as f32;
                    slx += w * v * nf;
                    sl2 += w * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for li in l[..x.len()].iter_mut() {
        *li += nmax as i8;
    }
    sumlx / suml2
}

/// ggml's `quantize_row_q3_K_ref` for one super-block.
fn quantize_q3k(x: &[f32], out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; K_GROUPS];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for (j, s) in scales.iter_mut().enumerate() {
        let r = Q6K_SUB * j..Q6K_SUB * (j + 1);
        *s = make_q3_quants(&x[r.clone()], Q3K_NMAX, &mut l[r]);
        if s.abs() > amax {
            amax = s.abs();
            max_scale = *s;
        }
    }
    let mut sc = [0u8; K_SCALE_SIZE];
    let d16 = if max_scale != 0.0 {
        let iscale = Q3K_SCALE_DIV / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            let code = (nearest_int(iscale * s).clamp(-32, 31) + Q3K_SCALE_OFFSET) as u8;
            if j < 8 {
                sc[j] = code & 0x0F;
            } else {
                sc[j - 8] |= (code & 0x0F) << 4;
            }
            sc[j % 4 + 8] |= (code >> 4) << (2 * (j / 4));
        }
        f32_to_f16(1.0 / iscale)
    } else {
        f32_to_f16(0.0)
    };
    let codes = q3k_scales(&sc);
    for j in 0..K_GROUPS {
        let d = f16_to_f32(d16) * (i32::from(codes[j]) - Q3K_SCALE_OFFSET) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..Q6K_SUB {
            let q = nearest_int(x[Q6K_SUB * j + ii] / d).clamp(-Q3K_NMAX, Q3K_NMAX - 1);
            l[Q6K_SUB * j + ii] = (q + Q3K_OFFSET) as i8;
        }
    }
    // Bit 2 of element j goes to bit j / 32 of hmask[j % 32]; the planes keep bits 0..2.
    let mut hmask = [0u8; QK_K / 8];
    let mut low = [0u8; QK_K];
    for (j, (&v, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
        let v = v as u8;
        if v > 3 {
            hmask[j % 32] |= 1 << (j / 32);
        }
        *lo = v & 3;
    }
    out[..32].copy_from_slice(&hmask);
    out[32..96].copy_from_slice(&pack_planes2(&low));
    out[96..108].copy_from_slice(&sc);
    out[108..110].copy_from_slice(&d16);
}

/// Largest 2-bit quant of Q2_K.
const Q2K_QMAX: i32 = 3;
/// Q2_K's 4-bit scale and min codes: `q4scale = 15`.
const Q2K_SCALE_MAX: f32 = 15.0;
/// make_qkx2_quants search ggml's `quantize_row_q2_K_ref` passes (absolute deviations).
const Q2K_SEARCH: KSearch = KSearch {
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: true,
};

/// ggml's `quantize_row_q2_K_ref` for one super-block.
fn quantize_q2k(x: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut weights = [0f32; Q6K_SUB];
    let mut mins = [0f32; K_GROUPS];
    let mut scales = [0f32; K_GROUPS];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..K_GROUPS {
        let xs = &x[Q6K_SUB * j..Q6K_SUB * (j + 1)];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (s, m) = make_qkx2_quants(xs, &weights, Q2K_QMAX, &mut l[Q6K_SUB * j..], Q2K_SEARCH);
        scales[j] = s;
        mins[j] = m;
        max_scale = max_scale.max(s);
        max_min = max_min.max(m);
    }
    let mut sc = [0u8; K_GROUPS];
    let d16 = if max_scale > 0.0 {
        let iscale = Q2K_SCALE_MAX / max_scale;
        for (c, &s) in sc.iter_mut().zip(&scales) {
            *c = nearest_int(iscale * s) as u8;
        }
        f32_to_f16(max_scale / Q2K_SCALE_MAX)
    } else {
        f32_to_f16(0.0)
    };
    let dmin16 = if max_min > 0.0 {
        let iscale = Q2K_SCALE_MAX / max_min;
        for (c, &m) in sc.iter_mut().zip(&mins) {
            *c |= (nearest_int(iscale * m) as u8) << 4;
        }
        f32_to_f16(max_min / Q2K_SCALE_MAX)
    } else {
        f32_to_f16(0.0)
    };
    for (j, &c) in sc.iter().enumerate() {
        let d = f16_to_f32(d16) * f32::from(c & 0x0F);
        if d == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin16) * f32::from(c >> 4);
        for ii in 0..Q6K_SUB {
            let q = nearest_int((x[Q6K_SUB * j + ii] + dm) / d).clamp(0, Q2K_QMAX);
            l[Q6K_SUB * j + ii] = q as u8;
        }
    }
    out[..16].copy_from_slice(&sc);
    out[16..80].copy_from_slice(&pack_planes2(&l));
    out[80..82].copy_from_slice(&d16);
    out[82..84].copy_from_slice(&dmin16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3k_scale_packing_round_trips() {
        // Pack codes as the quantiser does and read them back, for every code in every slot.
        for shift in 0..64u8 {
            let codes: [u8; K_GROUPS] = std::array::from_fn(|j| (j as u8 * 5 + shift) % 64);
            let mut sc = [0u8; K_SCALE_SIZE];
            for (j, &code) in codes.iter().enumerate() {
                if j < 8 {
                    sc[j] |= code & 0x0F;
                } else {
                    sc[j - 8] |= (code & 0x0F) << 4;
                }
                sc[j % 4 + 8] |= (code >> 4) << (2 * (j / 4));
            }
            assert_eq!(q3k_scales(&sc), codes, "shift {shift}");
        }
    }

    #[test]
    fn planes_round_trip() {
        let l: [u8; QK_K] = std::array::from_fn(|i| ((i * 7 + i / 3) % 4) as u8);
        assert_eq!(planes2(&pack_planes2(&l)), l);
    }
}
