//! [`ActivationBuf`]: the activation `x` in the form the row dots want.
//!
//! Block formats get `x` quantised to 8 bits (see the crate docs for why and for the error
//! bound), float formats get it as f32. Some formats also get `x` permuted inside a block so the
//! SIMD dots load weights and activation with plain contiguous loads:
//! - HFQ4G256 stores element 2i in a low nibble and 2i + 1 in a high one, so per 128 elements
//!   the activation is stored as [the 64 even elements, the 64 odd elements];
//! - Q4_K's 64-byte load (two 32-byte chunks) yields sub-blocks (0, 2) from the low nibbles and
//!   (1, 3) from the high ones, so per 256 the activation stores sub-blocks in
//!   [`Q4K_ACT_ORDER`];
//! - Q3_K's and Q2_K's 64-byte load of 2-bit planes holds, per shift, 32-element chunks j and
//!   j + 4 of the super-block, so per 256 the activation stores chunks in [`K16_ACT_ORDER`];
//! - IQ4_XS's 64-byte load of nibbles covers four 32-element sub-blocks, the low nibbles being
//!   each one's first 16 elements and the high nibbles its last 16, so per 128 elements the
//!   activation stores [first halves of sub-blocks 0..4, second halves of sub-blocks 0..4]
//!   ([`IQ4XS_ACT_SPAN`]): each 128-bit lane of a product then holds one sub-block;
//! - Q4_0 and Q4_1 store element j of a block in the low nibble of byte j and element j + 16
//!   in the high one; the 512-bit dot loads the 16 nibble bytes of four blocks into one vector, so per
//!   four blocks the activation is stored as [first halves of blocks 0..4, second halves of
//!   blocks 0..4] ([`Q4_0_ACT_GROUP`] elements; a trailing partial group stays in order).
//!   Their activation is quantised per natural block *before* this permutation, so each
//!   weight block still meets one activation scale; HFQ4G256's is quantised after (its weight
//!   scale spans the whole 256-group, so any 32 activation elements may share a scale).

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
/// Elements of one Q4_0 / Q4_1 activation group: four blocks, one 512-bit load of nibbles.
pub(crate) const Q4_0_ACT_GROUP: usize = 4 * QK;
/// Sub-block order of a Q4_K activation super-block (see the module docs).
pub(crate) const Q4K_ACT_ORDER: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];
/// 32-element chunk order of a Q3_K / Q2_K activation super-block (see the module docs).
pub(crate) const K16_ACT_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
/// Elements of one [`K16_ACT_ORDER`] chunk.
pub(crate) const K16_CHUNK: usize = 32;

/// Activation position, inside its super-block, of chunk `j`'s element 0 for Q3_K / Q2_K (the
/// inverse of [`K16_ACT_ORDER`]).
pub(crate) const fn k16_chunk_pos(j: usize) -> usize {
    K16_CHUNK * (2 * (j % 4) + j / 4)
}

/// IQ4_XS's activation permutation span: one 64-byte load of nibbles covers 128 elements.
pub(crate) const IQ4XS_ACT_SPAN: usize = 128;
/// Elements of an IQ4_XS sub-block half (one nibble plane of its 16 bytes).
const IQ4XS_HALF: usize = QK / 2;

/// Activation position of element `r` (< [`IQ4XS_ACT_SPAN`]) of an IQ4_XS span: sub-block
/// `r / 32`'s half `(r % 32) / 16` goes to half `(r % 32) / 16` of the span, slot `r / 32`.
pub(crate) const fn iq4xs_pos(r: usize) -> usize {
    let (sb, half, j) = (r / QK, (r % QK) / IQ4XS_HALF, r % IQ4XS_HALF);
    (IQ4XS_ACT_SPAN / 2) * half + IQ4XS_HALF * sb + j
}

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
    /// K-quants: 8-bit per 256.
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
    /// Per block `[−off·Σq, 0, …]` ([`corr_lanes`] lanes): the initial value of the block's
    /// integer lanes, so the weight offset of Q4_0 (off = 8) and the VNNI sign bias of Q8_0
    /// (off = 128) cancel exactly. Empty for formats without an offset.
    pub corr: Vec<i32>,
    /// Per block Σq, for the scalar reference.
    pub isum: Vec<i32>,
    /// Per block `d·Σq`, the sum of the *quantised* x (ggml's q8_1 `s`), for the `m·Σx` term
    /// of Q4_1 and Q5_1. Not the exact Σx on purpose: with the quantised sum the row dot is
    /// exactly `Σ w_i·x̂_i` (dequantised weights times the quantised activation), so its error
    /// is `Σ w_i·(x̂_i − x_i)` with the weights centred on zero; with the exact Σx the min term
    /// drops out of that cancellation and the error grows to `Σ (w_i − m)·(x̂_i − x_i)`
    /// (`tests/min_term.rs`, k = 4096, 2048 rows: 2.07× the rms error on Q4_1).
    pub s: Vec<f32>,
    /// Per 256 `Σ_b d_b·Σq_b` (summed in f64), the sum of the quantised x for HFQ4G256's
    /// `zero·Σx` term (why quantised: see `s`); empty for other formats.
    pub gsum: Vec<f32>,
}

