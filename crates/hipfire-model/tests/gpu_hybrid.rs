//! The hybrid models' layers (Qwen3.5's Gated DeltaNet and gated attention) on the GPU engine.
//!
//! GPU tier (`#[ignore]`d, as they need a GPU: `--include-ignored` on the GPU box runs them):
//! - each kernel of `kernels/delta_net.cu` against an f64 reference of `delta_net.rs`'s
//!   arithmetic on seeded random data (odd token counts, several heads, both key-head sharings,
//!   a run of one sequence and a batched step's rows with their states from a table), outputs
//!   poisoned with NaN first so an unwritten entry fails;
//! - decode of synthetic Qwen3.5 models against the CPU engine in every offload mode (logits
//!   within the formats' bound, greedy tokens equal away from near-ties), a prompt prefilled in
//!   one step and in micro-batches against token by token, several slots in one batched step
//!   against each alone, captured-graph replay against the same step launched kernel by kernel,
//!   and a snapshot restored and continued against never stopping (bit for bit).
//!
//! CPU tier (no GPU): what the GPU decoder still refuses of the hybrid family, by name.

use std::sync::Arc;

use hipfire_exec::flags::FlagsTuning;
use hipfire_exec::offload::{JoinStrategy, OffloadMode};
use hipfire_exec::share::ShareSetting;
use hipfire_gpu::{DeviceBuffer, DeviceMemory, KernelRegistry, LaunchArgs, Module, Stream};
use hipfire_model::gpu::{GpuDecoder, GpuOptions, DEFAULT_UBATCH, DELTA_NET_SOURCE};
use hipfire_model::sampling::argmax;
use hipfire_model::synth::SynthSpec;
use hipfire_model::{Arch, Model, ModelError};
use hipfire_quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[path = "common/gpu_harness.rs"]
mod gpu_harness;
use gpu_harness::{rel, require_gpu, tokens};

/// Largest |gpu − f64| relative to max(|f64|, 1) of the kernels: f32 arithmetic (`expf`,
/// `log1pf`, `rsqrtf` within a few ulp) over dot products of up to 128 terms in warp order, the
/// state carried over 7 tokens; the values stay of magnitude ≤ ~10.
const KERNEL_BOUND: f64 = 1e-4;

/// GPU against CPU on a hybrid model: the dense models' bound ([`gpu_harness::rel_bound`]) for
/// float weights, twice it for quantised ones. A DeltaNet layer's state is a decayed running
/// sum over every token, so the engines' rounding of the quantised activations (8-bit blocks
/// on the CPU, f16 rows in the GPU's prefill GEMM) accumulates along the sequence instead of
/// staying per position. Measured on the H200 box (2026-12-05): f32 1.4e-5 token by token and
/// 2.0e-3 through the f16 GEMM, so the kernels' arithmetic is held to the dense bound there;
/// q8_0 prefill 3.0e-2 to 6.1e-2 (dense bound 4e-2), q4_k decode 8.0e-2 (dense bound 8e-2),
/// greedy tokens equal throughout.
fn rel_bound(fmt: Format) -> f64 {
    match fmt {
        Format::F32 | Format::F16 | Format::BF16 => gpu_harness::rel_bound(fmt),
        _ => 2.0 * gpu_harness::rel_bound(fmt),
    }
}
/// Threads of the element-wise launches (`DN_THREADS`) and of the rule / gated norm's blocks
/// (`DN_RULE_WARPS` warps of 32).
const THREADS: u32 = 256;
const RULE_WARPS: u32 = 4;
const RULE_THREADS: u32 = RULE_WARPS * 32;
/// Conv taps of the kernel cases (Qwen3.5's).
const TAPS: usize = 4;
/// The L2 norm's floor (the decoder passes `rms_eps`).
const EPS: f32 = 1e-6;

// --- f64 reference of delta_net.rs ------------------------------------------------------------

/// One DeltaNet shape of the kernel cases.
#[derive(Debug, Clone, Copy)]
struct Shape {
    n_k: usize,
    n_v: usize,
    hd: usize,
    grouped: bool,
}

