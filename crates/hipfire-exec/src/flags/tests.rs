//! The flags arm against the pool, with a CPU stand-in for the device: bit-exact rows over
//! steps, timeouts, cancellation, failures that publish every done word, prefetch budgets.

use super::job::*;
use super::mailbox::*;
use super::*;
use crate::error::ExecError;
use crate::pool::CpuPool;
use hipfire_quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn setup(fmt: Format, k: usize, m: usize, seed: u64) -> (Arc<Vec<u8>>, Vec<f32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut w = Vec::new();
    for _ in 0..m {
        let row: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        w.extend(hipfire_quant::quantize_row(fmt, &row).expect("quantise"));
    }
    (
        Arc::new(w),
        (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
    )
}

/// A mailbox in plain host memory for activations of `k` and `rows` CPU rows.
fn host_mailbox(k: usize, rows: usize) -> Mailbox {
    let mem: Arc<dyn MailboxMemory> =
        Arc::new(HostMailboxMemory::new(Mailbox::bytes_needed(k, rows)));
    Mailbox::new(mem, k, rows).expect("mailbox")
}

/// A one-output arm: rows `[g, g + rows)` of `w` into `mailbox`, published as `step`, with the
/// default timeout.
fn one_part_arm(
    fmt: Format,
    k: usize,
    w: Arc<Vec<u8>>,
    g: usize,
    rows: usize,
    mailbox: Mailbox,
    step: u32,
) -> FlagsArm {
    FlagsArm {
        format: fmt,
        k,
        parts: vec![ArmRows { weight: w, g, rows }],
        mailbox,
        step,
        timeout: DEFAULT_FLAGS_TIMEOUT,
        tuning: FlagsTuning::default(),
    }
}

#[test]
fn flags_arm_matches_pool_over_steps() {
    let (fmt, k, m, g) = (Format::Q4_0, 256usize, 200usize, 48usize);
    let (w, _) = setup(fmt, k, m, 1);
    let pool = CpuPool::new(3).expect("pool");
    let mb = host_mailbox(k, m - g);
    for step in 1..=5u32 {
        let x: Vec<f32> = setup(fmt, k, 1, 100 + u64::from(step)).1;
        let arm = one_part_arm(fmt, k, w.clone(), g, m - g, mb.clone(), step);
        // Submitted ahead of the device, as the host would a token ahead.
        let ticket = pool.submit_flags(arm).expect("submit");
        let device = {
            let mb = mb.clone();
            let x = x.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2));
                mb.device_publish(&x, step)?;
                mb.device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)
            })
        };
        let got = device.join().expect("device thread").expect("device");
        let rep = ticket.wait().expect("arm");
        assert!(rep.wait_ns > 0.0);
        // The workers' own records, gathered: every one saw x, then finished.
        assert!(rep.first_seen_ns <= rep.last_seen_ns, "{rep:?}");
        assert!(
            rep.last_seen_ns <= rep.done_ns && rep.done_ns > 0,
            "{rep:?}"
        );
        assert!(
            rep.prepare_ns > 0.0 && rep.prepare_ns <= rep.cpu_ns,
            "{rep:?}"
        );
        let mut want = vec![f32::NAN; m];
        pool.gemv(fmt, &w, k, &x, &mut want, false).expect("pool");
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want[g..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "step {step}"
        );
    }
}

#[test]
fn silent_device_times_out_and_done_is_still_published() {
    let (fmt, k, m) = (Format::Q8_0, 64usize, 40usize);
    let (w, _) = setup(fmt, k, m, 2);
    let pool = CpuPool::new(2).expect("pool");
    let mb = host_mailbox(k, m);
    let arm = FlagsArm {
        timeout: Duration::from_millis(20),
        ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 7)
    };
    let err = pool
        .submit_flags(arm)
        .expect("submit")
        .wait()
        .expect_err("no device");
    assert!(matches!(err, ExecError::Timeout { .. }), "{err}");
    assert_eq!(mb.done().load(Ordering::Acquire), 7 | DONE_FAILED);
    assert_eq!(mb.part_done(0).load(Ordering::Acquire), 7 | DONE_FAILED);
    // The pool is usable afterwards.
    let mut y = vec![0.0; 4];
    pool.gemv(Format::F32, &[0u8; 4 * 4 * 4], 4, &[1.0; 4], &mut y, false)
        .expect("pool after timeout");
}

