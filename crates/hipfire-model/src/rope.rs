//! Rotary position embedding: the per-dimension frequencies and the magnitude scale, computed
//! once here for both engines (the CPU's [`Rope::apply`] and the GPU's `rope_f32` kernel, which
//! gets [`Rope::inv_freq`] and [`Rope::mscale`]), including context-extension scaling read from
//! the GGUF.
//!
//! The formulas are llama.cpp's (b8xxx as vendored by llama-cpp-python 0.3.36):
//! `llama_model::load_hparams` reads `{arch}.rope.scaling.{type,factor,attn_factor,
//! original_context_length}`; `llama_context`'s constructor turns them into `freq_scale`,
//! `ext_factor` and `attn_factor`; ggml's `ggml_rope_yarn_corr_dims` and `rope_yarn`
//! (`ggml-cpu/ops.cpp`) give each rotated pair its angle and the cos/sin magnitude.
//! Three forms are supported: linear (position interpolation), YaRN, and llama-3's
//! `rope_freqs.weight` per-pair divisors (which compose with either).

use crate::gguf::GgufIndex;
use crate::ModelError;

/// RoPE scaling types this crate applies (`{arch}.rope.scaling.type`).
pub const SUPPORTED_SCALING: &str = "none, linear, yarn";

/// YaRN's `beta_fast` when the file does not say (llama.cpp's `yarn_beta_fast` default, also
/// HF transformers' `_compute_yarn_parameters` default): rotations faster than this many turns
/// over the original context are extrapolated (left unscaled).
pub const DEFAULT_YARN_BETA_FAST: f64 = 32.0;
/// YaRN's `beta_slow` default (llama.cpp, HF): rotations slower than this many turns over the
/// original context are fully interpolated.
pub const DEFAULT_YARN_BETA_SLOW: f64 = 1.0;
/// Floor of YaRN's ramp width (`rope_yarn_ramp`'s `MAX(0.001f, high - low)`), so a degenerate
/// range does not divide by zero.
const YARN_RAMP_MIN_WIDTH: f64 = 0.001;
/// Coefficient of YaRN's attention temperature `1 + 0.1 ln(factor)` (the YaRN paper's
/// `sqrt(1/t) = 0.1 ln(s) + 1`, as `rope_yarn` and llama.cpp's `get_mscale` write it).
const YARN_MSCALE_COEF: f64 = 0.1;

/// How positions are stretched past the training context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingKind {
    /// No scaling (also what a `linear` type with no factor amounts to).
    None,
    /// Position interpolation: every angle divided by the factor.
    Linear,
    /// YaRN: high-frequency pairs kept, low-frequency pairs interpolated, a ramp between, and
    /// cos/sin scaled by `1 + 0.1 ln(factor)`.
    Yarn,
}

impl RopeScalingKind {
    /// The GGUF name.
    pub fn name(self) -> &'static str {
        match self {
            RopeScalingKind::None => "none",
            RopeScalingKind::Linear => "linear",
            RopeScalingKind::Yarn => "yarn",
        }
    }
}

/// Context-extension parameters of a model's RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    /// The method.
    pub kind: RopeScalingKind,
    /// Context multiple (`rope.scaling.factor`; llama.cpp's `1 / freq_scale`); 1 when unscaled.
    pub factor: f64,
    /// Context the model was pre-trained on (`rope.scaling.original_context_length`, else the
    /// file's `context_length`): YaRN's correction range is computed against it.
    pub orig_ctx: usize,
    /// Extra magnitude on cos/sin (`rope.scaling.attn_factor`, default 1), any kind.
    pub attn_factor: f64,
    /// YaRN `beta_fast` (`rope.scaling.yarn_beta_fast`, default [`DEFAULT_YARN_BETA_FAST`]).
    pub beta_fast: f64,
    /// YaRN `beta_slow` (`rope.scaling.yarn_beta_slow`, default [`DEFAULT_YARN_BETA_SLOW`]).
    pub beta_slow: f64,
}

