//! Prompt-token GEMM on Intel AMX (`tdpbf16ps`): many tokens against the same rows, in bf16.
//!
//! The row dots of [`crate::gemv_rows_multi`] multiply 8-bit integers and pay each weight
//! block's unpacking and scaling per few activations; at 16 threads on the H200 box's Xeon that
//! held CPU prefill of a Llama-3-8B Q4_K at 52.7 tok/s against llama.cpp's 178
//! (`docs/perf-checkpoints/2026-12-01-gpu-prefill-h200`). Here each worker instead dequantises
//! a panel of [`PANEL_ROWS`] weight rows once to bf16 (exact f32 dequantisation, then
//! round-to-nearest-even), the tokens are packed once per call to bf16 in the AMX B layout, and
//! the tile unit multiplies 16 × 16 × 32 per instruction with 2 × 2 register blocking, summing
//! the whole row in f32. No per-sub-block integer post-processing: any format with a
//! dequantiser runs here (Q4_K and Q6_K through AVX-512 dequantisers, the others through
//! [`crate::dequantize_row`]).
//!
//! # Accuracy (the contract the callers state)
//! Rounding a weight and an activation to bf16 (8 significant bits) moves each by at most 2⁻⁸
//! of itself, so a product by at most 2⁻⁷ + 2⁻¹⁶ of itself; the f32 sums add at most `k·2⁻²⁴`
//! of `Σ|w·x|`. A row's
//! result is therefore within [`error_bound`]`(k) · Σ_i |w_i · x_i|` of the exact dot of the
//! dequantised row with the unquantised activation (the q8 row dots are within `amax/254` per
//! element, a bound of the same order). Results are not bit-identical to the q8 row dots.
//!
//! # Layouts
//! A [`Line`] is one tile row: 64 bytes, 32 bf16. A panel (A operand) holds, per k-step `s` of
//! 32 elements, [`PANEL_ROWS`] lines: line `32·s + r` = row r's elements `32·s..32·s + 32`, so
//! the A tiles of a k-step are 16 consecutive lines. A token group (B operand) of 16 tokens
//! holds per k-step 16 lines: line `16·s + p` has, for each token n, its elements `32·s + 2p`
//! and `32·s + 2p + 1` at bf16 positions `2n` and `2n + 1` (AMX's pair layout). Rows past the
//! matrix, tokens past the last and elements past `k` are zeros.

mod dequant;
mod tiles;

use crate::{Format, QuantError};
use std::cell::{RefCell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use tiles::{CBlock, Engine, TileSession};

/// Rows of an A tile and tokens of a B tile (and the C tile's 16 × 16).
const TILE_ROWS: usize = 16;
/// Elements of one k-step: a tile row of 64 bytes of bf16.
const TILE_K: usize = 32;
/// Weight rows dequantised together: two A tiles, the 2 × 2 blocking's rows. A caller that
/// splits rows among threads should cut at multiples of it (a partial panel is zero-padded).
pub const PANEL_ROWS: usize = 2 * TILE_ROWS;

/// Fewest tokens of one call for which the prefill GEMM runs on AMX where the CPU has it
/// (hipfire-exec's `gemv_tokens` checks [`amx_rows_used`]); fewer tokens go to the q8 row dots,
/// which also keeps decode (one token) and small batches exactly as before. 16 tokens (one B
/// tile) already beat the row dots on the H200 box's Xeon, one thread (`prefill_gemm --amx hw`,
/// 2026-12-02, AMX / row dots): Q4_K 1.28 × (k 4096) and 1.22 × (k 14336), Q6_K 2.55 × and
/// 2.16 ×; fewer tokens would pad the tile.
pub const AMX_MIN_TOKENS: usize = 16;

/// [`AMX_MIN_TOKENS`] for the formats without an AVX-512 panel dequantiser (all but Q4_K and
/// Q6_K), which go through `dequantize_row` and a conversion: 0.6 (Q8_0), 2.3 (Q4_0) and 3.1
/// (Q5_K) ns a weight on one thread of the H200 box's Xeon, against 0.2 for Q4_K / Q6_K. There
/// (`prefill_gemm --amx hw`, k 4096, 2026-12-02, AMX / row dots) 32 tokens gave Q8_0 1.30 ×,
/// Q4_0 0.45 ×, Q5_K 0.24 ×, and 256 tokens 5.2 ×, 2.5 × and 1.34 ×: those formats take AMX
/// from 256 tokens (never within the model's prefill chunks).
pub const AMX_MIN_TOKENS_GENERIC: usize = 256;

/// One tile row: 32 bf16 (64 bytes, one cache line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Line(pub(crate) [u16; TILE_K]);

impl Line {
    const ZERO: Line = Line([0; TILE_K]);
}

/// Which engine [`gemm_bf16`] runs the tile multiply on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmxEngine {
    /// A scalar emulation of `tdpbf16ps` on the same packed buffers (any CPU; for tests).
    Emulated,
    /// The AMX tile unit ([`amx_available`] must be true).
    Hardware,
}

