//! Decode of tiny synthetic llama / qwen2 / qwen3 / MoE / hybrid / gpt-oss models against an
//! independent f64 forward pass written here from the architectures' definitions (HF
//! `modeling_llama.py`, `modeling_qwen2.py`, `modeling_qwen3.py`, `modeling_gpt_oss.py`, with
//! llama.cpp's RoPE pairing per arch). The reference stores its K/V cache rounded to f16, the
//! decoder's storage type.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use hipfire_model::gguf::GgufFile;
use hipfire_model::{write_synthetic, Arch, LoadOptions, Model, SynthSpec, SYNTH_DESCRIPTION};
use hipfire_quant::Format;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hipfire-synth-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Every tensor of the file dequantised to f64, by name.
fn tensor(f: &GgufFile, name: &str) -> Option<(Vec<f64>, usize)> {
    let (t, bytes) = f.tensor(name).ok()?;
    let fmt = Format::from_ggml_type(t.ggml_type.0).unwrap();
    let k = t.row_len() as usize;
    let rows = t.n_rows() as usize;
    let rb = fmt.row_bytes(k).unwrap();
    let mut out = vec![0f64; k * rows];
    for r in 0..rows {
        hipfire_quant::dequantize_row_f64(
            fmt,
            &bytes[r * rb..(r + 1) * rb],
            &mut out[r * k..(r + 1) * k],
        )
        .unwrap();
    }
    Some((out, k))
}

fn matvec(w: &(Vec<f64>, usize), x: &[f64]) -> Vec<f64> {
    w.0.chunks_exact(w.1)
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let s = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v / s * g).collect()
}

/// A dequantised matrix (values, row length).
type Mat = (Vec<f64>, usize);

/// HF `GptOssExperts`' activation: `g·σ(1.702·g)·(u + 1)`, `g = min(gate, 7)`,
/// `u = clamp(up, −7, 7)`.
fn swiglu_oai(gate: f64, up: f64) -> f64 {
    let (g, u) = (gate.min(7.0), up.clamp(-7.0, 7.0));
    g / (1.0 + (-1.702 * g).exp()) * (u + 1.0)
}

/// SiLU-gated: `silu(gate) · up`.
fn silu_glu(gate: f64, up: f64) -> f64 {
    gate / (1.0 + (-gate).exp()) * up
}

/// A biased expert: `down · act(gate · x + b_g, up · x + b_u) + b_d`; `b` holds the
/// expert's (gate, up, down) biases.
fn biased_expert(w: [&Mat; 3], b: [&[f64]; 3], act: fn(f64, f64) -> f64, x: &[f64]) -> Vec<f64> {
    let add = |mut v: Vec<f64>, b: &[f64]| {
        v.iter_mut().zip(b).for_each(|(y, c)| *y += c);
        v
    };
    let (gt, u) = (add(matvec(w[0], x), b[0]), add(matvec(w[1], x), b[1]));
    let h: Vec<f64> = gt.iter().zip(&u).map(|(&a, &c)| act(a, c)).collect();
    add(matvec(w[2], &h), b[2])
}

/// gpt-oss's routed FFN (HF `GptOssTopKRouter` + `GptOssExperts`): router logits plus bias,
/// the top k logits (ties to the lower index), a softmax over those k, the weighted sum of the
/// chosen experts.
fn gpt_oss_moe(
    g: &dyn Fn(&str) -> Option<Mat>,
    moe: &hipfire_model::SynthMoe,
    x: &[f64],
    ab: Ablate,
) -> Vec<f64> {
    let keep = if ab.moe_biases { 0.0 } else { 1.0 };
    let bias = g("ffn_gate_inp.bias").unwrap().0;
    let logits: Vec<f64> = matvec(&g("ffn_gate_inp.weight").unwrap(), x)
        .iter()
        .zip(&bias)
        .map(|(a, b)| a + keep * b)
        .collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
    let top = &order[..moe.n_expert_used];
    // Over the k chosen; the ablation's softmax over all then renormalised over the k is the
    // same, so it stands for "a softmax over every expert, not renormalised" instead.
    let z: f64 = match ab.gating {
        false => top
            .iter()
            .map(|&i| (logits[i] - logits[top[0]]).exp())
            .sum(),
        true => logits.iter().map(|&l| (l - logits[top[0]]).exp()).sum(),
    };
    let (d, ff) = (x.len(), moe.n_ff_exp);
    let w = ["gate", "up", "down"].map(|p| g(&format!("ffn_{p}_exps.weight")).unwrap());
    let b = ["gate", "up", "down"].map(|p| g(&format!("ffn_{p}_exps.bias")).unwrap());
    let mut out = vec![0f64; d];
    for &i in top {
        let ws = [
            expert(&w[0], i, ff),
            expert(&w[1], i, ff),
            expert(&w[2], i, d),
        ];
        let bs = [0, 1, 2].map(|j| {
            expert(&b[j], i, 1)
                .0
                .iter()
                .map(|v| keep * v)
                .collect::<Vec<_>>()
        });
        let act = match ab.activation {
            false => swiglu_oai,
            true => silu_glu,
        };
        let y = biased_expert([&ws[0], &ws[1], &ws[2]], [&bs[0], &bs[1], &bs[2]], act, x);
        let p = (logits[i] - logits[top[0]]).exp() / z;
        out.iter_mut().zip(&y).for_each(|(o, v)| *o += p * v);
    }
    out
}

/// `down · (silu(gate · x) ⊙ up · x)`.
fn swiglu_ffn(
    gate: &(Vec<f64>, usize),
    up: &(Vec<f64>, usize),
    down: &(Vec<f64>, usize),
    x: &[f64],
) -> Vec<f64> {
    let gt = matvec(gate, x);
    let u = matvec(up, x);
    let h: Vec<f64> = gt
        .iter()
        .zip(&u)
        .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
        .collect();
    matvec(down, &h)
}

/// Expert `e`'s matrix (`m` rows) out of a stacked `ffn_*_exps` tensor.
fn expert(w: &(Vec<f64>, usize), e: usize, m: usize) -> (Vec<f64>, usize) {
    let k = w.1;
    (w.0[e * m * k..(e + 1) * m * k].to_vec(), k)
}

/// Tokens (of any GLM reference run) whose experts chosen by score + selection bias differ
/// from the top k of the scores alone: the GLM tests require some, so that choosing by the
/// biased scores and weighing by the unbiased ones is exercised.
static REORDERED_BY_BIAS: AtomicUsize = AtomicUsize::new(0);

/// The top `k` of `v`, ties to the lower index (torch.topk's CPU sort).
fn top_k(v: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap().then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// The routed FFN from the architectures' definitions (HF `Qwen3MoeSparseMoeBlock`,
/// `Qwen2MoeSparseMoeBlock`, `MixtralSparseMoeBlock`, `Glm4MoeMoE`): softmax of the router
/// over all experts, the top k, renormalised where the model does (Qwen3-MoE, Mixtral),
/// weighted sum of the chosen experts' SwiGLU FFNs; Qwen2-MoE adds `sigmoid(w_shexp · x)`
/// times the shared expert. GLM-4.5 (`Glm4MoeTopkRouter`): sigmoid scores, the top k of
/// scores + `e_score_correction_bias`, weights the chosen scores over their sum (+1e-20) times
/// `routed_scaling_factor`, and its shared expert added ungated.
fn moe_ffn(
    g: &dyn Fn(&str) -> Option<Mat>,
    moe: &hipfire_model::SynthMoe,
    renormalise: bool,
    x: &[f64],
) -> Vec<f64> {
    let logits = matvec(&g("ffn_gate_inp.weight").unwrap(), x);
    let (p, top, scale) = match &moe.glm {
        None => {
            let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|v| v / z).collect();
            let top = top_k(&p, moe.n_expert_used);
            (p, top, 1.0)
        }
        Some(glm) => {
            let p: Vec<f64> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
            let bias = g("exp_probs_b.bias").unwrap().0;
            let choice: Vec<f64> = p.iter().zip(&bias).map(|(a, b)| a + b).collect();
            let top = top_k(&choice, moe.n_expert_used);
            let (mut a, mut b) = (top.clone(), top_k(&p, moe.n_expert_used));
            a.sort_unstable();
            b.sort_unstable();
            if a != b {
                REORDERED_BY_BIAS.fetch_add(1, Ordering::Relaxed);
            }
            (p, top, f64::from(glm.weights_scale))
        }
    };
    let top = &top[..];
    let norm = match renormalise {
        true => top.iter().map(|&i| p[i]).sum::<f64>() + 1e-20,
        // Qwen2-MoE keeps the softmax weights as they are (`norm_topk_prob = false`).
        false => 1.0,
    };
    let ff = moe.n_ff_exp;
    // Expert `i`'s gate and up: its slabs of the two tensors, or of the fused one its first
    // `ff` rows and its last `ff` (llama.cpp `build_moe_ffn`'s views of `ffn_gate_up_exps`).
    let gate_up = |i: usize| -> (Mat, Mat) {
        match moe.fused_gate_up {
            false => (
                expert(&g("ffn_gate_exps.weight").unwrap(), i, ff),
                expert(&g("ffn_up_exps.weight").unwrap(), i, ff),
            ),
            true => {
                let (both, k) = expert(&g("ffn_gate_up_exps.weight").unwrap(), i, 2 * ff);
                let (gate, up) = both.split_at(ff * k);
                ((gate.to_vec(), k), (up.to_vec(), k))
            }
        }
    };
    let down = g("ffn_down_exps.weight").unwrap();
    let d = x.len();
    let mut out = vec![0f64; d];
    for &i in top {
        let (gate, up) = gate_up(i);
        let y = swiglu_ffn(&gate, &up, &expert(&down, i, d), x);
        out.iter_mut()
            .zip(&y)
            .for_each(|(o, v)| *o += p[i] / norm * scale * v);
    }
    if moe.n_ff_shared.is_some() {
        let gate = match g("ffn_gate_inp_shexp.weight") {
            Some(w) => {
                let s: f64 = w.0.iter().zip(x).map(|(a, b)| a * b).sum();
                1.0 / (1.0 + (-s).exp())
            }
            None => 1.0,
        };
        let y = swiglu_ffn(
            &g("ffn_gate_shexp.weight").unwrap(),
            &g("ffn_up_shexp.weight").unwrap(),
            &g("ffn_down_shexp.weight").unwrap(),
            x,
        );
        out.iter_mut().zip(&y).for_each(|(o, v)| *o += gate * v);
    }
    out
}

