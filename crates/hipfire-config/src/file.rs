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

/// The config file as an editable TOML document, for reading, editing and saving.
///
/// Editing keeps every other entry, including ones this version does not know (a newer
/// hipfire may have written them), and the file's comments, layout and permissions; a
/// symlinked config stays a symlink (the write goes to its target). Open it with
/// [`ConfigFile::open_for_edit`] to change it: that holds an exclusive `flock` on a lock file
/// beside the target until the `ConfigFile` is dropped, so concurrent read–modify–write
/// cycles (`hipfire config set` in parallel) serialise instead of losing each other's keys.
#[derive(Debug)]
pub struct ConfigFile {
    /// Where it lives as given (it may not exist yet; it may be a symlink).
    path: PathBuf,
    /// The parsed document, comments and layout included; empty when the file does not exist.
    doc: toml_edit::DocumentMut,
    /// Whether the file existed when read (a new file gets the explanatory header).
    existed: bool,
    /// The edit lock, held for this value's lifetime ([`ConfigFile::open_for_edit`] only).
    _lock: Option<EditLock>,
}

/// A TOML scalar as the text a user would type, so file values pass the same rule as flags.
fn toml_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Linux's limit on symlinks followed in one lookup (`MAXSYMLINKS`); more is a loop.
const MAX_SYMLINK_HOPS: usize = 40;

/// The file a write to `path` must replace: `path` with every symlink (of the last
/// component) followed, so a symlinked config keeps its link and the target gets the bytes.
/// A missing target is returned as is (it will be created).
fn resolve_target(path: &Path) -> std::io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_SYMLINK_HOPS {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let t = std::fs::read_link(&p)?;
                p = if t.is_absolute() {
                    t
                } else {
                    parent_dir(&p).join(t)
                };
            }
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "more than {MAX_SYMLINK_HOPS} symbolic links from {}",
        path.display()
    )))
}

/// The directory holding `p` (`.` for a bare file name).
fn parent_dir(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `dir/.<name><suffix>` for the file `p` in `dir`.
fn sibling(p: &Path, suffix: &str) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent_dir(p).join(format!(".{name}{suffix}"))
}

/// An exclusive `flock` on `.<config>.lock` beside the config's target; released on drop
/// (closing the descriptor). The lock file itself is never deleted: removing it while another
/// process waits on it would let a third lock a new file of the same name.
#[derive(Debug)]
struct EditLock {
    _file: std::fs::File,
}

impl EditLock {
    fn acquire(target: &Path) -> Result<EditLock, ConfigError> {
        let lock_path = sibling(target, ".lock");
        let err = |source| ConfigError::Lock {
            path: lock_path.clone(),
            source,
        };
        std::fs::create_dir_all(parent_dir(target)).map_err(err)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(err)?;
        lock_exclusive(&file).map_err(err)?;
        Ok(EditLock { _file: file })
    }
}