impl AmxEngine {
    fn engine(self) -> Result<Engine, QuantError> {
        match self {
            AmxEngine::Emulated => Ok(Engine::Emulated),
            #[cfg(target_arch = "x86_64")]
            AmxEngine::Hardware if amx_available() => Ok(Engine::Hardware),
            AmxEngine::Hardware => Err(QuantError::AmxUnavailable(
                amx_status().err().unwrap_or("AMX unavailable"),
            )),
        }
    }
}

static AMX: OnceLock<Result<(), &'static str>> = OnceLock::new();

/// Whether this CPU and OS run AMX bf16 tiles (CPUID AMX-TILE + AMX-BF16 + AVX-512 BF16, and
/// Linux granted the process the tile data state). Checked once per process; the permission
/// request is made then.
pub fn amx_available() -> bool {
    amx_status().is_ok()
}

/// Set to anything but `0` or empty, [`amx_available`] says no (docs/env-vars.md).
pub const DISABLE_AMX_ENV: &str = "HIPFIRE_DISABLE_AMX";

/// [`amx_available`] with the reason when not.
pub fn amx_status() -> Result<(), &'static str> {
    *AMX.get_or_init(|| {
        let off = std::env::var(DISABLE_AMX_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        let r = if off {
            Err("disabled by HIPFIRE_DISABLE_AMX")
        } else {
            tiles::detect()
        };
        match r {
            Ok(()) => tracing::info!("hipfire-quant: AMX bf16 tiles available for prefill"),
            Err(why) => tracing::debug!(why, "hipfire-quant: no AMX, prefill uses the row dots"),
        }
        r
    })
}

/// Whether a prefill GEMM of `tokens` tokens over `fmt` rows runs on AMX on this machine
/// (hipfire-exec's `gemv_tokens` routes by it; its results are then within [`error_bound`]
/// rather than bit-identical to the single-token row dots).
pub fn amx_rows_used(fmt: Format, tokens: usize) -> bool {
    let min = match fmt {
        Format::Q4K | Format::Q6K => AMX_MIN_TOKENS,
        _ => AMX_MIN_TOKENS_GENERIC,
    };
    tokens >= min && amx_available()
}

/// The bound on a row's error relative to `Σ|w_i·x_i|` (see the module docs): 2⁻⁷ + 2⁻¹⁶ from
/// the two bf16 roundings of each product, plus `k·2⁻²⁴` of f32 summation. A worst case (every
/// rounding the same way); on random data the error is far smaller (the tests print it).
pub fn error_bound(k: usize) -> f64 {
    2f64.powi(-7) + 2f64.powi(-16) + k as f64 * 2f64.powi(-24)
}

