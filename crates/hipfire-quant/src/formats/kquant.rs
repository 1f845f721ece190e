//! ggml's K-quant super-blocks of 256: Q4_K, Q5_K and Q6_K.
//!
//! Layouts follow `ggml/src/ggml-common.h`; the quantisers are ggml's simple reference ones,
//! `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref` (with `make_qkx2_quants`) and
//! `quantize_row_q6_K_ref` (with `make_qx_quants`) from
//! <https://github.com/ggml-org/llama.cpp/blob/b6000/ggml/src/ggml-quants.c>.

use super::{arr, f16_to_f32, f32_to_f16, nearest_int, BlockFormat};
use crate::Format;
use std::mem::size_of;

/// Elements per super-block (ggml `QK_K`).
pub const QK_K: usize = 256;
/// Bytes of Q4_K's packed 6-bit scales and mins (ggml `K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;
/// Q4_K sub-block length: one 6-bit scale and min per 32 elements.
pub const Q4K_SUB: usize = 32;
/// Q6_K sub-block length: one i8 scale per 16 elements.
pub const Q6K_SUB: usize = 16;
/// Q6_K's 6-bit quants are stored with this offset: value = d·sc·(q − 32).
pub const Q6K_OFFSET: i32 = 32;
/// ggml's `GROUP_MAX_EPS`: below this amax a group quantises to zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Q4_K super-block: 4.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale for the sub-block scales, f16.
    pub d: [u8; 2],
    /// Super-block scale for the sub-block mins, f16.
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit mins, packed (see [`q4k_scale_min`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Chunk c (32 bytes): low nibbles = sub-block 2c, high nibbles = sub-block 2c + 1.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144 && std::mem::align_of::<BlockQ4K>() == 1);

/// Q5_K super-block: 5.5 bits per weight. Q4_K's scales and nibbles plus one high bit per
/// element.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    /// Super-block scale for the sub-block scales, f16.
    pub d: [u8; 2],
    /// Super-block scale for the sub-block mins, f16.
    pub dmin: [u8; 2],
    /// Q4_K's packed 6-bit scales and mins.
    pub scales: [u8; K_SCALE_SIZE],
    /// Bit j of byte l: bit 4 of element 32·j + l.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits, in Q4_K's order.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176 && std::mem::align_of::<BlockQ5K>() == 1);

/// Q6_K super-block: 6.5625 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// One signed 8-bit scale per 16 elements.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale, f16.
    pub d: [u8; 2],
}
const _: () = assert!(size_of::<BlockQ6K>() == 210 && std::mem::align_of::<BlockQ6K>() == 1);

impl BlockQ4K {
    /// Read a block from its 144 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ4K {
            d: arr(b),
            dmin: arr(&b[2..]),
            scales: arr(&b[4..]),
            qs: arr(&b[16..]),
        }
    }
    /// The 256 unsigned 4-bit quants in element order.
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let b = self.qs[32 * c + l];
                q[64 * c + l] = b & 0x0F;
                q[64 * c + 32 + l] = b >> 4;
            }
        }
        q
    }
}

impl BlockQ5K {
    /// Read a block from its 176 bytes.
    pub fn read(b: &[u8]) -> Self {
        BlockQ5K {
            d: arr(b),
            dmin: arr(&b[2..]),
            scales: arr(&b[4..]),
            qh: arr(&b[16..]),
            qs: arr(&b[48..]),
        }
    }
    /// The 256 unsigned 5-bit quants (0..=31) in element order.
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for (e, v) in q.iter_mut().enumerate() {
            let (c, t, l) = (e / 64, (e % 64) / 32, e % 32);
            let low = (self.qs[32 * c + l] >> (4 * t)) & 0x0F;
            let high = (self.qh[l] >> (e / Q4K_SUB)) & 1;
            *v = low | (high << 4);
        }
        q
    }
}