/// Blocks until this process holds `flock(LOCK_EX)` on `file`.
#[cfg(unix)]
fn lock_exclusive(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor we own; it touches no memory.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// No advisory locks without `flock`: edits are atomic (rename) but not serialised.
#[cfg(not(unix))]
fn lock_exclusive(_file: &std::fs::File) -> std::io::Result<()> {
    Ok(())
}

/// The edit form of a validated value (see [`Value::to_toml`] for the choice of TOML types).
fn edit_value(v: &Value) -> toml_edit::Value {
    match v.to_toml() {
        toml::Value::Integer(i) => i.into(),
        toml::Value::Float(x) => x.into(),
        toml::Value::Boolean(b) => b.into(),
        other => toml_text(&other).into(),
    }
}

impl ConfigFile {
    /// Read `path` for reading only; a missing file is an empty table (nothing set), any
    /// other error is returned. Saves publish by rename, so no lock is needed to read.
    pub fn open(path: &Path) -> Result<ConfigFile, ConfigError> {
        let (doc, existed) = read_doc(path)?;
        Ok(ConfigFile {
            path: path.to_path_buf(),
            doc,
            existed,
            _lock: None,
        })
    }

    /// Read `path` to change it: first takes the exclusive edit lock (blocking while another
    /// process edits), then reads, so a [`ConfigFile::save`] before the drop publishes this
    /// process's change on top of every earlier one.
    pub fn open_for_edit(path: &Path) -> Result<ConfigFile, ConfigError> {
        let target = resolve_target(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let lock = EditLock::acquire(&target)?;
        let (doc, existed) = read_doc(path)?;
        Ok(ConfigFile {
            path: path.to_path_buf(),
            doc,
            existed,
            _lock: Some(lock),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The document as a plain table (what validation reads).
    fn table(&self) -> Result<toml::Table, ConfigError> {
        parse_table(&self.path, &self.doc.to_string())
    }

    /// Every entry, validated; unknown keys and bad values are refused with the file named.
    pub fn values(&self) -> Result<Vec<(&'static KeySpec, Value)>, ConfigError> {
        let origin = format!("file {}", self.path.display());
        let mut out = Vec::new();
        for (name, v) in &self.table()? {
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
        let table = self.table()?;
        let v = if section.is_empty() {
            table.get(leaf)
        } else {
            table
                .get(section)
                .and_then(|t| t.as_table())
                .and_then(|t| t.get(leaf))
        };
        Ok(v.map(toml_text))
    }

    /// Validate `raw` for `key` and store it (in memory; call [`ConfigFile::save`]).
    /// Nothing changes when validation fails. A comment on the line of the old value stays.
    pub fn set(&mut self, key: &str, raw: &str) -> Result<Value, ConfigError> {
        let spec = crate::key(key)?;
        let value = spec.parse(raw, "config set")?;
        let (section, leaf) = spec.split_name();
        let root = self.doc.as_table_mut();
        let table: &mut dyn toml_edit::TableLike = if section.is_empty() {
            root
        } else {
            let item = root
                .entry(section)
                .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()));
            let found = item.type_name();
            match item.as_table_like_mut() {
                Some(t) => t,
                None => {
                    return Err(ConfigError::NotATable {
                        path: self.path.clone(),
                        section: section.to_string(),
                        found,
                    })
                }
            }
        };
        let mut new = edit_value(&value);
        // Replace the value in place: `insert` would drop the key's own decor (the comment
        // lines above it); the old value's decor holds the comment after it on its line.
        match table.get_mut(leaf) {
            Some(item) => {
                if let Some(old) = item.as_value() {
                    *new.decor_mut() = old.decor().clone();
                }
                *item = toml_edit::Item::Value(new);
            }
            None => {
                table.insert(leaf, toml_edit::Item::Value(new));
            }
        }
        Ok(value)
    }

    /// Remove `key` from the file (it falls back to env/default). Returns whether it was set.
    /// An emptied section is removed too, so the file stays sparse.
    pub fn reset(&mut self, key: &str) -> Result<bool, ConfigError> {
        let spec = crate::key(key)?;
        Ok(self.remove_raw(spec.name))
    }

    /// Remove the entry named `dotted` whether or not the schema knows it, so a typo or a key
    /// of a newer hipfire that this version refuses can be cleaned out with `config reset`.
    /// Returns whether it was present; an emptied section is removed too.
    pub fn remove_raw(&mut self, dotted: &str) -> bool {
        let root = self.doc.as_table_mut();
        let Some((section, leaf)) = dotted.rsplit_once('.') else {
            return root.remove(dotted).is_some();
        };
        let Some(t) = root.get_mut(section).and_then(|i| i.as_table_like_mut()) else {
            return false;
        };
        let was = t.remove(leaf).is_some();
        if t.is_empty() {
            root.remove(section);
        }
        was
    }

    /// Write the file atomically: a temp file beside the target (the symlink's target when the
    /// config is a symlink) with the target's permissions, fsync, rename over the target, fsync
    /// of the directory. A reader (or a crash) sees the old file or the new one, never a torn one.
    pub fn save(&self) -> Result<(), ConfigError> {
        let werr = |source| ConfigError::Write {
            path: self.path.clone(),
            source,
        };
        let target = resolve_target(&self.path).map_err(werr)?;
        let mut text = String::new();
        if !self.existed {
            text.push_str(&header());
        }
        text.push_str(&self.doc.to_string());
        let dir = parent_dir(&target);
        std::fs::create_dir_all(&dir).map_err(werr)?;
        // The pid keeps two processes that skipped the edit lock (plain `open` + `save`)
        // from sharing a temp file; each rename still publishes a complete file.
        let tmp = sibling(&target, &format!(".tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            match std::fs::metadata(&target) {
                Ok(m) => f.set_permissions(m.permissions())?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            f.sync_all()?;
            std::fs::rename(&tmp, &target)?;
            sync_dir(&dir)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            werr(e)
        })
    }
}

/// Flush a directory entry change (the rename) to disk.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Directories cannot be opened for fsync here; the rename is still atomic.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// The file at `path` as a document, and whether it existed.
fn read_doc(path: &Path) -> Result<(toml_edit::DocumentMut, bool), ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            // The strict reader first: its errors are the ones users see for a bad file.
            parse_table(path, &text)?;
            let doc = text
                .parse::<toml_edit::DocumentMut>()
                .map_err(|e| ConfigError::Edit {
                    path: path.to_path_buf(),
                    source: Box::new(e),
                })?;
            Ok((doc, true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok((toml_edit::DocumentMut::new(), false))
        }
        Err(source) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_table(path: &Path, text: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// The path of an explicitly named config file (`--config`), refused when it does not exist:
/// a command that reads settings from a file the user named must not silently use defaults.
pub fn require_existing(path: &Path) -> Result<(), ConfigError> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ConfigError::Missing {
            path: path.to_path_buf(),
        }),
        Err(source) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// First lines of a newly created file: where to read about the keys.
fn header() -> String {
    format!(
        "# hipfire configuration ({} keys documented in docs/CONFIG.md; `hipfire config list`).\n\
         # Written by `hipfire config set`, which keeps comments and other keys.\n",
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
            ("model.ubatch", "256"),
            ("model.cache_type", "q8_0"),
            ("memory.gpu_layer_budget", "0"),
            ("memory.n_cpu_moe", "all"),
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
            doc: toml_edit::DocumentMut::new(),
            existed: false,
            _lock: None,
        };
        f.set("device", "cpu").expect("set");
        assert!(matches!(f.save(), Err(ConfigError::Write { .. })));
        assert!(p.join("inner").is_dir());
        let names: Vec<_> = std::fs::read_dir(&d).expect("ls").collect();
        assert_eq!(names.len(), 1, "temp removed");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn comments_layout_and_mode_survive_an_edit() {
        use std::os::unix::fs::PermissionsExt;
        let d = temp_dir("comments");
        let p = d.join("config.toml");
        let original = "# my notes on this box\n\
                        device = \"gpu\" # the fast one\n\
                        \n\
                        [memory]\n\
                        # cpu: PCIe is slow here\n\
                        offload_exec = \"pcie\"\n\
                        [future]\n\
                        knob = 3 # from a newer hipfire\n";
        std::fs::write(&p, original).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let mut f = ConfigFile::open_for_edit(&p).expect("open");
        f.set("device", "cpu").expect("set");
        f.set("memory.offload_exec", "cpu").expect("set");
        f.set("sampling.top_k", "7").expect("set");
        f.save().expect("save");
        drop(f);
        let text = std::fs::read_to_string(&p).expect("read");
        for kept in [
            "# my notes on this box",
            "device = \"cpu\" # the fast one",
            "# cpu: PCIe is slow here\noffload_exec = \"cpu\"",
            "knob = 3 # from a newer hipfire",
        ] {
            assert!(text.contains(kept), "lost {kept:?}:\n{text}");
        }
        assert!(
            !text.contains("Written by"),
            "no header on an existing file:\n{text}"
        );
        let t: toml::Table = text.parse().expect("toml");
        assert_eq!(t["sampling"]["top_k"].as_integer(), Some(7));
        let mode = std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode kept");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_config_stays_a_symlink() {
        let d = temp_dir("symlink");
        std::fs::create_dir_all(d.join("dotfiles")).expect("dir");
        let real = d.join("dotfiles").join("hipfire.toml");
        std::fs::write(&real, "device = \"gpu\"\n").expect("write");
        let link = d.join("config.toml");
        // Relative, as `ln -s dotfiles/hipfire.toml config.toml` makes it.
        std::os::unix::fs::symlink("dotfiles/hipfire.toml", &link).expect("symlink");
        let mut f = ConfigFile::open_for_edit(&link).expect("open");
        f.set("device", "cpu").expect("set");
        f.save().expect("save");
        drop(f);
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("meta")
                .file_type()
                .is_symlink(),
            "still a symlink"
        );
        assert_eq!(
            std::fs::read_to_string(&real).expect("read"),
            "device = \"cpu\"\n"
        );
        // The lock and temp files live beside the target, not the link.
        let names: Vec<_> = std::fs::read_dir(d.join("dotfiles"))
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.contains(&".hipfire.toml.lock".to_string()),
            "{names:?}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn an_edit_waits_for_the_lock_holder() {
        let d = temp_dir("lock");
        let p = d.join("config.toml");
        let mut first = ConfigFile::open_for_edit(&p).expect("first");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p2, done2) = (p.clone(), done.clone());
        let second = std::thread::spawn(move || {
            let mut f = ConfigFile::open_for_edit(&p2).expect("second");
            done2.store(true, std::sync::atomic::Ordering::SeqCst);
            f.set("sampling.top_k", "9").expect("set");
            f.save().expect("save");
        });
        // Long enough for an unlocked open to have finished many times over on any machine.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !done.load(std::sync::atomic::Ordering::SeqCst),
            "the second editor did not wait for the lock"
        );
        first.set("device", "cpu").expect("set");
        first.save().expect("save");
        drop(first);
        second.join().expect("join");
        let v = ConfigFile::open(&p)
            .expect("open")
            .values()
            .expect("values");
        assert_eq!(v.len(), 2, "both edits survive: {v:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_named_config_file_must_exist() {
        let d = temp_dir("missing");
        let p = d.join("nope.toml");
        assert!(matches!(
            require_existing(&p),
            Err(ConfigError::Missing { .. })
        ));
        assert!(matches!(
            crate::Config::load(Some(&p), &[]),
            Err(ConfigError::Missing { .. })
        ));
        std::fs::write(&p, "").expect("w");
        assert!(crate::Config::load(Some(&p), &[]).is_ok());
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