/// f32 → bf16 bits, round to nearest even (finite input; what `vcvtneps2bf16` does for every
/// value that is not an f32 denormal).
#[inline]
pub(crate) fn f32_to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// Several tokens' activations in bf16, in the B layout of the module docs, packed token by
/// token, possibly from several threads at once; [`gemm_bf16`] reads it once every token is.
pub struct Bf16Tokens {
    lines: UnsafeCell<Vec<Line>>,
    /// `lines`' start, taken once: the vector never grows, and packing writes go through this.
    base: *mut Line,
    tokens: usize,
    k: usize,
    ksteps: usize,
    /// Per token, whether a thread has taken it (so each column is written by one thread).
    taken: Vec<AtomicBool>,
    /// Tokens packed; the release/acquire pair orders their writes before [`gemm_bf16`]'s reads.
    packed: AtomicUsize,
}

// SAFETY: writes through `base` go to the columns of one token each, claimed once through
// `taken`; reads happen only after `packed` (acquire) counted every token (release).
unsafe impl Send for Bf16Tokens {}
// SAFETY: as above.
unsafe impl Sync for Bf16Tokens {}

impl Bf16Tokens {
    /// Room for `tokens` activations of `k` elements, none packed yet.
    ///
    /// Errors: `k == 0` or a size that overflows.
    pub fn new(tokens: usize, k: usize) -> Result<Bf16Tokens, QuantError> {
        let ksteps = k.div_ceil(TILE_K);
        let groups = tokens.div_ceil(TILE_ROWS);
        let n = groups
            .checked_mul(ksteps)
            .and_then(|v| v.checked_mul(TILE_ROWS))
            .filter(|_| k > 0)
            .ok_or(QuantError::ShortBuffer {
                what: "bf16 tokens (k > 0, tokens × k within usize)",
                need: 1,
                got: k,
            })?;
        // A buffer of an earlier call: every token's column is rewritten whole by
        // `pack_token` (elements past k as zeros), and the padding tokens' columns are zeroed
        // here, so stale contents are never read; a fresh zeroed one cost the caller a memset
        // of up to 14 MiB per call (512 tokens at k = 14336).
        let mut lines = SPARE
            .lock()
            .ok()
            .and_then(|mut v| v.pop())
            .unwrap_or_default();
        lines.resize(n, Line::ZERO);
        if !tokens.is_multiple_of(TILE_ROWS) {
            let g = groups - 1;
            for line in &mut lines[g * ksteps * TILE_ROWS..] {
                line.0[2 * (tokens % TILE_ROWS)..].fill(0);
            }
        }
        let base = lines.as_mut_ptr();
        Ok(Bf16Tokens {
            lines: UnsafeCell::new(lines),
            base,
            tokens,
            k,
            ksteps,
            taken: (0..tokens).map(|_| AtomicBool::new(false)).collect(),
            packed: AtomicUsize::new(0),
        })
    }

