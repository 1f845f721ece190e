//! TEMPORARY compile stand-in for the multi-column GEMV (replaced by the real kernel's merge).
use super::*;

/// Most columns per launch.
pub const GEMV_MAX_COLS: usize = 8;

impl Activation {
    /// Room for `cols` columns.
    pub fn with_columns(ctx: &Arc<Context>, k: usize, cols: usize) -> Result<Activation, GpuError> {
        let _ = cols;
        Activation::new(ctx, k)
    }
    /// Columns.
    pub fn columns(&self) -> usize {
        1
    }
}

impl GemvKernels {
    /// Stand-in.
    pub fn prepare_cols<X: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        x: &X,
        act: &mut Activation,
        _cols: usize,
    ) -> Result<(), GpuError> {
        self.prepare(stream, x, act)
    }
    /// Stand-in.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_cols<Y: DeviceMemory + ?Sized>(
        &self,
        stream: &Stream,
        w: &WeightRef<'_>,
        act: &Activation,
        y: &mut Y,
        _ldy: usize,
        rows: RowRange,
        form: GemvForm,
        _cols: usize,
    ) -> Result<(), GpuError> {
        self.gemv(stream, w, act, y, rows, form)
    }
}
