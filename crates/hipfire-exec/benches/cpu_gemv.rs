//! Criterion bench of the pinned CPU pool's GEMV, weight GB/s, every format in one group.
//!
//! `cargo bench -p hipfire-exec --bench cpu_gemv`. Each iteration multiplies the next cold
//! copy of the matrix (see `hipfire_exec::bench::COLD_SET_BYTES`), so the figure is DRAM, not
//! cache. For the plain-read ceiling next to it, run `examples/cpu_gemv_bench.rs`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hipfire_exec::CpuPool;
use hipfire_quant::Format;
use std::time::{Duration, Instant};

/// A 9B FFN-up matrix: k = 4096, m = 12288.
const K: usize = 4096;
const M: usize = 12288;

/// Weight copies cycled through (the matrix is at most 96 MiB at f16; 4 copies defeat the LLC).
const COPIES: usize = 4;

fn cpu_gemv(c: &mut Criterion) {
    let pool = match CpuPool::new(0) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cpu_gemv: no pool: {e}");
            return;
        }
    };
    let mut group = c.benchmark_group(format!("cpu_gemv_k{K}_m{M}_t{}", pool.threads()));
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    for fmt in [
        Format::Q4_0,
        Format::Q8_0,
        Format::Q4K,
        Format::Q6K,
        Format::Hfq4G256,
        Format::F16,
    ] {
        let Ok(rb) = fmt.row_bytes(K) else { continue };
        let row: Vec<f32> = (0..K)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let Ok(qrow) = hipfire_quant::quantize_row(fmt, &row) else {
            continue;
        };
        let w: Vec<u8> = qrow.iter().copied().cycle().take(COPIES * M * rb).collect();
        let x: Vec<f32> = (0..K)
            .map(|i| ((i * 13 % 29) as f32 / 14.0) - 1.0)
            .collect();
        let mut y = vec![0.0f32; M];
        group.throughput(Throughput::Bytes((M * rb) as u64));
        group.bench_function(fmt.name(), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for i in 0..iters as usize {
                    let copy = &w[(i % COPIES) * M * rb..][..M * rb];
                    let t0 = Instant::now();
                    if let Err(e) = pool.gemv(fmt, copy, K, &x, &mut y, false) {
                        eprintln!("cpu_gemv {fmt}: {e}");
                    }
                    total += t0.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cpu_gemv);
criterion_main!(benches);
