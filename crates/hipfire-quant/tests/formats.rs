//! Every format × every SIMD tier this CPU has, as a triangle (candle's
//! `ggml_matmul_error_test_`): SIMD vs scalar within a tight bound, both vs an f64 reference
//! (dequantised weights, unquantised x) within the activation-quantisation bound.

use hipfire_quant::{
    dequantize_row, dequantize_row_f64, gemv_rows, gemv_rows_scalar, gemv_rows_with, quantize_row,
    simd_tier, ActivationBuf, Format, QuantError, SimdTier,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// SIMD and scalar compute the same exact integer block sums and differ only in f32 summation
/// order and in f32 vs f64 accumulation across blocks: with ≥ 8 independent f32 lanes at
/// k ≤ 4096 each lane sums ≤ 512 terms of random sign, ~√512·ε ≈ 1.4e-6 of Σ|w·x| at worst
/// in practice. The largest gap this test has printed is 1.1e-7·Σ; the bound is 1e-6·Σ.
const SIMD_VS_SCALAR_REL: f64 = 1e-6;
/// f32 rounding allowance of any path vs the f64 reference, relative to Σ|w_i·x_i|
/// (same reasoning as above, with the f32 products of scales included).
const FLOAT_REL: f64 = 2e-5;
/// Absolute floor so rows whose Σ|w·x| is tiny do not demand better than f32 can give.
const ABS_FLOOR: f64 = 1e-6;
/// Rows per case: odd counts, one of them larger than any SIMD unroll.
const ROW_COUNTS: [usize; 3] = [1, 7, 33];
/// Fixed seed: every run draws the same data.
const SEED: u64 = 0x5EED_F00D;

fn ks(fmt: Format) -> &'static [usize] {
    match fmt.block_elems() {
        1 => &[1, 7, 33, 96, 100, 256, 4096],
        // 160 = one full 4-block group plus a tail block (Q4_0 layout, 4-block steps).
        32 => &[32, 96, 160, 256, 512, 4096],
        _ => &[256, 512, 4096],
    }
}

/// Random weights with varying magnitude per block (so scales differ) and no zeros.
fn random_vec(rng: &mut ChaCha8Rng, n: usize, block: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let mag: f32 = rng.random_range(0.05..2.0);
        let shift: f32 = rng.random_range(-0.3..0.3) * mag;
        for _ in 0..block.min(n - v.len()).max(1) {
            v.push(rng.random_range(-1.0f32..1.0) * mag + shift);
        }
    }
    v
}

/// Activation-quantisation bound: |Σ w_i (xq_i − x_i)| ≤ Σ |w_i|·amax(group(i))/254,
/// with the group the span whose amax bounds the activation block's scale.
fn act_bound(fmt: Format, w: &[f64], x: &[f32]) -> f64 {
    let group = match fmt {
        Format::F32 | Format::F16 | Format::BF16 => return 0.0,
        Format::Q8_0
        | Format::Q4_0
        | Format::Q4_1
        | Format::Q5_0
        | Format::Q5_1
        | Format::Iq4Nl
        | Format::Mxfp4 => 32,
        // HFQ4G256's activation blocks are permuted within 128 elements.
        Format::Hfq4G256 => 128,
        Format::Q4K | Format::Q6K | Format::Q5K | Format::Q3K | Format::Q2K | Format::Iq4Xs => 256,
    };
    let mut b = 0.0;
    for (wg, xg) in w.chunks(group).zip(x.chunks(group)) {
        let amax = xg.iter().fold(0f64, |a, v| a.max(f64::from(v.abs())));
        b += wg.iter().map(|v| v.abs()).sum::<f64>() * amax / 254.0;
    }
    b
}

fn tiers() -> Vec<SimdTier> {
    let mut t = Vec::new();
    for tier in SimdTier::ALL {
        if tier.is_supported() {
            t.push(tier);
        } else {
            println!("SKIPPED tier {tier}: not supported by this CPU");
        }
    }
    t
}