impl Shape {
    fn kd(&self) -> usize {
        self.n_k * self.hd
    }
    fn vd(&self) -> usize {
        self.n_v * self.hd
    }
    fn cd(&self) -> usize {
        2 * self.kd() + self.vd()
    }
    fn key_head(&self, h: usize) -> usize {
        match self.grouped {
            true => h / (self.n_v / self.n_k),
            false => h % self.n_k,
        }
    }
    /// f32 values of one sequence's state: the window, then the matrices.
    fn state_len(&self) -> usize {
        (TAPS - 1) * self.cd() + self.n_v * self.hd * self.hd
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The conv + SiLU of `t` rows of one sequence after its window; returns the outputs and the
/// new window.
fn conv_ref(cd: usize, taps: &[f32], window: &[f32], x: &[f32]) -> (Vec<f64>, Vec<f32>) {
    let w = TAPS - 1;
    let t = x.len() / cd;
    let row = |r: usize| -> &[f32] {
        match r < w {
            true => &window[r * cd..(r + 1) * cd],
            false => &x[(r - w) * cd..(r - w + 1) * cd],
        }
    };
    let mut out = vec![0f64; t * cd];
    for ti in 0..t {
        for ch in 0..cd {
            let acc: f64 = (0..TAPS)
                .map(|j| f64::from(row(ti + j)[ch]) * f64::from(taps[ch * TAPS + j]))
                .sum();
            out[ti * cd + ch] = silu(acc);
        }
    }
    let new_window = (0..w).flat_map(|r| row(t + r).to_vec()).collect();
    (out, new_window)
}

/// Per-head parameters of the rule.
struct RuleParams<'a> {
    beta: &'a [f32],
    alpha: &'a [f32],
    dt_bias: &'a [f32],
    a: &'a [f32],
}

/// The gated delta rule over `t` rows (`qkv` the conv's output) from state `s` (`n_v` matrices
/// `S[value][key]`, updated); returns `o` (`t × vd`).
fn rule_ref(sh: Shape, qkv: &[f64], p: &RuleParams<'_>, s: &mut [f64]) -> Vec<f64> {
    let (hd, kd, cd, vd) = (sh.hd, sh.kd(), sh.cd(), sh.vd());
    let t = qkv.len() / cd;
    let mut o = vec![0f64; t * vd];
    let norm = |v: &[f64]| -> Vec<f64> {
        let n = v
            .iter()
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt()
            .max(f64::from(EPS));
        v.iter().map(|x| x / n).collect()
    };
    for ti in 0..t {
        let row = &qkv[ti * cd..(ti + 1) * cd];
        for h in 0..sh.n_v {
            let kh = sh.key_head(h);
            let q: Vec<f64> = norm(&row[kh * hd..(kh + 1) * hd])
                .into_iter()
                .map(|x| x / (hd as f64).sqrt())
                .collect();
            let k = norm(&row[kd + kh * hd..kd + (kh + 1) * hd]);
            let v = &row[2 * kd + h * hd..2 * kd + (h + 1) * hd];
            let b = sigmoid(f64::from(p.beta[ti * sh.n_v + h]));
            let g = softplus(f64::from(p.alpha[ti * sh.n_v + h]) + f64::from(p.dt_bias[h]))
                * f64::from(p.a[h]);
            let decay = g.exp();
            for (r, &vr) in v.iter().enumerate() {
                let srow = &mut s[(h * hd + r) * hd..(h * hd + r + 1) * hd];
                srow.iter_mut().for_each(|x| *x *= decay);
                let sk: f64 = srow.iter().zip(&k).map(|(a, b)| a * b).sum();
                let d = b * (vr - sk);
                srow.iter_mut().zip(&k).for_each(|(x, kj)| *x += kj * d);
                o[ti * vd + h * hd + r] = srow.iter().zip(&q).map(|(a, b)| a * b).sum();
            }
        }
    }
    o
}

// --- kernel harness ---------------------------------------------------------------------------

struct Dev {
    module: Arc<Module>,
    stream: Stream,
    ctx: Arc<hipfire_gpu::Context>,
}

impl Dev {
    fn new() -> Dev {
        let ctx = require_gpu();
        let module = KernelRegistry::new(&ctx)
            .module(&DELTA_NET_SOURCE, &[])
            .expect("delta_net.cu");
        let stream = ctx.new_stream().expect("stream");
        Dev {
            module,
            stream,
            ctx,
        }
    }
    fn up(&self, x: &[f32]) -> DeviceBuffer<f32> {
        let mut b = self.ctx.alloc::<f32>(x.len().max(1)).expect("alloc");
        b.upload(&self.stream, x).expect("upload");
        b
    }
    fn nan(&self, n: usize) -> DeviceBuffer<f32> {
        self.up(&vec![f32::NAN; n])
    }
    fn down(&self, b: &DeviceBuffer<f32>, n: usize) -> Vec<f32> {
        let mut v = vec![0f32; n];
        b.download(&self.stream, &mut v).expect("download");
        self.stream.synchronize().expect("sync");
        v
    }
    fn launch(&self, name: &str, grid: u32, block: u32, args: LaunchArgs) {
        gpu_harness::launch_kernel(&self.module, &self.stream, name, (grid, block), args);
    }
}

fn rand_vec(r: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// One kernel case: `n_seq` sequences of `t` tokens each (a run: 1 sequence, its state by
/// address; a batched step: several of 1 token, their states from a table).
fn conv_rule_norm_case(dev: &Dev, sh: Shape, n_seq: usize, t: usize, seed: u64) -> Vec<String> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let (cd, vd, hd, n_v) = (sh.cd(), sh.vd(), sh.hd, sh.n_v);
    let rows = n_seq * t;
    let what = format!("{sh:?} {n_seq}×{t}");
    let mut fails = Vec::new();
    let mut check = |name: &str, e: f64| {
        if e >= KERNEL_BOUND {
            fails.push(format!("{what} {name}: {e:e}"));
        }
    };
    let x = rand_vec(&mut r, rows * cd, -2.0, 2.0);
    let taps = rand_vec(&mut r, cd * TAPS, -1.0, 1.0);
    let states: Vec<Vec<f32>> = (0..n_seq)
        .map(|_| rand_vec(&mut r, sh.state_len(), -0.5, 0.5))
        .collect();
    let beta = rand_vec(&mut r, rows * n_v, -3.0, 3.0);
    let alpha = rand_vec(&mut r, rows * n_v, -3.0, 3.0);
    let dt_bias = rand_vec(&mut r, n_v, -1.0, 1.0);
    // `ssm_a` is −exp(A_log): negative.
    let a = rand_vec(&mut r, n_v, -1.5, -0.1);
    let (norm_w, z) = (
        rand_vec(&mut r, hd, -1.5, 1.5),
        rand_vec(&mut r, rows * vd, -3.0, 3.0),
    );

    // The reference, sequence by sequence.
    let window = (TAPS - 1) * cd;
    let mut want_conv = Vec::new();
    let mut want_o = Vec::new();
    let mut want_states = Vec::new();
    for (s, st) in states.iter().enumerate() {
        let xs = &x[s * t * cd..(s + 1) * t * cd];
        let (out, new_window) = conv_ref(cd, &taps, &st[..window], xs);
        let mut smat = widen(&st[window..]);
        let p = RuleParams {
            beta: &beta[s * t * n_v..(s + 1) * t * n_v],
            alpha: &alpha[s * t * n_v..(s + 1) * t * n_v],
            dt_bias: &dt_bias,
            a: &a,
        };
        let o = rule_ref(sh, &out, &p, &mut smat);
        want_conv.extend_from_slice(&out);
        want_o.extend(o);
        let mut full = widen(&new_window);
        full.extend(smat);
        want_states.push(full);
    }
    let mut want_norm = want_o.clone();
    for (head, oh) in want_norm.chunks_exact_mut(hd).enumerate() {
        let zh = &z[head * hd..(head + 1) * hd];
        let ms = oh.iter().map(|v| v * v).sum::<f64>() / hd as f64;
        let inv = 1.0 / (ms + f64::from(EPS)).sqrt();
        for (i, v) in oh.iter_mut().enumerate() {
            *v = *v * inv * f64::from(norm_w[i]) * silu(f64::from(zh[i]));
        }
    }

    // The GPU: states by address (one sequence) or through a table.
    let qkv = dev.up(&x);
    let taps_b = dev.up(&taps);
    let state_bufs: Vec<DeviceBuffer<f32>> = states.iter().map(|s| dev.up(s)).collect();
    let addrs: Vec<u64> = state_bufs.iter().map(|b| b.device_ptr()).collect();
    let mut table = dev.ctx.alloc::<u64>(n_seq).expect("alloc");
    table.upload(&dev.stream, &addrs).expect("upload");
    let (state0, states_ptr) = match n_seq {
        1 => (addrs[0], 0),
        _ => (0, table.device_ptr()),
    };
    let bps = (cd as u32).div_ceil(THREADS);
    let args = LaunchArgs::new()
        .buf(&qkv)
        .buf(&taps_b)
        .u64(state0)
        .ptr(states_ptr)
        .i32(cd as i32)
        .i32(TAPS as i32)
        .i32(t as i32)
        .i32(bps as i32);
    dev.launch("dn_conv_silu_f32", bps * n_seq as u32, THREADS, args);
    check(
        "conv",
        gpu_harness::worst(&dev.down(&qkv, rows * cd), &want_conv),
    );
    for (s, b) in state_bufs.iter().enumerate() {
        let got = dev.down(b, sh.state_len());
        check(
            &format!("conv window of sequence {s}"),
            gpu_harness::worst(&got[..window], &want_states[s][..window]),
        );
    }
    let (beta_b, alpha_b, dt_b, a_b) =
        (dev.up(&beta), dev.up(&alpha), dev.up(&dt_bias), dev.up(&a));
    let o = dev.nan(rows * vd);
    let bps = (n_v * hd) as u32 / RULE_WARPS;
    let args = LaunchArgs::new()
        .buf(&qkv)
        .buf(&beta_b)
        .buf(&alpha_b)
        .buf(&dt_b)
        .buf(&a_b)
        .buf(&o)
        .u64(state0)
        .ptr(states_ptr)
        .i32(sh.n_k as i32)
        .i32(n_v as i32)
        .i32(hd as i32)
        .i32(i32::from(sh.grouped))
        .i32(window as i32)
        .i32(t as i32)
        .f32(EPS)
        .i32(bps as i32);
    dev.launch("dn_rule_f32", bps * n_seq as u32, RULE_THREADS, args);
    check(
        "rule output",
        gpu_harness::worst(&dev.down(&o, rows * vd), &want_o),
    );
    for (s, b) in state_bufs.iter().enumerate() {
        let got = dev.down(b, sh.state_len());
        check(
            &format!("state of sequence {s}"),
            gpu_harness::worst(&got, &want_states[s]),
        );
    }
    let (w_b, z_b) = (dev.up(&norm_w), dev.up(&z));
    let heads = rows * n_v;
    let args = LaunchArgs::new()
        .buf(&o)
        .buf(&w_b)
        .buf(&z_b)
        .i32(hd as i32)
        .i32(heads as i32)
        .f32(EPS);
    dev.launch(
        "dn_gated_norm_f32",
        (heads as u32).div_ceil(RULE_WARPS),
        RULE_THREADS,
        args,
    );
    check(
        "gated norm",
        gpu_harness::worst(&dev.down(&o, rows * vd), &want_norm),
    );
    fails
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn delta_net_kernels_match_f64_on_the_gpu() {
    let dev = Dev::new();
    let mut fails = Vec::new();
    let mut seed = 0xd17a;
    for hd in [64, 128] {
        for grouped in [false, true] {
            let sh = Shape {
                n_k: 2,
                n_v: 6,
                hd,
                grouped,
            };
            // A run of one sequence (7 tokens: odd, past the 3-input window) and a batched
            // step of 3 sequences one token each.
            for (n_seq, t) in [(1, 7), (1, 1), (3, 1)] {
                seed += 1;
                fails.extend(conv_rule_norm_case(&dev, sh, n_seq, t, seed));
            }
        }
    }
    assert!(fails.is_empty(), "over {KERNEL_BOUND:e}: {fails:#?}");
}

/// The fused products' splits and the gated attention's query split and gate: pure moves (the
/// gate one multiply by a sigmoid), so bit for bit against the reference layouts of
/// delta_net.rs `split_qkvz` / `split_ba` and model/batch.rs's gated attention.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn hybrid_split_and_gate_kernels_place_every_value() {
    let dev = Dev::new();
    let mut r = ChaCha8Rng::seed_from_u64(0x5b1);
    let (n_k, n_v, hd, rows) = (2usize, 6usize, 64usize, 3usize);
    let (kd, vd) = (n_k * hd, n_v * hd);
    let cd = 2 * kd + vd;
    let group = vd / n_k;
    let fused = rand_vec(&mut r, rows * (cd + vd), -4.0, 4.0);
    let (mut want_qkv, mut want_z) = (vec![0f32; rows * cd], vec![0f32; rows * vd]);
    for row in 0..rows {
        let f = &fused[row * (cd + vd)..(row + 1) * (cd + vd)];
        for kh in 0..n_k {
            let head = &f[kh * (2 * hd + 2 * group)..(kh + 1) * (2 * hd + 2 * group)];
            let q = &mut want_qkv[row * cd..(row + 1) * cd];
            q[kh * hd..(kh + 1) * hd].copy_from_slice(&head[..hd]);
            q[kd + kh * hd..kd + (kh + 1) * hd].copy_from_slice(&head[hd..2 * hd]);
            let v0 = 2 * kd + kh * group;
            q[v0..v0 + group].copy_from_slice(&head[2 * hd..2 * hd + group]);
            want_z[row * vd + kh * group..row * vd + (kh + 1) * group]
                .copy_from_slice(&head[2 * hd + group..]);
        }
    }
    let (fb, qkv, z) = (dev.up(&fused), dev.nan(rows * cd), dev.nan(rows * vd));
    let n = rows * (cd + vd);
    let args = LaunchArgs::new()
        .buf(&fb)
        .buf(&qkv)
        .buf(&z)
        .i32(n_k as i32)
        .i32(hd as i32)
        .i32(group as i32)
        .i32(n as i32);
    dev.launch(
        "dn_split_qkvz_f32",
        (n as u32).div_ceil(THREADS),
        THREADS,
        args,
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&dev.down(&qkv, rows * cd)),
        bits(&want_qkv),
        "split_qkvz: qkv"
    );
    assert_eq!(
        bits(&dev.down(&z, rows * vd)),
        bits(&want_z),
        "split_qkvz: z"
    );

