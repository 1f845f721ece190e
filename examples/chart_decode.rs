//! Chart of `hipfire bench --json` records at several `--gpu-layer-budget`s: decode (tg) tok/s
//! against the number of spilled layers, one curve per offload mode, plus optional reference
//! points (e.g. llama.cpp) given as `label=spilled:tok_s,...`.
//!
//! ```text
//! cargo run --example chart_decode -- OUT.svg N_LAYERS bench-b32.json bench-b24.json ... \
//!     [--ref "llama.cpp (reference/h200-box.md)=0:253.3,8:43.0,16:25.7,24:17.4"]
//! ```

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::Value;

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut refs: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    while let Some(i) = args.iter().position(|a| a == "--ref") {
        let spec = args.get(i + 1).context("--ref needs a value")?.clone();
        args.drain(i..i + 2);
        let (label, pts) = spec.split_once('=').context("--ref label=x:y,...")?;
        let pts = pts
            .split(',')
            .map(|p| {
                let (x, y) = p.split_once(':').context("x:y")?;
                Ok((x.parse()?, y.parse()?))
            })
            .collect::<Result<Vec<(f64, f64)>>>()?;
        refs.push((label.to_string(), pts));
    }
    let [output, n_layers, files @ ..] = args.as_slice() else {
        anyhow::bail!("usage: chart_decode OUT.svg N_LAYERS BENCH.json... [--ref label=x:y,...]");
    };
    let n_layers: f64 = n_layers.parse()?;
    let mut curves: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for f in files {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?,
        )?;
        // Records since 2026-12-01 are an array of llama-bench-style rows (the first tg row of
        // each mode counts); older ones an object with `modes`.
        let rows: Vec<(&Value, f64)> = match v.as_array() {
            Some(rows) => {
                let mut seen = Vec::new();
                let mut out = Vec::new();
                for r in rows.iter().filter(|r| r["n_gen"].as_u64().unwrap_or(0) > 0) {
                    if !seen.contains(&&r["offload_exec"]) {
                        seen.push(&r["offload_exec"]);
                        out.push((r, r["avg_ts"].as_f64().context("avg_ts")?));
                    }
                }
                out
            }
            None => v["modes"]
                .as_array()
                .context("neither rows nor modes")?
                .iter()
                .map(|m| {
                    let tps = m["decode_tok_s"]["median"]
                        .as_f64()
                        .context("decode_tok_s.median")?;
                    Ok((m, tps))
                })
                .collect::<Result<_>>()?,
        };
        for (m, tps) in rows {
            let placement = m["placement"].as_str().unwrap_or("");
            // "… N of L layers resident …"
            let resident: f64 = placement
                .split(" of ")
                .next()
                .and_then(|s| s.rsplit(' ').next())
                .and_then(|s| s.parse().ok())
                .context("placement without 'N of L layers resident'")?;
            let spilled = n_layers - resident;
            let mode = if spilled == 0.0 {
                "resident".to_string()
            } else {
                m["offload_exec"].as_str().unwrap_or("?").to_string()
            };
            curves.entry(mode).or_default().push((spilled, tps));
        }
    }
    // Every mode starts from the all-resident point.
    if let Some(res) = curves.get("resident").cloned() {
        for (mode, pts) in curves.iter_mut() {
            if mode != "resident" {
                pts.extend(res.iter().copied());
            }
        }
    }
    let y_max = curves
        .values()
        .chain(refs.iter().map(|r| &r.1))
        .flatten()
        .map(|p| p.1)
        .fold(0.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(output.as_str(), (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "decode tok/s vs layers spilled to host memory",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..n_layers, (1.0..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("layers spilled")
        .y_desc("decode tok/s (log)")
        .draw()?;
    let all: Vec<(String, Vec<(f64, f64)>)> = curves
        .into_iter()
        .filter(|(m, _)| m != "resident")
        .chain(refs)
        .collect();
    for (i, (label, mut pts)) in all.into_iter().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    println!("wrote {output}");
    Ok(())
}
