//! Q4_K rows against several q8_K activations with the rows in the vector lanes (AVX-512 VNNI).
//!
//! [`super::avx512`]'s multi kernel keeps one row's 256 weights of a super-block across the
//! lanes, so every (row, activation) pair pays the sub-block scaling (packs, `vpdpwssd`, the
//! f32 conversion and the mins) again: at 8 activations it is compute-bound at a third of the
//! DRAM rate (H200 box: the passback CPU arm fell from 41–45 GB/s at 4 columns to 17–23 at 8,
//! `docs/perf-checkpoints/2026-12-01-serve-gpu-h200`). Here 16 rows are transposed once per
//! super-block so that lane r holds row r: each `vpdpbusd` then takes four activation bytes
//! broadcast from memory, and the per-sub-block scale, the super-block scales and the mins are
//! applied once per 16 rows instead of once per row. The transpose is paid once per 16 rows and
//! super-block whatever the column count, so the kernel runs from [`TILED_MIN_COLS`] columns.
//!
//! Rounding: the integer sums are exact as in the lane-per-weight kernel, but the f32 sums run in
//! another order, so a column computed here differs in its last bits from the same column
//! computed alone; every column count from [`TILED_MIN_COLS`] up gives the same bits.

use crate::act::Q8K;
use crate::dot::avx2::{Q4K_BYTES, Q4K_QS};
use crate::dot::avx512::vnni;
use crate::formats::kquant::QK_K;
use std::arch::x86_64::*;

/// Rows transposed into the lanes of one vector.
const TILE_ROWS: usize = 16;
/// Fewest activations for which the tiled kernel runs (fewer go to the lane-per-weight kernel).
/// Measured on the H200 box's Xeon, 16 threads, DRAM-fed (gemv_gbs, k 4096 / 14336, GB/s
/// lane-per-weight vs tiled): 4 activations 74.0 / 61.1 and 74.6 / 67.3, 5 activations 47.6 /
/// 62.6 and 41.8 / 74.5 (the lane-per-weight kernel takes 4 at a time), 8: 35.5 / 58.2 and 34.1 /
/// 57.9 (`docs/perf-checkpoints/2026-12-01-multi-column-kernels-h200`, sweep.log).
pub(crate) const TILED_MIN_COLS: usize = 5;
/// Activations whose integer sums are held in registers at once.
const COL_GROUP: usize = 8;
/// Activations per pass over the rows (their f32 accumulators live on the stack).
const PASS_COLS: usize = 32;
/// Position of sub-block b inside a q8_K block's quants ([`crate::act::Q4K_ACT_ORDER`] is its
/// own inverse).
const ACT_POS: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];
/// Super-blocks ahead of the tile that each row's lines are prefetched.
const PREFETCH_BLOCKS: usize = 2;
/// Elements per Q4_K sub-block.
const SUB: usize = 32;

/// One super-block of 16 rows, transposed: `q[b][g]` lane r holds row r's weights
/// `4g..4g+4` of sub-block b as bytes; `sc[b]` row r's sub-block scale; `mp[q]` row r's mins
/// of sub-blocks 2q and 2q+1 as an i16 pair; `d`, `dmin` the rows' super-block scales.
#[repr(C, align(64))]
struct Tile {
    q: [[__m512i; 8]; 8],
    sc: [__m512; 8],
    mp: [__m512i; 4],
    d: __m512,
    dmin: __m512,
}

/// `vpermt2d` index vectors of the 16 × 8 dword transpose (see [`transpose`]): stage 1 by output
/// e, stage 2 by f, stage 3 by h. Bit 4 picks the second source.
const fn transpose_indices() -> [[u32; 16]; 6] {
    let mut out = [[0u32; 16]; 6];
    let mut e = 0;
    while e < 2 {
        let mut l = 0;
        while l < 16 {
            // Stage 1: lane l -> (row 4p' + l/4, g = 4e + l%4) from Z_{2p'} (rows 4p', +1) and
            // Z_{2p'+1} (rows +2, +3), where Z_p lane 8h + g holds (row 2p + h, g).
            let (rl, g) = (l / 4, 4 * e + l % 4);
            out[e][l] = if rl < 2 {
                (8 * rl + g) as u32
            } else {
                (16 + 8 * (rl - 2) + g) as u32
            };
            // Stage 2: lane l -> (row 8p'' + l/2, g = 4e + 2f + l%2) from A_{2p'',e} and
            // A_{2p''+1,e}, where A lane 4·row_local + (g - 4e) holds (row, g).
            let (rl2, f) = (l / 2, e);
            let gg = 2 * f + l % 2;
            out[2 + e][l] = if rl2 < 4 {
                (4 * rl2 + gg) as u32
            } else {
                (16 + 4 * (rl2 - 4) + gg) as u32
            };
            // Stage 3: lane r -> (row r, g = 4e + 2f + h) from B_{0,e,f} (rows 0..8) and
            // B_{1,e,f} (rows 8..16), where B lane 2·row_local + h holds (row, g).
            let h = e;
            out[4 + e][l] = if l < 8 {
                (2 * l + h) as u32
            } else {
                (16 + 2 * (l - 8) + h) as u32
            };
            l += 1;
        }
        e += 1;
    }
    out
}
const TRANSPOSE_IDX: [[u32; 16]; 6] = transpose_indices();

