//! AVX2 + FMA + F16C row dots of the formats llama.cpp's K_M / IQ4 files fall back to
//! (Q5_0, Q5_1, ...), in the style of `avx2.rs`: weight codes are rebuilt as unsigned bytes,
//! multiplied with the signed 8-bit activation by `vpmaddubsw` + `vpmaddwd`, and every offset
//! is folded into the integer lanes, so the integer block sums equal the scalar reference's.
//!
//! # Safety (every `unsafe fn` here)
//! As in `avx2.rs`: the CPU supports AVX2, FMA and F16C, `row` is exactly `row_bytes(k)`
//! bytes, and the activation was prepared for the same format and `k`.

use crate::act::{k16_chunk_pos, Q8x32, IQ4XS_ACT_SPAN, Q8K};
use crate::dot::avx2::{
    dp_u8i8_256, h2f, h2f_x4, hsum4, hsum8, nibbles32, prefetch_ahead, q6k_bsum_dot, rd16,
};
use crate::formats::iq4::{IQ4NL_VALUES, IQ4XS_SCALE_OFFSET, IQ4XS_SUBS};
use crate::formats::kquant::QK_K;
use crate::formats::kquant_low::K_GROUPS;
use crate::formats::legacy::QK;
use crate::formats::mxfp4::{
    e8m0_half, e8m0_half_bits, BlockMxfp4, E8M0_FIRST_NORMAL, E8M0_MANTISSA_BITS, MXFP4_VALUES,
};
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

/// Bytes per Q3_K block: hmask[32], qs[64], scales[12], d.
pub(crate) const Q3K_BYTES: usize = 110;
/// Offsets inside a Q3_K block.
pub(crate) const Q3K_QS: usize = 32;
pub(crate) const Q3K_SCALES: usize = 96;
pub(crate) const Q3K_D: usize = 108;
/// Bytes per Q2_K block: scales[16], qs[64], d, dmin.
pub(crate) const Q2K_BYTES: usize = 84;
/// Offsets inside a Q2_K block.
pub(crate) const Q2K_QS: usize = 16;
pub(crate) const Q2K_D: usize = 80;
/// log2 of Q3_K's code offset 4 (`−4·Σ sc·bsum` is a shift).
const Q3K_OFFSET_SHIFT: i32 = 2;

/// Q3_K's sixteen signed scales (code − 32), from its 12 packed bytes at `p` through four
/// u32 (ggml's `aux` shuffle, equal to `q3k_scales` for every input; a unit test checks).
/// The −32 is done on all four bytes of a word at once: each code is below 64, so
/// `code + 0x60` stays inside its byte, and flipping bit 7 then adds the remaining 0x80
/// (mod 256): `code + 0xE0 = code − 32` as an i8.
#[inline(always)]
pub(crate) unsafe fn q3k_scales_i8(p: *const u8) -> [i8; K_GROUPS] {
    let words = q3k_scale_words(p).map(u32::to_le);
    // SAFETY: [u32; 4] and [i8; 16] have the same size and every bit pattern is valid; the
    // words are little-endian, so byte i of the result is scale i.
    unsafe { std::mem::transmute::<[u32; 4], [i8; K_GROUPS]>(words) }
}

/// [`q3k_scales_i8`] as four u32 values, byte i (little-endian) of word j being scale 4j + i.
#[inline(always)]
pub(crate) unsafe fn q3k_scale_words(p: *const u8) -> [u32; 4] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    const ADD_LOW7: u32 = 0x6060_6060;
    const FLIP_BIT7: u32 = 0x8080_8080;
    let (a0, a1, t) = (rd32(p), rd32(p.add(4)), rd32(p.add(8)));
    [
        (a0 & LOW4) | ((t & LOW2) << 4),
        (a1 & LOW4) | (((t >> 2) & LOW2) << 4),
        ((a0 >> 4) & LOW4) | (((t >> 4) & LOW2) << 4),
        ((a1 >> 4) & LOW4) | (((t >> 6) & LOW2) << 4),
    ]
    .map(|w| (w + ADD_LOW7) ^ FLIP_BIT7)
}