    /// Tokens it holds.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Elements per token.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Pack token `t` from its `k` values `x` (round to nearest even).
    ///
    /// Errors (nothing written): `t` out of range or already taken, `x` not `k` long, or a
    /// non-finite value in `x`.
    pub fn pack_token(&self, t: usize, x: &[f32]) -> Result<(), QuantError> {
        if x.len() != self.k || t >= self.tokens {
            return Err(QuantError::ShortBuffer {
                what: "bf16 token (t < tokens, k values)",
                need: self.k,
                got: x.len(),
            });
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(QuantError::NonFinite {
                format: Format::BF16,
                what: "activation value",
                block: i,
            });
        }
        if self.taken[t].swap(true, Ordering::Relaxed) {
            return Err(QuantError::ShortBuffer {
                what: "bf16 token packed twice",
                need: 1,
                got: 2,
            });
        }
        let (g, n) = (t / TILE_ROWS, t % TILE_ROWS);
        let mut chunks = x.chunks_exact(TILE_K);
        for (s, chunk) in chunks.by_ref().enumerate() {
            let mut pairs = [0u32; TILE_ROWS];
            to_bf16_pairs(chunk, &mut pairs);
            // SAFETY: k-step s < ksteps of token group g < groups, and token t's column is
            // written by this thread only (claimed once just above; no reader runs before
            // `packed` counts it).
            unsafe { self.write_column(g, s, n, &pairs) };
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            // The last partial k-step, zeros past k.
            let mut padded = [0.0f32; TILE_K];
            padded[..tail.len()].copy_from_slice(tail);
            let mut pairs = [0u32; TILE_ROWS];
            to_bf16_pairs(&padded, &mut pairs);
            // SAFETY: as above, for the last k-step.
            unsafe { self.write_column(g, self.ksteps - 1, n, &pairs) };
        }
        self.packed.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Write token column `n`'s 16 bf16 pairs of k-step `s` of token group `g`: dword n of the
    /// step's 16 lines.
    ///
    /// # Safety
    /// `g < groups`, `s < ksteps`, `n < 16`, and no other thread writes or reads that column
    /// meanwhile.
    unsafe fn write_column(&self, g: usize, s: usize, n: usize, pairs: &[u32; TILE_ROWS]) {
        let first = (g * self.ksteps + s) * TILE_ROWS;
        for (p, &v) in pairs.iter().enumerate() {
            // SAFETY: line `first + p` is inside the buffer (the caller's bounds), dword n < 16
            // inside the line.
            unsafe { (self.base.add(first + p) as *mut u32).add(n).write(v) };
        }
    }

    /// Token group `g`'s lines, if every token has been packed.
    fn group(&self, g: usize) -> Option<&[Line]> {
        if self.packed.load(Ordering::Acquire) != self.tokens {
            return None;
        }
        // SAFETY: every token is packed (acquire above pairs with each packer's release), so no
        // write through `base` happens any more; the vector is never resized.
        let lines = unsafe { &*self.lines.get() };
        let per = self.ksteps * TILE_ROWS;
        lines.get(g * per..(g + 1) * per)
    }
}

/// k-steps of 32 dequantised per panel before the tiles run over them: 8 steps (256 elements,
/// one K-quant block) make a panel block of 16 KiB that stays in L1 while every pair of token
/// groups runs over it, and a block of the tokens of 256 KiB at 512 tokens that the panels of
/// a group read from L2. One thread of the H200 box's Xeon at 512 tokens (`prefill_gemm --amx
/// hw --amx-kblock 8,32 --amx-group 1,2,4,8`, 2026-12-03,
/// docs/perf-checkpoints/2026-12-03-cpu-prefill-claims-h200), GMAC/s with 8 panels a group,
/// 8 against 32 steps: Q4_K k 4096 242.5 / 213.3, k 14336 241.5 / 235.6; Q6_K 230.8 / 201.2
/// and 234.7 / 194.7.
pub const KBLOCK_STEPS: usize = 8;

/// Panels multiplied together per k-block (at most; a claim of fewer panels is one group):
/// the block of the tokens (`kblock` k-steps of every token) is then read from L2 by every
/// panel of the group instead of being fetched again per panel, where a whole row walk per
/// panel had pushed it out (the tokens span `k` elements each: 4–14 MiB at 512 tokens, and
/// from beyond L2 the tile unit ran at 162–167 GMAC/s against 660–677 from L2 and 826–889
/// from L1, `prefill_gemm`'s "tiles alone"). The group's C tiles stay alive meanwhile (4 KiB
/// per panel and pair of token groups: 512 KiB for 8 panels at 512 tokens). Same sweep as
/// [`KBLOCK_STEPS`], 8-step blocks, 1 / 2 / 4 / 8 panels: Q4_K k 4096 192.7 / 149.3 / 214.0 /
/// 242.5, k 14336 150.5 / 194.2 / 232.0 / 241.5; Q6_K k 4096 191.1 / 203.5 / 225.0 / 230.8,
/// k 14336 185.8 / 200.9 / 227.2 / 234.7.
pub const PANEL_GROUP: usize = 8;

/// Most rows a `gemv_tokens` worker should claim at a time on the AMX route: a panel group.
pub const CLAIM_ROWS: usize = PANEL_GROUP * PANEL_ROWS;

/// Buffers of dropped [`Bf16Tokens`], reused by the next (one per call in flight is plenty).
static SPARE: Mutex<Vec<Vec<Line>>> = Mutex::new(Vec::new());
/// Spare buffers kept at most.
const SPARE_MAX: usize = 4;

impl Drop for Bf16Tokens {
    fn drop(&mut self) {
        let lines = std::mem::take(self.lines.get_mut());
        if let Ok(mut spare) = SPARE.lock() {
            if spare.len() < SPARE_MAX {
                spare.push(lines);
            }
        }
    }
}

/// 32 f32 → 16 dwords of bf16 pairs (element 2p low, 2p + 1 high), rounded to nearest even.
fn to_bf16_pairs(x: &[f32], out: &mut [u32; TILE_ROWS]) {
    #[cfg(target_arch = "x86_64")]
    if dequant::fast_available() && x.len() == TILE_K {
        // SAFETY: AVX-512 F/BF16 present (fast_available), `x` holds 32 values.
        unsafe { dequant::pairs_avx512(x, out) };
        return;
    }
    for (o, p) in out.iter_mut().zip(x.chunks_exact(2)) {
        *o = u32::from(f32_to_bf16(p[0])) | (u32::from(f32_to_bf16(p[1])) << 16);
    }
}

/// A worker's dequantised panel block, C accumulators and f32 row buffer, kept per thread
/// between calls.
#[derive(Default)]
struct Scratch {
    panel: Vec<Line>,
    c: Vec<CBlock>,
    row: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `ys[t][i] (+)= row_i · x_t` for every token `t` of `acts` and `i` in `0..ys[t].len()`, in
/// bf16 on `engine` (see the module docs for the accuracy). Rows are taken contiguously from
/// `w_rows` (`row_bytes(k)` each).
///
/// Errors: `k` not a block multiple or not `acts.k()`, `ys` not one output per token or of
/// different lengths, `w_rows` too short, a token not packed, or [`AmxEngine::Hardware`]
/// without AMX.
pub fn gemm_bf16(
    engine: AmxEngine,
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    acts: &Bf16Tokens,
    ys: &mut [&mut [f32]],
    accumulate: bool,
) -> Result<(), QuantError> {
    gemm_bf16_kblock(
        engine,
        KBLOCK_STEPS,
        PANEL_GROUP,
        fmt,
        w_rows,
        k,
        acts,
        ys,
        accumulate,
    )
}

/// [`gemm_bf16`] with `kblock` k-steps per dequantised block (rounded up to a multiple of 8)
/// instead of [`KBLOCK_STEPS`] and `panel_group` panels per group instead of [`PANEL_GROUP`]:
/// the `prefill_gemm` example's sweep.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16_kblock(
    engine: AmxEngine,
    kblock: usize,
    panel_group: usize,
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    acts: &Bf16Tokens,
    ys: &mut [&mut [f32]],
    accumulate: bool,
) -> Result<(), QuantError> {
    let kblock = kblock.max(1).div_ceil(KBLOCK_ALIGN) * KBLOCK_ALIGN;
    let engine = engine.engine()?;
    let fast = dequant::fast_available();
    let rb = fmt.row_bytes(k)?;
    if acts.k != k {
        return Err(QuantError::ActivationMismatch {
            format: fmt,
            k,
            act_format: Format::BF16,
            act_k: acts.k,
        });
    }
    if ys.len() != acts.tokens {
        return Err(QuantError::ShortBuffer {
            what: "ys (one output per token)",
            need: acts.tokens,
            got: ys.len(),
        });
    }
    let m = ys.first().map_or(0, |y| y.len());
    if let Some(y) = ys.iter().find(|y| y.len() != m) {
        return Err(QuantError::ShortBuffer {
            what: "ys[t] (every output as long as the first)",
            need: m,
            got: y.len(),
        });
    }
    let need = m.checked_mul(rb).filter(|&n| n <= w_rows.len());
    let Some(need) = need else {
        return Err(QuantError::ShortBuffer {
            what: "w_rows",
            need: m.saturating_mul(rb),
            got: w_rows.len(),
        });
    };
    if m == 0 || acts.tokens == 0 {
        return Ok(());
    }
    let groups: Vec<&[Line]> = (0..acts.tokens.div_ceil(TILE_ROWS))
        .map(|g| acts.group(g))
        .collect::<Option<_>>()
        .ok_or(QuantError::ShortBuffer {
            what: "bf16 tokens packed",
            need: acts.tokens,
            got: acts.packed.load(Ordering::Relaxed),
        })?;
    let mut run = |s: &mut Scratch| {
        run_panels(
            engine,
            fast,
            kblock,
            panel_group.max(1),
            fmt,
            &w_rows[..need],
            rb,
            k,
            acts,
            &groups,
            ys,
            accumulate,
            s,
        )
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => run(&mut s),
        // Re-entered on this thread (not done today): a scratch of its own.
        Err(_) => run(&mut Scratch::default()),
    })
}