#[test]
fn every_format_every_tier_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let tiers = tiers();
    println!("tiers tested: {tiers:?}");
    for fmt in Format::ALL {
        let mut worst_act = 0f64;
        let mut worst_simd = 0f64;
        for &k in ks(fmt) {
            let rb = fmt.row_bytes(k).unwrap();
            for &m in &ROW_COUNTS {
                let mut w_bytes = Vec::with_capacity(m * rb);
                let mut w64 = vec![0f64; m * k];
                for r in 0..m {
                    let src = random_vec(&mut rng, k, fmt.block_elems().max(32));
                    let q = quantize_row(fmt, &src).unwrap();
                    assert_eq!(q.len(), rb);
                    dequantize_row_f64(fmt, &q, &mut w64[r * k..(r + 1) * k]).unwrap();
                    w_bytes.extend_from_slice(&q);
                }
                let x = random_vec(&mut rng, k, 32);
                let act = ActivationBuf::prepare(fmt, &x).unwrap();
                let mut y_scalar = vec![f32::NAN; m];
                gemv_rows_scalar(fmt, &w_bytes, k, &act, &mut y_scalar, false).unwrap();
                // The dispatched entry point is exactly the detected tier.
                let (mut y_auto, mut y_best) = (vec![f32::NAN; m], vec![f32::NAN; m]);
                gemv_rows(fmt, &w_bytes, k, &act, &mut y_auto, false).unwrap();
                gemv_rows_with(simd_tier(), fmt, &w_bytes, k, &act, &mut y_best, false).unwrap();
                assert_eq!(y_auto, y_best, "{fmt} k={k}: gemv_rows vs its tier");
                for r in 0..m {
                    let w = &w64[r * k..(r + 1) * k];
                    let exact: f64 = w.iter().zip(&x).map(|(a, &b)| a * f64::from(b)).sum();
                    let mag: f64 = w
                        .iter()
                        .zip(&x)
                        .map(|(a, &b)| (a * f64::from(b)).abs())
                        .sum();
                    let bound = act_bound(fmt, w, &x) + FLOAT_REL * mag + ABS_FLOOR;
                    let err = (f64::from(y_scalar[r]) - exact).abs();
                    assert!(
                        err <= bound,
                        "{fmt} k={k} row {r}: scalar {} vs f64 {exact}: err {err} > {bound}",
                        y_scalar[r]
                    );
                    worst_act = worst_act.max(err / mag.max(ABS_FLOOR));
                    for &tier in &tiers {
                        let mut y = vec![f32::NAN; m];
                        gemv_rows_with(tier, fmt, &w_bytes, k, &act, &mut y, false).unwrap();
                        assert!(
                            y.iter().all(|v| v.is_finite()),
                            "{fmt} {tier} k={k}: row unwritten"
                        );
                        let gap = (f64::from(y[r]) - f64::from(y_scalar[r])).abs();
                        let tol = SIMD_VS_SCALAR_REL * mag + ABS_FLOOR;
                        assert!(
                            gap <= tol,
                            "{fmt} {tier} k={k} m={m} row {r}: {} vs scalar {}: {gap} > {tol}",
                            y[r],
                            y_scalar[r]
                        );
                        worst_simd = worst_simd.max(gap / mag.max(ABS_FLOOR));
                    }
                }
                // accumulate = true adds onto what y held: exactly y0 + (the same tier's dot).
                for &tier in &tiers {
                    let y0 = random_vec(&mut rng, m, m);
                    let mut dot = vec![f32::NAN; m];
                    gemv_rows_with(tier, fmt, &w_bytes, k, &act, &mut dot, false).unwrap();
                    let mut y = y0.clone();
                    gemv_rows_with(tier, fmt, &w_bytes, k, &act, &mut y, true).unwrap();
                    for r in 0..m {
                        assert_eq!(y[r], y0[r] + dot[r], "{fmt} {tier} accumulate row {r}");
                    }
                }
            }
        }
        println!(
            "{fmt:>9}: max |y - f64 ref| / Σ|w·x| = {worst_act:.2e} (activation quantisation + f32); \
             max |simd - scalar| / Σ|w·x| = {worst_simd:.2e}"
        );
    }
}

/// Super-blocks in a row of [`long_rows_match_scalar`]: past the 16-super-block chunks some
/// kernels work their f32 scales out in, and not a multiple of them.
const LONG_ROW_SUPER_BLOCKS: usize = 37;

