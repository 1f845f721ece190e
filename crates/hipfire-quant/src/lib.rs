//! hipfire-quant: the weight formats hipfire multiplies, and the CPU row dot.
//!
//! # Layout (CONTRACT — other crates code against these names; extend, do not rename)
//! - `Format` — type-erased format enum (GGUF id ↔ variant, block geometry, row bytes,
//!   `has_cpu_simd()`, `has_gpu_kernel()`).
//! - `formats/` — one file per family with the exact GGUF byte layouts
//!   (`float.rs`, `legacy.rs`, `kquant.rs`, `kquant_low.rs`, `iq4.rs`, `mxfp4.rs`, `hfq.rs`), each
//!   block a `#[repr(C)]` struct with a compile-time size assertion, described by the
//!   [`formats::BlockFormat`] trait.
//! - `act.rs` — [`ActivationBuf`], the activation in the form the row dots want.
//! - `shared_act.rs` — [`SharedActivation`]: one q8_K activation that several threads prepare
//!   together and all read (the `flags` join's CPU workers).
//! - `read.rs` — [`read_sum`], the plain read that GEMV bandwidth is measured against.
//! - `amx/` — [`gemm_bf16`], the prompt-token GEMM on Intel AMX bf16 tiles ([`Bf16Tokens`] the
//!   packed tokens, [`amx_rows_used`] the route hipfire-exec's `gemv_tokens` takes); the tile op
//!   in `asm!` and a scalar emulation of it on the same buffers (`amx/tiles.rs`).
//! - `dot/` — scalar reference + AVX2 + AVX-512 row dots (`avx2_mix.rs` / `avx512_mix.rs`
//!   hold those of the formats K_M / IQ4 files fall back to: Q5_0, Q5_1, Q3_K, Q2_K, IQ4_NL,
//!   IQ4_XS, and MXFP4's); `dispatch.rs` picks the tier once.
//!
//! Public functions every other crate uses:
//! - `Format::row_bytes(k) -> Result<usize, QuantError>`
//! - `dequantize_row(fmt, bytes, out: &mut [f32])` (out.len() == k) and `dequantize_row_f64`
//! - `quantize_row(fmt, src: &[f32]) -> Result<Vec<u8>, QuantError>` (src.len() == k)
//! - `ActivationBuf::prepare(fmt, x)` — the per-GEMV activation in the form the row dot wants
//!   (may be 8-bit quantised, like ggml's q8); prepared once per GEMV, shared read-only by workers.
//! - `gemv_rows(fmt, w_rows: &[u8], k, act: &ActivationBuf, y: &mut [f32], accumulate: bool)`
//!   — `y[i] (+)= row_i · x` for i in `0..y.len()`, rows taken contiguously from `w_rows`
//!   (w_rows.len() must be >= y.len() * row_bytes(k)).
//! - `gemv_rows_multi(fmt, w_rows, k, acts: &[&ActivationBuf], ys: &mut [&mut [f32]], accumulate)`
//!   — `gemv_rows` of several activations (prompt tokens) over the same rows, each `ys[j]`
//!   bit-identical to `gemv_rows` of `acts[j]` where `multi_matches_single` says so; on AVX-512
//!   Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_0 / Q5_1 / Q5_K / Q6_K / IQ4_NL / IQ4_XS / MXFP4 each weight
//!   block is unpacked once per eight activations, and on every tier the rows are walked in 16 KiB
//!   tiles with all activations run over a tile before the next, so weight bytes are read from
//!   DRAM once per call (`gemv_rows_multi_with(tier, ..)` for tests).
//! - `simd_tier() -> SimdTier` — the detected path (printed by `hipfire version`).
//!
//! Also public: `gemv_rows_scalar` (same signature, scalar reference path) and
//! `gemv_rows_with(tier, ..)` (an explicit tier, `QuantError::TierUnavailable` if the CPU lacks
//! it) for tests and benches; `SimdTier::{ALL, detect, is_supported, name}`;
//! `ActivationBuf::{format, k, is_quantised}`; `formats::*` block structs and the
//! `BlockFormat` trait.
//!
//! # The one design decision: integer dots on a quantised activation
//! CPU decode is memory-bound only if the row dot keeps up with DRAM (~6 GB/s of weight bytes
//! per core). Like ggml, [`ActivationBuf::prepare`] therefore quantises `x` to 8 bits for the
//! block formats (per 32 elements for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/MXFP4/HFQ4G256 — ggml's
//! q8_0/q8_1 —, per 256 with per-16 sums for the K-quants and IQ4_XS — ggml's q8_K), and the
//! row dots multiply integers
//! (`vpmaddubsw` on AVX2, `vpdpbusd` on AVX-512 VNNI). Each element of `x` is then off by at
//! most half a step, `amax(group)/254`, so a row's result moves by at most
//! `Σ |w_i| · amax(group(i)) / 254`. `tests/formats.rs` asserts that bound for every format
//! and tier against the f64 reference (dequantised weights, unquantised `x`) and prints the
//! error it measured: on its seeded data the worst row was off by 1.2e-3 to 3.2e-3 of
//! `Σ |w_i·x_i|` (K-quants and HFQ4G256 at the low end, Q4_1 at the high end), against
//! ~5e-8 for the float formats. Float formats (F32/F16/BF16) keep `x` in f32.
//! The scalar reference dot computes the same function on the same quantised `x` (exact integer
//! block sums), so SIMD and scalar differ only by f32 summation order.
//!
//! To stay memory-bound the 512-bit loops also minimise vector µops per weight byte (Intel
//! cores issue 512-bit ops on two ports only) and software-prefetch ahead of the weight
//! stream. With 2 KiB ahead, on the Emerald Rapids H200 box (`examples/gemv_gbs`, k = m = 4096,
//! 2 GiB of weights, 16 threads) that reached 0.90–0.98 (Q4_0), 0.91–0.96 (Q8_0) and 0.85–0.93
//! (Q4_K) of a plain read of the same bytes in the same run, over five runs (the read itself
//! varied from 81 to 132 GB/s between runs, so single ratios are noisy). The distance is now
//! 8 KiB (see `dot::avx2::PREFETCH_AHEAD`): on the 2-core AMD EPYC dev VM at 1 thread that
//! took Q4_K from 0.70–0.79 to 0.90–0.95 of a read and every other format up by 0.05–0.15.
//!
//! # Errors
//! One small enum, [`QuantError`], because every failure here is bad input that the caller can
//! name precisely (shape, length, NaN, unknown GGUF type, unavailable tier) and the hot path
//! must not allocate: validation happens once per `gemv_rows` call, before any kernel runs,
//! and kernels then assume valid input (they are `unsafe fn`s behind that check).
#![deny(missing_docs)]

