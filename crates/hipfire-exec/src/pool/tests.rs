//! The pool's tests: bit-exactness against one thread and an f64 reference, the row cut,
//! panics and shutdown.

use super::*;
use crate::kernel::{gemv_rows, ActivationBuf};
use hipfire_quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn gemv_batch_is_bit_identical_to_separate_gemvs() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xBA7C);
    let pool = CpuPool::new(3).expect("pool");
    for fmt in [Format::Q4K, Format::Q4_1, Format::Q8_0, Format::F32] {
        let k = 512;
        let rb = fmt.row_bytes(k).expect("rb");
        // Odd heights so worker cuts fall inside segments and across their boundaries.
        let ms = [37usize, 5, 90];
        let ws: Vec<Vec<u8>> = ms
            .iter()
            .map(|&m| {
                let mut w = Vec::with_capacity(m * rb);
                for _ in 0..m {
                    let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                    w.extend(hipfire_quant::quantize_row(fmt, &row).expect("quantise"));
                }
                w
            })
            .collect();
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let base: Vec<Vec<f32>> = ms
            .iter()
            .map(|&m| (0..m).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect();
        for accumulate in [false, true] {
            let mut want = Vec::new();
            for (w, b) in ws.iter().zip(&base) {
                let mut y = if accumulate {
                    b.clone()
                } else {
                    vec![f32::NAN; b.len()]
                };
                pool.gemv(fmt, w, k, &x, &mut y, accumulate).expect("gemv");
                want.push(y);
            }
            let mut got: Vec<Vec<f32>> = base
                .iter()
                .map(|b| {
                    if accumulate {
                        b.clone()
                    } else {
                        vec![f32::NAN; b.len()]
                    }
                })
                .collect();
            let mut segs: Vec<GemvSegment<'_>> = ws
                .iter()
                .zip(got.iter_mut())
                .map(|(w, y)| GemvSegment { w, y, accumulate })
                .collect();
            pool.gemv_batch(fmt, k, &x, &mut segs).expect("batch");
            for (g, w) in got.iter().zip(&want) {
                assert!(g.iter().all(|v| v.is_finite()), "{fmt}: unwritten rows");
                assert_eq!(
                    g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{fmt} accumulate={accumulate}"
                );
            }
        }
    }
    // A segment whose bytes do not match its rows is refused.
    let mut y = vec![0.0f32; 4];
    let mut segs = [GemvSegment {
        w: &[0u8; 3],
        y: &mut y,
        accumulate: false,
    }];
    assert!(pool
        .gemv_batch(Format::F32, 4, &[1.0; 4], &mut segs)
        .is_err());
}

