//! Q8_0, Q4_0 and Q4_1 rows against several q8_0 / q8_1 activations with the rows in the vector
//! lanes (AVX-512 VNNI), the 32-element-block counterpart of [`super::avx512_tile`]'s Q4_K
//! kernel.
//!
//! The lane-per-weight kernels of [`super::avx512`] spend one `vpdpbusd` per 64 weights of one
//! column plus, per column and pair of blocks, the scale conversion, permutes and f32 work: at
//! 16 columns they are compute-bound at a sixth (Q8_0) to an eighth (Q4_0) of their one-column
//! GB/s on the 2-core Zen 4 VM (`docs/perf-checkpoints/2026-12-04-cpu-multi-column-2core`).
//! Here a block of 16 rows is transposed once so that lane r holds row r: per column and block,
//! eight `vpdpbusd` (each with four activation bytes broadcast from memory) cover the 16 rows'
//! 32 weights, started from the activation's `corr` (the Q8_0 sign bias / Q4_0 offset, exact in
//! the integer lanes), and one conversion, one multiply by the rows' scales and one FMA finish
//! the block for all 16 rows (Q4_1 adds one FMA of the rows' minimums by the activation's block
//! sum). The transpose and unpack are paid once per 16 rows and block whatever the column count.
//!
//! Rounding: the integer block sums are exact as in the lane-per-weight kernels and each block's
//! scale is the same f32 product `d_w·d_x`, but the f32 sums run in another order (one per block
//! and row instead of eight lanes per block, reduced at the end), so a column computed here
//! differs in its last bits from the same column computed alone; every column count from the
//! format's minimum up gives the same bits.

use crate::act::{Q8x32, LANES8, Q4_0_ACT_GROUP};
use crate::dot::avx2::{Q4_0_BYTES, Q4_0_CORR_LANES, Q4_1_BYTES, Q8_0_BYTES};
use crate::dot::avx512::vnni;
use crate::dot::avx512_tile::{headers, rows_transposed, MAX_GATHER_ROW_BYTES, TILE_ROWS};
use crate::formats::legacy::QK;
use std::arch::x86_64::*;

/// Fewest activations for which the tiled Q8_0 kernel runs (fewer go to the lane-per-weight
/// kernel). Measured on the 2-core Zen 4 VM (`multicol_gbs --modes tiled --threads 1`, k 4096,
/// 64 MiB, CPU-time GB/s, lane-per-weight vs tiled): 2 columns 12.40 / 15.65, 3: 9.28 / 14.55,
/// 16: 2.67 / 7.43 (`docs/perf-checkpoints/2026-12-04-cpu-multi-column-2core`, "Rows in
/// lanes", `sweep_lanes_*.log`).
pub(crate) const Q8_0_TILED_MIN_COLS: usize = 2;
/// Fewest activations for which the tiled Q4_0 kernel runs. Same sweep: 2 columns 12.39 /
/// 10.56 (the lane-per-weight kernel wins: a Q4_0 block is half a Q8_0 block's bytes for the
/// same per-column work here), 3: 9.52 / 9.84 (a tie within the VM's noise), 4: 7.23 / 8.39,
/// 16: 1.92 / 4.70.
pub(crate) const Q4_0_TILED_MIN_COLS: usize = 4;
/// Fewest activations for which the tiled Q4_1 kernel runs. Same measurement, two interleaved
/// runs (`sweep_q4_1_*.log`): 3 columns 11.66 / 10.61 and 11.27 / 10.60 (lane-per-weight
/// ahead), 4: 9.44 / 9.90 and 9.12 / 9.94, 8: 4.83 / 7.48 and 4.68 / 7.25.
pub(crate) const Q4_1_TILED_MIN_COLS: usize = 4;
/// Activations whose integer sums are held in registers at once (8 code vectors + 8 sums + the
/// scale vectors stay within the 32 zmm registers); the Q4_K tile's value, not swept here.
const COL_GROUP: usize = 8;
/// Activations per pass over the rows (their f32 accumulators live on the stack): the
/// dispatcher's `MULTI_GROUP`, so a call transposes each block once.
const PASS_COLS: usize = 32;
/// Blocks ahead of the tile that each row's line is prefetched: the 16 row streams are more
/// than the hardware prefetcher follows, and a 32-element block is about half a line, so this
/// is two lines ahead (not swept).
const PREFETCH_BLOCKS: usize = 4;
/// Offset of the codes in a Q8_0 or Q4_0 block (after the f16 scale).
const QS_AFTER_D: usize = 2;
/// Offset of the codes in a Q4_1 block (after the f16 scale and the f16 minimum).
const QS_AFTER_DM: usize = 4;

