//! Small f32 kernels of the decode step that are not GEMVs (norms, RoPE, softmax, SwiGLU),
//! plus row dequantisation for the embedding lookup.

use hipfire_quant::Format;

use crate::ModelError;

/// `out = x / rms(x) * w` (RMSNorm; the sum of squares in f64 so long rows do not drift).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMSNorm in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// Per-position RoPE tables: `cos`/`sin` of `pos * theta_i` for the `rope_dim / 2` pairs.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
    neox: bool,
    rope_dim: usize,
}

impl Rope {
    /// `theta_i = base^(-2i/rope_dim) / factor_i` (factors: llama-3.1 `rope_freqs.weight`).
    pub fn new(rope_dim: usize, base: f64, neox: bool, factors: Option<&[f32]>) -> Rope {
        let inv_freq = (0..rope_dim / 2)
            .map(|i| {
                let f = factors
                    .and_then(|f| f.get(i))
                    .map_or(1.0, |&v| f64::from(v));
                base.powf(-2.0 * i as f64 / rope_dim as f64) / f
            })
            .collect();
        Rope {
            inv_freq,
            neox,
            rope_dim,
        }
    }

    /// Rotate every head of `x` (`n_heads × head_dim`) in place for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.rope_dim / 2;
        let cs: Vec<(f32, f32)> = self
            .inv_freq
            .iter()
            .map(|&f| {
                let a = pos as f64 * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .collect();
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if self.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}

/// Softmax in place (max-subtracted). The exponentials go through [`exp_nonpos`] and the sum
/// through [`DOT_LANES`] partial sums, so both loops vectorise (they were libm's scalar `expf`
/// and a serial f64 sum). SmolLM2 with a 1536-token prompt on the 2-core VM, alternating
/// builds: decode 71.5 → 72.9 tok/s, prefill 298.6 → 311.3 (means of 6).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = exp_nonpos(*v - max);
    }
    let inv = 1.0 / sum_f32(x);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `log2(e)`.
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// Below this `exp_nonpos` returns 0: e^-87 ≈ 1.6e-38 is at the bottom of f32's normal range,
/// and against a softmax maximum of e^0 = 1 it is nothing.
const EXP_FLOOR: f32 = -87.0;
/// 1.5·2^23: adding it rounds an f32 of magnitude < 2^22 to an integer (ties to even) without
/// `roundss`, which baseline x86-64 lacks (`f32::round` would be a libm call per element).
const ROUND_MAGIC: f32 = 12_582_912.0;
/// ln 2 split for Cody–Waite reduction: `LN2_HI` has 9 significant bits, so `n · LN2_HI` is
/// exact for |n| ≤ 127 and `x − n·ln 2` keeps its low bits (a plain `x · log2(e)` loses ~5e-6
/// of relative accuracy at x = −80 to the rounding of the product).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor coefficients of e^r, `1 / i!` for i = 7..0, on |r| ≤ ln2 / 2: the first term left
/// out, 0.347^8 / 8!, is ≈ 5e-9, below f32's rounding.
const EXP_POLY: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// e^x for x ≤ 0, branch-free so that a loop over it vectorises: x = n·ln 2 + r with n an
/// integer and |r| ≤ ln2 / 2, e^r by a polynomial, 2^n by writing the exponent field. Within a
/// few ulp of `exp` down to [`EXP_FLOOR`] (9.6e-8 relative at worst against f64 in the test), 0
/// below it.
#[inline(always)]
pub fn exp_nonpos(x: f32) -> f32 {
    let below = x < EXP_FLOOR;
    let x = x.max(EXP_FLOOR);
    let n = (x * LOG2_E + ROUND_MAGIC) - ROUND_MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p * r + c;
    }
    // n ∈ [-126, 0]: a normal exponent.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if below {
        0.0
    } else {
        p * scale
    }
}

/// Σ x in [`DOT_LANES`] interleaved partial sums, then those in order (vectorises; see [`dot`]).
fn sum_f32(x: &[f32]) -> f32 {
    let split = x.len() / DOT_LANES * DOT_LANES;
    let mut acc = [0f32; DOT_LANES];
    for c in x[..split].chunks_exact(DOT_LANES) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + x[split..].iter().sum::<f32>()
}

/// Partial sums of [`dot`]: a fixed order LLVM turns into SIMD lanes (an iterator `sum` is a
/// serial chain of adds it may not reorder, which left attention scalar).
const DOT_LANES: usize = 16;

/// `a · b` in f32, summed in [`DOT_LANES`] interleaved partial sums, then those in order.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let split = a.len() / DOT_LANES * DOT_LANES;
    let mut acc = [0f32; DOT_LANES];
    for (x, y) in a[..split]
        .chunks_exact(DOT_LANES)
        .zip(b[..split].chunks_exact(DOT_LANES))
    {
        for i in 0..DOT_LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in a[split..].iter().zip(&b[split..]) {
        s += x * y;
    }
    s
}

/// One attention head at one query position over `n_pos` cached positions: scores
/// `q·k_t · scale`, softmax, `out = Σ_t p_t v_t`. `kc`/`vc` hold rows of `kvd` values (one per
/// position); this head's part of a row starts at `off` and is `q.len()` long. `scores` is
/// scratch.
#[allow(clippy::too_many_arguments)] // one head's operands
pub fn attend(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kvd: usize,
    off: usize,
    n_pos: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    scores.clear();
    scores.extend((0..n_pos).map(|t| dot(q, &kc[t * kvd + off..t * kvd + off + hd]) * scale));
    softmax(scores);
    out.fill(0.0);
    for (t, &p) in scores.iter().enumerate() {
        let vt = &vc[t * kvd + off..t * kvd + off + hd];
        out.iter_mut().zip(vt).for_each(|(o, &v)| *o += p * v);
    }
}

