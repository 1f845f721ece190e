//! Tier choice and the public row functions.
//!
//! The tier is chosen once, at first use, with `is_x86_feature_detected!` (never
//! `target-cpu=native`: the binary is built for the baseline target), as candle's
//! `repack_x86.rs` does; each tier is a static table of fn pointers, one per format.

use crate::act::{ActKind, ActivationBuf, Q8x32, Q8K};
use crate::dot::scalar;
use crate::formats::{self, BlockFormat};
use crate::{Format, QuantError};
use std::sync::OnceLock;

/// A CPU SIMD tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimdTier {
    /// Portable scalar reference.
    Scalar,
    /// AVX2 + FMA + F16C (`vpmaddubsw` integer dots).
    Avx2,
    /// AVX-512 F/BW/VL without VNNI (`vpmaddubsw` on 512 bits).
    Avx512,
    /// AVX-512 F/BW/VL + VNNI (`vpdpbusd`).
    Avx512Vnni,
}

impl SimdTier {
    /// Every tier, slowest first.
    pub const ALL: [SimdTier; 4] = [
        SimdTier::Scalar,
        SimdTier::Avx2,
        SimdTier::Avx512,
        SimdTier::Avx512Vnni,
    ];

    /// Name as printed (`scalar`, `avx2`, `avx512`, `avx512-vnni`).
    pub const fn name(self) -> &'static str {
        match self {
            SimdTier::Scalar => "scalar",
            SimdTier::Avx2 => "avx2",
            SimdTier::Avx512 => "avx512",
            SimdTier::Avx512Vnni => "avx512-vnni",
        }
    }

    /// True if and only if this CPU can run the tier.
    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl");
            match self {
                SimdTier::Scalar => true,
                SimdTier::Avx2 => avx2,
                SimdTier::Avx512 => avx512,
                SimdTier::Avx512Vnni => avx512 && std::arch::is_x86_feature_detected!("avx512vnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == SimdTier::Scalar
        }
    }

    /// The fastest tier this CPU supports.
    pub fn detect() -> SimdTier {
        SimdTier::ALL
            .into_iter()
            .rev()
            .find(|t| t.is_supported())
            .unwrap_or(SimdTier::Scalar)
    }
}

impl std::fmt::Display for SimdTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A row dot of one activation shape.
///
/// # Safety (for every pointer)
/// Call only when the CPU supports the tier of the table the pointer came from, with a row of
/// exactly `row_bytes(k)` bytes and an activation prepared for the same format and `k`.
#[derive(Clone, Copy)]
pub(crate) enum RowDot {
    /// Float formats.
    F32(unsafe fn(&[u8], &[f32]) -> f32),
    /// Legacy formats and HFQ4G256.
    Q8x32(unsafe fn(&[u8], &Q8x32) -> f32),
    /// K-quants.
    Q8K(unsafe fn(&[u8], &Q8K) -> f32),
}

/// One tier's kernels, indexed by [`format_index`].
pub(crate) type Kernels = [RowDot; Format::ALL.len()];

/// Position of `fmt` in [`Format::ALL`] (and in every [`Kernels`] table).
const fn format_index(fmt: Format) -> usize {
    match fmt {
        Format::F32 => 0,
        Format::F16 => 1,
        Format::BF16 => 2,
        Format::Q8_0 => 3,
        Format::Q4_0 => 4,
        Format::Q4_1 => 5,
        Format::Q4K => 6,
        Format::Q6K => 7,
        Format::Hfq4G256 => 8,
        Format::Q5_0 => 9,
        Format::Q5_1 => 10,
        Format::Q5K => 11,
        Format::Q3K => 12,
        Format::Q2K => 13,
        Format::Iq4Nl => 14,
        Format::Iq4Xs => 15,
        Format::Mxfp4 => 16,
    }
}