/// `vpshufb` patterns turning a dword of four mins bytes into the i16 pair of bytes (0, 1)
/// (`MIN_PAIR_LO`) or (2, 3) (`MIN_PAIR_HI`), per 128-bit lane.
const fn min_pair(first: u8) -> [u8; 64] {
    let mut p = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        let base = (4 * (i % 4)) as u8;
        p[4 * i] = base + first;
        p[4 * i + 1] = 0x80;
        p[4 * i + 2] = base + first + 1;
        p[4 * i + 3] = 0x80;
        i += 1;
    }
    p
}
const MIN_PAIR_LO: [u8; 64] = min_pair(0);
const MIN_PAIR_HI: [u8; 64] = min_pair(2);

#[inline(always)]
unsafe fn ld_idx(v: &[u32; 16]) -> __m512i {
    _mm512_loadu_si512(v.as_ptr() as *const _)
}

/// 16 rows × 8 dwords (`z[p]` = [row 2p | row 2p+1]) → `out[g]` lane r = row r's dword g.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn transpose(z: &[__m512i; 8]) -> [__m512i; 8] {
    let i1 = [ld_idx(&TRANSPOSE_IDX[0]), ld_idx(&TRANSPOSE_IDX[1])];
    let i2 = [ld_idx(&TRANSPOSE_IDX[2]), ld_idx(&TRANSPOSE_IDX[3])];
    let i3 = [ld_idx(&TRANSPOSE_IDX[4]), ld_idx(&TRANSPOSE_IDX[5])];
    // Plain loops, no closures: a closure would not inherit this function's target features,
    // and each intrinsic in it would become a call.
    let zero = _mm512_setzero_si512();
    // a[p'][e]: rows 4p'..4p'+4, g 4e..4e+4.
    let mut a = [[zero; 2]; 4];
    for p in 0..4 {
        for e in 0..2 {
            a[p][e] = _mm512_permutex2var_epi32(z[2 * p], i1[e], z[2 * p + 1]);
        }
    }
    // b[p''][e][f]: rows 8p''..8p''+8, g 4e+2f..4e+2f+2.
    let mut b = [[[zero; 2]; 2]; 2];
    for p in 0..2 {
        for e in 0..2 {
            for f in 0..2 {
                b[p][e][f] = _mm512_permutex2var_epi32(a[2 * p][e], i2[f], a[2 * p + 1][e]);
            }
        }
    }
    let mut out = [zero; 8];
    for (g, o) in out.iter_mut().enumerate() {
        let (e, f, h) = (g / 4, (g / 2) % 2, g % 2);
        *o = _mm512_permutex2var_epi32(b[0][e][f], i3[h], b[1][e][f]);
    }
    out
}

/// The first 16 bytes of 16 rows' super-blocks (`base`, `rb` apart) as four dword vectors:
/// lane r of vector c holds dword c of row r (d|dmin, then the three scale words).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn headers(base: *const u8, rb: usize) -> [__m512i; 4] {
    let ld = |r: usize| _mm_loadu_si128(base.add(r * rb) as *const __m128i);
    let mut y = [_mm512_setzero_si512(); 4];
    for (k, yk) in y.iter_mut().enumerate() {
        let lo = _mm256_set_m128i(ld(4 * k + 1), ld(4 * k));
        let hi = _mm256_set_m128i(ld(4 * k + 3), ld(4 * k + 2));
        *yk = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
    }
    // y[k] lane 4i + c holds (row 4k + i, dword c); HEADER_IDX turns that into lane r of dword c.
    let i1 = [ld_idx(&HEADER_IDX[0]), ld_idx(&HEADER_IDX[1])];
    let i2 = [ld_idx(&HEADER_IDX[2]), ld_idx(&HEADER_IDX[3])];
    let mut a = [[_mm512_setzero_si512(); 2]; 2];
    for p in 0..2 {
        for e in 0..2 {
            a[p][e] = _mm512_permutex2var_epi32(y[2 * p], i1[e], y[2 * p + 1]);
        }
    }
    let mut out = [_mm512_setzero_si512(); 4];
    for (c, o) in out.iter_mut().enumerate() {
        let (e, h) = (c / 2, c % 2);
        *o = _mm512_permutex2var_epi32(a[0][e], i2[h], a[1][e]);
    }
    out
}