mod act;
mod amx;
mod dispatch;
mod dot;
pub mod formats;
mod read;
mod shared_act;

pub use act::{quantise_q8k, ActivationBuf, Q8K_BLOCK};
pub use amx::{
    amx_available, amx_rows_used, amx_status, dequant_panels_for_bench,
    error_bound as amx_error_bound, gemm_bf16, gemm_bf16_kblock, tiles_peak_for_bench, AmxEngine,
    Bf16Tokens, AMX_MIN_TOKENS, CLAIM_ROWS as AMX_CLAIM_ROWS, KBLOCK_STEPS as AMX_KBLOCK_STEPS,
    PANEL_GROUP as AMX_PANEL_GROUP, PANEL_ROWS as AMX_PANEL_ROWS,
};
pub use dispatch::{
    dequantize_row, dequantize_row_f64, gemv_rows, gemv_rows_multi, gemv_rows_multi_with,
    gemv_rows_scalar, gemv_rows_with, multi_matches_single, quantize_row, simd_tier, SimdTier,
    MULTI_ROW_TILE,
};
pub use read::read_sum;
pub use shared_act::SharedActivation;

use thiserror::Error;

/// Errors for bad input. Never panics on user data.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum QuantError {
    /// `k` is not a multiple of the format's block size.
    #[error("k = {k} is not a multiple of {format}'s block of {block} elements")]
    KNotBlockMultiple {
        /// Format.
        format: Format,
        /// Requested k.
        k: usize,
        /// Elements per block.
        block: usize,
    },
    /// A buffer is shorter than the shape needs.
    #[error("{what}: buffer holds {got} bytes/elements, {need} needed")]
    ShortBuffer {
        /// Which buffer.
        what: &'static str,
        /// Needed length.
        need: usize,
        /// Actual length.
        got: usize,
    },
    /// A scale or value is NaN/inf where the format cannot carry it.
    #[error("non-finite {what} in {format} block {block}")]
    NonFinite {
        /// Format.
        format: Format,
        /// Which value.
        what: &'static str,
        /// Block index.
        block: usize,
    },
    /// Unknown GGUF type id.
    #[error("unknown or unsupported GGML type id {0}")]
    UnknownGgmlType(u32),
    /// The [`ActivationBuf`] was prepared for another format or another `k`.
    #[error("activation prepared for {act_format} k = {act_k}, used with {format} k = {k}")]
    ActivationMismatch {
        /// Format of the weights.
        format: Format,
        /// k of the weights.
        k: usize,
        /// Format the activation was prepared for.
        act_format: Format,
        /// k the activation was prepared for.
        act_k: usize,
    },
    /// `k` is so large that a row's byte size overflows `usize`.
    #[error("k = {k} is too large: a {format} row's byte size overflows usize")]
    RowTooLarge {
        /// Format.
        format: Format,
        /// Requested k.
        k: usize,
    },
    /// A SIMD tier was requested explicitly that this CPU does not support.
    #[error("SIMD tier {0} is not supported by this CPU")]
    TierUnavailable(SimdTier),
    /// The AMX engine was requested on a CPU or OS without AMX bf16 tiles (the reason).
    #[error("AMX is not available: {0}")]
    AmxUnavailable(&'static str),
}

