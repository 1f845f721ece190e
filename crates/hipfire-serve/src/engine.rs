//! The engine thread: it owns the model's sequence slots and a continuous-batching scheduler.
//!
//! Requests arrive as [`Job`]s on a channel. Between forward steps the engine takes new jobs,
//! drops those whose client went away (freeing their slot), gives waiting jobs free slots
//! (first come, first served), and builds the next step: one decode token from every decoding
//! sequence plus prompt chunks of prefilling ones, up to [`PREFILL_TOKENS_PER_STEP`] prompt
//! tokens per step, so a long prompt is spread over several steps instead of stalling every
//! stream. The step is one [`StepModel::forward`]; then each sequence that got logits samples its
//! next token, detokenises it, checks stop strings and sends the text to its client.
//!
//! A slot keeps what its last request left in it: the session and the token ids it was fed
//! (prompt, then every generated token fed back). A new request goes to the free slot whose
//! kept tokens share the longest usable prefix with its prompt; that slot goes back to the
//! prefix ([`StepModel::rewind`]: an attention-only session truncates its KV cache, a hybrid
//! restores a snapshot taken at the end of an earlier prompt or stays where it is) and only the
//! rest of the prompt is prefilled. Without a usable prefix the least recently used free slot is
//! reset, so the conversations used last stay cached longest.
//!
//! The engine never runs on tokio: a forward pass is long, CPU-bound work that would starve the
//! runtime's tasks. The HTTP side talks to it through [`EngineHandle`] (the actor's handle, as in
//! Ryhl's "Actors with Tokio"); replies go back on one unbounded tokio channel per request,
//! which the synchronous engine can send on without blocking.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::mpsc::UnboundedSender;

use hipfire_model::{
    forward_batch, BatchItem, Model, ModelError, Sampler, Session, SessionSnapshot, StreamDecoder,
    Tokenizer,
};

use crate::api::{FinishReason, Generation, Usage};
use crate::error::{ApiError, ServeError};
use crate::metrics::Metrics;
use crate::stop::StopMatcher;

/// Prompt tokens one sequence feeds per step: hipfire-model's prefill chunk, whose multi-token
/// GEMVs already read each weight once for the chunk.
pub const PREFILL_CHUNK: usize = hipfire_model::model::PREFILL_CHUNK;
/// Prompt tokens (all prefilling sequences together) per step. Two chunks: on the 2-core VM a
/// SmolLM2 step of 64 prompt tokens costs about as much as 16 decode tokens' worth of weight
/// reads would alone, so decoding streams see at most a few-fold longer step while a burst of
/// arrivals is prefilled; a larger budget would stretch every stream's inter-token gap.
pub const PREFILL_TOKENS_PER_STEP: usize = 2 * PREFILL_CHUNK;
/// `Retry-After` of a 429: a short generation on a small model finishes within a second, so a
/// client retrying then usually finds room.
pub const RETRY_AFTER_S: u64 = 1;
/// Snapshots a hybrid model's slot keeps (one is taken at the end of every prompt): the last
/// prompt's end serves an edited or regenerated answer, the one before it a regenerated earlier
/// turn. Each costs [`hipfire_model::ModelConfig::snapshot_bytes`] (≈ 2 MiB per DeltaNet layer
/// for Qwen3.5), counted in the server's memory budget; where a slot is now needs none.
pub const MAX_SNAPSHOTS_PER_SLOT: usize = 2;
/// HTTP status counted for a request whose client disconnected (nginx's "client closed
/// request"; never sent).
pub const STATUS_CLIENT_CLOSED: u16 = 499;

/// One sequence's share of a forward step, by slot.
#[derive(Debug, Clone, Copy)]
pub struct Feed<'a> {
    /// Slot (`0..StepModel::slots()`), at most once per step.
    pub slot: usize,
    /// Tokens to append (at least one).
    pub tokens: &'a [u32],
    /// Compute the logits after the last token.
    pub want_logits: bool,
}

