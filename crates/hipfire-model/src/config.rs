//! Architecture hyper-parameters read from GGUF metadata.

use crate::gguf::{GgufIndex, MetaValue, Quoted};
use crate::rope::RopeScaling;
use crate::ModelError;

/// Architectures this crate decodes (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral, SmolLM2 (llama.cpp `LLM_ARCH_LLAMA`).
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k, v.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k, no biases.
    Qwen3,
    /// Gemma 3 (llama.cpp `LLM_ARCH_GEMMA3`): embedding scaled by √d_model, q/k RMSNorm,
    /// RMSNorms after attention and after the FFN as well as before, GeGLU (tanh GELU),
    /// interleaved sliding-window and global layers with their own RoPE bases, tied head.
    Gemma3,
    /// Qwen1.5-MoE / Qwen2-MoE (llama.cpp `LLM_ARCH_QWEN2MOE`): Qwen2's attention (q/k/v
    /// biases where the file has them), a routed FFN whose top-k weights are *not*
    /// renormalised, and a shared expert scaled by `sigmoid(ffn_gate_inp_shexp · x)`.
    Qwen2Moe,
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B; llama.cpp `LLM_ARCH_QWEN3MOE`): Qwen3's
    /// attention, a routed FFN with the top-k weights renormalised, no shared expert.
    Qwen3Moe,
    /// Qwen3.5 dense (llama.cpp `LLM_ARCH_QWEN35`): a 3:1 hybrid — Gated DeltaNet layers
    /// (linear attention with a recurrent state) and gated full-attention layers (the query
    /// projection also yields a sigmoid output gate; q/k RMSNorm; partial NEOX RoPE) — each
    /// layer's FFN input normalised by `post_attention_norm`.
    Qwen35,
    /// Qwen3.5 MoE (llama.cpp `LLM_ARCH_QWEN35MOE`): Qwen3.5's layers with a routed FFN
    /// (renormalised top-k) and a sigmoid-gated shared expert.
    Qwen35Moe,
    /// Qwen3-Next (Qwen3-Next-80B-A3B; llama.cpp `LLM_ARCH_QWEN3NEXT`): Qwen3.5-MoE's layers
    /// as first published — β and α in one `ssm_ba` tensor (older files: q, k, v and z in one
    /// `ssm_in`), each value head sharing the key head of its group
    /// ([`KeyHeadShare::Grouped`]), plain NEOX RoPE.
    Qwen3Next,
    /// GLM-4.5 / GLM-4.5-Air / GLM-4.6 (llama.cpp `LLM_ARCH_GLM4_MOE`): attention with
    /// optional q/k/v biases and q/k RMSNorms, partial NEOX RoPE, the FFN's input normalised by
    /// `post_attention_norm`; the first `leading_dense_block_count` FFNs dense, the others
    /// routed by sigmoid scores with a per-expert selection bias ([`Gating::Sigmoid`]) plus an
    /// ungated shared expert; trailing NextN (multi-token prediction) blocks are not run.
    Glm4Moe,
    /// OpenAI gpt-oss-20b / 120b (llama.cpp `LLM_ARCH_OPENAI_MOE`, GGUF name `gpt-oss`):
    /// biased q/k/v/output projections, a learned attention sink per head, sliding-window and
    /// full layers alternating (even layers local), YaRN RoPE on every layer, and a routed FFN
    /// with a biased router (softmax over the top-k logits) and biased experts whose gate is
    /// [`ExpertActivation::SwigluOai`].
    GptOss,
}

/// The FFN's gate activation (`act(gate) · up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SiLU: SwiGLU (llama, Qwen).
    Silu,
    /// GELU, tanh approximation: GeGLU (Gemma; HF `gelu_pytorch_tanh`, ggml `ggml_gelu`).
    GeluTanh,
}

impl Arch {
    /// Architecture for a `general.architecture` string.
    pub fn from_name(s: &str) -> Result<Arch, ModelError> {
        match s {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "gemma3" => Ok(Arch::Gemma3),
            "qwen2moe" => Ok(Arch::Qwen2Moe),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            "qwen35" => Ok(Arch::Qwen35),
            "qwen35moe" => Ok(Arch::Qwen35Moe),
            "qwen3next" => Ok(Arch::Qwen3Next),
            "glm4moe" => Ok(Arch::Glm4Moe),
            "gpt-oss" => Ok(Arch::GptOss),
            other => Err(ModelError::Unsupported(format!(
                "architecture {} (supported: llama (Mixtral-style experts included), qwen2, \
                 qwen3, gemma3, qwen2moe, qwen3moe, qwen35, qwen35moe, qwen3next, glm4moe, \
                 gpt-oss)",
                Quoted::new(other)
            ))),
        }
    }

    /// The GGUF key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Next => "qwen3next",
            Arch::Glm4Moe => "glm4moe",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// The FFN's gate activation.
    pub fn ffn_activation(self) -> FfnActivation {
        match self {
            Arch::Gemma3 => FfnActivation::GeluTanh,
            Arch::Llama
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen2Moe
            | Arch::Qwen3Moe
            | Arch::Qwen35
            | Arch::Qwen35Moe
            | Arch::Qwen3Next
            | Arch::Glm4Moe
            | Arch::GptOss => FfnActivation::Silu,
        }
    }

    /// Whether each block also normalises the attention and FFN outputs before adding them to
    /// the residual (`post_attention_norm`, `post_ffw_norm`: Gemma 2/3).
    pub fn post_norms(self) -> bool {
        self == Arch::Gemma3
    }

    /// Whether the architecture needs per-head q/k RMSNorm weights in every block.
    pub fn qk_norms(self) -> bool {
        matches!(
            self,
            Arch::Qwen3
                | Arch::Gemma3
                | Arch::Qwen3Moe
                | Arch::Qwen35
                | Arch::Qwen35Moe
                | Arch::Qwen3Next
        )
    }

    /// Whether the architecture interleaves Gated DeltaNet layers with gated attention ones.
    pub fn hybrid(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next)
    }

    /// Whether every layer's FFN is a routed Mixture-of-Experts (the `llama` architecture is
    /// routed only when its file declares `llama.expert_count`: Mixtral).
    pub fn always_moe(self) -> bool {
        matches!(
            self,
            Arch::Qwen2Moe
                | Arch::Qwen3Moe
                | Arch::Qwen35Moe
                | Arch::Qwen3Next
                | Arch::Glm4Moe
                | Arch::GptOss
        )
    }

    /// Whether a layer's routed gate and up projections may come as one `ffn_gate_up_exps`
    /// tensor, each expert's gate rows then its up rows: the architectures whose llama.cpp
    /// loader goes through `create_tensor_gate_up_exps` (of those hipfire runs, qwen35moe and
    /// qwen3next; its qwen2moe, qwen3moe and llama loaders read only the separate tensors).
    pub fn fused_gate_up(self) -> bool {
        matches!(self, Arch::Qwen35Moe | Arch::Qwen3Next)
    }

    /// Whether the FFN's input norm is the tensor llama.cpp calls `attn_post_norm`
    /// (`blk.N.post_attention_norm`; its output feeds the FFN, it is not added to the residual)
    /// rather than `ffn_norm`: Qwen3.5, GLM-4.5 and gpt-oss.
    pub fn ffn_norm_is_post_attention(self) -> bool {
        self.hybrid() || matches!(self, Arch::Glm4Moe | Arch::GptOss)
    }

    /// The tensor that normalises the FFN's input (see [`Arch::ffn_norm_is_post_attention`]).
    pub fn ffn_norm_name(self) -> &'static str {
        match self.ffn_norm_is_post_attention() {
            true => "post_attention_norm.weight",
            false => "ffn_norm.weight",
        }
    }

    /// RoPE pairing, as llama.cpp's `llama_model_rope_type`: llama uses "normal" rope
    /// (adjacent pairs — the converter permutes Q/K rows to make that equal HF's
    /// rotate-half), the Qwen family uses NEOX (pairs `i`, `i + d/2`).
    pub fn rope_neox(self) -> bool {
        !matches!(self, Arch::Llama)
    }
}

