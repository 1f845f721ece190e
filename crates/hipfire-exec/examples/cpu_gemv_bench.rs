//! CPU GEMV weight bandwidth vs a plain read of the same bytes, per format, shape and thread
//! count, on hipfire-exec's pinned worker pool.
//!
//! ```text
//! cargo run --release -p hipfire-exec --example cpu_gemv_bench -- \
//!     [--formats q4_0,q8_0,q4_k,q6_k,hfq4g256] [--shapes 4096x4096,4096x12288,12288x4096] \
//!     [--threads N] [--reps R] [--json]
//! ```
//! Shapes are `KxM` (row length × rows); the defaults are a 9B model's attention/FFN matrices.
//! `--threads N` measures 1..=N workers (default: one per physical core).

use hipfire_exec::bench::{
    cpu_gemv_bandwidth_on, dispatch_latency, DispatchLatency, GemvBandwidth, COLD_SET_BYTES,
};
use hipfire_exec::{CpuPool, ExecError};
use hipfire_quant::Format;
use std::process::ExitCode;

/// A 9B model's matrices: q/o (4096×4096), FFN gate/up (k 4096, m 12288), FFN down (k 12288).
const DEFAULT_SHAPES: [(usize, usize); 3] = [(4096, 4096), (4096, 12288), (12288, 4096)];

/// The formats the executor meets in practice, cheapest first.
const DEFAULT_FORMATS: &str = "q4_0,q8_0,q4_k,q6_k,hfq4g256";

/// Rounds per point: enough for a stable median at a few ms per round.
const DEFAULT_REPS: usize = 20;

struct Args {
    formats: Vec<Format>,
    shapes: Vec<(usize, usize)>,
    threads: usize,
    reps: usize,
    json: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        formats: Vec::new(),
        shapes: DEFAULT_SHAPES.to_vec(),
        threads: hipfire_exec::topology::default_threads(),
        reps: DEFAULT_REPS,
        json: false,
    };
    let mut formats = DEFAULT_FORMATS.to_string();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--formats" => formats = value("--formats")?,
            "--shapes" => {
                args.shapes = value("--shapes")?
                    .split(',')
                    .map(|s| {
                        let (k, m) = s.split_once('x').ok_or(format!("shape {s}: want KxM"))?;
                        Ok((
                            k.parse().map_err(|e| format!("{s}: {e}"))?,
                            m.parse().map_err(|e| format!("{s}: {e}"))?,
                        ))
                    })
                    .collect::<Result<_, String>>()?
            }
            "--threads" => {
                args.threads = value("--threads")?
                    .parse()
                    .map_err(|e| format!("--threads: {e}"))?
            }
            "--reps" => {
                args.reps = value("--reps")?
                    .parse()
                    .map_err(|e| format!("--reps: {e}"))?
            }
            "--json" => args.json = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if formats == "all" {
        args.formats = Format::ALL.to_vec();
    } else {
        for f in formats.split(',') {
            args.formats
                .push(Format::from_name(f).ok_or(format!("unknown format {f}"))?);
        }
    }
    args.threads = args.threads.max(1);
    Ok(args)
}

/// Empty pool calls per dispatch-latency case.
const LATENCY_REPS: usize = 200;

/// Everything one run measured (the `--json` document).
#[derive(serde::Serialize)]
struct Report {
    gemv: Vec<GemvBandwidth>,
    dispatch: Vec<DispatchLatency>,
}

fn run(args: &Args) -> Result<Report, ExecError> {
    let mut out = Vec::new();
    let mut dispatch = Vec::new();
    for threads in 1..=args.threads {
        let pool = CpuPool::new(threads)?;
        let d = dispatch_latency(&pool, LATENCY_REPS)?;
        if !args.json {
            println!(
                "# {threads} worker(s): empty-call round trip {:.1} µs warm, {:.1} µs parked (spin window {:.0} µs)",
                d.warm_us, d.parked_us, d.spin_window_us
            );
        }
        dispatch.push(d);
        for &fmt in &args.formats {
            for &(k, m) in &args.shapes {
                let r = cpu_gemv_bandwidth_on(&pool, fmt, k, m, args.reps, COLD_SET_BYTES)?;
                if !args.json {
                    println!(
                        "{:<9} {:>6} {:>6} {:>7.1} {:>3} {:>9.2} {:>9.2} {:>6.2} {:>9.1}",
                        r.format,
                        r.k,
                        r.m,
                        r.weight_bytes as f64 / (1 << 20) as f64,
                        r.threads,
                        r.gemv.gbps,
                        r.read.gbps,
                        r.gemv_over_read,
                        r.gemv.median_s * 1e6,
                    );
                }
                out.push(r);
            }
        }
    }
    Ok(Report {
        gemv: out,
        dispatch,
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("usage: cpu_gemv_bench [--formats a,b|all] [--shapes KxM,..] [--threads N] [--reps R] [--json]");
            return ExitCode::from(2);
        }
    };
    if !args.json {
        println!(
            "simd tier: {}; cold set {} MiB; median of {} rounds",
            hipfire_quant::simd_tier(),
            COLD_SET_BYTES >> 20,
            args.reps
        );
        println!(
            "{:<9} {:>6} {:>6} {:>7} {:>3} {:>9} {:>9} {:>6} {:>9}",
            "format", "k", "m", "MiB", "thr", "gemv GB/s", "read GB/s", "ratio", "gemv µs"
        );
    }
    match run(&args) {
        Ok(rows) => {
            if args.json {
                match serde_json::to_string_pretty(&rows) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
