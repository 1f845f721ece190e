//! Single-threaded row-dot throughput in weight bytes per second, per format, over a ~64 MiB
//! weight set (larger than common L3 slices, so the figure is memory-fed, not cache-fed).
//!
//! `cargo bench -p hipfire-quant --bench row_dot` — every format on the detected tier, plus
//! every other supported tier for the three target formats (Q4_0, Q8_0, Q4_K).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hipfire_quant::{gemv_rows_with, quantize_row, simd_tier, ActivationBuf, Format, SimdTier};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// Row length: a typical hidden size.
const K: usize = 4096;
/// Weight-set size: 64 MiB, twice this machine's 32 MiB L3.
const WEIGHT_BYTES: usize = 64 << 20;
/// Distinct quantised rows, tiled to fill the set (quantising 64 MiB of K-quants is slow).
const DISTINCT_ROWS: usize = 16;

fn weights(fmt: Format, rng: &mut ChaCha8Rng) -> (Vec<u8>, usize) {
    let rb = fmt
        .row_bytes(K)
        .expect("K is a block multiple of every format");
    let rows: Vec<Vec<u8>> = (0..DISTINCT_ROWS)
        .map(|_| {
            let src: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            quantize_row(fmt, &src).expect("finite input")
        })
        .collect();
    let m = WEIGHT_BYTES / rb;
    let mut w = Vec::with_capacity(m * rb);
    for i in 0..m {
        w.extend_from_slice(&rows[i % DISTINCT_ROWS]);
    }
    (w, m)
}

fn row_dot(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let x: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let best = simd_tier();
    let mut group = c.benchmark_group("row_dot");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for fmt in Format::ALL {
        let (w, m) = weights(fmt, &mut rng);
        let act = ActivationBuf::prepare(fmt, &x).expect("finite x");
        let mut y = vec![0f32; m];
        group.throughput(Throughput::Bytes(w.len() as u64));
        let mut tiers = vec![best];
        if matches!(fmt, Format::Q4_0 | Format::Q8_0 | Format::Q4K) {
            tiers = SimdTier::ALL
                .into_iter()
                .filter(|t| t.is_supported())
                .collect();
        }
        for tier in tiers {
            group.bench_function(BenchmarkId::new(fmt.name(), tier.name()), |b| {
                b.iter(|| {
                    gemv_rows_with(tier, fmt, &w, K, &act, &mut y, false).expect("valid shapes")
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, row_dot);
criterion_main!(benches);
