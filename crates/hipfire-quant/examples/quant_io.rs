//! File-level quantise / dequantise for cross-checking against other implementations
//! (`scripts/gguf_crosscheck.py` drives it with gguf-py).
//!
//! ```text
//! quant_io quantize   <format> <k> <in.f32> <out.bin>   # rows of k little-endian f32 → blocks
//! quant_io dequantize <format> <k> <in.bin> <out.f32>   # blocks → rows of k f32
//! ```
//! Formats are the names `Format::from_name` accepts (`q4_0`, `q4_k`, `hfq4g256`, ...).

use hipfire_quant::{dequantize_row, quantize_row, Format};
use std::error::Error;
use std::process::ExitCode;

fn run(args: &[String]) -> Result<(), Box<dyn Error>> {
    let [cmd, fmt, k, input, output] = args else {
        return Err("usage: quant_io quantize|dequantize <format> <k> <in> <out>".into());
    };
    let fmt = Format::from_name(fmt).ok_or_else(|| format!("unknown format {fmt}"))?;
    let k: usize = k.parse()?;
    let rb = fmt.row_bytes(k)?;
    let data = std::fs::read(input)?;
    let mut out = Vec::new();
    match cmd.as_str() {
        "quantize" => {
            if data.len() % (4 * k) != 0 {
                return Err(format!("{input}: {} bytes is not rows of {k} f32", data.len()).into());
            }
            let vals: Vec<f32> = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            for row in vals.chunks_exact(k) {
                out.extend_from_slice(&quantize_row(fmt, row)?);
            }
        }
        "dequantize" => {
            if data.len() % rb != 0 {
                return Err(
                    format!("{input}: {} bytes is not rows of {rb} bytes", data.len()).into(),
                );
            }
            let mut row = vec![0f32; k];
            for blocks in data.chunks_exact(rb) {
                dequantize_row(fmt, blocks, &mut row)?;
                out.extend(row.iter().flat_map(|v| v.to_le_bytes()));
            }
        }
        other => return Err(format!("unknown command {other}").into()),
    }
    std::fs::write(output, out)?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quant_io: {e}");
            ExitCode::from(2)
        }
    }
}
