//! Chart of `examples/single_layer --sweep --json` output: layer throughput (GB/s of weight bytes)
//! against the pinned GPU share, one curve per join strategy, with the `cpu`, `pcie` and
//! both-at-once read ceiling as horizontal references and each strategy's `auto` result marked.
//!
//! ```text
//! cargo run --example chart_single_layer -- docs/perf-checkpoints/<dir>/single_layer.json out.svg
//! ```

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::Value;

/// One strategy's sweep: (share, GB/s) points and its `auto` result.
type Curve = (String, Vec<(f64, f64)>, Option<(f64, f64)>);

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match args.as_slice() {
        [i, o] => (i, o),
        _ => anyhow::bail!("usage: chart_single_layer SINGLE_LAYER.json OUT.svg"),
    };
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?,
    )?;
    let runs = v["runs"].as_array().context("no runs")?;
    let gbs = |mode: &str| {
        runs.iter()
            .find(|r| r["mode"] == mode)
            .and_then(|r| r["gbs"].as_f64())
    };
    let ceiling = v["ceilings"]["both_total_gbs"].as_f64().unwrap_or(0.0);
    let mut curves: Vec<Curve> = Vec::new();
    for strategy in ["ordering", "two-stream", "flags"] {
        let mut pts = Vec::new();
        let mut auto = None;
        for r in runs
            .iter()
            .filter(|r| r["mode"] == "passback" && r["strategy"] == strategy)
        {
            let share = r["share"].as_str().unwrap_or("");
            let g = r["gbs"].as_f64().unwrap_or(0.0);
            if let Some(a) = share
                .strip_prefix("auto(")
                .and_then(|s| s.strip_suffix(')'))
            {
                auto = a.parse().ok().map(|s| (s, g));
            } else if let Ok(s) = share.parse::<f64>() {
                pts.push((s, g));
            }
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        curves.push((strategy.to_string(), pts, auto));
    }
    let y_max = ceiling.max(gbs("cpu").unwrap_or(0.0)) * 1.15;
    let root = SVGBackend::new(output, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "one Llama-3-8B layer ({}), {} — passback vs GPU share",
        v["format"].as_str().unwrap_or("?"),
        v["device"].as_str().unwrap_or("?")
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0f64..0.55f64, 0.0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("GPU share of rows (pinned)")
        .y_desc("GB/s of weight bytes")
        .draw()?;
    let hline = |y: f64| vec![(0.0, y), (0.55, y)];
    for (label, y, color) in [
        ("both-at-once read ceiling", ceiling, BLACK),
        (
            "cpu mode",
            gbs("cpu").unwrap_or(0.0),
            RGBColor(120, 120, 120),
        ),
        (
            "pcie mode",
            gbs("pcie").unwrap_or(0.0),
            RGBColor(200, 120, 0),
        ),
    ] {
        chart
            .draw_series(LineSeries::new(hline(y), color.stroke_width(1)))?
            .label(label)
            .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 20, yy)], color));
    }
    for (i, (name, pts, auto)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(format!("passback {name}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        if let Some(a) = auto {
            chart.draw_series(std::iter::once(TriangleMarker::new(*a, 7, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    println!("wrote {output}");
    Ok(())
}