/// `x += ffn(rms_norm(x) · w_norm)`: layer `l`'s dense or routed FFN (GLM-4.5's leading
/// layers are dense).
fn ffn_residual(
    g: &dyn Fn(&str) -> Option<Mat>,
    s: &SynthSpec,
    l: usize,
    norm: &str,
    x: &mut [f64],
    eps: f64,
    ab: Ablate,
) {
    let xn = rms(x, &g(norm).unwrap().0, eps);
    let routed = s
        .moe
        .as_ref()
        .filter(|m| l >= m.glm.as_ref().map_or(0, |glm| glm.n_dense_lead));
    let y = match routed {
        None => swiglu_ffn(
            &g("ffn_gate.weight").unwrap(),
            &g("ffn_up.weight").unwrap(),
            &g("ffn_down.weight").unwrap(),
            &xn,
        ),
        Some(moe) if s.arch == Arch::GptOss => gpt_oss_moe(g, moe, &xn, ab),
        Some(moe) => moe_ffn(g, moe, s.arch != Arch::Qwen2Moe, &xn),
    };
    x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
}

/// One sequence's DeltaNet state in f64: the conv's past inputs and each value head's
/// `S[value][key]`.
#[derive(Default)]
struct DeltaNetRef {
    window: Vec<Vec<f64>>,
    s: Vec<Vec<Vec<f64>>>,
}

/// A Gated DeltaNet layer over one token, from the definition (HF `Qwen3NextGatedDeltaNet`
/// with llama.cpp's tensor layout: `ssm_a` = −exp(A_log); value head `h` reads key head
/// `h mod n_k` for qwen35 (its converter tiles the value heads), `h / (n_v / n_k)` for
/// qwen3next (HF's grouped order)): causal conv + SiLU, L2-normalised q and k, β = σ(b),
/// g = softplus(a + dt)·A, `S ← e^g S`, `S ← S + k (β (v − Sᵀ k))ᵀ`, `o = Sᵀ q / √d`, gated
/// RMSNorm, output projection. qwen3next's fused projections are taken apart as llama.cpp's
/// `build_qkvz` and `build_layer_attn_linear` view them: `ssm_in` per key head `[q, k, v of
/// its value heads, z of its value heads]`, `ssm_ba` per key head `[b of its value heads,
/// a of its value heads]`.
fn delta_net_layer(
    g: &dyn Fn(&str) -> Option<Mat>,
    s: &SynthSpec,
    dn: &hipfire_model::SynthDeltaNet,
    st: &mut DeltaNetRef,
    x: &[f64],
    eps: f64,
) -> Vec<f64> {
    let (hd, nk, nv) = (dn.head_dim, dn.n_k_heads, dn.n_v_heads);
    let (kd, vd) = (nk * hd, nv * hd);
    let cd = 2 * kd + vd;
    let next = s.arch == Arch::Qwen3Next;
    let per_k = nv / nk;
    let (qkv, z) = match dn.fused_qkvz {
        false => (
            matvec(&g("attn_qkv.weight").unwrap(), x),
            matvec(&g("attn_gate.weight").unwrap(), x),
        ),
        true => {
            let fused = matvec(&g("ssm_in.weight").unwrap(), x);
            let (mut q, mut k, mut v, mut z) = (vec![], vec![], vec![], vec![]);
            for head in fused.chunks_exact(2 * hd + 2 * per_k * hd) {
                q.extend_from_slice(&head[..hd]);
                k.extend_from_slice(&head[hd..2 * hd]);
                v.extend_from_slice(&head[2 * hd..2 * hd + per_k * hd]);
                z.extend_from_slice(&head[2 * hd + per_k * hd..]);
            }
            ([q, k, v].concat(), z)
        }
    };
    let (b, a) = match next {
        false => (
            matvec(&g("ssm_beta.weight").unwrap(), x),
            matvec(&g("ssm_alpha.weight").unwrap(), x),
        ),
        true => {
            let ba = matvec(&g("ssm_ba.weight").unwrap(), x);
            let mut b = vec![0f64; nv];
            let mut a = vec![0f64; nv];
            for h in 0..nv {
                let (kh, j) = (h / per_k, h % per_k);
                b[h] = ba[kh * 2 * per_k + j];
                a[h] = ba[kh * 2 * per_k + per_k + j];
            }
            (b, a)
        }
    };
    let taps = g("ssm_conv1d.weight").unwrap().0;
    let (dt, aa) = (g("ssm_dt.bias").unwrap().0, g("ssm_a").unwrap().0);
    let norm_w = g("ssm_norm.weight").unwrap().0;
    if st.window.is_empty() {
        st.window = vec![vec![0.0; cd]; dn.conv_kernel - 1];
        st.s = vec![vec![vec![0.0; hd]; hd]; nv];
    }
    let mut inputs = st.window.clone();
    inputs.push(qkv);
    let conv: Vec<f64> = (0..cd)
        .map(|c| {
            let v: f64 = (0..dn.conv_kernel)
                .map(|j| inputs[j][c] * taps[c * dn.conv_kernel + j])
                .sum();
            v / (1.0 + (-v).exp())
        })
        .collect();
    st.window = inputs[1..].to_vec();
    let l2 = |v: &[f64]| -> Vec<f64> {
        let n = v.iter().map(|a| a * a).sum::<f64>().sqrt().max(eps);
        v.iter().map(|a| a / n).collect()
    };
    let mut o = vec![0f64; vd];
    for h in 0..nv {
        let kh = if next { h / per_k } else { h % nk };
        let q: Vec<f64> = l2(&conv[kh * hd..(kh + 1) * hd])
            .iter()
            .map(|v| v / (hd as f64).sqrt())
            .collect();
        let k = l2(&conv[kd + kh * hd..kd + (kh + 1) * hd]);
        let v = &conv[2 * kd + h * hd..2 * kd + (h + 1) * hd];
        let beta = 1.0 / (1.0 + (-b[h]).exp());
        let sp = |u: f64| if u > 20.0 { u } else { u.exp().ln_1p() };
        let decay = (sp(a[h] + dt[h]) * aa[h]).exp();
        let s = &mut st.s[h];
        for (r, row) in s.iter_mut().enumerate() {
            row.iter_mut().for_each(|e| *e *= decay);
            let sk: f64 = row.iter().zip(&k).map(|(e, kk)| e * kk).sum();
            let d = beta * (v[r] - sk);
            row.iter_mut().zip(&k).for_each(|(e, kk)| *e += kk * d);
            o[h * hd + r] = row.iter().zip(&q).map(|(e, qq)| e * qq).sum();
        }
        let oh = rms(&o[h * hd..(h + 1) * hd], &norm_w, eps);
        for (i, val) in oh.into_iter().enumerate() {
            let zz = z[h * hd + i];
            o[h * hd + i] = val * zz / (1.0 + (-zz).exp());
        }
    }
    matvec(&g("ssm_out.weight").unwrap(), &o)
}

