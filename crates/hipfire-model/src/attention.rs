//! CPU decode attention over an f16 KV cache: the cache layout and the split-KV kernel.
//!
//! # Layout
//! [`KvLayer`] keeps one layer's cache per KV head, positions contiguous: values as rows
//! `[t][head_dim]`, keys transposed within blocks of [`KV_BLOCK`] positions (`[block][dim][16]`),
//! so the scores of 16 positions are the 16 lanes of one vector and need no horizontal sums.
//!
//! # Work split
//! One query position attends over `n_pos` cached positions. The work is cut into items of one
//! KV head × one chunk of positions ([`chunk_len`]); each item reads each K and V row once for
//! the whole group of query heads that share the KV head (GQA), and leaves a partial softmax
//! (max, sum, weighted V sum) per query head; [`combine`] merges the chunks in a fixed order
//! (flash-decoding's split-KV reduction). Splitting positions, not only heads, keeps both threads
//! of the 2-core box busy on a 3-KV-head model like SmolLM2, and the result depends only on
//! `n_pos`, never on the thread count or which thread ran which item.

use half::f16;

use crate::ops::exp_nonpos;

/// Positions per transposed K block: one AVX-512 vector (two AVX2 vectors) of f32 scores.
pub const KV_BLOCK: usize = 16;
/// Work items one attention call aims for: with 2 threads, ≥ 8 per thread keeps the
/// imbalance of the last item under ~6 % of a call. Chosen, not tuned.
const TARGET_ITEMS: usize = 16;
/// Fewest positions per chunk: below this an item's fixed cost (its partial and the combine)
/// is no longer small against its reads. Chosen, not tuned.
const MIN_CHUNK: usize = 64;
/// Most positions per chunk: keeps an item's scores (`group × chunk` f32, 16 KiB for GQA 8) in
/// L1 while the V pass reads them. Chosen, not tuned.
const MAX_CHUNK: usize = 512;
/// Query heads whose K dots share one pass over a K block (per head, two accumulators).
const Q_TILE: usize = 4;

/// One layer's K/V cache: `n_kv` heads of `head_dim`, f16 (llama.cpp's default cache type).
#[derive(Debug, Clone)]
pub struct KvLayer {
    n_kv: usize,
    hd: usize,
    n_pos: usize,
    /// Per KV head, `ceil(n_pos / 16)` blocks of `[head_dim][16]` keys; lanes past `n_pos` are
    /// zero.
    k: Vec<Vec<f16>>,
    /// Per KV head, `n_pos × head_dim` values.
    v: Vec<Vec<f16>>,
}

impl KvLayer {
    /// An empty cache for `n_kv` heads of `head_dim`.
    pub fn new(n_kv: usize, head_dim: usize) -> KvLayer {
        KvLayer {
            n_kv,
            hd: head_dim,
            n_pos: 0,
            k: vec![Vec::new(); n_kv],
            v: vec![Vec::new(); n_kv],
        }
    }

    /// Positions held.
    pub fn n_pos(&self) -> usize {
        self.n_pos
    }

    /// KV heads.
    pub fn n_kv(&self) -> usize {
        self.n_kv
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.hd
    }

