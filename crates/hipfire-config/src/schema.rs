//! The schema: every key hipfire reads, with its kind, default, rule, env var and docs.
//!
//! Why a static table and not a derive: the same entry feeds validation, `config list`,
//! `--help` text and the generated docs, and a table is the one form all four can iterate.

use crate::value::{CacheType, Device, FlagsXPublish, JoinStrategy, OffloadExec, Value};
use crate::ConfigError;

/// Upper bound on `cpu.threads`: far above any socket today, low enough that a typo
/// (`cpu.threads = 10000`) is refused instead of spawning ten thousand spinning workers.
pub const MAX_THREADS: u64 = 1024;

/// Upper bound on `memory.gpu_layer_budget`. The largest dense models have ~128 repeating
/// layers; 4096 leaves room for anything plausible while catching garbage like `-1` read as u64.
pub const MAX_GPU_LAYERS: u64 = 4096;

/// Largest pinned share of the GPU arm (`memory.offload_passback_share`). The reference system
/// pins in (0, 0.5]: the GPU reads spilled rows over PCIe (~51 GB/s on the H200 box) while the CPU
/// reads host memory faster (~96 GB/s), so the balanced GPU share is below one half; a pin above
/// 0.5 would make the GPU arm the straggler by construction.
pub const MAX_PASSBACK_SHARE: f64 = 0.5;

/// Absolute upper bound on `model.ctx_size`: 2^20 tokens, above the longest trained context of
/// any llama-family model hipfire runs (Llama-3.1's 131072, Qwen's 131072 with YaRN) and low
/// enough that a typo cannot size a KV cache in the terabytes. The model's own
/// `{arch}.context_length` is the tighter bound, applied when the model is loaded.
pub const MAX_CTX_SIZE: u64 = 1 << 20;

/// Upper bound on `model.ubatch`: the batch scratch grows linearly with it (≈ 4.6 MiB a token for
/// Llama-3-8B), and past a few thousand tokens a GEMM step is already compute-bound, so a larger
/// value only costs VRAM.
pub const MAX_UBATCH: u64 = 8192;

/// Upper bound on `sampling.temperature`; beyond ~10 the distribution is uniform noise, so
/// a larger number is almost surely a typo (e.g. 70 for 0.70).
pub const MAX_TEMPERATURE: f64 = 10.0;

/// Smallest nonzero `sampling.top_p` and `sampling.temperature`. The sampler works in f32, whose
/// smallest normal number is ~1.2e-38: `1e-320` parses as a positive f64 but is 0 as an f32, and a
/// temperature of 1e-40 makes every scaled logit infinite. 1e-6 is far below any useful setting
/// (a top-p of 1e-6 already keeps only the most likely token) and far above that cliff.
pub const MIN_SAMPLING_FRACTION: f64 = 1e-6;

/// Default RAM kept free when counting pinned spilled weights against available memory.
/// 4 GiB: room for the OS and the page cache of the mmapped GGUF; the margin hipfire-model's
/// GPU placement applies (`crates/hipfire-model/src/gpu.rs`). A policy choice, not a measurement.
pub const DEFAULT_RAM_MARGIN_MIB: u64 = 4096;

/// The value kind of a key: what text is accepted, and how it is normalised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Exactly one of the listed words (case-insensitive on input, stored lower-case).
    Choice(&'static [&'static str]),
    /// An unsigned integer in `[min, max]`, or the `word` (e.g. `auto`) when one is given.
    Int {
        /// A word accepted instead of a number (`auto`, `random`), if any.
        word: Option<&'static str>,
        /// Smallest accepted integer.
        min: u64,
        /// Largest accepted integer.
        max: u64,
    },
    /// A finite number in the interval `min..max` (ends inclusive as flagged), or exactly
    /// zero when `zero` is set, or the `word` when one is given.
    Float {
        /// A word accepted instead of a number (`auto`), if any.
        word: Option<&'static str>,
        /// Also accept exactly 0 even when the interval excludes it.
        zero: bool,
        /// Lower end of the interval.
        min: f64,
        /// Whether `min` itself is accepted.
        min_inclusive: bool,
        /// Upper end of the interval.
        max: f64,
        /// Whether `max` itself is accepted.
        max_inclusive: bool,
    },
    /// A filesystem path (not required to exist yet), or the `word` when one is given.
    Path {
        /// A word accepted instead of a path (`auto`), if any.
        word: Option<&'static str>,
    },
}