/// What the engine needs from a model: a fixed set of sequence slots, each with its own KV
/// cache, advanced together by one forward pass. The CPU implementation is [`CpuSlots`] (over
/// [`forward_batch`]); a GPU decoder plugs in by implementing the same five calls (until it
/// has a batched step of its own, by feeding each slot in turn).
pub trait StepModel {
    /// Number of slots.
    fn slots(&self) -> usize;
    /// Empty slot `slot` (its cache becomes free for a new sequence).
    fn reset(&mut self, slot: usize);
    /// One forward over every feed; on error no slot has changed.
    fn forward(&mut self, feeds: &[Feed<'_>]) -> Result<(), ModelError>;
    /// Logits after the last token fed to `slot` with `want_logits`.
    fn logits(&self, slot: usize) -> &[f32];
    /// Positions `slot` holds.
    fn position(&self, slot: usize) -> usize;
    /// The furthest position at most `limit` (and at most [`StepModel::position`]) that `slot`
    /// can go back to with [`StepModel::rewind`], keeping what it was fed before it; 0 when it
    /// cannot reuse a prefix (the default: every request starts from an empty slot).
    fn reusable(&self, _slot: usize, _limit: usize) -> usize {
        0
    }
    /// Take `slot` back to `pos`, a position [`StepModel::reusable`] returned for it (0: an
    /// empty slot, which every model can do).
    fn rewind(&mut self, slot: usize, pos: usize) -> Result<(), ModelError> {
        if pos != 0 {
            return Err(ModelError::InvalidOption(format!(
                "slot {slot} cannot go back to position {pos}"
            )));
        }
        self.reset(slot);
        Ok(())
    }
    /// Remember where `slot` is now as a position to come back to (a hybrid's snapshot). The
    /// engine calls it at the end of every prompt.
    fn checkpoint(&mut self, _slot: usize) {}
    /// How many prompt tokens a step may feed: per sequence and in all (the CPU engine's
    /// [`PREFILL_CHUNK`] and [`PREFILL_TOKENS_PER_STEP`] unless the model knows better).
    fn prefill_budget(&self) -> PrefillBudget {
        PrefillBudget {
            chunk: PREFILL_CHUNK,
            per_step: PREFILL_TOKENS_PER_STEP,
        }
    }
}

/// Prompt tokens a step may feed ([`StepModel::prefill_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillBudget {
    /// Per sequence.
    pub chunk: usize,
    /// All prefilling sequences together.
    pub per_step: usize,
}

/// [`StepModel`] on the CPU: one [`Session`] per slot, stepped by [`forward_batch`].
///
/// A slot goes back to any earlier position of an attention-only model by truncating its KV
/// cache ([`Session::rewind`]); a hybrid's recurrent state cannot be truncated, so its slot
/// keeps up to [`MAX_SNAPSHOTS_PER_SLOT`] snapshots of the ends of earlier prompts and goes
/// back to one of those (or stays where it is).
#[derive(Debug)]
pub struct CpuSlots<'m> {
    sessions: Vec<Session<'m>>,
    /// Per slot, snapshots at positions the session holds, lowest first (hybrids only).
    snaps: Vec<Vec<SessionSnapshot>>,
}

impl<'m> CpuSlots<'m> {
    /// `slots` empty sessions of `model`.
    pub fn new(model: &'m Model, slots: usize) -> CpuSlots<'m> {
        CpuSlots {
            sessions: (0..slots).map(|_| model.session()).collect(),
            snaps: (0..slots).map(|_| Vec::new()).collect(),
        }
    }

    /// Snapshots `slot` keeps now (at most [`MAX_SNAPSHOTS_PER_SLOT`]).
    pub fn snapshots(&self, slot: usize) -> usize {
        self.snaps.get(slot).map_or(0, Vec::len)
    }
}

impl StepModel for CpuSlots<'_> {
    fn slots(&self) -> usize {
        self.sessions.len()
    }

    fn reset(&mut self, slot: usize) {
        if let Some(s) = self.sessions.get_mut(slot) {
            s.reset();
        }
        if let Some(v) = self.snaps.get_mut(slot) {
            v.clear();
        }
    }

