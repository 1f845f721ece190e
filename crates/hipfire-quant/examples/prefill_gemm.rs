//! Single-thread prefill GEMM throughput (GMAC/s) of `gemv_rows_multi`, driven the way
//! hipfire-exec's `CpuPool::gemv_tokens` drives it: the rows cut into tiles of
//! `--tile-kib` of weight, every token run over a tile (in groups of `--group`) before the next.
//!
//! With `--amx hw` (or `emu`, the scalar emulation) each shape also runs `gemm_bf16`, the AMX
//! bf16 GEMM, over all rows at once as each `gemv_tokens` worker does (tokens packed once per
//! call, timed apart and included in its figure); `--k` and `--tokens` take lists.
//!
//! ```text
//! cargo run --release -p hipfire-quant --example prefill_gemm -- [--k 4096,14336] [--m 2048]
//!     [--tokens 32,512] [--tile-kib 16] [--group 16] [--reps 7] [--formats q4_k,q6_k]
//!     [--amx off|hw|emu] [--amx-kblock 8,16,0] [--amx-group 1,4,0]
//! ```
//! `--amx-kblock` lists k-steps (of 32) per dequantised block to try, `--amx-group` panels
//! per group, 0 = the library's default for either;
//! each AMX line also gives the time of the dequantisation alone (`dequant`).
//! ```text
//! ```
//! Time is this thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time:
//! the dev VM's two cores are shared with other builds, and time spent descheduled would
//! otherwise dominate. The figure is the fastest of `--reps` passes.

use hipfire_quant::{
    amx_status, dequant_panels_for_bench, gemm_bf16, gemm_bf16_kblock, gemv_rows_multi,
    quantize_row, simd_tier, tiles_peak_for_bench, ActivationBuf, AmxEngine, Bf16Tokens, Format,
    AMX_KBLOCK_STEPS, AMX_PANEL_GROUP,
};
use std::error::Error;
use std::hint::black_box;
#[path = "support/mod.rs"]
mod support;
use support::{thread_cpu_ns, tiled, DISTINCT_ROWS};

struct Args {
    ks: Vec<usize>,
    m: usize,
    tokens: Vec<usize>,
    amx: Option<AmxEngine>,
    kblocks: Vec<usize>,
    groups: Vec<usize>,
    tile: usize,
    group: usize,
    reps: usize,
    formats: Vec<Format>,
}

