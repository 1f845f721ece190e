//! Scalar reference row dots. Safe code; the SIMD tiers must agree with these within the
//! bounds stated in `tests/formats.rs`.

use crate::act::{iq4xs_pos, k16_chunk_pos, Q8x32, IQ4XS_ACT_SPAN, K16_CHUNK, Q4K_ACT_ORDER, Q8K};
use crate::formats::float::bf16_to_f32;
use crate::formats::hfq::{BlockHfq4G256, HFQ_GROUP};
use crate::formats::iq4::{BlockIq4Nl, BlockIq4Xs, IQ4XS_SCALE_OFFSET};
use crate::formats::kquant::{
    q4k_scale_min, BlockQ4K, BlockQ5K, BlockQ6K, K_SCALE_SIZE, Q4K_SUB, Q6K_OFFSET, Q6K_SUB, QK_K,
};
use crate::formats::kquant_low::{q3k_scales, BlockQ2K, BlockQ3K, Q3K_OFFSET, Q3K_SCALE_OFFSET};
use crate::formats::legacy::{
    nibble, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, Q4_0_OFFSET, Q5_0_OFFSET, QK,
};
use crate::formats::mxfp4::{e8m0_half, BlockMxfp4};
use crate::formats::{arr, f16_to_f32};
use std::mem::size_of;

/// F32 row · x.
pub(crate) fn dot_f32_f32_scalar(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(4)
        .zip(x)
        .map(|(w, &x)| f64::from(f32::from_le_bytes(arr(w))) * f64::from(x))
        .sum::<f64>() as f32
}

/// F16 row · x.
pub(crate) fn dot_f16_f32_scalar(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(2)
        .zip(x)
        .map(|(w, &x)| f64::from(f16_to_f32(arr(w))) * f64::from(x))
        .sum::<f64>() as f32
}

/// BF16 row · x.
pub(crate) fn dot_bf16_f32_scalar(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(2)
        .zip(x)
        .map(|(w, &x)| f64::from(bf16_to_f32(arr(w))) * f64::from(x))
        .sum::<f64>() as f32
}

/// Σ over a block of 32: weight code · activation quant.
fn isum32(codes: impl Iterator<Item = i32>, xq: &[i8]) -> i32 {
    codes.zip(xq).map(|(w, &x)| w * i32::from(x)).sum()
}

/// Q8_0 row · q8 activation.
pub(crate) fn dot_q8_0_q8_0_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let mut acc = 0f64;
    for (b, blk) in row.chunks_exact(34).enumerate() {
        let w = BlockQ8_0::read(blk);
        let p = isum32(w.qs.iter().map(|&q| i32::from(q)), &a.qs[QK * b..]);
        acc += f64::from(f16_to_f32(w.d) * a.d[b]) * f64::from(p);
    }
    acc as f32
}

/// Q4_0 row · q8 activation: Σ d·dx·(Σ q·xq − 8·Σxq) (activation permuted per 4 blocks).
pub(crate) fn dot_q4_0_q8_0_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let k = a.qs.len();
    let mut acc = 0f64;
    for (b, blk) in row.chunks_exact(18).enumerate() {
        let w = BlockQ4_0::read(blk);
        let p: i32 = (0..QK)
            .map(|i| {
                let xq = a.qs[crate::act::q4_pos(QK * b + i, k)];
                i32::from(nibble(&w.qs, i)) * i32::from(xq)
            })
            .sum();
        let p = p - Q4_0_OFFSET * a.isum[b];
        acc += f64::from(f16_to_f32(w.d) * a.d[b]) * f64::from(p);
    }
    acc as f32
}