/// The formats of this file, as the `KIND` parameter of its generic functions.
const Q8_0: u8 = 0;
/// See [`Q8_0`].
const Q4_0: u8 = 1;
/// See [`Q8_0`].
const Q4_1: u8 = 2;

/// Block bytes of `KIND`.
const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q8_0 => Q8_0_BYTES,
        Q4_0 => Q4_0_BYTES,
        _ => Q4_1_BYTES,
    }
}

/// Lanes of `Q8x32::corr` per block for `KIND` (0: none, Q4_1's minimum is its own term).
const fn corr_lanes(kind: u8) -> usize {
    match kind {
        Q8_0 => LANES8,
        Q4_0 => Q4_0_CORR_LANES,
        _ => 0,
    }
}

/// One block of 16 rows, transposed: `q[g]` lane r holds row r's weights `4g..4g+4` as
/// unsigned bytes (Q8_0 biased by +128, Q4_0's and Q4_1's raw nibbles), `d` the rows' block
/// scales, `m` their Q4_1 minimums.
#[repr(C, align(64))]
struct Tile {
    q: [__m512i; 8],
    d: __m512,
    m: __m512,
}

/// The first dword of the blocks at `base + r·rb` (r < 16), lane r; `offs` holds `r·rb`.
/// Its low half is the f16 scale (the high half Q4_1's f16 minimum, or code bytes: inside the
/// block either way).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn first_dwords(base: *const u8, offs: __m512i) -> __m512i {
    _mm512_i32gather_epi32::<1>(offs, base as *const i32)
}

/// The low f16 of each dword lane as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn low_f16(h: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h))
}

/// Prefetch each of the 16 rows' line [`PREFETCH_BLOCKS`] blocks of `bytes` after `base`.
#[inline(always)]
unsafe fn prefetch_rows(base: *const u8, rb: usize, bytes: usize) {
    for r in 0..TILE_ROWS {
        let p = base.wrapping_add(r * rb + PREFETCH_BLOCKS * bytes);
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }
}

/// Fills `t` from the Q8_0 blocks of 16 rows starting at `base`, `rb` bytes apart.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn fill_q8_0(t: &mut Tile, base: *const u8, rb: usize, offs: __m512i) {
    prefetch_rows(base, rb, Q8_0_BYTES);
    t.d = low_f16(first_dwords(base, offs));
    let o = rows_transposed(base.add(QS_AFTER_D), rb);
    // vpdpbusd multiplies unsigned by signed bytes: w + 128, the bias removed by `corr`.
    let bias = _mm512_set1_epi8(i8::MIN);
    for (qg, og) in t.q.iter_mut().zip(o) {
        *qg = _mm512_xor_si512(og, bias);
    }
}

/// Fills `t` from the Q4_0 (`KIND` [`Q4_0`]) or Q4_1 blocks of 16 rows starting at `base`,
/// `rb` bytes apart.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn fill_q4<const KIND: u8>(t: &mut Tile, base: *const u8, rb: usize, offs: __m512i) {
    prefetch_rows(base, rb, block_bytes(KIND));
    let h = first_dwords(base, offs);
    t.d = low_f16(h);
    let codes = if KIND == Q4_1 {
        t.m = low_f16(_mm512_srli_epi32::<16>(h));
        QS_AFTER_DM
    } else {
        QS_AFTER_D
    };
    // Byte i of a block's codes holds weight i (low nibble) and weight 16 + i (high nibble).
    let o = headers(base.add(codes), rb);
    let m4 = _mm512_set1_epi8(0x0F);
    for (c, oc) in o.iter().enumerate() {
        t.q[c] = _mm512_and_si512(*oc, m4);
        t.q[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(*oc), m4);
    }
}

