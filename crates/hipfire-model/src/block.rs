//! The transformer block, defined once for every engine.
//!
//! [`LayerTensors`] is the block's tensor table: every GGUF name a layer reads is written here
//! and nowhere else ([`LayerTensors::load`]). [`layer`] is the block's forward pass over the
//! rows of one step, written against [`BlockOps`]: the CPU path (`model/batch.rs`, its
//! activations in host vectors, its projections on the pinned pool) and the GPU decoder
//! (`gpu.rs`, device activations, GEMV / GEMM / row splits) each implement the operations, and
//! neither says in which order they run or which an architecture needs. So an architecture's hook
//! made of existing operations (Qwen2's biases, Qwen3's q/k norms, Gemma's post-norms) or a new
//! order is written here once and both engines follow; a new operation (Gemma's GeGLU was one)
//! is added to [`BlockOps`] and implemented by each engine (`model/batch.rs`,
//! `gpu/block_ops.rs` with its kernel in `kernels/decode.cu`).
//!
//! An operation works on every row of the step at once — one token of a decode step, a prompt
//! chunk, or one token of each sequence of a batched decode step — so the engines choose the
//! form (GEMV or GEMM, split-KV or chunk attention, one slot or several) from their rows, not
//! from the block.

use crate::config::{Arch, FfnActivation, ModelConfig};
use crate::ModelError;

/// One layer's tensors: `W` is how an engine refers to a projection (a [`crate::Weight`] id),
/// `V` how it holds a norm or bias vector (host `Vec<f32>`, a device buffer, an address). A
/// layer is `norms + mixer + ffn`, the mixer and FFN variants chosen per layer from the file's
/// metadata.
#[derive(Debug, Clone)]
pub struct LayerTensors<W, V> {
    /// RMSNorm before the mixer.
    pub attn_norm: V,
    /// The token mixer: attention, or a Gated DeltaNet.
    pub mixer: Mixer<W, V>,
    /// RMSNorm before the FFN (Qwen3.5's `post_attention_norm` plays this part).
    pub ffn_norm: V,
    /// The FFN: dense, or routed over experts.
    pub ffn: Ffn<W, V>,
    /// RMSNorm of the attention output before its residual add (Gemma's `post_attention_norm`).
    pub post_attn_norm: Option<V>,
    /// RMSNorm of the FFN output before its residual add (Gemma's `post_ffw_norm`).
    pub post_ffn_norm: Option<V>,
}

/// A layer's token mixer; each engine implements one [`BlockOps`] operation per variant.
#[derive(Debug, Clone)]
pub enum Mixer<W, V> {
    /// Softmax attention over the sequence's KV cache.
    Attention(Attention<W, V>),
    /// Gated DeltaNet: linear attention over a recurrent state ([`crate::DeltaNetConfig`]).
    DeltaNet(DeltaNet<W, V>),
}

/// An attention layer's tensors.
#[derive(Debug, Clone)]
pub struct Attention<W, V> {
    /// Query projection (with the output gate's rows interleaved per head when `gated`).
    pub wq: W,
    /// Key projection.
    pub wk: W,
    /// Value projection.
    pub wv: W,
    /// Output projection.
    pub wo: W,
    /// q/k/v biases (Qwen2 requires them; optional elsewhere, some llama fine-tunes carry them).
    pub bq: Option<V>,
    /// See [`Attention::bq`].
    pub bk: Option<V>,
    /// See [`Attention::bq`].
    pub bv: Option<V>,
    /// Output projection bias (gpt-oss).
    pub bo: Option<V>,
    /// One learned logit per query head that joins its softmax's denominator and carries no
    /// value (gpt-oss `attn_sinks`; llama.cpp `ggml_soft_max_add_sinks`).
    pub sinks: Option<V>,
    /// Per-head RMSNorms of q and k (Qwen3, Gemma 3, Qwen3.5).
    pub q_norm: Option<V>,
    /// See [`Attention::q_norm`].
    pub k_norm: Option<V>,
    /// Qwen3.5's gated attention: `wq` yields `[q_h, g_h]` per head and the attention output
    /// is multiplied by `sigmoid(g)` before `wo`.
    pub gated: bool,
}

