//! CPU GEMV bandwidth next to a plain read of the same bytes, on the same pinned workers.
//!
//! The figure of merit is weight GB/s: bytes of `W` per second of GEMV. It is only meaningful
//! next to what the same threads can *read* from the same memory, so every function here runs
//! both, interleaved round by round in one process, over the same buffer with the same row
//! cut per worker. Results are plain serde structs: `hipfire offload-bench` prints or writes
//! them, the criterion bench and `examples/cpu_gemv_bench.rs` call the same code.
//!
//! Weights are made cold: decode streams through every layer once per token, so a benchmark
//! that multiplies one 9 MiB matrix over and over would measure the last-level cache. We lay
//! out enough copies of the matrix to fill [`COLD_SET_BYTES`] and walk through them.

use crate::error::ExecError;
use crate::kernel::ActivationBuf;
use crate::pool::{CpuPool, PoolConfig, PoolJob};
use hipfire_quant::Format;
use serde::Serialize;
use std::ops::Range;
use std::time::Instant;

/// Bytes of weight copies a bandwidth run cycles through. Larger than the last-level cache of
/// the machines we run on (H200 box host and CI: ≤ 256 MiB of L3 per socket on current server
/// parts without stacked cache), so every rep reads from DRAM.
pub const COLD_SET_BYTES: usize = 512 << 20;

/// Distinct random rows quantised for a benchmark weight; the rest are copies (quantising a
/// whole 9B matrix per format would dominate the run, and the dot's speed does not depend on
/// which values a row holds).
const DISTINCT_ROWS: usize = 64;

/// Seed of the benchmark weights and activation (any fixed value: runs are comparable).
const BENCH_SEED: u64 = 0x00c0_ffee;

/// One measured engine over `reps` rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    /// Median seconds per round.
    pub median_s: f64,
    /// Fastest round, seconds.
    pub best_s: f64,
    /// Bytes per round / median time, in GB/s (10^9 B/s).
    pub gbps: f64,
    /// Bytes per round / best time, GB/s.
    pub best_gbps: f64,
}

impl Rate {
    fn from_times(bytes: usize, times: &mut [f64]) -> Rate {
        times.sort_by(f64::total_cmp);
        let median_s = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        let best_s = times.first().copied().unwrap_or(f64::NAN);
        Rate {
            median_s,
            best_s,
            gbps: bytes as f64 / median_s / 1e9,
            best_gbps: bytes as f64 / best_s / 1e9,
        }
    }
}

/// A plain read of a buffer by the pool's workers.
#[derive(Debug, Clone, Serialize)]
pub struct ReadBandwidth {
    /// Worker threads.
    pub threads: usize,
    /// Bytes read per round.
    pub bytes: usize,
    /// Rounds.
    pub reps: usize,
    /// The rate.
    pub rate: Rate,
}

/// CPU GEMV bandwidth of one format and shape, with the read of the same bytes beside it.
#[derive(Debug, Clone, Serialize)]
pub struct GemvBandwidth {
    /// Format name (`q4_0`, ...).
    pub format: String,
    /// Row length.
    pub k: usize,
    /// Rows.
    pub m: usize,
    /// Weight bytes of one matrix (`m × row_bytes`).
    pub weight_bytes: usize,
    /// Worker threads.
    pub threads: usize,
    /// Logical CPU of each worker (`None`: unpinned).
    pub cores: Vec<Option<usize>>,
    /// hipfire-quant's SIMD tier.
    pub simd_tier: String,
    /// Rounds (each: one GEMV, then one read of the same matrix copy).
    pub reps: usize,
    /// GEMV: weight bytes per second (includes preparing the activation, as a real step does).
    pub gemv: Rate,
    /// Plain read of the same bytes by the same workers, same row cut.
    pub read: Rate,
    /// `gemv.gbps / read.gbps`: the fraction of readable bandwidth the GEMV reaches.
    pub gemv_over_read: f64,
}

