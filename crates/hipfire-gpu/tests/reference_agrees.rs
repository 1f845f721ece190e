//! CPU tier (runs in CI): the GPU tests' own f64 dequantiser (tests/common, written from ggml's
//! dequantize_row_*) agrees with hipfire-quant's `dequantize_row_f64` on seeded random rows of every
//! format, so the GPU tier's reference is itself cross-checked against an independent one.

mod common;

use common::{dequant_f64, random_weights, rng};
use hipfire_quant::Format;

#[test]
fn test_reference_matches_hipfire_quant_f64_dequant() {
    let mut r = rng(0x5EED_00AA);
    for format in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
        let (m, k) = (9, 512);
        let bytes = random_weights(format, m, k, &mut r);
        let rb = format.row_bytes(k).expect("row bytes");
        for (i, row) in bytes.chunks_exact(rb).enumerate() {
            let mine = dequant_f64(format, row, k);
            let mut theirs = vec![0f64; k];
            hipfire_quant::dequantize_row_f64(format, row, &mut theirs)
                .expect("dequantize_row_f64");
            for (j, (a, b)) in mine.iter().zip(&theirs).enumerate() {
                // Both are exact products of f16/f32 scales and small integers; allow only f64 rounding.
                assert!(
                    (a - b).abs() <= 1e-12 * a.abs().max(1e-30),
                    "{format} row {i} elem {j}: {a} vs {b}"
                );
            }
        }
    }
}