/// Default RoPE base when the key is absent (llama.cpp's default `rope_freq_base_train`).
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
/// Default RMSNorm epsilon when absent (HF `LlamaConfig.rms_norm_eps` default).
const DEFAULT_RMS_EPS: f64 = 1e-6;

// Limits on the hyper-parameters a file may declare. Each is far above every published model
// of the supported families (largest: Llama-3.1-405B with 126 blocks, width 16384, FFN 53248,
// 128 heads of 128; Llama 4 Scout's 10 M-token context; Gemma 3's 262144-token vocabulary), and
// low enough that every buffer sized by one (or by a product of two: q width = heads × head
// width ≤ 2^20) is a few MiB, so a hostile value is refused before it sizes an allocation.

/// Most transformer blocks (`{arch}.block_count`).
pub const MAX_BLOCK_COUNT: u64 = 1024;
/// Widest residual stream (`{arch}.embedding_length`).
pub const MAX_EMBEDDING_LENGTH: u64 = 1 << 16;
/// Widest FFN (`{arch}.feed_forward_length`).
pub const MAX_FEED_FORWARD_LENGTH: u64 = 1 << 20;
/// Most attention heads, query or key/value (`{arch}.attention.head_count[_kv]`).
pub const MAX_HEAD_COUNT: u64 = 1024;
/// Widest head (`{arch}.attention.key_length`, `value_length`, `rope.dimension_count`).
pub const MAX_HEAD_DIM: u64 = 1024;
/// Most routed experts a layer may declare (`{arch}.expert_count`): the largest published
/// MoE models route over 512 (Qwen3-Next) or 384 (Kimi K2); the count sizes per-token routing
/// buffers and the weight table (three matrices an expert a layer).
pub const MAX_EXPERT_COUNT: u64 = 1024;
/// Most shared experts (`{arch}.expert_shared_count`): published models have 1 (GLM-4.5,
/// DeepSeek-V3) or 2 (DeepSeek-V2); their widths add up to one shared FFN.
pub const MAX_SHARED_EXPERTS: u64 = 64;
/// Largest `{arch}.expert_weights_scale`: published factors are 1.0 (GLM-4.5-Air), 2.5
/// (GLM-4.5, DeepSeek-V3) and 2.827 (Kimi K2); a much larger one only scales a broken file's
/// experts into overflow.
pub const MAX_EXPERT_WEIGHTS_SCALE: f64 = 100.0;
/// llama.cpp's `llama_expert_gating_func_type` ids (`{arch}.expert_gating_func`): 0 is "none"
/// (GLM-4.5 then means sigmoid), 1 softmax, 2 sigmoid, 3 softmax over the chosen logits
/// (gpt-oss), 4 sqrt(softplus).
const GATING_NONE: u64 = 0;
/// See [`GATING_NONE`].
const GATING_SOFTMAX: u64 = 1;
/// See [`GATING_NONE`].
const GATING_SIGMOID: u64 = 2;
/// See [`GATING_NONE`].
const GATING_SOFTMAX_WEIGHT: u64 = 3;
/// See [`GATING_NONE`].
const GATING_SQRT_SOFTPLUS: u64 = 4;
/// Most taps of a DeltaNet conv (`{arch}.ssm.conv_kernel`): published models use 4; the
/// window sizes per-sequence state.
pub const MAX_CONV_KERNEL: u64 = 64;
/// Longest training context (`{arch}.context_length`).
pub const MAX_CONTEXT_LENGTH: u64 = 1 << 24;
/// Largest vocabulary (`tokenizer.ggml.tokens` length, `{arch}.vocab_size`).
pub const MAX_VOCAB: u64 = 1 << 24;
/// Smallest RoPE base accepted: below 1 the rotation frequencies `base^(-2i/d)` grow with
/// the pair index instead of falling, which no RoPE model is trained with.
pub const MIN_ROPE_FREQ_BASE: f64 = 1.0;
/// Largest RMSNorm epsilon accepted: trained models use 1e-6 … 1e-5, and an epsilon near the
/// mean square of unit-scale activations (≥ 1) would swamp it and flatten every norm.
pub const MAX_RMS_EPS: f64 = 1.0;
/// Of every this many layers of a hybrid, the last is full attention and the others DeltaNet
/// when the file has no `{arch}.full_attention_interval` (llama.cpp's default for qwen35).
pub const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;
/// Gemma 3's default layer pattern: of every 6 blocks the first 5 are local (sliding-window)
/// and the 6th global (llama.cpp `llama_model_gemma3::load_arch_hparams`:
/// `load_swa_pattern(ml, 6)`; HF `Gemma3TextConfig.sliding_window_pattern = 6`).
pub const GEMMA3_SWA_PATTERN: u64 = 6;
/// gpt-oss's layer pattern: of every 2 blocks the first (even) is local and the second global
/// (llama.cpp `llama_model_openai_moe::load_arch_hparams`: `load_swa_pattern(ml, 2)`; HF
/// `GptOssConfig.layer_types` alternates `sliding_attention`, `full_attention`).
pub const GPT_OSS_SWA_PATTERN: u64 = 2;
/// RoPE base of Gemma 3's sliding-window layers when `{arch}.rope.freq_base_swa` is absent (llama.cpp's
/// `rope_freq_base_train_swa` default; HF `Gemma3TextConfig.rope_local_base_freq`).
const DEFAULT_ROPE_THETA_SWA: f64 = 10_000.0;
/// Gemma-3-27B's block count: llama.cpp scales its queries by `1/√(d_model / n_head)` (the
/// checkpoint's `query_pre_attn_scalar` 168) instead of `1/√head_dim`, and recognises the
/// model by this count (`LLM_TYPE_27B`); the GGUF has no key for the scalar.
const GEMMA3_27B_BLOCKS: usize = 62;

/// The key holding the vocabulary (its length is the vocabulary size).
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";
/// Prefix of per-block tensor names (`blk.N.attn_q.weight`).
const BLOCK_PREFIX: &str = "blk.";

/// Hyper-parameters of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual width.
    pub d_model: usize,
    /// FFN hidden width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA).
    pub n_head_kv: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Leading dims of each head that RoPE rotates.
    pub rope_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// NEOX pairing.
    pub rope_neox: bool,
    /// Context-extension scaling (`{arch}.rope.scaling.*`).
    pub rope_scaling: RopeScaling,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// Training context length.
    pub ctx_len: usize,
    /// Factor on the token embedding before the first block: √d_model for Gemma (computed in
    /// f32 as llama.cpp's `sqrtf(n_embd)`), 1 otherwise.
    pub embd_scale: f32,
    /// Scale of the attention scores: `1/√head_dim` (Gemma-3-27B: `1/√(d_model / n_head)`).
    pub attn_scale: f32,
    /// Sliding-window attention (Gemma 3's local layers); `None`: every layer is global.
    pub sliding_window: Option<SlidingWindow>,
    /// Final logit soft-capping `c · tanh(z / c)` (`{arch}.final_logit_softcapping`).
    pub final_logit_softcap: Option<f32>,
    /// The routed FFN of a Mixture-of-Experts model; `None`: every FFN is dense.
    pub moe: Option<MoeConfig>,
    /// The Gated DeltaNet layers of a hybrid model; `None`: every layer is attention.
    pub delta_net: Option<DeltaNetConfig>,
}

