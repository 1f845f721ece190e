//! AVX2 + FMA + F16C row dots.
//!
//! Integer formats follow ggml's AVX2 `ggml_vec_dot_*` (x86 `quants.c`): `vpmaddubsw` of
//! unsigned weight codes with the signed 8-bit activation, `vpmaddwd` to i32, one f32 FMA per
//! block. Offsets (Q4_0's −8) are folded into the integer lanes through the activation's
//! `corr`, so the integer block sums are exact and equal the scalar reference's.
//!
//! # Safety (every `unsafe fn` here)
//! The caller must ensure the CPU supports AVX2, FMA and F16C, that `row` is exactly
//! `row_bytes(k)` bytes, and that the activation was prepared for the same format and `k`
//! (`dispatch::gemv_rows_with` checks all three before calling through the table).

use crate::act::{Q8x32, Q4K_ACT_ORDER, Q8K};
use crate::dispatch::{Kernels, RowDot};
use crate::dot::avx2_mix as mix;
use crate::formats::hfq::HFQ_GROUP;
use crate::formats::kquant::{Q4K_SUB, QK_K};
use crate::formats::legacy::QK;
use std::arch::x86_64::*;

/// The AVX2 tier's table (order of [`crate::Format::ALL`]).
pub(crate) static KERNELS: Kernels = [
    RowDot::F32(dot_f32_f32_avx2),
    RowDot::F32(dot_f16_f32_avx2),
    RowDot::F32(dot_bf16_f32_avx2),
    RowDot::Q8x32(dot_q8_0_q8_0_avx2),
    RowDot::Q8x32(dot_q4_0_q8_0_avx2),
    RowDot::Q8x32(dot_q4_1_q8_1_avx2),
    RowDot::Q8K(dot_q4k_q8k_avx2),
    RowDot::Q8K(dot_q6k_q8k_avx2),
    RowDot::Q8x32(dot_hfq4_q8_0_avx2),
    RowDot::Q8x32(mix::dot_q5_0_q8_0_avx2),
    RowDot::Q8x32(mix::dot_q5_1_q8_1_avx2),
    RowDot::Q8K(dot_q5k_q8k_avx2),
    RowDot::Q8K(mix::dot_q3k_q8k_avx2),
    RowDot::Q8K(mix::dot_q2k_q8k_avx2),
    RowDot::Q8x32(mix::dot_iq4nl_q8_0_avx2),
    RowDot::Q8K(mix::dot_iq4xs_q8k_avx2),
    RowDot::Q8x32(mix::dot_mxfp4_q8_0_avx2),
];

/// Bytes per block, as laid out in `formats::legacy` / `kquant` / `hfq`.
pub(crate) const Q8_0_BYTES: usize = 34;
pub(crate) const Q4_0_BYTES: usize = 18;
pub(crate) const Q4_1_BYTES: usize = 20;
pub(crate) const Q4K_BYTES: usize = 144;
pub(crate) const Q6K_BYTES: usize = 210;
pub(crate) const HFQ_BYTES: usize = 136;
/// Offsets inside a Q4_K block: d, dmin, scales[12], qs[128].
pub(crate) const Q4K_SCALES: usize = 4;
pub(crate) const Q4K_QS: usize = 16;
/// Offsets inside a Q6_K block: ql[128], qh[64], scales[16], d.
pub(crate) const Q6K_QH: usize = 128;
pub(crate) const Q6K_SCALES: usize = 192;
pub(crate) const Q6K_D: usize = 208;
/// Float lanes processed per unrolled step by the float dots (4 accumulators × 8).
const F_UNROLL: usize = 32;

/// Unaligned little-endian u16 at `p`.
#[inline(always)]
pub(crate) unsafe fn rd16(p: *const u8) -> u16 {
    u16::from_le((p as *const u16).read_unaligned())
}