/// `x` quantised per 256 elements (ggml's q8_K).
#[derive(Debug, Clone)]
pub(crate) struct Q8K {
    /// Quants; Q4_K's and Q5_K's are in [`Q4K_ACT_ORDER`] sub-block order, Q3_K's and Q2_K's
    /// in [`K16_ACT_ORDER`] chunk order, IQ4_XS's in
    /// [`iq4xs_pos`] order per [`IQ4XS_ACT_SPAN`].
    pub qs: Vec<i8>,
    /// Scale per 256.
    pub d: Vec<f32>,
    /// Σq per 16 elements, natural order (Q6_K's −32 and Q3_K's −4 offset, Q2_K's mins).
    pub bsums: Vec<i16>,
    /// Σq per 32 elements, natural order (Q4_K's and Q5_K's mins).
    pub sums32: Vec<i16>,
}

impl Q8K {
    /// Every buffer sized for `k` (a multiple of [`QK_K`]), zero: filled block by block.
    pub(crate) fn zeroed(k: usize) -> Q8K {
        Q8K {
            qs: vec![0; k],
            d: vec![0.0; k / QK_K],
            bsums: vec![0; k / Q6K_SUB],
            sums32: vec![0; k / Q4K_SUB],
        }
    }

    /// Each block's parts: its quants, its scale, its Σ per 16 and its Σ per 32.
    fn blocks_mut(
        &mut self,
    ) -> impl Iterator<Item = (&mut [i8], &mut f32, &mut [i16], &mut [i16])> + '_ {
        self.qs
            .chunks_exact_mut(QK_K)
            .zip(self.d.iter_mut())
            .zip(self.bsums.chunks_exact_mut(QK_K / Q6K_SUB))
            .zip(self.sums32.chunks_exact_mut(QK_K / Q4K_SUB))
            .map(|(((qs, d), bsums), sums32)| (qs, d, bsums, sums32))
    }
}

/// Σ per 16 and per 32 of one block's quants in natural order, into that block's `bsums` (16)
/// and `sums32` (8).
fn q8k_block_sums(natural: &[i8], bsums: &mut [i16], sums32: &mut [i16]) {
    for (s, g) in bsums.iter_mut().zip(natural.chunks_exact(Q6K_SUB)) {
        *s = sum16(g);
    }
    // A 32-element sub-block is two 16-element ones (|Σ| ≤ 32·127 fits i16).
    for (s, p) in sums32.iter_mut().zip(bsums.chunks_exact(Q4K_SUB / Q6K_SUB)) {
        *s = p[0] + p[1];
    }
}

/// One q8_K block of `fmt`'s activation from its 256 elements `src`: the quants into `qs` (in
/// `fmt`'s order), the sums into `bsums` (16) and `sums32` (8); returns the scale. The one rule
/// both [`ActivationBuf::prepare`] and a [`crate::SharedActivation`] follow.
pub(crate) fn q8k_block(
    fmt: Format,
    src: &[f32],
    qs: &mut [i8],
    bsums: &mut [i16],
    sums32: &mut [i16],
) -> f32 {
    let mut natural = [0i8; QK_K];
    let (d, _) = quantise_block(src, &mut natural);
    q8k_block_sums(&natural, bsums, sums32);
    place_q8k_block(fmt, &natural, qs);
    d
}

