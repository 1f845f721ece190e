//! GPU tier for the offload executor: a split step's GPU rows are bit-exact with the same rows
//! of a whole `pcie` launch, its CPU rows bit-exact with `cpu` mode, nothing outside the written
//! rows changes (outputs poisoned first), for both join strategies and both forms; share 0 is
//! byte-identical to `cpu`; `auto` converges to a share inside the clamp; a batched split of
//! several outputs over one activation equals its engines' rows, also when two such splits are
//! queued back to back with the second reading the first's output.
//!
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` on the GPU box runs them.

use std::sync::Arc;

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::{JoinStrategy, OffloadExecutor, OffloadMode, SpilledStep};
use hipfire_exec::share::{plan_rows, Form, ShapeKey, ShareSetting, SHARE_MAX, SHARE_MIN};
use hipfire_exec::CpuPool;
use hipfire_exec::SpilledBatch;
use hipfire_gpu::{
    Activation, Context, DeviceBuffer, GemvForm, GemvKernels, HostMappedBuffer, KernelRegistry,
    Stream, WeightRef,
};
use hipfire_quant::Format;
use rand::{Rng, SeedableRng};

/// An odd row count (not a multiple of the 16-row split grid) at a 9B-class width.
const M: usize = 4104;
const K: usize = 4096;
/// |GPU − CPU| / max|y| over a whole matrix. The engines quantise the activation differently
/// (GPU: int8 per 32 with an f32 scale; CPU: per 32 for legacy formats, per 256 for K-quants),
/// so they differ by activation rounding: measured 5.1e-3 for Q4_K on the H200 box (2026-11-29,
/// random ±1 x, k = 4096), where max|y| is ~30× below Σ|w·x| from cancellation.
const ENGINE_REL_BOUND: f32 = 2e-2;

struct Fixture {
    ctx: Arc<Context>,
    stream: Stream,
    kernels: GemvKernels,
    pool: CpuPool,
}

/// Device 0 and what runs on it; a machine without a usable GPU fails the test with the reason.
fn fixture() -> Fixture {
    let ctx = Context::new(0).unwrap_or_else(|e| panic!("GPU tier: no usable GPU: {e}"));
    let stream = ctx.new_stream().expect("stream");
    let kernels = GemvKernels::new(&KernelRegistry::new(&ctx)).expect("kernels");
    Fixture {
        ctx,
        stream,
        kernels,
        pool: hipfire_exec::offload::offload_pool(0).expect("pool"),
    }
}

fn weight(ctx: &Arc<Context>, fmt: Format, seed: u64) -> Arc<HostMappedBuffer> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let rb = fmt.row_bytes(K).expect("k");
    let mut host = ctx.alloc_host_mapped(M * rb).expect("host-mapped");
    for row in host.as_mut_slice().chunks_exact_mut(rb) {
        let v: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        row.copy_from_slice(&hipfire_quant::quantize_row(fmt, &v).expect("quantise"));
    }
    Arc::new(host)
}

/// Runs one step in `mode` from output start values `y0`; returns the output.
#[allow(clippy::too_many_arguments)]
fn run(
    f: &Fixture,
    mode: OffloadMode,
    w: &Arc<HostMappedBuffer>,
    fmt: Format,
    x: &DeviceBuffer<f32>,
    act: &Activation,
    y0: &[f32],
    form: GemvForm,
) -> Vec<f32> {
    let mut ex = OffloadExecutor::new(&f.ctx, f.pool.clone(), mode, K, M).expect("executor");
    let mut y = f.ctx.alloc::<f32>(M).expect("y");
    y.upload(&f.stream, y0).expect("upload");
    let wr = WeightRef::new(w.as_ref(), 0, fmt, M, K).expect("weight");
    ex.run(
        &f.stream,
        &f.kernels,
        act,
        SpilledStep {
            weight: &wr,
            host: w.clone(),
            x,
            y: &mut y,
            form,
        },
    )
    .expect("step");
    f.stream.synchronize().expect("sync");
    download(f, &y)
}

/// The `M` outputs of `y` (the stream must have drained).
fn download(f: &Fixture, y: &DeviceBuffer<f32>) -> Vec<f32> {
    let mut out = vec![0f32; M];
    y.download(&f.stream, &mut out).expect("download");
    out
}

/// Bit patterns, for exact comparisons that print usefully.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn split_arms_are_bit_exact_with_their_engines_and_write_only_their_rows() {
    let f = fixture();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for (i, fmt) in [
        Format::Q4K,
        Format::Q8_0,
        Format::Q4_0,
        Format::Q6K,
        Format::Hfq4G256,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q5K,
        Format::Iq4Nl,
        Format::Iq4Xs,
        Format::Q3K,
        Format::Q2K,
    ]
    .into_iter()
    .enumerate()
    {
        let w = weight(&f.ctx, fmt, 100 + i as u64);
        let xs: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut x = f.ctx.alloc::<f32>(K).expect("x");
        x.upload(&f.stream, &xs).expect("x up");
        let mut act = Activation::new(&f.ctx, K).expect("act");
        f.kernels.prepare(&f.stream, &x, &mut act).expect("prepare");
        for form in [GemvForm::Plain, GemvForm::Residual] {
            // Plain: poisoned with NaN (every row must be overwritten). Residual: random base.
            let y0: Vec<f32> = match form {
                GemvForm::Plain => vec![f32::NAN; M],
                GemvForm::Residual => (0..M).map(|_| rng.random_range(-2.0f32..2.0)).collect(),
            };
            let pcie = run(&f, OffloadMode::Pcie, &w, fmt, &x, &act, &y0, form);
            let cpu = run(&f, OffloadMode::Cpu, &w, fmt, &x, &act, &y0, form);
            assert!(
                pcie.iter().chain(&cpu).all(|v| v.is_finite()),
                "{fmt} {form:?}: unwritten rows"
            );
            let share = 0.3;
            let g = plan_rows(M, fmt.row_bytes(K).expect("rb"), share).expect("splittable");
            for strategy in JoinStrategy::ALL {
                let mode = OffloadMode::Passback {
                    share: ShareSetting::Pinned(share),
                    strategy,
                };
                let split = run(&f, mode, &w, fmt, &x, &act, &y0, form);
                assert_eq!(
                    bits(&split[..g]),
                    bits(&pcie[..g]),
                    "{fmt} {form:?} {strategy:?}: GPU rows differ from a whole launch"
                );
                assert_eq!(
                    bits(&split[g..]),
                    bits(&cpu[g..]),
                    "{fmt} {form:?} {strategy:?}: CPU rows differ from cpu mode"
                );
            }
            let zero = run(
                &f,
                OffloadMode::Passback {
                    share: ShareSetting::Off,
                    strategy: JoinStrategy::Ordering,
                },
                &w,
                fmt,
                &x,
                &act,
                &y0,
                form,
            );
            assert_eq!(bits(&zero), bits(&cpu), "{fmt}: share 0 != cpu");
            // The two engines differ only by rounding: state the bound measured.
            let scale = pcie.iter().map(|v| v.abs()).fold(0f32, f32::max);
            let worst = pcie
                .iter()
                .zip(&cpu)
                .map(|(a, b)| (a - b).abs() / scale)
                .fold(0f32, f32::max);
            eprintln!("{fmt} {form:?}: split at g={g}; max |gpu-cpu|/max|y| = {worst:.2e}");
            assert!(
                worst < ENGINE_REL_BOUND,
                "{fmt} {form:?}: engines disagree by {worst}"
            );
        }
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn auto_share_converges_inside_the_clamp() {
    let f = fixture();
    let fmt = Format::Q4K;
    let w = weight(&f.ctx, fmt, 5);
    let mut x = f.ctx.alloc::<f32>(K).expect("x");
    let xs: Vec<f32> = (0..K)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    x.upload(&f.stream, &xs).expect("x");
    let mut act = Activation::new(&f.ctx, K).expect("act");
    f.kernels.prepare(&f.stream, &x, &mut act).expect("prepare");
    let mode = OffloadMode::Passback {
        share: ShareSetting::Auto,
        strategy: JoinStrategy::Ordering,
    };
    let mut ex = OffloadExecutor::new(&f.ctx, f.pool.clone(), mode, K, M).expect("executor");
    let mut y = f.ctx.alloc::<f32>(M).expect("y");
    let wr = WeightRef::new(w.as_ref(), 0, fmt, M, K).expect("weight");
    for _ in 0..200 {
        ex.run(
            &f.stream,
            &f.kernels,
            &act,
            SpilledStep {
                weight: &wr,
                host: w.clone(),
                x: &x,
                y: &mut y,
                form: GemvForm::Plain,
            },
        )
        .expect("step");
    }
    f.stream.synchronize().expect("sync");
    let key = ShapeKey {
        format: fmt,
        k: K,
        form: Form::Plain,
        cols: 1,
    };
    let s = ex.controller().gpu_share(&key);
    eprintln!(
        "auto share after 200 steps: {s:.3}; state {:?}",
        ex.controller().snapshot(&key)
    );
    assert!(
        (SHARE_MIN..=SHARE_MAX).contains(&s),
        "share {s} outside the clamp"
    );
}

/// `flags` queues steps without waiting for either engine, so a chain of steps runs with the
/// host several steps ahead: alternating activations (a publish that overwrote x before the
/// workers of the step before had read it would show), residual steps accumulating into one
/// output (a fold reading rows of the wrong step would show) and plain steps into fresh,
/// NaN-poisoned outputs, over two weights of different formats. The chain run without any wait
/// must equal, bit for bit, the same chain with the stream and the executor drained after
/// every step — under each kept tuning (prefetch budgets, chunks per worker, the fenced publish
/// of `memory.flags_x_publish = fenced`), with and without the device timeline (whose fold
/// counts waits across the fold's blocks).
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn flags_steps_queued_back_to_back_equal_steps_run_one_at_a_time() {
    let f = fixture();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    let ws = [
        (weight(&f.ctx, Format::Q4K, 31), Format::Q4K),
        (weight(&f.ctx, Format::Q8_0, 32), Format::Q8_0),
    ];
    let mut xs = Vec::new();
    let mut acts = Vec::new();
    for _ in 0..2 {
        let v: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut x = f.ctx.alloc::<f32>(K).expect("x");
        x.upload(&f.stream, &v).expect("x up");
        let mut act = Activation::new(&f.ctx, K).expect("act");
        f.kernels.prepare(&f.stream, &x, &mut act).expect("prepare");
        xs.push(x);
        acts.push(act);
    }
    const STEPS: usize = 12;
    let base: Vec<f32> = (0..M).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    let chain = |drain_each: bool, tuning: FlagsTuning, timeline: bool| {
        let mode = OffloadMode::Passback {
            share: ShareSetting::Pinned(0.3),
            strategy: JoinStrategy::Flags,
        };
        let mut ex = OffloadExecutor::new(&f.ctx, f.pool.clone(), mode, K, M).expect("executor");
        ex.set_flags_tuning(tuning);
        ex.set_timeline(timeline);
        let mut acc = f.ctx.alloc::<f32>(M).expect("acc");
        acc.upload(&f.stream, &base).expect("acc up");
        let mut plains: Vec<DeviceBuffer<f32>> = (0..STEPS / 3)
            .map(|_| {
                let mut y = f.ctx.alloc::<f32>(M).expect("y");
                y.upload(&f.stream, &vec![f32::NAN; M]).expect("poison");
                y
            })
            .collect();
        f.stream.synchronize().expect("sync");
        let mut accounted = 0;
        for i in 0..STEPS {
            let (w, fmt) = &ws[i % 2];
            let wr = WeightRef::new(w.as_ref(), 0, *fmt, M, K).expect("weight");
            let (x, act) = (&xs[(i / 2) % 2], &acts[(i / 2) % 2]);
            let (y, form) = if i % 3 == 2 {
                (&mut plains[i / 3], GemvForm::Plain)
            } else {
                (&mut acc, GemvForm::Residual)
            };
            ex.run(
                &f.stream,
                &f.kernels,
                act,
                SpilledStep {
                    weight: &wr,
                    host: w.clone(),
                    x,
                    y,
                    form,
                },
            )
            .expect("step");
            if drain_each {
                f.stream.synchronize().expect("sync");
                accounted += ex.take_arm_account().expect("drain").steps;
            }
        }
        f.stream.synchronize().expect("sync");
        let account = ex.take_arm_account().expect("account");
        accounted += account.steps;
        assert_eq!(accounted, STEPS as u64, "every split step was accounted");
        if timeline && !drain_each {
            assert!(
                account.fold_wait_ns > 0.0,
                "{tuning:?}: the folds counted their waits"
            );
            assert!(
                account.fold_wait_ns < account.fold_ns,
                "{tuning:?}: a wait inside its fold"
            );
        }
        (
            download(&f, &acc),
            plains.iter().map(|y| download(&f, y)).collect::<Vec<_>>(),
        )
    };
    let (acc_one, plain_one) = chain(true, FlagsTuning::default(), false);
    assert!(acc_one
        .iter()
        .chain(plain_one.iter().flatten())
        .all(|v| v.is_finite()));
    assert_ne!(
        bits(&acc_one),
        bits(&base),
        "the residual steps added something"
    );
    #[allow(unused_mut)] // pushed to under the `experiments` feature
    let mut tunings = vec![
        (FlagsTuning::default(), false),
        (FlagsTuning::default(), true),
        (
            FlagsTuning {
                prefetch_bytes: 256 << 10,
                ..FlagsTuning::default()
            },
            false,
        ),
        (
            FlagsTuning {
                prefetch_bytes: 0,
                ..FlagsTuning::default()
            },
            false,
        ),
        (
            FlagsTuning {
                chunks_per_worker: 1,
                ..FlagsTuning::default()
            },
            true,
        ),
        // `memory.flags_x_publish = fenced`: x behind a fence and the sequence word.
        (
            FlagsTuning {
                tagged_x: false,
                ..FlagsTuning::default()
            },
            true,
        ),
        (
            FlagsTuning {
                tagged_x: false,
                chunks_per_worker: 1,
                ..FlagsTuning::default()
            },
            false,
        ),
    ];
    #[cfg(feature = "experiments")]
    tunings.push((
        FlagsTuning {
            publish_blocks: 16,
            ..FlagsTuning::default()
        },
        false,
    ));
    for (tuning, timeline) in tunings {
        let (acc_ahead, plain_ahead) = chain(false, tuning, timeline);
        assert_eq!(
            bits(&acc_ahead),
            bits(&acc_one),
            "{tuning:?}: residual chain"
        );
        for (i, (a, b)) in plain_ahead.iter().zip(&plain_one).enumerate() {
            assert_eq!(bits(a), bits(b), "{tuning:?}: plain step {i}");
        }
    }
}

/// `run_shared` under `flags` runs three outputs of one activation (q/k/v) as one split step:
/// one CPU arm over all their CPU rows, one fold into all three. Every output equals, bit for
/// bit, the same output run as its own step, and no row is left unwritten (NaN-poisoned).
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn shared_step_equals_its_outputs_run_one_by_one() {
    let f = fixture();
    let fmt = Format::Q4K;
    let ws: Vec<Arc<HostMappedBuffer>> = (0..3).map(|i| weight(&f.ctx, fmt, 60 + i)).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(61);
    let xs: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut x = f.ctx.alloc::<f32>(K).expect("x");
    x.upload(&f.stream, &xs).expect("x up");
    let mut act = Activation::new(&f.ctx, K).expect("act");
    f.kernels.prepare(&f.stream, &x, &mut act).expect("prepare");
    let refs: Vec<WeightRef<'_>> = ws
        .iter()
        .map(|w| WeightRef::new(w.as_ref(), 0, fmt, M, K).expect("weight"))
        .collect();
    let run_all = |shared: bool| -> (Vec<Vec<f32>>, u64) {
        let mode = OffloadMode::Passback {
            share: ShareSetting::Pinned(0.3),
            strategy: JoinStrategy::Flags,
        };
        let mut ex =
            OffloadExecutor::new(&f.ctx, f.pool.clone(), mode, K, 3 * M).expect("executor");
        let mut ys: Vec<DeviceBuffer<f32>> = (0..3)
            .map(|_| {
                let mut y = f.ctx.alloc::<f32>(M).expect("y");
                y.upload(&f.stream, &vec![f32::NAN; M]).expect("poison");
                y
            })
            .collect();
        let mut steps: Vec<SpilledStep<'_>> = refs
            .iter()
            .zip(&ws)
            .zip(ys.iter_mut())
            .map(|((wr, w), y)| SpilledStep {
                weight: wr,
                host: w.clone(),
                x: &x,
                y,
                form: GemvForm::Plain,
            })
            .collect();
        if shared {
            ex.run_shared(&f.stream, &f.kernels, &act, &mut steps)
                .expect("shared step");
        } else {
            for st in steps {
                ex.run(&f.stream, &f.kernels, &act, st).expect("step");
            }
        }
        f.stream.synchronize().expect("sync");
        let steps = ex.take_arm_account().expect("account").steps;
        (ys.iter().map(|y| download(&f, y)).collect(), steps)
    };
    let (one_by_one, n_separate) = run_all(false);
    assert_eq!(n_separate, 3, "three split steps");
    let (shared, n_shared) = run_all(true);
    assert_eq!(n_shared, 1, "one split step for the three outputs");
    for (i, (a, b)) in shared.iter().zip(&one_by_one).enumerate() {
        assert!(
            a.iter().all(|v| v.is_finite()),
            "output {i}: unwritten rows"
        );
        assert_eq!(bits(a), bits(b), "output {i}");
    }
}

/// Weights of a batched chain: `chain_w[0]` is `K × K` (its output is the next one's x),
/// `chain_w[1..]` are `M × K` and share that x.
fn chain_weights(f: &Fixture, fmt: Format) -> (Arc<HostMappedBuffer>, Vec<Arc<HostMappedBuffer>>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(90);
    let rb = fmt.row_bytes(K).expect("k");
    let mut first = f.ctx.alloc_host_mapped(K * rb).expect("host-mapped");
    for row in first.as_mut_slice().chunks_exact_mut(rb) {
        // Small weights: the first output stays in the range of a layer's activation.
        let v: Vec<f32> = (0..K).map(|_| rng.random_range(-0.05f32..0.05)).collect();
        row.copy_from_slice(&hipfire_quant::quantize_row(fmt, &v).expect("quantise"));
    }
    let rest = (0..2).map(|i| weight(&f.ctx, fmt, 91 + i)).collect();
    (Arc::new(first), rest)
}

/// In `mode`, over `cols` columns of `xs`: `h = W0·x` (plain), then `y_i (+)= W_i·h` for both
/// other weights as one shared call (`form`, from `y0`), queued back to back with no host wait
/// between them unless `sync_between`. Returns h and the two outputs.
#[allow(clippy::too_many_arguments)]
fn run_chain(
    f: &Fixture,
    mode: OffloadMode,
    fmt: Format,
    (w0, ws): &(Arc<HostMappedBuffer>, Vec<Arc<HostMappedBuffer>>),
    xs: &[f32],
    cols: usize,
    y0: &[f32],
    form: GemvForm,
    sync_between: bool,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut ex = OffloadExecutor::new(&f.ctx, f.pool.clone(), mode, K, 2 * M).expect("executor");
    ex.reserve_columns(cols).expect("columns");
    let mut x = f.ctx.alloc::<f32>(cols * K).expect("x");
    x.upload(&f.stream, xs).expect("x up");
    let mut act = Activation::with_columns(&f.ctx, K, cols).expect("act");
    f.kernels
        .prepare_cols(&f.stream, &x, &mut act, cols)
        .expect("prepare");
    let mut h = f.ctx.alloc::<f32>(cols * K).expect("h");
    h.upload(&f.stream, &vec![f32::NAN; cols * K])
        .expect("poison");
    let r0 = WeightRef::new(w0.as_ref(), 0, fmt, K, K).expect("weight");
    ex.run_cols(
        &f.stream,
        &f.kernels,
        &act,
        SpilledBatch {
            weight: &r0,
            host: w0.clone(),
            x: &x,
            y: &mut h,
            form: GemvForm::Plain,
            cols,
        },
    )
    .expect("first step");
    if sync_between {
        f.stream.synchronize().expect("sync");
    }
    let mut act_h = Activation::with_columns(&f.ctx, K, cols).expect("act");
    f.kernels
        .prepare_cols(&f.stream, &h, &mut act_h, cols)
        .expect("prepare h");
    let refs: Vec<WeightRef<'_>> = ws
        .iter()
        .map(|w| WeightRef::new(w.as_ref(), 0, fmt, M, K).expect("weight"))
        .collect();
    let mut ys = outputs(f, ws.len(), y0);
    let mut steps: Vec<SpilledBatch<'_>> = refs
        .iter()
        .zip(ws)
        .zip(ys.iter_mut())
        .map(|((wr, w), y)| SpilledBatch {
            weight: wr,
            host: w.clone(),
            x: &h,
            y,
            form,
            cols,
        })
        .collect();
    ex.run_cols_shared(&f.stream, &f.kernels, &act_h, &mut steps)
        .expect("shared step");
    drop(steps);
    f.stream.synchronize().expect("sync");
    let mut hv = vec![0f32; cols * K];
    h.download(&f.stream, &mut hv).expect("h down");
    (hv, downloads(f, &ys, cols * M))
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_shared_splits_equal_their_engines_back_to_back() {
    let f = fixture();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(92);
    for fmt in [Format::Q4K, Format::Q8_0] {
        let weights = chain_weights(&f, fmt);
        let rb = fmt.row_bytes(K).expect("rb");
        let share = 0.3;
        let g_k = plan_rows(K, rb, share).expect("splittable");
        let g_m = plan_rows(M, rb, share).expect("splittable");
        for cols in [2usize, 8] {
            let xs: Vec<f32> = (0..cols * K)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            for form in [GemvForm::Plain, GemvForm::Residual] {
                let y0: Vec<f32> = match form {
                    GemvForm::Plain => vec![f32::NAN; cols * M],
                    GemvForm::Residual => (0..cols * M)
                        .map(|_| rng.random_range(-2.0f32..2.0))
                        .collect(),
                };
                let chain =
                    |mode, sync| run_chain(&f, mode, fmt, &weights, &xs, cols, &y0, form, sync);
                let pinned = OffloadMode::Passback {
                    share: ShareSetting::Pinned(share),
                    strategy: JoinStrategy::Flags,
                };
                let what = format!("{fmt} cols {cols} {form:?}");
                let (h_split, y_split) = chain(pinned.clone(), false);
                let (h_sync, y_sync) = chain(pinned, true);
                // Back to back without a host wait equals the same splits with one between.
                assert_eq!(bits(&h_split), bits(&h_sync), "{what}: first output");
                for (i, (a, b)) in y_split.iter().zip(&y_sync).enumerate() {
                    assert!(
                        a.iter().all(|v| v.is_finite()),
                        "{what}: output {i} unwritten rows"
                    );
                    assert_eq!(bits(a), bits(b), "{what}: output {i} back to back");
                }
                // Each engine's rows equal that engine alone over the same input: the first
                // step's against `pcie` and `cpu` from x; the shared step's against them from
                // the split's own h (so that the first step's mixed rows do not carry over).
                let (h_pcie, _) = chain(OffloadMode::Pcie, true);
                let (h_cpu, _) = chain(OffloadMode::Cpu, true);
                assert!(
                    h_split.iter().all(|v| v.is_finite()),
                    "{what}: h unwritten rows"
                );
                for c in 0..cols {
                    let col = |v: &[f32]| v[c * K..(c + 1) * K].to_vec();
                    assert_eq!(
                        bits(&col(&h_split)[..g_k]),
                        bits(&col(&h_pcie)[..g_k]),
                        "{what}: first step's GPU rows, column {c}"
                    );
                    cpu_rows_agree(
                        fmt,
                        cols,
                        &col(&h_split)[g_k..],
                        &col(&h_cpu)[g_k..],
                        &format!("{what}: first step's CPU rows, column {c}"),
                    );
                }
                let from_h =
                    |mode| shared_only(&f, mode, fmt, &weights.1, &h_split, cols, &y0, form);
                let y_pcie = from_h(OffloadMode::Pcie);
                let y_cpu = from_h(OffloadMode::Cpu);
                for (i, y) in y_split.iter().enumerate() {
                    for c in 0..cols {
                        let col = |v: &[f32]| v[c * M..(c + 1) * M].to_vec();
                        assert_eq!(
                            bits(&col(y)[..g_m]),
                            bits(&col(&y_pcie[i])[..g_m]),
                            "{what}: output {i} GPU rows, column {c}"
                        );
                        cpu_rows_agree(
                            fmt,
                            cols,
                            &col(y)[g_m..],
                            &col(&y_cpu[i])[g_m..],
                            &format!("{what}: output {i} CPU rows, column {c}"),
                        );
                    }
                }
            }
        }
    }
}

/// A split's CPU rows against the same rows of `cpu` mode: bit for bit where the CPU's
/// multi-column kernel sums each row as the one-column one does; otherwise (the tiled Q4_K
/// kernel, which sums a row in another order where its 16-row group starts elsewhere: a fused
/// split's second output starts at an unaligned row of the pool's row space) within float
/// rounding, as the pool's own multi-token test bounds it.
fn cpu_rows_agree(fmt: Format, cols: usize, got: &[f32], want: &[f32], what: &str) {
    if hipfire_quant::multi_matches_single(hipfire_quant::simd_tier(), fmt, cols) {
        assert_eq!(bits(got), bits(want), "{what}");
        return;
    }
    for (a, b) in got.iter().zip(want) {
        let tol = 1e-5 * (1.0 + b.abs());
        assert!((a - b).abs() <= tol, "{what}: {a} vs {b}");
    }
}

/// The shared call of [`run_chain`] alone, from `h` on the host.
#[allow(clippy::too_many_arguments)]
fn shared_only(
    f: &Fixture,
    mode: OffloadMode,
    fmt: Format,
    ws: &[Arc<HostMappedBuffer>],
    hv: &[f32],
    cols: usize,
    y0: &[f32],
    form: GemvForm,
) -> Vec<Vec<f32>> {
    let mut ex = OffloadExecutor::new(&f.ctx, f.pool.clone(), mode, K, 2 * M).expect("executor");
    ex.reserve_columns(cols).expect("columns");
    let mut h = f.ctx.alloc::<f32>(cols * K).expect("h");
    h.upload(&f.stream, hv).expect("h up");
    let mut act = Activation::with_columns(&f.ctx, K, cols).expect("act");
    f.kernels
        .prepare_cols(&f.stream, &h, &mut act, cols)
        .expect("prepare");
    let refs: Vec<WeightRef<'_>> = ws
        .iter()
        .map(|w| WeightRef::new(w.as_ref(), 0, fmt, M, K).expect("weight"))
        .collect();
    let mut ys = outputs(f, ws.len(), y0);
    for (i, y) in ys.iter_mut().enumerate() {
        ex.run_cols(
            &f.stream,
            &f.kernels,
            &act,
            SpilledBatch {
                weight: &refs[i],
                host: ws[i].clone(),
                x: &h,
                y,
                form,
                cols,
            },
        )
        .expect("step");
    }
    f.stream.synchronize().expect("sync");
    downloads(f, &ys, cols * M)
}

/// `n` device outputs, each starting as `y0`.
fn outputs(f: &Fixture, n: usize, y0: &[f32]) -> Vec<DeviceBuffer<f32>> {
    (0..n)
        .map(|_| {
            let mut y = f.ctx.alloc::<f32>(y0.len()).expect("y");
            y.upload(&f.stream, y0).expect("y0");
            y
        })
        .collect()
}

/// The first `len` values of each output (the stream must have drained).
fn downloads(f: &Fixture, ys: &[DeviceBuffer<f32>], len: usize) -> Vec<Vec<f32>> {
    ys.iter()
        .map(|y| {
            let mut v = vec![0f32; len];
            y.download(&f.stream, &mut v).expect("y down");
            v
        })
        .collect()
}
