//! The engine seam: everything the decode step multiplies goes through [`Backend::gemv`].
//!
//! The decode loop (norms, RoPE, attention, sampling) runs on the host and hands each weight
//! GEMV to a backend. [`CpuBackend`] runs them on hipfire-exec's pinned [`CpuPool`]; a GPU or
//! split (passback) backend implements the same trait and uses [`Weight::id`] to find its own
//! copy or mapping of the weight. [`ReferenceBackend`] is the slow, independent f64 path the
//! tests compare against.

use std::ops::Range;

use hipfire_exec::{CpuPool, GemvSegment};
use hipfire_quant::Format;

use crate::ModelError;

/// One weight matrix of the model, `m` rows of `k` elements, stored in the GGUF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weight {
    /// Dense index in load order (`0..Model::weights().len()`), for backends that keep a table.
    pub id: usize,
    /// GGUF tensor name.
    pub name: String,
    /// Storage format.
    pub format: Format,
    /// Output rows.
    pub m: usize,
    /// Elements per row.
    pub k: usize,
    /// Absolute byte offset of row 0 in the file.
    pub offset: usize,
    /// `m × format.row_bytes(k)`.
    pub n_bytes: usize,
}

/// An engine that multiplies weights by activation vectors.
pub trait Backend: Send + Sync {
    /// Short name for summaries and errors (`"cpu"`, `"cuda"`, ...).
    fn name(&self) -> &'static str;

