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

use crate::act::Q8x32;
use crate::dot::avx2::{h2f, h2f_x4, hsum4, hsum8, nibbles32, prefetch_ahead, rd16};
use crate::dot::avx2_mix::{
    q5_0_block, q5_1_block, rd32, Q5_0_BYTES, Q5_0_CORR_LANES, Q5_0_QH, Q5_0_QS, Q5_1_BYTES,
    Q5_1_QH, Q5_1_QS, STEP4,
};
use crate::dot::avx512::{
    dp_u8i8_plain, dp_u8i8_vnni, join, ld_idx, multi_rows, IDX_2BLK, IDX_2BLK_HI, MULTI_MAX,
};
use crate::formats::legacy::QK;
use std::arch::x86_64::*;

/// Bit 4 of a 5-bit code, as a byte.
const HIGH_BIT: i8 = 0x10;

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
    ($m:ident, $feat:literal, $dp:ident) => {
        /// Row dots of this flavour.
        pub(crate) mod $m {
            use super::*;

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
                let nb = row.len() / Q5_0_BYTES;
                let p = row.as_ptr();
                let (i01, i23) = (ld_idx(&IDX_2BLK), ld_idx(&IDX_2BLK_HI));
                let mut acc0 = [_mm512_setzero_ps(); N];
                let mut acc1 = [_mm512_setzero_ps(); N];
                let mut b = 0;
                while b + STEP4 <= nb {
                    let g = p.add(Q5_0_BYTES * b);
                    prefetch_ahead::<{ STEP4 * Q5_0_BYTES }>(g);
                    let blk = |o: usize| g.add(Q5_0_BYTES * o);
                    let w01 = codes5_512(blk(0), blk(1), Q5_0_QS, Q5_0_QH);
                    let w23 = codes5_512(blk(2), blk(3), Q5_0_QS, Q5_0_QH);
                    let wd = h2f_x4(g, Q5_0_BYTES);
                    for j in 0..N {
                        let (xq, corr) = (a[j].qs.as_ptr(), a[j].corr.as_ptr());
                        let x01 = _mm512_loadu_si512(xq.add(QK * b) as *const _);
                        let x23 = _mm512_loadu_si512(xq.add(QK * (b + 2)) as *const _);
                        let c01 = _mm512_loadu_si512(corr.add(Q5_0_CORR_LANES * b) as *const _);
                        let c23 =
                            _mm512_loadu_si512(corr.add(Q5_0_CORR_LANES * (b + 2)) as *const _);
                        let p01 = $dp(c01, w01, x01);
                        let p23 = $dp(c23, w23, x23);
                        let s4 = _mm_mul_ps(wd, _mm_loadu_ps(a[j].d.as_ptr().add(b)));
                        let s4 = _mm512_castps128_ps512(s4);
                        let s01 = _mm512_permutexvar_ps(i01, s4);
                        let s23 = _mm512_permutexvar_ps(i23, s4);
                        acc0[j] = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), acc0[j]);
                        acc1[j] = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), acc1[j]);
                    }
                    b += STEP4;
                }
                let mut out = [0f32; N];
                for j in 0..N {
                    let mut tail = _mm256_setzero_ps();
                    for bb in b..nb {
                        let b0 = p.add(Q5_0_BYTES * bb);
                        let s = _mm256_set1_ps(h2f(rd16(b0)) * a[j].d[bb]);
                        let pi = _mm256_cvtepi32_ps(q5_0_block(b0, a[j], bb));
                        tail = _mm256_fmadd_ps(s, pi, tail);
                    }
                    out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) + hsum8(tail);
                }
                out
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

            multi_rows!($feat, Q8x32, gemv_q5_0_multi, rows_q5_0, dot_q5_0_multi);
            multi_rows!($feat, Q8x32, gemv_q5_1_multi, rows_q5_1, dot_q5_1_multi);
        }
    };
}

mix_kernels!(
    plain,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    dp_u8i8_plain
);
mix_kernels!(
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    dp_u8i8_vnni
);
