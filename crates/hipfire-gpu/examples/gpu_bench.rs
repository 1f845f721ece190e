//! GPU GEMV bandwidth bench: per format and shape, the read kernel's GB/s and the GEMV's GB/s over
//! the same weight bytes, in device memory (HBM) and in pinned host-mapped memory (PCIe zero-copy),
//! and their ratios. Event-timed, warmed up, median of repetitions; every timed pass rotates over
//! enough weight copies that the bytes exceed the L2 cache.
//!
//! `gpu_bench [--json PATH] [--reps N] [--config WxRxKxB[:nodev|:devWxR{s|r}][:notc][+DEFINE]...]...
//! [--host-configs N] [--formats f1,f2] [--shapes MxK,...] [--pool-mib N] [--cols N] [--dequant]`
//!
//! `--dequant` times the dequantiser (`kernels/dequant.cu`, weights to f16, the batched steps'
//! GEMM input) instead: per format, one Llama-3-8B FFN-sized matrix (14336 × 4096) in device
//! memory unless `--shapes` says otherwise, as f16 GB/s written and all GB/s moved (weights read
//! + f16 written).
//!
//! A trailing `:notc` keeps multi-column launches over device-resident Q4_K weights on the dp4a
//! kernel instead of the tensor-core one (the A/B baseline of `--cols`).
//!
//! `:nodev` runs device-resident Q4_K/Q6_K weights through the general kernel (the A/B baseline);
//! `:dev8x2s` through the device-resident kernel with 8 warps × 2 rows and x staged in shared memory
//! (`r`: x from global memory one tile ahead); without a suffix, the default device kernel.
//!
//! `--cols N` (N > 1) times the multi-column GEMV (`gemv_cols`) over N activation columns instead
//! of `gemv`: GB/s still counts the weight bytes once per pass, so it stays near `gemv`'s when
//! the weights are read once for all columns, and the µs column is per pass (all N columns).

use hipfire_gpu::gemv::DeviceGemv;
use hipfire_gpu::{
    Activation, Context, DequantKernels, DeviceBuffer, DeviceMemory, GemvConfig, GemvForm,
    GemvKernels, HostMappedBuffer, KernelRegistry, ReadKernel, RowRange, Stream, WeightRef,
};
use hipfire_quant::Format;
use std::sync::Arc;

/// Default (m, k) shapes, the acceptance targets: k=4096 with m=4096 and 12288, and k=12288 with
/// m=4096 (`--shapes` replaces them).
const SHAPES: [(usize, usize); 3] = [(4096, 4096), (12288, 4096), (4096, 12288)];
/// Bytes each timed pass reads at least: 4x the H200's 60 MiB L2 so no pass is served from cache.
const MIN_PASS_BYTES: usize = 256 << 20;
/// Default size of each rotation pool (device and host): two copies of the largest F32 matrix fit.
const DEFAULT_POOL_MIB: usize = 512;
/// Copies are placed at this alignment (the widest kernel load is 16 bytes; 256 matches allocation).
const COPY_ALIGN: usize = 256;
/// Untimed passes before measuring (module load, clocks, TLB warm-up).
const WARMUP_PASSES: usize = 3;
/// Default timed passes per measurement; the median is reported.
const DEFAULT_REPS: usize = 15;

/// `--dequant`'s default shape: Llama-3-8B's gate/up projection.
const DEQUANT_SHAPES: [(usize, usize); 1] = [(14336, 4096)];

const USAGE: &str = "gpu_bench [--json PATH] [--reps N] [--config WxRxKxB[:nodev|:devWxR{s|r}][:notc][+DEFINE]...]... [--host-configs N] [--formats f1,f2] [--shapes MxK,...] [--pool-mib N] [--cols N] [--dequant]";

