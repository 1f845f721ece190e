//! SentencePiece (`tokenizer.ggml.model = "llama"`) tokenization against llama.cpp, on the
//! hand-made vocabulary of `scripts/llama_spm_fixture.py` (merge order from scores, byte
//! fallback, prefix space, BOS).

use std::path::PathBuf;

use hipfire_model::gguf::GgufFile;
use hipfire_model::tokenizer::VocabKind;
use hipfire_model::{StreamDecoder, Tokenizer};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

#[test]
fn spm_ids_match_llama_cpp() {
    let f = GgufFile::open(fixtures().join("spm_vocab.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(f.index()).unwrap();
    assert_eq!(tok.kind(), VocabKind::Spm);
    assert!(tok.add_bos);
    let rec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("spm_tokenize.json")).unwrap(),
    )
    .unwrap();
    let mut n = 0;
    for case in rec["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, want, "{text:?}");
        // Streaming detokenisation returns the text (without the prefix space SPM adds).
        let mut sd = StreamDecoder::new();
        let mut s = String::new();
        for &id in &got {
            s += &sd.push(&tok, id).unwrap();
        }
        s += &sd.finish();
        assert_eq!(
            s.strip_prefix(' ').unwrap_or(&s),
            text,
            "stream decode of {text:?}"
        );
        n += 1;
    }
    assert_eq!(n, 7);
}

/// A template that writes `bos_token` itself (Llama 3, Gemma, Mistral) must not give a
/// tokenizer that adds BOS a second one (llama.cpp strips the rendered BOS the same way).
#[test]
fn rendered_bos_is_not_doubled() {
    let f = GgufFile::open(fixtures().join("spm_vocab.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(f.index()).unwrap();
    let bos_id = tok.bos.expect("the fixture vocabulary has BOS");
    let bos = tok.chat.bos_token().to_owned();
    assert!(!bos.is_empty());
    let with = tok
        .encode_rendered_chat(&format!("{bos}hello world"))
        .unwrap();
    let without = tok.encode_rendered_chat("hello world").unwrap();
    assert_eq!(with, without);
    assert_eq!(with, tok.encode("hello world", true).unwrap());
    assert_eq!(with.iter().filter(|&&id| id == bos_id).count(), 1);
    // Only a leading BOS is dropped; one later in the text stays a token.
    let mid = tok.encode_rendered_chat(&format!("hello{bos}")).unwrap();
    assert_eq!(mid.iter().filter(|&&id| id == bos_id).count(), 2);
}