/// Rows longer than [`ks`] covers, for the super-block formats whose kernels work in chunks of
/// super-blocks: every tier within the SIMD-vs-scalar bound.
#[test]
fn long_rows_match_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 2);
    let tiers = tiers();
    for fmt in [Format::Q3K, Format::Q2K, Format::Iq4Xs, Format::Q4K] {
        let k = fmt.block_elems() * LONG_ROW_SUPER_BLOCKS;
        let m = 3;
        let mut w_bytes = Vec::new();
        let mut w64 = vec![0f64; m * k];
        for r in 0..m {
            let q = quantize_row(fmt, &random_vec(&mut rng, k, fmt.block_elems())).unwrap();
            dequantize_row_f64(fmt, &q, &mut w64[r * k..(r + 1) * k]).unwrap();
            w_bytes.extend_from_slice(&q);
        }
        let x = random_vec(&mut rng, k, 32);
        let act = ActivationBuf::prepare(fmt, &x).unwrap();
        let mut y_scalar = vec![f32::NAN; m];
        gemv_rows_scalar(fmt, &w_bytes, k, &act, &mut y_scalar, false).unwrap();
        for &tier in &tiers {
            let mut y = vec![f32::NAN; m];
            gemv_rows_with(tier, fmt, &w_bytes, k, &act, &mut y, false).unwrap();
            for r in 0..m {
                let mag: f64 = w64[r * k..(r + 1) * k]
                    .iter()
                    .zip(&x)
                    .map(|(a, &b)| (a * f64::from(b)).abs())
                    .sum();
                let gap = (f64::from(y[r]) - f64::from(y_scalar[r])).abs();
                let tol = SIMD_VS_SCALAR_REL * mag + ABS_FLOOR;
                assert!(
                    gap <= tol,
                    "{fmt} {tier} k={k} row {r}: {} vs scalar {}",
                    y[r],
                    y_scalar[r]
                );
            }
        }
    }
}

