//! AVX2 + FMA + F16C row dots of the formats llama.cpp's K_M / IQ4 files fall back to
//! (Q5_0, Q5_1, ...), in the style of `avx2.rs`: weight codes are rebuilt as unsigned bytes,
//! multiplied with the signed 8-bit activation by `vpmaddubsw` + `vpmaddwd`, and every offset
//! is folded into the integer lanes, so the integer block sums equal the scalar reference's.
//!
//! # Safety (every `unsafe fn` here)
//! As in `avx2.rs`: the CPU supports AVX2, FMA and F16C, `row` is exactly `row_bytes(k)`
//! bytes, and the activation was prepared for the same format and `k`.

use crate::act::Q8x32;
use crate::dot::avx2::{dp_u8i8_256, h2f, h2f_x4, hsum4, hsum8, nibbles32, prefetch_ahead, rd16};
use crate::formats::legacy::QK;
use std::arch::x86_64::*;

/// Bytes per Q5_0 block: d, qh[4], qs[16].
pub(crate) const Q5_0_BYTES: usize = 22;
/// Bytes per Q5_1 block: d, m, qh[4], qs[16].
pub(crate) const Q5_1_BYTES: usize = 24;
/// Offsets of qh and qs inside a Q5_0 block.
pub(crate) const Q5_0_QH: usize = 2;
pub(crate) const Q5_0_QS: usize = 6;
/// Offsets of qh and qs inside a Q5_1 block.
pub(crate) const Q5_1_QH: usize = 4;
pub(crate) const Q5_1_QS: usize = 8;
/// Blocks per unrolled step of the 32-element dots (four f16 scales per `vcvtph2ps`).
pub(crate) const STEP4: usize = 4;
/// Lanes of `Q8x32::corr` per block for Q5_0 (one block per 256 bits).
pub(crate) const Q5_0_CORR_LANES: usize = 8;
/// Bit 4 of a 5-bit code, as a byte.
const HIGH_BIT: i8 = 0x10;

/// Little-endian u32 at `p`.
#[inline(always)]
pub(crate) unsafe fn rd32(p: *const u8) -> u32 {
    u32::from_le((p as *const u32).read_unaligned())
}

/// Bit i of `x` → byte i all ones or all zeros (ggml's `bytes_from_bits_32`): byte i is
/// first filled with byte i / 8 of `x`, then OR-ed with a mask that has every bit but
/// bit i % 8 set, so it is all ones exactly when that bit is.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bits_to_bytes(x: u32) -> __m256i {
    /// Per 64-bit lane, byte j has every bit set but bit j.
    const ALL_BUT_BIT_J: i64 = 0x7fbf_dfef_f7fb_fdfe;
    let spread = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), spread);
    let ones = _mm256_or_si256(bytes, _mm256_set1_epi64x(ALL_BUT_BIT_J));
    _mm256_cmpeq_epi8(ones, _mm256_set1_epi8(-1))
}

/// The 32 unsigned 5-bit codes of a Q5 block in element order, from its nibbles at `qs`
/// and its high bits `qh`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn codes5_256(qs: *const u8, qh: u32) -> __m256i {
    let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(HIGH_BIT));
    _mm256_or_si256(nibbles32(qs), hi)
}

/// One Q5_0 block's exact integer lanes Σ q·xq − 16·Σxq.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0_block(blk: *const u8, a: &Q8x32, b: usize) -> __m256i {
    let w = codes5_256(blk.add(Q5_0_QS), rd32(blk.add(Q5_0_QH)));
    let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * b) as *const __m256i);
    let corr = _mm256_loadu_si256(a.corr.as_ptr().add(Q5_0_CORR_LANES * b) as *const __m256i);
    _mm256_add_epi32(dp_u8i8_256(w, x), corr)
}