/// The Gated DeltaNet (linear attention) layers of a hybrid model (llama.cpp
/// `build_layer_attn_linear`, `build_delta_net_autoregressive`): per token, `qkv = W_qkv·x`
/// through a causal depthwise conv of `conv_kernel` taps and SiLU, q and k L2-normalised per
/// head, then per value head a `head_dim × head_dim` state `S ← e^g·S + k·(β(v − e^g·Sᵀk))ᵀ`
/// read out as `o = Sᵀq/√head_dim`, gated RMSNorm by `silu(z)`, `z = W_gate·x`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaNetConfig {
    /// Taps of the causal conv (`{arch}.ssm.conv_kernel`): the state keeps `conv_kernel − 1`
    /// past inputs.
    pub conv_kernel: usize,
    /// Query/key heads (`{arch}.ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`{arch}.ssm.time_step_rank`), a multiple of `n_k_heads`; which key head
    /// each reads is [`DeltaNetConfig::key_share`].
    pub n_v_heads: usize,
    /// How the value heads share the key heads.
    pub key_share: KeyHeadShare,
    /// Width of every q/k/v head (`{arch}.ssm.state_size`; `ssm.inner_size / time_step_rank`
    /// must equal it).
    pub head_dim: usize,
    /// Per layer, whether it is a DeltaNet layer (the others are gated attention): every
    /// `full_attention_interval`-th layer (default 4) is attention.
    pub recurrent: Vec<bool>,
}

impl DeltaNetConfig {
    /// Width of q (and of k): `n_k_heads × head_dim`.
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }

    /// Width of v, z and the output: `n_v_heads × head_dim`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }

    /// Channels of the conv (q, k and v together).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 values of one layer's state: the conv window and the value heads' matrices.
    pub fn state_values(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.n_v_heads * self.head_dim * self.head_dim
    }

    /// The key (and query) head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        match self.key_share {
            KeyHeadShare::Tiled => h % self.n_k_heads,
            KeyHeadShare::Grouped => h / (self.n_v_heads / self.n_k_heads),
        }
    }

    /// Whether layer `li` is a DeltaNet layer.
    pub fn is_recurrent(&self, li: usize) -> bool {
        self.recurrent.get(li).copied().unwrap_or(false)
    }
}

/// Which key head a DeltaNet value head reads when there are fewer key heads than value heads
/// (llama.cpp repeats q and k up to the value heads before the recurrence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeadShare {
    /// Value head `h` reads key head `h mod n_k_heads` (qwen35, qwen35moe: `ggml_repeat_4d`
    /// tiles the key heads; their converter reorders the value heads to match).
    Tiled,
    /// Value head `h` reads key head `h / (n_v_heads / n_k_heads)` (qwen3next: a
    /// repeat-interleave, HF's grouped order, `[k0_v0, k0_v1, k1_v2, k1_v3]` in llama.cpp's
    /// words).
    Grouped,
}

/// A Mixture-of-Experts FFN's shape and routing rule (llama.cpp `build_moe_ffn` with
/// softmax gating): `p = softmax(router · x)` over every expert, the `n_expert_used` largest
/// taken, their weights optionally renormalised to sum to 1, and the FFN's output
/// `Σ w_e · down_e(silu(gate_e · x) · up_e · x)`, plus the shared expert where there is one.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Routed experts a layer (`{arch}.expert_count`).
    pub n_expert: usize,
    /// Experts each token uses (`{arch}.expert_used_count`), `1..=n_expert`.
    pub n_expert_used: usize,
    /// Hidden width of one routed expert (`{arch}.expert_feed_forward_length`; llama.cpp's
    /// fallback `feed_forward_length / expert_used_count`; Mixtral: `feed_forward_length`).
    pub n_ff_exp: usize,
    /// Whether the selected weights are divided by their sum (Qwen3-MoE, Mixtral: yes;
    /// Qwen2-MoE: no — llama.cpp's `norm_w`).
    pub norm_topk: bool,
    /// Hidden width of the always-on shared expert (Qwen2-MoE, Qwen3.5-MoE, Qwen3-Next:
    /// `{arch}.expert_shared_feed_forward_length`, else `feed_forward_length`), `None` where
    /// the architecture has none. Its output is scaled by `sigmoid(ffn_gate_inp_shexp · x)`
    /// where the file has that tensor (GLM-4.5's is not gated).
    pub n_ff_shared: Option<usize>,
    /// How router logits become the scores the experts are chosen by and weighted with.
    pub gating: Gating,
    /// Factor on the chosen weights after any renormalisation (`{arch}.expert_weights_scale`,
    /// GLM-4.5's `routed_scaling_factor`; 1 where absent or 0, as llama.cpp skips the scale).
    pub weights_scale: f32,
    /// Leading layers whose FFN is dense, `n_ff` wide (`{arch}.leading_dense_block_count`,
    /// GLM-4.5's `first_k_dense_replace`); 0 for the other architectures.
    pub n_dense_lead: usize,
    /// The routed experts' gated activation.
    pub activation: ExpertActivation,
}

/// A routed FFN's gating: how the router's logits become per-expert scores (llama.cpp
/// `build_moe_ffn`). The chosen experts' scores are their weights; a layer's selection bias
/// (`exp_probs_b`), where it has one, is added to the scores for choosing only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// `softmax(logits)` over every expert (Qwen-MoE, Mixtral).
    Softmax,
    /// `sigmoid(logit)` per expert (GLM-4.5, DeepSeek-V3).
    Sigmoid,
    /// `SOFTMAX_WEIGHT` (gpt-oss): the `n_expert_used` largest logits, their weights a softmax
    /// over those alone.
    SoftmaxTopK,
}

/// The gated activation of a routed expert, `act(gate · x, up · x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertActivation {
    /// `silu(g) · u` (SwiGLU).
    Silu,
    /// gpt-oss's clamped SwiGLU (ggml `swiglu_oai`, see [`crate::ops::swiglu_oai`]).
    SwigluOai,
}

/// What the GPU refuses of a sigmoid-routed model (glm4moe): its routing kernel has the form
/// (`moe_route_f32` with a selection bias and a scale) and GPU-tier tests for it, which have not
/// yet run on a device; until they pass there, such a model runs on the CPU.
pub(crate) const SIGMOID_ROUTING_PENDING: &str =
    "sigmoid-routed Mixture-of-Experts layers (GLM-4.5's routing; built for the GPU, not yet \
     validated on one)";

/// What of gpt-oss only the CPU engine runs ([`ModelConfig::cpu_only_layers`]): the per-head
/// attention sinks, the router's and the experts' biases, the softmax over the top k logits and
/// the clamped `swiglu_oai` activation.
pub const GPT_OSS_CPU_ONLY: &str = "attention sinks, biased routers and experts (softmax over \
     the top-k logits, a bias after each projection) and the clamped swiglu_oai activation";