/// A weight format. GGUF formats use GGUF's exact byte layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// GGML Q8_0: f16 d + 32 × i8 (34 B / 32).
    Q8_0,
    /// GGML Q4_0: f16 d + 16 B nibbles (18 B / 32), value = d·(q−8).
    Q4_0,
    /// GGML Q4_1: f16 d, f16 m + 16 B nibbles (20 B / 32), value = d·q + m.
    Q4_1,
    /// GGML Q4_K super-block (144 B / 256).
    Q4K,
    /// GGML Q6_K super-block (210 B / 256).
    Q6K,
    /// HFQ4G256: f32 scale, f32 zero, 128 B nibbles (136 B / 256), low nibble = even index.
    Hfq4G256,
    /// GGML Q5_0: f16 d, 32 high bits, 16 B nibbles (22 B / 32), value = d·(q−16).
    Q5_0,
    /// GGML Q5_1: f16 d, f16 m, 32 high bits, 16 B nibbles (24 B / 32), value = d·q + m.
    Q5_1,
    /// GGML Q5_K super-block (176 B / 256): Q4_K plus one high bit per element.
    Q5K,
    /// GGML Q3_K super-block (110 B / 256): 3-bit codes, sixteen 6-bit scales.
    Q3K,
    /// GGML Q2_K super-block (84 B / 256): 2-bit codes, sixteen 4-bit scales and mins.
    Q2K,
    /// GGML IQ4_NL: f16 d + 16 B nibbles (18 B / 32), value = d·table(q).
    Iq4Nl,
    /// GGML IQ4_XS super-block (136 B / 256): IQ4_NL's table under eight 6-bit sub-scales.
    Iq4Xs,
    /// GGML MXFP4 (OCP microscaling FP4): E8M0 exponent e + 16 B nibbles (17 B / 32),
    /// value = table(q)·2^(e − 128) with the E2M1 table doubled to integers.
    Mxfp4,
}

impl Format {
    /// Every format, in a stable order (tests and benches iterate this).
    pub const ALL: [Format; 17] = [
        Format::F32,
        Format::F16,
        Format::BF16,
        Format::Q8_0,
        Format::Q4_0,
        Format::Q4_1,
        Format::Q4K,
        Format::Q6K,
        Format::Hfq4G256,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q5K,
        Format::Q3K,
        Format::Q2K,
        Format::Iq4Nl,
        Format::Iq4Xs,
        Format::Mxfp4,
    ];

