//! What the model hands the executor: GEMV steps over weights that live on the device
//! (resident) or in pinned host memory (spilled), and the mode spilled steps run in.

use crate::error::ExecError;
use crate::refusal::OutDtype;
use crate::share::Form;
use hipfire_quant::Format;

/// `memory.offload_exec`: how a spilled GEMV runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum OffloadExec {
    /// The GPU reads the host-mapped weight over the link.
    Pcie,
    /// The CPU pool multiplies the whole spilled weight.
    Cpu,
    /// Rows split between the GPU (over the link) and the CPU pool, scheduled to finish together.
    Passback,
}

impl OffloadExec {
    /// Parse `pcie` | `cpu` | `passback` (case-insensitive).
    pub fn parse(s: &str) -> Result<OffloadExec, ExecError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pcie" => Ok(OffloadExec::Pcie),
            "cpu" => Ok(OffloadExec::Cpu),
            "passback" => Ok(OffloadExec::Passback),
            other => Err(ExecError::Invalid {
                what: "memory.offload_exec",
                value: other.to_string(),
                rule: "one of pcie, cpu, passback",
            }),
        }
    }

    /// The name as written in config.
    pub fn name(self) -> &'static str {
        match self {
            OffloadExec::Pcie => "pcie",
            OffloadExec::Cpu => "cpu",
            OffloadExec::Passback => "passback",
        }
    }
}

/// Where a weight's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Residency {
    /// Device memory: always multiplied by the GPU, whatever the mode.
    Resident,
    /// Pinned host memory mapped into the device: the mode decides.
    Spilled,
}

/// Opaque id of a weight inside a GPU engine (the engine's own table; see
/// [`crate::gpu::GpuEngine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuWeightId(pub u64);

/// A weight matrix as the executor sees it.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    /// Format.
    pub format: Format,
    /// Rows.
    pub m: usize,
    /// Row length (elements).
    pub k: usize,
    /// Bytes from one row's start to the next (the packed row bytes unless padded).
    pub row_stride: usize,
    /// Host-visible bytes (the pinned mapping of a spilled weight); empty for a resident one.
    pub host: &'a [u8],
    /// The engine's handle to the same bytes, if a GPU engine has them.
    pub gpu: Option<GpuWeightId>,
    /// Where the bytes live.
    pub residency: Residency,
}

impl<'a> WeightView<'a> {
    /// A spilled, packed weight over host bytes (`row_stride` = the format's row bytes).
    pub fn spilled(
        format: Format,
        m: usize,
        k: usize,
        host: &'a [u8],
        gpu: Option<GpuWeightId>,
    ) -> Result<WeightView<'a>, ExecError> {
        let row_stride = format.row_bytes(k)?;
        Ok(WeightView {
            format,
            m,
            k,
            row_stride,
            host,
            gpu,
            residency: Residency::Spilled,
        })
    }
}

/// One GEMV the model hands the executor. `x` and the output live in host memory here (the
/// `cpu` mode and host-operand engines); device-resident operands are the GPU engine's business.
#[derive(Debug)]
pub enum Step<'a> {
    /// `y = W x`.
    Gemv {
        /// Weight.
        w: WeightView<'a>,
        /// Activation (`k` values).
        x: &'a [f32],
        /// Output (`m` values).
        y: &'a mut [f32],
    },
    /// `residual += W x`.
    GemvResidual {
        /// Weight.
        w: WeightView<'a>,
        /// Activation (`k` values).
        x: &'a [f32],
        /// Accumulator (`m` values).
        residual: &'a mut [f32],
    },
}

impl<'a> Step<'a> {
    /// The weight.
    pub fn weight(&self) -> &WeightView<'a> {
        match self {
            Step::Gemv { w, .. } | Step::GemvResidual { w, .. } => w,
        }
    }

    /// Plain or residual.
    pub fn form(&self) -> Form {
        match self {
            Step::Gemv { .. } => Form::Plain,
            Step::GemvResidual { .. } => Form::Residual,
        }
    }

    /// Activation, output, and whether the output accumulates.
    pub fn operands(&mut self) -> (&WeightView<'a>, &[f32], &mut [f32], bool) {
        match self {
            Step::Gemv { w, x, y } => (w, x, y, false),
            Step::GemvResidual { w, x, residual } => (w, x, residual, true),
        }
    }

    /// Output element type (host outputs are f32 by construction).
    pub fn out_dtype(&self) -> OutDtype {
        OutDtype::F32
    }
}
