//! GPU tier: split-KV decode attention (`attention_split_f16kv` + `attention_combine_f32`)
//! against a straightforward f64 softmax-attention over the same f16 cache, at depth 1, an odd
//! depth and ≥ 4096, for GQA ratios 1, 4, 8 and 16 (two head groups), head_dim 64, 96 (a row
//! that does not fill a power-of-two lane group), 128 and 256, with the planner's chunks and
//! with forced ones (one long chunk: the online softmax across tiles; 1 to 4 positions a chunk:
//! the combine at its widest). The output is poisoned with NaN first and the cache rows past the
//! depth hold f16 NaN, so an unwritten output or a row read past `n_pos` fails the comparison.
//!
//! Each test is `#[ignore]`d, as it needs a GPU: `--include-ignored` on the GPU box runs them.

use std::sync::Arc;

use half::f16;
use hipfire_gpu::DeviceMemory;
use hipfire_gpu::{Module, Stream};
use hipfire_model::gpu_attention::{
    AttnShape, SlotTables, SplitKvAttention, SplitPlan, ATTN_MAX_CHUNKS, SLOT_MAX_CHUNKS,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::decode_module;

/// Largest |gpu − f64| over the outputs. The f64 reference reads the same f16 cache values, so
/// only f32 arithmetic separates them: dot products of ≤ 256 terms, `__expf` (a few ulp), sums
/// of up to 16384 weighted rows in chunk and combine order. Outputs are averages of values in
/// [-1, 1]. The H200 box measured at most 4.0e-7 over the 38 cases below
/// (docs/perf-checkpoints/2026-12-01-decode-attention-h200/run3/tests.log); 1e-5 leaves 25×.
const ABS_BOUND: f64 = 1e-5;
/// Cache rows past the depth, filled with f16 NaN: reading any of them poisons the output.
const POISON_ROWS: usize = 3;
/// f16 quiet NaN.
const F16_NAN: u16 = 0x7e00;

/// softmax(q·Kᵀ/√d)·V per query head, in f64 over the f16 values.
fn reference(q: &[f32], k: &[u16], v: &[u16], s: AttnShape, n_pos: usize) -> Vec<f64> {
    reference_from(q, k, v, s, 0, n_pos)
}

/// [`reference`] over positions `first .. n_pos` only (a sliding window).
fn reference_from(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    s: AttnShape,
    first: usize,
    n_pos: usize,
) -> Vec<f64> {
    let (d, kvd, group) = (s.head_dim, s.n_kv_head * s.head_dim, s.group());
    let h2f = |b: u16| f64::from(f16::from_bits(b).to_f32());
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f64; s.n_head * d];
    for h in 0..s.n_head {
        let kvh = h / group;
        let qh = &q[h * d..(h + 1) * d];
        let scores: Vec<f64> = (first..n_pos)
            .map(|p| {
                let kr = &k[p * kvd + kvh * d..p * kvd + (kvh + 1) * d];
                qh.iter()
                    .zip(kr)
                    .map(|(&a, &b)| f64::from(a) * h2f(b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = w.iter().sum();
        for (p, wp) in (first..n_pos).zip(&w) {
            let vr = &v[p * kvd + kvh * d..p * kvd + (kvh + 1) * d];
            for (o, &b) in out[h * d..(h + 1) * d].iter_mut().zip(vr) {
                *o += wp / l * h2f(b);
            }
        }
    }
    out
}

struct Case {
    shape: AttnShape,
    n_pos: usize,
    /// `None`: the planner's plan; `Some((n, h))`: about `n` chunks of `h` heads a block.
    forced: Option<(usize, usize)>,
}

/// Runs one case; returns (max |gpu − ref|, max |ref|, the plan used).
fn run(
    module: &Arc<Module>,
    stream: &Stream,
    c: &Case,
    seed: u64,
) -> Result<(f64, f64, SplitPlan), String> {
    let s = c.shape;
    let ctx = module.context();
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let (qd, kvd) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim);
    // Per-head amplitudes 1..7 so some heads' softmax is nearly flat and some peaked.
    let q: Vec<f32> = (0..qd)
        .map(|i| {
            let amp = 1.0 + 3.0 * ((i / s.head_dim) % 3) as f32;
            r.random_range(-amp..amp)
        })
        .collect();
    let rows = c.n_pos + POISON_ROWS;
    let mut kv = || -> Vec<u16> {
        (0..rows * kvd)
            .map(|i| {
                if i >= c.n_pos * kvd {
                    F16_NAN
                } else {
                    f16::from_f32(r.random_range(-1.0f32..1.0)).to_bits()
                }
            })
            .collect()
    };
    let (k, v) = (kv(), kv());
    let attn = SplitKvAttention::new(module, s, ATTN_MAX_CHUNKS).map_err(|e| e.to_string())?;
    let plan = match c.forced {
        None => attn.plan(c.n_pos),
        Some((n, h)) => SplitPlan::with_chunks(&s, c.n_pos, n).with_heads_per_block(&s, h),
    };
    let up = |x: &[u16]| {
        let mut b = ctx.alloc::<u16>(x.len()).expect("alloc");
        b.upload(stream, x).expect("upload");
        b
    };
    let (kb, vb) = (up(&k), up(&v));
    let mut qb = ctx.alloc::<f32>(qd).expect("alloc");
    qb.upload(stream, &q).expect("upload");
    let mut ob = ctx.alloc::<f32>(qd).expect("alloc");
    ob.upload(stream, &vec![f32::NAN; qd]).expect("poison");
    attn.launch_with(stream, &qb, &kb, &vb, &mut ob, c.n_pos, plan)
        .map_err(|e| e.to_string())?;
    let mut got = vec![0f32; qd];
    ob.download(stream, &mut got).expect("download");
    stream.synchronize().expect("sync");
    let want = reference(&q, &k, &v, s, c.n_pos);
    let mut err = 0f64;
    for (g, w) in got.iter().zip(&want) {
        let d = (f64::from(*g) - w).abs();
        err = if d.is_nan() {
            f64::INFINITY
        } else {
            err.max(d)
        };
    }
    let scale = want.iter().fold(0f64, |a, w| a.max(w.abs()));
    Ok((err, scale, plan))
}

fn shape(n_head: usize, n_kv_head: usize, head_dim: usize) -> AttnShape {
    AttnShape {
        n_head,
        n_kv_head,
        head_dim,
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn split_kv_attention_matches_f64_reference() {
    let (_ctx, module, stream) = decode_module();
    let mut cases = Vec::new();
    let mut at = |s: AttnShape, depths: &[usize]| {
        for &n_pos in depths {
            cases.push(Case {
                shape: s,
                n_pos,
                forced: None,
            });
        }
    };
    at(shape(4, 4, 64), &[1, 777, 4096]); // GQA 1 (MHA), head_dim 64
    at(shape(32, 8, 128), &[1, 2, 63, 64, 777, 4096, 16384]); // Llama-3-8B: GQA 4
    at(shape(16, 2, 128), &[1, 777, 4097]); // GQA 8
    at(shape(8, 1, 64), &[777, 4096]); // GQA 8, head_dim 64
    at(shape(16, 1, 64), &[1, 777]); // GQA 16: two head groups per kv head
    at(shape(4, 2, 96), &[1, 777]); // 12 of 16 lanes a row
    at(shape(8, 2, 256), &[777]); // a row is a whole warp
                                  // Forced plans at an odd depth: chunk counts × heads a block (each split instance).
    for chunks in [1, 7, 200, ATTN_MAX_CHUNKS] {
        for heads in [1, 2, 3, 4] {
            cases.push(Case {
                shape: shape(32, 8, 128),
                n_pos: 777,
                forced: Some((chunks, heads)),
            });
        }
    }
    for heads in [5, 8] {
        cases.push(Case {
            shape: shape(16, 1, 64),
            n_pos: 777,
            forced: Some((7, heads)),
        });
    }
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let s = c.shape;
        match run(&module, &stream, c, 0xa77e + i as u64) {
            Ok((err, scale, plan)) => {
                eprintln!(
                    "heads {}/{} dim {} depth {} ({} chunks of {}, {} heads a block): max |gpu - f64| = {err:.2e} (max |out| {scale:.3})",
                    s.n_head, s.n_kv_head, s.head_dim, c.n_pos, plan.n_chunks, plan.chunk_len, plan.heads_per_block
                );
                // An output this small would let a wrong kernel pass under the bound.
                assert!(scale > 1000.0 * ABS_BOUND, "reference output too small");
                if err > ABS_BOUND {
                    failures.push(format!("{s:?} depth {}: {err:.3e}", c.n_pos));
                }
            }
            Err(e) => failures.push(format!("{s:?} depth {}: {e}", c.n_pos)),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn split_kv_attention_refuses_short_buffers_and_bad_plans() {
    let (ctx, module, stream) = decode_module();
    let s = shape(32, 8, 128);
    let attn = SplitKvAttention::new(&module, s, 1).expect("attention");
    let q = ctx.alloc::<f32>(32 * 128).expect("alloc");
    let mut out = ctx.alloc::<f32>(32 * 128).expect("alloc");
    let cache = ctx.alloc::<u16>(1000 * 8 * 128).expect("alloc");
    // 1001 rows asked of a 1000-row cache.
    assert!(attn
        .launch(&stream, &q, &cache, &cache, &mut out, 1001)
        .is_err());
    assert!(attn
        .launch(&stream, &q, &cache, &cache, &mut out, 0)
        .is_err());
    // A plan that leaves positions uncovered, and one with more chunks than the scratch holds
    // (250 of 4 positions; the scratch was sized for the planner's at most 66 on an H200).
    let short = SplitPlan {
        chunk_len: 10,
        n_chunks: 2,
        heads_per_block: 4,
    };
    assert!(attn
        .launch_with(&stream, &q, &cache, &cache, &mut out, 100, short)
        .is_err());
    let wide = SplitPlan::with_chunks(&s, 1000, ATTN_MAX_CHUNKS);
    assert!(attn
        .launch_with(&stream, &q, &cache, &cache, &mut out, 1000, wide)
        .is_err());
    // More heads a block than the group has.
    let fat = SplitPlan {
        heads_per_block: 5,
        ..SplitPlan::with_chunks(&s, 1000, 1)
    };
    assert!(attn
        .launch_with(&stream, &q, &cache, &cache, &mut out, 1000, fat)
        .is_err());
    stream.synchronize().expect("sync");
}

/// The slots form (one launch over several query rows, each over its own caches, depth and
/// window, with one plan for all): every row against the f64 reference over its own positions,
/// with the planner's plan for the rows and with forced ones that leave most of a shallow row's
/// chunks empty; outputs poisoned, cache rows past each depth NaN.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn slots_attention_matches_f64_reference_per_row() {
    let (_ctx, module, stream) = decode_module();
    let ctx = module.context().clone();
    // (first, n_pos) per row: depth 1, odd depths, one past a 512-position window.
    let rows: [(usize, usize); 5] = [(0, 1), (0, 37), (0, 777), (2488, 3000), (0, 2)];
    let mut failures = Vec::new();
    for (si, s) in [shape(32, 8, 128), shape(16, 1, 64), shape(4, 2, 96)]
        .into_iter()
        .enumerate()
    {
        let mut r = ChaCha8Rng::seed_from_u64(0x5107 + si as u64);
        let attn = SplitKvAttention::new(&module, s, 1).expect("attention");
        let (qd, kvd) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim);
        let max_pos = rows.iter().map(|r| r.1).max().unwrap_or(1);
        // One capacity for every row's caches, as the decoder's slots have.
        let cap = max_pos + POISON_ROWS;
        let mut caches = Vec::new();
        let mut host_kv = Vec::new();
        for &(_, n_pos) in &rows {
            let mut kv = || -> Vec<u16> {
                (0..cap * kvd)
                    .map(|i| {
                        if i >= n_pos * kvd {
                            F16_NAN
                        } else {
                            f16::from_f32(r.random_range(-1.0f32..1.0)).to_bits()
                        }
                    })
                    .collect()
            };
            let (k, v) = (kv(), kv());
            let mut kb = ctx.alloc::<u16>(k.len()).expect("alloc");
            kb.upload(&stream, &k).expect("upload");
            let mut vb = ctx.alloc::<u16>(v.len()).expect("alloc");
            vb.upload(&stream, &v).expect("upload");
            caches.push((kb, vb));
            host_kv.push((k, v));
        }
        let q: Vec<f32> = (0..rows.len() * qd)
            .map(|i| {
                let amp = 1.0 + 3.0 * ((i / s.head_dim) % 3) as f32;
                r.random_range(-amp..amp)
            })
            .collect();
        let mut qb = ctx.alloc::<f32>(q.len()).expect("alloc");
        qb.upload(&stream, &q).expect("upload");
        let table_u64 = |v: Vec<u64>| {
            let mut b = ctx.alloc::<u64>(v.len()).expect("alloc");
            b.upload(&stream, &v).expect("upload");
            b
        };
        let table_i32 = |v: Vec<i32>| {
            let mut b = ctx.alloc::<i32>(v.len()).expect("alloc");
            b.upload(&stream, &v).expect("upload");
            b
        };
        let kcs = table_u64(caches.iter().map(|c| c.0.device_ptr()).collect());
        let vcs = table_u64(caches.iter().map(|c| c.1.device_ptr()).collect());
        let npos = table_i32(rows.iter().map(|r| r.1 as i32).collect());
        let firsts = table_i32(rows.iter().map(|r| r.0 as i32).collect());
        let tables = SlotTables {
            kcs: kcs.device_ptr(),
            vcs: vcs.device_ptr(),
            npos: npos.device_ptr(),
            firsts: firsts.device_ptr(),
            capacity: cap,
        };
        let part = ctx
            .alloc::<f32>(rows.len() * s.n_head * SLOT_MAX_CHUNKS * (s.head_dim + 2))
            .expect("alloc");
        let planned = attn.plan_slots(max_pos, rows.len());
        let forced = [
            SplitPlan::with_chunks(&s, max_pos, SLOT_MAX_CHUNKS),
            SplitPlan::with_chunks(&s, max_pos, 1),
            SplitPlan::with_chunks(&s, max_pos, 9).with_heads_per_block(&s, 1),
        ];
        for plan in std::iter::once(planned).chain(forced) {
            let mut ob = ctx.alloc::<f32>(q.len()).expect("alloc");
            ob.upload(&stream, &vec![f32::NAN; q.len()])
                .expect("poison");
            // SAFETY: q and out hold rows × n_head × head_dim f32; the tables hold one entry per
            // row, uploaded above on this stream; each cache holds cap ≥ n_pos rows (the rest poison);
            // firsts < npos; every plan covers max_pos positions.
            unsafe {
                attn.launch_slots(
                    &stream,
                    (qb.device_ptr(), ob.device_ptr()),
                    &tables,
                    &part,
                    rows.len(),
                    plan,
                )
            }
            .expect("slots launch");
            let mut got = vec![0f32; q.len()];
            ob.download(&stream, &mut got).expect("download");
            stream.synchronize().expect("sync");
            for (y, &(first, n_pos)) in rows.iter().enumerate() {
                let (k, v) = &host_kv[y];
                let want = reference_from(&q[y * qd..(y + 1) * qd], k, v, s, first, n_pos);
                let err = got[y * qd..(y + 1) * qd]
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (f64::from(*g) - w).abs())
                    .fold(
                        0f64,
                        |a, d| if d.is_nan() { f64::INFINITY } else { a.max(d) },
                    );
                eprintln!(
                    "slots {s:?} row {y} ({first}..{n_pos}), {} chunks of {}, {} heads: {err:.2e}",
                    plan.n_chunks, plan.chunk_len, plan.heads_per_block
                );
                if err > ABS_BOUND {
                    failures.push(format!("{s:?} row {y} {plan:?}: {err:.3e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
