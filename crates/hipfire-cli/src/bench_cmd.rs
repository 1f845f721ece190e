//! `hipfire bench`: llama-bench-style `pp`/`tg` rows (mean ± standard deviation over
//! repetitions) for each requested prompt length, generation length and context depth.
//!
//! A `ppP` row times one `Decoder::prefill` of P tokens; a `tgN` row times N one-token
//! `Decoder::step`s; both after `D` untimed positions (`-d`). The tokens are a fixed
//! pseudo-random sequence over the vocabulary (as llama-bench feeds random tokens), so any
//! length works whatever the tokenizer does with text.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _};
use hipfire_config::{PassbackShare, Settings};
use hipfire_model::gpu::GpuDecoder;
use hipfire_model::{forward_batch, BatchItem, Decoder, Model, ModelError, Session};
use serde_json::{json, Value};

use crate::args::BenchArgs;
use crate::model_cmd::{choose_engine, gpu_decoder_slots, load, offload_mode, Engine};
use crate::stats::median;
use crate::stop::{self, Stop};
use crate::{daemon, Ctx, EXIT_OK, EXIT_REFUSED};

/// Most tests one bench may plan (lists multiply: `-p` × depths + `-n` × depths); 4096 is
/// far beyond any useful sweep, so more is a typo in a generated command line.
const MAX_BENCH_TESTS: usize = 4096;

/// Seed of the bench token sequence: fixed, so every run and every mode feeds the same ids.
const BENCH_TOKEN_SEED: u64 = 0x5EED_0B0E_4C48;

/// What a test times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestKind {
    /// One prefill of `tokens` tokens.
    Prompt,
    /// `tokens` one-token decode steps.
    Gen,
}

/// One row of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchTest {
    /// Prefill or decode.
    pub kind: TestKind,
    /// Tokens timed.
    pub tokens: usize,
    /// Positions filled (untimed) before the timed part.
    pub depth: usize,
    /// Sequences decoded together (`--batch`; 1 for prompts): each step is one batched
    /// decode over this many slots, each at `depth`.
    pub seqs: usize,
}