    /// `y = W·x`, or `y += W·x` when `accumulate`. `bytes` are `w`'s bytes in the host file
    /// (`bytes.len() == w.n_bytes`), `x.len() == w.k`, `y.len() == w.m`.
    fn gemv(
        &self,
        w: &Weight,
        bytes: &[u8],
        x: &[f32],
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ModelError>;

    /// Several weights over the same `x`: `ys[i] = W_i·x`, or `+=` when `accumulate`. Each
    /// result equals [`Backend::gemv`] on its own weight; a backend may do them in one pass.
    fn gemv_batch(
        &self,
        ws: &[(&Weight, &[u8])],
        x: &[f32],
        ys: &mut [&mut [f32]],
        accumulate: bool,
    ) -> Result<(), ModelError> {
        gemv_each(self, ws, x, ys, accumulate)
    }

    /// Several weights (all with the same `k`) over `T` activation vectors: `xs` is `T × k`,
    /// `ys[i]` is `T × m_i` (token-major) and `ys[i][t·m_i..(t+1)·m_i] = W_i·x_t` (or `+=`).
    /// Each token's result equals [`Backend::gemv_batch`] (one weight: [`Backend::gemv`]) on
    /// that token; this default is exactly that loop. A backend may instead read each weight
    /// once for all tokens (prompt prefill).
    fn gemv_tokens(
        &self,
        ws: &[(&Weight, &[u8])],
        xs: &[f32],
        ys: &mut [&mut [f32]],
        accumulate: bool,
    ) -> Result<(), ModelError> {
        let tokens = check_tokens(self.name(), ws, xs, ys)?;
        if tokens == 0 || ws.is_empty() {
            return Ok(());
        }
        let k = xs.len() / tokens;
        for (t, x) in xs.chunks_exact(k).enumerate() {
            let mut yt: Vec<&mut [f32]> = ws
                .iter()
                .zip(ys.iter_mut())
                .map(|((w, _), y)| &mut y[t * w.m..(t + 1) * w.m])
                .collect();
            match (ws, yt.as_mut_slice()) {
                ([(w, bytes)], [y]) => self.gemv(w, bytes, x, y, accumulate)?,
                _ => self.gemv_batch(ws, x, &mut yt, accumulate)?,
            }
        }
        Ok(())
    }

    /// Run `f` over `0..n` (work that is not a GEMV, such as attention heads), split over the
    /// backend's CPU threads where it has them; serially by default.
    fn parallel_for(&self, n: usize, f: &(dyn Fn(Range<usize>) + Sync)) -> Result<(), ModelError> {
        f(0..n);
        Ok(())
    }

    /// One line on where weights live and who multiplies them.
    fn describe(&self) -> String;
}

/// Shapes of a [`Backend::gemv_tokens`] call: every weight has the same `k`, `xs` is a whole
/// number `T` of rows of `k` and `ys[i]` holds `T × m_i`. Returns `T` (0 when `ws` is empty).
fn check_tokens(
    backend: &'static str,
    ws: &[(&Weight, &[u8])],
    xs: &[f32],
    ys: &[&mut [f32]],
) -> Result<usize, ModelError> {
    let bad = |message: String| ModelError::Backend { backend, message };
    let Some((first, _)) = ws.first() else {
        return Ok(0);
    };
    let k = first.k;
    if ws.len() != ys.len() {
        return Err(bad(format!(
            "gemv_tokens: {} weights but {} outputs",
            ws.len(),
            ys.len()
        )));
    }
    if k == 0 || xs.len() % k != 0 {
        return Err(bad(format!(
            "gemv_tokens: {} activation values are not whole rows of k = {k}",
            xs.len()
        )));
    }
    let tokens = xs.len() / k;
    for ((w, bytes), y) in ws.iter().zip(ys) {
        if w.k != k || bytes.len() != w.n_bytes || y.len() != tokens * w.m {
            return Err(bad(format!(
                "gemv_tokens: shape mismatch for {} (k {} vs {k}, {} output values for {tokens} tokens × {} rows)",
                w.name,
                w.k,
                y.len(),
                w.m
            )));
        }
    }
    Ok(tokens)
}

/// The pool's segments for weights `ws` into outputs `ys`.
fn segments<'a>(
    ws: &[(&Weight, &'a [u8])],
    ys: &'a mut [&mut [f32]],
    accumulate: bool,
) -> Vec<GemvSegment<'a>> {
    ws.iter()
        .zip(ys.iter_mut())
        .map(|((_, bytes), y)| GemvSegment {
            w: bytes,
            y,
            accumulate,
        })
        .collect()
}

/// [`Backend::gemv_batch`] as one [`Backend::gemv`] per weight.
fn gemv_each<B: Backend + ?Sized>(
    backend: &B,
    ws: &[(&Weight, &[u8])],
    x: &[f32],
    ys: &mut [&mut [f32]],
    accumulate: bool,
) -> Result<(), ModelError> {
    for ((w, bytes), y) in ws.iter().zip(ys.iter_mut()) {
        backend.gemv(w, bytes, x, y, accumulate)?;
    }
    Ok(())
}

/// All GEMVs on hipfire-exec's pinned CPU worker pool (`--device cpu`, and the default
/// without a GPU).
#[derive(Debug, Clone)]
pub struct CpuBackend {
    pool: CpuPool,
}

impl CpuBackend {
    /// A backend computing on `threads` threads (0: one per physical core): the calling thread
    /// and `threads − 1` pinned workers. The decode loop has nothing else to do while a GEMV
    /// runs, so it takes a part itself instead of waiting for a wake-up (on the 2-core VM this
    /// and batched dispatch took SmolLM2 from 192–207 to over 250 tok/s at 2 threads).
    pub fn new(threads: usize) -> Result<CpuBackend, ModelError> {
        Ok(CpuBackend {
            pool: CpuPool::with_config(hipfire_exec::PoolConfig {
                threads,
                caller_computes: true,
                ..hipfire_exec::PoolConfig::default()
            })?,
        })
    }

