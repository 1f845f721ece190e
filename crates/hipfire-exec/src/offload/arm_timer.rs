//! The arm timer: an event pair around each split step's GPU arm, from a small ring, and the
//! split steps still pending until their arms' times can be read.
//!
//! A pair is read once it has completed (after the next blocking D2H under `ordering` and
//! `two-stream`; by a non-blocking query under `flags`, whose steps never wait for the stream),
//! so reading them never adds a host wait except when the ring is full. A resolved step feeds
//! both arms to the share controller and the trace, and adds to the [`ArmAccount`].

use std::collections::VecDeque;
use std::sync::Arc;

use hipfire_gpu::{Context, Event};
use hipfire_quant::Format;

use crate::flags::FlagsTicket;
use crate::offload::{gpu_err, PlannerCore};
use crate::share::{ArmSample, ArmTime, ShapeKey};
use crate::ExecError;

/// GPU arm event pairs in flight before the oldest must be waited for. Under `flags` a pair is
/// read when a later step finds it complete; eight covers a whole layer's seven projections.
pub(crate) const ARM_EVENT_RING: usize = 8;

/// Steps that ran on the CPU (whole or as an arm) and the time of their longer arm, summed:
/// the part of a spilled step's wall that is not synchronisation. `1 − arm_ns / wall` over a
/// timed run is the per-step sync overhead (issue 4's figure).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ArmAccount {
    /// Steps counted (split steps once both arms are timed, and whole-CPU steps).
    pub steps: u64,
    /// Σ over those steps of max(CPU arm, GPU arm) in nanoseconds (the CPU multiply alone for
    /// whole-CPU steps).
    pub arm_ns: f64,
    /// `flags` only, where the sync time goes. Σ over split steps of the workers' start skew
    /// (last − first to see the sequence word), ns.
    pub worker_skew_ns: f64,
    /// Σ over split steps of the gap from the previous step's last worker finishing to this
    /// step's first worker seeing its x (fold, kernels between, publish), ns; steps with
    /// another kind of step in between are not counted.
    pub turnaround_ns: f64,
    /// Split steps counted in `turnaround_ns`.
    pub turnarounds: u64,
    /// Σ over flags steps of the device's publish (event before it to the GPU arm's start), ns.
    pub publish_ns: f64,
    /// Σ over flags steps of the wait-fold (GPU arm's end to after the fold: includes waiting
    /// for a slower CPU arm), ns.
    pub fold_ns: f64,
    /// Σ over consecutive flags steps of the device's gap from one fold's end to the next
    /// publish (launches, kernels between steps), ns.
    pub device_gap_ns: f64,
    /// Of `fold_ns`, the time the folds spent waiting for the CPU's done word (the device's
    /// own count), ns; the rest is the fold's work and the launch.
    pub fold_wait_ns: f64,
    /// Σ over split steps of the longest activation preparation of a worker (part of the CPU
    /// arm: every worker quantises x itself), ns.
    pub prepare_ns: f64,
    /// Σ over flags steps of the weight bytes the workers prefetched while they waited.
    pub prefetched_bytes: f64,
}

impl std::ops::AddAssign for ArmAccount {
    /// Sum two accounts (consecutive runs: their turnarounds stay counted apart).
    fn add_assign(&mut self, o: ArmAccount) {
        self.steps += o.steps;
        self.arm_ns += o.arm_ns;
        self.worker_skew_ns += o.worker_skew_ns;
        self.turnaround_ns += o.turnaround_ns;
        self.turnarounds += o.turnarounds;
        self.publish_ns += o.publish_ns;
        self.fold_ns += o.fold_ns;
        self.device_gap_ns += o.device_gap_ns;
        self.fold_wait_ns += o.fold_wait_ns;
        self.prepare_ns += o.prepare_ns;
        self.prefetched_bytes += o.prefetched_bytes;
    }
}

/// A split step whose arm timings are read once it has completed: the GPU arm's event pair
/// (ring slot `slot`) and, under `flags`, the CPU arm's ticket (its time is known only then).
pub(crate) struct PendingSplit {
    pub(crate) slot: usize,
    pub(crate) key: ShapeKey,
    pub(crate) stat_key: (Format, usize, usize, bool),
    pub(crate) gpu_bytes: u64,
    pub(crate) cpu: ArmSample,
    pub(crate) cpu_ticket: Option<FlagsTicket>,
    /// Whether the step recorded its timeline events ([`OffloadExecutor::set_timeline`]).
    pub(crate) timeline: bool,
}

/// The event ring, the pending split steps and the account their arms add to.
pub(crate) struct ArmTimer {
    /// Event pairs around GPU arms ([`ARM_EVENT_RING`]), used round-robin.
    pub(crate) arm_events: Vec<(Event, Event)>,
    /// For a join with a timeline ([`crate::join::Join::step_events`]), per ring slot: before
    /// the publish and after the wait-fold, so the account can say where the device's time
    /// between two GPU arms goes.
    pub(crate) step_events: Vec<(Event, Event)>,
    /// The previous flags step's after-fold event slot, while its successor is unresolved.
    pub(crate) last_fold_slot: Option<usize>,
    pub(crate) next_slot: usize,
    pub(crate) pending: VecDeque<PendingSplit>,
    pub(crate) account: ArmAccount,
    /// When the last resolved flags step's CPU arm finished ([`crate::flags::flags_clock_ns`]).
    pub(crate) last_flags_done: Option<u64>,
}

