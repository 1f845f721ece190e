//! `gemv_rows_multi` against `gemv_rows` of each activation alone: bit for bit, for every
//! format (multi-activation kernels and fallbacks alike) and every SIMD tier this CPU has, where
//! `multi_matches_single` promises it, and within the scalar reference's bound everywhere.

use hipfire_quant::{
    gemv_rows_multi, gemv_rows_multi_with, gemv_rows_with, multi_matches_single, quantize_row,
    simd_tier, ActivationBuf, Format, QuantError, SimdTier, MULTI_ROW_TILE,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Rows per case: odd counts, one of them larger than any unroll.
const ROW_COUNTS: [usize; 3] = [1, 5, 17];
/// Activations per call: 1..=9 covers every group size of the kernels plus a partial second
/// group of eight.
const MAX_ACTS: usize = 9;
/// A value no dot produces here, written before each call: every output must be overwritten
/// (or, accumulating, start from it on both paths alike).
const POISON: f32 = -1.234_567e30;
/// Fixed seed: every run draws the same data.
const SEED: u64 = 0x5EED_1A7E;

/// k per format: for 32-blocks one full 4-block group plus a tail (160) and a length with
/// several groups and a 3-block tail (576, SmolLM2's width).
fn ks(fmt: Format) -> &'static [usize] {
    match fmt.block_elems() {
        1 => &[7, 100],
        32 => &[32, 160, 576],
        _ => &[256, 512],
    }
}

fn tiers() -> Vec<SimdTier> {
    SimdTier::ALL
        .into_iter()
        .filter(|t| {
            let ok = t.is_supported();
            if !ok {
                println!("SKIPPED tier {t}: not supported by this CPU");
            }
            ok
        })
        .collect()
}

fn random_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * rng.random_range(0.05f32..2.0))
        .collect()
}

