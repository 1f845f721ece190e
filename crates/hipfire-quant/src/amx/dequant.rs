//! Weight rows to a bf16 panel (the A layout of the module docs).
//!
//! At the model's 32-token prefill chunks each weight is dequantised once per 32 tokens while
//! the tile unit spends about a tenth of a cycle per weight on them, so the dequantiser sets the
//! GEMM's speed: Q4_K and Q6_K (the synthetic 8B's and real Q4_K_M files' formats) have AVX-512
//! ones that write a 32-element sub-block straight into its line; every other format goes
//! through [`crate::dequantize_row`] and a conversion pass. Both give the same bits: the exact
//! f32 value of [`crate::dequantize_row`] (same operations in the same order), rounded to
//! nearest even.

use super::{f32_to_bf16, Line, PANEL_ROWS, TILE_K};
use crate::{dequantize_row, Format, QuantError};
use std::sync::OnceLock;

static FAST: OnceLock<bool> = OnceLock::new();

/// Whether the AVX-512 dequantisers can run here (AVX-512 F/BW/VL and BF16).
pub(super) fn fast_available() -> bool {
    *FAST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Dequantise k-steps `s0..s0 + ns` of `rows` (whole rows of `rb` bytes of `k` elements, at
/// most [`PANEL_ROWS`]) into `panel` (line `PANEL_ROWS·(s − s0) + r`); rows past the last and
/// elements past `k` are zeros. `s0` and `s0 + ns` (unless it is the last k-step) must be
/// multiples of 8 (256 elements: whole blocks of every format). `fast` (only if
/// [`fast_available`]) takes the AVX-512 dequantisers where the format has one.
#[allow(clippy::too_many_arguments)]
pub(super) fn fill_panel(
    fast: bool,
    fmt: Format,
    rows: &[u8],
    rb: usize,
    k: usize,
    s0: usize,
    ns: usize,
    panel: &mut [Line],
    row_f32: &mut [f32],
) -> Result<(), QuantError> {
    let (e0, e1) = (s0 * TILE_K, ((s0 + ns) * TILE_K).min(k));
    let be = fmt.block_elems();
    let bad_cut = !e0.is_multiple_of(be) || (!e1.is_multiple_of(be) && e1 != k) || e0 >= e1;
    if bad_cut
        || panel.len() < ns * PANEL_ROWS
        || row_f32.len() < e1 - e0
        || rows.len() > PANEL_ROWS * rb
    {
        return Err(QuantError::ShortBuffer {
            what: "AMX panel scratch or k-block cut",
            need: ns * PANEL_ROWS,
            got: panel.len(),
        });
    }
    // The blocks of elements e0..e1 within a row.
    let bb = fmt.row_bytes(be)?;
    let (b0, b1) = (e0 / be * bb, e1.div_ceil(be) * bb);
    let n_rows = rows.len() / rb;
    for r in 0..PANEL_ROWS {
        if r >= n_rows {
            for s in 0..ns {
                panel[s * PANEL_ROWS + r] = Line::ZERO;
            }
            continue;
        }
        let row = &rows[r * rb + b0..r * rb + b1];
        #[cfg(target_arch = "x86_64")]
        if fast && fast_available() {
            // SAFETY: AVX-512 F/BW/VL/BF16 are present (fast_available); `row` is the whole
            // blocks of `e1 − e0` elements of its format and `panel` holds `ns × PANEL_ROWS`
            // lines (checked above), r < PANEL_ROWS.
            let done = unsafe {
                match fmt {
                    Format::Q4K => x86::q4k_row(row, e1 - e0, panel, r),
                    Format::Q6K => x86::q6k_row(row, e1 - e0, panel, r),
                    _ => false,
                }
            };
            if done {
                continue;
            }
        }
        let _ = fast;
        dequantize_row(fmt, row, &mut row_f32[..e1 - e0])?;
        convert_row(&row_f32[..e1 - e0], &mut panel[..ns * PANEL_ROWS], r);
    }
    Ok(())
}

/// `x` (a row's f32 values) to bf16 into line `PANEL_ROWS·s + r` for every k-step s, zeros past
/// the end. Whole lines as a plain zip, which the compiler vectorises (a chained zero tail in
/// the same loop kept it scalar).
fn convert_row(x: &[f32], panel: &mut [Line], r: usize) {
    let mut chunks = x.chunks_exact(TILE_K);
    for (s, chunk) in chunks.by_ref().enumerate() {
        let line = &mut panel[s * PANEL_ROWS + r].0;
        for (o, &v) in line.iter_mut().zip(chunk) {
            *o = f32_to_bf16(v);
        }
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let s = x.len() / TILE_K;
        let line = &mut panel[s * PANEL_ROWS + r].0;
        line.fill(0);
        for (o, &v) in line.iter_mut().zip(tail) {
            *o = f32_to_bf16(v);
        }
    }
}

/// 32 f32 → 16 bf16 pairs with `vcvtne2ps2bf16` (round to nearest even; the same bits as
/// [`f32_to_bf16`] for every value but f32 denormals, which it flushes).
///
/// # Safety
/// AVX-512 F and BF16 present ([`fast_available`]); `x` holds at least 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pairs_avx512(x: &[f32], out: &mut [u32; 16]) {
    use std::arch::x86_64::*;
    // SAFETY: 32 readable values (the caller's), 64 writable bytes in `out`.
    unsafe {
        let lo = _mm512_loadu_ps(x.as_ptr());
        let hi = _mm512_loadu_ps(x.as_ptr().add(16));
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(out.as_mut_ptr() as *mut _, v);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Line, PANEL_ROWS};
    use crate::formats::f16_to_f32;
    use crate::formats::kquant::{q4k_scale_min, BlockQ4K, BlockQ6K, Q6K_OFFSET, QK_K};
    use std::arch::x86_64::*;
    use std::mem::size_of;

    /// k-steps of 32 per super-block of 256.
    const STEPS_PER_BLOCK: usize = QK_K / 32;

    /// 16 u8 → 16 f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn u8x16_ps(v: __m128i) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
    }

    /// Two halves of 16 f32 (elements 0..16, 16..32) → one line of 32 bf16.
    ///
    /// # Safety
    /// `line` is valid for a 64-byte write.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn store_line(line: *mut Line, lo: __m512, hi: __m512) {
        // cvtne2ps: the second operand fills the low half.
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        // SAFETY: the caller's.
        unsafe { _mm512_storeu_si512(line as *mut _, v) };
    }

    /// Q4_K row → panel row `r`: each 32-element sub-block j of super-block b is k-step
    /// `8b + j`, as `(d·sc)·q − dmin·m` (the generic dequantiser's two roundings).
    /// Returns false (nothing written) if `row` is not `k / 256` whole blocks.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/BF16 present; `panel` holds `(k / 32) × PANEL_ROWS` lines; r < 32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn q4k_row(row: &[u8], k: usize, panel: &mut [Line], r: usize) -> bool {
        const BB: usize = size_of::<BlockQ4K>();
        if !k.is_multiple_of(QK_K)
            || row.len() != k / QK_K * BB
            || panel.len() < k / 32 * PANEL_ROWS
        {
            return false;
        }
        let base = panel.as_mut_ptr();
        let mask = _mm256_set1_epi8(0x0F);
        for (b, blk) in row.chunks_exact(BB).enumerate() {
            let x = BlockQ4K::read(blk);
            let (d, dmin) = (f16_to_f32(x.d), f16_to_f32(x.dmin));
            for c in 0..4 {
                // SAFETY: 32 bytes of the block's 128 nibble bytes.
                let q = unsafe { _mm256_loadu_si256(x.qs[32 * c..].as_ptr() as *const _) };
                let nibs = [
                    _mm256_and_si256(q, mask),
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), mask),
                ];
                for (h, nib) in nibs.into_iter().enumerate() {
                    let j = 2 * c + h;
                    let (sc, m) = q4k_scale_min(j, &x.scales);
                    let ds = _mm512_set1_ps(d * f32::from(sc));
                    let dm = _mm512_set1_ps(dmin * f32::from(m));
                    let lo = u8x16_ps(_mm256_castsi256_si128(nib));
                    let hi = u8x16_ps(_mm256_extracti128_si256(nib, 1));
                    let lo = _mm512_sub_ps(_mm512_mul_ps(ds, lo), dm);
                    let hi = _mm512_sub_ps(_mm512_mul_ps(ds, hi), dm);
                    let s = STEPS_PER_BLOCK * b + j;
                    // SAFETY: s < k / 32 and r < 32, inside the checked panel.
                    unsafe { store_line(base.add(s * PANEL_ROWS + r), lo, hi) };
                }
            }
        }
        true
    }

    /// Q6_K row → panel row `r`: `(d·sc)·(q − 32)` per 16-element sub-block, as the generic
    /// dequantiser. Returns false (nothing written) if `row` is not `k / 256` whole blocks.
    ///
    /// # Safety
    /// As [`q4k_row`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn q6k_row(row: &[u8], k: usize, panel: &mut [Line], r: usize) -> bool {
        const BB: usize = size_of::<BlockQ6K>();
        if !k.is_multiple_of(QK_K)
            || row.len() != k / QK_K * BB
            || panel.len() < k / 32 * PANEL_ROWS
        {
            return false;
        }
        let base = panel.as_mut_ptr();
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let off = _mm512_set1_epi32(Q6K_OFFSET);
        for (b, blk) in row.chunks_exact(BB).enumerate() {
            let x = BlockQ6K::read(blk);
            let d = f16_to_f32(x.d);
            for n in 0..2 {
                // SAFETY: 32-byte loads inside the block's ql (128) and qh (64) arrays.
                let (ql0, ql1, qh) = unsafe {
                    (
                        _mm256_loadu_si256(x.ql[64 * n..].as_ptr() as *const _),
                        _mm256_loadu_si256(x.ql[64 * n + 32..].as_ptr() as *const _),
                        _mm256_loadu_si256(x.qh[32 * n..].as_ptr() as *const _),
                    )
                };
                let high = |sh: i32| {
                    let h = match sh {
                        0 => qh,
                        2 => _mm256_srli_epi16(qh, 2),
                        4 => _mm256_srli_epi16(qh, 4),
                        _ => _mm256_srli_epi16(qh, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)
                };
                let qs = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)),
                ];
                for (i, q) in qs.into_iter().enumerate() {
                    // Elements 128n + 32i ..+32: sub-blocks 8n + 2i and 8n + 2i + 1.
                    let sb = 8 * n + 2 * i;
                    let half = |v: __m128i, sc: i8| {
                        let f = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(v), off));
                        _mm512_mul_ps(_mm512_set1_ps(d * f32::from(sc)), f)
                    };
                    let lo = half(_mm256_castsi256_si128(q), x.scales[sb]);
                    let hi = half(_mm256_extracti128_si256(q, 1), x.scales[sb + 1]);
                    let s = STEPS_PER_BLOCK * b + 4 * n + i;
                    // SAFETY: s < k / 32 and r < 32, inside the checked panel.
                    unsafe { store_line(base.add(s * PANEL_ROWS + r), lo, hi) };
                }
            }
        }
        true
    }
}

#[cfg(test)]
pub(super) fn fill_panel_for_test(
    fast: bool,
    fmt: Format,
    rows: &[u8],
    k: usize,
) -> Result<Vec<Line>, QuantError> {
    let rb = fmt.row_bytes(k)?;
    let ksteps = k.div_ceil(TILE_K);
    let mut panel = vec![Line([0xFFFF; TILE_K]); ksteps * PANEL_ROWS];
    let mut row = vec![f32::NAN; k];
    fill_panel(fast, fmt, rows, rb, k, 0, ksteps, &mut panel, &mut row)?;
    Ok(panel)
}
