//! The one median every measuring command reports.

/// Median of the finite samples: the middle one, or the mean of the two middle ones for an even
/// count (so two rounds report their mean, not the faster one); NaN when none is finite.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_nan() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![70.45, 71.52]), (70.45 + 71.52) / 2.0);
        assert_eq!(median(vec![f64::NAN, 5.0]), 5.0);
        assert!(median(vec![]).is_nan());
    }
}
