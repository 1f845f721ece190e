//! GPU tier: batched prefill (GEMM steps, chunk attention, streamed spilled weights) against the
//! CPU path and against the GPU's own token-by-token prefill, on synthetic models of every
//! architecture and weight format, resident and spilled.
//!
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` on the GPU box runs them.

use std::path::PathBuf;

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::{JoinStrategy, OffloadMode};
use hipfire_exec::share::ShareSetting;
use hipfire_model::gpu::{GpuDecoder, GpuOptions};
use hipfire_model::synth::SynthSpec;
use hipfire_model::{Arch, Decoder, Model};
use hipfire_quant::Format;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::{max_rel, rel_bound, require_gpu, tokens};

fn opts(budget: Option<usize>, ubatch: usize) -> GpuOptions {
    gpu_harness::gpu_options(budget, OffloadMode::Pcie, FlagsTuning::default(), ubatch)
}

/// The synthetic model `spec` in `fmt` (weights seeded 11), its file and the offload pool.
fn load(spec: &SynthSpec, fmt: Format) -> (PathBuf, Model, hipfire_exec::CpuPool) {
    let path = gpu_harness::tmp("gpu-prefill", &format!("{}-{}.gguf", spec.name, fmt.name()));
    let (model, pool) = gpu_harness::load_synth(&path, spec, fmt, 11);
    (path, model, pool)
}

/// A prompt fed in `prompts` one after the other (so each later prefill's chunks start at a
/// position > 0 and attend to the earlier ones' cache), then `decode` tokens decoded, on the GPU
/// or the CPU path; returns the logits after each prefill and after each decode step.
fn run(dec: &mut impl Decoder, prompts: &[&[u32]], decode: &[u32]) -> Vec<Vec<f32>> {
    let mut out: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| dec.prefill(p).expect("prefill").to_vec())
        .collect();
    for &t in decode {
        out.push(dec.step(t).expect("step").to_vec());
    }
    out
}

/// Every architecture (plain, biased q/k/v, q/k-norm, Gemma 3's post-norms, GeGLU and
/// 24-position sliding window) and every GGUF weight format: the
/// logits after a batched prefill (micro-batches of 16, so 29 + 45 tokens run as 16 + 13 and
/// 16 + 16 + 13, the second prompt's chunks starting at position 29) and after three decode
/// steps that read its KV cache are within the GPU bound of the CPU path's, for resident and for
/// all-spilled placements.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_prefill_matches_cpu_in_every_format() {
    require_gpu();
    let mut failures = Vec::new();
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        let spec = SynthSpec::tiny(arch);
        // Every format a GGUF file can hold (HFQ4G256 is hipfire's own, with no GGUF type id)
        // and the GPU has kernels for (MXFP4 weights stay on the CPU, and prompts with them run
        // token by token: no GEMM step to test).
        for fmt in Format::ALL
            .into_iter()
            .filter(|f| f.ggml_type().is_some() && f.has_gpu_kernel())
        {
            let (path, model, pool) = load(&spec, fmt);
            let (a, b, c) = (
                tokens(29, 1, spec.vocab),
                tokens(45, 2, spec.vocab),
                tokens(3, 3, spec.vocab),
            );
            let want = run(&mut model.session(), &[&a, &b], &c);
            for budget in [None, Some(0)] {
                let mut dec = match GpuDecoder::new(&model, pool.clone(), &opts(budget, 16)) {
                    Ok(d) => d,
                    Err(e) => {
                        failures.push(format!("{} {}: {e}", spec.name, fmt.name()));
                        continue;
                    }
                };
                assert!(
                    dec.placement_summary().contains("prefill batched"),
                    "{}",
                    dec.placement_summary()
                );
                let got = run(&mut dec, &[&a, &b], &c);
                let worst = max_rel(&got, &want);
                eprintln!(
                    "{} {} budget {budget:?}: max |gpu-cpu| / max|logit| = {worst:.2e}",
                    spec.name,
                    fmt.name()
                );
                if worst >= rel_bound(fmt) {
                    failures.push(format!(
                        "{} {} budget {budget:?}: {worst:.3e}",
                        spec.name,
                        fmt.name()
                    ));
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// The batched prefill against the GPU's own token-by-token prefill (`ubatch` 1, the decode
/// GEMV): the two differ only in how the activation is rounded (f16 vs 8-bit blocks), so they
/// are within the same bound of each other, and a batched step that skipped a row, a head or a
/// position would not be.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_prefill_matches_token_by_token_on_a_wide_model() {
    require_gpu();
    // 2048 wide, 16 heads of 128 over 4 kv heads (Llama-3's GQA 4), 3 layers, a 300-token
    // prompt in micro-batches of 128 (two full chunks and one of 44).
    let spec = SynthSpec {
        name: "wide-llama".into(),
        n_layer: 3,
        d_model: 2048,
        n_ff: 5632,
        n_head: 16,
        n_head_kv: 4,
        head_dim: 128,
        vocab: 4096,
        ctx_len: 1024,
        ..SynthSpec::tiny(Arch::Llama)
    };
    let mut failures = Vec::new();
    for fmt in [Format::Q4K, Format::Q8_0, Format::Q6K] {
        let (path, model, pool) = load(&spec, fmt);
        let (a, b, c) = (
            tokens(300, 4, spec.vocab),
            tokens(77, 5, spec.vocab),
            tokens(4, 6, spec.vocab),
        );
        let mut slow = GpuDecoder::new(&model, pool.clone(), &opts(None, 1)).expect("ubatch 1");
        assert!(slow.placement_summary().contains("token by token"));
        let want = run(&mut slow, &[&a, &b], &c);
        drop(slow);
        for budget in [None, Some(1), Some(0)] {
            let mut fast =
                GpuDecoder::new(&model, pool.clone(), &opts(budget, 128)).expect("ubatch 128");
            let got = run(&mut fast, &[&a, &b], &c);
            let worst = max_rel(&got, &want);
            eprintln!(
                "{} {} budget {budget:?}: max |batched-token| / max|logit| = {worst:.2e}",
                spec.name,
                fmt.name()
            );
            if worst >= rel_bound(fmt) {
                failures.push(format!("{} {budget:?}: {worst:.3e}", fmt.name()));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// Short runs (2 to `SHORT_RUN_MAX_TOKENS` tokens) take the multi-column GEMV, resident or
/// spilled (the spilled rows split with the CPU pool under `passback`): after prompts of 2, 3,
/// 9 and 16 tokens, each continuing the last, and two decode steps, the logits are within the
/// bound of the CPU path's, in every architecture; 17 tokens take the GEMM. The step counts say
/// which form ran, so a route that silently fell back would fail here.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn short_runs_take_the_multi_column_gemv_and_match_cpu() {
    require_gpu();
    let mut failures = Vec::new();
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        let spec = SynthSpec::tiny(arch);
        for fmt in [Format::Q4K, Format::Q8_0, Format::Q6K] {
            let (path, model, pool) = load(&spec, fmt);
            let runs: Vec<Vec<u32>> = [2usize, 3, 9, 16, 17]
                .iter()
                .enumerate()
                .map(|(i, &n)| tokens(n, 20 + i as u32, spec.vocab))
                .collect();
            let runs: Vec<&[u32]> = runs.iter().map(|r| &r[..]).collect();
            let decode = tokens(2, 30, spec.vocab);
            let want = run(&mut model.session(), &runs, &decode);
            let passback = OffloadMode::Passback {
                share: ShareSetting::Pinned(0.5),
                strategy: JoinStrategy::Flags,
            };
            for (budget, mode) in [(None, OffloadMode::Pcie), (Some(0), passback)] {
                let o = gpu_harness::gpu_options(budget, mode, FlagsTuning::default(), 64);
                let mut dec = GpuDecoder::new(&model, pool.clone(), &o).expect("decoder");
                let got = run(&mut dec, &runs, &decode);
                let counts = dec.step_counts();
                assert_eq!(
                    (counts.cols, counts.gemm),
                    (4, 1),
                    "{} {} budget {budget:?}: {counts:?}",
                    spec.name,
                    fmt.name()
                );
                let worst = max_rel(&got, &want);
                eprintln!(
                    "{} {} budget {budget:?}: short runs, max |gpu-cpu| / max|logit| = {worst:.2e}",
                    spec.name,
                    fmt.name()
                );
                if worst >= rel_bound(fmt) {
                    failures.push(format!(
                        "{} {} budget {budget:?}: {worst:.3e}",
                        spec.name,
                        fmt.name()
                    ));
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// A spilled layer's weights reach the GEMM through the copy stream's VRAM staging, as the same
/// bytes a resident layer holds: the logits after a streamed prefill are bit-identical to the
/// all-resident prefill's, for every placement (the copy of the next weight overlapping this
/// one's GEMM must not change a value).
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn streamed_prefill_is_bit_identical_to_resident_prefill() {
    require_gpu();
    let spec = SynthSpec {
        name: "stream-llama".into(),
        n_layer: 4,
        d_model: 1024,
        n_ff: 2816,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 128,
        vocab: 2048,
        ctx_len: 512,
        ..SynthSpec::tiny(Arch::Llama)
    };
    let mut failures = Vec::new();
    for fmt in [Format::Q4K, Format::Q5_0, Format::Iq4Xs] {
        let (path, model, pool) = load(&spec, fmt);
        let prompt = tokens(200, 7, spec.vocab);
        let mut base = GpuDecoder::new(&model, pool.clone(), &opts(None, 64)).expect("resident");
        let want = base.prefill(&prompt).expect("prefill").to_vec();
        drop(base);
        for budget in [0, 1, 3] {
            let mut dec =
                GpuDecoder::new(&model, pool.clone(), &opts(Some(budget), 64)).expect("spilled");
            let got = dec.prefill(&prompt).expect("prefill").to_vec();
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.to_bits() != w.to_bits())
                .count();
            eprintln!(
                "{} budget {budget}: {differ} of {} logits differ from resident",
                fmt.name(),
                got.len()
            );
            if differ > 0 {
                failures.push(format!("{} budget {budget}: {differ} differ", fmt.name()));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    assert!(
        failures.is_empty(),
        "streamed differs from resident: {failures:?}"
    );
}

/// Batched prefill stops at the context like the token path: a prompt longer than the cache
/// is refused before anything runs, and the decoder keeps working afterwards.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_prefill_refuses_a_prompt_beyond_the_context() {
    require_gpu();
    let spec = SynthSpec::tiny(Arch::Llama);
    let (path, model, pool) = load(&spec, Format::Q8_0);
    let mut dec = GpuDecoder::new(&model, pool, &opts(None, 64)).expect("decoder");
    let too_long = tokens(spec.ctx_len + 1, 8, spec.vocab);
    match dec.prefill(&too_long) {
        Err(hipfire_model::ModelError::ContextFull { need, ctx }) => {
            assert_eq!((need, ctx), (spec.ctx_len + 1, spec.ctx_len));
        }
        other => panic!("expected ContextFull, got {:?}", other.map(|l| l.len())),
    }
    assert_eq!(dec.position(), 0);
    let bad = vec![1, 2, spec.vocab as u32];
    assert!(matches!(
        dec.prefill(&bad),
        Err(hipfire_model::ModelError::BadToken { .. })
    ));
    let ok = dec
        .prefill(&tokens(100, 9, spec.vocab))
        .expect("fits")
        .to_vec();
    assert!(ok.iter().all(|v| v.is_finite()));
    let _ = std::fs::remove_file(&path);
}