static SCALAR: Kernels = [
    RowDot::F32(scalar::dot_f32_f32_scalar),
    RowDot::F32(scalar::dot_f16_f32_scalar),
    RowDot::F32(scalar::dot_bf16_f32_scalar),
    RowDot::Q8x32(scalar::dot_q8_0_q8_0_scalar),
    RowDot::Q8x32(scalar::dot_q4_0_q8_0_scalar),
    RowDot::Q8x32(scalar::dot_q4_1_q8_1_scalar),
    RowDot::Q8K(scalar::dot_q4k_q8k_scalar),
    RowDot::Q8K(scalar::dot_q6k_q8k_scalar),
    RowDot::Q8x32(scalar::dot_hfq4_q8_0_scalar),
    RowDot::Q8x32(scalar::dot_q5_0_q8_0_scalar),
    RowDot::Q8x32(scalar::dot_q5_1_q8_1_scalar),
    RowDot::Q8K(scalar::dot_q5k_q8k_scalar),
    RowDot::Q8K(scalar::dot_q3k_q8k_scalar),
    RowDot::Q8K(scalar::dot_q2k_q8k_scalar),
    RowDot::Q8x32(scalar::dot_iq4nl_q8_0_scalar),
    RowDot::Q8K(scalar::dot_iq4xs_q8k_scalar),
    RowDot::Q8x32(scalar::dot_mxfp4_q8_0_scalar),
];