/// Per-element quantisation error of each quantiser stays inside its format's step.
#[test]
fn quantisers_round_trip_within_step() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 1);
    for fmt in Format::ALL {
        let k = 4096;
        let src = random_vec(&mut rng, k, 32);
        let q = quantize_row(fmt, &src).unwrap();
        let mut back = vec![0f32; k];
        dequantize_row(fmt, &q, &mut back).unwrap();
        let mut back64 = vec![0f64; k];
        dequantize_row_f64(fmt, &q, &mut back64).unwrap();
        // f32 dequantisation is the f64 one through at most 3 f32 roundings of terms no larger
        // than the row's largest |value| (scale·q and zero can cancel, so relative to that).
        let vmax = back64.iter().fold(0f64, |a, v| a.max(v.abs()));
        for (a, b) in back.iter().zip(&back64) {
            assert!(
                (f64::from(*a) - b).abs() <= 4.0 * f64::from(f32::EPSILON) * vmax,
                "{fmt}: {a} vs {b}"
            );
        }
        let be = fmt.block_elems().max(32);
        for (sb, bb) in src.chunks(be).zip(back.chunks(be)) {
            let (lo, hi) = sb
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let amax = lo.abs().max(hi.abs());
            // Largest error each scheme allows per element, in units of the block's range:
            // f16 scale rounding adds ~2^-11 relative on top of half a step.
            let bound = match fmt {
                Format::F32 => 0.0,
                Format::F16 => amax * 2f32.powi(-11),
                Format::BF16 => amax * 2f32.powi(-8),
                Format::Q8_0 => amax / 127.0 * 0.51 + amax * 1e-3,
                // Q4_0 maps the signed extreme to −8·d, so the opposite extreme clips to 7·d: one step.
                Format::Q4_0 => amax / 8.0 * 1.01 + amax * 1e-2,
                Format::Q4_1 | Format::Hfq4G256 => (hi - lo) / 15.0 * 0.51 + amax * 1e-2,
                // Q5_0 as Q4_0 with 16 steps per sign; Q5_1 as Q4_1 with 31 steps.
                Format::Q5_0 => amax / 16.0 * 1.01 + amax * 1e-2,
                Format::Q5_1 => (hi - lo) / 31.0 * 0.51 + amax * 1e-2,
                // K-quants: 6-bit sub-scales; half a step of the coarsest sub-block plus the
                // scale/min code rounding (≤ 1/63 of the block max each).
                Format::Q4K => (hi - lo) / 15.0 * 0.75 + amax / 63.0 * 2.0,
                Format::Q6K => amax / 31.0 * 0.75 + amax / 127.0 * 2.0,
                Format::Q5K => (hi - lo) / 31.0 * 0.75 + amax / 63.0 * 2.0,
                // 3 bits: signed codes −4..3 per 16 under 6-bit scales, one step at the clipped
                // extreme; 2 bits: 4 levels per 16 under 4-bit scales and mins.
                Format::Q3K => amax / 4.0 * 1.1 + amax / 31.0 * 2.0,
                Format::Q2K => (hi - lo) / 3.0 * 0.75 + amax / 15.0 * 2.0,
                // The table's widest gap is 23 of 127·d (d ≈ amax/127): half of it, plus the
                // 6-bit sub-scale rounding for IQ4_XS.
                Format::Iq4Nl => amax * 12.0 / 127.0 * 1.1,
                Format::Iq4Xs => amax * 12.0 / 127.0 * 1.1 + amax / 32.0 * 2.0,
                // The power-of-two scale d = 2^⌊log2 amax⌋ / 8 ≤ amax/8 puts amax in [8d, 16d)
                // but the largest (doubled) value is 12·d: values past it clip by < 4·d < amax/4,
                // and the widest gap (8 to 12) costs half of 4·d: amax/4 either way.
                Format::Mxfp4 => amax / 4.0,
            };
            for (a, b) in sb.iter().zip(bb) {
                assert!(
                    (a - b).abs() <= bound + 1e-7,
                    "{fmt}: {a} → {b}, bound {bound}"
                );
            }
        }
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 2);
    for fmt in Format::ALL {
        let be = fmt.block_elems();
        let k = 256;
        let x = random_vec(&mut rng, k, 32);
        let w = quantize_row(fmt, &random_vec(&mut rng, k, 32)).unwrap();
        let act = ActivationBuf::prepare(fmt, &x).unwrap();
        if be > 1 {
            // k not a block multiple.
            let bad = k + 1;
            assert!(matches!(
                fmt.row_bytes(bad),
                Err(QuantError::KNotBlockMultiple { .. })
            ));
            assert!(matches!(
                quantize_row(fmt, &vec![1.0; bad]),
                Err(QuantError::KNotBlockMultiple { .. })
            ));
            assert!(matches!(
                ActivationBuf::prepare(fmt, &vec![1.0; bad]),
                Err(QuantError::KNotBlockMultiple { .. })
            ));
            let mut out = vec![0f32; bad];
            assert!(matches!(
                dequantize_row(fmt, &w, &mut out),
                Err(QuantError::KNotBlockMultiple { .. })
            ));
        }
        assert!(matches!(
            fmt.row_bytes(0),
            Err(QuantError::KNotBlockMultiple { .. })
        ));
        // Short buffers.
        let mut out = vec![0f32; k];
        assert!(matches!(
            dequantize_row(fmt, &w[..w.len() - 1], &mut out),
            Err(QuantError::ShortBuffer { .. })
        ));
        let mut out64 = vec![0f64; k];
        assert!(matches!(
            dequantize_row_f64(fmt, &w[..w.len() - 1], &mut out64),
            Err(QuantError::ShortBuffer { .. })
        ));
        // y longer than the rows provided: nothing is written, no out-of-bounds read.
        for tier in SimdTier::ALL {
            let mut y = vec![f32::NAN; 2];
            let r = gemv_rows_with(tier, fmt, &w, k, &act, &mut y, false);
            if tier.is_supported() {
                assert!(
                    matches!(r, Err(QuantError::ShortBuffer { need, got, .. }) if need == 2 * w.len() && got == w.len())
                );
            } else {
                assert!(r.is_err());
            }
            assert!(y.iter().all(|v| v.is_nan()));
        }
        // NaN / inf in quantiser or activation input.
        let mut nan_src = random_vec(&mut rng, k, 32);
        nan_src[37] = f32::NAN;
        assert_eq!(
            quantize_row(fmt, &nan_src),
            Err(QuantError::NonFinite {
                format: fmt,
                what: "input value",
                block: 37 / be
            })
        );
        nan_src[37] = f32::INFINITY;
        assert!(matches!(
            quantize_row(fmt, &nan_src),
            Err(QuantError::NonFinite { .. })
        ));
        assert!(matches!(
            ActivationBuf::prepare(fmt, &nan_src),
            Err(QuantError::NonFinite { .. })
        ));
        // The activation check has no early exit: the block is still the first bad one's,
        // wherever it sits (NaN, -inf, last element).
        for (pos, bad) in [(37, f32::NAN), (k - 1, f32::NEG_INFINITY), (0, f32::NAN)] {
            let mut x = random_vec(&mut rng, k, 32);
            x[pos] = bad;
            assert_eq!(
                ActivationBuf::prepare(fmt, &x).map(|_| ()),
                Err(QuantError::NonFinite {
                    format: fmt,
                    what: "activation value",
                    block: pos / be
                })
            );
        }
        // Activation for another format or k.
        let other = if fmt == Format::Q4_0 {
            Format::Q8_0
        } else {
            Format::Q4_0
        };
        let act_other = ActivationBuf::prepare(other, &x).unwrap();
        let mut y = [0f32; 1];
        assert!(matches!(
            gemv_rows_scalar(fmt, &w, k, &act_other, &mut y, false),
            Err(QuantError::ActivationMismatch { .. })
        ));
        let act_512 = ActivationBuf::prepare(fmt, &random_vec(&mut rng, 512, 32)).unwrap();
        assert!(matches!(
            gemv_rows_scalar(fmt, &w, k, &act_512, &mut y, false),
            Err(QuantError::ActivationMismatch { .. })
        ));
    }
}

