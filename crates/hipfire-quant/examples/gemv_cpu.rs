//! Single-thread GEMV compute rate (weight GB/s) per format, timed by this thread's CPU clock.
//!
//! ```text
//! cargo run --release -p hipfire-quant --example gemv_cpu -- [--k 4096] [--kib 1024]
//!     [--reps 5] [--formats q3_k,q2_k,iq4_xs,q4_k]
//! ```
//! `gemv_gbs` measures wall time; on the shared 2-core dev VM time spent descheduled swamps the
//! differences a kernel change makes. Here the rows fill `--kib` of weight (the default stays in
//! L2, so the figure is the kernel's compute rate, not DRAM's), every pass walks them until
//! [`PASS_BYTES`] have been dotted, and the time is `CLOCK_THREAD_CPUTIME_ID`. The figure is the
//! fastest of `--reps` passes.

use hipfire_quant::{gemv_rows, simd_tier, ActivationBuf, Format};
#[path = "support/mod.rs"]
mod support;
use std::error::Error;
use std::hint::black_box;
use support::{distinct_rows, thread_cpu_ns, tiled};

/// Weight bytes one timed pass dots (about 10–20 ms at the rates measured).
const PASS_BYTES: usize = 256 << 20;

struct Args {
    k: usize,
    bytes: usize,
    reps: usize,
    formats: Vec<Format>,
}

fn parse() -> Result<Args, Box<dyn Error>> {
    let mut a = Args {
        k: 4096,
        bytes: 1 << 20,
        reps: 5,
        formats: vec![Format::Q3K, Format::Q2K, Format::Iq4Xs, Format::Q4K],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let [flag, val] = pair else {
            return Err(format!("{} needs a value", pair[0]).into());
        };
        match flag.as_str() {
            "--k" => a.k = val.parse()?,
            "--kib" => a.bytes = val.parse::<usize>()? << 10,
            "--reps" => a.reps = val.parse()?,
            "--formats" => {
                a.formats = val
                    .split(',')
                    .map(|s| Format::from_name(s).ok_or_else(|| format!("unknown format {s}")))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = parse()?;
    println!(
        "tier {} | k {} | {} KiB of rows | best of {} passes of {} MiB",
        simd_tier(),
        a.k,
        a.bytes >> 10,
        a.reps,
        PASS_BYTES >> 20
    );
    // The same rows and activation as gemv_gbs.
    let x: Vec<f32> = (0..a.k)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    for &fmt in &a.formats {
        let rb = fmt.row_bytes(a.k)?;
        let distinct = distinct_rows(fmt, a.k)?;
        let m = (a.bytes / rb).max(1);
        let w = tiled(&distinct, m);
        let act = ActivationBuf::prepare(fmt, &x)?;
        let mut y = vec![0f32; m];
        let walks = (PASS_BYTES / w.len()).max(1);
        let mut best = f64::MAX;
        for _ in 0..a.reps {
            let t0 = thread_cpu_ns()?;
            for _ in 0..walks {
                gemv_rows(fmt, black_box(&w), a.k, &act, &mut y, false)?;
            }
            best = best.min((thread_cpu_ns()? - t0) as f64 * 1e-9);
        }
        black_box(&y);
        let gbs = (walks * w.len()) as f64 / best * 1e-9;
        println!("{:<9} {:>7.2} GB/s", fmt.name(), gbs);
    }
    Ok(())
}