impl BenchTest {
    /// llama-bench's name: `pp512`, `tg128`, `pp512 @ d4096`.
    pub fn name(&self) -> String {
        let base = match self.kind {
            TestKind::Prompt => format!("pp{}", self.tokens),
            TestKind::Gen => format!("tg{}", self.tokens),
        };
        let base = if self.seqs > 1 {
            format!("{base} x{}", self.seqs)
        } else {
            base
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }

    /// Context positions the test fills (each count is at most 2^20: no overflow).
    pub fn positions(&self) -> usize {
        self.depth + self.tokens
    }
}

/// The tests of `-p`, `-n`, `-d` in llama-bench's order: per depth, the prompt rows, then the
/// generation rows (one per `--batch` size); zeros dropped.
pub fn plan(
    n_prompt: &[u32],
    n_gen: &[u32],
    n_depth: &[u32],
    batch: &[u32],
) -> anyhow::Result<Vec<BenchTest>> {
    let mut tests = Vec::new();
    let one = [1u32];
    let batch = if batch.is_empty() { &one[..] } else { batch };
    for &d in n_depth {
        for (kind, list) in [(TestKind::Prompt, n_prompt), (TestKind::Gen, n_gen)] {
            let seqs = if kind == TestKind::Gen {
                batch
            } else {
                &one[..]
            };
            for &n in list.iter().filter(|&&n| n > 0) {
                for &b in seqs {
                    if tests.len() == MAX_BENCH_TESTS {
                        bail!(
                            "more than {MAX_BENCH_TESTS} tests (the -p, -n, -d and --batch lists multiply)"
                        );
                    }
                    tests.push(BenchTest {
                        kind,
                        tokens: n as usize,
                        depth: d as usize,
                        seqs: b.max(1) as usize,
                    });
                }
            }
        }
    }
    if tests.is_empty() {
        bail!("nothing to measure: -p and -n are both 0 (give a prompt or a generation length)");
    }
    Ok(tests)
}

/// Offset between the ids of neighbouring slots in a batched test (a prime, so the sequences'
/// tokens differ at every position).
const BATCH_ID_STRIDE: usize = 7919;

/// One line per shape the share controller keeps for batched steps (cols > 1): its GPU share
/// and the engines' measured rates, so a batched run says how its rows were cut.
fn share_lines(c: &hipfire_exec::share::ShareController) -> Vec<String> {
    let mut keys: Vec<_> = c.keys().filter(|k| k.cols > 1).collect();
    keys.sort_by_key(|k| (k.cols, k.k, format!("{:?}", k.form), k.format.name()));
    keys.into_iter()
        .filter_map(|k| {
            let snap = c.snapshot(&k)?;
            Some(format!(
                "batched shares: {} k {} {:?} cols {}: gpu {:.2}, cpu {:.1} GB/s, gpu {:.1} GB/s, {} steps",
                k.format.name(),
                k.k,
                k.form,
                k.cols,
                c.gpu_share(&k),
                snap.rate_gbps[0],
                snap.rate_gbps[1],
                snap.samples
            ))
        })
        .collect()
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed, seedable generator; the bench
/// needs reproducible ids, not cryptographic ones.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// `n` token ids: `bos` first when given, then ids drawn uniformly (seeded) from `0..vocab`
/// less those `is_special` marks. Refuses a vocabulary with no ordinary token.
pub fn bench_tokens(
    n: usize,
    vocab: usize,
    bos: Option<u32>,
    is_special: impl Fn(u32) -> bool,
) -> anyhow::Result<Vec<u32>> {
    let vocab = u32::try_from(vocab).unwrap_or(u32::MAX);
    let ordinary: Vec<u32> = (0..vocab).filter(|&id| !is_special(id)).collect();
    if ordinary.is_empty() {
        bail!("the model's vocabulary has no ordinary (non-control) token to bench with");
    }
    let mut rng = SplitMix64(BENCH_TOKEN_SEED);
    let mut ids = Vec::with_capacity(n);
    ids.extend(bos.filter(|_| n > 0));
    while ids.len() < n {
        // Modulo bias is below len / 2^64: irrelevant for a benchmark's input.
        ids.push(ordinary[(rng.next() % ordinary.len() as u64) as usize]);
    }
    Ok(ids)
}

/// The bench token sequence for `model`: BOS when the tokenizer adds one, then ordinary ids
/// within both the tokenizer's and the embedding's vocabulary.
fn model_tokens(model: &Model, n: usize) -> anyhow::Result<Vec<u32>> {
    let tok = model.tokenizer();
    let vocab = tok.vocab_size().min(model.config().vocab);
    let bos = tok.bos.filter(|_| tok.add_bos);
    bench_tokens(n, vocab, bos, |id| {
        tok.is_control(id) || tok.is_eog(id) || Some(id) == tok.bos
    })
}

/// A decoder the bench can empty between repetitions.
trait BenchDecoder: Decoder {
    /// Forget every position (of every slot).
    fn restart(&mut self);
    /// Fill slot `slot` with `tokens` (untimed depth of a batched test).
    fn prefill_slot(&mut self, slot: usize, tokens: &[u32]) -> Result<(), ModelError>;
    /// One batched decode step over `(slot, token)` feeds.
    fn step_slots(&mut self, feeds: &[(usize, u32)]) -> Result<(), ModelError>;
}

/// The CPU engine's sessions, one per sequence, stepped together by [`forward_batch`] as
/// `hipfire serve` steps them; one session serves the single-sequence tests.
struct CpuSessions<'m> {
    sessions: Vec<Session<'m>>,
}

impl Decoder for CpuSessions<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        self.sessions[0].prefill(tokens)
    }
    fn step(&mut self, token: u32) -> Result<&[f32], ModelError> {
        self.sessions[0].step(token)
    }
    fn logits(&self) -> &[f32] {
        self.sessions[0].logits()
    }
    fn position(&self) -> usize {
        self.sessions[0].position()
    }
    fn ctx_len(&self) -> usize {
        Decoder::ctx_len(&self.sessions[0])
    }
    fn is_eog(&self, token: u32) -> bool {
        self.sessions[0].is_eog(token)
    }
}

