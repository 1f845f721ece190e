//! Mixture-of-Experts routing, the same arithmetic for every engine: each token's router
//! logits → scores (softmax over all experts, or a sigmoid each: [`Gating`]) → the
//! `n_expert_used` highest, ranked after adding the layer's selection bias where it has one →
//! their unbiased scores as weights (renormalised to sum to 1 where [`MoeConfig::norm_topk`]
//! says, then times [`MoeConfig::weights_scale`]), as llama.cpp's `build_moe_ffn` does; or, with
//! [`Gating::SoftmaxTopK`] (gpt-oss), the `n_expert_used` largest logits → a softmax over those
//! alone. [`ExpertRows`] then groups a step's tokens by expert, so an engine reads each used
//! expert's weights once for all the tokens routed to it.

use crate::config::{ExpertActivation, Gating, MoeConfig};

use crate::ops;
use crate::ModelError;

/// Smallest sum the chosen weights are divided by when renormalised: llama.cpp clamps the sum
/// to the smallest normal f16 (`build_moe_ffn`), so sigmoid scores that all underflow give
/// small weights rather than a division by zero. A softmax's top k of at most
/// [`crate::config::MAX_EXPERT_COUNT`] experts sum to at least `k / n_expert` ≥ 1/1024, far
/// above it, so softmax routing never meets the clamp.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// The experts each token of a step uses: token `t`'s `j`-th choice is
/// `experts[t·k + j]` with weight `weights[t·k + j]` (`k = n_expert_used`), in descending
/// selection score (the score plus any selection bias), ties to the lower expert index.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    /// Experts per token.
    pub k: usize,
    /// Chosen expert ids, `k` a token.
    pub experts: Vec<u32>,
    /// Their weights, `k` a token.
    pub weights: Vec<f32>,
}

impl Routes {
    /// Route every token of `logits` (`n_expert` router outputs a token), without a
    /// selection bias.
    pub fn from_logits(logits: &[f32], cfg: &MoeConfig) -> Result<Routes, ModelError> {
        Routes::from_logits_biased(logits, cfg, None)
    }

    /// Route every token of `logits`; `bias` (`n_expert` values: a layer's `exp_probs_b`),
    /// where given, is added to each token's scores to choose its experts, and the weights
    /// are the chosen experts' unbiased scores.
    pub fn from_logits_biased(
        logits: &[f32],
        cfg: &MoeConfig,
        bias: Option<&[f32]>,
    ) -> Result<Routes, ModelError> {
        let (e, k) = (cfg.n_expert, cfg.n_expert_used);
        if e == 0 || k == 0 || k > e || logits.len() % e != 0 || bias.is_some_and(|b| b.len() != e)
        {
            return Err(ModelError::InvalidOption(format!(
                "routing {} logits over {e} experts, {k} a token, with {} selection biases",
                logits.len(),
                bias.map_or(0, <[f32]>::len)
            )));
        }
        let n = logits.len() / e;
        let mut experts = Vec::with_capacity(n * k);
        let mut weights = Vec::with_capacity(n * k);
        let mut probs = vec![0f32; e];
        let mut select = vec![0f32; e];
        let mut order: Vec<u32> = Vec::with_capacity(e);
        for row in logits.chunks_exact(e) {
            // The scores the top k is taken from: probabilities, or the logits themselves
            // (the same order unless the softmax rounds two apart logits to one value).
            probs.copy_from_slice(row);
            match cfg.gating {
                Gating::Softmax => ops::softmax(&mut probs),
                Gating::Sigmoid => probs.iter_mut().for_each(|p| *p = sigmoid(*p)),
                // The top k of the logits themselves (the same order as their softmax unless
                // it rounds two apart logits to one value), softmaxed once chosen.
                Gating::SoftmaxTopK => {}
            }
            let scores = match bias {
                None => &probs,
                Some(b) => {
                    select
                        .iter_mut()
                        .zip(probs.iter().zip(b))
                        .for_each(|(s, (p, b))| *s = p + b);
                    &select
                }
            };
            // Descending score; equal ones by index, so the choice is deterministic.
            // A NaN logit (a broken model) sorts as equal and routes by index, never panics.
            let rank = |a: &u32, b: &u32| {
                scores[*b as usize]
                    .partial_cmp(&scores[*a as usize])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(b))
            };
            order.clear();
            order.extend(0..e as u32);
            order.select_nth_unstable_by(k - 1, rank);
            let top = &mut order[..k];
            top.sort_unstable_by(rank);
            let w0 = weights.len();
            for &x in top.iter() {
                experts.push(x);
                weights.push(probs[x as usize]);
            }
            if cfg.gating == Gating::SoftmaxTopK {
                ops::softmax(&mut weights[w0..]);
            }
            let chosen = &mut weights[w0..];
            if cfg.norm_topk {
                let sum = chosen.iter().sum::<f32>().max(MIN_WEIGHT_SUM);
                chosen.iter_mut().for_each(|w| *w /= sum);
            }
            // × 1 is exact, so models without a scale keep their weights bit for bit.
            chosen.iter_mut().for_each(|w| *w *= cfg.weights_scale);
        }
        Ok(Routes {
            k,
            experts,
            weights,
        })
    }

    /// Tokens routed.
    pub fn tokens(&self) -> usize {
        self.experts.len() / self.k.max(1)
    }
}

