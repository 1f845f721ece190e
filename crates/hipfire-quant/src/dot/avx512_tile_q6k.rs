//! Q6_K rows against several q8_K activations with the rows in the vector lanes (AVX-512 VNNI),
//! the Q6_K counterpart of [`super::avx512_tile`]'s Q4_K kernel.
//!
//! The lane-per-weight kernel of [`super::avx512`] spends two ops per 64 weights and column
//! (`vpmaddubsw`, then `vpdpwssd` by the sub-block scales) plus the `−32·Σ sc·bsum` term: at
//! 16 columns it runs at a sixth of its one-column GB/s on the 2-core Zen 4 VM
//! (`docs/perf-checkpoints/2026-12-04-cpu-multi-column-2core`). Here a super-block of 16 rows
//! is transposed (raw `ql` / `qh` bytes, then decoded in the lanes) once, so lane r holds row r:
//! per column and super-block, one `vpdpbusd` per 16 rows × 4 weights (four activation bytes
//! broadcast from memory), one conversion and FMA per 16-element sub-block to apply the rows'
//! sub-block scales, eight `vpdpwssd` for the rows' `Σ sc·bsum`, and one FMA by the rows'
//! super-block scales. The transpose and decode are paid once per 16 rows and super-block
//! whatever the column count.
//!
//! Rounding: each sub-block's integer sum is exact as in the lane-per-weight kernel, but the
//! sub-block scales and the super-block sums are applied in f32 in another order, so a column
//! computed here differs in its last bits from the same column computed alone; every column count
//! from [`Q6K_TILED_MIN_COLS`] up gives the same bits.

use crate::act::Q8K;
use crate::dot::avx2::{Q6K_BYTES, Q6K_D, Q6K_QH, Q6K_SCALES};
use crate::dot::avx512::{dpwssd_vnni, vnni};
use crate::dot::avx512_tile::{headers, rows_transposed, MAX_GATHER_ROW_BYTES, TILE_ROWS};
use crate::formats::kquant::QK_K;
use std::arch::x86_64::*;

/// Fewest activations for which the tiled Q6_K kernel runs (fewer go to the lane-per-weight
/// kernel): the transpose and in-lane decode of a super-block cost about what eight columns'
/// dots do. Measured on the 2-core Zen 4 VM (`multicol_gbs --modes tiled --threads 1`, k 4096,
/// 64 MiB, CPU-time GB/s, lane-per-weight vs tiled, two interleaved runs): 6 columns 7.21 / 6.80
/// and 6.81 / 6.71, 7: 6.03 / 6.51 and 5.80 / 6.50, 16: 2.94 / 4.25
/// (`docs/perf-checkpoints/2026-12-04-cpu-multi-column-2core`, `sweep_q6k_*.log`).
pub(crate) const Q6K_TILED_MIN_COLS: usize = 7;
/// Activations whose integer sums are held in registers at once (the Q4_K tile's value, not
/// swept here).
const COL_GROUP: usize = 8;
/// Activations per pass over the rows (their f32 accumulators live on the stack): the
/// dispatcher's `MULTI_GROUP`, so a call transposes each super-block once.
const PASS_COLS: usize = 32;
/// Super-blocks ahead of the tile that each row's lines are prefetched (the Q4_K tile's value,
/// not swept here).
const PREFETCH_BLOCKS: usize = 2;
/// Elements per Q6_K sub-block (one i8 scale each).
const SUB: usize = 16;
/// Sub-blocks per super-block.
const SUBS: usize = QK_K / SUB;
/// Cache lines one row's super-block spans (210 bytes at any alignment).
const BLOCK_LINES: usize = 4;

/// One super-block of 16 rows, transposed: `q[e]` lane r holds row r's 6-bit codes of
/// elements `4e..4e+4` as bytes; `sc[s]` row r's sub-block scale s as f32; `scp[p]` row r's
/// scales of sub-blocks 2p and 2p+1 as an i16 pair; `d` the rows' super-block scales.
#[repr(C, align(64))]
struct Tile {
    q: [__m512i; QK_K / 4],
    sc: [__m512; SUBS],
    scp: [__m512i; SUBS / 2],
    d: __m512,
}

