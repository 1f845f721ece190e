//! Validated values and the typed views the engines read.

use std::fmt;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use crate::resolve::Config;
use crate::ConfigError;

/// A value that has passed its key's rule. Text round-trips: `Display` prints the canonical
/// form, which the same rule accepts again.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A word from the key's vocabulary (`auto`, `passback`, `random`, ...), lower-case.
    Word(&'static str),
    /// An unsigned integer.
    Int(u64),
    /// A finite number.
    Float(f64),
    /// A filesystem path.
    Path(PathBuf),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Word(w) => f.write_str(w),
            Value::Int(n) => write!(f, "{n}"),
            // `{}` on f64 prints the shortest text that parses back to the same value.
            Value::Float(x) => write!(f, "{x}"),
            Value::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

impl Value {
    /// The TOML form written by `config set`: numbers as TOML numbers, words and paths as
    /// strings; integers beyond `i64` (only seeds can be) as strings, since TOML integers are i64.
    pub fn to_toml(&self) -> toml::Value {
        match self {
            Value::Int(n) => match i64::try_from(*n) {
                Ok(i) => toml::Value::Integer(i),
                Err(_) => toml::Value::String(n.to_string()),
            },
            Value::Float(x) => toml::Value::Float(*x),
            Value::Word(w) => toml::Value::String((*w).to_string()),
            Value::Path(p) => toml::Value::String(p.display().to_string()),
        }
    }
}

/// Defines a closed word-valued setting: the enum, its `NAMES` (used by the schema, so the
/// accepted words and the enum cannot drift apart), `name()`, `Display` and `from_word`.
macro_rules! word_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident => $word:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var),+ }
        impl $name {
            /// Every accepted word, in documentation order.
            pub const NAMES: &'static [&'static str] = &[$($word),+];
            /// The canonical word.
            pub const fn name(self) -> &'static str { match self { $($name::$var => $word),+ } }
            /// The variant for a canonical word.
            pub fn from_word(w: &str) -> Option<Self> {
                match w { $($word => Some($name::$var),)+ _ => None }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
    };
}

word_enum! {
    /// `device`: which engines run the model.
    Device {
        /// GPU when found, else CPU.
        Auto => "auto",
        /// CPU only.
        Cpu => "cpu",
        /// GPU required.
        Gpu => "gpu",
    }
}

word_enum! {
    /// `memory.offload_exec`: who multiplies spilled weights.
    OffloadExec {
        /// GPU reads host-mapped weights over the link.
        Pcie => "pcie",
        /// CPU workers do the whole spilled GEMV.
        Cpu => "cpu",
        /// Rows split between GPU and CPU, run concurrently.
        Passback => "passback",
    }
}

word_enum! {
    /// `memory.join_strategy`: how a split step's arms are joined.
    JoinStrategy {
        /// CPU rows copied up on the compute stream; stream order is the join.
        Ordering => "ordering",
        /// CPU rows copied up on a copy stream; compute waits on its event.
        TwoStream => "two-stream",
        /// Host-mapped sequence words; no host synchronisation.
        Flags => "flags",
    }
}

word_enum! {
    /// `memory.flags_x_publish`: how the `flags` join's device hands x to the CPU workers.
    FlagsXPublish {
        /// Each element with the step beside it in one 8-byte word; no fence.
        Tagged => "tagged",
        /// x, a system-wide fence, then the sequence word.
        Fenced => "fenced",
    }
}

word_enum! {
    /// `model.cache_type`: how the K/V cache is stored (CPU and GPU engines).
    CacheType {
        /// f16 keys and values (llama.cpp's default).
        F16 => "f16",
        /// q8_0: 32 int8 and an f16 scale per 32 values, about half the bytes.
        Q8_0 => "q8_0",
    }
}

/// `memory.gpu_layer_budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerBudget {
    /// Keep as many repeating layers as fit in free VRAM.
    Auto,
    /// Keep exactly this many (the prefix of the rest is spilled).
    Layers(u32),
}

/// `memory.n_cpu_moe`: whose routed experts stay in pinned host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuMoe {
    /// The first this many layers' (0: none).
    Layers(u32),
    /// Every layer's (`all`, `--cpu-moe`).
    All,
}

