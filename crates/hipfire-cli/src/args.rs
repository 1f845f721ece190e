//! Phase one of argument handling: clap turns argv into these types and checks only what was
//! typed (flag names, value shapes). Values that are config keys stay strings here and are
//! validated by hipfire-config, so a bad `--share` and a bad `HIPFIRE_OFFLOAD_PASSBACK_SHARE`
//! are refused by the same rule with the same message.

use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use hipfire_config::CliOverride;

/// One-line help of a config key, from the schema (so `-h`, the docs and the key agree).
fn key_help(name: &str) -> &'static str {
    hipfire_config::KEYS
        .iter()
        .find(|k| k.name == name)
        .map(|k| k.summary)
        .unwrap_or("")
}

/// Long help of a config key: doc, rule, default, env var.
fn key_long(name: &str) -> String {
    match hipfire_config::KEYS.iter().find(|k| k.name == name) {
        Some(k) => format!(
            "{}\n\nRule: {}. Default: {}. Env: {}. Config key: {}.",
            k.doc, k.rule, k.default, k.env, k.name
        ),
        None => String::new(),
    }
}

const ABOUT: &str =
    "Run LLMs that spill out of VRAM, with the GPU and the CPU sharing spilled layers";

const LONG_ABOUT: &str = "\
hipfire runs llama-family GGUF models whose weights do not all fit in VRAM. Layers that do \
not fit are spilled to pinned host memory, and each spilled matrix-vector product is split \
by output rows: the GPU reads its share over PCIe while the CPU cores multiply the rest, \
concurrently (`memory.offload_exec = passback`). Without a GPU everything runs on the CPU.

Settings come from flags, then HIPFIRE_* environment variables, then the config file \
(`hipfire config list` shows each value and where it came from), then defaults.";

const AFTER_HELP: &str = "\
Examples:
  hipfire run model.gguf \"The capital of France is\" -n 32 -t 0
  hipfire run model.gguf --offload-exec passback --gpu-layer-budget 20 \"Hi\"
  hipfire bench model.gguf -p 512,2048 -n 128 -r 5
  hipfire bench model.gguf --offload-exec cpu,pcie,passback -r 3 --json
  hipfire offload-bench --format q4_k --buffer-mb 192 --write
  hipfire config set memory.offload_exec cpu
  hipfire config list --json

Exit status: 0 success, 1 refused or nothing to do (e.g. a live daemon holds the device), \
2 error (bad flag or value, I/O, model or device failure), 130 / 143 when Ctrl-C (SIGINT) / \
SIGTERM stopped `run` or `bench` after the current token (what was produced and the stats \
line are printed first; a second Ctrl-C kills at once).";

/// The `hipfire` command line.
#[derive(Debug, Parser)]
#[command(
    name = "hipfire",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    max_term_width = 79,
    propagate_version = true
)]
pub struct Cli {
    /// More logs: -v info, -vv debug, -vvv trace.
    ///
    /// RUST_LOG, when set, overrides this.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Only errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Config file (else $HIPFIRE_CONFIG, else default).
    ///
    /// The default is <config dir>/hipfire/config.toml (~/.config/hipfire/config.toml on Linux).
    /// A file named here must exist, except for `config set` and `config reset`, which create it.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The modes; `run` in main.rs matches on this one enum.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate text from a prompt with a GGUF model.
    #[command(
        after_help = "Examples:\n  hipfire run model.gguf \"Once upon a time\" -n 64\n  \
        hipfire run model.gguf -t 0 --seed 1 --device cpu \"2+2=\"\n  \
        echo \"Hi\" | hipfire run model.gguf --no-chat\n  \
        hipfire run model.gguf \"Hi\" --json | jq '.ttft_ms, .prefill_tok_per_s'"
    )]
    Run(RunArgs),
    /// Measure prompt (pp) and generation (tg) tok/s, llama-bench style.
    #[command(long_about = BENCH_LONG_ABOUT, after_help = BENCH_AFTER_HELP)]
    Bench(BenchArgs),
    /// Measure host-memory GEMV GB/s per engine; recommend a share.
    #[command(
        name = "offload-bench",
        long_about = "Measure, per weight format, the GEMV bandwidth over a host-resident matrix for \
            the CPU workers alone, the GPU reading host-mapped memory alone, and both at once \
            split at the balanced share r_gpu/(r_gpu+r_cpu). Prints the share and the speedup \
            bound (r_gpu+r_cpu)/max(r_gpu,r_cpu), and recommends one \
            memory.offload_passback_share (the median of the per-format balanced shares, \
            capped at 0.5). Without a GPU only the CPU is measured. Refuses (exit 1) while a \
            hipfire daemon is running, because it would measure the daemon's load too.",
        after_help = "Examples:\n  hipfire offload-bench\n  \
            hipfire offload-bench --format q4_k,q8_0 --k 4096 --reps 9 --json\n  \
            hipfire offload-bench --write   # store the share in the config"
    )]
    OffloadBench(OffloadBenchArgs),
    /// Write a random-weight GGUF with a real model's shapes.
    #[command(
        after_help = "Examples:\n  hipfire synth --arch tiny --format q4_k --out /tmp/tiny.gguf\n  \
        hipfire synth --arch llama3-8b --format q4_k --layers 4 --out l8b-4l.gguf"
    )]
    Synth(SynthArgs),
    /// Serve the OpenAI API (chat, completions) with continuous batching.
    #[command(
        long_about = "Serve a GGUF model over HTTP with OpenAI's API: POST /v1/chat/completions \
            and /v1/completions (streaming or not), GET /v1/models, /health and /metrics \
            (Prometheus). Up to --parallel requests decode together, one forward step for all \
            of them; up to --queue more wait, and beyond that requests get 429 with \
            Retry-After. SIGTERM or Ctrl-C stops accepting, lets in-flight requests finish \
            for --shutdown-timeout seconds, then exits 0. Runs where `device` says (auto: the GPU \
            when one opens, with the placement flags of `run`; each step then reads every \
            weight once for all decoding sequences, spilled layers split between the GPU and \
            the CPU), else on the CPU.",
        after_help = "Examples:\n  hipfire serve model.gguf\n  \
            hipfire serve model.gguf --host 0.0.0.0 --port 8000 --api-key secret --parallel 8\n  \
            hipfire serve llama-8b.gguf --device gpu --gpu-layer-budget 16 --parallel 8 --ctx-size 4096\n  \
            curl -s localhost:8080/v1/chat/completions -H 'content-type: application/json' \\\n    \
            -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":32}'"
    )]
    Serve(ServeArgs),
    /// Read or change settings (get, set, reset, list, ...).
    #[command(after_help = "Examples:\n  hipfire config list\n  \
        hipfire config get memory.offload_exec\n  \
        hipfire config set memory.offload_passback_share 0.3\n  \
        hipfire config reset memory.offload_passback_share\n  \
        hipfire config explain memory.join_strategy\n  \
        HIPFIRE_CONFIG=/tmp/c.toml hipfire config set device cpu")]
    Config(ConfigArgs),
    /// Print version, commit, CPU SIMD tier, whether prompt chunks run on AMX tiles, GPU found.
    Version(VersionArgs),
}