#[test]
fn format_ids_and_names_round_trip() {
    for fmt in Format::ALL {
        assert_eq!(Format::from_name(fmt.name()), Some(fmt));
        if let Some(id) = fmt.ggml_type() {
            assert_eq!(Format::from_ggml_type(id), Ok(fmt));
        }
        // Every format but MXFP4 has a GPU kernel (kernels/gemv.cu `HF_GEMV_FORMATS`).
        assert_eq!(fmt.has_gpu_kernel(), fmt != Format::Mxfp4, "{fmt}");
        assert_eq!(
            fmt.row_bytes(256).unwrap(),
            256 / fmt.block_elems() * fmt.block_bytes()
        );
    }
    assert_eq!(
        Format::from_ggml_type(99),
        Err(QuantError::UnknownGgmlType(99))
    );
    assert_eq!(hipfire_quant::simd_tier(), SimdTier::detect());
    assert!(hipfire_quant::simd_tier().is_supported());
}

/// MXFP4 exponents the quantiser does not reach on [`random_vec`]'s data: the subnormal scales
/// (e = 0, 1), the first normal one and large ones, on raw random nibbles.
const MXFP4_EXPONENTS: [u8; 8] = [0, 1, 2, 3, 100, 127, 128, 200];
/// Bytes of an MXFP4 block (its exponent byte first).
const MXFP4_BLOCK: usize = 17;
/// Absolute floor for the rows of tiny (subnormal) scale: a few hundred f32 subnormal quanta
/// (2^−149 ≈ 1.4e−45), far below every other row's result.
const SUBNORMAL_FLOOR: f64 = 1e-40;

/// Every tier builds each E8M0 scale as the scalar path does, subnormal ones included.
#[test]
fn mxfp4_every_exponent_every_tier() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 3);
    let tiers = tiers();
    let fmt = Format::Mxfp4;
    for &k in ks(fmt) {
        for &e in &MXFP4_EXPONENTS {
            let m = 3;
            let mut w: Vec<u8> = (0..m * fmt.row_bytes(k).unwrap())
                .map(|_| rng.random())
                .collect();
            for blk in w.chunks_exact_mut(MXFP4_BLOCK) {
                blk[0] = e;
            }
            let x = random_vec(&mut rng, k, 32);
            let act = ActivationBuf::prepare(fmt, &x).unwrap();
            let mut y_scalar = vec![f32::NAN; m];
            gemv_rows_scalar(fmt, &w, k, &act, &mut y_scalar, false).unwrap();
            for (r, row) in w.chunks_exact(fmt.row_bytes(k).unwrap()).enumerate() {
                let mut w64 = vec![0f64; k];
                dequantize_row_f64(fmt, row, &mut w64).unwrap();
                let exact: f64 = w64.iter().zip(&x).map(|(a, &b)| a * f64::from(b)).sum();
                let mag: f64 = w64
                    .iter()
                    .zip(&x)
                    .map(|(a, &b)| (a * f64::from(b)).abs())
                    .sum();
                let bound = act_bound(fmt, &w64, &x) + FLOAT_REL * mag + SUBNORMAL_FLOOR;
                let err = (f64::from(y_scalar[r]) - exact).abs();
                assert!(
                    err <= bound,
                    "e={e} k={k} row {r}: {} vs {exact}",
                    y_scalar[r]
                );
                for &tier in &tiers {
                    let mut y = vec![f32::NAN; m];
                    gemv_rows_with(tier, fmt, &w, k, &act, &mut y, false).unwrap();
                    let gap = (f64::from(y[r]) - f64::from(y_scalar[r])).abs();
                    let tol = SIMD_VS_SCALAR_REL * mag + SUBNORMAL_FLOOR;
                    assert!(
                        gap <= tol,
                        "{tier} e={e} k={k} row {r}: {} vs {}",
                        y[r],
                        y_scalar[r]
                    );
                }
            }
        }
    }
}