/// Dequantise every panel of `w_rows` (`m` rows) as [`gemm_bf16`] does, without multiplying:
/// the `prefill_gemm` example's split of the GEMM's time. Returns a checksum of the last panel.
#[doc(hidden)]
pub fn dequant_panels_for_bench(
    fmt: Format,
    w_rows: &[u8],
    k: usize,
    m: usize,
) -> Result<u64, QuantError> {
    let rb = fmt.row_bytes(k)?;
    let w = w_rows.get(..m * rb).ok_or(QuantError::ShortBuffer {
        what: "w_rows",
        need: m * rb,
        got: w_rows.len(),
    })?;
    let ksteps = k.div_ceil(TILE_K);
    let kblock = KBLOCK_STEPS.min(ksteps);
    let mut panel = vec![Line::ZERO; kblock * PANEL_ROWS];
    let mut row = vec![0.0; kblock * TILE_K];
    let fast = dequant::fast_available();
    let panels: Vec<&[u8]> = w.chunks(PANEL_ROWS * rb).collect();
    for (pi, rows) in panels.iter().enumerate() {
        for s0 in (0..ksteps).step_by(kblock) {
            let ns = kblock.min(ksteps - s0);
            // This panel's next block, or the next panel's first.
            match (s0 + ns < ksteps, panels.get(pi + 1)) {
                (true, _) => prefetch_block(rows, rb, k, s0 + ns, kblock),
                (false, Some(next)) => prefetch_block(next, rb, k, 0, kblock),
                (false, None) => {}
            }
            dequant::fill_panel(fast, fmt, rows, rb, k, s0, ns, &mut panel, &mut row)?;
        }
    }
    Ok(panel.iter().map(|l| u64::from(l.0[0])).sum())
}