/// f16 bits → f32 through F16C.
///
/// Inline asm on purpose: every intrinsic form (`_mm_cvtsi32_si128`, `_mm_set1_epi16`, a
/// 32-bit load) is narrowed by LLVM to a `vpinsrw` that merges into an arbitrary register —
/// in the loops here a live FMA accumulator — which chained each block behind the previous
/// FMA and halved Q4_0 throughput (seen in the disassembly). `vmovd` from a GPR zeroes the
/// upper lanes, so the conversion depends on `h` alone.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn h2f(h: u16) -> f32 {
    let v: __m128;
    // SAFETY: register-only instructions (no memory, no stack, no flags); F16C is enabled
    // for every caller by this function's target features.
    unsafe {
        std::arch::asm!(
            "vmovd {v}, {h:e}",
            "vcvtph2ps {v}, {v}",
            h = in(reg) u32::from(h),
            v = out(xmm_reg) v,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    _mm_cvtss_f32(v)
}

/// How far ahead of the current block the loops software-prefetch the weights, in bytes.
/// One thread reaches its share of DRAM bandwidth only with many lines in flight; the
/// hardware streamer alone left the GEMV well short of a plain read. Measured with
/// `examples/gemv_gbs` (k = m = 4096, 2 GiB of copies, 16 threads) on the Emerald Rapids
/// H200 box, Q4_0 / Q8_0 / Q4_K weight GB/s: no prefetch 62.9 / 78.9 / 67.9, 512 B ahead
/// 73.8 / 79.2 / 78.6, 1 KiB 81.2 / 82.6 / 79.3, 2 KiB 84.6 / 90.2 / 94.7 (plain read of the
/// same bytes 83–118 GB/s across those runs). The sweep stopped at 2 KiB; on the 2-core AMD
/// EPYC dev VM (AVX-512 VNNI, 1 thread, k = m = 4096, 512 MiB, best of 7, alternating builds)
/// the ratio to a plain read kept rising beyond it — Q4_K / Q8_0: none 0.79 / 0.79–0.84,
/// 1 KiB 0.71–0.75 / 0.73–0.81, 2 KiB 0.75–0.80 / 0.79–0.85, 4 KiB 0.84–0.86 / 0.86–0.89,
/// 6 KiB 0.88 / 0.92–0.95, 8 KiB 0.93–0.97 / 0.89–0.96, 12 KiB 0.93–0.95 / 0.89–0.90,
/// 16 KiB 0.94 / 0.91 (`_MM_HINT_T1` at 8 / 16 KiB: 0.87–0.94 / 0.89–0.92), so 8 KiB. SmolLM2
/// CPU decode there, alternating builds: 132 → 144–149 tok/s at 1 thread, 201–208 → 206–209 at 2.
/// Not yet measured at 8 KiB on the H200 box's 16 threads.
pub(crate) const PREFETCH_AHEAD: usize = 8192;
/// Cache line size of every x86-64 CPU hipfire targets.
const LINE: usize = 64;

/// Prefetch the `BYTES` bytes that lie [`PREFETCH_AHEAD`] bytes after `p`, one hint per line.
/// A hint never faults, and `wrapping_add` keeps the address computation defined even past
/// the end of the row slice.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn prefetch_ahead<const BYTES: usize>(p: *const u8) {
    let mut off = 0;
    while off < BYTES {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off) as *const i8);
        off += LINE;
    }
}

/// Sum of 4 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum4(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Horizontal sum of 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Q4_K's packed 12 bytes → ([scales 0..8], [mins 0..8]) as two u64 of bytes
/// (ggml's `utmp` shuffle, equivalent to `get_scale_min_k4` for j = 0..8).
#[inline(always)]
pub(crate) unsafe fn q4k_unpack_scales(p: *const u8) -> (u64, u64) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let rd = |o: usize| u32::from_le((p.add(o) as *const u32).read_unaligned());
    let (u0, u1, u2) = (rd(0), rd(4), rd(8));
    let u3 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let s_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let s_lo = u0 & KMASK1;
    (
        u64::from(s_lo) | (u64::from(s_hi) << 32),
        u64::from(m_lo) | (u64::from(u3) << 32),
    )
}

