//! The pool's GEMV jobs: one matrix ([`CpuPool::gemv`] and its prepared / strided forms),
//! several over one activation ([`CpuPool::gemv_batch`]) and several over many tokens
//! ([`CpuPool::gemv_tokens`]). Each job writes the caller's outputs through raw pointers into
//! the disjoint row ranges the pool cuts.

use crate::error::ExecError;
use crate::kernel::{gemv_rows, ActivationBuf};
use crate::pool::{CpuPool, PoolJob};
use crossbeam_utils::CachePadded;
use hipfire_quant::{AmxEngine, Bf16Tokens, Format};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

impl CpuPool {
    /// `y = W·x` (or `y += W·x` with `accumulate`) over all `m = y.len()` rows of `w`, split
    /// across the workers; the activation is prepared once.
    ///
    /// `w.len()` must equal `m × fmt.row_bytes(k)` and `x.len()` must equal `k`.
    pub fn gemv(
        &self,
        fmt: Format,
        w: &[u8],
        k: usize,
        x: &[f32],
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ExecError> {
        check_x_len(k, x)?;
        let row_bytes = fmt.row_bytes(k)?;
        let need = y.len() * row_bytes;
        if w.len() != need {
            return Err(ExecError::Shape {
                what: "weight bytes (m × row_bytes)",
                need,
                got: w.len(),
            });
        }
        if y.is_empty() {
            return Ok(());
        }
        let act = ActivationBuf::prepare(fmt, x)?;
        self.gemv_prepared(fmt, w, k, &act, 0, y, accumulate)
    }

    /// Rows `[row0, row0 + y.len())` of the matrix `w` (all of its rows, `w.len()` a whole number
    /// of rows covering at least `row0 + y.len()`): `y[i] (+)= W[row0 + i]·x`, with `act`
    /// already prepared for `fmt`. This is the passback CPU arm: `row0 = g`, `y = &mut out[g..m]`.
    ///
    /// Worker cut points are multiples of `WORKER_ROW_ALIGN` in absolute rows.
    #[allow(clippy::too_many_arguments)] // the GEMV's own operands; a struct would only rename them
    pub fn gemv_prepared(
        &self,
        fmt: Format,
        w: &[u8],
        k: usize,
        act: &ActivationBuf,
        row0: usize,
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ExecError> {
        let row_bytes = fmt.row_bytes(k)?;
        self.gemv_strided(fmt, w, k, row_bytes, act, row0, y, accumulate)
    }

    /// As [`CpuPool::gemv_prepared`] for rows `stride` bytes apart (`stride >= row_bytes`;
    /// padded rows, which the split refuses but the CPU still runs whole).
    #[allow(clippy::too_many_arguments)] // as gemv_prepared, plus the stride
    pub fn gemv_strided(
        &self,
        fmt: Format,
        w: &[u8],
        k: usize,
        stride: usize,
        act: &ActivationBuf,
        row0: usize,
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ExecError> {
        let row_bytes = fmt.row_bytes(k)?;
        if stride < row_bytes {
            return Err(ExecError::Shape {
                what: "row stride (bytes)",
                need: row_bytes,
                got: stride,
            });
        }
        if y.is_empty() {
            return Ok(());
        }
        let end = row0 + y.len();
        let need = (end - 1) * stride + row_bytes;
        if w.len() < need {
            return Err(ExecError::Shape {
                what: "weight bytes (rows × row_bytes)",
                need,
                got: w.len(),
            });
        }
        let job = GemvJob {
            fmt,
            k,
            row_bytes,
            stride,
            w,
            act,
            row0,
            y: y.as_mut_ptr(),
            y_len: y.len(),
            accumulate,
        };
        self.run_job(&job, row0..end).map(|_| ())
    }

    /// Several matrices of one format over the same `x` in one dispatch: `segs[i].y (+)=
    /// segs[i].w · x` for every segment, the rows of all segments cut among the workers as one
    /// row space. The activation is prepared once. Each row's result is bit-identical to
    /// [`CpuPool::gemv`] on its own matrix (same prepared activation, same row dot); what is
    /// saved is one dispatch and one activation preparation per extra matrix — q/k/v and
    /// gate/up of a decode step.
    ///
    /// It is [`CpuPool::gemv_tokens`] with one token, kept as its own job: routing it through
    /// the token job (with a one-token path inside) measured 297 against 302 tok/s of SmolLM2
    /// decode on the 2-core VM (mean of 18 rounds each, alternating builds, 2026-11-29).
    pub fn gemv_batch(
        &self,
        fmt: Format,
        k: usize,
        x: &[f32],
        segs: &mut [GemvSegment<'_>],
    ) -> Result<(), ExecError> {
        check_x_len(k, x)?;
        let row_bytes = fmt.row_bytes(k)?;
        let mut parts = Vec::with_capacity(segs.len());
        let mut start = 0usize;
        for s in segs.iter_mut() {
            let need = s.y.len() * row_bytes;
            if s.w.len() != need {
                return Err(ExecError::Shape {
                    what: "weight bytes (m × row_bytes)",
                    need,
                    got: s.w.len(),
                });
            }
            parts.push(BatchPart {
                start,
                w: s.w,
                y: s.y.as_mut_ptr(),
                y_len: s.y.len(),
                accumulate: s.accumulate,
            });
            start += s.y.len();
        }
        if start == 0 {
            return Ok(());
        }
        let act = ActivationBuf::prepare(fmt, x)?;
        let job = BatchGemvJob {
            fmt,
            k,
            row_bytes,
            act: &act,
            parts,
        };
        self.run_job(&job, 0..start).map(|_| ())
    }

    /// Several matrices of one format over `T` activation vectors (prompt tokens) in one
    /// dispatch: for every token `t` and segment `s`, `s.y[t·m..(t+1)·m] (+)= s.w · xs[t·k..(t+1)·k]`
    /// (`m = s.w` rows; `xs` is `T × k` and each `y` is `T × m`, token-major). One activation is
    /// prepared per token; inside its row range each worker walks the rows in tiles of about
    /// [`TOKEN_TILE_BYTES`] of weight, running every token over a tile before moving on, so
    /// each weight byte is read from memory once per call instead of once per token.
    ///
    /// Below `hipfire_quant::AMX_MIN_TOKENS` tokens, or on a CPU without AMX, every output row
    /// is bit-identical to [`CpuPool::gemv`] of that token on that matrix (same prepared
    /// activation, same row dot, same accumulate; except where
    /// `hipfire_quant::multi_matches_single` says the multi-token kernel sums in another order).
    /// From that many tokens on a CPU with AMX (`hipfire_quant::amx_rows_used`), the tokens are
    /// packed to bf16 instead and each worker multiplies its rows on the tile unit
    /// (`hipfire_quant::gemm_bf16`): every output is then within
    /// `hipfire_quant::amx_error_bound(k) · Σ_i |w_i·x_i|` of the exact dot of the dequantised
    /// row with the unquantised token (the q8 row dots' own error is of the same order), not
    /// bit-identical to [`CpuPool::gemv`].
    pub fn gemv_tokens(
        &self,
        fmt: Format,
        k: usize,
        xs: &[f32],
        segs: &mut [GemvSegment<'_>],
    ) -> Result<(), ExecError> {
        let tokens = xs.len().checked_div(k).unwrap_or(0);
        let engine = hipfire_quant::amx_rows_used(fmt, tokens).then_some(AmxEngine::Hardware);
        self.gemv_tokens_on(fmt, k, xs, segs, engine)
    }

    /// [`CpuPool::gemv_tokens`] with the route given: the q8 row dots (`None`) or the bf16 GEMM
    /// on `engine` (the tests run the emulated engine on CPUs without AMX).
    pub(crate) fn gemv_tokens_on(
        &self,
        fmt: Format,
        k: usize,
        xs: &[f32],
        segs: &mut [GemvSegment<'_>],
        engine: Option<AmxEngine>,
    ) -> Result<(), ExecError> {
        if k == 0 {
            return Err(ExecError::Shape {
                what: "k (row length)",
                need: 1,
                got: 0,
            });
        }
        if xs.len() % k != 0 {
            return Err(ExecError::Shape {
                what: "xs (tokens × k)",
                need: xs.len().div_ceil(k) * k,
                got: xs.len(),
            });
        }
        let tokens = xs.len() / k;
        let row_bytes = fmt.row_bytes(k)?;
        let mut parts = Vec::with_capacity(segs.len());
        let mut start = 0usize;
        for s in segs.iter_mut() {
            let m = s.w.len() / row_bytes;
            if s.w.len() % row_bytes != 0 || s.y.len() != tokens * m {
                return Err(ExecError::Shape {
                    what: "segment output (tokens × m, m = weight bytes / row_bytes)",
                    need: tokens * m,
                    got: s.y.len(),
                });
            }
            parts.push(TokenPart {
                start,
                m,
                w: s.w,
                y: s.y.as_mut_ptr(),
                accumulate: s.accumulate,
            });
            start += m;
        }
        if start == 0 || tokens == 0 {
            return Ok(());
        }
        let bf16 = match engine {
            Some(_) => Some(Bf16Tokens::new(tokens, k)?),
            None => None,
        };
        let job = TokenGemvJob {
            fmt,
            k,
            row_bytes,
            tile_rows: token_tile_rows(row_bytes),
            acts: TokenActs::new(fmt, k, xs, bf16),
            engine,
            parts,
        };
        // Guided claims: on AMX of whole panels (a cut inside one would dequantise it twice,
        // padded), up to a panel group (whose panels share each block of the tokens); on the
        // row dots of whole row tiles, each on whole cache lines of every output.
        let (unit, max) = match engine {
            Some(_) => (hipfire_quant::AMX_PANEL_ROWS, hipfire_quant::AMX_CLAIM_ROWS),
            None => (
                job.tile_rows.next_multiple_of(super::WORKER_ROW_ALIGN),
                usize::MAX,
            ),
        };
        self.run_job_claimed(&job, 0..start, unit, max).map(|_| ())
    }
}

/// GEMV over a row range, writing into the caller's output through a raw pointer.
struct GemvJob<'a> {
    fmt: Format,
    k: usize,
    row_bytes: usize,
    /// Bytes between row starts (`row_bytes` when packed).
    stride: usize,
    /// The whole weight (row `r` starts at `r × stride`).
    w: &'a [u8],
    act: &'a ActivationBuf,
    /// Absolute row of `y[0]`.
    row0: usize,
    /// `y.as_mut_ptr()` of the caller's `&mut [f32]`, exclusively borrowed for the call.
    y: *mut f32,
    y_len: usize,
    accumulate: bool,
}

// SAFETY: workers only write through `y` into the disjoint ranges `partition` hands them, and
// only read `w`/`act` (shared borrows); the caller's `&mut` borrow of `y` lasts the whole call.
unsafe impl Sync for GemvJob<'_> {}

impl PoolJob for GemvJob<'_> {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        debug_assert!(rows.start >= self.row0 && rows.end - self.row0 <= self.y_len);
        let local = rows.start - self.row0;
        // SAFETY: `rows` is inside `[row0, row0 + y_len)` (partition of exactly that range) and
        // disjoint from every other worker's rows of this call; the pointer comes from a live
        // `&mut [f32]` of length `y_len` held by the blocked caller.
        let y = unsafe { std::slice::from_raw_parts_mut(self.y.add(local), rows.len()) };
        if self.stride == self.row_bytes {
            let w = &self.w[rows.start * self.row_bytes..rows.end * self.row_bytes];
            gemv_rows(self.fmt, w, self.k, self.act, y, self.accumulate)?;
        } else {
            // Padded rows: one row at a time (the same row dot, so the same bits per row).
            for (i, yi) in y.chunks_mut(1).enumerate() {
                let start = (rows.start + i) * self.stride;
                gemv_rows(
                    self.fmt,
                    &self.w[start..start + self.row_bytes],
                    self.k,
                    self.act,
                    yi,
                    self.accumulate,
                )?;
            }
        }
        Ok(0)
    }
}

fn check_x_len(k: usize, x: &[f32]) -> Result<(), ExecError> {
    if x.len() != k {
        return Err(ExecError::Shape {
            what: "x",
            need: k,
            got: x.len(),
        });
    }
    Ok(())
}

/// One matrix of [`CpuPool::gemv_batch`] (`y (+)= w · x`, `w` holding `y.len()` rows) or of
/// [`CpuPool::gemv_tokens`] (`y[t·m..(t+1)·m] (+)= w · x_t` for every token `t`, `w` holding
/// `m = y.len() / tokens` rows).
pub struct GemvSegment<'a> {
    /// The matrix (whole rows of the call's format and `k`).
    pub w: &'a [u8],
    /// Its output: `m` values, or `tokens × m` token-major for `gemv_tokens`.
    pub y: &'a mut [f32],
    /// Add into `y` instead of overwriting it.
    pub accumulate: bool,
}

/// A segment of a batched job: rows `[start, start + y_len)` of the batch's row space.
struct BatchPart<'a> {
    start: usize,
    w: &'a [u8],
    /// `y.as_mut_ptr()` of the segment's `&mut [f32]`, exclusively borrowed for the call.
    y: *mut f32,
    y_len: usize,
    accumulate: bool,
}

struct BatchGemvJob<'a> {
    fmt: Format,
    k: usize,
    row_bytes: usize,
    act: &'a ActivationBuf,
    parts: Vec<BatchPart<'a>>,
}

