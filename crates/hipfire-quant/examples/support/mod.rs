//! What the measuring examples (`gemv_gbs`, `gemv_cpu`, `prefill_gemm`) share: the matrix built
//! by tiling a few distinct quantised rows, and this thread's CPU clock. Each example includes
//! this file (`#[path]`) and uses part of it.
#![allow(dead_code)]

use hipfire_quant::{quantize_row, Format};
use std::error::Error;

/// Distinct quantised rows tiled into a matrix (quantising K-quants row by row is slow).
pub const DISTINCT_ROWS: usize = 64;

/// [`DISTINCT_ROWS`] rows of `k` deterministic values in [-1, 1], quantised to `fmt`: the rows
/// `gemv_gbs` and `gemv_cpu` tile.
pub fn distinct_rows(fmt: Format, k: usize) -> Result<Vec<Vec<u8>>, Box<dyn Error>> {
    (0..DISTINCT_ROWS)
        .map(|r| {
            let src: Vec<f32> = (0..k)
                .map(|i| (((i + 31 * r) * 2654435761usize % 2001) as f32 / 1000.0) - 1.0)
                .collect();
            Ok(quantize_row(fmt, &src)?)
        })
        .collect()
}

/// `m` rows: `distinct` repeated in order.
pub fn tiled(distinct: &[Vec<u8>], m: usize) -> Vec<u8> {
    (0..m)
        .flat_map(|i| distinct[i % distinct.len()].iter().copied())
        .collect()
}

/// This thread's CPU time in nanoseconds (time spent descheduled on a shared machine does not
/// count).
pub fn thread_cpu_ns() -> Result<u64, Box<dyn Error>> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Err("clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed".into());
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}