/// Several arms queued ahead of the device (as the executor queues a layer's steps), each
/// a part of the weight with a mailbox laid out for a longer activation: every step's rows
/// are the pool's, bit for bit.
#[test]
fn arms_queued_ahead_of_the_device_match_the_pool() {
    // Both publishes: the tagged x area keeps the last step's words, which the workers of
    // the next step must not take.
    for tagged_x in [true, false] {
        arms_queued_ahead(tagged_x);
    }
}

fn arms_queued_ahead(tagged_x: bool) {
    let (fmt, k, m, g) = (Format::Q4K, 512usize, 96usize, 32usize);
    let tuning = FlagsTuning {
        tagged_x,
        ..FlagsTuning::default()
    };
    let (w, _) = setup(fmt, k, m, 3);
    let pool = CpuPool::new(3).expect("pool");
    let mb = host_mailbox(3 * k, m);
    let arm = |step| FlagsArm {
        tuning,
        ..one_part_arm(fmt, k, w.clone(), g, m - g, mb.clone(), step)
    };
    let steps = 1..=4u32;
    let xs: Vec<Vec<f32>> = steps
        .clone()
        .map(|s| setup(fmt, k, 1, 300 + u64::from(s)).1)
        .collect();
    let tickets: Vec<FlagsTicket> = steps
        .clone()
        .map(|step| {
            // Each worker queues one job behind the one it runs, so a third submit would
            // block until the device publishes: submit two ahead, then play the device.
            pool.submit_flags(arm(step))
        })
        .take(2)
        .collect::<Result<_, _>>()
        .expect("submit");
    let device = {
        let (mb, xs) = (mb.clone(), xs.clone());
        std::thread::spawn(move || -> Result<Vec<Vec<f32>>, ExecError> {
            let mut out = Vec::new();
            for (i, x) in xs.iter().enumerate() {
                let step = i as u32 + 1;
                if tagged_x {
                    mb.device_publish_tagged(x, step)?;
                } else {
                    mb.device_publish(x, step)?;
                }
                out.push(mb.device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)?);
            }
            Ok(out)
        })
    };
    let mut tickets = tickets;
    for step in 3..=4u32 {
        tickets.push(
            pool.submit_flags(arm(step))
                .expect("submit behind a running arm"),
        );
    }
    let got = device.join().expect("device thread").expect("device");
    for (i, t) in tickets.into_iter().enumerate() {
        assert!(t.is_finished(), "done was published for step {}", i + 1);
        let rep = t.wait().expect("arm");
        assert!(rep.cpu_ns > 0.0);
        let mut want = vec![f32::NAN; m];
        pool.gemv(fmt, &w, k, &xs[i], &mut want, false)
            .expect("pool");
        assert_eq!(
            got[i][..m - g]
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            want[g..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "step {}",
            i + 1
        );
    }
}

