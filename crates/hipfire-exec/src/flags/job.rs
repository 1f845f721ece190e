//! The flags arm as a pool job: what the planner submits ([`FlagsArm`]), the job the workers
//! share (wait for x, prepare it, multiply their rows and chunks, publish each part's done
//! word, prefetch weight rows while waiting), and the ticket that collects it.

use crate::error::ExecError;
use crate::flags::activation::{SharedX, XSource};
use crate::flags::mailbox::{
    wait_word, Mailbox, DONE_FAILED, MAILBOX_ALIGN, MAX_DONE_PARTS, X_OFFSET,
};
use crate::flags::FlagsTuning;
use crate::kernel::{gemv_rows, ActivationBuf};
use crate::pool::{partition, CpuPool, PoolJob, WORKER_ROW_ALIGN};
use crossbeam_utils::CachePadded;
use hipfire_quant::Format;
use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a weight a flags job owns a share of.
pub trait WeightBytes: Send + Sync {
    /// The bytes (rows `row_bytes` apart).
    fn bytes(&self) -> &[u8];
}

impl WeightBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl WeightBytes for hipfire_gpu::HostMappedBuffer {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Rows `[g, g + rows)` of one weight: the CPU's part of one output of a flags step.
#[derive(Clone)]
pub struct ArmRows {
    /// The whole weight.
    pub weight: Arc<dyn WeightBytes>,
    /// First CPU row (the GPU computes `[0, g)`).
    pub g: usize,
    /// CPU rows.
    pub rows: usize,
}

/// One step's CPU arm under the flags join: the CPU rows of one or more outputs that share the
/// step's activation (q/k/v, gate/up), written one after another into the mailbox.
pub struct FlagsArm {
    /// Weight format (every part's).
    pub format: Format,
    /// Row length.
    pub k: usize,
    /// The outputs' CPU rows, in mailbox order; their total is at most the mailbox's rows.
    pub parts: Vec<ArmRows>,
    /// The mailbox.
    pub mailbox: Mailbox,
    /// Step number the device will publish.
    pub step: u32,
    /// Give up waiting for the device after this long.
    pub timeout: Duration,
    /// How done is signalled and the rows written.
    pub tuning: FlagsTuning,
}

/// What a flags arm measured.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct FlagsReport {
    /// Longest a worker waited for the sequence word (ns).
    pub wait_ns: f64,
    /// Longest a worker spent multiplying after it (ns), its activation preparation included.
    pub cpu_ns: f64,
    /// Longest a worker spent preparing the activation (ns; part of `cpu_ns`).
    pub prepare_ns: f64,
    /// When the first and the last worker saw the sequence word, and when the last one
    /// finished (ns on [`flags_clock_ns`]'s clock): the arm's span is `done − first_seen`, and
    /// `first_seen` of a step minus `done` of the one before is the device's turnaround
    /// (fold, kernels between, publish).
    pub first_seen_ns: u64,
    /// See `first_seen_ns`.
    pub last_seen_ns: u64,
    /// See `first_seen_ns`.
    pub done_ns: u64,
    /// Bytes of weight rows the workers prefetched while they waited (for x and for the
    /// shared activation), summed over the workers ([`FlagsTuning::prefetch_bytes`] each at
    /// most): how much of the budget the wait had time for.
    pub prefetched_bytes: u64,
}

/// Nanoseconds since the first call in this process: the clock of [`FlagsReport`]'s instants.
pub fn flags_clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The job the workers share.
pub(crate) struct FlagsJob {
    format: Format,
    k: usize,
    parts: Vec<ArmRows>,
    /// Total CPU rows (the parts' rows, concatenated: the workers' row space).
    rows_n: usize,
    mailbox: Mailbox,
    pub(crate) step: u32,
    pub(crate) timeout: Duration,
    /// Raised when the device side was never queued: waiting workers give up at once.
    pub(crate) cancelled: AtomicBool,
    row_bytes: usize,
    tuning: FlagsTuning,
    /// x prepared together, when the tuning says so.
    shared_x: Option<SharedX>,
    /// The parts of `[0, rows_n)` as cut points (part `p` is `cuts[p]..cuts[p + 1]`), each with
    /// its own done word: the chunks of [`FlagsTuning::chunks_per_worker`] (worker `w` starts
    /// on chunk `w`).
    cuts: Vec<usize>,
    /// The next chunk to take (starts at the number of workers).
    next_chunk: CachePadded<AtomicUsize>,
    /// Workers still to finish; the last one publishes done.
    /// (On its own cache line, like `failed` and each worker's stats: the fields above are
    /// read by every worker throughout the arm, and a store to a line they share would take
    /// it from all of them.)
    remaining: CachePadded<AtomicUsize>,
    /// Raised by a worker that failed: done then says so.
    failed: CachePadded<AtomicBool>,
    /// What each part's worker measured (one slot per part, and a last one for a worker whose
    /// rows are not one of the parts), collected by the ticket once the arm is over.
    stats: Vec<CachePadded<WorkerStats>>,
}