/// Q5_0 row · q8 activation, two blocks per step.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_0_q8_0_avx2(row: &[u8], a: &Q8x32) -> f32 {
    let nb = row.len() / Q5_0_BYTES;
    let p = row.as_ptr();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut b = 0;
    while b + 2 <= nb {
        let (b0, b1) = (p.add(Q5_0_BYTES * b), p.add(Q5_0_BYTES * (b + 1)));
        prefetch_ahead::<{ 2 * Q5_0_BYTES }>(b0);
        let s0 = _mm256_set1_ps(h2f(rd16(b0)) * a.d[b]);
        let s1 = _mm256_set1_ps(h2f(rd16(b1)) * a.d[b + 1]);
        acc0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(q5_0_block(b0, a, b)), acc0);
        acc1 = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(q5_0_block(b1, a, b + 1)), acc1);
        b += 2;
    }
    if b < nb {
        let b0 = p.add(Q5_0_BYTES * b);
        let s0 = _mm256_set1_ps(h2f(rd16(b0)) * a.d[b]);
        acc0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(q5_0_block(b0, a, b)), acc0);
    }
    hsum8(_mm256_add_ps(acc0, acc1))
}

/// One Q5_1 block: d·dx·Σ q·xq + m·s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_1_block(blk: *const u8, a: &Q8x32, b: usize) -> f32 {
    let w = codes5_256(blk.add(Q5_1_QS), rd32(blk.add(Q5_1_QH)));
    let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * b) as *const __m256i);
    let s = _mm256_set1_ps(h2f(rd16(blk)) * a.d[b]);
    let pi = _mm256_cvtepi32_ps(dp_u8i8_256(w, x));
    hsum8(_mm256_mul_ps(s, pi)) + h2f(rd16(blk.add(2))) * a.s[b]
}

/// Q5_1 row · q8 activation: four blocks per step (their d and m converted four at a time),
/// the `m·s` terms in one 4-lane accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_1_q8_1_avx2(row: &[u8], a: &Q8x32) -> f32 {
    let nb = row.len() / Q5_1_BYTES;
    let (p, xq) = (row.as_ptr(), a.qs.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut macc = _mm_setzero_ps();
    let mut b = 0;
    while b + STEP4 <= nb {
        let g = p.add(Q5_1_BYTES * b);
        prefetch_ahead::<{ STEP4 * Q5_1_BYTES }>(g);
        let s4 = _mm_mul_ps(h2f_x4(g, Q5_1_BYTES), _mm_loadu_ps(a.d.as_ptr().add(b)));
        let m4 = h2f_x4(g.add(2), Q5_1_BYTES);
        macc = _mm_fmadd_ps(m4, _mm_loadu_ps(a.s.as_ptr().add(b)), macc);
        let mut sc = [0f32; STEP4];
        _mm_storeu_ps(sc.as_mut_ptr(), s4);
        for (u, &s) in sc.iter().enumerate() {
            let blk = g.add(Q5_1_BYTES * u);
            let w = codes5_256(blk.add(Q5_1_QS), rd32(blk.add(Q5_1_QH)));
            let x = _mm256_loadu_si256(xq.add(QK * (b + u)) as *const __m256i);
            let pi = _mm256_cvtepi32_ps(dp_u8i8_256(w, x));
            acc[u % 2] = _mm256_fmadd_ps(_mm256_set1_ps(s), pi, acc[u % 2]);
        }
        b += STEP4;
    }
    let mut tail = 0f32;
    while b < nb {
        tail += q5_1_block(p.add(Q5_1_BYTES * b), a, b);
        b += 1;
    }
    hsum8(_mm256_add_ps(acc[0], acc[1])) + hsum4(macc) + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn bits_to_bytes_spreads_each_bit_to_its_byte() {
        if !crate::SimdTier::Avx2.is_supported() {
            println!("SKIPPED: no AVX2");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..200 {
            let x: u32 = rng.random();
            // SAFETY: AVX2/FMA/F16C were detected above.
            let v: [u8; 32] = unsafe { std::mem::transmute(bits_to_bytes(x)) };
            for (i, &byte) in v.iter().enumerate() {
                assert_eq!(
                    byte,
                    if (x >> i) & 1 == 1 { 0xFF } else { 0 },
                    "{x:#x} bit {i}"
                );
            }
        }
    }
}
