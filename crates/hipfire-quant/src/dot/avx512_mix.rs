//! AVX-512 row dots of the formats llama.cpp's K_M / IQ4 files fall back to (Q5_0, Q5_1,
//! ...), in `avx512.rs`'s two integer flavours (`plain`: `vpmaddubsw` + `vpmaddwd`; `vnni`:
//! `vpdpbusd` / `vpdpwssd`) generated from one body, each with its multi-activation form
//! (the weights of a step are unpacked once and dotted with up to eight activations; `N = 1`
//! is the single-activation kernel, so both are bit-identical).
//!
//! Each 512-bit step covers two 32-element blocks. A Q5 block's high bits are one `u32`, so
//! two blocks' are one 64-bit mask and a masked byte add puts bit 4 into the codes.
//!
//! Q3_K and Q2_K have a second body for CPUs with GFNI (Q3_K: and VBMI), which the table's
//! kernel picks per row; both bodies give the same bits.
//!
//! # Safety (every `unsafe fn` here)
//! As in `avx512.rs`: the CPU supports the module's features (for the `*_gfni` kernels and
//! `q3k_scales16_vbmi`, also those their `target_feature` names), `row` is exactly
//! `row_bytes(k)` bytes, and the activation was prepared for the same format and `k`.

use crate::act::{Q8x32, Q8K};
use crate::dot::avx2::{h2f, h2f_pair, h2f_x4, hsum4, hsum8, nibbles32, prefetch_ahead, rd16};
use crate::dot::avx2_mix::{
    iq4_table256, iq4nl_block, iq4xs_scales, mxfp4_block, mxfp4_scale, mxfp4_scales_x4,
    mxfp4_table256, q5_0_block, q5_1_block, rd32, IQ4NL_BYTES, IQ4NL_CORR_LANES, IQ4XS_BYTES,
    IQ4XS_QS, MXFP4_BYTES, MXFP4_CORR_LANES, MXFP4_QS, Q2K_BYTES, Q2K_D, Q2K_QS, Q3K_BYTES, Q3K_D,
    Q3K_QS, Q3K_SCALES, Q5_0_BYTES, Q5_0_CORR_LANES, Q5_0_QH, Q5_0_QS, Q5_1_BYTES, Q5_1_QH,
    Q5_1_QS, STEP4,
};
use crate::dot::avx512::{
    dp_i8i8_plain, dp_i8i8_vnni, dp_scaled_plain, dp_scaled_vnni, dp_u8i8_plain, dp_u8i8_vnni,
    dpwssd_plain, dpwssd_vnni, join, ld_idx, ld_idx16, multi_rows, IDX_2BLK, IDX_2BLK_HI,
    MULTI_MAX,
};
use crate::formats::iq4::{IQ4NL_VALUES, IQ4XS_SUBS};
use crate::formats::kquant::QK_K;
use crate::formats::kquant_low::{K_GROUPS, Q3K_SCALE_OFFSET};
use crate::formats::legacy::QK;
use crate::formats::mxfp4::{MXFP4_BIAS, MXFP4_VALUES};
use std::arch::x86_64::*;

/// Bit 4 of a 5-bit code, as a byte.
const HIGH_BIT: i8 = 0x10;
/// IQ4_XS: i32 lane l of a span's products covers sub-block l / 4 of the span (one per
/// 128-bit lane); `IDX_SUB_LO` picks the first span's scales, `IDX_SUB_HI` the second's.
const IDX_SUB_LO: [i32; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3];
const IDX_SUB_HI: [i32; 16] = [4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7];
/// The IQ4 table plus 128 (1..=241): unsigned, as `vpdpbusd`'s first operand must be.
const IQ4NL_BIASED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (IQ4NL_VALUES[i] as i16 + IQ4_BIAS) as u8;
        i += 1;
    }
    t
};
/// The bias of [`IQ4NL_BIASED`], and its log2 (the correction is a shift).
const IQ4_BIAS: i16 = 128;
const IQ4_BIAS_SHIFT: i32 = 7;
const _: () = assert!(1 << IQ4_BIAS_SHIFT == IQ4_BIAS);
/// [`MXFP4_VALUES`] plus [`MXFP4_BIAS`] (0..=24).
const MXFP4_BIASED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (MXFP4_VALUES[i] + MXFP4_BIAS) as u8;
        i += 1;
    }
    t
};