/// What one worker measured of its part (ns). Each on its own cache line: the workers record
/// these right after they see x, all at once, and fifteen read-modify-writes of one shared
/// line there queue behind each other for the line.
#[derive(Debug)]
struct WorkerStats {
    /// Wait for the sequence word.
    wait_ns: AtomicU64,
    /// Preparation of x and the multiply.
    cpu_ns: AtomicU64,
    /// Preparation of x alone.
    prepare_ns: AtomicU64,
    /// When it saw the sequence word and when it was done ([`flags_clock_ns`]; `u64::MAX`
    /// and 0 until then).
    seen: AtomicU64,
    done_at: AtomicU64,
    /// Bytes of weight rows prefetched while waiting.
    prefetched: AtomicU64,
}

impl Default for WorkerStats {
    fn default() -> Self {
        WorkerStats {
            wait_ns: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            prepare_ns: AtomicU64::new(0),
            seen: AtomicU64::new(u64::MAX),
            done_at: AtomicU64::new(0),
            prefetched: AtomicU64::new(0),
        }
    }
}

impl FlagsJob {
    /// This worker's arm: `rows` of the concatenated row space, which is part `part` of the cut,
    /// then chunks off the counter until none is left, publishing
    /// each one's done word as it finishes. `holding` names the part whose done word is still
    /// this worker's to publish (its first part until published, then the chunk it is on):
    /// the caller publishes it, failed or not, whatever way this returns.
    fn rows(
        &self,
        rows: Range<usize>,
        part: Option<usize>,
        holding: &Cell<Option<usize>>,
    ) -> Result<(), ExecError> {
        let mb = &self.mailbox;
        let t_wait = Instant::now();
        let mut prefetch = WeightPrefetch::new(self, &rows);
        let tagged = self.tuning.x_is_tagged(self.format);
        wait_word(
            || {
                if tagged {
                    // The first element's step stands for the sequence word.
                    mb.x_tagged()
                        .first()
                        .map_or(0, |w| (w.load(Ordering::Acquire) >> 32) as u32)
                } else {
                    mb.seq().load(Ordering::Acquire)
                }
            },
            |v| v == self.step,
            self.timeout,
            "flags sequence word",
            Some(&self.cancelled),
            || prefetch.advance(),
        )?;
        let waited = t_wait.elapsed();
        let seen = flags_clock_ns();
        // Uncontended: this worker's own line (the fallback slot is shared, hence min/max).
        let last = self.stats.len().saturating_sub(1);
        let stats =
            self.stats
                .get(part.map_or(last, |p| p.min(last)))
                .ok_or(ExecError::Invalid {
                    what: "flags job",
                    value: "no stats slots".into(),
                    rule: "submitted through CpuPool::submit_flags",
                })?;
        stats.seen.fetch_min(seen, Ordering::Relaxed);
        stats
            .wait_ns
            .fetch_max(waited.as_nanos() as u64, Ordering::Relaxed);
        let t = Instant::now();
        // Plain x, read only when x is not tagged (a tagged area may still be being written
        // when element 0 is seen).
        // SAFETY: in bounds (`Mailbox::new`); after seq == step (acquire, in `wait_word`) the
        // device does not write x until it sees done.
        let plain_x = || unsafe {
            std::slice::from_raw_parts(mb.mem.base().add(X_OFFSET) as *const f32, self.k)
        };
        let owned;
        let act = if let Some(shared) = &self.shared_x {
            let src = if tagged {
                XSource::Tagged(mb.x_tagged())
            } else {
                XSource::Plain(plain_x())
            };
            shared.prepare(&src, self, &mut prefetch)?
        } else {
            owned = ActivationBuf::prepare(self.format, plain_x())?;
            &owned
        };
        stats
            .prepare_ns
            .fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats
            .prefetched
            .fetch_add(prefetch.issued() as u64, Ordering::Relaxed);
        self.write_rows(&rows, act)?;
        if let Some(p) = part {
            self.part_done(p, false);
        }
        holding.set(None);
        loop {
            let c = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            let Some(chunk) = self.cuts.get(c..c + 2).map(|w| w[0]..w[1]) else {
                break;
            };
            holding.set(Some(c));
            self.write_rows(&chunk, act)?;
            self.part_done(c, false);
            holding.set(None);
        }
        stats
            .cpu_ns
            .fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.done_at.fetch_max(flags_clock_ns(), Ordering::Relaxed);
        Ok(())
    }
}

