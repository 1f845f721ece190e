//! `hipfire serve`: load the model on the CPU, then hand it to hipfire-serve until a signal.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hipfire_model::{LoadOptions, Model};
use hipfire_serve::ServeConfig;

use crate::args::ServeArgs;
use crate::{Ctx, EXIT_OK};

/// `hipfire serve`.
pub fn run(ctx: &Ctx, a: &ServeArgs) -> anyhow::Result<ExitCode> {
    let (_config, s) = ctx.settings_with(&a.overrides())?;

    // `hipfire serve` is the one daemon per machine: it holds the flock on the pid file from
    // before the load until it returns, so measuring commands refuse while it runs and a
    // second server is refused here.
    let _daemon_lock = match crate::daemon::pid_file() {
        Some(path) => {
            let lock = crate::daemon::DaemonLock::acquire(&path).with_context(|| {
                "another hipfire server (or daemon) holds the lock; one per machine".to_string()
            })?;
            ctx.note(format!(
                "serve: holding the daemon lock {}",
                lock.path().display()
            ));
            Some(lock)
        }
        None => {
            tracing::warn!("no data directory for the daemon pid file; serving without the lock");
            None
        }
    };

    let opts = LoadOptions {
        threads: s.threads.get().get(),
        ctx_len: s.ctx_size.tokens(),
        progress: None,
    };
    let model =
        Model::load(&a.model, &opts).with_context(|| format!("loading {}", a.model.display()))?;
    ctx.note(format!("serve: {}", model.placement_summary()));
    let model_name = a.model_name.clone().unwrap_or_else(|| {
        a.model
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    let cfg = ServeConfig {
        host: a.host,
        port: a.port,
        api_key: a.api_key.clone(),
        parallel: a.parallel,
        queue: a.queue,
        model_name,
        shutdown_grace: Duration::from_secs(a.shutdown_timeout),
    };
    let (parallel, queue) = (cfg.parallel, cfg.queue);
    hipfire_serve::serve(Arc::new(model), &cfg, |addr| {
        // One line on stdout (scripts and tests read the port from it), notes on stderr.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
        ctx.note(format!(
            "serve: {parallel} slots, queue {queue}; SIGTERM or Ctrl-C stops after in-flight requests"
        ));
    })?;
    ctx.note("serve: stopped");
    Ok(ExitCode::from(EXIT_OK))
}