/// A step's tokens grouped by expert: for each used expert (ascending id), the tokens routed
/// to it (ascending) and their weights.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertRows {
    /// `(expert, first, end)`: the expert's tokens are `rows[first..end]`.
    pub groups: Vec<(usize, usize, usize)>,
    /// Token index of each assignment, grouped by expert.
    pub rows: Vec<usize>,
    /// Weight of each assignment.
    pub weights: Vec<f32>,
}

impl ExpertRows {
    /// Group `routes` (made for `n_expert` experts) by expert: a counting sort.
    pub(crate) fn new(routes: &Routes, n_expert: usize) -> ExpertRows {
        let mut count = vec![0usize; n_expert + 1];
        for &x in &routes.experts {
            count[x as usize + 1] += 1;
        }
        for i in 0..n_expert {
            count[i + 1] += count[i];
        }
        let start = count.clone();
        let total = routes.experts.len();
        let (mut rows, mut weights) = (vec![0usize; total], vec![0f32; total]);
        for (a, (&x, &w)) in routes.experts.iter().zip(&routes.weights).enumerate() {
            let slot = &mut count[x as usize];
            rows[*slot] = a / routes.k;
            weights[*slot] = w;
            *slot += 1;
        }
        let groups = (0..n_expert)
            .filter(|&x| start[x + 1] > start[x])
            .map(|x| (x, start[x], start[x + 1]))
            .collect();
        ExpertRows {
            groups,
            rows,
            weights,
        }
    }
}

/// What a routed expert does around its three projections, on host rows: its activation and,
/// for gpt-oss, a bias after each projection (the layer's [`crate::block::ExpertBiases`] of
/// this expert). The shared expert is plain SwiGLU ([`ExpertExtras::SWIGLU`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExpertExtras<'v> {
    /// The gated activation.
    pub act: ExpertActivation,
    /// The gate, up and down biases.
    pub biases: Option<(&'v [f32], &'v [f32], &'v [f32])>,
}

impl ExpertExtras<'_> {
    /// Plain SwiGLU, no biases.
    pub const SWIGLU: ExpertExtras<'static> = ExpertExtras {
        act: ExpertActivation::Silu,
        biases: None,
    };

    /// `g ← act(g + b_gate, u + b_up)` for each row of `ff` values of `g` and `u`.
    pub fn activate(&self, g: &mut [f32], u: &mut [f32], ff: usize) {
        for (gr, ur) in g.chunks_exact_mut(ff).zip(u.chunks_exact_mut(ff)) {
            if let Some((bg, bu, _)) = self.biases {
                add_row(gr, bg);
                add_row(ur, bu);
            }
            match self.act {
                ExpertActivation::Silu => ops::swiglu(gr, ur),
                ExpertActivation::SwigluOai => ops::swiglu_oai(gr, ur),
            }
        }
    }

    /// `y ← y + b_down` for each row of `y` (`d_model` values each).
    pub fn finish(&self, y: &mut [f32]) {
        if let Some((_, _, bd)) = self.biases {
            y.chunks_exact_mut(bd.len()).for_each(|r| add_row(r, bd));
        }
    }
}