    /// Append one position: `k` and `v` hold every KV head's `head_dim` values (rounded to f16,
    /// to nearest, ties to even).
    ///
    /// # Panics
    /// If `k` or `v` is not `n_kv × head_dim` long (a caller bug: the decoder sizes them).
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        let hd = self.hd;
        assert!(
            k.len() == self.n_kv * hd && v.len() == k.len(),
            "KvLayer::push: k {} / v {} values for {} heads of {hd}",
            k.len(),
            v.len(),
            self.n_kv
        );
        let (blk, lane) = (self.n_pos / KV_BLOCK, self.n_pos % KV_BLOCK);
        for h in 0..self.n_kv {
            let kh = &mut self.k[h];
            if lane == 0 {
                kh.resize((blk + 1) * KV_BLOCK * hd, f16::ZERO);
            }
            let base = blk * KV_BLOCK * hd + lane;
            for (d, &x) in k[h * hd..(h + 1) * hd].iter().enumerate() {
                kh[base + d * KV_BLOCK] = f16::from_f32(x);
            }
            self.v[h].extend(v[h * hd..(h + 1) * hd].iter().map(|&x| f16::from_f32(x)));
        }
        self.n_pos += 1;
    }

    /// Keep the first `n_pos` positions (no-op if it holds fewer); the state is then exactly
    /// what pushing those positions alone would have left.
    pub fn truncate(&mut self, n_pos: usize) {
        if n_pos >= self.n_pos {
            return;
        }
        let hd = self.hd;
        let blocks = n_pos.div_ceil(KV_BLOCK);
        for h in 0..self.n_kv {
            let kh = &mut self.k[h];
            kh.truncate(blocks * KV_BLOCK * hd);
            if n_pos % KV_BLOCK != 0 {
                let b0 = (blocks - 1) * KV_BLOCK * hd;
                for d in 0..hd {
                    kh[b0 + d * KV_BLOCK + n_pos % KV_BLOCK..b0 + (d + 1) * KV_BLOCK]
                        .fill(f16::ZERO);
                }
            }
            self.v[h].truncate(n_pos * hd);
        }
        self.n_pos = n_pos;
    }

    /// Forget every position (keeps allocations).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Makes this one-head cache hold `n_pos` positions given in its own layout as f32: `k` in
    /// transposed blocks (`ceil(n_pos / 16) × head_dim × 16`, lanes past `n_pos` zero) and `v`
    /// as rows (`n_pos × head_dim`), each rounded to f16 (a q8_0 cache's staging,
    /// [`crate::kv_q8::Q8KvLayer::dequantize_into`]).
    ///
    /// # Panics
    /// If the cache has more than one head or the lengths do not match (a caller bug).
    pub(crate) fn set_from_f32(&mut self, n_pos: usize, k: &[f32], v: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let hd = self.hd;
        assert!(
            self.n_kv == 1
                && k.len() == n_pos.div_ceil(KV_BLOCK) * KV_BLOCK * hd
                && v.len() == n_pos * hd,
            "KvLayer::set_from_f32: {n_pos} positions, k {} / v {}",
            k.len(),
            v.len()
        );
        self.k[0].resize(k.len(), f16::ZERO);
        self.k[0].convert_from_f32_slice(k);
        self.v[0].resize(v.len(), f16::ZERO);
        self.v[0].convert_from_f32_slice(v);
        self.n_pos = n_pos;
    }

    /// Key `d` of KV head `h` at position `t`.
    ///
    /// # Panics
    /// If `h`, `t` or `d` is out of range.
    pub fn key(&self, h: usize, t: usize, d: usize) -> f16 {
        assert!(t < self.n_pos && d < self.hd);
        self.k[h][(t / KV_BLOCK) * KV_BLOCK * self.hd + d * KV_BLOCK + t % KV_BLOCK]
    }

    /// Values of KV head `h` at position `t`.
    ///
    /// # Panics
    /// If `h` or `t` is out of range.
    pub fn value_row(&self, h: usize, t: usize) -> &[f16] {
        assert!(t < self.n_pos);
        &self.v[h][t * self.hd..(t + 1) * self.hd]
    }

    /// Every cached value as f32, in the order of [`KvLayer::bits`] (tests compare caches within
    /// a bound where the row dots are not bit-identical).
    #[cfg(test)]
    pub fn values(&self) -> Vec<f32> {
        self.k
            .iter()
            .chain(&self.v)
            .flat_map(|c| c.iter().map(|x| x.to_f32()))
            .collect()
    }

    /// Bit patterns of everything stored (keys, then values, head by head), for exact
    /// comparisons of two caches.
    pub fn bits(&self) -> Vec<u16> {
        self.k
            .iter()
            .chain(&self.v)
            .flat_map(|c| c.iter().map(|x| x.to_bits()))
            .collect()
    }
}

/// How the K/V cache is stored (`model.cache_type`), by a CPU session and by the GPU decoder
/// ([`crate::gpu_kv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheType {
    /// f16 keys and values (llama.cpp's default): 2 bytes a value.
    #[default]
    F16,
    /// q8_0 ([`crate::kv_q8`] on the CPU, dequantised to f16 per work item; [`crate::gpu_kv`] on
    /// the GPU): 34 bytes per 32 values.
    Q8_0,
}

impl CacheType {
    /// Every accepted name.
    pub const NAMES: [&'static str; 2] = ["f16", "q8_0"];

    /// `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            CacheType::F16 => "f16",
            CacheType::Q8_0 => "q8_0",
        }
    }

    /// The type named `name` ([`CacheType::NAMES`]).
    pub fn from_name(name: &str) -> Option<CacheType> {
        match name {
            "f16" => Some(CacheType::F16),
            "q8_0" => Some(CacheType::Q8_0),
            _ => None,
        }
    }

    /// Bytes of `values` cached values (a multiple of 32 for q8_0).
    pub fn bytes(self, values: usize) -> usize {
        match self {
            CacheType::F16 => values * 2,
            CacheType::Q8_0 => values / crate::kv_q8::Q8_BLOCK * crate::kv_q8::Q8_BYTES_PER_32,
        }
    }
}

/// One layer's cache of a CPU session, in its [`CacheType`].
#[derive(Debug, Clone)]
pub enum KvCache {
    /// f16, read by the attention kernels as it is.
    F16(KvLayer),
    /// q8_0, dequantised per work item.
    Q8(crate::kv_q8::Q8KvLayer),
}

impl KvCache {
    /// An empty cache of `ty` for `n_kv` heads of `head_dim`; `None` for q8_0 when `head_dim`
    /// is not a multiple of 32.
    pub fn new(ty: CacheType, n_kv: usize, head_dim: usize) -> Option<KvCache> {
        match ty {
            CacheType::F16 => Some(KvCache::F16(KvLayer::new(n_kv, head_dim))),
            CacheType::Q8_0 => crate::kv_q8::Q8KvLayer::new(n_kv, head_dim).map(KvCache::Q8),
        }
    }

    /// Positions held.
    pub fn n_pos(&self) -> usize {
        match self {
            KvCache::F16(c) => c.n_pos(),
            KvCache::Q8(c) => c.n_pos(),
        }
    }

