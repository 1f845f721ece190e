//! Runs everywhere (CI has no GPU): opening a context must answer `NoGpu`, never panic.

use hipfire_gpu::{Context, GpuError, GPU_TESTS_ENV};

#[test]
fn context_new_without_gpu_is_a_typed_error() {
    let gpu_box = std::env::var_os(GPU_TESTS_ENV).is_some();
    match Context::new(0) {
        Err(GpuError::NoGpu { reason }) => {
            assert!(!gpu_box, "{GPU_TESTS_ENV} is set but no GPU: {reason}");
            println!("no GPU, as expected here: {reason}");
        }
        Ok(ctx) => assert!(
            gpu_box,
            "found a GPU ({}) on a machine without {GPU_TESTS_ENV}",
            ctx.info().name
        ),
        Err(e) => panic!("expected NoGpu or a context, got {e}"),
    }
    // An ordinal past the last device is NoGpu too (on any machine).
    assert!(matches!(Context::new(1 << 20), Err(GpuError::NoGpu { .. })));
}