/// One arm over the CPU rows of three outputs (q/k/v-like: different heights, different
/// cuts): the mailbox holds each output's rows after the previous one's, each bit-identical
/// to the pool's GEMV of that weight.
#[test]
fn an_arm_over_several_outputs_writes_them_one_after_another() {
    let (fmt, k) = (Format::Q8_0, 256usize);
    let shapes = [(160usize, 48usize), (40, 16), (40, 0)];
    let ws: Vec<Arc<Vec<u8>>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(m, _))| setup(fmt, k, m, 40 + i as u64).0)
        .collect();
    let x = setup(fmt, k, 1, 50).1;
    let total: usize = shapes.iter().map(|&(m, g)| m - g).sum();
    let pool = CpuPool::new(3).expect("pool");
    let mb = host_mailbox(k, total);
    let parts = ws
        .iter()
        .zip(&shapes)
        .map(|(w, &(m, g))| ArmRows {
            weight: w.clone(),
            g,
            rows: m - g,
        })
        .collect();
    let ticket = pool
        .submit_flags(FlagsArm {
            format: fmt,
            k,
            parts,
            mailbox: mb.clone(),
            step: 1,
            timeout: DEFAULT_FLAGS_TIMEOUT,
            tuning: FlagsTuning::default(),
        })
        .expect("submit");
    mb.device_publish(&x, 1).expect("publish");
    let got = mb.device_wait_done(1, DEFAULT_FLAGS_TIMEOUT).expect("done");
    ticket.wait().expect("arm");
    let mut want = Vec::new();
    for (w, &(m, g)) in ws.iter().zip(&shapes) {
        let mut y = vec![f32::NAN; m];
        pool.gemv(fmt, w, k, &x, &mut y, false).expect("pool");
        want.extend_from_slice(&y[g..]);
    }
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// Long activations, ragged ones and many workers: the rows are bit-identical to the
/// pool's, which prepares x once for all workers.
#[test]
fn long_and_ragged_activations_match_the_pool() {
    // The last two: more workers than blocks of x, so that some workers of the shared
    // preparation take no block and only wait.
    // Tagged x where it applies (the shared q8_K preparations); Q4_0/Q8_0 fall back to the
    // sequence word.
    for (fmt, k, m, workers, tagged_x) in [
        (Format::Q4K, 14336usize, 64usize, 5usize, false),
        (Format::Q4K, 14336, 64, 5, true),
        (Format::Q4_0, 4096 + 96, 48, 4, true),
        (Format::Q8_0, 2048, 40, 15, false),
        (Format::Q4K, 512, 40, 6, false),
        (Format::Q6K, 768, 40, 6, true),
    ] {
        let (w, x) = setup(fmt, k, m, k as u64);
        let pool = CpuPool::new(workers).expect("pool");
        let mb = host_mailbox(k, m);
        let ticket = pool
            .submit_flags(FlagsArm {
                tuning: FlagsTuning {
                    tagged_x,
                    ..FlagsTuning::default()
                },
                ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), 3)
            })
            .expect("submit");
        if tagged_x && fmt != Format::Q4_0 {
            mb.device_publish_tagged(&x, 3).expect("publish");
        } else {
            mb.device_publish(&x, 3).expect("publish");
        }
        let got = mb.device_wait_done(3, DEFAULT_FLAGS_TIMEOUT).expect("done");
        ticket.wait().expect("arm");
        let mut want = vec![f32::NAN; m];
        pool.gemv(fmt, &w, k, &x, &mut want, false).expect("pool");
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{fmt} k={k} workers={workers} tagged {tagged_x}"
        );
    }
}

/// A non-finite x fails every worker's preparation (its own, or the shared one's): nothing
/// hangs, and the arm's done word and every worker's are still published, each with the
/// failure bit.
#[test]
fn a_bad_piece_fails_the_step_without_hanging() {
    // Q8_0: each worker prepares x itself; Q4_K: the workers prepare it together.
    for fmt in [Format::Q8_0, Format::Q4K] {
        for (chunks_per_worker, tagged_x) in [(1, false), (4, false), (4, true)] {
            let (k, m) = (2048usize, 400usize);
            let (w, mut x) = setup(fmt, k, m, 8);
            x[1000] = f32::NAN;
            let pool = CpuPool::new(4).expect("pool");
            let mb = host_mailbox(k, m);
            let ticket = pool
                .submit_flags(FlagsArm {
                    timeout: Duration::from_secs(30),
                    tuning: FlagsTuning {
                        chunks_per_worker,
                        tagged_x,
                        ..FlagsTuning::default()
                    },
                    ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 4)
                })
                .expect("submit");
            let parts = ticket.cuts().len() - 1;
            assert!(parts > 1, "the arm is cut among workers");
            let t = Instant::now();
            let tuning = FlagsTuning {
                tagged_x,
                ..FlagsTuning::default()
            };
            if tuning.x_is_tagged(fmt) {
                mb.device_publish_tagged(&x, 4).expect("publish");
            } else {
                mb.device_publish(&x, 4).expect("publish");
            }
            let err = ticket.wait().expect_err("NaN in x");
            assert!(t.elapsed() < Duration::from_secs(5), "{fmt}: workers hung");
            // Shared: the worker that met the NaN says so, the others that another did.
            assert!(
                matches!(err, ExecError::Quant(_))
                    || (tuning.x_is_shared(fmt) && matches!(err, ExecError::Invalid { .. })),
                "{fmt}: {err}"
            );
            assert_eq!(mb.done().load(Ordering::Acquire), 4 | DONE_FAILED);
            for p in 0..parts {
                assert_eq!(
                    mb.part_done(p).load(Ordering::Acquire),
                    4 | DONE_FAILED,
                    "{fmt}: part {p}"
                );
            }
        }
    }
}