    /// Append one position (see [`KvLayer::push`]).
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        match self {
            KvCache::F16(c) => c.push(k, v),
            KvCache::Q8(c) => c.push(k, v),
        }
    }

    /// Keep the first `n_pos` positions (see [`KvLayer::truncate`]).
    pub fn truncate(&mut self, n_pos: usize) {
        match self {
            KvCache::F16(c) => c.truncate(n_pos),
            KvCache::Q8(c) => c.truncate(n_pos),
        }
    }

    /// Forget every position (keeps allocations).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Bit patterns of everything stored, for exact comparisons of two caches.
    pub fn bits(&self) -> Vec<u16> {
        match self {
            KvCache::F16(c) => c.bits(),
            KvCache::Q8(c) => c.bits(),
        }
    }

    /// Every cached value as f32 (see [`KvLayer::values`]).
    #[cfg(test)]
    pub fn values(&self) -> Vec<f32> {
        match self {
            KvCache::F16(c) => c.values(),
            KvCache::Q8(c) => c.dequantized(),
        }
    }
}

/// Positions per work item for a context of `n_pos` over `n_kv` KV heads: about
/// `TARGET_ITEMS` items, a multiple of [`KV_BLOCK`], within `MIN_CHUNK`..=`MAX_CHUNK`.
pub fn chunk_len(n_pos: usize, n_kv: usize) -> usize {
    let per_head = TARGET_ITEMS.div_ceil(n_kv.max(1));
    n_pos
        .div_ceil(per_head)
        .next_multiple_of(KV_BLOCK)
        .clamp(MIN_CHUNK, MAX_CHUNK)
}

/// How one query's attention over positions `first..n_pos` is cut into chunks: the first
/// chunk starts at `first` rounded down to a [`KV_BLOCK`] (its positions before `first` are
/// masked by [`attend_chunk`]), every chunk is [`chunk_len`] of the attended span long.
/// A global layer has `first = 0`; a sliding-window layer `first = n_pos − window` (if > 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    start: usize,
    first: usize,
    end: usize,
    /// Positions per chunk.
    pub chunk: usize,
    /// Chunks.
    pub n_chunks: usize,
}

impl Split {
    /// The split of `first..n_pos` (`first < n_pos`) over `n_kv` KV heads.
    pub fn new(first: usize, n_pos: usize, n_kv: usize) -> Split {
        let start = first / KV_BLOCK * KV_BLOCK;
        let chunk = chunk_len(n_pos - start, n_kv);
        Split {
            start,
            first,
            end: n_pos,
            chunk,
            n_chunks: (n_pos - start).div_ceil(chunk),
        }
    }

    /// Chunk `ci`'s positions `(t0, t1)` and its first attended one (for [`attend_chunk`]).
    pub fn range(&self, ci: usize) -> ((usize, usize), usize) {
        let t0 = self.start + ci * self.chunk;
        let t1 = (t0 + self.chunk).min(self.end);
        ((t0, t1), t0.max(self.first))
    }
}

/// Most query heads one shared [`Job`] runs together: their scores at the longest chunk
/// (32 × 512 f32, 64 KiB) stay in L2 beside the chunk's K and V rows, which they all reuse.
/// Chosen, not tuned.
pub const SHARED_HEADS_MAX: usize = 32;

/// One KV head's chunk of positions for the queries that attend exactly that chunk — the same
/// positions from the same first attended one in the same cache — so its K and V rows are read
/// once for all of them (a prompt chunk's queries share every chunk but their last). Each
/// query's partial is the one [`attend_chunk`] gives for it alone: the kernels treat every
/// query head on its own, so sharing changes no bit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// KV head.
    pub h: usize,
    /// Chunk index in each member's [`Split`].
    pub ci: usize,
    /// The members: indices into the queries given to [`plan_jobs`].
    pub queries: std::ops::Range<usize>,
}

/// The jobs of queries with splits `splits` (query `t` in cache `cache[t]`) over `n_kv` KV heads
/// with `group` query heads each, and the member list their `queries` ranges index. Consecutive
/// queries of one cache with the same split start and chunk length share each chunk they both
/// attend in full; at most `max(1, SHARED_HEADS_MAX / group)` queries a job. The jobs of one
/// chunk are adjacent, so a thread's consecutive jobs reuse its K and V rows from cache.
pub fn plan_jobs(
    splits: &[Split],
    cache: &[usize],
    n_kv: usize,
    group: usize,
) -> (Vec<Job>, Vec<usize>) {
    let per_job = (SHARED_HEADS_MAX / group.max(1)).max(1);
    let (mut jobs, mut members) = (Vec::new(), Vec::new());
    let mut a = 0;
    while a < splits.len() {
        // A run of queries whose chunk boundaries coincide.
        let same = |t: usize| {
            cache[t] == cache[a]
                && splits[t].start == splits[a].start
                && splits[t].chunk == splits[a].chunk
        };
        let b = (a..splits.len())
            .find(|&t| !same(t))
            .unwrap_or(splits.len());
        let most = splits[a..b].iter().map(|s| s.n_chunks).max().unwrap_or(0);
        for h in 0..n_kv {
            for ci in 0..most {
                let mut shared = Vec::new();
                for (t, sp) in splits.iter().enumerate().take(b).skip(a) {
                    if ci >= sp.n_chunks {
                        continue;
                    }
                    let ((t0, t1), lo) = sp.range(ci);
                    if t1 - t0 == sp.chunk && lo == t0 {
                        shared.push(t);
                    } else {
                        members.push(t);
                        jobs.push(Job {
                            h,
                            ci,
                            queries: members.len() - 1..members.len(),
                        });
                    }
                }
                for ts in shared.chunks(per_job) {
                    let from = members.len();
                    members.extend_from_slice(ts);
                    jobs.push(Job {
                        h,
                        ci,
                        queries: from..members.len(),
                    });
                }
            }
        }
        a = b;
    }
    (jobs, members)
}