/// A Gated DeltaNet layer's tensors (llama.cpp `ssm_*`, `attn_qkv`, `attn_gate`).
#[derive(Debug, Clone)]
pub struct DeltaNet<W, V> {
    /// The conv's input (q, k and v channels, `conv_dim` rows) and z, the output gate
    /// (`value_dim` rows): `attn_qkv` and `attn_gate`, or qwen3next's older fused `ssm_in`.
    pub qkvz: Pair<W>,
    /// The write strength's logits β and the decay's input α, one each per value head:
    /// `ssm_beta` and `ssm_alpha`, or qwen3next's fused `ssm_ba`.
    pub ba: Pair<W>,
    /// `ssm_out`: back to the residual width.
    pub out: W,
    /// `ssm_conv1d`: `conv_kernel` taps per channel (channel-major).
    pub conv: V,
    /// `ssm_dt.bias`: added to alpha before the softplus.
    pub dt_bias: V,
    /// `ssm_a`: `−exp(A_log)` per value head, the decay rate.
    pub a: V,
    /// `ssm_norm`: the gated RMSNorm's weights (`head_dim`).
    pub norm: V,
}

/// Two projections of the same input, stored as two tensors or fused in one whose rows are
/// grouped by key head (qwen3next's `ssm_in` and `ssm_ba`; the CPU step splits the product,
/// `delta_net::split_qkvz` and `split_ba`, as llama.cpp's views do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pair<W> {
    /// The two tensors.
    Split(W, W),
    /// One tensor holding both.
    Fused(W),
}

impl<W: Copy> Pair<W> {
    /// The matrices, in the order they are multiplied.
    pub fn weights(&self) -> Vec<W> {
        match *self {
            Pair::Split(a, b) => vec![a, b],
            Pair::Fused(w) => vec![w],
        }
    }
}

impl<W: Copy, V> Mixer<W, V> {
    /// Every matrix of the mixer, in the order the block multiplies them.
    pub fn projections(&self) -> Vec<W> {
        match self {
            Mixer::Attention(t) => vec![t.wq, t.wk, t.wv, t.wo],
            Mixer::DeltaNet(t) => {
                let mut v = t.qkvz.weights();
                v.extend(t.ba.weights());
                v.push(t.out);
                v
            }
        }
    }
}

/// A layer's FFN: the variant is chosen per layer from the file's metadata
/// ([`ModelConfig::moe`]); each engine implements one [`BlockOps`] operation per variant.
#[derive(Debug, Clone)]
pub enum Ffn<W, V> {
    /// `down · (act(gate · x) ⊙ up · x)`.
    Dense {
        /// Gate projection.
        gate: W,
        /// Up projection.
        up: W,
        /// Down projection.
        down: W,
    },
    /// Routed experts (see [`crate::config::MoeConfig`]).
    Moe(MoeTensors<W, V>),
}

/// A routed FFN's tensors: the router and, per expert, its own gate/up/down matrices (the
/// slabs of the file's `ffn_*_exps` tensors, one [`crate::Weight`] an expert), plus the
/// shared expert where the architecture has one.
#[derive(Debug, Clone)]
pub struct MoeTensors<W, V> {
    /// `ffn_gate_inp`: `n_expert` rows of `d_model`, the routing logits.
    pub router: W,
    /// Expert `e`'s gate projection is `gate[e]`.
    pub gate: Vec<W>,
    /// Expert `e`'s up projection.
    pub up: Vec<W>,
    /// Expert `e`'s down projection.
    pub down: Vec<W>,
    /// The always-on shared expert (Qwen2-MoE, GLM-4.5).
    pub shared: Option<SharedExpert<W, V>>,
    /// `exp_probs_b`: `n_expert` values added to the scores to choose experts, not to weigh
    /// them (GLM-4.5's `e_score_correction_bias`).
    pub selection_bias: Option<V>,
    /// Added to the router's logits before routing (gpt-oss `ffn_gate_inp.bias`).
    pub router_bias: Option<V>,
    /// Per-expert biases of the three projections (gpt-oss `ffn_*_exps.bias`).
    pub biases: Option<ExpertBiases<V>>,
}

/// The routed experts' biases, one vector per expert and projection, each added right after
/// its projection (llama.cpp's `ggml_add_id` after each `MUL_MAT_ID`).
#[derive(Debug, Clone)]
pub struct ExpertBiases<V> {
    /// Expert `e`'s gate bias (`n_ff_exp` values).
    pub gate: Vec<V>,
    /// Expert `e`'s up bias (`n_ff_exp` values).
    pub up: Vec<V>,
    /// Expert `e`'s down bias (`d_model` values).
    pub down: Vec<V>,
}

