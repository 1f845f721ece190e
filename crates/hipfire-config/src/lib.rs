//! hipfire-config: one schema for every hipfire setting.
//!
//! # Layout
//! - [`schema`] — [`KeySpec`] for every key: dotted name, value kind, default, the human-readable
//!   validation rule (quoted in every refusal), environment variable and doc text. [`KEYS`] is the
//!   single list; nothing else in the workspace spells a key's rule or default.
//! - [`value`] — the validated [`Value`] and the typed views the engines read ([`Settings`],
//!   [`OffloadExec`], [`PassbackShare`], ...).
//! - [`resolve`] — precedence: CLI flag > environment > TOML file > default. Every
//!   [`Resolved`] value remembers its [`Source`], so `hipfire config list` can say where a value came from.
//! - [`file`] — the sparse TOML file: path lookup ([`config_path`]), strict load, validated
//!   `set`/`reset` under an edit lock (`flock`), comment-keeping atomic save (temp file +
//!   rename, through symlinks).
//! - [`docs`] — `docs/CONFIG.md` and `docs/env-vars.md` are generated from the schema; a test
//!   fails when the committed files are stale.
//!
//! # The design decision
//! Values are validated once, at the boundary where they enter (flag, env var or file), by the
//! same rule whatever the source, and a refusal names the key, the source and the rule. Inside the
//! engines a value is a typed enum that cannot be wrong, so nothing downstream re-parses strings.
//!
//! # Errors
//! One [`ConfigError`] enum: callers (the CLI) print it with `{:#}`; tests match its variants.
#![deny(missing_docs)]

pub mod docs;
pub mod file;
pub mod resolve;
pub mod schema;
pub mod value;

use std::path::PathBuf;

pub use file::{config_path, hipfire_home, require_existing, ConfigFile, CONFIG_ENV, HOME_ENV};
pub use resolve::{CliOverride, Config, EnvSource, ProcessEnv, Resolved, Source};
pub use schema::{key, KeySpec, Kind, KEYS, MAX_CTX_SIZE};
pub use value::{
    CacheType, CpuMoe, CtxSize, Device, FlagsXPublish, JoinStrategy, KernelCache, LayerBudget,
    OffloadExec, PassbackShare, Sampling, Settings, Threads, Value,
};

/// Everything that can go wrong reading, validating or writing configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key name that is not in the schema.
    #[error("unknown config key `{key}`{}; `hipfire config list` shows every key",
        suggestion.map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownKey {
        /// The key as given.
        key: String,
        /// The closest schema key, when one is close enough to be a likely typo.
        suggestion: Option<&'static str>,
        /// Where the key was found (file path or "command line").
        origin: String,
    },
    /// A value that breaks its key's rule.
    #[error("invalid value `{value}` for `{key}` (from {source_desc}): {key} must be {rule}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// The key's validation rule, as written in the schema and the docs.
        rule: &'static str,
        /// Where the value came from, in words (`env HIPFIRE_OFFLOAD_EXEC`, `flag --share`, ...).
        source_desc: String,
    },
    /// No `HIPFIRE_CONFIG` and the platform has no configuration directory.
    #[error("no configuration directory on this platform; set {CONFIG_ENV} to a file path")]
    NoConfigDir,
    /// The config file exists but could not be read.
    #[error("cannot read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML.
    #[error("config file {path} is not valid TOML")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's error (line, column, what).
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A section in the file is not a table where the schema needs one (`memory = 3`).
    #[error("config file {path}: `{section}` must be a table of keys, found a {found}")]
    NotATable {
        /// The file.
        path: PathBuf,
        /// The dotted section name.
        section: String,
        /// The TOML type found instead.
        found: &'static str,
    },
    /// The config file is valid TOML to the strict reader but not to the editor (a TOML
    /// feature newer than the editor's spec), so it cannot be edited without losing text.
    #[error("config file {path} cannot be edited in place")]
    Edit {
        /// The file.
        path: PathBuf,
        /// The editor's parse error.
        #[source]
        source: Box<toml_edit::TomlError>,
    },
    /// A config file named explicitly (`--config PATH`) does not exist.
    #[error("config file {path} does not exist (named by --config; create it with `hipfire --config {path} config set KEY VALUE`)")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// Taking the edit lock beside the config file failed.
    #[error("cannot lock {path} for editing the config file")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing the config file (temp file, sync or rename) failed; the old file is untouched.
    #[error("cannot write config file {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Serialising the table failed (cannot happen for tables built by this crate).
    #[error("cannot serialise config table")]
    Serialize(#[source] toml::ser::Error),
}
