//! AVX-512 row dots, in two integer flavours generated from one body:
//! `plain` (F/BW/VL: `vpmaddubsw` + `vpmaddwd`) and `vnni` (adds VNNI: one `vpdpbusd`).
//!
//! Each 512-bit step covers two 32-element activation blocks; weight codes are unsigned,
//! and offsets are folded into the integer lanes exactly (Q4_0's −8 and, on VNNI, Q8_0's
//! +128 sign bias, through the activation's `corr`), so integer block sums equal the scalar
//! reference's. Per-lane scales are built with `vpermps`/`vpermw` from small vectors.
//!
//! Vector µops per weight byte are what limits these loops on Intel cores (two 512-bit ALU
//! ports), so each kernel converts four block scales with one `vcvtph2ps`, unpacks four Q4_0
//! blocks' nibbles with one shift, and applies K-quant sub-block scales with `vpdpwssd`
//! (VNNI) / `vpmaddwd` on the 16-bit products instead of a 32-bit multiply.
//!
//! # Safety (every `unsafe fn` here)
//! The caller must ensure the CPU supports the module's features (AVX-512 F/BW/VL, plus VNNI
//! for `vnni`, plus AVX2/FMA/F16C), that `row` is exactly `row_bytes(k)` bytes and that the
//! activation was prepared for the same format and `k` (`dispatch::gemv_rows_with` checks).

use crate::act::{Q8x32, Q8K};
use crate::dispatch::{Kernels, RowDot};
use crate::dot::avx2::{
    h2f, h2f_pair, h2f_x4, hsum4, hsum8, prefetch_ahead, q4_0_block, q4_1_block, q4k_mins_dot,
    q4k_unpack_scales, q8_0_block, rd16, HFQ_BYTES, HIGH_BIT, Q4K_BYTES, Q4K_QS, Q4K_SCALES,
    Q4_0_BYTES, Q4_0_CORR_LANES, Q4_0_GROUP_BLOCKS, Q4_1_BYTES, Q5K_BYTES, Q5K_QH, Q5K_QS,
    Q6K_BYTES, Q6K_D, Q6K_QH, Q6K_SCALES, Q8_0_BYTES,
};
use crate::dot::avx2_mix::STEP4;
use crate::dot::avx512_mix as mix;
use crate::formats::hfq::HFQ_GROUP;
use crate::formats::kquant::QK_K;
use crate::formats::legacy::QK;
use std::arch::x86_64::*;

/// The AVX-512 (no VNNI) tier's table.
pub(crate) static KERNELS_512: Kernels = [
    RowDot::F32(dot_f32_f32_avx512),
    RowDot::F32(dot_f16_f32_avx512),
    RowDot::F32(dot_bf16_f32_avx512),
    RowDot::Q8x32(plain::dot_q8_0_q8_0_avx512),
    RowDot::Q8x32(plain::dot_q4_0_q8_0_avx512),
    RowDot::Q8x32(plain::dot_q4_1_q8_1_avx512),
    RowDot::Q8K(plain::dot_q4k_q8k_avx512),
    RowDot::Q8K(plain::dot_q6k_q8k_avx512),
    RowDot::Q8x32(plain::dot_hfq4_q8_0_avx512),
    RowDot::Q8x32(mix::plain::dot_q5_0_q8_0_avx512),
    RowDot::Q8x32(mix::plain::dot_q5_1_q8_1_avx512),
    RowDot::Q8K(plain::dot_q5k_q8k_avx512),
    RowDot::Q8K(mix::plain::dot_q3k_q8k_avx512),
    RowDot::Q8K(mix::plain::dot_q2k_q8k_avx512),
    RowDot::Q8x32(mix::plain::dot_iq4nl_q8_0_avx512),
    RowDot::Q8K(mix::plain::dot_iq4xs_q8k_avx512),
    RowDot::Q8x32(mix::plain::dot_mxfp4_q8_0_avx512),
];

/// The AVX-512 VNNI tier's table (float dots are shared: they have no integer part).
pub(crate) static KERNELS_VNNI: Kernels = [
    RowDot::F32(dot_f32_f32_avx512),
    RowDot::F32(dot_f16_f32_avx512),
    RowDot::F32(dot_bf16_f32_avx512),
    RowDot::Q8x32(vnni::dot_q8_0_q8_0_avx512),
    RowDot::Q8x32(vnni::dot_q4_0_q8_0_avx512),
    RowDot::Q8x32(vnni::dot_q4_1_q8_1_avx512),
    RowDot::Q8K(vnni::dot_q4k_q8k_avx512),
    RowDot::Q8K(vnni::dot_q6k_q8k_avx512),
    RowDot::Q8x32(vnni::dot_hfq4_q8_0_avx512),
    RowDot::Q8x32(mix::vnni::dot_q5_0_q8_0_avx512),
    RowDot::Q8x32(mix::vnni::dot_q5_1_q8_1_avx512),
    RowDot::Q8K(vnni::dot_q5k_q8k_avx512),
    RowDot::Q8K(mix::vnni::dot_q3k_q8k_avx512),
    RowDot::Q8K(mix::vnni::dot_q2k_q8k_avx512),
    RowDot::Q8x32(mix::vnni::dot_iq4nl_q8_0_avx512),
    RowDot::Q8K(mix::vnni::dot_iq4xs_q8k_avx512),
    RowDot::Q8x32(mix::vnni::dot_mxfp4_q8_0_avx512),
];

/// Lanes of `Q8x32::corr` per Q8_0 block (one block per 256-bit half).
const Q8_0_CORR_LANES: usize = crate::act::corr_lanes(crate::Format::Q8_0).0;