impl BenchDecoder for CpuSessions<'_> {
    fn restart(&mut self) {
        self.sessions.iter_mut().for_each(Session::reset);
    }
    fn prefill_slot(&mut self, slot: usize, tokens: &[u32]) -> Result<(), ModelError> {
        let s = self
            .sessions
            .get_mut(slot)
            .ok_or_else(|| ModelError::InvalidOption(format!("slot {slot} of a batched bench")))?;
        s.prefill(tokens).map(|_| ())
    }
    fn step_slots(&mut self, feeds: &[(usize, u32)]) -> Result<(), ModelError> {
        // Feeds name distinct slots in order (the bench's own), so the sessions pair with them.
        let tokens: Vec<[u32; 1]> = feeds.iter().map(|f| [f.1]).collect();
        let mut items: Vec<BatchItem<'_, '_>> = self
            .sessions
            .iter_mut()
            .zip(&tokens)
            .map(|(session, t)| BatchItem {
                session,
                tokens: t,
                want_logits: true,
            })
            .collect();
        forward_batch(&mut items)
    }
}

impl BenchDecoder for GpuDecoder<'_> {
    fn restart(&mut self) {
        for slot in (0..self.slots()).rev() {
            if self.select_slot(slot).is_ok() {
                self.reset();
            }
        }
    }
    fn prefill_slot(&mut self, slot: usize, tokens: &[u32]) -> Result<(), ModelError> {
        self.select_slot(slot)?;
        let r = self.prefill(tokens).map(|_| ());
        self.select_slot(0)?;
        r
    }
    fn step_slots(&mut self, feeds: &[(usize, u32)]) -> Result<(), ModelError> {
        self.decode_slots(feeds).map(|_| ())
    }
}

/// One run of `t` from an empty context: the timed part's nanoseconds, or `None` when a
/// signal cut it short (a cut run is not a sample). A warm-up of a `tg` test runs one step.
fn time_once(
    dec: &mut dyn BenchDecoder,
    t: &BenchTest,
    ids: &[u32],
    stop: &Stop,
    warmup: bool,
) -> anyhow::Result<Option<u64>> {
    dec.restart();
    if t.seqs > 1 {
        return time_batched(dec, t, ids, stop, warmup);
    }
    if t.depth > 0 {
        dec.prefill(&ids[..t.depth])
            .with_context(|| format!("{}: filling the depth", t.name()))?;
    }
    let mut timed = &ids[t.depth..t.positions()];
    if warmup && t.kind == TestKind::Gen {
        timed = &timed[..1];
    }
    let t0 = Instant::now();
    match t.kind {
        TestKind::Prompt => {
            dec.prefill(timed)
                .with_context(|| format!("{}: prefill", t.name()))?;
        }
        TestKind::Gen => {
            for &id in timed {
                dec.step(id)
                    .with_context(|| format!("{}: decode", t.name()))?;
                if stop.requested().is_some() {
                    return Ok(None);
                }
            }
        }
    }
    let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Ok(stop.requested().is_none().then_some(ns.max(1)))
}

/// A `tg` test over `t.seqs` sequences: each slot filled to the depth (with the ids shifted per
/// slot, so the sequences differ), then `t.tokens` batched steps, each one token for every slot.
fn time_batched(
    dec: &mut dyn BenchDecoder,
    t: &BenchTest,
    ids: &[u32],
    stop: &Stop,
    warmup: bool,
) -> anyhow::Result<Option<u64>> {
    let id = |slot: usize, i: usize| ids[(i + slot * BATCH_ID_STRIDE) % ids.len()];
    for slot in 0..t.seqs {
        if t.depth > 0 {
            let fill: Vec<u32> = (0..t.depth).map(|i| id(slot, i)).collect();
            dec.prefill_slot(slot, &fill)
                .with_context(|| format!("{}: filling slot {slot} to the depth", t.name()))?;
        }
    }
    let steps = if warmup { 1 } else { t.tokens };
    let t0 = Instant::now();
    for i in 0..steps {
        let feeds: Vec<(usize, u32)> = (0..t.seqs).map(|s| (s, id(s, t.depth + i))).collect();
        dec.step_slots(&feeds)
            .with_context(|| format!("{}: batched decode", t.name()))?;
        if stop.requested().is_some() {
            return Ok(None);
        }
    }
    let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Ok(stop.requested().is_none().then_some(ns.max(1)))
}

