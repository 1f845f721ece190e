//! The GPU decoder's [`BlockOps`]: the block's operations on device activations, each in the
//! form the step's rows ask for (a run's GEMV or GEMM, split-KV or chunk attention; a batched
//! decode step's multi-column GEMV and slots kernels).

use hipfire_gpu::gemv::GemvForm;
use hipfire_gpu::LaunchArgs;

use super::{ActSlot, GpuDecoder, LayerRows, StepRows, DECODE_THREADS};
use crate::block::{Act, Attention, BlockOps, DeltaNet, MoeTensors};
use crate::config::FfnActivation;
use crate::ModelError;

/// One layer's rows of one step: the decoder, its activations' addresses, where the rows'
/// residual stream starts (`x`, a micro-batch's rows inside the step's) and what the rows are.
pub(super) struct GpuStep<'d, 'm, 'r> {
    pub(super) dec: &'d mut GpuDecoder<'m>,
    /// The layer the rows run through (its routed experts' tables).
    pub(super) li: usize,
    pub(super) r: &'r StepRows,
    pub(super) x: u64,
    pub(super) rows: LayerRows<'r>,
}

impl GpuStep<'_, '_, '_> {
    fn addr(&self, a: Act) -> u64 {
        let r = self.r;
        match a {
            Act::X => self.x,
            Act::Xn => r.xn,
            Act::Q => r.q,
            Act::K => r.k,
            Act::V => r.v,
            Act::Att => r.att,
            Act::Gate => r.gate,
            Act::Up => r.up,
        }
    }

    /// The quantised-activation buffer a projection of `input` prepares (the GEMV's).
    fn slot(input: Act) -> ActSlot {
        match input {
            Act::Att => ActSlot::Q,
            Act::Gate | Act::Up => ActSlot::Ff,
            _ => ActSlot::Model,
        }
    }

    fn width(&self, a: Act) -> usize {
        a.width(self.dec.model.config())
    }

    fn project_form(
        &mut self,
        outs: &[(usize, u64, usize)],
        input: Act,
        form: GemvForm,
    ) -> Result<(), ModelError> {
        let (x, k) = (self.addr(input), self.width(input));
        self.dec
            .project_any(outs, x, k, self.rows, Self::slot(input), form)
    }
}

impl BlockOps for GpuStep<'_, '_, '_> {
    type Vector = u64;

    fn rms_norm(&mut self, src: Act, w: u64, dst: Act, width: usize) -> Result<(), ModelError> {
        let rows = self.rows.len() * (self.width(dst) / width);
        let (s, d) = (self.addr(src), self.addr(dst));
        Ok(self.dec.rms_norm(s, w, d, rows, width)?)
    }

    fn add_bias(&mut self, dst: Act, b: u64) -> Result<(), ModelError> {
        let (y, len) = (self.addr(dst), self.width(dst));
        self.dec.add_bias(y, (b, len), self.rows)
    }

    fn project(&mut self, outs: &[(usize, Act)], input: Act) -> Result<(), ModelError> {
        let outs: Vec<(usize, u64, usize)> = outs
            .iter()
            .map(|&(w, a)| (w, self.addr(a), self.width(a)))
            .collect();
        self.project_form(&outs, input, GemvForm::Plain)
    }

    fn project_residual(&mut self, w: usize, input: Act) -> Result<(), ModelError> {
        let out = [(w, self.x, self.width(Act::X))];
        self.project_form(&out, input, GemvForm::Residual)
    }

    fn attention(&mut self, li: usize, sinks: Option<u64>) -> Result<(), ModelError> {
        // `GpuDecoder::with_slots` refuses gpt-oss (the one architecture with sinks) first.
        if sinks.is_some() {
            return Err(ModelError::Unsupported(
                "the GPU engine does not run attention sinks".into(),
            ));
        }
        let c = self.dec.model.config();
        let (n_head, n_head_kv) = (c.n_head, c.n_head_kv);
        let (r, m) = (self.r, self.rows.len());
        match self.rows {
            LayerRows::Run { pos, batched, .. } => {
                self.dec.rope_rows(li, r.q, n_head, (m, pos, batched))?;
                self.dec.rope_rows(li, r.k, n_head_kv, (m, pos, batched))?;
                self.dec.kv_store(li, r.k, r.v, pos, m)?;
                self.dec.attend(li, r, (m, pos, batched))
            }
            LayerRows::Slots(feeds) => self.dec.slots_rows(li, r, feeds),
        }
    }

    fn rms_norm_add(&mut self, src: Act, w: u64) -> Result<(), ModelError> {
        let c = self.dec.model.config();
        let args = LaunchArgs::new()
            .ptr(self.addr(src))
            .ptr(w)
            .ptr(self.x)
            .i32(c.d_model as i32)
            .f32(c.rms_eps);
        let rows = self.rows.len() as u32;
        let dec = &*self.dec;
        Ok(dec.launch(&dec.k.rms_norm_add, rows, DECODE_THREADS, 0, args)?)
    }

    fn gated_activation(&mut self, f: FfnActivation) -> Result<(), ModelError> {
        let n = self.rows.len() * self.width(Act::Gate);
        let r = self.r;
        let args = LaunchArgs::new()
            .ptr(r.gate)
            .ptr(r.up)
            .ptr(r.gate)
            .i32(n as i32);
        let dec = &*self.dec;
        let kernel = match f {
            FfnActivation::Silu => &dec.k.swiglu,
            FfnActivation::GeluTanh => &dec.k.geglu,
        };
        Ok(dec.launch_1d(kernel, n, args)?)
    }

    fn gated_query(&mut self, a: &Attention<usize, u64>) -> Result<(), ModelError> {
        self.dec.gated_query(a, self.r, self.rows)
    }

    fn output_gate(&mut self) -> Result<(), ModelError> {
        self.dec.gate_attention(self.r, self.rows.len())
    }

    fn delta_net(&mut self, li: usize, t: &DeltaNet<usize, u64>) -> Result<(), ModelError> {
        self.dec.delta_net_rows(li, t, self.r, self.x, self.rows)
    }

    fn moe(&mut self, t: &MoeTensors<usize, u64>) -> Result<(), ModelError> {
        self.dec.moe_rows(self.li, self.r, self.x, self.rows, t)
    }
}