impl FlagsJob {
    /// `rows` of the concatenated row space, multiplied into their slot of the mailbox.
    fn write_rows(&self, rows: &Range<usize>, act: &ActivationBuf) -> Result<(), ExecError> {
        let mb = &self.mailbox;
        // SAFETY: `rows` is one part of [0, rows_n) (partition; rows_n is at most the
        // mailbox's rows, checked at submit), so the slice is in bounds; each part is handed
        // to one worker once (its first part at submit, a chunk by the counter), which alone
        // writes it until its done word is published.
        let y = unsafe {
            std::slice::from_raw_parts_mut(
                (mb.mem.base().add(mb.y_offset()) as *mut f32).add(rows.start),
                rows.len(),
            )
        };
        self.multiply(rows, act, y)
    }

    /// Once a worker failed: the chunks nobody took yet are published as failed, so that the
    /// device's fold does not wait for them until its timeout.
    fn fail_untaken_chunks(&self) {
        loop {
            let c = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            if c + 1 >= self.cuts.len() {
                break;
            }
            self.part_done(c, true);
        }
    }
}

/// Cache lines a waiting worker prefetches between batches of polls
/// ([`FlagsTuning::prefetch_bytes`]): 512 bytes, a few of a core's fill buffers, so that a poll
/// batch still sees the sequence word within a fraction of a microsecond.
const PREFETCH_LINES_PER_BATCH: usize = 8;

/// The start of a worker's weight rows, pulled into its cache while it waits for x
/// ([`FlagsTuning::prefetch_bytes`]): the memory system is otherwise idle between steps.
pub(crate) struct WeightPrefetch<'a> {
    /// The worker's byte ranges of each part's weight, in the order it will read them.
    spans: Vec<&'a [u8]>,
    span: usize,
    off: usize,
    left: usize,
    /// Bytes issued so far.
    issued: usize,
}

impl<'a> WeightPrefetch<'a> {
    fn new(job: &'a FlagsJob, rows: &Range<usize>) -> WeightPrefetch<'a> {
        let mut spans = Vec::new();
        if job.tuning.prefetch_bytes > 0 {
            for (part, r, _) in job.overlaps(rows.clone()) {
                if let Some(b) = part
                    .weight
                    .bytes()
                    .get(r.start * job.row_bytes..r.end * job.row_bytes)
                {
                    spans.push(b);
                }
            }
        }
        WeightPrefetch {
            spans,
            span: 0,
            off: 0,
            left: job.tuning.prefetch_bytes,
            issued: 0,
        }
    }

    /// Bytes prefetched so far.
    pub(crate) fn issued(&self) -> usize {
        self.issued
    }

    /// Prefetch the next few lines, until the budget or the rows run out; whether any was
    /// left to prefetch.
    pub(crate) fn advance(&mut self) -> bool {
        for _ in 0..PREFETCH_LINES_PER_BATCH {
            let Some(span) = self.spans.get(self.span) else {
                return false;
            };
            if self.left == 0 {
                return false;
            }
            if self.off >= span.len() {
                self.span += 1;
                self.off = 0;
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the pointer is inside `span`; a prefetch never faults and SSE is part of
            // x86-64. T1: into L2 (and L3), where the multiply will find it.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(span.as_ptr().add(self.off) as *const i8);
            }
            self.off += MAILBOX_ALIGN;
            self.left = self.left.saturating_sub(MAILBOX_ALIGN);
            self.issued += MAILBOX_ALIGN;
        }
        true
    }
}

impl FlagsJob {
    /// This worker's rows of every part that overlaps them (`y` is their slot in the
    /// concatenated rows).
    fn multiply(
        &self,
        rows: &Range<usize>,
        act: &ActivationBuf,
        y: &mut [f32],
    ) -> Result<(), ExecError> {
        for (part, weight_rows, out) in self.overlaps(rows.clone()) {
            let w = &part.weight.bytes()
                [weight_rows.start * self.row_bytes..weight_rows.end * self.row_bytes];
            gemv_rows(self.format, w, self.k, act, &mut y[out], false)?;
        }
        Ok(())
    }

