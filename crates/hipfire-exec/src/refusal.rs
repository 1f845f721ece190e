//! Refusal rules: when a spilled step must not be split between the engines.
//!
//! A refused step runs whole on the CPU — never silently on `pcie`, which would change the
//! mode the user chose — and the trace names the rule ([`Refusal`]'s `Display`). The checks are
//! a pure function of a [`SplitCheck`], which the planner fills from the step and the engines'
//! capabilities, so every rule is unit-tested without an engine.
//!
//! Order matters only for which reason the trace shows; it goes from "the GPU cannot run it"
//! through "the bytes are not what the shape says" to "splitting would not pay".

use crate::share::{MIN_SPLIT_BYTES, MIN_SPLIT_ROWS};
use hipfire_quant::Format;
use std::fmt;

/// Element type of a step's output buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    /// 32-bit float (the only type either arm writes).
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

/// Everything the rules look at for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitCheck {
    /// Weight format.
    pub format: Format,
    /// Row length (elements).
    pub k: usize,
    /// Rows.
    pub m: usize,
    /// Bytes from one row's start to the next (equals the row bytes when packed).
    pub row_stride: usize,
    /// Bytes of the weight buffer.
    pub weight_len: usize,
    /// Output element type.
    pub out_dtype: OutDtype,
    /// Output length (elements).
    pub out_len: usize,
    /// Residual form (`y += W x`).
    pub residual: bool,
    /// This CPU has a vectorised row dot for the format.
    pub cpu_simd: bool,
    /// The GPU has a plain GEMV kernel for the format.
    pub gpu_kernel: bool,
    /// The GPU has a fused residual GEMV kernel for the format.
    pub gpu_residual_kernel: bool,
}

/// Why a step was not split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The GPU has no GEMV kernel for the format.
    NoGpuKernel {
        /// Format.
        format: Format,
    },
    /// Residual form, and the GPU has no fused residual kernel for the format (a split would
    /// need the GPU arm to read, add and write the residual in a second pass).
    NoGpuResidualKernel {
        /// Format.
        format: Format,
    },
    /// Rows are padded (stride ≠ row bytes): the GPU kernels and the row cut assume packed rows.
    PaddedRowStride {
        /// Stride in bytes.
        stride: usize,
        /// Packed row bytes.
        row_bytes: usize,
    },
    /// `k` is not a whole number of the format's blocks.
    BadK {
        /// Format.
        format: Format,
        /// k.
        k: usize,
    },
    /// The weight's byte length is not `m × row_bytes` (rows would be misaddressed).
    ByteLength {
        /// Bytes given.
        len: usize,
        /// Rows.
        m: usize,
        /// Row bytes.
        row_bytes: usize,
    },
    /// No vectorised CPU row dot for the format here: the scalar dot (~10 GMAC/s on the
    /// reference host) loses to the link, so a CPU arm would only slow the step.
    NoCpuSimd {
        /// Format.
        format: Format,
    },
    /// Output is not f32.
    OutputNotF32 {
        /// The output type.
        dtype: OutDtype,
    },
    /// Output shorter than `m`.
    OutputShort {
        /// Elements given.
        len: usize,
        /// Rows.
        m: usize,
    },
    /// Fewer rows than one aligned block per engine.
    TooFewRows {
        /// Rows.
        m: usize,
    },
    /// The weight is under [`MIN_SPLIT_BYTES`]: fixed split costs would exceed the gain.
    UnderMinSplit {
        /// Weight bytes.
        bytes: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoGpuKernel { format } => write!(f, "no GPU kernel for {format}"),
            Refusal::NoGpuResidualKernel { format } => {
                write!(f, "residual form: no GPU residual kernel for {format}")
            }
            Refusal::PaddedRowStride { stride, row_bytes } => {
                write!(
                    f,
                    "padded row stride ({stride} B per row, {row_bytes} B packed)"
                )
            }
            Refusal::BadK { format, k } => {
                write!(f, "k = {k} is not a whole number of {format} blocks")
            }
            Refusal::ByteLength { len, m, row_bytes } => {
                write!(
                    f,
                    "weight is {len} B, not m × row_bytes = {m} × {row_bytes}"
                )
            }
            Refusal::NoCpuSimd { format } => write!(f, "no vectorised CPU row dot for {format}"),
            Refusal::OutputNotF32 { dtype } => write!(f, "output is {dtype:?}, not F32"),
            Refusal::OutputShort { len, m } => write!(f, "output holds {len} elements, m = {m}"),
            Refusal::TooFewRows { m } => write!(f, "m = {m} < {MIN_SPLIT_ROWS} rows"),
            Refusal::UnderMinSplit { bytes } => {
                write!(
                    f,
                    "weight {bytes} B under the minimum split size {MIN_SPLIT_BYTES} B"
                )
            }
        }
    }
}