/// Σ_j m_j·S_j of one Q4_K super-block as 4 i32 lanes (8 × u8 mins by 8 × i16 sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4k_mins_dot(mins: u64, sums32: *const i16) -> __m128i {
    let m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64));
    _mm_madd_epi16(m16, _mm_loadu_si128(sums32 as *const __m128i))
}

/// Σ_g sc_g·bsum_g of one Q6_K super-block as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6k_bsum_dot(scales: *const u8, bsums: *const i16) -> __m256i {
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales as *const __m128i));
    _mm256_madd_epi16(sc16, _mm256_loadu_si256(bsums as *const __m256i))
}

/// Shared float-dot loop: `load(i)` yields 8 f32 weights starting at element i.
macro_rules! float_dot {
    ($row:expr, $x:expr, $load:expr, $tail:expr, $pf:expr) => {{
        let (row, x) = ($row, $x);
        let k = x.len();
        let xp = x.as_ptr();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + F_UNROLL <= k {
            $pf(i);
            for (u, a) in acc.iter_mut().enumerate() {
                let j = i + 8 * u;
                *a = _mm256_fmadd_ps($load(row, j), _mm256_loadu_ps(xp.add(j)), *a);
            }
            i += F_UNROLL;
        }
        while i + 8 <= k {
            acc[0] = _mm256_fmadd_ps($load(row, i), _mm256_loadu_ps(xp.add(i)), acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum8(v);
        while i < k {
            s += $tail(row, i) * x[i];
            i += 1;
        }
        s
    }};
}

/// F32 row · x.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32_f32_avx2(row: &[u8], x: &[f32]) -> f32 {
    let w = row.as_ptr() as *const f32;
    float_dot!(
        w,
        x,
        |w: *const f32, j| _mm256_loadu_ps(w.add(j)),
        |w: *const f32, j| w.add(j).read_unaligned(),
        |i: usize| prefetch_ahead::<{ 4 * F_UNROLL }>(row.as_ptr().wrapping_add(4 * i))
    )
}

/// F16 row · x.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16_f32_avx2(row: &[u8], x: &[f32]) -> f32 {
    let w = row.as_ptr();
    float_dot!(
        w,
        x,
        |w: *const u8, j| _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * j) as *const __m128i)),
        |w: *const u8, j| h2f(rd16(w.add(2 * j))),
        |i: usize| prefetch_ahead::<{ 2 * F_UNROLL }>(w.wrapping_add(2 * i))
    )
}

/// BF16 row · x.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_bf16_f32_avx2(row: &[u8], x: &[f32]) -> f32 {
    let w = row.as_ptr();
    float_dot!(
        w,
        x,
        |w: *const u8, j| {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(2 * j) as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
        },
        |w: *const u8, j| f32::from_bits(u32::from(rd16(w.add(2 * j))) << 16),
        |i: usize| prefetch_ahead::<{ 2 * F_UNROLL }>(w.wrapping_add(2 * i))
    )
}

/// Integer dot of 32 unsigned codes with 32 signed quants → 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dp_u8i8_256(w: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
}

/// 16 bytes of legacy nibbles → 32 codes in element order (low nibbles, then high).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles32(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let w = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(w, _mm256_set1_epi8(0x0F))
}

/// One Q4_0 block's exact integer lanes Σ q·xq − 8·Σxq, for a block outside the full
/// 4-block groups (its activation is in natural order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_0_block(blk: *const u8, a: &Q8x32, b: usize) -> __m256i {
    let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * b) as *const __m256i);
    let corr = _mm_loadu_si128(a.corr.as_ptr().add(Q4_0_CORR_LANES * b) as *const __m128i);
    _mm256_add_epi32(
        dp_u8i8_256(nibbles32(blk.add(2)), x),
        _mm256_zextsi128_si256(corr),
    )
}

