//! Chart of `examples/single_layer --per-shape --json` output: for each projection of the layer,
//! the step's throughput (GB/s of its weight bytes) against the pinned GPU share, one curve per
//! join strategy, with each strategy's `auto` result marked (a triangle at the share it chose).
//!
//! ```text
//! cargo run --example chart_per_shape -- per_shape.json out.svg
//! ```

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::Value;

/// Panels per row of the grid.
const COLUMNS: usize = 3;

/// Curve colours, by the order the strategies first appear (ordering, two-stream, flags).
const COLORS: [RGBColor; 4] = [
    RGBColor(200, 30, 60),
    RGBColor(40, 150, 60),
    RGBColor(0, 90, 200),
    RGBColor(120, 120, 120),
];

/// One strategy of one projection: its sweep as (share, GB/s), and `auto` as (share, GB/s).
struct Curve {
    strategy: String,
    sweep: Vec<(f64, f64)>,
    auto: Option<(f64, f64)>,
}

/// One projection's panel.
struct Panel {
    proj: String,
    curves: Vec<Curve>,
}

/// GB/s of `bytes` read in `us` microseconds.
fn gbs(bytes: f64, us: f64) -> f64 {
    bytes / us / 1e3
}

fn panels(v: &Value) -> Result<Vec<Panel>> {
    let format = v["format"].as_str().context("no format")?;
    let format = hipfire::quant::Format::from_name(format)
        .with_context(|| format!("unknown format {format:?}"))?;
    let mut out: Vec<Panel> = Vec::new();
    for row in v["per_shape"].as_array().context("no per_shape rows")? {
        let proj = row["proj"]
            .as_str()
            .context("row without proj")?
            .to_string();
        let m = row["m"].as_u64().context("row without m")? as usize;
        let k = row["k"].as_u64().context("row without k")? as usize;
        let bytes = (m * format.row_bytes(k)?) as f64;
        let sweep = row["pinned"]
            .as_array()
            .context("row without pinned sweep")?
            .iter()
            .filter_map(|p| Some((p["share"].as_f64()?, gbs(bytes, p["us"].as_f64()?))))
            .collect();
        let auto = row["auto_share"]
            .as_f64()
            .zip(row["auto_us"].as_f64())
            .map(|(s, us)| (s, gbs(bytes, us)));
        // Several autos of one join (one per tuning) share a sweep: each is its own curve, named.
        let variant = row["flags_variant"]
            .as_str()
            .or_else(|| row["two_stream_variant"].as_str());
        let strategy = match (row["strategy"].as_str(), variant) {
            (Some(st), Some(v)) if v != "default" => format!("{st}/{v}"),
            (Some(st), _) => st.to_string(),
            (None, _) => "?".to_string(),
        };
        let curve = Curve {
            strategy,
            sweep,
            auto,
        };
        match out.iter_mut().find(|p| p.proj == proj) {
            Some(p) => p.curves.push(curve),
            None => out.push(Panel {
                proj,
                curves: vec![curve],
            }),
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match args.as_slice() {
        [i, o] => (i, o),
        _ => anyhow::bail!("usage: chart_per_shape PER_SHAPE.json OUT.svg"),
    };
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?,
    )
    .with_context(|| format!("parsing {input}"))?;
    let panels = panels(&v)?;
    anyhow::ensure!(!panels.is_empty(), "{input}: no per-shape rows");
    let rows = panels.len().div_ceil(COLUMNS);
    let root =
        SVGBackend::new(output, (420 * COLUMNS as u32, 340 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "{} — each projection alone, {} per timed rep: GB/s against the pinned GPU share (triangle: auto)",
            v["device"].as_str().unwrap_or("?"),
            match v["chain"].as_u64() {
                Some(1) | None => "1 step".to_string(),
                Some(n) => format!("{n} steps"),
            }
        ),
        ("sans-serif", 16),
    )?;
    let strategies: Vec<String> = panels
        .iter()
        .flat_map(|p| p.curves.iter().map(|c| c.strategy.clone()))
        .fold(Vec::new(), |mut acc, s| {
            if !acc.contains(&s) {
                acc.push(s);
            }
            acc
        });
    for (area, panel) in root.split_evenly((rows, COLUMNS)).iter().zip(&panels) {
        let y_max = panel
            .curves
            .iter()
            .flat_map(|c| c.sweep.iter().map(|p| p.1).chain(c.auto.map(|a| a.1)))
            .fold(0.0f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.proj, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(45)
            .build_cartesian_2d(0.05f64..0.55f64, 0.0f64..y_max.max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("GPU share")
            .y_desc("GB/s")
            .draw()?;
        for curve in &panel.curves {
            let i = strategies
                .iter()
                .position(|s| *s == curve.strategy)
                .unwrap_or(0);
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    curve.sweep.iter().copied(),
                    color.stroke_width(2),
                ))?
                .label(curve.strategy.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart.draw_series(
                curve
                    .sweep
                    .iter()
                    .map(|&p| Circle::new(p, 2, color.filled())),
            )?;
            if let Some(a) = curve.auto {
                chart.draw_series(std::iter::once(TriangleMarker::new(a, 6, color.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .label_font(("sans-serif", 11))
            .draw()?;
    }
    root.present()?;
    println!("wrote {output}");
    Ok(())
}
