//! Times decode attention alone on Llama-3-8B's shape (32 query heads, 8 kv heads of 128, f16
//! cache) at several depths: the split-KV kernels (the planner's chunks and a sweep of others)
//! against the one-block-per-head kernel they replace (`baseline_decode.cu`, decode.cu as of
//! commit fe26b1a). Launches rotate over 32 layers' caches, as a decode step does, so at depth the
//! bytes come from HBM and not from the 50 MB L2. Prints one JSON object per line (and writes
//! them to `--json PATH`): depth, variant, µs per call, K/V bytes read ÷ time.
//!
//!     attention_timing [--json PATH] [--depths 16,1024,4096,16384] [--iters N]

use std::ffi::c_void;
use std::io::Write;

use half::f16;
use hipfire_gpu::backend::LaunchDims;
use hipfire_gpu::{Context, DeviceBuffer, DeviceMemory, KernelRegistry, KernelSource, Stream};
use hipfire_model::gpu::DECODE_SOURCE;
use hipfire_model::gpu_attention::{AttnShape, SplitKvAttention, SplitPlan, ATTN_MAX_CHUNKS};
use rand::{Rng, SeedableRng};

/// The kernel replaced by split-KV attention, for the comparison only.
const BASELINE: KernelSource = KernelSource {
    name: "baseline_decode.cu",
    source: include_str!("baseline_decode.cu"),
    headers: &[("f16.cuh", hipfire_gpu::F16_CUH)],
};
/// Layers whose caches the launches rotate over (Llama-3-8B's).
const LAYERS: usize = 32;
/// The baseline's score row is n_pos f32 in 48 KiB of shared memory.
const BASELINE_MAX_POS: usize = 48 * 1024 / 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut json_path = None;
    let mut depths = vec![16usize, 1024, 4096, 16384];
    let mut iters = 320usize;
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
    let module = reg.module(&DECODE_SOURCE, &[])?;
    let attn = SplitKvAttention::new(&module, shape, ATTN_MAX_CHUNKS)?;
    let baseline = reg.module(&BASELINE, &[])?.function("attention_f16kv")?;
    let kvd = shape.n_kv_head * shape.head_dim;
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let host: Vec<u16> = (0..max_depth * kvd)
        .map(|_| f16::from_f32(r.random_range(-1.0f32..1.0)).to_bits())
        .collect();
    let q: Vec<f32> = (0..shape.n_head * shape.head_dim)
        .map(|_| r.random_range(-2.0f32..2.0))
        .collect();
    let mut caches: Vec<(DeviceBuffer<u16>, DeviceBuffer<u16>)> = Vec::new();
    for _ in 0..LAYERS {
        let mut k = ctx.alloc::<u16>(host.len())?;
        let mut v = ctx.alloc::<u16>(host.len())?;
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
        serde_json::json!({"device": info.name, "arch": info.arch, "multiprocessors": info.multiprocessors})
    );
    for &n_pos in &depths {
        let bytes = (2 * n_pos * kvd * std::mem::size_of::<u16>()) as f64;
        let mut time = |f: &mut dyn FnMut(
            &(DeviceBuffer<u16>, DeviceBuffer<u16>),
            &mut DeviceBuffer<f32>,
        ) -> Result<(), Box<dyn std::error::Error>>|
         -> Result<f64, Box<dyn std::error::Error>> {
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
        for want in [1usize, 16, 33, 66, 132, 256] {
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
                "depth": n_pos, "variant": name, "n_chunks": plan.n_chunks,
                "chunk_len": plan.chunk_len, "heads_per_block": plan.heads_per_block, "us": us, "gb_per_s": bytes / us / 1e3,
            }));
            println!("{}", lines.last().ok_or("no line")?);
        }
        if n_pos <= BASELINE_MAX_POS {
            let us = time(&mut |(k, v), o| {
                launch_baseline(&ctx, &stream, &baseline, &qb, k, v, o, shape, n_pos)
            })?;
            lines.push(serde_json::json!({
                "depth": n_pos, "variant": "baseline attention_f16kv", "us": us,
                "gb_per_s": bytes / us / 1e3,
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

#[allow(clippy::too_many_arguments)] // the kernel's operands
fn launch_baseline(
    ctx: &std::sync::Arc<Context>,
    stream: &Stream,
    f: &hipfire_gpu::Function,
    q: &DeviceBuffer<f32>,
    k: &DeviceBuffer<u16>,
    v: &DeviceBuffer<u16>,
    out: &mut DeviceBuffer<f32>,
    s: AttnShape,
    n_pos: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (mut pq, mut pk, mut pv, mut po) = (
        q.device_ptr(),
        k.device_ptr(),
        v.device_ptr(),
        out.device_ptr(),
    );
    let (mut nh, mut nkv, mut hd, mut np) = (
        s.n_head as i32,
        s.n_kv_head as i32,
        s.head_dim as i32,
        n_pos as i32,
    );
    let mut scale = 1.0f32 / (s.head_dim as f32).sqrt();
    let mut p: [*mut c_void; 9] = [
        (&mut pq as *mut u64).cast(),
        (&mut pk as *mut u64).cast(),
        (&mut pv as *mut u64).cast(),
        (&mut po as *mut u64).cast(),
        (&mut nh as *mut i32).cast(),
        (&mut nkv as *mut i32).cast(),
        (&mut hd as *mut i32).cast(),
        (&mut np as *mut i32).cast(),
        (&mut scale as *mut f32).cast(),
    ];
    let dims = LaunchDims {
        grid: s.n_head as u32,
        block: 256,
        shared_bytes: (n_pos * 4) as u32,
    };
    // SAFETY: parameters match baseline_decode.cu's attention_f16kv; the caches hold ≥ n_pos
    // rows (allocated for the deepest depth), q and out n_head × head_dim floats.
    unsafe { ctx.backend().launch(f.raw(), dims, stream.raw(), &mut p)? };
    Ok(())
}
