//! CPU attention for the query positions of a prompt chunk, in the flash-attention form.
//!
//! A prompt chunk's queries are consecutive positions of one session: query `i` attends the
//! cache's positions `first_i..n0 + i` (`first_i` is 0, or the start of a sliding window). The
//! split-KV kernel ([`super::attend_chunk`]) serves one query at a time, so a chunk of `T`
//! queries reads the whole cache `T` times. Here one work item is one KV head × a block of
//! query positions: its rows (every query head of the GQA group at every position of the block)
//! stream the cache in tiles of [`KV_TILE`] positions, each tile converted from f16 (or q8_0)
//! once and used by every row, with the softmax kept online (running max, running sum,
//! running weighted value sum, rescaled when the max grows). Tiles past every row's last
//! position are never read; tiles before every row's window are skipped; the tile on the
//! diagonal masks per row.
//!
//! A row's arithmetic depends only on its own query, its own range and the cache: tiles sit at
//! multiples of [`KV_TILE`] whatever the block, a tile a row does not attend leaves its state
//! untouched, and lanes it masks add exact zeros. So the result does not depend on the block
//! size, the chunk boundaries, the other rows or the thread count; the AVX-512 and AVX2
//! kernels sum in the same order per lane and give the same bits. It is not the split-KV
//! kernel's order (that one merges chunks whose length depends on the context), so a chunked
//! prefill and the same tokens stepped one at a time agree within rounding, not bit for bit.

use half::f16;

use super::{tier, KvCache, KvLayer, Tier, KV_BLOCK};
use crate::ops::exp_nonpos;

/// Cache positions per tile: four K blocks. A tile's f32 scores for 24 rows (SmolLM2's 3 heads
/// × 8 positions) are 6 KiB and its f16 K and V 16 KiB at head_dim 64, so everything an item
/// touches per tile stays in L1 while the scores are exponentiated and the V pass reads them;
/// the per-tile costs (the max, the rescale) are 1/64 of a row's work. Chosen from that
/// footprint, not tuned: no tile-size A/B has been run
/// (docs/perf-checkpoints/2026-12-04-cpu-prefill-attention-2core).
pub const KV_TILE: usize = 64;
/// Rows of one register tile of the AVX-512 Q·Kᵀ kernel (8 rows × 2 K blocks = 16 of the 32
/// vector registers); row counts are padded to it.
const ROW_TILE: usize = 8;
/// Rows of an item: query heads × positions sharing one pass over the cache. More rows is more
/// reuse of each tile; fewer leaves more items to spread. See [`block_len`].
const TARGET_ROWS: usize = 32;
/// Fewest items a chunk's attention is cut into before blocks shrink below [`TARGET_ROWS`]
/// rows: with 2 threads, ≥ 4 items each keep the last item's imbalance small. Chosen, not tuned.
const MIN_ITEMS: usize = 8;

/// Query positions per block for a run of `n_q` queries over `n_kv` KV heads with `group`
/// query heads each: at most [`TARGET_ROWS`] rows, fewer when that would leave under
/// [`MIN_ITEMS`] items, at least one position; then evened out over the blocks it takes (32
/// positions at 10 a block are 4 blocks of 8, not 10 + 10 + 10 + 2).
pub fn block_len(n_q: usize, group: usize, n_kv: usize) -> usize {
    let n_q = n_q.max(1);
    let mut qb = (TARGET_ROWS / group.max(1)).clamp(1, n_q);
    while qb > 1 && n_kv * n_q.div_ceil(qb) < MIN_ITEMS {
        qb = qb.div_ceil(2);
    }
    n_q.div_ceil(n_q.div_ceil(qb))
}

/// Whether a run of `n_q` consecutive query positions over `n_kv` KV heads goes through
/// [`attend_block`]: a lone query (a decode step) stays with the split-KV kernel, which spreads
/// one query's positions over the threads; a run whose blocks of one position can make
/// [`MIN_ITEMS`] items keeps the pool as busy and reads the cache fewer times.
pub fn worth(n_q: usize, n_kv: usize) -> bool {
    n_q >= 2 && n_kv * n_q >= MIN_ITEMS
}

