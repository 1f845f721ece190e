//! Scaled RoPE (linear ×4, YaRN ×4) on random-weight llama / qwen2 files against llama.cpp's
//! own logits, recorded by `scripts/record_llama_cpp_rope.py` into
//! `tests/fixtures/rope_scaling_llamacpp.json` (llama-cpp-python 0.3.36, f32 weights and KV).
//!
//! Each file is regenerated here from the `hipfire synth` flags stored with it, and its SHA-256
//! checked against the recorded one, so both sides saw the same bytes. The unscaled files are
//! in the fixture too: their logits must be far from the scaled ones (outside the bound), which
//! shows the comparison would catch scaling being ignored.

#[path = "common/synth_fixture.rs"]
mod synth_fixture;

use hipfire_model::{RopeScaling, RopeScalingKind, SynthSpec};
use hipfire_quant::Format;
use synth_fixture::{floats, row_err, top1_agreement};

/// Largest |hipfire − llama.cpp| on a recorded logit row, as a fraction of that row's range
/// (max − min). Both sides multiply f32 weights in f32; hipfire rounds K and V to f16, llama.cpp
/// keeps them in f32, and llama.cpp builds its angles in f32 by repeated multiplication.
/// Measured 2026-12-01 (5 rows × 6 files, AVX-512 tier): 0.00015–0.00017. llama.cpp's own
/// unscaled file is 0.014–0.041 of the range away from its scaled one (the control below).
const MAX_REL_RANGE: f64 = 0.002;
/// Fewest positions (of 200) whose argmax must equal llama.cpp's. Measured 200/200 on every
/// file; llama.cpp's unscaled files agree with its scaled ones at 0.865–0.985 of positions.
const MIN_TOP1: f64 = 0.99;

/// How many bounds apart llama.cpp's unscaled logits must be from its scaled ones, so a
/// hipfire that ignored the scaling could not pass (measured: 7–20 bounds).
const CONTROL_MARGIN: f64 = 4.0;

/// The spec `hipfire synth` builds from `flags` (the subset the recorder uses).
fn spec_from_flags(flags: &[String]) -> (SynthSpec, u64) {
    let val = |name: &str| {
        flags
            .iter()
            .position(|f| f == name)
            .map(|i| flags[i + 1].as_str())
    };
    let mut spec = SynthSpec::preset(match val("--arch").expect("--arch") {
        "tiny" => "tiny-llama",
        other => other,
    })
    .expect("preset");
    assert_eq!(val("--format"), Some("f32"));
    if let Some(kind) = val("--rope-scaling") {
        let factor: f64 = val("--rope-scaling-factor")
            .expect("factor")
            .parse()
            .expect("factor");
        spec.rope_scaling = RopeScaling {
            kind: match kind {
                "linear" => RopeScalingKind::Linear,
                "yarn" => RopeScalingKind::Yarn,
                k => panic!("scaling {k}"),
            },
            factor,
            orig_ctx: val("--rope-original-ctx").map_or(spec.ctx_len, |v| v.parse().expect("ctx")),
            ..RopeScaling::none(spec.ctx_len)
        };
    }
    let seed = val("--seed").expect("seed").parse().expect("seed");
    (spec, seed)
}

/// hipfire's logits at every position of `prompt`, one decode step each.
fn hipfire_logits(name: &str, flags: &[String], sha: &str, prompt: &[u32]) -> Vec<Vec<f32>> {
    let dir = std::env::temp_dir().join(format!("hipfire-rope-{}", std::process::id()));
    let (spec, seed) = spec_from_flags(flags);
    let model = synth_fixture::regenerate(&dir, name, &spec, Format::F32, seed, sha);
    let mut s = model.session();
    prompt
        .iter()
        .map(|&t| s.step(t).expect("step").to_vec())
        .collect()
}

#[test]
fn scaled_rope_logits_match_llama_cpp() {
    let f = synth_fixture::fixture("rope_scaling_llamacpp.json");
    let prompt = synth_fixture::ids(&f["prompt_ids"]);
    let cases = f["cases"].as_array().expect("cases");
    let by_name = |n: &str| cases.iter().find(|c| c["name"] == n).expect("case");
    let mut report = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let flags = synth_fixture::flags(case);
        let got = hipfire_logits(name, &flags, case["sha256"].as_str().expect("sha"), &prompt);
        let agree = top1_agreement(&got, &case["argmax"]);
        let mut worst = 0f64;
        for (pos, row) in case["logits"].as_object().expect("logits") {
            let p: usize = pos.parse().expect("position");
            let a: Vec<f64> = got[p].iter().map(|&x| f64::from(x)).collect();
            worst = worst.max(row_err(&a, &floats(row)));
        }
        report.push(format!(
            "{name}: max |diff|/range {worst:.5}, top-1 {agree:.3}"
        ));
        assert!(
            worst < MAX_REL_RANGE && agree >= MIN_TOP1,
            "{}",
            report.join("; ")
        );

        // The control: llama.cpp's unscaled file is outside the bound of the scaled one.
        if let Some(base) = name
            .strip_suffix("-linear4")
            .or(name.strip_suffix("-yarn4"))
        {
            let none = by_name(&format!("{base}-none"));
            let mut gap = 0f64;
            for (pos, row) in case["logits"].as_object().expect("logits") {
                gap = gap.max(row_err(&floats(&none["logits"][pos]), &floats(row)));
            }
            let ok = gap > CONTROL_MARGIN * MAX_REL_RANGE;
            report.push(format!(
                "  control {base}-none vs {name} (llama.cpp both): {gap:.5}{}",
                if ok { "" } else { " FAIL" }
            ));
        }
    }
    let report = report.join("\n");
    eprintln!("{report}");
    assert!(!report.contains("FAIL"), "{report}");
}