impl BlockQ6K {
    /// Read a block from its 210 bytes.
    pub fn read(b: &[u8]) -> Self {
        let sc: [u8; 16] = arr(&b[192..]);
        BlockQ6K {
            ql: arr(b),
            qh: arr(&b[128..]),
            scales: sc.map(|v| v as i8),
            d: arr(&b[208..]),
        }
    }
    /// The 256 unsigned 6-bit quants (0..=63, before the −32 offset) in element order.
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for n in 0..2 {
            let (ql, qh) = (&self.ql[64 * n..], &self.qh[32 * n..]);
            for l in 0..32 {
                let y = &mut q[128 * n..];
                y[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                y[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        q
    }
}

/// ggml's `get_scale_min_k4`: 6-bit scale and min of Q4_K sub-block `j` (0..8).
#[inline]
pub fn q4k_scale_min(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K marker type.
pub struct Q4K;
/// Q5_K marker type.
pub struct Q5K;
/// Q6_K marker type.
pub struct Q6K;

impl BlockFormat for Q4K {
    const FORMAT: Format = Format::Q4K;
    const BLOCK_ELEMS: usize = QK_K;
    const BLOCK_BYTES: usize = size_of::<BlockQ4K>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ4K::read(block);
        dequant_k_asym(b.d, b.dmin, &b.scales, &b.quants(), out);
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ4K::read(block);
        dequant_k_asym_f64(b.d, b.dmin, &b.scales, &b.quants(), out);
    }
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        quantize_q4k(x, out);
    }
}

impl BlockFormat for Q5K {
    const FORMAT: Format = Format::Q5K;
    const BLOCK_ELEMS: usize = QK_K;
    const BLOCK_BYTES: usize = size_of::<BlockQ5K>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ5K::read(block);
        dequant_k_asym(b.d, b.dmin, &b.scales, &b.quants(), out);
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ5K::read(block);
        dequant_k_asym_f64(b.d, b.dmin, &b.scales, &b.quants(), out);
    }
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        quantize_q5k(x, out);
    }
}

impl BlockFormat for Q6K {
    const FORMAT: Format = Format::Q6K;
    const BLOCK_ELEMS: usize = QK_K;
    const BLOCK_BYTES: usize = size_of::<BlockQ6K>();
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let b = BlockQ6K::read(block);
        let d = f16_to_f32(b.d);
        let q = b.quants();
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let ds = d * f32::from(b.scales[i / Q6K_SUB]);
            *o = ds * (i32::from(q[i]) - Q6K_OFFSET) as f32;
        }
    }
    fn dequantize_block_f64(block: &[u8], out: &mut [f64]) {
        let b = BlockQ6K::read(block);
        let d = f64::from(f16_to_f32(b.d));
        let q = b.quants();
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            *o = d * f64::from(b.scales[i / Q6K_SUB]) * f64::from(i32::from(q[i]) - Q6K_OFFSET);
        }
    }
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        quantize_q6k(x, out);
    }
}

/// Q4_K / Q5_K super-block from its parts to f32, in ggml's and gguf-py's operation order:
/// (d·sc)·q − (dmin·m).
fn dequant_k_asym(
    d: [u8; 2],
    dmin: [u8; 2],
    scales: &[u8; K_SCALE_SIZE],
    q: &[u8; QK_K],
    out: &mut [f32],
) {
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..QK_K / Q4K_SUB {
        let (sc, m) = q4k_scale_min(j, scales);
        let (ds, dm) = (d * f32::from(sc), dmin * f32::from(m));
        for l in 0..Q4K_SUB {
            out[Q4K_SUB * j + l] = ds * f32::from(q[Q4K_SUB * j + l]) - dm;
        }
    }
}

/// [`dequant_k_asym`] in f64.
fn dequant_k_asym_f64(
    d: [u8; 2],
    dmin: [u8; 2],
    scales: &[u8; K_SCALE_SIZE],
    q: &[u8; QK_K],
    out: &mut [f64],
) {
    let (d, dmin) = (f64::from(f16_to_f32(d)), f64::from(f16_to_f32(dmin)));
    for j in 0..QK_K / Q4K_SUB {
        let (sc, m) = q4k_scale_min(j, scales);
        for l in 0..Q4K_SUB {
            let qv = f64::from(q[Q4K_SUB * j + l]);
            out[Q4K_SUB * j + l] = d * f64::from(sc) * qv - dmin * f64::from(m);
        }
    }
}

