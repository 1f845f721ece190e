//! The executor through its actors, without a GPU: `cpu` mode on the real pool, and the
//! `passback` split against the CPU-backed `SimulatedGpu` (CI tier).

use hipfire_exec::share::{plan_rows, Form, ShapeKey, ShareSetting};
use hipfire_exec::{
    CpuPool, ExecError, GpuHandle, JoinKind, OffloadExec, PlannerConfig, PlannerHandle, Refusal,
    Residency, Route, SimulatedGpu, Step, WeightView,
};
use hipfire_quant::{gemv_rows_scalar, ActivationBuf, Format};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Seeded random `m × k` weight in `fmt` (rows quantised from uniform [-1, 1)).
fn weight(fmt: Format, k: usize, m: usize, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut w = Vec::new();
    for _ in 0..m {
        let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        w.extend(hipfire_quant::quantize_row(fmt, &row).expect("quantise"));
    }
    w
}

fn vector(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn cfg(mode: OffloadExec, share: ShareSetting, trace: bool) -> PlannerConfig {
    PlannerConfig {
        mode,
        share,
        join: JoinKind::Ordering,
        trace,
    }
}

/// A shape above the minimum split size: q4_0, k = 1024 (576 B rows), m = 4096 → 2.25 MiB.
const K: usize = 1024;
const M: usize = 4096;

#[test]
fn cpu_mode_through_actors_matches_pool() {
    let pool = CpuPool::new(2).expect("pool");
    let planner = PlannerHandle::spawn(
        cfg(OffloadExec::Cpu, ShareSetting::Auto, true),
        pool.clone(),
        None,
    )
    .expect("planner");
    for (i, fmt) in [
        Format::Q4_0,
        Format::Q8_0,
        Format::Q4K,
        Format::Hfq4G256,
        Format::F16,
    ]
    .into_iter()
    .enumerate()
    {
        let (k, m) = (256usize, 97usize);
        let w = weight(fmt, k, m, 10 + i as u64);
        let x = vector(k, 20 + i as u64);
        let mut want = vec![f32::NAN; m];
        pool.gemv(fmt, &w, k, &x, &mut want, false).expect("pool");
        let view = WeightView::spilled(fmt, m, k, &w, None).expect("view");
        let mut y = vec![f32::NAN; m];
        let rep = planner
            .run(Step::Gemv {
                w: view,
                x: &x,
                y: &mut y,
            })
            .expect("run");
        assert_eq!(rep.route, Route::Cpu);
        assert_eq!(bits(&y), bits(&want), "{fmt}");
        // First call of a shape prints its line (and, at step counts 1, 2, 4, ..., the idle window).
        assert!(
            rep.trace.iter().any(
                |l| l.starts_with("cpu exec: step gemv") && l.contains(&format!("quant={fmt}"))
            ),
            "{:?}",
            rep.trace
        );

        // Residual form accumulates.
        let base = vector(m, 30 + i as u64);
        let mut want_r = base.clone();
        pool.gemv(fmt, &w, k, &x, &mut want_r, true).expect("pool");
        let mut r = base.clone();
        planner
            .run(Step::GemvResidual {
                w: view,
                x: &x,
                residual: &mut r,
            })
            .expect("run");
        assert_eq!(bits(&r), bits(&want_r), "{fmt} residual");
    }
}

#[test]
fn cpu_mode_trace_counts_powers_of_two() {
    let pool = CpuPool::new(1).expect("pool");
    let planner = PlannerHandle::spawn(cfg(OffloadExec::Cpu, ShareSetting::Auto, true), pool, None)
        .expect("planner");
    let (k, m) = (64usize, 16usize);
    let w = weight(Format::Q8_0, k, m, 1);
    let x = vector(k, 2);
    let view = WeightView::spilled(Format::Q8_0, m, k, &w, None).expect("view");
    let mut shape_lines = Vec::new();
    let mut idle_lines = Vec::new();
    for call in 1..=9u64 {
        let mut y = vec![0.0; m];
        let rep = planner
            .run(Step::Gemv {
                w: view,
                x: &x,
                y: &mut y,
            })
            .expect("run");
        if rep.trace.iter().any(|l| l.starts_with("cpu exec: step")) {
            shape_lines.push(call);
        }
        if rep.trace.iter().any(|l| l.starts_with("cpu exec: idle")) {
            idle_lines.push(call);
        }
    }
    assert_eq!(shape_lines, vec![1, 2, 4, 8]);
    assert_eq!(idle_lines, vec![1, 2, 4, 8]);
    // Trace off: no lines.
    let quiet = PlannerHandle::spawn(
        cfg(OffloadExec::Cpu, ShareSetting::Auto, false),
        CpuPool::new(1).expect("pool"),
        None,
    )
    .expect("planner");
    let mut y = vec![0.0; m];
    assert!(quiet
        .run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut y
        })
        .expect("run")
        .trace
        .is_empty());
}