/// Scratch of [`attend_block`], reused between items of one thread.
#[derive(Debug, Clone)]
pub struct FlashScratch {
    /// Rows of the block's queries (`rows_p × head_dim`, padded rows zero).
    q: Vec<f32>,
    /// Scores, then probabilities, of one tile (`rows_p × KV_TILE`).
    s: Vec<f32>,
    /// Running weighted value sums (`rows_p × head_dim`).
    o: Vec<f32>,
    /// Running maxima, sums and the current tile's rescale factors (`rows_p` each).
    m: Vec<f32>,
    l: Vec<f32>,
    corr: Vec<f32>,
    /// A q8_0 cache's tile, dequantised for the f16 kernels.
    staged: KvLayer,
    staging: (Vec<f32>, Vec<f32>),
}

impl FlashScratch {
    /// Scratch for heads of `head_dim`.
    pub fn new(head_dim: usize) -> FlashScratch {
        FlashScratch {
            q: Vec::new(),
            s: Vec::new(),
            o: Vec::new(),
            m: Vec::new(),
            l: Vec::new(),
            corr: Vec::new(),
            staged: KvLayer::new(1, head_dim),
            staging: (Vec::new(), Vec::new()),
        }
    }
}

/// Attention of a block of consecutive query positions against KV head `h` of `kv`: query `i`
/// (`q[i]`, the `group × head_dim` query heads that share KV head `h`) attends positions
/// `first_i..n0 + i`, where `first_i = n0 + i − window` on a sliding-window layer (0 when
/// that is negative, and on a global layer); scores scaled by `scale`. Writes each query's
/// heads to `out[i]` (`group × head_dim`).
///
/// # Panics
/// If the shapes are inconsistent (no query, queries of different lengths or not a multiple of
/// `head_dim`, `n0 = 0`, positions past the cache, `h` out of range, `out` of the wrong
/// lengths): a caller bug ([`crate::model::Model`] checks its inputs first).
#[allow(clippy::too_many_arguments)]
pub fn attend_block(
    q: &[&[f32]],
    kv: &KvCache,
    h: usize,
    n0: usize,
    window: Option<usize>,
    scale: f32,
    scratch: &mut FlashScratch,
    out: &mut [&mut [f32]],
) {
    run_tier(tier(), q, kv, h, n0, window, scale, scratch, out);
}

