//! `hipfire offload-bench`: per format, GEMV bandwidth over a host-resident matrix for the
//! CPU alone, the GPU (reading host-mapped memory) alone, and both at once at the balanced
//! share; recommends one `memory.offload_passback_share`.

use crate::stats::median;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use hipfire_config::{CliOverride, ConfigFile, ProcessEnv};
use hipfire_quant::{ActivationBuf, Format};
use serde::Serialize;

use crate::args::OffloadBenchArgs;
use crate::gpu_probe::{self, BenchGpu, GpuAvail};
use crate::{daemon, Ctx, EXIT_OK, EXIT_REFUSED};
use hipfire_exec::CpuPool;
use hipfire_gpu::RowRange;

/// Bytes in a MiB.
const MIB: usize = 1 << 20;

/// Seed of the synthetic weights and activation (contents do not change the timing, but a
/// fixed seed makes runs byte-identical and keeps the data away from all-zeros fast paths).
const DATA_SEED: u64 = 0x6869_7066_6972_6521;

/// One format's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct FormatResult {
    /// Format name.
    pub format: String,
    /// Rows of the synthetic matrix.
    pub m: usize,
    /// Columns.
    pub k: usize,
    /// Weight bytes (m × row bytes).
    pub bytes: usize,
    /// CPU workers alone, weight bytes per second (median of the reps).
    pub cpu_bytes_per_s: f64,
    /// Plain read of the same bytes by the same workers (hipfire-exec's read probe): the
    /// ceiling the CPU GEMV is measured against.
    pub cpu_read_bytes_per_s: f64,
    /// GPU alone over host-mapped memory; `None` without a GPU.
    pub gpu_bytes_per_s: Option<f64>,
    /// Both engines at once at `share`; `None` without a GPU.
    pub both_bytes_per_s: Option<f64>,
    /// Rows the GPU took in the both-at-once run (share × m, rounded); 0 without a GPU.
    pub gpu_rows: usize,
    /// Balanced GPU share r_gpu / (r_gpu + r_cpu); 0 without a GPU.
    pub share: f64,
    /// Speedup bound of the split over the faster engine alone: (r_gpu + r_cpu) / max(r_gpu, r_cpu).
    pub predicted_speedup: f64,
    /// Measured both-at-once over the faster engine alone; `None` without a GPU.
    pub measured_speedup: Option<f64>,
}

/// The whole report (`--json` prints this).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// hipfire version.
    pub version: &'static str,
    /// Build commit, when known.
    pub commit: Option<&'static str>,
    /// CPU SIMD tier used by the row dots.
    pub simd: String,
    /// GPU measured, or why none was.
    pub gpu: GpuJson,
    /// CPU worker threads.
    pub threads: usize,
    /// Matrix columns.
    pub k: usize,
    /// Weight MiB per format.
    pub buffer_mib: usize,
    /// Timed repetitions per engine.
    pub reps: usize,
    /// Per-format results.
    pub formats: Vec<FormatResult>,
    /// The recommended share, `None` without a GPU.
    pub recommended_share: Option<f64>,
    /// The median balanced share before the cap; above the cap when the GPU arm is the
    /// faster engine, which the config rule cannot express yet.
    pub median_share: Option<f64>,
    /// How the recommendation was derived.
    pub recommendation_rule: &'static str,
}

/// GPU part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct GpuJson {
    /// Whether a GPU was measured.
    pub found: bool,
    /// Device name, or why there is none.
    pub detail: String,
}

const RECOMMENDATION_RULE: &str =
    "median of the per-format balanced shares, capped at 0.5 (the rule of memory.offload_passback_share)";

