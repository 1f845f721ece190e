//! Small f32 kernels of the decode step that are not GEMVs (norms, RoPE, softmax, SwiGLU),
//! plus row dequantisation for the embedding lookup.

use hipfire_quant::Format;

use crate::ModelError;

/// `out = x / rms(x) * w` (RMSNorm; the sum of squares in f64 so long rows do not drift).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMSNorm in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// Per-position RoPE tables: `cos`/`sin` of `pos * theta_i` for the `rope_dim / 2` pairs.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
    neox: bool,
    rope_dim: usize,
}

impl Rope {
    /// `theta_i = base^(-2i/rope_dim) / factor_i` (factors: llama-3.1 `rope_freqs.weight`).
    pub fn new(rope_dim: usize, base: f64, neox: bool, factors: Option<&[f32]>) -> Rope {
        let inv_freq = (0..rope_dim / 2)
            .map(|i| {
                let f = factors
                    .and_then(|f| f.get(i))
                    .map_or(1.0, |&v| f64::from(v));
                base.powf(-2.0 * i as f64 / rope_dim as f64) / f
            })
            .collect();
        Rope {
            inv_freq,
            neox,
            rope_dim,
        }
    }

    /// Rotate every head of `x` (`n_heads × head_dim`) in place for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.rope_dim / 2;
        let cs: Vec<(f32, f32)> = self
            .inv_freq
            .iter()
            .map(|&f| {
                let a = pos as f64 * f;
                (a.cos() as f32, a.sin() as f32)
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

/// Softmax in place (max-subtracted).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up` (SwiGLU).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Dequantise one row of `k` elements into `out` through hipfire-quant.
pub fn dequantize_row(fmt: Format, bytes: &[u8], out: &mut [f32]) -> Result<(), ModelError> {
    hipfire_quant::dequantize_row(fmt, bytes, out)?;
    Ok(())
}