fn parse() -> Result<Args, Box<dyn Error>> {
    let mut a = Args {
        ks: vec![4096],
        m: 2048,
        tokens: vec![32],
        amx: None,
        kblocks: vec![0],
        groups: vec![0],
        tile: 16 << 10,
        group: 16,
        reps: 7,
        formats: vec![Format::Q4K, Format::Q6K],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let [flag, val] = pair else {
            return Err(format!("{} needs a value", pair[0]).into());
        };
        match flag.as_str() {
            "--k" => a.ks = list(val)?,
            "--m" => a.m = val.parse()?,
            "--tokens" => a.tokens = list(val)?,
            "--amx-kblock" => a.kblocks = list(val)?,
            "--amx-group" => a.groups = list(val)?,
            "--amx" => {
                a.amx = match val.as_str() {
                    "off" => None,
                    "hw" => Some(AmxEngine::Hardware),
                    "emu" => Some(AmxEngine::Emulated),
                    _ => return Err(format!("--amx {val}: off, hw or emu").into()),
                }
            }
            "--tile-kib" => a.tile = val.parse::<usize>()? << 10,
            "--group" => a.group = val.parse()?,
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

fn list(v: &str) -> Result<Vec<usize>, Box<dyn Error>> {
    Ok(v.split(',').map(str::parse).collect::<Result<_, _>>()?)
}

/// Deterministic pseudo-random values in [-1, 1) (no rand dependency in an example).
fn lcg_values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = parse()?;
    println!(
        "tier {}, AMX {:?}, m {}, tile {} KiB, group {}",
        simd_tier(),
        amx_status(),
        a.m,
        a.tile >> 10,
        a.group
    );
    if let Some(engine) = a.amx {
        // The micro-kernel's ceiling with B from L1, L2 and beyond (A always from L1).
        for b_kib in [16usize, 1024, 16384] {
            let passes = (256 << 20) / (b_kib << 10);
            let mut best = f64::INFINITY;
            let mut macs = 0;
            for _ in 0..a.reps {
                let t0 = thread_cpu_ns()?;
                macs = tiles_peak_for_bench(engine, b_kib << 10, passes)?;
                best = best.min((thread_cpu_ns()? - t0) as f64 * 1e-9);
            }
            println!(
                "tiles alone, B {b_kib} KiB: {:.1} GMAC/s (best of {})",
                macs as f64 / best / 1e9,
                a.reps
            );
        }
    }
    for &k in &a.ks {
        for &fmt in &a.formats {
            let rb = fmt.row_bytes(k)?;
            let distinct: Vec<Vec<u8>> = (0..DISTINCT_ROWS)
                .map(|r| quantize_row(fmt, &lcg_values(r as u64, k)))
                .collect::<Result<_, _>>()?;
            let w = tiled(&distinct, a.m);
            for &tokens in &a.tokens {
                let xs: Vec<Vec<f32>> = (0..tokens)
                    .map(|t| lcg_values(1000 + t as u64, k))
                    .collect();
                let macs = (a.m * k * tokens) as f64;
                let q8 = run_q8(&a, fmt, &w, rb, k, &xs)?;
                print!(
                    "{fmt:?} k {k} tokens {tokens}: q8 row dots {:.1} GMAC/s",
                    macs / q8 / 1e9
                );
                if let Some(engine) = a.amx {
                    for &kb in &a.kblocks {
                        for &g in &a.groups {
                            let (total, pack) = run_amx(&a, engine, kb, g, fmt, &w, k, &xs)?;
                            let kb = if kb == 0 { AMX_KBLOCK_STEPS } else { kb };
                            let g = if g == 0 { AMX_PANEL_GROUP } else { g };
                            print!(
                                "\n    AMX {engine:?} kblock {kb} group {g}: {:.1} GMAC/s \
                                 ({:.2} x; packing {:.1} %)",
                                macs / total / 1e9,
                                q8 / total,
                                100.0 * pack / total
                            );
                        }
                    }
                    let dq = run_dequant(&a, fmt, &w, k)?;
                    print!(
                        "\n    dequant alone {:.2} ms = {:.2} ns/weight",
                        dq * 1e3,
                        dq * 1e9 / (a.m * k) as f64
                    );
                }
                println!(" (best of {})", a.reps);
            }
        }
    }
    Ok(())
}

/// Best seconds of the q8 row dots (`gemv_rows_multi` over tiles, as `gemv_tokens` before AMX).
fn run_q8(
    a: &Args,
    fmt: Format,
    w: &[u8],
    rb: usize,
    k: usize,
    xs: &[Vec<f32>],
) -> Result<f64, Box<dyn Error>> {
    let acts: Vec<ActivationBuf> = xs
        .iter()
        .map(|x| ActivationBuf::prepare(fmt, x))
        .collect::<Result<_, _>>()?;
    let refs: Vec<&ActivationBuf> = acts.iter().collect();
    let mut ys = vec![vec![0f32; a.m]; xs.len()];
    let tile_rows = (a.tile / rb).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..a.reps {
        let t0 = thread_cpu_ns()?;
        let mut r0 = 0;
        while r0 < a.m {
            let r1 = (r0 + tile_rows).min(a.m);
            let wt = &w[r0 * rb..r1 * rb];
            for (g, ys_g) in refs.chunks(a.group).zip(ys.chunks_mut(a.group)) {
                let mut yv: Vec<&mut [f32]> = ys_g.iter_mut().map(|y| &mut y[r0..r1]).collect();
                gemv_rows_multi(fmt, wt, k, g, &mut yv, false)?;
            }
            r0 = r1;
        }
        best = best.min((thread_cpu_ns()? - t0) as f64 * 1e-9);
        black_box(&ys);
    }
    Ok(best)
}

/// Best seconds of the AMX GEMM (packing included) and of its packing alone.
#[allow(clippy::too_many_arguments)]
fn run_amx(
    a: &Args,
    engine: AmxEngine,
    kblock: usize,
    group: usize,
    fmt: Format,
    w: &[u8],
    k: usize,
    xs: &[Vec<f32>],
) -> Result<(f64, f64), Box<dyn Error>> {
    let mut ys = vec![vec![0f32; a.m]; xs.len()];
    let (mut best, mut best_pack) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..a.reps {
        let t0 = thread_cpu_ns()?;
        let acts = Bf16Tokens::new(xs.len(), k)?;
        for (t, x) in xs.iter().enumerate() {
            acts.pack_token(t, x)?;
        }
        let t1 = thread_cpu_ns()?;
        let mut yv: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[..]).collect();
        if kblock == 0 && group == 0 {
            gemm_bf16(engine, fmt, w, k, &acts, &mut yv, false)?;
        } else {
            let kb = if kblock == 0 {
                AMX_KBLOCK_STEPS
            } else {
                kblock
            };
            let g = if group == 0 { AMX_PANEL_GROUP } else { group };
            gemm_bf16_kblock(engine, kb, g, fmt, w, k, &acts, &mut yv, false)?;
        }
        let t2 = thread_cpu_ns()?;
        best = best.min((t2 - t0) as f64 * 1e-9);
        best_pack = best_pack.min((t1 - t0) as f64 * 1e-9);
        black_box(&ys);
    }
    Ok((best, best_pack))
}

/// Best seconds of dequantising every panel alone (the AMX GEMM's share that is not tiles).
fn run_dequant(a: &Args, fmt: Format, w: &[u8], k: usize) -> Result<f64, Box<dyn Error>> {
    let mut best = f64::INFINITY;
    for _ in 0..a.reps {
        let t0 = thread_cpu_ns()?;
        black_box(dequant_panels_for_bench(fmt, w, k, a.m)?);
        best = best.min((thread_cpu_ns()? - t0) as f64 * 1e-9);
    }
    Ok(best)
}