/// One block's quants from element order into `dst`, in `fmt`'s activation order.
fn place_q8k_block(fmt: Format, natural: &[i8], dst: &mut [i8]) {
    if matches!(fmt, Format::Q4K | Format::Q5K) {
        for (t, &j) in Q4K_ACT_ORDER.iter().enumerate() {
            dst[Q4K_SUB * t..Q4K_SUB * (t + 1)]
                .copy_from_slice(&natural[Q4K_SUB * j..Q4K_SUB * (j + 1)]);
        }
    } else if matches!(fmt, Format::Q3K | Format::Q2K) {
        for (t, &j) in K16_ACT_ORDER.iter().enumerate() {
            dst[K16_CHUNK * t..K16_CHUNK * (t + 1)]
                .copy_from_slice(&natural[K16_CHUNK * j..K16_CHUNK * (j + 1)]);
        }
    } else if fmt == Format::Iq4Xs {
        for (e, &v) in natural.iter().enumerate() {
            let base = e - e % IQ4XS_ACT_SPAN;
            dst[base + iq4xs_pos(e % IQ4XS_ACT_SPAN)] = v;
        }
    } else {
        dst.copy_from_slice(natural);
    }
}

/// Elements per scale of the q8_K activation ([`ActivationBuf::from_q8k`]).
pub const Q8K_BLOCK: usize = QK_K;

/// `x` quantised to q8_K in element order: `(qs, d)`, one scale per [`Q8K_BLOCK`]: the rule a
/// quantiser outside this crate (the GPU's, in kernels/flags.cu) must follow bit for bit. Per
/// block, `d = max|x| / 127`, `q = x · (1/d)` rounded to nearest with ties to even (0 when
/// `d = 0`), each step one IEEE f32 operation.
///
/// Errors: a length that is not a positive multiple of the block, or a non-finite value.
pub fn quantise_q8k(x: &[f32]) -> Result<(Vec<i8>, Vec<f32>), QuantError> {
    if x.is_empty() || !x.len().is_multiple_of(QK_K) {
        return Err(QuantError::KNotBlockMultiple {
            format: Format::Q4K,
            k: x.len(),
            block: QK_K,
        });
    }
    if !all_finite(x) {
        let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(QuantError::NonFinite {
            format: Format::Q4K,
            what: "activation value",
            block: i / QK_K,
        });
    }
    let mut qs = vec![0i8; x.len()];
    let d = x
        .chunks_exact(QK_K)
        .zip(qs.chunks_exact_mut(QK_K))
        .map(|(src, dst)| quantise_block(src, dst).0)
        .collect();
    Ok((qs, d))
}

/// Q4_0 code offset (value = d·(q − 8)).
const Q4_0_OFF: i32 = 8;
/// Q5_0 code offset (value = d·(q − 16)).
const Q5_0_OFFSET: i32 = 16;
/// Q8_0 VNNI sign bias: `vpdpbusd` needs unsigned weights, so the dot uses w + 128.
const Q8_0_VNNI_BIAS: i32 = 128;

/// Lanes per block of [`Q8x32::corr`] and the offset it is scaled by: Q4_0's dots put one
/// block in each 128-bit lane (4 × i32), Q8_0's and Q5_0's one block in each 256-bit half
/// (8 × i32).
pub(crate) const fn corr_lanes(fmt: Format) -> (usize, i32) {
    match fmt {
        Format::Q4_0 => (4, Q4_0_OFF),
        Format::Q8_0 => (LANES8, Q8_0_VNNI_BIAS),
        Format::Q5_0 => (LANES8, Q5_0_OFFSET),
        // IQ4_NL's table values are signed, so VNNI biases them by +128 as Q8_0's.
        Format::Iq4Nl => (LANES8, Q8_0_VNNI_BIAS),
        // MXFP4's (doubled) E2M1 values are signed: the 512-bit dots take them plus 12.
        Format::Mxfp4 => (LANES8, crate::formats::mxfp4::MXFP4_BIAS as i32),
        _ => (0, 0),
    }
}

