//! Times the CPU attention kernel ([`hipfire_model::attention::attend_chunk`]) on one KV head's
//! chunk of positions for a growing number of query heads: one query's group (decode, and a
//! prompt query alone) up to a shared job of several queries. Prints one JSON object per line:
//! heads, head size, positions, ns per call (best of `--reps`), and multiply-adds per ns
//! (scores and weighted values, `2 · heads · positions · head_dim` a call).
//!
//!     cpu_attention_timing [--head-dim 64] [--positions 512] [--heads 1,3,4,8,12,24,32] [--reps 200]

use half::f16;
use hipfire_model::attention::{attend_chunk, partial_len, KvLayer};
use rand::{Rng, SeedableRng};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut hd, mut n, mut reps) = (64usize, 512usize, 200usize);
    let mut heads = vec![1usize, 3, 4, 8, 12, 24, 32];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--head-dim" => hd = val()?.parse()?,
            "--positions" => n = val()?.parse()?,
            "--reps" => reps = val()?.parse()?,
            "--heads" => {
                heads = val()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let mut kv = KvLayer::new(1, hd);
    for _ in 0..n {
        let row = |r: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> {
            (0..hd)
                .map(|_| f16::from_f32(r.random_range(-1.0f32..1.0)).to_f32())
                .collect()
        };
        let (k, v) = (row(&mut r), row(&mut r));
        kv.push(&k, &v);
    }
    let scale = 1.0 / (hd as f32).sqrt();
    for &g in &heads {
        let q: Vec<f32> = (0..g * hd).map(|_| r.random_range(-1.0f32..1.0)).collect();
        let mut part = vec![0f32; g * partial_len(hd)];
        let mut scores = Vec::new();
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t = std::time::Instant::now();
            attend_chunk(&q, &kv, 0, (0, n), 0, scale, &mut scores, &mut part);
            best = best.min(t.elapsed().as_nanos() as f64);
        }
        let macs = 2.0 * (g * n * hd) as f64;
        println!(
            "{{\"heads\": {g}, \"head_dim\": {hd}, \"positions\": {n}, \"ns\": {best:.0}, \"macs_per_ns\": {:.2}}}",
            macs / best
        );
    }
    Ok(())
}