impl<W: Copy, V> MoeTensors<W, V> {
    /// Expert `e`'s matrices: gate, up, down.
    pub fn expert(&self, e: usize) -> [W; 3] {
        [self.gate[e], self.up[e], self.down[e]]
    }

    /// Every routed expert's matrices, expert by expert.
    pub fn experts(&self) -> Vec<W> {
        (0..self.gate.len()).flat_map(|e| self.expert(e)).collect()
    }
}

/// An expert every token uses, its output scaled by `sigmoid(gate_inp · x)` where the file
/// has `ffn_gate_inp_shexp`.
#[derive(Debug, Clone)]
pub struct SharedExpert<W, V> {
    /// Gate projection.
    pub gate: W,
    /// Up projection.
    pub up: W,
    /// Down projection.
    pub down: W,
    /// The scalar gate's weights (`d_model` values).
    pub gate_inp: Option<V>,
}

impl<W: Copy, V> Ffn<W, V> {
    /// Every matrix of the FFN, in the order the block multiplies them (routed experts by
    /// index, gate, up and down each).
    pub fn projections(&self) -> Vec<W> {
        match self {
            Ffn::Dense { gate, up, down } => vec![*gate, *up, *down],
            Ffn::Moe(m) => {
                let mut v = vec![m.router];
                v.extend(m.gate.iter().chain(&m.up).chain(&m.down).copied());
                if let Some(sh) = &m.shared {
                    v.extend([sh.gate, sh.up, sh.down]);
                }
                v
            }
        }
    }

    /// The routed part, `None` for a dense FFN.
    pub fn moe(&self) -> Option<&MoeTensors<W, V>> {
        match self {
            Ffn::Moe(m) => Some(m),
            Ffn::Dense { .. } => None,
        }
    }
}

/// How [`LayerTensors::load`] reads the file: a matrix's id by name and shape (`k` elements a
/// row, `m` rows), a vector by name and length.
pub(crate) trait TensorSource<W> {
    /// The matrix `name` of `m` rows of `k`, or an error naming it.
    fn matrix(&mut self, name: &str, k: usize, m: usize) -> Result<W, ModelError>;
    /// The 3-D tensor `name` of `n` stacked matrices of `m` rows of `k` (ggml dims
    /// `{k, m, n}`), one id per matrix, or an error naming it.
    fn matrices(&mut self, name: &str, k: usize, m: usize, n: usize) -> Result<Vec<W>, ModelError>;
    /// The 3-D tensor `name` of `n` stacked matrices of `2m` rows of `k` (ggml dims
    /// `{k, 2m, n}`), each split into its first `m` rows and its last `m` (a fused
    /// `ffn_gate_up_exps`: gate, then up): the ids of the first halves and of the second.
    fn matrix_halves(
        &mut self,
        name: &str,
        k: usize,
        m: usize,
        n: usize,
    ) -> Result<(Vec<W>, Vec<W>), ModelError>;
    /// The vector `name` of `n` values, or an error naming it.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError>;
    /// The small 2-D tensor `name` of `m` rows of `k` (ggml dims `{k, m}`) as `m × k` f32
    /// values, or an error naming it (a conv's taps).
    fn table(&self, name: &str, k: usize, m: usize) -> Result<Vec<f32>, ModelError>;
    /// Whether the file has a tensor `name`.
    fn has(&self, name: &str) -> bool;
    /// The vector `name` of `n` values, `None` when the file lacks it.
    fn opt_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError>;
}