#[test]
fn gemv_tokens_is_bit_identical_to_per_token_gemv() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x70C5);
    for pool in [
        CpuPool::new(3).expect("pool"),
        caller_pool(2),
        caller_pool(1),
    ] {
        for fmt in [Format::Q4K, Format::Q4_1, Format::Q8_0, Format::F32] {
            let k = 512;
            // Odd heights: worker cuts and tiles fall inside segments and across them.
            let ms = [37usize, 5, 301];
            let ws: Vec<Vec<u8>> = ms
                .iter()
                .map(|&m| random_weight(fmt, k, m, &mut rng))
                .collect();
            for tokens in [1usize, 3, 7, 33] {
                let xs: Vec<f32> = (0..tokens * k)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect();
                for accumulate in [false, true] {
                    let base = starting_outputs(&ms, tokens, accumulate, &mut rng);
                    let mut want = base.clone();
                    for ((w, y), &m) in ws.iter().zip(want.iter_mut()).zip(&ms) {
                        for (x, yt) in xs.chunks_exact(k).zip(y.chunks_exact_mut(m)) {
                            pool.gemv(fmt, w, k, x, yt, accumulate).expect("gemv");
                        }
                    }
                    let mut got = base.clone();
                    let mut segs: Vec<GemvSegment<'_>> = ws
                        .iter()
                        .zip(got.iter_mut())
                        .map(|(w, y)| GemvSegment { w, y, accumulate })
                        .collect();
                    pool.gemv_tokens(fmt, k, &xs, &mut segs).expect("tokens");
                    let exact = hipfire_quant::multi_matches_single(
                        hipfire_quant::simd_tier(),
                        fmt,
                        tokens,
                    );
                    // Where the tokens go to AMX the outputs are bf16 GEMM results, bounded
                    // against f64 by `gemv_tokens_on_amx_is_within_bound_of_f64`.
                    let amx = hipfire_quant::amx_rows_used(fmt, tokens);
                    for (g, w) in got.iter().zip(&want) {
                        assert!(g.iter().all(|v| v.is_finite()), "{fmt}: unwritten rows");
                        if amx {
                            continue;
                        }
                        if exact {
                            assert_eq!(
                                bits(g),
                                bits(w),
                                "{fmt} tokens={tokens} accumulate={accumulate}"
                            );
                        } else {
                            // The tiled Q4_K kernel sums in another order (hipfire-quant's
                            // multi tests bound it against the scalar reference).
                            for (a, b) in g.iter().zip(w) {
                                let tol = 1e-5 * (1.0 + b.abs());
                                assert!((a - b).abs() <= tol, "{fmt} tokens={tokens}: {a} vs {b}");
                            }
                        }
                    }
                }
            }
        }
    }
    // Shapes are checked: ragged xs, wrong output length, zero k.
    let pool = CpuPool::new(2).expect("pool");
    let w = vec![0u8; 4 * 4 * 3];
    let mut y = vec![0.0f32; 3 * 2];
    let mut segs = [GemvSegment {
        w: &w,
        y: &mut y,
        accumulate: false,
    }];
    assert!(matches!(
        pool.gemv_tokens(Format::F32, 4, &[1.0; 7], &mut segs),
        Err(ExecError::Shape { .. })
    ));
    assert!(matches!(
        pool.gemv_tokens(Format::F32, 4, &[1.0; 12], &mut segs),
        Err(ExecError::Shape { .. })
    ));
    assert!(matches!(
        pool.gemv_tokens(Format::F32, 0, &[], &mut segs),
        Err(ExecError::Shape { .. })
    ));
    pool.gemv_tokens(Format::F32, 4, &[1.0; 8], &mut segs)
        .expect("2 tokens × 3 rows");
}

