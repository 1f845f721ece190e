//! The sparse TOML file: only keys a user set are present; `[section]` tables hold dotted keys.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::resolve::EnvSource;
use crate::schema::{key_from, KeySpec, KEYS};
use crate::value::Value;
use crate::ConfigError;

/// Environment variable naming the config file; overrides the platform default (tests use it).
pub const CONFIG_ENV: &str = "HIPFIRE_CONFIG";

/// Environment variable naming hipfire's data directory (daemon pid file, models).
pub const HOME_ENV: &str = "HIPFIRE_HOME";

/// The config file path: `explicit` (a `--config` flag), else `$HIPFIRE_CONFIG`, else
/// `<config dir>/hipfire/config.toml` (`~/.config/hipfire/config.toml` on Linux).
pub fn config_path(explicit: Option<&Path>, env: &dyn EnvSource) -> Result<PathBuf, ConfigError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = env.var(CONFIG_ENV) {
        return Ok(PathBuf::from(p));
    }
    dirs::config_dir()
        .map(|d| d.join("hipfire").join("config.toml"))
        .ok_or(ConfigError::NoConfigDir)
}

/// hipfire's data directory: `$HIPFIRE_HOME`, else `<local data dir>/hipfire`
/// (`~/.local/share/hipfire` on Linux); `None` only when the platform has neither.
pub fn hipfire_home(env: &dyn EnvSource) -> Option<PathBuf> {
    env.var(HOME_ENV)
        .map(PathBuf::from)
        .or_else(|| dirs::data_local_dir().map(|d| d.join("hipfire")))
}

/// The config file as a TOML table, for reading, editing and saving.
///
/// Editing keeps every other entry, including ones this version does not know (a newer
/// hipfire may have written them); comments are not preserved.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// Where it lives (it may not exist yet).
    path: PathBuf,
    /// The parsed document; empty when the file does not exist.
    table: toml::Table,
}

fn toml_type(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "string",
        toml::Value::Integer(_) => "integer",
        toml::Value::Float(_) => "float",
        toml::Value::Boolean(_) => "boolean",
        toml::Value::Datetime(_) => "datetime",
        toml::Value::Array(_) => "array",
        toml::Value::Table(_) => "table",
    }
}