    let vgroup = n_v / n_k;
    let ba = rand_vec(&mut r, rows * 2 * n_v, -4.0, 4.0);
    let (mut want_b, mut want_a) = (vec![0f32; rows * n_v], vec![0f32; rows * n_v]);
    for row in 0..rows {
        for kh in 0..n_k {
            for j in 0..vgroup {
                let at = row * 2 * n_v + kh * 2 * vgroup;
                want_b[row * n_v + kh * vgroup + j] = ba[at + j];
                want_a[row * n_v + kh * vgroup + j] = ba[at + vgroup + j];
            }
        }
    }
    let (bab, bb, ab) = (dev.up(&ba), dev.nan(rows * n_v), dev.nan(rows * n_v));
    let n = rows * 2 * n_v;
    let args = LaunchArgs::new()
        .buf(&bab)
        .buf(&bb)
        .buf(&ab)
        .i32(n_v as i32)
        .i32(vgroup as i32)
        .i32(n as i32);
    dev.launch(
        "dn_split_ba_f32",
        (n as u32).div_ceil(THREADS),
        THREADS,
        args,
    );
    assert_eq!(
        bits(&dev.down(&bb, rows * n_v)),
        bits(&want_b),
        "split_ba: beta"
    );
    assert_eq!(
        bits(&dev.down(&ab, rows * n_v)),
        bits(&want_a),
        "split_ba: alpha"
    );