/// The tile micro-kernel alone, for the `prefill_gemm` example's ceiling: `passes` sweeps of
/// one panel of [`PEAK_KSTEPS`] k-steps (16 KiB, from L1) against token groups filling
/// `b_bytes` of B (from L1, L2 or beyond, as the size says), each pair of groups one
/// micro-kernel call into the same C block. Returns the multiply-accumulates done.
#[doc(hidden)]
pub fn tiles_peak_for_bench(
    engine: AmxEngine,
    b_bytes: usize,
    passes: usize,
) -> Result<u64, QuantError> {
    let engine = engine.engine()?;
    let pair_lines = 2 * PEAK_KSTEPS * TILE_ROWS;
    let pairs = (b_bytes / (pair_lines * std::mem::size_of::<Line>())).max(1);
    let fill = |i: usize| {
        let mut l = Line::ZERO;
        l.0.iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = f32_to_bf16(((i * 31 + j) % 17) as f32 / 17.0 - 0.5));
        l
    };
    let a: Vec<Line> = (0..PEAK_KSTEPS * PANEL_ROWS).map(fill).collect();
    let b: Vec<Line> = (0..pairs * pair_lines).map(fill).collect();
    let mut c = CBlock([[0.0; tiles::C_TILE]; 4]);
    let session = TileSession::start(engine);
    let half = PEAK_KSTEPS * TILE_ROWS;
    for _ in 0..passes {
        for pair in b.chunks_exact(pair_lines) {
            let (b0, b1) = pair.split_at(half);
            tiles::dot_panel(&session, &a, (b0, Some(b1)), PEAK_KSTEPS, &mut c);
        }
    }
    std::hint::black_box(&c);
    Ok((passes * pairs * PEAK_KSTEPS * PANEL_ROWS * 2 * TILE_ROWS * TILE_K) as u64)
}

