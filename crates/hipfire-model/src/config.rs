//! Architecture hyper-parameters read from GGUF metadata.

use crate::gguf::GgufIndex;
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
}

impl Arch {
    /// Architecture for a `general.architecture` string.
    pub fn from_name(s: &str) -> Result<Arch, ModelError> {
        match s {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            other => Err(ModelError::Unsupported(format!(
                "architecture {other:?} (supported: llama, qwen2, qwen3)"
            ))),
        }
    }

    /// The GGUF key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
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
}

impl ModelConfig {
    /// Read from metadata (`{arch}.*` keys; vocabulary size from the token list).
    pub fn from_gguf(idx: &GgufIndex) -> Result<ModelConfig, ModelError> {
        let arch = Arch::from_name(idx.get_str("general.architecture")?)?;
        let a = arch.name();
        let u = |k: &str| -> Result<usize, ModelError> {
            Ok(idx.get_u64(&format!("{a}.{k}"))? as usize)
        };
        let d_model = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        if n_head == 0 || d_model == 0 {
            return Err(ModelError::Unsupported("zero heads or width".into()));
        }
        let n_head_kv = if idx.get(&format!("{a}.attention.head_count_kv")).is_some() {
            u("attention.head_count_kv")?
        } else {
            n_head
        };
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::Unsupported(format!(
                "{n_head} heads not a multiple of {n_head_kv} kv heads"
            )));
        }
        let head_dim = match idx.get(&format!("{a}.attention.key_length")) {
            Some(_) => u("attention.key_length")?,
            None => d_model / n_head,
        };
        let rope_dim = match idx.get(&format!("{a}.rope.dimension_count")) {
            Some(_) => u("rope.dimension_count")?,
            None => head_dim,
        };
        if head_dim == 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ModelError::Unsupported(format!(
                "head_dim {head_dim}, rope_dim {rope_dim}"
            )));
        }
        let vocab = idx
            .get_array("tokenizer.ggml.tokens")
            .map(<[_]>::len)
            .or_else(|_| u("vocab_size"))?;
        let f = |k: &str, d: f64| {
            idx.get(&format!("{a}.{k}"))
                .and_then(|v| v.as_f64())
                .unwrap_or(d)
        };
        let ctx_len = u("context_length")?;
        Ok(ModelConfig {
            rope_scaling: RopeScaling::from_gguf(idx, a, ctx_len)?,
            arch,
            n_layer: u("block_count")?,
            d_model,
            n_ff: u("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim,
            rope_dim,
            rope_theta: f("rope.freq_base", DEFAULT_ROPE_THETA),
            rope_neox: arch.rope_neox(),
            rms_eps: f("attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPS) as f32,
            vocab,
            ctx_len,
        })
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
