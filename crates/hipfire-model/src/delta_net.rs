//! Gated DeltaNet on the host: a sequence's recurrent state and the layer's arithmetic between
//! its projections (llama.cpp `build_layer_attn_linear` + `build_delta_net_autoregressive`,
//! the semantics [`crate::DeltaNetConfig`] states).
//!
//! A step reads the committed state ([`LayerState::front`]) and writes the next one into the
//! back buffer; [`LayerState::commit`] swaps them once the whole step succeeded. So a failed
//! step leaves the sequence where it was (a recurrent state, unlike a KV cache, cannot be
//! truncated back), at no copy: the first token of a step reads the front and writes the back,
//! the later ones update the back in place.
//!
//! Tokens of a sequence are applied one after the other (the state of 2 MiB a layer for
//! Qwen3.5's 32 heads of 128 stays in the caches of the thread that owns a head); the heads are
//! independent and split over the pool.

use crate::config::DeltaNetConfig;
use crate::ops;

/// One layer's recurrent state of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaNetState {
    /// The conv's last `conv_kernel − 1` inputs, oldest first (`conv_dim` values each).
    pub conv: Vec<f32>,
    /// Per value head, the `head_dim × head_dim` matrix `S[value][key]` (key contiguous, as
    /// ggml lays it out).
    pub s: Vec<f32>,
}

impl DeltaNetState {
    /// The state of an empty sequence (all zeros), shaped by `c`.
    pub fn new(c: &DeltaNetConfig) -> DeltaNetState {
        DeltaNetState {
            conv: vec![0.0; (c.conv_kernel - 1) * c.conv_dim()],
            s: vec![0.0; c.n_v_heads * c.head_dim * c.head_dim],
        }
    }

    /// Back to the empty sequence's state.
    pub fn clear(&mut self) {
        self.conv.fill(0.0);
        self.s.fill(0.0);
    }
}

/// A layer's state, double-buffered (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct LayerState {
    front: DeltaNetState,
    back: DeltaNetState,
}

impl LayerState {
    pub(crate) fn new(c: &DeltaNetConfig) -> LayerState {
        LayerState {
            front: DeltaNetState::new(c),
            back: DeltaNetState::new(c),
        }
    }

    /// The committed state.
    pub(crate) fn front(&self) -> &DeltaNetState {
        &self.front
    }

    /// Replace the committed state.
    pub(crate) fn set_front(&mut self, s: &DeltaNetState) {
        self.front.conv.copy_from_slice(&s.conv);
        self.front.s.copy_from_slice(&s.s);
    }

    /// The committed state and the buffer a step writes.
    pub(crate) fn split(&mut self) -> (&DeltaNetState, &mut DeltaNetState) {
        (&self.front, &mut self.back)
    }

    /// Make the step's result the committed state.
    pub(crate) fn commit(&mut self) {
        std::mem::swap(&mut self.front, &mut self.back);
    }

    pub(crate) fn clear(&mut self) {
        self.front.clear();
    }
}

/// A layer's per-head parameters, borrowed from its tensors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params<'a> {
    /// `conv_kernel` taps per channel, channel-major.
    pub conv: &'a [f32],
    /// Added to alpha before the softplus, per value head.
    pub dt_bias: &'a [f32],
    /// `−exp(A_log)` per value head.
    pub a: &'a [f32],
}

/// Above this `softplus(x) = x` in f32 (ggml's `ggml_softplus` threshold): `ln(1 + e^20)`
/// differs from 20 by 2e-9.
const SOFTPLUS_LINEAR_ABOVE: f32 = 20.0;

