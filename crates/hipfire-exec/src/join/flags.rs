//! The `flags` join: no host synchronisation inside the step.
//!
//! A split step queues publish → GPU arm (between an event pair) → wait-fold on the stream and
//! hands the CPU arm to the pool's workers, which spin on the mailbox's sequence word; the host
//! waits for neither and runs ahead, so each step's engines start as soon as the previous one's
//! rows are folded. The host half of the protocol (mailbox layout, the workers' job) is
//! [`crate::flags`]; the device half is `kernels/flags.cu`, launched by
//! [`hipfire_gpu::FlagsKernels`].

use std::sync::Arc;
use std::time::Instant;

use hipfire_gpu::{
    Context, DoneWords, FlagsKernels, FoldTarget, GpuError, HostMappedBuffer, KernelRegistry,
    RowRange,
};

use crate::flags::{next_step, ArmRows, FlagsArm, FlagsTuning, Mailbox, DEFAULT_FLAGS_TIMEOUT};
use crate::join::{DeviceArgs, Join, SplitPlan, SplitTimes};
use crate::offload::{gpu_err, ArmAccount, PendingSplit, PlannerCore, SpilledStep};
use crate::share::{ArmSample, ArmTime, CPU_ENGINE};
use crate::ExecError;

/// How long the device's wait-fold spins on the CPU's done word before it records a fault
/// instead of hanging the stream: twice the workers' own wait for the device, so a slow device
/// is reported by the workers first.
const FLAGS_DEVICE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The `flags` join's device kernels, mailbox and knobs.
pub(crate) struct FlagsJoin {
    kernels: FlagsKernels,
    mem: Arc<HostMappedBuffer>,
    mailbox: Mailbox,
    /// Last step number published (never 0: the mailbox starts zeroed).
    step: u32,
    /// The device's fold-wait total at the last account.
    fold_wait_taken: u64,
    /// The flags arm's host-side knobs.
    tuning: FlagsTuning,
    /// Record the flags timeline (events around each step, the device's fold-wait count):
    /// off by default, since it costs each step a little (8B decode on the H200, 16 layers
    /// spilled, three alternating runs: 42.1-42.2 tok/s at the commit before it, 39.2-42.8
    /// with it always on).
    timeline: bool,
}

impl FlagsJoin {
    /// The kernels and a mailbox for activations up to `max_k` and `max_m` CPU rows.
    pub(crate) fn new(
        ctx: &Arc<Context>,
        max_k: usize,
        max_m: usize,
    ) -> Result<FlagsJoin, ExecError> {
        let kernels = FlagsKernels::new(&KernelRegistry::new(ctx)).map_err(gpu_err)?;
        let mem = Arc::new(
            ctx.alloc_host_mapped(Mailbox::bytes_needed(max_k, max_m))
                .map_err(gpu_err)?,
        );
        let mailbox = Mailbox::new(Arc::new(mem.clone()), max_k, max_m)?;
        Ok(FlagsJoin {
            kernels,
            mem,
            mailbox,
            step: 0,
            fold_wait_taken: 0,
            tuning: FlagsTuning::default(),
            timeline: false,
        })
    }
}

