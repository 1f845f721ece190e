//! Runs everywhere: opening a context answers a typed `NoGpu` where there is no GPU (CI), a
//! context where there is one (the GPU box), and never panics.

use hipfire_gpu::{Context, GpuError};

#[test]
fn context_new_without_gpu_is_a_typed_error() {
    match Context::new(0) {
        Err(GpuError::NoGpu { reason }) => println!("no GPU here: {reason}"),
        Ok(ctx) => println!("GPU here: {}", ctx.info().name),
        Err(e) => panic!("expected NoGpu or a context, got {e}"),
    }
    // An ordinal past the last device is NoGpu (on any machine).
    assert!(matches!(Context::new(1 << 20), Err(GpuError::NoGpu { .. })));
}