impl<W: Copy> LayerTensors<W, Vec<f32>> {
    /// Layer `i`'s tensors for `c`'s architecture, by their GGUF names (`blk.{i}.…`): what is
    /// required is refused by name when absent, what an architecture lacks stays `None`. The
    /// matrices are read in the block's order, so their ids are too.
    pub(crate) fn load(
        src: &mut impl TensorSource<W>,
        c: &ModelConfig,
        i: usize,
    ) -> Result<Self, ModelError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let d = c.d_model;
        let (post_attn_norm, post_ffn_norm) = match c.arch.post_norms() {
            true => (
                Some(src.vector(&n("post_attention_norm.weight"), d)?),
                Some(src.vector(&n("post_ffw_norm.weight"), d)?),
            ),
            false => (None, None),
        };
        let attn_norm = src.vector(&n("attn_norm.weight"), d)?;
        let mixer = match &c.delta_net {
            Some(dn) if dn.is_recurrent(i) => Mixer::DeltaNet(load_delta_net(src, c, i)?),
            _ => Mixer::Attention(load_attention(src, c, i)?),
        };
        Ok(LayerTensors {
            attn_norm,
            mixer,
            ffn_norm: src.vector(&n(c.arch.ffn_norm_name()), d)?,
            ffn: load_ffn(src, c, i)?,
            post_attn_norm,
            post_ffn_norm,
        })
    }
}

/// Layer `i`'s attention tensors.
fn load_attention<W: Copy>(
    src: &mut impl TensorSource<W>,
    c: &ModelConfig,
    i: usize,
) -> Result<Attention<W, Vec<f32>>, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (d, qd, kvd) = (c.d_model, c.q_dim(), c.kv_dim());
    // Optional everywhere (some llama fine-tunes and Qwen2-MoE carry them); Qwen2 requires
    // them. gpt-oss's are optional in llama.cpp too (its checkpoints carry them).
    let biases = c.arch == Arch::Qwen2;
    let gpt_oss = c.arch == Arch::GptOss;
    let read_bias = |s: &str, len: usize| match biases {
        true => src.vector(&n(s), len).map(Some),
        false => src.opt_vector(&n(s), len),
    };
    let (bq, bk, bv) = (
        read_bias("attn_q.bias", qd)?,
        read_bias("attn_k.bias", kvd)?,
        read_bias("attn_v.bias", kvd)?,
    );
    let q_norm = src.opt_vector(&n("attn_q_norm.weight"), c.head_dim)?;
    let k_norm = src.opt_vector(&n("attn_k_norm.weight"), c.head_dim)?;
    if c.arch.qk_norms() && (q_norm.is_none() || k_norm.is_none()) {
        return Err(ModelError::Unsupported(format!(
            "{} layer {i} lacks q/k norms",
            c.arch.name()
        )));
    }
    let gated = c.arch.hybrid();
    if gated && bq.is_some() {
        return Err(ModelError::Unsupported(format!(
            "{} layer {i}: a query bias on a gated attention layer",
            c.arch.name()
        )));
    }
    // gpt-oss requires its output bias and sinks (llama.cpp creates both with flag 0); no
    // other architecture reads them.
    let (bo, sinks) = match gpt_oss {
        true => (
            Some(src.vector(&n("attn_output.bias"), d)?),
            Some(src.vector(&n("attn_sinks.weight"), c.n_head)?),
        ),
        false => (None, None),
    };
    Ok(Attention {
        wq: src.matrix(&n("attn_q.weight"), d, if gated { 2 * qd } else { qd })?,
        wk: src.matrix(&n("attn_k.weight"), d, kvd)?,
        wv: src.matrix(&n("attn_v.weight"), d, kvd)?,
        wo: src.matrix(&n("attn_output.weight"), qd, d)?,
        bq,
        bk,
        bv,
        bo,
        sinks,
        q_norm,
        k_norm,
        gated,
    })
}