/// Where block `b`'s activation halves (elements 0..16 and 16..32) start in `Q8x32::qs`:
/// natural order, except that Q4_0 and Q4_1 store each full group of [`Q4_0_ACT_GROUP`]
/// elements as the first halves of its four blocks, then the second halves (`act.rs`).
#[inline(always)]
fn act_halves<const KIND: u8>(b: usize, nb: usize) -> (usize, usize) {
    let per_group = Q4_0_ACT_GROUP / QK;
    if KIND != Q8_0 && b < nb / per_group * per_group {
        let lo = Q4_0_ACT_GROUP * (b / per_group) + QK / 2 * (b % per_group);
        (lo, lo + Q4_0_ACT_GROUP / 2)
    } else {
        (QK * b, QK * b + QK / 2)
    }
}

/// Tile `t` (block `b`, activation halves at `halves`) against activations `a` (`NG` ≤
/// [`COL_GROUP`] of them) into their accumulators `acc` (per row lane Σ_b (d_w·d_x)·Σ w·x,
/// plus Q4_1's Σ_b m·s_x).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_dots<const NG: usize, const KIND: u8>(
    t: &Tile,
    b: usize,
    halves: (usize, usize),
    a: &[&Q8x32],
    acc: &mut [__m512],
) {
    let mut lo = [std::ptr::null::<i32>(); NG];
    let mut hi = [std::ptr::null::<i32>(); NG];
    let mut isum = [_mm512_setzero_si512(); NG];
    for j in 0..NG {
        lo[j] = a[j].qs.as_ptr().add(halves.0) as *const i32;
        hi[j] = a[j].qs.as_ptr().add(halves.1) as *const i32;
        if corr_lanes(KIND) > 0 {
            isum[j] = _mm512_set1_epi32(*a[j].corr.as_ptr().add(corr_lanes(KIND) * b));
        }
    }
    for (g, &w) in t.q.iter().enumerate() {
        for j in 0..NG {
            let p = if g < 4 {
                lo[j].add(g)
            } else {
                hi[j].add(g - 4)
            };
            let x = _mm512_set1_epi32(p.read_unaligned());
            isum[j] = _mm512_dpbusd_epi32(isum[j], w, x);
        }
    }
    for j in 0..NG {
        let s = _mm512_mul_ps(t.d, _mm512_set1_ps(*a[j].d.as_ptr().add(b)));
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), s, acc[j]);
        if KIND == Q4_1 {
            acc[j] = _mm512_fmadd_ps(t.m, _mm512_set1_ps(*a[j].s.as_ptr().add(b)), acc[j]);
        }
    }
}

/// [`tile_dots`] for a group of any size up to [`COL_GROUP`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_dots<const KIND: u8>(
    t: &Tile,
    b: usize,
    h: (usize, usize),
    a: &[&Q8x32],
    acc: &mut [__m512],
) {
    match a.len() {
        1 => tile_dots::<1, KIND>(t, b, h, a, acc),
        2 => tile_dots::<2, KIND>(t, b, h, a, acc),
        3 => tile_dots::<3, KIND>(t, b, h, a, acc),
        4 => tile_dots::<4, KIND>(t, b, h, a, acc),
        5 => tile_dots::<5, KIND>(t, b, h, a, acc),
        6 => tile_dots::<6, KIND>(t, b, h, a, acc),
        7 => tile_dots::<7, KIND>(t, b, h, a, acc),
        _ => tile_dots::<8, KIND>(t, b, h, a, acc),
    }
}