/// Flags shared by `run` and `bench` that choose engines and placement.
#[derive(Debug, Args, Default)]
pub struct EngineArgs {
    #[arg(long, value_name = "DEV", help = key_help("device"), long_help = key_long("device"))]
    pub device: Option<String>,

    #[arg(long, value_name = "N", help = key_help("memory.gpu_layer_budget"),
        long_help = key_long("memory.gpu_layer_budget"))]
    pub gpu_layer_budget: Option<String>,

    /// Every routed expert in pinned host memory (MoE models; = --n-cpu-moe all).
    ///
    /// llama.cpp's `--cpu-moe`. A Mixture-of-Experts layer's routed experts are most of its
    /// weights but a token reads only the few its router chooses, so they are the cheapest
    /// weights to leave in host RAM: the GPU reads the chosen ones over PCIe (zero-copy) while
    /// attention, routers, shared experts and the KV cache take the VRAM. Without this flag
    /// experts are resident while VRAM allows. The placement line says how many experts of
    /// each layer ended up resident. Refused on a dense model and together with
    /// `--n-cpu-moe`; the CPU engine ignores it. Config key: memory.n_cpu_moe = all.
    #[arg(long, conflicts_with = "n_cpu_moe")]
    pub cpu_moe: bool,

    #[arg(long, value_name = "N", help = key_help("memory.n_cpu_moe"),
        long_help = key_long("memory.n_cpu_moe"))]
    pub n_cpu_moe: Option<String>,

    #[arg(long, value_name = "S", help = key_help("memory.offload_passback_share"),
        long_help = key_long("memory.offload_passback_share"))]
    pub share: Option<String>,

    #[arg(long, value_name = "JOIN", help = key_help("memory.join_strategy"),
        long_help = key_long("memory.join_strategy"))]
    pub join_strategy: Option<String>,

    #[arg(long, value_name = "N", help = key_help("cpu.threads"), long_help = key_long("cpu.threads"))]
    pub threads: Option<String>,

    #[arg(long, value_name = "N", help = key_help("model.ctx_size"), long_help = key_long("model.ctx_size"))]
    pub ctx_size: Option<String>,

    #[arg(long = "ubatch-size", value_name = "N", help = key_help("model.ubatch"), long_help = key_long("model.ubatch"))]
    pub ubatch: Option<String>,

    #[arg(long, value_name = "TYPE", help = key_help("model.cache_type"), long_help = key_long("model.cache_type"))]
    pub cache_type: Option<String>,
}