/// Q4_1 row · q8 activation: Σ d·dx·Σ q·xq + m·s with s = dx·Σxq, the sum of the quantised
/// block (ggml's q8_1 `s`; see `act::Q8x32::s`), activation permuted per 4 blocks.
pub(crate) fn dot_q4_1_q8_1_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let k = a.qs.len();
    let mut acc = 0f64;
    for (b, blk) in row.chunks_exact(20).enumerate() {
        let w = BlockQ4_1::read(blk);
        let p: i32 = (0..QK)
            .map(|i| {
                let xq = a.qs[crate::act::q4_pos(QK * b + i, k)];
                i32::from(nibble(&w.qs, i)) * i32::from(xq)
            })
            .sum();
        acc += f64::from(f16_to_f32(w.d) * a.d[b]) * f64::from(p);
        acc += f64::from(f16_to_f32(w.m)) * f64::from(a.s[b]);
    }
    acc as f32
}

/// Q5_0 row · q8 activation: Σ d·dx·(Σ q·xq − 16·Σxq).
pub(crate) fn dot_q5_0_q8_0_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let mut acc = 0f64;
    for (b, blk) in row.chunks_exact(22).enumerate() {
        let w = BlockQ5_0::read(blk);
        let p = isum32(w.codes().iter().map(|&c| i32::from(c)), &a.qs[QK * b..]);
        let p = p - Q5_0_OFFSET * a.isum[b];
        acc += f64::from(f16_to_f32(w.d) * a.d[b]) * f64::from(p);
    }
    acc as f32
}

/// Q5_1 row · q8 activation: Σ d·dx·Σ q·xq + m·s (s = dx·Σxq, as ggml's q8_1).
pub(crate) fn dot_q5_1_q8_1_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let mut acc = 0f64;
    for (b, blk) in row.chunks_exact(24).enumerate() {
        let w = BlockQ5_1::read(blk);
        let p = isum32(w.codes().iter().map(|&c| i32::from(c)), &a.qs[QK * b..]);
        acc += f64::from(f16_to_f32(w.d) * a.d[b]) * f64::from(p);
        acc += f64::from(f16_to_f32(w.m)) * f64::from(a.s[b]);
    }
    acc as f32
}

/// HFQ4G256 row · q8 activation (permuted per 128: evens then odds); the zero term uses the
/// group's sum of the quantised activation (`act::Q8x32::gsum`).
pub(crate) fn dot_hfq4_q8_0_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let mut acc = 0f64;
    for (g, blk) in row.chunks_exact(136).enumerate() {
        let w = BlockHfq4G256::read(blk);
        let (scale, zero) = w.scale_zero();
        let mut inner = 0f64;
        for j in 0..HFQ_GROUP / QK {
            let b = g * HFQ_GROUP / QK + j;
            let p = isum32(
                (0..QK).map(|i| {
                    let pos = j * QK + i;
                    let src = crate::act::act_source(crate::Format::Hfq4G256, pos, HFQ_GROUP);
                    i32::from(w.q(src))
                }),
                &a.qs[QK * b..],
            );
            inner += f64::from(a.d[b]) * f64::from(p);
        }
        acc += f64::from(scale) * inner + f64::from(zero) * f64::from(a.gsum[g]);
    }
    acc as f32
}

/// Q4_K row · q8_K activation: Σ dx·(d·Σ sc_j·P_j − dmin·Σ m_j·S_j).
pub(crate) fn dot_q4k_q8k_scalar(row: &[u8], a: &Q8K) -> f32 {
    let blocks = row.chunks_exact(144).map(|blk| {
        let w = BlockQ4K::read(blk);
        (w.d, w.dmin, w.scales, w.quants())
    });
    dot_k_asym_scalar(blocks, a)
}

/// Q5_K row · q8_K activation: Q4_K's sum with 5-bit quants.
pub(crate) fn dot_q5k_q8k_scalar(row: &[u8], a: &Q8K) -> f32 {
    let blocks = row.chunks_exact(176).map(|blk| {
        let w = BlockQ5K::read(blk);
        (w.d, w.dmin, w.scales, w.quants())
    });
    dot_k_asym_scalar(blocks, a)
}