    // Gated attention: 5 heads of 48 (an odd head count, a width no power of two).
    let (heads, ahd) = (5usize, 48usize);
    let qd = heads * ahd;
    let qg = rand_vec(&mut r, rows * 2 * qd, -6.0, 6.0);
    let att = rand_vec(&mut r, rows * qd, -2.0, 2.0);
    let mut want_q = vec![0f32; rows * qd];
    let mut want_att = vec![0f64; rows * qd];
    for row in 0..rows {
        for h in 0..heads {
            for j in 0..ahd {
                let i = row * qd + h * ahd + j;
                let at = row * 2 * qd + h * 2 * ahd;
                want_q[i] = qg[at + j];
                want_att[i] = f64::from(att[i]) * sigmoid(f64::from(qg[at + ahd + j]));
            }
        }
    }
    let (qgb, qb, attb) = (dev.up(&qg), dev.nan(rows * qd), dev.up(&att));
    let n = rows * qd;
    let grid = (n as u32).div_ceil(THREADS);
    let args = LaunchArgs::new()
        .buf(&qgb)
        .buf(&qb)
        .i32(ahd as i32)
        .i32(qd as i32)
        .i32(n as i32);
    dev.launch("ga_split_q_f32", grid, THREADS, args);
    assert_eq!(bits(&dev.down(&qb, n)), bits(&want_q), "ga_split_q");
    let args = LaunchArgs::new()
        .buf(&attb)
        .buf(&qgb)
        .i32(ahd as i32)
        .i32(qd as i32)
        .i32(n as i32);
    dev.launch("ga_gate_f32", grid, THREADS, args);
    let e = gpu_harness::worst(&dev.down(&attb, n), &want_att);
    assert!(e < KERNEL_BOUND, "ga_gate: {e:e}");
}