impl EngineArgs {
    /// The config overrides these flags make.
    pub fn overrides(&self) -> Vec<CliOverride> {
        let mut v = Vec::new();
        push(&mut v, "device", "--device", &self.device);
        push(
            &mut v,
            "memory.gpu_layer_budget",
            "--gpu-layer-budget",
            &self.gpu_layer_budget,
        );
        if self.cpu_moe {
            v.push(CliOverride::new("memory.n_cpu_moe", "--cpu-moe", "all"));
        }
        push(&mut v, "memory.n_cpu_moe", "--n-cpu-moe", &self.n_cpu_moe);
        push(
            &mut v,
            "memory.offload_passback_share",
            "--share",
            &self.share,
        );
        push(
            &mut v,
            "memory.join_strategy",
            "--join-strategy",
            &self.join_strategy,
        );
        push(&mut v, "cpu.threads", "--threads", &self.threads);
        push(&mut v, "model.ctx_size", "--ctx-size", &self.ctx_size);
        push(&mut v, "model.ubatch", "--ubatch-size", &self.ubatch);
        push(&mut v, "model.cache_type", "--cache-type", &self.cache_type);
        v
    }
}

fn push(v: &mut Vec<CliOverride>, key: &str, flag: &str, value: &Option<String>) {
    if let Some(x) = value {
        v.push(CliOverride::new(key, flag, x.clone()));
    }
}

/// Sampling flags of `run`.
#[derive(Debug, Args, Default)]
pub struct SamplingArgs {
    #[arg(short = 'n', long, value_name = "N", help = key_help("sampling.max_tokens"),
        long_help = key_long("sampling.max_tokens"))]
    pub max_tokens: Option<String>,

    #[arg(short = 't', long, value_name = "T", help = key_help("sampling.temperature"),
        long_help = key_long("sampling.temperature"))]
    pub temperature: Option<String>,

    #[arg(long, value_name = "K", help = key_help("sampling.top_k"), long_help = key_long("sampling.top_k"))]
    pub top_k: Option<String>,

    #[arg(long, value_name = "P", help = key_help("sampling.top_p"), long_help = key_long("sampling.top_p"))]
    pub top_p: Option<String>,

    #[arg(long, value_name = "N", help = key_help("sampling.seed"), long_help = key_long("sampling.seed"))]
    pub seed: Option<String>,
}

impl SamplingArgs {
    /// The config overrides these flags make.
    pub fn overrides(&self) -> Vec<CliOverride> {
        let mut v = Vec::new();
        push(
            &mut v,
            "sampling.max_tokens",
            "--max-tokens",
            &self.max_tokens,
        );
        push(
            &mut v,
            "sampling.temperature",
            "--temperature",
            &self.temperature,
        );
        push(&mut v, "sampling.top_k", "--top-k", &self.top_k);
        push(&mut v, "sampling.top_p", "--top-p", &self.top_p);
        push(&mut v, "sampling.seed", "--seed", &self.seed);
        v
    }
}

/// `hipfire run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Path of the GGUF model.
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,

    /// Prompt text; read from stdin when absent.
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    #[command(flatten)]
    pub engine: EngineArgs,

    #[arg(long, value_name = "MODE", help = key_help("memory.offload_exec"),
        long_help = key_long("memory.offload_exec"))]
    pub offload_exec: Option<String>,

    /// Use the model's chat template (default if the file has one).
    ///
    /// The prompt becomes one user message, rendered by the GGUF's own Jinja
    /// `tokenizer.chat_template` as HF transformers renders it (assistant turn opened). A file
    /// without a template gets ChatML, with a note; a template that does not compile or fails
    /// to render (it raises, or calls something undefined) gets ChatML too, after a one-line
    /// warning naming the template and the cause: generation continues.
    #[arg(long, overrides_with = "no_chat")]
    pub chat: bool,

    /// Feed the prompt as raw text.
    #[arg(long, overrides_with = "chat")]
    pub no_chat: bool,

    /// Print one JSON object instead of streaming.
    ///
    /// The object holds the text, token counts (prompt_tokens, generated), timings
    /// (ttft_ms: from the start of prefill to the first sampled token, null when the
    /// first token sampled ends generation; prefill_s, prefill_tok_per_s, decode_s,
    /// decode_tok_per_s), seed and placement, and which chat template formatted the prompt
    /// (`"file"`, `"chatml"`, or null without chat).
    #[arg(long)]
    pub json: bool,
}

impl RunArgs {
    /// Every config override from this command's flags.
    pub fn overrides(&self) -> Vec<CliOverride> {
        let mut v = self.engine.overrides();
        v.extend(self.sampling.overrides());
        push(
            &mut v,
            "memory.offload_exec",
            "--offload-exec",
            &self.offload_exec,
        );
        v
    }