/// Per 16-element group g of one 32-byte product: lanes 0..8 take scale g, 8..16 scale g+1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_scales(lo: i8, hi: i8) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(i16::from(hi)), _mm_set1_epi16(i16::from(lo)))
}

/// Q3_K row · q8_K activation: codes 0..7 (two plane bits plus the hmask bit), per group of 16
/// `(sc − 32)·(Σ c·xq − 4·Σxq)`, the offset through Q6_K's `bsum` dot; chunk j's activation
/// sits at [`k16_chunk_pos`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q3k_q8k_avx2(row: &[u8], a: &Q8K) -> f32 {
    let nsb = row.len() / Q3K_BYTES;
    let p = row.as_ptr();
    let (m3, m4) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
    let mut acc = _mm256_setzero_ps();
    for s in 0..nsb {
        let blk = p.add(Q3K_BYTES * s);
        prefetch_ahead::<Q3K_BYTES>(blk);
        let sc = q3k_scales_i8(blk.add(Q3K_SCALES));
        let xq = a.qs.as_ptr().add(QK_K * s);
        let corr = q6k_bsum_dot(sc.as_ptr() as *const u8, a.bsums.as_ptr().add(K_GROUPS * s));
        let mut sumi = _mm256_sub_epi32(
            _mm256_setzero_si256(),
            _mm256_slli_epi32(corr, Q3K_OFFSET_SHIFT),
        );
        // Bit j of every hmask byte, moved to bit 0 one 32-element sub-block at a time (as
        // Q5_K's qh in `avx2::dot_k45_q8k_avx2`).
        let mut h = _mm256_loadu_si256(blk as *const __m256i);
        for plane in 0..2 {
            let mut q = _mm256_loadu_si256(blk.add(Q3K_QS + 32 * plane) as *const __m256i);
            for sft in 0..4 {
                let j = 4 * plane + sft;
                let w = _mm256_or_si256(
                    _mm256_and_si256(q, m3),
                    _mm256_and_si256(_mm256_slli_epi16(h, 2), m4),
                );
                q = _mm256_srli_epi16(q, 2);
                h = _mm256_srli_epi16(h, 1);
                let x = _mm256_loadu_si256(xq.add(k16_chunk_pos(j)) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(w, x);
                let sc16 = pair_scales(sc[2 * j], sc[2 * j + 1]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, sc16));
            }
        }
        let d = _mm256_set1_ps(h2f(rd16(blk.add(Q3K_D))) * a.d[s]);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum8(acc)
}

/// Σ_g m_g·S_g of one Q2_K super-block (mins are the high nibbles of `scales`) as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q2k_mins_dot(scales: *const u8, bsums: *const i16) -> __m256i {
    let sc = _mm_loadu_si128(scales as *const __m128i);
    let mins = _mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F));
    _mm256_madd_epi16(
        _mm256_cvtepu8_epi16(mins),
        _mm256_loadu_si256(bsums as *const __m256i),
    )
}

/// Q2_K row · q8_K activation: dx·(d·Σ sc·P − dmin·Σ m·S) per super-block (activation chunks
/// as Q3_K's).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q2k_q8k_avx2(row: &[u8], a: &Q8K) -> f32 {
    let nsb = row.len() / Q2K_BYTES;
    let p = row.as_ptr();
    let m3 = _mm256_set1_epi8(3);
    let (mut acc, mut macc) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for s in 0..nsb {
        let blk = p.add(Q2K_BYTES * s);
        prefetch_ahead::<Q2K_BYTES>(blk);
        let xq = a.qs.as_ptr().add(QK_K * s);
        let mut sumi = _mm256_setzero_si256();
        for plane in 0..2 {
            let mut q = _mm256_loadu_si256(blk.add(Q2K_QS + 32 * plane) as *const __m256i);
            for sft in 0..4 {
                let j = 4 * plane + sft;
                let w = _mm256_and_si256(q, m3);
                q = _mm256_srli_epi16(q, 2);
                let x = _mm256_loadu_si256(xq.add(k16_chunk_pos(j)) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(w, x);
                let (s0, s1) = (*blk.add(2 * j) & 0x0F, *blk.add(2 * j + 1) & 0x0F);
                let sc16 = pair_scales(s0 as i8, s1 as i8);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, sc16));
            }
        }
        let mn = q2k_mins_dot(blk, a.bsums.as_ptr().add(K_GROUPS * s));
        let dx = a.d[s];
        let d = _mm256_set1_ps(h2f(rd16(blk.add(Q2K_D))) * dx);
        let dmin = _mm256_set1_ps(h2f(rd16(blk.add(Q2K_D + 2))) * dx);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        macc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(mn), macc);
    }
    hsum8(acc) - hsum8(macc)
}

