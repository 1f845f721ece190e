//! `cargo +nightly fuzz run gguf_parse` — the GGUF parser must return `Ok` or a typed error
//! for any input, never panic or read out of bounds; whatever it accepts must be consistent,
//! and every error message must stay short (strings from the file are quoted cut). Accepted
//! files also go through the model's metadata checks (`ModelConfig::from_gguf`), which must
//! refuse bad hyper-parameters with a short message rather than panic.
#![no_main]

use hipfire_model::gguf::{GgufFile, GgufIndex};
use hipfire_model::ModelConfig;
use libfuzzer_sys::fuzz_target;

/// Longest message accepted: a few names cut to `MAX_QUOTED_CHARS` and numbers (the same
/// bound as the `hostile_gguf` test's).
const MAX_MESSAGE_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    match GgufIndex::parse(data) {
        Err(e) => assert!(e.to_string().len() <= MAX_MESSAGE_BYTES),
        Ok(idx) => {
            // Accepted files must describe tensors that really are inside the input.
            for t in &idx.tensors {
                assert!(t.start + t.n_bytes <= data.len() as u64);
                assert_eq!(t.start % idx.alignment, 0);
            }
            if let Err(e) = ModelConfig::from_gguf(&idx) {
                assert!(e.to_string().len() <= MAX_MESSAGE_BYTES);
            }
            if let Ok(f) = GgufFile::from_bytes(data.to_vec()) {
                for t in &f.index().tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                }
            }
        }
    }
});