    fn forward(&mut self, feeds: &[Feed<'_>]) -> Result<(), ModelError> {
        let mut by_slot: Vec<Option<&Feed<'_>>> = vec![None; self.sessions.len()];
        for f in feeds {
            match by_slot.get_mut(f.slot) {
                Some(e @ None) => *e = Some(f),
                _ => {
                    return Err(ModelError::InvalidOption(format!(
                        "feed for slot {} of {} (absent or twice)",
                        f.slot,
                        self.sessions.len()
                    )))
                }
            }
        }
        let mut items: Vec<BatchItem<'_, '_>> = self
            .sessions
            .iter_mut()
            .zip(by_slot)
            .filter_map(|(session, f)| {
                f.map(|f| BatchItem {
                    session,
                    tokens: f.tokens,
                    want_logits: f.want_logits,
                })
            })
            .collect();
        forward_batch(&mut items)
    }

    fn logits(&self, slot: usize) -> &[f32] {
        self.sessions.get(slot).map_or(&[], |s| s.logits())
    }

    fn position(&self, slot: usize) -> usize {
        self.sessions.get(slot).map_or(0, |s| s.position())
    }

    fn reusable(&self, slot: usize, limit: usize) -> usize {
        let (Some(s), Some(snaps)) = (self.sessions.get(slot), self.snaps.get(slot)) else {
            return 0;
        };
        if limit >= s.position() {
            s.position()
        } else if !s.is_recurrent() {
            limit
        } else {
            snaps
                .iter()
                .map(SessionSnapshot::position)
                .filter(|&p| p <= limit)
                .max()
                .unwrap_or(0)
        }
    }

    fn rewind(&mut self, slot: usize, pos: usize) -> Result<(), ModelError> {
        let (Some(s), Some(snaps)) = (self.sessions.get_mut(slot), self.snaps.get_mut(slot)) else {
            return Err(ModelError::InvalidOption(format!("no slot {slot}")));
        };
        if pos == s.position() {
            return Ok(());
        }
        if pos == 0 || !s.is_recurrent() {
            s.rewind(pos)?;
        } else {
            let snap = snaps.iter().find(|p| p.position() == pos).ok_or_else(|| {
                ModelError::InvalidOption(format!("slot {slot} has no snapshot at {pos}"))
            })?;
            s.restore(snap)?;
        }
        // A snapshot above the new position is outdated (and the session would refuse it).
        snaps.retain(|p| p.position() <= pos);
        Ok(())
    }

    fn checkpoint(&mut self, slot: usize) {
        let (Some(s), Some(snaps)) = (self.sessions.get_mut(slot), self.snaps.get_mut(slot)) else {
            return;
        };
        // An attention-only slot goes back anywhere by truncation: nothing to keep.
        if !s.is_recurrent() {
            return;
        }
        let pos = s.position();
        snaps.retain(|p| p.position() < pos);
        snaps.push(s.snapshot());
        if snaps.len() > MAX_SNAPSHOTS_PER_SLOT {
            snaps.remove(0);
        }
    }
}

/// What the engine sends back for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Generated text (stop strings already removed).
    Text(String),
    /// Generation ended normally.
    Done {
        /// Why.
        finish: FinishReason,
        /// Token counts.
        usage: Usage,
    },
    /// The engine could not finish it (a model error, or shutdown past its deadline).
    Failed(String),
}

/// A counted place in the engine (slot or queue); dropping it gives the place back.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One request for the engine.
#[derive(Debug)]
pub struct Job {
    /// What to generate.
    pub gen: Generation,
    /// Where the text goes; a closed channel means the client left (the job is cancelled).
    pub events: UnboundedSender<Event>,
    /// When the request arrived (TTFT is measured from here).
    pub arrived: Instant,
    /// Its place, held until the job's last event: released just before that event is sent,
    /// so a client that sends its next request on seeing the last one finds the place free.
    permit: Option<Permit>,
}

impl Job {
    /// Send the job's last event, giving its place back first.
    fn reply_last(&mut self, ev: Event) {
        self.permit = None;
        let _ = self.events.send(ev);
    }
}