/// A tagged x with one element never written for the step (a device that stopped midway):
/// the workers give up at their timeout with an error, and done says the arm failed.
#[test]
fn a_tagged_element_that_never_comes_times_out() {
    let (fmt, k, m) = (Format::Q4K, 1024usize, 96usize);
    let (w, x) = setup(fmt, k, m, 17);
    let pool = CpuPool::new(3).expect("pool");
    let mb = host_mailbox(k, m);
    let ticket = pool
        .submit_flags(FlagsArm {
            timeout: Duration::from_millis(300),
            ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 6)
        })
        .expect("submit");
    assert!(FlagsTuning::default().x_is_tagged(fmt), "tagged by default");
    // Every element of step 6 but one; that one keeps an older step.
    for (i, (word, v)) in mb.x_tagged().iter().zip(&x).enumerate() {
        let step = if i == 700 { 5 } else { 6 };
        word.store(tagged(*v, step), Ordering::Release);
    }
    let t = Instant::now();
    let err = ticket.wait().expect_err("element 700 never came");
    assert!(
        matches!(err, ExecError::Timeout { .. } | ExecError::Invalid { .. }),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "gave up at the timeout"
    );
    assert_eq!(mb.done().load(Ordering::Acquire), 6 | DONE_FAILED);
}

/// A weight whose bytes vanish after `good` looks: the multiply of whatever chunk a worker
/// is on then panics, mid-arm, while other workers may still be taking chunks.
struct VanishingWeight {
    bytes: Arc<Vec<u8>>,
    looks: AtomicUsize,
    good: usize,
}

impl WeightBytes for VanishingWeight {
    fn bytes(&self) -> &[u8] {
        if self.looks.fetch_add(1, Ordering::Relaxed) < self.good {
            &self.bytes
        } else {
            &[]
        }
    }
}

/// A worker that fails partway through its chunks: the arm fails, every chunk still gets
/// a done word (the ones nobody took are published as failed), and nothing waits for a
/// timeout.
#[test]
fn a_worker_failing_mid_arm_publishes_every_chunk() {
    let (fmt, k, m, workers) = (Format::Q4_0, 256usize, 2048usize, 4usize);
    let (w, x) = setup(fmt, k, m, 33);
    let pool = CpuPool::new(workers).expect("pool");
    // Looks: 1 at submit, 1 per worker's prefetch, then one per chunk multiplied.
    for good in [1 + workers + 2, 1 + workers + 9] {
        let mb = host_mailbox(k, m);
        let weight = Arc::new(VanishingWeight {
            bytes: w.clone(),
            looks: AtomicUsize::new(0),
            good,
        });
        let ticket = pool
            .submit_flags(FlagsArm {
                parts: vec![ArmRows {
                    weight,
                    g: 0,
                    rows: m,
                }],
                timeout: Duration::from_secs(30),
                ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), 5)
            })
            .expect("submit");
        let chunks = ticket.cuts().len() - 1;
        assert_eq!(chunks, workers * usize::from(DEFAULT_CHUNKS_PER_WORKER));
        let t = Instant::now();
        mb.device_publish(&x, 5).expect("publish");
        assert!(ticket.wait().is_err(), "good {good}: the arm failed");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "good {good}: nothing hung"
        );
        assert_eq!(mb.done().load(Ordering::Acquire), 5 | DONE_FAILED);
        let words: Vec<u32> = (0..chunks)
            .map(|c| mb.part_done(c).load(Ordering::Acquire))
            .collect();
        assert!(
            words.iter().all(|&v| v == 5 || v == 5 | DONE_FAILED),
            "good {good}: every chunk published: {words:?}"
        );
        assert!(words.contains(&(5 | DONE_FAILED)), "good {good}: {words:?}");
    }
}

