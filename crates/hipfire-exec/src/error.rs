//! The executor's error type.
//!
//! One enum for the whole crate, because every caller (model, CLI, benches) handles executor
//! failures the same way: report and stop the step. Variants carry the fields a user needs
//! to fix the input; hardware-side faults (a worker panic) carry which worker and what it said.

use thiserror::Error;

/// Errors from the executor. Never produced by a panic on user input.
#[derive(Debug, Error)]
pub enum ExecError {
    /// A format-level error from hipfire-quant (bad k, short buffer, ...).
    #[error(transparent)]
    Quant(#[from] hipfire_quant::QuantError),
    /// A CPU worker panicked while running its rows. The output rows of that call are unspecified.
    #[error("cpu worker {worker} panicked: {message}")]
    WorkerPanicked {
        /// Index of the worker in the pool.
        worker: usize,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// A worker thread is gone (its channel is closed), so the pool cannot run work.
    #[error("cpu pool stopped: worker {worker} is no longer running")]
    PoolStopped {
        /// Index of the worker that could not be reached.
        worker: usize,
    },
    /// The OS refused to start a worker thread.
    #[error("could not spawn cpu worker {worker}: {source}")]
    Spawn {
        /// Index of the worker.
        worker: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A buffer's length does not match the shape.
    #[error("{what}: length {got}, shape needs {need}")]
    Shape {
        /// Which buffer.
        what: &'static str,
        /// Length the shape needs.
        need: usize,
        /// Length given.
        got: usize,
    },
    /// A configuration value is out of its documented range.
    #[error("invalid {what}: {value} ({rule})")]
    Invalid {
        /// Which setting.
        what: &'static str,
        /// The value given, as text.
        value: String,
        /// The rule it broke.
        rule: &'static str,
    },
    /// Under the `flags` join, the device's wait for the CPU rows of `step` timed out or saw the
    /// CPU arm fail (the device's fault word): that step's output rows were not written.
    #[error(
        "flags join: the device's wait for the CPU rows of step {step} timed out or saw the CPU \
         arm fail; that step's output rows were not written"
    )]
    FlagsFault {
        /// The step number the device recorded.
        step: u32,
    },
    /// A GPU call failed: the [`hipfire_gpu::GpuError`] itself (the driver call named, the
    /// bytes asked and free for an allocation), kept as the source so callers can match it.
    #[error(transparent)]
    Device(#[from] hipfire_gpu::GpuError),
    /// A wait on a peer (the device's flags words) ran out.
    #[error("timed out after {after:?} waiting for the {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        after: std::time::Duration,
    },
}