    /// `Some(true)` for `--chat`, `Some(false)` for `--no-chat`, `None` = model decides.
    pub fn chat(&self) -> Option<bool> {
        match (self.chat, self.no_chat) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// Default prompt lengths of `hipfire bench` (one `pp` row): long enough that prefill is
/// measured on real batches, short enough to run on a 2-core CI machine with a 135M model.
const DEFAULT_BENCH_PROMPT_TOKENS: &str = "128";
/// Default generated tokens of `hipfire bench` (one `tg` row): enough decode steps for a
/// stable mean.
const DEFAULT_BENCH_GEN_TOKENS: &str = "64";
/// Default context depth before each test: none, as llama-bench's `-d 0`.
const DEFAULT_BENCH_DEPTH: &str = "0";
/// Default timed repetitions of each test.
const DEFAULT_BENCH_ROUNDS: &str = "3";

/// Most prompt, generated or depth tokens one bench test may ask for: 2^20, above the context
/// of every model hipfire loads today (SmolLM2 8192, Llama 3.1 131072), so only typos and
/// wrapped negatives are refused here; the model's own context is checked after loading.
pub const MAX_BENCH_TOKENS: u32 = 1 << 20;
/// Most timed repetitions per test: a mean of 1000 repetitions is as stable as it gets.
pub const MAX_BENCH_ROUNDS: u32 = 1000;

/// One entry of a `-p`/`-n`/`-d` list: a whole number of tokens in `0..=MAX_BENCH_TOKENS`,
/// with a message that says what is wrong with the entry (clap names the flag and value).
fn parse_bench_tokens(s: &str) -> Result<u32, String> {
    if s.is_empty() {
        return Err("an empty entry in the list (write e.g. `-p 512,2048`)".into());
    }
    if s.starts_with('-') {
        return Err("a token count cannot be negative (0 drops the rows)".into());
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a whole number of tokens".into());
    }
    match s.parse::<u64>() {
        Ok(n) if n <= u64::from(MAX_BENCH_TOKENS) => Ok(n as u32),
        _ => Err(format!("above the most, {MAX_BENCH_TOKENS} tokens")),
    }
}

const BENCH_LONG_ABOUT: &str = "\
Measure prompt processing and generation as llama-bench does. Each prompt length P of -p \
gives a `ppP` row: the prefill of P tokens from an empty context, in tokens per second \
(P / prefill time). Each N of -n gives a `tgN` row: N decode steps of one token each from an \
empty context (N / decode time). With -d D every test first fills D positions (untimed) and \
the row is `ppP @ dD` / `tgN @ dD`. Lists are comma-separated; 0 drops those rows.

Prompts are a fixed pseudo-random token sequence from a seeded generator over the model's \
vocabulary, control tokens left out (after BOS when the model adds one), so every length \
works regardless of text and every run feeds the same tokens. Each test gets one untimed \
warm-up (the whole prompt for pp, one step for tg), then -r timed repetitions; the table \
shows mean ± standard deviation of the repetitions' tok/s.

Each test must fit the context: --ctx-size when given, else the context is sized to the \
longest test, up to the model's trained context.

With several --offload-exec modes on a GPU, every repetition of every mode is a fresh \
process, the order of modes is rotated each repetition, and the paired per-repetition \
ratios between modes are reported too.";

const BENCH_AFTER_HELP: &str = "\
Examples:
  hipfire bench model.gguf                      # pp128 and tg64, 3 repetitions
  hipfire bench model.gguf -p 512,2048 -n 128 -r 5
  hipfire bench model.gguf -p 0 -n 32 -d 1024,4096    # decode at depth
  hipfire bench model.gguf -p 512 -n 0 --json | jq '.[0].avg_ts'
  hipfire bench model.gguf --offload-exec cpu,passback -r 3 --json > b.json

--json prints one JSON array, one object per row, with llama-bench's fields (test, \
n_prompt, n_gen, n_depth, avg_ts, stddev_ts, avg_ns, stddev_ns, samples_ts, samples_ns) \
and hipfire's (model, model_size, model_n_params, engine, offload_exec, placement, threads, \
commit, median_ts, ...).";

/// `hipfire bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Path of the GGUF model.
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,

    /// Prompt lengths, one ppN row each (0 to 1048576; 0 = none).
    ///
    /// A comma-separated list (`-p 512,2048`); the flag may also be repeated. Each is the
    /// prefill of that many tokens from an empty context (after -d). `--prompt-tokens` is
    /// the older spelling.
    #[arg(short = 'p', long = "n-prompt", visible_alias = "prompt-tokens",
        value_name = "N,..", default_value = DEFAULT_BENCH_PROMPT_TOKENS,
        value_delimiter = ',', action = clap::ArgAction::Append, allow_negative_numbers = true,
        value_parser = parse_bench_tokens)]
    pub n_prompt: Vec<u32>,

    /// Generated token counts, one tgN row each (0 to 1048576; 0 = none).
    ///
    /// A comma-separated list (`-n 32,128`). Each is that many one-token decode steps
    /// from an empty context (after -d), tokens from the same fixed sequence as the
    /// prompts. `--gen-tokens` is the older spelling.
    #[arg(short = 'n', long = "n-gen", visible_alias = "gen-tokens",
        value_name = "N,..", default_value = DEFAULT_BENCH_GEN_TOKENS,
        value_delimiter = ',', action = clap::ArgAction::Append, allow_negative_numbers = true,
        value_parser = parse_bench_tokens)]
    pub n_gen: Vec<u32>,

    /// Context depths filled before each test (0 to 1048576).
    ///
    /// A comma-separated list (`-d 0,4096`); every test runs at every depth. The depth's
    /// prefill is not timed, so `-p 0 -n 32 -d 4096` is decode with 4096 positions in the
    /// KV cache.
    #[arg(short = 'd', long = "n-depth", value_name = "N,..",
        default_value = DEFAULT_BENCH_DEPTH, value_delimiter = ',',
        action = clap::ArgAction::Append, allow_negative_numbers = true,
        value_parser = parse_bench_tokens)]
    pub n_depth: Vec<u32>,

    /// Timed repetitions of each test, 1 to 1000.
    ///
    /// One untimed warm-up precedes them. `--rounds` is the older spelling.
    #[arg(short = 'r', long = "repetitions", visible_alias = "rounds", value_name = "N",
        default_value = DEFAULT_BENCH_ROUNDS,
        value_parser = clap::value_parser!(u32).range(1..=MAX_BENCH_ROUNDS as i64))]
    pub repetitions: u32,

    /// Sequences decoded together in each `tg` test, comma-separated.
    ///
    /// `-n 64 --batch 1,8` adds a row `tg64 x8`: 8 sequences (one KV cache each, all at the
    /// `-d` depth) advanced by 64 batched decode steps, each one forward over 8 tokens, as
    /// `hipfire serve --parallel 8` steps them; t/s counts all 8 sequences' tokens. Prompt rows
    /// are unaffected.
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_value = "1",
        value_parser = clap::value_parser!(u32).range(1..=256))]
    pub batch: Vec<u32>,

    /// Offload modes to compare, comma-separated.
    ///
    /// Default: the configured memory.offload_exec. Modes run one after another, each
    /// with the model placed anew.
    #[arg(long, value_name = "MODES", value_delimiter = ',')]
    pub offload_exec: Vec<String>,

    #[command(flatten)]
    pub engine: EngineArgs,

    /// Print a JSON array, one object per row.
    ///
    /// Fields as llama-bench's `-o json` (test, n_prompt, n_gen, n_depth, avg_ts,
    /// stddev_ts, avg_ns, stddev_ns, samples_ts, samples_ns) plus hipfire's own (model,
    /// model_size, model_n_params, engine, offload_exec, placement, threads, commit,
    /// median_ts; with several modes on a GPU, paired_ratios).
    #[arg(long)]
    pub json: bool,
}