/// Σ over super-blocks given as (d, dmin, packed scales, quants in element order) of
/// dx·(d·Σ sc_j·P_j − dmin·Σ m_j·S_j), the activation in [`Q4K_ACT_ORDER`].
fn dot_k_asym_scalar(
    blocks: impl Iterator<Item = ([u8; 2], [u8; 2], [u8; K_SCALE_SIZE], [u8; QK_K])>,
    a: &Q8K,
) -> f32 {
    let mut acc = 0f64;
    for (s, (d, dmin, scales, q)) in blocks.enumerate() {
        let xq = &a.qs[QK_K * s..QK_K * (s + 1)];
        let (mut isc, mut imn) = (0i32, 0i32);
        for (t, &j) in Q4K_ACT_ORDER.iter().enumerate() {
            let (sc, m) = q4k_scale_min(j, &scales);
            let p = isum32(
                q[Q4K_SUB * j..Q4K_SUB * (j + 1)]
                    .iter()
                    .map(|&v| i32::from(v)),
                &xq[Q4K_SUB * t..],
            );
            isc += i32::from(sc) * p;
            imn += i32::from(m) * i32::from(a.sums32[8 * s + j]);
        }
        let dx = a.d[s];
        acc += f64::from(f16_to_f32(d) * dx) * f64::from(isc);
        acc -= f64::from(f16_to_f32(dmin) * dx) * f64::from(imn);
    }
    acc as f32
}

/// Q6_K row · q8_K activation: Σ d·dx·Σ_g sc_g·(P_g − 32·S_g).
pub(crate) fn dot_q6k_q8k_scalar(row: &[u8], a: &Q8K) -> f32 {
    let mut acc = 0f64;
    for (s, blk) in row.chunks_exact(210).enumerate() {
        let w = BlockQ6K::read(blk);
        let q = w.quants();
        let xq = &a.qs[QK_K * s..QK_K * (s + 1)];
        let mut isum = 0i32;
        for g in 0..QK_K / Q6K_SUB {
            let p: i32 = (0..Q6K_SUB)
                .map(|l| i32::from(q[Q6K_SUB * g + l]) * i32::from(xq[Q6K_SUB * g + l]))
                .sum();
            let bs = i32::from(a.bsums[16 * s + g]);
            isum += i32::from(w.scales[g]) * (p - Q6K_OFFSET * bs);
        }
        acc += f64::from(f16_to_f32(w.d) * a.d[s]) * f64::from(isum);
    }
    acc as f32
}

/// Σ over the 16 elements of group `g` of code · activation quant, the activation of one
/// super-block (`xq`) in Q3_K / Q2_K's chunk order (`act::K16_ACT_ORDER`).
fn k16_group_dot(codes: &[u8; QK_K], xq: &[i8], g: usize) -> i32 {
    (Q6K_SUB * g..Q6K_SUB * (g + 1))
        .map(|e| {
            let pos = k16_chunk_pos(e / K16_CHUNK) + e % K16_CHUNK;
            i32::from(codes[e]) * i32::from(xq[pos])
        })
        .sum()
}

/// Q3_K row · q8_K activation: Σ d·dx·Σ_g (sc_g − 32)·(P_g − 4·S_g) over groups of 16.
pub(crate) fn dot_q3k_q8k_scalar(row: &[u8], a: &Q8K) -> f32 {
    let mut acc = 0f64;
    for (s, blk) in row.chunks_exact(110).enumerate() {
        let w = BlockQ3K::read(blk);
        let (c, sc) = (w.codes(), q3k_scales(&w.scales));
        let xq = &a.qs[QK_K * s..QK_K * (s + 1)];
        let mut isum = 0i32;
        for (g, &scg) in sc.iter().enumerate() {
            let p = k16_group_dot(&c, xq, g);
            let bs = i32::from(a.bsums[16 * s + g]);
            isum += (i32::from(scg) - Q3K_SCALE_OFFSET) * (p - Q3K_OFFSET * bs);
        }
        acc += f64::from(f16_to_f32(w.d) * a.d[s]) * f64::from(isum);
    }
    acc as f32
}