struct Args {
    json: Option<String>,
    shapes: Vec<(usize, usize)>,
    reps: usize,
    /// Kernel shapes, each with extra `-D` defines (`--config 4x2x1x1+HF_DIAG_NOX`).
    configs: Vec<(GemvConfig, Vec<String>)>,
    formats: Vec<Format>,
    pool_mib: usize,
    /// Host-mapped runs only for the first this-many configs (they sit at the link rate anyway).
    host_configs: usize,
    /// Activation columns per GEMV (1: `gemv`; more: `gemv_cols`).
    cols: usize,
    /// Time the dequantiser instead of the GEMV.
    dequant: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        json: None,
        shapes: SHAPES.to_vec(),
        reps: DEFAULT_REPS,
        configs: vec![],
        formats: Format::ALL
            .into_iter()
            .filter(|f| f.has_gpu_kernel())
            .collect(),
        pool_mib: DEFAULT_POOL_MIB,
        host_configs: usize::MAX,
        cols: 1,
        dequant: false,
    };
    let mut shapes_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--json" => a.json = Some(val()?),
            "--reps" => a.reps = val()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--pool-mib" => a.pool_mib = val()?.parse().map_err(|e| format!("--pool-mib: {e}"))?,
            "--config" => {
                let full = val()?;
                let mut parts = full.split('+');
                let head = parts.next().unwrap_or_default().to_string();
                let defines: Vec<String> = parts.map(|d| format!("-D{d}")).collect();
                let (head, tensor_cores) = match head.strip_suffix(":notc") {
                    Some(h) => (h.to_string(), false),
                    None => (head.to_string(), true),
                };
                let (v, dev) = head.split_once(':').unwrap_or((&head, "default"));
                let n: Vec<u32> = v
                    .split('x')
                    .map(|p| p.parse().map_err(|e| format!("--config {v}: {e}")))
                    .collect::<Result<_, _>>()?;
                let [warps, rows_per_warp, ksplit, min_blocks] = n[..] else {
                    return Err("--config WARPSxROWSxKSPLITxMINBLOCKS, e.g. 4x2x1x1".into());
                };
                a.configs.push((
                    GemvConfig {
                        warps,
                        rows_per_warp,
                        ksplit,
                        min_blocks,
                        device: parse_device(dev)?,
                        tensor_cores,
                    },
                    defines,
                ));
            }
            "--cols" => {
                a.cols = val()?.parse().map_err(|e| format!("--cols: {e}"))?;
                if a.cols == 0 {
                    return Err("--cols: at least 1".into());
                }
            }
            "--host-configs" => {
                a.host_configs = val()?.parse().map_err(|e| format!("--host-configs: {e}"))?
            }
            "--dequant" => a.dequant = true,
            "--shapes" => {
                shapes_given = true;
                a.shapes = val()?
                    .split(',')
                    .map(|mk| {
                        let (m, k) = mk
                            .split_once('x')
                            .ok_or(format!("--shapes: {mk} is not MxK"))?;
                        Ok((
                            m.parse().map_err(|e| format!("--shapes {mk}: {e}"))?,
                            k.parse().map_err(|e| format!("--shapes {mk}: {e}"))?,
                        ))
                    })
                    .collect::<Result<_, String>>()?
            }
            "--formats" => {
                a.formats = val()?
                    .split(',')
                    .map(|s| Format::from_name(s).ok_or(format!("unknown format {s}")))
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.configs.is_empty() {
        a.configs.push((GemvConfig::default(), vec![]));
    }
    if a.dequant && !shapes_given {
        a.shapes = DEQUANT_SHAPES.to_vec();
    }
    Ok(a)
}

/// `nodev`, `default`, or `devWxR` followed by `s` (x in shared memory) or `r` (x in registers).
fn parse_device(s: &str) -> Result<Option<DeviceGemv>, String> {
    match s {
        "nodev" => return Ok(None),
        "default" => return Ok(Some(DeviceGemv::default())),
        _ => {}
    }
    let bad = || format!("device kernel {s}: expected nodev or devWxR{{s|r}}, e.g. dev8x2s");
    let body = s.strip_prefix("dev").ok_or_else(bad)?;
    let (shape, x_in_shared) = match body.strip_suffix('s') {
        Some(b) => (b, true),
        None => (body.strip_suffix('r').ok_or_else(bad)?, false),
    };
    let (w, r) = shape.split_once('x').ok_or_else(bad)?;
    Ok(Some(DeviceGemv {
        warps: w.parse().map_err(|_| bad())?,
        rows_per_warp: r.parse().map_err(|_| bad())?,
        x_in_shared,
        // An explicit shape is compared on every row count.
        min_rows: 0,
    }))
}

