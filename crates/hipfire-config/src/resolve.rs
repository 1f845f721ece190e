//! Precedence: CLI flag > environment variable > TOML file > schema default.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::file::ConfigFile;
use crate::schema::{key_from, KeySpec, KEYS};
use crate::value::{Settings, Value};
use crate::ConfigError;

/// Where a resolved value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The schema default.
    Default,
    /// The TOML file at this path.
    File(PathBuf),
    /// This environment variable.
    Env(&'static str),
    /// This command-line flag.
    Cli(String),
}

impl Source {
    /// A one-word label (`default`, `file`, `env`, `cli`) for JSON and tables.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::File(_) => "file",
            Source::Env(_) => "env",
            Source::Cli(_) => "cli",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "env {v}"),
            Source::Cli(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A value set on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliOverride {
    /// The dotted key it sets.
    pub key: String,
    /// The flag as typed (`--share`), for messages.
    pub flag: String,
    /// The raw value.
    pub value: String,
}

impl CliOverride {
    /// An override of `key` by `flag` with `value`.
    pub fn new(key: impl Into<String>, flag: impl Into<String>, value: impl Into<String>) -> Self {
        CliOverride {
            key: key.into(),
            flag: flag.into(),
            value: value.into(),
        }
    }
}

/// Where environment variables are read from: the process, or a map in tests (so tests never
/// mutate the process environment, which races between test threads).
pub trait EnvSource {
    /// The variable's value; `None` when unset. Empty values count as unset (so `FOO= cmd`
    /// clears a setting instead of failing validation).
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl EnvSource for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty()).cloned()
    }
}

/// One key's effective value and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The key.
    pub spec: &'static KeySpec,
    /// The validated value.
    pub value: Value,
    /// The layer that supplied it.
    pub source: Source,
}

/// Every key resolved through the precedence layers.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// In [`KEYS`] order, one entry per key.
    entries: Vec<Resolved>,
    /// The file consulted (it may not exist), for `config list` and messages.
    file: Option<PathBuf>,
}

impl Config {
    /// Resolve with the process environment and the file at [`crate::config_path`]`(config_file)`.
    /// An explicit `config_file` (`--config`) that does not exist is [`ConfigError::Missing`];
    /// the default path and `$HIPFIRE_CONFIG` may name a file not written yet.
    pub fn load(config_file: Option<&Path>, cli: &[CliOverride]) -> Result<Config, ConfigError> {
        if let Some(p) = config_file {
            crate::require_existing(p)?;
        }
        let path = crate::config_path(config_file, &ProcessEnv)?;
        Config::resolve(Some(&path), &ProcessEnv, cli)
    }