/// Q4_0's activation `corr` lanes per block (one block per 128-bit lane).
pub(crate) const Q4_0_CORR_LANES: usize = 4;
/// Blocks per Q4_0 activation group (see `act.rs`).
pub(crate) const Q4_0_GROUP_BLOCKS: usize = 4;

/// The two f16 values at `p`, `p + 2` → [f0, f1, 0, 0] through one `vmovd` + `vcvtph2ps`
/// (a full 32-bit move, so no merging insert).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn h2f_pair(p: *const u8) -> __m128 {
    let h = u32::from_le((p as *const u32).read_unaligned());
    _mm_cvtph_ps(_mm_cvtsi32_si128(h as i32))
}

/// Four f16 scales at `p`, `p + stride`, `p + 2·stride`, `p + 3·stride` → [d0, d1, d2, d3],
/// through a GPR pack and one `vmovq` + `vcvtph2ps` (no merging inserts).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn h2f_x4(p: *const u8, stride: usize) -> __m128 {
    let h = u64::from(rd16(p))
        | (u64::from(rd16(p.add(stride))) << 16)
        | (u64::from(rd16(p.add(2 * stride))) << 32)
        | (u64::from(rd16(p.add(3 * stride))) << 48);
    _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64))
}

/// One Q8_0 block's integer lanes Σ w·xq (sign trick: |w| · sign(x, w)).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0_block(blk: *const u8, a: &Q8x32, b: usize) -> __m256i {
    let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
    let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * b) as *const __m256i);
    dp_u8i8_256(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

/// Q8_0 row · q8 activation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8_0_q8_0_avx2(row: &[u8], a: &Q8x32) -> f32 {
    let nb = row.len() / Q8_0_BYTES;
    let p = row.as_ptr();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut b = 0;
    while b + 2 <= nb {
        let (b0, b1) = (p.add(Q8_0_BYTES * b), p.add(Q8_0_BYTES * (b + 1)));
        prefetch_ahead::<{ 2 * Q8_0_BYTES }>(b0);
        let s0 = _mm256_set1_ps(h2f(rd16(b0)) * a.d[b]);
        let s1 = _mm256_set1_ps(h2f(rd16(b1)) * a.d[b + 1]);
        acc0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(q8_0_block(b0, a, b)), acc0);
        acc1 = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(q8_0_block(b1, a, b + 1)), acc1);
        b += 2;
    }
    if b < nb {
        let b0 = p.add(Q8_0_BYTES * b);
        let s0 = _mm256_set1_ps(h2f(rd16(b0)) * a.d[b]);
        acc0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(q8_0_block(b0, a, b)), acc0);
    }
    hsum8(_mm256_add_ps(acc0, acc1))
}

