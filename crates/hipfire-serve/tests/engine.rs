//! The engine thread on a small synthetic model (no HTTP): every sequence's text equals the
//! same request decoded alone; a long prompt is prefilled in bounded chunks while the other
//! sequences keep decoding in the same steps; a full engine refuses with 429; a dropped client
//! frees its slot for the next request.

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

/// A tiny synthetic model; each call writes (and removes) its own file, as tests run in
/// parallel.
fn model() -> Arc<Model> {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hipfire-serve-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let path = dir.join(format!("tiny-{call}.gguf"));
    let spec = hipfire_model::SynthSpec::tiny(Arch::Llama);
    hipfire_model::write_synthetic(&path, &spec, Format::Q8_0, 5, None).expect("synth");
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