/// Floats of one query head's partial: max, sum, then `head_dim` weighted values.
pub fn partial_len(head_dim: usize) -> usize {
    head_dim + 2
}

/// Which kernel [`attend_chunk`] runs, chosen once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

fn tier() -> Tier {
    static TIER: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();
    *TIER.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            // The AVX-512 tier falls back to the AVX2 kernels for head sizes that are not a
            // multiple of 16, so it needs both.
            if avx2 && is_x86_feature_detected!("avx512f") {
                return Tier::Avx512;
            }
            if avx2 {
                return Tier::Avx2;
            }
        }
        Tier::Portable
    })
}

/// One work item: the query heads `q` (`group × head_dim`, the group sharing KV head `h`) over
/// positions `t0..t1` of `kv`, of which `t0..first` are left out of the softmax; scores scaled
/// by `scale`. Writes each head's partial (max, sum of exponentials, `Σ_t e^(s_t − max) v_t`)
/// to `part` (`group × partial_len`). `scores` is scratch.
///
/// A global layer's chunk, and every chunk of a sliding window but the one that holds its
/// start, has `first = t0`; that one has `t0` a multiple of [`KV_BLOCK`] and `first` the
/// window's first position ([`Split::range`] gives both).
///
/// # Panics
/// If the ranges are inconsistent (`t0` not a multiple of [`KV_BLOCK`], `first` not in
/// `t0..t1`, `t1` past the cache, `q` or `part` of the wrong length): a caller bug.
#[allow(clippy::too_many_arguments)]
pub fn attend_chunk(
    q: &[f32],
    kv: &KvLayer,
    h: usize,
    (t0, t1): (usize, usize),
    first: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    let hd = kv.hd;
    let group = q.len() / hd;
    assert!(
        h < kv.n_kv
            && t0 % KV_BLOCK == 0
            && t0 <= first
            && first < t1
            && t1 <= kv.n_pos
            && q.len() == group * hd
            && part.len() == group * partial_len(hd),
        "attend_chunk: head {h}, positions {t0}..{t1} (from {first}) of {}, q {}, part {}",
        kv.n_pos,
        q.len(),
        part.len()
    );
    run_tier(tier(), q, kv, h, (t0, t1), first, scale, scores, part);
}

#[allow(clippy::too_many_arguments)]
fn run_tier(
    tier: Tier,
    q: &[f32],
    kv: &KvLayer,
    h: usize,
    range: (usize, usize),
    first: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    let hd = kv.hd;
    let group = q.len() / hd;
    let len = (range.1 - range.0).next_multiple_of(KV_BLOCK);
    scores.clear();
    scores.resize(group * len, f32::NEG_INFINITY);
    match tier {
        // SAFETY: the features were detected by `tier`; `attend_chunk` checked the ranges, so
        // every block and row read lies inside `kv`'s head `h`, and `scores` is `group × len`.
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512 if hd % 16 == 0 => unsafe {
            x86::scores_avx512(q, kv, h, range, scale, scores)
        },
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 | Tier::Avx512 if hd % 8 == 0 => unsafe {
            x86::scores_avx2(q, kv, h, range, scale, scores)
        },
        _ => scores_portable(q, kv, h, range, scale, scores),
    }
    // Lanes past t1 in the last block are keys of positions not attended, and so are those
    // before a sliding window's first position: out of the softmax (each exponential is 0).
    let n = range.1 - range.0;
    let skip = first - range.0;
    for s in scores.chunks_exact_mut(len) {
        s[..skip].fill(f32::NEG_INFINITY);
        s[n..].fill(f32::NEG_INFINITY);
    }
    let pl = partial_len(hd);
    for (s, p) in scores.chunks_exact_mut(len).zip(part.chunks_exact_mut(pl)) {
        let m = s[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        crate::ops::exp_sub_inplace(s, m);
        p[0] = m;
        p[1] = crate::ops::sum_f32(&s[..n]);
    }
    match tier {
        // SAFETY: as above; `part` is `group × (hd + 2)` (checked by `attend_chunk`).
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512 if hd % 16 == 0 => unsafe {
            x86::values_avx512(kv, h, range, scores, len, part)
        },
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 | Tier::Avx512 if hd % 8 == 0 => unsafe {
            x86::values_avx2(kv, h, range, scores, len, part)
        },
        _ => values_portable(kv, h, range, scores, len, part),
    }
}

/// Scores without intrinsics: `scores[j·len + (t − t0)] = scale · q_j · k_t`.
fn scores_portable(
    q: &[f32],
    kv: &KvLayer,
    h: usize,
    (t0, t1): (usize, usize),
    scale: f32,
    scores: &mut [f32],
) {
    let hd = kv.hd;
    let len = scores.len() / (q.len() / hd);
    let kh = &kv.k[h];
    for t in t0..t1 {
        let base = (t / KV_BLOCK) * KV_BLOCK * hd + t % KV_BLOCK;
        for (j, qj) in q.chunks_exact(hd).enumerate() {
            let mut acc = 0f32;
            for (d, &x) in qj.iter().enumerate() {
                acc += x * kh[base + d * KV_BLOCK].to_f32();
            }
            scores[j * len + t - t0] = acc * scale;
        }
    }
}

/// Weighted values without intrinsics: `part[j] = Σ_t p_jt v_t` after the max and sum.
fn values_portable(
    kv: &KvLayer,
    h: usize,
    (t0, t1): (usize, usize),
    p: &[f32],
    len: usize,
    part: &mut [f32],
) {
    let hd = kv.hd;
    for (j, pj) in part.chunks_exact_mut(partial_len(hd)).enumerate() {
        let acc = &mut pj[2..];
        acc.fill(0.0);
        for t in t0..t1 {
            let w = p[j * len + t - t0];
            for (a, &x) in acc.iter_mut().zip(&kv.v[h][t * hd..(t + 1) * hd]) {
                *a += w * x.to_f32();
            }
        }
    }
}

/// Merge the partials of one query head over its chunks (in chunk order) into `out`
/// (`head_dim` values): `Σ_c e^(m_c − M) acc_c / Σ_c e^(m_c − M) l_c`.
pub fn combine<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, out: &mut [f32]) {
    combine_with_sink(parts, None, out);
}

