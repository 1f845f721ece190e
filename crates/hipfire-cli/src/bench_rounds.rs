//! `hipfire bench --offload-exec A,B,C --rounds N` on a GPU: interleaved fresh-process rounds.
//!
//! Comparing modes inside one process lets the first mode warm what the next one measures (page
//! cache, pinned-memory pools, clocks, the kernel cache) and lets drift over the run land on
//! whichever mode runs last. So each (round, mode) is its own child process
//! (`hipfire bench … --offload-exec M --rounds 1 --json`), the order of modes is rotated every
//! round, and modes are compared by *paired* ratios: within each round, mode X over mode Y, then
//! the median of those ratios — the figure the targets are stated in.

use crate::stats::median;
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::stop::{self, Stop};

/// Set in the children so they measure instead of orchestrating again.
pub const CHILD_ENV: &str = "HIPFIRE_BENCH_CHILD";

/// True in a child process of [`run`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// The parent's own arguments without `--offload-exec`, `--rounds` and `--json` (and their
/// values), so a child can be given its own.
fn passthrough_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--offload-exec" | "--rounds" => {
                args.next();
            }
            "--json" => {}
            _ if a.starts_with("--offload-exec=") || a.starts_with("--rounds=") => {}
            _ => out.push(a),
        }
    }
    out
}

/// One child: the JSON report of `hipfire bench … --offload-exec mode --rounds 1 --json`.
fn child(mode: &str, base: &[String]) -> anyhow::Result<Value> {
    let exe = std::env::current_exe().context("locating the hipfire executable")?;
    let out = Command::new(&exe)
        .args(base)
        .args(["--offload-exec", mode, "--rounds", "1", "--json"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!("the {mode} round exited with {}", out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("reading the {mode} round's JSON"))
}

/// Runs `rounds` rounds of every mode, each a fresh process, order rotated per round; returns
/// the report (medians per mode, paired ratios, every sample). A SIGINT/SIGTERM (which the
/// children in the same process group receive too) ends the rounds: the round it cut short is
/// dropped, the finished ones are reported, and the report names the signal.
pub fn run(
    modes: &[String],
    rounds: u32,
    stop: &Stop,
    progress: &dyn Fn(String),
) -> anyhow::Result<Value> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let base = passthrough_args(std::env::args().skip(1));
    // decode[mode][round], prefill[mode][round]
    let mut decode = vec![vec![f64::NAN; rounds as usize]; modes.len()];
    let mut prefill = decode.clone();
    let mut placement = vec![String::new(); modes.len()];
    // The child's own record of its passback settings (null in other modes).
    let mut join = vec![Value::Null; modes.len()];
    let mut share = vec![Value::Null; modes.len()];
    let mut first: Option<Value> = None;
    'rounds: for r in 0..rounds as usize {
        for j in 0..modes.len() {
            let i = (j + r) % modes.len();
            let rep = match child(&modes[i], &base) {
                _ if stop.requested().is_some() => break 'rounds,
                r => r?,
            };
            let m = &rep["modes"][0];
            decode[i][r] = m["decode_tok_s"]["median"].as_f64().unwrap_or(f64::NAN);
            prefill[i][r] = m["prefill_tok_s"]["median"].as_f64().unwrap_or(f64::NAN);
            placement[i] = m["placement"].as_str().unwrap_or("").to_string();
            join[i] = m["join_strategy"].clone();
            share[i] = m["passback_share"].clone();
            progress(format!(
                "round {}/{rounds} {}: {:.2} tok/s decode",
                r + 1,
                modes[i],
                decode[i][r]
            ));
            first.get_or_insert(rep);
        }
    }
    let mut per_mode = Vec::new();
    for (i, m) in modes.iter().enumerate() {
        per_mode.push(json!({
            "offload_exec": m,
            "join_strategy": join[i],
            "passback_share": share[i],
            "placement": placement[i],
            "prefill_tok_s": { "median": median(prefill[i].clone()), "samples": prefill[i] },
            "decode_tok_s": { "median": median(decode[i].clone()), "samples": decode[i] },
        }));
    }
    let mut ratios = Vec::new();
    for (a, ma) in modes.iter().enumerate() {
        for (b, mb) in modes.iter().enumerate() {
            if a == b {
                continue;
            }
            let paired: Vec<f64> = (0..rounds as usize)
                .map(|r| decode[a][r] / decode[b][r])
                .collect();
            ratios.push(json!({ "num": ma, "den": mb, "median": median(paired.clone()), "samples": paired }));
        }
    }
    let first = first.unwrap_or(Value::Null);
    Ok(json!({
        "model": first["model"],
        "version": first["version"],
        "commit": first["commit"],
        "simd": first["simd"],
        "threads": first["threads"],
        "engine": first["engine"],
        "prompt_tokens": first["prompt_tokens"],
        "gen_tokens": first["gen_tokens"],
        "rounds": rounds,
        "method": "interleaved fresh-process rounds, mode order rotated each round; each child: one warm-up round, one timed round",
        "modes": per_mode,
        "paired_decode_ratios": ratios,
        "interrupted_by": stop.requested().map(stop::signal_name),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_get_the_parents_arguments_less_mode_rounds_and_json() {
        let parent = "bench m.gguf --offload-exec cpu,pcie --gen-tokens 8 --rounds=3 --json --device gpu --offload-exec=passback";
        let got = passthrough_args(parent.split(' ').map(String::from));
        assert_eq!(
            got,
            ["bench", "m.gguf", "--gen-tokens", "8", "--device", "gpu"]
        );
    }
}