/// Bytes per IQ4_NL block: d, qs[16].
pub(crate) const IQ4NL_BYTES: usize = 18;
/// Bytes per IQ4_XS block: d, scales_h, scales_l[4], qs[128].
pub(crate) const IQ4XS_BYTES: usize = 136;
/// Offset of IQ4_XS's nibbles.
pub(crate) const IQ4XS_QS: usize = 8;
/// Lanes of `Q8x32::corr` per IQ4_NL block (its VNNI bias, one block per 256 bits).
pub(crate) const IQ4NL_CORR_LANES: usize = 8;

/// [`IQ4NL_VALUES`] in both 128-bit lanes, for `vpshufb`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq4_table256() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i))
}

/// 32 signed table values of the 16 nibble bytes at `qs` (Q4_0 order → element order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq4_values32(table: __m256i, qs: *const u8) -> __m256i {
    _mm256_shuffle_epi8(table, nibbles32(qs))
}

/// i8 × i8 → 8 i32 lanes, exact: |w|·(x with w's sign), so `vpmaddubsw` sees an unsigned
/// operand (|w| ≤ 127, so pairs cannot saturate).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dp_i8i8_256(w: __m256i, x: __m256i) -> __m256i {
    dp_u8i8_256(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

/// One IQ4_NL block's integer lanes Σ table(q)·xq.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq4nl_block(table: __m256i, blk: *const u8, a: &Q8x32, b: usize) -> __m256i {
    let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * b) as *const __m256i);
    dp_i8i8_256(iq4_values32(table, blk.add(2)), x)
}

/// IQ4_NL row · q8 activation, two blocks per step.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_iq4nl_q8_0_avx2(row: &[u8], a: &Q8x32) -> f32 {
    let nb = row.len() / IQ4NL_BYTES;
    let p = row.as_ptr();
    let table = iq4_table256();
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..nb {
        let blk = p.add(IQ4NL_BYTES * b);
        if b % 2 == 0 {
            prefetch_ahead::<{ 2 * IQ4NL_BYTES }>(blk);
        }
        let s = _mm256_set1_ps(h2f(rd16(blk)) * a.d[b]);
        let pi = _mm256_cvtepi32_ps(iq4nl_block(table, blk, a, b));
        acc[b % 2] = _mm256_fmadd_ps(s, pi, acc[b % 2]);
    }
    hsum8(_mm256_add_ps(acc[0], acc[1]))
}

/// Bytes per MXFP4 block: e, qs[16].
pub(crate) const MXFP4_BYTES: usize = 17;
const _: () = assert!(MXFP4_BYTES == std::mem::size_of::<BlockMxfp4>());
/// Offset of MXFP4's nibbles (after the one-byte exponent).
pub(crate) const MXFP4_QS: usize = 1;
/// Lanes of `Q8x32::corr` per MXFP4 block (its VNNI bias, one block per 256 bits).
pub(crate) const MXFP4_CORR_LANES: usize = 8;

/// [`MXFP4_VALUES`] in both 128-bit lanes, for `vpshufb`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_table256() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_VALUES.as_ptr() as *const __m128i))
}

/// The scale 2^(e − 128) of the MXFP4 block at `blk`, from its exponent byte's float bits.
#[inline(always)]
pub(crate) unsafe fn mxfp4_scale(blk: *const u8) -> f32 {
    e8m0_half(*blk)
}

