//! The engine thread on a small synthetic model (no HTTP): every sequence's text equals the
//! same request decoded alone; a long prompt is prefilled in bounded chunks while the other
//! sequences keep decoding in the same steps; a full engine refuses with 429; a dropped client
//! frees its slot for the next request; a slot reusing an earlier request's prefix gives the
//! logits a fresh server gives (attention-only and hybrid models).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hipfire_model::{Arch, LoadOptions, Model, SamplingParams, StreamDecoder};
use hipfire_quant::Format;
use hipfire_serve::api::{Endpoint, FinishReason, Generation};
use hipfire_serve::engine::{self, Event, PREFILL_CHUNK, PREFILL_TOKENS_PER_STEP};
use hipfire_serve::metrics::Metrics;
use hipfire_serve::{CpuSlots, EngineConfig, EngineHandle, Feed, PrefillBudget, StepModel};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// One recorded step: `(slot, tokens fed, want_logits)` per feed.
type StepLog = Arc<Mutex<Vec<Vec<(usize, usize, bool)>>>>;

/// [`CpuSlots`] that records every step's feeds, with a prompt budget of its own when given.
struct Recording<'m> {
    inner: CpuSlots<'m>,
    log: StepLog,
    budget: Option<PrefillBudget>,
}

impl StepModel for Recording<'_> {
    fn slots(&self) -> usize {
        self.inner.slots()
    }
    fn reset(&mut self, slot: usize) {
        self.inner.reset(slot)
    }
    fn forward(&mut self, feeds: &[Feed<'_>]) -> Result<(), hipfire_model::ModelError> {
        let step = feeds
            .iter()
            .map(|f| (f.slot, f.tokens.len(), f.want_logits))
            .collect();
        self.log.lock().expect("log").push(step);
        self.inner.forward(feeds)
    }
    fn logits(&self, slot: usize) -> &[f32] {
        self.inner.logits(slot)
    }
    fn position(&self, slot: usize) -> usize {
        self.inner.position(slot)
    }
    fn prefill_budget(&self) -> PrefillBudget {
        self.budget.unwrap_or(self.inner.prefill_budget())
    }
}

/// The tests' weight format: one whose multi-column row dots are bit-identical to one column's
/// on every tier and column count (`hipfire_quant::multi_matches_single`, asserted in
/// [`model_of`]), so a sequence's text in a batch, or after a reused prefix, can be compared with
/// a cold run bit for bit. A quantised format is so only where its kernels are (AVX-512 VNNI
/// Q4_K sums in lanes from 5 columns).
const ENGINE_FORMAT: Format = Format::F32;

/// A tiny synthetic model; each call writes (and removes) its own file, as tests run in
/// parallel.
fn model() -> Arc<Model> {
    model_of(Arch::Llama)
}

/// [`model`] of `arch`'s tiny synthetic shape.
fn model_of(arch: Arch) -> Arc<Model> {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hipfire-serve-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let path = dir.join(format!("tiny-{call}.gguf"));
    let spec = hipfire_model::SynthSpec::tiny(arch);
    assert!(
        (1..=64).all(|cols| hipfire_quant::multi_matches_single(
            hipfire_quant::simd_tier(),
            ENGINE_FORMAT,
            cols
        )),
        "the engine tests compare batches bit for bit: ENGINE_FORMAT must stay exact"
    );
    hipfire_model::write_synthetic(&path, &spec, ENGINE_FORMAT, 5, None).expect("synth");
    let opts = LoadOptions {
        threads: 2,
        ..LoadOptions::default()
    };
    let m = Model::load(&path, &opts).expect("load");
    let _ = std::fs::remove_file(&path);
    Arc::new(m)
}

fn start(model: &Arc<Model>, parallel: usize, queue: usize) -> (EngineHandle, StepLog) {
    start_with(model, parallel, queue, None)
}

fn start_with(
    model: &Arc<Model>,
    parallel: usize,
    queue: usize,
    budget: Option<PrefillBudget>,
) -> (EngineHandle, StepLog) {
    let log: StepLog = Arc::default();
    let l = log.clone();
    let (h, _join) = engine::spawn(
        model.clone(),
        EngineConfig { parallel, queue },
        Arc::new(Metrics::default()),
        move |m| {
            Ok(Box::new(Recording {
                inner: CpuSlots::new(m, parallel),
                log: l,
                budget,
            }))
        },
    )
    .expect("engine");
    (h, log)
}

