//! The CPU engine's q8_0 K/V cache (`model.cache_type = q8_0`): about half the bytes of the
//! f16 cache.
//!
//! Each run of 32 values of one head is stored as 32 int8 and one f16 scale (ggml's q8_0:
//! `d = max|x| / 127`, `q = round(x / d)`). Keys keep the f16 cache's transposed blocks of
//! [`KV_BLOCK`] positions (`[block][dim][16]` int8, `[block][dim / 32][16]` scales) and values
//! their rows (`[t][head_dim]`, `[t][head_dim / 32]`). Attention dequantises the positions of
//! one work item into a one-head f16 [`KvLayer`] and runs the f16 kernels on it
//! ([`Q8KvLayer::dequantize_into`]). So a q8_0 cache gives exactly what an f16 cache holding the
//! dequantised values would give (tested); its accuracy against the f16 cache is measured in
//! the record the CHANGELOG names.

use half::f16;

use crate::attention::{KvLayer, KV_BLOCK};

/// Values per q8_0 block (ggml's `QK8_0`): `head_dim` must be a multiple of it.
pub const Q8_BLOCK: usize = 32;

/// Bytes one cached value takes: 32 int8 and a 2-byte scale per 32 values.
pub const Q8_BYTES_PER_32: usize = Q8_BLOCK + 2;

/// `x` (32 values) as q8_0: the scale and the 32 quantised values.
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8]) -> f16 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in q.iter_mut().zip(x) {
        // |v · inv| ≤ 127 by construction; the clamp only guards rounding at the edge.
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    f16::from_f32(d)
}

/// One layer's K/V cache in q8_0: `n_kv` heads of `head_dim` (a multiple of [`Q8_BLOCK`]).
#[derive(Debug, Clone)]
pub struct Q8KvLayer {
    n_kv: usize,
    hd: usize,
    n_pos: usize,
    /// Per KV head, `ceil(n_pos / 16)` blocks of `[head_dim][16]` int8 keys; lanes past `n_pos`
    /// are zero.
    k: Vec<Vec<i8>>,
    /// Per KV head, `ceil(n_pos / 16)` blocks of `[head_dim / 32][16]` key scales.
    ks: Vec<Vec<f16>>,
    /// Per KV head, `n_pos × head_dim` int8 values.
    v: Vec<Vec<i8>>,
    /// Per KV head, `n_pos × head_dim / 32` value scales.
    vs: Vec<Vec<f16>>,
}

impl Q8KvLayer {
    /// An empty cache for `n_kv` heads of `head_dim`, or `None` when `head_dim` is not a
    /// multiple of [`Q8_BLOCK`] (the caller refuses the cache type with that rule).
    pub fn new(n_kv: usize, head_dim: usize) -> Option<Q8KvLayer> {
        (head_dim % Q8_BLOCK == 0 && head_dim > 0).then(|| Q8KvLayer {
            n_kv,
            hd: head_dim,
            n_pos: 0,
            k: vec![Vec::new(); n_kv],
            ks: vec![Vec::new(); n_kv],
            v: vec![Vec::new(); n_kv],
            vs: vec![Vec::new(); n_kv],
        })
    }

    /// Positions held.
    pub fn n_pos(&self) -> usize {
        self.n_pos
    }

