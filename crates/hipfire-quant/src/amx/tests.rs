//! The AMX GEMM against an f64 reference, on the emulated engine everywhere and on the tile
//! unit where the CPU has one (the same packed buffers, tails and scatter either way).

use super::dequant::{fast_available, fill_panel_for_test};
use super::*;
use crate::{dequantize_row, dequantize_row_f64, quantize_row};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_rows(fmt: Format, k: usize, m: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut w = Vec::new();
    for _ in 0..m {
        // Uneven magnitudes across the row, so the scales differ per block.
        let x: Vec<f32> = (0..k)
            .map(|i| rng.random_range(-1.0f32..1.0) * (1.0 + (i % 97) as f32 / 13.0))
            .collect();
        w.extend(quantize_row(fmt, &x).expect("quantise"));
    }
    w
}

fn engines() -> Vec<AmxEngine> {
    if amx_available() {
        vec![AmxEngine::Emulated, AmxEngine::Hardware]
    } else {
        println!(
            "AMX hardware engine skipped: no AMX ({}); the emulated engine runs",
            amx_status().err().unwrap_or("?")
        );
        vec![AmxEngine::Emulated]
    }
}

fn pack(tokens: usize, k: usize, xs: &[f32]) -> Bf16Tokens {
    let acts = Bf16Tokens::new(tokens, k).expect("tokens");
    // Packed out of order, as several workers would.
    for t in (0..tokens).rev() {
        acts.pack_token(t, &xs[t * k..(t + 1) * k]).expect("pack");
    }
    acts
}

/// Every format, odd row counts (panel and tile tails), token counts around the 16-token
/// groups and the 2-group pairs, overwrite into NaN-poisoned outputs and accumulate into random
/// ones: each output within `error_bound(k)·Σ|w·x|` of the f64 dot of the f64-dequantised row
/// with the unquantised activation.
#[test]
fn gemm_bf16_matches_f64_reference_within_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xA3C5);
    for engine in engines() {
        let mut worst = 0.0f64;
        for fmt in Format::ALL {
            // Float formats also take a k that is not a whole k-step (zero padding).
            let ks: &[usize] = if fmt.block_elems() == 1 {
                &[100, 512]
            } else {
                &[512]
            };
            for &k in ks {
                // Four panels, the last a 5-row tail: several panel groups, the last partial.
                let m = 101;
                let w = random_rows(fmt, k, m, &mut rng);
                let rb = fmt.row_bytes(k).expect("rb");
                let wf: Vec<Vec<f64>> = w
                    .chunks_exact(rb)
                    .map(|row| {
                        let mut o = vec![0.0; k];
                        dequantize_row_f64(fmt, row, &mut o).expect("dequant");
                        o
                    })
                    .collect();
                for tokens in [1usize, 5, 16, 17, 33, 48] {
                    let xs: Vec<f32> = (0..tokens * k)
                        .map(|_| rng.random_range(-2.0f32..2.0))
                        .collect();
                    let acts = pack(tokens, k, &xs);
                    // Two k-blocks of 8 steps at k = 512, one of 16 (the whole k there), and the
                    // defaults; one, three and the default number of panels per group.
                    let cases = [
                        (false, 8, 1),
                        (true, 16, 3),
                        (false, KBLOCK_STEPS, PANEL_GROUP),
                    ];
                    for (accumulate, kblock, group) in cases {
                        let base: Vec<Vec<f32>> = (0..tokens)
                            .map(|_| {
                                (0..m)
                                    .map(|_| {
                                        if accumulate {
                                            rng.random_range(-1.0f32..1.0)
                                        } else {
                                            f32::NAN
                                        }
                                    })
                                    .collect()
                            })
                            .collect();
                        let mut got = base.clone();
                        let mut ys: Vec<&mut [f32]> = got.iter_mut().map(|y| &mut y[..]).collect();
                        gemm_bf16_kblock(
                            engine, kblock, group, fmt, &w, k, &acts, &mut ys, accumulate,
                        )
                        .expect("gemm");
                        for t in 0..tokens {
                            let x = &xs[t * k..(t + 1) * k];
                            for (i, row) in wf.iter().enumerate() {
                                let dot: f64 =
                                    row.iter().zip(x).map(|(a, &b)| a * f64::from(b)).sum();
                                let mag: f64 = row
                                    .iter()
                                    .zip(x)
                                    .map(|(a, &b)| (a * f64::from(b)).abs())
                                    .sum();
                                let want = dot
                                    + if accumulate {
                                        f64::from(base[t][i])
                                    } else {
                                        0.0
                                    };
                                let g = f64::from(got[t][i]);
                                let err = (g - want).abs();
                                // One more f32 rounding for the accumulate add.
                                let tol = error_bound(k) * mag + 1e-6 * want.abs() + 1e-30;
                                assert!(
                                    err <= tol,
                                    "{engine:?} {fmt} k={k} tokens={tokens} acc={accumulate} \
                                     t={t} row={i}: {g} vs {want} (err {err:e}, tol {tol:e})"
                                );
                                if mag > 0.0 {
                                    worst = worst.max(err / mag);
                                }
                            }
                        }
                    }
                }
            }
        }
        println!(
            "{engine:?}: worst error {worst:.3e} of Σ|w·x| (bound at k=512: {:.3e})",
            error_bound(512)
        );
    }
}