/// `vpermt2d` indices of [`headers`]' 16 × 4 transpose. Stage 1 (by e): lane l -> (row 8p + l/2,
/// dword 2e + l%2) from y[2p] (rows 8p..8p+4) and y[2p+1] (rows +4..+8), where y lane 4i + c
/// holds (row 4k + i, c). Stage 2 (by h): lane r -> (row r, dword 2e + h) from a[0][e] (rows
/// 0..8) and a[1][e] (rows 8..16), where a lane 2·row_local + (c - 2e) holds (row, c).
const fn header_indices() -> [[u32; 16]; 4] {
    let mut out = [[0u32; 16]; 4];
    let mut e = 0;
    while e < 2 {
        let mut l = 0;
        while l < 16 {
            let (rl, c) = (l / 2, 2 * e + l % 2);
            out[e][l] = if rl < 4 {
                (4 * rl + c) as u32
            } else {
                (16 + 4 * (rl - 4) + c) as u32
            };
            out[2 + e][l] = if l < 8 {
                (2 * l + e) as u32
            } else {
                (16 + 2 * (l - 8) + e) as u32
            };
            l += 1;
        }
        e += 1;
    }
    out
}
const HEADER_IDX: [[u32; 16]; 4] = header_indices();

/// Fills `t` from the super-blocks of 16 rows starting at `base`, `rb` bytes apart.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn fill_tile(t: &mut Tile, base: *const u8, rb: usize) {
    const KMASK1: i32 = 0x3f3f_3f3f;
    const KMASK2: i32 = 0x0f0f_0f0f;
    const KMASK3: i32 = 0x0303_0303;
    let [h, u0, u1, u2] = headers(base, rb);
    t.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    t.dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h)));
    let k1 = _mm512_set1_epi32(KMASK1);
    let k2 = _mm512_set1_epi32(KMASK2);
    let k3 = _mm512_set1_epi32(KMASK3);
    // ggml's utmp shuffle (q4k_unpack_scales) on 16 rows at once.
    let s_lo = _mm512_and_si512(u0, k1);
    let s_hi = _mm512_or_si512(
        _mm512_and_si512(u2, k2),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3)),
    );
    let m_lo = _mm512_and_si512(u1, k1);
    let m_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)),
    );
    let byte = _mm512_set1_epi32(0xFF);
    for b in 0..4 {
        let sh = _mm512_set1_epi32(8 * b as i32);
        t.sc[b] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(s_lo, sh), byte));
        t.sc[b + 4] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(s_hi, sh), byte));
    }
    let (plo, phi) = (
        _mm512_loadu_si512(MIN_PAIR_LO.as_ptr() as *const _),
        _mm512_loadu_si512(MIN_PAIR_HI.as_ptr() as *const _),
    );
    t.mp = [
        _mm512_shuffle_epi8(m_lo, plo),
        _mm512_shuffle_epi8(m_lo, phi),
        _mm512_shuffle_epi8(m_hi, plo),
        _mm512_shuffle_epi8(m_hi, phi),
    ];
    // 16 row streams: the hardware prefetcher does not follow them all.
    for r in 0..TILE_ROWS {
        let next = base.wrapping_add(r * rb + PREFETCH_BLOCKS * Q4K_BYTES);
        for line in 0..3 {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line) as *const i8);
        }
    }
    let m4 = _mm512_set1_epi8(0x0F);
    for j4 in 0..4 {
        let q = base.add(Q4K_QS + 32 * j4);
        let mut z = [_mm512_setzero_si512(); 8];
        for (p, zp) in z.iter_mut().enumerate() {
            let r0 = _mm256_loadu_si256(q.add(2 * p * rb) as *const __m256i);
            let r1 = _mm256_loadu_si256(q.add((2 * p + 1) * rb) as *const __m256i);
            *zp = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(r0), r1);
        }
        let o = transpose(&z);
        for (g, og) in o.iter().enumerate() {
            t.q[2 * j4][g] = _mm512_and_si512(*og, m4);
            t.q[2 * j4 + 1][g] = _mm512_and_si512(_mm512_srli_epi16::<4>(*og), m4);
        }
    }
}

