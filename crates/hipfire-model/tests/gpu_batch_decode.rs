//! GPU tier: a batched decode step over several sequence slots (`GpuDecoder::decode_slots`)
//! against each sequence run alone — on the CPU (the independent reference, within the
//! GPU-vs-CPU bound of tests/gpu_synth.rs) and one feed at a time through the one-token decode
//! path of the same decoder (within a much tighter bound where no rows are cut between the
//! engines) — for several architectures and every offload mode, with prompts of different lengths
//! (prefilled one by one, all together in one batched step, and as rows of a batched decode
//! step: `GpuDecoder::decode_segments`, how `hipfire serve` lets a short prompt ride along),
//! feeds that skip slots, and a slot reset and refilled mid-way (its refill riding along with
//! the other slots' decode tokens in one step).
//!
//! Gated by `HIPFIRE_GPU_TESTS=1`; skipped with a printed reason otherwise.

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
use gpu_harness::{gated, rel, rel_bound};

/// One decode step's feeds: (slot, token).
type Feeds = Vec<(usize, u32)>;
/// One batched decode step's segments: (slot, tokens).
type Segs<'a> = Vec<(usize, &'a [u32])>;

/// Sequence slots of the batched decoder.
const SLOTS: usize = 5;

/// How [`drive`] feeds the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// Prompts prefilled one by one; each decode step's feeds through the one-token `step`.
    OneByOne,
    /// Prompts prefilled one by one; each decode step as one `decode_slots`.
    Batched,
    /// Prompts in one `prefill_slots` step; the refill in one with the other slots' decode
    /// tokens as one-token segments; decode steps as `decode_slots`.
    Together,
    /// Prompts as the rows of one `decode_segments` step; the refill plus slot 1's own decode
    /// token riding along with the other slots' decode tokens in one `decode_segments` step;
    /// decode steps as `decode_slots`.
    RideAlong,
}

/// What [`drive`] records: each slot's logits after its prompt, and after every decode step it
/// took part in.
struct Driven {
    prompts: Vec<Vec<f32>>,
    steps: Vec<Vec<Vec<f32>>>,
}

