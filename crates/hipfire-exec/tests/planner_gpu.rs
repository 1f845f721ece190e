//! GPU tier: the planner's actor path on a real device through `MappedGpuEngine`.
//! Runs only with `HIPFIRE_GPU_TESTS=1` (prints why it skipped otherwise).

use hipfire_exec::mapped_gpu::MappedGpuEngine;
use hipfire_exec::share::{Form, Seed, ShapeKey, ShareSetting};
use hipfire_exec::{
    CpuPool, GpuHandle, JoinKind, OffloadExec, PlannerConfig, PlannerHandle, Route, Step,
    WeightView,
};
use hipfire_quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

fn gpu_enabled() -> bool {
    let on = std::env::var(hipfire_gpu::GPU_TESTS_ENV)
        .map(|v| v == "1")
        .unwrap_or(false);
    if !on {
        eprintln!(
            "skipped: set {}=1 to run the GPU tier",
            hipfire_gpu::GPU_TESTS_ENV
        );
    }
    on
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn cfg(mode: OffloadExec, share: ShareSetting) -> PlannerConfig {
    PlannerConfig {
        mode,
        share,
        join: JoinKind::Ordering,
        trace: true,
    }
}

#[test]
fn passback_on_device_per_arm_parity() -> Result<(), Box<dyn std::error::Error>> {
    if !gpu_enabled() {
        return Ok(());
    }
    let ctx = hipfire_gpu::Context::new(0)?;
    let (k, m) = (4096usize, 4096usize);
    let pool = CpuPool::new(0)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0x6e0);
    for fmt in [
        Format::Q4_0,
        Format::Q8_0,
        Format::Q4K,
        Format::Q6K,
        Format::Hfq4G256,
    ] {
        let rb = fmt.row_bytes(k)?;
        let mut buf = ctx.alloc_host_mapped(m * rb)?;
        for r in 0..m {
            let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            buf.as_mut_slice()[r * rb..(r + 1) * rb]
                .copy_from_slice(&hipfire_quant::quantize_row(fmt, &row)?);
        }
        let buf = Arc::new(buf);
        let mut engine = MappedGpuEngine::new(&ctx, k, m)?;
        let id = engine.add_weight(buf.clone());
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let view = WeightView::spilled(fmt, m, k, buf.as_slice(), Some(id))?;
        let gpu = GpuHandle::spawn(Box::new(engine))?;
        let pcie = PlannerHandle::spawn(
            cfg(OffloadExec::Pcie, ShareSetting::Auto),
            pool.clone(),
            Some(gpu.clone()),
        )?;
        let cpu = PlannerHandle::spawn(
            cfg(OffloadExec::Cpu, ShareSetting::Auto),
            pool.clone(),
            None,
        )?;
        let pinned = PlannerHandle::spawn(
            cfg(OffloadExec::Passback, ShareSetting::Pinned(0.375)),
            pool.clone(),
            Some(gpu.clone()),
        )?;
        let off = PlannerHandle::spawn(
            cfg(OffloadExec::Passback, ShareSetting::Off),
            pool.clone(),
            Some(gpu.clone()),
        )?;
        let auto = PlannerHandle::spawn(
            cfg(OffloadExec::Passback, ShareSetting::Auto),
            pool.clone(),
            Some(gpu),
        )?;

        let mut g_whole = vec![f32::NAN; m];
        assert_eq!(
            pcie.run(Step::Gemv {
                w: view,
                x: &x,
                y: &mut g_whole
            })?
            .route,
            Route::Gpu
        );
        let mut c_whole = vec![f32::NAN; m];
        assert_eq!(
            cpu.run(Step::Gemv {
                w: view,
                x: &x,
                y: &mut c_whole
            })?
            .route,
            Route::Cpu
        );
        let mut y = vec![f32::NAN; m];
        let rep = pinned.run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut y,
        })?;
        let Route::Split { g } = rep.route else {
            panic!("{fmt}: pinned share did not split: {:?}", rep.refusal)
        };
        assert_eq!(
            bits(&y[..g]),
            bits(&g_whole[..g]),
            "{fmt}: GPU arm vs GPU whole"
        );
        assert_eq!(
            bits(&y[g..]),
            bits(&c_whole[g..]),
            "{fmt}: CPU arm vs CPU whole"
        );
        let mut z = vec![f32::NAN; m];
        off.run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut z,
        })?;
        assert_eq!(bits(&z), bits(&c_whole), "{fmt}: share 0 vs cpu");
        // The engines differ by the CPU's 8-bit activation only: per row at most
        // Σ|w_i|·amax(x)/254 (hipfire_quant's documented bound), plus f32 summation slack.
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
        let mut wrow = vec![0f64; k];
        let mut worst_ratio = 0f64;
        for r in 0..m {
            hipfire_quant::dequantize_row_f64(
                fmt,
                &buf.as_slice()[r * rb..(r + 1) * rb],
                &mut wrow,
            )?;
            let l1: f64 = wrow.iter().map(|v| v.abs()).sum();
            let dot_l1: f64 = wrow
                .iter()
                .zip(&x)
                .map(|(w, v)| (w * f64::from(*v)).abs())
                .sum();
            let bound = 1.5 * l1 * amax / 254.0 + 1e-5 * dot_l1;
            let diff = (f64::from(g_whole[r]) - f64::from(c_whole[r])).abs();
            worst_ratio = worst_ratio.max(diff / bound);
        }
        eprintln!("{fmt}: worst |gpu - cpu| / bound = {worst_ratio:.3}");
        assert!(
            worst_ratio <= 1.0,
            "{fmt}: engines disagree beyond the activation-rounding bound ({worst_ratio:.3}×)"
        );
        // Residual form and the scheduler on the device.
        let base: Vec<f32> = (0..m).map(|i| (i % 7) as f32 - 3.0).collect();
        for _ in 0..64 {
            let mut r = base.clone();
            let rep = auto.run(Step::GemvResidual {
                w: view,
                x: &x,
                residual: &mut r,
            })?;
            for l in rep.trace {
                eprintln!("{l}");
            }
        }
        let snap = auto
            .snapshot(ShapeKey {
                format: fmt,
                k,
                form: Form::Residual,
            })?
            .ok_or("no scheduler state")?;
        eprintln!("{fmt}: {snap:?}");
        assert_eq!(snap.seed, Seed::Probe, "{fmt}: probe failed on the device");
    }
    Ok(())
}