/// Median milliseconds of `reps` passes of `pass` (each pass queued between two events).
fn time_ms(
    ctx: &Arc<Context>,
    stream: &Stream,
    reps: usize,
    mut pass: impl FnMut() -> Result<(), hipfire_gpu::GpuError>,
) -> Result<f64, hipfire_gpu::GpuError> {
    for _ in 0..WARMUP_PASSES {
        pass()?;
    }
    stream.synchronize()?;
    let (e0, e1) = (ctx.new_event()?, ctx.new_event()?);
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        e0.record(stream)?;
        pass()?;
        e1.record(stream)?;
        e1.synchronize()?;
        t.push(e0.elapsed_ms(&e1)? as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn fill_random(buf: &mut [u8], mut seed: u64) {
    // xorshift64*: fast enough to fill hundreds of MiB; bandwidth does not depend on the values,
    // but random bytes keep any compression or zero shortcut out of the picture.
    for c in buf.chunks_mut(8) {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        let v = seed.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

struct Row {
    format: Format,
    m: usize,
    k: usize,
    config: String,
    bytes: usize,
    copies: usize,
    dev_read: f64,
    dev_gemv: f64,
    host_read: f64,
    host_gemv: f64,
    gemv_us_dev: f64,
    gemv_us_host: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let ctx = Context::new(0)?;
    let info = ctx.info().clone();
    eprintln!(
        "device: {} ({}, {} SMs, {:.1} GiB)",
        info.name,
        info.arch,
        info.multiprocessors,
        info.total_mem as f64 / (1u64 << 30) as f64
    );
    let stream = ctx.new_stream()?;
    let registry = KernelRegistry::new(&ctx);
    if args.dequant {
        return dequant_bench(&args, &ctx, &stream, &registry);
    }
    let read = ReadKernel::new(&registry)?;
    let pool = args.pool_mib << 20;
    let mut host = ctx.alloc_host_mapped(pool)?;
    fill_random(host.as_mut_slice(), 0x9E37_79B9_7F4A_7C15);
    let mut dev: DeviceBuffer<u8> = ctx.alloc(pool)?;
    dev.upload(&stream, host.as_slice())?;

    let mut rows = Vec::new();
    for (ci, (config, defines)) in args.configs.iter().enumerate() {
        let t0 = std::time::Instant::now();
        let kernels = GemvKernels::with_options(&registry, *config, defines)?;
        let label = std::iter::once(config.label())
            .chain(
                defines
                    .iter()
                    .map(|d| d.trim_start_matches("-D").to_string()),
            )
            .collect::<Vec<_>>()
            .join("+");
        eprintln!("config {label}: module ready in {:?}", t0.elapsed());
        let with_host = ci < args.host_configs;
        for &(m, k) in &args.shapes {
            let cols = args.cols;
            let mut xd: DeviceBuffer<f32> = ctx.alloc(cols * k)?;
            let x: Vec<f32> = (0..cols * k)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            xd.upload(&stream, &x)?;
            let mut act = Activation::with_columns(&ctx, k, cols)?;
            kernels.prepare_cols(&stream, &xd, &mut act, cols)?;
            let mut y: DeviceBuffer<f32> = ctx.alloc(cols * m)?;
            for &format in &args.formats {
                let bytes = m * format.row_bytes(k)?;
                let stride = bytes.div_ceil(COPY_ALIGN) * COPY_ALIGN;
                let copies = (pool / stride).min(MIN_PASS_BYTES.div_ceil(bytes).max(2));
                if copies < 2 {
                    eprintln!("skip {format} {m}x{k}: pool too small for two copies");
                    continue;
                }
                let mut measure =
                    |mem: &dyn DeviceMemory| -> Result<(f64, f64), hipfire_gpu::GpuError> {
                        let views: Vec<WeightRef<'_>> = (0..copies)
                            .map(|c| WeightRef::new(mem, c * stride, format, m, k))
                            .collect::<Result<_, _>>()?;
                        let read_ms = time_ms(&ctx, &stream, args.reps, || {
                            for c in 0..copies {
                                read.read_at(&stream, mem, c * stride, bytes)?;
                            }
                            Ok(())
                        })?;
                        let gemv_ms = time_ms(&ctx, &stream, args.reps, || {
                            for w in &views {
                                let (rows, form) = (RowRange::all(m), GemvForm::Plain);
                                if cols == 1 {
                                    kernels.gemv(&stream, w, &act, &mut y, rows, form)?;
                                } else {
                                    kernels
                                        .gemv_cols(&stream, w, &act, &mut y, m, rows, form, cols)?;
                                }
                            }
                            Ok(())
                        })?;
                        Ok((read_ms / copies as f64, gemv_ms / copies as f64))
                    };
                let (dr, dg) = measure(&dev)?;
                let (hr, hg) = if with_host {
                    measure(&host as &HostMappedBuffer)?
                } else {
                    (f64::NAN, f64::NAN)
                };
                let gbps = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
                let row = Row {
                    format,
                    m,
                    k,
                    config: label.clone(),
                    bytes,
                    copies,
                    dev_read: gbps(dr),
                    dev_gemv: gbps(dg),
                    host_read: gbps(hr),
                    host_gemv: gbps(hg),
                    gemv_us_dev: dg * 1e3,
                    gemv_us_host: hg * 1e3,
                };
                eprintln!(
                    "{:>9} {:>5}x{:<5} dev {:7.1}/{:7.1} GB/s ({:.2})  host {:5.1}/{:5.1} GB/s ({:.2})",
                    format.name(),
                    m,
                    k,
                    row.dev_gemv,
                    row.dev_read,
                    row.dev_gemv / row.dev_read,
                    row.host_gemv,
                    row.host_read,
                    row.host_gemv / row.host_read
                );
                rows.push(row);
            }
            // The activation preparation is per GEMV too: report its time for the largest k.
            let prep_ms = time_ms(&ctx, &stream, args.reps, || {
                kernels.prepare_cols(&stream, &xd, &mut act, cols)
            })?;
            eprintln!(
                "prepare (quantise x) k={k} cols={cols}: {:.2} us",
                prep_ms * 1e3
            );
        }
    }

    println!("| config | format | m | k | MiB | HBM read GB/s | HBM GEMV GB/s | ratio | GEMV µs | host read GB/s | host GEMV GB/s | ratio | GEMV µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.3} | {:.1} | {:.1} | {:.1} | {:.3} | {:.0} |",
            r.config,
            r.format.name(),
            r.m,
            r.k,
            r.bytes as f64 / (1 << 20) as f64,
            r.dev_read,
            r.dev_gemv,
            r.dev_gemv / r.dev_read,
            r.gemv_us_dev,
            r.host_read,
            r.host_gemv,
            r.host_gemv / r.host_read,
            r.gemv_us_host
        );
    }
    if let Some(path) = args.json {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "config": r.config,
                    "format": r.format.name(), "m": r.m, "k": r.k, "bytes": r.bytes, "copies": r.copies,
                    "device_read_gbps": r.dev_read, "device_gemv_gbps": r.dev_gemv, "device_ratio": r.dev_gemv / r.dev_read,
                    "device_gemv_us": r.gemv_us_dev,
                    "host_read_gbps": r.host_read, "host_gemv_gbps": r.host_gemv, "host_ratio": r.host_gemv / r.host_read,
                    "host_gemv_us": r.gemv_us_host,
                })
            })
            .collect();
        let doc = serde_json::json!({ "device": info.name, "arch": info.arch, "sms": info.multiprocessors, "reps": args.reps, "cols": args.cols, "rows": json });
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
        eprintln!("wrote {path}");
    }
    Ok(())
}