/// `ln(1 + e^x)`.
pub(crate) fn softplus(x: f32) -> f32 {
    if x > SOFTPLUS_LINEAR_ABOVE {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `x / max(‖x‖₂, eps)` in place (ggml's `ggml_l2_norm`).
fn l2_norm(x: &mut [f32], eps: f32) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let scale = 1.0 / sum.sqrt().max(eps);
    x.iter_mut().for_each(|v| *v *= scale);
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The causal depthwise conv + SiLU of `t` tokens' `qkv` rows (`conv_dim` each) after the
/// window `src.conv`, into `out` (`t × conv_dim`); the new window (the last `conv_kernel − 1`
/// inputs) into `dst_conv`.
pub(crate) fn conv(
    c: &DeltaNetConfig,
    taps: &[f32],
    window: &[f32],
    qkv: &[f32],
    out: &mut [f32],
    dst_conv: &mut [f32],
) {
    let (cd, kk) = (c.conv_dim(), c.conv_kernel);
    let w = kk - 1;
    let t = qkv.len() / cd;
    // Row r of the conv's input: the window's rows, then the new tokens'.
    let row = |r: usize| -> &[f32] {
        if r < w {
            &window[r * cd..(r + 1) * cd]
        } else {
            &qkv[(r - w) * cd..(r - w + 1) * cd]
        }
    };
    for (ti, o) in out.chunks_exact_mut(cd).enumerate() {
        for (ch, oc) in o.iter_mut().enumerate() {
            let tap = &taps[ch * kk..(ch + 1) * kk];
            let mut acc = 0f32;
            for (j, &wj) in tap.iter().enumerate() {
                acc += row(ti + j)[ch] * wj;
            }
            *oc = silu(acc);
        }
    }
    for (r, dst) in dst_conv.chunks_exact_mut(cd).enumerate() {
        dst.copy_from_slice(row(t + r));
    }
}

/// The per-token inputs of the recurrence after the conv: q and k L2-normalised per key head
/// (q also scaled by `1/√head_dim`), and per value head the write strength `β = σ(beta)` and
/// the log-decay `g = softplus(alpha + dt_bias) · a`. `conv_out` (`t × conv_dim`) is normalised
/// in place; `beta` and `alpha` (`t × n_v_heads` each) become β and g.
pub(crate) fn prepare(
    c: &DeltaNetConfig,
    p: &Params<'_>,
    eps: f32,
    conv_out: &mut [f32],
    beta: &mut [f32],
    alpha: &mut [f32],
) {
    let (kd, hd) = (c.key_dim(), c.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    for row in conv_out.chunks_exact_mut(c.conv_dim()) {
        let (q, rest) = row.split_at_mut(kd);
        for h in q.chunks_exact_mut(hd) {
            l2_norm(h, eps);
            h.iter_mut().for_each(|v| *v *= scale);
        }
        for h in rest[..kd].chunks_exact_mut(hd) {
            l2_norm(h, eps);
        }
    }
    beta.iter_mut().for_each(|b| *b = crate::moe::sigmoid(*b));
    for row in alpha.chunks_exact_mut(c.n_v_heads) {
        for ((g, &dt), &a) in row.iter_mut().zip(p.dt_bias).zip(p.a) {
            *g = softplus(*g + dt) * a;
        }
    }
}

/// Value head `h` over `t` tokens: `S ← e^g·S`, `d = β(v − Sᵀk)`, `S ← S + k·dᵀ`, `o = Sᵀq`,
/// reading the state from `src` (the committed one) for the first token and `dst` after, and
/// writing each token's `o` (`head_dim` values) into `o_rows[token]`. `qkv` holds the prepared
/// rows ([`prepare`]), `beta` and `g` `n_v_heads` values a token.
#[allow(clippy::too_many_arguments)]
pub(crate) fn head(
    c: &DeltaNetConfig,
    h: usize,
    qkv: &[f32],
    beta: &[f32],
    g: &[f32],
    src: &[f32],
    dst: &mut [f32],
    o_rows: &mut [&mut [f32]],
) {
    let (hd, kd) = (c.head_dim, c.key_dim());
    let kh = c.key_head(h);
    let mut row = vec![0f32; hd];
    for (ti, o) in o_rows.iter_mut().enumerate() {
        let base = ti * c.conv_dim();
        let q = &qkv[base + kh * hd..base + (kh + 1) * hd];
        let k = &qkv[base + kd + kh * hd..base + kd + (kh + 1) * hd];
        let v = &qkv[base + 2 * kd + h * hd..base + 2 * kd + (h + 1) * hd];
        let (b, decay) = (beta[ti * c.n_v_heads + h], g[ti * c.n_v_heads + h].exp());
        for r in 0..hd {
            let cur = if ti == 0 {
                &src[r * hd..(r + 1) * hd]
            } else {
                &dst[r * hd..(r + 1) * hd]
            };
            row.iter_mut().zip(cur).for_each(|(x, &s)| *x = s * decay);
            let sk = ops::dot(&row, k);
            let d = b * (v[r] - sk);
            let out = &mut dst[r * hd..(r + 1) * hd];
            out.iter_mut()
                .zip(&row)
                .zip(k)
                .for_each(|((x, &s), &kv)| *x = s + kv * d);
            o[r] = ops::dot(out, q);
        }
    }
}

/// The rows of qwen3next's fused `ssm_in` product (`t × (conv_dim + value_dim)`) as the conv's
/// input `qkv` (`t × conv_dim`: every q head, every k head, every v head) and `z`
/// (`t × value_dim`). Per key head the fused row holds that head's q, its k, then the v and z
/// of the `n_v_heads / n_k_heads` value heads it serves (llama.cpp `build_qkvz`'s legacy
/// path: `qkvz_new_dim` per key head, split `head_k_dim, head_k_dim, v, z`).
pub(crate) fn split_qkvz(c: &DeltaNetConfig, fused: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (hd, kd, cd, vd) = (c.head_dim, c.key_dim(), c.conv_dim(), c.value_dim());
    let group = vd / c.n_k_heads;
    let t = fused.len() / (cd + vd);
    let (mut qkv, mut z) = (vec![0f32; t * cd], vec![0f32; t * vd]);
    for ((row, q), zr) in fused
        .chunks_exact(cd + vd)
        .zip(qkv.chunks_exact_mut(cd))
        .zip(z.chunks_exact_mut(vd))
    {
        for (kh, head) in row.chunks_exact(2 * hd + 2 * group).enumerate() {
            let (qk, vz) = head.split_at(2 * hd);
            q[kh * hd..(kh + 1) * hd].copy_from_slice(&qk[..hd]);
            q[kd + kh * hd..kd + (kh + 1) * hd].copy_from_slice(&qk[hd..]);
            let v0 = 2 * kd + kh * group;
            q[v0..v0 + group].copy_from_slice(&vz[..group]);
            zr[kh * group..(kh + 1) * group].copy_from_slice(&vz[group..]);
        }
    }
    (qkv, z)
}

/// The rows of qwen3next's fused `ssm_ba` product (`t × 2·n_v_heads`) as β's logits and α
/// (`t × n_v_heads` each, value heads in order). Per key head the fused row holds the β of the
/// value heads it serves, then their α (llama.cpp reshapes to `2·n_v/n_k` per key head and
/// views the two halves).
pub(crate) fn split_ba(c: &DeltaNetConfig, fused: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let hv = c.n_v_heads;
    let group = hv / c.n_k_heads;
    let t = fused.len() / (2 * hv);
    let (mut beta, mut alpha) = (vec![0f32; t * hv], vec![0f32; t * hv]);
    let heads = fused.chunks_exact(2 * group);
    for ((head, b), a) in heads
        .zip(beta.chunks_exact_mut(group))
        .zip(alpha.chunks_exact_mut(group))
    {
        b.copy_from_slice(&head[..group]);
        a.copy_from_slice(&head[group..]);
    }
    (beta, alpha)
}

/// `o_h = rms_norm(o_h) · w · silu(z_h)` for every value head of every row (`value_dim` each).
pub(crate) fn gated_norm(c: &DeltaNetConfig, w: &[f32], eps: f32, o: &mut [f32], z: &[f32]) {
    for (oh, zh) in o
        .chunks_exact_mut(c.head_dim)
        .zip(z.chunks_exact(c.head_dim))
    {
        ops::rms_norm_inplace(oh, w, eps);
        oh.iter_mut().zip(zh).for_each(|(x, &zz)| *x *= silu(zz));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyHeadShare;

    /// 2 key heads, 6 value heads (3 a key head) of width 2: small enough to write the
    /// layouts out by hand.
    fn config(key_share: KeyHeadShare) -> DeltaNetConfig {
        DeltaNetConfig {
            conv_kernel: 4,
            n_k_heads: 2,
            n_v_heads: 6,
            key_share,
            head_dim: 2,
            recurrent: vec![true],
        }
    }

    #[test]
    fn value_heads_read_key_heads_tiled_or_grouped() {
        let tiled: Vec<usize> = (0..6)
            .map(|h| config(KeyHeadShare::Tiled).key_head(h))
            .collect();
        assert_eq!(tiled, [0, 1, 0, 1, 0, 1]);
        let grouped: Vec<usize> = (0..6)
            .map(|h| config(KeyHeadShare::Grouped).key_head(h))
            .collect();
        assert_eq!(grouped, [0, 0, 0, 1, 1, 1]);
    }

    /// Each fused value names where it must land (`100·part + index`), written per key head
    /// as llama.cpp's views read it; two tokens, so a row stride error shows too.
    #[test]
    fn fused_ssm_in_and_ssm_ba_split_into_llama_cpp_layout() {
        let c = config(KeyHeadShare::Grouped);
        let (q, k, v, z) = (0.0, 100.0, 200.0, 300.0);
        let mut fused = vec![];
        for token in [0.0, 1000.0] {
            for kh in 0..2 {
                let at = |base: f32, i: usize| base + token + i as f32;
                fused.extend((0..2).map(|i| at(q, kh * 2 + i)));
                fused.extend((0..2).map(|i| at(k, kh * 2 + i)));
                fused.extend((0..6).map(|i| at(v, kh * 6 + i)));
                fused.extend((0..6).map(|i| at(z, kh * 6 + i)));
            }
        }
        let (qkv, zs) = split_qkvz(&c, &fused);
        let want_row = |token: f32, parts: &[(f32, usize)]| -> Vec<f32> {
            parts
                .iter()
                .flat_map(|&(base, n)| (0..n).map(move |i| base + token + i as f32))
                .collect()
        };
        let want_qkv = [0.0, 1000.0]
            .map(|t| want_row(t, &[(q, 4), (k, 4), (v, 12)]))
            .concat();
        assert_eq!(qkv, want_qkv);
        assert_eq!(zs, [0.0, 1000.0].map(|t| want_row(t, &[(z, 12)])).concat());

        let (b, a) = (0.0, 100.0);
        let mut ba = vec![];
        for token in [0.0, 1000.0] {
            for kh in 0..2 {
                ba.extend((0..3).map(|j| b + token + (kh * 3 + j) as f32));
                ba.extend((0..3).map(|j| a + token + (kh * 3 + j) as f32));
            }
        }
        let (beta, alpha) = split_ba(&c, &ba);
        assert_eq!(beta, [0.0, 1000.0].map(|t| want_row(t, &[(b, 6)])).concat());
        assert_eq!(
            alpha,
            [0.0, 1000.0].map(|t| want_row(t, &[(a, 6)])).concat()
        );
    }
}