/// Super-blocks whose f32 scales the Q2_K row dot works out ahead of its loop (a stack array).
const DD_CHUNK: usize = 16;
/// Bit 2 of a 3-bit code, as a byte.
const Q3_HIGH_BIT: i8 = 0x04;
/// The two bits of a plane code, as a byte mask.
const PLANE_MASK: i8 = 0x03;
/// `vgf2p8affineqb` computes output bit i of a byte from matrix byte 7 − i (the byte at bit
/// offset 8·(7 − i) of the qword); Q3_K puts its `hmask` bit at code bit 2.
const GF_ROW_BIT2: u32 = 8 * (7 - 2);
/// `vgf2p8affineqb` matrices (the same in every qword) that take bits 2z, 2z + 1 of a byte to
/// bits 0, 1 (output bit i reads matrix byte 7 − i) and clear the rest: plane z of
/// [`k16_planes`] in one op.
const K16_GF_PLANE: [u64; 4] = [gf_plane(0), gf_plane(1), gf_plane(2), gf_plane(3)];

const fn gf_plane(z: u32) -> u64 {
    ((1u64 << (2 * z)) << (8 * 7)) | ((1u64 << (2 * z + 1)) << (8 * 6))
}
/// Qwords of a 256-bit half.
const QWORDS_PER_HALF: usize = 4;
/// Q3_K on GFNI: the matrices (one per qword) that take product z's `hmask` bit (z in the
/// low half, z + 4 in the high half, as [`k16_planes`] pairs chunks) to bit 2, all else 0.
const Q3K_GF_HBIT: [[u64; 8]; 4] = [
    q3k_gf_hbit(0),
    q3k_gf_hbit(1),
    q3k_gf_hbit(2),
    q3k_gf_hbit(3),
];

const fn q3k_gf_hbit(z: usize) -> [u64; 8] {
    let mut v = [0u64; 8];
    let mut i = 0;
    while i < 8 {
        let bit = if i < QWORDS_PER_HALF { z } else { z + 4 };
        v[i] = (1u64 << bit) << GF_ROW_BIT2;
        i += 1;
    }
    v
}
/// log2 of Q3_K's code offset 4 (`−4·Σ sc·bsum` is a shift).
const Q3K_OFFSET_SHIFT: i32 = 2;
/// Group (of 16 elements, 0..16) of i32 lane `l` of Q3_K / Q2_K product `s`: the product's
/// low half is 32-element chunk s, its high half chunk s + 4 (`act::K16_ACT_ORDER`).
const fn k16_group(s: usize, l: usize) -> usize {
    if l < 8 {
        2 * s + l / 4
    } else {
        8 + 2 * s + (l - 8) / 4
    }
}

/// Q3_K / Q2_K on VNNI ([`vnni::k16_sum`]): `vpackssdw` of the `vpdpbusd` sums of products
/// 2h and 2h + 1 puts, in 128-bit lane c, four sums of product 2h (i32 lanes 4c..4c+4) then four
/// of product 2h + 1. These are the group indices of those 32 i16 lanes.
const IDX16_K16_PACKED: [[u16; 32]; 2] = [idx16_k16_packed(0), idx16_k16_packed(1)];
/// Without VNNI: i16 lane i of product s after `vpmaddubsw` covers bytes 2i, 2i + 1, i.e. i32
/// lane i / 2.
const IDX16_K16: [[u16; 32]; 4] = [idx16_k16(0), idx16_k16(1), idx16_k16(2), idx16_k16(3)];

const fn idx16_k16_packed(h: usize) -> [u16; 32] {
    let mut v = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        let (c, pos) = (i / 8, i % 8);
        v[i] = k16_group(2 * h + pos / 4, 4 * c) as u16;
        i += 1;
    }
    v
}

const fn idx16_k16(s: usize) -> [u16; 32] {
    let mut v = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        v[i] = k16_group(s, i / 2) as u16;
        i += 1;
    }
    v
}

/// The four 64-byte code vectors of one Q3_K / Q2_K super-block from its 64 plane bytes at
/// `qs` (plane 0 then plane 1): vector s is bits 2s..2s+2 of every byte, i.e. chunks s (low
/// half) and s + 4 (high half). 16-bit shifts leak bits of the next byte only above the two kept.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn k16_planes(qs: *const u8) -> [__m512i; 4] {
    let q = _mm512_loadu_si512(qs as *const _);
    let m3 = _mm512_set1_epi8(PLANE_MASK);
    [
        _mm512_and_si512(q, m3),
        _mm512_and_si512(_mm512_srli_epi16::<2>(q), m3),
        _mm512_and_si512(_mm512_srli_epi16::<4>(q), m3),
        _mm512_and_si512(_mm512_srli_epi16::<6>(q), m3),
    ]
}