/// Round to nearest (ties to even) for |v| < 2^22 with two adds: baseline x86-64 has no
/// `roundss`, so `f32::round` is a libm call per element.
#[inline(always)]
fn round_fast(v: f32) -> f32 {
    /// 1.5·2^23: adding it pushes the fraction bits out of an f32's mantissa.
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// Quantise `src` to `dst` with one symmetric scale; returns (d, Σq).
///
/// On AVX2 CPUs the work goes to [`simd::quantise_block_avx2`], which computes the same
/// function bit for bit (same scale arithmetic, round-to-nearest-even, no clamp needed); a
/// unit test checks that on random data.
fn quantise_block(src: &[f32], dst: &mut [i8]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    let fits = src.len().is_multiple_of(QK) && dst.len() >= src.len();
    if fits && *HAS_AVX2.get_or_init(|| crate::SimdTier::Avx2.is_supported()) {
        // SAFETY: AVX2/FMA/F16C were detected, and `fits` checked the length contract.
        return unsafe { simd::quantise_block_avx2(src, dst) };
    }
    quantise_block_scalar(src, dst)
}

/// Whether the CPU has the AVX2 tier, detected once.
#[cfg(target_arch = "x86_64")]
static HAS_AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Scale of a block whose largest |x| is `amax`: (d, 1/d or 0).
#[inline(always)]
fn scale_of(amax: f32) -> (f32, f32) {
    let d = amax / ACT_QMAX;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// The portable form of [`quantise_block`].
fn quantise_block_scalar(src: &[f32], dst: &mut [i8]) -> (f32, i32) {
    let mut amax = 0f32;
    for &v in src {
        amax = amax.max(v.abs());
    }
    let (d, id) = scale_of(amax);
    let mut sum = 0i32;
    for (o, &v) in dst.iter_mut().zip(src) {
        // |v·id| <= 127 up to one rounding, which rounds back to 127; the clamp is a guard.
        let q = round_fast(v * id).clamp(-ACT_QMAX, ACT_QMAX) as i32;
        sum += q;
        *o = q as i8;
    }
    (d, sum)
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{scale_of, QK};
    use std::arch::x86_64::*;

    /// AVX2 form of `quantise_block_scalar` for `src.len()` a multiple of 32.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `dst.len() >= src.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantise_block_avx2(src: &[f32], dst: &mut [i8]) -> (f32, i32) {
        debug_assert!(src.len().is_multiple_of(QK) && dst.len() >= src.len());
        let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        let p = src.as_ptr();
        let mut m = _mm256_setzero_ps();
        for i in (0..src.len()).step_by(8) {
            // SAFETY: i + 8 <= src.len().
            m = _mm256_max_ps(
                m,
                _mm256_and_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, absmask),
            );
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let (d, id) = scale_of(_mm_cvtss_f32(m4));
        let idv = _mm256_set1_ps(id);
        // packs interleave 128-bit lanes; this restores element order (4-byte units).
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut sum = _mm256_setzero_si256();
        for b in (0..src.len()).step_by(QK) {
            // SAFETY: b + 32 <= src.len() <= dst.len().
            let q: [__m256i; 4] = std::array::from_fn(|u| unsafe {
                // cvtps rounds to nearest even under the default MXCSR, like round_fast.
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(b + 8 * u)), idv))
            });
            sum = _mm256_add_epi32(
                sum,
                _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])),
            );
            let p16a = _mm256_packs_epi32(q[0], q[1]);
            let p16b = _mm256_packs_epi32(q[2], q[3]);
            let p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order);
            // SAFETY: as above.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(b) as *mut __m256i, p8) };
        }
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
        let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b10_11_00_01));
        (d, _mm_cvtsi128_si32(s4))
    }
}

/// Σ of 16 quants (|Σ| ≤ 16·127), in a form LLVM vectorises.
#[inline(always)]
fn sum16(g: &[i8]) -> i16 {
    let mut acc = [0i16; Q6K_SUB];
    for (a, &q) in acc.iter_mut().zip(g) {
        *a = i16::from(q);
    }
    acc.iter().sum()
}

/// Whether every element is finite, without an early exit, so that it vectorises: the
/// element-wise `position` scan was half of `prepare`'s time (perf on the dev VM, k = 4096:
/// 3.1 µs for Q4_K), and every CPU worker of a split step prepares its own copy.
fn all_finite(x: &[f32]) -> bool {
    const EXP_MASK: u32 = 0x7f80_0000;
    x.chunks(64).all(|c| {
        c.iter().fold(0u32, |acc, v| {
            acc | u32::from(v.to_bits() & EXP_MASK == EXP_MASK)
        }) == 0
    })
}

