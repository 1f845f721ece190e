//! Times decode attention alone on Llama-3-8B's shape (32 query heads, 8 kv heads of 128, f16 or
//! q8_0 cache) at several depths: the split-KV kernels with the planner's plan and a sweep of chunk
//! counts × query heads a block. Launches rotate over 32 layers' caches, as a decode step does,
//! so at depth the bytes come from HBM and not from the 50 MB L2. Prints one JSON object per
//! line (and writes them to `--json PATH`): depth, variant, µs per call, K/V bytes read ÷ time.
//! (The records in docs/perf-checkpoints/2026-12-01-decode-attention-h200 also timed the
//! one-block-per-head kernel this replaced, from commit b3e597f of this program.)
//!
//!     attention_timing [--json PATH] [--depths 16,1024,4096,16384] [--iters N]
//!                      [--cache-type f16|q8_0] [--define NAME=V]..
//!
//! `--define` compiles the kernels with `-DNAME=V` (e.g. `HF_ATTN_UNROLL=8`) to time a variant.

use std::io::Write;

use half::f16;
use hipfire_gpu::{Context, DeviceBuffer, KernelRegistry};
use hipfire_model::attention::CacheType;
use hipfire_model::gpu::DECODE_SOURCE;
use hipfire_model::gpu_attention::{AttnShape, SplitKvAttention, SplitPlan, ATTN_MAX_CHUNKS};
use hipfire_model::gpu_kv::GpuKvLayout;
use rand::{Rng, SeedableRng};

/// One timed launch over a layer's (K, V) caches into `out`.
type LaunchFn<'a> = dyn FnMut(
        &(DeviceBuffer<u8>, DeviceBuffer<u8>),
        &mut DeviceBuffer<f32>,
    ) -> Result<(), Box<dyn std::error::Error>>
    + 'a;

/// Layers whose caches the launches rotate over (Llama-3-8B's).
const LAYERS: usize = 32;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut json_path = None;
    let mut depths = vec![16usize, 1024, 4096, 16384];
    let mut iters = 320usize;
    let mut defines: Vec<String> = Vec::new();
    let mut cache_type = CacheType::F16;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json_path = args.next(),
            "--depths" => {
                depths = args
                    .next()
                    .ok_or("--depths needs a list")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--iters" => iters = args.next().ok_or("--iters needs N")?.parse()?,
            "--cache-type" => {
                let name = args.next().ok_or("--cache-type needs f16 or q8_0")?;
                cache_type = CacheType::from_name(&name).ok_or("--cache-type: f16 or q8_0")?;
            }
            "--define" => {
                defines.push(format!("-D{}", args.next().ok_or("--define needs NAME=V")?))
            }
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let shape = AttnShape {
        n_head: 32,
        n_kv_head: 8,
        head_dim: 128,
    };
    let max_depth = depths.iter().copied().max().ok_or("no depths")?;
    let ctx = Context::new(0)?;
    let stream = ctx.new_stream()?;
    let reg = KernelRegistry::new(&ctx);
    let module = reg.module(&DECODE_SOURCE, &defines)?;
    let attn = SplitKvAttention::for_cache(&module, shape, cache_type, ATTN_MAX_CHUNKS)?;
    let kvd = shape.n_kv_head * shape.head_dim;
    let layout = GpuKvLayout {
        cache_type,
        kv_dim: kvd,
    };
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let vals: Vec<f32> = (0..max_depth * kvd)
        .map(|_| r.random_range(-1.0f32..1.0))
        .collect();
    let host: Vec<u8> = match cache_type {
        CacheType::F16 => vals
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        CacheType::Q8_0 => layout.q8_image(&vals, max_depth).ok_or("q8_0 layout")?,
    };
    let q: Vec<f32> = (0..shape.n_head * shape.head_dim)
        .map(|_| r.random_range(-2.0f32..2.0))
        .collect();
    let mut caches: Vec<(DeviceBuffer<u8>, DeviceBuffer<u8>)> = Vec::new();
    for _ in 0..LAYERS {
        let mut k = ctx.alloc::<u8>(host.len())?;
        let mut v = ctx.alloc::<u8>(host.len())?;
        k.upload(&stream, &host)?;
        v.upload(&stream, &host)?;
        caches.push((k, v));
    }
    let mut qb = ctx.alloc::<f32>(q.len())?;
    qb.upload(&stream, &q)?;
    let mut out = ctx.alloc::<f32>(q.len())?;
    stream.synchronize()?;
    let (start, end) = (ctx.new_event()?, ctx.new_event()?);
    let mut lines = Vec::new();
    let info = ctx.info();
    println!(
        "{}",
        serde_json::json!({"device": info.name, "arch": info.arch, "multiprocessors": info.multiprocessors, "defines": defines, "cache_type": cache_type.name()})
    );
    for &n_pos in &depths {
        let bytes = (2 * n_pos * layout.position_bytes()) as f64;
        let mut time = |f: &mut LaunchFn<'_>| -> Result<f64, Box<dyn std::error::Error>> {
            for c in caches.iter().take(LAYERS) {
                f(c, &mut out)?; // warm-up: one pass over every layer
            }
            stream.record(&start)?;
            for i in 0..iters {
                f(&caches[i % LAYERS], &mut out)?;
            }
            stream.record(&end)?;
            end.synchronize()?;
            Ok(f64::from(start.elapsed_ms(&end)?) * 1e3 / iters as f64)
        };
        let planned = attn.plan(n_pos);
        let mut variants: Vec<(String, SplitPlan)> = vec![("split planned".into(), planned)];
        for want in [16usize, 22, 33, 44, 66, 132] {
            for heads in [1usize, 2, 4] {
                let p =
                    SplitPlan::with_chunks(&shape, n_pos, want).with_heads_per_block(&shape, heads);
                if !variants.iter().any(|v| v.1 == p) {
                    variants.push((format!("split {want} x{heads}"), p));
                }
            }
        }
        for (name, plan) in variants {
            let us =
                time(&mut |(k, v), o| Ok(attn.launch_with(&stream, &qb, k, v, o, n_pos, plan)?))?;
            lines.push(serde_json::json!({
                "depth": n_pos, "cache_type": cache_type.name(), "variant": name, "n_chunks": plan.n_chunks,
                "chunk_len": plan.chunk_len, "heads_per_block": plan.heads_per_block, "us": us, "gb_per_s": bytes / us / 1e3,
            }));
            println!("{}", lines.last().ok_or("no line")?);
        }
    }
    if let Some(p) = json_path {
        let mut f = std::fs::File::create(p)?;
        for l in &lines {
            writeln!(f, "{l}")?;
        }
    }
    Ok(())
}
