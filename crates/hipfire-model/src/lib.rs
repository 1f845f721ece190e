//! hipfire-model: GGUF reader/writer, tokenizer, and llama-family decode over a [`Backend`].
//!
//! # Layout
//! - [`gguf`] — bounds-checked GGUF v2/v3 reader (memory-mapped, tensors in place) and a
//!   streaming writer.
//! - [`tokenizer`] — the GGUF's own vocabulary as an HF `tokenizers` pipeline (gpt2 BPE or
//!   SentencePiece BPE), streaming detokenisation.
//! - [`chat_template`] — the GGUF's own Jinja chat template rendered as HF transformers
//!   renders it (minijinja), ChatML when the file has none or it fails.
//! - [`config`] — architecture hyper-parameters (llama with or without Mixtral-style experts,
//!   qwen2, qwen3, gemma3, qwen2moe, qwen3moe).
//! - [`moe`] — Mixture-of-Experts routing (softmax, top-k, renormalisation) and the grouping
//!   of a step's tokens by expert, shared by the engines.
//! - [`rope`] — RoPE frequencies and scaling (linear, YaRN, llama-3 factors) for both engines.
//! - [`block`] — the transformer block, once for both engines: [`block::LayerTensors`] (every
//!   GGUF tensor name of a layer, read in one place) and the block's forward pass over the rows
//!   of a step, written against the operations each engine implements (the CPU's in
//!   `model/batch.rs`, the GPU's in `gpu/block_ops.rs`).
//! - [`attention`] — the CPU KV cache (per KV head, keys transposed in blocks of 16) and
//!   split-KV decode attention.
//! - [`backend`] — the engine seam of the CPU forward pass: [`Backend`] (`gemv`, `gemv_batch`
//!   for the projections that share an activation, `gemv_tokens` for a prefill chunk,
//!   `parallel_for` for attention heads); [`CpuBackend`] over hipfire-exec's pool;
//!   [`ReferenceBackend`], the independent f64 path the tests compare against.
//! - [`model`] — [`Model::load`], [`Session`] (`prefill` in chunks of [`Model::prefill_chunk`]
//!   tokens, `step`, `generate`) and
//!   [`forward_batch`]: one forward over tokens of several sessions (continuous batching;
//!   chunked prefill is its one-session case, a decode step its one-token case): the CPU
//!   forward pass.
//! - [`ops`] — the host's non-GEMV maths (norms, RoPE, softmax, SwiGLU, one head's attention
//!   over the f16 K/V cache) and the embedding row's dequantisation.
//! - [`sampling`] — greedy and seeded temperature / top-k / top-p.
//! - [`synth`] — GGUFs with real architectures' shapes and random weights, for performance work.
//! - [`gpu`] — [`gpu::GpuDecoder`]: the whole decode step on the device (device KV cache, decode
//!   kernels), with spilled projections through hipfire-exec's offload executor; built on
//!   [`Model`]'s weight table ([`Model::weights`], [`Model::weight_bytes`]). With every layer
//!   resident its decode steps are replayed from captured CUDA graphs
//!   ([`gpu::DISABLE_GRAPHS_ENV`] turns that off).
//! - [`gpu_attention`] — decode attention split over the KV range (flash-decoding).
//! - [`gpu_kv`] — the GPU's K/V cache layout per cache type (f16, q8_0).
//!
//! # The one design decision
//! The block is written once ([`block`]), against operations over all rows of a step (one
//! decode token, a prompt chunk, one token of each sequence of a batch), and each engine
//! implements those operations on its own activations: the CPU on host vectors, its matrix
//! products through [`Backend`] (a weight that knows its format, shape and file offset); the GPU
//! on device buffers, its products as GEMV, GEMM or a row split through hipfire-exec's planner.
//! So an architecture's hook or a change of order is made in one place and both engines follow,
//! while each keeps its own form of every operation (the GPU's activations never leave the
//! device; its decode steps replay as CUDA graphs).
//!
//! # Errors
//! [`ModelError`] for everything; GGUF parsing keeps its own [`gguf::GgufError`] (wrapped) so
//! malformed-input tests and the fuzz target can match precisely.
#![deny(missing_docs)]

pub mod attention;
pub mod backend;
pub mod block;
pub mod chat_template;
pub mod config;
pub mod delta_net;
mod error;
pub mod gguf;
pub mod gpu;
pub mod gpu_attention;
pub mod gpu_batch;
pub mod gpu_kv;
pub mod kv_q8;
pub mod model;
pub mod moe;
pub mod ops;
pub mod rope;
pub mod sampling;
pub mod synth;
pub mod tokenizer;

pub use backend::{Backend, CpuBackend, ReferenceBackend, Weight};
pub use chat_template::{ChatTemplate, Rendered, TemplateError, TemplateOrigin};
pub use config::{
    Arch, DeltaNetConfig, ExpertActivation, FfnActivation, Gating, KeyHeadShare, ModelConfig,
    MoeConfig, SlidingWindow,
};
pub use error::ModelError;
pub use model::{
    forward_batch, generate, kv_bytes_per_position, resolve_ctx_len, BatchItem, Decoder,
    GenerationStats, LoadOptions, LoadProgress, Model, ProgressFn, Session, SessionSnapshot,
};
pub use rope::{Rope, RopeScaling, RopeScalingKind};
pub use sampling::{Sampler, SamplingParams};
pub use synth::{
    write_synthetic, write_synthetic_to, Overwrite, SynthDeltaNet, SynthGlm, SynthMoe, SynthReport,
    SynthSpec, SYNTH_DESCRIPTION, SYNTH_GPT_OSS_WINDOW,
};
pub use tokenizer::{ChatMessage, StreamDecoder, Tokenizer};
