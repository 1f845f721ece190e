//! Write a synthetic GGUF (random weights, real shapes; marked SYNTHETIC in its metadata).
//!
//! `cargo run --release -p hipfire-model --example synth -- PRESET FORMAT OUT.gguf [layers] [seed]`
//!
//! PRESET: llama3-8b | qwen-9b | tiny-llama | tiny-qwen2 | tiny-qwen3; FORMAT: q4_k, q8_0, ...
//! `layers` overrides the block count (a quick, smaller file with the same per-layer shapes).

use std::time::Instant;

use hipfire_model::{write_synthetic, ModelError, SynthSpec};
use hipfire_quant::Format;

fn main() -> Result<(), ModelError> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!("usage: synth PRESET FORMAT OUT.gguf [layers] [seed]");
        std::process::exit(2);
    }
    let mut spec = SynthSpec::preset(&a[1])
        .ok_or_else(|| ModelError::InvalidOption(format!("preset {}", a[1])))?;
    let fmt = Format::from_name(&a[2])
        .ok_or_else(|| ModelError::InvalidOption(format!("format {}", a[2])))?;
    if let Some(l) = a.get(4).and_then(|s| s.parse().ok()) {
        spec.n_layer = l;
    }
    let seed = a.get(5).and_then(|s| s.parse().ok()).unwrap_or(0);
    let t0 = Instant::now();
    let progress =
        |done: u64, total: u64| eprint!("\r{:.1}/{:.1} GB", done as f64 / 1e9, total as f64 / 1e9);
    let r = write_synthetic(
        std::path::Path::new(&a[3]),
        &spec,
        fmt,
        seed,
        Some(&progress),
    )?;
    let s = t0.elapsed().as_secs_f64();
    eprintln!();
    println!(
        "{{\"preset\":\"{}\",\"format\":\"{fmt}\",\"layers\":{},\"params\":{},\"bytes\":{},\"seconds\":{s:.1},\"mb_per_s\":{:.1}}}",
        a[1],
        spec.n_layer,
        r.n_params,
        r.bytes,
        r.bytes as f64 / 1e6 / s
    );
    Ok(())
}