    /// The parts that overlap `rows` of the concatenated row space: each part, its weight rows
    /// in that overlap, and where they sit in `rows` (from 0).
    fn overlaps(
        &self,
        rows: Range<usize>,
    ) -> impl Iterator<Item = (&ArmRows, Range<usize>, Range<usize>)> + '_ {
        let mut base = 0;
        self.parts.iter().filter_map(move |part| {
            let (lo, hi) = (rows.start.max(base), rows.end.min(base + part.rows));
            let out = (lo < hi).then(|| {
                (
                    part,
                    part.g + lo - base..part.g + hi - base,
                    lo - rows.start..hi - rows.start,
                )
            });
            base += part.rows;
            out
        })
    }

    /// The part (worker) whose rows start at `start`.
    fn part_of(&self, start: usize) -> Option<usize> {
        self.cuts[..self.cuts.len().saturating_sub(1)]
            .binary_search(&start)
            .ok()
    }

    /// Part `part` is finished (`failed`: without its rows): publish its done word.
    fn part_done(&self, part: usize, failed: bool) {
        let v = if failed {
            self.step | DONE_FAILED
        } else {
            self.step
        };
        if failed {
            self.failed.store(true, Ordering::Release);
        }
        if part < MAX_DONE_PARTS {
            self.mailbox.part_done(part).store(v, Ordering::Release);
        }
    }
}

impl PoolJob for FlagsJob {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        let part = self.part_of(rows.start);
        // The part whose done word this worker still owes (see `rows`): published here, after
        // an error or a panic too, because the device's fold waits for every part.
        let holding = Cell::new(part);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.rows(rows, part, &holding)
        }));
        let failed = !matches!(r, Ok(Ok(())));
        if failed {
            self.fail_untaken_chunks();
        }
        if let Some(p) = holding.get() {
            self.part_done(p, failed);
        }
        if part.is_none() {
            // Not one of the parts the arm was cut into: nothing is published for it, so
            // the device's fold of the real parts times out rather than folding stale rows.
            self.failed.store(true, Ordering::Release);
        }
        // Always count down, so the device never waits on a worker that failed.
        self.count_down();
        match r {
            Ok(res) => res.map(|()| 0),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

/// A submitted flags arm; [`FlagsTicket::wait`] collects it.
pub struct FlagsTicket {
    pending: crate::pool::Pending,
    job: Arc<FlagsJob>,
}

impl FlagsTicket {
    /// The workers' parts of the arm's concatenated rows, as cut points from 0 to their
    /// total: the device's fold waits on part `p`'s done word for rows `cuts[p]..cuts[p + 1]`.
    pub fn cuts(&self) -> &[usize] {
        &self.job.cuts
    }

    /// Whether every part has finished (done is published); [`FlagsTicket::wait`] then
    /// returns at once.
    pub fn is_finished(&self) -> bool {
        self.job.remaining.load(Ordering::Acquire) == 0
    }

    /// Give up on the arm because its device side was never queued: workers still waiting for
    /// the sequence word stop at once (done is still published, with the error word), and this
    /// returns once every worker has let go of the job.
    pub fn cancel(self) {
        self.job.cancelled.store(true, Ordering::Release);
        let _ = self.pending.wait();
    }

    /// Block until every worker of the arm has finished; the arm's measurements or its error.
    pub fn wait(self) -> Result<FlagsReport, ExecError> {
        self.pending.wait()?;
        let stats = &self.job.stats;
        let max = |f: fn(&WorkerStats) -> &AtomicU64| {
            stats
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .max()
                .unwrap_or(0)
        };
        let seen = || {
            stats
                .iter()
                .map(|s| s.seen.load(Ordering::Relaxed))
                .filter(|&v| v != u64::MAX)
        };
        Ok(FlagsReport {
            wait_ns: max(|s| &s.wait_ns) as f64,
            cpu_ns: max(|s| &s.cpu_ns) as f64,
            prepare_ns: max(|s| &s.prepare_ns) as f64,
            first_seen_ns: seen().min().unwrap_or(u64::MAX),
            last_seen_ns: seen().max().unwrap_or(0),
            done_ns: max(|s| &s.done_at),
            prefetched_bytes: stats
                .iter()
                .map(|s| s.prefetched.load(Ordering::Relaxed))
                .sum(),
        })
    }
}

impl FlagsJob {
    /// One part finished (or was never taken): the last one publishes done.
    fn count_down(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let v = if self.failed.load(Ordering::Acquire) {
                self.step | DONE_FAILED
            } else {
                self.step
            };
            self.mailbox.done().store(v, Ordering::Release);
        }
    }
}

