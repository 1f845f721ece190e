//! Fusion: the projections that read one activation (a layer's q/k/v, or gate/up) run as one
//! split step when the join can take them together ([`crate::join::Join::fused_cpu_rows`]):
//! one publish of x, one CPU arm over all their CPU rows, one wait-fold into every output.

use std::time::Instant;

use crate::engine::GpuEngine;
use hipfire_gpu::{Activation, GemvForm, Stream, FOLD_MAX_TARGETS};

use crate::join::{DeviceArgs, SplitPlan};
use crate::offload::{share_form, OffloadExecutor, SpilledStep};
use crate::share::cut_rows;
use crate::ExecError;

impl OffloadExecutor {
    /// Several spilled steps over one activation (a layer's q/k/v, or gate/up), queued on
    /// `stream` in order. Under `flags`, when every step can be split and they share format,
    /// `k` and form, they run as one split step: one publish of x, one CPU arm over all their
    /// CPU rows, the GPU rows of each, one wait-fold into every output; the controller sees
    /// one sample of the summed bytes, under the steps' shared shape key. Otherwise (other
    /// strategies and modes, a step to refuse or probe, CPU rows past the mailbox) each step
    /// runs as [`OffloadExecutor::run`] would run it.
    pub fn run_shared(
        &mut self,
        stream: &Stream,
        kernels: &dyn GpuEngine,
        act: &Activation,
        steps: &mut [SpilledStep<'_>],
    ) -> Result<(), ExecError> {
        let t0 = Instant::now();
        if let Some(plan) = self.fused_split(steps) {
            self.core.trace.total_steps += steps.len() as u64;
            self.core.trace.window_steps += steps.len() as u64;
            let dev = DeviceArgs {
                stream,
                kernels,
                act,
            };
            self.run_join(dev, steps, plan, t0)?;
            if self.core.trace.total_steps.is_power_of_two() {
                self.core.trace_idle();
            }
            return Ok(());
        }
        for st in steps.iter_mut() {
            let step = SpilledStep {
                weight: st.weight,
                host: st.host.clone(),
                x: st.x,
                y: &mut *st.y,
                form: st.form,
            };
            self.run(stream, kernels, act, step)?;
        }
        Ok(())
    }

    /// The fused split of `steps`, if the join fuses and they qualify (see
    /// [`OffloadExecutor::run_shared`]).
    fn fused_split(&mut self, steps: &[SpilledStep<'_>]) -> Option<SplitPlan> {
        let max_cpu_rows = self.join.as_ref()?.fused_cpu_rows()?;
        let first = steps.first()?;
        let (format, k, form) = (first.weight.format(), first.weight.k(), first.form);
        if steps.len() > FOLD_MAX_TARGETS
            || steps.iter().any(|st| {
                st.weight.format() != format
                    || st.weight.k() != k
                    || st.form != form
                    || st.x.device_ptr() != first.x.device_ptr()
            })
        {
            return None;
        }
        let residual = matches!(form, GemvForm::Residual);
        let form = share_form(residual);
        let m_total = steps.iter().map(|st| st.weight.m()).sum();
        let key = self.shape_key(format, k, form);
        if self.core.controller.needs_probe(&key) {
            return None;
        }
        let shares = self.core.controller.shares(&key);
        let mut cuts = Vec::with_capacity(steps.len());
        for st in steps {
            let row_bytes = self.core.split_check(st).ok()?;
            let cut = cut_rows(st.weight.m(), row_bytes, &shares)?;
            cuts.push((cut[1].end, row_bytes));
        }
        let cpu_rows: usize = steps
            .iter()
            .zip(&cuts)
            .map(|(st, &(g, _))| st.weight.m() - g)
            .sum();
        if cpu_rows > max_cpu_rows {
            return None;
        }
        Some(SplitPlan {
            key,
            stat_key: (format, m_total, k, residual),
            cuts,
        })
    }
}