/// Per-pair RoPE frequencies and the cos/sin magnitude: `θ^(−2i/d)`, or with YaRN (the YaRN
/// paper, as HF `_compute_yarn_parameters` with `truncate` and llama.cpp's `rope_yarn`) the
/// blend of that and the interpolated `θ^(−2i/d) / factor` by a linear ramp over the pairs
/// between `⌊d·ln(L/(2π·β_fast))/(2 ln θ)⌋` and `⌈d·ln(L/(2π·β_slow))/(2 ln θ)⌉` (L the
/// original context), and magnitude `1 + 0.1·ln(factor)`.
fn rope_freqs(s: &SynthSpec, rd: usize) -> (Vec<f64>, f64) {
    let base = f64::from(s.rope_theta);
    let plain: Vec<f64> = (0..rd / 2)
        .map(|i| base.powf(-2.0 * i as f64 / rd as f64))
        .collect();
    let rs = &s.rope_scaling;
    if rs.kind != hipfire_model::RopeScalingKind::Yarn {
        return (plain, 1.0);
    }
    let n = rd as f64;
    let corr = |beta: f64| {
        n * (rs.orig_ctx as f64 / (2.0 * std::f64::consts::PI * beta)).ln() / (2.0 * base.ln())
    };
    let low = corr(rs.beta_fast).floor().max(0.0);
    let high = corr(rs.beta_slow).ceil().min(n - 1.0);
    let freqs = plain
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let ramp = ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
            // ramp 0: kept as trained (extrapolated); 1: interpolated.
            f * (1.0 - ramp) + f / rs.factor * ramp
        })
        .collect();
    (freqs, 1.0 + 0.1 * rs.factor.ln())
}

/// gpt-oss features the reference can leave out, for the control that each one changes the
/// logits by far more than the test's bound (so a decoder without it would fail).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ablate {
    /// No attention sinks.
    sinks: bool,
    /// Every layer global.
    window: bool,
    /// Plain RoPE.
    yarn: bool,
    /// Router and expert biases dropped.
    moe_biases: bool,
    /// Softmax over every expert, then the top k renormalised (Qwen3-MoE's gating).
    gating: bool,
    /// Plain SwiGLU in the experts.
    activation: bool,
}

/// Independent forward over `tokens`, returning the last position's logits.
fn reference_logits(f: &GgufFile, s: &SynthSpec, tokens: &[u32]) -> Vec<f64> {
    reference_logits_ablated(f, s, tokens, Ablate::default())
}

