//! The `two-stream` join: as `ordering` up to the CPU arm, then the CPU rows go up on a copy
//! stream and the compute stream waits on the copy's event, so the host never waits for the
//! GPU arm; the arm's timing is read once a later blocking copy has drained the stream.

use std::sync::Arc;
use std::time::Instant;

use hipfire_gpu::{Context, Event, Stream};

use crate::join::{staged_split, DeviceArgs, Join, SplitPlan, SplitTimes};
use crate::offload::{gpu_err, PlannerCore, SpilledStep};
use crate::ExecError;

/// The `two-stream` join: its copy stream and the event the compute stream waits on.
pub(crate) struct TwoStreamJoin {
    copy_stream: Stream,
    copy_done: Event,
}

impl TwoStreamJoin {
    /// The copy stream and its event on `ctx`.
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<TwoStreamJoin, ExecError> {
        Ok(TwoStreamJoin {
            copy_stream: ctx.new_stream().map_err(gpu_err)?,
            copy_done: ctx.new_event().map_err(gpu_err)?,
        })
    }
}

impl Join for TwoStreamJoin {
    fn run_split(
        &mut self,
        core: &mut PlannerCore,
        dev: DeviceArgs<'_>,
        steps: &mut [SpilledStep<'_>],
        plan: SplitPlan,
        _t0: Instant,
    ) -> Result<SplitTimes, ExecError> {
        let (copy_stream, copy_done) = (&self.copy_stream, &self.copy_done);
        staged_split(core, dev, steps, &plan, |core, step, g, m| {
            copy_stream
                .memcpy_htod_async(step.y, g * 4, &core.y_host, g * 4, (m - g) * 4)
                .map_err(gpu_err)?;
            copy_done.record(copy_stream).map_err(gpu_err)?;
            dev.stream.wait_event(copy_done).map_err(gpu_err)
        })
    }
}
