//! Token selection: greedy, or seeded temperature / top-k / top-p sampling.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::ModelError;

/// How to pick the next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1.0: all).
    pub top_p: f32,
    /// RNG seed (same seed, same logits → same tokens).
    pub seed: u64,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop at an end-of-generation token (it is not passed to the callback).
    pub stop_at_eog: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            max_tokens: 128,
            stop_at_eog: true,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens`.
    pub fn greedy(max_tokens: usize) -> SamplingParams {
        SamplingParams {
            max_tokens,
            ..SamplingParams::default()
        }
    }

    /// Reject NaN or out-of-range values.
    pub fn validate(&self) -> Result<(), ModelError> {
        // One message per parameter, naming only the one at fault.
        if !self.temperature.is_finite() {
            return Err(ModelError::InvalidOption(format!(
                "temperature {} must be finite",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ModelError::InvalidOption(format!(
                "top_p {:e} (as the sampler's f32) must be in (0, 1]",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// Index of the largest logit (lowest index on ties, as `std`'s max_by would not guarantee).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// A seeded sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler for `params` (validated).
    pub fn new(params: &SamplingParams) -> Result<Sampler, ModelError> {
        params.validate()?;
        Ok(Sampler {
            params: params.clone(),
            rng: ChaCha8Rng::seed_from_u64(params.seed),
        })
    }

    /// Pick a token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || logits.len() < 2 {
            return argmax(logits);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        // Descending by logit, ties by id, so the candidate order is deterministic.
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.truncate(p.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand
            .iter()
            .map(|c| (f64::from(c.1 - max) / f64::from(p.temperature)).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|v| *v /= total);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, &v) in probs.iter().enumerate() {
                acc += v;
                if acc >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            let t: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|v| *v /= t);
        }
        let r: f64 = self.rng.random();
        let mut acc = 0.0;
        for (i, &v) in probs.iter().enumerate() {
            acc += v;
            if r < acc {
                return cand[i].0;
            }
        }
        cand[probs.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_top_p_is_blamed_on_top_p_not_temperature() {
        let p = SamplingParams {
            temperature: 0.8,
            top_p: 1e-320_f64 as f32,
            ..SamplingParams::greedy(0)
        };
        let e = p.validate().expect_err("top_p 0 refused").to_string();
        assert!(e.contains("top_p") && !e.contains("temperature"), "{e}");
        let p = SamplingParams {
            temperature: f32::NAN,
            ..SamplingParams::greedy(0)
        };
        let e = p.validate().expect_err("NaN refused").to_string();
        assert!(e.contains("temperature") && !e.contains("top_p"), "{e}");
    }

    fn logits(seed: u64, n: usize) -> Vec<f32> {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| r.random_range(-4.0f32..4.0)).collect()
    }

    #[test]
    fn greedy_top_k_1_and_tiny_top_p_are_argmax() {
        let l = logits(1, 1000);
        let best = argmax(&l);
        assert_eq!(l.iter().cloned().fold(f32::MIN, f32::max), l[best as usize]);
        for p in [
            SamplingParams {
                temperature: 1.0,
                top_k: 1,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.0,
                top_p: 1e-6,
                seed: 3,
                ..SamplingParams::default()
            },
            SamplingParams::greedy(1),
        ] {
            let mut s = Sampler::new(&p).unwrap();
            for _ in 0..20 {
                assert_eq!(s.sample(&l), best);
            }
        }
    }

    #[test]
    fn sampling_frequencies_follow_the_softmax() {
        // 5 tokens, T = 0.7: empirical frequencies over 40k draws within 0.01 of the f64
        // softmax (binomial σ ≤ 0.0025, so the bound is 4σ).
        let l = [1.0f32, 0.5, 0.0, -0.5, 2.0];
        let t = 0.7f64;
        let z: f64 = l.iter().map(|&v| (f64::from(v) / t).exp()).sum();
        let p = SamplingParams {
            temperature: 0.7,
            seed: 11,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p).unwrap();
        let mut counts = [0usize; 5];
        const N: usize = 40_000;
        for _ in 0..N {
            counts[s.sample(&l) as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let want = (f64::from(l[i]) / t).exp() / z;
            assert!(
                (c as f64 / N as f64 - want).abs() < 0.01,
                "token {i}: {c} vs p {want}"
            );
        }
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        let l = logits(2, 200);
        let mut order: Vec<u32> = (0..200).collect();
        order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 3,
            seed: 5,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p).unwrap();
        for _ in 0..500 {
            assert!(order[..3].contains(&s.sample(&l)));
        }
        assert!(Sampler::new(&SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        })
        .is_err());
        assert!(Sampler::new(&SamplingParams {
            temperature: f32::NAN,
            ..SamplingParams::default()
        })
        .is_err());
    }
}
