//! One forward pass over tokens of several sessions (continuous batching).
//!
//! [`forward_batch`] takes any number of [`BatchItem`]s — a decode token of one sequence, a
//! prompt chunk of another — and pushes all their tokens through the layers together: every
//! projection is one [`Backend::gemv_tokens`](crate::Backend::gemv_tokens) over all of them (each
//! weight read once per step for the whole batch), while RoPE, the KV append and attention are
//! per token against the token's own session at its own position.
//!
//! It is the CPU path's one forward pass: [`Session::step`] is a batch of one token, and a
//! prompt chunk a batch of one item. A step of one token runs the single-activation GEMVs
//! ([`Model::project`]); more run the multi-token ones, which are bit-identical per token to
//! those except for the kernels `hipfire_quant::multi_matches_single` names (AVX-512 VNNI Q4_K
//! from 5 tokens, whose f32 sums run in another order) and for steps of
//! `hipfire_quant::AMX_MIN_TOKENS` tokens or more on a CPU with AMX, which multiply in bf16
//! (within `hipfire_quant::amx_error_bound`). Elsewhere a sequence decoded inside a batch
//! produces exactly the logits it would produce alone.

use super::{Model, Session};
use crate::block::{self, Act, Attention, BlockOps, DeltaNet, MoeTensors, Pair};
use crate::config::FfnActivation;
use crate::delta_net;
use crate::moe::{self, ExpertExtras, ExpertRows, Routes};
use crate::{ops, ModelError};
use std::time::{Duration, Instant};

/// One session's share of a [`forward_batch`] step.
#[derive(Debug)]
pub struct BatchItem<'s, 'm> {
    /// The sequence: its KV cache receives `tokens` at positions `pos..pos + tokens.len()`.
    pub session: &'s mut Session<'m>,
    /// Tokens to feed (at least one): a decode token, or a chunk of the prompt.
    pub tokens: &'s [u32],
    /// Compute the logits after the last token into [`Session::logits`] (a prompt chunk that
    /// is not the prompt's last needs none, which saves its share of the head).
    pub want_logits: bool,
}

/// Feed every item's tokens in one forward pass (see the module docs). Everything is checked
/// before anything changes: a token outside the vocabulary, an empty item, an item whose
/// tokens overflow its context, or sessions of two different models refuse the whole step. On a
/// backend failure midway every session is put back where it was (position and cache).
pub fn forward_batch(items: &mut [BatchItem<'_, '_>]) -> Result<(), ModelError> {
    let Some(first) = items.first() else {
        return Ok(());
    };
    let m: &Model = first.session.model;
    let c = &m.config;
    for it in items.iter() {
        if !std::ptr::eq(it.session.model, m) {
            return Err(ModelError::InvalidOption(
                "a batch mixes sessions of different models".into(),
            ));
        }
        if it.tokens.is_empty() {
            return Err(ModelError::InvalidOption(
                "a batch item without tokens".into(),
            ));
        }
        if let Some(&bad) = it.tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ModelError::BadToken {
                id: bad,
                vocab: c.vocab,
            });
        }
        let need = it.session.pos + it.tokens.len();
        if need > m.ctx_len {
            return Err(ModelError::ContextFull {
                need,
                ctx: m.ctx_len,
            });
        }
    }
    let pos0: Vec<usize> = items.iter().map(|it| it.session.pos).collect();
    let done = forward_checked(m, items);
    if done.is_err() {
        for (it, &p) in items.iter_mut().zip(&pos0) {
            let s = &mut *it.session;
            s.kv.iter_mut().for_each(|kv| kv.truncate(p));
            s.pos = p;
        }
    }
    done
}

/// `f(i, row i)` for every row of `buf` (`width` values each), split over the backend's threads
/// when there are several rows and at least `min_values` values (one token, or less work than a
/// dispatch is worth: in place). The element-wise work of a
/// chunk (RMSNorm, the gated activation: 14336 `exp` a token and layer for an 8B model) ran on
/// the calling thread alone; at 16 threads it was a second of a 512-token prefill whose GEMMs
/// take ~2.5 s on AMX (estimate from the H200 box's single-thread figures, 2026-12-02).
pub(super) fn par_rows(
    m: &Model,
    buf: &mut [f32],
    width: usize,
    min_values: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Result<(), ModelError> {
    let rows = buf.len() / width.max(1);
    if rows <= 1 || buf.len() < min_values {
        buf.chunks_exact_mut(width.max(1))
            .enumerate()
            .for_each(|(i, r)| f(i, r));
        return Ok(());
    }
    let out = super::PartsOut(buf.as_mut_ptr());
    let out = &out;
    m.backend
        .parallel_for(rows, &|range: std::ops::Range<usize>| {
            for i in range {
                // SAFETY: row i < rows lies inside `buf` (rows × width values), which the caller
                // keeps borrowed mutably for the whole call; `parallel_for` hands each row to one
                // part only, so no other thread touches it.
                let row = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * width), width) };
                f(i, row);
            }
        })
}

