//! Shared pieces of the dequantiser's tests (the host-compiled check and the GPU tier): seeded
//! weights in every format, the shapes, the expected f16 rows and the comparisons.

use super::{dequant_f64, random_weights, rng};
use half::f16;
use hipfire_gpu::RowRange;
use hipfire_quant::{dequantize_row, quantize_row, Format};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The output poison: an f16 NaN no conversion produces, so any value left unwritten (or written
/// past the range) keeps exactly these bits.
pub const POISON: u16 = 0x7E01;
/// Output values checked past the last written row for untouched poison (two rows' worth).
pub const POISON_TAIL_ROWS: usize = 2;

/// The formats the dequantiser covers: exactly those with a GPU GEMV.
pub fn formats() -> Vec<Format> {
    Format::ALL
        .into_iter()
        .filter(|f| f.has_gpu_kernel())
        .collect()
}

/// One launch of a test: a weight of `m` rows of `k`, rows `rows` dequantised.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub m: usize,
    pub k: usize,
    pub rows: RowRange,
}

/// The shapes every format runs: odd m, k of 2 and 3 blocks (8 elements for the float formats:
/// fewer chunks than a thread block), a range that ends at m, k = 4096 (two thread blocks per
/// row) and k = 5120 (three, the last partial).
pub fn shapes(format: Format) -> Vec<Shape> {
    let block = format.block_elems().max(hipfire_gpu::DEQUANT_CHUNK);
    vec![
        Shape {
            m: 37,
            k: 2 * block,
            rows: RowRange::new(5, 29),
        },
        Shape {
            m: 300,
            k: 3 * block,
            rows: RowRange::new(17, 300),
        },
        Shape {
            m: 37,
            k: 4096,
            rows: RowRange::new(5, 29),
        },
        Shape {
            m: 9,
            k: 5120,
            rows: RowRange::new(0, 9),
        },
    ]
}

/// `m` rows of seeded random values (per-row scales over two decades, occasional outliers, and
/// for the float formats values past f16's range and in its subnormals) quantised by
/// hipfire-quant's quantiser.
pub fn quantised_weights(format: Format, m: usize, k: usize, r: &mut ChaCha8Rng) -> Vec<u8> {
    /// Every this many elements an outlier 8× the row's scale (the K-quants' scale search sees one).
    const OUTLIER_EVERY: usize = 61;
    /// Float weights: every this many elements a value beyond f16's largest finite (65504).
    const HUGE_EVERY: usize = 97;
    /// Float weights: every this many elements a value in f16's subnormal range (< 2^-14).
    const TINY_EVERY: usize = 89;
    let mut out = Vec::with_capacity(m * format.row_bytes(k).expect("k fits the format"));
    for _ in 0..m {
        let scale = 10f32.powf(r.random_range(-2.0f32..0.3));
        let row: Vec<f32> = (0..k)
            .map(|i| {
                let v = r.random_range(-1.0f32..1.0) * scale;
                let float = matches!(format, Format::F32 | Format::F16 | Format::BF16);
                if float && i % HUGE_EVERY == HUGE_EVERY - 1 {
                    v.signum() * r.random_range(7.0e4f32..1.0e6)
                } else if float && i % TINY_EVERY == TINY_EVERY - 1 {
                    v * 1.0e-5
                } else if i % OUTLIER_EVERY == OUTLIER_EVERY - 1 {
                    v * 8.0
                } else {
                    v
                }
            })
            .collect();
        out.extend(quantize_row(format, &row).expect("finite values quantise"));
    }
    out
}

/// The two weight sources: quantiser output (realistic codes and scales) and every byte random
/// with the scales in realistic ranges (every bit pattern of the codes and packed scales).
pub fn weight_sources(
    format: Format,
    m: usize,
    k: usize,
    seed: u64,
) -> Vec<(&'static str, Vec<u8>)> {
    let mut r = rng(seed);
    vec![
        ("quantised", quantised_weights(format, m, k, &mut r)),
        ("random bytes", random_weights(format, m, k, &mut r)),
    ]
}

/// Values an output of `rows` rows of `k`, `stride` apart, spans, plus the poisoned tail.
pub fn strided_len(rows: usize, k: usize, stride: usize) -> usize {
    (rows - 1) * stride + k + POISON_TAIL_ROWS * k
}

/// A strided output against the expected rows (`want`, row-major `rows × k`): (values not
/// bit-identical, largest distance in f16 ulps) over the written values, and an error if any
/// value between the rows or in the tail is not the poison.
pub fn check_strided(
    got: &[u16],
    want: &[u16],
    rows: usize,
    k: usize,
    stride: usize,
) -> Result<(usize, i32), String> {
    if got.len() != strided_len(rows, k, stride) {
        return Err(format!("output holds {} values", got.len()));
    }
    let mut written = Vec::with_capacity(rows * k);
    for (i, &v) in got.iter().enumerate() {
        let (r, j) = (i / stride, i % stride);
        if r < rows && j < k {
            written.push(v);
        } else if v != POISON {
            return Err(format!(
                "wrote {v:#06x} at {i}, outside the rows (stride {stride})"
            ));
        }
    }
    Ok(ulp_report(&written, want))
}