/// [`reference_logits`] with the features `ab` names left out.
fn reference_logits_ablated(f: &GgufFile, s: &SynthSpec, tokens: &[u32], ab: Ablate) -> Vec<f64> {
    let (d, hd, nh, nkv) = (s.d_model, s.head_dim, s.n_head, s.n_head_kv);
    let eps = 1e-5;
    let emb = tensor(f, "token_embd.weight").unwrap();
    let neox = s.arch != Arch::Llama;
    // Partial RoPE (Qwen3.5) rotates the first `rd` dims of each head with `rd`'s frequencies.
    let rd = s.rope_dim.unwrap_or(hd);
    let (freqs, mscale) = match ab.yarn {
        false => rope_freqs(s, rd),
        true => rope_freqs(
            &SynthSpec {
                rope_scaling: hipfire_model::RopeScaling::none(s.ctx_len),
                ..s.clone()
            },
            rd,
        ),
    };
    let rope = |v: &mut [f64], pos: usize| {
        for h in v.chunks_exact_mut(hd) {
            for (i, f) in freqs.iter().enumerate() {
                let th = pos as f64 * f;
                let (a, b) = if neox {
                    (i, i + rd / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (h[a], h[b]);
                let (c, sn) = (th.cos() * mscale, th.sin() * mscale);
                h[a] = x0 * c - x1 * sn;
                h[b] = x0 * sn + x1 * c;
            }
        }
    };
    let mut dn_state: Vec<DeltaNetRef> = (0..s.n_layer).map(|_| DeltaNetRef::default()).collect();
    let mut kc: Vec<Vec<Vec<f64>>> = vec![vec![]; s.n_layer];
    let mut vc: Vec<Vec<Vec<f64>>> = vec![vec![]; s.n_layer];
    let mut x = vec![];
    for (pos, &t) in tokens.iter().enumerate() {
        x = emb.0[t as usize * d..(t as usize + 1) * d].to_vec();
        for l in 0..s.n_layer {
            let g = |n: &str| tensor(f, &format!("blk.{l}.{n}"));
            let xn = rms(&x, &g("attn_norm.weight").unwrap().0, eps);
            if let Some(dn) = s.delta_net.as_ref().filter(|dn| (l + 1) % dn.interval != 0) {
                let o = delta_net_layer(&g, s, dn, &mut dn_state[l], &xn, eps);
                x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                ffn_residual(&g, s, l, "post_attention_norm.weight", &mut x, eps, ab);
                continue;
            }
            let qfull = matvec(&g("attn_q.weight").unwrap(), &xn);
            // A hybrid's query rows are `[q_h, gate_h]` per head.
            let gated = s.delta_net.is_some();
            let (mut q, qgate): (Vec<f64>, Vec<f64>) = match gated {
                false => (qfull, vec![]),
                true => (
                    qfull
                        .chunks_exact(2 * hd)
                        .flat_map(|c| c[..hd].to_vec())
                        .collect(),
                    qfull
                        .chunks_exact(2 * hd)
                        .flat_map(|c| c[hd..].to_vec())
                        .collect(),
                ),
            };
            let mut k = matvec(&g("attn_k.weight").unwrap(), &xn);
            let mut v = matvec(&g("attn_v.weight").unwrap(), &xn);
            for (buf, n) in [
                (&mut q, "attn_q.bias"),
                (&mut k, "attn_k.bias"),
                (&mut v, "attn_v.bias"),
            ] {
                if let Some(b) = g(n) {
                    buf.iter_mut().zip(&b.0).for_each(|(y, b)| *y += b);
                }
            }
            for (buf, n) in [
                (&mut q, "attn_q_norm.weight"),
                (&mut k, "attn_k_norm.weight"),
            ] {
                if let Some(w) = g(n) {
                    let normed: Vec<f64> = buf
                        .chunks_exact(hd)
                        .flat_map(|h| rms(h, &w.0, eps))
                        .collect();
                    *buf = normed;
                }
            }
            rope(&mut q, pos);
            rope(&mut k, pos);
            // The cache holds f16, as the decoder's (and llama.cpp's by default) does.
            let f16_round = |v: Vec<f64>| -> Vec<f64> {
                v.into_iter()
                    .map(|x| half::f16::from_f64(x).to_f64())
                    .collect()
            };
            kc[l].push(f16_round(k));
            vc[l].push(f16_round(v));
            let mut att = vec![0f64; nh * hd];
            // gpt-oss's even layers see the last `window` positions (HF `sliding_attention`).
            let first = match s.sliding_window {
                Some(w) if l % 2 == 0 && !ab.window => (pos + 1).saturating_sub(w),
                _ => 0,
            };
            let sinks = g("attn_sinks.weight").filter(|_| !ab.sinks);
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let qh = &q[h * hd..(h + 1) * hd];
                let sc: Vec<f64> = kc[l][first..]
                    .iter()
                    .map(|kt| {
                        qh.iter()
                            .zip(&kt[kvh * hd..(kvh + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                // A sink (gpt-oss) is one more logit in the softmax, with no value.
                let sink = sinks.as_ref().map(|t| t.0[h]);
                let mx = sc
                    .iter()
                    .chain(&sink)
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
                let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |v| (v - mx).exp());
                for (p, vt) in e.iter().zip(&vc[l][first..]) {
                    for i in 0..hd {
                        att[h * hd + i] += p / z * vt[kvh * hd + i];
                    }
                }
            }
            if gated {
                att.iter_mut()
                    .zip(&qgate)
                    .for_each(|(a, g)| *a /= 1.0 + (-g).exp());
            }
            let mut o = matvec(&g("attn_output.weight").unwrap(), &att);
            if let Some(b) = g("attn_output.bias") {
                o.iter_mut().zip(&b.0).for_each(|(y, b)| *y += b);
            }
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            // Qwen3.5, GLM-4.5 and gpt-oss normalise the FFN's input with `post_attention_norm`.
            let norm_name = if gated || matches!(s.arch, Arch::Glm4Moe | Arch::GptOss) {
                "post_attention_norm.weight"
            } else {
                "ffn_norm.weight"
            };
            ffn_residual(&g, s, l, norm_name, &mut x, eps, ab);
        }
    }
    let xn = rms(&x, &tensor(f, "output_norm.weight").unwrap().0, eps);
    let head = tensor(f, "output.weight").unwrap_or_else(|| emb.clone());
    matvec(&head, &xn)
}

fn check(arch: Arch, fmt: Format, rel_bound: f64) {
    check_spec(&SynthSpec::tiny(arch), fmt, rel_bound);
}

/// The prompt a check decodes: longer than the synthetic sliding window where the model has
/// one, so its local layers drop positions.
fn check_tokens(spec: &SynthSpec) -> Vec<u32> {
    match spec.sliding_window {
        None => vec![0u32, 77, 300, 5, 511, 42, 42],
        Some(w) => (0..w + 16)
            .map(|i| ((i * 7919 + 13) % spec.vocab) as u32)
            .collect(),
    }
}

fn check_spec(spec: &SynthSpec, fmt: Format, rel_bound: f64) {
    let (path, got) = decode_synth(spec, fmt, "check");
    let file = GgufFile::open(&path).unwrap();
    let want = reference_logits(&file, spec, &check_tokens(spec));
    let (err, scale) = max_err(&got, &want);
    eprintln!(
        "{} {}: max |logit err| {err:.3e} of max |logit| {scale:.3e}",
        spec.name,
        fmt.name()
    );
    assert!(scale > 1e-3, "degenerate logits");
    assert!(
        err <= rel_bound * scale,
        "{} {}: err {err} > {rel_bound} × {scale}",
        spec.name,
        fmt.name()
    );
    std::fs::remove_file(&path).unwrap();
}

/// (max |got − want|, max |want|).
fn max_err(got: &[f32], want: &[f64]) -> (f64, f64) {
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f64, |a, (g, w)| a.max((f64::from(*g) - w).abs()));
    (err, scale)
}

/// Write `spec` in `fmt` (to a file named after them and `test`, so tests running at once do
/// not share one), load it, and decode [`check_tokens`] (a first prefill, then the rest as a
/// second): the file and the last position's logits.
fn decode_synth(spec: &SynthSpec, fmt: Format, test: &str) -> (PathBuf, Vec<f32>) {
    let path = tmp(&format!("{}-{}-{test}.gguf", spec.name, fmt.name()));
    let rep = write_synthetic(&path, spec, fmt, 42, None).unwrap();
    assert_eq!(rep.bytes, std::fs::metadata(&path).unwrap().len());
    let model = Model::load(
        &path,
        &LoadOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(model.is_synthetic());
    assert!(
        model.placement_summary().starts_with("[SYNTHETIC]"),
        "{}",
        model.placement_summary()
    );
    assert_eq!(
        model.gguf().index().get_str("general.description").unwrap(),
        SYNTH_DESCRIPTION
    );
    let tokens = check_tokens(spec);
    let mut s = model.session();
    // Poison: logits from a previous state must be overwritten.
    s.prefill(&tokens[..1]).unwrap();
    let got = s.prefill(&tokens[1..]).unwrap().to_vec();
    (path, got)
}

// F32 weights: activations stay f32 on both sides, so only summation order differs;
// measured max err 2.3e-7 of max |logit| ≈ 1.1 (2026-11-29), bound 1e-4 relative.
#[test]
fn llama_f32_matches_f64_reference() {
    check(Arch::Llama, Format::F32, 1e-4);
}
#[test]
fn qwen2_f32_matches_f64_reference() {
    check(Arch::Qwen2, Format::F32, 1e-4);
}
#[test]
fn qwen3_f32_matches_f64_reference() {
    check(Arch::Qwen3, Format::F32, 1e-4);
}
// Mixture-of-Experts (routed FFN; Qwen2-MoE's gated shared expert; Mixtral as llama with
// experts), f32 weights: routing sees the same logits to ~1e-7, so the same experts.
#[test]
fn moe_f32_matches_f64_reference() {
    check(Arch::Qwen3Moe, Format::F32, 1e-4);
    check(Arch::Qwen2Moe, Format::F32, 1e-4);
    check_spec(&SynthSpec::tiny_mixtral(), Format::F32, 1e-4);
}
// Qwen3.5 hybrids (3 DeltaNet layers + 1 gated attention layer; the MoE variant with its
// gated shared expert), f32 and quantised: the reference keeps its state in f64.
#[test]
fn hybrid_matches_f64_reference() {
    check(Arch::Qwen35, Format::F32, 1e-4);
    check(Arch::Qwen35Moe, Format::F32, 1e-4);
    check(Arch::Qwen35, Format::Q8_0, 5e-2);
    check(Arch::Qwen35Moe, Format::Q4K, 5e-2);
}
// Qwen3-Next (the same layers in qwen3next's forms: fused `ssm_ba`, value heads sharing the
// key head of their group; older files' fused `ssm_in`) and fused `ffn_gate_up_exps` (the
// experts' gate and up as row halves of one tensor), f32 and quantised, as the hybrids above.
#[test]
fn qwen3next_and_fused_gate_up_match_f64_reference() {
    check(Arch::Qwen3Next, Format::F32, 1e-4);
    check_spec(
        &SynthSpec::tiny(Arch::Qwen3Next).with_ssm_in(),
        Format::F32,
        1e-4,
    );
    check_spec(
        &SynthSpec::tiny(Arch::Qwen3Next).with_fused_gate_up(),
        Format::F32,
        1e-4,
    );
    check_spec(
        &SynthSpec::tiny(Arch::Qwen35Moe).with_fused_gate_up(),
        Format::F32,
        1e-4,
    );
    check(Arch::Qwen3Next, Format::Q8_0, 5e-2);
    check_spec(
        &SynthSpec::tiny(Arch::Qwen3Next)
            .with_ssm_in()
            .with_fused_gate_up(),
        Format::Q4K,
        5e-2,
    );
}
// GLM-4.5 (a dense first layer, two routed ones with sigmoid routing, a selection bias, a
// scale and an ungated shared expert; partial RoPE, q/k/v biases, q/k norms in one layer; a
// NextN block left unread), f32 and quantised, with the bounds of the cases above. Measured
// 2026-12-05: f32 1.6e-7 of max |logit| 1.13, q4_k 1.6e-2 of 1.00; with the selection bias
// left out of the routing the f32 case is off by 0.22.
#[test]
fn glm4moe_matches_f64_reference() {
    check(Arch::Glm4Moe, Format::F32, 1e-4);
    check(Arch::Glm4Moe, Format::Q4K, 5e-2);
    assert!(
        REORDERED_BY_BIAS.load(Ordering::Relaxed) > 0,
        "no token's experts were reordered by the selection bias"
    );
}

// gpt-oss (q/k/v/output biases, attention sinks, even layers over a 24-position window, YaRN
// on every layer, router bias, top-k logits then softmax over the k, biased experts with the
// clamped SwiGLU), f32 and quantised (MXFP4 as gpt-oss's experts ship, Q8_0). f32: both sides
// multiply in f32, hipfire rounds K/V to f16 as the reference does; bound 1e-4 relative as the
// other f32 cases. Quantised: the activation is quantised to 8 bits, bound 5e-2 as below.
#[test]
fn gpt_oss_matches_f64_reference() {
    check(Arch::GptOss, Format::F32, 1e-4);
    check(Arch::GptOss, Format::Mxfp4, 5e-2);
    check(Arch::GptOss, Format::Q8_0, 5e-2);
}

/// The control of [`gpt_oss_matches_f64_reference`]: the f32 model's logits against the
/// reference with each gpt-oss feature left out in turn must miss by far more than that test's
/// bound, so a decoder that skipped any one of them would fail it.
#[test]
fn gpt_oss_reference_without_any_one_feature_is_far_off() {
    let spec = SynthSpec::tiny(Arch::GptOss);
    let (path, got) = decode_synth(&spec, Format::F32, "ablate");
    let file = GgufFile::open(&path).unwrap();
    let tokens = check_tokens(&spec);
    let none = Ablate::default();
    let (err, scale) = max_err(&got, &reference_logits(&file, &spec, &tokens));
    assert!(err <= 1e-4 * scale, "{err} of {scale}");
    for (what, ab) in [
        (
            "sinks",
            Ablate {
                sinks: true,
                ..none
            },
        ),
        (
            "window",
            Ablate {
                window: true,
                ..none
            },
        ),
        ("yarn", Ablate { yarn: true, ..none }),
        (
            "moe biases",
            Ablate {
                moe_biases: true,
                ..none
            },
        ),
        (
            "gating",
            Ablate {
                gating: true,
                ..none
            },
        ),
        (
            "activation",
            Ablate {
                activation: true,
                ..none
            },
        ),
    ] {
        let (off, _) = max_err(&got, &reference_logits_ablated(&file, &spec, &tokens, ab));
        eprintln!("without {what}: max |logit err| {off:.3e} of {scale:.3e}");
        assert!(off > 1e-2 * scale, "without {what}: {off} of {scale}");
    }
    std::fs::remove_file(&path).unwrap();
}

// Quantised experts: as the dense quantised cases below.
#[test]
fn moe_quantised_matches_f64_reference() {
    check(Arch::Qwen3Moe, Format::Q4K, 5e-2);
    check(Arch::Qwen2Moe, Format::Q8_0, 5e-2);
    check_spec(&SynthSpec::tiny_mixtral(), Format::Q4_0, 5e-2);
}
// Quantised weights: the reference uses the same dequantised weights, the pool quantises the
// activation to 8 bits; measured max err 1.7e-2 (q4_k, of max |logit| 1.09) and 1.4e-2 (q8_0,
// of 0.90) on 2026-11-29 (block-pool synth weights), bound 5e-2 relative.
#[test]
fn llama_q4k_matches_f64_reference() {
    check(Arch::Llama, Format::Q4K, 5e-2);
}
#[test]
fn qwen3_q8_0_matches_f64_reference() {
    check(Arch::Qwen3, Format::Q8_0, 5e-2);
}
// The formats llama.cpp's K_M / IQ4 files fall back to load and decode end to end (every
// weight of the file in that format), with the same activation-quantisation bound.
#[test]
fn k_m_fallback_formats_match_f64_reference() {
    for fmt in [
        Format::Q5_0,
        Format::Q5_1,
        Format::Q5K,
        Format::Q3K,
        Format::Q2K,
        Format::Iq4Nl,
        Format::Iq4Xs,
        Format::Mxfp4,
    ] {
        check(Arch::Llama, fmt, 5e-2);
    }
}

#[test]
fn synthetic_vocab_tokenizes_bytes() {
    let spec = SynthSpec::tiny(Arch::Llama);
    let path = tmp("tok.gguf");
    write_synthetic(&path, &spec, Format::Q8_0, 1, None).unwrap();
    let model = Model::load(
        &path,
        &LoadOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let t = model.tokenizer();
    // BOS (id 0) then one token per byte: the byte-level symbol of byte b has id b + 2.
    assert_eq!(
        t.encode("hi!", true).unwrap(),
        vec![
            0,
            2 + u32::from(b'h'),
            2 + u32::from(b'i'),
            2 + u32::from(b'!')
        ]
    );
    assert_eq!(t.decode(&[2 + 0xC3, 2 + 0xA9], false).unwrap(), "é");
    assert!(t.is_eog(1));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn presets_have_the_published_sizes() {
    // Llama-3-8B: 8.03 B parameters (Meta model card).
    let p = SynthSpec::llama3_8b().n_params();
    assert!((8_000_000_000..8_060_000_000).contains(&p), "{p}");
    let q = SynthSpec::qwen_9b().n_params();
    assert!((8_800_000_000..9_300_000_000).contains(&q), "{q}");
    // Qwen3.5-9B: 8.95 B parameters in its Q4_K_M GGUF's metadata (the language model; the
    // vision tower is a separate file).
    let h = SynthSpec::qwen35_9b().n_params();
    assert!((8_800_000_000..9_100_000_000).contains(&h), "{h}");
    // Qwen3-30B-A3B: 30.5 B parameters (Qwen model card).
    let m = SynthSpec::qwen3_30b_a3b().n_params();
    assert!((30_300_000_000..30_700_000_000).contains(&m), "{m}");
    // Qwen3.5-35B-A3B and -0.8B: the names' sizes (the language model without the vision
    // tower, which their GGUFs keep in a separate file).
    let a = SynthSpec::qwen35_35b_a3b().n_params();
    assert!((34_000_000_000..36_000_000_000).contains(&a), "{a}");
    let s = SynthSpec::qwen35_0_8b().n_params();
    assert!((700_000_000..900_000_000).contains(&s), "{s}");
    // Qwen3-Next-80B-A3B: "80B in total", 79B without the embeddings (Qwen model card); the
    // preset has no multi-token-prediction block.
    let n = SynthSpec::qwen3_next_80b_a3b();
    let embeddings = 2 * (n.vocab * n.d_model) as u64;
    let p = n.n_params();
    assert!((79_000_000_000..80_500_000_000).contains(&p), "{p}");
    assert!(
        (78_500_000_000..80_000_000_000).contains(&(p - embeddings)),
        "{p}"
    );
    // GLM-4.5-Air: 106 B parameters in the decoder (zai-org README: "106 billion total"),
    // plus the NextN block (a routed layer and its 2·4096 × 4096 projection, ≈ 2.3 B).
    let g = SynthSpec::glm45_air();
    let nextn = SynthSpec {
        moe: g.moe.clone().map(|m| hipfire_model::SynthMoe {
            glm: m
                .glm
                .clone()
                .map(|glm| hipfire_model::SynthGlm { n_nextn: 0, ..glm }),
            ..m
        }),
        ..g.clone()
    };
    let (all, decoder) = (g.n_params(), nextn.n_params());
    assert!(
        (105_500_000_000..107_500_000_000).contains(&decoder),
        "{decoder}"
    );
    assert!(
        (2_200_000_000..2_500_000_000).contains(&(all - decoder)),
        "{all}"
    );
    // gpt-oss-20b: 20.9 B parameters (OpenAI model card: 21 B total, 3.6 B active).
    let o = SynthSpec::gpt_oss_20b().n_params();
    assert!((20_800_000_000..21_000_000_000).contains(&o), "{o}");
}

/// An edit of a model's metadata and tensor list.
type Edit<'a> = &'a dyn Fn(
    &mut Vec<(String, hipfire_model::gguf::MetaValue)>,
    &mut Vec<hipfire_model::gguf::TensorSpec>,
);

/// `f` rewritten with `edit` applied to its metadata and tensor list (data bytes filled with a
/// constant: only sizes matter to the load checks), then loaded.
fn rewrite(f: &GgufFile, name: &str, edit: Edit<'_>) -> Result<Model, hipfire_model::ModelError> {
    use hipfire_model::gguf::{GgufWriter, TensorSpec};
    let mut meta = f.index().metadata.clone();
    let mut specs: Vec<TensorSpec> = f
        .index()
        .tensors
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: t.ggml_type,
        })
        .collect();
    edit(&mut meta, &mut specs);
    let p = tmp(name);
    let mut w = GgufWriter::new(std::fs::File::create(&p).unwrap(), &meta, &specs).unwrap();
    for s in &specs {
        w.write_data(&vec![0x3c; s.n_bytes().unwrap() as usize])
            .unwrap();
    }
    w.finish().unwrap();
    let r = Model::load(
        &p,
        &LoadOptions {
            threads: 1,
            ..Default::default()
        },
    );
    std::fs::remove_file(&p).unwrap();
    r
}

/// The edit that sets metadata `key` to `v` (adding it where absent).
fn set(
    key: &'static str,
    v: hipfire_model::gguf::MetaValue,
) -> impl Fn(&mut Vec<(String, hipfire_model::gguf::MetaValue)>, &mut Vec<hipfire_model::gguf::TensorSpec>)
{
    move |m, _| match m.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v.clone(),
        None => m.push((key.to_owned(), v.clone())),
    }
}

/// `f` with a copy of tensor `from` added as `to` (a form hipfire does not read) is refused as
/// unsupported, naming `to`.
fn refuses_added_copy(f: &GgufFile, from: &str, to: &str) {
    // A name of its own: the tests calling this run in parallel.
    let file = format!("added-{}.gguf", to.replace('.', "-"));
    let err = rewrite(f, &file, &|_, s| {
        let mut t = s.iter().find(|t| t.name == from).unwrap().clone();
        t.name = to.into();
        s.push(t);
    })
    .unwrap_err();
    let short = to.trim_start_matches("blk.0.").trim_end_matches(".weight");
    assert!(
        matches!(&err, hipfire_model::ModelError::Unsupported(m) if m.contains(short)),
        "{err}"
    );
}

/// `f` with `key` set to `v` is refused with a metadata error naming `key`.
fn refused_by_key(f: &GgufFile, key: &'static str, v: hipfire_model::gguf::MetaValue) {
    use hipfire_model::ModelError;
    // Named by the key: tests refusing other keys run at the same time.
    match rewrite(f, &format!("bad-{key}.gguf"), &set(key, v.clone())) {
        Err(ModelError::BadMetadata { key: k, .. }) => assert_eq!(k, key, "{v:?}"),
        Err(e) => panic!("{key} = {v:?}: wrong error {e}"),
        Ok(_) => panic!("{key} = {v:?}: accepted"),
    }
}

/// Rewrite a tiny model with one tensor changed, and check loading fails with a typed error.
#[test]
fn load_rejects_wrong_models_with_typed_errors() {
    use hipfire_model::gguf::MetaValue;
    use hipfire_model::ModelError;
    let spec = SynthSpec::tiny(Arch::Llama);
    let good = tmp("good.gguf");
    write_synthetic(&good, &spec, Format::Q8_0, 3, None).unwrap();
    let f = GgufFile::open(&good).unwrap();
    let rewrite = |name: &str, edit: Edit<'_>| rewrite(&f, name, edit);
    let err = rewrite("missing.gguf", &|_, s| {
        s.retain(|t| t.name != "blk.1.ffn_up.weight")
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Gguf(hipfire_model::gguf::GgufError::MissingTensor(_))
        ),
        "{err}"
    );
    let err = rewrite("shape.gguf", &|_, s| {
        let t = s
            .iter_mut()
            .find(|t| t.name == "blk.1.attn_k.weight")
            .unwrap();
        t.dims[1] *= 2;
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::Shape { .. }), "{err}");
    // In block 0 the same change disagrees with the metadata, which is checked first and
    // named: the kv head count no longer matches the tensor.
    let err = rewrite("shape0.gguf", &|_, s| {
        let t = s
            .iter_mut()
            .find(|t| t.name == "blk.0.attn_k.weight")
            .unwrap();
        t.dims[1] *= 2;
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::BadMetadata { key, .. } if key == "llama.attention.head_count_kv"),
        "{err}"
    );
    let err = rewrite("arch.gguf", &|m, _| {
        m.iter_mut()
            .find(|(k, _)| k == "general.architecture")
            .unwrap()
            .1 = MetaValue::String("mamba".into());
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
    // A type ggml defines but hipfire does not multiply (IQ2_XXS).
    let err = rewrite("iq2xxs.gguf", &|_, s| {
        s.iter_mut()
            .find(|t| t.name == "blk.0.ffn_gate.weight")
            .unwrap()
            .ggml_type = hipfire_model::gguf::GgmlType(16);
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
    // Sanity: the unedited rewrite loads, and a bad token id is an error, not a panic.
    let m = rewrite("same.gguf", &|_, _| {}).unwrap();
    assert!(matches!(
        m.session().step(10_000),
        Err(ModelError::BadToken { .. })
    ));
    std::fs::remove_file(&good).unwrap();
}

/// Every expert key is bounded before it sizes anything, and a malformed MoE file is refused
/// naming the key or tensor: counts out of range, a count that disagrees with the router, a
/// missing expert tensor, an expert tensor of the wrong shape, the fused gate+up form (which
/// llama.cpp's qwen3moe loader does not take), and experts declared by a dense-only
/// architecture.
#[test]
fn moe_files_with_bad_expert_metadata_are_refused_by_name() {
    use hipfire_model::gguf::{GgufError, MetaValue};
    use hipfire_model::ModelError;
    let good = tmp("moe-good.gguf");
    write_synthetic(
        &good,
        &SynthSpec::tiny(Arch::Qwen3Moe),
        Format::Q8_0,
        3,
        None,
    )
    .unwrap();
    let f = GgufFile::open(&good).unwrap();
    let bad_key = |r: Result<Model, ModelError>| match r {
        Err(ModelError::BadMetadata { key, .. }) => key,
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    for (key, v) in [
        ("qwen3moe.expert_count", MetaValue::U32(1 << 30)),
        ("qwen3moe.expert_count", MetaValue::U32(0)),
        ("qwen3moe.expert_used_count", MetaValue::U32(9)),
        ("qwen3moe.expert_used_count", MetaValue::U32(0)),
        (
            "qwen3moe.expert_feed_forward_length",
            MetaValue::U32(u32::MAX),
        ),
    ] {
        let got = bad_key(rewrite(&f, "moe-key.gguf", &set(key, v.clone())));
        assert_eq!(got, key, "{key} = {v:?}");
    }
    // A count within bounds that disagrees with the router's rows.
    let got = bad_key(rewrite(
        &f,
        "moe-count.gguf",
        &set("qwen3moe.expert_count", MetaValue::U32(4)),
    ));
    assert_eq!(got, "qwen3moe.expert_count");
    let err = rewrite(&f, "moe-missing.gguf", &|_, s| {
        s.retain(|t| t.name != "blk.1.ffn_down_exps.weight")
    })
    .unwrap_err();
    assert!(
        matches!(err, ModelError::Gguf(GgufError::MissingTensor(_))),
        "{err}"
    );
    let err = rewrite(&f, "moe-shape.gguf", &|_, s| {
        let t = s
            .iter_mut()
            .find(|t| t.name == "blk.1.ffn_up_exps.weight")
            .unwrap();
        t.dims[2] = 7;
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::Shape { .. }), "{err}");
    refuses_added_copy(
        &f,
        "blk.0.ffn_up_exps.weight",
        "blk.0.ffn_gate_up_exps.weight",
    );
    // A dense-only architecture declaring experts.
    let dense = tmp("moe-dense.gguf");
    write_synthetic(&dense, &SynthSpec::tiny(Arch::Qwen3), Format::Q8_0, 3, None).unwrap();
    let fd = GgufFile::open(&dense).unwrap();
    let err = rewrite(
        &fd,
        "moe-qwen3.gguf",
        &set("qwen3.expert_count", MetaValue::U32(8)),
    )
    .unwrap_err();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
    // Sanity: the unedited MoE file loads and decodes a token.
    let m = rewrite(&f, "moe-same.gguf", &|_, _| {}).unwrap();
    assert_eq!(m.config().moe.as_ref().map(|c| c.n_expert), Some(8));
    m.session().step(5).unwrap();
    std::fs::remove_file(&good).unwrap();
    std::fs::remove_file(&dense).unwrap();
}

/// A hybrid's `ssm.*` keys are bounded before they size a state and refused by name when they
/// disagree; qwen3next's fused `ssm_ba` in a qwen35 file and a missing DeltaNet tensor are refused.
#[test]
fn hybrid_files_with_bad_ssm_metadata_are_refused_by_name() {
    use hipfire_model::gguf::{GgufError, MetaValue};
    use hipfire_model::ModelError;
    let good = tmp("hybrid-good.gguf");
    write_synthetic(&good, &SynthSpec::tiny(Arch::Qwen35), Format::Q8_0, 3, None).unwrap();
    let f = GgufFile::open(&good).unwrap();
    // A trailing multi-token-prediction block is not a layer (its tensors stay unread).
    let mtp = rewrite(
        &f,
        "hybrid-mtp.gguf",
        &set("qwen35.nextn_predict_layers", MetaValue::U32(1)),
    )
    .unwrap();
    assert_eq!(mtp.config().n_layer, 3);
    for (key, v) in [
        ("qwen35.ssm.conv_kernel", MetaValue::U32(1 << 20)),
        ("qwen35.ssm.conv_kernel", MetaValue::U32(1)),
        ("qwen35.ssm.state_size", MetaValue::U32(0)),
        ("qwen35.ssm.group_count", MetaValue::U32(1 << 30)),
        ("qwen35.ssm.time_step_rank", MetaValue::U32(3)),
        ("qwen35.ssm.inner_size", MetaValue::U32(100)),
        ("qwen35.full_attention_interval", MetaValue::U32(0)),
        ("qwen35.nextn_predict_layers", MetaValue::U32(4)),
    ] {
        refused_by_key(&f, key, v);
    }
    let err = rewrite(&f, "hybrid-missing.gguf", &|_, s| {
        s.retain(|t| t.name != "blk.1.ssm_a")
    })
    .unwrap_err();
    assert!(
        matches!(err, ModelError::Gguf(GgufError::MissingTensor(_))),
        "{err}"
    );
    refuses_added_copy(&f, "blk.0.ssm_beta.weight", "blk.0.ssm_ba.weight");
    // Sanity: the unedited file loads with 3 DeltaNet layers and 1 attention layer.
    let m = rewrite(&f, "hybrid-same.gguf", &|_, _| {}).unwrap();
    assert_eq!(m.config().n_attention_layers(), 1);
    m.session().step(5).unwrap();
    std::fs::remove_file(&good).unwrap();
}

/// qwen3next's fused tensors are shape-checked against the `ssm.*` and expert keys and refused
/// by name when wrong: an `ssm_ba` or `ssm_in` of the wrong width, a fused
/// `ffn_gate_up_exps` whose rows are not twice the expert width, tensors of the other form
/// beside them (which llama.cpp would leave unread), neither projection form; and
/// `attention.recurrent_layers` is bounded by the block count and, when valid, decides which
/// layers are DeltaNet layers.
#[test]
fn qwen3next_files_with_bad_fused_tensors_are_refused_by_name() {
    use hipfire_model::gguf::{GgufError, MetaValue, MetaValueType, TensorSpec};
    use hipfire_model::ModelError;
    let write = |name: &str, spec: &SynthSpec| {
        let p = tmp(name);
        write_synthetic(&p, spec, Format::Q8_0, 3, None).unwrap();
        let f = GgufFile::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    };
    let next = write("next-good.gguf", &SynthSpec::tiny(Arch::Qwen3Next));
    let legacy = write(
        "next-legacy.gguf",
        &SynthSpec::tiny(Arch::Qwen3Next)
            .with_ssm_in()
            .with_fused_gate_up(),
    );
    let widen = |tensor: &'static str, axis: usize, by: u64| {
        move |_: &mut Vec<(String, MetaValue)>, s: &mut Vec<TensorSpec>| {
            s.iter_mut().find(|t| t.name == tensor).unwrap().dims[axis] += by;
        }
    };
    let shape_of = |r: Result<Model, ModelError>| match r {
        Err(ModelError::Shape { name, .. }) => name.to_string(),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    // β/α for 4 value heads are 8 rows; q, k, v, z of 2 key heads and 4 value heads of 64 are
    // 768 rows; each expert's gate and up 2 × 256 rows.
    for (f, tensor, axis, by) in [
        (&next, "blk.0.ssm_ba.weight", 1, 2),
        (&legacy, "blk.1.ssm_in.weight", 1, 64),
        (&legacy, "blk.2.ffn_gate_up_exps.weight", 1, 256),
        (&legacy, "blk.0.ffn_gate_up_exps.weight", 2, 1),
    ] {
        let got = shape_of(rewrite(f, "next-shape.gguf", &widen(tensor, axis, by)));
        assert!(got.contains(tensor), "{tensor}: {got}");
    }
    // The other form's tensors beside the fused ones.
    refuses_added_copy(&next, "blk.0.ssm_ba.weight", "blk.0.ssm_beta.weight");
    refuses_added_copy(&legacy, "blk.0.ssm_out.weight", "blk.0.attn_gate.weight");
    let err = rewrite(&legacy, "next-both-gate-up.gguf", &|_, s| {
        let mut t = s
            .iter()
            .find(|t| t.name == "blk.3.ffn_down_exps.weight")
            .unwrap()
            .clone();
        t.name = "blk.3.ffn_up_exps.weight".into();
        t.dims = vec![256, 256, 8];
        s.push(t);
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::Unsupported(m) if m.contains("ffn_up_exps")),
        "{err}"
    );
    // Neither `attn_qkv` nor `ssm_in`: the current form is named as missing.
    let err = rewrite(&legacy, "next-no-qkv.gguf", &|_, s| {
        s.retain(|t| t.name != "blk.1.ssm_in.weight")
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::Gguf(GgufError::MissingTensor(n)) if n.to_string().contains("blk.1.attn_qkv")),
        "{err}"
    );
    // attention.recurrent_layers: one bool per block, else refused by key.
    const KEY: &str = "qwen3next.attention.recurrent_layers";
    let flags = |v: &[bool]| {
        MetaValue::Array(
            MetaValueType::Bool,
            v.iter().map(|&b| MetaValue::Bool(b)).collect(),
        )
    };
    let set = |v: MetaValue| {
        move |m: &mut Vec<(String, MetaValue)>, _: &mut Vec<TensorSpec>| {
            m.push((KEY.to_owned(), v.clone()))
        }
    };
    for v in [
        flags(&[true, true, true]),
        MetaValue::Array(MetaValueType::U32, vec![MetaValue::U32(1); 4]),
        MetaValue::Bool(true),
    ] {
        match rewrite(&next, "next-recurrent.gguf", &set(v.clone())) {
            Err(ModelError::BadMetadata { key, .. }) => assert_eq!(key, KEY, "{v:?}"),
            Err(e) => panic!("{v:?}: wrong error {e}"),
            Ok(_) => panic!("{v:?}: accepted"),
        }
    }
    // The flags are read: the file's own layout loads, another one misses layer 1's attention.
    let same = rewrite(
        &next,
        "next-recurrent-same.gguf",
        &set(flags(&[true, true, true, false])),
    )
    .unwrap();
    assert_eq!(same.config().n_attention_layers(), 1);
    let err = rewrite(
        &next,
        "next-recurrent-moved.gguf",
        &set(flags(&[true, false, true, false])),
    )
    .unwrap_err();
    // Layer 1 is read as attention, and its DeltaNet tensors lack the q/k norms it needs.
    let msg = err.to_string();
    assert!(msg.contains("layer 1 lacks q/k norms"), "{msg}");
    // Sanity: both unedited files load and decode a token.
    for f in [&next, &legacy] {
        let m = rewrite(f, "next-same.gguf", &|_, _| {}).unwrap();
        assert_eq!(m.config().arch, Arch::Qwen3Next);
        m.session().step(5).unwrap();
    }
}

/// A GLM-4.5 file's keys are bounded and refused by name: more leading dense layers than
/// decoder blocks, a gating id that is no gating function (by key) or one hipfire does not run
/// (unsupported), a scale out of range, shared experts out of range, group-limited routing,
/// M-RoPE sections; a selection bias of the wrong length or missing, by tensor. The good file
/// is not refused by the GPU engine (it runs glm4moe).
#[test]
fn glm4moe_files_with_bad_metadata_are_refused_by_name() {
    use hipfire_model::gguf::{GgufError, MetaValue, MetaValueType};
    use hipfire_model::ModelError;
    let good = tmp("glm-good.gguf");
    write_synthetic(&good, &SynthSpec::tiny_glm4moe(), Format::Q8_0, 3, None).unwrap();
    let f = GgufFile::open(&good).unwrap();
    for (key, v) in [
        // 4 blocks, one of them NextN: 3 decoder blocks.
        ("glm4moe.leading_dense_block_count", MetaValue::U32(4)),
        ("glm4moe.expert_gating_func", MetaValue::U32(9)),
        ("glm4moe.expert_weights_scale", MetaValue::F32(-1.0)),
        ("glm4moe.expert_weights_scale", MetaValue::F32(f32::NAN)),
        ("glm4moe.expert_weights_scale", MetaValue::F32(1e6)),
        ("glm4moe.expert_weights_norm", MetaValue::U32(1)),
        ("glm4moe.expert_shared_count", MetaValue::U32(0)),
        ("glm4moe.expert_shared_count", MetaValue::U32(1 << 20)),
        ("glm4moe.nextn_predict_layers", MetaValue::U32(4)),
        // Block 1's router has 8 rows (block 0 is dense: the check reads the first routed one).
        ("glm4moe.expert_count", MetaValue::U32(4)),
    ] {
        match rewrite(&f, "glm-key.gguf", &set(key, v.clone())) {
            Err(ModelError::BadMetadata { key: k, .. }) => assert_eq!(k, key, "{v:?}"),
            Err(e) => panic!("{key} = {v:?}: wrong error {e}"),
            Ok(_) => panic!("{key} = {v:?}: accepted"),
        }
    }
    let sections = MetaValue::Array(
        MetaValueType::I32,
        [8, 8, 0, 0].map(MetaValue::I32).to_vec(),
    );
    for (key, v, what) in [
        (
            "glm4moe.expert_gating_func",
            MetaValue::U32(3),
            "softmax over the chosen",
        ),
        (
            "glm4moe.expert_gating_func",
            MetaValue::U32(4),
            "sqrt-softplus",
        ),
        (
            "glm4moe.expert_group_count",
            MetaValue::U32(4),
            "group-limited",
        ),
        ("glm4moe.rope.dimension_sections", sections, "M-RoPE"),
    ] {
        match rewrite(&f, "glm-unsupported.gguf", &set(key, v)) {
            Err(ModelError::Unsupported(m)) => assert!(m.contains(what), "{key}: {m}"),
            Err(e) => panic!("{key}: wrong error {e}"),
            Ok(_) => panic!("{key}: accepted"),
        }
    }
    let err = rewrite(&f, "glm-bias-len.gguf", &|_, s| {
        let t = s
            .iter_mut()
            .find(|t| t.name == "blk.1.exp_probs_b.bias")
            .unwrap();
        t.dims[0] = 7;
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::Shape { name, .. } if *name == "blk.1.exp_probs_b.bias"),
        "{err}"
    );
    let err = rewrite(&f, "glm-bias-missing.gguf", &|_, s| {
        s.retain(|t| t.name != "blk.2.exp_probs_b.bias")
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::Gguf(GgufError::MissingTensor(n)) if *n == "blk.2.exp_probs_b.bias"),
        "{err}"
    );
    // A file declaring its NextN block without carrying it loads (llama.cpp's "trunk only");
    // one missing a decoder block as well is refused by name.
    let trunk = rewrite(&f, "glm-trunk.gguf", &|_, s| {
        s.retain(|t| !t.name.starts_with("blk.3."))
    })
    .unwrap();
    assert_eq!(trunk.config().n_layer, 3);
    let err = rewrite(&f, "glm-short.gguf", &|_, s| {
        s.retain(|t| !t.name.starts_with("blk.3.") && !t.name.starts_with("blk.2."))
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::BadMetadata { key, .. } if key == "glm4moe.block_count"),
        "{err}"
    );
    // Sanity: the unedited file loads with its NextN block skipped and its first layer dense,
    // and the routing keys as written; its M-RoPE key with all-zero sections is plain RoPE.
    let zeros = MetaValue::Array(MetaValueType::I32, vec![MetaValue::I32(0); 4]);
    let m = rewrite(
        &f,
        "glm-same.gguf",
        &set("glm4moe.rope.dimension_sections", zeros),
    )
    .unwrap();
    let c = m.config();
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (c.n_layer, c.rope_dim, moe.n_dense_lead, moe.n_ff_shared),
        (3, 32, 1, Some(256))
    );
    assert_eq!(
        (moe.gating, moe.weights_scale, moe.norm_topk),
        (hipfire_model::Gating::Sigmoid, 2.5, true)
    );
    m.session().step(5).unwrap();
    // What the GPU engine's refusal and `--device auto`'s fall-back to the CPU key on: the GPU's
    // sigmoid routing waits for its device validation (gpu_moe.rs's glm4moe cases).
    assert!(
        c.cpu_only_layers()
            .is_some_and(|w| w.contains("sigmoid-routed")),
        "{:?}",
        c.cpu_only_layers()
    );
    let pool = hipfire_exec::offload::offload_pool(1).unwrap();
    let opts = hipfire_model::gpu::GpuOptions {
        ordinal: 0,
        gpu_layer_budget: None,
        mode: hipfire_exec::offload::OffloadMode::Pcie,
        ram_margin_bytes: hipfire_model::gpu::DEFAULT_RAM_MARGIN_BYTES,
        flags: hipfire_exec::flags::FlagsTuning::default(),
        ubatch: hipfire_model::gpu::DEFAULT_UBATCH,
        host_experts: hipfire_model::gpu::HostExperts::None,
    };
    // Refused by name before any device is touched.
    match hipfire_model::gpu::GpuDecoder::new(&m, pool, &opts) {
        Err(ModelError::Unsupported(msg)) => assert!(msg.starts_with("glm4moe: "), "{msg}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("the GPU engine accepted a glm4moe model"),
    }
    std::fs::remove_file(&good).unwrap();
}

/// GLM's pre-type (`glm4`) has no BOS, as llama.cpp's `LLAMA_VOCAB_PRE_TYPE_CHATGLM4`: the
/// file's `bos_token_id` (`[gMASK]`, which the chat template writes itself) is not prepended.
#[test]
fn glm_pre_type_prepends_no_bos() {
    use hipfire_model::gguf::MetaValue;
    let path = tmp("glm-pre.gguf");
    write_synthetic(&path, &SynthSpec::tiny(Arch::Llama), Format::Q8_0, 1, None).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let hi = [2 + u32::from(b'h'), 2 + u32::from(b'i')];
    for (pre, first) in [("default", Some(0)), ("glm4", None)] {
        let m = rewrite(
            &f,
            "glm-pre-edit.gguf",
            &set("tokenizer.ggml.pre", MetaValue::String(pre.into())),
        )
        .unwrap();
        let want: Vec<u32> = first.into_iter().chain(hi.iter().copied()).collect();
        assert_eq!(m.tokenizer().encode("hi", true).unwrap(), want, "{pre}");
    }
    std::fs::remove_file(&path).unwrap();
}

/// The GPU decoder refuses gpt-oss by name before it touches a device (so this runs on a
/// machine without one): sinks and biased experts are CPU-only.
#[test]
fn gpu_decoder_refuses_gpt_oss_by_name() {
    use hipfire_model::gpu::{GpuDecoder, GpuOptions, DEFAULT_RAM_MARGIN_BYTES, DEFAULT_UBATCH};
    let path = tmp("gpt-oss-gpu.gguf");
    write_synthetic(&path, &SynthSpec::tiny(Arch::GptOss), Format::Q8_0, 3, None).unwrap();
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    // What `--device auto` keys its fall-back to the CPU on.
    assert_eq!(
        model.config().cpu_only_layers(),
        Some(hipfire_model::config::GPT_OSS_CPU_ONLY)
    );
    let opts = GpuOptions {
        ordinal: 0,
        gpu_layer_budget: None,
        mode: hipfire_exec::offload::OffloadMode::Pcie,
        ram_margin_bytes: DEFAULT_RAM_MARGIN_BYTES,
        flags: hipfire_exec::flags::FlagsTuning::default(),
        ubatch: DEFAULT_UBATCH,
        host_experts: hipfire_model::gpu::HostExperts::None,
    };
    let pool = hipfire_exec::offload::offload_pool(1).unwrap();
    match GpuDecoder::new(&model, pool, &opts) {
        Err(hipfire_model::ModelError::Unsupported(m)) => {
            assert!(
                m.starts_with("gpt-oss:")
                    && [
                        "attention sinks",
                        "biased routers and experts",
                        "swiglu_oai"
                    ]
                    .iter()
                    .all(|w| m.contains(w)),
                "{m}"
            )
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("the GPU decoder took gpt-oss"),
    }
    std::fs::remove_file(&path).unwrap();
}

/// gpt-oss's keys are bounded before they size anything and refused by name when they
/// disagree: expert counts, the sliding window (required, and 0 would mask every position),
/// its layer pattern, the head shape; a missing or misshapen sink or expert bias is refused
/// naming the tensor.
#[test]
fn gpt_oss_files_with_bad_metadata_are_refused_by_name() {
    use hipfire_model::gguf::{GgufError, MetaValue};
    use hipfire_model::ModelError;
    let good = tmp("gpt-oss-good.gguf");
    write_synthetic(&good, &SynthSpec::tiny(Arch::GptOss), Format::Q8_0, 3, None).unwrap();
    let f = GgufFile::open(&good).unwrap();
    for (key, v) in [
        ("gpt-oss.expert_count", MetaValue::U32(1 << 30)),
        ("gpt-oss.expert_count", MetaValue::U32(0)),
        ("gpt-oss.expert_count", MetaValue::U32(4)),
        ("gpt-oss.expert_used_count", MetaValue::U32(9)),
        ("gpt-oss.expert_used_count", MetaValue::U32(0)),
        (
            "gpt-oss.expert_feed_forward_length",
            MetaValue::U32(u32::MAX),
        ),
        ("gpt-oss.attention.sliding_window", MetaValue::U32(0)),
        ("gpt-oss.attention.sliding_window", MetaValue::U32(u32::MAX)),
        (
            "gpt-oss.attention.sliding_window_pattern",
            MetaValue::U32(5000),
        ),
        ("gpt-oss.attention.key_length", MetaValue::U32(1 << 20)),
        ("gpt-oss.attention.head_count", MetaValue::U32(1 << 20)),
        ("gpt-oss.attention.head_count_kv", MetaValue::U32(3)),
        ("gpt-oss.rope.freq_base_swa", MetaValue::F32(0.5)),
    ] {
        refused_by_key(&f, key, v);
    }
    let err = rewrite(&f, "gpt-oss-no-window.gguf", &|m, _| {
        m.retain(|(k, _)| k != "gpt-oss.attention.sliding_window")
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::Gguf(GgufError::MissingKey(k)) if k.to_string().contains("sliding_window")),
        "{err}"
    );
    for gone in [
        "blk.2.attn_sinks.weight",
        "blk.1.attn_output.bias",
        "blk.3.ffn_gate_inp.bias",
        "blk.0.ffn_down_exps.bias",
    ] {
        let err = rewrite(&f, "gpt-oss-missing.gguf", &|_, s| {
            s.retain(|t| t.name != gone)
        })
        .unwrap_err();
        assert!(
            matches!(&err, ModelError::Gguf(GgufError::MissingTensor(n)) if n.to_string().contains(gone)),
            "{gone}: {err}"
        );
    }
    for (name, axis, to) in [
        ("blk.1.attn_sinks.weight", 0, 7),
        ("blk.1.ffn_up_exps.bias", 1, 7),
        ("blk.1.ffn_gate_exps.bias", 0, 100),
    ] {
        let err = rewrite(&f, "gpt-oss-shape.gguf", &|_, s| {
            s.iter_mut().find(|t| t.name == name).unwrap().dims[axis] = to;
        })
        .unwrap_err();
        assert!(matches!(err, ModelError::Shape { .. }), "{name}: {err}");
    }
    // Sanity: the unedited file loads with the even layers local, and decodes a token.
    let m = rewrite(&f, "gpt-oss-same.gguf", &|_, _| {}).unwrap();
    let c = m.config();
    let windows: Vec<Option<usize>> = (0..c.n_layer).map(|i| c.layer_window(i)).collect();
    let w = Some(hipfire_model::SYNTH_GPT_OSS_WINDOW);
    assert_eq!(windows, [w, None, w, None]);
    assert_eq!((c.q_dim(), c.d_model), (512, 256));
    m.session().step(5).unwrap();
    std::fs::remove_file(&good).unwrap();
}