/// Default k of offload-bench: the reference system's default matrix width (5120, a
/// multiple of every block size: 20 × 256).
pub const DEFAULT_BENCH_K: usize = 5120;
/// Default weight buffer per format, MiB: the reference system's 192 MiB, far above any
/// last-level cache so the figure is DRAM/PCIe bandwidth, not cache bandwidth.
pub const DEFAULT_BENCH_BUFFER_MIB: usize = 192;
/// Default timed repetitions per format and engine (the median is reported).
pub const DEFAULT_BENCH_REPS: usize = 5;
/// Most columns of the synthetic matrix: 2^20, 200× the widest matrix of a real model
/// (Llama 3 8B's ffn_down, k 14336) and only 4 MiB of f32 activation.
pub const MAX_BENCH_K: u64 = 1 << 20;
/// Most weight MiB per format: 64 GiB, far above any last-level cache (the point of the
/// buffer) and below the RAM of the machines this runs on; a larger figure is a typo.
pub const MAX_BENCH_BUFFER_MIB: u64 = 64 << 10;
/// Most timed repetitions per engine: beyond 1000 the median moves by less than the noise.
pub const MAX_BENCH_REPS: u64 = 1000;

/// `hipfire offload-bench`.
#[derive(Debug, Args)]
pub struct OffloadBenchArgs {
    /// Formats to measure, comma-separated.
    ///
    /// Default: every format with a CPU row dot.
    #[arg(long, value_name = "FMTS", value_delimiter = ',')]
    pub format: Vec<String>,

    /// Columns of the synthetic matrix, 1 to 1048576.
    ///
    /// Must be a multiple of each measured format's block (256 for K-quants).
    #[arg(long, value_name = "K", default_value_t = DEFAULT_BENCH_K,
        value_parser = clap::value_parser!(u64).range(1..=MAX_BENCH_K).map(|v| v as usize))]
    pub k: usize,

    /// Weight MiB per format, 1 to 65536.
    ///
    /// Rows = ceil(bytes / row bytes). Keep it far above the last-level cache.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_BENCH_BUFFER_MIB,
        value_parser = clap::value_parser!(u64).range(1..=MAX_BENCH_BUFFER_MIB).map(|v| v as usize))]
    pub buffer_mb: usize,

    /// Timed repetitions per engine (median), 1 to 1000.
    ///
    /// One untimed warm-up precedes them.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BENCH_REPS,
        value_parser = clap::value_parser!(u64).range(1..=MAX_BENCH_REPS).map(|v| v as usize))]
    pub reps: usize,

    #[arg(long, value_name = "N", help = key_help("cpu.threads"), long_help = key_long("cpu.threads"))]
    pub threads: Option<String>,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Store the recommended share in the config.
    ///
    /// Writes memory.offload_passback_share into the config file (atomically).
    #[arg(long)]
    pub write: bool,
}