// SAFETY: workers write only the rows of each segment's `y` that fall in their own disjoint range
// of the batch's row space (`partition`), and only read `w`/`act`; the caller's `&mut` borrows of
// every `y` last the whole call.
unsafe impl Sync for BatchGemvJob<'_> {}

impl PoolJob for BatchGemvJob<'_> {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        for p in &self.parts {
            let lo = rows.start.max(p.start);
            let hi = rows.end.min(p.start + p.y_len);
            if lo >= hi {
                continue;
            }
            let (a, b) = (lo - p.start, hi - p.start);
            // SAFETY: `a..b` lies inside the segment (`lo`/`hi` clamped to it) and inside this
            // worker's disjoint range; the pointer comes from a live `&mut [f32]` of length
            // `y_len` held by the blocked caller.
            let y = unsafe { std::slice::from_raw_parts_mut(p.y.add(a), b - a) };
            let w = &p.w[a * self.row_bytes..b * self.row_bytes];
            gemv_rows(self.fmt, w, self.k, self.act, y, p.accumulate)?;
        }
        Ok(0)
    }
}

/// Weight bytes per row tile of [`CpuPool::gemv_tokens`]: every token runs over one tile before
/// the next, so the tile should stay in L1 (32–48 KiB per core on current x86) next to the
/// tokens' prepared activations (T × ~1.1·k bytes for the q8 formats, from L2). Measured on the
/// 2-core VM (SmolLM2 Q4_1, 128-token prefill, 2026-11-29): 4 KiB 492–506, 16 KiB 518–520,
/// 64 KiB 499–526 tok/s — flat within noise, the row dots being compute-bound once each tile is
/// reused by 32 tokens.
pub const TOKEN_TILE_BYTES: usize = 16 * 1024;