/// Q2_K row · q8_K activation: Σ dx·(d·Σ_g sc_g·P_g − dmin·Σ_g m_g·S_g) over groups of 16.
pub(crate) fn dot_q2k_q8k_scalar(row: &[u8], a: &Q8K) -> f32 {
    let mut acc = 0f64;
    for (s, blk) in row.chunks_exact(84).enumerate() {
        let w = BlockQ2K::read(blk);
        let c = w.codes();
        let xq = &a.qs[QK_K * s..QK_K * (s + 1)];
        let (mut isc, mut imn) = (0i32, 0i32);
        for g in 0..QK_K / Q6K_SUB {
            let p = k16_group_dot(&c, xq, g);
            isc += i32::from(w.scales[g] & 0x0F) * p;
            imn += i32::from(w.scales[g] >> 4) * i32::from(a.bsums[16 * s + g]);
        }
        let dx = a.d[s];
        acc += f64::from(f16_to_f32(w.d) * dx) * f64::from(isc);
        acc -= f64::from(f16_to_f32(w.dmin) * dx) * f64::from(imn);
    }
    acc as f32
}

/// IQ4_NL row · q8 activation: Σ d·dx·Σ table(q)·xq.
pub(crate) fn dot_iq4nl_q8_0_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let mut acc = 0f64;
    for (b, blk) in row.chunks_exact(18).enumerate() {
        let w = BlockIq4Nl::read(blk);
        let p = isum32(w.values().iter().map(|&v| i32::from(v)), &a.qs[QK * b..]);
        acc += f64::from(f16_to_f32(w.d) * a.d[b]) * f64::from(p);
    }
    acc as f32
}

/// IQ4_XS row · q8_K activation: Σ d·dx·Σ_ib (sc_ib − 32)·Σ table(q)·xq over sub-blocks of 32
/// (the activation in [`iq4xs_pos`] order per span).
pub(crate) fn dot_iq4xs_q8k_scalar(row: &[u8], a: &Q8K) -> f32 {
    let mut acc = 0f64;
    for (s, blk) in row.chunks_exact(136).enumerate() {
        let w = BlockIq4Xs::read(blk);
        let (v, sc) = (w.values(), w.scale_codes());
        let xq = &a.qs[QK_K * s..QK_K * (s + 1)];
        let mut isum = 0i32;
        for (ib, &c) in sc.iter().enumerate() {
            let p: i32 = (QK * ib..QK * (ib + 1))
                .map(|e| {
                    let pos = e - e % IQ4XS_ACT_SPAN + iq4xs_pos(e % IQ4XS_ACT_SPAN);
                    i32::from(v[e]) * i32::from(xq[pos])
                })
                .sum();
            isum += (i32::from(c) - IQ4XS_SCALE_OFFSET) * p;
        }
        acc += f64::from(f16_to_f32(w.d) * a.d[s]) * f64::from(isum);
    }
    acc as f32
}

/// MXFP4 row · q8 activation: Σ 2^(e − 128)·dx·Σ table(q)·xq (ggml's `vec_dot_mxfp4_q8_0`).
pub(crate) fn dot_mxfp4_q8_0_scalar(row: &[u8], a: &Q8x32) -> f32 {
    let mut acc = 0f64;
    for (b, blk) in row.chunks_exact(size_of::<BlockMxfp4>()).enumerate() {
        let w = BlockMxfp4::read(blk);
        let p = isum32(w.values().iter().map(|&v| i32::from(v)), &a.qs[QK * b..]);
        acc += f64::from(e8m0_half(w.e) * a.d[b]) * f64::from(p);
    }
    acc as f32
}