// --- the decoder against the CPU engine ---------------------------------------------------------

fn modes() -> Vec<(&'static str, Option<usize>, OffloadMode)> {
    let pb = |share, strategy| OffloadMode::Passback { share, strategy };
    vec![
        ("resident", None, OffloadMode::Pcie),
        ("pcie", Some(1), OffloadMode::Pcie),
        ("cpu", Some(1), OffloadMode::Cpu),
        (
            "passback-ordering",
            Some(0),
            pb(ShareSetting::Auto, JoinStrategy::Ordering),
        ),
        (
            "passback-two-stream",
            Some(0),
            pb(ShareSetting::Pinned(0.4), JoinStrategy::TwoStream),
        ),
        (
            "passback-flags",
            Some(0),
            pb(ShareSetting::Auto, JoinStrategy::Flags),
        ),
    ]
}

fn opts(budget: Option<usize>, mode: OffloadMode, ubatch: usize) -> GpuOptions {
    gpu_harness::gpu_options(budget, mode, FlagsTuning::default(), ubatch)
}

fn load(spec: &SynthSpec, fmt: Format) -> (Model, hipfire_exec::CpuPool) {
    // Tests run in parallel and may load the same model: each load writes its own file.
    static LOADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{}-{}-{n}.gguf", spec.name, fmt.name());
    let path = gpu_harness::tmp("gpu-hybrid", &name);
    let loaded = gpu_harness::load_synth(&path, spec, fmt, 7);
    let _ = std::fs::remove_file(&path);
    loaded
}

/// A Qwen3.5-0.8B-shaped model cut to one 3:1 pattern (DeltaNet 16/16 heads of 128, gated
/// attention 8/2 heads of 256 rotating 64) with a small vocabulary, so it loads fast.
fn qwen35_small() -> SynthSpec {
    SynthSpec {
        name: "qwen3.5-0.8b-4-layers".into(),
        n_layer: 4,
        vocab: 4096,
        ctx_len: 512,
        rope_scaling: hipfire_model::RopeScaling::none(512),
        ..SynthSpec::qwen35_0_8b()
    }
}