/// A TOML scalar as the text a user would type, so file values pass the same rule as flags.
fn toml_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl ConfigFile {
    /// Read `path`; a missing file is an empty table (nothing set), any other error is returned.
    pub fn open(path: &Path) -> Result<ConfigFile, ConfigError> {
        let table = match std::fs::read_to_string(path) {
            Ok(text) => text
                .parse::<toml::Table>()
                .map_err(|e| ConfigError::Parse {
                    path: path.to_path_buf(),
                    source: Box::new(e),
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => toml::Table::new(),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        Ok(ConfigFile {
            path: path.to_path_buf(),
            table,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every entry, validated; unknown keys and bad values are refused with the file named.
    pub fn values(&self) -> Result<Vec<(&'static KeySpec, Value)>, ConfigError> {
        let origin = format!("file {}", self.path.display());
        let mut out = Vec::new();
        for (name, v) in &self.table {
            match v {
                toml::Value::Table(t) => {
                    for (leaf, v) in t {
                        let dotted = format!("{name}.{leaf}");
                        if let toml::Value::Table(_) = v {
                            return Err(ConfigError::UnknownKey {
                                key: dotted,
                                suggestion: None,
                                origin: origin.clone(),
                            });
                        }
                        let spec = key_from(&dotted, &origin)?;
                        out.push((spec, spec.parse(&toml_text(v), &origin)?));
                    }
                }
                v => {
                    let spec = key_from(name, &origin)?;
                    out.push((spec, spec.parse(&toml_text(v), &origin)?));
                }
            }
        }
        Ok(out)
    }

    /// The raw text stored for `key`, if the file sets it.
    pub fn get(&self, key: &str) -> Result<Option<String>, ConfigError> {
        let spec = crate::key(key)?;
        let (section, leaf) = spec.split_name();
        let v = if section.is_empty() {
            self.table.get(leaf)
        } else {
            self.table
                .get(section)
                .and_then(|t| t.as_table())
                .and_then(|t| t.get(leaf))
        };
        Ok(v.map(toml_text))
    }

    /// Validate `raw` for `key` and store it (in memory; call [`ConfigFile::save`]).
    /// Nothing changes when validation fails.
    pub fn set(&mut self, key: &str, raw: &str) -> Result<Value, ConfigError> {
        let spec = crate::key(key)?;
        let value = spec.parse(raw, "config set")?;
        let (section, leaf) = spec.split_name();
        let table = if section.is_empty() {
            &mut self.table
        } else {
            let entry = self
                .table
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            match entry {
                toml::Value::Table(t) => t,
                other => {
                    return Err(ConfigError::NotATable {
                        path: self.path.clone(),
                        section: section.to_string(),
                        found: toml_type(other),
                    })
                }
            }
        };
        table.insert(leaf.to_string(), value.to_toml());
        Ok(value)
    }

    /// Remove `key` from the file (it falls back to env/default). Returns whether it was set.
    /// An emptied section is removed too, so the file stays sparse.
    pub fn reset(&mut self, key: &str) -> Result<bool, ConfigError> {
        let spec = crate::key(key)?;
        let (section, leaf) = spec.split_name();
        if section.is_empty() {
            return Ok(self.table.remove(leaf).is_some());
        }
        let Some(toml::Value::Table(t)) = self.table.get_mut(section) else {
            return Ok(false);
        };
        let was = t.remove(leaf).is_some();
        if t.is_empty() {
            self.table.remove(section);
        }
        Ok(was)
    }

    /// Remove the entry named `dotted` whether or not the schema knows it, so a typo or a key
    /// of a newer hipfire that this version refuses can be cleaned out with `config reset`.
    /// Returns whether it was present; an emptied section is removed too.
    pub fn remove_raw(&mut self, dotted: &str) -> bool {
        let Some((section, leaf)) = dotted.rsplit_once('.') else {
            return self.table.remove(dotted).is_some();
        };
        let Some(toml::Value::Table(t)) = self.table.get_mut(section) else {
            return false;
        };
        let was = t.remove(leaf).is_some();
        if t.is_empty() {
            self.table.remove(section);
        }
        was
    }

    /// Write the file atomically: a temp file in the same directory, fsync, rename over the
    /// target. A reader (or a crash) sees the old file or the new one, never a torn one.
    pub fn save(&self) -> Result<(), ConfigError> {
        let werr = |source| ConfigError::Write {
            path: self.path.clone(),
            source,
        };
        let text = toml::to_string(&self.table).map_err(ConfigError::Serialize)?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(werr)?;
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The pid keeps two concurrent `config set` processes from sharing a temp file; the
        // last rename wins, and each rename publishes a complete file.
        let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(header().as_bytes())?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            werr(e)
        })
    }
}

/// First lines of a written file: where to read about the keys.
fn header() -> String {
    format!(
        "# hipfire configuration ({} keys documented in docs/CONFIG.md; `hipfire config list`).\n\
         # Written by `hipfire config set`; comments here are not preserved.\n",
        KEYS.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hipfire-file-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn round_trip_every_key() {
        let d = temp_dir("rt");
        let p = d.join("sub").join("config.toml");
        let mut f = ConfigFile::open(&p).expect("missing file is empty");
        let samples = [
            ("device", "gpu"),
            ("cpu.threads", "5"),
            ("model.ctx_size", "32768"),
            ("memory.gpu_layer_budget", "0"),
            ("memory.offload_exec", "cpu"),
            ("memory.offload_passback_share", "0.377"),
            ("memory.join_strategy", "flags"),
            ("memory.flags_x_publish", "fenced"),
            ("memory.ram_margin_mib", "2048"),
            ("gpu.kernel_cache", "/var/cache/k"),
            ("sampling.temperature", "0.25"),
            ("sampling.top_k", "0"),
            ("sampling.top_p", "1"),
            ("sampling.seed", "18446744073709551615"),
            ("sampling.max_tokens", "12"),
        ];
        assert_eq!(samples.len(), KEYS.len());
        let mut want = Vec::new();
        for (k, v) in samples {
            want.push((k, f.set(k, v).expect("valid")));
        }
        f.save().expect("save");
        let g = ConfigFile::open(&p).expect("reopen");
        let got = g.values().expect("values");
        for (k, v) in &want {
            let (_, gv) = got.iter().find(|(s, _)| s.name == *k).expect("present");
            assert_eq!(gv, v, "{k}");
            let raw = g.get(k).expect("get").expect("set");
            assert_eq!(
                &crate::key(k).expect("key").parse(&raw, "t").expect("valid"),
                v,
                "{k}"
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn set_preserves_other_keys_and_validates_first() {
        let d = temp_dir("keep");
        let p = d.join("config.toml");
        let original = "[memory]\noffload_exec = \"pcie\"\n[future]\nknob = 3\n";
        std::fs::write(&p, original).expect("write");
        let mut f = ConfigFile::open(&p).expect("open");
        assert!(f.set("memory.offload_passback_share", "0.9").is_err());
        assert!(f.set("no.such", "1").is_err());
        f.save().expect("save unchanged");
        let t: toml::Table = std::fs::read_to_string(&p)
            .expect("r")
            .parse()
            .expect("toml");
        assert_eq!(t["memory"]["offload_exec"].as_str(), Some("pcie"));
        assert!(
            t["memory"].get("offload_passback_share").is_none(),
            "bad value not written"
        );
        f.set("memory.offload_passback_share", "0.25").expect("ok");
        f.set("device", "cpu").expect("ok");
        f.save().expect("save");
        let t: toml::Table = std::fs::read_to_string(&p)
            .expect("r")
            .parse()
            .expect("toml");
        assert_eq!(t["memory"]["offload_exec"].as_str(), Some("pcie"));
        assert_eq!(t["memory"]["offload_passback_share"].as_float(), Some(0.25));
        assert_eq!(
            t["future"]["knob"].as_integer(),
            Some(3),
            "unknown keys survive an edit"
        );
        assert_eq!(t["device"].as_str(), Some("cpu"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn reset_removes_key_and_empty_section() {
        let d = temp_dir("reset");
        let p = d.join("config.toml");
        let mut f = ConfigFile::open(&p).expect("open");
        f.set("memory.join_strategy", "flags").expect("set");
        f.set("device", "cpu").expect("set");
        assert!(f.reset("memory.join_strategy").expect("reset"));
        assert!(!f.reset("memory.join_strategy").expect("reset twice"));
        assert!(f.reset("device").expect("reset top"));
        f.save().expect("save");
        let t: toml::Table = std::fs::read_to_string(&p)
            .expect("r")
            .parse()
            .expect("toml");
        assert!(t.is_empty(), "{t:?}");
        assert!(f.reset("bogus.key").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn remove_raw_cleans_unknown_keys() {
        let d = temp_dir("raw");
        let p = d.join("config.toml");
        std::fs::write(
            &p,
            "[memory]\noffload_exce = \"cpu\"\noffload_exec = \"pcie\"\n",
        )
        .expect("w");
        let mut f = ConfigFile::open(&p).expect("open");
        assert!(f.values().is_err(), "typo refused");
        assert!(f.remove_raw("memory.offload_exce"));
        assert!(!f.remove_raw("memory.offload_exce"));
        let v = f.values().expect("clean now");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].1, Value::Word("pcie"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn save_replaces_by_rename_and_leaves_no_temp() {
        use std::os::unix::fs::MetadataExt;
        let d = temp_dir("atomic");
        let p = d.join("config.toml");
        std::fs::write(&p, "device = \"gpu\"\n").expect("write");
        let ino_before = std::fs::metadata(&p).expect("meta").ino();
        // A second hard link keeps the old inode alive with the old bytes: an in-place
        // rewrite would change them, a rename leaves them intact.
        let old_link = d.join("old.toml");
        std::fs::hard_link(&p, &old_link).expect("link");
        let mut f = ConfigFile::open(&p).expect("open");
        f.set("device", "cpu").expect("set");
        f.save().expect("save");
        assert_ne!(
            std::fs::metadata(&p).expect("meta").ino(),
            ino_before,
            "replaced by rename"
        );
        assert_eq!(
            std::fs::read_to_string(&old_link).expect("old"),
            "device = \"gpu\"\n"
        );
        let names: Vec<_> = std::fs::read_dir(&d)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp.")), "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn failed_save_keeps_old_file() {
        let d = temp_dir("fail");
        // The target path is an existing directory: rename over it fails, temp is cleaned.
        let p = d.join("config.toml");
        std::fs::create_dir_all(p.join("inner")).expect("dir");
        let mut f = ConfigFile {
            path: p.clone(),
            table: toml::Table::new(),
        };
        f.set("device", "cpu").expect("set");
        assert!(matches!(f.save(), Err(ConfigError::Write { .. })));
        assert!(p.join("inner").is_dir());
        let names: Vec<_> = std::fs::read_dir(&d).expect("ls").collect();
        assert_eq!(names.len(), 1, "temp removed");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn non_table_section_and_bad_toml_are_typed_errors() {
        let d = temp_dir("nt");
        let p = d.join("config.toml");
        std::fs::write(&p, "memory = 3\n").expect("w");
        let mut f = ConfigFile::open(&p).expect("open");
        assert!(matches!(
            f.set("memory.offload_exec", "cpu"),
            Err(ConfigError::NotATable { .. })
        ));
        std::fs::write(&p, "[memory\n").expect("w");
        assert!(matches!(
            ConfigFile::open(&p),
            Err(ConfigError::Parse { .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn path_lookup_order() {
        let mut env = HashMap::new();
        env.insert(CONFIG_ENV.to_string(), "/e/config.toml".to_string());
        let explicit = Path::new("/x/c.toml");
        assert_eq!(config_path(Some(explicit), &env).expect("p"), explicit);
        assert_eq!(
            config_path(None, &env).expect("p"),
            Path::new("/e/config.toml")
        );
        env.insert(HOME_ENV.to_string(), "/h".to_string());
        assert_eq!(hipfire_home(&env), Some(PathBuf::from("/h")));
    }
}