/// The tiled loop of format `KIND` over whole groups of 16 rows (`tiled` rows).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tiled_rows<const KIND: u8>(
    w_rows: &[u8],
    rb: usize,
    tiled: usize,
    acts: &[&Q8x32],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) {
    let nb = rb / block_bytes(KIND);
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
            for b in 0..nb {
                let base = rows.add(b * block_bytes(KIND));
                if KIND == Q8_0 {
                    fill_q8_0(&mut t, base, rb, offs);
                } else {
                    fill_q4::<KIND>(&mut t, base, rb, offs);
                }
                let h = act_halves::<KIND>(b, nb);
                for (g, ag) in a.chunks(COL_GROUP).enumerate() {
                    let j0 = g * COL_GROUP;
                    group_dots::<KIND>(&t, b, h, ag, &mut acc[j0..j0 + ag.len()]);
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
}

/// Rows whose count in `ys` is not a whole number of tiles, and every call below the format's
/// minimum column count, go through `fallback` (the lane-per-weight driver).
type Fallback = unsafe fn(&[u8], usize, &[&Q8x32], &mut [&mut [f32]], bool);

/// Shared driver of [`gemv_q8_0_multi`], [`gemv_q4_0_multi`] and [`gemv_q4_1_multi`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemv_multi<const KIND: u8>(
    w_rows: &[u8],
    rb: usize,
    acts: &[&Q8x32],
    ys: &mut [&mut [f32]],
    accumulate: bool,
    min_cols: usize,
    fallback: Fallback,
) {
    let m = ys.first().map_or(0, |y| y.len());
    let tiled = (m / TILE_ROWS) * TILE_ROWS;
    if acts.len() < min_cols || tiled == 0 || rb > MAX_GATHER_ROW_BYTES {
        return fallback(w_rows, rb, acts, ys, accumulate);
    }
    tiled_rows::<KIND>(w_rows, rb, tiled, acts, ys, accumulate);
    if tiled < m {
        let mut rest: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[tiled..]).collect();
        fallback(&w_rows[tiled * rb..], rb, acts, &mut rest, accumulate);
    }
}

/// `ys[j][i] (+)= row_i · acts[j]` for Q8_0 rows `rb` bytes apart (the multi-activation
/// contract of [`vnni::gemv_q8_0_multi`], whose shapes the dispatcher checked): whole groups of
/// 16 rows through the tiled kernel from [`Q8_0_TILED_MIN_COLS`] activations, the rest through
/// the lane-per-weight one.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `w_rows` holds `ys[0].len()` rows of `rb` bytes, `rb` a
/// multiple of the Q8_0 block; every activation is q8_0 of the rows' length; `ys` all have the
/// same length, one per activation.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q8_0_multi(
    w_rows: &[u8],
    rb: usize,
    acts: &[&Q8x32],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) {
    gemv_multi::<Q8_0>(
        w_rows,
        rb,
        acts,
        ys,
        accumulate,
        Q8_0_TILED_MIN_COLS,
        vnni::gemv_q8_0_multi,
    )
}

/// [`gemv_q8_0_multi`] for Q4_0 rows (from [`Q4_0_TILED_MIN_COLS`] activations; the contract
/// of [`vnni::gemv_q4_0_multi`]).
///
/// # Safety
/// As [`gemv_q8_0_multi`], with Q4_0 rows and q8_0 activations prepared for Q4_0.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q4_0_multi(
    w_rows: &[u8],
    rb: usize,
    acts: &[&Q8x32],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) {
    gemv_multi::<Q4_0>(
        w_rows,
        rb,
        acts,
        ys,
        accumulate,
        Q4_0_TILED_MIN_COLS,
        vnni::gemv_q4_0_multi,
    )
}

/// [`gemv_q8_0_multi`] for Q4_1 rows (from [`Q4_1_TILED_MIN_COLS`] activations; the contract
/// of [`vnni::gemv_q4_1_multi`]).
///
/// # Safety
/// As [`gemv_q8_0_multi`], with Q4_1 rows and q8_1 activations prepared for Q4_1.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q4_1_multi(
    w_rows: &[u8],
    rb: usize,
    acts: &[&Q8x32],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) {
    gemv_multi::<Q4_1>(
        w_rows,
        rb,
        acts,
        ys,
        accumulate,
        Q4_1_TILED_MIN_COLS,
        vnni::gemv_q4_1_multi,
    )
}
