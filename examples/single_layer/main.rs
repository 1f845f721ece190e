//! One spilled transformer layer at Llama-3-8B shapes (q, k, v, o, gate, up, down) driven through
//! `resident`, `pcie`, `cpu` and `passback` × each join strategy, plus a sweep of pinned shares.
//! Prints µs per layer and GB/s of weight bytes, checks that every mode's outputs agree with the
//! resident run, and measures the read ceilings (CPU alone, GPU zero-copy alone, both at once)
//! in the same run.
//!
//! ```text
//! cargo run --release --example single_layer -- [--format q4_k|q8_0] [--reps N] [--threads N]
//!     [--sweep] [--per-shape] [--per-shape-joins LIST] [--per-shape-projs LIST] [--h2h-rounds R]
//!     [--json PATH]
//!     [--handshake STEPS] [--timeline] [--flags-variants LIST] [--copies N] [--ab-rounds R]
//!     [--chain N] [--target-rounds R]
//! ```
//! `--sweep` times every pinned share from 0.10 to 0.50 for the whole layer; `--per-shape` does
//! the same one projection at a time and reports `auto` against the best pinned share per shape.
//! `--handshake N` instead times N back-to-back steps of a tiny matrix per join (each join's own
//! per-step cost) and exits. `--timeline` makes the layer runs record the flags timeline too
//! (publish, fold, fold wait, device gap: events and a count that cost each step a little).
//! `--flags-variants` runs the flags join once per listed host-side tuning, for A/B in one run:
//! a comma-separated list of `default` or `+`-joined knobs (`chunks-N` (4 by default): about N
//! chunks of rows per worker, the rest taken off a counter after each worker's first;
//! `prefetch-KIB` (64 by default) of weight rows while waiting; `tagged-x` (the default) |
//! `seq-x`: x published as 8-byte {value, step} words with no fence or sequence word, or plain
//! behind a fenced sequence word, the `memory.flags_x_publish = fenced` fallback; built with
//! `--features experiments`, also `publish-blocks-N` (1 by default): the tagged publish over up
//! to N blocks), e.g. `default,chunks-8,seq-x`. The alternatives that lost their A/B are gone;
//! their figures are in docs/perf-checkpoints. Under `flags`, `--per-shape` races one `auto`
//! per variant against the same pinned rivals (which run the first variant's tuning);
//! `--per-shape-joins` and `--per-shape-projs` pick the joins and projections it tables, and
//! `--h2h-rounds` its interleaved rounds per row (15).
//! `--ab-rounds R` instead races the flags variants against the first one in R interleaved
//! rounds (one warmed executor each) and exits: the A/B that drift between runs cannot bias.
//! `--chain N` queues N layers per timed rep with no host synchronisation between them, as the
//! decoder queues a token's layers. `--target-rounds R` (7 unless 0) ends the run with the
//! issue's layer targets measured in R interleaved rounds (`targets.rs`).
//! `--copies N` sets how many copies of the layer the reps cycle through (default: enough for
//! 2 GiB, 18 at Q4_K), so that the timed reads come from DRAM rather than the last-level cache.
//!
//! Needs a GPU; on a machine without one it says so and exits 1. The weights are random
//! (64 distinct quantised rows per matrix, tiled), so the figures are bandwidth, not model quality.

mod handshake;
mod per_shape;
mod stats;
mod targets;
mod variants;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use hipfire::exec::bench;
use hipfire::exec::offload::{ArmAccount, JoinStrategy, OffloadExecutor, OffloadMode, SpilledStep};
use hipfire::exec::share::ShareSetting;
use hipfire::gpu::{
    Activation, Context, DeviceBuffer, GemvForm, GemvKernels, HostMappedBuffer, KernelRegistry,
    ReadKernel, RowRange, WeightRef,
};
use hipfire::quant::Format;
use rand::{Rng, SeedableRng};
use variants::{flags_ab, flags_label, parse_flags_variants, Tuning};