/// [`forward_batch`] after its checks.
fn forward_checked(m: &Model, items: &mut [BatchItem<'_, '_>]) -> Result<(), ModelError> {
    let c = &m.config;
    let (d, qd, kvd, ff) = (c.d_model, c.q_dim(), c.kv_dim(), c.n_ff);
    // Row r of the step's activations: (item, position); an item's rows are contiguous.
    let rows: Vec<(usize, usize)> = items
        .iter()
        .enumerate()
        .flat_map(|(i, it)| (0..it.tokens.len()).map(move |j| (i, it.session.pos + j)))
        .collect();
    let n = rows.len();
    let mut x = vec![0f32; n * d];
    let tokens = items.iter().flat_map(|it| it.tokens.iter());
    for (&t, xt) in tokens.zip(x.chunks_exact_mut(d)) {
        m.embed(t, xt)?;
    }
    let mut step = CpuStep {
        m,
        items,
        rows: &rows,
        bufs: [
            x,
            vec![0f32; n * d],
            vec![0f32; n * qd],
            vec![0f32; n * kvd],
            vec![0f32; n * kvd],
            vec![0f32; n * qd],
            vec![0f32; n * ff],
            vec![0f32; n * ff],
        ],
        times: StepTimes::default(),
    };
    let started = Instant::now();
    for (li, l) in m.layers.iter().enumerate() {
        let t = l.map_vectors(|v| Ok::<_, std::convert::Infallible>(v.as_slice()));
        let Ok(t) = t;
        block::layer(&mut step, c, li, &t)?;
    }
    if n > 1 {
        let t = step.times;
        tracing::debug!(
            target: "hipfire::prefill",
            tokens = n,
            layers_s = started.elapsed().as_secs_f64(),
            project_s = t.project.as_secs_f64(),
            attention_s = t.attention.as_secs_f64(),
            elementwise_s = t.elementwise.as_secs_f64(),
            "cpu batched step"
        );
    }
    let [x, ..] = step.bufs;
    let items = step.items;

    // The head over the last row of every item that wants logits, in one multi-token GEMV.
    let mut last_rows = Vec::with_capacity(items.len());
    let mut r = 0;
    for it in items.iter() {
        r += it.tokens.len();
        last_rows.push(r - 1);
    }
    let wanted: Vec<usize> = (0..items.len()).filter(|&i| items[i].want_logits).collect();
    if !wanted.is_empty() {
        let mut hn = vec![0f32; wanted.len() * d];
        for (&i, hnt) in wanted.iter().zip(hn.chunks_exact_mut(d)) {
            let xt = &x[last_rows[i] * d..(last_rows[i] + 1) * d];
            ops::rms_norm(xt, &m.output_norm, c.rms_eps, hnt);
        }
        if let [i] = wanted[..] {
            // One row (a decode step): straight into the session's logits.
            let lt = &mut items[i].session.logits;
            m.project(&[m.output], &hn, &mut [&mut lt[..]], 1)?;
            m.finish_logits(lt);
        } else {
            let mut logits = vec![0f32; wanted.len() * c.vocab];
            m.project(&[m.output], &hn, &mut [&mut logits], wanted.len())?;
            m.finish_logits(&mut logits);
            for (&i, lt) in wanted.iter().zip(logits.chunks_exact(c.vocab)) {
                items[i].session.logits.copy_from_slice(lt);
            }
        }
    }
    for (it, &lr) in items.iter_mut().zip(&last_rows) {
        let s = &mut *it.session;
        s.x.copy_from_slice(&x[lr * d..(lr + 1) * d]);
        s.pos += it.tokens.len();
        // The step went through every layer: its recurrent states become the committed ones.
        s.rec.iter_mut().flatten().for_each(|l| l.commit());
    }
    Ok(())
}

/// The CPU's [`BlockOps`]: a step's activations in host vectors (one row per token, items'
/// rows contiguous), projections through the model's [`crate::Backend`], element-wise work over
/// the pool ([`par_rows`]), attention per token against its own session's cache.
struct CpuStep<'a, 'b, 's, 'm> {
    m: &'a Model,
    items: &'b mut [BatchItem<'s, 'm>],
    /// Row r of the step: (item, position).
    rows: &'a [(usize, usize)],
    /// The activations, indexed by [`Act`] in its declaration order.
    bufs: [Vec<f32>; 8],
    /// Where the step's time went (logged at debug level for multi-token steps).
    times: StepTimes,
}