/// `model.ctx_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtxSize {
    /// The model's trained context (`{arch}.context_length`).
    Auto,
    /// This many positions (in `[1, MAX_CTX_SIZE]`; the model's trained context bounds it again
    /// at load).
    Tokens(u32),
}

impl CtxSize {
    /// `None` for `auto`, else the positions asked for.
    pub fn tokens(self) -> Option<usize> {
        match self {
            CtxSize::Auto => None,
            CtxSize::Tokens(n) => Some(n as usize),
        }
    }
}

/// `memory.offload_passback_share`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PassbackShare {
    /// The share scheduler balances the arms from measured timings.
    Auto,
    /// Share 0: every row on the CPU, byte-identical to `offload_exec = cpu`.
    CpuOnly,
    /// A fixed GPU share in (0, 0.5].
    Pinned(f64),
}

/// `cpu.threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// One worker per physical core.
    Auto,
    /// Exactly this many workers.
    Count(NonZeroUsize),
}

impl Threads {
    /// The number of workers to start: the count, or the physical core count for `Auto`.
    pub fn get(self) -> NonZeroUsize {
        match self {
            Threads::Count(n) => n,
            // num_cpus reports at least 1; the fallback only guards a platform returning 0.
            Threads::Auto => {
                NonZeroUsize::new(num_cpus::get_physical()).unwrap_or(NonZeroUsize::MIN)
            }
        }
    }
}

/// `gpu.kernel_cache`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// `<cache dir>/hipfire/kernels`.
    Auto,
    /// An explicit directory.
    Dir(PathBuf),
}

impl KernelCache {
    /// The directory to use, `None` only for `Auto` on a platform with no cache directory.
    pub fn dir(&self) -> Option<PathBuf> {
        match self {
            KernelCache::Dir(p) => Some(p.clone()),
            KernelCache::Auto => dirs::cache_dir().map(|d| d.join("hipfire").join("kernels")),
        }
    }
}

/// The `sampling.*` keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 = greedy.
    pub temperature: f32,
    /// Top-k cut; 0 = off.
    pub top_k: u32,
    /// Nucleus mass; 1 = off.
    pub top_p: f32,
    /// Sampler seed; `None` = draw one from the OS.
    pub seed: Option<u64>,
    /// Maximum generated tokens.
    pub max_tokens: u32,
}

/// Every key as the engines read it: typed, validated, nothing left to parse.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `device`.
    pub device: Device,
    /// `cpu.threads`.
    pub threads: Threads,
    /// `model.ctx_size`.
    pub ctx_size: CtxSize,
    /// `model.ubatch`.
    pub ubatch: u32,
    /// `model.cache_type`.
    pub cache_type: CacheType,
    /// `memory.gpu_layer_budget`.
    pub gpu_layer_budget: LayerBudget,
    /// `memory.n_cpu_moe`.
    pub n_cpu_moe: CpuMoe,
    /// `memory.offload_exec`.
    pub offload_exec: OffloadExec,
    /// `memory.offload_passback_share`.
    pub passback_share: PassbackShare,
    /// `memory.join_strategy`.
    pub join_strategy: JoinStrategy,
    /// `memory.flags_x_publish`.
    pub flags_x_publish: FlagsXPublish,
    /// `memory.ram_margin_mib`.
    pub ram_margin_mib: u64,
    /// `gpu.kernel_cache`.
    pub kernel_cache: KernelCache,
    /// `sampling.*`.
    pub sampling: Sampling,
}

