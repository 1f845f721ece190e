//! AVX-512 row dots of the formats llama.cpp's K_M / IQ4 files fall back to (Q5_0, Q5_1,
//! ...), in `avx512.rs`'s two integer flavours (`plain`: `vpmaddubsw` + `vpmaddwd`; `vnni`:
//! `vpdpbusd` / `vpdpwssd`) generated from one body, each with its multi-activation form
//! (the weights of a step are unpacked once and dotted with up to eight activations; `N = 1`
//! is the single-activation kernel, so both are bit-identical).
//!
//! Each 512-bit step covers two 32-element blocks. A Q5 block's high bits are one `u32`, so
//! two blocks' are one 64-bit mask and a masked byte add puts bit 4 into the codes.
//!
//! # Safety (every `unsafe fn` here)
//! As in `avx512.rs`: the CPU supports the module's features, `row` is exactly
//! `row_bytes(k)` bytes, and the activation was prepared for the same format and `k`.

use crate::act::{Q8x32, Q8K};
use crate::dot::avx2::{h2f, h2f_x4, hsum4, hsum8, nibbles32, prefetch_ahead, q6k_bsum_dot, rd16};
use crate::dot::avx2_mix::{
    iq4_table256, iq4nl_block, iq4xs_scales, q2k_mins_dot, q3k_scales_i8, q5_0_block, q5_1_block,
    rd32, IQ4NL_BYTES, IQ4NL_CORR_LANES, IQ4XS_BYTES, IQ4XS_QS, Q2K_BYTES, Q2K_D, Q2K_QS,
    Q3K_BYTES, Q3K_D, Q3K_QS, Q3K_SCALES, Q5_0_BYTES, Q5_0_CORR_LANES, Q5_0_QH, Q5_0_QS,
    Q5_1_BYTES, Q5_1_QH, Q5_1_QS, STEP4,
};
use crate::dot::avx512::{
    dp_i8i8_plain, dp_i8i8_vnni, dp_scaled_plain, dp_scaled_vnni, dp_u8i8_plain, dp_u8i8_vnni,
    idx16_pairs, join, ld_idx, ld_idx16, multi_rows, IDX16_Q6K, IDX_2BLK, IDX_2BLK_HI, MULTI_MAX,
};
use crate::formats::kquant::QK_K;
use crate::formats::kquant_low::K_GROUPS;
use crate::formats::legacy::QK;
use std::arch::x86_64::*;

/// Bit 4 of a 5-bit code, as a byte.
const HIGH_BIT: i8 = 0x10;
/// IQ4_XS: 16-bit lane i of product t covers sub-block 2t + i / 16.
const IDX16_IQ4XS: [[u16; 32]; 4] = [
    idx16_pairs(0, 1),
    idx16_pairs(2, 3),
    idx16_pairs(4, 5),
    idx16_pairs(6, 7),
];

/// Bit 2 of a 3-bit code, as a byte.
const Q3_HIGH_BIT: i8 = 0x04;

/// The 2-bit plane layout of Q3_K / Q2_K as 512-bit steps: product z (0..4) covers elements
/// 64z..64z+64, i.e. plane z / 2 shifted by 2·(2·(z % 2)) in its low half and by 2 more in its
/// high half. Returns the per-16-bit-lane shift counts of each z.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn plane_shifts() -> [__m512i; 4] {
    std::array::from_fn(|z| {
        let s0 = (4 * (z % 2)) as i16;
        join(_mm256_set1_epi16(s0), _mm256_set1_epi16(s0 + 2))
    })
}

/// Codes 0..=3 of product z from the 32 plane bytes at `plane` (broadcast to both halves).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn plane_codes(plane: *const u8, shift: __m512i) -> __m512i {
    let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(plane as *const __m256i));
    _mm512_and_si512(_mm512_srlv_epi16(q, shift), _mm512_set1_epi8(3))
}

/// The 64 unsigned 5-bit codes of two Q5 blocks at `b0`, `b1` (block 0's in the low half),
/// with nibbles at offset `qs` and high bits at offset `qh` of each block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn codes5_512(b0: *const u8, b1: *const u8, qs: usize, qh: usize) -> __m512i {
    let lo = join(nibbles32(b0.add(qs)), nibbles32(b1.add(qs)));
    let high: __mmask64 = u64::from(rd32(b0.add(qh))) | (u64::from(rd32(b1.add(qh))) << 32);
    _mm512_mask_add_epi8(lo, high, lo, _mm512_set1_epi8(HIGH_BIT))
}