/// k-steps of [`tiles_peak_for_bench`]'s panel.
const PEAK_KSTEPS: usize = 8;

/// k-blocks are whole multiples of 8 k-steps: 256 elements, a whole block of every format
/// (1, 32 or 256 elements), so each k-block dequantises whole blocks.
const KBLOCK_ALIGN: usize = 8;
const _: () = assert!(KBLOCK_STEPS.is_multiple_of(KBLOCK_ALIGN));

/// The panels of `w` (whole rows of `rb` bytes, as many as `ys[t].len()`), in groups of
/// `panel_group`: for each k-block of `kblock` steps, every panel of the group is dequantised
/// over that block and every pair of token groups multiplied into the panel's C tiles; after
/// the last k-block the group's C tiles are scattered into the outputs. Each C tile still sums
/// its k-steps in order, so the grouping changes no result bit.
#[allow(clippy::too_many_arguments)]
fn run_panels(
    engine: Engine,
    fast: bool,
    kblock: usize,
    panel_group: usize,
    fmt: Format,
    w: &[u8],
    rb: usize,
    k: usize,
    acts: &Bf16Tokens,
    groups: &[&[Line]],
    ys: &mut [&mut [f32]],
    accumulate: bool,
    s: &mut Scratch,
) -> Result<(), QuantError> {
    let ksteps = acts.ksteps;
    let kblock = kblock.min(ksteps);
    let pairs = groups.len().div_ceil(2);
    s.panel.resize(kblock * PANEL_ROWS, Line::ZERO);
    s.row.resize(kblock * TILE_K, 0.0);
    s.c.resize_with(panel_group * pairs, || CBlock([[0.0; tiles::C_TILE]; 4]));
    let session = TileSession::start(engine);
    let group_bytes = panel_group * PANEL_ROWS * rb;
    for (gi, gw) in w.chunks(group_bytes).enumerate() {
        let panels: Vec<&[u8]> = gw.chunks(PANEL_ROWS * rb).collect();
        let cs = &mut s.c[..panels.len() * pairs];
        cs.iter_mut()
            .for_each(|c| c.0.iter_mut().for_each(|t| t.fill(0.0)));
        for s0 in (0..ksteps).step_by(kblock) {
            let ns = kblock.min(ksteps - s0);
            for (pi, rows) in panels.iter().enumerate() {
                // The next panel's block of this k-step range, or the first panel's next block.
                match panels.get(pi + 1) {
                    Some(next) => prefetch_block(next, rb, k, s0, ns),
                    None => prefetch_block(panels[0], rb, k, s0 + ns, kblock),
                }
                dequant::fill_panel(fast, fmt, rows, rb, k, s0, ns, &mut s.panel, &mut s.row)?;
                let pc = &mut cs[pi * pairs..(pi + 1) * pairs];
                for (pair, c) in groups.chunks(2).zip(pc.iter_mut()) {
                    let b0 = &pair[0][s0 * TILE_ROWS..];
                    let b1 = pair.get(1).map(|b| &b[s0 * TILE_ROWS..]);
                    if !tiles::dot_panel(&session, &s.panel, (b0, b1), ns, c) {
                        return Err(QuantError::ShortBuffer {
                            what: "AMX panel or token group",
                            need: ns * PANEL_ROWS,
                            got: s.panel.len(),
                        });
                    }
                }
            }
        }
        for (pi, rows) in panels.iter().enumerate() {
            let r0 = (gi * panel_group + pi) * PANEL_ROWS;
            let n_rows = rows.len() / rb;
            let pc = &cs[pi * pairs..(pi + 1) * pairs];
            scatter_panel(pc, r0, n_rows, acts.tokens, ys, accumulate);
        }
    }
    Ok(())
}