/// Q3_K's sixteen signed scales (code − 32) from their 12 packed bytes at `p` (see
/// `kquant_low::q3k_scales`), as i16 lanes in the low 256 bits, all in one vector register:
/// the low nibbles are bytes 0..8 (codes 0..8) and their high nibbles (codes 8..16), the top
/// two bits of code i are bits 2·(i / 4).. of byte 8 + i % 4. 16-bit shifts leak bits of the
/// neighbouring byte only above the bits kept.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn q3k_scales16(p: *const u8) -> __m512i {
    /// The 12 packed bytes (a masked load reads nothing past them).
    const SCALE_BYTES: __mmask16 = 0x0FFF;
    /// `vpternlogd` truth table of a | (b & c).
    const OR_AND: i32 = 0xF8;
    let v = _mm_maskz_loadu_epi8(SCALE_BYTES, p as *const i8);
    let lo = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
    );
    let lo = _mm_srlv_epi16(lo, _mm_setr_epi16(0, 0, 0, 0, 4, 4, 4, 4));
    let lo = _mm_and_si128(lo, _mm_set1_epi8(0x0F));
    let hi = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11),
    );
    let hi = _mm_slli_epi16::<4>(_mm_srlv_epi16(hi, _mm_setr_epi16(0, 0, 2, 2, 4, 4, 6, 6)));
    let codes = _mm_ternarylogic_epi32::<OR_AND>(lo, hi, _mm_set1_epi8(0x30));
    let sc = _mm_sub_epi8(codes, _mm_set1_epi8(Q3K_SCALE_OFFSET as i8));
    _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc))
}

/// [`q3k_scales16`] with VBMI and GFNI, in fewer ops (five where that takes eleven, one on
/// port 0 of Intel's vector ports where it had three): one `vpmultishiftqb` puts each code's
/// low nibble at bits 2..6 of its byte, another its top two bits at bits 6..8, and a bit
/// select joins them: the byte is 4·code + g (g: two leftover bits below). One
/// `vgf2p8affineqb` ([`Q3K_GF_SCALE`]) then gives code − 32 in the byte, which sign-extends to
/// i16. Reads bytes 0..12 only (a qword and a dword broadcast).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,gfni,avx2,fma,f16c")]
pub(crate) unsafe fn q3k_scales16_vbmi(p: *const u8) -> __m512i {
    /// `vpternlogd` truth table of c ? a : b.
    const BITSEL: i32 = 0xE4;
    /// The bits of each byte taken from the nibble pick (the rest from the top-bits pick).
    const NIBBLE_BITS: i8 = 0x3C;
    let lo_src = _mm_set1_epi64x(std::ptr::read_unaligned(p as *const i64));
    let hi_src = _mm_set1_epi32(std::ptr::read_unaligned(p.add(8) as *const i32));
    let lo = _mm_multishift_epi64_epi8(_mm_loadu_si128(Q3K_MS_LOW.as_ptr() as *const _), lo_src);
    let hi = _mm_multishift_epi64_epi8(_mm_loadu_si128(Q3K_MS_HIGH.as_ptr() as *const _), hi_src);
    let v = _mm_ternarylogic_epi32::<BITSEL>(lo, hi, _mm_set1_epi8(NIBBLE_BITS));
    let sc = _mm_gf2p8affine_epi64_epi8::<{ Q3K_GF_SCALE_XOR as i32 }>(
        v,
        _mm_set1_epi64x(Q3K_GF_SCALE as i64),
    );
    _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc))
}

/// The byte 4·c + g (c a 6-bit code, g < 4) to c − 32 as i8, as one GF(2) affine map: c − 32
/// is c with its top bit (byte bit 7) flipped, sign-extended from 6 bits, so output bits 0..5
/// are input bits 2..7 and output bits 5..8 all read input bit 7, flipped by the constant
/// [`Q3K_GF_SCALE_XOR`]. Output bit i reads matrix byte 7 − i.
const Q3K_GF_SCALE: u64 = {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        let src = if i < 5 { i + 2 } else { 7 };
        m |= (1u64 << src) << (8 * (7 - i));
        i += 1;
    }
    m
};
/// [`Q3K_GF_SCALE`]'s constant: flips output bits 5..8 (the top code bit, inverted).
const Q3K_GF_SCALE_XOR: u8 = 0xE0;
const _: () = assert!(Q3K_SCALE_OFFSET == 32, "the flip of code bit 5 is the −32");

/// [`q3k_scales16_vbmi`]'s `vpmultishiftqb` controls (a control byte is the bit offset, within
/// its qword, of the 8 bits its byte takes, wrapping). Nibbles: code i's low nibble starts at
/// bit 8i (i < 8) or 8(i − 8) + 4 of bytes 0..8 and goes to bit 2.
const Q3K_MS_LOW: [u8; 16] = {
    let mut v = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        let n = if i < 8 { 8 * i } else { 8 * (i - 8) + 4 };
        v[i] = ((n + 64 - 2) % 64) as u8;
        i += 1;
    }
    v
};
/// Top bits: code i's start at bit 8·(i % 4) + 2·(i / 4) of the dword of bytes 8..12 (repeated
/// in both halves of the qword, so wrapping reads it again) and go to bit 6.
const Q3K_MS_HIGH: [u8; 16] = {
    let mut v = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        let t = 8 * (i % 4) + 2 * (i / 4);
        v[i] = ((t + 64 - 6) % 64) as u8;
        i += 1;
    }
    v
};