/// Wall time of a [`CpuStep`] by kind of operation: the breakdown a prefill's speed is read
/// from (`RUST_LOG=hipfire::prefill=debug`), at the cost of two clock reads per operation.
#[derive(Debug, Default, Clone, Copy)]
struct StepTimes {
    /// The projections (the pool's GEMMs, their activation preparation included).
    project: Duration,
    /// RoPE, the cache writes and attention.
    attention: Duration,
    /// Norms, biases, residual adds and the gated activation.
    elementwise: Duration,
}

impl CpuStep<'_, '_, '_, '_> {
    fn buf(&self, a: Act) -> &[f32] {
        &self.bufs[a as usize]
    }

    /// Activation `a` taken out of the step (put back with [`CpuStep::put`]), so that an
    /// operation can write it while it reads others.
    fn take(&mut self, a: Act) -> Vec<f32> {
        std::mem::take(&mut self.bufs[a as usize])
    }

    fn put(&mut self, a: Act, v: Vec<f32>) {
        self.bufs[a as usize] = v;
    }

    /// `f(self)`, its wall time added to the counter `which` picks.
    fn timed<R>(
        &mut self,
        which: fn(&mut StepTimes) -> &mut Duration,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let t0 = Instant::now();
        let r = f(self);
        *which(&mut self.times) += t0.elapsed();
        r
    }
}