/// ggml's `make_qkx2_quants` (asymmetric, weighted least squares — or least absolute
/// deviations with `use_mad` — over `nstep` scale trials). Returns (scale, −min) and fills `l`
/// with quants in 0..=nmax; `x.len() <= 32`.
pub(crate) fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    l: &mut [u8],
    search: KSearch,
) -> (f32, f32) {
    let KSearch {
        rmin,
        rdelta,
        nstep,
        use_mad,
    } = search;
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let n = x.len();
    let mut laux = [0u8; Q4K_SUB];
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        best_error += weights[i] * err(scale * q as f32 + min - x[i]);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, lf) = (weights[i], q as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * f32::from(laux[i]) + this_min - x[i]);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The scale search of `make_qkx2_quants`: trial inverse scales `(nmax + rmin + rdelta·i) /
/// (max − min)` for i in 0..=nstep, scored by weighted squared (or, `use_mad`, absolute) error.
#[derive(Clone, Copy)]
pub(crate) struct KSearch {
    pub(crate) rmin: f32,
    pub(crate) rdelta: f32,
    pub(crate) nstep: i32,
    pub(crate) use_mad: bool,
}

/// Largest 6-bit scale / min code of Q4_K and Q5_K.
const Q4K_SCALE_MAX: f32 = 63.0;
/// Largest 4-bit quant of Q4_K.
const Q4K_QMAX: i32 = 15;
/// Largest 5-bit quant of Q5_K.
const Q5K_QMAX: i32 = 31;
/// make_qkx2_quants search ggml's `quantize_row_q4_K_ref` passes.
const Q4K_SEARCH: KSearch = KSearch {
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
    use_mad: false,
};
/// make_qkx2_quants search ggml's `quantize_row_q5_K_ref` passes.
const Q5K_SEARCH: KSearch = KSearch {
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: false,
};

