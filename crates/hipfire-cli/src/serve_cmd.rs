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

    // DAEMON LOCK (issue 19, item 4): `hipfire serve` is the one daemon per machine. Take the
    // flock-based lock from crate::daemon here, before the load, and hold it until return:
    //     let _daemon_lock = crate::daemon::DaemonLock::acquire()?;
    // (lands with the daemon-lock change; until then offload-bench cannot see a server).

    let opts = LoadOptions {
        threads: s.threads.get().get(),
        ctx_len: a.ctx,
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