impl<'a> BlockOps for CpuStep<'a, '_, '_, '_> {
    type Vector = &'a [f32];

    fn rms_norm(&mut self, src: Act, w: &[f32], dst: Act, width: usize) -> Result<(), ModelError> {
        self.timed(
            |t| &mut t.elementwise,
            |s| {
                let eps = s.m.config.rms_eps;
                if src == dst {
                    // Per-head norms (q/k): a few hundred values a row, not worth a dispatch.
                    s.bufs[dst as usize]
                        .chunks_exact_mut(width)
                        .for_each(|h| ops::rms_norm_inplace(h, w, eps));
                    return Ok(());
                }
                let mut out = s.take(dst);
                let x = s.buf(src);
                let done = par_rows(s.m, &mut out, width, 0, &|i, r| {
                    ops::rms_norm(&x[i * width..(i + 1) * width], w, eps, r)
                });
                s.put(dst, out);
                done
            },
        )
    }

    fn add_bias(&mut self, dst: Act, b: &[f32]) -> Result<(), ModelError> {
        self.timed(
            |t| &mut t.elementwise,
            |s| {
                for bt in s.bufs[dst as usize].chunks_exact_mut(b.len()) {
                    bt.iter_mut().zip(b).for_each(|(y, &bb)| *y += bb);
                }
                Ok(())
            },
        )
    }

    fn project(&mut self, outs: &[(usize, Act)], input: Act) -> Result<(), ModelError> {
        self.timed(
            |t| &mut t.project,
            |s| {
                let ids: Vec<usize> = outs.iter().map(|o| o.0).collect();
                let mut ys: Vec<Vec<f32>> = outs.iter().map(|o| s.take(o.1)).collect();
                let done = {
                    let mut refs: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[..]).collect();
                    s.m.project(&ids, s.buf(input), &mut refs, s.rows.len())
                };
                for (o, y) in outs.iter().zip(ys) {
                    s.put(o.1, y);
                }
                done
            },
        )
    }

    fn project_residual(&mut self, w: usize, input: Act) -> Result<(), ModelError> {
        let inp = self.take(input);
        let done = self.residual_from(w, &inp);
        self.put(input, inp);
        done
    }

    fn attention(&mut self, li: usize, sinks: Option<&'a [f32]>) -> Result<(), ModelError> {
        self.timed(
            |t| &mut t.attention,
            |s| {
                let c = &s.m.config;
                let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
                let rope = s.m.layer_rope(li);
                let [_, _, q, k, v, att, ..] = &mut s.bufs;
                // RoPE of every token's q and k, tokens split over the threads (a 512-token
                // chunk's rotations were milliseconds a layer on this thread alone).
                let rows = s.rows;
                let (q_out, k_out) = (
                    super::PartsOut(q.as_mut_ptr()),
                    super::PartsOut(k.as_mut_ptr()),
                );
                let (q_out, k_out) = (&q_out, &k_out);
                let rotate = |ts: std::ops::Range<usize>| {
                    for t in ts {
                        // SAFETY: token t's q (`qd` values) and k (`kvd`) lie inside `q` and `k`
                        // (one row per token), borrowed mutably for the whole call; each token is
                        // handed to one part only.
                        let (qt, kt) = unsafe {
                            (
                                std::slice::from_raw_parts_mut(q_out.0.add(t * qd), qd),
                                std::slice::from_raw_parts_mut(k_out.0.add(t * kvd), kvd),
                            )
                        };
                        rope.apply(qt, hd, rows[t].1);
                        rope.apply(kt, hd, rows[t].1);
                    }
                };
                match rows.len() {
                    n if n * (qd + kvd) < super::PAR_MIN_VALUES => rotate(0..n),
                    n => s.m.backend.parallel_for(n, &rotate)?,
                }
                // Each item's new keys/values go into its own cache before any of its tokens attend,
                // so token j of an item sees positions 0..=pos0 + j, as a step at that position would.
                let mut r0 = 0;
                for it in s.items.iter_mut() {
                    let r1 = r0 + it.tokens.len();
                    let kvl = &mut it.session.kv[li];
                    for (kt, vt) in k[r0 * kvd..r1 * kvd]
                        .chunks_exact(kvd)
                        .zip(v[r0 * kvd..r1 * kvd].chunks_exact(kvd))
                    {
                        kvl.push(kt, vt);
                    }
                    r0 = r1;
                }
                // Every token's attention in one dispatch (per token, the same bits as alone).
                let queries: Vec<(&[f32], &crate::attention::KvCache, usize)> = s
                    .rows
                    .iter()
                    .zip(q.chunks_exact(qd))
                    .map(|(&(i, pos), qt)| (qt, &s.items[i].session.kv[li], pos + 1))
                    .collect();
                s.m.attention_many(li, &queries, sinks, &mut att[..s.rows.len() * qd])
            },
        )
    }

    fn rms_norm_add(&mut self, src: Act, w: &[f32]) -> Result<(), ModelError> {
        self.timed(
            |t| &mut t.elementwise,
            |s| {
                let (d, eps) = (s.m.config.d_model, s.m.config.rms_eps);
                let mut o = s.take(src);
                for (xt, ot) in s.bufs[Act::X as usize]
                    .chunks_exact_mut(d)
                    .zip(o.chunks_exact_mut(d))
                {
                    ops::rms_norm_inplace(ot, w, eps);
                    xt.iter_mut().zip(ot.iter()).for_each(|(a, &b)| *a += b);
                }
                s.put(src, o);
                Ok(())
            },
        )
    }

    fn gated_activation(&mut self, f: FfnActivation) -> Result<(), ModelError> {
        self.timed(
            |t| &mut t.elementwise,
            |s| {
                let ff = s.m.config.n_ff;
                let mut gate = s.take(Act::Gate);
                let up = s.buf(Act::Up);
                let done = par_rows(s.m, &mut gate, ff, 0, &|i, g| {
                    let u = &up[i * ff..(i + 1) * ff];
                    match f {
                        FfnActivation::Silu => ops::swiglu(g, u),
                        FfnActivation::GeluTanh => ops::geglu_tanh(g, u),
                    }
                });
                s.put(Act::Gate, gate);
                done
            },
        )
    }

    fn gated_attention(
        &mut self,
        li: usize,
        a: &Attention<usize, &'a [f32]>,
    ) -> Result<(), ModelError> {
        let (n, qd, hd) = (
            self.rows.len(),
            self.m.config.q_dim(),
            self.m.config.head_dim,
        );
        let mut qg = vec![0f32; n * 2 * qd];
        let (xn, mut k, mut v) = (self.take(Act::Xn), self.take(Act::K), self.take(Act::V));
        let done = self.timed(
            |t| &mut t.project,
            |s| {
                s.m.project(&[a.wq, a.wk, a.wv], &xn, &mut [&mut qg, &mut k, &mut v], n)
            },
        );
        self.put(Act::Xn, xn);
        self.put(Act::K, k);
        self.put(Act::V, v);
        done?;
        // Each head's rows are `[q_h, g_h]` (llama.cpp's views of `Qcur_full`).
        let mut q = self.take(Act::Q);
        for (qr, qgr) in q.chunks_exact_mut(qd).zip(qg.chunks_exact(2 * qd)) {
            for (qh, pair) in qr.chunks_exact_mut(hd).zip(qgr.chunks_exact(2 * hd)) {
                qh.copy_from_slice(&pair[..hd]);
            }
        }
        self.put(Act::Q, q);
        for (b, act) in [(a.bk, Act::K), (a.bv, Act::V)] {
            if let Some(b) = b {
                self.add_bias(act, b)?;
            }
        }
        if let Some(w) = a.q_norm {
            self.rms_norm(Act::Q, w, Act::Q, hd)?;
        }
        if let Some(w) = a.k_norm {
            self.rms_norm(Act::K, w, Act::K, hd)?;
        }
        self.attention(li, a.sinks)?;
        for (ar, qgr) in self.bufs[Act::Att as usize]
            .chunks_exact_mut(qd)
            .zip(qg.chunks_exact(2 * qd))
        {
            for (ah, pair) in ar.chunks_exact_mut(hd).zip(qgr.chunks_exact(2 * hd)) {
                ah.iter_mut()
                    .zip(&pair[hd..])
                    .for_each(|(x, &g)| *x *= moe::sigmoid(g));
            }
        }
        self.project_residual(a.wo, Act::Att)
    }

    fn delta_net(&mut self, li: usize, t: &DeltaNet<usize, &'a [f32]>) -> Result<(), ModelError> {
        let m = self.m;
        let dn = m
            .config
            .delta_net
            .as_ref()
            .ok_or_else(|| no_delta_net(li))?;
        let n = self.rows.len();
        let vd = dn.value_dim();
        // The file's two to four input projections in one dispatch; a fused one is then
        // split into llama.cpp's layout.
        let ws: Vec<usize> = t.qkvz.weights().into_iter().chain(t.ba.weights()).collect();
        let mut outs: Vec<Vec<f32>> = ws.iter().map(|&w| vec![0f32; n * m.weights[w].m]).collect();
        let xn = self.take(Act::Xn);
        let done = self.timed(
            |s| &mut s.project,
            |s| {
                let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
                s.m.project(&ws, &xn, &mut ys, n)
            },
        );
        self.put(Act::Xn, xn);
        done?;
        let mut outs = outs.into_iter();
        let mut next = || outs.next().unwrap_or_default();
        let (mut qkv, z) = match t.qkvz {
            Pair::Split(..) => (next(), next()),
            Pair::Fused(_) => delta_net::split_qkvz(dn, &next()),
        };
        let (mut beta, mut alpha) = match t.ba {
            Pair::Split(..) => (next(), next()),
            Pair::Fused(_) => delta_net::split_ba(dn, &next()),
        };
        let p = delta_net::Params {
            conv: t.conv,
            dt_bias: t.dt_bias,
            a: t.a,
        };
        let mut o = vec![0f32; n * vd];
        self.timed(
            |s| &mut s.attention,
            |s| s.delta_rule(li, &p, &mut qkv, &mut beta, &mut alpha, &mut o),
        )?;
        delta_net::gated_norm(dn, t.norm, m.config.rms_eps, &mut o, &z);
        self.residual_from(t.out, &o)
    }

    fn moe(&mut self, t: &MoeTensors<usize, &'a [f32]>) -> Result<(), ModelError> {
        let m = self.m;
        let cfg = m.config.moe.as_ref().ok_or_else(|| {
            ModelError::Unsupported("a routed FFN in a model without expert metadata".into())
        })?;
        let (n, d) = (self.rows.len(), m.config.d_model);
        let xn = self.take(Act::Xn);
        let mut logits = vec![0f32; n * cfg.n_expert];
        let done = self
            .timed(
                |s| &mut s.project,
                |s| s.m.project(&[t.router], &xn, &mut [&mut logits], n),
            )
            .and_then(|()| {
                if let Some(b) = t.router_bias {
                    logits
                        .chunks_exact_mut(b.len())
                        .for_each(|r| moe::add_row(r, b));
                }
                Routes::from_logits_biased(&logits, cfg, t.selection_bias)
            });
        let routes = match done {
            Ok(r) => r,
            Err(e) => {
                self.put(Act::Xn, xn);
                return Err(e);
            }
        };
        let mut out = vec![0f32; n * d];
        let mut done = self.routed_experts(t, &xn, &routes, &mut out);
        if let (Ok(()), Some(sh)) = (&done, &t.shared) {
            done = self.shared_expert(sh, &xn, &mut out);
        }
        self.put(Act::Xn, xn);
        done?;
        for (x, o) in self.bufs[Act::X as usize].iter_mut().zip(&out) {
            *x += o;
        }
        Ok(())
    }
}