/// A plain read of `rows` (a range of `unit`-byte rows of `buf`) with hipfire-quant's read
/// loop: the ceiling a GEMV over the same rows is measured against.
struct ReadJob<'a> {
    buf: &'a [u8],
    unit: usize,
}

impl PoolJob for ReadJob<'_> {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        Ok(hipfire_quant::read_sum(
            &self.buf[rows.start * self.unit..rows.end * self.unit],
        ))
    }
}

/// Read `buf` (as `unit`-byte rows cut like a GEMV's) `reps` times on `pool`'s workers.
pub fn read_bandwidth(
    pool: &CpuPool,
    buf: &[u8],
    unit: usize,
    reps: usize,
) -> Result<ReadBandwidth, ExecError> {
    let unit = unit.max(1);
    let rows = buf.len() / unit;
    let mut times = Vec::with_capacity(reps);
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        sink ^= pool.run_job(&ReadJob { buf, unit }, 0..rows)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    Ok(ReadBandwidth {
        threads: pool.threads(),
        bytes: rows * unit,
        reps: reps.max(1),
        rate: Rate::from_times(rows * unit, &mut times),
    })
}

/// What [`read_until`] read: bytes, over how long.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ReadWindow {
    /// Bytes read.
    pub bytes: usize,
    /// Seconds from the first chunk's start to the last one's end.
    pub seconds: f64,
}

impl ReadWindow {
    /// GB/s (10^9 B/s) over the window.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(f64::MIN_POSITIVE) / 1e9
    }
}