#[allow(clippy::too_many_arguments)]
fn run_tier(
    tier: Tier,
    q: &[&[f32]],
    kv: &KvCache,
    h: usize,
    n0: usize,
    window: Option<usize>,
    scale: f32,
    sc: &mut FlashScratch,
    out: &mut [&mut [f32]],
) {
    let (n_kv, hd) = match kv {
        KvCache::F16(c) => (c.n_kv, c.hd),
        KvCache::Q8(c) => (c.n_kv(), c.head_dim()),
    };
    let nq = q.len();
    let width = q.first().map_or(0, |x| x.len());
    assert!(
        nq > 0
            && hd > 0
            && width > 0
            && width % hd == 0
            && q.iter().all(|x| x.len() == width)
            && out.len() == nq
            && out.iter().all(|x| x.len() == width)
            && h < n_kv
            && n0 > 0
            && n0 + nq - 1 <= kv.n_pos()
            && sc.staged.hd == hd,
        "flash::attend_block: {nq} queries of {width} from {n0} over head {h} of {n_kv} × {hd}, \
         {} cached",
        kv.n_pos()
    );
    let group = width / hd;
    let rows = nq * group;
    let rows_p = rows.next_multiple_of(ROW_TILE);
    sc.q.clear();
    sc.q.resize(rows_p * hd, 0.0);
    for (dst, src) in sc.q.chunks_exact_mut(width).zip(q) {
        dst.copy_from_slice(src);
    }
    sc.o.clear();
    sc.o.resize(rows_p * hd, 0.0);
    sc.s.clear();
    sc.s.resize(rows_p * KV_TILE, 0.0);
    sc.m.clear();
    sc.m.resize(rows_p, f32::NEG_INFINITY);
    sc.l.clear();
    sc.l.resize(rows_p, 0.0);
    sc.corr.clear();
    sc.corr.resize(rows_p, 1.0);
    // Query i's attended positions: first(i)..n0 + i.
    let first = |i: usize| window.map_or(0, |w| (n0 + i).saturating_sub(w));
    let n_max = n0 + nq - 1;
    let first_min = first(0);
    let mut t0 = first_min / KV_TILE * KV_TILE;
    while t0 < n_max {
        let len = KV_TILE.min(n_max - t0);
        let (layer, head, base) = match kv {
            KvCache::F16(c) => (c, h, t0),
            KvCache::Q8(c) => {
                c.dequantize_into(h, (t0, t0 + len), &mut sc.staged, &mut sc.staging);
                (&sc.staged, 0, 0)
            }
        };
        // Blocks base/16 .. ceil((base + len)/16) of the head's keys and rows base .. base + len
        // of its values: inside the cache, as base + len ≤ n_max ≤ the positions it holds.
        let kt = &layer.k[head][base / KV_BLOCK * KV_BLOCK * hd..];
        let kt = &kt[..len.div_ceil(KV_BLOCK) * KV_BLOCK * hd];
        let vt = &layer.v[head][base * hd..(base + len) * hd];
        // V rows before every row's window are left unread (their weights are all 0).
        let tv0 = first_min.saturating_sub(t0).min(len);
        let ranges = |r: usize| {
            let i = r / group;
            let lo = first(i).saturating_sub(t0);
            let hi = (n0 + i).saturating_sub(t0).min(len);
            (lo, hi)
        };
        macro_rules! online {
            () => {
                Online {
                    s: &mut sc.s,
                    m: &mut sc.m,
                    l: &mut sc.l,
                    corr: &mut sc.corr,
                }
            };
        }
        match tier {
            // SAFETY: the features were detected by `tier`; `kt` holds ceil(len / 16) whole
            // blocks of `hd × 16` keys, `vt` `len` rows of `hd`, and the scratch is sized
            // above (`rows_p` rows, a multiple of ROW_TILE).
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512 if hd % 16 == 0 => unsafe {
                x86::qk_avx512(&sc.q, hd, kt, scale, &mut sc.s);
                x86::softmax_avx512(online!(), rows, &ranges);
                x86::pv_avx512(&sc.s, &sc.corr, vt, hd, tv0, &mut sc.o);
            },
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 | Tier::Avx512 if hd % 8 == 0 => unsafe {
                x86::qk_avx2(&sc.q, hd, kt, scale, &mut sc.s);
                x86::softmax_avx2(online!(), rows, &ranges);
                x86::pv_avx2(&sc.s, &sc.corr, vt, hd, tv0, &mut sc.o);
            },
            _ => {
                qk_portable(&sc.q, hd, kt, scale, &mut sc.s);
                softmax_tile(online!(), rows, &ranges);
                pv_portable(&sc.s, &sc.corr, vt, hd, tv0, &mut sc.o);
            }
        }
        t0 += KV_TILE;
    }
    for (r, o) in sc.o.chunks_exact(hd).take(rows).enumerate() {
        let inv = 1.0 / sc.l[r];
        let dst = &mut out[r / group][(r % group) * hd..][..hd];
        for (d, &x) in dst.iter_mut().zip(o) {
            *d = x * inv;
        }
    }
}

/// The online-softmax state of a block's rows during one tile: the tile's scores (then
/// weights), the running maxima and sums, and the tile's rescale factors.
struct Online<'a> {
    s: &'a mut [f32],
    m: &'a mut [f32],
    l: &'a mut [f32],
    corr: &'a mut [f32],
}

/// The online-softmax step of one tile: for each of the first `rows` rows, the scores in its
/// attended lanes `ranges(r)` become `e^(s − m_new)`, every other lane 0; the running max and
/// sum move on and `corr` gets the factor the row's value sums are rescaled by. A row with no
/// lane in the tile keeps its state (`corr` 1, weights 0). Padded rows keep weights 0.
#[inline(always)]
fn softmax_tile(st: Online<'_>, rows: usize, ranges: &dyn Fn(usize) -> (usize, usize)) {
    let Online {
        s: scores,
        m,
        l,
        corr: cr,
    } = st;
    for (r, s) in scores.chunks_exact_mut(KV_TILE).enumerate() {
        let (lo, hi) = if r < rows { ranges(r) } else { (0, 0) };
        if lo >= hi {
            s.fill(0.0);
            cr[r] = 1.0;
            continue;
        }
        let mt = s[lo..hi].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m_new = m[r].max(mt);
        let corr = exp_nonpos(m[r] - m_new);
        s[..lo].fill(0.0);
        s[hi..].fill(0.0);
        for x in &mut s[lo..hi] {
            *x = exp_nonpos(*x - m_new);
        }
        // Sixteen interleaved partial sums, then those in order: a fixed order that vectorises.
        let mut part = [0f32; KV_BLOCK];
        for c in s.chunks_exact(KV_BLOCK) {
            for (a, &x) in part.iter_mut().zip(c) {
                *a += x;
            }
        }
        l[r] = l[r] * corr + part.iter().sum::<f32>();
        m[r] = m_new;
        cr[r] = corr;
    }
}