/// Q4_0 row · q8 activation. Two blocks per step, one per 128-bit lane: the activation of
/// each 4-block group is [first halves of blocks 0..4, second halves of blocks 0..4].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0_q8_0_avx2(row: &[u8], a: &Q8x32) -> f32 {
    let nb = row.len() / Q4_0_BYTES;
    let nb_grouped = nb / Q4_0_GROUP_BLOCKS * Q4_0_GROUP_BLOCKS;
    let (p, xq) = (row.as_ptr(), a.qs.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    // Lanes 0..4 take scale 0, lanes 4..8 scale 1 (of the pair's [s0, s1, s2, s3] lanes 0 and 1,
    // or 2 and 3 for the second pair).
    let idx = [
        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
    ];
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut b = 0;
    while b < nb_grouped {
        let g = p.add(Q4_0_BYTES * b);
        prefetch_ahead::<{ Q4_0_GROUP_BLOCKS * Q4_0_BYTES }>(g);
        let s4 = _mm_mul_ps(h2f_x4(g, Q4_0_BYTES), _mm_loadu_ps(a.d.as_ptr().add(b)));
        let s4 = _mm256_castps128_ps256(s4);
        let xg = xq.add(QK * b);
        for (h, acc) in [(0usize, &mut acc0), (1, &mut acc1)] {
            let (b0, b1) = (g.add(Q4_0_BYTES * 2 * h), g.add(Q4_0_BYTES * (2 * h + 1)));
            let q = _mm256_set_m128i(
                _mm_loadu_si128(b1.add(2) as *const __m128i),
                _mm_loadu_si128(b0.add(2) as *const __m128i),
            );
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let xlo = _mm256_loadu_si256(xg.add(32 * h) as *const __m256i);
            let xhi = _mm256_loadu_si256(xg.add(64 + 32 * h) as *const __m256i);
            let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xlo), ones);
            let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xhi), ones);
            let corr = _mm256_loadu_si256(
                a.corr.as_ptr().add(Q4_0_CORR_LANES * (b + 2 * h)) as *const __m256i
            );
            let pi = _mm256_add_epi32(_mm256_add_epi32(plo, phi), corr);
            let s = _mm256_permutevar8x32_ps(s4, idx[h]);
            *acc = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(pi), *acc);
        }
        b += Q4_0_GROUP_BLOCKS;
    }
    while b < nb {
        let b0 = p.add(Q4_0_BYTES * b);
        let s0 = _mm256_set1_ps(h2f(rd16(b0)) * a.d[b]);
        acc0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(q4_0_block(b0, a, b)), acc0);
        b += 1;
    }
    hsum8(_mm256_add_ps(acc0, acc1))
}

/// One Q4_1 block outside the full 4-block groups: d·dx·Σ q·xq + m·s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1_block(blk: *const u8, a: &Q8x32, b: usize) -> f32 {
    let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * b) as *const __m256i);
    let pi = dp_u8i8_256(nibbles32(blk.add(4)), x);
    let s = _mm256_set1_ps(h2f(rd16(blk)) * a.d[b]);
    hsum8(_mm256_mul_ps(s, _mm256_cvtepi32_ps(pi))) + h2f(rd16(blk.add(2))) * a.s[b]
}

/// Q4_1 row · q8 activation (the `m·Σx` term uses the activation's `s`, the sum of the
/// quantised block, as ggml's q8_1). Same 4-block activation
/// layout and pairing as [`dot_q4_0_q8_0_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_1_q8_1_avx2(row: &[u8], a: &Q8x32) -> f32 {
    let nb = row.len() / Q4_1_BYTES;
    let nb_grouped = nb / Q4_0_GROUP_BLOCKS * Q4_0_GROUP_BLOCKS;
    let (p, xq) = (row.as_ptr(), a.qs.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let idx = [
        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
    ];
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut macc = _mm_setzero_ps();
    let mut b = 0;
    while b < nb_grouped {
        let g = p.add(Q4_1_BYTES * b);
        prefetch_ahead::<{ Q4_0_GROUP_BLOCKS * Q4_1_BYTES }>(g);
        let s4 = _mm_mul_ps(h2f_x4(g, Q4_1_BYTES), _mm_loadu_ps(a.d.as_ptr().add(b)));
        let s4 = _mm256_castps128_ps256(s4);
        macc = _mm_fmadd_ps(
            h2f_x4(g.add(2), Q4_1_BYTES),
            _mm_loadu_ps(a.s.as_ptr().add(b)),
            macc,
        );
        let xg = xq.add(QK * b);
        for (h, acc) in [(0usize, &mut acc0), (1, &mut acc1)] {
            let (b0, b1) = (g.add(Q4_1_BYTES * 2 * h), g.add(Q4_1_BYTES * (2 * h + 1)));
            let q = _mm256_set_m128i(
                _mm_loadu_si128(b1.add(4) as *const __m128i),
                _mm_loadu_si128(b0.add(4) as *const __m128i),
            );
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let xlo = _mm256_loadu_si256(xg.add(32 * h) as *const __m256i);
            let xhi = _mm256_loadu_si256(xg.add(64 + 32 * h) as *const __m256i);
            let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xlo), ones);
            let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xhi), ones);
            let s = _mm256_permutevar8x32_ps(s4, idx[h]);
            *acc = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_add_epi32(plo, phi)), *acc);
        }
        b += Q4_0_GROUP_BLOCKS;
    }
    let mut tail = 0f32;
    while b < nb {
        tail += q4_1_block(p.add(Q4_1_BYTES * b), a, b);
        b += 1;
    }
    hsum8(_mm256_add_ps(acc0, acc1)) + hsum4(macc) + tail
}

