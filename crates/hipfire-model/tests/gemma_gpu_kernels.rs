//! Gemma 3's GPU kernels in `kernels/decode.cu` (`geglu_f32`, `scale_f32`, `rms_norm_add_f32`,
//! `softcap_f32`), not launched by the GPU decoder yet: they compile for sm_90 with NVRTC (no
//! GPU needed) and are in the image (skips, saying so, without libnvrtc, unless CI's
//! `HIPFIRE_REQUIRE_NVRTC=1` says it must be there); on a GPU (an `#[ignore]`d test:
//! `--include-ignored` runs it) each matches an f64 reference of its formula on seeded random
//! rows, outputs poisoned first.

use std::sync::Arc;

use hipfire_gpu::{GpuError, LaunchArgs, Module, Stream};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::decode_module;

/// Threads per block of the elementwise launches and of `rms_norm_add_f32` (the decoder's).
const THREADS: u32 = 256;
/// Largest |gpu − f64| relative to max(|f64|, 1): f32 arithmetic (`tanhf`, `rsqrtf` within a few
/// ulp) over values of magnitude ≤ ~10, and a 640-term sum of squares in block order.
const REL_BOUND: f64 = 1e-5;

/// The Gemma 3 kernels of `decode.cu`.
const GEMMA_KERNEL_NAMES: [&str; 4] = ["geglu_f32", "scale_f32", "rms_norm_add_f32", "softcap_f32"];

#[test]
fn gemma_kernels_compile_for_sm90_with_nvrtc() {
    let src = &hipfire_model::gpu::DECODE_SOURCE;
    let image =
        match hipfire_gpu::cuda::nvrtc_compile(src.name, src.source, src.headers, "sm_90", &[]) {
            Ok(image) => image,
            Err(GpuError::NoGpu { reason }) => {
                assert!(
                    std::env::var("HIPFIRE_REQUIRE_NVRTC").as_deref() != Ok("1"),
                    "HIPFIRE_REQUIRE_NVRTC=1 but {reason}"
                );
                println!("skipped: {reason}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
    for n in GEMMA_KERNEL_NAMES {
        let needle = format!("{n}\0");
        assert!(
            image.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "decode.cu: kernel {n} missing"
        );
    }
}

fn launch(module: &Arc<Module>, stream: &Stream, name: &str, grid: u32, args: LaunchArgs) {
    gpu_harness::launch_kernel(module, stream, name, (grid, THREADS), args);
}

fn gelu_tanh_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gemma_kernels_match_f64_on_the_gpu() {
    let (ctx, module, stream) = decode_module();
    let mut r = ChaCha8Rng::seed_from_u64(0x9e33);
    // Gemma-3-270M's widths: 3 rows of d_model 640, of n_ff 2048.
    let (rows, d, ff) = (3usize, 640usize, 2048usize);
    let rand = |r: &mut ChaCha8Rng, n: usize, a: f32| -> Vec<f32> {
        (0..n).map(|_| r.random_range(-a..a)).collect()
    };
    let up = |x: &[f32]| {
        let mut b = ctx.alloc::<f32>(x.len()).expect("alloc");
        b.upload(&stream, x).expect("upload");
        b
    };
    let down = |b: &hipfire_gpu::DeviceBuffer<f32>, n: usize| {
        let mut v = vec![0f32; n];
        b.download(&stream, &mut v).expect("download");
        stream.synchronize().expect("sync");
        v
    };
    let grid = |n: usize| (n as u32).div_ceil(THREADS);

    // GeGLU over rows × n_ff, gate values past GELU's bend (±6).
    let n = rows * ff;
    let (g, u) = (rand(&mut r, n, 6.0), rand(&mut r, n, 2.0));
    let (gb, ub, ob) = (up(&g), up(&u), up(&vec![f32::NAN; n]));
    let args = LaunchArgs::new().buf(&gb).buf(&ub).buf(&ob).i32(n as i32);
    launch(&module, &stream, "geglu_f32", grid(n), args);
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| gelu_tanh_f64(f64::from(a)) * f64::from(b))
        .collect();
    let e = gpu_harness::worst(&down(&ob, n), &want);
    assert!(e < REL_BOUND, "geglu_f32: {e:e}");
    // And the CPU path's GeGLU, which the decoder's output must match.
    let mut cpu = g.clone();
    hipfire_model::ops::geglu_tanh(&mut cpu, &u);
    let e = gpu_harness::worst(&cpu, &want);
    assert!(e < REL_BOUND, "ops::geglu_tanh: {e:e}");

    // Embedding scale √640 and soft-cap 30 in place.
    for (name, arg, f) in [
        (
            "scale_f32",
            640f32.sqrt(),
            (|x: f64, a: f64| x * a) as fn(f64, f64) -> f64,
        ),
        ("softcap_f32", 30.0, |x: f64, a: f64| (x / a).tanh() * a),
    ] {
        let n = rows * d;
        let x = rand(&mut r, n, 60.0);
        let xb = up(&x);
        let args = LaunchArgs::new().buf(&xb).f32(arg).i32(n as i32);
        launch(&module, &stream, name, grid(n), args);
        let want: Vec<f64> = x.iter().map(|&v| f(f64::from(v), f64::from(arg))).collect();
        let e = gpu_harness::worst(&down(&xb, n), &want);
        assert!(e < REL_BOUND, "{name}: {e:e}");
    }

    // Post-norm + residual add: y[r] += rmsnorm(x[r]) · w, one block per row.
    let eps = 1e-6f32;
    let (x, w, y) = (
        rand(&mut r, rows * d, 4.0),
        rand(&mut r, d, 1.5),
        rand(&mut r, rows * d, 3.0),
    );
    let (xb, wb, yb) = (up(&x), up(&w), up(&y));
    let args = LaunchArgs::new()
        .buf(&xb)
        .buf(&wb)
        .buf(&yb)
        .i32(d as i32)
        .f32(eps);
    launch(&module, &stream, "rms_norm_add_f32", rows as u32, args);
    let want: Vec<f64> = x
        .chunks_exact(d)
        .zip(y.chunks_exact(d))
        .flat_map(|(xr, yr)| {
            let ms = xr.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + f64::from(eps)).sqrt();
            let w = &w;
            xr.iter()
                .zip(yr)
                .enumerate()
                .map(move |(i, (&a, &b))| f64::from(b) + f64::from(a) * inv * f64::from(w[i]))
        })
        .collect();
    let e = gpu_harness::worst(&down(&yb, rows * d), &want);
    assert!(e < REL_BOUND, "rms_norm_add_f32: {e:e}");
}