macro_rules! mix_kernels {
    ($m:ident, $feat:literal, $dp:ident, $dpi8:ident, $dps:ident) => {
        /// Row dots of this flavour.
        pub(crate) mod $m {
            use super::*;
            use crate::dot::avx512::$m::dot_pairs4_multi;

            /// Q5_0 row · q8 activation ([`dot_q5_0_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q5_0_q8_0_avx512(row: &[u8], a: &Q8x32) -> f32 {
                dot_q5_0_multi::<1>(row, &[a])[0]
            }

            /// Q5_0 row against `N` activations: four blocks per step, two per vector; the
            /// −16 offset enters the integer lanes through `corr`.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q5_0_multi<const N: usize>(row: &[u8], a: &[&Q8x32; N]) -> [f32; N] {
                dot_pairs4_multi::<N, Q5_0_BYTES, { STEP4 * Q5_0_BYTES }>(
                    row,
                    a,
                    Q5_0_CORR_LANES,
                    |g| {
                        let blk = |o: usize| g.add(Q5_0_BYTES * o);
                        (
                            codes5_512(blk(0), blk(1), Q5_0_QS, Q5_0_QH),
                            codes5_512(blk(2), blk(3), Q5_0_QS, Q5_0_QH),
                        )
                    },
                    |c, w, x| $dp(c, w, x),
                    |blk, a, b| q5_0_block(blk, a, b),
                )
            }

            /// Q5_1 row · q8 activation ([`dot_q5_1_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q5_1_q8_1_avx512(row: &[u8], a: &Q8x32) -> f32 {
                dot_q5_1_multi::<1>(row, &[a])[0]
            }

            /// Q5_1 row against `N` activations: Q5_0's layout without the offset, plus the
            /// `m·s` term of four blocks in one 4-lane FMA.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q5_1_multi<const N: usize>(row: &[u8], a: &[&Q8x32; N]) -> [f32; N] {
                let nb = row.len() / Q5_1_BYTES;
                let p = row.as_ptr();
                let (i01, i23) = (ld_idx(&IDX_2BLK), ld_idx(&IDX_2BLK_HI));
                let mut acc0 = [_mm512_setzero_ps(); N];
                let mut acc1 = [_mm512_setzero_ps(); N];
                let mut macc = [_mm_setzero_ps(); N];
                let mut b = 0;
                while b + STEP4 <= nb {
                    let g = p.add(Q5_1_BYTES * b);
                    prefetch_ahead::<{ STEP4 * Q5_1_BYTES }>(g);
                    let blk = |o: usize| g.add(Q5_1_BYTES * o);
                    let w01 = codes5_512(blk(0), blk(1), Q5_1_QS, Q5_1_QH);
                    let w23 = codes5_512(blk(2), blk(3), Q5_1_QS, Q5_1_QH);
                    let wd = h2f_x4(g, Q5_1_BYTES);
                    let wm = h2f_x4(g.add(2), Q5_1_BYTES);
                    for j in 0..N {
                        let xq = a[j].qs.as_ptr();
                        let x01 = _mm512_loadu_si512(xq.add(QK * b) as *const _);
                        let x23 = _mm512_loadu_si512(xq.add(QK * (b + 2)) as *const _);
                        let p01 = $dp(_mm512_setzero_si512(), w01, x01);
                        let p23 = $dp(_mm512_setzero_si512(), w23, x23);
                        let s4 = _mm_mul_ps(wd, _mm_loadu_ps(a[j].d.as_ptr().add(b)));
                        let s4 = _mm512_castps128_ps512(s4);
                        let s01 = _mm512_permutexvar_ps(i01, s4);
                        let s23 = _mm512_permutexvar_ps(i23, s4);
                        acc0[j] = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), acc0[j]);
                        acc1[j] = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), acc1[j]);
                        let sx = _mm_loadu_ps(a[j].s.as_ptr().add(b));
                        macc[j] = _mm_fmadd_ps(wm, sx, macc[j]);
                    }
                    b += STEP4;
                }
                let mut out = [0f32; N];
                for j in 0..N {
                    let mut tail = 0f32;
                    for bb in b..nb {
                        tail += q5_1_block(p.add(Q5_1_BYTES * bb), a[j], bb);
                    }
                    let v = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j]));
                    out[j] = v + hsum4(macc[j]) + tail;
                }
                out
            }

            /// Q3_K row · q8_K activation, 64 elements per product (Q6_K's scale lanes):
            /// plane bits by a per-half variable shift, bit 2 from `hmask` by a per-half bit
            /// test, the −4 offset through the `bsum` dot.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q3k_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                let nsb = row.len() / Q3K_BYTES;
                let p = row.as_ptr();
                let shifts = plane_shifts();
                // Product z holds sub-blocks 2z (low half) and 2z + 1 (high half).
                let bit_sel: [__m512i; 4] = std::array::from_fn(|z| {
                    join(
                        _mm256_set1_epi8((1u8 << (2 * z)) as i8),
                        _mm256_set1_epi8((1u8 << (2 * z + 1)) as i8),
                    )
                });
                let m4 = _mm512_set1_epi8(Q3_HIGH_BIT);
                let mut acc = _mm512_setzero_ps();
                for s in 0..nsb {
                    let blk = p.add(Q3K_BYTES * s);
                    prefetch_ahead::<Q3K_BYTES>(blk);
                    let sc = q3k_scales_i8(blk.add(Q3K_SCALES));
                    let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
                        sc.as_ptr() as *const __m128i,
                    )));
                    let xq = a.qs.as_ptr().add(QK_K * s);
                    let corr =
                        q6k_bsum_dot(sc.as_ptr() as *const u8, a.bsums.as_ptr().add(K_GROUPS * s));
                    let corr = _mm512_zextsi256_si512(_mm256_slli_epi32::<2>(corr));
                    let mut sumi = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
                    let hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk as *const __m256i));
                    for z in 0..4 {
                        let w = plane_codes(blk.add(Q3K_QS + 32 * (z / 2)), shifts[z]);
                        let k = _mm512_test_epi8_mask(hm, bit_sel[z]);
                        let w = _mm512_mask_add_epi8(w, k, w, m4);
                        let x = _mm512_loadu_si512(xq.add(64 * z) as *const _);
                        let scz = _mm512_permutexvar_epi16(ld_idx16(&IDX16_Q6K[z]), sc16);
                        sumi = $dps(sumi, w, x, scz);
                    }
                    let d = _mm512_set1_ps(h2f(rd16(blk.add(Q3K_D))) * a.d[s]);
                    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
                }
                _mm512_reduce_add_ps(acc)
            }

            /// Q2_K row · q8_K activation: Q3_K's 64-element products without the high bit,
            /// unsigned 4-bit scales, mins through the `bsum` dot.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q2k_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                let nsb = row.len() / Q2K_BYTES;
                let p = row.as_ptr();
                let shifts = plane_shifts();
                let mut acc = _mm512_setzero_ps();
                let mut macc = _mm256_setzero_ps();
                for s in 0..nsb {
                    let blk = p.add(Q2K_BYTES * s);
                    prefetch_ahead::<Q2K_BYTES>(blk);
                    let scb =
                        _mm_and_si128(_mm_loadu_si128(blk as *const __m128i), _mm_set1_epi8(0x0F));
                    let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(scb));
                    let xq = a.qs.as_ptr().add(QK_K * s);
                    let mut sumi = _mm512_setzero_si512();
                    for z in 0..4 {
                        let w = plane_codes(blk.add(Q2K_QS + 32 * (z / 2)), shifts[z]);
                        let x = _mm512_loadu_si512(xq.add(64 * z) as *const _);
                        let scz = _mm512_permutexvar_epi16(ld_idx16(&IDX16_Q6K[z]), sc16);
                        sumi = $dps(sumi, w, x, scz);
                    }
                    let mn = q2k_mins_dot(blk, a.bsums.as_ptr().add(K_GROUPS * s));
                    let dx = a.d[s];
                    let d = _mm512_set1_ps(h2f(rd16(blk.add(Q2K_D))) * dx);
                    let dmin = _mm256_set1_ps(h2f(rd16(blk.add(Q2K_D + 2))) * dx);
                    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
                    macc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(mn), macc);
                }
                _mm512_reduce_add_ps(acc) - hsum8(macc)
            }

            /// IQ4_NL row · q8 activation ([`dot_iq4nl_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_iq4nl_q8_0_avx512(row: &[u8], a: &Q8x32) -> f32 {
                dot_iq4nl_multi::<1>(row, &[a])[0]
            }

            /// IQ4_NL row against `N` activations: four blocks per step, two per vector, the
            /// table values by `vpshufb`, signed products as Q8_0's (`corr` carries the VNNI
            /// bias).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_iq4nl_multi<const N: usize>(row: &[u8], a: &[&Q8x32; N]) -> [f32; N] {
                let table = iq4_table256();
                let table512 = _mm512_broadcast_i64x4(table);
                dot_pairs4_multi::<N, IQ4NL_BYTES, { STEP4 * IQ4NL_BYTES }>(
                    row,
                    a,
                    IQ4NL_CORR_LANES,
                    |g| {
                        let nib = |o: usize| nibbles32(g.add(IQ4NL_BYTES * o + 2));
                        (
                            _mm512_shuffle_epi8(table512, join(nib(0), nib(1))),
                            _mm512_shuffle_epi8(table512, join(nib(2), nib(3))),
                        )
                    },
                    |c, w, x| $dpi8(c, w, x),
                    |blk, a, b| iq4nl_block(table, blk, a, b),
                )
            }

            /// IQ4_XS row · q8_K activation ([`dot_iq4xs_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_iq4xs_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                dot_iq4xs_multi::<1>(row, &[a])[0]
            }

            /// IQ4_XS row against `N` activations: two sub-blocks per vector, |value| and the
            /// activation with the value's sign into `vpmaddubsw` (|value| ≤ 127, so no
            /// saturation), the sub-scales on the 16-bit products.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_iq4xs_multi<const N: usize>(row: &[u8], a: &[&Q8K; N]) -> [f32; N] {
                let nsb = row.len() / IQ4XS_BYTES;
                let p = row.as_ptr();
                let table512 = _mm512_broadcast_i64x4(iq4_table256());
                let mut acc = [_mm512_setzero_ps(); N];
                for s in 0..nsb {
                    let blk = p.add(IQ4XS_BYTES * s);
                    prefetch_ahead::<IQ4XS_BYTES>(blk);
                    let sc16 = _mm512_castsi128_si512(iq4xs_scales(blk));
                    let qs = blk.add(IQ4XS_QS);
                    let mut wabs = [_mm512_setzero_si512(); 4];
                    let mut neg: [__mmask64; 4] = [0; 4];
                    let mut sct = [_mm512_setzero_si512(); 4];
                    for t in 0..4 {
                        let w = _mm512_shuffle_epi8(
                            table512,
                            join(nibbles32(qs.add(32 * t)), nibbles32(qs.add(32 * t + 16))),
                        );
                        wabs[t] = _mm512_abs_epi8(w);
                        neg[t] = _mm512_movepi8_mask(w);
                        sct[t] = _mm512_permutexvar_epi16(ld_idx16(&IDX16_IQ4XS[t]), sc16);
                    }
                    let wd = h2f(rd16(blk));
                    for j in 0..N {
                        let xq = a[j].qs.as_ptr().add(QK_K * s);
                        let mut sumi = _mm512_setzero_si512();
                        for t in 0..4 {
                            let x = _mm512_loadu_si512(xq.add(64 * t) as *const _);
                            let sx = _mm512_mask_sub_epi8(x, neg[t], _mm512_setzero_si512(), x);
                            sumi = $dps(sumi, wabs[t], sx, sct[t]);
                        }
                        let d = _mm512_set1_ps(wd * a[j].d[s]);
                        acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[j]);
                    }
                }
                let mut out = [0f32; N];
                for j in 0..N {
                    out[j] = _mm512_reduce_add_ps(acc[j]);
                }
                out
            }

            multi_rows!($feat, Q8x32, gemv_iq4nl_multi, rows_iq4nl, dot_iq4nl_multi);
            multi_rows!($feat, Q8K, gemv_iq4xs_multi, rows_iq4xs, dot_iq4xs_multi);
            multi_rows!($feat, Q8x32, gemv_q5_0_multi, rows_q5_0, dot_q5_0_multi);
            multi_rows!($feat, Q8x32, gemv_q5_1_multi, rows_q5_1, dot_q5_1_multi);
        }
    };
}

mix_kernels!(
    plain,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    dp_u8i8_plain,
    dp_i8i8_plain,
    dp_scaled_plain
);
mix_kernels!(
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    dp_u8i8_vnni,
    dp_i8i8_vnni,
    dp_scaled_vnni
);