#[test]
fn cpu_only_executor_refuses_gpu_work() {
    let pool = CpuPool::new(1).expect("pool");
    for mode in [OffloadExec::Pcie, OffloadExec::Passback] {
        assert!(matches!(
            PlannerHandle::spawn(cfg(mode, ShareSetting::Auto, false), pool.clone(), None),
            Err(ExecError::Invalid { .. })
        ));
    }
    let planner = PlannerHandle::spawn(
        cfg(OffloadExec::Cpu, ShareSetting::Auto, false),
        pool.clone(),
        None,
    )
    .expect("planner");
    let w = weight(Format::Q8_0, 64, 4, 3);
    let x = vector(64, 4);
    let mut view = WeightView::spilled(Format::Q8_0, 4, 64, &w, None).expect("view");
    view.residency = Residency::Resident;
    let mut y = vec![0.0; 4];
    assert!(matches!(
        planner.run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut y
        }),
        Err(ExecError::Gpu(_))
    ));
    // A short output is an error, not a panic.
    let view = WeightView::spilled(Format::Q8_0, 4, 64, &w, None).expect("view");
    let mut short = vec![0.0; 3];
    assert!(matches!(
        planner.run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut short
        }),
        Err(ExecError::Shape { .. })
    ));
    // A wrong-length activation is an error before any engine runs.
    let mut y = vec![0.0; 4];
    assert!(matches!(
        planner.run(Step::Gemv {
            w: view,
            x: &x[..32],
            y: &mut y
        }),
        Err(ExecError::Shape { what: "x", .. })
    ));
    // Strategies that need device operands are refused up front.
    let gpu = GpuHandle::spawn(Box::new(SimulatedGpu::new())).expect("gpu");
    for join in [JoinKind::TwoStream, JoinKind::Flags] {
        let c = PlannerConfig {
            join,
            ..cfg(OffloadExec::Passback, ShareSetting::Auto, false)
        };
        assert!(PlannerHandle::spawn(c, pool.clone(), Some(gpu.clone())).is_err());
    }
}

/// Whole-matrix results of both engines for the split checks.
fn references(
    fmt: Format,
    w: &[u8],
    x: &[f32],
    base: &[f32],
    accumulate: bool,
) -> (Vec<f32>, Vec<f32>) {
    let pool = CpuPool::new(2).expect("pool");
    let mut cpu = base.to_vec();
    pool.gemv(fmt, w, K, x, &mut cpu, accumulate).expect("pool");
    let act = ActivationBuf::prepare(fmt, x).expect("act");
    let mut gpu = base.to_vec();
    gemv_rows_scalar(fmt, w, K, &act, &mut gpu, accumulate).expect("scalar");
    (cpu, gpu)
}

#[test]
fn passback_split_is_bit_exact_per_arm() {
    let fmt = Format::Q4_0;
    let w = weight(fmt, K, M, 5);
    let x = vector(K, 6);
    let pool = CpuPool::new(2).expect("pool");
    let gpu = GpuHandle::spawn(Box::new(SimulatedGpu::new())).expect("gpu");
    let planner = PlannerHandle::spawn(
        cfg(OffloadExec::Passback, ShareSetting::Auto, true),
        pool,
        Some(gpu),
    )
    .expect("planner");
    let view = WeightView::spilled(fmt, M, K, &w, None).expect("view");
    let (cpu_ref, gpu_ref) = references(fmt, &w, &x, &vec![0.0; M], false);
    let mut saw_split_line = false;
    for call in 0..40 {
        let mut y = vec![f32::NAN; M];
        let rep = planner
            .run(Step::Gemv {
                w: view,
                x: &x,
                y: &mut y,
            })
            .expect("run");
        let Route::Split { g } = rep.route else {
            panic!("call {call}: not split: {:?}", rep.route)
        };
        assert_eq!(g % 16, 0);
        assert_eq!(bits(&y[..g]), bits(&gpu_ref[..g]), "gpu arm, call {call}");
        assert_eq!(bits(&y[g..]), bits(&cpu_ref[g..]), "cpu arm, call {call}");
        saw_split_line |= rep
            .trace
            .iter()
            .any(|l| l.starts_with("split: step gemv") && l.contains("gpu_rows="));
    }
    assert!(saw_split_line);
    let snap = planner
        .snapshot(ShapeKey {
            format: fmt,
            k: K,
            form: Form::Plain,
        })
        .expect("snapshot")
        .expect("seeded");
    assert_eq!(snap.samples, 40);
    assert!(snap.windows >= 9);
}