/// Every test: one warm-up, then `reps` timed runs; stops early (keeping finished samples) on
/// a signal. Returns the nanoseconds per test, in `tests` order (tests not reached: empty).
fn measure(
    dec: &mut dyn BenchDecoder,
    tests: &[BenchTest],
    ids: &[u32],
    reps: u32,
    stop: &Stop,
) -> anyhow::Result<Vec<Vec<u64>>> {
    let mut out = vec![Vec::new(); tests.len()];
    'tests: for (t, samples) in tests.iter().zip(&mut out) {
        if time_once(dec, t, ids, stop, true)?.is_none() {
            break;
        }
        for _ in 0..reps {
            match time_once(dec, t, ids, stop, false)? {
                Some(ns) => samples.push(ns),
                None => break 'tests,
            }
        }
    }
    Ok(out)
}

/// Mean and sample standard deviation (n − 1, as llama-bench; 0 for one sample).
fn mean_stddev(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() == 1 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// `row` with its samples set from nanoseconds: samples_ns/ts, avg/stddev of both, median_ts,
/// repetitions. The timed tokens are `n_prompt + n_gen` of the row (one of them is 0).
pub fn with_samples(mut row: Value, ns: &[u64]) -> Value {
    let tokens = (row["n_prompt"].as_u64().unwrap_or(0) + row["n_gen"].as_u64().unwrap_or(0))
        * row["n_seqs"].as_u64().unwrap_or(1).max(1);
    let ts: Vec<f64> = ns.iter().map(|&x| tokens as f64 * 1e9 / x as f64).collect();
    let ns_f: Vec<f64> = ns.iter().map(|&x| x as f64).collect();
    let (avg_ns, stddev_ns) = mean_stddev(&ns_f);
    let (avg_ts, stddev_ts) = mean_stddev(&ts);
    row["repetitions"] = json!(ns.len());
    row["samples_ns"] = json!(ns);
    row["samples_ts"] = json!(ts);
    row["avg_ns"] = json!(avg_ns);
    row["stddev_ns"] = json!(stddev_ns);
    row["avg_ts"] = json!(avg_ts);
    row["stddev_ts"] = json!(stddev_ts);
    row["median_ts"] = json!(median(ts));
    row
}

/// What every row of one model and mode shares.
fn row_base(a: &BenchArgs, model: &Model, s: &Settings, engine: &Engine, placement: &str) -> Value {
    let tensors = &model.gguf().index().tensors;
    let size: u64 = tensors
        .iter()
        .map(|t| t.n_bytes)
        .fold(0, u64::saturating_add);
    let params: u64 = tensors
        .iter()
        .map(|t| t.n_elements())
        .fold(0, u64::saturating_add);
    let gpu = matches!(engine, Engine::Gpu);
    // Structured, so records need not parse the placement line. Only GPU passback has them.
    let passback = gpu && s.offload_exec == hipfire_config::OffloadExec::Passback;
    json!({
        "model": a.model.display().to_string(),
        "model_filename": a.model.file_name().map(|f| f.to_string_lossy().into_owned()),
        "model_type": format!("{:?}", model.config().arch).to_lowercase(),
        "model_size": size,
        "model_n_params": params,
        "version": env!("CARGO_PKG_VERSION"),
        "commit": crate::version::commit(),
        "simd": hipfire_quant::simd_tier().to_string(),
        "threads": s.threads.get().get(),
        "engine": if gpu { "gpu" } else { "cpu" },
        "offload_exec": if gpu { s.offload_exec.name() } else { "cpu-only" },
        "join_strategy": passback.then(|| s.join_strategy.name()),
        "flags_x_publish": (passback && s.join_strategy == hipfire_config::JoinStrategy::Flags)
            .then(|| s.flags_x_publish.name()),
        "passback_share": passback.then(|| match s.passback_share {
            PassbackShare::Auto => "auto".to_string(),
            PassbackShare::CpuOnly => "0".to_string(),
            PassbackShare::Pinned(x) => format!("{x}"),
        }),
        "placement": placement,
    })
}

/// The rows of one mode: `base` plus each test's fields and samples.
fn rows(base: &Value, tests: &[BenchTest], samples: &[Vec<u64>]) -> Vec<Value> {
    tests
        .iter()
        .zip(samples)
        .filter(|(_, ns)| !ns.is_empty())
        .map(|(t, ns)| {
            let mut r = base.clone();
            let (p, n) = match t.kind {
                TestKind::Prompt => (t.tokens, 0),
                TestKind::Gen => (0, t.tokens),
            };
            r["test"] = json!(t.name());
            r["n_prompt"] = json!(p);
            r["n_gen"] = json!(n);
            r["n_depth"] = json!(t.depth);
            r["n_seqs"] = json!(t.seqs);
            with_samples(r, ns)
        })
        .collect()
}

/// The context the bench needs: the longest test, within `--ctx-size` when given.
fn bench_ctx_len(tests: &[BenchTest], ctx_size: Option<usize>) -> anyhow::Result<(usize, String)> {
    let longest = tests
        .iter()
        .max_by_key(|t| t.positions())
        .context("no tests")?;
    let needed = longest.positions();
    let name = longest.name();
    match ctx_size {
        Some(n) if n < needed => bail!(
            "--ctx-size {n} is below the {needed} positions {name} fills (-d + -p or -n); \
             raise --ctx-size or shorten the test"
        ),
        Some(n) => Ok((n, name)),
        None => Ok((needed, name)),
    }
}

/// `hipfire bench`.
pub fn bench(ctx: &Ctx, a: &BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(msg) = daemon::refusal("bench") {
        let _ = writeln!(std::io::stderr(), "{msg}");
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    let tests = plan(&a.n_prompt, &a.n_gen, &a.n_depth, &a.batch)?;
    let max_seqs = tests.iter().map(|t| t.seqs).max().unwrap_or(1);
    let mut overrides = a.engine.overrides();
    let (_, base) = ctx.settings_with(&overrides)?;
    // Validate every requested mode by the config rule before loading anything.
    let mut modes = Vec::new();
    for m in &a.offload_exec {
        overrides.push(hipfire_config::CliOverride::new(
            "memory.offload_exec",
            "--offload-exec",
            m.clone(),
        ));
        let (_, s) = ctx.settings_with(&overrides)?;
        overrides.pop();
        modes.push(s);
    }
    if modes.is_empty() {
        modes.push(base.clone());
    }
    // The context is sized to the longest test unless `model.ctx_size` asks for more (to
    // measure a placement with a long context's cache in VRAM).
    let (ctx_len, longest) = bench_ctx_len(&tests, base.ctx_size.tokens())?;
    let engine = choose_engine(ctx, &base)?;
    if matches!(engine, Engine::Gpu) {
        for s in &modes {
            offload_mode(s)?;
        }
        if modes.len() > 1 && !crate::bench_rounds::is_child() {
            let names: Vec<String> = modes
                .iter()
                .map(|s| s.offload_exec.name().to_string())
                .collect();
            let stop = Stop::install()?;
            let rows = crate::bench_rounds::run(&names, a.repetitions, &stop, &|m| ctx.note(m))?;
            return finish(ctx, a, &rows, stop.requested());
        }
    }
    let l = match load(ctx, engine, &a.model, &base, Some(ctx_len), !a.json) {
        Ok(l) => l,
        // Sized by the bench itself (no --ctx-size): say which test made it too long.
        Err(e) => match e.downcast_ref::<ModelError>() {
            Some(&ModelError::ContextSize { trained, .. }) if base.ctx_size.tokens().is_none() => {
                bail!(
                    "{longest} fills {ctx_len} positions, beyond the model's context of \
                     {trained} (--ctx-size cannot exceed it); shorten -p, -n or -d"
                )
            }
            _ => return Err(e),
        },
    };
    let stop = Stop::install()?;
    let ids = model_tokens(&l.model, ctx_len)?;
    if matches!(l.engine, Engine::Cpu) && modes.len() > 1 {
        ctx.note("no GPU: offload modes do not apply; measuring the CPU once");
        modes.truncate(1);
    }
    let mut all = Vec::new();
    // Modes run one after another, each with the model placed anew.
    for s in &modes {
        let (samples, placement) = match l.engine {
            Engine::Cpu => {
                let mut sess = CpuSessions {
                    sessions: (0..max_seqs).map(|_| l.model.session()).collect(),
                };
                let ns = measure(&mut sess, &tests, &ids, a.repetitions, &stop)?;
                (ns, l.model.placement_summary().to_string())
            }
            Engine::Gpu => {
                let mut d = gpu_decoder_slots(&l, s, offload_mode(s)?, max_seqs)?;
                let ns = measure(&mut d, &tests, &ids, a.repetitions, &stop)?;
                if max_seqs > 1 {
                    for line in share_lines(d.offload().controller()) {
                        ctx.note(line);
                    }
                }
                (ns, d.placement_summary().to_string())
            }
        };
        let base = row_base(a, &l.model, s, &l.engine, &placement);
        all.extend(rows(&base, &tests, &samples));
        if stop.requested().is_some() {
            break;
        }
    }
    finish(ctx, a, &all, stop.requested())
}

/// Prints the rows and picks the exit status.
fn finish(
    ctx: &Ctx,
    a: &BenchArgs,
    rows: &[Value],
    interrupted: Option<i32>,
) -> anyhow::Result<ExitCode> {
    print_rows(ctx, a, rows, interrupted)?;
    Ok(ExitCode::from(
        interrupted.map_or(EXIT_OK, stop::exit_status),
    ))
}

/// Bytes as llama-bench prints a model size (`4.58 GiB`, `85.78 MiB`).
fn human_size(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.2} MiB", b / MIB)
    }
}