    /// Append one position: `k` and `v` hold every KV head's `head_dim` values.
    ///
    /// # Panics
    /// If `k` or `v` is not `n_kv × head_dim` long (a caller bug: the decoder sizes them).
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        let hd = self.hd;
        assert!(
            k.len() == self.n_kv * hd && v.len() == k.len(),
            "Q8KvLayer::push: k {} / v {} values for {} heads of {hd}",
            k.len(),
            v.len(),
            self.n_kv
        );
        let nb = hd / Q8_BLOCK;
        let (blk, lane) = (self.n_pos / KV_BLOCK, self.n_pos % KV_BLOCK);
        let mut q = [0i8; Q8_BLOCK];
        for h in 0..self.n_kv {
            if lane == 0 {
                self.k[h].resize((blk + 1) * KV_BLOCK * hd, 0);
                self.ks[h].resize((blk + 1) * KV_BLOCK * nb, f16::ZERO);
            }
            let kh = &k[h * hd..(h + 1) * hd];
            for (b, xs) in kh.chunks_exact(Q8_BLOCK).enumerate() {
                let d = quantize_block(xs, &mut q);
                self.ks[h][blk * KV_BLOCK * nb + b * KV_BLOCK + lane] = d;
                for (i, &qi) in q.iter().enumerate() {
                    self.k[h][blk * KV_BLOCK * hd + (b * Q8_BLOCK + i) * KV_BLOCK + lane] = qi;
                }
            }
            for xs in v[h * hd..(h + 1) * hd].chunks_exact(Q8_BLOCK) {
                let d = quantize_block(xs, &mut q);
                self.vs[h].push(d);
                self.v[h].extend_from_slice(&q);
            }
        }
        self.n_pos += 1;
    }

    /// Keep the first `n_pos` positions (no-op if it holds fewer); the state is then exactly
    /// what pushing those positions alone would have left.
    pub fn truncate(&mut self, n_pos: usize) {
        if n_pos >= self.n_pos {
            return;
        }
        let (hd, nb) = (self.hd, self.hd / Q8_BLOCK);
        let blocks = n_pos.div_ceil(KV_BLOCK);
        let lane = n_pos % KV_BLOCK;
        for h in 0..self.n_kv {
            self.k[h].truncate(blocks * KV_BLOCK * hd);
            self.ks[h].truncate(blocks * KV_BLOCK * nb);
            if lane != 0 {
                let (k0, s0) = ((blocks - 1) * KV_BLOCK * hd, (blocks - 1) * KV_BLOCK * nb);
                for d in 0..hd {
                    self.k[h][k0 + d * KV_BLOCK + lane..k0 + (d + 1) * KV_BLOCK].fill(0);
                }
                for b in 0..nb {
                    self.ks[h][s0 + b * KV_BLOCK + lane..s0 + (b + 1) * KV_BLOCK].fill(f16::ZERO);
                }
            }
            self.v[h].truncate(n_pos * hd);
            self.vs[h].truncate(n_pos * nb);
        }
        self.n_pos = n_pos;
    }

    /// Key `d` of head `h` at position `t`, dequantised (f32).
    fn key(&self, h: usize, t: usize, d: usize) -> f32 {
        let (hd, nb) = (self.hd, self.hd / Q8_BLOCK);
        let blk = t / KV_BLOCK;
        let q = self.k[h][blk * KV_BLOCK * hd + d * KV_BLOCK + t % KV_BLOCK];
        let s = self.ks[h][blk * KV_BLOCK * nb + (d / Q8_BLOCK) * KV_BLOCK + t % KV_BLOCK];
        f32::from(q) * s.to_f32()
    }

    /// Value `d` of head `h` at position `t`, dequantised (f32).
    fn value(&self, h: usize, t: usize, d: usize) -> f32 {
        let hd = self.hd;
        let q = self.v[h][t * hd + d];
        let s = self.vs[h][t * (hd / Q8_BLOCK) + d / Q8_BLOCK];
        f32::from(q) * s.to_f32()
    }

    /// Positions `t0..t1` of head `h`, dequantised and rounded to f16, as the one head of
    /// `out` (`t1 − t0` positions afterwards): what the f16 attention kernels read. `t0` must be
    /// a multiple of [`KV_BLOCK`] so the positions keep their lanes; `scratch` holds the f32
    /// values on the way (reused between calls). The keys' blocks and the values' rows are
    /// contiguous runs in both layouts, so each is one pass the compiler vectorises, and the
    /// f16 rounding one slice conversion.
    ///
    /// # Panics
    /// If `h`, `t0..t1` or `out`'s shape (1 head of this `head_dim`) is out of range.
    pub fn dequantize_into(
        &self,
        h: usize,
        (t0, t1): (usize, usize),
        out: &mut KvLayer,
        scratch: &mut (Vec<f32>, Vec<f32>),
    ) {
        assert!(
            h < self.n_kv
                && t0 % KV_BLOCK == 0
                && t0 <= t1
                && t1 <= self.n_pos
                && out.n_kv() == 1
                && out.head_dim() == self.hd,
            "Q8KvLayer::dequantize_into: head {h}, positions {t0}..{t1} of {}",
            self.n_pos
        );
        let (hd, nb) = (self.hd, self.hd / Q8_BLOCK);
        let (b0, b1) = (t0 / KV_BLOCK, t1.div_ceil(KV_BLOCK));
        let (kf, vf) = scratch;
        kf.clear();
        kf.resize((b1 - b0) * KV_BLOCK * hd, 0.0);
        for (bi, blk) in (b0..b1).enumerate() {
            let q = &self.k[h][blk * KV_BLOCK * hd..(blk + 1) * KV_BLOCK * hd];
            let sc = &self.ks[h][blk * KV_BLOCK * nb..(blk + 1) * KV_BLOCK * nb];
            let o = &mut kf[bi * KV_BLOCK * hd..(bi + 1) * KV_BLOCK * hd];
            for g in 0..nb {
                let mut s = [0f32; KV_BLOCK];
                for (x, y) in s.iter_mut().zip(&sc[g * KV_BLOCK..(g + 1) * KV_BLOCK]) {
                    *x = y.to_f32();
                }
                let span = g * Q8_BLOCK * KV_BLOCK..(g + 1) * Q8_BLOCK * KV_BLOCK;
                for (or, qr) in o[span.clone()]
                    .chunks_exact_mut(KV_BLOCK)
                    .zip(q[span].chunks_exact(KV_BLOCK))
                {
                    for ((x, &qi), &si) in or.iter_mut().zip(qr).zip(&s) {
                        *x = f32::from(qi) * si;
                    }
                }
            }
        }
        vf.clear();
        vf.resize((t1 - t0) * hd, 0.0);
        let q = &self.v[h][t0 * hd..t1 * hd];
        let sc = &self.vs[h][t0 * nb..t1 * nb];
        for ((or, qr), s) in vf
            .chunks_exact_mut(Q8_BLOCK)
            .zip(q.chunks_exact(Q8_BLOCK))
            .zip(sc)
        {
            let s = s.to_f32();
            for (x, &qi) in or.iter_mut().zip(qr) {
                *x = f32::from(qi) * s;
            }
        }
        out.set_from_f32(t1 - t0, kf, vf);
    }

    /// Every key and value, dequantised (f32), head by head: keys of every position, then
    /// values (tests compare it with the f32 inputs).
    pub fn dequantized(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(2 * self.n_kv * self.n_pos * self.hd);
        for h in 0..self.n_kv {
            for t in 0..self.n_pos {
                out.extend((0..self.hd).map(|d| self.key(h, t, d)));
            }
        }
        for h in 0..self.n_kv {
            for t in 0..self.n_pos {
                out.extend((0..self.hd).map(|d| self.value(h, t, d)));
            }
        }
        out
    }

    /// Bit patterns of everything stored (keys and their scales, then values and theirs), for
    /// exact comparisons of two caches.
    pub fn bits(&self) -> Vec<u16> {
        let q = |c: &Vec<i8>| c.iter().map(|&x| u16::from(x as u8)).collect::<Vec<_>>();
        let s = |c: &Vec<f16>| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut out = Vec::new();
        for h in 0..self.n_kv {
            out.extend(q(&self.k[h]));
            out.extend(s(&self.ks[h]));
        }
        for h in 0..self.n_kv {
            out.extend(q(&self.v[h]));
            out.extend(s(&self.vs[h]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| r.random_range(-1.0f32..1.0) * (1.0 + (i % 7) as f32))
            .collect()
    }

    #[test]
    fn values_round_trip_within_half_a_step_of_their_block() {
        let (n_kv, hd) = (3, 64);
        let mut c = Q8KvLayer::new(n_kv, hd).expect("head_dim 64");
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for t in 0..37 {
            let (k, v) = (random(n_kv * hd, t), random(n_kv * hd, 1000 + t));
            c.push(&k, &v);
            ks.push(k);
            vs.push(v);
        }
        let got = c.dequantized();
        let mut i = 0;
        for (src, _) in [(&ks, 0), (&vs, 1)] {
            for h in 0..n_kv {
                for row in src.iter() {
                    let x = &row[h * hd..(h + 1) * hd];
                    for blk in x.chunks_exact(Q8_BLOCK) {
                        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                        // Half a quantisation step, plus the f16 rounding of the scale.
                        let bound = amax / 127.0 * 0.5 + amax * 2e-3;
                        for &want in blk {
                            let err = (got[i] - want).abs();
                            assert!(
                                err <= bound,
                                "value {i}: {} vs {want} (bound {bound})",
                                got[i]
                            );
                            i += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(i, got.len());
    }

    #[test]
    fn truncate_equals_pushing_less_and_dequantize_matches_the_values() {
        let (n_kv, hd) = (2, 32);
        let rows: Vec<(Vec<f32>, Vec<f32>)> = (0..40)
            .map(|t| (random(n_kv * hd, 7 + t), random(n_kv * hd, 500 + t)))
            .collect();
        for keep in [0, 1, 15, 16, 17, 33] {
            let mut a = Q8KvLayer::new(n_kv, hd).expect("32");
            let mut b = Q8KvLayer::new(n_kv, hd).expect("32");
            for (k, v) in &rows {
                a.push(k, v);
            }
            a.truncate(keep);
            for (k, v) in &rows[..keep] {
                b.push(k, v);
            }
            assert_eq!(a.bits(), b.bits(), "keep {keep}");
            assert_eq!(a.n_pos(), keep);
        }
        let mut c = Q8KvLayer::new(n_kv, hd).expect("32");
        for (k, v) in &rows {
            c.push(k, v);
        }
        let mut out = KvLayer::new(1, hd);
        let mut scratch = (Vec::new(), Vec::new());
        c.dequantize_into(1, (16, 39), &mut out, &mut scratch);
        assert_eq!(out.n_pos(), 23);
        for t in 16..39 {
            for d in 0..hd {
                assert_eq!(out.key(0, t - 16, d), f16::from_f32(c.key(1, t, d)));
                assert_eq!(out.value_row(0, t - 16)[d], f16::from_f32(c.value(1, t, d)));
            }
        }
    }

    #[test]
    fn head_dims_off_the_block_are_refused() {
        assert!(Q8KvLayer::new(2, 48).is_none());
        assert!(Q8KvLayer::new(2, 0).is_none());
        assert!(Q8KvLayer::new(2, 96).is_some());
    }
}
