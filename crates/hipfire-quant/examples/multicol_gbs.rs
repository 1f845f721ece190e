//! Weight GB/s of `gemv_rows_multi` per format and column count B, DRAM-fed, and the ratio of
//! each B to B = 1 (`gemv_rows` of one activation) on the same threads in the same run.
//!
//! ```text
//! cargo run --release -p hipfire-quant --example multicol_gbs -- [--k 4096]
//!     [--weights-mib 64] [--cols 1,2,4,8,16,32,64] [--threads 1,2] [--reps 3]
//!     [--formats q4_k,q6_k,q8_0,q4_0] [--modes direct,tiled] [--json out.json]
//! ```
//! One m × k matrix of at least `--weights-mib` MiB (more than this CPU's L3 at the default), its
//! rows cut into one contiguous range per thread. Two call shapes, `--modes`:
//! - `direct`: each thread hands its whole range and all B activations to one
//!   `gemv_rows_multi` call;
//! - `tiled`: each thread walks its range in tiles of [`POOL_TILE_BYTES`] of rows (rounded up to
//!   whole `MULTI_ROW_TILE`s) and calls
//!   `gemv_rows_multi` per tile with up to [`POOL_TOKEN_GROUP`] activations at a time, as
//!   hipfire-exec's `CpuPool::gemv_tokens` does (so a tile is read from DRAM once and from L1
//!   for the other columns).
//!
//! GB/s counts each weight byte once per step, whatever B. Activations are prepared once, outside
//! the timing (a step prepares them once too, on the pool). Each figure is the best of `--reps`
//! passes: the dev VM is shared, so the best pass is the one least disturbed. "cpu GB/s" divides
//! by the slowest thread's CPU time instead of the wall time (time descheduled by other tenants
//! does not count).

use hipfire_quant::{gemv_rows, gemv_rows_multi, simd_tier, ActivationBuf, Format, MULTI_ROW_TILE};
#[path = "support/mod.rs"]
mod support;
use std::error::Error;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Instant;
use support::{distinct_rows, thread_cpu_ns, tiled};

/// hipfire-exec's `TOKEN_TILE_BYTES`: the row tile of one `gemv_tokens` call.
const POOL_TILE_BYTES: usize = 16 * 1024;
/// hipfire-exec's `TOKEN_GROUP`: activations per `gemv_rows_multi` call inside a tile.
const POOL_TOKEN_GROUP: usize = 32;

struct Args {
    k: usize,
    weights: usize,
    cols: Vec<usize>,
    threads: Vec<usize>,
    reps: usize,
    formats: Vec<Format>,
    modes: Vec<String>,
    json: Option<String>,
}