/// One configuration key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeySpec {
    /// Dotted name, `section.key` (or a bare `key` at the top level), as used in TOML and `config get`.
    pub name: &'static str,
    /// Accepted values.
    pub kind: Kind,
    /// The default, in the same text form a user would type.
    pub default: &'static str,
    /// The validation rule in words; quoted in every refusal and in the docs.
    pub rule: &'static str,
    /// The environment variable that sets this key.
    pub env: &'static str,
    /// The CLI flag that sets this key on `run`/`bench`, if any.
    pub flag: Option<&'static str>,
    /// One line (≤ 60 columns) for `-h` and tables.
    pub summary: &'static str,
    /// Full doc text (Markdown) for `--help`, `config explain` and docs/CONFIG.md.
    pub doc: &'static str,
}

/// Every key hipfire reads, in documentation order.
pub static KEYS: &[KeySpec] = &[
    KeySpec {
        name: "device",
        kind: Kind::Choice(Device::NAMES),
        default: "auto",
        rule: "one of auto | cpu | gpu",
        env: "HIPFIRE_DEVICE",
        flag: Some("--device"),
        summary: "Which engines run the model",
        doc: "`auto` uses the GPU when one is found and falls back to the CPU (saying so); `cpu` never \
              touches a GPU; `gpu` refuses to start without one. With a GPU, layers that do not fit \
              in VRAM are spilled to pinned host memory and run as `memory.offload_exec` says.",
    },
    KeySpec {
        name: "cpu.threads",
        kind: Kind::Int { word: Some("auto"), min: 1, max: MAX_THREADS },
        default: "auto",
        rule: "`auto` or an integer in [1, 1024]",
        env: "HIPFIRE_CPU_THREADS",
        flag: Some("--threads"),
        summary: "CPU threads that multiply (auto = physical cores)",
        doc: "Threads that run the CPU's matrix products. On the CPU path the decode thread is one \
              of them and the rest are pinned workers (it would otherwise only wait for them). \
              With a GPU they are all pinned workers, and `auto` uses one fewer than the physical \
              cores, leaving that core to the thread that launches the GPU's work. `auto` is one \
              per physical core: the row dot is memory-bound, and a second hyper-thread on a core \
              adds wake-up latency without adding bandwidth.",
    },
    KeySpec {
        name: "model.ctx_size",
        kind: Kind::Int { word: Some("auto"), min: 1, max: MAX_CTX_SIZE },
        default: "auto",
        rule: "`auto` or an integer in [1, 1048576], and at most the model's trained context",
        env: "HIPFIRE_CTX_SIZE",
        flag: Some("--ctx-size"),
        summary: "Context length in tokens (auto = trained)",
        doc: "Positions one conversation can hold; the KV cache is sized for this many tokens. `auto` \
              is the model's trained context (`{arch}.context_length`, e.g. 8192 for Llama-3-8B). A \
              number above the trained context is refused when the model loads (RoPE scaling, which \
              would stretch it, is not applied past it); 1048576 is the absolute cap. The cache is \
              f16 K and V: `2 × layers × kv_heads × head_dim × 2` bytes a token, 128 KiB for \
              Llama-3-8B (1 GiB at 8192). On the GPU it is counted in free VRAM before \
              `memory.gpu_layer_budget = auto` places layers, and a load whose cache cannot fit is \
              refused with the bytes needed and free; on the CPU it is counted against available \
              RAM. `hipfire bench` sizes the context to its longest test (`-d` plus `-p` or `-n`) \
              unless this is set.",
    },
    KeySpec {
        name: "model.cache_type",
        kind: Kind::Choice(CacheType::NAMES),
        default: "f16",
        rule: "one of f16 | q8_0",
        env: "HIPFIRE_CACHE_TYPE",
        flag: Some("--cache-type"),
        summary: "How the K/V cache is stored (both engines)",
        doc: "`f16` (default, llama.cpp's too): 2 bytes a cached value. `q8_0`: each run of 32 \
              values of a head as 32 int8 and one f16 scale (ggml's q8_0), 34 bytes per 32 \
              values, so a long context takes about half the memory (counted with this size in \
              the RAM check, the GPU placement budget and the server's per-sequence budget). \
              Logits move by the quantisation of K and V: on the CPU against f16 every SmolLM2 \
              argmax stayed equal, worst 3.9 % of the logit range \
              (docs/perf-checkpoints/2026-12-01-cpu-kv-q8-2core); on the GPU, on a synthetic \
              Llama, every argmax equal, worst 1.0 % (docs/perf-checkpoints/\
              2026-12-01-gpu-kv-q8-h200). Speed: the GPU's q8_0 attention runs within about \
              3 % of f16 decode at depth 4096–16384 on the H200 (and 1.15–1.29 × llama.cpp's \
              q8_0 cache); the CPU dequantises each work item to f16 first, so SmolLM2 after \
              2,000 tokens decodes at about half the f16 rate on 2 cores. Choose it when memory, \
              not speed, limits the context. Needs `head_dim` a multiple of 32.",
    },
    KeySpec {
        name: "model.ubatch",
        kind: Kind::Int { word: None, min: 1, max: MAX_UBATCH },
        default: "1024",
        rule: "an integer in [1, 8192] (tokens per batched prefill step)",
        env: "HIPFIRE_UBATCH",
        flag: Some("--ubatch-size"),
        summary: "Tokens per batched prefill step on the GPU",
        doc: "How many prompt tokens the GPU runs through the layers at once (llama.cpp's `-ub`). \
              Each projection of such a step is one GEMM on the tensor cores (the weight expanded \
              to f16 rows in VRAM, multiplied by cuBLAS), and the step's attention is causal over \
              the KV cache; a spilled layer's weights are copied to VRAM once per step, \
              overlapped with the previous layer's GEMMs; a step runs up to 4 micro-batches \
              layer by layer, so a spilled layer is copied once per 4 micro-batches. Larger \
              micro-batches amortise the f16 expansion of each weight over more tokens but need \
              more VRAM scratch (about 0.6 GiB at 1024 for Llama-3-8B, counted before layers are \
              placed); 1024 measured fastest of 256/512/1024 on an H200 for 2048-token prompts. \
              A step of 2 to 16 tokens runs its projections through the multi-column decode \
              GEMV instead (each weight read once, spilled rows split with the CPU as in \
              batched decode); `1` here feeds the prompt token by token through the decode \
              GEMV. The CPU path ignores it (its prefill runs in chunks of its own). Needs libcublas; without it prefill runs token by token and says so in the \
              placement line.",
    },
    KeySpec {
        name: "memory.gpu_layer_budget",
        kind: Kind::Int { word: Some("auto"), min: 0, max: MAX_GPU_LAYERS },
        default: "auto",
        rule: "`auto` or an integer in [0, 4096] (repeating layers kept on the GPU)",
        env: "HIPFIRE_GPU_LAYER_BUDGET",
        flag: Some("--gpu-layer-budget"),
        summary: "Layers kept in VRAM (auto = what fits)",
        doc: "Number of repeating (transformer) layers kept in VRAM. The prefix \
              `[0, n_layers - budget)` is spilled to pinned host memory. `auto` keeps as many as fit \
              in free VRAM after the KV cache and scratch buffers; `0` spills every layer. Unlike \
              llama.cpp's `-ngl`, the output layer and embeddings are not counted.",
    },
    KeySpec {
        name: "memory.n_cpu_moe",
        kind: Kind::Int { word: Some("all"), min: 0, max: MAX_GPU_LAYERS },
        default: "0",
        rule: "`all` or an integer in [0, 4096] (leading layers whose routed experts stay in host memory)",
        env: "HIPFIRE_N_CPU_MOE",
        flag: Some("--n-cpu-moe"),
        summary: "Layers whose MoE experts stay in host RAM",
        doc: "Mixture-of-Experts models only (llama.cpp's `--n-cpu-moe N` and `--cpu-moe`). The \
              routed experts of the first N layers (counted as llama.cpp counts them: every layer, \
              a leading dense layer included) stay in pinned host memory, where the GPU reads the \
              few a token chooses over PCIe (zero-copy); `all` (the flag `--cpu-moe`) keeps every \
              layer's there. Everything else of those layers (attention, router, shared expert) \
              stays placed by `memory.gpu_layer_budget`. Experts not held on the host are resident \
              while VRAM allows (filled from the last layer backwards, then the rest on the host \
              too); this key frees VRAM for the KV cache or for whole layers, at the cost of \
              reading the held experts over the link each token. `0` (default) holds none. The \
              placement line shows how many experts of each layer are resident. A number above \
              the model's layer count, or any value but 0 on a dense model, is refused when the \
              model loads; the CPU engine ignores it (its experts are in RAM already).",
    },
    KeySpec {
        name: "memory.offload_exec",
        kind: Kind::Choice(OffloadExec::NAMES),
        default: "passback",
        rule: "one of pcie | cpu | passback",
        env: "HIPFIRE_OFFLOAD_EXEC",
        flag: Some("--offload-exec"),
        summary: "Who multiplies spilled layers",
        doc: "Who multiplies the weights of spilled layers. `pcie`: the GPU reads them over the link \
              from host-mapped memory. `cpu`: the CPU workers do the whole spilled GEMV. `passback`: \
              the rows are split, the GPU takes a share and the CPU the rest, concurrently, so both \
              links to host memory are used at once (see `memory.offload_passback_share`). \
              The default is `passback` because it is the one mode that reads host memory through \
              both engines at once (on the H200 box: ~51 GB/s GPU over PCIe, ~96 GB/s CPU, ~120 GB/s \
              both). Without a GPU nothing is spilled and this key is inert.",
    },
    KeySpec {
        name: "memory.offload_passback_share",
        kind: Kind::Float {
            word: Some("auto"),
            zero: true,
            min: 0.0,
            min_inclusive: false,
            max: MAX_PASSBACK_SHARE,
            max_inclusive: true,
        },
        default: "auto",
        rule: "`auto`, `0`, or a number in (0, 0.5]",
        env: "HIPFIRE_OFFLOAD_PASSBACK_SHARE",
        flag: Some("--share"),
        summary: "GPU share of a split step (passback only)",
        doc: "Fraction of a spilled GEMV's output rows given to the GPU under `passback`. `auto` lets \
              the share scheduler balance the two arms from their measured timings; `0` gives every \
              row to the CPU (byte-identical to `cpu`); a number in (0, 0.5] pins the share. \
              `hipfire offload-bench --write` measures this machine and stores a pin here. Inert \
              (with one info line) in the other modes.",
    },
    KeySpec {
        name: "memory.join_strategy",
        kind: Kind::Choice(JoinStrategy::NAMES),
        default: "flags",
        rule: "one of ordering | two-stream | flags",
        env: "HIPFIRE_JOIN_STRATEGY",
        flag: Some("--join-strategy"),
        summary: "How the GPU waits for the CPU rows",
        doc: "How a split step's two arms are joined. `ordering`: the CPU rows are copied up on the \
              compute stream, so stream order is the join (the reference system's method). \
              `two-stream`: the rows go up on a copy stream and the compute stream waits on its \
              event; the host never waits for the GPU arm. `flags` (default): the host queues the \
              step and never waits for it; x and the CPU rows pass through a host-mapped \
              mailbox guarded by sequence words the GPU writes and polls (kernels/flags.cu), and \
              the projections that read one activation (q/k/v, gate/up) run as one split step. On the \
              H200 box, synthetic Llama-3-8B Q4_K decode with 8 and 16 of 32 layers spilled ran at \
              60.6 and 40.2 tok/s under flags, 52.6 and 29.3 under ordering, and (16 spilled) 37.9 \
              under two-stream (docs/perf-checkpoints/2026-11-29-joins-vs-llamacpp-h200). A \
              batched decode step (several sequences, `hipfire serve`) joins its own way \
              whatever this says, since the mailbox holds one column: x down, the GPU arms \
              queued at once, the host waiting for x alone, the CPU rows queued up without a \
              host wait (docs/perf-checkpoints/2026-12-02-batched-split-h200).",
    },
    KeySpec {
        name: "memory.flags_x_publish",
        kind: Kind::Choice(FlagsXPublish::NAMES),
        default: "tagged",
        rule: "one of tagged | fenced",
        env: "HIPFIRE_FLAGS_X_PUBLISH",
        flag: None,
        summary: "How the flags join hands x to the CPU workers",
        doc: "Under `join_strategy = flags`, for Q4_K/Q6_K weights, how the device writes the \
              activation into the host-mapped mailbox. `tagged` (default): each element goes down \
              as one 8-byte word with the step number beside it, with no fence and no sequence \
              word; the workers check every element's step as they read it. This rests on an \
              aligned 8-byte device store reaching host memory whole. On the H200 box the \
              publish took 6.1 instead of 7.4 µs a step and the single layer ran 1.010× as fast \
              (docs/perf-checkpoints/2026-11-30-cpu-idle-chunks-h200). `fenced`: x, a system-wide \
              fence, then the sequence word; the other weight formats always go this way. Set \
              `fenced` on a platform where that store is not known to arrive whole (the HIP \
              backend is untested on AMD hardware).",
    },
    KeySpec {
        name: "memory.ram_margin_mib",
        kind: Kind::Int { word: None, min: 0, max: u32::MAX as u64 },
        default: "4096",
        rule: "an integer in [0, 4294967295] (MiB)",
        env: "HIPFIRE_RAM_MARGIN_MIB",
        flag: None,
        summary: "RAM kept free when pinning spilled weights",
        doc: "MiB of RAM that must stay available after the spilled weights are pinned. Loading is \
              refused, with the numbers, when `pinned + margin` exceeds available memory: pinned \
              pages cannot be swapped, so overcommitting them hangs the machine instead of failing.",
    },
    KeySpec {
        name: "gpu.kernel_cache",
        kind: Kind::Path { word: Some("auto") },
        default: "auto",
        rule: "`auto` or a directory path",
        env: "HIPFIRE_KERNEL_CACHE",
        flag: None,
        summary: "Where compiled GPU kernels are cached",
        doc: "Directory for compiled GPU kernels, keyed by source hash and architecture. `auto` is \
              `<cache dir>/hipfire/kernels` (`~/.cache/hipfire/kernels` on Linux). Deleting it is \
              safe; kernels are recompiled on next use.",
    },
    KeySpec {
        name: "sampling.temperature",
        kind: Kind::Float {
            word: None,
            zero: true,
            min: MIN_SAMPLING_FRACTION,
            min_inclusive: true,
            max: MAX_TEMPERATURE,
            max_inclusive: true,
        },
        default: "0.8",
        rule: "0 (greedy) or a number in [0.000001, 10]",
        env: "HIPFIRE_TEMPERATURE",
        flag: Some("--temperature"),
        summary: "Sampling temperature (0 = greedy)",
        doc: "Softmax temperature. `0` is greedy decoding (deterministic; use it to compare outputs \
              byte for byte). The default 0.8 is llama.cpp's.",
    },
    KeySpec {
        name: "sampling.top_k",
        kind: Kind::Int { word: None, min: 0, max: u32::MAX as u64 },
        default: "40",
        rule: "an integer in [0, 4294967295] (0 = off)",
        env: "HIPFIRE_TOP_K",
        flag: Some("--top-k"),
        summary: "Keep the k most likely tokens (0 = off)",
        doc: "Sample only among the `k` most likely tokens; `0` disables the cut. Default 40, as llama.cpp.",
    },
    KeySpec {
        name: "sampling.top_p",
        kind: Kind::Float {
            word: None,
            zero: false,
            min: MIN_SAMPLING_FRACTION,
            min_inclusive: true,
            max: 1.0,
            max_inclusive: true,
        },
        default: "0.95",
        rule: "a number in [0.000001, 1] (1 = off)",
        env: "HIPFIRE_TOP_P",
        flag: Some("--top-p"),
        summary: "Nucleus sampling mass (1 = off)",
        doc: "Sample from the smallest set of tokens whose probability mass reaches `p`; `1` disables \
              the cut. Default 0.95, as llama.cpp.",
    },
    KeySpec {
        name: "sampling.seed",
        kind: Kind::Int { word: Some("random"), min: 0, max: u64::MAX },
        default: "random",
        rule: "`random` or an integer in [0, 18446744073709551615]",
        env: "HIPFIRE_SEED",
        flag: Some("--seed"),
        summary: "Sampler seed (random = from the OS)",
        doc: "Seed of the sampler's random generator. `random` draws one from the OS per run (and \
              prints it with `-v`); a fixed seed makes sampled output repeatable on the same build.",
    },
    KeySpec {
        name: "sampling.max_tokens",
        kind: Kind::Int { word: None, min: 1, max: u32::MAX as u64 },
        default: "256",
        rule: "an integer in [1, 4294967295]",
        env: "HIPFIRE_MAX_TOKENS",
        flag: Some("--max-tokens"),
        summary: "Tokens to generate at most",
        doc: "Upper bound on generated tokens per prompt; generation also stops at the model's \
              end-of-sequence token.",
    },
];

