//! GEMV throughput (weight GB/s) per format at 1..N threads, next to a plain memory read of
//! the same bytes on the same threads in the same run.
//!
//! ```text
//! cargo run --release -p hipfire-quant --example gemv_gbs -- [--k 4096] [--m 4096]
//!     [--threads 1,2] [--footprint-mib 512] [--reps 5] [--formats q4_0,q8_0,...] [--cols 1]
//!     [--repeat 1]
//! ```
//! `--cols B` dots every row with B activations at once (`gemv_rows_multi`, as a batched
//! decode step does); GB/s still counts each weight byte once. `--repeat R` walks the copies R
//! times a pass: with a footprint that fits in cache, the kernel's compute rate.
//! The m × k matrix is replicated until the copies fill `--footprint-mib`, and each pass
//! walks all copies, so the figure is DRAM-fed, not cache-fed. Rows are split into one
//! contiguous slice per thread with `std::thread::scope` (the pinned pool is hipfire-exec's).
//! Threads are spawned once per pass and each walks its rows of every copy; the read
//! baseline does the same with a plain AVX2 sum over the same bytes. The activation is
//! prepared once per pass; its time is reported separately ("prepare µs", not in GB/s).
//! Each figure is the best of `--reps` passes.

use hipfire_quant::{gemv_rows, gemv_rows_multi, simd_tier, ActivationBuf, Format};
#[path = "support/mod.rs"]
mod support;
use std::error::Error;
use std::hint::black_box;
use std::time::Instant;
use support::{distinct_rows, tiled};

struct Args {
    k: usize,
    m: usize,
    threads: Vec<usize>,
    footprint: usize,
    reps: usize,
    formats: Vec<Format>,
    cols: usize,
    repeat: usize,
}

fn parse() -> Result<Args, Box<dyn Error>> {
    let mut a = Args {
        k: 4096,
        m: 4096,
        threads: vec![1, 2],
        footprint: 512 << 20,
        reps: 5,
        formats: Format::ALL.to_vec(),
        cols: 1,
        repeat: 1,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let [flag, val] = pair else {
            return Err(format!("{} needs a value", pair[0]).into());
        };
        match flag.as_str() {
            "--k" => a.k = val.parse()?,
            "--m" => a.m = val.parse()?,
            "--threads" => a.threads = val.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--footprint-mib" => a.footprint = val.parse::<usize>()? << 20,
            "--reps" => a.reps = val.parse()?,
            "--cols" => a.cols = val.parse::<usize>()?.clamp(1, 64),
            "--repeat" => a.repeat = val.parse::<usize>()?.clamp(1, 1_000_000),
            "--formats" => {
                a.formats = val
                    .split(',')
                    .map(|s| Format::from_name(s).ok_or(format!("unknown format {s}")))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

/// Plain read of `buf`: sum of u64 lanes, AVX2 when available so one core can saturate.
fn split(m: usize, t: usize) -> Vec<std::ops::Range<usize>> {
    (0..t).map(|i| (m * i / t)..(m * (i + 1) / t)).collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = parse()?;
    println!(
        "tier {} | k {} m {} | {} activation column(s) | footprint {} MiB | best of {} passes",
        simd_tier(),
        a.k,
        a.m,
        a.cols,
        a.footprint >> 20,
        a.reps
    );
    println!(
        "{:<9} {:>7} {:>10} {:>10} {:>8} {:>10}",
        "format", "threads", "gemv GB/s", "read GB/s", "ratio", "prepare µs"
    );
    let xs: Vec<Vec<f32>> = (0..a.cols)
        .map(|j| {
            (0..a.k)
                .map(|i| (((i + 13 * j) * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect()
        })
        .collect();
    for &fmt in &a.formats {
        let rb = fmt.row_bytes(a.k)?;
        let distinct = distinct_rows(fmt, a.k)?;
        let mat_bytes = a.m * rb;
        let copies = a.footprint.div_ceil(mat_bytes).max(1);
        let mats: Vec<Vec<u8>> = (0..copies).map(|_| tiled(&distinct, a.m)).collect();
        let total = (copies * mat_bytes * a.repeat) as f64;
        for &t in &a.threads {
            let ranges = split(a.m, t);
            let mut y = vec![0f32; a.m * a.cols];
            let (mut best_gemv, mut best_read, mut best_prep) = (f64::MAX, f64::MAX, f64::MAX);
            for _ in 0..a.reps {
                let t0 = Instant::now();
                let acts: Vec<ActivationBuf> = xs
                    .iter()
                    .map(|x| ActivationBuf::prepare(fmt, x))
                    .collect::<Result<_, _>>()?;
                best_prep = best_prep.min(t0.elapsed().as_secs_f64());
                // One thread per row range for the whole pass; each walks its rows of every copy.
                let t0 = Instant::now();
                std::thread::scope(|s| -> Result<(), Box<dyn Error>> {
                    let mut rest: &mut [f32] = &mut y;
                    let mut handles = Vec::new();
                    let cols = a.cols;
                    for r in &ranges {
                        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(r.len() * cols);
                        rest = tail;
                        let (acts, mats, r) = (&acts, &mats, r.clone());
                        handles.push(s.spawn(move || {
                            let act_refs: Vec<&ActivationBuf> = acts.iter().collect();
                            for w in mats.iter().cycle().take(mats.len() * a.repeat) {
                                let w = &w[r.start * rb..r.end * rb];
                                if cols == 1 {
                                    gemv_rows(fmt, w, a.k, act_refs[0], mine, false)?;
                                } else {
                                    let mut ys: Vec<&mut [f32]> =
                                        mine.chunks_mut(r.len()).collect();
                                    gemv_rows_multi(fmt, w, a.k, &act_refs, &mut ys, false)?;
                                }
                                black_box(&mut *mine);
                            }
                            Ok::<(), hipfire_quant::QuantError>(())
                        }));
                    }
                    for h in handles {
                        h.join().map_err(|_| "worker panicked")??;
                    }
                    Ok(())
                })?;
                best_gemv = best_gemv.min(t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                std::thread::scope(|s| {
                    let hs: Vec<_> = ranges
                        .iter()
                        .map(|r| {
                            let mats = &mats;
                            s.spawn(move || {
                                mats.iter().cycle().take(mats.len() * a.repeat).fold(
                                    0u64,
                                    |acc, w| {
                                        acc.wrapping_add(hipfire_quant::read_sum(
                                            &w[r.start * rb..r.end * rb],
                                        ))
                                    },
                                )
                            })
                        })
                        .collect();
                    for h in hs {
                        black_box(h.join().unwrap_or(0));
                    }
                });
                best_read = best_read.min(t0.elapsed().as_secs_f64());
            }
            let (g, r) = (total / best_gemv / 1e9, total / best_read / 1e9);
            println!(
                "{:<9} {:>7} {:>10.2} {:>10.2} {:>8.2} {:>10.1}",
                fmt.name(),
                t,
                g,
                r,
                g / r,
                best_prep * 1e6
            );
        }
    }
    Ok(())
}
