//! [`ActivationBuf`]: the activation `x` in the form the row dots want.
//!
//! Block formats get `x` quantised to 8 bits (see the crate docs for why and for the error
//! bound), float formats get it as f32. Some formats also get `x` permuted inside a block so the
//! SIMD dots load weights and activation with plain contiguous loads:
//! - HFQ4G256 stores element 2i in a low nibble and 2i + 1 in a high one, so per 128 elements
//!   the activation is stored as [the 64 even elements, the 64 odd elements];
//! - Q4_K's 64-byte load (two 32-byte chunks) yields sub-blocks (0, 2) from the low nibbles and
//!   (1, 3) from the high ones, so per 256 the activation stores sub-blocks in
//!   [`Q4K_ACT_ORDER`].

use crate::formats::hfq::HFQ_GROUP;
use crate::formats::kquant::{Q4K_SUB, Q6K_SUB, QK_K};
use crate::formats::legacy::QK;
use crate::{Format, QuantError};

/// Largest |q| of the 8-bit activation (symmetric, like ggml's q8_0 and q8_K).
pub(crate) const ACT_QMAX: f32 = 127.0;
/// SIMD lanes of i32/f32 in 256 bits: per activation block the SIMD dots read 8-wide
/// broadcasts of its scale and correction.
pub(crate) const LANES8: usize = 8;
/// HFQ4G256's activation permutation span: one 64-byte load of nibbles covers 128 elements.
pub(crate) const HFQ_PERM_SPAN: usize = 128;
/// Sub-block order of a Q4_K activation super-block (see the module docs).
pub(crate) const Q4K_ACT_ORDER: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// The activation of one GEMV, prepared once and read by every worker (it is `Send + Sync`).
///
/// Build it with [`ActivationBuf::prepare`] for the weight format it will be multiplied with.
#[derive(Debug, Clone)]
pub struct ActivationBuf {
    /// Format the data was laid out for; `gemv_rows` refuses other formats.
    format: Format,
    /// Length of the original `x`.
    k: usize,
    /// The data, in one of three shapes.
    pub(crate) kind: ActKind,
}

/// The three activation shapes.
#[derive(Debug, Clone)]
pub(crate) enum ActKind {
    /// Float formats: x itself.
    F32(Vec<f32>),
    /// Q8_0, Q4_0, Q4_1, HFQ4G256: 8-bit per 32.
    Q8x32(Q8x32),
    /// Q4_K, Q6_K: 8-bit per 256.
    Q8K(Q8K),
}

/// `x` quantised per 32 elements (ggml's q8_0 / q8_1 plus SIMD-friendly extras).
#[derive(Debug, Clone)]
pub(crate) struct Q8x32 {
    /// Quants, in the format's element order (permuted for HFQ4G256).
    pub qs: Vec<i8>,
    /// Scale per block of 32: x ≈ d·q.
    pub d: Vec<f32>,
    /// `d` repeated [`LANES8`] times per block, so a 512-bit dot loads two blocks' scales.
    pub d8: Vec<f32>,
    /// Per block `[-Σq, 0, 0, 0, 0, 0, 0, 0]`: added (shifted) into the integer lanes so the
    /// weight offset of Q4_0 (−8) and the VNNI sign bias of Q8_0 (+128) cancel exactly.
    pub nsum8: Vec<i32>,
    /// Per block Σq, for the scalar reference.
    pub isum: Vec<i32>,
    /// Per block Σx of the unquantised x (summed in f64): Q4_1's `m·Σx` term is exact.
    pub s: Vec<f32>,
    /// Per 256 Σx of the unquantised x (HFQ4G256's `zero·Σx` term); empty for other formats.
    pub gsum: Vec<f32>,
}

/// `x` quantised per 256 elements (ggml's q8_K).
#[derive(Debug, Clone)]
pub(crate) struct Q8K {
    /// Quants; Q4_K's are in [`Q4K_ACT_ORDER`] sub-block order.
    pub qs: Vec<i8>,
    /// Scale per 256.
    pub d: Vec<f32>,
    /// Σq per 16 elements, natural order (Q6_K's −32 offset).
    pub bsums: Vec<i16>,
    /// Σq per 32 elements, natural order (Q4_K's mins).
    pub sums32: Vec<i16>,
}