/// Q·Kᵀ without intrinsics: `s[r·KV_TILE + t] = scale · q_r · k_t` for the positions of the
/// blocks in `kt`.
fn qk_portable(q: &[f32], hd: usize, kt: &[f16], scale: f32, s: &mut [f32]) {
    for (b, blk) in kt.chunks_exact(KV_BLOCK * hd).enumerate() {
        for (qr, sr) in q.chunks_exact(hd).zip(s.chunks_exact_mut(KV_TILE)) {
            let mut acc = [0f32; KV_BLOCK];
            for (d, &x) in qr.iter().enumerate() {
                for (a, k) in acc.iter_mut().zip(&blk[d * KV_BLOCK..(d + 1) * KV_BLOCK]) {
                    *a += x * k.to_f32();
                }
            }
            for (o, a) in sr[b * KV_BLOCK..(b + 1) * KV_BLOCK].iter_mut().zip(acc) {
                *o = a * scale;
            }
        }
    }
}

/// P·V without intrinsics: `o_r = corr_r · o_r + Σ_t p_rt v_t` over rows `tv0..` of `vt`.
fn pv_portable(p: &[f32], corr: &[f32], vt: &[f16], hd: usize, tv0: usize, o: &mut [f32]) {
    for ((pr, &c), or) in p
        .chunks_exact(KV_TILE)
        .zip(corr)
        .zip(o.chunks_exact_mut(hd))
    {
        or.iter_mut().for_each(|x| *x *= c);
        for (t, vr) in vt.chunks_exact(hd).enumerate().skip(tv0) {
            let w = pr[t];
            for (x, v) in or.iter_mut().zip(vr) {
                *x += w * v.to_f32();
            }
        }
    }
}