impl Settings {
    /// The typed view of a resolved [`Config`].
    ///
    /// Every value in a `Config` already passed its rule, so the only error possible is a
    /// mismatch between the schema and this function, which the tests exercise for every key.
    pub fn from_config(c: &Config) -> Result<Settings, ConfigError> {
        let v = |k: &'static str| c.get(k).map(|r| (r.spec, &r.value));
        Ok(Settings {
            device: word(v("device")?, Device::from_word)?,
            threads: match v("cpu.threads")? {
                (_, Value::Word("auto")) => Threads::Auto,
                (s, x) => Threads::Count(
                    usize::try_from(int(s, x)?)
                        .ok()
                        .and_then(NonZeroUsize::new)
                        .ok_or_else(|| mismatch(s, x))?,
                ),
            },
            ctx_size: match v("model.ctx_size")? {
                (_, Value::Word("auto")) => CtxSize::Auto,
                (s, x) => CtxSize::Tokens(u32::try_from(int(s, x)?).map_err(|_| mismatch(s, x))?),
            },
            ubatch: {
                let (s, x) = v("model.ubatch")?;
                u32::try_from(int(s, x)?).map_err(|_| mismatch(s, x))?
            },
            cache_type: word(v("model.cache_type")?, CacheType::from_word)?,
            gpu_layer_budget: match v("memory.gpu_layer_budget")? {
                (_, Value::Word("auto")) => LayerBudget::Auto,
                (s, x) => {
                    LayerBudget::Layers(u32::try_from(int(s, x)?).map_err(|_| mismatch(s, x))?)
                }
            },
            n_cpu_moe: match v("memory.n_cpu_moe")? {
                (_, Value::Word("all")) => CpuMoe::All,
                (s, x) => CpuMoe::Layers(u32::try_from(int(s, x)?).map_err(|_| mismatch(s, x))?),
            },
            offload_exec: word(v("memory.offload_exec")?, OffloadExec::from_word)?,
            passback_share: match v("memory.offload_passback_share")? {
                (_, Value::Word("auto")) => PassbackShare::Auto,
                (_, Value::Float(x)) if *x == 0.0 => PassbackShare::CpuOnly,
                (_, Value::Float(x)) => PassbackShare::Pinned(*x),
                (s, x) => return Err(mismatch(s, x)),
            },
            join_strategy: word(v("memory.join_strategy")?, JoinStrategy::from_word)?,
            flags_x_publish: word(v("memory.flags_x_publish")?, FlagsXPublish::from_word)?,
            ram_margin_mib: {
                let (s, x) = v("memory.ram_margin_mib")?;
                int(s, x)?
            },
            kernel_cache: match v("gpu.kernel_cache")? {
                (_, Value::Word("auto")) => KernelCache::Auto,
                (_, Value::Path(p)) => KernelCache::Dir(p.clone()),
                (s, x) => return Err(mismatch(s, x)),
            },
            sampling: Sampling {
                temperature: float(v("sampling.temperature")?)? as f32,
                top_k: {
                    let (s, x) = v("sampling.top_k")?;
                    u32::try_from(int(s, x)?).map_err(|_| mismatch(s, x))?
                },
                top_p: float(v("sampling.top_p")?)? as f32,
                seed: match v("sampling.seed")? {
                    (_, Value::Word("random")) => None,
                    (s, x) => Some(int(s, x)?),
                },
                max_tokens: {
                    let (s, x) = v("sampling.max_tokens")?;
                    u32::try_from(int(s, x)?).map_err(|_| mismatch(s, x))?
                },
            },
        })
    }
}

fn mismatch(spec: &'static crate::KeySpec, v: &Value) -> ConfigError {
    ConfigError::Invalid {
        key: spec.name,
        value: v.to_string(),
        rule: spec.rule,
        source_desc: "resolved value (schema and Settings disagree: a bug)".to_string(),
    }
}

fn int(spec: &'static crate::KeySpec, v: &Value) -> Result<u64, ConfigError> {
    match v {
        Value::Int(n) => Ok(*n),
        other => Err(mismatch(spec, other)),
    }
}

fn float((spec, v): (&'static crate::KeySpec, &Value)) -> Result<f64, ConfigError> {
    match v {
        Value::Float(x) => Ok(*x),
        other => Err(mismatch(spec, other)),
    }
}

fn word<T>(
    (spec, v): (&'static crate::KeySpec, &Value),
    from: impl Fn(&str) -> Option<T>,
) -> Result<T, ConfigError> {
    match v {
        Value::Word(w) => from(w).ok_or_else(|| mismatch(spec, v)),
        other => Err(mismatch(spec, other)),
    }
}