/// Grouping panels only reorders which panel's tiles run when: every output has the same bits
/// for 1, 2, 3 and the default number of panels per group, and for two k-block sizes.
#[test]
fn panel_grouping_changes_no_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x6A0F);
    let (fmt, k, m, tokens) = (Format::Q4K, 1024, 230, 37);
    let w = random_rows(fmt, k, m, &mut rng);
    let xs: Vec<f32> = (0..tokens * k)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    for engine in engines() {
        let acts = pack(tokens, k, &xs);
        let run = |kblock: usize, group: usize| {
            let mut got = vec![vec![f32::NAN; m]; tokens];
            let mut ys: Vec<&mut [f32]> = got.iter_mut().map(|y| &mut y[..]).collect();
            gemm_bf16_kblock(engine, kblock, group, fmt, &w, k, &acts, &mut ys, false)
                .expect("gemm");
            let bits: Vec<u32> = got.iter().flatten().map(|v| v.to_bits()).collect();
            assert!(
                got.iter().flatten().all(|v| v.is_finite()),
                "a row unwritten"
            );
            bits
        };
        for kblock in [8, 32] {
            let one = run(kblock, 1);
            for group in [2, 3, PANEL_GROUP] {
                assert!(
                    run(kblock, group) == one,
                    "{engine:?}: kblock {kblock}, {group} panels a group differ from 1"
                );
            }
        }
    }
}

/// The hardware engine against the emulation on the same buffers (where there is AMX): within
/// the bound of each against f64, counted relative to `Σ|w·x|`. They are not bit-identical: on
/// the H200 box's Xeon the tile unit's sums differed from the emulation's sequential pair order
/// by up to ~1e-4 of a ~0.02 output (2026-12-02); how many bits agree is printed.
#[test]
fn amx_hardware_matches_emulation() {
    if !amx_available() {
        println!("skipped: no AMX ({})", amx_status().err().unwrap_or("?"));
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0xE1A7);
    for fmt in [Format::Q4K, Format::Q6K] {
        let (k, m, tokens) = (4096, 70, 40);
        let w = random_rows(fmt, k, m, &mut rng);
        let xs: Vec<f32> = (0..tokens * k)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let acts = pack(tokens, k, &xs);
        let mut out = [
            vec![vec![f32::NAN; m]; tokens],
            vec![vec![f32::NAN; m]; tokens],
        ];
        for (e, o) in [AmxEngine::Emulated, AmxEngine::Hardware]
            .into_iter()
            .zip(&mut out)
        {
            let mut ys: Vec<&mut [f32]> = o.iter_mut().map(|y| &mut y[..]).collect();
            gemm_bf16(e, fmt, &w, k, &acts, &mut ys, false).expect("gemm");
        }
        let rb = fmt.row_bytes(k).expect("rb");
        let (mut same, mut worst) = (0usize, 0.0f64);
        for (i, row) in w.chunks_exact(rb).enumerate() {
            let mut wf = vec![0.0f64; k];
            dequantize_row_f64(fmt, row, &mut wf).expect("dequant");
            for t in 0..tokens {
                let x = &xs[t * k..(t + 1) * k];
                let mag: f64 = wf
                    .iter()
                    .zip(x)
                    .map(|(a, &b)| (a * f64::from(b)).abs())
                    .sum();
                let (a, b) = (out[0][t][i], out[1][t][i]);
                assert!(a.is_finite() && b.is_finite(), "{fmt}: unwritten output");
                same += usize::from(a.to_bits() == b.to_bits());
                let d = f64::from((a - b).abs());
                worst = worst.max(d / mag);
                assert!(
                    d <= 2.0 * error_bound(k) * mag,
                    "{fmt} t {t} row {i}: {a} vs {b}"
                );
            }
        }
        println!(
            "{fmt}: {same} of {} outputs bit-identical, worst difference {worst:.2e} of Σ|w·x|",
            m * tokens
        );
    }
}

/// The AVX-512 Q4_K / Q6_K dequantisers write the same bf16 panel as the generic dequantiser
/// and conversion, which is `f32_to_bf16(dequantize_row)`; rows past the last are zeros.
#[test]
fn panel_dequantisers_agree() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xDE0A);
    for fmt in Format::ALL {
        let k = 512;
        let m = 19;
        let w = random_rows(fmt, k, m, &mut rng);
        let generic = fill_panel_for_test(false, fmt, &w, k).expect("generic");
        let rb = fmt.row_bytes(k).expect("rb");
        for (r, row) in w.chunks_exact(rb).enumerate() {
            let mut f = vec![0.0f32; k];
            dequantize_row(fmt, row, &mut f).expect("dequant");
            for (i, &v) in f.iter().enumerate() {
                let got = generic[(i / TILE_K) * PANEL_ROWS + r].0[i % TILE_K];
                assert_eq!(got, f32_to_bf16(v), "{fmt} row {r} elem {i}");
            }
        }
        for r in m..PANEL_ROWS {
            for s in 0..k / TILE_K {
                assert_eq!(generic[s * PANEL_ROWS + r], Line::ZERO, "{fmt} pad row {r}");
            }
        }
        if fast_available() {
            let fast = fill_panel_for_test(true, fmt, &w, k).expect("fast");
            assert!(
                fast == generic,
                "{fmt}: AVX-512 panel differs from the generic one"
            );
        }
    }
    if !fast_available() {
        println!("AVX-512 dequantisers skipped: no AVX-512 BF16");
    }
}

