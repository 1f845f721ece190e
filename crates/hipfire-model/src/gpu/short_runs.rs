//! Which form a short prompt run's projections take — the multi-column GEMV (each weight read
//! once for all the run's tokens, spilled rows split with the CPU pool) or the GEMM step (each
//! weight expanded to f16, spilled layers staged whole) — from the step times this decoder has
//! measured, not from a fixed count.
//!
//! A pure state machine: the decoder reports each timed prompt step (`observe`) and asks before
//! each short run (`take_cols`). Each form's step time is fitted as `a + b·tokens` over its
//! recent steps (exponentially weighted least squares: a GEMM step's fixed part is the weight
//! expansion and the staging of spilled layers, a multi-column step's grows with its columns).
//! Until both fits exist the multi-column GEMV is taken: on the H200 box it was ahead of the
//! GEMM at every run length from 2 to 16 tokens, resident and spilled
//! (docs/perf-checkpoints/2026-12-03-short-prompts-cols-h200).

/// Weight kept by earlier observations at each new one: about the last 10 steps of a form
/// count. Chosen, not tuned.
const DECAY: f64 = 0.9;

/// The GEMM is taken for a short run only when its predicted time is below this fraction of
/// the multi-column GEMV's: the two forms round the activation differently (f16 rows against
/// 8-bit blocks), so a run should not flip between them on noise. Chosen, not tuned.
const SWITCH_MARGIN: f64 = 0.9;

/// Fewest tokens apart the observed steps of a form must be before its line is trusted (two
/// points at almost the same length give a slope from noise alone). Chosen, not tuned.
const MIN_SPREAD_TOKENS: f64 = 2.0;

/// The form of a prompt step's projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepForm {
    /// The multi-column GEMV.
    Cols,
    /// Dequantise to f16 and multiply by the GEMM.
    Gemm,
}

/// Exponentially weighted least-squares line of step seconds against tokens.
#[derive(Debug, Default, Clone, Copy)]
struct LineFit {
    w: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    lo: f64,
    hi: f64,
}

impl LineFit {
    fn add(&mut self, x: f64, y: f64) {
        if self.w == 0.0 {
            (self.lo, self.hi) = (x, x);
        }
        self.w = self.w * DECAY + 1.0;
        self.sx = self.sx * DECAY + x;
        self.sy = self.sy * DECAY + y;
        self.sxx = self.sxx * DECAY + x * x;
        self.sxy = self.sxy * DECAY + x * y;
        self.lo = self.lo.min(x);
        self.hi = self.hi.max(x);
    }

    /// Predicted seconds at `x` tokens, once the observations span enough lengths; the slope
    /// is kept at zero or above (a step never gets faster with more tokens).
    fn predict(&self, x: f64) -> Option<f64> {
        if self.hi - self.lo < MIN_SPREAD_TOKENS {
            return None;
        }
        let det = self.w * self.sxx - self.sx * self.sx;
        if det <= 0.0 {
            return None;
        }
        let slope = ((self.w * self.sxy - self.sx * self.sy) / det).max(0.0);
        let intercept = (self.sy - slope * self.sx) / self.w;
        Some(intercept + slope * x)
    }
}

/// The two forms' fitted step times.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ShortRunChooser {
    cols: LineFit,
    gemm: LineFit,
}