/// Lane → block selector for two blocks per vector: lanes 0..8 block 0, 8..16 block 1.
pub(crate) const IDX_2BLK: [i32; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
/// Same for the second pair of a four-scale vector: lanes 0..8 scale 2, 8..16 scale 3.
pub(crate) const IDX_2BLK_HI: [i32; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
/// Q4_0, one block per 128-bit lane: lanes 4i..4i+4 take scale i.
pub(crate) const IDX_4BLK: [i32; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3];
/// Q4_K: 16-bit lanes of product t cover sub-blocks ((0, 2), (1, 3), (4, 6), (5, 7))[t],
/// 16 lanes each (one i16 per two bytes after `vpmaddubsw`).
pub(crate) const IDX16_Q4K: [[u16; 32]; 4] = [
    idx16_pairs(0, 2),
    idx16_pairs(1, 3),
    idx16_pairs(4, 6),
    idx16_pairs(5, 7),
];
/// Q4_K / Q5_K on VNNI ([`dot_k45_multi`]'s packed form): `vpackssdw` of the `vpdpbusd` lane
/// sums of vectors t and t + 1 puts, in each 128-bit lane c, four sums of vector t then four of
/// vector t + 1; lanes c = 0, 1 hold the low sub-block of each vector, c = 2, 3 the high one.
/// These are the sub-block scale indices of those 32 i16 lanes, for t = 0 and t = 2.
pub(crate) const IDX16_Q4K_PACKED: [[u16; 32]; 2] = [idx16_packed(0), idx16_packed(2)];

pub(crate) const fn idx16_packed(t: usize) -> [u16; 32] {
    let mut v = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        let (c, pos) = (i / 8, i % 8);
        let pair = Q5K_PAIRS[t + pos / 4];
        v[i] = if c < 2 { pair.0 } else { pair.1 } as u16;
        i += 1;
    }
    v
}

/// Q5_K: the sub-blocks in the low and high half of the t-th 512-bit vector of codes (the
/// order of [`IDX16_Q4K`]).
const Q5K_PAIRS: [(u8, u8); 4] = [(0, 2), (1, 3), (4, 6), (5, 7)];
/// Q6_K: 16-bit lane i of product z covers elements 64z + 2i → scale group 4z + i/8.
pub(crate) const IDX16_Q6K: [[u16; 32]; 4] = [
    idx16_quads(0),
    idx16_quads(4),
    idx16_quads(8),
    idx16_quads(12),
];

pub(crate) const fn idx16_pairs(a: u16, b: u16) -> [u16; 32] {
    let mut v = [a; 32];
    let mut i = 16;
    while i < 32 {
        v[i] = b;
        i += 1;
    }
    v
}

pub(crate) const fn idx16_quads(first: u16) -> [u16; 32] {
    let mut v = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        v[i] = first + (i / 8) as u16;
        i += 1;
    }
    v
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn ld_idx16(a: &[u16; 32]) -> __m512i {
    _mm512_loadu_si512(a.as_ptr() as *const _)
}

/// Float lanes per unrolled step of the float dots (4 accumulators × 16).
const F_UNROLL: usize = 64;
/// f32 lanes in a 512-bit vector.
const F_LANES: usize = 16;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn ld_idx(a: &[i32; 16]) -> __m512i {
    _mm512_loadu_si512(a.as_ptr() as *const _)
}

/// Two 256-bit halves → one 512-bit vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Shared float-dot loop with masked tails (masked-off lanes are not read).
macro_rules! float_dot512 {
    ($x:expr, $load:expr, $load_mask:expr, $pf:expr) => {{
        let x = $x;
        let k = x.len();
        let xp = x.as_ptr();
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + F_UNROLL <= k {
            $pf(i);
            for (u, a) in acc.iter_mut().enumerate() {
                let j = i + F_LANES * u;
                *a = _mm512_fmadd_ps($load(j), _mm512_loadu_ps(xp.add(j)), *a);
            }
            i += F_UNROLL;
        }
        while i < k {
            let n = (k - i).min(F_LANES);
            let m: __mmask16 = if n == F_LANES {
                0xFFFF
            } else {
                (1u16 << n) - 1
            };
            let xv = _mm512_maskz_loadu_ps(m, xp.add(i));
            acc[0] = _mm512_fmadd_ps($load_mask(m, i), xv, acc[0]);
            i += n;
        }
        let v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(v)
    }};
}

/// F32 row · x.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32_f32_avx512(row: &[u8], x: &[f32]) -> f32 {
    let w = row.as_ptr() as *const f32;
    float_dot512!(
        x,
        |j| _mm512_loadu_ps(w.add(j)),
        |m, j| _mm512_maskz_loadu_ps(m, w.add(j)),
        |i: usize| prefetch_ahead::<{ 4 * F_UNROLL }>(row.as_ptr().wrapping_add(4 * i))
    )
}

/// F16 row · x.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16_f32_avx512(row: &[u8], x: &[f32]) -> f32 {
    let w = row.as_ptr() as *const i16;
    float_dot512!(
        x,
        |j| _mm512_cvtph_ps(_mm256_loadu_si256(w.add(j) as *const __m256i)),
        |m, j| _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w.add(j))),
        |i: usize| prefetch_ahead::<{ 2 * F_UNROLL }>(row.as_ptr().wrapping_add(2 * i))
    )
}

/// BF16 row · x.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dot_bf16_f32_avx512(row: &[u8], x: &[f32]) -> f32 {
    let w = row.as_ptr() as *const i16;
    let widen = |h: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
    float_dot512!(
        x,
        |j| widen(_mm256_loadu_si256(w.add(j) as *const __m256i)),
        |m, j| widen(_mm256_maskz_loadu_epi16(m, w.add(j))),
        |i: usize| prefetch_ahead::<{ 2 * F_UNROLL }>(row.as_ptr().wrapping_add(2 * i))
    )
}