impl RopeScaling {
    /// No scaling, for a model trained on `ctx` positions.
    pub fn none(ctx: usize) -> RopeScaling {
        RopeScaling {
            kind: RopeScalingKind::None,
            factor: 1.0,
            orig_ctx: ctx,
            attn_factor: 1.0,
            beta_fast: DEFAULT_YARN_BETA_FAST,
            beta_slow: DEFAULT_YARN_BETA_SLOW,
        }
    }

    /// Read `{prefix}.rope.scaling.*` (`ctx` is the file's `context_length`). As llama.cpp: a
    /// missing type means `linear`, a missing or zero factor means 1, `none` ignores the
    /// factor. Any other type is refused by name; a factor, attention factor or beta that is
    /// not a positive finite number is refused.
    pub fn from_gguf(idx: &GgufIndex, prefix: &str, ctx: usize) -> Result<RopeScaling, ModelError> {
        let key = |k: &str| format!("{prefix}.rope.scaling.{k}");
        let num = |k: &str| -> Result<Option<f64>, ModelError> {
            match idx.get(&key(k)) {
                None => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    ModelError::Unsupported(format!("{} is not a number: {v:?}", key(k)))
                }),
            }
        };
        let positive = |k: &str, v: f64| -> Result<f64, ModelError> {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(ModelError::Unsupported(format!(
                    "{} = {v} (must be a positive finite number)",
                    key(k)
                )))
            }
        };
        let kind = match idx.get(&key("type")) {
            None => RopeScalingKind::Linear,
            Some(v) => match v.as_str() {
                Some("none") => RopeScalingKind::None,
                Some("linear") => RopeScalingKind::Linear,
                Some("yarn") => RopeScalingKind::Yarn,
                other => {
                    return Err(ModelError::Unsupported(format!(
                        "RoPE scaling type {} (supported: {SUPPORTED_SCALING})",
                        other.map_or_else(|| format!("{v:?}"), |s| format!("{s:?}"))
                    )))
                }
            },
        };
        // `rope.scale_linear` is the factor's older key name (llama.cpp falls back to it).
        let factor = match num("factor")? {
            Some(f) => Some(f),
            None => match idx.get(&format!("{prefix}.rope.scale_linear")) {
                None => None,
                Some(v) => Some(v.as_f64().ok_or_else(|| {
                    ModelError::Unsupported(format!("{prefix}.rope.scale_linear: {v:?}"))
                })?),
            },
        };
        let factor = match factor {
            None => 1.0,
            // -0.0 matches too.
            Some(0.0) => 1.0,
            Some(f) => positive("factor", f)?,
        };
        let orig_ctx = match idx.get(&key("original_context_length")) {
            None => ctx,
            Some(v) => match v.as_u64() {
                Some(0) => ctx,
                Some(n) => usize::try_from(n).map_err(|_| {
                    ModelError::Unsupported(format!("{} = {n}", key("original_context_length")))
                })?,
                None => {
                    return Err(ModelError::Unsupported(format!(
                        "{} is not an unsigned integer: {v:?}",
                        key("original_context_length")
                    )))
                }
            },
        };
        if orig_ctx == 0 {
            return Err(ModelError::Unsupported(
                "RoPE original context length is 0".into(),
            ));
        }
        let attn_factor = num("attn_factor")?.map_or(Ok(1.0), |v| positive("attn_factor", v))?;
        let beta_fast = num("yarn_beta_fast")?.map_or(Ok(DEFAULT_YARN_BETA_FAST), |v| {
            positive("yarn_beta_fast", v)
        })?;
        let beta_slow = num("yarn_beta_slow")?.map_or(Ok(DEFAULT_YARN_BETA_SLOW), |v| {
            positive("yarn_beta_slow", v)
        })?;
        let (kind, factor) = match kind {
            RopeScalingKind::None => (RopeScalingKind::None, 1.0),
            // Linear by 1 is no scaling; keep the name honest in the summary.
            RopeScalingKind::Linear if factor == 1.0 => (RopeScalingKind::None, 1.0),
            k => (k, factor),
        };
        Ok(RopeScaling {
            kind,
            factor,
            orig_ctx,
            attn_factor,
            beta_fast,
            beta_slow,
        })
    }

    /// One line for the load summary, empty when unscaled.
    pub fn describe(&self) -> String {
        match self.kind {
            RopeScalingKind::None if self.attn_factor == 1.0 => String::new(),
            k => format!(
                "rope {} ×{} (orig ctx {})",
                k.name(),
                self.factor,
                self.orig_ctx
            ),
        }
    }
}

