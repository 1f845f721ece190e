//! hipfire-model: GGUF reader/writer, tokenizer, llama-family decode.
#![deny(missing_docs)]

mod error;
pub mod gguf;
pub mod tokenizer;

pub use error::ModelError;
pub use tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