/// `gate = silu(gate) * up` (SwiGLU).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Dequantise one row of `k` elements into `out` through hipfire-quant.
pub fn dequantize_row(fmt: Format, bytes: &[u8], out: &mut [f32]) -> Result<(), ModelError> {
    hipfire_quant::dequantize_row(fmt, bytes, out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn attend_matches_an_f64_reference() {
        let mut r = ChaCha8Rng::seed_from_u64(11);
        // Head dims around the lane count (partial chunks), GQA offsets, short and long contexts.
        for (hd, kvd, off, n_pos) in [
            (64usize, 192usize, 128usize, 300usize),
            (17, 34, 17, 5),
            (8, 8, 0, 1),
        ] {
            let q: Vec<f32> = (0..hd).map(|_| r.random_range(-1.0f32..1.0)).collect();
            let kc: Vec<f32> = (0..n_pos * kvd)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect();
            let vc: Vec<f32> = (0..n_pos * kvd)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let mut out = vec![f32::NAN; hd];
            attend(
                &q,
                &kc,
                &vc,
                kvd,
                off,
                n_pos,
                scale,
                &mut Vec::new(),
                &mut out,
            );
            let s: Vec<f64> = (0..n_pos)
                .map(|t| {
                    (0..hd)
                        .map(|i| f64::from(q[i]) * f64::from(kc[t * kvd + off + i]))
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..hd {
                let want: f64 = (0..n_pos)
                    .map(|t| e[t] / z * f64::from(vc[t * kvd + off + i]))
                    .sum();
                let got = f64::from(out[i]);
                assert!(
                    (got - want).abs() < 1e-5,
                    "hd={hd} n_pos={n_pos} i={i}: {got} vs {want}"
                );
            }
            // `dot` alone, against f64, relative to Σ|a·b|.
            let kt = &kc[off..off + hd];
            let want: f64 = q
                .iter()
                .zip(kt)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let l1: f64 = q
                .iter()
                .zip(kt)
                .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                .sum();
            assert!((f64::from(dot(&q, kt)) - want).abs() <= 1e-6 * l1.max(1.0));
        }
    }

    #[test]
    fn rope_matches_f64_rotation_for_both_pairings() {
        let mut r = ChaCha8Rng::seed_from_u64(9);
        let (hd, heads, rope_dim, base) = (16, 3, 12, 10_000.0f64);
        let x: Vec<f32> = (0..hd * heads)
            .map(|_| r.random_range(-1.0f32..1.0))
            .collect();
        for neox in [false, true] {
            let rope = Rope::new(rope_dim, base, neox, None);
            for pos in [0usize, 1, 37, 1000] {
                let mut y = x.clone();
                rope.apply(&mut y, hd, pos);
                for h in 0..heads {
                    let xh = &x[h * hd..(h + 1) * hd];
                    let mut want: Vec<f64> = xh.iter().map(|&v| f64::from(v)).collect();
                    for i in 0..rope_dim / 2 {
                        let th = pos as f64 * base.powf(-2.0 * i as f64 / rope_dim as f64);
                        let (a, b) = if neox {
                            (i, i + rope_dim / 2)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let (x0, x1) = (f64::from(xh[a]), f64::from(xh[b]));
                        want[a] = x0 * th.cos() - x1 * th.sin();
                        want[b] = x0 * th.sin() + x1 * th.cos();
                    }
                    for (g, w) in y[h * hd..(h + 1) * hd].iter().zip(&want) {
                        assert!((f64::from(*g) - w).abs() < 1e-5, "neox {neox} pos {pos}");
                    }
                    // Dims past rope_dim are untouched.
                    assert_eq!(y[h * hd + rope_dim..(h + 1) * hd], xh[rope_dim..]);
                }
            }
        }
    }

    /// The softmax's exponential against f64 `exp`, over its whole input range and past it.
    #[test]
    fn exp_nonpos_matches_f64_exp() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -87.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpos(x));
            worst = worst.max((got - want).abs() / want);
            x -= 0.000_97;
        }
        assert!(worst < 3e-7, "max relative error {worst:e}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        for x in [-87.5f32, -100.0, -1e30, f32::NEG_INFINITY] {
            assert_eq!(exp_nonpos(x), 0.0, "{x}");
        }
    }

    #[test]
    fn rms_norm_softmax_swiglu_match_f64() {
        let mut r = ChaCha8Rng::seed_from_u64(10);
        let x: Vec<f32> = (0..576).map(|_| r.random_range(-3.0f32..3.0)).collect();
        let w: Vec<f32> = (0..576).map(|_| r.random_range(0.5f32..1.5)).collect();
        let mut out = vec![f32::NAN; 576];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 576.0;
        for i in 0..576 {
            let want = f64::from(x[i]) / (ms + 1e-5).sqrt() * f64::from(w[i]);
            assert!((f64::from(out[i]) - want).abs() < 1e-5 * want.abs().max(1.0));
        }
        let mut s = x[..50].to_vec();
        softmax(&mut s);
        let z: f64 = x[..50].iter().map(|&v| f64::from(v).exp()).sum();
        for i in 0..50 {
            assert!((f64::from(s[i]) - f64::from(x[i]).exp() / z).abs() < 1e-6);
        }
        let mut g = x[..64].to_vec();
        swiglu(&mut g, &w[..64]);
        for i in 0..64 {
            let a = f64::from(x[i]);
            let want = a / (1.0 + (-a).exp()) * f64::from(w[i]);
            assert!((f64::from(g[i]) - want).abs() < 1e-5);
        }
    }
}
