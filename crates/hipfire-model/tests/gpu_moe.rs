//! GPU tier: Mixture-of-Experts layers on the GPU engine.
//! - the routing kernel (`moe_route_f32`) against the CPU engine's [`Routes`] on random logits
//!   spaced apart (no near-ties), outputs poisoned first;
//! - decoding tiny qwen3moe, qwen2moe (shared expert) and Mixtral-style models against the CPU
//!   engine, experts resident, all in pinned host memory (`--cpu-moe`), the first layer's on the
//!   host (`--n-cpu-moe 1`) and with a layer spilled; resident and host-mapped experts give the
//!   same bits (the ids GEMV reads either memory with one kernel);
//! - a batched prefill against the same tokens fed one by one, batched slots against each
//!   sequence alone, graph replays against launched steps.
//!
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` on the GPU box runs them.

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::OffloadMode;
use hipfire_gpu::{KernelRegistry, LaunchArgs};
use hipfire_model::config::{ExpertActivation, Gating, MoeConfig};
use hipfire_model::gpu::{GpuDecoder, GpuOptions, HostExperts, DEFAULT_UBATCH, MOE_SOURCE};
use hipfire_model::moe::Routes;
use hipfire_model::sampling::argmax;
use hipfire_model::synth::SynthSpec;
use hipfire_quant::Format;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::{gpu_options, launch_kernel_shared, rel, rel_bound, require_gpu, tokens};

/// Routed tiny presets the GPU runs (tiny-qwen35moe is hybrid: refused, see gpu_synth.rs).
const PRESETS: [&str; 3] = ["tiny-qwen3moe", "tiny-qwen2moe", "tiny-mixtral"];
const FORMATS: [Format; 3] = [Format::F32, Format::Q8_0, Format::Q4K];
/// Tokens fed in the decode comparisons.
const N_TOKENS: usize = 12;
/// Relative weight bound of the routing kernel against the CPU's (expf against the CPU's
/// polynomial exp, and the sums' order: a few f32 roundings).
const ROUTE_WEIGHT_BOUND: f32 = 1e-6;

fn opts(budget: Option<usize>, host_experts: HostExperts, ubatch: usize) -> GpuOptions {
    GpuOptions {
        host_experts,
        ..gpu_options(budget, OffloadMode::Pcie, FlagsTuning::default(), ubatch)
    }
}

fn load(
    name: &str,
    fmt: Format,
) -> (
    std::path::PathBuf,
    hipfire_model::Model,
    hipfire_exec::CpuPool,
) {
    let spec = SynthSpec::preset(name).expect("preset");
    let path = gpu_harness::tmp("gpu-moe", &format!("{name}-{}.gguf", fmt.name()));
    let (model, pool) = gpu_harness::load_synth(&path, &spec, fmt, 13);
    (path, model, pool)
}

/// A seeded permutation of `0..n` (xorshift; no extra dependency).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut s = seed | 1;
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn route_kernel_matches_cpu_routing() {
    let ctx = require_gpu();
    let module = KernelRegistry::new(&ctx)
        .module(&MOE_SOURCE, &[])
        .expect("moe.cu");
    let stream = ctx.new_stream().expect("stream");
    let rows = 37;
    let mut failures = Vec::new();
    for (e, k, norm) in [
        (8, 2, true),
        (8, 2, false),
        (60, 4, false),
        (128, 8, true),
        (512, 10, true),
        (33, 33, true),
    ] {
        // Distinct logits 0.05 apart (probabilities ≥ 5 % apart): no near-tie can reorder.
        let mut logits = Vec::with_capacity(rows * e);
        for r in 0..rows {
            let p = permutation(e, 0x9e37 + r as u64 * 31 + e as u64);
            logits.extend(p.iter().map(|&i| i as f32 * 0.05 - 3.0));
        }
        let cfg = MoeConfig {
            n_expert: e,
            n_expert_used: k,
            n_ff_exp: 32,
            norm_topk: norm,
            n_ff_shared: None,
            gating: Gating::Softmax,
            weights_scale: 1.0,
            n_dense_lead: 0,
            activation: ExpertActivation::Silu,
        };
        let want = Routes::from_logits(&logits, &cfg).expect("cpu routes");
        let mut l = ctx.alloc::<f32>(logits.len()).expect("logits");
        l.upload(&stream, &logits).expect("upload");
        let mut ids = ctx.alloc::<i32>(rows * k).expect("ids");
        ids.upload(&stream, &vec![-1; rows * k])
            .expect("poison ids");
        let mut w = ctx.alloc::<f32>(rows * k).expect("weights");
        w.upload(&stream, &vec![f32::NAN; rows * k])
            .expect("poison weights");
        let args = LaunchArgs::new()
            .buf(&l)
            .i32(e as i32)
            .i32(k as i32)
            .i32(0)
            .i32(i32::from(norm))
            .buf(&ids)
            .buf(&w);
        let shared = (5 * e).next_multiple_of(4) as u32;
        launch_kernel_shared(
            &module,
            &stream,
            "moe_route_f32",
            (rows as u32, 32, shared),
            args,
        );
        let mut got_ids = vec![0i32; rows * k];
        let mut got_w = vec![0f32; rows * k];
        ids.download(&stream, &mut got_ids).expect("ids");
        w.download(&stream, &mut got_w).expect("weights");
        for i in 0..rows * k {
            let (gi, wi) = (got_ids[i], want.experts[i] as i32);
            let rel_w = (got_w[i] - want.weights[i]).abs() / want.weights[i].abs();
            // A NaN (an unwritten weight) fails too.
            if gi != wi || rel_w.is_nan() || rel_w > ROUTE_WEIGHT_BOUND {
                failures.push(format!(
                    "e {e} k {k} norm {norm}: row {} choice {}: id {gi} vs {wi}, weight {} vs {}",
                    i / k,
                    i % k,
                    got_w[i],
                    want.weights[i]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The CPU engine's logits after each of `toks`.
fn cpu_logits(model: &hipfire_model::Model, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut s = model.session();
    toks.iter()
        .map(|&t| s.step(t).expect("cpu step").to_vec())
        .collect()
}

/// Whether the CPU's top logit leads its runner-up by more than `bound` of the largest |logit|
/// (else a greedy disagreement is a near-tie, not an error).
fn clear_top(cpu: &[f32], bound: f64) -> bool {
    let top = argmax(cpu) as usize;
    let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let second = cpu
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != top)
        .fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
    f64::from(cpu[top] - second) > 2.0 * bound * scale
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_moe_decode_matches_cpu_in_every_placement() {
    require_gpu();
    let mut failures = Vec::new();
    for name in PRESETS {
        for fmt in FORMATS {
            let (path, model, pool) = load(name, fmt);
            let toks = tokens(N_TOKENS, 3, model.config().vocab);
            let want = cpu_logits(&model, &toks);
            let bound = rel_bound(fmt);
            let mut resident_logits: Vec<Vec<f32>> = Vec::new();
            for (what, budget, host) in [
                ("resident", None, HostExperts::None),
                ("cpu-moe", None, HostExperts::All),
                ("n-cpu-moe 1", None, HostExperts::FirstLayers(1)),
                ("layer 0 spilled", Some(1), HostExperts::None),
            ] {
                let o = opts(budget, host, DEFAULT_UBATCH);
                let mut dec = GpuDecoder::new(&model, pool.clone(), &o).expect("gpu decoder");
                let mut worst = 0f64;
                let mut got_all = Vec::new();
                for (i, &t) in toks.iter().enumerate() {
                    let got = dec.step(t).expect("gpu step").to_vec();
                    worst = worst.max(rel(&got, &want[i]));
                    if argmax(&got) != argmax(&want[i]) && clear_top(&want[i], bound) {
                        failures.push(format!(
                            "{name} {} {what}: greedy token differs at {i}",
                            fmt.name()
                        ));
                    }
                    got_all.push(got);
                }
                eprintln!(
                    "{name} {} {what}: max |gpu-cpu| / max|logit| = {worst:.2e} ({})",
                    fmt.name(),
                    dec.placement_summary()
                );
                if worst >= bound {
                    failures.push(format!("{name} {} {what}: {worst:.3e}", fmt.name()));
                }
                match what {
                    "resident" => resident_logits = got_all,
                    // One kernel reads experts in either memory: the same bits.
                    "cpu-moe" | "n-cpu-moe 1" => {
                        let same = got_all
                            .iter()
                            .zip(&resident_logits)
                            .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
                        if !same {
                            failures.push(format!(
                                "{name} {} {what}: logits differ in bits from resident experts",
                                fmt.name()
                            ));
                        }
                    }
                    _ => {}
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_moe_prefill_matches_token_by_token() {
    require_gpu();
    let mut failures = Vec::new();
    for name in PRESETS {
        for fmt in [Format::F32, Format::Q8_0] {
            let (path, model, pool) = load(name, fmt);
            // Long enough for a GEMM micro-batch (more than a short run) and a second one.
            let toks = tokens(40, 5, model.config().vocab);
            for (what, ubatch) in [("gemm", 32), ("short runs", 4)] {
                let o = opts(None, HostExperts::None, ubatch);
                let mut batched = GpuDecoder::new(&model, pool.clone(), &o).expect("decoder");
                let got = batched.prefill(&toks).expect("prefill").to_vec();
                let mut one =
                    GpuDecoder::new(&model, pool.clone(), &opts(None, HostExperts::None, 1))
                        .expect("decoder");
                let want = one.prefill(&toks).expect("token by token").to_vec();
                let d = rel(&got, &want);
                eprintln!(
                    "{name} {} prefill ({what}) vs token by token: {d:.2e}",
                    fmt.name()
                );
                if d >= rel_bound(fmt) {
                    failures.push(format!("{name} {} {what}: {d:.3e}", fmt.name()));
                }
                // The next decode step agrees as well (the cache the prefill wrote).
                let next = toks[0];
                let a = batched.step(next).expect("step").to_vec();
                let b = one.step(next).expect("step").to_vec();
                if rel(&a, &b) >= rel_bound(fmt) {
                    failures.push(format!("{name} {} {what}: step after prefill", fmt.name()));
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_moe_slots_match_each_sequence_alone_and_graphs_match_launches() {
    require_gpu();
    let mut failures = Vec::new();
    let slots = 3;
    for name in PRESETS {
        let fmt = Format::Q8_0;
        let (path, model, pool) = load(name, fmt);
        let vocab = model.config().vocab;
        let prompts: Vec<Vec<u32>> = (0..slots)
            .map(|s| tokens(5 + 3 * s, s as u32, vocab))
            .collect();
        let steps: Vec<Vec<u32>> = (0..slots)
            .map(|s| tokens(6, 10 + s as u32, vocab))
            .collect();
        let o = opts(None, HostExperts::All, DEFAULT_UBATCH);
        // Alone: one decoder per sequence, graphs off (each kernel launched).
        let mut alone = Vec::new();
        for s in 0..slots {
            let mut dec = GpuDecoder::new(&model, pool.clone(), &o).expect("decoder");
            dec.set_graphs(false);
            dec.prefill(&prompts[s]).expect("prefill");
            alone.push(
                steps[s]
                    .iter()
                    .map(|&t| dec.step(t).expect("step").to_vec())
                    .collect::<Vec<_>>(),
            );
        }
        for graphs in [false, true] {
            let mut dec = GpuDecoder::with_slots(&model, pool.clone(), &o, slots).expect("decoder");
            dec.set_graphs(graphs);
            for (s, prompt) in prompts.iter().enumerate() {
                dec.select_slot(s).expect("slot");
                dec.prefill(prompt).expect("prefill");
            }
            for j in 0..steps[0].len() {
                let feeds: Vec<(usize, u32)> = (0..slots).map(|s| (s, steps[s][j])).collect();
                let got = dec.decode_slots(&feeds).expect("batched step").to_vec();
                for s in 0..slots {
                    let d = rel(&got[s * vocab..(s + 1) * vocab], &alone[s][j]);
                    if d >= rel_bound(fmt) {
                        failures.push(format!(
                            "{name} graphs {graphs}: slot {s} step {j}: {d:.3e}"
                        ));
                    }
                }
            }
            if graphs && dec.graph_captures() == 0 {
                failures.push(format!(
                    "{name}: no decode step was captured with graphs on"
                ));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