/// `src` + `b` in the bytes `k` selects, `src` elsewhere: one `vpaddb` with a merge mask.
///
/// Inline asm on purpose: LLVM rewrites the masked add of Q3_K's bit 2 (disjoint from the
/// code bits) into `vpor` + a masked `vmovdqu8`, one vector µop more per 64 weights.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn add_epi8_masked(src: __m512i, k: __mmask64, b: __m512i) -> __m512i {
    let mut r = src;
    // SAFETY: register-only instruction (no memory, stack or flags); AVX-512 BW is enabled for
    // every caller by this function's target features.
    unsafe {
        std::arch::asm!(
            "vpaddb {r}{{{k}}}, {r}, {b}",
            r = inout(zmm_reg) r,
            k = in(kreg) k,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    r
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
    (
        $m:ident,
        $feat:literal,
        $dp:ident,
        $dpi8:ident,
        $dps:ident,
        $dpw:ident,
        $biased:literal,
        $packed:literal,
        $feat_gfni:literal
    ) => {
        /// Row dots of this flavour.
        pub(crate) mod $m {
            use super::*;

            /// Whether Q3_K / Q2_K pack `vpdpbusd` sums to i16 (see [`k16_sum`]).
            const PACKED: bool = $packed;
            use crate::dot::avx512::$m::{dot_pairs4_multi, dot_pairs4_scaled_multi};

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

            /// Σ_g sc_g·P_g of one super-block of Q3_K / Q2_K, product z holding the codes of
            /// chunks z and z + 4 (`w[z]`, see [`k16_planes`]) and `sc16` the sixteen i16 group
            /// scales in its low 256 bits. With VNNI (`PACKED`), one `vpdpbusd` per product
            /// gives i32 sums of four code·x products (|Σ| ≤ 4·7·127 < 2^15), two products'
            /// sums are packed to i16 and scaled by one `vpdpwssd`: 3 multiplies and 1 scale
            /// permute per 128 weights instead of 4 and 2. Without, `vpmaddubsw` + `vpmaddwd`
            /// per product. The integer sum is exact either way.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn k16_sum(w: &[__m512i; 4], xq: *const i8, sc16: __m512i) -> __m512i {
                let x: [__m512i; 4] =
                    std::array::from_fn(|z| _mm512_loadu_si512(xq.add(64 * z) as *const _));
                let mut sumi = _mm512_setzero_si512();
                if PACKED {
                    let zero = _mm512_setzero_si512();
                    for h in 0..2 {
                        let p0 = $dp(zero, w[2 * h], x[2 * h]);
                        let p1 = $dp(zero, w[2 * h + 1], x[2 * h + 1]);
                        let sc = _mm512_permutexvar_epi16(ld_idx16(&IDX16_K16_PACKED[h]), sc16);
                        sumi = $dpw(sumi, _mm512_packs_epi32(p0, p1), sc);
                    }
                } else {
                    for z in 0..4 {
                        let sc = _mm512_permutexvar_epi16(ld_idx16(&IDX16_K16[z]), sc16);
                        sumi = $dps(sumi, w[z], x[z], sc);
                    }
                }
                sumi
            }

            /// Q3_K row · q8_K activation: plane bits by shifts of both planes at once, bit 2
            /// from `hmask` by a per-half bit test, the −4 offset through the `bsum` dot
            /// ([`k16_sum`] for the rest). Where the CPU has GFNI, [`dot_q3k_gfni`] instead.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q3k_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                // One cached-flag test per row (`std` caches the CPUID bits).
                if std::arch::is_x86_feature_detected!("gfni")
                    && std::arch::is_x86_feature_detected!("avx512vbmi")
                {
                    return dot_q3k_gfni(row, a);
                }
                dot_q3k_test(row, a)
            }

            /// [`dot_q3k_q8k_avx512`] without GFNI: bit 2 of each code by `vptestmb` of its
            /// `hmask` bit and a masked byte add.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q3k_test(row: &[u8], a: &Q8K) -> f32 {
                // Product z holds 32-element chunks z (low half) and z + 4 (high half), whose
                // bit 2 is bit z or z + 4 of each hmask byte.
                let bit_sel: [__m512i; 4] = std::array::from_fn(|z| {
                    join(
                        _mm256_set1_epi8((1u8 << z) as i8),
                        _mm256_set1_epi8((1u8 << (z + 4)) as i8),
                    )
                });
                let high = _mm512_set1_epi8(Q3_HIGH_BIT);
                q3k_loop(
                    row,
                    a,
                    |sp| q3k_scales16(sp),
                    |blk| {
                        let hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk as *const __m256i));
                        let planes = k16_planes(blk.add(Q3K_QS));
                        std::array::from_fn(|z| {
                            let k = _mm512_test_epi8_mask(hm, bit_sel[z]);
                            add_epi8_masked(planes[z], k, high)
                        })
                    },
                )
            }

            /// [`dot_q3k_q8k_avx512`] with GFNI: one `vgf2p8affineqb` per product moves the
            /// code's `hmask` bit (bit z of the byte in the low half, z + 4 in the high half:
            /// the matrix is per qword) to bit 2 with every other bit zero, and one
            /// `vpternlogd` merges it with the masked plane bits: 2 ops per 64 codes where
            /// `vptestmb`, the masked add and the `vpand` took 3.
            #[target_feature(enable = $feat_gfni)]
            pub(crate) unsafe fn dot_q3k_gfni(row: &[u8], a: &Q8K) -> f32 {
                /// `vpternlogd` truth table of (a & b) | c.
                const AND_OR: i32 = 0xEA;
                let hsel: [__m512i; 4] =
                    std::array::from_fn(
                        |z| _mm512_loadu_si512(Q3K_GF_HBIT[z].as_ptr() as *const _),
                    );
                let m3 = _mm512_set1_epi8(PLANE_MASK);
                q3k_loop(
                    row,
                    a,
                    |sp| q3k_scales16_vbmi(sp),
                    |blk| {
                        let hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk as *const __m256i));
                        let q = _mm512_loadu_si512(blk.add(Q3K_QS) as *const _);
                        let planes = [
                            q,
                            _mm512_srli_epi16::<2>(q),
                            _mm512_srli_epi16::<4>(q),
                            _mm512_srli_epi16::<6>(q),
                        ];
                        std::array::from_fn(|z| {
                            let hb = _mm512_gf2p8affine_epi64_epi8::<0>(hm, hsel[z]);
                            _mm512_ternarylogic_epi32::<AND_OR>(planes[z], m3, hb)
                        })
                    },
                )
            }

            /// The Q3_K super-block loop, `codes` giving the four code vectors of a block
            /// (see [`k16_planes`]) from its address.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q3k_loop(
                row: &[u8],
                a: &Q8K,
                scales: impl Fn(*const u8) -> __m512i,
                codes: impl Fn(*const u8) -> [__m512i; 4],
            ) -> f32 {
                let nsb = row.len() / Q3K_BYTES;
                let p = row.as_ptr();
                let mut acc = _mm512_setzero_ps();
                for s in 0..nsb {
                    let blk = p.add(Q3K_BYTES * s);
                    prefetch_ahead::<Q3K_BYTES>(blk);
                    let sc16 = scales(blk.add(Q3K_SCALES));
                    let w = codes(blk);
                    let sumi = k16_sum(&w, a.qs.as_ptr().add(QK_K * s), sc16);
                    let bs = _mm256_loadu_si256(a.bsums.as_ptr().add(K_GROUPS * s) as *const _);
                    let corr = _mm256_madd_epi16(_mm512_castsi512_si256(sc16), bs);
                    let corr = _mm256_slli_epi32::<Q3K_OFFSET_SHIFT>(corr);
                    let sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(corr));
                    let d = _mm512_set1_ps(h2f(rd16(blk.add(Q3K_D))) * a.d[s]);
                    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
                }
                _mm512_reduce_add_ps(acc)
            }

            /// Q2_K row · q8_K activation: Q3_K's products without the high bit, unsigned
            /// 4-bit scales, mins through the `bsum` dot; d and dmin converted together, ahead
            /// of the loop. Where the CPU has GFNI, the planes come from [`dot_q2k_gfni`].
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q2k_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                // One cached-flag test per row (`std` caches the CPUID bits).
                if std::arch::is_x86_feature_detected!("gfni") {
                    return dot_q2k_gfni(row, a);
                }
                dot_q2k_shift(row, a)
            }

            /// [`dot_q2k_q8k_avx512`] without GFNI: planes by shifts and masks.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_q2k_shift(row: &[u8], a: &Q8K) -> f32 {
                q2k_loop(row, a, |qs| k16_planes(qs))
            }

            /// [`dot_q2k_q8k_avx512`] with GFNI: planes 1..4 by one `vgf2p8affineqb` each
            /// (bits 2z, 2z + 1 of every byte to bits 0, 1, the rest zero) where a shift and
            /// a mask took two ops.
            #[target_feature(enable = $feat_gfni)]
            pub(crate) unsafe fn dot_q2k_gfni(row: &[u8], a: &Q8K) -> f32 {
                let sel: [__m512i; 3] =
                    std::array::from_fn(|z| _mm512_set1_epi64(K16_GF_PLANE[z + 1] as i64));
                let m3 = _mm512_set1_epi8(PLANE_MASK);
                q2k_loop(row, a, |qs| {
                    let q = _mm512_loadu_si512(qs as *const _);
                    [
                        _mm512_and_si512(q, m3),
                        _mm512_gf2p8affine_epi64_epi8::<0>(q, sel[0]),
                        _mm512_gf2p8affine_epi64_epi8::<0>(q, sel[1]),
                        _mm512_gf2p8affine_epi64_epi8::<0>(q, sel[2]),
                    ]
                })
            }

            /// The Q2_K super-block loop, `planes` giving [`k16_planes`] from the plane bytes.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q2k_loop(
                row: &[u8],
                a: &Q8K,
                planes: impl Fn(*const u8) -> [__m512i; 4],
            ) -> f32 {
                let nsb = row.len() / Q2K_BYTES;
                let p = row.as_ptr();
                let low4 = _mm256_set1_epi16(0x0F);
                let mut acc = _mm512_setzero_ps();
                let mut macc = _mm256_setzero_ps();
                // [d·dx, dmin·dx] of each super-block of a chunk, worked out before the chunk's
                // loop: the loop then broadcasts them from memory (a load) rather than from a
                // register (three shuffles per super-block, on the port the scale permutes
                // and packs also need). Zen 4 dev VM, 1 thread, k 4096, L2-resident: 16.7 →
                // 17.3 GB/s; Q3_K and IQ4_XS (one broadcast each) were slower so.
                let mut dd = [0f32; 2 * DD_CHUNK];
                let mut s0 = 0;
                while s0 < nsb {
                    let n = DD_CHUNK.min(nsb - s0);
                    for i in 0..n {
                        let blk = p.add(Q2K_BYTES * (s0 + i));
                        let v = _mm_mul_ps(h2f_pair(blk.add(Q2K_D)), _mm_set1_ps(a.d[s0 + i]));
                        _mm_storel_pd(dd.as_mut_ptr().add(2 * i) as *mut f64, _mm_castps_pd(v));
                    }
                    for (i, ddi) in dd.chunks_exact(2).take(n).enumerate() {
                        let s = s0 + i;
                        let blk = p.add(Q2K_BYTES * s);
                        prefetch_ahead::<Q2K_BYTES>(blk);
                        // Scale (low nibble) and min (high nibble) per group, as i16 lanes.
                        let sm = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk as *const __m128i));
                        let sc16 = _mm512_castsi256_si512(_mm256_and_si256(sm, low4));
                        let mins = _mm256_srli_epi16::<4>(sm);
                        let w = planes(blk.add(Q2K_QS));
                        let sumi = k16_sum(&w, a.qs.as_ptr().add(QK_K * s), sc16);
                        let bs = _mm256_loadu_si256(a.bsums.as_ptr().add(K_GROUPS * s) as *const _);
                        let mn = _mm256_madd_epi16(mins, bs);
                        let d = _mm512_set1_ps(ddi[0]);
                        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
                        let dmin = _mm256_set1_ps(ddi[1]);
                        macc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(mn), macc);
                    }
                    s0 += n;
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

            /// MXFP4 row · q8 activation ([`dot_mxfp4_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_mxfp4_q8_0_avx512(row: &[u8], a: &Q8x32) -> f32 {
                dot_mxfp4_multi::<1>(row, &[a])[0]
            }

            /// MXFP4 row against `N` activations: IQ4_NL's loop with the table values plus
            /// [`MXFP4_BIAS`] by `vpshufb` (unsigned, so one u8 × i8 dot in both flavours, and
            /// `corr` = −12·Σx takes the bias off exactly) and each block's scale built from
            /// its E8M0 byte; the tail blocks take the signed products as IQ4_NL's do.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_mxfp4_multi<const N: usize>(row: &[u8], a: &[&Q8x32; N]) -> [f32; N] {
                let table = mxfp4_table256();
                let table512 = _mm512_broadcast_i32x4(_mm_loadu_si128(
                    MXFP4_BIASED.as_ptr() as *const __m128i
                ));
                dot_pairs4_scaled_multi::<N, MXFP4_BYTES, { STEP4 * MXFP4_BYTES }>(
                    row,
                    a,
                    MXFP4_CORR_LANES,
                    |g| {
                        let nib = |o: usize| nibbles32(g.add(MXFP4_BYTES * o + MXFP4_QS));
                        (
                            _mm512_shuffle_epi8(table512, join(nib(0), nib(1))),
                            _mm512_shuffle_epi8(table512, join(nib(2), nib(3))),
                        )
                    },
                    |c, w, x| $dp(c, w, x),
                    |blk, a, b| mxfp4_block(table, blk, a, b),
                    |g| mxfp4_scales_x4(g, MXFP4_BYTES),
                    |blk| mxfp4_scale(blk),
                )
            }

            /// IQ4_XS row · q8_K activation ([`dot_iq4xs_multi`] of one activation).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dot_iq4xs_q8k_avx512(row: &[u8], a: &Q8K) -> f32 {
                dot_iq4xs_multi::<1>(row, &[a])[0]
            }

            /// IQ4_XS row against `N` activations. One 64-byte load of nibbles is four
            /// sub-blocks; its low nibbles are their first halves and its high nibbles their
            /// second, which is the activation's order (`act::iq4xs_pos`), so 128-bit lane c
            /// of both products is sub-block c of the span. Both products of a span go into
            /// one i32 accumulator, scaled once per super-block by a 32-bit multiply.
            ///
            /// With VNNI the table holds value + 128 (unsigned, so `vpdpbusd` takes it as is)
            /// and the bias comes off exactly as 128·Σ sc·Σx per sub-block from the
            /// activation's `sums32`; without, |value| and the activation with the value's
            /// sign go into `vpmaddubsw` (|value| ≤ 127, so no saturation).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_iq4xs_multi<const N: usize>(row: &[u8], a: &[&Q8K; N]) -> [f32; N] {
                let nsb = row.len() / IQ4XS_BYTES;
                let p = row.as_ptr();
                let table = _mm512_broadcast_i32x4(_mm_loadu_si128(if $biased {
                    IQ4NL_BIASED.as_ptr() as *const __m128i
                } else {
                    IQ4NL_VALUES.as_ptr() as *const __m128i
                }));
                let m4 = _mm512_set1_epi8(0x0F);
                let (sel_lo, sel_hi) = (ld_idx(&IDX_SUB_LO), ld_idx(&IDX_SUB_HI));
                let mut acc = [_mm512_setzero_ps(); N];
                for s in 0..nsb {
                    let blk = p.add(IQ4XS_BYTES * s);
                    prefetch_ahead::<IQ4XS_BYTES>(blk);
                    let sc = iq4xs_scales(blk);
                    let sc32 = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(sc));
                    let (sc_lo, sc_hi) = (
                        _mm512_permutexvar_epi32(sel_lo, sc32),
                        _mm512_permutexvar_epi32(sel_hi, sc32),
                    );
                    let q0 = _mm512_loadu_si512(blk.add(IQ4XS_QS) as *const _);
                    let q1 = _mm512_loadu_si512(blk.add(IQ4XS_QS + 64) as *const _);
                    let w = [
                        _mm512_and_si512(q0, m4),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m4),
                        _mm512_and_si512(q1, m4),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4),
                    ]
                    .map(|c| _mm512_shuffle_epi8(table, c));
                    // Without VNNI: |value| and the sign mask, once for every activation.
                    let wabs = if $biased {
                        w
                    } else {
                        w.map(|v| _mm512_abs_epi8(v))
                    };
                    let neg: [__mmask64; 4] = if $biased {
                        [0; 4]
                    } else {
                        w.map(|v| _mm512_movepi8_mask(v))
                    };
                    let wd = h2f(rd16(blk));
                    for j in 0..N {
                        let xq = a[j].qs.as_ptr().add(QK_K * s);
                        let x: [__m512i; 4] =
                            std::array::from_fn(|t| _mm512_loadu_si512(xq.add(64 * t) as *const _));
                        let dp = |acc: __m512i, t: usize| {
                            if $biased {
                                $dp(acc, wabs[t], x[t])
                            } else {
                                let sx = _mm512_mask_sub_epi8(
                                    x[t],
                                    neg[t],
                                    _mm512_setzero_si512(),
                                    x[t],
                                );
                                $dp(acc, wabs[t], sx)
                            }
                        };
                        let z = _mm512_setzero_si512();
                        let lo = dp(dp(z, 0), 1);
                        let hi = dp(dp(z, 2), 3);
                        let mut sumi = _mm512_add_epi32(
                            _mm512_mullo_epi32(lo, sc_lo),
                            _mm512_mullo_epi32(hi, sc_hi),
                        );
                        if $biased {
                            let sums = _mm_loadu_si128(
                                a[j].sums32.as_ptr().add(IQ4XS_SUBS * s) as *const __m128i
                            );
                            let bias = _mm_slli_epi32::<IQ4_BIAS_SHIFT>(_mm_madd_epi16(sc, sums));
                            sumi = _mm512_sub_epi32(sumi, _mm512_zextsi128_si512(bias));
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
            multi_rows!($feat, Q8x32, gemv_mxfp4_multi, rows_mxfp4, dot_mxfp4_multi);
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
    dp_scaled_plain,
    dpwssd_plain,
    false,
    false,
    "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c,gfni"
);
mix_kernels!(
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    dp_u8i8_vnni,
    dp_i8i8_vnni,
    dp_scaled_vnni,
    dpwssd_vnni,
    true,
    true,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c,gfni"
);

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn q3k_scale_vector_matches_the_reference_unpacking() {
        if !crate::SimdTier::Avx512.is_supported() {
            println!("SKIPPED: no AVX-512");
            return;
        }
        let has_vbmi = std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("gfni");
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        for _ in 0..1000 {
            let b: [u8; 12] = std::array::from_fn(|_| rng.random());
            // SAFETY: AVX-512 was detected; b is the 12 bytes the function reads.
            let v = unsafe { _mm512_castsi512_si256(q3k_scales16(b.as_ptr())) };
            // SAFETY: __m256i and [i16; 16] have the same size; every bit pattern is valid.
            let got: [i16; 16] = unsafe { std::mem::transmute(v) };
            let want = crate::formats::kquant_low::q3k_scales(&b).map(|c| i16::from(c) - 32);
            assert_eq!(got, want, "{b:?}");
            if has_vbmi {
                // SAFETY: AVX-512 VBMI and GFNI were detected; b is the 12 bytes it reads.
                let v = unsafe { _mm512_castsi512_si256(q3k_scales16_vbmi(b.as_ptr())) };
                // SAFETY: as above.
                let got: [i16; 16] = unsafe { std::mem::transmute(v) };
                assert_eq!(got, want, "VBMI, {b:?}");
            }
        }
    }

    /// The GFNI Q2_K kernels build the same planes as the shift kernels: the same bits.
    #[test]
    fn q2k_gfni_kernels_match_the_shift_kernels_bit_for_bit() {
        if !crate::SimdTier::Avx512.is_supported() || !std::arch::is_x86_feature_detected!("gfni") {
            println!("SKIPPED: no AVX-512 with GFNI");
            return;
        }
        let vnni = crate::SimdTier::Avx512Vnni.is_supported();
        let mut rng = ChaCha8Rng::seed_from_u64(10);
        for k in [QK_K, 4096] {
            for _ in 0..50 {
                let mut row: Vec<u8> = (0..k / QK_K * Q2K_BYTES).map(|_| rng.random()).collect();
                for blk in row.chunks_exact_mut(Q2K_BYTES) {
                    for o in [Q2K_D, Q2K_D + 2] {
                        let d = crate::formats::f32_to_f16(rng.random_range(1e-4f32..1.0));
                        blk[o..o + 2].copy_from_slice(&d);
                    }
                }
                let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let act = crate::ActivationBuf::prepare(crate::Format::Q2K, &x).expect("act");
                let crate::act::ActKind::Q8K(a) = &act.kind else {
                    panic!("Q2_K takes a q8_K activation")
                };
                // SAFETY: AVX-512 (and VNNI where called) and GFNI were detected; the row is
                // whole super-blocks and the activation was prepared for Q2_K and k.
                unsafe {
                    let want = plain::dot_q2k_shift(&row, a);
                    assert_eq!(plain::dot_q2k_gfni(&row, a).to_bits(), want.to_bits());
                    if vnni {
                        let want = vnni::dot_q2k_shift(&row, a);
                        assert_eq!(vnni::dot_q2k_gfni(&row, a).to_bits(), want.to_bits());
                    }
                }
            }
        }
    }

    /// The GFNI + VBMI Q3_K kernels build the same code and scale vectors as the others, so
    /// their results are the same bits. Random bytes cover every code, `hmask` and scale
    /// pattern; d is set to a finite f16.
    #[test]
    fn q3k_gfni_kernels_match_the_test_kernels_bit_for_bit() {
        let gfni = std::arch::is_x86_feature_detected!("gfni")
            && std::arch::is_x86_feature_detected!("avx512vbmi");
        if !crate::SimdTier::Avx512.is_supported() || !gfni {
            println!("SKIPPED: no AVX-512 with GFNI and VBMI");
            return;
        }
        let vnni = crate::SimdTier::Avx512Vnni.is_supported();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for k in [QK_K, 4096] {
            for _ in 0..50 {
                let mut row: Vec<u8> = (0..k / QK_K * Q3K_BYTES).map(|_| rng.random()).collect();
                for blk in row.chunks_exact_mut(Q3K_BYTES) {
                    let d = crate::formats::f32_to_f16(rng.random_range(1e-4f32..1.0));
                    blk[Q3K_D..Q3K_D + 2].copy_from_slice(&d);
                }
                let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let act = crate::ActivationBuf::prepare(crate::Format::Q3K, &x).expect("act");
                let crate::act::ActKind::Q8K(a) = &act.kind else {
                    panic!("Q3_K takes a q8_K activation")
                };
                // SAFETY: AVX-512 (and VNNI where called), GFNI and VBMI were detected; the row
                // is whole super-blocks and the activation was prepared for Q3_K and k.
                unsafe {
                    let want = plain::dot_q3k_test(&row, a);
                    assert_eq!(plain::dot_q3k_gfni(&row, a).to_bits(), want.to_bits());
                    if vnni {
                        let want = vnni::dot_q3k_test(&row, a);
                        assert_eq!(vnni::dot_q3k_gfni(&row, a).to_bits(), want.to_bits());
                    }
                }
            }
        }
    }
}