    /// Resolve every key: `cli` over `env` over the TOML `file` (missing file = empty) over defaults.
    /// Any bad value in any layer is refused, even one a higher layer overrides: a broken
    /// file should be reported the first time it is read, not when the flag is dropped.
    pub fn resolve(
        file: Option<&Path>,
        env: &dyn EnvSource,
        cli: &[CliOverride],
    ) -> Result<Config, ConfigError> {
        let file_values = match file {
            Some(p) => ConfigFile::open(p)?.values()?,
            None => Vec::new(),
        };
        let mut cli_values: Vec<(&'static KeySpec, Value, &CliOverride)> = Vec::new();
        for o in cli {
            let spec = key_from(&o.key, &format!("flag {}", o.flag))?;
            let v = spec.parse(&o.value, &format!("flag {}", o.flag))?;
            cli_values.push((spec, v, o));
        }
        let mut entries = Vec::with_capacity(KEYS.len());
        for spec in KEYS {
            let mut r = Resolved {
                spec,
                value: spec.default_value(),
                source: Source::Default,
            };
            if let Some((_, v)) = file_values.iter().find(|(s, _)| s.name == spec.name) {
                r.value = v.clone();
                r.source = Source::File(file.map(Path::to_path_buf).unwrap_or_default());
            }
            if let Some(raw) = env.var(spec.env) {
                r.value = spec.parse(&raw, &format!("env {}", spec.env))?;
                r.source = Source::Env(spec.env);
            }
            // The last flag wins when a key is given twice, as with most CLIs.
            if let Some((_, v, o)) = cli_values
                .iter()
                .rev()
                .find(|(s, _, _)| s.name == spec.name)
            {
                r.value = v.clone();
                r.source = Source::Cli(o.flag.clone());
            }
            entries.push(r);
        }
        Ok(Config {
            entries,
            file: file.map(Path::to_path_buf),
        })
    }

    /// The resolved entry for `key`.
    pub fn get(&self, key: &str) -> Result<&Resolved, ConfigError> {
        let spec = crate::key(key)?;
        // Entries are built from KEYS, so the lookup only fails if the schema lookup did.
        self.entries
            .iter()
            .find(|r| r.spec.name == spec.name)
            .ok_or_else(|| ConfigError::UnknownKey {
                key: key.to_string(),
                suggestion: None,
                origin: "config".into(),
            })
    }

    /// Every entry, in schema order.
    pub fn iter(&self) -> impl Iterator<Item = &Resolved> {
        self.entries.iter()
    }

    /// The TOML file consulted, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The typed view for the engines.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        Settings::from_config(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{OffloadExec, PassbackShare, Threads};
    use std::num::NonZeroUsize;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn temp_file(tag: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hipfire-config-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let p = dir.join("config.toml");
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn defaults_without_any_layer() {
        let c = Config::resolve(None, &env(&[]), &[]).expect("resolve");
        for r in c.iter() {
            assert_eq!(r.source, Source::Default, "{}", r.spec.name);
            assert_eq!(r.value.to_string(), r.spec.default.to_string());
        }
        let s = c.settings().expect("settings");
        assert_eq!(s.offload_exec, OffloadExec::Passback);
        assert_eq!(s.passback_share, PassbackShare::Auto);
        assert_eq!(s.sampling.seed, None);
    }

    #[test]
    fn precedence_cli_over_env_over_file_over_default() {
        let p = temp_file(
            "prec",
            "[memory]\noffload_exec = \"pcie\"\noffload_passback_share = 0.25\n[cpu]\nthreads = 3\n",
        );
        let e = env(&[
            ("HIPFIRE_OFFLOAD_EXEC", "cpu"),
            ("HIPFIRE_OFFLOAD_PASSBACK_SHARE", "0.3"),
        ]);
        let cli = [CliOverride::new(
            "memory.offload_passback_share",
            "--share",
            "0.4",
        )];
        let c = Config::resolve(Some(&p), &e, &cli).expect("resolve");
        let get = |k| c.get(k).expect("key").clone();
        // cli beats env beats file
        assert_eq!(
            get("memory.offload_passback_share").value,
            Value::Float(0.4)
        );
        assert_eq!(
            get("memory.offload_passback_share").source,
            Source::Cli("--share".into())
        );
        // env beats file
        assert_eq!(get("memory.offload_exec").value, Value::Word("cpu"));
        assert_eq!(
            get("memory.offload_exec").source,
            Source::Env("HIPFIRE_OFFLOAD_EXEC")
        );
        // file beats default
        assert_eq!(get("cpu.threads").value, Value::Int(3));
        assert_eq!(get("cpu.threads").source, Source::File(p.clone()));
        // default when nobody says
        assert_eq!(get("memory.join_strategy").source, Source::Default);
        let s = c.settings().expect("settings");
        assert_eq!(s.threads, Threads::Count(NonZeroUsize::new(3).expect("3")));
        assert_eq!(s.passback_share, PassbackShare::Pinned(0.4));
        assert_eq!(s.offload_exec, OffloadExec::Cpu);
        let _ = std::fs::remove_dir_all(p.parent().expect("dir"));
    }

    #[test]
    fn empty_env_counts_as_unset() {
        let c = Config::resolve(None, &env(&[("HIPFIRE_OFFLOAD_EXEC", "")]), &[]).expect("resolve");
        assert_eq!(
            c.get("memory.offload_exec").expect("key").source,
            Source::Default
        );
    }

    #[test]
    fn bad_values_name_rule_and_source() {
        let e = env(&[("HIPFIRE_OFFLOAD_EXEC", "gpu")]);
        match Config::resolve(None, &e, &[]) {
            Err(ConfigError::Invalid {
                key,
                rule,
                source_desc,
                value,
            }) => {
                assert_eq!(key, "memory.offload_exec");
                assert_eq!(rule, "one of pcie | cpu | passback");
                assert_eq!(source_desc, "env HIPFIRE_OFFLOAD_EXEC");
                assert_eq!(value, "gpu");
            }
            other => panic!("{other:?}"),
        }
        let cli = [CliOverride::new(
            "memory.offload_passback_share",
            "--share",
            "0.7",
        )];
        let msg = Config::resolve(None, &env(&[]), &cli)
            .expect_err("0.7 > 0.5")
            .to_string();
        assert!(msg.contains("(0, 0.5]") && msg.contains("--share"), "{msg}");
        let p = temp_file("badfile", "[memory]\ngpu_layer_budget = -2\n");
        let msg = Config::resolve(Some(&p), &env(&[]), &[])
            .expect_err("-2")
            .to_string();
        assert!(
            msg.contains("gpu_layer_budget") && msg.contains(&p.display().to_string()),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(p.parent().expect("dir"));
    }

    #[test]
    fn unknown_keys_are_refused_in_file_and_cli() {
        let p = temp_file("unknown", "[memory]\noffload_exce = \"cpu\"\n");
        match Config::resolve(Some(&p), &env(&[]), &[]) {
            Err(ConfigError::UnknownKey {
                key, suggestion, ..
            }) => {
                assert_eq!(key, "memory.offload_exce");
                assert_eq!(suggestion, Some("memory.offload_exec"));
            }
            other => panic!("{other:?}"),
        }
        let cli = [CliOverride::new("memory.nope", "--nope", "1")];
        assert!(matches!(
            Config::resolve(None, &env(&[]), &cli),
            Err(ConfigError::UnknownKey { .. })
        ));
        let _ = std::fs::remove_dir_all(p.parent().expect("dir"));
    }

    #[test]
    fn every_key_has_a_typed_view() {
        // Set every key to a non-default value through the CLI layer and check Settings reads it,
        // so a key added to the schema but not to Settings (or vice versa) fails here.
        let cli: Vec<CliOverride> = [
            ("device", "cpu"),
            ("cpu.threads", "7"),
            ("model.ctx_size", "8192"),
            ("model.ubatch", "64"),
            ("model.cache_type", "q8_0"),
            ("memory.gpu_layer_budget", "12"),
            ("memory.n_cpu_moe", "3"),
            ("memory.offload_exec", "pcie"),
            ("memory.offload_passback_share", "0"),
            ("memory.join_strategy", "two-stream"),
            ("memory.flags_x_publish", "fenced"),
            ("memory.ram_margin_mib", "333"),
            ("gpu.kernel_cache", "/tmp/k"),
            ("sampling.temperature", "0"),
            ("sampling.top_k", "5"),
            ("sampling.top_p", "0.5"),
            ("sampling.seed", "42"),
            ("sampling.max_tokens", "9"),
        ]
        .iter()
        .map(|(k, v)| CliOverride::new(*k, "--x", *v))
        .collect();
        assert_eq!(cli.len(), KEYS.len(), "test covers every key");
        let s = Config::resolve(None, &env(&[]), &cli)
            .expect("resolve")
            .settings()
            .expect("s");
        use crate::value::*;
        assert_eq!(s.device, Device::Cpu);
        assert_eq!(s.threads.get().get(), 7);
        assert_eq!(s.ctx_size, CtxSize::Tokens(8192));
        assert_eq!(s.ctx_size.tokens(), Some(8192));
        assert_eq!(s.ubatch, 64);
        assert_eq!(s.cache_type, CacheType::Q8_0);
        assert_eq!(s.gpu_layer_budget, LayerBudget::Layers(12));
        assert_eq!(s.n_cpu_moe, CpuMoe::Layers(3));
        assert_eq!(s.offload_exec, OffloadExec::Pcie);
        assert_eq!(s.passback_share, PassbackShare::CpuOnly);
        assert_eq!(s.join_strategy, JoinStrategy::TwoStream);
        assert_eq!(s.flags_x_publish, FlagsXPublish::Fenced);
        assert_eq!(s.ram_margin_mib, 333);
        assert_eq!(s.kernel_cache.dir(), Some(PathBuf::from("/tmp/k")));
        assert_eq!(s.sampling.temperature, 0.0);
        assert_eq!(s.sampling.top_k, 5);
        assert_eq!(s.sampling.top_p, 0.5);
        assert_eq!(s.sampling.seed, Some(42));
        assert_eq!(s.sampling.max_tokens, 9);
    }
}