/// Index in `x` (of length `k`) of the element stored at activation position `p` for `fmt`.
pub(crate) fn act_source(fmt: Format, p: usize, k: usize) -> usize {
    match fmt {
        Format::Hfq4G256 => {
            let (base, r) = (p - p % HFQ_PERM_SPAN, p % HFQ_PERM_SPAN);
            let half = HFQ_PERM_SPAN / 2;
            base + if r < half { 2 * r } else { 2 * (r - half) + 1 }
        }
        Format::Q4K | Format::Q5K => {
            let (base, r) = (p - p % QK_K, p % QK_K);
            base + Q4K_ACT_ORDER[r / Q4K_SUB] * Q4K_SUB + r % Q4K_SUB
        }
        Format::Q3K | Format::Q2K => {
            let (base, r) = (p - p % QK_K, p % QK_K);
            base + K16_ACT_ORDER[r / K16_CHUNK] * K16_CHUNK + r % K16_CHUNK
        }
        Format::Iq4Xs => {
            // Position r of a span: half r / 64, sub-block (r % 64) / 16, element r % 16.
            let (base, r) = (p - p % IQ4XS_ACT_SPAN, p % IQ4XS_ACT_SPAN);
            let half_len = IQ4XS_ACT_SPAN / 2;
            let (half, sb, j) = (r / half_len, (r % half_len) / IQ4XS_HALF, r % IQ4XS_HALF);
            base + QK * sb + IQ4XS_HALF * half + j
        }
        Format::Q4_0 | Format::Q4_1 if p - p % Q4_0_ACT_GROUP + Q4_0_ACT_GROUP <= k => {
            // Position r of a full group: half = r / 64, block = (r % 64) / 16, j = r % 16.
            let (base, r) = (p - p % Q4_0_ACT_GROUP, p % Q4_0_ACT_GROUP);
            let half_len = Q4_0_ACT_GROUP / 2;
            let (half, blk, j) = (r / half_len, (r % half_len) / (QK / 2), r % (QK / 2));
            base + QK * blk + (QK / 2) * half + j
        }
        _ => p,
    }
}

/// Activation position of element `e` of `x` (length `k`) for Q4_0 and Q4_1: the inverse of
/// [`act_source`] (the scalar reference walks weights in element order).
pub(crate) fn q4_pos(e: usize, k: usize) -> usize {
    let base = e - e % Q4_0_ACT_GROUP;
    if base + Q4_0_ACT_GROUP > k {
        return e;
    }
    let (blk, i) = ((e % Q4_0_ACT_GROUP) / QK, e % QK);
    base + (Q4_0_ACT_GROUP / 2) * (i / (QK / 2)) + (QK / 2) * blk + i % (QK / 2)
}