/// Batched GPU against one feed at a time on the GPU, same mode. Resident and `pcie` run the same kernels
/// on the same bits (the multi-column GEMV sums each column as the one-column one does), so
/// they agree to float noise; modes that split cut the rows between the engines where each
/// controller says (a batched step's shares are its own), and a row the CPU computes differs
/// from the GPU's by activation rounding.
fn same_mode_bound(mode: &str, fmt: Format) -> f64 {
    match mode {
        "resident" | "pcie" => 1e-4,
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

/// Each slot's logits after its prompt and after every decode step it took part in, from `dec`
/// (every slot reset and given its prompt first), fed as `how` says.
fn drive(dec: &mut GpuDecoder<'_>, sc: &Script, vocab: usize, how: How) -> Driven {
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); SLOTS];
    let mut prompts: Vec<Vec<f32>> = vec![Vec::new(); SLOTS];
    for s in 0..SLOTS {
        dec.select_slot(s).expect("slot");
        dec.reset();
    }
    let segs: Vec<(usize, &[u32])> = sc
        .prompts
        .iter()
        .enumerate()
        .map(|(s, p)| (s, p.as_slice()))
        .collect();
    match how {
        How::Together | How::RideAlong => {
            let rows = if how == How::Together {
                dec.prefill_slots(&segs).expect("prefill together").to_vec()
            } else {
                dec.decode_segments(&segs)
                    .expect("prompts as decode rows")
                    .to_vec()
            };
            assert_eq!(
                rows.len(),
                SLOTS * vocab,
                "{how:?}: one logits row per prompt"
            );
            for (s, row) in rows.chunks_exact(vocab).enumerate() {
                prompts[s] = row.to_vec();
            }
            for (s, p) in sc.prompts.iter().enumerate() {
                assert_eq!(
                    dec.slot_position(s),
                    p.len(),
                    "{how:?}: slot {s} after the joint prompts"
                );
            }
        }
        How::OneByOne | How::Batched => {
            for (s, p) in sc.prompts.iter().enumerate() {
                dec.select_slot(s).expect("slot");
                prompts[s] = dec.prefill(p).expect("prefill").to_vec();
            }
        }
    }
    for (i, feeds) in sc.steps.iter().enumerate() {
        let mut feeds = feeds.clone();
        if i == sc.refill_at {
            dec.select_slot(1).expect("slot");
            dec.reset();
            match how {
                How::Together => {
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
                }
                How::RideAlong => {
                    // One batched decode step: every slot's decode token, slot 1's after its
                    // refill (a 7-row segment in the middle of one-row ones), so that its last
                    // row's logits are the decode step's.
                    let own: Vec<Vec<u32>> = feeds
                        .iter()
                        .map(|&(s, t)| {
                            if s == 1 {
                                sc.refill.iter().copied().chain([t]).collect()
                            } else {
                                vec![t]
                            }
                        })
                        .collect();
                    let segs: Vec<(usize, &[u32])> = feeds
                        .iter()
                        .zip(&own)
                        .map(|(f, t)| (f.0, t.as_slice()))
                        .collect();
                    assert!(segs.iter().any(|s| s.0 == 1 && s.1.len() > 1));
                    let rows = dec
                        .decode_segments(&segs)
                        .expect("refill riding along")
                        .to_vec();
                    assert_eq!(rows.len(), segs.len() * vocab, "one logits row per segment");
                    for (&(s, _), row) in feeds.iter().zip(rows.chunks_exact(vocab)) {
                        got[s].push(row.to_vec());
                    }
                    assert_eq!(dec.slot_position(1), sc.refill.len() + 1, "slot 1 after");
                    continue;
                }
                How::OneByOne | How::Batched => {
                    dec.select_slot(1).expect("slot");
                    dec.prefill(&sc.refill).expect("refill");
                }
            }
        }
        let feeds = &feeds;
        if how == How::OneByOne {
            for &(s, t) in feeds {
                dec.select_slot(s).expect("slot");
                got[s].push(dec.step(t).expect("step").to_vec());
            }
        } else {
            let rows = dec.decode_slots(feeds).expect("batched step").to_vec();
            assert_eq!(rows.len(), feeds.len() * vocab, "logits rows");
            for (&(s, _), row) in feeds.iter().zip(rows.chunks_exact(vocab)) {
                got[s].push(row.to_vec());
            }
        }
    }
    Driven {
        prompts,
        steps: got,
    }
}