/// Llama-3-8B: d_model 4096, 8 of 32 heads for k/v (GQA), FFN 14336.
const D: usize = 4096;
const KV: usize = 1024;
const FF: usize = 14336;
/// Distinct random rows per matrix (tiled to m rows): enough that no two neighbouring rows of a
/// worker's slice share cache lines, few enough that quantising a layer takes well under a second.
const DISTINCT_ROWS: usize = 64;
/// Bytes of layer copies the timed reps cycle through (unless `--copies` says how many), so
/// that the weights come from DRAM, not the last-level cache: the H200 box's Xeon has a 300 MiB
/// L3 (lscpu), and with 4 Q4_K copies (0.5 GB) passback read 143-151 GB/s against a 127-137
/// GB/s both-at-once ceiling, 113.6-118.5 with 16 copies (2 GB) in the same session
/// (docs/perf-checkpoints/2026-11-29-done-words-dram-layers-h200). About 7× the L3.
const LAYER_SET_BYTES: usize = 2 << 30;
/// Bytes of each buffer the read ceilings are measured over: far beyond any cache.
const CEILING_BYTES: usize = 1 << 30;
/// GPU passes over a ceiling buffer when the GPU reads alone (3 GiB, ~60 ms at 51 GB/s).
const GPU_ALONE_PASSES: usize = 3;
/// Both-at-once measurements the run's headline ceiling is the median of (the target rounds
/// measure their own, one per round).
const CEILING_SAMPLES: usize = 3;
/// Layer runs that let an `auto` controller probe, refine and latch before timing (the H200
/// trace shows the 9B-class shapes latched within ~30 steps of a shape, i.e. ~8 layer runs).
const AUTO_WARM_REPS: usize = 40;
/// Untimed runs before a pinned share is timed (pool spin-up, page mapping of the weights): the
/// first, unwarmed sweep on the H200 was non-monotone by ±10 %.
const PINNED_WARM_REPS: usize = 10;
/// Projections that read one activation, handed to the executor together (as the decoder
/// does: under `flags` each group is one split step): q/k/v, o, gate/up, down.
const SHARED_X_GROUPS: [&[usize]; 4] = [&[0, 1, 2], &[3], &[4, 5], &[6]];
/// Each projection alone (`--per-shape`).
const PROJ_INDEX: [usize; 7] = [0, 1, 2, 3, 4, 5, 6];
/// Pinned shares of the sweeps: 0.10 to 0.50 by 0.05 (0.5 is `memory.offload_passback_share`'s cap).
const SWEEP_SHARES: [f64; 9] = [0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50];

struct Proj {
    name: &'static str,
    m: usize,
    k: usize,
    form: GemvForm,
    format: Format,
    host: Arc<HostMappedBuffer>,
    dev: DeviceBuffer<u8>,
}

fn make_matrix(
    ctx: &Arc<Context>,
    stream: &hipfire::gpu::Stream,
    fmt: Format,
    m: usize,
    k: usize,
    seed: u64,
) -> Result<(Arc<HostMappedBuffer>, DeviceBuffer<u8>)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let rb = fmt.row_bytes(k)?;
    let mut distinct = Vec::with_capacity(DISTINCT_ROWS * rb);
    for _ in 0..DISTINCT_ROWS {
        let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        distinct.extend(hipfire::quant::quantize_row(fmt, &row)?);
    }
    let mut host = ctx.alloc_host_mapped(m * rb)?;
    for (i, chunk) in host.as_mut_slice().chunks_exact_mut(rb).enumerate() {
        let r = i % DISTINCT_ROWS;
        chunk.copy_from_slice(&distinct[r * rb..(r + 1) * rb]);
    }
    let mut dev = ctx.alloc::<u8>(m * rb)?;
    dev.upload(stream, host.as_slice())?;
    Ok((Arc::new(host), dev))
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Resident,
    Offload,
}