impl CpuStep<'_, '_, '_, '_> {
    /// Layer `li`'s DeltaNet recurrence for every item's rows: `qkv`, `beta`, `alpha` are the
    /// step's projections (`beta` and `alpha` become β and the log-decay), `o` receives each
    /// row's output heads before the gated norm.
    fn delta_rule(
        &mut self,
        li: usize,
        p: &delta_net::Params<'_>,
        qkv: &mut [f32],
        beta: &mut [f32],
        alpha: &mut [f32],
        o: &mut [f32],
    ) -> Result<(), ModelError> {
        let m = self.m;
        let (c, eps) = (&m.config, m.config.rms_eps);
        let dn = c.delta_net.as_ref().ok_or_else(|| no_delta_net(li))?;
        let (cd, vd, hv, hd) = (dn.conv_dim(), dn.value_dim(), dn.n_v_heads, dn.head_dim);
        let mut r0 = 0;
        for it in self.items.iter_mut() {
            let r1 = r0 + it.tokens.len();
            let state = it.session.rec[li]
                .as_mut()
                .ok_or_else(|| no_delta_net(li))?;
            let (src, dst) = state.split();
            let mut conv_out = vec![0f32; (r1 - r0) * cd];
            delta_net::conv(
                dn,
                p.conv,
                &src.conv,
                &qkv[r0 * cd..r1 * cd],
                &mut conv_out,
                &mut dst.conv,
            );
            let (b, g) = (&mut beta[r0 * hv..r1 * hv], &mut alpha[r0 * hv..r1 * hv]);
            delta_net::prepare(dn, p, eps, &mut conv_out, b, g);
            let (b, g) = (&*b, &*g);
            let o_out = super::PartsOut(o[r0 * vd..r1 * vd].as_mut_ptr());
            let s_out = super::PartsOut(dst.s.as_mut_ptr());
            let (o_out, s_out) = (&o_out, &s_out);
            let (src_s, conv_out) = (&src.s, &conv_out);
            let tokens = r1 - r0;
            let heads = |hs: std::ops::Range<usize>| {
                for h in hs {
                    // SAFETY: head h's matrix (`hd²` values at `h·hd²`) lies inside `dst.s`
                    // (`hv·hd²`) and each token's head-h output (`hd` at `t·vd + h·hd`) inside
                    // this item's `tokens × vd` rows of `o`; both stay borrowed mutably for the
                    // whole call and `parallel_for` hands each head to one part only.
                    let (dst_h, mut rows) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(s_out.0.add(h * hd * hd), hd * hd),
                            (0..tokens)
                                .map(|t| {
                                    std::slice::from_raw_parts_mut(o_out.0.add(t * vd + h * hd), hd)
                                })
                                .collect::<Vec<_>>(),
                        )
                    };
                    let src_h = &src_s[h * hd * hd..(h + 1) * hd * hd];
                    delta_net::head(dn, h, conv_out, b, g, src_h, dst_h, &mut rows);
                }
            };
            m.backend.parallel_for(hv, &heads)?;
            r0 = r1;
        }
        Ok(())
    }

    /// `X += W · input` over the step's rows (`input` one row per step row): one row through
    /// the single-activation GEMV a decode step uses, more through the multi-token one.
    fn residual_from(&mut self, w: usize, input: &[f32]) -> Result<(), ModelError> {
        self.timed(
            |t| &mut t.project,
            |s| {
                let mut x = s.take(Act::X);
                let done = match s.rows.len() {
                    1 => s.m.gemv(w, input, &mut x, true),
                    _ => s.m.gemv_tokens(&[w], input, &mut [&mut x[..]], true),
                };
                s.put(Act::X, x);
                done
            },
        )
    }

    /// `down · act(gate · x, up · x)` for each of the `rows` rows of `xs` (an expert over
    /// its tokens, or the shared expert over the step), with the expert's biases where it has
    /// them (`extras`): `rows × d_model` values.
    fn swiglu_rows(
        &mut self,
        (gate, up, down): (usize, usize, usize),
        extras: ExpertExtras<'_>,
        xs: &[f32],
        rows: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let m = self.m;
        let ff = m.weights[gate].m;
        let (mut g, mut u) = (vec![0f32; rows * ff], vec![0f32; rows * ff]);
        self.timed(
            |s| &mut s.project,
            |_| m.project(&[gate, up], xs, &mut [&mut g, &mut u], rows),
        )?;
        extras.activate(&mut g, &mut u, ff);
        let mut y = vec![0f32; rows * m.config.d_model];
        self.timed(
            |s| &mut s.project,
            |_| m.project(&[down], &g, &mut [&mut y], rows),
        )?;
        extras.finish(&mut y);
        Ok(y)
    }

    /// `out[r] += s_r · down(silu(gate · xn_r) ⊙ up · xn_r)` with `s_r` the shared expert's
    /// scalar gate `sigmoid(gate_inp · xn_r)` (1 where the file has none).
    fn shared_expert(
        &mut self,
        sh: &crate::block::SharedExpert<usize, &[f32]>,
        xn: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let (n, d) = (self.rows.len(), self.m.config.d_model);
        let y = self.swiglu_rows((sh.gate, sh.up, sh.down), ExpertExtras::SWIGLU, xn, n)?;
        for ((o, yr), xr) in out
            .chunks_exact_mut(d)
            .zip(y.chunks_exact(d))
            .zip(xn.chunks_exact(d))
        {
            let s = match sh.gate_inp {
                Some(w) => moe::sigmoid(ops::dot(w, xr)),
                None => 1.0,
            };
            o.iter_mut().zip(yr).for_each(|(a, &v)| *a += s * v);
        }
        Ok(())
    }
}

