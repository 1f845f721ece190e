//! The CPU half of the `flags` join: a host-visible mailbox and a pool job that waits on it.
//!
//! No host synchronisation per step: the device writes the activation into the mailbox, then
//! (after `__threadfence_system()`) the sequence word; the pool's workers, handed the job before
//! the device gets there, spin on that word, multiply their rows, write them into the mailbox
//! and publish their done words; on the device each block of the fold spins on the done word
//! of the rows it folds and copies (or adds) them into the output. This module is the host side
//! and the layout; the device kernels are `kernels/flags.cu` (launched by `hipfire_gpu::FlagsKernels`,
//! driven from [`crate::join::flags`]). In CPU-only tests, test-only stand-ins of the mailbox play
//! the device.
//!
//! Files: `mailbox` (layout, memory, words, the spin-wait), `job` (the arm as a pool job
//! and its ticket), `activation` (x prepared by the workers together), `tuning` (the
//! knobs and their measured defaults).
//!
//! # Layout (offsets in bytes; mirror them in the kernels)
//! | offset | what |
//! |---|---|
//! | [`SEQ_OFFSET`] | `u32` step number, written by the device after `x` |
//! | [`FAULT_OFFSET`] | `u32` step number of the last step the device's wait timed out or saw a failed arm |
//! | [`DONE_OFFSET`] | `u32` step number, written by the arm's last worker after every row (own cache line) |
//! | [`FOLD_WAIT_OFFSET`] | `u64` nanoseconds the device's folds have waited for done, summed (diagnostic, own line) |
//! | [`PART_DONE_OFFSET`] | [`MAX_DONE_PARTS`] lines: worker `p`'s `u32` done word at `PART_DONE_OFFSET + 64 p`, written after its rows |
//! | [`X_OFFSET`] | `k` f32: the activation; or, under [`FlagsTuning::tagged_x`], `k` 8-byte words, each an f32's bits with the step in the upper half (8 k bytes are kept for it) |
//! | [`Mailbox::y_offset`] | `rows` f32: `W[g + i] · x` for the CPU rows, always plain |
//!
//! A done word holds the step it finished, with [`DONE_FAILED`] set when the arm (or that
//! worker) failed; step numbers stay below that bit ([`next_step`]).
//!
//! The CPU rows are always the plain product; the device fold adds them for the residual form,
//! so the residual never crosses the link.

mod activation;
mod job;
mod mailbox;
mod tuning;

pub use job::{flags_clock_ns, ArmRows, FlagsArm, FlagsReport, FlagsTicket, WeightBytes};
pub use mailbox::{
    next_step, Mailbox, MailboxMemory, DEFAULT_FLAGS_TIMEOUT, DONE_FAILED, DONE_OFFSET,
    FAULT_OFFSET, FOLD_WAIT_OFFSET, MAILBOX_ALIGN, MAX_DONE_PARTS, PART_DONE_OFFSET, SEQ_OFFSET,
    TAGGED_X_BYTES, X_OFFSET,
};
pub use tuning::{
    FlagsTuning, DEFAULT_CHUNKS_PER_WORKER, DEFAULT_PUBLISH_BLOCKS, DEFAULT_TAGGED_X,
    DEFAULT_WAIT_PREFETCH_BYTES,
};

#[cfg(test)]
mod tests;