/// The key named `name`, or [`ConfigError::UnknownKey`] with the closest name as a suggestion.
pub fn key(name: &str) -> Result<&'static KeySpec, ConfigError> {
    key_from(name, "command line")
}

/// As [`key`], recording where the name was found (for the error).
pub(crate) fn key_from(name: &str, origin: &str) -> Result<&'static KeySpec, ConfigError> {
    KEYS.iter()
        .find(|k| k.name == name)
        .ok_or_else(|| ConfigError::UnknownKey {
            key: name.to_string(),
            suggestion: suggest(name),
            origin: origin.to_string(),
        })
}

/// Largest edit distance still offered as "did you mean": two typos in a key name.
const SUGGEST_MAX_DISTANCE: usize = 2;

/// The schema key closest to `name`: either the same last segment (`offload_exec` →
/// `memory.offload_exec`) or within [`SUGGEST_MAX_DISTANCE`] edits.
fn suggest(name: &str) -> Option<&'static str> {
    if let Some(k) = KEYS
        .iter()
        .find(|k| k.name.rsplit('.').next() == Some(name))
    {
        return Some(k.name);
    }
    KEYS.iter()
        .map(|k| (levenshtein(name, k.name), k.name))
        .filter(|(d, _)| *d <= SUGGEST_MAX_DISTANCE)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