/// Quantise `src` to `dst` with one symmetric scale; returns (d, Σq).
fn quantise_block(src: &[f32], dst: &mut [i8]) -> (f32, i32) {
    let amax = src.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / ACT_QMAX;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in dst.iter_mut().zip(src) {
        // Half away from zero, as ggml's quantize_row_q8_0; |v·id| <= 127 by construction.
        let q = (v * id).round().clamp(-ACT_QMAX, ACT_QMAX) as i8;
        sum += i32::from(q);
        *o = q;
    }
    (d, sum)
}

/// Exact-ish sum: f64 accumulation, one rounding.
fn sum_f64(v: &[f32]) -> f32 {
    v.iter().map(|&a| f64::from(a)).sum::<f64>() as f32
}

/// Source index (within its block) of activation position `p` for `fmt`.
pub(crate) fn act_source(fmt: Format, p: usize) -> usize {
    match fmt {
        Format::Hfq4G256 => {
            let (base, r) = (p - p % HFQ_PERM_SPAN, p % HFQ_PERM_SPAN);
            let half = HFQ_PERM_SPAN / 2;
            base + if r < half { 2 * r } else { 2 * (r - half) + 1 }
        }
        Format::Q4K => {
            let (base, r) = (p - p % QK_K, p % QK_K);
            base + Q4K_ACT_ORDER[r / Q4K_SUB] * Q4K_SUB + r % Q4K_SUB
        }
        _ => p,
    }
}

impl ActivationBuf {
    /// Prepare `x` for a GEMV against `fmt` weights with `k = x.len()`.
    ///
    /// Errors: `x.len()` not a positive multiple of the block, or a non-finite value in `x`.
    pub fn prepare(fmt: Format, x: &[f32]) -> Result<ActivationBuf, QuantError> {
        let k = x.len();
        fmt.row_bytes(k)?;
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(QuantError::NonFinite {
                format: fmt,
                what: "activation value",
                block: i / fmt.block_elems(),
            });
        }
        let kind = match fmt {
            Format::F32 | Format::F16 | Format::BF16 => ActKind::F32(x.to_vec()),
            Format::Q8_0 | Format::Q4_0 | Format::Q4_1 | Format::Hfq4G256 => {
                ActKind::Q8x32(Self::q8x32(fmt, x))
            }
            Format::Q4K | Format::Q6K => ActKind::Q8K(Self::q8k(fmt, x)),
        };
        Ok(ActivationBuf {
            format: fmt,
            k,
            kind,
        })
    }

    fn q8x32(fmt: Format, x: &[f32]) -> Q8x32 {
        let k = x.len();
        let nb = k / QK;
        let xp: Vec<f32> = (0..k).map(|p| x[act_source(fmt, p)]).collect();
        let mut a = Q8x32 {
            qs: vec![0; k],
            d: Vec::with_capacity(nb),
            d8: Vec::with_capacity(nb * LANES8),
            nsum8: Vec::with_capacity(nb * LANES8),
            isum: Vec::with_capacity(nb),
            s: Vec::with_capacity(nb),
            gsum: Vec::new(),
        };
        for (b, (src, dst)) in xp
            .chunks_exact(QK)
            .zip(a.qs.chunks_exact_mut(QK))
            .enumerate()
        {
            let (d, sum) = quantise_block(src, dst);
            a.d.push(d);
            a.d8.extend_from_slice(&[d; LANES8]);
            a.nsum8.push(-sum);
            a.nsum8.extend_from_slice(&[0; LANES8 - 1]);
            a.isum.push(sum);
            a.s.push(sum_f64(&xp[b * QK..(b + 1) * QK]));
        }
        if fmt == Format::Hfq4G256 {
            a.gsum = x.chunks_exact(HFQ_GROUP).map(sum_f64).collect();
        }
        a
    }

    fn q8k(fmt: Format, x: &[f32]) -> Q8K {
        let k = x.len();
        let nsb = k / QK_K;
        let mut a = Q8K {
            qs: vec![0; k],
            d: Vec::with_capacity(nsb),
            bsums: Vec::with_capacity(nsb * QK_K / Q6K_SUB),
            sums32: Vec::with_capacity(nsb * QK_K / Q4K_SUB),
        };
        let mut natural = [0i8; QK_K];
        for (src, dst) in x.chunks_exact(QK_K).zip(a.qs.chunks_exact_mut(QK_K)) {
            let (d, _) = quantise_block(src, &mut natural);
            a.d.push(d);
            for g in natural.chunks_exact(Q6K_SUB) {
                a.bsums.push(g.iter().map(|&q| i16::from(q)).sum());
            }
            for g in natural.chunks_exact(Q4K_SUB) {
                a.sums32.push(g.iter().map(|&q| i16::from(q)).sum());
            }
            for (p, o) in dst.iter_mut().enumerate() {
                *o = natural[act_source(fmt, p)];
            }
        }
        a
    }

    /// The weight format this activation was prepared for.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Length of the original activation.
    pub fn k(&self) -> usize {
        self.k
    }

    /// True if and only if `x` was quantised to 8 bits (every block format).
    pub fn is_quantised(&self) -> bool {
        !matches!(self.kind, ActKind::F32(_))
    }
}