/// HFQ4G256 row · q8 activation (activation permuted per 128: evens, then odds).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_hfq4_q8_0_avx2(row: &[u8], a: &Q8x32) -> f32 {
    const BLOCKS_PER_GROUP: usize = HFQ_GROUP / QK;
    let ng = row.len() / HFQ_BYTES;
    let p = row.as_ptr();
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut zacc = 0f32;
    for g in 0..ng {
        let blk = p.add(HFQ_BYTES * g);
        prefetch_ahead::<HFQ_BYTES>(blk);
        let scale = f32::from_le_bytes([*blk, *blk.add(1), *blk.add(2), *blk.add(3)]);
        let zero = f32::from_le_bytes([*blk.add(4), *blk.add(5), *blk.add(6), *blk.add(7)]);
        let mut gacc = _mm256_setzero_ps();
        for c in 0..4 {
            // 32 bytes = 64 elements; half h = c / 2 of the group, chunk c % 2 within it.
            let q = _mm256_loadu_si256(blk.add(8 + 32 * c) as *const __m256i);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let base = g * BLOCKS_PER_GROUP + 4 * (c / 2) + c % 2;
            for (w, bb) in [(lo, base), (hi, base + 2)] {
                let x = _mm256_loadu_si256(a.qs.as_ptr().add(QK * bb) as *const __m256i);
                let pi = dp_u8i8_256(w, x);
                gacc = _mm256_fmadd_ps(_mm256_set1_ps(a.d[bb]), _mm256_cvtepi32_ps(pi), gacc);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), gacc, acc);
        zacc += zero * a.gsum[g];
    }
    hsum8(acc) + zacc
}

/// Q4_K row · q8_K activation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4k_q8k_avx2(row: &[u8], a: &Q8K) -> f32 {
    dot_k45_q8k_avx2::<false>(row, a)
}

/// Q5_K row · q8_K activation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5k_q8k_avx2(row: &[u8], a: &Q8K) -> f32 {
    dot_k45_q8k_avx2::<true>(row, a)
}

/// Bytes per Q5_K block: d, dmin, scales[12], qh[32], qs[128].
pub(crate) const Q5K_BYTES: usize = 176;
/// Offsets of qh and qs inside a Q5_K block.
pub(crate) const Q5K_QH: usize = 16;
pub(crate) const Q5K_QS: usize = 48;
/// Bit 4 of a 5-bit code, as a byte.
pub(crate) const HIGH_BIT: i8 = 0x10;