/// `r += b` element-wise.
pub(crate) fn add_row(r: &mut [f32], b: &[f32]) {
    r.iter_mut().zip(b).for_each(|(y, &v)| *y += v);
}

/// `1 / (1 + e^{−x})`: the shared expert's scalar gate.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(e: usize, k: usize, norm: bool) -> MoeConfig {
        MoeConfig {
            n_expert: e,
            n_expert_used: k,
            n_ff_exp: 8,
            norm_topk: norm,
            n_ff_shared: None,
            gating: Gating::Softmax,
            weights_scale: 1.0,
            n_dense_lead: 0,
            activation: crate::config::ExpertActivation::Silu,
        }
    }

    /// Token `t` of `r` chose `top` in that order, each with weight `want(expert)` (to 1e-6).
    fn assert_route(r: &Routes, t: usize, top: &[usize], want: impl Fn(usize) -> f64) {
        let k = top.len();
        for (j, &i) in top.iter().enumerate() {
            assert_eq!(r.experts[t * k + j] as usize, i, "token {t} choice {j}");
            let (got, want) = (f64::from(r.weights[t * k + j]), want(i));
            assert!((got - want).abs() < 1e-6, "token {t}: {got} vs {want}");
        }
    }

    /// Against a direct f64 computation: softmax, sort, take k, optional renormalisation.
    #[test]
    fn routes_match_an_f64_softmax_top_k() {
        let (e, k) = (16, 4);
        let logits: Vec<f32> = (0..3 * e)
            .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 13.0)
            .collect();
        for norm in [false, true] {
            let r = Routes::from_logits(&logits, &cfg(e, k, norm)).expect("route");
            assert_eq!(r.tokens(), 3);
            for (t, row) in logits.chunks_exact(e).enumerate() {
                let mx = row
                    .iter()
                    .fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
                let ex: Vec<f64> = row.iter().map(|&v| (f64::from(v) - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                let mut idx: Vec<usize> = (0..e).collect();
                idx.sort_by(|&a, &b| ex[b].partial_cmp(&ex[a]).unwrap().then(a.cmp(&b)));
                let top = &idx[..k];
                let s: f64 = top.iter().map(|&i| ex[i] / z).sum();
                assert_route(&r, t, top, |i| ex[i] / z / if norm { s } else { 1.0 });
            }
        }
    }

    /// GLM-4.5's routing against a direct f64 computation (HF `Glm4MoeTopkRouter` /
    /// `Glm4MoeMoE.route_tokens_to_experts`): sigmoid scores, top k of score + bias, weights
    /// the chosen unbiased scores, optionally renormalised, times the scale. The bias is large
    /// enough to reorder the choice, and the test checks that it did for some token (else the
    /// weights-from-unbiased-scores rule would go untested).
    #[test]
    fn sigmoid_routes_choose_by_biased_scores_and_weigh_by_unbiased_ones() {
        let (e, k, tokens) = (16, 4, 6);
        let logits: Vec<f32> = (0..tokens * e)
            .map(|i| ((i * 7919 % 97) as f32 - 48.0) / 20.0)
            .collect();
        let bias: Vec<f32> = (0..e).map(|i| ((i * 37 % 11) as f32 - 5.0) / 8.0).collect();
        let mut reordered = 0;
        for (norm, scale) in [(true, 2.5f32), (false, 1.0)] {
            let c = MoeConfig {
                gating: Gating::Sigmoid,
                weights_scale: scale,
                ..cfg(e, k, norm)
            };
            let r = Routes::from_logits_biased(&logits, &c, Some(&bias)).expect("route");
            for (t, row) in logits.chunks_exact(e).enumerate() {
                let p: Vec<f64> = row
                    .iter()
                    .map(|&l| 1.0 / (1.0 + (-f64::from(l)).exp()))
                    .collect();
                let sel: Vec<f64> = p
                    .iter()
                    .zip(&bias)
                    .map(|(a, &b)| a + f64::from(b))
                    .collect();
                let by = |v: &[f64]| {
                    let mut idx: Vec<usize> = (0..e).collect();
                    idx.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap().then(a.cmp(&b)));
                    idx.truncate(k);
                    idx
                };
                let top = by(&sel);
                let mut unbiased = by(&p);
                let mut chosen = top.clone();
                unbiased.sort_unstable();
                chosen.sort_unstable();
                reordered += usize::from(unbiased != chosen);
                let sum: f64 = top.iter().map(|&i| p[i]).sum();
                for (j, &i) in top.iter().enumerate() {
                    assert_eq!(r.experts[t * k + j] as usize, i, "token {t} choice {j}");
                    let want = p[i] / if norm { sum } else { 1.0 } * f64::from(scale);
                    let got = f64::from(r.weights[t * k + j]);
                    assert!((got - want).abs() < 1e-6, "token {t}: {got} vs {want}");
                }
            }
        }
        assert!(
            reordered > 0,
            "the bias never changed which experts were chosen"
        );
    }

    /// Sigmoid scores that underflow to 0 are renormalised by llama.cpp's clamped sum: zero
    /// weights, not NaN. A selection bias of the wrong length is refused.
    #[test]
    fn sigmoid_routes_survive_underflow_and_refuse_a_short_bias() {
        let c = MoeConfig {
            gating: Gating::Sigmoid,
            ..cfg(4, 2, true)
        };
        let r = Routes::from_logits(&[-1e4; 4], &c).expect("route");
        assert_eq!(
            (r.experts.as_slice(), r.weights.as_slice()),
            (&[0, 1][..], &[0.0, 0.0][..])
        );
        assert!(Routes::from_logits_biased(&[0.0; 4], &c, Some(&[0.0; 3])).is_err());
    }

    /// gpt-oss's gating against a direct f64 computation: the k largest logits (ties to the
    /// lower index), then a softmax over those k alone.
    #[test]
    fn softmax_after_top_k_matches_f64() {
        let (e, k) = (32, 4);
        let logits: Vec<f32> = (0..5 * e)
            .map(|i| ((i * 7919 % 211) as f32 - 100.0) / 17.0)
            .collect();
        let c = MoeConfig {
            gating: Gating::SoftmaxTopK,
            ..cfg(e, k, false)
        };
        let r = Routes::from_logits(&logits, &c).expect("route");
        for (t, row) in logits.chunks_exact(e).enumerate() {
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
            let top = &idx[..k];
            let mx = f64::from(row[top[0]]);
            let z: f64 = top.iter().map(|&i| (f64::from(row[i]) - mx).exp()).sum();
            assert_route(&r, t, top, |i| (f64::from(row[i]) - mx).exp() / z);
        }
        // Not the softmax-over-all weights renormalised by accident: those equal these, so
        // check the k weights differ from the full softmax's probabilities.
        let full = Routes::from_logits(&logits, &cfg(e, k, false)).expect("route");
        assert_eq!(full.experts, r.experts);
        assert!(full
            .weights
            .iter()
            .zip(&r.weights)
            .any(|(a, b)| (a - b).abs() > 1e-3));
    }

    #[test]
    fn ties_go_to_the_lower_index_and_bad_shapes_are_refused() {
        let r = Routes::from_logits(&[1.0; 8], &cfg(8, 3, true)).expect("route");
        assert_eq!(r.experts, [0, 1, 2]);
        assert!(r.weights.iter().all(|&w| (w - 1.0 / 3.0).abs() < 1e-6));
        assert!(Routes::from_logits(&[0.0; 7], &cfg(8, 3, true)).is_err());
        assert!(Routes::from_logits(&[0.0; 8], &cfg(8, 9, true)).is_err());
        // A NaN logit routes without panicking.
        let mut l = [0.5f32; 8];
        l[3] = f32::NAN;
        assert_eq!(
            Routes::from_logits(&l, &cfg(8, 2, false)).expect("nan").k,
            2
        );
    }

    #[test]
    fn expert_rows_group_every_assignment_once() {
        let routes = Routes {
            k: 2,
            experts: vec![3, 1, 1, 0, 3, 2],
            weights: vec![0.6, 0.4, 0.7, 0.3, 0.9, 0.1],
        };
        let g = ExpertRows::new(&routes, 5);
        assert_eq!(g.groups, [(0, 0, 1), (1, 1, 3), (2, 3, 4), (3, 4, 6)]);
        assert_eq!(g.rows, [1, 0, 1, 2, 0, 2]);
        assert_eq!(g.weights, [0.3, 0.4, 0.7, 0.1, 0.6, 0.9]);
    }
}