/// A greedy generation of `max_tokens` that ignores end-of-generation tokens.
fn gen(prompt: Vec<u32>, max_tokens: usize, temperature: f32) -> Generation {
    Generation {
        endpoint: Endpoint::Completion,
        prompt,
        params: SamplingParams {
            temperature,
            seed: 3,
            max_tokens,
            stop_at_eog: false,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        stream: true,
        include_usage: false,
    }
}

fn prompt(model: &Model, seed: u32, len: usize) -> Vec<u32> {
    let vocab = model.config().vocab as u32;
    (0..len as u32)
        .map(|i| (i * 131 + seed * 17 + 3) % vocab)
        .collect()
}

/// The text and finish of one job.
fn wait(mut rx: UnboundedReceiver<Event>) -> (String, FinishReason, usize) {
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done { finish, usage } => return (text, finish, usage.completion_tokens),
            Event::Failed(why) => panic!("job failed: {why}"),
        }
    }
    panic!("engine dropped the job");
}

/// The same generation with `hipfire_model::generate` on a fresh session.
fn alone(model: &Model, g: &Generation) -> String {
    let mut s = model.session();
    let mut dec = StreamDecoder::new();
    let mut text = String::new();
    s.generate(&g.prompt, &g.params, |id| {
        text.push_str(&dec.push(model.tokenizer(), id).expect("detok"));
        true
    })
    .expect("generate");
    text.push_str(&dec.finish());
    text
}

#[test]
fn long_prompts_are_chunked_beside_decode_and_text_matches_alone() {
    let model = model();
    let (h, log) = start(&model, 3, 4);
    // Submitted together: A's short prompt is in after the first step, so A decodes while B's
    // long prompt is still being prefilled; C is sampled, not greedy.
    let jobs = [
        gen(prompt(&model, 1, 6), 48, 0.0),
        gen(prompt(&model, 2, 3 * PREFILL_TOKENS_PER_STEP + 7), 8, 0.0),
        gen(prompt(&model, 3, 40), 12, 0.8),
    ];
    let mut rxs = Vec::new();
    for j in &jobs {
        let (tx, rx) = unbounded_channel();
        h.submit(j.clone(), tx).expect("admitted");
        rxs.push(rx);
    }
    for (j, rx) in jobs.iter().zip(rxs) {
        let (text, finish, n) = wait(rx);
        assert_eq!(finish, FinishReason::Length);
        assert_eq!(n, j.params.max_tokens);
        assert_eq!(text, alone(&model, j), "batched text differs from alone");
    }
    let steps = log.lock().expect("log").clone();
    // Prompt tokens per step stay within the budget, and each chunk within PREFILL_CHUNK.
    for s in &steps {
        let prompt_tokens: usize = s.iter().filter(|f| f.1 > 1).map(|f| f.1).sum();
        assert!(prompt_tokens <= PREFILL_TOKENS_PER_STEP, "{s:?}");
        assert!(s.iter().all(|f| f.1 <= PREFILL_CHUNK), "{s:?}");
    }
    // The long prompt took several steps, and from the second on (A's prompt went in with the
    // first) A decoded in every one of them.
    let b_steps: Vec<&Vec<(usize, usize, bool)>> = steps
        .iter()
        .filter(|s| s.iter().any(|f| f.1 > 1 && !f.2))
        .collect();
    assert!(
        b_steps.len() >= 3,
        "long prompt prefilled in {} steps",
        b_steps.len()
    );
    assert!(
        b_steps[1..].iter().all(|s| s.iter().any(|f| f.1 == 1)),
        "a prefill step stalled decoding: {b_steps:?}"
    );
    assert_eq!(h.in_flight(), 0);
}