/// u8 × i8 → i32 lanes without VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dp_u8i8_plain(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
    let p = _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
    _mm512_add_epi32(acc, p)
}

/// i8 × i8 → i32 lanes without VNNI: |w| · (x negated where w < 0). `corr` is unused.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dp_i8i8_plain(_corr: __m512i, w: __m512i, x: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(w);
    let sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    dp_u8i8_plain(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx)
}

/// u8 × i8 → i32 lanes with VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dp_u8i8_vnni(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(acc, w, x)
}

/// i8 × i8 → i32 lanes with VNNI: (w + 128) · x − 128·Σx, the bias cancelled exactly
/// through `corr` = [−128·Σx, 0, …] per block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dp_i8i8_vnni(corr: __m512i, w: __m512i, x: __m512i) -> __m512i {
    let wu = _mm512_xor_si512(w, _mm512_set1_epi8(i8::MIN));
    _mm512_dpbusd_epi32(corr, wu, x)
}

/// acc + Σ pairs of (u8 w · i8 x) · i16 scale, without VNNI (`vpmaddwd` + add).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dp_scaled_plain(acc: __m512i, w: __m512i, x: __m512i, sc: __m512i) -> __m512i {
    _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), sc))
}

/// acc + Σ pairs of (u8 w · i8 x) · i16 scale, with VNNI (`vpdpwssd`).
///
/// Inline asm on purpose: for the baseline (generic) target LLVM rewrites the
/// `_mm512_dpwssd_epi32` intrinsic into `vpmaddwd` + `vpaddd` (seen in the disassembly), one
/// µop more per product; forcing the fused form raised the cache-resident (256 rows in L2)
/// Q4_K / Q6_K row dot from 53.3 / 66.8 to 56.1 / 70.0 GB/s on the AMD EPYC dev VM.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dp_scaled_vnni(acc: __m512i, w: __m512i, x: __m512i, sc: __m512i) -> __m512i {
    dpwssd_vnni(acc, _mm512_maddubs_epi16(w, x), sc)
}

/// acc + Σ pairs of i16 `p` · i16 `sc` in one fused `vpdpwssd` (inline asm: see
/// [`dp_scaled_vnni`] for why not the intrinsic).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dpwssd_vnni(acc: __m512i, p: __m512i, sc: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: register-only instruction (no memory, stack or flags); AVX-512 VNNI is enabled
    // for every caller by this function's target features.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {p}, {sc}",
            acc = inout(zmm_reg) acc,
            p = in(zmm_reg) p,
            sc = in(zmm_reg) sc,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// acc + Σ pairs of i16 `p` · i16 `sc` without VNNI (`vpmaddwd` + add).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dpwssd_plain(acc: __m512i, p: __m512i, sc: __m512i) -> __m512i {
    _mm512_add_epi32(acc, _mm512_madd_epi16(p, sc))
}

/// Most activations one multi-activation kernel call takes: its accumulators stay in
/// registers (Q8_0 keeps two zmm per activation, 16 of the 32 at this count). Measured on
/// the AVX-512 VNNI dev VM (SmolLM2-135M, 128-token prompt): 8 gave ~650 prompt tok/s, 4 ~620.
pub(crate) const MULTI_MAX: usize = 8;

/// A row driver over `MULTI_MAX`-sized activation groups for one multi kernel `$dot`:
/// `$pub_fn(w_rows, rb, acts, ys, accumulate)` writes `ys[j][i] (+)= row_i · acts[j]` for
/// `i < ys[0].len()` (every `ys[j]` that long, `w_rows` at least `ys[0].len()·rb` bytes, every
/// activation prepared for the format and `rb`'s `k`: `dispatch::run_rows_multi` checks).
macro_rules! multi_rows {
    ($feat:literal, $act:ty, $pub_fn:ident, $rows:ident, $dot:ident) => {
        #[target_feature(enable = $feat)]
        unsafe fn $rows<const N: usize>(
            w_rows: &[u8],
            rb: usize,
            a: &[&$act; N],
            ys: &mut [&mut [f32]],
            accumulate: bool,
        ) {
            let m = ys.first().map_or(0, |y| y.len());
            for (i, row) in w_rows.chunks_exact(rb).take(m).enumerate() {
                let v = $dot::<N>(row, a);
                for (y, vj) in ys.iter_mut().zip(v) {
                    y[i] = if accumulate { y[i] + vj } else { vj };
                }
            }
        }

        /// See `multi_rows!`.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $pub_fn(
            w_rows: &[u8],
            rb: usize,
            acts: &[&$act],
            ys: &mut [&mut [f32]],
            accumulate: bool,
        ) {
            for (a, y) in acts.chunks(MULTI_MAX).zip(ys.chunks_mut(MULTI_MAX)) {
                match a.len() {
                    1 => $rows::<1>(w_rows, rb, &[a[0]], y, accumulate),
                    2 => $rows::<2>(w_rows, rb, &[a[0], a[1]], y, accumulate),
                    3 => $rows::<3>(w_rows, rb, &[a[0], a[1], a[2]], y, accumulate),
                    4 => $rows::<4>(w_rows, rb, &[a[0], a[1], a[2], a[3]], y, accumulate),
                    5 => $rows::<5>(w_rows, rb, &[a[0], a[1], a[2], a[3], a[4]], y, accumulate),
                    6 => {
                        let g = [a[0], a[1], a[2], a[3], a[4], a[5]];
                        $rows::<6>(w_rows, rb, &g, y, accumulate)
                    }
                    7 => {
                        let g = [a[0], a[1], a[2], a[3], a[4], a[5], a[6]];
                        $rows::<7>(w_rows, rb, &g, y, accumulate)
                    }
                    _ => {
                        let g = [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]];
                        $rows::<8>(w_rows, rb, &g, y, accumulate)
                    }
                }
            }
        }
    };
}