struct Bench<'a> {
    ctx: &'a Arc<Context>,
    stream: &'a hipfire::gpu::Stream,
    kernels: &'a GemvKernels,
    copies: &'a [Vec<Proj>],
    x_d: &'a DeviceBuffer<f32>,
    x_ff: &'a DeviceBuffer<f32>,
    act_d: &'a Activation,
    act_ff: &'a Activation,
    /// Layers per timed rep, run back to back with no host synchronisation between them (as
    /// the decoder runs a token's layers); a rep's time is divided among them.
    chain: usize,
    /// Wall of every rep of the last `run`, warm-ups included (µs).
    last_all_reps_us: std::cell::Cell<f64>,
    /// The executor's arm account over every rep of the last `run` (taken per rep, so no
    /// turnaround spans the host's refill between reps).
    last_account: std::cell::Cell<ArmAccount>,
}

impl Bench<'_> {
    fn layer_bytes(&self) -> usize {
        self.copies[0].iter().map(|p| p.host.len()).sum()
    }

    /// Per-step sync overhead of the last `run`: the wall that no arm's multiply covers
    /// (`None` when no step ran on the CPU).
    fn last_sync(&self) -> Option<f64> {
        let acct = self.last_account.get();
        let wall_ns = self.last_all_reps_us.get().max(f64::MIN_POSITIVE) * 1e3;
        (acct.steps > 0).then(|| 1.0 - acct.arm_ns / wall_ns)
    }

    /// Runs `reps` timed reps of `chain` layers each (after two untimed ones); returns (µs per
    /// layer, median over reps; outputs of the last rep).
    fn run(
        &self,
        mode: Mode,
        exec: Option<&mut OffloadExecutor>,
        reps: usize,
        only: Option<usize>,
    ) -> Result<(f64, Vec<Vec<f32>>)> {
        let mut ys: Vec<DeviceBuffer<f32>> = self.copies[0]
            .iter()
            .map(|p| self.ctx.alloc::<f32>(p.m))
            .collect::<Result<_, _>>()?;
        let mut exec = exec;
        let mut times = Vec::with_capacity(reps);
        let mut all_us = 0.0;
        let mut account = ArmAccount::default();
        for rep in 0..reps + 2 {
            // Fresh outputs each rep: the residual forms accumulate into a known starting value.
            for y in ys.iter_mut() {
                self.stream.fill_u32_async(y, 0.5f32.to_bits())?;
            }
            self.stream.synchronize()?;
            let t = Instant::now();
            for layer in 0..self.chain {
                let projs = &self.copies[(rep * self.chain + layer) % self.copies.len()];
                let groups: Vec<&[usize]> = match only {
                    Some(o) => vec![std::slice::from_ref(&PROJ_INDEX[o])],
                    None => SHARED_X_GROUPS.to_vec(),
                };
                for group in groups {
                    let p0 = &projs[group[0]];
                    let (x, act): (&DeviceBuffer<f32>, &Activation) = if p0.k == FF {
                        (self.x_ff, self.act_ff)
                    } else {
                        (self.x_d, self.act_d)
                    };
                    let mut outs: Vec<(&Proj, &mut DeviceBuffer<f32>)> = projs
                        .iter()
                        .zip(ys.iter_mut())
                        .enumerate()
                        .filter(|(i, _)| group.contains(i))
                        .map(|(_, py)| py)
                        .collect();
                    match (mode, exec.as_deref_mut()) {
                        (Mode::Resident, _) | (_, None) => {
                            for (p, y) in outs.iter_mut() {
                                let w = WeightRef::new(&p.dev, 0, p.format, p.m, p.k)?;
                                self.kernels.gemv(
                                    self.stream,
                                    &w,
                                    act,
                                    &mut **y,
                                    RowRange::all(p.m),
                                    p.form,
                                )?;
                            }
                        }
                        (Mode::Offload, Some(ex)) => {
                            let refs = outs
                                .iter()
                                .map(|(p, _)| {
                                    WeightRef::new(p.host.as_ref(), 0, p.format, p.m, p.k)
                                })
                                .collect::<Result<Vec<_>, _>>()?;
                            let mut steps: Vec<SpilledStep<'_>> = outs
                                .iter_mut()
                                .zip(&refs)
                                .map(|((p, y), w)| SpilledStep {
                                    weight: w,
                                    host: p.host.clone(),
                                    x,
                                    y: &mut **y,
                                    form: p.form,
                                })
                                .collect();
                            ex.run_shared(self.stream, self.kernels, act, &mut steps)?;
                        }
                    }
                }
            }
            self.stream.synchronize()?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            all_us += us;
            let us = us / self.chain as f64;
            if let Some(ex) = exec.as_deref_mut() {
                account += ex.take_arm_account()?;
            }
            if rep >= 2 {
                times.push(us);
            }
        }
        self.last_all_reps_us.set(all_us);
        self.last_account.set(account);
        times.sort_by(f64::total_cmp);
        let mut outs = Vec::new();
        for y in &ys {
            let mut v = vec![0f32; y.len()];
            y.download(self.stream, &mut v)?;
            outs.push(v);
        }
        Ok((times[times.len() / 2], outs))
    }
}