    /// Elements per block.
    pub const fn block_elems(self) -> usize {
        match self {
            Format::F32 | Format::F16 | Format::BF16 => 1,
            Format::Q8_0
            | Format::Q4_0
            | Format::Q4_1
            | Format::Q5_0
            | Format::Q5_1
            | Format::Iq4Nl
            | Format::Mxfp4 => 32,
            Format::Q4K
            | Format::Q6K
            | Format::Hfq4G256
            | Format::Q5K
            | Format::Q3K
            | Format::Q2K
            | Format::Iq4Xs => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::F16 | Format::BF16 => 2,
            Format::Q8_0 => 34,
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q4K => 144,
            Format::Q6K => 210,
            Format::Hfq4G256 => 136,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q5K => 176,
            Format::Q3K => 110,
            Format::Q2K => 84,
            Format::Iq4Nl => 18,
            Format::Iq4Xs => 136,
            Format::Mxfp4 => 17,
        }
    }

    /// Bytes of one row of `k` elements.
    pub fn row_bytes(self, k: usize) -> Result<usize, QuantError> {
        let block = self.block_elems();
        if k == 0 || !k.is_multiple_of(block) {
            return Err(QuantError::KNotBlockMultiple {
                format: self,
                k,
                block,
            });
        }
        (k / block)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::RowTooLarge { format: self, k })
    }

    /// GGML type id (GGUF tensor info), `None` for hipfire-only formats.
    pub const fn ggml_type(self) -> Option<u32> {
        match self {
            Format::F32 => Some(0),
            Format::F16 => Some(1),
            Format::Q4_0 => Some(2),
            Format::Q4_1 => Some(3),
            Format::Q5_0 => Some(6),
            Format::Q5_1 => Some(7),
            Format::Q8_0 => Some(8),
            Format::Q4K => Some(12),
            Format::Q5K => Some(13),
            Format::Q2K => Some(10),
            Format::Q3K => Some(11),
            Format::Iq4Nl => Some(20),
            Format::Iq4Xs => Some(23),
            Format::Mxfp4 => Some(39),
            Format::Q6K => Some(14),
            Format::BF16 => Some(30),
            Format::Hfq4G256 => None,
        }
    }

    /// Format for a GGML type id.
    pub fn from_ggml_type(id: u32) -> Result<Format, QuantError> {
        Format::ALL
            .into_iter()
            .find(|f| f.ggml_type() == Some(id))
            .ok_or(QuantError::UnknownGgmlType(id))
    }

    /// Short lower-case name used on the CLI and in traces (`q4_k`, `hfq4g256`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::F16 => "f16",
            Format::BF16 => "bf16",
            Format::Q8_0 => "q8_0",
            Format::Q4_0 => "q4_0",
            Format::Q4_1 => "q4_1",
            Format::Q4K => "q4_k",
            Format::Q6K => "q6_k",
            Format::Hfq4G256 => "hfq4g256",
            Format::Q5_0 => "q5_0",
            Format::Q5_1 => "q5_1",
            Format::Q5K => "q5_k",
            Format::Q3K => "q3_k",
            Format::Q2K => "q2_k",
            Format::Iq4Nl => "iq4_nl",
            Format::Iq4Xs => "iq4_xs",
            Format::Mxfp4 => "mxfp4",
        }
    }

    /// Parse a CLI name (as printed by [`Format::name`]).
    pub fn from_name(s: &str) -> Option<Format> {
        let s = s.to_ascii_lowercase().replace('-', "_");
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s || f.name().replace('_', "") == s)
    }
}

impl Format {
    /// True if and only if this format has a SIMD row dot on some x86-64 tier (all do).
    /// On other architectures every format runs the scalar reference.
    pub const fn has_cpu_simd(self) -> bool {
        cfg!(target_arch = "x86_64")
    }

    /// True if and only if the GPU crate ships a GEMV kernel for this format (all but MXFP4 do
    /// today; a format without one keeps its weights on the CPU and the GPU tests skip it).
    pub const fn has_gpu_kernel(self) -> bool {
        match self {
            Format::F32
            | Format::F16
            | Format::BF16
            | Format::Q8_0
            | Format::Q4_0
            | Format::Q4_1
            | Format::Q4K
            | Format::Q6K
            | Format::Hfq4G256
            | Format::Q5_0
            | Format::Q5_1
            | Format::Q5K
            | Format::Q3K
            | Format::Q2K
            | Format::Iq4Nl
            | Format::Iq4Xs => true,
            Format::Mxfp4 => false,
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