/// Which layers attend over a sliding window, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer's query sees, itself included (`{arch}.attention.sliding_window`):
    /// the query at `p` attends `p + 1 − window ..= p` (llama.cpp `LLAMA_SWA_TYPE_STANDARD`
    /// masks key `p0` when `p − p0 ≥ window`).
    pub window: usize,
    /// Per layer, whether it is local.
    pub local: Vec<bool>,
    /// RoPE base of the local layers (`{arch}.rope.freq_base_swa`); the global layers use
    /// [`ModelConfig::rope_theta`] with the file's RoPE scaling.
    pub rope_theta: f64,
    /// Whether the local layers apply the file's RoPE scaling too: gpt-oss's do (llama.cpp
    /// `rope_freq_scale_train_swa = rope_freq_scale_train`), Gemma 3's apply none
    /// (`rope_freq_scale_train_swa` = 1).
    pub scaled_rope: bool,
}

impl SlidingWindow {
    /// The RoPE scaling of the local layers, given the global layers' `scaling` and the
    /// trained context `ctx_len`.
    pub fn rope_scaling(&self, scaling: &RopeScaling, ctx_len: usize) -> RopeScaling {
        match self.scaled_rope {
            true => *scaling,
            false => RopeScaling::none(ctx_len),
        }
    }
}

/// `plain` for ordinary magnitudes, `sci` for tiny or huge ones (a message stays readable).
fn short(v: f64, plain: String, sci: String) -> String {
    if v == 0.0 || !v.is_finite() || (1e-3..1e6).contains(&v.abs()) {
        plain
    } else {
        sci
    }
}

fn bad(key: &str, problem: String) -> ModelError {
    ModelError::BadMetadata {
        key: key.to_owned(),
        problem,
    }
}

/// `v` as a size in `1..=max`, or an error naming `key`.
fn bounded(key: &str, v: u64, max: u64) -> Result<usize, ModelError> {
    if v == 0 || v > max {
        return Err(bad(key, format!("{v} is outside 1..={max}")));
    }
    usize::try_from(v).map_err(|_| bad(key, format!("{v} does not fit in memory sizes")))
}

/// Metadata reads for one architecture's `{arch}.*` keys, each checked as it is read.
struct Keys<'a> {
    idx: &'a GgufIndex,
    arch: &'static str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required size in `1..=max`.
    fn size(&self, k: &str, max: u64) -> Result<usize, ModelError> {
        let key = self.key(k);
        bounded(&key, self.idx.get_u64(&key)?, max)
    }

    /// An optional size in `1..=max` (present with another type is an error, not a default).
    fn opt_size(&self, k: &str, max: u64) -> Result<Option<usize>, ModelError> {
        match self.idx.get(&self.key(k)) {
            Some(_) => self.size(k, max).map(Some),
            None => Ok(None),
        }
    }

    /// An optional number that must satisfy `ok` (described by `rule`), else `default`.
    fn number(
        &self,
        k: &str,
        default: f64,
        rule: &str,
        ok: impl Fn(f64) -> bool,
    ) -> Result<f64, ModelError> {
        let key = self.key(k);
        if self.idx.get(&key).is_none() {
            return Ok(default);
        }
        let v = self.idx.get_f64(&key)?;
        if !ok(v) {
            // An f32 value is shown as the f32 it is (`-1e-5`, not its widened digits).
            let shown = match self.idx.get(&key) {
                Some(MetaValue::F32(x)) => short(f64::from(*x), x.to_string(), format!("{x:e}")),
                _ => short(v, v.to_string(), format!("{v:e}")),
            };
            return Err(bad(&key, format!("{shown} is not {rule}")));
        }
        Ok(v)
    }
}