/// A segment of a multi-token job: rows `[start, start + m)` of the job's row space.
struct TokenPart<'a> {
    start: usize,
    /// Rows of this segment (its output holds `tokens × m`).
    m: usize,
    w: &'a [u8],
    /// `y.as_mut_ptr()` of the segment's `&mut [f32]` (`tokens × m`), exclusively borrowed for
    /// the call.
    y: *mut f32,
    accumulate: bool,
}

/// Tokens one [`TokenGemvJob`] tile hands to `gemv_rows_multi` at once: the tiled AVX-512 VNNI
/// Q4_K kernel's pass (32), which transposes each 16 rows once for all of them; the other
/// multi-activation kernels take them eight at a time over the tile, as before.
const TOKEN_GROUP: usize = 32;

/// Rows of one [`TokenGemvJob`] tile: [`TOKEN_TILE_BYTES`] of rows, rounded up to whole groups of
/// `hipfire_quant::MULTI_ROW_TILE` (Q4_K at k = 14336 is 8 KiB a row: two rows would leave the
/// tiled kernel nothing to tile).
pub(super) fn token_tile_rows(row_bytes: usize) -> usize {
    let rows = (TOKEN_TILE_BYTES / row_bytes.max(1)).max(1);
    rows.div_ceil(hipfire_quant::MULTI_ROW_TILE) * hipfire_quant::MULTI_ROW_TILE
}

