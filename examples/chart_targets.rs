//! Chart of `examples/single_layer --target-rounds R --json` output: per round, the flags layer's
//! throughput over the both-at-once read ceiling, over `cpu` mode and over `pcie` mode, and its
//! sync figure, each with its target drawn; one panel per JSON (e.g. `--chain 1` and `--chain 8`
//! side by side).
//!
//! ```text
//! cargo run --example chart_targets -- out.svg targets-chain1.json [targets-chain8.json ...]
//! ```

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::Value;

/// A figure of a round, its label, its target and its colour.
struct Figure {
    label: &'static str,
    value: fn(&Value) -> Option<f64>,
    target: f64,
    color: RGBColor,
}

fn ratio(r: &Value, over: &[&str]) -> Option<f64> {
    let den: f64 = over.iter().map(|k| r[*k].as_f64()).sum::<Option<f64>>()?;
    Some(r["flags_gbs"].as_f64()? / den)
}

const FIGURES: [Figure; 4] = [
    Figure {
        label: "flags / both-at-once (>= 0.90)",
        value: |r| ratio(r, &["both_cpu_gbs", "both_gpu_gbs"]),
        target: 0.90,
        color: RGBColor(0, 90, 200),
    },
    Figure {
        label: "flags / cpu (>= 1.15)",
        value: |r| ratio(r, &["cpu_gbs"]),
        target: 1.15,
        color: RGBColor(120, 120, 120),
    },
    Figure {
        label: "flags / pcie (>= 2)",
        value: |r| ratio(r, &["pcie_gbs"]),
        target: 2.0,
        color: RGBColor(200, 120, 0),
    },
    Figure {
        label: "flags sync x 10 (<= 0.5)",
        value: |r| r["flags_sync"].as_f64().map(|s| 10.0 * s),
        target: 0.5,
        color: RGBColor(180, 0, 60),
    },
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (output, inputs) = match args.split_first() {
        Some((o, i)) if !i.is_empty() => (o, i),
        _ => anyhow::bail!("usage: chart_targets OUT.svg SINGLE_LAYER.json [MORE.json ...]"),
    };
    let mut runs = Vec::new();
    for input in inputs {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?,
        )
        .with_context(|| format!("parsing {input}"))?;
        let rounds = v["targets"]["rounds"]
            .as_array()
            .with_context(|| format!("{input}: no target rounds (run with --target-rounds R)"))?
            .clone();
        runs.push((v, rounds));
    }
    let root = SVGBackend::new(output, (560 * runs.len() as u32, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    for ((v, rounds), area) in runs.iter().zip(root.split_evenly((1, runs.len()))) {
        let n = rounds.len().max(1) as f64;
        let title = format!(
            "{} — {} layer(s) per timed rep, {} rounds",
            v["device"].as_str().unwrap_or("?"),
            v["chain"].as_u64().unwrap_or(1),
            rounds.len()
        );
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(0.5f64..n + 0.5, 0.0f64..3.4f64)?;
        chart
            .configure_mesh()
            .x_desc("round (interleaved: ceiling, cpu, pcie, flags)")
            .y_desc("ratio")
            .draw()?;
        for f in &FIGURES {
            let color = f.color;
            let pts: Vec<(f64, f64)> = rounds
                .iter()
                .enumerate()
                .filter_map(|(i, r)| (f.value)(r).map(|y| (i as f64 + 1.0, y)))
                .collect();
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?
                .label(f.label)
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
            chart.draw_series(LineSeries::new(
                [(0.5, f.target), (n + 0.5, f.target)],
                color.stroke_width(1),
            ))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
    }
    root.present()?;
    println!("wrote {output}");
    Ok(())
}
