//! GPU tier: a failed VRAM or pinned allocation is a typed error naming the bytes asked and
//! the bytes free, and the context stays usable after it.
//! Runs only with `HIPFIRE_GPU_TESTS=1` (each test prints why it skipped otherwise).

mod common;

use common::gpu;
use hipfire_gpu::GpuError;

/// Extra bytes asked beyond what is free: 1 GiB, far beyond any driver rounding or reserve.
const BEYOND_FREE: u64 = 1 << 30;

#[test]
fn vram_allocation_beyond_free_names_bytes_asked_and_free() {
    let Some(ctx) = gpu() else { return };
    let (free, total) = ctx.mem_info().expect("mem info");
    let ask = usize::try_from(free + BEYOND_FREE).expect("fits usize");
    let e = match ctx.alloc::<u8>(ask) {
        Err(e) => e,
        Ok(_) => panic!("{ask} bytes allocated with {free} free"),
    };
    match &e {
        GpuError::DeviceAlloc {
            requested,
            free: Some(f),
            total: Some(t),
            ..
        } => {
            assert_eq!(*requested, ask);
            assert_eq!(*t, total);
            // Free memory moves with other processes; it is still below what was asked.
            assert!((*f as u128) < ask as u128, "{e}");
        }
        other => panic!("not DeviceAlloc: {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(&ask.to_string()) && msg.contains("bytes free of"),
        "{msg}"
    );
    // The context survives the failure: a small allocation still works.
    let b = ctx
        .alloc::<f32>(1024)
        .expect("small alloc after the failure");
    assert_eq!(b.len(), 1024);
}

#[test]
fn pinned_allocation_beyond_ram_names_bytes_asked_and_available() {
    let Some(ctx) = gpu() else { return };
    let avail = hipfire_gpu::mem_available_bytes().expect("MemAvailable on Linux");
    // Four times what is available: no host can pin that.
    let ask = usize::try_from(avail.saturating_mul(4)).expect("fits usize");
    let e = match ctx.alloc_host_mapped(ask) {
        Err(e) => e,
        Ok(_) => panic!("{ask} bytes pinned with {avail} available"),
    };
    assert!(
        matches!(&e, GpuError::HostAlloc { requested, mem_available: Some(_), .. } if *requested == ask),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&ask.to_string()) && msg.contains("MemAvailable"),
        "{msg}"
    );
}