/// [`combine`] with an attention sink: a logit `s` in the softmax that has no value, so the
/// denominator gains `e^(s − M)` (`M` the largest of the chunks' maxima and `s`), as ggml's
/// `soft_max` with sinks does (gpt-oss).
pub fn combine_with_sink<'a>(
    parts: impl Iterator<Item = &'a [f32]> + Clone,
    sink: Option<f32>,
    out: &mut [f32],
) {
    let m = parts
        .clone()
        .map(|p| p[0])
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    out.fill(0.0);
    let mut l = sink.map_or(0.0, |s| exp_nonpos(s - m));
    for p in parts {
        let w = exp_nonpos(p[0] - m);
        l += w * p[1];
        for (o, &a) in out.iter_mut().zip(&p[2..]) {
            *o += w * a;
        }
    }
    let inv = 1.0 / l;
    out.iter_mut().for_each(|o| *o *= inv);
}

// The AVX-512 intrinsics are stable from Rust 1.89, past the workspace's declared 1.85;
// hipfire-quant's AVX-512 dots (dot/avx512.rs) already use them inside macros, where the lint
// does not look, so the workspace needs 1.89 in practice either way.
#[allow(clippy::incompatible_msrv)]
#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The kernels with hardware f16 conversion: AVX-512F (16 lanes, one K block row per
    //! vector) and AVX2 + FMA + F16C (two 8-lane vectors per K block row).

    use std::arch::x86_64::*;

    use super::{partial_len, KvLayer, KV_BLOCK, Q_TILE};

    /// [`super::scores_portable`] in AVX-512: two blocks at a time, `Q_TILE` query heads at a
    /// time, one accumulator per head and block. Each lane sums its dims in order with FMAs, as
    /// [`scores_avx2`] does, so the two tiers give bit-identical scores (and, with the same V
    /// order, identical logits); the second block is what overlaps the FMA chains.
    ///
    /// # Safety
    /// AVX-512F is present; `t0` is a multiple of [`KV_BLOCK`], `t1 ≤ kv.n_pos`, `h < kv.n_kv`;
    /// `kv.hd % 16 == 0`; `scores` is `group × len` with `len = (t1 − t0)` rounded up to 16.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores_avx512(
        q: &[f32],
        kv: &KvLayer,
        h: usize,
        (t0, t1): (usize, usize),
        scale: f32,
        scores: &mut [f32],
    ) {
        let hd = kv.hd;
        let group = q.len() / hd;
        let len = scores.len() / group;
        let kp = kv.k[h].as_ptr();
        let sv = _mm512_set1_ps(scale);
        let (b0, b1) = (t0 / KV_BLOCK, t1.div_ceil(KV_BLOCK));
        let mut b = b0;
        while b < b1 {
            // Blocks b and (when there is one) b + 1; a lone last block runs its twin over
            // itself and drops the copy.
            let nb = (b1 - b).min(2);
            // SAFETY: blocks b, b + nb − 1 < ceil(n_pos / 16) exist (each hd × 16 keys).
            let kb =
                [0, nb - 1].map(|i| unsafe { kp.add((b + i) * KV_BLOCK * hd) } as *const __m256i);
            for j0 in (0..group).step_by(Q_TILE) {
                let nq = (group - j0).min(Q_TILE);
                let mut acc = [_mm512_setzero_ps(); 2 * Q_TILE];
                for d in 0..hd {
                    // SAFETY: row d < hd of each block.
                    let (k0, k1) = unsafe {
                        (
                            _mm512_cvtph_ps(_mm256_loadu_si256(kb[0].add(d))),
                            _mm512_cvtph_ps(_mm256_loadu_si256(kb[1].add(d))),
                        )
                    };
                    for j in 0..nq {
                        let w = _mm512_set1_ps(q[(j0 + j) * hd + d]);
                        acc[2 * j] = _mm512_fmadd_ps(w, k0, acc[2 * j]);
                        acc[2 * j + 1] = _mm512_fmadd_ps(w, k1, acc[2 * j + 1]);
                    }
                }
                for i in 0..nb {
                    let col = (b + i) * KV_BLOCK - t0;
                    for j in 0..nq {
                        let row = (j0 + j) * len + col;
                        let dst = &mut scores[row..row + KV_BLOCK];
                        // SAFETY: `dst` is 16 floats (col + 16 ≤ len).
                        unsafe {
                            _mm512_storeu_ps(dst.as_mut_ptr(), _mm512_mul_ps(acc[2 * j + i], sv))
                        };
                    }
                }
            }
            b += nb;
        }
    }

    /// [`super::values_portable`] in AVX-512: 64 dims (4 vectors) × `Q_TILE` heads of
    /// accumulators per pass over the chunk's V rows.
    ///
    /// # Safety
    /// As [`scores_avx512`]; `part` is `group × (hd + 2)`, `p` is `group × len`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn values_avx512(
        kv: &KvLayer,
        h: usize,
        (t0, t1): (usize, usize),
        p: &[f32],
        len: usize,
        part: &mut [f32],
    ) {
        const VECS: usize = 4;
        let hd = kv.hd;
        let pl = partial_len(hd);
        let group = part.len() / pl;
        let vp = kv.v[h].as_ptr();
        for j0 in (0..group).step_by(Q_TILE) {
            let nq = (group - j0).min(Q_TILE);
            for c0 in (0..hd / 16).step_by(VECS) {
                let nv = (hd / 16 - c0).min(VECS);
                let mut acc = [_mm512_setzero_ps(); VECS * Q_TILE];
                for t in t0..t1 {
                    let mut x = [_mm512_setzero_ps(); VECS];
                    for (c, xc) in x.iter_mut().enumerate().take(nv) {
                        // SAFETY: row t < n_pos, dims (c0 + c)·16 .. +16 ≤ hd.
                        *xc = unsafe {
                            _mm512_cvtph_ps(_mm256_loadu_si256(
                                vp.add(t * hd + (c0 + c) * 16) as *const __m256i
                            ))
                        };
                    }
                    for j in 0..nq {
                        let w = _mm512_set1_ps(p[(j0 + j) * len + t - t0]);
                        for c in 0..nv {
                            acc[j * VECS + c] = _mm512_fmadd_ps(w, x[c], acc[j * VECS + c]);
                        }
                    }
                }
                for j in 0..nq {
                    for c in 0..nv {
                        let o = &mut part[(j0 + j) * pl + 2 + (c0 + c) * 16..][..16];
                        // SAFETY: `o` is 16 floats.
                        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc[j * VECS + c]) };
                    }
                }
            }
        }
    }

    /// [`scores_avx512`] with AVX2 + FMA + F16C: a block row is two 8-lane vectors, so each
    /// head keeps two accumulators (low and high 8 positions).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; otherwise as [`scores_avx512`] with `kv.hd % 8 == 0`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores_avx2(
        q: &[f32],
        kv: &KvLayer,
        h: usize,
        (t0, t1): (usize, usize),
        scale: f32,
        scores: &mut [f32],
    ) {
        let hd = kv.hd;
        let group = q.len() / hd;
        let len = scores.len() / group;
        let kp = kv.k[h].as_ptr();
        let sv = _mm256_set1_ps(scale);
        for b in t0 / KV_BLOCK..t1.div_ceil(KV_BLOCK) {
            // SAFETY: as in `scores_avx512`; each block row is 16 f16 = two 128-bit halves.
            let kb = unsafe { kp.add(b * KV_BLOCK * hd) } as *const __m128i;
            let col = b * KV_BLOCK - t0;
            for j0 in (0..group).step_by(Q_TILE) {
                let nq = (group - j0).min(Q_TILE);
                let mut acc = [_mm256_setzero_ps(); 2 * Q_TILE];
                for d in 0..hd {
                    // SAFETY: row d < hd of the block.
                    let (lo, hi) = unsafe {
                        (
                            _mm256_cvtph_ps(_mm_loadu_si128(kb.add(2 * d))),
                            _mm256_cvtph_ps(_mm_loadu_si128(kb.add(2 * d + 1))),
                        )
                    };
                    for j in 0..nq {
                        let w = _mm256_set1_ps(q[(j0 + j) * hd + d]);
                        acc[2 * j] = _mm256_fmadd_ps(w, lo, acc[2 * j]);
                        acc[2 * j + 1] = _mm256_fmadd_ps(w, hi, acc[2 * j + 1]);
                    }
                }
                for j in 0..nq {
                    let row = (j0 + j) * len + col;
                    let dst = &mut scores[row..row + KV_BLOCK];
                    // SAFETY: `dst` is 16 floats.
                    unsafe {
                        _mm256_storeu_ps(dst.as_mut_ptr(), _mm256_mul_ps(acc[2 * j], sv));
                        _mm256_storeu_ps(
                            dst.as_mut_ptr().add(8),
                            _mm256_mul_ps(acc[2 * j + 1], sv),
                        );
                    }
                }
            }
        }
    }

    /// [`values_avx512`] with AVX2 + FMA + F16C: 32 dims (4 vectors) × 3 heads of accumulators
    /// per pass (12 of the 16 registers).
    ///
    /// # Safety
    /// As [`scores_avx2`]; `part` is `group × (hd + 2)`, `p` is `group × len`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn values_avx2(
        kv: &KvLayer,
        h: usize,
        (t0, t1): (usize, usize),
        p: &[f32],
        len: usize,
        part: &mut [f32],
    ) {
        const VECS: usize = 4;
        const HEADS: usize = 3;
        let hd = kv.hd;
        let pl = partial_len(hd);
        let group = part.len() / pl;
        let vp = kv.v[h].as_ptr();
        for j0 in (0..group).step_by(HEADS) {
            let nq = (group - j0).min(HEADS);
            for c0 in (0..hd / 8).step_by(VECS) {
                let nv = (hd / 8 - c0).min(VECS);
                let mut acc = [_mm256_setzero_ps(); VECS * HEADS];
                for t in t0..t1 {
                    let mut x = [_mm256_setzero_ps(); VECS];
                    for (c, xc) in x.iter_mut().enumerate().take(nv) {
                        // SAFETY: row t < n_pos, dims (c0 + c)·8 .. +8 ≤ hd.
                        *xc = unsafe {
                            _mm256_cvtph_ps(_mm_loadu_si128(
                                vp.add(t * hd + (c0 + c) * 8) as *const __m128i
                            ))
                        };
                    }
                    for j in 0..nq {
                        let w = _mm256_set1_ps(p[(j0 + j) * len + t - t0]);
                        for c in 0..nv {
                            acc[j * VECS + c] = _mm256_fmadd_ps(w, x[c], acc[j * VECS + c]);
                        }
                    }
                }
                for j in 0..nq {
                    for c in 0..nv {
                        let o = &mut part[(j0 + j) * pl + 2 + (c0 + c) * 8..][..8];
                        // SAFETY: `o` is 8 floats.
                        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc[j * VECS + c]) };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Every tier the CPU has, then the portable code.
    fn tiers() -> Vec<Tier> {
        let mut t = vec![Tier::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                t.push(Tier::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                t.push(Tier::Avx512);
            }
        }
        assert_eq!(t.last(), Some(&tier()), "the dispatch picks the best tier");
        t
    }

    /// Every (query, KV head, chunk) item of the splits appears in exactly one job; a shared
    /// job's members attend the same positions of the same cache.
    #[test]
    fn jobs_cover_every_item_once_and_share_only_equal_ranges() {
        // A prompt chunk of 40 queries from depth 300 in cache 0 (chunk lengths change with
        // depth), a sliding-window layer's queries in cache 1, decode queries in caches 2 and 3.
        let mut splits = Vec::new();
        let mut cache = Vec::new();
        for n_pos in 301..=340 {
            splits.push(Split::new(0, n_pos, 3));
            cache.push(0);
        }
        for n_pos in 600..=620 {
            splits.push(Split::new(n_pos - 500, n_pos, 3));
            cache.push(1);
        }
        splits.push(Split::new(0, 5000, 3));
        cache.push(2);
        splits.push(Split::new(0, 5000, 3));
        cache.push(3);
        for group in [1, 3, 8, 40] {
            let (jobs, members) = plan_jobs(&splits, &cache, 3, group);
            let mut seen = std::collections::HashSet::new();
            let mut shared = 0;
            for j in &jobs {
                let ts = &members[j.queries.clone()];
                assert!(!ts.is_empty() && ts.len() <= (SHARED_HEADS_MAX / group).max(1));
                let first = (cache[ts[0]], splits[ts[0]].range(j.ci));
                for &t in ts {
                    assert!(j.ci < splits[t].n_chunks);
                    assert_eq!((cache[t], splits[t].range(j.ci)), first, "job {j:?}");
                    assert!(
                        seen.insert((t, j.h, j.ci)),
                        "item ({t}, {}, {}) twice",
                        j.h,
                        j.ci
                    );
                }
                shared += usize::from(ts.len() > 1);
            }
            let items: usize = splits.iter().map(|s| 3 * s.n_chunks).sum();
            assert_eq!(seen.len(), items);
            if SHARED_HEADS_MAX / group > 1 {
                assert!(
                    shared > 0,
                    "a prompt chunk's queries share chunks (group {group})"
                );
            }
        }
    }

    /// Split-KV attention of every query head against f64 softmax attention over the same f16
    /// cache: depths 1, odd and 4096 (chunks of several sizes, a partial last block), GQA
    /// ratios 1, 3 and 8, head sizes 64, 128 and an odd-sized 24 (the AVX2-only and portable
    /// paths), on every kernel tier.
    #[test]
    fn split_kv_attention_matches_an_f64_reference() {
        let mut r = ChaCha8Rng::seed_from_u64(21);
        // The last column: first attended position (a sliding window's start; 0 = global),
        // on and off KV_BLOCK boundaries, inside the first chunk and further in.
        for (n_kv, ratio, hd, n_pos, first) in [
            (3usize, 3usize, 64usize, 1usize, 0usize),
            (3, 3, 64, 77, 0),
            (3, 3, 64, 4096, 0),
            (2, 1, 128, 333, 0),
            (1, 8, 128, 4096, 0),
            (2, 8, 64, 17, 0),
            (1, 3, 24, 100, 0),
            (3, 3, 64, 77, 37),
            (1, 4, 256, 600, 88),
            (1, 8, 128, 4096, 3584),
            (1, 3, 24, 100, 99),
            (2, 1, 128, 333, 32),
        ] {
            let mut kv = KvLayer::new(n_kv, hd);
            // Keys and queries big enough that the softmax is far from uniform.
            for _ in 0..n_pos {
                let k: Vec<f32> = (0..n_kv * hd)
                    .map(|_| r.random_range(-2.0f32..2.0))
                    .collect();
                let v: Vec<f32> = (0..n_kv * hd)
                    .map(|_| r.random_range(-1.0f32..1.0))
                    .collect();
                kv.push(&k, &v);
            }
            let n_head = n_kv * ratio;
            let q: Vec<f32> = (0..n_head * hd)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let want: Vec<f64> = (0..n_head)
                .flat_map(|qh| {
                    let h = qh / ratio;
                    let qv = &q[qh * hd..(qh + 1) * hd];
                    let s: Vec<f64> = (first..n_pos)
                        .map(|t| {
                            (0..hd)
                                .map(|d| f64::from(qv[d]) * f64::from(kv.key(h, t, d).to_f32()))
                                .sum::<f64>()
                                * f64::from(scale)
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    let kvr = &kv;
                    (0..hd).map(move |d| {
                        (first..n_pos)
                            .map(|t| e[t - first] / z * f64::from(kvr.value_row(h, t)[d].to_f32()))
                            .sum::<f64>()
                    })
                })
                .collect();
            let mut by_tier = Vec::new();
            for tier in tiers() {
                let split = Split::new(first, n_pos, n_kv);
                let n_chunks = split.n_chunks;
                let pl = partial_len(hd);
                let mut parts = vec![f32::NAN; n_kv * n_chunks * ratio * pl];
                let mut scores = Vec::new();
                for h in 0..n_kv {
                    for c in 0..n_chunks {
                        let item = h * n_chunks + c;
                        let (range, lo) = split.range(c);
                        let part = &mut parts[item * ratio * pl..(item + 1) * ratio * pl];
                        let qg = &q[h * ratio * hd..(h + 1) * ratio * hd];
                        run_tier(tier, qg, &kv, h, range, lo, scale, &mut scores, part);
                    }
                }
                let mut out = vec![f32::NAN; n_head * hd];
                for qh in 0..n_head {
                    let (h, j) = (qh / ratio, qh % ratio);
                    let it = (0..n_chunks).map(|c| {
                        let base = ((h * n_chunks + c) * ratio + j) * pl;
                        &parts[base..base + pl]
                    });
                    combine(it, &mut out[qh * hd..(qh + 1) * hd]);
                }
                for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*g) - w).abs() < 2e-6,
                        "{tier:?} n_kv {n_kv} ratio {ratio} hd {hd} n_pos {n_pos} first {first} [{i}]: \
                         {g} vs {w}"
                    );
                }
                by_tier.push((tier, out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()));
            }
            // The SIMD tiers sum in the same order: the same bits on AVX2 and AVX-512 machines.
            #[cfg(target_arch = "x86_64")]
            {
                let simd: Vec<_> = by_tier
                    .iter()
                    .filter(|(t, _)| *t != Tier::Portable)
                    .collect();
                for w in simd.windows(2) {
                    assert!(
                        w[0].1 == w[1].1,
                        "{:?} and {:?} differ (n_pos {n_pos})",
                        w[0].0,
                        w[1].0
                    );
                }
            }
        }
    }

    /// Truncating leaves exactly the state of pushing fewer positions, and reads see the
    /// pushed values rounded to f16.
    #[test]
    fn truncate_equals_pushing_less() {
        let mut r = ChaCha8Rng::seed_from_u64(5);
        let (n_kv, hd) = (2, 24);
        let rows: Vec<(Vec<f32>, Vec<f32>)> = (0..40)
            .map(|_| {
                (
                    (0..n_kv * hd)
                        .map(|_| r.random_range(-1.0f32..1.0))
                        .collect(),
                    (0..n_kv * hd)
                        .map(|_| r.random_range(-1.0f32..1.0))
                        .collect(),
                )
            })
            .collect();
        let mut full = KvLayer::new(n_kv, hd);
        for (k, v) in &rows {
            full.push(k, v);
        }
        for (t, (k, v)) in rows.iter().enumerate() {
            for h in 0..n_kv {
                for d in 0..hd {
                    assert_eq!(full.key(h, t, d), f16::from_f32(k[h * hd + d]));
                    assert_eq!(full.value_row(h, t)[d], f16::from_f32(v[h * hd + d]));
                }
            }
        }
        for keep in [0usize, 1, 15, 16, 17, 33] {
            let mut a = full.clone();
            a.truncate(keep);
            let mut b = KvLayer::new(n_kv, hd);
            for (k, v) in &rows[..keep] {
                b.push(k, v);
            }
            assert_eq!(a.n_pos(), keep);
            assert_eq!(a.bits(), b.bits(), "keep {keep}");
        }
    }
}
