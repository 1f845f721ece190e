//! `hipfire bench --offload-exec A,B,C -r N` on a GPU: interleaved fresh-process repetitions.
//!
//! Comparing modes inside one process lets the first mode warm what the next one measures (page
//! cache, pinned-memory pools, clocks, the kernel cache) and lets drift over the run land on
//! whichever mode runs last. So each (repetition, mode) is its own child process
//! (`hipfire bench … --offload-exec M -r 1 --json`), the order of modes is rotated every
//! repetition, and modes are compared by *paired* ratios: within each repetition, mode X's
//! tok/s over mode Y's on the same test, then the median of those ratios — the figure the
//! issues' targets are stated in.

use crate::stats::median;
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::bench_cmd::with_samples;
use crate::stop::Stop;

/// Set in the children so they measure instead of orchestrating again.
pub const CHILD_ENV: &str = "HIPFIRE_BENCH_CHILD";

/// How the parent measured, recorded in every row.
const METHOD: &str = "interleaved fresh-process repetitions, mode order rotated each \
    repetition; each child: one untimed warm-up per test, one timed run";

/// True in a child process of [`run`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// The parent's own arguments without `--offload-exec`, the repetitions flag and `--json`
/// (and their values), so a child can be given its own.
fn passthrough_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--offload-exec" | "--rounds" | "--repetitions" | "-r" => {
                args.next();
            }
            "--json" => {}
            _ if ["--offload-exec=", "--rounds=", "--repetitions=", "-r"]
                .iter()
                .any(|p| a.starts_with(p)) => {}
            _ => out.push(a),
        }
    }
    out
}