fn max_rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let mut worst = 0f64;
    for (x, y) in a.iter().zip(b) {
        let scale = x
            .iter()
            .map(|v| f64::from(v.abs()))
            .fold(0.0, f64::max)
            .max(1e-30);
        for (p, q) in x.iter().zip(y) {
            let d = (f64::from(*p) - f64::from(*q)).abs() / scale;
            worst = if d.is_nan() {
                f64::INFINITY
            } else {
                worst.max(d)
            };
        }
    }
    worst
}

/// One spilled Llama-3-8B layer through every offload mode and join strategy, against the read
/// ceilings measured in the same run. Needs a GPU.
#[derive(clap::Parser, Debug)]
#[command(name = "single_layer")]
struct Args {
    /// Weight format of the layer: q4_k or q8_0 (any format hipfire quantises).
    #[arg(long, default_value = "q4_k")]
    format: String,
    /// Timed layer runs per mode (the median is reported); two untimed runs come first.
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// CPU workers of the offload pool (0: one per physical core but one).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Also time every pinned share from 0.10 to 0.50 for the whole layer (the chart's sweep).
    #[arg(long)]
    sweep: bool,
    /// Also time each projection alone: auto against the sweep's fastest shares, interleaved.
    #[arg(long)]
    per_shape: bool,
    /// The join strategies `--per-shape` tables, comma-separated (ordering, two-stream, flags).
    #[arg(long, value_name = "LIST", default_value = "ordering,two-stream,flags")]
    per_shape_joins: String,
    /// The projections `--per-shape` tables, comma-separated (q, k, o, gate, up, down; v has
    /// k's shape and is never tabled).
    #[arg(long, value_name = "LIST", default_value = "q,k,o,gate,up,down")]
    per_shape_projs: String,
    /// Interleaved rounds of `--per-shape`'s head-to-head per row (each executor's turn ~60 ms):
    /// more narrow the printed 95 % interval of each median.
    #[arg(long, value_name = "R", default_value_t = per_shape::HEAD_TO_HEAD_ROUNDS as u64,
          value_parser = clap::value_parser!(u64).range(5..))]
    h2h_rounds: u64,
    /// Write every figure of the run here as JSON.
    #[arg(long, value_name = "PATH")]
    json: Option<String>,
    /// Instead, time STEPS back-to-back steps of a small matrix per join (each join's own
    /// per-step cost), and exit.
    #[arg(long, value_name = "STEPS")]
    handshake: Option<usize>,
    /// Record the flags timeline too (publish, fold, fold wait, device gap; costs each step a
    /// little).
    #[arg(long)]
    timeline: bool,
    /// Instead, race the --flags-variants against the first in R interleaved rounds, and exit.
    #[arg(long, value_name = "R")]
    ab_rounds: Option<usize>,
    /// Layers per timed rep, queued back to back with no host synchronisation between them, as
    /// the decoder queues a token's layers (1: a host sync around every layer, which the layer's
    /// sync figure then includes).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    chain: u64,
    /// Interleaved rounds of the issue's layer targets (ceiling, cpu, pcie, flags auto back to
    /// back; ratios within each round, median and range); 0 skips them.
    #[arg(long, value_name = "R", default_value_t = 7)]
    target_rounds: usize,
    /// Layer copies the reps cycle through (default: enough for 2 GiB, past the L3).
    #[arg(long, value_name = "N")]
    copies: Option<usize>,
    /// Host-side tunings of the flags join to run, comma-separated: `default` or knobs joined
    /// with `+` (chunks-N, prefetch-KIB, tagged-x, seq-x; with the `experiments` feature also
    /// publish-blocks-N). The target rounds run with the first one; `--per-shape` races one
    /// flags `auto` per variant.
    #[arg(long, value_name = "LIST", default_value = "default")]
    flags_variants: String,
}

