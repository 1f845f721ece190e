//! GPU tier: the GPU decoder against the CPU path on synthetic models of every supported
//! architecture, in every offload mode — including a model wide enough that `passback` really
//! splits its spilled projections (each over `MIN_SPLIT_BYTES`).
//!
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` on the GPU box runs them.

use std::sync::Arc;

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::{JoinStrategy, OffloadMode};
use hipfire_exec::share::ShareSetting;
use hipfire_model::gpu::GpuDecoder;
use hipfire_model::synth::{write_synthetic, SynthSpec};
use hipfire_model::{Arch, CpuBackend, LoadOptions, Model};
use hipfire_quant::Format;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::{gpu_options, max_rel, rel, rel_bound, require_gpu};

fn tmp(name: &str) -> std::path::PathBuf {
    gpu_harness::tmp("gpu-synth", name)
}

fn modes() -> Vec<(&'static str, Option<usize>, OffloadMode, FlagsTuning)> {
    let pb = |share, strategy| OffloadMode::Passback { share, strategy };
    let default = FlagsTuning::default();
    vec![
        ("resident", None, OffloadMode::Pcie, default),
        ("pcie", Some(1), OffloadMode::Pcie, default),
        ("cpu", Some(1), OffloadMode::Cpu, default),
        (
            "passback-ordering",
            Some(0),
            pb(ShareSetting::Auto, JoinStrategy::Ordering),
            default,
        ),
        (
            "passback-two-stream",
            Some(0),
            pb(ShareSetting::Pinned(0.4), JoinStrategy::TwoStream),
            default,
        ),
        (
            "passback-flags",
            Some(0),
            pb(ShareSetting::Auto, JoinStrategy::Flags),
            default,
        ),
        // `memory.flags_x_publish = fenced`: x behind a fenced sequence word.
        (
            "passback-flags-fenced",
            Some(0),
            pb(ShareSetting::Auto, JoinStrategy::Flags),
            FlagsTuning {
                tagged_x: false,
                ..default
            },
        ),
    ]
}

fn check(spec: &SynthSpec, fmt: Format, failures: &mut Vec<String>) {
    compare(spec, fmt, 12, 0, modes(), failures);
}

/// Feeds `n_tokens` tokens to the CPU session and to a GPU decoder per mode and compares the
/// logits of every position from `from` on.
fn compare(
    spec: &SynthSpec,
    fmt: Format,
    n_tokens: usize,
    from: usize,
    modes: Vec<(&'static str, Option<usize>, OffloadMode, FlagsTuning)>,
    failures: &mut Vec<String>,
) {
    let path = tmp(&format!("{}-{}.gguf", spec.name, fmt.name()));
    let (model, pool) = gpu_harness::load_synth(&path, spec, fmt, 7);
    let tokens = gpu_harness::tokens(n_tokens, 0, spec.vocab);
    let mut want = Vec::new();
    {
        let mut s = model.session();
        for &t in &tokens {
            want.push(s.step(t).expect("cpu step").to_vec());
        }
    }
    for (name, budget, mode, flags) in modes {
        let opts = gpu_options(budget, mode, flags, hipfire_model::gpu::DEFAULT_UBATCH);
        let mut dec = GpuDecoder::new(&model, pool.clone(), &opts).expect("gpu decoder");
        let mut worst = 0f64;
        for (i, &t) in tokens.iter().enumerate() {
            let got = dec.step(t).expect("gpu step");
            if i < from {
                continue;
            }
            worst = worst.max(rel(got, &want[i]));
        }
        eprintln!(
            "{} {} {name}, positions {from}..{n_tokens}: max |gpu-cpu| / max|logit| = {worst:.2e} ({})",
            spec.name,
            fmt.name(),
            dec.placement_summary()
        );
        if worst >= rel_bound(fmt) {
            failures.push(format!("{} {} {name}: {worst:.3e}", spec.name, fmt.name()));
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_decoder_matches_cpu_on_tiny_models() {
    require_gpu();
    let mut failures = Vec::new();
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        for fmt in [Format::Q4K, Format::Q8_0, Format::F32] {
            check(&SynthSpec::tiny(arch), fmt, &mut failures);
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_decoder_matches_cpu_when_passback_splits() {
    require_gpu();
    let spec = gpu_harness::split_llama();
    let mut failures = Vec::new();
    for fmt in [Format::Q4K, Format::Q8_0] {
        check(&spec, fmt, &mut failures);
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_decoder_matches_cpu_at_depth() {
    require_gpu();
    // Deep enough that split-KV attention runs with many chunks (1500 positions: 46 chunks of
    // 33 on an H200 with 2 kv heads) and across tiles; GQA 4 and head_dim 128 as Llama-3-8B.
    let spec = SynthSpec {
        name: "deep-llama".into(),
        d_model: 512,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 128,
        ctx_len: 2048,
        ..SynthSpec::tiny(Arch::Llama)
    };
    let mut failures = Vec::new();
    for fmt in [Format::F32, Format::Q8_0] {
        let resident = modes().into_iter().filter(|m| m.0 == "resident").collect();
        // Positions 1400..1500 compared, under the bound of the 12-token test.
        compare(&spec, fmt, 1500, 1400, resident, &mut failures);
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_decoder_refuses_a_kv_cache_beyond_vram_with_the_numbers() {
    require_gpu();
    // Trained context 2^20 with 40 layers × 8 kv heads × 128: an f16 cache of 160 GiB, more
    // than any single GPU hipfire runs on holds; the weights themselves are a few MiB.
    let spec = SynthSpec {
        name: "long-ctx".into(),
        n_layer: 40,
        n_head: 8,
        n_head_kv: 8,
        head_dim: 128,
        ctx_len: 1 << 20,
        ..SynthSpec::tiny(Arch::Llama)
    };
    let path = tmp("long-ctx.gguf");
    write_synthetic(&path, &spec, Format::Q8_0, 7, None).expect("synth");
    let pool = hipfire_exec::offload::offload_pool(0).expect("pool");
    let load = |ctx_len| {
        Model::load_with_backend(
            &path,
            &LoadOptions {
                ctx_len,
                ..LoadOptions::default()
            },
            Arc::new(CpuBackend::with_pool(pool.clone())),
        )
        .expect("load")
    };
    let opts = |budget| {
        gpu_options(
            budget,
            OffloadMode::Pcie,
            FlagsTuning::default(),
            hipfire_model::gpu::DEFAULT_UBATCH,
        )
    };
    let model = load(None);
    let kv = model.kv_cache_bytes();
    assert_eq!(kv, 160 << 30);
    for budget in [None, Some(40)] {
        match GpuDecoder::new(&model, pool.clone(), &opts(budget)) {
            Err(e @ hipfire_model::ModelError::OutOfMemory { need, free, .. }) => {
                let msg = e.to_string();
                eprintln!("budget {budget:?}: {msg}");
                assert!(need > kv && need > free, "{msg}");
                assert!(
                    msg.contains(&format!("needs {need} bytes"))
                        && msg.contains(&format!("{free} bytes"))
                        && msg.contains("--ctx-size"),
                    "{msg}"
                );
            }
            Err(e) => panic!("budget {budget:?}: refused for another reason: {e}"),
            Ok(_) => panic!("budget {budget:?}: a 160 GiB cache was placed"),
        }
    }
    // The same model with a context that fits places and runs.
    let model = load(Some(4096));
    let mut dec = GpuDecoder::new(&model, pool.clone(), &opts(None)).expect("fits");
    assert!(dec.placement_summary().contains("ctx 4096"));
    dec.step(1).expect("step");
    let _ = std::fs::remove_file(&path);
}

/// Logits of `tokens` fed one by one on the CPU path, and the model (for the GPU decoder).
fn cpu_logits(spec: &SynthSpec, tokens: &[u32]) -> (Model, Vec<Vec<f32>>) {
    let path = tmp(&format!("{}-rope.gguf", spec.name));
    write_synthetic(&path, spec, Format::F32, 7, None).expect("synth");
    let model = Model::load(&path, &LoadOptions::default()).expect("load");
    let _ = std::fs::remove_file(&path);
    let mut s = model.session();
    let logits = tokens
        .iter()
        .map(|&t| s.step(t).expect("cpu step").to_vec())
        .collect();
    (model, logits)
}

/// Scaled RoPE (linear ×4, YaRN ×4 with its cos/sin magnitude) on the GPU kernel against the
/// CPU path, which tests/rope_scaling.rs checks against llama.cpp. The GPU must be closer to
/// the CPU than a quarter of the distance between the CPU's scaled and unscaled logits, so a
/// kernel that ignored the frequencies or the magnitude fails.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_rope_scaling_matches_cpu() {
    require_gpu();
    use hipfire_model::{RopeScaling, RopeScalingKind};
    let tokens = gpu_harness::tokens(96, 0, SynthSpec::tiny(Arch::Llama).vocab);
    let mut failures = Vec::new();
    for arch in [Arch::Llama, Arch::Qwen2] {
        let plain = SynthSpec::tiny(arch);
        let (_, unscaled) = cpu_logits(&plain, &tokens);
        for (kind, orig) in [(RopeScalingKind::Linear, 256), (RopeScalingKind::Yarn, 64)] {
            let spec = SynthSpec {
                rope_scaling: RopeScaling {
                    kind,
                    factor: 4.0,
                    orig_ctx: orig,
                    ..RopeScaling::none(plain.ctx_len)
                },
                ..plain.clone()
            };
            let (model, want) = cpu_logits(&spec, &tokens);
            let pool = hipfire_exec::offload::offload_pool(0).expect("pool");
            let opts = gpu_options(
                None,
                OffloadMode::Pcie,
                FlagsTuning::default(),
                hipfire_model::gpu::DEFAULT_UBATCH,
            );
            let mut dec = GpuDecoder::new(&model, pool, &opts).expect("gpu decoder");
            let got: Vec<Vec<f32>> = tokens
                .iter()
                .map(|&t| dec.step(t).expect("gpu step").to_vec())
                .collect();
            let err = max_rel(&got, &want);
            let gap = max_rel(&unscaled, &want);
            eprintln!(
                "{} {}: |gpu-cpu| {err:.2e}, |unscaled-scaled| {gap:.2e}",
                spec.name,
                kind.name()
            );
            if err >= rel_bound(Format::F32) || err * 4.0 >= gap {
                failures.push(format!(
                    "{} {}: {err:.3e} (gap {gap:.3e})",
                    spec.name,
                    kind.name()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// What only the CPU engine runs — qwen3next's hybrid layers, the fused `ffn_gate_up_exps` of a
/// qwen35moe — the GPU decoder refuses by the architecture's name, pointing at `--device cpu`,
/// before it touches a device (so this runs without a GPU).
#[test]
fn gpu_decoder_refuses_cpu_only_architectures_by_name() {
    for spec in [
        SynthSpec::tiny(Arch::Qwen3Next),
        SynthSpec::tiny(Arch::Qwen3Next).with_ssm_in(),
        SynthSpec::tiny(Arch::Qwen35Moe).with_fused_gate_up(),
    ] {
        let path = tmp(&format!("{}-refused.gguf", spec.name));
        let (model, pool) = gpu_harness::load_synth(&path, &spec, Format::Q8_0, 7);
        let opts = gpu_options(
            None,
            OffloadMode::Pcie,
            FlagsTuning::default(),
            hipfire_model::gpu::DEFAULT_UBATCH,
        );
        match GpuDecoder::new(&model, pool, &opts) {
            Err(hipfire_model::ModelError::Unsupported(m)) => assert!(
                m.contains(spec.arch.name()) && m.contains("--device cpu"),
                "{}: {m}",
                spec.name
            ),
            Err(e) => panic!("{}: wrong error {e}", spec.name),
            Ok(_) => panic!("{}: the GPU decoder accepted it", spec.name),
        }
        let _ = std::fs::remove_file(&path);
    }
}