/// `--dequant`: per shape and format, the dequantiser over the whole matrix into one f16 output,
/// the weights rotated over device copies as the GEMV passes are.
fn dequant_bench(
    args: &Args,
    ctx: &Arc<Context>,
    stream: &Stream,
    registry: &KernelRegistry,
) -> Result<(), Box<dyn std::error::Error>> {
    let info = ctx.info().clone();
    let kernels = DequantKernels::new(registry)?;
    let pool = args.pool_mib << 20;
    let mut host = vec![0u8; pool];
    fill_random(&mut host, 0x9E37_79B9_7F4A_7C15);
    let mut dev: DeviceBuffer<u8> = ctx.alloc(pool)?;
    dev.upload(stream, &host)?;
    drop(host);
    let mut json = Vec::new();
    println!("| format | m | k | MiB | copies | ms | f16 written GB/s | moved GB/s |");
    println!("|---|---|---|---|---|---|---|---|");
    for &(m, k) in &args.shapes {
        let mut out: DeviceBuffer<u16> = ctx.alloc(m * k)?;
        for &format in &args.formats {
            let bytes = m * format.row_bytes(k)?;
            let stride = bytes.div_ceil(COPY_ALIGN) * COPY_ALIGN;
            let copies = (pool / stride).min(MIN_PASS_BYTES.div_ceil(bytes).max(2));
            if copies == 0 {
                eprintln!("skip {format} {m}x{k}: larger than the pool");
                continue;
            }
            let views: Vec<WeightRef<'_>> = (0..copies)
                .map(|c| WeightRef::new(&dev, c * stride, format, m, k))
                .collect::<Result<_, _>>()?;
            let pass_ms = time_ms(ctx, stream, args.reps, || {
                for w in &views {
                    kernels.dequant_rows(stream, w, RowRange::all(m), &mut out)?;
                }
                Ok(())
            })?;
            let ms = pass_ms / copies as f64;
            let written = (m * k * 2) as f64;
            let (written_gbps, moved_gbps) = (
                written / (ms * 1e-3) / 1e9,
                (written + bytes as f64) / (ms * 1e-3) / 1e9,
            );
            println!(
                "| {} | {m} | {k} | {:.1} | {copies} | {ms:.3} | {written_gbps:.0} | {moved_gbps:.0} |",
                format.name(),
                bytes as f64 / (1 << 20) as f64,
            );
            json.push(serde_json::json!({
                "format": format.name(), "m": m, "k": k, "bytes": bytes, "copies": copies,
                "ms": ms, "written_gbps": written_gbps, "moved_gbps": moved_gbps,
            }));
        }
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({ "mode": "dequant", "device": info.name, "arch": info.arch, "sms": info.multiprocessors, "reps": args.reps, "rows": json });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
        eprintln!("wrote {path}");
    }
    Ok(())
}
