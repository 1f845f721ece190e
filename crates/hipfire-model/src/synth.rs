//! Synthetic GGUFs: a real architecture's shapes, random weights in a chosen format, and a
//! minimal vocabulary, for performance work on models we do not have (or cannot ship).
//!
//! Every file says what it is: `general.description` = [`SYNTH_DESCRIPTION`] and
//! `hipfire.synthetic = true`, and [`crate::Model::placement_summary`] of such a file starts
//! with `[SYNTHETIC]`, so a benchmark record made with one cannot pass for a real model.
//!
//! The file is written as a stream (header, then each tensor in order, a batch of rows at a
//! time): an 8B Q4_K file is ~4.6 GB and never sits in memory.
//!
//! Matrix rows are random draws from a pool of [`POOL_BLOCKS`] blocks, each quantised once
//! from random values with hipfire-quant's own quantiser — so every block is a valid block of
//! the format, without this module knowing any layout. Quantising every value instead was
//! measured at 8.6 M params/s for Q4_K on this 2-core box (97 % of the time in the K-quant
//! scale search): ~15 min for Llama-3-8B, where drawing blocks is bound by the disk. Rows are
//! assembled in parallel with rayon (write-time work, not the decode path); each row's draws
//! come from its own seeded RNG, so the bytes do not depend on the thread count.

use std::io::BufWriter;
use std::path::Path;

use hipfire_quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::config::Arch;
use crate::gguf::{GgmlType, GgufWriter, MetaValue, MetaValueType, TensorSpec};
use crate::rope::{RopeScaling, RopeScalingKind, DEFAULT_YARN_BETA_FAST, DEFAULT_YARN_BETA_SLOW};
use crate::ModelError;

/// `general.description` of every synthetic file.
pub const SYNTH_DESCRIPTION: &str =
    "SYNTHETIC random weights - for performance work only, outputs are meaningless";