/// The table of `tier`, `None` where the tier is not compiled for this architecture.
fn table(tier: SimdTier) -> Option<&'static Kernels> {
    match tier {
        SimdTier::Scalar => Some(&SCALAR),
        #[cfg(target_arch = "x86_64")]
        SimdTier::Avx2 => Some(&crate::dot::avx2::KERNELS),
        #[cfg(target_arch = "x86_64")]
        SimdTier::Avx512 => Some(&crate::dot::avx512::KERNELS_512),
        #[cfg(target_arch = "x86_64")]
        SimdTier::Avx512Vnni => Some(&crate::dot::avx512::KERNELS_VNNI),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The tier chosen at first use and its kernel table, so `gemv_rows` neither re-detects
/// features nor re-selects kernels per call.
static CHOSEN: OnceLock<(SimdTier, &'static Kernels)> = OnceLock::new();

fn chosen() -> (SimdTier, &'static Kernels) {
    *CHOSEN.get_or_init(|| {
        let t = SimdTier::detect();
        tracing::info!(tier = %t, "hipfire-quant CPU SIMD tier chosen");
        // detect() only returns compiled, supported tiers; Scalar is the total fallback.
        (t, table(t).unwrap_or(&SCALAR))
    })
}

/// The SIMD tier `gemv_rows` uses on this CPU (detected once, then cached).
pub fn simd_tier() -> SimdTier {
    chosen().0
}

/// `y[i] (+)= row_i · x` for i in `0..y.len()`, on the detected tier.
///
/// Rows are taken contiguously from `w_rows` (`row_bytes(k)` each); extra bytes after the
/// last row are ignored. Every `y[i]` is written. Errors: `k` not a block multiple, an
/// activation prepared for another format or `k`, or `w_rows` shorter than
/// `y.len() * row_bytes(k)`.
pub fn gemv_rows(
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    act: &ActivationBuf,
    y: &mut [f32],
    accumulate: bool,
) -> Result<(), QuantError> {
    run_rows(chosen().1, fmt, w_rows, k, act, y, accumulate)
}

/// [`gemv_rows`] on the scalar reference path (tests and benches).
pub fn gemv_rows_scalar(
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    act: &ActivationBuf,
    y: &mut [f32],
    accumulate: bool,
) -> Result<(), QuantError> {
    gemv_rows_with(SimdTier::Scalar, fmt, w_rows, k, act, y, accumulate)
}

/// [`gemv_rows`] on an explicit tier; [`QuantError::TierUnavailable`] if this CPU lacks it.
pub fn gemv_rows_with(
    tier: SimdTier,
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    act: &ActivationBuf,
    y: &mut [f32],
    accumulate: bool,
) -> Result<(), QuantError> {
    match table(tier) {
        Some(t) if tier.is_supported() => run_rows(t, fmt, w_rows, k, act, y, accumulate),
        _ => Err(QuantError::TierUnavailable(tier)),
    }
}

/// Validate the shapes, then run `table`'s kernel for `fmt` over every row.
///
/// `table` must belong to a tier this CPU supports (both callers ensure it).
fn run_rows(
    table: &'static Kernels,
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    act: &ActivationBuf,
    y: &mut [f32],
    accumulate: bool,
) -> Result<(), QuantError> {
    let rb = fmt.row_bytes(k)?;
    if act.format() != fmt || act.k() != k {
        return Err(QuantError::ActivationMismatch {
            format: fmt,
            k,
            act_format: act.format(),
            act_k: act.k(),
        });
    }
    let need = check_w_rows(w_rows, y.len(), rb)?;
    let rows = w_rows[..need].chunks_exact(rb);
    let store = |yi: &mut f32, v: f32| *yi = if accumulate { *yi + v } else { v };
    // SAFETY (all three arms): the tier is supported (the callers' duty, met by `chosen`'s
    // detection and `gemv_rows_with`'s check), every row is exactly
    // `rb = row_bytes(k)` bytes (chunks_exact of a checked prefix), and `act` was prepared for
    // `fmt` and `k` (checked above), which is each kernel's whole contract (see `RowDot`).
    match (table[format_index(fmt)], &act.kind) {
        (RowDot::F32(f), ActKind::F32(x)) => {
            for (yi, row) in y.iter_mut().zip(rows) {
                store(yi, unsafe { f(row, x) });
            }
        }
        (RowDot::Q8x32(f), ActKind::Q8x32(a)) => {
            for (yi, row) in y.iter_mut().zip(rows) {
                store(yi, unsafe { f(row, a) });
            }
        }
        (RowDot::Q8K(f), ActKind::Q8K(a)) => {
            for (yi, row) in y.iter_mut().zip(rows) {
                store(yi, unsafe { f(row, a) });
            }
        }
        _ => {
            // Unreachable: prepare() picks the shape from the format checked above.
            return Err(QuantError::ActivationMismatch {
                format: fmt,
                k,
                act_format: act.format(),
                act_k: act.k(),
            });
        }
    }
    Ok(())
}

/// A multi-activation row driver: `ys[j][i] (+)= row_i · acts[j]` (see `dot::avx512`'s
/// `multi_rows!` for the contract, which [`run_rows_multi`] checks before calling).
type MultiFn<A> = unsafe fn(&[u8], usize, &[&A], &mut [&mut [f32]], bool);

/// A multi-activation driver of one activation shape.
#[derive(Clone, Copy)]
enum MultiDot {
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4.
    Q8x32(MultiFn<Q8x32>),
    /// Q4_K, Q5_K, Q6_K, IQ4_XS.
    Q8K(MultiFn<Q8K>),
}

/// The multi-activation driver of `tier` for `fmt`, `None` where that pair has none (the
/// caller then runs the single-activation kernel once per activation).
fn multi_kernel(tier: SimdTier, fmt: Format) -> Option<MultiDot> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::dot::avx512::{plain, vnni};
        use crate::dot::avx512_mix as mix;
        use crate::dot::avx512_tile as tile;
        match (tier, fmt) {
            (SimdTier::Avx512, Format::Q5_0) => Some(MultiDot::Q8x32(mix::plain::gemv_q5_0_multi)),
            (SimdTier::Avx512, Format::Q5_1) => Some(MultiDot::Q8x32(mix::plain::gemv_q5_1_multi)),
            (SimdTier::Avx512, Format::Q5K) => Some(MultiDot::Q8K(plain::gemv_q5k_multi)),
            (SimdTier::Avx512Vnni, Format::Q5K) => Some(MultiDot::Q8K(vnni::gemv_q5k_multi)),
            (SimdTier::Avx512, Format::Iq4Nl) => {
                Some(MultiDot::Q8x32(mix::plain::gemv_iq4nl_multi))
            }
            (SimdTier::Avx512Vnni, Format::Iq4Nl) => {
                Some(MultiDot::Q8x32(mix::vnni::gemv_iq4nl_multi))
            }
            (SimdTier::Avx512, Format::Mxfp4) => {
                Some(MultiDot::Q8x32(mix::plain::gemv_mxfp4_multi))
            }
            (SimdTier::Avx512Vnni, Format::Mxfp4) => {
                Some(MultiDot::Q8x32(mix::vnni::gemv_mxfp4_multi))
            }
            (SimdTier::Avx512, Format::Iq4Xs) => Some(MultiDot::Q8K(mix::plain::gemv_iq4xs_multi)),
            (SimdTier::Avx512Vnni, Format::Iq4Xs) => {
                Some(MultiDot::Q8K(mix::vnni::gemv_iq4xs_multi))
            }
            (SimdTier::Avx512Vnni, Format::Q5_0) => {
                Some(MultiDot::Q8x32(mix::vnni::gemv_q5_0_multi))
            }
            (SimdTier::Avx512Vnni, Format::Q5_1) => {
                Some(MultiDot::Q8x32(mix::vnni::gemv_q5_1_multi))
            }
            (SimdTier::Avx512, Format::Q4_0) => Some(MultiDot::Q8x32(plain::gemv_q4_0_multi)),
            (SimdTier::Avx512Vnni, Format::Q4_0) => Some(MultiDot::Q8x32(vnni::gemv_q4_0_multi)),
            (SimdTier::Avx512, Format::Q6K) => Some(MultiDot::Q8K(plain::gemv_q6k_multi)),
            (SimdTier::Avx512Vnni, Format::Q6K) => Some(MultiDot::Q8K(vnni::gemv_q6k_multi)),
            (SimdTier::Avx512, Format::Q8_0) => Some(MultiDot::Q8x32(plain::gemv_q8_0_multi)),
            (SimdTier::Avx512, Format::Q4_1) => Some(MultiDot::Q8x32(plain::gemv_q4_1_multi)),
            (SimdTier::Avx512, Format::Q4K) => Some(MultiDot::Q8K(plain::gemv_q4k_multi)),
            (SimdTier::Avx512Vnni, Format::Q8_0) => Some(MultiDot::Q8x32(vnni::gemv_q8_0_multi)),
            (SimdTier::Avx512Vnni, Format::Q4_1) => Some(MultiDot::Q8x32(vnni::gemv_q4_1_multi)),
            (SimdTier::Avx512Vnni, Format::Q4K) => Some(MultiDot::Q8K(tile::gemv_q4k_multi)),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (tier, fmt);
        None
    }
}

/// Rows a [`gemv_rows_multi`] call should cover in multiples of, where it can: the AVX-512 VNNI
/// Q4_K kernel of several activations transposes 16 rows at a time into the vector lanes, and
/// runs rows past the last whole 16 through the row-at-a-time kernel.
pub const MULTI_ROW_TILE: usize = 16;

/// Whether [`gemv_rows_multi_with`] on `tier` gives every output bit-identical to
/// [`gemv_rows_with`] of that activation alone, for `acts` activations of format `fmt`. It does
/// for every pair but one: AVX-512 VNNI Q4_K from 5 activations (the lanes-are-rows kernel of
/// `dot/avx512_tile.rs`), whose f32 sums run in another order (same integer block sums; within
/// 1e-6·Σ|w·x| of the scalar reference). There, each whole group of [`MULTI_ROW_TILE`] rows gives
/// the same bits for every activation count from 5 up.
pub fn multi_matches_single(tier: SimdTier, fmt: Format, acts: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if tier == SimdTier::Avx512Vnni && fmt == Format::Q4K {
        return acts < crate::dot::avx512_tile::TILED_MIN_COLS;
    }
    let _ = (tier, fmt, acts);
    true
}

/// `ys[j][i] (+)= row_i · acts[j]` for every activation `j` and `i` in `0..ys[j].len()`, on the
/// detected tier: [`gemv_rows`] of several activations (prompt tokens) over the same rows.
///
/// Where the tier has a multi-activation kernel for `fmt` (AVX-512 Q8_0, Q4_0, Q4_1, Q4_K, Q5_K,
/// Q6_K, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4), each weight block is unpacked once and dotted with
/// up to eight activations (Q4_K: four, over two rows at a time, so each activation vector loaded also
/// serves two rows; with VNNI and 5 or more activations, 16 rows transposed into the lanes and
/// up to 32 activations); every other pair runs [`gemv_rows`] once per activation. Either way
/// the rows are walked in tiles of 16 KiB (`MULTI_TILE_BYTES`) with every activation run over a tile
/// before the next, so each weight byte comes from DRAM once per call. `ys[j]` is
/// bit-identical to `gemv_rows(fmt, w_rows, k, acts[j], ys[j], accumulate)` wherever
/// [`multi_matches_single`] says so. Errors: those of [`gemv_rows`],
/// `acts` and `ys` of different lengths, or `ys` slices of different lengths.
pub fn gemv_rows_multi(
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    acts: &[&ActivationBuf],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) -> Result<(), QuantError> {
    let (tier, t) = chosen();
    run_rows_multi(tier, t, fmt, w_rows, k, acts, ys, accumulate)
}

/// [`gemv_rows_multi`] on an explicit tier; [`QuantError::TierUnavailable`] if this CPU lacks it.
pub fn gemv_rows_multi_with(
    tier: SimdTier,
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    acts: &[&ActivationBuf],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) -> Result<(), QuantError> {
    match table(tier) {
        Some(t) if tier.is_supported() => {
            run_rows_multi(tier, t, fmt, w_rows, k, acts, ys, accumulate)
        }
        _ => Err(QuantError::TierUnavailable(tier)),
    }
}

/// Validate the shapes, then run the multi-activation driver of (`tier`, `fmt`), or
/// [`run_rows`] once per activation where there is none.
///
/// `tier` must be supported by this CPU and `table` be its table (both callers ensure it).
#[allow(clippy::too_many_arguments)]
fn run_rows_multi(
    tier: SimdTier,
    table: &'static Kernels,
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    acts: &[&ActivationBuf],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) -> Result<(), QuantError> {
    if ys.len() != acts.len() {
        return Err(QuantError::ShortBuffer {
            what: "ys (one output per activation)",
            need: acts.len(),
            got: ys.len(),
        });
    }
    let m = ys.first().map_or(0, |y| y.len());
    if let Some(y) = ys.iter().find(|y| y.len() != m) {
        return Err(QuantError::ShortBuffer {
            what: "ys[j] (every output as long as the first)",
            need: m,
            got: y.len(),
        });
    }
    let rb = fmt.row_bytes(k)?;
    let need = check_w_rows(w_rows, m, rb)?;
    let w = &w_rows[..need];
    let tile = multi_tile_rows(rb);
    let Some(multi) = multi_kernel(tier, fmt) else {
        // Validate every activation before any output is written.
        for act in acts {
            if act.format() != fmt || act.k() != k {
                return Err(QuantError::ActivationMismatch {
                    format: fmt,
                    k,
                    act_format: act.format(),
                    act_k: act.k(),
                });
            }
        }
        for (t, w_tile) in w.chunks(tile * rb).enumerate() {
            let r0 = t * tile;
            let r1 = r0 + w_tile.len() / rb;
            for (act, y) in acts.iter().zip(ys.iter_mut()) {
                run_rows(table, fmt, w_tile, k, act, &mut y[r0..r1], accumulate)?;
            }
        }
        return Ok(());
    };
    match multi {
        MultiDot::Q8x32(f) => {
            run_groups(fmt, k, w, rb, tile, acts, ys, accumulate, f, |a| {
                match &a.kind {
                    ActKind::Q8x32(q) => Some(q),
                    _ => None,
                }
            })
        }
        MultiDot::Q8K(f) => run_groups(fmt, k, w, rb, tile, acts, ys, accumulate, f, |a| match &a
            .kind
        {
            ActKind::Q8K(q) => Some(q),
            _ => None,
        }),
    }
}

/// Check every activation (format, `k`, shape via `get`), then, for each tile of `tile` rows,
/// hand them to `f` in groups of up to [`MULTI_GROUP`]: every group of a tile runs before the
/// next tile, so a tile's weight bytes come from DRAM once and from cache for the other groups.
/// `w` holds exactly `ys[j].len()` rows of `rb = row_bytes(k)` bytes, every `ys[j]` has the
/// same length, `tile` is a multiple of [`MULTI_ROW_TILE`], and `f` is a driver of a tier this
/// CPU supports ([`run_rows_multi`] checked all four).
#[allow(clippy::too_many_arguments)]
fn run_groups<'a, A: 'a>(
    fmt: Format,
    k: usize,
    w: &[u8],
    rb: usize,
    tile: usize,
    acts: &[&'a ActivationBuf],
    ys: &mut [&mut [f32]],
    accumulate: bool,
    f: MultiFn<A>,
    get: impl Fn(&ActivationBuf) -> Option<&A>,
) -> Result<(), QuantError> {
    let prepared = |act: &'a ActivationBuf| -> Result<&'a A, QuantError> {
        if act.format() == fmt && act.k() == k {
            if let Some(a) = get(act) {
                return Ok(a);
            }
        }
        Err(QuantError::ActivationMismatch {
            format: fmt,
            k,
            act_format: act.format(),
            act_k: act.k(),
        })
    };
    // Validate every activation before any output is written.
    for act in acts {
        prepared(act)?;
    }
    for (t, w_tile) in w.chunks(tile * rb).enumerate() {
        let r0 = t * tile;
        let r1 = r0 + w_tile.len() / rb;
        for (group_acts, group_ys) in acts.chunks(MULTI_GROUP).zip(ys.chunks_mut(MULTI_GROUP)) {
            // Fixed-size arrays: the hot path does not allocate.
            let first = prepared(group_acts[0])?;
            let mut group = [first; MULTI_GROUP];
            for (g, act) in group.iter_mut().zip(group_acts) {
                *g = prepared(act)?;
            }
            let mut sub: [&mut [f32]; MULTI_GROUP] = Default::default();
            for (s, y) in sub.iter_mut().zip(group_ys.iter_mut()) {
                *s = &mut y[r0..r1];
            }
            let n = group_acts.len();
            // SAFETY: the tier of `f` is supported and `f` is its driver for `fmt`, every
            // activation was prepared for `fmt` and `k` in `f`'s shape (checked just above),
            // every output slice has `r1 - r0` elements and `w_tile` is exactly that many rows
            // of `rb = row_bytes(k)` bytes (the caller's checks): the driver's whole contract.
            unsafe { f(w_tile, rb, &group[..n], &mut sub[..n], accumulate) };
        }
    }
    Ok(())
}

/// Activations validated and handed to a multi-activation driver per call (it splits them
/// further into its own register-sized groups); a fixed array so nothing is allocated. 32: the
/// tiled AVX-512 VNNI Q4_K kernel's pass, which transposes each 16 rows once for all of them.
const MULTI_GROUP: usize = 32;

/// Weight bytes per row tile of [`gemv_rows_multi`]: every activation group runs over one tile
/// before the next, so the tile is read from DRAM once per call whatever the activation count.
/// hipfire-exec's `TOKEN_TILE_BYTES` (16 KiB, flat within noise from 4 to 64 KiB on the 2-core
/// VM's prefill), so a pool tile is one tile here.
const MULTI_TILE_BYTES: usize = 16 * 1024;

/// Rows of one [`MULTI_TILE_BYTES`] tile of `rb`-byte rows, rounded up to whole
/// [`MULTI_ROW_TILE`]s so the rows that reach the 16-row tiled kernel do not depend on the
/// tiling.
fn multi_tile_rows(rb: usize) -> usize {
    let rows = (MULTI_TILE_BYTES / rb.max(1)).max(1);
    rows.div_ceil(MULTI_ROW_TILE) * MULTI_ROW_TILE
}

/// Run `f` for `fmt`'s marker type.
macro_rules! with_format {
    ($fmt:expr, $t:ident => $body:expr) => {
        match $fmt {
            Format::F32 => {
                type $t = formats::float::F32;
                $body
            }
            Format::F16 => {
                type $t = formats::float::F16;
                $body
            }
            Format::BF16 => {
                type $t = formats::float::BF16;
                $body
            }
            Format::Q8_0 => {
                type $t = formats::legacy::Q8_0;
                $body
            }
            Format::Q4_0 => {
                type $t = formats::legacy::Q4_0;
                $body
            }
            Format::Q4_1 => {
                type $t = formats::legacy::Q4_1;
                $body
            }
            Format::Q4K => {
                type $t = formats::kquant::Q4K;
                $body
            }
            Format::Q6K => {
                type $t = formats::kquant::Q6K;
                $body
            }
            Format::Hfq4G256 => {
                type $t = formats::hfq::Hfq4G256;
                $body
            }
            Format::Q5_0 => {
                type $t = formats::legacy::Q5_0;
                $body
            }
            Format::Q5_1 => {
                type $t = formats::legacy::Q5_1;
                $body
            }
            Format::Q5K => {
                type $t = formats::kquant::Q5K;
                $body
            }
            Format::Q3K => {
                type $t = formats::kquant_low::Q3K;
                $body
            }
            Format::Q2K => {
                type $t = formats::kquant_low::Q2K;
                $body
            }
            Format::Iq4Nl => {
                type $t = formats::iq4::Iq4Nl;
                $body
            }
            Format::Iq4Xs => {
                type $t = formats::iq4::Iq4Xs;
                $body
            }
            Format::Mxfp4 => {
                type $t = formats::mxfp4::Mxfp4;
                $body
            }
        }
    };
}

/// Check `bytes` holds one row of `k` and return `row_bytes(k)`.
fn check_row(fmt: Format, bytes: &[u8], k: usize) -> Result<usize, QuantError> {
    let rb = fmt.row_bytes(k)?;
    if bytes.len() < rb {
        return Err(QuantError::ShortBuffer {
            what: "row bytes",
            need: rb,
            got: bytes.len(),
        });
    }
    Ok(rb)
}

/// Dequantise one row of `k = out.len()` elements from `bytes` (at least `row_bytes(k)` long).
/// Bit-identical to ggml / gguf-py for the GGUF formats.
pub fn dequantize_row(fmt: Format, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let rb = check_row(fmt, bytes, out.len())?;
    with_format!(fmt, T => {
        for (blk, o) in bytes[..rb].chunks_exact(T::BLOCK_BYTES).zip(out.chunks_exact_mut(T::BLOCK_ELEMS)) {
            T::dequantize_block(blk, o);
        }
    });
    Ok(())
}

/// Dequantise one row in f64 (the test reference; no f32 rounding after decoding scales).
pub fn dequantize_row_f64(fmt: Format, bytes: &[u8], out: &mut [f64]) -> Result<(), QuantError> {
    let rb = check_row(fmt, bytes, out.len())?;
    with_format!(fmt, T => {
        for (blk, o) in bytes[..rb].chunks_exact(T::BLOCK_BYTES).zip(out.chunks_exact_mut(T::BLOCK_ELEMS)) {
            T::dequantize_block_f64(blk, o);
        }
    });
    Ok(())
}

/// Quantise one row of `k = src.len()` values with ggml's reference quantiser
/// (byte-identical to ggml / gguf-py for Q8_0, Q4_0, Q4_1 and the float formats).
/// Errors: `k` not a block multiple, or a non-finite value (NaN/inf) in `src`.
pub fn quantize_row(fmt: Format, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let rb = fmt.row_bytes(src.len())?;
    // F32 carries non-finite values faithfully; F16/BF16 would too, but a block format cannot,
    // so every format refuses them alike: a NaN in a weight is a bug upstream.
    if let Some(i) = src.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite {
            format: fmt,
            what: "input value",
            block: i / fmt.block_elems(),
        });
    }
    let mut out = vec![0u8; rb];
    with_format!(fmt, T => {
        for (s, o) in src.chunks_exact(T::BLOCK_ELEMS).zip(out.chunks_exact_mut(T::BLOCK_BYTES)) {
            T::quantize_block(s, o);
        }
    });
    Ok(out)
}

/// `w_rows` holds at least `rows` rows of `rb` bytes; returns the bytes they take.
fn check_w_rows(w_rows: &[u8], rows: usize, rb: usize) -> Result<usize, QuantError> {
    let need = rows.checked_mul(rb).ok_or(QuantError::ShortBuffer {
        what: "w_rows",
        need: usize::MAX,
        got: w_rows.len(),
    })?;
    if w_rows.len() < need {
        return Err(QuantError::ShortBuffer {
            what: "w_rows",
            need,
            got: w_rows.len(),
        });
    }
    Ok(need)
}