/// Env var that turns on the executor's split trace (as in `hipfire`: docs/env-vars.md).
const CPU_EXEC_TRACE_ENV: &str = "HIPFIRE_CPU_EXEC_TRACE";

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    // Warnings, RUST_LOG if set, and the split trace (`split:` lines per shape) when asked.
    let mut filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    if std::env::var(CPU_EXEC_TRACE_ENV).is_ok_and(|v| v == "1") {
        filter = filter.add_directive("hipfire::cpu_exec=debug".parse()?);
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let format = Format::from_name(&args.format)
        .with_context(|| format!("unknown format {}", args.format))?;
    let (reps, threads, sweep, per_shape, timeline) = (
        args.reps,
        args.threads,
        args.sweep,
        args.per_shape,
        args.timeline,
    );
    let json_path = args.json.clone();
    let (handshake_steps, ab_rounds, copies_arg) = (args.handshake, args.ab_rounds, args.copies);
    let (chain, target_rounds) = (args.chain as usize, args.target_rounds);
    let flags_variants = parse_flags_variants(&args.flags_variants)?;
    let per_shape_joins = args
        .per_shape_joins
        .split(',')
        .map(JoinStrategy::parse)
        .collect::<Result<Vec<_>, _>>()
        .context("--per-shape-joins")?;

    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("single_layer needs a GPU: {e}");
            std::process::exit(1);
        }
    };
    let stream = ctx.new_stream()?;
    let registry = KernelRegistry::new(&ctx);
    let kernels = GemvKernels::new(&registry)?;
    let pool = hipfire::exec::offload::offload_pool(threads)?;
    eprintln!(
        "device {} ({}), {} cpu workers, format {format}",
        ctx.info().name,
        ctx.info().arch,
        pool.threads()
    );
    if let Some(steps) = handshake_steps {
        return handshake::handshake(&ctx, &stream, &kernels, &pool, steps, &flags_variants);
    }

    let shapes: [(&str, usize, usize, GemvForm); 7] = [
        ("q", D, D, GemvForm::Plain),
        ("k", KV, D, GemvForm::Plain),
        ("v", KV, D, GemvForm::Plain),
        ("o", D, D, GemvForm::Residual),
        ("gate", FF, D, GemvForm::Plain),
        ("up", FF, D, GemvForm::Plain),
        ("down", D, FF, GemvForm::Residual),
    ];
    let per_shape_projs: Vec<&str> = args.per_shape_projs.split(',').collect();
    if let Some(unknown) = per_shape_projs
        .iter()
        .find(|&&n| n == "v" || !shapes.iter().any(|s| s.0 == n))
    {
        anyhow::bail!(
            "--per-shape-projs: no projection {unknown:?} (q, k, o, gate, up, down; v is k's shape)"
        );
    }
    let one_layer_bytes: usize = shapes
        .iter()
        .map(|&(_, m, k, _)| format.row_bytes(k).map(|rb| m * rb))
        .sum::<Result<usize, _>>()?;
    let layer_copies = copies_arg
        .unwrap_or(LAYER_SET_BYTES.div_ceil(one_layer_bytes))
        .max(1);
    eprintln!(
        "{layer_copies} layer copies of {:.1} MB",
        one_layer_bytes as f64 / 1e6
    );
    let mut copies = Vec::new();
    for c in 0..layer_copies {
        let mut projs = Vec::new();
        for (i, (name, m, k, form)) in shapes.into_iter().enumerate() {
            let (host, dev) = make_matrix(&ctx, &stream, format, m, k, 1000 * c as u64 + i as u64)?;
            projs.push(Proj {
                name,
                m,
                k,
                form,
                format,
                host,
                dev,
            });
        }
        copies.push(projs);
    }
    let projs = &copies[0];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let xd: Vec<f32> = (0..D).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let xf: Vec<f32> = (0..FF).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut x_d = ctx.alloc::<f32>(D)?;
    let mut x_ff = ctx.alloc::<f32>(FF)?;
    x_d.upload(&stream, &xd)?;
    x_ff.upload(&stream, &xf)?;
    let mut act_d = Activation::new(&ctx, D)?;
    let mut act_ff = Activation::new(&ctx, FF)?;
    kernels.prepare(&stream, &x_d, &mut act_d)?;
    kernels.prepare(&stream, &x_ff, &mut act_ff)?;
    stream.synchronize()?;
    let b = Bench {
        ctx: &ctx,
        stream: &stream,
        kernels: &kernels,
        copies: &copies,
        x_d: &x_d,
        x_ff: &x_ff,
        act_d: &act_d,
        act_ff: &act_ff,
        chain,
        last_all_reps_us: std::cell::Cell::new(0.0),
        last_account: std::cell::Cell::new(ArmAccount::default()),
    };
    let bytes = b.layer_bytes() as f64;
    if let Some(rounds) = ab_rounds {
        return flags_ab(
            &ctx,
            &pool,
            &b,
            &flags_variants,
            rounds,
            reps,
            json_path.as_deref(),
        );
    }

    // Ceilings over the same bytes: CPU read alone, GPU zero-copy read alone, both at once.
    let reader = ReadKernel::new(&registry)?;
    let mut cold = [
        ctx.alloc_host_mapped(CEILING_BYTES)?,
        ctx.alloc_host_mapped(CEILING_BYTES)?,
    ];
    for (j, buf) in cold.iter_mut().enumerate() {
        let mut z = 0x9e37_79b9_7f4a_7c15u64 ^ j as u64;
        for w in buf.as_mut_slice().chunks_exact_mut(8) {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            w.copy_from_slice(&z.to_ne_bytes());
        }
    }
    let cpu_read = bench::read_bandwidth(&pool, cold[0].as_slice(), 4096, 5)?
        .rate
        .gbps;
    let gpu_read =
        targets::GpuRead::queue(&ctx, &stream, &reader, &cold[1], GPU_ALONE_PASSES)?.gbps()?;
    let bufs = targets::CeilingBuffers {
        cpu: &cold[0],
        gpu: &cold[1],
    };
    // The median (by total) of a few: on the H200 box the single measurement of two of seven
    // runs read the CPU at 13.5–14.3 GB/s, against 72.6–78.0 in the others (the 2026-11-29 layer-targets record).
    let mut boths = (0..CEILING_SAMPLES)
        .map(|_| targets::both_at_once(&ctx, &stream, &reader, &pool, &bufs))
        .collect::<Result<Vec<_>>>()?;
    boths.sort_by(|a, b| (a.0 + a.1).total_cmp(&(b.0 + b.1)));
    let both = boths[boths.len() / 2];
    let both_total = both.0 + both.1;
    println!("ceilings: cpu read {cpu_read:.1} GB/s, gpu zero-copy read {gpu_read:.1} GB/s, both at once {:.1} + {:.1} = {both_total:.1} GB/s (median of {CEILING_SAMPLES})", both.0, both.1);

    let (t_res, y_res) = b.run(Mode::Resident, None, reps, None)?;
    let mut rows = vec![
        serde_json::json!({"mode":"resident","strategy":null,"share":null,"us_per_layer":t_res,"gbs":bytes / t_res / 1e3,"max_rel_diff":0.0}),
    ];
    println!(
        "{:<10} {:<11} {:>7} {:>12} {:>9} {:>12} {:>7}",
        "mode", "strategy", "share", "us/layer", "GB/s", "max rel diff", "sync"
    );
    println!(
        "  (sync: wall no arm covers; flags rows add: worker start skew, turnaround between steps)"
    );
    println!(
        "{:<10} {:<11} {:>7} {:>12.1} {:>9.1} {:>12}",
        "resident",
        "-",
        "-",
        t_res,
        bytes / t_res / 1e3,
        "-"
    );
    let default_tuning = Tuning::default();
    let mut runs: Vec<(OffloadMode, String, Tuning)> = vec![
        (OffloadMode::Pcie, "-".into(), default_tuning),
        (OffloadMode::Cpu, "-".into(), default_tuning),
    ];
    for st in JoinStrategy::ALL {
        let auto = OffloadMode::Passback {
            share: ShareSetting::Auto,
            strategy: st,
        };
        if st == JoinStrategy::Flags {
            for (v, t) in &flags_variants {
                runs.push((auto.clone(), flags_label(v), *t));
            }
        } else {
            runs.push((auto, st.name().into(), default_tuning));
        }
        if sweep {
            for s in SWEEP_SHARES {
                runs.push((
                    OffloadMode::Passback {
                        share: ShareSetting::Pinned(s),
                        strategy: st,
                    },
                    st.name().into(),
                    default_tuning,
                ));
            }
        }
    }
    let mut best: std::collections::HashMap<String, f64> = Default::default();
    for (mode, st, tuning) in runs {
        let st = st.as_str();
        let mut ex = OffloadExecutor::new(&ctx, pool.clone(), mode.clone(), FF, 2 * FF)?;
        ex.set_timeline(timeline);
        tuning.apply(&mut ex);
        // Warm the auto controller (probe + refinement) before timing.
        if matches!(
            mode,
            OffloadMode::Passback {
                share: ShareSetting::Auto,
                ..
            }
        ) {
            b.run(Mode::Offload, Some(&mut ex), AUTO_WARM_REPS, None)?;
        } else {
            b.run(Mode::Offload, Some(&mut ex), PINNED_WARM_REPS, None)?;
        }
        let (t, y) = b.run(Mode::Offload, Some(&mut ex), reps, None)?;
        // Per-step sync overhead: the layer's wall that no arm's multiply covers; under flags,
        // how much of it is the workers' start skew and the device's turnaround between steps.
        let acct = b.last_account.get();
        let wall_ns = b.last_all_reps_us.get().max(f64::MIN_POSITIVE) * 1e3;
        let sync = b.last_sync();
        let (skew, turnaround) = (acct.worker_skew_ns / wall_ns, acct.turnaround_ns / wall_ns);
        let diff = max_rel_diff(&y_res, &y);
        let share = match &mode {
            OffloadMode::Passback {
                share: ShareSetting::Pinned(s),
                ..
            } => format!("{s:.2}"),
            OffloadMode::Passback { .. } => {
                let key = ex.shape_key(format, D, hipfire::exec::share::Form::Plain);
                format!("auto({:.3})", ex.controller().gpu_share(&key))
            }
            _ => "-".into(),
        };
        let gbs = bytes / t / 1e3;
        if let OffloadMode::Passback { .. } = mode {
            let e = best.entry(st.to_string()).or_insert(0.0);
            *e = e.max(gbs);
        }
        println!(
            "{:<10} {:<11} {:>7} {:>12.1} {:>9.1} {:>12.2e} {:>7}",
            mode.name(),
            st,
            share,
            t,
            gbs,
            diff,
            sync.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v))
        );
        if acct.turnarounds > 0 {
            println!(
                "{:>48} skew {:.1}%  turnaround {:.1}% ({:.1} us x {:.1} per layer)  x prep {:.1}%  \
                 prefetched while waiting {:.0} KiB a step",
                "",
                100.0 * skew,
                100.0 * turnaround,
                acct.turnaround_ns / acct.turnarounds as f64 / 1e3,
                acct.turnarounds as f64 / ((reps + 2) * chain) as f64,
                100.0 * acct.prepare_ns / wall_ns,
                acct.prefetched_bytes / acct.steps.max(1) as f64 / 1024.0
            );
            let per_step = |ns: f64| ns / acct.steps.max(1) as f64 / 1e3;
            if timeline {
                println!(
                "{:>48} device per step: publish {:.1} us, fold {:.1} us (waiting for the CPU {:.1}), gap {:.1} us",
                "",
                per_step(acct.publish_ns),
                per_step(acct.fold_ns),
                per_step(acct.fold_wait_ns),
                acct.device_gap_ns / acct.turnarounds.max(1) as f64 / 1e3
            );
            }
        }
        rows.push(serde_json::json!({"mode":mode.name(),"strategy":st,"share":share,"us_per_layer":t,"gbs":gbs,"max_rel_diff":diff,"sync_overhead":sync,"worker_skew":skew,"turnaround":turnaround,"turnarounds":acct.turnarounds,"steps":acct.steps,"prefetched_bytes_per_step":acct.prefetched_bytes / acct.steps.max(1) as f64}));
    }
    let target_json = if target_rounds > 0 {
        targets::target_rounds(
            &ctx,
            &stream,
            &reader,
            &pool,
            &b,
            &bufs,
            flags_variants[0].1,
            target_rounds,
            reps,
        )?
    } else {
        serde_json::Value::Null
    };
    drop(cold);
    // Per shape: `auto` against the best pinned share, one projection at a time (issue target:
    // auto within 3 % of the best pinned share's throughput on every 9B-class shape).
    let shape_rows = if per_shape {
        per_shape::per_shape(
            &ctx,
            &pool,
            &b,
            format,
            reps,
            &per_shape::PerShapeTable {
                joins: &per_shape_joins,
                projections: &per_shape_projs,
                variants: &flags_variants,
                rounds: args.h2h_rounds as usize,
            },
        )?
    } else {
        Vec::new()
    };
    let out = serde_json::json!({
        "per_shape": shape_rows,
        "targets": target_json, "chain": chain,
        "example": "single_layer", "format": format.name(), "device": ctx.info().name, "cpu_workers": pool.threads(),
        "layer_bytes": bytes, "reps": reps, "layer_copies": layer_copies, "flags_variants": flags_variants.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>(),
        "ceilings": {"cpu_read_gbs": cpu_read, "gpu_zero_copy_read_gbs": gpu_read, "both_cpu_gbs": both.0, "both_gpu_gbs": both.1, "both_total_gbs": both_total},
        "runs": rows,
        "projections": projs.iter().map(|p| serde_json::json!({"name":p.name,"m":p.m,"k":p.k,"bytes":p.host.len()})).collect::<Vec<_>>(),
    });
    if let Some(p) = json_path {
        std::fs::write(&p, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {p}"))?;
    }
    for (st, g) in best {
        println!(
            "best passback ({st}): {g:.1} GB/s = {:.2} x both-at-once ceiling",
            g / both_total
        );
    }
    Ok(())
}
