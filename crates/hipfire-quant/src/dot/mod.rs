//! Row dots: `row · x` for one weight row against a prepared activation.
//!
//! `scalar` is the reference every SIMD tier is tested against; it computes the same function
//! (same quantised activation, exact integer block sums) with f64 accumulation across blocks.
//! Kernel names follow `dot_<weights>_<activation>_<isa>`, as candle's `vec_dot_q4_0_q8_0`.

pub(crate) mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_mix;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_mix;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_tile;
