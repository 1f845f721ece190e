//! Small f32 kernels of the decode step that are not GEMVs (norms, RoPE, softmax, SwiGLU),
//! plus row dequantisation for the embedding lookup.

use half::f16;
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

pub use crate::rope::Rope;

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

/// One attention head's view of a layer's K/V cache: rows of `kvd` values, one per position,
/// the first `n_pos` of them used; the head's part of a row starts at `off`.
#[derive(Debug, Clone, Copy)]
pub struct HeadCache<'a, T> {
    /// Keys.
    pub k: &'a [T],
    /// Values.
    pub v: &'a [T],
    /// Values per row (every KV head's).
    pub kvd: usize,
    /// This head's first value in a row.
    pub off: usize,
    /// Positions attended to.
    pub n_pos: usize,
}

impl<T> HeadCache<'_, T> {
    /// Whether `k` and `v` hold this head's `hd` values at every attended position.
    fn covers(&self, hd: usize) -> bool {
        let need = self
            .n_pos
            .checked_sub(1)
            .map_or(0, |last| last * self.kvd + self.off + hd);
        self.k.len() >= need && self.v.len() >= need
    }
}

/// One attention head at one query position over `n_pos` cached positions: scores
/// `q·k_t · scale`, softmax, `out = Σ_t p_t v_t`, over `cache` (f16 in the decoder, as
/// llama.cpp keeps its cache by default); this head's part of a row is `q.len()` long. `scores`
/// is scratch. On CPUs with AVX2, FMA and F16C the whole
/// head runs in one SIMD function (hardware f16 conversion); elsewhere in portable code.
pub fn attend<T: CacheValue>(
    q: &[f32],
    cache: HeadCache<'_, T>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    #[cfg(target_arch = "x86_64")]
    if hd % F16C_LANES == 0 && out.len() == hd && cache.covers(hd) && has_f16c() {
        // SAFETY: AVX2/FMA/F16C were detected, the slices cover every row read and `out` is
        // `hd` long (checked just above), and `hd` is a multiple of the lanes.
        unsafe { attend_f16c(q, cache, scale, scores, out) };
        return;
    }
    attend_portable(q, cache, scale, scores, out);
}

/// [`attend`] without SIMD intrinsics (CPUs without F16C, head sizes that are not a multiple of
/// 8).
fn attend_portable<T: CacheValue>(
    q: &[f32],
    cache: HeadCache<'_, T>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let HeadCache {
        k: kc,
        v: vc,
        kvd,
        off,
        n_pos,
    } = cache;
    let hd = q.len();
    scores.clear();
    scores.extend((0..n_pos).map(|t| {
        let kt = &kc[t * kvd + off..t * kvd + off + hd];
        let mut acc = [0f32; DOT_LANES];
        for (i, (&a, &b)) in q.iter().zip(kt).enumerate() {
            acc[i % DOT_LANES] += a * b.value();
        }
        acc.iter().sum::<f32>() * scale
    }));
    softmax(scores);
    out.fill(0.0);
    for (t, &p) in scores.iter().enumerate() {
        let vt = &vc[t * kvd + off..t * kvd + off + hd];
        out.iter_mut()
            .zip(vt)
            .for_each(|(o, &v)| *o += p * v.value());
    }
}