/// Workers that wait long for x prefetch exactly their budget each (their first chunks
/// are longer than it), and nothing without one; the report sums what they issued.
#[test]
fn waiting_workers_prefetch_their_budget_and_no_more() {
    let (fmt, k, m, workers) = (Format::Q4K, 4096usize, 512usize, 4usize);
    let (w, x) = setup(fmt, k, m, 21);
    let pool = CpuPool::new(workers).expect("pool");
    for (step, budget) in [(1u32, 0usize), (2, 4096), (3, 64 << 10)] {
        let mb = host_mailbox(k, m);
        let ticket = pool
            .submit_flags(FlagsArm {
                tuning: FlagsTuning {
                    prefetch_bytes: budget,
                    ..FlagsTuning::default()
                },
                ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), step)
            })
            .expect("submit");
        let first_chunk = (ticket.cuts()[1] - ticket.cuts()[0]) * fmt.row_bytes(k).expect("rb");
        assert!(first_chunk > budget, "each first chunk outlasts the budget");
        // Long against issuing 64 KiB of prefetches, even on two busy cores.
        std::thread::sleep(Duration::from_millis(50));
        mb.device_publish_tagged(&x, step).expect("publish");
        mb.device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)
            .expect("done");
        let rep = ticket.wait().expect("arm");
        assert_eq!(
            rep.prefetched_bytes,
            (workers * budget) as u64,
            "budget {budget}"
        );
    }
}

#[test]
fn cancel_releases_waiting_workers() {
    let (fmt, k, m) = (Format::Q8_0, 64usize, 40usize);
    let (w, _) = setup(fmt, k, m, 4);
    let pool = CpuPool::new(2).expect("pool");
    let mb = host_mailbox(k, m);
    let ticket = pool
        .submit_flags(FlagsArm {
            // Long: the test fails by time if cancellation does not reach the workers.
            timeout: Duration::from_secs(30),
            ..one_part_arm(fmt, k, w, 0, m, mb.clone(), 9)
        })
        .expect("submit");
    let t = Instant::now();
    ticket.cancel();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "workers not cancelled"
    );
    assert_eq!(
        mb.done().load(Ordering::Acquire),
        9 | DONE_FAILED,
        "done still published, marked failed"
    );
    let mut y = vec![0.0; 4];
    pool.gemv(Format::F32, &[0u8; 4 * 4 * 4], 4, &[1.0; 4], &mut y, false)
        .expect("pool after a cancelled arm");
}

#[test]
fn submit_refuses_more_rows_than_the_mailbox_holds() {
    let (fmt, k, m) = (Format::Q8_0, 64usize, 40usize);
    let (w, _) = setup(fmt, k, m, 5);
    let pool = CpuPool::new(2).expect("pool");
    let arm = |rows, mb| one_part_arm(fmt, k, w.clone(), 0, rows, mb, 1);
    let err = pool
        .submit_flags(arm(m, host_mailbox(k, 8)))
        .err()
        .expect("too many rows");
    assert!(matches!(err, ExecError::Shape { .. }), "{err}");
    let err = pool
        .submit_flags(arm(m + 1, host_mailbox(k, m + 1)))
        .err()
        .expect("rows past the weight");
    assert!(matches!(err, ExecError::Shape { .. }), "{err}");
}