struct TokenGemvJob<'a> {
    fmt: Format,
    k: usize,
    row_bytes: usize,
    /// Rows per tile (≥ 1).
    tile_rows: usize,
    /// One activation per token, prepared by the job's workers.
    acts: TokenActs<'a>,
    /// The bf16 GEMM's engine when the tokens go to AMX (then `acts` packs them to bf16).
    engine: Option<AmxEngine>,
    parts: Vec<TokenPart<'a>>,
}

/// Spins of a worker waiting for the other workers' activations before it yields its core
/// between checks: a token's preparation takes microseconds, so the wait is short unless a
/// core is oversubscribed (the 2-core CI runner), where yielding lets the preparing thread run.
/// Chosen, not tuned.
const PREPARE_SPINS_BEFORE_YIELD: usize = 1 << 12;

/// The tokens' activations of one [`CpuPool::gemv_tokens`] call, prepared by the job's workers
/// together: each takes tokens off a counter, then waits until every token is prepared, so the
/// preparation costs about one token's time instead of all of them one after another on the
/// caller. Serial on the caller, it held the batched CPU arm on the H200 box (8 columns of
/// Llama-3-8B, 16 threads) at 26–35 GB/s where the kernel alone read 58
/// (docs/perf-checkpoints/2026-12-01-multi-column-kernels-h200).
///
/// A worker that took a token always counts it (a guard, on error or panic too), and tokens are
/// taken by whichever workers run, so the wait ends as long as one worker of the job runs.
struct TokenActs<'a> {
    fmt: Format,
    k: usize,
    /// `tokens × k`.
    xs: &'a [f32],
    tokens: usize,
    /// The q8 activations (empty when the tokens are packed to bf16 instead).
    slots: Vec<OnceLock<ActivationBuf>>,
    /// The tokens in bf16 for the AMX GEMM, packed by the workers.
    bf16: Option<Bf16Tokens>,
    /// The next token to take, and the tokens taken and finished (each on its own line: every
    /// worker updates both).
    next: CachePadded<AtomicUsize>,
    done: CachePadded<AtomicUsize>,
    failed: AtomicBool,
    /// The first preparation error, for the worker that returns it.
    error: Mutex<Option<ExecError>>,
}