fn parse() -> Result<Args, Box<dyn Error>> {
    let mut a = Args {
        k: 4096,
        weights: 64 << 20,
        cols: vec![1, 2, 4, 8, 16, 32, 64],
        threads: vec![1],
        reps: 3,
        formats: vec![Format::Q4K, Format::Q6K, Format::Q8_0, Format::Q4_0],
        modes: vec!["direct".into(), "tiled".into()],
        json: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let list = |v: &str| -> Result<Vec<usize>, Box<dyn Error>> {
        Ok(v.split(',').map(str::parse).collect::<Result<_, _>>()?)
    };
    for pair in argv.chunks(2) {
        let [flag, val] = pair else {
            return Err(format!("{} needs a value", pair[0]).into());
        };
        match flag.as_str() {
            "--k" => a.k = val.parse()?,
            "--weights-mib" => a.weights = val.parse::<usize>()? << 20,
            "--cols" => a.cols = list(val)?,
            "--threads" => a.threads = list(val)?,
            "--reps" => a.reps = val.parse::<usize>()?.max(1),
            "--modes" => a.modes = val.split(',').map(String::from).collect(),
            "--json" => a.json = Some(val.clone()),
            "--formats" => {
                a.formats = val
                    .split(',')
                    .map(|s| Format::from_name(s).ok_or(format!("unknown format {s}")))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if a.cols.contains(&0) || a.threads.contains(&0) {
        return Err("--cols and --threads take positive counts".into());
    }
    for m in &a.modes {
        if m != "direct" && m != "tiled" {
            return Err(format!("unknown mode {m} (direct, tiled)").into());
        }
    }
    Ok(a)
}

fn split(m: usize, t: usize) -> Vec<std::ops::Range<usize>> {
    (0..t).map(|i| (m * i / t)..(m * (i + 1) / t)).collect()
}

/// One thread's share of a step: rows `r` of `w` against every activation into `y`
/// (`cols × r.len()`, column-major by activation).
#[allow(clippy::too_many_arguments)]
fn step(
    fmt: Format,
    k: usize,
    rb: usize,
    w: &[u8],
    acts: &[&ActivationBuf],
    y: &mut [f32],
    tiled_mode: bool,
) -> Result<(), hipfire_quant::QuantError> {
    let rows = w.len() / rb;
    if acts.len() == 1 {
        return gemv_rows(fmt, w, k, acts[0], y, false);
    }
    let mut ys: Vec<&mut [f32]> = y.chunks_mut(rows).collect();
    if !tiled_mode {
        return gemv_rows_multi(fmt, w, k, acts, &mut ys, false);
    }
    // hipfire-exec's `token_tile_rows`: whole groups of `MULTI_ROW_TILE` rows.
    let tile = (POOL_TILE_BYTES / rb).max(1).div_ceil(MULTI_ROW_TILE) * MULTI_ROW_TILE;
    let mut a = 0;
    while a < rows {
        let e = (a + tile).min(rows);
        for (g, group) in acts.chunks(POOL_TOKEN_GROUP).enumerate() {
            let j0 = g * POOL_TOKEN_GROUP;
            let mut sub: Vec<&mut [f32]> = ys[j0..j0 + group.len()]
                .iter_mut()
                .map(|y| &mut y[a..e])
                .collect();
            gemv_rows_multi(fmt, &w[a * rb..e * rb], k, group, &mut sub, false)?;
        }
        a = e;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = parse()?;
    let max_cols = a.cols.iter().copied().max().unwrap_or(1);
    println!(
        "tier {} | k {} | weights >= {} MiB | best of {} passes",
        simd_tier(),
        a.k,
        a.weights >> 20,
        a.reps
    );
    println!(
        "{:<7} {:<7} {:>7} {:>5} {:>10} {:>8} {:>10} {:>8}",
        "format", "mode", "threads", "cols", "GB/s", "vs B=1", "cpu GB/s", "vs B=1"
    );
    let xs: Vec<Vec<f32>> = (0..max_cols)
        .map(|j| {
            (0..a.k)
                .map(|i| (((i + 13 * j) * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect()
        })
        .collect();
    let mut json = String::from("[\n");
    for &fmt in &a.formats {
        let rb = fmt.row_bytes(a.k)?;
        let m = a.weights.div_ceil(rb);
        let w = tiled(&distinct_rows(fmt, a.k)?, m);
        let bytes = (m * rb) as f64;
        let acts: Vec<ActivationBuf> = xs
            .iter()
            .map(|x| ActivationBuf::prepare(fmt, x))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&ActivationBuf> = acts.iter().collect();
        for mode in &a.modes {
            for &t in &a.threads {
                let ranges = split(m, t);
                let mut base = None;
                for &cols in &a.cols {
                    let mut y = vec![0f32; m * cols];
                    let (mut best, mut best_cpu) = (f64::MAX, f64::MAX);
                    for _ in 0..a.reps {
                        let t0 = Instant::now();
                        std::thread::scope(|s| -> Result<(), Box<dyn Error>> {
                            let mut rest: &mut [f32] = &mut y;
                            let mut handles = Vec::new();
                            for r in &ranges {
                                let (mine, tail) =
                                    std::mem::take(&mut rest).split_at_mut(r.len() * cols);
                                rest = tail;
                                let w = &w[r.start * rb..r.end * rb];
                                let acts = &refs[..cols];
                                let tiled_mode = mode == "tiled";
                                handles.push(s.spawn(
                                    move || -> Result<u64, Box<dyn Error + Send + Sync>> {
                                        let c0 = thread_cpu_ns().map_err(|e| e.to_string())?;
                                        step(fmt, a.k, rb, w, acts, mine, tiled_mode)?;
                                        black_box(&mut *mine);
                                        Ok(thread_cpu_ns().map_err(|e| e.to_string())? - c0)
                                    },
                                ));
                            }
                            let mut slowest = 0u64;
                            for h in handles {
                                let ns = h.join().map_err(|_| "worker panicked")?;
                                slowest = slowest.max(ns.map_err(|e| e.to_string())?);
                            }
                            best_cpu = best_cpu.min(slowest as f64 * 1e-9);
                            Ok(())
                        })?;
                        best = best.min(t0.elapsed().as_secs_f64());
                    }
                    let gbs = bytes / best / 1e9;
                    let cpu_gbs = bytes / best_cpu / 1e9;
                    let (b1, cpu_b1) = *base.get_or_insert(if cols == 1 {
                        (gbs, cpu_gbs)
                    } else {
                        (f64::NAN, f64::NAN)
                    });
                    let ratio = gbs / b1;
                    let cpu_ratio = cpu_gbs / cpu_b1;
                    println!(
                        "{:<7} {:<7} {:>7} {:>5} {:>10.2} {:>8.2} {:>10.2} {:>8.2}",
                        fmt.name(),
                        mode,
                        t,
                        cols,
                        gbs,
                        ratio,
                        cpu_gbs,
                        cpu_ratio
                    );
                    let num = |v: f64| {
                        if v.is_finite() {
                            format!("{v:.4}")
                        } else {
                            "null".into()
                        }
                    };
                    let (ratio, cpu_ratio) = (num(ratio), num(cpu_ratio));
                    writeln!(
                        json,
                        "  {{\"format\": \"{}\", \"tier\": \"{}\", \"mode\": \"{mode}\", \
                         \"threads\": {t}, \"cols\": {cols}, \"k\": {}, \"rows\": {m}, \
                         \"weight_bytes\": {}, \"best_s\": {best:.6}, \"gbs\": {gbs:.4}, \
                         \"ratio_to_b1\": {ratio}, \"best_cpu_s\": {best_cpu:.6}, \
                         \"cpu_gbs\": {cpu_gbs:.4}, \"cpu_ratio_to_b1\": {cpu_ratio}}},",
                        fmt.name(),
                        simd_tier(),
                        a.k,
                        m * rb,
                    )?;
                }
            }
        }
    }
    if json.ends_with(",\n") {
        json.truncate(json.len() - 2);
        json.push('\n');
    }
    json.push_str("]\n");
    if let Some(path) = &a.json {
        std::fs::write(path, json)?;
    }
    Ok(())
}
