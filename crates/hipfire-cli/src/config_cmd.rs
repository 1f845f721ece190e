//! `hipfire config get | set | reset | list | explain | path | docs`.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use hipfire_config::{Config, ConfigFile, ProcessEnv, Resolved, Value};

use crate::args::ConfigAction;
use crate::{Ctx, EXIT_OK};

/// Run one config action.
pub fn run(ctx: &Ctx, action: &ConfigAction) -> anyhow::Result<ExitCode> {
    let path = hipfire_config::config_path(ctx.config_file.as_deref(), &ProcessEnv)?;
    // A file named by --config must exist for the actions that read it (set and reset may
    // create it); $HIPFIRE_CONFIG and the default path may name one not written yet.
    if ctx.config_file.is_some()
        && matches!(action, ConfigAction::Get { .. } | ConfigAction::List { .. })
    {
        hipfire_config::require_existing(&path)?;
    }
    let mut out = std::io::stdout().lock();
    match action {
        ConfigAction::Get { key, json } => {
            hipfire_config::key(key)?;
            let config = Config::resolve(Some(&path), &ProcessEnv, &[])?;
            let r = config.get(key)?;
            if *json {
                writeln!(out, "{}", serde_json::to_string_pretty(&entry_json(r))?)?;
            } else {
                writeln!(out, "{}", r.value)?;
            }
        }
        ConfigAction::Set { key, value } => {
            let mut file = ConfigFile::open_for_edit(&path)?;
            let v = file.set(key, value)?;
            file.save()?;
            writeln!(out, "{key} = {v}  (written to {})", path.display())?;
            let spec = hipfire_config::key(key)?;
            if let Ok(env) = std::env::var(spec.env) {
                if !env.is_empty() {
                    ctx.note(format!(
                        "note: {}={env} is set in the environment and overrides the file",
                        spec.env
                    ));
                }
            }
        }
        ConfigAction::Reset { key } => {
            let mut file = ConfigFile::open_for_edit(&path)?;
            if hipfire_config::key(key).is_err() {
                // Not a schema key: still let reset clean it out of the file (a typo there
                // makes every other command refuse to start), else report the unknown key.
                if file.remove_raw(key) {
                    file.save()?;
                    writeln!(
                        out,
                        "{key} (not a known key) removed from {}",
                        path.display()
                    )?;
                    return Ok(ExitCode::from(EXIT_OK));
                }
                hipfire_config::key(key)?;
            }
            if file.reset(key)? {
                file.save()?;
                writeln!(out, "{key} removed from {}", path.display())?;
            } else {
                writeln!(out, "{key} was not set in {}", path.display())?;
            }
        }
        ConfigAction::List { json } => {
            let config = Config::resolve(Some(&path), &ProcessEnv, &[])?;
            if *json {
                let all: Vec<_> = config.iter().map(entry_json).collect();
                writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
            } else {
                let w = config.iter().map(|r| r.spec.name.len()).max().unwrap_or(0);
                let vw = config
                    .iter()
                    .map(|r| r.value.to_string().len())
                    .max()
                    .unwrap_or(0);
                for r in config.iter() {
                    writeln!(
                        out,
                        "{:w$}  {:vw$}  {}",
                        r.spec.name,
                        r.value.to_string(),
                        source_label(r),
                        w = w,
                        vw = vw
                    )?;
                }
                ctx.note(format!("config file: {}", path.display()));
            }
        }
        ConfigAction::Explain { key } => {
            let k = hipfire_config::key(key)?;
            writeln!(out, "{}\n\n{}\n", k.name, k.doc)?;
            writeln!(out, "rule:    {}", k.rule)?;
            writeln!(out, "default: {}", k.default)?;
            writeln!(out, "env:     {}", k.env)?;
            if let Some(f) = k.flag {
                writeln!(out, "flag:    {f}")?;
            }
        }
        ConfigAction::Path => writeln!(out, "{}", path.display())?,
        ConfigAction::Docs { out: dir } => {
            let written = hipfire_config::docs::write_docs(dir)
                .with_context(|| format!("writing docs into {}", dir.display()))?;
            for p in written {
                writeln!(out, "wrote {}", p.display())?;
            }
        }
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// `default`, `file`, `env HIPFIRE_X`, `flag --x`: short enough for a table column.
fn source_label(r: &Resolved) -> String {
    match &r.source {
        hipfire_config::Source::File(_) => "file".to_string(),
        s => s.to_string(),
    }
}

/// One key as JSON: numbers as numbers, everything else as strings.
pub fn entry_json(r: &Resolved) -> serde_json::Value {
    let value = match &r.value {
        Value::Int(n) => serde_json::json!(n),
        Value::Float(x) => serde_json::json!(x),
        other => serde_json::json!(other.to_string()),
    };
    serde_json::json!({
        "key": r.spec.name,
        "value": value,
        "source": r.source.kind(),
        "source_detail": r.source.to_string(),
        "default": r.spec.default,
        "env": r.spec.env,
        "rule": r.spec.rule,
        "type": r.spec.type_label(),
    })
}