impl CpuPool {
    fn submit_job(&self, job: FlagsJob) -> Result<FlagsTicket, ExecError> {
        // A mailbox laid out for a longer activation serves shorter ones (its y area sits past
        // the longest x).
        if job.k > job.mailbox.k {
            return Err(ExecError::Shape {
                what: "mailbox k",
                need: job.k,
                got: job.mailbox.k,
            });
        }
        if job.rows_n > job.mailbox.rows {
            return Err(ExecError::Shape {
                what: "mailbox rows",
                need: job.rows_n,
                got: job.mailbox.rows,
            });
        }
        for part in &job.parts {
            let need = (part.g + part.rows) * job.row_bytes;
            if part.weight.bytes().len() < need {
                return Err(ExecError::Shape {
                    what: "weight bytes",
                    need,
                    got: part.weight.bytes().len(),
                });
            }
        }
        let workers = self.threads().min(MAX_DONE_PARTS);
        let cut = partition(
            0..job.rows_n,
            (workers * usize::from(job.tuning.chunks_per_worker.max(1))).min(MAX_DONE_PARTS),
            WORKER_ROW_ALIGN,
        );
        let mut job = job;
        job.cuts = std::iter::once(0)
            .chain(cut.iter().map(|r| r.end))
            .collect();
        // Worker w starts on part w; under chunks the rest go to whoever asks first.
        let parts: Vec<Range<usize>> = cut.into_iter().take(workers).collect();
        job.next_chunk.store(parts.len(), Ordering::Relaxed);
        job.remaining.store(parts.len(), Ordering::Release);
        job.stats = (0..=parts.len()).map(|_| CachePadded::default()).collect();
        let job = Arc::new(job);
        if parts.is_empty() {
            job.mailbox.done().store(job.step, Ordering::Release);
        }
        let pending = self.submit_owned(job.clone(), parts)?;
        // Parts no worker took: count them down as failed, so done is still published.
        for &p in &pending.unsent {
            job.part_done(p, true);
            job.count_down();
        }
        Ok(FlagsTicket { pending, job })
    }

    /// Hand `arm` to the workers now; they wait for the device's sequence word, multiply, and
    /// publish done. Returns once every worker has the job queued (a worker queues one job
    /// behind the one it runs, so this blocks while the previous arm is still waiting to be
    /// taken). Pool work submitted later runs after the arm, so it waits for the device to
    /// publish this step: queue the device side before waiting on anything else.
    pub fn submit_flags(&self, arm: FlagsArm) -> Result<FlagsTicket, ExecError> {
        let row_bytes = arm.format.row_bytes(arm.k)?;
        let shared_x = if arm.tuning.x_is_shared(arm.format) {
            Some(SharedX::new(arm.format, arm.k)?)
        } else {
            None
        };
        self.submit_job(FlagsJob {
            format: arm.format,
            k: arm.k,
            rows_n: arm.parts.iter().map(|p| p.rows).sum(),
            parts: arm.parts,
            mailbox: arm.mailbox,
            step: arm.step,
            timeout: arm.timeout,
            cancelled: AtomicBool::new(false),
            row_bytes,
            tuning: arm.tuning,
            shared_x,
            cuts: Vec::new(),
            next_chunk: CachePadded::new(AtomicUsize::new(0)),
            remaining: CachePadded::new(AtomicUsize::new(0)),
            failed: CachePadded::new(AtomicBool::new(false)),
            stats: Vec::new(),
        })
    }
}