/// Default port of `hipfire serve` (llama-server's, so existing client configs work).
pub const DEFAULT_SERVE_PORT: u16 = 8080;
/// Default sequence slots: four streams share each step; on the 2-core CI box that is where
/// SmolLM2's aggregate decode rate levels off.
pub const DEFAULT_SERVE_PARALLEL: &str = "4";
/// Default queue beyond the slots before 429s: a burst of a few dozen clients waits instead
/// of failing.
pub const DEFAULT_SERVE_QUEUE: &str = "64";
/// Default seconds in-flight requests get after SIGTERM.
pub const DEFAULT_SERVE_SHUTDOWN_S: &str = "30";

/// `hipfire serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Path of the GGUF model.
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,

    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,

    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_SERVE_PORT)]
    pub port: u16,

    /// Require `Authorization: Bearer KEY` on /v1/*.
    ///
    /// /health and /metrics stay open for load balancers and scrapers.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,

    /// Sequences decoded together (KV cache slots).
    #[arg(long, value_name = "N", default_value = DEFAULT_SERVE_PARALLEL,
        value_parser = clap::value_parser!(u64).range(1..=256).map(|v| v as usize))]
    pub parallel: usize,

    /// Requests that may wait for a slot before new ones get 429.
    #[arg(long, value_name = "N", default_value = DEFAULT_SERVE_QUEUE,
        value_parser = clap::value_parser!(u64).range(0..=65536).map(|v| v as usize))]
    pub queue: usize,

    /// Seconds in-flight requests get after SIGTERM before they are cut off.
    #[arg(long, value_name = "SECS", default_value = DEFAULT_SERVE_SHUTDOWN_S,
        value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub shutdown_timeout: u64,

    /// Name reported as `model` (default: the file name without .gguf).
    #[arg(long, value_name = "NAME")]
    pub model_name: Option<String>,

    /// Device, layer budget, threads and the context length per sequence slot (`--ctx-size`:
    /// every slot's KV cache is counted at start-up, against available RAM on the CPU and in
    /// the placement budget on the GPU).
    #[command(flatten)]
    pub engine: EngineArgs,

    #[arg(long, value_name = "MODE", help = key_help("memory.offload_exec"),
        long_help = key_long("memory.offload_exec"))]
    pub offload_exec: Option<String>,
}

impl ServeArgs {
    /// Every config override from this command's flags.
    pub fn overrides(&self) -> Vec<CliOverride> {
        let mut v = self.engine.overrides();
        push(
            &mut v,
            "memory.offload_exec",
            "--offload-exec",
            &self.offload_exec,
        );
        v
    }
}

/// Architectures `synth` can imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SynthArch {
    /// Llama 3 8B shapes (32 layers, d 4096, ffn 14336, GQA 32/8, vocab 128256).
    #[value(name = "llama3-8b")]
    Llama3_8b,
    /// Qwen ~9B-class shapes.
    #[value(name = "qwen-9b")]
    Qwen9b,
    /// A tiny llama-style model for tests (seconds to write and run).
    #[value(name = "tiny", alias = "tiny-llama")]
    Tiny,
    /// A tiny Qwen2-style model (biases, tied embeddings).
    #[value(name = "tiny-qwen2")]
    TinyQwen2,
    /// A tiny Qwen3-style model (q/k norms).
    #[value(name = "tiny-qwen3")]
    TinyQwen3,
    /// Qwen3-30B-A3B shapes (48 layers, d 2048, GQA 32/4, 128 experts of 768, 8 a token).
    #[value(name = "qwen3-30b-a3b")]
    Qwen3_30bA3b,
    /// Qwen3.5-9B shapes (32 layers, 3 Gated DeltaNet to 1 gated attention, d 4096).
    #[value(name = "qwen3.5-9b")]
    Qwen35_9b,
    /// Qwen3.5-35B-A3B shapes (40 layers, 3:1 hybrid, d 2048, 256 experts of 512, 8 a token,
    /// a gated shared expert).
    #[value(name = "qwen3.5-35b-a3b")]
    Qwen35_35bA3b,
    /// Qwen3.5-0.8B shapes (24 layers, 3:1 hybrid, d 1024, tied embeddings).
    #[value(name = "qwen3.5-0.8b")]
    Qwen35_0_8b,
    /// A tiny Qwen3-MoE model (8 experts, 2 a token).
    #[value(name = "tiny-qwen3moe")]
    TinyQwen3Moe,
    /// A tiny Qwen2-MoE model (8 experts, 2 a token, a gated shared expert).
    #[value(name = "tiny-qwen2moe")]
    TinyQwen2Moe,
    /// A tiny Mixtral-style model (llama with 8 experts, 2 a token).
    #[value(name = "tiny-mixtral")]
    TinyMixtral,
    /// A tiny Qwen3.5 hybrid (3 Gated DeltaNet layers, 1 gated attention layer).
    #[value(name = "tiny-qwen35")]
    TinyQwen35,
    /// A tiny Qwen3.5-MoE hybrid (the same layers, 8 experts and a shared expert).
    #[value(name = "tiny-qwen35moe")]
    TinyQwen35Moe,
    /// tiny-qwen35moe with each layer's expert gate and up in one `ffn_gate_up_exps`.
    #[value(name = "tiny-qwen35moe-gate-up")]
    TinyQwen35MoeGateUp,
    /// Qwen3-Next-80B-A3B shapes (48 layers, 3 Gated DeltaNet to 1 gated attention, d 2048,
    /// 512 experts of 512, 10 a token, a shared expert).
    #[value(name = "qwen3-next-80b-a3b")]
    Qwen3Next80bA3b,
    /// A tiny Qwen3-Next hybrid (tiny-qwen35moe's shapes in qwen3next's tensor forms).
    #[value(name = "tiny-qwen3next")]
    TinyQwen3Next,
    /// tiny-qwen3next with each DeltaNet's q, k, v and z in one `ssm_in` (older files).
    #[value(name = "tiny-qwen3next-ssm-in")]
    TinyQwen3NextSsmIn,
    /// GLM-4.5-Air shapes (46 layers + 1 NextN, d 4096, GQA 96/8, 128 experts of 1408, 8 a
    /// token, sigmoid routing, a shared expert, layer 0 dense).
    #[value(name = "glm-4.5-air")]
    Glm45Air,
    /// A tiny GLM-4.5 (1 dense + 2 routed layers + 1 NextN; 8 experts, 2 a token, sigmoid
    /// routing with a selection bias, a shared expert).
    #[value(name = "tiny-glm4moe")]
    TinyGlm4Moe,
    /// gpt-oss-20b shapes (24 layers alternating sliding-window and full attention, d 2880,
    /// GQA 64/8 of 64, 32 experts of 2880, 4 a token, YaRN ×32).
    #[value(name = "gpt-oss-20b")]
    GptOss20b,
    /// A tiny gpt-oss (4 layers, 8 experts, 2 a token, sinks, biases, YaRN).
    #[value(name = "tiny-gpt-oss")]
    TinyGptOss,
}

