//! GPU tier: the batched-step GEMM (`gemm_f16`, cuBLAS) against an f64 reference on random f16
//! operands — odd shapes, one and many tokens, plain and accumulating, an output wider than the
//! product (`ldy > m`) whose other columns must keep their poison — and its typed refusals.
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` runs them
//! (`scripts/device-check.sh run`).

mod common;

use common::{gpu, rng};
use half::f16;
use hipfire_gpu::{gemm_available, gemm_f16, DeviceBuffer, GemmShape, GpuError};
use rand::Rng;

/// Quiet NaN bit pattern: an element the GEMM must not write keeps exactly these bits.
const POISON: u32 = 0x7FC0_0001;
/// Unit roundoff of f32: the GEMM accumulates in f32, so |error| ≤ ~k·u·Σ|w·x| (a loose bound;
/// tensor-core accumulation orders differ from a serial sum).
const F32_U: f64 = 6.0e-8;

fn f16s(n: usize, r: &mut impl Rng) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(r.random_range(-1.0f32..1.0)))
        .collect()
}

fn bits(v: &[f16]) -> Vec<u16> {
    v.iter().map(|h| h.to_bits()).collect()
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gemm_f16_matches_f64_on_odd_shapes() {
    let ctx = gpu();
    let stream = ctx.new_stream().expect("stream");
    if !gemm_available(&stream) {
        panic!("cuBLAS is not loadable on the GPU box: batched prefill would fall back");
    }
    let mut r = rng(41);
    // (m, n, k, ldy): odd m and n, k from one tile to Llama-3's FFN width; ldy > m.
    for &(m, n, k, ldy) in &[
        (37usize, 1usize, 64usize, 37usize),
        (37, 5, 64, 40),
        (300, 33, 256, 300),
        (1024, 17, 4096, 1031),
        (4096, 128, 1024, 4096),
    ] {
        let w = f16s(m * k, &mut r);
        let x = f16s(n * k, &mut r);
        let y0: Vec<f32> = (0..n * ldy).map(|_| r.random_range(-2.0f32..2.0)).collect();
        let mut dw: DeviceBuffer<u16> = ctx.alloc(m * k).expect("alloc");
        let mut dx: DeviceBuffer<u16> = ctx.alloc(n * k).expect("alloc");
        dw.upload(&stream, &bits(&w)).expect("up");
        dx.upload(&stream, &bits(&x)).expect("up");
        for accumulate in [false, true] {
            // Columns m..ldy of every row are poison; columns < m start at y0 (kept by accumulate).
            let start: Vec<f32> = (0..n * ldy)
                .map(|i| {
                    if i % ldy < m {
                        y0[i]
                    } else {
                        f32::from_bits(POISON)
                    }
                })
                .collect();
            let mut dy: DeviceBuffer<f32> = ctx.alloc(n * ldy).expect("alloc");
            dy.upload(&stream, &start).expect("up");
            gemm_f16(
                &stream,
                &dw,
                &dx,
                &mut dy,
                GemmShape { m, n, k, ldy },
                accumulate,
            )
            .expect("gemm");
            let mut got = vec![0f32; n * ldy];
            dy.download(&stream, &mut got).expect("down");
            stream.synchronize().expect("sync");
            let mut worst = 0f64;
            for t in 0..n {
                for row in 0..ldy {
                    let g = got[t * ldy + row];
                    if row >= m {
                        assert_eq!(g.to_bits(), POISON, "m {m} n {n}: column {row} written");
                        continue;
                    }
                    let (mut want, mut mag) = (0f64, 0f64);
                    for i in 0..k {
                        let p =
                            f64::from(w[row * k + i].to_f32()) * f64::from(x[t * k + i].to_f32());
                        want += p;
                        mag += p.abs();
                    }
                    if accumulate {
                        want += f64::from(y0[t * ldy + row]);
                        mag += f64::from(y0[t * ldy + row]).abs();
                    }
                    let err = (f64::from(g) - want).abs();
                    let bound = 4.0 * k as f64 * F32_U * mag + 1e-6;
                    assert!(
                        err <= bound,
                        "m {m} n {n} k {k} acc {accumulate}: y[{t}][{row}] = {g}, want {want} (err {err:.3e} > {bound:.3e})"
                    );
                    worst = worst.max(err / mag.max(1e-30));
                }
            }
            eprintln!("m {m} n {n} k {k} ldy {ldy} acc {accumulate}: worst rel err {worst:.2e}");
        }
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gemm_f16_refuses_short_buffers_and_bad_shapes() {
    let ctx = gpu();
    let stream = ctx.new_stream().expect("stream");
    let w: DeviceBuffer<u16> = ctx.alloc(64 * 32).expect("alloc");
    let x: DeviceBuffer<u16> = ctx.alloc(4 * 32).expect("alloc");
    let mut y: DeviceBuffer<f32> = ctx.alloc(4 * 64).expect("alloc");
    let shape = GemmShape {
        m: 64,
        n: 4,
        k: 32,
        ldy: 64,
    };
    // Each buffer one element short in turn.
    let e = gemm_f16(&stream, &w, &x, &mut y, GemmShape { k: 33, ..shape }, false);
    assert!(matches!(e, Err(GpuError::BufferTooSmall { .. })), "{e:?}");
    let e = gemm_f16(&stream, &w, &x, &mut y, GemmShape { n: 5, ..shape }, false);
    assert!(matches!(e, Err(GpuError::BufferTooSmall { .. })), "{e:?}");
    let e = gemm_f16(
        &stream,
        &w,
        &x,
        &mut y,
        GemmShape { ldy: 65, ..shape },
        false,
    );
    assert!(matches!(e, Err(GpuError::BufferTooSmall { .. })), "{e:?}");
    let e = gemm_f16(
        &stream,
        &w,
        &x,
        &mut y,
        GemmShape { ldy: 63, ..shape },
        false,
    );
    assert!(matches!(e, Err(GpuError::Invalid { .. })), "{e:?}");
    let e = gemm_f16(&stream, &w, &x, &mut y, GemmShape { m: 0, ..shape }, false);
    assert!(matches!(e, Err(GpuError::Invalid { .. })), "{e:?}");
    gemm_f16(&stream, &w, &x, &mut y, shape, false).expect("the exact sizes run");
    stream.synchronize().expect("sync");
}