/// Write (or add) one panel's C tiles, rows `r0..r0 + n_rows`, into every token's output.
fn scatter_panel(
    cs: &[CBlock],
    r0: usize,
    n_rows: usize,
    tokens: usize,
    ys: &mut [&mut [f32]],
    accumulate: bool,
) {
    for (gp, c) in cs.iter().enumerate() {
        for gi in 0..2 {
            let t0 = (2 * gp + gi) * TILE_ROWS;
            if t0 >= tokens {
                continue;
            }
            let nt = TILE_ROWS.min(tokens - t0);
            for rt in 0..2 {
                let ct = &c.0[2 * rt + gi];
                let rr0 = rt * TILE_ROWS;
                let nr = TILE_ROWS.min(n_rows.saturating_sub(rr0));
                if nr == 0 {
                    continue;
                }
                for (n, y) in ys[t0..t0 + nt].iter_mut().enumerate() {
                    let y = &mut y[r0 + rr0..r0 + rr0 + nr];
                    for (i, yi) in y.iter_mut().enumerate() {
                        let v = ct[i * TILE_ROWS + n];
                        *yi = if accumulate { *yi + v } else { v };
                    }
                }
            }
        }
    }
}

/// Prefetch k-steps `s..s + ns` of a panel's rows (nothing past the last step).
fn prefetch_block(rows: &[u8], rb: usize, k: usize, s: usize, ns: usize) {
    let (e0, e1) = (s * TILE_K, ((s + ns) * TILE_K).min(k));
    if e0 >= k {
        return;
    }
    let bytes = |e: usize| e * rb / k;
    prefetch_rows(rows, bytes(e0), rows.len() / rb, rb, bytes(e1) - bytes(e0));
}

/// Software-prefetch `len` bytes from `start` of each of `n_rows` rows (`rb` apart) of `w` into
/// L2, while the current block is dequantised: a panel walks 32 rows a block at a time, a
/// pattern the hardware prefetchers follow poorly (dequantising alone ran at 3.4 GB/s of weight
/// at k = 4096 and 1.3–2.4 GB/s at k = 14336, one thread of the H200 box, 2026-12-02).
/// Bytes past `w` are skipped.
fn prefetch_rows(w: &[u8], start: usize, n_rows: usize, rb: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for r in 0..n_rows {
        let from = start + r * rb;
        let Some(bytes) = w.get(from..(from + len).min(w.len())) else {
            return;
        };
        for line in bytes.chunks(PREFETCH_LINE) {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            // SAFETY: SSE is in x86_64's baseline; a prefetch of an address inside `w` only
            // moves a cache line.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, start, n_rows, rb, len);
}

/// A cache line.
const PREFETCH_LINE: usize = 64;

#[cfg(test)]
mod tests;