impl KeySpec {
    /// Validate `raw` against this key's rule. `source_desc` names where it came from for the
    /// error (`env HIPFIRE_SEED`, `flag --seed`, `file /path`, ...).
    pub fn parse(&self, raw: &str, source_desc: &str) -> Result<Value, ConfigError> {
        let bad = || ConfigError::Invalid {
            key: self.name,
            value: raw.to_string(),
            rule: self.rule,
            source_desc: source_desc.to_string(),
        };
        let text = raw.trim();
        let word_matches = |w: Option<&'static str>| w.filter(|w| text.eq_ignore_ascii_case(w));
        match self.kind {
            Kind::Choice(words) => words
                .iter()
                .find(|w| text.eq_ignore_ascii_case(w))
                .map(|w| Value::Word(w))
                .ok_or_else(bad),
            Kind::Int { word, min, max } => {
                if let Some(w) = word_matches(word) {
                    return Ok(Value::Word(w));
                }
                match text.parse::<u64>() {
                    Ok(n) if (min..=max).contains(&n) => Ok(Value::Int(n)),
                    _ => Err(bad()),
                }
            }
            Kind::Float {
                word,
                zero,
                min,
                min_inclusive,
                max,
                max_inclusive,
            } => {
                if let Some(w) = word_matches(word) {
                    return Ok(Value::Word(w));
                }
                let x: f64 = text.parse().map_err(|_| bad())?;
                if !x.is_finite() {
                    return Err(bad());
                }
                let above = if min_inclusive { x >= min } else { x > min };
                let below = if max_inclusive { x <= max } else { x < max };
                if (above && below) || (zero && x == 0.0) {
                    // Normalise -0 to 0 so the stored text is canonical.
                    Ok(Value::Float(if x == 0.0 { 0.0 } else { x }))
                } else {
                    Err(bad())
                }
            }
            Kind::Path { word } => {
                if let Some(w) = word_matches(word) {
                    return Ok(Value::Word(w));
                }
                if text.is_empty() {
                    return Err(bad());
                }
                Ok(Value::Path(text.into()))
            }
        }
    }