fn run_case(spec: &SynthSpec, fmt: Format, failures: &mut Vec<String>) {
    let path = tmp(&format!("{}-{}.gguf", spec.name, fmt.name()));
    let (model, pool) = gpu_harness::load_synth(&path, spec, fmt, 11);
    let sc = script(spec.vocab as u32);

    // The CPU reference: one session per slot, token by token.
    let mut cpu: Vec<Vec<Vec<f32>>> = vec![Vec::new(); SLOTS];
    let mut cpu_prompts: Vec<Vec<f32>> = vec![Vec::new(); SLOTS];
    {
        let mut sessions: Vec<_> = (0..SLOTS).map(|_| model.session()).collect();
        let feed = |sess: &mut hipfire_model::Session<'_>, p: &[u32]| {
            sess.reset();
            for &t in p {
                sess.step(t).expect("cpu step");
            }
            sess.logits().to_vec()
        };
        for (s, p) in sc.prompts.iter().enumerate() {
            cpu_prompts[s] = feed(&mut sessions[s], p);
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
        let driven = drive(&mut dec, &sc, spec.vocab, How::Batched);
        let got = &driven.steps;
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
        let single = drive(&mut dec, &sc, spec.vocab, How::OneByOne).steps;
        let together = drive(&mut dec, &sc, spec.vocab, How::Together).steps;
        let ride = drive(&mut dec, &sc, spec.vocab, How::RideAlong);
        let (mut worst_cpu, mut worst_same, mut worst_joint) = (0f64, 0f64, 0f64);
        let (mut ride_cpu, mut ride_apart) = (0f64, 0f64);
        for s in 0..SLOTS {
            assert_eq!(got[s].len(), cpu[s].len(), "{name}: slot {s} steps");
            assert_eq!(
                ride.steps[s].len(),
                cpu[s].len(),
                "{name}: slot {s} ride steps"
            );
            for (j, g) in got[s].iter().enumerate() {
                worst_cpu = worst_cpu.max(rel(g, &cpu[s][j]));
                worst_same = worst_same.max(rel(g, &single[s][j]));
                worst_joint = worst_joint.max(rel(&together[s][j], g));
                ride_cpu = ride_cpu.max(rel(&ride.steps[s][j], &cpu[s][j]));
                ride_apart = ride_apart.max(rel(&ride.steps[s][j], g));
            }
            // The prompts' own logits (what a server samples the first token from).
            ride_cpu = ride_cpu.max(rel(&ride.prompts[s], &cpu_prompts[s]));
            ride_apart = ride_apart.max(rel(&ride.prompts[s], &driven.prompts[s]));
            worst_cpu = worst_cpu.max(rel(&driven.prompts[s], &cpu_prompts[s]));
        }
        eprintln!(
            "{} {} {name}: batched vs cpu {worst_cpu:.2e}, vs one by one on the gpu {worst_same:.2e}, prompts prefilled together vs apart {worst_joint:.2e}, prompts riding along in decode steps vs cpu {ride_cpu:.2e}, vs prefilled apart {ride_apart:.2e} ({})",
            spec.name,
            fmt.name(),
            dec.placement_summary()
        );
        // A prompt riding along runs the decode step's kernels (the multi-column GEMV, the
        // slots forms) where a prefill of 4 tokens or more runs the GEMM and chunk attention
        // (f16 weights and activations): the GPU-vs-CPU bound, as for prompts prefilled
        // together, far below what a wrong position, cache row or logits row would give.
        for (what, worst) in [
            ("ride along vs cpu", ride_cpu),
            ("ride along vs apart", ride_apart),
        ] {
            if worst >= rel_bound(fmt) {
                failures.push(format!(
                    "{} {} {name}: {what} {worst:.3e}",
                    spec.name,
                    fmt.name()
                ));
            }
        }
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
fn batched_decode_matches_each_sequence_alone_on_tiny_models() {
    if !gated() {
        return;
    }
    let mut failures = Vec::new();
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Gemma3] {
        for fmt in [Format::Q4K, Format::Q8_0] {
            run_case(&SynthSpec::tiny(arch), fmt, &mut failures);
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

#[test]
fn batched_decode_matches_each_sequence_alone_when_passback_splits() {
    if !gated() {
        return;
    }
    let spec = gpu_harness::split_llama();
    let mut failures = Vec::new();
    run_case(&spec, Format::Q4K, &mut failures);
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

#[test]
fn batched_decode_refuses_bad_feeds_and_leaves_every_slot_unchanged() {
    if !gated() {
        return;
    }
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
    // Segments of several rows (a prompt riding along): the same refusals, whole.
    let cap = dec.decode_rows();
    assert_eq!(cap, 3 + hipfire_model::gpu::RIDE_ALONG_ROWS, "scratch rows");
    let long = vec![1u32; cap + 1];
    let bad_last = [1, 2, vocab];
    let bad_segs: Vec<(&str, Segs<'_>)> = vec![
        ("empty segment", vec![(0, &[1]), (1, &[])]),
        (
            "slot in two segments",
            vec![(0, &[1, 2]), (1, &[1]), (0, &[3])],
        ),
        ("more rows than the scratch", vec![(0, &long[..])]),
        ("bad token in a later row", vec![(0, &[1]), (1, &bad_last)]),
        (
            "past the context",
            vec![(0, &[1]), (1, &[1, 2, 3, 4, 5, 6])],
        ),
    ];
    for (what, segs) in bad_segs {
        let e = dec.decode_segments(&segs).expect_err(what);
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
    // Two slots riding along to their context's end; then a segment one past it is refused.
    let rows = dec
        .decode_segments(&[(0, &[1, 2, 3, 4]), (1, &[1, 2, 3, 4, 5])])
        .expect("rows to the end")
        .len();
    assert_eq!(rows, 2 * spec.vocab, "one logits row per segment");
    assert_eq!((dec.slot_position(0), dec.slot_position(1)), (8, 8));
    dec.truncate_slot(1, 6);
    let e = dec
        .decode_segments(&[(1, &[1, 2, 3])])
        .expect_err("one past the context");
    assert!(matches!(e, ModelError::ContextFull { .. }), "{e}");
    assert_eq!(dec.slot_position(1), 6, "slot 1 moved on a refused step");
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