impl SplitCheck {
    /// `Ok(row_bytes)` if the step may be split, else the first rule it breaks.
    pub fn check(&self) -> Result<usize, Refusal> {
        let format = self.format;
        if !self.gpu_kernel {
            return Err(Refusal::NoGpuKernel { format });
        }
        if self.residual && !self.gpu_residual_kernel {
            return Err(Refusal::NoGpuResidualKernel { format });
        }
        let row_bytes = format
            .row_bytes(self.k)
            .map_err(|_| Refusal::BadK { format, k: self.k })?;
        if self.row_stride != row_bytes {
            return Err(Refusal::PaddedRowStride {
                stride: self.row_stride,
                row_bytes,
            });
        }
        if self.m.checked_mul(row_bytes) != Some(self.weight_len) {
            return Err(Refusal::ByteLength {
                len: self.weight_len,
                m: self.m,
                row_bytes,
            });
        }
        if !self.cpu_simd {
            return Err(Refusal::NoCpuSimd { format });
        }
        if self.out_dtype != OutDtype::F32 {
            return Err(Refusal::OutputNotF32 {
                dtype: self.out_dtype,
            });
        }
        if self.out_len < self.m {
            return Err(Refusal::OutputShort {
                len: self.out_len,
                m: self.m,
            });
        }
        if self.m < MIN_SPLIT_ROWS {
            return Err(Refusal::TooFewRows { m: self.m });
        }
        if self.weight_len < MIN_SPLIT_BYTES {
            return Err(Refusal::UnderMinSplit {
                bytes: self.weight_len,
            });
        }
        Ok(row_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 9B FFN-up q4_0 step that splits.
    fn ok() -> SplitCheck {
        let rb = Format::Q4_0.row_bytes(4096).expect("k");
        SplitCheck {
            format: Format::Q4_0,
            k: 4096,
            m: 12288,
            row_stride: rb,
            weight_len: 12288 * rb,
            out_dtype: OutDtype::F32,
            out_len: 12288,
            residual: false,
            cpu_simd: true,
            gpu_kernel: true,
            gpu_residual_kernel: true,
        }
    }

    #[test]
    fn clean_step_splits() {
        assert_eq!(ok().check(), Ok(2304));
        assert_eq!(
            SplitCheck {
                residual: true,
                ..ok()
            }
            .check(),
            Ok(2304)
        );
    }

    #[test]
    fn each_rule_fires() {
        let rb = 2304;
        let cases: Vec<(SplitCheck, Refusal)> = vec![
            (
                SplitCheck {
                    gpu_kernel: false,
                    ..ok()
                },
                Refusal::NoGpuKernel {
                    format: Format::Q4_0,
                },
            ),
            (
                SplitCheck {
                    residual: true,
                    gpu_residual_kernel: false,
                    ..ok()
                },
                Refusal::NoGpuResidualKernel {
                    format: Format::Q4_0,
                },
            ),
            (
                SplitCheck { k: 4001, ..ok() },
                Refusal::BadK {
                    format: Format::Q4_0,
                    k: 4001,
                },
            ),
            (
                SplitCheck {
                    row_stride: rb + 64,
                    weight_len: 12288 * (rb + 64),
                    ..ok()
                },
                Refusal::PaddedRowStride {
                    stride: rb + 64,
                    row_bytes: rb,
                },
            ),
            (
                SplitCheck {
                    weight_len: 12288 * rb + 1,
                    ..ok()
                },
                Refusal::ByteLength {
                    len: 12288 * rb + 1,
                    m: 12288,
                    row_bytes: rb,
                },
            ),
            (
                SplitCheck {
                    weight_len: 12288 * rb - rb,
                    ..ok()
                },
                Refusal::ByteLength {
                    len: 12287 * rb,
                    m: 12288,
                    row_bytes: rb,
                },
            ),
            (
                SplitCheck {
                    cpu_simd: false,
                    ..ok()
                },
                Refusal::NoCpuSimd {
                    format: Format::Q4_0,
                },
            ),
            (
                SplitCheck {
                    out_dtype: OutDtype::F16,
                    ..ok()
                },
                Refusal::OutputNotF32 {
                    dtype: OutDtype::F16,
                },
            ),
            (
                SplitCheck {
                    out_len: 12287,
                    ..ok()
                },
                Refusal::OutputShort {
                    len: 12287,
                    m: 12288,
                },
            ),
            (
                SplitCheck {
                    m: 31,
                    weight_len: 31 * rb,
                    out_len: 31,
                    ..ok()
                },
                Refusal::TooFewRows { m: 31 },
            ),
            // The 9B's m=32 k=4096 shape (the reference's only refused shape, 72 KiB here).
            (
                SplitCheck {
                    m: 32,
                    weight_len: 32 * rb,
                    out_len: 32,
                    ..ok()
                },
                Refusal::UnderMinSplit { bytes: 32 * rb },
            ),
        ];
        for (check, want) in cases {
            assert_eq!(check.check(), Err(want), "{check:?}");
            // Every reason prints a non-empty line naming the rule.
            assert!(!want.to_string().is_empty());
        }
        // Plain-form steps do not need a residual kernel.
        assert!(SplitCheck {
            gpu_residual_kernel: false,
            ..ok()
        }
        .check()
        .is_ok());
        // Just at the minimum split size: allowed.
        let m_min = MIN_SPLIT_BYTES.div_ceil(rb);
        assert!(SplitCheck {
            m: m_min,
            weight_len: m_min * rb,
            out_len: m_min,
            ..ok()
        }
        .check()
        .is_ok());
        assert!(SplitCheck {
            m: m_min - 1,
            weight_len: (m_min - 1) * rb,
            out_len: m_min,
            ..ok()
        }
        .check()
        .is_err());
    }

    #[test]
    fn display_names_the_rule() {
        let r = Refusal::UnderMinSplit { bytes: 73_728 };
        assert_eq!(
            r.to_string(),
            "weight 73728 B under the minimum split size 2097152 B"
        );
        let r = Refusal::NoGpuResidualKernel {
            format: Format::Q8_0,
        };
        assert_eq!(
            r.to_string(),
            "residual form: no GPU residual kernel for q8_0"
        );
    }
}