/// Every tuning gives the pool's rows bit for bit; the chunks' done words say the step for
/// exactly the arm's parts (cut points from 0 to the rows) and no other.
#[test]
fn every_tuning_matches_the_pool_and_publishes_its_done_words() {
    let (k, m) = (1024usize, 203usize);
    let pool = CpuPool::new(4).expect("pool");
    let mut step = 0;
    // Q4_K: x prepared together (tagged or behind the sequence word); Q8_0: by each worker.
    for fmt in [Format::Q4K, Format::Q8_0] {
        let (w, x) = setup(fmt, k, m, 11);
        let mut want = vec![f32::NAN; m];
        pool.gemv(fmt, &w, k, &x, &mut want, false).expect("pool");
        for chunks_per_worker in [1u8, 3, 4] {
            for prefetch_bytes in [0usize, 4096, 65536] {
                for tagged_x in [false, true] {
                    // Every field but the `experiments` feature's, which needs the update.
                    #[allow(clippy::needless_update)]
                    let tuning = FlagsTuning {
                        prefetch_bytes,
                        chunks_per_worker,
                        tagged_x,
                        ..FlagsTuning::default()
                    };
                    step = next_step(step);
                    let mb = host_mailbox(k, m);
                    // Poisoned: a row left unwritten shows.
                    // SAFETY: the y area holds `m` floats (`host_mailbox`); no arm runs yet.
                    unsafe {
                        std::slice::from_raw_parts_mut(
                            mb.mem.base().add(mb.y_offset()) as *mut f32,
                            m,
                        )
                    }
                    .fill(f32::NAN);
                    let ticket = pool
                        .submit_flags(FlagsArm {
                            tuning,
                            ..one_part_arm(fmt, k, w.clone(), 0, m, mb.clone(), step)
                        })
                        .expect("submit");
                    let cuts = ticket.cuts().to_vec();
                    assert_eq!((cuts[0], *cuts.last().expect("cuts")), (0, m), "{tuning:?}");
                    assert!(cuts.windows(2).all(|c| c[0] < c[1]), "{cuts:?}");
                    // 203 rows are 12 whole lines of output: fewer chunks than asked, but
                    // at least one per worker.
                    let n = usize::from(chunks_per_worker);
                    assert!(
                        (4..=4 * n).contains(&(cuts.len() - 1)),
                        "{n} per worker: {cuts:?}"
                    );
                    if tuning.x_is_tagged(fmt) {
                        mb.device_publish_tagged(&x, step).expect("publish");
                    } else {
                        mb.device_publish(&x, step).expect("publish");
                    }
                    let got = mb
                        .device_wait_done(step, DEFAULT_FLAGS_TIMEOUT)
                        .expect("done");
                    ticket.wait().expect("arm");
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{fmt} {tuning:?}"
                    );
                    for p in 0..MAX_DONE_PARTS {
                        let v = mb.part_done(p).load(Ordering::Acquire);
                        let expect = if p + 1 < cuts.len() { step } else { 0 };
                        assert_eq!(v, expect, "{fmt} {tuning:?} part {p}");
                    }
                }
            }
        }
    }
}

/// Step numbers never reach the failure bit and never return to 0.
#[test]
fn step_numbers_wrap_below_the_failure_bit() {
    assert_eq!(next_step(0), 1);
    assert_eq!(next_step(41), 42);
    assert_eq!(next_step(DONE_FAILED - 2), DONE_FAILED - 1);
    assert_eq!(next_step(DONE_FAILED - 1), 1);
    assert_eq!(next_step(u32::MAX), 1);
}

#[test]
fn mailbox_checks() {
    let small: Arc<dyn MailboxMemory> = Arc::new(HostMailboxMemory::new(64));
    assert!(Mailbox::new(small, 256, 10).is_err());
    assert_eq!(Mailbox::bytes_needed(4, 1) % 4, 0);
    assert_eq!(Mailbox::y_offset_for(4096) % MAILBOX_ALIGN, 0);
    assert!(Mailbox::y_offset_for(1) >= X_OFFSET + 4);
}