impl CpuStep<'_, '_, '_, '_> {
    /// The routed experts of [`BlockOps::moe`] over `xn` (`n` rows of `d_model`), their
    /// weighted outputs added into `out`, each row's experts in ascending id (the same order
    /// whatever else the step holds, so a token's result does not depend on its batch).
    fn routed_experts(
        &mut self,
        t: &MoeTensors<usize, &[f32]>,
        xn: &[f32],
        routes: &Routes,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let m = self.m;
        let d = m.config.d_model;
        let n = self.rows.len();
        let by_expert = ExpertRows::new(routes, t.gate.len());
        let act = m
            .config
            .moe
            .as_ref()
            .map_or(crate::config::ExpertActivation::Silu, |c| c.activation);
        let extras = |x: usize| ExpertExtras {
            act,
            biases: t.biases.as_ref().map(|b| (b.gate[x], b.up[x], b.down[x])),
        };
        if n == 1 {
            // One token (decode): every chosen expert's gate and up in one dispatch over the
            // same activation, then each down.
            let ff = m.weights[t.gate[0]].m;
            let k = by_expert.groups.len();
            let ids: Vec<usize> = by_expert
                .groups
                .iter()
                .flat_map(|&(x, _, _)| [t.gate[x], t.up[x]])
                .collect();
            let mut h = vec![0f32; 2 * k * ff];
            {
                let mut ys: Vec<&mut [f32]> = h.chunks_exact_mut(ff).collect();
                self.timed(
                    |s| &mut s.project,
                    |_| m.gemv_batch(&ids, xn, &mut ys, false),
                )?;
            }
            let mut y = vec![0f32; d];
            for (j, &(x, a, _)) in by_expert.groups.iter().enumerate() {
                let (g, u) = h[2 * j * ff..(2 * j + 2) * ff].split_at_mut(ff);
                extras(x).activate(g, u, ff);
                self.timed(|s| &mut s.project, |_| m.gemv(t.down[x], g, &mut y, false))?;
                extras(x).finish(&mut y);
                let w = by_expert.weights[a];
                out.iter_mut().zip(&y).for_each(|(o, &v)| *o += w * v);
            }
            return Ok(());
        }
        for &(x, a, b) in &by_expert.groups {
            let rows = &by_expert.rows[a..b];
            let mut xs = vec![0f32; rows.len() * d];
            for (dst, &r) in xs.chunks_exact_mut(d).zip(rows) {
                dst.copy_from_slice(&xn[r * d..(r + 1) * d]);
            }
            let y =
                self.swiglu_rows((t.gate[x], t.up[x], t.down[x]), extras(x), &xs, rows.len())?;
            for ((&r, &w), yr) in rows
                .iter()
                .zip(&by_expert.weights[a..b])
                .zip(y.chunks_exact(d))
            {
                out[r * d..(r + 1) * d]
                    .iter_mut()
                    .zip(yr)
                    .for_each(|(o, &v)| *o += w * v);
            }
        }
        Ok(())
    }
}

