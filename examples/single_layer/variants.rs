//! `--flags-variants` and `--ab-rounds`: the flags join's knobs by name, and the A/B that races
//! them against the first one in interleaved rounds.

#[cfg(feature = "experiments")]
use std::num::NonZeroU32;
use std::num::NonZeroU8;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use hipfire::exec::flags::FlagsTuning;
use hipfire::exec::offload::{JoinStrategy, OffloadExecutor, OffloadMode};
use hipfire::exec::share::ShareSetting;
use hipfire::gpu::Context;

use crate::{Bench, Mode, AUTO_WARM_REPS, D, FF};

/// The number after `prefix` in `knob` (`prefetch-64` → 64), or an error saying what the knob
/// `takes`.
fn knob_number<T: std::str::FromStr>(knob: &str, prefix: &str, takes: &str) -> Result<T> {
    knob.strip_prefix(prefix)
        .and_then(|digits| digits.parse().ok())
        .with_context(|| format!("--flags-variants: {knob}: {takes}"))
}

/// One variant of an A/B: the flags join's host-side tuning.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tuning {
    pub(crate) flags: FlagsTuning,
}

impl Tuning {
    /// Set `ex` up with this variant.
    pub(crate) fn apply(&self, ex: &mut OffloadExecutor) {
        ex.set_flags_tuning(self.flags);
    }
}

/// The knobs `--flags-variants` takes, for its error message.
#[cfg(not(feature = "experiments"))]
const KNOBS: &str = "default, chunks-N, prefetch-KIB, tagged-x, seq-x";
/// The knobs `--flags-variants` takes, for its error message (with the `experiments` feature's).
#[cfg(feature = "experiments")]
const KNOBS: &str = "default, chunks-N, prefetch-KIB, tagged-x, seq-x, publish-blocks-N";

/// `--flags-variants`: each entry's label and tuning.
pub(crate) fn parse_flags_variants(list: &str) -> Result<Vec<(String, Tuning)>> {
    list.split(',')
        .map(|v| {
            let mut tuning = Tuning::default();
            let t = &mut tuning.flags;
            for knob in v.split('+').filter(|k| *k != "default") {
                match knob {
                    "tagged-x" => t.tagged_x = true,
                    "seq-x" => t.tagged_x = false,
                    k if k.starts_with("chunks-") => {
                        let n: NonZeroU8 =
                            knob_number(k, "chunks-", "chunks-N takes chunks per worker (1-255)")?;
                        t.chunks_per_worker = n.get();
                    }
                    #[cfg(feature = "experiments")]
                    k if k.starts_with("publish-blocks-") => {
                        let n: NonZeroU32 = knob_number(
                            k,
                            "publish-blocks-",
                            "publish-blocks-N takes a block count (1 or more)",
                        )?;
                        t.publish_blocks = n.get();
                    }
                    k if k.starts_with("prefetch-") => {
                        let kib: usize =
                            knob_number(k, "prefetch-", "prefetch-KIB takes a number of KiB")?;
                        t.prefetch_bytes = kib << 10;
                    }
                    other => anyhow::bail!(
                        "--flags-variants: unknown knob {other:?} ({KNOBS}; join with +, \
                         separate with ,)"
                    ),
                }
            }
            Ok((v.to_string(), tuning))
        })
        .collect()
}