/// The AMX route of `gemv_tokens` (the emulated engine everywhere, the tile unit where the CPU
/// has one): worker cuts, segments and tails, overwrite into NaN and accumulate, every output
/// within `amx_error_bound(k)·Σ|w·x|` of the f64 dot of the dequantised row with the token.
#[test]
fn gemv_tokens_on_amx_is_within_bound_of_f64() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xA3E7);
    let mut engines = vec![hipfire_quant::AmxEngine::Emulated];
    if hipfire_quant::amx_available() {
        engines.push(hipfire_quant::AmxEngine::Hardware);
    } else {
        println!("AMX hardware engine skipped: no AMX; the emulated engine runs");
    }
    let k = 512;
    for engine in engines {
        for pool in [
            CpuPool::new(3).expect("pool"),
            caller_pool(2),
            caller_pool(1),
        ] {
            for fmt in [Format::Q4K, Format::Q6K, Format::Q8_0, Format::F32] {
                let rb = fmt.row_bytes(k).expect("rb");
                let ms = [37usize, 5, 101];
                let ws: Vec<Vec<u8>> = ms
                    .iter()
                    .map(|&m| random_weight(fmt, k, m, &mut rng))
                    .collect();
                let wf: Vec<Vec<Vec<f64>>> = ws
                    .iter()
                    .map(|w| {
                        w.chunks_exact(rb)
                            .map(|row| {
                                let mut o = vec![0.0; k];
                                hipfire_quant::dequantize_row_f64(fmt, row, &mut o)
                                    .expect("dequant");
                                o
                            })
                            .collect()
                    })
                    .collect();
                for tokens in [16usize, 33] {
                    let xs: Vec<f32> = (0..tokens * k)
                        .map(|_| rng.random_range(-1.0f32..1.0))
                        .collect();
                    for accumulate in [false, true] {
                        let base = starting_outputs(&ms, tokens, accumulate, &mut rng);
                        let mut got = base.clone();
                        let mut segs: Vec<GemvSegment<'_>> = ws
                            .iter()
                            .zip(got.iter_mut())
                            .map(|(w, y)| GemvSegment { w, y, accumulate })
                            .collect();
                        pool.gemv_tokens_on(fmt, k, &xs, &mut segs, Some(engine))
                            .expect("tokens");
                        for (si, &m) in ms.iter().enumerate() {
                            for t in 0..tokens {
                                let x = &xs[t * k..(t + 1) * k];
                                for (i, row) in wf[si].iter().enumerate() {
                                    let dot: f64 =
                                        row.iter().zip(x).map(|(a, &b)| a * f64::from(b)).sum();
                                    let mag: f64 = row
                                        .iter()
                                        .zip(x)
                                        .map(|(a, &b)| (a * f64::from(b)).abs())
                                        .sum();
                                    let b0 = if accumulate {
                                        f64::from(base[si][t * m + i])
                                    } else {
                                        0.0
                                    };
                                    let want = dot + b0;
                                    let g = f64::from(got[si][t * m + i]);
                                    let tol =
                                        hipfire_quant::amx_error_bound(k) * mag + 1e-6 * want.abs();
                                    assert!(
                                        (g - want).abs() <= tol,
                                        "{engine:?} {fmt} tokens={tokens} seg {si} t {t} row {i}: \
                                         {g} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gemv_tokens_refuses_a_non_finite_token_and_the_pool_goes_on() {
    // The workers prepare the tokens together: one bad token fails the call whichever worker
    // takes it, and nobody waits for it forever.
    let mut rng = ChaCha8Rng::seed_from_u64(0xBAD7);
    let (fmt, k, m) = (Format::Q4K, 512, 96);
    let w = random_weight(fmt, k, m, &mut rng);
    for pool in [CpuPool::new(4).expect("pool"), caller_pool(2)] {
        for bad in [0usize, 5, 8] {
            let mut xs: Vec<f32> = (0..9 * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            xs[bad * k + 17] = f32::NAN;
            let mut y = vec![0.0f32; 9 * m];
            let mut segs = [GemvSegment {
                w: &w,
                y: &mut y,
                accumulate: false,
            }];
            assert!(
                pool.gemv_tokens(fmt, k, &xs, &mut segs).is_err(),
                "token {bad} of 9 is NaN"
            );
            xs[bad * k + 17] = 0.5;
            let mut y = vec![f32::NAN; 9 * m];
            let mut segs = [GemvSegment {
                w: &w,
                y: &mut y,
                accumulate: false,
            }];
            pool.gemv_tokens(fmt, k, &xs, &mut segs)
                .expect("the same call with the value fixed");
            assert!(y.iter().all(|v| v.is_finite()), "unwritten rows");
        }
    }
}

/// Formats the pool is checked on: all of them (each has a CPU row dot).
fn test_formats() -> Vec<Format> {
    Format::ALL.to_vec()
}

/// Each segment's output before a `gemv_tokens` call (`tokens × m` values for each `m` of
/// `ms`): random values to accumulate onto, or NaN where the call must write every value.
fn starting_outputs(
    ms: &[usize],
    tokens: usize,
    accumulate: bool,
    rng: &mut ChaCha8Rng,
) -> Vec<Vec<f32>> {
    ms.iter()
        .map(|&m| {
            (0..tokens * m)
                .map(|_| {
                    if accumulate {
                        rng.random_range(-1.0f32..1.0)
                    } else {
                        f32::NAN
                    }
                })
                .collect()
        })
        .collect()
}

/// Seeded random weight of `m` rows in `fmt` (random f32 rows quantised, or raw f32 bytes).
fn random_weight(fmt: Format, k: usize, m: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let rb = fmt.row_bytes(k).expect("k fits");
    let mut w = Vec::with_capacity(m * rb);
    for _ in 0..m {
        let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        w.extend(crate::kernel::test_support::encode_row(fmt, &row));
    }
    w
}

#[test]
fn pool_matches_single_thread_bit_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0001);
    let k = 256;
    let formats = test_formats();
    assert!(!formats.is_empty());
    for fmt in formats {
        for m in [1usize, 17, 4097] {
            let w = random_weight(fmt, k, m, &mut rng);
            let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let act = ActivationBuf::prepare(fmt, &x).expect("prepare");
            let mut want = vec![f32::NAN; m];
            gemv_rows(fmt, &w, k, &act, &mut want, false).expect("reference");
            let base: Vec<f32> = (0..m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let mut want_acc = base.clone();
            gemv_rows(fmt, &w, k, &act, &mut want_acc, true).expect("reference acc");
            for threads in 1..=4 {
                let pool = CpuPool::with_config(PoolConfig {
                    threads,
                    ..PoolConfig::default()
                })
                .expect("pool");
                // Poison: a row the pool never writes stays NaN and fails the comparison.
                let mut y = vec![f32::NAN; m];
                pool.gemv(fmt, &w, k, &x, &mut y, false).expect("gemv");
                assert_eq!(bits(&y), bits(&want), "{fmt} m={m} threads={threads}");
                let mut y = base.clone();
                pool.gemv(fmt, &w, k, &x, &mut y, true).expect("gemv acc");
                assert_eq!(
                    bits(&y),
                    bits(&want_acc),
                    "{fmt} m={m} threads={threads} residual"
                );
                // Passback CPU arm: rows [g, m) into a slice, rows below g untouched.
                let g = m / 3 / 16 * 16;
                let mut out = vec![f32::NAN; m];
                out[..g].fill(7.0);
                pool.gemv_prepared(fmt, &w, k, &act, g, &mut out[g..], false)
                    .expect("arm");
                assert!(out[..g].iter().all(|v| *v == 7.0));
                assert_eq!(
                    bits(&out[g..]),
                    bits(&want[g..]),
                    "{fmt} m={m} threads={threads} arm g={g}"
                );
            }
        }
    }
}

#[test]
fn pool_matches_f64_reference() {
    // Independent check of the whole path on f32 weights (exactly representable).
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0002);
    let (k, m) = (64usize, 33usize);
    let wf: Vec<f32> = (0..k * m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let w: Vec<u8> = wf.iter().flat_map(|v| v.to_le_bytes()).collect();
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let pool = CpuPool::new(3).expect("pool");
    let mut y = vec![f32::NAN; m];
    pool.gemv(Format::F32, &w, k, &x, &mut y, false)
        .expect("gemv");
    for (r, yv) in y.iter().enumerate() {
        let want: f64 = (0..k)
            .map(|c| f64::from(wf[r * k + c]) * f64::from(x[c]))
            .sum();
        // f32 accumulation of 64 products of magnitude <= 1: error well under 64 * 2^-24 * 64.
        assert!(
            (f64::from(*yv) - want).abs() < 1e-4,
            "row {r}: {yv} vs {want}"
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn padded_rows_match_packed() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0003);
    let (fmt, k, m, pad) = (Format::Q4_0, 256usize, 37usize, 48usize);
    let rb = fmt.row_bytes(k).expect("k");
    let packed = random_weight(fmt, k, m, &mut rng);
    let mut padded = vec![0xAAu8; m * (rb + pad)];
    for r in 0..m {
        padded[r * (rb + pad)..r * (rb + pad) + rb].copy_from_slice(&packed[r * rb..(r + 1) * rb]);
    }
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let act = ActivationBuf::prepare(fmt, &x).expect("prepare");
    let pool = CpuPool::new(3).expect("pool");
    let mut want = vec![f32::NAN; m];
    pool.gemv(fmt, &packed, k, &x, &mut want, false)
        .expect("packed");
    let mut got = vec![f32::NAN; m];
    pool.gemv_strided(fmt, &padded, k, rb + pad, &act, 0, &mut got, false)
        .expect("padded");
    assert_eq!(bits(&got), bits(&want));
    assert!(pool
        .gemv_strided(fmt, &padded, k, rb - 1, &act, 0, &mut got, false)
        .is_err());
}

#[test]
fn shape_errors_are_typed() {
    let pool = CpuPool::new(2).expect("pool");
    let k = 32;
    let w = vec![0u8; 4 * k * 3];
    let mut y = vec![0.0f32; 4];
    assert!(matches!(
        pool.gemv(Format::F32, &w, k, &[1.0; 31], &mut y, false),
        Err(ExecError::Shape { what: "x", .. })
    ));
    assert!(matches!(
        pool.gemv(Format::F32, &w, k, &[1.0; 32], &mut y, false),
        Err(ExecError::Shape { .. })
    ));
    assert!(matches!(
        pool.gemv(Format::Q8_0, &w, 33, &[1.0; 33], &mut y, false),
        Err(ExecError::Quant(_))
    ));
    let act = ActivationBuf::prepare(Format::F32, &[1.0; 32]).expect("prepare");
    assert!(matches!(
        pool.gemv_prepared(Format::F32, &w, k, &act, 2, &mut y, false),
        Err(ExecError::Shape { .. })
    ));
    // Empty output is a no-op, not an error.
    pool.gemv(Format::F32, &[], k, &[1.0; 32], &mut [], false)
        .expect("empty");
}

/// Test-only fault: panics in the worker that gets row `panic_row`.
struct PanicJob {
    panic_row: usize,
    ran: AtomicUsize,
}

impl PoolJob for PanicJob {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        self.ran.fetch_add(1, Ordering::SeqCst);
        if rows.contains(&self.panic_row) {
            panic!("injected fault at rows {rows:?}");
        }
        Ok(rows.start as u64)
    }
}

fn caller_pool(threads: usize) -> CpuPool {
    CpuPool::with_config(PoolConfig {
        threads,
        caller_computes: true,
        ..PoolConfig::default()
    })
    .expect("pool")
}

#[test]
fn computing_caller_gives_the_same_bits_with_one_worker_fewer() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xCA11);
    let reference = CpuPool::new(2).expect("pool");
    for threads in [1usize, 2, 3] {
        let pool = caller_pool(threads);
        assert_eq!(pool.threads(), threads - 1);
        assert_eq!(pool.compute_threads(), threads);
        for fmt in [Format::Q4K, Format::Q8_0, Format::Q4_1] {
            let (k, m) = (256usize, 77usize);
            let mut w = Vec::new();
            for _ in 0..m {
                let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                w.extend(hipfire_quant::quantize_row(fmt, &row).expect("quantise"));
            }
            let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let mut want = vec![f32::NAN; m];
            reference
                .gemv(fmt, &w, k, &x, &mut want, false)
                .expect("gemv");
            let mut got = vec![f32::NAN; m];
            pool.gemv(fmt, &w, k, &x, &mut got, false).expect("gemv");
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{fmt} threads={threads}"
            );
        }
    }
}

#[test]
fn a_panic_in_the_callers_part_is_an_error_after_the_workers_finish() {
    let pool = caller_pool(3);
    let job = PanicJob {
        panic_row: 0,
        ran: AtomicUsize::new(0),
    };
    let err = pool.run_job(&job, 0..64).expect_err("panic must surface");
    assert!(
        matches!(&err, ExecError::WorkerPanicked { worker, .. } if *worker == usize::MAX),
        "{err}"
    );
    assert_eq!(
        job.ran.load(Ordering::SeqCst),
        3,
        "caller and both workers ran"
    );
    let ok = PanicJob {
        panic_row: usize::MAX,
        ran: AtomicUsize::new(0),
    };
    pool.run_job(&ok, 0..64).expect("pool still works");
}

#[test]
fn worker_panic_is_an_error_and_pool_survives() {
    let pool = CpuPool::new(4).expect("pool");
    let job = PanicJob {
        panic_row: 40,
        ran: AtomicUsize::new(0),
    };
    let err = pool.run_job(&job, 0..64).expect_err("panic must surface");
    match err {
        ExecError::WorkerPanicked { worker, message } => {
            assert_eq!(worker, 2);
            assert!(message.contains("injected fault"), "{message}");
        }
        other => panic!("wrong error {other}"),
    }
    // Every worker that got rows ran (the call waited for all of them).
    assert_eq!(job.ran.load(Ordering::SeqCst), 4);
    // The pool still works afterwards.
    let ok = PanicJob {
        panic_row: usize::MAX,
        ran: AtomicUsize::new(0),
    };
    assert_eq!(pool.run_job(&ok, 0..64).expect("ok"), 16 ^ 32 ^ 48);
}

#[test]
fn drop_joins_workers() {
    let pool = CpuPool::new(3).expect("pool");
    let clone = pool.clone();
    let live = pool.live_counter();
    assert_eq!(live.load(Ordering::SeqCst), 3);
    drop(pool);
    // A clone keeps the pool running.
    let ok = PanicJob {
        panic_row: usize::MAX,
        ran: AtomicUsize::new(0),
    };
    clone.run_job(&ok, 0..48).expect("clone still runs");
    drop(clone);
    // Drop of the last handle returned only after every thread exited its loop.
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn concurrent_callers_on_clones() {
    let pool = CpuPool::new(2).expect("pool");
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let p = pool.clone();
            s.spawn(move || {
                for _ in 0..50 {
                    let job = PanicJob {
                        panic_row: usize::MAX,
                        ran: AtomicUsize::new(0),
                    };
                    assert_eq!(p.run_job(&job, 0..32).expect("run"), 16, "caller {t}");
                }
            });
        }
    });
}

#[test]
fn default_pool_uses_physical_cores() {
    let pool = CpuPool::new(0).expect("pool");
    assert_eq!(pool.threads(), topology::default_threads());
    assert_eq!(pool.cores().len(), pool.threads());
}

#[test]
fn partition_covers_and_aligns() {
    for (start, end) in [
        (0usize, 1usize),
        (0, 17),
        (0, 4097),
        (16, 33),
        (5, 4096),
        (3, 7),
        (100, 12288),
    ] {
        for parts in 1..=9 {
            let p = partition(start..end, parts, 16);
            assert!(!p.is_empty() && p.len() <= parts);
            assert_eq!(p[0].start, start);
            assert_eq!(p.last().map(|r| r.end), Some(end));
            for w in p.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert_eq!(w[0].end % 16, 0, "cut {} not aligned", w[0].end);
            }
            assert!(p.iter().all(|r| !r.is_empty()));
        }
    }
    // Even spread: 4096 rows over 4 parts = 1024 each.
    assert_eq!(
        partition(0..4096, 4, 16),
        vec![0..1024, 1024..2048, 2048..3072, 3072..4096]
    );
    assert!(partition(5..5, 3, 16).is_empty());
}

#[test]
fn token_tiles_are_whole_row_groups_of_about_the_tile_bytes() {
    let group = hipfire_quant::MULTI_ROW_TILE;
    // Q4_K rows at k = 4096 and 14336, a tiny row, a row larger than the tile.
    for row_bytes in [2304usize, 8064, 18, 1 << 20] {
        let rows = jobs::token_tile_rows(row_bytes);
        assert!(
            rows >= group && rows % group == 0,
            "{row_bytes} B rows: {rows}"
        );
        // Never more than one group beyond the tile's bytes.
        let bytes = rows * row_bytes;
        assert!(
            bytes < jobs::TOKEN_TILE_BYTES + group * row_bytes,
            "{row_bytes} B rows: {rows} rows, {bytes} B"
        );
    }
}

/// Counts every row a claimed run visits, and fails on one chosen row.
struct VisitJob {
    visits: Vec<AtomicUsize>,
    /// Largest chunk seen, and every chunk's first row.
    widest: AtomicUsize,
    starts: std::sync::Mutex<Vec<usize>>,
    fail_row: Option<usize>,
}

impl PoolJob for VisitJob {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        self.widest.fetch_max(rows.len(), Ordering::SeqCst);
        self.starts.lock().expect("starts").push(rows.start);
        if self.fail_row.is_some_and(|r| rows.contains(&r)) {
            return Err(ExecError::Invalid {
                what: "row",
                value: format!("{rows:?}"),
                rule: "injected failure",
            });
        }
        for r in rows.clone() {
            self.visits[r].fetch_add(1, Ordering::SeqCst);
        }
        Ok(rows.start as u64 * 2654435761)
    }
}

#[test]
fn claimed_rows_visit_every_row_exactly_once() {
    for (threads, caller) in [(1, true), (3, false), (4, true)] {
        let pool = CpuPool::with_config(PoolConfig {
            threads,
            caller_computes: caller,
            ..PoolConfig::default()
        })
        .expect("pool");
        let cases = [
            (0..1000, 32, 32),
            (7..1000, 32, 128),
            (5..6, 64, 64),
            (0..97, 1, usize::MAX),
            (3..50, 100, 100),
            (0..4096, 16, 256),
        ];
        for (rows, unit, max) in cases {
            let job = VisitJob {
                visits: (0..rows.end).map(|_| AtomicUsize::new(0)).collect(),
                widest: AtomicUsize::new(0),
                starts: Default::default(),
                fail_row: None,
            };
            let got = pool
                .run_job_claimed(&job, rows.clone(), unit, max)
                .expect("claimed run");
            for (r, v) in job.visits.iter().enumerate() {
                let want = usize::from(rows.contains(&r));
                assert_eq!(v.load(Ordering::SeqCst), want, "row {r} of {rows:?}");
            }
            let starts = job.starts.lock().expect("starts").clone();
            let want = starts
                .iter()
                .fold(0u64, |acc, &a| acc ^ (a as u64 * 2654435761));
            assert_eq!(got, want, "XOR of the chunks' values, {rows:?}");
            assert!(
                starts.iter().all(|&a| (a - rows.start) % unit == 0),
                "a chunk off the unit grid: {starts:?}"
            );
            assert!(job.widest.load(Ordering::SeqCst) <= max.max(unit));
        }
    }
}

#[test]
fn a_failed_claim_fails_the_call_and_the_pool_goes_on() {
    let pool = CpuPool::new(3).expect("pool");
    let job = VisitJob {
        visits: (0..4096).map(|_| AtomicUsize::new(0)).collect(),
        widest: AtomicUsize::new(0),
        starts: Default::default(),
        fail_row: Some(2000),
    };
    let err = pool
        .run_job_claimed(&job, 0..4096, 16, 64)
        .expect_err("injected");
    assert!(err.to_string().contains("injected failure"), "{err}");
    let again = VisitJob {
        visits: (0..64).map(|_| AtomicUsize::new(0)).collect(),
        widest: AtomicUsize::new(0),
        starts: Default::default(),
        fail_row: None,
    };
    pool.run_job_claimed(&again, 0..64, 16, 16)
        .expect("the pool still runs");
    assert!(again.visits.iter().all(|v| v.load(Ordering::SeqCst) == 1));
}