/// The scales of the four MXFP4 blocks at `p`, `p + stride`, .. as [d0, d1, d2, d3], built as
/// f32 bits in vector lanes ([`e8m0_half_bits`] four at a time): the exponent bytes packed in a
/// GPR (as `h2f_x4` packs f16 scales), widened, then `(e − 1) << 23` where that is a normal
/// float and `0x0020_0000 << e` for e = 0, 1. Two shuffle-port µops per four blocks; inserting
/// four scalar results took six and halved the one-activation AVX-512 rate.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_scales_x4(p: *const u8, stride: usize) -> __m128 {
    let e = u32::from(*p)
        | (u32::from(*p.add(stride)) << 8)
        | (u32::from(*p.add(2 * stride)) << 16)
        | (u32::from(*p.add(3 * stride)) << 24);
    let e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(e as i32));
    let normal = _mm_slli_epi32::<{ E8M0_MANTISSA_BITS }>(_mm_sub_epi32(e, _mm_set1_epi32(1)));
    let sub = _mm_sllv_epi32(_mm_set1_epi32(e8m0_half_bits(0) as i32), e);
    let is_sub = _mm_cmpgt_epi32(_mm_set1_epi32(i32::from(E8M0_FIRST_NORMAL)), e);
    _mm_castsi128_ps(_mm_blendv_epi8(normal, sub, is_sub))
}

/// One MXFP4 block's integer lanes Σ table(q)·xq.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_block(table: __m256i, blk: *const u8, a: &Q8x32, b: usize) -> __m256i {
    let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * b) as *const __m256i);
    dp_i8i8_256(iq4_values32(table, blk.add(MXFP4_QS)), x)
}

/// MXFP4 row · q8 activation, two blocks per step (IQ4_NL's loop with the E8M0 scale).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_mxfp4_q8_0_avx2(row: &[u8], a: &Q8x32) -> f32 {
    let nb = row.len() / MXFP4_BYTES;
    let p = row.as_ptr();
    let table = mxfp4_table256();
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..nb {
        let blk = p.add(MXFP4_BYTES * b);
        if b % 2 == 0 {
            prefetch_ahead::<{ 2 * MXFP4_BYTES }>(blk);
        }
        let s = _mm256_set1_ps(mxfp4_scale(blk) * a.d[b]);
        let pi = _mm256_cvtepi32_ps(mxfp4_block(table, blk, a, b));
        acc[b % 2] = _mm256_fmadd_ps(s, pi, acc[b % 2]);
    }
    hsum8(_mm256_add_ps(acc[0], acc[1]))
}

/// Spread the four bytes of `v` to the even bytes of a u64 (odd bytes zero).
#[inline(always)]
fn spread_bytes(v: u32) -> u64 {
    let t = u64::from(v);
    let t = (t | (t << 16)) & 0x0000_ffff_0000_ffff;
    (t | (t << 8)) & 0x00ff_00ff_00ff_00ff
}

/// IQ4_XS's eight signed sub-block scales (code − 32) of the block at `blk`, as eight i16
/// lanes: the codes assembled in a u64 (byte ib = code ib) by shifts and masks, widened and
/// offset in one SSE step.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq4xs_scales(blk: *const u8) -> __m128i {
    let low = rd32(blk.add(4));
    // Byte ib: the low nibble of scales_l[ib / 2] for even ib, its high nibble for odd ib.
    let lows = spread_bytes(low & 0x0f0f_0f0f) | (spread_bytes((low >> 4) & 0x0f0f_0f0f) << 8);
    // Byte ib: bits 2·ib..2·ib+2 of scales_h, by halving the groups three times.
    let h = u64::from(rd16(blk.add(2)));
    let h = (h | (h << 24)) & 0x0000_00ff_0000_00ff;
    let h = (h | (h << 12)) & 0x000f_000f_000f_000f;
    let highs = (h | (h << 6)) & 0x0303_0303_0303_0303;
    let codes = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((lows | (highs << 4)) as i64));
    _mm_sub_epi16(codes, _mm_set1_epi16(IQ4XS_SCALE_OFFSET as i16))
}