// See the note on `super::x86`: the AVX-512 intrinsics are stable from Rust 1.89.
#[allow(clippy::incompatible_msrv)]
#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The tile kernels with hardware f16 conversion. Per score lane and per value lane both
    //! tiers run the same FMAs in the same order, so they give the same bits.

    use std::arch::x86_64::*;

    use half::f16;

    use super::{softmax_tile, Online, KV_BLOCK, KV_TILE, ROW_TILE};

    /// [`super::softmax_tile`] compiled for AVX-512 (its loops vectorise to 16 lanes).
    ///
    /// # Safety
    /// AVX-512F is present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax_avx512(
        st: Online<'_>,
        rows: usize,
        ranges: &dyn Fn(usize) -> (usize, usize),
    ) {
        softmax_tile(st, rows, ranges)
    }

    /// [`super::softmax_tile`] compiled for AVX2.
    ///
    /// # Safety
    /// AVX2 and FMA are present.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax_avx2(
        st: Online<'_>,
        rows: usize,
        ranges: &dyn Fn(usize) -> (usize, usize),
    ) {
        softmax_tile(st, rows, ranges)
    }

    /// [`super::qk_portable`] in AVX-512: two K blocks × [`ROW_TILE`] rows of accumulators,
    /// each block row converted once for the eight rows.
    ///
    /// # Safety
    /// AVX-512F is present; `hd % 16 == 0`; `q` is `rows_p × hd` and `s` `rows_p × KV_TILE` with
    /// `rows_p` a multiple of [`ROW_TILE`]; `kt` holds at most `KV_TILE / 16` whole blocks.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn qk_avx512(q: &[f32], hd: usize, kt: &[f16], scale: f32, s: &mut [f32]) {
        let nblk = kt.len() / (KV_BLOCK * hd);
        let rows_p = q.len() / hd;
        debug_assert!(nblk <= KV_TILE / KV_BLOCK && s.len() == rows_p * KV_TILE);
        let (kp, qp, sp) = (kt.as_ptr(), q.as_ptr(), s.as_mut_ptr());
        let sv = _mm512_set1_ps(scale);
        let mut b = 0;
        while b < nblk {
            // Blocks b and b + 1; a lone last block runs its twin over itself and drops it.
            let nb = (nblk - b).min(2);
            // SAFETY: blocks b, b + nb − 1 < nblk lie in `kt`.
            let kb =
                [0, nb - 1].map(|i| unsafe { kp.add((b + i) * KV_BLOCK * hd) } as *const __m256i);
            for r0 in (0..rows_p).step_by(ROW_TILE) {
                let mut acc = [[_mm512_setzero_ps(); 2]; ROW_TILE];
                for d in 0..hd {
                    // SAFETY: row d < hd of each block; rows r0 + r < rows_p of `q`.
                    unsafe {
                        let k0 = _mm512_cvtph_ps(_mm256_loadu_si256(kb[0].add(d)));
                        let k1 = _mm512_cvtph_ps(_mm256_loadu_si256(kb[1].add(d)));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let w = _mm512_set1_ps(*qp.add((r0 + r) * hd + d));
                            a[0] = _mm512_fmadd_ps(w, k0, a[0]);
                            a[1] = _mm512_fmadd_ps(w, k1, a[1]);
                        }
                    }
                }
                for i in 0..nb {
                    for (r, a) in acc.iter().enumerate() {
                        // SAFETY: lanes (b + i)·16 .. +16 ≤ KV_TILE of row r0 + r < rows_p.
                        unsafe {
                            _mm512_storeu_ps(
                                sp.add((r0 + r) * KV_TILE + (b + i) * KV_BLOCK),
                                _mm512_mul_ps(a[i], sv),
                            )
                        };
                    }
                }
            }
            b += nb;
        }
    }

    /// [`super::pv_portable`] in AVX-512: [`ROW_TILE`] rows × 32 dims (two vectors) of
    /// accumulators per pass over the tile's V rows, each V row converted once for the rows.
    ///
    /// # Safety
    /// AVX-512F is present; `hd % 16 == 0`; `p` is `rows_p × KV_TILE`, `corr` `rows_p`, `o`
    /// `rows_p × hd` with `rows_p` a multiple of [`ROW_TILE`]; `vt` is whole rows of `hd`, at
    /// most `KV_TILE` of them.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pv_avx512(
        p: &[f32],
        corr: &[f32],
        vt: &[f16],
        hd: usize,
        tv0: usize,
        o: &mut [f32],
    ) {
        let len = vt.len() / hd;
        let rows_p = corr.len();
        debug_assert!(len <= KV_TILE && p.len() == rows_p * KV_TILE && o.len() == rows_p * hd);
        let (vp, pp, op) = (vt.as_ptr(), p.as_ptr(), o.as_mut_ptr());
        let nvec = hd / 16;
        for r0 in (0..rows_p).step_by(ROW_TILE) {
            let mut c = 0;
            while c < nvec {
                // Dims c·16 .. and (c + 1)·16 ..; a lone last vector runs twice, the twin dropped.
                let nv = (nvec - c).min(2);
                let cols = [c * 16, (c + nv - 1) * 16];
                let mut acc = [[_mm512_setzero_ps(); 2]; ROW_TILE];
                for (r, a) in acc.iter_mut().enumerate() {
                    let f = _mm512_set1_ps(corr[r0 + r]);
                    for (x, &col) in a.iter_mut().zip(&cols) {
                        // SAFETY: row r0 + r < rows_p of `o`, dims col .. col + 16 ≤ hd.
                        *x = _mm512_mul_ps(f, unsafe {
                            _mm512_loadu_ps(op.add((r0 + r) * hd + col))
                        });
                    }
                }
                for t in tv0..len {
                    // SAFETY: row t < len of `vt`; lane t < KV_TILE of rows < rows_p of `p`.
                    unsafe {
                        let v0 = _mm512_cvtph_ps(_mm256_loadu_si256(
                            vp.add(t * hd + cols[0]) as *const __m256i
                        ));
                        let v1 = _mm512_cvtph_ps(_mm256_loadu_si256(
                            vp.add(t * hd + cols[1]) as *const __m256i
                        ));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let w = _mm512_set1_ps(*pp.add((r0 + r) * KV_TILE + t));
                            a[0] = _mm512_fmadd_ps(w, v0, a[0]);
                            a[1] = _mm512_fmadd_ps(w, v1, a[1]);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    for (x, &col) in a.iter().zip(&cols).take(nv) {
                        // SAFETY: as the loads above.
                        unsafe { _mm512_storeu_ps(op.add((r0 + r) * hd + col), *x) };
                    }
                }
                c += nv;
            }
        }
    }

    /// Rows per register tile of the AVX2 kernels: 4 rows × 2 vectors of accumulators and 2
    /// of K or V are 10 of the 16 registers.
    const ROWS_AVX2: usize = 4;

    /// [`qk_avx512`] with AVX2 + FMA + F16C: one K block (two 8-lane halves) × 4 rows.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; otherwise as [`qk_avx512`] with `hd % 8 == 0`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn qk_avx2(q: &[f32], hd: usize, kt: &[f16], scale: f32, s: &mut [f32]) {
        let nblk = kt.len() / (KV_BLOCK * hd);
        let rows_p = q.len() / hd;
        debug_assert!(nblk <= KV_TILE / KV_BLOCK && s.len() == rows_p * KV_TILE);
        let (kp, qp, sp) = (kt.as_ptr(), q.as_ptr(), s.as_mut_ptr());
        let sv = _mm256_set1_ps(scale);
        for b in 0..nblk {
            // SAFETY: block b < nblk lies in `kt`; each block row is two 128-bit halves.
            let kb = unsafe { kp.add(b * KV_BLOCK * hd) } as *const __m128i;
            for r0 in (0..rows_p).step_by(ROWS_AVX2) {
                let mut acc = [[_mm256_setzero_ps(); 2]; ROWS_AVX2];
                for d in 0..hd {
                    // SAFETY: row d < hd of the block; rows r0 + r < rows_p of `q`.
                    unsafe {
                        let lo = _mm256_cvtph_ps(_mm_loadu_si128(kb.add(2 * d)));
                        let hi = _mm256_cvtph_ps(_mm_loadu_si128(kb.add(2 * d + 1)));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let w = _mm256_set1_ps(*qp.add((r0 + r) * hd + d));
                            a[0] = _mm256_fmadd_ps(w, lo, a[0]);
                            a[1] = _mm256_fmadd_ps(w, hi, a[1]);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    // SAFETY: lanes b·16 .. +16 ≤ KV_TILE of row r0 + r < rows_p.
                    unsafe {
                        let dst = sp.add((r0 + r) * KV_TILE + b * KV_BLOCK);
                        _mm256_storeu_ps(dst, _mm256_mul_ps(a[0], sv));
                        _mm256_storeu_ps(dst.add(8), _mm256_mul_ps(a[1], sv));
                    }
                }
            }
        }
    }

    /// [`pv_avx512`] with AVX2 + FMA + F16C: 4 rows × 16 dims (two vectors) per pass.
    ///
    /// # Safety
    /// As [`qk_avx2`] and [`pv_avx512`] with `hd % 8 == 0`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pv_avx2(
        p: &[f32],
        corr: &[f32],
        vt: &[f16],
        hd: usize,
        tv0: usize,
        o: &mut [f32],
    ) {
        let len = vt.len() / hd;
        let rows_p = corr.len();
        debug_assert!(len <= KV_TILE && p.len() == rows_p * KV_TILE && o.len() == rows_p * hd);
        let (vp, pp, op) = (vt.as_ptr(), p.as_ptr(), o.as_mut_ptr());
        let nvec = hd / 8;
        for r0 in (0..rows_p).step_by(ROWS_AVX2) {
            let mut c = 0;
            while c < nvec {
                let nv = (nvec - c).min(2);
                let cols = [c * 8, (c + nv - 1) * 8];
                let mut acc = [[_mm256_setzero_ps(); 2]; ROWS_AVX2];
                for (r, a) in acc.iter_mut().enumerate() {
                    let f = _mm256_set1_ps(corr[r0 + r]);
                    for (x, &col) in a.iter_mut().zip(&cols) {
                        // SAFETY: row r0 + r < rows_p of `o`, dims col .. col + 8 ≤ hd.
                        *x = _mm256_mul_ps(f, unsafe {
                            _mm256_loadu_ps(op.add((r0 + r) * hd + col))
                        });
                    }
                }
                for t in tv0..len {
                    // SAFETY: row t < len of `vt`; lane t < KV_TILE of rows < rows_p of `p`.
                    unsafe {
                        let v0 = _mm256_cvtph_ps(_mm_loadu_si128(
                            vp.add(t * hd + cols[0]) as *const __m128i
                        ));
                        let v1 = _mm256_cvtph_ps(_mm_loadu_si128(
                            vp.add(t * hd + cols[1]) as *const __m128i
                        ));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let w = _mm256_set1_ps(*pp.add((r0 + r) * KV_TILE + t));
                            a[0] = _mm256_fmadd_ps(w, v0, a[0]);
                            a[1] = _mm256_fmadd_ps(w, v1, a[1]);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    for (x, &col) in a.iter().zip(&cols).take(nv) {
                        // SAFETY: as the loads above.
                        unsafe { _mm256_storeu_ps(op.add((r0 + r) * hd + col), *x) };
                    }
                }
                c += nv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::CacheType;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Every tier the CPU has, portable first (`super::super::tests::tiers` without its check).
    fn tiers() -> Vec<Tier> {
        let mut t = vec![Tier::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                t.push(Tier::Avx2);
                if is_x86_feature_detected!("avx512f") {
                    t.push(Tier::Avx512);
                }
            }
        }
        t
    }

    /// A cache of `ty` with `n_pos` random positions, then `extra` positions of `poison`
    /// (NaN for f16; a huge finite value for q8_0, which cannot hold NaN) that no query may
    /// read; positions before `clean_from` are poisoned too (before every window).
    fn cache(
        r: &mut ChaCha8Rng,
        ty: CacheType,
        n_kv: usize,
        hd: usize,
        n_pos: usize,
        extra: usize,
        clean_from: usize,
    ) -> KvCache {
        let mut kv = KvCache::new(ty, n_kv, hd).expect("cache");
        let poison = match ty {
            CacheType::F16 => f32::NAN,
            CacheType::Q8_0 => 3.0e4,
        };
        for t in 0..n_pos + extra {
            let bad = t >= n_pos || t < clean_from;
            let k: Vec<f32> = (0..n_kv * hd)
                .map(|_| {
                    if bad {
                        poison
                    } else {
                        r.random_range(-2.0f32..2.0)
                    }
                })
                .collect();
            let v: Vec<f32> = (0..n_kv * hd)
                .map(|_| {
                    if bad {
                        poison
                    } else {
                        r.random_range(-1.0f32..1.0)
                    }
                })
                .collect();
            kv.push(&k, &v);
        }
        kv
    }

    /// The values the kernels read: the f16 cache itself, or a q8_0 cache dequantised to f16.
    fn as_f16(kv: &KvCache, h: usize) -> KvLayer {
        match kv {
            KvCache::F16(c) => {
                let mut one = KvLayer::new(1, c.hd);
                one.n_pos = c.n_pos;
                one.k[0] = c.k[h].clone();
                one.v[0] = c.v[h].clone();
                one
            }
            KvCache::Q8(c) => {
                let mut one = KvLayer::new(1, c.head_dim());
                c.dequantize_into(h, (0, c.n_pos()), &mut one, &mut (Vec::new(), Vec::new()));
                one
            }
        }
    }

    /// f64 softmax attention of one query head over positions `first..n` of `kv` (one head).
    fn reference(q: &[f32], kv: &KvLayer, first: usize, n: usize, scale: f32) -> Vec<f64> {
        let hd = kv.hd;
        let s: Vec<f64> = (first..n)
            .map(|t| {
                (0..hd)
                    .map(|d| f64::from(q[d]) * f64::from(kv.key(0, t, d).to_f32()))
                    .sum::<f64>()
                    * f64::from(scale)
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd)
            .map(|d| {
                (first..n)
                    .map(|t| e[t - first] / z * f64::from(kv.value_row(0, t)[d].to_f32()))
                    .sum::<f64>()
            })
            .collect()
    }

    /// One block through `tier`, outputs poisoned first: `n_q × group·hd` values.
    #[allow(clippy::too_many_arguments)]
    fn run(
        tier: Tier,
        q: &[Vec<f32>],
        kv: &KvCache,
        h: usize,
        n0: usize,
        window: Option<usize>,
        scale: f32,
        hd: usize,
    ) -> Vec<f32> {
        let width = q[0].len();
        let mut out = vec![f32::NAN; q.len() * width];
        let qs: Vec<&[f32]> = q.iter().map(|x| &x[..]).collect();
        let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(width).collect();
        let mut sc = FlashScratch::new(hd);
        run_tier(tier, &qs, kv, h, n0, window, scale, &mut sc, &mut outs);
        out
    }

    /// The block kernel against f64 softmax attention: head sizes 64/80/96/128/256 and an
    /// AVX2-only 24, GQA ratios 1..16, odd depths and blocks that start on, before and after a
    /// tile boundary, sliding windows (also starting inside the block), f16 and q8_0 caches,
    /// poisoned outputs and poisoned cache positions past the last query and before the first
    /// window; every tier. Then: the SIMD tiers give the same bits, and so does every split of
    /// the block into smaller blocks (a row depends on nothing but itself).
    #[test]
    fn flash_block_matches_an_f64_reference() {
        let mut r = ChaCha8Rng::seed_from_u64(37);
        let mut worst = 0f64;
        // (KV heads, GQA ratio, head_dim, n0, queries, window, cache type)
        let cases = [
            (
                1usize,
                1usize,
                64usize,
                1usize,
                1usize,
                None,
                CacheType::F16,
            ),
            (3, 3, 64, 1, 32, None, CacheType::F16),
            (3, 3, 64, 77, 32, None, CacheType::F16),
            (2, 1, 128, 63, 3, None, CacheType::F16),
            (2, 1, 128, 64, 65, None, CacheType::F16),
            (1, 16, 64, 129, 7, None, CacheType::F16),
            (2, 2, 80, 200, 33, None, CacheType::F16),
            (1, 5, 96, 1000, 17, None, CacheType::F16),
            (1, 8, 128, 2047, 13, None, CacheType::F16),
            (1, 2, 256, 300, 9, None, CacheType::F16),
            (1, 3, 24, 50, 11, None, CacheType::F16),
            (2, 4, 64, 100, 40, Some(37), CacheType::F16),
            (1, 2, 128, 600, 21, Some(512), CacheType::F16),
            (1, 3, 64, 10, 50, Some(20), CacheType::F16),
            (1, 8, 256, 700, 5, Some(64), CacheType::F16),
            (3, 3, 64, 77, 32, None, CacheType::Q8_0),
            (1, 4, 128, 333, 19, Some(100), CacheType::Q8_0),
            (2, 7, 96, 65, 70, None, CacheType::Q8_0),
        ];
        for (n_kv, ratio, hd, n0, nq, window, ty) in cases {
            let n_max = n0 + nq - 1;
            let first_min = window.map_or(0, |w: usize| n0.saturating_sub(w));
            let kv = cache(&mut r, ty, n_kv, hd, n_max, 19, first_min);
            let scale = 1.0 / (hd as f32).sqrt();
            for h in 0..n_kv {
                let q: Vec<Vec<f32>> = (0..nq)
                    .map(|_| {
                        (0..ratio * hd)
                            .map(|_| r.random_range(-1.0f32..1.0))
                            .collect()
                    })
                    .collect();
                let one = as_f16(&kv, h);
                let mut by_tier = Vec::new();
                for tier in tiers() {
                    let out = run(tier, &q, &kv, h, n0, window, scale, hd);
                    for i in 0..nq {
                        let n = n0 + i;
                        let first = window.map_or(0, |w| n.saturating_sub(w));
                        for j in 0..ratio {
                            let want =
                                reference(&q[i][j * hd..(j + 1) * hd], &one, first, n, scale);
                            let got = &out[(i * ratio + j) * hd..][..hd];
                            for (d, (g, w)) in got.iter().zip(&want).enumerate() {
                                let err = (f64::from(*g) - w).abs();
                                worst = worst.max(err);
                                assert!(
                                    err < 2e-6,
                                    "{tier:?} {ty:?} n_kv {n_kv} ratio {ratio} hd {hd} n0 {n0} \
                                     query {i} head {j} dim {d}: {g} vs {w}"
                                );
                            }
                        }
                    }
                    by_tier.push((tier, out));
                }
                let simd: Vec<_> = by_tier
                    .iter()
                    .filter(|(t, _)| *t != Tier::Portable)
                    .collect();
                for w in simd.windows(2) {
                    let same = w[0]
                        .1
                        .iter()
                        .zip(&w[1].1)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{:?} and {:?} differ (hd {hd}, n0 {n0})",
                        w[0].0, w[1].0
                    );
                }
                // Split into blocks of 1, 2, 5 positions: the same bits on the best tier.
                let (best, whole) = by_tier.last().expect("a tier");
                for qb in [1usize, 2, 5] {
                    let mut split = Vec::new();
                    for i0 in (0..nq).step_by(qb) {
                        let i1 = (i0 + qb).min(nq);
                        split.extend(run(*best, &q[i0..i1], &kv, h, n0 + i0, window, scale, hd));
                    }
                    let same = split
                        .iter()
                        .zip(whole)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{best:?} blocks of {qb} differ (hd {hd}, n0 {n0})");
                }
            }
        }
        // Measured 2026-12-04 on the Zen 4 VM: see the CHANGELOG entry.
        eprintln!("flash block: worst |error| against f64 {worst:.3e}");
    }

    /// Block sizes keep about TARGET_ROWS rows and at least MIN_ITEMS items where they can.
    #[test]
    fn block_len_targets_rows_and_items() {
        assert_eq!(block_len(32, 3, 3), 8);
        assert_eq!(block_len(32, 8, 8), 4);
        assert_eq!(block_len(32, 4, 1), 4);
        assert_eq!(block_len(3, 3, 3), 1);
        assert_eq!(block_len(512, 4, 8), 8);
        assert_eq!(block_len(1, 16, 1), 1);
    }
}