/// Read `buf` on `pool`'s workers chunk after chunk (`chunk` bytes, `unit`-byte rows cut like a
/// GEMV's, cycling through the buffer) until `stop` says so; `stop` is asked before each chunk
/// and at least one chunk is read. For a read ceiling over another engine's window: the caller
/// stops when that engine is done, so the two rates cover the same time (within one chunk).
pub fn read_until(
    pool: &CpuPool,
    buf: &[u8],
    unit: usize,
    chunk: usize,
    mut stop: impl FnMut() -> Result<bool, ExecError>,
) -> Result<ReadWindow, ExecError> {
    let unit = unit.max(1);
    let chunk_rows = (chunk / unit).clamp(1, (buf.len() / unit).max(1));
    let rows = buf.len() / unit;
    if rows == 0 {
        return Err(ExecError::Invalid {
            what: "read buffer",
            value: format!("{} bytes", buf.len()),
            rule: "holds at least one row",
        });
    }
    let t0 = Instant::now();
    let (mut bytes, mut at, mut sink) = (0usize, 0usize, 0u64);
    loop {
        let end = (at + chunk_rows).min(rows);
        sink ^= pool.run_job(&ReadJob { buf, unit }, at..end)?;
        bytes += (end - at) * unit;
        at = if end == rows { 0 } else { end };
        if stop()? {
            break;
        }
    }
    std::hint::black_box(sink);
    Ok(ReadWindow {
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Round-trip cost of one pool call that does no work: send to every worker, all reply.
#[derive(Debug, Clone, Serialize)]
pub struct DispatchLatency {
    /// Worker threads.
    pub threads: usize,
    /// Calls measured per case.
    pub reps: usize,
    /// Median µs when the previous call just returned (workers still spinning).
    pub warm_us: f64,
    /// Median µs after the workers have been idle past their spin window (parked).
    pub parked_us: f64,
    /// The spin window the pool was built with, µs.
    pub spin_window_us: f64,
}

/// A job that touches nothing (dispatch cost only).
struct EmptyJob;

impl PoolJob for EmptyJob {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        Ok(rows.start as u64)
    }
}

/// Idle gap before a "parked" call: well past any spin window we would configure.
const PARK_GAP: std::time::Duration = std::time::Duration::from_millis(2);

/// Measure [`DispatchLatency`] on `pool` (`reps` calls per case; one row block per worker).
pub fn dispatch_latency(pool: &CpuPool, reps: usize) -> Result<DispatchLatency, ExecError> {
    let rows = pool.threads() * crate::pool::WORKER_ROW_ALIGN;
    let reps = reps.max(1);
    let mut warm = Vec::with_capacity(reps);
    let mut parked = Vec::with_capacity(reps);
    pool.run_job(&EmptyJob, 0..rows)?;
    for _ in 0..reps {
        let t0 = Instant::now();
        pool.run_job(&EmptyJob, 0..rows)?;
        warm.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    for _ in 0..reps {
        std::thread::sleep(PARK_GAP);
        let t0 = Instant::now();
        pool.run_job(&EmptyJob, 0..rows)?;
        parked.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(DispatchLatency {
        threads: pool.threads(),
        reps,
        warm_us: med(&mut warm),
        parked_us: med(&mut parked),
        spin_window_us: pool.spin_window().as_secs_f64() * 1e6,
    })
}

/// A cold set of copies of one random `m × k` matrix in `fmt`: returns the buffer and the
/// number of copies (at least 2, so consecutive rounds never reuse the same bytes).
fn cold_weights(
    fmt: Format,
    k: usize,
    m: usize,
    cold_bytes: usize,
) -> Result<(Vec<u8>, usize), ExecError> {
    use rand::{Rng, SeedableRng};
    let rb = fmt.row_bytes(k)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(BENCH_SEED);
    let mut distinct = Vec::with_capacity(DISTINCT_ROWS * rb);
    for _ in 0..DISTINCT_ROWS {
        let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        distinct.extend(hipfire_quant::quantize_row(fmt, &row)?);
    }
    let matrix = m * rb;
    let copies = (cold_bytes / matrix.max(1)).max(2);
    let mut buf = Vec::with_capacity(copies * matrix);
    while buf.len() < copies * matrix {
        let take = (copies * matrix - buf.len()).min(distinct.len());
        buf.extend_from_slice(&distinct[..take]);
    }
    Ok((buf, copies))
}

/// CPU GEMV GB/s of `fmt` at `k × m` on a fresh pool of `threads` workers (0 = one per
/// physical core), `reps` interleaved rounds of GEMV and plain read over the same bytes.
pub fn cpu_gemv_bandwidth(
    fmt: Format,
    k: usize,
    m: usize,
    threads: usize,
    reps: usize,
) -> Result<GemvBandwidth, ExecError> {
    let pool = CpuPool::with_config(PoolConfig {
        threads,
        ..PoolConfig::default()
    })?;
    cpu_gemv_bandwidth_on(&pool, fmt, k, m, reps, COLD_SET_BYTES)
}

/// [`cpu_gemv_bandwidth`] on an existing pool, cycling through `cold_bytes` of weight copies
/// (at least two copies).
pub fn cpu_gemv_bandwidth_on(
    pool: &CpuPool,
    fmt: Format,
    k: usize,
    m: usize,
    reps: usize,
    cold_bytes: usize,
) -> Result<GemvBandwidth, ExecError> {
    use rand::{Rng, SeedableRng};
    if m == 0 {
        return Err(ExecError::Invalid {
            what: "m",
            value: "0".into(),
            rule: "at least one row",
        });
    }
    let rb = fmt.row_bytes(k)?;
    let matrix = m * rb;
    let (buf, copies) = cold_weights(fmt, k, m, cold_bytes)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(BENCH_SEED ^ 1);
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut y = vec![0.0f32; m];
    let reps = reps.max(1);
    let (mut tg, mut tr) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    let mut sink = 0u64;
    // One untimed warm-up round (page faults, worker wake-up, tier detection).
    pool.gemv(fmt, &buf[..matrix], k, &x, &mut y, false)?;
    for rep in 0..reps {
        // GEMV and read alternate over *different* copies so neither finds the other's bytes
        // in cache; both walk the whole cold set over the run.
        let g = &buf[(2 * rep % copies) * matrix..][..matrix];
        let r = &buf[((2 * rep + 1) % copies) * matrix..][..matrix];
        let t0 = Instant::now();
        let act = ActivationBuf::prepare(fmt, &x)?;
        pool.gemv_prepared(fmt, g, k, &act, 0, &mut y, false)?;
        tg.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        sink ^= pool.run_job(&ReadJob { buf: r, unit: rb }, 0..m)?;
        tr.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box((sink, &y));
    let gemv = Rate::from_times(matrix, &mut tg);
    let read = Rate::from_times(matrix, &mut tr);
    Ok(GemvBandwidth {
        format: fmt.name().to_string(),
        k,
        m,
        weight_bytes: matrix,
        threads: pool.threads(),
        cores: pool.cores().to_vec(),
        simd_tier: hipfire_quant::simd_tier().to_string(),
        reps,
        gemv_over_read: gemv.gbps / read.gbps,
        gemv,
        read,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_job_checksum_matches_serial_fold_over_the_same_cuts() {
        let buf: Vec<u8> = (0..64 * 100).map(|i| (i * 7 % 251) as u8).collect();
        let pool = CpuPool::new(3).expect("pool");
        let job = ReadJob {
            buf: &buf,
            unit: 64,
        };
        let pooled = pool.run_job(&job, 0..100).expect("run");
        // The pool XOR-folds the workers' sums: the same fold over the same 16-row-aligned cuts,
        // computed serially, proves every part was read exactly once.
        let serial = crate::pool::partition(0..100, pool.threads(), crate::pool::WORKER_ROW_ALIGN)
            .into_iter()
            .fold(0u64, |acc, r| acc ^ job.run(r).expect("serial"));
        assert_eq!(pooled, serial);
        assert_ne!(serial, 0);
    }

    #[test]
    fn read_until_reads_whole_chunks_cycling_through_the_buffer_until_told_to_stop() {
        let buf: Vec<u8> = (0..64 * 100).map(|i| (i * 13 % 251) as u8).collect();
        let pool = CpuPool::new(2).expect("pool");
        // 40-row chunks of a 100-row buffer: 40, 40, 20 (the tail), then 40 again from the start.
        let mut asked = 0;
        let w = read_until(&pool, &buf, 64, 40 * 64, || {
            asked += 1;
            Ok(asked == 4)
        })
        .expect("read");
        assert_eq!(w.bytes, (40 + 40 + 20 + 40) * 64);
        assert!(w.seconds > 0.0 && w.gbps() > 0.0);
        // Stop at once: still one chunk.
        let one = read_until(&pool, &buf, 64, 1 << 20, || Ok(true)).expect("read");
        assert_eq!(one.bytes, 100 * 64);
        assert!(read_until(&pool, &buf[..10], 64, 64, || Ok(true)).is_err());
    }

    #[test]
    fn dispatch_latency_is_measured() {
        let pool = CpuPool::new(2).expect("pool");
        let d = dispatch_latency(&pool, 3).expect("latency");
        assert!(d.warm_us > 0.0 && d.parked_us > 0.0);
        assert_eq!(d.threads, 2);
    }

    #[test]
    fn bandwidth_result_is_sane() {
        let pool = CpuPool::new(2).expect("pool");
        let r = cpu_gemv_bandwidth_on(&pool, Format::Q8_0, 256, 256, 2, 1 << 20).expect("bench");
        assert_eq!(
            r.weight_bytes,
            256 * Format::Q8_0.row_bytes(256).expect("k")
        );
        assert!(r.gemv.gbps.is_finite() && r.gemv.gbps > 0.0);
        assert!(r.read.gbps.is_finite() && r.read.gbps > 0.0);
        assert_eq!(r.threads, 2);
        let json = serde_json::to_string(&r).expect("serialise");
        assert!(json.contains("\"format\":\"q8_0\""));
    }
}