impl Join for FlagsJoin {
    /// A split step under `flags`, queued without waiting for either engine: the pool's
    /// workers get the CPU arm (they spin on the mailbox's sequence word), the stream gets
    /// publish → GPU arm (between an event pair) → wait-fold, and the call returns. The host
    /// runs ahead and queues what follows (later steps and the kernels between them), so
    /// neither its launches nor a wake-up sit between one step's done word and the next
    /// step's publish; the arms' times are read when a later call finds the step complete.
    /// Trace fields: "d2h" is the workers' wait for the published x, "join" the host's time
    /// to queue the step (its "wall" is that too: the step's own wall is not seen here).
    fn run_split(
        &mut self,
        core: &mut PlannerCore,
        dev: DeviceArgs<'_>,
        steps: &mut [SpilledStep<'_>],
        split: SplitPlan,
        t0: Instant,
    ) -> Result<SplitTimes, ExecError> {
        let DeviceArgs {
            stream,
            kernels,
            act,
        } = dev;
        let first = steps.first().ok_or(ExecError::Shape {
            what: "flags split steps",
            need: 1,
            got: 0,
        })?;
        let (format, k) = (first.weight.format(), first.weight.k());
        let slot = core.take_slot()?;
        // A wait that timed out on the device at an earlier step left its rows unfolded.
        let fault = self
            .mailbox
            .fault()
            .load(std::sync::atomic::Ordering::Acquire);
        if fault != 0 {
            return Err(ExecError::FlagsFault { step: fault });
        }
        self.step = next_step(self.step);
        let seq = self.step;
        let mut offsets = self.mailbox.offsets();
        if !self.timeline {
            offsets.fold_wait = None;
        }
        let parts = steps
            .iter()
            .zip(&split.cuts)
            .map(|(st, &(g, _))| ArmRows {
                weight: st.host.clone(),
                g,
                rows: st.weight.m() - g,
            })
            .collect();
        let ticket = core.pool.submit_flags(FlagsArm {
            format,
            k,
            parts,
            mailbox: self.mailbox.clone(),
            step: seq,
            timeout: DEFAULT_FLAGS_TIMEOUT,
            tuning: self.tuning,
        })?;
        let tuning = self.tuning;
        let (flags_kernels, mem) = (&self.kernels, &self.mem);
        let (gpu_start, gpu_end) = &core.timer.arm_events[slot];
        let ctx = &core.ctx;
        let (x, form) = (steps[0].x, steps[0].form);
        let timeline = core.timer.step_events.get(slot).filter(|_| self.timeline);
        let queued = (|| -> Result<(), GpuError> {
            if let Some((pre_publish, _)) = timeline {
                pre_publish.record(stream)?;
            }
            // The GPU arm's time, which the controller balances against the CPU arm's, starts
            // before the publish: with tagged x the workers start while the publish still
            // runs, so the publish is part of what the CPU's arm overlaps (the timeline's
            // publish figure reads ~0 then). Timed from after it, the controller balanced the
            // arms' durations from different origins and every flags `auto` of the per-shape
            // table sat above the best pinned share; from before it, auto against the sweep's
            // best pinned shares rose on all six projections (15 interleaved rounds each,
            // docs/perf-checkpoints/2026-11-30-auto-per-shape-h200 record 03), and the old
            // timing then ran the layer at 0.984× (record 05).
            gpu_start.record(stream)?;
            if tuning.x_is_tagged(format) {
                flags_kernels.publish_tagged(
                    stream,
                    x,
                    k,
                    mem,
                    &offsets,
                    seq,
                    tuning.tagged_publish_blocks(),
                )?;
            } else {
                flags_kernels.publish(stream, x, k, mem, &offsets, seq)?;
            }
            for (st, &(g, _)) in steps.iter_mut().zip(&split.cuts) {
                let w = st.weight;
                kernels.enqueue_rows(stream, w, act, &mut *st.y, RowRange::new(0, g), st.form)?;
            }
            gpu_end.record(stream)?;
            let targets = steps
                .iter_mut()
                .zip(&split.cuts)
                .map(|(st, &(g, _))| {
                    FoldTarget::new(ctx, &mut *st.y, RowRange::new(g, st.weight.m()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            flags_kernels.wait_fold_targets(
                stream,
                mem,
                &offsets,
                seq,
                &targets,
                DoneWords::PerPart(ticket.cuts()),
                form,
                FLAGS_DEVICE_TIMEOUT,
            )?;
            if let Some((_, post_fold)) = timeline {
                post_fold.record(stream)?;
            }
            Ok(())
        })();
        if let Err(e) = queued {
            // Workers waiting for a publish that may never come stop now.
            ticket.cancel();
            return Err(gpu_err(e));
        }
        let (mut gpu_bytes, mut cpu_bytes) = (0u64, 0u64);
        for (st, &(g, rb)) in steps.iter().zip(&split.cuts) {
            gpu_bytes += (g * rb) as u64;
            cpu_bytes += ((st.weight.m() - g) * rb) as u64;
        }
        core.timer.pending.push_back(PendingSplit {
            slot,
            key: split.key,
            stat_key: split.stat_key,
            gpu_bytes,
            cpu: ArmSample {
                engine: CPU_ENGINE,
                bytes: cpu_bytes,
                // Filled in from the ticket when the step is resolved.
                time: ArmTime::Exact { ns: 0.0 },
            },
            cpu_ticket: Some(ticket),
            timeline: self.timeline,
        });
        Ok(SplitTimes {
            d2h: 0.0,
            cpu: 0.0,
            join: t0.elapsed().as_nanos() as f64,
        })
    }

    fn fused_cpu_rows(&self) -> Option<usize> {
        Some(self.mailbox.rows())
    }

    fn step_events(&self) -> bool {
        true
    }

    fn set_timeline(&mut self, on: bool) {
        self.timeline = on;
    }

    fn set_flags_tuning(&mut self, tuning: FlagsTuning) {
        self.tuning = tuning;
    }

    fn close_account(&mut self, account: &mut ArmAccount) {
        // Every fold queued so far has run (the pending steps' events were waited for).
        let total = self.mailbox.fold_wait_ns();
        account.fold_wait_ns = total.saturating_sub(self.fold_wait_taken) as f64;
        self.fold_wait_taken = total;
    }

    fn before_drop(&mut self, core: &mut PlannerCore) {
        // A wait-fold may still be reading the mailbox; freeing pinned memory under a running
        // kernel is undefined, so let the device finish first.
        if let Err(e) = core.ctx.synchronize() {
            tracing::warn!(cause = %e, "synchronise before freeing the flags mailbox");
        }
        // The device side has run, so every queued CPU arm has finished or timed out;
        // collect the workers (cancelling any still waiting after a device fault).
        for p in core.timer.pending.drain(..) {
            if let Some(t) = p.cpu_ticket {
                t.cancel();
            }
        }
    }
}