impl ShortRunChooser {
    /// A prompt step of `tokens` tokens in `form` took `seconds` (embedding to logits).
    pub(crate) fn observe(&mut self, form: StepForm, tokens: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) || tokens < 2 {
            return;
        }
        let fit = match form {
            StepForm::Cols => &mut self.cols,
            StepForm::Gemm => &mut self.gemm,
        };
        fit.add(tokens as f64, seconds);
    }

    /// Whether a run of `tokens` tokens (within the multi-column GEMV's reach) should take it.
    pub(crate) fn take_cols(&self, tokens: usize) -> bool {
        let x = tokens as f64;
        match (self.cols.predict(x), self.gemm.predict(x)) {
            (Some(c), Some(g)) => g >= SWITCH_MARGIN * c,
            _ => true,
        }
    }

    /// The two predictions at `tokens` (for the trace): multi-column, GEMM.
    pub(crate) fn predictions(&self, tokens: usize) -> (Option<f64>, Option<f64>) {
        let x = tokens as f64;
        (self.cols.predict(x), self.gemm.predict(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of a form timed as `a + b·n` with a ±`jitter` wobble that changes sign step by step.
    fn feed(c: &mut ShortRunChooser, form: StepForm, a: f64, b: f64, ns: &[usize], jitter: f64) {
        for (i, &n) in ns.iter().enumerate() {
            let wobble = if i % 2 == 0 { jitter } else { -jitter };
            c.observe(form, n, (a + b * n as f64) * (1.0 + wobble));
        }
    }

    #[test]
    fn multi_column_until_both_forms_are_measured() {
        let mut c = ShortRunChooser::default();
        assert!(c.take_cols(8));
        // GEMM steps alone (long prompts): no line for the multi-column form yet.
        feed(&mut c, StepForm::Gemm, 0.001, 1e-6, &[600, 1000, 37], 0.0);
        assert!(c.take_cols(8));
        // One multi-column length only: its line is not trusted.
        feed(&mut c, StepForm::Cols, 0.003, 0.001, &[8, 8, 8], 0.0);
        assert!(c.take_cols(8));
        assert_eq!(c.predictions(8).0, None);
    }

    #[test]
    fn the_faster_form_by_the_fitted_lines_with_a_margin() {
        let mut c = ShortRunChooser::default();
        // GEMM: 20 ms fixed (expansion, staging) + 50 µs a token; multi-column: 3 ms + 2 ms a
        // token, so they cross at about 8.9 tokens.
        feed(
            &mut c,
            StepForm::Gemm,
            0.020,
            50e-6,
            &[512, 40, 1024, 100],
            0.02,
        );
        feed(
            &mut c,
            StepForm::Cols,
            0.003,
            0.002,
            &[2, 4, 9, 16, 3],
            0.02,
        );
        let (cols, gemm) = c.predictions(12);
        let (cols, gemm) = (cols.expect("cols line"), gemm.expect("gemm line"));
        assert!((cols - 0.027).abs() < 0.002, "cols at 12: {cols}");
        assert!((gemm - 0.0206).abs() < 0.002, "gemm at 12: {gemm}");
        assert!(c.take_cols(2) && c.take_cols(6));
        assert!(!c.take_cols(12) && !c.take_cols(16));
        // Near the crossing the margin keeps the multi-column GEMV.
        assert!(c.take_cols(9));
    }

    #[test]
    fn bad_observations_are_ignored() {
        let mut c = ShortRunChooser::default();
        for s in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
            c.observe(StepForm::Gemm, 100, s);
            c.observe(StepForm::Cols, 4, s);
        }
        c.observe(StepForm::Cols, 1, 0.5);
        assert_eq!(c.predictions(8), (None, None));
        assert!(c.take_cols(8));
    }

    #[test]
    fn recent_steps_outweigh_old_ones() {
        let mut c = ShortRunChooser::default();
        feed(&mut c, StepForm::Cols, 0.003, 0.001, &[2, 16, 4, 12], 0.0);
        // The GEMM was slow, then (the host freed up, say) fast.
        feed(&mut c, StepForm::Gemm, 0.050, 50e-6, &[100, 500, 300], 0.0);
        assert!(c.take_cols(10));
        let lengths: Vec<usize> = (0..30).map(|i| 100 + (i * 137) % 400).collect();
        feed(&mut c, StepForm::Gemm, 0.002, 50e-6, &lengths, 0.0);
        assert!(!c.take_cols(10));
    }
}
