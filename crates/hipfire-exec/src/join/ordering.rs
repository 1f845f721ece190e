//! The `ordering` join (the reference system's): x down with a blocking copy, the GPU arm
//! queued, the CPU arm on the calling thread, then the CPU rows up on the same stream, ordered
//! after the GPU arm, and a host wait for both.

use std::time::Instant;

use crate::join::{staged_split, DeviceArgs, Join, SplitPlan, SplitTimes};
use crate::offload::{gpu_err, PlannerCore, SpilledStep};
use crate::ExecError;

/// The `ordering` join: nothing of its own on the device.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OrderingJoin;

impl Join for OrderingJoin {
    fn run_split(
        &mut self,
        core: &mut PlannerCore,
        dev: DeviceArgs<'_>,
        steps: &mut [SpilledStep<'_>],
        plan: SplitPlan,
        _t0: Instant,
    ) -> Result<SplitTimes, ExecError> {
        let times = staged_split(core, dev, steps, &plan, |core, step, g, m| {
            dev.stream
                .memcpy_htod_async(step.y, g * 4, &core.y_host, g * 4, (m - g) * 4)
                .map_err(gpu_err)?;
            dev.stream.synchronize().map_err(gpu_err)
        })?;
        // The host waited for the stream: the step's GPU arm is complete.
        core.resolve_pending(true)?;
        Ok(times)
    }
}