/// bf16 rounding is to nearest, ties to even.
#[test]
fn f32_to_bf16_rounds_to_nearest_even() {
    assert_eq!(f32_to_bf16(1.0), 0x3F80);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.0.
    assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3F80);
    // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
    assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
    assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3F81);
    assert_eq!(f32_to_bf16(-2.5), 0xC020);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..10_000 {
        let v: f32 = rng.random_range(-1e6f32..1e6);
        let b = tiles::bf16_to_f32(f32_to_bf16(v));
        assert!((b - v).abs() <= v.abs() * 2f32.powi(-8), "{v} -> {b}");
    }
}

/// Bad input is refused before anything is written: a non-finite token, a token packed twice,
/// a GEMM before every token is packed, mismatched shapes, and the hardware engine without AMX.
#[test]
fn gemm_bf16_refuses_bad_input() {
    let (fmt, k, m) = (Format::Q4K, 256, 3);
    let w = random_rows(fmt, k, m, &mut ChaCha8Rng::seed_from_u64(1));
    let acts = Bf16Tokens::new(2, k).expect("new");
    let mut x = vec![0.5f32; k];
    x[9] = f32::INFINITY;
    assert!(matches!(
        acts.pack_token(0, &x),
        Err(QuantError::NonFinite { .. })
    ));
    x[9] = 0.25;
    assert!(acts.pack_token(2, &x).is_err(), "token out of range");
    assert!(acts.pack_token(0, &x[1..]).is_err(), "short token");
    acts.pack_token(0, &x).expect("pack");
    assert!(acts.pack_token(0, &x).is_err(), "packed twice");
    let mut y = [vec![f32::NAN; m], vec![f32::NAN; m]];
    {
        let mut ys: Vec<&mut [f32]> = y.iter_mut().map(|v| &mut v[..]).collect();
        assert!(
            gemm_bf16(AmxEngine::Emulated, fmt, &w, k, &acts, &mut ys, false).is_err(),
            "token 1 not packed"
        );
    }
    acts.pack_token(1, &x).expect("pack");
    let mut ys: Vec<&mut [f32]> = y.iter_mut().map(|v| &mut v[..]).collect();
    assert!(gemm_bf16(AmxEngine::Emulated, fmt, &w[1..], k, &acts, &mut ys, false).is_err());
    assert!(gemm_bf16(AmxEngine::Emulated, fmt, &w, 512, &acts, &mut ys, false).is_err());
    assert!(gemm_bf16(AmxEngine::Emulated, fmt, &w, k, &acts, &mut ys[..1], false).is_err());
    assert!(
        y.iter().flatten().all(|v| v.is_nan()),
        "nothing written on error"
    );
    let mut ys: Vec<&mut [f32]> = y.iter_mut().map(|v| &mut v[..]).collect();
    if amx_available() {
        gemm_bf16(AmxEngine::Hardware, fmt, &w, k, &acts, &mut ys, false).expect("amx");
    } else {
        assert!(matches!(
            gemm_bf16(AmxEngine::Hardware, fmt, &w, k, &acts, &mut ys, false),
            Err(QuantError::AmxUnavailable(_))
        ));
    }
    assert!(Bf16Tokens::new(3, 0).is_err());
}

/// Token packing (AVX-512 where present) gives `f32_to_bf16` of each value in AMX's pair order,
/// also into a reused buffer holding another call's tokens (stale columns rewritten, padding
/// tokens and elements past k zero).
#[test]
fn packing_matches_scalar_rounding_in_pair_layout() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x9AC4);
    for (tokens, k) in [(40usize, 100usize), (17, 512), (40, 100)] {
        let xs: Vec<f32> = (0..tokens * k)
            .map(|_| rng.random_range(-3.0f32..3.0))
            .collect();
        let acts = pack(tokens, k, &xs);
        let ksteps = k.div_ceil(TILE_K);
        for g in 0..tokens.div_ceil(TILE_ROWS) {
            let lines = acts.group(g).expect("packed");
            for s in 0..ksteps {
                for p in 0..TILE_ROWS {
                    for n in 0..TILE_ROWS {
                        for e in 0..2 {
                            let (t, i) = (g * TILE_ROWS + n, s * TILE_K + 2 * p + e);
                            let want = if t < tokens && i < k {
                                f32_to_bf16(xs[t * k + i])
                            } else {
                                0
                            };
                            let got = lines[s * TILE_ROWS + p].0[2 * n + e];
                            assert_eq!(got, want, "tokens {tokens} k {k}: t {t} i {i}");
                        }
                    }
                }
            }
        }
    }
}
