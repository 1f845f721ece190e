//! The median of interleaved rounds' ratios and a distribution-free confidence interval for it,
//! so that a table says how far its medians can be trusted (one round of a short shape's race
//! spread ±10 % on the H200 box, docs/perf-checkpoints/2026-11-30-share-intervals-h200).

/// Smallest coverage the interval is widened to (two-sided).
const MEDIAN_CI_COVERAGE: f64 = 0.95;

/// A median with the order-statistic interval around it.
#[derive(Debug, Clone)]
pub(crate) struct MedianCi {
    pub(crate) median: f64,
    /// Bounds of an interval covering the true median with probability at least
    /// [`MEDIAN_CI_COVERAGE`] (NaN when there are too few rounds for one).
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    /// The values, sorted.
    pub(crate) sorted: Vec<f64>,
}

impl MedianCi {
    /// The median of `values` (the upper one of an even count) and the interval between the
    /// order statistics whose ranks a Binomial(n, ½) places outside with probability at most
    /// (1 − coverage) / 2 on each side.
    pub(crate) fn of(mut values: Vec<f64>) -> MedianCi {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = values.get(n / 2).copied().unwrap_or(f64::NAN);
        // The largest j with P(Bin(n, ½) < j) <= (1 − coverage) / 2: then the j-th smallest
        // and the j-th largest bound the median with at least that coverage.
        let tail = (1.0 - MEDIAN_CI_COVERAGE) / 2.0;
        let mut cdf = 0.0;
        let mut j = 0;
        for i in 0..n {
            cdf += binomial_half(n, i);
            if cdf > tail {
                break;
            }
            j = i + 1;
        }
        let (lo, hi) = if j >= 1 {
            (values[j - 1], values[n - j])
        } else {
            (f64::NAN, f64::NAN)
        };
        MedianCi {
            median,
            lo,
            hi,
            sorted: values,
        }
    }
}

/// P(Bin(n, ½) = i), in logs so that large n do not overflow.
fn binomial_half(n: usize, i: usize) -> f64 {
    let ln_fact = |x: usize| (1..=x).map(|v| (v as f64).ln()).sum::<f64>();
    (ln_fact(n) - ln_fact(i) - ln_fact(n - i) - n as f64 * std::f64::consts::LN_2).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifteen_rounds_bound_the_median_by_their_4th_and_12th() {
        // P(Bin(15, ½) <= 3) = 0.0176 <= 0.025 < P(<= 4) = 0.059.
        let m = MedianCi::of((0..15).rev().map(f64::from).collect());
        assert_eq!((m.median, m.lo, m.hi), (7.0, 3.0, 11.0));
    }

    #[test]
    fn too_few_rounds_give_no_interval() {
        // Five rounds: even the extremes cover only 1 − 2/32 = 0.9375.
        let m = MedianCi::of(vec![3.0, 1.0, 2.0, 5.0, 4.0]);
        assert_eq!(m.median, 3.0);
        assert!(m.lo.is_nan() && m.hi.is_nan());
    }
}