/// Metadata flag of synthetic files.
pub const SYNTH_KEY: &str = "hipfire.synthetic";
/// Standard deviation of the random weights: the usual transformer init (GPT-2 / Llama use
/// N(0, 0.02)); it keeps activations finite through many layers so decode timings exercise
/// the same code paths as a real model.
const WEIGHT_STD: f32 = 0.02;
/// Rows generated per batch before writing: bounds memory to about this many rows of f32.
const ROWS_PER_BATCH: usize = 256;
/// Distinct quantised blocks rows are drawn from: enough that neighbouring rows share no
/// pattern a cache or predictor could exploit (4096 × 144 B = 576 KiB for Q4_K), small enough
/// to quantise in well under a second.
pub const POOL_BLOCKS: usize = 4096;
/// Sliding window of a synthetic Gemma 3 (positions): shorter than the tests' prompts (33 to
/// 70 tokens), so the local layers' window is exercised; a real Gemma 3 has 512 or 1024.
pub const SYNTH_GEMMA3_WINDOW: usize = 24;
/// Layer pattern of a synthetic Gemma 3: of every 2 blocks the first is local, so even the
/// 2-block tiny model has one local and one global layer (real ones use 6).
const SYNTH_GEMMA3_SWA_PATTERN: usize = 2;
/// Sliding window of a synthetic gpt-oss (positions): as [`SYNTH_GEMMA3_WINDOW`], shorter
/// than the tests' 64-token prompts so the even (local) layers' window is exercised; the real
/// ones use 128.
pub const SYNTH_GPT_OSS_WINDOW: usize = 24;
/// YaRN of the tiny gpt-oss: a trained context of 64 stretched 4× to the tiny presets' 256, so
/// the ramp between kept and interpolated frequencies falls inside the 32 pairs of a 64-wide
/// head (the real model stretches 4096 by 32).
const TINY_GPT_OSS_YARN: (f64, usize) = (4.0, 64);
/// Experts a layer of the tiny MoE presets: enough that routing chooses (2 of 8), few
/// enough that a test's handful of tokens reaches most of them.
const TINY_EXPERTS: usize = 8;
/// Experts a token uses in the tiny MoE presets.
const TINY_EXPERTS_USED: usize = 2;
/// The DeltaNet of the published Qwen hybrids, Qwen3.5-9B and Qwen3-Next-80B-A3B alike (their
/// `config.json`: `linear_num_key_heads` 16, `linear_num_value_heads` 32, key and value heads
/// of 128, `linear_conv_kernel_dim` 4, `full_attention_interval` 4).
const PUBLISHED_DELTA_NET: SynthDeltaNet = SynthDeltaNet {
    conv_kernel: 4,
    n_k_heads: 16,
    n_v_heads: 32,
    head_dim: 128,
    interval: 4,
    fused_qkvz: false,
};
/// `expert_weights_scale` of the tiny GLM model: GLM-4.5's `routed_scaling_factor` (2.5,
/// slime `scripts/models/glm4.5-355B-A32B.sh`), not 1, so a scale left out shows.
const TINY_GLM_WEIGHTS_SCALE: f32 = 2.5;
/// Half-width of a synthetic `exp_probs_b` (uniform): the tiny models' sigmoid scores spread
/// about ±0.1 around 0.5, so a bias this wide reorders the choice for many tokens, while the
/// weights stay the unbiased scores; a near-zero bias would leave the rule untested.
const SYNTH_SELECTION_BIAS: f32 = 0.25;
/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`, as the GLM-4.5 converter writes it.
const SYNTH_GATING_SIGMOID: usize = 2;
/// GGML type id of f32 (norms and biases stay f32, as in converted models).
const GGML_F32: u32 = 0;

/// Shape of a synthetic model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// `general.name` (prefixed with `synthetic-`).
    pub name: String,
    /// Architecture (sets RoPE style, q/k norms for Qwen3, biases for Qwen2).
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual width.
    pub d_model: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length written to the metadata.
    pub ctx_len: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// Whether the head reuses the embedding (no `output.weight`).
    pub tied_embeddings: bool,
    /// RoPE context-extension scaling written as `{arch}.rope.scaling.*` (nothing is written
    /// when its kind is `None`).
    pub rope_scaling: RopeScaling,
    /// Routed experts in every layer's FFN (`None`: dense).
    pub moe: Option<SynthMoe>,
    /// Gated DeltaNet layers of a hybrid (Qwen3.5) model (`None`: every layer attention).
    pub delta_net: Option<SynthDeltaNet>,
    /// Leading dims of each head that RoPE rotates (`None`: all of them).
    pub rope_dim: Option<usize>,
    /// gpt-oss's `attention.sliding_window` (`None` for the others; Gemma 3's is
    /// [`SYNTH_GEMMA3_WINDOW`]).
    pub sliding_window: Option<usize>,
}

/// YaRN by `factor` over an original context of `orig` positions, default betas.
fn yarn(factor: f64, orig: usize) -> RopeScaling {
    RopeScaling {
        kind: RopeScalingKind::Yarn,
        factor,
        orig_ctx: orig,
        ..RopeScaling::none(orig)
    }
}

/// The Gated DeltaNet layers of a synthetic hybrid model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthDeltaNet {
    /// Conv taps.
    pub conv_kernel: usize,
    /// Query/key heads.
    pub n_k_heads: usize,
    /// Value heads (a multiple of `n_k_heads`).
    pub n_v_heads: usize,
    /// Width of every head.
    pub head_dim: usize,
    /// Every this many layers the last is attention.
    pub interval: usize,
    /// Write q, k, v and z as one `ssm_in` per layer (qwen3next's older converter), not as
    /// `attn_qkv` and `attn_gate`.
    pub fused_qkvz: bool,
}

/// The routed FFN of a synthetic Mixture-of-Experts model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthMoe {
    /// Experts a layer.
    pub n_expert: usize,
    /// Experts a token uses.
    pub n_expert_used: usize,
    /// One expert's hidden width.
    pub n_ff_exp: usize,
    /// The shared expert's hidden width (Qwen2-MoE), `None` for none.
    pub n_ff_shared: Option<usize>,
    /// Write each layer's expert gate and up matrices as one `ffn_gate_up_exps` (per expert its
    /// gate rows, then its up rows), as llama.cpp's converter does with `fuse_gate_up_exps`.
    pub fused_gate_up: bool,
    /// GLM-4.5's routing and block (arch `glm4moe`), `None` for the other architectures.
    pub glm: Option<SynthGlm>,
}

/// What a synthetic GLM-4.5 (`glm4moe`) has beyond the common MoE shapes. Its routing is
/// sigmoid scores with a selection bias (`exp_probs_b`) and renormalised weights; its shared
/// expert (`n_ff_shared`, a multiple of `n_ff_exp`) is ungated; q, k and v have biases.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthGlm {
    /// Leading layers with a dense FFN of `n_ff` (`first_k_dense_replace`).
    pub n_dense_lead: usize,
    /// `expert_weights_scale` (`routed_scaling_factor`).
    pub weights_scale: f32,
    /// Layers whose attention has q/k RMSNorms (GLM-4.5: all; GLM-4.5-Air: none).
    pub qk_norm_layers: std::ops::Range<usize>,
    /// NextN (multi-token prediction) blocks written after the decoder's, counted in
    /// `block_count` and named by `nextn_predict_layers`: a loader must skip them.
    pub n_nextn: usize,
}

/// How a tensor of a synthetic file is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A matrix in the file's chosen format.
    Quantised,
    /// A matrix kept in f32, as converters keep MoE routers (`ffn_gate_inp`).
    F32Matrix,
    /// A norm or bias vector (f32), or a table of them (gpt-oss's per-expert biases).
    Vector,
}

impl SynthSpec {
    /// Llama-3-8B's shapes (Meta's `config.json`: 32 layers, 4096, FFN 14336, 32/8 heads,
    /// vocab 128256, rope θ 500000).
    pub fn llama3_8b() -> SynthSpec {
        SynthSpec {
            name: "llama3-8b".into(),
            arch: Arch::Llama,
            n_layer: 32,
            d_model: 4096,
            n_ff: 14336,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            vocab: 128_256,
            ctx_len: 8192,
            rope_theta: 500_000.0,
            tied_embeddings: false,
            rope_scaling: RopeScaling::none(8192),
            moe: None,
            delta_net: None,
            rope_dim: None,
            sliding_window: None,
        }
    }

    /// Qwen3-30B-A3B's shapes (Qwen's `config.json`: 48 layers, 2048, 32/4 heads of 128, 128
    /// experts of width 768 with 8 a token, vocab 151936, rope θ 1e6, context 40960).
    pub fn qwen3_30b_a3b() -> SynthSpec {
        SynthSpec {
            name: "qwen3-30b-a3b".into(),
            arch: Arch::Qwen3Moe,
            n_layer: 48,
            d_model: 2048,
            n_ff: 6144,
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            vocab: 151_936,
            ctx_len: 40_960,
            rope_theta: 1_000_000.0,
            tied_embeddings: false,
            rope_scaling: RopeScaling::none(40_960),
            moe: Some(SynthMoe {
                n_expert: 128,
                n_expert_used: 8,
                n_ff_exp: 768,
                n_ff_shared: None,
                fused_gate_up: false,
                glm: None,
            }),
            delta_net: None,
            rope_dim: None,
            sliding_window: None,
        }
    }

    /// gpt-oss-20b's shapes (OpenAI's `config.json` for `openai/gpt-oss-20b`, also in
    /// llama.cpp's `LLM_TYPE_20B` = 24 blocks: 24 layers alternating sliding-window (128) and
    /// full attention, hidden 2880, 64 query / 8 KV heads of 64, 32 experts of width 2880 with
    /// 4 a token, vocab 201088, rope θ 150000 with YaRN ×32 over a 4096-token original context
    /// (131072 positions), untied head): ≈ 20.9 B parameters.
    pub fn gpt_oss_20b() -> SynthSpec {
        let ctx = 131_072;
        SynthSpec {
            name: "gpt-oss-20b".into(),
            arch: Arch::GptOss,
            n_layer: 24,
            d_model: 2880,
            n_ff: 2880,
            n_head: 64,
            n_head_kv: 8,
            head_dim: 64,
            vocab: 201_088,
            ctx_len: ctx,
            rope_theta: 150_000.0,
            tied_embeddings: false,
            rope_scaling: yarn(32.0, 4096),
            moe: Some(SynthMoe {
                n_expert: 32,
                n_expert_used: 4,
                n_ff_exp: 2880,
                n_ff_shared: None,
                fused_gate_up: false,
                glm: None,
            }),
            delta_net: None,
            rope_dim: None,
            sliding_window: Some(128),
        }
    }

    /// GLM-4.5-Air's shapes. From slime `scripts/models/glm4.5-106B-A12B.sh` (THUDM's
    /// Megatron recipe for it): 1 dense + 45 MoE layers, d 4096, dense FFN 10944, 96 query / 8
    /// kv heads of 128, q/k/v biases, no q/k norm, RoPE on half of each head (`rotary-percent
    /// 0.5`) with θ 1e6, vocab 151552, 128 experts of 1408 with 8 a token, a shared expert of
    /// 1408, sigmoid scores with an expert bias, and no `topk-scaling-factor` (Megatron's
    /// default 1.0; the GLM-4.5 recipe sets 2.5). HF `Glm4MoeConfig`'s defaults agree (46
    /// layers, 131072 context, rms ε 1e-5). One NextN block: llama.cpp's GLM-4.5 MTP graph
    /// supports exactly one; zai-org's `config.json` (`num_nextn_predict_layers`) is not among
    /// the sources read, so that count is unverified.
    pub fn glm45_air() -> SynthSpec {
        SynthSpec {
            name: "glm-4.5-air".into(),
            arch: Arch::Glm4Moe,
            n_layer: 46,
            d_model: 4096,
            n_ff: 10944,
            n_head: 96,
            n_head_kv: 8,
            head_dim: 128,
            vocab: 151_552,
            ctx_len: 131_072,
            rope_theta: 1_000_000.0,
            tied_embeddings: false,
            rope_scaling: RopeScaling::none(131_072),
            moe: Some(SynthMoe {
                n_expert: 128,
                n_expert_used: 8,
                n_ff_exp: 1408,
                n_ff_shared: Some(1408),
                fused_gate_up: false,
                glm: Some(SynthGlm {
                    n_dense_lead: 1,
                    weights_scale: 1.0,
                    qk_norm_layers: 0..0,
                    n_nextn: 1,
                }),
            }),
            delta_net: None,
            rope_dim: Some(64),
            sliding_window: None,
        }
    }

    /// Qwen3.5-9B's shapes (its GGUF metadata: 32 layers of which every 4th is gated
    /// attention, 4096, FFN 12288, 16/4 heads of 256 rotating 64 dims, DeltaNet 16 key heads
    /// and 32 value heads of 128 with a 4-tap conv, vocab 248320, rope θ 1e7, context 262144).
    pub fn qwen35_9b() -> SynthSpec {
        SynthSpec {
            name: "qwen3.5-9b".into(),
            arch: Arch::Qwen35,
            n_layer: 32,
            d_model: 4096,
            n_ff: 12288,
            n_head: 16,
            n_head_kv: 4,
            head_dim: 256,
            vocab: 248_320,
            ctx_len: 262_144,
            rope_theta: 10_000_000.0,
            tied_embeddings: false,
            rope_scaling: RopeScaling::none(262_144),
            moe: None,
            delta_net: Some(PUBLISHED_DELTA_NET),
            rope_dim: Some(64),
            sliding_window: None,
        }
    }

    /// Qwen3-Next-80B-A3B's shapes (Qwen's `config.json`: 48 layers of which every 4th
    /// (`full_attention_interval`) is gated attention, `hidden_size` 2048, 16/2 heads of
    /// `head_dim` 256 rotating a quarter (`partial_rotary_factor` 0.25: 64 dims), `rope_theta`
    /// 1e7, DeltaNet 16 key heads and 32 value heads of 128 with a 4-tap conv, 512 experts of
    /// `moe_intermediate_size` 512 with 10 a token, a shared expert of 512, `intermediate_size`
    /// 5120, vocab 151936, context 262144).
    pub fn qwen3_next_80b_a3b() -> SynthSpec {
        SynthSpec {
            name: "qwen3-next-80b-a3b".into(),
            arch: Arch::Qwen3Next,
            n_layer: 48,
            d_model: 2048,
            n_ff: 5120,
            n_head: 16,
            n_head_kv: 2,
            head_dim: 256,
            vocab: 151_936,
            ctx_len: 262_144,
            rope_theta: 10_000_000.0,
            tied_embeddings: false,
            rope_scaling: RopeScaling::none(262_144),
            moe: Some(SynthMoe {
                n_expert: 512,
                n_expert_used: 10,
                n_ff_exp: 512,
                n_ff_shared: Some(512),
                fused_gate_up: false,
                glm: None,
            }),
            delta_net: Some(PUBLISHED_DELTA_NET),
            rope_dim: Some(64),
            sliding_window: None,
        }
    }

    /// Qwen3.5-35B-A3B's shapes (Qwen's `config.json` as Megatron arguments in THUDM/slime's
    /// `scripts/models/qwen3.5-35B-A3B.sh`: 40 layers of which every 4th is gated attention,
    /// 2048, 16/2 heads of 256 rotating a quarter, DeltaNet 16 key heads and 32 value heads of
    /// 128 with a 4-tap conv, 256 experts of width 512 with 8 a token plus a gated shared
    /// expert of 512, vocab 248320, rope θ 1e7, context 262144).
    pub fn qwen35_35b_a3b() -> SynthSpec {
        SynthSpec {
            name: "qwen3.5-35b-a3b".into(),
            arch: Arch::Qwen35Moe,
            n_layer: 40,
            d_model: 2048,
            // Unused: every layer is routed.
            n_ff: 512,
            n_head: 16,
            n_head_kv: 2,
            head_dim: 256,
            moe: Some(SynthMoe {
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff_shared: Some(512),
                fused_gate_up: false,
                glm: None,
            }),
            ..SynthSpec::qwen35_9b()
        }
    }

    /// Qwen3.5-0.8B's shapes (its `config.json`: 24 layers of which every 4th is gated
    /// attention, 1024, FFN 3584, 8/2 heads of 256 rotating a quarter, DeltaNet 16 key and 16
    /// value heads of 128, tied embeddings, vocab 248320, rope θ 1e7, context 262144).
    pub fn qwen35_0_8b() -> SynthSpec {
        SynthSpec {
            name: "qwen3.5-0.8b".into(),
            n_layer: 24,
            d_model: 1024,
            n_ff: 3584,
            n_head: 8,
            n_head_kv: 2,
            tied_embeddings: true,
            delta_net: Some(SynthDeltaNet {
                conv_kernel: 4,
                n_k_heads: 16,
                n_v_heads: 16,
                head_dim: 128,
                interval: 4,
                fused_qkvz: false,
            }),
            ..SynthSpec::qwen35_9b()
        }
    }

    /// A Qwen3-style ~9B (40 layers of Qwen3-8B's block: 4096, FFN 12288, 32/8 heads of 128,
    /// vocab 151936; 36 layers would be Qwen3-8B itself): ≈ 9.0 B parameters.
    pub fn qwen_9b() -> SynthSpec {
        SynthSpec {
            name: "qwen3-9b-like".into(),
            arch: Arch::Qwen3,
            n_layer: 40,
            d_model: 4096,
            n_ff: 12288,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            vocab: 151_936,
            ctx_len: 32768,
            rope_theta: 1_000_000.0,
            tied_embeddings: false,
            rope_scaling: RopeScaling::none(32768),
            moe: None,
            delta_net: None,
            rope_dim: None,
            sliding_window: None,
        }
    }

    /// A tiny model for tests (every dim a multiple of 256 so every format applies). The tiny
    /// gpt-oss has 4 layers (two local, two global), 8 query heads of 64 over a residual of
    /// 256 (so `n_head · head_dim ≠ d_model`, as the real model's 4096 ≠ 2880) and YaRN.
    pub fn tiny(arch: Arch) -> SynthSpec {
        if arch == Arch::Glm4Moe {
            return SynthSpec::tiny_glm4moe();
        }
        let gpt_oss = arch == Arch::GptOss;
        let (yarn_factor, yarn_orig) = TINY_GPT_OSS_YARN;
        SynthSpec {
            name: format!("tiny-{}", arch.name()),
            arch,
            d_model: 256,
            n_ff: 512,
            n_head: if gpt_oss { 8 } else { 4 },
            n_head_kv: 2,
            head_dim: 64,
            vocab: 512,
            ctx_len: 256,
            rope_theta: 10_000.0,
            tied_embeddings: matches!(arch, Arch::Qwen2 | Arch::Gemma3),
            rope_scaling: match gpt_oss {
                true => yarn(yarn_factor, yarn_orig),
                false => RopeScaling::none(256),
            },
            moe: arch.always_moe().then(|| SynthMoe {
                n_expert: TINY_EXPERTS,
                n_expert_used: TINY_EXPERTS_USED,
                n_ff_exp: 256,
                n_ff_shared: matches!(arch, Arch::Qwen2Moe | Arch::Qwen35Moe | Arch::Qwen3Next)
                    .then_some(512),
                fused_gate_up: false,
                glm: None,
            }),
            // Three DeltaNet layers and one attention layer: Qwen3.5's 3:1 pattern once;
            // gpt-oss's local/global alternation twice.
            n_layer: if arch.hybrid() || gpt_oss { 4 } else { 2 },
            delta_net: arch.hybrid().then_some(SynthDeltaNet {
                conv_kernel: 4,
                n_k_heads: 2,
                n_v_heads: 4,
                head_dim: 64,
                interval: 4,
                fused_qkvz: false,
            }),
            // Qwen3.5 rotates a quarter of each head.
            rope_dim: arch.hybrid().then_some(16),
            sliding_window: gpt_oss.then_some(SYNTH_GPT_OSS_WINDOW),
        }
    }

    /// A tiny Mixtral-style model: the `llama` architecture with routed experts.
    pub fn tiny_mixtral() -> SynthSpec {
        SynthSpec {
            name: "tiny-mixtral".into(),
            n_ff: 256,
            moe: Some(SynthMoe {
                n_expert: TINY_EXPERTS,
                n_expert_used: TINY_EXPERTS_USED,
                n_ff_exp: 256,
                n_ff_shared: None,
                fused_gate_up: false,
                glm: None,
            }),
            ..SynthSpec::tiny(Arch::Llama)
        }
    }

    /// `spec` with its experts' gate and up matrices written as one `ffn_gate_up_exps`.
    pub fn with_fused_gate_up(mut self) -> SynthSpec {
        if let Some(m) = &mut self.moe {
            m.fused_gate_up = true;
        }
        self.name.push_str("-gate-up");
        self
    }

    /// `spec` with its DeltaNet's q, k, v and z written as one `ssm_in` (qwen3next only).
    pub fn with_ssm_in(mut self) -> SynthSpec {
        if let Some(dn) = &mut self.delta_net {
            dn.fused_qkvz = true;
        }
        self.name.push_str("-ssm-in");
        self
    }

    /// A tiny GLM-4.5: 1 dense and 2 routed layers, then one NextN block; half of each head
    /// rotated, q/k/v biases, q/k norms in the last layer only (GLM-4.5 has them everywhere,
    /// Air nowhere: one file tests both), a shared expert as wide as a routed one, weights
    /// scaled by [`TINY_GLM_WEIGHTS_SCALE`].
    pub fn tiny_glm4moe() -> SynthSpec {
        let n_layer = 3;
        SynthSpec {
            name: "tiny-glm4moe".into(),
            arch: Arch::Glm4Moe,
            n_layer,
            tied_embeddings: false,
            moe: Some(SynthMoe {
                n_expert: TINY_EXPERTS,
                n_expert_used: TINY_EXPERTS_USED,
                n_ff_exp: 256,
                n_ff_shared: Some(256),
                fused_gate_up: false,
                glm: Some(SynthGlm {
                    n_dense_lead: 1,
                    weights_scale: TINY_GLM_WEIGHTS_SCALE,
                    qk_norm_layers: n_layer - 1..n_layer,
                    n_nextn: 1,
                }),
            }),
            rope_dim: Some(32),
            ..SynthSpec::tiny(Arch::Qwen3Moe)
        }
    }

    /// Preset by name: `llama3-8b`, `qwen-9b`, `qwen3-30b-a3b`, `qwen3.5-9b`, `qwen3.5-35b-a3b`,
    /// `qwen3.5-0.8b`, `qwen3-next-80b-a3b`, `glm-4.5-air`, `gpt-oss-20b`, `tiny-llama`,
    /// `tiny-qwen2`, `tiny-qwen3`, `tiny-gemma3`, `tiny-qwen2moe`, `tiny-qwen3moe`,
    /// `tiny-mixtral`, `tiny-qwen35`, `tiny-qwen35moe`, `tiny-qwen35moe-gate-up`,
    /// `tiny-qwen3next`, `tiny-qwen3next-ssm-in`, `tiny-glm4moe`, `tiny-gpt-oss`.
    pub fn preset(name: &str) -> Option<SynthSpec> {
        Some(match name {
            "llama3-8b" => SynthSpec::llama3_8b(),
            "qwen-9b" => SynthSpec::qwen_9b(),
            "tiny-llama" => SynthSpec::tiny(Arch::Llama),
            "tiny-qwen2" => SynthSpec::tiny(Arch::Qwen2),
            "tiny-qwen3" => SynthSpec::tiny(Arch::Qwen3),
            "tiny-gemma3" => SynthSpec::tiny(Arch::Gemma3),
            "qwen3-30b-a3b" => SynthSpec::qwen3_30b_a3b(),
            "qwen3.5-9b" => SynthSpec::qwen35_9b(),
            "qwen3.5-35b-a3b" => SynthSpec::qwen35_35b_a3b(),
            "qwen3.5-0.8b" => SynthSpec::qwen35_0_8b(),
            "tiny-qwen2moe" => SynthSpec::tiny(Arch::Qwen2Moe),
            "tiny-qwen3moe" => SynthSpec::tiny(Arch::Qwen3Moe),
            "tiny-mixtral" => SynthSpec::tiny_mixtral(),
            "tiny-qwen35" => SynthSpec::tiny(Arch::Qwen35),
            "tiny-qwen35moe" => SynthSpec::tiny(Arch::Qwen35Moe),
            "tiny-qwen35moe-gate-up" => SynthSpec::tiny(Arch::Qwen35Moe).with_fused_gate_up(),
            "qwen3-next-80b-a3b" => SynthSpec::qwen3_next_80b_a3b(),
            "tiny-qwen3next" => SynthSpec::tiny(Arch::Qwen3Next),
            "tiny-qwen3next-ssm-in" => SynthSpec::tiny(Arch::Qwen3Next).with_ssm_in(),
            "glm-4.5-air" => SynthSpec::glm45_air(),
            "tiny-glm4moe" => SynthSpec::tiny_glm4moe(),
            "gpt-oss-20b" => SynthSpec::gpt_oss_20b(),
            "tiny-gpt-oss" => SynthSpec::tiny(Arch::GptOss),
            _ => return None,
        })
    }

    /// Every tensor: (name, dims in ggml order, how it is stored).
    fn tensors(&self) -> Vec<(String, Vec<u64>, Kind)> {
        let (d, ff, q, kv, hd) = (
            self.d_model as u64,
            self.n_ff as u64,
            (self.n_head * self.head_dim) as u64,
            (self.n_head_kv * self.head_dim) as u64,
            self.head_dim as u64,
        );
        let mut t = vec![(
            "token_embd.weight".to_owned(),
            vec![d, self.vocab as u64],
            Kind::Quantised,
        )];
        let glm = self.moe.as_ref().and_then(|m| m.glm.as_ref());
        let nextn = glm.map_or(0, |g| g.n_nextn);
        for i in 0..self.n_layer + nextn {
            let n = |s: &str| format!("blk.{i}.{s}");
            t.push((n("attn_norm.weight"), vec![d], Kind::Vector));
            let recurrent = self
                .delta_net
                .as_ref()
                .filter(|dn| (i + 1) % dn.interval != 0);
            if let Some(dn) = recurrent {
                let (kd, vd, hv) = (
                    (dn.n_k_heads * dn.head_dim) as u64,
                    (dn.n_v_heads * dn.head_dim) as u64,
                    dn.n_v_heads as u64,
                );
                let cd = 2 * kd + vd;
                if dn.fused_qkvz {
                    t.push((n("ssm_in.weight"), vec![d, cd + vd], Kind::Quantised));
                } else {
                    t.push((n("attn_qkv.weight"), vec![d, cd], Kind::Quantised));
                    t.push((n("attn_gate.weight"), vec![d, vd], Kind::Quantised));
                }
                // qwen3next keeps β and α in one tensor, grouped by key head.
                if self.arch == Arch::Qwen3Next {
                    t.push((n("ssm_ba.weight"), vec![d, 2 * hv], Kind::Quantised));
                } else {
                    t.push((n("ssm_beta.weight"), vec![d, hv], Kind::Quantised));
                    t.push((n("ssm_alpha.weight"), vec![d, hv], Kind::Quantised));
                }
                t.push((
                    n("ssm_conv1d.weight"),
                    vec![dn.conv_kernel as u64, cd],
                    Kind::F32Matrix,
                ));
                t.push((n("ssm_dt.bias"), vec![hv], Kind::Vector));
                t.push((n("ssm_a"), vec![hv], Kind::Vector));
                t.push((n("ssm_norm.weight"), vec![dn.head_dim as u64], Kind::Vector));
                t.push((n("ssm_out.weight"), vec![vd, d], Kind::Quantised));
            } else {
                // A hybrid's attention query also yields the output gate, interleaved per head.
                let qrows = if self.delta_net.is_some() { 2 * q } else { q };
                t.push((n("attn_q.weight"), vec![d, qrows], Kind::Quantised));
                t.push((n("attn_k.weight"), vec![d, kv], Kind::Quantised));
                t.push((n("attn_v.weight"), vec![d, kv], Kind::Quantised));
                if matches!(
                    self.arch,
                    Arch::Qwen2 | Arch::Qwen2Moe | Arch::Glm4Moe | Arch::GptOss
                ) {
                    t.push((n("attn_q.bias"), vec![q], Kind::Vector));
                    t.push((n("attn_k.bias"), vec![kv], Kind::Vector));
                    t.push((n("attn_v.bias"), vec![kv], Kind::Vector));
                }
                if self.arch.qk_norms() || glm.is_some_and(|g| g.qk_norm_layers.contains(&i)) {
                    t.push((n("attn_q_norm.weight"), vec![hd], Kind::Vector));
                    t.push((n("attn_k_norm.weight"), vec![hd], Kind::Vector));
                }
                t.push((n("attn_output.weight"), vec![q, d], Kind::Quantised));
                if self.arch == Arch::GptOss {
                    t.push((n("attn_output.bias"), vec![d], Kind::Vector));
                    t.push((
                        n("attn_sinks.weight"),
                        vec![self.n_head as u64],
                        Kind::Vector,
                    ));
                }
                if self.arch.post_norms() {
                    t.push((n("post_attention_norm.weight"), vec![d], Kind::Vector));
                }
            }
            t.push((n(self.arch.ffn_norm_name()), vec![d], Kind::Vector));
            let dense_lead = glm.map_or(0, |g| g.n_dense_lead);
            match self.moe.as_ref().filter(|_| i >= dense_lead) {
                None => {
                    t.push((n("ffn_gate.weight"), vec![d, ff], Kind::Quantised));
                    t.push((n("ffn_up.weight"), vec![d, ff], Kind::Quantised));
                    t.push((n("ffn_down.weight"), vec![ff, d], Kind::Quantised));
                }
                Some(m) => {
                    let (e, fe) = (m.n_expert as u64, m.n_ff_exp as u64);
                    t.push((n("ffn_gate_inp.weight"), vec![d, e], Kind::F32Matrix));
                    if glm.is_some() {
                        t.push((n("exp_probs_b.bias"), vec![e], Kind::Vector));
                    }
                    if m.fused_gate_up {
                        let rows = 2 * fe;
                        t.push((
                            n("ffn_gate_up_exps.weight"),
                            vec![d, rows, e],
                            Kind::Quantised,
                        ));
                    } else {
                        t.push((n("ffn_gate_exps.weight"), vec![d, fe, e], Kind::Quantised));
                        t.push((n("ffn_up_exps.weight"), vec![d, fe, e], Kind::Quantised));
                    }
                    t.push((n("ffn_down_exps.weight"), vec![fe, d, e], Kind::Quantised));
                    if self.arch == Arch::GptOss {
                        t.push((n("ffn_gate_inp.bias"), vec![e], Kind::Vector));
                        t.push((n("ffn_gate_exps.bias"), vec![fe, e], Kind::Vector));
                        t.push((n("ffn_up_exps.bias"), vec![fe, e], Kind::Vector));
                        t.push((n("ffn_down_exps.bias"), vec![d, e], Kind::Vector));
                    }
                    if let Some(sf) = m.n_ff_shared {
                        let sf = sf as u64;
                        // GLM-4.5's shared expert has no scalar gate.
                        if glm.is_none() {
                            t.push((n("ffn_gate_inp_shexp.weight"), vec![d], Kind::Vector));
                        }
                        t.push((n("ffn_gate_shexp.weight"), vec![d, sf], Kind::Quantised));
                        t.push((n("ffn_up_shexp.weight"), vec![d, sf], Kind::Quantised));
                        t.push((n("ffn_down_shexp.weight"), vec![sf, d], Kind::Quantised));
                    }
                }
            }
            if self.arch.post_norms() {
                t.push((n("post_ffw_norm.weight"), vec![d], Kind::Vector));
            }
            if i >= self.n_layer {
                // A NextN block's own tensors (llama.cpp `LLM_TENSOR_NEXTN_*`): the projection
                // of [embedding; hidden state] and its norms.
                t.push((n("nextn.eh_proj.weight"), vec![2 * d, d], Kind::Quantised));
                for v in ["enorm", "hnorm", "shared_head_norm"] {
                    t.push((n(&format!("nextn.{v}.weight")), vec![d], Kind::Vector));
                }
            }
        }
        t.push(("output_norm.weight".to_owned(), vec![d], Kind::Vector));
        if !self.tied_embeddings {
            t.push((
                "output.weight".to_owned(),
                vec![d, self.vocab as u64],
                Kind::Quantised,
            ));
        }
        t
    }

    /// Parameter count.
    pub fn n_params(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|(_, d, _)| d.iter().product::<u64>())
            .sum()
    }

    fn metadata(&self) -> Vec<(String, MetaValue)> {
        let a = self.arch.name();
        let glm = self.moe.as_ref().and_then(|m| m.glm.as_ref());
        let nextn = glm.map_or(0, |g| g.n_nextn);
        let u = |v: usize| MetaValue::U32(v as u32);
        let mut m = vec![
            (
                "general.architecture".to_owned(),
                MetaValue::String(a.into()),
            ),
            (
                "general.name".to_owned(),
                MetaValue::String(format!("synthetic-{}", self.name)),
            ),
            (
                "general.description".to_owned(),
                MetaValue::String(SYNTH_DESCRIPTION.into()),
            ),
            (SYNTH_KEY.to_owned(), MetaValue::Bool(true)),
            (format!("{a}.block_count"), u(self.n_layer + nextn)),
            (format!("{a}.context_length"), u(self.ctx_len)),
            (format!("{a}.embedding_length"), u(self.d_model)),
            (format!("{a}.feed_forward_length"), u(self.n_ff)),
            (format!("{a}.attention.head_count"), u(self.n_head)),
            (format!("{a}.attention.head_count_kv"), u(self.n_head_kv)),
            (format!("{a}.attention.key_length"), u(self.head_dim)),
            (format!("{a}.attention.value_length"), u(self.head_dim)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                MetaValue::F32(1e-5),
            ),
            (
                format!("{a}.rope.freq_base"),
                MetaValue::F32(self.rope_theta),
            ),
            (
                format!("{a}.rope.dimension_count"),
                u(self.rope_dim.unwrap_or(self.head_dim)),
            ),
        ];
        if let Some(dn) = &self.delta_net {
            let rope_pairs = self.rope_dim.unwrap_or(self.head_dim) / 2;
            // M-RoPE sections (text, height, width, unused) as Qwen3.5's 11/11/10 of 32 pairs;
            // for text every section sees the same position, so they change nothing here, but
            // llama.cpp requires the key.
            let (s0, s1) = (rope_pairs * 11 / 32, rope_pairs * 11 / 32);
            let sections = [s0, s1, rope_pairs - s0 - s1, 0]
                .map(|v| MetaValue::I32(v as i32))
                .to_vec();
            m.extend([
                (format!("{a}.ssm.conv_kernel"), u(dn.conv_kernel)),
                (format!("{a}.ssm.state_size"), u(dn.head_dim)),
                (format!("{a}.ssm.group_count"), u(dn.n_k_heads)),
                (format!("{a}.ssm.time_step_rank"), u(dn.n_v_heads)),
                (format!("{a}.ssm.inner_size"), u(dn.n_v_heads * dn.head_dim)),
                (format!("{a}.full_attention_interval"), u(dn.interval)),
            ]);
            // qwen3next's RoPE is plain NEOX: its files have no sections.
            if self.arch != Arch::Qwen3Next {
                m.push((
                    format!("{a}.rope.dimension_sections"),
                    MetaValue::Array(MetaValueType::I32, sections),
                ));
            }
        }
        if let Some(e) = &self.moe {
            m.extend([
                (format!("{a}.expert_count"), u(e.n_expert)),
                (format!("{a}.expert_used_count"), u(e.n_expert_used)),
                (format!("{a}.expert_feed_forward_length"), u(e.n_ff_exp)),
            ]);
            match (e.n_ff_shared, glm) {
                (Some(sf), None) => {
                    m.push((format!("{a}.expert_shared_feed_forward_length"), u(sf)));
                }
                // GLM-4.5 counts shared experts of the routed width (llama.cpp: `n_ff_shexp =
                // n_ff_exp · expert_shared_count`), and states its routing (as the converter).
                (sf, Some(g)) => m.extend([
                    (
                        format!("{a}.expert_shared_count"),
                        u(sf.unwrap_or(0) / e.n_ff_exp),
                    ),
                    (format!("{a}.leading_dense_block_count"), u(g.n_dense_lead)),
                    (
                        format!("{a}.expert_weights_scale"),
                        MetaValue::F32(g.weights_scale),
                    ),
                    (format!("{a}.expert_weights_norm"), MetaValue::Bool(true)),
                    (format!("{a}.expert_gating_func"), u(SYNTH_GATING_SIGMOID)),
                    (format!("{a}.nextn_predict_layers"), u(g.n_nextn)),
                ]),
                (None, None) => {}
            }
        }
        if let Some(w) = self.sliding_window {
            m.push((format!("{a}.attention.sliding_window"), u(w)));
        }
        if self.arch == Arch::Gemma3 {
            m.extend([
                (
                    format!("{a}.attention.sliding_window"),
                    u(SYNTH_GEMMA3_WINDOW),
                ),
                (
                    format!("{a}.attention.sliding_window_pattern"),
                    u(SYNTH_GEMMA3_SWA_PATTERN),
                ),
                // A local base unlike the global one, so a layer given the wrong RoPE shows.
                (
                    format!("{a}.rope.freq_base_swa"),
                    MetaValue::F32(self.rope_theta / 10.0),
                ),
            ]);
        }
        let rs = &self.rope_scaling;
        if rs.kind != RopeScalingKind::None {
            m.extend([
                (
                    format!("{a}.rope.scaling.type"),
                    MetaValue::String(rs.kind.name().into()),
                ),
                (
                    format!("{a}.rope.scaling.factor"),
                    MetaValue::F32(rs.factor as f32),
                ),
                (
                    format!("{a}.rope.scaling.original_context_length"),
                    u(rs.orig_ctx),
                ),
            ]);
            for (k, v, default) in [
                ("attn_factor", rs.attn_factor, 1.0),
                ("yarn_beta_fast", rs.beta_fast, DEFAULT_YARN_BETA_FAST),
                ("yarn_beta_slow", rs.beta_slow, DEFAULT_YARN_BETA_SLOW),
            ] {
                if v != default {
                    m.push((format!("{a}.rope.scaling.{k}"), MetaValue::F32(v as f32)));
                }
            }
        }
        // Minimal byte-level vocabulary: the 256 byte symbols, two control tokens, filler.
        let table = byte_symbols();
        let mut tokens: Vec<MetaValue> = Vec::with_capacity(self.vocab);
        let mut types: Vec<MetaValue> = Vec::with_capacity(self.vocab);
        for i in 0..self.vocab {
            let (s, ty) = match i {
                0 => ("<|synth_bos|>".to_owned(), 3),
                1 => ("<|synth_eos|>".to_owned(), 3),
                i if i - 2 < 256 => (table[i - 2].to_string(), 1),
                i => (format!("<|synth_{i}|>"), 4),
            };
            tokens.push(MetaValue::String(s));
            types.push(MetaValue::I32(ty));
        }
        m.extend([
            (
                "tokenizer.ggml.model".to_owned(),
                MetaValue::String("gpt2".into()),
            ),
            (
                "tokenizer.ggml.pre".to_owned(),
                MetaValue::String("default".into()),
            ),
            (
                "tokenizer.ggml.tokens".to_owned(),
                MetaValue::Array(MetaValueType::String, tokens),
            ),
            (
                "tokenizer.ggml.token_type".to_owned(),
                MetaValue::Array(MetaValueType::I32, types),
            ),
            (
                "tokenizer.ggml.merges".to_owned(),
                MetaValue::Array(MetaValueType::String, vec![]),
            ),
            ("tokenizer.ggml.bos_token_id".to_owned(), MetaValue::U32(0)),
            ("tokenizer.ggml.eos_token_id".to_owned(), MetaValue::U32(1)),
            (
                "tokenizer.ggml.add_bos_token".to_owned(),
                MetaValue::Bool(true),
            ),
        ]);
        m
    }
}