/// Tile `t` (super-block `s`) against activations `a` (`NG` ≤ [`COL_GROUP`] of them) into
/// their accumulators `acc` / `macc` (Σ d·dx·Σ sc·q·x and Σ dmin·dx·Σ m·Σx, per row lane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_dots<const NG: usize>(
    t: &Tile,
    s: usize,
    a: &[&Q8K],
    acc: &mut [__m512],
    macc: &mut [__m512],
) {
    let mut xq = [std::ptr::null::<u8>(); NG];
    for (j, x) in xq.iter_mut().enumerate() {
        *x = a[j].qs.as_ptr().add(QK_K * s) as *const u8;
    }
    let mut f = [_mm512_setzero_ps(); NG];
    for (b, &pos) in ACT_POS.iter().enumerate() {
        let mut isum = [_mm512_setzero_si512(); NG];
        let xo = SUB * pos;
        for g in 0..8 {
            let w = t.q[b][g];
            for j in 0..NG {
                let x = _mm512_set1_epi32((xq[j].add(xo + 4 * g) as *const i32).read_unaligned());
                isum[j] = _mm512_dpbusd_epi32(isum[j], w, x);
            }
        }
        for j in 0..NG {
            f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), t.sc[b], f[j]);
        }
    }
    for j in 0..NG {
        let sums = a[j].sums32.as_ptr().add(8 * s) as *const i32;
        let mut mi = _mm512_setzero_si512();
        for q in 0..4 {
            mi = _mm512_dpwssd_epi32(mi, t.mp[q], _mm512_set1_epi32(sums.add(q).read_unaligned()));
        }
        let dx = _mm512_set1_ps(*a[j].d.as_ptr().add(s));
        acc[j] = _mm512_fmadd_ps(f[j], _mm512_mul_ps(t.d, dx), acc[j]);
        macc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_mul_ps(t.dmin, dx), macc[j]);
    }
}

/// [`tile_dots`] for a group of any size up to [`COL_GROUP`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_dots(t: &Tile, s: usize, a: &[&Q8K], acc: &mut [__m512], macc: &mut [__m512]) {
    match a.len() {
        1 => tile_dots::<1>(t, s, a, acc, macc),
        2 => tile_dots::<2>(t, s, a, acc, macc),
        3 => tile_dots::<3>(t, s, a, acc, macc),
        4 => tile_dots::<4>(t, s, a, acc, macc),
        5 => tile_dots::<5>(t, s, a, acc, macc),
        6 => tile_dots::<6>(t, s, a, acc, macc),
        7 => tile_dots::<7>(t, s, a, acc, macc),
        _ => tile_dots::<8>(t, s, a, acc, macc),
    }
}

/// `ys[j][i] (+)= row_i · acts[j]` for Q4_K rows `rb` bytes apart (the multi-activation
/// contract of [`vnni::gemv_q4k_multi`], whose shapes the dispatcher checked): whole groups of
/// 16 rows through the tiled kernel when there are at least [`TILED_MIN_COLS`] activations, the
/// rest through the lane-per-weight one.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `w_rows` holds `ys[0].len()` rows of `rb` bytes, `rb` a
/// multiple of the Q4_K block; every activation is q8_K of the rows' length; `ys` all have the
/// same length, one per activation.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q4k_multi(
    w_rows: &[u8],
    rb: usize,
    acts: &[&Q8K],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) {
    let m = ys.first().map_or(0, |y| y.len());
    let tiled = (m / TILE_ROWS) * TILE_ROWS;
    if acts.len() < TILED_MIN_COLS || tiled == 0 {
        return vnni::gemv_q4k_multi(w_rows, rb, acts, ys, accumulate);
    }
    let nsb = rb / Q4K_BYTES;
    let mut t: Tile = std::mem::zeroed();
    let mut acc = [_mm512_setzero_ps(); PASS_COLS];
    let mut macc = [_mm512_setzero_ps(); PASS_COLS];
    for (a, y) in acts.chunks(PASS_COLS).zip(ys.chunks_mut(PASS_COLS)) {
        for row0 in (0..tiled).step_by(TILE_ROWS) {
            let n = a.len();
            acc[..n].fill(_mm512_setzero_ps());
            macc[..n].fill(_mm512_setzero_ps());
            let rows = w_rows.as_ptr().add(row0 * rb);
            for s in 0..nsb {
                fill_tile(&mut t, rows.add(s * Q4K_BYTES), rb);
                for (g, ag) in a.chunks(COL_GROUP).enumerate() {
                    let j0 = g * COL_GROUP;
                    let j1 = j0 + ag.len();
                    group_dots(&t, s, ag, &mut acc[j0..j1], &mut macc[j0..j1]);
                }
            }
            for (j, yj) in y.iter_mut().enumerate() {
                let v = _mm512_sub_ps(acc[j], macc[j]);
                let dst = yj.as_mut_ptr().add(row0);
                let v = if accumulate {
                    _mm512_add_ps(_mm512_loadu_ps(dst), v)
                } else {
                    v
                };
                _mm512_storeu_ps(dst, v);
            }
        }
    }
    if tiled < m {
        let mut rest: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[tiled..]).collect();
        vnni::gemv_q4k_multi(&w_rows[tiled * rb..], rb, acts, &mut rest, accumulate);
    }
}