/// IQ4_XS row · q8_K activation: two sub-blocks per 32-byte load of nibbles (their first
/// halves from the low nibbles, their second from the high ones, matching the activation's
/// [`crate::act::iq4xs_pos`] order), the table values by `vpshufb`, the signed products by the
/// sign trick, the sub-scales (one per 128-bit lane) by `vpmaddwd`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_iq4xs_q8k_avx2(row: &[u8], a: &Q8K) -> f32 {
    /// Sub-blocks per 128-element activation span.
    const SPAN_SUBS: usize = IQ4XS_ACT_SPAN / QK;
    let nsb = row.len() / IQ4XS_BYTES;
    let p = row.as_ptr();
    let table = iq4_table256();
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    for s in 0..nsb {
        let blk = p.add(IQ4XS_BYTES * s);
        prefetch_ahead::<IQ4XS_BYTES>(blk);
        let mut sc = [0i16; IQ4XS_SUBS];
        _mm_storeu_si128(sc.as_mut_ptr() as *mut __m128i, iq4xs_scales(blk));
        let xq = a.qs.as_ptr().add(QK_K * s);
        let mut sumi = _mm256_setzero_si256();
        for ib in (0..IQ4XS_SUBS).step_by(2) {
            let q = _mm256_loadu_si256(blk.add(IQ4XS_QS + 16 * ib) as *const __m256i);
            let halves = [
                _mm256_and_si256(q, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4),
            ];
            // Activation positions of these two sub-blocks' halves inside their span.
            let (span, slot) = (ib / SPAN_SUBS, ib % SPAN_SUBS);
            let sc16 = pair_scales16(sc[ib], sc[ib + 1]);
            for (half, codes) in halves.into_iter().enumerate() {
                let w = _mm256_shuffle_epi8(table, codes);
                let at = IQ4XS_ACT_SPAN * span + (IQ4XS_ACT_SPAN / 2) * half + (QK / 2) * slot;
                let x = _mm256_loadu_si256(xq.add(at) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, sc16));
            }
        }
        let d = _mm256_set1_ps(h2f(rd16(blk)) * a.d[s]);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum8(acc)
}

/// 16-bit lanes 0..8 = `lo`, 8..16 = `hi`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_scales16(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn q3k_scale_shuffle_matches_the_reference_unpacking() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..1000 {
            let b: [u8; 12] = std::array::from_fn(|_| rng.random());
            // SAFETY: b is 12 readable bytes, all the function reads.
            let got = unsafe { q3k_scales_i8(b.as_ptr()) };
            let want = crate::formats::kquant_low::q3k_scales(&b).map(|c| c as i8 - 32);
            assert_eq!(got, want, "{b:?}");
        }
    }

    #[test]
    fn iq4xs_scale_assembly_matches_the_block_reader() {
        if !crate::SimdTier::Avx2.is_supported() {
            println!("SKIPPED: no AVX2");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for _ in 0..1000 {
            let b: [u8; 136] = std::array::from_fn(|_| rng.random());
            // SAFETY: AVX2 was detected; b is a whole block.
            let got: [i16; 8] = unsafe { std::mem::transmute(iq4xs_scales(b.as_ptr())) };
            let want = crate::formats::iq4::BlockIq4Xs::read(&b)
                .scale_codes()
                .map(|c| i16::from(c) - 32);
            assert_eq!(got, want, "{:?}", &b[..8]);
        }
    }

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

    /// The vector scale builder gives [`e8m0_half_bits`] for every exponent byte.
    #[test]
    fn mxfp4_scales_x4_match_the_scalar_bits() {
        if !crate::SimdTier::Avx2.is_supported() {
            println!("SKIPPED: no AVX2");
            return;
        }
        let stride = MXFP4_BYTES;
        for e0 in 0..=255u8 {
            let mut blocks = [0u8; 4 * MXFP4_BYTES];
            let es = [
                e0,
                e0.wrapping_add(1),
                e0.wrapping_add(2),
                e0.wrapping_mul(7),
            ];
            for (i, &e) in es.iter().enumerate() {
                blocks[stride * i] = e;
            }
            // SAFETY: AVX2 was detected; the four exponent bytes lie inside `blocks`.
            let v = unsafe { mxfp4_scales_x4(blocks.as_ptr(), stride) };
            // SAFETY: __m128 and [u32; 4] have the same size; every bit pattern is valid.
            let got: [u32; 4] = unsafe { std::mem::transmute(v) };
            assert_eq!(got, es.map(e8m0_half_bits), "{es:?}");
        }
    }
}
