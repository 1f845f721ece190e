//! Mixture-of-Experts routing, the same arithmetic for every engine: each token's router
//! logits → softmax over all experts → the `n_expert_used` most probable → their weights
//! (renormalised to sum to 1 where [`MoeConfig::norm_topk`] says), as llama.cpp's
//! `build_moe_ffn` with softmax gating does; or, with [`ExpertGating::SoftmaxTopK`] (gpt-oss),
//! the `n_expert_used` largest logits → a softmax over those alone. [`ExpertRows`] then groups a step's tokens by
//! expert, so an engine reads each used expert's weights once for all the tokens routed to it.

use crate::config::{ExpertActivation, ExpertGating, MoeConfig};
use crate::ops;
use crate::ModelError;

/// The experts each token of a step uses: token `t`'s `j`-th choice is
/// `experts[t·k + j]` with weight `weights[t·k + j]` (`k = n_expert_used`), in descending
/// probability, ties to the lower expert index.
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
    /// Route every token of `logits` (`n_expert` router outputs a token).
    pub fn from_logits(logits: &[f32], cfg: &MoeConfig) -> Result<Routes, ModelError> {
        let (e, k) = (cfg.n_expert, cfg.n_expert_used);
        if e == 0 || k == 0 || k > e || logits.len() % e != 0 {
            return Err(ModelError::InvalidOption(format!(
                "routing {} logits over {e} experts, {k} a token",
                logits.len()
            )));
        }
        let n = logits.len() / e;
        let mut experts = Vec::with_capacity(n * k);
        let mut weights = Vec::with_capacity(n * k);
        let mut probs = vec![0f32; e];
        let mut order: Vec<u32> = Vec::with_capacity(e);
        let softmax_all = cfg.gating == ExpertGating::Softmax;
        for row in logits.chunks_exact(e) {
            // The scores the top k is taken from: probabilities, or the logits themselves
            // (the same order unless the softmax rounds two apart logits to one value).
            probs.copy_from_slice(row);
            if softmax_all {
                ops::softmax(&mut probs);
            }
            order.clear();
            order.extend(0..e as u32);
            // Descending probability; equal ones by index, so the choice is deterministic.
            // A NaN logit (a broken model) sorts as equal and routes by index, never panics.
            order.select_nth_unstable_by(k - 1, |&a, &b| {
                probs[b as usize]
                    .partial_cmp(&probs[a as usize])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(&b))
            });
            let top = &mut order[..k];
            top.sort_unstable_by(|&a, &b| {
                probs[b as usize]
                    .partial_cmp(&probs[a as usize])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(&b))
            });
            let w0 = weights.len();
            for &x in top.iter() {
                experts.push(x);
                weights.push(probs[x as usize]);
            }
            if !softmax_all {
                ops::softmax(&mut weights[w0..]);
            }
            if cfg.norm_topk {
                let sum: f32 = weights[w0..].iter().sum();
                weights[w0..].iter_mut().for_each(|w| *w /= sum);
            }
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
            gating: ExpertGating::Softmax,
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

    /// gpt-oss's gating against a direct f64 computation: the k largest logits (ties to the
    /// lower index), then a softmax over those k alone.
    #[test]
    fn softmax_after_top_k_matches_f64() {
        let (e, k) = (32, 4);
        let logits: Vec<f32> = (0..5 * e)
            .map(|i| ((i * 7919 % 211) as f32 - 100.0) / 17.0)
            .collect();
        let c = MoeConfig {
            gating: ExpertGating::SoftmaxTopK,
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