// Workers on many threads read one prepared activation.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ActivationBuf>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn permutations_are_bijections_within_their_span() {
        for fmt in Format::ALL {
            let k = 512;
            let mut seen = vec![false; k];
            for p in 0..k {
                let s = act_source(fmt, p);
                assert!(s < k && !seen[s], "{fmt}: position {p} → {s} repeats");
                // Never leaves its 256 block: per-256 scales and sums stay valid.
                assert_eq!(s / QK_K, p / QK_K, "{fmt}");
                seen[s] = true;
            }
        }
    }

    #[test]
    fn q8_blocks_reconstruct_within_half_a_step() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let x: Vec<f32> = (0..1024)
            .map(|i| rng.random_range(-3.0f32..3.0) * (1 + i % 5) as f32)
            .collect();
        for fmt in [Format::Q4_0, Format::Hfq4G256] {
            let a = ActivationBuf::prepare(fmt, &x).unwrap();
            let ActKind::Q8x32(q) = &a.kind else {
                panic!("{fmt} should be q8x32")
            };
            for p in 0..x.len() {
                let b = p / QK;
                let got = q.d[b] * f32::from(q.qs[p]);
                assert!(
                    (got - x[act_source(fmt, p)]).abs() <= q.d[b] * 0.5001,
                    "{fmt} p={p}"
                );
                assert_eq!(q.d8[LANES8 * b], q.d[b]);
                assert_eq!(q.nsum8[LANES8 * b], -q.isum[b]);
                assert_eq!(q.nsum8[LANES8 * b + 1], 0);
            }
            for b in 0..x.len() / QK {
                let s: i32 = q.qs[QK * b..QK * (b + 1)]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                assert_eq!(s, q.isum[b]);
            }
        }
    }

    #[test]
    fn q8k_sums_match_natural_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let x: Vec<f32> = (0..512).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let a = ActivationBuf::prepare(Format::Q4K, &x).unwrap();
        let ActKind::Q8K(q) = &a.kind else {
            panic!("q4_k should be q8k")
        };
        for s in 0..2 {
            let d = q.d[s];
            for j in 0..QK_K / Q4K_SUB {
                // Natural sub-block j sits at activation position Q4K_ACT_ORDER[j].
                let t = Q4K_ACT_ORDER[j];
                let sum: i16 = q.qs[QK_K * s + Q4K_SUB * t..][..Q4K_SUB]
                    .iter()
                    .map(|&v| i16::from(v))
                    .sum();
                assert_eq!(sum, q.sums32[8 * s + j]);
                let xs = &x[QK_K * s + Q4K_SUB * j..][..Q4K_SUB];
                let qs = &q.qs[QK_K * s + Q4K_SUB * t..][..Q4K_SUB];
                for (xv, qv) in xs.iter().zip(qs) {
                    assert!((d * f32::from(*qv) - xv).abs() <= d * 0.5001);
                }
            }
        }
    }
}
