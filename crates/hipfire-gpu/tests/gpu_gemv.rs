//! GPU tier: every GEMV kernel against an f64 reference, row-range parity, poisoned outputs,
//! host-mapped vs device weights, typed errors, the registry and async copies.
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` runs them
//! (`scripts/device-check.sh run`).

mod common;

use common::{
    check_rows, dequant_f64, gpu, place, random_weights, random_x, rng, uses_int8_activation,
};
use hipfire_gpu::gemv::DeviceGemv;
use hipfire_gpu::{
    Activation, Context, GemvConfig, GemvForm, GemvKernels, GpuError, KernelRegistry, RowRange,
    Stream, WeightRef, GEMV_SOURCE,
};
use hipfire_quant::Format;
use std::sync::Arc;

/// Quiet NaN bit pattern used to poison outputs: any row left unwritten keeps exactly these bits.
const POISON: u32 = 0x7FC0_0000;

struct Gpu {
    ctx: Arc<Context>,
    stream: Stream,
    kernels: GemvKernels,
    registry: KernelRegistry,
}

/// A shape with the tiles of each row group split over 4 warps (the cross-warp reduction path).
const KSPLIT_CONFIG: GemvConfig = GemvConfig {
    warps: 4,
    rows_per_warp: 1,
    ksplit: 4,
    min_blocks: 1,
    device: None,
    tensor_cores: false,
};

/// The default general shape with the other device-resident kernel variant (x read from global
/// memory one tile ahead) and an odd block shape (3 warps × 3 rows: partial blocks, idle warps).
const DEV_XREG_CONFIG: GemvConfig = GemvConfig {
    warps: 4,
    rows_per_warp: 2,
    ksplit: 1,
    min_blocks: 1,
    device: Some(DeviceGemv {
        warps: 3,
        rows_per_warp: 3,
        x_in_shared: false,
        min_rows: 0,
    }),
    tensor_cores: false,
};

/// The default general shape, device weights through the general kernel too.
const NODEV_CONFIG: GemvConfig = GemvConfig {
    warps: 4,
    rows_per_warp: 2,
    ksplit: 1,
    min_blocks: 1,
    device: None,
    tensor_cores: false,
};

fn setup() -> Gpu {
    let ctx = gpu();
    let dir = std::env::temp_dir().join(format!("hipfire-gpu-tests-{}", std::process::id()));
    let registry = KernelRegistry::with_cache_dir(&ctx, dir);
    let kernels = GemvKernels::new(&registry).expect("GEMV module compiles and loads");
    let stream = ctx.new_stream().expect("stream");
    Gpu {
        ctx,
        stream,
        kernels,
        registry,
    }
}

/// The default kernels, the k-split shape and the other device-resident variant, all under test.
fn all_kernels(g: &Gpu) -> Vec<GemvKernels> {
    let mut v = vec![GemvKernels::new(&g.registry).expect("default shape")];
    for c in [KSPLIT_CONFIG, DEV_XREG_CONFIG] {
        if GemvConfig::default() != c {
            v.push(GemvKernels::with_config(&g.registry, c).expect("test shape"));
        }
    }
    v
}

/// Runs one launch on `y0` (uploaded first), returns y.
fn run(
    g: &Gpu,
    kern: &GemvKernels,
    w: &WeightRef<'_>,
    act: &Activation,
    y0: &[f32],
    rows: RowRange,
    form: GemvForm,
) -> Vec<f32> {
    let mut y = g.ctx.alloc::<f32>(y0.len()).expect("y");
    y.upload(&g.stream, y0).expect("y upload");
    kern.gemv(&g.stream, w, act, &mut y, rows, form)
        .expect("launch");
    let mut out = vec![0f32; y0.len()];
    y.download(&g.stream, &mut out).expect("y download");
    out
}

/// The activation the kernels actually multiplied by (x itself for the float formats) and the
/// quantisation step d of each element's block.
fn effective_x(g: &Gpu, act: &Activation, x: &[f32], format: Format) -> (Vec<f64>, Vec<f64>) {
    if !uses_int8_activation(format) {
        return (x.iter().map(|&v| v as f64).collect(), vec![0.0; x.len()]);
    }
    let mut q = vec![0i8; act.k()];
    let mut ds = vec![0f32; 2 * act.k() / 32];
    act.quantized().download(&g.stream, &mut q).expect("qs");
    act.scales().download(&g.stream, &mut ds).expect("ds");
    let d: Vec<f64> = (0..act.k()).map(|j| ds[2 * (j / 32)] as f64).collect();
    ((0..act.k()).map(|j| d[j] * q[j] as f64).collect(), d)
}

fn prepare(g: &Gpu, x: &[f32]) -> Activation {
    let mut xd = g.ctx.alloc::<f32>(x.len()).expect("x");
    xd.upload(&g.stream, x).expect("x upload");
    let mut act = Activation::new(&g.ctx, x.len()).expect("activation");
    g.kernels
        .prepare(&g.stream, &xd, &mut act)
        .expect("prepare");
    g.stream.synchronize().expect("sync");
    act
}

fn shapes(format: Format) -> Vec<(usize, usize)> {
    // (m, k): a 16-byte-row shape with odd m; one block-row shape; and for 32-element and float
    // formats k = 96, whose rows are only 2- or 4-byte aligned (the narrow-load instantiations).
    let mut s = vec![(67, 2048), (33, 256)];
    if format.block_elems() <= 32 {
        s.push((17, 96));
    }
    s
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_every_format_matches_f64_reference_on_both_memories() {
    let g = setup();
    let kernels = all_kernels(&g);
    let mut r = rng(0x5EED_0001);
    for format in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
        for (m, k) in shapes(format) {
            let wbytes = random_weights(format, m, k, &mut r);
            let x = random_x(k, &mut r);
            let y0 = random_x(m, &mut r);
            let act = prepare(&g, &x);
            let (xhat, dstep) = effective_x(&g, &act, &x, format);
            for (form, kern) in [GemvForm::Plain, GemvForm::Residual]
                .into_iter()
                .flat_map(|f| kernels.iter().map(move |k| (f, k)))
            {
                let mut outs = Vec::new();
                for host in [false, true] {
                    let placed = place(&g.ctx, &g.stream, &wbytes, host);
                    let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("weight view");
                    let y = run(&g, kern, &w, &act, &y0, RowRange::all(m), form);
                    let worst = check_rows(format, &wbytes, k, &x, &xhat, &dstep, &y0, &y, form);
                    let shape = kern.config().label();
                    println!("{format:>9} m={m:<3} k={k:<5} {form:?} shape={shape} host={host}: worst error {worst:.3} of bound");
                    outs.push(y);
                }
                let bits = |v: &Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&outs[0]),
                    bits(&outs[1]),
                    "{format} {form:?}: host-mapped and device results differ"
                );
            }
        }
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_row_ranges_are_bit_exact_and_write_only_their_rows() {
    let g = setup();
    let kernels = all_kernels(&g);
    let mut r = rng(0x5EED_0002);
    let m = 257;
    for format in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
        for k in [2048, 96] {
            if format.row_bytes(k).is_err() {
                continue;
            }
            let wbytes = random_weights(format, m, k, &mut r);
            let x = random_x(k, &mut r);
            let act = prepare(&g, &x);
            let placed = place(&g.ctx, &g.stream, &wbytes, false);
            let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("view");
            let poison = vec![f32::from_bits(POISON); m];
            for (form, kern) in [GemvForm::Plain, GemvForm::Residual]
                .into_iter()
                .flat_map(|f| kernels.iter().map(move |k| (f, k)))
            {
                let y0 = if form == GemvForm::Plain {
                    poison.clone()
                } else {
                    random_x(m, &mut r)
                };
                let full = run(&g, kern, &w, &act, &y0, RowRange::all(m), form);
                let g_split = 100;
                for (a, b) in [
                    (0, g_split),
                    (g_split, m),
                    (1, 2),
                    (37, 102),
                    (255, 257),
                    (0, 1),
                    (128, 129),
                    (3, 254),
                ] {
                    // Poison everything; for the residual form the rows in range start from y0.
                    let start: Vec<f32> = (0..m)
                        .map(|i| {
                            if (a..b).contains(&i) {
                                y0[i]
                            } else {
                                f32::from_bits(POISON)
                            }
                        })
                        .collect();
                    let y = run(&g, kern, &w, &act, &start, RowRange::new(a, b), form);
                    for i in 0..m {
                        if (a..b).contains(&i) {
                            assert_eq!(y[i].to_bits(), full[i].to_bits(), "{format} k={k} {form:?} [{a},{b}) row {i} differs from the full launch");
                        } else {
                            assert_eq!(
                                y[i].to_bits(),
                                POISON,
                                "{format} k={k} {form:?} [{a},{b}) wrote row {i} outside its range"
                            );
                        }
                    }
                }
                // The two arms of a split together equal the whole launch.
                let mut yd = g.ctx.alloc::<f32>(m).expect("y");
                yd.upload(&g.stream, &y0).expect("up");
                kern.gemv(
                    &g.stream,
                    &w,
                    &act,
                    &mut yd,
                    RowRange::new(0, g_split),
                    form,
                )
                .expect("arm 1");
                kern.gemv(
                    &g.stream,
                    &w,
                    &act,
                    &mut yd,
                    RowRange::new(g_split, m),
                    form,
                )
                .expect("arm 2");
                let mut y = vec![0f32; m];
                yd.download(&g.stream, &mut y).expect("down");
                assert!(
                    y.iter().zip(&full).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{format} {form:?}: split != whole"
                );
            }
        }
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_bad_launches_are_typed_errors() {
    let g = setup();
    let mut r = rng(0x5EED_0003);
    let (m, k) = (64, 256);
    let format = Format::Q4K;
    let wbytes = random_weights(format, m, k, &mut r);
    let placed = place(&g.ctx, &g.stream, &wbytes, false);
    let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("view");
    let act = prepare(&g, &random_x(k, &mut r));
    let mut y = g.ctx.alloc::<f32>(m).expect("y");
    let k = &g.kernels;
    let s = &g.stream;
    let e = k
        .gemv(
            s,
            &w,
            &act,
            &mut y,
            RowRange::new(0, m + 1),
            GemvForm::Plain,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            GpuError::BadRowRange {
                start: 0,
                end: 65,
                m: 64
            }
        ),
        "{e}"
    );
    let e = k
        .gemv(s, &w, &act, &mut y, RowRange::new(5, 5), GemvForm::Plain)
        .unwrap_err();
    assert!(matches!(e, GpuError::BadRowRange { .. }), "{e}");
    let mut short = g.ctx.alloc::<f32>(m - 1).expect("short y");
    let e = k
        .gemv(
            s,
            &w,
            &act,
            &mut short,
            RowRange::new(0, 1),
            GemvForm::Plain,
        )
        .unwrap_err();
    assert!(
        matches!(e, GpuError::BufferTooSmall { what: "y", .. }),
        "{e}"
    );
    let other = prepare(&g, &random_x(512, &mut r));
    let e = k
        .gemv(s, &w, &other, &mut y, RowRange::all(m), GemvForm::Plain)
        .unwrap_err();
    assert!(
        matches!(
            e,
            GpuError::ActivationMismatch {
                need: 256,
                got: 512
            }
        ),
        "{e}"
    );
    let e = WeightRef::new(placed.mem(), 0, format, m + 1, 256).unwrap_err();
    assert!(
        matches!(e, GpuError::BufferTooSmall { what: "weight", .. }),
        "{e}"
    );
    let e = WeightRef::new(placed.mem(), 0, format, m, 100).unwrap_err();
    assert!(matches!(e, GpuError::Quant(_)), "{e}");
    // A weight view at an odd byte offset cannot be read with any load width the kernels have.
    let big = place(&g.ctx, &g.stream, &vec![1u8; wbytes.len() + 1], false);
    let wodd = WeightRef::new(big.mem(), 1, format, m, 256).expect("odd view");
    let e = k
        .gemv(s, &wodd, &act, &mut y, RowRange::all(m), GemvForm::Plain)
        .unwrap_err();
    assert!(matches!(e, GpuError::Misaligned { .. }), "{e}");
    // Nothing above queued work that faults.
    s.synchronize()
        .expect("stream healthy after refused launches");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_registry_compiles_once_under_concurrency_and_caches_on_disk() {
    let ctx = gpu();
    let dir = std::env::temp_dir().join(format!("hipfire-gpu-reg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let registry = KernelRegistry::with_cache_dir(&ctx, &dir);
    let opts = vec!["-DHF_ROWS=1".to_string()];
    let mods: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| registry.module(&GEMV_SOURCE, &opts).expect("module")))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    assert!(
        mods.windows(2).all(|p| Arc::ptr_eq(&p[0], &p[1])),
        "one module shared by all first users"
    );
    let files: Vec<_> = std::fs::read_dir(&dir)
        .expect("cache dir")
        .filter_map(|e| e.ok())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "exactly one cached image, no temp files: {files:?}"
    );
    // A second registry (a new process, in effect) loads from disk and gets a working module.
    let t0 = std::time::Instant::now();
    let again = KernelRegistry::with_cache_dir(&ctx, &dir)
        .module(&GEMV_SOURCE, &opts)
        .expect("cached module");
    again
        .function("gemv_q4_k_plain_v16")
        .expect("kernel present");
    println!("cached module load: {:?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_async_copies_events_and_cross_stream_wait() {
    let ctx = gpu();
    let mut r = rng(0x5EED_0004);
    let n = 1 << 20;
    let a = ctx.new_stream().expect("a");
    let b = ctx.new_stream().expect("b");
    let mut src = ctx.alloc_pinned_host(n).expect("src");
    let data: Vec<u8> = (0..n).map(|_| rand::Rng::random::<u8>(&mut r)).collect();
    src.as_mut_slice().copy_from_slice(&data);
    let mut dst = ctx.alloc_pinned_host(n).expect("dst");
    let mut dev = ctx.alloc::<u8>(n).expect("dev");
    let (e0, e1) = (ctx.new_event().expect("e0"), ctx.new_event().expect("e1"));
    e0.record(&a).expect("record");
    a.memcpy_htod_async(&mut dev, 0, &src, 0, n).expect("htod");
    e1.record(&a).expect("record");
    b.wait_event(&e1).expect("wait");
    b.memcpy_dtoh_async(&mut dst, 0, &dev, 0, n).expect("dtoh");
    b.synchronize().expect("sync");
    assert_eq!(dst.as_slice(), &data[..], "round trip through two streams");
    let ms = e0.elapsed_ms(&e1).expect("elapsed");
    assert!(ms > 0.0 && ms.is_finite(), "event time {ms}");
    let e = a.memcpy_htod_async(&mut dev, 1, &src, 0, n).unwrap_err();
    assert!(matches!(e, GpuError::BufferTooSmall { .. }), "{e}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_and_cpu_engines_agree_within_the_quantisation_bound() {
    let g = setup();
    let mut r = rng(0x5EED_0005);
    let (m, k) = (64, 4096);
    for format in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
        let wbytes = random_weights(format, m, k, &mut r);
        let x = random_x(k, &mut r);
        let act = prepare(&g, &x);
        let placed = place(&g.ctx, &g.stream, &wbytes, true);
        let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("view");
        let y_gpu = run(
            &g,
            &g.kernels,
            &w,
            &act,
            &vec![0.0; m],
            RowRange::all(m),
            GemvForm::Plain,
        );
        let cpu_act = hipfire_quant::ActivationBuf::prepare(format, &x).expect("cpu activation");
        let mut y_cpu = vec![0f32; m];
        hipfire_quant::gemv_rows(format, &wbytes, k, &cpu_act, &mut y_cpu, false)
            .expect("cpu gemv");
        // Each engine quantises x on its own (the GPU per 32 elements, the CPU per 32 or 256), so
        // each differs from W·x by at most Σ|w|·d/2 with d <= max|x| over 256 elements / 127.
        let rb = format.row_bytes(k).expect("rb");
        let mut worst = 0f64;
        for (i, row) in wbytes.chunks_exact(rb).enumerate() {
            let wf = dequant_f64(format, row, k);
            let mut bound = 0f64;
            let mut abs = 0f64;
            for (c, chunk) in wf.chunks(256).enumerate() {
                let xs = &x[c * 256..c * 256 + chunk.len()];
                let d = xs.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                bound += chunk.iter().map(|v| v.abs()).sum::<f64>() * d; // (d/2) per engine, two engines
                abs += chunk
                    .iter()
                    .zip(xs)
                    .map(|(a, &b)| (a * b as f64).abs())
                    .sum::<f64>();
            }
            let bound = bound * 1.01 + 1e-4 * abs;
            let diff = (y_gpu[i] as f64 - y_cpu[i] as f64).abs();
            assert!(
                diff <= bound,
                "{format} row {i}: |gpu - cpu| = {diff:e} > {bound:e}"
            );
            worst = worst.max(diff / abs.max(1e-30));
        }
        println!("{format:>9}: max |gpu - cpu| / sum|w x| = {worst:.2e}");
    }
}

/// The device-resident Q4_K/Q6_K kernels (both variants, several block shapes) against the general
/// kernel over the same device weights: bit-identical rows, at row counts large enough for
/// multi-warp blocks with partial last blocks, for row ranges too, and within the f64 bound.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_device_kernels_match_the_general_kernel_bit_for_bit() {
    let g = setup();
    let general = GemvKernels::with_config(&g.registry, NODEV_CONFIG).expect("general kernels");
    let mut devs = vec![GemvKernels::new(&g.registry).expect("default shape")];
    for (warps, rows_per_warp, x_in_shared) in [(3, 3, false), (8, 1, true), (4, 2, false)] {
        let config = GemvConfig {
            device: Some(DeviceGemv {
                warps,
                rows_per_warp,
                x_in_shared,
                min_rows: 0,
            }),
            ..NODEV_CONFIG
        };
        devs.push(GemvKernels::with_config(&g.registry, config).expect("device shape"));
    }
    let mut r = rng(0x5EED_0006);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for format in [Format::Q4K, Format::Q6K] {
        // 2100 rows: blocks of several warps with idle warps in the last; k = 14336 (56 blocks: a
        // partial last tile) and k = 2048 (one tile).
        for (m, k) in [(2100, 2048), (1100, 14336), (5, 4096)] {
            let wbytes = random_weights(format, m, k, &mut r);
            let x = random_x(k, &mut r);
            let act = prepare(&g, &x);
            let (xhat, dstep) = effective_x(&g, &act, &x, format);
            let placed = place(&g.ctx, &g.stream, &wbytes, false);
            let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("view");
            for form in [GemvForm::Plain, GemvForm::Residual] {
                let y0 = if form == GemvForm::Plain {
                    vec![f32::from_bits(POISON); m]
                } else {
                    random_x(m, &mut r)
                };
                let want = run(&g, &general, &w, &act, &y0, RowRange::all(m), form);
                check_rows(format, &wbytes, k, &x, &xhat, &dstep, &y0, &want, form);
                for dev in &devs {
                    let label = dev.config().label();
                    let got = run(&g, dev, &w, &act, &y0, RowRange::all(m), form);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{format} m={m} k={k} {form:?} {label}: device kernel != general kernel"
                    );
                    for (a, b) in [(0, m / 2), (m / 2, m), (1, m.min(1 + 37)), (m - 1, m)] {
                        let start: Vec<f32> = (0..m)
                            .map(|i| {
                                if (a..b).contains(&i) {
                                    y0[i]
                                } else {
                                    f32::from_bits(POISON)
                                }
                            })
                            .collect();
                        let y = run(&g, dev, &w, &act, &start, RowRange::new(a, b), form);
                        for i in 0..m {
                            let expect = if (a..b).contains(&i) {
                                want[i].to_bits()
                            } else {
                                POISON
                            };
                            assert_eq!(
                                y[i].to_bits(),
                                expect,
                                "{format} m={m} k={k} {form:?} {label} [{a},{b}) row {i}"
                            );
                        }
                    }
                    println!("{format:>5} m={m:<5} k={k:<5} {form:?} {label}: bit-identical");
                }
            }
        }
    }
}

/// Formats of the multi-column tests: the 32-element blocks (Q8_0's 2-byte-aligned rows, Q4_0's
/// two units per lane), the 256-element K-quants (four units per block; Q4_K and Q6_K also have
/// the device-resident kernel) and both float kernels.
const COLS_FORMATS: [Format; 7] = [
    Format::Q4K,
    Format::Q6K,
    Format::Q8_0,
    Format::Q4_0,
    Format::F16,
    Format::F32,
    Format::Q5K,
];
/// Column counts: one (the single-column path), within one launch (2, 3, 5, the full 8) and
/// across groups of GEMV_MAX_COLS (11: a full group and a partial one; 16: two full groups).
const COLS_COUNTS: [usize; 7] = [1, 2, 3, 5, 8, 11, 16];

/// Runs one multi-column launch on `y0` (uploaded first: exactly its length), returns y.
#[allow(clippy::too_many_arguments)]
fn run_cols(
    g: &Gpu,
    kern: &GemvKernels,
    w: &WeightRef<'_>,
    act: &Activation,
    y0: &[f32],
    ldy: usize,
    rows: RowRange,
    form: GemvForm,
    cols: usize,
) -> Vec<f32> {
    let mut y = g.ctx.alloc::<f32>(y0.len()).expect("y");
    y.upload(&g.stream, y0).expect("y upload");
    kern.gemv_cols(&g.stream, w, act, &mut y, ldy, rows, form, cols)
        .expect("multi-column launch");
    let mut out = vec![0f32; y0.len()];
    y.download(&g.stream, &mut out).expect("y download");
    out
}

/// `cols` columns of `k` values, column-major, prepared as one multi-column activation with room
/// for `room` columns.
fn prepare_columns(g: &Gpu, xs: &[f32], k: usize, cols: usize, room: usize) -> Activation {
    let mut xd = g.ctx.alloc::<f32>(xs.len()).expect("x");
    xd.upload(&g.stream, xs).expect("x upload");
    let mut act = Activation::with_columns(&g.ctx, k, room).expect("activation");
    assert_eq!(act.columns(), room);
    g.kernels
        .prepare_cols(&g.stream, &xd, &mut act, cols)
        .expect("prepare_cols");
    g.stream.synchronize().expect("sync");
    act
}

/// The kernels the multi-column test compares: the general shapes of [`all_kernels`] (the
/// default one with its tensor-core Q4_K kernels), and the device-resident Q4_K/Q6_K kernel of
/// the default shape (x in shared memory) at every row count, so that `gemv` takes it for the
/// test's few hundred device rows, with the dp4a multi-column kernel.
fn cols_kernels(g: &Gpu) -> Vec<GemvKernels> {
    let mut v = all_kernels(g);
    let dev_any_rows = GemvConfig {
        device: Some(DeviceGemv {
            min_rows: 0,
            ..DeviceGemv::default()
        }),
        tensor_cores: false,
        ..GemvConfig::default()
    };
    v.push(GemvKernels::with_config(&g.registry, dev_any_rows).expect("device shape"));
    v
}

/// Relative closeness of the tensor-core multi-column kernel to one-column launches, of each
/// column's largest output: both sum the same exact int32 sub-block sums, scaled and added in
/// another order in f32 (a few ulps of the largest partial sums; random data at k 4096 stay near
/// 1e-6).
const TENSOR_CORE_REL: f32 = 2e-5;

/// As [`check_cols_bits`] for the tensor-core kernel: each written value within
/// [`TENSOR_CORE_REL`] of its column's largest `want` (an unwritten value is still the poison,
/// bit for bit).
fn check_cols_close(
    y: &[f32],
    want: &[Vec<f32>],
    ldy: usize,
    rows: RowRange,
    cols: usize,
    what: &str,
) {
    for (i, v) in y.iter().enumerate() {
        let (c, row) = (i / ldy, i % ldy);
        if !in_cols(i, ldy, rows, cols) {
            assert_eq!(
                v.to_bits(),
                POISON,
                "{what} cols={cols}: column {c} row {row} written"
            );
            continue;
        }
        let colmax = want[c][rows.start..rows.end]
            .iter()
            .fold(0f32, |m, w| m.max(w.abs()));
        let w = want[c][row];
        assert!(
            v.is_finite() && (v - w).abs() <= TENSOR_CORE_REL * colmax,
            "{what} cols={cols}: column {c} row {row}: {v} against {w} (column max {colmax})"
        );
    }
}

/// Rows `rows` of columns `0..cols` of an output `ldy` apart: the values a multi-column launch writes.
fn in_cols(i: usize, ldy: usize, rows: RowRange, cols: usize) -> bool {
    i / ldy < cols && (rows.start..rows.end).contains(&(i % ldy))
}

/// Each value a multi-column launch writes is `want[c][row]` bit for bit, every other value of
/// the output the poison.
fn check_cols_bits(
    y: &[f32],
    want: &[Vec<f32>],
    ldy: usize,
    rows: RowRange,
    cols: usize,
    what: &str,
) {
    for (i, v) in y.iter().enumerate() {
        let (c, row) = (i / ldy, i % ldy);
        let written = in_cols(i, ldy, rows, cols);
        let expect = if written {
            want[c][row].to_bits()
        } else {
            POISON
        };
        assert_eq!(
            v.to_bits(),
            expect,
            "{what} cols={cols}: column {c} row {row} (written: {written})"
        );
    }
}

/// Every column of a multi-column output, rows `rows`, within the f64 bound of [`check_rows`]
/// (column c's activation is `singles[c]`, prepared from `xs[c*k..(c+1)*k]`; `y0` the start).
#[allow(clippy::too_many_arguments)]
fn check_cols_f64(
    g: &Gpu,
    format: Format,
    wbytes: &[u8],
    k: usize,
    xs: &[f32],
    singles: &[Activation],
    (y0, y, ldy): (&[f32], &[f32], usize),
    rows: RowRange,
    form: GemvForm,
) {
    let rb = format.row_bytes(k).expect("row bytes");
    let (a, b) = (rows.start, rows.end);
    for (c, (x, act)) in xs.chunks_exact(k).zip(singles).enumerate() {
        let (xhat, dstep) = effective_x(g, act, x, format);
        let col = |v: &[f32]| v[c * ldy + a..c * ldy + b].to_vec();
        let worst = check_rows(
            format,
            &wbytes[a * rb..b * rb],
            k,
            x,
            &xhat,
            &dstep,
            &col(y0),
            &col(y),
            form,
        );
        println!("{format:>5} k={k:<4} {form:?} column {c}: worst error {worst:.3} of bound");
    }
}

/// gemv_cols over 1..16 columns, on device and host-mapped weights, a row sub-range and an output
/// stride past m, for every compiled shape: each column bit-identical to `gemv` of that column
/// alone (within [`TENSOR_CORE_REL`] where the tensor-core kernel runs: device-resident Q4_K
/// and Q6_K, 2 columns or more), nothing written outside the rows and columns asked for, and (16 columns,
/// plain and residual; 8 too on the tensor cores) every column within the f64 bound of
/// `check_rows`.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_multi_column_gemv_equals_per_column_gemv_bit_for_bit() {
    let g = setup();
    let kernels = cols_kernels(&g);
    // The tensor-core kernels exist wherever CUDA reports sm_80 or later (arch "sm_XY").
    let info = g.ctx.backend().info();
    let sm: u32 = info.arch.trim_start_matches("sm_").parse().unwrap_or(0);
    if g.ctx.backend().name() == "cuda" && sm >= 80 {
        assert!(
            kernels[0].has_tensor_core_kernels(Format::Q4K)
                && kernels[0].has_tensor_core_kernels(Format::Q6K),
            "no tensor-core kernels on {} ({})",
            info.name,
            info.arch
        );
    }
    let mut r = rng(0x5EED_0007);
    let most = *COLS_COUNTS.iter().max().expect("counts");
    // m = 2500: not a multiple of any shape's rows per block; ldy = m + 13: columns start at odd
    // offsets; rows [37, 2401): both ends inside a block, and enough rows (2364) that the
    // tensor-core kernels take launches from their fewest columns (gemv.rs `mma_min_cols`).
    let (m, ldy) = (2500, 2513);
    let rows = RowRange::new(37, 2401);
    for format in COLS_FORMATS {
        for k in [256, 4096] {
            let wbytes = random_weights(format, m, k, &mut r);
            let xs = random_x(most * k, &mut r);
            let y0 = random_x(most * ldy, &mut r);
            let act = prepare_columns(&g, &xs, k, most, most);
            let singles: Vec<Activation> = xs.chunks_exact(k).map(|x| prepare(&g, x)).collect();
            for host in [false, true] {
                let placed = place(&g.ctx, &g.stream, &wbytes, host);
                let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("weight view");
                for (form, kern) in [GemvForm::Plain, GemvForm::Residual]
                    .into_iter()
                    .flat_map(|f| kernels.iter().map(move |k| (f, k)))
                {
                    let what = format!(
                        "{format} k={k} host={host} {form:?} {}",
                        kern.config().label()
                    );
                    // Each column alone through gemv (the device-resident kernel where it applies).
                    let want: Vec<Vec<f32>> = (0..most)
                        .map(|c| {
                            run(
                                &g,
                                kern,
                                &w,
                                &singles[c],
                                &y0[c * ldy..c * ldy + m],
                                rows,
                                form,
                            )
                        })
                        .collect();
                    for cols in COLS_COUNTS {
                        // Exactly the size the launch needs: (cols - 1) * ldy + m.
                        let start: Vec<f32> = (0..(cols - 1) * ldy + m)
                            .map(|i| {
                                if form == GemvForm::Residual && in_cols(i, ldy, rows, cols) {
                                    y0[i]
                                } else {
                                    f32::from_bits(POISON)
                                }
                            })
                            .collect();
                        let y = run_cols(&g, kern, &w, &act, &start, ldy, rows, form, cols);
                        let tensor_cores = kern.has_tensor_core_kernels(format) && !host;
                        if tensor_cores && cols > 1 {
                            check_cols_close(&y, &want, ldy, rows, cols, &what);
                        } else {
                            check_cols_bits(&y, &want, ldy, rows, cols, &what);
                        }
                        let f64_check = cols == most || (tensor_cores && cols == 8);
                        if f64_check && !host && std::ptr::eq(kern, &kernels[0]) {
                            let out = (&y0[..], &y[..], ldy);
                            let (xc, sc) = (&xs[..cols * k], &singles[..cols]);
                            check_cols_f64(&g, format, &wbytes, k, xc, sc, out, rows, form);
                        }
                    }
                    let how = if kern.has_tensor_core_kernels(format) && !host {
                        "within the tensor-core bound of"
                    } else {
                        "bit-identical to"
                    };
                    println!("{what}: columns 1..{most} {how} gemv");
                }
            }
        }
    }
}

/// The multi-column activation's columns are the single-column preparation of each column, bit
/// for bit (the layout gemv_cols reads: column c at c*k values and c*k/32 scale pairs).
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_prepare_cols_lays_out_each_columns_preparation() {
    let g = setup();
    let mut r = rng(0x5EED_0008);
    let (k, cols, room) = (4096, 5, 7);
    let xs = random_x(cols * k, &mut r);
    let act = prepare_columns(&g, &xs, k, cols, room);
    let mut q = vec![0i8; room * k];
    let mut ds = vec![0f32; 2 * room * k / 32];
    act.quantized().download(&g.stream, &mut q).expect("qs");
    act.scales().download(&g.stream, &mut ds).expect("ds");
    for (c, x) in xs.chunks_exact(k).enumerate() {
        let one = prepare(&g, x);
        let mut q1 = vec![0i8; k];
        let mut ds1 = vec![0f32; 2 * k / 32];
        one.quantized().download(&g.stream, &mut q1).expect("qs");
        one.scales().download(&g.stream, &mut ds1).expect("ds");
        assert_eq!(&q[c * k..(c + 1) * k], &q1[..], "column {c} int8 values");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let nd = 2 * k / 32;
        assert_eq!(
            bits(&ds[c * nd..(c + 1) * nd]),
            bits(&ds1),
            "column {c} scales"
        );
        assert!(q1.iter().any(|&v| v != 0), "column {c} quantised to zeros");
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_multi_column_bad_launches_are_typed_errors() {
    let g = setup();
    let mut r = rng(0x5EED_0009);
    let (m, k, ldy) = (64, 256, 70);
    let format = Format::Q4K;
    let wbytes = random_weights(format, m, k, &mut r);
    let placed = place(&g.ctx, &g.stream, &wbytes, false);
    let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("view");
    let xs = random_x(3 * k, &mut r);
    let act = prepare_columns(&g, &xs, k, 3, 3);
    let (kern, s) = (&g.kernels, &g.stream);
    let all = RowRange::all(m);
    let invalid = |e: GpuError, what: &str| {
        assert!(
            matches!(&e, GpuError::Invalid { what: got, .. } if *got == what),
            "{e}"
        );
    };
    let mut y = g.ctx.alloc::<f32>(2 * ldy + m).expect("y");
    kern.gemv_cols(s, &w, &act, &mut y, ldy, all, GemvForm::Plain, 3)
        .expect("exactly (cols - 1) * ldy + m floats");
    let e = kern
        .gemv_cols(s, &w, &act, &mut y, ldy, all, GemvForm::Plain, 0)
        .unwrap_err();
    invalid(e, "cols");
    let e = kern
        .gemv_cols(s, &w, &act, &mut y, ldy, all, GemvForm::Plain, 4)
        .unwrap_err();
    invalid(e, "cols");
    let e = kern
        .gemv_cols(s, &w, &act, &mut y, m - 1, all, GemvForm::Plain, 2)
        .unwrap_err();
    invalid(e, "ldy");
    let mut short = g.ctx.alloc::<f32>(2 * ldy + m - 1).expect("short y");
    let e = kern
        .gemv_cols(s, &w, &act, &mut short, ldy, all, GemvForm::Plain, 3)
        .unwrap_err();
    assert!(
        matches!(e, GpuError::BufferTooSmall { what: "y", .. }),
        "{e}"
    );
    let e = kern
        .gemv_cols(
            s,
            &w,
            &act,
            &mut y,
            ldy,
            RowRange::new(0, m + 1),
            GemvForm::Plain,
            2,
        )
        .unwrap_err();
    assert!(matches!(e, GpuError::BadRowRange { .. }), "{e}");
    let other = prepare_columns(&g, &random_x(2 * 512, &mut r), 512, 2, 2);
    let e = kern
        .gemv_cols(s, &w, &other, &mut y, ldy, all, GemvForm::Plain, 2)
        .unwrap_err();
    assert!(
        matches!(
            e,
            GpuError::ActivationMismatch {
                need: 256,
                got: 512
            }
        ),
        "{e}"
    );
    // prepare_cols: too many columns, none, and x shorter than cols * k.
    let mut room = Activation::with_columns(&g.ctx, k, 2).expect("activation");
    let mut xd = g.ctx.alloc::<f32>(2 * k - 1).expect("x");
    let e = kern.prepare_cols(s, &xd, &mut room, 3).unwrap_err();
    invalid(e, "cols");
    let e = kern.prepare_cols(s, &xd, &mut room, 0).unwrap_err();
    invalid(e, "cols");
    let e = kern.prepare_cols(s, &xd, &mut room, 2).unwrap_err();
    assert!(
        matches!(e, GpuError::BufferTooSmall { what: "x", .. }),
        "{e}"
    );
    xd.upload(s, &random_x(2 * k - 1, &mut r))
        .expect("x upload");
    kern.prepare_cols(s, &xd, &mut room, 1)
        .expect("one column fits");
    let e = Activation::with_columns(&g.ctx, k, 0).unwrap_err();
    invalid(e, "activation columns");
    assert_eq!(Activation::new(&g.ctx, k).expect("one").columns(), 1);
    s.synchronize()
        .expect("stream healthy after refused launches");
}