/// GPT-2's 256 byte symbols in byte order (`bytes_to_unicode`).
fn byte_symbols() -> Vec<char> {
    let mut out = vec!['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        out[b as usize] = char::from_u32(c).unwrap_or('?');
    }
    out
}

/// What [`write_synthetic`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthReport {
    /// Bytes written.
    pub bytes: u64,
    /// Parameters.
    pub n_params: u64,
    /// Tensors.
    pub n_tensors: usize,
}

fn row_seed(seed: u64, tensor: usize, row: usize) -> u64 {
    // SplitMix64-style mixing of (seed, tensor, row) so neighbouring rows get unrelated streams.
    let mut z = seed
        ^ (tensor as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (row as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What [`write_synthetic_to`] does when the output path already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Fail with an [`std::io::ErrorKind::AlreadyExists`] error, before writing anything and
    /// again (atomically, by a hard link) when publishing, so a file that appears meanwhile is
    /// not replaced either.
    Refuse,
    /// Replace it by rename: a process that has the old file open or mapped keeps the old
    /// bytes (no truncation under its feet, so no SIGBUS).
    Replace,
}

/// Write a synthetic GGUF for `spec` with matrices in `format` to `path`, replacing any file
/// there (atomically; see [`write_synthetic_to`]). `progress` gets (bytes written, total
/// bytes) after each tensor.
pub fn write_synthetic(
    path: &Path,
    spec: &SynthSpec,
    format: Format,
    seed: u64,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<SynthReport, ModelError> {
    write_synthetic_to(path, spec, format, seed, progress, Overwrite::Replace)
}

/// The error for an output path that exists under [`Overwrite::Refuse`].
fn exists_error(path: &Path) -> ModelError {
    ModelError::Io(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("{} already exists", path.display()),
    ))
}

/// As [`write_synthetic`], choosing what happens to an existing `path`. The bytes go to a
/// temporary file in the same directory (`.<name>.tmp.<pid>`), are fsynced, and only then
/// appear at `path` (rename, or hard link for [`Overwrite::Refuse`]), so `path` never holds a
/// partial file: a failed write removes the temporary file, and a killed writer leaves at most
/// that temporary file behind, never a torn `path`.
pub fn write_synthetic_to(
    path: &Path,
    spec: &SynthSpec,
    format: Format,
    seed: u64,
    progress: Option<&dyn Fn(u64, u64)>,
    overwrite: Overwrite,
) -> Result<SynthReport, ModelError> {
    if overwrite == Overwrite::Refuse && std::fs::symlink_metadata(path).is_ok() {
        return Err(exists_error(path));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let written = write_file(&tmp, spec, format, seed, progress).and_then(|r| {
        publish(&tmp, path, overwrite)?;
        // The directory entry too, so a crash after we report success cannot lose the file.
        std::fs::File::open(&dir)?.sync_all()?;
        Ok(r)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let mut r = written?;
    r.bytes = std::fs::metadata(path)?.len();
    Ok(r)
}

/// Make the finished temporary file `tmp` appear at `path`.
fn publish(tmp: &Path, path: &Path, overwrite: Overwrite) -> Result<(), ModelError> {
    match overwrite {
        Overwrite::Replace => std::fs::rename(tmp, path)?,
        Overwrite::Refuse => {
            // link(2) fails if `path` exists: the no-clobber publish, without a check-then-act
            // race. The temporary name is removed after.
            match std::fs::hard_link(tmp, path) {
                Ok(()) => std::fs::remove_file(tmp)?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(exists_error(path))
                }
                // A filesystem without hard links: check, then rename (a narrow race only).
                Err(_) if std::fs::symlink_metadata(path).is_err() => std::fs::rename(tmp, path)?,
                Err(_) => return Err(exists_error(path)),
            }
        }
    }
    Ok(())
}

/// Largest |tap| of a synthetic DeltaNet conv: trained convs have taps of a few tenths, and
/// taps as small as the matrices' would leave q, k and v near zero.
const SYNTH_CONV_TAP: f32 = 0.5;

/// A synthetic vector's values, by its name: norms near 1, biases near 0 (the bytes every
/// earlier synthetic file had), and a DeltaNet's decay parameters where trained models keep
/// them — `ssm_a = −exp(A_log)` with `A_log` of a few units (HF init `log(U(1, 16))`),
/// `ssm_dt.bias` the inverse softplus of a step of 0.001–0.1 (HF `dt_bias` init) — so `e^g` is
/// a decay in (0, 1); and GLM's selection bias as wide as the scores it reorders
/// ([`SYNTH_SELECTION_BIAS`]).
fn vector_value(name: &str, rng: &mut ChaCha8Rng) -> f32 {
    if name.ends_with("ssm_a") {
        rng.random_range(-8.0f32..-1.0)
    } else if name.ends_with("attn_sinks.weight") {
        // Trained sinks are logits of a few units; these weigh against the synthetic scores
        // (near 0) enough that a sink left out shows in the logits.
        rng.random_range(-1.0f32..2.0)
    } else if name.ends_with("ssm_dt.bias") {
        rng.random_range(-6.0f32..-2.5)
    } else if name.ends_with("exp_probs_b.bias") {
        rng.random_range(-SYNTH_SELECTION_BIAS..SYNTH_SELECTION_BIAS)
    } else {
        let base = if name.ends_with(".bias") { 0.0 } else { 1.0 };
        base + rng.random_range(-0.1f32..0.1)
    }
}

/// The writing itself, into a new file at `path` (which must not exist).
fn write_file(
    path: &Path,
    spec: &SynthSpec,
    format: Format,
    seed: u64,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<SynthReport, ModelError> {
    let ggml = format
        .ggml_type()
        .ok_or_else(|| ModelError::InvalidOption(format!("{format} has no GGUF type id")))?;
    let tensors = spec.tensors();
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(name, dims, kind)| TensorSpec {
            name: name.clone(),
            dims: dims.clone(),
            ggml_type: GgmlType(if *kind == Kind::Quantised {
                ggml
            } else {
                GGML_F32
            }),
        })
        .collect();
    let mut total = 0u64;
    for s in &specs {
        total += s.n_bytes()?;
    }
    // create_new: a stale temporary file of a dead writer with our pid is an error, not reused.
    let file = std::fs::File::create_new(path)?;
    let mut w = GgufWriter::new(BufWriter::new(file), &spec.metadata(), &specs)?;
    let uniform_half_width = WEIGHT_STD * 3f32.sqrt();
    // The block pool: POOL_BLOCKS blocks quantised from uniform values of WEIGHT_STD.
    let (be, bb) = (format.block_elems(), format.block_bytes());
    let pool: Vec<u8> = (0..POOL_BLOCKS)
        .into_par_iter()
        .map(|b| {
            let mut rng = ChaCha8Rng::seed_from_u64(row_seed(seed, usize::MAX, b));
            let vals: Vec<f32> = (0..be)
                .map(|_| rng.random_range(-uniform_half_width..uniform_half_width))
                .collect();
            Ok(hipfire_quant::quantize_row(format, &vals)?)
        })
        .collect::<Result<Vec<Vec<u8>>, ModelError>>()?
        .concat();
    let mut done = 0u64;
    for (ti, (name, dims, kind)) in tensors.iter().enumerate() {
        let k = dims[0] as usize;
        let rows: usize = dims[1..].iter().product::<u64>() as usize;
        if *kind == Kind::F32Matrix {
            // Small (a router: experts × d_model; a conv's taps): every value drawn, row by row.
            let half = match name.contains("ssm_conv1d") {
                true => SYNTH_CONV_TAP,
                false => uniform_half_width,
            };
            for r in 0..rows {
                let mut rng = ChaCha8Rng::seed_from_u64(row_seed(seed, ti, r));
                let v: Vec<u8> = (0..k)
                    .flat_map(|_| rng.random_range(-half..half).to_le_bytes())
                    .collect();
                w.write_data(&v)?;
                done += v.len() as u64;
            }
            continue;
        }
        if *kind == Kind::Vector {
            // Norm weights near 1 (as trained models have), biases near 0; one stream for the
            // whole table (a vector is a table of one row).
            let mut rng = ChaCha8Rng::seed_from_u64(row_seed(seed, ti, 0));
            let v: Vec<u8> = (0..k * rows)
                .flat_map(|_| vector_value(name, &mut rng).to_le_bytes())
                .collect();
            w.write_data(&v)?;
            done += v.len() as u64;
            continue;
        }
        let blocks_per_row = k / be;
        for start in (0..rows).step_by(ROWS_PER_BATCH) {
            let end = (start + ROWS_PER_BATCH).min(rows);
            let batch: Vec<u8> = (start..end)
                .into_par_iter()
                .flat_map_iter(|r| {
                    let mut rng = ChaCha8Rng::seed_from_u64(row_seed(seed, ti, r));
                    let mut row = Vec::with_capacity(blocks_per_row * bb);
                    for _ in 0..blocks_per_row {
                        let b = rng.random_range(0..POOL_BLOCKS);
                        row.extend_from_slice(&pool[b * bb..(b + 1) * bb]);
                    }
                    row
                })
                .collect();
            w.write_data(&batch)?;
            done += batch.len() as u64;
        }
        if let Some(p) = progress {
            p(done, total);
        }
    }
    let out = w.finish()?;
    let file = out
        .into_inner()
        .map_err(|e| ModelError::Io(e.into_error()))?;
    file.sync_all()?;
    let bytes = file.metadata()?.len();
    Ok(SynthReport {
        bytes,
        n_params: spec.n_params(),
        n_tensors: tensors.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("hipfire-synth-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn refuse_keeps_an_existing_file_byte_for_byte() {
        let d = scratch("refuse");
        let out = d.join("model.gguf");
        let precious: Vec<u8> = (0..4096u32)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        std::fs::write(&out, &precious).expect("write");
        let spec = SynthSpec::tiny(Arch::Llama);
        let e = write_synthetic_to(&out, &spec, Format::Q8_0, 1, None, Overwrite::Refuse)
            .expect_err("refused");
        assert!(
            matches!(&e, ModelError::Io(io) if io.kind() == std::io::ErrorKind::AlreadyExists),
            "{e}"
        );
        assert_eq!(std::fs::read(&out).expect("read"), precious);
        assert_eq!(names(&d), ["model.gguf"], "no temporary left");
        // A new path is written, and no temporary name is left beside it.
        let fresh = d.join("fresh.gguf");
        let r = write_synthetic_to(&fresh, &spec, Format::Q8_0, 1, None, Overwrite::Refuse)
            .expect("written");
        assert_eq!(r.bytes, std::fs::metadata(&fresh).expect("meta").len());
        assert_eq!(names(&d), ["fresh.gguf", "model.gguf"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn replace_renames_so_a_reader_of_the_old_file_keeps_its_bytes() {
        use std::os::unix::fs::MetadataExt;
        let d = scratch("replace");
        let out = d.join("model.gguf");
        let old: Vec<u8> = (0..8192u32).map(|i| (i ^ (i >> 3)) as u8).collect();
        std::fs::write(&out, &old).expect("write");
        // An open descriptor stands for a process that mapped the old file: an in-place
        // truncation would shrink what it reads (SIGBUS for a mapping); a rename does not.
        let held = std::fs::File::open(&out).expect("open");
        let ino = std::fs::metadata(&out).expect("meta").ino();
        let spec = SynthSpec::tiny(Arch::Llama);
        write_synthetic_to(&out, &spec, Format::Q8_0, 2, None, Overwrite::Replace)
            .expect("replaced");
        assert_ne!(std::fs::metadata(&out).expect("meta").ino(), ino);
        assert_eq!(held.metadata().expect("meta").len(), old.len() as u64);
        assert_eq!(names(&d), ["model.gguf"]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
