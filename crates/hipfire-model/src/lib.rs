//! hipfire-model: GGUF reader/writer, tokenizer, and llama-family decode over a [`Backend`].
//!
//! # Layout
//! - [`gguf`] — bounds-checked GGUF v2/v3 reader (memory-mapped, tensors in place) and a
//!   streaming writer.
//! - [`tokenizer`] — the GGUF's own vocabulary as an HF `tokenizers` pipeline (gpt2 BPE or
//!   SentencePiece BPE), ChatML rendering, streaming detokenisation.
//! - [`config`] — architecture hyper-parameters (llama, qwen2, qwen3).
//! - [`rope`] — RoPE frequencies and scaling (linear, YaRN, llama-3 factors) for both engines.
//! - [`attention`] — the CPU KV cache (per KV head, keys transposed in blocks of 16) and
//!   split-KV decode attention.
//! - [`backend`] — the engine seam: [`Backend::gemv`]; [`CpuBackend`] over hipfire-exec's pool.
//! - [`model`] — [`Model::load`], [`Session`] (`prefill`, `step`, `generate`).
//! - [`sampling`] — greedy and seeded temperature / top-k / top-p.
//! - [`synth`] — GGUFs with real architectures' shapes and random weights, for performance work.
//! - [`gpu`] — the whole decode step on the device (device KV cache, decode kernels), with
//!   spilled projections through hipfire-exec's offload executor; built on [`Model`]'s weight
//!   table ([`Model::weights`], [`Model::weight_bytes`]).
//!
//! # The one design decision
//! Decode is written against a one-method engine trait (`gemv` over a [`Weight`] that knows
//! its format, shape and file offset), not against the CPU pool: the host runs norms, RoPE,
//! attention and sampling, and hands every matrix product to the backend, so a GPU or a split
//! GPU+CPU backend slots in without touching the decode loop.
//!
//! # Errors
//! [`ModelError`] for everything; GGUF parsing keeps its own [`gguf::GgufError`] (wrapped) so
//! malformed-input tests and the fuzz target can match precisely.
#![deny(missing_docs)]

pub mod attention;
pub mod backend;
pub mod config;
mod error;
pub mod gguf;
pub mod gpu;
pub mod model;
pub mod ops;
pub mod rope;
pub mod sampling;
pub mod synth;
pub mod tokenizer;

pub use backend::{Backend, CpuBackend, ReferenceBackend, Weight};
pub use config::{Arch, ModelConfig};
pub use error::ModelError;
pub use model::{
    generate, Decoder, GenerationStats, LoadOptions, LoadProgress, Model, ProgressFn, Session,
};
pub use rope::{Rope, RopeScaling, RopeScalingKind};
pub use sampling::{Sampler, SamplingParams};
pub use synth::{write_synthetic, SynthReport, SynthSpec, SYNTH_DESCRIPTION};
pub use tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