impl ModelConfig {
    /// Read from metadata (`{arch}.*` keys; vocabulary size from the token list) and check
    /// every value against its limit (`MAX_*` above) and against the tensors in the file:
    /// `block_count` must equal the number of `blk.N` blocks present, and the widths must
    /// match `token_embd.weight` and block 0's projections. Hyper-parameters that are not
    /// finite or not positive are refused. Every failure names the key.
    pub fn from_gguf(idx: &GgufIndex) -> Result<ModelConfig, ModelError> {
        let arch = Arch::from_name(idx.get_str("general.architecture")?)?;
        let keys = Keys {
            idx,
            arch: arch.name(),
        };
        let key = |k: &str| keys.key(k);
        let blocks = keys.size("block_count", MAX_BLOCK_COUNT)?;
        // Qwen3.5 and GLM-4.5 files may append multi-token-prediction blocks after the
        // decoder's (`nextn_predict_layers`, counted in `block_count`): a draft head hipfire
        // does not run, so its blocks are not layers.
        let nextn_key = key("nextn_predict_layers");
        let nextn = match idx.get(&nextn_key) {
            None => 0,
            Some(_) => idx.get_u64(&nextn_key)?,
        };
        if nextn >= blocks as u64 {
            return Err(bad(
                &nextn_key,
                format!("{nextn} is not below block_count {blocks}"),
            ));
        }
        let n_layer = blocks - nextn as usize;
        check_block_count(idx, &key("block_count"), blocks, n_layer)?;
        let d_model = keys.size("embedding_length", MAX_EMBEDDING_LENGTH)?;
        let moe = moe_config(&keys, arch, n_layer)?;
        let delta_net = delta_net_config(&keys, arch, blocks, n_layer)?;
        if arch == Arch::Glm4Moe {
            refuse_mrope(&keys)?;
        }
        // A routed model's dense width is optional (llama.cpp reads it as a fallback only),
        // unless its leading layers are dense.
        let n_ff = match &moe {
            Some(m) if m.n_dense_lead == 0 => keys
                .opt_size("feed_forward_length", MAX_FEED_FORWARD_LENGTH)?
                .unwrap_or(m.n_ff_exp),
            _ => keys.size("feed_forward_length", MAX_FEED_FORWARD_LENGTH)?,
        };
        let n_head = keys.size("attention.head_count", MAX_HEAD_COUNT)?;
        let n_head_kv = keys
            .opt_size("attention.head_count_kv", MAX_HEAD_COUNT)?
            .unwrap_or(n_head);
        if n_head % n_head_kv != 0 {
            return Err(bad(
                &key("attention.head_count_kv"),
                format!("{n_head_kv} does not divide attention.head_count {n_head}"),
            ));
        }
        let head_dim = match keys.opt_size("attention.key_length", MAX_HEAD_DIM)? {
            Some(h) => h,
            None if d_model % n_head == 0 => d_model / n_head,
            None => {
                return Err(bad(
                    &key("attention.head_count"),
                    format!(
                        "embedding_length {d_model} is not a multiple of {n_head} heads \
                         (and attention.key_length is absent)"
                    ),
                ))
            }
        };
        if let Some(v) = keys.opt_size("attention.value_length", MAX_HEAD_DIM)? {
            if v != head_dim {
                return Err(bad(
                    &key("attention.value_length"),
                    format!(
                        "{v} differs from the key length {head_dim} (hipfire needs equal widths)"
                    ),
                ));
            }
        }
        let rope_dim = keys
            .opt_size("rope.dimension_count", MAX_HEAD_DIM)?
            .unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(bad(
                &key("rope.dimension_count"),
                format!("{rope_dim} is not an even number of at most the head width {head_dim}"),
            ));
        }
        let ctx_len = keys.size("context_length", MAX_CONTEXT_LENGTH)?;
        let vocab = match idx.get_array(TOKENS_KEY) {
            Ok(t) => bounded(TOKENS_KEY, t.len() as u64, MAX_VOCAB)?,
            Err(e) => match keys.opt_size("vocab_size", MAX_VOCAB)? {
                Some(v) => v,
                None => return Err(e.into()),
            },
        };
        let rope_theta = keys.number(
            "rope.freq_base",
            DEFAULT_ROPE_THETA,
            &format!("a finite number of at least {MIN_ROPE_FREQ_BASE}"),
            |v| v.is_finite() && v >= MIN_ROPE_FREQ_BASE,
        )?;
        let rms_eps = keys.number(
            "attention.layer_norm_rms_epsilon",
            DEFAULT_RMS_EPS,
            &format!("a finite number in (0, {MAX_RMS_EPS}] (as f32)"),
            // The f32 test also refuses values that underflow to zero in f32.
            |v| v.is_finite() && v <= MAX_RMS_EPS && (v as f32) > 0.0,
        )? as f32;
        let gemma = arch == Arch::Gemma3;
        let sliding_window = match arch {
            Arch::Gemma3 | Arch::GptOss => sliding_window(&keys, arch, n_layer, rope_theta)?,
            _ => None,
        };
        // llama.cpp reads the soft-cap for Gemma 2/3 only; 0 (or absent) means none.
        let final_logit_softcap = if gemma {
            let cap = keys.number(
                "final_logit_softcapping",
                0.0,
                "a finite number ≥ 0",
                |v| v.is_finite() && v >= 0.0,
            )? as f32;
            (cap > 0.0).then_some(cap)
        } else {
            None
        };
        let attn_scale = if gemma && n_layer == GEMMA3_27B_BLOCKS {
            1.0 / ((d_model / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let config = ModelConfig {
            rope_scaling: RopeScaling::from_gguf(idx, arch.name(), ctx_len)?,
            arch,
            n_layer,
            d_model,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            rope_dim,
            rope_theta,
            rope_neox: arch.rope_neox(),
            rms_eps,
            vocab,
            ctx_len,
            embd_scale: if gemma { (d_model as f32).sqrt() } else { 1.0 },
            attn_scale,
            sliding_window,
            final_logit_softcap,
            moe,
            delta_net,
        };
        config.check_widths(idx, &key)?;
        Ok(config)
    }

    /// The widths against `token_embd.weight` and block 0's projections, naming the key that
    /// disagrees (a missing tensor is left to the loader, which names it).
    fn check_widths(
        &self,
        idx: &GgufIndex,
        key: &dyn Fn(&str) -> String,
    ) -> Result<(), ModelError> {
        let dims = |name: &str| idx.tensor(name).map(|t| t.dims.as_slice());
        if let Some(&[k, rows]) = dims("token_embd.weight") {
            if k != self.d_model as u64 {
                return Err(bad(
                    &key("embedding_length"),
                    format!("is {}, but token_embd.weight has rows of {k}", self.d_model),
                ));
            }
            if rows != self.vocab as u64 {
                return Err(bad(
                    TOKENS_KEY,
                    format!(
                        "has {} tokens, but token_embd.weight has {rows} rows",
                        self.vocab
                    ),
                ));
            }
        }
        let q_check = match self.delta_net {
            // Block 0 of a hybrid is a DeltaNet layer, and its gated query is twice as wide:
            // the loader checks those shapes by name.
            Some(_) => "",
            None => "blk.0.attn_q.weight",
        };
        // The first routed layer's router (GLM-4.5's leading layers are dense).
        let router = format!(
            "blk.{}.ffn_gate_inp.weight",
            self.moe.as_ref().map_or(0, |m| m.n_dense_lead)
        );
        let mut checks = vec![
            (
                q_check,
                self.q_dim(),
                "attention.head_count",
                format!(
                    "{} heads × width {} = {} rows",
                    self.n_head,
                    self.head_dim,
                    self.q_dim()
                ),
            ),
            (
                if self.delta_net.is_some() {
                    ""
                } else {
                    "blk.0.attn_k.weight"
                },
                self.kv_dim(),
                "attention.head_count_kv",
                format!(
                    "{} kv heads × width {} = {} rows",
                    self.n_head_kv,
                    self.head_dim,
                    self.kv_dim()
                ),
            ),
            (
                "blk.0.ffn_up.weight",
                self.n_ff,
                "feed_forward_length",
                format!("is {}", self.n_ff),
            ),
        ];
        if let Some(m) = &self.moe {
            checks.push((
                router.as_str(),
                m.n_expert,
                "expert_count",
                format!("is {}", m.n_expert),
            ));
        }
        for (tensor, want, k, what) in checks {
            if let Some(&[_, rows]) = dims(tensor) {
                if rows != want as u64 {
                    return Err(bad(
                        &key(k),
                        format!("{what}, but {tensor} has {rows} rows"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The window layer `li` attends over, `None` for a global layer.
    pub fn layer_window(&self, li: usize) -> Option<usize> {
        let sw = self.sliding_window.as_ref()?;
        sw.local
            .get(li)
            .copied()
            .unwrap_or(false)
            .then_some(sw.window)
    }

    /// What in this model only the CPU engine runs (`None`: the GPU runs all of it). A hybrid
    /// model's Gated DeltaNet and gated attention layers run on both; its routed FFNs (qwen35moe,
    /// qwen3next) only on the CPU so far.
    pub fn cpu_only_layers(&self) -> Option<&'static str> {
        // Routed experts with softmax gating (and ungated shared experts, leading dense layers)
        // and hybrid layers each run on both engines; a hybrid model's routed FFNs, sigmoid
        // routing (built on the GPU, not yet run there against the CPU engine) and gpt-oss's
        // pieces only on the CPU so far.
        if self.delta_net.is_some() && self.moe.is_some() {
            return Some(
                "the Mixture-of-Experts FFNs of this hybrid model (its Gated DeltaNet and gated \
                 attention layers run on the GPU, as do other models' routed FFNs, but the two \
                 are not validated together there yet)",
            );
        }
        if self
            .moe
            .as_ref()
            .is_some_and(|m| m.gating == Gating::Sigmoid)
        {
            return Some(SIGMOID_ROUTING_PENDING);
        }
        let oai_experts = self.moe.as_ref().is_some_and(|m| {
            m.gating == Gating::SoftmaxTopK || m.activation == ExpertActivation::SwigluOai
        });
        (self.arch == Arch::GptOss || oai_experts).then_some(GPT_OSS_CPU_ONLY)
    }

    /// Layers with a KV cache (all but a hybrid's DeltaNet layers).
    pub fn n_attention_layers(&self) -> usize {
        match &self.delta_net {
            Some(dn) => (0..self.n_layer).filter(|&i| !dn.is_recurrent(i)).count(),
            None => self.n_layer,
        }
    }

    /// Bytes of recurrent state one sequence holds (f32, every DeltaNet layer), whatever its
    /// length: counted beside the KV cache.
    pub fn recurrent_bytes_per_sequence(&self) -> usize {
        match &self.delta_net {
            Some(dn) => {
                let layers = self.n_layer - self.n_attention_layers();
                layers * dn.state_values() * std::mem::size_of::<f32>()
            }
            None => 0,
        }
    }

    /// Bytes of one [`SessionSnapshot`](crate::model::SessionSnapshot): the recurrent state,
    /// the residual stream (`d_model` floats) and the logits (`vocab` floats). An attention-only
    /// model's snapshot holds no KV (positions are kept in place), only those two vectors.
    pub fn snapshot_bytes(&self) -> usize {
        self.recurrent_bytes_per_sequence()
            + (self.d_model + self.vocab) * std::mem::size_of::<f32>()
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// The routed FFN's shape from `{arch}.expert_*` keys, each bounded before it sizes anything:
/// required for the MoE architectures, `None` for a `llama` file without experts (or with
/// `expert_count` 0), refused for the other dense architectures if they declare experts.
fn moe_config(
    keys: &Keys<'_>,
    arch: Arch,
    n_layer: usize,
) -> Result<Option<MoeConfig>, ModelError> {
    let count_key = keys.key("expert_count");
    let declared = match keys.idx.get(&count_key) {
        None => 0,
        Some(_) => keys.idx.get_u64(&count_key)?,
    };
    if declared == 0 {
        return match arch.always_moe() {
            true => Err(bad(
                &count_key,
                "is absent or 0, but the architecture routes every FFN over experts".into(),
            )),
            false => Ok(None),
        };
    }
    if !arch.always_moe() && arch != Arch::Llama {
        return Err(ModelError::Unsupported(format!(
            "{} with routed experts ({count_key} = {declared})",
            arch.name()
        )));
    }
    let n_expert = bounded(&count_key, declared, MAX_EXPERT_COUNT)?;
    let n_expert_used = keys.size("expert_used_count", n_expert as u64)?;
    // llama.cpp routes within the best `expert_group_used_count` of `expert_group_count`
    // groups when there are more than one (DeepSeek-V3); hipfire ranks every expert at once.
    let groups_key = keys.key("expert_group_count");
    if keys.idx.get(&groups_key).is_some() {
        let groups = keys.idx.get_u64(&groups_key)?;
        if groups > 1 {
            return Err(ModelError::Unsupported(format!(
                "group-limited expert routing ({groups_key} = {groups})"
            )));
        }
    }
    let n_ff_exp = match arch {
        // Mixtral's experts are as wide as the model's FFN (llama.cpp `ffn_*_exps` {n_embd, n_ff}).
        Arch::Llama => keys.size("feed_forward_length", MAX_FEED_FORWARD_LENGTH)?,
        _ => match keys.opt_size("expert_feed_forward_length", MAX_FEED_FORWARD_LENGTH)? {
            Some(w) => w,
            None => {
                let ff = keys.size("feed_forward_length", MAX_FEED_FORWARD_LENGTH)?;
                if ff < n_expert_used {
                    return Err(bad(
                        &keys.key("feed_forward_length"),
                        format!(
                            "{ff} is narrower than expert_used_count {n_expert_used} (and \
                             expert_feed_forward_length is absent)"
                        ),
                    ));
                }
                ff / n_expert_used
            }
        },
    };
    let n_ff_shared = match arch {
        // llama.cpp requires the shared expert of these, `feed_forward_length` wide when the
        // key is absent.
        Arch::Qwen2Moe | Arch::Qwen35Moe | Arch::Qwen3Next => Some(
            match keys.opt_size("expert_shared_feed_forward_length", MAX_FEED_FORWARD_LENGTH)? {
                Some(w) => w,
                None => keys.size("feed_forward_length", MAX_FEED_FORWARD_LENGTH)?,
            },
        ),
        Arch::Glm4Moe => Some(glm_shared_width(keys, n_ff_exp)?),
        _ => None,
    };
    let gpt_oss = arch == Arch::GptOss;
    let mut moe = MoeConfig {
        n_expert,
        n_expert_used,
        n_ff_exp,
        // gpt-oss's weights are already a softmax over the k (llama.cpp passes norm_w false).
        norm_topk: !matches!(arch, Arch::Qwen2Moe | Arch::GptOss),
        n_ff_shared,
        gating: match gpt_oss {
            true => Gating::SoftmaxTopK,
            false => Gating::Softmax,
        },
        weights_scale: 1.0,
        n_dense_lead: 0,
        activation: match gpt_oss {
            true => ExpertActivation::SwigluOai,
            false => ExpertActivation::Silu,
        },
    };
    if arch == Arch::Glm4Moe {
        glm_routing(keys, n_layer, &mut moe)?;
    }
    Ok(Some(moe))
}

/// GLM-4.5's shared expert: `expert_shared_count` (required, as llama.cpp reads it) experts of
/// `expert_feed_forward_length` each, one FFN of their total width.
fn glm_shared_width(keys: &Keys<'_>, n_ff_exp: usize) -> Result<usize, ModelError> {
    let count = keys.size("expert_shared_count", MAX_SHARED_EXPERTS)?;
    match n_ff_exp.checked_mul(count) {
        Some(w) if w as u64 <= MAX_FEED_FORWARD_LENGTH => Ok(w),
        _ => Err(bad(
            &keys.key("expert_shared_count"),
            format!(
                "{count} shared experts of width {n_ff_exp} are wider than \
                 {MAX_FEED_FORWARD_LENGTH}"
            ),
        )),
    }
}

/// GLM-4.5's routing keys, as llama.cpp's `llama_model_glm4_moe::load_arch_hparams` reads
/// them (every one optional): the gating function (none means sigmoid), whether the chosen
/// weights are renormalised (default no), their scale (0 or absent: none), and how many
/// leading layers have a dense FFN (at most `n_layer`, the decoder's blocks).
fn glm_routing(keys: &Keys<'_>, n_layer: usize, moe: &mut MoeConfig) -> Result<(), ModelError> {
    let gating_key = keys.key("expert_gating_func");
    moe.gating = match keys.idx.get(&gating_key) {
        None => Gating::Sigmoid,
        Some(_) => match keys.idx.get_u64(&gating_key)? {
            GATING_NONE | GATING_SIGMOID => Gating::Sigmoid,
            GATING_SOFTMAX => Gating::Softmax,
            GATING_SOFTMAX_WEIGHT => {
                return Err(ModelError::Unsupported(format!(
                    "{gating_key} = {GATING_SOFTMAX_WEIGHT} (softmax over the chosen logits)"
                )))
            }
            GATING_SQRT_SOFTPLUS => {
                return Err(ModelError::Unsupported(format!(
                    "{gating_key} = {GATING_SQRT_SOFTPLUS} (sqrt-softplus gating)"
                )))
            }
            other => {
                return Err(bad(
                    &gating_key,
                    format!("{other} is not a gating function (0 to {GATING_SQRT_SOFTPLUS})"),
                ))
            }
        },
    };
    let norm_key = keys.key("expert_weights_norm");
    moe.norm_topk = match keys.idx.get(&norm_key) {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| bad(&norm_key, format!("holds {v:?}, not a bool")))?,
    };
    let scale = keys.number(
        "expert_weights_scale",
        0.0,
        &format!("a finite number in [0, {MAX_EXPERT_WEIGHTS_SCALE}]"),
        |v| v.is_finite() && (0.0..=MAX_EXPERT_WEIGHTS_SCALE).contains(&v),
    )? as f32;
    moe.weights_scale = if scale == 0.0 { 1.0 } else { scale };
    let lead_key = keys.key("leading_dense_block_count");
    moe.n_dense_lead = match keys.idx.get(&lead_key) {
        None => 0,
        Some(_) => match keys.idx.get_u64(&lead_key)? {
            v if v <= n_layer as u64 => v as usize,
            v => {
                return Err(bad(
                    &lead_key,
                    format!("{v} is more than the {n_layer} decoder blocks"),
                ))
            }
        },
    };
    Ok(())
}

/// GLM-4.5's M-RoPE (`{arch}.rope.dimension_sections` with a non-zero section: the vision
/// variants' position ids per section) is refused; text files carry none, or all zeros, and
/// llama.cpp then uses plain NEOX RoPE.
fn refuse_mrope(keys: &Keys<'_>) -> Result<(), ModelError> {
    let key = keys.key("rope.dimension_sections");
    let Some(v) = keys.idx.get(&key) else {
        return Ok(());
    };
    let sections = v
        .as_array()
        .ok_or_else(|| bad(&key, format!("holds {v:?}, not an array")))?;
    if sections.iter().any(|s| s.as_f64() != Some(0.0)) {
        return Err(ModelError::Unsupported(format!(
            "{} with M-RoPE sections ({key})",
            keys.arch
        )));
    }
    Ok(())
}

/// The DeltaNet layers of a hybrid architecture from `{arch}.ssm.*` and
/// `{arch}.full_attention_interval`, each bounded before it sizes anything; `None` for the
/// other architectures.
fn delta_net_config(
    keys: &Keys<'_>,
    arch: Arch,
    blocks: usize,
    n_layer: usize,
) -> Result<Option<DeltaNetConfig>, ModelError> {
    if !arch.hybrid() {
        return Ok(None);
    }
    let conv_kernel = keys.size("ssm.conv_kernel", MAX_CONV_KERNEL)?;
    if conv_kernel < 2 {
        return Err(bad(
            &keys.key("ssm.conv_kernel"),
            format!("{conv_kernel} taps: a causal conv with state needs at least 2"),
        ));
    }
    let head_dim = keys.size("ssm.state_size", MAX_HEAD_DIM)?;
    let n_k_heads = keys.size("ssm.group_count", MAX_HEAD_COUNT)?;
    let n_v_heads = keys.size("ssm.time_step_rank", MAX_HEAD_COUNT)?;
    if n_v_heads % n_k_heads != 0 {
        return Err(bad(
            &keys.key("ssm.time_step_rank"),
            format!("{n_v_heads} value heads are not a multiple of ssm.group_count {n_k_heads}"),
        ));
    }
    let inner = keys.size("ssm.inner_size", MAX_HEAD_COUNT * MAX_HEAD_DIM)?;
    if inner != n_v_heads * head_dim {
        return Err(bad(
            &keys.key("ssm.inner_size"),
            format!(
                "{inner} is not ssm.time_step_rank {n_v_heads} × ssm.state_size {head_dim} \
                 (hipfire needs value heads as wide as the state)"
            ),
        ));
    }
    let interval_key = keys.key("full_attention_interval");
    let interval = match keys.idx.get(&interval_key) {
        None => DEFAULT_FULL_ATTENTION_INTERVAL,
        Some(_) => bounded(
            &interval_key,
            keys.idx.get_u64(&interval_key)?,
            MAX_BLOCK_COUNT,
        )?,
    };
    let recurrent = match recurrent_layers(keys, blocks)? {
        Some(flags) => flags[..n_layer].to_vec(),
        None => (0..n_layer).map(|i| (i + 1) % interval != 0).collect(),
    };
    let key_share = match arch {
        Arch::Qwen3Next => KeyHeadShare::Grouped,
        _ => KeyHeadShare::Tiled,
    };
    Ok(Some(DeltaNetConfig {
        conv_kernel,
        n_k_heads,
        n_v_heads,
        key_share,
        head_dim,
        recurrent,
    }))
}

/// `{arch}.attention.recurrent_layers`, one bool per block (`block_count`, the trailing
/// multi-token-prediction blocks included, as the converter writes it from HF `layer_types`),
/// or `None` when absent; llama.cpp prefers it to `full_attention_interval`.
fn recurrent_layers(keys: &Keys<'_>, blocks: usize) -> Result<Option<Vec<bool>>, ModelError> {
    let key = keys.key("attention.recurrent_layers");
    match keys.idx.get(&key) {
        None => Ok(None),
        Some(MetaValue::Array(_, flags)) => layer_flags(&key, flags, blocks).map(Some),
        Some(_) => Err(bad(&key, "is not an array of bools".into())),
    }
}

/// One bool per block from the array `flags` of `key`, which must hold exactly `blocks`.
fn layer_flags(key: &str, flags: &[MetaValue], blocks: usize) -> Result<Vec<bool>, ModelError> {
    if flags.len() != blocks {
        return Err(bad(
            key,
            format!("has {} flags for {blocks} blocks", flags.len()),
        ));
    }
    flags
        .iter()
        .map(|f| {
            f.as_bool()
                .ok_or_else(|| bad(key, format!("holds {f:?}, not a bool")))
        })
        .collect()
}

/// The sliding-window layout of Gemma 3 and gpt-oss, as their llama.cpp `load_arch_hparams`:
/// `attention.sliding_window_pattern` is either a bool per layer or a period `n` (default
/// [`GEMMA3_SWA_PATTERN`], gpt-oss [`GPT_OSS_SWA_PATTERN`]) where layer `il` is local when
/// `il % n < n − 1` (0: every layer local, llama.cpp's `set_swa_pattern`). Gemma 3 without a
/// window (absent or 0) is global everywhere; gpt-oss requires one (llama.cpp reads the key as
/// required, and a window of 0 would mask every position). The local layers' RoPE base is
/// `rope.freq_base_swa`, defaulting to [`DEFAULT_ROPE_THETA_SWA`] for Gemma 3 and to
/// `rope_theta` for gpt-oss (llama.cpp `rope_freq_base_train_swa = rope_freq_base_train`).
fn sliding_window(
    keys: &Keys<'_>,
    arch: Arch,
    n_layer: usize,
    rope_theta: f64,
) -> Result<Option<SlidingWindow>, ModelError> {
    let gpt_oss = arch == Arch::GptOss;
    let wkey = keys.key("attention.sliding_window");
    let window = match keys.idx.get(&wkey) {
        None if gpt_oss => keys.size("attention.sliding_window", MAX_CONTEXT_LENGTH)?,
        None => return Ok(None),
        Some(_) => match keys.idx.get_u64(&wkey)? {
            0 if !gpt_oss => return Ok(None),
            w => bounded(&wkey, w, MAX_CONTEXT_LENGTH)?,
        },
    };
    let pkey = keys.key("attention.sliding_window_pattern");
    let local: Vec<bool> = match keys.idx.get(&pkey) {
        Some(MetaValue::Array(_, flags)) => layer_flags(&pkey, flags, n_layer)?,
        other => {
            let n = match other {
                None if gpt_oss => GPT_OSS_SWA_PATTERN,
                None => GEMMA3_SWA_PATTERN,
                Some(_) => keys.idx.get_u64(&pkey)?,
            };
            if n > MAX_BLOCK_COUNT {
                return Err(bad(&pkey, format!("{n} is outside 0..={MAX_BLOCK_COUNT}")));
            }
            let n = n as usize;
            (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
        }
    };
    let rope_theta = keys.number(
        "rope.freq_base_swa",
        if gpt_oss {
            rope_theta
        } else {
            DEFAULT_ROPE_THETA_SWA
        },
        &format!("a finite number of at least {MIN_ROPE_FREQ_BASE}"),
        |v| v.is_finite() && v >= MIN_ROPE_FREQ_BASE,
    )?;
    Ok(Some(SlidingWindow {
        window,
        local,
        rope_theta,
        scaled_rope: gpt_oss,
    }))
}

/// `block_count` against the `blk.N.*` tensors: the blocks present must be exactly
/// `blk.0 … blk.{n_layer - 1}` (fewer would silently drop layers, more would leave tensors
/// unused; llama.cpp refuses both through its tensor count check), or only the `decoder`
/// blocks when the file declares NextN blocks but carries none of their tensors (llama.cpp's
/// GLM-4.5 loader accepts such a "trunk only" file).
fn check_block_count(
    idx: &GgufIndex,
    key: &str,
    n_layer: usize,
    decoder: usize,
) -> Result<(), ModelError> {
    let mut blocks = std::collections::BTreeSet::new();
    for t in &idx.tensors {
        let Some(rest) = t.name.strip_prefix(BLOCK_PREFIX) else {
            continue;
        };
        let number = rest.split('.').next().unwrap_or("");
        let i: usize = number.parse().map_err(|_| {
            ModelError::Unsupported(format!(
                "tensor {} has no block number after {BLOCK_PREFIX}",
                Quoted::new(&t.name)
            ))
        })?;
        blocks.insert(i);
    }
    match blocks.last() {
        Some(&last) if blocks.len() == last + 1 && (last + 1 == n_layer || last + 1 == decoder) => {
            Ok(())
        }
        Some(&last) => Err(bad(
            key,
            format!(
                "is {n_layer}, but the file has tensors of {} blocks, numbered blk.0 to blk.{last}",
                blocks.len()
            ),
        )),
        None => Err(bad(
            key,
            format!("is {n_layer}, but the file has no blk.N tensors"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, MetaValueType};

    fn index(meta: &[(&str, MetaValue)]) -> GgufIndex {
        index_for("gemma3", meta)
    }

    fn index_for(prefix: &str, meta: &[(&str, MetaValue)]) -> GgufIndex {
        let meta: Vec<(String, MetaValue)> = meta
            .iter()
            .map(|(k, v)| (format!("{prefix}.{k}"), v.clone()))
            .collect();
        let bytes = GgufWriter::new(Vec::new(), &meta, &[])
            .and_then(GgufWriter::finish)
            .expect("write metadata");
        GgufIndex::parse(&bytes).expect("parse metadata")
    }

    fn window(
        meta: &[(&str, MetaValue)],
        n_layer: usize,
    ) -> Result<Option<SlidingWindow>, ModelError> {
        let idx = index(meta);
        sliding_window(
            &Keys {
                idx: &idx,
                arch: "gemma3",
            },
            Arch::Gemma3,
            n_layer,
            DEFAULT_ROPE_THETA,
        )
    }

    fn bad_key(r: Result<Option<SlidingWindow>, ModelError>) -> String {
        match r {
            Err(ModelError::BadMetadata { key, .. }) => key,
            other => panic!("accepted or wrong error: {other:?}"),
        }
    }

    /// llama.cpp's layouts: the default period 6 (every 6th block global), a period from the
    /// file, 0 (all local), a per-layer bool array; no window or 0 means all global.
    #[test]
    fn sliding_window_layouts_follow_llama_cpp() {
        let w = |v| ("attention.sliding_window", MetaValue::U32(v));
        let sw = window(&[w(512)], 18).expect("ok").expect("window");
        assert_eq!((sw.window, sw.rope_theta), (512, 10_000.0));
        let global: Vec<usize> = (0..18).filter(|&i| !sw.local[i]).collect();
        assert_eq!(global, [5, 11, 17]);
        let p = |v| ("attention.sliding_window_pattern", MetaValue::U32(v));
        let sw = window(&[w(64), p(3)], 7).expect("ok").expect("window");
        assert_eq!(sw.local, [true, true, false, true, true, false, true]);
        let sw = window(&[w(64), p(0)], 3).expect("ok").expect("window");
        assert_eq!(sw.local, [true; 3]);
        let flags = MetaValue::Array(
            MetaValueType::Bool,
            [false, true, true].map(MetaValue::Bool).to_vec(),
        );
        let theta = ("rope.freq_base_swa", MetaValue::F32(2_000.0));
        let sw = window(
            &[w(8), ("attention.sliding_window_pattern", flags), theta],
            3,
        )
        .expect("ok")
        .expect("window");
        assert_eq!(
            (sw.local.as_slice(), sw.rope_theta),
            (&[false, true, true][..], 2_000.0)
        );
        assert_eq!(window(&[w(0)], 3).expect("ok"), None);
        assert_eq!(window(&[], 3).expect("ok"), None);
    }

    /// gpt-oss (llama.cpp `load_swa_pattern(ml, 2)`): even layers local by default, the local
    /// base the global one unless the file says, the file's RoPE scaling on both; the window
    /// is required and 0 refused.
    #[test]
    fn gpt_oss_windows_alternate_and_share_the_rope() {
        let w = |v| ("attention.sliding_window", MetaValue::U32(v));
        let win = |meta: &[(&str, MetaValue)]| {
            let idx = index_for("gpt-oss", meta);
            let keys = Keys {
                idx: &idx,
                arch: "gpt-oss",
            };
            sliding_window(&keys, Arch::GptOss, 5, 150_000.0)
        };
        let sw = win(&[w(128)]).expect("ok").expect("window");
        assert_eq!(sw.local, [true, false, true, false, true]);
        assert_eq!(
            (sw.window, sw.rope_theta, sw.scaled_rope),
            (128, 150_000.0, true)
        );
        let yarn = RopeScaling {
            kind: crate::rope::RopeScalingKind::Yarn,
            factor: 32.0,
            ..RopeScaling::none(4096)
        };
        assert_eq!(sw.rope_scaling(&yarn, 131_072), yarn);
        let theta = ("rope.freq_base_swa", MetaValue::F32(1_000.0));
        let sw = win(&[w(128), theta]).expect("ok").expect("window");
        assert_eq!(sw.rope_theta, 1_000.0);
        for bad in [vec![], vec![w(0)]] {
            assert!(win(&bad).is_err(), "{bad:?}");
        }
        // Gemma 3's local layers keep no scaling.
        let g = window(&[w(64)], 2).expect("ok").expect("window");
        assert_eq!(g.rope_scaling(&yarn, 256), RopeScaling::none(256));
    }

    #[test]
    fn bad_sliding_window_metadata_is_refused_by_key() {
        let w = |v| ("attention.sliding_window", MetaValue::U32(v));
        assert_eq!(
            bad_key(window(&[w(MAX_CONTEXT_LENGTH as u32 + 1)], 3)),
            "gemma3.attention.sliding_window"
        );
        let flags = MetaValue::Array(MetaValueType::Bool, vec![MetaValue::Bool(true); 2]);
        assert_eq!(
            bad_key(window(
                &[w(8), ("attention.sliding_window_pattern", flags)],
                3
            )),
            "gemma3.attention.sliding_window_pattern"
        );
        let not_bools = MetaValue::Array(MetaValueType::U32, vec![MetaValue::U32(1); 3]);
        assert_eq!(
            bad_key(window(
                &[w(8), ("attention.sliding_window_pattern", not_bools)],
                3
            )),
            "gemma3.attention.sliding_window_pattern"
        );
        assert_eq!(
            bad_key(window(
                &[
                    w(8),
                    ("attention.sliding_window_pattern", MetaValue::U32(5000))
                ],
                3
            )),
            "gemma3.attention.sliding_window_pattern"
        );
        assert_eq!(
            bad_key(window(
                &[w(8), ("rope.freq_base_swa", MetaValue::F32(0.5))],
                3
            )),
            "gemma3.rope.freq_base_swa"
        );
    }
}