/// Layer `i`'s Gated DeltaNet tensors.
fn load_delta_net<W: Copy>(
    src: &mut impl TensorSource<W>,
    c: &ModelConfig,
    i: usize,
) -> Result<DeltaNet<W, Vec<f32>>, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let d = c.d_model;
    let Some(dn) = &c.delta_net else {
        return Err(ModelError::Unsupported(format!(
            "layer {i}: a DeltaNet layer in a model without ssm metadata"
        )));
    };
    let (hv, vd) = (dn.n_v_heads, dn.value_dim());
    // Each architecture's llama.cpp loader reads one form; a tensor of the other form would
    // go unread there (its tensor count check refuses the file), so it is refused here by
    // name. qwen3next reads `attn_qkv` + `attn_gate` where present, else the older `ssm_in`.
    let fused = c.arch == Arch::Qwen3Next;
    let legacy = fused && !src.has(&n("attn_qkv.weight")) && src.has(&n("ssm_in.weight"));
    let unread: &[&str] = match (fused, legacy) {
        (false, _) => &["ssm_in.weight", "ssm_ba.weight"],
        (true, false) => &["ssm_in.weight", "ssm_beta.weight", "ssm_alpha.weight"],
        (true, true) => &["attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight"],
    };
    if let Some(t) = unread.iter().find(|t| src.has(&n(t))) {
        return Err(ModelError::Unsupported(format!(
            "layer {i}: tensor {} in a {} file (the layer's other tensors say it stores its \
             DeltaNet projections in the other form)",
            n(t),
            c.arch.name()
        )));
    }
    let qkvz = match legacy {
        true => Pair::Fused(src.matrix(&n("ssm_in.weight"), d, dn.conv_dim() + vd)?),
        false => Pair::Split(
            src.matrix(&n("attn_qkv.weight"), d, dn.conv_dim())?,
            src.matrix(&n("attn_gate.weight"), d, vd)?,
        ),
    };
    let ba = match fused {
        true => Pair::Fused(src.matrix(&n("ssm_ba.weight"), d, 2 * hv)?),
        false => Pair::Split(
            src.matrix(&n("ssm_beta.weight"), d, hv)?,
            src.matrix(&n("ssm_alpha.weight"), d, hv)?,
        ),
    };
    Ok(DeltaNet {
        qkvz,
        ba,
        out: src.matrix(&n("ssm_out.weight"), vd, d)?,
        conv: src.table(&n("ssm_conv1d.weight"), dn.conv_kernel, dn.conv_dim())?,
        dt_bias: src.vector(&n("ssm_dt.bias"), hv)?,
        a: src.vector(&n("ssm_a"), hv)?,
        norm: src.vector(&n("ssm_norm.weight"), dn.head_dim)?,
    })
}

/// Layer `i`'s FFN tensors: dense, or routed over experts.
fn load_ffn<W: Copy>(
    src: &mut impl TensorSource<W>,
    c: &ModelConfig,
    i: usize,
) -> Result<Ffn<W, Vec<f32>>, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let d = c.d_model;
    // GLM-4.5's leading layers are dense in a routed model.
    let Some(moe) = c.moe.as_ref().filter(|m| i >= m.n_dense_lead) else {
        return Ok(Ffn::Dense {
            gate: src.matrix(&n("ffn_gate.weight"), d, c.n_ff)?,
            up: src.matrix(&n("ffn_up.weight"), d, c.n_ff)?,
            down: src.matrix(&n("ffn_down.weight"), c.n_ff, d)?,
        });
    };
    let (e, ff) = (moe.n_expert, moe.n_ff_exp);
    let shared = match moe.n_ff_shared {
        None => None,
        Some(sf) => Some(SharedExpert {
            gate: src.matrix(&n("ffn_gate_shexp.weight"), d, sf)?,
            up: src.matrix(&n("ffn_up_shexp.weight"), d, sf)?,
            down: src.matrix(&n("ffn_down_shexp.weight"), sf, d)?,
            gate_inp: src.opt_vector(&n("ffn_gate_inp_shexp.weight"), d)?,
        }),
    };
    let router = src.matrix(&n("ffn_gate_inp.weight"), d, e)?;
    let fused = n("ffn_gate_up_exps.weight");
    let (gate, up) = match (src.has(&fused), c.arch.fused_gate_up()) {
        (false, _) => (
            src.matrices(&n("ffn_gate_exps.weight"), d, ff, e)?,
            src.matrices(&n("ffn_up_exps.weight"), d, ff, e)?,
        ),
        (true, false) => {
            return Err(ModelError::Unsupported(format!(
                "layer {i}: fused ffn_gate_up_exps in a {} file (llama.cpp's loader for it \
                 reads ffn_gate_exps and ffn_up_exps as separate tensors)",
                c.arch.name()
            )))
        }
        (true, true) => {
            // llama.cpp reads the fused tensor alone; separate ones beside it would be unread.
            for t in ["ffn_gate_exps.weight", "ffn_up_exps.weight"] {
                if src.has(&n(t)) {
                    return Err(ModelError::Unsupported(format!(
                        "layer {i}: both ffn_gate_up_exps and {t}"
                    )));
                }
            }
            src.matrix_halves(&fused, d, ff, e)?
        }
    };
    // llama.cpp requires GLM-4.5's selection bias (`ffn_exp_probs_b`); the other routed
    // architectures have none.
    let selection_bias = match c.arch {
        Arch::Glm4Moe => Some(src.vector(&n("exp_probs_b.bias"), e)?),
        _ => None,
    };
    // gpt-oss's router and experts are biased (required by llama.cpp); the others' are not.
    let (router_bias, biases) = match c.arch == Arch::GptOss {
        true => {
            // One row of `len` values an expert.
            let per_expert = |name: &str, len: usize| -> Result<Vec<Vec<f32>>, ModelError> {
                let t = src.table(&n(name), len, e)?;
                Ok(t.chunks_exact(len).map(<[f32]>::to_vec).collect())
            };
            (
                Some(src.vector(&n("ffn_gate_inp.bias"), e)?),
                Some(ExpertBiases {
                    gate: per_expert("ffn_gate_exps.bias", ff)?,
                    up: per_expert("ffn_up_exps.bias", ff)?,
                    down: per_expert("ffn_down_exps.bias", d)?,
                }),
            )
        }
        false => (None, None),
    };
    Ok(Ffn::Moe(MoeTensors {
        router,
        gate,
        up,
        down: src.matrices(&n("ffn_down_exps.weight"), ff, d, e)?,
        shared,
        selection_bias,
        router_bias,
        biases,
    }))
}