/// One child: the JSON rows of `hipfire bench … --offload-exec mode -r 1 --json`.
fn child(mode: &str, base: &[String]) -> anyhow::Result<Vec<Value>> {
    let exe = std::env::current_exe().context("locating the hipfire executable")?;
    let out = Command::new(&exe)
        .args(base)
        .args(["--offload-exec", mode, "-r", "1", "--json"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!("the {mode} repetition exited with {}", out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("reading the {mode} rows' JSON"))
}

/// One (mode, test) of the parent: the first child's row and the nanoseconds per repetition.
struct Cell {
    mode: usize,
    row: Value,
    ns: Vec<Option<u64>>,
}

/// Runs `reps` repetitions of every mode, each a fresh process, order rotated per repetition;
/// returns the rows (every mode's tests, samples over repetitions, paired ratios against the
/// other modes). A SIGINT/SIGTERM (which the children in the same process group receive too)
/// ends the repetitions: the one it cut short is dropped and the finished ones are reported.
pub fn run(
    modes: &[String],
    reps: u32,
    stop: &Stop,
    progress: &dyn Fn(String),
) -> anyhow::Result<Vec<Value>> {
    let base = passthrough_args(std::env::args().skip(1));
    interleave(modes, reps, stop, progress, &mut |mode| child(mode, &base))
}

/// [`run`] over any `child` (one repetition of one mode → its rows with one sample each).
fn interleave(
    modes: &[String],
    reps: u32,
    stop: &Stop,
    progress: &dyn Fn(String),
    child: &mut dyn FnMut(&str) -> anyhow::Result<Vec<Value>>,
) -> anyhow::Result<Vec<Value>> {
    if reps == 0 {
        bail!("-r must be at least 1");
    }
    let reps = reps as usize;
    let mut cells: Vec<Cell> = Vec::new();
    'reps: for r in 0..reps {
        for j in 0..modes.len() {
            let i = (j + r) % modes.len();
            let rows = match child(&modes[i]) {
                _ if stop.requested().is_some() => break 'reps,
                rows => rows?,
            };
            for row in rows {
                let ns = row["samples_ns"][0].as_u64();
                let test = row["test"].clone();
                let cell = match cells
                    .iter_mut()
                    .find(|c| c.mode == i && c.row["test"] == test)
                {
                    Some(c) => c,
                    None => {
                        cells.push(Cell {
                            mode: i,
                            row,
                            ns: vec![None; reps],
                        });
                        cells.last_mut().context("a cell was just pushed")?
                    }
                };
                cell.ns[r] = ns;
                progress(format!(
                    "repetition {}/{reps} {} {}: {:.2} tok/s",
                    r + 1,
                    modes[i],
                    cell.row["test"].as_str().unwrap_or("?"),
                    with_samples(cell.row.clone(), &[ns.unwrap_or(0)])["avg_ts"]
                        .as_f64()
                        .unwrap_or(f64::NAN)
                ));
            }
        }
    }
    // tok/s per repetition of each cell (None where it did not run).
    let ts = |c: &Cell| -> Vec<Option<f64>> {
        let tokens = c.row["n_prompt"].as_u64().unwrap_or(0) + c.row["n_gen"].as_u64().unwrap_or(0);
        c.ns.iter()
            .map(|x| x.map(|ns| tokens as f64 * 1e9 / ns.max(1) as f64))
            .collect()
    };
    let mut out = Vec::new();
    for c in &cells {
        let mut paired = Vec::new();
        for o in cells
            .iter()
            .filter(|o| o.mode != c.mode && o.row["test"] == c.row["test"])
        {
            let ratios: Vec<f64> = ts(c)
                .iter()
                .zip(ts(o))
                .filter_map(|(a, b)| Some(a.as_ref()? / b?))
                .collect();
            paired.push(json!({
                "vs": modes[o.mode],
                "median": median(ratios.clone()),
                "samples": ratios,
            }));
        }
        let ns: Vec<u64> = c.ns.iter().flatten().copied().collect();
        let mut row = with_samples(c.row.clone(), &ns);
        row["method"] = json!(METHOD);
        row["paired_ratios"] = json!(paired);
        out.push(row);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child's row: `test` of `tokens` tokens (prompt when `pp`), one sample of `ns`.
    fn child_row(mode: &str, test: &str, pp: bool, tokens: u64, ns: u64) -> Value {
        let (p, n) = if pp { (tokens, 0) } else { (0, tokens) };
        with_samples(
            json!({ "offload_exec": mode, "test": test, "n_prompt": p, "n_gen": n }),
            &[ns],
        )
    }

    #[test]
    fn repetitions_rotate_modes_and_pair_ratios_per_repetition() {
        let modes = ["cpu".to_string(), "passback".to_string()];
        // Seeded pseudo-random timings per (call, test) (Knuth's MMIX LCG), kept to check the
        // output against.
        let mut state = 0x1234_5678_u64;
        let mut calls: Vec<(String, u64, u64)> = Vec::new();
        let mut child = |mode: &str| -> anyhow::Result<Vec<Value>> {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pp_ns = 1_000_000 + (state >> 40);
            let tg_ns = 2_000_000 + ((state >> 20) & 0xF_FFFF);
            calls.push((mode.to_string(), pp_ns, tg_ns));
            Ok(vec![
                child_row(mode, "pp32", true, 32, pp_ns),
                child_row(mode, "tg16", false, 16, tg_ns),
            ])
        };
        let rows = interleave(&modes, 3, &Stop::default(), &|_| {}, &mut child).expect("rows");
        let order: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            order,
            ["cpu", "passback", "passback", "cpu", "cpu", "passback"]
        );
        let tests: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| {
                (
                    r["offload_exec"].as_str().unwrap(),
                    r["test"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            tests,
            [
                ("cpu", "pp32"),
                ("cpu", "tg16"),
                ("passback", "pp32"),
                ("passback", "tg16")
            ]
        );
        // Repetition r of a mode is its r-th call.
        let ns_of = |mode: &str, pp: bool| -> Vec<u64> {
            calls
                .iter()
                .filter(|c| c.0 == mode)
                .map(|c| if pp { c.1 } else { c.2 })
                .collect()
        };
        for r in &rows {
            let mode = r["offload_exec"].as_str().unwrap();
            let pp = r["test"] == "pp32";
            let want = ns_of(mode, pp);
            let got: Vec<u64> = serde_json::from_value(r["samples_ns"].clone()).unwrap();
            assert_eq!(got, want, "{r}");
            assert_eq!(r["repetitions"], 3);
            let other = if mode == "cpu" { "passback" } else { "cpu" };
            let theirs = ns_of(other, pp);
            // tok/s ratio = inverse time ratio, paired by repetition.
            let mut want: Vec<f64> = want
                .iter()
                .zip(&theirs)
                .map(|(&a, &b)| b as f64 / a as f64)
                .collect();
            let p = &r["paired_ratios"][0];
            assert_eq!(p["vs"], other);
            let got: Vec<f64> = serde_json::from_value(p["samples"].clone()).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-12 * w, "{g} {w}");
            }
            want.sort_by(f64::total_cmp);
            let m = p["median"].as_f64().unwrap();
            assert!((m - want[1]).abs() < 1e-12 * want[1], "{m} {want:?}");
            assert!(r["method"].as_str().unwrap().contains("fresh-process"));
        }
    }

    #[test]
    fn a_signal_keeps_the_finished_repetitions() {
        let modes = ["cpu".to_string(), "pcie".to_string()];
        let stop = Stop::default();
        let mut n = 0;
        let mut child = |mode: &str| -> anyhow::Result<Vec<Value>> {
            n += 1;
            if n == 3 {
                // The signal reaches the child too: its repetition is dropped.
                stop.raise(2);
            }
            Ok(vec![child_row(mode, "tg4", false, 4, 1_000 * n)])
        };
        let rows = interleave(&modes, 5, &stop, &|_| {}, &mut child).expect("rows");
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(r["repetitions"], 1, "{r}");
        }
    }

    #[test]
    fn children_get_the_parents_arguments_less_mode_repetitions_and_json() {
        let parent = "bench m.gguf --offload-exec cpu,pcie --gen-tokens 8 --rounds=3 --json \
            --device gpu --offload-exec=passback -r 2 -p 16,32 --repetitions 4 -r5 \
            --repetitions=6 --rounds 7";
        let got = passthrough_args(parent.split_whitespace().map(String::from));
        assert_eq!(
            got,
            [
                "bench",
                "m.gguf",
                "--gen-tokens",
                "8",
                "--device",
                "gpu",
                "-p",
                "16,32"
            ]
        );
    }
}
