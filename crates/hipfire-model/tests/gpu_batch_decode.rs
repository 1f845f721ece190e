//! GPU tier: a batched decode step over several sequence slots (`GpuDecoder::decode_slots`)
//! against each sequence run alone — on the CPU (the independent reference, within the
//! GPU-vs-CPU bound of tests/gpu_synth.rs) and one feed at a time through the one-token decode
//! path of the same decoder (within a much tighter bound where no rows are cut between the
//! engines) — for several architectures and every offload mode, with prompts of different lengths
//! (prefilled one by one, and all together in one batched step),
//! feeds that skip slots, and a slot reset and refilled mid-way.
//!
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` on the GPU box runs them.

use std::sync::Arc;

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::{JoinStrategy, OffloadMode};
use hipfire_exec::share::ShareSetting;
use hipfire_model::gpu::{GpuDecoder, GpuOptions};
use hipfire_model::synth::{write_synthetic, SynthSpec};
use hipfire_model::{Arch, CpuBackend, LoadOptions, Model, ModelError};
use hipfire_quant::Format;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::{rel, rel_bound, require_gpu};

/// One decode step's feeds: (slot, token).
type Feeds = Vec<(usize, u32)>;

/// Sequence slots of the batched decoder.
const SLOTS: usize = 5;

/// Batched GPU against one feed at a time on the GPU, same mode. Resident and `pcie` run the same kernels
/// on the same bits (the multi-column GEMV sums each column as the one-column one does), so
/// they agree to float noise — but for Q4_K and Q6_K, whose device-resident rows take the tensor-core
/// kernel over several columns (the same int32 sums, scaled and added in another order), and
/// these random tiny models carry a last-bit difference in one projection into 1e-3..2e-2 of
/// the logits (the CPU arm's tiled Q4_K kernel does the same in the `cpu` mode); modes that
/// split cut the rows between the engines where each controller says (a batched step's shares
/// are its own), and a row the CPU computes differs from the GPU's by activation rounding.
fn same_mode_bound(mode: &str, fmt: Format) -> f64 {
    match mode {
        "resident" | "pcie" if !matches!(fmt, Format::Q4K | Format::Q6K) => 1e-4,
        _ => rel_bound(fmt),
    }
}

fn tmp(name: &str) -> std::path::PathBuf {
    gpu_harness::tmp("gpu-batch-decode", name)
}

fn modes() -> Vec<(&'static str, Option<usize>, OffloadMode)> {
    let pb = |share, strategy| OffloadMode::Passback { share, strategy };
    vec![
        ("resident", None, OffloadMode::Pcie),
        ("pcie", Some(1), OffloadMode::Pcie),
        ("cpu", Some(1), OffloadMode::Cpu),
        (
            "passback-auto",
            Some(0),
            pb(ShareSetting::Auto, JoinStrategy::Flags),
        ),
        (
            "passback-pinned",
            Some(0),
            pb(ShareSetting::Pinned(0.5), JoinStrategy::Ordering),
        ),
    ]
}

fn opts(budget: Option<usize>, mode: OffloadMode) -> GpuOptions {
    gpu_harness::gpu_options(
        budget,
        mode,
        FlagsTuning::default(),
        hipfire_model::gpu::DEFAULT_UBATCH,
    )
}

/// What each slot is fed, step by step: a prompt, then decode tokens; one step leaves two slots
/// out, and slot 1 is reset and given a new prompt halfway.
struct Script {
    prompts: Vec<Vec<u32>>,
    /// Per decode step: `(slot, token)` feeds.
    steps: Vec<Vec<(usize, u32)>>,
    /// Before this step, slot 1 starts over with `refill`.
    refill_at: usize,
    refill: Vec<u32>,
}

fn script(vocab: u32) -> Script {
    let tok = |i: u32| (i.wrapping_mul(2_654_435_761) % 9973 + i * 37 + 5) % vocab;
    // Lengths around the batched prefill's threshold (4 tokens) on both sides.
    let lens = [3usize, 9, 1, 14, 5];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(s, &n)| (0..n as u32).map(|i| tok(100 * s as u32 + i)).collect())
        .collect();
    let mut steps = Vec::new();
    for step in 0..6u32 {
        let feeds: Vec<(usize, u32)> = (0..SLOTS)
            .filter(|&s| step != 2 || s % 2 == 0)
            .map(|s| (s, tok(1000 + 17 * step + s as u32)))
            .collect();
        steps.push(feeds);
    }
    Script {
        prompts,
        steps,
        refill_at: 4,
        refill: (0..6).map(|i| tok(5000 + i)).collect(),
    }
}

/// Each slot's logits after every decode step it took part in, from `dec` (every slot reset
/// and given its prompt first): the steps as batched decode steps (`batched`), or each feed of
/// a step on its own through the selected-slot `step` (the one-token path decode uses).
fn drive(
    dec: &mut GpuDecoder<'_>,
    sc: &Script,
    vocab: usize,
    batched: bool,
    prompts_together: bool,
) -> Vec<Vec<Vec<f32>>> {
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); SLOTS];
    for s in 0..SLOTS {
        dec.select_slot(s).expect("slot");
        dec.reset();
    }
    if prompts_together {
        let segs: Vec<(usize, &[u32])> = sc
            .prompts
            .iter()
            .enumerate()
            .map(|(s, p)| (s, p.as_slice()))
            .collect();
        let rows = dec.prefill_slots(&segs).expect("prefill together").to_vec();
        assert_eq!(rows.len(), SLOTS * vocab, "one logits row per prompt");
        for (s, p) in sc.prompts.iter().enumerate() {
            assert_eq!(
                dec.slot_position(s),
                p.len(),
                "slot {s} after the joint prefill"
            );
        }
    } else {
        for (s, p) in sc.prompts.iter().enumerate() {
            dec.select_slot(s).expect("slot");
            dec.prefill(p).expect("prefill");
        }
    }
    for (i, feeds) in sc.steps.iter().enumerate() {
        let mut feeds = feeds.clone();
        if i == sc.refill_at {
            dec.select_slot(1).expect("slot");
            dec.reset();
            if prompts_together {
                // The refill and the other slots' decode tokens as one batched prefill step
                // (one-token segments beside a prompt; slot 1's own token after).
                let (ride, own): (Feeds, Feeds) = feeds.iter().partition(|f| f.0 != 1);
                let toks: Vec<[u32; 1]> = ride.iter().map(|f| [f.1]).collect();
                let segs: Vec<(usize, &[u32])> = std::iter::once((1, sc.refill.as_slice()))
                    .chain(ride.iter().zip(&toks).map(|(f, t)| (f.0, &t[..])))
                    .collect();
                let rows = dec
                    .prefill_slots(&segs)
                    .expect("refill with decode rows")
                    .to_vec();
                assert_eq!(rows.len(), segs.len() * vocab, "one logits row per segment");
                for (&(s, _), row) in ride.iter().zip(rows.chunks_exact(vocab).skip(1)) {
                    got[s].push(row.to_vec());
                }
                feeds = own;
            } else {
                dec.prefill(&sc.refill).expect("refill");
            }
        }
        let feeds = &feeds;
        if batched {
            let rows = dec.decode_slots(feeds).expect("batched step").to_vec();
            assert_eq!(rows.len(), feeds.len() * vocab, "logits rows");
            for (&(s, _), row) in feeds.iter().zip(rows.chunks_exact(vocab)) {
                got[s].push(row.to_vec());
            }
        } else {
            for &(s, t) in feeds {
                dec.select_slot(s).expect("slot");
                got[s].push(dec.step(t).expect("step").to_vec());
            }
        }
    }
    got
}

fn run_case(spec: &SynthSpec, fmt: Format, failures: &mut Vec<String>) {
    let path = tmp(&format!("{}-{}.gguf", spec.name, fmt.name()));
    let (model, pool) = gpu_harness::load_synth(&path, spec, fmt, 11);
    let sc = script(spec.vocab as u32);

    // The CPU reference: one session per slot, token by token.
    let mut cpu: Vec<Vec<Vec<f32>>> = vec![Vec::new(); SLOTS];
    {
        let mut sessions: Vec<_> = (0..SLOTS).map(|_| model.session()).collect();
        let feed = |sess: &mut hipfire_model::Session<'_>, p: &[u32]| {
            sess.reset();
            for &t in p {
                sess.step(t).expect("cpu step");
            }
        };
        for (s, p) in sc.prompts.iter().enumerate() {
            feed(&mut sessions[s], p);
        }
        for (i, feeds) in sc.steps.iter().enumerate() {
            if i == sc.refill_at {
                feed(&mut sessions[1], &sc.refill);
            }
            for &(s, t) in feeds {
                cpu[s].push(sessions[s].step(t).expect("cpu step").to_vec());
            }
        }
    }

    for (name, budget, mode) in modes() {
        let mut dec = GpuDecoder::with_slots(&model, pool.clone(), &opts(budget, mode), SLOTS)
            .expect("batched decoder");
        let got = drive(&mut dec, &sc, spec.vocab, true, false);
        // Positions: prompt + decode steps taken (slot 1 from its refill).
        for s in 0..SLOTS {
            let took = |from: usize| {
                sc.steps[from..]
                    .iter()
                    .filter(|f| f.iter().any(|x| x.0 == s))
                    .count()
            };
            let want = if s == 1 {
                sc.refill.len() + took(sc.refill_at)
            } else {
                sc.prompts[s].len() + took(0)
            };
            assert_eq!(dec.slot_position(s), want, "{name}: slot {s} position");
        }
        let single = drive(&mut dec, &sc, spec.vocab, false, false);
        let together = drive(&mut dec, &sc, spec.vocab, true, true);
        let (mut worst_cpu, mut worst_same, mut worst_joint) = (0f64, 0f64, 0f64);
        for s in 0..SLOTS {
            assert_eq!(got[s].len(), cpu[s].len(), "{name}: slot {s} steps");
            for (j, g) in got[s].iter().enumerate() {
                worst_cpu = worst_cpu.max(rel(g, &cpu[s][j]));
                worst_same = worst_same.max(rel(g, &single[s][j]));
                worst_joint = worst_joint.max(rel(&together[s][j], g));
            }
        }
        eprintln!(
            "{} {} {name}: batched vs cpu {worst_cpu:.2e}, vs one by one on the gpu {worst_same:.2e}, prompts prefilled together vs apart {worst_joint:.2e} ({})",
            spec.name,
            fmt.name(),
            dec.placement_summary()
        );
        if worst_cpu >= rel_bound(fmt) {
            failures.push(format!(
                "{} {} {name}: vs cpu {worst_cpu:.3e}",
                spec.name,
                fmt.name()
            ));
        }
        // Prompts of under 4 tokens go through the GEMV when prefilled alone and through the GEMM
        // in a joint step (f16 weights and activations), so their caches differ by that rounding:
        // the GPU-vs-CPU bound, far below what a wrong position or cache row would give.
        if worst_joint >= rel_bound(fmt) {
            failures.push(format!(
                "{} {} {name}: prompts together vs apart {worst_joint:.3e}",
                spec.name,
                fmt.name()
            ));
        }
        if worst_same >= same_mode_bound(name, fmt) {
            failures.push(format!(
                "{} {} {name}: vs one by one {worst_same:.3e}",
                spec.name,
                fmt.name()
            ));
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_decode_matches_each_sequence_alone_on_tiny_models() {
    require_gpu();
    let mut failures = Vec::new();
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Gemma3] {
        for fmt in [Format::Q4K, Format::Q8_0] {
            run_case(&SynthSpec::tiny(arch), fmt, &mut failures);
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_decode_matches_each_sequence_alone_when_passback_splits() {
    require_gpu();
    let spec = gpu_harness::split_llama();
    let mut failures = Vec::new();
    run_case(&spec, Format::Q4K, &mut failures);
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_decode_refuses_bad_feeds_and_leaves_every_slot_unchanged() {
    require_gpu();
    let spec = SynthSpec::tiny(Arch::Llama);
    let path = tmp("refusals.gguf");
    write_synthetic(&path, &spec, Format::Q8_0, 3, None).expect("synth");
    let pool = hipfire_exec::offload::offload_pool(0).expect("pool");
    let model = Model::load_with_backend(
        &path,
        &LoadOptions {
            ctx_len: Some(8),
            ..LoadOptions::default()
        },
        Arc::new(CpuBackend::with_pool(pool.clone())),
    )
    .expect("load");
    let mut dec =
        GpuDecoder::with_slots(&model, pool, &opts(None, OffloadMode::Pcie), 3).expect("decoder");
    for s in 0..3 {
        dec.select_slot(s).expect("slot");
        dec.prefill(&[1, 2, 3]).expect("prefill");
    }
    dec.select_slot(2).expect("slot");
    dec.prefill(&[4, 5, 6, 7]).expect("fill slot 2 to 7 of 8");
    let vocab = spec.vocab as u32;
    let bad: Vec<(&str, Vec<(usize, u32)>)> = vec![
        ("empty", vec![]),
        ("slot twice", vec![(0, 1), (0, 2)]),
        ("slot out of range", vec![(0, 1), (3, 2)]),
        ("bad token", vec![(0, 1), (1, vocab)]),
        (
            "more feeds than slots",
            vec![(0, 1), (1, 1), (2, 1), (0, 1)],
        ),
    ];
    for (what, feeds) in bad {
        let e = dec.decode_slots(&feeds).expect_err(what);
        eprintln!("{what}: {e}");
        for (s, want) in [(0, 3), (1, 3), (2, 7)] {
            assert_eq!(dec.slot_position(s), want, "{what}: slot {s} moved");
        }
    }
    // Slot 2 takes its last position; then its context is full and the step is refused whole.
    dec.decode_slots(&[(0, 1), (2, 1)]).expect("last position");
    let e = dec
        .decode_slots(&[(1, 1), (2, 1)])
        .expect_err("context full");
    assert!(matches!(e, ModelError::ContextFull { .. }), "{e}");
    assert_eq!(dec.slot_position(1), 3, "slot 1 moved on a refused step");
    assert_eq!(dec.slot_position(2), 8);
    let e = GpuDecoder::with_slots(
        &model,
        hipfire_exec::offload::offload_pool(1).expect("pool"),
        &opts(None, OffloadMode::Pcie),
        0,
    )
    .expect_err("zero slots");
    assert!(e.to_string().contains("slots"), "{e}");
    let _ = std::fs::remove_file(&path);
}