pub(crate) use multi_rows;

/// Most activations one paired-row kernel call takes ([`multi_rows_paired!`]): two rows'
/// unpacked weights and scales plus 2·N accumulators must stay in the 32 registers.
pub(crate) const PAIR_MULTI_MAX: usize = 4;

/// [`multi_rows!`] whose rows go two at a time through `$pair` (each activation vector loaded
/// once for both rows), the odd last row through `$dot`; `$pair` must equal `$dot` row by row
/// bit for bit, so the result does not depend on where the pairs fall. Activations are taken
/// [`PAIR_MULTI_MAX`] at a time. Same contract as [`multi_rows!`].
macro_rules! multi_rows_paired {
    ($feat:literal, $act:ty, $pub_fn:ident, $rows:ident, $pair:ident, $dot:ident) => {
        #[target_feature(enable = $feat)]
        unsafe fn $rows<const N: usize>(
            w_rows: &[u8],
            rb: usize,
            a: &[&$act; N],
            ys: &mut [&mut [f32]],
            accumulate: bool,
        ) {
            let m = ys.first().map_or(0, |y| y.len());
            let w_rows = &w_rows[..m * rb];
            let mut store = |i: usize, v: [f32; N]| {
                for (y, vj) in ys.iter_mut().zip(v) {
                    y[i] = if accumulate { y[i] + vj } else { vj };
                }
            };
            let mut pairs = w_rows.chunks_exact(2 * rb);
            let mut i = 0;
            for two in pairs.by_ref() {
                let (r0, r1) = two.split_at(rb);
                let [v0, v1] = $pair::<N>(&[r0, r1], a);
                store(i, v0);
                store(i + 1, v1);
                i += 2;
            }
            let rest = pairs.remainder();
            if !rest.is_empty() {
                store(i, $dot::<N>(rest, a));
            }
        }

        /// See `multi_rows_paired!`.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $pub_fn(
            w_rows: &[u8],
            rb: usize,
            acts: &[&$act],
            ys: &mut [&mut [f32]],
            accumulate: bool,
        ) {
            for (a, y) in acts
                .chunks(PAIR_MULTI_MAX)
                .zip(ys.chunks_mut(PAIR_MULTI_MAX))
            {
                match a.len() {
                    1 => $rows::<1>(w_rows, rb, &[a[0]], y, accumulate),
                    2 => $rows::<2>(w_rows, rb, &[a[0], a[1]], y, accumulate),
                    3 => $rows::<3>(w_rows, rb, &[a[0], a[1], a[2]], y, accumulate),
                    _ => $rows::<4>(w_rows, rb, &[a[0], a[1], a[2], a[3]], y, accumulate),
                }
            }
        }
    };
}

