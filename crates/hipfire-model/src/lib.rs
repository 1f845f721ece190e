//! hipfire-model: GGUF reader/writer, tokenizer, llama-family decode.
#![deny(missing_docs)]

pub mod gguf;