/// `--ab-rounds R`: the flags variants against the first one, interleaved. One executor per
/// variant (passback auto, warmed), then R rounds in which each runs `reps / 2` layer reps, the
/// order rotated every round; per variant, the median over rounds of the first variant's time
/// over its own (its throughput relative to the first). Box drift between rounds cancels.
pub(crate) fn flags_ab(
    ctx: &Arc<Context>,
    pool: &hipfire::exec::CpuPool,
    b: &Bench<'_>,
    variants: &[(String, Tuning)],
    rounds: usize,
    reps: usize,
    json_path: Option<&str>,
) -> Result<()> {
    anyhow::ensure!(
        variants.len() >= 2 && rounds >= 1,
        "--ab-rounds needs --flags-variants with at least two variants and at least one round"
    );
    let mut exs = Vec::new();
    for (_, t) in variants {
        let mode = OffloadMode::Passback {
            share: ShareSetting::Auto,
            strategy: JoinStrategy::Flags,
        };
        let mut ex = OffloadExecutor::new(ctx, pool.clone(), mode, FF, 2 * FF)?;
        t.apply(&mut ex);
        b.run(Mode::Offload, Some(&mut ex), AUTO_WARM_REPS, None)?;
        exs.push(ex);
    }
    let round_reps = (reps / 2).max(5);
    let bytes = b.layer_bytes() as f64;
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); variants.len()];
    for round in 0..rounds {
        for j in 0..variants.len() {
            let v = (j + round) % variants.len();
            times[v].push(b.run(Mode::Offload, Some(&mut exs[v]), round_reps, None)?.0);
        }
    }
    println!(
        "flags A/B: {rounds} interleaved rounds of {round_reps} layer reps, passback auto; ratio = \
         the first variant's time over this one's, median over rounds"
    );
    let mut rows = Vec::new();
    for (v, (name, _)) in variants.iter().enumerate() {
        let by_round: Vec<f64> = times[0].iter().zip(&times[v]).map(|(a, b)| a / b).collect();
        let mut ratios = by_round.clone();
        ratios.sort_by(f64::total_cmp);
        let mut t = times[v].clone();
        t.sort_by(f64::total_cmp);
        let (med_ratio, med_us) = (ratios[ratios.len() / 2], t[t.len() / 2]);
        println!(
            "  {:<28} {:>8.1} us/layer {:>7.1} GB/s  ratio {:.3}  (sorted {})",
            flags_label(name),
            med_us,
            bytes / med_us / 1e3,
            med_ratio,
            ratios
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        rows.push(serde_json::json!({"variant": name, "us_per_layer_rounds": times[v],
            "median_us": med_us, "ratio_to_first_rounds": by_round, "median_ratio_to_first": med_ratio,
            "share": exs[v].controller().gpu_share(&exs[v].shape_key(
                b.copies[0][0].format, D, hipfire::exec::share::Form::Plain))}));
    }
    if let Some(p) = json_path {
        let out = serde_json::json!({"example": "single_layer", "mode": "flags_ab",
            "device": ctx.info().name, "cpu_workers": pool.threads(), "layer_bytes": bytes,
            "layer_copies": b.copies.len(), "chain": b.chain, "rounds": rounds, "round_reps": round_reps,
            "variants": rows});
        std::fs::write(p, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {p}"))?;
    }
    Ok(())
}

/// The label of a flags run under variant `v` (`flags` for the default).
pub(crate) fn flags_label(v: &str) -> String {
    if v == "default" {
        "flags".into()
    } else {
        format!("flags/{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_into_their_tunings() {
        let v = parse_flags_variants("default,chunks-8+seq-x,prefetch-0").expect("parse");
        let names: Vec<&str> = v.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["default", "chunks-8+seq-x", "prefetch-0"]);
        assert_eq!(v[0].1.flags, FlagsTuning::default());
        assert_eq!(
            v[1].1.flags,
            FlagsTuning {
                chunks_per_worker: 8,
                tagged_x: false,
                ..FlagsTuning::default()
            }
        );
        assert_eq!(
            v[2].1.flags,
            FlagsTuning {
                prefetch_bytes: 0,
                ..FlagsTuning::default()
            }
        );
    }

    #[test]
    fn deleted_and_malformed_knobs_are_refused() {
        // Knobs that lost their A/B are gone with their code.
        for v in [
            "last",
            "per-worker-rows",
            "leader-fence",
            "device-x",
            "key-by-rows",
        ] {
            let err = parse_flags_variants(v).expect_err(v).to_string();
            assert!(err.contains("unknown knob"), "{v}: {err}");
        }
        assert!(parse_flags_variants("chunks-0").is_err(), "chunks-0");
        assert!(parse_flags_variants("prefetch-x").is_err(), "prefetch-x");
        #[cfg(not(feature = "experiments"))]
        assert!(parse_flags_variants("publish-blocks-16").is_err());
        #[cfg(feature = "experiments")]
        assert_eq!(
            parse_flags_variants("publish-blocks-16").expect("parse")[0]
                .1
                .flags
                .publish_blocks,
            16
        );
    }
}
