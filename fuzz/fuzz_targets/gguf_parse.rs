//! `cargo +nightly fuzz run gguf_parse` — the GGUF parser must return `Ok` or a typed error
//! for any input, never panic or read out of bounds; whatever it accepts must be consistent.
#![no_main]

use hipfire_model::gguf::{GgufFile, GgufIndex};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(idx) = GgufIndex::parse(data) {
        // Accepted files must describe tensors that really are inside the input.
        for t in &idx.tensors {
            assert!(t.start + t.n_bytes <= data.len() as u64);
            assert_eq!(t.start % idx.alignment, 0);
        }
        if let Ok(f) = GgufFile::from_bytes(data.to_vec()) {
            for t in &f.index().tensors {
                assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
            }
        }
    }
});
