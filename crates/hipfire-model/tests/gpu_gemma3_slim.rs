//! GPU tier on real weights: a slim copy of Gemma-3-270M Q4_K_M (`scripts/gemma3_slim.py`: its
//! first 9 layers and 8192 tokens, every kept tensor's bytes unchanged — the file's own Q5_0,
//! Q8_0, Q4_K and Q6_K mix) through the GPU decoder in every mode, against the CPU engine on
//! the same file. The CPU engine is checked against llama.cpp on the whole file
//! (`tests/gemma3.rs`); the whole file does not travel to the GPU box (the device tool carries
//! 64 MiB, the file is 253 MB).
//!
//! Gated by `HIPFIRE_GPU_TESTS=1` and `HIPFIRE_GEMMA3_SLIM_GGUF` (the slim file's path); skipped
//! with a printed reason otherwise.

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::{JoinStrategy, OffloadMode};
use hipfire_exec::share::ShareSetting;
use hipfire_model::gpu::GpuDecoder;
use hipfire_model::LoadOptions;
use hipfire_quant::Format;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::{gated, gpu_options, rel, rel_bound};

/// Positions fed: past the local layers' 512-position sliding window, so that both kinds of
/// layer attend differently.
const POSITIONS: usize = 640;
/// The prompt a batched prefill takes before the rest is decoded token by token.
const PROMPT: usize = 600;

fn modes() -> Vec<(&'static str, Option<usize>, OffloadMode)> {
    let pb = |share, strategy| OffloadMode::Passback { share, strategy };
    vec![
        ("resident", None, OffloadMode::Pcie),
        ("pcie", Some(2), OffloadMode::Pcie),
        ("cpu", Some(2), OffloadMode::Cpu),
        (
            "passback-flags",
            Some(0),
            pb(ShareSetting::Auto, JoinStrategy::Flags),
        ),
        (
            "passback-ordering",
            Some(0),
            pb(ShareSetting::Pinned(0.5), JoinStrategy::Ordering),
        ),
    ]
}

#[test]
fn gpu_decoder_matches_cpu_on_real_gemma3_weights() {
    if !gated() {
        return;
    }
    let Some(path) = std::env::var_os("HIPFIRE_GEMMA3_SLIM_GGUF") else {
        eprintln!(
            "skipped: HIPFIRE_GEMMA3_SLIM_GGUF not set (make the file with scripts/gemma3_slim.py)"
        );
        return;
    };
    let opts = LoadOptions {
        ctx_len: Some(1024),
        ..LoadOptions::default()
    };
    let (model, pool) = gpu_harness::load_on_offload_pool(std::path::Path::new(&path), &opts);
    let vocab = model.config().vocab;
    let tokens = gpu_harness::tokens(POSITIONS, 3, vocab);
    let want: Vec<Vec<f32>> = {
        let mut s = model.session();
        tokens
            .iter()
            .map(|&t| s.step(t).expect("cpu step").to_vec())
            .collect()
    };
    // The file's weights are K-quants and 8-bit legacy formats: the K-quants' bound.
    let bound = rel_bound(Format::Q4K);
    let mut failures = Vec::new();
    for (name, budget, mode) in modes() {
        let opts = gpu_options(
            budget,
            mode,
            FlagsTuning::default(),
            hipfire_model::gpu::DEFAULT_UBATCH,
        );
        let mut dec = GpuDecoder::new(&model, pool.clone(), &opts).expect("gpu decoder");
        let stepped = tokens
            .iter()
            .zip(&want)
            .map(|(&t, w)| rel(dec.step(t).expect("gpu step"), w))
            .fold(0f64, f64::max);
        dec.reset();
        let mut prefilled = rel(
            dec.prefill(&tokens[..PROMPT]).expect("gpu prefill"),
            &want[PROMPT - 1],
        );
        for (&t, w) in tokens[PROMPT..].iter().zip(&want[PROMPT..]) {
            prefilled = prefilled.max(rel(dec.step(t).expect("gpu step"), w));
        }
        eprintln!(
            "{name}: max |gpu-cpu| / max|logit| over {POSITIONS} positions {stepped:.2e}; \
             prefill of {PROMPT} then decode {prefilled:.2e} ({})",
            dec.placement_summary()
        );
        for (what, worst) in [("step by step", stepped), ("prefill", prefilled)] {
            if worst >= bound {
                failures.push(format!("{name} {what}: {worst:.3e}"));
            }
        }
    }
    assert!(failures.is_empty(), "over {bound:.0e}: {failures:?}");
}