#[test]
fn multi_equals_single_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    for tier in tiers() {
        for fmt in Format::ALL {
            for &k in ks(fmt) {
                for &m in &ROW_COUNTS {
                    let mut w = Vec::new();
                    for _ in 0..m {
                        w.extend(quantize_row(fmt, &random_vec(&mut rng, k)).expect("quantise"));
                    }
                    for n in 1..=MAX_ACTS {
                        let acts: Vec<ActivationBuf> = (0..n)
                            .map(|_| ActivationBuf::prepare(fmt, &random_vec(&mut rng, k)))
                            .collect::<Result<_, _>>()
                            .expect("prepare");
                        let refs: Vec<&ActivationBuf> = acts.iter().collect();
                        let base: Vec<Vec<f32>> = (0..n).map(|_| random_vec(&mut rng, m)).collect();
                        for accumulate in [false, true] {
                            let init = |j: usize| {
                                if accumulate {
                                    base[j].clone()
                                } else {
                                    vec![POISON; m]
                                }
                            };
                            let mut want: Vec<Vec<f32>> = (0..n).map(init).collect();
                            for (a, y) in acts.iter().zip(want.iter_mut()) {
                                gemv_rows_with(tier, fmt, &w, k, a, y, accumulate).expect("single");
                            }
                            let mut got: Vec<Vec<f32>> = (0..n).map(init).collect();
                            let mut ys: Vec<&mut [f32]> =
                                got.iter_mut().map(|y| y.as_mut_slice()).collect();
                            gemv_rows_multi_with(tier, fmt, &w, k, &refs, &mut ys, accumulate)
                                .expect("multi");
                            if !multi_matches_single(tier, fmt, n) {
                                // Another f32 order (bounded against the scalar reference
                                // below; across column counts by
                                // `tiled_columns_do_not_depend_on_the_count`): close here.
                                for j in 0..n {
                                    for i in 0..m {
                                        let (g, w) = (got[j][i], want[j][i]);
                                        assert!(
                                            g != POISON && (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                                            "{tier} {fmt:?} k={k} m={m} n={n} acc={accumulate} \
                                             act {j} row {i}: {g} vs {w}"
                                        );
                                    }
                                }
                                continue;
                            }
                            for j in 0..n {
                                for i in 0..m {
                                    assert_eq!(
                                        got[j][i].to_bits(),
                                        want[j][i].to_bits(),
                                        "{tier} {fmt:?} k={k} m={m} n={n} acc={accumulate} \
                                         act {j} row {i}: {} vs {}",
                                        got[j][i],
                                        want[j][i]
                                    );
                                    assert_ne!(got[j][i], POISON);
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
fn multi_on_detected_tier_matches_explicit_tier() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 1);
    let (fmt, k, m) = (Format::Q4_1, 576, 9);
    let mut w = Vec::new();
    for _ in 0..m {
        w.extend(quantize_row(fmt, &random_vec(&mut rng, k)).expect("quantise"));
    }
    let acts: Vec<ActivationBuf> = (0..3)
        .map(|_| ActivationBuf::prepare(fmt, &random_vec(&mut rng, k)).expect("prepare"))
        .collect();
    let refs: Vec<&ActivationBuf> = acts.iter().collect();
    let mut a = vec![vec![POISON; m]; 3];
    let mut b = a.clone();
    let mut ya: Vec<&mut [f32]> = a.iter_mut().map(|y| y.as_mut_slice()).collect();
    gemv_rows_multi(fmt, &w, k, &refs, &mut ya, false).expect("detected");
    let mut yb: Vec<&mut [f32]> = b.iter_mut().map(|y| y.as_mut_slice()).collect();
    gemv_rows_multi_with(simd_tier(), fmt, &w, k, &refs, &mut yb, false).expect("explicit");
    assert_eq!(a, b);
}

#[test]
fn multi_bad_shapes_are_typed_errors() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 2);
    for fmt in [Format::Q4_1, Format::Q8_0, Format::F32] {
        let k = 64;
        let m = 3;
        let mut w = Vec::new();
        for _ in 0..m {
            w.extend(quantize_row(fmt, &random_vec(&mut rng, k)).expect("quantise"));
        }
        let good = ActivationBuf::prepare(fmt, &random_vec(&mut rng, k)).expect("prepare");
        let other = if fmt == Format::Q4_0 {
            Format::Q8_0
        } else {
            Format::Q4_0
        };
        let bad = ActivationBuf::prepare(other, &random_vec(&mut rng, k)).expect("prepare");
        let (mut y0, mut y1) = (vec![0f32; m], vec![0f32; m]);
        // acts and ys of different lengths.
        let r = gemv_rows_multi(fmt, &w, k, &[&good, &good], &mut [&mut y0], false);
        assert!(
            matches!(r, Err(QuantError::ShortBuffer { .. })),
            "{fmt:?} {r:?}"
        );
        // A mismatched activation after a good one.
        let r = gemv_rows_multi(fmt, &w, k, &[&good, &bad], &mut [&mut y0, &mut y1], false);
        assert!(
            matches!(r, Err(QuantError::ActivationMismatch { .. })),
            "{fmt:?} {r:?}"
        );
        // Outputs of different lengths.
        let mut short = vec![0f32; m - 1];
        let r = gemv_rows_multi(
            fmt,
            &w,
            k,
            &[&good, &good],
            &mut [&mut y0, &mut short],
            false,
        );
        assert!(
            matches!(r, Err(QuantError::ShortBuffer { .. })),
            "{fmt:?} {r:?}"
        );
        // Weights shorter than the rows asked for.
        let r = gemv_rows_multi(
            fmt,
            &w[..w.len() - 1],
            k,
            &[&good, &good],
            &mut [&mut y0, &mut y1],
            false,
        );
        assert!(
            matches!(r, Err(QuantError::ShortBuffer { .. })),
            "{fmt:?} {r:?}"
        );
    }
}

/// SIMD multi-activation kernels against the scalar reference (not only against their own
/// single-activation form): the same exact integer block sums, f32 summation order apart, so
/// within `1e-6·Σ|w·x|` (formats.rs's SIMD-vs-scalar bound and reasoning). K-quants with the
/// paired-row kernel (Q4_K) and the one-row kernel (Q5_K); odd row counts so the last row of a
/// pair is alone; 1..=8 activations and 33 (a second pass of the tiled kernel's 32); k up to 4096
/// (the 8B's d_model); 17 and 35 rows for the tiled kernel's 16-row groups and their tail.
#[test]
fn multi_matches_scalar_reference_within_bound() {
    const REL: f64 = 1e-6;
    const ABS_FLOOR: f64 = 1e-6;
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 2);
    for tier in tiers() {
        for fmt in [Format::Q4K, Format::Q5K] {
            for k in [768usize, 4096] {
                for m in [1usize, 3, 9, 17, 35] {
                    let rows: Vec<Vec<f32>> = (0..m).map(|_| random_vec(&mut rng, k)).collect();
                    let mut w = Vec::new();
                    for r in &rows {
                        w.extend(quantize_row(fmt, r).expect("quantise"));
                    }
                    let rb = fmt.row_bytes(k).expect("row bytes");
                    let deq: Vec<Vec<f64>> = w
                        .chunks_exact(rb)
                        .map(|row| {
                            let mut o = vec![0f64; k];
                            hipfire_quant::dequantize_row_f64(fmt, row, &mut o).expect("deq");
                            o
                        })
                        .collect();
                    for n in (1..=8).chain([33]) {
                        let xs: Vec<Vec<f32>> = (0..n).map(|_| random_vec(&mut rng, k)).collect();
                        let acts: Vec<ActivationBuf> = xs
                            .iter()
                            .map(|x| ActivationBuf::prepare(fmt, x))
                            .collect::<Result<_, _>>()
                            .expect("prepare");
                        let refs: Vec<&ActivationBuf> = acts.iter().collect();
                        let mut got = vec![vec![POISON; m]; n];
                        let mut ys: Vec<&mut [f32]> =
                            got.iter_mut().map(|y| y.as_mut_slice()).collect();
                        gemv_rows_multi_with(tier, fmt, &w, k, &refs, &mut ys, false)
                            .expect("multi");
                        for (j, (act, x)) in acts.iter().zip(&xs).enumerate() {
                            let mut want = vec![POISON; m];
                            hipfire_quant::gemv_rows_scalar(fmt, &w, k, act, &mut want, false)
                                .expect("scalar");
                            for i in 0..m {
                                let mag: f64 = deq[i]
                                    .iter()
                                    .zip(x)
                                    .map(|(a, &b)| (a * f64::from(b)).abs())
                                    .sum();
                                let (g, s) = (got[j][i], want[i]);
                                assert!(g.is_finite() && g != POISON, "{tier} {fmt} unwritten");
                                let gap = (f64::from(g) - f64::from(s)).abs();
                                assert!(
                                    gap <= REL * mag + ABS_FLOOR,
                                    "{tier} {fmt:?} k={k} m={m} n={n} act {j} row {i}: \
                                     {g} vs scalar {s} (gap {gap}, Σ|w·x| {mag})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Where `gemv_rows_multi` is not bit-identical to each activation alone (the tiled AVX-512 VNNI
/// Q4_K kernel), each output still does not depend on how many other activations share the call:
/// activation j's outputs are the same bits with the fewest that take the tiled kernel, 9 and 33
/// activations, accumulating or not, over whole 16-row groups and a tail.
#[test]
fn tiled_columns_do_not_depend_on_the_count() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 3);
    let (fmt, k) = (Format::Q4K, 512);
    for tier in tiers() {
        let Some(few) = (1..=33).find(|&n| !multi_matches_single(tier, fmt, n)) else {
            continue;
        };
        let m = 2 * MULTI_ROW_TILE + 5;
        let mut w = Vec::new();
        for _ in 0..m {
            w.extend(quantize_row(fmt, &random_vec(&mut rng, k)).expect("quantise"));
        }
        let acts: Vec<ActivationBuf> = (0..33)
            .map(|_| ActivationBuf::prepare(fmt, &random_vec(&mut rng, k)).expect("prepare"))
            .collect();
        let base: Vec<Vec<f32>> = (0..33).map(|_| random_vec(&mut rng, m)).collect();
        for accumulate in [false, true] {
            let run = |n: usize| {
                let refs: Vec<&ActivationBuf> = acts[..n].iter().collect();
                let mut got: Vec<Vec<f32>> = (0..n)
                    .map(|j| {
                        if accumulate {
                            base[j].clone()
                        } else {
                            vec![POISON; m]
                        }
                    })
                    .collect();
                let mut ys: Vec<&mut [f32]> = got.iter_mut().map(|y| y.as_mut_slice()).collect();
                gemv_rows_multi_with(tier, fmt, &w, k, &refs, &mut ys, accumulate).expect("multi");
                got
            };
            let (least, nine, all) = (run(few), run(9), run(33));
            for j in 0..few {
                for i in 0..m {
                    let b = least[j][i].to_bits();
                    assert_ne!(least[j][i], POISON, "{tier} act {j} row {i} unwritten");
                    assert_eq!(
                        b,
                        nine[j][i].to_bits(),
                        "{tier} act {j} row {i}: {few} vs 9"
                    );
                    assert_eq!(
                        b,
                        all[j][i].to_bits(),
                        "{tier} act {j} row {i}: {few} vs 33"
                    );
                }
            }
        }
    }
}

/// Batched-decode column counts (every group edge of the drivers: 8, 16, 32) over row counts
/// that span several of `gemv_rows_multi`'s row tiles plus a partial one (odd, so the paired and
/// 16-row kernels have a tail too): every format and tier, poisoned outputs, each column against
/// `gemv_rows` of that activation alone (bit for bit where `multi_matches_single` says so, else
/// within the scalar reference's `1e-6·Σ|w·x|`), and against the f64 reference (dequantised
/// weights, unquantised x) within the activation quantisation's bound `Σ|w_i|·amax(group)/254`
/// (crate docs) times [`F64_SLACK`].
#[test]
fn batched_columns_over_row_tiles() {
    /// The crate's bound is exact for the integer part; the slack covers the f32 scale products
    /// and sums (relative ~1e-6 of Σ|w·x|, far below the quantisation term).
    const F64_SLACK: f64 = 1.01;
    const COLS: [usize; 10] = [1, 2, 3, 7, 8, 9, 16, 17, 33, 64];
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 4);
    for fmt in Format::ALL {
        let k = match fmt.block_elems() {
            1 => 96,
            32 => 384,
            _ => 512,
        };
        let rb = fmt.row_bytes(k).expect("row bytes");
        // Rows of at least two 16 KiB tiles and a partial third, odd.
        let m = (2 * 16 * 1024 / rb + MULTI_ROW_TILE + 3) | 1;
        let mut w = Vec::new();
        for _ in 0..m {
            w.extend(quantize_row(fmt, &random_vec(&mut rng, k)).expect("quantise"));
        }
        let deq: Vec<Vec<f64>> = w
            .chunks_exact(rb)
            .map(|row| {
                let mut o = vec![0f64; k];
                hipfire_quant::dequantize_row_f64(fmt, row, &mut o).expect("deq");
                o
            })
            .collect();
        let nmax = COLS[COLS.len() - 1];
        let xs: Vec<Vec<f32>> = (0..nmax).map(|_| random_vec(&mut rng, k)).collect();
        let acts: Vec<ActivationBuf> = xs
            .iter()
            .map(|x| ActivationBuf::prepare(fmt, x))
            .collect::<Result<_, _>>()
            .expect("prepare");
        // A span holding each of the activation's quantisation groups (crate docs): the block
        // for the 32-blocks and the K-quants (q8_K: 256); HFQ4G256 quantises after permuting per
        // 128, so its groups of 32 lie inside a 128-element span.
        let group = match fmt {
            Format::Hfq4G256 => 128,
            _ if fmt.block_elems() == 1 => 0,
            _ => fmt.block_elems(),
        };
        for tier in tiers() {
            let single: Vec<Vec<f32>> = acts
                .iter()
                .map(|a| {
                    let mut y = vec![POISON; m];
                    gemv_rows_with(tier, fmt, &w, k, a, &mut y, false).expect("single");
                    y
                })
                .collect();
            for n in COLS {
                let refs: Vec<&ActivationBuf> = acts[..n].iter().collect();
                let mut got = vec![vec![POISON; m]; n];
                let mut ys: Vec<&mut [f32]> = got.iter_mut().map(|y| y.as_mut_slice()).collect();
                gemv_rows_multi_with(tier, fmt, &w, k, &refs, &mut ys, false).expect("multi");
                let exact = multi_matches_single(tier, fmt, n);
                for j in 0..n {
                    let x = &xs[j];
                    for i in 0..m {
                        let g = got[j][i];
                        assert!(g.is_finite() && g != POISON, "{tier} {fmt} n={n} unwritten");
                        let s = single[j][i];
                        let mag: f64 = deq[i]
                            .iter()
                            .zip(x)
                            .map(|(a, &b)| (a * f64::from(b)).abs())
                            .sum();
                        if exact {
                            assert_eq!(
                                g.to_bits(),
                                s.to_bits(),
                                "{tier} {fmt} n={n} act {j} row {i}: {g} vs single {s}"
                            );
                        } else {
                            let gap = (f64::from(g) - f64::from(s)).abs();
                            assert!(
                                gap <= 1e-6 * mag + 1e-6,
                                "{tier} {fmt} n={n} act {j} row {i}: {g} vs single {s}"
                            );
                        }
                        let exact_dot: f64 =
                            deq[i].iter().zip(x).map(|(a, &b)| a * f64::from(b)).sum();
                        let bound = if group == 0 {
                            1e-5 * mag + 1e-6
                        } else {
                            let q: f64 = deq[i]
                                .chunks(group)
                                .zip(x.chunks(group))
                                .map(|(wg, xg)| {
                                    let amax =
                                        xg.iter().fold(0f64, |a, &v| a.max(f64::from(v).abs()));
                                    wg.iter().map(|v| v.abs()).sum::<f64>() * amax / 254.0
                                })
                                .sum();
                            F64_SLACK * q + 1e-5 * mag + 1e-6
                        };
                        let err = (f64::from(g) - exact_dot).abs();
                        assert!(
                            err <= bound,
                            "{tier} {fmt} n={n} act {j} row {i}: {g} vs f64 {exact_dot} \
                             (err {err}, bound {bound})"
                        );
                    }
                }
            }
        }
    }
}