/// Run the benchmark.
pub fn run(ctx: &Ctx, a: &OffloadBenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(msg) = daemon::refusal("offload-bench") {
        // stdout stays empty so a script capturing JSON sees nothing rather than a half report.
        let _ = writeln!(std::io::stderr(), "{msg}");
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    let formats = parse_formats(&a.format)?;
    let mut overrides = Vec::new();
    if let Some(t) = &a.threads {
        overrides.push(CliOverride::new("cpu.threads", "--threads", t.clone()));
    }
    let (_, settings) = ctx.settings_with(&overrides)?;
    let gpu = gpu_probe::bench_engine(settings.device, settings.kernel_cache.dir())?;
    // Pinned workers, as in a real step: with a GPU, hipfire-exec's offload pool (its `auto`
    // leaves one core to the thread driving the GPU; workers spin through the gaps), else the
    // plain pool with one worker per physical core.
    let pool = match &gpu {
        GpuAvail::Found(_) => {
            hipfire_exec::offload::offload_pool(crate::model_cmd::pool_threads(settings.threads))?
        }
        GpuAvail::Absent(_) => CpuPool::new(settings.threads.get().get())?,
    };
    let threads = pool.threads();
    let gpu_json = match &gpu {
        GpuAvail::Found(g) => GpuJson {
            found: true,
            detail: g.name(),
        },
        GpuAvail::Absent(why) => {
            ctx.note(format!("no GPU measured ({why}): measuring the CPU only"));
            GpuJson {
                found: false,
                detail: format!("none ({why})"),
            }
        }
    };
    let gpu_ref = match &gpu {
        GpuAvail::Found(g) => Some(g.as_ref()),
        GpuAvail::Absent(_) => None,
    };

    let mut results = Vec::new();
    for fmt in formats {
        let r = measure(fmt, a, &pool, gpu_ref).with_context(|| format!("measuring {fmt}"))?;
        results.push(r);
    }
    let median_share = gpu_ref.and_then(|_| median_share(&results));
    let recommended = median_share.map(|m| m.min(hipfire_config::schema::MAX_PASSBACK_SHARE));
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        commit: crate::version::commit(),
        simd: hipfire_quant::simd_tier().to_string(),
        gpu: gpu_json,
        threads,
        k: a.k,
        buffer_mib: a.buffer_mb,
        reps: a.reps,
        formats: results,
        recommended_share: recommended,
        median_share,
        recommendation_rule: RECOMMENDATION_RULE,
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        print_table(&mut out, &report)?;
    }
    out.flush()?;
    if a.write {
        let Some(share) = recommended else {
            ctx.note("nothing written: no GPU was measured, so there is no share to recommend");
            return Ok(ExitCode::from(EXIT_REFUSED));
        };
        let path = hipfire_config::config_path(ctx.config_file.as_deref(), &ProcessEnv)?;
        let mut file = ConfigFile::open_for_edit(&path)?;
        let v = file.set("memory.offload_passback_share", &format!("{share:.3}"))?;
        file.save()?;
        ctx.note(format!(
            "wrote memory.offload_passback_share = {v} to {}",
            path.display()
        ));
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// `--format` names, or every format with a CPU row dot and a GPU kernel.
fn parse_formats(names: &[String]) -> anyhow::Result<Vec<Format>> {
    if names.is_empty() {
        return Ok(Format::ALL
            .into_iter()
            .filter(|f| f.has_cpu_simd() && f.has_gpu_kernel())
            .collect());
    }
    names
        .iter()
        .map(|n| {
            Format::from_name(n).with_context(|| {
                let all: Vec<_> = Format::ALL.iter().map(|f| f.name()).collect();
                format!("unknown format `{n}`; known: {}", all.join(", "))
            })
        })
        .collect()
}

/// Median of the per-format balanced shares (the recommendation before the cap of
/// [`RECOMMENDATION_RULE`]).
fn median_share(results: &[FormatResult]) -> Option<f64> {
    let mut shares: Vec<f64> = results
        .iter()
        .map(|r| r.share)
        .filter(|s| s.is_finite())
        .collect();
    if shares.is_empty() {
        return None;
    }
    shares.sort_by(f64::total_cmp);
    let mid = shares.len() / 2;
    Some(if shares.len() % 2 == 1 {
        shares[mid]
    } else {
        0.5 * (shares[mid - 1] + shares[mid])
    })
}

/// The synthetic GEMV operands.
struct Synthetic {
    /// m rows of weight bytes.
    w: Vec<u8>,
    /// Rows.
    m: usize,
    /// The activation, f32.
    x: Vec<f32>,
    /// The activation prepared for the CPU row dot.
    act: ActivationBuf,
}

/// Output multiplier of xorshift64* (Vigna, "An experimental exploration of Marsaglia's
/// xorshift generators, scrambled", 2016, the M32 constant).
const XORSHIFT_STAR_MULT: u64 = 0x2545_F491_4F6C_DD1D;

/// xorshift64*: a tiny seeded generator, enough for filler data (no statistics asked of it).
struct Filler(u64);
impl Filler {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(XORSHIFT_STAR_MULT);
        // Top 24 bits → [-1, 1).
        ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// The synthetic matrix: one quantised random row repeated m times (the bytes streamed are
/// what matters; a row repeated every few KiB cannot be cached across a 192 MiB sweep).
fn synthetic(fmt: Format, k: usize, buffer_bytes: usize) -> anyhow::Result<Synthetic> {
    let rb = fmt.row_bytes(k)?;
    let m = buffer_bytes.div_ceil(rb).max(1);
    let mut rng = Filler(DATA_SEED);
    let row_f: Vec<f32> = (0..k).map(|_| rng.next_f32()).collect();
    let row = hipfire_quant::quantize_row(fmt, &row_f)?;
    let bytes = m
        .checked_mul(rb)
        .with_context(|| format!("{m} rows of {rb} bytes overflow"))?;
    let mut w = try_zeroed(bytes, "the synthetic weight matrix")?;
    for dst in w.chunks_exact_mut(rb) {
        dst.copy_from_slice(&row);
    }
    let x: Vec<f32> = (0..k).map(|_| rng.next_f32()).collect();
    let act = ActivationBuf::prepare(fmt, &x)?;
    Ok(Synthetic { w, m, x, act })
}

/// `bytes` zeroed bytes, or an error naming the bytes (instead of the allocator's abort).
/// Beyond `MemAvailable` it refuses up front, naming both: with overcommit the reservation
/// would succeed and the zeroing would summon the OOM killer instead.
fn try_zeroed(bytes: usize, what: &str) -> anyhow::Result<Vec<u8>> {
    if let Some(avail) = hipfire_gpu::mem_available_bytes() {
        if bytes as u64 > avail {
            bail!("{what} needs {bytes} bytes, but only {avail} bytes of RAM are available");
        }
    }
    let mut v = Vec::new();
    v.try_reserve_exact(bytes)
        .with_context(|| format!("cannot allocate {bytes} bytes for {what}"))?;
    v.resize(bytes, 0);
    Ok(v)
}

/// Seconds for the pool to compute rows `[row0, row0 + y.len())` of `w`.
fn cpu_rows(
    pool: &CpuPool,
    fmt: Format,
    w: &[u8],
    k: usize,
    act: &ActivationBuf,
    row0: usize,
    y: &mut [f32],
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    pool.gemv_prepared(fmt, w, k, act, row0, y, false)?;
    Ok(t0.elapsed().as_secs_f64())
}

/// Rows the GPU takes at `share` of `m`: at least one and at most m − 1, so both arms run.
fn gpu_rows(share: f64, m: usize) -> usize {
    if m < 2 {
        return m;
    }
    ((share * m as f64).round() as usize).clamp(1, m - 1)
}

fn measure(
    fmt: Format,
    a: &OffloadBenchArgs,
    pool: &CpuPool,
    gpu: Option<&BenchGpu>,
) -> anyhow::Result<FormatResult> {
    let buffer = a
        .buffer_mb
        .checked_mul(MIB)
        .with_context(|| format!("--buffer-mb {} overflows", a.buffer_mb))?;
    let syn = synthetic(fmt, a.k, buffer)?;
    let (m, k) = (syn.m, a.k);
    // With a GPU the CPU reads the same pinned host-mapped pages the GPU does, as in a real
    // spilled step; without one, plain heap memory.
    let mut staged = match gpu {
        Some(g) => Some(g.stage(fmt, &syn.w, &syn.x, m, k)?),
        None => None,
    };
    let bytes = syn.w.len();
    let mut y = vec![f32::NAN; m];
    {
        let w: &[u8] = staged.as_ref().map(|s| s.host()).unwrap_or(&syn.w);
        // One warm-up: page faults, worker wake-up and the tier's first use are not bandwidth.
        cpu_rows(pool, fmt, w, k, &syn.act, 0, &mut y)?;
        if y.iter().any(|v| v.is_nan()) {
            bail!("the CPU GEMV left rows unwritten");
        }
    }
    let mut cpu_t = Vec::with_capacity(a.reps);
    let mut gpu_t = Vec::with_capacity(a.reps);
    // Interleave the engines round by round so drift in host load hits both alike.
    if let (Some(g), Some(s)) = (gpu, staged.as_mut()) {
        g.time_rows(s, RowRange::all(m))?;
    }
    for _ in 0..a.reps {
        let w: &[u8] = staged.as_ref().map(|s| s.host()).unwrap_or(&syn.w);
        cpu_t.push(cpu_rows(pool, fmt, w, k, &syn.act, 0, &mut y)?);
        if let (Some(g), Some(s)) = (gpu, staged.as_mut()) {
            gpu_t.push(g.time_rows(s, RowRange::all(m))?);
        }
    }
    let r_cpu = bytes as f64 / median(cpu_t);
    let read = {
        let w: &[u8] = staged.as_ref().map(|s| s.host()).unwrap_or(&syn.w);
        hipfire_exec::bench::read_bandwidth(pool, w, fmt.row_bytes(k)?, a.reps)?
    };
    let mut res = FormatResult {
        format: fmt.name().to_string(),
        m,
        k,
        bytes,
        cpu_bytes_per_s: r_cpu,
        cpu_read_bytes_per_s: read.rate.gbps * 1e9,
        gpu_bytes_per_s: None,
        both_bytes_per_s: None,
        gpu_rows: 0,
        share: 0.0,
        predicted_speedup: 1.0,
        measured_speedup: None,
    };
    let (Some(g), Some(s)) = (gpu, staged.as_mut()) else {
        return Ok(res);
    };
    let r_gpu = bytes as f64 / median(gpu_t);
    let share = r_gpu / (r_gpu + r_cpu);
    let rows = gpu_rows(share, m);
    let mut both_t = Vec::with_capacity(a.reps);
    for rep in 0..=a.reps {
        let t0 = Instant::now();
        g.launch(s, RowRange::new(0, rows))?;
        pool.gemv_prepared(fmt, s.host(), k, &syn.act, rows, &mut y[rows..], false)?;
        g.sync()?;
        // Rep 0 is the warm-up of the split itself (both engines on the same pages at once).
        if rep > 0 {
            both_t.push(t0.elapsed().as_secs_f64());
        }
    }
    let r_both = bytes as f64 / median(both_t);
    let best = r_gpu.max(r_cpu);
    res.gpu_bytes_per_s = Some(r_gpu);
    res.both_bytes_per_s = Some(r_both);
    res.gpu_rows = rows;
    res.share = share;
    res.predicted_speedup = (r_gpu + r_cpu) / best;
    res.measured_speedup = Some(r_both / best);
    Ok(res)
}

fn gbs(x: Option<f64>) -> String {
    x.map(|v| format!("{:.1}", v / 1e9))
        .unwrap_or_else(|| "—".into())
}

fn print_table(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    writeln!(
        out,
        "offload-bench: {} CPU threads ({}), GPU: {}; k {}, {} MiB per format, median of {}",
        r.threads, r.simd, r.gpu.detail, r.k, r.buffer_mib, r.reps
    )?;
    writeln!(
        out,
        "{:<9} {:>8} {:>6} {:>6} {:>9} {:>9} {:>9} {:>10} {:>6} {:>8} {:>9}",
        "format",
        "m",
        "k",
        "MiB",
        "cpu read",
        "cpu GB/s",
        "gpu GB/s",
        "both GB/s",
        "share",
        "bound",
        "measured"
    )?;
    for f in &r.formats {
        writeln!(
            out,
            "{:<9} {:>8} {:>6} {:>6.0} {:>9} {:>9} {:>9} {:>10} {:>6.3} {:>7.2}x {:>9}",
            f.format,
            f.m,
            f.k,
            f.bytes as f64 / MIB as f64,
            gbs(Some(f.cpu_read_bytes_per_s)),
            gbs(Some(f.cpu_bytes_per_s)),
            gbs(f.gpu_bytes_per_s),
            gbs(f.both_bytes_per_s),
            f.share,
            f.predicted_speedup,
            f.measured_speedup
                .map(|s| format!("{s:.2}x"))
                .unwrap_or_else(|| "—".into()),
        )?;
    }
    match (r.recommended_share, r.median_share) {
        (Some(s), Some(m)) if m > s => writeln!(
            out,
            "recommended: memory.offload_passback_share = {s:.3} ({}); the GPU is the faster \
             engine here (median balanced share {m:.3}), so the cap binds",
            r.recommendation_rule
        ),
        (Some(s), _) => writeln!(
            out,
            "recommended: memory.offload_passback_share = {s:.3} ({})",
            r.recommendation_rule
        ),
        (None, _) => writeln!(
            out,
            "no GPU measured: no share to recommend (the CPU does every spilled row)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fr(share: f64) -> FormatResult {
        FormatResult {
            format: "x".into(),
            m: 1,
            k: 1,
            bytes: 1,
            cpu_bytes_per_s: 1.0,
            cpu_read_bytes_per_s: 1.0,
            gpu_bytes_per_s: None,
            both_bytes_per_s: None,
            gpu_rows: 0,
            share,
            predicted_speedup: 1.0,
            measured_speedup: None,
        }
    }

    #[test]
    fn median_of_shares() {
        assert_eq!(median_share(&[fr(0.3), fr(0.1), fr(0.2)]), Some(0.2));
        assert_eq!(median_share(&[fr(0.3), fr(0.1)]), Some(0.2));
        assert_eq!(median_share(&[fr(0.7), fr(0.9), fr(0.6)]), Some(0.7));
        assert_eq!(median_share(&[]), None);
    }

    #[test]
    fn pool_rows_match_one_call_and_are_written() {
        // The pool's row split (and a row0 offset, as the CPU arm of a split uses) must give
        // the same bytes as one call of the row dot over the same rows.
        let pool = CpuPool::new(3).expect("pool");
        for fmt in [Format::Q8_0, Format::Q4K, Format::F16] {
            let k = 512;
            let rb = fmt.row_bytes(k).expect("rb");
            let syn = synthetic(fmt, k, 7 * rb + 3).expect("synth");
            assert_eq!(syn.m, 8);
            let mut y1 = vec![f32::NAN; syn.m];
            hipfire_quant::gemv_rows(fmt, &syn.w, k, &syn.act, &mut y1, false).expect("gemv");
            let mut y3 = vec![f32::NAN; syn.m];
            cpu_rows(&pool, fmt, &syn.w, k, &syn.act, 0, &mut y3[..3]).expect("head");
            cpu_rows(&pool, fmt, &syn.w, k, &syn.act, 3, &mut y3[3..]).expect("tail");
            assert_eq!(y1, y3, "{fmt}");
            assert!(
                y1.iter().all(|v| v.is_finite() && *v != 0.0),
                "{fmt}: {y1:?}"
            );
        }
    }

    #[test]
    fn gpu_rows_keep_both_arms() {
        assert_eq!(gpu_rows(0.3, 10), 3);
        assert_eq!(gpu_rows(0.0001, 10), 1);
        assert_eq!(gpu_rows(0.9999, 10), 9);
        assert_eq!(gpu_rows(0.5, 1), 1);
    }

    #[test]
    fn an_impossible_buffer_is_an_error_naming_the_bytes() {
        let e = try_zeroed(usize::MAX / 2, "the test buffer").expect_err("refused");
        let msg = format!("{e:#}");
        assert!(msg.contains(&(usize::MAX / 2).to_string()), "{msg}");
        let v = try_zeroed(4096, "a small buffer").expect("small");
        assert!(v.len() == 4096 && v.iter().all(|&b| b == 0));
    }

    #[test]
    fn unknown_format_is_named() {
        let e = parse_formats(&["q9_z".to_string()]).expect_err("bad");
        assert!(format!("{e:#}").contains("q9_z"));
    }
}