/// Whether `cpu`'s best logit leads its second by more than `gap` of the largest |logit|:
/// otherwise the engines' rounding may pick either and a different greedy token is no error.
fn clear_top(cpu: &[f32], gap: f64) -> bool {
    let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut top = [f32::NEG_INFINITY; 2];
    for &v in cpu {
        if v > top[0] {
            top = [v, top[0]];
        } else if v > top[1] {
            top[1] = v;
        }
    }
    f64::from(top[0] - top[1]) > gap * f64::from(scale)
}

/// Feeds `n` greedy tokens (the CPU's choice, so both engines see the same sequence) to the CPU
/// session and to a GPU decoder per mode; compares every position's logits and greedy token.
fn decode_case(spec: &SynthSpec, fmt: Format, n: usize, failures: &mut Vec<String>) {
    let (model, pool) = load(spec, fmt);
    let mut cpu = model.session();
    let mut toks = vec![1u32];
    let mut want = Vec::new();
    for i in 0..n {
        let l = cpu.step(toks[i]).expect("cpu step").to_vec();
        toks.push(argmax(&l));
        want.push(l);
    }
    for (name, budget, mode) in modes() {
        let mut dec = GpuDecoder::new(&model, pool.clone(), &opts(budget, mode, DEFAULT_UBATCH))
            .expect("gpu decoder");
        let (mut err, mut token_misses) = (0f64, 0);
        for i in 0..n {
            let got = dec.step(toks[i]).expect("gpu step");
            err = err.max(rel(got, &want[i]));
            if argmax(got) != toks[i + 1] && clear_top(&want[i], 2.0 * rel_bound(fmt)) {
                token_misses += 1;
            }
        }
        eprintln!(
            "{} {} {name}: {n} steps, max |gpu-cpu| / max|logit| = {err:.2e}, greedy misses {token_misses} ({})",
            spec.name,
            fmt.name(),
            dec.placement_summary()
        );
        if err >= rel_bound(fmt) || token_misses > 0 {
            failures.push(format!(
                "{} {} {name}: {err:.3e}, {token_misses} greedy tokens differ",
                spec.name,
                fmt.name()
            ));
        }
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_decodes_hybrid_models_as_the_cpu_in_every_mode() {
    require_gpu();
    let mut failures = Vec::new();
    for fmt in [Format::F32, Format::Q8_0, Format::Q4K] {
        decode_case(&SynthSpec::tiny(Arch::Qwen35), fmt, 24, &mut failures);
    }
    decode_case(&qwen35_small(), Format::Q8_0, 12, &mut failures);
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// A 37-token prompt (odd; with `ubatch` 8 it is 4 micro-batches of a 32-token step and a
/// 5-token run) prefilled on the GPU against the CPU engine and against the same GPU mode fed
/// token by token, then 6 decode steps after it.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_prefill_of_hybrid_models_matches_token_by_token() {
    require_gpu();
    let mut failures = Vec::new();
    for (spec, fmt) in [
        (SynthSpec::tiny(Arch::Qwen35), Format::Q8_0),
        (SynthSpec::tiny(Arch::Qwen35), Format::F32),
        (qwen35_small(), Format::Q8_0),
    ] {
        let (model, pool) = load(&spec, fmt);
        let prompt = tokens(37, 3, spec.vocab);
        let decode = tokens(6, 9, spec.vocab);
        let mut cpu = model.session();
        let mut want = vec![cpu.prefill(&prompt).expect("cpu prefill").to_vec()];
        for &t in &decode {
            want.push(cpu.step(t).expect("cpu step").to_vec());
        }
        let pick = |m: &str| modes().into_iter().find(|x| x.0 == m).expect("mode");
        for (name, budget, mode) in [pick("resident"), pick("passback-flags"), pick("cpu")] {
            for ubatch in [DEFAULT_UBATCH, 8, 1] {
                let o = opts(budget, mode.clone(), ubatch);
                let mut batched = GpuDecoder::new(&model, pool.clone(), &o).expect("decoder");
                let mut got = vec![batched.prefill(&prompt).expect("prefill").to_vec()];
                for &t in &decode {
                    got.push(batched.step(t).expect("step").to_vec());
                }
                let mut one = GpuDecoder::new(&model, pool.clone(), &o).expect("decoder");
                let mut alone = Vec::new();
                for &t in &prompt {
                    alone = one.step(t).expect("step").to_vec();
                }
                let vs_cpu = gpu_harness::max_rel(&got, &want);
                let vs_alone = rel(&got[0], &alone);
                eprintln!(
                    "{} {} {name} ubatch {ubatch}: prefill+decode vs cpu {vs_cpu:.2e}, prefill vs token by token {vs_alone:.2e}; {:?}",
                    spec.name,
                    fmt.name(),
                    batched.step_counts()
                );
                if vs_cpu >= rel_bound(fmt) || vs_alone >= rel_bound(fmt) {
                    failures.push(format!(
                        "{} {} {name} ubatch {ubatch}: vs cpu {vs_cpu:.3e}, vs token by token {vs_alone:.3e}",
                        spec.name,
                        fmt.name()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// Three slots with their own prompts, decoded in batched steps (one step leaves a slot out, one
/// slot is reset and refilled mid-way, so its states restart from zero), against each sequence
/// on the CPU; with graphs on and off, resident and spilled.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn batched_hybrid_slots_match_each_sequence_alone() {
    require_gpu();
    let spec = SynthSpec::tiny(Arch::Qwen35);
    let fmt = Format::Q8_0;
    let (model, pool) = load(&spec, fmt);
    let prompts = [
        tokens(5, 1, spec.vocab),
        tokens(9, 2, spec.vocab),
        tokens(1, 3, spec.vocab),
    ];
    let refill = tokens(4, 4, spec.vocab);
    const STEPS: usize = 8;
    const RESET_AT: usize = 4;
    const SKIP_SLOT1_AT: usize = 2;
    // What each slot sees: its prompt, then per step its token (slot 1 skips one step; slot 2
    // is reset at RESET_AT and refilled with `refill`).
    let step_token = |slot: usize, i: usize| (i * 7 + slot * 13 + 2) as u32 % spec.vocab as u32;
    let mut failures = Vec::new();
    for (name, budget, mode) in [
        ("resident", None, OffloadMode::Pcie),
        (
            "passback-flags",
            Some(1),
            OffloadMode::Passback {
                share: ShareSetting::Auto,
                strategy: JoinStrategy::Flags,
            },
        ),
    ] {
        for graphs in [true, false] {
            let o = opts(budget, mode.clone(), DEFAULT_UBATCH);
            let mut dec = GpuDecoder::with_slots(&model, pool.clone(), &o, 3).expect("decoder");
            let graphs_on = dec.set_graphs(graphs);
            let mut cpu: Vec<_> = (0..3).map(|_| model.session()).collect();
            let mut err = 0f64;
            for (s, p) in prompts.iter().enumerate() {
                dec.select_slot(s).expect("slot");
                let got = dec.prefill(p).expect("prefill").to_vec();
                err = err.max(rel(&got, cpu[s].prefill(p).expect("cpu")));
            }
            for i in 0..STEPS {
                if i == RESET_AT {
                    dec.select_slot(2).expect("slot");
                    dec.reset();
                    let got = dec.prefill(&refill).expect("refill").to_vec();
                    cpu[2] = model.session();
                    err = err.max(rel(&got, cpu[2].prefill(&refill).expect("cpu")));
                }
                let feeds: Vec<(usize, u32)> = (0..3)
                    .filter(|&s| !(s == 1 && i == SKIP_SLOT1_AT))
                    .map(|s| (s, step_token(s, i)))
                    .collect();
                let vocab = spec.vocab;
                let rows = dec.decode_slots(&feeds).expect("batched step").to_vec();
                for (&(s, t), row) in feeds.iter().zip(rows.chunks_exact(vocab)) {
                    err = err.max(rel(row, cpu[s].step(t).expect("cpu step")));
                }
            }
            eprintln!(
                "{} {name} graphs {graphs_on}: 3 slots, max |gpu-cpu| / max|logit| = {err:.2e}",
                spec.name
            );
            if err >= rel_bound(fmt) {
                failures.push(format!("{name} graphs {graphs_on}: {err:.3e}"));
            }
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// Graph replay reads every per-step value (states included) from device memory: a decoder
/// whose graphs are kept, one whose graphs are dropped before each step and one with graphs off
/// run the same batched steps over 3 slots bit for bit.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn hybrid_graph_replay_matches_launching_each_kernel() {
    require_gpu();
    let spec = SynthSpec::tiny(Arch::Qwen35);
    let (model, pool) = load(&spec, Format::Q8_0);
    let o = opts(None, OffloadMode::Pcie, DEFAULT_UBATCH);
    let make = || GpuDecoder::with_slots(&model, pool.clone(), &o, 3).expect("decoder");
    let (mut kept, mut fresh, mut off) = (make(), make(), make());
    assert!(kept.set_graphs(true) && fresh.set_graphs(true), "graphs on");
    assert!(!off.set_graphs(false), "graphs off");
    for dec in [&mut kept, &mut fresh, &mut off] {
        for s in 0..3 {
            dec.select_slot(s).expect("slot");
            dec.prefill(&tokens(3 + 2 * s, s as u32, spec.vocab))
                .expect("prefill");
        }
    }
    for i in 0..40u32 {
        let feeds: Vec<(usize, u32)> = (0..3)
            .filter(|&s| !(s == 0 && i % 5 == 3))
            .map(|s| (s, (i * 11 + s as u32 * 5) % spec.vocab as u32))
            .collect();
        fresh.set_graphs(false);
        fresh.set_graphs(true);
        let a = kept.decode_slots(&feeds).expect("kept").to_vec();
        let b = fresh.decode_slots(&feeds).expect("fresh").to_vec();
        let c = off.decode_slots(&feeds).expect("off").to_vec();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&c), "step {i}: kept graphs vs launched");
        assert_eq!(bits(&b), bits(&c), "step {i}: fresh capture vs launched");
    }
    assert!(kept.graph_captures() > 0, "some step was captured");
}

/// Prefill, snapshot, run on, restore, run the same tokens again: the same logits bit for bit
/// (the recurrent states came back); a snapshot outdated by a reset below it is refused; with
/// graphs on and off.
#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn hybrid_snapshot_restore_continues_bit_identically() {
    require_gpu();
    let spec = SynthSpec::tiny(Arch::Qwen35);
    let (model, pool) = load(&spec, Format::Q8_0);
    let prompt = tokens(11, 5, spec.vocab);
    let more = tokens(6, 6, spec.vocab);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for graphs in [true, false] {
        let o = opts(None, OffloadMode::Pcie, DEFAULT_UBATCH);
        let mut dec = GpuDecoder::new(&model, pool.clone(), &o).expect("decoder");
        dec.set_graphs(graphs);
        let at_prompt = dec.prefill(&prompt).expect("prefill").to_vec();
        let snap = dec.snapshot().expect("snapshot");
        assert_eq!(snap.position(), prompt.len());
        let first: Vec<Vec<u32>> = more
            .iter()
            .map(|&t| bits(dec.step(t).expect("step")))
            .collect();
        dec.restore(&snap).expect("restore");
        assert_eq!(dec.position(), prompt.len());
        assert_eq!(bits(dec.logits()), bits(&at_prompt), "logits restored");
        let again: Vec<Vec<u32>> = more
            .iter()
            .map(|&t| bits(dec.step(t).expect("step")))
            .collect();
        assert_eq!(first, again, "graphs {graphs}: continued after restore");
        // Restored twice: still the same.
        dec.restore(&snap).expect("restore again");
        assert_eq!(bits(dec.step(more[0]).expect("step")), first[0]);
        // A reset below the snapshot outdates it.
        dec.reset();
        dec.prefill(&more).expect("prefill");
        let e = dec.restore(&snap).expect_err("outdated");
        assert!(matches!(e, ModelError::InvalidOption(_)), "{e}");
    }
}

// --- CPU tier -----------------------------------------------------------------------------------

/// qwen35 runs on the GPU now; the hybrid MoE architectures are refused naming their routed
/// FFNs (not the hybrid layers), pointing at `--device cpu`, before any device is touched.
#[test]
fn the_gpu_refuses_hybrid_moe_naming_the_routed_ffns() {
    let dense = SynthSpec::tiny(Arch::Qwen35);
    let (model, _) = load(&dense, Format::Q8_0);
    assert_eq!(hipfire_model::gpu::refusal(model.config()), None);
    for spec in [
        SynthSpec::tiny(Arch::Qwen35Moe),
        SynthSpec::tiny(Arch::Qwen3Next),
    ] {
        let (model, pool) = load(&spec, Format::Q8_0);
        let why = hipfire_model::gpu::refusal(model.config()).expect("refused");
        assert!(
            why.contains("Mixture-of-Experts FFNs") && !why.contains("does not run hybrid"),
            "{}: {why}",
            spec.name
        );
        let o = opts(None, OffloadMode::Pcie, DEFAULT_UBATCH);
        match GpuDecoder::new(&model, pool, &o) {
            Err(ModelError::Unsupported(m)) => assert!(
                m.contains(spec.arch.name())
                    && m.contains("Mixture-of-Experts FFNs")
                    && m.contains("--device cpu"),
                "{}: {m}",
                spec.name
            ),
            Err(e) => panic!("{}: wrong error {e}", spec.name),
            Ok(_) => panic!("{}: the GPU decoder accepted it", spec.name),
        }
    }
}

/// What the GPU budget counts per sequence for a hybrid model: the attention layers' K/V (the
/// DeltaNet layers have none) and every DeltaNet layer's state, whatever the length.
#[test]
fn the_memory_budget_counts_attention_kv_and_recurrent_state() {
    let spec = SynthSpec::tiny(Arch::Qwen35);
    let (model, _) = load(&spec, Format::Q8_0);
    let c = model.config();
    let dn = c.delta_net.as_ref().expect("hybrid");
    assert_eq!(c.n_attention_layers(), 1, "one gated attention layer in 4");
    // f16 K and V of the one attention layer per position.
    let kv = 2 * c.kv_dim() * 2 * model.ctx_len();
    let rec = 3 * dn.state_values() * 4;
    assert_eq!(
        dn.state_values(),
        (dn.conv_kernel - 1) * dn.conv_dim() + dn.n_v_heads * dn.head_dim * dn.head_dim
    );
    assert_eq!(c.recurrent_bytes_per_sequence(), rec);
    assert_eq!(model.kv_cache_bytes(), (kv + rec) as u64);
}
