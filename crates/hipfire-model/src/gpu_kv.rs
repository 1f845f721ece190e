//! The GPU decoder's K/V cache layout, per [`CacheType`] (`model.cache_type`).
//!
//! One layer's K (or V) cache for one sequence is one device buffer of `cap` positions, each
//! position `kv_dim` = `n_kv_head × head_dim` values:
//! - **f16**: `[cap][kv_dim]` f16 (position `p` at value `p × kv_dim`);
//! - **q8_0**: `[cap][kv_dim]` int8 quants, then `[cap][kv_dim / 32]` f16 scales — value `i` of
//!   position `p` is `quant[p·kv_dim + i] × scale[(p·kv_dim + i) / 32]`, each run of 32 quantised
//!   as ggml's q8_0 (`kernels/kv_q8.cuh`, the same arithmetic as the CPU engine's
//!   [`crate::kv_q8`]). Quants and scales sit apart, not in ggml's interleaved 34-byte blocks, so
//!   that a lane's 8 quants are one aligned 8-byte load whatever the row width; the bytes are
//!   ggml's, 34 per 32 values, which the placement budget counts ([`CacheType::bytes`]).
//!
//! The kernels find the scales from the capacity, which they are passed; the host derives it
//! from the buffer's length with [`GpuKvLayout::capacity`], so the store, the decode attention
//! and the chunk attention agree on it by construction.

use half::f16;

/// `kernels/kv_q8.cuh`: the q8_0 store and both caches' loads, included by the decode and
/// prefill kernels.
pub const KV_Q8_CUH: &str = include_str!("../../../kernels/kv_q8.cuh");

use crate::attention::CacheType;
use crate::kv_q8::Q8_BLOCK;

/// How one layer's cache of `kv_dim` values a position is laid out in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuKvLayout {
    /// The stored type.
    pub cache_type: CacheType,
    /// Values a position: `n_kv_head × head_dim` (a multiple of 32 for q8_0).
    pub kv_dim: usize,
}

impl GpuKvLayout {
    /// Bytes one position takes.
    pub fn position_bytes(&self) -> usize {
        self.cache_type.bytes(self.kv_dim)
    }

    /// Bytes to allocate for `cap` positions: [`GpuKvLayout::position_bytes`] × `cap`, rounded
    /// up to whole 32-bit words so a 32-bit zero fill covers it.
    pub fn alloc_bytes(&self, cap: usize) -> usize {
        (self.position_bytes() * cap).next_multiple_of(std::mem::size_of::<u32>())
    }

    /// Positions a buffer of `byte_len` bytes holds (what the kernels are told, so that the
    /// scale region of a q8_0 cache starts at `capacity × kv_dim`).
    pub fn capacity(&self, byte_len: usize) -> usize {
        byte_len / self.position_bytes().max(1)
    }

    /// Byte offsets of position `pos` in a cache of `cap` positions: of its values (f16) or
    /// quants (q8_0), and of its first scale (q8_0; equal to the first for f16).
    pub fn position_offsets(&self, cap: usize, pos: usize) -> (usize, usize) {
        match self.cache_type {
            CacheType::F16 => {
                let at = pos * self.kv_dim * 2;
                (at, at)
            }
            CacheType::Q8_0 => (
                pos * self.kv_dim,
                cap * self.kv_dim + pos * (self.kv_dim / Q8_BLOCK) * 2,
            ),
        }
    }

    /// The device image of a q8_0 cache of `cap` positions holding `values` (`n_pos × kv_dim`,
    /// `n_pos ≤ cap`) in its first positions, quantised as the GPU's store quantises them; the
    /// rest zero. For tests and tools that build a cache on the host. `None` for an f16 layout or
    /// a `kv_dim` that is not a multiple of 32.
    pub fn q8_image(&self, values: &[f32], cap: usize) -> Option<Vec<u8>> {
        let n = self.kv_dim;
        if self.cache_type != CacheType::Q8_0 || n == 0 || n % Q8_BLOCK != 0 {
            return None;
        }
        let n_pos = values.len() / n;
        if n_pos > cap || values.len() % n != 0 {
            return None;
        }
        let mut img = vec![0u8; self.alloc_bytes(cap)];
        let scales = cap * n;
        let mut q = [0i8; Q8_BLOCK];
        for (b, run) in values.chunks_exact(Q8_BLOCK).enumerate() {
            let d: f16 = crate::kv_q8::quantize_block(run, &mut q);
            for (o, &v) in img[b * Q8_BLOCK..(b + 1) * Q8_BLOCK].iter_mut().zip(&q) {
                *o = v as u8;
            }
            img[scales + 2 * b..scales + 2 * b + 2].copy_from_slice(&d.to_bits().to_le_bytes());
        }
        Some(img)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_layout_puts_scales_after_every_quant() {
        let l = GpuKvLayout {
            cache_type: CacheType::Q8_0,
            kv_dim: 192,
        };
        assert_eq!(l.position_bytes(), 204);
        assert_eq!(l.alloc_bytes(3), 612);
        assert_eq!(l.alloc_bytes(1), 204);
        assert_eq!(l.capacity(l.alloc_bytes(7)), 7);
        assert_eq!(l.position_offsets(7, 0), (0, 7 * 192));
        assert_eq!(l.position_offsets(7, 2), (384, 7 * 192 + 2 * 6 * 2));
        // An odd position count rounds the allocation up to a word; the capacity stays.
        let o = GpuKvLayout {
            cache_type: CacheType::Q8_0,
            kv_dim: 32,
        };
        assert_eq!(o.alloc_bytes(1), 36);
        assert_eq!(o.capacity(36), 1);
    }

    #[test]
    fn f16_layout_is_rows_of_halves() {
        let l = GpuKvLayout {
            cache_type: CacheType::F16,
            kv_dim: 1024,
        };
        assert_eq!(l.position_bytes(), 2048);
        assert_eq!(l.capacity(l.alloc_bytes(5)), 5);
        assert_eq!(l.position_offsets(5, 3), (3 * 2048, 3 * 2048));
        assert!(l.q8_image(&[0.0; 1024], 1).is_none());
    }

    #[test]
    fn q8_image_round_trips_within_half_a_step() {
        let l = GpuKvLayout {
            cache_type: CacheType::Q8_0,
            kv_dim: 64,
        };
        let vals: Vec<f32> = (0..3 * 64)
            .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 13.0)
            .collect();
        let img = l.q8_image(&vals, 4).expect("q8 layout");
        assert_eq!(img.len(), l.alloc_bytes(4));
        for (i, &x) in vals.iter().enumerate() {
            let q = img[i] as i8;
            let off = 4 * 64 + 2 * (i / 32);
            let d = f16::from_bits(u16::from_le_bytes([img[off], img[off + 1]])).to_f32();
            let amax = vals[i / 32 * 32..(i / 32 + 1) * 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            // Half a step of the f32 scale, plus the f16 rounding of the scale times 127.
            let bound = 0.5 * amax / 127.0 + 127.0 * (d - amax / 127.0).abs() + 1e-6;
            assert!(
                (f32::from(q) * d - x).abs() <= bound,
                "value {i}: {x} vs {q}·{d}"
            );
        }
        // The positions past the data stay zero (quants and scales).
        assert!(img[3 * 64..4 * 64].iter().all(|&b| b == 0));
        assert!(img[4 * 64 + 3 * 4..].iter().all(|&b| b == 0));
    }
}