/// ggml's `quantize_row_q4_K_ref` for one super-block.
fn quantize_q4k(x: &[f32], out: &mut [u8]) {
    let (d16, dmin16, sc, l) = quantize_k_asym(x, Q4K_QMAX, Q4K_SEARCH);
    out[0..2].copy_from_slice(&d16);
    out[2..4].copy_from_slice(&dmin16);
    out[4..16].copy_from_slice(&sc);
    let qs = &mut out[16..16 + QK_K / 2];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

/// ggml's `quantize_row_q5_K_ref` for one super-block.
fn quantize_q5k(x: &[f32], out: &mut [u8]) {
    let (d16, dmin16, sc, l) = quantize_k_asym(x, Q5K_QMAX, Q5K_SEARCH);
    out[0..2].copy_from_slice(&d16);
    out[2..4].copy_from_slice(&dmin16);
    out[4..16].copy_from_slice(&sc);
    let (qh, qs) = out[16..16 + QK_K / 8 + QK_K / 2].split_at_mut(QK_K / 8);
    qh.fill(0);
    for c in 0..4 {
        for i in 0..32 {
            let (l1, l2) = (l[64 * c + i], l[64 * c + 32 + i]);
            qh[i] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
            qs[32 * c + i] = (l1 & 0x0F) | ((l2 & 0x0F) << 4);
        }
    }
}

/// The shared part of ggml's Q4_K / Q5_K reference quantisers: per 32 a weighted
/// `make_qkx2_quants`, the scales and mins to 6 bits (packed as `get_scale_min_k4` reads them)
/// under f16 super-scales, then every quant recomputed against the coded scales. Returns
/// (d, dmin, packed scales, quants 0..=nmax in element order).
fn quantize_k_asym(
    x: &[f32],
    nmax: i32,
    search: KSearch,
) -> ([u8; 2], [u8; 2], [u8; K_SCALE_SIZE], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut weights = [0f32; Q4K_SUB];
    let mut mins = [0f32; QK_K / Q4K_SUB];
    let mut scales = [0f32; QK_K / Q4K_SUB];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..QK_K / Q4K_SUB {
        let xs = &x[Q4K_SUB * j..Q4K_SUB * (j + 1)];
        let sum_x2: f32 = xs.iter().map(|v| v * v).sum();
        let av_x = (sum_x2 / Q4K_SUB as f32).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(xs, &weights, nmax, &mut l[Q4K_SUB * j..], search);
        scales[j] = s;
        mins[j] = m;
        max_scale = max_scale.max(s);
        max_min = max_min.max(m);
    }
    let inv_scale = if max_scale > 0.0 {
        Q4K_SCALE_MAX / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 {
        Q4K_SCALE_MAX / max_min
    } else {
        0.0
    };
    let mut sc = [0u8; K_SCALE_SIZE];
    for j in 0..QK_K / Q4K_SUB {
        let ls = nearest_int(inv_scale * scales[j]).min(63) as u8;
        let lm = nearest_int(inv_min * mins[j]).min(63) as u8;
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d16 = f32_to_f16(max_scale / Q4K_SCALE_MAX);
    let dmin16 = f32_to_f16(max_min / Q4K_SCALE_MAX);
    for j in 0..QK_K / Q4K_SUB {
        let (s, m) = q4k_scale_min(j, &sc);
        let d = f16_to_f32(d16) * f32::from(s);
        if d == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin16) * f32::from(m);
        for ii in 0..Q4K_SUB {
            let q = nearest_int((x[Q4K_SUB * j + ii] + dm) / d).clamp(0, nmax);
            l[Q4K_SUB * j + ii] = q as u8;
        }
    }
    (d16, dmin16, sc, l)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights: symmetric
/// quants in `-nmax..nmax-1`, scale refined over 18 trial scales. Returns the scale.
fn make_qx_quants(x: &[f32], nmax: i32) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let nm = nmax as f32;
    let trial = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v; // rmse_type 1 weights
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let (sumlx, suml2) = trial(-nm / max);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        let (sumlx, suml2) = trial(-(nm + 0.1 * is as f32) / max);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q6_K quants span −32..=31 (`make_qx_quants(16, 32, ..)`).
const Q6K_NMAX: i32 = 32;
/// ggml maps the largest sub-block scale to −128 (`iscale = -128.f/max_scale`).
const Q6K_SCALE_DIV: f32 = -128.0;

/// ggml's `quantize_row_q6_K_ref` for one super-block.
fn quantize_q6k(x: &[f32], out: &mut [u8]) {
    let mut scales = [0f32; QK_K / Q6K_SUB];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = make_qx_quants(&x[Q6K_SUB * ib..Q6K_SUB * (ib + 1)], Q6K_NMAX);
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = *s;
        }
    }
    out[..size_of::<BlockQ6K>()].fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = Q6K_SCALE_DIV / max_scale;
    let d16 = f32_to_f16(1.0 / iscale);
    let mut sc = [0i8; QK_K / Q6K_SUB];
    for (o, s) in sc.iter_mut().zip(&scales) {
        *o = nearest_int(iscale * s).min(127) as i8;
    }
    let mut l = [0u8; QK_K];
    for j in 0..QK_K / Q6K_SUB {
        let d = f16_to_f32(d16) * f32::from(sc[j]);
        if d == 0.0 {
            // ggml leaves these quants at whatever make_qx_quants wrote; any value decodes to
            // 0 here because the scale is 0, so the offset code (0) is used.
            l[Q6K_SUB * j..Q6K_SUB * (j + 1)].fill(Q6K_OFFSET as u8);
            continue;
        }
        for ii in 0..Q6K_SUB {
            let q = nearest_int(x[Q6K_SUB * j + ii] / d).clamp(-Q6K_NMAX, Q6K_NMAX - 1);
            l[Q6K_SUB * j + ii] = (q + Q6K_OFFSET) as u8;
        }
    }
    let (ql, rest) = out.split_at_mut(QK_K / 2);
    let (qh, rest) = rest.split_at_mut(QK_K / 4);
    for n in 0..2 {
        let (j, ql, qh) = (128 * n, &mut ql[64 * n..], &mut qh[32 * n..]);
        for i in 0..32 {
            let (q1, q2, q3, q4) = (l[j + i], l[j + i + 32], l[j + i + 64], l[j + i + 96]);
            ql[i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    for (o, s) in rest[..16].iter_mut().zip(&sc) {
        *o = *s as u8;
    }
    rest[16..18].copy_from_slice(&d16);
}