impl<W: Copy, V> LayerTensors<W, V> {
    /// Every projection, in the order the block multiplies them: the mixer's, then the
    /// FFN's ([`Ffn::projections`]).
    pub fn projections(&self) -> Vec<W> {
        let mut v = self.mixer.projections();
        v.extend(self.ffn.projections());
        v
    }

    /// Every projection but the routed experts' (the mixer's, a dense FFN's, or the router and
    /// shared expert of a routed one): what an engine places layer by layer, the experts being
    /// placed on their own ([`MoeTensors::experts`]).
    pub fn layer_projections(&self) -> Vec<W> {
        let mut v = self.mixer.projections();
        match &self.ffn {
            Ffn::Dense { gate, up, down } => v.extend([*gate, *up, *down]),
            Ffn::Moe(m) => {
                v.push(m.router);
                if let Some(sh) = &m.shared {
                    v.extend([sh.gate, sh.up, sh.down]);
                }
            }
        }
        v
    }

    /// The same table with every vector mapped by `f` (uploaded to a device, borrowed, …).
    pub fn map_vectors<'s, V2, E>(
        &'s self,
        mut f: impl FnMut(&'s V) -> Result<V2, E>,
    ) -> Result<LayerTensors<W, V2>, E> {
        let mixer = match &self.mixer {
            Mixer::Attention(t) => {
                let mut opt = |v: &'s Option<V>| v.as_ref().map(&mut f).transpose();
                Mixer::Attention(Attention {
                    wq: t.wq,
                    wk: t.wk,
                    wv: t.wv,
                    wo: t.wo,
                    bq: opt(&t.bq)?,
                    bk: opt(&t.bk)?,
                    bv: opt(&t.bv)?,
                    bo: opt(&t.bo)?,
                    sinks: opt(&t.sinks)?,
                    q_norm: opt(&t.q_norm)?,
                    k_norm: opt(&t.k_norm)?,
                    gated: t.gated,
                })
            }
            Mixer::DeltaNet(t) => Mixer::DeltaNet(DeltaNet {
                qkvz: t.qkvz,
                ba: t.ba,
                out: t.out,
                conv: f(&t.conv)?,
                dt_bias: f(&t.dt_bias)?,
                a: f(&t.a)?,
                norm: f(&t.norm)?,
            }),
        };
        let ffn = match &self.ffn {
            Ffn::Dense { gate, up, down } => Ffn::Dense {
                gate: *gate,
                up: *up,
                down: *down,
            },
            Ffn::Moe(m) => Ffn::Moe(MoeTensors {
                router: m.router,
                gate: m.gate.clone(),
                up: m.up.clone(),
                down: m.down.clone(),
                shared: match &m.shared {
                    None => None,
                    Some(sh) => Some(SharedExpert {
                        gate: sh.gate,
                        up: sh.up,
                        down: sh.down,
                        gate_inp: sh.gate_inp.as_ref().map(&mut f).transpose()?,
                    }),
                },
                selection_bias: m.selection_bias.as_ref().map(&mut f).transpose()?,
                router_bias: m.router_bias.as_ref().map(&mut f).transpose()?,
                biases: match &m.biases {
                    None => None,
                    Some(b) => {
                        let mut all =
                            |v: &'s Vec<V>| v.iter().map(&mut f).collect::<Result<Vec<_>, E>>();
                        Some(ExpertBiases {
                            gate: all(&b.gate)?,
                            up: all(&b.up)?,
                            down: all(&b.down)?,
                        })
                    }
                },
            }),
        };
        let mut opt = |v: &'s Option<V>| v.as_ref().map(&mut f).transpose();
        Ok(LayerTensors {
            post_attn_norm: opt(&self.post_attn_norm)?,
            post_ffn_norm: opt(&self.post_ffn_norm)?,
            attn_norm: f(&self.attn_norm)?,
            mixer,
            ffn_norm: f(&self.ffn_norm)?,
            ffn,
        })
    }
}