    /// A backend over an existing pool (shared with other users of the CPU engine).
    pub fn with_pool(pool: CpuPool) -> CpuBackend {
        CpuBackend { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &CpuPool {
        &self.pool
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn gemv(
        &self,
        w: &Weight,
        bytes: &[u8],
        x: &[f32],
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ModelError> {
        self.pool.gemv(w.format, bytes, w.k, x, y, accumulate)?;
        Ok(())
    }

    /// One pool dispatch for weights that share a format and row length (q/k/v, gate/up of
    /// most GGUFs); otherwise one each.
    fn gemv_batch(
        &self,
        ws: &[(&Weight, &[u8])],
        x: &[f32],
        ys: &mut [&mut [f32]],
        accumulate: bool,
    ) -> Result<(), ModelError> {
        let Some(((first, _), rest)) = ws.split_first() else {
            return Ok(());
        };
        if ws.len() != ys.len()
            || rest
                .iter()
                .any(|(w, _)| w.format != first.format || w.k != first.k)
        {
            return gemv_each(self, ws, x, ys, accumulate);
        }
        let mut segs = segments(ws, ys, accumulate);
        self.pool.gemv_batch(first.format, first.k, x, &mut segs)?;
        Ok(())
    }

    /// One pool dispatch for all tokens and all weights when they share a format (q/k/v,
    /// gate/up), reading each weight tile once for every token; otherwise one per weight.
    fn gemv_tokens(
        &self,
        ws: &[(&Weight, &[u8])],
        xs: &[f32],
        ys: &mut [&mut [f32]],
        accumulate: bool,
    ) -> Result<(), ModelError> {
        check_tokens(self.name(), ws, xs, ys)?;
        let Some(((first, _), rest)) = ws.split_first() else {
            return Ok(());
        };

        if rest.iter().any(|(w, _)| w.format != first.format) {
            for ((w, bytes), y) in ws.iter().zip(ys.iter_mut()) {
                self.pool.gemv_tokens(
                    w.format,
                    w.k,
                    xs,
                    &mut [GemvSegment {
                        w: bytes,
                        y,
                        accumulate,
                    }],
                )?;
            }
            return Ok(());
        }
        let mut segs = segments(ws, ys, accumulate);
        self.pool
            .gemv_tokens(first.format, first.k, xs, &mut segs)?;
        Ok(())
    }

    fn parallel_for(&self, n: usize, f: &(dyn Fn(Range<usize>) + Sync)) -> Result<(), ModelError> {
        self.pool.parallel_for(n, f)?;
        Ok(())
    }

    fn describe(&self) -> String {
        let workers = self.pool.threads();
        format!(
            "cpu pool, {} threads ({} pinned worker{}{}), simd {:?}{}",
            self.pool.compute_threads(),
            workers,
            if workers == 1 { "" } else { "s" },
            if self.pool.compute_threads() > workers {
                " + the decode thread"
            } else {
                ""
            },
            hipfire_quant::simd_tier(),
            if hipfire_quant::amx_available() {
                ", prompt chunks on AMX bf16 tiles"
            } else {
                ""
            }
        )
    }
}

/// Single-threaded reference: dequantise each row to f64 and dot in f64 with the f32
/// activation (no activation quantisation). Slow; for tests and debugging only.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn gemv(
        &self,
        w: &Weight,
        bytes: &[u8],
        x: &[f32],
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ModelError> {
        let rb = w.format.row_bytes(w.k)?;
        if bytes.len() < w.m * rb || x.len() != w.k || y.len() != w.m {
            return Err(ModelError::Backend {
                backend: "reference",
                message: format!("shape mismatch for {}", w.name),
            });
        }
        let mut row = vec![0f64; w.k];
        for (i, yi) in y.iter_mut().enumerate() {
            hipfire_quant::dequantize_row_f64(w.format, &bytes[i * rb..(i + 1) * rb], &mut row)?;
            let d: f64 = row.iter().zip(x).map(|(&a, &b)| a * f64::from(b)).sum();
            *yi = if accumulate {
                (f64::from(*yi) + d) as f32
            } else {
                d as f32
            };
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "reference (f64, single thread)".into()
    }
}