#[test]
fn passback_residual_and_pinned_share() {
    let fmt = Format::Q8_0;
    let w = weight(fmt, K, M, 7);
    let x = vector(K, 8);
    let base = vector(M, 9);
    let gpu = GpuHandle::spawn(Box::new(SimulatedGpu::new())).expect("gpu");
    let planner = PlannerHandle::spawn(
        cfg(OffloadExec::Passback, ShareSetting::Pinned(0.25), false),
        CpuPool::new(2).expect("pool"),
        Some(gpu),
    )
    .expect("planner");
    let view = WeightView::spilled(fmt, M, K, &w, None).expect("view");
    let (cpu_ref, gpu_ref) = references(fmt, &w, &x, &base, true);
    let mut r = base.clone();
    let rep = planner
        .run(Step::GemvResidual {
            w: view,
            x: &x,
            residual: &mut r,
        })
        .expect("run");
    let g = plan_rows(M, fmt.row_bytes(K).expect("k"), 0.25).expect("splits");
    assert_eq!(rep.route, Route::Split { g });
    assert_eq!(bits(&r[..g]), bits(&gpu_ref[..g]));
    assert_eq!(bits(&r[g..]), bits(&cpu_ref[g..]));
}

#[test]
fn share_zero_is_byte_identical_to_cpu_mode() {
    let fmt = Format::Q4K;
    let w = weight(fmt, K, M, 11);
    let x = vector(K, 12);
    let pool = CpuPool::new(2).expect("pool");
    let gpu = GpuHandle::spawn(Box::new(SimulatedGpu::new())).expect("gpu");
    let off = PlannerHandle::spawn(
        cfg(OffloadExec::Passback, ShareSetting::Off, false),
        pool.clone(),
        Some(gpu),
    )
    .expect("planner");
    let cpu = PlannerHandle::spawn(cfg(OffloadExec::Cpu, ShareSetting::Auto, false), pool, None)
        .expect("planner");
    let view = WeightView::spilled(fmt, M, K, &w, None).expect("view");
    let (mut a, mut b) = (vec![f32::NAN; M], vec![f32::NAN; M]);
    assert_eq!(
        off.run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut a
        })
        .expect("off")
        .route,
        Route::Cpu
    );
    assert_eq!(
        cpu.run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut b
        })
        .expect("cpu")
        .route,
        Route::Cpu
    );
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn refused_steps_run_whole_on_cpu_and_say_why() {
    let pool = CpuPool::new(2).expect("pool");
    // A GPU without a Q8_0 residual kernel (the reference system's case).
    let sim = SimulatedGpu {
        residual_kernels: vec![Format::Q4_0],
        ..SimulatedGpu::new()
    };
    let gpu = GpuHandle::spawn(Box::new(sim)).expect("gpu");
    let planner = PlannerHandle::spawn(
        cfg(OffloadExec::Passback, ShareSetting::Auto, true),
        pool.clone(),
        Some(gpu),
    )
    .expect("planner");

    let w = weight(Format::Q8_0, K, M, 13);
    let x = vector(K, 14);
    let base = vector(M, 15);
    let view = WeightView::spilled(Format::Q8_0, M, K, &w, None).expect("view");
    let mut want = base.clone();
    pool.gemv(Format::Q8_0, &w, K, &x, &mut want, true)
        .expect("pool");
    let mut r = base.clone();
    let rep = planner
        .run(Step::GemvResidual {
            w: view,
            x: &x,
            residual: &mut r,
        })
        .expect("run");
    assert_eq!(rep.route, Route::Cpu);
    assert_eq!(
        rep.refusal,
        Some(Refusal::NoGpuResidualKernel {
            format: Format::Q8_0
        })
    );
    assert!(
        rep.trace
            .iter()
            .any(|l| l.contains("refused: residual form: no GPU residual kernel for q8_0")),
        "{:?}",
        rep.trace
    );
    assert_eq!(bits(&r), bits(&want));

    // Under the minimum split size (the 9B's m=32 shape).
    let small = weight(Format::Q4_0, K, 32, 16);
    let view = WeightView::spilled(Format::Q4_0, 32, K, &small, None).expect("view");
    let mut y = vec![f32::NAN; 32];
    let rep = planner
        .run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut y,
        })
        .expect("run");
    assert_eq!(rep.route, Route::Cpu);
    assert!(matches!(rep.refusal, Some(Refusal::UnderMinSplit { .. })));
    assert!(y.iter().all(|v| v.is_finite()));

    // Padded rows: refused, and the CPU still computes the right rows.
    let rb = Format::Q4_0.row_bytes(K).expect("k");
    let packed = weight(Format::Q4_0, K, M, 17);
    let mut padded = vec![0x77u8; M * (rb + 64)];
    for r in 0..M {
        padded[r * (rb + 64)..][..rb].copy_from_slice(&packed[r * rb..][..rb]);
    }
    let mut view = WeightView::spilled(Format::Q4_0, M, K, &padded, None).expect("view");
    view.row_stride = rb + 64;
    let mut y = vec![f32::NAN; M];
    let rep = planner
        .run(Step::Gemv {
            w: view,
            x: &x,
            y: &mut y,
        })
        .expect("run");
    assert!(matches!(rep.refusal, Some(Refusal::PaddedRowStride { .. })));
    let mut want = vec![f32::NAN; M];
    pool.gemv(Format::Q4_0, &packed, K, &x, &mut want, false)
        .expect("pool");
    assert_eq!(bits(&y), bits(&want));
}