/// State the handle and the engine share.
#[derive(Debug)]
struct Shared {
    /// Jobs admitted and not yet finished (waiting or running).
    in_flight: AtomicUsize,
    /// Most jobs in flight: slots + queue.
    capacity: usize,
    /// Shutting down: refuse new jobs.
    draining: AtomicBool,
    /// Past the shutdown deadline: fail every job now.
    abort: AtomicBool,
}

/// The cloneable handle the HTTP tasks submit through.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: Sender<Job>,
    shared: Arc<Shared>,
    /// Exported series (shared with the engine).
    pub metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Admit a generation: 503 while draining, 429 (with `Retry-After`) when every slot and
    /// queue place is taken, 500 if the engine has stopped.
    pub fn submit(&self, gen: Generation, events: UnboundedSender<Event>) -> Result<(), ApiError> {
        if self.shared.draining.load(Ordering::Acquire) {
            return Err(ApiError::draining());
        }
        let before = self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let permit = Permit {
            shared: self.shared.clone(),
        };
        if before >= self.shared.capacity {
            return Err(ApiError::queue_full(RETRY_AFTER_S));
        }
        self.tx
            .send(Job {
                gen,
                events,
                arrived: Instant::now(),
                permit: Some(permit),
            })
            .map_err(|_| ApiError::internal("the engine has stopped"))
    }

    /// Refuse new requests from now on (in-flight ones continue).
    pub fn drain(&self) {
        self.shared.draining.store(true, Ordering::Release);
    }

    /// Whether [`EngineHandle::drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }

    /// Fail every in-flight request now (the shutdown deadline passed).
    pub fn abort(&self) {
        self.drain();
        self.shared.abort.store(true, Ordering::Release);
    }

    /// Requests admitted and not finished.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }
}

/// Engine sizing.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Sequence slots: the most sequences in one batch (`--parallel`).
    pub parallel: usize,
    /// Requests that may wait for a slot beyond those (`--queue`).
    pub queue: usize,
}