/// `vpshufb` patterns putting bytes (0, 1) (`SC_PAIR_LO`) or (2, 3) (`SC_PAIR_HI`) of each dword
/// into the high bytes of its two i16 halves (an arithmetic shift right by 8 then sign-extends);
/// an index with bit 7 set (0x80) writes a zero byte.
const fn sc_pair(first: u8) -> [u8; 64] {
    let mut p = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        let base = (4 * (i % 4)) as u8;
        p[4 * i] = 0x80;
        p[4 * i + 1] = base + first;
        p[4 * i + 2] = 0x80;
        p[4 * i + 3] = base + first + 1;
        i += 1;
    }
    p
}
const SC_PAIR_LO: [u8; 64] = sc_pair(0);
const SC_PAIR_HI: [u8; 64] = sc_pair(2);

/// Fills `t` from the super-blocks of 16 rows starting at `base`, `rb` bytes apart (`offs` holds
/// `r·rb`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn fill_tile(t: &mut Tile, base: *const u8, rb: usize, offs: __m512i) {
    // 16 row streams: the hardware prefetcher does not follow them all.
    for r in 0..TILE_ROWS {
        let next = base.wrapping_add(r * rb + PREFETCH_BLOCKS * Q6K_BYTES);
        for line in 0..BLOCK_LINES {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line) as *const i8);
        }
    }
    // The dword ending at the block's end: scales 14, 15 then d (a dword at `Q6K_D` would read
    // past the last row).
    let h = _mm512_i32gather_epi32::<1>(offs, base.add(Q6K_D - 2) as *const i32);
    t.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h)));
    let sc = headers(base.add(Q6K_SCALES), rb);
    let (plo, phi) = (
        _mm512_loadu_si512(SC_PAIR_LO.as_ptr() as *const _),
        _mm512_loadu_si512(SC_PAIR_HI.as_ptr() as *const _),
    );
    // Dword c of a row holds its i8 scales 4c..4c+4: byte i sign-extended is a shift of it to
    // the top of the dword and an arithmetic shift back by 24.
    for (c, v) in sc.iter().enumerate() {
        t.sc[4 * c] = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(*v)));
        t.sc[4 * c + 1] = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(*v)));
        t.sc[4 * c + 2] = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(*v)));
        t.sc[4 * c + 3] = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(*v));
        t.scp[2 * c] = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(*v, plo));
        t.scp[2 * c + 1] = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(*v, phi));
    }
    // Raw bytes in the lanes: ql[d] lane r = row r's ql bytes 4d..4d+4 (d < 32), qh[d] its qh
    // bytes 4d..4d+4 (d < 16).
    let mut ql = [_mm512_setzero_si512(); 32];
    for c in 0..4 {
        ql[8 * c..8 * c + 8].copy_from_slice(&rows_transposed(base.add(32 * c), rb));
    }
    let mut qh = [_mm512_setzero_si512(); 16];
    for c in 0..2 {
        qh[8 * c..8 * c + 8].copy_from_slice(&rows_transposed(base.add(Q6K_QH + 32 * c), rb));
    }
    // ggml's layout: in half n, element 32t + l (l < 32) has the low nibble (t ≥ 2: high) of ql
    // byte 64n + 32(t & 1) + l and bits 2t..2t+2 of qh byte 32n + l as its bits 4, 5.
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    for n in 0..2 {
        for u in 0..8 {
            let h = qh[8 * n + u];
            let hs = [
                _mm512_slli_epi16::<4>(h),
                _mm512_slli_epi16::<2>(h),
                h,
                _mm512_srli_epi16::<2>(h),
            ];
            for (tt, ht) in hs.iter().enumerate() {
                let l = ql[16 * n + 8 * (tt & 1) + u];
                let lo = if tt < 2 {
                    _mm512_and_si512(l, m4)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(l), m4)
                };
                // lo | (ht & 0x30) in one op (0xF8: A | (B & C)).
                t.q[32 * n + 8 * tt + u] = _mm512_ternarylogic_epi32::<0xF8>(lo, *ht, m30);
            }
        }
    }
}