#[test]
fn full_engine_refuses_and_a_dropped_client_frees_its_slot() {
    let model = model();
    let (h, _log) = start(&model, 1, 1);
    let long = gen(prompt(&model, 4, 8), 100_000.min(model.ctx_len() - 8), 0.0);
    let (tx1, rx1) = unbounded_channel();
    h.submit(long.clone(), tx1).expect("slot");
    let (tx2, rx2) = unbounded_channel();
    h.submit(gen(prompt(&model, 5, 4), 4, 0.0), tx2)
        .expect("queue place");
    let (tx3, _rx3) = unbounded_channel();
    let e = h
        .submit(gen(prompt(&model, 6, 4), 4, 0.0), tx3)
        .expect_err("full");
    assert_eq!(e.status.as_u16(), 429);
    assert!(e.retry_after_s.is_some());
    // The first client goes away: its sequence is cancelled and the queued job runs.
    drop(rx1);
    let (_, finish, n) = wait(rx2);
    assert_eq!((finish, n), (FinishReason::Length, 4));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.in_flight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "places not given back"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let cancelled = h
        .metrics
        .requests_with("completion", engine::STATUS_CLIENT_CLOSED);
    assert_eq!(cancelled, 1);
    h.drain();
    let (tx4, _rx4) = unbounded_channel();
    let e = h
        .submit(gen(prompt(&model, 7, 4), 4, 0.0), tx4)
        .expect_err("draining");
    assert_eq!(e.status.as_u16(), 503);
}

#[test]
fn slots_that_fail_to_build_fail_the_spawn_with_their_error() {
    let model = model();
    let r = engine::spawn(
        model,
        EngineConfig {
            parallel: 2,
            queue: 0,
        },
        Arc::new(Metrics::default()),
        |_m| {
            Err(hipfire_model::ModelError::InvalidOption(
                "no device for 2 slots".into(),
            ))
        },
    );
    let Err(e) = r else {
        panic!("spawn succeeded over slots that failed to build");
    };
    let msg = e.to_string();
    assert!(
        msg.contains("building the model's slots") && msg.contains("no device for 2 slots"),
        "{msg}"
    );
}

#[test]
fn a_model_s_own_prompt_budget_shapes_the_steps() {
    let model = model();
    // Smaller than the CPU defaults, so the engine can only be following the model's.
    let budget = PrefillBudget {
        chunk: 5,
        per_step: 7,
    };
    let (h, log) = start_with(&model, 2, 0, Some(budget));
    let jobs = [
        gen(prompt(&model, 4, 23), 4, 0.0),
        gen(prompt(&model, 5, 11), 4, 0.0),
    ];
    let mut rxs = Vec::new();
    for j in &jobs {
        let (tx, rx) = unbounded_channel();
        h.submit(j.clone(), tx).expect("admitted");
        rxs.push(rx);
    }
    for (j, rx) in jobs.iter().zip(rxs) {
        let (text, _, n) = wait(rx);
        assert_eq!(n, j.params.max_tokens);
        assert_eq!(text, alone(&model, j), "budgeted steps changed the text");
    }
    let steps = log.lock().expect("log").clone();
    for s in &steps {
        let prompt_tokens: usize = s.iter().filter(|f| f.1 > 1).map(|f| f.1).sum();
        assert!(prompt_tokens <= budget.per_step, "{s:?}");
        assert!(s.iter().all(|f| f.1 <= budget.chunk), "{s:?}");
    }
    // 34 prompt tokens at most 7 a step: at least 5 steps held prompt tokens.
    let prompt_steps = steps.iter().filter(|s| s.iter().any(|f| f.1 > 1)).count();
    assert!(prompt_steps >= 5, "{prompt_steps} prompt steps: {steps:?}");
}

/// Logits' bits, each with the tokens its sequence held when they were computed.
type LogitsLog = Vec<(Vec<u32>, Vec<u32>)>;
/// Every logits vector a server computed, keyed by the tokens its sequence held then.
type Contexts = Arc<Mutex<LogitsLog>>;

/// [`CpuSlots`] that records, for every feed with logits, the slot's whole token history (the
/// tokens it kept from earlier requests included) and the logits' bits: logits are a function
/// of that history, whatever was reused. With `skip_restore`, going back to an earlier
/// position is claimed but not done (a server that forgot to restore), to show the records
/// would tell.
struct Probe<'m> {
    inner: CpuSlots<'m>,
    history: Vec<Vec<u32>>,
    log: Contexts,
    skip_restore: bool,
    /// Most snapshots any slot held.
    most_snapshots: Arc<std::sync::atomic::AtomicUsize>,
}

