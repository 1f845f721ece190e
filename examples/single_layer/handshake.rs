//! `--handshake N`: each join's own per-step cost, on a matrix too small for the arms to hide it.

use std::sync::Arc;
use std::time::Instant;

use crate::variants::Tuning;
use anyhow::Result;
use hipfire::exec::offload::{JoinStrategy, OffloadExecutor, OffloadMode, SpilledStep};
use hipfire::exec::share::ShareSetting;
use hipfire::gpu::{Activation, Context, GemvForm, GemvKernels, Stream, WeightRef};
use hipfire::quant::Format;
use rand::{Rng, SeedableRng};

use crate::variants::flags_label;
use crate::{make_matrix, D, PINNED_WARM_REPS};

/// Rows of the `--handshake` matrix: at share 0.5 about 17 per worker of 15 and a 1.1 MB GPU
/// arm (measured 27–28 µs for the longer arm on the H200), so most of a step's wall beyond
/// that is its join's own cost.
const HANDSHAKE_M: usize = 512;

/// `--handshake N`: N back-to-back steps of a small Q8_0 matrix (512 × 4096) per mode, queued
/// as the decoder queues them; prints µs per step, the arms' share of it, and under `flags`
/// where the rest goes (the join's per-step cost, apart from any real work).
pub(crate) fn handshake(
    ctx: &Arc<Context>,
    stream: &Stream,
    kernels: &GemvKernels,
    pool: &hipfire::exec::CpuPool,
    steps: usize,
    variants: &[(String, Tuning)],
) -> Result<()> {
    let (host, _dev) = make_matrix(ctx, stream, Format::Q8_0, HANDSHAKE_M, D, 99)?;
    let mut x = ctx.alloc::<f32>(D)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(98);
    x.upload(
        stream,
        &(0..D)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect::<Vec<_>>(),
    )?;
    let mut act = Activation::new(ctx, D)?;
    kernels.prepare(stream, &x, &mut act)?;
    let mut y = ctx.alloc::<f32>(HANDSHAKE_M)?;
    let w = WeightRef::new(host.as_ref(), 0, Format::Q8_0, HANDSHAKE_M, D)?;
    let mut modes = vec![(OffloadMode::Cpu, "cpu".to_string(), Tuning::default())];
    for st in JoinStrategy::ALL {
        let mode = OffloadMode::Passback {
            share: ShareSetting::Pinned(0.5),
            strategy: st,
        };
        if st == JoinStrategy::Flags {
            for (v, t) in variants {
                modes.push((mode.clone(), format!("passback {}", flags_label(v)), *t));
            }
        } else {
            modes.push((mode, format!("passback {}", st.name()), Tuning::default()));
        }
    }
    println!("handshake: {steps} steps of {HANDSHAKE_M} x {D} q8_0 per mode, share 0.5");
    for (mode, name, tuning) in modes {
        let mut ex = OffloadExecutor::new(ctx, pool.clone(), mode, D, HANDSHAKE_M)?;
        ex.set_timeline(true);
        tuning.apply(&mut ex);
        let mut run = |n: usize, ex: &mut OffloadExecutor| -> Result<f64> {
            let t = Instant::now();
            for _ in 0..n {
                let step = SpilledStep {
                    weight: &w,
                    host: host.clone(),
                    x: &x,
                    y: &mut y,
                    form: GemvForm::Plain,
                };
                ex.run(stream, kernels, &act, step)?;
            }
            stream.synchronize()?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        };
        run(PINNED_WARM_REPS * 5, &mut ex)?;
        ex.take_arm_account()?;
        let wall_us = run(steps, &mut ex)?;
        let a = ex.take_arm_account()?;
        let per = |ns: f64| ns / 1e3 / steps as f64;
        println!(
            "  {name:<20} {:>7.1} us/step  arms {:>5.1} us/step",
            wall_us / steps as f64,
            per(a.arm_ns)
        );
        if a.turnarounds > 0 {
            println!(
                "  {:<20} publish {:.1}, fold {:.1} (waiting {:.1}), device gap {:.1}, cpu done -> next x seen {:.1}, prepare {:.1} us/step",
                "",
                per(a.publish_ns),
                per(a.fold_ns),
                per(a.fold_wait_ns),
                a.device_gap_ns / 1e3 / a.turnarounds as f64,
                a.turnaround_ns / 1e3 / a.turnarounds as f64,
                per(a.prepare_ns)
            );
        }
    }
    Ok(())
}
