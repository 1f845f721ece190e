//! What the llama.cpp recordings of synthetic files share (`scripts/record_llama_cpp_rope.py`,
//! `scripts/record_llama_cpp_moe_hybrid.py`): the fixture, a file regenerated from its spec
//! with the recorded SHA-256 checked, and the row error the tests bound.

// Each test binary that includes this module uses its own subset of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hipfire_model::{write_synthetic, LoadOptions, Model, SynthSpec};
use hipfire_quant::Format;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The JSON fixture `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("fixture json")
}

/// `spec` in `format` with `seed`, written under `dir` as `name`, checked byte for byte against
/// the recorded `sha` (so both sides saw the same file), then loaded on 2 threads; the file is
/// removed again.
pub fn regenerate(
    dir: &Path,
    name: &str,
    spec: &SynthSpec,
    format: Format,
    seed: u64,
    sha: &str,
) -> Model {
    std::fs::create_dir_all(dir).expect("tmp");
    let path = dir.join(format!("{name}.gguf"));
    write_synthetic(&path, spec, format, seed, None).expect("synth");
    let bytes = std::fs::read(&path).expect("read back");
    let got_sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        got_sha, sha,
        "{name}: regenerated file differs from the recorded one"
    );
    let opts = LoadOptions {
        threads: 2,
        ..LoadOptions::default()
    };
    let model = Model::load(&path, &opts).expect("load");
    let _ = std::fs::remove_file(&path);
    model
}

/// max |a − b| / range(b).
pub fn row_err(a: &[f64], b: &[f64]) -> f64 {
    let range = b.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        - b.iter().copied().fold(f64::INFINITY, f64::min);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
        / range
}

/// A JSON array of numbers.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("f64"))
        .collect()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// A case's `synth_flags` as strings.
pub fn flags(case: &Value) -> Vec<String> {
    case["synth_flags"]
        .as_array()
        .expect("flags")
        .iter()
        .map(|v| v.as_str().expect("flag").to_owned())
        .collect()
}

/// How many rows of `rows` have `want[i]` as their argmax, as a fraction.
pub fn top1_agreement(rows: &[Vec<f32>], want: &Value) -> f64 {
    let want = ids(want);
    rows.iter()
        .zip(&want)
        .filter(|(row, &w)| hipfire_model::sampling::argmax(row) == w)
        .count() as f64
        / rows.len() as f64
}

/// As [`top1_agreement`], counting also the rows where `want[i]` is within `tol` × the row's
/// range of the row's largest logit: a near-tie that rounding within the tolerance the values
/// are checked to may flip either way.
pub fn top1_agreement_within(rows: &[Vec<f32>], want: &Value, tol: f64) -> f64 {
    let want = ids(want);
    rows.iter()
        .zip(&want)
        .filter(|(row, &w)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = row.iter().copied().fold(f32::INFINITY, f32::min);
            let behind = f64::from(max - row[w as usize]);
            behind <= tol * f64::from(max - min)
        })
        .count() as f64
        / rows.len() as f64
}