/// Q4_K (`Q5 = false`) or Q5_K (`Q5 = true`) row · q8_K activation: Q5_K is Q4_K's layout
/// plus a 32-byte `qh` whose bit j of byte l is bit 4 of sub-block j's element l.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_k45_q8k_avx2<const Q5: bool>(row: &[u8], a: &Q8K) -> f32 {
    let (bytes, qs_at) = if Q5 {
        (Q5K_BYTES, Q5K_QS)
    } else {
        (Q4K_BYTES, Q4K_QS)
    };
    let nsb = row.len() / bytes;
    let p = row.as_ptr();
    let m4 = _mm256_set1_epi8(0x0F);
    let m16 = _mm256_set1_epi8(HIGH_BIT);
    let mut acc = _mm256_setzero_ps();
    let mut macc = _mm_setzero_ps();
    for s in 0..nsb {
        let blk = p.add(bytes * s);
        // 144 and 176 bytes both span three lines.
        prefetch_ahead::<Q5K_BYTES>(blk);
        let (sc, mins) = q4k_unpack_scales(blk.add(Q4K_SCALES));
        let xq = a.qs.as_ptr().add(QK_K * s);
        let mut sumi = _mm256_setzero_si256();
        // Q5_K: bit j of every qh byte, moved to bit 0 one sub-block at a time (a 16-bit
        // shift brings the high byte's bits into the low byte only from the top, 8 shifts
        // away from bit 0, and j < 8).
        let mut h = if Q5 {
            _mm256_loadu_si256(blk.add(Q5K_QH) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        for c in 0..4 {
            let q = _mm256_loadu_si256(blk.add(qs_at + 32 * c) as *const __m256i);
            let mut lo = _mm256_and_si256(q, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if Q5 {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), m16));
                h = _mm256_srli_epi16(h, 1);
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h, 4), m16));
                h = _mm256_srli_epi16(h, 1);
            }
            for (w, j) in [(lo, 2 * c), (hi, 2 * c + 1)] {
                let x = _mm256_loadu_si256(xq.add(Q4K_SUB * Q4K_ACT_ORDER[j]) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(w, x);
                let scj = _mm256_set1_epi16(((sc >> (8 * j)) & 0xFF) as i16);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scj));
            }
        }
        let dx = a.d[s];
        let d = _mm256_set1_ps(h2f(rd16(blk)) * dx);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        let mn = q4k_mins_dot(mins, a.sums32.as_ptr().add(8 * s));
        let dmin = _mm_set1_ps(h2f(rd16(blk.add(2))) * dx);
        macc = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mn), macc);
    }
    let m = _mm_add_ps(macc, _mm_movehl_ps(macc, macc));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    hsum8(acc) - _mm_cvtss_f32(m)
}

/// Q6_K row · q8_K activation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6k_q8k_avx2(row: &[u8], a: &Q8K) -> f32 {
    let nsb = row.len() / Q6K_BYTES;
    let p = row.as_ptr();
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = _mm256_setzero_ps();
    for s in 0..nsb {
        let blk = p.add(Q6K_BYTES * s);
        prefetch_ahead::<Q6K_BYTES>(blk);
        let scales = blk.add(Q6K_SCALES);
        let xq = a.qs.as_ptr().add(QK_K * s);
        let corr = q6k_bsum_dot(scales, a.bsums.as_ptr().add(16 * s));
        let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        for n in 0..2 {
            let ql0 = _mm256_loadu_si256(blk.add(64 * n) as *const __m256i);
            let ql1 = _mm256_loadu_si256(blk.add(64 * n + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(blk.add(Q6K_QH + 32 * n) as *const __m256i);
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(qh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                ),
            ];
            for (gq, w) in q.into_iter().enumerate() {
                let x = _mm256_loadu_si256(xq.add(128 * n + 32 * gq) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(w, x);
                let g = 8 * n + 2 * gq;
                let sc_lo = i16::from(*scales.add(g) as i8);
                let sc_hi = i16::from(*scales.add(g + 1) as i8);
                let sc16 = _mm256_set_m128i(_mm_set1_epi16(sc_hi), _mm_set1_epi16(sc_lo));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, sc16));
            }
        }
        let d = _mm256_set1_ps(h2f(rd16(blk.add(Q6K_D))) * a.d[s]);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum8(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::kquant::{q4k_scale_min, K_SCALE_SIZE};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn utmp_unpack_matches_get_scale_min_k4() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..1000 {
            let q: [u8; K_SCALE_SIZE] = std::array::from_fn(|_| rng.random());
            // SAFETY: q is 12 readable bytes, all the function reads.
            let (sc, mn) = unsafe { q4k_unpack_scales(q.as_ptr()) };
            for j in 0..8 {
                let (s, m) = q4k_scale_min(j, &q);
                assert_eq!(((sc >> (8 * j)) & 0xFF) as u8, s, "scale {j} of {q:?}");
                assert_eq!(((mn >> (8 * j)) & 0xFF) as u8, m, "min {j} of {q:?}");
            }
        }
    }
}