impl StepModel for Probe<'_> {
    fn slots(&self) -> usize {
        self.inner.slots()
    }
    fn reset(&mut self, slot: usize) {
        self.history[slot].clear();
        self.inner.reset(slot)
    }
    fn forward(&mut self, feeds: &[Feed<'_>]) -> Result<(), hipfire_model::ModelError> {
        self.inner.forward(feeds)?;
        for f in feeds {
            self.history[f.slot].extend_from_slice(f.tokens);
            if f.want_logits {
                let bits = self.inner.logits(f.slot).iter().map(|v| v.to_bits());
                let entry = (self.history[f.slot].clone(), bits.collect());
                self.log.lock().expect("log").push(entry);
            }
        }
        Ok(())
    }
    fn logits(&self, slot: usize) -> &[f32] {
        self.inner.logits(slot)
    }
    fn position(&self, slot: usize) -> usize {
        self.inner.position(slot)
    }
    fn reusable(&self, slot: usize, limit: usize) -> usize {
        self.inner.reusable(slot, limit)
    }
    fn rewind(&mut self, slot: usize, pos: usize) -> Result<(), hipfire_model::ModelError> {
        if self.skip_restore && pos > 0 {
            // The history still says what the session really holds.
            return Ok(());
        }
        self.history[slot].truncate(pos);
        self.inner.rewind(slot, pos)
    }
    fn checkpoint(&mut self, slot: usize) {
        self.inner.checkpoint(slot);
        self.most_snapshots.fetch_max(
            self.inner.snapshots(slot),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// A server over [`Probe`] slots.
struct Probed {
    h: EngineHandle,
    log: Contexts,
    most_snapshots: Arc<std::sync::atomic::AtomicUsize>,
}

fn start_probed(model: &Arc<Model>, parallel: usize, skip_restore: bool) -> Probed {
    let log: Contexts = Arc::default();
    let most_snapshots = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (l, m) = (log.clone(), most_snapshots.clone());
    let (h, _join) = engine::spawn(
        model.clone(),
        EngineConfig { parallel, queue: 4 },
        Arc::new(Metrics::default()),
        move |model| {
            Ok(Box::new(Probe {
                inner: CpuSlots::new(model, parallel),
                history: vec![Vec::new(); parallel],
                log: l,
                skip_restore,
                most_snapshots: m,
            }))
        },
    )
    .expect("engine");
    Probed {
        h,
        log,
        most_snapshots,
    }
}

impl Probed {
    /// Serve `gens` together; per request its text and `usage.cached_tokens`, and the logits
    /// computed meanwhile (sorted by history).
    fn serve(&self, gens: &[Generation]) -> (Vec<(String, usize)>, LogitsLog) {
        self.log.lock().expect("log").clear();
        let rxs: Vec<_> = gens
            .iter()
            .map(|g| {
                let (tx, rx) = unbounded_channel();
                self.h.submit(g.clone(), tx).expect("admitted");
                rx
            })
            .collect();
        let out = rxs.into_iter().map(wait_cached).collect();
        let mut log = std::mem::take(&mut *self.log.lock().expect("log"));
        log.sort();
        (out, log)
    }
}

/// The text and `usage.cached_tokens` of one job.
fn wait_cached(mut rx: UnboundedReceiver<Event>) -> (String, usize) {
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done { usage, .. } => return (text, usage.cached_tokens),
            Event::Failed(why) => panic!("job failed: {why}"),
        }
    }
    panic!("engine dropped the job");
}

/// The tokens a greedy `g` generates, decoded alone.
fn tokens_alone(model: &Model, g: &Generation) -> Vec<u32> {
    let mut s = model.session();
    let mut out = Vec::new();
    s.generate(&g.prompt, &g.params, |id| {
        out.push(id);
        true
    })
    .expect("generate");
    out
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

/// Serve `gens` together in a fresh server: its texts and logits.
fn cold(model: &Arc<Model>, gens: &[Generation]) -> (Vec<String>, LogitsLog) {
    let fresh = start_probed(model, gens.len(), false);
    let (out, log) = fresh.serve(gens);
    assert!(out.iter().all(|o| o.1 == 0), "a fresh server reused tokens");
    (out.into_iter().map(|o| o.0).collect(), log)
}

/// Turn 2 of a conversation, then a prompt diverging in its middle, then strict prefixes, all
/// served one after another by one server: each request's text and every logits vector equal
/// those of the same prompt served cold in a fresh server, and the reuse is what the model
/// allows (attention-only: the whole common prefix but the last prompt token; hybrid: the
/// latest end of an earlier prompt within it).
fn second_turns_match_cold(arch: Arch) {
    let model = model_of(arch);
    let hybrid = model.session().is_recurrent();
    let r = start_probed(&model, 2, false);
    const GEN: usize = 12;
    let a = prompt(&model, 11, 70);
    let t1 = gen(a.clone(), GEN, 0.0);
    let g1 = tokens_alone(&model, &t1);
    assert_eq!(g1.len(), GEN);
    let (out, _) = r.serve(std::slice::from_ref(&t1));
    assert_eq!(out[0], (alone(&model, &t1), 0));

    // Turn 2: the slot holds `a` and all generated tokens but the last (never fed).
    let b = prompt(&model, 12, 9);
    let turn2 = cat(&[&a, &g1, &b]);
    let cases: Vec<(&str, Vec<u32>, usize)> = vec![
        ("second turn", turn2.clone(), a.len() + GEN - 1),
        // Diverges 5 tokens into the first answer; the hybrid has a snapshot at the end of
        // turn 1's prompt (and one at turn 2's, above the divergence).
        (
            "diverging",
            cat(&[&turn2[..a.len() + 5], &prompt(&model, 13, 7)]),
            if hybrid { a.len() } else { a.len() + 5 },
        ),
        // A strict prefix of what the slot holds (turn 1's prompt and 3 answer tokens).
        (
            "strict prefix",
            turn2[..a.len() + 3].to_vec(),
            if hybrid { a.len() } else { a.len() + 2 },
        ),
        // Turn 1's prompt again (a regenerate): its last token must be fed again, and the
        // hybrid has no snapshot below it.
        (
            "regenerate",
            a.clone(),
            if hybrid { 0 } else { a.len() - 1 },
        ),
    ];
    let mut reused_total = 0;
    for (what, p, want_reused) in cases {
        let g = gen(p, GEN, 0.0);
        let (out, log) = r.serve(std::slice::from_ref(&g));
        let (texts, cold_log) = cold(&model, std::slice::from_ref(&g));
        assert_eq!(out[0].1, want_reused, "{arch:?} {what}: reused tokens");
        assert_eq!(out[0].0, texts[0], "{arch:?} {what}: text");
        assert_eq!(out[0].0, alone(&model, &g), "{arch:?} {what}: text alone");
        assert!(log == cold_log, "{arch:?} {what}: logits differ from cold");
        reused_total += want_reused;
    }
    assert_eq!(
        r.h.metrics
            .prompt_tokens_reused
            .load(std::sync::atomic::Ordering::Relaxed),
        reused_total as u64
    );
    let most = r.most_snapshots.load(std::sync::atomic::Ordering::Relaxed);
    if hybrid {
        assert_eq!(
            most,
            engine::MAX_SNAPSHOTS_PER_SLOT,
            "{arch:?}: snapshots kept"
        );
    } else {
        assert_eq!(
            most, 0,
            "{arch:?}: an attention-only slot keeps no snapshot"
        );
    }
}

#[test]
fn second_turns_reuse_the_prefix_and_match_cold_attention_only() {
    second_turns_match_cold(Arch::Llama);
}

#[test]
fn second_turns_reuse_the_prefix_and_match_cold_hybrid() {
    second_turns_match_cold(Arch::Qwen35);
}

/// The same through Qwen3-Next's layers (fused tensors, grouped value heads, routed experts):
/// the slot's snapshots hold its state as they do Qwen3.5's.
#[test]
fn second_turns_reuse_the_prefix_and_match_cold_qwen3next() {
    second_turns_match_cold(Arch::Qwen3Next);
}

/// Three conversations, then their next turns together (a second turn, a prompt diverging in
/// the middle, a strict prefix): each goes to the slot holding its conversation, and the
/// batch's logits equal those of the same requests served together cold.
#[test]
fn concurrent_second_turns_each_reuse_their_own_slot() {
    for arch in [Arch::Llama, Arch::Qwen35] {
        let model = model_of(arch);
        let hybrid = model.session().is_recurrent();
        let r = start_probed(&model, 3, false);
        const GEN: usize = 6;
        let firsts: Vec<Generation> = (0..3)
            .map(|i| gen(prompt(&model, 20 + i, 40 + 17 * i as usize), GEN, 0.0))
            .collect();
        let (out, _) = r.serve(&firsts);
        for (g, o) in firsts.iter().zip(&out) {
            assert_eq!(o.0, alone(&model, g), "{arch:?}: turn 1 text");
        }
        let answer: Vec<Vec<u32>> = firsts.iter().map(|g| tokens_alone(&model, g)).collect();
        let (p0, p1, p2) = (&firsts[0].prompt, &firsts[1].prompt, &firsts[2].prompt);
        let seconds = [
            gen(cat(&[p0, &answer[0], &prompt(&model, 30, 8)]), GEN, 0.0),
            gen(cat(&[&p1[..25], &prompt(&model, 31, 8)]), GEN, 0.0),
            gen(cat(&[p2, &answer[2][..2]]), GEN, 0.0),
        ];
        let want_reused = [
            p0.len() + GEN - 1,
            if hybrid { 0 } else { 25 },
            // The hybrid's latest snapshot within the prefix is turn 1's prompt end.
            if hybrid { p2.len() } else { p2.len() + 1 },
        ];
        let (out, log) = r.serve(&seconds);
        let (texts, cold_log) = cold(&model, &seconds);
        for (i, g) in seconds.iter().enumerate() {
            assert_eq!(out[i].1, want_reused[i], "{arch:?} request {i}: reused");
            assert_eq!(out[i].0, texts[i], "{arch:?} request {i}: text vs cold");
            assert_eq!(
                out[i].0,
                alone(&model, g),
                "{arch:?} request {i}: text alone"
            );
        }
        assert!(log == cold_log, "{arch:?}: batched logits differ from cold");
    }
}

/// The same diverging turn through slots that claim to go back but keep their state: the
/// logits then differ from cold, so the tests above would catch a skipped restore.
#[test]
fn a_skipped_restore_is_caught() {
    for arch in [Arch::Llama, Arch::Qwen35] {
        let model = model_of(arch);
        let r = start_probed(&model, 1, true);
        let a = prompt(&model, 40, 50);
        let t1 = gen(a.clone(), 8, 0.0);
        let g1 = tokens_alone(&model, &t1);
        r.serve(std::slice::from_ref(&t1));
        let t2 = gen(cat(&[&a, &g1, &prompt(&model, 41, 5)]), 8, 0.0);
        r.serve(std::slice::from_ref(&t2));
        let diverging = gen(cat(&[&a, &prompt(&model, 42, 9)]), 8, 0.0);
        let (out, log) = r.serve(std::slice::from_ref(&diverging));
        assert_eq!(out[0].1, a.len(), "{arch:?}: claimed reuse");
        let (_, cold_log) = cold(&model, std::slice::from_ref(&diverging));
        let cold_bits: Vec<&Vec<u32>> = cold_log.iter().map(|e| &e.1).collect();
        let bits: Vec<&Vec<u32>> = log.iter().map(|e| &e.1).collect();
        assert_ne!(bits, cold_bits, "{arch:?}: stale state gave cold logits");
    }
}

/// The server's memory budget counts a hybrid slot's snapshots, and an attention-only slot's
/// none.
#[test]
fn the_memory_budget_counts_a_hybrid_slot_s_snapshots() {
    for arch in [Arch::Llama, Arch::Qwen35] {
        let m = model_of(arch);
        let c = m.config();
        let kv = (hipfire_model::kv_bytes_per_position(&m) * m.ctx_len()) as u64;
        let rec = c.recurrent_bytes_per_sequence() as u64;
        let snaps = if rec > 0 {
            (engine::MAX_SNAPSHOTS_PER_SLOT * c.snapshot_bytes()) as u64
        } else {
            0
        };
        assert_eq!(arch == Arch::Qwen35, snaps > 0, "{arch:?}");
        assert_eq!(
            hipfire_serve::kv_reserve_bytes(&m, 3),
            3 * (kv + rec + snaps),
            "{arch:?}"
        );
    }
}