/// The activations of a step that the block's operations name. Each holds one row per row of
/// the step: `X` (the residual stream) and `Xn` `d_model` values a row, `Q` and `Att`
/// `n_head × head_dim`, `K` and `V` `n_head_kv × head_dim`, `Gate` and `Up` `n_ff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// The residual stream.
    X,
    /// A normalised copy of `X` (and the scratch of a post-normed projection).
    Xn,
    /// Queries.
    Q,
    /// Keys.
    K,
    /// Values.
    V,
    /// Attention output.
    Att,
    /// FFN gate (then the gated activation).
    Gate,
    /// FFN up.
    Up,
}

impl Act {
    /// Values a row of this activation holds under `c`.
    pub fn width(self, c: &ModelConfig) -> usize {
        match self {
            Act::X | Act::Xn => c.d_model,
            Act::Q | Act::Att => c.q_dim(),
            Act::K | Act::V => c.kv_dim(),
            Act::Gate | Act::Up => c.n_ff,
        }
    }
}

/// The operations of the block, over every row of one step. An engine implements them on its
/// own activations; [`layer`] calls them in the block's order. Each must compute the same
/// arithmetic for a row whatever the other rows are (the tests compare a batch against its
/// sequences alone).
pub(crate) trait BlockOps {
    /// How the engine passes a norm or bias vector (`&[f32]`, a device address).
    type Vector: Copy;

    /// `dst[r] = rms_norm(src[r]) · w` for every row of `width` values (`width` divides the
    /// activation's row: `head_dim` normalises each head); `src == dst` works in place.
    fn rms_norm(
        &mut self,
        src: Act,
        w: Self::Vector,
        dst: Act,
        width: usize,
    ) -> Result<(), ModelError>;

    /// `dst[r] += b` for every row.
    fn add_bias(&mut self, dst: Act, b: Self::Vector) -> Result<(), ModelError>;

    /// `out = W · input` for each `(W, out)`, all over the same activation (q/k/v, gate/up: an
    /// engine may run them as one step).
    fn project(&mut self, outs: &[(usize, Act)], input: Act) -> Result<(), ModelError>;

    /// `X += W · input`: the residual add folded into the projection.
    fn project_residual(&mut self, w: usize, input: Act) -> Result<(), ModelError>;

    /// Layer `li`'s attention: RoPE on `Q` and `K` at each row's position (the layer's own
    /// table on a sliding-window layer), `K` and `V` into the layer's cache of the row's
    /// sequence, then each row's query over its sequence's cached positions (its window on a
    /// sliding-window layer) into `Att`; with `sinks`, query head `h`'s softmax denominator
    /// also counts `e^sinks[h]` ([`Attention::sinks`]).
    fn attention(&mut self, li: usize, sinks: Option<Self::Vector>) -> Result<(), ModelError>;

    /// `X[r] += rms_norm(src[r]) · w` for every row (`d_model` values).
    fn rms_norm_add(&mut self, src: Act, w: Self::Vector) -> Result<(), ModelError>;

    /// `Gate = f(Gate) · Up`, element-wise.
    fn gated_activation(&mut self, f: FfnActivation) -> Result<(), ModelError>;