/// Counts one finished token when dropped (also while unwinding).
struct CountDone<'a>(&'a AtomicUsize);

impl Drop for CountDone<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

impl<'a> TokenActs<'a> {
    fn new(fmt: Format, k: usize, xs: &'a [f32], bf16: Option<Bf16Tokens>) -> TokenActs<'a> {
        let tokens = xs.len() / k.max(1);
        let q8 = if bf16.is_some() { 0 } else { tokens };
        TokenActs {
            fmt,
            k,
            xs,
            tokens,
            slots: (0..q8).map(|_| OnceLock::new()).collect(),
            bf16,
            next: CachePadded::new(AtomicUsize::new(0)),
            done: CachePadded::new(AtomicUsize::new(0)),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    /// Prepare tokens off the counter until none is left, wait for the other workers' tokens,
    /// and return every token's q8 activation in token order (none when they are packed to
    /// bf16: [`TokenActs::bf16`] holds them then).
    fn ready(&self) -> Result<Vec<&ActivationBuf>, ExecError> {
        let n = self.tokens;
        loop {
            let t = self.next.fetch_add(1, Ordering::Relaxed);
            if t >= n {
                break;
            }
            let _count = CountDone(&self.done);
            let x = &self.xs[t * self.k..(t + 1) * self.k];
            let prepared = match &self.bf16 {
                Some(b) => b.pack_token(t, x),
                // The counter hands token t out once, so its slot is empty.
                None => ActivationBuf::prepare(self.fmt, x).map(|act| {
                    let _ = self.slots[t].set(act);
                }),
            };
            match prepared {
                Ok(()) => {}
                Err(e) => {
                    self.failed.store(true, Ordering::Relaxed);
                    if let Ok(mut slot) = self.error.lock() {
                        slot.get_or_insert(e.into());
                    }
                }
            }
        }
        let mut spins = 0usize;
        while self.done.load(Ordering::Acquire) < n {
            spins += 1;
            if spins < PREPARE_SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if self.failed.load(Ordering::Relaxed) {
            let mine = self.error.lock().ok().and_then(|mut e| e.take());
            return Err(mine.unwrap_or(ExecError::Invalid {
                what: "activation",
                value: "a token that could not be prepared".into(),
                rule: "every value finite (another worker's token failed)",
            }));
        }
        self.slots
            .iter()
            .map(|s| {
                s.get().ok_or(ExecError::Invalid {
                    what: "activation",
                    value: "a token left unprepared".into(),
                    rule: "every token prepared before the multiply",
                })
            })
            .collect()
    }
}

// SAFETY: a worker writes, for every token, only the rows of each segment that fall in the
// chunks of the job's row space it claimed (each chunk is claimed once), and only reads
// `w`/`acts`; the caller's `&mut` borrows of every `y` last the whole call.
unsafe impl Sync for TokenGemvJob<'_> {}

impl PoolJob for TokenGemvJob<'_> {
    fn run(&self, rows: Range<usize>) -> Result<u64, ExecError> {
        let acts = self.acts.ready()?;
        if let (Some(engine), Some(bf16)) = (self.engine, &self.acts.bf16) {
            return self.run_bf16(engine, bf16, rows);
        }
        for p in &self.parts {
            let lo = rows.start.max(p.start);
            let hi = rows.end.min(p.start + p.m);
            let mut a = lo.saturating_sub(p.start);
            let b = hi.saturating_sub(p.start);
            while a < b {
                let e = (a + self.tile_rows).min(b);
                let w = &p.w[a * self.row_bytes..e * self.row_bytes];
                for (g, group) in acts.chunks(TOKEN_GROUP).enumerate() {
                    let t0 = g * TOKEN_GROUP;
                    let refs: [&ActivationBuf; TOKEN_GROUP] =
                        std::array::from_fn(|i| group[i.min(group.len() - 1)]);
                    let mut ys: [&mut [f32]; TOKEN_GROUP] = std::array::from_fn(|i| {
                        if i >= group.len() {
                            return &mut [][..];
                        }
                        // SAFETY: rows `a..e` lie inside the segment (`lo`/`hi` clamped to it)
                        // and inside this run's rows (each claimed once), so `t·m + a ..
                        // t·m + e` (t = t0 + i < tokens) is inside the `tokens × m` output and
                        // written by no other worker, nor aliased by another `ys[i]` (distinct
                        // t); the pointer comes from a live `&mut [f32]` of that length held by
                        // the blocked caller.
                        unsafe {
                            std::slice::from_raw_parts_mut(p.y.add((t0 + i) * p.m + a), e - a)
                        }
                    });
                    let n = group.len();
                    hipfire_quant::gemv_rows_multi(
                        self.fmt,
                        w,
                        self.k,
                        &refs[..n],
                        &mut ys[..n],
                        p.accumulate,
                    )?;
                }
                a = e;
            }
        }
        Ok(0)
    }
}

impl TokenGemvJob<'_> {
    /// This worker's rows of every segment through the bf16 GEMM, all tokens at once (it
    /// walks the rows in panels itself).
    fn run_bf16(
        &self,
        engine: AmxEngine,
        bf16: &Bf16Tokens,
        rows: Range<usize>,
    ) -> Result<u64, ExecError> {
        let tokens = self.acts.tokens;
        for p in &self.parts {
            let lo = rows.start.max(p.start);
            let hi = rows.end.min(p.start + p.m);
            if lo >= hi {
                continue;
            }
            let (a, b) = (lo - p.start, hi - p.start);
            let mut ys: Vec<&mut [f32]> = (0..tokens)
                .map(|t| {
                    // SAFETY: rows `a..b` lie inside the segment and inside this run's rows
                    // (each claimed once), so `t·m + a .. t·m + b` is inside the `tokens × m`
                    // output, written by no other worker and aliased by no other `ys[t]`
                    // (distinct t); the pointer comes from a live `&mut [f32]` of that length
                    // held by the blocked caller.
                    unsafe { std::slice::from_raw_parts_mut(p.y.add(t * p.m + a), b - a) }
                })
                .collect();
            let w = &p.w[a * self.row_bytes..b * self.row_bytes];
            hipfire_quant::gemm_bf16(engine, self.fmt, w, self.k, bf16, &mut ys, p.accumulate)?;
        }
        Ok(0)
    }
}