impl ArmTimer {
    /// The ring on `ctx`; with `step_events`, the timeline's second pair per slot too.
    pub(crate) fn new(ctx: &Arc<Context>, step_events: bool) -> Result<ArmTimer, ExecError> {
        let mut arm_events = Vec::with_capacity(ARM_EVENT_RING);
        for _ in 0..ARM_EVENT_RING {
            arm_events.push((
                ctx.new_event().map_err(gpu_err)?,
                ctx.new_event().map_err(gpu_err)?,
            ));
        }
        let mut timeline_events = Vec::new();
        if step_events {
            for _ in 0..ARM_EVENT_RING {
                timeline_events.push((
                    ctx.new_event().map_err(gpu_err)?,
                    ctx.new_event().map_err(gpu_err)?,
                ));
            }
        }
        Ok(ArmTimer {
            arm_events,
            step_events: timeline_events,
            last_fold_slot: None,
            next_slot: 0,
            pending: VecDeque::new(),
            account: ArmAccount::default(),
            last_flags_done: None,
        })
    }

    /// A step that is no split ran between two: no turnaround or device gap spans it.
    pub(crate) fn break_chain(&mut self) {
        self.last_flags_done = None;
        self.last_fold_slot = None;
    }
}

impl PlannerCore {
    /// Reads completed split steps, oldest first, and feeds both arms of each to the
    /// controller. `block`: wait for every pending step (callers that just drained the stream
    /// pay nothing for it); otherwise stop at the first one still running.
    pub(crate) fn resolve_pending(&mut self, block: bool) -> Result<(), ExecError> {
        while self.resolve_oldest(block)? {}
        Ok(())
    }

    /// Resolve the oldest pending step, waiting for it if `block`; whether there was one that
    /// could be resolved. A CPU arm's error (a worker failed or timed out) is returned here.
    fn resolve_oldest(&mut self, block: bool) -> Result<bool, ExecError> {
        let Some(p) = self.timer.pending.front() else {
            return Ok(false);
        };
        let (start, end) = &self.timer.arm_events[p.slot];
        if block {
            end.synchronize().map_err(gpu_err)?;
        } else if !end.query().map_err(gpu_err)?
            || p.cpu_ticket.as_ref().is_some_and(|t| !t.is_finished())
            || match self.timer.step_events.get(p.slot).filter(|_| p.timeline) {
                Some((_, post)) => !post.query().map_err(gpu_err)?,
                None => false,
            }
        {
            return Ok(false);
        }
        let ns = f64::from(start.elapsed_ms(end).map_err(gpu_err)?) * 1e6;
        let Some(mut p) = self.timer.pending.pop_front() else {
            return Ok(false);
        };
        if let Some(ticket) = p.cpu_ticket.take() {
            let rep = ticket.wait()?;
            p.cpu.time = ArmTime::Exact { ns: rep.cpu_ns };
            if rep.first_seen_ns != u64::MAX {
                let a = &mut self.timer.account;
                a.worker_skew_ns += rep.last_seen_ns.saturating_sub(rep.first_seen_ns) as f64;
                a.prepare_ns += rep.prepare_ns;
                a.prefetched_bytes += rep.prefetched_bytes as f64;
                if let Some(prev_done) = self
                    .timer
                    .last_flags_done
                    .filter(|&d| d < rep.first_seen_ns)
                {
                    a.turnaround_ns += (rep.first_seen_ns - prev_done) as f64;
                    a.turnarounds += 1;
                }
                self.timer.last_flags_done = Some(rep.done_ns);
            }
            if let Some((pre, post)) = self.timer.step_events.get(p.slot).filter(|_| p.timeline) {
                post.synchronize().map_err(gpu_err)?;
                let ms = |a: &Event, b: &Event| a.elapsed_ms(b).map(|v| f64::from(v) * 1e6);
                let (gpu_start, gpu_end) = &self.timer.arm_events[p.slot];
                let a = &mut self.timer.account;
                a.publish_ns += ms(pre, gpu_start).map_err(gpu_err)?;
                a.fold_ns += ms(gpu_end, post).map_err(gpu_err)?;
                if let Some(prev) = self.timer.last_fold_slot {
                    a.device_gap_ns += ms(&self.timer.step_events[prev].1, pre).map_err(gpu_err)?;
                }
                self.timer.last_fold_slot = Some(p.slot);
            }
            let s = self.trace.stats.entry(p.stat_key).or_default();
            s.d2h_ns += rep.wait_ns;
            s.cpu_ns += rep.cpu_ns;
        }
        let gpu = ArmSample {
            engine: 1,
            bytes: p.gpu_bytes,
            time: ArmTime::Exact { ns },
        };
        let cpu_ns = match p.cpu.time {
            ArmTime::Exact { ns } | ArmTime::FinishedBy { ns } => ns,
        };
        self.timer.account.steps += 1;
        self.timer.account.arm_ns += cpu_ns.max(ns);
        self.controller.observe(p.key, &[p.cpu, gpu]);
        self.trace.stats.entry(p.stat_key).or_default().gpu_ns += ns;
        Ok(true)
    }

    /// The next free event pair of the ring (waiting for the oldest pending step if none is).
    pub(crate) fn take_slot(&mut self) -> Result<usize, ExecError> {
        if self.timer.pending.len() >= ARM_EVENT_RING {
            self.resolve_oldest(true)?;
        }
        self.resolve_pending(false)?;
        let slot = self.timer.next_slot;
        self.timer.next_slot = (self.timer.next_slot + 1) % ARM_EVENT_RING;
        // That slot's after-fold event is about to be recorded again: no gap from it.
        if self.timer.last_fold_slot == Some(slot) {
            self.timer.last_fold_slot = None;
        }
        Ok(slot)
    }
}
