//! The crate's error type.
//!
//! One enum for the whole crate: a caller (the CLI, the server) reacts to every model
//! failure the same way — stop and report — so one type carrying the offending values is
//! enough; the GGUF layer keeps its own [`GgufError`] so the fuzz target and the reader's
//! tests can match on parse failures precisely.

use thiserror::Error;

use crate::gguf::{GgufError, Quoted};

/// Everything that can go wrong loading or running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The GGUF file is malformed or lacks a key/tensor.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The file is valid GGUF but not a model this crate can run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// A hyper-parameter in the metadata is out of its limits, not finite, or disagrees with
    /// the tensors in the file; refused before anything is sized by it.
    #[error("metadata {key}: {problem}")]
    BadMetadata {
        /// The key (`llama.block_count`); for a count derived from an array, the array's key.
        key: String,
        /// What is wrong, with the value and what it was checked against.
        problem: String,
    },
    /// A tensor has the wrong shape for the architecture.
    #[error("tensor {name} has shape {got:?}, expected {want:?}")]
    Shape {
        /// Tensor (cut like every string from a file).
        name: Quoted,
        /// Expected dims (ggml order).
        want: Vec<u64>,
        /// Dims in the file.
        got: Vec<u64>,
    },
    /// The chat template could not render the conversation.
    #[error(transparent)]
    Template(#[from] crate::chat_template::TemplateError),
    /// Building the tokenizer from the file's vocabulary failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken {
        /// Token id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The session's context is full.
    #[error("context full: {need} positions needed, context length is {ctx}")]
    ContextFull {
        /// Positions needed.
        need: usize,
        /// Context length.
        ctx: usize,
    },
    /// A context length the model cannot take.
    #[error(
        "context size {requested} refused: it must be at least 1, at most the model's trained \
         context ({trained}, from `{arch}.context_length`) and at most {cap}"
    )]
    ContextSize {
        /// Positions asked for (0 when the file itself declares a zero context).
        requested: usize,
        /// The model's trained context.
        trained: usize,
        /// The architecture's metadata prefix.
        arch: &'static str,
        /// hipfire's absolute cap (`hipfire_config::MAX_CTX_SIZE`).
        cap: usize,
    },
    /// Device or host memory too small for what a load needs, with the numbers.
    #[error(
        "{what} needs {need} bytes ({:.2} GiB) of {memory}, but {free} bytes ({:.2} GiB) are free; {hint}",
        *need as f64 / (1u64 << 30) as f64,
        *free as f64 / (1u64 << 30) as f64
    )]
    OutOfMemory {
        /// `VRAM` or `RAM`.
        memory: &'static str,
        /// What the bytes are for.
        what: String,
        /// Bytes needed.
        need: u64,
        /// Bytes free.
        free: u64,
        /// What to change.
        hint: &'static str,
    },
    /// A weight-format operation failed.
    #[error(transparent)]
    Quant(#[from] hipfire_quant::QuantError),
    /// The CPU engine failed.
    #[error(transparent)]
    Exec(#[from] hipfire_exec::ExecError),
    /// A GPU call failed; `step` says what the decoder was doing (placing which weight,
    /// decoding which position), the source names the call and, for an allocation, the bytes
    /// asked and free.
    #[error("GPU failed while {step}")]
    Gpu {
        /// What was being done.
        step: String,
        /// The GPU's error (boxed: it is large, and every `Result` of the crate carries it).
        #[source]
        source: Box<hipfire_gpu::GpuError>,
    },
    /// A backend (engine) failed; the string is the backend's own message.
    #[error("backend {backend}: {message}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What went wrong.
        message: String,
    },
    /// Invalid sampling or load options.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// Writing a file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}