/// The error of a DeltaNet layer without its configuration or state (a model built wrongly).
fn no_delta_net(li: usize) -> ModelError {
    ModelError::Unsupported(format!(
        "layer {li} is a DeltaNet layer but the model or session has no recurrent state for it"
    ))
}

/// Bytes of K/V cache one position of a session holds (keys and values in the model's
/// [`crate::attention::CacheType`], every layer): what a serving scheduler counts per sequence
/// against its memory budget.
pub fn kv_bytes_per_position(model: &Model) -> usize {
    let c = &model.config;
    2 * c.n_attention_layers() * model.cache_type.bytes(c.kv_dim())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hipfire_quant::Format;

    use super::*;
    use crate::backend::ReferenceBackend;
    use crate::config::Arch;
    use crate::model::tests::{synth_model, ARCH_FORMATS};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// A seeded prompt of `len` tokens (distinct per `seed`).
    fn prompt(model: &Model, seed: u32, len: usize) -> Vec<u32> {
        let vocab = model.config().vocab as u32;
        (0..len as u32)
            .map(|i| (i * 31 + seed * 97 + 5) % vocab)
            .collect()
    }

    /// Sequences of different prompt lengths join at different steps; each prompt is fed in
    /// chunks of [`CHUNK`] tokens (logits only after the last) beside the others' decode
    /// tokens: every logit vector equals the same sequence run alone with `prefill` + `step`,
    /// bit for bit.
    fn check_batch_matches_alone(model: &Model, what: &str) {
        const SEQS: usize = 5;
        const STEPS: usize = 6;
        const CHUNK: usize = 8;
        let prompts: Vec<Vec<u32>> = (0..SEQS)
            .map(|s| prompt(model, s as u32, 3 + 9 * s))
            .collect();
        // Alone: greedy tokens and the logits after the prompt and after every decode step.
        let mut alone_logits: Vec<Vec<Vec<f32>>> = Vec::new();
        let mut alone_tokens: Vec<Vec<u32>> = Vec::new();
        for p in &prompts {
            let mut s = model.session();
            let mut l = s.prefill(p).expect("prefill").to_vec();
            let (mut ls, mut ts) = (vec![l.clone()], Vec::new());
            for _ in 0..STEPS {
                let t = crate::sampling::argmax(&l);
                l = s.step(t).expect("step").to_vec();
                ts.push(t);
                ls.push(l.clone());
            }
            alone_logits.push(ls);
            alone_tokens.push(ts);
        }
        // Batched: sequence s starts at step s; `fed[s]` prompt tokens are in, `checked[s]`
        // logit vectors compared.
        let mut sessions: Vec<Session<'_>> = (0..SEQS).map(|_| model.session()).collect();
        let (mut fed, mut checked) = (vec![0usize; SEQS], vec![0usize; SEQS]);
        let mut step = 0;
        while checked.iter().any(|&n| n <= STEPS) {
            let feeds: Vec<Option<(Vec<u32>, bool)>> = (0..SEQS)
                .map(|s| {
                    let p = &prompts[s];
                    if step < s || checked[s] > STEPS {
                        None
                    } else if fed[s] < p.len() {
                        let end = (fed[s] + CHUNK).min(p.len());
                        Some((p[fed[s]..end].to_vec(), end == p.len()))
                    } else {
                        Some((vec![alone_tokens[s][checked[s] - 1]], true))
                    }
                })
                .collect();
            let mut items: Vec<BatchItem<'_, '_>> = sessions
                .iter_mut()
                .zip(&feeds)
                .filter_map(|(session, f)| {
                    f.as_ref().map(|(tokens, want_logits)| BatchItem {
                        session,
                        tokens,
                        want_logits: *want_logits,
                    })
                })
                .collect();
            forward_batch(&mut items).expect("batched step");
            drop(items);
            for (s, f) in feeds.iter().enumerate() {
                let Some((tokens, want_logits)) = f else {
                    continue;
                };
                if fed[s] < prompts[s].len() {
                    fed[s] += tokens.len();
                }
                if *want_logits {
                    let want = &alone_logits[s][checked[s]];
                    crate::model::tests::assert_same(
                        sessions[s].logits(),
                        want,
                        crate::model::tests::prefill_tol(model),
                        &format!("{what}: seq {s} output {} at step {step}", checked[s]),
                    );
                    checked[s] += 1;
                }
            }
            step += 1;
        }
        for (s, sess) in sessions.iter().enumerate() {
            assert_eq!(sess.position(), prompts[s].len() + STEPS, "{what}: seq {s}");
        }
    }

    #[test]
    fn batched_steps_are_bit_identical_to_each_sequence_alone() {
        for (arch, fmt) in ARCH_FORMATS {
            let model = synth_model(arch, fmt, None);
            check_batch_matches_alone(&model, &format!("cpu {} {fmt}", arch.name()));
        }
        let model = synth_model(Arch::Llama, Format::Q8_0, Some(Arc::new(ReferenceBackend)));
        check_batch_matches_alone(&model, "reference llama q8_0");
    }

    #[test]
    fn a_refused_batch_changes_nothing() {
        let model = synth_model(Arch::Llama, Format::Q8_0, None);
        let vocab = model.config().vocab as u32;
        let mut a = model.session();
        let mut b = model.session();
        a.prefill(&prompt(&model, 1, 4)).expect("prefill");
        let before = bits(a.logits());
        let ok = [3u32];
        let bad = [1u32, vocab];
        let mut items = [
            BatchItem {
                session: &mut a,
                tokens: &ok,
                want_logits: true,
            },
            BatchItem {
                session: &mut b,
                tokens: &bad,
                want_logits: true,
            },
        ];
        assert!(matches!(
            forward_batch(&mut items),
            Err(ModelError::BadToken { id, .. }) if id == vocab
        ));
        let empty: [u32; 0] = [];
        items[1].tokens = &empty;
        assert!(matches!(
            forward_batch(&mut items),
            Err(ModelError::InvalidOption(_))
        ));
        let long = vec![1u32; model.ctx_len()];
        items[1].tokens = &long;
        items[1].session.step(2).expect("one held position");
        assert!(matches!(
            forward_batch(&mut items),
            Err(ModelError::ContextFull { .. })
        ));
        assert_eq!(a.position(), 4);
        assert_eq!(b.position(), 1);
        assert_eq!(bits(a.logits()), before);
        let per_pos = kv_bytes_per_position(&model);
        let c = model.config();
        assert_eq!(per_pos, 2 * c.n_layer * c.kv_dim() * 2);
    }
}