impl ActivationBuf {
    /// Prepare `x` for a GEMV against `fmt` weights with `k = x.len()`.
    ///
    /// Errors: `x.len()` not a positive multiple of the block, or a non-finite value in `x`.
    pub fn prepare(fmt: Format, x: &[f32]) -> Result<ActivationBuf, QuantError> {
        let k = x.len();
        fmt.row_bytes(k)?;
        if !all_finite(x) {
            let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
            return Err(QuantError::NonFinite {
                format: fmt,
                what: "activation value",
                block: i / fmt.block_elems(),
            });
        }
        let kind = match fmt {
            Format::F32 | Format::F16 | Format::BF16 => ActKind::F32(x.to_vec()),
            Format::Q8_0
            | Format::Q4_0
            | Format::Q4_1
            | Format::Hfq4G256
            | Format::Q5_0
            | Format::Q5_1
            | Format::Iq4Nl
            | Format::Mxfp4 => ActKind::Q8x32(Self::q8x32(fmt, x)),
            Format::Q4K | Format::Q6K | Format::Q5K | Format::Q3K | Format::Q2K | Format::Iq4Xs => {
                ActKind::Q8K(Self::q8k(fmt, x))
            }
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
        let (lanes, off) = corr_lanes(fmt);
        let mut a = Q8x32 {
            qs: Vec::new(),
            d: Vec::with_capacity(nb),
            d8: Vec::new(),
            corr: Vec::with_capacity(nb * lanes),
            isum: Vec::with_capacity(nb),
            s: Vec::new(),
            gsum: Vec::new(),
        };
        let mut qs = vec![0i8; k];
        let push = |a: &mut Q8x32, d: f32, sum: i32| {
            a.d.push(d);
            a.isum.push(sum);
            if lanes > 0 {
                a.corr.push(-off * sum);
                a.corr.extend(std::iter::repeat_n(0, lanes - 1));
            }
            match fmt {
                // i32 → f32 is exact (|Σq| ≤ 32·127), so this is one rounding of d·Σq.
                Format::Q4_1 | Format::Q5_1 => a.s.push(d * sum as f32),
                Format::Hfq4G256 => a.d8.extend_from_slice(&[d; LANES8]),
                _ => {}
            }
        };
        match fmt {
            Format::Hfq4G256 => {
                // Permute, then quantise (see the module docs).
                let mut perm = [0f32; HFQ_PERM_SPAN];
                for (span, dst) in x
                    .chunks_exact(HFQ_PERM_SPAN)
                    .zip(qs.chunks_exact_mut(HFQ_PERM_SPAN))
                {
                    let (ev, od) = perm.split_at_mut(HFQ_PERM_SPAN / 2);
                    for (i, pair) in span.chunks_exact(2).enumerate() {
                        ev[i] = pair[0];
                        od[i] = pair[1];
                    }
                    for (src, q) in perm.chunks_exact(QK).zip(dst.chunks_exact_mut(QK)) {
                        let (d, sum) = quantise_block(src, q);
                        push(&mut a, d, sum);
                    }
                }
                // Σ of the quantised x per group, for the reason `Q8x32::s` gives.
                let per_group = HFQ_GROUP / QK;
                a.gsum =
                    a.d.chunks_exact(per_group)
                        .zip(a.isum.chunks_exact(per_group))
                        .map(|(d, s)| {
                            d.iter()
                                .zip(s)
                                .map(|(&d, &s)| f64::from(d) * f64::from(s))
                                .sum::<f64>() as f32
                        })
                        .collect();
            }
            Format::Q4_0 | Format::Q4_1 => {
                // Quantise per natural block, then store each full 4-block group as
                // [first halves of its blocks, second halves].
                let mut natural = [0i8; Q4_0_ACT_GROUP];
                let half = QK / 2;
                for (grp, dst) in x.chunks(Q4_0_ACT_GROUP).zip(qs.chunks_mut(Q4_0_ACT_GROUP)) {
                    for (src, q) in grp.chunks_exact(QK).zip(natural.chunks_exact_mut(QK)) {
                        let (d, sum) = quantise_block(src, q);
                        push(&mut a, d, sum);
                    }
                    if grp.len() < Q4_0_ACT_GROUP {
                        dst.copy_from_slice(&natural[..grp.len()]);
                        continue;
                    }
                    let (firsts, seconds) = dst.split_at_mut(Q4_0_ACT_GROUP / 2);
                    for (blk, q) in natural.chunks_exact(QK).enumerate() {
                        firsts[half * blk..half * (blk + 1)].copy_from_slice(&q[..half]);
                        seconds[half * blk..half * (blk + 1)].copy_from_slice(&q[half..]);
                    }
                }
            }
            _ => {
                for (src, q) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)) {
                    let (d, sum) = quantise_block(src, q);
                    push(&mut a, d, sum);
                }
            }
        }
        a.qs = qs;
        a
    }

    fn q8k(fmt: Format, x: &[f32]) -> Q8K {
        let mut a = Q8K::zeroed(x.len());
        for (src, (qs, d, bsums, sums32)) in x.chunks_exact(QK_K).zip(a.blocks_mut()) {
            *d = q8k_block(fmt, src, qs, bsums, sums32);
        }
        a
    }

    /// A q8_K activation of length `k` for `fmt`, every value zero (its blocks are filled in
    /// place: [`crate::SharedActivation`]).
    pub(crate) fn q8k_zeroed(fmt: Format, k: usize) -> ActivationBuf {
        ActivationBuf {
            format: fmt,
            k,
            kind: ActKind::Q8K(Q8K::zeroed(k)),
        }
    }

    /// Whether `fmt`'s activation is q8_K (Q4_K, Q6_K): the form [`ActivationBuf::from_q8k`]
    /// takes.
    pub fn takes_q8k(fmt: Format) -> bool {
        matches!(
            fmt,
            Format::Q4K | Format::Q6K | Format::Q5K | Format::Q3K | Format::Q2K | Format::Iq4Xs
        )
    }

    /// The activation for `fmt` (Q4_K or Q6_K) from `x` already quantised to q8_K in element
    /// order — `qs` and one scale per [`Q8K_BLOCK`] elements, as [`quantise_q8k`] makes them —
    /// for instance by the GPU. Equal, bit for bit, to [`ActivationBuf::prepare`] of that `x`.
    ///
    /// Errors: a format without a q8_K activation, lengths that disagree, or a non-finite
    /// scale (a quantiser marks a block with a non-finite `x` that way).
    pub fn from_q8k(fmt: Format, qs: &[i8], d: &[f32]) -> Result<ActivationBuf, QuantError> {
        let k = qs.len();
        fmt.row_bytes(k)?;
        if !Self::takes_q8k(fmt) {
            // Its activation is another form than the one given.
            return Err(QuantError::ActivationMismatch {
                format: fmt,
                k,
                act_format: Format::Q4K,
                act_k: k,
            });
        }
        if d.len() * QK_K != k {
            return Err(QuantError::ShortBuffer {
                what: "q8_K scales (one per 256 quants)",
                need: k / QK_K,
                got: d.len(),
            });
        }
        if let Some(b) = d.iter().position(|v| !v.is_finite()) {
            return Err(QuantError::NonFinite {
                format: fmt,
                what: "activation value",
                block: b,
            });
        }
        let mut a = Q8K::zeroed(k);
        for ((natural, &db), (dst, d, bsums, sums32)) in
            qs.chunks_exact(QK_K).zip(d).zip(a.blocks_mut())
        {
            *d = db;
            q8k_block_sums(natural, bsums, sums32);
            place_q8k_block(fmt, natural, dst);
        }
        Ok(ActivationBuf {
            format: fmt,
            k,
            kind: ActKind::Q8K(a),
        })
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
                let s = act_source(fmt, p, k);
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
        // 1056 = 8 full Q4_0 groups of 128 plus a trailing partial group of one block.
        let x: Vec<f32> = (0..1056)
            .map(|i| rng.random_range(-3.0f32..3.0) * (1 + i % 5) as f32)
            .collect();
        let k = x.len();
        for fmt in [
            Format::Q8_0,
            Format::Q4_0,
            Format::Q4_1,
            Format::Q5_0,
            Format::Q5_1,
            Format::Mxfp4,
        ] {
            let a = ActivationBuf::prepare(fmt, &x).unwrap();
            let ActKind::Q8x32(q) = &a.kind else {
                panic!("{fmt} should be q8x32")
            };
            for p in 0..k {
                // Quantised per natural block: the scale is the source block's.
                let src = act_source(fmt, p, k);
                let b = src / QK;
                let got = q.d[b] * f32::from(q.qs[p]);
                assert!((got - x[src]).abs() <= q.d[b] * 0.5001, "{fmt} p={p}");
            }
            let (lanes, off) = corr_lanes(fmt);
            for b in 0..k / QK {
                let s: i32 = (0..QK)
                    .map(|i| i32::from(q.qs[pos_of(fmt, QK * b + i, k)]))
                    .sum();
                assert_eq!(s, q.isum[b], "{fmt} block {b}");
                if matches!(fmt, Format::Q4_1 | Format::Q5_1) {
                    // The sum of the quantised block, not of x (see `Q8x32::s`).
                    assert_eq!(q.s[b], q.d[b] * s as f32);
                }
                if lanes > 0 {
                    assert_eq!(q.corr[lanes * b], -off * q.isum[b]);
                    assert!(q.corr[lanes * b + 1..lanes * (b + 1)]
                        .iter()
                        .all(|&c| c == 0));
                }
            }
        }
        // HFQ4G256: quantised after permuting, so activation block b is positions 32b..32b+32.
        let x = &x[..1024];
        let a = ActivationBuf::prepare(Format::Hfq4G256, x).unwrap();
        let ActKind::Q8x32(q) = &a.kind else {
            panic!("hfq should be q8x32")
        };
        for p in 0..x.len() {
            let b = p / QK;
            let src = act_source(Format::Hfq4G256, p, x.len());
            assert!((q.d[b] * f32::from(q.qs[p]) - x[src]).abs() <= q.d[b] * 0.5001);
            assert_eq!(q.d8[LANES8 * b], q.d[b]);
        }
    }

    #[test]
    fn simd_and_scalar_activation_quantisers_agree_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        for n in [32usize, 256] {
            for trial in 0..200 {
                let scale = 10f32.powi(trial % 7 - 3);
                let mut x: Vec<f32> = (0..n)
                    .map(|_| rng.random_range(-1.0f32..1.0) * scale)
                    .collect();
                if trial % 10 == 0 {
                    x.fill(0.0); // all-zero block: d = 0 path
                }
                if trial % 10 == 1 {
                    // Exact halves after scaling: rounding ties.
                    let amax = 127.0;
                    x = (0..n)
                        .map(|i| (i as f32 - n as f32 / 2.0) * 0.5 % amax)
                        .collect();
                }
                let (mut a, mut b) = (vec![0i8; n], vec![0i8; n]);
                let ra = quantise_block_scalar(&x, &mut a);
                let rb = quantise_block(&x, &mut b);
                assert_eq!(ra, rb, "n={n} trial {trial}");
                assert_eq!(a, b, "n={n} trial {trial}");
            }
        }
    }

    #[test]
    fn q4_pos_inverts_act_source() {
        for k in [32, 96, 128, 160, 512, 544] {
            for p in 0..k {
                assert_eq!(q4_pos(act_source(Format::Q4_0, p, k), k), p, "k={k} p={p}");
            }
        }
    }

    /// Inverse of [`act_source`], by search (tests only).
    fn pos_of(fmt: Format, e: usize, k: usize) -> usize {
        (0..k).find(|&p| act_source(fmt, p, k) == e).unwrap()
    }

    #[test]
    fn k16_chunk_pos_inverts_act_source() {
        for j in 0..QK_K / K16_CHUNK {
            for f in [Format::Q3K, Format::Q2K] {
                assert_eq!(act_source(f, k16_chunk_pos(j) + 5, 512), K16_CHUNK * j + 5);
            }
        }
    }

    #[test]
    fn iq4xs_pos_inverts_act_source() {
        let k = 512;
        for p in 0..k {
            let e = act_source(Format::Iq4Xs, p, k);
            let span = e - e % IQ4XS_ACT_SPAN;
            assert_eq!(span + iq4xs_pos(e % IQ4XS_ACT_SPAN), p, "p={p}");
        }
    }

    #[test]
    fn from_q8k_equals_prepare_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for (fmt, k) in [
            (Format::Q4K, 4096usize),
            (Format::Q6K, 14336),
            (Format::Q4K, 256),
        ] {
            let mut x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            // A block of zeros (d = 0) is in range too.
            x[..QK_K].fill(0.0);
            let want = ActivationBuf::prepare(fmt, &x).unwrap();
            let (qs, d) = quantise_q8k(&x).unwrap();
            let got = ActivationBuf::from_q8k(fmt, &qs, &d).unwrap();
            let (ActKind::Q8K(a), ActKind::Q8K(b)) = (&want.kind, &got.kind) else {
                panic!("{fmt} should be q8k")
            };
            assert_eq!(a.qs, b.qs, "{fmt} k={k}");
            assert_eq!(
                a.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!((&a.bsums, &a.sums32), (&b.bsums, &b.sums32));
            assert_eq!((got.format(), got.k()), (fmt, k));
        }
    }

    #[test]
    fn from_q8k_refuses_bad_input() {
        let qs = vec![1i8; 512];
        assert!(matches!(
            ActivationBuf::from_q8k(Format::Q8_0, &qs, &[1.0, 1.0]),
            Err(QuantError::ActivationMismatch { .. })
        ));
        assert!(matches!(
            ActivationBuf::from_q8k(Format::Q4K, &qs, &[1.0]),
            Err(QuantError::ShortBuffer { .. })
        ));
        assert!(matches!(
            ActivationBuf::from_q8k(Format::Q4K, &qs, &[1.0, f32::NAN]),
            Err(QuantError::NonFinite { block: 1, .. })
        ));
        assert!(quantise_q8k(&[1.0; 100]).is_err());
        assert!(quantise_q8k(&[f32::INFINITY; 256]).is_err());
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