/// A K/V cache element: f32, or f16 (half the bytes; converted by F16C on the SIMD path).
pub trait CacheValue: Copy + Send + Sync {
    /// As f32.
    fn value(self) -> f32;
    /// Eight consecutive values from `p`, as f32 lanes.
    ///
    /// # Safety
    /// Eight values are readable at `p`; the CPU has AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl CacheValue for f32 {
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: forwarded from the contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl CacheValue for f16 {
    #[inline(always)]
    fn value(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: forwarded from the contract (16 bytes readable, F16C present).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

/// f32 lanes of one 256-bit vector: the F16C path needs `head_dim` to be a multiple of it.
const F16C_LANES: usize = 8;
/// Cached positions whose scores the F16C path computes together: independent FMA chains, so
/// the dot's latency (head_dim / 8 dependent FMAs per position) overlaps.
const F16C_POSITIONS: usize = 4;
/// Output lanes the F16C path keeps in registers while it sums `p_t · v_t` (64 values of the
/// head per pass; 128-wide heads take two passes).
const F16C_OUT_VECTORS: usize = 8;

/// Whether the CPU has AVX2, FMA and F16C, detected once.
#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// [`attend`] with hardware f16 conversion.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `q.len()` is a multiple of [`F16C_LANES`]; `kc` and `vc`
/// hold `(n_pos - 1) · kvd + off + q.len()` values at least; `out.len() == q.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_f16c<T: CacheValue>(
    q: &[f32],
    cache: HeadCache<'_, T>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (hd, kvd, off, n_pos) = (q.len(), cache.kvd, cache.off, cache.n_pos);
    let vecs = hd / F16C_LANES;
    let (qp, kp, vp) = (q.as_ptr(), cache.k.as_ptr(), cache.v.as_ptr());
    // SAFETY (every load below): row `t` of the cache, this head's part, is `off + t·kvd ..
    // off + t·kvd + hd` with t < n_pos, inside `kc`/`vc` by the contract; `c < vecs` keeps each
    // 8-value load inside the head; `q` and `out` are `hd` long.
    let ld_h =
        |base: *const T, t: usize, c: usize| T::load8(base.add(t * kvd + off + c * F16C_LANES));
    let hsum = |v: __m256| {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    };
    scores.clear();
    scores.reserve(n_pos);
    let mut t = 0;
    while t + F16C_POSITIONS <= n_pos {
        let mut acc = [_mm256_setzero_ps(); F16C_POSITIONS];
        for c in 0..vecs {
            let qv = _mm256_loadu_ps(qp.add(c * F16C_LANES));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, ld_h(kp, t + j, c), *a);
            }
        }
        scores.extend(acc.iter().map(|&a| hsum(a) * scale));
        t += F16C_POSITIONS;
    }
    while t < n_pos {
        let mut a = _mm256_setzero_ps();
        for c in 0..vecs {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(c * F16C_LANES)), ld_h(kp, t, c), a);
        }
        scores.push(hsum(a) * scale);
        t += 1;
    }
    softmax(scores);
    let op = out.as_mut_ptr();
    for c0 in (0..vecs).step_by(F16C_OUT_VECTORS) {
        let n = (vecs - c0).min(F16C_OUT_VECTORS);
        let mut acc = [_mm256_setzero_ps(); F16C_OUT_VECTORS];
        for (t, &p) in scores.iter().enumerate() {
            let pv = _mm256_set1_ps(p);
            for (i, a) in acc.iter_mut().enumerate().take(n) {
                *a = _mm256_fmadd_ps(pv, ld_h(vp, t, c0 + i), *a);
            }
        }
        for (i, a) in acc.iter().enumerate().take(n) {
            _mm256_storeu_ps(op.add((c0 + i) * F16C_LANES), *a);
        }
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

    type AttendFn = fn(&[f32], HeadCache<'_, f16>, f32, &mut Vec<f32>, &mut [f32]);

    #[test]
    fn attend_matches_an_f64_reference() {
        let mut r = ChaCha8Rng::seed_from_u64(11);
        // Head dims around the lane count (partial chunks; 128 takes two output passes on the
        // F16C path), GQA offsets, contexts that are and are not a multiple of 4 positions.
        for (hd, kvd, off, n_pos) in [
            (64usize, 192usize, 128usize, 300usize),
            (128, 256, 128, 7),
            (17, 34, 17, 5),
            (8, 8, 0, 1),
        ] {
            let q: Vec<f32> = (0..hd).map(|_| r.random_range(-1.0f32..1.0)).collect();
            let kc: Vec<f16> = (0..n_pos * kvd)
                .map(|_| f16::from_f32(r.random_range(-1.0f32..1.0)))
                .collect();
            let vc: Vec<f16> = (0..n_pos * kvd)
                .map(|_| f16::from_f32(r.random_range(-1.0f32..1.0)))
                .collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let s: Vec<f64> = (0..n_pos)
                .map(|t| {
                    (0..hd)
                        .map(|i| f64::from(q[i]) * f64::from(kc[t * kvd + off + i].to_f32()))
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            // The dispatching entry (F16C where the CPU has it) and the portable code.
            for (path, run) in [
                ("attend", attend as AttendFn),
                ("portable", attend_portable as AttendFn),
            ] {
                let mut out = vec![f32::NAN; hd];
                let cache = HeadCache {
                    k: &kc,
                    v: &vc,
                    kvd,
                    off,
                    n_pos,
                };
                run(&q, cache, scale, &mut Vec::new(), &mut out);
                for i in 0..hd {
                    let want: f64 = (0..n_pos)
                        .map(|t| e[t] / z * f64::from(vc[t * kvd + off + i].to_f32()))
                        .sum();
                    let got = f64::from(out[i]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{path} hd={hd} n_pos={n_pos} i={i}: {got} vs {want}"
                    );
                }
            }
            let q32: Vec<f32> = kc[off..off + hd].iter().map(|v| v.to_f32()).collect();
            // `dot` alone, against f64, relative to Σ|a·b|.
            let kt = &q32[..];
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