/// YaRN's correction range `[low, high]` in pair indices (`ggml_rope_yarn_corr_dims`): pairs
/// below `low` rotate more than `beta_fast` turns over the original context and are kept as
/// trained; pairs above `high` are interpolated.
fn yarn_corr_dims(
    rope_dim: usize,
    orig_ctx: usize,
    base: f64,
    beta_fast: f64,
    beta_slow: f64,
) -> (f64, f64) {
    let n = rope_dim as f64;
    let corr = |n_rot: f64| {
        n * (orig_ctx as f64 / (n_rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let low = corr(beta_fast).floor().max(0.0);
    let high = corr(beta_slow).ceil().min(n - 1.0);
    (low, high)
}

/// Per-position RoPE: angle `pos · inv_freq[i]` for each of the `rope_dim / 2` pairs, and cos/sin
/// scaled by `mscale`.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
    mscale: f64,
    neox: bool,
    rope_dim: usize,
}

impl Rope {
    /// Frequencies `base^(-2i/rope_dim) / factors[i]` (llama-3 `rope_freqs.weight`), then
    /// `scaling` applied: linear divides every one by the factor; YaRN blends the divided and
    /// undivided frequency by a ramp over `yarn_corr_dims` and sets the magnitude scale.
    pub fn new(
        rope_dim: usize,
        base: f64,
        neox: bool,
        scaling: &RopeScaling,
        factors: Option<&[f32]>,
    ) -> Rope {
        // llama.cpp: freq_scale = 1 / factor (1 for `none`), ext_factor = 1 for YaRN else 0.
        let freq_scale = 1.0 / scaling.factor;
        let yarn = scaling.kind == RopeScalingKind::Yarn;
        let (low, high) = yarn_corr_dims(
            rope_dim,
            scaling.orig_ctx,
            base,
            scaling.beta_fast,
            scaling.beta_slow,
        );
        let inv_freq = (0..rope_dim / 2)
            .map(|i| {
                let ff = factors
                    .and_then(|f| f.get(i))
                    .map_or(1.0, |&v| f64::from(v));
                let extrap = base.powf(-2.0 * i as f64 / rope_dim as f64) / ff;
                let interp = freq_scale * extrap;
                if yarn {
                    let y = (i as f64 - low) / (high - low).max(YARN_RAMP_MIN_WIDTH);
                    let mix = 1.0 - y.clamp(0.0, 1.0);
                    interp * (1.0 - mix) + extrap * mix
                } else {
                    interp
                }
            })
            .collect();
        // llama_context sets YaRN's attn_factor to get_mscale(factor) / (1 + 0.1 ln factor),
        // where get_mscale(f) = 1 + 0.1 ln f for f > 1 and 1 otherwise, and rope_yarn multiplies
        // it back by 1 + 0.1 ln(1 / freq_scale): the product is 1 + 0.1 ln factor above 1 and 1
        // at or below. The file's attn_factor multiplies every kind.
        let yarn_mscale = if yarn && scaling.factor > 1.0 {
            1.0 + YARN_MSCALE_COEF * scaling.factor.ln()
        } else {
            1.0
        };
        let mscale = yarn_mscale * scaling.attn_factor;
        Rope {
            inv_freq,
            mscale,
            neox,
            rope_dim,
        }
    }

    /// Per-pair angular frequency (radians per position), what the GPU kernel reads.
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// Magnitude applied to cos and sin (1 unless YaRN or an attention factor).
    pub fn mscale(&self) -> f64 {
        self.mscale
    }

    /// Rotate every head of `x` (`n_heads × head_dim`) in place for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.rope_dim / 2;
        let cs: Vec<(f32, f32)> = self
            .inv_freq
            .iter()
            .map(|&f| {
                let a = pos as f64 * f;
                (
                    (a.cos() * self.mscale) as f32,
                    (a.sin() * self.mscale) as f32,
                )
            })
            .collect();
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if self.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, MetaValue};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// llama.cpp's cos/sin of pair `i` at `pos`, transcribed step by step in f64 from
    /// `llama_model::load_hparams` (factor → freq_scale), `llama_context::llama_context`
    /// (ext_factor, the YaRN attn_factor and its cancellation), `ggml_rope_yarn_corr_dims` and
    /// `rope_yarn`; `kind` is the GGUF string, `factor_key` the raw `rope.scaling.factor`.
    #[allow(clippy::too_many_arguments)]
    fn llama_cpp_cos_sin(
        pos: usize,
        i: usize,
        n_dims: usize,
        base: f64,
        kind: &str,
        factor_key: f64,
        n_ctx_orig: usize,
        rope_attn_factor: f64,
        freq_factor: f64,
    ) -> (f64, f64) {
        let freq_scale_train = if factor_key == 0.0 {
            1.0
        } else {
            1.0 / factor_key
        };
        let freq_scale = if kind == "none" {
            1.0
        } else {
            freq_scale_train
        };
        let ext_factor = if kind == "yarn" { 1.0 } else { 0.0 };
        let mut attn_factor = 1.0f64;
        if ext_factor != 0.0 {
            let get_mscale = |scale: f64, mscale: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * mscale * scale.ln() + 1.0
                }
            };
            let factor = 1.0 / freq_scale;
            attn_factor = get_mscale(factor, 1.0);
            attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        attn_factor *= rope_attn_factor;
        // ggml_rope_yarn_corr_dims with llama.cpp's default betas.
        let corr_dim = |n_rot: f64| {
            n_dims as f64 * (n_ctx_orig as f64 / (n_rot * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = corr_dim(32.0).floor();
        let end = corr_dim(1.0).ceil();
        let corr = [start.max(0.0), end.min(n_dims as f64 - 1.0)];
        // ggml_rope_cache_init: theta = pos · theta_scale^i, divided by the freq factor.
        let theta_scale = base.powf(-2.0 / n_dims as f64);
        let theta_extrap = pos as f64 * theta_scale.powi(i as i32) / freq_factor;
        // rope_yarn (i0 = 2i, and its ramp takes i0 / 2).
        let theta_interp = freq_scale * theta_extrap;
        let mut theta = theta_interp;
        let mut mscale = attn_factor;
        if ext_factor != 0.0 {
            let y = (i as f64 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
            theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
        }
        (theta.cos() * mscale, theta.sin() * mscale)
    }

    fn index(meta: &[(String, MetaValue)]) -> GgufIndex {
        let bytes = GgufWriter::new(Vec::new(), meta, &[])
            .and_then(GgufWriter::finish)
            .expect("write metadata");
        GgufIndex::parse(&bytes).expect("parse metadata")
    }

    fn scaling_meta(
        kind: Option<&str>,
        factor: Option<f32>,
        orig: Option<u32>,
        attn: Option<f32>,
    ) -> Vec<(String, MetaValue)> {
        let mut m = Vec::new();
        if let Some(k) = kind {
            m.push((
                "llama.rope.scaling.type".into(),
                MetaValue::String(k.into()),
            ));
        }
        if let Some(f) = factor {
            m.push(("llama.rope.scaling.factor".into(), MetaValue::F32(f)));
        }
        if let Some(o) = orig {
            m.push((
                "llama.rope.scaling.original_context_length".into(),
                MetaValue::U32(o),
            ));
        }
        if let Some(a) = attn {
            m.push(("llama.rope.scaling.attn_factor".into(), MetaValue::F32(a)));
        }
        m
    }

    /// Every form (none, linear, YaRN; with and without llama-3 factors and an attention
    /// factor; both pairings; factors above and below 1) rotates as llama.cpp's formulas do.
    #[test]
    fn rope_matches_llama_cpp_formulas_in_f64() {
        let mut r = ChaCha8Rng::seed_from_u64(9);
        type Case = (Option<&'static str>, Option<f32>, Option<u32>, Option<f32>);
        let cases: [Case; 8] = [
            (None, None, None, None),
            (Some("none"), Some(4.0), None, None),
            (Some("linear"), Some(4.0), None, None),
            (None, Some(8.0), None, None),
            (Some("yarn"), Some(4.0), Some(4096), None),
            (Some("yarn"), Some(4.0), Some(64), Some(1.25)),
            (Some("yarn"), Some(0.5), None, None),
            (Some("linear"), Some(2.0), None, Some(0.8)),
        ];
        // (head_dim, rope_dim, base, file context_length, llama-3 factors)
        let shapes = [
            (64usize, 64usize, 10_000.0f64, 16_384usize, false),
            (128, 128, 500_000.0, 32_768, true),
            (16, 12, 10_000.0, 2048, false),
        ];
        let heads = 3;
        for &(hd, rope_dim, base, ctx, llama3) in &shapes {
            let factors: Option<Vec<f32>> = llama3.then(|| {
                (0..rope_dim / 2)
                    .map(|_| r.random_range(1.0f32..8.0))
                    .collect()
            });
            let x: Vec<f32> = (0..hd * heads)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect();
            for &(kind, factor, orig, attn) in &cases {
                let sc = RopeScaling::from_gguf(
                    &index(&scaling_meta(kind, factor, orig, attn)),
                    "llama",
                    ctx,
                )
                .expect("scaling");
                for neox in [false, true] {
                    let rope = Rope::new(rope_dim, base, neox, &sc, factors.as_deref());
                    for pos in [0usize, 1, 37, 1000, 20_000] {
                        let mut y = x.clone();
                        rope.apply(&mut y, hd, pos);
                        for h in 0..heads {
                            let xh = &x[h * hd..(h + 1) * hd];
                            let mut want: Vec<f64> = xh.iter().map(|&v| f64::from(v)).collect();
                            for i in 0..rope_dim / 2 {
                                let ff = factors.as_ref().map_or(1.0, |f| f64::from(f[i]));
                                let (c, s) = llama_cpp_cos_sin(
                                    pos,
                                    i,
                                    rope_dim,
                                    base,
                                    kind.unwrap_or("linear"),
                                    factor.map_or(0.0, f64::from),
                                    orig.map_or(ctx, |o| o as usize),
                                    attn.map_or(1.0, f64::from),
                                    ff,
                                );
                                let (a, b) = if neox {
                                    (i, i + rope_dim / 2)
                                } else {
                                    (2 * i, 2 * i + 1)
                                };
                                let (x0, x1) = (f64::from(xh[a]), f64::from(xh[b]));
                                want[a] = x0 * c - x1 * s;
                                want[b] = x0 * s + x1 * c;
                            }
                            for (j, (g, w)) in y[h * hd..(h + 1) * hd].iter().zip(&want).enumerate()
                            {
                                assert!(
                                    (f64::from(*g) - w).abs() < 2e-6,
                                    "{kind:?} ×{factor:?} rope_dim {rope_dim} neox {neox} pos {pos} dim {j}: {g} vs {w}"
                                );
                            }
                            // Dims past rope_dim are untouched.
                            assert_eq!(y[h * hd + rope_dim..(h + 1) * hd], xh[rope_dim..]);
                        }
                    }
                }
            }
        }
    }

    /// The scaling forms really change the angles (a test of the reference, not only of the
    /// code): linear ×4 divides every frequency by 4, YaRN keeps the fastest pair and divides
    /// the slowest by the factor, with cos/sin scaled by 1 + 0.1 ln 4.
    #[test]
    fn scaling_changes_frequencies_as_documented() {
        let ctx = 4096;
        let plain = Rope::new(64, 10_000.0, false, &RopeScaling::none(ctx), None);
        let lin = RopeScaling::from_gguf(
            &index(&scaling_meta(Some("linear"), Some(4.0), None, None)),
            "llama",
            ctx,
        )
        .expect("linear");
        let lin = Rope::new(64, 10_000.0, false, &lin, None);
        let yarn = RopeScaling::from_gguf(
            &index(&scaling_meta(Some("yarn"), Some(4.0), None, None)),
            "llama",
            ctx,
        )
        .expect("yarn");
        assert_eq!(yarn.kind, RopeScalingKind::Yarn);
        let yarn = Rope::new(64, 10_000.0, false, &yarn, None);
        for i in 0..32 {
            assert!((lin.inv_freq()[i] * 4.0 - plain.inv_freq()[i]).abs() < 1e-15);
        }
        assert_eq!(yarn.inv_freq()[0], plain.inv_freq()[0]);
        assert!((yarn.inv_freq()[31] * 4.0 - plain.inv_freq()[31]).abs() < 1e-18);
        assert!((yarn.mscale() - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-12);
        assert_eq!(lin.mscale(), 1.0);
    }

    #[test]
    fn unknown_scaling_types_and_bad_numbers_are_refused_by_name() {
        for (kind, want) in [
            ("longrope", "\"longrope\""),
            ("llama3", "\"llama3\""),
            ("dynamic", "\"dynamic\""),
        ] {
            let e = RopeScaling::from_gguf(
                &index(&scaling_meta(Some(kind), Some(4.0), None, None)),
                "llama",
                4096,
            )
            .expect_err(kind)
            .to_string();
            assert!(e.contains(want) && e.contains(SUPPORTED_SCALING), "{e}");
        }
        for (factor, attn) in [
            (-4.0f32, 1.0f32),
            (f32::NAN, 1.0),
            (f32::INFINITY, 1.0),
            (4.0, 0.0),
            (4.0, f32::NAN),
        ] {
            let e = RopeScaling::from_gguf(
                &index(&scaling_meta(Some("yarn"), Some(factor), None, Some(attn))),
                "llama",
                4096,
            )
            .expect_err("bad number")
            .to_string();
            assert!(e.contains("positive finite"), "{e}");
        }
        let mut m = scaling_meta(None, None, None, None);
        m.push(("llama.rope.scaling.type".into(), MetaValue::U32(2)));
        let e = RopeScaling::from_gguf(&index(&m), "llama", 4096).expect_err("numeric type");
        assert!(e.to_string().contains(SUPPORTED_SCALING), "{e}");
        // A zero factor means "unset" (llama.cpp); an older key name is honoured.
        let z = RopeScaling::from_gguf(
            &index(&scaling_meta(Some("linear"), Some(0.0), None, None)),
            "llama",
            4096,
        )
        .expect("zero factor");
        assert_eq!(z, RopeScaling::none(4096));
        let old = index(&[("llama.rope.scale_linear".into(), MetaValue::F32(2.0))]);
        let old = RopeScaling::from_gguf(&old, "llama", 4096).expect("scale_linear");
        assert_eq!((old.kind, old.factor), (RopeScalingKind::Linear, 2.0));
    }
}