impl SynthArch {
    /// hipfire-model's preset name.
    pub fn preset(self) -> &'static str {
        match self {
            SynthArch::Llama3_8b => "llama3-8b",
            SynthArch::Qwen9b => "qwen-9b",
            SynthArch::Tiny => "tiny-llama",
            SynthArch::TinyQwen2 => "tiny-qwen2",
            SynthArch::TinyQwen3 => "tiny-qwen3",
            SynthArch::Qwen3_30bA3b => "qwen3-30b-a3b",
            SynthArch::Qwen35_9b => "qwen3.5-9b",
            SynthArch::Qwen35_35bA3b => "qwen3.5-35b-a3b",
            SynthArch::Qwen35_0_8b => "qwen3.5-0.8b",
            SynthArch::TinyQwen3Moe => "tiny-qwen3moe",
            SynthArch::TinyQwen2Moe => "tiny-qwen2moe",
            SynthArch::TinyMixtral => "tiny-mixtral",
            SynthArch::TinyQwen35 => "tiny-qwen35",
            SynthArch::TinyQwen35Moe => "tiny-qwen35moe",
            SynthArch::TinyQwen35MoeGateUp => "tiny-qwen35moe-gate-up",
            SynthArch::Qwen3Next80bA3b => "qwen3-next-80b-a3b",
            SynthArch::TinyQwen3Next => "tiny-qwen3next",
            SynthArch::TinyQwen3NextSsmIn => "tiny-qwen3next-ssm-in",
            SynthArch::Glm45Air => "glm-4.5-air",
            SynthArch::TinyGlm4Moe => "tiny-glm4moe",
            SynthArch::GptOss20b => "gpt-oss-20b",
            SynthArch::TinyGptOss => "tiny-gpt-oss",
        }
    }
}

/// Most repeating layers `synth` writes: 8× the ~126 of the largest dense models today;
/// more is a typo that would plan billions of tensors.
pub const MAX_SYNTH_LAYERS: u32 = 1024;

/// `hipfire synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Architecture whose shapes to copy.
    #[arg(long, value_enum, default_value_t = SynthArch::Tiny)]
    pub arch: SynthArch,

    /// Weight format (q4_k, q8_0, f16, ...).
    #[arg(long, value_name = "FMT", default_value = "q4_k")]
    pub format: String,

    /// Output GGUF path; must not exist unless --force.
    ///
    /// The file is written to a temporary name beside it and renamed into place when
    /// complete, so the path never holds a partial file.
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,

    /// Replace an existing --out file.
    ///
    /// By rename: a process reading or mapping the old file keeps its bytes.
    #[arg(long)]
    pub force: bool,

    /// Repeating layers, 1 to 1024 (default: the architecture's).
    #[arg(long, value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_SYNTH_LAYERS as i64))]
    pub layers: Option<u32>,

    /// Seed of the random weights.
    ///
    /// The file is a pure function of the flags.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,

    /// Trained context written to `{arch}.context_length` (default: the architecture's,
    /// 8192 for llama3-8b).
    ///
    /// Sessions default to it and `--ctx-size` may not exceed it, so a long-context benchmark
    /// (`bench -d 16384`) needs a file that declares at least that much, as Llama-3.1's
    /// 131072 does.
    #[arg(long, value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=hipfire_config::MAX_CTX_SIZE))]
    pub ctx_len: Option<u64>,

    /// RoPE context-extension scaling to write (`{arch}.rope.scaling.type`).
    #[arg(
        long,
        value_enum,
        value_name = "TYPE",
        requires = "rope_scaling_factor"
    )]
    pub rope_scaling: Option<SynthRopeScaling>,

    /// RoPE scaling factor (`rope.scaling.factor`), with --rope-scaling.
    #[arg(long, value_name = "F", requires = "rope_scaling")]
    pub rope_scaling_factor: Option<f64>,

    /// Pre-training context of the scaled RoPE
    /// (`rope.scaling.original_context_length`; default: the file's context length).
    #[arg(long, value_name = "N", requires = "rope_scaling")]
    pub rope_original_ctx: Option<u32>,
}