/// Start the engine on its own thread over the slots `make` builds from `model` there (the CPU:
/// `|m| Ok(Box::new(CpuSlots::new(m, n)))`; a GPU decoder is built on the thread that will
/// drive its stream). Returns once the slots are built, with `make`'s error if it failed. The
/// thread ends when every handle is dropped and no job is left.
pub fn spawn<F>(
    model: Arc<Model>,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
    make: F,
) -> Result<(EngineHandle, std::thread::JoinHandle<()>), ServeError>
where
    F: for<'m> FnOnce(&'m Model) -> Result<Box<dyn StepModel + 'm>, ModelError> + Send + 'static,
{
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<(), ModelError>>(1);
    let (tx, rx) = crossbeam_channel::unbounded();
    let shared = Arc::new(Shared {
        in_flight: AtomicUsize::new(0),
        capacity: cfg.parallel + cfg.queue,
        draining: AtomicBool::new(false),
        abort: AtomicBool::new(false),
    });
    let handle = EngineHandle {
        tx,
        shared: shared.clone(),
        metrics: metrics.clone(),
    };
    let kv_per_pos = hipfire_model::kv_bytes_per_position(&model) as u64;
    let join = std::thread::Builder::new()
        .name("hipfire-engine".into())
        .spawn(move || {
            let slots = match make(&model) {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let n = slots.slots();
            let mut engine = Engine {
                free: (0..n).rev().collect(),
                kept: vec![Vec::new(); n],
                last_used: vec![0; n],
                uses: 0,
                slots,
                tok: model.tokenizer(),
                ctx_len: model.ctx_len(),
                kv_per_pos,
                rx,
                shared,
                metrics,
                waiting: VecDeque::new(),
                running: Vec::new(),
            };
            engine.run();
        })
        .map_err(|e| ServeError::Engine(format!("cannot start the engine thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((handle, join)),
        Ok(Err(e)) => {
            let _ = join.join();
            Err(ServeError::Engine(format!(
                "building the model's slots: {e}"
            )))
        }
        Err(_) => {
            let _ = join.join();
            Err(ServeError::Engine(
                "the engine thread ended while building the model's slots".into(),
            ))
        }
    }
}

/// A job holding a slot.
struct Seq {
    job: Job,
    slot: usize,
    /// Prompt tokens fed so far (the reused prefix included).
    fed: usize,
    /// Prompt tokens the slot already held (not prefilled again).
    reused: usize,
    /// The sampled token to feed in the next step (decoding), if any.
    next: Option<u32>,
    sampler: Sampler,
    detok: StreamDecoder,
    stop: StopMatcher,
    generated: usize,
    last_token_at: Option<Instant>,
    /// Set when the sequence leaves the batch after this step.
    finished: bool,
}

/// What a sequence feeds in the step being built.
#[derive(Clone, Copy)]
enum Planned {
    /// Prompt tokens `fed..end`; logits when that is the whole prompt.
    Prefill { end: usize },
    /// Its pending token.
    Decode,
}

struct Engine<'m> {
    slots: Box<dyn StepModel + 'm>,
    tok: &'m Tokenizer,
    ctx_len: usize,
    kv_per_pos: u64,
    rx: Receiver<Job>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    waiting: VecDeque<Job>,
    running: Vec<Seq>,
    /// Free slots.
    free: Vec<usize>,
    /// Per slot, the token ids its sequence holds (one per position): what it was last fed.
    kept: Vec<Vec<u32>>,
    /// Per slot, when a request was last given it (in admissions), for least-recently-used
    /// eviction among slots with no prefix to reuse.
    last_used: Vec<u64>,
    /// Admissions so far.
    uses: u64,
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Engine<'_> {
    fn run(&mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                self.publish_gauges();
                match self.rx.recv() {
                    Ok(job) => self.waiting.push_back(job),
                    // Every handle is gone and nothing is left to do.
                    Err(_) => return,
                }
            }
            // Empty or disconnected: either way nothing more to take now.
            while let Ok(job) = self.rx.try_recv() {
                self.waiting.push_back(job);
            }
            if self.shared.abort.load(Ordering::Acquire) {
                self.fail_all("the server shut down before this request finished");
                continue;
            }
            self.reap_cancelled();
            self.admit();
            self.publish_gauges();
            if !self.running.is_empty() {
                self.step();
            }
        }
    }

    fn publish_gauges(&self) {
        let m = &self.metrics;
        m.queue_depth
            .store(self.waiting.len() as u64, Ordering::Relaxed);
        m.running
            .store(self.running.len() as u64, Ordering::Relaxed);
        let kv: u64 = self
            .running
            .iter()
            .map(|s| self.slots.position(s.slot) as u64 * self.kv_per_pos)
            .sum();
        m.kv_bytes.store(kv, Ordering::Relaxed);
    }

    fn fail_all(&mut self, why: &str) {
        for mut job in self.waiting.drain(..) {
            job.reply_last(Event::Failed(why.into()));
            self.metrics.request(job.gen.endpoint.label(), 503);
        }
        for mut s in self.running.drain(..) {
            s.job.reply_last(Event::Failed(why.into()));
            self.metrics.request(s.job.gen.endpoint.label(), 503);
            self.slots.reset(s.slot);
            if let Some(k) = self.kept.get_mut(s.slot) {
                k.clear();
            }
            self.free.push(s.slot);
        }
    }

    /// Drop every job whose client has gone (its receiver is closed), freeing its slot (which
    /// keeps what it was fed, for a retry to reuse).
    fn reap_cancelled(&mut self) {
        let metrics = &self.metrics;
        self.waiting.retain(|j| {
            let gone = j.events.is_closed();
            if gone {
                metrics.request(j.gen.endpoint.label(), STATUS_CLIENT_CLOSED);
            }
            !gone
        });
        let free = &mut self.free;
        self.running.retain(|s| {
            let gone = s.job.events.is_closed();
            if gone {
                metrics.request(s.job.gen.endpoint.label(), STATUS_CLIENT_CLOSED);
                tracing::debug!(slot = s.slot, "client left; sequence cancelled");
                free.push(s.slot);
            }
            !gone
        });
    }

    /// Give free slots to waiting jobs, oldest first.
    fn admit(&mut self) {
        while !self.free.is_empty() {
            let Some(mut job) = self.waiting.pop_front() else {
                return;
            };
            let sampler = match Sampler::new(&job.gen.params) {
                Ok(s) => s,
                Err(e) => {
                    // The HTTP side validated the values; this is a bug, reported, not a crash.
                    job.reply_last(Event::Failed(format!("sampler: {e}")));
                    self.metrics.request(job.gen.endpoint.label(), 500);
                    continue;
                }
            };
            let Some((slot, reused)) = self.take_slot(&job.gen.prompt) else {
                return;
            };
            self.metrics
                .prompt_tokens_reused
                .fetch_add(reused as u64, Ordering::Relaxed);
            let stop = StopMatcher::new(job.gen.stop.clone());
            self.running.push(Seq {
                job,
                slot,
                fed: reused,
                reused,
                next: None,
                sampler,
                detok: StreamDecoder::new(),
                stop,
                generated: 0,
                last_token_at: None,
                finished: false,
            });
        }
    }

    /// Take the free slot that reuses the most of `prompt` (the least recently used among
    /// equals), brought back to that prefix: at most all but the prompt's last token, which
    /// must be fed for its logits. Returns the slot and the prompt tokens it already holds.
    fn take_slot(&mut self, prompt: &[u32]) -> Option<(usize, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let (i, slot, pos) = self
            .free
            .iter()
            .enumerate()
            .map(|(i, &slot)| {
                let kept = self.kept.get(slot).map_or(&[][..], Vec::as_slice);
                // A slot whose position disagrees with its kept tokens reuses nothing.
                let pos = if self.slots.position(slot) == kept.len() {
                    self.slots
                        .reusable(slot, common_prefix(kept, prompt).min(limit))
                } else {
                    0
                };
                (i, slot, pos)
            })
            .max_by_key(|&(_, slot, pos)| {
                let age = self.last_used.get(slot).copied().unwrap_or(0);
                (pos, std::cmp::Reverse(age), std::cmp::Reverse(slot))
            })?;
        self.free.swap_remove(i);
        let pos = match self.slots.rewind(slot, pos) {
            Ok(()) => pos,
            Err(e) => {
                tracing::warn!(slot, pos, cause = %e, "cannot reuse the slot's prefix; reset");
                self.slots.reset(slot);
                0
            }
        };
        self.uses += 1;
        if let Some(u) = self.last_used.get_mut(slot) {
            *u = self.uses;
        }
        if let Some(k) = self.kept.get_mut(slot) {
            k.truncate(pos);
        }
        Some((slot, pos))
    }

    /// Build and run one forward step, then sample and send for every sequence in it.
    fn step(&mut self) {
        let PrefillBudget { chunk, per_step } = self.slots.prefill_budget();
        let mut budget = per_step.max(1);
        let chunk = chunk.max(1);
        let plan: Vec<Option<Planned>> = self
            .running
            .iter()
            .map(|s| {
                if s.next.is_some() {
                    Some(Planned::Decode)
                } else if s.fed < s.job.gen.prompt.len() && budget > 0 {
                    let n = (s.job.gen.prompt.len() - s.fed).min(chunk).min(budget);
                    budget -= n;
                    Some(Planned::Prefill { end: s.fed + n })
                } else {
                    None
                }
            })
            .collect();
        let feeds: Vec<Feed<'_>> = self
            .running
            .iter()
            .zip(&plan)
            .filter_map(|(s, p)| {
                let (tokens, want_logits) = match (*p)? {
                    Planned::Decode => (std::slice::from_ref(s.next.as_ref()?), true),
                    Planned::Prefill { end } => {
                        (&s.job.gen.prompt[s.fed..end], end == s.job.gen.prompt.len())
                    }
                };
                Some(Feed {
                    slot: s.slot,
                    tokens,
                    want_logits,
                })
            })
            .collect();
        if feeds.is_empty() {
            return;
        }
        self.metrics.batch_size.observe(feeds.len() as f64);
        self.metrics.steps.fetch_add(1, Ordering::Relaxed);
        let result = self.slots.forward(&feeds);
        drop(feeds);
        if let Err(e) = result {
            tracing::error!(cause = %e, "forward step failed; failing its sequences");
            for (s, p) in self.running.iter_mut().zip(&plan) {
                if p.is_some() {
                    s.job.reply_last(Event::Failed(format!("model: {e}")));
                    self.metrics.request(s.job.gen.endpoint.label(), 500);
                    s.finished = true;
                    // Keep nothing of a slot a step failed on.
                    self.slots.reset(s.slot);
                    if let Some(k) = self.kept.get_mut(s.slot) {
                        k.clear();
                    }
                }
            }
        } else {
            for (i, p) in plan.iter().enumerate() {
                match *p {
                    None => {}
                    Some(Planned::Prefill { end }) => {
                        let s = &mut self.running[i];
                        let n = end - s.fed;
                        if let Some(k) = self.kept.get_mut(s.slot) {
                            k.extend_from_slice(&s.job.gen.prompt[s.fed..end]);
                        }
                        s.fed = end;
                        self.metrics
                            .prompt_tokens
                            .fetch_add(n as u64, Ordering::Relaxed);
                        if end == s.job.gen.prompt.len() {
                            self.slots.checkpoint(s.slot);
                            self.sample(i);
                        }
                    }
                    Some(Planned::Decode) => {
                        let s = &mut self.running[i];
                        if let (Some(k), Some(t)) = (self.kept.get_mut(s.slot), s.next.take()) {
                            k.push(t);
                        }
                        self.sample(i);
                    }
                }
            }
        }
        // A finished sequence's slot keeps its session and tokens for the next request.
        let free = &mut self.free;
        self.running.retain(|s| {
            if s.finished {
                free.push(s.slot);
            }
            !s.finished
        });
    }

    /// Sample sequence `i`'s next token from its logits and send what it adds.
    fn sample(&mut self, i: usize) {
        let tok = self.tok;
        let pos = self.slots.position(self.running[i].slot);
        let s = &mut self.running[i];
        let id = s.sampler.sample(self.slots.logits(s.slot));
        if s.job.gen.params.stop_at_eog && tok.is_eog(id) {
            self.finish(i, FinishReason::Stop, true);
            return;
        }
        s.generated += 1;
        let now = Instant::now();
        match s.last_token_at {
            None => self
                .metrics
                .ttft
                .observe((now - s.job.arrived).as_secs_f64()),
            Some(t) => self.metrics.inter_token.observe((now - t).as_secs_f64()),
        }
        s.last_token_at = Some(now);
        self.metrics
            .generated_tokens
            .fetch_add(1, Ordering::Relaxed);
        let piece = match s.detok.push(tok, id) {
            Ok(p) => p,
            Err(e) => {
                let _ = s
                    .job
                    .events
                    .send(Event::Failed(format!("detokeniser: {e}")));
                self.metrics.request(s.job.gen.endpoint.label(), 500);
                s.finished = true;
                return;
            }
        };
        let (text, stopped) = s.stop.push(&piece);
        if !text.is_empty() {
            let _ = s.job.events.send(Event::Text(text));
        }
        if stopped {
            self.finish(i, FinishReason::Stop, false);
        } else if s.generated >= s.job.gen.params.max_tokens || pos >= self.ctx_len {
            self.finish(i, FinishReason::Length, true);
        } else {
            s.next = Some(id);
        }
    }

    /// End sequence `i`: send the text still held (when `flush`: not after a stop string,
    /// whose text after the match is dropped), then `Done`, and mark it for removal.
    fn finish(&mut self, i: usize, mut why: FinishReason, flush: bool) {
        let s = &mut self.running[i];
        if flush {
            let tail = s.detok.finish();
            let (mut text, stopped) = s.stop.push(&tail);
            if stopped {
                why = FinishReason::Stop;
            } else {
                text.push_str(&s.stop.finish());
            }
            if !text.is_empty() {
                let _ = s.job.events.send(Event::Text(text));
            }
        }
        let usage = Usage {
            prompt_tokens: s.job.gen.prompt.len(),
            completion_tokens: s.generated,
            cached_tokens: s.reused,
        };
        self.metrics.request(s.job.gen.endpoint.label(), 200);
        s.job.reply_last(Event::Done { finish: why, usage });
        s.finished = true;
    }
}