/// The rows of a strided output, row-major `rows × k`.
pub fn unstride(got: &[u16], rows: usize, k: usize, stride: usize) -> Vec<u16> {
    (0..rows)
        .flat_map(|r| got[r * stride..r * stride + k].iter().copied())
        .collect()
}

/// The CPU dequantiser's f32 of rows `rows`, each rounded to f16 (nearest even): what the kernel
/// must write, row-major.
pub fn expected_f16(format: Format, w: &[u8], k: usize, rows: RowRange) -> Vec<u16> {
    let rb = format.row_bytes(k).expect("k fits the format");
    let mut row = vec![0f32; k];
    let mut out = Vec::with_capacity(rows.len() * k);
    for r in rows.start..rows.end {
        dequantize_row(format, &w[r * rb..(r + 1) * rb], &mut row).expect("row dequantises");
        out.extend(row.iter().map(|&v| f16::from_f32(v).to_bits()));
    }
    out
}

/// f16 bits as a monotonic integer (adjacent finite values differ by 1; ±0 are equal).
fn ordered(b: u16) -> i32 {
    if b & 0x8000 != 0 {
        -i32::from(b & 0x7FFF)
    } else {
        i32::from(b)
    }
}

/// How far `got` is from `want`: (values not bit-identical, largest distance in f16 ulps).
pub fn ulp_report(got: &[u16], want: &[u16]) -> (usize, i32) {
    let mut off = 0;
    let mut worst = 0;
    for (&g, &w) in got.iter().zip(want) {
        if g != w {
            off += 1;
            worst = worst.max((ordered(g) - ordered(w)).abs());
        }
    }
    (off, worst)
}

/// The spacing of f16 values just above |x| (the largest finite's spacing at the top).
fn f16_ulp(x: f16) -> f64 {
    /// Bits of f16's largest finite magnitude, 65504 (spacing 32 below it).
    const MAX_FINITE: u16 = 0x7BFF;
    let mag = (x.to_bits() & 0x7FFF).min(MAX_FINITE - 1);
    f16::from_bits(mag + 1).to_f64() - f16::from_bits(mag).to_f64()
}

/// Checks the written values against the independent f64 dequantiser (ggml's formulas): each is
/// the f64 value rounded to f16, up to the CPU's f32 rounding. Returns the first violation.
pub fn check_against_f64(
    format: Format,
    w: &[u8],
    k: usize,
    rows: RowRange,
    got: &[u16],
) -> Result<(), String> {
    /// f32 rounding of a dequantised value, relative to the size of its terms (at most three f32
    /// operations of 2^-24 each; a difference of two terms can cancel, so it is taken relative
    /// to the row's largest value, which bounds the terms up to a small factor).
    const F32_REL: f64 = 8.0 * f32::EPSILON as f64;
    let rb = format.row_bytes(k).expect("k fits the format");
    for (i, r) in (rows.start..rows.end).enumerate() {
        let want = dequant_f64(format, &w[r * rb..(r + 1) * rb], k);
        let row_max = want
            .iter()
            .filter(|v| v.is_finite())
            .fold(0f64, |a, v| a.max(v.abs()));
        for (j, &x) in want.iter().enumerate() {
            let g = f16::from_bits(got[i * k + j]);
            let xf = f16::from_f64(x);
            if xf.is_infinite() && g == xf {
                continue;
            }
            let tol = 0.5 * f16_ulp(xf) + (x.abs() + row_max) * F32_REL;
            let err = (g.to_f64() - x).abs();
            if err.is_nan() || err > tol {
                return Err(format!(
                    "{format} row {r} col {j}: wrote {g} ({:#06x}), f64 reference {x:e}",
                    g.to_bits()
                ));
            }
        }
    }
    Ok(())
}

/// Seeded f32 values for the conversion: a range of magnitudes and the cases where rounding
/// rules differ (exact ties both ways, the overflow edge, subnormals, ±0, ±inf, NaN).
pub fn convert_inputs(n: usize, seed: u64) -> Vec<f32> {
    let special = [
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65519.0,
        65520.0,
        -65520.0,
        1.5 * 2f32.powi(-24),
        2f32.powi(-26),
        -0.0,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0e30,
        -(1.0 + 2f32.powi(-11)),
    ];
    let mut r = rng(seed);
    (0..n)
        .map(|i| {
            if i % 7 == 3 {
                special[(i / 7) % special.len()]
            } else {
                r.random_range(-1.0f32..1.0) * 10f32.powf(r.random_range(-9.0f32..6.0))
            }
        })
        .collect()
}

/// `got` against `half::f16::from_f32` of each input: bit-identical, NaN for NaN. Returns the
/// first difference.
pub fn check_convert(x: &[f32], got: &[u16]) -> Result<(), String> {
    for (i, (&v, &g)) in x.iter().zip(got).enumerate() {
        let want = f16::from_f32(v);
        let ok = if v.is_nan() {
            f16::from_bits(g).is_nan()
        } else {
            g == want.to_bits()
        };
        if !ok {
            return Err(format!(
                "x[{i}] = {v:e}: wrote {g:#06x}, want {:#06x}",
                want.to_bits()
            ));
        }
    }
    Ok(())
}