    /// The default as a validated value.
    ///
    /// # Panics
    /// Never for the schema in this crate: `every_default_obeys_its_rule` checks each default.
    /// A panic here means a schema entry was edited without running the tests (a bug, not input).
    pub fn default_value(&self) -> Value {
        match self.parse(self.default, "default") {
            Ok(v) => v,
            Err(e) => panic!("schema bug: {e}"),
        }
    }

    /// `(section, leaf)` of the dotted name; section is empty for top-level keys.
    pub fn split_name(&self) -> (&'static str, &'static str) {
        match self.name.rsplit_once('.') {
            Some((s, l)) => (s, l),
            None => ("", self.name),
        }
    }

    /// A short type label for tables: `auto | integer`, `pcie | cpu | passback`, ...
    pub fn type_label(&self) -> String {
        let with_word = |w: Option<&str>, t: &str| match w {
            Some(w) => format!("{w} | {t}"),
            None => t.to_string(),
        };
        match self.kind {
            Kind::Choice(ws) => ws.join(" | "),
            Kind::Int { word, .. } => with_word(word, "integer"),
            Kind::Float { word, .. } => with_word(word, "number"),
            Kind::Path { word } => with_word(word, "path"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_obeys_its_rule() {
        for k in KEYS {
            assert!(
                k.parse(k.default, "default").is_ok(),
                "{} default {:?}",
                k.name,
                k.default
            );
        }
    }

    #[test]
    fn ram_margin_default_is_the_named_const() {
        let k = key("memory.ram_margin_mib").expect("key");
        assert_eq!(k.default_value(), Value::Int(DEFAULT_RAM_MARGIN_MIB));
    }

    #[test]
    fn names_and_env_vars_are_unique_and_well_formed() {
        let mut names: Vec<_> = KEYS.iter().map(|k| k.name).collect();
        let mut envs: Vec<_> = KEYS.iter().map(|k| k.env).collect();
        names.sort_unstable();
        envs.sort_unstable();
        names.dedup();
        envs.dedup();
        assert_eq!(names.len(), KEYS.len());
        assert_eq!(envs.len(), KEYS.len());
        for k in KEYS {
            assert!(k.env.starts_with("HIPFIRE_"), "{}", k.env);
            assert!(k.summary.len() <= 50, "{} summary too long for -h", k.name);
            assert!(
                k.name.split('.').count() <= 2,
                "{}: one level of sections",
                k.name
            );
        }
    }

    #[test]
    fn share_rule_edges() {
        let k = key("memory.offload_passback_share").expect("key");
        assert_eq!(k.parse("auto", "t").expect("auto"), Value::Word("auto"));
        assert_eq!(k.parse("0", "t").expect("zero"), Value::Float(0.0));
        assert_eq!(k.parse("-0", "t").expect("neg zero"), Value::Float(0.0));
        assert_eq!(k.parse("0.5", "t").expect("top"), Value::Float(0.5));
        assert_eq!(k.parse("0.377", "t").expect("mid"), Value::Float(0.377));
        for bad in ["0.51", "-0.1", "1", "nan", "inf", "", "AUTOX", "1e-400x"] {
            match k.parse(bad, "flag --share") {
                Err(ConfigError::Invalid {
                    rule, source_desc, ..
                }) => {
                    assert_eq!(rule, k.rule);
                    assert_eq!(source_desc, "flag --share");
                }
                other => panic!("{bad:?} accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn sampling_fractions_refuse_values_f32_cannot_hold() {
        let p = key("sampling.top_p").expect("key");
        let t = key("sampling.temperature").expect("key");
        for (k, good) in [
            (p, &["0.000001", "0.5", "1"][..]),
            (t, &["0", "0.000001", "10"]),
        ] {
            for g in good {
                let v = k.parse(g, "t").expect(g);
                let Value::Float(x) = v else {
                    panic!("{g}: {v:?}")
                };
                // What the sampler will read: a normal f32 or exactly 0.
                assert!((x as f32).is_normal() || x == 0.0, "{g}");
            }
        }
        for (k, bad) in [
            (p, &["1e-320", "1e-40", "0.0000009", "0", "1.0001"][..]),
            (t, &["1e-320", "1e-40", "0.0000009", "10.5"]),
        ] {
            for b in bad {
                match k.parse(b, "config set") {
                    Err(e @ ConfigError::Invalid { .. }) => {
                        assert!(e.to_string().contains(k.rule), "{e}")
                    }
                    other => panic!("{} = {b} accepted: {other:?}", k.name),
                }
            }
        }
    }

    #[test]
    fn int_and_choice_rules() {
        let b = key("memory.gpu_layer_budget").expect("key");
        assert_eq!(b.parse("0", "t").expect("0"), Value::Int(0));
        assert_eq!(b.parse("AUTO", "t").expect("auto"), Value::Word("auto"));
        assert!(b.parse("-1", "t").is_err());
        assert!(b.parse("4097", "t").is_err());
        assert!(b.parse("1.5", "t").is_err());
        let m = key("memory.n_cpu_moe").expect("key");
        assert_eq!(m.parse("0", "t").expect("0"), Value::Int(0));
        assert_eq!(m.parse("All", "t").expect("all"), Value::Word("all"));
        assert!(m.parse("auto", "t").is_err());
        assert!(m.parse("-1", "t").is_err());
        assert!(m.parse("4097", "t").is_err());
        let t = key("cpu.threads").expect("key");
        assert!(
            t.parse("0", "t").is_err(),
            "zero threads cannot run anything"
        );
        assert_eq!(t.parse("16", "t").expect("16"), Value::Int(16));
        let e = key("memory.offload_exec").expect("key");
        assert_eq!(e.parse(" PCIe ", "t").expect("pcie"), Value::Word("pcie"));
        assert!(e.parse("gpu", "t").is_err());
        let s = key("sampling.seed").expect("key");
        assert_eq!(
            s.parse("18446744073709551615", "t").expect("max"),
            Value::Int(u64::MAX)
        );
        assert!(s.parse("18446744073709551616", "t").is_err());
    }

    #[test]
    fn ctx_size_rule_edges() {
        let k = key("model.ctx_size").expect("key");
        assert_eq!(k.parse("auto", "t").expect("auto"), Value::Word("auto"));
        assert_eq!(k.parse("1", "t").expect("1"), Value::Int(1));
        assert_eq!(
            k.parse("1048576", "t").expect("cap"),
            Value::Int(MAX_CTX_SIZE)
        );
        for bad in ["0", "-1", "1048577", "4k", "8192.5", ""] {
            match k.parse(bad, "flag --ctx-size") {
                Err(ConfigError::Invalid { rule, .. }) => assert_eq!(rule, k.rule),
                other => panic!("{bad:?} accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_key_suggests() {
        match key("offload_exec") {
            Err(ConfigError::UnknownKey { suggestion, .. }) => {
                assert_eq!(suggestion, Some("memory.offload_exec"))
            }
            other => panic!("{other:?}"),
        }
        match key("memory.ofload_exec") {
            Err(ConfigError::UnknownKey { suggestion, .. }) => {
                assert_eq!(suggestion, Some("memory.offload_exec"))
            }
            other => panic!("{other:?}"),
        }
        match key("no.such.thing.at.all") {
            Err(ConfigError::UnknownKey { suggestion, .. }) => assert_eq!(suggestion, None),
            other => panic!("{other:?}"),
        }
    }
}
