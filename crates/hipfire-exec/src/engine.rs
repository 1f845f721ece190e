//! The GPU engine seam: what the planner and the joins ask of the GPU arm of a split step —
//! queue one projection's row range on a stream — and nothing more. The planner decides the
//! rows; the engine only executes them (it never sees a share, a join or a timing).
//!
//! hipfire-gpu's [`GemvKernels`] is the engine, on CUDA and on HIP alike: its kernels are
//! compiled at run time for the device and launched through `hipfire_gpu::backend::Backend`,
//! which each runtime implements. A kernel family of another shape is one more implementation
//! of [`GpuEngine`]; the planner does not change. A second GPU is not: a split step has one GPU
//! arm (one engine, one stream, one device) and one CPU arm, and the planner cuts rows between
//! those two only.

use hipfire_gpu::{
    Activation, DeviceMemory, GemvForm, GemvKernels, GpuError, RowRange, Stream, WeightRef,
};

/// A GPU engine: queues row ranges of a GEMV on a stream.
pub trait GpuEngine: Send + Sync {
    /// Queues `y[r] = W[r]·x` (plain) or `y[r] += W[r]·x` (residual) for `r` in `rows`, on
    /// `stream`. `y` holds at least `w.m()` f32 values indexed by absolute row; `act` is the
    /// activation prepared on `stream` (or a stream ordered before it).
    fn enqueue_rows(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut dyn DeviceMemory,
        rows: RowRange,
        form: GemvForm,
    ) -> Result<(), GpuError>;

    /// [`GpuEngine::enqueue_rows`] for `cols` activation columns at once (each weight row read
    /// once for all of them): column `c`'s outputs start at `c · ldy`. Each column gets the bits
    /// it would get alone.
    #[allow(clippy::too_many_arguments)] // the row range of a multi-column step
    fn enqueue_rows_cols(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut dyn DeviceMemory,
        ldy: usize,
        rows: RowRange,
        form: GemvForm,
        cols: usize,
    ) -> Result<(), GpuError>;
}

impl GpuEngine for GemvKernels {
    fn enqueue_rows(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut dyn DeviceMemory,
        rows: RowRange,
        form: GemvForm,
    ) -> Result<(), GpuError> {
        self.gemv(stream, w, act, y, rows, form)
    }

    fn enqueue_rows_cols(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut dyn DeviceMemory,
        ldy: usize,
        rows: RowRange,
        form: GemvForm,
        cols: usize,
    ) -> Result<(), GpuError> {
        self.gemv_cols(stream, w, act, y, ldy, rows, form, cols)
    }
}