/// RoPE scaling types `synth` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SynthRopeScaling {
    /// Position interpolation (every angle divided by the factor).
    Linear,
    /// YaRN (ramped interpolation and a cos/sin magnitude).
    Yarn,
}

/// `hipfire config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// The config action.
    #[command(subcommand)]
    pub action: ConfigAction,
}

/// `hipfire config <action>`.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Print a key's effective value (flag > env > file > default).
    Get {
        /// Dotted key, e.g. memory.offload_exec.
        key: String,
        /// Print {key, value, source} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Validate a value and store it in the config file.
    ///
    /// The edit holds a lock beside the file (parallel sets all survive), keeps other keys,
    /// comments, permissions and a symlink, and replaces the file atomically.
    Set {
        /// Dotted key.
        key: String,
        /// New value; refused with the key's rule when invalid.
        value: String,
    },
    /// Remove a key from the config file (back to env or default).
    Reset {
        /// Dotted key.
        key: String,
    },
    /// Every key with its value and where it came from.
    List {
        /// Print a JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// A key's documentation, rule, default and env var.
    Explain {
        /// Dotted key.
        key: String,
    },
    /// Print the config file path in use.
    Path,
    /// Regenerate CONFIG.md and env-vars.md from the schema.
    Docs {
        /// Output directory.
        #[arg(long, value_name = "DIR", default_value = "docs")]
        out: PathBuf,
    },
}

/// `hipfire version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_key_help_exists() {
        for k in [
            "device",
            "cpu.threads",
            "memory.offload_exec",
            "sampling.seed",
        ] {
            assert!(!key_help(k).is_empty(), "{k}");
        }
    }

    #[test]
    fn bench_lists_parse_like_llama_bench() {
        let bench = |args: &[&str]| -> Result<BenchArgs, clap::Error> {
            let argv = ["hipfire", "bench", "m.gguf"].iter().chain(args);
            match Cli::try_parse_from(argv)?.command {
                Command::Bench(b) => Ok(b),
                _ => panic!("not bench"),
            }
        };
        let b = bench(&["-p", "512,2048", "-n", "128", "-r", "5", "-d", "0,4096"]).expect("lists");
        assert_eq!(b.n_prompt, [512, 2048]);
        assert_eq!(b.n_gen, [128]);
        assert_eq!(b.n_depth, [0, 4096]);
        assert_eq!(b.repetitions, 5);
        // The older spellings, a repeated flag, and the defaults.
        let b = bench(&[
            "--prompt-tokens",
            "7",
            "--n-prompt=9",
            "--gen-tokens",
            "3",
            "--rounds",
            "2",
        ])
        .expect("aliases");
        assert_eq!(
            (b.n_prompt, b.n_gen, b.repetitions),
            (vec![7, 9], vec![3], 2)
        );
        let b = bench(&[]).expect("defaults");
        assert_eq!(
            (b.n_prompt, b.n_gen, b.n_depth),
            (vec![128], vec![64], vec![0])
        );
        assert_eq!(b.repetitions, 3);
        for bad in [
            "5,,",
            ",5",
            "-1",
            "abc",
            "1e3",
            "+5",
            "1048577",
            "99999999999999999999",
        ] {
            let e = bench(&["-p", bad]).expect_err(bad);
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        assert_eq!(parse_bench_tokens("1048576"), Ok(MAX_BENCH_TOKENS));
        assert_eq!(parse_bench_tokens("0"), Ok(0));
    }

    #[test]
    fn run_flags_become_overrides() {
        let cli = Cli::try_parse_from([
            "hipfire",
            "run",
            "m.gguf",
            "hi",
            "-n",
            "5",
            "-t",
            "0",
            "--share",
            "0.3",
            "--offload-exec",
            "cpu",
            "--no-chat",
        ])
        .expect("parse");
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        let o = r.overrides();
        let find = |k: &str| o.iter().find(|x| x.key == k).map(|x| x.value.as_str());
        assert_eq!(find("sampling.max_tokens"), Some("5"));
        assert_eq!(find("sampling.temperature"), Some("0"));
        assert_eq!(find("memory.offload_passback_share"), Some("0.3"));
        assert_eq!(find("memory.offload_exec"), Some("cpu"));
        assert_eq!(find("device"), None);
        assert_eq!(r.chat(), Some(false));
        // Every override names a real key.
        for x in &o {
            assert!(hipfire_config::key(&x.key).is_ok(), "{}", x.key);
        }
    }
}