/// Tile `t` (super-block `s`) against activations `a` (`NG` ≤ [`COL_GROUP`] of them) into their
/// accumulators `acc` (per row lane Σ_s d·dx·(Σ_b sc_b·Σ q·x − 32·Σ_b sc_b·bsum_b)).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_dots<const NG: usize>(t: &Tile, s: usize, a: &[&Q8K], acc: &mut [__m512]) {
    let mut xq = [std::ptr::null::<i32>(); NG];
    for (j, x) in xq.iter_mut().enumerate() {
        *x = a[j].qs.as_ptr().add(QK_K * s) as *const i32;
    }
    let mut f = [_mm512_setzero_ps(); NG];
    for b in 0..SUBS {
        let mut isum = [_mm512_setzero_si512(); NG];
        for g in 0..SUB / 4 {
            let e = SUB / 4 * b + g;
            let w = t.q[e];
            for j in 0..NG {
                let x = _mm512_set1_epi32(xq[j].add(e).read_unaligned());
                isum[j] = _mm512_dpbusd_epi32(isum[j], w, x);
            }
        }
        for j in 0..NG {
            f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), t.sc[b], f[j]);
        }
    }
    /// Q6_K's code offset: weights are `code − 32`.
    const OFFSET: f32 = -32.0;
    for j in 0..NG {
        let bs = a[j].bsums.as_ptr().add(SUBS * s) as *const i32;
        let mut mi = _mm512_setzero_si512();
        for (p, sp) in t.scp.iter().enumerate() {
            mi = dpwssd_vnni(mi, *sp, _mm512_set1_epi32(bs.add(p).read_unaligned()));
        }
        let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_set1_ps(OFFSET), f[j]);
        let dx = _mm512_set1_ps(*a[j].d.as_ptr().add(s));
        acc[j] = _mm512_fmadd_ps(v, _mm512_mul_ps(t.d, dx), acc[j]);
    }
}

/// [`tile_dots`] for a group of any size up to [`COL_GROUP`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_dots(t: &Tile, s: usize, a: &[&Q8K], acc: &mut [__m512]) {
    match a.len() {
        1 => tile_dots::<1>(t, s, a, acc),
        2 => tile_dots::<2>(t, s, a, acc),
        3 => tile_dots::<3>(t, s, a, acc),
        4 => tile_dots::<4>(t, s, a, acc),
        5 => tile_dots::<5>(t, s, a, acc),
        6 => tile_dots::<6>(t, s, a, acc),
        7 => tile_dots::<7>(t, s, a, acc),
        _ => tile_dots::<8>(t, s, a, acc),
    }
}

/// `ys[j][i] (+)= row_i · acts[j]` for Q6_K rows `rb` bytes apart (the multi-activation
/// contract of [`vnni::gemv_q6k_multi`], whose shapes the dispatcher checked): whole groups of
/// 16 rows through the tiled kernel from [`Q6K_TILED_MIN_COLS`] activations, the rest through
/// the lane-per-weight one.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `w_rows` holds `ys[0].len()` rows of `rb` bytes, `rb` a
/// multiple of the Q6_K block; every activation is q8_K of the rows' length; `ys` all have the
/// same length, one per activation.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q6k_multi(
    w_rows: &[u8],
    rb: usize,
    acts: &[&Q8K],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) {
    let m = ys.first().map_or(0, |y| y.len());
    let tiled = (m / TILE_ROWS) * TILE_ROWS;
    if acts.len() < Q6K_TILED_MIN_COLS || tiled == 0 || rb > MAX_GATHER_ROW_BYTES {
        return vnni::gemv_q6k_multi(w_rows, rb, acts, ys, accumulate);
    }
    let nsb = rb / Q6K_BYTES;
    // Row offsets of a tile: r·rb < 16·rb, in i32 range ([`MAX_GATHER_ROW_BYTES`]).
    let offs = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(rb as i32),
    );
    let mut t: Tile = std::mem::zeroed();
    let mut acc = [_mm512_setzero_ps(); PASS_COLS];
    for (a, y) in acts.chunks(PASS_COLS).zip(ys.chunks_mut(PASS_COLS)) {
        for row0 in (0..tiled).step_by(TILE_ROWS) {
            let n = a.len();
            acc[..n].fill(_mm512_setzero_ps());
            let rows = w_rows.as_ptr().add(row0 * rb);
            for s in 0..nsb {
                fill_tile(&mut t, rows.add(s * Q6K_BYTES), rb, offs);
                for (g, ag) in a.chunks(COL_GROUP).enumerate() {
                    let j0 = g * COL_GROUP;
                    group_dots(&t, s, ag, &mut acc[j0..j0 + ag.len()]);
                }
            }
            for (j, yj) in y.iter_mut().enumerate() {
                let dst = yj.as_mut_ptr().add(row0);
                let v = if accumulate {
                    _mm512_add_ps(_mm512_loadu_ps(dst), acc[j])
                } else {
                    acc[j]
                };
                _mm512_storeu_ps(dst, v);
            }
        }
    }
    if tiled < m {
        let mut rest: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[tiled..]).collect();
        vnni::gemv_q6k_multi(&w_rows[tiled * rb..], rb, acts, &mut rest, accumulate);
    }
}