    /// `X += moe(Xn)` for every row: the router's logits (plus its bias where there is one),
    /// each row's top `n_expert_used` experts and their weights by the configured gating
    /// (renormalised where [`crate::config::MoeConfig`] says), their gated FFNs (with the
    /// experts' biases where there are) weighted and summed, plus the shared expert (see
    /// [`crate::config::MoeConfig`]).
    fn moe(&mut self, t: &MoeTensors<usize, Self::Vector>) -> Result<(), ModelError>;

    /// Qwen3.5's gated attention, first part: `[q_h, g_h]` per head `= wq · Xn` (the query
    /// heads into `Q`, the gates kept for [`BlockOps::output_gate`]), `K = wk · Xn`,
    /// `V = wv · Xn`.
    fn gated_query(&mut self, t: &Attention<usize, Self::Vector>) -> Result<(), ModelError>;

    /// Qwen3.5's gated attention, after the attention: `Att_h *= sigmoid(g_h)` per head, with
    /// the gates of the last [`BlockOps::gated_query`].
    fn output_gate(&mut self) -> Result<(), ModelError>;

    /// `X += out · gated_norm(delta_rule(conv(qkv · Xn)))` for every row: layer `li`'s Gated
    /// DeltaNet over each row's sequence state, rows of one sequence in position order (see
    /// [`crate::DeltaNetConfig`]).
    fn delta_net(&mut self, li: usize, t: &DeltaNet<usize, Self::Vector>)
        -> Result<(), ModelError>;
}

/// Layer `li` over the rows `ops` holds: the pre-norm block with the architecture's hooks.
pub(crate) fn layer<O: BlockOps>(
    ops: &mut O,
    c: &ModelConfig,
    li: usize,
    t: &LayerTensors<usize, O::Vector>,
) -> Result<(), ModelError> {
    ops.rms_norm(Act::X, t.attn_norm, Act::Xn, c.d_model)?;
    match &t.mixer {
        Mixer::Attention(a) => {
            match a.gated {
                // The loader refuses a query bias on a gated layer.
                true => ops.gated_query(a)?,
                false => ops.project(&[(a.wq, Act::Q), (a.wk, Act::K), (a.wv, Act::V)], Act::Xn)?,
            }
            for (b, act) in [(a.bq, Act::Q), (a.bk, Act::K), (a.bv, Act::V)] {
                if let Some(b) = b {
                    ops.add_bias(act, b)?;
                }
            }
            if let Some(w) = a.q_norm {
                ops.rms_norm(Act::Q, w, Act::Q, c.head_dim)?;
            }
            if let Some(w) = a.k_norm {
                ops.rms_norm(Act::K, w, Act::K, c.head_dim)?;
            }
            ops.attention(li, a.sinks)?;
            if a.gated {
                ops.output_gate()?;
            }
            residual(ops, a.wo, a.bo, Act::Att, t.post_attn_norm)?;
        }
        Mixer::DeltaNet(dn) => ops.delta_net(li, dn)?,
    }

    ops.rms_norm(Act::X, t.ffn_norm, Act::Xn, c.d_model)?;
    match &t.ffn {
        Ffn::Dense { gate, up, down } => {
            ops.project(&[(*gate, Act::Gate), (*up, Act::Up)], Act::Xn)?;
            ops.gated_activation(c.arch.ffn_activation())?;
            residual(ops, *down, None, Act::Gate, t.post_ffn_norm)
        }
        // No routed architecture normalises the FFN output (the loader reads no post-norm
        // for them).
        Ffn::Moe(m) => ops.moe(m),
    }
}

/// `X += post(W · input + bias)`: folded into the projection (the bias added to `X` after),
/// or — where the architecture normalises the output first (Gemma) — projected into `Xn` (free
/// once the block's projections of it are done), then biased, normalised and added.
fn residual<O: BlockOps>(
    ops: &mut O,
    w: usize,
    bias: Option<O::Vector>,
    input: Act,
    post: Option<O::Vector>,
) -> Result<(), ModelError> {
    match post {
        None => {
            ops.project_residual(w, input)?;
            bias.map_or(Ok(()), |b| ops.add_bias(Act::X, b))
        }
        Some(n) => {
            ops.project(&[(w, Act::Xn)], input)?;
            if let Some(b) = bias {
                ops.add_bias(Act::Xn, b)?;
            }
            ops.rms_norm_add(Act::Xn, n)
        }
    }
}