macro_rules! int_kernels {
    ($m:ident, $feat:literal, $dp:ident, $dpi8:ident, $dps:ident, $dpw:ident, $packed:expr) => {
        /// Integer row dots of this flavour.
        pub(crate) mod $m {
            use super::*;

            /// Whether Q4_K / Q5_K use the packed `vpdpbusd` form (see [`dot_k45_multi`]).
            const PACKED_K45: bool = $packed;

            /// Q8_0 row · q8 activation: four blocks per step, two per vector
            /// ([`dot_q8_0_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q8_0_q8_0_avx512(row: &[u8], a: &Q8x32) -> f32 {
                dot_q8_0_multi::<1>(row, &[a])[0]
            }

            /// Q4_0 row · q8 activation ([`dot_q4_0_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q4_0_q8_0_avx512(row: &[u8], a: &Q8x32) -> f32 {
                dot_q4_0_multi::<1>(row, &[a])[0]
            }

            /// Q4_0 row against `N` activations at once: four blocks per step, one per 128-bit
            /// lane (the activation of each 4-block group is [first halves, second halves]);
            /// the nibbles and the four weight scales are unpacked once per step and dotted
            /// with every activation. Each activation's arithmetic depends on nothing but that
            /// activation, so `N = 1` is the single kernel and every result is bit-identical
            /// to it.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q4_0_multi<const N: usize>(row: &[u8], a: &[&Q8x32; N]) -> [f32; N] {
                let nb = row.len() / Q4_0_BYTES;
                let nb_grouped = nb / Q4_0_GROUP_BLOCKS * Q4_0_GROUP_BLOCKS;
                let p = row.as_ptr();
                let m4 = _mm512_set1_epi8(0x0F);
                let idx4 = ld_idx(&IDX_4BLK);
                let mut acc = [_mm512_setzero_ps(); N];
                let mut b = 0;
                while b < nb_grouped {
                    let g = p.add(Q4_0_BYTES * b);
                    prefetch_ahead::<{ Q4_0_GROUP_BLOCKS * Q4_0_BYTES }>(g);
                    let ld =
                        |o: usize| _mm_loadu_si128(g.add(Q4_0_BYTES * o + 2) as *const __m128i);
                    let q01 = _mm512_castsi256_si512(_mm256_set_m128i(ld(1), ld(0)));
                    let q = _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(q01, ld(2)), ld(3));
                    let lo = _mm512_and_si512(q, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                    let wd = h2f_x4(g, Q4_0_BYTES);
                    for j in 0..N {
                        let (xq, corr) = (a[j].qs.as_ptr(), a[j].corr.as_ptr());
                        let xlo = _mm512_loadu_si512(xq.add(QK * b) as *const _);
                        let xhi = _mm512_loadu_si512(xq.add(QK * b + 64) as *const _);
                        let c = _mm512_loadu_si512(corr.add(Q4_0_CORR_LANES * b) as *const _);
                        let pi = $dp($dp(c, lo, xlo), hi, xhi);
                        let s4 = _mm_mul_ps(wd, _mm_loadu_ps(a[j].d.as_ptr().add(b)));
                        let s = _mm512_permutexvar_ps(idx4, _mm512_castps128_ps512(s4));
                        acc[j] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(pi), acc[j]);
                    }
                    b += Q4_0_GROUP_BLOCKS;
                }
                let mut out = [0f32; N];
                for j in 0..N {
                    let mut tail = _mm256_setzero_ps();
                    for bb in b..nb {
                        let b0 = p.add(Q4_0_BYTES * bb);
                        let s = _mm256_set1_ps(h2f(rd16(b0)) * a[j].d[bb]);
                        let pi = _mm256_cvtepi32_ps(q4_0_block(b0, a[j], bb));
                        tail = _mm256_fmadd_ps(s, pi, tail);
                    }
                    out[j] = _mm512_reduce_add_ps(acc[j]) + hsum8(tail);
                }
                out
            }

            /// Q4_1 row · q8 activation: Q4_0's 4-block layout, plus the `m·s` term
            /// ([`dot_q4_1_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q4_1_q8_1_avx512(row: &[u8], a: &Q8x32) -> f32 {
                dot_q4_1_multi::<1>(row, &[a])[0]
            }

            /// Q8_0 row against `N` activations at once (four blocks per step, two per vector):
            /// each weight step is loaded and its scales converted once, then dotted with every
            /// activation ([`dot_pairs4_multi`]).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q8_0_multi<const N: usize>(row: &[u8], a: &[&Q8x32; N]) -> [f32; N] {
                dot_pairs4_multi::<N, Q8_0_BYTES, { STEP4 * Q8_0_BYTES }>(
                    row,
                    a,
                    Q8_0_CORR_LANES,
                    |g| {
                        let ld = |o: usize| {
                            _mm256_loadu_si256(g.add(Q8_0_BYTES * o + 2) as *const __m256i)
                        };
                        (join(ld(0), ld(1)), join(ld(2), ld(3)))
                    },
                    |c, w, x| $dpi8(c, w, x),
                    |blk, a, b| q8_0_block(blk, a, b),
                )
            }

            /// The loop of the formats whose 32-code blocks start with their f16 scale and
            /// whose offset or sign bias enters the integer lanes through `corr` (Q8_0, and
            /// Q5_0 and IQ4_NL in `avx512_mix.rs`): [`STEP4`] blocks (`BYTES` each) a step,
            /// two per vector, each step's codes made once by `codes` (blocks 0 and 1, 2 and 3)
            /// and its scales converted once, then for every activation `dot(corr, w, x)` (the
            /// i32 lanes of corr + w·x) scaled and accumulated; the blocks after the last whole
            /// step go through `tail`, the format's 256-bit block dot. Each activation's integer
            /// products and float accumulation order depend on nothing but that activation, so
            /// `N = 1` is the single kernel and every result is bit-identical to it.
            #[inline]
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_pairs4_multi<
                const N: usize,
                const BYTES: usize,
                const STEP_BYTES: usize,
            >(
                row: &[u8],
                a: &[&Q8x32; N],
                corr_lanes: usize,
                codes: impl Fn(*const u8) -> (__m512i, __m512i),
                dot: impl Fn(__m512i, __m512i, __m512i) -> __m512i,
                tail: impl Fn(*const u8, &Q8x32, usize) -> __m256i,
            ) -> [f32; N] {
                dot_pairs4_scaled_multi::<N, BYTES, STEP_BYTES>(
                    row,
                    a,
                    corr_lanes,
                    codes,
                    dot,
                    tail,
                    |g| h2f_x4(g, BYTES),
                    |blk| h2f(rd16(blk)),
                )
            }

            /// [`dot_pairs4_multi`] for a block scale other than a leading f16 (MXFP4's E8M0
            /// byte): `scales4(g)` gives the four scales of the step at `g`, `scale(blk)` one
            /// block's, and both must agree bit for bit.
            #[inline]
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn dot_pairs4_scaled_multi<
                const N: usize,
                const BYTES: usize,
                const STEP_BYTES: usize,
            >(
                row: &[u8],
                a: &[&Q8x32; N],
                corr_lanes: usize,
                codes: impl Fn(*const u8) -> (__m512i, __m512i),
                dot: impl Fn(__m512i, __m512i, __m512i) -> __m512i,
                tail: impl Fn(*const u8, &Q8x32, usize) -> __m256i,
                scales4: impl Fn(*const u8) -> __m128,
                scale: impl Fn(*const u8) -> f32,
            ) -> [f32; N] {
                // `prefetch_ahead` takes the step's bytes as a constant, which cannot be
                // computed from `BYTES` here.
                const { assert!(STEP_BYTES == STEP4 * BYTES) };
                let nb = row.len() / BYTES;
                let p = row.as_ptr();
                let (i01, i23) = (ld_idx(&IDX_2BLK), ld_idx(&IDX_2BLK_HI));
                let mut acc0 = [_mm512_setzero_ps(); N];
                let mut acc1 = [_mm512_setzero_ps(); N];
                let mut b = 0;
                while b + STEP4 <= nb {
                    let g = p.add(BYTES * b);
                    prefetch_ahead::<STEP_BYTES>(g);
                    let (w01, w23) = codes(g);
                    let wd = scales4(g);
                    for j in 0..N {
                        let (xq, corr) = (a[j].qs.as_ptr(), a[j].corr.as_ptr());
                        let x01 = _mm512_loadu_si512(xq.add(QK * b) as *const _);
                        let x23 = _mm512_loadu_si512(xq.add(QK * (b + 2)) as *const _);
                        let c01 = _mm512_loadu_si512(corr.add(corr_lanes * b) as *const _);
                        let c23 = _mm512_loadu_si512(corr.add(corr_lanes * (b + 2)) as *const _);
                        let p01 = dot(c01, w01, x01);
                        let p23 = dot(c23, w23, x23);
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
                    let mut tail_acc = _mm256_setzero_ps();
                    for bb in b..nb {
                        let b0 = p.add(BYTES * bb);
                        let s = _mm256_set1_ps(scale(b0) * a[j].d[bb]);
                        let pi = _mm256_cvtepi32_ps(tail(b0, a[j], bb));
                        tail_acc = _mm256_fmadd_ps(s, pi, tail_acc);
                    }
                    out[j] =
                        _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) + hsum8(tail_acc);
                }
                out
            }

            /// Q4_1 row against `N` activations at once (Q4_0's 4-block layout plus the
            /// `m·s` term; the nibbles and both scale vectors are unpacked once per step);
            /// `N = 1` is [`dot_q4_1_q8_1_avx512`], as for [`dot_q8_0_multi`].
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q4_1_multi<const N: usize>(row: &[u8], a: &[&Q8x32; N]) -> [f32; N] {
                let nb = row.len() / Q4_1_BYTES;
                let nb_grouped = nb / Q4_0_GROUP_BLOCKS * Q4_0_GROUP_BLOCKS;
                let p = row.as_ptr();
                let m4 = _mm512_set1_epi8(0x0F);
                let idx4 = ld_idx(&IDX_4BLK);
                let mut acc = [_mm512_setzero_ps(); N];
                let mut macc = [_mm_setzero_ps(); N];
                let mut b = 0;
                while b < nb_grouped {
                    let g = p.add(Q4_1_BYTES * b);
                    prefetch_ahead::<{ Q4_0_GROUP_BLOCKS * Q4_1_BYTES }>(g);
                    let ld =
                        |o: usize| _mm_loadu_si128(g.add(Q4_1_BYTES * o + 4) as *const __m128i);
                    let q01 = _mm512_castsi256_si512(_mm256_set_m128i(ld(1), ld(0)));
                    let q = _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(q01, ld(2)), ld(3));
                    let lo = _mm512_and_si512(q, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                    let wd = h2f_x4(g, Q4_1_BYTES);
                    let m = h2f_x4(g.add(2), Q4_1_BYTES);
                    for j in 0..N {
                        let xq = a[j].qs.as_ptr();
                        let xlo = _mm512_loadu_si512(xq.add(QK * b) as *const _);
                        let xhi = _mm512_loadu_si512(xq.add(QK * b + 64) as *const _);
                        let pi = $dp($dp(_mm512_setzero_si512(), lo, xlo), hi, xhi);
                        let s4 = _mm_mul_ps(wd, _mm_loadu_ps(a[j].d.as_ptr().add(b)));
                        let s = _mm512_permutexvar_ps(idx4, _mm512_castps128_ps512(s4));
                        acc[j] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(pi), acc[j]);
                        let sx = _mm_loadu_ps(a[j].s.as_ptr().add(b));
                        macc[j] = _mm_fmadd_ps(m, sx, macc[j]);
                    }
                    b += Q4_0_GROUP_BLOCKS;
                }
                let mut out = [0f32; N];
                for j in 0..N {
                    let mut tail = 0f32;
                    for bb in b..nb {
                        tail += q4_1_block(p.add(Q4_1_BYTES * bb), a[j], bb);
                    }
                    out[j] = _mm512_reduce_add_ps(acc[j]) + hsum4(macc[j]) + tail;
                }
                out
            }

            /// Q4_K row against `N` activations at once (nibbles, sub-block scales and mins
            /// unpacked once per super-block); `N = 1` is [`dot_q4k_q8k_avx512`], as for
            /// [`dot_q8_0_multi`].
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q4k_multi<const N: usize>(row: &[u8], a: &[&Q8K; N]) -> [f32; N] {
                dot_k45_multi::<N, false>(row, a)
            }

            /// Q5_K row against `N` activations at once ([`dot_q4k_multi`] plus the high
            /// bits); `N = 1` is [`dot_q5k_q8k_avx512`].
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q5k_multi<const N: usize>(row: &[u8], a: &[&Q8K; N]) -> [f32; N] {
                dot_k45_multi::<N, true>(row, a)
            }

            /// Q5_K row · q8_K activation ([`dot_q5k_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q5k_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                dot_q5k_multi::<1>(row, &[a])[0]
            }

            /// Q4_K (`Q5 = false`) or Q5_K (`Q5 = true`) row against `N` activations
            /// ([`dot_k45_rows`] of one row).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_k45_multi<const N: usize, const Q5: bool>(
                row: &[u8],
                a: &[&Q8K; N],
            ) -> [f32; N] {
                dot_k45_rows::<1, N, Q5>(&[row], a)[0]
            }

            /// `R` Q4_K (`Q5 = false`) or Q5_K (`Q5 = true`) rows (same length) against `N`
            /// activations: each activation vector is loaded once for all `R` rows, and every
            /// (row, activation) pair runs exactly the arithmetic of `R = 1`, so the results
            /// are bit-identical to [`dot_k45_multi`] row by row. Q5_K's 32 `qh` bytes are
            /// broadcast to both halves; vector t holds sub-blocks
            /// ((0, 2), (1, 3), (4, 6), (5, 7))[t], so its bit-4 mask tests bit a in the low
            /// half and bit b in the high one.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_k45_rows<const R: usize, const N: usize, const Q5: bool>(
                rows: &[&[u8]; R],
                a: &[&Q8K; N],
            ) -> [[f32; N]; R] {
                let (bytes, qs_at) = if Q5 {
                    (Q5K_BYTES, Q5K_QS)
                } else {
                    (Q4K_BYTES, Q4K_QS)
                };
                let nsb = rows[0].len() / bytes;
                let m4 = _mm512_set1_epi8(0x0F);
                let m16 = _mm512_set1_epi8(HIGH_BIT);
                let bit_sel: [__m512i; 4] = std::array::from_fn(|t| {
                    let (lo, hi) = Q5K_PAIRS[t];
                    join(
                        _mm256_set1_epi8((1u8 << lo) as i8),
                        _mm256_set1_epi8((1u8 << hi) as i8),
                    )
                });
                let mut acc = [[_mm512_setzero_ps(); N]; R];
                let mut macc = [[_mm_setzero_ps(); N]; R];
                for s in 0..nsb {
                    let mut w = [[_mm512_setzero_si512(); 4]; R];
                    let mut sct = [[_mm512_setzero_si512(); 4]; R];
                    let mut wd = [_mm_setzero_ps(); R];
                    let mut mins = [0u64; R];
                    for r in 0..R {
                        let blk = rows[r].as_ptr().add(bytes * s);
                        // 144 and 176 bytes both span three lines.
                        prefetch_ahead::<Q5K_BYTES>(blk);
                        let (sc, mn) = q4k_unpack_scales(blk.add(Q4K_SCALES));
                        mins[r] = mn;
                        let sc16 =
                            _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
                        let q0 = _mm512_loadu_si512(blk.add(qs_at) as *const _);
                        let q1 = _mm512_loadu_si512(blk.add(qs_at + 64) as *const _);
                        w[r] = [
                            _mm512_and_si512(q0, m4),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m4),
                            _mm512_and_si512(q1, m4),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4),
                        ];
                        if Q5 {
                            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                blk.add(Q5K_QH) as *const __m256i
                            ));
                            for (wt, sel) in w[r].iter_mut().zip(&bit_sel) {
                                let k = _mm512_test_epi8_mask(qh, *sel);
                                *wt = _mm512_mask_add_epi8(*wt, k, *wt, m16);
                            }
                        }
                        // VNNI (`PACKED_K45`): one `vpdpbusd` per 64 weights gives i32 sums
                        // of four products (|Σ| ≤ 4·31·128 < 2^15), two vectors of them are
                        // packed to i16 and scaled by one `vpdpwssd`: 3 multiplies per 128
                        // weights instead of 4 (`vpmaddubsw` + `vpdpwssd` each). Integer sums
                        // are exact either way.
                        if PACKED_K45 {
                            for h in 0..2 {
                                sct[r][h] =
                                    _mm512_permutexvar_epi16(ld_idx16(&IDX16_Q4K_PACKED[h]), sc16);
                            }
                        } else {
                            for t in 0..4 {
                                sct[r][t] = _mm512_permutexvar_epi16(ld_idx16(&IDX16_Q4K[t]), sc16);
                            }
                        }
                        wd[r] = h2f_pair(blk);
                    }
                    for j in 0..N {
                        let xq = a[j].qs.as_ptr().add(QK_K * s);
                        let x: [__m512i; 4] =
                            std::array::from_fn(|t| _mm512_loadu_si512(xq.add(64 * t) as *const _));
                        let xd = _mm_set1_ps(*a[j].d.as_ptr().add(s));
                        let sums32 = a[j].sums32.as_ptr().add(8 * s);
                        for r in 0..R {
                            let mut sumi = _mm512_setzero_si512();
                            if PACKED_K45 {
                                let z = _mm512_setzero_si512();
                                for h in 0..2 {
                                    let p0 = $dp(z, w[r][2 * h], x[2 * h]);
                                    let p1 = $dp(z, w[r][2 * h + 1], x[2 * h + 1]);
                                    sumi = $dpw(sumi, _mm512_packs_epi32(p0, p1), sct[r][h]);
                                }
                            } else {
                                for t in 0..4 {
                                    sumi = $dps(sumi, w[r][t], x[t], sct[r][t]);
                                }
                            }
                            let dd = _mm_mul_ps(wd[r], xd);
                            let d = _mm512_broadcastss_ps(dd);
                            acc[r][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[r][j]);
                            let mn = q4k_mins_dot(mins[r], sums32);
                            let dmin = _mm_permute_ps::<0b0101_0101>(dd);
                            macc[r][j] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mn), macc[r][j]);
                        }
                    }
                }
                let mut out = [[0f32; N]; R];
                for r in 0..R {
                    for j in 0..N {
                        let mj = macc[r][j];
                        let m = _mm_add_ps(mj, _mm_movehl_ps(mj, mj));
                        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
                        out[r][j] = _mm512_reduce_add_ps(acc[r][j]) - _mm_cvtss_f32(m);
                    }
                }
                out
            }

            /// Two Q4_K rows against `N` activations ([`dot_k45_rows`]).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q4k_pair<const N: usize>(
                rows: &[&[u8]; 2],
                a: &[&Q8K; N],
            ) -> [[f32; N]; 2] {
                dot_k45_rows::<2, N, false>(rows, a)
            }

            multi_rows!($feat, Q8x32, gemv_q8_0_multi, rows_q8_0, dot_q8_0_multi);
            multi_rows!($feat, Q8x32, gemv_q4_1_multi, rows_q4_1, dot_q4_1_multi);
            multi_rows_paired!(
                $feat,
                Q8K,
                gemv_q4k_multi,
                rows_q4k,
                dot_q4k_pair,
                dot_q4k_multi
            );
            multi_rows!($feat, Q8K, gemv_q5k_multi, rows_q5k, dot_q5k_multi);

            /// HFQ4G256 row · q8 activation (activation permuted per 128: evens, odds).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_hfq4_q8_0_avx512(row: &[u8], a: &Q8x32) -> f32 {
                const BLOCKS_PER_GROUP: usize = HFQ_GROUP / QK;
                let ng = row.len() / HFQ_BYTES;
                let (p, xq, d8) = (row.as_ptr(), a.qs.as_ptr(), a.d8.as_ptr());
                let m4 = _mm512_set1_epi8(0x0F);
                let mut acc = _mm512_setzero_ps();
                let mut zacc = 0f32;
                for g in 0..ng {
                    let blk = p.add(HFQ_BYTES * g);
                    prefetch_ahead::<HFQ_BYTES>(blk);
                    // x86-64 is little-endian, as the format is.
                    let scale = (blk as *const f32).read_unaligned();
                    let zero = (blk.add(4) as *const f32).read_unaligned();
                    let mut gacc = _mm512_setzero_ps();
                    for h in 0..2 {
                        let q = _mm512_loadu_si512(blk.add(8 + 64 * h) as *const _);
                        let lo = _mm512_and_si512(q, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                        let base = g * BLOCKS_PER_GROUP + 4 * h;
                        for (w, bb) in [(lo, base), (hi, base + 2)] {
                            let x = _mm512_loadu_si512(xq.add(QK * bb) as *const _);
                            let pi = $dp(_mm512_setzero_si512(), w, x);
                            let dx = _mm512_loadu_ps(d8.add(8 * bb));
                            gacc = _mm512_fmadd_ps(dx, _mm512_cvtepi32_ps(pi), gacc);
                        }
                    }
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(scale), gacc, acc);
                    zacc += zero * a.gsum[g];
                }
                _mm512_reduce_add_ps(acc) + zacc
            }

            /// Q4_K row · q8_K activation ([`dot_q4k_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q4k_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                dot_q4k_multi::<1>(row, &[a])[0]
            }

            /// Q6_K row · q8_K activation ([`dot_q6k_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q6k_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                dot_q6k_multi::<1>(row, &[a])[0]
            }

            /// Q6_K row against `N` activations at once: each super-block's 6-bit codes and
            /// their sub-block scale vectors are built once and dotted with every activation
            /// (per activation four scaled products, the −32 offset through its `bsums`, one
            /// f32 step). Each activation's arithmetic depends on nothing but that activation,
            /// so `N = 1` is the single kernel and every result is bit-identical to it.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q6k_multi<const N: usize>(row: &[u8], a: &[&Q8K; N]) -> [f32; N] {
                let nsb = row.len() / Q6K_BYTES;
                let p = row.as_ptr();
                let m4 = _mm512_set1_epi8(0x0F);
                let m30 = _mm512_set1_epi8(0x30);
                let mut acc = [_mm512_setzero_ps(); N];
                for s in 0..nsb {
                    let blk = p.add(Q6K_BYTES * s);
                    prefetch_ahead::<Q6K_BYTES>(blk);
                    let scales = blk.add(Q6K_SCALES);
                    let sc16_256 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales as *const __m128i));
                    let sc16 = _mm512_castsi256_si512(sc16_256);
                    let mut w = [_mm512_setzero_si512(); 4];
                    for n in 0..2 {
                        let ql = _mm512_loadu_si512(blk.add(64 * n) as *const _);
                        let qh = _mm256_loadu_si256(blk.add(Q6K_QH + 32 * n) as *const __m256i);
                        let h_lo = join(_mm256_slli_epi16::<4>(qh), _mm256_slli_epi16::<2>(qh));
                        let h_hi = join(qh, _mm256_srli_epi16::<2>(qh));
                        w[2 * n] =
                            _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(h_lo, m30));
                        w[2 * n + 1] = _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                            _mm512_and_si512(h_hi, m30),
                        );
                    }
                    let scz: [__m512i; 4] = std::array::from_fn(|z| {
                        _mm512_permutexvar_epi16(ld_idx16(&IDX16_Q6K[z]), sc16)
                    });
                    let wd = h2f(rd16(blk.add(Q6K_D)));
                    for j in 0..N {
                        let xq = a[j].qs.as_ptr().add(QK_K * s);
                        // q6k_bsum_dot with the scales' widening shared by every activation.
                        let bs = _mm256_loadu_si256(a[j].bsums.as_ptr().add(16 * s) as *const _);
                        let corr = _mm256_madd_epi16(sc16_256, bs);
                        let corr = _mm512_zextsi256_si512(_mm256_slli_epi32::<5>(corr));
                        let mut sumi = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
                        for z in 0..4 {
                            let x = _mm512_loadu_si512(xq.add(64 * z) as *const _);
                            sumi = $dps(sumi, w[z], x, scz[z]);
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

            multi_rows!($feat, Q8x32, gemv_q4_0_multi, rows_q4_0, dot_q4_0_multi);
            multi_rows!($feat, Q8K, gemv_q6k_multi, rows_q6k, dot_q6k_multi);
        }
    };
}

int_kernels!(
    plain,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    dp_u8i8_plain,
    dp_i8i8_plain,
    dp_scaled_plain,
    dpwssd_plain,
    false
);
int_kernels!(
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    dp_u8i8_vnni,
    dp_i8i8_vnni,
    dp_scaled_vnni,
    dpwssd_vnni,
    true
);