/// A parameter count as llama-bench prints it (`8.03 B`, `134.52 M`).
fn human_params(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else {
        format!("{:.2} M", x / 1e6)
    }
}

/// The table (llama-bench's columns) or the JSON array.
fn print_rows(
    ctx: &Ctx,
    a: &BenchArgs,
    rows: &[Value],
    interrupted: Option<i32>,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(rows)?)?;
    } else {
        let cells: Vec<[String; 7]> = rows
            .iter()
            .map(|r| {
                let backend = match r["engine"].as_str() {
                    Some("gpu") => format!("gpu {}", r["offload_exec"].as_str().unwrap_or("?")),
                    _ => "cpu".to_string(),
                };
                [
                    r["model_filename"].as_str().unwrap_or("?").to_string(),
                    human_size(r["model_size"].as_u64().unwrap_or(0)),
                    human_params(r["model_n_params"].as_u64().unwrap_or(0)),
                    backend,
                    r["threads"].to_string(),
                    r["test"].as_str().unwrap_or("?").to_string(),
                    format!(
                        "{:.2} ± {:.2}",
                        r["avg_ts"].as_f64().unwrap_or(f64::NAN),
                        r["stddev_ts"].as_f64().unwrap_or(f64::NAN)
                    ),
                ]
            })
            .collect();
        let head = [
            "model", "size", "params", "backend", "threads", "test", "t/s",
        ];
        let mut w: [usize; 7] = head.map(str::len);
        for c in &cells {
            for (wi, x) in w.iter_mut().zip(c) {
                *wi = (*wi).max(x.chars().count());
            }
        }
        // Text columns left-aligned, numbers right-aligned, as llama-bench's markdown.
        let right = [false, true, true, false, true, true, true];
        let line = |c: &[String]| {
            let mut s = String::from("|");
            for ((x, &wi), &r) in c.iter().zip(&w).zip(&right) {
                let pad = wi - x.chars().count();
                let (l, rr) = if r { (pad, 0) } else { (0, pad) };
                s.push_str(&format!(" {}{x}{} |", " ".repeat(l), " ".repeat(rr)));
            }
            s
        };
        writeln!(out, "{}", line(&head.map(String::from)))?;
        let rule: Vec<String> = w
            .iter()
            .zip(&right)
            .map(|(&wi, &r)| {
                let mut d = "-".repeat(wi);
                if r {
                    d.replace_range(wi - 1.., ":");
                }
                d
            })
            .collect();
        writeln!(out, "{}", line(&rule))?;
        for c in &cells {
            writeln!(out, "{}", line(c))?;
        }
        let mut seen = Vec::new();
        for r in rows {
            let mode = r["offload_exec"].as_str().unwrap_or("?");
            if !seen.contains(&mode) {
                seen.push(mode);
                writeln!(
                    out,
                    "placement ({mode}): {}",
                    r["placement"].as_str().unwrap_or("")
                )?;
            }
        }
        for r in rows {
            for p in r["paired_ratios"].as_array().into_iter().flatten() {
                writeln!(
                    out,
                    "{} {} / {}: {:.3} (median of per-repetition ratios)",
                    r["test"].as_str().unwrap_or("?"),
                    r["offload_exec"].as_str().unwrap_or("?"),
                    p["vs"].as_str().unwrap_or("?"),
                    p["median"].as_f64().unwrap_or(f64::NAN)
                )?;
            }
        }
        let method = rows
            .first()
            .and_then(|r| r["method"].as_str())
            .unwrap_or("one untimed warm-up per test, then timed repetitions in one process");
        ctx.note(format!(
            "{method}; mean ± sample standard deviation of {} repetitions",
            a.repetitions
        ));
    }
    if let Some(sig) = interrupted {
        ctx.note(format!(
            "stopped by {}: only the repetitions that finished are reported",
            stop::signal_name(sig)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_orders_rows_as_llama_bench_and_drops_zeros() {
        let t = plan(&[512, 0, 2048], &[128], &[0, 4096], &[1]).expect("plan");
        let names: Vec<String> = t.iter().map(BenchTest::name).collect();
        assert_eq!(
            names,
            [
                "pp512",
                "pp2048",
                "tg128",
                "pp512 @ d4096",
                "pp2048 @ d4096",
                "tg128 @ d4096"
            ]
        );
        assert_eq!(t[4].positions(), 4096 + 2048);
        assert!(plan(&[0], &[0], &[0], &[1]).is_err());
        let wide: Vec<u32> = (1..=100).collect();
        assert!(plan(&wide, &wide, &wide[..30], &[1]).is_err(), "6000 tests");
        // --batch multiplies the generation rows only.
        let t = plan(&[64], &[32], &[0], &[1, 8]).expect("plan");
        let names: Vec<String> = t.iter().map(BenchTest::name).collect();
        assert_eq!(names, ["pp64", "tg32", "tg32 x8"]);
        assert_eq!(t[2].seqs, 8);
        assert_eq!(t[0].seqs, 1);
    }

    #[test]
    fn bench_tokens_are_seeded_in_vocab_and_skip_specials() {
        let special = |id: u32| id % 7 == 0;
        let a = bench_tokens(5000, 1000, Some(1), special).expect("tokens");
        let b = bench_tokens(300, 1000, Some(1), special).expect("tokens");
        assert_eq!(a.len(), 5000);
        assert_eq!(a[0], 1, "BOS first");
        assert_eq!(&a[..300], &b[..], "a prefix of the same sequence");
        assert!(a[1..].iter().all(|&id| id < 1000 && !special(id)));
        // Spread over the vocabulary, not a constant: most ordinary ids appear.
        let mut seen = std::collections::HashSet::new();
        seen.extend(a[1..].iter().copied());
        assert!(seen.len() > 800, "{} distinct", seen.len());
        assert!(bench_tokens(0, 1000, Some(1), special)
            .expect("empty")
            .is_empty());
        assert!(bench_tokens(4, 7, None, |_| true).is_err());
    }

    #[test]
    fn samples_become_means_and_sample_stddevs() {
        let row = json!({ "n_prompt": 0, "n_gen": 100 });
        // 100 tokens in 0.5 s, 1 s, 2 s: 200, 100, 50 tok/s.
        let r = with_samples(row, &[500_000_000, 1_000_000_000, 2_000_000_000]);
        let ts: Vec<f64> = serde_json::from_value(r["samples_ts"].clone()).expect("ts");
        assert_eq!(ts, [200.0, 100.0, 50.0]);
        let mean = 350.0 / 3.0;
        let var = ((200.0 - mean) * (200.0f64 - mean)
            + (100.0 - mean) * (100.0 - mean)
            + (50.0 - mean) * (50.0 - mean))
            / 2.0;
        let got = r["avg_ts"].as_f64().expect("avg");
        assert!((got - mean).abs() < 1e-9, "{got}");
        let sd = r["stddev_ts"].as_f64().expect("sd");
        assert!((sd - f64::sqrt(var)).abs() < 1e-9, "{sd}");
        assert_eq!(r["median_ts"], 100.0);
        assert_eq!(r["repetitions"], 3);
        let one = with_samples(json!({ "n_prompt": 8, "n_gen": 0 }), &[4_000]);
        assert_eq!(one["stddev_ts"], 0.0);
        assert_eq!(one["avg_ts"], 2e6);
    }

    #[test]
    fn context_is_the_longest_test_within_ctx_size() {
        let t = plan(&[16], &[40], &[8], &[1]).expect("plan");
        assert_eq!(bench_ctx_len(&t, None).expect("fits").0, 48);
        assert_eq!(bench_ctx_len(&t, Some(64)).expect("fits").0, 64);
        let e = bench_ctx_len(&t, Some(47)).expect_err("short").to_string();
        assert!(
            e.contains("--ctx-size 47") && e.contains("48 positions tg40 @ d8"),
            "{e}"
        );
    }
}
